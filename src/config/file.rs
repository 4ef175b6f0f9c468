//! dcgm-exporter's YAML configuration file (`--config-file`, `DCGM_EXPORTER_CONFIG_FILE`).
//!
//! Both of upstream's schemas are read, strictly (unknown keys are errors, as upstream's
//! `KnownFields(true)`):
//!
//! ```yaml
//! version: 2
//! metrics:
//!   file: /etc/dcgm-exporter/default-counters.csv   # or fields: [{name, prometheusType, help}]
//!   enableExporterMetrics: false
//! collections:
//!   - name: scrape
//!     every: 30s
//!     metrics: { include: ["*"] }
//! sources: { dcgm: { watch: {maxKeepAge: 10m, maxKeepSamples: 0}, detectBindUnbind: {...} } }
//! server: { maxConcurrentScrapes: 16 }
//! ```
//!
//! Version 1 has `collection: {interval, retention, watchGroups}` instead of `collections`.
//! What gpu-exporter applies: the metric source, `enableExporterMetrics`,
//! `maxConcurrentScrapes`, and the default cadence (v1 `collection.interval`, v2 the
//! collection including `*`) as the sampling interval. Per-field cadences and DCGM watch
//! settings are validated and reported as having no effect: every field is read from NVML
//! each interval. Flags and environment variables given explicitly win over the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::goflags::parse_duration;
use super::Args;

/// An unusable configuration file; names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("{path}: cannot read")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
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

