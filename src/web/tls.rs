//! Turns validated [`TlsSettings`] into a rustls [`ServerConfig`]: reads the PEM material,
//! restricts the ring provider to the configured suites, groups and versions, and installs the
//! client-certificate policy.
//!
//! Go's `RequestClientCert`/`RequireAnyClientCert` accept any certificate without checking its
//! chain; rustls has no such verifier, so [`AnyClientCert`] is one (it still checks the handshake
//! signature, so the client must hold the key). `client_allowed_sans` wraps whichever verifier
//! is in use and rejects a certificate none of whose SANs is listed.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};

use super::config::{CipherSuite, ClientAuth, Curve, Pem, TlsSettings, TlsVersion, WebConfigError};

/// Reads the bytes of a PEM source.
pub(crate) fn read_pem(pem: &Pem, key: &str, origin: &str) -> Result<Vec<u8>, WebConfigError> {
    match pem {
        Pem::Inline(s) => Ok(s.as_bytes().to_vec()),
        Pem::File(p) => read_pem_file(p)
            .map_err(|e| material(origin, key, format!("reading {}", p.display()), e)),
    }
}

/// Reads a PEM file through the bounded reader: a regular file (links followed, as in a
/// Secret mount) of at most [`crate::fsread::Cap::PEM`] bytes, never waiting on a FIFO.
pub(crate) fn read_pem_file(path: &std::path::Path) -> Result<Vec<u8>, crate::fsread::ReadError> {
    crate::fsread::read(
        path,
        crate::fsread::Cap::PEM,
        crate::fsread::Symlinks::Follow,
    )
}

fn material(
    origin: &str,
    key: &str,
    what: String,
    source: impl std::error::Error + Send + Sync + 'static,
) -> WebConfigError {
    WebConfigError::Material {
        origin: origin.to_owned(),
        key: format!("tls_server_config.{key}"),
        what,
        source: Box::new(source),
    }
}

fn describe(pem: &Pem) -> String {
    match pem {
        Pem::File(p) => p.display().to_string(),
        Pem::Inline(_) => "inline PEM".to_owned(),
    }
}

fn certificates(
    pem: &Pem,
    key: &str,
    origin: &str,
) -> Result<Vec<CertificateDer<'static>>, WebConfigError> {
    let bytes = read_pem(pem, key, origin)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| material(origin, key, format!("parsing {}", describe(pem)), e))?;
    if certs.is_empty() {
        return Err(WebConfigError::Invalid {
            origin: origin.to_owned(),
            key: format!("tls_server_config.{key}"),
            reason: format!(
                "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) found",
                describe(pem)
            ),
        });
    }
    Ok(certs)
}

/// Builds the server configuration, reading every file it names.
///
/// # Errors
/// [`WebConfigError::Material`] or [`WebConfigError::Invalid`] naming the key whose file is
/// unreadable, not PEM, or not usable (key does not match the certificate, bad CA).
pub fn server_config(t: &TlsSettings, origin: &str) -> Result<Arc<ServerConfig>, WebConfigError> {
    let chain = certificates(&t.cert, cert_key(&t.cert), origin)?;
    let key_name = match t.key {
        Pem::File(_) => "key_file",
        Pem::Inline(_) => "key",
    };
    let key_bytes = read_pem(&t.key, key_name, origin)?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        material(
            origin,
            key_name,
            format!("parsing the private key in {}", describe(&t.key)),
            e,
        )
    })?;

    let provider = Arc::new(provider(t));
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = [
        (TlsVersion::Tls12, &rustls::version::TLS12),
        (TlsVersion::Tls13, &rustls::version::TLS13),
    ]
    .into_iter()
    .filter(|(v, _)| (t.min_version..=t.max_version).contains(v))
    .map(|(_, p)| p)
    .collect();
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .map_err(|e| {
            material(
                origin,
                "cipher_suites",
                "no cipher suite is left for the allowed TLS versions".to_owned(),
                e,
            )
        })?;
    let verifier = client_verifier(t, &provider, origin)?;
    let mut config = builder
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| {
            material(
                origin,
                key_name,
                format!(
                    "using the key in {} with the certificate in {}",
                    describe(&t.key),
                    describe(&t.cert)
                ),
                e,
            )
        })?;
    config.ignore_client_order = t.prefer_server_cipher_suites;
    // gpu-exporter speaks HTTP/1.1 only; say so in ALPN so clients do not try h2.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn cert_key(p: &Pem) -> &'static str {
    match p {
        Pem::File(_) => "cert_file",
        Pem::Inline(_) => "cert",
    }
}

