//! Golden exposition files: the simulated fleet + the shipped CSV, rendered after three ticks,
//! must equal `tests/golden/<case>.prom` byte for byte. `UPDATE_GOLDEN=1 cargo test --test golden`
//! rewrites them; review the diff before committing.

mod common;

use std::collections::BTreeMap;

use std::sync::Arc;

use gpu_exporter::gpu::GpuSource;
use gpu_exporter::hpc;
use gpu_exporter::pods::mapping::{self, MappingOptions};
use gpu_exporter::pods::procfs::ProcRoot;
use gpu_exporter::pods::{Attribution, EntityKey, Holder, PodRef};
use gpu_exporter::snapshot::{BuildOptions, DeviceSelection};
use gpu_exporter_testing::fake_kubelet::Assignments;
use tokio::sync::{watch, Notify};

async fn render_case(
    profile: &str,
    scenario: Option<&str>,
    opts: BuildOptions,
    pods: Attribution,
) -> String {
    render_with(common::shipped_catalog(), profile, scenario, opts, pods).await
}

async fn render_with(
    catalog: gpu_exporter::catalog::Catalog,
    profile: &str,
    scenario: Option<&str>,
    opts: BuildOptions,
    pods: Attribution,
) -> String {
    let source = common::sim(profile, scenario.map(common::scenario_file));
    let h = common::harness(source, catalog, opts);
    h.pods_tx.send_replace(std::sync::Arc::new(pods));
    let mut sampler = h.sampler;
    let mut last = None;
    for _ in 0..3 {
        last = Some(sampler.tick().await);
    }
    common::normalise(&last.expect("three ticks").body)
}

fn check(case: &str, body: &str) {
    let path = format!("{}/tests/golden/{case}.prom", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, body).expect("write golden file");
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}; run with UPDATE_GOLDEN=1 to create it"));
    if want != body {
        let diff: Vec<String> = want
            .lines()
            .zip(body.lines())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(5)
            .map(|(i, (a, b))| format!("line {}:\n  want: {a}\n  got:  {b}", i + 1))
            .collect();
        panic!(
            "{case}: output differs from {path} ({} vs {} lines)\n{}\nrun with UPDATE_GOLDEN=1 to accept",
            want.lines().count(),
            body.lines().count(),
            diff.join("\n")
        );
    }
}

fn holder(ns: &str, pod: &str, container: &str, vgpu: Option<&str>) -> Holder {
    Holder {
        pod: PodRef {
            namespace: ns.into(),
            pod: pod.into(),
            container: container.into(),
        },
        vgpu: vgpu.map(str::to_owned),
        dra: None,
    }
}

#[tokio::test(start_paused = true)]
async fn single_a100() {
    let body = render_case(
        "1xA100-40GB",
        None,
        common::build_options(),
        Attribution::default(),
    )
    .await;
    check("1xA100-40GB", &body);
}

#[tokio::test(start_paused = true)]
async fn eight_h100() {
    let body = render_case(
        "8xH100-SXM",
        None,
        common::build_options(),
        Attribution::default(),
    )
    .await;
    // As dcgm-exporter's expcollector: every monitored GPU has a clock-events series, 0 with
    // only the window label where it had no event.
    let clock = common::series(&body, "DCGM_EXP_CLOCK_EVENTS_COUNT");
    for gpu in 0..8 {
        let g = format!("gpu=\"{gpu}\",");
        assert!(
            clock.iter().any(|l| l.contains(&g)),
            "GPU {gpu}: {clock:#?}"
        );
    }
    let quiet: Vec<&&str> = clock
        .iter()
        .filter(|l| !l.contains("clock_event="))
        .collect();
    assert!(!quiet.is_empty());
    assert!(
        quiet
            .iter()
            .all(|l| l.ends_with(",window_size_in_ms=\"300000\"} 0")),
        "{quiet:#?}"
    );
    check("8xH100-SXM", &body);
}

#[tokio::test(start_paused = true)]
async fn mig_fleet() {
    let body = render_case(
        "4xA100-80GB-MIG",
        None,
        common::build_options(),
        Attribution::default(),
    )
    .await;
    check("4xA100-80GB-MIG", &body);
}

#[tokio::test(start_paused = true)]
async fn incidents_lost_gpu_dbe_overheat_xid() {
    let body = render_case(
        "8xH100-SXM",
        Some("incidents.toml"),
        common::build_options(),
        Attribution::default(),
    )
    .await;
    check("8xH100-SXM-incidents", &body);
}

