#!/usr/bin/env python3
"""HTTP/3 against HTTP/2 on a lossy link: time to last byte of a page
with 30 assets (issue 23's judgement). Needs root (network namespaces),
iproute2's `tc` with netem, nghttp (nghttp2-client) and python3-aioquic;
CI cannot create namespaces, so it is run by hand:

    sudo python3 bench/lossy.py --tern target/release/tern
        [--loss 2] [--delay 20] [--assets 30] [--size 20k] [--runs 20]

Two namespaces joined by a veth pair, `tc qdisc ... netem loss L% delay
D ms` on both ends (so the round trip is 2*D and each direction drops
L%); on a kernel without netem, an nftables rule drops L% of each
side's packets at random (`numgen random mod 100 < L drop`), with no
added delay (the output says which). tern runs in one (`worker_processes 1`, `listen ... ssl http2` and
`listen ... quic reuseport` on one port); the client in the other fetches
/index.html and then the assets, all on one connection, the assets in
parallel: HTTP/2 with `nghttp -n` (every URI on one connection), HTTP/3
with aioquic (one connection, every request in flight at once). Time to
last byte = the client's wall-clock time from its start (connection set
up included: TCP+TLS for h2, QUIC's one round trip for h3) to the last
byte of the last asset. Runs alternate h2/h3; prints each and the medians.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

NS_S, NS_C = "ternlossy-s", "ternlossy-c"
METHOD = ["tc netem"]
IP_S, IP_C = "10.213.0.1", "10.213.0.2"

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
        listen {ip}:8443 ssl http2;
        listen {ip}:8443 quic reuseport;
        ssl_certificate cert.pem;
        ssl_certificate_key key.pem;
        root html;
    }}
}}
"""

H3_CLIENT = r'''
import asyncio, ssl, sys, time
from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration

class C(QuicConnectionProtocol):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.h3 = H3Connection(self._quic)
        self.w = {}
    def quic_event_received(self, ev):
        for e in self.h3.handle_event(ev):
            if isinstance(e, (HeadersReceived, DataReceived)) and e.stream_id in self.w:
                s = self.w[e.stream_id]
                if isinstance(e, DataReceived):
                    s[0] += len(e.data)
                if e.stream_ended:
                    s[1].set_result(s[0])
    async def get(self, host, path):
        sid = self._quic.get_next_available_stream_id()
        self.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
            (b":authority", host.encode()), (b":path", path.encode())], end_stream=True)
        f = self._loop.create_future()
        self.w[sid] = [0, f]
        self.transmit()
        return await f

async def main(host, port, n):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    cfg.verify_mode = ssl.CERT_NONE
    t0 = time.monotonic()
    async with connect(host, port, configuration=cfg, create_protocol=C) as c:
        got = await c.get(host, "/index.html")
        sizes = await asyncio.gather(*(c.get(host, "/a%d.bin" % i) for i in range(n)))
        t1 = time.monotonic()
    print("%.4f %d" % (t1 - t0, got + sum(sizes)))

asyncio.run(asyncio.wait_for(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])), 120))
'''


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def netns_up(loss, delay):
    netns_down()
    sh("ip", "netns", "add", NS_S)
    sh("ip", "netns", "add", NS_C)
    sh("ip", "link", "add", "tlossy0", "type", "veth", "peer", "name", "tlossy1")
    sh("ip", "link", "set", "tlossy0", "netns", NS_S)
    sh("ip", "link", "set", "tlossy1", "netns", NS_C)
    for ns, dev, ip in ((NS_S, "tlossy0", IP_S), (NS_C, "tlossy1", IP_C)):
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", ip + "/24", "dev", dev)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        r = sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "netem",
               "loss", "%s%%" % loss, "delay", "%sms" % delay, check=False)
        if r.returncode != 0:
            # A kernel without netem (CONFIG_NET_SCH_NETEM unset, as this
            # VM's): the same random loss from nftables, without delay.
            METHOD[0] = "nftables numgen (no netem in this kernel): loss only, no added delay"
            for cmd in ("add table inet lossy",
                        "add chain inet lossy out { type filter hook output priority 0 ; }",
                        "add rule inet lossy out oifname %s numgen random mod 100 < %d drop"
                        % (dev, int(float(loss)))):
                sh("ip", "netns", "exec", ns, "nft", cmd)


