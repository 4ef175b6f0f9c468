//! Tests of the simulated fleet.

use super::*;
use crate::catalog::Field;
use crate::gpu::sim::scenario;
use crate::gpu::{DeviceSample, FieldError, SourceError, Value};

fn fleet(profile: &str, scenario_text: &str) -> SimulatedSource {
    let sc = scenario::parse(scenario_text, "t.toml").unwrap();
    SimulatedSource::new(profile, 1, Duration::from_secs(10), sc, "t.toml").unwrap()
}

fn int(s: &DeviceSample, f: Field) -> i64 {
    s.get_i64(f).unwrap()
}

#[test]
fn is_deterministic_for_a_seed() {
    let a = fleet("8xH100-SXM", "");
    let b = fleet("8xH100-SXM", "");
    let da = a.devices().unwrap();
    assert_eq!(da, b.devices().unwrap());
    for _ in 0..3 {
        for d in &da {
            assert_eq!(
                a.sample(d, Field::ALL).unwrap(),
                b.sample(d, Field::ALL).unwrap()
            );
        }
    }
}

#[test]
fn values_stay_consistent_over_time() {
    let s = fleet("8xH100-SXM", "");
    let devices = s.devices().unwrap();
    for d in &devices {
        let mut prev_energy = 0;
        let mut prev_sbe = 0;
        for _ in 0..50 {
            let x = s.sample(d, Field::ALL).unwrap();
            assert_eq!(
                int(&x, Field::FbUsed) + int(&x, Field::FbFree) + int(&x, Field::FbReserved),
                int(&x, Field::FbTotal)
            );
            let e = int(&x, Field::TotalEnergyConsumption);
            assert!(e > prev_energy);
            prev_energy = e;
            let sbe = int(&x, Field::EccSbeVolTotal);
            assert!(sbe >= prev_sbe);
            prev_sbe = sbe;
            let util = int(&x, Field::GpuUtil);
            assert!((0..=100).contains(&util));
            let Some(Value::Float(p)) = x.get(Field::PowerUsage) else {
                panic!()
            };
            assert!(*p >= 72.0 && *p <= 700.0);
        }
    }
}

#[test]
fn power_follows_utilization() {
    let s = fleet(
        "8xH100-SXM",
        "[[event]]\nat=\"0s\"\ngpu=0\naction=\"utilization\"\nvalue=0\n[[event]]\nat=\"0s\"\ngpu=1\naction=\"utilization\"\nvalue=100\n",
    );
    let d = s.devices().unwrap();
    let idle = s.sample(&d[0], Field::ALL).unwrap();
    let busy = s.sample(&d[1], Field::ALL).unwrap();
    let p = |x: &DeviceSample| match x.get(Field::PowerUsage) {
        Some(Value::Float(v)) => *v,
        _ => panic!(),
    };
    assert!(p(&busy) > 4.0 * p(&idle));
    assert_eq!(int(&idle, Field::GpuUtil), 0);
}

#[test]
fn scenario_events_take_effect_on_time() {
    let s = fleet(
        "8xH100-SXM",
        "[[event]]\nat=\"20s\"\ngpu=3\naction=\"fall-off-bus\"\n[[event]]\nat=\"40s\"\ngpu=3\naction=\"recover\"\n[[event]]\nat=\"10s\"\ngpu=1\naction=\"ecc-dbe\"\ncount=2\n[[event]]\nat=\"0s\"\ngpu=2\naction=\"thermal-throttle\"\ntemperature=95\nduration=\"30s\"\n",
    );
    let d = s.devices().unwrap();
    // t=0, 10s: fine; t=20s, 30s: lost; t=40s: back.
    assert!(s.sample(&d[3], Field::ALL).is_ok());
    assert!(s.sample(&d[3], Field::ALL).is_ok());
    assert!(matches!(
        s.sample(&d[3], Field::ALL),
        Err(SourceError::GpuLost { index: 3, .. })
    ));
    let uuid3 = d[3].identity.uuid.clone();
    assert_eq!(s.drain_xids(), vec![(uuid3, XidEvent { xid: 79 })]);
    assert!(s.sample(&d[3], Field::ALL).is_err());
    assert!(s.sample(&d[3], Field::ALL).is_ok());

    let first = s.sample(&d[1], Field::ALL).unwrap();
    assert_eq!(int(&first, Field::EccDbeVolTotal), 0);
    let second = s.sample(&d[1], Field::ALL).unwrap();
    assert_eq!(int(&second, Field::EccDbeVolTotal), 2);
    assert_eq!(
        s.drain_xids(),
        vec![(d[1].identity.uuid.clone(), XidEvent { xid: 48 })]
    );

    let hot = s.sample(&d[2], Field::ALL).unwrap();
    assert_eq!(int(&hot, Field::GpuTemp), 95);
    assert_eq!(int(&hot, Field::ClocksEventReasons) & 0x40, 0x40);
}

