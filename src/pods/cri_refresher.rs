//! The container-runtime task: lists sandboxes and containers on its own cadence and publishes a
//! [`PodDirectory`] on the `watch` channel the sampler reads at each tick. It behaves like the
//! pod-resources refresher ([`super::refresher`]):
//!
//! - one listing per refresh period (default 10 s), never per scrape;
//! - after a failure, retries back off from 0.5 s up to the refresh period;
//! - the last good answer is used until the TTL (default 30 s); then an empty directory is
//!   published, and everything that needs the runtime degrades to holder-only attribution;
//! - each distinct problem is logged once with its fix, recovery once; `gpu_exporter_cri_*` say
//!   the rest.
//!
//! One addition: the sampler can [`CriRefresher::waker`] it when it meets a container the answer
//! does not list (a pod started since the last listing). It then lists again at once, at most
//! once per [`MIN_WAKE_GAP`], so new pods are attributed within a tick or two.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cri::ContainerRuntime;
use super::directory::{LabelOptions, PodDirectory};
use super::refresh::{log_failure, unix_now, Policy, RefreshOutcome};
use super::Answered;

mod metrics;
pub use metrics::{CriMetrics, CriState};

/// The shortest time between two listings asked for by the sampler.
pub const MIN_WAKE_GAP: Duration = Duration::from_secs(1);

/// Settings.
#[derive(Debug, Clone)]
pub struct CriOptions {
    /// Time between listings while they succeed.
    pub refresh: Duration,
    /// How long the last good answer is used while listings fail.
    pub ttl: Duration,
    /// Which pod labels to keep.
    pub labels: LabelOptions,
}

/// The container-runtime task's state.
#[derive(Debug)]
pub struct CriRefresher<R: ContainerRuntime> {
    runtime: R,
    tx: watch::Sender<Arc<PodDirectory>>,
    answered: watch::Sender<Answered>,
    metrics: Arc<CriMetrics>,
    opts: CriOptions,
    wake: Arc<Notify>,
    policy: Policy<()>,
    last_call: Option<Instant>,
    version_logged: bool,
}

impl<R: ContainerRuntime> CriRefresher<R> {
    /// Creates the task publishing on `tx`. Turns on the `gpu_exporter_cri_*` families.
    pub fn new(
        runtime: R,
        tx: watch::Sender<Arc<PodDirectory>>,
        metrics: Arc<CriMetrics>,
        opts: CriOptions,
    ) -> Self {
        metrics.enable();
        Self {
            runtime,
            tx,
            answered: watch::Sender::new(Answered::default()),
            metrics,
            policy: Policy::new(opts.ttl),
            opts,
            wake: Arc::new(Notify::new()),
            last_call: None,
            version_logged: false,
        }
    }

    /// What the sampler notifies to ask for a listing now.
    pub fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// Follows the good answers (for the sampler's first sample, which waits for the first).
    pub fn answered(&self) -> watch::Receiver<Answered> {
        self.answered.subscribe()
    }

    /// Lists once, then publishes what follows from the answer (or its absence).
    pub async fn refresh_once(&mut self) -> RefreshOutcome {
        let result = self.runtime.list().await;
        let now = Instant::now();
        self.last_call = Some(now);
        let status = &self.metrics;
        match result {
            Ok(snapshot) => {
                status.record_success(unix_now());
                if let Some(reason) = self.policy.succeeded(now, ()) {
                    tracing::info!(socket = %self.runtime.origin(), previous = reason, "container runtime answering again");
                }
                if !self.version_logged {
                    self.version_logged = true;
                    match self.runtime.version().await {
                        Ok(v) => {
                            tracing::info!(socket = %self.runtime.origin(), runtime = %v, "container runtime (CRI) answering")
                        }
                        Err(e) => {
                            tracing::debug!(error = %crate::error_chain(&e), "CRI Version failed")
                        }
                    }
                }
                let dir = PodDirectory::from_runtime(&snapshot, &self.opts.labels);
                self.publish(dir);
                self.answered.send_modify(|a| {
                    a.answers += 1;
                    a.unavailable = None;
                });
                RefreshOutcome::Fresh
            }
            Err(e) => {
                let reason = e.reason();
                status.record_failure(reason);
                self.answered
                    .send_if_modified(|a| super::unavailable(a, reason));
                let failed = self.policy.failed(now, reason);
                log_failure!(
                    failed,
                    e,
                    self.opts.refresh,
                    self.opts.ttl,
                    warn: "container runtime unavailable: {}. Retrying every {:?} at most; {}",
                    kept: "the last answer is used until it is older than the TTL",
                    not_kept: "meanwhile no pod_uid, pod labels or per-container GPU usage (holder attribution only)",
                    again: "CRI listing failed again",
                    dropped: "no good container runtime answer within the TTL; pod_uid, pod labels and per-container usage dropped until it answers",
                );
                if failed.kept() {
                    return failed.outcome;
                }
                self.publish(PodDirectory::default());
                failed.outcome
            }
        }
    }

    fn publish(&self, dir: PodDirectory) {
        self.metrics
            .record_published(dir.pods_len(), dir.containers_len());
        self.tx.send_if_modified(|cur| {
            if **cur == dir {
                false
            } else {
                *cur = Arc::new(dir);
                true
            }
        });
    }

    /// The delay before the next listing.
    pub fn next_delay(&self) -> Duration {
        self.policy.next_delay(self.opts.refresh)
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let wake = Arc::clone(&self.wake);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = self.refresh_once() => {}
            }
            let deadline = Instant::now() + self.next_delay();
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(deadline) => {}
                () = wake.notified() => {
                    let since = self.last_call.map_or(MIN_WAKE_GAP, |t| t.elapsed());
                    if since < MIN_WAKE_GAP {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(MIN_WAKE_GAP - since) => {}
                        }
                    }
                }
            }
        }
    }
}
