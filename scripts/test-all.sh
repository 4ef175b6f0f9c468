#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this). Installs what it needs first, so it
# works on a fresh Debian machine with a Rust toolchain; run it as root or with sudo rights.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

log "cargo fmt --check"
cargo fmt --all --check

log "cargo clippy"
cargo clippy --all-targets -- -D warnings

log "no import circle among src/ files"
# The check itself must see a circle when there is one.
circle="$(mktemp -d)"
mkdir -p "$circle/a"
printf 'pub mod a;\npub struct Top;\n' > "$circle/lib.rs"
printf 'pub mod b;\nuse crate::Top;\npub struct A(Top);\n' > "$circle/a/mod.rs"
printf 'use super::A;\npub struct B;\n' > "$circle/a/b.rs"
printf 'use crate::a::b::B;\n' >> "$circle/lib.rs"
if python3 scripts/import-cycles.py "$circle" >/dev/null; then
  echo "scripts/import-cycles.py missed the circle lib.rs -> a/b.rs -> a/mod.rs -> lib.rs" >&2
  exit 1
fi
rm -rf "$circle"
python3 scripts/import-cycles.py

log "cargo test"
# The workspace's default members are the exporter and its test doubles
# (crates/gpu-exporter-testing). Tests run the fake-kubelet binary of the latter, which cargo
# builds for no test of the exporter's package: build it first (tests/common/fake_kubelet_bin.rs).
cargo build --bin fake-kubelet
cargo test --all-targets
cargo test --doc

log "cargo bench --no-run"
cargo bench --no-run
# The load and table scripts are run by hand (BENCHMARKS.md); here they must at least compile.
python3 -m py_compile benches/load.py benches/criterion_table.py benches/fleet/fleet.py benches/fleet/measure.py \
  tests/harness.py tests/e2e/e2e.py benches/hpc_rss.py

# `promtool check metrics` on every golden file runs inside cargo test (tests/promtool.rs), which
# fails on any finding other than those inherent to dcgm-exporter's names.

for extra in scripts/ci-*.sh; do
  [ -e "$extra" ] || continue
  log "$extra"
  bash "$extra"
done

log "all checks passed"
