#!/bin/bash
# User-space instructions per request under callgrind, for nginx and tern on
# the same nginx.conf (bench/lib.sh: the shared bench's `small` location).
# Exact and insensitive to machine load, unlike wall-clock figures; this VM
# has no hardware counters for `perf stat -e instructions`.
#
#   bench/instructions.sh [--ocf on|off] [--size 1k|16k] [--conn] [--port N]
#                         [--uri PATH] [--gzip LEVEL] [--accept ENC] BIN...
#
# (options: see bench/lib.sh). Each BIN runs with `master_process off` under
# valgrind; after a warm-up, counters are zeroed, `wrk -t1 -c4 -d5s` runs,
# and the dump's total is divided by wrk's request count. Kernel work
# (syscalls) is not counted: bench/syscalls.sh counts those.
# KEEP=PREFIX keeps each callgrind dump as PREFIX.BIN.OCF.SIZE.MODE[.URI].
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_args 18193 "$@"
[ ${#BINS[@]} -gt 0 ] || { echo "usage: $0 [--ocf on|off] [--size 1k|16k] [--conn] [--port N] [--uri PATH] [--gzip LEVEL] [--accept ENC] BIN..." >&2; exit 2; }
bench_setup tern-ir
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
    curl -s -o /dev/null --max-time 2 "${H[@]}" "$URL" || true
  done
  wait $C 2>/dev/null || true
}
SUFFIX=""
[ "$URI" != /f.bin ] && SUFFIX=".$(echo "${URI#/}${ACCEPT:+-$ACCEPT}" | tr -c 'A-Za-z0-9\n-' _)"
for BIN in "${BINS[@]}"; do
  rm -f "$W"/cg.out*
  valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" --instr-atstart=no \
    "$BIN" -p "$W/" -c "$W/nginx.conf" -g 'daemon off; master_process off;' 2>"$W/vg.err" &
  V=$!
  bench_wait_up $V "$W/vg.err"
  ctl -i on
  wrk -t1 -c"$CONNS" -d2s "${H[@]}" "$URL" >/dev/null
  ctl -z
  R=$(wrk -t1 -c"$CONNS" -d5s "${H[@]}" "$URL" | awk '/requests in/{print $1}')
  ctl -d
  ctl -i off
  # A TERM can be lost while valgrind runs the server (seen with nginx in
  # epoll_wait): repeat it, then KILL; the dump is already written.
  for _ in $(seq 50); do kill $V 2>/dev/null || break; sleep 0.2; done
  kill -9 $V 2>/dev/null || true
  wait $V 2>/dev/null || true
  F=$(ls "$W"/cg.out.* | sort | head -1)
  [ -n "${KEEP:-}" ] && cp "$F" "$KEEP.$(basename "$BIN").$OCF.$SIZE.$MODE$SUFFIX"
  IR=$(awk '/^summary:/{print $2; exit}' "$F")
  printf '%-28s %s requests %6d  instructions/request %7d\n' \
    "$(basename "$BIN")" "$TAG" "$R" $((IR / R))
done
