//! The sampling loop: tick → read every device on a blocking thread (with per-process
//! attribution, also its processes and their cgroups) → record events → attribute processes to
//! containers → build the snapshot → render it once → publish the bytes.
//!
//! Attribution is there from the first sample: the first tick after a successful device
//! discovery waits for the first answer of every configured attribution source (kubelet,
//! container runtime, HPC directory), each at most its call timeout; a source that did not
//! answer in time is logged and counted (`gpu_exporter_attribution_first_answer_timeouts_total`).
//! After that, a change of attribution is published as soon as a source publishes it: the last
//! readings are attributed and rendered again, without reading the GPUs
//! (`gpu_exporter_attribution_updates_total`).
//!
//! Scrapes never reach this code: they clone the last published [`Published`] body. A slow
//! source delays the next sample (ticks are skipped, not queued); a failing device only removes
//! its own series and is counted in `gpu_exporter_sample_errors_total`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::catalog::{Catalog, Field};
use crate::gpu::{
    Device, DeviceSample, FieldError, FieldGap, GpuProcess, GpuSource, SourceError, Value, XidEvent,
};
use crate::health::{History, Recent, Status};
use crate::hpc::HpcJobs;
use crate::pods::directory::PodDirectory;
use crate::pods::procfs::ProcRoot;
use crate::pods::usage::{self, Owner};
use crate::pods::{Answered, Attribution};
use crate::render::render;
use crate::self_metrics::{self, Registry};
use crate::snapshot::{self, BuildOptions, DeviceOutcome, Workload};

mod metrics;
pub use metrics::{AttributionMetrics, AttributionState, GpuStates, SampleMetrics, SampleStats};

/// A rendered sample, as served by `/metrics`.
#[derive(Debug, Clone)]
pub struct Published {
    /// The exposition body.
    pub body: Bytes,
    /// When it was taken (monotonic).
    pub at: Instant,
    /// GPU series in it.
    pub series: usize,
    /// Why the GPU source is not ready (device discovery failing, e.g. NVML not loaded yet);
    /// `None` once a discovery has succeeded. `/ready` answers 503 with this text.
    pub not_ready: Option<String>,
    /// The body gzip-compressed, made by the first scrape that asks for it.
    gzip: OnceLock<Bytes>,
}

impl Published {
    /// A published sample.
    pub fn new(body: Bytes, at: Instant, series: usize, not_ready: Option<String>) -> Self {
        Self {
            body,
            at,
            series,
            not_ready,
            gzip: OnceLock::new(),
        }
    }

    /// The body, gzip-compressed. Compressed once per sample, by the first scrape that accepts
    /// gzip (Prometheus always does); later scrapes of the same sample get the same bytes. The
    /// fast level: exposition text shrinks about tenfold at a fraction of the default's cost.
    pub fn gzip_body(&self) -> &Bytes {
        self.gzip.get_or_init(|| {
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(self.body.len() / 8 + 64),
                flate2::Compression::fast(),
            );
            let compressed = enc
                .write_all(&self.body)
                .and_then(|()| enc.finish())
                .expect("gzip into a Vec: writing to memory cannot fail");
            Bytes::from(compressed)
        })
    }
}

/// One device and what reading it gave.
type DeviceRead = (Device, Result<DeviceSample, SourceError>);

/// What one tick read on the blocking thread: samples, per-process readings (per device, when
/// on), the cgroup owner of every PID, one error text per failure reason, and XIDs.
struct TickRead {
    samples: Vec<DeviceRead>,
    processes: Vec<Option<Result<Vec<GpuProcess>, FieldError>>>,
    owners: HashMap<u32, Owner>,
    examples: BTreeMap<&'static str, String>,
    xids: Vec<(String, XidEvent)>,
}

/// An attribution source the first sample waits for.
#[derive(Debug)]
struct FirstAnswer {
    /// `kubelet`, `cri` or `hpc`.
    source: &'static str,
    answered: watch::Receiver<Answered>,
    /// The longest wait: the source's call timeout.
    wait: Duration,
}

