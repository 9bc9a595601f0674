#!/usr/bin/env python3
"""nginx and tern side by side on compressed responses: the same generated
config (plus per-server extras), the same URLs, `wrk -t1` on CPU 0, the
server (one worker) on CPU 1, repeats alternating the order; prints a
markdown table of median req/s, the tern/nginx ratio, the spread
((max-min)/median of each side) and the bytes of one response body as each
server sends it.

    python3 bench/compress_ab.py --tern target/release/tern \\
        --http 'gzip on; gzip_comp_level 1; gzip_types text/css application/json;' \\
        --tern-http 'compress_cache off;' --paths /1k.html,/16k.html,/256k.html,/missing \\
        [--nginx-main 'load_module /usr/lib/nginx/modules/ngx_http_brotli_filter_module.so;'] \\
        [--ae gzip] [--repeats 3] [--duration 5] [--conns 32] [--port 18097]

Files: /1k.html, /16k.html, /256k.html (and .css, .js, .json) are
deterministic varied text from bench/gzip_small.py's generator (about 2.4:1
at gzip level 1, like real pages); `--precompress` also writes FILE.gz
(zlib level 6, via Python's zlib) and FILE.br (if the brotli Python module
is there) for the *_static comparisons. /missing gives the 404 page.
"""
import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gzip_small import html_text  # noqa: E402

SIZES = {"1k": 1024, "16k": 16384, "256k": 262144}
EXTS = ["html", "css", "js", "json"]


def write_docroot(root, precompress):
    os.makedirs(root, exist_ok=True)
    for name, n in SIZES.items():
        data = html_text(n)
        for ext in EXTS:
            p = os.path.join(root, "%s.%s" % (name, ext))
            with open(p, "wb") as f:
                f.write(data)
            if precompress:
                c = zlib.compressobj(6, zlib.DEFLATED, 31, 8)
                with open(p + ".gz", "wb") as f:
                    f.write(c.compress(data) + c.flush())


def conf(port, root, http, main):
    return (
        "%s\nworker_processes 1;\npid logs/nginx.pid;\nerror_log logs/error.log warn;\n"
        "events { worker_connections 1024; }\n"
        "http {\n    include /etc/nginx/mime.types;\n    default_type application/octet-stream;\n"
        "    access_log off;\n    sendfile on; tcp_nopush on; tcp_nodelay on;\n"
        "    keepalive_requests 1000000;\n    %s\n"
        "    server { listen 127.0.0.1:%d; root %s; location / { } }\n}\n"
    ) % (main, http, port, root)


def wait_port(port, up=True, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            if up:
                return True
        except OSError:
            if not up:
                return True
        time.sleep(0.05)
    return False


def start(binary, text, workdir, port):
    prefix = tempfile.mkdtemp(prefix="cab-", dir=workdir)
    os.mkdir(os.path.join(prefix, "logs"))
    path = os.path.join(prefix, "nginx.conf")
    with open(path, "w") as f:
        f.write(text)
    p = subprocess.Popen(["taskset", "-c", "1", binary, "-p", prefix + "/", "-c", path,
                          "-g", "daemon off; master_process on;"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not wait_port(port):
        p.kill()
        raise SystemExit("%s did not start; see %s/logs/error.log" % (binary, prefix))
    return p, prefix


def stop(p, prefix, port):
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    wait_port(port, up=False)
    shutil.rmtree(prefix, ignore_errors=True)


def body_bytes(port, path, ae):
    """Bytes of the body of one GET as sent (chunked framing removed) and
    its Content-Encoding."""
    r = subprocess.run(["curl", "-s", "-D", "/dev/stderr", "-H", "Accept-Encoding: " + ae,
                        "http://127.0.0.1:%d%s" % (port, path)], capture_output=True)
    ce = re.search(rb"(?im)^content-encoding: *(\S+)", r.stderr)
    return len(r.stdout), (ce.group(1).decode() if ce else "-")


def wrk(port, path, ae, conns, duration):
    r = subprocess.run(["taskset", "-c", "0", "wrk", "-t1", "-c%d" % conns, "-d%ds" % duration,
                        "-H", "Accept-Encoding: " + ae, "http://127.0.0.1:%d%s" % (port, path)],
                       capture_output=True, text=True)
    m = re.search(r"Requests/sec:\s+([\d.]+)", r.stdout)
    if not m:
        raise SystemExit("wrk failed: " + r.stdout + r.stderr)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", r.stdout)
    return float(m.group(1)), int(non2xx.group(1)) if non2xx else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--http", default="gzip on;")
    ap.add_argument("--tern-http", default="")
    ap.add_argument("--nginx-http", default="")
    ap.add_argument("--nginx-main", default="")
    ap.add_argument("--paths", default="/1k.html,/16k.html,/256k.html,/missing")
    ap.add_argument("--ae", default="gzip")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--port", type=int, default=18097)
    ap.add_argument("--workdir", default="/var/tmp/tern-compress-bench")
    ap.add_argument("--precompress", action="store_true")
    o = ap.parse_args()
    root = os.path.join(o.workdir, "www")
    os.makedirs(o.workdir, exist_ok=True)
    write_docroot(root, o.precompress)
    servers = [
        ("nginx", o.nginx, conf(o.port, root, o.http + " " + o.nginx_http, o.nginx_main)),
        ("tern", o.tern, conf(o.port, root, o.http + " " + o.tern_http, "")),
    ]
    paths = o.paths.split(",")
    rps = {(s, p): [] for s, _, _ in servers for p in paths}
    size = {}
    for rep in range(o.repeats):
        order = servers if rep % 2 == 0 else list(reversed(servers))
        for label, binary, text in order:
            p, prefix = start(binary, text, o.workdir, o.port)
            try:
                for path in paths:
                    if rep == 0:
                        size[(label, path)] = body_bytes(o.port, path, o.ae)
                    wrk(o.port, path, o.ae, o.conns, 1)  # warm-up
                    r, bad = wrk(o.port, path, o.ae, o.conns, o.duration)
                    rps[(label, path)].append(r)
                    print("rep %d %-6s %-12s %9.0f req/s%s" % (
                        rep + 1, label, path, r, "" if path == "/missing" or not bad else
                        " (%d non-2xx)" % bad), file=sys.stderr, flush=True)
            finally:
                stop(p, prefix, o.port)
    print("| path | nginx req/s | tern req/s | **tern/nginx** | spread nginx / tern | body bytes nginx / tern (encoding) |")
    print("|---|--:|--:|--:|--:|--:|")
    for path in paths:
        n, t = rps[("nginx", path)], rps[("tern", path)]
        mn, mt = statistics.median(n), statistics.median(t)
        sp = lambda v: (max(v) - min(v)) / statistics.median(v) * 100
        sn, st = size[("nginx", path)], size[("tern", path)]
        print("| %s | %.0f | %.0f | **%.2fx** | %.0f%% / %.0f%% | %d / %d (%s / %s) |" % (
            path, mn, mt, mt / mn, sp(n), sp(t), sn[0], st[0], sn[1], st[1]))


if __name__ == "__main__":
    main()
