//! The `--web-config-file` format (Prometheus exporter-toolkit's `web-config.yml`), parsed and
//! validated without touching the file system.
//!
//! [`parse`] turns YAML text into a [`WebConfig`] whose every value has been checked: TLS
//! versions, client-auth policy, cipher suites and curves are mapped to what rustls can do, and
//! anything it cannot (TLS 1.0/1.1, CBC suites, P-521) is an error naming the key, never a silent
//! downgrade. Unknown keys are errors too (`deny_unknown_fields`). Reading certificate files is
//! [`super::tls`]'s business; this module only records their paths.

use crate::fsread::{self, Cap, Symlinks};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Errors in a web configuration file. Each names the file and the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    /// The file could not be read.
    #[error("reading web configuration {path}")]
    Io {
        /// The path given.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The YAML does not parse, or has an unknown key or a value of the wrong type.
    #[error("{origin}: {source}")]
    Yaml {
        /// The file name.
        origin: String,
        /// serde_yaml's message (names the key, line and column).
        #[source]
        source: serde_yaml::Error,
    },
    /// A value is well-formed YAML but not acceptable.
    #[error("{origin}: {key}: {reason}")]
    Invalid {
        /// The file name.
        origin: String,
        /// The key, as a dotted path (`tls_server_config.min_version`).
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A certificate, key or CA the file names cannot be read or used.
    #[error("{origin}: {key}: {what}")]
    Material {
        /// The web configuration file.
        origin: String,
        /// The key naming the material (`tls_server_config.cert_file`).
        key: String,
        /// What was being done (`reading /etc/tls/tls.crt`).
        what: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Protocol versions rustls can speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

/// exporter-toolkit's `client_auth_type` (Go's `tls.ClientAuthType` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    NoClientCert,
    /// A certificate is asked for but not required and not verified.
    RequestClientCert,
    /// A certificate is required but not verified against a CA.
    RequireAnyClientCert,
    /// A certificate is optional; if sent, it must verify against the client CA.
    VerifyClientCertIfGiven,
    /// A certificate is required and must verify against the client CA (mTLS).
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "" | "NoClientCert" => Self::NoClientCert,
            "RequestClientCert" => Self::RequestClientCert,
            "RequireAnyClientCert" => Self::RequireAnyClientCert,
            "VerifyClientCertIfGiven" => Self::VerifyClientCertIfGiven,
            "RequireAndVerifyClientCert" => Self::RequireAndVerifyClientCert,
            _ => return None,
        })
    }

    /// Whether client certificates are checked against `client_ca_file`.
    pub fn verifies(self) -> bool {
        matches!(
            self,
            Self::VerifyClientCertIfGiven | Self::RequireAndVerifyClientCert
        )
    }

    /// Whether a client without a certificate is turned away.
    pub fn mandatory(self) -> bool {
        matches!(
            self,
            Self::RequireAnyClientCert | Self::RequireAndVerifyClientCert
        )
    }
}

/// TLS 1.2 cipher suites rustls (ring provider) implements, by their Go names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CipherSuite {
    /// `TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256`.
    EcdheEcdsaAes128Gcm,
    /// `TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384`.
    EcdheEcdsaAes256Gcm,
    /// `TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305(_SHA256)`.
    EcdheEcdsaChacha20,
    /// `TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`.
    EcdheRsaAes128Gcm,
    /// `TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384`.
    EcdheRsaAes256Gcm,
    /// `TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305(_SHA256)`.
    EcdheRsaChacha20,
}

/// What a Go cipher-suite name means to us.
enum SuiteName {
    Tls12(CipherSuite),
    /// A TLS 1.3 suite: Go ignores `cipher_suites` for TLS 1.3, and so do we.
    Tls13,
    /// A suite Go knows that rustls deliberately lacks (CBC, RSA key exchange, 3DES, RC4).
    Unsupported,
}

