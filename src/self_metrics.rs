//! The exporter's own series (`gpu_exporter_*`), named by Prometheus conventions so that
//! `promtool check metrics` has nothing to say about them.
//!
//! Counters are plain atomics shared with whoever counts (the HTTP layer counts scrapes); the
//! sampler turns them into [`Family`] values once per sample, so they ride in the pre-rendered
//! body and a scrape still costs nothing. A scrape therefore sees the counts as of the last sample.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::catalog::{Field, MetricType};
use crate::gpu::{FieldError, FieldGap, Value};
use crate::http::{CloseReason, RejectReason};
use crate::pods::cri::CriError;
use crate::pods::AttributionError;
use crate::render::{push_label, Family, Series};

/// Counters shared across the exporter.
#[derive(Debug, Default)]
pub struct SelfMetrics {
    /// `/metrics` requests served.
    pub scrapes: AtomicU64,
    samples: AtomicU64,
    sample_errors: Mutex<BTreeMap<&'static str, u64>>,
    field_errors: Mutex<BTreeMap<(Field, FieldError), u64>>,
    field_gaps: Mutex<BTreeMap<(Field, FieldGap), u64>>,
    /// Pod-resources (kubelet) health, rendered only in Kubernetes mode.
    pub pod_resources: PodResourcesStatus,
    /// Container runtime (CRI) health, rendered only when the CRI client runs.
    pub cri: CriStatus,
    /// Per-process attribution, rendered only when it is on.
    pub processes: ProcessStatus,
    /// HPC job mapping health, rendered only with `--hpc-job-mapping-dir`.
    pub hpc_jobs: HpcJobsStatus,
    /// The first sample's wait for attribution, and updates between samples; rendered only
    /// when an attribution source runs.
    pub attribution: AttributionStatus,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    last_reload_failed: AtomicBool,
    /// Log lines (or parts) that could not be written to stderr (shared with the log writer).
    log_write_errors: std::sync::Arc<AtomicU64>,
    /// HTTP connections and rejected requests.
    pub http: HttpStats,
    /// `--web-config-file` reloads and the serving certificate, rendered only with one.
    pub web: WebConfigStatus,
}

/// The HTTP server's connection figures, rendered as `gpu_exporter_http_*`.
#[derive(Debug)]
pub struct HttpStats {
    open: tokio::sync::watch::Sender<u64>,
    active: AtomicU64,
    limit: AtomicU64,
    active_limit: AtomicU64,
    closed: [AtomicU64; CloseReason::ALL.len()],
    rejected: [AtomicU64; RejectReason::ALL.len()],
}

impl Default for HttpStats {
    fn default() -> Self {
        Self {
            open: tokio::sync::watch::Sender::new(0),
            active: AtomicU64::default(),
            limit: AtomicU64::default(),
            active_limit: AtomicU64::default(),
            closed: Default::default(),
            rejected: Default::default(),
        }
    }
}

impl HttpStats {
    /// Sets the number of open connections, and of those past their first byte.
    pub fn set_open(&self, open: usize, active: usize) {
        self.open.send_replace(open as u64);
        self.active.store(active as u64, Ordering::Relaxed);
    }

    /// Open connections past their first byte.
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    /// Open connections.
    pub fn open(&self) -> u64 {
        *self.open.borrow()
    }

    /// Follows the number of open connections (for waiting on it).
    pub fn watch_open(&self) -> tokio::sync::watch::Receiver<u64> {
        self.open.subscribe()
    }

    /// Sets the connection limits in force: open at all, and past their first byte.
    pub fn set_limits(&self, open: usize, active: usize) {
        self.limit.store(open as u64, Ordering::Relaxed);
        self.active_limit.store(active as u64, Ordering::Relaxed);
    }

