//! Step 3, which labels: each copy's label set (the entity's prefix, then the copy's attributes
//! in name order, then its pod's labels), the pod-info series' and the per-container series'.
//! A pod label may not take a name the exporter uses: it is renamed as dcgm-exporter 4.8.3
//! renames it.

use std::collections::HashSet;
use std::sync::Arc;

use super::copies::{Attributed, Copies, Own, Variant, DRA_LABELS};
use super::entities::Entity;
use super::model::{BuildOptions, Names};
use crate::catalog::Catalog;
use crate::pods::directory::PodMeta;
use crate::pods::usage::ContainerUsage;
use crate::pods::Holder;
use crate::render::push_label;

/// Label names a pod label may not take: the identity labels (GPU and NVLink entities, both
/// generations of names), every per-series attribute, and the attributes of pod, DRA and HPC
/// attribution. A pod label with one of these names (or a label-type CSV field's, or the hostname
/// label's) is renamed ([`pod_label_names`]), as dcgm-exporter 4.8.3 does.
pub(super) const RESERVED_LABELS: &[&str] = &[
    "gpu",
    "UUID",
    "uuid",
    "pci_bus_id",
    "device",
    "modelName",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "hostname",
    "Hostname",
    "nvlink",
    "gpu_uuid",
    "model_name",
    "container",
    "namespace",
    "pod",
    "container_name",
    "pod_namespace",
    "pod_name",
    "pod_uid",
    "vgpu",
    "err_code",
    "err_msg",
    "xid",
    "window_size_in_ms",
    "clock_event",
    "health_error_code",
    "health_watch",
    "hpc_job",
];

/// The label names in use with these options, which a pod label may not take
/// ([`pod_label_names`] renames it): [`RESERVED_LABELS`] and the DRA labels, less the names of
/// the naming generation (`-o`) and hostname label not in use, plus the hostname label and the
/// catalog's label-type fields.
pub fn reserved_labels(catalog: &Catalog, opts: &BuildOptions) -> HashSet<String> {
    let unused: &[&str] = if opts.old_namespace {
        &["UUID", "pod", "namespace", "container"]
    } else {
        &["uuid", "pod_name", "pod_namespace", "container_name"]
    };
    let mut reserved: HashSet<String> = RESERVED_LABELS
        .iter()
        .chain(&DRA_LABELS)
        .filter(|l| !unused.contains(l))
        // NVLink series always say `hostname`; `Hostname` only when it is the hostname label.
        .filter(|l| **l != "Hostname")
        .map(|s| (*s).to_owned())
        .collect();
    reserved.insert(opts.hostname_label.clone());
    reserved.extend(catalog.labels.iter().map(|l| l.name.clone()));
    reserved
}

/// The prefix of a pod label renamed because its name is in use (dcgm-exporter 4.8.3's
/// `podLabelPrefix`).
pub const POD_LABEL_PREFIX: &str = "pod_label_";

/// A pod's labels, named as dcgm-exporter 4.8.3 names them (`copyPodLabels` and
/// `availablePodLabelName`, upstream commit 181290c, #711): labels whose name is free keep it;
/// then each label whose name is in `reserved`, in name order, becomes `pod_label_<name>`, or
/// `pod_label_<name>_conflict<N>` with the smallest N from 1 that is free (not reserved and not
/// taken by another pod label). Sorted by name.
pub fn pod_label_names<'a>(
    labels: &'a [(String, String)],
    reserved: &HashSet<String>,
) -> Vec<(String, &'a str)> {
    let (colliding, free): (Vec<_>, Vec<_>) = labels
        .iter()
        .partition(|(k, _)| reserved.contains(k.as_str()));
    let mut out: Vec<(String, &str)> = free.iter().map(|(k, v)| (k.clone(), v.as_str())).collect();
    let mut sorted = colliding;
    sorted.sort();
    for (k, v) in sorted {
        let base = format!("{POD_LABEL_PREFIX}{k}");
        let in_use = |name: &str, out: &[(String, &str)]| {
            reserved.contains(name) || out.iter().any(|(n, _)| n == name)
        };
        let mut name = base.clone();
        let mut n = 1u32;
        while in_use(&name, &out) {
            name = format!("{base}_conflict{n}");
            n += 1;
        }
        out.push((name, v.as_str()));
    }
    out.sort();
    out
}