#[test]
fn scale_profiles_have_distinct_identities() {
    let big = fleet("64xH100-SXM", "").devices().unwrap();
    assert_eq!(big.len(), 64);
    let mut buses: Vec<&str> = big.iter().map(|d| d.identity.pci_bus_id.as_str()).collect();
    buses.sort_unstable();
    buses.dedup();
    assert_eq!(buses.len(), 64, "PCI bus ids repeat");
    assert_eq!(big[9].identity.pci_bus_id, "00000001:2A:00.0");

    let mig = fleet("8xA100-80GB-7xMIG", "").devices().unwrap();
    assert_eq!(mig.len(), 8);
    for d in &mig {
        assert!(d.mig_enabled);
        let ids: Vec<u32> = d.instances.iter().map(|i| i.gi_id).collect();
        assert_eq!(ids, (7..14).collect::<Vec<_>>());
    }
    let mut uuids: Vec<&str> = mig
        .iter()
        .flat_map(|d| d.instances.iter().map(|i| i.uuid.as_str()))
        .collect();
    uuids.sort_unstable();
    uuids.dedup();
    assert_eq!(uuids.len(), 56, "MIG UUIDs repeat");
}

#[test]
fn mig_profile_has_instances_and_no_gpu_utilization() {
    let s = fleet("4xA100-80GB-MIG", "");
    let d = s.devices().unwrap();
    assert_eq!(d[0].instances.len(), 4);
    assert!(d[0].mig_enabled);
    assert!(!d[3].mig_enabled);
    assert_eq!(d[0].instances[0].profile, "3g.40gb");
    assert!(d[0].instances[0].uuid.starts_with("MIG-"));
    let x = s.sample(&d[0], Field::ALL).unwrap();
    assert!(x.get(Field::GpuUtil).is_none());
    assert_eq!(x.instances.len(), 4);
    let fb = |f| {
        x.instances[0]
            .readings
            .iter()
            .find(|(g, _)| *g == f)
            .and_then(|(_, r)| r.clone().ok())
    };
    let (Some(Value::Int(used)), Some(Value::Int(free)), Some(Value::Int(total))) =
        (fb(Field::FbUsed), fb(Field::FbFree), fb(Field::FbTotal))
    else {
        panic!()
    };
    assert_eq!(used + free, total);
}

#[test]
fn profiling_fields_only_where_a_real_source_serves_them() {
    use crate::gpu::FieldGap;
    let prof: Vec<Field> = Field::ALL
        .iter()
        .copied()
        .filter(|f| f.is_profiling())
        .collect();
    assert!(prof.contains(&Field::ProfGrEngineActive));
    // Hopper: NVML GPM serves them (the NVLink ones need NVLinks, which the H100 has).
    let h100 = fleet("8xH100-SXM", "");
    let d = h100.devices().unwrap();
    let x = h100.sample(&d[0], Field::ALL).unwrap();
    for &f in &prof {
        assert!(x.get(f).is_some(), "{f:?} missing on an H100");
        assert_eq!(h100.field_gap(&d[0], f), None);
    }
    // Ampere (whole GPUs and MIG instances): no GPM and no DCGM source, so none.
    for profile in ["1xA100-40GB", "4xA100-80GB-MIG"] {
        let a100 = fleet(profile, "");
        for d in a100.devices().unwrap() {
            let x = a100.sample(&d, Field::ALL).unwrap();
            for &f in &prof {
                assert_eq!(a100.field_gap(&d, f), Some(FieldGap::ProfilingNeedsDcgm));
                if let Some((_, r)) = x.readings.iter().find(|(g, _)| *g == f) {
                    assert_eq!(*r, Err(FieldError::NotSupported), "{profile} {f:?}");
                }
                for inst in &x.instances {
                    if let Some((_, r)) = inst.readings.iter().find(|(g, _)| *g == f) {
                        assert_eq!(*r, Err(FieldError::NotSupported), "{profile} {f:?}");
                    }
                }
            }
            assert_eq!(a100.field_gap(&d, Field::GpuTemp), None);
            // Other instance fields are still there.
            for inst in &x.instances {
                assert!(inst
                    .readings
                    .iter()
                    .any(|(f, r)| *f == Field::FbUsed && r.is_ok()));
            }
        }
    }
}

