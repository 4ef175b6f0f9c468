//! NvmlSource against the fake NVML: field mapping and units, unsupported fields, GPU loss,
//! MIG, GPM deltas, re-enumeration, XID events, init retry and the call budget.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::api::{ApiError, FieldNum, GpmMetric, MemoryInfo};
use super::counting::Counting;
use super::*;
use crate::catalog::{self, Field};
use crate::fake_nvml::{FakeGpu, FakeMig, FakeNvml};
use crate::gpu::{FieldError, GpuIdentity, GpuSource, MigPlacement, Reading, SourceError, Value};

const NO_RETRY_WAIT: RetryPolicy = RetryPolicy {
    initial: Duration::ZERO,
    max: Duration::ZERO,
};

fn source(fake: &FakeNvml) -> NvmlSource<FakeNvml> {
    let f = fake.clone();
    NvmlSource::new(move || Ok(f.clone()), NO_RETRY_WAIT)
}

/// The fields the sampler reads for the shipped default CSV.
fn default_fields() -> Vec<Field> {
    let (cat, _) = catalog::parse(crate::config::BUILTIN_COUNTERS, "default-counters.csv")
        .expect("the shipped CSV parses");
    crate::sampler::fields_to_read(&cat, |_| true)
}

fn reading(s: &DeviceSample, f: Field) -> Reading {
    s.readings
        .iter()
        .find(|(g, _)| *g == f)
        .map(|(_, r)| r.clone())
        .unwrap_or_else(|| panic!("{f:?} not read"))
}

fn mib(n: u64) -> u64 {
    n * 1_048_576
}

#[test]
fn default_fields_are_read_in_dcgm_units() {
    let fake = FakeNvml::new("570.172.08", vec![FakeGpu::h100(0)]);
    let src = source(&fake);
    let devs = src.devices().unwrap();
    assert_eq!(devs.len(), 1);
    let d = &devs[0];
    assert_eq!(d.identity.uuid, "GPU-fake-0000");
    assert_eq!(d.identity.pci_bus_id, "00000000:18:00.0");
    assert_eq!(d.identity.model, "NVIDIA H100 80GB HBM3");
    assert!(!d.mig_enabled);

    let fields = default_fields();
    let s = src.sample(d, &fields).unwrap();
    let int = |v| Ok(Value::Int(v));
    assert_eq!(reading(&s, Field::SmClock), int(1980));
    assert_eq!(reading(&s, Field::MemClock), int(2619));
    assert_eq!(reading(&s, Field::GpuTemp), int(45));
    assert_eq!(reading(&s, Field::MemoryTemp), int(41));
    assert_eq!(reading(&s, Field::PowerUsage), Ok(Value::Float(302.206)));
    assert_eq!(reading(&s, Field::TotalEnergyConsumption), int(987_654));
    assert_eq!(reading(&s, Field::PcieReplayCounter), int(3));
    assert_eq!(reading(&s, Field::GpuUtil), int(75));
    assert_eq!(reading(&s, Field::MemCopyUtil), int(30));
    assert_eq!(reading(&s, Field::PowerViolation), int(1000));
    assert_eq!(reading(&s, Field::ThermalViolation), int(2000));
    assert_eq!(reading(&s, Field::EccSbeAggTotal), int(7));
    // 80 GiB total, 0.5 GiB reserved, 10 GiB used → MiB.
    assert_eq!(reading(&s, Field::FbUsed), int(10_240));
    assert_eq!(reading(&s, Field::FbReserved), int(512));
    assert_eq!(reading(&s, Field::FbFree), int(81_920 - 512 - 10_240));
    assert_eq!(
        reading(&s, Field::DriverVersion),
        Ok(Value::Text("570.172.08".into()))
    );
    // The first NVLink reading has no interval yet: 0, as DCGM publishes.
    assert_eq!(reading(&s, Field::NvlinkBandwidthTotal), int(0));
    // GPM needs two samples: absent on the first tick...
    assert_eq!(
        reading(&s, Field::ProfGrEngineActive),
        Err(FieldError::NotSupported)
    );
    // Event-driven and exporter fields are not read per tick.
    assert!(s.readings.iter().all(|(f, _)| *f != Field::XidErrors));

    // ...and ratios / bytes per second on the second.
    fake.update(|st| {
        let g = &mut st.gpus[0];
        g.nvlink_kib = Some((20_000_000, 10_000_000));
        g.timestamp_us += 30_000_000;
    });
    let s = src.sample(d, &fields).unwrap();
    assert_eq!(
        reading(&s, Field::ProfGrEngineActive),
        Ok(Value::Float(0.5))
    );
    assert_eq!(reading(&s, Field::ProfDramActive), Ok(Value::Float(0.3)));
    assert_eq!(
        reading(&s, Field::ProfPipeTensorActive),
        Ok(Value::Float(0.1))
    );
    assert_eq!(
        reading(&s, Field::ProfPcieTxBytes),
        Ok(Value::Float(100.0 * 1_048_576.0))
    );
    // 30 000 000 KiB in 30 s → 1000 (DCGM's KiB/s / 1000).
    assert_eq!(reading(&s, Field::NvlinkBandwidthTotal), int(1000));
}

