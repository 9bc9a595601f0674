#!/usr/bin/env bash
# Runs every fuzz target (or those named) for SECS seconds each, growing
# fuzz/corpus/<target> from fuzz/seeds/<target>; crashes land in
# fuzz/artifacts/<target>/. Stable toolchain, no sanitizer: a panic or an
# assertion of src/fuzzing.rs is the crash.
#   fuzz/run.sh 1800                 # 30 min each
#   fuzz/run.sh 60 chunked uri       # one minute, two targets
#   NO_BUILD=1 fuzz/run.sh 600 mp4   # the binary `cargo fuzz build` left,
#                                    # as it is (no rebuild after an edit)
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request_head chunked uri range config template upstream_head fastcgi_records h2_guard proxy_protocol ssl_preread cgi_head range_multipart conditional mp4 mail)
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "seeds/$t"
    echo "== $t ($secs s)"
    flags=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
    if [ -n "${NO_BUILD:-}" ]; then
        mkdir -p "artifacts/$t"
        "target/x86_64-unknown-linux-gnu/release/$t" -artifact_prefix="artifacts/$t/" \
            "${flags[@]}" "corpus/$t" "seeds/$t" 2>&1
    else
        cargo fuzz run --sanitizer none -O "$t" "corpus/$t" "seeds/$t" -- "${flags[@]}" 2>&1
    fi | grep -E '^(stat::|==|#[0-9]+[[:space:]]+(INITED|DONE)|.*(panicked|SUMMARY|ERROR|Test unit written))' || true
done
