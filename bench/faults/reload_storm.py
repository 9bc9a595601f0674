#!/usr/bin/env python3
"""Reload storm under load (RELIABILITY.md, "Faults under load").

Starts a server (tern or nginx) on a config with a static root and a proxied
upload location, then keeps it busy with:
  - wrk, 64 keep-alive connections on a 1 KiB file (counts non-2xx and
    socket errors),
  - a client making one TCP connection per request (Connection: close),
  - a slow download of a large file (rate-limited by the client),
  - a slow upload through proxy_pass to a local upstream that counts bytes,
  - a long-lived keep-alive connection that sends one request every
    200 ms and must never be closed by the server without notice,
  - a WebSocket through proxy_pass (Upgrade) to a local echo server,
    one message every 200 ms, each echoed back; it must stay open,
while it sends RELOADS `-s reload` at RATE per second, each with a changed
configuration (a header value). Prints one result line per load and the
master's RSS before and after.

    python3 bench/faults/reload_storm.py --server target/release/tern
    python3 bench/faults/reload_storm.py --server /usr/sbin/nginx

Long-running and load-generating: run by hand, never from the tests.
"""

import argparse
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

CONF = """
worker_processes 2;
error_log logs/error.log notice;
pid logs/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    upstream up {{ server 127.0.0.1:{up}; }}
    upstream ws {{ server 127.0.0.1:{ws}; }}
    server {{
        listen 127.0.0.1:{port};
        root html;
        add_header X-Generation {gen};
        location /up {{
            client_max_body_size 0;
            proxy_request_buffering off;
            proxy_pass http://up;
        }}
        location /ws {{
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_read_timeout 300s;
            proxy_pass http://ws;
        }}
    }}
}}
"""


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        got = 0
        while got < n:
            b = self.rfile.read(min(65536, n - got))
            if not b:
                break
            got += len(b)
        body = str(got).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC11B65"


def ws_accept(key):
    import base64
    import hashlib
    return base64.b64encode(hashlib.sha1(key + WS_GUID).digest())


def ws_read_frame(f):
    """One WebSocket frame: (opcode, payload) or None at EOF."""
    h = f.read(2)
    if len(h) < 2:
        return None
    n = h[1] & 0x7F
    if n == 126:
        n = int.from_bytes(f.read(2), "big")
    elif n == 127:
        n = int.from_bytes(f.read(8), "big")
    mask = f.read(4) if h[1] & 0x80 else b""
    data = f.read(n)
    if len(data) < n:
        return None
    if mask:
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return h[0] & 0x0F, data


def ws_frame(payload, masked):
    out = bytearray([0x81])
    n = len(payload)
    if n < 126:
        out.append((0x80 if masked else 0) | n)
    else:
        out.append((0x80 if masked else 0) | 126)
        out += n.to_bytes(2, "big")
    if masked:
        key = os.urandom(4)
        out += key
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes(out) + payload


