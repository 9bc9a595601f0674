#!/usr/bin/env python3
"""User-space instructions per unit of stream work, tern or nginx, counted
by callgrind (exact on a loaded machine):

    python3 bench/stream_callgrind.py BINARY [N] [TAG] [MODE]
    callgrind_annotate /tmp/s5cg/cg.TAG.PID.1 | head   # total / N = Ir per unit

BINARY is tern or nginx (a path ending in "nginx" gets `load_module` of
Debian's stream module). One worker (`master_process off`), the rows of
bench/stream.py:

- MODE conn (default): N proxied TCP connections to a one-byte backend
  (connect, read the byte, close); 200 warm up first;
- MODE udp: N DNS-like datagrams (64 bytes, one answer each, one in
  flight) through `listen ... udp` with `proxy_responses 1`; 200 first;
- MODE relay: one connection through which the backend sends N MiB.

Instrumentation is on only for the measured part (`--instr-atstart=no`,
`callgrind_control -i on/off`), so start-up and warm-up do not count.
"""
import os
import socket
import subprocess
import sys
import threading
import time

BIN = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
tag = sys.argv[3] if len(sys.argv) > 3 else "run"
mode = sys.argv[4] if len(sys.argv) > 4 else "conn"
nginx = os.path.basename(BIN).endswith("nginx")
os.makedirs("/tmp/s5cg/logs", exist_ok=True)


def free(kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


bp, cp = free(), free()
up, ubp = free(socket.SOCK_DGRAM), free(socket.SOCK_DGRAM)
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", bp))
l.listen(1024)


def backend():
    chunk = b"x" * (1 << 20)
    while True:
        c, _ = l.accept()
        try:
            if mode == "relay":
                for _ in range(N):
                    c.sendall(chunk)
            else:
                c.sendall(b"!")
        except OSError:
            pass
        c.close()


def udp_backend():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", ubp))
    while True:
        d, a = s.recvfrom(2048)
        s.sendto(d, a)


threading.Thread(target=backend, daemon=True).start()
threading.Thread(target=udp_backend, daemon=True).start()
conf = f"""worker_processes 1; master_process off; daemon off;
error_log /tmp/s5cg/logs/error.log crit; pid /tmp/s5cg/logs/pid;
events {{ worker_connections 4096; }}
stream {{
    server {{ listen 127.0.0.1:{cp}; proxy_pass 127.0.0.1:{bp}; }}
    server {{ listen 127.0.0.1:{up} udp; proxy_pass 127.0.0.1:{ubp};
             proxy_responses 1; proxy_timeout 10s; }}
}}
"""
if nginx:
    conf = "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n" + conf
open("/tmp/s5cg/nginx.conf", "w").write(conf)
p = subprocess.Popen(
    [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file=/tmp/s5cg/cg.{tag}.%p",
        "--instr-atstart=no",
        "--dump-instr=no",
        BIN,
        "-p",
        "/tmp/s5cg/",
        "-c",
        "/tmp/s5cg/nginx.conf",
    ],
    stderr=subprocess.DEVNULL,
)
for _ in range(600):
    try:
        socket.create_connection(("127.0.0.1", cp)).close()
        break
    except OSError:
        time.sleep(0.1)


def conns(n):
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", cp))
        c.recv(1)
        c.close()


def dgrams(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    q = b"q" * 64
    for _ in range(n):
        s.sendto(q, ("127.0.0.1", up))
        s.recv(2048)
    s.close()


def relay():
    c = socket.create_connection(("127.0.0.1", cp))
    buf = bytearray(1 << 20)
    while c.recv_into(buf):
        pass
    c.close()


work = {"conn": lambda: conns(N), "udp": lambda: dgrams(N), "relay": relay}[mode]
warm = {"conn": lambda: conns(200), "udp": lambda: dgrams(200), "relay": lambda: None}[mode]
warm()
subprocess.run(["callgrind_control", "-i", "on", str(p.pid)], stdout=subprocess.DEVNULL)
work()
subprocess.run(["callgrind_control", "-i", "off", str(p.pid)], stdout=subprocess.DEVNULL)
subprocess.run(["callgrind_control", "-d", str(p.pid)], stdout=subprocess.DEVNULL)
time.sleep(1)
p.terminate()
p.wait()
