#!/usr/bin/env python3
"""Stream proxy benchmark: tern and nginx side by side on one stream config.

    python3 bench/stream.py [--tern target/release/tern] [--nginx /usr/sbin/nginx]
                            [--mb 200] [--conns 3000] [--dgrams 20000] [--repeats 3]
                            [--cpu 1] [--client-cpu 0]

Each server runs one worker (`worker_processes 1`) on the same stream {}
block, pinned to one CPU (--cpu, with taskset); backends and clients are
separate Python processes pinned to another (--client-cpu). On a shared,
loaded machine wall-clock rates are noise, so each figure is the server's
CPU time per unit of work: the on-CPU nanoseconds of every thread of every
server process (/proc/PID/task/*/schedstat, nanosecond resolution), read
before and after the run. The three rows of issue 19:

- tcp relay: one connection, the backend sends --mb MB, the client reads it
  all through the proxy: MB per server CPU-second (higher is better);
- tcp conn: --conns connections one after another (connect, read the
  backend's one byte, close): server CPU microseconds per connection;
- udp: --dgrams DNS-like datagrams (64 bytes, one answer each, 32 in
  flight) through one listener (`proxy_responses 1`): server CPU
  microseconds per datagram.

The servers alternate per repeat (nginx, tern, nginx, tern...), so load on
the machine hits both alike; the best (least CPU per unit) of the repeats
is kept, as background load only ever adds cost, and the median is shown
beside it. "tern vs nginx" is how many times less CPU tern spends per unit
(nginx cost / tern cost; for relay, tern MB/cpu-s / nginx MB/cpu-s): above
1 is tern ahead. Wall rates are printed for reference only.
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
# taskset prefix for the servers (set from --cpu in main).
PIN = []


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
        PIN
        + [binary, "-p", d + "/", "-c", f"{d}/nginx.conf", "-e", f"{d}/logs/error.log"]
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
    """On-CPU seconds of every thread of the server's processes."""
    total = 0
    for pid in tree_pids(root):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total / 1e9


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
    return r, t1 - t0, max(c1 - c0, 1e-6)


def main():
    global PIN
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", default="target/release/tern")
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--conns", type=int, default=3000)
    ap.add_argument("--dgrams", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu", default="1", help="CPU list for the servers ('' = none)")
    ap.add_argument("--client-cpu", default="0", help="CPU list for clients ('' = none)")
    a = ap.parse_args()
    if a.cpu:
        PIN = ["taskset", "-c", a.cpu]
    if a.client_cpu:
        os.sched_setaffinity(0, {int(c) for c in a.client_cpu.split(",")})
    ports = {k: free_port() for k in ("src", "byte", "ubk", "tcp", "conn", "udp")}
    procs = []
    for f, k in ((source_backend, "src"), (byte_backend, "byte"), (udp_backend, "ubk")):
        ev = mp.Event()
        p = mp.Process(target=f, args=(ports[k], ev), daemon=True)
        p.start()
        ev.wait(5)
        procs.append(p)
    runs = {"nginx": {}, "tern": {}}
    for _ in range(a.repeats):
        for kind, binary in (("nginx", a.nginx), ("tern", a.tern)):
            p, d = start(kind, binary, ports)
            try:
                r = runs[kind]
                got, wall, cpu = measure(p.pid, tcp_relay, ports["tcp"], a.mb)
                mb = got / (1 << 20)
                r.setdefault("tcp relay MB/cpu-s", []).append(mb / cpu)
                r.setdefault("(tcp relay MB/s)", []).append(mb / wall)
                ok, wall, cpu = measure(p.pid, conn_rate, ports["conn"], a.conns)
                r.setdefault("tcp conn cpu-us/conn", []).append(cpu * 1e6 / max(ok, 1))
                r.setdefault("(tcp conn/s)", []).append(ok / wall)
                ok, wall, cpu = measure(p.pid, udp_rate, ports["udp"], a.dgrams)
                r.setdefault("udp cpu-us/dgram", []).append(cpu * 1e6 / max(ok, 1))
                r.setdefault("(udp dgram/s)", []).append(ok / wall)
            finally:
                p.terminate()
                p.wait()
                shutil.rmtree(d, ignore_errors=True)
    print(
        f"{'':22} {'nginx best':>11} {'tern best':>11} {'tern vs nginx':>14}"
        f"   {'nginx median':>12} {'tern median':>12}"
    )
    for k in runs["nginx"]:
        higher_better = "cpu-us" not in k
        pick = max if higher_better else min
        n, t = pick(runs["nginx"][k]), pick(runs["tern"][k])
        ratio = t / n if higher_better else n / t
        nm, tm = median(runs["nginx"][k]), median(runs["tern"][k])
        print(f"{k:22} {n:11.2f} {t:11.2f} {ratio:13.2f}x   {nm:12.2f} {tm:12.2f}")
    for p in procs:
        p.terminate()


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


if __name__ == "__main__":
    sys.exit(main())
