#!/usr/bin/env python3
"""TLS handshakes, tern beside nginx on one nginx.conf.

    python3 bench/tls.py --tern target/release/tern [--nginx /usr/sbin/nginx]
        [--certs ec,rsa] [--modes full,resume] [--seconds 8] [--procs 8]
        [--repeats 3] [--port 18196]

For each certificate (ECDSA P-256, RSA 2048), mode and repeat (server
order alternating per repeat): a fresh prefix, `worker_processes 1`, the
server pinned to CPU 1 (`taskset -c 1`, `-g 'daemon off; master_process
on;'` as ../shared/bench/run.sh does), then `taskset -c 0 tls_hs` (bench/
tls_hs.c, OpenSSL 3 client, PROCS processes): connect, TLS 1.3 handshake,
`GET /1k.bin` with `Connection: close`, read to the close, again, for
SECONDS. `resume` offers the ticket of the previous connection, so the
handshakes are resumptions (psk_dhe_ke); `full` offers none.

Server CPU per handshake: `perf stat -e task-clock` over the server's
processes during the run (ns resolution; hardware counters are not
available in this VM), and utime+stime from /proc as a cross-check,
divided by the handshakes done. The config is nginx's defaults for TLS but
`ssl_protocols TLSv1.3` (no ciphers/session directives: X25519, tickets
on, `ssl_session_cache none`), `access_log off`. Prints one table with
medians and spreads ((max-min)/median) and the tern/nginx ratios.
"""
import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CLK = os.sysconf("SC_CLK_TCK")
HERE = os.path.dirname(os.path.abspath(__file__))

CONF = """worker_processes 1;
error_log logs/error.log notice;
pid logs/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate cert.pem;
        ssl_certificate_key key.pem;
        # nginx 1.22's default is TLSv1 TLSv1.1 TLSv1.2.
        ssl_protocols TLSv1.3;
        root html;
    }}
}}
"""

KEYGEN = {
    "ec": ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
    "rsa": ["-newkey", "rsa:2048"],
}


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


class Server:
    def __init__(self, label, binary, port, cert):
        self.label, self.binary, self.port = label, binary, port
        self.dir = tempfile.mkdtemp(prefix="tlsbench-", dir="/var/tmp")
        os.chmod(self.dir, 0o755)
        os.makedirs(self.dir + "/logs")
        os.makedirs(self.dir + "/html")
        with open(self.dir + "/html/1k.bin", "wb") as f:
            f.write(b"x" * 1024)
        subprocess.run(
            ["openssl", "req", "-x509"] + KEYGEN[cert] +
            ["-nodes", "-keyout", self.dir + "/key.pem", "-out", self.dir + "/cert.pem",
             "-days", "2", "-subj", "/CN=localhost"], check=True, capture_output=True)
        with open(self.dir + "/nginx.conf", "w") as f:
            f.write(CONF.format(port=port))
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


def run_one(client, srv, mode, seconds, procs):
    pids = srv.pids()
    # Warm-up: one second, not counted.
    subprocess.run(["taskset", "-c", "0", client, "127.0.0.1", str(srv.port), "1",
                    str(procs), mode, "/1k.bin"], capture_output=True)
    t0 = cpu_ticks(pids)
    perf = subprocess.Popen(
        ["perf", "stat", "-x", ",", "-e", "task-clock", "-p", ",".join(map(str, pids))],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # perf needs a moment to attach (a run it missed reads 0 and is left
    # out of the medians).
    time.sleep(0.5)
    r = subprocess.run(["taskset", "-c", "0", client, "127.0.0.1", str(srv.port),
                        str(seconds), str(procs), mode, "/1k.bin"],
                       capture_output=True, text=True)
    perf.send_signal(signal.SIGINT)
    _, err = perf.communicate()
    t1 = cpu_ticks(pids)
    m = re.search(r"handshakes (\d+) resumed (\d+) failures (\d+) tickets_per_conn ([\d.]+)",
                  r.stdout)
    hs, resumed, fails, tickets = (int(m.group(1)), int(m.group(2)), int(m.group(3)),
                                   float(m.group(4))) if m else (0, 0, 0, 0.0)
    task_ms = 0.0
    for line in err.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2] == "task-clock":
            task_ms = float(parts[0])
    return {
        "rate": hs / seconds,
        "us_perf": task_ms * 1000.0 / hs if hs else 0.0,
        "us_proc": (t1 - t0) / CLK * 1e6 / hs if hs else 0.0,
        "resumed": resumed / hs if hs else 0.0,
        "fails": fails,
        "tickets": tickets,
    }


def other_load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--nginx", default="/usr/sbin/nginx")
    ap.add_argument("--certs", default="ec,rsa")
    ap.add_argument("--modes", default="full,resume")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=18196)
    a = ap.parse_args()
    client = "/tmp/tls_hs"
    subprocess.run(["cc", "-O2", "-o", client, os.path.join(HERE, "tls_hs.c"), "-lssl",
                    "-lcrypto"], check=True)
    servers = [("nginx", a.nginx), ("tern", a.tern)]
    rows = []
    for cert in a.certs.split(","):
        for mode in a.modes.split(","):
            res = {"nginx": [], "tern": []}
            for rep in range(a.repeats):
                order = servers if rep % 2 == 0 else servers[::-1]
                for label, binary in order:
                    srv = Server(label, binary, a.port, cert)
                    try:
                        r = run_one(client, srv, mode, a.seconds, a.procs)
                    finally:
                        srv.stop()
                    r["load"] = other_load()
                    res[label].append(r)
                    print("%s %s %s rep %d: %.0f hs/s, %.1f µs/hs (perf), %.1f (proc), "
                          "resumed %.2f, tickets/conn %.2f, failures %d, loadavg %s" % (
                              cert, mode, label, rep + 1, r["rate"], r["us_perf"],
                              r["us_proc"], r["resumed"], r["tickets"], r["fails"],
                              r["load"]), file=sys.stderr)
            rows.append((cert, mode, res))
    print("| cert | mode | server | hs/s | spread | µs/hs (perf) | spread | µs/hs (/proc) "
          "| resumed | tickets/conn |")
    print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|")

    def med(rs, k):
        v = [r[k] for r in rs if r[k] > 0] or [0.0]
        return statistics.median(v)

    def spread(rs, k):
        v = [r[k] for r in rs if r[k] > 0] or [0.0]
        m = statistics.median(v)
        return (max(v) - min(v)) / m * 100 if m else 0.0

    for cert, mode, res in rows:
        for label in ("nginx", "tern"):
            rs = res[label]
            print("| %s | %s | %s | %.0f | %.1f %% | %.1f | %.1f %% | %.1f | %.2f | %.2f |" % (
                cert, mode, label, med(rs, "rate"), spread(rs, "rate"), med(rs, "us_perf"),
                spread(rs, "us_perf"), med(rs, "us_proc"), med(rs, "resumed"),
                med(rs, "tickets")))
        n, t = res["nginx"], res["tern"]
        print("| %s | %s | **tern/nginx** | **%.2fx** | | **%.2fx** | | %.2fx | | |" % (
            cert, mode, med(t, "rate") / med(n, "rate"),
            med(t, "us_perf") / med(n, "us_perf"),
            med(t, "us_proc") / med(n, "us_proc") if med(n, "us_proc") else 0.0))


if __name__ == "__main__":
    main()