#[derive(Deserialize)]
struct Header {
    version: Option<serde_yaml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Metrics {
    file: Option<String>,
    fields: Option<Vec<InlineField>>,
    enable_exporter_metrics: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct InlineField {
    name: String,
    prometheus_type: String,
    help: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Server {
    max_concurrent_scrapes: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DetectBindUnbind {
    enabled: Option<bool>,
    poll_interval: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct V1 {
    #[allow(dead_code)]
    version: i64,
    metrics: Option<Metrics>,
    collection: Option<V1Collection>,
    sources: Option<V1Sources>,
    server: Option<Server>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct V1Collection {
    interval: Option<String>,
    retention: Option<V1Retention>,
    watch_groups: Option<Vec<V1WatchGroup>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct V1Retention {
    max_age: Option<String>,
    #[allow(dead_code)]
    max_samples: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct V1WatchGroup {
    name: String,
    interval: String,
    fields: Vec<String>,
    retention: Option<V1Retention>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct V1Sources {
    dcgm: Option<V1Dcgm>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct V1Dcgm {
    detect_bind_unbind: Option<DetectBindUnbind>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct V2 {
    #[allow(dead_code)]
    version: i64,
    metrics: Option<Metrics>,
    collections: Option<Vec<Collection>>,
    sources: Option<V2Sources>,
    server: Option<Server>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Collection {
    name: String,
    every: String,
    metrics: CollectionMetrics,
    sources: Option<CollectionSources>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CollectionMetrics {
    include: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CollectionSources {
    dcgm: Option<CollectionDcgm>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CollectionDcgm {
    watch: Option<Watch>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Watch {
    max_keep_age: Option<String>,
    #[allow(dead_code)]
    max_keep_samples: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct V2Sources {
    dcgm: Option<V2Dcgm>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct V2Dcgm {
    watch: Option<Watch>,
    detect_bind_unbind: Option<DetectBindUnbind>,
}

/// Reads and checks the file at `path`.
///
/// # Errors
/// [`FileError`] naming the file and the key.
pub fn load(path: &Path) -> Result<FileSettings, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses the YAML `text` of the file `origin`.
///
/// # Errors
/// [`FileError`] naming `origin` and the key.
pub fn parse(text: &str, origin: &str) -> Result<FileSettings, FileError> {
    let syntax = |e: serde_yaml::Error| FileError::Syntax {
        path: origin.to_owned(),
        message: e.to_string(),
    };
    let invalid = |key: &str, reason: String| FileError::Invalid {
        path: origin.to_owned(),
        key: key.to_owned(),
        reason,
    };
    let header: Header = serde_yaml::from_str(text).map_err(syntax)?;
    let version = match header.version {
        Some(serde_yaml::Value::Number(n)) => n.as_i64(),
        _ => None,
    };
    let mut out = FileSettings::default();
    match version {
        Some(1) => {
            let v: V1 = serde_yaml::from_str(text).map_err(syntax)?;
            metrics(v.metrics, &mut out, &invalid)?;
            server(v.server, &mut out, &invalid)?;
            if let Some(d) = v
                .sources
                .and_then(|s| s.dcgm)
                .and_then(|d| d.detect_bind_unbind)
            {
                detect(d, "sources.dcgm.detectBindUnbind", &mut out, &invalid)?;
            }
            if let Some(c) = v.collection {
                if let Some(i) = &c.interval {
                    out.interval_ms =
                        Some(interval(i).map_err(|r| invalid("collection.interval", r))?);
                }
                if let Some(r) = c.retention {
                    retention(r, "collection.retention", &mut out, &invalid)?;
                }
                for (i, g) in c.watch_groups.unwrap_or_default().into_iter().enumerate() {
                    let key = format!("collection.watchGroups[{i}]");
                    if g.name.trim().is_empty() {
                        return Err(invalid(&format!("{key}.name"), "required".into()));
                    }
                    millis(&g.interval).map_err(|r| invalid(&format!("{key}.interval"), r))?;
                    if g.fields.is_empty() {
                        return Err(invalid(
                            &format!("{key}.fields"),
                            "must not be empty".into(),
                        ));
                    }
                    if let Some(r) = g.retention {
                        retention(r, &format!("{key}.retention"), &mut out, &invalid)?;
                    }
                    out.notices.push(format!(
                        "{origin}: {key} ({:?}, every {}) has no effect: gpu-exporter reads every field each sampling interval",
                        g.name, g.interval
                    ));
                }
            }
        }
        Some(2) => {
            let v: V2 = serde_yaml::from_str(text).map_err(syntax)?;
            metrics(v.metrics, &mut out, &invalid)?;
            server(v.server, &mut out, &invalid)?;
            if let Some(d) = v.sources.and_then(|s| s.dcgm) {
                if let Some(w) = d.watch {
                    watch(w, "sources.dcgm.watch", &mut out, &invalid)?;
                }
                if let Some(b) = d.detect_bind_unbind {
                    detect(b, "sources.dcgm.detectBindUnbind", &mut out, &invalid)?;
                }
            }
            if let Some(cs) = v.collections {
                if cs.is_empty() {
                    return Err(invalid(
                        "collections",
                        "must contain at least one collection".into(),
                    ));
                }
                for (i, c) in cs.into_iter().enumerate() {
                    let key = format!("collections[{i}]");
                    if c.name.trim().is_empty() {
                        return Err(invalid(&format!("{key}.name"), "required".into()));
                    }
                    let every =
                        millis(&c.every).map_err(|r| invalid(&format!("{key}.every"), r))?;
                    let default_cadence = c.metrics.include.iter().any(|p| p.trim() == "*");
                    if default_cadence {
                        interval(&c.every).map_err(|r| invalid(&format!("{key}.every"), r))?;
                    }
                    if c.metrics.include.is_empty() {
                        return Err(invalid(
                            &format!("{key}.metrics.include"),
                            "must not be empty".into(),
                        ));
                    }
                    if let Some(w) = c.sources.and_then(|s| s.dcgm).and_then(|d| d.watch) {
                        watch(w, &format!("{key}.sources.dcgm.watch"), &mut out, &invalid)?;
                    }
                    if default_cadence {
                        if out.interval_ms.is_some() {
                            return Err(invalid(
                                &format!("{key}.metrics.include"),
                                "a second collection of every field (\"*\")".into(),
                            ));
                        }
                        out.interval_ms = Some(every);
                    } else {
                        out.notices.push(format!(
                            "{origin}: {key} ({:?}, every {}) has no effect: gpu-exporter reads every field each sampling interval",
                            c.name, c.every
                        ));
                    }
                }
            }
        }
        _ => {
            return Err(invalid("version", "must be 1 or 2".into()));
        }
    }
    Ok(out)
}

/// Applies `--config-file` to the settings not given explicitly; returns the inline CSV of
/// `metrics.fields` (and the file) when that is the metric source.
///
/// # Errors
/// [`FileError`] naming the file and key.
pub fn apply(
    args: &mut Args,
    path: &Path,
    notices: &mut Vec<String>,
) -> Result<Option<(String, PathBuf)>, FileError> {
    let f = load(path)?;
    notices.extend(f.notices);
    let mut inline = None;
    let explicit = |id: &str| args.explicit.contains(id);
    match f.metrics {
        Some(MetricSource::File(p)) if !explicit("collectors") => args.collectors = Some(p),
        Some(MetricSource::Inline(csv)) if !explicit("collectors") => {
            inline = Some((csv, path.to_owned()));
        }
        _ => {}
    }
    if let Some(ms) = f.interval_ms.filter(|_| !explicit("collect_interval")) {
        args.collect_interval = ms;
    }
    if let Some(on) = f
        .enable_exporter_metrics
        .filter(|_| !explicit("enable_exporter_metrics"))
    {
        args.enable_exporter_metrics = on;
    }
    if let Some(n) = f
        .max_concurrent_scrapes
        .filter(|_| !explicit("max_concurrent_scrapes"))
    {
        args.max_concurrent_scrapes = n;
    }
    Ok(inline)
}

type Invalid<'a> = dyn Fn(&str, String) -> FileError + 'a;

fn metrics(m: Option<Metrics>, out: &mut FileSettings, invalid: &Invalid) -> Result<(), FileError> {
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
                csv.push_str(&format!(
                    "{}, {}, \"{}\"\n",
                    f.name.trim(),
                    f.prometheus_type.trim(),
                    f.help.trim().replace('\n', " ").replace('"', "\"\"")
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

fn server(s: Option<Server>, out: &mut FileSettings, invalid: &Invalid) -> Result<(), FileError> {
    if let Some(n) = s.and_then(|s| s.max_concurrent_scrapes) {
        let n = u32::try_from(n).ok().filter(|n| *n > 0).ok_or_else(|| {
            invalid(
                "server.maxConcurrentScrapes",
                format!("{n}: must be greater than 0"),
            )
        })?;
        out.max_concurrent_scrapes = Some(n);
    }
    Ok(())
}

fn detect(
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

fn watch(w: Watch, key: &str, out: &mut FileSettings, invalid: &Invalid) -> Result<(), FileError> {
    if let Some(a) = &w.max_keep_age {
        parse_duration(a).map_err(|r| invalid(&format!("{key}.maxKeepAge"), r))?;
    }
    out.notices.push(format!(
        "{key} has no effect: there are no DCGM field watches (NVML is read each interval)"
    ));
    Ok(())
}

fn retention(
    r: V1Retention,
    key: &str,
    out: &mut FileSettings,
    invalid: &Invalid,
) -> Result<(), FileError> {
    if let Some(a) = &r.max_age {
        parse_duration(a).map_err(|e| invalid(&format!("{key}.maxAge"), e))?;
    }
    out.notices.push(format!(
        "{key} has no effect: there are no DCGM field watches (NVML is read each interval)"
    ));
    Ok(())
}

fn positive(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s.trim())?;
    if d.is_zero() {
        return Err("must be greater than 0".into());
    }
    Ok(d)
}

/// The sampling interval: whole milliseconds within --collect-interval's range.
fn interval(s: &str) -> Result<u64, String> {
    let ms = millis(s)?;
    if !(100..=3_600_000).contains(&ms) {
        return Err(format!(
            "{s:?}: must be between 100ms and 1h (the --collect-interval range)"
        ));
    }
    Ok(ms)
}

/// A cadence in whole milliseconds, as upstream stores it.
fn millis(s: &str) -> Result<u64, String> {
    let d = positive(s)?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("{s:?}: must be whole milliseconds"));
    }
    u64::try_from(d.as_millis()).map_err(|_| format!("{s:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(text, "c.yaml").unwrap_err().to_string()
    }

    #[test]
    fn version_2_applies_file_interval_scrapes_and_exporter_metrics() {
        let s = parse(
            "version: 2\nmetrics:\n  file: /etc/x.csv\n  enableExporterMetrics: true\n\
             collections:\n  - name: scrape\n    every: 15s\n    metrics:\n      include: [\"*\"]\n\
             \x20 - name: fast\n    every: 5s\n    metrics:\n      include: [DCGM_FI_DEV_GPU_TEMP]\n\
             sources:\n  dcgm:\n    watch:\n      maxKeepAge: 10m\n      maxKeepSamples: 0\n\
             server:\n  maxConcurrentScrapes: 16\n",
            "c.yaml",
        )
        .unwrap();
        assert_eq!(s.metrics, Some(MetricSource::File("/etc/x.csv".into())));
        assert_eq!(s.enable_exporter_metrics, Some(true));
        assert_eq!(s.interval_ms, Some(15_000));
        assert_eq!(s.max_concurrent_scrapes, Some(16));
        assert_eq!(s.notices.len(), 2, "{:?}", s.notices);
        assert!(s.notices[1].contains("collections[1] (\"fast\", every 5s) has no effect"));
    }

    #[test]
    fn version_1_applies_interval_and_inline_fields() {
        let s = parse(
            "version: 1\nmetrics:\n  fields:\n    - name: DCGM_FI_DEV_GPU_TEMP\n      prometheusType: gauge\n      help: GPU temperature (in C), \"core\".\n\
             collection:\n  interval: 1m30s\n  watchGroups:\n    - name: g\n      interval: 5s\n      fields: [DCGM_FI_DEV_GPU_TEMP]\n",
            "c.yaml",
        )
        .unwrap();
        assert_eq!(
            s.metrics,
            Some(MetricSource::Inline(
                "DCGM_FI_DEV_GPU_TEMP, gauge, \"GPU temperature (in C), \"\"core\"\".\"\n".into()
            ))
        );
        assert_eq!(s.interval_ms, Some(90_000));
        assert_eq!(s.notices.len(), 1);
    }

    #[test]
    fn errors_name_the_file_and_key() {
        assert_eq!(err("version: 3\n"), "c.yaml: version: must be 1 or 2");
        assert_eq!(
            err("metrics: {file: x}\n"),
            "c.yaml: version: must be 1 or 2"
        );
        assert_eq!(
            err("version: 1\ncollection:\n  interval: 10\n"),
            "c.yaml: collection.interval: \"10\" has no unit (use ns, us, ms, s, m or h)"
        );
        assert_eq!(
            err("version: 2\ncollections:\n  - name: a\n    every: 0s\n    metrics: {include: [\"*\"]}\n"),
            "c.yaml: collections[0].every: must be greater than 0"
        );
        assert_eq!(
            err("version: 2\nserver:\n  maxConcurrentScrapes: 0\n"),
            "c.yaml: server.maxConcurrentScrapes: 0: must be greater than 0"
        );
        assert_eq!(
            err("version: 2\nmetrics:\n  file: a.csv\n  fields: [{name: DCGM_FI_DEV_GPU_TEMP, prometheusType: gauge, help: t}]\n"),
            "c.yaml: metrics: must specify exactly one of file or fields"
        );
        assert_eq!(
            err("version: 1\nmetrics:\n  fields:\n    - {name: X, prometheusType: gauge, help: \" \"}\n"),
            "c.yaml: metrics.fields[0].help: required"
        );
        // Unknown keys are errors, with the key and line (v2 keys in a v1 file too).
        let e = err("version: 1\ncollections: []\n");
        assert!(
            e.starts_with("c.yaml: ")
                && e.contains("unknown field `collections`")
                && e.contains("line 2"),
            "{e}"
        );
        let e = err("version: 2\nmetrics:\n  fiel: a.csv\n");
        assert!(
            e.contains("metrics") && e.contains("unknown field `fiel`") && e.contains("line 3"),
            "{e}"
        );
        let e = err("version: 2\nmetrics: {file: a}\nmetrics: {file: b}\n");
        assert!(e.contains("duplicate"), "{e}");
    }
}
