//! Pure snapshot builder: catalog + device samples + attribution → metric families.
//!
//! This is where dcgm-exporter's label contract lives: the label order `gpu, UUID, pci_bus_id,
//! device, modelName, [GPU_I_PROFILE, GPU_I_ID], hostname`, then label-type CSV fields (sorted
//! by name), then the per-series attributes (`err_code`, `xid`, pod labels, `dra_*`, `hpc_job`,
//! ...) sorted by name, as dcgm-exporter's templates emit them. Each entity's label prefix is
//! escaped once per sample. A device that could not be read contributes no series except its
//! health and XID series.
//!
//! Copies: an entity's series are emitted once per attribute set: one per DRA holder (with its
//! claim's `dra_*` labels), else one per holder in `--kubernetes-virtual-gpus` mode, else once
//! (with the pod labels of a sole holder); each of these once per HPC job (`hpc_job`). A copy for
//! a holder also carries its `pod_uid` and pod labels when known and asked for, and, in
//! `--kubernetes-virtual-gpus` mode, its own `DCGM_FI_DEV_GPU_UTIL` and `DCGM_FI_DEV_FB_USED`.
//!
//! The per-container families (`gpu_exporter_container_*`, from per-process readings) are not
//! copies: one series per container running processes on an entity, with the entity's labels and
//! the container's pod labels, never `vgpu`, `dra_*` or `hpc_job`, so that they sum honestly.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::catalog::field::MigScope;
use crate::catalog::{Catalog, Field, MetricSpec, MetricType};
use crate::gpu::{Device, DeviceSample, FieldError, LinkSample, MigInstance, Reading, Value};
use crate::health::{self, Recent};
use crate::pods::directory::{PodDirectory, PodMeta};
use crate::pods::usage::{ContainerUsage, EntityUsage};
use crate::pods::{Attribution, DraClaim, EntityKey, Holder, PodRef};
use crate::render::{push_label, Family, Series};

/// Which entities are exported (`-d/--devices`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceSelection {
    /// `f`: MIG instances for GPUs that have them, whole GPUs otherwise.
    #[default]
    Flex,
    /// `g[:ids]`: whole GPUs (all, or these indices).
    Gpus(Option<Vec<u32>>),
    /// `i[:ids]`: MIG instances (all, or these GPU instance ids).
    Instances(Option<Vec<u32>>),
}

impl DeviceSelection {
    fn gpu_selected(&self, device: &Device) -> bool {
        match self {
            DeviceSelection::Flex => !device.mig_enabled || device.instances.is_empty(),
            DeviceSelection::Gpus(None) => true,
            DeviceSelection::Gpus(Some(ids)) => ids.contains(&device.identity.index),
            DeviceSelection::Instances(_) => false,
        }
    }

    /// Whether the NVLinks of `device` are exported, as dcgm-exporter decides it: with `f`, or
    /// when `g` selects the GPU; never with `i`.
    fn links_selected(&self, device: &Device) -> bool {
        match self {
            DeviceSelection::Flex | DeviceSelection::Gpus(None) => true,
            DeviceSelection::Gpus(Some(ids)) => ids.contains(&device.identity.index),
            DeviceSelection::Instances(_) => false,
        }
    }

    fn instance_selected(&self, device: &Device, inst: &MigInstance) -> bool {
        match self {
            DeviceSelection::Flex => device.mig_enabled,
            DeviceSelection::Gpus(_) => false,
            DeviceSelection::Instances(None) => true,
            DeviceSelection::Instances(Some(ids)) => ids.contains(&inst.gi_id),
        }
    }

    /// Whether any GPU or MIG instance of `devices` is selected. When none is (`-d g:99` on an
    /// 8-GPU node, `-d i` without MIG), no GPU series would be exported.
    pub fn selects_any(&self, devices: &[Device]) -> bool {
        devices.iter().any(|d| {
            self.gpu_selected(d) || d.instances.iter().any(|i| self.instance_selected(d, i))
        })
    }

    /// Why nothing of `devices` is selected, for the startup error and `/ready`; `None` when
    /// something is (or there is no device at all).
    pub fn selects_nothing(&self, devices: &[Device]) -> Option<String> {
        if devices.is_empty() || self.selects_any(devices) {
            return None;
        }
        let instances: usize = devices.iter().map(|d| d.instances.len()).sum();
        let indices: Vec<String> = devices
            .iter()
            .map(|d| d.identity.index.to_string())
            .collect();
        Some(format!(
            "-d/--devices \"{self}\" selects none of the {} GPUs (indices {}) and {instances} MIG instances found, so no GPU series would be exported",
            devices.len(),
            indices.join(", ")
        ))
    }
}

impl std::fmt::Display for DeviceSelection {
    /// As written on the command line: `f`, `g`, `g:0,2`, `i`, `i:9`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, ids) = match self {
            DeviceSelection::Flex => return f.write_str("f"),
            DeviceSelection::Gpus(ids) => ("g", ids),
            DeviceSelection::Instances(ids) => ("i", ids),
        };
        f.write_str(kind)?;
        if let Some(ids) = ids {
            let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
            write!(f, ":{}", ids.join(","))?;
        }
        Ok(())
    }
}

