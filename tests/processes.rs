//! Who *uses* the GPUs: per-process readings attributed to containers through the processes'
//! cgroups (the proc fixture) and the container runtime (the fake CRI server on real unix
//! sockets, and the `fake-kubelet` binary), with pod UIDs and labels; and how every failure of
//! the runtime socket or `/proc` degrades to holder-only attribution with a self-metric.
//!
//! The node is tests/fixtures/pods/a100-mig-shared-seed1.toml on `4xA100-80GB-MIG` (seed 1):
//! GPU 3 time-sliced by infer/embed-a, -b, -c (weights 3:2:1); GPU 0's instance 2 used by
//! batch/etl-0 (two processes); GPU 0's instance 9 time-sliced by dev/shell-a (one process) and
//! dev/shell-b (no process). Synchronisation is by awaited calls and readiness lines; the only
//! clock-driven test runs on paused tokio time with a scripted runtime.

mod common;

use common::grpc::{serve, Server};

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tonic::{Request, Response, Status};

use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::pods::cgroup::CgroupOwner;
use gpu_exporter::pods::cri::{ContainerRuntime, CriClient, CriError};
use gpu_exporter::pods::cri_proto::runtime_service_client::RuntimeServiceClient;
use gpu_exporter::pods::cri_proto::{
    ContainerFilter, ContainerState, ContainerStateValue, ListContainersRequest,
    ListContainersResponse, ListPodSandboxRequest, ListPodSandboxResponse, PodSandboxFilter,
    PodSandboxState, PodSandboxStateValue, VersionRequest, VersionResponse,
};
use gpu_exporter::pods::cri_refresher::{CriMetrics, CriOptions, CriRefresher};
use gpu_exporter::pods::directory::{LabelOptions, PodDirectory, RuntimeSnapshot};
use gpu_exporter::pods::procfs::ProcRoot;
use gpu_exporter::pods::refresher::RefreshOutcome;
use gpu_exporter::sampler::Sampler;
use gpu_exporter_testing::fake_cri::FakeRuntime;
use gpu_exporter_testing::fake_kubelet::Assignments;
use gpu_exporter_testing::proto::cri::runtime_service_server::{
    RuntimeService, RuntimeServiceServer,
};

use common::{series, SelfMetrics};

const PROFILE: &str = "4xA100-80GB-MIG";

// ---------------------------------------------------------------------------------------------
// Helpers

fn fake_cri(path: &Path, snap: RuntimeSnapshot) -> (Server, watch::Sender<RuntimeSnapshot>) {
    let (tx, rx) = watch::channel(snap);
    (serve(path, FakeRuntime::new(rx).into_service()), tx)
}

fn labels_on() -> LabelOptions {
    LabelOptions {
        enabled: true,
        allowlist: vec![],
    }
}

/// The sampler over the shared node, with per-process attribution reading `proc_root`, holders
/// from the node's assignments, and the runtime's directory from `refresher`'s channel.
struct Node<R: ContainerRuntime> {
    sampler: Sampler<SimulatedSource>,
    refresher: CriRefresher<R>,
    metrics: Arc<SelfMetrics>,
    waker: Arc<Notify>,
}

fn node<R: ContainerRuntime>(runtime: R, proc_root: &Path, virtual_gpus: bool) -> Node<R> {
    let a = common::shared_node();
    let mut build = common::build_options();
    build.virtual_gpus = virtual_gpus;
    build.pod_uid = true;
    let h = common::harness(
        common::sim_running(PROFILE, &a),
        common::shipped_catalog(),
        build,
    );
    h.pods_tx
        .send_replace(Arc::new(common::holders(PROFILE, &a)));
    let (dir_tx, dir_rx) = watch::channel(Arc::new(PodDirectory::default()));
    let refresher = CriRefresher::new(
        runtime,
        dir_tx,
        Arc::clone(&h.metrics.cri),
        CriOptions {
            refresh: Duration::from_secs(10),
            ttl: Duration::from_secs(30),
            labels: labels_on(),
        },
    );
    let waker = refresher.waker();
    let sampler = h
        .sampler
        .with_directory(dir_rx, Arc::clone(&waker))
        .with_process_usage(ProcRoot::new(proc_root));
    Node {
        sampler,
        refresher,
        metrics: h.metrics,
        waker,
    }
}

impl<R: ContainerRuntime> Node<R> {
    async fn body(&mut self) -> String {
        let p = self.sampler.tick().await;
        String::from_utf8(p.body.to_vec()).expect("utf-8")
    }
}

fn cri_client(path: &Path) -> CriClient {
    CriClient::new(
        &format!("unix://{}", path.display()),
        Duration::from_secs(5),
    )
    .expect("client")
}

