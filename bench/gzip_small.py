#!/usr/bin/env python3
"""`small` with gzip: the shared harness's keep-alive scenario, but the
served files are compressible text, the clients send `Accept-Encoding:
gzip`, and both servers get the same gzip directives. Everything else is
../shared/bench/bench.py unchanged (same config for both servers, pinning,
repeats, ratio rows).

    python3 bench/gzip_small.py [--gzip 'DIRECTIVES'] [--text rows|html] small --against target/release/tern \
        --workdir /var/tmp/tern-gzip-bench [bench.py options]

Use its own --workdir: the harness reuses files of the right size, and the
default workdir holds random (incompressible) ones.

`--text rows` (the default) fills the files with one 120-byte HTML row
repeated: an extreme case (zlib's level 1 finds 258-byte matches all the
way and compresses 16 KiB to 262 bytes). `--text html` writes a
deterministic page of varied markup and English words that compresses
about like real HTML (2.4:1 at level 1 for 16 KiB; real pages give 3:1). Give each text its own --workdir.
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("TERN_SHARED_BENCH", os.path.join(HERE, "..", "..", "shared", "bench"))
DEFAULT_GZIP = "gzip on; gzip_types application/octet-stream; gzip_min_length 0; gzip_comp_level 1;"
TEXT = (b"<tr><td class=\"name\">tern benchmark row</td><td>12345</td>"
        b"<td>the quick brown fox jumps over the lazy dog</td></tr>\n")


WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so what no "
    "out up said about other into than its time only could new them man some these then two first "
    "may any like now my such make over our even most made after also did many before must through "
    "years where much your way well down should because each just those people how too little state "
    "good very world still own see men work long here get both between life being under never day "
    "same another know while last might great old year off come since against go came right used "
    "take three states himself few house use during without again place around however home small "
    "found thought went say part once general high upon school every does got united left number "
    "course war until always away something fact though water less public put think almost hand "
    "enough far took head yet government system better set told nothing night end why called "
    "request server config module buffer header client response cache upstream worker thread "
    "connection timeout location proxy static file directory index error status length").split()


def html_text(size):
    """A deterministic page of varied markup: a linear congruential
    generator picks words, numbers and tags, so the result does not repeat
    and compresses about as well as real HTML does."""
    seed = 12345
    parts = ["<!DOCTYPE html>\n<html><head><title>tern benchmark page</title></head>\n<body>\n"]
    n = len(parts[0])

    def rnd(m):
        nonlocal seed
        seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
        return (seed >> 8) % m

    while n < size:
        kind = rnd(4)
        words = " ".join(WORDS[rnd(len(WORDS))] for _ in range(6 + rnd(30)))
        if kind == 0:
            s = "<p>%s.</p>\n" % words.capitalize()
        elif kind == 1:
            s = '<li><a href="/docs/%s/%d.html">%s</a> (%d)</li>\n' % (
                WORDS[rnd(len(WORDS))], rnd(100000), words[:40], rnd(1000))
        elif kind == 2:
            s = '<tr><td class="c%d">%s</td><td>%d.%02d</td></tr>\n' % (
                rnd(10), words[:60], rnd(10000), rnd(100))
        else:
            s = "<h%d id=\"s%d\">%s</h%d>\n" % (2 + rnd(3), rnd(100000), words[:50].title(), 2 + rnd(3))
        parts.append(s)
        n += len(s)
    return "".join(parts).encode()[:size]


def main():
    argv = sys.argv[1:]
    gz = DEFAULT_GZIP
    text = "rows"
    while argv[:1] in (["--gzip"], ["--text"]):
        if argv[0] == "--gzip":
            gz = argv[1]
        else:
            text = argv[1]
        argv = argv[2:]
    spec = importlib.util.spec_from_file_location("bench", os.path.join(SHARED, "bench.py"))
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = bench
    spec.loader.exec_module(bench)

    def ensure_file(path, size, sync=False):
        if os.path.exists(path) and os.path.getsize(path) == size:
            return False
        if text == "html":
            data = html_text(size)
        else:
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
