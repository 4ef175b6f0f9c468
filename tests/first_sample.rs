//! Attribution from the first published sample, end to end: the `fake-kubelet` binary serves
//! pod-resources and CRI on real unix sockets and writes the node's /proc tree; the exporter
//! binary runs with `-k`, CRI metadata, per-process usage and an HPC job directory at the
//! default 30 s interval. The first scrape after `/ready` carries pod, CRI, process and HPC-job
//! labels; a pod that ends and a job file that changes are published at the sources' next
//! refresh, long before the next sample, without reading the GPUs again.
//!
//! Synchronisation is by the processes' log lines (the readiness line of fake-kubelet, the
//! exporter's JSON log), each waited for with a bounded deadline; nothing sleeps.

mod common;

use common::fake_node::FakeNode;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest wait for one log line.
const DEADLINE: Duration = Duration::from_secs(20);

/// The exporter binary with its JSON log messages on a channel.
struct Exporter {
    child: Child,
    addr: SocketAddr,
    log: mpsc::Receiver<serde_json::Value>,
    /// Lines read while waiting for another message, oldest first (not yet waited for).
    backlog: Vec<serde_json::Value>,
}

impl Exporter {
    fn start(args: &[&std::ffi::OsStr]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-exporter"))
            .args([
                "--backend",
                "sim",
                "-a",
                "127.0.0.1:0",
                "--log-format",
                "json",
            ])
            .args(args)
            .env("GPU_EXPORTER_LOG", "gpu_exporter=debug")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gpu-exporter");
        let err = child.stderr.take().expect("stderr");
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let mut e = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            backlog: Vec::new(),
        };
        let listening = e.wait_for("gpu-exporter listening");
        e.addr = listening["fields"]["address"]
            .as_str()
            .expect("address field")
            .parse()
            .expect("address");
        e
    }

    /// Waits for the next log line whose message starts with `message` (one logged while
    /// waiting for another counts); returns it.
    fn wait_for(&mut self, message: &str) -> serde_json::Value {
        let is = |v: &serde_json::Value| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message))
        };
        if let Some(i) = self.backlog.iter().position(is) {
            return self.backlog.remove(i);
        }
        let until = Instant::now() + DEADLINE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let Ok(v) = self.log.recv_timeout(left) else {
                let exited = self.child.try_wait().ok().flatten();
                panic!("the exporter never logged {message:?} (exited: {exited:?})");
            };
            if is(&v) {
                return v;
            }
            self.backlog.push(v);
        }
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let mut s = TcpStream::connect(self.addr).await.expect("connect");
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("request");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.expect("response");
        let text = String::from_utf8(buf).expect("utf-8 response");
        let status = text
            .strip_prefix("HTTP/1.1 ")
            .and_then(|t| t.get(..3))
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const FB: &str = "DCGM_FI_DEV_FB_USED";

/// The `metric` lines of GPU `gpu`, MIG instance `gi`.
fn lines_for<'a>(body: &'a str, metric: &str, gpu: u32, gi: u32) -> Vec<&'a str> {
    let (g, i) = (format!("gpu=\"{gpu}\","), format!("GPU_I_ID=\"{gi}\","));
    common::series(body, metric)
        .into_iter()
        .filter(|l| l.contains(&g) && l.contains(&i))
        .collect()
}

/// The value of an unlabelled self-metric.
fn value(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in the body"))
}

