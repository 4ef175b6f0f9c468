//! End-to-end tests of `--web-config-file` and the HTTP limits over real sockets on
//! 127.0.0.1:0: TLS, mTLS, client SANs, basic auth, certificate rotation, method and size
//! limits, slowloris. Certificates are generated per test with rcgen.

mod common;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::tls::Ca;
use gpu_exporter::exporter_metrics::ExporterMetrics as SelfMetrics;
use gpu_exporter::http::{self, AppState, Limits};
use gpu_exporter::sampler::Published;
use gpu_exporter::web::{WebConfigState, WebSecurity};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const BODY: &str = "# HELP DCGM_FI_DEV_GPU_TEMP t\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} 41\n";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    // Write through a temporary file and rename, as a Secret update does: never half a file.
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::File::create(&tmp)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

struct Server {
    addr: SocketAddr,
    metrics: Arc<SelfMetrics>,
    web: Option<Arc<WebSecurity>>,
    stop: CancellationToken,
    done: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(web: Option<&Path>, limits: Limits) -> Server {
        let published = Published::new(
            Bytes::from_static(BODY.as_bytes()),
            tokio::time::Instant::now(),
            1,
            None,
        );
        let (_tx, rx) = watch::channel(Some(Arc::new(published)));
        // Keep the sender alive for the server's lifetime.
        std::mem::forget(_tx);
        let metrics = Arc::new(SelfMetrics::default());
        let router = http::router(AppState {
            published: rx,
            interval: Duration::from_secs(3600),
            metrics: Arc::clone(&metrics.http),
        });
        let web = web.map(|p| {
            Arc::new(WebSecurity::load(p, Duration::ZERO, Arc::clone(&metrics.web)).unwrap())
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let s = stop.clone();
        let done = tokio::spawn(http::serve_with(
            listener,
            router,
            limits,
            web.clone(),
            Arc::clone(&metrics.http),
            async move { s.cancelled().await },
        ));
        Server {
            addr,
            metrics,
            web,
            stop,
            done,
        }
    }

    /// Waits (at most ten seconds) until the web configuration's reload figures satisfy
    /// `cond`, re-checking after each change the watcher sees.
    async fn web_state(&self, what: &str, cond: impl Fn(&WebConfigState) -> bool) {
        let mut seen = self.web.as_ref().expect("a web config").changes_seen();
        let metrics = Arc::clone(&self.metrics);
        tokio::time::timeout(
            Duration::from_secs(10),
            seen.wait_for(|_| cond(&metrics.web.state())),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "timed out waiting for {what}: {:?}",
                self.metrics.web.state()
            )
        })
        .unwrap();
    }

    async fn stop(self) {
        self.stop.cancel();
        self.done.await.unwrap().unwrap();
    }
}

fn roots(ca_pem: &str) -> rustls::RootCertStore {
    let mut r = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        r.add(c.unwrap()).unwrap();
    }
    r
}

/// What a TLS GET saw: status line code, whole response text, the server's leaf certificate.
struct Reply {
    status: u16,
    text: String,
    server_cert: Vec<u8>,
}

async fn https_get(
    addr: SocketAddr,
    ca_pem: &str,
    client: Option<&(String, String)>,
    extra_header: &str,
) -> Result<Reply, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(ca_pem));
    let config = match client {
        None => b.with_no_client_auth(),
        Some((cert, key)) => b
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let server_cert = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let req = format!(
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{extra_header}\r\n"
    );
    tls.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    tls.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = status_of(&text).ok_or_else(|| format!("no HTTP response: {text:?}"))?;
    Ok(Reply {
        status,
        text,
        server_cert,
    })
}

