#!/bin/bash
# Syscalls per request, by name, for nginx and tern on the same nginx.conf
# as bench/instructions.sh (the shared bench's `small` location), counted
# by the kernel's tracepoints (`perf stat -e 'syscalls:sys_enter_*' -p PID`)
# while `wrk -t1 -c4` runs: exact counts, not slowed like strace.
#
#   bench/syscalls.sh [--ocf on|off] [--size 1k|16k] [--conn] [--workers N] [--port N] BIN...
#
# Each BIN runs with `master_process off` (one worker) or, with --workers,
# under its master with N workers on one shared listener (the counts are
# summed over the workers). Prints each syscall made at least 0.01 times
# per request, and the total.
set -euo pipefail
OCF=off SIZE=1k MODE=ka PORT=18194 WORKERS=0 SECS=5 CONNS=4
while [ $# -gt 0 ]; do
  case "$1" in
    --ocf) OCF=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --conn) MODE=conn; shift ;;
    --workers) WORKERS=$2; shift 2 ;;
    --clients) CONNS=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--ocf on|off] [--size 1k|16k] [--conn] [--workers N] [--clients N] [--port N] BIN..." >&2; exit 2; }
W=$(mktemp -d /var/tmp/tern-sc.XXXXXX)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/www" "$W/logs"
chmod 755 "$W" "$W/www"
case "$SIZE" in 1k) N=1024 ;; 16k) N=16384 ;; *) N=$(numfmt --from=iec "${SIZE^^}") ;; esac
head -c "$N" /dev/urandom > "$W/www/f.bin"
chmod 644 "$W/www/f.bin"
OCF_LINES=""
[ "$OCF" = on ] && OCF_LINES="open_file_cache max=1000 inactive=60s; open_file_cache_valid 60s; open_file_cache_min_uses 1; open_file_cache_errors on;"
WP=1
[ "$WORKERS" -gt 0 ] && WP=$WORKERS
cat > "$W/nginx.conf" <<CONF
worker_processes $WP;
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
for BIN in "$@"; do
  if [ "$WORKERS" -gt 0 ]; then
    "$BIN" -p "$W/" -c "$W/nginx.conf" -g 'daemon off;' 2>"$W/err" &
  else
    "$BIN" -p "$W/" -c "$W/nginx.conf" -g 'daemon off; master_process off;' 2>"$W/err" &
  fi
  M=$!
  for _ in $(seq 100); do curl -s -o /dev/null "$URL" && break; sleep 0.1; done
  sleep 0.5
  # The worker processes (or the one process).
  PIDS=$M
  if [ "$WORKERS" -gt 0 ]; then PIDS=$(pgrep -P "$M" | paste -sd,); fi
  wrk -t1 -c"$CONNS" -d1s "${H[@]}" "$URL" >/dev/null
  perf stat -x, -e 'syscalls:sys_enter_*' -p "$PIDS" -o "$W/perf" -- \
    wrk -t1 -c"$CONNS" -d${SECS}s "${H[@]}" "$URL" > "$W/wrk"
  R=$(awk '/requests in/{print $1}' "$W/wrk")
  kill "$M" 2>/dev/null || true
  wait "$M" 2>/dev/null || true
  printf '%s ocf=%s %s %s workers=%s clients=%s requests %d\n' "$(basename "$BIN")" "$OCF" "$SIZE" "$MODE" "$WP" "$CONNS" "$R"
  awk -F, -v r="$R" '$3 ~ /sys_enter_/ && $1+0 > 0 { n=$1/r; t+=n; sub("syscalls:sys_enter_","",$3); if (n >= 0.01) printf "  %-18s %7.3f\n", $3, n } END { printf "  %-18s %7.3f\n", "total", t }' "$W/perf"
done
