//! The sampler's own series: what it found and read (`gpu_exporter_build_info`,
//! `gpu_exporter_gpus`, `gpu_exporter_sample_*`, `gpu_exporter_series`,
//! `gpu_exporter_field_errors_total`, `gpu_exporter_fields_unavailable`) in [`SampleMetrics`],
//! and the first sample's wait for attribution (`gpu_exporter_attribution_*`) in
//! [`AttributionMetrics`]. Both are [`Collector`]s over the latest state: the per-sample
//! figures are replaced as a whole each sample (no `Family::remove` bookkeeping for GPUs or
//! fields that went away), the counters only grow.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;

use crate::accounting::AccountingMetrics;
use prometheus_client::metrics::counter::Counter;

use crate::catalog::Field;
use crate::gpu::{FieldError, FieldGap};
use crate::pods::usage::ProcessMetrics;
use crate::self_metrics::{self, Collector, DescriptorEncoder, Num, Reason, Registry};

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

/// `gpu_exporter_build_info`'s labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildInfo {
    backend: String,
    version: &'static str,
}

/// `gpu_exporter_gpus`'s label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelSet)]
struct State {
    state: &'static str,
}

/// A field and why (`gpu_exporter_field_errors_total`, `gpu_exporter_fields_unavailable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FieldReason {
    field: &'static str,
    reason: &'static str,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every `reason` of `gpu_exporter_sample_errors_total`.
const SAMPLE_ERRORS: [&str; 3] = ["device_error", "discovery_error", "gpu_lost"];

/// The sampler's figures: counters kept across samples, and the last sample's state.
#[derive(Debug, Default)]
pub struct SampleMetrics {
    samples: Counter,
    sample_errors: [Counter; SAMPLE_ERRORS.len()],
    field_errors: Mutex<BTreeMap<(Field, FieldError), u64>>,
    field_gaps: Mutex<BTreeMap<(Field, FieldGap), u64>>,
    /// The GPU backend's name and the last sample's figures.
    last: Mutex<(String, SampleStats)>,
}

impl SampleMetrics {
    /// Counts a finished sampling tick.
    pub fn count_sample(&self) {
        self.samples.inc();
    }

    /// Sampling ticks finished so far.
    pub fn samples(&self) -> u64 {
        self.samples.get()
    }

    /// Counts a device-level failure by reason (`device_error`, `discovery_error`,
    /// `gpu_lost`; another is not counted).
    pub fn count_sample_error(&self, reason: &'static str) {
        if let Some(i) = SAMPLE_ERRORS.iter().position(|r| *r == reason) {
            self.sample_errors[i].inc();
        }
    }

    /// Counts field read failures.
    pub fn count_field_errors(&self, errors: &[(Field, FieldError)]) {
        if errors.is_empty() {
            return;
        }
        let mut m = lock(&self.field_errors);
        for &e in errors {
            *m.entry(e).or_default() += 1;
        }
    }

    /// Sets the GPUs on which each field of the catalog can never be read, by why (the
    /// sampler's answer after each discovery or catalog change; replaces the previous one).
    pub fn set_field_gaps(&self, gaps: BTreeMap<(Field, FieldGap), u64>) {
        *lock(&self.field_gaps) = gaps;
    }

    /// Records the figures of the sample about to be rendered, from GPU backend `backend`.
    pub fn record(&self, backend: &str, stats: SampleStats) {
        let mut last = lock(&self.last);
        if last.0 != backend {
            backend.clone_into(&mut last.0);
        }
        last.1 = stats;
    }
}

