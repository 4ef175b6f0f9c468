//! Step 2, which copies (attribution): an entity's series are copied once per DRA holder (with
//! its claim), else once per holder with `--kubernetes-virtual-gpus` (with `vgpu` and the
//! holder's own use), else once (with a sole holder's pod attributes); each once per HPC job, and
//! with `--container-labels` once more per container running there. Each copy is a [`Variant`]:
//! its attributes, the pod whose labels it carries, and its holder's own use. Also who holds
//! each entity (for the pod-info family) and which containers run processes there (for the
//! per-container families).

use std::collections::HashSet;

use super::entities::{Entities, Entity};
use super::model::{BuildOptions, Names, Workload};
use crate::gpu::MigInstance;
use crate::pods::directory::PodMeta;
use crate::pods::usage::{ContainerUsage, EntityUsage};
use crate::pods::{Attribution, DraClaim, EntityKey, Holder, PodRef};

/// The labels of a DRA holder's copies (dcgm-exporter's), the last two on MIG instances only.
pub(super) const DRA_LABELS: [&str; 7] = [
    "dra_claim_name",
    "dra_claim_namespace",
    "dra_device_name",
    "dra_driver_name",
    "dra_pool_name",
    "dra_mig_device_uuid",
    "dra_mig_profile",
];

/// One copy of an entity's series: its attributes (pod attributes, `vgpu`, `dra_*`, `hpc_job`,
/// `container`) as label pairs, in no order yet; the pod whose labels follow them; and the
/// holder's own use, where the copy carries it.
pub(super) struct Variant<'a> {
    pub(super) attrs: Vec<(&'static str, String)>,
    pub(super) pod: Option<&'a PodMeta>,
    pub(super) own: Option<Own>,
}

/// A holder's own use of a shared entity, replacing the device value of
/// `DCGM_FI_DEV_GPU_UTIL` and `DCGM_FI_DEV_FB_USED` in `--kubernetes-virtual-gpus` mode.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Own {
    /// SM utilisation, % (capped at 100).
    pub(super) sm: Option<i64>,
    /// Framebuffer, MiB.
    pub(super) fb_mib: Option<i64>,
    /// Framebuffer, bytes (for `DCGM_FI_DEV_FB_USED_BYTES`).
    pub(super) fb_bytes: Option<i64>,
}

/// An entity with its copies, its holders and the containers using it.
pub(super) struct Attributed<'a> {
    pub(super) entity: Entity<'a>,
    /// One per exported copy of each series.
    pub(super) variants: Vec<Variant<'a>>,
    /// With `--kubernetes-virtual-gpus` on an entity shared through the device plugin: the
    /// device-level copies (no pod attributes; one per HPC job) that dcgm-exporter keeps next
    /// to the per-pod copies of the per-process fields. Empty otherwise.
    pub(super) device_variants: Vec<Variant<'a>>,
    /// Its holders with their pods, once per container and replica however many claims hold
    /// it; none for a link (shared GPUs are joined through the GPU's own pod-info series).
    pub(super) holders: Vec<(&'a Holder, Option<&'a PodMeta>)>,
    /// The containers running processes on it, when known, each with its pod attributes (never
    /// `vgpu`, `dra_*` or `hpc_job`, so that sums over them count each process once).
    pub(super) containers: Vec<(Variant<'a>, &'a ContainerUsage)>,
}

/// The exported entities with their copies, by the families they appear in.
pub(super) struct Copies<'a> {
    pub(super) devices: Vec<Attributed<'a>>,
    pub(super) links: Vec<Attributed<'a>>,
    /// Health series are about the hardware: no copies, no workload labels.
    pub(super) health: Vec<Entity<'a>>,
}

/// The copies of each entity, from who holds it (`attribution`) and who uses it (`workload`).
pub(super) fn attribute<'a>(
    entities: Entities<'a>,
    attribution: &'a Attribution,
    workload: &'a Workload,
    opts: &BuildOptions,
) -> Copies<'a> {
    let ctx = Ctx {
        attribution,
        workload,
        opts,
        names: Names::of(opts),
    };
    Copies {
        devices: entities
            .devices
            .into_iter()
            .map(|e| ctx.device(e))
            .collect(),
        links: entities.links.into_iter().map(|e| ctx.link(e)).collect(),
        health: entities.health,
    }
}

struct Ctx<'a, 'o> {
    attribution: &'a Attribution,
    workload: &'a Workload,
    opts: &'o BuildOptions,
    names: Names,
}

