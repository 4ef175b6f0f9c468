#!/usr/bin/env bash
# CI for the shipped artifacts (dashboards/, alerts/, deploy/). Run as root on a clean Debian
# bookworm clone, after `cargo build --release` (or it builds it):
#   scripts/ci-artifacts.sh
# Installs what it needs (idempotent): apt prometheus prometheus-alertmanager victoria-metrics
# kubernetes-client (kubectl only if none is installed), pip kubernetes-validate and the exact
# grafana-foundation-sdk build scripts/gen-dashboards.py pins. Steps, each must pass:
#   1. generated files are up to date (dashboards, PrometheusRule, ConfigMap CSV copy)
#   2. promtool check rules + promtool test rules
#   3. kubectl kustomize deploy/ and overlays/process-usage/ + scripts/validate-manifests.py
#   4. tests/e2e/run.sh (21 simulated nodes, real Prometheus + Alertmanager, fake kubelets;
#      with GPU_EXPORTER_BIN set, fake-kubelet must be next to that binary)
#   5. benches/fleet/run.sh --ci (50 simulated nodes, Prometheus remote-writing to
#      VictoriaMetrics: every dashboard query and alert expression agrees on both, the recording
#      rules agree with the raw queries they replace; FLEET_SIM overrides the fleet-sim binary)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
start=$SECONDS
step() { echo; echo "=== ci-artifacts: $* ($((SECONDS - start))s)"; }

step "installing tools"
need_apt=()
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need_apt+=(prometheus-alertmanager)
command -v victoria-metrics >/dev/null || need_apt+=(victoria-metrics)
command -v kubectl >/dev/null || need_apt+=(kubernetes-client)
if ((${#need_apt[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
python3 -c 'import kubernetes_validate, yaml' 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check kubernetes-validate pyyaml
# The dashboards are generated with Grafana's SDK, pinned exactly (its version is in gen-dashboards.py).
sdk="$(python3 scripts/gen-dashboards.py --requirement)"
python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('${sdk%%==*}') != '${sdk#*==}')" 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check "$sdk"
promtool --version 2>&1 | head -1
kubectl version --client 2>/dev/null | head -1 || true

step "generated files are up to date"
python3 scripts/gen-dashboards.py --check
scripts/gen-prometheusrule.sh --check
cmp metrics-config/default-counters.csv deploy/default-counters.csv \
  || { echo "deploy/default-counters.csv differs from metrics-config/default-counters.csv" >&2; exit 1; }

step "dcgm-exporter's own CSVs are upstream's, byte for byte (metrics-config/upstream/)"
# The git blob ids of dcgm-exporter 4.5.3-4.8.2's etc/*.csv (computed here without git).
python3 - <<'PY'
import hashlib, pathlib, sys
want = {
    "default-counters.csv": "2eed7a651db300797554cb91591908f410902f21",
    "dcp-metrics-included.csv": "d8e53f848adc1c88fdd7d0bd238f07085dd54e9d",
    "1.x-compatibility-metrics.csv": "027425389d6e48f511019048a858995ef0589b97",
}
d = pathlib.Path("metrics-config/upstream")
have = sorted(p.name for p in d.glob("*.csv"))
if have != sorted(want):
    sys.exit(f"metrics-config/upstream/ holds {have}, expected {sorted(want)}")
for name, blob in want.items():
    data = (d / name).read_bytes()
    got = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    if got != blob:
        sys.exit(f"metrics-config/upstream/{name}: git blob {got}, upstream's is {blob}: it was edited")
    print(f"  ok  metrics-config/upstream/{name} = dcgm-exporter 4.5.3-4.8.2 etc/{name} ({blob[:12]})")
PY

step "promtool check rules / test rules"
promtool check rules alerts/gpu-exporter.rules.yml alerts/gpu-exporter.recording.yml
promtool test rules alerts/gpu-exporter.rules.test.yml alerts/gpu-exporter.recording.test.yml

step "kubectl kustomize deploy/ and overlays/process-usage/ + schema validation"
rendered="$(mktemp --suffix=.yaml)"
trap 'rm -f "$rendered"' EXIT
kubectl kustomize deploy/ > "$rendered"
python3 scripts/validate-manifests.py "$rendered"
kubectl kustomize overlays/process-usage/ > "$rendered"
python3 scripts/validate-manifests.py "$rendered"

step "end-to-end (real Prometheus + Alertmanager)"
# Always (re)build unless a binary is given, so a stale release build is never tested.
if [[ -n "${GPU_EXPORTER_BIN:-}" ]]; then
  bin="$GPU_EXPORTER_BIN"
else
  cargo build --release --quiet --bins
  bin="${CARGO_TARGET_DIR:-target}/release/gpu-exporter"
fi
tests/e2e/run.sh "$bin"

step "fleet: 50 nodes through Prometheus and VictoriaMetrics"
# fleet-sim is built with the other binaries (next to gpu-exporter unless GPU_EXPORTER_BIN says otherwise).
export FLEET_SIM="${FLEET_SIM:-$(dirname "$bin")/fleet-sim}"
benches/fleet/run.sh --ci

step "all artifact checks passed"
