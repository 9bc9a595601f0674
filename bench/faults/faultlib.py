"""What the fault scripts share: free ports, a quiet threaded origin
server, a raw HTTP/1.1 GET, and a summary of an error log by kind."""

import http.server
import socket


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # The proxy killed or gone mid-transfer: a broken pipe is expected.
        pass


def fetch(port, path, timeout=20):
    """GET with `Connection: close`: (status, body, complete, headers),
    complete when the body has its Content-Length; None when no whole
    head came."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = s.recv(1 << 16)
            if not b:
                break
            data += b
        s.close()
    except OSError:
        return None
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.split(b"\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return None
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower().decode(errors="replace")] = v.strip().decode(errors="replace")
    length = headers.get("content-length")
    complete = length is not None and length.isdigit() and len(body) == int(length)
    return status, body, complete, headers


def log_kinds(path, top=12):
    """The error log's lines counted by level and message (up to the first
    comma, without the connection number): [(count, kind)], most first."""
    kinds = {}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                parts = line.split(" ", 4)
                if len(parts) == 5:
                    msg = parts[4].split(",")[0]
                    if msg.startswith("*"):
                        msg = msg.split(" ", 1)[-1]
                    k = parts[2] + " " + msg[:90].strip()
                    kinds[k] = kinds.get(k, 0) + 1
    except OSError:
        pass
    return sorted(((v, k) for k, v in kinds.items()), reverse=True)[:top]
