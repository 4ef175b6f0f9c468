//! Accounting through the real binaries (issue 37): the exporter on the simulated fleet with a
//! scenario of known duty cycles, the `fake-kubelet` binary serving pod-resources, CRI and the
//! node's /proc tree. Between two scrapes:
//!
//! - each GPU's accounts grow by exactly its own energy counter's increase (to the millijoule);
//! - on the time-sliced GPU, the two busy pods (20 % and 60 % of the GPU) share its dynamic
//!   energy 25/75 within 1 %; the pod that holds a replica and runs nothing is charged the
//!   static part alone (its share of the idle power) and accrues waste;
//! - the host process is charged as `outside_pods`;
//! - a pod that leaves stops growing and one that arrives starts, and the energy still adds up;
//! - on a MIG GPU without instance activity (an A100 read through NVML), allocation and energy
//!   follow the instances' memory slices, a time-sliced instance's split equally between its
//!   holders, an instance nobody holds charged as `unallocated` with its `GPU_I_ID`.
//!
//! Synchronisation: the exporter's `/ready` and its sample counter, the fake kubelet's reload
//! line, each polled with a deadline; nothing sleeps to wait.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::binary::{command, get, Exporter};
use common::fake_node::FakeNode;

const GPU3: &str = "GPU-ba88c4c1-4054-510f-2059-f0605c26d9f4";
const GPU4: &str = "GPU-c1227189-c423-66ba-b8f1-7bdf47295b80";
const GPU5: &str = "GPU-bedb4fa8-b4d0-8e0e-805a-439e780882d3";
const GPU6: &str = "GPU-20894476-a4b1-770b-36ad-1d023d6bc2d4";
/// `--accounting-idle-power-watts`.
const IDLE_W: f64 = 60.0;
const DEADLINE: Duration = Duration::from_secs(30);

/// One scrape: every series of the body, (name, labels) -> value.
struct Body(BTreeMap<(String, BTreeMap<String, String>), f64>);

impl Body {
    fn parse(text: &str) -> Self {
        let mut out = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (series, value) = line.rsplit_once(' ').expect("name value");
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let mut map = BTreeMap::new();
            // Label values here never hold `",`.
            for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once("=\"").expect("label");
                map.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
            }
            out.insert((name.to_owned(), map), value.parse().expect("number"));
        }
        Self(out)
    }

    /// The sum of `name` over the series whose labels include every pair of `with`.
    fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && with
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str).unwrap_or("") == *v)
            })
            .map(|(_, v)| v)
            .sum()
    }

    fn has(&self, name: &str, with: &[(&str, &str)]) -> bool {
        self.0.keys().any(|(n, l)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str).unwrap_or("") == *v)
        })
    }

    /// The GPU's own energy counter, mJ (the same on each pod's copy of its series).
    fn gpu_energy_mj(&self, uuid: &str) -> f64 {
        *self
            .0
            .iter()
            .find(|((n, l), _)| {
                n == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
                    && l.get("UUID").map(String::as_str) == Some(uuid)
            })
            .unwrap_or_else(|| panic!("no energy counter for {uuid}"))
            .1
    }

    /// What the accounts of the GPU were charged, mJ (rounded: the family is in whole mJ).
    fn charged_mj(&self, uuid: &str) -> f64 {
        (self.sum(ENERGY, &[("UUID", uuid)]) * 1000.0).round()
    }
}

const ENERGY: &str = "gpu_exporter_container_energy_joules_total";
const ALLOCATED: &str = "gpu_exporter_container_allocated_gpu_seconds_total";
const BUSY: &str = "gpu_exporter_container_sm_busy_gpu_seconds_total";
const WASTE: &str = "gpu_exporter_container_idle_allocated_gpu_seconds_total";

fn pod<'a>(uuid: &'a str, name: &'a str) -> [(&'a str, &'a str); 3] {
    [("UUID", uuid), ("consumer", "holder"), ("pod", name)]
}

