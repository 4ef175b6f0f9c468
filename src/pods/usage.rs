//! Pure attribution of GPU processes to containers: NVML's per-process readings + each PID's
//! cgroup owner + the container runtime's directory → per-container usage on every GPU and MIG
//! instance.
//!
//! - A process belongs to the container whose id its cgroup names, as the runtime lists it.
//! - Its GPU or MIG instance: the GPU it was read on, and on MIG-enabled GPUs the GPU instance
//!   it runs in. A MIG-enabled GPU also gets a whole-GPU entry summing its instances (for
//!   `-d g`, which exports MIG GPUs whole).
//! - Per container and entity: the number of processes, the sum of their framebuffer (also as
//!   dcgm-exporter sums it: each process floored to MiB first), and the sum of their
//!   utilisations when the GPU reports them.
//! - An entity is *complete* when each of its processes was attributed or is known to run
//!   outside pods. Only complete entities replace device values in `--kubernetes-virtual-gpus`
//!   mode; the others keep today's copies, so a stale runtime answer or an unreadable `/proc`
//!   never hands a holder a wrong own value.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::cgroup::CgroupOwner;
use super::directory::{PodDirectory, PodMeta};
use super::{EntityKey, PodRef};
use crate::gpu::{Device, GpuProcess};

mod metrics;
pub use metrics::{ProcessMetrics, ProcessState, OUTCOMES, REASONS};

/// Bytes per MiB.
pub const MIB: u64 = 1024 * 1024;

/// Summed utilisation of a container's processes, %.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UtilizationSum {
    /// SM.
    pub sm: u64,
    /// Memory controller.
    pub memory: u64,
    /// Encoder.
    pub encoder: u64,
    /// Decoder.
    pub decoder: u64,
}

/// One container's use of one GPU or MIG instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerUsage {
    /// Namespace, pod, container.
    pub pod: PodRef,
    /// UID and labels of its pod.
    pub meta: Arc<PodMeta>,
    /// Its processes on the entity.
    pub processes: u32,
    /// Their framebuffer, bytes (`None`: the driver reported none).
    pub fb_used_bytes: Option<u64>,
    /// Their framebuffer as dcgm-exporter sums it: each process floored to MiB, then summed.
    pub fb_used_mib: Option<u64>,
    /// Their utilisation (`None`: the GPU does not report per-process utilisation).
    pub utilization: Option<UtilizationSum>,
}

/// The containers using one GPU or MIG instance.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EntityUsage {
    /// Sorted by pod and container.
    pub containers: Vec<ContainerUsage>,
    /// Every process on the entity was attributed, or runs outside pods.
    pub complete: bool,
}

impl EntityUsage {
    /// The usage of the container `pod`, if it runs processes here.
    pub fn of(&self, pod: &PodRef) -> Option<&ContainerUsage> {
        self.containers.iter().find(|c| &c.pod == pod)
    }
}

/// The result of one tick's attribution.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Usage {
    /// Per entity. Entities of GPUs whose processes could not be read are absent.
    pub entities: BTreeMap<EntityKey, EntityUsage>,
    /// Processes by outcome (`attributed`, `outside_pods`, `unknown_container`, `unreadable`).
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Failures by reason (`gpu_exporter_process_attribution_errors_total`).
    pub errors: BTreeMap<&'static str, u64>,
    /// Whether a pod's container was missing from an available runtime answer (worth asking
    /// the runtime again).
    pub stale_directory: bool,
}

/// What reading a PID's cgroup gave: its owner, or the `reason` it could not be read.
pub type Owner = Result<CgroupOwner, &'static str>;

