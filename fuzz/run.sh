#!/usr/bin/env bash
# Runs every fuzz target (or those named) for SECS seconds each, growing
# fuzz/corpus/<target> from fuzz/seeds/<target>; crashes land in
# fuzz/artifacts/<target>/. Stable toolchain, no sanitizer: a panic or an
# assertion of src/fuzzing.rs is the crash.
#   fuzz/run.sh 1800                 # 30 min each
#   fuzz/run.sh 60 chunked uri       # one minute, two targets
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request_head chunked uri range config template upstream_head fastcgi_records h2_guard proxy_protocol ssl_preread cgi_head range_multipart conditional mp4 mail)
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "seeds/$t"
    echo "== $t ($secs s)"
    cargo fuzz run --sanitizer none -O "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 2>&1 \
        | grep -E '^(stat::|==|#[0-9]+ *DONE|.*(panicked|SUMMARY|ERROR|Test unit written))' || true
done
