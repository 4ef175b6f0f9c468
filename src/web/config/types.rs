//! What a parsed web configuration is: [`WebConfig`] and its TLS, rate-limit and auth parts,
//! each value mapped to what rustls can do; and [`WebConfigError`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

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
    /// The YAML is nested deeper than [`crate::yamldepth::MAX_DEPTH`] levels (checked before it
    /// is parsed: parsing takes time quadratic in the depth).
    #[error("{origin}:{line}: nested more than {limit} levels deep; refused")]
    TooDeep {
        /// The file name.
        origin: String,
        /// 1-based line where the limit is passed.
        line: usize,
        /// The limit.
        limit: usize,
    },
    /// The YAML does not parse, or has an unknown key or a value of the wrong type.
    #[error("{origin}: {source}")]
    Yaml {
        /// The file name.
        origin: String,
        /// yaml_serde's message (names the key, line and column).
        #[source]
        source: yaml_serde::Error,
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
    pub(super) fn parse(s: &str) -> Option<Self> {
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
pub(super) enum SuiteName {
    Tls12(CipherSuite),
    /// A TLS 1.3 suite: Go ignores `cipher_suites` for TLS 1.3, and so do we.
    Tls13,
    /// A suite Go knows that rustls deliberately lacks (CBC, RSA key exchange, 3DES, RC4).
    Unsupported,
}

pub(super) fn suite_by_name(s: &str) -> Option<SuiteName> {
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