#[tokio::test(start_paused = true)]
async fn xid_texts_are_dcgm_exporters() {
    let body = render_case(
        "8xH100-SXM",
        Some("xids.toml"),
        common::build_options(),
        Attribution::default(),
    )
    .await;
    // err_msg is a label value: the exact text of dcgm-exporter's table.
    let xid = common::series(&body, "DCGM_FI_DEV_XID_ERRORS");
    for (gpu, code, text) in [
        (0, 109, "Context Switch Timeout Error"),
        (1, 140, "Unrecovered ECC Error"),
        (
            2,
            45,
            "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
        ),
        (3, 154, "GPU Recovery Action Changed"),
        (4, 173, "Unknown Error"),
        (5, 0, "No Error"),
    ] {
        let g = format!("gpu=\"{gpu}\",");
        let line = xid.iter().find(|l| l.contains(&g)).expect("XID series");
        let want = format!(",err_code=\"{code}\",err_msg=\"{text}\"}} {code}");
        assert!(line.ends_with(&want), "{line}");
    }
    check("8xH100-SXM-xids", &body);
}

#[tokio::test(start_paused = true)]
async fn pods_whole_shared_and_mig() {
    let mut holders = BTreeMap::new();
    // GPU 3 (MIG disabled) held by one pod; GPU 0's 3g.40gb instance by one pod; its 1g.10gb
    // instance 9 shared by two time-sliced replicas.
    holders.insert(
        EntityKey {
            gpu: 3,
            gi_id: None,
        },
        vec![holder("ml", "trainer-0", "main", None)],
    );
    holders.insert(
        EntityKey {
            gpu: 0,
            gi_id: Some(2),
        },
        vec![holder("ml", "infer-a", "server", None)],
    );
    holders.insert(
        EntityKey {
            gpu: 0,
            gi_id: Some(9),
        },
        vec![
            holder("dev", "nb-1", "jupyter", Some("0")),
            holder("dev", "nb-2", "jupyter", Some("1")),
        ],
    );
    let body = render_case(
        "4xA100-80GB-MIG",
        None,
        common::build_options(),
        Attribution {
            holders,
            ..Default::default()
        },
    )
    .await;
    check("4xA100-80GB-MIG-pods", &body);
}

#[tokio::test(start_paused = true)]
async fn legacy_hostname_label_and_gpu_selection() {
    let opts = BuildOptions {
        hostname_label: "Hostname".into(),
        replace_blanks_in_model_name: true,
        selection: DeviceSelection::Gpus(Some(vec![0])),
        ..common::build_options()
    };
    let body = render_case("4xA100-80GB-MIG", None, opts, Attribution::default()).await;
    check("4xA100-80GB-MIG-g0-Hostname", &body);
}

/// The fake node of tests/fixtures/pods/a100-mig-shared-seed1.toml: a GPU time-sliced by three
/// pods, a MIG instance with a two-process pod, a time-sliced MIG instance with one busy and one
/// idle holder; the PIDs' cgroups in tests/fixtures/proc; the runtime's pods with their UIDs and
/// labels. Per-process attribution on, `pod_uid` and pod labels on.
async fn render_processes(virtual_gpus: bool) -> String {
    let node = common::shared_node();
    let opts = BuildOptions {
        virtual_gpus,
        pod_uid: true,
        ..common::build_options()
    };
    let source = common::sim_running("4xA100-80GB-MIG", &node);
    let h = common::harness(source, common::shipped_catalog(), opts);
    h.pods_tx
        .send_replace(Arc::new(common::holders("4xA100-80GB-MIG", &node)));
    let (_dir_tx, dir_rx) = watch::channel(Arc::new(common::directory(&node, true)));
    let mut sampler = h
        .sampler
        .with_directory(dir_rx, Arc::new(Notify::new()))
        .with_process_usage(ProcRoot::new(common::proc_fixture()));
    let mut last = None;
    for _ in 0..3 {
        last = Some(sampler.tick().await);
    }
    common::normalise(&last.expect("three ticks").body)
}