def ws_echo_server(port, stop):
    """A WebSocket echo server: the handshake, then every text frame back."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(16)
    ls.settimeout(0.5)

    def serve(c):
        f = c.makefile("rb")
        key = b""
        while True:
            line = f.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"sec-websocket-key":
                key = v.strip()
        c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + ws_accept(key) + b"\r\n\r\n")
        while True:
            fr = ws_read_frame(f)
            if fr is None or fr[0] == 8:
                break
            c.sendall(ws_frame(fr[1], False))
        c.close()

    while not stop.is_set():
        try:
            c, _ = ls.accept()
        except OSError:
            continue
        threading.Thread(target=serve, args=(c,), daemon=True).start()
    ls.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_kb(pid):
    total = 0
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    except OSError:
        pass
    # nginx: the workers are processes of their own.
    try:
        for c in open("/proc/%d/task/%d/children" % (pid, pid)).read().split():
            total += rss_kb(int(c))
    except OSError:
        pass
    return total


def read_response(f, closing=None):
    """Reads one HTTP/1.1 response with Content-Length; returns status or
    None. `closing` (a list) gets True appended when the response says
    `Connection: close`."""
    line = f.readline()
    if not line:
        return None
    status = int(line.split()[1])
    length = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b""):
            break
        k, _, v = h.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
        if k.strip().lower() == b"connection" and v.strip().lower() == b"close" \
                and closing is not None:
            closing.append(True)
    if length:
        f.read(length)
    return status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--reloads", type=int, default=200)
    ap.add_argument("--rate", type=float, default=5.0)
    ap.add_argument("--download-mb", type=int, default=1024)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--upgrades", type=int, default=0,
                    help="instead of reloads: this many binary upgrades "
                         "(USR2, wait for the new master, QUIT the old one)")
    o = ap.parse_args()

    prefix = tempfile.mkdtemp(prefix="reload-storm-")
    # nginx workers run as `nobody` and must read html/.
    os.chmod(prefix, 0o755)
    for d in ("logs", "html", "conf"):
        os.makedirs(os.path.join(prefix, d))
    with open(os.path.join(prefix, "html/1k"), "wb") as f:
        f.write(b"x" * 1024)
    big = os.path.join(prefix, "html/big")
    with open(big, "wb") as f:
        f.truncate(o.download_mb << 20)
    port, up, wsport = free_port(), free_port(), free_port()
    conf = os.path.join(prefix, "conf/nginx.conf")

    def write_conf(gen):
        with open(conf, "w") as f:
            f.write(CONF.format(port=port, up=up, ws=wsport, gen=gen))

    write_conf(0)
    srv_up = http.server.ThreadingHTTPServer(("127.0.0.1", up), Upstream)
    threading.Thread(target=srv_up.serve_forever, daemon=True).start()

    base = [o.server, "-p", prefix + "/", "-c", conf]
    # A binary upgrade needs a daemon: with `daemon off` the master's
    # parent is this script, and nginx (tern too) ignores USR2 while the
    # parent that started it is still there.
    daemon = [] if o.upgrades else ["-g", "daemon off;"]
    server = subprocess.Popen(base + daemon, stderr=subprocess.PIPE)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    time.sleep(0.5)
    pid = server.pid
    if o.upgrades:
        pid = int(open(os.path.join(prefix, "logs/nginx.pid")).read().strip())
    rss_before = rss_kb(pid)
    url = "http://127.0.0.1:%d" % port
    stop = threading.Event()
    results = {}
    threading.Thread(target=ws_echo_server, args=(wsport, stop), daemon=True).start()

    def websocket():
        ok = bad = 0
        state = "still open"
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n"
                      b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                      b"Sec-WebSocket-Version: 13\r\n\r\n")
            f = s.makefile("rb")
            status = f.readline()
            while f.readline() not in (b"\r\n", b""):
                pass
            if b" 101 " not in status:
                state = "handshake answered %r" % status
            else:
                i = 0
                while not stop.is_set():
                    msg = b"message %d" % i
                    s.sendall(ws_frame(msg, True))
                    fr = ws_read_frame(f)
                    if fr is None:
                        state = "CLOSED by the server"
                        break
                    if fr[1] == msg:
                        ok += 1
                    else:
                        bad += 1
                    i += 1
                    time.sleep(0.2)
            s.close()
        except OSError as e:
            state = "failed: %s" % e
        results["websocket"] = "%d echoed, %d wrong, %s" % (ok, bad, state)

    def conn_per_request():
        ok = bad = 0
        while not stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET /1k HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                st = read_response(s.makefile("rb"))
                s.close()
                if st == 200:
                    ok += 1
                else:
                    bad += 1
            except OSError:
                bad += 1
        results["conn-per-request"] = "%d ok, %d failed" % (ok, bad)

    def long_lived():
        # A well-behaved client: it reconnects when a response says
        # `Connection: close`; a close without that notice is a failure.
        ok = bad = reconnects = 0
        closed = False
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            f = s.makefile("rb")
            while not stop.is_set():
                s.sendall(b"GET /1k HTTP/1.1\r\nHost: a\r\n\r\n")
                closing = []
                st = read_response(f, closing)
                if st is None:
                    closed = True
                    break
                ok += st == 200
                bad += st != 200
                if closing:
                    s.close()
                    s = socket.create_connection(("127.0.0.1", port), timeout=5)
                    f = s.makefile("rb")
                    reconnects += 1
                time.sleep(0.2)
        except OSError:
            closed = True
        results["long-lived keep-alive"] = "%d ok, %d failed, %d reconnects after Connection: close, %s" % (
            ok, bad, reconnects, "CLOSED by the server without notice" if closed else "still open")

    def download():
        t0 = time.time()
        p = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "--limit-rate", "20M", "-w",
             "%{http_code} %{size_download}", url + "/big"],
            capture_output=True, text=True)
        code, size = (p.stdout.split() + ["?", "0"])[:2]
        want = o.download_mb << 20
        results["slow download"] = "status %s, %s of %d bytes, curl exit %d, %.0f s" % (
            code, size, want, p.returncode, time.time() - t0)

    def upload():
        size = 200 << 20
        p = subprocess.run(
            ["curl", "-s", "--limit-rate", "5M", "-H", "Expect:", "-X", "POST",
             "--data-binary", "@-", "-w", " %{http_code}", url + "/up"],
            input=b"u" * size, capture_output=True)
        out = p.stdout.decode(errors="replace").split()
        results["slow upload"] = "upstream counted %s of %d bytes, status %s, curl exit %d" % (
            out[0] if out else "?", size, out[1] if len(out) > 1 else "?", p.returncode)

    threads = [threading.Thread(target=t) for t in (conn_per_request, long_lived, websocket, download, upload)]
    for t in threads:
        t.start()
    pidfile = os.path.join(prefix, "logs/nginx.pid")

    def master_pid():
        try:
            return int(open(pidfile).read().strip())
        except (OSError, ValueError):
            return 0

    duration = (o.upgrades * 4 + 45 if o.upgrades else o.reloads / o.rate) + 5
    wrk = subprocess.Popen(
        ["wrk", "-t1", "-c64", "-d%ds" % int(duration), url + "/1k"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(2)
    failed_reloads = 0
    if o.upgrades:
        for i in range(o.upgrades):
            old = master_pid()
            if old <= 0:
                print("no pid in %s" % pidfile)
                failed_reloads += 1
                break
            os.kill(old, signal.SIGUSR2)
            t0 = time.time()
            while (master_pid() in (0, old)) and time.time() - t0 < 10:
                time.sleep(0.05)
            new = master_pid()
            if new in (0, old):
                failed_reloads += 1
                break
            time.sleep(1)
            os.kill(old, signal.SIGQUIT)
            # The next USR2 is ignored while the old master lives (it
            # finishes its transfers first), as in nginx.
            t0 = time.time()
            while os.path.exists("/proc/%d" % old) and time.time() - t0 < 90:
                time.sleep(0.1)
            time.sleep(1)
        pid = master_pid()
    else:
        for i in range(1, o.reloads + 1):
            write_conf(i)
            r = subprocess.run(base + ["-s", "reload"], capture_output=True)
            failed_reloads += r.returncode != 0
            time.sleep(1.0 / o.rate)
    wout, _ = wrk.communicate()
    stop.set()
    for t in threads:
        t.join()
    time.sleep(2)
    rss_after = rss_kb(pid)
    m = re.search(r"(\d+) requests in", wout)
    errs = re.search(r"Socket errors: (.*)", wout)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", wout)
    results["wrk -c64 keep-alive"] = "%s requests, socket errors: %s, non-2xx: %s" % (
        m.group(1) if m else "?", errs.group(1) if errs else "none",
        non2xx.group(1) if non2xx else "0")
    print("server: %s" % o.server)
    if o.upgrades:
        print("binary upgrades: %d, %d failed" % (o.upgrades, failed_reloads))
    else:
        print("reloads: %d at %.1f/s, %d refused" % (o.reloads, o.rate, failed_reloads))
    for k in ("wrk -c64 keep-alive", "conn-per-request", "long-lived keep-alive",
              "websocket", "slow download", "slow upload"):
        print("%-22s %s" % (k + ":", results.get(k, "?")))
    print("master+workers RSS: %d kB before, %d kB after" % (rss_before, rss_after))
    if pid > 0:
        os.kill(pid, signal.SIGQUIT)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
    t0 = time.time()
    while pid and os.path.exists("/proc/%d" % pid) and time.time() - t0 < 30:
        time.sleep(0.1)
    srv_up.shutdown()
    if not o.keep:
        shutil.rmtree(prefix, ignore_errors=True)
    else:
        print("prefix kept: %s" % prefix)


if __name__ == "__main__":
    sys.exit(main())