impl Collector for SampleMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let (backend, stats) = lock(&self.last).clone();
        self_metrics::gauge(
            &mut e,
            "gpu_exporter_build_info",
            "A metric with a constant '1' value labelled by version and GPU backend.",
            [(
                BuildInfo {
                    backend,
                    version: env!("CARGO_PKG_VERSION"),
                },
                Num::Int(1),
            )],
        )?;
        let g = stats.gpus;
        self_metrics::gauge(
            &mut e,
            "gpu_exporter_gpus",
            "GPUs found at the last discovery, by state (healthy, unhealthy: a health watch warns or fails, lost: fallen off the bus, unreadable).",
            [
                ("healthy", g.healthy),
                ("lost", g.lost),
                ("unhealthy", g.unhealthy),
                ("unreadable", g.unreadable),
            ]
            .map(|(state, n)| (State { state }, Num::count(n))),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_sample_duration_seconds",
            "Time the last sampling tick took to read every GPU and render the body.",
            Num::Float(stats.duration_seconds),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_last_sample_timestamp_seconds",
            "Unix time of the last completed sample.",
            Num::Float(stats.timestamp_seconds),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_series",
            "GPU series in the last sample's body.",
            Num::count(stats.series as u64),
        )?;
        self_metrics::counter1(
            &mut e,
            "gpu_exporter_samples",
            "Sampling ticks completed.",
            self.samples(),
        )?;
        self_metrics::counter(
            &mut e,
            "gpu_exporter_sample_errors",
            "Devices that could not be sampled, by reason.",
            SAMPLE_ERRORS
                .iter()
                .zip(&self.sample_errors)
                .map(|(reason, n)| (Reason { reason }, n.get())),
        )?;
        let field_reason = |f: &Field, reason| FieldReason {
            field: f.dcgm_name(),
            reason,
        };
        let errors: Vec<_> = lock(&self.field_errors)
            .iter()
            .map(|((f, r), n)| (field_reason(f, r.as_str()), *n))
            .collect();
        self_metrics::counter(
            &mut e,
            "gpu_exporter_field_errors",
            "Field reads that failed (their series is missing), by field and reason.",
            errors,
        )?;
        let gaps: Vec<_> = lock(&self.field_gaps)
            .iter()
            .map(|((f, r), n)| (field_reason(f, r.as_str()), *n))
            .collect();
        self_metrics::gauge(
            &mut e,
            "gpu_exporter_fields_unavailable",
            "GPUs on which a field of the metrics CSV can never be read, so its series is absent there, by field and reason (needs_dcgm_profiling: a DCGM_FI_PROF_* field on a GPU older than Hopper, which NVML cannot profile; DCGM's profiling module can).",
            gaps.into_iter().map(|(l, n)| (l, Num::count(n))),
        )
    }
}

/// A label set of one label, `source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Source {
    source: &'static str,
}

/// The first sample's wait for the attribution sources (kubelet, container runtime, HPC
/// directory) and the bodies re-published between samples because attribution changed;
/// rendered (as `gpu_exporter_attribution_*`) only when an attribution source runs.
#[derive(Debug, Default)]
pub struct AttributionMetrics {
    inner: Mutex<AttributionState>,
}

/// A copy of [`AttributionMetrics`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttributionState {
    /// Each source the first sample waits for, with the number of first samples published
    /// without its first answer (it did not answer within its call timeout).
    pub first_answer_timeouts: BTreeMap<&'static str, u64>,
    /// Bodies re-rendered from the last readings because attribution changed.
    pub updates: u64,
}

impl AttributionMetrics {
    /// Registers a source the first sample waits for (turns the families on).
    pub fn add_source(&self, source: &'static str) {
        lock(&self.inner)
            .first_answer_timeouts
            .entry(source)
            .or_default();
    }

    /// Counts a first sample published without `source`'s first answer.
    pub fn count_timeout(&self, source: &'static str) {
        *lock(&self.inner)
            .first_answer_timeouts
            .entry(source)
            .or_default() += 1;
    }

    /// Counts a body re-rendered because attribution changed.
    pub fn count_update(&self) {
        lock(&self.inner).updates += 1;
    }

    /// A copy of the current state.
    pub fn state(&self) -> AttributionState {
        lock(&self.inner).clone()
    }
}

impl Collector for AttributionMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = self.state();
        if s.first_answer_timeouts.is_empty() {
            return Ok(());
        }
        self_metrics::counter(
            &mut e,
            "gpu_exporter_attribution_first_answer_timeouts",
            "First samples published without this attribution source's first answer: it did not answer within its call timeout, so that sample went out without its labels (they follow as soon as it answers).",
            s.first_answer_timeouts
                .iter()
                .map(|(source, n)| (Source { source }, *n)),
        )?;
        self_metrics::counter1(
            &mut e,
            "gpu_exporter_attribution_updates",
            "Bodies re-published between samples because attribution changed (pods, containers, HPC jobs): re-rendered from the last GPU readings, without reading the GPUs again.",
            s.updates,
        )
    }
}

/// What the sampler counts into, and what it encodes after the GPU series of each body.
#[derive(Debug, Clone)]
pub struct SamplerMetrics {
    /// Its own figures (`gpu_exporter_build_info`, `gpu_exporter_gpus`, `gpu_exporter_sample*`...).
    pub samples: Arc<SampleMetrics>,
    /// The first sample's wait for attribution, and re-published bodies.
    pub attribution: Arc<AttributionMetrics>,
    /// Per-process attribution's outcomes and failures.
    pub processes: Arc<ProcessMetrics>,
    /// The accounting ledger and its families (off unless enabled): not a registered
    /// collector; the sampler appends its families to each body after the registry's.
    pub accounting: Arc<AccountingMetrics>,
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
        let processes = Arc::new(ProcessMetrics::default());
        let accounting = Arc::new(AccountingMetrics::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Arc::clone(&samples)));
        registry.register_collector(Box::new(Arc::clone(&processes)));
        registry.register_collector(Box::new(Arc::clone(&attribution)));
        Self {
            samples,
            attribution,
            processes,
            accounting,
            registry: Arc::new(registry),
        }
    }
}
