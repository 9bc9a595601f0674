#!/usr/bin/env python3
"""Runs ../shared/bench/bench.py with extra nginx.conf directives, for the
variants the shared harness does not have (the generated config stays
byte-identical for both servers).

    python3 bench/variants.py [--loc 'DIRECTIVE;']... [--http 'DIRECTIVE;']...
                              [--against-loc 'DIRECTIVE;']...
                              [--threads-as 'DIRECTIVE;'] SCENARIO [bench.py options]

--loc / --http   added to `location /` / `http` of every generated config
                 (e.g. `small` with `--loc 'aio threads;'`);
--against-loc    added to `location /` of the `--against` server's config
                 only: with the same binary as --server and --against, one
                 interleaved run compares two settings of one server and
                 its "ratio" row is against/server. E.g. `--server T
                 --against T --against-loc 'aio threads;'` is `aio
                 threads` over `aio off` (the default: a second `aio` in
                 the same location would be a duplicate-directive error);
--threads-as     replaces `aio threads;` of blocking-mix's `threads` variant
                 (e.g. `--threads-as 'aio on;'` for io_uring).

These options may come before or after SCENARIO; everything else is passed
to bench.py unchanged. See BENCHMARKS.md and bench/RESULTS-io.md for the
exact commands used.
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("TERN_SHARED_BENCH",
                        os.path.join(HERE, "..", "..", "shared", "bench"))


def main():
    argv = sys.argv[1:]
    loc, http, against_loc, threads_as = [], [], [], None
    # Ours may come anywhere (before or after SCENARIO); the rest is bench.py's.
    rest = []
    while argv:
        flag = argv[0]
        if flag in ("--loc", "--http", "--against-loc", "--threads-as") and len(argv) > 1:
            val, argv = argv[1], argv[2:]
            if flag == "--loc":
                loc.append(val)
            elif flag == "--http":
                http.append(val)
            elif flag == "--against-loc":
                against_loc.append(val)
            else:
                threads_as = val
        else:
            rest.append(flag)
            argv = argv[1:]
    argv = rest
    spec = importlib.util.spec_from_file_location("bench", os.path.join(SHARED, "bench.py"))
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = bench
    spec.loader.exec_module(bench)
    orig = bench.make_conf

    def make_conf(port, root, worker_connections=1024, http_extra=(), location_extra=()):
        le = list(location_extra)
        if threads_as is not None:
            le = [threads_as if l == "aio threads;" else l for l in le]
        return orig(port, root, worker_connections, list(http_extra) + http,
                    le + loc)

    bench.make_conf = make_conf

    if against_loc:
        if "--against" not in argv:
            sys.exit("--against-loc needs --against")
        orig_init, orig_start = bench.Server.__init__, bench.Server.start
        extra = "".join(" " * 12 + d + "\n" for d in against_loc)
        marker = "        location / {\n"

        built = []

        def init(self, label, binary, *a, **kw):
            orig_init(self, label, binary, *a, **kw)
            # bench.main builds the --server, then the --against Server.
            built.append(self)
            self.extra_loc = len(built) == 2
            if self.extra_loc:
                self.label += "+" + "+".join(d.strip().rstrip(";").replace(" ", "_")
                                             for d in against_loc)

        def start(self, conf_text, *a, **kw):
            if self.extra_loc:
                if marker not in conf_text:
                    raise SystemExit("--against-loc: no `location /` in the generated config")
                conf_text = conf_text.replace(marker, marker + extra, 1)
            return orig_start(self, conf_text, *a, **kw)

        bench.Server.__init__, bench.Server.start = init, start
    sys.argv = [os.path.join(SHARED, "bench.py")] + argv
    bench.main()


if __name__ == "__main__":
    main()
