//! What a `--config-file` yields once checked: [`FileSettings`], and [`FileError`].

use std::path::PathBuf;

use crate::fsread::ReadError;

/// An unusable configuration file; names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read: missing, not a regular file (a FIFO, a device), larger than
    /// [`Cap::CONFIG_FILE`](crate::fsread::Cap::CONFIG_FILE), not UTF-8 (with the line). The
    /// message names the path and why, as for the metrics CSV and the web config.
    #[error("config file {0}")]
    Read(ReadError),
    /// The YAML is nested deeper than [`crate::yamldepth::MAX_DEPTH`] levels (checked before it
    /// is parsed: parsing takes time quadratic in the depth).
    #[error("{path}:{line}: nested more than {limit} levels deep; refused")]
    TooDeep {
        /// The file.
        path: String,
        /// 1-based line where the limit is passed.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// The YAML does not parse or does not fit the schema (the message names key and line).
    #[error("{path}: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// What the YAML parser says.
        message: String,
    },
    /// A key's value is unusable.
    #[error("{path}: {key}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// The key, as a path (`collections[1].every`).
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// Where the metrics come from, per the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricSource {
    /// `metrics.file`: a CSV path.
    File(PathBuf),
    /// `metrics.fields`: inline rows, as CSV text (row N is `metrics.fields[N-1]`).
    Inline(String),
}

/// What the file sets that gpu-exporter applies, and notes on what it does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileSettings {
    /// `metrics.file` / `metrics.fields`.
    pub metrics: Option<MetricSource>,
    /// `metrics.enableExporterMetrics`.
    pub enable_exporter_metrics: Option<bool>,
    /// `server.maxConcurrentScrapes`.
    pub max_concurrent_scrapes: Option<u32>,
    /// The default cadence, ms.
    pub interval_ms: Option<u64>,
    /// One line for each key that has no effect here.
    pub notices: Vec<String>,
}