#[test]
fn unsupported_fields_are_not_supported_and_others_still_read() {
    let mut g = FakeGpu::h100(0);
    g.fields.remove(&convert::fi::MEMORY_TEMP);
    g.nvlink_kib = None;
    g.serial = None;
    g.fields
        .insert(convert::fi::PCIE_REPLAY_COUNTER, FieldNum::Float(f64::NAN));
    let fake = FakeNvml::new("580.82.07", vec![g]);
    let src = source(&fake);
    let d = src.devices().unwrap().remove(0);
    let s = src
        .sample(
            &d,
            &[
                Field::MemoryTemp,
                Field::NvlinkBandwidthTotal,
                Field::Serial,
                Field::PcieReplayCounter,
                Field::FanSpeed,
                Field::GpuTemp,
            ],
        )
        .unwrap();
    assert_eq!(
        reading(&s, Field::MemoryTemp),
        Err(FieldError::NotSupported)
    );
    assert_eq!(
        reading(&s, Field::NvlinkBandwidthTotal),
        Err(FieldError::NotSupported)
    );
    assert_eq!(reading(&s, Field::Serial), Err(FieldError::NotSupported));
    assert_eq!(reading(&s, Field::FanSpeed), Err(FieldError::NotSupported));
    assert_eq!(
        reading(&s, Field::PcieReplayCounter),
        Err(FieldError::Invalid)
    );
    assert_eq!(reading(&s, Field::GpuTemp), Ok(Value::Int(45)));
}

#[test]
fn a_lost_gpu_is_gpu_lost_and_the_others_keep_sampling() {
    let fake = FakeNvml::new("570.172.08", vec![FakeGpu::h100(0), FakeGpu::h100(1)]);
    let src = source(&fake);
    let devs = src.devices().unwrap();
    let fields = default_fields();
    fake.update(|st| st.gpus[1].lost = true);
    assert!(src.sample(&devs[0], &fields).is_ok());
    match src.sample(&devs[1], &fields) {
        Err(SourceError::GpuLost { index, uuid }) => {
            assert_eq!((index, uuid.as_str()), (1, "GPU-fake-0001"));
        }
        other => panic!("expected GpuLost, got {other:?}"),
    }
    // Re-enumeration keeps the lost GPU (so its health says FAIL) and it stays lost.
    let again = src.devices().unwrap();
    assert_eq!(again.len(), 2);
    assert_eq!(again[1].identity.uuid, "GPU-fake-0001");
    assert!(matches!(
        src.sample(&again[1], &fields),
        Err(SourceError::GpuLost { .. })
    ));
    // It comes back after a reset.
    fake.update(|st| st.gpus[1].lost = false);
    let back = src.devices().unwrap();
    assert!(src.sample(&back[1], &fields).is_ok());
}

