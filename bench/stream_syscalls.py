#!/usr/bin/env python3
"""Syscalls per proxied TCP session, tern or nginx (strace -c of the worker).

    python3 bench/stream_syscalls.py tern target/release/tern 1000
    python3 bench/stream_syscalls.py nginx /usr/sbin/nginx 1000

The conn row of bench/stream.py (connect, read the backend's one byte,
close) on the same stream {} block: 200 connections of warm-up, then
strace -c -f attached to the worker (every thread) for N connections.
Divide the calls by N. strace slows the server; only the counts mean
something.
"""
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stream as B  # noqa: E402


def main(kind, binary, n):
    ports = {k: B.free_port() for k in ["tcp", "src", "conn", "byte", "udp", "ubk"]}
    ready = mp.Event()
    mp.Process(target=B.byte_backend, args=(ports["byte"], ready), daemon=True).start()
    ready.wait()
    root, _dir = B.start(kind, binary, ports)
    time.sleep(0.5)
    pids = B.tree_pids(root.pid)
    B.conn_rate(ports["conn"], 200)
    # nginx: its worker process; tern (worker_processes 1): the process.
    worker = [p for p in pids if p != root.pid] or [root.pid]
    out = os.path.join(tempfile.gettempdir(), f"stream-syscalls-{kind}.txt")
    attach = sum([["-p", str(w)] for w in worker], [])
    st = subprocess.Popen(["strace", "-c", "-f", "-o", out] + attach, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    B.conn_rate(ports["conn"], n)
    time.sleep(0.3)
    st.send_signal(2)
    st.wait()
    print(kind, "processes", pids, "traced", worker, "connections", n)
    print(open(out).read())
    root.kill()
    root.wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
