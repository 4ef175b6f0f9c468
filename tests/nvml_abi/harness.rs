//! The harness: builds the C stand-in with the system C compiler, writes its configuration, runs
//! the real `gpu-exporter` binary against it (`--backend nvml`, `LD_LIBRARY_PATH`), scrapes it
//! over 127.0.0.1 and parses what it serves.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a test waits for the exporter to show what it expects (a debug build on a busy
/// 2-core CI machine is slow; the conditions usually hold within a second).
pub const PATIENCE: Duration = Duration::from_secs(40);

/// The stand-in library's directory (it holds `libnvidia-ml.so.1`), built once per test process.
pub fn library_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let lib = crate::cstandin::build(
            "nvml-abi",
            "tests/nvml_abi/nvml_standin.c",
            "libnvidia-ml.so.1",
            &["-lpthread"],
        );
        lib.parent().expect("the library's directory").to_path_buf()
    })
}

/// A node description: the stand-in's `key = value` configuration.
pub type Node = BTreeMap<String, String>;

/// One configured stand-in: its configuration and status files in a temporary directory.
pub struct StandIn {
    dir: tempfile::TempDir,
    /// The node it describes now.
    pub node: Node,
}

impl StandIn {
    /// A stand-in describing `node`.
    pub fn new(node: Node) -> Self {
        let s = Self {
            dir: tempfile::tempdir().expect("temp dir"),
            node,
        };
        s.write();
        s
    }

