#!/bin/bash
# User-space instructions per request under callgrind, for nginx and tern on
# the same nginx.conf (the shared bench's `small` location: sendfile,
# tcp_nopush, tcp_nodelay, access_log off, optional open_file_cache).
# Exact and insensitive to machine load, unlike wall-clock figures; this VM
# has no hardware counters for `perf stat -e instructions`.
#
#   bench/instructions.sh [--ocf on|off] [--size 1k|16k] [--conn] [--port N] BIN...
#
# Each BIN runs with `master_process off` under valgrind; after a warm-up,
# counters are zeroed, `wrk -t1 -c4 -d5s` runs, and the dump's total is
# divided by wrk's request count. Kernel work (syscalls) is not counted:
# count those with `strace -c -f -p PID` under the same load.
set -euo pipefail
OCF=off SIZE=1k MODE=ka PORT=18193
while [ $# -gt 0 ]; do
  case "$1" in
    --ocf) OCF=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --conn) MODE=conn; shift ;;
    --port) PORT=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--ocf on|off] [--size 1k|16k] [--conn] [--port N] BIN..." >&2; exit 2; }
W=$(mktemp -d /var/tmp/tern-ir.XXXXXX)
# KEEP=PREFIX keeps each callgrind dump as PREFIX.BIN.OCF.SIZE.MODE.
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/www" "$W/logs"
chmod 755 "$W" "$W/www"
case "$SIZE" in 1k) N=1024 ;; 16k) N=16384 ;; *) N=$(numfmt --from=iec "${SIZE^^}") ;; esac
head -c "$N" /dev/urandom > "$W/www/f.bin"
chmod 644 "$W/www/f.bin"
OCF_LINES=""
[ "$OCF" = on ] && OCF_LINES="open_file_cache max=1000 inactive=60s; open_file_cache_valid 60s; open_file_cache_min_uses 1; open_file_cache_errors on;"
cat > "$W/nginx.conf" <<CONF
worker_processes 1;
error_log $W/logs/error.log;
pid $W/logs/nginx.pid;
events { worker_connections 10000; }
http {
    access_log off;
    sendfile on; tcp_nopush on; tcp_nodelay on;
    keepalive_timeout 65s; keepalive_requests 1000000;
    $OCF_LINES
    server { listen 127.0.0.1:$PORT; server_name localhost; root $W/www; location / { } }
}
CONF
H=()
[ "$MODE" = conn ] && H=(-H "Connection: close")
URL="http://127.0.0.1:$PORT/f.bin"
# callgrind_control waits until the server runs again, which an idle
# server under valgrind may never do by itself (seen: the dump hung for
# minutes): poke it with requests until the command is through. The few
# requests of a poke after `-z` add ~0.1 % to the counted total.
ctl() {
  callgrind_control "$@" $V >/dev/null 2>&1 &
  local C=$!
  for _ in $(seq 300); do
    kill -0 $C 2>/dev/null || break
    sleep 0.3
    kill -0 $C 2>/dev/null || break
    curl -s -o /dev/null --max-time 2 "$URL" || true
  done
  wait $C 2>/dev/null || true
}
for BIN in "$@"; do
  rm -f "$W"/cg.out*
  valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" --instr-atstart=no \
    "$BIN" -p "$W/" -c "$W/nginx.conf" -g 'daemon off; master_process off;' 2>"$W/vg.err" &
  V=$!
  for _ in $(seq 100); do curl -s -o /dev/null "$URL" && break; kill -0 $V 2>/dev/null || { cat "$W/vg.err" >&2; exit 1; }; sleep 0.2; done
  ctl -i on
  wrk -t1 -c4 -d2s "${H[@]}" "$URL" >/dev/null
  ctl -z
  R=$(wrk -t1 -c4 -d5s "${H[@]}" "$URL" | awk '/requests in/{print $1}')
  ctl -d
  ctl -i off
  # A TERM can be lost while valgrind runs the server (seen with nginx in
  # epoll_wait): repeat it, then KILL; the dump is already written.
  for _ in $(seq 50); do kill $V 2>/dev/null || break; sleep 0.2; done
  kill -9 $V 2>/dev/null || true
  wait $V 2>/dev/null || true
  [ -n "${KEEP:-}" ] && cp "$(ls "$W"/cg.out.* | sort | head -1)" "$KEEP.$(basename "$BIN").$OCF.$SIZE.$MODE"
  F=$(ls "$W"/cg.out.* | sort | head -1)
  IR=$(awk '/^summary:/{print $2; exit}' "$F")
  printf '%-28s ocf=%-3s %-4s %-4s requests %6d  instructions/request %7d\n' \
    "$(basename "$BIN")" "$OCF" "$SIZE" "$MODE" "$R" $((IR / R))
done
