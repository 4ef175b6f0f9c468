# gpu-exporter's container image, for builders with Docker (or BuildKit, podman, kaniko):
#   docker build -t gpu-exporter .                        the image (default target)
#   docker build --target dcgm -t gpu-exporter:dcgm .     the variant with DCGM's libraries
# Without Docker, scripts/build-image.sh builds the same images with buildah (`--dcgm-lib DIR` for
# the variant). Both fill the image with scripts/image-rootfs.sh: the binary, every metrics CSV at
# /etc/dcgm-exporter/, Debian 12's glibc runtime (loader, libc, libm, libgcc_s and the
# libdl/libpthread/librt stubs libnvidia-ml.so.1 names), ldconfig with /etc/ld.so.conf for the
# NVIDIA Container Toolkit, and /etc/passwd, /etc/group, /tmp. About 14 MB unpacked
# (docs/deploy.md).
#
# The `dcgm` variant adds DCGM's libraries (libdcgm.so.4, its modules, among them the profiling
# module, and libnvperf_dcgm_host) at /usr/lib/x86_64-linux-gnu/, where DCGM's packages and
# dcgm-exporter's image have them, in the ld cache. With it the DCGM_FI_PROF_* fields of GPUs
# before Hopper (A100, L40S, T4...) are served: DCGM embedded in the exporter when no -r is given
# (the GPU Operator's default), or the standalone hostengine with -r / DCGM_REMOTE_HOSTENGINE_INFO.
# The libraries come from NVIDIA's DCGM image of the DCGM release dcgm-exporter 4.8.2 pairs with
# (4.5.3; x86_64); CI cannot pull it and builds the same layout with the libdcgm stand-in.
ARG DCGM_IMAGE=nvcr.io/nvidia/cloud-native/dcgm:4.5.3-1-ubuntu22.04

FROM ${DCGM_IMAGE} AS dcgm-image

# Debian 12 (bookworm): the runtime libraries come from the same release the binary links against.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin gpu-exporter \
 && scripts/image-rootfs.sh target/release/gpu-exporter /rootfs

FROM build AS build-dcgm
COPY --from=dcgm-image /usr/lib/x86_64-linux-gnu/ /dcgm-image-lib/
RUN mkdir /dcgm-lib \
 && cp -a /dcgm-image-lib/libdcgm*.so* /dcgm-lib/ \
 && (cp -a /dcgm-image-lib/libnvperf_dcgm_host*.so* /dcgm-lib/ 2>/dev/null || true) \
 && scripts/image-rootfs.sh --dcgm-lib /dcgm-lib target/release/gpu-exporter /rootfs-dcgm

FROM scratch AS dcgm
COPY --from=build-dcgm /rootfs-dcgm/ /
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility,compat32 \
    NVIDIA_DISABLE_REQUIRE=true \
    PATH=/usr/bin:/sbin
LABEL org.opencontainers.image.title=gpu-exporter \
      org.opencontainers.image.licenses=Apache-2.0 \
      org.opencontainers.image.description="Prometheus exporter for NVIDIA GPUs; a drop-in replacement for dcgm-exporter (with DCGM's libraries)"
EXPOSE 9400
USER 0:0
WORKDIR /
ENTRYPOINT ["/usr/bin/gpu-exporter"]

# The default target (last): the image without DCGM.
FROM scratch
COPY --from=build /rootfs/ /
# What dcgm-exporter's image sets: the toolkit injects the driver's libraries (NVML) for these.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility,compat32 \
    NVIDIA_DISABLE_REQUIRE=true \
    PATH=/usr/bin:/sbin
LABEL org.opencontainers.image.title=gpu-exporter \
      org.opencontainers.image.licenses=Apache-2.0 \
      org.opencontainers.image.description="Prometheus exporter for NVIDIA GPUs; a drop-in replacement for dcgm-exporter"
EXPOSE 9400
# uid 0: the kubelet's pod-resources socket is root's, mode 0600 (docs/deploy.md). The chart
# and the DaemonSet can run it as another user.
USER 0:0
WORKDIR /
# The GPU Operator and dcgm-exporter's chart pass only arguments: the entrypoint is the exporter.
ENTRYPOINT ["/usr/bin/gpu-exporter"]