const ETL: &str =
    "container=\"worker\",namespace=\"batch\",pod=\"etl-0\",pod_uid=\"8c1d5e7a-2b44-4f19-9a6e-0c3b7d9e5f10\",app=\"etl\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_scrape_after_ready_is_attributed_and_changes_follow_without_a_gpu_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (kubelet, cri, proc_root, assignments, hpc) = (
        d.join("kubelet.sock"),
        d.join("cri.sock"),
        d.join("proc"),
        d.join("node.toml"),
        d.join("hpc"),
    );
    let node_text = std::fs::read_to_string(common::pods_fixture("a100-mig-shared-seed1.toml"))
        .expect("fixture");
    std::fs::write(&assignments, &node_text).unwrap();
    std::fs::create_dir(&hpc).unwrap();
    // A batch job on GPU 1's MIG instance 0 (7g.80gb), as a Slurm prolog writes it.
    std::fs::write(hpc.join("1.0"), "4412\n").unwrap();
    let fake = FakeNode::start(&kubelet, &cri, &proc_root, &assignments);

    let endpoint = format!("unix://{}", cri.display());
    let args: Vec<&std::ffi::OsStr> = vec![
        "--sim-profile".as_ref(),
        "4xA100-80GB-MIG".as_ref(),
        "--sim-seed".as_ref(),
        "1".as_ref(),
        "--sim-processes".as_ref(),
        assignments.as_os_str(),
        "-k".as_ref(),
        "--pod-resources-kubelet-socket".as_ref(),
        kubelet.as_os_str(),
        "--container-runtime-endpoint".as_ref(),
        endpoint.as_ref(),
        "--kubernetes-enable-pod-uid".as_ref(),
        "--kubernetes-enable-pod-labels".as_ref(),
        "--kubernetes-process-usage".as_ref(),
        "--path.procfs".as_ref(),
        proc_root.as_os_str(),
        "--hpc-job-mapping-dir".as_ref(),
        hpc.as_os_str(),
        // Refreshes of 1 s keep the test short; the collect interval is the default 30 s.
        "--pod-resources-refresh".as_ref(),
        "1000".as_ref(),
        "--cri-refresh".as_ref(),
        "1000".as_ref(),
    ];
    let mut exporter = Exporter::start(&args);
    exporter.wait_for("first sample published");

    let (status, ready) = exporter.get("/ready").await;
    assert_eq!((status, ready.as_str()), (200, "ready\n"));
    let (status, first) = exporter.get("/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(value(&first, "gpu_exporter_samples_total"), 1.0);
    assert_eq!(value(&first, "gpu_exporter_attribution_updates_total"), 0.0);
    for source in ["cri", "hpc", "kubelet"] {
        let line = format!(
            "gpu_exporter_attribution_first_answer_timeouts_total{{source=\"{source}\"}} 0\n"
        );
        assert!(first.contains(&line), "{line}");
    }
    // Kubelet (pod, namespace, container), CRI (pod_uid, pod labels), per-process usage and
    // the HPC job, all in the first sample.
    let etl = lines_for(&first, FB, 0, 2);
    assert_eq!(etl.len(), 1, "{etl:?}");
    assert!(etl[0].contains(ETL), "{}", etl[0]);
    let procs = lines_for(&first, "gpu_exporter_container_processes", 0, 2);
    assert_eq!(procs.len(), 1, "{procs:?}");
    assert!(
        procs[0].contains(ETL) && procs[0].ends_with(" 2"),
        "{}",
        procs[0]
    );
    assert!(first.contains("gpu_exporter_gpu_processes{outcome=\"attributed\"} 6\n"));
    let job = lines_for(&first, FB, 1, 0);
    assert_eq!(job.len(), 1);
    assert!(job[0].contains("hpc_job=\"4412\""), "{}", job[0]);
    assert!(!first.contains("hpc_job=\"4413\""));

    // etl-0 ends (removed from the node) and the job on GPU 1 is replaced.
    let start = node_text
        .find("[[assignment]]\nnamespace = \"batch\"")
        .unwrap();
    let end = start + node_text[start + 1..].find("[[assignment]]").unwrap() + 1;
    let without_etl = format!("{}{}", &node_text[..start], &node_text[end..]);
    assert!(!without_etl.contains("pod = \"etl-0\""));
    let tmp = d.join("node.new");
    std::fs::write(&tmp, &without_etl).unwrap();
    std::fs::rename(&tmp, &assignments).unwrap();
    fake.reload();
    let tmp = hpc.join(".1.0.new");
    std::fs::write(&tmp, "4413\n").unwrap();
    std::fs::rename(&tmp, hpc.join("1.0")).unwrap();

    // Each change a source publishes is re-published at once: wait for the re-publications
    // until both changes are in.
    let body = loop {
        exporter.wait_for("attribution changed");
        let (_, body) = exporter.get("/metrics").await;
        if !body.contains("pod=\"etl-0\"") && body.contains("hpc_job=\"4413\"") {
            break body;
        }
    };
    assert_eq!(
        value(&body, "gpu_exporter_samples_total"),
        1.0,
        "published before the next sample"
    );
    assert!(value(&body, "gpu_exporter_attribution_updates_total") >= 2.0);
    let etl = lines_for(&body, FB, 0, 2);
    assert_eq!(etl.len(), 1);
    assert!(!etl[0].contains("pod="), "{}", etl[0]);
    // The readings are the first sample's: the value is the same, only the labels went.
    let reading = |l: &str| l.rsplit_once(' ').map(|(_, v)| v.to_owned()).unwrap();
    assert_eq!(
        reading(etl[0]),
        reading(lines_for(&first, FB, 0, 2)[0]),
        "same reading"
    );
    let job = lines_for(&body, FB, 1, 0);
    assert_eq!(job.len(), 1);
    assert!(job[0].contains("hpc_job=\"4413\""), "{}", job[0]);
    // Other pods keep their labels.
    assert!(body.contains("pod=\"embed-a\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_socket_does_not_hold_the_first_sample_for_its_call_timeout() {
    // With -k and neither the kubelet's nor the runtime's socket present, waiting the call
    // timeouts (ten minutes each here) would not help: the first sample is published at once,
    // without pod labels, and the sources are not counted as having timed out.
    let dir = tempfile::tempdir().unwrap();
    let kubelet = dir.path().join("kubelet.sock");
    let cri = dir.path().join("cri.sock");
    let mut e = Exporter::start(&[
        "-k".as_ref(),
        "--pod-resources-kubelet-socket".as_ref(),
        kubelet.as_os_str(),
        "--pod-resources-timeout".as_ref(),
        "600000".as_ref(),
        "--kubernetes-process-usage".as_ref(),
        "--container-runtime-endpoint".as_ref(),
        format!("unix://{}", cri.display()).as_ref(),
        "--cri-timeout".as_ref(),
        "600000".as_ref(),
        "--path.procfs".as_ref(),
        dir.path().as_os_str(),
    ]);
    let mut sources = std::collections::BTreeSet::new();
    for _ in 0..2 {
        let v = e.wait_for("first sample published without this attribution source: it cannot");
        assert_eq!(v["fields"]["reason"], "socket_missing", "{v}");
        sources.insert(
            v["fields"]["source"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    assert_eq!(sources, ["cri".to_owned(), "kubelet".to_owned()].into());
    e.wait_for("first sample published; /ready answers 200");
    let (status, body) = e.get("/metrics").await;
    assert_eq!(status, 200, "{body}");
    assert!(common::series(&body, FB)
        .iter()
        .all(|l| !l.contains("pod=")));
    for source in ["cri", "kubelet"] {
        let line = format!(
            "gpu_exporter_attribution_first_answer_timeouts_total{{source=\"{source}\"}} 0\n"
        );
        assert!(
            body.contains(&line),
            "{line} (no source timed out):\n{body}"
        );
    }
}
