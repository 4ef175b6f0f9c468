//! gpu-exporter: a Prometheus exporter for NVIDIA GPUs, compatible with dcgm-exporter.
//!
//! # Layout
//!
//! The pipeline is the architecture: **sample → attribute → snapshot → render → serve**.
//!
//! - [`config`]: command line and environment (dcgm-exporter's flag names) → resolved config.
//! - [`catalog`]: the metrics CSV (dcgm-exporter's format) and the DCGM field dictionary.
//! - [`gpu`]: the [`gpu::GpuSource`] seam and its implementations ([`gpu::sim`]).
//!   [`gpu::nvml`] is layered, each file importing only from below: the source with its
//!   lifecycle and discovery; the per-tick read; the source's state; the readers that keep state
//!   between ticks (NVLink, processes, XID events); what NVML answers mean; the DCGM-field
//!   mapping; the `NvmlApi` seam and its implementations (its module doc has the details).
//! - [`pods`]: who holds which GPU (kubelet pod-resources client, id mapping with DRA,
//!   refresher) and who uses it (container runtime client, cgroup parsing, per-container usage).
//! - [`hpc`]: which HPC jobs run on which GPU (`--hpc-job-mapping-dir`).
//! - [`health`]: XID / clock-event windows and health derivation (pure).
//! - [`snapshot`]: samples + attribution → metric families with dcgm-exporter's labels (pure):
//!   device selection, labels, per-holder copies, entities, series, pod families.
//! - [`render`]: families → Prometheus text 0.0.4 (pure).
//! - [`sampler`]: the loop that ties the above together once per interval and publishes bytes
//!   (its parts: which fields a tick reads, the blocking read, per-process attribution, the
//!   first sample's wait for attribution, the published body, its own self-metrics).
//! - [`self_metrics`]: what the modules' own `gpu_exporter_*` families share (the
//!   prometheus-client registry, its 0.0.4 encoding, collector helpers); imports nothing from
//!   the crate. Each module defines and updates its own families (`http::metrics`,
//!   `sampler::metrics`, `pods::refresher`, `pods::cri_refresher`, `pods::usage`, `hpc`,
//!   `reload`, `web::metrics`); [`exporter_metrics`] registers them all, in body order, into
//!   the one registry the sampler encodes into every body (`main.rs` and the tests build it).
//! - [`process_metrics`]: the standard `process_*` series (`--enable-exporter-metrics`).
//! - [`http`]: `/metrics`, `/health`, `/ready` (routes); per-phase connection deadlines and
//!   eviction at the connection limits (conn, io, limits), so that floods never lock the scraper
//!   out; its own self-metrics (metrics).
//! - [`web`]: `--web-config-file` (TLS, mTLS, basic auth, headers), re-read on change.
//! - [`godur`]: Go's duration syntax (`1h30m`, `1.5s`), for flags and files in Go's format.
//! - [`reload`]: metrics CSV hot reload (SIGHUP, file change).
//! - [`listen_on`]: where to listen, decided by [`config`] and bound by [`http`].
//! - [`fsread`]: the one bounded file reader every configuration and `/proc` read goes through.
//! - [`yamldepth`]: the nesting bound YAML files are checked against before they are parsed.
//! - [`logsink`]: the log writer that never fails the code that logs.
//! - [`supervise`]: the essential tasks, whose end stops the process.
//!
//! `main.rs` is the only composition root; it builds [`exporter_metrics::ExporterMetrics`]
//! once and hands each module its own families.
//!
//! # `unsafe`
//!
//! `unsafe_code` is denied for the whole crate (`[lints.rust]` in `Cargo.toml`). Exactly three
//! modules allow it, each with `#![allow(unsafe_code)]` at its top and the reason in its header:
//!
//! - `gpu::nvml::ffi`: NVML calls `nvml-wrapper` lacks or gets wrong, through its loaded symbol
//!   table;
//! - `gpu::dcgm::ffi`: DCGM's C ABI (`libdcgm.so.4`), loaded with `dlopen` at run time;
//! - [`http::listen`]: adopting the listening socket systemd passes (fd 3) for
//!   `--web-systemd-socket`.
//!
//! Every `unsafe` block and `unsafe impl` there carries a `// SAFETY:` note saying why it is
//! sound (clippy's `undocumented_unsafe_blocks`, in `[lints.clippy]`, fails the build without
//! one). Nowhere else in the crate is `unsafe` allowed.

// The test doubles live in crates/gpu-exporter-testing. The unit tests of `gpu::nvml` need the
// fake NVML, and a crate's unit tests cannot depend on a crate that depends on it, so they compile
// its source here; it names this crate `gpu_exporter::…`, as from the outside.
#[cfg(test)]
extern crate self as gpu_exporter;
// Not every part of the fake is used by these tests (the rest is for the integration tests).
#[cfg(test)]
#[path = "../crates/gpu-exporter-testing/src/fake_nvml/mod.rs"]
#[allow(unused_imports, dead_code)]
mod fake_nvml;

pub mod accounting;
pub mod catalog;
pub mod config;
pub mod exporter_metrics;
pub mod fsread;
pub mod godur;
pub mod gpu;
pub mod gzip;
pub mod health;
pub mod hpc;
pub mod http;
pub mod kubeapi;
pub mod listen_on;
pub mod logsink;
pub mod pods;
pub mod process_metrics;
pub mod reload;
pub mod render;
pub mod sampler;
pub mod self_metrics;
pub mod snapshot;
pub mod supervise;
pub mod web;
pub mod yamldepth;

/// Formats an error with its chain of causes: `outer: cause: root cause`.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Resolves on the first Ctrl-C (SIGINT) or SIGTERM: the stop signal of every binary here
/// (the exporter, fake-kubelet, fleet-sim). If a signal cannot be listened for, waiting on it
/// never resolves (and a failed Ctrl-C listener resolves at once, as tokio reports it).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
