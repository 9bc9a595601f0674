#!/bin/bash
# Syscalls per request, by name, for nginx and tern on the same nginx.conf
# as bench/instructions.sh (bench/lib.sh: the shared bench's `small`
# location), counted by the kernel's tracepoints (`perf stat -e
# 'syscalls:sys_enter_*' -p PID`) while `wrk -t1 -c4` runs: exact counts,
# not slowed like strace.
#
#   bench/syscalls.sh [--ocf on|off] [--size 1k|16k] [--conn] [--workers N]
#                     [--clients N] [--port N] [--uri PATH] [--gzip LEVEL]
#                     [--accept ENC] BIN...
#
# (options: see bench/lib.sh). Each BIN runs with `master_process off` (one
# worker) or, with --workers, under its master with N workers on one shared
# listener (the counts are summed over the workers). Prints each syscall
# made at least 0.01 times per request, and the total.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
SECS=5
bench_args 18194 "$@"
[ ${#BINS[@]} -gt 0 ] || { echo "usage: $0 [--ocf on|off] [--size 1k|16k] [--conn] [--workers N] [--clients N] [--port N] [--uri PATH] [--gzip LEVEL] [--accept ENC] BIN..." >&2; exit 2; }
bench_setup tern-sc
for BIN in "${BINS[@]}"; do
  if [ "$WORKERS" -gt 0 ]; then
    "$BIN" -p "$W/" -c "$W/nginx.conf" -g 'daemon off;' 2>"$W/err" &
  else
    "$BIN" -p "$W/" -c "$W/nginx.conf" -g 'daemon off; master_process off;' 2>"$W/err" &
  fi
  M=$!
  bench_wait_up $M "$W/err"
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
  printf '%s %s workers=%s clients=%s requests %d\n' "$(basename "$BIN")" "$TAG" "$WP" "$CONNS" "$R"
  awk -F, -v r="$R" '$3 ~ /sys_enter_/ && $1+0 > 0 { n=$1/r; t+=n; sub("syscalls:sys_enter_","",$3); if (n >= 0.01) printf "  %-18s %7.3f\n", $3, n } END { printf "  %-18s %7.3f\n", "total", t }' "$W/perf"
done
