//! The attribution task: asks a [`PodResolver`] on its own cadence and publishes
//! [`Attribution`] on the `watch` channel the sampler reads at each tick.
//!
//! - One `List` per refresh period (default 10 s), whatever the scrape rate: far below the
//!   kubelet's 100 calls/s limit, which every client on the node shares.
//! - After a failure it retries sooner, backing off from 0.5 s up to the refresh period, so
//!   labels come back quickly after a kubelet restart.
//! - The last good reply is kept until the TTL (default 30 s) has passed without another one;
//!   then the pod labels are dropped rather than left wrong.
//! - The last good reply is mapped again whenever the sampler publishes a new device inventory,
//!   so GPUs discovered after the reply (or a MIG reconfiguration) are attributed at once.
//! - Each distinct problem is logged once, with how to fix it; recovery is logged once too.
//!   `gpu_exporter_pod_resources_*` says the rest.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::mapping::{self, MappingOptions};
use super::proto::{AllocatableResourcesResponse, ListPodResourcesResponse};
use super::refresh::{log_failure, unix_now, Policy};
use super::{unavailable, Answered, Attribution, PodResolver};
use crate::gpu::Device;

mod metrics;
pub use super::refresh::{backoff, RefreshOutcome};
pub use metrics::{PodResourcesMetrics, PodResourcesState};

/// The default refresh period.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(10);
/// The default TTL of the last good reply.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// Refresher settings.
#[derive(Debug, Clone)]
pub struct RefresherOptions {
    /// Time between `List` calls while they succeed.
    pub refresh: Duration,
    /// How long the last good reply is used while calls fail.
    pub ttl: Duration,
    /// How device ids are read.
    pub mapping: MappingOptions,
}

impl Default for RefresherOptions {
    fn default() -> Self {
        Self {
            refresh: DEFAULT_REFRESH,
            ttl: DEFAULT_TTL,
            mapping: MappingOptions::default(),
        }
    }
}

/// The attribution task's state.
#[derive(Debug)]
pub struct Refresher<R: PodResolver> {
    resolver: R,
    devices: watch::Receiver<Arc<Vec<Device>>>,
    tx: watch::Sender<Arc<Attribution>>,
    answered: watch::Sender<Answered>,
    metrics: Arc<PodResourcesMetrics>,
    opts: RefresherOptions,
    /// The last good `List` reply, kept until the TTL, and the problem last logged.
    policy: Policy<ListPodResourcesResponse>,
    /// The last `GetAllocatableResources` answer (kept when a later call fails: what the
    /// device plugins offer changes only when they are reconfigured).
    allocatable: Option<AllocatableResourcesResponse>,
    unknown_logged: bool,
    dra_unresolved_logged: bool,
    dra_ignored_logged: bool,
}

impl<R: PodResolver> Refresher<R> {
    /// Creates the task. `devices` is the sampler's device inventory, `tx` the channel the
    /// sampler reads attribution from. Turns on the `gpu_exporter_pod_resources_*` families.
    pub fn new(
        resolver: R,
        devices: watch::Receiver<Arc<Vec<Device>>>,
        tx: watch::Sender<Arc<Attribution>>,
        metrics: Arc<PodResourcesMetrics>,
        opts: RefresherOptions,
    ) -> Self {
        metrics.enable();
        if opts.mapping.enable_dra {
            metrics.enable_dra();
        }
        Self {
            resolver,
            devices,
            tx,
            answered: watch::Sender::new(Answered::default()),
            metrics,
            policy: Policy::new(opts.ttl),
            opts,
            allocatable: None,
            unknown_logged: false,
            dra_unresolved_logged: false,
            dra_ignored_logged: false,
        }
    }

    /// Follows the good answers and the inventory they were mapped with (for the sampler's
    /// first sample, which waits for the first answer mapped with its devices).
    pub fn answered(&self) -> watch::Receiver<Answered> {
        self.answered.subscribe()
    }