/// Options that shape the labels.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Name of the hostname label: `hostname` (current) or `Hostname` (dcgm-exporter ≤ 4.8.2).
    pub hostname_label: String,
    /// Its value.
    pub hostname: String,
    /// Replace spaces in `modelName` with `-`.
    pub replace_blanks_in_model_name: bool,
    /// Entity selection.
    pub selection: DeviceSelection,
    /// One series per holder of a shared GPU, with `vgpu` (dcgm-exporter's
    /// `--kubernetes-virtual-gpus`), instead of unlabelled series plus pod-info series.
    pub virtual_gpus: bool,
    /// The XID window, for `window_size_in_ms`.
    pub xid_window_ms: u64,
    /// The clock-event window, for `window_size_in_ms`.
    pub clock_window_ms: u64,
    /// dcgm-exporter's `-o/--use-old-namespace` (its 1.x label names): `uuid` instead of `UUID`,
    /// `pod_name`, `pod_namespace`, `container_name` instead of `pod`, `namespace`, `container`.
    /// `pod_uid` has no old name and keeps its own.
    pub old_namespace: bool,
    /// Add `pod_uid` to pod-labelled series (`--kubernetes-enable-pod-uid`).
    pub pod_uid: bool,
    /// dcgm-exporter's `--container-labels` (outside Kubernetes mode): next to each series of a
    /// GPU or MIG instance, one copy per container running processes there, with `container`.
    pub container_labels: bool,
}

/// Who *uses* the GPUs, beyond who holds them: the container runtime's pod metadata (`pod_uid`,
/// pod labels) and per-container usage from per-process readings. The default adds nothing.
#[derive(Debug, Clone, Default)]
pub struct Workload {
    /// Pods and containers as the container runtime lists them.
    pub directory: Arc<PodDirectory>,
    /// Per-container usage of each GPU and MIG instance whose processes were read this tick.
    pub usage: BTreeMap<EntityKey, EntityUsage>,
}

/// The label names that `-o/--use-old-namespace` changes.
#[derive(Debug, Clone, Copy)]
struct Names {
    uuid: &'static str,
    pod: &'static str,
    namespace: &'static str,
    container: &'static str,
}

impl Names {
    fn of(opts: &BuildOptions) -> Self {
        if opts.old_namespace {
            Names {
                uuid: "uuid",
                pod: "pod_name",
                namespace: "pod_namespace",
                container: "container_name",
            }
        } else {
            Names {
                uuid: "UUID",
                pod: "pod",
                namespace: "namespace",
                container: "container",
            }
        }
    }
}

/// What the sampler learnt about one device this tick.
#[derive(Debug, Clone)]
pub struct DeviceOutcome {
    /// The device.
    pub device: Device,
    /// Its sample, or the failure reason (`gpu_lost`, `device_error`).
    pub sample: Result<DeviceSample, &'static str>,
    /// Its event windows.
    pub recent: Recent,
    /// Values of the catalog's label-type fields: from this sample, or remembered from the
    /// last good one when the device could not be read (so a lost GPU's series keep their
    /// label set, and alerts on them keep their identity).
    pub labels: Vec<(Field, Value)>,
}

impl DeviceOutcome {
    /// Whether the GPU fell off the bus.
    pub fn lost(&self) -> bool {
        matches!(self.sample, Err("gpu_lost"))
    }

    /// The health checks for this device.
    pub fn health(&self, window_ms: u64) -> Vec<health::Check> {
        health::derive(
            self.sample.as_ref().ok(),
            self.lost(),
            &self.recent,
            window_ms,
        )
    }
}

/// The built families plus what went wrong while building, for self-metrics.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Families in exposition order (CSV order, then the pod-info family).
    pub families: Vec<Family>,
    /// Field read failures (other than "not supported"), one entry per failed read.
    pub field_errors: Vec<(Field, FieldError)>,
    /// Number of series.
    pub series: usize,
}

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

/// The labels of a DRA holder's copies (dcgm-exporter's), the last two on MIG instances only.
const DRA_LABELS: [&str; 7] = [
    "dra_claim_name",
    "dra_claim_namespace",
    "dra_device_name",
    "dra_driver_name",
    "dra_pool_name",
    "dra_mig_device_uuid",
    "dra_mig_profile",
];

