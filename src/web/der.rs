//! The few facts gpu-exporter reads from DER itself: a certificate's `notAfter` (for the expiry
//! self-metric) and what kind of private key a PEM holds (so that an unsupported curve or RSA
//! size is named as such instead of "failed to parse"). A minimal reader of DER's
//! tag-length-value encoding (X.690), pure and bounded by its input.

/// One TLV: its tag byte and contents; `rest` follows it.
struct Tlv<'a> {
    tag: u8,
    value: &'a [u8],
    rest: &'a [u8],
}

fn tlv(input: &[u8]) -> Option<Tlv<'_>> {
    let (&tag, input) = input.split_first()?;
    let (&first, mut input) = input.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || input.len() < n {
            return None;
        }
        let mut len = 0usize;
        for &b in &input[..n] {
            len = (len << 8) | usize::from(b);
        }
        input = &input[n..];
        len
    };
    if input.len() < len {
        return None;
    }
    Some(Tlv {
        tag,
        value: &input[..len],
        rest: &input[len..],
    })
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The `notAfter` of an X.509 certificate, in Unix seconds; `None` if `cert` is not one.
pub fn certificate_not_after(cert: &[u8]) -> Option<i64> {
    let certificate = tlv(cert).filter(|t| t.tag == SEQUENCE)?;
    let tbs = tlv(certificate.value).filter(|t| t.tag == SEQUENCE)?;
    let mut fields = tbs.value;
    // [0] EXPLICIT version, when present.
    let first = tlv(fields)?;
    if first.tag == 0xa0 {
        fields = first.rest;
    }
    // serialNumber, signature, issuer, then validity.
    for want in [INTEGER, SEQUENCE, SEQUENCE] {
        fields = tlv(fields).filter(|t| t.tag == want)?.rest;
    }
    let validity = tlv(fields).filter(|t| t.tag == SEQUENCE)?;
    let not_before = tlv(validity.value)?;
    let not_after = tlv(not_before.rest)?;
    parse_time(not_after.tag, not_after.value)
}