def netns_down():
    for ns in (NS_S, NS_C):
        sh("ip", "netns", "del", ns, check=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", required=True)
    ap.add_argument("--loss", default="2")
    ap.add_argument("--delay", default="20")
    ap.add_argument("--assets", type=int, default=30)
    ap.add_argument("--size", default="20k")
    ap.add_argument("--runs", type=int, default=20)
    o = ap.parse_args()
    size = int(o.size.rstrip("kK")) * 1024 if o.size[-1] in "kK" else int(o.size)
    d = tempfile.mkdtemp(prefix="lossy-", dir="/var/tmp")
    os.chmod(d, 0o755)
    os.makedirs(d + "/logs")
    os.makedirs(d + "/html")
    with open(d + "/html/index.html", "w") as f:
        f.write("<html>" + "".join('<img src="/a%d.bin">' % i for i in range(o.assets)) + "</html>\n")
    for i in range(o.assets):
        with open("%s/html/a%d.bin" % (d, i), "wb") as f:
            f.write(os.urandom(size))
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", d + "/key.pem",
         "-out", d + "/cert.pem", "-days", "2", "-subj", "/CN=localhost"],
        check=True, capture_output=True)
    with open(d + "/nginx.conf", "w") as f:
        f.write(CONF.format(ip=IP_S))
    with open(d + "/h3c.py", "w") as f:
        f.write(H3_CLIENT)
    expect = os.path.getsize(d + "/html/index.html") + o.assets * size
    netns_up(o.loss, o.delay)
    srv = subprocess.Popen(
        ["ip", "netns", "exec", NS_S, o.tern, "-p", d + "/", "-c", d + "/nginx.conf",
         "-g", "daemon off; master_process on;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    res = {"h2": [], "h3": []}
    try:
        time.sleep(1.5)
        uris = ["https://%s:8443/index.html" % IP_S] + [
            "https://%s:8443/a%d.bin" % (IP_S, i) for i in range(o.assets)]
        for r in range(o.runs):
            for proto in (("h2", "h3") if r % 2 == 0 else ("h3", "h2")):
                if proto == "h2":
                    t0 = time.monotonic()
                    p = subprocess.run(["ip", "netns", "exec", NS_C, "nghttp", "-n", "-s"] + uris,
                                       capture_output=True, text=True, timeout=120)
                    t = time.monotonic() - t0
                    ok = p.returncode == 0
                    got = None
                else:
                    p = subprocess.run(["ip", "netns", "exec", NS_C, sys.executable, d + "/h3c.py",
                                        IP_S, "8443", str(o.assets)],
                                       capture_output=True, text=True, timeout=130)
                    ok = p.returncode == 0
                    t, got = (float(p.stdout.split()[0]), int(p.stdout.split()[1])) if ok else (0, 0)
                    ok = ok and got == expect
                if not ok:
                    print("run %d %s failed: %s %s" % (r + 1, proto, p.stdout[-300:], p.stderr[-300:]),
                          flush=True)
                    continue
                res[proto].append(t)
                print("run %d %s: %.3f s" % (r + 1, proto, t), flush=True)
    finally:
        srv.terminate()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
        netns_down()
        shutil.rmtree(d, ignore_errors=True)
    print()
    print("loss %s%% each way, delay %s ms each way, %d assets of %d bytes, %d runs; %s" % (
        o.loss, o.delay if METHOD[0] == "tc netem" else "0", o.assets, size, o.runs, METHOD[0]))
    print("| protocol | runs ok | median s | min s | max s |")
    print("|---|---|---|---|---|")
    for proto in ("h2", "h3"):
        v = res[proto]
        if v:
            print("| %s | %d | %.3f | %.3f | %.3f |" % (proto, len(v), statistics.median(v), min(v), max(v)))
    if res["h2"] and res["h3"]:
        print("h3/h2 median time to last byte: %.2fx" % (statistics.median(res["h3"]) / statistics.median(res["h2"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
