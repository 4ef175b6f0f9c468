//! The container-runtime (CRI) client's own series, `gpu_exporter_cri_*`: updated by the CRI
//! refresher, rendered only when it runs. A [`Collector`] over the latest state: the runtime's
//! last listing is a snapshot, replaced as a whole.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::pods::cri::CriError;
use crate::self_metrics::{self, Collector, DescriptorEncoder, Num, Reason};

/// The container-runtime client's health.
#[derive(Debug, Default)]
pub struct CriMetrics {
    inner: Mutex<CriState>,
}

/// A copy of [`CriMetrics`].
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

impl CriMetrics {
    fn lock(&self) -> MutexGuard<'_, CriState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
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
}

impl Collector for CriMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = self.state();
        if !s.enabled {
            return Ok(());
        }
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_cri_up",
            "Whether the last container runtime (CRI) listing succeeded (1) or failed (0).",
            Num::Int(i64::from(s.up)),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_cri_last_success_timestamp_seconds",
            "Unix time of the last successful container runtime (CRI) listing (0: never).",
            Num::Float(s.last_success_seconds),
        )?;
        self_metrics::counter(
            &mut e,
            "gpu_exporter_cri_errors",
            "Failed container runtime (CRI) listings, by reason.",
            CriError::REASONS.iter().map(|&reason| {
                (
                    Reason { reason },
                    s.errors.get(reason).copied().unwrap_or(0),
                )
            }),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_cri_pods",
            "Pods in the container runtime answer in use (0 when none is within the TTL).",
            Num::count(s.pods),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_cri_containers",
            "Containers in the container runtime answer in use (0 when none is within the TTL).",
            Num::count(s.containers),
        )
    }
}
