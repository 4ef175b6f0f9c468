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
//! (with the pod labels of a sole holder); each of these once per HPC job (`hpc_job`).

use std::sync::Arc;

use crate::catalog::field::MigScope;
use crate::catalog::{Catalog, Field, MetricSpec, MetricType};
use crate::gpu::{Device, DeviceSample, FieldError, LinkSample, MigInstance, Reading, Value};
use crate::health::{self, Recent};
use crate::pods::{Attribution, DraClaim, EntityKey, Holder};
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
    pub old_namespace: bool,
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

/// The per-copy attributes of an entity's series (pod labels, `vgpu`): as pairs, to merge with
/// per-series attributes in name order, and as the entity's whole label set, rendered once and
/// shared by every series of the entity that has no other attributes (most of them).
struct Variant {
    attrs: Vec<(&'static str, String)>,
    full: Arc<str>,
}

impl Variant {
    fn new(prefix: &str, mut attrs: Vec<(&'static str, String)>) -> Self {
        attrs.sort_by_key(|(k, _)| *k);
        let mut full = String::with_capacity(prefix.len() + 96);
        full.push_str(prefix);
        for (k, v) in &attrs {
            push_label(&mut full, k, v);
        }
        Self {
            attrs,
            full: full.into(),
        }
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
    /// Who holds the entity.
    holders: &'a [Holder],
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

/// Builds the snapshot.
pub fn build(
    catalog: &Catalog,
    outcomes: &[DeviceOutcome],
    attribution: &Attribution,
    opts: &BuildOptions,
) -> Snapshot {
    let mut entities = Vec::new();
    for outcome in outcomes {
        let d = &outcome.device;
        if opts.selection.gpu_selected(d) {
            entities.push(entity(catalog, outcome, None, attribution, opts));
        }
        for inst in &d.instances {
            if opts.selection.instance_selected(d, inst) {
                entities.push(entity(catalog, outcome, Some(inst), attribution, opts));
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
                    links.push(link_entity(catalog, outcome, l, attribution, opts));
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
    if let Some(fam) = pod_info(&entities, Names::of(opts)) {
        snap.series += fam.series.len();
        snap.families.push(fam);
    }
    snap
}

fn entity<'a>(
    catalog: &Catalog,
    outcome: &'a DeviceOutcome,
    instance: Option<&'a MigInstance>,
    attribution: &'a Attribution,
    opts: &BuildOptions,
) -> Entity<'a> {
    let key = EntityKey {
        gpu: outcome.device.identity.index,
        gi_id: instance.map(|i| i.gi_id),
    };
    let holders = attribution.holders_of(key);
    let mut prefix = identity_labels(outcome, instance, opts);
    push_label_fields(&mut prefix, catalog, outcome, |_| true);
    let variants = variants(holders, instance, attribution.jobs_of(key), opts)
        .into_iter()
        .map(|attrs| Variant::new(&prefix, attrs))
        .collect();
    Entity {
        outcome,
        instance,
        link: None,
        prefix,
        variants,
        holders,
    }
}

/// A GPU's NVLink as dcgm-exporter renders link entities: `nvlink` (the link index + 1, as
/// dcgm-exporter numbers a GPU's links from 1), then the parent GPU as `gpu`, `gpu_uuid`,
/// `pci_bus_id`, `device`, `model_name` (these names, and a lowercase `hostname`, whatever the
/// GPU series use), then the system-wide label-type fields (driver version), then the pod
/// labels of the pods holding the whole GPU and its HPC jobs.
fn link_entity<'a>(
    catalog: &Catalog,
    outcome: &'a DeviceOutcome,
    link: &'a LinkSample,
    attribution: &'a Attribution,
    opts: &BuildOptions,
) -> Entity<'a> {
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
    push_label_fields(&mut prefix, catalog, outcome, Field::is_system);
    let gpu = EntityKey {
        gpu: id.index,
        gi_id: None,
    };
    let holders = attribution.holders_of(gpu);
    // As dcgm-exporter, links carry their GPU's job labels (its `<gpu>` file).
    let variants = variants(holders, None, attribution.jobs_of(gpu), opts)
        .into_iter()
        .map(|attrs| Variant::new(&prefix, attrs))
        .collect();
    Entity {
        outcome,
        instance: None,
        link: Some(link),
        prefix,
        variants,
        // Shared GPUs are joined through the GPU's own pod-info series.
        holders: &[],
    }
}

/// The attribute sets of an entity (a GPU or MIG `instance`) held by `holders` and running
/// `jobs`: one per DRA holder (with its claim), else one (possibly empty) set, or one per holder
/// with `--kubernetes-virtual-gpus`; each of these once per HPC job.
fn variants(
    holders: &[Holder],
    instance: Option<&MigInstance>,
    jobs: &[String],
    opts: &BuildOptions,
) -> Vec<Vec<(&'static str, String)>> {
    let names = Names::of(opts);
    let pod_attrs = |h: &Holder, with_vgpu: bool| {
        let mut v = vec![
            (names.container, h.pod.container.clone()),
            (names.namespace, h.pod.namespace.clone()),
            (names.pod, h.pod.pod.clone()),
        ];
        if with_vgpu {
            if let Some(r) = &h.vgpu {
                v.push(("vgpu", r.clone()));
            }
        }
        v
    };
    // As dcgm-exporter: one copy per DRA holder, with its claim, whatever the sharing mode.
    let dra_attrs = |h: &Holder, c: &DraClaim| {
        let mut v = pod_attrs(h, false);
        v.extend([
            ("dra_claim_name", c.claim_name.clone()),
            ("dra_claim_namespace", c.claim_namespace.clone()),
            ("dra_device_name", c.device.clone()),
            ("dra_driver_name", c.driver.clone()),
            ("dra_pool_name", c.pool.clone()),
        ]);
        if let Some(i) = instance {
            v.push(("dra_mig_device_uuid", i.uuid.clone()));
            v.push(("dra_mig_profile", i.profile.clone()));
        }
        v
    };
    let dra: Vec<Vec<(&'static str, String)>> = holders
        .iter()
        .filter_map(|h| h.dra.as_ref().map(|c| dra_attrs(h, c)))
        .collect();
    // One container holding several replicas of a GPU is still a single holder.
    let sole = holders
        .first()
        .filter(|first| holders.iter().all(|h| h.pod == first.pod));
    let pods = match (holders, opts.virtual_gpus) {
        _ if !dra.is_empty() => dra,
        ([], _) => vec![vec![]],
        (_, false) => match sole {
            Some(one) => vec![pod_attrs(one, false)],
            None => vec![vec![]],
        },
        (many, true) => many.iter().map(|h| pod_attrs(h, true)).collect(),
    };
    // HPC jobs multiply the copies: one per job (dcgm-exporter applies them after the pods).
    if jobs.is_empty() {
        return pods;
    }
    pods.iter()
        .flat_map(|v| {
            jobs.iter().map(move |j| {
                let mut v = v.clone();
                v.push(("hpc_job", j.clone()));
                v
            })
        })
        .collect()
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
            Some(Ok(v @ (Value::Int(_) | Value::Float(_)))) => push(&[], v.clone()),
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

fn pod_info(entities: &[Entity<'_>], names: Names) -> Option<Family> {
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
            fam.series.push(Series {
                labels: s.into(),
                value: Value::Int(1),
            });
        }
    }
    (!fam.series.is_empty()).then_some(fam)
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
}
