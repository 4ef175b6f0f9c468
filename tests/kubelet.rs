//! Pod attribution against real gRPC servers on temporary unix sockets: the in-process
//! [`FakeKubelet`] service, misbehaving test servers (hanging, rate-limiting, malformed), and the
//! `fake-kubelet` binary (killed with SIGKILL and restarted on the same path). The sampler runs
//! over the simulated fleet, so the assertions are on the rendered `/metrics` body.
//!
//! Synchronisation is by channels, readiness lines and awaited calls; the only clock-driven
//! test runs on paused tokio time with an in-memory resolver.

mod common;

use common::grpc::{serve, Server};
use common::logs::LogBuf;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tonic::codegen::http;
use tonic::{Request, Response, Status};

use common::SelfMetrics;
use gpu_exporter::config::GpuIdType;
use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::gpu::{Device, GpuSource};
use gpu_exporter::pods::kubelet::{KubeletPodResources, MAX_REPLY_BYTES};
use gpu_exporter::pods::mapping::{self, MappingOptions};
use gpu_exporter::pods::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use gpu_exporter::pods::refresher::PodResourcesMetrics;
use gpu_exporter::pods::refresher::{RefreshOutcome, Refresher, RefresherOptions};
use gpu_exporter::pods::{Attribution, AttributionError, EntityKey, PodResolver};
use gpu_exporter::sampler::Sampler;
use gpu_exporter_testing::fake_kubelet::{Assignments, FakeKubelet};
use gpu_exporter_testing::proto::pod_resources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};

use common::series;

// ---------------------------------------------------------------------------------------------
// Helpers

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pods")
        .join(name)
}

fn devices(profile: &str) -> Vec<Device> {
    common::sim(profile, None).devices().expect("sim devices")
}