/// Label names a pod label may not take: the identity labels (GPU and NVLink entities, both
/// generations of names), every per-series attribute, and the attributes of pod, DRA and HPC
/// attribution. A pod label with one of these names (or a label-type CSV field's, or the hostname
/// label's) is renamed ([`pod_label_names`]), as dcgm-exporter 4.8.3 does.
const RESERVED_LABELS: &[&str] = &[
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

/// The per-copy attributes of an entity's series (pod attributes, `vgpu`): as pairs, to merge
/// with per-series attributes in name order; the pod's labels, rendered, to follow them; and
/// the entity's whole label set, rendered once and shared by every series of the entity that has
/// no other attributes (most of them).
struct Variant {
    attrs: Vec<(&'static str, String)>,
    pod_labels: String,
    full: Arc<str>,
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
    fn value(&self, field: Field, device: &Value) -> Value {
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

/// The fields whose per-pod copies carry each holder's own use with
/// `--kubernetes-virtual-gpus` (dcgm-exporter's `isPerProcessMetric`: GPU utilisation and
/// framebuffer used, here in either naming generation's unit).
fn is_per_process(field: Field) -> bool {
    matches!(
        field,
        Field::GpuUtil | Field::GpuUtilRatio | Field::FbUsed | Field::FbUsedBytes
    )
}

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

struct Entity<'a> {
    outcome: &'a DeviceOutcome,
    instance: Option<&'a MigInstance>,
    /// For a link entity: its link (then `instance` is `None`).
    link: Option<&'a LinkSample>,
    /// Escaped label prefix: identity, hostname and label-type fields.
    prefix: String,
    /// Attribute sets, one per exported copy of each series.
    variants: Vec<Variant>,
    /// With `--kubernetes-virtual-gpus` on an entity shared through the device plugin: the
    /// device-level copies (no pod attributes; one per HPC job) that dcgm-exporter keeps next
    /// to the per-pod copies of the per-process fields. Empty otherwise.
    device_variants: Vec<Variant>,
    /// Who holds the entity.
    holders: &'a [Holder],
    /// Who runs processes on it, when known.
    usage: Option<&'a EntityUsage>,
}

impl Entity<'_> {
    fn reading(&self, field: Field) -> Option<&Reading> {
        let sample = self.outcome.sample.as_ref().ok()?;
        let find = |rs: &'_ [(Field, Reading)]| -> Option<usize> {
            rs.iter().position(|(f, _)| *f == field)
        };
        if let Some(link) = self.link {
            return find(&link.readings).map(|i| &link.readings[i].1);
        }
        match (self.instance, field.mig_scope()) {
            (None, _) | (Some(_), MigScope::Parent) => {
                find(&sample.readings).map(|i| &sample.readings[i].1)
            }
            (Some(inst), MigScope::Instance) => {
                let is = sample.instances.iter().find(|s| s.gi_id == inst.gi_id)?;
                find(&is.readings).map(|i| &is.readings[i].1)
            }
            (Some(_), MigScope::Unsupported | MigScope::Gpu | MigScope::Link) => None,
        }
    }
}

/// Builds the snapshot from who holds the GPUs only (no container runtime, no per-process
/// readings).
pub fn build(
    catalog: &Catalog,
    outcomes: &[DeviceOutcome],
    attribution: &Attribution,
    opts: &BuildOptions,
) -> Snapshot {
    build_with(catalog, outcomes, attribution, &Workload::default(), opts)
}

/// Builds the snapshot.
pub fn build_with(
    catalog: &Catalog,
    outcomes: &[DeviceOutcome],
    attribution: &Attribution,
    workload: &Workload,
    opts: &BuildOptions,
) -> Snapshot {
    let reserved = reserved_labels(catalog, opts);
    let ctx = Ctx {
        catalog,
        attribution,
        workload,
        opts,
        names: Names::of(opts),
        reserved: &reserved,
    };
    let mut entities = Vec::new();
    for outcome in outcomes {
        let d = &outcome.device;
        if opts.selection.gpu_selected(d) {
            entities.push(entity(&ctx, outcome, None));
        }
        for inst in &d.instances {
            if opts.selection.instance_selected(d, inst) {
                entities.push(entity(&ctx, outcome, Some(inst)));
            }
        }
    }

    let mut links = Vec::new();
    if catalog.metrics.iter().any(|m| m.field.is_link()) {
        for outcome in outcomes {
            if !opts.selection.links_selected(&outcome.device) {
                continue;
            }
            if let Ok(sample) = &outcome.sample {
                for l in &sample.links {
                    links.push(link_entity(&ctx, outcome, l));
                }
            }
        }
    }

    let mut snap = Snapshot::default();
    for spec in &catalog.metrics {
        let mut fam = Family {
            name: spec.name.clone(),
            help: spec.help.clone(),
            kind: spec.kind,
            series: Vec::with_capacity(entities.len()),
        };
        match spec.field {
            Field::ExpGpuHealthStatus => health_series(outcomes, catalog, opts, &mut fam),
            f if f.is_link() => {
                for e in &links {
                    entity_series(spec, e, opts, &mut fam, &mut snap.field_errors);
                }
            }
            _ => {
                for e in &entities {
                    entity_series(spec, e, opts, &mut fam, &mut snap.field_errors);
                }
            }
        }
        snap.series += fam.series.len();
        snap.families.push(fam);
    }
    if let Some(fam) = pod_info(&ctx, &entities) {
        snap.series += fam.series.len();
        snap.families.push(fam);
    }
    for fam in container_families(&ctx, &entities) {
        snap.series += fam.series.len();
        snap.families.push(fam);
    }
    snap
}

/// What every entity's labels are built from.
struct Ctx<'a> {
    catalog: &'a Catalog,
    attribution: &'a Attribution,
    workload: &'a Workload,
    opts: &'a BuildOptions,
    names: Names,
    reserved: &'a HashSet<String>,
}

impl Ctx<'_> {
    fn meta(&self, pod: &PodRef) -> Option<&PodMeta> {
        self.workload
            .directory
            .pod(&pod.namespace, &pod.pod)
            .map(AsRef::as_ref)
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

fn entity<'a>(
    ctx: &Ctx<'a>,
    outcome: &'a DeviceOutcome,
    instance: Option<&'a MigInstance>,
) -> Entity<'a> {
    let key = EntityKey {
        gpu: outcome.device.identity.index,
        gi_id: instance.map(|i| i.gi_id),
    };
    let holders = ctx.attribution.holders_of(key);
    let usage = ctx.workload.usage.get(&key);
    let mut prefix = identity_labels(outcome, instance, ctx.opts);
    push_label_fields(&mut prefix, ctx.catalog, outcome, |_| true);
    let jobs = ctx.attribution.jobs_of(key);
    let mut variants = ctx.variants(&prefix, holders, instance, jobs, usage);
    if ctx.opts.container_labels {
        if let Some(u) = usage {
            variants = with_container_copies(&prefix, variants, u, ctx.names);
        }
    }
    // dcgm-exporter 4.8.2+ (#594): "original device-level metric" kept next to the per-pod
    // copies of GPU_UTIL and FB_USED when pods share the device (DRA holders take another path).
    let shared =
        ctx.opts.virtual_gpus && !holders.is_empty() && holders.iter().all(|h| h.dra.is_none());
    let device_variants = if shared {
        ctx.variants(&prefix, &[], instance, jobs, None)
    } else {
        Vec::new()
    };
    Entity {
        outcome,
        instance,
        link: None,
        prefix,
        variants,
        device_variants,
        holders,
        usage,
    }
}

