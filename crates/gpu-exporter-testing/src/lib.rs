//! Test doubles for gpu-exporter, in a crate of their own so that the exporter's library and
//! binary build without them, their gRPC servers and their dependencies: a fake kubelet (the
//! pod-resources server and the node an assignments file describes), a fake container runtime
//! (CRI) and a fake NVML. The `fake-kubelet` binary serves the first two.
//!
//! The assignments file format itself belongs to the simulator
//! ([`gpu_exporter::gpu::sim::assignments`]: `--sim-processes` reads it); the fake kubelet builds
//! on that parser. The exporter never uses these doubles against a real kubelet, runtime or GPU.
//!
//! The exporter's own unit tests compile [`fake_nvml`] from this crate's source (behind
//! `#[cfg(test)]`): a crate's unit tests cannot take a dependency that depends on the crate. The
//! fake therefore names the exporter as `gpu_exporter::…`, which resolves in both crates.

pub mod fake_cri;
pub mod fake_kubelet;
pub mod fake_nvml;

/// The servers generated from the exporter's protos (build.rs), over the exporter's messages.
pub mod proto {
    /// The kubelet pod-resources v1 API's server.
    #[allow(missing_docs)]
    pub mod pod_resources {
        tonic::include_proto!("v1");
    }
    /// The CRI runtime v1 API's server.
    #[allow(missing_docs)]
    pub mod cri {
        tonic::include_proto!("runtime.v1");
    }
}
