//! The DCGM source's cost (issue 27), on the stand-in `libdcgm.so.4` of tests/dcgm_abi, loaded
//! through the real `dlopen` path, with the simulated A100 fleets playing the NVML side (no GPM,
//! so the default CSV's five `DCGM_FI_PROF_*` fields come from DCGM).
//!
//! ```text
//! cargo bench --bench dcgm                     # about 1 min on 2 cores
//! ```
//!
//! Groups (each case reports its entity count as throughput):
//! - `dcgm_tick/…`: one tick's reads of every GPU through `DcgmSource<SimulatedSource>`: the
//!   simulated reads plus the merge of the DCGM values from the reader thread's map (the tick
//!   makes no DCGM call);
//! - `sim_tick/…`: the same reads without the DCGM source, the baseline;
//! - `dcgm_read/…`: what the reader thread does once per collect interval: one
//!   `dcgmEntitiesGetLatestValues` of every entity × the watched fields, converted to readings.
//!   It includes the stand-in's own cost (it re-reads its configuration file for every value),
//!   so it is an upper bound of the client side; with a real hostengine this is one RPC.
//!
//! The DCGM calls per interval and per (re)connection are printed once, from the stand-in's
//! call counters.
#![allow(missing_docs)]

#[path = "../tests/common/cstandin.rs"]
mod cstandin;
#[path = "../tests/common/dcgm_hostengine.rs"]
mod dcgm_hostengine;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use dcgm_hostengine::{hostengine, PROF};
use gpu_exporter::catalog;
use gpu_exporter::config::BUILTIN_COUNTERS;
use gpu_exporter::gpu::dcgm::source::{DcgmOptions, DcgmSource};
use gpu_exporter::gpu::dcgm::DcgmLibrary;
use gpu_exporter::gpu::sim::scenario::Scenario;
use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::gpu::GpuSource;
use gpu_exporter::sampler::fields_to_read;

const PROFILES: [&str; 2] = ["4xA100-80GB-MIG", "8xA100-80GB-7xMIG"];

fn library() -> PathBuf {
    cstandin::build(
        "dcgm-bench",
        "tests/dcgm_abi/dcgm_standin.c",
        "libdcgm.so.4",
        &[],
    )
}

fn sim(profile: &str) -> SimulatedSource {
    SimulatedSource::new(profile, 1, Duration::from_secs(1), Scenario::default(), "-")
        .expect("profile")
}

/// A hostengine holding a value for every entity of `devices` and profiling field; DCGM's GPU
/// ids are NVML's reversed and its GPU instance entity ids are unrelated to the GI ids, as in
/// the tests.
fn counters(path: &Path) -> BTreeMap<String, u64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.to_owned(), v.trim().parse().unwrap_or(0)))
        .collect()
}

fn bench(c: &mut Criterion) {
    let lib_path = library();
    for profile in PROFILES {
        let plain = sim(profile);
        let devices = plain.devices().expect("devices");
        let (cat, _) = catalog::parse(BUILTIN_COUNTERS, "default-counters.csv").expect("parses");
        let fields = fields_to_read(&cat, |f| plain.supports(f));
        let dir = tempfile::tempdir().expect("tempdir");
        let (conf, entities) = hostengine(&devices, dir.path());
        let status = dir.path().join("calls");
        // The stand-in reads these at each call; the bench is one process.
        std::env::set_var("DCGM_STANDIN_CONFIG", &conf);
        std::env::set_var("DCGM_STANDIN_STATUS", &status);
        let lib = DcgmLibrary::open(lib_path.to_str().expect("utf-8")).expect("load the stand-in");
        let mut opts = DcgmOptions::new("127.0.0.1:5555", Duration::from_secs(1));
        opts.library = lib_path.to_string_lossy().into_owned();
        let source = DcgmSource::start(sim(profile), lib.clone(), opts).expect("start");
        let devices = source.devices().expect("devices");
        for d in &devices {
            source.sample(d, &fields).expect("sample");
        }
        // Setup, not a measurement: wait for the reader thread's first read.
        let deadline = Instant::now() + Duration::from_secs(60);
        while source.metrics().reads() < 1 {
            assert!(Instant::now() < deadline, "the reader never read");
            std::thread::sleep(Duration::from_millis(10));
        }
        let served = devices
            .iter()
            .map(|d| source.sample(d, &fields).expect("sample"))
            .flat_map(|s| {
                let gpu = s.readings.into_iter();
                let inst = s.instances.into_iter().flat_map(|i| i.readings);
                gpu.chain(inst).collect::<Vec<_>>()
            })
            .filter(|(f, r)| f.is_profiling() && r.is_ok())
            .count();
        let calls = counters(&status);
        let reads = source.metrics().reads();
        eprintln!(
            "{profile}: {} entities, {served} profiling readings served per tick; DCGM calls after {reads} read(s): {calls:?}",
            entities.len()
        );

        let n = entities.len() as u64;
        let mut g = c.benchmark_group("dcgm_tick");
        g.throughput(Throughput::Elements(n));
        g.bench_function(BenchmarkId::from_parameter(profile), |b| {
            b.iter(|| {
                for d in &devices {
                    black_box(source.sample(d, &fields).expect("sample"));
                }
            });
        });
        g.finish();
        let mut g = c.benchmark_group("sim_tick");
        g.throughput(Throughput::Elements(n));
        g.bench_function(BenchmarkId::from_parameter(profile), |b| {
            b.iter(|| {
                for d in &devices {
                    black_box(plain.sample(d, &fields).expect("sample"));
                }
            });
        });
        g.finish();

        // The reader's per-interval read, on a connection of its own with its own watch.
        let conn = lib.connect("127.0.0.1:5555", false, 1000).expect("connect");
        let group = conn.create_group("bench", &entities).expect("group");
        let fg = conn
            .create_field_group(&format!("bench-{profile}"), &PROF)
            .expect("field group");
        conn.watch(group, fg, 1_000_000, 2).expect("watch");
        let mut g = c.benchmark_group("dcgm_read");
        g.throughput(Throughput::Elements(n));
        g.bench_function(BenchmarkId::from_parameter(profile), |b| {
            b.iter(|| {
                let v = conn.latest(&entities, &PROF).expect("read");
                black_box(
                    v.iter()
                        .map(gpu_exporter::gpu::dcgm::reading)
                        .filter(Result::is_ok)
                        .count(),
                )
            });
        });
        g.finish();
        drop(conn);
        drop(source);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
