//! The Kubernetes API where dcgm-exporter reads it, end to end through the real binary against
//! a test API server on 127.0.0.1 (tests/kube_api/server.rs: real HTTP, the API's JSON, list
//! and chunked watch with resourceVersions, 401/403/410 as `Status` objects):
//!
//! - `-m NAMESPACE:NAME`: the ConfigMap's `metrics` CSV is what /metrics serves; each way it can
//!   fail is a startup error naming the flag, the ConfigMap and the cause;
//! - pod UIDs and labels from a node-scoped pod watch when no runtime socket is mounted, with
//!   the fake kubelet binary for the pod-resources attribution: watch events (added, modified,
//!   deleted), 410 Gone (a new list finds the pods the broken watch missed), 401, 403 and a
//!   hung server degrading with `gpu_exporter_kube_api_*` and a warning that names the cause.
//!
//! Synchronisation: readiness lines and polling of /metrics with a deadline; no sleeps.

mod common;
#[path = "kube_api/server.rs"]
mod server;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::binary::{self, Exporter};
use server::{ApiServer, TOKEN};

/// How long a condition polled on /metrics may take (the retry backoff tops at 10 s).
const DEADLINE: Duration = Duration::from_secs(40);

const CSV: &str = "# The ConfigMap's CSV\nDCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\nDCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\n";

