#!/usr/bin/env python3
"""HTTP/2 over TLS, tern beside nginx on one nginx.conf (the shared harness
has no h2 scenario and no way to add one, so it lives here).

    python3 bench/h2.py --tern target/release/tern [--nginx /usr/sbin/nginx]
        [--sizes 1k,16k] [--repeats 3] [-c 32] [-m 10] [-n 200000]
        [--idle 1000] [--port 18098] [--callgrind]

For each size and repeat (server order alternating per repeat): a fresh
prefix, `worker_processes 1`, the server pinned to CPU 1 (`taskset -c 1`,
`-g 'daemon off; master_process on;'` as ../shared/bench/run.sh), then
`taskset -c 0 h2load -c C -m M -n N https://127.0.0.1:PORT/SIZE.bin`.
Server CPU = utime+stime of all its processes (from /proc/PID/stat) over
the h2load run, divided by the requests done: "µs/req". Then (once per
server) --idle TLS h2 connections are opened, each does one GET and
stays open: RSS of the server's processes before and after, per
connection. Prints a table with medians and spreads ((max-min)/median).

--callgrind: instead, user-space instructions per request, which hold up
on a loaded machine (this VM has no hardware counters for `perf stat -e
instructions:u`): each server runs under `valgrind --tool=callgrind`
(`master_process off`), h2load warms it up, then runs -n/3 and -n
requests with a callgrind dump after each; instructions per request =
(Ir of the second run - Ir of the first) / (its extra requests), so the
TLS handshakes and start-up cancel out. Large memcpy/memset count about
one instruction per byte under valgrind (rep movsb), so sizes past a few
KiB overstate copies.
"""
import argparse
import os
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

CLK = os.sysconf("SC_CLK_TCK")

CONF = """worker_processes 1;
error_log logs/error.log notice;
pid logs/nginx.pid;
events {{ worker_connections {wc}; }}
http {{
    access_log off;
    default_type application/octet-stream;
    # h2load does not reconnect after a GOAWAY.
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate cert.pem;
        ssl_certificate_key key.pem;
        root html;
    }}
}}
"""


