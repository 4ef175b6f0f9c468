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
//! - [`file`]: dcgm-exporter's YAML `--config-file`, applied to what was not given explicitly.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

pub mod file;
pub mod goflags;
mod inert;

use crate::catalog::{self, Catalog, CatalogError, MetricSpec, Skipped};
use crate::gpu::scenario::{self, Scenario, ScenarioError};
use crate::snapshot::{BuildOptions, DeviceSelection};

/// The metrics CSV shipped with gpu-exporter, used when `--collectors` is not given and
/// dcgm-exporter's default path does not exist.
pub const BUILTIN_COUNTERS: &str = include_str!("../../metrics-config/default-counters.csv");

/// dcgm-exporter's default `--collectors` path.
pub const DCGM_DEFAULT_COLLECTORS: &str = "/etc/dcgm-exporter/default-counters.csv";

/// Which GPU backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Real GPUs through NVML.
    Nvml,
    /// The simulated fleet.
    Sim,
    /// NVML when `libnvidia-ml.so.1` loads, the simulated fleet otherwise (for demos).
    Auto,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// How kubelet device ids are matched to GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GpuIdType {
    /// GPU and MIG UUIDs (NVIDIA device plugin).
    Uid,
    /// `nvidia<N>` device names (GKE's device plugin).
    DeviceName,
}

/// Raw command-line arguments. Every flag can also be set from the environment variable shown.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "gpu-exporter",
    version,
    about = "Prometheus exporter for NVIDIA GPUs; a drop-in replacement for dcgm-exporter"
)]
pub struct Args {
    /// Metrics CSV (dcgm-exporter format). Default: /etc/dcgm-exporter/default-counters.csv if it
    /// exists, else the built-in copy of metrics-config/default-counters.csv.
    #[arg(short = 'f', long, env = "DCGM_EXPORTER_COLLECTORS")]
    pub collectors: Option<PathBuf>,

