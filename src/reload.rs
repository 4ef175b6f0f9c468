//! Metrics-CSV hot reload: on SIGHUP, or when the `--collectors` file's contents change, the
//! file is parsed again and, if valid, published to the sampler's catalog channel.
//!
//! The decision is pure ([`CatalogReloader::consider`] takes the file's text), the loop
//! ([`CatalogReloader::run`]) only reads the file, waits for triggers and publishes. A bad file
//! is logged with its `file:line` error and counted; the old catalog keeps serving. The new
//! catalog goes through the same `retain_supported` filter as at startup.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::catalog::{self, Catalog, CatalogError, Field, MetricSpec, Skipped};
use crate::self_metrics::{self, Collector, DescriptorEncoder, Num};

/// Why a reload was attempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP (or another explicit request): always re-parse, even if unchanged.
    Signal,
    /// The periodic check: re-parse only if the contents changed.
    Poll,
}

/// What [`CatalogReloader::consider`] decided.
#[derive(Debug)]
pub enum Outcome {
    /// The contents are as last seen (a poll); nothing to do.
    Unchanged,
    /// A valid catalog to publish, with the rows dropped for the source and those skipped.
    Reloaded {
        /// The new catalog, already filtered by the source's support.
        catalog: Catalog,
        /// Rows the source cannot read.
        dropped: Vec<MetricSpec>,
        /// Rows naming fields gpu-exporter does not collect.
        skipped: Vec<Skipped>,
    },
    /// The new contents are invalid (or the file unreadable); the old catalog stays.
    Rejected(CatalogError),
}

/// Watches one metrics CSV file.
pub struct CatalogReloader<F> {
    path: PathBuf,
    supported: F,
    backend: String,
    seen: [u8; 32],
}

impl<F> std::fmt::Debug for CatalogReloader<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogReloader")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl<F: Fn(Field) -> bool + Send + 'static> CatalogReloader<F> {
    /// Watches `path`, whose contents at startup were `initial` (so an unchanged file is not
    /// reloaded by the first poll). `supported` is the source's `supports`; `backend` its name.
    pub fn new(path: PathBuf, initial: &[u8], supported: F, backend: &str) -> Self {
        Self {
            path,
            supported,
            backend: backend.to_owned(),
            seen: digest(initial),
        }
    }

    /// Decides what to do with the file's current contents (`Err`: it could not be read).
    pub fn consider(
        &mut self,
        contents: Result<String, CatalogError>,
        trigger: Trigger,
    ) -> Outcome {
        let origin = self.path.display().to_string();
        let seen = match &contents {
            Ok(text) => digest(text.as_bytes()),
            Err(e) => digest(format!("unreadable: {}", crate::error_chain(e)).as_bytes()),
        };
        if trigger == Trigger::Poll && seen == self.seen {
            return Outcome::Unchanged;
        }
        self.seen = seen;
        let text = match contents {
            Ok(t) => t,
            Err(e) => return Outcome::Rejected(e),
        };
        match catalog::parse(&text, &origin) {
            Ok((mut catalog, skipped)) => {
                let dropped = catalog.retain_supported(&self.supported);
                if catalog.metrics.is_empty() {
                    return Outcome::Rejected(CatalogError::NoneSupported {
                        origin,
                        backend: self.backend.clone(),
                    });
                }
                Outcome::Reloaded {
                    catalog,
                    dropped,
                    skipped,
                }
            }
            Err(e) => Outcome::Rejected(e),
        }
    }

    /// Reloads on every message on `requests` (SIGHUP) and on content changes seen every
    /// `poll_every`, publishing valid catalogs on `tx`, until `shutdown`.
    pub async fn run(
        mut self,
        tx: watch::Sender<Arc<Catalog>>,
        mut requests: mpsc::Receiver<()>,
        poll_every: Duration,
        metrics: Arc<ReloadMetrics>,
        shutdown: CancellationToken,
    ) {
        let mut poll = tokio::time::interval(poll_every);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        poll.tick().await;
        loop {
            let trigger = tokio::select! {
                () = shutdown.cancelled() => return,
                r = requests.recv() => match r {
                    Some(()) => Trigger::Signal,
                    None => return,
                },
                _ = poll.tick() => Trigger::Poll,
            };
            let path = self.path.clone();
            // The bounded reader never waits on the file's other end (a FIFO is refused), but
            // shutdown is not held up by a read either way.
            let read = tokio::task::spawn_blocking(move || catalog::read(&path));
            let contents = tokio::select! {
                () = shutdown.cancelled() => return,
                r = read => r.unwrap_or_else(|e| {
                    Err(CatalogError::Read(crate::fsread::ReadError::Io {
                        path: self.path.clone(),
                        cause: std::io::Error::other(e),
                    }))
                }),
            };
            match self.consider(contents, trigger) {
                Outcome::Unchanged => {}
                Outcome::Reloaded {
                    catalog,
                    dropped,
                    skipped,
                } => {
                    let origin = self.path.display();
                    for s in &skipped {
                        tracing::warn!("{origin}:{}: {s}", s.line);
                    }
                    for m in &dropped {
                        tracing::warn!(
                            "{origin}:{}: skipping {}: the GPU backend cannot read it",
                            m.line,
                            m.name
                        );
                    }
                    tracing::info!(
                        collectors = %origin,
                        metrics = catalog.metrics.len(),
                        ?trigger,
                        "metrics CSV reloaded"
                    );
                    metrics.count(true);
                    tx.send_replace(Arc::new(catalog));
                }
                Outcome::Rejected(e) => {
                    tracing::error!(
                        "metrics CSV reload rejected, the previous configuration keeps serving: {}",
                        crate::error_chain(&e)
                    );
                    metrics.count(false);
                }
            }
        }
    }
}

