#!/usr/bin/env bash
# Assembles the container image's root filesystem in a directory: the one layout that both the
# Dockerfile (its build stage) and scripts/build-image.sh (buildah, no Docker) package.
#
#   scripts/image-rootfs.sh [--dcgm-lib DIR] BINARY ROOTFS
#
# BINARY is a release build of gpu-exporter (linked against glibc); ROOTFS must not exist or be
# empty. Needs dpkg-deb, apt-get (Debian's package lists: it runs `apt-get update` when a download
# fails), strip (binutils) and ldconfig. The layout:
#   /usr/bin/gpu-exporter                the binary, stripped (the image's ENTRYPOINT)
#   /usr/bin/dcgm-exporter               a link to it: dcgm-exporter's runbooks run
#                                        `dcgm-exporter --version` and its flags in the container
#   /etc/dcgm-exporter/*.csv             dcgm-exporter's own default-counters.csv,
#                                        dcp-metrics-included.csv, 1.x-compatibility-metrics.csv,
#                                        byte for byte (metrics-config/upstream/); gpu-exporter's
#                                        default as gpu-exporter-default-counters.csv; the 4.10
#                                        names (dcgm-exporter-4.10-default-counters.csv)
#   /lib/x86_64-linux-gnu/, /lib64/      Debian's glibc runtime: only the loader and the libraries
#                                        the binary and NVIDIA's libnvidia-ml.so.1 link against
#   /sbin/ldconfig, /etc/ld.so.conf,     so that the NVIDIA Container Toolkit's injected driver
#   /etc/ld.so.conf.d/, /etc/ld.so.cache libraries are found after its ldconfig run
#   /etc/passwd, /etc/group, /tmp        root (uid 0, the default user) and nobody (65534)
# With --dcgm-lib DIR (the image variant with DCGM, for its profiling fields on GPUs before
# Hopper: DCGM embedded without -r, or a standalone hostengine with -r), every file of DIR
# (libdcgm.so.4 and DCGM's modules: the Dockerfile's `dcgm` target copies them from NVIDIA's
# DCGM image; CI passes the libdcgm stand-in) goes where DCGM's packages and upstream's image
# put them:
#   /usr/lib/<multiarch>/libdcgm.so.4 ...  listed in /etc/ld.so.cache, so that
#                                        dlopen("libdcgm.so.4") finds it as in upstream's image;
#                                        every library they need must resolve inside the image
#                                        (libstdc++ is added from Debian when they need it)
set -euo pipefail