    /// Listen address: `:9400`, `127.0.0.1:9400`, `[::]:9400`.
    #[arg(
        short = 'a',
        long,
        env = "DCGM_EXPORTER_LISTEN",
        default_value = ":9400"
    )]
    pub address: String,

    /// Sampling interval in milliseconds.
    #[arg(short = 'c', long, env = "DCGM_EXPORTER_INTERVAL", default_value_t = 30000,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub collect_interval: u64,

    /// Attribute GPUs to pods through the kubelet pod-resources API.
    #[arg(short = 'k', long, env = "DCGM_EXPORTER_KUBERNETES")]
    pub kubernetes: bool,

    /// How kubelet device ids name GPUs: `uid` (NVIDIA device plugin) or `device-name` (GKE).
    #[arg(
        long,
        env = "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE",
        value_enum,
        default_value = "uid"
    )]
    pub kubernetes_gpu_id_type: GpuIdType,

    /// The kubelet pod-resources socket.
    #[arg(
        long,
        env = "DCGM_POD_RESOURCES_KUBELET_SOCKET",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    pub pod_resources_kubelet_socket: PathBuf,

    /// How often to ask the kubelet who holds which GPU, ms (never per scrape).
    #[arg(long, env = "GPU_EXPORTER_POD_RESOURCES_REFRESH", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub pod_resources_refresh: u64,

    /// How long the last good kubelet answer is used while the kubelet does not answer, ms;
    /// then pod labels are dropped rather than left wrong. At least the refresh period.
    #[arg(long, env = "GPU_EXPORTER_POD_RESOURCES_TTL", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub pod_resources_ttl: u64,

    /// Timeout of one kubelet pod-resources call, ms.
    #[arg(long, env = "GPU_EXPORTER_POD_RESOURCES_TIMEOUT", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub pod_resources_timeout: u64,

    /// Print the GPUs and MIG instances the backend finds (index, UUID, minor, MIG UUIDs) and
    /// exit; handy for writing fake-kubelet assignment files for the simulated fleet.
    #[arg(long)]
    pub list_devices: bool,

    /// Extra resource names that denote NVIDIA GPUs (comma-separated), e.g. `nvidia.com/a100`.
    #[arg(long, env = "NVIDIA_RESOURCE_NAMES", value_delimiter = ',')]
    pub nvidia_resource_names: Vec<String>,

    /// One copy of each series per pod sharing a GPU, with a `vgpu` label (as dcgm-exporter);
    /// `DCGM_FI_DEV_GPU_UTIL` and `DCGM_FI_DEV_FB_USED` then carry each holder's own use.
    /// Implies --kubernetes-process-usage.
    #[arg(long, env = "KUBERNETES_VIRTUAL_GPUS")]
    pub kubernetes_virtual_gpus: bool,

    /// Add a `pod_uid` label wherever pod labels appear. Read from the container runtime
    /// (--container-runtime-endpoint); no API server access.
    #[arg(long, env = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID")]
    pub kubernetes_enable_pod_uid: bool,

    /// Copy each pod's Kubernetes labels (names sanitised) wherever its pod labels appear. Read
    /// from the container runtime's sandbox labels; no API server access.
    #[arg(long, env = "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS")]
    pub kubernetes_enable_pod_labels: bool,

    /// Regexes (comma-separated) on pod label keys: only matching labels are copied. Empty:
    /// every label. Needs --kubernetes-enable-pod-labels.
    #[arg(
        long,
        env = "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX",
        value_delimiter = ','
    )]
    pub kubernetes_pod_label_allowlist_regex: Vec<String>,

    /// Per-container GPU use on every GPU and MIG instance (gpu_exporter_container_* series),
    /// from per-process NVML readings, the processes' cgroups under --path.procfs and the
    /// container runtime. Needs -k; see docs/pods.md for the mounts.
    #[arg(long, env = "GPU_EXPORTER_KUBERNETES_PROCESS_USAGE")]
    pub kubernetes_process_usage: bool,

    /// The host's /proc, to map GPU processes (host PIDs) to containers: /proc with hostPID,
    /// or the host's /proc mounted elsewhere (/host/proc in the shipped DaemonSet).
    #[arg(
        long = "path.procfs",
        env = "GPU_EXPORTER_PATH_PROCFS",
        default_value = "/proc"
    )]
    pub path_procfs: PathBuf,

    /// The container runtime's CRI socket (read-only use: ListPodSandbox, ListContainers):
    /// containerd unix:///run/containerd/containerd.sock, CRI-O unix:///run/crio/crio.sock,
    /// cri-dockerd unix:///run/cri-dockerd.sock, k3s unix:///run/k3s/containerd/containerd.sock.
    #[arg(
        long,
        env = "CONTAINER_RUNTIME_ENDPOINT",
        default_value = crate::pods::cri::DEFAULT_ENDPOINT
    )]
    pub container_runtime_endpoint: String,

    /// How often to list the container runtime's pods and containers, ms (never per scrape).
    #[arg(long, env = "GPU_EXPORTER_CRI_REFRESH", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub cri_refresh: u64,

    /// How long the last good container runtime answer is used while the runtime does not
    /// answer, ms; then pod_uid, pod labels and per-container usage are dropped. At least the
    /// refresh period.
    #[arg(long, env = "GPU_EXPORTER_CRI_TTL", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub cri_ttl: u64,

    /// Timeout of one container runtime call, ms.
    #[arg(long, env = "GPU_EXPORTER_CRI_TIMEOUT", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub cri_timeout: u64,
    /// With -k: attribute GPUs and MIG instances allocated through DRA ResourceClaims by
    /// NVIDIA's DRA driver (gpu.nvidia.com), with `dra_*` labels. Resolved on the node; no API
    /// server access.
    #[arg(long, env = "KUBERNETES_ENABLE_DRA")]
    pub kubernetes_enable_dra: bool,

    /// Directory of HPC job mapping files (dcgm-exporter's format): one file per GPU named by its
    /// index (`0`) or per MIG instance (`0.3`: GPU index . GPU_I_ID), one job id per line. Each
    /// series of that GPU or instance gets an `hpc_job` label, one copy per job.
    #[arg(long, env = "DCGM_HPC_JOB_MAPPING_DIR")]
    pub hpc_job_mapping_dir: Option<PathBuf>,

    /// Devices to export: `f` (MIG instances where enabled, else GPUs), `g[:ids]` (GPUs),
    /// `i[:ids]` (MIG instances by GPU instance id). Ids: `0,2-4`.
    #[arg(
        short = 'd',
        long,
        env = "DCGM_EXPORTER_DEVICES_STR",
        default_value = "f"
    )]
    pub devices: String,

    /// NVSwitches and their links to export: `f`, `g[:ids]` (switch ids), `i[:ids]` (link
    /// indices), as dcgm-exporter. gpu-exporter has no NVSwitch entities (they need NVIDIA's NSCQ
    /// library), so anything but `f` is reported at startup as having no effect; GPU NVLink
    /// series follow `--devices`, as in dcgm-exporter.
    #[arg(
        short = 's',
        long,
        env = "DCGM_EXPORTER_OTHER_DEVICES_STR",
        default_value = "f"
    )]
    pub switch_devices: String,

    /// dcgm-exporter 1.x label names, for old dashboards: `uuid` instead of `UUID`, and
    /// `pod_name`, `pod_namespace`, `container_name` instead of `pod`, `namespace`, `container`.
    #[arg(short = 'o', long, env = "DCGM_EXPORTER_USE_OLD_NAMESPACE")]
    pub use_old_namespace: bool,

    /// exporter-toolkit web configuration file (TLS, mTLS, basic auth, headers); re-read when it
    /// or the certificates it names change. See docs/security.md.
    #[arg(long, env = "DCGM_EXPORTER_WEB_CONFIG_FILE")]
    pub web_config_file: Option<PathBuf>,

    /// HTTP connections open at once. At the limit a new connection is still admitted: the
    /// least useful open one (not yet a complete request, else idle the longest) of the client
    /// holding the most is closed for it. 0: the file descriptor limit less 128, at most 4096.
    #[arg(long, env = "GPU_EXPORTER_HTTP_MAX_CONNECTIONS", default_value_t = 0)]
    pub http_max_connections: usize,

    /// HTTP connections past their first byte (TLS handshake, request, keep-alive: each holds
    /// buffers) at once; the bound on memory. At the limit another active connection is
    /// closed the same way. At most --http-max-connections.
    #[arg(long, env = "GPU_EXPORTER_HTTP_MAX_ACTIVE_CONNECTIONS",
          default_value_t = crate::http::conn::DEFAULT_MAX_ACTIVE_CONNECTIONS as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_active_connections: u64,

    /// Replace spaces in the `modelName` label with `-`.
    #[arg(
        long,
        visible_alias = "rbmn",
        env = "DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME"
    )]
    pub replace_blanks_in_model_name: bool,

    /// Window for `DCGM_EXP_XID_ERRORS_COUNT` (and how long the last XID is reported), ms.
    #[arg(
        short = 'x',
        long,
        env = "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE",
        default_value_t = 300_000
    )]
    pub xid_count_window_size: u64,

    /// Window for `DCGM_EXP_CLOCK_EVENTS_COUNT`, ms.
    #[arg(
        long,
        env = "DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE",
        default_value_t = 300_000
    )]
    pub clock_events_count_window_size: u64,

    /// Log format.
    #[arg(
        long,
        env = "DCGM_EXPORTER_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Debug logging.
    #[arg(long, env = "DCGM_EXPORTER_DEBUG")]
    pub debug: bool,

    /// Node name for the hostname label (set from the downward API in Kubernetes).
    #[arg(long, env = "NODE_NAME", hide = true)]
    pub node_name: Option<String>,

    /// GPU backend.
    #[arg(long, env = "GPU_EXPORTER_BACKEND", value_enum, default_value = "nvml")]
    pub backend: Backend,

    /// With `--backend nvml`: exit with an error when NVML cannot be initialised or finds no
    /// GPU, instead of retrying in the background with `/ready` failing.
    #[arg(long, env = "GPU_EXPORTER_REQUIRE_GPUS")]
    pub require_gpus: bool,

    /// Simulated fleet: 1xA100-40GB, 8xH100-SXM, 4xA100-80GB-MIG, or the scale profiles
    /// 64xH100-SXM and 8xA100-80GB-7xMIG (default 8xH100-SXM, or the scenario's profile).
    #[arg(long, env = "GPU_EXPORTER_SIM_PROFILE")]
    pub sim_profile: Option<String>,

    /// Scenario file (TOML) scripting events for the simulated fleet.
    #[arg(long, env = "GPU_EXPORTER_SIM_SCENARIO")]
    pub sim_scenario: Option<PathBuf>,

    /// Processes for the simulated fleet: a fake-kubelet assignments file whose `pids` run on
    /// the devices their assignment lists (docs/pods.md).
    #[arg(long, env = "GPU_EXPORTER_SIM_PROCESSES")]
    pub sim_processes: Option<PathBuf>,

    /// Seed for the simulated fleet (default 1, or the scenario's seed).
    #[arg(long, env = "GPU_EXPORTER_SIM_SEED")]
    pub sim_seed: Option<u64>,

    /// Name of the hostname label: `hostname` (dcgm-exporter ≥ 4.8.3) or `Hostname` (older
    /// releases and the dashboards built for them).
    #[arg(long, env = "GPU_EXPORTER_HOSTNAME_LABEL", default_value = "hostname",
          value_parser = ["hostname", "Hostname"])]
    pub hostname_label: String,

    /// DCGM hostengine (`host:port` or a unix socket path), e.g. the GPU Operator's
    /// `nvidia-dcgm:5555`: serves the DCGM_FI_PROF_* fields NVML cannot read (GPUs before
    /// Hopper) through `libdcgm.so.4`. NVML stays the source of everything else.
    #[arg(short = 'r', long, env = "DCGM_REMOTE_HOSTENGINE_INFO", hide = true)]
    pub remote_hostengine_info: Option<String>,

    /// dcgm-exporter's DCGM log switch. No effect: there is no DCGM.
    #[arg(long, env = "DCGM_EXPORTER_ENABLE_DCGM_LOG", hide = true)]
    pub enable_dcgm_log: bool,

    /// dcgm-exporter's DCGM log level. No effect: there is no DCGM.
    #[arg(long, env = "DCGM_EXPORTER_DCGM_LOG_LEVEL", hide = true)]
    pub dcgm_log_level: Option<String>,

    /// dcgm-exporter's libdcgm check switch. No effect: there is no libdcgm to check.
    #[arg(long, env = "DISABLE_STARTUP_VALIDATE", hide = true)]
    pub disable_startup_validate: bool,

    /// dcgm-exporter's ConfigMap source for the CSV. Not supported: mount the ConfigMap as a file
    /// and pass it with --collectors.
    #[arg(short = 'm', long, env = "DCGM_EXPORTER_CONFIGMAP_DATA", hide = true)]
    pub configmap_data: Option<String>,

    /// dcgm-exporter's YAML configuration file (`version: 1` or `2`): `metrics.file`,
    /// `metrics.fields`, `metrics.enableExporterMetrics`, the collection interval and
    /// `server.maxConcurrentScrapes` apply; DCGM watch settings are accepted and reported as
    /// having no effect. Flags and environment variables given explicitly win over the file.
    #[arg(long, env = "DCGM_EXPORTER_CONFIG_FILE")]
    pub config_file: Option<PathBuf>,

    /// Deadline for reading a request's head (Go duration: `10s`, `1m30s`). Default 10s. The
    /// first byte of a new connection must still come within 2 s (docs/security.md).
    #[arg(long, env = "DCGM_EXPORTER_WEB_READ_TIMEOUT", value_parser = goflags::parse_duration)]
    pub web_read_timeout: Option<Duration>,

    /// Deadline from a request's head to the last byte of its response (Go duration). Default
    /// 60s; a handler slower than min(30s, this) gets 503.
    #[arg(long, env = "DCGM_EXPORTER_WEB_WRITE_TIMEOUT", value_parser = goflags::parse_duration)]
    pub web_write_timeout: Option<Duration>,

    /// `/metrics` responses being sent at once; more get 503 at once. 0: no limit. Every scrape
    /// sends the same pre-rendered body, so overlapping scrapes are coalesced by construction
    /// and this bounds only the responses in flight.
    #[arg(
        long,
        env = "DCGM_EXPORTER_MAX_CONCURRENT_SCRAPES",
        default_value_t = 0
    )]
    pub max_concurrent_scrapes: u32,

    /// Also serve the standard `process_*` series of the exporter itself (CPU, memory, file
    /// descriptors, start time) on /metrics.
    #[arg(long, env = "DCGM_EXPORTER_ENABLE_EXPORTER_METRICS")]
    pub enable_exporter_metrics: bool,

    /// `/health` answers 503 while no GPU is collected (so a liveness probe restarts an
    /// exporter that came up blind).
    #[arg(long, env = "DCGM_EXPORTER_HEALTH_REQUIRE_GPUS")]
    pub health_require_gpus: bool,

    /// Omit the hostname label.
    #[arg(short = 'n', long, env = "DCGM_EXPORTER_NO_HOSTNAME")]
    pub no_hostname: bool,

    /// Serve on the socket systemd passes (socket activation: LISTEN_FDS / LISTEN_PID, fd 3)
    /// instead of binding --address.
    #[arg(long, env = "DCGM_EXPORTER_SYSTEMD_SOCKET")]
    pub web_systemd_socket: bool,

    /// Outside Kubernetes mode: next to each GPU series, one copy per container running
    /// processes on that GPU, with a `container` label (the container's name). Containers are
    /// found through --container-runtime-socket (a CRI socket, e.g. containerd's) and the host's
    /// /proc (--path.procfs). Ignored with -k.
    #[arg(long, env = "DCGM_EXPORTER_CONTAINER_LABELS")]
    pub container_labels: bool,

    /// The container runtime's socket path (dcgm-exporter's name for
    /// --container-runtime-endpoint, which it sets when that is not given).
    #[arg(long, env = "DCGM_CONTAINER_RUNTIME_SOCKET")]
    pub container_runtime_socket: Option<String>,

    /// dcgm-exporter's CPU entity selection. No effect: gpu-exporter has no CPU entities.
    #[arg(short = 'p', long, env = "DCGM_EXPORTER_CPU_DEVICES_STR", hide = true)]
    pub cpu_devices: Option<String>,

    /// dcgm-exporter's switch for DCGM's fake GPUs. No effect: use --backend sim.
    #[arg(long, env = "DCGM_EXPORTER_USE_FAKE_GPUS", hide = true)]
    pub fake_gpus: bool,

    /// dcgm-exporter's debug dumps. No effect (see docs/operations.md for the debug logs).
    #[arg(long, env = "DCGM_EXPORTER_DUMP_ENABLED", hide = true)]
    pub dump_enabled: bool,

    /// dcgm-exporter's debug dump directory. No effect.
    #[arg(long, env = "DCGM_EXPORTER_DUMP_DIRECTORY", hide = true)]
    pub dump_directory: Option<PathBuf>,

    /// dcgm-exporter's debug dump retention, hours. No effect.
    #[arg(long, env = "DCGM_EXPORTER_DUMP_RETENTION", hide = true)]
    pub dump_retention: Option<u64>,

    /// dcgm-exporter's debug dump compression (default true there). No effect.
    #[arg(long, env = "DCGM_EXPORTER_DUMP_COMPRESSION", hide = true, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = goflags::parse_bool)]
    pub dump_compression: Option<bool>,

    /// dcgm-exporter's DCGM watch retention age. No effect: there are no DCGM watches.
    #[arg(long, env = "DCGM_EXPORTER_WATCH_MAX_KEEP_AGE", hide = true,
          value_parser = goflags::parse_duration)]
    pub watch_max_keep_age: Option<Duration>,

    /// dcgm-exporter's DCGM watch retention samples. No effect: there are no DCGM watches.
    #[arg(long, env = "DCGM_EXPORTER_WATCH_MAX_KEEP_SAMPLES", hide = true)]
    pub watch_max_keep_samples: Option<i64>,

    /// dcgm-exporter's DCGM bind/unbind watch. No effect: gpu-exporter rediscovers GPUs every
    /// minute through NVML.
    #[arg(long, env = "DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH", hide = true)]
    pub enable_gpu_bind_unbind_watch: bool,

    /// dcgm-exporter's DCGM bind/unbind poll interval. No effect.
    #[arg(long, env = "DCGM_EXPORTER_GPU_BIND_UNBIND_POLL_INTERVAL", hide = true,
          value_parser = goflags::parse_duration)]
    pub gpu_bind_unbind_poll_interval: Option<Duration>,

    /// dcgm-exporter's Go profiler endpoints. No effect: there is no Go runtime.
    #[arg(long, env = "DCGM_EXPORTER_ENABLE_PPROF", hide = true)]
    pub enable_pprof: bool,

    /// The settings given explicitly (flag or environment), which a --config-file does not
    /// override. Filled by [`goflags::parse`].
    #[arg(skip)]
    pub explicit: goflags::Explicit,
}

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
    /// A flag names a feature that is not available.
    #[error("{flag}: {reason}")]
    Unsupported {
        /// The flag.
        flag: &'static str,
        /// Why.
        reason: &'static str,
    },
}

