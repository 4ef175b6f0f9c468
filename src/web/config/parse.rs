//! Reading and checking a web configuration file: the YAML parsed into the raw shape, then
//! every value checked and mapped into a [`WebConfig`].

use std::time::Duration;

use crate::fsread::{self, Cap, Symlinks};

use super::raw::{RawDuration, RawFile, DUPLICATE};
use super::types::{RateLimit, WebConfig, WebConfigError};
use super::validate::validate_tls;

/// The response headers exporter-toolkit lets a web config set.
const ALLOWED_HEADERS: &[&str] = &[
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
];

/// Reads and parses a web configuration file.
///
/// # Errors
/// [`WebConfigError`] naming the file and key.
pub fn load(path: &std::path::Path) -> Result<WebConfig, WebConfigError> {
    parse(&read_file(path)?, &path.display().to_string())
}

/// Reads the web configuration file through the bounded reader: a regular file (links are
/// followed: a Secret or ConfigMap mount is a tree of links) of at most [`Cap::WEB_CONFIG`]
/// bytes, never waiting on a FIFO.
///
/// # Errors
/// [`WebConfigError::Io`] naming the file and why.
pub fn read_file(path: &std::path::Path) -> Result<String, WebConfigError> {
    fsread::read_text(path, Cap::WEB_CONFIG, Symlinks::Follow).map_err(|e| WebConfigError::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    })
}

/// Parses and validates web configuration text. `origin` names it in errors. A UTF-8
/// byte-order mark at the start is ignored (libyaml skips it); text nested deeper than
/// [`crate::yamldepth::MAX_DEPTH`] levels is refused before it is parsed.
///
/// # Errors
/// [`WebConfigError::Yaml`] for syntax, unknown keys and wrong types,
/// [`WebConfigError::Invalid`] for values gpu-exporter cannot honour.
pub fn parse(text: &str, origin: &str) -> Result<WebConfig, WebConfigError> {
    crate::yamldepth::check(text, crate::yamldepth::MAX_DEPTH).map_err(|e| {
        WebConfigError::TooDeep {
            origin: origin.to_owned(),
            line: e.line,
            limit: e.limit,
        }
    })?;
    // An empty file (or one with only comments) is a valid "no TLS, no auth" config, as in Go.
    let raw: RawFile = if text.trim().is_empty() || is_only_comments(text) {
        RawFile::default()
    } else {
        yaml_serde::from_str::<Option<RawFile>>(text)
            .map_err(|source| match duplicate_lines(text, &source) {
                Some((key, lines)) => WebConfigError::Invalid {
                    origin: origin.to_owned(),
                    key,
                    reason: lines,
                },
                None => WebConfigError::Yaml {
                    origin: origin.to_owned(),
                    source,
                },
            })?
            .unwrap_or_default()
    };
    let bad = |key: &str, reason: String| WebConfigError::Invalid {
        origin: origin.to_owned(),
        key: key.to_owned(),
        reason,
    };

    let tls = match raw.tls_server_config {
        Some(t) => validate_tls(t, &bad)?,
        None => None,
    };

    let mut headers = Vec::new();
    let mut http2 = true;
    if let Some(h) = raw.http_server_config {
        http2 = h.http2.unwrap_or(true);
        for (name, value) in h.headers.unwrap_or_default() {
            let key = format!("http_server_config.headers.{name}");
            let Some(canonical) = ALLOWED_HEADERS
                .iter()
                .find(|a| a.eq_ignore_ascii_case(&name))
            else {
                return Err(bad(
                    &key,
                    format!(
                        "this header cannot be configured; allowed: {}",
                        ALLOWED_HEADERS.join(", ")
                    ),
                ));
            };
            if value.is_empty() {
                continue;
            }
            let lower = value.to_ascii_lowercase();
            match *canonical {
                "X-Frame-Options" if lower != "deny" && lower != "sameorigin" => {
                    return Err(bad(&key, format!("{value:?}: expected deny or sameorigin")))
                }
                "X-Content-Type-Options" if lower != "nosniff" => {
                    return Err(bad(&key, format!("{value:?}: expected nosniff")))
                }
                _ => {}
            }
            if value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                return Err(bad(&key, "contains control characters".to_owned()));
            }
            headers.push(((*canonical).to_owned(), value));
        }
    }

    let basic_auth_users = raw.basic_auth_users.unwrap_or_default();
    for (user, hash) in &basic_auth_users {
        let key = format!("basic_auth_users.{user}");
        if user.contains(':') {
            return Err(bad(&key, "user names cannot contain ':'".to_owned()));
        }
        if !is_bcrypt_hash(hash) {
            return Err(bad(
                &key,
                "not a bcrypt hash (expected $2a$, $2b$ or $2y$ followed by cost and 53 characters, e.g. from `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)".to_owned(),
            ));
        }
    }

    let rate_limit = match raw.rate_limit {
        None => None,
        Some(r) => {
            let interval = match r.interval {
                None | Some(RawDuration::Number(0)) => Duration::ZERO,
                Some(RawDuration::Number(n)) => {
                    return Err(bad(
                        "rate_limit.interval",
                        format!("{n} has no unit (use ns, us, ms, s, m or h)"),
                    ))
                }
                Some(RawDuration::Text(s)) if matches!(s.trim(), "" | "0") => Duration::ZERO,
                Some(RawDuration::Text(s)) => {
                    crate::godur::parse(&s).map_err(|e| bad("rate_limit.interval", e))?
                }
            };
            let burst = r.burst.unwrap_or(0);
            if interval.is_zero() {
                None
            } else if burst == 0 {
                return Err(bad(
                    "rate_limit.burst",
                    "must be at least 1 when rate_limit.interval is set".to_owned(),
                ));
            } else {
                Some(RateLimit { interval, burst })
            }
        }
    };

    Ok(WebConfig {
        tls,
        basic_auth_users,
        headers,
        http2,
        rate_limit,
    })
}