    /// Counts a closed connection.
    pub fn count_closed(&self, reason: CloseReason) {
        self.closed[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections closed for `reason` so far.
    pub fn closed(&self, reason: CloseReason) -> u64 {
        self.closed[reason.index()].load(Ordering::Relaxed)
    }

    /// Counts a request turned away.
    pub fn count_rejected(&self, reason: RejectReason) {
        self.rejected[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests turned away for `reason` so far.
    pub fn rejected(&self, reason: RejectReason) -> u64 {
        self.rejected[reason.index()].load(Ordering::Relaxed)
    }

    fn families(&self) -> Vec<Family> {
        let count = |n: &AtomicU64| {
            Value::Int(i64::try_from(n.load(Ordering::Relaxed)).unwrap_or(i64::MAX))
        };
        let one = |v: Value| {
            vec![Series {
                labels: "".into(),
                value: v,
            }]
        };
        let by_reason = |reasons: &mut dyn Iterator<Item = (&'static str, &AtomicU64)>| {
            reasons
                .map(|(r, n)| {
                    let mut labels = String::new();
                    push_label(&mut labels, "reason", r);
                    Series {
                        labels: labels.into(),
                        value: count(n),
                    }
                })
                .collect()
        };
        let family = |name: &str, help: &str, kind, series| Family {
            name: name.to_owned(),
            help: help.to_owned(),
            kind,
            series,
        };
        let labelled = |k: &str, v: &str, value| {
            let mut labels = String::new();
            push_label(&mut labels, k, v);
            Series {
                labels: labels.into(),
                value,
            }
        };
        vec![
            family(
                "gpu_exporter_http_connections_open",
                "HTTP connections open, as of the last sample.",
                MetricType::Gauge,
                one(Value::Int(i64::try_from(self.open()).unwrap_or(i64::MAX))),
            ),
            family(
                "gpu_exporter_http_connections_active",
                "HTTP connections open that have sent at least one byte (and hold buffers), as of the last sample.",
                MetricType::Gauge,
                one(count(&self.active)),
            ),
            family(
                "gpu_exporter_http_connections_limit",
                "HTTP connection limits: open at all, and active (past their first byte). At a limit the least useful connection of the heaviest client is closed for the new one.",
                MetricType::Gauge,
                vec![
                    labelled("scope", "active", count(&self.active_limit)),
                    labelled("scope", "open", count(&self.limit)),
                ],
            ),
            family(
                "gpu_exporter_http_connections_closed_total",
                "HTTP connections closed, by reason (timeouts by phase, evicted at the connection limit, refused, closed normally).",
                MetricType::Counter,
                by_reason(&mut CloseReason::ALL.iter().map(|r| (r.as_str(), &self.closed[r.index()]))),
            ),
            family(
                "gpu_exporter_http_requests_rejected_total",
                "HTTP requests turned away before reaching a handler, by reason (per-client rate limit, bad credentials, per-client limit on failed logins).",
                MetricType::Counter,
                by_reason(&mut RejectReason::ALL.iter().map(|r| (r.as_str(), &self.rejected[r.index()]))),
            ),
        ]
    }
}

/// The pod-resources client's health, updated by the attribution refresher and rendered with
/// each sample as `gpu_exporter_pod_resources_*`.
#[derive(Debug, Default)]
pub struct PodResourcesStatus {
    inner: Mutex<PodResourcesState>,
}

/// A copy of [`PodResourcesStatus`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodResourcesState {
    /// Whether Kubernetes mode is on (the families are rendered only then).
    pub enabled: bool,
    /// Whether the last `List` call succeeded.
    pub up: bool,
    /// Unix time of the last successful call (0: never).
    pub last_success_seconds: f64,
    /// Failed calls by reason.
    pub errors: BTreeMap<&'static str, u64>,
    /// GPU device ids in the last good reply that matched no local GPU or MIG instance.
    pub unknown_devices: u64,
    /// GPUs and MIG instances with at least one holder in the published attribution.
    pub allocated_entities: u64,
    /// Whether `--kubernetes-enable-dra` is on (the DRA family is rendered only then).
    pub dra_enabled: bool,
    /// Devices of NVIDIA's DRA driver in the last good reply that resolved to nothing, by reason.
    pub dra_unresolved: BTreeMap<&'static str, u64>,
}

impl PodResourcesStatus {
    fn lock(&self) -> std::sync::MutexGuard<'_, PodResourcesState> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Turns the families on (Kubernetes mode).
    pub fn enable(&self) {
        self.lock().enabled = true;
    }

    /// Records a successful call at `unix_seconds`.
    pub fn record_success(&self, unix_seconds: f64) {
        let mut s = self.lock();
        s.up = true;
        s.last_success_seconds = unix_seconds;
    }

    /// Records a failed call.
    pub fn record_failure(&self, reason: &'static str) {
        let mut s = self.lock();
        s.up = false;
        *s.errors.entry(reason).or_default() += 1;
    }

    /// Turns the DRA family on (`--kubernetes-enable-dra`).
    pub fn enable_dra(&self) {
        self.lock().dra_enabled = true;
    }

    /// Records the DRA devices of the published attribution that resolved to nothing.
    pub fn record_dra_unresolved(&self, by_reason: &BTreeMap<&'static str, usize>) {
        self.lock().dra_unresolved = by_reason.iter().map(|(r, n)| (*r, *n as u64)).collect();
    }

    /// Records what was published: unknown device ids and allocated entities.
    pub fn record_published(&self, unknown_devices: usize, allocated_entities: usize) {
        let mut s = self.lock();
        s.unknown_devices = unknown_devices as u64;
        s.allocated_entities = allocated_entities as u64;
    }

    /// A copy of the current state.
    pub fn state(&self) -> PodResourcesState {
        self.lock().clone()
    }

    fn families(&self) -> Vec<Family> {
        let s = self.state();
        if !s.enabled {
            return Vec::new();
        }
        let count = |n: u64| Value::Int(i64::try_from(n).unwrap_or(i64::MAX));
        let one = |v: Value| {
            vec![Series {
                labels: "".into(),
                value: v,
            }]
        };
        let family = |name: &str, help: &str, kind, series| Family {
            name: name.to_owned(),
            help: help.to_owned(),
            kind,
            series,
        };
        let errors = AttributionError::REASONS
            .iter()
            .map(|r| {
                let mut labels = String::new();
                push_label(&mut labels, "reason", r);
                Series {
                    labels: labels.into(),
                    value: count(s.errors.get(r).copied().unwrap_or(0)),
                }
            })
            .collect();
        let mut families = vec![
            family(
                "gpu_exporter_pod_resources_up",
                "Whether the last kubelet pod-resources List call succeeded (1) or failed (0).",
                MetricType::Gauge,
                one(Value::Int(i64::from(s.up))),
            ),
            family(
                "gpu_exporter_pod_resources_last_success_timestamp_seconds",
                "Unix time of the last successful kubelet pod-resources List call (0: never).",
                MetricType::Gauge,
                one(Value::Float(s.last_success_seconds)),
            ),
            family(
                "gpu_exporter_pod_resources_errors_total",
                "Failed kubelet pod-resources List calls, by reason.",
                MetricType::Counter,
                errors,
            ),
            family(
                "gpu_exporter_pod_resources_unknown_devices",
                "GPU device ids in the last kubelet reply that match no local GPU or MIG instance.",
                MetricType::Gauge,
                one(count(s.unknown_devices)),
            ),
            family(
                "gpu_exporter_pod_resources_allocated_entities",
                "GPUs and MIG instances attributed to at least one container.",
                MetricType::Gauge,
                one(count(s.allocated_entities)),
            ),
        ];
        if s.dra_enabled {
            let unresolved = crate::pods::dra::Unresolved::REASONS
                .iter()
                .map(|r| {
                    let mut labels = String::new();
                    push_label(&mut labels, "reason", r);
                    Series {
                        labels: labels.into(),
                        value: count(s.dra_unresolved.get(r).copied().unwrap_or(0)),
                    }
                })
                .collect();
            families.push(family(
                "gpu_exporter_pod_resources_dra_unresolved_devices",
                "Devices of NVIDIA's DRA driver (gpu.nvidia.com) in the last kubelet reply that resolve to no local GPU or MIG instance, by reason (no_match, unrecognised_name); they get no pod labels.",
                MetricType::Gauge,
                unresolved,
            ));
        }
        families
    }
}

/// The first sample's wait for the attribution sources (kubelet, container runtime, HPC
/// directory) and the bodies re-published between samples because attribution changed; updated
/// by the sampler and rendered as `gpu_exporter_attribution_*`.
#[derive(Debug, Default)]
pub struct AttributionStatus {
    inner: Mutex<AttributionState>,
}

/// A copy of [`AttributionStatus`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttributionState {
    /// Each source the first sample waits for, with the number of first samples published
    /// without its first answer (it did not answer within its call timeout).
    pub first_answer_timeouts: BTreeMap<&'static str, u64>,
    /// Bodies re-rendered from the last readings because attribution changed.
    pub updates: u64,
}

impl AttributionStatus {
    fn lock(&self) -> std::sync::MutexGuard<'_, AttributionState> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a source the first sample waits for (turns the families on).
    pub fn add_source(&self, source: &'static str) {
        self.lock().first_answer_timeouts.entry(source).or_default();
    }

    /// Counts a first sample published without `source`'s first answer.
    pub fn count_timeout(&self, source: &'static str) {
        *self.lock().first_answer_timeouts.entry(source).or_default() += 1;
    }

    /// Counts a body re-rendered because attribution changed.
    pub fn count_update(&self) {
        self.lock().updates += 1;
    }

    /// A copy of the current state.
    pub fn state(&self) -> AttributionState {
        self.lock().clone()
    }

    fn families(&self) -> Vec<Family> {
        let s = self.state();
        if s.first_answer_timeouts.is_empty() {
            return Vec::new();
        }
        vec![
            family(
                "gpu_exporter_attribution_first_answer_timeouts_total",
                "First samples published without this attribution source's first answer: it did not answer within its call timeout, so that sample went out without its labels (they follow as soon as it answers).",
                MetricType::Counter,
                s.first_answer_timeouts
                    .iter()
                    .map(|(src, n)| labelled(&[("source", src)], count(*n)))
                    .collect(),
            ),
            family(
                "gpu_exporter_attribution_updates_total",
                "Bodies re-published between samples because attribution changed (pods, containers, HPC jobs): re-rendered from the last GPU readings, without reading the GPUs again.",
                MetricType::Counter,
                one(count(s.updates)),
            ),
        ]
    }
}

/// The HPC job mapping's health, updated by [`crate::hpc::HpcWatcher`] and rendered with each
/// sample as `gpu_exporter_hpc_job_*`.
#[derive(Debug, Default)]
pub struct HpcJobsStatus {
    inner: Mutex<HpcJobsState>,
}

/// A copy of [`HpcJobsStatus`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HpcJobsState {
    /// Whether `--hpc-job-mapping-dir` is set (the families are rendered only then).
    pub enabled: bool,
    /// Mapping files read successfully at the last scan.
    pub files_ok: u64,
    /// Mapping files ignored at the last scan (unreadable or invalid).
    pub files_bad: u64,
    /// Problems seen, by reason (each counted when it appears).
    pub errors: BTreeMap<&'static str, u64>,
    /// Directory entries not read at the last scan, by reason.
    pub ignored: BTreeMap<&'static str, u64>,
}

impl HpcJobsStatus {
    fn lock(&self) -> std::sync::MutexGuard<'_, HpcJobsState> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Turns the families on.
    pub fn enable(&self) {
        self.lock().enabled = true;
    }

