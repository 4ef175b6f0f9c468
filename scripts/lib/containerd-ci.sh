# Shared by scripts/ci-image.sh and scripts/ci-containerd.sh (sourced, not run): the tools a
# private containerd lab needs, the release build, the exit trap that tears a lab down, and the
# check that nothing is left behind. Callers set `root`, `step` and `name` first and run as root.

# Installs containerd, runc, buildah, gcc (+ libc6-dev) and the extra `command:package` pairs
# given, with apt, when missing; grpcio and grpcio-tools with pip.
lab_install_tools() {
  local need=() tool
  for tool in containerd:containerd runc:runc ctr:containerd buildah:buildah gcc:gcc "$@"; do
    command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
  done
  [[ -e /usr/include/stdio.h ]] || need+=(libc6-dev)
  if ((${#need[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
  fi
  python3 -c 'import grpc, grpc_tools' 2>/dev/null \
    || python3 -m pip install -q --disable-pip-version-check grpcio grpcio-tools
  containerd --version
  runc --version | head -1
}

# Makes the work directory `work` and records the kubepods cgroup directories before the run;
# an exit trap tears down whatever a failed or killed run left: the lab's own teardown kills the
# test process (found by the string $1 in its arguments) and removes `work`.
lab_workdir() {
  local kill_mentioning="$1"
  work="$(mktemp -d "/tmp/gpu-exporter-ci-$name.XXXXXX")"
  cgroups_before="$(find /sys/fs/cgroup -maxdepth 4 -path '*kubepods*' -type d 2>/dev/null | sort)"
  _lab_kill_mentioning="${kill_mentioning//@WORK@/$work}"
  trap _lab_cleanup EXIT
  trap 'exit 130' INT TERM
}
_lab_cleanup() {
  local rc=$?
  python3 tests/containerd/lab.py teardown --kill-mentioning "$_lab_kill_mentioning" "$work"/gpu-exporter-lab-* || true
  rm -rf "$work"
  exit "$rc"
}

# Sets `bin` and `fake_kubelet`: GPU_EXPORTER_BIN (with fake-kubelet next to it), else a release
# build through cargo, so a stale build is never tested (a no-op when up to date).
lab_release_build() {
  if [[ -n "${GPU_EXPORTER_BIN:-}" ]]; then
    bin="$GPU_EXPORTER_BIN"
  else
    cargo build --release --quiet --bin gpu-exporter --bin fake-kubelet
    bin="${CARGO_TARGET_DIR:-$root/target}/release/gpu-exporter"
  fi
  fake_kubelet="$(dirname "$bin")/fake-kubelet"
  [[ -x "$bin" && -x "$fake_kubelet" ]] || { echo "missing $bin or $fake_kubelet" >&2; exit 1; }
}

# Fails naming each process (its command line names a lab directory: containerd, shims,
# helpers), mount under `work` and kubepods cgroup directory the run left, found the way the
# lab's own teardown finds them.
lab_nothing_left() {
  local left
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
  local cgroups_after
  cgroups_after="$(find /sys/fs/cgroup -maxdepth 4 -path '*kubepods*' -type d 2>/dev/null | sort)"
  [[ "$cgroups_after" == "$cgroups_before" ]] \
    || left+="cgroup dirs: $(comm -13 <(echo "$cgroups_before") <(echo "$cgroups_after"))"$'\n'
  if [[ -n "$left" ]]; then
    printf 'left behind:\n%s' "$left" >&2
    exit 1
  fi
  echo "  ok  no process, mount or kubepods cgroup directory left"
}
