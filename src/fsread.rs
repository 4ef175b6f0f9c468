//! The one bounded file reader: every file gpu-exporter reads (the metrics CSV, the web
//! config and its certificates, the HPC job mapping files, `/proc/<pid>/cgroup`, the simulator's
//! files, the `--config-file` YAML) goes through [`read`] or [`read_text`].
//!
//! - **Regular files only.** The file is opened with `O_NONBLOCK` (so opening a FIFO does not
//!   wait for a writer) and `fstat`ed before anything is read: a FIFO, a device (`/dev/zero`), a
//!   socket or a directory is refused, naming what it is. The check is on the opened descriptor,
//!   so the file cannot be swapped between check and read.
//! - **A size cap per kind of file** ([`Cap`]): at most the cap plus one byte is ever read, so a
//!   huge or growing file costs at most its cap in memory, whatever its size claims (files in
//!   `/proc` claim 0 bytes).
//! - **Symbolic links** are followed where Kubernetes needs them (a ConfigMap or Secret volume
//!   is a tree of `..data` links: the metrics CSV, the web config and its certificates) and
//!   refused where they are not expected ([`Symlinks::Refuse`]: a link in the HPC job mapping
//!   directory could publish any file the exporter can read, such as a TLS key).
//!
//! Errors name the path and say why.

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The largest file of each kind read, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// The metrics CSV (`-f`/`--collectors`): upstream's largest is under 20 KiB; every DCGM
    /// field with a long help text is under 100 KiB.
    pub const METRICS_CSV: Cap = Cap(1 << 20);
    /// dcgm-exporter's YAML configuration file (`--config-file`): a few hundred bytes; inline
    /// `metrics.fields` as large as a metrics CSV.
    pub const CONFIG_FILE: Cap = Cap(1 << 20);
    /// The web config YAML (`--web-config-file`).
    pub const WEB_CONFIG: Cap = Cap(1 << 20);
    /// A PEM file of the web config (certificate chain, key, client CA bundle).
    pub const PEM: Cap = Cap(1 << 20);
    /// One HPC job mapping file (64 job ids of up to 1 KiB).
    pub const HPC_JOB_FILE: Cap = Cap(64 << 10);
    /// `/proc/<pid>/cgroup` (a few lines; cgroup v1 hosts list a dozen controllers).
    pub const PROC_CGROUP: Cap = Cap(64 << 10);
    /// The simulator's scenario and fake-kubelet assignment files (tests and demos).
    pub const SIMULATOR: Cap = Cap(16 << 20);

    /// The cap in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// What to do when the path is a symbolic link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    /// Read what it points to (ConfigMap and Secret mounts are links).
    Follow,
    /// Refuse it (the last component of the path must not be a link).
    Refuse,
}

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// No such file.
    #[error("{}: no such file", path.display())]
    NotFound {
        /// The path.
        path: PathBuf,
    },
    /// No permission to open it.
    #[error("{}: permission denied", path.display())]
    PermissionDenied {
        /// The path.
        path: PathBuf,
    },
    /// It is a symbolic link where none is expected.
    #[error("{}: is a symbolic link; refused (only regular files are read here)", path.display())]
    Symlink {
        /// The path.
        path: PathBuf,
    },
    /// It is not a regular file.
    #[error("{}: is {kind}, not a regular file; refused", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is ("a FIFO (named pipe)", "a character device", ...).
        kind: &'static str,
    },
    /// It is larger than the cap for its kind.
    #[error("{}: larger than {limit} bytes; refused", path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// The cap.
        limit: u64,
    },
    /// It is not UTF-8 text ([`read_text`]).
    #[error("{}:{line}: not UTF-8 text", path.display())]
    NotUtf8 {
        /// The path.
        path: PathBuf,
        /// 1-based line of the first invalid byte.
        line: usize,
    },
    /// Another I/O error (the cause is in the message, so that a wrapping error can show this
    /// one whole).
    #[error("{}: cannot read: {cause}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        cause: io::Error,
    },
}

impl ReadError {
    /// A short `reason` label for self-metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ReadError::NotFound { .. } => "not_found",
            ReadError::PermissionDenied { .. } => "permission_denied",
            ReadError::Symlink { .. } => "symlink",
            ReadError::NotRegular { .. } => "not_regular",
            ReadError::TooLarge { .. } => "too_large",
            ReadError::NotUtf8 { .. } => "not_utf8",
            ReadError::Io { .. } => "unreadable",
        }
    }

    /// The path.
    pub fn path(&self) -> &Path {
        match self {
            ReadError::NotFound { path }
            | ReadError::PermissionDenied { path }
            | ReadError::Symlink { path }
            | ReadError::NotRegular { path, .. }
            | ReadError::TooLarge { path, .. }
            | ReadError::NotUtf8 { path, .. }
            | ReadError::Io { path, .. } => path,
        }
    }
}

fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Reads the regular file at `path`, at most `cap` bytes. Blocking, but never on the file's
/// other end: a FIFO or device is refused before any read.
///
/// # Errors
/// A [`ReadError`] naming the path.
pub fn read(path: &Path, cap: Cap, symlinks: Symlinks) -> Result<Vec<u8>, ReadError> {
    let mut flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
    if symlinks == Symlinks::Refuse {
        flags |= rustix::fs::OFlags::NOFOLLOW;
    }
    let io_error = |source: io::Error| match source.kind() {
        io::ErrorKind::NotFound => ReadError::NotFound {
            path: path.to_owned(),
        },
        io::ErrorKind::PermissionDenied => ReadError::PermissionDenied {
            path: path.to_owned(),
        },
        _ => ReadError::Io {
            path: path.to_owned(),
            cause: source,
        },
    };
    #[allow(clippy::cast_possible_wrap)]
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
        .map_err(|e| {
            // O_NOFOLLOW on a link: ELOOP.
            if symlinks == Symlinks::Refuse
                && e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
            {
                ReadError::Symlink {
                    path: path.to_owned(),
                }
            } else {
                io_error(e)
            }
        })?;
    let meta = file.metadata().map_err(io_error)?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular {
            path: path.to_owned(),
            kind: kind_of(meta.file_type()),
        });
    }
    let too_large = || ReadError::TooLarge {
        path: path.to_owned(),
        limit: cap.0,
    };
    if meta.len() > cap.0 {
        return Err(too_large());
    }
    // `/proc` files claim 0 bytes: the length only sizes the first allocation.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).saturating_add(1));
    file.take(cap.0.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io_error)?;
    if bytes.len() as u64 > cap.0 {
        return Err(too_large());
    }
    Ok(bytes)
}

/// [`read`], as UTF-8 text. A UTF-8 byte-order mark is kept (the caller decides).
///
/// # Errors
/// A [`ReadError`] naming the path; [`ReadError::NotUtf8`] with the line of the first bad byte.
pub fn read_text(path: &Path, cap: Cap, symlinks: Symlinks) -> Result<String, ReadError> {
    let bytes = read(path, cap, symlinks)?;
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let valid = e.utf8_error().valid_up_to();
        ReadError::NotUtf8 {
            path: path.to_owned(),
            line: bytes[..valid].iter().filter(|&&b| b == b'\n').count() + 1,
        }
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A named pipe at `path` (also for other modules' tests of what the reader refuses).
    pub(crate) fn fifo(path: &Path) {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
    }

    #[test]
    fn regular_files_are_read_up_to_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "abc").unwrap();
        assert_eq!(read(&p, Cap(3), Symlinks::Refuse).unwrap(), b"abc");
        let e = read(&p, Cap(2), Symlinks::Refuse).unwrap_err();
        assert_eq!(e.reason(), "too_large");
        assert_eq!(
            e.to_string(),
            format!("{}: larger than 2 bytes; refused", p.display())
        );
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pipe");
        fifo(&p);
        // Without O_NONBLOCK this open would wait for a writer for ever.
        let e = read(&p, Cap::METRICS_CSV, Symlinks::Follow).unwrap_err();
        assert_eq!(e.reason(), "not_regular");
        assert!(
            e.to_string()
                .ends_with("pipe: is a FIFO (named pipe), not a regular file; refused"),
            "{e}"
        );
    }

    #[test]
    fn devices_and_directories_are_refused() {
        let e = read(Path::new("/dev/zero"), Cap::METRICS_CSV, Symlinks::Follow).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/zero: is a character device, not a regular file; refused"
        );
        let dir = tempfile::tempdir().unwrap();
        let e = read(dir.path(), Cap::METRICS_CSV, Symlinks::Follow).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("is a directory, not a regular file; refused"),
            "{e}"
        );
        let e = read(&dir.path().join("nope"), Cap::METRICS_CSV, Symlinks::Follow).unwrap_err();
        assert_eq!(e.reason(), "not_found");
    }

    #[test]
    fn links_are_followed_or_refused_as_asked() {
        // A ConfigMap mount: counters.csv -> ..data/counters.csv, ..data -> ..2024_01_01.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("..2024_01_01")).unwrap();
        std::fs::write(d.join("..2024_01_01/counters.csv"), "x\n").unwrap();
        std::os::unix::fs::symlink("..2024_01_01", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/counters.csv", d.join("counters.csv")).unwrap();
        let p = d.join("counters.csv");
        assert_eq!(
            read(&p, Cap::METRICS_CSV, Symlinks::Follow).unwrap(),
            b"x\n"
        );
        let e = read(&p, Cap::METRICS_CSV, Symlinks::Refuse).unwrap_err();
        assert_eq!(e.reason(), "symlink");
        assert!(
            e.to_string().ends_with(
                "counters.csv: is a symbolic link; refused (only regular files are read here)"
            ),
            "{e}"
        );
        // A link to a device is refused as the device, even when links are followed.
        std::os::unix::fs::symlink("/dev/zero", d.join("zero")).unwrap();
        let e = read(&d.join("zero"), Cap::METRICS_CSV, Symlinks::Follow).unwrap_err();
        assert_eq!(e.reason(), "not_regular");
    }

    #[test]
    fn proc_files_that_claim_no_size_are_still_capped() {
        // /proc/self/status claims 0 bytes but has about 1.5 KiB.
        let p = Path::new("/proc/self/status");
        assert!(std::fs::metadata(p).unwrap().len() == 0);
        assert!(read_text(p, Cap::PROC_CGROUP, Symlinks::Follow)
            .unwrap()
            .contains("VmRSS"));
        assert_eq!(
            read(p, Cap(16), Symlinks::Follow).unwrap_err().reason(),
            "too_large"
        );
    }

    #[test]
    fn text_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, b"ok\nok\nbad \xff\n").unwrap();
        let e = read_text(&p, Cap(100), Symlinks::Refuse).unwrap_err();
        assert_eq!(e.to_string(), format!("{}:3: not UTF-8 text", p.display()));
    }
}