fn pod(ns: &str, name: &str, container: &str, resource: &str, ids: &[&str]) -> PodResources {
    PodResources {
        name: name.to_owned(),
        namespace: ns.to_owned(),
        containers: vec![ContainerResources {
            name: container.to_owned(),
            devices: vec![ContainerDevices {
                resource_name: resource.to_owned(),
                device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                topology: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn reply(pods: Vec<PodResources>) -> ListPodResourcesResponse {
    ListPodResourcesResponse {
        pod_resources: pods,
    }
}

/// The standard fake kubelet: answers with whatever `tx` holds.
fn fake_kubelet(
    path: &Path,
    first: ListPodResourcesResponse,
) -> (Server, watch::Sender<ListPodResourcesResponse>) {
    let (tx, rx) = watch::channel(first);
    (serve(path, FakeKubelet::new(rx).into_service()), tx)
}

/// A kubelet that misbehaves on `List`: hangs (reporting each call) or answers an error.
#[derive(Clone)]
enum Misbehaving {
    Hang(mpsc::UnboundedSender<()>),
    Fail(tonic::Code, &'static str),
}

#[tonic::async_trait]
impl PodResourcesLister for Misbehaving {
    async fn list(
        &self,
        _r: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        match self {
            Misbehaving::Hang(calls) => {
                let _ = calls.send(());
                std::future::pending::<Result<Response<ListPodResourcesResponse>, Status>>().await
            }
            Misbehaving::Fail(code, msg) => Err(Status::new(*code, *msg)),
        }
    }
    async fn get_allocatable_resources(
        &self,
        _r: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
    async fn get(
        &self,
        _r: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("test"))
    }
}

/// What a confused server sends: field 1 of the reply holds bytes that are not a valid
/// `PodResources` message (its field 1, the pod name, is not UTF-8).
#[derive(Clone, PartialEq, prost::Message)]
struct BadPod {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct BadReply {
    #[prost(message, repeated, tag = "1")]
    pod_resources: Vec<BadPod>,
}

/// Serves `/v1.PodResourcesLister/List` with a [`BadReply`].
#[derive(Clone)]
struct Malformed;

impl tonic::server::NamedService for Malformed {
    const NAME: &'static str = "v1.PodResourcesLister";
}

impl tower::Service<http::Request<tonic::body::Body>> for Malformed {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        struct Unary;
        impl tonic::server::UnaryService<ListPodResourcesRequest> for Unary {
            type Response = BadReply;
            type Future = std::future::Ready<Result<Response<BadReply>, Status>>;
            fn call(&mut self, _r: Request<ListPodResourcesRequest>) -> Self::Future {
                std::future::ready(Ok(Response::new(BadReply {
                    pod_resources: vec![BadPod {
                        name: vec![0xff, 0xfe, 0xfd],
                    }],
                })))
            }
        }
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<BadReply, ListPodResourcesRequest>::default();
            Ok(tonic::server::Grpc::new(codec).unary(Unary, req).await)
        })
    }
}

/// A sampler over the simulated fleet wired to a refresher's channels.
struct Pipeline<R: PodResolver> {
    sampler: Sampler<SimulatedSource>,
    refresher: Refresher<R>,
    attribution: watch::Receiver<Arc<Attribution>>,
    metrics: Arc<SelfMetrics>,
}

fn pipeline<R: PodResolver>(
    profile: &str,
    resolver: R,
    virtual_gpus: bool,
    opts: RefresherOptions,
) -> Pipeline<R> {
    let mut build = common::build_options();
    build.virtual_gpus = virtual_gpus;
    let h = common::harness(common::sim(profile, None), common::shipped_catalog(), build);
    let (inv_tx, inv_rx) = watch::channel(Arc::new(Vec::new()));
    let attribution = h.pods_tx.subscribe();
    let refresher = Refresher::new(
        resolver,
        inv_rx,
        h.pods_tx,
        Arc::clone(&h.metrics.pod_resources),
        opts,
    );
    Pipeline {
        sampler: h.sampler.with_inventory(inv_tx),
        refresher,
        attribution,
        metrics: h.metrics,
    }
}

impl<R: PodResolver> Pipeline<R> {
    async fn body(&mut self) -> String {
        let p = self.sampler.tick().await;
        String::from_utf8(p.body.to_vec()).expect("utf-8")
    }
}

fn client(path: &Path) -> KubeletPodResources {
    KubeletPodResources::new(path, Duration::from_secs(5)).expect("client")
}

/// The lines of `metric` for GPU `gpu` (and MIG instance `gi`).
fn lines_for<'a>(body: &'a str, metric: &str, gpu: u32, gi: Option<u32>) -> Vec<&'a str> {
    let g = format!("gpu=\"{gpu}\",");
    series(body, metric)
        .into_iter()
        .filter(|l| l.contains(&g))
        .filter(|l| match gi {
            Some(i) => l.contains(&format!("GPU_I_ID=\"{i}\"")),
            None => !l.contains("GPU_I_ID="),
        })
        .collect()
}

fn pod_labels(ns: &str, pod: &str, container: &str) -> String {
    format!("container=\"{container}\",namespace=\"{ns}\",pod=\"{pod}\"")
}

const UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
// A MIG instance series (A100s have no profiling series without a DCGM source).
const MIG_SERIES: &str = "DCGM_FI_DEV_FB_USED";
const POD_INFO: &str = "gpu_exporter_gpu_pod_info";

// ---------------------------------------------------------------------------------------------
// Fixtures

#[test]
fn fixture_ids_are_the_sims_real_devices() {
    for (file, profile, id_type, entities) in [
        ("h100-seed1.toml", "8xH100-SXM", GpuIdType::Uid, 4),
        ("a100-mig-seed1.toml", "4xA100-80GB-MIG", GpuIdType::Uid, 5),
        (
            "gke-h100-seed1.toml",
            "8xH100-SXM",
            GpuIdType::DeviceName,
            2,
        ),
    ] {
        let a = Assignments::load(&fixture(file)).expect("fixture parses");
        let opts = MappingOptions {
            extra_resource_names: vec![],
            id_type,
            ..Default::default()
        };
        let m = mapping::attribution_from(&a.reply, &devices(profile), &opts);
        assert_eq!(m.unknown_devices, 0, "{file}: {:?}", m.unknown_examples);
        assert_eq!(m.attribution.holders.len(), entities, "{file}");
    }
}

#[test]
fn dra_fixture_names_are_the_sims_real_devices() {
    let a = Assignments::load(&fixture("a100-mig-dra-seed1.toml")).expect("fixture parses");
    let opts = MappingOptions {
        enable_dra: true,
        ..Default::default()
    };
    let m = mapping::attribution_from(&a.reply, &devices("4xA100-80GB-MIG"), &opts);
    assert_eq!(m.unknown_devices, 0, "{:?}", m.unknown_examples);
    // Everything resolves but the deliberate VFIO passthrough device.
    assert_eq!(
        m.dra_unresolved,
        std::collections::BTreeMap::from([("unrecognised_name", 1)]),
        "{:?}",
        m.dra_unresolved_examples
    );
    assert_eq!(m.dra_unresolved_examples, ["node-a/gpu-vfio-0"]);
    assert_eq!(m.attribution.holders.len(), 5);
}

// ---------------------------------------------------------------------------------------------
// Real socket, in-process fake kubelet

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_gpus_and_mig_instances_get_their_pod_labels() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let a = Assignments::load(&fixture("a100-mig-seed1.toml")).unwrap();
    let (server, _tx) = fake_kubelet(&sock, a.reply);
    let mut p = pipeline(
        "4xA100-80GB-MIG",
        client(&sock),
        false,
        RefresherOptions::default(),
    );
    p.body().await; // discovers devices, publishes the inventory
    assert_eq!(p.refresher.refresh_once().await, RefreshOutcome::Fresh);
    let body = p.body().await;

    // MIG instances (flex mode exports instances of MIG GPUs).
    let etl0 = lines_for(&body, MIG_SERIES, 0, Some(2));
    assert_eq!(etl0.len(), 1, "{body}");
    assert!(
        etl0[0].contains(&pod_labels("batch", "etl-0", "worker")),
        "{}",
        etl0[0]
    );
    assert!(lines_for(&body, MIG_SERIES, 0, Some(3))[0]
        .contains(&pod_labels("batch", "etl-1", "worker")));
    assert!(
        lines_for(&body, MIG_SERIES, 1, Some(0))[0].contains(&pod_labels(
            "ml",
            "finetune-0",
            "main"
        ))
    );
    // Unallocated instance: no pod labels.
    assert!(!lines_for(&body, MIG_SERIES, 0, Some(10))[0].contains("pod="));
    // Whole GPU with MIG disabled.
    let whole = lines_for(&body, UTIL, 3, None);
    assert_eq!(whole.len(), 1);
    assert!(
        whole[0].contains(&pod_labels("ml", "whole-gpu", "main")),
        "{}",
        whole[0]
    );
    // Shared MIG instance (two time-sliced replicas): unlabelled series + one info per holder.
    let shared = lines_for(&body, MIG_SERIES, 0, Some(9));
    assert_eq!(shared.len(), 1);
    assert!(!shared[0].contains("pod="), "{}", shared[0]);
    let info = lines_for(&body, POD_INFO, 0, Some(9));
    assert_eq!(info.len(), 2, "{body}");
    assert!(info[0].contains("pod=\"shell-a\"") && info[0].contains("vgpu=\"0\""));
    assert!(info[1].contains("pod=\"shell-b\"") && info[1].contains("vgpu=\"1\""));

    assert!(body.contains("gpu_exporter_pod_resources_up 1\n"));
    assert!(body.contains("gpu_exporter_pod_resources_allocated_entities 5\n"));
    assert!(body.contains("gpu_exporter_pod_resources_unknown_devices 0\n"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_slicing_with_four_replicas_keeps_device_series_and_lists_every_holder() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let a = Assignments::load(&fixture("h100-seed1.toml")).unwrap();
    let (server, _tx) = fake_kubelet(&sock, a.reply);

    // Default: GPU 3 is shared by four pods → one unlabelled series, four info series.
    let mut p = pipeline(
        "8xH100-SXM",
        client(&sock),
        false,
        RefresherOptions::default(),
    );
    p.body().await;
    p.refresher.refresh_once().await;
    let body = p.body().await;
    let util3 = lines_for(&body, UTIL, 3, None);
    assert_eq!(util3.len(), 1);
    assert!(!util3[0].contains("pod="), "{}", util3[0]);
    let info = lines_for(&body, POD_INFO, 3, None);
    assert_eq!(info.len(), 4, "{body}");
    for (i, l) in info.iter().enumerate() {
        let name = ["embed-a", "embed-b", "embed-c", "embed-d"][i];
        assert!(l.contains(&format!("pod=\"{name}\"")), "{l}");
        assert!(l.contains(&format!("vgpu=\"{i}\"")), "{l}");
        assert!(l.ends_with(" 1"), "{l}");
    }
    // One container holding two whole GPUs: both labelled.
    for g in [0, 1] {
        assert!(lines_for(&body, UTIL, g, None)[0].contains(&pod_labels(
            "ml",
            "llm-train-0",
            "trainer"
        )));
    }
    // The fpga resource of notebook-alice is ignored; its GPU is labelled.
    assert!(lines_for(&body, UTIL, 2, None)[0].contains(&pod_labels(
        "ml",
        "notebook-alice",
        "jupyter"
    )));
    assert!(!lines_for(&body, UTIL, 4, None)[0].contains("pod="));

    // --kubernetes-virtual-gpus: one copy per holder, with vgpu. As in dcgm-exporter 4.8.2+
    // (#594), GPU_UTIL and FB_USED keep the device-level series next to the copies; other
    // fields have no unlabelled copy.
    let mut v = pipeline(
        "8xH100-SXM",
        client(&sock),
        true,
        RefresherOptions::default(),
    );
    v.body().await;
    v.refresher.refresh_once().await;
    let body = v.body().await;
    let util = lines_for(&body, UTIL, 3, None);
    assert_eq!(util.len(), 5, "{body}");
    assert!(
        !util[0].contains("pod=") && !util[0].contains("vgpu="),
        "{}",
        util[0]
    );
    let temps = lines_for(&body, "DCGM_FI_DEV_GPU_TEMP", 3, None);
    assert_eq!(temps.len(), 4, "{body}");
    assert!(temps.iter().all(|l| l.contains("pod=")), "{temps:#?}");
    let copies = &util[1..];
    for (i, l) in copies.iter().enumerate() {
        assert!(l.contains(&format!("vgpu=\"{i}\"")), "{l}");
        assert!(l.contains("namespace=\"infer\""), "{l}");
    }
    // All four copies carry the device's value.
    let value = |l: &str| l.rsplit(' ').next().unwrap().to_owned();
    assert!(copies.iter().all(|l| value(l) == value(copies[0])));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_coming_and_going_between_refreshes_update_the_body() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let inv = devices("8xH100-SXM");
    let (g0, g1) = (inv[0].identity.uuid.clone(), inv[1].identity.uuid.clone());
    let (server, tx) = fake_kubelet(
        &sock,
        reply(vec![pod("ml", "job-a", "c", "nvidia.com/gpu", &[&g0])]),
    );
    let mut p = pipeline(
        "8xH100-SXM",
        client(&sock),
        false,
        RefresherOptions::default(),
    );
    p.body().await;
    p.refresher.refresh_once().await;
    let body = p.body().await;
    assert!(body.contains("pod=\"job-a\""));
    assert!(lines_for(&body, UTIL, 0, None)[0].contains("pod=\"job-a\""));

    // job-a leaves, job-b arrives on GPU 1.
    tx.send_replace(reply(vec![pod(
        "ml",
        "job-b",
        "c",
        "nvidia.com/gpu",
        &[&g1],
    )]));
    // Until the next refresh the sampler keeps the old attribution.
    assert!(p.body().await.contains("pod=\"job-a\""));
    p.refresher.refresh_once().await;
    let body = p.body().await;
    assert!(
        !body.contains("job-a"),
        "departed pod still present:\n{body}"
    );
    assert!(lines_for(&body, UTIL, 1, None)[0].contains("pod=\"job-b\""));
    assert!(!lines_for(&body, UTIL, 0, None)[0].contains("pod="));

    // Everyone leaves.
    tx.send_replace(reply(vec![]));
    p.refresher.refresh_once().await;
    let body = p.body().await;
    assert!(series(&body, POD_INFO).is_empty());
    assert!(!body.contains("pod=\""));
    assert!(body.contains("gpu_exporter_pod_resources_allocated_entities 0\n"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_pod_reply_maps_correctly_under_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let inv = devices("8xH100-SXM");
    let pods: Vec<PodResources> = (0..1000)
        .map(|i| {
            let gpu = &inv[i % 8].identity.uuid;
            let mut p = pod(
                &format!("team-{:02}", i % 37),
                &format!("inference-server-with-a-long-name-{i:04}"),
                "server",
                "nvidia.com/gpu",
                &[&format!("{gpu}::{}", i / 8)],
            );
            // Realistic noise: a CPU-pinned sidecar with a non-GPU device.
            p.containers.push(ContainerResources {
                name: "sidecar".into(),
                devices: vec![ContainerDevices {
                    resource_name: "example.com/nic".into(),
                    device_ids: vec![format!("nic-{i}")],
                    topology: None,
                }],
                cpu_ids: vec![(i % 64) as i64],
                ..Default::default()
            });
            p
        })
        .collect();
    let big = reply(pods);
    let size = big.encoded_len();
    assert!(size > 100_000 && size < MAX_REPLY_BYTES, "{size} bytes");
    let (server, _tx) = fake_kubelet(&sock, big);

    let mut p = pipeline(
        "8xH100-SXM",
        client(&sock),
        false,
        RefresherOptions::default(),
    );
    p.body().await;
    assert_eq!(p.refresher.refresh_once().await, RefreshOutcome::Fresh);
    let a = p.attribution.borrow().clone();
    assert_eq!(a.holders.len(), 8);
    for g in 0..8u32 {
        let h = a.holders_of(EntityKey {
            gpu: g,
            gi_id: None,
        });
        assert_eq!(h.len(), 125, "GPU {g}");
        assert!(h.windows(2).all(|w| w[0] < w[1]), "sorted, no duplicates");
    }
    let body = p.body().await;
    assert_eq!(series(&body, POD_INFO).len(), 1000);
    assert!(body.contains("gpu_exporter_pod_resources_unknown_devices 0\n"));
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Failures

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_socket_is_not_fatal_and_the_client_connects_once_it_appears() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let kubelet = client(&sock);
    let e = kubelet.list().await.unwrap_err();
    assert_eq!(e.reason(), "socket_missing", "{e}");
    assert!(e.to_string().contains(&*sock.to_string_lossy()), "{e}");
    assert!(e.hint().contains("hostPath"));

    let (server, _tx) = fake_kubelet(
        &sock,
        reply(vec![pod("a", "b", "c", "nvidia.com/gpu", &["GPU-x"])]),
    );
    let r = kubelet.list().await.expect("same client, now connected");
    assert_eq!(r.pod_resources.len(), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_kubelet_times_out_while_the_sampler_keeps_publishing() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let (calls_tx, mut calls) = mpsc::unbounded_channel();
    let server = serve(
        &sock,
        PodResourcesListerServer::new(Misbehaving::Hang(calls_tx)),
    );
    let resolver = KubeletPodResources::new(&sock, Duration::from_millis(300)).unwrap();
    let mut p = pipeline("8xH100-SXM", resolver, false, RefresherOptions::default());
    p.body().await;

    let mut refresher = p.refresher;
    let pending = tokio::spawn(async move {
        let outcome = refresher.refresh_once().await;
        (outcome, refresher)
    });
    calls.recv().await.expect("the kubelet got the call");
    // While the call hangs, samples complete and carry the GPU series.
    for _ in 0..3 {
        let p2 = p.sampler.tick().await;
        let body = std::str::from_utf8(&p2.body).unwrap();
        assert_eq!(series(body, UTIL).len(), 8);
    }
    let (outcome, _refresher) = pending.await.unwrap();
    assert_eq!(outcome, RefreshOutcome::Dropped { reason: "timeout" });
    let state = p.metrics.pod_resources.state();
    assert!(!state.health.up);
    assert_eq!(state.health.errors.get("timeout"), Some(&1));
    let body = String::from_utf8(p.sampler.tick().await.body.to_vec()).unwrap();
    assert!(body.contains("gpu_exporter_pod_resources_up 0\n"));
    assert!(body.contains("gpu_exporter_pod_resources_errors_total{reason=\"timeout\"} 1\n"));
    assert_eq!(series(&body, UTIL).len(), 8);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_replies_are_classified() {
    let dir = tempfile::tempdir().unwrap();
    for (code, msg, reason) in [
        (
            tonic::Code::ResourceExhausted,
            "rejected by rate limit",
            "rate_limited",
        ),
        (tonic::Code::Unimplemented, "unknown method", "rejected"),
        (tonic::Code::PermissionDenied, "no", "rejected"),
    ] {
        let sock = dir.path().join(format!("{reason}.sock"));
        let server = serve(
            &sock,
            PodResourcesListerServer::new(Misbehaving::Fail(code, msg)),
        );
        let e = client(&sock).list().await.unwrap_err();
        assert_eq!(e.reason(), reason, "{code:?}: {e}");
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_reply_is_reported_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let server = serve(&sock, Malformed);
    let e = client(&sock).list().await.unwrap_err();
    assert!(matches!(e, AttributionError::Malformed { .. }), "{e:?}");
    assert_eq!(e.reason(), "malformed");
    let chain = gpu_exporter::error_chain(&e);
    assert!(chain.contains("decode"), "{chain}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_reply_is_refused_and_the_next_good_one_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let inv = devices("8xH100-SXM");
    let long = "x".repeat(1024);
    let ids: Vec<String> = (0..17 * 1024).map(|i| format!("{long}-{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let huge = reply(vec![pod("a", "huge", "c", "example.com/blob", &ids)]);
    assert!(huge.encoded_len() > MAX_REPLY_BYTES);
    let (server, tx) = fake_kubelet(&sock, huge);

    let mut p = pipeline(
        "8xH100-SXM",
        client(&sock),
        false,
        RefresherOptions::default(),
    );
    p.body().await;
    assert_eq!(
        p.refresher.refresh_once().await,
        RefreshOutcome::Dropped {
            reason: "too_large"
        }
    );
    tx.send_replace(reply(vec![pod(
        "ml",
        "fine",
        "c",
        "nvidia.com/gpu",
        &[&inv[5].identity.uuid],
    )]));
    assert_eq!(p.refresher.refresh_once().await, RefreshOutcome::Fresh);
    let body = p.body().await;
    assert!(lines_for(&body, UTIL, 5, None)[0].contains("pod=\"fine\""));
    assert!(body.contains("gpu_exporter_pod_resources_errors_total{reason=\"too_large\"} 1\n"));
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The fake-kubelet binary, end to end

/// A running `fake-kubelet`; killed on drop.
struct FakeKubeletProcess {
    child: Child,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl FakeKubeletProcess {
    /// Starts the binary and waits for its readiness line.
    fn start(socket: &Path, assignments: &Path) -> Self {
        let mut child = Command::new(common::fake_kubelet_bin::fake_kubelet_bin())
            .arg("--socket")
            .arg(socket)
            .arg("--assignments")
            .arg(assignments)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("NO_COLOR", "1")
            .spawn()
            .expect("spawn fake-kubelet");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .expect("readiness line");
        assert!(first.starts_with("fake-kubelet: serving"), "{first:?}");
        let (tx, stderr) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, stderr }
    }

    /// Waits for a stderr line containing `needle`.
    fn wait_for_log(&self, needle: &str) -> String {
        loop {
            let line = self
                .stderr
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no log line containing {needle:?}"));
            if line.contains(needle) {
                return line;
            }
        }
    }

    fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }
}

impl Drop for FakeKubeletProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Replaces `path`'s content in one step (a new file renamed over it), as a ConfigMap update does.
/// fake-kubelet also reloads by itself when the modification time changes; a truncate-then-write
/// could be read empty in between and reloaded as zero pods, logging the "assignments reloaded"
/// the tests wait for before the new text is there.
fn replace_file(path: &Path, text: &str) {
    let new = path.with_extension("new");
    std::fs::write(&new, text).unwrap();
    std::fs::rename(&new, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_kubelet_binary_killed_and_restarted_labels_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let file = dir.path().join("assignments.toml");
    std::fs::copy(fixture("h100-seed1.toml"), &file).unwrap();
    let fake = FakeKubeletProcess::start(&sock, &file);

    let opts = RefresherOptions {
        refresh: Duration::from_secs(10),
        ttl: Duration::from_secs(3600),
        ..Default::default()
    };
    let mut p = pipeline("8xH100-SXM", client(&sock), false, opts);
    p.body().await;
    assert_eq!(p.refresher.refresh_once().await, RefreshOutcome::Fresh);
    let labelled = pod_labels("ml", "notebook-alice", "jupyter");
    assert!(lines_for(&p.body().await, UTIL, 2, None)[0].contains(&labelled));

    // Reload on SIGHUP: notebook-alice moves to GPU 6.
    let text = std::fs::read_to_string(&file).unwrap().replace(
        &devices("8xH100-SXM")[2].identity.uuid,
        &devices("8xH100-SXM")[6].identity.uuid,
    );
    replace_file(&file, &text);
    let pid = fake.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    fake.wait_for_log("assignments reloaded");
    p.refresher.refresh_once().await;
    let body = p.body().await;
    assert!(lines_for(&body, UTIL, 6, None)[0].contains(&labelled));
    assert!(!lines_for(&body, UTIL, 2, None)[0].contains("pod="));

    // SIGKILL: the socket file stays behind with nobody listening.
    fake.kill();
    let outcome = p.refresher.refresh_once().await;
    assert!(
        matches!(outcome, RefreshOutcome::Kept { .. }),
        "{outcome:?}"
    );
    let state = p.metrics.pod_resources.state();
    assert!(!state.health.up);
    assert_eq!(
        state.health.errors.values().sum::<u64>(),
        1,
        "{:?}",
        state.health.errors
    );
    assert!(
        state.health.errors.contains_key("unavailable")
            || state.health.errors.contains_key("socket_missing"),
        "{:?}",
        state.health.errors
    );
    // Within the TTL the last answer stays in use.
    let body = p.body().await;
    assert!(lines_for(&body, UTIL, 6, None)[0].contains(&labelled));
    assert!(body.contains("gpu_exporter_pod_resources_up 0\n"));

    // Restarted on the same path: the same client reconnects by itself.
    let fake = FakeKubeletProcess::start(&sock, &file);
    assert_eq!(p.refresher.refresh_once().await, RefreshOutcome::Fresh);
    let body = p.body().await;
    assert!(lines_for(&body, UTIL, 6, None)[0].contains(&labelled));
    assert!(body.contains("gpu_exporter_pod_resources_up 1\n"));
    drop(fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gke_device_names_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let _fake = FakeKubeletProcess::start(&sock, &fixture("gke-h100-seed1.toml"));
    let opts = RefresherOptions {
        mapping: MappingOptions {
            extra_resource_names: vec![],
            id_type: GpuIdType::DeviceName,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut p = pipeline("8xH100-SXM", client(&sock), false, opts);
    p.body().await;
    p.refresher.refresh_once().await;
    let body = p.body().await;
    assert!(lines_for(&body, UTIL, 0, None)[0].contains(&pod_labels("ml", "trainer", "main")));
    assert!(!lines_for(&body, UTIL, 1, None)[0].contains("pod="));
    assert_eq!(lines_for(&body, POD_INFO, 1, None).len(), 2);
}

/// The `dra_*` labels of a DRA allocation (MIG instances add their profile and UUID).
fn dra_labels(claim_ns: &str, claim: &str, device: &str, mig: Option<(&str, &str)>) -> String {
    let mut s = format!(
        "dra_claim_name=\"{claim}\",dra_claim_namespace=\"{claim_ns}\",dra_device_name=\"{device}\",dra_driver_name=\"gpu.nvidia.com\","
    );
    if let Some((uuid, profile)) = mig {
        s.push_str(&format!(
            "dra_mig_device_uuid=\"{uuid}\",dra_mig_profile=\"{profile}\","
        ));
    }
    s.push_str("dra_pool_name=\"node-a\"");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_allocations_through_the_binary_are_attributed_and_unresolvable_ones_counted() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let file = dir.path().join("assignments.toml");
    std::fs::copy(fixture("a100-mig-dra-seed1.toml"), &file).unwrap();
    let fake = FakeKubeletProcess::start(&sock, &file);
    let opts = RefresherOptions {
        mapping: MappingOptions {
            enable_dra: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut p = pipeline("4xA100-80GB-MIG", client(&sock), false, opts);
    let before = p.body().await;
    assert_eq!(p.refresher.refresh_once().await, RefreshOutcome::Fresh);
    let body = p.body().await;
    let inv = devices("4xA100-80GB-MIG");

    // A whole GPU allocated through DRA.
    let whole = lines_for(&body, UTIL, 3, None);
    assert_eq!(whole.len(), 1, "{whole:#?}");
    assert!(
        whole[0].contains(&format!(
            "container=\"main\",{},namespace=\"ml\",pod=\"dra-trainer\"}}",
            dra_labels("ml", "dra-trainer-gpu", "gpu-3", None)
        )),
        "{}",
        whole[0]
    );
    // A MIG instance, with its profile and MIG UUID.
    let mig = &inv[0].instances.iter().find(|i| i.gi_id == 2).unwrap().uuid;
    let etl = lines_for(&body, MIG_SERIES, 0, Some(2));
    assert_eq!(etl.len(), 1);
    assert!(
        etl[0].contains(&format!(
            "container=\"worker\",{},namespace=\"batch\",pod=\"dra-etl\"}}",
            dra_labels(
                "batch",
                "etl-mig",
                "gpu-0-mig-3g40gb-9-4",
                Some((mig, "3g.40gb"))
            )
        )),
        "{}",
        etl[0]
    );
    // A claim shared by two pods: a copy each. The older driver's names resolve too.
    let shared = lines_for(&body, MIG_SERIES, 0, Some(9));
    assert_eq!(shared.len(), 2, "{shared:#?}");
    assert!(shared[0].contains("pod=\"shell-a\"") && shared[1].contains("pod=\"shell-b\""));
    assert!(
        lines_for(&body, MIG_SERIES, 2, Some(1))[0].contains("dra_device_name=\"gpu-2-mig-5-0-4\"")
    );
    // The device-plugin holder next to them keeps its plain labels.
    let finetune = lines_for(&body, MIG_SERIES, 1, Some(0));
    assert!(finetune[0].contains(&pod_labels("ml", "finetune-0", "main")));
    assert!(!finetune[0].contains("dra_"));
    // Unallocated instances and every other series are as before attribution.
    assert!(!lines_for(&body, MIG_SERIES, 0, Some(3))[0].contains("pod="));
    assert_eq!(
        series(&body, "DCGM_FI_DEV_FB_USED").len(),
        series(&before, "DCGM_FI_DEV_FB_USED").len() + 1,
        "one more series: the second holder of the shared claim"
    );
    // The VFIO device is counted and skipped.
    assert!(body.contains(
        "gpu_exporter_pod_resources_dra_unresolved_devices{reason=\"unrecognised_name\"} 1\n"
    ));
    assert!(
        body.contains("gpu_exporter_pod_resources_dra_unresolved_devices{reason=\"no_match\"} 0\n")
    );
    assert!(body.contains("gpu_exporter_pod_resources_allocated_entities 5\n"));

    // A MIG device the GPU does not have (e.g. created after the last discovery): counted,
    // skipped, and every other attribution stays.
    let mut text = std::fs::read_to_string(&file).unwrap();
    text.push_str("\n[[assignment]]\nnamespace = \"ml\"\npod = \"late\"\ncontainer = \"c\"\nclaim = \"late\"\npool = \"node-a\"\ndevices = [\"gpu-0-mig-1g10gb-19-5\"]\n");
    replace_file(&file, &text);
    let pid = fake.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    fake.wait_for_log("assignments reloaded");
    assert_eq!(p.refresher.refresh_once().await, RefreshOutcome::Fresh);
    let after = p.body().await;
    assert!(after
        .contains("gpu_exporter_pod_resources_dra_unresolved_devices{reason=\"no_match\"} 1\n"));
    assert!(!after.contains("pod=\"late\""));
    assert_eq!(
        series(&after, "DCGM_FI_DEV_FB_USED").len(),
        series(&body, "DCGM_FI_DEV_FB_USED").len()
    );
    assert!(lines_for(&after, UTIL, 3, None)[0].contains("pod=\"dra-trainer\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_dra_flag_dra_allocations_get_no_labels() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    let _fake = FakeKubeletProcess::start(&sock, &fixture("a100-mig-dra-seed1.toml"));
    let mut p = pipeline(
        "4xA100-80GB-MIG",
        client(&sock),
        false,
        RefresherOptions::default(),
    );
    p.body().await;
    assert_eq!(p.refresher.refresh_once().await, RefreshOutcome::Fresh);
    let body = p.body().await;
    assert!(!body.contains("dra_"), "no dra_ label nor DRA self-metric");
    assert!(!lines_for(&body, UTIL, 3, None)[0].contains("pod="));
    // The device-plugin holder is attributed as always.
    assert!(
        lines_for(&body, MIG_SERIES, 1, Some(0))[0].contains(&pod_labels(
            "ml",
            "finetune-0",
            "main"
        ))
    );
    assert!(body.contains("gpu_exporter_pod_resources_allocated_entities 1\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_mode_body_passes_promtool() {
    if !common::promtool_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kubelet.sock");
    // Device-plugin and DRA allocations, and the DRA self-metric.
    let a = Assignments::load(&fixture("a100-mig-dra-seed1.toml")).unwrap();
    let (server, _tx) = fake_kubelet(&sock, a.reply);
    let opts = RefresherOptions {
        mapping: MappingOptions {
            enable_dra: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut p = pipeline("4xA100-80GB-MIG", client(&sock), false, opts);
    p.body().await;
    p.refresher.refresh_once().await;
    let body = p.body().await;
    assert!(body.contains("gpu_exporter_pod_resources_errors_total"));
    assert!(body.contains("gpu_exporter_pod_resources_dra_unresolved_devices{"));
    assert!(body.contains("dra_mig_device_uuid="));
    let (_, findings) = common::promtool_check(&body);
    // DCGM_* names carry findings inherent to dcgm-exporter's contract (see tests/promtool.rs);
    // anything else is ours and must be clean.
    let ours: Vec<&String> = findings
        .iter()
        .filter(|l| !l.starts_with("DCGM_"))
        .collect();
    assert!(
        ours.is_empty(),
        "promtool findings on gpu_exporter_* series: {ours:?}"
    );
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Cadence, backoff, TTL and inventory: paused time, in-memory resolver (no I/O)

/// Answers from a script, then with `default`; reports the (virtual) time of each call.
struct Scripted {
    script: Mutex<VecDeque<Result<ListPodResourcesResponse, AttributionError>>>,
    default: ListPodResourcesResponse,
    calls: mpsc::UnboundedSender<Instant>,
}

impl Scripted {
    fn new(
        script: Vec<Result<ListPodResourcesResponse, AttributionError>>,
        default: ListPodResourcesResponse,
    ) -> (Self, mpsc::UnboundedReceiver<Instant>) {
        let (calls, rx) = mpsc::unbounded_channel();
        (
            Self {
                script: Mutex::new(script.into()),
                default,
                calls,
            },
            rx,
        )
    }
}

impl PodResolver for Scripted {
    fn origin(&self) -> String {
        "scripted".into()
    }
    async fn list(&self) -> Result<ListPodResourcesResponse, AttributionError> {
        let _ = self.calls.send(Instant::now());
        let next = self.script.lock().unwrap().pop_front();
        next.unwrap_or_else(|| Ok(self.default.clone()))
    }
}

fn down() -> Result<ListPodResourcesResponse, AttributionError> {
    Err(AttributionError::Unavailable {
        path: "/x.sock".into(),
        cause: "connection refused".into(),
    })
}

#[tokio::test(start_paused = true)]
async fn list_runs_on_its_own_cadence_and_backs_off_after_failures() {
    let (resolver, mut calls) = Scripted::new(
        vec![Ok(reply(vec![])), Ok(reply(vec![])), down(), down(), down()],
        reply(vec![]),
    );
    let (_inv_tx, inv_rx) = watch::channel(Arc::new(Vec::new()));
    let (tx, _rx) = watch::channel(Arc::new(Attribution::default()));
    let refresher = Refresher::new(
        resolver,
        inv_rx,
        tx,
        Arc::new(PodResourcesMetrics::default()),
        RefresherOptions::default(),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(refresher.run(stop.clone()));
    let mut at = Vec::new();
    for _ in 0..8 {
        at.push(calls.recv().await.unwrap());
    }
    stop.cancel();
    task.await.unwrap();
    let gaps: Vec<u64> = at
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis() as u64)
        .collect();
    // ok → 10 s → ok → 10 s → fail → 0.5 s → fail → 1 s → fail → 2 s → ok → 10 s → ok → 10 s
    assert_eq!(gaps, [10_000, 10_000, 500, 1_000, 2_000, 10_000, 10_000]);
}

#[tokio::test(start_paused = true)]
async fn last_good_answer_is_kept_until_the_ttl_then_labels_are_dropped() {
    let inv = devices("8xH100-SXM");
    let good = reply(vec![pod(
        "ml",
        "p",
        "c",
        "nvidia.com/gpu",
        &[&inv[0].identity.uuid],
    )]);
    let (resolver, _calls) = Scripted::new(vec![Ok(good.clone()), down(), down(), down()], good);
    let (_inv_tx, inv_rx) = watch::channel(Arc::new(inv));
    let (tx, rx) = watch::channel(Arc::new(Attribution::default()));
    let metrics = Arc::new(PodResourcesMetrics::default());
    let mut r = Refresher::new(
        resolver,
        inv_rx,
        tx,
        Arc::clone(&metrics),
        RefresherOptions::default(),
    );
    let key = EntityKey {
        gpu: 0,
        gi_id: None,
    };

    assert_eq!(r.refresh_once().await, RefreshOutcome::Fresh);
    assert_eq!(rx.borrow().holders_of(key).len(), 1);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        r.refresh_once().await,
        RefreshOutcome::Kept {
            age: Duration::from_secs(10)
        }
    );
    assert_eq!(rx.borrow().holders_of(key).len(), 1, "kept within the TTL");
    tokio::time::advance(Duration::from_secs(19)).await;
    assert!(matches!(
        r.refresh_once().await,
        RefreshOutcome::Kept { .. }
    ));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        r.refresh_once().await,
        RefreshOutcome::Dropped {
            reason: "unavailable"
        }
    );
    assert!(
        rx.borrow().holders.is_empty(),
        "labels dropped after the TTL"
    );
    let s = metrics.state();
    assert_eq!(s.health.errors.get("unavailable"), Some(&3));
    assert_eq!(s.allocated_entities, 0);
    // The kubelet answers again: labels are back.
    assert_eq!(r.refresh_once().await, RefreshOutcome::Fresh);
    assert_eq!(rx.borrow().holders_of(key).len(), 1);
    assert!(metrics.state().health.up);
}

#[tokio::test(start_paused = true)]
async fn a_reply_seen_before_the_inventory_is_mapped_again_when_devices_arrive() {
    let inv = devices("4xA100-80GB-MIG");
    let mig = inv[2].instances[1].uuid.clone();
    let good = reply(vec![pod("ml", "m", "c", "nvidia.com/mig-3g.40gb", &[&mig])]);
    let (resolver, mut calls) = Scripted::new(vec![], good);
    let (inv_tx, inv_rx) = watch::channel(Arc::new(Vec::new()));
    let (tx, mut rx) = watch::channel(Arc::new(Attribution::default()));
    let metrics = Arc::new(PodResourcesMetrics::default());
    let refresher = Refresher::new(
        resolver,
        inv_rx,
        tx,
        Arc::clone(&metrics),
        RefresherOptions::default(),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(refresher.run(stop.clone()));
    calls.recv().await.unwrap();
    assert!(rx.borrow_and_update().holders.is_empty());
    inv_tx.send_replace(Arc::new(inv));
    rx.changed().await.unwrap();
    let want = EntityKey {
        gpu: 2,
        gi_id: Some(inv_tx.borrow()[2].instances[1].gi_id),
    };
    assert_eq!(rx.borrow().holders_of(want).len(), 1);
    assert_eq!(metrics.state().unknown_devices, 0);
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn one_container_with_two_replicas_of_a_gpu_is_a_single_holder() {
    let inv = devices("8xH100-SXM");
    let g0 = &inv[0].identity.uuid;
    let two = reply(vec![pod(
        "ml",
        "greedy",
        "c",
        "nvidia.com/gpu",
        &[&format!("{g0}::0"), &format!("{g0}::1")],
    )]);
    let (resolver, _calls) = Scripted::new(vec![], two);
    let mut p = pipeline("8xH100-SXM", resolver, false, RefresherOptions::default());
    p.body().await;
    p.refresher.refresh_once().await;
    let body = p.body().await;
    let util0 = lines_for(&body, UTIL, 0, None);
    assert_eq!(util0.len(), 1);
    assert!(
        util0[0].contains(&pod_labels("ml", "greedy", "c")),
        "{}",
        util0[0]
    );
    assert_eq!(lines_for(&body, POD_INFO, 0, None).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn each_problem_is_logged_once_with_its_fix() {
    let (logs, _guard) = LogBuf::capture(tracing::Level::INFO);

    let missing = || {
        Err(AttributionError::SocketMissing {
            path: "/var/lib/kubelet/pod-resources/kubelet.sock".into(),
        })
    };
    let (resolver, _calls) = Scripted::new(
        vec![
            missing(),
            missing(),
            missing(),
            Ok(reply(vec![])),
            down(),
            down(),
        ],
        reply(vec![]),
    );
    let (_inv_tx, inv_rx) = watch::channel(Arc::new(Vec::new()));
    let (tx, _rx) = watch::channel(Arc::new(Attribution::default()));
    let mut r = Refresher::new(
        resolver,
        inv_rx,
        tx,
        Arc::new(PodResourcesMetrics::default()),
        RefresherOptions::default(),
    );
    for _ in 0..3 {
        r.refresh_once().await;
    }
    assert_eq!(logs.count("pod attribution unavailable"), 1);
    // Logged under the task's own module (the target a log filter names).
    assert_eq!(
        logs.count("gpu_exporter::pods::refresher: pod attribution unavailable"),
        1
    );
    assert_eq!(logs.count("hostPath"), 1);
    r.refresh_once().await;
    assert_eq!(logs.count("answering again"), 1);
    r.refresh_once().await;
    r.refresh_once().await;
    assert_eq!(logs.count("pod attribution unavailable"), 2);
    assert_eq!(logs.count("reason=\"unavailable\""), 1);
}
