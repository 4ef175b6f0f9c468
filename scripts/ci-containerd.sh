#!/usr/bin/env bash
# CI for process attribution against a real container runtime (scripts/test-all.sh runs every
# scripts/ci-*.sh). Run as root on a clean Debian bookworm clone, no GPU needed:
#   scripts/ci-containerd.sh
# Installs what it needs (idempotent): apt containerd runc buildah gcc libc6-dev, pip grpcio
# grpcio-tools. Steps, each must pass:
#   1. release build of gpu-exporter and fake-kubelet (cargo; $CARGO_TARGET_DIR respected;
#      GPU_EXPORTER_BIN names a prebuilt gpu-exporter with fake-kubelet next to it instead)
#   2. tests/containerd/attribution_test.py: a private containerd + runc runs real pods from
#      images built here; the simulated fleet's per-process readings point at their real PIDs;
#      the exporter attributes them through the real CRI and the real /proc, survives containerd
#      stopped and started again, and drops a deleted pod within one refresh
#   3. nothing is left behind: no process, mount or kubepods cgroup directory of the run
# All network traffic stays on loopback; every wait is bounded; an exit trap tears down whatever
# a failed or killed run left.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
start=$SECONDS
step() { echo; echo "=== ci-containerd: $* ($((SECONDS - start))s)"; }

if [[ "$(id -u)" -ne 0 ]]; then
  echo "ci-containerd.sh needs root (containerd, runc, mounts, cgroups)" >&2
  exit 1
fi

step "installing tools"
need_apt=()
for tool in containerd:containerd runc:runc ctr:containerd buildah:buildah gcc:gcc; do
  command -v "${tool%%:*}" >/dev/null || need_apt+=("${tool#*:}")
done
[[ -e /usr/include/stdio.h ]] || need_apt+=(libc6-dev)
if ((${#need_apt[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need_apt[@]}" | sort -u) >/dev/null
fi
python3 -c 'import grpc, grpc_tools' 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check grpcio grpcio-tools
containerd --version
runc --version | head -1

work="$(mktemp -d /tmp/gpu-exporter-ci-containerd.XXXXXX)"
cgroups_before="$(find /sys/fs/cgroup -maxdepth 4 -path '*kubepods*' -type d 2>/dev/null | sort)"
cleanup() {
  rc=$?
  # Whatever the test process could not undo (it was killed, or failed mid-way); the test
  # process is found by its arguments (it names $work), killed if still there.
  python3 tests/containerd/lab.py teardown --kill-mentioning "--marker $work" "$work"/gpu-exporter-lab-* || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "release build"
if [[ -n "${GPU_EXPORTER_BIN:-}" ]]; then
  bin="$GPU_EXPORTER_BIN"
else
  # Always through cargo, so a stale build is never tested (a no-op when up to date).
  cargo build --release --quiet --bin gpu-exporter --bin fake-kubelet
  bin="${CARGO_TARGET_DIR:-$root/target}/release/gpu-exporter"
fi
fake_kubelet="$(dirname "$bin")/fake-kubelet"
[[ -x "$bin" && -x "$fake_kubelet" ]] || { echo "missing $bin or $fake_kubelet" >&2; exit 1; }

step "real pods, real cgroups, real /proc (tests/containerd/attribution_test.py)"
GPU_EXPORTER_LAB_BASE="$work" timeout --kill-after=15 300 python3 tests/containerd/attribution_test.py \
  --exporter "$bin" --fake-kubelet "$fake_kubelet" --marker "$work"

step "nothing left behind"
left="$(python3 - "$work" <<'PY'
import sys
sys.path.insert(0, "tests/containerd")
from pathlib import Path
from lab import _mounts_under, _pids_mentioning
work = Path(sys.argv[1])
for pid in _pids_mentioning(f"{work}/gpu-exporter-lab-"):
    print(f"process {pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
for target in _mounts_under(work):
    print(f"mount {target}")
PY
)"
[[ -z "$left" ]] || left+=$'\n'
cgroups_after="$(find /sys/fs/cgroup -maxdepth 4 -path '*kubepods*' -type d 2>/dev/null | sort)"
[[ "$cgroups_after" == "$cgroups_before" ]] || left+="cgroup dirs: $(comm -13 <(echo "$cgroups_before") <(echo "$cgroups_after"))"$'\n'
if [[ -n "$left" ]]; then
  printf 'left behind:\n%s' "$left" >&2
  exit 1
fi
echo "  ok  no process, mount or kubepods cgroup directory left"

step "all containerd attribution checks passed"