fn metrics(e: &Exporter) -> String {
    let (status, body) = binary::get(e.loopback(), "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// Polls /metrics until `ok` holds; the last body.
fn until(e: &Exporter, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    loop {
        let body = metrics(e);
        if ok(&body) {
            return body;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{what}: not within {DEADLINE:?}\n--- body:\n{body}\n--- log:\n{}",
            e.log()
        );
        // Polling another process's state.
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of a self-metric series (the exact series text before the value).
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Asserts that the unlabelled-or-exact `series` of `body` has the value `want`.
#[track_caller]
fn expect_value(body: &str, series: &str, want: f64) {
    assert_eq!(value(body, series), Some(want), "{series}:\n{body}");
}

/// The GPU temperature lines of `pod`.
fn pod_lines<'a>(body: &'a str, pod: &str) -> Vec<&'a str> {
    let needle = format!("pod=\"{pod}\"");
    body.lines()
        .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_TEMP{") && l.contains(&needle))
        .collect()
}

fn has(body: &str, pod: &str, label: &str) -> bool {
    let lines = pod_lines(body, pod);
    !lines.is_empty() && lines.iter().all(|l| l.contains(label))
}

fn lacks(body: &str, pod: &str, label: &str) -> bool {
    let lines = pod_lines(body, pod);
    !lines.is_empty() && lines.iter().all(|l| !l.contains(label))
}

// ---------------------------------------------------------------------------------------------
// -m / --configmap-data

fn configmap_command(kubeconfig: &Path, value: &str) -> Command {
    let mut cmd = binary::command();
    cmd.env("KUBECONFIG", kubeconfig)
        .args(["--address", "127.0.0.1:0", "-m", value]);
    cmd
}

#[test]
fn configmap_csv_is_what_metrics_serves() {
    let api = ApiServer::spawn();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path(), TOKEN);
    api.put_configmap(
        "gpu-operator",
        "metrics-config",
        &[("metrics", CSV), ("other", "x")],
    );
    // -f names the shipped CSV too: the ConfigMap wins, as in dcgm-exporter.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("metrics-config/default-counters.csv");
    let mut cmd = configmap_command(&kubeconfig, "gpu-operator:metrics-config");
    cmd.arg("-f").arg(&shipped);
    let mut e = Exporter::start(cmd);
    e.wait_ready();
    let body = metrics(&e);
    assert!(body.contains("\nDCGM_FI_DEV_GPU_TEMP{"), "{body}");
    assert!(body.contains("\nDCGM_FI_DEV_POWER_USAGE{"), "{body}");
    // In the shipped CSV, not in the ConfigMap's.
    assert!(!body.contains("DCGM_FI_DEV_SM_CLOCK"), "{body}");
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("get configmaps")),
        "{:?}",
        api.requests()
    );
    assert!(
        e.log().contains("metrics CSV from the ConfigMap"),
        "{}",
        e.log()
    );
    // Read once, as dcgm-exporter does: SIGHUP says so and changes nothing.
    let gets = |api: &ApiServer| {
        api.requests()
            .iter()
            .filter(|r| r.starts_with("get configmaps"))
            .count()
    };
    assert_eq!(gets(&api), 1);
    let hup = Command::new("kill")
        .args(["-HUP", &e.pid().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    let started = Instant::now();
    while e.warnings_about("ConfigMap gpu-operator/metrics-config at startup and is not reloaded")
        == 0
    {
        assert!(
            started.elapsed() < DEADLINE,
            "no SIGHUP warning:\n{}",
            e.log()
        );
        // Polling another process's log.
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(gets(&api), 1);
    assert!(!metrics(&e).contains("DCGM_FI_DEV_SM_CLOCK"));
}

#[test]
fn configmap_failures_are_startup_errors_naming_the_flag_and_the_cause() {
    let api = ApiServer::spawn();
    let dir = tempfile::tempdir().unwrap();
    let good = api.kubeconfig(dir.path(), TOKEN);
    let bad_token = api.kubeconfig(dir.path(), "expired-token");
    api.put_configmap("gpu", "nokey", &[("metrics.csv", CSV)]);
    api.put_configmap(
        "gpu",
        "badcsv",
        &[(
            "metrics",
            "DCGM_FI_DEV_GPU_TEMP, gauge, ok\nDCGM_FI_DEV_NOPE, gauge, no such field\n",
        )],
    );
    api.put_configmap("gpu", "locked", &[("metrics", CSV)]);
    let cases: Vec<(&Path, &str, Vec<&str>)> = vec![
        (
            &good,
            "gpu",
            vec!["--configmap-data / -m \"gpu\": expected NAMESPACE:NAME"],
        ),
        (
            &good,
            "gpu:absent",
            vec![
                "--configmap-data: get configmaps gpu/absent: 404 Not Found",
                "configmaps \\\"absent\\\" not found",
            ],
        ),
        (
            &good,
            "gpu:nokey",
            vec!["configmap gpu/nokey: no `metrics` key (it has: metrics.csv)"],
        ),
        (
            &good,
            "gpu:badcsv",
            vec!["--configmap-data", "configmap gpu/badcsv key metrics:2:"],
        ),
        (
            &bad_token,
            "gpu:locked",
            vec!["get configmaps gpu/locked: 401 Unauthorized"],
        ),
    ];
    for (kubeconfig, value, wants) in cases {
        let (status, stderr) = binary::run_to_exit(configmap_command(kubeconfig, value));
        assert!(!status.success(), "{value}: {stderr}");
        for want in wants {
            assert!(
                stderr.contains(want),
                "{value}: want {want:?} in:\n{stderr}"
            );
        }
    }
    api.forbid("get", "configmaps");
    let (status, stderr) = binary::run_to_exit(configmap_command(&good, "gpu:locked"));
    assert!(!status.success());
    assert!(
        stderr.contains("get configmaps gpu/locked: 403 Forbidden")
            && stderr.contains("grant verb `get` on resource `configmaps`"),
        "{stderr}"
    );
    api.allow("get", "configmaps");
    // A server that never answers: the call's own timeout, not a hang.
    api.hang("get");
    let mut cmd = configmap_command(&good, "gpu:locked");
    cmd.args(["--kube-api-timeout", "300"]);
    let (status, stderr) = binary::run_to_exit(cmd);
    assert!(!status.success());
    assert!(
        stderr.contains("get configmaps gpu/locked: no answer within 300ms"),
        "{stderr}"
    );
    // No configuration at all.
    let mut cmd = binary::command();
    cmd.env("KUBECONFIG", dir.path().join("absent")).args([
        "--address",
        "127.0.0.1:0",
        "-m",
        "gpu:locked",
    ]);
    let (status, stderr) = binary::run_to_exit(cmd);
    assert!(!status.success());
    assert!(
        stderr.contains("no Kubernetes API configuration"),
        "{stderr}"
    );
}

#[test]
fn https_is_verified_against_the_kubeconfig_ca() {
    // The in-cluster case in kind: HTTPS to the API server, trusting the cluster's CA only.
    let api = ApiServer::spawn_tls();
    let dir = tempfile::tempdir().unwrap();
    api.put_configmap("gpu", "metrics", &[("metrics", CSV)]);
    let kubeconfig = api.kubeconfig(dir.path(), TOKEN);
    let mut e = Exporter::start(configmap_command(&kubeconfig, "gpu:metrics"));
    e.wait_ready();
    let body = metrics(&e);
    assert!(body.contains("\nDCGM_FI_DEV_POWER_USAGE{"), "{body}");
    assert!(!body.contains("DCGM_FI_DEV_SM_CLOCK"), "{body}");
    // A server whose certificate another CA signed is refused.
    let other = ApiServer::spawn_tls();
    let wrong = api.kubeconfig_with_ca(dir.path(), "wrong-ca", other.ca_pem.as_deref());
    let (status, stderr) = binary::run_to_exit(configmap_command(&wrong, "gpu:metrics"));
    assert!(!status.success());
    assert!(
        stderr.contains("get configmaps gpu/metrics") && stderr.contains("certificate"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// Pod UIDs and labels from the API server

/// Two more whole-GPU pods than the h100-seed1 fixture: batch/etl-4 on GPU 4, batch/etl-5 on
/// GPU 5 (the simulated fleet's UUIDs with --sim-seed 1).
const MORE_PODS: &str = r#"
[[assignment]]
namespace = "batch"
pod = "etl-4"
container = "worker"
devices = ["GPU-c1227189-c423-66ba-b8f1-7bdf47295b80"]

[[assignment]]
namespace = "batch"
pod = "etl-5"
container = "worker"
devices = ["GPU-bedb4fa8-b4d0-8e0e-805a-439e780882d3"]
"#;

/// `fake-kubelet` serving the h100-seed1 assignments and [`MORE_PODS`] on a pod-resources
/// socket; killed on drop.
struct FakeKubelet(Child);

impl FakeKubelet {
    fn start(socket: &Path) -> Self {
        let fixture = std::fs::read_to_string(common::pods_fixture("h100-seed1.toml")).unwrap();
        let assignments = socket.with_extension("toml");
        std::fs::write(&assignments, format!("{fixture}{MORE_PODS}")).unwrap();
        let mut child = Command::new(common::fake_kubelet_bin::fake_kubelet_bin())
            .arg("--socket")
            .arg(socket)
            .arg("--assignments")
            .arg(assignments)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fake-kubelet");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "fake-kubelet exited");
            if line.starts_with("fake-kubelet: serving") {
                break;
            }
        }
        Self(child)
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node: the fake kubelet, no runtime socket, the exporter with pod UIDs and labels on.
struct Node {
    exporter: Exporter,
    _kubelet: FakeKubelet,
    _dir: tempfile::TempDir,
}

fn start_node(api: &ApiServer, token: &str, extra: &[&str]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let kubelet_sock = dir.path().join("kubelet.sock");
    let kubelet = FakeKubelet::start(&kubelet_sock);
    let kubeconfig = api.kubeconfig(dir.path(), token);
    let absent = format!("unix://{}", dir.path().join("containerd.sock").display());
    let mut cmd = binary::command();
    cmd.env("KUBECONFIG", &kubeconfig)
        .env("NODE_NAME", "node-1")
        .args([
            "--address",
            "127.0.0.1:0",
            "--sim-profile",
            "8xH100-SXM",
            "--sim-seed",
            "1",
            "-k",
        ])
        .arg("--pod-resources-kubelet-socket")
        .arg(&kubelet_sock)
        .args(["--pod-resources-refresh", "1000"])
        .args(["--container-runtime-endpoint", &absent])
        .args([
            "--kubernetes-enable-pod-uid",
            "--kubernetes-enable-pod-labels",
        ])
        .args(extra);
    let mut exporter = Exporter::start(cmd);
    exporter.wait_ready();
    Node {
        exporter,
        _kubelet: kubelet,
        _dir: dir,
    }
}

fn seed_pods(api: &ApiServer) {
    api.put_pod(
        "ml",
        "llm-train-0",
        "uid-llm-0",
        "node-1",
        &[("app", "llm"), ("team.example.com/owner", "alice")],
    );
    api.put_pod(
        "ml",
        "notebook-alice",
        "uid-nb-1",
        "node-1",
        &[("app", "notebook")],
    );
    // Another node's pod, with the same name as a pod of this node's kubelet: not listed here.
    api.put_pod(
        "batch",
        "etl-4",
        "uid-elsewhere",
        "node-2",
        &[("app", "wrong")],
    );
}

#[test]
fn pod_uid_and_labels_come_from_a_node_scoped_watch_without_a_runtime_socket() {
    let api = ApiServer::spawn();
    seed_pods(&api);
    let node = start_node(&api, TOKEN, &[]);
    let e = &node.exporter;
    let body = until(e, "labels from the first list", |b| {
        has(b, "llm-train-0", "pod_uid=\"uid-llm-0\"")
            && has(b, "llm-train-0", "app=\"llm\"")
            && has(b, "llm-train-0", "team_example_com_owner=\"alice\"")
            && has(b, "notebook-alice", "app=\"notebook\"")
    });
    // The kubelet attributes batch/etl-4, but this node's API pods do not include it.
    assert!(lacks(&body, "etl-4", "pod_uid="), "{body}");
    assert!(lacks(&body, "etl-4", "app=\"wrong\""), "{body}");
    expect_value(&body, "gpu_exporter_kube_api_up", 1.0);
    expect_value(&body, "gpu_exporter_kube_api_pods", 2.0);
    expect_value(&body, "gpu_exporter_kube_api_lists_total", 1.0);
    let requests = api.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("list pods ?")
                && r.contains("fieldSelector=spec.nodeName%3Dnode-1")),
        "{requests:?}"
    );
    assert!(
        e.log()
            .contains("pod UIDs and labels from the Kubernetes API server"),
        "{}",
        e.log()
    );
    assert!(
        !e.log().contains("pod metadata from the container runtime"),
        "no runtime client: {}",
        e.log()
    );

    // Watch events: a label changed, a pod started, a pod deleted.
    api.put_pod(
        "ml",
        "notebook-alice",
        "uid-nb-1",
        "node-1",
        &[("app", "notebook-v2")],
    );
    api.put_pod("batch", "etl-4", "uid-etl-4", "node-1", &[("app", "etl")]);
    until(e, "MODIFIED and ADDED", |b| {
        has(b, "notebook-alice", "app=\"notebook-v2\"") && has(b, "etl-4", "pod_uid=\"uid-etl-4\"")
    });
    api.delete_pod("ml", "llm-train-0");
    let body = until(e, "DELETED", |b| lacks(b, "llm-train-0", "pod_uid="));
    assert!(lacks(&body, "llm-train-0", "app=\"llm\""), "{body}");
    expect_value(&body, "gpu_exporter_kube_api_pods", 2.0);
    api.bookmark();

    // The server ends the watch (its timeout): watched again from the last resourceVersion, no
    // new list; a change made after that arrives as an event.
    api.end_watches();
    let started = Instant::now();
    while api.open_watches() == 0 {
        assert!(started.elapsed() < DEADLINE, "no new watch:\n{}", e.log());
        // Polling the test server's state.
        std::thread::sleep(Duration::from_millis(20));
    }
    api.put_pod(
        "ml",
        "notebook-alice",
        "uid-nb-1",
        "node-1",
        &[("app", "notebook-v3")],
    );
    let body = until(e, "an event on the new watch", |b| {
        has(b, "notebook-alice", "app=\"notebook-v3\"")
    });
    expect_value(&body, "gpu_exporter_kube_api_lists_total", 1.0);
    let watches: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("watch pods"))
        .collect();
    assert_eq!(watches.len(), 2, "{watches:?}");
    let version = |r: &str| -> u64 {
        let (_, rest) = r.split_once("resourceVersion=").expect("a resourceVersion");
        rest.split('&').next().unwrap().parse().unwrap()
    };
    // The second watch starts where the events left off, after the list's version.
    assert!(version(&watches[1]) > version(&watches[0]), "{watches:?}");

    // 410 Gone: the watch ends with an ERROR event; a new list finds the pod added meanwhile
    // without any event, and the pods known before stay.
    api.expire(&[("batch", "etl-5", "uid-etl-5", "node-1", &[("app", "etl")])]);
    let body = until(e, "a new list after 410", |b| {
        has(b, "etl-5", "pod_uid=\"uid-etl-5\"")
    });
    assert!(
        has(&body, "notebook-alice", "app=\"notebook-v3\""),
        "{body}"
    );
    assert!(has(&body, "etl-4", "pod_uid=\"uid-etl-4\""), "{body}");
    expect_value(
        &body,
        "gpu_exporter_kube_api_errors_total{reason=\"gone\"}",
        1.0,
    );
    expect_value(&body, "gpu_exporter_kube_api_lists_total", 2.0);
    expect_value(&body, "gpu_exporter_kube_api_up", 1.0);
    assert_eq!(
        e.warnings_about("Kubernetes API unavailable"),
        0,
        "{}",
        e.log()
    );
    // The new families pass an independent linter with no finding.
    if common::promtool_available() {
        let (_, findings) = common::promtool_check(&body);
        let ours: Vec<&String> = findings
            .iter()
            .filter(|f| f.contains("gpu_exporter_kube_api"))
            .collect();
        assert!(ours.is_empty(), "{ours:?}");
    }
}

#[test]
fn watches_that_always_expire_are_listed_again_and_no_pod_is_lost() {
    let api = ApiServer::spawn();
    seed_pods(&api);
    api.expire_every_watch();
    let node = start_node(&api, TOKEN, &[]);
    let e = &node.exporter;
    // Every poll: the pods of the lists stay attributed while each watch is refused.
    let body = until(e, "three lists", |b| {
        assert!(has(b, "llm-train-0", "pod_uid=\"uid-llm-0\""), "{b}");
        value(b, "gpu_exporter_kube_api_lists_total").is_some_and(|n| n >= 3.0)
    });
    assert!(
        value(&body, "gpu_exporter_kube_api_errors_total{reason=\"gone\"}")
            .is_some_and(|n| n >= 2.0),
        "{body}"
    );
    expect_value(&body, "gpu_exporter_kube_api_pods", 2.0);
}

#[test]
fn a_refused_list_degrades_names_the_rbac_to_grant_and_recovers() {
    let api = ApiServer::spawn();
    seed_pods(&api);
    api.forbid("list", "pods");
    let node = start_node(&api, TOKEN, &["--kube-api-timeout", "500"]);
    let e = &node.exporter;
    let body = until(e, "403 counted", |b| {
        value(
            b,
            "gpu_exporter_kube_api_errors_total{reason=\"forbidden\"}",
        )
        .is_some_and(|n| n >= 1.0)
    });
    expect_value(&body, "gpu_exporter_kube_api_up", 0.0);
    // The kubelet's attribution is there; the API's labels are not.
    assert!(lacks(&body, "llm-train-0", "pod_uid="), "{body}");
    assert_eq!(
        e.warnings_about("Kubernetes API unavailable for pod labels and UIDs"),
        1,
        "{}",
        e.log()
    );
    assert!(
        e.log()
            .contains("grant verb `list` on resource `pods` to the exporter's service account"),
        "{}",
        e.log()
    );
    api.allow("list", "pods");
    let body = until(e, "recovered", |b| {
        has(b, "llm-train-0", "pod_uid=\"uid-llm-0\"")
    });
    expect_value(&body, "gpu_exporter_kube_api_up", 1.0);
    assert!(
        e.log().contains("Kubernetes API answering again"),
        "{}",
        e.log()
    );
}

#[test]
fn refused_credentials_degrade_with_a_self_metric() {
    let api = ApiServer::spawn();
    seed_pods(&api);
    let node = start_node(&api, "revoked-token", &["--kube-api-timeout", "500"]);
    let e = &node.exporter;
    let body = until(e, "401 counted", |b| {
        value(
            b,
            "gpu_exporter_kube_api_errors_total{reason=\"unauthorized\"}",
        )
        .is_some_and(|n| n >= 1.0)
    });
    expect_value(&body, "gpu_exporter_kube_api_up", 0.0);
    expect_value(&body, "gpu_exporter_kube_api_pods", 0.0);
    assert!(lacks(&body, "llm-train-0", "pod_uid="), "{body}");
    assert!(e.log().contains("401 Unauthorized"), "{}", e.log());
}

#[test]
fn a_hung_server_times_out_the_last_answer_lasts_until_the_ttl_and_it_recovers() {
    let api = ApiServer::spawn();
    seed_pods(&api);
    let node = start_node(
        &api,
        TOKEN,
        &["--kube-api-timeout", "300", "--kube-api-ttl", "1000"],
    );
    let e = &node.exporter;
    until(e, "first list", |b| {
        has(b, "llm-train-0", "pod_uid=\"uid-llm-0\"")
    });
    // The server stops answering lists, and the watch breaks: every new list times out.
    api.hang("list");
    api.expire(&[]);
    let body = until(e, "dropped after the TTL", |b| {
        lacks(b, "llm-train-0", "pod_uid=")
            && value(b, "gpu_exporter_kube_api_errors_total{reason=\"timeout\"}")
                .is_some_and(|n| n >= 1.0)
    });
    expect_value(&body, "gpu_exporter_kube_api_pods", 0.0);
    expect_value(&body, "gpu_exporter_kube_api_up", 0.0);
    assert!(e.log().contains("no answer within 300ms"), "{}", e.log());
    assert!(
        e.log().contains("pod_uid and pod labels dropped"),
        "{}",
        e.log()
    );
    api.unhang("list");
    let body = until(e, "recovered", |b| {
        has(b, "llm-train-0", "pod_uid=\"uid-llm-0\"")
    });
    expect_value(&body, "gpu_exporter_kube_api_up", 1.0);
}

#[test]
fn pod_metadata_source_api_without_configuration_is_a_startup_error_auto_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet_sock = dir.path().join("kubelet.sock");
    let _kubelet = FakeKubelet::start(&kubelet_sock);
    let base = |source: &str| {
        let mut cmd = binary::command();
        cmd.env("KUBECONFIG", dir.path().join("absent"))
            .args([
                "--address",
                "127.0.0.1:0",
                "-k",
                "--kubernetes-enable-pod-uid",
            ])
            .arg("--pod-resources-kubelet-socket")
            .arg(&kubelet_sock)
            .args([
                "--container-runtime-endpoint",
                "unix:///nonexistent/containerd.sock",
            ])
            .args(["--pod-metadata-source", source]);
        cmd
    };
    let (status, stderr) = binary::run_to_exit(base("api"));
    assert!(!status.success());
    assert!(
        stderr.contains("--pod-metadata-source api")
            && stderr.contains("no Kubernetes API configuration"),
        "{stderr}"
    );
    let mut e = Exporter::start(base("auto"));
    e.wait_ready();
    assert_eq!(
        e.warnings_about("pod UIDs and labels are off: no container runtime socket, and no Kubernetes API configuration"),
        1,
        "{}",
        e.log()
    );
    let body = metrics(&e);
    assert_eq!(
        value(
            &body,
            "gpu_exporter_kube_api_errors_total{reason=\"unreachable\"}"
        ),
        Some(1.0),
        "{body}"
    );
}