/// UTCTime (`YYMMDDHHMMSSZ`, 1950-2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`), as RFC 5280
/// profiles them, to Unix seconds.
fn parse_time(tag: u8, value: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(value).ok()?;
    let digits = text.strip_suffix('Z')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = |s: &str| s.parse::<i64>().ok();
    let (year, rest) = match (tag, digits.len()) {
        (UTC_TIME, 12) => {
            let yy = n(&digits[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
        }
        (GENERALIZED_TIME, 14) => (n(&digits[..4])?, &digits[4..]),
        _ => return None,
    };
    let (month, day) = (n(&rest[..2])?, n(&rest[2..4])?);
    let (hour, minute, second) = (n(&rest[4..6])?, n(&rest[6..8])?, n(&rest[8..10])?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days from 1970-01-01 to the given proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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

const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_RSA_PSS: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a];
const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];
const OID_ED448: &[u8] = &[0x2b, 0x65, 0x71];

fn curve_name(oid: &[u8]) -> String {
    match oid {
        [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07] => "P-256".to_owned(),
        [0x2b, 0x81, 0x04, 0x00, 0x22] => "P-384".to_owned(),
        [0x2b, 0x81, 0x04, 0x00, 0x23] => "P-521".to_owned(),
        [0x2b, 0x81, 0x04, 0x00, 0x0a] => "secp256k1".to_owned(),
        other => format!("curve {}", oid_text(other)),
    }
}

/// Dotted text of an OID's contents.
fn oid_text(oid: &[u8]) -> String {
    let mut parts = Vec::new();
    let mut n: u64 = 0;
    for (i, &b) in oid.iter().enumerate() {
        n = (n << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if parts.is_empty() {
                let first = (n / 40).min(2);
                parts.push(first.to_string());
                parts.push((n - first * 40).to_string());
            } else {
                parts.push(n.to_string());
            }
            n = 0;
        }
        if i > 64 {
            break;
        }
    }
    parts.join(".")
}

/// Bits in an unsigned big-endian INTEGER's contents.
fn integer_bits(value: &[u8]) -> usize {
    let v = match value.iter().position(|&b| b != 0) {
        Some(i) => &value[i..],
        None => return 0,
    };
    v.len() * 8 - v[0].leading_zeros() as usize
}

/// RSAPrivateKey (PKCS #1): version, then the modulus.
fn rsa_bits(der: &[u8]) -> Option<usize> {
    let seq = tlv(der).filter(|t| t.tag == SEQUENCE)?;
    let version = tlv(seq.value).filter(|t| t.tag == INTEGER)?;
    let modulus = tlv(version.rest).filter(|t| t.tag == INTEGER)?;
    Some(integer_bits(modulus.value))
}

/// What kind of key a PKCS #8, PKCS #1 (RSA) or SEC1 (EC) private key is; `None` if the DER
/// is none of these.
pub fn key_kind(key: &rustls::pki_types::PrivateKeyDer<'_>) -> Option<KeyKind> {
    use rustls::pki_types::PrivateKeyDer;
    match key {
        PrivateKeyDer::Pkcs1(k) => rsa_bits(k.secret_pkcs1_der()).map(KeyKind::Rsa),
        PrivateKeyDer::Sec1(k) => {
            // ECPrivateKey: version, privateKey, [0] parameters (the curve OID).
            let seq = tlv(k.secret_sec1_der()).filter(|t| t.tag == SEQUENCE)?;
            let version = tlv(seq.value).filter(|t| t.tag == INTEGER)?;
            let private = tlv(version.rest).filter(|t| t.tag == OCTET_STRING)?;
            let params = tlv(private.rest).filter(|t| t.tag == 0xa0)?;
            let oid = tlv(params.value).filter(|t| t.tag == OID)?;
            Some(KeyKind::Ec(curve_name(oid.value)))
        }
        PrivateKeyDer::Pkcs8(k) => {
            // PrivateKeyInfo: version, AlgorithmIdentifier { algorithm, parameters },
            // privateKey.
            let seq = tlv(k.secret_pkcs8_der()).filter(|t| t.tag == SEQUENCE)?;
            let version = tlv(seq.value).filter(|t| t.tag == INTEGER)?;
            let alg = tlv(version.rest).filter(|t| t.tag == SEQUENCE)?;
            let private = tlv(alg.rest).filter(|t| t.tag == OCTET_STRING)?;
            let oid = tlv(alg.value).filter(|t| t.tag == OID)?;
            match oid.value {
                OID_RSA | OID_RSA_PSS => rsa_bits(private.value).map(KeyKind::Rsa),
                OID_EC_PUBLIC_KEY => {
                    let curve = tlv(oid.rest).filter(|t| t.tag == OID)?;
                    Some(KeyKind::Ec(curve_name(curve.value)))
                }
                OID_ED25519 => Some(KeyKind::Ed25519),
                OID_ED448 => Some(KeyKind::Ed448),
                other => Some(KeyKind::Other(oid_text(other))),
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_convert_to_unix_time() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(parse_time(UTC_TIME, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(parse_time(UTC_TIME, b"500101000000Z"), Some(-631_152_000));
        assert_eq!(
            parse_time(GENERALIZED_TIME, b"20380119031408Z"),
            Some(2_147_483_648)
        );
        assert_eq!(parse_time(GENERALIZED_TIME, b"2038011903140Z"), None);
        assert_eq!(parse_time(UTC_TIME, b"491331235959Z"), None);
        assert_eq!(parse_time(UTC_TIME, b"4912312359590"), None);
    }

    #[test]
    fn oids_print_dotted() {
        assert_eq!(oid_text(OID_RSA), "1.2.840.113549.1.1.1");
        assert_eq!(oid_text(OID_ED25519), "1.3.101.112");
    }

    #[test]
    fn truncated_der_is_refused_not_read_past() {
        assert!(tlv(&[0x30, 0x05, 1, 2]).is_none());
        assert!(tlv(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
        assert!(tlv(&[0x30]).is_none());
        assert_eq!(certificate_not_after(&[0x30, 0x00]), None);
        assert_eq!(integer_bits(&[0x00, 0x80, 0x00]), 16);
        assert_eq!(integer_bits(&[0x01, 0x00]), 9);
    }
}
