//! HPC job mapping (`--hpc-job-mapping-dir`, dcgm-exporter's format): which batch jobs (Slurm
//! and the like) run on which GPU, from files a job scheduler's prolog and epilog write.
//!
//! - One file per GPU, named by its index (`0`, `1`, …), or per MIG instance, named
//!   `<GPU index>.<GPU_I_ID>` (`2.3`). As in dcgm-exporter, a MIG instance's series match only
//!   its `<gpu>.<gi>` file and a whole GPU's series only its `<gpu>` file. Names must be plain
//!   decimal numbers without leading zeros; other names (editor and temporary files) and
//!   directories are skipped.
//! - One job id per line. Surrounding white space and blank lines are dropped and repeated ids
//!   kept once (dcgm-exporter would emit the same series twice). An empty file means no job.
//! - Every series of the GPU or instance carries `hpc_job`, one copy per job.
//!
//! The directory is read by a background task ([`HpcWatcher`]) on its own cadence, never on the
//! scrape path, and the result is published on a `watch` channel the sampler reads at each tick.
//! Only the files named for a GPU or MIG instance that exists (the sampler's device inventory)
//! are opened, so memory is bounded by the node's GPUs, not by what is in the directory: files
//! named for other GPUs, and other names, are counted by reason
//! (`gpu_exporter_hpc_job_files_ignored`) and never read. Each is opened through
//! [`crate::fsread`]: a regular file of at most [`MAX_FILE_BYTES`], never a symbolic link (a
//! link to a TLS key would publish its lines as `hpc_job` labels), a FIFO or a device.
//! A file that cannot be used (a link, not a regular file, unreadable, not UTF-8, too large, more
//! than [`MAX_JOBS`] jobs, a control character in a job id) is logged once with its path (and
//! line), counted, and ignored: its GPU gets no `hpc_job` label, every other file and series is
//! unaffected. A missing directory is logged once and means no jobs until it appears.
//!
//! Its parts, each importing only from below: `files` (the mapping files: which names are
//! read, what a file may hold, one scan of the directory), `metrics` (the
//! `gpu_exporter_hpc_job_*` series, [`HpcMetrics`]), and this file, the watcher that scans on
//! its cadence, logs and counts what changed, and publishes.

mod files;
mod metrics;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use files::{
    entities, entity_of, file_name, parse_jobs, scan, HpcError, HpcJobs, Ignored, MAX_FILE_BYTES,
    MAX_JOBS, MAX_LISTED,
};
pub use metrics::{HpcJobsState, HpcMetrics};

use crate::gpu::Device;
use crate::pods::Answered;

/// The task that reads the directory on its cadence and publishes what changed.
#[derive(Debug)]
pub struct HpcWatcher {
    dir: PathBuf,
    metrics: Arc<HpcMetrics>,
    /// The devices found by the sampler: the files of their GPUs and instances are read.
    inventory: watch::Receiver<Arc<Vec<Device>>>,
    /// The problems of the last scan (each is logged and counted when it first appears).
    problems: Vec<HpcError>,
    /// The ignored entries of the last scan (logged when they change).
    ignored: BTreeMap<&'static str, usize>,
    answered: watch::Sender<Answered>,
}

impl HpcWatcher {
    /// Watches `dir` for the GPUs and MIG instances in `inventory` (the sampler's discovery;
    /// nothing is read before the first). Turns on the `gpu_exporter_hpc_job_*` families.
    pub fn new(
        dir: PathBuf,
        metrics: Arc<HpcMetrics>,
        inventory: watch::Receiver<Arc<Vec<Device>>>,
    ) -> Self {
        metrics.enable();
        Self {
            dir,
            metrics,
            inventory,
            problems: Vec::new(),
            ignored: BTreeMap::new(),
            answered: watch::Sender::new(Answered::default()),
        }
    }

    /// Follows the scans taken in (for the sampler's first sample, which waits for the first).
    pub fn answered(&self) -> watch::Receiver<Answered> {
        self.answered.subscribe()
    }

