//! The checks of each section of the file: the metric source, the server, DCGM's watch and
//! bind/unbind settings, and the durations they hold.

use std::path::PathBuf;
use std::time::Duration;

use super::schema::*;
use super::settings::{FileError, FileSettings, MetricSource};
use crate::config::goflags::parse_duration;

pub(super) type Invalid<'a> = dyn Fn(&str, String) -> FileError + 'a;

pub(super) fn metrics(
    m: Option<Metrics>,
    out: &mut FileSettings,
    invalid: &Invalid,
) -> Result<(), FileError> {
    let Some(m) = m else { return Ok(()) };
    out.enable_exporter_metrics = m.enable_exporter_metrics;
    let file = m.file.as_deref().map(str::trim).filter(|f| !f.is_empty());
    let fields = m.fields.filter(|f| !f.is_empty());
    match (file, fields) {
        (Some(_), Some(_)) => Err(invalid(
            "metrics",
            "must specify exactly one of file or fields".into(),
        )),
        (Some(f), None) => {
            out.metrics = Some(MetricSource::File(PathBuf::from(f)));
            Ok(())
        }
        (None, Some(fields)) => {
            let mut csv = String::new();
            for (i, f) in fields.iter().enumerate() {
                for (what, v) in [
                    ("name", &f.name),
                    ("prometheusType", &f.prometheus_type),
                    ("help", &f.help),
                ] {
                    if v.trim().is_empty() {
                        return Err(invalid(
                            &format!("metrics.fields[{i}].{what}"),
                            "required".into(),
                        ));
                    }
                }
                // The rows become CSV text: a separator, quote or line break in a name or type
                // would make rows of its own (another field, another help text), and a leading
                // `#` a comment that shifts every later row off its key.
                for (what, v) in [("name", &f.name), ("prometheusType", &f.prometheus_type)] {
                    if let Some(reason) = csv_unsafe(v.trim()) {
                        return Err(invalid(&format!("metrics.fields[{i}].{what}"), reason));
                    }
                }
                csv.push_str(&format!(
                    "{}, {}, \"{}\"\n",
                    f.name.trim(),
                    f.prometheus_type.trim(),
                    f.help
                        .trim()
                        .replace(['\r', '\n'], " ")
                        .replace('"', "\"\"")
                ));
            }
            out.metrics = Some(MetricSource::Inline(csv));
            Ok(())
        }
        (None, None) if out.enable_exporter_metrics.is_some() => Ok(()),
        (None, None) => Err(invalid(
            "metrics",
            "must specify file, fields, or enableExporterMetrics".into(),
        )),
    }
}

/// Why `v` cannot be a field of an inline row: a CSV separator, quote or line break (or any
/// other control character), or a leading `#`.
fn csv_unsafe(v: &str) -> Option<String> {
    if v.starts_with('#') {
        return Some(format!(
            "{v:?}: cannot start with '#' (a comment in the metrics CSV)"
        ));
    }
    let bad = v
        .chars()
        .find(|c| matches!(c, ',' | '"') || c.is_control())?;
    let what = match bad {
        ',' => "a comma".to_owned(),
        '"' => "a double quote".to_owned(),
        '\n' | '\r' => "a line break".to_owned(),
        c => format!("the control character {c:?}"),
    };
    Some(format!(
        "{v:?}: contains {what}, which would split or add rows of the metrics CSV; refused"
    ))
}

pub(super) fn server(
    s: Option<Server>,
    out: &mut FileSettings,
    invalid: &Invalid,
) -> Result<(), FileError> {
    if let Some(n) = s.and_then(|s| s.max_concurrent_scrapes) {
        let too_large = || format!("{n}: too large (at most {})", u32::MAX);
        let scrapes = match n {
            Number::Int(i) if i <= 0 => Err(format!("{n}: must be greater than 0")),
            Number::Int(i) => u32::try_from(i).map_err(|_| too_large()),
            Number::Float(f) if f <= 0.0 => Err(format!("{n}: must be greater than 0")),
            Number::Float(f) if f.fract() == 0.0 || f.is_infinite() => Err(too_large()),
            Number::Float(_) => Err(format!("{n}: must be a whole number")),
        };
        out.max_concurrent_scrapes =
            Some(scrapes.map_err(|r| invalid("server.maxConcurrentScrapes", r))?);
    }
    Ok(())
}