    /// Records the file counts of a scan.
    pub fn record_scan(&self, ok: usize, bad: usize) {
        let mut s = self.lock();
        s.files_ok = ok as u64;
        s.files_bad = bad as u64;
    }

    /// Records the entries the last scan did not read, by reason.
    pub fn record_ignored(&self, ignored: &BTreeMap<&'static str, usize>) {
        self.lock().ignored = ignored.iter().map(|(&k, &v)| (k, v as u64)).collect();
    }

    /// Counts a new problem.
    pub fn count_error(&self, reason: &'static str) {
        *self.lock().errors.entry(reason).or_default() += 1;
    }

    /// A copy of the current state.
    pub fn state(&self) -> HpcJobsState {
        self.lock().clone()
    }

    fn families(&self) -> Vec<Family> {
        let s = self.state();
        if !s.enabled {
            return Vec::new();
        }
        let count = |n: u64| Value::Int(i64::try_from(n).unwrap_or(i64::MAX));
        let labelled = |k: &str, v: &str, n: u64| {
            let mut labels = String::new();
            push_label(&mut labels, k, v);
            Series {
                labels: labels.into(),
                value: count(n),
            }
        };
        vec![
            Family {
                name: "gpu_exporter_hpc_job_files".to_owned(),
                help: "HPC job mapping files at the last read of --hpc-job-mapping-dir: ok (in use), bad (ignored: unreadable or invalid).".to_owned(),
                kind: MetricType::Gauge,
                series: vec![
                    labelled("state", "bad", s.files_bad),
                    labelled("state", "ok", s.files_ok),
                ],
            },
            Family {
                name: "gpu_exporter_hpc_job_file_errors_total".to_owned(),
                help: "Problems with the HPC job mapping directory or its files, by reason, each counted when it appears.".to_owned(),
                kind: MetricType::Counter,
                series: crate::hpc::HpcError::REASONS
                    .iter()
                    .map(|r| labelled("reason", r, s.errors.get(r).copied().unwrap_or(0)))
                    .collect(),
            },
            Family {
                name: "gpu_exporter_hpc_job_files_ignored".to_owned(),
                help: "Entries of --hpc-job-mapping-dir not read at the last scan, by reason: no_such_gpu (named for a GPU or MIG instance not on this node), not_a_mapping_name.".to_owned(),
                kind: MetricType::Gauge,
                series: crate::hpc::Ignored::REASONS
                    .iter()
                    .map(|r| labelled("reason", r, s.ignored.get(r).copied().unwrap_or(0)))
                    .collect(),
            },
        ]
    }
}

/// The web configuration's reloads and the serving certificate, updated by
/// [`crate::web::WebSecurity`] and rendered with each sample as `gpu_exporter_web_*` when
/// `--web-config-file` is set.
#[derive(Debug, Default)]
pub struct WebConfigStatus {
    inner: Mutex<WebConfigState>,
}

/// A copy of [`WebConfigStatus`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebConfigState {
    /// Whether `--web-config-file` is set (the families are rendered only then).
    pub enabled: bool,
    /// Changes of the file (or of a certificate, key or CA it names) taken into use.
    pub reloads_ok: u64,
    /// Changes rejected (the previous configuration keeps serving).
    pub reloads_failed: u64,
    /// Whether the last change was rejected.
    pub last_reload_failed: bool,
    /// `notAfter` of the certificate being served, Unix seconds (`None`: no TLS).
    pub certificate_expiry_seconds: Option<f64>,
}

