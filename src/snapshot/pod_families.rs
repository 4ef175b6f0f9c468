//! Step 5, the families about pods rather than devices: who holds each GPU or MIG instance
//! (`gpu_exporter_gpu_pod_info`) and what each container's processes use there
//! (`gpu_exporter_container_*`), one series per container so that sums count each process once.

use std::sync::Arc;

use super::labels::Labels;
use super::model::Snapshot;
use crate::catalog::MetricType;
use crate::gpu::Value;
use crate::pods::usage::ContainerUsage;
use crate::render::{Family, Series};

/// Name of the family joining shared GPUs to their holders.
pub const POD_INFO: &str = "gpu_exporter_gpu_pod_info";

/// The per-container families, from per-process readings. Their own names, so that summing
/// them never counts a device value twice, as dcgm-exporter's extra copies of
/// `DCGM_FI_DEV_GPU_UTIL` and `DCGM_FI_DEV_FB_USED` do.
pub const CONTAINER_PROCESSES: &str = "gpu_exporter_container_processes";
/// Framebuffer used by a container's processes, bytes.
pub const CONTAINER_FB_USED: &str = "gpu_exporter_container_fb_used_bytes";
/// SM utilisation of a container's processes, %.
pub const CONTAINER_SM_UTIL: &str = "gpu_exporter_container_sm_utilization_percent";
/// Memory-controller utilisation of a container's processes, %.
pub const CONTAINER_MEM_UTIL: &str = "gpu_exporter_container_memory_utilization_percent";
/// Encoder utilisation of a container's processes, %.
pub const CONTAINER_ENC_UTIL: &str = "gpu_exporter_container_encoder_utilization_percent";
/// Decoder utilisation of a container's processes, %.
pub const CONTAINER_DEC_UTIL: &str = "gpu_exporter_container_decoder_utilization_percent";

/// Every per-container family, in exposition order.
pub const CONTAINER_FAMILIES: &[&str] = &[
    CONTAINER_PROCESSES,
    CONTAINER_FB_USED,
    CONTAINER_SM_UTIL,
    CONTAINER_MEM_UTIL,
    CONTAINER_ENC_UTIL,
    CONTAINER_DEC_UTIL,
];

/// The pod-info family (when some entity has a holder), then the per-container families, into
/// `snap`.
pub(super) fn families(labels: Labels<'_>, snap: &mut Snapshot) {
    if !labels.pod_info.is_empty() {
        snap.push(Family {
            name: POD_INFO.to_owned(),
            help: "Pods holding each GPU or MIG instance (one series per holder; join on UUID and GPU_I_ID)."
                .to_owned(),
            kind: MetricType::Gauge,
            series: labels
                .pod_info
                .into_iter()
                .map(|labels| Series {
                    labels,
                    value: Value::Int(1),
                })
                .collect(),
        });
    }
    for fam in container_families(&labels.containers) {
        snap.push(fam);
    }
}