    /// The configuration file.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("node.conf")
    }

    /// The status file the stand-in writes.
    pub fn status_path(&self) -> PathBuf {
        self.dir.path().join("status")
    }

    /// Replaces the configuration atomically (the stand-in re-reads it on its next call).
    pub fn write(&self) {
        let mut text = String::new();
        for (k, v) in &self.node {
            text.push_str(k);
            text.push_str(" = ");
            text.push_str(v);
            text.push('\n');
        }
        let tmp = self.dir.path().join("node.conf.tmp");
        std::fs::write(&tmp, text).expect("write the stand-in configuration");
        std::fs::rename(&tmp, self.config_path()).expect("install the stand-in configuration");
    }

    /// Changes the node and writes it.
    pub fn update(&mut self, f: impl FnOnce(&mut Node)) {
        f(&mut self.node);
        self.write();
    }

    /// The stand-in's counters (empty before its first write).
    pub fn status(&self) -> BTreeMap<String, String> {
        std::fs::read_to_string(self.status_path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// A numeric counter of the status file (0 when absent).
    pub fn counter(&self, key: &str) -> u64 {
        self.status()
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Waits until `cond` holds on the status file.
    pub fn wait_status(&self, what: &str, cond: impl Fn(&BTreeMap<String, String>) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let st = self.status();
            if cond(&st) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "stand-in never reached: {what}\nstatus: {st:#?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A running `gpu-exporter --backend nvml` against a stand-in.
pub struct Exporter {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Exporter {
    /// Starts the exporter with `args` (after `--backend nvml -a 127.0.0.1:0 -c 200`) and waits
    /// until it listens.
    pub fn start(standin: &StandIn, args: &[&str]) -> Self {
        Self::start_with_env(standin, args, &[])
    }

    /// [`Exporter::start`] with more environment variables (set after the harness's own, so
    /// they may replace `LD_LIBRARY_PATH`).
    pub fn start_with_env(
        standin: &StandIn,
        args: &[&str],
        env: &[(&str, std::ffi::OsString)],
    ) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-exporter"))
            .args([
                "--backend",
                "nvml",
                "-a",
                "127.0.0.1:0",
                "-c",
                "200",
                "--log-format",
                "json",
            ])
            .args(args)
            .env("LD_LIBRARY_PATH", library_dir())
            .env("NVML_STANDIN_CONFIG", standin.config_path())
            .env("NVML_STANDIN_STATUS", standin.status_path())
            .env("NODE_NAME", "node-a")
            .env_remove("DCGM_EXPORTER_COLLECTORS")
            .env_remove("DCGM_EXPORTER_INTERVAL")
            .env_remove("GPU_EXPORTER_LOG")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpu-exporter");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = listening_address(&line) {
                    let _ = tx.send(addr);
                }
                sink.lock().unwrap().push(line);
            }
        });
        let Ok(addr) = rx.recv_timeout(PATIENCE) else {
            let _ = child.kill();
            panic!(
                "gpu-exporter did not start listening:\n{}",
                logs.lock().unwrap().join("\n")
            );
        };
        Self { child, addr, logs }
    }

    /// Sends SIGTERM and waits up to `limit` for the process to end: how long it took and
    /// how it ended, or `None` if it was still running then.
    pub fn terminate(&mut self, limit: Duration) -> Option<(Duration, std::process::ExitStatus)> {
        let sent = Instant::now();
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(killed.success(), "kill -TERM failed");
        while sent.elapsed() < limit {
            if let Some(status) = self.child.try_wait().expect("wait for gpu-exporter") {
                return Some((sent.elapsed(), status));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Everything the exporter logged so far.
    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// GETs `path`; returns the status code and body.
    pub fn get(&self, path: &str) -> (u16, String) {
        let mut s =
            TcpStream::connect_timeout(&self.addr, Duration::from_secs(5)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // HTTP/1.0: the answer is not chunked and the connection closes after it.
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read the answer");
        let text = String::from_utf8(raw).expect("utf-8 answer");
        let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("a status code");
        (code, body.to_owned())
    }

    /// The current `/metrics` body, parsed.
    pub fn scrape(&self) -> Scrape {
        self.try_scrape()
            .unwrap_or_else(|| panic!("no sample published yet\n{}", self.logs()))
    }

    /// The current `/metrics` body, parsed; `None` before the first sample (503).
    pub fn try_scrape(&self) -> Option<Scrape> {
        let (code, body) = self.get("/metrics");
        if code == 503 {
            return None;
        }
        assert_eq!(code, 200, "{body}");
        Some(Scrape::parse(&body))
    }

    /// Scrapes until `cond` holds; returns that scrape. Panics with the last body and the logs
    /// after [`PATIENCE`].
    pub fn wait_for(&self, what: &str, cond: impl Fn(&Scrape) -> bool) -> Scrape {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let s = self.try_scrape();
            if let Some(s) = s.as_ref().filter(|s| cond(s)) {
                return s.clone();
            }
            if Instant::now() >= deadline {
                panic!(
                    "gpu-exporter never showed: {what}\n--- last /metrics ---\n{}\n--- logs ---\n{}",
                    s.map_or_else(|| "(none: 503)".to_owned(), |s| s.text),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn listening_address(line: &str) -> Option<SocketAddr> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = v.get("fields")?;
    if fields.get("message")?.as_str()? != "gpu-exporter listening" {
        return None;
    }
    fields.get("address")?.as_str()?.parse().ok()
}

/// One series of a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Metric name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

impl Series {
    /// A label's value ("" when absent).
    pub fn label(&self, k: &str) -> &str {
        self.labels.get(k).map_or("", String::as_str)
    }
}

/// A parsed `/metrics` body.
#[derive(Debug, Clone)]
pub struct Scrape {
    /// The body as served.
    pub text: String,
    /// Its series.
    pub series: Vec<Series>,
}

impl Scrape {
    /// Parses Prometheus text exposition.
    pub fn parse(text: &str) -> Self {
        let series = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| parse_line(l).unwrap_or_else(|| panic!("unparsable series line: {l}")))
            .collect();
        Self {
            text: text.to_owned(),
            series,
        }
    }

    /// All series named `name`.
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Series> + 'a {
        self.series.iter().filter(move |s| s.name == name)
    }

    /// The value of the one series named `name` whose labels include all of `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut hits = self
            .named(name)
            .filter(|s| labels.iter().all(|(k, v)| s.label(k) == *v));
        let first = hits.next()?;
        assert!(
            hits.next().is_none(),
            "several {name} series match {labels:?}"
        );
        Some(first.value)
    }

    /// `gpu_exporter_samples_total`.
    pub fn samples(&self) -> u64 {
        self.value("gpu_exporter_samples_total", &[]).unwrap_or(0.0) as u64
    }
}

fn parse_line(line: &str) -> Option<Series> {
    let bytes = line.as_bytes();
    let mut i = line.find(['{', ' '])?;
    let name = line[..i].to_owned();
    let mut labels = BTreeMap::new();
    if bytes[i] == b'{' {
        i += 1;
        loop {
            match bytes.get(i)? {
                b'}' => {
                    i += 1;
                    break;
                }
                b',' => {
                    i += 1;
                    continue;
                }
                _ => {}
            }
            let eq = i + line[i..].find('=')?;
            let key = line[i..eq].to_owned();
            i = eq + 1;
            if *bytes.get(i)? != b'"' {
                return None;
            }
            i += 1;
            let mut value = String::new();
            loop {
                let c = line[i..].chars().next()?;
                i += c.len_utf8();
                match c {
                    '\\' => {
                        let n = line[i..].chars().next()?;
                        i += n.len_utf8();
                        value.push(if n == 'n' { '\n' } else { n });
                    }
                    '"' => break,
                    other => value.push(other),
                }
            }
            labels.insert(key, value);
        }
    }
    Some(Series {
        name,
        labels,
        value: parse_value(&line[i..])?,
    })
}

fn parse_value(v: &str) -> Option<f64> {
    match v.trim() {
        "NaN" => Some(f64::NAN),
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

#[test]
fn the_parser_reads_labels_and_values() {
    let s = Scrape::parse(
        "# HELP x y\nDCGM_X{gpu=\"0\",err_msg=\"a \\\"b\\\", c\",z=\"\"} 1.5\nplain 3\n",
    );
    assert_eq!(s.series.len(), 2);
    assert_eq!(s.series[0].label("err_msg"), "a \"b\", c");
    assert_eq!(s.series[0].label("z"), "");
    assert_eq!(s.value("DCGM_X", &[("gpu", "0")]), Some(1.5));
    assert_eq!(s.value("plain", &[]), Some(3.0));
}