/// Renders a pod's labels (`,name="value"` each, after the other labels), those whose name the
/// exporter uses (`reserved`) renamed as [`pod_label_names`] says.
fn render_pod_labels(meta: Option<&PodMeta>, reserved: &HashSet<String>) -> String {
    let mut out = String::new();
    let labels = meta.map_or(&[][..], |m| m.labels.as_slice());
    // The usual case (pod labels off): every pod-info series comes here.
    if labels.is_empty() {
        return out;
    }
    for (k, v) in pod_label_names(labels, reserved) {
        push_label(&mut out, &k, v);
    }
    // push_label separates pairs with commas; the suffix follows other labels.
    if out.is_empty() {
        out
    } else {
        format!(",{out}")
    }
}

/// A copy with its label set: its attributes, sorted, to merge with per-series attributes in
/// name order; its pod's labels, rendered, to follow them; the whole label set, rendered once and
/// shared by every series of the entity that has no other attributes (most of them); and its
/// holder's own use.
pub(super) struct Labelled {
    pub(super) attrs: Vec<(&'static str, String)>,
    pub(super) pod_labels: String,
    pub(super) full: Arc<str>,
    pub(super) own: Option<Own>,
}

/// An entity with its copies' label sets.
pub(super) struct LabelledEntity<'a> {
    pub(super) entity: Entity<'a>,
    pub(super) variants: Vec<Labelled>,
    pub(super) device_variants: Vec<Labelled>,
}

/// Every label set of the snapshot, by the families they appear in.
pub(super) struct Labels<'a> {
    pub(super) devices: Vec<LabelledEntity<'a>>,
    pub(super) links: Vec<LabelledEntity<'a>>,
    /// Labelled by their prefix alone.
    pub(super) health: Vec<Entity<'a>>,
    /// One per holder of each GPU or MIG instance, in entity order.
    pub(super) pod_info: Vec<Arc<str>>,
    /// One per container running processes on each GPU or MIG instance, with its usage.
    pub(super) containers: Vec<(Arc<str>, &'a ContainerUsage)>,
}

/// The label sets of every copy of every entity, and of the pod families.
pub(super) fn label<'a>(copies: Copies<'a>, catalog: &Catalog, opts: &BuildOptions) -> Labels<'a> {
    let mut l = Labeller {
        reserved: reserved_labels(catalog, opts),
        opts,
        names: Names::of(opts),
        last_pod: None,
    };
    let mut pod_info = Vec::with_capacity(copies.devices.iter().map(|a| a.holders.len()).sum());
    let mut containers = Vec::new();
    let mut devices = Vec::with_capacity(copies.devices.len());
    for a in copies.devices {
        let Attributed {
            entity,
            variants,
            device_variants,
            holders,
            containers: used_by,
        } = a;
        for (h, meta) in holders {
            pod_info.push(l.pod_info(&entity, h, meta));
        }
        for (copy, usage) in used_by {
            containers.push((l.labelled(&entity.prefix, copy).full, usage));
        }
        devices.push(l.entity(entity, variants, device_variants));
    }
    let links = copies
        .links
        .into_iter()
        .map(|a| l.entity(a.entity, a.variants, a.device_variants))
        .collect();
    Labels {
        devices,
        links,
        health: copies.health,
        pod_info,
        containers,
    }
}

