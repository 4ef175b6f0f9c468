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
//! A file that cannot be used (unreadable, not UTF-8, larger than [`MAX_FILE_BYTES`], more than
//! [`MAX_JOBS`] jobs, a control character in a job id) is logged once with its path (and line),
//! counted, and ignored: its GPU gets no `hpc_job` label, every other file and series is
//! unaffected. A missing directory is logged once and means no jobs until it appears.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::pods::{Answered, EntityKey};
use crate::self_metrics::SelfMetrics;

/// Largest mapping file read, bytes.
pub const MAX_FILE_BYTES: u64 = 64 * 1024;
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
        "not_utf8",
        "too_large",
        "too_many_jobs",
        "unreadable",
    ];

    /// The `reason` label for `gpu_exporter_hpc_job_file_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            HpcError::DirUnreadable { .. } => "dir_unreadable",
            HpcError::Unreadable { .. } => "unreadable",
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

/// Reads the mapping directory. Blocking (file system calls).
pub fn scan(dir: &Path) -> HpcJobs {
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
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(key) = name.to_str().and_then(entity_of) else {
            tracing::debug!(file = ?name, "not an HPC job mapping file name (<gpu> or <gpu>.<gi>); skipped");
            continue;
        };
        let path = entry.path();
        // Follows symbolic links; only regular files are opened (a FIFO would block).
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => {}
            Ok(_) => continue,
            Err(e) => {
                out.errors.push(HpcError::Unreadable {
                    path,
                    cause: e.to_string(),
                });
                continue;
            }
        }
        match read_file(&path).and_then(|bytes| parse_jobs(&bytes, &path)) {
            Ok(jobs) => {
                out.files += 1;
                if !jobs.is_empty() {
                    out.jobs.insert(key, jobs);
                }
            }
            Err(e) => out.errors.push(e),
        }
    }
    out.errors.sort();
    out
}

fn read_file(path: &Path) -> Result<Vec<u8>, HpcError> {
    let unreadable = |e: std::io::Error| HpcError::Unreadable {
        path: path.to_owned(),
        cause: e.to_string(),
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(HpcError::TooLarge {
            path: path.to_owned(),
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(bytes)
}

/// The task that reads the directory on its cadence and publishes what changed.
#[derive(Debug)]
pub struct HpcWatcher {
    dir: PathBuf,
    metrics: Arc<SelfMetrics>,
    /// The problems of the last scan (each is logged and counted when it first appears).
    problems: Vec<HpcError>,
    answered: watch::Sender<Answered>,
}

impl HpcWatcher {
    /// Watches `dir`. Turns on the `gpu_exporter_hpc_job_*` families.
    pub fn new(dir: PathBuf, metrics: Arc<SelfMetrics>) -> Self {
        metrics.hpc_jobs.enable();
        Self {
            dir,
            metrics,
            problems: Vec::new(),
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
            self.metrics.hpc_jobs.count_error(e.reason());
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
        let bad = scanned
            .errors
            .iter()
            .filter(|e| !matches!(e, HpcError::DirUnreadable { .. }))
            .count();
        self.metrics.hpc_jobs.record_scan(scanned.files, bad);
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
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let dir = self.dir.clone();
            let scanned = match tokio::task::spawn_blocking(move || scan(&dir)).await {
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
        let s = scan(d);
        assert_eq!(
            s.jobs,
            BTreeMap::from([
                (key(0, None), vec!["101".to_owned(), "102".to_owned()]),
                (key(1, Some(3)), vec!["mig-job".to_owned()]),
            ])
        );
        assert_eq!(s.files, 3);
        let reasons: Vec<&str> = s.errors.iter().map(HpcError::reason).collect();
        assert_eq!(reasons, ["too_large", "not_utf8"], "{:?}", s.errors);
        assert!(s.errors[1].to_string().ends_with("/3:1: not UTF-8 text"));

        let gone = scan(&d.join("missing"));
        assert!(gone.jobs.is_empty());
        assert_eq!(gone.errors.len(), 1);
        assert_eq!(gone.errors[0].reason(), "dir_unreadable");
        assert!(gone.errors[0]
            .to_string()
            .starts_with("--hpc-job-mapping-dir "));
    }

    #[test]
    fn problems_are_counted_once_and_only_changes_are_published() {
        let metrics = Arc::new(SelfMetrics::default());
        let mut w = HpcWatcher::new("/run/hpc".into(), Arc::clone(&metrics));
        let (tx, rx) = watch::channel(Arc::new(HpcJobs::default()));
        let bad = HpcError::BadLine {
            path: "/run/hpc/1".into(),
            line: 1,
        };
        let scanned = HpcJobs {
            jobs: BTreeMap::from([(key(0, None), vec!["j".to_owned()])]),
            files: 1,
            errors: vec![bad.clone()],
        };
        assert!(w.apply(scanned.clone(), &tx));
        assert_eq!(rx.borrow().jobs.len(), 1);
        // The same again: nothing new to publish or count.
        assert!(!w.apply(scanned, &tx));
        let st = metrics.hpc_jobs.state();
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
        let st = metrics.hpc_jobs.state();
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
        assert_eq!(metrics.hpc_jobs.state().errors.get("bad_line"), Some(&2));
    }
}
