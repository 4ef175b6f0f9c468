#!/usr/bin/env bash
# End-to-end test of alerts/ and dashboards/ against a real Prometheus and Alertmanager.
#   tests/e2e/run.sh [path/to/gpu-exporter]     (default: target/release/gpu-exporter)
# Needs: python3, prometheus, prometheus-alertmanager, promtool (Debian packages of the same names).
# Pod-label mode (E2E_PODS=1) uses target/release/fake-kubelet; off by default until the e2e
# assignments are written in fake-kubelet's TOML format (work in progress on branch e2e).
# Hard limit: E2E_TIMEOUT seconds (default 600). Loopback only. See tests/e2e/README.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${1:-$root/target/release/gpu-exporter}"
[[ -x "$bin" ]] || { echo "e2e: $bin is not an executable (cargo build --release first)" >&2; exit 2; }
extra=()
kubelet="$(dirname "$bin")/fake-kubelet"
if [[ "${E2E_PODS:-0}" = "1" && -x "$kubelet" ]]; then
  extra+=(--fake-kubelet "$kubelet")
fi
exec timeout --kill-after=10 "${E2E_TIMEOUT:-600}" python3 "$root/tests/e2e/e2e.py" --binary "$bin" "${extra[@]}"