impl WebConfigStatus {
    fn lock(&self) -> std::sync::MutexGuard<'_, WebConfigState> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Turns the families on, with the expiry of the certificate served at startup.
    pub fn enable(&self, certificate_expiry_seconds: Option<f64>) {
        let mut s = self.lock();
        s.enabled = true;
        s.certificate_expiry_seconds = certificate_expiry_seconds;
    }

    /// Records a change taken into use, with the expiry of the certificate served from now on.
    pub fn record_success(&self, certificate_expiry_seconds: Option<f64>) {
        let mut s = self.lock();
        s.reloads_ok += 1;
        s.last_reload_failed = false;
        s.certificate_expiry_seconds = certificate_expiry_seconds;
    }

    /// Records a rejected change (the certificate served does not change).
    pub fn record_failure(&self) {
        let mut s = self.lock();
        s.reloads_failed += 1;
        s.last_reload_failed = true;
    }

    /// A copy of the current state.
    pub fn state(&self) -> WebConfigState {
        self.lock().clone()
    }

    fn families(&self) -> Vec<Family> {
        let s = self.state();
        if !s.enabled {
            return Vec::new();
        }
        let mut families = vec![
            family(
                "gpu_exporter_web_config_reloads_total",
                "Changes of --web-config-file or of a certificate, key or CA it names, by result: success (in use), failure (rejected; the previous configuration keeps serving).",
                MetricType::Counter,
                vec![
                    labelled(&[("result", "failure")], count(s.reloads_failed)),
                    labelled(&[("result", "success")], count(s.reloads_ok)),
                ],
            ),
            family(
                "gpu_exporter_web_config_last_reload_success",
                "1 if the last change of --web-config-file or its certificates was taken into use (or none was seen), 0 if it was rejected and the previous configuration is serving.",
                MetricType::Gauge,
                one(Value::Int(i64::from(!s.last_reload_failed))),
            ),
        ];
        if let Some(t) = s.certificate_expiry_seconds {
            families.push(family(
                "gpu_exporter_web_tls_certificate_expiry_timestamp_seconds",
                "notAfter of the TLS certificate being served, as Unix time: after it, verifying scrapers fail.",
                MetricType::Gauge,
                one(Value::Float(t)),
            ));
        }
        families
    }
}

