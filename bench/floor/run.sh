#!/bin/sh
# The floor for the 1 KiB keep-alive figure: builds floor.c and measures it
# with shared/bench's `small` scenario (same wrk -t1 -c64 -d10s, same pinning,
# same CPU accounting) as the reference server, with tern as --against, so
# the ratio row is tern / floor.
#
#   bench/floor/run.sh [TERN_BIN] [extra run.sh options]
#   e.g. bench/floor/run.sh target/release/tern --port 18651 --workdir /var/tmp/bench-f
#
# floor ignores the request (no parsing) and the file; it reads the port
# from the generated nginx.conf. Both open_file_cache variants are run so
# tern's best configuration is compared too; floor is the same in both.
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tern=${1:-$root/target/release/tern}
[ $# -gt 0 ] && shift
cc -O2 -Wall -Wextra -o "$here/floor" "$here/floor.c"
# tern gets shared/bench's default argument template (as nginx would).
exec "$root/../shared/bench/run.sh" small --server "$here/floor" --server-args '{conf}' \
    --against "$tern" \
    --against-args "-p {prefix}/ -c {conf} -e {prefix}/logs/error.log -g 'daemon off; master_process on;'" \
    --sizes 1k --open-file-cache off,on "$@"
