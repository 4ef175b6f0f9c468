//! What the builder is given (options, device outcomes, the workload), the label names its
//! options choose, and what it gives (the snapshot).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::selection::DeviceSelection;
use crate::catalog::Field;
use crate::gpu::{Device, DeviceSample, FieldError, Value};
use crate::health::{self, Recent};
use crate::pods::directory::PodDirectory;
use crate::pods::usage::EntityUsage;
use crate::pods::EntityKey;
use crate::render::Family;

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

/// The label names that `-o/--use-old-namespace` changes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Names {
    pub(super) uuid: &'static str,
    pub(super) pod: &'static str,
    pub(super) namespace: &'static str,
    pub(super) container: &'static str,
}

impl Names {
    pub(super) fn of(opts: &BuildOptions) -> Self {
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

impl Snapshot {
    /// Appends `fam`, counting its series.
    pub(super) fn push(&mut self, fam: Family) {
        self.series += fam.series.len();
        self.families.push(fam);
    }
}
