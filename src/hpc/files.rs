//! The mapping files and their directory: which names are read (one per GPU or MIG instance
//! that exists here), what a file may hold, and one scan of the directory (blocking). Why a
//! file is not used is an [`HpcError`] naming its path (and line). See [`crate::hpc`] for the
//! format.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::fsread::{self, Cap, ReadError, Symlinks};
use crate::gpu::Device;
use crate::pods::EntityKey;

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
}
