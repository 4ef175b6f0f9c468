//! The blocking part of a tick: every device read on a blocking thread, with (for per-process
//! attribution) its processes and their cgroup owners, then the XIDs.

use std::collections::{BTreeMap, HashMap};

use crate::catalog::Field;
use crate::gpu::{Device, DeviceSample, FieldError, GpuProcess, GpuSource, SourceError, XidEvent};
use crate::pods::procfs::ProcRoot;
use crate::pods::usage::Owner;

/// One device and what reading it gave.
pub(super) type DeviceRead = (Device, Result<DeviceSample, SourceError>);

/// What one tick read on the blocking thread: samples, per-process readings (per device, when
/// on), the cgroup owner of every PID, one error text per failure reason, and XIDs.
pub(super) struct TickRead {
    pub(super) samples: Vec<DeviceRead>,
    pub(super) processes: Vec<Option<Result<Vec<GpuProcess>, FieldError>>>,
    pub(super) owners: HashMap<u32, Owner>,
    pub(super) examples: BTreeMap<&'static str, String>,
    pub(super) xids: Vec<(String, XidEvent)>,
}

/// The blocking part of a tick: every device's sample (and, with per-process attribution, its
/// processes and their cgroups), then the XIDs.
pub(super) fn read_devices<S: GpuSource>(
    source: &S,
    devices: Vec<Device>,
    fields: &[Field],
    proc_root: Option<&ProcRoot>,
) -> TickRead {
    let mut samples = Vec::with_capacity(devices.len());
    let mut processes = Vec::with_capacity(devices.len());
    for d in devices {
        let r = source.sample(&d, fields);
        let p = match (proc_root, &r) {
            (Some(_), Ok(_)) => Some(source.processes(&d)),
            _ => None,
        };
        samples.push((d, r));
        processes.push(p);
    }
    let mut owners = HashMap::new();
    let mut examples = BTreeMap::new();
    if let Some(root) = proc_root {
        for list in processes.iter().flatten().flatten() {
            for p in list {
                owners.entry(p.pid).or_insert_with(|| {
                    root.owner(p.pid).map_err(|e| {
                        examples
                            .entry(e.reason())
                            .or_insert_with(|| crate::error_chain(&e));
                        e.reason()
                    })
                });
            }
        }
    }
    TickRead {
        samples,
        processes,
        owners,
        examples,
        xids: source.drain_xids(),
    }
}