/// Attributes the processes read on `devices` (each device with its processes).
pub fn attribute(
    devices: &[(&Device, &[GpuProcess])],
    owners: &HashMap<u32, Owner>,
    directory: &PodDirectory,
) -> Usage {
    let mut usage = Usage::default();
    for o in metrics::OUTCOMES {
        usage.outcomes.insert(o, 0);
    }
    let available = directory.is_available();
    let mut saw_pod_without_runtime = false;
    for (device, processes) in devices {
        let index = device.identity.index;
        let mut per: BTreeMap<EntityKey, Builder> = BTreeMap::new();
        if device.mig_enabled {
            for inst in &device.instances {
                per.entry(EntityKey {
                    gpu: index,
                    gi_id: Some(inst.gi_id),
                })
                .or_default();
            }
        }
        per.entry(EntityKey {
            gpu: index,
            gi_id: None,
        })
        .or_default();
        for p in *processes {
            let outcome = match owners.get(&p.pid) {
                None => Err("proc_unreadable"),
                Some(Err(reason)) => Err(*reason),
                Some(Ok(CgroupOwner::OutsidePods)) => Ok(None),
                Some(Ok(CgroupOwner::Pod { container_id, .. })) => {
                    match container_id
                        .as_deref()
                        .and_then(|id| directory.container(id))
                    {
                        Some(c) => Ok(Some(c)),
                        None if !available => {
                            saw_pod_without_runtime = true;
                            Err("unknown_container")
                        }
                        None => {
                            usage.stale_directory = true;
                            *usage.errors.entry("unknown_container").or_default() += 1;
                            Err("unknown_container")
                        }
                    }
                }
            };
            let label = match &outcome {
                Ok(Some(_)) => "attributed",
                Ok(None) => "outside_pods",
                Err("unknown_container") => "unknown_container",
                Err(reason) => {
                    *usage.errors.entry(reason).or_default() += 1;
                    "unreadable"
                }
            };
            *usage.outcomes.entry(label).or_default() += 1;
            let mut keys = vec![EntityKey {
                gpu: index,
                gi_id: None,
            }];
            if device.mig_enabled {
                match p.gi_id {
                    Some(gi) => keys.push(EntityKey {
                        gpu: index,
                        gi_id: Some(gi),
                    }),
                    // A MIG GPU's process without an instance cannot be placed in one.
                    None => continue,
                }
            }
            for key in keys {
                let b = per.entry(key).or_default();
                match &outcome {
                    Ok(Some(c)) => b.add(&c.pod, &c.meta, p),
                    Ok(None) => {}
                    Err(_) => b.incomplete = true,
                }
            }
        }
        for (key, b) in per {
            usage.entities.insert(key, b.finish());
        }
    }
    if saw_pod_without_runtime {
        *usage.errors.entry("runtime_unavailable").or_default() += 1;
    }
    usage
}

#[derive(Default)]
struct Builder {
    containers: BTreeMap<(PodRef, String), ContainerUsage>,
    incomplete: bool,
}

impl Builder {
    fn add(&mut self, pod: &PodRef, meta: &Arc<PodMeta>, p: &GpuProcess) {
        let c = self
            .containers
            .entry((pod.clone(), meta.uid.clone()))
            .or_insert_with(|| ContainerUsage {
                pod: pod.clone(),
                meta: Arc::clone(meta),
                processes: 0,
                fb_used_bytes: None,
                fb_used_mib: None,
                utilization: Some(UtilizationSum::default()),
            });
        c.processes += 1;
        if let Some(b) = p.used_memory_bytes {
            c.fb_used_bytes = Some(c.fb_used_bytes.unwrap_or(0).saturating_add(b));
            c.fb_used_mib = Some(c.fb_used_mib.unwrap_or(0).saturating_add(b / MIB));
        }
        c.utilization = match (c.utilization, p.utilization) {
            (Some(sum), Some(u)) => Some(UtilizationSum {
                sm: sum.sm + u64::from(u.sm),
                memory: sum.memory + u64::from(u.memory),
                encoder: sum.encoder + u64::from(u.encoder),
                decoder: sum.decoder + u64::from(u.decoder),
            }),
            _ => None,
        };
    }

