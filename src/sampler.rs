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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::accounting;
use crate::catalog::{Catalog, Field};
use crate::gpu::{Device, FieldError, GpuProcess, GpuSource, SourceError, Value};
use crate::health::{History, Recent, Status};
use crate::hpc::HpcJobs;
use crate::pods::directory::PodDirectory;
use crate::pods::procfs::ProcRoot;
use crate::pods::usage::Owner;
use crate::pods::{Answered, Attribution};
use crate::render::render;
use crate::self_metrics;
use crate::snapshot::{self, BuildOptions, DeviceOutcome, Workload};

mod discovery;
mod fields;
mod first_answer;
mod metrics;
mod processes;
mod published;
mod read;

pub use fields::{field_gaps, fields_to_read};
use first_answer::FirstAnswers;
pub use metrics::{
    AttributionMetrics, AttributionState, GpuStates, SampleMetrics, SampleStats, SamplerMetrics,
};
use processes::ProcessAttribution;
pub use published::Published;
use read::{read_devices, TickRead};

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
    /// The `process_*` series read at this sample's tick (`--enable-exporter-metrics`).
    process_text: Option<String>,
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
    /// Per-process attribution. `None`: off.
    processes: Option<ProcessAttribution>,
    /// HPC job mapping (`--hpc-job-mapping-dir`).
    hpc_jobs: Option<watch::Receiver<Arc<HpcJobs>>>,
    /// The last pod attribution and HPC jobs, and the two merged (reused while unchanged).
    merged: Option<(Arc<Attribution>, Arc<HpcJobs>, Arc<Attribution>)>,
    /// The attribution sources the first sample waits for.
    first_answers: FirstAnswers,
    /// The last sample's readings.
    last: Option<LastSample>,
    /// Bumped whenever discovery finds a different device list.
    device_generation: u64,
    /// Accounting's allocation shares, kept while the pods and devices stay.
    allocations: accounting::input::Allocations,
    /// Append the exporter's own `process_*` series (`--enable-exporter-metrics`).
    exporter_metrics: bool,
    /// The fields that can never be read on which GPUs.
    gaps: fields::FieldGapCheck,
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
            processes: None,
            hpc_jobs: None,
            merged: None,
            first_answers: FirstAnswers::default(),
            last: None,
            device_generation: 0,
            allocations: accounting::input::Allocations::default(),
            exporter_metrics: false,
            gaps: fields::FieldGapCheck::default(),
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
        self.first_answers.add(source, answered, wait);
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
        self.processes = Some(ProcessAttribution::new(root));
        self
    }

    /// Appends the exporter's own `process_*` series (`--enable-exporter-metrics`) to each
    /// sample: `/proc/self` is read at each tick on the blocking thread that reads the GPUs, so
    /// scrapes only serve the published bytes.
    #[must_use]
    pub fn with_exporter_metrics(mut self) -> Self {
        self.exporter_metrics = true;
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
            replicas: pods.replicas.clone(),
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

    /// Takes one sample and renders it.
    pub async fn tick(&mut self) -> Arc<Published> {
        let begun = Instant::now();
        let catalog = self.catalog.borrow().clone();
        self.rediscover_if_due(begun).await;
        if self.not_ready.is_none() {
            self.first_answers
                .wait_once(&self.devices, &self.metrics.attribution)
                .await;
        }

        let source = Arc::clone(&self.source);
        let mut fields = fields_to_read(&catalog, |f| source.supports(f));
        // Accounting splits each GPU's own energy counter: read it even when the CSV does not
        // export it.
        if self.metrics.accounting.enabled()
            && source.supports(Field::TotalEnergyConsumption)
            && !fields.contains(&Field::TotalEnergyConsumption)
        {
            fields.push(Field::TotalEnergyConsumption);
            fields.sort();
        }
        self.gaps.check(
            &*self.source,
            &self.devices,
            self.device_generation,
            &catalog,
            &fields,
            &self.metrics.samples,
        );
        let devices = self.devices.clone();
        let proc_root = self.processes.as_ref().map(|p| p.root.clone());
        let exporter_metrics = self.exporter_metrics;
        let read = tokio::task::spawn_blocking(move || {
            let read = read_devices(&*source, devices, &fields, proc_root.as_ref());
            let own = exporter_metrics.then(|| {
                crate::process_metrics::render(
                    &crate::process_metrics::read(),
                    crate::process_metrics::Units::system(),
                )
            });
            (read, own)
        })
        .await;
        let (
            TickRead {
                samples,
                processes,
                owners,
                examples,
                xids,
            },
            process_text,
        ) = match read {
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
                let read = TickRead {
                    samples: failed,
                    processes: Vec::new(),
                    owners: HashMap::new(),
                    examples: BTreeMap::new(),
                    xids: Vec::new(),
                };
                (read, None)
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
            process_text,
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
            usage: match &mut self.processes {
                Some(p) => p.attribute(
                    &last.outcomes,
                    &last.processes,
                    &last.owners,
                    examples,
                    &directory,
                    &self.metrics.processes,
                    self.cri_waker.as_deref(),
                ),
                None => BTreeMap::new(),
            },
            directory,
        };
        let snap = snapshot::build_with(
            &last.catalog,
            &last.outcomes,
            &attribution,
            &workload,
            &self.opts.build,
        );
        if fresh && self.metrics.accounting.enabled() {
            // Once per sample, before the self-metrics are encoded into this body.
            let ticks = self.allocations.ticks(
                accounting::input::Inputs {
                    outcomes: &last.outcomes,
                    attribution: &attribution,
                    usage: &workload.usage,
                    processes: &last.processes,
                },
                Some((&attribution, self.device_generation)),
            );
            self.metrics
                .accounting
                .record(last.begun.saturating_duration_since(self.started), &ticks);
        }
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
        if let Some(text) = &last.process_text {
            body.push_str(text);
        }
        // The accounting families, rendered and compressed on their own interval.
        let accounting = (self.metrics.accounting).published(
            last.begun.saturating_duration_since(self.started),
            last.timestamp_seconds,
        );
        // Compressed here, once, before it is published: no scrape waits for or pays it.
        Arc::new(Published::with_tail(
            body,
            accounting,
            last.begun,
            snap.series,
            self.not_ready.clone(),
        ))
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