fn status_of(text: &str) -> Option<u16> {
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

async fn http_raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

fn tls_files(dir: &Path, ca: &Ca, expired: bool) -> (PathBuf, PathBuf) {
    let (cert, key) = ca.leaf(&["localhost", "127.0.0.1"], expired);
    (write(dir, "tls.crt", &cert), write(dir, "tls.key", &key))
}

#[tokio::test]
async fn tls_serves_metrics_with_configured_headers_to_a_verifying_client() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (crt, key) = tls_files(dir.path(), &ca, false);
    let web = write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  min_version: TLS12\nhttp_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n",
            crt.display(),
            key.display()
        ),
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    let r = https_get(server.addr, &ca.pem(), None, "").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.ends_with(BODY), "{}", r.text);
    assert!(r
        .text
        .to_ascii_lowercase()
        .contains("strict-transport-security: max-age=31536000"));
    // Plain HTTP to a TLS port gets no metrics.
    let plain = http_raw(server.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(!plain.contains("DCGM_FI_DEV_GPU_TEMP"), "{plain}");
    // A client that trusts another CA refuses the server.
    let other = Ca::new("other CA");
    let e = https_get(server.addr, &other.pem(), None, "")
        .await
        .err()
        .unwrap();
    assert!(e.contains("UnknownIssuer"), "{e}");
    server.stop().await;
}

#[tokio::test]
async fn an_expired_server_certificate_is_rejected_by_a_verifying_client() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (crt, key) = tls_files(dir.path(), &ca, true);
    let web = write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            crt.display(),
            key.display()
        ),
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    let e = https_get(server.addr, &ca.pem(), None, "")
        .await
        .err()
        .unwrap();
    assert!(e.contains("certificate expired"), "{e}");
    server.stop().await;
}

#[tokio::test]
async fn mtls_serves_metrics_only_to_clients_with_a_certificate_from_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let (crt, key) = tls_files(dir.path(), &ca, false);
    let client_ca_file = write(dir.path(), "ca.crt", &client_ca.pem());
    let web = write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
            crt.display(),
            key.display(),
            client_ca_file.display()
        ),
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    let good = client_ca.leaf(&["prometheus"], false);
    let r = https_get(server.addr, &ca.pem(), Some(&good), "")
        .await
        .unwrap();
    assert_eq!(r.status, 200);

    // No certificate: the handshake completes (the kubelet's probes present none) but
    // /metrics is refused; tests/flags.rs probes /health and /ready the kubelet's way.
    let none = https_get(server.addr, &ca.pem(), None, "").await.unwrap();
    assert_eq!(
        none.status, 403,
        "a client without a certificate got in: {}",
        none.text
    );
    assert!(!none.text.contains("DCGM_FI_DEV_GPU_TEMP"));

    let rogue = Ca::new("rogue CA").leaf(&["prometheus"], false);
    let e = https_get(server.addr, &ca.pem(), Some(&rogue), "")
        .await
        .err()
        .unwrap();
    assert!(!e.is_empty());

    let expired = client_ca.leaf(&["prometheus"], true);
    assert!(https_get(server.addr, &ca.pem(), Some(&expired), "")
        .await
        .is_err());
    server.stop().await;
}

#[tokio::test]
async fn client_allowed_sans_turn_away_other_certificates_of_the_same_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let (crt, key) = tls_files(dir.path(), &ca, false);
    let client_ca_file = write(dir.path(), "ca.crt", &client_ca.pem());
    let web = write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n  client_allowed_sans: [prometheus.monitoring.svc]\n",
            crt.display(),
            key.display(),
            client_ca_file.display()
        ),
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    let allowed = client_ca.leaf(&["prometheus.monitoring.svc"], false);
    assert_eq!(
        https_get(server.addr, &ca.pem(), Some(&allowed), "")
            .await
            .unwrap()
            .status,
        200
    );
    let other = client_ca.leaf(&["grafana.monitoring.svc"], false);
    assert!(https_get(server.addr, &ca.pem(), Some(&other), "")
        .await
        .is_err());
    server.stop().await;
}