def proc_tree(root):
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        ppid = int(st.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_ticks(pids):
    t = 0
    for p in pids:
        try:
            with open("/proc/%d/stat" % p) as f:
                f_ = f.read().rsplit(")", 1)[1].split()
            t += int(f_[11]) + int(f_[12])
        except OSError:
            pass
    return t


def rss_kb(pids):
    t = 0
    for p in pids:
        try:
            with open("/proc/%d/status" % p) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        t += int(line.split()[1])
        except OSError:
            pass
    return t


def make_prefix(port, wc):
    """A fresh prefix: the files, an ECDSA certificate, nginx.conf."""
    d = tempfile.mkdtemp(prefix="h2bench-", dir="/var/tmp")
    # Workers run as nobody (started as root).
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
        f.write(CONF.format(port=port, wc=wc))
    return d


class Server:
    def __init__(self, label, binary, port, wc):
        self.label, self.binary, self.port = label, binary, port
        self.dir = make_prefix(port, wc)
        self.proc = subprocess.Popen(
            ["taskset", "-c", "1", binary, "-p", self.dir + "/", "-c",
             self.dir + "/nginx.conf", "-e", self.dir + "/logs/error.log",
             "-g", "daemon off; master_process on;"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(0.5)

    def pids(self):
        return proc_tree(self.proc.pid)

    def stop(self):
        pids = self.pids()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def h2load(port, size, c, m, n):
    r = subprocess.run(
        ["taskset", "-c", "0", "h2load", "-c", str(c), "-m", str(m), "-n", str(n),
         "https://127.0.0.1:%d/%s.bin" % (port, size)],
        capture_output=True, text=True)
    out = r.stdout
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
    rps = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out)
    cipher = re.search(r"Cipher: (\S+)", out)
    proto = re.search(r"Application protocol: (\S+)", out)
    return {
        "succeeded": int(done.group(2)) if done else 0,
        "rps": float(rps.group(1)) if rps else 0.0,
        "cipher": cipher.group(1) if cipher else "?",
        "proto": proto.group(1) if proto else "?",
    }


# One GET / over h2 (HPACK static table: :method GET, :scheme https,
# :path /, :authority literal).
def h2_get():
    pre = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    block = b"\x82\x87\x84\x01\x09localhost"
    head = len(block).to_bytes(3, "big") + b"\x01\x05" + (1).to_bytes(4, "big")
    return pre + head + block


def idle_rss(srv, count):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    pids = srv.pids()
    time.sleep(0.5)
    before = rss_kb(pids)
    conns = []
    for _ in range(count):
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", srv.port)),
                            server_hostname="localhost")
        assert s.selected_alpn_protocol() == "h2"
        s.sendall(h2_get())
        s.settimeout(5)
        got = b""
        # Until the response's HEADERS (type 1) came.
        while True:
            got += s.recv(65536)
            i, seen = 0, False
            while i + 9 <= len(got):
                ln = int.from_bytes(got[i:i + 3], "big")
                if got[i + 3] == 1:
                    seen = True
                i += 9 + ln
            if seen:
                break
        conns.append(s)
    time.sleep(2)
    after = rss_kb(pids)
    for s in conns:
        s.close()
    return (after - before) * 1024 / count, before, after


def callgrind(label, binary, port, size, c, m, n):
    """Instructions per request of `binary` serving `size` (see --callgrind)."""
    d = make_prefix(port, 1024)
    out = d + "/cg.out"
    proc = subprocess.Popen(
        ["taskset", "-c", "1", "valgrind", "--tool=callgrind",
         "--callgrind-out-file=" + out, binary, "-p", d + "/", "-c",
         d + "/nginx.conf", "-e", d + "/logs/error.log", "-g",
         "daemon off; master_process off;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.2)
        h2load(port, size, c, m, 2000)
        runs = []
        for reqs in (n // 3, n):
            subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True)
            time.sleep(1)
            r = h2load(port, size, c, m, reqs)
            runs.append(r["succeeded"])
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True)
        time.sleep(1)
    finally:
        proc.terminate()
        proc.wait()
    ir = []
    for part in (2, 3):
        with open("%s.%d" % (out, part)) as f:
            ir.append(next(int(l.split()[1]) for l in f if l.startswith("summary:")))
    shutil.rmtree(d, ignore_errors=True)
    return (ir[1] - ir[0]) / (runs[1] - runs[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--sizes", default="1k,16k")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-c", type=int, default=32)
    ap.add_argument("-m", type=int, default=10)
    ap.add_argument("-n", type=int, default=200000)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--port", type=int, default=18098)
    ap.add_argument("--callgrind", action="store_true")
    o = ap.parse_args()
    servers = [("nginx", o.nginx), ("tern", o.tern)]
    if o.callgrind:
        print("| size | nginx instr/req | tern instr/req | tern/nginx |")
        print("|---|---|---|---|")
        for size in o.sizes.split(","):
            v = {label: callgrind(label, b, o.port, size, o.c, o.m, o.n)
                 for label, b in servers}
            print("| %s | %.0f | %.0f | %.2fx |" % (
                size, v["nginx"], v["tern"], v["tern"] / v["nginx"]), flush=True)
        return 0
    res = {}
    for size in o.sizes.split(","):
        for rep in range(o.repeats):
            order = servers if rep % 2 == 0 else servers[::-1]
            for label, binary in order:
                srv = Server(label, binary, o.port, 1024)
                try:
                    h2load(o.port, size, o.c, o.m, 2000)  # warm-up
                    pids = srv.pids()
                    t0 = cpu_ticks(pids)
                    r = h2load(o.port, size, o.c, o.m, o.n)
                    t1 = cpu_ticks(pids)
                finally:
                    srv.stop()
                if r["succeeded"] < o.n * 0.99:
                    sys.exit("%s: only %d of %d requests succeeded" % (label, r["succeeded"], o.n))
                us = (t1 - t0) / CLK * 1e6 / r["succeeded"]
                res.setdefault((size, label), []).append((us, r["rps"]))
                print("%s %s repeat %d: %.1f µs/req, %.0f req/s, %d ok, %s %s" % (
                    size, label, rep + 1, us, r["rps"], r["succeeded"], r["proto"],
                    r["cipher"]), flush=True)
    print()
    print("| size | server | µs/req (median) | spread | req/s (median) | ratio tern/nginx µs |")
    print("|---|---|---|---|---|---|")
    for size in o.sizes.split(","):
        med = {}
        for label, _ in servers:
            v = res[(size, label)]
            us = [x[0] for x in v]
            m = statistics.median(us)
            med[label] = m
            print("| %s | %s | %.1f | %.0f%% | %.0f | %s |" % (
                size, label, m, 100 * (max(us) - min(us)) / m,
                statistics.median([x[1] for x in v]),
                "%.2fx" % (m / med["nginx"]) if label == "tern" else ""))
    if o.idle:
        print()
        print("| server | idle h2 conns | RSS before KiB | after KiB | bytes/conn |")
        print("|---|---|---|---|---|")
        for label, binary in servers:
            srv = Server(label, binary, o.port, o.idle + 100)
            try:
                per, b, a = idle_rss(srv, o.idle)
            finally:
                srv.stop()
            print("| %s | %d | %d | %d | %.0f |" % (label, o.idle, b, a, per), flush=True)


if __name__ == "__main__":
    sys.exit(main())
