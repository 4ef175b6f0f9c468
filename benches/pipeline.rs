//! Criterion benchmarks of the pure pipeline stages and one full sampling tick.
//!
//! ```text
//! cargo bench --bench pipeline                 # all of them (~4 min on 2 cores)
//! cargo bench --bench pipeline -- render/      # one group
//! python3 benches/criterion_table.py           # the table in BENCHMARKS.md, from target/criterion
//! ```
//!
//! Groups (criterion ids are `group/case`; every case reports its series count as throughput,
//! so `time / series` shows whether the cost is linear in the series count):
//! - `build/…`: snapshot build (samples + attribution → families with dcgm-exporter labels);
//! - `render/…`: families → text 0.0.4;
//! - `build_render/…`: both, which is what a tick spends outside the GPU reads;
//! - `gzip/…`: compressing a body for scrapers that accept gzip (once per sample);
//! - `csv_parse/…`: the shipped CSV and dcgm-exporter's largest upstream CSV;
//! - `pod_mapping/…`: a kubelet `List` reply of 1,000 pods → attribution;
//! - `tick/…`: one full `Sampler::tick` on the simulated backend (reads, history, build, render,
//!   self-metrics);
//! - `nvml_fake_tick/…`: reading 8 GPUs through the NVML backend over the in-memory fake driver
//!   (our side of the NVML cost; the call counts per GPU are printed once).
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tokio::sync::watch;

use gpu_exporter::catalog::{self, Catalog};
use gpu_exporter::config::{GpuIdType, BUILTIN_COUNTERS};
use gpu_exporter::gpu::nvml::counting::Counting;
use gpu_exporter::gpu::nvml::{NvmlSource, RetryPolicy};
use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::gpu::{Device, GpuSource};
use gpu_exporter::health::Recent;
use gpu_exporter::http::HttpMetrics;
use gpu_exporter::pods::mapping::{attribution_from, MappingOptions};
use gpu_exporter::pods::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
};
use gpu_exporter::pods::{Attribution, EntityKey, Holder, PodRef};
use gpu_exporter::reload::ReloadMetrics;
use gpu_exporter::render::render;
use gpu_exporter::sampler::{fields_to_read, Published, Sampler, SamplerMetrics, SamplerOptions};
use gpu_exporter::snapshot::{self, BuildOptions, DeviceOutcome, DeviceSelection, Snapshot};
use gpu_exporter_testing::fake_nvml::{FakeGpu, FakeNvml};

const INTERVAL: Duration = Duration::from_secs(1);

