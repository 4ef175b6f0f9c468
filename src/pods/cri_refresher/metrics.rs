//! The container-runtime (CRI) client's own series, `gpu_exporter_cri_*`: updated by the CRI
//! refresher, rendered only when it runs. A [`Collector`] over the latest state: the runtime's
//! last listing is a snapshot, replaced as a whole.

use std::fmt;

use crate::pods::client_health::{ClientHealth, ClientMetrics, HasHealth, HealthFamilies};
use crate::pods::cri::CriError;
use crate::self_metrics::{self, Collector, DescriptorEncoder, Num};

/// The container-runtime client's health.
pub type CriMetrics = ClientMetrics<CriState>;

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

impl HasHealth for CriState {
    fn health(&mut self) -> &mut ClientHealth {
        &mut self.health
    }
}

impl ClientMetrics<CriState> {
    /// Records the size of what was published.
    pub fn record_published(&self, pods: usize, containers: usize) {
        let mut s = self.lock();
        s.pods = pods as u64;
        s.containers = containers as u64;
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

impl Collector for ClientMetrics<CriState> {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let Some(s) = self.encode_health(&mut e, &HEALTH)? else {
            return Ok(());
        };
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