    /// The watched directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes in one scan: logs and counts new problems, logs solved ones, updates the gauges and
    /// publishes the result on `tx` if it differs from what is there. Returns whether it did.
    pub fn apply(&mut self, scanned: HpcJobs, tx: &watch::Sender<Arc<HpcJobs>>) -> bool {
        for e in scanned.errors.iter().filter(|e| !self.problems.contains(e)) {
            self.metrics.count_error(e.reason());
            match e {
                HpcError::DirUnreadable { .. } => tracing::warn!(
                    error = %e,
                    "no HPC job labels until the directory can be read; mount the host directory the job scheduler writes into the exporter's container"
                ),
                _ => tracing::warn!(
                    error = %e,
                    "HPC job mapping file ignored: its GPU gets no hpc_job label until the file is fixed"
                ),
            }
        }
        for e in self.problems.iter().filter(|e| !scanned.errors.contains(e)) {
            tracing::info!(previous = %e, "HPC job mapping problem gone");
        }
        self.problems.clone_from(&scanned.errors);
        if scanned.ignored != self.ignored {
            if !scanned.ignored.is_empty() {
                tracing::warn!(
                    dir = %self.dir.display(),
                    no_such_gpu = scanned.ignored.get(Ignored::NO_SUCH_GPU).copied().unwrap_or(0),
                    not_a_mapping_name = scanned.ignored.get(Ignored::NOT_A_MAPPING_NAME).copied().unwrap_or(0),
                    "HPC job mapping directory entries ignored (not read): named for no GPU or MIG instance on this node, or not <gpu> / <gpu>.<gi>"
                );
            }
            self.ignored.clone_from(&scanned.ignored);
        }
        self.metrics.record_ignored(&scanned.ignored);
        let bad = scanned
            .errors
            .iter()
            .filter(|e| !matches!(e, HpcError::DirUnreadable { .. }))
            .count();
        self.metrics.record_scan(scanned.files, bad);
        let changed = tx.send_if_modified(|cur| {
            if **cur == scanned {
                false
            } else {
                *cur = Arc::new(scanned);
                true
            }
        });
        // A scan is an answer, whatever it found (a missing directory means no jobs).
        self.answered.send_modify(|a| a.answers += 1);
        changed
    }

    /// Scans every `every` until `shutdown`, publishing on `tx`.
    pub async fn run(
        mut self,
        tx: watch::Sender<Arc<HpcJobs>>,
        every: Duration,
        shutdown: CancellationToken,
    ) {
        // Nothing is read before the sampler has found the devices.
        tokio::select! {
            () = shutdown.cancelled() => return,
            found = async { self.inventory.wait_for(|d| !d.is_empty()).await.is_ok() } => {
                if !found {
                    // The sampler is gone (the process is ending).
                    return shutdown.cancelled().await;
                }
            }
        }
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let dir = self.dir.clone();
            let monitored = entities(&self.inventory.borrow_and_update());
            let scanned = match tokio::task::spawn_blocking(move || scan(&dir, &monitored)).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "HPC job mapping scan failed; keeping the last result");
                    continue;
                }
            };
            self.apply(scanned, &tx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::EntityKey;

    fn key(gpu: u32, gi_id: Option<u32>) -> EntityKey {
        EntityKey { gpu, gi_id }
    }

    #[test]
    fn problems_are_counted_once_and_only_changes_are_published() {
        let metrics = Arc::new(HpcMetrics::default());
        let (_inventory_tx, inventory) = watch::channel(Arc::new(Vec::new()));
        let mut w = HpcWatcher::new("/run/hpc".into(), Arc::clone(&metrics), inventory);
        let (tx, rx) = watch::channel(Arc::new(HpcJobs::default()));
        let bad = HpcError::BadLine {
            path: "/run/hpc/1".into(),
            line: 1,
        };
        let scanned = HpcJobs {
            jobs: BTreeMap::from([(key(0, None), vec!["j".to_owned()])]),
            files: 1,
            errors: vec![bad.clone()],
            ignored: BTreeMap::new(),
        };
        assert!(w.apply(scanned.clone(), &tx));
        assert_eq!(rx.borrow().jobs.len(), 1);
        // The same again: nothing new to publish or count.
        assert!(!w.apply(scanned, &tx));
        let st = metrics.state();
        assert_eq!(st.errors.get("bad_line"), Some(&1));
        assert_eq!((st.files_ok, st.files_bad), (1, 1));
        // Fixed: published, and the count stays.
        assert!(w.apply(
            HpcJobs {
                files: 2,
                ..HpcJobs::default()
            },
            &tx
        ));
        let st = metrics.state();
        assert_eq!(st.errors.get("bad_line"), Some(&1));
        assert_eq!((st.files_ok, st.files_bad), (2, 0));
        // Broken the same way again: counted again.
        w.apply(
            HpcJobs {
                errors: vec![bad],
                ..HpcJobs::default()
            },
            &tx,
        );
        assert_eq!(metrics.state().errors.get("bad_line"), Some(&2));
    }
}