fn options() -> BuildOptions {
    BuildOptions {
        hostname_label: "hostname".into(),
        hostname: "gpu-node-017".into(),
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

fn sim(profile: &str) -> SimulatedSource {
    SimulatedSource::new(profile, 7, INTERVAL, Default::default(), "")
        .expect("known simulation profile")
}

/// The shipped CSV, less the rows the simulated backend cannot produce (as at startup).
fn catalog_for(source: &impl GpuSource) -> Catalog {
    let (mut cat, _) = catalog::parse(BUILTIN_COUNTERS, "default-counters.csv").expect("parses");
    cat.retain_supported(|f| source.supports(f));
    cat
}

/// Device outcomes after two samples, as the sampler hands them to the snapshot builder.
fn outcomes(source: &SimulatedSource, cat: &Catalog) -> Vec<DeviceOutcome> {
    let fields = fields_to_read(cat, |f| source.supports(f));
    let devices = source.devices().expect("sim devices");
    devices
        .into_iter()
        .map(|device| {
            source.sample(&device, &fields).expect("sample");
            let sample = source.sample(&device, &fields).expect("sample");
            let labels = cat
                .labels
                .iter()
                .filter_map(|spec| sample.get(spec.field).map(|v| (spec.field, v.clone())))
                .collect();
            DeviceOutcome {
                device,
                sample: Ok(sample),
                recent: Recent::default(),
                labels,
            }
        })
        .collect()
}

fn holder(i: usize, vgpu: Option<usize>) -> Holder {
    Holder {
        pod: PodRef {
            namespace: format!("team-{:02}", i % 13),
            pod: format!("inference-{i:04}-7f9c8d6b5-x2k4q"),
            container: "server".into(),
        },
        vgpu: vgpu.map(|v| v.to_string()),
        dra: None,
    }
}

/// `pods` pods spread over the entities (GPUs, or MIG instances where MIG is on): one holder per
/// entity when there are no more pods than entities, time-sliced replicas otherwise.
fn attribution(devices: &[Device], pods: usize) -> Attribution {
    let keys: Vec<EntityKey> = devices
        .iter()
        .flat_map(|d| {
            let gpu = d.identity.index;
            if d.mig_enabled && !d.instances.is_empty() {
                d.instances
                    .iter()
                    .map(|i| EntityKey {
                        gpu,
                        gi_id: Some(i.gi_id),
                    })
                    .collect::<Vec<_>>()
            } else {
                vec![EntityKey { gpu, gi_id: None }]
            }
        })
        .collect();
    let shared = pods > keys.len();
    let mut holders: BTreeMap<EntityKey, Vec<Holder>> = BTreeMap::new();
    for i in 0..pods {
        let key = keys[i % keys.len()];
        let replica = shared.then_some(i / keys.len());
        holders.entry(key).or_default().push(holder(i, replica));
    }
    for list in holders.values_mut() {
        list.sort();
    }
    Attribution {
        holders,
        ..Default::default()
    }
}

struct Case {
    name: String,
    catalog: Catalog,
    outcomes: Vec<DeviceOutcome>,
    attribution: Attribution,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (profile, pods) in [
        ("1xA100-40GB", 0),
        ("8xH100-SXM", 0),
        ("64xH100-SXM", 0),
        ("8xH100-SXM", 8),
        ("8xH100-SXM", 200),
        ("8xA100-80GB-7xMIG", 0),
        ("8xA100-80GB-7xMIG", 56),
    ] {
        let source = sim(profile);
        let catalog = catalog_for(&source);
        let outcomes = outcomes(&source, &catalog);
        let devices: Vec<Device> = outcomes.iter().map(|o| o.device.clone()).collect();
        out.push(Case {
            name: format!("{profile}/{pods}pods"),
            catalog,
            outcomes,
            attribution: attribution(&devices, pods),
        });
    }
    out
}

impl Case {
    fn snapshot(&self, opts: &BuildOptions) -> Snapshot {
        snapshot::build(&self.catalog, &self.outcomes, &self.attribution, opts)
    }
}

/// The exposition body, rendered as the sampler renders it.
fn body(snap: &Snapshot) -> String {
    let mut out = String::with_capacity(snap.series * 200 + 4096);
    render(&snap.families, &mut out);
    out
}

fn bench_snapshot(c: &mut Criterion, cases: &[Case]) {
    let opts = options();
    let series = |case: &Case| Throughput::Elements(case.snapshot(&opts).series as u64);

    let mut group = c.benchmark_group("build");
    for case in cases {
        group.throughput(series(case));
        group.bench_function(BenchmarkId::from_parameter(&case.name), |b| {
            b.iter(|| black_box(case).snapshot(&opts));
        });
    }
    group.finish();

    let mut group = c.benchmark_group("render");
    for case in cases {
        let snap = case.snapshot(&opts);
        group.throughput(Throughput::Elements(snap.series as u64));
        group.bench_function(BenchmarkId::from_parameter(&case.name), |b| {
            b.iter(|| body(black_box(&snap)));
        });
    }
    group.finish();

    let mut group = c.benchmark_group("build_render");
    for case in cases {
        group.throughput(series(case));
        group.bench_function(BenchmarkId::from_parameter(&case.name), |b| {
            b.iter(|| body(&black_box(case).snapshot(&opts)));
        });
    }
    group.finish();
}

/// Compressing a published body for a scraper that accepts gzip (once per sample).
fn bench_gzip(c: &mut Criterion, cases: &[Case]) {
    let opts = options();
    let mut group = c.benchmark_group("gzip");
    for case in cases
        .iter()
        .filter(|c| c.name == "8xH100-SXM/200pods" || c.name == "64xH100-SXM/0pods")
    {
        let body = bytes::Bytes::from(body(&case.snapshot(&opts)));
        let publish = || Published::new(body.clone(), tokio::time::Instant::now(), 0, None);
        let gz = publish().gzip_body().len();
        eprintln!("gzip {}: {} -> {gz} bytes", case.name, body.len());
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(BenchmarkId::from_parameter(&case.name), |b| {
            b.iter(|| publish().gzip_body().len());
        });
    }
    group.finish();
}

/// The snapshot cases are built once (sampling the simulated fleets) for both groups.
fn bench_snapshot_and_gzip(c: &mut Criterion) {
    let cases = cases();
    bench_snapshot(c, &cases);
    bench_gzip(c, &cases);
}

fn bench_csv(c: &mut Criterion) {
    let upstream = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/upstream/dcp-metrics-included.csv"
    ))
    .expect("upstream fixture");
    let mut group = c.benchmark_group("csv_parse");
    for (name, text) in [
        ("default-counters.csv", BUILTIN_COUNTERS),
        ("dcp-metrics-included.csv", upstream.as_str()),
    ] {
        let rows = catalog::parse(text, name).expect("parses").0.metrics.len();
        group.throughput(Throughput::Elements(rows as u64));
        group.bench_with_input(BenchmarkId::from_parameter(name), text, |b, text| {
            b.iter(|| catalog::parse(black_box(text), name).expect("parses"));
        });
    }
    group.finish();
}

