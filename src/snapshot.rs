//! Pure snapshot builder: catalog + device samples + attribution → metric families.
//!
//! This is where dcgm-exporter's label contract lives: the label order `gpu, UUID, pci_bus_id,
//! device, modelName, [GPU_I_PROFILE, GPU_I_ID], hostname`, then label-type CSV fields (sorted
//! by name), then the per-series attributes (`err_code`, `xid`, pod labels, ...) sorted by name,
//! as dcgm-exporter's templates emit them. Each entity's label prefix is escaped once per sample.
//! A device that could not be read contributes no series except its health and XID series.

use crate::catalog::field::MigScope;
use crate::catalog::{Catalog, Field, MetricSpec, MetricType};
use crate::gpu::{Device, DeviceSample, FieldError, MigInstance, Reading, Value};
use crate::health::{self, Recent};
use crate::pods::{Attribution, EntityKey, Holder};
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

struct Entity<'a> {
    outcome: &'a DeviceOutcome,
    instance: Option<&'a MigInstance>,
    /// Escaped label prefix: identity, hostname and label-type fields.
    prefix: String,
    /// Attribute sets, one per exported copy of each series.
    variants: Vec<Vec<(&'static str, String)>>,
    /// Who holds the entity.
    holders: &'a [Holder],
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

    let mut snap = Snapshot::default();
    for spec in &catalog.metrics {
        let mut fam = Family {
            name: spec.name.clone(),
            help: spec.help.clone(),
            kind: spec.kind,
            series: Vec::new(),
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
    if let Some(fam) = pod_info(&entities) {
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
    let pod_attrs = |h: &Holder, with_vgpu: bool| {
        let mut v = vec![
            ("container", h.pod.container.clone()),
            ("namespace", h.pod.namespace.clone()),
            ("pod", h.pod.pod.clone()),
        ];
        if with_vgpu {
            if let Some(r) = &h.vgpu {
                v.push(("vgpu", r.clone()));
            }
        }
        v
    };
    let variants = match (holders, opts.virtual_gpus) {
        ([], _) => vec![vec![]],
        ([one], false) => vec![pod_attrs(one, false)],
        (_, false) => vec![vec![]],
        (many, true) => many.iter().map(|h| pod_attrs(h, true)).collect(),
    };
    let mut e = Entity {
        outcome,
        instance,
        prefix: identity_labels(outcome, instance, opts),
        variants,
        holders,
    };
    for spec in &catalog.labels {
        if let Some(Ok(v)) = e.reading(spec.field) {
            let v = v.to_string();
            push_label(&mut e.prefix, &spec.name, &v);
        }
    }
    e
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

/// Renders prefix + sorted merge of `extras` and `variant` attributes.
fn labels(
    prefix: &str,
    extras: &[(&'static str, String)],
    variant: &[(&'static str, String)],
) -> String {
    let mut s = String::with_capacity(prefix.len() + 64);
    s.push_str(prefix);
    if extras.is_empty() {
        for (k, v) in variant {
            push_label(&mut s, k, v);
        }
        return s;
    }
    let mut attrs: Vec<&(&'static str, String)> = extras.iter().chain(variant).collect();
    attrs.sort_by_key(|(k, _)| *k);
    for (k, v) in attrs {
        push_label(&mut s, k, v);
    }
    s
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
        if let Ok(sample) = &o.sample {
            for spec in &catalog.labels {
                if let Some(v) = sample.get(spec.field) {
                    push_label(&mut prefix, &spec.name, &v.to_string());
                }
            }
        }
        for c in o.health(opts.xid_window_ms) {
            let mut s = prefix.clone();
            push_label(&mut s, "health_error_code", c.code);
            push_label(&mut s, "health_watch", c.watch);
            fam.series.push(Series {
                labels: s,
                value: Value::Int(c.status as i64),
            });
        }
    }
}

fn pod_info(entities: &[Entity<'_>]) -> Option<Family> {
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
            fam.series.push(Series {
                labels: s,
                value: Value::Int(1),
            });
        }
    }
    (!fam.series.is_empty()).then_some(fam)
}