fn suite_by_name(s: &str) -> Option<SuiteName> {
    use CipherSuite::*;
    Some(match s {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => SuiteName::Tls12(EcdheEcdsaAes128Gcm),
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => SuiteName::Tls12(EcdheEcdsaAes256Gcm),
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => SuiteName::Tls12(EcdheEcdsaChacha20),
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => SuiteName::Tls12(EcdheRsaAes128Gcm),
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => SuiteName::Tls12(EcdheRsaAes256Gcm),
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            SuiteName::Tls12(EcdheRsaChacha20)
        }
        "TLS_AES_128_GCM_SHA256" | "TLS_AES_256_GCM_SHA384" | "TLS_CHACHA20_POLY1305_SHA256" => {
            SuiteName::Tls13
        }
        "TLS_RSA_WITH_RC4_128_SHA"
        | "TLS_RSA_WITH_3DES_EDE_CBC_SHA"
        | "TLS_RSA_WITH_AES_128_CBC_SHA"
        | "TLS_RSA_WITH_AES_256_CBC_SHA"
        | "TLS_RSA_WITH_AES_128_CBC_SHA256"
        | "TLS_RSA_WITH_AES_128_GCM_SHA256"
        | "TLS_RSA_WITH_AES_256_GCM_SHA384"
        | "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_RC4_128_SHA"
        | "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256"
        | "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256" => SuiteName::Unsupported,
        _ => return None,
    })
}

/// Key-exchange groups rustls (ring provider) implements, by Go's `tls.CurveID` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Curve {
    /// `X25519`.
    X25519,
    /// `CurveP256`.
    P256,
    /// `CurveP384`.
    P384,
}

/// Where PEM data comes from: a file (re-read on rotation) or inline in the web config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pem {
    /// A path (`cert_file`, `key_file`, `client_ca_file`).
    File(PathBuf),
    /// Inline PEM text (`cert`, `key`, `client_ca`).
    Inline(String),
}

/// Validated `tls_server_config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The server certificate chain.
    pub cert: Pem,
    /// The server private key.
    pub key: Pem,
    /// Client-certificate policy.
    pub client_auth: ClientAuth,
    /// CAs client certificates must chain to (required when `client_auth` verifies).
    pub client_ca: Option<Pem>,
    /// SANs a client certificate must carry one of (DNS names or IP addresses); empty: any.
    pub client_allowed_sans: Vec<String>,
    /// Lowest acceptable version.
    pub min_version: TlsVersion,
    /// Highest acceptable version.
    pub max_version: TlsVersion,
    /// TLS 1.2 suites in preference order; empty: rustls's defaults.
    pub cipher_suites: Vec<CipherSuite>,
    /// Whether the server's order wins over the client's.
    pub prefer_server_cipher_suites: bool,
    /// Key-exchange groups in preference order; empty: rustls's defaults.
    pub curve_preferences: Vec<Curve>,
}

/// A token bucket for all requests (`rate_limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// One token is added per interval.
    pub interval: Duration,
    /// Bucket size.
    pub burst: u32,
}

/// A validated web configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebConfig {
    /// TLS, if `tls_server_config` names a certificate.
    pub tls: Option<TlsSettings>,
    /// `basic_auth_users`: user → bcrypt hash. Empty: no authentication.
    pub basic_auth_users: BTreeMap<String, String>,
    /// Extra response headers, in file order of the allowed set.
    pub headers: Vec<(String, String)>,
    /// `http_server_config.http2` (accepted; gpu-exporter serves HTTP/1.1 only).
    pub http2: bool,
    /// `rate_limit`, if set with a non-zero interval.
    pub rate_limit: Option<RateLimit>,
}

// --- the file as written -------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tls_server_config: Option<RawTls>,
    #[serde(default)]
    http_server_config: Option<RawHttp>,
    #[serde(default, deserialize_with = "unique_keys")]
    basic_auth_users: Option<BTreeMap<String, String>>,
    #[serde(default)]
    rate_limit: Option<RawRateLimit>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: Option<String>,
    key: Option<String>,
    client_ca: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<String>,
    client_allowed_sans: Option<Vec<String>>,
    min_version: Option<String>,
    max_version: Option<String>,
    cipher_suites: Option<Vec<String>>,
    prefer_server_cipher_suites: Option<bool>,
    curve_preferences: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    http2: Option<bool>,
    #[serde(default, deserialize_with = "unique_keys")]
    headers: Option<BTreeMap<String, String>>,
}

