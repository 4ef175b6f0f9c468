#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a bounded time each (default 60 s).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
#
# Works on stable Rust: RUSTC_BOOTSTRAP=1 lets stable rustc accept the -Z sanitizer flags
# cargo-fuzz passes. Installs cargo-fuzz from crates.io if missing. Seeds come from the shipped
# CSVs, the CSV fixtures and fuzz/seeds/. A crash leaves its input in fuzz/artifacts/<target>/
# and makes this script fail; turn it into a regression test in tests/fuzz_regressions.rs.
set -euo pipefail
secs="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz"
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

mkdir -p corpus/catalog_csv corpus/scenario corpus/web_config corpus/basic_auth_header
cp "$root"/metrics-config/*.csv "$root"/tests/fixtures/csv/*.csv "$root"/tests/fixtures/upstream/*.csv corpus/catalog_csv/ 2>/dev/null || true
cp seeds/scenario/* corpus/scenario/
cp seeds/web_config/* corpus/web_config/
printf 'Basic cHJvbWV0aGV1czpzM2NyZXQ=' > corpus/basic_auth_header/seed

cargo fuzz build -O
status=0
for target in $(cargo fuzz list); do
    echo "== fuzzing $target for ${secs}s"
    if ! cargo fuzz run -O "$target" "corpus/$target" -- \
        -max_total_time="$secs" -max_len=8192 -rss_limit_mb=2048 -print_final_stats=1 \
        2>&1 | tee "/tmp/fuzz-$target.log" | grep -E '^(#[0-9]+ +DONE|==[0-9]+==|stat::number_of_executed_units|SUMMARY|Done)' ; then
        :
    fi
    if [ "${PIPESTATUS[0]}" -ne 0 ]; then
        echo "!! $target found a crash; see fuzz/artifacts/$target/ and /tmp/fuzz-$target.log"
        status=1
    fi
done
exit "$status"