#[test]
fn a_simulated_dcgm_hostengine_serves_profiling_fields_on_a100s() {
    let prof: Vec<Field> = Field::ALL
        .iter()
        .copied()
        .filter(|f| f.is_profiling())
        .collect();
    for profile in ["1xA100-40GB", "4xA100-80GB-MIG"] {
        let a100 = fleet(profile, "").with_dcgm(true);
        for d in a100.devices().unwrap() {
            let x = a100.sample(&d, Field::ALL).unwrap();
            for &f in &prof {
                assert_eq!(a100.field_gap(&d, f), None, "{profile} {f:?}");
            }
            if d.mig_enabled {
                for inst in &x.instances {
                    let r = inst
                        .readings
                        .iter()
                        .find(|(f, _)| *f == Field::ProfGrEngineActive)
                        .map(|(_, r)| r.clone());
                    assert!(matches!(r, Some(Ok(Value::Float(_)))), "{profile}: {r:?}");
                }
            } else {
                assert!(
                    matches!(x.get(Field::ProfGrEngineActive), Some(Value::Float(_))),
                    "{profile}"
                );
                assert!(x.get(Field::ProfPcieTxBytes).is_some(), "{profile}");
            }
        }
    }
}

#[test]
fn rejects_unknown_profile_and_missing_gpu() {
    let e = SimulatedSource::new(
        "9xB300",
        1,
        Duration::from_secs(1),
        Scenario::default(),
        "-",
    )
    .unwrap_err();
    assert!(e.to_string().contains("8xH100-SXM"));
    let sc = scenario::parse(
        "[[event]]\nat=\"0s\"\ngpu=5\naction=\"recover\"\n",
        "x.toml",
    )
    .unwrap();
    let e =
        SimulatedSource::new("1xA100-40GB", 1, Duration::from_secs(1), sc, "x.toml").unwrap_err();
    assert_eq!(
        e.to_string(),
        "x.toml:1: GPU 5 does not exist in profile 1xA100-40GB (1 GPUs)"
    );
}

#[test]
fn uuids_look_like_nvml_uuids() {
    let u = uuid("GPU", 1, 0, 0);
    assert_eq!(u.len(), 40);
    assert_eq!(u.matches('-').count(), 5);
}

