//! Pure parser for dcgm-exporter's metrics CSV: `DCGM field name, Prometheus type, help`.
//!
//! The format is dcgm-exporter's own (Go `encoding/csv` with `#` comments, fields trimmed,
//! exactly three columns; the records are read with the `csv` crate, in `gocsv`), so GPU
//! Operator ConfigMaps load unchanged. Rows naming a real DCGM field that gpu-exporter does not
//! collect are skipped and reported back, as dcgm-exporter skips profiling fields it cannot
//! watch; everything else that is wrong is an error naming the file, the 1-based line and the
//! reason.

use std::collections::HashMap;
use std::fmt;

use super::field::{self, ValueKind};
use super::gocsv;
use super::model::{Catalog, CatalogError, Defect, MetricSpec, MetricType, Skipped};

/// Parses CSV text. `origin` names the file in errors (usually its path).
///
/// A UTF-8 byte-order mark at the start (Windows editors write one) is ignored.
///
/// # Errors
/// [`CatalogError::Invalid`] for the first defective row, with its line number;
/// [`CatalogError::Empty`] if no row is a metric.
pub fn parse(text: &str, origin: &str) -> Result<(Catalog, Vec<Skipped>), CatalogError> {
    let invalid = |line: u64, defect: Defect| CatalogError::Invalid {
        origin: origin.to_owned(),
        line,
        defect,
    };
    let mut metrics = Vec::new();
    let mut labels = Vec::new();
    let mut skipped = Vec::new();
    let mut seen: HashMap<String, (u64, MetricType)> = HashMap::new();

    let records = gocsv::records(text).map_err(|(line, e)| invalid(line, Defect::Syntax(e)))?;
    for (line, record) in records {
        if record.len() != 3 {
            return Err(invalid(line, Defect::ColumnCount(record.len())));
        }
        let (name, kind, help) = (record[0].as_str(), record[1].as_str(), record[2].as_str());
        if name.is_empty() {
            return Err(invalid(line, Defect::EmptyName));
        }
        let kind = MetricType::from_csv(kind)
            .ok_or_else(|| invalid(line, Defect::BadType(kind.to_owned())))?;
        let dcgm = field::lookup(name)
            .ok_or_else(|| invalid(line, Defect::UnknownField(name.to_owned())))?;
        if let Some(&(first, first_kind)) = seen.get(name) {
            // The same row again is harmless (upstream's 1.x file has one); a row that
            // contradicts the first is a mistake.
            if first_kind != kind {
                return Err(invalid(
                    line,
                    Defect::Duplicate {
                        name: name.to_owned(),
                        first_line: first,
                    },
                ));
            }
            skipped.push(Skipped {
                line,
                name: name.to_owned(),
                id: dcgm.id,
                duplicate_of: Some(first),
            });
            continue;
        }
        seen.insert(name.to_owned(), (line, kind));

        let Some(field) = dcgm.field else {
            skipped.push(Skipped {
                line,
                name: name.to_owned(),
                id: dcgm.id,
                duplicate_of: None,
            });
            continue;
        };
        if field.kind() == ValueKind::Text && kind != MetricType::Label {
            return Err(invalid(line, Defect::TextAsNumber(name.to_owned())));
        }
        if field.is_exporter() && kind == MetricType::Label {
            return Err(invalid(line, Defect::ExporterAsLabel(name.to_owned())));
        }
        let spec = MetricSpec {
            name: name.to_owned(),
            field,
            kind,
            help: help.to_owned(),
            line,
        };
        if kind == MetricType::Label {
            labels.push(spec);
        } else {
            metrics.push(spec);
        }
    }
    if metrics.is_empty() {
        return Err(CatalogError::Empty {
            origin: origin.to_owned(),
        });
    }
    // dcgm-exporter's template ranges over a Go map of label fields, i.e. sorted by name.
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((Catalog { metrics, labels }, skipped))
}

