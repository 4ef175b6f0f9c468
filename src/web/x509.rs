//! The few facts gpu-exporter reads from its TLS material itself: a certificate's `notAfter`
//! (for the expiry self-metric) and what kind of private key a PEM holds (so that an
//! unsupported curve or RSA size is named as such instead of "failed to parse"). The DER is
//! decoded by RustCrypto's `x509-cert` (RFC 5280), `pkcs8` (RFC 5208/5958), `pkcs1` (RFC 8017)
//! and `sec1` (SEC 1 / RFC 5915); nothing here reads DER by hand.

use pkcs8::der::Decode as _;
use pkcs8::ObjectIdentifier;

/// The `notAfter` of an X.509 certificate, in Unix seconds; `None` if `cert` is not one (or
/// its `notAfter` is before 1970, which DER's time types as `x509-cert` reads them cannot
/// hold).
pub fn certificate_not_after(cert: &[u8]) -> Option<i64> {
    let cert = x509_cert::Certificate::from_der(cert).ok()?;
    let not_after = cert.tbs_certificate().validity().not_after;
    i64::try_from(not_after.to_unix_duration().as_secs()).ok()
}

/// What a private key is, as far as choosing an error message needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    /// RSA with a modulus of this many bits.
    Rsa(usize),
    /// ECDSA on the named curve (`P-256`, `P-384`, `P-521`, `secp256k1`, or an OID).
    Ec(String),
    /// Ed25519.
    Ed25519,
    /// Ed448.
    Ed448,
    /// Another algorithm, by OID.
    Other(String),
}

impl std::fmt::Display for KeyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyKind::Rsa(bits) => write!(f, "RSA {bits}-bit"),
            KeyKind::Ec(curve) => write!(f, "ECDSA {curve}"),
            KeyKind::Ed25519 => f.write_str("Ed25519"),
            KeyKind::Ed448 => f.write_str("Ed448"),
            KeyKind::Other(oid) => write!(f, "algorithm {oid}"),
        }
    }
}

/// rsaEncryption (RFC 8017).
const OID_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
/// id-RSASSA-PSS (RFC 8017).
const OID_RSA_PSS: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.10");
/// id-ecPublicKey (RFC 5480).
const OID_EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
/// id-Ed25519 (RFC 8410).
const OID_ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");
/// id-Ed448 (RFC 8410).
const OID_ED448: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.113");

fn curve_name(oid: ObjectIdentifier) -> String {
    match oid.to_string().as_str() {
        "1.2.840.10045.3.1.7" => "P-256".to_owned(),
        "1.3.132.0.34" => "P-384".to_owned(),
        "1.3.132.0.35" => "P-521".to_owned(),
        "1.3.132.0.10" => "secp256k1".to_owned(),
        other => format!("curve {other}"),
    }
}

/// Bits in an unsigned big-endian integer.
fn integer_bits(value: &[u8]) -> usize {
    let v = match value.iter().position(|&b| b != 0) {
        Some(i) => &value[i..],
        None => return 0,
    };
    v.len() * 8 - v[0].leading_zeros() as usize
}

/// The modulus size of an RSAPrivateKey (PKCS #1).
fn rsa_bits(der: &[u8]) -> Option<usize> {
    let key = pkcs1::RsaPrivateKeyRef::from_der(der).ok()?;
    Some(integer_bits(key.modulus.as_bytes()))
}