/// A `List` reply of `pods` pods on an 8-GPU node: every fifth pod holds a time-sliced replica
/// of a GPU (a node this dense shares its GPUs), the rest hold CPU-only devices or nothing.
fn list_reply(devices: &[Device], pods: usize) -> ListPodResourcesResponse {
    let pod_resources = (0..pods)
        .map(|i| {
            let devices = if i % 5 == 0 {
                let gpu = &devices[(i / 5) % devices.len()];
                vec![ContainerDevices {
                    resource_name: "nvidia.com/gpu".into(),
                    device_ids: vec![format!("{}::{}", gpu.identity.uuid, i / 5)],
                    ..Default::default()
                }]
            } else if i % 5 == 1 {
                vec![ContainerDevices {
                    resource_name: "example.com/nic".into(),
                    device_ids: vec![format!("nic-{i}")],
                    ..Default::default()
                }]
            } else {
                Vec::new()
            };
            PodResources {
                name: format!("workload-{i:04}-6d8f7c9b4-abcde"),
                namespace: format!("team-{:02}", i % 13),
                containers: vec![
                    ContainerResources {
                        name: "main".into(),
                        devices,
                        ..Default::default()
                    },
                    ContainerResources {
                        name: "sidecar".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }
        })
        .collect();
    ListPodResourcesResponse { pod_resources }
}

fn bench_pod_mapping(c: &mut Criterion) {
    let devices = sim("8xH100-SXM").devices().expect("devices");
    let opts = MappingOptions {
        extra_resource_names: Vec::new(),
        id_type: GpuIdType::Uid,
        enable_dra: false,
    };
    let mut group = c.benchmark_group("pod_mapping");
    let pods = 1000usize;
    let reply = list_reply(&devices, pods);
    let mapped = attribution_from(&reply, &devices, &opts);
    assert_eq!(mapped.unknown_devices, 0);
    assert_eq!(
        mapped
            .attribution
            .holders
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        pods / 5
    );
    group.throughput(Throughput::Elements(pods as u64));
    group.bench_with_input(
        BenchmarkId::from_parameter(format!("8xH100-SXM/{pods}pods")),
        &reply,
        |b, reply| b.iter(|| attribution_from(black_box(reply), &devices, &opts)),
    );
    group.finish();
}

/// The self-metric families of an exporter without attribution, as `main.rs` registers them:
/// the sampler's, the metrics CSV's and the HTTP server's (encoded into every body).
fn self_metrics() -> SamplerMetrics {
    let own = SamplerMetrics::standalone();
    let mut registry = gpu_exporter::self_metrics::Registry::default();
    registry.register_collector(Box::new(Arc::clone(&own.samples)));
    registry.register_collector(Box::new(ReloadMetrics::default()));
    registry.register_collector(Box::new(HttpMetrics::default()));
    SamplerMetrics {
        registry: Arc::new(registry),
        ..own
    }
}

/// A sampler over a simulated node with `pods` pods, accounting off (`None`) or on, published
/// every `Some(interval)`; `(sampler, the case's name, its channels' senders)`.
fn tick_case(
    rt: &tokio::runtime::Runtime,
    profile: &str,
    pods: usize,
    accounting: Option<Duration>,
) -> (Sampler<SimulatedSource>, String, Box<dyn std::any::Any>) {
    let source = sim(profile);
    let catalog = catalog_for(&source);
    let devices = source.devices().expect("devices");
    let (catalog_tx, catalog_rx) = watch::channel(Arc::new(catalog));
    let (pods_tx, pods_rx) = watch::channel(Arc::new(attribution(&devices, pods)));
    let mut sampler = Sampler::new(
        Arc::new(source),
        catalog_rx,
        pods_rx,
        SamplerOptions {
            interval: INTERVAL,
            rediscover_every: Duration::from_secs(3600),
            build: options(),
        },
        {
            let m = self_metrics();
            if let Some(publish_every) = accounting {
                m.accounting
                    .enable(gpu_exporter::accounting::AccountingOptions {
                        idle_mw: None,
                        processes: false,
                        retention: Duration::from_secs(900),
                        hostname: ("hostname".into(), "bench".into()),
                        publish_every,
                    });
            }
            m
        },
    );
    rt.block_on(sampler.tick());
    let first = rt.block_on(sampler.tick());
    let suffix = match accounting {
        None => "",
        Some(d) if d.is_zero() => "+accounting-every-tick",
        Some(_) => "+accounting",
    };
    let name = format!("{profile}/{pods}pods{suffix}");
    eprintln!(
        "tick/{name}: body {} bytes, {} lines, {} gzipped, {} series",
        first.body.len(),
        first.body.iter().filter(|b| **b == b'\n').count(),
        first.gzip_body().len(),
        first.series
    );
    // The senders are kept as long as the sampler, as the exporter keeps them.
    (sampler, name, Box::new((catalog_tx, pods_tx)))
}

fn bench_tick(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("tick");
    // With `-k` accounting advances at every tick: the 200-pod node is measured with it off and
    // on, published on its own interval (the default, a minute: a tick rarely renders it) or,
    // as `--accounting-publish-interval 0`, at every tick.
    for (profile, pods, accounting) in [
        ("1xA100-40GB", 0, None),
        ("8xH100-SXM", 200, None),
        ("8xH100-SXM", 200, Some(Duration::from_secs(60))),
        ("8xH100-SXM", 200, Some(Duration::ZERO)),
        ("64xH100-SXM", 0, None),
        ("8xA100-80GB-7xMIG", 56, None),
    ] {
        let (mut sampler, name, _senders) = tick_case(&rt, profile, pods, accounting);
        let series = rt.block_on(sampler.tick()).series;
        group.throughput(Throughput::Elements(series as u64));
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| rt.block_on(sampler.tick()));
        });
    }
    group.finish();
}

