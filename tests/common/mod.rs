//! Helpers shared by the integration tests: build a sampler over the simulated fleet.
#![allow(dead_code, missing_docs)]

pub mod binary;
pub mod fake_kubelet_bin;
pub mod fake_node;
pub mod grpc;
pub mod logs;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use gpu_exporter::catalog::{self, Catalog};
use gpu_exporter::config::GpuIdType;
/// The exporter's own families exactly as `main.rs` builds them (one registry, every module's
/// collector in body order), under the name the tests use.
#[allow(unused_imports)]
pub use gpu_exporter::exporter_metrics::ExporterMetrics as SelfMetrics;
use gpu_exporter::gpu::sim::scenario::{self, Scenario};
use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::gpu::GpuSource;
use gpu_exporter::pods::directory::{LabelOptions, PodDirectory};
use gpu_exporter::pods::mapping::{self, MappingOptions};
use gpu_exporter::pods::Attribution;
use gpu_exporter::sampler::{Sampler, SamplerOptions};
use gpu_exporter::snapshot::{BuildOptions, DeviceSelection};
use gpu_exporter_testing::fake_kubelet::Assignments;
use tokio::sync::watch;

pub const INTERVAL: Duration = Duration::from_secs(10);

pub fn shipped_catalog() -> Catalog {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/metrics-config/default-counters.csv"
    );
    catalog::load(std::path::Path::new(path))
        .expect("shipped CSV loads")
        .0
}

/// A CSV of the repository (path relative to its root).
pub fn catalog_file(path: &str) -> Catalog {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    catalog::load(&full)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .0
}

pub fn build_options() -> BuildOptions {
    BuildOptions {
        hostname_label: "hostname".into(),
        hostname: "node-a".into(),
        replace_blanks_in_model_name: false,
        selection: DeviceSelection::Flex,
        virtual_gpus: false,
        xid_window_ms: 300_000,
        clock_window_ms: 300_000,
        pod_uid: false,
        container_labels: false,
        old_namespace: false,
    }
}

pub fn scenario_file(name: &str) -> (Scenario, String) {
    let path = format!(
        "{}/tests/fixtures/scenarios/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    (
        scenario::load(std::path::Path::new(&path)).expect("scenario parses"),
        path,
    )
}

pub fn sim(profile: &str, scenario: Option<(Scenario, String)>) -> SimulatedSource {
    let (sc, origin) = scenario.unwrap_or_default();
    SimulatedSource::new(profile, 1, INTERVAL, sc, &origin).expect("sim source")
}

/// A file under tests/fixtures/pods.
pub fn pods_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pods")
        .join(name)
}

/// The host /proc fixture (tests/fixtures/proc).
pub fn proc_fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc")
}

/// The fake node of tests/fixtures/pods/a100-mig-shared-seed1.toml (profile 4xA100-80GB-MIG).
pub fn shared_node() -> Assignments {
    Assignments::load(&pods_fixture("a100-mig-shared-seed1.toml")).expect("fixture parses")
}

/// The simulated fleet (seed 1) running the PIDs of `a`.
pub fn sim_running(profile: &str, a: &Assignments) -> SimulatedSource {
    let s = sim(profile, None);
    let devices = s.devices().expect("sim devices");
    let procs = a
        .sim_processes(&devices, GpuIdType::Uid)
        .expect("fixture ids are the sim's");
    s.with_processes(procs).expect("processes on real entities")
}

/// Who holds what, as the kubelet would answer with `a`.
pub fn holders(profile: &str, a: &Assignments) -> Attribution {
    let devices = sim(profile, None).devices().expect("sim devices");
    mapping::attribution_from(&a.reply, &devices, &MappingOptions::default()).attribution
}

/// What the container runtime task publishes for `a`.
pub fn directory(a: &Assignments, labels: bool) -> PodDirectory {
    PodDirectory::from_runtime(
        &a.runtime_snapshot(),
        &LabelOptions {
            enabled: labels,
            allowlist: vec![],
        },
    )
}

pub struct Harness<S: GpuSource> {
    pub sampler: Sampler<S>,
    pub catalog_tx: watch::Sender<Arc<Catalog>>,
    pub pods_tx: watch::Sender<Arc<Attribution>>,
    pub metrics: Arc<SelfMetrics>,
}

pub fn harness<S: GpuSource>(source: S, catalog: Catalog, opts: BuildOptions) -> Harness<S> {
    let (catalog_tx, catalog_rx) = watch::channel(Arc::new(catalog));
    let (pods_tx, pods_rx) = watch::channel(Arc::new(Attribution::default()));
    let metrics = Arc::new(SelfMetrics::default());
    let sampler = Sampler::new(
        Arc::new(source),
        catalog_rx,
        pods_rx,
        SamplerOptions {
            interval: INTERVAL,
            rediscover_every: Duration::from_secs(60),
            build: opts,
        },
        metrics.sampler(),
    );
    Harness {
        sampler,
        catalog_tx,
        pods_tx,
        metrics,
    }
}

/// The body with the two time-dependent self-metric values zeroed, so it can be compared.
pub fn normalise(body: &[u8]) -> String {
    let text = std::str::from_utf8(body).expect("utf-8 body");
    text.lines()
        .map(|l| {
            if l.starts_with("gpu_exporter_sample_duration_seconds ")
                || l.starts_with("gpu_exporter_last_sample_timestamp_seconds ")
            {
                let name = l.split(' ').next().unwrap_or_default();
                format!("{name} 0\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

/// All series lines (no comments) whose name is `metric`.
pub fn series<'a>(body: &'a str, metric: &str) -> Vec<&'a str> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(metric))
        .collect()
}

/// Whether promtool is installed. In CI (`CI` set) its absence is a failure, not a skip.
pub fn promtool_available() -> bool {
    let found = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok();
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is required in CI (apt-get install -y prometheus)"
        );
        eprintln!(
            "promtool not found; skipping (install Debian's `prometheus` package to run this test)"
        );
    }
    found
}

/// Runs `promtool check metrics` on `body`; returns (exit ok, non-empty output lines).
pub fn promtool_check(body: &str) -> (bool, Vec<String>) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write body");
    let out = child.wait_with_output().expect("promtool output");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (
        out.status.success(),
        text.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect(),
    )
}