/// The ring provider cut down to the configured suites and groups (defaults when none given).
fn provider(t: &TlsSettings) -> CryptoProvider {
    use rustls::crypto::ring::{cipher_suite as cs, kx_group};
    let mut p = rustls::crypto::ring::default_provider();
    if !t.cipher_suites.is_empty() {
        // TLS 1.3 suites are not configurable (as in Go); TLS 1.2 ones follow the file's order.
        let mut suites: Vec<_> = p
            .cipher_suites
            .iter()
            .copied()
            .filter(|s| s.tls13().is_some())
            .collect();
        suites.extend(t.cipher_suites.iter().map(|s| match s {
            CipherSuite::EcdheEcdsaAes128Gcm => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            CipherSuite::EcdheEcdsaAes256Gcm => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            CipherSuite::EcdheEcdsaChacha20 => cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            CipherSuite::EcdheRsaAes128Gcm => cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            CipherSuite::EcdheRsaAes256Gcm => cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            CipherSuite::EcdheRsaChacha20 => cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        }));
        p.cipher_suites = suites;
    }
    if !t.curve_preferences.is_empty() {
        p.kx_groups = t
            .curve_preferences
            .iter()
            .map(|c| match c {
                Curve::X25519 => kx_group::X25519,
                Curve::P256 => kx_group::SECP256R1,
                Curve::P384 => kx_group::SECP384R1,
            })
            .collect();
    }
    p
}

fn client_verifier(
    t: &TlsSettings,
    provider: &Arc<CryptoProvider>,
    origin: &str,
) -> Result<Arc<dyn ClientCertVerifier>, WebConfigError> {
    let algorithms = provider.signature_verification_algorithms;
    let inner: Arc<dyn ClientCertVerifier> = match t.client_auth {
        ClientAuth::NoClientCert => return Ok(WebPkiClientVerifier::no_client_auth()),
        ClientAuth::RequestClientCert => Arc::new(AnyClientCert {
            mandatory: false,
            algorithms,
        }),
        ClientAuth::RequireAnyClientCert => Arc::new(AnyClientCert {
            mandatory: true,
            algorithms,
        }),
        ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert => {
            let (ca, key) = match &t.client_ca {
                Some(ca @ Pem::File(_)) => (ca, "client_ca_file"),
                Some(ca @ Pem::Inline(_)) => (ca, "client_ca"),
                None => {
                    return Err(WebConfigError::Invalid {
                        origin: origin.to_owned(),
                        key: "tls_server_config.client_ca_file".to_owned(),
                        reason: "missing".to_owned(),
                    })
                }
            };
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca, key, origin)? {
                roots.add(cert).map_err(|e| {
                    material(origin, key, format!("adding a CA from {}", describe(ca)), e)
                })?;
            }
            let b =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider));
            let b = if t.client_auth == ClientAuth::VerifyClientCertIfGiven {
                b.allow_unauthenticated()
            } else {
                b
            };
            b.build().map_err(|e| {
                material(
                    origin,
                    key,
                    format!("building the client verifier from {}", describe(ca)),
                    e,
                )
            })?
        }
    };
    if t.client_allowed_sans.is_empty() {
        return Ok(inner);
    }
    let allowed = t
        .client_allowed_sans
        .iter()
        .filter_map(|s| ServerName::try_from(s.as_str()).ok().map(|n| n.to_owned()))
        .collect();
    Ok(Arc::new(AllowedSans { inner, allowed }))
}

/// Accepts any client certificate whose handshake signature checks out (Go's
/// `RequestClientCert` / `RequireAnyClientCert`): proves possession of the key, not identity.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Delegates to `inner`, then requires one of `allowed` among the certificate's DNS or IP SANs.
#[derive(Debug)]
struct AllowedSans {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<ServerName<'static>>,
}

impl ClientCertVerifier for AllowedSans {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        if self
            .allowed
            .iter()
            .any(|name| cert.verify_is_valid_for_subject_name(name).is_ok())
        {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
