//! Test doubles, kept apart from the product so that a reader of the exporter does not trip
//! over them: a fake kubelet (its assignments file and pod-resources server), a fake container
//! runtime (CRI) and a fake NVML.
//!
//! They are compiled into the library, not behind a feature, because more than tests use them:
//! the `fake-kubelet` binary serves the first two (CI builds it with `cargo build --release
//! --bins`), and the simulated backend's `--sim-processes` reads the assignments file format.
//! The exporter never uses them against a real kubelet, runtime or GPU.

pub mod fake_cri;
pub mod fake_kubelet;
pub mod fake_nvml;
