//! Connection floods against the real binary (`--backend sim -c 1000`) on loopback, plain HTTP
//! and TLS: idle sockets, half-sent TLS ClientHellos and slowloris clients, sent from 127.0.0.2
//! (a hostile pod) while a scraper on 127.0.0.1 (Prometheus) scrapes on fresh connections.
//!
//! The attacker renews every socket the server closes, so the pressure lasts the whole flood.
//! Every scrape during a flood must return 200 within [`SCRAPE_DEADLINE`] (a correctness
//! bound: the scrape must not queue behind the flood; a healthy server answers in milliseconds),
//! the exporter's RSS must not grow by more than the stated cost of the connections it holds
//! ([`RSS_SLACK_KIB`], [`SILENT_KIB`], [`ACTIVE_KIB`]), the phase timeouts and evictions must show in `gpu_exporter_http_connections_closed_total`, and
//! once the attacker stops every connection must be released (the open gauge back to at most
//! the scraper's own). Each test prints its figures (docs/security.md quotes them).
//!
//! The floods run one at a time (a lock) and each in a runtime of its own thread, so that the
//! scraper's deadline measures the exporter, not this process's scheduler.

mod common;

use std::io::BufRead as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tls::Ca;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;

/// A scrape during a flood must be answered (200, whole body) within this.
const SCRAPE_DEADLINE: Duration = Duration::from_secs(1);

/// The exporter's RSS may grow during a flood by at most this much, plus the cost of each
/// connection held: [`SILENT_KIB`] for every one, [`ACTIVE_KIB`] more for each past its first
/// byte (docs/security.md has the measured figures these bound).
const RSS_SLACK_KIB: u64 = 4 * 1024;
const SILENT_KIB: u64 = 3;
const ACTIVE_KIB: u64 = 48;

/// The defaults of `--http-max-connections` (with a descriptor limit over 4,224) and
/// `--http-max-active-connections`.
const DEFAULT_MAX_CONNECTIONS: usize = gpu_exporter::http::conn::MAX_CONNECTIONS_CEILING;
const DEFAULT_MAX_ACTIVE: usize = gpu_exporter::http::conn::DEFAULT_MAX_ACTIVE_CONNECTIONS;

/// The address the floods come from.
const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// The first bytes of a TLS ClientHello: a handshake record header announcing 512 bytes, and
/// the start of the handshake message. The rest never comes.
const HALF_CLIENT_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03];

/// What the slowloris clients trickle, a byte a second; never a complete head.
const SLOW_HEAD: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: gpu-exporter\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Raises this process's soft descriptor limit: the flood holds thousands of sockets.
fn enough_descriptors(need: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    if now.current.is_none_or(|c| c >= need) {
        return;
    }
    let hard = now.maximum.unwrap_or(u64::MAX);
    assert!(
        hard >= need,
        "these tests hold {need} sockets but the hard RLIMIT_NOFILE is {hard}; raise it (ulimit -Hn)"
    );
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(need),
            maximum: now.maximum,
        },
    )
    .expect("raising the soft RLIMIT_NOFILE");
}

/// A CA and a server certificate for localhost, written for `--web-config-file`.
struct Tls {
    ca_pem: String,
    web_config: PathBuf,
}

fn tls_files(dir: &Path) -> Tls {
    let ca = Ca::new("flood test CA");
    let (cert, key) = ca.leaf(&["localhost", "127.0.0.1"], false);
    let (crt, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&crt, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    let web_config = dir.join("web.yml");
    std::fs::write(
        &web_config,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            crt.display(),
            key_path.display()
        ),
    )
    .unwrap();
    Tls {
        ca_pem: ca.pem(),
        web_config,
    }
}

