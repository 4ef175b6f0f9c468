//! The sampling loop under paused time: ticks publish on the interval, a failing field or device
//! removes only its own series and is counted, lost GPUs come back, re-discovery notices a vanished
//! GPU, and a reloaded catalog takes effect on the next tick. At the default 30 s interval with
//! the real kubelet refresher (an in-memory resolver): the first sample waits for the kubelet's
//! first answer (at most its call timeout), and a pod change is published within one refresh
//! without reading the GPUs again.

mod common;

use common::logs::LogBuf;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::SelfMetrics;
use gpu_exporter::catalog::{self, Field};
use gpu_exporter::gpu::sim::scenario;
use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::gpu::{
    Device, DeviceSample, FieldError, FieldGap, GpuSource, SourceError, XidEvent,
};
use gpu_exporter::pods::proto::ListPodResourcesResponse;
use gpu_exporter::pods::refresher::{Refresher, RefresherOptions};
use gpu_exporter::pods::{Attribution, AttributionError, PodResolver};
use gpu_exporter::sampler::{Published, Sampler, SamplerOptions};
use gpu_exporter_testing::fake_kubelet::Assignments;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Wraps the sim to inject failures.
struct Faulty {
    inner: SimulatedSource,
    fail_field: Option<(u32, Field)>,
    fail_device: Option<u32>,
    hide_gpu: Option<(u32, Arc<AtomicBool>)>,
}

impl GpuSource for Faulty {
    fn name(&self) -> &'static str {
        "faulty"
    }
    fn supports(&self, field: Field) -> bool {
        self.inner.supports(field)
    }
    fn field_gap(&self, device: &Device, field: Field) -> Option<FieldGap> {
        self.inner.field_gap(device, field)
    }
    fn devices(&self) -> Result<Vec<Device>, SourceError> {
        let mut d = self.inner.devices()?;
        if let Some((i, hidden)) = &self.hide_gpu {
            if hidden.load(Ordering::SeqCst) {
                d.retain(|d| d.identity.index != *i);
            }
        }
        Ok(d)
    }
    fn sample(&self, device: &Device, fields: &[Field]) -> Result<DeviceSample, SourceError> {
        if self.fail_device == Some(device.identity.index) {
            return Err(SourceError::Device {
                index: device.identity.index,
                uuid: device.identity.uuid.clone(),
                cause: "injected".into(),
            });
        }
        let mut s = self.inner.sample(device, fields)?;
        if let Some((i, f)) = self.fail_field {
            if i == device.identity.index {
                for (field, r) in &mut s.readings {
                    if *field == f {
                        *r = Err(FieldError::Failed);
                    }
                }
            }
        }
        Ok(s)
    }
    fn drain_xids(&self) -> Vec<(String, XidEvent)> {
        self.inner.drain_xids()
    }
}

fn faulty() -> Faulty {
    Faulty {
        inner: common::sim("8xH100-SXM", None),
        fail_field: None,
        fail_device: None,
        hide_gpu: None,
    }
}

