#!/usr/bin/env python3
"""Slow clients and exhausted descriptors: are the other clients served?

One worker, started on the config below. A probe fetches a small page on a
new connection, one request after another, and its latencies give p50 and
p99; it runs first on the idle server and then while the crowd is on:

- SLOW slowloris connections: each sends a request line and then one
  header byte every few seconds, never finishing its head (they are
  dropped by client_header_timeout, 60 s, so the run stays shorter);
- UPLOADS slow uploads: a POST of a 1 MiB body sent 1 KiB at a time with
  pauses, to a proxied location (nginx and tern buffer request bodies
  before proxying, in memory up to client_body_buffer_size, then in a temp
  file: one more descriptor each);
- the worker's descriptors: `worker_rlimit_nofile` (--nofile) is set below
  what the crowd needs in the second round, so accept() fails with EMFILE.

Reported per round: the probe's p50/p99/max and failures, the crowd
actually connected, and the worker's RSS before and during. Run each
server through it:

    python3 bench/faults/slowloris.py --server target/release/tern
    python3 bench/faults/slowloris.py --server /usr/sbin/nginx

Long-running (a few minutes) and load-generating: by hand, not in tests.
"""

import argparse
import http.server
import os
import resource
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from faultlib import free_port, log_kinds

CONF = """
worker_processes 1;
worker_rlimit_nofile {nofile};
error_log logs/error.log warn;
pid logs/nginx.pid;
events {{ worker_connections {conns}; }}
http {{
    access_log off;
    client_header_timeout 60s;
    client_body_timeout 60s;
    client_body_buffer_size 16k;
    client_max_body_size 2m;
    proxy_temp_path temp;
    client_body_temp_path body;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{ return 200 "ok\\n"; }}
        location /upload {{ proxy_pass http://127.0.0.1:{origin}; }}
    }}
}}
"""


class Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        while n > 0:
            b = self.rfile.read(min(n, 65536))
            if not b:
                break
            n -= len(b)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


def probe(port, n, source="127.0.0.2", budget=40.0):
    """n sequential GETs on new connections from `source` (fewer if they
    take more than `budget` seconds in all): latencies (s) of those
    answered 200, and the count of failures (no answer within 5 s...)."""
    lat, failed = [], 0
    end = time.time() + budget
    for _ in range(n):
        if time.time() > end:
            break
        t = time.perf_counter()
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
            s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                b = s.recv(4096)
                if not b:
                    break
                data += b
            s.close()
            if data.startswith(b"HTTP/1.1 200"):
                lat.append(time.perf_counter() - t)
            else:
                failed += 1
        except OSError:
            failed += 1
        time.sleep(0.01)
    return lat, failed


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report(name, lat, failed):
    print("  %s: %d answered, %d failed; p50 %.2f ms, p99 %.2f ms, max %.2f ms" % (
        name, len(lat), failed, pct(lat, 0.5) * 1e3, pct(lat, 0.99) * 1e3,
        (max(lat) if lat else float("nan")) * 1e3), flush=True)


def worker_rss(master_pid):
    total = 0
    try:
        kids = subprocess.run(["pgrep", "-P", str(master_pid)], capture_output=True, text=True).stdout.split()
    except OSError:
        kids = []
    for pid in kids or [str(master_pid)]:
        try:
            with open("/proc/%s/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


class Crowd:
    """Slowloris connections and slow uploads, driven by one thread."""

    def __init__(self, port, slow, uploads):
        self.port, self.slow, self.uploads = port, slow, uploads
        self.stop = threading.Event()
        self.connected = {"slow": 0, "upload": 0}
        self.closed = {"slow": 0, "upload": 0}
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        sel = selectors.DefaultSelector()
        socks = []

        def open_one(kind):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", self.port))
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                return
            socks.append([s, kind, 0, False])

        for _ in range(self.slow):
            open_one("slow")
        for _ in range(self.uploads):
            open_one("upload")
        step = 0
        while not self.stop.is_set():
            for c in socks:
                s, kind, sent, dead = c
                if dead:
                    continue
                try:
                    if sent == 0:
                        if kind == "slow":
                            s.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n")
                        else:
                            s.send(b"POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 1048576\r\n\r\n")
                        self.connected[kind] += 1
                        c[2] = 1
                    elif kind == "slow":
                        if step % 5 == 0:
                            s.send(b"X")
                    elif sent < 1024:
                        s.send(b"u" * 1024)
                        c[2] += 1
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    c[3] = True
                    self.closed[kind] += 1
            step += 1
            self.stop.wait(1.0)
        for c in socks:
            c[0].close()
        sel.close()


def run_round(o, name, nofile, conns, slow, uploads):
    prefix = tempfile.mkdtemp(prefix="slowloris-")
    os.chmod(prefix, 0o777)
    for d in ("logs", "temp", "body"):
        os.makedirs(os.path.join(prefix, d))
        os.chmod(os.path.join(prefix, d), 0o777)
    port, oport = free_port(), free_port()
    conf = os.path.join(prefix, "nginx.conf")
    with open(conf, "w") as f:
        f.write(CONF.format(port=port, origin=oport, nofile=nofile, conns=conns))
    origin = http.server.ThreadingHTTPServer(("127.0.0.1", oport), Origin)
    origin.daemon_threads = True
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    base = [o.server, "-p", prefix + "/", "-c", conf]
    p = subprocess.Popen(base + ["-g", "daemon off;"], stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    time.sleep(0.5)
    print("%s (worker_rlimit_nofile %d, worker_connections %d; %d slowloris, %d slow uploads):" % (
        name, nofile, conns, slow, uploads), flush=True)
    rss0 = worker_rss(p.pid)
    lat, failed = probe(port, o.probes)
    report("idle    ", lat, failed)
    crowd = Crowd(port, slow, uploads)
    crowd.thread.start()
    time.sleep(o.settle)
    rss1 = worker_rss(p.pid)
    lat, failed = probe(port, o.probes)
    report("crowded ", lat, failed)
    print("  crowd: sent heads %s, closed by the server %s; worker RSS %d kB idle, %d kB crowded (%.1f kB per crowd connection)" % (
        crowd.connected, crowd.closed, rss0, rss1,
        (rss1 - rss0) / max(1, crowd.connected["slow"] + crowd.connected["upload"])), flush=True)
    crowd.stop.set()
    crowd.thread.join()
    subprocess.run(base + ["-s", "stop"], capture_output=True)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    for v, k in log_kinds(os.path.join(prefix, "logs/error.log"), top=6):
        print("  log %6d %s" % (v, k))
    origin.shutdown()
    shutil.rmtree(prefix, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--slow", type=int, default=10000)
    ap.add_argument("--uploads", type=int, default=1000)
    ap.add_argument("--probes", type=int, default=300)
    ap.add_argument("--settle", type=float, default=8.0, help="seconds between starting the crowd and probing")
    o = ap.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    need = o.slow + 2 * o.uploads + 64
    # Round 1: descriptors and connections enough for the crowd.
    run_round(o, "enough descriptors", need * 2, need * 2, o.slow, o.uploads)
    # Round 2: descriptors for a quarter of it.
    run_round(o, "descriptors exhausted", need // 4, need * 2, o.slow, o.uploads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