/// The container-runtime client's health, updated by the CRI refresher and rendered with each
/// sample as `gpu_exporter_cri_*`.
#[derive(Debug, Default)]
pub struct CriStatus {
    inner: Mutex<CriState>,
}

/// A copy of [`CriStatus`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CriState {
    /// Whether the CRI client runs (the families are rendered only then).
    pub enabled: bool,
    /// Whether the last listing succeeded.
    pub up: bool,
    /// Unix time of the last successful listing (0: never).
    pub last_success_seconds: f64,
    /// Failed listings by reason.
    pub errors: BTreeMap<&'static str, u64>,
    /// Pods in the published answer.
    pub pods: u64,
    /// Containers in the published answer.
    pub containers: u64,
}

impl CriStatus {
    fn lock(&self) -> std::sync::MutexGuard<'_, CriState> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Turns the families on.
    pub fn enable(&self) {
        self.lock().enabled = true;
    }

    /// Records a successful listing at `unix_seconds`.
    pub fn record_success(&self, unix_seconds: f64) {
        let mut s = self.lock();
        s.up = true;
        s.last_success_seconds = unix_seconds;
    }

    /// Records a failed listing.
    pub fn record_failure(&self, reason: &'static str) {
        let mut s = self.lock();
        s.up = false;
        *s.errors.entry(reason).or_default() += 1;
    }

