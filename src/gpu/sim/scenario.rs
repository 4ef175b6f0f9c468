//! Scenario files for the simulated backend: a TOML timeline of scripted events.
//!
//! ```toml
//! profile = "8xH100-SXM"   # optional; --sim-profile overrides it
//! seed = 42                # optional
//!
//! [[event]]
//! at = "30s"               # simulated time since start; each sample advances it by the interval
//! gpu = 3                  # a GPU index, or "all"
//! action = "fall-off-bus"
//! ```
//!
//! Actions: `fall-off-bus`, `recover`, `xid` (`xid = N`), `ecc-dbe` / `ecc-sbe` (`count`),
//! `thermal-throttle` (`temperature`, `duration`), `utilization` (`pattern` = `constant` with
//! `value`, or `square`/`sine` with `low`, `high`, `period`; optional `duration`),
//! `row-remap-failure`, `retired-pages-pending`, `pcie-replays` (`count`), `nvlink-errors`
//! (`count`). Every mistake is reported as `file:line: reason`. Parsing is pure.

use std::time::Duration;

use serde::Deserialize;

/// The largest `count` an event may carry. The simulated counters are `i64`, as DCGM's are; a
/// larger count is refused with an error naming the line, and the sums of many events saturate.
pub const MAX_COUNT: u64 = 1_000_000_000_000;

/// A parsed scenario.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scenario {
    /// Fleet profile, if the file names one.
    pub profile: Option<String>,
    /// PRNG seed, if the file sets one.
    pub seed: Option<u64>,
    /// Events, sorted by time (stable for equal times).
    pub events: Vec<Event>,
}

/// Which GPUs an event applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Every GPU.
    All,
    /// One GPU by index.
    Gpu(u32),
}

impl Target {
    /// Whether the event applies to GPU `index`.
    pub fn matches(self, index: u32) -> bool {
        match self {
            Target::All => true,
            Target::Gpu(i) => i == index,
        }
    }
}

/// A utilization pattern.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pattern {
    /// Always `value` percent.
    Constant(f64),
    /// `high` for the first half of each period, `low` for the second.
    Square {
        /// Low level, %.
        low: f64,
        /// High level, %.
        high: f64,
        /// Period.
        period: Duration,
    },
    /// A sine between `low` and `high`.
    Sine {
        /// Low level, %.
        low: f64,
        /// High level, %.
        high: f64,
        /// Period.
        period: Duration,
    },
}

impl Pattern {
    /// The utilization (%) at `t` since the pattern started.
    pub fn at(&self, t: Duration) -> f64 {
        match *self {
            Pattern::Constant(v) => v,
            Pattern::Square { low, high, period } => {
                let phase = t.as_secs_f64() % period.as_secs_f64();
                if phase < period.as_secs_f64() / 2.0 {
                    high
                } else {
                    low
                }
            }
            Pattern::Sine { low, high, period } => {
                let x = t.as_secs_f64() / period.as_secs_f64() * std::f64::consts::TAU;
                low + (high - low) * (0.5 - 0.5 * x.cos())
            }
        }
    }
}

/// What happens.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The GPU falls off the bus (XID 79); reads fail until `Recover`.
    FallOffBus,
    /// A lost GPU comes back.
    Recover,
    /// An XID error.
    Xid(u64),
    /// Double-bit ECC errors (also XID 48 and a pending page retirement).
    EccDbe(u64),
    /// Single-bit ECC errors.
    EccSbe(u64),
    /// Overheating with thermal throttling.
    ThermalThrottle {
        /// Temperature held, °C.
        temperature: i64,
        /// How long.
        duration: Duration,
    },
    /// A utilization pattern.
    Utilization {
        /// The pattern.
        pattern: Pattern,
        /// How long (forever if `None`).
        duration: Option<Duration>,
    },
    /// Row remapping fails.
    RowRemapFailure,
    /// Pages become pending retirement.
    RetiredPagesPending,
    /// PCIe replays.
    PcieReplays(u64),
    /// NVLink CRC/replay errors.
    NvlinkErrors(u64),
}

/// One scripted event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Simulated time since start.
    pub at: Duration,
    /// Which GPUs.
    pub target: Target,
    /// What.
    pub action: Action,
    /// 1-based line of the event in the file.
    pub line: usize,
}

