#!/usr/bin/env python3
"""Stream proxy benchmark: tern and nginx side by side on one stream config.

    python3 bench/stream.py [--tern target/release/tern] [--nginx /usr/sbin/nginx]
                            [--mb 200] [--conns 3000] [--dgrams 20000] [--repeats 2]

Each server runs one worker (`worker_processes 1`) on the same stream {}
block; backends and clients are separate Python processes. Three figures
per server, each also divided by the server's CPU time (utime + stime of
all its processes from /proc, so a slow Python client does not hide the
server's cost):

- tcp relay: one connection, the backend sends --mb MB, the client reads
  it all through the proxy: MB/s and MB per server CPU-second;
- conn rate: --conns connections one after another (connect, read the
  backend's one byte, close): connections/s and per server CPU-second;
- udp: --dgrams DNS-like datagrams (64 bytes, one answer each, 32 in
  flight) through one listener: datagrams/s and per server CPU-second.

The servers alternate per repeat (nginx, tern, nginx, tern...), so
background load on a shared machine hits both alike; the best of the
repeats is kept. Ratios are tern / nginx (higher is better for tern).
"""

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

STREAM_SO = "/usr/lib/nginx/modules/ngx_stream_module.so"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


# ---- backends (separate processes) -----------------------------------------


def source_backend(port, ready):
    """Sends `n` MB (first 8 bytes of the connection give n) and closes."""
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(128)
    ready.set()
    chunk = b"x" * (1 << 20)
    while True:
        c, _ = l.accept()
        want = b""
        while len(want) < 8:
            got = c.recv(8 - len(want))
            if not got:
                break
            want += got
        n = int(want or b"0")
        try:
            for _ in range(n):
                c.sendall(chunk)
        except OSError:
            pass
        c.close()


def byte_backend(port, ready):
    """Writes one byte to each connection and closes it."""
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(1024)
    ready.set()
    while True:
        c, _ = l.accept()
        try:
            c.sendall(b"!")
        except OSError:
            pass
        c.close()


def udp_backend(port, ready):
    """DNS-like: one answer (the question, 64 bytes) per datagram."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", port))
    ready.set()
    while True:
        d, a = s.recvfrom(2048)
        s.sendto(d, a)


# ---- servers -----------------------------------------------------------------


def conf(ports):
    return f"""worker_processes 1;
error_log logs/error.log crit;
pid logs/pid;
events {{ worker_connections 4096; }}
stream {{
    server {{ listen 127.0.0.1:{ports['tcp']}; proxy_pass 127.0.0.1:{ports['src']}; }}
    server {{ listen 127.0.0.1:{ports['conn']}; proxy_pass 127.0.0.1:{ports['byte']}; }}
    server {{ listen 127.0.0.1:{ports['udp']} udp; proxy_pass 127.0.0.1:{ports['ubk']};
             proxy_responses 1; proxy_timeout 10s; }}
}}
"""


def start(kind, binary, ports):
    d = tempfile.mkdtemp(prefix=f"bench-stream-{kind}-")
    os.makedirs(f"{d}/logs")
    text = conf(ports)
    if kind == "nginx":
        text = f"load_module {STREAM_SO};\ndaemon off;\n" + text
    with open(f"{d}/nginx.conf", "w") as f:
        f.write(text)
    p = subprocess.Popen(
        [binary, "-p", d + "/", "-c", f"{d}/nginx.conf", "-e", f"{d}/logs/error.log"]
        + (["-g", "daemon off;"] if kind != "nginx" else []),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", ports["tcp"]), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return p, d


def tree_pids(root):
    """The server's processes: the root and its children (nginx's worker)."""
    pids = [root]
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == root:
                pids.append(int(p))
        except OSError:
            pass
    return pids


def cpu_secs(root):
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / tick


# ---- clients -----------------------------------------------------------------


def tcp_relay(port, mb):
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"%08d" % mb)
    got = 0
    buf = bytearray(1 << 20)
    while True:
        n = c.recv_into(buf)
        if n == 0:
            break
        got += n
    c.close()
    return got


def conn_rate(port, n):
    ok = 0
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port))
        if c.recv(1):
            ok += 1
        c.close()
    return ok


def udp_rate(port, n, window=32):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", port))
    s.settimeout(2)
    q = b"q" * 64
    sent = got = 0
    while sent < min(window, n):
        s.send(q)
        sent += 1
    while got < n:
        try:
            s.recv(2048)
        except socket.timeout:
            break
        got += 1
        if sent < n:
            s.send(q)
            sent += 1
    return got


def measure(pid, f, *args):
    c0, t0 = cpu_secs(pid), time.time()
    r = f(*args)
    t1, c1 = time.time(), cpu_secs(pid)
    return r, t1 - t0, max(c1 - c0, 1e-3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", default="target/release/tern")
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--conns", type=int, default=3000)
    ap.add_argument("--dgrams", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    ports = {k: free_port() for k in ("src", "byte", "ubk", "tcp", "conn", "udp")}
    procs = []
    for f, k in ((source_backend, "src"), (byte_backend, "byte"), (udp_backend, "ubk")):
        ev = mp.Event()
        p = mp.Process(target=f, args=(ports[k], ev), daemon=True)
        p.start()
        ev.wait(5)
        procs.append(p)
    best = {}
    for _ in range(a.repeats):
        for kind, binary in (("nginx", a.nginx), ("tern", a.tern)):
            p, d = start(kind, binary, ports)
            try:
                r = best.setdefault(kind, {})
                got, wall, cpu = measure(p.pid, tcp_relay, ports["tcp"], a.mb)
                mb = got / (1 << 20)
                keep(r, "tcp MB/s", mb / wall)
                keep(r, "tcp MB/cpu-s", mb / cpu)
                ok, wall, cpu = measure(p.pid, conn_rate, ports["conn"], a.conns)
                keep(r, "conn/s", ok / wall)
                keep(r, "conn/cpu-s", ok / cpu)
                ok, wall, cpu = measure(p.pid, udp_rate, ports["udp"], a.dgrams)
                keep(r, "udp dgram/s", ok / wall)
                keep(r, "udp dgram/cpu-s", ok / cpu)
            finally:
                p.terminate()
                p.wait()
                shutil.rmtree(d, ignore_errors=True)
    keys = list(best["nginx"].keys())
    print(f"{'':18} {'nginx':>12} {'tern':>12} {'tern/nginx':>11}")
    for k in keys:
        n, t = best["nginx"][k], best["tern"][k]
        print(f"{k:18} {n:12.1f} {t:12.1f} {t / n:10.2f}x")
    for p in procs:
        p.terminate()


def keep(r, k, v):
    r[k] = max(r.get(k, 0.0), v)


if __name__ == "__main__":
    sys.exit(main())
