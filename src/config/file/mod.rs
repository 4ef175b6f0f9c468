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
//! settings are validated and reported as having no effect: every field is read each interval,
//! from NVML or, for the DCGM_FI_PROF_* fields with `-r`, from DCGM watches of fixed retention.
//! Flags and environment variables given explicitly win over the file.
//!
//! Layout: `settings` holds what the file yields ([`FileSettings`], [`FileError`]); `schema` the
//! file as serde reads it (both versions); `sections` the checks of each section; this file
//! reads the file and applies it to [`Args`].

mod schema;
mod sections;
mod settings;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use super::Args;
use crate::fsread::{self, Cap, Symlinks};
use schema::{Header, V1, V2};
use sections::{detect, interval, metrics, millis, retention, server, watch};
pub use settings::{FileError, FileSettings, MetricSource};

/// Reads and checks the file at `path`, through the bounded reader: a regular file (links are
/// followed: a ConfigMap mount is a tree of links) of at most [`Cap::CONFIG_FILE`] bytes,
/// never waiting on a FIFO or reading a device.
///
/// # Errors
/// [`FileError`] naming the file and the key.
pub fn load(path: &Path) -> Result<FileSettings, FileError> {
    let text =
        fsread::read_text(path, Cap::CONFIG_FILE, Symlinks::Follow).map_err(FileError::Read)?;
    parse(&text, &path.display().to_string())
}

/// Parses the YAML `text` of the file `origin`. A UTF-8 byte-order mark at the start (Windows
/// editors write one) is ignored, as in the metrics CSV.
///
/// # Errors
/// [`FileError`] naming `origin` and the key.
pub fn parse(text: &str, origin: &str) -> Result<FileSettings, FileError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    crate::yamldepth::check(text, crate::yamldepth::MAX_DEPTH).map_err(|e| FileError::TooDeep {
        path: origin.to_owned(),
        line: e.line,
        limit: e.limit,
    })?;
    let syntax = |e: yaml_serde::Error| FileError::Syntax {
        path: origin.to_owned(),
        message: e.to_string(),
    };
    let invalid = |key: &str, reason: String| FileError::Invalid {
        path: origin.to_owned(),
        key: key.to_owned(),
        reason,
    };
    let header: Header = yaml_serde::from_str(text).map_err(syntax)?;
    let version = match header.version {
        Some(yaml_serde::Value::Number(n)) => n.as_i64(),
        _ => None,
    };
    let mut out = FileSettings::default();
    match version {
        Some(1) => {
            let v: V1 = yaml_serde::from_str(text).map_err(syntax)?;
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
            let v: V2 = yaml_serde::from_str(text).map_err(syntax)?;
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
