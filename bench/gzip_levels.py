#!/usr/bin/env python3
"""Output sizes of the system zlib (the one nginx links) per level on a
corpus, to pick the libdeflate level for each `gzip_comp_level`.

    python3 bench/gzip_levels.py LISTFILE

LISTFILE names one file per line. Each file counts three times: its first
1 KiB, its first 16 KiB and the whole file (bench sizes). Prints, per part,
the total gzip size at zlib levels 1-9 (gzip framing, window 15, memLevel 8
as nginx). The libdeflate side is bench/gzip_levels_libdeflate.rs, a
main.rs for a scratch crate depending on `libdeflater = "1.26.1"`:

    mkdir -p /tmp/lvl/src && cp bench/gzip_levels_libdeflate.rs /tmp/lvl/src/main.rs
    printf '[package]\nname="lvl"\nversion="0.1.0"\nedition="2021"\n[dependencies]\nlibdeflater="1.26.1"\n' > /tmp/lvl/Cargo.toml
    (cd /tmp/lvl && cargo run --release -- LISTFILE)

It prints the same parts for libdeflate levels 1-12 (raw deflate + 18
bytes of gzip framing), and milliseconds per level (noisy).
"""
import sys
import zlib

PARTS = (("1k", 1024), ("16k", 16384), ("whole", None))


def main():
    names = [l.strip() for l in open(sys.argv[1]) if l.strip()]
    datas = [open(n, "rb").read() for n in names]
    print("zlib", zlib.ZLIB_RUNTIME_VERSION)
    for part, n in PARTS:
        row = []
        for level in range(1, 10):
            total = 0
            for d in datas:
                d = d[:n] if n else d
                c = zlib.compressobj(level, zlib.DEFLATED, 31, 8)
                total += len(c.compress(d) + c.flush())
            row.append(total)
        print(part, sum(len(d[:n] if n else d) for d in datas), " ".join(map(str, row)))


if __name__ == "__main__":
    main()