#[test]
fn rediscovery_notices_vanished_and_returned_gpus() {
    let fake = FakeNvml::new(
        "570.172.08",
        vec![FakeGpu::h100(0), FakeGpu::h100(1), FakeGpu::h100(2)],
    );
    let src = source(&fake);
    assert_eq!(src.devices().unwrap().len(), 3);
    fake.update(|st| st.gpus[1].present = false);
    let devs = src.devices().unwrap();
    let uuids: Vec<&str> = devs.iter().map(|d| d.identity.uuid.as_str()).collect();
    assert_eq!(uuids, ["GPU-fake-0000", "GPU-fake-0002"]);
    // A device from the old list is no longer known.
    let gone = crate::gpu::Device {
        identity: GpuIdentity {
            index: 1,
            uuid: "GPU-fake-0001".into(),
            pci_bus_id: String::new(),
            minor: 1,
            model: String::new(),
        },
        mig_enabled: false,
        instances: vec![],
    };
    assert!(matches!(
        src.sample(&gone, &[Field::GpuTemp]),
        Err(SourceError::Device { .. })
    ));
    fake.update(|st| st.gpus[1].present = true);
    let devs = src.devices().unwrap();
    assert_eq!(devs.len(), 3);
    assert!(src.sample(&devs[1], &[Field::GpuTemp]).is_ok());
}

fn mig_gpu() -> FakeGpu {
    let mut g = FakeGpu::h100(0);
    g.name = "NVIDIA A100-SXM4-80GB".into();
    g.mig_enabled = true;
    let inst = |gi_id, name: &str, used_mib, sm| FakeMig {
        gi_id,
        ci_id: 0,
        uuid: format!("MIG-fake-{gi_id}"),
        profile_name: name.into(),
        slices: 3,
        profile_mib: 40_448,
        // 3g.40gb on an A100 80GB: profile id 9, on memory slices 0-3 or 4-7.
        placement: (9, if gi_id == 1 { 0 } else { 4 }, 4),
        memory: MemoryInfo {
            total: mib(40_192),
            free: mib(40_192 - used_mib),
            used: mib(used_mib),
            reserved: 0,
        },
        gpm: [(GpmMetric::SmUtil, sm), (GpmMetric::GraphicsUtil, sm)]
            .into_iter()
            .collect(),
        processes: Vec::new(),
    };
    g.mig = vec![
        Some(inst(2, "MIG 3g.40gb", 1000, 20.0)),
        None,
        Some(inst(1, "MIG 3g.40gb", 3000, 60.0)),
        None,
    ];
    g
}

#[test]
fn mig_instances_skip_empty_slots_and_read_per_instance_fields() {
    let fake = FakeNvml::new("570.172.08", vec![mig_gpu()]);
    let src = source(&fake);
    let d = src.devices().unwrap().remove(0);
    assert!(d.mig_enabled);
    let got: Vec<(u32, &str, &str)> = d
        .instances
        .iter()
        .map(|i| (i.gi_id, i.profile.as_str(), i.uuid.as_str()))
        .collect();
    assert_eq!(
        got,
        [(1, "3g.40gb", "MIG-fake-1"), (2, "3g.40gb", "MIG-fake-2")]
    );
    // The GPU instance info gives each instance's profile id and placement (DRA device names).
    let placements: Vec<Option<MigPlacement>> = d.instances.iter().map(|i| i.placement).collect();
    let at = |start| {
        Some(MigPlacement {
            profile_id: 9,
            start,
            size: 4,
        })
    };
    assert_eq!(placements, [at(0), at(4)]);
    let fields = [
        Field::GpuUtil,
        Field::GpuTemp,
        Field::FbUsed,
        Field::FbFree,
        Field::ProfSmActive,
    ];
    let s = src.sample(&d, &fields).unwrap();
    // Utilisation is not defined in MIG mode: not even asked for.
    assert!(s.readings.iter().all(|(f, _)| *f != Field::GpuUtil));
    assert_eq!(reading(&s, Field::GpuTemp), Ok(Value::Int(45)));
    let inst = |s: &DeviceSample, gi, f| {
        s.instances
            .iter()
            .find(|i| i.gi_id == gi)
            .and_then(|i| i.readings.iter().find(|(g, _)| *g == f))
            .map(|(_, r)| r.clone())
    };
    assert_eq!(inst(&s, 1, Field::FbUsed), Some(Ok(Value::Int(3000))));
    assert_eq!(inst(&s, 2, Field::FbFree), Some(Ok(Value::Int(39_192))));
    assert_eq!(
        inst(&s, 1, Field::ProfSmActive),
        Some(Err(FieldError::NotSupported))
    );
    let s = src.sample(&d, &fields).unwrap();
    assert_eq!(
        inst(&s, 1, Field::ProfSmActive),
        Some(Ok(Value::Float(0.6)))
    );
    assert_eq!(
        inst(&s, 2, Field::ProfSmActive),
        Some(Ok(Value::Float(0.2)))
    );
}