/// A mapping whose keys must be distinct: YAML parsers differ on a repeated key (most keep the
/// last), so a user or header given twice is an error naming the key and where it is, never a
/// silent pick.
fn unique_keys<'de, D>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = Option<BTreeMap<String, String>>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a mapping of names to strings")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_map(Unique)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(k) = map.next_key::<String>()? {
                let v: String = map.next_value()?;
                if out.contains_key(&k) {
                    return Err(serde::de::Error::custom(format!("{DUPLICATE}{k}")));
                }
                out.insert(k, v);
            }
            Ok(Some(out))
        }
    }
    d.deserialize_option(Unique)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    interval: Option<RawDuration>,
    burst: Option<u32>,
}

/// A duration as YAML gives it: `100ms` is a string, a bare `0` an integer.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawDuration {
    Number(u64),
    Text(String),
}

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

/// Parses and validates web configuration text. `origin` names it in errors.
///
/// # Errors
/// [`WebConfigError::Yaml`] for syntax, unknown keys and wrong types,
/// [`WebConfigError::Invalid`] for values gpu-exporter cannot honour.
pub fn parse(text: &str, origin: &str) -> Result<WebConfig, WebConfigError> {
    // An empty file (or one with only comments) is a valid "no TLS, no auth" config, as in Go.
    let raw: RawFile = if text.trim().is_empty() || is_only_comments(text) {
        RawFile::default()
    } else {
        serde_yaml::from_str::<Option<RawFile>>(text)
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

/// Marks [`unique_keys`]'s error, followed by the key.
const DUPLICATE: &str = "duplicate key: ";

/// For [`unique_keys`]'s error: the repeated key's dotted path and where it is given
/// ("given twice, at lines 2 and 4"). serde_yaml places the error at the mapping's first key;
/// the repeats are found among the lines of that mapping at its indentation.
fn duplicate_lines(text: &str, e: &serde_yaml::Error) -> Option<(String, String)> {
    let msg = e.to_string();
    let rest = msg.split_once(DUPLICATE)?.1;
    let loc = e.location()?;
    // serde_yaml appends " at line L column C" to the message.
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

fn validate_tls(
    t: RawTls,
    bad: &impl Fn(&str, String) -> WebConfigError,
) -> Result<Option<TlsSettings>, WebConfigError> {
    let k = |name: &str| format!("tls_server_config.{name}");
    let pem = |inline: Option<String>,
               file: Option<String>,
               inline_key: &str,
               file_key: &str|
     -> Result<Option<Pem>, WebConfigError> {
        let inline = inline.filter(|s| !s.is_empty());
        let file = file.filter(|s| !s.is_empty());
        match (inline, file) {
            (Some(_), Some(_)) => Err(bad(
                &k(inline_key),
                format!("set either {inline_key} or {file_key}, not both"),
            )),
            (Some(s), None) => Ok(Some(Pem::Inline(s))),
            (None, Some(f)) => Ok(Some(Pem::File(PathBuf::from(f)))),
            (None, None) => Ok(None),
        }
    };
    let cert = pem(t.cert, t.cert_file, "cert", "cert_file")?;
    let key = pem(t.key, t.key_file, "key", "key_file")?;
    let client_ca = pem(t.client_ca, t.client_ca_file, "client_ca", "client_ca_file")?;

    let (cert, key) = match (cert, key) {
        (None, None) => {
            // exporter-toolkit: a tls_server_config without a certificate means plain HTTP,
            // but anything else in it would then be silently ignored; refuse that.
            let others = t.client_auth_type.is_some()
                || client_ca.is_some()
                || t.min_version.is_some()
                || t.cipher_suites.is_some();
            if others {
                return Err(bad(
                    &k("cert_file"),
                    "missing: TLS settings are given but no certificate (cert_file or cert)"
                        .to_owned(),
                ));
            }
            return Ok(None);
        }
        (Some(_), None) => {
            return Err(bad(
                &k("key_file"),
                "missing: a certificate needs its key (key_file or key)".to_owned(),
            ))
        }
        (None, Some(_)) => {
            return Err(bad(
                &k("cert_file"),
                "missing: a key needs its certificate (cert_file or cert)".to_owned(),
            ))
        }
        (Some(c), Some(k)) => (c, k),
    };

    let client_auth = match t.client_auth_type.as_deref() {
        None => ClientAuth::NoClientCert,
        Some(s) => ClientAuth::parse(s).ok_or_else(|| {
            bad(
                &k("client_auth_type"),
                format!("{s:?}: expected NoClientCert, RequestClientCert, RequireAnyClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert"),
            )
        })?,
    };
    if client_auth.verifies() && client_ca.is_none() {
        return Err(bad(
            &k("client_ca_file"),
            format!("missing: client_auth_type {client_auth:?} needs the CA that signs client certificates"),
        ));
    }
    let client_allowed_sans = t.client_allowed_sans.unwrap_or_default();
    if !client_allowed_sans.is_empty() {
        if !client_auth.mandatory() {
            return Err(bad(
                &k("client_allowed_sans"),
                "needs client_auth_type RequireAnyClientCert or RequireAndVerifyClientCert (otherwise a client can connect without a certificate)".to_owned(),
            ));
        }
        for san in &client_allowed_sans {
            if rustls_pki_types::ServerName::try_from(san.as_str()).is_err() {
                return Err(bad(
                    &k("client_allowed_sans"),
                    format!("{san:?}: only DNS names and IP addresses can be matched"),
                ));
            }
        }
    }

    let version = |key: &str, v: Option<&str>, default: TlsVersion| {
        match v {
        None | Some("") => Ok(default),
        Some("TLS13") => Ok(TlsVersion::Tls13),
        Some("TLS12") => Ok(TlsVersion::Tls12),
        Some(old @ ("TLS11" | "TLS10")) => Err(bad(
            &k(key),
            format!("{old}: rustls does not support TLS 1.0 or 1.1 (both are deprecated by RFC 8996); use TLS12 or TLS13"),
        )),
        Some(other) => Err(bad(
            &k(key),
            format!("{other:?}: expected TLS12 or TLS13"),
        )),
    }
    };
    let min_version = version("min_version", t.min_version.as_deref(), TlsVersion::Tls12)?;
    let max_version = version("max_version", t.max_version.as_deref(), TlsVersion::Tls13)?;
    if min_version > max_version {
        return Err(bad(
            &k("min_version"),
            "is higher than max_version".to_owned(),
        ));
    }

    let mut cipher_suites = Vec::new();
    for name in t.cipher_suites.unwrap_or_default() {
        match suite_by_name(&name) {
            Some(SuiteName::Tls12(s)) => {
                if !cipher_suites.contains(&s) {
                    cipher_suites.push(s);
                }
            }
            Some(SuiteName::Tls13) => {}
            Some(SuiteName::Unsupported) => {
                return Err(bad(
                    &k("cipher_suites"),
                    format!("{name}: rustls does not implement this suite (no CBC, RC4, 3DES or static-RSA suites); use an ECDHE AES-GCM or CHACHA20 suite"),
                ))
            }
            None => {
                return Err(bad(
                    &k("cipher_suites"),
                    format!("{name:?}: unknown cipher suite (Go names, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)"),
                ))
            }
        }
    }
    let mut curve_preferences = Vec::new();
    for name in t.curve_preferences.unwrap_or_default() {
        let c = match name.as_str() {
            "X25519" => Curve::X25519,
            "CurveP256" | "P256" | "P-256" => Curve::P256,
            "CurveP384" | "P384" | "P-384" => Curve::P384,
            "CurveP521" | "P521" | "P-521" | "X25519MLKEM768" => {
                return Err(bad(
                    &k("curve_preferences"),
                    format!("{name}: not supported by rustls's ring provider; use X25519, CurveP256 or CurveP384"),
                ))
            }
            _ => {
                return Err(bad(
                    &k("curve_preferences"),
                    format!("{name:?}: unknown curve; expected X25519, CurveP256 or CurveP384"),
                ))
            }
        };
        if !curve_preferences.contains(&c) {
            curve_preferences.push(c);
        }
    }
    Ok(Some(TlsSettings {
        cert,
        key,
        client_auth,
        client_ca,
        client_allowed_sans,
        min_version,
        max_version,
        cipher_suites,
        prefer_server_cipher_suites: t.prefer_server_cipher_suites.unwrap_or(true),
        curve_preferences,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "$2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG";

    fn err(text: &str) -> String {
        parse(text, "web.yml").unwrap_err().to_string()
    }

    #[test]
    fn empty_and_comment_only_files_mean_plain_http() {
        assert_eq!(
            parse("", "w").unwrap(),
            WebConfig {
                http2: true,
                ..Default::default()
            }
        );
        assert_eq!(parse("# nothing\n---\n", "w").unwrap().tls, None);
    }

    #[test]
    fn the_helm_chart_file_parses() {
        // As rendered by dcgm-exporter's deployment/templates/web-config-configmap.yaml with
        // TLS, a client CA and one basic-auth user (Helm's htpasswd emits $2a$).
        let text = format!(
            "tls_server_config:\n   cert_file: \"/etc/dcgm-exporter/tls/tls.crt\"\n   key_file: \"/etc/dcgm-exporter/tls/tls.key\"\n   client_auth_type: RequireAndVerifyClientCert\n   client_ca_file: \"/etc/dcgm-exporter/tls/ca.crt\"\nbasic_auth_users:\n  alice: {}\n",
            HASH.replacen("$2y$", "$2a$", 1)
        );
        let c = parse(&text, "web-config.yaml").unwrap();
        let tls = c.tls.unwrap();
        assert_eq!(tls.cert, Pem::File("/etc/dcgm-exporter/tls/tls.crt".into()));
        assert_eq!(tls.client_auth, ClientAuth::RequireAndVerifyClientCert);
        assert_eq!(
            tls.client_ca,
            Some(Pem::File("/etc/dcgm-exporter/tls/ca.crt".into()))
        );
        assert_eq!(
            (tls.min_version, tls.max_version),
            (TlsVersion::Tls12, TlsVersion::Tls13)
        );
        assert!(tls.prefer_server_cipher_suites);
        assert_eq!(c.basic_auth_users.len(), 1);
    }

    #[test]
    fn unknown_keys_are_named_with_file_and_line() {
        let e = err("tls_server_config:\n  cert_file: a\n  key_file: b\n  cert_fil: c\n");
        assert!(e.starts_with("web.yml: "), "{e}");
        assert!(e.contains("unknown field `cert_fil`"), "{e}");
        assert!(e.contains("line 4"), "{e}");
        let e = err("basic_auth:\n  a: b\n");
        assert!(e.contains("unknown field `basic_auth`"), "{e}");
        let e = err("http_server_config:\n  http3: true\n");
        assert!(e.contains("unknown field `http3`"), "{e}");
    }

    #[test]
    fn old_tls_versions_are_refused_with_the_reason() {
        let base = "tls_server_config:\n  cert_file: a\n  key_file: b\n";
        let e = err(&format!("{base}  min_version: TLS10\n"));
        assert!(
            e.contains(
                "tls_server_config.min_version: TLS10: rustls does not support TLS 1.0 or 1.1"
            ),
            "{e}"
        );
        let e = err(&format!("{base}  max_version: TLS99\n"));
        assert!(
            e.contains("tls_server_config.max_version: \"TLS99\""),
            "{e}"
        );
        let e = err(&format!(
            "{base}  min_version: TLS13\n  max_version: TLS12\n"
        ));
        assert!(e.contains("higher than max_version"), "{e}");
        let ok = parse(&format!("{base}  min_version: TLS13\n"), "w").unwrap();
        assert_eq!(ok.tls.unwrap().min_version, TlsVersion::Tls13);
    }

    #[test]
    fn client_auth_types_and_their_requirements() {
        let base = "tls_server_config:\n  cert_file: a\n  key_file: b\n";
        for (name, want) in [
            ("NoClientCert", ClientAuth::NoClientCert),
            ("RequestClientCert", ClientAuth::RequestClientCert),
            ("RequireAnyClientCert", ClientAuth::RequireAnyClientCert),
        ] {
            let c = parse(&format!("{base}  client_auth_type: {name}\n"), "w").unwrap();
            assert_eq!(c.tls.unwrap().client_auth, want);
        }
        let e = err(&format!(
            "{base}  client_auth_type: RequireAndVerifyClientCert\n"
        ));
        assert!(
            e.contains("tls_server_config.client_ca_file: missing"),
            "{e}"
        );
        let e = err(&format!("{base}  client_auth_type: Sometimes\n"));
        assert!(
            e.contains("tls_server_config.client_auth_type: \"Sometimes\""),
            "{e}"
        );
        let e = err(&format!("{base}  client_allowed_sans: [a.example]\n"));
        assert!(
            e.contains("needs client_auth_type RequireAnyClientCert"),
            "{e}"
        );
        let c = parse(
            &format!("{base}  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: [prometheus.monitoring, 10.0.0.1]\n"),
            "w",
        )
        .unwrap();
        assert_eq!(c.tls.unwrap().client_allowed_sans.len(), 2);
    }

    #[test]
    fn cert_and_key_must_come_in_pairs_and_once() {
        let e = err("tls_server_config:\n  cert_file: a\n");
        assert!(e.contains("tls_server_config.key_file: missing"), "{e}");
        let e = err("tls_server_config:\n  key: x\n");
        assert!(e.contains("tls_server_config.cert_file: missing"), "{e}");
        let e = err("tls_server_config:\n  cert: x\n  cert_file: a\n  key_file: b\n");
        assert!(e.contains("set either cert or cert_file"), "{e}");
        let e = err("tls_server_config:\n  client_auth_type: RequireAnyClientCert\n");
        assert!(e.contains("no certificate"), "{e}");
        let c = parse("tls_server_config:\n  cert: CERT\n  key: KEY\n", "w").unwrap();
        assert_eq!(c.tls.unwrap().key, Pem::Inline("KEY".into()));
    }

    #[test]
    fn cipher_suites_and_curves_map_to_rustls_or_are_refused() {
        let base = "tls_server_config:\n  cert_file: a\n  key_file: b\n";
        let c = parse(
            &format!("{base}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, TLS_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305]\n  curve_preferences: [X25519, CurveP256]\n"),
            "w",
        )
        .unwrap();
        let t = c.tls.unwrap();
        assert_eq!(
            t.cipher_suites,
            vec![
                CipherSuite::EcdheRsaAes256Gcm,
                CipherSuite::EcdheRsaChacha20
            ]
        );
        assert_eq!(t.curve_preferences, vec![Curve::X25519, Curve::P256]);
        let e = err(&format!(
            "{base}  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n"
        ));
        assert!(e.contains("rustls does not implement this suite"), "{e}");
        let e = err(&format!("{base}  cipher_suites: [FAST]\n"));
        assert!(e.contains("unknown cipher suite"), "{e}");
        let e = err(&format!("{base}  curve_preferences: [CurveP521]\n"));
        assert!(
            e.contains("tls_server_config.curve_preferences: CurveP521"),
            "{e}"
        );
    }

    #[test]
    fn basic_auth_hashes_are_checked() {
        let c = parse(&format!("basic_auth_users:\n  prom: {HASH}\n"), "w").unwrap();
        assert_eq!(c.basic_auth_users["prom"], HASH);
        let e = err("basic_auth_users:\n  prom: hunter2\n");
        assert!(
            e.contains("basic_auth_users.prom: not a bcrypt hash"),
            "{e}"
        );
        let e = err(&format!("basic_auth_users:\n  \"a:b\": {HASH}\n"));
        assert!(e.contains("cannot contain ':'"), "{e}");
    }

    #[test]
    fn a_user_or_header_given_twice_is_refused_with_its_line() {
        let e = err(&format!(
            "basic_auth_users:\n  prom: {HASH}\n  alice: {HASH}\n  prom: {HASH}\n"
        ));
        assert_eq!(
            e,
            "web.yml: basic_auth_users.prom: given twice (YAML keys must be unique), at lines 2 and 4"
        );
        let e = err("http_server_config:\n  headers:\n    X-Frame-Options: deny\n    # again\n    \"X-Frame-Options\": sameorigin\n");
        assert_eq!(
            e,
            "web.yml: http_server_config.headers.X-Frame-Options: given twice (YAML keys must be unique), at lines 3 and 5"
        );
        // Flow style: the mapping is named.
        let e = err(&format!("basic_auth_users: {{a: {HASH}, a: {HASH}}}\n"));
        assert!(e.contains("basic_auth_users.a: given twice"), "{e}");
        // An empty mapping value is still no users.
        assert!(parse("basic_auth_users:\n", "w")
            .unwrap()
            .basic_auth_users
            .is_empty());
    }

    #[test]
    fn headers_are_limited_to_the_toolkit_set() {
        let c = parse(
            "http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    Strict-Transport-Security: max-age=31536000\n    X-XSS-Protection: \"\"\n",
            "w",
        )
        .unwrap();
        assert!(!c.http2);
        assert_eq!(c.headers.len(), 2);
        let e = err("http_server_config:\n  headers:\n    Set-Cookie: a=b\n");
        assert!(
            e.contains("http_server_config.headers.Set-Cookie: this header cannot be configured"),
            "{e}"
        );
        let e = err("http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n");
        assert!(e.contains("expected nosniff"), "{e}");
    }

    #[test]
    fn rate_limit_parses_and_zero_disables_it() {
        let c = parse("rate_limit:\n  interval: 100ms\n  burst: 5\n", "w").unwrap();
        assert_eq!(
            c.rate_limit,
            Some(RateLimit {
                interval: Duration::from_millis(100),
                burst: 5
            })
        );
        assert_eq!(
            parse("rate_limit:\n  interval: 0\n  burst: 5\n", "w")
                .unwrap()
                .rate_limit,
            None
        );
        // Go's syntax, as exporter-toolkit reads it (time.ParseDuration).
        for (text, want) in [
            ("1h30m", Duration::from_secs(5400)),
            ("1.5s", Duration::from_millis(1500)),
            ("500us", Duration::from_micros(500)),
        ] {
            let c = parse(
                &format!("rate_limit:\n  interval: {text}\n  burst: 5\n"),
                "w",
            );
            assert_eq!(c.unwrap().rate_limit.unwrap().interval, want, "{text}");
        }
        let e = err("rate_limit:\n  interval: fast\n  burst: 5\n");
        assert!(e.contains("rate_limit.interval"), "{e}");
        let e = err("rate_limit:\n  interval: 1s\n");
        assert!(e.contains("rate_limit.burst"), "{e}");
    }

    #[test]
    fn wrong_types_are_named() {
        let e = err("tls_server_config:\n  cert_file: a\n  key_file: b\n  prefer_server_cipher_suites: maybe\n");
        assert!(e.contains("prefer_server_cipher_suites"), "{e}");
        let e = err("- just\n- a list\n");
        assert!(e.starts_with("web.yml: "), "{e}");
    }

    #[test]
    fn the_config_and_its_pem_files_are_read_through_the_bounded_reader() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("web.yml");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // A FIFO would block the reader (and, for a key file, every new connection) for ever.
        let e = crate::error_chain(&load(&fifo).unwrap_err());
        assert!(
            e.ends_with("web.yml: is a FIFO (named pipe), not a regular file; refused"),
            "{e}"
        );
        let e = crate::web::tls::read_pem_file(&fifo).unwrap_err();
        assert_eq!(e.reason(), "not_regular");
        let e = crate::error_chain(&load(std::path::Path::new("/dev/zero")).unwrap_err());
        assert!(
            e.ends_with("/dev/zero: is a character device, not a regular file; refused"),
            "{e}"
        );
        // A Secret mount: the key is a link through ..data, and is read.
        std::fs::create_dir(dir.path().join("..v1")).unwrap();
        std::fs::write(dir.path().join("..v1/tls.key"), "key").unwrap();
        std::os::unix::fs::symlink("..v1", dir.path().join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/tls.key", dir.path().join("tls.key")).unwrap();
        assert_eq!(
            crate::web::tls::read_pem_file(&dir.path().join("tls.key")).unwrap(),
            b"key"
        );
    }
}
