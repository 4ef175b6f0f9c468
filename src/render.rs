//! Pure renderer: [`Family`] lists to Prometheus text format 0.0.4.
//!
//! One `# HELP` and one `# TYPE` per family, series in the order given, label values and help
//! text escaped per the format. No I/O and no per-series allocation: label sets arrive
//! pre-rendered (and pre-escaped) from the snapshot builder.
//!
//! ```
//! use gpu_exporter::render::{render, Family, Series};
//! use gpu_exporter::gpu::Value;
//! use gpu_exporter::catalog::MetricType;
//! let fam = Family {
//!     name: "DCGM_FI_DEV_GPU_TEMP".into(),
//!     help: "GPU temperature (in C).".into(),
//!     kind: MetricType::Gauge,
//!     series: vec![Series { labels: r#"gpu="0""#.into(), value: Value::Int(41) }],
//! };
//! let mut out = String::new();
//! render(&[fam], &mut out);
//! assert_eq!(out, "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} 41\n");
//! ```

use std::fmt::Write as _;
use std::sync::Arc;

use crate::catalog::MetricType;
use crate::gpu::Value;

/// A metric family: name, help, type and its series.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Metric name, verbatim.
    pub name: String,
    /// Help text (unescaped).
    pub help: String,
    /// Gauge or counter.
    pub kind: MetricType,
    /// Series, in output order.
    pub series: Vec<Series>,
}

/// One series: a pre-rendered label set and a value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// `name="value",…` with values already escaped ([`push_label`]); may be empty. Shared: the
    /// series of one GPU in different families usually have the same label set, built once.
    pub labels: Arc<str>,
    /// The sample value.
    pub value: Value,
}

/// Appends every non-empty family to `out`.
pub fn render(families: &[Family], out: &mut String) {
    for fam in families.iter().filter(|f| !f.series.is_empty()) {
        out.push_str("# HELP ");
        out.push_str(&fam.name);
        out.push(' ');
        escape_help(&fam.help, out);
        out.push_str("\n# TYPE ");
        out.push_str(&fam.name);
        out.push(' ');
        out.push_str(fam.kind.as_str());
        out.push('\n');
        for s in &fam.series {
            out.push_str(&fam.name);
            if !s.labels.is_empty() {
                out.push('{');
                out.push_str(&s.labels);
                out.push('}');
            }
            out.push(' ');
            push_value(&s.value, out);
            out.push('\n');
        }
    }
}

fn push_value(v: &Value, out: &mut String) {
    match v {
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(_) => {
            let _ = write!(out, "{v}");
        }
        // A string value is never a valid sample; the builder only puts numbers here.
        Value::Text(_) => out.push_str("NaN"),
    }
}

/// Appends `name="value"` to a label set, escaping the value, with a comma if needed.
pub fn push_label(labels: &mut String, name: &str, value: &str) {
    if !labels.is_empty() {
        labels.push(',');
    }
    labels.push_str(name);
    labels.push_str("=\"");
    escape_label_value(value, labels);
    labels.push('"');
}

/// Escapes a label value: backslash, double quote and line feed.
pub fn escape_label_value(value: &str, out: &mut String) {
    if !value.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(value);
        return;
    }
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Escapes help text: backslash and line feed.
pub fn escape_help(help: &str, out: &mut String) {
    if !help.bytes().any(|b| matches!(b, b'\\' | b'\n')) {
        out.push_str(help);
        return;
    }
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes_known_cases() {
        let mut s = String::new();
        push_label(&mut s, "pod", "a\"b\\c\nd");
        assert_eq!(s, r#"pod="a\"b\\c\nd""#);
        let mut h = String::new();
        escape_help("line1\nback\\slash \"quoted\"", &mut h);
        assert_eq!(h, r#"line1\nback\\slash "quoted""#);
        let mut u = String::new();
        push_label(&mut u, "pod", "träining-ü-🚀");
        assert_eq!(u, "pod=\"träining-ü-🚀\"");
    }

    #[test]
    fn empty_families_are_omitted_and_floats_have_no_exponent() {
        let fams = vec![
            Family {
                name: "a".into(),
                help: "h".into(),
                kind: MetricType::Gauge,
                series: vec![],
            },
            Family {
                name: "b".into(),
                help: String::new(),
                kind: MetricType::Counter,
                series: vec![
                    Series {
                        labels: "".into(),
                        value: Value::Float(1e-7),
                    },
                    Series {
                        labels: "x=\"1\"".into(),
                        value: Value::Float(1.5e12),
                    },
                ],
            },
        ];
        let mut out = String::new();
        render(&fams, &mut out);
        assert_eq!(
            out,
            "# HELP b \n# TYPE b counter\nb 0.0000001\nb{x=\"1\"} 1500000000000\n"
        );
    }

    /// Undoes `escape_label_value`, for the round-trip property.
    fn unescape(s: &str) -> Option<String> {
        let mut out = String::new();
        let mut it = s.chars();
        while let Some(c) = it.next() {
            match c {
                '\\' => match it.next()? {
                    '\\' => out.push('\\'),
                    '"' => out.push('"'),
                    'n' => out.push('\n'),
                    _ => return None,
                },
                '"' | '\n' => return None,
                c => out.push(c),
            }
        }
        Some(out)
    }

    proptest! {
        #[test]
        fn escaped_label_values_have_no_raw_newline_or_quote_and_round_trip(v in any::<String>()) {
            let mut out = String::new();
            escape_label_value(&v, &mut out);
            prop_assert!(!out.contains('\n'));
            prop_assert_eq!(unescape(&out), Some(v));
        }

        #[test]
        fn escaped_help_has_no_raw_newline(v in any::<String>()) {
            let mut out = String::new();
            escape_help(&v, &mut out);
            prop_assert!(!out.contains('\n'));
        }
    }
}
