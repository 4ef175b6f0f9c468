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
name=containerd
# shellcheck source=scripts/lib/containerd-ci.sh
source scripts/lib/containerd-ci.sh

if [[ "$(id -u)" -ne 0 ]]; then
  echo "ci-containerd.sh needs root (containerd, runc, mounts, cgroups)" >&2
  exit 1
fi

step "installing tools"
lab_install_tools

# The test process is found by its arguments (it names the work directory).
lab_workdir "--marker @WORK@"

step "release build"
lab_release_build

step "real pods, real cgroups, real /proc (tests/containerd/attribution_test.py)"
GPU_EXPORTER_LAB_BASE="$work" timeout --kill-after=15 300 python3 tests/containerd/attribution_test.py \
  --exporter "$bin" --fake-kubelet "$fake_kubelet" --marker "$work"

step "nothing left behind"
lab_nothing_left

step "all containerd attribution checks passed"