/// One family per per-container measure, over every exported entity whose processes were read:
/// the entity's labels, then the container's `container`, `namespace`, `pod` (old names under
/// `-o`), `pod_uid` and pod labels. Not copied per holder, DRA claim or HPC job: one series per
/// container, so that sums over them count each process once.
fn container_families(rows: &[(Arc<str>, &ContainerUsage)]) -> Vec<Family> {
    type Measure = fn(&ContainerUsage) -> Option<Value>;
    let measures: [(&str, &str, Measure); 6] = [
        (
            CONTAINER_PROCESSES,
            "Processes of the container running on this GPU or MIG instance.",
            |c| Some(Value::Int(i64::from(c.processes))),
        ),
        (
            CONTAINER_FB_USED,
            "Framebuffer used by the container's processes on this GPU or MIG instance, in bytes (NVML per-process used memory, summed).",
            |c| c.fb_used_bytes.map(|b| Value::Int(i64::try_from(b).unwrap_or(i64::MAX))),
        ),
        (
            CONTAINER_SM_UTIL,
            "SM utilisation of the container's processes on this GPU since the previous sample (in %; NVML per-process samples, averaged per process, summed over processes).",
            |c| c.utilization.map(|u| Value::Int(i64::try_from(u.sm).unwrap_or(i64::MAX))),
        ),
        (
            CONTAINER_MEM_UTIL,
            "Memory-controller utilisation of the container's processes on this GPU since the previous sample (in %).",
            |c| c.utilization.map(|u| Value::Int(i64::try_from(u.memory).unwrap_or(i64::MAX))),
        ),
        (
            CONTAINER_ENC_UTIL,
            "Video encoder utilisation of the container's processes on this GPU since the previous sample (in %).",
            |c| c.utilization.map(|u| Value::Int(i64::try_from(u.encoder).unwrap_or(i64::MAX))),
        ),
        (
            CONTAINER_DEC_UTIL,
            "Video decoder utilisation of the container's processes on this GPU since the previous sample (in %).",
            |c| c.utilization.map(|u| Value::Int(i64::try_from(u.decoder).unwrap_or(i64::MAX))),
        ),
    ];
    measures
        .iter()
        .map(|(name, help, measure)| Family {
            name: (*name).to_owned(),
            help: (*help).to_owned(),
            kind: MetricType::Gauge,
            series: rows
                .iter()
                .filter_map(|(labels, c)| {
                    measure(c).map(|value| Series {
                        labels: Arc::clone(labels),
                        value,
                    })
                })
                .collect(),
        })
        .filter(|f| !f.series.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::usage::EntityUsage;
    use crate::pods::Attribution;
    use crate::snapshot::testkit::*;
    use crate::snapshot::{build, build_with};
    #[test]
    fn a_container_holding_one_entity_through_two_claims_has_one_info_series() {
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(
            key(0, None),
            vec![
                dra_holder("p", "one", "gpu-0"),
                dra_holder("p", "two", "gpu-0"),
            ],
        );
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let s = build(
            &cat(),
            &[outcome(device(0, "H100", &[]), 40, 1)],
            &att,
            &opts(),
        );
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temp.len(), 2);
        assert!(temp[0].contains(r#"dra_claim_name="one""#));
        assert!(temp[1].contains(r#"dra_claim_name="two""#));
        assert_eq!(lines(&s, POD_INFO).len(), 1);
    }

    #[test]
    fn container_families_have_their_own_names_and_the_entity_labels() {
        let mut w = workload(&[("a", "uid-a", &[("team", "t")]), ("b", "uid-b", &[])]);
        let u = EntityUsage {
            containers: vec![usage("a", Some(30), 100, &w), usage("b", Some(12), 50, &w)],
            complete: true,
        };
        w.usage.insert(gpu0(), u);
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(gpu0(), vec![holder("a", Some("0")), holder("b", Some("1"))]);
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let mut o = opts();
        o.pod_uid = true;
        let s = build_with(
            &cat(),
            &[outcome(device(0, "H100", &[]), 50, 1)],
            &att,
            &w,
            &o,
        );
        let sm = lines(&s, CONTAINER_SM_UTIL);
        assert_eq!(
            sm,
            [
                r#"gpu_exporter_container_sm_utilization_percent{gpu="0",UUID="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="H100",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container="c",namespace="ns",pod="a",pod_uid="uid-a",team="t"} 30"#,
                r#"gpu_exporter_container_sm_utilization_percent{gpu="0",UUID="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="H100",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container="c",namespace="ns",pod="b",pod_uid="uid-b"} 12"#,
            ]
        );
        let fb = lines(&s, CONTAINER_FB_USED);
        assert!(
            fb[0].ends_with(" 104857607") && fb[1].ends_with(" 52428807"),
            "{fb:?}"
        );
        assert_eq!(lines(&s, CONTAINER_PROCESSES).len(), 2);
        assert_eq!(lines(&s, CONTAINER_DEC_UTIL).len(), 2);
        // Shared GPU, default mode: device series unlabelled and unchanged.
        let fbd = lines(&s, "DCGM_FI_DEV_FB_USED");
        assert_eq!(fbd.len(), 1);
        assert!(fbd[0].ends_with("\"570.1\"} 1"), "{}", fbd[0]);
        // Without utilisation (MIG): no utilisation families, memory still there.
        let mut w2 = w.clone();
        w2.usage.get_mut(&gpu0()).unwrap().containers[0].utilization = None;
        w2.usage.get_mut(&gpu0()).unwrap().containers[1].utilization = None;
        let s = build_with(
            &cat(),
            &[outcome(device(0, "H100", &[]), 50, 1)],
            &att,
            &w2,
            &o,
        );
        assert!(lines(&s, CONTAINER_SM_UTIL).is_empty());
        assert_eq!(lines(&s, CONTAINER_FB_USED).len(), 2);
    }

    #[test]
    fn hpc_jobs_multiply_the_copies_but_not_the_per_container_series() {
        let mut w = workload(&[("a", "uid-a", &[])]);
        w.usage.insert(
            gpu0(),
            EntityUsage {
                containers: vec![usage("a", Some(30), 100, &w)],
                complete: true,
            },
        );
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(gpu0(), vec![holder("a", Some("0"))]);
        let mut jobs = std::collections::BTreeMap::new();
        jobs.insert(gpu0(), vec!["j1".to_owned(), "j2".to_owned()]);
        let att = Attribution {
            holders,
            jobs,
            ..Default::default()
        };
        let mut o = opts();
        o.virtual_gpus = true;
        o.pod_uid = true;
        let out = with_util(outcome(device(0, "H100", &[]), 50, 160), 99);
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &w, &o);
        let util = lines(&s, "DCGM_FI_DEV_GPU_UTIL");
        // The device-level series (dcgm-exporter 4.8.2+) are multiplied by the jobs too.
        assert_eq!(
            util,
            [
                r#"DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="H100",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",hpc_job="j1"} 99"#,
                r#"DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="H100",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",hpc_job="j2"} 99"#,
                r#"DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="H100",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container="c",hpc_job="j1",namespace="ns",pod="a",pod_uid="uid-a",vgpu="0"} 30"#,
                r#"DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="H100",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container="c",hpc_job="j2",namespace="ns",pod="a",pod_uid="uid-a",vgpu="0"} 30"#,
            ]
        );
        for fam in CONTAINER_FAMILIES {
            let l = lines(&s, fam);
            assert_eq!(l.len(), 1, "{fam}: {l:#?}");
            assert!(!l[0].contains("hpc_job"), "{}", l[0]);
        }
    }
}
