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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::fsread::{self, Cap, ReadError, Symlinks};
use crate::gpu::Device;
use crate::pods::{Answered, EntityKey};
use crate::self_metrics::{self, Collector, DescriptorEncoder, Num, Reason};

/// Largest mapping file read, bytes.
pub const MAX_FILE_BYTES: u64 = Cap::HPC_JOB_FILE.0;
/// Most directory entries looked at per scan to count the ignored ones (the files that are
/// read are opened by name, whatever the directory holds).
pub const MAX_LISTED: usize = 100_000;
/// Most job ids one file may list (each is a copy of every series of its GPU).
pub const MAX_JOBS: usize = 64;

/// Why a mapping file (or the directory) is not used. Names the path, and the line where
/// there is one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
pub enum HpcError {
    /// The directory cannot be listed (missing, no permission).
    #[error("--hpc-job-mapping-dir {}: cannot read the directory: {cause}", dir.display())]
    DirUnreadable {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        cause: String,
    },
    /// The file cannot be read.
    #[error("{}: cannot read: {cause}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: String,
    },
    /// The file is a symbolic link (never followed here).
    #[error("{}: is a symbolic link; not followed (a mapping file must be a regular file)", path.display())]
    Symlink {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a regular file (a FIFO, a device, a directory).
    #[error("{}: is {kind}, not a regular file", path.display())]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("{}: larger than {limit} bytes; not a job mapping file", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit.
        limit: u64,
    },
    /// The file is not UTF-8 text.
    #[error("{}:{line}: not UTF-8 text", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
    },
    /// A job id contains a control character.
    #[error("{}:{line}: the job id contains a control character", path.display())]
    BadLine {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
    },
    /// The file lists more than [`MAX_JOBS`] distinct jobs.
    #[error("{}: more than {limit} job ids", path.display())]
    TooManyJobs {
        /// The file.
        path: PathBuf,
        /// The limit.
        limit: usize,
    },
}

impl HpcError {
    /// Every `reason` label value, for pre-initialised counters.
    pub const REASONS: &'static [&'static str] = &[
        "bad_line",
        "dir_unreadable",
        "not_regular",
        "not_utf8",
        "symlink",
        "too_large",
        "too_many_jobs",
        "unreadable",
    ];

    /// The `reason` label for `gpu_exporter_hpc_job_file_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            HpcError::DirUnreadable { .. } => "dir_unreadable",
            HpcError::Unreadable { .. } => "unreadable",
            HpcError::Symlink { .. } => "symlink",
            HpcError::NotRegular { .. } => "not_regular",
            HpcError::TooLarge { .. } => "too_large",
            HpcError::NotUtf8 { .. } => "not_utf8",
            HpcError::BadLine { .. } => "bad_line",
            HpcError::TooManyJobs { .. } => "too_many_jobs",
        }
    }
}

/// What the directory says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HpcJobs {
    /// Job ids per GPU or MIG instance (entities with an empty file are absent).
    pub jobs: BTreeMap<EntityKey, Vec<String>>,
    /// Mapping files read successfully (empty ones included).
    pub files: usize,
    /// Files (or the directory) not used, and why, sorted.
    pub errors: Vec<HpcError>,
    /// Directory entries not read, by reason ([`Ignored::REASONS`]); at most [`MAX_LISTED`]
    /// entries are looked at.
    pub ignored: BTreeMap<&'static str, usize>,
}

/// Why a directory entry is not read.
#[derive(Debug)]
pub struct Ignored;

impl Ignored {
    /// A `<gpu>` or `<gpu>.<gi>` name for a GPU or MIG instance that does not exist here.
    pub const NO_SUCH_GPU: &'static str = "no_such_gpu";
    /// Not a mapping file name (editor and temporary files, other names).
    pub const NOT_A_MAPPING_NAME: &'static str = "not_a_mapping_name";
    /// Every reason, for pre-initialised gauges.
    pub const REASONS: &'static [&'static str] = &[Self::NO_SUCH_GPU, Self::NOT_A_MAPPING_NAME];
}

/// The GPUs and MIG instances that exist in `devices`: the only mapping files read.
pub fn entities(devices: &[Device]) -> BTreeSet<EntityKey> {
    let mut out = BTreeSet::new();
    for d in devices {
        out.insert(EntityKey {
            gpu: d.identity.index,
            gi_id: None,
        });
        for i in &d.instances {
            out.insert(EntityKey {
                gpu: d.identity.index,
                gi_id: Some(i.gi_id),
            });
        }
    }
    out
}

/// The file name for an entity: `<gpu>` or `<gpu>.<gi>`.
pub fn file_name(key: EntityKey) -> String {
    match key.gi_id {
        Some(gi) => format!("{}.{gi}", key.gpu),
        None => key.gpu.to_string(),
    }
}

