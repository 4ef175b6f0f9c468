//! The fixtures the snapshot tests share: devices, their outcomes, options, a small catalog,
//! holders, a pod directory and per-container usage, and the rendered lines of a family.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::{self, Catalog, Field};
use crate::gpu::{
    Device, DeviceSample, FieldError, GpuIdentity, InstanceSample, LinkSample, MigInstance, Value,
};
use crate::health::Recent;
use crate::pods::directory::PodDirectory;
use crate::pods::usage::ContainerUsage;
use crate::pods::{DraClaim, EntityKey, Holder, PodRef};
use crate::snapshot::{BuildOptions, DeviceOutcome, DeviceSelection, Snapshot, Workload};

pub(super) fn device(index: u32, model: &str, instances: &[(u32, &str)]) -> Device {
    Device {
        identity: GpuIdentity {
            index,
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("00000000:{index:02X}:00.0"),
            minor: index,
            model: model.to_owned(),
        },
        mig_enabled: !instances.is_empty(),
        instances: instances
            .iter()
            .map(|&(gi_id, profile)| MigInstance {
                gi_id,
                ci_id: 0,
                profile: profile.to_owned(),
                uuid: format!("MIG-{index}-{gi_id}"),
                placement: None,
            })
            .collect(),
    }
}

pub(super) fn outcome(d: Device, temp: i64, fb: i64) -> DeviceOutcome {
    let instances = d
        .instances
        .iter()
        .map(|i| InstanceSample {
            gi_id: i.gi_id,
            readings: vec![(Field::FbUsed, Ok(Value::Int(fb + i64::from(i.gi_id))))],
        })
        .collect();
    DeviceOutcome {
        device: d,
        sample: Ok(DeviceSample {
            readings: vec![
                (Field::GpuTemp, Ok(Value::Int(temp))),
                (Field::FbUsed, Ok(Value::Int(fb))),
                (Field::GpuUtil, Err(FieldError::NoPermission)),
            ],
            instances,
            links: Vec::new(),
        }),
        recent: Recent::default(),
        labels: vec![(Field::DriverVersion, Value::Text("570.1".into()))],
    }
}

pub(super) fn opts() -> BuildOptions {
    BuildOptions {
        hostname_label: "hostname".into(),
        hostname: "n1".into(),
        replace_blanks_in_model_name: false,
        selection: DeviceSelection::Flex,
        virtual_gpus: false,
        xid_window_ms: 300_000,
        clock_window_ms: 300_000,
        old_namespace: false,
        pod_uid: false,
        container_labels: false,
    }
}

pub(super) fn cat() -> Catalog {
    catalog::parse(
        "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_FB_USED, gauge, f\nDCGM_FI_DEV_GPU_UTIL, gauge, u\nDCGM_FI_DRIVER_VERSION, label, d\n",
        "t.csv",
    )
    .unwrap()
    .0
}

pub(super) fn lines(s: &Snapshot, name: &str) -> Vec<String> {
    s.families
        .iter()
        .filter(|f| f.name == name)
        .flat_map(|f| {
            f.series
                .iter()
                .map(|x| format!("{}{{{}}} {}", f.name, x.labels, x.value))
        })
        .collect()
}

pub(super) fn holder(pod: &str, vgpu: Option<&str>) -> Holder {
    Holder {
        pod: PodRef {
            namespace: "ns".into(),
            pod: pod.into(),
            container: "c".into(),
        },
        vgpu: vgpu.map(str::to_owned),
        dra: None,
    }
}

pub(super) fn with_links(mut o: DeviceOutcome, links: &[(u32, i64)]) -> DeviceOutcome {
    if let Ok(s) = &mut o.sample {
        s.links = links
            .iter()
            .map(|&(link, v)| LinkSample {
                link,
                readings: vec![(Field::NvlinkReplayErrorPerLinkTotal, Ok(Value::Int(v)))],
            })
            .collect();
    }
    o
}

pub(super) fn dra_holder(pod: &str, claim: &str, device: &str) -> Holder {
    Holder {
        dra: Some(DraClaim {
            claim_name: claim.into(),
            claim_namespace: "ns".into(),
            driver: "gpu.nvidia.com".into(),
            pool: "n1".into(),
            device: device.into(),
        }),
        ..holder(pod, None)
    }
}

pub(super) fn key(gpu: u32, gi_id: Option<u32>) -> EntityKey {
    EntityKey { gpu, gi_id }
}

/// (pod name, UID, labels).
pub(super) type TestPod<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

pub(super) fn workload(pods: &[TestPod<'_>]) -> Workload {
    use crate::pods::cri_proto::PodSandbox;
    use crate::pods::cri_proto::PodSandboxMetadata;
    use crate::pods::directory::{LabelOptions, RuntimeSnapshot};
    let sandboxes = pods
        .iter()
        .map(|(name, uid, labels)| PodSandbox {
            id: format!("sb-{name}"),
            metadata: Some(PodSandboxMetadata {
                name: (*name).into(),
                uid: (*uid).into(),
                namespace: "ns".into(),
                attempt: 0,
            }),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        })
        .collect();
    let dir = PodDirectory::from_runtime(
        &RuntimeSnapshot {
            sandboxes,
            containers: vec![],
        },
        &LabelOptions {
            enabled: true,
            allowlist: vec![],
        },
    );
    Workload {
        directory: Arc::new(dir),
        usage: BTreeMap::new(),
    }
}

pub(super) fn usage(pod: &str, sm: Option<u64>, mib: u64, w: &Workload) -> ContainerUsage {
    let meta = w.directory.pod("ns", pod).cloned().unwrap_or_default();
    ContainerUsage {
        pod: PodRef {
            namespace: "ns".into(),
            pod: pod.into(),
            container: "c".into(),
        },
        meta,
        processes: 1,
        fb_used_bytes: Some(mib * 1_048_576 + 7),
        fb_used_mib: Some(mib),
        utilization: sm.map(|sm| crate::pods::usage::UtilizationSum {
            sm,
            memory: sm / 2,
            encoder: 0,
            decoder: 0,
        }),
    }
}

pub(super) fn gpu0() -> EntityKey {
    EntityKey {
        gpu: 0,
        gi_id: None,
    }
}

pub(super) fn with_util(mut o: DeviceOutcome, util: i64) -> DeviceOutcome {
    if let Ok(sample) = &mut o.sample {
        sample.readings.retain(|(f, _)| *f != Field::GpuUtil);
        sample.readings.push((Field::GpuUtil, Ok(Value::Int(util))));
    }
    o
}