struct Labeller<'a, 'o> {
    reserved: HashSet<String>,
    opts: &'o BuildOptions,
    names: Names,
    /// The last pod whose labels were rendered, and them: the copies of one holder (its HPC
    /// jobs, its containers) follow each other and share them.
    last_pod: Option<(&'a PodMeta, String)>,
}

impl<'a> Labeller<'a, '_> {
    fn entity(
        &mut self,
        entity: Entity<'a>,
        variants: Vec<Variant<'a>>,
        device_variants: Vec<Variant<'a>>,
    ) -> LabelledEntity<'a> {
        let prefix = &entity.prefix;
        let variants = variants
            .into_iter()
            .map(|v| self.labelled(prefix, v))
            .collect();
        let device_variants = device_variants
            .into_iter()
            .map(|v| self.labelled(prefix, v))
            .collect();
        LabelledEntity {
            entity,
            variants,
            device_variants,
        }
    }

    fn labelled(&mut self, prefix: &str, copy: Variant<'a>) -> Labelled {
        let Variant {
            mut attrs,
            pod,
            own,
        } = copy;
        let pod_labels = self.pod_labels(pod);
        attrs.sort_by_key(|(k, _)| *k);
        let mut full = String::with_capacity(prefix.len() + 96 + pod_labels.len());
        full.push_str(prefix);
        for (k, v) in &attrs {
            push_label(&mut full, k, v);
        }
        full.push_str(&pod_labels);
        Labelled {
            attrs,
            pod_labels,
            full: full.into(),
            own,
        }
    }

    fn pod_labels(&mut self, pod: Option<&'a PodMeta>) -> String {
        let Some(meta) = pod else {
            return String::new();
        };
        if let Some((last, labels)) = &self.last_pod {
            if std::ptr::eq(*last, meta) {
                return labels.clone();
            }
        }
        let labels = render_pod_labels(Some(meta), &self.reserved);
        self.last_pod = Some((meta, labels.clone()));
        labels
    }

    /// `gpu`, `UUID`, `GPU_I_ID` (on an instance), `pod`, `namespace`, `container` (their old
    /// names under `-o`), `vgpu`, `pod_uid` (when asked for and known), then the pod's labels:
    /// what joins a shared entity's series to its holders.
    fn pod_info(&self, e: &Entity<'_>, h: &Holder, meta: Option<&PodMeta>) -> Arc<str> {
        let names = self.names;
        let id = &e.outcome.device.identity;
        let mut s = String::new();
        push_label(&mut s, "gpu", &id.index.to_string());
        push_label(&mut s, names.uuid, &id.uuid);
        if let Some(i) = e.instance {
            push_label(&mut s, "GPU_I_ID", &i.gi_id.to_string());
        }
        push_label(&mut s, names.pod, &h.pod.pod);
        push_label(&mut s, names.namespace, &h.pod.namespace);
        push_label(&mut s, names.container, &h.pod.container);
        push_label(&mut s, "vgpu", h.vgpu.as_deref().unwrap_or(""));
        if self.opts.pod_uid {
            if let Some(uid) = meta.map(|m| m.uid.as_str()).filter(|u| !u.is_empty()) {
                push_label(&mut s, "pod_uid", uid);
            }
        }
        s.push_str(&render_pod_labels(meta, &self.reserved));
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use crate::pods::usage::EntityUsage;
    use crate::pods::Attribution;
    use crate::snapshot::testkit::*;
    use crate::snapshot::{build_with, CONTAINER_SM_UTIL, POD_INFO};
    #[test]
    fn pod_uid_and_labels_follow_the_pod_attributes_and_never_override_labels() {
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(gpu0(), vec![holder("a", None)]);
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let w = workload(&[(
            "a",
            "uid-a",
            &[
                ("team", "search"),
                ("app.kubernetes.io/name", "embed"),
                // These would clash with labels the exporter sets: renamed as dcgm-exporter
                // 4.8.3 renames them (`pod_label_<name>`, then `_conflict<N>`).
                ("pod", "evil"),
                ("pod_label_pod", "taken"),
                ("gpu", "9"),
                ("DCGM_FI_DRIVER_VERSION", "x"),
            ],
        )]);
        let mut o = opts();
        o.pod_uid = true;
        let s = build_with(
            &cat(),
            &[outcome(device(0, "H100", &[]), 50, 1)],
            &att,
            &w,
            &o,
        );
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temp.len(), 1);
        assert!(
            temp[0].ends_with(r#"container="c",namespace="ns",pod="a",pod_uid="uid-a",app_kubernetes_io_name="embed",pod_label_DCGM_FI_DRIVER_VERSION="x",pod_label_gpu="9",pod_label_pod="taken",pod_label_pod_conflict1="evil",team="search"} 50"#),
            "{}",
            temp[0]
        );
        let info = lines(&s, POD_INFO);
        assert!(
            info[0].ends_with(
                r#"vgpu="",pod_uid="uid-a",app_kubernetes_io_name="embed",pod_label_DCGM_FI_DRIVER_VERSION="x",pod_label_gpu="9",pod_label_pod="taken",pod_label_pod_conflict1="evil",team="search"} 1"#
            ),
            "{}",
            info[0]
        );
        // Without the flag: no pod_uid; labels only if the directory has them.
        let s = build_with(
            &cat(),
            &[outcome(device(0, "H100", &[]), 50, 1)],
            &att,
            &w,
            &opts(),
        );
        assert!(!lines(&s, "DCGM_FI_DEV_GPU_TEMP")[0].contains("pod_uid"));
        // A pod the runtime does not know: no uid, no labels.
        let s = build_with(
            &cat(),
            &[outcome(device(0, "H100", &[]), 50, 1)],
            &att,
            &workload(&[]),
            &o,
        );
        assert!(lines(&s, "DCGM_FI_DEV_GPU_TEMP")[0].ends_with(r#"pod="a"} 50"#));
    }

    #[test]
    fn old_names_apply_to_every_pod_labelled_series_and_pod_uid_keeps_its_name() {
        let mut w = workload(&[("a", "uid-a", &[("team", "t"), ("pod_name", "clash")])]);
        w.usage.insert(
            gpu0(),
            EntityUsage {
                containers: vec![usage("a", Some(30), 100, &w)],
                complete: true,
            },
        );
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(gpu0(), vec![holder("a", None)]);
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let mut o = opts();
        o.old_namespace = true;
        o.pod_uid = true;
        let s = build_with(
            &cat(),
            &[outcome(device(0, "H100", &[]), 50, 1)],
            &att,
            &w,
            &o,
        );
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(
            temp[0],
            r#"DCGM_FI_DEV_GPU_TEMP{gpu="0",uuid="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="H100",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container_name="c",pod_name="a",pod_namespace="ns",pod_uid="uid-a",pod_label_pod_name="clash",team="t"} 50"#
        );
        let info = lines(&s, POD_INFO);
        assert!(
            info[0].ends_with(r#"uuid="GPU-0",pod_name="a",pod_namespace="ns",container_name="c",vgpu="",pod_uid="uid-a",pod_label_pod_name="clash",team="t"} 1"#),
            "{}",
            info[0]
        );
        // The per-container series join on the same names as the device series.
        let sm = lines(&s, CONTAINER_SM_UTIL);
        assert_eq!(
            sm,
            [
                r#"gpu_exporter_container_sm_utilization_percent{gpu="0",uuid="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="H100",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container_name="c",pod_name="a",pod_namespace="ns",pod_uid="uid-a",pod_label_pod_name="clash",team="t"} 30"#
            ]
        );
        // Without -o the pod label `pod_name` clashes with nothing and is kept.
        o.old_namespace = false;
        let s = build_with(
            &cat(),
            &[outcome(device(0, "H100", &[]), 50, 1)],
            &att,
            &w,
            &o,
        );
        assert!(lines(&s, "DCGM_FI_DEV_GPU_TEMP")[0]
            .contains(r#"pod_uid="uid-a",pod_name="clash",team="t""#));
    }

    #[test]
    fn colliding_pod_labels_are_renamed_as_dcgm_exporter_4_8_3_does() {
        let reserved: HashSet<String> = ["gpu", "pod", "pod_label_gpu"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let l = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let labels = l(&[
            ("gpu", "a"),
            ("pod", "b"),
            ("pod_label_pod", "c"),
            ("pod_label_pod_conflict1", "d"),
            ("team", "e"),
        ]);
        let named = pod_label_names(&labels, &reserved);
        let named: Vec<(&str, &str)> = named.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(
            named,
            [
                // gpu: pod_label_gpu is in use too, so the first free _conflict<N>.
                ("pod_label_gpu_conflict1", "a"),
                // Free names keep theirs, before colliding ones are placed.
                ("pod_label_pod", "c"),
                ("pod_label_pod_conflict1", "d"),
                ("pod_label_pod_conflict2", "b"),
                ("team", "e"),
            ]
        );
        // Nothing collides: unchanged.
        let plain = l(&[("app", "x")]);
        assert_eq!(
            pod_label_names(&plain, &reserved),
            [("app".to_owned(), "x")]
        );
    }

    #[test]
    fn no_pod_label_can_take_a_name_the_exporter_uses() {
        // Every label the exporter itself writes, in every mode, with DRA, HPC jobs and links,
        // is reserved: a pod label by that name would never reach a series.
        let mut w = workload(&[("a", "uid-a", &[])]);
        w.usage.insert(
            key(0, Some(2)),
            EntityUsage {
                containers: vec![usage("a", None, 100, &w)],
                complete: true,
            },
        );
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(key(0, Some(2)), vec![dra_holder("a", "c", "gpu-0-mig-x")]);
        holders.insert(key(1, None), vec![holder("a", Some("0"))]);
        let mut jobs = std::collections::BTreeMap::new();
        jobs.insert(key(1, None), vec!["j".to_owned()]);
        let att = Attribution {
            holders,
            jobs,
            ..Default::default()
        };
        let cat = catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_XID_ERRORS, gauge, x\nDCGM_EXP_XID_ERRORS_COUNT, gauge, c\nDCGM_EXP_CLOCK_EVENTS_COUNT, gauge, e\nDCGM_EXP_GPU_HEALTH_STATUS, gauge, h\nDCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL, counter, r\nDCGM_FI_DRIVER_VERSION, label, d\n",
            "t.csv",
        )
        .unwrap()
        .0;
        let outcomes = [
            outcome(device(0, "A100", &[(2, "3g.40gb")]), 40, 1),
            with_links(outcome(device(1, "H100", &[]), 41, 1), &[(0, 1)]),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (old, virt, label) in [
            (false, false, "hostname"),
            (true, true, "Hostname"),
            (false, true, "hostname"),
        ] {
            let mut o = opts();
            o.old_namespace = old;
            o.virtual_gpus = virt;
            o.pod_uid = true;
            o.hostname_label = label.into();
            let s = build_with(&cat, &outcomes, &att, &w, &o);
            let in_use = reserved_labels(&cat, &o);
            for fam in &s.families {
                for series in &fam.series {
                    for pair in series.labels.split("\",") {
                        let name = pair.split('=').next().unwrap_or_default();
                        let name = name.trim_start_matches(',');
                        // Each build's own names are in use for its pod labels.
                        assert!(in_use.contains(name), "{name} not reserved with {o:?}");
                        seen.insert(name.to_owned());
                    }
                }
            }
        }
        seen.remove("DCGM_FI_DRIVER_VERSION"); // a CSV label field: reserved from the catalog
        let reserved: std::collections::BTreeSet<String> = RESERVED_LABELS
            .iter()
            .chain(&DRA_LABELS)
            .map(|s| (*s).to_owned())
            .collect();
        let unreserved: Vec<&String> = seen.difference(&reserved).collect();
        assert!(
            unreserved.is_empty(),
            "labels a pod label could take: {unreserved:?}"
        );
        for dra in DRA_LABELS {
            assert!(seen.contains(dra), "{dra} not rendered by the test");
        }
    }
}