impl<'a> Ctx<'a, '_> {
    fn meta(&self, pod: &PodRef) -> Option<&'a PodMeta> {
        self.workload
            .directory
            .pod(&pod.namespace, &pod.pod)
            .map(AsRef::as_ref)
    }

    /// A GPU or MIG instance.
    fn device(&self, entity: Entity<'a>) -> Attributed<'a> {
        let key = entity_key(&entity);
        let holders = self.attribution.holders_of(key);
        let usage = self.workload.usage.get(&key);
        let jobs = self.attribution.jobs_of(key);
        let mut variants = self.variants(holders, entity.instance, jobs, usage);
        if self.opts.container_labels {
            if let Some(u) = usage {
                variants = with_container_copies(variants, u, self.names);
            }
        }
        // dcgm-exporter 4.8.2+ (#594): "original device-level metric" kept next to the per-pod
        // copies of GPU_UTIL and FB_USED when pods share the device (DRA holders take another
        // path).
        let shared = self.opts.virtual_gpus
            && !holders.is_empty()
            && holders.iter().all(|h| h.dra.is_none());
        let device_variants = if shared {
            self.variants(&[], entity.instance, jobs, None)
        } else {
            Vec::new()
        };
        let mut listed: Vec<(&Holder, Option<&PodMeta>)> = Vec::with_capacity(holders.len());
        for h in holders {
            // One series per container and replica, however many claims it holds the entity by.
            if listed
                .last()
                .is_some_and(|(l, _)| l.pod == h.pod && l.vgpu == h.vgpu)
            {
                continue;
            }
            listed.push((h, self.meta(&h.pod)));
        }
        let containers = usage.map_or_else(Vec::new, |u| {
            u.containers
                .iter()
                .map(|c| {
                    let attrs = self.pod_attrs(&c.pod, Some(&c.meta.uid));
                    let copy = Variant {
                        attrs,
                        pod: Some(&c.meta),
                        own: None,
                    };
                    (copy, c)
                })
                .collect()
        });
        Attributed {
            entity,
            variants,
            device_variants,
            holders: listed,
            containers,
        }
    }

    /// An NVLink: the pod attributes of the pods holding the whole GPU and its HPC jobs (its
    /// `<gpu>` file, as dcgm-exporter); no per-process values.
    fn link(&self, entity: Entity<'a>) -> Attributed<'a> {
        let gpu = entity_key(&entity);
        let holders = self.attribution.holders_of(gpu);
        let variants = self.variants(holders, None, self.attribution.jobs_of(gpu), None);
        Attributed {
            entity,
            variants,
            device_variants: Vec::new(),
            holders: Vec::new(),
            containers: Vec::new(),
        }
    }

    /// `container`, `namespace`, `pod` (their old names under `-o`) and, when asked for and
    /// known, `pod_uid` (which has no old name).
    fn pod_attrs(&self, pod: &PodRef, uid: Option<&str>) -> Vec<(&'static str, String)> {
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
    fn variants(
        &self,
        holders: &'a [Holder],
        instance: Option<&MigInstance>,
        jobs: &[String],
        usage: Option<&EntityUsage>,
    ) -> Vec<Variant<'a>> {
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
                out.push(Variant {
                    attrs: Vec::new(),
                    pod: None,
                    own: None,
                });
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
            out.push(Variant {
                attrs,
                pod: meta,
                own,
            });
        }
        // HPC jobs multiply the copies: one per job (dcgm-exporter applies them after the pods).
        if !jobs.is_empty() {
            out = out
                .into_iter()
                .flat_map(|v| {
                    jobs.iter().map(move |j| {
                        let mut attrs = v.attrs.clone();
                        attrs.push(("hpc_job", j.clone()));
                        Variant { attrs, ..v }
                    })
                })
                .collect();
        }
        out
    }
}

/// What the holders, jobs and usage of `entity` are filed under (a link's are its GPU's).
fn entity_key(entity: &Entity<'_>) -> EntityKey {
    EntityKey {
        gpu: entity.outcome.device.identity.index,
        gi_id: entity.instance.map(|i| i.gi_id),
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
fn with_container_copies<'a>(
    variants: Vec<Variant<'a>>,
    usage: &EntityUsage,
    names: Names,
) -> Vec<Variant<'a>> {
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
        let copies: Vec<Variant<'a>> = if named {
            Vec::new()
        } else {
            containers
                .iter()
                .map(|name| {
                    let mut attrs = v.attrs.clone();
                    attrs.push(("container", (*name).to_owned()));
                    Variant { attrs, ..v }
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
    use crate::pods::{Attribution, EntityKey};
    use crate::snapshot::testkit::*;
    use crate::snapshot::{build, POD_INFO};
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
}