#[tokio::test(start_paused = true)]
async fn colliding_pod_labels_are_renamed() {
    // etl-0's pod carries labels named like labels the exporter writes (and one named like the
    // renamed form): dcgm-exporter 4.8.3 renames them `pod_label_<name>`, then
    // `pod_label_<name>_conflict<N>`, instead of dropping them.
    let text = std::fs::read_to_string(common::pods_fixture("a100-mig-shared-seed1.toml"))
        .expect("fixture");
    let text = text.replace(
        r#"labels = { app = "etl" }"#,
        r#"labels = { app = "etl", gpu = "spoof", pod = "spoof-pod", pod_label_pod = "mine", modelName = "m", "DCGM_FI_DRIVER_VERSION" = "1" }"#,
    );
    let node = Assignments::parse(&text, "colliding").expect("fixture parses");
    let opts = BuildOptions {
        pod_uid: true,
        ..common::build_options()
    };
    let h = common::harness(
        common::sim("4xA100-80GB-MIG", None),
        common::shipped_catalog(),
        opts,
    );
    h.pods_tx
        .send_replace(Arc::new(common::holders("4xA100-80GB-MIG", &node)));
    let (_dir_tx, dir_rx) = watch::channel(Arc::new(common::directory(&node, true)));
    let mut sampler = h.sampler.with_directory(dir_rx, Arc::new(Notify::new()));
    let mut last = None;
    for _ in 0..3 {
        last = Some(sampler.tick().await);
    }
    let body = common::normalise(&last.expect("three ticks").body);
    let etl: Vec<&str> = common::series(&body, "DCGM_FI_DEV_FB_USED")
        .into_iter()
        .filter(|l| l.contains("pod=\"etl-0\""))
        .collect();
    assert_eq!(etl.len(), 1, "{etl:#?}");
    assert!(
        etl[0].contains(r#",pod="etl-0",pod_uid="8c1d5e7a-2b44-4f19-9a6e-0c3b7d9e5f10",app="etl",pod_label_DCGM_FI_DRIVER_VERSION="1",pod_label_gpu="spoof",pod_label_modelName="m",pod_label_pod="mine",pod_label_pod_conflict1="spoof-pod"}"#),
        "{}",
        etl[0]
    );
    assert!(etl[0].starts_with(r#"DCGM_FI_DEV_FB_USED{gpu="0","#));
    check("4xA100-80GB-MIG-pod-label-collisions", &body);
}

#[tokio::test(start_paused = true)]
async fn processes_on_shared_and_mig_gpus() {
    check("4xA100-80GB-MIG-processes", &render_processes(false).await);
}

#[tokio::test(start_paused = true)]
async fn processes_on_shared_and_mig_gpus_virtual() {
    let body = render_processes(true).await;
    // As dcgm-exporter 4.8.2+ (#594): the device-level GPU_UTIL and FB_USED series stay next to
    // the per-pod copies of the shared GPU 3; other fields have only the copies.
    for metric in [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
    ] {
        let gpu3: Vec<&str> = common::series(&body, metric)
            .into_iter()
            .filter(|l| l.contains("gpu=\"3\","))
            .collect();
        let device_level = gpu3.iter().filter(|l| !l.contains("pod=")).count();
        let per_pod = gpu3.iter().filter(|l| l.contains("vgpu=")).count();
        let want = usize::from(metric != "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!((device_level, per_pod), (want, 3), "{metric}: {gpu3:#?}");
    }
    check("4xA100-80GB-MIG-processes-virtual", &body);
}

/// dcgm-exporter's `--container-labels` without `-k`: no pod attribution, but the same node's
/// processes, cgroups and runtime containers give each GPU and MIG instance one copy of its series
/// per container running there (`container` = the container's name, once per name), next to the
/// original series.
#[tokio::test(start_paused = true)]
async fn container_labels_outside_kubernetes() {
    let node = common::shared_node();
    let opts = BuildOptions {
        container_labels: true,
        ..common::build_options()
    };
    let source = common::sim_running("4xA100-80GB-MIG", &node);
    let h = common::harness(source, common::shipped_catalog(), opts);
    let (_dir_tx, dir_rx) = watch::channel(Arc::new(common::directory(&node, true)));
    let mut sampler = h
        .sampler
        .with_directory(dir_rx, Arc::new(Notify::new()))
        .with_process_usage(ProcRoot::new(common::proc_fixture()));
    let mut last = None;
    for _ in 0..3 {
        last = Some(sampler.tick().await);
    }
    let body = common::normalise(&last.expect("three ticks").body);
    let temps = common::series(&body, "DCGM_FI_DEV_GPU_TEMP");
    let of = |entity: &str| -> Vec<&str> {
        temps
            .iter()
            .copied()
            .filter(|l| l.contains(entity))
            .collect()
    };
    // GPU 3, time-sliced by three pods whose containers are all named `server`: one copy.
    let gpu3 = of("gpu=\"3\",");
    assert_eq!(gpu3.len(), 2, "{gpu3:#?}");
    assert!(!gpu3[0].contains("container="), "{}", gpu3[0]);
    assert!(gpu3[1].contains(",container=\"server\"}"), "{}", gpu3[1]);
    // The copy carries the original's value and no pod labels.
    let value = |l: &str| l.rsplit(' ').next().unwrap().to_owned();
    assert_eq!(value(gpu3[0]), value(gpu3[1]));
    assert!(!gpu3[1].contains("pod="), "{}", gpu3[1]);
    // MIG instances: GI 2 runs etl-0's `worker`, GI 9 shell-a's `shell` (shell-b runs nothing).
    let gi2 = of("GPU_I_ID=\"2\"");
    let gi2: Vec<&str> = gi2
        .into_iter()
        .filter(|l| l.contains("gpu=\"0\""))
        .collect();
    assert_eq!(gi2.len(), 2, "{gi2:#?}");
    assert!(gi2[1].contains(",container=\"worker\"}"), "{}", gi2[1]);
    let gi9 = of("GPU_I_ID=\"9\"");
    assert_eq!(gi9.len(), 2, "{gi9:#?}");
    assert!(gi9[1].contains(",container=\"shell\"}"), "{}", gi9[1]);
    // GPUs nobody runs on keep their single series.
    assert_eq!(of("gpu=\"1\",").len(), 1);
    // No pod labels anywhere on GPU series: this is not Kubernetes mode.
    assert!(temps.iter().all(|l| !l.contains("pod=")), "{temps:#?}");
    check("4xA100-80GB-MIG-container-labels", &body);
}

#[tokio::test(start_paused = true)]
async fn old_namespace_labels() {
    // `-o/--use-old-namespace`: uuid, pod_name, pod_namespace, container_name.
    let mut holders = BTreeMap::new();
    holders.insert(
        EntityKey {
            gpu: 0,
            gi_id: None,
        },
        vec![holder("ml", "trainer-0", "main", None)],
    );
    let opts = BuildOptions {
        old_namespace: true,
        ..common::build_options()
    };
    let body = render_case(
        "1xA100-40GB",
        None,
        opts,
        Attribution {
            holders,
            ..Default::default()
        },
    )
    .await;
    assert!(!body.contains("UUID="), "UUID label under -o");
    check("1xA100-40GB-old-namespace", &body);
}

#[tokio::test(start_paused = true)]
async fn newest_upstream_names_and_units() {
    // dcgm-exporter 4.10's default set: DCGM 4.7/4.8 names, Hz, J, 0-1, bytes, B/s.
    let body = render_with(
        common::catalog_file("metrics-config/dcgm-exporter-4.10-default-counters.csv"),
        "8xH100-SXM",
        None,
        common::build_options(),
        Attribution::default(),
    )
    .await;
    assert!(body.contains("DCGM_FI_SYSTEM_DRIVER_VERSION=\"570.172.08\""));
    assert!(!body.contains("DCGM_FI_DRIVER_VERSION="));
    // The CSV lists DCGM_FI_DEV_VGPU_LICENSE_STATUS; the simulated GPUs are bare metal, where
    // NVML has no vGPU licensing: no series and no read error, as on a real bare-metal GPU.
    assert!(
        !body.contains("VGPU_LICENSE_STATUS"),
        "bare metal has no vGPU licence status"
    );
    check("8xH100-SXM-dcgm-exporter-4.10", &body);
}

#[tokio::test(start_paused = true)]
async fn per_link_nvlink_series() {
    // dcgm-exporter's link entities: every active NVLink of the 8 H100s (18 each), with the
    // per-link error counters (all on GPU 4's one bad link, after an NVLink error storm) and
    // throughput.
    let body = render_with(
        common::catalog_file("tests/fixtures/csv/nvlink-per-link.csv"),
        "8xH100-SXM",
        Some("nvlink-errors.toml"),
        common::build_options(),
        Attribution::default(),
    )
    .await;
    check("8xH100-SXM-nvlink", &body);
}

#[tokio::test(start_paused = true)]
async fn dra_claims_and_hpc_jobs() {
    // The attribution as the refresher would build it from the DRA fixture, and the HPC jobs as
    // the watcher would read them from the fixture directory.
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let reply = Assignments::load(std::path::Path::new(&format!(
        "{fixtures}/pods/a100-mig-dra-seed1.toml"
    )))
    .expect("DRA fixture")
    .reply;
    let devices = common::sim("4xA100-80GB-MIG", None)
        .devices()
        .expect("devices");
    let opts = MappingOptions {
        enable_dra: true,
        ..MappingOptions::default()
    };
    let mut pods = mapping::attribution_from(&reply, &devices, &opts).attribution;
    let monitored = hpc::entities(&devices);
    pods.jobs = hpc::scan(
        std::path::Path::new(&format!("{fixtures}/hpc/a100-mig")),
        &monitored,
    )
    .jobs;
    assert_eq!(pods.jobs.len(), 3, "{:?}", pods.jobs);
    let body = render_case("4xA100-80GB-MIG", None, common::build_options(), pods).await;
    check("4xA100-80GB-MIG-dra-hpc", &body);
}