impl ConfigError {
    /// The `Args` field whose value is at fault.
    fn arg(&self) -> Option<&'static str> {
        Some(match self {
            ConfigError::Catalog(_) => "collectors",
            ConfigError::Scenario(_) => "sim_scenario",
            ConfigError::Address(_) => "address",
            ConfigError::Devices { .. } => "devices",
            ConfigError::SwitchDevices { .. } => "switch_devices",
            ConfigError::PodResourcesTtl { .. } => "pod_resources_ttl",
            ConfigError::CriTtl { .. } => "cri_ttl",
            ConfigError::AllowlistRegex { .. } => "kubernetes_pod_label_allowlist_regex",
            ConfigError::File(_) => "config_file",
            ConfigError::RuntimeSocket { .. } => "container_runtime_socket",
            ConfigError::ContainerLabelsSocket => "container_labels",
            ConfigError::Unsupported { flag, .. } => match *flag {
                "--configmap-data" => "configmap_data",
                _ => return None,
            },
            ConfigError::FromEnv { .. } => return None,
        })
    }
}

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
    pub listen_on: crate::http::listen::ListenOn,
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

    /// Resolves `args`, reading the CSV and scenario files.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the flag at fault.
    pub fn resolve(args: Args) -> Result<Config, ConfigError> {
        let explicit = args.explicit.clone();
        Self::resolve_args(args).map_err(|e| match e.arg().and_then(|id| explicit.env_var(id)) {
            Some(var) => ConfigError::FromEnv {
                var: var.to_owned(),
                source: Box::new(e),
            },
            None => e,
        })
    }

    fn resolve_args(mut args: Args) -> Result<Config, ConfigError> {
        let mut notices = Vec::new();
        let inline_csv = match args.config_file.clone() {
            Some(path) => file::apply(&mut args, &path, &mut notices).map_err(ConfigError::File)?,
            None => None,
        };
        if let Some(socket) = args
            .container_runtime_socket
            .clone()
            .filter(|s| !s.is_empty())
        {
            if !args.explicit.contains("container_runtime_endpoint") {
                args.container_runtime_endpoint = socket;
            } else if grpc_path(&socket) != grpc_path(&args.container_runtime_endpoint) {
                return Err(ConfigError::RuntimeSocket {
                    socket,
                    endpoint: args.container_runtime_endpoint.clone(),
                });
            }
        }
        for (value, flag) in [
            (&mut args.web_read_timeout, "--web-read-timeout"),
            (&mut args.web_write_timeout, "--web-write-timeout"),
        ] {
            if value.is_some_and(|d| d.is_zero()) {
                *value = None;
                notices.push(format!("{flag} 0 (no deadline) is not supported: every phase of a connection has a deadline here; using the default"));
            }
        }
        notices.extend(inert::notices(&args));
        if args.configmap_data.as_deref().is_some_and(|v| v != "none") {
            return Err(ConfigError::Unsupported {
                flag: "--configmap-data",
                reason: "reading the CSV from the Kubernetes API is not supported; mount the ConfigMap as a file and pass its path with --collectors",
            });
        }
        if args.pod_resources_ttl < args.pod_resources_refresh {
            return Err(ConfigError::PodResourcesTtl {
                ttl: args.pod_resources_ttl,
                refresh: args.pod_resources_refresh,
            });
        }
        if args.cri_ttl < args.cri_refresh {
            return Err(ConfigError::CriTtl {
                ttl: args.cri_ttl,
                refresh: args.cri_refresh,
            });
        }
        let label_allowlist = args
            .kubernetes_pod_label_allowlist_regex
            .iter()
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                regex::Regex::new(p.trim()).map_err(|cause| ConfigError::AllowlistRegex {
                    pattern: p.clone(),
                    cause,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (catalog, skipped, catalog_origin, catalog_path) = match inline_csv {
            Some((csv, path)) => {
                let origin = format!("{} metrics.fields", path.display());
                let (c, s) = catalog::parse(&csv, &origin).map_err(|e| match e {
                    CatalogError::Invalid { line, defect, .. } => {
                        ConfigError::File(file::FileError::Invalid {
                            path: path.display().to_string(),
                            key: format!("metrics.fields[{}]", line.saturating_sub(1)),
                            reason: defect.to_string(),
                        })
                    }
                    other => ConfigError::Catalog(other),
                })?;
                (c, s, origin, None)
            }
            None => {
                let (c, s, origin) = load_catalog(args.collectors.as_deref())?;
                let path = match &args.collectors {
                    Some(p) => Some(p.clone()),
                    None => Some(PathBuf::from(DCGM_DEFAULT_COLLECTORS)).filter(|p| p.exists()),
                };
                (c, s, origin, path)
            }
        };
        let listen = parse_address(&args.address)?;
        let listen_on = if args.address.starts_with(':') {
            crate::http::listen::ListenOn::AnyAddress(listen.port())
        } else {
            crate::http::listen::ListenOn::Address(listen)
        };
        let selection = parse_devices(&args.devices)?;
        let switches = parse_devices(&args.switch_devices).map_err(|e| match e {
            ConfigError::Devices { value, reason } => ConfigError::SwitchDevices { value, reason },
            other => other,
        })?;
        let scenario = match &args.sim_scenario {
            Some(p) => Some((
                scenario::load(p).map_err(ConfigError::Scenario)?,
                p.display().to_string(),
            )),
            None => None,
        };
        let hostname = match args.node_name.as_deref().filter(|n| !n.is_empty()) {
            Some(n) => n.to_owned(),
            None => system_hostname(),
        };
        if args.remote_hostengine_info.is_some() && args.backend == Backend::Sim {
            notices.push("--remote-hostengine-info / DCGM_REMOTE_HOSTENGINE_INFO has no effect with --backend sim: the simulated fleet reads no DCGM hostengine".to_owned());
        }
        if args.enable_dcgm_log || args.dcgm_log_level.is_some() {
            notices.push("--enable-dcgm-log / --dcgm-log-level have no effect: there is no DCGM library to log".to_owned());
        }
        if switches != DeviceSelection::Flex {
            notices.push(format!(
                "--switch-devices {:?} has no effect: gpu-exporter exports no NVSwitch entities (they need NVIDIA's NSCQ library); GPU NVLink series follow --devices",
                args.switch_devices
            ));
        }
        if args.kubernetes_enable_dra && !args.kubernetes {
            notices.push("--kubernetes-enable-dra has no effect without -k/--kubernetes: DRA allocations are read from the kubelet's pod-resources API".to_owned());
        }
        if args.disable_startup_validate {
            notices.push(
                "--disable-startup-validate has no effect: there is no libdcgm to validate"
                    .to_owned(),
            );
        }
        // dcgm-exporter's --container-labels: outside Kubernetes mode only, and only with a
        // runtime socket to ask.
        let container_labels = args.container_labels && !args.kubernetes;
        if args.container_labels && args.kubernetes {
            notices.push("--container-labels (DCGM_EXPORTER_CONTAINER_LABELS) is ignored in Kubernetes mode (-k): pod, namespace and container labels come from the kubelet".to_owned());
        }
        if container_labels
            && args
                .container_runtime_socket
                .as_deref()
                .is_none_or(|s| s.trim().is_empty())
        {
            return Err(ConfigError::ContainerLabelsSocket);
        }
        let wants_process_usage = args.kubernetes_process_usage || args.kubernetes_virtual_gpus;
        let process_usage = (args.kubernetes && wants_process_usage) || container_labels;
        let cri = (args.kubernetes
            && (process_usage
                || args.kubernetes_enable_pod_uid
                || args.kubernetes_enable_pod_labels))
            || container_labels;
        if !args.kubernetes {
            for (on, flag) in [
                (
                    args.kubernetes_enable_pod_uid,
                    "--kubernetes-enable-pod-uid",
                ),
                (
                    args.kubernetes_enable_pod_labels,
                    "--kubernetes-enable-pod-labels",
                ),
                (args.kubernetes_process_usage, "--kubernetes-process-usage"),
                (args.kubernetes_virtual_gpus, "--kubernetes-virtual-gpus"),
            ] {
                if on {
                    notices.push(format!(
                        "{flag} has no effect without -k/--kubernetes (DCGM_EXPORTER_KUBERNETES)"
                    ));
                }
            }
        }
        if !label_allowlist.is_empty() && !args.kubernetes_enable_pod_labels {
            notices.push("--kubernetes-pod-label-allowlist-regex has no effect without --kubernetes-enable-pod-labels".to_owned());
        }
        Ok(Config {
            label_allowlist,
            process_usage,
            cri,
            container_labels,
            catalog,
            catalog_origin,
            catalog_path,
            skipped,
            listen,
            listen_on,
            interval: Duration::from_millis(args.collect_interval),
            hostname,
            selection,
            scenario,
            notices,
            args,
        })
    }

    /// Drops CSV rows the source cannot read; returns them for one warning each.
    pub fn retain_supported(
        &mut self,
        supported: impl Fn(catalog::Field) -> bool,
    ) -> Vec<MetricSpec> {
        self.catalog.retain_supported(supported)
    }
}

/// The socket path of a CRI endpoint (`unix:///x` or `/x`).
fn grpc_path(endpoint: &str) -> &str {
    endpoint.strip_prefix("unix://").unwrap_or(endpoint)
}

fn load_catalog(
    path: Option<&std::path::Path>,
) -> Result<(Catalog, Vec<Skipped>, String), ConfigError> {
    match path {
        Some(p) => {
            let (c, s) = catalog::load(p).map_err(ConfigError::Catalog)?;
            Ok((c, s, p.display().to_string()))
        }
        None if std::path::Path::new(DCGM_DEFAULT_COLLECTORS).exists() => {
            let p = std::path::Path::new(DCGM_DEFAULT_COLLECTORS);
            let (c, s) = catalog::load(p).map_err(ConfigError::Catalog)?;
            Ok((c, s, DCGM_DEFAULT_COLLECTORS.to_owned()))
        }
        None => {
            let origin = "built-in default-counters.csv";
            let (c, s) = catalog::parse(BUILTIN_COUNTERS, origin).map_err(ConfigError::Catalog)?;
            Ok((c, s, origin.to_owned()))
        }
    }
}

/// Parses a Go-style listen address: `:9400` means every interface.
///
/// # Errors
/// [`ConfigError::Address`].
pub fn parse_address(s: &str) -> Result<SocketAddr, ConfigError> {
    let bad = || ConfigError::Address(s.to_owned());
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    match host {
        "localhost" => Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)),
        _ => Err(bad()),
    }
}