/// The CPU time of the whole process (every thread), ns: what a tick costs the node, however
/// busy the machine is with other work (wall time is not, on a shared 2-core VM).
struct ProcessCpu;

/// Its values are nanoseconds, formatted as wall time's.
static WALL: criterion::measurement::WallTime = criterion::measurement::WallTime;

fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

impl criterion::measurement::Measurement for ProcessCpu {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        cpu_ns()
    }
    fn end(&self, i: u64) -> u64 {
        cpu_ns().saturating_sub(i)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn criterion::measurement::ValueFormatter {
        criterion::measurement::Measurement::formatter(&WALL)
    }
}

/// Accounting's cost on the tick in CPU time (issue 37's target: at most +10 %).
fn bench_tick_cpu(c: &mut Criterion<ProcessCpu>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("tick_cpu");
    for accounting in [None, Some(Duration::from_secs(60)), Some(Duration::ZERO)] {
        let (mut sampler, name, _senders) = tick_case(&rt, "8xH100-SXM", 200, accounting);
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| rt.block_on(sampler.tick()));
        });
    }
    group.finish();
}

fn nvml_source<A: gpu_exporter::gpu::nvml::api::NvmlApi + Clone + Send + Sync + 'static>(
    api: A,
) -> NvmlSource<A> {
    let no_wait = RetryPolicy {
        initial: Duration::ZERO,
        max: Duration::ZERO,
    };
    NvmlSource::new(move || Ok(api.clone()), no_wait)
}

fn bench_nvml_fake(c: &mut Criterion) {
    let gpus = || (0..8).map(FakeGpu::h100).collect::<Vec<_>>();
    let (cat, _) = catalog::parse(BUILTIN_COUNTERS, "default-counters.csv").expect("parses");

    // The call budget, through the counting layer.
    let counting = Counting::new(FakeNvml::new("570.172.08", gpus()));
    let counter = counting.counter();
    let source = nvml_source(counting);
    let devices = source.devices().expect("fake devices");
    let fields = fields_to_read(&cat, |f| source.supports(f));
    for _ in 0..2 {
        counter.take();
        for d in &devices {
            source.sample(d, &fields).expect("fake sample");
        }
    }
    let calls = counter.take();
    let total: u64 = calls.values().sum();
    eprintln!(
        "NVML calls per steady tick, 8 GPUs: {total} ({} per GPU): {calls:?}",
        total / devices.len() as u64
    );

    // The time, without the counting layer.
    let source = nvml_source(FakeNvml::new("570.172.08", gpus()));
    let devices = source.devices().expect("fake devices");
    let mut group = c.benchmark_group("nvml_fake_tick");
    group.throughput(Throughput::Elements(devices.len() as u64));
    group.bench_function("8xH100-fake/default-counters", |b| {
        b.iter(|| {
            for d in &devices {
                black_box(source.sample(d, &fields).expect("fake sample"));
            }
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = bench_snapshot_and_gzip, bench_csv, bench_pod_mapping, bench_tick, bench_nvml_fake
}
criterion_group! {
    name = cpu;
    config = Criterion::default()
        .with_measurement(ProcessCpu)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = bench_tick_cpu
}
criterion_main!(benches, cpu);
