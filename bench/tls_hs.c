/* TLS handshake load for bench/tls.py: PROCS processes, each a loop of
 * connect, TLS 1.3 handshake (OpenSSL, as curl and wrk make them), one
 * `GET PATH` with `Connection: close`, read to the close, for SECONDS.
 * With `resume`, each process offers the session of its previous
 * connection (the ticket the server sent after the handshake), so every
 * handshake but the first is a resumption (psk_dhe_ke).
 *
 *   cc -O2 -o tls_hs tls_hs.c -lssl -lcrypto
 *   tls_hs HOST PORT SECONDS PROCS full|resume [PATH]
 *
 * Prints: handshakes, resumed, failures, tickets seen per connection
 * (NewSessionTicket messages the client read before the close). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct counts {
    long hs, resumed, fail, tickets;
};

static long tickets_seen;
/* The newest ticket's session (the callback's reference). */
static SSL_SESSION *latest;

static int new_session(SSL *ssl, SSL_SESSION *sess) {
    (void)ssl;
    tickets_seen++;
    if (latest)
        SSL_SESSION_free(latest);
    latest = sess;
    return 1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void worker(const char *host, int port, double secs, int resume, const char *path,
                   struct counts *out) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, new_session);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    inet_pton(AF_INET, host, &sa.sin_addr);
    char req[512];
    int reqlen = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n", path);
    double end = now() + secs;
    char buf[16384];
    while (now() < end) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            out->fail++;
            close(fd);
            usleep(1000);
            continue;
        }
        SSL *ssl = SSL_new(ctx);
        SSL_set_fd(ssl, fd);
        SSL_set_tlsext_host_name(ssl, "localhost");
        if (resume && latest)
            SSL_set_session(ssl, latest);
        if (SSL_connect(ssl) != 1) {
            if (out->fail++ == 0 && getenv("TLS_HS_DEBUG"))
                ERR_print_errors_fp(stderr);
            ERR_clear_error();
            SSL_free(ssl);
            close(fd);
            continue;
        }
        out->hs++;
        if (SSL_session_reused(ssl))
            out->resumed++;
        SSL_write(ssl, req, reqlen);
        while (SSL_read(ssl, buf, sizeof buf) > 0) {
        }
        ERR_clear_error();
        /* A close_notify, as curl sends: OpenSSL marks the session of a
         * connection freed without one as not resumable. */
        SSL_shutdown(ssl);
        ERR_clear_error();
        SSL_free(ssl);
        close(fd);
    }
    out->tickets = tickets_seen;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s HOST PORT SECONDS PROCS full|resume [PATH]\n", argv[0]);
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]);
    double secs = atof(argv[3]);
    int procs = atoi(argv[4]);
    int resume = strcmp(argv[5], "resume") == 0;
    const char *path = argc > 6 ? argv[6] : "/";
    signal(SIGPIPE, SIG_IGN);
    struct counts *c = mmap(NULL, sizeof(struct counts) * procs, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(c, 0, sizeof(struct counts) * procs);
    for (int i = 0; i < procs; i++) {
        if (fork() == 0) {
            worker(host, port, secs, resume, path, &c[i]);
            _exit(0);
        }
    }
    while (wait(NULL) > 0) {
    }
    struct counts t = {0, 0, 0, 0};
    for (int i = 0; i < procs; i++) {
        t.hs += c[i].hs;
        t.resumed += c[i].resumed;
        t.fail += c[i].fail;
        t.tickets += c[i].tickets;
    }
    printf("handshakes %ld resumed %ld failures %ld tickets_per_conn %.2f\n", t.hs, t.resumed,
           t.fail, t.hs ? (double)t.tickets / t.hs : 0.0);
    return 0;
}
