//! Pure snapshot builder: catalog + device samples + attribution → metric families.
//!
//! This is where dcgm-exporter's label contract lives: the label order `gpu, UUID, pci_bus_id,
//! device, modelName, [GPU_I_PROFILE, GPU_I_ID], hostname`, then label-type CSV fields (sorted
//! by name), then the per-series attributes (`err_code`, `xid`, pod labels, ...) sorted by name,
//! as dcgm-exporter's templates emit them. Each entity's label prefix is escaped once per sample.
//! A device that could not be read contributes no series except its health and XID series.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::catalog::field::MigScope;
use crate::catalog::{Catalog, Field, MetricSpec, MetricType};
use crate::gpu::{Device, DeviceSample, FieldError, MigInstance, Reading, Value};
use crate::health::{self, Recent};
use crate::pods::directory::{PodDirectory, PodMeta};
use crate::pods::usage::{ContainerUsage, EntityUsage};
use crate::pods::{Attribution, EntityKey, Holder, PodRef};
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

    fn instance_selected(&self, device: &Device, inst: &MigInstance) -> bool {
        match self {
            DeviceSelection::Flex => device.mig_enabled,
            DeviceSelection::Gpus(_) => false,
            DeviceSelection::Instances(None) => true,
            DeviceSelection::Instances(Some(ids)) => ids.contains(&inst.gi_id),
        }
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
    /// Add `pod_uid` to pod-labelled series (`--kubernetes-enable-pod-uid`).
    pub pod_uid: bool,
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

/// Label names a pod label may not take: the identity labels, every per-series attribute, and
/// the attribute families reserved for pod attribution. A pod label with one of these names (or
/// a label-type CSV field's, or the hostname label's) is left out, as dcgm-exporter never lets
/// pod labels override its own.
const RESERVED_LABELS: &[&str] = &[
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "hostname",
    "Hostname",
    "container",
    "namespace",
    "pod",
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
    fn new(prefix: &str, attrs: Vec<(&'static str, String)>, pod_labels: String) -> Self {
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

    /// The value this copy carries for `field`: the holder's own for the two per-process
    /// fields when known, else the device's.
    fn value(&self, field: Field, device: &Value) -> Value {
        let own = self.own.and_then(|o| match field {
            Field::GpuUtil => o.sm,
            Field::FbUsed => o.fb_mib,
            _ => None,
        });
        own.map_or_else(|| device.clone(), Value::Int)
    }
}

/// Renders a pod's labels (`,name="value"` each, after the other labels), leaving out names
/// in `reserved`.
fn render_pod_labels(meta: Option<&PodMeta>, reserved: &HashSet<String>) -> String {
    let mut out = String::new();
    for (k, v) in meta.map_or(&[][..], |m| m.labels.as_slice()) {
        if !reserved.contains(k.as_str()) && !k.starts_with("dra_") {
            push_label(&mut out, k, v);
        }
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
    /// Escaped label prefix: identity, hostname and label-type fields.
    prefix: String,
    /// Attribute sets, one per exported copy of each series.
    variants: Vec<Variant>,
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
        match (self.instance, field.mig_scope()) {
            (None, _) | (Some(_), MigScope::Parent) => {
                find(&sample.readings).map(|i| &sample.readings[i].1)
            }
            (Some(inst), MigScope::Instance) => {
                let is = sample.instances.iter().find(|s| s.gi_id == inst.gi_id)?;
                find(&is.readings).map(|i| &is.readings[i].1)
            }
            (Some(_), MigScope::Unsupported) => None,
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
    let mut reserved: HashSet<String> = RESERVED_LABELS.iter().map(|s| (*s).to_owned()).collect();
    reserved.insert(opts.hostname_label.clone());
    reserved.extend(catalog.labels.iter().map(|l| l.name.clone()));
    let ctx = Ctx {
        catalog,
        attribution,
        workload,
        opts,
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
    reserved: &'a HashSet<String>,
}

impl Ctx<'_> {
    fn meta(&self, pod: &PodRef) -> Option<&PodMeta> {
        self.workload
            .directory
            .pod(&pod.namespace, &pod.pod)
            .map(AsRef::as_ref)
    }

    /// `container`, `namespace`, `pod` and, when asked for and known, `pod_uid`.
    fn pod_attrs(&self, pod: &PodRef, uid: Option<&str>) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("container", pod.container.clone()),
            ("namespace", pod.namespace.clone()),
            ("pod", pod.pod.clone()),
        ];
        if self.opts.pod_uid {
            if let Some(uid) = uid.filter(|u| !u.is_empty()) {
                v.push(("pod_uid", uid.to_owned()));
            }
        }
        v
    }
}

fn entity<'a>(
    ctx: &Ctx<'a>,
    outcome: &'a DeviceOutcome,
    instance: Option<&'a MigInstance>,
) -> Entity<'a> {
    let opts = ctx.opts;
    let key = EntityKey {
        gpu: outcome.device.identity.index,
        gi_id: instance.map(|i| i.gi_id),
    };
    let holders = ctx.attribution.holders_of(key);
    let usage = ctx.workload.usage.get(&key);
    let mut prefix = identity_labels(outcome, instance, opts);
    push_label_fields(&mut prefix, ctx.catalog, outcome);
    let holder_variant = |h: &Holder, with_vgpu: bool| {
        let meta = ctx.meta(&h.pod);
        let mut attrs = ctx.pod_attrs(&h.pod, meta.map(|m| m.uid.as_str()));
        if with_vgpu {
            if let Some(r) = &h.vgpu {
                attrs.push(("vgpu", r.clone()));
            }
        }
        attrs.sort_by_key(|(k, _)| *k);
        Variant::new(&prefix, attrs, render_pod_labels(meta, ctx.reserved))
    };
    // One container holding several replicas of a GPU is still a single holder.
    let sole = holders
        .first()
        .filter(|first| holders.iter().all(|h| h.pod == first.pod));
    let variants = match (holders, opts.virtual_gpus) {
        ([], _) => vec![Variant::new(&prefix, vec![], String::new())],
        (_, false) => match sole {
            Some(one) => vec![holder_variant(one, false)],
            None => vec![Variant::new(&prefix, vec![], String::new())],
        },
        (many, true) => {
            let mut vs: Vec<Variant> = many.iter().map(|h| holder_variant(h, true)).collect();
            if let Some(u) = usage.filter(|u| u.complete) {
                for (i, (h, v)) in many.iter().zip(&mut vs).enumerate() {
                    // A container holding several replicas gets its value on the first and 0 on
                    // the others, so that summing over holders counts it once.
                    let repeat = many[..i].iter().any(|earlier| earlier.pod == h.pod);
                    v.own = Some(own_use(u, &h.pod, repeat));
                }
            }
            vs
        }
    };
    Entity {
        outcome,
        instance,
        prefix,
        variants,
        holders,
        usage,
    }
}

/// A holder's own use of an entity whose processes were all attributed.
fn own_use(usage: &EntityUsage, pod: &PodRef, repeat: bool) -> Own {
    let util_known = usage.containers.iter().all(|c| c.utilization.is_some());
    match usage.of(pod) {
        _ if repeat => Own {
            sm: util_known.then_some(0),
            fb_mib: Some(0),
        },
        Some(c) => Own {
            sm: c
                .utilization
                .map(|u| i64::try_from(u.sm.min(100)).unwrap_or(100)),
            fb_mib: c.fb_used_mib.map(|m| i64::try_from(m).unwrap_or(i64::MAX)),
        },
        // No process of the holder runs here: it uses nothing.
        None => Own {
            sm: util_known.then_some(0),
            fb_mib: Some(0),
        },
    }
}

fn push_label_fields(prefix: &mut String, catalog: &Catalog, outcome: &DeviceOutcome) {
    for spec in &catalog.labels {
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
    push_label(&mut s, "UUID", &id.uuid);
    push_label(&mut s, "pci_bus_id", &id.pci_bus_id);
    push_label(&mut s, "device", &format!("nvidia{}", id.minor));
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
            for &(reason, n) in &recent.clock_event_counts {
                push(
                    &[("clock_event", reason.to_owned()), window.clone()],
                    Value::Int(i64::try_from(n).unwrap_or(i64::MAX)),
                );
            }
        }
        field => match e.reading(field) {
            Some(Ok(v @ (Value::Int(_) | Value::Float(_)))) => {
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
        push_label_fields(&mut prefix, catalog, o);
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
    let mut fam = Family {
        name: POD_INFO.to_owned(),
        help: "Pods holding each GPU or MIG instance (one series per holder; join on UUID and GPU_I_ID)."
            .to_owned(),
        kind: MetricType::Gauge,
        series: Vec::new(),
    };
    for e in entities {
        let id = &e.outcome.device.identity;
        for h in e.holders {
            let meta = ctx.meta(&h.pod);
            let mut s = String::new();
            push_label(&mut s, "gpu", &id.index.to_string());
            push_label(&mut s, "UUID", &id.uuid);
            if let Some(i) = e.instance {
                push_label(&mut s, "GPU_I_ID", &i.gi_id.to_string());
            }
            push_label(&mut s, "pod", &h.pod.pod);
            push_label(&mut s, "namespace", &h.pod.namespace);
            push_label(&mut s, "container", &h.pod.container);
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
/// the entity's labels, then the container's `container`, `namespace`, `pod` (`pod_uid`) and
/// pod labels.
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
            for (k, v) in ctx.pod_attrs(&c.pod, Some(&c.meta.uid)) {
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
    use crate::pods::PodRef;

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
            pod_uid: false,
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
        }
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
        let att = Attribution { holders };
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
        let att = Attribution { holders };
        let w = workload(&[(
            "a",
            "uid-a",
            &[
                ("team", "search"),
                ("app.kubernetes.io/name", "embed"),
                // These would clash with labels the exporter sets: left out.
                ("pod", "evil"),
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
            temp[0].ends_with(r#"container="c",namespace="ns",pod="a",pod_uid="uid-a",app_kubernetes_io_name="embed",team="search"} 50"#),
            "{}",
            temp[0]
        );
        let info = lines(&s, POD_INFO);
        assert!(
            info[0].ends_with(
                r#"vgpu="",pod_uid="uid-a",app_kubernetes_io_name="embed",team="search"} 1"#
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
        let att = Attribution { holders };
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
        let att = Attribution { holders };
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
        // a (capped at 100), a's second replica 0, b, the idle holder 0.
        assert_eq!(util, ["100", "0", "12", "0"]);
        let fb: Vec<String> = lines(&s, "DCGM_FI_DEV_FB_USED")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(fb, ["100", "0", "50", "0"]);
        // Other fields stay copies.
        let temp: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_TEMP")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(temp, ["50", "50", "50", "50"]);

        // An incomplete entity (a process not attributed) keeps the device's value everywhere.
        w.usage.get_mut(&gpu0()).unwrap().complete = false;
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &w, &o);
        let util: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_UTIL")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(util, ["99", "99", "99", "99"]);
        // No usage at all (per-process attribution off or failed): copies too.
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &workload(&[]), &o);
        let fb: Vec<String> = lines(&s, "DCGM_FI_DEV_FB_USED")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(fb, ["160", "160", "160", "160"]);
    }
}