#[test]
fn fb_used_percent_is_bytes_over_usable_bytes_on_gpus_and_mig_instances() {
    // Byte counts whose truncated MiB give another ratio (issue 35 item 11): DCGM divides
    // used by total - reserved in bytes.
    let gpu_mem = MemoryInfo {
        total: mib(1000) + 999_999,
        reserved: mib(24) + 1,
        used: mib(250) + 1_048_575,
        free: mib(700),
    };
    let mig_mem = MemoryInfo {
        total: mib(40_192) + 1_048_575,
        reserved: 0,
        used: mib(3000) + 1_048_575,
        free: mib(37_000),
    };
    let ratio = |m: &MemoryInfo| Value::Float(m.used as f64 / (m.total - m.reserved) as f64);
    let mut g = mig_gpu();
    g.memory = gpu_mem;
    for m in g.mig.iter_mut().flatten() {
        m.memory = mig_mem;
    }
    let fake = FakeNvml::new("570.172.08", vec![g]);
    let src = source(&fake);
    let d = src.devices().unwrap().remove(0);
    let s = src.sample(&d, &[Field::FbUsedPercent]).unwrap();
    assert_eq!(reading(&s, Field::FbUsedPercent), Ok(ratio(&gpu_mem)));
    assert_ne!(ratio(&gpu_mem), Value::Float(250.0 / (1000.0 - 24.0)));
    assert_eq!(s.instances.len(), 2);
    for i in &s.instances {
        let r = i.readings.iter().find(|(f, _)| *f == Field::FbUsedPercent);
        assert_eq!(r.map(|(_, r)| r.clone()), Some(Ok(ratio(&mig_mem))));
    }
    assert_ne!(ratio(&mig_mem), Value::Float(3000.0 / 40_192.0));
}

#[test]
fn mig_profiles_are_named_as_dcgm_names_them_with_or_without_privileges() {
    let mut g = mig_gpu();
    if let Some(m) = g.mig[0].as_mut() {
        m.profile_name = "MIG 1g.12gb".into();
        m.slices = 1;
        m.profile_mib = 11_008;
    }
    let want = ["3g.40gb", "1g.11gb"];
    let src = source(&FakeNvml::new("570.172.08", vec![g.clone()]));
    let d = src.devices().unwrap().remove(0);
    let profiles: Vec<&str> = d.instances.iter().map(|i| i.profile.as_str()).collect();
    assert_eq!(profiles, want);
    // Refused the GPU instance path, the MIG devices' attributes give the same names.
    g.gpu_instance_info_denied = true;
    let src = source(&FakeNvml::new("570.172.08", vec![g]));
    let d = src.devices().unwrap().remove(0);
    let profiles: Vec<&str> = d.instances.iter().map(|i| i.profile.as_str()).collect();
    assert_eq!(profiles, want);
    // Without the GPU instance path there is no placement either.
    assert!(d.instances.iter().all(|i| i.placement.is_none()));
}

#[test]
fn xids_from_the_event_thread_are_drained_by_gpu_uuid() {
    let fake = FakeNvml::new("570.172.08", vec![FakeGpu::h100(0), FakeGpu::h100(1)]);
    let src = source(&fake);
    src.devices().unwrap();
    assert!(src.drain_xids().is_empty());
    assert!(fake.raise_xid("GPU-fake-0001", 79));
    assert!(fake.raise_xid("GPU-fake-0000", 13));
    assert!(src.wait_for_xids(2, Duration::from_secs(30)));
    let got: Vec<(String, u64)> = src
        .drain_xids()
        .into_iter()
        .map(|(u, x)| (u, x.xid))
        .collect();
    assert_eq!(
        got,
        [
            ("GPU-fake-0001".to_owned(), 79),
            ("GPU-fake-0000".to_owned(), 13)
        ]
    );
    assert!(src.drain_xids().is_empty());
}

