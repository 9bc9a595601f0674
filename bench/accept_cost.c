// Cost of the syscalls an accept loop can end on, on this machine:
// an accept4 that finds the listen queue empty, epoll_wait(0), poll(0).
//   gcc -O2 -o /tmp/accept_cost bench/accept_cost.c && N=30000 taskset -c 1 /tmp/accept_cost
#define _GNU_SOURCE
#include <unistd.h>
#include <stdio.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <time.h>
#include <poll.h>
#include <fcntl.h>
#include <stdlib.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
 int s=socket(AF_INET,SOCK_STREAM|SOCK_NONBLOCK,0);
 struct sockaddr_in a={0};a.sin_family=AF_INET;a.sin_addr.s_addr=htonl(0x7f000001);
 bind(s,(void*)&a,sizeof a);listen(s,128);
 int N=atoi(getenv("N"));double t=now();
 for(int i=0;i<N;i++) accept4(s,0,0,SOCK_NONBLOCK|SOCK_CLOEXEC);
 printf("failed accept4: %.3f us\n",(now()-t)/N*1e6);
 int ep=epoll_create1(0);struct epoll_event ev={.events=EPOLLIN,.data.fd=s};epoll_ctl(ep,EPOLL_CTL_ADD,s,&ev);
 struct epoll_event out[64];
 t=now();for(int i=0;i<N;i++) epoll_wait(ep,out,64,0);
 printf("epoll_wait(0): %.3f us\n",(now()-t)/N*1e6);
 struct pollfd p={.fd=s,.events=POLLIN};
 t=now();for(int i=0;i<N;i++) poll(&p,1,0);
 printf("poll(0): %.3f us\n",(now()-t)/N*1e6);
 t=now();for(int i=0;i<N;i++) {struct timespec x;clock_gettime(CLOCK_MONOTONIC,&x);}
 printf("clock_gettime: %.3f us\n",(now()-t)/N*1e6);
 t=now();for(int i=0;i<N;i++) getppid();
 printf("getppid: %.3f us\n",(now()-t)/N*1e6);
}