dcgm_lib=""
if [[ "${1:-}" == --dcgm-lib ]]; then
  [[ $# -ge 2 ]] || { echo "$0: --dcgm-lib needs a directory" >&2; exit 2; }
  dcgm_lib="$2"
  shift 2
fi
if [[ $# -ne 2 ]]; then
  echo "usage: $0 [--dcgm-lib DIR] BINARY ROOTFS" >&2
  exit 2
fi
binary="$1"
rootfs="$2"
if [[ -n "$dcgm_lib" ]] && [[ ! -e "$dcgm_lib/libdcgm.so.4" ]]; then
  echo "$0: --dcgm-lib $dcgm_lib: no libdcgm.so.4 there" >&2
  exit 1
fi
repo="$(cd "$(dirname "$0")/.." && pwd)"
[[ -f "$binary" ]] || { echo "$0: no binary at $binary" >&2; exit 1; }
if [[ -e "$rootfs" ]] && [[ -n "$(ls -A "$rootfs")" ]]; then
  echo "$0: $rootfs is not empty" >&2
  exit 1
fi

multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
case "$multiarch" in
  x86_64-linux-gnu) loader=ld-linux-x86-64.so.2 ;;
  aarch64-linux-gnu) loader=ld-linux-aarch64.so.1 ;;
  *) echo "$0: unsupported architecture $multiarch" >&2; exit 1 ;;
esac

debs="$(mktemp -d)"
trap 'rm -rf "$debs"' EXIT
# apt-get download writes to the current directory; as root it warns that the _apt user cannot
# write there (harmless), so the directory is made world-writable.
chmod 0777 "$debs"
(
  cd "$debs"
  pkgs=(libc6 libgcc-s1 libc-bin)
  # DCGM's libraries are C++: when one of them names libstdc++, Debian's comes along.
  if [[ -n "$dcgm_lib" ]] && find "$dcgm_lib" -name '*.so*' -type f -exec readelf -d {} + 2>/dev/null \
      | grep -q 'NEEDED.*\[libstdc++\.so\.6\]'; then
    pkgs+=(libstdc++6)
  fi
  apt-get download -q "${pkgs[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get download -q "${pkgs[@]}" >/dev/null; }
  for deb in *.deb; do dpkg-deb -x "$deb" unpacked; done
)
src="$debs/unpacked"

mkdir -p "$rootfs"/{usr/bin,sbin,lib64,"lib/$multiarch",etc/ld.so.conf.d,etc/dcgm-exporter,tmp,root}
chmod 1777 "$rootfs/tmp"
chmod 0700 "$rootfs/root"

# The loader and the libraries: libc, libm and libgcc_s for gpu-exporter (`ldd`); libdl,
# libpthread and librt because NVIDIA's libnvidia-ml.so.1 names them (glibc 2.34+ keeps them as
# stubs, but the files must exist).
for lib in "$loader" libc.so.6 libm.so.6 libgcc_s.so.1 libdl.so.2 libpthread.so.0 librt.so.1; do
  cp -L "$src/lib/$multiarch/$lib" "$rootfs/lib/$multiarch/$lib"
done
if [[ -n "$dcgm_lib" ]]; then
  mkdir -p "$rootfs/usr/lib/$multiarch"
  if [[ -e "$src/usr/lib/$multiarch/libstdc++.so.6" ]]; then
    cp -L "$src/usr/lib/$multiarch/libstdc++.so.6" "$rootfs/usr/lib/$multiarch/libstdc++.so.6"
  fi
  # Links stay links (libdcgm.so.4 -> libdcgm.so.4.x.y in DCGM's packages).
  cp -a "$dcgm_lib"/. "$rootfs/usr/lib/$multiarch/"
fi
if [[ "$loader" == ld-linux-x86-64.so.2 ]]; then
  ln -s "/lib/$multiarch/$loader" "$rootfs/lib64/$loader"
else
  ln -s "$multiarch/$loader" "$rootfs/lib/$loader"
fi
cp "$src/sbin/ldconfig" "$rootfs/sbin/ldconfig"
cp "$src/etc/ld.so.conf.d/"*.conf "$rootfs/etc/ld.so.conf.d/"
printf 'include /etc/ld.so.conf.d/*.conf\n' > "$rootfs/etc/ld.so.conf"

install -m 0755 "$binary" "$rootfs/usr/bin/gpu-exporter"
strip "$rootfs/usr/bin/gpu-exporter"
ln -s gpu-exporter "$rootfs/usr/bin/dcgm-exporter"
install -m 0644 "$repo"/metrics-config/upstream/*.csv "$rootfs/etc/dcgm-exporter/"
install -m 0644 "$repo/metrics-config/default-counters.csv" \
  "$rootfs/etc/dcgm-exporter/gpu-exporter-default-counters.csv"
install -m 0644 "$repo/metrics-config/dcgm-exporter-4.10-default-counters.csv" "$rootfs/etc/dcgm-exporter/"

cat > "$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
EOF
cat > "$rootfs/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF

# The image's own cache (the loader finds the libraries without it too; the toolkit rewrites it).
ldconfig -r "$rootfs"

# Every library the binary needs must resolve inside the image, with no host fallback.
missing="$(chroot "$rootfs" "/lib/$multiarch/$loader" --list /usr/bin/gpu-exporter 2>&1 | grep -c 'not found' || true)"
if [[ "$missing" != 0 ]]; then
  chroot "$rootfs" "/lib/$multiarch/$loader" --list /usr/bin/gpu-exporter >&2 || true
  echo "$0: libraries missing in the image" >&2
  exit 1
fi
chroot "$rootfs" /usr/bin/gpu-exporter --version >/dev/null
if [[ -n "$dcgm_lib" ]]; then
  # The loader finds libdcgm.so.4 by name through the image's cache, as dlopen does...
  if ! chroot "$rootfs" /sbin/ldconfig -p | grep -q "libdcgm.so.4 .*=> /usr/lib/$multiarch/libdcgm.so.4"; then
    chroot "$rootfs" /sbin/ldconfig -p >&2 || true
    echo "$0: /etc/ld.so.cache does not list /usr/lib/$multiarch/libdcgm.so.4" >&2
    exit 1
  fi
  # ...and every library DCGM's need resolves inside the image.
  for lib in "$rootfs/usr/lib/$multiarch/"libdcgm*.so*; do
    [[ -f "$lib" && ! -L "$lib" ]] || continue
    in_image="/usr/lib/$multiarch/$(basename "$lib")"
    # (A shared object's missing dependency is an error, not a "not found" line.)
    if ! listed="$(chroot "$rootfs" "/lib/$multiarch/$loader" --list "$in_image" 2>&1)" \
        || grep -q 'not found' <<<"$listed"; then
      echo "$listed" >&2
      echo "$0: $in_image needs libraries missing in the image" >&2
      exit 1
    fi
  done
fi
chroot "$rootfs" /usr/bin/dcgm-exporter --version >/dev/null