    /// Records the size of what was published.
    pub fn record_published(&self, pods: usize, containers: usize) {
        let mut s = self.lock();
        s.pods = pods as u64;
        s.containers = containers as u64;
    }

    /// A copy of the current state.
    pub fn state(&self) -> CriState {
        self.lock().clone()
    }

    fn families(&self) -> Vec<Family> {
        let s = self.state();
        if !s.enabled {
            return Vec::new();
        }
        let errors = CriError::REASONS
            .iter()
            .map(|r| {
                labelled(
                    &[("reason", r)],
                    count(s.errors.get(r).copied().unwrap_or(0)),
                )
            })
            .collect();
        vec![
            family(
                "gpu_exporter_cri_up",
                "Whether the last container runtime (CRI) listing succeeded (1) or failed (0).",
                MetricType::Gauge,
                one(Value::Int(i64::from(s.up))),
            ),
            family(
                "gpu_exporter_cri_last_success_timestamp_seconds",
                "Unix time of the last successful container runtime (CRI) listing (0: never).",
                MetricType::Gauge,
                one(Value::Float(s.last_success_seconds)),
            ),
            family(
                "gpu_exporter_cri_errors_total",
                "Failed container runtime (CRI) listings, by reason.",
                MetricType::Counter,
                errors,
            ),
            family(
                "gpu_exporter_cri_pods",
                "Pods in the container runtime answer in use (0 when none is within the TTL).",
                MetricType::Gauge,
                one(count(s.pods)),
            ),
            family(
                "gpu_exporter_cri_containers",
                "Containers in the container runtime answer in use (0 when none is within the TTL).",
                MetricType::Gauge,
                one(count(s.containers)),
            ),
        ]
    }
}

/// Per-process attribution: what became of the GPU processes of the last tick, and failures.
#[derive(Debug, Default)]
pub struct ProcessStatus {
    inner: Mutex<ProcessState>,
}

/// A copy of [`ProcessStatus`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessState {
    /// Whether per-process attribution is on (the families are rendered only then).
    pub enabled: bool,
    /// GPU processes of the last tick by outcome ([`ProcessStatus::OUTCOMES`]).
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Failures by reason ([`ProcessStatus::REASONS`]).
    pub errors: BTreeMap<&'static str, u64>,
}

impl ProcessStatus {
    /// Every `outcome` label value of `gpu_exporter_gpu_processes`.
    pub const OUTCOMES: &'static [&'static str] = &[
        "attributed",
        "outside_pods",
        "unknown_container",
        "unreadable",
    ];

    /// Every `reason` label value of `gpu_exporter_process_attribution_errors_total`.
    pub const REASONS: &'static [&'static str] = &[
        "cgroup_unrecognised",
        "nvml_failed",
        "nvml_no_permission",
        "proc_not_found",
        "proc_permission_denied",
        "proc_unreadable",
        "runtime_unavailable",
        "unknown_container",
    ];

    fn lock(&self) -> std::sync::MutexGuard<'_, ProcessState> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Turns the families on.
    pub fn enable(&self) {
        self.lock().enabled = true;
    }

    /// Records one tick: processes by outcome, and failures by reason.
    pub fn record_tick(
        &self,
        outcomes: &BTreeMap<&'static str, u64>,
        errors: &BTreeMap<&'static str, u64>,
    ) {
        let mut s = self.lock();
        s.outcomes.clone_from(outcomes);
        for (r, n) in errors {
            *s.errors.entry(r).or_default() += n;
        }
    }

    /// A copy of the current state.
    pub fn state(&self) -> ProcessState {
        self.lock().clone()
    }

    fn families(&self) -> Vec<Family> {
        let s = self.state();
        if !s.enabled {
            return Vec::new();
        }
        let by = |label: &str, keys: &[&str], m: &BTreeMap<&'static str, u64>| -> Vec<Series> {
            keys.iter()
                .map(|k| labelled(&[(label, k)], count(m.get(k).copied().unwrap_or(0))))
                .collect()
        };
        vec![
            family(
                "gpu_exporter_gpu_processes",
                "GPU processes seen at the last tick, by attribution outcome: attributed (to a container the runtime lists), outside_pods (host processes, non-Kubernetes containers), unknown_container (a pod's container the runtime does not list, or no runtime answer), unreadable (/proc/<pid>/cgroup unreadable).",
                MetricType::Gauge,
                by("outcome", Self::OUTCOMES, &s.outcomes),
            ),
            family(
                "gpu_exporter_process_attribution_errors_total",
                "Per-process attribution failures, by reason: NVML process reads (per GPU and tick), /proc reads (per process and tick), containers the runtime does not list, ticks without a runtime answer.",
                MetricType::Counter,
                by("reason", Self::REASONS, &s.errors),
            ),
        ]
    }
}

