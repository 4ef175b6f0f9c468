//! The HPC job mapping's own series, `gpu_exporter_hpc_job_*`: files in use and ignored at the
//! last scan, problems by reason. A [`Collector`] over the latest state.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::files::{HpcError, Ignored};
use crate::self_metrics::{self, Collector, DescriptorEncoder, Num, Reason};

/// The HPC job mapping's own series, `gpu_exporter_hpc_job_*`: updated by
/// [`HpcWatcher`](super::HpcWatcher),
/// rendered only with `--hpc-job-mapping-dir`. A [`Collector`] over the latest scan.
#[derive(Debug, Default)]
pub struct HpcMetrics {
    inner: Mutex<HpcJobsState>,
}

/// A copy of [`HpcMetrics`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HpcJobsState {
    /// Whether `--hpc-job-mapping-dir` is set (the families are rendered only then).
    pub enabled: bool,
    /// Mapping files read successfully at the last scan.
    pub files_ok: u64,
    /// Mapping files ignored at the last scan (unreadable or invalid).
    pub files_bad: u64,
    /// Problems seen, by reason (each counted when it appears).
    pub errors: BTreeMap<&'static str, u64>,
    /// Directory entries not read at the last scan, by reason.
    pub ignored: BTreeMap<&'static str, u64>,
}

/// A label set of one label, `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
struct FileState {
    state: &'static str,
}

impl HpcMetrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, HpcJobsState> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Turns the families on.
    pub fn enable(&self) {
        self.lock().enabled = true;
    }

    /// Records the file counts of a scan.
    pub fn record_scan(&self, ok: usize, bad: usize) {
        let mut s = self.lock();
        s.files_ok = ok as u64;
        s.files_bad = bad as u64;
    }

    /// Records the entries the last scan did not read, by reason.
    pub fn record_ignored(&self, ignored: &BTreeMap<&'static str, usize>) {
        self.lock().ignored = ignored.iter().map(|(&k, &v)| (k, v as u64)).collect();
    }

    /// Counts a new problem.
    pub fn count_error(&self, reason: &'static str) {
        *self.lock().errors.entry(reason).or_default() += 1;
    }

    /// A copy of the current state.
    pub fn state(&self) -> HpcJobsState {
        self.lock().clone()
    }
}

impl Collector for HpcMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let s = self.state();
        if !s.enabled {
            return Ok(());
        }
        let n = |m: &BTreeMap<&'static str, u64>, k: &str| m.get(k).copied().unwrap_or(0);
        self_metrics::gauge(
            &mut e,
            "gpu_exporter_hpc_job_files",
            "HPC job mapping files at the last read of --hpc-job-mapping-dir: ok (in use), bad (ignored: unreadable or invalid).",
            [("bad", s.files_bad), ("ok", s.files_ok)]
                .map(|(state, v)| (FileState { state }, Num::count(v))),
        )?;
        self_metrics::counter(
            &mut e,
            "gpu_exporter_hpc_job_file_errors",
            "Problems with the HPC job mapping directory or its files, by reason, each counted when it appears.",
            HpcError::REASONS
                .iter()
                .map(|&reason| (Reason { reason }, n(&s.errors, reason))),
        )?;
        self_metrics::gauge(
            &mut e,
            "gpu_exporter_hpc_job_files_ignored",
            "Entries of --hpc-job-mapping-dir not read at the last scan, by reason: no_such_gpu (named for a GPU or MIG instance not on this node), not_a_mapping_name.",
            Ignored::REASONS
                .iter()
                .map(|&reason| (Reason { reason }, Num::count(n(&s.ignored, reason)))),
        )
    }
}
