//! The container-runtime (CRI) client's own series, `gpu_exporter_cri_*`: updated by the CRI
//! refresher, rendered only when it runs. A [`Collector`] over the latest state: the runtime's
//! last listing is a snapshot, replaced as a whole.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::pods::client_health::{ClientHealth, HealthFamilies};
use crate::pods::cri::CriError;
use crate::self_metrics::{self, Collector, DescriptorEncoder, Num};

/// The container-runtime client's health.
#[derive(Debug, Default)]
pub struct CriMetrics {
    inner: Mutex<CriState>,
}

/// A copy of [`CriMetrics`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CriState {
    /// The listings: whether the client runs (the families are rendered only then), the last
    /// one's result, failures by reason.
    pub health: ClientHealth,
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
        self.lock().health.enabled = true;
    }

    /// Records a successful listing at `unix_seconds`.
    pub fn record_success(&self, unix_seconds: f64) {
        self.lock().health.record_success(unix_seconds);
    }

    /// Records a failed listing.
    pub fn record_failure(&self, reason: &'static str) {
        self.lock().health.record_failure(reason);
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

const HEALTH: HealthFamilies = HealthFamilies {
    up: (
        "gpu_exporter_cri_up",
        "Whether the last container runtime (CRI) listing succeeded (1) or failed (0).",
    ),
    last_success: (
        "gpu_exporter_cri_last_success_timestamp_seconds",
        "Unix time of the last successful container runtime (CRI) listing (0: never).",
    ),
    errors: (
        "gpu_exporter_cri_errors",
        "Failed container runtime (CRI) listings, by reason.",
    ),
    reasons: CriError::REASONS,
};

impl Collector for CriMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = self.state();
        if !s.health.enabled {
            return Ok(());
        }
        s.health.encode(&mut e, &HEALTH)?;
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