/// The last sample's readings, kept so that a change of attribution can be published at once
/// by attributing and rendering them again.
#[derive(Debug)]
struct LastSample {
    catalog: Arc<Catalog>,
    outcomes: Vec<DeviceOutcome>,
    /// Per device, in `outcomes` order (empty when per-process attribution is off).
    processes: Vec<Option<Result<Vec<GpuProcess>, FieldError>>>,
    owners: HashMap<u32, Owner>,
    begun: Instant,
    duration_seconds: f64,
    timestamp_seconds: f64,
}

/// Sampler settings.
#[derive(Debug, Clone)]
pub struct SamplerOptions {
    /// Time between samples.
    pub interval: Duration,
    /// Time between device re-enumerations.
    pub rediscover_every: Duration,
    /// Label shaping.
    pub build: BuildOptions,
}

/// Fields read for health and clock-event series even if the CSV does not list them.
const HEALTH_INPUTS: &[Field] = &[
    Field::ClocksEventReasons,
    Field::PcieReplayCounter,
    Field::EccDbeVolTotal,
    Field::RetiredPending,
    Field::RowRemapFailure,
    Field::RowRemapPending,
    Field::NvlinkCrcFlitErrorCountTotal,
    Field::NvlinkCrcDataErrorCountTotal,
    Field::NvlinkReplayErrorCountTotal,
    Field::NvlinkRecoveryErrorCountTotal,
];

/// The fields a catalog needs read, including the inputs of derived series.
pub fn fields_to_read(catalog: &Catalog, supported: impl Fn(Field) -> bool) -> Vec<Field> {
    let mut fields: Vec<Field> = catalog
        .fields()
        .into_iter()
        .filter(|f| !f.is_exporter() && *f != Field::XidErrors)
        .collect();
    let derived = catalog.metrics.iter().any(|m| {
        matches!(
            m.field,
            Field::ExpGpuHealthStatus | Field::ExpClockEventsCount
        )
    });
    if derived {
        fields.extend(HEALTH_INPUTS.iter().copied().filter(|f| supported(*f)));
    }
    fields.sort();
    fields.dedup();
    fields
}

/// Which of `fields` `source` can never read on which of `devices` (GPU indexes), and why.
pub fn field_gaps<S: GpuSource + ?Sized>(
    source: &S,
    devices: &[Device],
    fields: &[Field],
) -> BTreeMap<(Field, FieldGap), Vec<u32>> {
    let mut out: BTreeMap<(Field, FieldGap), Vec<u32>> = BTreeMap::new();
    for d in devices {
        for &f in fields {
            if let Some(gap) = source.field_gap(d, f) {
                out.entry((f, gap)).or_default().push(d.identity.index);
            }
        }
    }
    out
}

/// What the sampler counts into, and what it encodes after the GPU series of each body.
#[derive(Debug, Clone)]
pub struct SamplerMetrics {
    /// Its own figures (`gpu_exporter_build_info`, `gpu_exporter_gpus`, `gpu_exporter_sample*`...).
    pub samples: Arc<SampleMetrics>,
    /// The first sample's wait for attribution, and re-published bodies.
    pub attribution: Arc<AttributionMetrics>,
    /// Per-process attribution's outcomes and failures.
    pub processes: Arc<usage::ProcessMetrics>,
    /// Every module's `gpu_exporter_*` collectors, these three included where the composition
    /// root registered them: encoded once per sample into the body, so scrapes cost nothing.
    pub registry: Arc<Registry>,
}

impl SamplerMetrics {
    /// The sampler's own collectors alone, in a registry of their own, in the order `main.rs`
    /// registers them (for a sampler on its own: tests and benchmarks that serve no HTTP).
    pub fn standalone() -> Self {
        let samples = Arc::new(SampleMetrics::default());
        let attribution = Arc::new(AttributionMetrics::default());
        let processes = Arc::new(usage::ProcessMetrics::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Arc::clone(&samples)));
        registry.register_collector(Box::new(Arc::clone(&processes)));
        registry.register_collector(Box::new(Arc::clone(&attribution)));
        Self {
            samples,
            attribution,
            processes,
            registry: Arc::new(registry),
        }
    }
}

