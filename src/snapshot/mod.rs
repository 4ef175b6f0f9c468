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
//! What the steps share:
//!
//! - `model`: what the builder is given and gives ([`BuildOptions`], [`DeviceOutcome`],
//!   [`Workload`], [`Snapshot`]), and the label names `-o` picks.
//! - `selection`: `-d/--devices` ([`DeviceSelection`]), one of the options.
//!
//! The steps, in the order a sample goes through them; each reads only what the steps before it
//! made, and [`build_with`] composes them:
//!
//! 1. `entities`: which entities are exported (GPUs, MIG instances, NVLinks; every GPU for
//!    health), each with its escaped label prefix.
//! 2. `copies`: attribution, which copies of each entity's series there are (DRA, virtual GPUs,
//!    HPC jobs, containers), who holds each entity and which containers use it.
//! 3. `labels`: each copy's label set, the pod-info and per-container label sets, and the names
//!    a pod label may not take.
//! 4. `series`: the catalog's families, the value of each copy (event-window fields, health).
//! 5. `pod_families`: the pod-info and per-container families.

mod copies;
mod entities;
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

use crate::catalog::Catalog;
use crate::pods::Attribution;

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
    let entities = entities::select(catalog, outcomes, opts);
    let copies = copies::attribute(entities, attribution, workload, opts);
    let labels = labels::label(copies, catalog, opts);
    let mut snap = Snapshot::default();
    series::families(catalog, &labels, opts, &mut snap);
    pod_families::families(labels, &mut snap);
    snap
}