/// An error in a scenario file.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("reading scenario file {path}")]
    Io {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid.
    #[error("{origin}:{line}: {reason}")]
    Invalid {
        /// File name.
        origin: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    profile: Option<String>,
    seed: Option<u64>,
    #[serde(default)]
    event: Vec<toml::Spanned<RawEvent>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent {
    at: String,
    gpu: toml::Value,
    action: String,
    xid: Option<u64>,
    count: Option<u64>,
    temperature: Option<i64>,
    duration: Option<String>,
    pattern: Option<String>,
    value: Option<f64>,
    low: Option<f64>,
    high: Option<f64>,
    period: Option<String>,
}

/// Reads and parses a scenario file.
///
/// # Errors
/// [`ScenarioError::Io`] or [`ScenarioError::Invalid`] with the file and line.
pub fn load(path: &std::path::Path) -> Result<Scenario, ScenarioError> {
    let text = crate::fsread::read_text(
        path,
        crate::fsread::Cap::SIMULATOR,
        crate::fsread::Symlinks::Follow,
    )
    .map_err(|e| ScenarioError::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses scenario text; `origin` names the file in errors.
///
/// # Errors
/// [`ScenarioError::Invalid`] naming the line and what is wrong.
pub fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let raw: RawScenario = toml::from_str(text).map_err(|e| ScenarioError::Invalid {
        origin: origin.to_owned(),
        line: e.span().map_or(1, |s| line_of(s.start)),
        reason: e.message().to_owned(),
    })?;
    let mut events = Vec::with_capacity(raw.event.len());
    for spanned in raw.event {
        let line = line_of(spanned.span().start);
        let ev = spanned.into_inner();
        let action = event_action(&ev).map_err(|reason| ScenarioError::Invalid {
            origin: origin.to_owned(),
            line,
            reason,
        })?;
        let invalid = |reason: String| ScenarioError::Invalid {
            origin: origin.to_owned(),
            line,
            reason,
        };
        let at = parse_duration(&ev.at).map_err(|r| invalid(format!("`at`: {r}")))?;
        let target = match &ev.gpu {
            toml::Value::String(s) if s == "all" => Target::All,
            toml::Value::Integer(i) => u32::try_from(*i)
                .map(Target::Gpu)
                .map_err(|_| invalid(format!("`gpu`: {i} is not a GPU index")))?,
            other => {
                return Err(invalid(format!(
                    "`gpu` must be a GPU index or \"all\", found {other}"
                )))
            }
        };
        events.push(Event {
            at,
            target,
            action,
            line,
        });
    }
    events.sort_by_key(|e| e.at);
    Ok(Scenario {
        profile: raw.profile,
        seed: raw.seed,
        events,
    })
}

fn event_action(ev: &RawEvent) -> Result<Action, String> {
    let need =
        |v: Option<u64>, key: &str| v.ok_or_else(|| format!("`{}` needs `{key}`", ev.action));
    let count = || match ev.count {
        Some(n) if n > MAX_COUNT => Err(format!(
            "`count` = {n} is too large for `{}` (at most {MAX_COUNT})",
            ev.action
        )),
        n => Ok(n.unwrap_or(1)),
    };
    let dur = |v: &Option<String>, key: &str| -> Result<Option<Duration>, String> {
        v.as_deref()
            .map(|s| parse_duration(s).map_err(|r| format!("`{key}`: {r}")))
            .transpose()
    };
    Ok(match ev.action.as_str() {
        "fall-off-bus" => Action::FallOffBus,
        "recover" => Action::Recover,
        "xid" => Action::Xid(need(ev.xid, "xid")?),
        "ecc-dbe" => Action::EccDbe(count()?),
        "ecc-sbe" => Action::EccSbe(count()?),
        "thermal-throttle" => Action::ThermalThrottle {
            temperature: ev.temperature.unwrap_or(92),
            duration: dur(&ev.duration, "duration")?.unwrap_or(Duration::from_secs(300)),
        },
        "utilization" => {
            let pct = |v: Option<f64>, key: &str| -> Result<f64, String> {
                let v = v.ok_or_else(|| format!("pattern needs `{key}`"))?;
                if (0.0..=100.0).contains(&v) {
                    Ok(v)
                } else {
                    Err(format!("`{key}` = {v} is not a percentage (0-100)"))
                }
            };
            let period = || -> Result<Duration, String> {
                match dur(&ev.period, "period")? {
                    Some(p) if !p.is_zero() => Ok(p),
                    Some(_) => Err("`period` must be greater than zero".to_owned()),
                    None => Err("pattern needs `period`".to_owned()),
                }
            };
            let pattern = match ev.pattern.as_deref().unwrap_or("constant") {
                "constant" => Pattern::Constant(pct(ev.value, "value")?),
                "square" => Pattern::Square {
                    low: pct(ev.low, "low")?,
                    high: pct(ev.high, "high")?,
                    period: period()?,
                },
                "sine" => Pattern::Sine {
                    low: pct(ev.low, "low")?,
                    high: pct(ev.high, "high")?,
                    period: period()?,
                },
                other => {
                    return Err(format!(
                        "unknown pattern {other:?}; expected constant, square or sine"
                    ))
                }
            };
            Action::Utilization {
                pattern,
                duration: dur(&ev.duration, "duration")?,
            }
        }
        "row-remap-failure" => Action::RowRemapFailure,
        "retired-pages-pending" => Action::RetiredPagesPending,
        "pcie-replays" => Action::PcieReplays(count()?),
        "nvlink-errors" => Action::NvlinkErrors(count()?),
        other => {
            return Err(format!(
                "unknown action {other:?}; expected one of fall-off-bus, recover, xid, ecc-dbe, ecc-sbe, thermal-throttle, utilization, row-remap-failure, retired-pages-pending, pcie-replays, nvlink-errors"
            ))
        }
    })
}

/// Parses a duration in Go's syntax (`500ms`, `30s`, `1m30s`, `1.5h`), as the flags and the
/// configuration files write them: the one parser is [`crate::godur::parse`].
///
/// # Errors
/// A message saying what is wrong.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::godur::parse(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_timeline_sorted_by_time() {
        let s = parse(
            r#"
profile = "8xH100-SXM"
seed = 7

[[event]]
at = "1m"
gpu = 1
action = "ecc-dbe"
count = 2

[[event]]
at = "30s"
gpu = "all"
action = "utilization"
pattern = "square"
low = 5
high = 95
period = "1m"
"#,
            "s.toml",
        )
        .unwrap();
        assert_eq!(s.profile.as_deref(), Some("8xH100-SXM"));
        assert_eq!(s.seed, Some(7));
        assert_eq!(s.events.len(), 2);
        assert_eq!(s.events[0].at, Duration::from_secs(30));
        assert_eq!(s.events[0].target, Target::All);
        assert_eq!(s.events[0].line, 11);
        assert_eq!(s.events[1].action, Action::EccDbe(2));
        assert_eq!(s.events[1].line, 5);
    }

    #[test]
    fn errors_name_file_and_line() {
        let e = parse(
            "[[event]]\nat = \"1m\"\ngpu = 0\naction = \"explode\"\n",
            "s.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("s.toml:1: unknown action \"explode\""), "{e}");

        let e = parse(
            "seed = 1\n\n[[event]]\nat = \"soon\"\ngpu = 0\naction = \"recover\"\n",
            "s.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("s.toml:3: `at`:"), "{e}");

        let e = parse("seed = 1\nbogus = 2\n", "s.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("s.toml:2:") && e.contains("bogus"), "{e}");

        let e = parse(
            "[[event]]\nat = \"1s\"\ngpu = -1\naction = \"recover\"\n",
            "s.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not a GPU index"), "{e}");

        let e = parse(
            "[[event]]\nat = \"1s\"\ngpu = 0\naction = \"utilization\"\npattern = \"sine\"\nlow = 0\nhigh = 150\nperiod = \"1m\"\n",
            "s.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not a percentage"), "{e}");
        let e = parse(
            "[[event]]\nat = \"1s\"\ngpu = 0\naction = \"xid\"\n",
            "s.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs `xid`"), "{e}");
    }

    #[test]
    fn absurd_counts_are_refused_with_the_line() {
        // Issue 35 item 13: i64::MAX errors twice overflowed the simulated counters.
        for action in ["ecc-dbe", "ecc-sbe", "pcie-replays", "nvlink-errors"] {
            let text = format!(
                "seed = 1\n\n[[event]]\nat = \"1s\"\ngpu = 0\naction = \"{action}\"\ncount = 9223372036854775807\n"
            );
            let e = parse(&text, "s.toml").unwrap_err().to_string();
            assert!(
                e.starts_with("s.toml:3: `count` = 9223372036854775807 is too large"),
                "{e}"
            );
        }
        let ok =
            format!("[[event]]\nat = \"1s\"\ngpu = 0\naction = \"ecc-sbe\"\ncount = {MAX_COUNT}\n");
        assert_eq!(
            parse(&ok, "s.toml").unwrap().events[0].action,
            Action::EccSbe(MAX_COUNT)
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn patterns() {
        let sq = Pattern::Square {
            low: 5.0,
            high: 95.0,
            period: Duration::from_secs(60),
        };
        assert_eq!(sq.at(Duration::from_secs(10)), 95.0);
        assert_eq!(sq.at(Duration::from_secs(40)), 5.0);
        let sine = Pattern::Sine {
            low: 0.0,
            high: 100.0,
            period: Duration::from_secs(60),
        };
        assert!(sine.at(Duration::ZERO).abs() < 1e-9);
        assert!((sine.at(Duration::from_secs(30)) - 100.0).abs() < 1e-9);
    }
}
