//! Attribution from the first sample: the first tick after a successful discovery waits for
//! the first answer of every attribution source (kubelet, container runtime, HPC directory),
//! each at most its call timeout (`gpu_exporter_attribution_first_answer_timeouts_total`), and
//! not at all for a source whose socket does not exist (waiting would not make it appear).

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::metrics::AttributionMetrics;
use crate::gpu::Device;
use crate::pods::Answered;

/// An attribution source the first sample waits for.
#[derive(Debug)]
struct FirstAnswer {
    /// `kubelet`, `cri` or `hpc`.
    source: &'static str,
    answered: watch::Receiver<Answered>,
    /// The longest wait: the source's call timeout.
    wait: Duration,
}

/// The sources the first sample waits for, and whether it has waited.
#[derive(Debug, Default)]
pub(super) struct FirstAnswers {
    gates: Vec<FirstAnswer>,
    waited: bool,
}

impl FirstAnswers {
    /// Adds `source`, whose answers arrive on `answered`, waited for at most `wait`.
    pub(super) fn add(
        &mut self,
        source: &'static str,
        answered: watch::Receiver<Answered>,
        wait: Duration,
    ) {
        self.gates.push(FirstAnswer {
            source,
            answered,
            wait,
        });
    }

    /// The first time only: waits for the first answer of every source (mapped with `devices`),
    /// each at most its call timeout; a source that did not answer in time is counted.
    pub(super) async fn wait_once(&mut self, devices: &[Device], metrics: &AttributionMetrics) {
        if std::mem::replace(&mut self.waited, true) {
            return;
        }
        let start = Instant::now();
        for gate in &mut self.gates {
            let deadline = start + gate.wait;
            let seen = tokio::time::timeout_at(
                deadline,
                gate.answered
                    .wait_for(|a| a.covers(devices) || a.unavailable.is_some()),
            )
            .await;
            let (answered, unavailable) = match &seen {
                Ok(Ok(a)) => (a.covers(devices), a.unavailable),
                _ => (false, None),
            };
            if let (false, Some(reason)) = (answered, unavailable) {
                // Waiting would not help (its socket does not exist): the refresher has
                // already warned why; its labels follow when it answers.
                tracing::info!(
                    source = gate.source,
                    reason,
                    "first sample published without this attribution source: it cannot answer yet"
                );
            } else if answered {
                tracing::debug!(
                    source = gate.source,
                    "first sample: attribution source answered"
                );
            } else {
                metrics.count_timeout(gate.source);
                tracing::warn!(
                    source = gate.source,
                    timeout = ?gate.wait,
                    "first sample published without this attribution source: it did not answer within its call timeout; its labels follow as soon as it answers (gpu_exporter_attribution_first_answer_timeouts_total)"
                );
            }
        }
    }
}