fn basic(user: &str, password: &str) -> String {
    // Test-only encoder (the server's decoder is tested separately).
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let raw = format!("{user}:{password}");
    let mut s = String::new();
    for c in raw.as_bytes().chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            s.push(if i <= c.len() {
                A[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    format!("Authorization: Basic {s}\r\n")
}

#[tokio::test]
async fn the_helm_chart_shape_tls_plus_basic_auth_checks_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (crt, key) = tls_files(dir.path(), &ca, false);
    // Helm's htpasswd writes $2a$ hashes; cost 4 keeps the test quick.
    let hash = bcrypt::hash_with_result("s3cret", 4)
        .unwrap()
        .format_for_version(bcrypt::Version::TwoA);
    let web = write(
        dir.path(),
        "web-config.yaml",
        &format!(
            "tls_server_config:\n   cert_file: \"{}\"\n   key_file: \"{}\"\nbasic_auth_users:\n  prometheus: {hash}\n",
            crt.display(),
            key.display()
        ),
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    let pem = ca.pem();
    let ok = https_get(server.addr, &pem, None, &basic("prometheus", "s3cret"))
        .await
        .unwrap();
    assert_eq!(ok.status, 200);
    assert!(ok.text.ends_with(BODY));
    for header in [
        basic("prometheus", "wrong"),
        basic("nobody", "s3cret"),
        String::new(),
        "Authorization: Bearer x\r\n".into(),
    ] {
        let r = https_get(server.addr, &pem, None, &header).await.unwrap();
        assert_eq!(r.status, 401, "{header:?}: {}", r.text);
        assert!(r.text.contains("www-authenticate: Basic"), "{}", r.text);
        assert!(!r.text.contains("DCGM_FI"), "{}", r.text);
    }
    server.stop().await;
}

#[tokio::test]
async fn rotated_certificates_are_served_without_restart_and_a_broken_one_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (crt, key) = tls_files(dir.path(), &ca, false);
    let web = write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            crt.display(),
            key.display()
        ),
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    let first = https_get(server.addr, &ca.pem(), None, "")
        .await
        .unwrap()
        .server_cert;

    // Rotate: a new key pair from the same CA. The watcher may see the new key with the old
    // certificate first (rejected), then both (taken).
    let (cert2, key2) = ca.leaf(&["localhost", "127.0.0.1"], false);
    write(dir.path(), "tls.key", &key2);
    write(dir.path(), "tls.crt", &cert2);
    server
        .web_state("the rotation", |s| {
            s.reloads_ok == 1 && !s.last_reload_failed
        })
        .await;
    let second = https_get(server.addr, &ca.pem(), None, "").await.unwrap();
    assert_eq!(second.status, 200);
    assert_ne!(
        second.server_cert, first,
        "the rotated certificate was not picked up"
    );
    let expected = CertificateDer::pem_slice_iter(cert2.as_bytes())
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(second.server_cert, expected.to_vec());

    // A broken certificate is rejected; the last good one keeps serving.
    let failed = server.metrics.web.state().reloads_failed;
    write(
        dir.path(),
        "tls.crt",
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    );
    server
        .web_state("the broken certificate", |s| s.reloads_failed > failed)
        .await;
    let third = https_get(server.addr, &ca.pem(), None, "").await.unwrap();
    assert_eq!(third.server_cert, expected.to_vec());
    // A mismatched key (new key, old cert) is also rejected.
    // One file at a time, each change seen before the next.
    let (_, key3) = ca.leaf(&["localhost"], false);
    let failed = server.metrics.web.state().reloads_failed;
    write(dir.path(), "tls.key", &key3);
    server
        .web_state("the new key", |s| s.reloads_failed > failed)
        .await;
    let failed = server.metrics.web.state().reloads_failed;
    write(dir.path(), "tls.crt", &cert2);
    server
        .web_state("the mismatched key", |s| {
            s.reloads_failed > failed && s.last_reload_failed
        })
        .await;
    let fourth = https_get(server.addr, &ca.pem(), None, "").await.unwrap();
    assert_eq!(fourth.server_cert, expected.to_vec());
    server.stop().await;
}

#[tokio::test]
async fn only_get_and_head_reach_metrics_and_unknown_paths_get_404() {
    let server = Server::start(None, Limits::default()).await;
    let get = http_raw(
        server.addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&get), Some(200));
    let head = http_raw(
        server.addr,
        b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&head), Some(200));
    assert!(!head.contains("DCGM_FI"), "HEAD carried a body: {head}");
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let r = http_raw(
            server.addr,
            format!("{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert_eq!(status_of(&r), Some(405), "{method}: {r}");
        assert!(r.to_ascii_lowercase().contains("allow: get,head"), "{r}");
    }
    let missing = http_raw(
        server.addr,
        b"GET /debug/pprof HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&missing), Some(404));
    let garbage = http_raw(server.addr, b"\x16\x03\x01 not http at all\r\n\r\n").await;
    assert_eq!(status_of(&garbage).map(|s| s / 100), Some(4), "{garbage:?}");
    server.stop().await;
}

#[tokio::test]
async fn oversized_request_heads_get_431_and_the_server_keeps_serving() {
    let server = Server::start(
        None,
        Limits {
            max_header_bytes: 8192,
            ..Limits::default()
        },
    )
    .await;
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(20_000)
    );
    let r = http_raw(server.addr, big.as_bytes()).await;
    assert_eq!(status_of(&r), Some(431), "{r}");
    let ok = http_raw(
        server.addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&ok), Some(200));
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_slowloris_client_is_cut_off_after_the_header_read_timeout() {
    let limits = Limits {
        header_read_timeout: Duration::from_secs(10),
        ..Limits::default()
    };
    let server = Server::start(None, limits).await;
    let started = tokio::time::Instant::now();
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    // Half a request head, then silence.
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf);
    assert!(!text.contains("200 OK"), "{text}");
    // Closed by the timer (paused clock: this is virtual time, exact and deterministic).
    assert!(
        started.elapsed() >= Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        server.metrics.http.closed(http::CloseReason::HeaderTimeout),
        1
    );
    // A complete request on a fresh connection is still served.
    let ok = http_raw(
        server.addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&ok), Some(200));
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_silent_tls_client_is_cut_off_after_the_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (crt, key) = tls_files(dir.path(), &ca, false);
    let web = write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            crt.display(),
            key.display()
        ),
    );
    let server = Server::start(
        Some(&web),
        Limits {
            handshake_timeout: Duration::from_secs(5),
            ..Limits::default()
        },
    )
    .await;
    let started = tokio::time::Instant::now();
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    // The first bytes of a ClientHello (record header, handshake type), then silence.
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    let mut buf = Vec::new();
    let n = s.read_to_end(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0);
    assert!(started.elapsed() >= Duration::from_secs(5));
    assert_eq!(
        server
            .metrics
            .http
            .closed(http::CloseReason::HandshakeTimeout),
        1
    );
    server.stop().await;
}