/// Parses `-d/--devices`.
///
/// # Errors
/// [`ConfigError::Devices`] saying what is wrong.
pub fn parse_devices(s: &str) -> Result<DeviceSelection, ConfigError> {
    let err = |reason: String| ConfigError::Devices {
        value: s.to_owned(),
        reason,
    };
    let (kind, ids) = match s.split_once(':') {
        Some((k, ids)) => (k, Some(ids)),
        None => (s, None),
    };
    let ids = ids
        .map(|list| parse_id_list(list).map_err(&err))
        .transpose()?;
    match (kind, ids) {
        ("f", None) => Ok(DeviceSelection::Flex),
        ("f", Some(_)) => Err(err("`f` takes no ids".to_owned())),
        ("g", ids) => Ok(DeviceSelection::Gpus(ids)),
        ("i", ids) => Ok(DeviceSelection::Instances(ids)),
        (other, _) => Err(err(format!(
            "unknown device type {other:?}; expected f, g[:ids] or i[:ids]"
        ))),
    }
}

fn parse_id_list(list: &str) -> Result<Vec<u32>, String> {
    let mut ids = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        let num = |x: &str| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| format!("{x:?} is not a device id"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("range {part:?} is backwards"));
                }
                if b - a > 4096 {
                    return Err(format!("range {part:?} is too large"));
                }
                ids.extend(a..=b);
            }
            None => ids.push(num(part)?),
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// Whether the text log may use ANSI colours: only when stderr is a terminal, and never when
/// `NO_COLOR` is set to a non-empty value (<https://no-color.org>).
pub fn log_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

