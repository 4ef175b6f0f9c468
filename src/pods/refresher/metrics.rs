//! The pod-resources (kubelet) client's own series, `gpu_exporter_pod_resources_*`: updated by
//! the attribution refresher, rendered only in Kubernetes mode. A [`Collector`] over the latest
//! state: the kubelet's last answer is a snapshot, replaced as a whole.

use std::collections::BTreeMap;
use std::fmt;

use crate::pods::client_health::{ClientHealth, ClientMetrics, HasHealth, HealthFamilies};
use crate::pods::dra::Unresolved;
use crate::pods::AttributionError;
use crate::self_metrics::{self, Collector, DescriptorEncoder, Num, Reason};

/// The pod-resources client's health.
pub type PodResourcesMetrics = ClientMetrics<PodResourcesState>;

/// A copy of [`PodResourcesMetrics`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodResourcesState {
    /// The `List` calls: whether Kubernetes mode is on (the families are rendered only then),
    /// the last one's result, failures by reason.
    pub health: ClientHealth,
    /// GPU device ids in the last good reply that matched no local GPU or MIG instance.
    pub unknown_devices: u64,
    /// GPUs and MIG instances with at least one holder in the published attribution.
    pub allocated_entities: u64,
    /// Whether `--kubernetes-enable-dra` is on (the DRA family is rendered only then).
    pub dra_enabled: bool,
    /// Devices of NVIDIA's DRA driver in the last good reply that resolved to nothing, by reason.
    pub dra_unresolved: BTreeMap<&'static str, u64>,
}

impl HasHealth for PodResourcesState {
    fn health(&mut self) -> &mut ClientHealth {
        &mut self.health
    }
}

impl ClientMetrics<PodResourcesState> {
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
}

const HEALTH: HealthFamilies = HealthFamilies {
    up: (
        "gpu_exporter_pod_resources_up",
        "Whether the last kubelet pod-resources List call succeeded (1) or failed (0).",
    ),
    last_success: (
        "gpu_exporter_pod_resources_last_success_timestamp_seconds",
        "Unix time of the last successful kubelet pod-resources List call (0: never).",
    ),
    errors: (
        "gpu_exporter_pod_resources_errors",
        "Failed kubelet pod-resources List calls, by reason.",
    ),
    reasons: AttributionError::REASONS,
};

impl Collector for ClientMetrics<PodResourcesState> {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let Some(s) = self.encode_health(&mut e, &HEALTH)? else {
            return Ok(());
        };
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_pod_resources_unknown_devices",
            "GPU device ids in the last kubelet reply that match no local GPU or MIG instance.",
            Num::count(s.unknown_devices),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_pod_resources_allocated_entities",
            "GPUs and MIG instances attributed to at least one container.",
            Num::count(s.allocated_entities),
        )?;
        if s.dra_enabled {
            self_metrics::gauge(
                &mut e,
                "gpu_exporter_pod_resources_dra_unresolved_devices",
                "Devices of NVIDIA's DRA driver (gpu.nvidia.com) in the last kubelet reply that resolve to no local GPU or MIG instance, by reason (no_match, unrecognised_name); they get no pod labels.",
                Unresolved::REASONS
                    .iter()
                    .map(|&reason| {
                        let n = s.dra_unresolved.get(reason).copied().unwrap_or(0);
                        (Reason { reason }, Num::count(n))
                    }),
            )?;
        }
        Ok(())
    }
}
