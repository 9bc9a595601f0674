#!/usr/bin/env python3
"""kill -9 during proxy_cache filling and proxy temp-file writes.

An origin serves deterministic objects (/obj/N: 1 KiB to 3 MiB, bytes
derived from N; its checksum is known to the clients). The server proxies
them through proxy_cache (/c/) and, uncached, through small proxy buffers
that spill to proxy_temp_path (/t/). CLIENTS threads fetch random objects
while the server is killed with SIGKILL (the master and its whole process
group) every 1-3 s and restarted, CYCLES times. Every complete response
(its Content-Length received) is checked against the origin's bytes; a
response cut by the kill is counted apart (that is the kill, not
corruption). After the last cycle the server is started once more, left
for the cache loader and manager, every object is read through the cache
and checked, the server stopped gracefully, and the temp directories
listed: no stray temp files may be left.

    python3 bench/faults/kill9_cache.py --server target/release/tern --cycles 100
    python3 bench/faults/kill9_cache.py --server /usr/sbin/nginx --cycles 100

Long-running and load-generating: run by hand, never from the tests.
"""

import argparse
import hashlib
import http.server
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from faultlib import QuietServer, fetch, free_port

OBJECTS = 200

CONF = """
worker_processes 2;
error_log logs/error.log warn;
pid logs/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    proxy_temp_path {prefix}/temp 1 2;
    proxy_cache_path {prefix}/cache levels=1:2 keys_zone=z:10m max_size=200m inactive=60m use_temp_path=on;
    upstream origin {{ server 127.0.0.1:{origin}; }}
    server {{
        listen 127.0.0.1:{port};
        location /c/ {{
            proxy_cache z;
            proxy_cache_valid 200 60m;
            proxy_pass http://origin/obj/;
        }}
        location /t/ {{
            proxy_buffers 4 4k;
            proxy_buffer_size 4k;
            proxy_max_temp_file_size 64m;
            proxy_pass http://origin/obj/;
        }}
    }}
}}
"""


def body_of(n):
    size = 1024 + (n * 7919 * 131) % (3 << 20)
    seed = hashlib.sha256(b"obj%d" % n).digest()
    return (seed * (size // 32 + 1))[:size]


SUMS = {}


class Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        try:
            n = int(self.path.rsplit("/", 1)[1])
        except ValueError:
            n = 0
        b = body_of(n)
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        # In pieces, so a kill lands in the middle of a transfer.
        for i in range(0, len(b), 256 << 10):
            self.wfile.write(b[i:i + (256 << 10)])
            time.sleep(0.002)

    def log_message(self, *a):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--keep", action="store_true")
    o = ap.parse_args()

    for n in range(OBJECTS):
        SUMS[n] = hashlib.sha256(body_of(n)).hexdigest()
    prefix = tempfile.mkdtemp(prefix="kill9-cache-")
    os.chmod(prefix, 0o777)
    for d in ("logs", "conf", "temp", "cache"):
        os.makedirs(os.path.join(prefix, d))
        os.chmod(os.path.join(prefix, d), 0o777)
    port, oport = free_port(), free_port()
    conf = os.path.join(prefix, "conf/nginx.conf")
    with open(conf, "w") as f:
        f.write(CONF.format(prefix=prefix, port=port, origin=oport))
    origin = QuietServer(("127.0.0.1", oport), Origin)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    base = [o.server, "-p", prefix + "/", "-c", conf]

    def start():
        p = subprocess.Popen(base + ["-g", "daemon off;"], stderr=subprocess.DEVNULL,
                             start_new_session=True)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return p
            except OSError:
                time.sleep(0.05)
        return p

    stats = {"complete_ok": 0, "complete_bad": 0, "cut": 0, "failed": 0, "non200": 0}
    lock = threading.Lock()
    stop = threading.Event()
    bad = []

    def client(seed):
        rnd = random.Random(seed)
        while not stop.is_set():
            n = rnd.randrange(OBJECTS)
            path = "/%s/%d" % (rnd.choice("ct"), n)
            r = fetch(port, path, timeout=10)
            with lock:
                if r is None:
                    stats["failed"] += 1
                elif r[0] != 200:
                    stats["non200"] += 1
                elif not r[2]:
                    stats["cut"] += 1
                elif hashlib.sha256(r[1]).hexdigest() == SUMS[n]:
                    stats["complete_ok"] += 1
                else:
                    stats["complete_bad"] += 1
                    bad.append(path)
            if r is None:
                time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(o.clients)]
    for t in threads:
        t.start()
    t0 = time.time()
    for cycle in range(o.cycles):
        p = start()
        time.sleep(random.uniform(1, 3))
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()
        if (cycle + 1) % 10 == 0:
            print("cycle %d, %.0f s: %s" % (cycle + 1, time.time() - t0, stats), flush=True)
    stop.set()
    for t in threads:
        t.join()
    print("under kills: %s" % stats)

    # Once more, quietly: the loader and manager run; every object read
    # through the cache and checked.
    p = start()
    time.sleep(12)
    after = {"ok": 0, "bad": 0, "other": 0, "hit": 0}
    for n in range(OBJECTS):
        r = fetch(port, "/c/%d" % n, timeout=10)
        if r is None or r[0] != 200 or not r[2]:
            after["other"] += 1
        elif hashlib.sha256(r[1]).hexdigest() == SUMS[n]:
            after["ok"] += 1
        else:
            after["bad"] += 1
            bad.append("/c/%d after" % n)
    print("after restart, every object through the cache: %s" % after)
    subprocess.run(base + ["-s", "quit"], capture_output=True)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
    temp_files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(prefix, "temp")) for f in fs]
    cache_files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(prefix, "cache")) for f in fs]
    odd = [f for f in cache_files if not all(c in "0123456789abcdef" for c in os.path.basename(f))]
    print("after a graceful stop: %d files in proxy_temp_path, %d cache files (%d not named as entries)" % (
        len(temp_files), len(cache_files), len(odd)))
    for f in (temp_files + odd)[:10]:
        print("  stray: %s" % f)
    if bad:
        print("differing responses: %s" % bad[:20])
    origin.shutdown()
    if not o.keep:
        shutil.rmtree(prefix, ignore_errors=True)
    else:
        print("prefix kept: %s" % prefix)


if __name__ == "__main__":
    sys.exit(main())