/// The sampling loop's state.
#[derive(Debug)]
pub struct Sampler<S: GpuSource> {
    source: Arc<S>,
    catalog: watch::Receiver<Arc<Catalog>>,
    attribution: watch::Receiver<Arc<Attribution>>,
    opts: SamplerOptions,
    metrics: SamplerMetrics,
    history: History,
    devices: Vec<Device>,
    discovered_at: Option<Instant>,
    not_ready: Option<String>,
    started: Instant,
    inventory: Option<watch::Sender<Arc<Vec<Device>>>>,
    /// Label-type field values from each GPU's last good sample, by UUID.
    last_labels: HashMap<String, Vec<(Field, Value)>>,
    /// The container runtime's directory (pod UIDs, labels, containers), when it runs.
    directory: Option<watch::Receiver<Arc<PodDirectory>>>,
    /// Asks the container runtime task to list again (a container it did not list was seen).
    cri_waker: Option<Arc<tokio::sync::Notify>>,
    /// Per-process attribution: the host's /proc. `None`: off.
    proc_root: Option<ProcRoot>,
    /// Per-process attribution problems logged and not yet cleared.
    process_problems: BTreeSet<&'static str>,
    /// HPC job mapping (`--hpc-job-mapping-dir`).
    hpc_jobs: Option<watch::Receiver<Arc<HpcJobs>>>,
    /// The last pod attribution and HPC jobs, and the two merged (reused while unchanged).
    merged: Option<(Arc<Attribution>, Arc<HpcJobs>, Arc<Attribution>)>,
    /// The attribution sources the first sample waits for.
    first_answers: Vec<FirstAnswer>,
    /// Whether the first sample after a successful discovery has waited for them.
    waited: bool,
    /// The last sample's readings.
    last: Option<LastSample>,
    /// Bumped whenever discovery finds a different device list.
    device_generation: u64,
    /// The catalog and device generation the field gaps were last worked out for.
    gaps_checked: Option<(Arc<Catalog>, u64)>,
    /// Field gaps already logged (each reason is logged once).
    gaps_logged: BTreeSet<FieldGap>,
}

impl<S: GpuSource> Sampler<S> {
    /// Creates a sampler. The catalog and attribution are read afresh at every tick, so a
    /// reloaded CSV or new pod assignments take effect on the next sample.
    pub fn new(
        source: Arc<S>,
        catalog: watch::Receiver<Arc<Catalog>>,
        attribution: watch::Receiver<Arc<Attribution>>,
        opts: SamplerOptions,
        metrics: SamplerMetrics,
    ) -> Self {
        let history = History::new(opts.build.xid_window_ms, opts.build.clock_window_ms);
        Self {
            source,
            catalog,
            attribution,
            opts,
            metrics,
            history,
            devices: Vec::new(),
            discovered_at: None,
            not_ready: Some("no device discovery yet".into()),
            started: Instant::now(),
            inventory: None,
            last_labels: HashMap::new(),
            directory: None,
            cri_waker: None,
            proc_root: None,
            process_problems: BTreeSet::new(),
            hpc_jobs: None,
            merged: None,
            first_answers: Vec::new(),
            waited: false,
            last: None,
            device_generation: 0,
            gaps_checked: None,
            gaps_logged: BTreeSet::new(),
        }
    }

    /// Makes the first sample wait for the first answer of an attribution source (`kubelet`,
    /// `cri`, `hpc`) on `answered`, at most `wait` (its call timeout). A source that does not
    /// answer in time is logged and counted in
    /// `gpu_exporter_attribution_first_answer_timeouts_total`; its labels follow when it answers.
    #[must_use]
    pub fn with_first_answer(
        mut self,
        source: &'static str,
        answered: watch::Receiver<Answered>,
        wait: Duration,
    ) -> Self {
        self.metrics.attribution.add_source(source);
        self.first_answers.push(FirstAnswer {
            source,
            answered,
            wait,
        });
        self
    }