fn count(n: u64) -> Value {
    Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

fn one(v: Value) -> Vec<Series> {
    vec![Series {
        labels: "".into(),
        value: v,
    }]
}

fn labelled(pairs: &[(&str, &str)], v: Value) -> Series {
    let mut labels = String::new();
    for (k, val) in pairs {
        push_label(&mut labels, k, val);
    }
    Series {
        labels: labels.into(),
        value: v,
    }
}

fn family(name: &str, help: &str, kind: MetricType, series: Vec<Series>) -> Family {
    Family {
        name: name.to_owned(),
        help: help.to_owned(),
        kind,
        series,
    }
}

/// GPUs by state, for `gpu_exporter_gpus`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuStates {
    /// Read fine and every health watch passes.
    pub healthy: u64,
    /// Read fine, but a health watch warns or fails.
    pub unhealthy: u64,
    /// Fell off the bus.
    pub lost: u64,
    /// Could not be read for another reason.
    pub unreadable: u64,
}

/// One sample's figures for the self-metric families.
#[derive(Debug, Clone, Default)]
pub struct SampleStats {
    /// How long the tick took, seconds.
    pub duration_seconds: f64,
    /// Wall-clock time of the sample, Unix seconds.
    pub timestamp_seconds: f64,
    /// GPUs by state.
    pub gpus: GpuStates,
    /// Series in the DCGM part of the body.
    pub series: usize,
}

impl SelfMetrics {
    /// Renders `gpu_exporter_log_write_errors_total` from `counter` (the log writer's count of
    /// failed writes) once it is non-zero.
    #[must_use]
    pub fn with_log_write_errors(mut self, counter: std::sync::Arc<AtomicU64>) -> Self {
        self.log_write_errors = counter;
        self
    }

