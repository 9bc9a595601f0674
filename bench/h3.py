#!/usr/bin/env python3
"""HTTP/3 beside tern's own HTTP/2: server instructions per request.

No nginx here has HTTP/3 (Debian's is 1.22) and Debian's h2load is built
without QUIC, so the comparison is tern against itself (issue 23's speed
row: HTTP/3 CPU per request within 1.5x of HTTP/2's, with GSO on).

    python3 bench/h3.py --tern target/release/tern [--sizes 1k,16k]
        [-c 8] [-m 10] [-n 3000] [--port 18291] [--protos h3,h2]

One tern (`worker_processes 1`, `master_process off`) under `valgrind
--tool=callgrind` serves one nginx.conf with both `listen ... ssl http2`
and `listen ... quic reuseport` on the same port, `quic_gso on`,
`access_log off`. Per protocol and size: a warm-up, a callgrind dump, a
run of n/3 requests, a dump, a run of n requests, a dump; instructions
per request = (Ir of the second run - Ir of the first) / (its extra
requests), so handshakes and start-up cancel out (as bench/h2.py
--callgrind). The HTTP/3 load is this script's own aioquic client (-c
connections, -m requests in flight on each); HTTP/2's is h2load with the
same -c and -m. KEEP=1 keeps each prefix with its callgrind dumps
(`callgrind_annotate --inclusive=yes DIR/cg.out.3`). User-space instructions only: the kernel's UDP and TCP
work is not counted (count syscalls with `strace -c -f -p PID`).
"""
import argparse
import asyncio
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

CONF = """worker_processes 1;
error_log logs/error.log notice;
pid logs/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    default_type application/octet-stream;
    keepalive_requests 1000000;
    quic_gso on;
    server {{
        listen 127.0.0.1:{port} ssl http2;
        listen 127.0.0.1:{port} quic reuseport;
        ssl_certificate cert.pem;
        ssl_certificate_key key.pem;
        root html;
    }}
}}
"""


def make_prefix(port):
    d = tempfile.mkdtemp(prefix="h3bench-", dir="/var/tmp")
    os.chmod(d, 0o755)
    os.makedirs(d + "/logs")
    os.makedirs(d + "/html")
    for name, n in (("1k", 1024), ("16k", 16384)):
        with open("%s/html/%s.bin" % (d, name), "wb") as f:
            f.write(b"x" * n)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
         d + "/key.pem", "-out", d + "/cert.pem", "-days", "2",
         "-subj", "/CN=localhost"], check=True, capture_output=True)
    with open(d + "/nginx.conf", "w") as f:
        f.write(CONF.format(port=port))
    return d


async def h3_load(port, path, c, m, n):
    """n GETs of path over c QUIC connections, m in flight on each;
    returns how many got a 200 and their whole body."""
    from aioquic.asyncio import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.h3.connection import H3_ALPN, H3Connection
    from aioquic.h3.events import DataReceived, HeadersReceived

    class Client(QuicConnectionProtocol):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.h3 = H3Connection(self._quic)
            self.waiting = {}

        def quic_event_received(self, event):
            for ev in self.h3.handle_event(event):
                if isinstance(ev, (HeadersReceived, DataReceived)):
                    slot = self.waiting.get(ev.stream_id)
                    if slot is None:
                        continue
                    if isinstance(ev, HeadersReceived):
                        slot[0] = dict(ev.headers).get(b":status") == b"200"
                    else:
                        slot[1] += len(ev.data)
                    if ev.stream_ended:
                        del self.waiting[ev.stream_id]
                        slot[2].set_result(slot[0])

        async def get(self):
            sid = self._quic.get_next_available_stream_id()
            self.h3.send_headers(sid, [
                (b":method", b"GET"), (b":scheme", b"https"),
                (b":authority", b"localhost"), (b":path", path.encode())],
                end_stream=True)
            fut = self._loop.create_future()
            self.waiting[sid] = [False, 0, fut]
            self.transmit()
            return await asyncio.wait_for(fut, 30)

    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    cfg.verify_mode = ssl.CERT_NONE
    cfg.server_name = "localhost"
    left = [n]
    ok = [0]

    async def one_conn():
        async with connect("127.0.0.1", port, configuration=cfg,
                           create_protocol=Client) as cl:
            async def worker():
                while left[0] > 0:
                    left[0] -= 1
                    if await cl.get():
                        ok[0] += 1
            await asyncio.gather(*(worker() for _ in range(m)))

    await asyncio.gather(*(one_conn() for _ in range(c)))
    return ok[0]


