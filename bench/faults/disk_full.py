#!/usr/bin/env python3
"""Disk full under proxy_cache, proxy temp files and logs.

The server's proxy_temp_path, proxy_cache_path and access log live on a small
tmpfs (mounted by this script; needs root). An origin serves deterministic
objects (/obj/N, 8 KiB to 1.5 MiB, bytes derived from N). Three rounds:

1. full: a filler file takes every free byte of the tmpfs, then every object
   is fetched through the cache (/c/N) and through small proxy buffers that
   spill to temp files (/t/N), CLIENTS at a time. Each answer is sorted:
   200 with the origin's bytes, 200 cut short (the body ended before its
   Content-Length: the server gave up mid-body), another status (a 5xx is
   what nginx answers when it cannot buffer), no answer at all, or 200 with
   wrong bytes (corruption: must be 0).
2. recovered: the filler is removed; every object is fetched through the
   cache twice. Both answers must be 200 with the origin's bytes (an entry
   half-written while the disk was full must never be served), and the
   second should be a HIT (the cache works again without a restart).
3. The server is stopped gracefully and the temp directory listed.

    python3 bench/faults/disk_full.py --server target/release/tern
    python3 bench/faults/disk_full.py --server /usr/sbin/nginx

Run by hand, never from the tests (it mounts a filesystem).
"""

import argparse
import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from faultlib import QuietServer, fetch, free_port, log_kinds

OBJECTS = 60

CONF = """
worker_processes 2;
error_log {prefix}/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log {disk}/logs/access.log;
    proxy_temp_path {disk}/temp 1 2;
    proxy_cache_path {disk}/cache levels=1:2 keys_zone=z:10m inactive=60m;
    upstream origin {{ server 127.0.0.1:{origin}; }}
    server {{
        listen 127.0.0.1:{port};
        add_header X-Cache-Status $upstream_cache_status always;
        location /c/ {{
            proxy_cache z;
            proxy_cache_valid 200 60m;
            proxy_pass http://origin/obj/;
        }}
        location /t/ {{
            proxy_buffers 4 4k;
            proxy_buffer_size 4k;
            proxy_pass http://origin/obj/;
        }}
    }}
}}
"""


def body_of(n):
    size = 8192 + (n * 7919 * 131) % (1536 << 10)
    seed = hashlib.sha256(b"obj%d" % n).digest()
    return (seed * (size // 32 + 1))[:size]


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
        try:
            self.wfile.write(b)
        except OSError:
            pass

    def log_message(self, *a):
        pass


def sort_answer(r, n, sums):
    if r is None:
        return "no_answer"
    if r[0] != 200:
        return "status_%d" % r[0]
    if not r[2]:
        return "cut"
    return "ok" if hashlib.sha256(r[1]).hexdigest() == sums[n] else "BAD"


def fill(path):
    """Write zeros until the filesystem refuses; returns bytes written."""
    total = 0
    chunk = b"\0" * (64 << 10)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                total += f.write(chunk)
            except OSError:
                break
        # The last partial block.
        for size in (4096, 512, 1):
            while True:
                try:
                    total += f.write(b"\0" * size)
                except OSError:
                    break
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--size", default="96m", help="tmpfs size (must hold every object once)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--keep", action="store_true")
    o = ap.parse_args()

    sums = {n: hashlib.sha256(body_of(n)).hexdigest() for n in range(OBJECTS)}
    prefix = tempfile.mkdtemp(prefix="disk-full-")
    os.chmod(prefix, 0o777)
    disk = os.path.join(prefix, "disk")
    os.makedirs(disk)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + o.size, "tmpfs", disk], check=True)
    try:
        for d in ("logs", "temp", "cache"):
            os.makedirs(os.path.join(disk, d))
            os.chmod(os.path.join(disk, d), 0o777)
        port, oport = free_port(), free_port()
        conf = os.path.join(prefix, "nginx.conf")
        with open(conf, "w") as f:
            f.write(CONF.format(prefix=prefix, disk=disk, port=port, origin=oport))
        origin = QuietServer(("127.0.0.1", oport), Origin)
        threading.Thread(target=origin.serve_forever, daemon=True).start()
        base = [o.server, "-p", prefix + "/", "-c", conf]
        p = subprocess.Popen(base + ["-g", "daemon off;"], stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)

        filler = os.path.join(disk, "filler")
        written = fill(filler)
        print("round 1: disk full (filler %d bytes, %d free)" % (written, shutil.disk_usage(disk).free))
        jobs = [("/c/%d" % n, n) for n in range(OBJECTS)] + [("/t/%d" % n, n) for n in range(OBJECTS)]
        counts = {}
        with ThreadPoolExecutor(o.clients) as ex:
            for (path, n), r in zip(jobs, ex.map(lambda j: fetch(port, j[0]), jobs)):
                k = path[1] + ":" + sort_answer(r, n, sums)
                counts[k] = counts.get(k, 0) + 1
        print("  answers (c = through the cache, t = through temp files): %s" % dict(sorted(counts.items())))
        alive = p.poll() is None
        print("  server running after round 1: %s" % alive)

        os.unlink(filler)
        time.sleep(1)
        print("round 2: space back (%d free)" % shutil.disk_usage(disk).free)
        first, second, hits = {}, {}, 0
        for n in range(OBJECTS):
            k = sort_answer(fetch(port, "/c/%d" % n), n, sums)
            first[k] = first.get(k, 0) + 1
            r = fetch(port, "/c/%d" % n)
            k = sort_answer(r, n, sums)
            second[k] = second.get(k, 0) + 1
            if r is not None and r[3].get("x-cache-status") == "HIT":
                hits += 1
        print("  first fetch through the cache: %s" % first)
        print("  second fetch: %s, %d of %d HIT" % (second, hits, OBJECTS))

        subprocess.run(base + ["-s", "quit"], capture_output=True)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
        temp_files = [f for _, _, fs in os.walk(os.path.join(disk, "temp")) for f in fs]
        print("after a graceful stop: %d files in proxy_temp_path" % len(temp_files))
        print("error.log lines by kind (level, message up to the first comma):")
        for v, k in log_kinds(os.path.join(prefix, "error.log")):
            print("  %5d %s" % (v, k))
        origin.shutdown()
        bad = sum(v for k, v in list(counts.items()) + list(first.items()) + list(second.items()) if k.endswith("BAD"))
        print("RESULT: %d corrupt answers, server %s, cache %s after recovery" % (
            bad, "kept running" if alive else "DIED", "works" if hits == OBJECTS else "degraded"))
    finally:
        subprocess.run(["umount", "-l", disk])
        if not o.keep:
            shutil.rmtree(prefix, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