fn system_hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| {
            let cap = crate::fsread::Cap(4096);
            crate::fsread::read_text(
                std::path::Path::new(p),
                cap,
                crate::fsread::Symlinks::Follow,
            )
            .ok()
        })
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["gpu-exporter"];
        v.extend_from_slice(extra);
        Args::try_parse_from(v).unwrap()
    }

    fn go(extra: &[&str]) -> Args {
        let argv = std::iter::once("gpu-exporter")
            .chain(extra.iter().copied())
            .map(std::ffi::OsString::from);
        goflags::parse(argv, &|_| None).unwrap()
    }

    #[test]
    fn container_labels_need_a_socket_outside_kubernetes_and_are_ignored_with_k() {
        // dcgm-exporter's startup error.
        let e = Config::resolve(go(&["--container-labels"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--container-labels requires --container-runtime-socket or DCGM_CONTAINER_RUNTIME_SOCKET"
        );
        // (By environment variable, the error names DCGM_EXPORTER_CONTAINER_LABELS: tests/flags.rs.)
        assert_eq!(e.arg(), Some("container_labels"));
        // With a socket: the runtime client and per-process reading run, and the copies are on.
        let c = Config::resolve(go(&[
            "--container-labels=true",
            "--container-runtime-socket=/run/containerd/containerd.sock",
        ]))
        .unwrap();
        assert!(c.container_labels && c.cri && c.process_usage);
        assert!(c.build_options().container_labels);
        assert_eq!(
            c.args.container_runtime_endpoint,
            "/run/containerd/containerd.sock"
        );
        assert!(
            c.notices.iter().all(|n| !n.contains("container-labels")),
            "{:?}",
            c.notices
        );
        // With -k: ignored, one notice, no socket needed, nothing turned on.
        let c = Config::resolve(go(&["-k", "--container-labels"])).unwrap();
        assert!(!c.container_labels && !c.cri && !c.process_usage);
        assert!(!c.build_options().container_labels);
        let said: Vec<&String> = c
            .notices
            .iter()
            .filter(|n| n.contains("--container-labels"))
            .collect();
        assert_eq!(said.len(), 1, "{:?}", c.notices);
        assert!(
            said[0].contains("ignored in Kubernetes mode"),
            "{}",
            said[0]
        );
        // Off: nothing.
        let c = Config::resolve(go(&["--container-labels=false"])).unwrap();
        assert!(!c.container_labels && !c.cri);
    }

    #[test]
    fn container_runtime_socket_maps_onto_the_endpoint() {
        let c =
            Config::resolve(go(&["--container-runtime-socket", "/run/crio/crio.sock"])).unwrap();
        assert_eq!(c.args.container_runtime_endpoint, "/run/crio/crio.sock");
        let e = Config::resolve(go(&[
            "--container-runtime-socket=/a.sock",
            "--container-runtime-endpoint=unix:///b.sock",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("name different sockets"), "{e}");
        let c = Config::resolve(go(&[
            "--container-runtime-socket=/a.sock",
            "--container-runtime-endpoint=unix:///a.sock",
        ]))
        .unwrap();
        assert_eq!(c.args.container_runtime_endpoint, "unix:///a.sock");
    }

    #[test]
    fn no_hostname_drops_the_label_value_only() {
        let mut a = go(&["-n"]);
        a.node_name = Some("node-7".into());
        let c = Config::resolve(a).unwrap();
        assert_eq!(c.hostname, "node-7");
        assert_eq!(c.build_options().hostname, "");
        let mut a = go(&["--no-hostname=false"]);
        a.node_name = Some("node-7".into());
        assert_eq!(
            Config::resolve(a).unwrap().build_options().hostname,
            "node-7"
        );
    }

    #[test]
    fn any_address_and_explicit_addresses() {
        use crate::http::listen::ListenOn;
        assert_eq!(
            Config::resolve(go(&[])).unwrap().listen_on,
            ListenOn::AnyAddress(9400)
        );
        assert_eq!(
            Config::resolve(go(&["-a", "0.0.0.0:9400"]))
                .unwrap()
                .listen_on,
            ListenOn::Address("0.0.0.0:9400".parse().unwrap())
        );
        assert_eq!(
            Config::resolve(go(&["-a", "[::1]:1"])).unwrap().listen_on,
            ListenOn::Address("[::1]:1".parse().unwrap())
        );
    }

    #[test]
    fn zero_web_timeouts_keep_the_defaults_and_say_so() {
        let c = Config::resolve(go(&["--web-read-timeout=0", "--web-write-timeout=0s"])).unwrap();
        assert_eq!(c.args.web_read_timeout, None);
        assert_eq!(c.args.web_write_timeout, None);
        assert_eq!(c.notices.len(), 2, "{:?}", c.notices);
        let c = Config::resolve(go(&["--web-write-timeout=1m30s"])).unwrap();
        assert_eq!(c.args.web_write_timeout, Some(Duration::from_secs(90)));
    }

    #[test]
    fn inert_flags_warn_once_each_whatever_their_value() {
        let c = Config::resolve(go(&[
            "--enable-pprof=false",
            "-p",
            "g",
            "--dump-retention=1",
        ]))
        .unwrap();
        assert_eq!(c.notices.len(), 3, "{:?}", c.notices);
        assert!(c.notices[0]
            .starts_with("-p/--cpu-devices (DCGM_EXPORTER_CPU_DEVICES_STR) has no effect"));
        assert!(Config::resolve(go(&[])).unwrap().notices.is_empty());
    }

    #[test]
    fn log_colour_needs_a_terminal_and_no_no_color() {
        use std::ffi::OsStr;
        assert!(log_colour(true, None));
        assert!(log_colour(true, Some(OsStr::new(""))));
        assert!(!log_colour(true, Some(OsStr::new("1"))));
        assert!(!log_colour(false, None));
        assert!(!log_colour(false, Some(OsStr::new(""))));
    }

    #[test]
    fn addresses_parse_as_go_does() {
        assert_eq!(
            parse_address(":9400").unwrap(),
            "0.0.0.0:9400".parse().unwrap()
        );
        assert_eq!(
            parse_address("127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert_eq!(
            parse_address("[::]:9400").unwrap(),
            "[::]:9400".parse().unwrap()
        );
        assert_eq!(
            parse_address("localhost:1").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        assert_eq!(
            parse_address("9400").unwrap_err().to_string(),
            "--address \"9400\": expected :PORT, HOST:PORT or [IPv6]:PORT"
        );
        assert!(parse_address(":99999").is_err());
    }

    #[test]
    fn device_selections_parse() {
        assert_eq!(parse_devices("f").unwrap(), DeviceSelection::Flex);
        assert_eq!(parse_devices("g").unwrap(), DeviceSelection::Gpus(None));
        assert_eq!(
            parse_devices("g:0,2-4").unwrap(),
            DeviceSelection::Gpus(Some(vec![0, 2, 3, 4]))
        );
        assert_eq!(
            parse_devices("i:3").unwrap(),
            DeviceSelection::Instances(Some(vec![3]))
        );
        assert!(parse_devices("x")
            .unwrap_err()
            .to_string()
            .contains("unknown device type"));
        assert!(parse_devices("g:4-2")
            .unwrap_err()
            .to_string()
            .contains("backwards"));
        assert!(parse_devices("g:a")
            .unwrap_err()
            .to_string()
            .contains("not a device id"));
        assert!(parse_devices("f:1").is_err());
    }

    #[test]
    fn defaults_match_dcgm_exporter() {
        let a = args(&[]);
        assert_eq!(a.address, ":9400");
        assert_eq!(a.collect_interval, 30000);
        assert_eq!(a.devices, "f");
        assert_eq!(a.kubernetes_gpu_id_type, GpuIdType::Uid);
        assert_eq!(a.backend, Backend::Nvml);
        assert_eq!(a.hostname_label, "hostname");
        assert_eq!(a.switch_devices, "f");
        assert!(!a.use_old_namespace);
    }

    #[test]
    fn old_namespace_and_switch_devices_flags() {
        assert!(args(&["-o"]).use_old_namespace);
        assert!(args(&["--use-old-namespace"]).use_old_namespace);
        let c = Config::resolve(args(&["-s", "g:0,1"])).unwrap();
        assert_eq!(c.notices.len(), 1);
        assert!(c.notices[0].contains("NSCQ"), "{}", c.notices[0]);
        assert!(Config::resolve(args(&["-s", "f"]))
            .unwrap()
            .notices
            .is_empty());
        let e = Config::resolve(args(&["-s", "x:1"])).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--switch-devices \"x:1\": unknown device type"),
            "{e}"
        );
    }

    #[test]
    fn builtin_csv_is_used_without_collectors_and_node_name_wins() {
        let mut a = args(&["--backend", "sim"]);
        a.node_name = Some("node-7".into());
        let c = Config::resolve(a).unwrap();
        if !std::path::Path::new(DCGM_DEFAULT_COLLECTORS).exists() {
            assert_eq!(c.catalog_origin, "built-in default-counters.csv");
        }
        assert!(!c.catalog.metrics.is_empty());
        assert_eq!(c.hostname, "node-7");
    }

    #[test]
    fn unimplemented_flags_refuse_to_start_and_inert_ones_are_noticed() {
        let e = Config::resolve(args(&["-m", "default:metrics"])).unwrap_err();
        assert!(e.to_string().starts_with("--configmap-data:"));
        let c = Config::resolve(args(&["--backend", "sim", "-r", "localhost:5555"])).unwrap();
        assert_eq!(c.notices.len(), 1);
    }

    #[test]
    fn dra_and_hpc_flags_use_dcgm_exporters_names() {
        let a = args(&[]);
        assert!(!a.kubernetes_enable_dra);
        assert_eq!(a.hpc_job_mapping_dir, None);
        let a = args(&[
            "--kubernetes-enable-dra",
            "--hpc-job-mapping-dir",
            "/run/hpc-jobs",
        ]);
        assert!(a.kubernetes_enable_dra);
        assert_eq!(a.hpc_job_mapping_dir, Some(PathBuf::from("/run/hpc-jobs")));
        // DRA without -k is accepted but noticed; with -k it is not.
        let c = Config::resolve(args(&["--kubernetes-enable-dra"])).unwrap();
        assert_eq!(c.notices.len(), 1);
        assert!(c.notices[0].starts_with("--kubernetes-enable-dra has no effect"));
        let c = Config::resolve(args(&["-k", "--kubernetes-enable-dra"])).unwrap();
        assert!(c.notices.is_empty());
    }

    #[test]
    fn pod_resources_flags_default_and_validate() {
        let a = args(&[]);
        assert_eq!(
            (
                a.pod_resources_refresh,
                a.pod_resources_ttl,
                a.pod_resources_timeout
            ),
            (10_000, 30_000, 5_000)
        );
        let e = Config::resolve(args(&["--pod-resources-ttl", "5000"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--pod-resources-ttl 5000: must be at least --pod-resources-refresh (10000 ms)"
        );
        assert!(Config::resolve(args(&[
            "--pod-resources-refresh",
            "1000",
            "--pod-resources-ttl",
            "1000"
        ]))
        .is_ok());
    }

    #[test]
    fn attribution_flags_use_dcgm_exporters_names_and_need_kubernetes_mode() {
        let c = Config::resolve(args(&[
            "-k",
            "--kubernetes-enable-pod-labels",
            "--kubernetes-pod-label-allowlist-regex",
            "^app$,team",
        ]))
        .unwrap();
        assert_eq!(c.label_allowlist.len(), 2);
        assert!(c.cri && !c.process_usage);
        assert!(c.notices.is_empty(), "{:?}", c.notices);
        assert_eq!(c.args.path_procfs, PathBuf::from("/proc"));
        assert_eq!(
            c.args.container_runtime_endpoint,
            "unix:///run/containerd/containerd.sock"
        );

        // Virtual GPUs imply per-process usage, which needs the runtime.
        let c = Config::resolve(args(&["-k", "--kubernetes-virtual-gpus"])).unwrap();
        assert!(c.process_usage && c.cri);
        // Holders only: no runtime client.
        let c = Config::resolve(args(&["-k"])).unwrap();
        assert!(!c.process_usage && !c.cri);
        // Without -k they do nothing, and say so.
        let c = Config::resolve(args(&[
            "--kubernetes-enable-pod-uid",
            "--kubernetes-process-usage",
        ]))
        .unwrap();
        assert!(!c.cri && !c.process_usage);
        assert_eq!(c.notices.len(), 2, "{:?}", c.notices);
        let c =
            Config::resolve(args(&["-k", "--kubernetes-pod-label-allowlist-regex", "x"])).unwrap();
        assert!(c.notices[0].contains("--kubernetes-enable-pod-labels"));

        let e = Config::resolve(args(&[
            "-k",
            "--kubernetes-enable-pod-labels",
            "--kubernetes-pod-label-allowlist-regex",
            "ok,(unclosed",
        ]))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--kubernetes-pod-label-allowlist-regex \"(unclosed\": not a valid regex"
        );
        let e = Config::resolve(args(&["--cri-refresh", "40000"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--cri-ttl 30000: must be at least --cri-refresh (40000 ms)"
        );
    }

    #[test]
    fn bad_csv_error_names_the_flag_and_file_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.csv");
        std::fs::write(
            &p,
            "DCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_NOPE, gauge, x\n",
        )
        .unwrap();
        let e = Config::resolve(args(&["-f", p.to_str().unwrap()])).unwrap_err();
        let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(
            chain.contains("bad.csv:2: unknown field \"DCGM_FI_NOPE\""),
            "{chain}"
        );
    }
}