/// What kind of key a PKCS #8, PKCS #1 (RSA) or SEC1 (EC) private key is; `None` if the DER
/// is none of these.
pub fn key_kind(key: &rustls::pki_types::PrivateKeyDer<'_>) -> Option<KeyKind> {
    use rustls::pki_types::PrivateKeyDer;
    match key {
        PrivateKeyDer::Pkcs1(k) => rsa_bits(k.secret_pkcs1_der()).map(KeyKind::Rsa),
        PrivateKeyDer::Sec1(k) => {
            let key = sec1::EcPrivateKey::from_der(k.secret_sec1_der()).ok()?;
            let curve = key.parameters?.named_curve()?;
            Some(KeyKind::Ec(curve_name(curve)))
        }
        PrivateKeyDer::Pkcs8(k) => {
            let info = pkcs8::PrivateKeyInfoRef::from_der(k.secret_pkcs8_der()).ok()?;
            match info.algorithm.oid {
                OID_RSA | OID_RSA_PSS => rsa_bits(info.private_key.as_bytes()).map(KeyKind::Rsa),
                OID_EC_PUBLIC_KEY => {
                    let curve = info.algorithm.parameters_oid().ok()?;
                    Some(KeyKind::Ec(curve_name(curve)))
                }
                OID_ED25519 => Some(KeyKind::Ed25519),
                OID_ED448 => Some(KeyKind::Ed448),
                other => Some(KeyKind::Other(other.to_string())),
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;

    /// A self-signed certificate whose `notAfter` is `days` days and `secs` seconds after
    /// 1970-01-01 (rcgen encodes years before 2050 as UTCTime, later ones as
    /// GeneralizedTime, as RFC 5280 requires).
    fn cert_expiring(y: i32, m: u8, d: u8, secs: u64) -> Vec<u8> {
        let mut p = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        p.not_before = rcgen::date_time_ymd(2000, 1, 1);
        p.not_after = rcgen::date_time_ymd(y, m, d) + std::time::Duration::from_secs(secs);
        let key = rcgen::KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    /// `der` with the one occurrence of `from` replaced by `to` (of the same length, so that
    /// every DER length stays right).
    fn patched(der: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let at = der
            .windows(from.len())
            .position(|w| w == from)
            .expect("the text is in the DER");
        let mut out = der.to_vec();
        out[at..at + to.len()].copy_from_slice(to);
        out
    }

    #[test]
    fn dates_convert_to_unix_time() {
        // The last UTCTime second, the 32-bit rollover, and a GeneralizedTime.
        let last_utc = cert_expiring(2049, 12, 31, 86_399);
        assert_eq!(certificate_not_after(&last_utc), Some(2_524_607_999));
        assert_eq!(
            certificate_not_after(&cert_expiring(2038, 1, 19, 11_648)),
            Some(2_147_483_648)
        );
        let generalized = cert_expiring(2050, 1, 1, 0);
        assert!(generalized.windows(15).any(|w| w == b"20500101000000Z"));
        assert_eq!(certificate_not_after(&generalized), Some(2_524_608_000));
        // A month 13, a missing `Z`, and a date before 1970 are no `notAfter`.
        for bad in [
            &b"491331235959Z"[..],
            &b"4912312359590"[..],
            &b"500101000000Z"[..],
        ] {
            let cert = patched(&last_utc, b"491231235959Z", bad);
            assert_eq!(certificate_not_after(&cert), None, "{bad:?}");
        }
    }

    #[test]
    fn oids_print_dotted() {
        assert_eq!(OID_RSA.to_string(), "1.2.840.113549.1.1.1");
        assert_eq!(OID_ED25519.to_string(), "1.3.101.112");
        // PrivateKeyInfo { version 0, AlgorithmIdentifier { 1.2.840.10040.4.1 (DSA) }, key }.
        let dsa: &[u8] = &[
            0x30, 0x14, 0x02, 0x01, 0x00, 0x30, 0x09, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x38,
            0x04, 0x01, 0x04, 0x04, 0x02, 0x02, 0x01, 0x01,
        ];
        let kind = key_kind(&PrivateKeyDer::Pkcs8(dsa.to_vec().into())).unwrap();
        assert_eq!(kind, KeyKind::Other("1.2.840.10040.4.1".into()));
        assert_eq!(kind.to_string(), "algorithm 1.2.840.10040.4.1");
    }

    #[test]
    fn truncated_der_is_refused_not_read_past() {
        for der in [
            &[0x30, 0x05, 1, 2][..],
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
            &[0x30],
            &[0x30, 0x00],
        ] {
            assert_eq!(certificate_not_after(der), None, "{der:?}");
            for key in [
                PrivateKeyDer::Pkcs1(der.to_vec().into()),
                PrivateKeyDer::Sec1(der.to_vec().into()),
                PrivateKeyDer::Pkcs8(der.to_vec().into()),
            ] {
                assert_eq!(key_kind(&key), None, "{der:?}");
            }
        }
        let cert = cert_expiring(2049, 12, 31, 0);
        assert_eq!(certificate_not_after(&cert[..cert.len() - 1]), None);
        assert_eq!(integer_bits(&[0x00, 0x80, 0x00]), 16);
        assert_eq!(integer_bits(&[0x01, 0x00]), 9);
    }

    #[test]
    fn key_kinds_are_named_in_every_container() {
        let fixture = |name: &str| {
            let path = format!("{}/tests/fixtures/tls/{name}", env!("CARGO_MANIFEST_DIR"));
            let pem = std::fs::read(&path).expect(&path);
            key_kind(&PrivateKeyDer::from_pem_slice(&pem).expect(&path))
        };
        assert_eq!(fixture("rsa1024.key"), Some(KeyKind::Rsa(1024)));
        assert_eq!(fixture("rsa1024-pkcs1.key"), Some(KeyKind::Rsa(1024)));
        assert_eq!(fixture("p521.key"), Some(KeyKind::Ec("P-521".into())));
        assert_eq!(fixture("p521-sec1.key"), Some(KeyKind::Ec("P-521".into())));
        for (alg, kind) in [
            (&rcgen::PKCS_ECDSA_P256_SHA256, KeyKind::Ec("P-256".into())),
            (&rcgen::PKCS_ECDSA_P384_SHA384, KeyKind::Ec("P-384".into())),
            (&rcgen::PKCS_ED25519, KeyKind::Ed25519),
        ] {
            let key = rcgen::KeyPair::generate_for(alg).unwrap();
            let der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
            assert_eq!(key_kind(&der), Some(kind));
        }
    }
}