    /// Counts a finished sampling tick.
    pub fn count_sample(&self) {
        self.samples.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a device-level failure by reason.
    pub fn count_sample_error(&self, reason: &'static str) {
        let mut m = self
            .sample_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *m.entry(reason).or_default() += 1;
    }

    /// Counts a metrics-CSV reload attempt and remembers whether the last one worked.
    pub fn count_reload(&self, success: bool) {
        let c = if success {
            &self.reloads_ok
        } else {
            &self.reloads_failed
        };
        c.fetch_add(1, Ordering::Relaxed);
        self.last_reload_failed.store(!success, Ordering::Relaxed);
    }

    /// Counts field read failures.
    pub fn count_field_errors(&self, errors: &[(Field, FieldError)]) {
        if errors.is_empty() {
            return;
        }
        let mut m = self
            .field_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for &e in errors {
            *m.entry(e).or_default() += 1;
        }
    }

    /// Sets the GPUs on which each field of the catalog can never be read, by why (the
    /// sampler's answer after each discovery or catalog change; replaces the previous one).
    pub fn set_field_gaps(&self, gaps: BTreeMap<(Field, FieldGap), u64>) {
        *self
            .field_gaps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = gaps;
    }

    /// The self-metric families for the body of this sample.
    pub fn families(&self, stats: &SampleStats, backend: &str) -> Vec<Family> {
        let gauge = |name: &str, help: &str, series: Vec<Series>| Family {
            name: name.to_owned(),
            help: help.to_owned(),
            kind: MetricType::Gauge,
            series,
        };
        let counter = |name: &str, help: &str, series: Vec<Series>| Family {
            name: name.to_owned(),
            help: help.to_owned(),
            kind: MetricType::Counter,
            series,
        };
        let one = |v: Value| {
            vec![Series {
                labels: "".into(),
                value: v,
            }]
        };
        let labelled = |pairs: &[(&str, &str)], v: Value| {
            let mut labels = String::new();
            for (k, val) in pairs {
                push_label(&mut labels, k, val);
            }
            Series {
                labels: labels.into(),
                value: v,
            }
        };
        let count = |n: u64| Value::Int(i64::try_from(n).unwrap_or(i64::MAX));

        let sample_errors: Vec<Series> = {
            let m = self
                .sample_errors
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            ["device_error", "discovery_error", "gpu_lost"]
                .iter()
                .map(|r| labelled(&[("reason", r)], count(m.get(r).copied().unwrap_or(0))))
                .collect()
        };
        let field_errors: Vec<Series> = {
            let m = self
                .field_errors
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            m.iter()
                .map(|((f, e), n)| {
                    labelled(
                        &[("field", f.dcgm_name()), ("reason", e.as_str())],
                        count(*n),
                    )
                })
                .collect()
        };
        let field_gaps: Vec<Series> = {
            let m = self
                .field_gaps
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            m.iter()
                .map(|((f, gap), n)| {
                    labelled(
                        &[("field", f.dcgm_name()), ("reason", gap.as_str())],
                        count(*n),
                    )
                })
                .collect()
        };
        let g = stats.gpus;
        let mut families = vec![
            gauge(
                "gpu_exporter_build_info",
                "A metric with a constant '1' value labelled by version and GPU backend.",
                vec![labelled(
                    &[("backend", backend), ("version", env!("CARGO_PKG_VERSION"))],
                    Value::Int(1),
                )],
            ),
            gauge(
                "gpu_exporter_gpus",
                "GPUs found at the last discovery, by state (healthy, unhealthy: a health watch warns or fails, lost: fallen off the bus, unreadable).",
                vec![
                    labelled(&[("state", "healthy")], count(g.healthy)),
                    labelled(&[("state", "lost")], count(g.lost)),
                    labelled(&[("state", "unhealthy")], count(g.unhealthy)),
                    labelled(&[("state", "unreadable")], count(g.unreadable)),
                ],
            ),
            gauge(
                "gpu_exporter_sample_duration_seconds",
                "Time the last sampling tick took to read every GPU and render the body.",
                one(Value::Float(stats.duration_seconds)),
            ),
            gauge(
                "gpu_exporter_last_sample_timestamp_seconds",
                "Unix time of the last completed sample.",
                one(Value::Float(stats.timestamp_seconds)),
            ),
            gauge(
                "gpu_exporter_series",
                "GPU series in the last sample's body.",
                one(count(stats.series as u64)),
            ),
            counter(
                "gpu_exporter_samples_total",
                "Sampling ticks completed.",
                one(count(self.samples.load(Ordering::Relaxed))),
            ),
            counter(
                "gpu_exporter_sample_errors_total",
                "Devices that could not be sampled, by reason.",
                sample_errors,
            ),
            counter(
                "gpu_exporter_field_errors_total",
                "Field reads that failed (their series is missing), by field and reason.",
                field_errors,
            ),
            gauge(
                "gpu_exporter_fields_unavailable",
                "GPUs on which a field of the metrics CSV can never be read, so its series is absent there, by field and reason (needs_dcgm_profiling: a DCGM_FI_PROF_* field on a GPU older than Hopper, which NVML cannot profile; DCGM's profiling module can).",
                field_gaps,
            ),
            counter(
                "gpu_exporter_config_reloads_total",
                "Metrics CSV reloads (SIGHUP or file change), by result.",
                vec![
                    labelled(&[("result", "failure")], count(self.reloads_failed.load(Ordering::Relaxed))),
                    labelled(&[("result", "success")], count(self.reloads_ok.load(Ordering::Relaxed))),
                ],
            ),
            gauge(
                "gpu_exporter_config_last_reload_success",
                "1 if the last metrics CSV reload succeeded (or none was attempted), 0 if it was rejected and the previous configuration is serving.",
                one(Value::Int(i64::from(!self.last_reload_failed.load(Ordering::Relaxed)))),
            ),
            counter(
                "gpu_exporter_scrapes_total",
                "Requests for /metrics served, as of the last sample.",
                one(count(self.scrapes.load(Ordering::Relaxed))),
            ),
        ];
        // Absent until a log line is lost (stderr closed: a log shipper restarting), so that
        // the bodies of healthy exporters do not change.
        let lost = self.log_write_errors.load(Ordering::Relaxed);
        if lost > 0 {
            families.push(counter(
                "gpu_exporter_log_write_errors_total",
                "Writes of log lines to stderr that failed (the lines are lost; absent until the first).",
                one(count(lost)),
            ));
        }
        families.extend(self.http.families());
        families.extend(self.pod_resources.families());
        families.extend(self.cri.families());
        families.extend(self.processes.families());
        families.extend(self.hpc_jobs.families());
        families.extend(self.attribution.families());
        families.extend(self.web.families());
        families
    }
}
