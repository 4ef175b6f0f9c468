#!/usr/bin/env bash
# End-to-end test of alerts/ and dashboards/ against a real Prometheus and Alertmanager, with pod
# labels from fake kubelets.
#   tests/e2e/run.sh [path/to/gpu-exporter]     (default: target/release/gpu-exporter)
# Needs: python3, prometheus, prometheus-alertmanager, promtool (Debian packages of the same names),
# and fake-kubelet next to the gpu-exporter binary (`cargo build --release` builds both).
# Hard limit: E2E_TIMEOUT seconds (default 600). Loopback only. See tests/e2e/README.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${1:-$root/target/release/gpu-exporter}"
[[ -x "$bin" ]] || { echo "e2e: $bin is not an executable (cargo build --release first)" >&2; exit 2; }
kubelet="$(dirname "$bin")/fake-kubelet"
[[ -x "$kubelet" ]] || {
  echo "e2e: $kubelet is not an executable: the pod-label checks need fake-kubelet next to $(basename "$bin") (cargo build --release builds both)" >&2
  exit 2
}
exec timeout --kill-after=10 "${E2E_TIMEOUT:-600}" python3 "$root/tests/e2e/e2e.py" --binary "$bin" --fake-kubelet "$kubelet"
