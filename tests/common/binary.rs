//! The real gpu-exporter binary as a child process: start it (JSON log on stderr), learn the
//! address it listens on from its "gpu-exporter listening" line, talk HTTP(S) to it over
//! loopback, read its log.

use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a start or a first sample may take.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The binary with a clean environment (only `PATH`), the simulated fleet, a 1 s interval and
/// the JSON log.
pub fn command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-exporter"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["--backend", "sim", "-c", "1000", "--log-format", "json"]);
    cmd
}

/// Runs `cmd` to its exit (a start that must fail); returns the status and stderr.
///
/// # Panics
/// If it is still running after [`DEADLINE`] (it started instead of failing).
pub fn run_to_exit(mut cmd: Command) -> (ExitStatus, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpu-exporter");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "gpu-exporter did not exit within {DEADLINE:?}:\n{}",
                reader.join().unwrap_or_default()
            );
        }
        // Polling another process's state.
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, reader.join().unwrap_or_default())
}

/// A running exporter; killed when dropped.
pub struct Exporter {
    child: Child,
    /// The address it logged as listening on.
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Exporter {
    /// Starts `cmd` and waits for its listening line.
    ///
    /// # Panics
    /// If it exits first (with its log) or does not listen within [`DEADLINE`].
    pub fn start(mut cmd: Command) -> Exporter {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpu-exporter");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("piped stderr");
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if v["fields"]["message"] == "gpu-exporter listening" {
                        if let (Some(tx), Some(a)) = (tx.take(), v["fields"]["address"].as_str()) {
                            let _ = tx.send(a.to_owned());
                        }
                    }
                }
                lines.lock().unwrap().push(line);
            }
        });
        let started = Instant::now();
        let addr = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(a) => break a,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().unwrap();
                    panic!(
                        "gpu-exporter exited ({status}) before listening:\n{}",
                        log.lock().unwrap().join("\n")
                    );
                }
            }
            assert!(started.elapsed() < DEADLINE, "gpu-exporter did not listen");
        };
        Exporter {
            child,
            addr: addr.parse().expect("a socket address"),
            log,
        }
    }

    /// The log so far, one JSON object a line.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The log lines at WARN whose message contains `text`.
    pub fn warnings_about(&self, text: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["level"] == "WARN")
            .filter(|v| {
                v["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(text))
            })
            .count()
    }

    /// Its process id (for signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Waits until `/ready` answers 200 on `addr` (the first sample is published).
    ///
    /// # Panics
    /// After [`DEADLINE`], or if the process exits.
    pub fn wait_ready(&mut self) {
        let started = Instant::now();
        loop {
            if get(self.loopback(), "/ready").0 == 200 {
                return;
            }
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "gpu-exporter exited:\n{}",
                self.log()
            );
            assert!(
                started.elapsed() < DEADLINE,
                "not ready within {DEADLINE:?}:\n{}",
                self.log()
            );
            // Polling another process's state.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// 127.0.0.1 (or the address itself when it is a specific one) at its port.
    pub fn loopback(&self) -> SocketAddr {
        if self.addr.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], self.port()))
        } else {
            self.addr
        }
    }
}

fn exchange<S: Read + Write>(mut s: S, path: &str, extra: &str) -> (u16, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{extra}\r\n");
    s.write_all(req.as_bytes()).expect("write request");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Plain HTTP GET; (status, body).
pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let s = TcpStream::connect_timeout(&addr, DEADLINE).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    exchange(s, path, "")
}

/// HTTP GET asking for gzip, as Prometheus does; (status, the body decoded). Panics unless
/// the answer is one whole gzip member (a decoder that stops at the first member's end reads
/// all of it).
pub fn get_gzip(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, DEADLINE).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAccept-Encoding: gzip\r\n\r\n"
    );
    s.write_all(req.as_bytes()).expect("write request");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header");
    let head = String::from_utf8_lossy(&buf[..split]).to_ascii_lowercase();
    let status = head[9..12].parse().expect("a status");
    assert!(head.contains("content-encoding: gzip"), "{head}");
    let body = &buf[split + 4..];
    let mut text = String::new();
    let mut d = flate2::read::GzDecoder::new(body);
    d.read_to_string(&mut text).expect("one gzip member");
    let mut rest = Vec::new();
    let _ = d.into_inner().read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "{} bytes after the gzip member",
        rest.len()
    );
    (status, text)
}

/// Accepts any server certificate, as the kubelet's HTTPS probes do.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A GET the way the kubelet's `scheme: HTTPS` probe makes it: TLS without verifying the
/// server's certificate, no client certificate, no credentials. (status, body).
pub fn kubelet_https_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
        .with_no_client_auth();
    let conn = rustls::ClientConnection::new(
        Arc::new(config),
        rustls::pki_types::ServerName::try_from(addr.ip().to_string()).unwrap(),
    )
    .unwrap();
    let tcp = TcpStream::connect_timeout(&addr, DEADLINE).expect("connect");
    tcp.set_read_timeout(Some(DEADLINE)).unwrap();
    exchange(rustls::StreamOwned::new(conn, tcp), path, "")
}
