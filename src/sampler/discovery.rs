//! Device discovery for the sampler: asking the source for its devices when due (periodically
//! or on the source's request), publishing the inventory, and degrading when the selection
//! matches none of them.

use std::sync::Arc;

use tokio::time::Instant;

use super::Sampler;
use crate::gpu::GpuSource;

impl<S: GpuSource> Sampler<S> {
    pub(super) async fn rediscover_if_due(&mut self, now: Instant) {
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