    fn finish(self) -> EntityUsage {
        EntityUsage {
            containers: self.containers.into_values().collect(),
            complete: !self.incomplete,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{GpuIdentity, MigInstance, ProcessUtilization};
    use crate::pods::cri_proto::{Container, ContainerMetadata, PodSandbox, PodSandboxMetadata};
    use crate::pods::directory::{LabelOptions, RuntimeSnapshot};

    fn cid(n: u8) -> String {
        format!("{n:02x}").repeat(32)
    }

    fn directory() -> PodDirectory {
        let sandbox = |id: &str, name: &str| PodSandbox {
            id: id.into(),
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: "ml".into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        let container = |n: u8, sb: &str, name: &str| Container {
            id: cid(n),
            pod_sandbox_id: sb.into(),
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        PodDirectory::from_runtime(
            &RuntimeSnapshot {
                sandboxes: vec![sandbox("sa", "a"), sandbox("sb", "b")],
                containers: vec![
                    container(1, "sa", "main"),
                    container(2, "sa", "side"),
                    container(3, "sb", "main"),
                ],
            },
            &LabelOptions::default(),
        )
    }

    fn gpu(index: u32, mig: &[u32]) -> Device {
        Device {
            identity: GpuIdentity {
                index,
                uuid: format!("GPU-{index}"),
                pci_bus_id: String::new(),
                minor: index,
                model: "m".into(),
            },
            mig_enabled: !mig.is_empty(),
            instances: mig
                .iter()
                .map(|&gi_id| MigInstance {
                    gi_id,
                    ci_id: 0,
                    profile: "1g.10gb".into(),
                    uuid: format!("MIG-{gi_id}"),
                    placement: None,
                })
                .collect(),
        }
    }

    fn proc(pid: u32, gi: Option<u32>, mib: u64, sm: Option<u32>) -> GpuProcess {
        GpuProcess {
            pid,
            gi_id: gi,
            used_memory_bytes: Some(mib * MIB + 512),
            utilization: sm.map(|sm| ProcessUtilization {
                sm,
                memory: sm / 2,
                encoder: 0,
                decoder: 1,
            }),
        }
    }

    fn in_container(n: u8) -> Owner {
        Ok(CgroupOwner::Pod {
            uid: "x".into(),
            container_id: Some(cid(n)),
        })
    }

    fn key(gpu: u32, gi: Option<u32>) -> EntityKey {
        EntityKey { gpu, gi_id: gi }
    }

    #[test]
    fn processes_sum_per_container_and_entity() {
        let d0 = gpu(0, &[]);
        let procs = [
            proc(10, None, 100, Some(20)),
            proc(11, None, 50, Some(5)),
            proc(12, None, 10, Some(30)),
            proc(13, None, 7, Some(1)),
        ];
        let owners: HashMap<u32, Owner> = [
            (10, in_container(1)),
            (11, in_container(1)),
            (12, in_container(3)),
            (13, Ok(CgroupOwner::OutsidePods)),
        ]
        .into();
        let u = attribute(&[(&d0, &procs)], &owners, &directory());
        let e = &u.entities[&key(0, None)];
        assert!(e.complete);
        assert_eq!(e.containers.len(), 2);
        let a = &e.containers[0];
        assert_eq!(
            (a.pod.pod.as_str(), a.pod.container.as_str()),
            ("a", "main")
        );
        assert_eq!(a.meta.uid, "uid-a");
        assert_eq!(a.processes, 2);
        assert_eq!(a.fb_used_bytes, Some(150 * MIB + 1024));
        // Floored per process, as dcgm-exporter: 100 + 50, not 150 + the two half KiBs.
        assert_eq!(a.fb_used_mib, Some(150));
        assert_eq!(
            a.utilization,
            Some(UtilizationSum {
                sm: 25,
                memory: 12,
                encoder: 0,
                decoder: 2
            })
        );
        assert_eq!(e.containers[1].pod.pod, "b");
        assert_eq!(u.outcomes["attributed"], 3);
        assert_eq!(u.outcomes["outside_pods"], 1);
        assert!(u.errors.is_empty());
    }

    #[test]
    fn mig_processes_land_on_their_instance_and_the_parent_sums_them() {
        let d = gpu(1, &[3, 5]);
        let procs = [proc(20, Some(3), 64, None), proc(21, Some(5), 32, None)];
        let owners: HashMap<u32, Owner> = [(20, in_container(1)), (21, in_container(3))].into();
        let u = attribute(&[(&d, &procs)], &owners, &directory());
        let i3 = &u.entities[&key(1, Some(3))];
        assert_eq!(i3.containers.len(), 1);
        assert_eq!(i3.containers[0].pod.pod, "a");
        assert_eq!(i3.containers[0].utilization, None);
        assert_eq!(u.entities[&key(1, Some(5))].containers[0].pod.pod, "b");
        assert_eq!(u.entities[&key(1, None)].containers.len(), 2);
    }

    #[test]
    fn idle_gpus_get_an_empty_complete_entry() {
        let d = gpu(2, &[7]);
        let u = attribute(&[(&d, &[])], &HashMap::new(), &directory());
        for k in [key(2, None), key(2, Some(7))] {
            assert_eq!(
                u.entities[&k],
                EntityUsage {
                    containers: vec![],
                    complete: true
                }
            );
        }
    }

    #[test]
    fn a_process_in_the_sandbox_cgroup_is_its_pods_not_an_unknown_container() {
        // The pause process's cgroup names the sandbox id ("sa", pod a): attributed to the pod
        // with an empty container name; the entity stays complete and the runtime is not asked
        // again.
        let d = gpu(0, &[]);
        let procs = [proc(40, None, 1, Some(1)), proc(41, None, 2, Some(2))];
        let owners: HashMap<u32, Owner> = [
            (
                40,
                Ok(CgroupOwner::Pod {
                    uid: "uid-a".into(),
                    container_id: Some("sa".into()),
                }),
            ),
            (41, in_container(1)),
        ]
        .into();
        let u = attribute(&[(&d, &procs)], &owners, &directory());
        let e = &u.entities[&key(0, None)];
        assert!(e.complete);
        let names: Vec<_> = e
            .containers
            .iter()
            .map(|c| {
                (
                    c.pod.pod.as_str(),
                    c.pod.container.as_str(),
                    c.meta.uid.as_str(),
                )
            })
            .collect();
        assert_eq!(names, [("a", "", "uid-a"), ("a", "main", "uid-a")]);
        assert_eq!(u.outcomes["attributed"], 2);
        assert!(!u.stale_directory);
        assert!(u.errors.is_empty());
    }

    #[test]
    fn failures_make_the_entity_incomplete_and_are_counted() {
        let d = gpu(0, &[]);
        let procs = [
            proc(30, None, 1, Some(1)),
            proc(31, None, 1, Some(1)),
            proc(32, None, 1, Some(1)),
        ];
        let owners: HashMap<u32, Owner> = [
            (30, in_container(1)),
            (31, in_container(9)), // not in the runtime's answer
            (32, Err("proc_not_found")),
        ]
        .into();
        let u = attribute(&[(&d, &procs)], &owners, &directory());
        let e = &u.entities[&key(0, None)];
        assert!(!e.complete);
        assert_eq!(e.containers.len(), 1);
        assert!(u.stale_directory);
        assert_eq!(u.errors["unknown_container"], 1);
        assert_eq!(u.errors["proc_not_found"], 1);
        assert_eq!(u.outcomes["unreadable"], 1);
        assert_eq!(u.outcomes["unknown_container"], 1);
    }

    #[test]
    fn without_a_runtime_answer_nothing_is_attributed_and_the_tick_is_counted_once() {
        let d = gpu(0, &[]);
        let procs = [proc(40, None, 1, Some(1)), proc(41, None, 1, Some(1))];
        let owners: HashMap<u32, Owner> = [(40, in_container(1)), (41, in_container(3))].into();
        let u = attribute(&[(&d, &procs)], &owners, &PodDirectory::default());
        let e = &u.entities[&key(0, None)];
        assert!(!e.complete && e.containers.is_empty());
        assert_eq!(u.errors.get("runtime_unavailable"), Some(&1));
        assert_eq!(u.errors.get("unknown_container"), None);
        assert!(!u.stale_directory);
        assert_eq!(u.outcomes["unknown_container"], 2);
    }
}
