/*
 * floor: the physical limit for tern's 1 KiB keep-alive figure.
 *
 * One thread, one epoll loop, no HTTP parsing: every "\r\n\r\n" that
 * arrives on a connection is answered with the same response from memory
 * (a head shaped like nginx's for a static file, plus 1024 bytes of body)
 * in one write(). What remains of the server's cost is the kernel's:
 * epoll_wait, read, write and the loopback TCP work, which any server
 * pays; the distance between tern and this is what tern adds on top.
 *
 * Usage: floor CONF_OR_PORT
 *   A number is the port; anything else is an nginx.conf whose first
 *   `listen ADDR:PORT;` gives the port (so shared/bench/run.sh can start
 *   it like nginx, with --server-args '{conf}'). Listens on 127.0.0.1.
 *   SIGTERM/SIGINT stop it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BODY 1024

static char resp[BODY + 512];
static size_t resp_len;
/* Bytes of a "\r\n\r\n" already seen at the end of the last read, per fd:
 * a terminator split over two reads still counts once. */
static unsigned char partial[1 << 16];

static int port_from(const char *arg) {
    char *end;
    long p = strtol(arg, &end, 10);
    if (*arg && !*end)
        return (int)p;
    FILE *f = fopen(arg, "r");
    if (!f) {
        perror(arg);
        exit(1);
    }
    char line[512];
    int port = -1;
    while (port < 0 && fgets(line, sizeof line, f)) {
        char *l = strstr(line, "listen ");
        if (!l)
            continue;
        char *semi = strchr(l, ';');
        if (!semi)
            continue;
        *semi = 0;
        char *colon = strrchr(l, ':');
        port = atoi(colon ? colon + 1 : l + 7);
    }
    fclose(f);
    if (port <= 0) {
        fprintf(stderr, "no listen port in %s\n", arg);
        exit(1);
    }
    return port;
}

static void build_response(void) {
    int n = snprintf(resp, sizeof resp,
                     "HTTP/1.1 200 OK\r\n"
                     "Server: floor\r\n"
                     "Date: Sat, 21 Nov 2026 09:00:00 GMT\r\n"
                     "Content-Type: application/octet-stream\r\n"
                     "Content-Length: %d\r\n"
                     "Last-Modified: Sat, 21 Nov 2026 08:00:00 GMT\r\n"
                     "Connection: keep-alive\r\n"
                     "ETag: \"6a3f2c00-400\"\r\n"
                     "Accept-Ranges: bytes\r\n"
                     "\r\n",
                     BODY);
    memset(resp + n, 'x', BODY);
    resp_len = (size_t)n + BODY;
}

/* Counts request ends in buf, carrying a partial terminator across reads. */
static int count_heads(int fd, const char *buf, ssize_t n) {
    static const char term[4] = {'\r', '\n', '\r', '\n'};
    unsigned st = fd < (int)sizeof partial ? partial[fd] : 0;
    int heads = 0;
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == term[st]) {
            if (++st == 4) {
                heads++;
                st = 0;
            }
        } else {
            st = buf[i] == '\r' ? 1 : 0;
        }
    }
    if (fd < (int)sizeof partial)
        partial[fd] = (unsigned char)st;
    return heads;
}

static void drop(int ep, int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    if (fd < (int)sizeof partial)
        partial[fd] = 0;
    close(fd);
}

static volatile sig_atomic_t stop;
static void on_signal(int s) { (void)s; stop = 1; }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s PORT|nginx.conf\n", argv[0]);
        return 2;
    }
    int port = port_from(argv[argc - 1]);
    build_response();
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 511)) {
        perror("bind/listen");
        return 1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    struct epoll_event evs[512];
    char buf[4096];
    while (!stop) {
        int n = epoll_wait(ep, evs, 512, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            perror("epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                for (;;) {
                    int c = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (c < 0)
                        break;
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event ce = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            /* Edge-triggered: read until EAGAIN, answer every complete head. */
            for (;;) {
                ssize_t r = read(fd, buf, sizeof buf);
                if (r > 0) {
                    for (int h = count_heads(fd, buf, r); h > 0; h--) {
                        /* A 1 KiB answer fits the socket buffer; a short
                         * write means a client that does not read: drop it. */
                        if (write(fd, resp, resp_len) != (ssize_t)resp_len) {
                            drop(ep, fd);
                            goto next;
                        }
                    }
                    if (r < (ssize_t)sizeof buf)
                        break;
                    continue;
                }
                if (r < 0 && (errno == EAGAIN || errno == EINTR))
                    break;
                drop(ep, fd);
                break;
            }
        next:;
        }
    }
    return 0;
}