#[test]
fn processes_share_their_gpus_use_by_weight() {
    let proc = |pid, gpu, gi_id, weight| SimProcess {
        pid,
        gpu,
        gi_id,
        weight,
    };
    let s = fleet("4xA100-80GB-MIG", "")
        .with_processes(vec![
            proc(1, 3, None, 3.0),
            proc(2, 3, None, 2.0),
            proc(3, 3, None, 1.0),
            proc(4, 0, Some(2), 1.0),
            proc(5, 0, Some(2), 1.0),
        ])
        .unwrap();
    let d = s.devices().unwrap();
    // Before the first sample there is nothing to share.
    assert!(s.processes(&d[3]).unwrap().is_empty());
    for _ in 0..5 {
        let x = s.sample(&d[3], Field::ALL).unwrap();
        let ps = s.processes(&d[3]).unwrap();
        assert_eq!(ps.len(), 3);
        let mib: i64 = ps
            .iter()
            .map(|p| (p.used_memory_bytes.unwrap() / 1_048_576) as i64)
            .sum();
        assert_eq!(mib, int(&x, Field::FbUsed));
        let sm: i64 = ps
            .iter()
            .map(|p| i64::from(p.utilization.unwrap().sm))
            .sum();
        assert!(
            (sm - int(&x, Field::GpuUtil)).abs() <= 2,
            "{sm} vs {}",
            int(&x, Field::GpuUtil)
        );
        // 3:2:1.
        let a = ps[0].utilization.unwrap().sm;
        let c = ps[2].utilization.unwrap().sm;
        assert!(a + 1 >= 3 * c && a <= 3 * c + 3, "{a} vs {c}");
    }
    let x = s.sample(&d[0], Field::ALL).unwrap();
    let ps = s.processes(&d[0]).unwrap();
    assert_eq!(
        ps.iter().map(|p| p.gi_id).collect::<Vec<_>>(),
        [Some(2), Some(2)]
    );
    assert!(ps.iter().all(|p| p.utilization.is_none()));
    let inst = x.instances.iter().find(|i| i.gi_id == 2).unwrap();
    let Some((_, Ok(Value::Int(used)))) = inst.readings.iter().find(|(f, _)| *f == Field::FbUsed)
    else {
        panic!()
    };
    let total: u64 = ps
        .iter()
        .map(|p| p.used_memory_bytes.unwrap() / 1_048_576)
        .sum();
    assert_eq!(total as i64, *used);
    // GPUs without processes have none.
    s.sample(&d[1], Field::ALL).unwrap();
    assert!(s.processes(&d[1]).unwrap().is_empty());
}

#[test]
fn processes_must_name_real_entities() {
    let p = |gpu, gi_id| SimProcess {
        pid: 9,
        gpu,
        gi_id,
        weight: 1.0,
    };
    let e = |procs| {
        fleet("4xA100-80GB-MIG", "")
            .with_processes(procs)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        e(vec![p(7, None)]),
        "simulated process 9: GPU 7 does not exist in profile 4xA100-80GB-MIG"
    );
    assert!(e(vec![p(0, Some(4))]).contains("MIG instance 4 of GPU 0"));
    assert!(e(vec![p(0, None)]).contains("has MIG enabled"));
    assert!(e(vec![p(3, Some(0))]).contains("MIG instance 0 of GPU 3"));
}

#[test]
fn huge_scenario_counts_saturate_instead_of_overflowing() {
    // Issue 35 item 13: two events of i64::MAX errors overflowed the i64 counters (a panic in
    // a debug build, a negative count in a release one). Files are capped at
    // scenario::MAX_COUNT; a scenario built in code still saturates.
    use crate::gpu::sim::scenario::{Action, Event, Scenario, Target};
    let ev = |action| Event {
        at: Duration::ZERO,
        target: Target::All,
        action,
        line: 1,
    };
    let mut events = Vec::new();
    for _ in 0..2 {
        events.push(ev(Action::EccDbe(u64::MAX)));
        events.push(ev(Action::EccSbe(u64::MAX)));
        events.push(ev(Action::PcieReplays(u64::MAX)));
        events.push(ev(Action::NvlinkErrors(u64::MAX)));
    }
    let sc = Scenario {
        events,
        ..Scenario::default()
    };
    let s = SimulatedSource::new("8xH100-SXM", 1, Duration::from_secs(10), sc, "t.toml").unwrap();
    let d = s.devices().unwrap().remove(0);
    for _ in 0..3 {
        let x = s.sample(&d, Field::ALL).unwrap();
        for f in [
            Field::EccDbeVolTotal,
            Field::EccSbeVolTotal,
            Field::EccDbeAggTotal,
            Field::EccSbeAggTotal,
            Field::PcieReplayCounter,
            Field::NvlinkCrcFlitErrorCountTotal,
        ] {
            assert_eq!(int(&x, f), i64::MAX, "{f:?}");
        }
        assert!(int(&x, Field::NvlinkReplayErrorCountTotal) > 0);
    }
}
