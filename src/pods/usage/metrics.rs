//! Per-process attribution's own series: what became of the GPU processes of the last tick
//! (`gpu_exporter_gpu_processes`) and its failures
//! (`gpu_exporter_process_attribution_errors_total`); rendered only when it is on. Updated by
//! the sampler, which attributes processes with [`super::attribute`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;

use crate::self_metrics::{self, Collector, DescriptorEncoder, Num, Reason};

/// Every `outcome` label value of `gpu_exporter_gpu_processes`.
pub const OUTCOMES: &[&str] = &[
    "attributed",
    "outside_pods",
    "unknown_container",
    "unreadable",
];

/// Every `reason` label value of `gpu_exporter_process_attribution_errors_total`.
pub const REASONS: &[&str] = &[
    "cgroup_unrecognised",
    "nvml_failed",
    "nvml_no_permission",
    "proc_not_found",
    "proc_permission_denied",
    "proc_unreadable",
    "runtime_unavailable",
    "unknown_container",
];

/// Per-process attribution: what became of the GPU processes of the last tick, and failures.
#[derive(Debug, Default)]
pub struct ProcessMetrics {
    inner: Mutex<ProcessState>,
}

/// A copy of [`ProcessMetrics`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessState {
    /// Whether per-process attribution is on (the families are rendered only then).
    pub enabled: bool,
    /// GPU processes of the last tick by outcome ([`OUTCOMES`]).
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Failures by reason ([`REASONS`]).
    pub errors: BTreeMap<&'static str, u64>,
}

/// A label set of one label, `outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

impl ProcessMetrics {
    fn lock(&self) -> MutexGuard<'_, ProcessState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
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
}

impl Collector for ProcessMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = self.state();
        if !s.enabled {
            return Ok(());
        }
        let n = |m: &BTreeMap<&'static str, u64>, k: &str| m.get(k).copied().unwrap_or(0);
        self_metrics::gauge(
            &mut e,
            "gpu_exporter_gpu_processes",
            "GPU processes seen at the last tick, by attribution outcome: attributed (to a container the runtime lists), outside_pods (host processes, non-Kubernetes containers), unknown_container (a pod's container the runtime does not list, or no runtime answer), unreadable (/proc/<pid>/cgroup unreadable).",
            OUTCOMES
                .iter()
                .map(|&outcome| (Outcome { outcome }, Num::count(n(&s.outcomes, outcome)))),
        )?;
        self_metrics::counter(
            &mut e,
            "gpu_exporter_process_attribution_errors",
            "Per-process attribution failures, by reason: NVML process reads (per GPU and tick), /proc reads (per process and tick), containers the runtime does not list, ticks without a runtime answer.",
            REASONS
                .iter()
                .map(|&reason| (Reason { reason }, n(&s.errors, reason))),
        )
    }
}