#[test]
fn init_is_retried_with_backoff_and_succeeds_later() {
    let attempts = Arc::new(AtomicU64::new(0));
    let fake = FakeNvml::new("570.172.08", vec![FakeGpu::h100(0)]);
    let (a, f) = (Arc::clone(&attempts), fake.clone());
    let slow = NvmlSource::new(
        move || {
            a.fetch_add(1, Ordering::SeqCst);
            Err::<FakeNvml, _>(InitError::DriverNotLoaded)
        },
        RetryPolicy {
            initial: Duration::from_secs(3600),
            max: Duration::from_secs(3600),
        },
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(slow.init_error(), Some(InitError::DriverNotLoaded));
    // Not due again for an hour: no new attempt, the same error.
    let e = slow.devices().unwrap_err();
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert!(crate::error_chain(&e).contains("kernel driver is not loaded"));
    assert!(matches!(e, SourceError::Discovery { .. }));

    let fails_left = Arc::new(AtomicU64::new(2));
    let l = Arc::clone(&fails_left);
    let src = NvmlSource::new(
        move || {
            if l.load(Ordering::SeqCst) > 0 {
                l.fetch_sub(1, Ordering::SeqCst);
                Err(InitError::LibraryNotFound {
                    detail: "libnvidia-ml.so.1: cannot open shared object file".into(),
                })
            } else {
                Ok(f.clone())
            }
        },
        NO_RETRY_WAIT,
    );
    assert!(src.init_error().is_some());
    // Unknown at startup: profiling rows are kept.
    assert!(src.supports(Field::ProfSmActive));
    assert!(src.devices().is_err());
    assert_eq!(src.init_attempts(), 2);
    assert_eq!(src.devices().unwrap().len(), 1);
    assert_eq!(src.init_error(), None);
}

#[test]
fn gpm_support_is_decided_per_gpu_from_the_hardware() {
    // A pre-Hopper GPU (no GPM) next to a Hopper one: the profiling fields stay in the catalog,
    // are read on the Hopper GPU, and are "not supported" (no series, no error) on the old one,
    // which `field_gap` reports with its reason.
    let mut old = FakeGpu::h100(0);
    old.gpm_supported = false;
    let src = source(&FakeNvml::new("570.172.08", vec![old, FakeGpu::h100(1)]));
    assert!(src.supports(Field::ProfSmActive));
    assert!(src.supports(Field::GpuTemp));
    assert!(!src.supports(Field::ExpP2pStatus));
    assert!(src.supports(Field::ExpGpuHealthStatus));
    let devs = src.devices().unwrap();
    assert_eq!(
        src.field_gap(&devs[0], Field::ProfSmActive),
        Some(crate::gpu::FieldGap::ProfilingNeedsDcgm)
    );
    assert_eq!(src.field_gap(&devs[0], Field::GpuTemp), None);
    assert_eq!(src.field_gap(&devs[1], Field::ProfSmActive), None);
    let fields = [Field::ProfSmActive, Field::GpuTemp];
    for _ in 0..2 {
        let s = src.sample(&devs[0], &fields).unwrap();
        assert_eq!(
            reading(&s, Field::ProfSmActive),
            Err(FieldError::NotSupported)
        );
        assert!(reading(&s, Field::GpuTemp).is_ok());
    }
    src.sample(&devs[1], &fields).unwrap();
    let s = src.sample(&devs[1], &fields).unwrap();
    assert!(reading(&s, Field::ProfSmActive).is_ok());
}

#[test]
fn call_budget_per_device_per_tick() {
    let counting = Counting::new(FakeNvml::new(
        "570.172.08",
        vec![FakeGpu::h100(0), FakeGpu::h100(1)],
    ));
    let counter = counting.counter();
    let src = NvmlSource::new(move || Ok(counting.clone()), NO_RETRY_WAIT);
    // Startup: init and the first discovery.
    let discovery: u64 = counter.take().values().sum();
    let devs = src.devices().unwrap();
    let rediscovery: u64 = counter.take().values().sum();
    let fields = default_fields();
    let tick = |counter: &counting::CallCounter| {
        for d in &devs {
            src.sample(d, &fields).unwrap();
        }
        counter.take()
    };
    let first = tick(&counter);
    let steady = tick(&counter);
    let per_gpu = |m: &BTreeMap<&'static str, u64>| m.values().sum::<u64>() / devs.len() as u64;
    let expected: BTreeMap<&'static str, u64> = [
        ("nvmlDeviceGetFieldValues", 2),
        ("nvmlDeviceGetClockInfo", 4),
        ("nvmlDeviceGetTemperature", 2),
        ("nvmlDeviceGetPowerUsage", 2),
        ("nvmlDeviceGetUtilizationRates", 2),
        ("nvmlDeviceGetEncoderUtilization", 2),
        ("nvmlDeviceGetDecoderUtilization", 2),
        ("nvmlDeviceGetMemoryInfo_v2", 2),
        ("nvmlDeviceGetCurrentClocksEventReasons", 2),
        ("nvmlGpmSampleGet", 2),
        ("nvmlGpmMetricsGet", 2),
    ]
    .into_iter()
    .collect();
    assert_eq!(steady, expected);
    assert_eq!(per_gpu(&steady), 12);
    // The first tick has no previous GPM sample to compare with.
    assert_eq!(per_gpu(&first), 11);
    // Discovery: 3 system calls, the count, then per GPU handle + UUID + PCI + minor + name +
    // 7 other statics + GPM query + MIG mode, and one event registration.
    assert_eq!(discovery, 3 + 1 + 2 * 14 + 1);
    // Re-discovery re-reads only the count, handles, UUIDs and MIG mode.
    assert_eq!(rediscovery, 1 + 2 * 3);
}