/// dcgm-exporter's `--container-labels`: each variant, then one copy of it per container running
/// processes on the entity (by container name, once each), with a `container` label. Variants
/// that already name a container are left alone; the copies carry the entity's values.
fn with_container_copies(
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

/// A GPU's NVLink as dcgm-exporter renders link entities: `nvlink` (the link index + 1, as
/// dcgm-exporter numbers a GPU's links from 1), then the parent GPU as `gpu`, `gpu_uuid`,
/// `pci_bus_id`, `device`, `model_name` (these names, and a lowercase `hostname`, whatever the
/// GPU series use), then the system-wide label-type fields (driver version), then the pod
/// labels (with `pod_uid` and the pod's labels) of the pods holding the whole GPU and its HPC
/// jobs. Links carry no per-process values.
fn link_entity<'a>(ctx: &Ctx<'a>, outcome: &'a DeviceOutcome, link: &'a LinkSample) -> Entity<'a> {
    let opts = ctx.opts;
    let id = &outcome.device.identity;
    let mut prefix = String::with_capacity(256);
    push_label(
        &mut prefix,
        "nvlink",
        &(u64::from(link.link) + 1).to_string(),
    );
    push_label(&mut prefix, "gpu", &id.index.to_string());
    push_label(&mut prefix, "gpu_uuid", &id.uuid);
    push_label(&mut prefix, "pci_bus_id", &id.pci_bus_id);
    push_label(&mut prefix, "device", &format!("nvidia{}", id.index));
    push_label(&mut prefix, "model_name", &id.model);
    if !opts.hostname.is_empty() {
        push_label(&mut prefix, "hostname", &opts.hostname);
    }
    push_label_fields(&mut prefix, ctx.catalog, outcome, Field::is_system);
    let gpu = EntityKey {
        gpu: id.index,
        gi_id: None,
    };
    let holders = ctx.attribution.holders_of(gpu);
    // As dcgm-exporter, links carry their GPU's job labels (its `<gpu>` file).
    let variants = ctx.variants(&prefix, holders, None, ctx.attribution.jobs_of(gpu), None);
    Entity {
        outcome,
        instance: None,
        link: Some(link),
        prefix,
        variants,
        device_variants: Vec::new(),
        // Shared GPUs are joined through the GPU's own pod-info series.
        holders: &[],
        usage: None,
    }
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

fn push_label_fields(
    prefix: &mut String,
    catalog: &Catalog,
    outcome: &DeviceOutcome,
    which: impl Fn(Field) -> bool,
) {
    for spec in catalog.labels.iter().filter(|s| which(s.field)) {
        if let Some((_, v)) = outcome.labels.iter().find(|(f, _)| *f == spec.field) {
            push_label(prefix, &spec.name, &v.to_string());
        }
    }
}

fn identity_labels(
    outcome: &DeviceOutcome,
    instance: Option<&MigInstance>,
    opts: &BuildOptions,
) -> String {
    let id = &outcome.device.identity;
    let mut s = String::with_capacity(256);
    push_label(&mut s, "gpu", &id.index.to_string());
    push_label(&mut s, Names::of(opts).uuid, &id.uuid);
    push_label(&mut s, "pci_bus_id", &id.pci_bus_id);
    // dcgm-exporter writes `nvidia<DCGM GPU index>`, not the minor number of /dev/nvidiaN.
    push_label(&mut s, "device", &format!("nvidia{}", id.index));
    if opts.replace_blanks_in_model_name {
        push_label(&mut s, "modelName", &id.model.replace(' ', "-"));
    } else {
        push_label(&mut s, "modelName", &id.model);
    }
    if let Some(inst) = instance {
        push_label(&mut s, "GPU_I_PROFILE", &inst.profile);
        push_label(&mut s, "GPU_I_ID", &inst.gi_id.to_string());
    }
    if !opts.hostname.is_empty() {
        push_label(&mut s, &opts.hostname_label, &opts.hostname);
    }
    s
}