pub(super) fn detect(
    d: DetectBindUnbind,
    key: &str,
    out: &mut FileSettings,
    invalid: &Invalid,
) -> Result<(), FileError> {
    if let Some(p) = &d.poll_interval {
        positive(p).map_err(|r| invalid(&format!("{key}.pollInterval"), r))?;
    }
    if d.enabled.is_some() || d.poll_interval.is_some() {
        out.notices.push(format!(
            "{key} has no effect: gpu-exporter rediscovers GPUs through NVML every minute"
        ));
    }
    Ok(())
}

pub(super) fn watch(
    w: Watch,
    key: &str,
    out: &mut FileSettings,
    invalid: &Invalid,
) -> Result<(), FileError> {
    if let Some(a) = &w.max_keep_age {
        parse_duration(a).map_err(|r| invalid(&format!("{key}.maxKeepAge"), r))?;
    }
    if let Some(n) = w.max_keep_samples {
        int64(n).map_err(|r| invalid(&format!("{key}.maxKeepSamples"), r))?;
    }
    out.notices.push(format!(
        "{key} has no effect: {}",
        crate::config::inert::DCGM_WATCHES_FIXED
    ));
    Ok(())
}

pub(super) fn retention(
    r: V1Retention,
    key: &str,
    out: &mut FileSettings,
    invalid: &Invalid,
) -> Result<(), FileError> {
    if let Some(a) = &r.max_age {
        parse_duration(a).map_err(|e| invalid(&format!("{key}.maxAge"), e))?;
    }
    if let Some(n) = r.max_samples {
        int64(n).map_err(|e| invalid(&format!("{key}.maxSamples"), e))?;
    }
    out.notices.push(format!(
        "{key} has no effect: {}",
        crate::config::inert::DCGM_WATCHES_FIXED
    ));
    Ok(())
}

/// A whole number in Go's `int64`, as upstream reads DCGM's sample counts.
fn int64(n: Number) -> Result<i64, String> {
    match n {
        Number::Int(i) => i64::try_from(i).map_err(|_| {
            let bound = if i < 0 {
                "small (at least"
            } else {
                "large (at most"
            };
            let limit = if i < 0 { i64::MIN } else { i64::MAX };
            format!("{n}: too {bound} {limit})")
        }),
        Number::Float(f) if f.fract() == 0.0 || f.is_infinite() => Err(format!(
            "{n}: too {} {})",
            if f < 0.0 {
                "small (at least"
            } else {
                "large (at most"
            },
            if f < 0.0 { i64::MIN } else { i64::MAX }
        )),
        Number::Float(_) => Err(format!("{n}: must be a whole number")),
    }
}

pub(super) fn positive(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s.trim())?;
    if d.is_zero() {
        return Err("must be greater than 0".into());
    }
    Ok(d)
}

/// The sampling interval: whole milliseconds within --collect-interval's range.
pub(super) fn interval(s: &str) -> Result<u64, String> {
    let ms = millis(s)?;
    if !(100..=3_600_000).contains(&ms) {
        return Err(format!(
            "{s:?}: must be between 100ms and 1h (the --collect-interval range)"
        ));
    }
    Ok(ms)
}

/// A cadence in whole milliseconds, as upstream stores it.
pub(super) fn millis(s: &str) -> Result<u64, String> {
    let d = positive(s)?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("{s:?}: must be whole milliseconds"));
    }
    u64::try_from(d.as_millis()).map_err(|_| format!("{s:?}: too large"))
}
