#!/usr/bin/env python3
"""Memory over many reloads: is RSS growth per reload a leak?

Starts a server (tern or nginx) with 2 workers on a small config (a static
file, a map and a regex location, so each reload compiles something), keeps
one client making a request per connection, and sends RELOADS `-s reload`
at RATE per second, each with a changed configuration. Every EVERY reloads
it waits a moment and prints the RSS of the master and of the workers (kB,
from /proc), so growth can be told apart from a one-time rise: a leak grows
with every reload, allocator arenas and caches level off.

    python3 bench/faults/reload_rss.py --server target/release/tern --reloads 1000
    python3 bench/faults/reload_rss.py --server /usr/sbin/nginx --reloads 1000

Long-running and load-generating: run by hand, never from the tests.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

CONF = """
worker_processes 2;
error_log logs/error.log warn;
pid logs/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    map $uri $m {{ default a; ~^/x(?<n>\\d+)$ $n; /gen{gen} g; }}
    server {{
        listen 127.0.0.1:{port};
        root html;
        add_header X-Generation {gen};
        location ~ ^/re/(\\d+)$ {{ return 200 "$1 $m\\n"; }}
    }}
}}
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid):
    try:
        return [int(c) for c in open("/proc/%d/task/%d/children" % (pid, pid)).read().split()]
    except OSError:
        return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--reloads", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--every", type=int, default=100)
    o = ap.parse_args()

    prefix = tempfile.mkdtemp(prefix="reload-rss-")
    os.chmod(prefix, 0o755)
    for d in ("logs", "html", "conf"):
        os.makedirs(os.path.join(prefix, d))
    with open(os.path.join(prefix, "html/1k"), "wb") as f:
        f.write(b"x" * 1024)
    port = free_port()
    conf = os.path.join(prefix, "conf/nginx.conf")

    def write_conf(gen):
        with open(conf, "w") as f:
            f.write(CONF.format(port=port, gen=gen))

    write_conf(0)
    base = [o.server, "-p", prefix + "/", "-c", conf]
    server = subprocess.Popen(base + ["-g", "daemon off;"], stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    stop = threading.Event()
    counts = {"ok": 0, "bad": 0}

    def client():
        i = 0
        while not stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET /re/%d HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" % i)
                data = b""
                while True:
                    b = s.recv(65536)
                    if not b:
                        break
                    data += b
                s.close()
                counts["ok" if data.startswith(b"HTTP/1.1 200") else "bad"] += 1
            except OSError:
                counts["bad"] += 1
            i += 1
            time.sleep(0.01)

    t = threading.Thread(target=client)
    t.start()
    time.sleep(1)
    pid = server.pid

    def sample(n):
        time.sleep(1.5)
        ws = [rss(c) for c in children(pid)]
        m = rss(pid)
        print("%6d reloads  master %6d kB  workers %s  total %6d kB" % (
            n, m, "+".join("%d" % w for w in ws), m + sum(ws)), flush=True)
        return m + sum(ws)

    first = sample(0)
    totals = [(0, first)]
    refused = 0
    for i in range(1, o.reloads + 1):
        write_conf(i)
        r = subprocess.run(base + ["-s", "reload"], capture_output=True)
        refused += r.returncode != 0
        time.sleep(1.0 / o.rate)
        if i % o.every == 0:
            totals.append((i, sample(i)))
    stop.set()
    t.join()
    half = [x for x in totals if x[0] >= o.reloads // 2]
    if len(half) >= 2:
        (a, ra), (b, rb) = half[0], half[-1]
        print("second half: %+d kB over %d reloads = %.2f kB per reload" % (
            rb - ra, b - a, (rb - ra) / max(1, b - a)))
    print("reloads refused: %d; client: %d ok, %d failed" % (refused, counts["ok"], counts["bad"]))
    subprocess.run(base + ["-s", "quit"], capture_output=True)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
    shutil.rmtree(prefix, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
