//! Pod UIDs and labels from the API server, for the kubelet-attributed series when no container
//! runtime socket is mounted (the GPU Operator's ClusterPolicy mounts none): a list and watch of
//! this node's pods (`fieldSelector=spec.nodeName=$NODE_NAME`), metadata only, kept as a
//! [`PodDirectory`] and published on the same `watch` channel the sampler reads the container
//! runtime's on. Only (namespace, pod) → UID and labels are known this way: per-process
//! attribution still needs the runtime.
//!
//! - A list, then a watch from its resourceVersion; each event updates the pods and publishes.
//!   The watch asks the server to end it after [`WATCH_SECONDS`] and is opened again from the
//!   last resourceVersion (bookmarks keep that fresh).
//! - `410 Gone` (the resourceVersion is too old): list again at once (after a backoff when the
//!   previous watch also ended in 410 without an event); the pods known so far stay published
//!   until the new list replaces them, so none is lost in between.
//! - Any other failure (401, 403, a timeout, the server down): retried with a backoff from 0.5 s
//!   up to 10 s; the last good answer is used until the TTL, then an empty directory is published
//!   (no pod_uid or pod labels) until the server answers again.
//! - Each distinct problem is logged once, with what to do; recovery once;
//!   `gpu_exporter_kube_api_*` say the rest.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::Api;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::{bounded, KubeClient, WATCH_IDLE, WATCH_SECONDS};
use super::error::{Call, KubeError};
use super::metrics::KubeApiMetrics;
use crate::pods::directory::{ApiPod, LabelOptions, PodDirectory};
use crate::pods::refresh::{backoff, unix_now};
use crate::pods::Answered;

/// The longest wait between two tries after failures.
const MAX_RETRY: Duration = Duration::from_secs(10);

/// Settings.
#[derive(Debug, Clone)]
pub struct PodWatchOptions {
    /// This node's name (`NODE_NAME`); `None` watches the pods of every node (dcgm-exporter does
    /// the same without it), which costs memory and API server work on a big cluster.
    pub node: Option<String>,
    /// Timeout of a list.
    pub timeout: Duration,
    /// How long the last good answer is used while the API server does not answer.
    pub ttl: Duration,
    /// Which pod labels to keep.
    pub labels: LabelOptions,
}

/// The pod watch task's state.
#[derive(Debug)]
pub struct PodWatcher {
    client: KubeClient,
    tx: watch::Sender<Arc<PodDirectory>>,
    answered: watch::Sender<Answered>,
    metrics: Arc<KubeApiMetrics>,
    opts: PodWatchOptions,
    pods: HashMap<(String, String), ApiPod>,
    version: String,
    last_good: Option<Instant>,
    problem: Option<&'static str>,
    dropped: bool,
    failures: u32,
    /// 410s in a row with no watch event between them: from the second on, the new list waits
    /// a backoff (a server that expires every watch at once must not be listed in a loop).
    gone_streak: u32,
}

impl PodWatcher {
    /// Creates the task publishing on `tx`. Turns on the `gpu_exporter_kube_api_*` families.
    pub fn new(
        client: KubeClient,
        tx: watch::Sender<Arc<PodDirectory>>,
        metrics: Arc<KubeApiMetrics>,
        opts: PodWatchOptions,
    ) -> Self {
        metrics.enable();
        Self {
            client,
            tx,
            answered: watch::Sender::new(Answered::default()),
            metrics,
            opts,
            pods: HashMap::new(),
            version: String::new(),
            last_good: None,
            problem: None,
            dropped: false,
            failures: 0,
            gone_streak: 0,
        }
    }

    /// Follows the good answers (for the sampler's first sample, which waits for the first).
    pub fn answered(&self) -> watch::Receiver<Answered> {
        self.answered.subscribe()
    }

    fn target(&self) -> String {
        match &self.opts.node {
            Some(n) => format!("on node {n} (fieldSelector spec.nodeName={n})"),
            None => "in all namespaces, on every node (NODE_NAME is not set)".to_owned(),
        }
    }

    fn call(&self, verb: &'static str) -> Call {
        Call {
            verb,
            resource: "pods",
            target: self.target(),
        }
    }

    fn api(&self) -> Api<Pod> {
        Api::all(self.client.client.clone())
    }

    fn selector(&self) -> Option<String> {
        self.opts
            .node
            .as_ref()
            .map(|n| format!("spec.nodeName={n}"))
    }

    /// Lists the pods, replacing what is known.
    ///
    /// # Errors
    /// The list's.
    async fn list(&mut self) -> Result<(), KubeError> {
        let mut lp = ListParams::default();
        if let Some(s) = self.selector() {
            lp = lp.fields(&s);
        }
        let api = self.api();
        let list = bounded(self.call("list"), self.opts.timeout, api.list_metadata(&lp)).await?;
        self.pods = list
            .items
            .into_iter()
            .filter_map(|p| api_pod(p.metadata))
            .collect();
        self.version = list.metadata.resource_version.unwrap_or_default();
        self.metrics.record_list();
        self.good();
        self.publish();
        self.answered.send_modify(|a| a.answers += 1);
        Ok(())
    }