    /// Reads pod UIDs, pod labels and containers from the container runtime task's channel;
    /// `waker` asks that task to list again when a tick meets a container it did not list.
    #[must_use]
    pub fn with_directory(
        mut self,
        rx: watch::Receiver<Arc<PodDirectory>>,
        waker: Arc<tokio::sync::Notify>,
    ) -> Self {
        self.directory = Some(rx);
        self.cri_waker = Some(waker);
        self
    }

    /// Turns on per-process attribution: each tick also reads every GPU's processes and their
    /// cgroups under `root`. Turns on the `gpu_exporter_gpu_processes` and
    /// `gpu_exporter_process_attribution_errors_total` families.
    #[must_use]
    pub fn with_process_usage(mut self, root: ProcRoot) -> Self {
        self.metrics.processes.enable();
        self.proc_root = Some(root);
        self
    }

    /// Reads HPC job ids from `rx` at every tick (published by [`crate::hpc::HpcWatcher`]).
    #[must_use]
    pub fn with_hpc_jobs(mut self, rx: watch::Receiver<Arc<HpcJobs>>) -> Self {
        self.hpc_jobs = Some(rx);
        self
    }

    /// The current attribution: the pods', with the HPC jobs merged in.
    fn attribution_now(&mut self) -> Arc<Attribution> {
        let pods = self.attribution.borrow_and_update().clone();
        let Some(rx) = &mut self.hpc_jobs else {
            return pods;
        };
        let hpc = rx.borrow_and_update().clone();
        if hpc.jobs.is_empty() {
            return pods;
        }
        if let Some((p, h, merged)) = &self.merged {
            if Arc::ptr_eq(p, &pods) && Arc::ptr_eq(h, &hpc) {
                return Arc::clone(merged);
            }
        }
        let merged = Arc::new(Attribution {
            holders: pods.holders.clone(),
            jobs: hpc.jobs.clone(),
        });
        self.merged = Some((pods, hpc, Arc::clone(&merged)));
        merged
    }

    /// Publishes each newly discovered device list on `tx` (for pod attribution, which maps
    /// kubelet device ids to these devices).
    #[must_use]
    pub fn with_inventory(mut self, tx: watch::Sender<Arc<Vec<Device>>>) -> Self {
        self.inventory = Some(tx);
        self
    }

    /// Runs until `shutdown`, publishing each sample on `tx`.
    pub async fn run(
        mut self,
        tx: watch::Sender<Option<Arc<Published>>>,
        shutdown: CancellationToken,
    ) {
        let mut ticker = tokio::time::interval(self.opts.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut first_logged = false;
        loop {
            let published = tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => tokio::select! {
                    () = shutdown.cancelled() => return,
                    p = self.tick() => Some(p),
                },
                () = changed(Some(&mut self.attribution)) => self.update(),
                () = changed(self.directory.as_mut()) => self.update(),
                () = changed(self.hpc_jobs.as_mut()) => self.update(),
            };
            if let Some(p) = published {
                let first = !first_logged && p.not_ready.is_none();
                let series = p.series;
                tx.send_replace(Some(p));
                if first {
                    first_logged = true;
                    tracing::info!(series, "first sample published; /ready answers 200");
                }
            }
        }
    }

    /// The last sample attributed and rendered again with the current attribution (a source
    /// published a change); `None` before the first sample.
    pub fn update(&mut self) -> Option<Arc<Published>> {
        let mut last = self.last.take()?;
        let published = self.render_last(&mut last, false);
        self.last = Some(last);
        tracing::debug!(
            series = published.series,
            "attribution changed; the last sample re-published with it"
        );
        Some(published)
    }

