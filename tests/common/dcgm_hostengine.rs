//! The DCGM stand-in's "hostengine" (tests/dcgm_abi/dcgm_standin.c) for a set of devices: every
//! GPU and MIG GPU instance known to DCGM, numbered the other way round from the devices (so
//! that only a mapping by UUID and GPU instance id finds them), and a distinct value of each
//! profiling field for each. Included by path from the DCGM tests and bench, so it uses nothing
//! but std and the crate.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpu_exporter::gpu::dcgm::{Entity, EntityGroup};
use gpu_exporter::gpu::Device;

/// The profiling fields the hostengine holds values of: graphics, tensor and DRAM activity,
/// PCIe TX/RX bytes.
pub const PROF: [u16; 5] = [1001, 1004, 1005, 1009, 1010];

/// Writes the stand-in's configuration for `devices` into `dir`; returns its path and the
/// DCGM entities (GPUs, then each GPU's instances).
pub fn hostengine(devices: &[Device], dir: &Path) -> (PathBuf, Vec<Entity>) {
    let mut conf = BTreeMap::new();
    let n = devices.len();
    conf.insert("gpus".to_owned(), n.to_string());
    conf.insert(
        "metricgroup.0".to_owned(),
        "1 0 1001 1002 1003 1004 1005".to_owned(),
    );
    conf.insert("metricgroup.1".to_owned(), "2 0 1009 1010".to_owned());
    let mut entities = Vec::new();
    let mut mig = 0;
    for (i, d) in devices.iter().enumerate() {
        let id = u32::try_from(n - 1 - i).expect("few GPUs");
        conf.insert(format!("uuid.{id}"), d.identity.uuid.clone());
        entities.push(Entity {
            group: EntityGroup::Gpu,
            id,
        });
        for f in PROF {
            conf.insert(format!("value.1.{id}.{f}"), format!("0.{id}{f}"));
        }
        for inst in &d.instances {
            let entity = 100 + mig;
            conf.insert(
                format!("mig.{mig}"),
                format!("{id} {entity} {}", inst.gi_id),
            );
            entities.push(Entity {
                group: EntityGroup::GpuInstance,
                id: entity,
            });
            for f in PROF {
                conf.insert(format!("value.4.{entity}.{f}"), format!("0.{entity}{f}"));
            }
            mig += 1;
        }
    }
    let text: String = conf.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
    let path = dir.join("hostengine.conf");
    std::fs::write(&path, text).expect("write the stand-in configuration");
    (path, entities)
}