from aioquic.quic.configuration import QuicConfiguration  # noqa: E402


def h2_load(port, path, c, m, n):
    r = subprocess.run(
        ["h2load", "-c", str(c), "-m", str(m), "-n", str(n),
         "https://127.0.0.1:%d%s" % (port, path)],
        capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("requests:"):
            return int(line.split()[7])
    return 0


def load(proto, port, path, c, m, n):
    if proto == "h3":
        return asyncio.run(asyncio.wait_for(h3_load(port, path, c, m, n), 300))
    return h2_load(port, path, c, m, n)


def dump(pid, port):
    """A callgrind dump. vgdb's request is taken only when the server
    runs: an idle worker sleeping in epoll_wait would never take it, so
    TCP connections wake it until the dump is done."""
    p = subprocess.Popen(["callgrind_control", "-d", str(pid)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        if p.poll() is not None:
            break
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
        except OSError:
            pass
        time.sleep(0.2)
    p.wait()
    time.sleep(1)


def measure(binary, port, proto, size, c, m, n):
    d = make_prefix(port)
    out = d + "/cg.out"
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--compress-strings=no",
         "--compress-pos=no", "--callgrind-out-file=" + out,
         binary, "-p", d + "/", "-c", d + "/nginx.conf", "-e",
         d + "/logs/error.log", "-g", "daemon off; master_process off;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = "/%s.bin" % size
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.2)
        load(proto, port, path, c, m, 500)
        runs = []
        for reqs in (n // 3, n):
            dump(proc.pid, port)
            runs.append(load(proto, port, path, c, m, reqs))
        dump(proc.pid, port)
    finally:
        proc.terminate()
        proc.wait()
    ir = []
    for part in (2, 3):
        with open("%s.%d" % (out, part)) as f:
            ir.append(next(int(x.split()[1]) for x in f if x.startswith("summary:")))
    if os.environ.get("KEEP"):
        print("# kept %s (callgrind_annotate %s.3)" % (d, out), file=sys.stderr)
    else:
        shutil.rmtree(d, ignore_errors=True)
    if runs[1] - runs[0] <= 0:
        sys.exit("%s %s: requests failed (%s)" % (proto, size, runs))
    return (ir[1] - ir[0]) / (runs[1] - runs[0]), runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--sizes", default="1k,16k")
    ap.add_argument("--protos", default="h3,h2")
    ap.add_argument("-c", type=int, default=8)
    ap.add_argument("-m", type=int, default=10)
    ap.add_argument("-n", type=int, default=3000)
    ap.add_argument("--port", type=int, default=18291)
    o = ap.parse_args()
    protos = o.protos.split(",")
    print("| size | " + " | ".join("%s instr/req" % p for p in protos) +
          (" | h3/h2 |" if protos == ["h3", "h2"] else " |"))
    print("|---" * (len(protos) + 1 + (protos == ["h3", "h2"])) + "|")
    for size in o.sizes.split(","):
        v = {}
        for p in protos:
            v[p], runs = measure(o.tern, o.port, p, size, o.c, o.m, o.n)
            print("# %s %s: %.0f instr/req, requests %s" % (p, size, v[p], runs),
                  file=sys.stderr, flush=True)
        row = "| %s | " % size + " | ".join("%.0f" % v[p] for p in protos)
        if protos == ["h3", "h2"]:
            row += " | %.2fx" % (v["h3"] / v["h2"])
        print(row + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