    /// Waits for the first answer of every attribution source, each at most its call timeout.
    async fn wait_for_first_answers(&mut self) {
        let start = Instant::now();
        let devices = self.devices.clone();
        for gate in &mut self.first_answers {
            let deadline = start + gate.wait;
            let answered = matches!(
                tokio::time::timeout_at(deadline, gate.answered.wait_for(|a| a.covers(&devices)))
                    .await,
                Ok(Ok(_))
            );
            if answered {
                tracing::debug!(
                    source = gate.source,
                    "first sample: attribution source answered"
                );
            } else {
                self.metrics.attribution.count_timeout(gate.source);
                tracing::warn!(
                    source = gate.source,
                    timeout = ?gate.wait,
                    "first sample published without this attribution source: it did not answer within its call timeout; its labels follow as soon as it answers (gpu_exporter_attribution_first_answer_timeouts_total)"
                );
            }
        }
    }

    /// Takes one sample and renders it.
    pub async fn tick(&mut self) -> Arc<Published> {
        let begun = Instant::now();
        let catalog = self.catalog.borrow().clone();
        self.rediscover_if_due(begun).await;
        if !self.waited && self.not_ready.is_none() {
            self.waited = true;
            self.wait_for_first_answers().await;
        }

        let source = Arc::clone(&self.source);
        let fields = fields_to_read(&catalog, |f| source.supports(f));
        self.check_field_gaps(&catalog, &fields);
        let devices = self.devices.clone();
        let proc_root = self.proc_root.clone();
        let read = tokio::task::spawn_blocking(move || {
            read_devices(&*source, devices, &fields, proc_root.as_ref())
        })
        .await;
        let TickRead {
            samples,
            processes,
            owners,
            examples,
            xids,
        } = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "sampling thread failed; every device counts as unreadable this tick");
                let failed = self
                    .devices
                    .iter()
                    .map(|d| {
                        let err = SourceError::Device {
                            index: d.identity.index,
                            uuid: d.identity.uuid.clone(),
                            cause: e.to_string().into(),
                        };
                        (d.clone(), Err(err))
                    })
                    .collect();
                TickRead {
                    samples: failed,
                    processes: Vec::new(),
                    owners: HashMap::new(),
                    examples: BTreeMap::new(),
                    xids: Vec::new(),
                }
            }
        };
        let now_ms = u64::try_from((begun - self.started).as_millis()).unwrap_or(u64::MAX);
        for (uuid, x) in &xids {
            self.history.record_xid(uuid, now_ms, x.xid);
        }
        let mut outcomes = Vec::with_capacity(samples.len());
        for (device, result) in samples {
            let uuid = device.identity.uuid.clone();
            let sample = match result {
                Ok(s) => {
                    self.history.record_sample(&uuid, now_ms, &s);
                    let labels = catalog
                        .labels
                        .iter()
                        .filter_map(|spec| s.get(spec.field).map(|v| (spec.field, v.clone())))
                        .collect();
                    self.last_labels.insert(uuid.clone(), labels);
                    Ok(s)
                }
                Err(e) => {
                    self.metrics.samples.count_sample_error(e.reason());
                    tracing::debug!(error = %e, "device not sampled");
                    Err(e.reason())
                }
            };
            let labels = self.last_labels.get(&uuid).cloned().unwrap_or_default();
            outcomes.push(DeviceOutcome {
                device,
                sample,
                recent: Recent::default(),
                labels,
            });
        }
        let present: Vec<&str> = outcomes
            .iter()
            .map(|o| o.device.identity.uuid.as_str())
            .collect();
        self.history.expire(now_ms, &present);
        self.last_labels
            .retain(|uuid, _| present.contains(&uuid.as_str()));
        for o in &mut outcomes {
            o.recent = self.history.recent(&o.device.identity.uuid);
        }

        let mut last = LastSample {
            catalog,
            outcomes,
            processes,
            owners,
            begun,
            duration_seconds: 0.0,
            timestamp_seconds: 0.0,
        };
        let published = self.render_last_with(&mut last, Some(&examples));
        self.last = Some(last);
        published
    }

    /// Attributes and renders `last`: a fresh sample (`fresh`, its per-process problems
    /// counted and logged) or, after a change of attribution, the last one again.
    fn render_last(&mut self, last: &mut LastSample, fresh: bool) -> Arc<Published> {
        let examples = BTreeMap::new();
        self.render_last_with(last, fresh.then_some(&examples))
    }

    /// [`Sampler::render_last`]; `examples` (the per-process problems' example errors) is
    /// `Some` for a fresh sample.
    fn render_last_with(
        &mut self,
        last: &mut LastSample,
        examples: Option<&BTreeMap<&'static str, String>>,
    ) -> Arc<Published> {
        let fresh = examples.is_some();
        let attribution = self.attribution_now();
        let directory = self
            .directory
            .as_mut()
            .map(|rx| rx.borrow_and_update().clone())
            .unwrap_or_default();
        let workload = Workload {
            usage: self.attribute_processes(
                &last.outcomes,
                &last.processes,
                &last.owners,
                examples,
                &directory,
            ),
            directory,
        };
        let snap = snapshot::build_with(
            &last.catalog,
            &last.outcomes,
            &attribution,
            &workload,
            &self.opts.build,
        );
        if fresh {
            self.metrics.samples.count_field_errors(&snap.field_errors);
            self.metrics.samples.count_sample();
        } else {
            self.metrics.attribution.count_update();
        }
        let mut body = String::with_capacity(snap.series * 200 + 4096);
        render(&snap.families, &mut body);
        if fresh {
            last.duration_seconds = last.begun.elapsed().as_secs_f64();
            last.timestamp_seconds = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
        }
        let stats = SampleStats {
            duration_seconds: last.duration_seconds,
            timestamp_seconds: last.timestamp_seconds,
            gpus: gpu_states(&last.outcomes, self.opts.build.xid_window_ms),
            series: snap.series,
        };
        self.metrics.samples.record(self.source.name(), stats);
        self_metrics::encode_into(&self.metrics.registry, &mut body);
        Arc::new(Published::new(
            Bytes::from(body),
            last.begun,
            snap.series,
            self.not_ready.clone(),
        ))
    }

    /// Attributes the last sample's processes to containers. For a fresh sample (`examples`
    /// given) records the outcome and failures and logs each new problem once; again after a
    /// change of attribution, only the outcome. Empty when per-process attribution is off.
    fn attribute_processes(
        &mut self,
        outcomes: &[DeviceOutcome],
        processes: &[Option<Result<Vec<GpuProcess>, FieldError>>],
        owners: &HashMap<u32, Owner>,
        examples: Option<&BTreeMap<&'static str, String>>,
        directory: &PodDirectory,
    ) -> BTreeMap<crate::pods::EntityKey, usage::EntityUsage> {
        let Some(root) = &self.proc_root else {
            return BTreeMap::new();
        };
        let mut read: Vec<(&Device, &[GpuProcess])> = Vec::new();
        let mut nvml_errors: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (device, p) in outcomes.iter().map(|o| &o.device).zip(processes) {
            match p {
                Some(Ok(list)) => read.push((device, list.as_slice())),
                Some(Err(FieldError::NotSupported)) | None => {}
                Some(Err(FieldError::NoPermission)) => {
                    *nvml_errors.entry("nvml_no_permission").or_default() += 1;
                }
                Some(Err(_)) => *nvml_errors.entry("nvml_failed").or_default() += 1,
            }
        }
        let mut result = usage::attribute(&read, owners, directory);
        let Some(examples) = examples else {
            // The same readings again: their failures were counted and logged when read.
            self.metrics
                .processes
                .record_tick(&result.outcomes, &BTreeMap::new());
            return result.entities;
        };
        for (r, n) in nvml_errors {
            *result.errors.entry(r).or_default() += n;
        }
        self.metrics
            .processes
            .record_tick(&result.outcomes, &result.errors);
        if result.stale_directory {
            if let Some(w) = &self.cri_waker {
                w.notify_one();
            }
        }
        // Transient (a pod started since the last listing; the runtime is asked again at once),
        // or logged by the runtime task itself: debug only.
        let quiet = |r: &&str| matches!(*r, "unknown_container" | "runtime_unavailable");
        let now: BTreeSet<&'static str> = result
            .errors
            .keys()
            .copied()
            .filter(|r| !quiet(r))
            .collect();
        for reason in result.errors.keys().filter(|r| quiet(r)) {
            tracing::debug!(reason, "GPU processes not attributed this tick");
        }
        for reason in now.difference(&self.process_problems) {
            let example = examples.get(reason).map_or("", String::as_str);
            tracing::warn!(
                reason,
                example,
                "per-process GPU attribution incomplete: {}; the GPUs concerned keep holder-only attribution (gpu_exporter_process_attribution_errors_total)",
                process_hint(reason, root)
            );
        }
        if !self.process_problems.is_empty() && now.is_empty() {
            tracing::info!("per-process GPU attribution complete again");
        }
        self.process_problems = now;
        result.entities
    }

    /// After a discovery or catalog change: works out which fields can never be read on which
    /// GPUs (`gpu_exporter_fields_unavailable`), and logs each reason once, with its fix.
    fn check_field_gaps(&mut self, catalog: &Arc<Catalog>, fields: &[Field]) {
        let current = self
            .gaps_checked
            .as_ref()
            .is_some_and(|(c, g)| Arc::ptr_eq(c, catalog) && *g == self.device_generation);
        if current {
            return;
        }
        self.gaps_checked = Some((Arc::clone(catalog), self.device_generation));
        let gaps = field_gaps(&*self.source, &self.devices, fields);
        let mut by_reason: BTreeMap<FieldGap, (Vec<&'static str>, BTreeSet<u32>)> = BTreeMap::new();
        for ((field, gap), gpus) in &gaps {
            let e = by_reason.entry(*gap).or_default();
            e.0.push(field.dcgm_name());
            e.1.extend(gpus.iter().copied());
        }
        for (gap, (names, indexes)) in &by_reason {
            if self.gaps_logged.insert(*gap) {
                let gpus: Vec<String> = indexes.iter().map(u32::to_string).collect();
                let models: BTreeSet<&str> = self
                    .devices
                    .iter()
                    .filter(|d| indexes.contains(&d.identity.index))
                    .map(|d| d.identity.model.as_str())
                    .collect();
                tracing::warn!(
                    fields = %names.join(","),
                    gpus = %gpus.join(","),
                    models = %models.into_iter().collect::<Vec<_>>().join(","),
                    reason = gap.as_str(),
                    "fields not served on these GPUs (gpu_exporter_fields_unavailable): {}",
                    gap.explanation()
                );
            }
        }
        self.metrics.samples.set_field_gaps(
            gaps.into_iter()
                .map(|(k, gpus)| (k, gpus.len() as u64))
                .collect(),
        );
    }

    async fn rediscover_if_due(&mut self, now: Instant) {
        // Asked first, so the request is consumed even when the periodic discovery is due.
        let wanted = self.source.wants_rediscovery();
        let due = wanted
            || self
                .discovered_at
                .is_none_or(|t| now.duration_since(t) >= self.opts.rediscover_every);
        if !due {
            return;
        }
        let source = Arc::clone(&self.source);
        match tokio::task::spawn_blocking(move || source.devices()).await {
            Ok(Ok(devices)) => {
                if devices != self.devices {
                    self.device_generation += 1;
                    tracing::info!(
                        gpus = devices.len(),
                        instances = devices.iter().map(|d| d.instances.len()).sum::<usize>(),
                        "devices discovered"
                    );
                }
                self.devices = devices;
                if let Some(tx) = &self.inventory {
                    tx.send_if_modified(|cur| {
                        let changed = **cur != self.devices;
                        if changed {
                            *cur = Arc::new(self.devices.clone());
                        }
                        changed
                    });
                }
                // GPUs can come and go (a MIG reconfiguration, a GPU falling off the bus):
                // when the selection matches none of them, degrade (not ready, said why).
                let unselected = self.opts.build.selection.selects_nothing(&self.devices);
                if let Some(why) = unselected
                    .as_ref()
                    .filter(|w| self.not_ready.as_ref() != Some(*w))
                {
                    tracing::warn!("{why}; /ready answers 503 until it selects one");
                }
                self.not_ready = unselected;
                self.discovered_at = Some(now);
            }
            // A failed discovery is retried at the next tick (the source paces its own
            // retries, e.g. NVML initialisation with backoff).
            Ok(Err(e)) => {
                self.metrics.samples.count_sample_error(e.reason());
                let why = crate::error_chain(&e);
                if self.not_ready.as_deref() != Some(why.as_str()) {
                    tracing::warn!(error = %why, "device discovery failed; keeping the previous device list");
                }
                self.not_ready = Some(why);
            }
            Err(e) => {
                self.metrics.samples.count_sample_error("discovery_error");
                tracing::warn!(error = %e, "device discovery thread failed");
                self.not_ready = Some(format!("device discovery thread failed: {e}"));
            }
        }
    }
}