/// Scrapes until `done` holds for the body (new samples come every second).
fn scrape_until(e: &Exporter, what: &str, done: impl Fn(&Body) -> bool) -> Body {
    let until = Instant::now() + DEADLINE;
    loop {
        let (status, text) = get(e.loopback(), "/metrics");
        assert_eq!(status, 200);
        let body = Body::parse(&text);
        if done(&body) {
            return body;
        }
        assert!(
            Instant::now() < until,
            "{what} not within {DEADLINE:?}:\n{text}"
        );
        // Polling another process's state.
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn samples(b: &Body) -> f64 {
    b.sum("gpu_exporter_samples_total", &[])
}

/// `count` samples after `b`.
fn later(e: &Exporter, b: &Body, count: f64) -> Body {
    let from = samples(b);
    scrape_until(e, "the next samples", |n| samples(n) >= from + count)
}

fn fixture(p: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(p)
}

/// A fake node serving `node` (an assignments file's text) and the exporter on it, with `-k`,
/// the fake runtime and /proc, and `args`.
struct Node {
    e: Exporter,
    fake: FakeNode,
    assignments: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Node {
    /// The H100 node of the accounting scenario (its pods and duty cycles), with `args`.
    fn accounting_scenario(args: &[&str]) -> Self {
        let node = std::fs::read_to_string(fixture("pods/h100-accounting-seed1.toml")).unwrap();
        let scenario = fixture("scenarios/accounting.toml");
        let mut all: Vec<&std::ffi::OsStr> = vec!["--sim-scenario".as_ref(), scenario.as_os_str()];
        all.extend(args.iter().map(std::ffi::OsStr::new));
        Self::start(&node, &all)
    }

    fn start(node: &str, args: &[&std::ffi::OsStr]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (kubelet, cri, proc_root, assignments) = (
            d.join("kubelet.sock"),
            d.join("cri.sock"),
            d.join("proc"),
            d.join("node.toml"),
        );
        std::fs::write(&assignments, node).unwrap();
        let fake = FakeNode::start(&kubelet, &cri, &proc_root, &assignments);
        let mut cmd = command();
        cmd.arg("-a")
            .arg("127.0.0.1:0")
            .arg("--sim-processes")
            .arg(&assignments)
            .arg("-k")
            .arg("--pod-resources-kubelet-socket")
            .arg(&kubelet)
            .arg("--container-runtime-endpoint")
            .arg(format!("unix://{}", cri.display()))
            .arg("--path.procfs")
            .arg(&proc_root)
            .args(["--pod-resources-refresh", "500", "--cri-refresh", "500"]);
        if !args.iter().any(|a| *a == "--accounting-publish-interval") {
            // Published at every sample: these tests follow the totals sample by sample.
            cmd.args(["--accounting-publish-interval", "0"]);
        }
        cmd.args(args);
        let mut e = Exporter::start(cmd);
        e.wait_ready();
        Self {
            e,
            fake,
            assignments,
            _dir: dir,
        }
    }
}

#[test]
fn energy_and_gpu_time_split_by_known_duty_cycles_through_the_real_binaries() {
    let n = Node::accounting_scenario(&[
        "--kubernetes-process-usage",
        "--accounting-idle-power-watts",
        "60",
    ]);
    let (e, fake, assignments) = (&n.e, &n.fake, &n.assignments);
    // Two samples: the energy baseline is set and a first interval charged.
    let b0 = scrape_until(e, "two samples", |b| {
        samples(b) >= 2.0 && b.has(ENERGY, &pod(GPU3, "light"))
    });
    let b1 = later(e, &b0, 5.0);
    let d = |name: &str, with: &[(&str, &str)]| b1.sum(name, with) - b0.sum(name, with);

    // Every GPU's accounts grew by its own counter's increase, to the millijoule.
    for uuid in [GPU3, GPU4, GPU5] {
        assert_eq!(
            b1.charged_mj(uuid) - b0.charged_mj(uuid),
            b1.gpu_energy_mj(uuid) - b0.gpu_energy_mj(uuid),
            "{uuid}"
        );
    }

    // GPU 3: the static part is the idle power by allocation (a third each); the rest follows
    // the measured SM time, 20 % and 60 % of the GPU: 25/75 of the dynamic energy.
    let dynamic = |p: &str| d(ENERGY, &pod(GPU3, p)) - IDLE_W * d(ALLOCATED, &pod(GPU3, p));
    let (light, heavy) = (dynamic("light"), dynamic("heavy"));
    assert!(light > 0.0 && heavy > 0.0, "{light} {heavy}");
    let share = light / (light + heavy);
    assert!(
        (share - 0.25).abs() <= 0.01,
        "light's share of the dynamic energy {share}, want 0.25 within 1 %"
    );
    let busy = |p: &str| d(BUSY, &pod(GPU3, p));
    assert!(
        (busy("light") / (busy("light") + busy("heavy")) - 0.25).abs() < 1e-5,
        "SM time 20 % vs 60 % (each series written to the µs)"
    );
    let held = d(ALLOCATED, &pod(GPU3, "idle"));
    assert!(held > 0.0);
    // The idle pod: static energy only (to the mJ of each interval's rounding), and its
    // allocated seconds are all waste; the busy pods waste nothing.
    assert!(
        dynamic("idle").abs() < 0.01,
        "the idle holder was charged {} J beyond its static part",
        dynamic("idle")
    );
    assert!(!b1.has(BUSY, &pod(GPU3, "idle")));
    assert!((d(WASTE, &pod(GPU3, "idle")) - held).abs() < 1e-9);
    assert_eq!(d(WASTE, &pod(GPU3, "light")), 0.0);
    assert!((d(ALLOCATED, &pod(GPU3, "light")) - held).abs() < 1e-6);

    // GPU 4: the host process is work outside any pod; nobody holds the GPU.
    let outside = [("UUID", GPU4), ("consumer", "outside_pods")];
    assert!(d(ENERGY, &outside) > 0.0 && d(BUSY, &outside) > 0.0);
    assert!(d(ALLOCATED, &[("UUID", GPU4), ("consumer", "unallocated")]) > 0.0);

    // A pod leaves GPU 5 and another arrives on GPU 6 (the fake kubelet's file changes).
    let moved = std::fs::read_to_string(assignments)
        .unwrap()
        .replace("pod = \"leaving\"", "pod = \"arriving\"")
        .replace(GPU5, GPU6);
    std::fs::write(assignments, moved).unwrap();
    fake.reload();
    let b2 = scrape_until(e, "the new pod", |b| {
        b.has(ALLOCATED, &pod(GPU6, "arriving"))
    });
    let b3 = later(e, &b2, 3.0);
    assert!(b3.sum(ALLOCATED, &pod(GPU6, "arriving")) > b2.sum(ALLOCATED, &pod(GPU6, "arriving")));
    for name in [ENERGY, ALLOCATED] {
        assert_eq!(
            b3.sum(name, &pod(GPU5, "leaving")),
            b2.sum(name, &pod(GPU5, "leaving")),
            "{name} of the pod that left (kept, no longer growing)"
        );
    }
    // Across the change, every GPU still adds up.
    for uuid in [GPU3, GPU4, GPU5, GPU6] {
        assert_eq!(
            b3.charged_mj(uuid) - b1.charged_mj(uuid),
            b3.gpu_energy_mj(uuid) - b1.gpu_energy_mj(uuid),
            "{uuid} across the change"
        );
    }
}

#[test]
fn a_mig_gpus_energy_is_split_over_its_instances_by_slices_through_the_real_binaries() {
    // 4xA100-80GB-MIG: GPU 0 has 3g.40gb (batch/etl-0), 2g.20gb (batch/etl-1), 1g.10gb
    // time-sliced by dev/shell-a and -b, and a 1g.10gb nobody holds. An A100 read through NVML
    // has no instance activity: both parts of its energy follow the memory slices (4, 2, 1, 1
    // of 8), the time-sliced instance's split equally.
    const GPU0: &str = "GPU-12fa293c-c901-8b39-0778-9daeeff635a7";
    let node = std::fs::read_to_string(fixture("pods/a100-mig-seed1.toml")).unwrap();
    let n = Node::start(
        &node,
        &[
            "--sim-profile".as_ref(),
            "4xA100-80GB-MIG".as_ref(),
            "--sim-seed".as_ref(),
            "1".as_ref(),
        ],
    );
    let inst = |gi: &'static str, p: &'static str| -> Vec<(&'static str, &'static str)> {
        vec![
            ("UUID", GPU0),
            ("GPU_I_ID", gi),
            ("consumer", "holder"),
            ("pod", p),
        ]
    };
    let b0 = scrape_until(&n.e, "two samples", |b| {
        samples(b) >= 2.0 && b.has(ENERGY, &inst("2", "etl-0"))
    });
    let b1 = later(&n.e, &b0, 4.0);
    let d = |name: &str, with: &[(&str, &str)]| b1.sum(name, with) - b0.sum(name, with);
    assert_eq!(
        b1.charged_mj(GPU0) - b0.charged_mj(GPU0),
        b1.gpu_energy_mj(GPU0) - b0.gpu_energy_mj(GPU0)
    );
    let unallocated = vec![
        ("UUID", GPU0),
        ("GPU_I_ID", "10"),
        ("consumer", "unallocated"),
    ];
    let accounts = [
        (inst("2", "etl-0"), 4.0),
        (inst("3", "etl-1"), 2.0),
        (inst("9", "shell-a"), 0.5),
        (inst("9", "shell-b"), 0.5),
        (unallocated, 1.0),
    ];
    // Allocated GPU-seconds by slices (to the µs each series is written with).
    let unit = d(ALLOCATED, &accounts[0].0) / 4.0;
    assert!(unit > 0.0);
    for (a, slices) in &accounts {
        assert!(
            (d(ALLOCATED, a) - unit * slices).abs() < 1e-5,
            "{a:?}: {} GPU-s, want {}",
            d(ALLOCATED, a),
            unit * slices
        );
    }
    // Energy per allocated GPU-second is the same for every account of the GPU (within the
    // millijoule each interval's split rounds to).
    let rate = d(ENERGY, &accounts[0].0) / d(ALLOCATED, &accounts[0].0);
    assert!(rate > 0.0);
    for (a, _) in &accounts {
        let r = d(ENERGY, a) / d(ALLOCATED, a);
        assert!(
            (r - rate).abs() <= rate * 0.01,
            "{a:?}: {r} J/GPU-s vs {rate}"
        );
    }
}

const PUBLISHED: &str = "gpu_exporter_accounting_published_timestamp_seconds";

/// The accounting series of a body (its `gpu_exporter_container_*` lines), as text.
fn accounting_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("gpu_exporter_container_") && l.contains("_total{"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn between_publications_scrapes_see_the_last_published_totals_and_gzip_serves_the_same_body() {
    // Published every 1.5 s, sampled every 100 ms: most samples keep the last publication
    // (its text and its compressed blocks) while their own series change.
    let n = Node::accounting_scenario(&["--accounting-publish-interval", "1500", "-c", "100"]);
    let e = &n.e;
    scrape_until(e, "the first accounts", |b| {
        b.has(ENERGY, &[("consumer", "holder")]) && b.has(PUBLISHED, &[])
    });
    // Scrapes, plain and gzip, until three publications after the first accounts were seen.
    let mut by_publication: BTreeMap<u64, (Vec<String>, BTreeSet<u64>)> = BTreeMap::new();
    let until = Instant::now() + DEADLINE;
    let mut gzip = false;
    while by_publication.len() < 4 {
        assert!(
            Instant::now() < until,
            "four publications not within {DEADLINE:?}"
        );
        let (status, text) = if gzip {
            common::binary::get_gzip(e.loopback(), "/metrics")
        } else {
            get(e.loopback(), "/metrics")
        };
        gzip = !gzip;
        assert_eq!(status, 200);
        let b = Body::parse(&text);
        let at = (b.sum(PUBLISHED, &[]) * 1e6).round() as u64;
        let lines = accounting_lines(&text);
        assert!(!lines.is_empty(), "{text}");
        let seen = by_publication
            .entry(at)
            .or_insert_with(|| (lines.clone(), BTreeSet::new()));
        // One publication, whatever sample's body serves it (and in either encoding): the
        // same totals, to the byte.
        assert_eq!(
            seen.0, lines,
            "publication at {at} µs changed between scrapes"
        );
        seen.1.insert(samples(&b) as u64);
        std::thread::sleep(Duration::from_millis(50));
    }
    // The kept publication was served by bodies of several samples.
    assert!(
        by_publication.values().any(|(_, s)| s.len() >= 2),
        "{:?}",
        by_publication
            .values()
            .map(|(_, s)| s.len())
            .collect::<Vec<_>>()
    );
    // Publications are at least the interval apart (the first two may be closer: the accounts
    // appearing publish at once), and no counter decreases from one to the next.
    let pubs: Vec<_> = by_publication.iter().collect();
    for w in pubs.windows(2).skip(1) {
        assert!(
            w[1].0 - w[0].0 >= 1_400_000,
            "published {} µs apart",
            w[1].0 - w[0].0
        );
    }
    for w in pubs.windows(2) {
        let (a, b) = (
            Body::parse(&w[0].1 .0.join("\n")),
            Body::parse(&w[1].1 .0.join("\n")),
        );
        for ((name, labels), v) in &a.0 {
            let later = b.0.get(&(name.clone(), labels.clone())).copied();
            assert!(
                later.is_some_and(|l| l >= *v),
                "{name}{labels:?}: {v} -> {later:?}"
            );
        }
    }
}
