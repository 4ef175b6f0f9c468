//! Turns validated [`TlsSettings`] into a rustls [`ServerConfig`]: reads the PEM material,
//! restricts the ring provider to the configured suites, groups and versions, and installs the
//! client-certificate policy.
//!
//! Go's `RequestClientCert`/`RequireAnyClientCert` accept any certificate without checking its
//! chain; rustls has no such verifier, so `AnyClientCert` is one (it still checks the handshake
//! signature, so the client must hold the key). Whichever verifier is in use is wrapped in one
//! delegating verifier (`Delegating`) that lets a client without a certificate finish the
//! handshake (the requirement is enforced per request) and, with `client_allowed_sans`, rejects
//! a certificate none of whose SANs is listed.

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

/// A server configuration and the certificate it serves.
#[derive(Debug)]
pub struct ServerTls {
    /// For the TLS acceptor.
    pub config: Arc<ServerConfig>,
    /// `notAfter` of the served (leaf) certificate, Unix seconds (`None` if unreadable).
    pub not_after: Option<i64>,
}

/// Builds the server configuration, reading every file it names.
///
/// # Errors
/// [`WebConfigError::Material`] or [`WebConfigError::Invalid`] naming the key whose file is
/// unreadable, not PEM, or not usable (key does not match the certificate, an unsupported key
/// type, a bad CA), or a combination of versions and suites no handshake could complete with.
pub fn server_config(t: &TlsSettings, origin: &str) -> Result<ServerTls, WebConfigError> {
    let chain = certificates(&t.cert, cert_key(&t.cert), origin)?;
    let not_after = super::x509::certificate_not_after(&chain[0]);
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
    let signing_key = provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| match super::x509::key_kind(&key) {
            // Name what the key is when rustls cannot use that kind at all.
            Some(kind) if !supported_key(&kind) => WebConfigError::Invalid {
                origin: origin.to_owned(),
                key: format!("tls_server_config.{key_name}"),
                reason: format!(
                    "{}: unsupported curve/size: the key is {kind}; rustls supports ECDSA P-256 and P-384, RSA of 2048 to 8192 bits, and Ed25519",
                    describe(&t.key)
                ),
            },
            _ => material(
                origin,
                key_name,
                format!("loading the private key in {}", describe(&t.key)),
                e,
            ),
        })?;
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = [
        (TlsVersion::Tls12, &rustls::version::TLS12),
        (TlsVersion::Tls13, &rustls::version::TLS13),
    ]
    .into_iter()
    .filter(|(v, _)| (t.min_version..=t.max_version).contains(v))
    .map(|(_, p)| p)
    .collect();
    // A certificate no allowed suite can sign with would fail every handshake
    // (TLS 1.2 only, RSA-only suites and an ECDSA certificate): refuse it now.
    let algorithm = signing_key.algorithm();
    let usable = provider.cipher_suites.iter().any(|s| {
        versions.iter().any(|v| v.version == s.version().version)
            && s.usable_for_signature_algorithm(algorithm)
    });
    if !usable {
        return Err(WebConfigError::Invalid {
            origin: origin.to_owned(),
            key: "tls_server_config.cipher_suites".to_owned(),
            reason: format!(
                "no allowed cipher suite can be used with the {algorithm:?} key in {}, so no handshake could complete: with TLS 1.2 only, list a TLS_ECDHE_{}_* suite, allow TLS13 (max_version), or use a certificate of another key type",
                describe(&t.key),
                if algorithm == rustls::SignatureAlgorithm::RSA { "RSA" } else { "ECDSA" }
            ),
        });
    }
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
    let verifier: Arc<dyn ClientCertVerifier> = Arc::new(client_verifier(t, &provider, origin)?);
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
    Ok(ServerTls {
        config: Arc::new(config),
        not_after,
    })
}

/// Whether rustls's ring provider can sign with a key of this kind at all.
fn supported_key(kind: &super::x509::KeyKind) -> bool {
    use super::x509::KeyKind;
    match kind {
        KeyKind::Rsa(bits) => (2048..=8192).contains(bits),
        KeyKind::Ec(curve) => curve == "P-256" || curve == "P-384",
        KeyKind::Ed25519 => true,
        KeyKind::Ed448 | KeyKind::Other(_) => false,
    }
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

/// The client-certificate policy of `t`: the verifier for its `client_auth`, wrapped in the one
/// [`Delegating`] verifier that lets the handshake finish without a certificate and checks
/// `client_allowed_sans`.
fn client_verifier(
    t: &TlsSettings,
    provider: &Arc<CryptoProvider>,
    origin: &str,
) -> Result<Delegating, WebConfigError> {
    let algorithms = provider.signature_verification_algorithms;
    let inner: Arc<dyn ClientCertVerifier> = match t.client_auth {
        ClientAuth::NoClientCert => {
            return Ok(Delegating {
                inner: WebPkiClientVerifier::no_client_auth(),
                allowed_sans: Vec::new(),
            })
        }
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
    let allowed_sans = t
        .client_allowed_sans
        .iter()
        .filter_map(|s| ServerName::try_from(s.as_str()).ok().map(|n| n.to_owned()))
        .collect();
    Ok(Delegating {
        inner,
        allowed_sans,
    })
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

/// Delegates to `inner`, with two changes:
///
/// - a client may finish the handshake without a certificate even where `inner` requires one:
///   the kubelet's probes present none. A certificate that is presented is still verified by
///   `inner` (a bad one fails the handshake), and the requirement is enforced per request
///   (`Active::client_cert_required`): without a certificate only the probe paths answer;
/// - when `allowed_sans` is not empty, a verified certificate must also hold one of them among
///   its DNS or IP SANs (`client_allowed_sans`).
#[derive(Debug)]
struct Delegating {
    inner: Arc<dyn ClientCertVerifier>,
    allowed_sans: Vec<ServerName<'static>>,
}

impl ClientCertVerifier for Delegating {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        false
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
        if self.allowed_sans.is_empty() {
            return Ok(verified);
        }
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        if self
            .allowed_sans
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