#[test]
fn mig_call_budget_adds_memory_and_gpm_per_instance() {
    let counting = Counting::new(FakeNvml::new("570.172.08", vec![mig_gpu()]));
    let counter = counting.counter();
    let src = NvmlSource::new(move || Ok(counting.clone()), NO_RETRY_WAIT);
    let d = src.devices().unwrap().remove(0);
    let fields = default_fields();
    src.sample(&d, &fields).unwrap();
    counter.take();
    src.sample(&d, &fields).unwrap();
    let steady = counter.take();
    // Per instance: one memory info and a GPM sample + metrics; the GPU itself skips
    // utilisation (3 calls: rates, encoder, decoder) in MIG mode.
    assert_eq!(steady.get("nvmlGpmMigSampleGet"), Some(&2));
    assert_eq!(steady.get("nvmlGpmMetricsGet"), Some(&3));
    assert_eq!(steady.get("nvmlDeviceGetMemoryInfo_v2"), Some(&3));
    assert_eq!(steady.get("nvmlDeviceGetUtilizationRates"), None);
    assert_eq!(steady.values().sum::<u64>(), 12 - 3 + 2 * 3);
}

#[test]
fn the_event_thread_survives_failed_waits_and_names_a_lost_gpu_without_asking_nvml() {
    let fake = FakeNvml::new("570.172.08", vec![FakeGpu::h100(0), FakeGpu::h100(1)]);
    let src = source(&fake);
    src.devices().unwrap();
    // GPU 1 falls off the bus: every call on it fails now, and the next waits fail too.
    fake.update(|st| st.gpus[1].lost = true);
    fake.fail_event_waits([ApiError::GpuLost, ApiError::GpuLost, ApiError::GpuLost]);
    assert!(fake.raise_xid("GPU-fake-0001", 79));
    assert!(fake.raise_xid("GPU-fake-0000", 13));
    assert!(src.wait_for_xids(2, Duration::from_secs(30)));
    let got: Vec<(String, u64)> = src
        .drain_xids()
        .into_iter()
        .map(|(u, x)| (u, x.xid))
        .collect();
    assert_eq!(
        got,
        [
            ("GPU-fake-0001".to_owned(), 79),
            ("GPU-fake-0000".to_owned(), 13)
        ]
    );
    // Three failures are not enough to give up on the set.
    assert_eq!(fake.event_sets_created(), 1);
}

