#!/bin/bash
# A/B of server binaries by process CPU per request (utime+stime from
# /proc/PID/stat of the serving process: tern's single process, or nginx's
# worker), alternating binaries over ROUNDS rounds of a SECS-second
# `wrk -t1 -c64` run. Finer than shared/bench's core-busy figure for small
# differences, but not a replacement for it.
#
#   bench/proc_cpu_ab.sh ROUNDS SECS "HEADER or empty" BIN...
#   env: PREFIX (a dir with nginx.conf and logs/, default /tmp/cb),
#        URL (default http://127.0.0.1:18090/f1k.bin)
# The nginx.conf must listen on URL's port, with `pid logs/nginx.pid;`.
set -u
R=$1; D=$2; WA=$3; shift 3
PREFIX=${PREFIX:-/tmp/cb}
URL=${URL:-http://127.0.0.1:18090/f1k.bin}
for r in $(seq "$R"); do
  for b in "$@"; do
    taskset -c 1 "$b" -p "$PREFIX/" -c "$PREFIX/nginx.conf" -g 'daemon off; master_process on;' 2>/dev/null &
    sleep 0.7
    mp=$(cat "$PREFIX/logs/nginx.pid")
    pid=$mp
    c=$(pgrep -P "$mp" | head -1); [ -n "$c" ] && pid=$c
    a=$(awk '{print $14+$16, $15+$17}' "/proc/$pid/stat")
    out=$(taskset -c 0 wrk -t1 -c64 -d"${D}s" ${WA:+-H "$WA"} "$URL")
    bb=$(awk '{print $14+$16, $15+$17}' "/proc/$pid/stat")
    kill "$mp"; wait $! 2>/dev/null; sleep 0.5
    n=$(echo "$out" | grep "requests in" | awk '{print $1}')
    python3 -c "
a='$a'.split(); b='$bb'.split(); n=$n
u=(int(b[0])-int(a[0]))*1e4/n; s=(int(b[1])-int(a[1]))*1e4/n
print('%-24s %8.0f req/s  user %5.2f  sys %5.2f  total %5.2f us/req' % ('$(basename "$b")', n/$D, u, s, u+s))"
  done
done