fn body_of(p: &Arc<gpu_exporter::sampler::Published>) -> String {
    String::from_utf8(p.body.to_vec()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn run_publishes_once_per_interval() {
    let h = common::harness(
        common::sim("1xA100-40GB", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    let (tx, mut rx) = watch::channel(None);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(h.sampler.run(tx, shutdown.clone()));
    let mut times = Vec::new();
    for _ in 0..4 {
        rx.changed().await.unwrap();
        let p = rx.borrow_and_update().clone().unwrap();
        times.push(p.at);
    }
    shutdown.cancel();
    task.await.unwrap();
    for w in times.windows(2) {
        assert_eq!(w[1] - w[0], common::INTERVAL);
    }
    let last = rx.borrow().clone().unwrap();
    assert!(body_of(&last).contains("gpu_exporter_samples_total 4\n"));
}

#[tokio::test(start_paused = true)]
async fn exporter_metrics_are_read_at_the_tick_and_published_compressed_with_the_sample() {
    use std::io::Read as _;
    // Issue 35 item 13: --enable-exporter-metrics read /proc at every scrape, on the async
    // workers, and the first scrape of a sample gzipped it. Now the sampler reads /proc at its
    // tick and publishes the body with its gzipped copy.
    let h = common::harness(
        common::sim("1xA100-40GB", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    let mut sampler = h.sampler.with_exporter_metrics();
    let p = sampler.tick().await;
    let body = body_of(&p);
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        assert_eq!(common::series(&body, name).len(), 1, "{name}: {body}");
    }
    // After the self-metrics, as the scrape appended them before.
    let own = body.find("\n# HELP process_").expect("process_* families");
    assert!(body[..own].contains("gpu_exporter_samples_total 1\n"));
    assert!(!body[own..].contains("gpu_exporter_"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(&p.gzip_body()[..])
        .read_to_string(&mut text)
        .expect("one gzip member");
    assert_eq!(text, body);
    // Without the option: no process_* series.
    let mut h = common::harness(
        common::sim("1xA100-40GB", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    assert!(!body_of(&h.sampler.tick().await).contains("\nprocess_"));
}

#[tokio::test(start_paused = true)]
async fn a_failing_field_removes_only_its_series_and_is_counted() {
    let mut src = faulty();
    src.fail_field = Some((2, Field::FbUsed));
    let mut h = common::harness(src, common::shipped_catalog(), common::build_options());
    let body = body_of(&h.sampler.tick().await);
    let fb = common::series(&body, "DCGM_FI_DEV_FB_USED");
    assert_eq!(fb.len(), 7);
    assert!(!fb.iter().any(|l| l.contains("gpu=\"2\"")));
    assert_eq!(common::series(&body, "DCGM_FI_DEV_FB_FREE").len(), 8);
    assert!(
        body.contains(
            "gpu_exporter_field_errors_total{field=\"DCGM_FI_DEV_FB_USED\",reason=\"failed\"} 1\n"
        ),
        "{body}"
    );
    let body = body_of(&h.sampler.tick().await);
    assert!(body.contains(
        "gpu_exporter_field_errors_total{field=\"DCGM_FI_DEV_FB_USED\",reason=\"failed\"} 2\n"
    ));
}

#[tokio::test(start_paused = true)]
async fn an_unreadable_device_removes_only_its_own_series() {
    let mut src = faulty();
    src.fail_device = Some(5);
    let mut h = common::harness(src, common::shipped_catalog(), common::build_options());
    let body = body_of(&h.sampler.tick().await);
    let temps = common::series(&body, "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temps.len(), 7);
    assert!(!temps.iter().any(|l| l.contains("gpu=\"5\"")));
    assert!(body.contains("gpu_exporter_sample_errors_total{reason=\"device_error\"} 1\n"));
    assert!(body.contains("gpu_exporter_gpus{state=\"unreadable\"} 1\n"));
    assert!(body.contains("gpu_exporter_gpus{state=\"healthy\"} 7\n"));
}

#[tokio::test(start_paused = true)]
async fn a_gpu_that_falls_off_the_bus_fails_health_and_comes_back() {
    let sc = scenario::parse(
        "[[event]]\nat = \"10s\"\ngpu = 4\naction = \"fall-off-bus\"\n[[event]]\nat = \"30s\"\ngpu = 4\naction = \"recover\"\n",
        "t.toml",
    )
    .unwrap();
    let src = common::sim("8xH100-SXM", Some((sc, "t.toml".into())));
    let mut h = common::harness(src, common::shipped_catalog(), common::build_options());
    let t0 = body_of(&h.sampler.tick().await);
    assert_eq!(common::series(&t0, "DCGM_FI_DEV_GPU_UTIL").len(), 8);
    let t1 = body_of(&h.sampler.tick().await);
    let util = common::series(&t1, "DCGM_FI_DEV_GPU_UTIL");
    assert_eq!(util.len(), 7, "the lost GPU's series go, the others stay");
    assert!(t1.contains("gpu_exporter_gpus{state=\"lost\"} 1\n"));
    let health: Vec<&str> = common::series(&t1, "DCGM_EXP_GPU_HEALTH_STATUS")
        .into_iter()
        .filter(|l| l.contains("gpu=\"4\"") && l.contains("health_watch=\"ALL\""))
        .collect();
    assert_eq!(health.len(), 1);
    assert!(
        health[0].contains("health_error_code=\"DCGM_FR_FALLEN_OFF_BUS\"")
            && health[0].ends_with(" 20")
    );
    let xid: Vec<&str> = common::series(&t1, "DCGM_FI_DEV_XID_ERRORS")
        .into_iter()
        .filter(|l| l.contains("gpu=\"4\""))
        .collect();
    assert!(xid[0].ends_with(" 79") && xid[0].contains("err_msg=\"GPU has fallen off the bus\""));
    h.sampler.tick().await;
    let t3 = body_of(&h.sampler.tick().await);
    assert_eq!(
        common::series(&t3, "DCGM_FI_DEV_GPU_UTIL").len(),
        8,
        "recovered GPU is back"
    );
    assert!(t3.contains("gpu_exporter_gpus{state=\"lost\"} 0\n"));
}

#[tokio::test(start_paused = true)]
async fn rediscovery_notices_a_vanished_gpu() {
    let hidden = Arc::new(AtomicBool::new(false));
    let mut src = faulty();
    src.hide_gpu = Some((7, Arc::clone(&hidden)));
    let mut h = common::harness(src, common::shipped_catalog(), common::build_options());
    let before = body_of(&h.sampler.tick().await);
    assert_eq!(common::series(&before, "DCGM_FI_DEV_GPU_TEMP").len(), 8);
    hidden.store(true, Ordering::SeqCst);
    // Not yet due: the old device list is kept.
    tokio::time::advance(Duration::from_secs(30)).await;
    let mid = body_of(&h.sampler.tick().await);
    assert_eq!(common::series(&mid, "DCGM_FI_DEV_GPU_TEMP").len(), 8);
    tokio::time::advance(Duration::from_secs(31)).await;
    let after = body_of(&h.sampler.tick().await);
    assert_eq!(common::series(&after, "DCGM_FI_DEV_GPU_TEMP").len(), 7);
    assert!(!after.contains("gpu=\"7\""));
}

#[tokio::test(start_paused = true)]
async fn when_the_selected_gpu_vanishes_the_exporter_degrades_to_not_ready_and_recovers() {
    let hidden = Arc::new(AtomicBool::new(false));
    let mut src = faulty();
    src.hide_gpu = Some((7, Arc::clone(&hidden)));
    let mut opts = common::build_options();
    opts.selection = gpu_exporter::snapshot::DeviceSelection::Gpus(Some(vec![7]));
    let mut h = common::harness(src, common::shipped_catalog(), opts);
    let before = h.sampler.tick().await;
    assert_eq!(before.not_ready, None);
    assert_eq!(
        common::series(&body_of(&before), "DCGM_FI_DEV_GPU_TEMP").len(),
        1
    );
    // GPU 7 falls off: the process keeps running, /ready says why.
    hidden.store(true, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(61)).await;
    let gone = h.sampler.tick().await;
    assert_eq!(
        gone.not_ready.as_deref(),
        Some("-d/--devices \"g:7\" selects none of the 7 GPUs (indices 0, 1, 2, 3, 4, 5, 6) and 0 MIG instances found, so no GPU series would be exported")
    );
    // It comes back: ready again.
    hidden.store(false, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(61)).await;
    let back = h.sampler.tick().await;
    assert_eq!(back.not_ready, None);
    assert_eq!(
        common::series(&body_of(&back), "DCGM_FI_DEV_GPU_TEMP").len(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_catalog_takes_effect_on_the_next_tick() {
    let mut h = common::harness(
        common::sim("1xA100-40GB", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    let before = body_of(&h.sampler.tick().await);
    assert!(before.contains("DCGM_FI_DEV_SM_CLOCK{"));
    let (small, _) = catalog::parse("DCGM_FI_DEV_GPU_TEMP, gauge, temp\n", "new.csv").unwrap();
    h.catalog_tx.send_replace(Arc::new(small));
    let after = body_of(&h.sampler.tick().await);
    assert!(!after.contains("DCGM_FI_DEV_SM_CLOCK"));
    assert_eq!(common::series(&after, "DCGM_FI_DEV_GPU_TEMP").len(), 1);
    // The label-type field is gone too, since the new CSV does not ask for it.
    assert!(!after.contains("DCGM_FI_DRIVER_VERSION="));
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_body() {
    let mut a = common::harness(
        common::sim("4xA100-80GB-MIG", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    let mut b = common::harness(
        common::sim("4xA100-80GB-MIG", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    for _ in 0..3 {
        let x = common::normalise(&a.sampler.tick().await.body);
        let y = common::normalise(&b.sampler.tick().await.body);
        assert_eq!(x, y);
    }
}

// ---------------------------------------------------------------------------------------------
// Attribution from the first sample, and changes between samples

/// dcgm-exporter's and our default collect interval.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// The default kubelet call timeout (`--pod-resources-timeout`).
const KUBELET_TIMEOUT: Duration = Duration::from_secs(5);

/// The simulated fleet, counting GPU reads (one `sample` call per device and tick).
struct Counting {
    inner: SimulatedSource,
    reads: Arc<AtomicUsize>,
}

impl GpuSource for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn supports(&self, field: Field) -> bool {
        self.inner.supports(field)
    }
    fn field_gap(&self, device: &Device, field: Field) -> Option<FieldGap> {
        self.inner.field_gap(device, field)
    }
    fn devices(&self) -> Result<Vec<Device>, SourceError> {
        self.inner.devices()
    }
    fn sample(&self, device: &Device, fields: &[Field]) -> Result<DeviceSample, SourceError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.sample(device, fields)
    }
    fn drain_xids(&self) -> Vec<(String, XidEvent)> {
        self.inner.drain_xids()
    }
}

/// A kubelet in memory: answers with what `reply` holds after `delay` (never while it holds
/// `None`).
#[derive(Clone)]
struct Kubelet {
    reply: Arc<Mutex<Option<ListPodResourcesResponse>>>,
    delay: Duration,
}

impl PodResolver for Kubelet {
    fn origin(&self) -> String {
        "in-memory".into()
    }
    async fn list(&self) -> Result<ListPodResourcesResponse, AttributionError> {
        tokio::time::sleep(self.delay).await;
        let reply = self.reply.lock().unwrap().clone();
        match reply {
            Some(r) => Ok(r),
            None => std::future::pending().await,
        }
    }
}

/// The H100 node of tests/fixtures/pods/h100-seed1.toml (ml/notebook-alice holds GPU 2).
fn h100_reply() -> ListPodResourcesResponse {
    Assignments::load(&common::pods_fixture("h100-seed1.toml"))
        .expect("fixture parses")
        .reply
}

/// A node as `main` builds it with `-k` at the default interval: the sampler over the counting
/// sim, the kubelet refresher publishing to it, the sampler's first sample waiting for the
/// refresher's first answer.
struct Node {
    published: watch::Receiver<Option<Arc<Published>>>,
    reads: Arc<AtomicUsize>,
    metrics: Arc<SelfMetrics>,
    stop: CancellationToken,
}

impl Node {
    fn start(kubelet: Kubelet) -> Self {
        let reads = Arc::new(AtomicUsize::new(0));
        let source = Counting {
            inner: common::sim("8xH100-SXM", None),
            reads: Arc::clone(&reads),
        };
        let metrics = Arc::new(SelfMetrics::default());
        let (_catalog_tx, catalog_rx) = watch::channel(Arc::new(common::shipped_catalog()));
        let (pods_tx, pods_rx) = watch::channel(Arc::new(Attribution::default()));
        let (inv_tx, inv_rx) = watch::channel(Arc::new(Vec::new()));
        let refresher = Refresher::new(
            kubelet,
            inv_rx,
            pods_tx,
            Arc::clone(&metrics.pod_resources),
            RefresherOptions::default(),
        );
        let sampler = Sampler::new(
            Arc::new(source),
            catalog_rx,
            pods_rx,
            SamplerOptions {
                interval: DEFAULT_INTERVAL,
                rediscover_every: Duration::from_secs(60),
                build: common::build_options(),
            },
            metrics.sampler(),
        )
        .with_inventory(inv_tx)
        .with_first_answer("kubelet", refresher.answered(), KUBELET_TIMEOUT);
        let stop = CancellationToken::new();
        let (tx, published) = watch::channel(None);
        tokio::spawn(refresher.run(stop.clone()));
        tokio::spawn(sampler.run(tx, stop.clone()));
        Self {
            published,
            reads,
            metrics,
            stop,
        }
    }

    /// The next body published.
    async fn next(&mut self) -> String {
        self.published.changed().await.expect("sampler running");
        let p = self
            .published
            .borrow_and_update()
            .clone()
            .expect("a sample");
        body_of(&p)
    }

    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The `DCGM_FI_DEV_GPU_UTIL` line of GPU `gpu`.
fn util_of(body: &str, gpu: u32) -> String {
    let g = format!("gpu=\"{gpu}\",");
    let lines: Vec<&str> = common::series(body, "DCGM_FI_DEV_GPU_UTIL")
        .into_iter()
        .filter(|l| l.contains(&g))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines[0].to_owned()
}

const ALICE: &str = "container=\"jupyter\",namespace=\"ml\",pod=\"notebook-alice\"";

#[tokio::test(start_paused = true)]
async fn the_first_sample_carries_the_pod_labels_of_a_kubelet_answering_at_once() {
    let t0 = Instant::now();
    let mut node = Node::start(Kubelet {
        reply: Arc::new(Mutex::new(Some(h100_reply()))),
        delay: Duration::ZERO,
    });
    let first = node.next().await;
    assert_eq!(Instant::now(), t0, "no time lost waiting");
    assert!(util_of(&first, 2).contains(ALICE), "{}", util_of(&first, 2));
    assert!(!util_of(&first, 5).contains("pod="));
    assert!(first.contains("gpu_exporter_samples_total 1\n"));
    assert!(first
        .contains("gpu_exporter_attribution_first_answer_timeouts_total{source=\"kubelet\"} 0\n"));
    assert!(first.contains("gpu_exporter_attribution_updates_total 0\n"));
    assert_eq!(node.reads(), 8, "one read per GPU");
}

#[tokio::test(start_paused = true)]
async fn the_first_sample_waits_for_a_slow_kubelet_within_its_call_timeout() {
    let t0 = Instant::now();
    let mut node = Node::start(Kubelet {
        reply: Arc::new(Mutex::new(Some(h100_reply()))),
        delay: Duration::from_secs(3),
    });
    let first = node.next().await;
    assert_eq!(Instant::now() - t0, Duration::from_secs(3));
    assert!(util_of(&first, 2).contains(ALICE));
    assert!(first
        .contains("gpu_exporter_attribution_first_answer_timeouts_total{source=\"kubelet\"} 0\n"));
}

#[tokio::test(start_paused = true)]
async fn a_kubelet_that_does_not_answer_delays_the_first_sample_by_its_timeout_only() {
    let t0 = Instant::now();
    let reply = Arc::new(Mutex::new(None));
    let mut node = Node::start(Kubelet {
        reply: Arc::clone(&reply),
        delay: Duration::ZERO,
    });
    let first = node.next().await;
    assert_eq!(Instant::now() - t0, KUBELET_TIMEOUT);
    assert!(!first.contains("pod="), "no kubelet answer, no pod labels");
    assert!(first
        .contains("gpu_exporter_attribution_first_answer_timeouts_total{source=\"kubelet\"} 1\n"));
    assert_eq!(
        node.metrics.attribution.state().first_answer_timeouts["kubelet"],
        1
    );
    assert!(first.contains("gpu_exporter_samples_total 1\n"));
}

#[tokio::test(start_paused = true)]
async fn a_pod_change_is_published_within_one_refresh_without_reading_the_gpus() {
    let t0 = Instant::now();
    let reply = Arc::new(Mutex::new(Some(h100_reply())));
    let mut node = Node::start(Kubelet {
        reply: Arc::clone(&reply),
        delay: Duration::ZERO,
    });
    let first = node.next().await;
    assert!(util_of(&first, 2).contains(ALICE));
    assert_eq!(node.reads(), 8);

    // notebook-alice ends; the kubelet says so at its next List (one refresh, 10 s, later).
    let mut without = h100_reply();
    without.pod_resources.retain(|p| p.name != "notebook-alice");
    *reply.lock().unwrap() = Some(without);
    let updated = node.next().await;
    assert_eq!(Instant::now() - t0, Duration::from_secs(10), "one refresh");
    assert!(
        !util_of(&updated, 2).contains("pod="),
        "{}",
        util_of(&updated, 2)
    );
    assert_eq!(node.reads(), 8, "no GPU read for the change");
    assert!(updated.contains("gpu_exporter_samples_total 1\n"));
    assert!(updated.contains("gpu_exporter_attribution_updates_total 1\n"));
    // The readings are the first sample's: only the attribution differs.
    assert_eq!(
        util_of(&updated, 2),
        util_of(&first, 2).replace(&format!(",{ALICE}"), "")
    );
    let temps = |b: &str| common::series(b, "DCGM_FI_DEV_GPU_TEMP").join("\n");
    assert_eq!(
        temps(&updated),
        temps(&first).replace(&format!(",{ALICE}"), "")
    );

    // Pods come back: published at the next refresh, again without a read.
    *reply.lock().unwrap() = Some(h100_reply());
    let back = node.next().await;
    assert_eq!(Instant::now() - t0, Duration::from_secs(20));
    assert!(util_of(&back, 2).contains(ALICE));
    assert_eq!(node.reads(), 8);
    assert!(back.contains("gpu_exporter_attribution_updates_total 2\n"));

    // The next sample reads the GPUs, on the interval.
    let second = node.next().await;
    assert_eq!(Instant::now() - t0, DEFAULT_INTERVAL);
    assert_eq!(node.reads(), 16);
    assert!(second.contains("gpu_exporter_samples_total 2\n"));
    assert!(util_of(&second, 2).contains(ALICE));
}

#[tokio::test(start_paused = true)]
async fn pre_hopper_gpus_have_no_profiling_series_and_say_why_once() {
    let (logs, _guard) = LogBuf::capture(tracing::Level::INFO);

    let h = common::harness(
        common::sim("4xA100-80GB-MIG", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    let mut sampler = h.sampler;
    let mut body = String::new();
    for _ in 0..3 {
        body = common::normalise(&sampler.tick().await.body);
    }
    // A reloaded catalog is checked again, but the reason is not logged again.
    h.catalog_tx
        .send_replace(Arc::new(common::shipped_catalog()));
    assert_eq!(
        common::series(&body, "gpu_exporter_fields_unavailable").len(),
        5
    );
    body = common::normalise(&sampler.tick().await.body);
    assert!(
        !body.lines().any(|l| l.starts_with("DCGM_FI_PROF_")),
        "profiling series on an A100 without a DCGM source"
    );
    // The shipped CSV's five profiling fields, each missing on all four GPUs.
    let unavailable = common::series(&body, "gpu_exporter_fields_unavailable");
    assert_eq!(unavailable.len(), 5, "{unavailable:#?}");
    for l in &unavailable {
        assert!(
            l.contains("field=\"DCGM_FI_PROF_")
                && l.ends_with("reason=\"needs_dcgm_profiling\"} 4"),
            "{l}"
        );
    }
    assert_eq!(logs.count("gpu_exporter_fields_unavailable"), 1);
    assert_eq!(
        logs.count("`-r host:5555` / DCGM_REMOTE_HOSTENGINE_INFO"),
        1
    );
    assert_eq!(logs.count("`nvidia-dcgm:5555`"), 1);
    assert_eq!(logs.count("NVIDIA A100-SXM4-80GB"), 1);

    // Hopper: served through GPM, nothing to say.
    let logs_before = logs.count("gpu_exporter_fields_unavailable");
    let h = common::harness(
        common::sim("8xH100-SXM", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    let mut sampler = h.sampler;
    sampler.tick().await;
    let body = common::normalise(&sampler.tick().await.body);
    assert_eq!(
        common::series(&body, "DCGM_FI_PROF_GR_ENGINE_ACTIVE").len(),
        8
    );
    assert!(common::series(&body, "gpu_exporter_fields_unavailable").is_empty());
    assert_eq!(logs.count("gpu_exporter_fields_unavailable"), logs_before);
}