/// The entity a mapping file is for: `<gpu>` or `<gpu>.<gpu instance id>`, decimal, without
/// leading zeros. `None` for any other name.
pub fn entity_of(file_name: &str) -> Option<EntityKey> {
    let number = |s: &str| -> Option<u32> {
        let canonical = !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        canonical.then(|| s.parse().ok()).flatten()
    };
    match file_name.split_once('.') {
        Some((gpu, gi)) => Some(EntityKey {
            gpu: number(gpu)?,
            gi_id: Some(number(gi)?),
        }),
        None => Some(EntityKey {
            gpu: number(file_name)?,
            gi_id: None,
        }),
    }
}

/// Parses the contents of the mapping file at `path` (named in errors) into job ids.
///
/// # Errors
/// [`HpcError::NotUtf8`], [`HpcError::BadLine`] or [`HpcError::TooManyJobs`].
pub fn parse_jobs(bytes: &[u8], path: &Path) -> Result<Vec<String>, HpcError> {
    let line_at = |offset: usize| bytes[..offset].iter().filter(|&&b| b == b'\n').count() + 1;
    let text = std::str::from_utf8(bytes).map_err(|e| HpcError::NotUtf8 {
        path: path.to_owned(),
        line: line_at(e.valid_up_to()),
    })?;
    let mut jobs: Vec<String> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let job = line.trim();
        if job.is_empty() || jobs.iter().any(|j| j == job) {
            continue;
        }
        if job.chars().any(char::is_control) {
            return Err(HpcError::BadLine {
                path: path.to_owned(),
                line: i + 1,
            });
        }
        if jobs.len() == MAX_JOBS {
            return Err(HpcError::TooManyJobs {
                path: path.to_owned(),
                limit: MAX_JOBS,
            });
        }
        jobs.push(job.to_owned());
    }
    Ok(jobs)
}

/// Reads the mapping files of the `monitored` GPUs and MIG instances in `dir`, and counts the
/// directory's other entries. Blocking (file system calls).
pub fn scan(dir: &Path, monitored: &BTreeSet<EntityKey>) -> HpcJobs {
    let mut out = HpcJobs::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            out.errors.push(HpcError::DirUnreadable {
                dir: dir.to_owned(),
                cause: e.to_string(),
            });
            return out;
        }
    };
    for entry in entries.flatten().take(MAX_LISTED) {
        let name = entry.file_name();
        let reason = match name.to_str().and_then(entity_of) {
            Some(key) if monitored.contains(&key) => continue,
            Some(_) => Ignored::NO_SUCH_GPU,
            None => Ignored::NOT_A_MAPPING_NAME,
        };
        *out.ignored.entry(reason).or_default() += 1;
    }
    for &key in monitored {
        let path = dir.join(file_name(key));
        match read_file(&path).and_then(|bytes| parse_jobs(&bytes, &path).map_err(Some)) {
            Ok(jobs) => {
                out.files += 1;
                if !jobs.is_empty() {
                    out.jobs.insert(key, jobs);
                }
            }
            // No file: no job on that GPU.
            Err(None) => {}
            Err(Some(e)) => out.errors.push(e),
        }
    }
    out.errors.sort();
    out
}

/// The file's bytes; `Err(None)` if there is no such file.
fn read_file(path: &Path) -> Result<Vec<u8>, Option<HpcError>> {
    fsread::read(path, Cap::HPC_JOB_FILE, Symlinks::Refuse).map_err(|e| match e {
        ReadError::NotFound { .. } => None,
        ReadError::Symlink { path } => Some(HpcError::Symlink { path }),
        ReadError::NotRegular { path, kind } => Some(HpcError::NotRegular { path, kind }),
        ReadError::TooLarge { path, limit } => Some(HpcError::TooLarge { path, limit }),
        e => Some(HpcError::Unreadable {
            path: e.path().to_owned(),
            cause: crate::error_chain(&e),
        }),
    })
}

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

