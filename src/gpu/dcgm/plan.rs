//! The pure half of the DCGM source: which DCGM entity is which of our devices, and which
//! profiling fields can be watched together. No I/O; the reader thread
//! ([`super::source`]) feeds it what the hostengine said.

use std::collections::{BTreeMap, BTreeSet};

use super::{status, Entity, EntityGroup, MetricGroup, MigEntity};
use crate::gpu::Device;

/// Where a DCGM entity's readings go: a physical GPU (by UUID) or one of its MIG GPU instances.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// The physical GPU's UUID.
    pub uuid: String,
    /// The GPU instance id (`GPU_I_ID`) on it, for a MIG GPU instance.
    pub gi: Option<u32>,
}

/// Maps the hostengine's entities to our devices, never by index: a DCGM GPU id by the UUID
/// DCGM reports for it (`gpus`: id and UUID), a GPU instance entity by its GPU's UUID and its
/// NVML GPU instance id. Entities of devices we do not monitor (or compute instances) are left
/// out, as are our devices DCGM does not know.
pub fn map_entities(
    devices: &[Device],
    gpus: &[(u32, String)],
    mig: &[MigEntity],
) -> BTreeMap<Entity, Target> {
    let mut out = BTreeMap::new();
    for d in devices {
        let uuid = &d.identity.uuid;
        if let Some((id, _)) = gpus.iter().find(|(_, u)| u == uuid) {
            out.insert(
                Entity {
                    group: EntityGroup::Gpu,
                    id: *id,
                },
                Target {
                    uuid: uuid.clone(),
                    gi: None,
                },
            );
        }
        for inst in &d.instances {
            let found = mig.iter().find(|m| {
                m.entity.group == EntityGroup::GpuInstance
                    && m.gpu_uuid == *uuid
                    && m.instance_id == inst.gi_id
            });
            if let Some(m) = found {
                out.insert(
                    m.entity,
                    Target {
                        uuid: uuid.clone(),
                        gi: Some(inst.gi_id),
                    },
                );
            }
        }
    }
    out
}

/// Why DCGM does not serve a field; the `reason` label of `gpu_exporter_dcgm_fields_refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// No supported metric group holds it (the GPU's profiling module cannot read it), or
    /// `dcgmWatchFields` said `DCGM_ST_PROFILING_NOT_SUPPORTED` / `DCGM_ST_NOT_SUPPORTED`.
    NotSupported,
    /// Its metric group shares a major id with one already watched: DCGM would need several
    /// passes (`DCGM_ST_PROFILING_MULTI_PASS`), which the exporter does not ask for.
    MultiPass,
    /// The hostengine lacks the privilege (`DCGM_ST_NO_PERMISSION`, `DCGM_ST_REQUIRES_ROOT`).
    NoPermission,
    /// The hostengine runs without its profiling module (`DCGM_ST_MODULE_NOT_LOADED`).
    ModuleNotLoaded,
    /// Another refusal.
    Error,
}

impl Refusal {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotSupported => "not_supported",
            Refusal::MultiPass => "multi_pass",
            Refusal::NoPermission => "no_permission",
            Refusal::ModuleNotLoaded => "module_not_loaded",
            Refusal::Error => "error",
        }
    }

    /// The refusal a `dcgmWatchFields` / `dcgmProfGetSupportedMetricGroups` status means.
    pub fn from_status(code: i32) -> Self {
        match code {
            status::NOT_SUPPORTED | status::PROFILING_NOT_SUPPORTED => Refusal::NotSupported,
            status::PROFILING_MULTI_PASS => Refusal::MultiPass,
            status::NO_PERMISSION | status::REQUIRES_ROOT => Refusal::NoPermission,
            status::MODULE_NOT_LOADED => Refusal::ModuleNotLoaded,
            _ => Refusal::Error,
        }
    }
}

/// What to watch: the fields DCGM's profiling module can read in one pass, and the rest with
/// why not.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WatchPlan {
    /// Field ids to watch together, ascending.
    pub watch: Vec<u16>,
    /// Field ids left out, and why.
    pub refused: BTreeMap<u16, Refusal>,
}

/// Plans the watch of `wanted` profiling fields (ascending ids win) on a GPU whose profiling
/// module offers `groups`: each field takes a metric group holding it, preferring one already
/// taken; a group whose major id is already taken by another minor cannot be added (DCGM reads
/// groups of one major in separate passes), so its fields are refused as multi-pass.
pub fn plan_watch(wanted: &BTreeSet<u16>, groups: &[MetricGroup]) -> WatchPlan {
    let mut taken: BTreeMap<u16, u16> = BTreeMap::new(); // major -> minor
    let mut plan = WatchPlan::default();
    for &f in wanted {
        let holders: Vec<&MetricGroup> = groups.iter().filter(|g| g.fields.contains(&f)).collect();
        if holders.is_empty() {
            plan.refused.insert(f, Refusal::NotSupported);
            continue;
        }
        let already = holders
            .iter()
            .any(|g| taken.get(&g.major) == Some(&g.minor));
        if already {
            plan.watch.push(f);
        } else if let Some(g) = holders.iter().find(|g| !taken.contains_key(&g.major)) {
            taken.insert(g.major, g.minor);
            plan.watch.push(f);
        } else {
            plan.refused.insert(f, Refusal::MultiPass);
        }
    }
    plan
}

/// The most entities a DCGM entity group holds (`DCGM_GROUP_MAX_ENTITIES`): adding one more
/// fails with `DCGM_ST_MAX_LIMIT`.
pub const MAX_GROUP_ENTITIES: usize = 64;

