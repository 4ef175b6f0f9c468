//! What a metrics CSV holds once parsed: the [`Catalog`] of rows, the rows skipped, and what can
//! be wrong with one ([`Defect`], [`CatalogError`]).

use crate::fsread::ReadError;

use super::field::Field;

/// How a CSV row is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// `# TYPE name gauge`.
    Gauge,
    /// `# TYPE name counter` (the name is kept verbatim: no `_total` is added).
    Counter,
    /// Not a series: the value becomes a label named after the field on every series.
    Label,
}

impl MetricType {
    /// The word used on the `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Gauge => "gauge",
            MetricType::Counter => "counter",
            MetricType::Label => "label",
        }
    }
}

/// One CSV row.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSpec {
    /// The metric (or label) name, verbatim from the CSV.
    pub name: String,
    /// The field it reads.
    pub field: Field,
    /// How it is exported.
    pub kind: MetricType,
    /// The help text, verbatim.
    pub help: String,
    /// 1-based line in the CSV.
    pub line: u64,
}

/// The parsed metrics configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalog {
    /// Numeric rows, in file order.
    pub metrics: Vec<MetricSpec>,
    /// `label` rows, sorted by name.
    pub labels: Vec<MetricSpec>,
}

/// A row that is skipped with a warning: it names a DCGM field that gpu-exporter does not
/// collect, or it repeats an earlier row with the same name and type (dcgm-exporter's own
/// `1.x-compatibility-metrics.csv` lists `dcgm_fi_prof_pcie_tx_bytes` twice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// 1-based line.
    pub line: u64,
    /// The field name as written.
    pub name: String,
    /// Its DCGM id.
    pub id: u16,
    /// For a repeated row, the line of the row that is kept.
    pub duplicate_of: Option<u64>,
}

impl std::fmt::Display for Skipped {
    /// The warning, after `file:line: `.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.duplicate_of {
            Some(first) => write!(
                f,
                "skipping {}: it repeats line {first} with the same type; the first row is kept",
                self.name
            ),
            None => write!(
                f,
                "skipping {} (DCGM field {}): gpu-exporter does not collect it",
                self.name, self.id
            ),
        }
    }
}

/// What is wrong with a CSV row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Defect {
    /// The CSV reader could not tokenise the row (e.g. an unterminated quote).
    Syntax(String),
    /// Not exactly three columns.
    ColumnCount(usize),
    /// The first column is empty.
    EmptyName,
    /// The type column is not gauge, counter or label.
    BadType(String),
    /// Not a DCGM or exporter field name.
    UnknownField(String),
    /// The same name twice.
    Duplicate {
        /// The repeated name.
        name: String,
        /// Where it first appeared.
        first_line: u64,
    },
    /// A string field with a numeric type.
    TextAsNumber(String),
    /// A `DCGM_EXP_*` field with type `label`.
    ExporterAsLabel(String),
}

/// Errors loading the metrics catalog.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The file could not be read: missing, not a regular file (a FIFO, a device), larger
    /// than [`Cap::METRICS_CSV`](crate::fsread::Cap::METRICS_CSV), not UTF-8 (with the line).
    #[error("metrics CSV {0}")]
    Read(ReadError),
    /// No row is a metric: the file is empty, or has only comments, labels or skipped rows.
    /// Serving it would drop every GPU series, so it is refused (at startup and on reload).
    #[error("{origin}: lists no metric (empty, or only comments, label rows and skipped fields); refused, as it would drop every GPU series")]
    Empty {
        /// The file (or other origin) name.
        origin: String,
    },
    /// Every metric row names a field the GPU backend cannot read.
    #[error("{origin}: none of its metrics can be read by the {backend} backend; refused, as it would drop every GPU series")]
    NoneSupported {
        /// The file (or other origin) name.
        origin: String,
        /// The backend's name.
        backend: String,
    },
    /// A row is defective.
    #[error("{origin}:{line}: {defect}")]
    Invalid {
        /// The file (or other origin) name.
        origin: String,
        /// 1-based line.
        line: u64,
        /// What is wrong.
        defect: Defect,
    },
}

impl Catalog {
    /// Every field the catalog needs a source to read (metrics and labels), deduplicated.
    pub fn fields(&self) -> Vec<Field> {
        let mut v: Vec<Field> = self
            .metrics
            .iter()
            .chain(&self.labels)
            .map(|m| m.field)
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Drops rows whose field `supported` rejects, returning them (for one warning each).
    pub fn retain_supported(&mut self, supported: impl Fn(Field) -> bool) -> Vec<MetricSpec> {
        let mut dropped = Vec::new();
        for list in [&mut self.metrics, &mut self.labels] {
            let (keep, drop): (Vec<_>, Vec<_>) = std::mem::take(list)
                .into_iter()
                .partition(|m| supported(m.field));
            *list = keep;
            dropped.extend(drop);
        }
        dropped.sort_by_key(|m| m.line);
        dropped
    }
}
