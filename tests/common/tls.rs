//! Certificates for the TLS tests, generated per test with rcgen: a CA and the leaves it signs.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA and what it signs.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    /// A self-signed CA named `name` (its common name).
    pub fn new(name: &str) -> Self {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        Self {
            issuer: CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// The CA certificate's PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// (certificate PEM, key PEM) for `sans`, named by the first; `expired` puts validity in
    /// 2000.
    pub fn leaf(&self, sans: &[&str], expired: bool) -> (String, String) {
        self.sign(sans[0], sans, |p| {
            if expired {
                p.not_before = rcgen::date_time_ymd(2000, 1, 1);
                p.not_after = rcgen::date_time_ymd(2000, 2, 1);
            }
        })
    }

    /// (certificate PEM, key PEM) for `sans`, valid until the given date (midnight UTC).
    pub fn leaf_until(&self, sans: &[&str], (y, m, d): (i32, u8, u8)) -> (String, String) {
        self.sign(sans[0], sans, |p| {
            p.not_after = rcgen::date_time_ymd(y, m, d)
        })
    }

    /// (certificate PEM, key PEM) for `sans` with the common name `name`.
    pub fn named_leaf(&self, name: &str, sans: &[&str]) -> (String, String) {
        self.sign(name, sans, |_| {})
    }

    fn sign(
        &self,
        name: &str,
        sans: &[&str],
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> (String, String) {
        let mut p =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        adjust(&mut p);
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}
