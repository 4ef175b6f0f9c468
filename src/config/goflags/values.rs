//! Go's value syntax for flags and environment variables (`strconv.ParseBool`,
//! `time.ParseDuration`), and the record of which settings were given explicitly: what [`Args`]
//! itself names, below the parser that fills it.
//!
//! [`Args`]: crate::config::Args

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The spellings Go's `strconv.ParseBool` accepts.
pub const GO_BOOLS: &str = "1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False";

/// Parses a boolean as Go's `strconv.ParseBool` does.
///
/// # Errors
/// A message listing the accepted spellings.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean (accepted: {GO_BOOLS})")),
    }
}

/// Parses a duration as Go's `time.ParseDuration` does (`10s`, `1m30s`, `1.5h`, `250ms`, `0`),
/// refusing negative ones: every duration flag here is a timeout or an interval. The one Go
/// duration parser is [`crate::godur::parse`]; this name is the flags' `value_parser`.
///
/// # Errors
/// A message naming what is wrong.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::godur::parse(s)
}

/// The value parser of a file flag that, as a Go string flag, takes the empty value (clap's
/// `PathBuf` parser refuses it): [`parse`](super::parse) then reads `""` as no file.
pub fn file_path() -> impl clap::builder::TypedValueParser<Value = PathBuf> {
    use clap::builder::TypedValueParser;
    clap::builder::OsStringValueParser::new().map(PathBuf::from)
}

/// Formats a duration the way a user would write it back (`30s`, `1m30s`, `250ms`).
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    if d.subsec_nanos() != 0 {
        return format!("{}ms", d.as_millis());
    }
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 {
        out.push_str(&format!("{s}s"));
    }
    out
}

/// The settings given explicitly, by flag or environment variable: `Args` field names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Explicit(BTreeMap<String, Option<String>>);

impl Explicit {
    /// Whether the setting `id` (an `Args` field name) was given by flag or environment.
    pub fn contains(&self, id: &str) -> bool {
        self.0.contains_key(id)
    }

    /// Marks `id` as given explicitly (by the environment variable `env`, if so).
    pub fn insert(&mut self, id: &str, env: Option<&str>) {
        self.0.insert(id.to_owned(), env.map(str::to_owned));
    }

    /// The environment variable that gave `id`, when one did (not a flag).
    pub fn env_var(&self, id: &str) -> Option<&str> {
        self.0.get(id)?.as_deref()
    }
}