/// The blocking part of a tick: every device's sample (and, with per-process attribution, its
/// processes and their cgroups), then the XIDs.
fn read_devices<S: GpuSource>(
    source: &S,
    devices: Vec<Device>,
    fields: &[Field],
    proc_root: Option<&ProcRoot>,
) -> TickRead {
    let mut samples = Vec::with_capacity(devices.len());
    let mut processes = Vec::with_capacity(devices.len());
    for d in devices {
        let r = source.sample(&d, fields);
        let p = match (proc_root, &r) {
            (Some(_), Ok(_)) => Some(source.processes(&d)),
            _ => None,
        };
        samples.push((d, r));
        processes.push(p);
    }
    let mut owners = HashMap::new();
    let mut examples = BTreeMap::new();
    if let Some(root) = proc_root {
        for list in processes.iter().flatten().flatten() {
            for p in list {
                owners.entry(p.pid).or_insert_with(|| {
                    root.owner(p.pid).map_err(|e| {
                        examples
                            .entry(e.reason())
                            .or_insert_with(|| crate::error_chain(&e));
                        e.reason()
                    })
                });
            }
        }
    }
    TickRead {
        samples,
        processes,
        owners,
        examples,
        xids: source.drain_xids(),
    }
}

/// What to do about a per-process attribution failure.
fn process_hint(reason: &str, root: &ProcRoot) -> String {
    let root = root.root().display();
    match reason {
        "proc_not_found" => format!("GPU processes have no entry under --path.procfs {root}: NVML reports host PIDs, so mount the host's /proc (hostPath /proc at /host/proc with --path.procfs /host/proc) or run the pod with hostPID: true"),
        "proc_permission_denied" => format!("{root}/<pid>/cgroup may not be read: the host's /proc is mounted with hidepid, or a security profile denies it"),
        "proc_unreadable" => format!("{root}/<pid>/cgroup could not be read"),
        "cgroup_unrecognised" => format!("{root}/<pid>/cgroup is not in the cgroup file format: is --path.procfs a procfs?"),
        "nvml_no_permission" => "NVML refuses to list the processes on a GPU (NVML_ERROR_NO_PERMISSION)".to_owned(),
        _ => "NVML could not list the processes on a GPU".to_owned(),
    }
}

fn gpu_states(outcomes: &[DeviceOutcome], window_ms: u64) -> GpuStates {
    let mut s = GpuStates::default();
    for o in outcomes {
        match &o.sample {
            Ok(_) if o.health(window_ms).iter().all(|c| c.status == Status::Pass) => s.healthy += 1,
            Ok(_) => s.unhealthy += 1,
            Err(_) if o.lost() => s.lost += 1,
            Err(_) => s.unreadable += 1,
        }
    }
    s
}

/// Resolves when `rx` holds a value not seen yet; never when there is no channel or its sender
/// is gone.
async fn changed<T>(rx: Option<&mut watch::Receiver<T>>) {
    if let Some(rx) = rx {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}
