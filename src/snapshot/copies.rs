//! Copies of an entity's series: one per DRA holder (with its claim), else one per holder with
//! `--kubernetes-virtual-gpus` (with `vgpu` and the holder's own use), else one (with a sole
//! holder's pod labels); each once per HPC job, and with `--container-labels` once more per
//! container running there. Each copy is a [`Variant`]: its attributes and its rendered label set.

use std::collections::HashSet;
use std::sync::Arc;

use super::labels::{render_pod_labels, DRA_LABELS};
use super::model::{BuildOptions, Names, Workload};
use crate::catalog::{Catalog, Field};
use crate::gpu::{MigInstance, Value};
use crate::pods::directory::PodMeta;
use crate::pods::usage::EntityUsage;
use crate::pods::{Attribution, DraClaim, Holder, PodRef};
use crate::render::push_label;

/// The per-copy attributes of an entity's series (pod attributes, `vgpu`): as pairs, to merge
/// with per-series attributes in name order; the pod's labels, rendered, to follow them; and
/// the entity's whole label set, rendered once and shared by every series of the entity that has
/// no other attributes (most of them).
pub(super) struct Variant {
    attrs: Vec<(&'static str, String)>,
    pod_labels: String,
    pub(super) full: Arc<str>,
    own: Option<Own>,
}

impl Variant {
    fn new(prefix: &str, mut attrs: Vec<(&'static str, String)>, pod_labels: String) -> Self {
        attrs.sort_by_key(|(k, _)| *k);
        let mut full = String::with_capacity(prefix.len() + 96 + pod_labels.len());
        full.push_str(prefix);
        for (k, v) in &attrs {
            push_label(&mut full, k, v);
        }
        full.push_str(&pod_labels);
        Self {
            attrs,
            pod_labels,
            full: full.into(),
            own: None,
        }
    }

    /// The value this copy carries for `field`: the holder's own for the per-process fields
    /// (GPU utilisation and framebuffer used, in either naming generation's unit) when known,
    /// else the device's.
    pub(super) fn value(&self, field: Field, device: &Value) -> Value {
        let own = self.own.and_then(|o| match field {
            Field::GpuUtil => o.sm.map(Value::Int),
            // The newest generation's ratio: 0-1.
            Field::GpuUtilRatio => o.sm.map(|p| Value::Float(p as f64 / 100.0)),
            Field::FbUsed => o.fb_mib.map(Value::Int),
            Field::FbUsedBytes => o.fb_bytes.map(Value::Int),
            _ => None,
        });
        own.unwrap_or_else(|| device.clone())
    }
}

/// A holder's own use of a shared entity, replacing the device value of
/// `DCGM_FI_DEV_GPU_UTIL` and `DCGM_FI_DEV_FB_USED` in `--kubernetes-virtual-gpus` mode.
#[derive(Debug, Clone, Copy, Default)]
struct Own {
    /// SM utilisation, % (capped at 100).
    sm: Option<i64>,
    /// Framebuffer, MiB.
    fb_mib: Option<i64>,
    /// Framebuffer, bytes (for `DCGM_FI_DEV_FB_USED_BYTES`).
    fb_bytes: Option<i64>,
}

/// The fields whose per-pod copies carry each holder's own use with
/// `--kubernetes-virtual-gpus` (dcgm-exporter's `isPerProcessMetric`: GPU utilisation and
/// framebuffer used, here in either naming generation's unit).
pub(super) fn is_per_process(field: Field) -> bool {
    matches!(
        field,
        Field::GpuUtil | Field::GpuUtilRatio | Field::FbUsed | Field::FbUsedBytes
    )
}

/// The label set of one series: the variant's shared one, or, with per-series `extras`, prefix +
/// the sorted merge of `extras` and the variant's attributes.
pub(super) fn series_labels(
    prefix: &str,
    extras: &[(&'static str, String)],
    variant: &Variant,
) -> Arc<str> {
    if extras.is_empty() {
        return Arc::clone(&variant.full);
    }
    let mut s = String::with_capacity(variant.full.len() + 64);
    s.push_str(prefix);
    let mut attrs: Vec<&(&'static str, String)> = extras.iter().chain(&variant.attrs).collect();
    attrs.sort_by_key(|(k, _)| *k);
    for (k, v) in attrs {
        push_label(&mut s, k, v);
    }
    s.push_str(&variant.pod_labels);
    s.into()
}

/// What every entity's labels are built from.
pub(super) struct Ctx<'a> {
    pub(super) catalog: &'a Catalog,
    pub(super) attribution: &'a Attribution,
    pub(super) workload: &'a Workload,
    pub(super) opts: &'a BuildOptions,
    pub(super) names: Names,
    pub(super) reserved: &'a HashSet<String>,
}

impl Ctx<'_> {
    pub(super) fn meta(&self, pod: &PodRef) -> Option<&PodMeta> {
        self.workload
            .directory
            .pod(&pod.namespace, &pod.pod)
            .map(AsRef::as_ref)
    }

    /// `container`, `namespace`, `pod` (their old names under `-o`) and, when asked for and
    /// known, `pod_uid` (which has no old name).
    pub(super) fn pod_attrs(&self, pod: &PodRef, uid: Option<&str>) -> Vec<(&'static str, String)> {
        let mut v = vec![
            (self.names.container, pod.container.clone()),
            (self.names.namespace, pod.namespace.clone()),
            (self.names.pod, pod.pod.clone()),
        ];
        if self.opts.pod_uid {
            if let Some(uid) = uid.filter(|u| !u.is_empty()) {
                v.push(("pod_uid", uid.to_owned()));
            }
        }
        v
    }

    /// The copies of an entity (a GPU or MIG `instance`, or a link of a GPU) held by `holders`,
    /// running `jobs`, with per-container `usage` when known: one per DRA holder (with its claim),
    /// else one (possibly empty) set, or one per holder with `--kubernetes-virtual-gpus`; each of
    /// these once per HPC job.
    pub(super) fn variants(
        &self,
        prefix: &str,
        holders: &[Holder],
        instance: Option<&MigInstance>,
        jobs: &[String],
        usage: Option<&EntityUsage>,
    ) -> Vec<Variant> {
        // As dcgm-exporter: one copy per DRA holder, with its claim, whatever the sharing mode.
        let dra: Vec<&Holder> = holders.iter().filter(|h| h.dra.is_some()).collect();
        // One container holding several replicas of a GPU is still a single holder.
        let sole = holders
            .first()
            .filter(|first| holders.iter().all(|h| h.pod == first.pod));
        let copies: Vec<Option<&Holder>> = match (holders, self.opts.virtual_gpus) {
            _ if !dra.is_empty() => dra.into_iter().map(Some).collect(),
            ([], _) => vec![None],
            (_, false) => vec![sole],
            (many, true) => many.iter().map(Some).collect(),
        };
        let mut out = Vec::with_capacity(copies.len() * jobs.len().max(1));
        for (i, copy) in copies.iter().enumerate() {
            let Some(h) = copy else {
                out.push((Vec::new(), String::new(), None));
                continue;
            };
            let meta = self.meta(&h.pod);
            let mut attrs = self.pod_attrs(&h.pod, meta.map(|m| m.uid.as_str()));
            match &h.dra {
                Some(c) => attrs.extend(dra_attrs(c, instance)),
                None if self.opts.virtual_gpus => {
                    if let Some(r) = &h.vgpu {
                        attrs.push(("vgpu", r.clone()));
                    }
                }
                None => {}
            }
            // With --kubernetes-virtual-gpus, each holder's copy carries its own use when every
            // process there was attributed. A container holding the entity several times (replicas,
            // claims) gets its value on its first copy and 0 on the others, so that summing over
            // copies counts it once.
            let own = usage
                .filter(|u| self.opts.virtual_gpus && u.complete)
                .map(|u| {
                    let repeat = copies[..i].iter().flatten().any(|e| e.pod == h.pod);
                    own_use(u, &h.pod, repeat)
                });
            out.push((attrs, render_pod_labels(meta, self.reserved), own));
        }
        // HPC jobs multiply the copies: one per job (dcgm-exporter applies them after the pods).
        if !jobs.is_empty() {
            out = out
                .into_iter()
                .flat_map(|(attrs, labels, own)| {
                    jobs.iter().map(move |j| {
                        let mut attrs = attrs.clone();
                        attrs.push(("hpc_job", j.clone()));
                        (attrs, labels.clone(), own)
                    })
                })
                .collect();
        }
        out.into_iter()
            .map(|(attrs, labels, own)| {
                let mut v = Variant::new(prefix, attrs, labels);
                v.own = own;
                v
            })
            .collect()
    }
}

/// A DRA holder's claim as dcgm-exporter's `dra_*` labels; on a MIG `instance`, also its UUID
/// and profile.
fn dra_attrs(c: &DraClaim, instance: Option<&MigInstance>) -> Vec<(&'static str, String)> {
    let [claim, claim_ns, device, driver, pool, mig_uuid, mig_profile] = DRA_LABELS;
    let mut v = vec![
        (claim, c.claim_name.clone()),
        (claim_ns, c.claim_namespace.clone()),
        (device, c.device.clone()),
        (driver, c.driver.clone()),
        (pool, c.pool.clone()),
    ];
    if let Some(i) = instance {
        v.push((mig_uuid, i.uuid.clone()));
        v.push((mig_profile, i.profile.clone()));
    }
    v
}

/// A holder's own use of an entity whose processes were all attributed.
fn own_use(usage: &EntityUsage, pod: &PodRef, repeat: bool) -> Own {
    let util_known = usage.containers.iter().all(|c| c.utilization.is_some());
    let nothing = Own {
        sm: util_known.then_some(0),
        fb_mib: Some(0),
        fb_bytes: Some(0),
    };
    match usage.of(pod) {
        _ if repeat => nothing,
        Some(c) => Own {
            sm: c
                .utilization
                .map(|u| i64::try_from(u.sm.min(100)).unwrap_or(100)),
            fb_mib: c.fb_used_mib.map(|m| i64::try_from(m).unwrap_or(i64::MAX)),
            fb_bytes: c
                .fb_used_bytes
                .map(|b| i64::try_from(b).unwrap_or(i64::MAX)),
        },
        // No process of the holder runs here: it uses nothing.
        None => nothing,
    }
}

/// dcgm-exporter's `--container-labels`: each variant, then one copy of it per container running
/// processes on the entity (by container name, once each), with a `container` label. Variants
/// that already name a container are left alone; the copies carry the entity's values.
pub(super) fn with_container_copies(
    prefix: &str,
    variants: Vec<Variant>,
    usage: &EntityUsage,
    names: Names,
) -> Vec<Variant> {
    let mut seen = HashSet::new();
    let containers: Vec<&str> = usage
        .containers
        .iter()
        .map(|c| c.pod.container.as_str())
        .filter(|n| !n.is_empty() && seen.insert(*n))
        .collect();
    if containers.is_empty() {
        return variants;
    }
    let mut out = Vec::with_capacity(variants.len() * (containers.len() + 1));
    for v in variants {
        let named = v
            .attrs
            .iter()
            .any(|(k, _)| *k == "container" || *k == names.container);
        let copies: Vec<Variant> = if named {
            Vec::new()
        } else {
            containers
                .iter()
                .map(|name| {
                    let mut attrs = v.attrs.clone();
                    attrs.push(("container", (*name).to_owned()));
                    let mut copy = Variant::new(prefix, attrs, v.pod_labels.clone());
                    copy.own = v.own;
                    copy
                })
                .collect()
        };
        out.push(v);
        out.extend(copies);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::catalog;
    use crate::catalog::Field;
    use crate::gpu::Value;
    use crate::pods::usage::EntityUsage;
    use crate::pods::{Attribution, EntityKey};
    use crate::snapshot::testkit::*;
    use crate::snapshot::{build, build_with, CONTAINER_SM_UTIL, POD_INFO};

    #[test]
    fn shared_gpus_get_pod_info_or_per_holder_copies_in_virtual_mode() {
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(
            EntityKey {
                gpu: 0,
                gi_id: None,
            },
            vec![holder("a", Some("0")), holder("b", Some("1"))],
        );
        holders.insert(
            EntityKey {
                gpu: 1,
                gi_id: None,
            },
            vec![holder("solo", None)],
        );
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let outcomes = [
            outcome(device(0, "H100", &[]), 50, 1),
            outcome(device(1, "H100", &[]), 51, 2),
        ];
        let s = build(&cat(), &outcomes, &att, &opts());
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temp.len(), 2);
        assert!(
            !temp[0].contains("pod="),
            "shared GPU keeps unlabelled series: {}",
            temp[0]
        );
        assert!(
            temp[1].ends_with(
                r#"DCGM_FI_DRIVER_VERSION="570.1",container="c",namespace="ns",pod="solo"} 51"#
            ),
            "{}",
            temp[1]
        );
        let info = lines(&s, POD_INFO);
        assert_eq!(info.len(), 3);
        assert!(info[0].contains(r#"pod="a",namespace="ns",container="c",vgpu="0""#));

        let mut o = opts();
        o.virtual_gpus = true;
        let temp = lines(&build(&cat(), &outcomes, &att, &o), "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temp.len(), 3);
        assert!(temp[0].contains(r#"pod="a",vgpu="0"} 50"#), "{}", temp[0]);
        assert!(temp[1].contains(r#"pod="b",vgpu="1"} 50"#));
    }

    #[test]
    fn dra_holders_get_one_copy_each_with_sorted_dra_labels_and_mig_details() {
        let mut holders = std::collections::BTreeMap::new();
        // GPU 1: a DRA claim shared by two pods, plus a device-plugin holder.
        holders.insert(
            key(1, None),
            vec![
                holder("classic", None),
                dra_holder("a", "shared", "gpu-1"),
                dra_holder("b", "shared", "gpu-1"),
            ],
        );
        // GPU 0's MIG instance 2.
        holders.insert(
            key(0, Some(2)),
            vec![dra_holder("m", "mig-claim", "gpu-0-mig-3g40gb-9-4")],
        );
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let outcomes = [
            outcome(device(0, "A100", &[(2, "3g.40gb"), (9, "1g.10gb")]), 50, 1),
            outcome(device(1, "A100", &[]), 51, 2),
        ];
        let s = build(&cat(), &outcomes, &att, &opts());
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temp.len(), 4, "{temp:#?}");
        assert!(
            temp[0].ends_with(r#"GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container="c",dra_claim_name="mig-claim",dra_claim_namespace="ns",dra_device_name="gpu-0-mig-3g40gb-9-4",dra_driver_name="gpu.nvidia.com",dra_mig_device_uuid="MIG-0-2",dra_mig_profile="3g.40gb",dra_pool_name="n1",namespace="ns",pod="m"} 50"#),
            "{}",
            temp[0]
        );
        // The unallocated instance is untouched.
        assert!(temp[1].contains(r#"GPU_I_ID="9""#) && !temp[1].contains("pod="));
        // The DRA holders of GPU 1 get a copy each; the device-plugin holder none.
        assert!(
            temp[2].ends_with(r#"DCGM_FI_DRIVER_VERSION="570.1",container="c",dra_claim_name="shared",dra_claim_namespace="ns",dra_device_name="gpu-1",dra_driver_name="gpu.nvidia.com",dra_pool_name="n1",namespace="ns",pod="a"} 51"#),
            "{}",
            temp[2]
        );
        assert!(temp[3].contains(r#"pod="b"} 51"#), "{}", temp[3]);
        // Everyone is in the info family, once per container.
        let info = lines(&s, POD_INFO);
        assert_eq!(info.len(), 4, "{info:#?}");
        assert!(info[0].contains(r#"GPU_I_ID="2",pod="m""#));
        assert!(info[1].contains(r#"pod="classic""#));
    }

    #[test]
    fn hpc_jobs_multiply_every_copy_and_sort_among_the_attributes() {
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(key(0, None), vec![holder("solo", None)]);
        let mut jobs = std::collections::BTreeMap::new();
        jobs.insert(key(0, None), vec!["1001".to_owned(), "1002".to_owned()]);
        // A plain file for a MIG GPU does not reach its instances, and vice versa.
        jobs.insert(key(1, None), vec!["x".to_owned()]);
        jobs.insert(key(1, Some(9)), vec!["77".to_owned()]);
        let att = Attribution {
            holders,
            jobs,
            ..Default::default()
        };
        let cat = catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_XID_ERRORS, gauge, x\nDCGM_EXP_GPU_HEALTH_STATUS, gauge, h\nDCGM_FI_DRIVER_VERSION, label, d\n",
            "t.csv",
        )
        .unwrap()
        .0;
        let outcomes = [
            outcome(device(0, "H100", &[]), 40, 1),
            outcome(device(1, "A100", &[(2, "3g.40gb"), (9, "1g.10gb")]), 41, 1),
        ];
        let s = build(&cat, &outcomes, &att, &opts());
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temp.len(), 4, "{temp:#?}");
        assert!(
            temp[0].ends_with(r#"container="c",hpc_job="1001",namespace="ns",pod="solo"} 40"#),
            "{}",
            temp[0]
        );
        assert!(temp[1].ends_with(r#"container="c",hpc_job="1002",namespace="ns",pod="solo"} 40"#));
        assert!(!temp[2].contains("hpc_job"), "{}", temp[2]);
        assert!(temp[3].contains(r#"GPU_I_ID="9""#) && temp[3].ends_with(r#"hpc_job="77"} 41"#));
        // Per-series attributes merge in name order.
        let xid = lines(&s, "DCGM_FI_DEV_XID_ERRORS");
        assert!(xid[0].ends_with(r#"container="c",err_code="0",err_msg="No Error",hpc_job="1001",namespace="ns",pod="solo"} 0"#), "{}", xid[0]);
        // Health series are about the hardware: no workload labels.
        assert!(lines(&s, "DCGM_EXP_GPU_HEALTH_STATUS")
            .iter()
            .all(|l| !l.contains("hpc_job") && !l.contains("pod=")));
    }

    #[test]
    fn virtual_gpus_carry_each_holders_own_util_and_memory() {
        let mut w = workload(&[
            ("a", "uid-a", &[]),
            ("b", "uid-b", &[]),
            ("idle", "uid-i", &[]),
        ]);
        w.usage.insert(
            gpu0(),
            EntityUsage {
                containers: vec![usage("a", Some(130), 100, &w), usage("b", Some(12), 50, &w)],
                complete: true,
            },
        );
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(
            gpu0(),
            vec![
                holder("a", Some("0")),
                holder("a", Some("3")),
                holder("b", Some("1")),
                holder("idle", Some("2")),
            ],
        );
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let mut o = opts();
        o.virtual_gpus = true;
        let mut out = outcome(device(0, "H100", &[]), 50, 160);
        if let Ok(sample) = &mut out.sample {
            sample.readings.retain(|(f, _)| *f != Field::GpuUtil);
            sample.readings.push((Field::GpuUtil, Ok(Value::Int(99))));
        }
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &w, &o);
        let value = |l: &str| l.rsplit(' ').next().unwrap().to_owned();
        let util: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_UTIL")
            .iter()
            .map(|l| value(l))
            .collect();
        // As dcgm-exporter 4.8.2+: the device-level series first (no pod labels, the device's
        // value), then a (capped at 100), a's second replica 0, b, the idle holder 0.
        assert_eq!(util, ["99", "100", "0", "12", "0"]);
        let device_level = &lines(&s, "DCGM_FI_DEV_GPU_UTIL")[0];
        assert!(
            !device_level.contains("pod=") && !device_level.contains("vgpu="),
            "{device_level}"
        );
        let fb: Vec<String> = lines(&s, "DCGM_FI_DEV_FB_USED")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(fb, ["160", "100", "0", "50", "0"]);
        // Other fields stay copies, without a device-level series.
        let temp: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_TEMP")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(temp, ["50", "50", "50", "50"]);
        assert!(lines(&s, "DCGM_FI_DEV_GPU_TEMP")
            .iter()
            .all(|l| l.contains("pod=")));

        // An incomplete entity (a process not attributed) keeps the device's value everywhere.
        w.usage.get_mut(&gpu0()).unwrap().complete = false;
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &w, &o);
        let util: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_UTIL")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(util, ["99", "99", "99", "99", "99"]);
        // No usage at all (per-process attribution off or failed): copies too.
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &workload(&[]), &o);
        let fb: Vec<String> = lines(&s, "DCGM_FI_DEV_FB_USED")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(fb, ["160", "160", "160", "160", "160"]);
    }

    #[test]
    fn dra_copies_carry_pod_uid_labels_and_in_virtual_mode_their_own_use() {
        let mut w = workload(&[("a", "uid-a", &[("team", "t")]), ("b", "uid-b", &[])]);
        w.usage.insert(
            gpu0(),
            EntityUsage {
                containers: vec![usage("a", Some(30), 100, &w), usage("b", Some(12), 50, &w)],
                complete: true,
            },
        );
        let mut holders = std::collections::BTreeMap::new();
        // A claim shared by a and b, and a second claim of a on the same GPU.
        holders.insert(
            gpu0(),
            vec![
                dra_holder("a", "shared", "gpu-0"),
                dra_holder("a", "second", "gpu-0"),
                dra_holder("b", "shared", "gpu-0"),
            ],
        );
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let mut o = opts();
        o.pod_uid = true;
        let out = with_util(outcome(device(0, "H100", &[]), 50, 160), 99);
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &w, &o);
        let util = lines(&s, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(util.len(), 3);
        assert!(
            util[0].ends_with(r#"container="c",dra_claim_name="shared",dra_claim_namespace="ns",dra_device_name="gpu-0",dra_driver_name="gpu.nvidia.com",dra_pool_name="n1",namespace="ns",pod="a",pod_uid="uid-a",team="t"} 99"#),
            "{}",
            util[0]
        );
        // Without --kubernetes-virtual-gpus the copies carry the device's values.
        assert!(util.iter().all(|l| l.ends_with(" 99")), "{util:#?}");
        let value = |l: &String| l.rsplit(' ').next().unwrap().to_owned();
        o.virtual_gpus = true;
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &w, &o);
        let util: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_UTIL")
            .iter()
            .map(value)
            .collect();
        // a's first claim, a's second claim (counted once), b. No `vgpu` on DRA copies.
        assert_eq!(util, ["30", "0", "12"]);
        let fb: Vec<String> = lines(&s, "DCGM_FI_DEV_FB_USED").iter().map(value).collect();
        assert_eq!(fb, ["100", "0", "50"]);
        assert!(lines(&s, "DCGM_FI_DEV_GPU_TEMP")
            .iter()
            .all(|l| l.ends_with(" 50") && !l.contains("vgpu")));
        // The per-container series: one per container, no claim, whatever the copies.
        let sm = lines(&s, CONTAINER_SM_UTIL);
        assert_eq!(sm.len(), 2);
        assert!(sm.iter().all(|l| !l.contains("dra_")), "{sm:#?}");
    }

    #[test]
    fn the_newest_generation_names_carry_own_use_in_their_units() {
        let mut w = workload(&[("a", "uid-a", &[]), ("b", "uid-b", &[])]);
        w.usage.insert(
            gpu0(),
            EntityUsage {
                containers: vec![usage("a", Some(30), 100, &w)],
                complete: true,
            },
        );
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(gpu0(), vec![holder("a", Some("0")), holder("b", Some("1"))]);
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let cat = catalog::parse(
            "DCGM_FI_DEV_GPU_UTIL_RATIO, gauge, u\nDCGM_FI_DEV_FB_USED_BYTES, gauge, f\n",
            "t.csv",
        )
        .unwrap()
        .0;
        let mut out = outcome(device(0, "H100", &[]), 50, 160);
        if let Ok(sample) = &mut out.sample {
            sample.readings = vec![
                (Field::GpuUtilRatio, Ok(Value::Float(0.99))),
                (Field::FbUsedBytes, Ok(Value::Int(160 << 20))),
            ];
        }
        let mut o = opts();
        o.virtual_gpus = true;
        let s = build_with(&cat, std::slice::from_ref(&out), &att, &w, &o);
        let value = |l: &String| l.rsplit(' ').next().unwrap().to_owned();
        let util: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_UTIL_RATIO")
            .iter()
            .map(value)
            .collect();
        assert_eq!(util, ["0.99", "0.3", "0"]);
        let fb: Vec<String> = lines(&s, "DCGM_FI_DEV_FB_USED_BYTES")
            .iter()
            .map(value)
            .collect();
        assert_eq!(
            fb,
            [
                (160 << 20).to_string(),
                (100 * 1_048_576 + 7).to_string(),
                "0".to_owned()
            ]
        );
    }
}
