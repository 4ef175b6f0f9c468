#!/usr/bin/env bash
# The Helm chart reads the metrics CSV, the alert and recording rules and the dashboards from
# copies under deploy/helm/gpu-exporter/files/ (helm cannot read files outside the chart). This
# script refreshes the copies; --check exits 1 naming each copy that differs (scripts/ci-helm.sh).
#   scripts/sync-chart-files.sh          # copy
#   scripts/sync-chart-files.sh --check  # verify
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
files="$root/deploy/helm/gpu-exporter/files"
pairs=(
  "metrics-config/default-counters.csv:default-counters.csv"
  "alerts/gpu-exporter.rules.yml:gpu-exporter.rules.yml"
  "alerts/gpu-exporter.recording.yml:gpu-exporter.recording.yml"
)
for d in "$root"/dashboards/*.json; do
  pairs+=("dashboards/$(basename "$d"):dashboards/$(basename "$d")")
done
status=0
if [[ "${1:-}" == "--check" ]]; then
  for p in "${pairs[@]}"; do
    src="${p%%:*}" dst="${p#*:}"
    if ! cmp -s "$root/$src" "$files/$dst"; then
      echo "deploy/helm/gpu-exporter/files/$dst differs from $src: run scripts/sync-chart-files.sh" >&2
      status=1
    fi
  done
  # A dashboard deleted from dashboards/ must not linger in the chart.
  for d in "$files"/dashboards/*.json; do
    [[ -e "$root/dashboards/$(basename "$d")" ]] || {
      echo "deploy/helm/gpu-exporter/files/dashboards/$(basename "$d") has no dashboards/ source: run scripts/sync-chart-files.sh" >&2
      status=1
    }
  done
  exit "$status"
fi
mkdir -p "$files/dashboards"
rm -f "$files"/dashboards/*.json
for p in "${pairs[@]}"; do
  cp "$root/${p%%:*}" "$files/${p#*:}"
done