/// The label set of one series: the variant's shared one, or, with per-series `extras`, prefix +
/// the sorted merge of `extras` and the variant's attributes.
fn labels(prefix: &str, extras: &[(&'static str, String)], variant: &Variant) -> Arc<str> {
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

fn entity_series(
    spec: &MetricSpec,
    e: &Entity<'_>,
    opts: &BuildOptions,
    fam: &mut Family,
    errors: &mut Vec<(Field, FieldError)>,
) {
    let mut push = |extras: &[(&'static str, String)], value: Value| {
        for variant in &e.variants {
            fam.series.push(Series {
                labels: labels(&e.prefix, extras, variant),
                value: value.clone(),
            });
        }
    };
    let recent = &e.outcome.recent;
    match spec.field {
        Field::XidErrors => {
            let xid = recent.last_xid.unwrap_or(0);
            push(
                &[
                    ("err_code", xid.to_string()),
                    ("err_msg", health::xid_message(xid).to_owned()),
                ],
                Value::Int(i64::try_from(xid).unwrap_or(i64::MAX)),
            );
        }
        Field::ExpXidErrorsCount => {
            let window = ("window_size_in_ms", opts.xid_window_ms.to_string());
            if recent.xid_counts.is_empty() {
                push(std::slice::from_ref(&window), Value::Int(0));
            }
            for &(xid, n) in &recent.xid_counts {
                push(
                    &[window.clone(), ("xid", xid.to_string())],
                    Value::Int(i64::try_from(n).unwrap_or(i64::MAX)),
                );
            }
        }
        Field::ExpClockEventsCount => {
            if e.outcome.sample.is_err() {
                return;
            }
            let window = ("window_size_in_ms", opts.clock_window_ms.to_string());
            // As dcgm-exporter's expcollector: an entity without events gets one series, 0.
            if recent.clock_event_counts.is_empty() {
                push(std::slice::from_ref(&window), Value::Int(0));
            }
            for &(reason, n) in &recent.clock_event_counts {
                push(
                    &[("clock_event", reason.to_owned()), window.clone()],
                    Value::Int(i64::try_from(n).unwrap_or(i64::MAX)),
                );
            }
        }
        field => match e.reading(field) {
            Some(Ok(v @ (Value::Int(_) | Value::Float(_)))) => {
                if is_per_process(field) {
                    for d in &e.device_variants {
                        fam.series.push(Series {
                            labels: Arc::clone(&d.full),
                            value: v.clone(),
                        });
                    }
                }
                for variant in &e.variants {
                    fam.series.push(Series {
                        labels: Arc::clone(&variant.full),
                        value: variant.value(field, v),
                    });
                }
            }
            Some(Ok(Value::Text(_))) | None => {}
            Some(Err(FieldError::NotSupported)) => {}
            Some(Err(err)) => errors.push((field, *err)),
        },
    }
}

/// Health series: one per physical GPU and watch, labelled as the whole GPU (as dcgm-exporter
/// reports health for GPUs, not MIG instances), with the label-type fields.
fn health_series(
    outcomes: &[DeviceOutcome],
    catalog: &Catalog,
    opts: &BuildOptions,
    fam: &mut Family,
) {
    for o in outcomes {
        let mut prefix = identity_labels(o, None, opts);
        push_label_fields(&mut prefix, catalog, o, |_| true);
        for c in o.health(opts.xid_window_ms) {
            let mut s = prefix.clone();
            push_label(&mut s, "health_error_code", c.code);
            push_label(&mut s, "health_watch", c.watch);
            fam.series.push(Series {
                labels: s.into(),
                value: Value::Int(c.status as i64),
            });
        }
    }
}

fn pod_info(ctx: &Ctx<'_>, entities: &[Entity<'_>]) -> Option<Family> {
    let names = ctx.names;
    let mut fam = Family {
        name: POD_INFO.to_owned(),
        help: "Pods holding each GPU or MIG instance (one series per holder; join on UUID and GPU_I_ID)."
            .to_owned(),
        kind: MetricType::Gauge,
        series: Vec::new(),
    };
    for e in entities {
        let id = &e.outcome.device.identity;
        let mut last: Option<&Holder> = None;
        for h in e.holders {
            // One series per container and replica, however many claims it holds the entity by.
            if last.is_some_and(|l| l.pod == h.pod && l.vgpu == h.vgpu) {
                continue;
            }
            last = Some(h);
            let meta = ctx.meta(&h.pod);
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
            if ctx.opts.pod_uid {
                if let Some(uid) = meta.map(|m| m.uid.as_str()).filter(|u| !u.is_empty()) {
                    push_label(&mut s, "pod_uid", uid);
                }
            }
            s.push_str(&render_pod_labels(meta, ctx.reserved));
            fam.series.push(Series {
                labels: s.into(),
                value: Value::Int(1),
            });
        }
    }
    (!fam.series.is_empty()).then_some(fam)
}

/// One family per per-container measure, over every exported entity whose processes were read:
/// the entity's labels, then the container's `container`, `namespace`, `pod` (old names under
/// `-o`), `pod_uid` and pod labels. Not copied per holder, DRA claim or HPC job: one series per
/// container, so that sums over them count each process once.
fn container_families(ctx: &Ctx<'_>, entities: &[Entity<'_>]) -> Vec<Family> {
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
    // One label set per (entity, container), shared by the families.
    let mut rows: Vec<(Arc<str>, &ContainerUsage)> = Vec::new();
    for e in entities {
        let Some(u) = e.usage else { continue };
        for c in &u.containers {
            let mut s = String::with_capacity(e.prefix.len() + 128);
            s.push_str(&e.prefix);
            let mut attrs = ctx.pod_attrs(&c.pod, Some(&c.meta.uid));
            attrs.sort_by_key(|(k, _)| *k);
            for (k, v) in attrs {
                push_label(&mut s, k, &v);
            }
            s.push_str(&render_pod_labels(Some(&c.meta), ctx.reserved));
            rows.push((s.into(), c));
        }
    }
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
    use crate::catalog;
    use crate::gpu::{GpuIdentity, InstanceSample};

    fn device(index: u32, model: &str, instances: &[(u32, &str)]) -> Device {
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

    fn outcome(d: Device, temp: i64, fb: i64) -> DeviceOutcome {
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

    fn opts() -> BuildOptions {
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

    fn cat() -> Catalog {
        catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_FB_USED, gauge, f\nDCGM_FI_DEV_GPU_UTIL, gauge, u\nDCGM_FI_DRIVER_VERSION, label, d\n",
            "t.csv",
        )
        .unwrap()
        .0
    }

    fn lines(s: &Snapshot, name: &str) -> Vec<String> {
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

    fn holder(pod: &str, vgpu: Option<&str>) -> Holder {
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

    #[test]
    fn gpu_level_gpm_readings_stay_on_the_gpu_and_parent_readings_repeat_on_instances() {
        let (cat, _) = catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_PROF_PCIE_TX_BYTES, gauge, p\n",
            "t.csv",
        )
        .unwrap();
        let mut o = outcome(device(0, "G", &[(1, "1g.10gb"), (2, "1g.10gb")]), 40, 100);
        if let Ok(s) = o.sample.as_mut() {
            s.readings
                .push((Field::ProfPcieTxBytes, Ok(Value::Float(1_048_576.0))));
        }
        let flex = build(
            &cat,
            std::slice::from_ref(&o),
            &Attribution::default(),
            &opts(),
        );
        assert_eq!(lines(&flex, "DCGM_FI_DEV_GPU_TEMP").len(), 2);
        assert!(lines(&flex, "DCGM_FI_PROF_PCIE_TX_BYTES").is_empty());
        let mut whole = opts();
        whole.selection = DeviceSelection::Gpus(None);
        let whole = build(&cat, &[o], &Attribution::default(), &whole);
        assert_eq!(lines(&whole, "DCGM_FI_PROF_PCIE_TX_BYTES").len(), 1);
    }

    #[test]
    fn the_device_label_names_the_gpu_index_not_the_minor_number() {
        let mut d = device(1, "G", &[(3, "1g.10gb")]);
        d.identity.minor = 7;
        let s = build(
            &cat(),
            &[outcome(d, 40, 100)],
            &Attribution::default(),
            &opts(),
        );
        let temps = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temps.len(), 1);
        assert!(
            temps[0].contains(r#"gpu="1""#) && temps[0].contains(r#"device="nvidia1""#),
            "{temps:?}"
        );
    }

    #[test]
    fn label_order_matches_dcgm_exporter_and_model_names_are_escaped() {
        let s = build(
            &cat(),
            &[outcome(device(0, "A \"quoted\" GPU", &[]), 40, 100)],
            &Attribution::default(),
            &opts(),
        );
        assert_eq!(
            lines(&s, "DCGM_FI_DEV_GPU_TEMP"),
            vec![
                r#"DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="A \"quoted\" GPU",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1"} 40"#
            ]
        );
        // A failed read is absent and counted; the others stay.
        assert!(lines(&s, "DCGM_FI_DEV_GPU_UTIL").is_empty());
        assert_eq!(
            s.field_errors,
            vec![(Field::GpuUtil, FieldError::NoPermission)]
        );
    }

    #[test]
    fn flex_exports_instances_for_mig_gpus_with_instance_and_parent_fields() {
        let outcomes = [
            outcome(
                device(0, "A100", &[(2, "3g.40gb"), (9, "1g.10gb")]),
                50,
                1000,
            ),
            outcome(device(1, "A100", &[]), 41, 7),
        ];
        let s = build(&cat(), &outcomes, &Attribution::default(), &opts());
        let fb = lines(&s, "DCGM_FI_DEV_FB_USED");
        assert_eq!(fb.len(), 3);
        assert!(
            fb[0].contains("GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"2\",hostname")
                && fb[0].ends_with(" 1002")
        );
        assert!(fb[1].contains("GPU_I_ID=\"9\"") && fb[1].ends_with(" 1009"));
        assert!(
            fb[2].contains("gpu=\"1\"") && !fb[2].contains("GPU_I_ID") && fb[2].ends_with(" 7")
        );
        // Temperature is the parent's, on each instance.
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temp.iter().filter(|l| l.ends_with(" 50")).count(), 2);
    }

    #[test]
    fn selections_pick_gpus_or_instances_by_id() {
        let outcomes = [
            outcome(
                device(0, "A100", &[(2, "3g.40gb"), (9, "1g.10gb")]),
                50,
                1000,
            ),
            outcome(device(1, "A100", &[]), 41, 7),
        ];
        let mut o = opts();
        o.selection = DeviceSelection::Instances(Some(vec![9]));
        let fb = lines(
            &build(&cat(), &outcomes, &Attribution::default(), &o),
            "DCGM_FI_DEV_FB_USED",
        );
        assert_eq!(fb.len(), 1);
        assert!(fb[0].contains("GPU_I_ID=\"9\""));
        o.selection = DeviceSelection::Gpus(Some(vec![0]));
        let fb = lines(
            &build(&cat(), &outcomes, &Attribution::default(), &o),
            "DCGM_FI_DEV_FB_USED",
        );
        assert_eq!(fb.len(), 1);
        assert!(
            fb[0].contains("gpu=\"0\"") && !fb[0].contains("GPU_I_ID") && fb[0].ends_with(" 1000")
        );
    }

    #[test]
    fn a_selection_that_matches_nothing_is_told_apart() {
        let mig = device(0, "A100", &[(2, "3g.40gb"), (9, "1g.10gb")]);
        let plain = device(1, "A100", &[]);
        let both = [mig.clone(), plain.clone()];
        for (sel, devices, selects) in [
            (DeviceSelection::Flex, &both[..], true),
            (DeviceSelection::Gpus(None), &both[..], true),
            (DeviceSelection::Gpus(Some(vec![1])), &both[..], true),
            (DeviceSelection::Gpus(Some(vec![99])), &both[..], false),
            (DeviceSelection::Instances(None), &both[..], true),
            (DeviceSelection::Instances(Some(vec![9])), &both[..], true),
            (DeviceSelection::Instances(Some(vec![5])), &both[..], false),
            // `-d i` on a node without MIG.
            (
                DeviceSelection::Instances(None),
                std::slice::from_ref(&plain),
                false,
            ),
        ] {
            assert_eq!(sel.selects_any(devices), selects, "{sel:?}");
            assert_eq!(sel.selects_nothing(devices).is_none(), selects, "{sel:?}");
        }
        assert_eq!(
            DeviceSelection::Gpus(Some(vec![99]))
                .selects_nothing(&both)
                .unwrap(),
            "-d/--devices \"g:99\" selects none of the 2 GPUs (indices 0, 1) and 2 MIG instances found, so no GPU series would be exported"
        );
        // No device at all is another matter (NVML not up yet, or no GPU): not this error.
        assert_eq!(
            DeviceSelection::Gpus(Some(vec![99])).selects_nothing(&[]),
            None
        );
        assert_eq!(
            DeviceSelection::Instances(Some(vec![1, 3])).to_string(),
            "i:1,3"
        );
    }

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
    fn old_namespace_renames_uuid_and_pod_labels_only() {
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(
            EntityKey {
                gpu: 1,
                gi_id: None,
            },
            vec![holder("solo", None)],
        );
        holders.insert(
            EntityKey {
                gpu: 0,
                gi_id: None,
            },
            vec![holder("a", Some("0")), holder("b", Some("1"))],
        );
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let outcomes = [
            outcome(device(0, "H100", &[]), 50, 1),
            outcome(device(1, "H100", &[]), 51, 2),
        ];
        let mut o = opts();
        o.old_namespace = true;
        let s = build(&cat(), &outcomes, &att, &o);
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(
            temp[1],
            r#"DCGM_FI_DEV_GPU_TEMP{gpu="1",uuid="GPU-1",pci_bus_id="00000000:01:00.0",device="nvidia1",modelName="H100",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container_name="c",pod_name="solo",pod_namespace="ns"} 51"#
        );
        assert!(!temp[0].contains("UUID=") && temp[0].contains(r#"uuid="GPU-0""#));
        let info = lines(&s, POD_INFO);
        assert!(
            info[0].contains(
                r#"uuid="GPU-0",pod_name="a",pod_namespace="ns",container_name="c",vgpu="0""#
            ),
            "{}",
            info[0]
        );
        o.virtual_gpus = true;
        let temp = lines(&build(&cat(), &outcomes, &att, &o), "DCGM_FI_DEV_GPU_TEMP");
        assert!(
            temp[0].ends_with(r#"container_name="c",pod_name="a",pod_namespace="ns",vgpu="0"} 50"#),
            "{}",
            temp[0]
        );
    }

    fn with_links(mut o: DeviceOutcome, links: &[(u32, i64)]) -> DeviceOutcome {
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

    #[test]
    fn links_render_as_dcgm_exporter_link_entities() {
        let cat = catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL, counter, r\nDCGM_FI_DRIVER_VERSION, label, d\nDCGM_FI_DEV_SERIAL, label, s\n",
            "t.csv",
        )
        .unwrap()
        .0;
        let mut a = outcome(device(0, "H100 SXM", &[]), 50, 1);
        a.labels.push((Field::Serial, Value::Text("123".into())));
        let outcomes = [
            with_links(a, &[(0, 0), (3, 7)]),
            with_links(outcome(device(1, "H100 SXM", &[]), 51, 2), &[(0, 1)]),
        ];
        let mut holders = std::collections::BTreeMap::new();
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
        let mut o = opts();
        // The GPU series' options do not change the link labels' names.
        o.hostname_label = "Hostname".into();
        o.replace_blanks_in_model_name = true;
        let s = build(&cat, &outcomes, &att, &o);
        let links = lines(&s, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL");
        assert_eq!(
            links,
            vec![
                r#"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL{nvlink="1",gpu="0",gpu_uuid="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",model_name="H100 SXM",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1"} 0"#,
                r#"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL{nvlink="4",gpu="0",gpu_uuid="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",model_name="H100 SXM",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1"} 7"#,
                r#"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL{nvlink="1",gpu="1",gpu_uuid="GPU-1",pci_bus_id="00000000:01:00.0",device="nvidia1",model_name="H100 SXM",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container="c",namespace="ns",pod="solo"} 1"#,
            ]
        );
        // GPU series keep theirs, and no link field leaks onto them.
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert!(temp[0].contains(r#"modelName="H100-SXM",Hostname="n1",DCGM_FI_DEV_SERIAL="123""#));
        // 2 GPU temperatures, 3 links, 1 pod-info series.
        assert_eq!(s.series, 2 + 3 + 1);
        // -o renames the pod labels on links too (gpu_uuid stays).
        o.old_namespace = true;
        let links = lines(
            &build(&cat, &outcomes, &att, &o),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
        );
        assert!(
            links[2].ends_with(r#"gpu_uuid="GPU-1",pci_bus_id="00000000:01:00.0",device="nvidia1",model_name="H100 SXM",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container_name="c",pod_name="solo",pod_namespace="ns"} 1"#),
            "{}",
            links[2]
        );
        // Links follow -d: g:ids picks their GPUs, i: none.
        o.selection = DeviceSelection::Gpus(Some(vec![1]));
        let links = lines(
            &build(&cat, &outcomes, &att, &o),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
        );
        assert_eq!(links.len(), 1);
        assert!(links[0].contains(r#"gpu="1""#));
        o.selection = DeviceSelection::Instances(None);
        assert!(lines(
            &build(&cat, &outcomes, &att, &o),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL"
        )
        .is_empty());
    }

    #[test]
    fn an_unreadable_gpu_keeps_only_health_and_xid_series() {
        let cat = catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_XID_ERRORS, gauge, x\nDCGM_EXP_GPU_HEALTH_STATUS, gauge, h\nDCGM_FI_DRIVER_VERSION, label, d\n",
            "t.csv",
        )
        .unwrap()
        .0;
        let mut lost = outcome(device(0, "H100", &[]), 50, 1);
        lost.sample = Err("gpu_lost");
        lost.recent.last_xid = Some(79);
        let s = build(&cat, &[lost], &Attribution::default(), &opts());
        assert!(lines(&s, "DCGM_FI_DEV_GPU_TEMP").is_empty());
        let xid = lines(&s, "DCGM_FI_DEV_XID_ERRORS");
        assert_eq!(xid.len(), 1);
        assert!(xid[0].ends_with(r#"DCGM_FI_DRIVER_VERSION="570.1",err_code="79",err_msg="GPU has fallen off the bus"} 79"#), "{}", xid[0]);
        let health = lines(&s, "DCGM_EXP_GPU_HEALTH_STATUS");
        assert_eq!(health.len(), health::WATCHES.len());
        assert!(health
            .iter()
            .any(|l| l
                .contains(r#"health_error_code="DCGM_FR_FALLEN_OFF_BUS",health_watch="ALL"} 20"#)));
    }

    fn dra_holder(pod: &str, claim: &str, device: &str) -> Holder {
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

    fn key(gpu: u32, gi_id: Option<u32>) -> EntityKey {
        EntityKey { gpu, gi_id }
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
    fn hpc_jobs_multiply_every_copy_and_sort_among_the_attributes() {
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(key(0, None), vec![holder("solo", None)]);
        let mut jobs = std::collections::BTreeMap::new();
        jobs.insert(key(0, None), vec!["1001".to_owned(), "1002".to_owned()]);
        // A plain file for a MIG GPU does not reach its instances, and vice versa.
        jobs.insert(key(1, None), vec!["x".to_owned()]);
        jobs.insert(key(1, Some(9)), vec!["77".to_owned()]);
        let att = Attribution { holders, jobs };
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
    fn links_carry_their_gpus_jobs_and_dra_claims_and_old_names_apply_to_dra_copies() {
        let cat = catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL, counter, r\n",
            "t.csv",
        )
        .unwrap()
        .0;
        let outcomes = [with_links(
            outcome(device(0, "H100", &[]), 50, 1),
            &[(2, 5)],
        )];
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(key(0, None), vec![dra_holder("p", "claim", "gpu-0")]);
        let mut jobs = std::collections::BTreeMap::new();
        jobs.insert(key(0, None), vec!["42".to_owned()]);
        let att = Attribution { holders, jobs };
        let link = &lines(
            &build(&cat, &outcomes, &att, &opts()),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
        )[0];
        assert!(
            link.ends_with(r#"hostname="n1",container="c",dra_claim_name="claim",dra_claim_namespace="ns",dra_device_name="gpu-0",dra_driver_name="gpu.nvidia.com",dra_pool_name="n1",hpc_job="42",namespace="ns",pod="p"} 5"#),
            "{link}"
        );
        let mut o = opts();
        o.old_namespace = true;
        let temp = &lines(&build(&cat, &outcomes, &att, &o), "DCGM_FI_DEV_GPU_TEMP")[0];
        assert!(
            temp.ends_with(r#"container_name="c",dra_claim_name="claim",dra_claim_namespace="ns",dra_device_name="gpu-0",dra_driver_name="gpu.nvidia.com",dra_pool_name="n1",hpc_job="42",pod_name="p",pod_namespace="ns"} 50"#),
            "{temp}"
        );
    }

    /// (pod name, UID, labels).
    type TestPod<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

    fn workload(pods: &[TestPod<'_>]) -> Workload {
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

    fn usage(pod: &str, sm: Option<u64>, mib: u64, w: &Workload) -> ContainerUsage {
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

    fn gpu0() -> EntityKey {
        EntityKey {
            gpu: 0,
            gi_id: None,
        }
    }

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

    fn with_util(mut o: DeviceOutcome, util: i64) -> DeviceOutcome {
        if let Ok(sample) = &mut o.sample {
            sample.readings.retain(|(f, _)| *f != Field::GpuUtil);
            sample.readings.push((Field::GpuUtil, Ok(Value::Int(util))));
        }
        o
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
        let att = Attribution { holders, jobs };
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
        let att = Attribution { holders, jobs };
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
