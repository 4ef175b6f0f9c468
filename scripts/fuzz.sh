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
cp "$root"/metrics-config/*.csv "$root"/tests/fixtures/csv/*.csv corpus/catalog_csv/ 2>/dev/null || true
cp "$root"/tests/fixtures/upstream/dcp-metrics-included.csv corpus/catalog_csv/upstream-dcp.csv
cp seeds/scenario/* corpus/scenario/
cp seeds/web_config/* corpus/web_config/
printf 'Basic cHJvbWV0aGV1czpzM2NyZXQ=' > corpus/basic_auth_header/seed

cargo fuzz build
status=0
for target in $(cargo fuzz list); do
    echo "== fuzzing $target for ${secs}s"
    rc=0
    cargo fuzz run "$target" "corpus/$target" -- \
        -max_total_time="$secs" -max_len=8192 -rss_limit_mb=2048 -print_final_stats=1 \
        > "/tmp/fuzz-$target.log" 2>&1 || rc=$?
    grep -E '^(Done [0-9]+ runs|stat::number_of_executed_units|SUMMARY|==[0-9]+== ERROR)' "/tmp/fuzz-$target.log" || true
    if [ "$rc" -ne 0 ]; then
        echo "!! $target failed (rc $rc); crash input in fuzz/artifacts/$target/, log /tmp/fuzz-$target.log"
        status=1
    fi
done
exit "$status"
