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
//!
//! # Layout
//!
//! - `selection`: `-d/--devices`, which GPUs, MIG instances and links are exported.
//! - `model`: what the builder is given and gives ([`BuildOptions`], [`DeviceOutcome`],
//!   [`Workload`], [`Snapshot`]).
//! - `labels`: label names, an entity's label prefix, and the names a pod label may not take.
//! - `copies`: the copies of an entity's series (DRA, virtual GPUs, HPC jobs, containers).
//! - `entity`: the exported entities and where their readings are found.
//! - `series`: one family's series per entity, the event-window fields and health.
//! - `pod_families`: the pod-info and per-container families.
//!
//! Each depends only on those listed before it; this file composes them.

mod copies;
mod entity;
mod labels;
mod model;
mod pod_families;
mod selection;
mod series;
#[cfg(test)]
mod testkit;

pub use labels::{pod_label_names, reserved_labels, POD_LABEL_PREFIX};
pub use model::{BuildOptions, DeviceOutcome, Snapshot, Workload};
pub use pod_families::{
    CONTAINER_DEC_UTIL, CONTAINER_ENC_UTIL, CONTAINER_FAMILIES, CONTAINER_FB_USED,
    CONTAINER_MEM_UTIL, CONTAINER_PROCESSES, CONTAINER_SM_UTIL, POD_INFO,
};
pub use selection::DeviceSelection;

use copies::Ctx;
use entity::{entity, link_entity};
use model::Names;
use pod_families::{container_families, pod_info};
use series::{entity_series, health_series};

use crate::catalog::{Catalog, Field};
use crate::pods::Attribution;
use crate::render::Family;

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
        snap.push(fam);
    }
    if let Some(fam) = pod_info(&ctx, &entities) {
        snap.push(fam);
    }
    for fam in container_families(&ctx, &entities) {
        snap.push(fam);
    }
    snap
}