#[tokio::test]
async fn at_the_connection_limit_a_silent_connection_gives_way_to_a_new_one() {
    let server = Server::start(
        None,
        Limits {
            max_connections: 1,
            ..Limits::default()
        },
    )
    .await;
    // The first connection holds the only slot (it has sent nothing yet).
    let mut first = TcpStream::connect(server.addr).await.unwrap();
    // Accepting is asynchronous: wait for the server to count it.
    let mut open = server.metrics.http.watch_open();
    open.wait_for(|&n| n == 1).await.unwrap();
    let second = http_raw(
        server.addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&second), Some(200), "{second}");
    // The first was closed for it, without a response.
    let mut buf = Vec::new();
    let _ = first.read_to_end(&mut buf).await;
    assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf));
    assert_eq!(server.metrics.http.closed(http::CloseReason::Evicted), 1);
    server.stop().await;
}

#[test]
fn startup_errors_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let web = write(
        dir.path(),
        "web.yml",
        "tls_server_config:\n  cert_file: /nonexistent/tls.crt\n  key_file: /nonexistent/tls.key\n",
    );
    let e = gpu_exporter::error_chain(
        &WebSecurity::load(&web, Duration::ZERO, Arc::default()).unwrap_err(),
    );
    assert!(
        e.contains("web.yml: tls_server_config.cert_file: reading /nonexistent/tls.crt"),
        "{e}"
    );
    let ca = Ca::new("test CA");
    let (crt, _) = tls_files(dir.path(), &ca, false);
    let (_, other_key) = ca.leaf(&["x"], false);
    let k = write(dir.path(), "other.key", &other_key);
    let web = write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            crt.display(),
            k.display()
        ),
    );
    let e = gpu_exporter::error_chain(
        &WebSecurity::load(&web, Duration::ZERO, Arc::default()).unwrap_err(),
    );
    assert!(
        e.contains("tls_server_config.key_file: using the key in"),
        "{e}"
    );
    let e = gpu_exporter::error_chain(
        &WebSecurity::load(
            &dir.path().join("missing.yml"),
            Duration::ZERO,
            Arc::default(),
        )
        .unwrap_err(),
    );
    assert!(e.contains("reading web configuration"), "{e}");
}

