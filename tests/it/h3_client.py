#!/usr/bin/env python3
"""A small HTTP/3 client on aioquic for the integration tests (tests/it/h3.rs).

usage: h3_client.py HOST PORT OUTDIR PATH [PATH...] [--method M] [--data FILE]
       [--header 'name: value']... [--sni NAME] [--early] [--pause S] [--hold S]
       [--cipher SUITE] [--authority A]

Requests every PATH on one QUIC connection (certificates are not verified:
the tests use self-signed ones). For the i-th path it writes OUTDIR/i.head
(`:status` and the fields, one `name: value` a line) and OUTDIR/i.body.
Prints `ok N` when all answers came. Exit 2 when the connection failed.
With --early it connects twice: the second connection resumes the first's
session and sends its requests as 0-RTT. --pause S: after the first
request, writes OUTDIR/paused and waits S seconds before the others (a
test reloads meanwhile). --hold S: after the requests, prints `holding`
and waits up to S seconds for the server to close the connection, then
prints `closed CODE` (the CONNECTION_CLOSE's error code) or `open`.
--cipher SUITE: offer only that TLS suite (aioquic's name, e.g.
AES_256_GCM_SHA384). --authority A: the `:authority` sent (default: the
SNI name, else HOST). --stall S: right after the handshake, blocks (reads
and acknowledges nothing) for S seconds, and after the answers prints
`crypto OFF+LEN ...`: the CRYPTO frames the first connection got in 1-RTT
packets (the session tickets), one entry per frame as it came.
--reset-after S: the last PATH is sent as a head without the end of the
stream; S seconds later the stream is reset (H3_REQUEST_CANCELLED) and
`reset` printed.
"""

import argparse
import asyncio
import os
import ssl
import sys
import time

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, QuicEvent
from aioquic.quic.logger import QuicLogger
from aioquic.tls import CipherSuite


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting = {}
        self.terminated = None

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, ConnectionTerminated):
            self.terminated = event
        for ev in self.h3.handle_event(event):
            if isinstance(ev, (HeadersReceived, DataReceived)):
                slot = self.waiting.get(ev.stream_id)
                if slot is None:
                    continue
                if isinstance(ev, HeadersReceived):
                    slot["heads"].append(ev.headers)
                else:
                    slot["body"].extend(ev.data)
                if ev.stream_ended:
                    slot["done"].set_result(True)

    def head(self, method, authority, path, headers, end):
        sid = self._quic.get_next_available_stream_id()
        fields = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
        ] + headers
        self.h3.send_headers(sid, fields, end_stream=end)
        return sid

    async def request(self, method, authority, path, headers, body):
        sid = self.head(method, authority, path, headers, body is None)
        if body is not None:
            self.h3.send_data(sid, body, end_stream=True)
        fut = self._loop.create_future()
        slot = {"heads": [], "body": bytearray(), "done": fut}
        self.waiting[sid] = slot
        self.transmit()
        await asyncio.wait_for(fut, 30)
        return slot


async def run(a):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    cfg.verify_mode = ssl.CERT_NONE
    cfg.server_name = a.sni
    if a.cipher:
        cfg.cipher_suites = [CipherSuite[a.cipher]]
    if a.stall:
        cfg.quic_logger = QuicLogger()
    tickets = []
    cfg.session_ticket = None
    headers = []
    for h in a.header:
        n, v = h.split(":", 1)
        headers.append((n.strip().lower().encode(), v.strip().encode()))
    body = open(a.data, "rb").read() if a.data else None
    authority = a.authority or a.sni or a.host
    rounds = 2 if a.early else 1
    for r in range(rounds):
        if r == 1:
            if not tickets:
                print("no session ticket", file=sys.stderr)
                return 2
            cfg.session_ticket = tickets[-1]
        async with connect(
            a.host,
            a.port,
            configuration=cfg,
            create_protocol=Client,
            session_ticket_handler=tickets.append,
            wait_connected=(r == 0),
        ) as c:
            if a.stall and r == 0:
                # Blocks the event loop: what the server sends meanwhile
                # waits in the socket, unacknowledged.
                time.sleep(a.stall)
            if a.early and r == 0:
                # Only a connection that got a ticket can try 0-RTT.
                slot = await c.request("GET", authority, a.paths[0], headers, None)
                await asyncio.sleep(0.2)
                continue
            n = 0
            for i, path in enumerate(a.paths):
                if a.reset_after and i == len(a.paths) - 1:
                    sid = c.head(a.method, authority, path, headers, False)
                    c.transmit()
                    await asyncio.sleep(a.reset_after)
                    c._quic.reset_stream(sid, 0x10C)
                    c.transmit()
                    await asyncio.sleep(0.2)
                    print("reset", flush=True)
                    break
                slot = await c.request(a.method, authority, path, headers, body)
                with open(os.path.join(a.out, "%d.head" % i), "wb") as f:
                    for heads in slot["heads"]:
                        for k, v in heads:
                            f.write(k + b": " + v + b"\n")
                with open(os.path.join(a.out, "%d.body" % i), "wb") as f:
                    f.write(slot["body"])
                n += 1
                if i == 0 and a.pause:
                    open(os.path.join(a.out, "paused"), "w").close()
                    await asyncio.sleep(a.pause)
            print("ok", n, flush=True)
            if a.stall:
                print("crypto", " ".join(crypto_1rtt(cfg.quic_logger)) or "-", flush=True)
            if a.hold:
                print("holding", flush=True)
                for _ in range(int(a.hold * 20)):
                    if c.terminated is not None:
                        break
                    await asyncio.sleep(0.05)
                if c.terminated is not None:
                    print("closed 0x%x" % c.terminated.error_code, flush=True)
                else:
                    print("open", flush=True)
    return 0


def crypto_1rtt(logger):
    """The first connection's CRYPTO frames in 1-RTT packets, as OFF+LEN."""
    got = []
    traces = logger.to_dict()["traces"]
    for e in traces[0]["events"] if traces else []:
        d = e["data"]
        if e["name"] != "transport:packet_received":
            continue
        if d.get("header", {}).get("packet_type") != "1RTT":
            continue
        for f in d.get("frames", []):
            if f.get("frame_type") == "crypto":
                got.append("%d+%d" % (f["offset"], f["length"]))
    return got


def main():
    p = argparse.ArgumentParser()
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("out")
    p.add_argument("paths", nargs="+")
    p.add_argument("--method", default="GET")
    p.add_argument("--data")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--sni")
    p.add_argument("--early", action="store_true")
    p.add_argument("--pause", type=float, default=0)
    p.add_argument("--hold", type=float, default=0)
    p.add_argument("--cipher")
    p.add_argument("--authority")
    p.add_argument("--stall", type=float, default=0)
    p.add_argument("--reset-after", type=float, default=0)
    a = p.parse_args()
    try:
        rc = asyncio.run(run(a))
    except Exception as e:  # the test reads the reason
        print("error", type(e).__name__, e, file=sys.stderr)
        rc = 2
    sys.exit(rc)


if __name__ == "__main__":
    main()
