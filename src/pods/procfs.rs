//! [`ProcRoot`]: reads `/proc/<pid>/cgroup` under a configurable root (`--path.procfs`), the
//! only file of `/proc` gpu-exporter reads.
//!
//! NVML reports host PIDs (the driver does not know PID namespaces), so the root must be the
//! host's `/proc`: the default `/proc` with `hostPID: true`, or the host's `/proc` mounted
//! read-only elsewhere (`/host/proc` in the shipped DaemonSet). `/proc/<pid>/cgroup` is
//! world-readable, so no capability is needed.

use std::path::{Path, PathBuf};

use crate::fsread::{self, Cap, ReadError, Symlinks};

use super::cgroup::{self, CgroupOwner};

/// Why a process's cgroup could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// No such process under the root: it exited, or the root is not the host's `/proc`.
    #[error("{}: no such file (the process exited, or this is not the host's /proc)", path.display())]
    NotFound {
        /// The file.
        path: PathBuf,
    },
    /// The file may not be read (`hidepid` mount option, or a restrictive security profile).
    #[error("{}: permission denied", path.display())]
    PermissionDenied {
        /// The file.
        path: PathBuf,
    },
    /// Another I/O error, or not a regular file of at most [`Cap::PROC_CGROUP`] bytes (a FIFO
    /// or a device there is refused without waiting on it).
    #[error("{cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause (names the file).
        cause: ReadError,
    },
    /// The file is not in the `id:controllers:path` format.
    #[error("{}: not a cgroup file", path.display())]
    Unrecognised {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        cause: cgroup::Unrecognised,
    },
}

impl ProcError {
    /// The `reason` label of `gpu_exporter_process_attribution_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            ProcError::NotFound { .. } => "proc_not_found",
            ProcError::PermissionDenied { .. } => "proc_permission_denied",
            ProcError::Io { .. } => "proc_unreadable",
            ProcError::Unrecognised { .. } => "cgroup_unrecognised",
        }
    }
}

/// The host's `/proc`, wherever it is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcRoot {
    root: PathBuf,
}

impl ProcRoot {
    /// A reader of `<root>/<pid>/cgroup`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whose process `pid` is, from its cgroup file.
    ///
    /// # Errors
    /// A [`ProcError`] naming the file.
    pub fn owner(&self, pid: u32) -> Result<CgroupOwner, ProcError> {
        let path = self.root.join(pid.to_string()).join("cgroup");
        let text = match fsread::read_text(&path, Cap::PROC_CGROUP, Symlinks::Refuse) {
            Ok(t) => t,
            Err(ReadError::NotFound { .. }) => return Err(ProcError::NotFound { path }),
            Err(ReadError::PermissionDenied { .. }) => {
                return Err(ProcError::PermissionDenied { path })
            }
            Err(cause) => return Err(ProcError::Io { path, cause }),
        };
        cgroup::parse(&text).map_err(|cause| ProcError::Unrecognised { path, cause })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_classifies() {
        let dir = tempfile::tempdir().unwrap();
        let root = ProcRoot::new(dir.path());
        std::fs::create_dir(dir.path().join("42")).unwrap();
        std::fs::write(
            dir.path().join("42/cgroup"),
            "0::/system.slice/sshd.service\n",
        )
        .unwrap();
        assert_eq!(root.owner(42).unwrap(), CgroupOwner::OutsidePods);

        let e = root.owner(43).unwrap_err();
        assert_eq!(e.reason(), "proc_not_found");
        assert!(e.to_string().contains("/43/cgroup"), "{e}");

        std::fs::create_dir(dir.path().join("44")).unwrap();
        std::fs::write(dir.path().join("44/cgroup"), "garbage\n").unwrap();
        assert_eq!(root.owner(44).unwrap_err().reason(), "cgroup_unrecognised");

        // A directory where the file should be: an I/O error other than the two named ones.
        std::fs::create_dir_all(dir.path().join("45/cgroup")).unwrap();
        assert_eq!(root.owner(45).unwrap_err().reason(), "proc_unreadable");
    }

    #[test]
    fn fifos_devices_links_and_huge_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let root = ProcRoot::new(dir.path());
        let cgroup = |pid: u32| {
            std::fs::create_dir(dir.path().join(pid.to_string())).unwrap();
            dir.path().join(format!("{pid}/cgroup"))
        };
        // A FIFO: reading it would wait for a writer for ever, stopping the sampler.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            cgroup(50),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = root.owner(50).unwrap_err();
        assert_eq!(e.reason(), "proc_unreadable");
        assert!(
            e.to_string()
                .ends_with("is a FIFO (named pipe), not a regular file; refused"),
            "{e}"
        );
        // /dev/zero: reading it would grow memory without bound.
        std::os::unix::fs::symlink("/dev/zero", cgroup(51)).unwrap();
        assert!(root
            .owner(51)
            .unwrap_err()
            .to_string()
            .ends_with("is a symbolic link; refused (only regular files are read here)"));
        // A file over the cap.
        let line = "0::/kubepods.slice/x\n";
        std::fs::write(
            cgroup(52),
            line.repeat(Cap::PROC_CGROUP.bytes() as usize / line.len() + 1),
        )
        .unwrap();
        assert!(root
            .owner(52)
            .unwrap_err()
            .to_string()
            .ends_with("larger than 65536 bytes; refused"));
    }
}