#[test]
fn the_event_thread_registers_on_a_new_set_when_waits_keep_failing() {
    let fake = FakeNvml::new("570.172.08", vec![FakeGpu::h100(0), FakeGpu::h100(1)]);
    let src = source(&fake);
    src.devices().unwrap();
    fake.update(|st| st.gpus[0].lost = true);
    fake.fail_event_waits(
        std::iter::repeat_with(|| ApiError::Other("Unknown Error".into()))
            .take(events::REREGISTER_AFTER as usize),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while fake.event_sets_created() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "never registered again"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The lost GPU is left out of the new set; the other one reports.
    assert!(!fake.raise_xid("GPU-fake-0000", 48));
    assert!(fake.raise_xid("GPU-fake-0001", 31));
    assert!(src.wait_for_xids(1, Duration::from_secs(30)));
    let got: Vec<u64> = src.drain_xids().into_iter().map(|(_, x)| x.xid).collect();
    assert_eq!(got, [31]);
}

#[test]
fn a_stale_mig_handle_drops_the_instance_readings_and_asks_for_rediscovery() {
    let fake = FakeNvml::new("570.172.08", vec![mig_gpu()]);
    let src = source(&fake);
    let d = src.devices().unwrap().remove(0);
    let fields = [Field::FbUsed, Field::GpuTemp];
    assert_eq!(src.sample(&d, &fields).unwrap().instances.len(), 2);
    assert!(!src.wants_rediscovery());
    // GPU instance 2 (slot 0) is destroyed: its handle now answers NOT_FOUND.
    fake.update(|st| st.gpus[0].mig[0] = None);
    let s = src.sample(&d, &fields).unwrap();
    assert!(s.instances.is_empty(), "{s:?}");
    assert_eq!(reading(&s, Field::GpuTemp), Ok(Value::Int(45)));
    assert!(src.wants_rediscovery());
    assert!(!src.wants_rediscovery(), "reading the request clears it");
    let d = src.devices().unwrap().remove(0);
    let gis: Vec<u32> = d.instances.iter().map(|i| i.gi_id).collect();
    assert_eq!(gis, [1]);
    assert_eq!(src.sample(&d, &fields).unwrap().instances.len(), 1);
    assert!(!src.wants_rediscovery());
}

#[test]
fn vgpu_license_status_is_read_as_dcgm_reads_it_and_absent_on_bare_metal() {
    use super::api::GridLicensing;
    let guest = |supported: bool, features: &[(u32, u32)]| {
        let mut g = FakeGpu::h100(0);
        g.grid_licensing = Some(GridLicensing {
            supported,
            features: features.to_vec(),
        });
        g
    };
    let cases = [
        // Bare metal: NVML has no licensing; the series is absent and no error is counted.
        (FakeGpu::h100(0), Err(FieldError::NotSupported)),
        // A vGPU guest, licensed (any non-zero state), after another licensable feature.
        (guest(true, &[(2, 0), (1, 2)]), Ok(Value::Int(1))),
        // Unlicensed.
        (guest(true, &[(1, 0)]), Ok(Value::Int(0))),
        // Licensing does not apply: 0, as DCGM.
        (guest(false, &[]), Ok(Value::Int(0))),
        // No vGPU feature listed: no value, as DCGM.
        (guest(true, &[(2, 1)]), Err(FieldError::NotSupported)),
    ];
    for (i, (gpu, want)) in cases.into_iter().enumerate() {
        let fake = FakeNvml::new("570.172.08", vec![gpu]);
        let src = source(&fake);
        let d = src.devices().unwrap().remove(0);
        let s = src.sample(&d, &[Field::VgpuLicenseStatus]).unwrap();
        assert_eq!(reading(&s, Field::VgpuLicenseStatus), want, "case {i}");
    }
}
