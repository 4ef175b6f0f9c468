//! [`ConfigError`]: what can be wrong with the configuration, each naming the flag (and file).

use super::file;
use crate::catalog::CatalogError;
use crate::gpu::sim::scenario::ScenarioError;

/// Errors resolving the configuration. Each names the flag (and file) concerned.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The metrics CSV is unreadable or invalid.
    #[error("--collectors")]
    Catalog(#[source] CatalogError),
    /// The scenario file is unreadable or invalid.
    #[error("--sim-scenario")]
    Scenario(#[source] ScenarioError),
    /// The listen address does not parse.
    #[error("--address {0:?}: expected :PORT, HOST:PORT or [IPv6]:PORT")]
    Address(String),
    /// The listen address is well-formed but unusable: a port out of range, an unknown IPv6
    /// zone, a name that does not resolve.
    #[error("--address {value:?}: {reason}")]
    AddressValue {
        /// What was given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The device selection does not parse.
    #[error("--devices {value:?}: {reason}")]
    Devices {
        /// What was given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The switch selection does not parse.
    #[error("--switch-devices {value:?}: {reason}")]
    SwitchDevices {
        /// What was given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The pod-resources TTL is shorter than the refresh period.
    #[error("--pod-resources-ttl {ttl}: must be at least --pod-resources-refresh ({refresh} ms)")]
    PodResourcesTtl {
        /// The TTL, ms.
        ttl: u64,
        /// The refresh period, ms.
        refresh: u64,
    },
    /// The container runtime TTL is shorter than its refresh period.
    #[error("--cri-ttl {ttl}: must be at least --cri-refresh ({refresh} ms)")]
    CriTtl {
        /// The TTL, ms.
        ttl: u64,
        /// The refresh period, ms.
        refresh: u64,
    },
    /// A pod label allowlist pattern is not a valid regex.
    #[error("--kubernetes-pod-label-allowlist-regex {pattern:?}: not a valid regex")]
    AllowlistRegex {
        /// The pattern.
        pattern: String,
        /// The cause.
        #[source]
        cause: regex::Error,
    },
    /// The `--config-file` is unusable.
    #[error("--config-file")]
    File(#[source] file::FileError),
    /// `--container-runtime-socket` and `--container-runtime-endpoint` disagree.
    #[error("--container-runtime-socket {socket:?} and --container-runtime-endpoint {endpoint:?} name different sockets; give one")]
    RuntimeSocket {
        /// The socket path.
        socket: String,
        /// The endpoint.
        endpoint: String,
    },
    /// `--container-labels` outside Kubernetes mode without a runtime socket (dcgm-exporter's
    /// own startup error).
    #[error(
        "--container-labels requires --container-runtime-socket or DCGM_CONTAINER_RUNTIME_SOCKET"
    )]
    ContainerLabelsSocket,
    /// An error in a value that came from an environment variable.
    #[error("environment variable {var}")]
    FromEnv {
        /// The variable.
        var: String,
        /// The error, naming the flag.
        #[source]
        source: Box<ConfigError>,
    },
    /// `-m` / `--configmap-data` is not `NAMESPACE:NAME`.
    #[error("--configmap-data / -m {value:?}: {reason}")]
    ConfigMapData {
        /// The value.
        value: String,
        /// Why.
        reason: &'static str,
    },
}

impl ConfigError {
    /// The `Args` field whose value is at fault.
    pub(super) fn arg(&self) -> Option<&'static str> {
        Some(match self {
            ConfigError::Catalog(_) => "collectors",
            ConfigError::Scenario(_) => "sim_scenario",
            ConfigError::Address(_) | ConfigError::AddressValue { .. } => "address",
            ConfigError::Devices { .. } => "devices",
            ConfigError::SwitchDevices { .. } => "switch_devices",
            ConfigError::PodResourcesTtl { .. } => "pod_resources_ttl",
            ConfigError::CriTtl { .. } => "cri_ttl",
            ConfigError::AllowlistRegex { .. } => "kubernetes_pod_label_allowlist_regex",
            ConfigError::File(_) => "config_file",
            ConfigError::RuntimeSocket { .. } => "container_runtime_socket",
            ConfigError::ContainerLabelsSocket => "container_labels",
            ConfigError::ConfigMapData { .. } => "configmap_data",
            ConfigError::FromEnv { .. } => return None,
        })
    }
}
