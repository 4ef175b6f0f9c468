//! The API client's own series, `gpu_exporter_kube_api_*`, rendered only when the pod watch
//! runs (pod labels/UID from the API server): the same shape as `gpu_exporter_cri_*`.

use std::fmt;

use super::error::KubeError;
use crate::pods::client_health::{ClientHealth, ClientMetrics, HasHealth, HealthFamilies};
use crate::self_metrics::{self, Collector, DescriptorEncoder, Num};

/// The pod watch's health.
pub type KubeApiMetrics = ClientMetrics<KubeApiState>;

/// A copy of [`KubeApiMetrics`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeApiState {
    /// The calls: whether the watch runs, the last call's result, failures by reason.
    pub health: ClientHealth,
    /// Pods in the published answer.
    pub pods: u64,
    /// Full lists done (the first, and one after each broken watch or 410 Gone).
    pub lists: u64,
}

impl HasHealth for KubeApiState {
    fn health(&mut self) -> &mut ClientHealth {
        &mut self.health
    }
}

impl ClientMetrics<KubeApiState> {
    /// Records a completed list.
    pub fn record_list(&self) {
        self.lock().lists += 1;
    }

    /// Records the number of pods published.
    pub fn record_published(&self, pods: usize) {
        self.lock().pods = pods as u64;
    }
}

const HEALTH: HealthFamilies = HealthFamilies {
    up: (
        "gpu_exporter_kube_api_up",
        "Whether the last Kubernetes API call of the pod watch (list or watch) succeeded (1) or failed (0).",
    ),
    last_success: (
        "gpu_exporter_kube_api_last_success_timestamp_seconds",
        "Unix time of the last successful Kubernetes API pod list or watch event (0: never).",
    ),
    errors: (
        "gpu_exporter_kube_api_errors",
        "Failed Kubernetes API pod lists and watches, by reason.",
    ),
    reasons: KubeError::REASONS,
};

impl Collector for ClientMetrics<KubeApiState> {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let Some(s) = self.encode_health(&mut e, &HEALTH)? else {
            return Ok(());
        };
        self_metrics::counter1(
            &mut e,
            "gpu_exporter_kube_api_lists",
            "Full pod lists from the Kubernetes API (the first, then one after each broken watch or 410 Gone).",
            s.lists,
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_kube_api_pods",
            "Pods of this node known from the Kubernetes API (0 when none is within the TTL).",
            Num::count(s.pods),
        )
    }
}
