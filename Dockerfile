# gpu-exporter's container image, for builders with Docker (or BuildKit, podman, kaniko):
#   docker build -t gpu-exporter .
# Without Docker, scripts/build-image.sh builds the same image with buildah. Both fill the image
# with scripts/image-rootfs.sh: the binary, every metrics CSV at /etc/dcgm-exporter/, Debian 12's
# glibc runtime (loader, libc, libm, libgcc_s and the libdl/libpthread/librt stubs
# libnvidia-ml.so.1 names), ldconfig with /etc/ld.so.conf for the NVIDIA Container Toolkit, and
# /etc/passwd, /etc/group, /tmp. About 14 MB unpacked (docs/deploy.md).

# Debian 12 (bookworm): the runtime libraries come from the same release the binary links against.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin gpu-exporter \
 && scripts/image-rootfs.sh target/release/gpu-exporter /rootfs

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
