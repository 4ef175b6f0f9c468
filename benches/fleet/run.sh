#!/usr/bin/env bash
# The fleet run (benches/fleet/README.md): builds fleet-sim, then runs fleet.py under a hard time
# limit. Installs Debian's prometheus and victoria-metrics if missing (as root, or with sudo).
#   benches/fleet/run.sh --ci                       # CI: 50 nodes, checks only (about a minute)
#   benches/fleet/run.sh                            # 1,000 nodes, 95 minutes of data, then the
#                                                   # figures into BENCHMARKS.md ("Fleet")
#   benches/fleet/run.sh --nodes 200 --minutes 20   # anything fleet.py takes
# FLEET_SIM=path/to/fleet-sim skips the build (CI passes the one it built).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v victoria-metrics >/dev/null || need_apt+=(victoria-metrics)
if ((${#need_apt[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

ci=0; minutes=95; report=0
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --ci) ci=1 ;;
    --minutes) minutes="${args[$((i + 1))]}" ;;
    --report) report=1 ;;
  esac
done
if ((ci)); then
  limit=300
else
  limit=$(python3 -c "print(int(float('$minutes') * 60) + 5400)")
  ((report)) || args+=(--report BENCHMARKS.md)
fi

sim="${FLEET_SIM:-}"
if [[ -z "$sim" ]]; then
  cargo build --release --quiet --bin fleet-sim
  sim="${CARGO_TARGET_DIR:-target}/release/fleet-sim"
fi
# Each simulated node holds a listening socket and Prometheus' connection to it.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
exec timeout --kill-after=30 "$limit" python3 "$root/benches/fleet/fleet.py" --sim "$sim" --timeout "$limit" "${args[@]}"