    /// Watches from the last resourceVersion until the server ends it or it fails.
    async fn watch_once(&mut self, shutdown: &CancellationToken) -> Result<(), KubeError> {
        let mut wp = WatchParams::default().timeout(WATCH_SECONDS);
        if let Some(s) = self.selector() {
            wp = wp.fields(&s);
        }
        let api = self.api();
        let stream = bounded(
            self.call("watch"),
            self.opts.timeout,
            api.watch_metadata(&wp, &self.version),
        )
        .await?;
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                n = tokio::time::timeout(WATCH_IDLE, next_event(&mut stream)) => n,
            };
            let event = match next {
                Err(_) => {
                    return Err(KubeError::Timeout {
                        call: self.call("watch"),
                        timeout: WATCH_IDLE,
                    })
                }
                // The server ended it (its timeout): what is known was current until now.
                Ok(None) => {
                    self.good();
                    return Ok(());
                }
                Ok(Some(Err(e))) => return Err(KubeError::from_kube(self.call("watch"), e)),
                Ok(Some(Ok(ev))) => ev,
            };
            match event {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    self.bump(p.metadata.resource_version.as_deref());
                    if let Some((key, pod)) = api_pod(p.metadata) {
                        self.pods.insert(key, pod);
                    }
                }
                WatchEvent::Deleted(p) => {
                    self.bump(p.metadata.resource_version.as_deref());
                    if let (Some(ns), Some(name)) = (p.metadata.namespace, p.metadata.name) {
                        self.pods.remove(&(ns, name));
                    }
                }
                WatchEvent::Bookmark(b) => self.bump(Some(&b.metadata.resource_version)),
                WatchEvent::Error(s) => {
                    return Err(KubeError::from_status(
                        self.call("watch"),
                        s.code,
                        s.message.clone(),
                    ))
                }
            }
            self.gone_streak = 0;
            self.good();
            self.publish();
        }
    }

    fn bump(&mut self, version: Option<&str>) {
        if let Some(v) = version.filter(|v| !v.is_empty()) {
            v.clone_into(&mut self.version);
        }
    }

    fn good(&mut self) {
        self.metrics.record_success(unix_now());
        self.last_good = Some(Instant::now());
        self.failures = 0;
        self.dropped = false;
        if let Some(reason) = self.problem.take() {
            tracing::info!(server = %self.client.url, previous = reason, "Kubernetes API answering again (pods)");
        }
    }

    /// Records a failure; publishes an empty directory once the last good answer is older than
    /// the TTL.
    fn failed(&mut self, e: &KubeError) {
        let reason = e.reason();
        self.metrics.record_failure(reason);
        if !matches!(e, KubeError::Gone { .. }) {
            self.failures = self.failures.saturating_add(1);
        }
        let kept = self
            .last_good
            .map(|at| at.elapsed())
            .is_some_and(|age| age < self.opts.ttl);
        if matches!(e, KubeError::Gone { .. }) {
            tracing::info!(error = %crate::error_chain(e), "pod watch expired; listing again (the pods known so far stay in use meanwhile)");
        } else if self.problem == Some(reason) {
            tracing::debug!(error = %crate::error_chain(e), "Kubernetes API pod call failed again");
        } else {
            self.problem = Some(reason);
            tracing::warn!(
                error = %crate::error_chain(e),
                reason,
                server = %self.client.url,
                "Kubernetes API unavailable for pod labels and UIDs; retrying; {}",
                if kept {
                    "the last answer is used until it is older than the TTL"
                } else {
                    "meanwhile no pod_uid or pod labels"
                },
            );
        }
        if !kept && !self.dropped && self.last_good.is_some() {
            tracing::warn!(ttl = ?self.opts.ttl, "no good Kubernetes API answer within the TTL; pod_uid and pod labels dropped until it answers");
            self.dropped = true;
            self.pods.clear();
            self.publish_empty();
        } else if !kept && self.last_good.is_none() {
            self.publish_empty();
        }
    }

    fn publish(&self) {
        let dir = PodDirectory::from_api(self.pods.iter(), &self.opts.labels);
        self.send(dir);
    }

    fn publish_empty(&self) {
        self.send(PodDirectory::default());
    }

    fn send(&self, dir: PodDirectory) {
        self.metrics.record_published(dir.pods_len());
        self.tx.send_if_modified(|cur| {
            if **cur == dir {
                false
            } else {
                *cur = Arc::new(dir);
                true
            }
        });
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut need_list = true;
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            if need_list {
                let listed = tokio::select! {
                    () = shutdown.cancelled() => return,
                    r = self.list() => r,
                };
                if let Err(e) = listed {
                    self.failed(&e);
                    if !pause(backoff(self.failures, MAX_RETRY), &shutdown).await {
                        return;
                    }
                    continue;
                }
                need_list = false;
            }
            match self.watch_once(&shutdown).await {
                // The server ended it (its timeout): open it again from the last
                // resourceVersion.
                Ok(()) => {}
                Err(e) => {
                    self.failed(&e);
                    need_list = true;
                    let wait = if matches!(e, KubeError::Gone { .. }) {
                        self.gone_streak = self.gone_streak.saturating_add(1);
                        // The first 410 after events: list again at once.
                        (self.gone_streak > 1).then(|| backoff(self.gone_streak - 1, MAX_RETRY))
                    } else {
                        Some(backoff(self.failures, MAX_RETRY))
                    };
                    if let Some(wait) = wait {
                        if !pause(wait, &shutdown).await {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Waits `wait` (a retry's backoff); false on shutdown.
async fn pause(wait: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(wait) => true,
    }
}

async fn next_event<S: Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *s).poll_next(cx)).await
}

fn api_pod(m: ObjectMeta) -> Option<((String, String), ApiPod)> {
    let ns = m.namespace?;
    let name = m.name?;
    Some((
        (ns, name),
        ApiPod {
            uid: m.uid.unwrap_or_default(),
            labels: m.labels.unwrap_or_default(),
        },
    ))
}