/// The value of a series line.
fn value(line: &str) -> f64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Series of `metric` on GPU `gpu` (MIG instance `gi`), by pod (`""` for unlabelled ones).
fn by_pod(body: &str, metric: &str, gpu: u32, gi: Option<u32>) -> BTreeMap<String, Vec<f64>> {
    let g = format!("gpu=\"{gpu}\",");
    let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for l in series(body, metric) {
        let in_entity = l.contains(&g)
            && match gi {
                Some(i) => l.contains(&format!("GPU_I_ID=\"{i}\"")),
                None => !l.contains("GPU_I_ID="),
            };
        if !in_entity {
            continue;
        }
        let pod = l
            .split(",pod=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_owned();
        out.entry(pod).or_default().push(value(l));
    }
    out
}

fn one(body: &str, line_prefix: &str) -> f64 {
    let l: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with(line_prefix))
        .collect();
    assert_eq!(l.len(), 1, "{line_prefix}: {l:?}");
    value(l[0])
}

const MIB: f64 = 1_048_576.0;

// ---------------------------------------------------------------------------------------------
// The proc fixture and the fake runtime

#[test]
fn the_proc_fixture_names_the_nodes_pods_in_every_cgroup_form() {
    let a = common::shared_node();
    let root = ProcRoot::new(common::proc_fixture());
    let mut checked = 0;
    for pod in &a.pods {
        for c in &pod.containers {
            for run in &c.runs {
                for pid in &run.pids {
                    assert_eq!(
                        root.owner(*pid).unwrap(),
                        CgroupOwner::Pod {
                            uid: pod.uid.clone(),
                            container_id: Some(c.id.clone()),
                        },
                        "pid {pid} ({}/{})",
                        pod.name,
                        c.name
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 6);
    assert_eq!(root.owner(40001).unwrap(), CgroupOwner::OutsidePods);
    assert_eq!(root.owner(40002).unwrap(), CgroupOwner::OutsidePods);
    assert_eq!(
        root.owner(40003).unwrap_err().reason(),
        "cgroup_unrecognised"
    );
    assert_eq!(root.owner(1).unwrap_err().reason(), "proc_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_runtime_serves_cri_runtime_v1_with_filters() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let a = common::shared_node();
    let (server, _tx) = fake_cri(&sock, a.runtime_snapshot());

    // Our client: both lists, then the directory built from them.
    let client = cri_client(&sock);
    let snap = client.list().await.expect("list");
    assert_eq!((snap.sandboxes.len(), snap.containers.len()), (6, 6));
    assert_eq!(
        client.version().await.unwrap(),
        format!("fake-cri {} (CRI v1)", env!("CARGO_PKG_VERSION"))
    );
    let d = PodDirectory::from_runtime(&snap, &labels_on());
    let embed_a = &a.pods[0];
    let c = d.container(&embed_a.containers[0].id).expect("listed");
    assert_eq!(
        (
            c.pod.namespace.as_str(),
            c.pod.pod.as_str(),
            c.pod.container.as_str()
        ),
        ("infer", "embed-a", "server")
    );
    assert_eq!(c.meta.uid, "3f6b0d2c-91a4-4c55-8e0f-7d2b6a1c9e01");
    assert_eq!(
        c.meta.labels,
        vec![
            ("app".to_owned(), "embed".to_owned()),
            ("app_kubernetes_io_part_of".to_owned(), "search".to_owned()),
            ("team".to_owned(), "search".to_owned()),
        ]
    );

    // The generated client, as any CRI client would call it: filters are honoured.
    let channel = tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn({
            let sock = sock.clone();
            move |_| {
                let sock = sock.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(sock).await?,
                    ))
                }
            }
        }))
        .await
        .unwrap();
    let mut raw = RuntimeServiceClient::new(channel);
    let not_ready = raw
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                state: Some(PodSandboxStateValue {
                    state: PodSandboxState::SandboxNotready as i32,
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(not_ready.items.is_empty());
    let team = raw
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                label_selector: [("team".to_owned(), "search".to_owned())].into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(team.items.len(), 2);
    let in_sandbox = raw
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                pod_sandbox_id: embed_a.sandbox_id.clone(),
                state: Some(ContainerStateValue {
                    state: ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(in_sandbox.containers.len(), 1);
    assert_eq!(in_sandbox.containers[0].id, embed_a.containers[0].id);
    server.stop().await;
}

/// A runtime that never answers `ListPodSandbox`.
#[derive(Clone)]
struct Hanging;

#[tonic::async_trait]
impl RuntimeService for Hanging {
    async fn version(
        &self,
        _r: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        Err(Status::unimplemented("no"))
    }
    async fn list_pod_sandbox(
        &self,
        _r: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        std::future::pending().await
    }
    async fn list_containers(
        &self,
        _r: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_failures_are_classified_and_name_the_socket() {
    let dir = tempfile::tempdir().unwrap();

    // Nothing at the path.
    let missing = dir.path().join("missing.sock");
    let e = cri_client(&missing).list().await.unwrap_err();
    assert_eq!(e.reason(), "socket_missing");
    assert!(e.to_string().contains("missing.sock"), "{e}");

    // A socket that serves something else (the kubelet's pod-resources API): Unimplemented.
    let other = dir.path().join("kubelet.sock");
    let (_tx, rx) = watch::channel(Default::default());
    let server = serve(
        &other,
        gpu_exporter_testing::fake_kubelet::FakeKubelet::new(rx).into_service(),
    );
    let e = cri_client(&other).list().await.unwrap_err();
    assert_eq!(e.reason(), "rejected", "{e:?}");
    assert!(e.hint().contains("runtime.v1.RuntimeService"));
    server.stop().await;

    // A runtime that hangs: the call times out.
    let hang = dir.path().join("hang.sock");
    let server = serve(&hang, RuntimeServiceServer::new(Hanging));
    let client = CriClient::new(
        &format!("unix://{}", hang.display()),
        Duration::from_millis(300),
    )
    .unwrap();
    let e = client.list().await.unwrap_err();
    assert!(
        matches!(
            e,
            CriError::Timeout {
                call: "ListPodSandbox",
                ..
            }
        ),
        "{e:?}"
    );
    server.stop().await;

    // Not a unix socket.
    let e = CriClient::new("tcp://127.0.0.1:1234", Duration::from_secs(1)).unwrap_err();
    assert_eq!(e.reason(), "invalid_endpoint");
    assert!(e
        .to_string()
        .starts_with("--container-runtime-endpoint tcp://"));
}

// ---------------------------------------------------------------------------------------------
// The pipeline

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pod_on_a_time_sliced_gpu_gets_its_own_usage_summing_to_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let (server, _tx) = fake_cri(&sock, common::shared_node().runtime_snapshot());
    let mut n = node(cri_client(&sock), &common::proc_fixture(), false);
    assert_eq!(n.refresher.refresh_once().await, RefreshOutcome::Fresh);
    n.body().await;
    let body = n.body().await;

    // GPU 3: three pods, their own utilisation and memory; the device series stay as they were.
    let sm = by_pod(
        &body,
        "gpu_exporter_container_sm_utilization_percent",
        3,
        None,
    );
    let fb = by_pod(&body, "gpu_exporter_container_fb_used_bytes", 3, None);
    let pods: Vec<&str> = sm.keys().map(String::as_str).collect();
    assert_eq!(pods, ["embed-a", "embed-b", "embed-c"]);
    let device_util = by_pod(&body, "DCGM_FI_DEV_GPU_UTIL", 3, None)[""][0];
    let device_fb = by_pod(&body, "DCGM_FI_DEV_FB_USED", 3, None)[""][0];
    let sum_sm: f64 = sm.values().flatten().sum();
    let sum_fb: f64 = fb.values().flatten().sum::<f64>() / MIB;
    // The documented tolerance: memory exact in MiB, utilisation within 1 point per container.
    assert!(
        (sum_sm - device_util).abs() <= 3.0,
        "{sum_sm} vs {device_util}"
    );
    assert!(device_util > 10.0, "GPU 3 should be busy: {device_util}");
    assert_eq!(sum_fb, device_fb);
    // Weights 3:2:1.
    assert!(sm["embed-a"][0] > sm["embed-b"][0] && sm["embed-b"][0] > sm["embed-c"][0]);

    // MIG instance 2: the two processes of batch/etl-0, all of the instance's memory; no
    // utilisation (NVML has none per process on MIG).
    let etl = by_pod(&body, "gpu_exporter_container_fb_used_bytes", 0, Some(2));
    let inst_fb = by_pod(&body, "DCGM_FI_DEV_FB_USED", 0, Some(2));
    assert_eq!(etl["etl-0"][0] / MIB, inst_fb["etl-0"][0]);
    assert_eq!(
        by_pod(&body, "gpu_exporter_container_processes", 0, Some(2))["etl-0"],
        [2.0]
    );
    assert!(by_pod(
        &body,
        "gpu_exporter_container_sm_utilization_percent",
        0,
        Some(2)
    )
    .is_empty());
    // MIG instance 9: shell-a runs a process, shell-b holds a replica but runs nothing.
    let nine: Vec<String> = by_pod(&body, "gpu_exporter_container_processes", 0, Some(9))
        .into_keys()
        .collect();
    assert_eq!(nine, ["shell-a"]);

    // pod_uid and the allowlisted labels on the per-container series.
    let a_line = series(&body, "gpu_exporter_container_sm_utilization_percent")
        .into_iter()
        .find(|l| l.contains("pod=\"embed-a\""))
        .unwrap();
    assert!(a_line.contains(r#"pod_uid="3f6b0d2c-91a4-4c55-8e0f-7d2b6a1c9e01",app="embed",app_kubernetes_io_part_of="search",team="search"}"#), "{a_line}");

    // Self-metrics: every process attributed, the runtime up.
    assert_eq!(one(&body, "gpu_exporter_cri_up "), 1.0);
    assert_eq!(one(&body, "gpu_exporter_cri_containers "), 6.0);
    assert_eq!(
        one(&body, "gpu_exporter_gpu_processes{outcome=\"attributed\"}"),
        6.0
    );
    assert_eq!(
        body.lines()
            .filter(|l| l.starts_with("gpu_exporter_process_attribution_errors_total"))
            .map(value)
            .sum::<f64>(),
        0.0
    );
    assert_eq!(n.metrics.processes.state().outcomes["attributed"], 6);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_gpus_carry_each_holders_own_util_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let (server, _tx) = fake_cri(&sock, common::shared_node().runtime_snapshot());
    let mut n = node(cri_client(&sock), &common::proc_fixture(), true);
    n.refresher.refresh_once().await;
    n.body().await;
    let body = n.body().await;
    let util = by_pod(&body, "DCGM_FI_DEV_GPU_UTIL", 3, None);
    let own = by_pod(
        &body,
        "gpu_exporter_container_sm_utilization_percent",
        3,
        None,
    );
    // The three holders, and (as dcgm-exporter 4.8.2+) the device-level series, no pod labels.
    assert_eq!(util.len(), 4, "{util:?}");
    assert_eq!(util[""].len(), 1, "{util:?}");
    for (pod, v) in util.iter().filter(|(pod, _)| !pod.is_empty()) {
        assert_eq!(v, &own[pod], "{pod}");
    }
    let fb = by_pod(&body, "DCGM_FI_DEV_FB_USED", 0, Some(9));
    assert_eq!(fb["shell-b"], [0.0]);
    assert!(fb["shell-a"][0] > 0.0);
    // Other fields are copies of the device value.
    let temp = by_pod(&body, "DCGM_FI_DEV_GPU_TEMP", 3, None);
    let values: Vec<f64> = temp.values().flatten().copied().collect();
    assert!(values.windows(2).all(|w| w[0] == w[1]), "{values:?}");
    server.stop().await;
}

/// A node whose GPU 3 is a DRA claim shared by two pods, each running a process, and whose
/// GPU 0 instance 2 is a DRA-allocated MIG instance with one process.
const DRA_NODE: &str = r#"
[[assignment]]
namespace = "ml"
pod = "dra-a"
container = "main"
claim = "shared-gpu"
pool = "node-a"
devices = ["gpu-3"]
pids = [3001]
weight = 3.0

[[assignment]]
namespace = "ml"
pod = "dra-b"
container = "main"
claim = "shared-gpu"
pool = "node-a"
devices = ["gpu-3"]
pids = [3002]

[[assignment]]
namespace = "batch"
pod = "dra-etl"
container = "worker"
claim = "etl-mig"
pool = "node-a"
devices = ["gpu-0-mig-3g40gb-9-4"]
pids = [3003]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_allocated_entities_get_per_container_series_beside_their_claim_copies() {
    let a = Assignments::parse(DRA_NODE, "dra.toml").expect("parses");
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    a.write_proc_tree(&proc_root, &[]).expect("proc tree");
    let sock = dir.path().join("cri.sock");
    let (server, _tx) = fake_cri(&sock, a.runtime_snapshot());

    let mut build = common::build_options();
    build.virtual_gpus = true;
    build.pod_uid = true;
    let h = common::harness(
        common::sim_running(PROFILE, &a),
        common::shipped_catalog(),
        build,
    );
    let devices =
        gpu_exporter::gpu::GpuSource::devices(&common::sim(PROFILE, None)).expect("devices");
    let mapped = gpu_exporter::pods::mapping::attribution_from(
        &a.reply,
        &devices,
        &gpu_exporter::pods::mapping::MappingOptions {
            enable_dra: true,
            ..Default::default()
        },
    );
    h.pods_tx.send_replace(Arc::new(mapped.attribution));
    let (dir_tx, dir_rx) = watch::channel(Arc::new(PodDirectory::default()));
    let mut refresher = CriRefresher::new(
        cri_client(&sock),
        dir_tx,
        Arc::clone(&h.metrics.cri),
        CriOptions {
            refresh: Duration::from_secs(10),
            ttl: Duration::from_secs(30),
            labels: labels_on(),
        },
    );
    let mut sampler = h
        .sampler
        .with_directory(dir_rx, refresher.waker())
        .with_process_usage(ProcRoot::new(&proc_root));
    assert_eq!(refresher.refresh_once().await, RefreshOutcome::Fresh);
    sampler.tick().await;
    let body = String::from_utf8(sampler.tick().await.body.to_vec()).unwrap();

    // GPU 3: one copy per DRA holder, each with its claim, pod_uid and its own utilisation and
    // memory (virtual mode); the per-container series are the same values, without the claim.
    let util = series(&body, "DCGM_FI_DEV_GPU_UTIL");
    let on3: Vec<&&str> = util.iter().filter(|l| l.contains("gpu=\"3\",")).collect();
    assert_eq!(on3.len(), 2, "{on3:#?}");
    assert!(on3
        .iter()
        .all(|l| l.contains(r#"dra_claim_name="shared-gpu""#)
            && l.contains(r#"dra_device_name="gpu-3""#)
            && l.contains("pod_uid=")
            && !l.contains("vgpu=")));
    let own = by_pod(&body, "DCGM_FI_DEV_GPU_UTIL", 3, None);
    let sm = by_pod(
        &body,
        "gpu_exporter_container_sm_utilization_percent",
        3,
        None,
    );
    assert_eq!(own.keys().collect::<Vec<_>>(), ["dra-a", "dra-b"]);
    for (pod, v) in &own {
        assert_eq!(v, &sm[pod], "{pod}");
    }
    assert!(sm["dra-a"][0] > sm["dra-b"][0], "weights 3:1: {sm:?}");
    let fb = by_pod(&body, "gpu_exporter_container_fb_used_bytes", 3, None);
    let fb_copies = by_pod(&body, "DCGM_FI_DEV_FB_USED", 3, None);
    for (pod, v) in &fb {
        assert_eq!(fb_copies[pod][0], (v[0] / MIB).floor(), "{pod}");
    }
    // GPU 0 instance 2: the MIG copy with dra_mig_* labels; the process's memory per container.
    let mig = by_pod(&body, "gpu_exporter_container_fb_used_bytes", 0, Some(2));
    assert_eq!(mig.keys().collect::<Vec<_>>(), ["dra-etl"]);
    let copy = series(&body, "DCGM_FI_DEV_FB_USED")
        .into_iter()
        .find(|l| l.contains(r#"GPU_I_ID="2""#) && l.contains(r#"gpu="0","#))
        .unwrap();
    assert!(
        copy.contains("dra_mig_device_uuid=\"MIG-")
            && copy.contains(r#"dra_mig_profile="3g.40gb""#),
        "{copy}"
    );
    assert_eq!(value(copy), (mig["dra-etl"][0] / MIB).floor());
    // No per-container series carries a claim.
    assert!(body
        .lines()
        .filter(|l| l.starts_with("gpu_exporter_container_"))
        .all(|l| !l.contains("dra_")));
    assert_eq!(
        one(&body, "gpu_exporter_gpu_processes{outcome=\"attributed\"}"),
        3.0
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_runtime_attribution_degrades_to_holders_with_a_self_metric() {
    let dir = tempfile::tempdir().unwrap();
    let mut n = node(
        cri_client(&dir.path().join("no-runtime.sock")),
        &common::proc_fixture(),
        true,
    );
    assert!(matches!(
        n.refresher.refresh_once().await,
        RefreshOutcome::Dropped {
            reason: "socket_missing"
        }
    ));
    n.body().await;
    let body = n.body().await;
    assert!(
        !body.contains("gpu_exporter_container_"),
        "no per-container series without the runtime"
    );
    assert_eq!(one(&body, "gpu_exporter_cri_up "), 0.0);
    assert_eq!(
        one(
            &body,
            "gpu_exporter_cri_errors_total{reason=\"socket_missing\"}"
        ),
        1.0
    );
    assert_eq!(
        one(
            &body,
            "gpu_exporter_process_attribution_errors_total{reason=\"runtime_unavailable\"}"
        ),
        2.0
    );
    assert_eq!(
        one(
            &body,
            "gpu_exporter_gpu_processes{outcome=\"unknown_container\"}"
        ),
        6.0
    );
    // Holder attribution as before: one series per holder, each a copy of the device value,
    // next to the device-level series, and no pod_uid (it comes from the runtime).
    let util = by_pod(&body, "DCGM_FI_DEV_GPU_UTIL", 3, None);
    assert_eq!(util.len(), 4, "{util:?}");
    assert!(util.contains_key(""), "{util:?}");
    let values: Vec<f64> = util.values().flatten().copied().collect();
    assert!(values.windows(2).all(|w| w[0] == w[1]), "{values:?}");
    assert_eq!(series(&body, "gpu_exporter_gpu_pod_info").len(), 6);
    assert!(!body.contains("pod_uid="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_proc_degrades_to_holders_with_a_self_metric() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let (server, _tx) = fake_cri(&sock, common::shared_node().runtime_snapshot());
    // The exporter's own /proc namespace: no such PIDs (hostPID and the /host/proc mount forgotten).
    let empty = dir.path().join("proc");
    std::fs::create_dir(&empty).unwrap();
    let mut n = node(cri_client(&sock), &empty, true);
    n.refresher.refresh_once().await;
    n.body().await;
    let body = n.body().await;
    assert!(!body.contains("gpu_exporter_container_"));
    assert_eq!(
        one(
            &body,
            "gpu_exporter_process_attribution_errors_total{reason=\"proc_not_found\"}"
        ),
        12.0
    );
    assert_eq!(
        one(&body, "gpu_exporter_gpu_processes{outcome=\"unreadable\"}"),
        6.0
    );
    // Copies of the device value, but pod_uid still comes from the runtime.
    let util = by_pod(&body, "DCGM_FI_DEV_FB_USED", 0, Some(9));
    assert_eq!(util["shell-a"], util["shell-b"]);
    assert!(body.contains("pod_uid=\"5a7e9c1b-3d2f-4e6a-8b0c-1d2e3f4a5b61\""));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_the_runtime_did_not_list_wakes_the_runtime_task_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let a = common::shared_node();
    // The runtime was listed before embed-c started.
    let mut early = a.runtime_snapshot();
    early
        .containers
        .retain(|c| c.labels.get("io.kubernetes.pod.name").map(String::as_str) != Some("embed-c"));
    let (server, tx) = fake_cri(&sock, early);
    let mut n = node(cri_client(&sock), &common::proc_fixture(), true);
    n.refresher.refresh_once().await;
    n.body().await;
    let body = n.body().await;
    assert_eq!(
        one(
            &body,
            "gpu_exporter_gpu_processes{outcome=\"unknown_container\"}"
        ),
        1.0
    );
    // GPU 3 is incomplete: its holders keep the device's value; the MIG instances do not care.
    let util = by_pod(&body, "DCGM_FI_DEV_GPU_UTIL", 3, None);
    let values: Vec<f64> = util.values().flatten().copied().collect();
    assert!(values.windows(2).all(|w| w[0] == w[1]), "{values:?}");
    assert_eq!(
        by_pod(&body, "DCGM_FI_DEV_FB_USED", 0, Some(9))["shell-b"],
        [0.0]
    );
    // The sampler asked the runtime task to list again (the permit is waiting).
    tokio::time::timeout(Duration::from_secs(5), n.waker.notified())
        .await
        .expect("the sampler woke the runtime task");
    // The runtime now lists it; the next listing and tick attribute everything.
    tx.send_replace(a.runtime_snapshot());
    n.refresher.refresh_once().await;
    let body = n.body().await;
    assert_eq!(
        one(&body, "gpu_exporter_gpu_processes{outcome=\"attributed\"}"),
        6.0
    );
    let util = by_pod(&body, "DCGM_FI_DEV_GPU_UTIL", 3, None);
    assert!(util["embed-a"][0] > util["embed-c"][0], "{util:?}");
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The runtime task's cadence and TTL (paused time, scripted runtime)

struct Scripted {
    script: Mutex<VecDeque<Result<RuntimeSnapshot, CriError>>>,
}

impl ContainerRuntime for Scripted {
    fn origin(&self) -> String {
        "scripted".into()
    }
    async fn list(&self) -> Result<RuntimeSnapshot, CriError> {
        self.script
            .lock()
            .unwrap()
            .pop_front()
            .expect("script long enough")
    }
    async fn version(&self) -> Result<String, CriError> {
        Ok("scripted 1".into())
    }
}

fn down() -> Result<RuntimeSnapshot, CriError> {
    Err(CriError::Unavailable {
        path: PathBuf::from("/run/containerd/containerd.sock"),
        cause: "connection refused".into(),
    })
}

#[tokio::test(start_paused = true)]
async fn the_last_answer_is_kept_until_the_ttl_then_dropped() {
    let snap = common::shared_node().runtime_snapshot();
    let runtime = Scripted {
        script: Mutex::new(VecDeque::from([Ok(snap), down(), down(), down(), down()])),
    };
    let metrics = Arc::new(SelfMetrics::default());
    let (tx, rx) = watch::channel(Arc::new(PodDirectory::default()));
    let mut r = CriRefresher::new(
        runtime,
        tx,
        Arc::clone(&metrics.cri),
        CriOptions {
            refresh: Duration::from_secs(10),
            ttl: Duration::from_secs(30),
            labels: LabelOptions::default(),
        },
    );
    assert_eq!(r.refresh_once().await, RefreshOutcome::Fresh);
    assert!(rx.borrow().is_available());
    assert_eq!(r.next_delay(), Duration::from_secs(10));
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        r.refresh_once().await,
        RefreshOutcome::Kept {
            age: Duration::from_secs(10)
        }
    );
    assert_eq!(r.next_delay(), Duration::from_millis(500));
    assert!(rx.borrow().is_available(), "kept within the TTL");
    assert!(!metrics.cri.state().health.up);
    tokio::time::advance(Duration::from_secs(19)).await;
    assert!(matches!(
        r.refresh_once().await,
        RefreshOutcome::Kept { .. }
    ));
    assert_eq!(r.next_delay(), Duration::from_secs(1));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        r.refresh_once().await,
        RefreshOutcome::Dropped {
            reason: "unavailable"
        }
    );
    assert!(!rx.borrow().is_available(), "dropped after the TTL");
    let s = metrics.cri.state();
    assert_eq!((s.pods, s.containers), (0, 0));
    assert_eq!(s.health.errors["unavailable"], 3);
}

/// Reports each listing on a channel, always with the same answer.
struct Counted {
    calls: tokio::sync::mpsc::UnboundedSender<tokio::time::Instant>,
}

impl ContainerRuntime for Counted {
    fn origin(&self) -> String {
        "counted".into()
    }
    async fn list(&self) -> Result<RuntimeSnapshot, CriError> {
        let _ = self.calls.send(tokio::time::Instant::now());
        Ok(RuntimeSnapshot::default())
    }
    async fn version(&self) -> Result<String, CriError> {
        Ok("counted 1".into())
    }
}

#[tokio::test(start_paused = true)]
async fn a_wake_lists_again_within_a_second_not_at_the_next_refresh() {
    let (calls, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (tx, _dir) = watch::channel(Arc::new(PodDirectory::default()));
    let r = CriRefresher::new(
        Counted { calls },
        tx,
        Arc::new(CriMetrics::default()),
        CriOptions {
            refresh: Duration::from_secs(10),
            ttl: Duration::from_secs(30),
            labels: LabelOptions::default(),
        },
    );
    let waker = r.waker();
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(r.run(stop.clone()));
    let first = rx.recv().await.unwrap();
    waker.notify_one();
    let second = rx.recv().await.unwrap();
    assert_eq!(
        second - first,
        gpu_exporter::pods::cri_refresher::MIN_WAKE_GAP
    );
    // Without a wake, the refresh period.
    let third = rx.recv().await.unwrap();
    assert_eq!(third - second, Duration::from_secs(10));
    stop.cancel();
    task.await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// The fake-kubelet binary: a whole fake node

struct FakeKubelet {
    child: Child,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_kubelet_serves_the_runtime_and_writes_the_proc_tree() {
    let dir = tempfile::tempdir().unwrap();
    let (kubelet, cri, proc_root) = (
        dir.path().join("kubelet.sock"),
        dir.path().join("cri.sock"),
        dir.path().join("proc"),
    );
    let file = common::pods_fixture("a100-mig-shared-seed1.toml");
    let mut child = Command::new(common::fake_kubelet_bin::fake_kubelet_bin())
        .arg("--socket")
        .arg(&kubelet)
        .arg("--cri-socket")
        .arg(&cri)
        .arg("--proc-root")
        .arg(&proc_root)
        .arg("--assignments")
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fake-kubelet");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut fk = FakeKubelet { child, stdout };
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.starts_with("fake-kubelet: serving"))
    {
        let mut l = String::new();
        assert!(
            fk.stdout.read_line(&mut l).unwrap() > 0,
            "exited: {lines:?}"
        );
        lines.push(l.trim().to_owned());
    }
    assert_eq!(
        lines,
        [
            format!(
                "fake-kubelet: proc tree of 6 processes in {}",
                proc_root.display()
            ),
            format!(
                "fake-kubelet: CRI serving 6 containers on {}",
                cri.display()
            ),
            format!("fake-kubelet: serving 6 pods on {}", kubelet.display()),
        ]
    );
    let a = Assignments::load(&file).unwrap();
    let snap = cri_client(&cri).list().await.expect("CRI answers");
    assert_eq!(snap, a.runtime_snapshot());
    // The written tree resolves like the fixture.
    let written = ProcRoot::new(&proc_root);
    let fixture = ProcRoot::new(common::proc_fixture());
    for pid in [41001, 41002, 41003, 42001, 42002, 43001] {
        assert_eq!(
            written.owner(pid).unwrap(),
            fixture.owner(pid).unwrap(),
            "pid {pid}"
        );
    }
    drop(fk);
}

// ---------------------------------------------------------------------------------------------
// Accounting (issue 37)

/// `gpu_exporter_container_*` accounting series of `body`: (gpu, GPU_I_ID, consumer, pod) ->
/// value.
fn accounts(body: &str, family: &str) -> BTreeMap<(String, String, String, String), f64> {
    let label = |l: &str, k: &str| {
        l.split(&format!("{k}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_owned()
    };
    series(body, family)
        .into_iter()
        .map(|l| {
            (
                (
                    label(l, "gpu"),
                    label(l, "GPU_I_ID"),
                    label(l, "consumer"),
                    label(l, ",pod"),
                ),
                value(l),
            )
        })
        .collect()
}

/// The GPU's own energy counter in `body`, mJ (the same on every copy of its series).
fn gpu_energy_mj(body: &str, gpu: u32) -> u64 {
    let g = format!("gpu=\"{gpu}\",");
    let l = series(body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
        .into_iter()
        .find(|l| l.contains(&g))
        .unwrap_or_else(|| panic!("no energy series for GPU {gpu}"));
    value(l) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounting_splits_each_gpus_own_energy_exactly_by_holders_and_activity() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let (server, _tx) = fake_cri(&sock, common::shared_node().runtime_snapshot());
    let mut n = node(cri_client(&sock), &common::proc_fixture(), false);
    assert_eq!(n.refresher.refresh_once().await, RefreshOutcome::Fresh);
    // Idle power 0 W (the flag): all of each change is dynamic, split by measured activity.
    n.metrics
        .accounting
        .enable(gpu_exporter::accounting::AccountingOptions {
            idle_mw: Some(0),
            processes: true,
            retention: Duration::from_secs(3600),
            hostname: ("hostname".into(), "node-a".into()),
            publish_every: std::time::Duration::ZERO,
        });
    let first = n.body().await;
    let mut last = String::new();
    for _ in 0..6 {
        last = n.body().await;
    }
    let energy = accounts(&last, "gpu_exporter_container_energy_joules_total");
    // Every GPU: its accounts add up to its own counter's increase, to the millijoule.
    for gpu in 0..4u32 {
        let charged: f64 = energy
            .iter()
            .filter(|((g, ..), _)| *g == gpu.to_string())
            .map(|(_, j)| j)
            .sum();
        let rose = gpu_energy_mj(&last, gpu) - gpu_energy_mj(&first, gpu);
        assert!(rose > 0, "GPU {gpu} drew no energy");
        assert_eq!(
            (charged * 1000.0).round() as u64,
            rose,
            "GPU {gpu}: {energy:#?}"
        );
    }
    // GPU 3, time-sliced by embed-a, -b, -c running at weights 3:2:1: the energy follows.
    let on3 = |pod: &str| energy[&("3".into(), String::new(), "holder".into(), pod.into())];
    let total3 = on3("embed-a") + on3("embed-b") + on3("embed-c");
    for (pod, want) in [
        ("embed-a", 0.5),
        ("embed-b", 1.0 / 3.0),
        ("embed-c", 1.0 / 6.0),
    ] {
        let share = on3(pod) / total3;
        assert!(
            (share - want).abs() < 0.05,
            "{pod}: {share} of GPU 3's energy, want {want}"
        );
    }
    // GPUs 1 and 2: nobody holds them; all of their energy is unallocated.
    for gpu in ["1", "2"] {
        assert!(energy
            .keys()
            .filter(|(g, ..)| g == gpu)
            .all(|(_, _, consumer, _)| consumer == "unallocated"));
    }
    // GPU 0's instance 9: shell-b holds a replica and runs nothing (waste); shell-a runs.
    let idle = accounts(
        &last,
        "gpu_exporter_container_idle_allocated_gpu_seconds_total",
    );
    let waste = |pod: &str| idle[&("0".into(), "9".into(), "holder".into(), pod.into())];
    assert!(waste("shell-b") > 0.0, "{idle:#?}");
    assert_eq!(waste("shell-a"), 0.0, "{idle:#?}");
    let allocated = accounts(&last, "gpu_exporter_container_allocated_gpu_seconds_total");
    let held = |pod: &str| allocated[&("0".into(), "9".into(), "holder".into(), pod.into())];
    assert!((waste("shell-b") - held("shell-b")).abs() < 1e-9);
    // Busy time only where processes ran: GPU 3's three pods.
    let busy = accounts(&last, "gpu_exporter_container_sm_busy_gpu_seconds_total");
    assert!(
        busy.keys().any(|(g, _, _, p)| g == "3" && p == "embed-a"),
        "{busy:#?}"
    );
    assert!(!busy.keys().any(|(_, _, _, p)| p == "shell-b"), "{busy:#?}");
    // The node label, as on the GPU series.
    assert!(series(&last, "gpu_exporter_container_energy_joules_total")
        .iter()
        .all(|l| l.contains(",hostname=\"node-a\",")));
    // The idle power in use, from the flag.
    assert_eq!(
        series(&last, "gpu_exporter_gpu_idle_power_watts")
            .iter()
            .filter(|l| l.contains("source=\"flag\""))
            .count(),
        4
    );
    server.stop().await;
}
