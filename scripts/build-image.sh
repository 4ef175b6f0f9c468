#!/usr/bin/env bash
# Builds gpu-exporter's container image without Docker or a registry: buildah (vfs storage in a
# temporary directory, nothing left behind) from scratch plus Debian's glibc runtime, the same
# layout as the Dockerfile (scripts/image-rootfs.sh assembles it for both).
#
#   scripts/build-image.sh [--binary PATH] [--tag NAME:TAG] [--format docker-archive|oci-archive]
#                          [--dcgm-lib DIR] OUT.tar
#
# Defaults: the release build under $CARGO_TARGET_DIR (or target/), built with
# `cargo build --release --bin gpu-exporter` when missing; tag localhost/gpu-exporter:<version of
# Cargo.toml>; format docker-archive. Load the archive with any of
#   ctr -n k8s.io images import OUT.tar     docker load -i OUT.tar     podman load -i OUT.tar
#   kind load image-archive OUT.tar         skopeo copy docker-archive:OUT.tar docker://REGISTRY/...
# --dcgm-lib DIR builds the variant with DCGM's libraries (DIR's files at /usr/lib/<multiarch>/,
# in the ld cache: scripts/image-rootfs.sh), as the Dockerfile's `dcgm` target does from NVIDIA's
# DCGM image; CI passes the libdcgm stand-in. Default tag then: ...:<version>-dcgm.
# Installs buildah (apt) when missing. Prints the image's unpacked size.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

binary=""
tag=""
format="docker-archive"
out=""
dcgm_lib=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --format) format="$2"; shift 2 ;;
    --dcgm-lib) dcgm_lib="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "$0: unknown option $1" >&2; exit 2 ;;
    *) [[ -z "$out" ]] || { echo "$0: one output file only" >&2; exit 2; }; out="$1"; shift ;;
  esac
done
[[ -n "$out" ]] || { echo "usage: $0 [--binary PATH] [--tag NAME:TAG] [--format docker-archive|oci-archive] [--dcgm-lib DIR] OUT.tar" >&2; exit 2; }
case "$format" in docker-archive|oci-archive) ;; *) echo "$0: --format must be docker-archive or oci-archive" >&2; exit 2 ;; esac
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)"
tag="${tag:-localhost/gpu-exporter:$version${dcgm_lib:+-dcgm}}"

if [[ -z "$binary" ]]; then
  binary="${CARGO_TARGET_DIR:-$repo/target}/release/gpu-exporter"
  if [[ ! -x "$binary" ]]; then
    echo "building $binary" >&2
    (cd "$repo" && cargo build --release --quiet --bin gpu-exporter)
  fi
fi

if ! command -v buildah >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends buildah >/dev/null
fi

work="$(mktemp -d /tmp/gpu-exporter-image.XXXXXX)"
store="$work/storage"
bah() { buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs "$@"; }
cleanup() {
  # buildah mounts nothing with vfs; `rm` drops its working container, then the store goes.
  bah rm --all >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

rootfs_opts=()
[[ -z "$dcgm_lib" ]] || rootfs_opts=(--dcgm-lib "$dcgm_lib")
"$repo/scripts/image-rootfs.sh" "${rootfs_opts[@]}" "$binary" "$work/rootfs"
size_kb="$(du -s --apparent-size --block-size=1K "$work/rootfs" | cut -f1)"

ctr="$(bah from --quiet scratch)"
bah copy --quiet "$ctr" "$work/rootfs/" / >/dev/null
# What dcgm-exporter's image sets, and what the GPU Operator relies on: it passes only `args`,
# so the ENTRYPOINT is the exporter itself; the NVIDIA Container Toolkit reads the NVIDIA_* env.
bah config \
  --entrypoint '["/usr/bin/gpu-exporter"]' \
  --cmd '' \
  --user 0:0 \
  --workingdir / \
  --port 9400/tcp \
  --env NVIDIA_VISIBLE_DEVICES=all \
  --env NVIDIA_DRIVER_CAPABILITIES=compute,utility,compat32 \
  --env NVIDIA_DISABLE_REQUIRE=true \
  --env PATH=/usr/bin:/sbin \
  --label org.opencontainers.image.title=gpu-exporter \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label org.opencontainers.image.description="Prometheus exporter for NVIDIA GPUs; a drop-in replacement for dcgm-exporter" \
  "$ctr"
bah commit --quiet --format oci --rm "$ctr" "$tag" >/dev/null
rm -f "$out"
bah push --quiet "$tag" "$format:$out:$tag"
echo "built $tag -> $out ($format, $(du -k "$out" | cut -f1) KiB archive, $size_kb KiB unpacked)"