/// The exporter binary, running.
struct Exporter {
    child: Child,
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
    _dir: tempfile::TempDir,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Exporter {
    async fn start(tls: bool, extra: &[&str]) -> Exporter {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-exporter"));
        cmd.args([
            "--backend",
            "sim",
            "-c",
            "1000",
            "-a",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ])
        .args(extra)
        .env_remove("GPU_EXPORTER_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let connector = if tls {
            let files = tls_files(dir.path());
            cmd.arg("--web-config-file").arg(&files.web_config);
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(files.ca_pem.as_bytes()) {
                roots.add(c.unwrap()).unwrap();
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            Some(tokio_rustls::TlsConnector::from(Arc::new(config)))
        } else {
            None
        };
        let mut child = cmd.spawn().expect("starting the gpu-exporter binary");
        // The listening line carries the address bound; the rest of the log is drained.
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if v["fields"]["message"] == "gpu-exporter listening" {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(v["fields"]["address"].as_str().unwrap().to_owned());
                    }
                }
            }
        });
        let addr = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(30)))
            .await
            .unwrap()
            .expect("the exporter did not log its listening address");
        let mut e = Exporter {
            child,
            addr: addr.parse().unwrap(),
            tls: connector,
            _dir: dir,
        };
        e.wait_for_first_sample().await;
        e
    }

    async fn wait_for_first_sample(&mut self) {
        let started = Instant::now();
        loop {
            if let Ok((200, _)) = self.scrape().await {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no sample within 30 s"
            );
            assert!(self.child.try_wait().unwrap().is_none(), "exporter exited");
            // Polling another process's state.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// One scrape of /metrics on a fresh connection (with a TLS handshake when on TLS).
    async fn scrape(&self) -> Result<(u16, String), String> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        match &self.tls {
            None => exchange(tcp).await,
            Some(c) => {
                let tls = c
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await
                    .map_err(|e| format!("TLS handshake: {e}"))?;
                exchange(tls).await
            }
        }
    }

    /// A scrape that must return 200 within the deadline; returns the body and the time taken.
    async fn checked_scrape(&self, during: &str) -> (String, Duration) {
        let started = Instant::now();
        let r = tokio::time::timeout(SCRAPE_DEADLINE, self.scrape()).await;
        let took = started.elapsed();
        match r {
            Ok(Ok((200, body))) => (body, took),
            Ok(Ok((status, body))) => panic!("{during}: scrape got {status}: {body}"),
            Ok(Err(e)) => panic!("{during}: scrape failed after {took:?}: {e}"),
            Err(_) => panic!("{during}: no answer within {SCRAPE_DEADLINE:?}"),
        }
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> Result<(u16, String), String> {
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP response: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// The value of an unlabelled or labelled series in a body, 0 when absent.
fn value(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn closed(body: &str, reason: &str) -> f64 {
    value(
        body,
        &format!("gpu_exporter_http_connections_closed_total{{reason=\"{reason}\"}}"),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Connect and send nothing.
    Idle,
    /// Send the first bytes of a TLS ClientHello.
    HalfClientHello,
    /// Trickle a request head a byte a second.
    Slowloris,
}

/// A running flood: `n` attacker connections, each renewed when the server closes it.
struct Flood {
    stop: CancellationToken,
    open: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Flood {
    fn start(
        addr: SocketAddr,
        tls: Option<tokio_rustls::TlsConnector>,
        kind: Kind,
        n: usize,
    ) -> Flood {
        let stop = CancellationToken::new();
        let open = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicU64::new(0));
        let (s, o, c) = (stop.clone(), Arc::clone(&open), Arc::clone(&cut));
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let tasks: Vec<_> = (0..n)
                    .map(|_| {
                        tokio::spawn(attacker(
                            addr,
                            tls.clone(),
                            kind,
                            s.clone(),
                            Arc::clone(&o),
                            Arc::clone(&c),
                        ))
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            });
        });
        Flood {
            stop,
            open,
            cut,
            thread,
        }
    }

    /// Stops the attacker; every one of its sockets is closed when this returns.
    fn stop(self) -> u64 {
        self.stop.cancel();
        self.thread.join().unwrap();
        assert_eq!(self.open.load(Ordering::Relaxed), 0);
        self.cut.load(Ordering::Relaxed)
    }
}

async fn attacker(
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
    kind: Kind,
    stop: CancellationToken,
    open: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
) {
    while !stop.is_cancelled() {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(ATTACKER, 0)).unwrap();
        let s = tokio::select! {
            r = socket.connect(addr) => match r {
                Ok(s) => s,
                Err(_) => continue,
            },
            () = stop.cancelled() => return,
        };
        open.fetch_add(1, Ordering::Relaxed);
        let closed_by_server = match (&tls, kind) {
            // A TLS slowloris completes the handshake, then trickles the request inside it.
            (Some(c), Kind::Slowloris) => {
                let name = ServerName::try_from("localhost").unwrap();
                match c.connect(name, s).await {
                    Ok(s) => hold(s, kind, &stop).await,
                    Err(_) => true,
                }
            }
            _ => hold(s, kind, &stop).await,
        };
        open.fetch_sub(1, Ordering::Relaxed);
        if closed_by_server {
            cut.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Keeps a connection open the attacker's way until the server closes it (`true`) or the flood
/// stops (`false`).
async fn hold<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    kind: Kind,
    stop: &CancellationToken,
) -> bool {
    if kind == Kind::HalfClientHello && s.write_all(HALF_CLIENT_HELLO).await.is_err() {
        return true;
    }
    let mut sent = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut buf = [0u8; 512];
    loop {
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => return true,
                Ok(_) => {} // a 4xx or the like: keep reading until closed
            },
            _ = tick.tick(), if kind == Kind::Slowloris => {
                // The attacker's pacing, a byte a second: not synchronisation.
                let byte = SLOW_HEAD[sent % SLOW_HEAD.len()];
                if s.write_all(&[byte]).await.is_err() || s.flush().await.is_err() {
                    return true;
                }
                sent += 1;
            }
            () = stop.cancelled() => return false,
        }
    }
}

/// What one flood run saw.
#[derive(Debug)]
struct Figures {
    scrapes: usize,
    max_latency: Duration,
    rss_before_kib: u64,
    rss_max_kib: u64,
    open_max: f64,
    active_max: f64,
    cut_by_server: u64,
}

/// One flood: `n` attacker connections of `kind` for `duration`, against an exporter with
/// `max_connections` (`None`: the default from the descriptor limit); `expect`: close reasons
/// that must be counted.
struct Case {
    tls: bool,
    kind: Kind,
    n: usize,
    duration: Duration,
    max_connections: Option<usize>,
    max_active: Option<usize>,
    /// The part of the flood the server must have held open at once (0 for floods the server
    /// closes at once).
    fill: f64,
    expect: &'static [&'static str],
}

/// Runs `case`, scraping all along; checks the scrape deadline, the RSS bound, that the flood
/// filled the server, the close reasons and the release of every connection afterwards.
async fn flood(case: Case) -> Figures {
    let Case {
        tls,
        kind,
        n,
        duration,
        max_connections,
        max_active,
        fill,
        expect,
    } = case;
    let _one_at_a_time = SERIAL.lock().await;
    enough_descriptors(n as u64 + 1024);
    let label = format!("{} {kind:?} x{n}", if tls { "TLS" } else { "plain HTTP" });
    let mut extra = Vec::new();
    if let Some(m) = max_connections {
        extra.push("--http-max-connections".to_owned());
        extra.push(m.to_string());
    }
    if let Some(m) = max_active {
        extra.push("--http-max-active-connections".to_owned());
        extra.push(m.to_string());
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let exporter = Exporter::start(tls, &extra).await;
    let rss_before_kib = exporter.rss_kib();
    let flood = Flood::start(exporter.addr, exporter.tls.clone(), kind, n);

    let mut figures = Figures {
        scrapes: 0,
        max_latency: Duration::ZERO,
        rss_before_kib,
        rss_max_kib: rss_before_kib,
        open_max: 0.0,
        active_max: 0.0,
        cut_by_server: 0,
    };
    let started = Instant::now();
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    while started.elapsed() < duration {
        pace.tick().await;
        let (body, took) = exporter.checked_scrape(&label).await;
        figures.scrapes += 1;
        figures.max_latency = figures.max_latency.max(took);
        figures.open_max = figures
            .open_max
            .max(value(&body, "gpu_exporter_http_connections_open"));
        figures.active_max = figures
            .active_max
            .max(value(&body, "gpu_exporter_http_connections_active"));
        figures.rss_max_kib = figures.rss_max_kib.max(exporter.rss_kib());
    }
    figures.cut_by_server = flood.stop();
    // The flood did fill the server (the gauge is read once a second, at each sample).
    let filled = n.min(max_connections.unwrap_or(n)) as f64 * fill;
    assert!(
        figures.open_max >= filled,
        "{label}: at most {} connections were open",
        figures.open_max
    );
    if let Some(m) = max_connections {
        // Victims being closed are open a little longer than the limit says.
        let most = (m + gpu_exporter::http::conn::MAX_PENDING_EVICTIONS) as f64;
        assert!(figures.open_max <= most, "{label}: {figures:?}");
    }
    if let Some(m) = max_active {
        assert!(figures.active_max <= m as f64, "{label}: {figures:?}");
    }

    // Everything is released: the open gauge (as of the last sample) falls to at most the
    // scraper's own connection, and the close reasons show what the server did.
    let released = Instant::now();
    let body = loop {
        let (body, _) = exporter.checked_scrape(&label).await;
        if value(&body, "gpu_exporter_http_connections_open") <= 1.0
            && value(&body, "gpu_exporter_http_connections_active") <= 1.0
        {
            break body;
        }
        assert!(
            released.elapsed() < Duration::from_secs(10),
            "{label}: connections still open 10 s after the flood stopped: {}",
            value(&body, "gpu_exporter_http_connections_open")
        );
        pace.tick().await;
    };
    let reasons: Vec<String> = body
        .lines()
        .filter(|l| l.starts_with("gpu_exporter_http_connections_closed_total{"))
        .map(str::to_owned)
        .collect();
    println!(
        "FLOOD {label}: {} scrapes, max latency {:.1} ms, RSS {} -> max {} KiB (+{} KiB), \
         open max {}, active max {}, cut by the server {}, {}",
        figures.scrapes,
        figures.max_latency.as_secs_f64() * 1000.0,
        figures.rss_before_kib,
        figures.rss_max_kib,
        figures.rss_max_kib - figures.rss_before_kib,
        figures.open_max,
        figures.active_max,
        figures.cut_by_server,
        reasons.join(", ")
    );
    for reason in expect {
        assert!(
            closed(&body, reason) > 0.0,
            "{label}: no connection closed for {reason}: {reasons:?}"
        );
    }
    let held = n.min(max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS)) as u64;
    let active = match kind {
        Kind::Idle => 0,
        Kind::HalfClientHello | Kind::Slowloris => {
            n.min(max_active.unwrap_or(DEFAULT_MAX_ACTIVE)) as u64
        }
    };
    let bound = RSS_SLACK_KIB + SILENT_KIB * held + ACTIVE_KIB * active;
    assert!(
        figures.rss_max_kib - figures.rss_before_kib <= bound,
        "{label}: RSS grew by {} KiB, more than {bound} KiB",
        figures.rss_max_kib - figures.rss_before_kib
    );
    figures
}

/// Past the first-byte (2 s) and handshake (3 s) deadlines.
const SHORT_WINDOW: Duration = Duration::from_secs(4);

/// Past the header deadline (10 s from a request's first byte).
const SLOWLORIS_WINDOW: Duration = Duration::from_secs(12);

fn case(tls: bool, kind: Kind, n: usize, expect: &'static [&'static str]) -> Case {
    Case {
        tls,
        kind,
        n,
        duration: if kind == Kind::Slowloris {
            SLOWLORIS_WINDOW
        } else {
            SHORT_WINDOW
        },
        max_connections: None,
        max_active: None,
        fill: 0.8,
        expect,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_300_idle_sockets() {
    flood(case(false, Kind::Idle, 300, &["first_byte_timeout"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_300_idle_sockets() {
    flood(case(true, Kind::Idle, 300, &["handshake_timeout"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_2000_idle_sockets() {
    // Silent sockets are cheap (no buffers before the first byte): all 2,000 are held.
    flood(case(false, Kind::Idle, 2000, &["first_byte_timeout"])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_2000_idle_sockets_past_the_connection_limit() {
    // Over the limit: a storm of evictions and reconnections (the attacker renews at once).
    flood(Case {
        max_connections: Some(1000),
        ..case(true, Kind::Idle, 2000, &["evicted"])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_300_half_sent_client_hellos() {
    flood(case(
        true,
        Kind::HalfClientHello,
        300,
        &["handshake_timeout"],
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_300_half_sent_client_hellos() {
    // Not HTTP: answered 400 and closed at once, then renewed by the attacker.
    flood(Case {
        fill: 0.0,
        ..case(false, Kind::HalfClientHello, 300, &["error"])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_300_slowloris_clients_past_the_active_limit() {
    // Over the active limit: the flood's oldest opening connections give way to its newest,
    // which the attacker renews at once (an eviction storm), until the rest reach the header
    // deadline.
    flood(Case {
        max_active: Some(200),
        fill: 0.6,
        ..case(false, Kind::Slowloris, 300, &["evicted"])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_300_slowloris_clients() {
    // Handshake done, then the request head trickled inside TLS.
    flood(case(true, Kind::Slowloris, 300, &["header_timeout"])).await;
}