impl MetricType {
    fn from_csv(s: &str) -> Option<MetricType> {
        match s {
            "gauge" => Some(MetricType::Gauge),
            "counter" => Some(MetricType::Counter),
            "label" => Some(MetricType::Label),
            _ => None,
        }
    }
}

impl fmt::Display for Defect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Defect::Syntax(e) => write!(f, "CSV syntax error: {e}"),
            Defect::ColumnCount(n) => write!(
                f,
                "expected 3 fields (DCGM field, type, help), found {n}; every row needs exactly two commas"
            ),
            Defect::EmptyName => f.write_str("empty field name"),
            Defect::BadType(t) => write!(
                f,
                "unknown metric type {t:?}; expected one of gauge, counter, label"
            ),
            Defect::UnknownField(n) => write!(
                f,
                "unknown field {n:?}: not a DCGM field name (DCGM 4.6-4.8 names, their deprecated aliases and dcgm-exporter's 1.x names are accepted) nor a DCGM_EXP_* exporter field"
            ),
            Defect::Duplicate { name, first_line } => write!(
                f,
                "duplicate field {name:?} with another type, first listed on line {first_line}"
            ),
            Defect::TextAsNumber(n) => {
                write!(f, "{n} is a string field; it can only be used with type `label`")
            }
            Defect::ExporterAsLabel(n) => {
                write!(f, "{n} is an exporter metric; it cannot be used with type `label`")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Field;

    fn ok(text: &str) -> (Catalog, Vec<Skipped>) {
        parse(text, "test.csv").unwrap()
    }

    fn err(text: &str) -> String {
        parse(text, "test.csv").unwrap_err().to_string()
    }

    #[test]
    fn parses_rows_comments_and_whitespace() {
        let (c, skipped) = ok("# Format\n# If line starts with a '#' it is considered a comment\n\n  DCGM_FI_DEV_SM_CLOCK ,  gauge, SM clock frequency (in MHz).\nDCGM_FI_DRIVER_VERSION, label, Driver Version\n");
        assert!(skipped.is_empty());
        assert_eq!(c.metrics.len(), 1);
        assert_eq!(c.metrics[0].name, "DCGM_FI_DEV_SM_CLOCK");
        assert_eq!(c.metrics[0].field, Field::SmClock);
        assert_eq!(c.metrics[0].help, "SM clock frequency (in MHz).");
        assert_eq!(c.metrics[0].line, 4);
        assert_eq!(c.labels[0].field, Field::DriverVersion);
    }

    #[test]
    fn a_byte_order_mark_is_ignored() {
        let (c, _) = ok("\u{feff}DCGM_FI_DEV_GPU_UTIL, gauge, u\n");
        assert_eq!(c.metrics[0].name, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(c.metrics[0].line, 1);
        let (c, _) = ok("\u{feff}# comment\nDCGM_FI_DEV_GPU_UTIL, gauge, u\n");
        assert_eq!(c.metrics[0].line, 2);
    }

    #[test]
    fn a_file_without_metrics_is_refused() {
        for text in [
            "",
            "\u{feff}",
            "\n\n",
            "# only comments\n",
            "DCGM_FI_DRIVER_VERSION, label, Driver Version\n",
            "DCGM_FI_DEV_VGPU_MEMORY_USAGE, gauge, uncollected\n",
        ] {
            assert_eq!(
                err(text),
                "test.csv: lists no metric (empty, or only comments, label rows and skipped fields); refused, as it would drop every GPU series",
                "{text:?}"
            );
        }
    }

    #[test]
    fn help_may_contain_quoted_commas() {
        let (c, _) = ok("DCGM_FI_DEV_GPU_UTIL, gauge, \"GPU utilization, in %\"\n");
        assert_eq!(c.metrics[0].help, "GPU utilization, in %");
    }

    #[test]
    fn canonical_names_are_accepted_and_kept_verbatim() {
        let (c, _) = ok("DCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge, temp\n");
        assert_eq!(c.metrics[0].field, Field::GpuTemp);
        assert_eq!(c.metrics[0].name, "DCGM_FI_DEV_GPU_TEMP_CELSIUS");
    }

    #[test]
    fn known_but_uncollected_field_is_skipped_with_its_line() {
        let (c, skipped) = ok(
            "DCGM_FI_DEV_GPU_UTIL, gauge, u\nDCGM_FI_DEV_VGPU_MEMORY_USAGE, gauge, vGPU memory\n",
        );
        assert_eq!(c.metrics.len(), 1);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].line, 2);
        assert_eq!(skipped[0].id, 525);
    }

    #[test]
    fn a_repeated_identical_row_is_skipped_with_the_line_it_repeats() {
        let (c, skipped) = ok("dcgm_fi_prof_pcie_tx_bytes, counter, a\nDCGM_FI_DEV_GPU_UTIL, gauge, u\ndcgm_fi_prof_pcie_tx_bytes, counter, b\n");
        assert_eq!(c.metrics.len(), 2);
        assert_eq!(c.metrics[0].help, "a");
        assert_eq!(skipped.len(), 1);
        assert_eq!((skipped[0].line, skipped[0].duplicate_of), (3, Some(1)));
        assert_eq!(
            skipped[0].to_string(),
            "skipping dcgm_fi_prof_pcie_tx_bytes: it repeats line 1 with the same type; the first row is kept"
        );
    }

    #[test]
    fn newer_and_1x_names_load_with_their_own_fields() {
        let (c, skipped) = ok("DCGM_FI_DEV_SM_CLOCK_HERTZ, gauge, Hz\nDCGM_FI_DEV_SM_CLOCK, gauge, MHz\ndcgm_gpu_utilization, gauge, pct\nDCGM_FI_DEV_GPU_UTIL_RATIO, gauge, ratio\nDCGM_FI_SYSTEM_DRIVER_VERSION, label, d\n");
        assert!(skipped.is_empty());
        let fields: Vec<Field> = c.metrics.iter().map(|m| m.field).collect();
        assert_eq!(
            fields,
            vec![
                Field::SmClockHertz,
                Field::SmClock,
                Field::GpuUtil,
                Field::GpuUtilRatio
            ]
        );
        assert_eq!(c.labels[0].name, "DCGM_FI_SYSTEM_DRIVER_VERSION");
        assert_eq!(c.labels[0].field, Field::DriverVersion);
    }

    #[test]
    fn each_defect_names_file_line_and_reason() {
        assert_eq!(
            err("DCGM_FI_DEV_GPU_UTIL, gauge\n"),
            "test.csv:1: expected 3 fields (DCGM field, type, help), found 2; every row needs exactly two commas"
        );
        assert!(err("# c\nDCGM_FI_DEV_GPU_UTIL, gauge, a, b\n")
            .starts_with("test.csv:2: expected 3 fields"));
        assert!(err("DCGM_FI_DEV_GPU_UTILS, gauge, x\n")
            .starts_with("test.csv:1: unknown field \"DCGM_FI_DEV_GPU_UTILS\""));
        assert!(err("DCGM_FI_DEV_GPU_UTIL, gaueg, x\n")
            .starts_with("test.csv:1: unknown metric type \"gaueg\""));
        assert_eq!(
            err("DCGM_FI_DEV_GPU_UTIL, gauge, x\n\nDCGM_FI_DEV_GPU_UTIL, counter, y\n"),
            "test.csv:3: duplicate field \"DCGM_FI_DEV_GPU_UTIL\" with another type, first listed on line 1"
        );
        assert!(err("DCGM_FI_DRIVER_VERSION, gauge, x\n").contains("string field"));
        assert!(err("DCGM_FI_DEV_GPU_UTIL, histogram, x\n").contains("unknown metric type"));
        assert!(err(" , gauge, x\n").contains("empty field name"));
    }
}
