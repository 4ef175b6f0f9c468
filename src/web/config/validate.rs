//! The `tls_server_config` checks: certificate and key given once each (inline or by file),
//! client authentication, TLS versions, cipher suites and curves that rustls can honour.

use std::path::PathBuf;

use super::raw::RawTls;
use super::types::{
    suite_by_name, ClientAuth, Curve, Pem, SuiteName, TlsSettings, TlsVersion, WebConfigError,
};

pub(super) fn validate_tls(
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
            if rustls::pki_types::ServerName::try_from(san.as_str()).is_err() {
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