/// The metrics CSV's own series, `gpu_exporter_config_*`: reloads by result and whether the
/// last one worked. Counted by [`CatalogReloader::run`].
#[derive(Debug, Default)]
pub struct ReloadMetrics {
    succeeded: Counter,
    failed: Counter,
    last_failed: AtomicBool,
}

/// A label set of one label, `result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
struct ReloadResult {
    result: &'static str,
}

impl ReloadMetrics {
    /// Counts a reload attempt and remembers whether the last one worked.
    pub fn count(&self, success: bool) {
        if success {
            self.succeeded.inc();
        } else {
            self.failed.inc();
        }
        self.last_failed.store(!success, Ordering::Relaxed);
    }
}

impl Collector for ReloadMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        self_metrics::counter(
            &mut e,
            "gpu_exporter_config_reloads",
            "Metrics CSV reloads (SIGHUP or file change), by result.",
            [
                (ReloadResult { result: "failure" }, self.failed.get()),
                (ReloadResult { result: "success" }, self.succeeded.get()),
            ],
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_config_last_reload_success",
            "1 if the last metrics CSV reload succeeded (or none was attempted), 0 if it was rejected and the previous configuration is serving.",
            Num::Int(i64::from(!self.last_failed.load(Ordering::Relaxed))),
        )
    }
}

/// The SIGHUP stream (`None` where it cannot be listened for).
#[cfg(unix)]
pub type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
pub type Hangup = Option<()>;

/// Starts listening for SIGHUP; until the reloader runs, signals are queued on the stream.
pub fn hangup_signal() -> Hangup {
    #[cfg(unix)]
    return tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    #[cfg(not(unix))]
    None
}

/// Forwards SIGHUP to the reloader (a full channel means a reload is already pending).
pub async fn forward_sighup(hup: Hangup, tx: tokio::sync::mpsc::Sender<()>) {
    #[cfg(unix)]
    {
        let Some(mut hup) = hup else {
            tracing::warn!("cannot listen for SIGHUP; the metrics CSV reloads only on file change");
            return std::future::pending().await;
        };
        while hup.recv().await.is_some() {
            let _ = tx.try_send(());
        }
    }
    #[cfg(not(unix))]
    drop((hup, tx));
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n";
    const TWO: &str = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\nDCGM_FI_DEV_GPU_TEMP, gauge, Temperature (in C).\n";

    fn reloader() -> CatalogReloader<impl Fn(Field) -> bool + Send> {
        CatalogReloader::new(
            "/etc/x/counters.csv".into(),
            GOOD.as_bytes(),
            |f| f != Field::GpuTemp,
            "sim",
        )
    }

    #[test]
    fn an_unchanged_file_is_left_alone_on_poll_but_reloaded_on_signal() {
        let mut r = reloader();
        assert!(matches!(
            r.consider(Ok(GOOD.into()), Trigger::Poll),
            Outcome::Unchanged
        ));
        assert!(matches!(
            r.consider(Ok(GOOD.into()), Trigger::Signal),
            Outcome::Reloaded { .. }
        ));
    }

    #[test]
    fn a_changed_file_is_reloaded_through_the_support_filter() {
        let mut r = reloader();
        match r.consider(Ok(TWO.into()), Trigger::Poll) {
            Outcome::Reloaded {
                catalog, dropped, ..
            } => {
                assert_eq!(catalog.metrics.len(), 1);
                assert_eq!(dropped[0].name, "DCGM_FI_DEV_GPU_TEMP");
                assert_eq!(dropped[0].line, 2);
            }
            o => panic!("{o:?}"),
        }
        assert!(matches!(
            r.consider(Ok(TWO.into()), Trigger::Poll),
            Outcome::Unchanged
        ));
    }

    #[test]
    fn a_bad_file_is_rejected_with_file_and_line_once() {
        let mut r = reloader();
        let bad = "DCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_NOPE, gauge, x\n";
        match r.consider(Ok(bad.into()), Trigger::Poll) {
            Outcome::Rejected(e) => assert!(
                e.to_string()
                    .starts_with("/etc/x/counters.csv:2: unknown field \"DCGM_FI_NOPE\""),
                "{e}"
            ),
            o => panic!("{o:?}"),
        }
        // The same bad contents are not re-reported by every poll.
        assert!(matches!(
            r.consider(Ok(bad.into()), Trigger::Poll),
            Outcome::Unchanged
        ));
        let gone = Err(CatalogError::Read(crate::fsread::ReadError::NotFound {
            path: "/etc/x/counters.csv".into(),
        }));
        assert!(matches!(
            r.consider(gone, Trigger::Poll),
            Outcome::Rejected(CatalogError::Read(_))
        ));
    }

    #[test]
    fn an_empty_file_or_one_the_backend_cannot_read_is_rejected() {
        let mut r = reloader();
        match r.consider(Ok(String::new()), Trigger::Poll) {
            Outcome::Rejected(e @ CatalogError::Empty { .. }) => {
                assert!(
                    e.to_string()
                        .starts_with("/etc/x/counters.csv: lists no metric"),
                    "{e}"
                );
            }
            o => panic!("{o:?}"),
        }
        let temp_only = "DCGM_FI_DEV_GPU_TEMP, gauge, Temperature (in C).\n";
        match r.consider(Ok(temp_only.into()), Trigger::Poll) {
            Outcome::Rejected(e) => assert_eq!(
                e.to_string(),
                "/etc/x/counters.csv: none of its metrics can be read by the sim backend; refused, as it would drop every GPU series"
            ),
            o => panic!("{o:?}"),
        }
    }
}
