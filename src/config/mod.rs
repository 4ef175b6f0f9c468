//! Command line and environment: [`Args`] (what the user typed, validated by clap) and
//! [`Config`] (resolved: files read, addresses parsed, hostname decided).
//!
//! Flag and environment variable names are dcgm-exporter's, so an existing DaemonSet or GPU
//! Operator setup keeps working. Flags that only make sense for DCGM are accepted and reported
//! once at startup as having no effect; flags for features that are not built yet refuse to
//! start rather than be silently ignored.
//!
//! - [`goflags`]: dcgm-exporter's (Go's) syntax on top of clap: `--bool=false`, ParseBool
//!   environment values, empty variables unset, errors naming the variable; which settings were
//!   given explicitly.
//! - [`file`](mod@file): dcgm-exporter's YAML `--config-file`, applied to what was not given explicitly.
//! - `args`: the clap [`Args`] (flags, environment variables, defaults) and their enums.
//! - `resolve`: [`Config::resolve`], from [`Args`] to [`Config`]: files read, flags checked
//!   against each other, notices for flags without effect; `error`: its [`ConfigError`].
//! - `values`: parsers of single flag values (`--address`, `--devices`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

mod args;
mod error;
pub mod file;
pub mod goflags;
mod inert;
mod resolve;
#[cfg(test)]
mod tests;
mod values;

/// Re-exported from [`crate::pods`], where it belongs (the mapping interprets it).
pub use crate::pods::GpuIdType;
pub use args::{Args, Backend, LogFormat, PodMetadataSource};
pub use error::ConfigError;
pub use values::{parse_address, parse_devices};

use crate::catalog::{self, Catalog, MetricSpec, Skipped};
use crate::gpu::sim::scenario::Scenario;
use crate::snapshot::{BuildOptions, DeviceSelection};

/// The metrics CSV shipped with gpu-exporter, used when `--collectors` is not given and
/// dcgm-exporter's default path does not exist.
pub const BUILTIN_COUNTERS: &str = include_str!("../../metrics-config/default-counters.csv");

/// dcgm-exporter's default `--collectors` path.
pub const DCGM_DEFAULT_COLLECTORS: &str = "/etc/dcgm-exporter/default-counters.csv";

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The metrics catalog.
    pub catalog: Catalog,
    /// Where the catalog came from (for logs).
    pub catalog_origin: String,
    /// The CSV file the catalog was read from (`None`: the built-in copy); watched for reloads.
    pub catalog_path: Option<PathBuf>,
    /// Rows naming DCGM fields gpu-exporter does not collect.
    pub skipped: Vec<Skipped>,
    /// Socket address to bind (`:PORT`: 0.0.0.0:PORT; see `listen_on`).
    pub listen: SocketAddr,
    /// Where to listen: `:PORT` is every address of both IP families.
    pub listen_on: crate::listen_on::ListenOn,
    /// Sampling interval.
    pub interval: Duration,
    /// Hostname label value.
    pub hostname: String,
    /// Entity selection.
    pub selection: DeviceSelection,
    /// The scenario, if any.
    pub scenario: Option<(Scenario, String)>,
    /// Notes about accepted-but-inert flags, logged once at startup.
    pub notices: Vec<String>,
    /// Compiled `--kubernetes-pod-label-allowlist-regex`.
    pub label_allowlist: Vec<regex::Regex>,
    /// Per-process attribution is on (`--kubernetes-process-usage` or
    /// `--kubernetes-virtual-gpus`, with `-k`).
    pub process_usage: bool,
    /// The container runtime client runs (`-k` with pod UIDs, pod labels or process usage, or
    /// `--container-labels` without `-k`).
    pub cri: bool,
    /// `-m` / `--configmap-data`: the metrics CSV is read from this ConfigMap at startup
    /// (then [`Config::use_catalog`]).
    pub configmap: Option<crate::kubeapi::configmap::ConfigMapRef>,
    /// `--container-labels` is in effect (given, without `-k`, with a runtime socket).
    pub container_labels: bool,
    /// The raw arguments.
    pub args: Args,
}

impl Config {
    /// How snapshots are built: labels, selection and the label flags.
    pub fn build_options(&self) -> BuildOptions {
        BuildOptions {
            hostname_label: self.args.hostname_label.clone(),
            // An empty hostname is no label (-n/--no-hostname).
            hostname: if self.args.no_hostname {
                String::new()
            } else {
                self.hostname.clone()
            },
            replace_blanks_in_model_name: self.args.replace_blanks_in_model_name,
            selection: self.selection.clone(),
            virtual_gpus: self.args.kubernetes_virtual_gpus,
            xid_window_ms: self.args.xid_count_window_size,
            clock_window_ms: self.args.clock_events_count_window_size,
            pod_uid: self.args.kubernetes_enable_pod_uid,
            container_labels: self.container_labels,
            old_namespace: self.args.use_old_namespace,
        }
    }

    /// Where pod UIDs and labels come from, given whether the container runtime's socket exists
    /// now: the runtime when per-process usage or `--container-labels` needs it anyway, or
    /// `--pod-metadata-source cri`, or (`auto`) its socket exists; else the Kubernetes API.
    /// `None` when neither pod UIDs, pod labels nor per-process usage are asked for.
    pub fn pod_metadata(&self, runtime_socket_exists: bool) -> Option<PodMetadataSource> {
        if !self.cri {
            return None;
        }
        let needs_runtime = self.process_usage || self.container_labels;
        Some(match self.args.pod_metadata_source {
            _ if needs_runtime => PodMetadataSource::Cri,
            PodMetadataSource::Auto if runtime_socket_exists => PodMetadataSource::Cri,
            PodMetadataSource::Auto | PodMetadataSource::Api => PodMetadataSource::Api,
            PodMetadataSource::Cri => PodMetadataSource::Cri,
        })
    }

    /// The container runtime endpoint's socket path (`unix:///x` or `/x`).
    pub fn runtime_socket_path(&self) -> std::path::PathBuf {
        let e = &self.args.container_runtime_endpoint;
        std::path::PathBuf::from(e.strip_prefix("unix://").unwrap_or(e))
    }

    /// Replaces the metrics CSV with one read at startup from elsewhere (the ConfigMap of `-m`),
    /// named `origin`; it is not reloaded.
    pub fn use_catalog(&mut self, catalog: Catalog, skipped: Vec<Skipped>, origin: String) {
        self.catalog = catalog;
        self.skipped = skipped;
        self.catalog_origin = origin;
        self.catalog_path = None;
    }

    /// Drops CSV rows the source cannot read; returns them for one warning each.
    pub fn retain_supported(
        &mut self,
        supported: impl Fn(catalog::Field) -> bool,
    ) -> Vec<MetricSpec> {
        self.catalog.retain_supported(supported)
    }
}

/// Whether the text log may use ANSI colours: only when stderr is a terminal, and never when
/// `NO_COLOR` is set to a non-empty value (<https://no-color.org>).
pub fn log_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}