/// The HPC job mapping's own series, `gpu_exporter_hpc_job_*`: updated by [`HpcWatcher`],
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(gpu: u32, gi_id: Option<u32>) -> EntityKey {
        EntityKey { gpu, gi_id }
    }

    fn p() -> PathBuf {
        PathBuf::from("/run/hpc/3")
    }

    #[test]
    fn file_names_are_gpu_indices_or_gpu_dot_instance() {
        assert_eq!(entity_of("0"), Some(key(0, None)));
        assert_eq!(entity_of("12"), Some(key(12, None)));
        assert_eq!(entity_of("2.0"), Some(key(2, Some(0))));
        assert_eq!(entity_of("3.10"), Some(key(3, Some(10))));
        for bad in [
            "",
            ".",
            "1.",
            ".1",
            "01",
            "1.02",
            "1.2.3",
            "a",
            "1a",
            "-1",
            "+1",
            " 1",
            "1 ",
            "0x1",
            "1.tmp",
            ".1.swp",
            "99999999999",
        ] {
            assert_eq!(entity_of(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn good_files_give_their_job_ids_trimmed_and_once() {
        let text = b"1001\n  1002\t\r\n\n1001\njob_7+0\r\n";
        assert_eq!(parse_jobs(text, &p()).unwrap(), ["1001", "1002", "job_7+0"]);
        // No final newline, and Unicode are fine.
        assert_eq!(
            parse_jobs("a\nb\u{e9}".as_bytes(), &p()).unwrap(),
            ["a", "b\u{e9}"]
        );
    }

    #[test]
    fn empty_files_mean_no_job() {
        assert!(parse_jobs(b"", &p()).unwrap().is_empty());
        assert!(parse_jobs(b"\n \n\r\n", &p()).unwrap().is_empty());
    }

    #[test]
    fn bad_files_are_errors_naming_file_and_line() {
        let e = parse_jobs(b"1\n2\n\xff\xfe\n", &p()).unwrap_err();
        assert_eq!(e.to_string(), "/run/hpc/3:3: not UTF-8 text");
        assert_eq!(e.reason(), "not_utf8");
        let e = parse_jobs(b"1\nab\x07c\n", &p()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/run/hpc/3:2: the job id contains a control character"
        );
        assert_eq!(e.reason(), "bad_line");
        let many: String = (0..=MAX_JOBS).map(|i| format!("{i}\n")).collect();
        let e = parse_jobs(many.as_bytes(), &p()).unwrap_err();
        assert_eq!(e.to_string(), "/run/hpc/3: more than 64 job ids");
        // Repeats do not count towards the limit.
        let repeated = "7\n".repeat(MAX_JOBS * 2);
        assert_eq!(parse_jobs(repeated.as_bytes(), &p()).unwrap(), ["7"]);
    }

    #[test]
    fn a_directory_scan_uses_good_files_and_reports_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("0"), "101\n102\n").unwrap();
        std::fs::write(d.join("1.3"), "mig-job\n").unwrap();
        std::fs::write(d.join("2"), "").unwrap();
        std::fs::write(d.join("3"), b"\xff").unwrap();
        std::fs::write(d.join("4"), "x".repeat(MAX_FILE_BYTES as usize + 1)).unwrap();
        std::fs::write(d.join("README"), "not a mapping").unwrap();
        std::fs::write(d.join("5.swp"), b"\xff").unwrap();
        std::fs::create_dir(d.join("6")).unwrap();
        // A link to a secret: never followed, its contents never published.
        std::fs::write(d.join("tls.key"), "-----BEGIN PRIVATE KEY-----\nsecret\n").unwrap();
        std::os::unix::fs::symlink(d.join("tls.key"), d.join("7")).unwrap();
        // A FIFO: never opened for reading (it would block the watcher).
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.join("8"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // Files for GPUs and instances that do not exist here: not read, counted.
        std::fs::write(d.join("42"), "ghost\n").unwrap();
        std::fs::write(d.join("1.9"), "ghost\n").unwrap();
        let monitored: BTreeSet<EntityKey> = [
            key(0, None),
            key(1, None),
            key(1, Some(3)),
            key(2, None),
            key(3, None),
            key(4, None),
            key(6, None),
            key(7, None),
            key(8, None),
            key(9, None),
        ]
        .into();
        let s = scan(d, &monitored);
        assert_eq!(
            s.jobs,
            BTreeMap::from([
                (key(0, None), vec!["101".to_owned(), "102".to_owned()]),
                (key(1, Some(3)), vec!["mig-job".to_owned()]),
            ])
        );
        assert_eq!(s.files, 3);
        let reasons: Vec<&str> = s.errors.iter().map(HpcError::reason).collect();
        assert_eq!(
            reasons,
            [
                "symlink",
                "not_regular",
                "not_regular",
                "too_large",
                "not_utf8"
            ],
            "{:?}",
            s.errors
        );
        assert!(
            s.errors[0].to_string().ends_with(
                "/7: is a symbolic link; not followed (a mapping file must be a regular file)"
            ),
            "{}",
            s.errors[0]
        );
        assert!(s.errors.iter().any(|e| e
            .to_string()
            .ends_with("/8: is a FIFO (named pipe), not a regular file")));
        assert!(s.errors.iter().any(|e| e
            .to_string()
            .ends_with("/6: is a directory, not a regular file")));
        assert!(s.errors[4].to_string().ends_with("/3:1: not UTF-8 text"));
        assert_eq!(
            s.ignored,
            BTreeMap::from([(Ignored::NO_SUCH_GPU, 2), (Ignored::NOT_A_MAPPING_NAME, 3)])
        );

        let gone = scan(&d.join("missing"), &monitored);
        assert!(gone.jobs.is_empty());
        assert_eq!(gone.errors.len(), 1);
        assert_eq!(gone.errors[0].reason(), "dir_unreadable");
        assert!(gone.errors[0]
            .to_string()
            .starts_with("--hpc-job-mapping-dir "));
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