/// A TCP connection to `addr` from the loopback address `from` (127.0.0.2 plays a hostile pod,
/// 127.0.0.1 Prometheus).
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("binding a 127.0.0.0/8 source address");
    socket.connect(addr).await.unwrap()
}

/// One request on a kept-alive connection; returns the status. The response is read to the
/// end of its `Content-Length` body, leaving the connection ready for the next request.
async fn keep_alive_get<S>(s: &mut S, extra_header: &str) -> u16
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let req = format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{extra_header}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "closed mid-response");
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("content-length");
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).await.unwrap();
    status_of(&head).unwrap()
}

fn tls_web_config(dir: &Path, ca: &Ca) -> PathBuf {
    let (crt, key) = tls_files(dir, ca, false);
    write(
        dir,
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            crt.display(),
            key.display()
        ),
    )
}

async fn tls_connect(addr: SocketAddr, ca: &Ca) -> tokio_rustls::client::TlsStream<TcpStream> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(&ca.pem()))
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            ServerName::try_from("localhost").unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        )
        .await
        .unwrap()
}

/// Scrapes every two minutes on one kept-alive connection, checks that it survives, then that
/// it is closed once idle for the idle timeout.
async fn keep_alive_for_two_minutes<S>(server: &Server, mut s: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    for _ in 0..4 {
        assert_eq!(keep_alive_get(&mut s, "").await, 200);
        tokio::time::sleep(Duration::from_secs(120)).await;
    }
    assert_eq!(keep_alive_get(&mut s, "").await, 200);
    assert_eq!(server.metrics.http.open(), 1);
    for reason in http::CloseReason::ALL {
        assert_eq!(server.metrics.http.closed(reason), 0, "{reason:?}");
    }
    // Idle past the idle timeout: closed by the server.
    let idle = Limits::default().idle_timeout;
    let started = tokio::time::Instant::now();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
    assert_eq!(started.elapsed(), idle);
    assert_eq!(
        server.metrics.http.closed(http::CloseReason::IdleTimeout),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_keep_alive_scraper_idle_two_minutes_between_scrapes_keeps_its_connection() {
    let server = Server::start(None, Limits::default()).await;
    let s = TcpStream::connect(server.addr).await.unwrap();
    keep_alive_for_two_minutes(&server, s).await;
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_keep_alive_tls_scraper_idle_two_minutes_between_scrapes_keeps_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let web = tls_web_config(dir.path(), &ca);
    let server = Server::start(Some(&web), Limits::default()).await;
    let s = tls_connect(server.addr, &ca).await;
    keep_alive_for_two_minutes(&server, s).await;
    server.stop().await;
}

#[tokio::test]
async fn a_flood_past_the_connection_limit_never_evicts_the_scrapers_keep_alive_connection() {
    let server = Server::start(
        None,
        Limits {
            max_connections: 50,
            ..Limits::default()
        },
    )
    .await;
    let mut scraper = connect_from([127, 0, 0, 1], server.addr).await;
    assert_eq!(keep_alive_get(&mut scraper, "").await, 200);
    // 200 silent connections from the attacker: the oldest 151 give way, one per newcomer.
    let mut flood = Vec::new();
    for _ in 0..200 {
        flood.push(connect_from([127, 0, 0, 2], server.addr).await);
    }
    for s in &mut flood[..151] {
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
        assert!(rest.is_empty());
    }
    assert_eq!(server.metrics.http.closed(http::CloseReason::Evicted), 151);
    // The scraper's connection, idle all along and the oldest, is still there.
    assert_eq!(keep_alive_get(&mut scraper, "").await, 200);
    assert_eq!(server.metrics.http.open(), 50);
    drop(flood);
    drop(scraper);
    server.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_rate_limit_is_per_client_so_a_flood_does_not_starve_the_scraper() {
    let dir = tempfile::tempdir().unwrap();
    let web = write(
        dir.path(),
        "web.yml",
        "rate_limit:\n  interval: 1m\n  burst: 5\n",
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    let mut attacker = connect_from([127, 0, 0, 2], server.addr).await;
    let mut statuses = Vec::new();
    for _ in 0..50 {
        statuses.push(keep_alive_get(&mut attacker, "").await);
    }
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 5);
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 45);
    // Prometheus, from its own address, still has its whole burst.
    let mut scraper = connect_from([127, 0, 0, 1], server.addr).await;
    for _ in 0..5 {
        assert_eq!(keep_alive_get(&mut scraper, "").await, 200);
    }
    assert_eq!(keep_alive_get(&mut scraper, "").await, 429);
    assert_eq!(
        server.metrics.http.rejected(http::RejectReason::RateLimit),
        46
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_password_guesses_does_not_delay_the_scrapers_first_login() {
    let dir = tempfile::tempdir().unwrap();
    // Cost 8: each check takes milliseconds, so 300 queued checks would take seconds.
    let hash = bcrypt::hash("s3cret", 8).unwrap();
    let web = write(
        dir.path(),
        "web.yml",
        &format!("basic_auth_users:\n  prometheus: {hash}\n"),
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    let addr = server.addr;
    // 300 connections from the attacker, each sending a different wrong password at once.
    let guesses: Vec<_> = (0..300)
        .map(|i| {
            tokio::spawn(async move {
                let mut s = connect_from([127, 0, 0, 2], addr).await;
                keep_alive_get(&mut s, &basic("prometheus", &format!("guess{i}"))).await
            })
        })
        .collect();
    // Meanwhile Prometheus logs in for the first time (its verdict is not cached yet).
    let mut scraper = connect_from([127, 0, 0, 1], addr).await;
    let credentials = basic("prometheus", "s3cret");
    let login = keep_alive_get(&mut scraper, &credentials);
    let status = tokio::time::timeout(Duration::from_secs(1), login)
        .await
        .expect("the scraper's login waited behind the guesses");
    assert_eq!(status, 200);
    let mut statuses = Vec::new();
    for g in guesses {
        statuses.push(g.await.unwrap());
    }
    let denied = statuses.iter().filter(|&&s| s == 401).count();
    let throttled = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(denied + throttled, 300, "{statuses:?}");
    // At most the failure budget ran bcrypt; the rest was turned away without it.
    assert!(
        denied <= gpu_exporter::web::auth::FAILURE_BURST as usize,
        "{denied}"
    );
    assert_eq!(
        server
            .metrics
            .http
            .rejected(http::RejectReason::AuthThrottled),
        throttled as u64
    );
    server.stop().await;
}

#[tokio::test]
async fn a_revoked_password_stops_working_on_an_open_keep_alive_connection() {
    let dir = tempfile::tempdir().unwrap();
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let web = write(
        dir.path(),
        "web.yml",
        &format!("basic_auth_users:\n  prometheus: {hash}\n"),
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    let credentials = basic("prometheus", "s3cret");
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    assert_eq!(keep_alive_get(&mut s, &credentials).await, 200);
    // Revoked: the password is rotated in the file.
    let rotated = bcrypt::hash("n3w-s3cret", 4).unwrap();
    write(
        dir.path(),
        "web.yml",
        &format!("basic_auth_users:\n  prometheus: {rotated}\n"),
    );
    server
        .web_state("the revocation to be read", |s| s.reloads_ok == 1)
        .await;
    // The same connection, still open: the old password is refused, the new one works.
    assert_eq!(keep_alive_get(&mut s, &credentials).await, 401);
    assert_eq!(
        keep_alive_get(&mut s, &basic("prometheus", "n3w-s3cret")).await,
        200
    );
    assert_eq!(server.metrics.http.closed(http::CloseReason::Closed), 0);
    server.stop().await;
}

#[tokio::test]
async fn certificate_expiry_and_rejected_rotations_are_self_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    // Valid until 2000 (served all the same: the client decides whether it minds).
    let (cert1, key1) = ca.leaf(&["localhost", "127.0.0.1"], true);
    let crt = write(dir.path(), "tls.crt", &cert1);
    let key = write(dir.path(), "tls.key", &key1);
    let web = write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            crt.display(),
            key.display()
        ),
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    let s = server.metrics.web.state();
    assert!(s.enabled);
    assert_eq!(s.certificate_expiry_seconds, Some(949_363_200.0)); // 2000-02-01T00:00:00Z

    // A rotation to a broken certificate: counted as a failure, the old expiry still shown.
    write(
        dir.path(),
        "tls.crt",
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    );
    server
        .web_state("the broken certificate", |s| s.reloads_failed == 1)
        .await;
    let s = server.metrics.web.state();
    assert!(s.last_reload_failed);
    assert_eq!(s.certificate_expiry_seconds, Some(949_363_200.0));

    // A good rotation: counted, and the new certificate's expiry shown.
    let (cert2, key2) = ca.leaf_until(&["localhost", "127.0.0.1"], (2031, 5, 17));
    write(dir.path(), "tls.key", &key2);
    write(dir.path(), "tls.crt", &cert2);
    server
        .web_state("the rotation", |s| {
            s.reloads_ok >= 1 && !s.last_reload_failed
        })
        .await;
    let s = server.metrics.web.state();
    // 2031-05-17T00:00:00Z
    assert_eq!(s.certificate_expiry_seconds, Some(1_936_742_400.0));

    // As exposed on /metrics (the families the sampler renders).
    let body = server.metrics.text();
    assert!(
        body.contains("gpu_exporter_web_config_reloads_total{result=\"failure\"} "),
        "{body}"
    );
    assert!(
        body.contains("gpu_exporter_web_config_last_reload_success 1\n"),
        "{body}"
    );
    assert!(
        body.contains("gpu_exporter_web_tls_certificate_expiry_timestamp_seconds 1936742400\n"),
        "{body}"
    );
    server.stop().await;
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tls")
            .join(name),
    )
    .unwrap()
}

#[test]
fn keys_of_an_unsupported_curve_or_size_are_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    for (cert, key, what) in [
        ("p521.crt", "p521.key", "ECDSA P-521"),
        ("p521.crt", "p521-sec1.key", "ECDSA P-521"),
        ("rsa1024.crt", "rsa1024.key", "RSA 1024-bit"),
        ("rsa1024.crt", "rsa1024-pkcs1.key", "RSA 1024-bit"),
    ] {
        let crt = write(dir.path(), "tls.crt", &fixture(cert));
        let k = write(dir.path(), "tls.key", &fixture(key));
        let web = write(
            dir.path(),
            "web.yml",
            &format!(
                "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
                crt.display(),
                k.display()
            ),
        );
        let e = gpu_exporter::error_chain(
            &WebSecurity::load(&web, Duration::ZERO, Arc::default()).unwrap_err(),
        );
        assert!(
            e.contains("tls_server_config.key_file: ")
                && e.contains("unsupported curve/size")
                && e.contains(&format!("the key is {what}")),
            "{key}: {e}"
        );
        assert!(!e.contains("failed to parse"), "{key}: {e}");
    }
}

#[tokio::test]
async fn a_tls_config_no_handshake_can_complete_is_refused_at_startup_and_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    // rcgen's keys are ECDSA P-256.
    let (crt, key) = tls_files(dir.path(), &ca, false);
    let base = format!(
        "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
        crt.display(),
        key.display()
    );
    let never = format!(
        "{base}  max_version: TLS12\n  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"
    );
    let web = write(dir.path(), "web.yml", &never);
    let e = gpu_exporter::error_chain(
        &WebSecurity::load(&web, Duration::ZERO, Arc::default()).unwrap_err(),
    );
    assert!(
        e.contains("tls_server_config.cipher_suites: no allowed cipher suite can be used with the ECDSA key"),
        "{e}"
    );
    // The same suites with TLS 1.3 allowed, or with an ECDSA suite added, can complete.
    write(
        dir.path(),
        "web.yml",
        &format!("{base}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"),
    );
    WebSecurity::load(&web, Duration::ZERO, Arc::default()).unwrap();
    write(
        dir.path(),
        "web.yml",
        &format!("{base}  max_version: TLS12\n  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n"),
    );
    let server = Server::start(Some(&web), Limits::default()).await;
    assert_eq!(
        https_get(server.addr, &ca.pem(), None, "")
            .await
            .unwrap()
            .status,
        200
    );
    // On reload: rejected and counted; the working configuration keeps serving.
    write(dir.path(), "web.yml", &never);
    server
        .web_state("the reload", |s| s.reloads_failed == 1)
        .await;
    assert_eq!(
        https_get(server.addr, &ca.pem(), None, "")
            .await
            .unwrap()
            .status,
        200
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_client_hello_flood_from_the_scrapers_address_does_not_delay_its_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let web = tls_web_config(dir.path(), &ca);
    // The flood's handshakes are given far longer than the test runs (the default 3 s can pass
    // on a loaded machine while 300 connections are opened), so a scrape that waited behind
    // them would wait that long, and no flood connection times out on its own.
    let handshake_timeout = Duration::from_secs(120);
    let server = Server::start(
        Some(&web),
        Limits {
            handshake_timeout,
            ..Limits::default()
        },
    )
    .await;
    // 300 connections from the scraper's own address, each sending the first bytes of a
    // ClientHello and nothing more.
    let mut flood = Vec::new();
    for _ in 0..300 {
        let mut s = connect_from([127, 0, 0, 1], server.addr).await;
        s.write_all(&[0x16, 0x03]).await.unwrap();
        flood.push(s);
    }
    // Wait until the server has taken every one in (each past its first byte).
    let mut open = server.metrics.http.watch_open();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if server.metrics.http.active() >= 300 {
                break;
            }
            open.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the flood's connections were not all taken in: active {} open {}",
            server.metrics.http.active(),
            server.metrics.http.open()
        )
    });
    // The scrape completes long before the flood's handshakes could time out (a correctness
    // bound: one that waited behind them would take 120 s; unhindered it takes milliseconds).
    let reply = tokio::time::timeout(
        handshake_timeout / 4,
        https_get(server.addr, &ca.pem(), None, ""),
    )
    .await
    .expect("the scrape waited behind the half-sent ClientHellos")
    .unwrap();
    assert_eq!(reply.status, 200);
    // Every flood connection was still open: none gave way for the scrape (the scrape's own
    // connection may be counted closed or reset by now, so those two reasons are not looked at).
    for reason in [
        http::CloseReason::HandshakeTimeout,
        http::CloseReason::TlsError,
        http::CloseReason::Evicted,
        http::CloseReason::Refused,
        http::CloseReason::FirstByteTimeout,
    ] {
        assert_eq!(server.metrics.http.closed(reason), 0, "closed: {reason:?}");
    }
    assert!(server.metrics.http.open() >= 300);
    drop(flood);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_as_key_file_is_rejected_on_reload_and_connections_keep_being_served() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let web = tls_web_config(dir.path(), &ca);
    let server = Server::start(Some(&web), Limits::default()).await;
    // The key is replaced by a FIFO nobody writes to (a read of it would wait for ever).
    let fifo = dir.path().join(".fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    std::fs::rename(&fifo, dir.path().join("tls.key")).unwrap();
    server
        .web_state("the FIFO to be rejected", |s| s.reloads_failed >= 1)
        .await;
    // New connections are served (the files are read by the watcher, and never waited on).
    for _ in 0..3 {
        let reply = tokio::time::timeout(
            Duration::from_secs(5),
            https_get(server.addr, &ca.pem(), None, ""),
        )
        .await
        .expect("a new connection hung")
        .unwrap();
        assert_eq!(reply.status, 200);
    }
    assert!(server.metrics.web.state().last_reload_failed);
    server.stop().await;
}
