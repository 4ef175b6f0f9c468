#!/usr/bin/env bash
# Scrape load benchmark (by hand, not in CI): installs wrk and prometheus-node-exporter if
# missing, builds the release binaries and the static-body server, then runs benches/load.py,
# which rewrites the load section of BENCHMARKS.md. Pass load.py's options through, e.g.
#   benches/load.sh --duration 5 --print-only
# Run it on an otherwise idle machine; it takes about 11 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v prometheus-node-exporter >/dev/null 2>&1 || need+=(prometheus-node-exporter)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # RUNLEVEL=1 keeps invoke-rc.d from starting the packaged node-exporter service.
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

cargo build --release --bins --example static-body-server
exec python3 benches/load.py "$@"
