//! The command line: [`Args`], every flag with its environment variable and default, as
//! dcgm-exporter names them, and the enums its values take.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use super::goflags;
use crate::pods::GpuIdType;

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

/// Where pod UIDs and labels (`--kubernetes-enable-pod-uid`, `--kubernetes-enable-pod-labels`)
/// come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PodMetadataSource {
    /// The container runtime when its socket (`--container-runtime-endpoint`) exists at
    /// startup, else the Kubernetes API server (unless per-process usage needs the runtime).
    Auto,
    /// The container runtime (CRI) only.
    Cri,
    /// The Kubernetes API server (a node-scoped pod watch) only.
    Api,
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

    /// Listen address: `:9400`, `127.0.0.1:9400`, `[::]:9400`, `[fe80::1%eth0]:9400`, or
    /// `NAME:9400` (resolved at startup; its first IPv4 address, as Go listens).
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

    /// Accounting (on with -k): the idle power of every GPU, in watts, for the static part of
    /// the energy split (gpu_exporter_container_energy_joules_total). Default: learnt per GPU,
    /// the lowest power over an interval of at least a second without processes.
    #[arg(long, env = "GPU_EXPORTER_ACCOUNTING_IDLE_POWER_WATTS",
          value_parser = clap::value_parser!(u32).range(0..=5_000))]
    pub accounting_idle_power_watts: Option<u32>,

    /// Turns accounting off: no gpu_exporter_container_*_total counters (energy, allocated,
    /// busy and idle GPU-seconds), which are on with -k.
    #[arg(long, env = "GPU_EXPORTER_NO_ACCOUNTING")]
    pub no_accounting: bool,

    /// Accounting (on with -k): how often, ms, the gpu_exporter_container_*_total families are
    /// rendered again into the served body; 0: at every sample. The totals advance at every
    /// sample either way, so each publication is exact; between two, scrapes see the last.
    #[arg(long, env = "GPU_EXPORTER_ACCOUNTING_PUBLISH_INTERVAL", default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub accounting_publish_interval: u64,

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

    /// Where pod UIDs and labels come from: `auto` (the container runtime if its socket exists
    /// at startup, else the Kubernetes API server), `cri`, or `api` (a read-only watch of this
    /// node's pods, NODE_NAME; needs get/list/watch on pods).
    #[arg(
        long,
        env = "GPU_EXPORTER_POD_METADATA_SOURCE",
        value_enum,
        default_value = "auto"
    )]
    pub pod_metadata_source: PodMetadataSource,

    /// Timeout of one Kubernetes API call (a pod list, the ConfigMap of -m), ms.
    #[arg(long, env = "GPU_EXPORTER_KUBE_API_TIMEOUT", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub kube_api_timeout: u64,

    /// How long the last good Kubernetes API pod answer is used while the API server does not
    /// answer, ms; then pod_uid and pod labels are dropped.
    #[arg(long, env = "GPU_EXPORTER_KUBE_API_TTL", default_value_t = 120_000,
          value_parser = clap::value_parser!(u64).range(100..=86_400_000))]
    pub kube_api_ttl: u64,
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
    #[arg(long, env = "DCGM_EXPORTER_WEB_CONFIG_FILE", value_parser = goflags::file_path())]
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

    /// The simulated node has a DCGM hostengine (as `-r` on a real one): the DCGM_FI_PROF_*
    /// fields are served on every simulated model, GPUs before Hopper included.
    #[arg(long, env = "GPU_EXPORTER_SIM_DCGM")]
    pub sim_dcgm: bool,

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
    /// Hopper) through `libdcgm.so.4`. NVML stays the source of everything else. Without it,
    /// DCGM runs embedded in the exporter where `libdcgm.so.4` loads (as dcgm-exporter).
    #[arg(short = 'r', long, env = "DCGM_REMOTE_HOSTENGINE_INFO", hide = true)]
    pub remote_hostengine_info: Option<String>,

    /// dcgm-exporter's DCGM log switch: the embedded DCGM hostengine (no `-r`) logs to stdout at
    /// `--dcgm-log-level`. Without it the embedded hostengine has no log file.
    #[arg(long, env = "DCGM_EXPORTER_ENABLE_DCGM_LOG", hide = true)]
    pub enable_dcgm_log: bool,

    /// dcgm-exporter's DCGM log level for `--enable-dcgm-log`: NONE (the default), FATAL, ERROR,
    /// WARN, INFO, DEBUG or VERB.
    #[arg(long, env = "DCGM_EXPORTER_DCGM_LOG_LEVEL", hide = true)]
    pub dcgm_log_level: Option<String>,

    /// dcgm-exporter's libdcgm check switch. No effect: startup never requires `libdcgm.so.4`
    /// (a missing library leaves only the series DCGM would serve absent).
    #[arg(long, env = "DISABLE_STARTUP_VALIDATE", hide = true)]
    pub disable_startup_validate: bool,

    /// The metrics CSV from a ConfigMap, `NAMESPACE:NAME` (its `metrics` key), read from the
    /// Kubernetes API at startup; it wins over --collectors. `none` (the default): unused.
    #[arg(short = 'm', long, env = "DCGM_EXPORTER_CONFIGMAP_DATA")]
    pub configmap_data: Option<String>,

    /// dcgm-exporter's YAML configuration file (`version: 1` or `2`): `metrics.file`,
    /// `metrics.fields`, `metrics.enableExporterMetrics`, the collection interval and
    /// `server.maxConcurrentScrapes` apply; DCGM watch settings are accepted and reported as
    /// having no effect. Flags and environment variables given explicitly win over the file.
    #[arg(long, env = "DCGM_EXPORTER_CONFIG_FILE", value_parser = goflags::file_path())]
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

    /// dcgm-exporter's DCGM watch retention age. No effect: the DCGM watches (`-r` or embedded,
    /// profiling fields only) keep the last 2 samples, all the exporter reads.
    #[arg(long, env = "DCGM_EXPORTER_WATCH_MAX_KEEP_AGE", hide = true,
          value_parser = goflags::parse_duration)]
    pub watch_max_keep_age: Option<Duration>,

    /// dcgm-exporter's DCGM watch retention samples. No effect: the DCGM watches (`-r` or
    /// embedded, profiling fields only) keep the last 2 samples, all the exporter reads.
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
