#!/usr/bin/env python3
"""User-space instructions per proxied TCP connection of tern's stream module,
counted by callgrind (exact on a loaded machine):

    python3 bench/stream_callgrind.py BINARY [CONNS] [TAG]
    callgrind_annotate /tmp/s5cg/cg.TAG.PID.1   # total / CONNS = Ir per connection

One worker (`master_process off`) proxies to a one-byte backend (the conn
row of bench/stream.py); 200 connections warm up, then instrumentation is
on for CONNS connections (connect, read the byte, close).
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
os.makedirs("/tmp/s5cg/logs", exist_ok=True)
def free():
    s=socket.socket(); s.bind(("127.0.0.1",0)); p=s.getsockname()[1]; s.close(); return p
bp, cp = free(), free()
l=socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR,1); l.bind(("127.0.0.1",bp)); l.listen(1024)
def backend():
    while True:
        c,_=l.accept()
        try: c.sendall(b"!")
        except OSError: pass
        c.close()
threading.Thread(target=backend,daemon=True).start()
open("/tmp/s5cg/nginx.conf","w").write(f"""worker_processes 1; master_process off; daemon off;
error_log /tmp/s5cg/logs/error.log crit; pid /tmp/s5cg/logs/pid;
events {{ worker_connections 4096; }}
stream {{ server {{ listen 127.0.0.1:{cp}; proxy_pass 127.0.0.1:{bp}; }} }}
""")
p=subprocess.Popen(["valgrind","--tool=callgrind",f"--callgrind-out-file=/tmp/s5cg/cg.{tag}.%p","--instr-atstart=no","--dump-instr=no",BIN,"-p","/tmp/s5cg","-c","/tmp/s5cg/nginx.conf"],stderr=subprocess.DEVNULL)
for _ in range(600):
    try: socket.create_connection(("127.0.0.1",cp)).close(); break
    except OSError: time.sleep(0.1)
def conns(n):
    for _ in range(n):
        c=socket.create_connection(("127.0.0.1",cp)); c.recv(1); c.close()
conns(200)
subprocess.run(["callgrind_control","-i","on",str(p.pid)],stdout=subprocess.DEVNULL)
conns(N)
subprocess.run(["callgrind_control","-i","off",str(p.pid)],stdout=subprocess.DEVNULL)
subprocess.run(["callgrind_control","-d",str(p.pid)],stdout=subprocess.DEVNULL)
time.sleep(1); p.terminate(); p.wait()