/// `entities` in groups of at most [`MAX_GROUP_ENTITIES`], in order: one DCGM entity group
/// each (8 GPUs with 7 MIG instances each and their parents are 64 entities; more GPUs or
/// compute instances are more).
pub fn entity_groups(entities: &[Entity]) -> impl Iterator<Item = &[Entity]> {
    entities.chunks(MAX_GROUP_ENTITIES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{GpuIdentity, MigInstance};

    fn device(uuid: &str, index: u32, gis: &[u32]) -> Device {
        Device {
            identity: GpuIdentity {
                index,
                uuid: uuid.into(),
                pci_bus_id: String::new(),
                minor: index,
                model: "NVIDIA A100-SXM4-80GB".into(),
            },
            mig_enabled: !gis.is_empty(),
            instances: gis
                .iter()
                .map(|&gi| MigInstance {
                    gi_id: gi,
                    ci_id: 0,
                    profile: "3g.40gb".into(),
                    uuid: format!("MIG-{gi}"),
                    placement: None,
                })
                .collect(),
        }
    }

    fn gi(entity: u32, gpu: u32, uuid: &str, gi: u32) -> MigEntity {
        MigEntity {
            entity: Entity {
                group: EntityGroup::GpuInstance,
                id: entity,
            },
            parent: Entity {
                group: EntityGroup::Gpu,
                id: gpu,
            },
            gpu_uuid: uuid.into(),
            instance_id: gi,
            compute_instance_id: u32::MAX,
        }
    }

    #[test]
    fn entities_map_by_uuid_and_gpu_instance_id_never_by_index() {
        // DCGM numbers the GPUs the other way round from NVML, and its GPU instance entity ids
        // are not the GI ids.
        let devices = [device("GPU-a", 0, &[]), device("GPU-b", 1, &[2, 9])];
        let gpus = [(0, "GPU-b".to_owned()), (1, "GPU-a".to_owned())];
        let mig = [
            gi(0, 0, "GPU-b", 9),
            gi(1, 0, "GPU-b", 2),
            gi(2, 5, "GPU-elsewhere", 2),
        ];
        let m = map_entities(&devices, &gpus, &mig);
        let t = |uuid: &str, gi| Target {
            uuid: uuid.into(),
            gi,
        };
        let e = |group, id| Entity { group, id };
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            [
                (e(EntityGroup::Gpu, 0), t("GPU-b", None)),
                (e(EntityGroup::Gpu, 1), t("GPU-a", None)),
                (e(EntityGroup::GpuInstance, 0), t("GPU-b", Some(9))),
                (e(EntityGroup::GpuInstance, 1), t("GPU-b", Some(2))),
            ]
        );
        // A GPU DCGM does not know is left out.
        assert!(map_entities(&[device("GPU-c", 0, &[])], &gpus, &mig).is_empty());
    }

    #[test]
    fn the_plan_takes_one_minor_per_major_and_refuses_the_rest() {
        let g = |major, minor, fields: &[u16]| MetricGroup {
            major,
            minor,
            fields: fields.to_vec(),
        };
        let groups = [
            g(1, 0, &[1001, 1004, 1005]),
            g(1, 1, &[1002, 1003, 1005]),
            g(2, 0, &[1009, 1010]),
        ];
        let wanted: BTreeSet<u16> = [1001, 1002, 1005, 1009, 1010, 1012].into_iter().collect();
        let plan = plan_watch(&wanted, &groups);
        assert_eq!(plan.watch, [1001, 1005, 1009, 1010]);
        assert_eq!(
            plan.refused.into_iter().collect::<Vec<_>>(),
            [(1002, Refusal::MultiPass), (1012, Refusal::NotSupported)]
        );
        // Without the first group, 1002 takes major 1 minor 1 and 1005 follows it there.
        let plan = plan_watch(&wanted, &groups[1..]);
        assert_eq!(plan.watch, [1002, 1005, 1009, 1010]);
        assert_eq!(
            plan.refused.into_iter().collect::<Vec<_>>(),
            [(1001, Refusal::NotSupported), (1012, Refusal::NotSupported)]
        );
    }

    #[test]
    fn watch_statuses_become_refusal_reasons() {
        assert_eq!(
            Refusal::from_status(status::PROFILING_MULTI_PASS),
            Refusal::MultiPass
        );
        assert_eq!(
            Refusal::from_status(status::PROFILING_NOT_SUPPORTED),
            Refusal::NotSupported
        );
        assert_eq!(
            Refusal::from_status(status::REQUIRES_ROOT),
            Refusal::NoPermission
        );
        assert_eq!(
            Refusal::from_status(status::MODULE_NOT_LOADED).as_str(),
            "module_not_loaded"
        );
        assert_eq!(Refusal::from_status(status::GENERIC_ERROR), Refusal::Error);
    }

    #[test]
    fn entity_groups_hold_at_most_dcgms_64_entities_each_and_every_entity_once() {
        let gpu = |id| Entity {
            group: EntityGroup::Gpu,
            id,
        };
        for n in [0u32, 1, 63, 64, 65, 128, 129, 8 * 8 + 8] {
            let all: Vec<Entity> = (0..n).map(gpu).collect();
            let groups: Vec<&[Entity]> = entity_groups(&all).collect();
            assert!(groups.iter().all(|g| !g.is_empty() && g.len() <= 64), "{n}");
            assert_eq!(groups.len(), (n as usize).div_ceil(64), "{n}");
            assert_eq!(groups.concat(), all, "{n}");
        }
    }
}