/// For [`unique_keys`](super::raw::unique_keys)'s error: the repeated key's dotted path and where it is given
/// ("given twice, at lines 2 and 4"). yaml_serde places the error at the mapping's first key;
/// the repeats are found among the lines of that mapping at its indentation.
fn duplicate_lines(text: &str, e: &yaml_serde::Error) -> Option<(String, String)> {
    let msg = e.to_string();
    let rest = msg.split_once(DUPLICATE)?.1;
    let loc = e.location()?;
    // yaml_serde appends " at line L column C" to the message.
    let name = rest.rsplit_once(" at line ").map_or(rest, |(n, _)| n);
    let section = msg.split_once(": ").map_or("", |(s, _)| s);
    let indent = loc.column().saturating_sub(1);
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate().skip(loc.line().saturating_sub(1)) {
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let at = line.len() - body.len();
        if at < indent {
            break;
        }
        if at == indent {
            let key = body.split_once(':').map_or("", |(k, _)| k.trim());
            if key.trim_matches(|c| c == '"' || c == '\'') == name {
                lines.push((i + 1).to_string());
            }
        }
    }
    let path = if section.is_empty() {
        name.to_owned()
    } else {
        format!("{section}.{name}")
    };
    let reason = if lines.len() >= 2 {
        format!(
            "given twice (YAML keys must be unique), at lines {}",
            lines.join(" and ")
        )
    } else {
        format!(
            "given twice (YAML keys must be unique), in the mapping at line {}",
            loc.line()
        )
    };
    Some((path, reason))
}

fn is_only_comments(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#') || l == "---")
}

/// `$2y$10$` + 22 characters of salt + 31 of hash, in bcrypt's base64 alphabet.
fn is_bcrypt_hash(h: &str) -> bool {
    let b = h.as_bytes();
    b.len() == 60
        && b[0] == b'$'
        && b[1] == b'2'
        && matches!(b[2], b'a' | b'b' | b'y' | b'x')
        && b[3] == b'$'
        && b[4].is_ascii_digit()
        && b[5].is_ascii_digit()
        && b[6] == b'$'
        && (4..=31).contains(&((b[4] - b'0') * 10 + (b[5] - b'0')))
        && b[7..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'.' || *c == b'/')
}