    /// Calls `List` once, then publishes what follows from the answer (or its absence).
    pub async fn refresh_once(&mut self) -> RefreshOutcome {
        let result = self.resolver.list().await;
        let now = Instant::now();
        let status = &self.metrics;
        match result {
            Ok(reply) => {
                status.record_success(unix_now());
                if let Some(reason) = self.policy.succeeded(now, reply) {
                    tracing::info!(
                        socket = %self.resolver.origin(),
                        previous = reason,
                        "kubelet pod-resources answering again; pod labels restored"
                    );
                }
                match self.resolver.allocatable().await {
                    Ok(Some(a)) => self.allocatable = Some(a),
                    Ok(None) => {}
                    // A kubelet older than 1.23 has no GetAllocatableResources: shared GPUs are
                    // then divided among the replicas held.
                    Err(e) => tracing::debug!(
                        error = %crate::error_chain(&e),
                        "pod-resources GetAllocatableResources failed; the last answer is kept"
                    ),
                }
                let devices = self.map_and_publish();
                // After the attribution: whoever sees the answer counted finds it published.
                self.answered.send_modify(|a| {
                    a.answers += 1;
                    a.inventory = Some(devices);
                    a.unavailable = None;
                });
                RefreshOutcome::Fresh
            }
            Err(e) => {
                let reason = e.reason();
                status.record_failure(reason);
                self.answered.send_if_modified(|a| unavailable(a, reason));
                let failed = self.policy.failed(now, reason);
                log_failure!(
                    failed,
                    e,
                    self.opts.refresh,
                    self.opts.ttl,
                    warn: "pod attribution unavailable: {}. Retrying every {:?} at most; metrics are served {}",
                    kept: "with the last known pod labels until they are older than the TTL",
                    not_kept: "without pod labels meanwhile",
                    again: "pod-resources List failed again",
                    dropped: "no good pod-resources answer within the TTL; pod labels dropped until the kubelet answers",
                );
                if failed.kept() {
                    return failed.outcome;
                }
                self.publish();
                failed.outcome
            }
        }
    }

    /// Maps the last good reply (or nothing) with the current inventory and publishes the
    /// result if it differs from what the sampler has.
    pub fn publish(&mut self) {
        let devices = self.map_and_publish();
        if self.policy.last_good().is_some() {
            self.answered.send_if_modified(|a| {
                let newer = a.answers > 0
                    && !a
                        .inventory
                        .as_ref()
                        .is_some_and(|i| Arc::ptr_eq(i, &devices));
                if newer {
                    a.inventory = Some(devices);
                }
                newer
            });
        }
    }

    /// [`Refresher::publish`]'s mapping and publishing; returns the inventory it mapped with.
    fn map_and_publish(&mut self) -> Arc<Vec<Device>> {
        let devices = self.devices.borrow_and_update().clone();
        let mut mapped = match self.policy.last_good() {
            Some(reply) => mapping::attribution_from(reply, &devices, &self.opts.mapping),
            None => mapping::Mapped::default(),
        };
        if let (Some(_), Some(a)) = (self.policy.last_good(), &self.allocatable) {
            mapped.attribution.replicas = mapping::replica_counts(a, &devices, &self.opts.mapping);
        }
        self.metrics
            .record_published(mapped.unknown_devices, mapped.attribution.holders.len());
        if mapped.unknown_devices == 0 {
            self.unknown_logged = false;
        } else if !self.unknown_logged && !devices.is_empty() {
            self.unknown_logged = true;
            tracing::warn!(
                count = mapped.unknown_devices,
                examples = ?mapped.unknown_examples,
                id_type = ?self.opts.mapping.id_type,
                "kubelet lists GPU device ids that match no local GPU or MIG instance; they get no pod labels. On GKE use --kubernetes-gpu-id-type device-name"
            );
        }
        self.metrics.record_dra_unresolved(&mapped.dra_unresolved);
        if mapped.dra_unresolved.is_empty() {
            self.dra_unresolved_logged = false;
        } else if !self.dra_unresolved_logged && !devices.is_empty() {
            self.dra_unresolved_logged = true;
            tracing::warn!(
                by_reason = ?mapped.dra_unresolved,
                examples = ?mapped.dra_unresolved_examples,
                "kubelet lists devices of NVIDIA's DRA driver (pool/device) that match no local GPU or MIG instance; they get no pod labels. no_match: a MIG device created after the last device discovery (retried at the next one) or another node's pool; unrecognised_name: not a GPU or MIG device name (e.g. gpu-vfio-N passthrough)"
            );
        }
        if mapped.dra_ignored > 0 && !self.dra_ignored_logged {
            self.dra_ignored_logged = true;
            tracing::info!(
                count = mapped.dra_ignored,
                "kubelet lists GPUs allocated through DRA (driver gpu.nvidia.com); pass --kubernetes-enable-dra to attribute them to their pods"
            );
        }
        let attribution = mapped.attribution;
        self.tx.send_if_modified(|cur| {
            if **cur == attribution {
                false
            } else {
                *cur = Arc::new(attribution);
                true
            }
        });
        devices
    }

    /// The delay before the next call.
    pub fn next_delay(&self) -> Duration {
        self.policy.next_delay(self.opts.refresh)
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut watching_devices = true;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = self.refresh_once() => {}
            }
            let deadline = Instant::now() + self.next_delay();
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep_until(deadline) => break,
                    changed = self.devices.changed(), if watching_devices => match changed {
                        Ok(()) => self.publish(),
                        Err(_) => watching_devices = false,
                    },
                }
            }
        }
    }
}
