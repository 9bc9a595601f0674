#!/usr/bin/env python3
"""`small` with gzip: the shared harness's keep-alive scenario, but the
served files are compressible text, the clients send `Accept-Encoding:
gzip`, and both servers get the same gzip directives. Everything else is
../shared/bench/bench.py unchanged (same config for both servers, pinning,
repeats, ratio rows).

    python3 bench/gzip_small.py [--gzip 'DIRECTIVES'] small --against target/release/tern \
        --workdir /var/tmp/tern-gzip-bench [bench.py options]

Use its own --workdir: the harness reuses files of the right size, and the
default workdir holds random (incompressible) ones.
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("TERN_SHARED_BENCH", os.path.join(HERE, "..", "..", "shared", "bench"))
DEFAULT_GZIP = "gzip on; gzip_types application/octet-stream; gzip_min_length 0; gzip_comp_level 1;"
TEXT = (b"<tr><td class=\"name\">tern benchmark row</td><td>12345</td>"
        b"<td>the quick brown fox jumps over the lazy dog</td></tr>\n")


def main():
    argv = sys.argv[1:]
    gz = DEFAULT_GZIP
    if argv[:1] == ["--gzip"]:
        gz, argv = argv[1], argv[2:]
    spec = importlib.util.spec_from_file_location("bench", os.path.join(SHARED, "bench.py"))
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = bench
    spec.loader.exec_module(bench)

    def ensure_file(path, size, sync=False):
        if os.path.exists(path) and os.path.getsize(path) == size:
            return False
        data = (TEXT * (size // len(TEXT) + 1))[:size]
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.chmod(path + ".tmp", 0o644)
        os.rename(path + ".tmp", path)
        return True

    orig_conf, orig_wrk = bench.make_conf, bench.start_wrk

    def make_conf(port, root, worker_connections=1024, http_extra=(), location_extra=()):
        extra = list(http_extra) + [d.strip() + ";" for d in gz.split(";") if d.strip()]
        return orig_conf(port, root, worker_connections, extra, location_extra)

    def start_wrk(opts, url, conns, duration, timeout_s, script_args=(), headers=()):
        return orig_wrk(opts, url, conns, duration, timeout_s, script_args,
                        list(headers) + ["Accept-Encoding: gzip"])

    bench.ensure_file, bench.make_conf, bench.start_wrk = ensure_file, make_conf, start_wrk
    sys.argv = [os.path.join(SHARED, "bench.py")] + argv
    bench.main()


if __name__ == "__main__":
    main()
