//! What the node shows for parsed assignments: the container runtime's listing, each process's
//! `/proc/<pid>/cgroup`, and the processes of the simulated fleet.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::pods::cri_proto::{
    Container, ContainerMetadata, ContainerState, PodSandbox, PodSandboxMetadata, PodSandboxState,
};
use crate::pods::directory::RuntimeSnapshot;

use super::model::*;

impl Assignments {
    /// What the fake container runtime lists: one ready sandbox per pod (labels: the pod's plus
    /// the kubelet's `io.kubernetes.pod.*`) and one running container per container.
    pub fn runtime_snapshot(&self) -> RuntimeSnapshot {
        let mut snap = RuntimeSnapshot::default();
        for p in &self.pods {
            let kubelet = [
                ("io.kubernetes.pod.name", p.name.as_str()),
                ("io.kubernetes.pod.namespace", p.namespace.as_str()),
                ("io.kubernetes.pod.uid", p.uid.as_str()),
            ];
            let mut labels: HashMap<String, String> = p.labels.clone().into_iter().collect();
            labels.extend(
                kubelet
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
            );
            snap.sandboxes.push(PodSandbox {
                id: p.sandbox_id.clone(),
                metadata: Some(PodSandboxMetadata {
                    name: p.name.clone(),
                    uid: p.uid.clone(),
                    namespace: p.namespace.clone(),
                    attempt: 0,
                }),
                state: PodSandboxState::SandboxReady as i32,
                created_at: 1,
                labels,
                ..Default::default()
            });
            for c in &p.containers {
                let mut labels: HashMap<String, String> = kubelet
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect();
                labels.insert("io.kubernetes.container.name".into(), c.name.clone());
                snap.containers.push(Container {
                    id: c.id.clone(),
                    pod_sandbox_id: p.sandbox_id.clone(),
                    metadata: Some(ContainerMetadata {
                        name: c.name.clone(),
                        attempt: 0,
                    }),
                    state: ContainerState::ContainerRunning as i32,
                    created_at: 1,
                    labels,
                    ..Default::default()
                });
            }
        }
        snap
    }

    /// Every PID with the device it runs on, in file order (a PID listed for an assignment with
    /// several devices runs on each of them).
    pub fn processes(&self) -> Vec<FakeProcess> {
        let mut out = Vec::new();
        for p in &self.pods {
            for c in &p.containers {
                for run in &c.runs {
                    for pid in &run.pids {
                        for d in &run.devices {
                            out.push(FakeProcess {
                                pid: *pid,
                                device_id: d.clone(),
                                naming: run.naming,
                                weight: run.weight,
                            });
                        }
                    }
                }
            }
        }
        out.extend(self.host_processes.iter().map(|h| FakeProcess {
            pid: h.pid,
            device_id: h.device.clone(),
            naming: DeviceNaming::Plugin,
            weight: h.weight,
        }));
        out
    }

    /// [`Assignments::processes`] placed on `devices` (the simulated fleet's), for
    /// [`crate::gpu::sim::SimulatedSource::with_processes`].
    ///
    /// # Errors
    /// [`AssignmentsError::UnknownDevice`] for a device id or DRA device name that names none
    /// of `devices`.
    pub fn sim_processes(
        &self,
        devices: &[crate::gpu::Device],
        id_type: crate::config::GpuIdType,
    ) -> Result<Vec<crate::gpu::sim::SimProcess>, AssignmentsError> {
        self.processes()
            .into_iter()
            .map(|p| {
                let key = match p.naming {
                    DeviceNaming::Plugin => {
                        crate::pods::mapping::resolve(&p.device_id, devices, id_type)
                            .map(|(k, _)| k)
                    }
                    DeviceNaming::Dra => crate::pods::dra::resolve(&p.device_id, devices).ok(),
                };
                let key = key.ok_or(AssignmentsError::UnknownDevice {
                    pid: p.pid,
                    id: p.device_id.clone(),
                })?;
                Ok(crate::gpu::sim::SimProcess {
                    pid: p.pid,
                    gpu: key.gpu,
                    gi_id: key.gi_id,
                    weight: p.weight,
                })
            })
            .collect()
    }

    /// The `/proc/<pid>/cgroup` text of every PID, as the kubelet and runtime place it.
    pub fn cgroup_files(&self) -> BTreeMap<u32, String> {
        let mut out = BTreeMap::new();
        for p in &self.pods {
            for c in &p.containers {
                for run in &c.runs {
                    for pid in &run.pids {
                        out.insert(*pid, cgroup_file(self.layout, &p.uid, &c.id));
                    }
                }
            }
        }
        for h in &self.host_processes {
            let path = format!("/system.slice/{}.service", h.unit);
            let text = match self.layout.version {
                1 => format!("4:memory:{path}\n1:name=systemd:{path}\n"),
                _ => format!("0::{path}\n"),
            };
            out.insert(h.pid, text);
        }
        out
    }

    /// Writes `<dir>/<pid>/cgroup` for every PID; removes the PID directories of `previous` that
    /// are gone. Returns the PIDs written.
    ///
    /// # Errors
    /// The first I/O error, naming the path.
    pub fn write_proc_tree(
        &self,
        dir: &Path,
        previous: &[u32],
    ) -> Result<Vec<u32>, AssignmentsError> {
        let files = self.cgroup_files();
        let io = |path: PathBuf| move |cause| AssignmentsError::Write { path, cause };
        for (pid, text) in &files {
            let d = dir.join(pid.to_string());
            std::fs::create_dir_all(&d).map_err(io(d.clone()))?;
            let f = d.join("cgroup");
            std::fs::write(&f, text).map_err(io(f.clone()))?;
        }
        for pid in previous.iter().filter(|p| !files.contains_key(p)) {
            let d = dir.join(pid.to_string());
            if d.exists() {
                std::fs::remove_dir_all(&d).map_err(io(d.clone()))?;
            }
        }
        Ok(files.into_keys().collect())
    }
}

/// The `/proc/<pid>/cgroup` text of a process in container `cid` of pod `uid` (a burstable pod),
/// on a node with `layout`.
pub fn cgroup_file(layout: CgroupLayout, uid: &str, cid: &str) -> String {
    let path = match layout.driver {
        CgroupDriver::Cgroupfs => {
            let leaf = match layout.runtime {
                Runtime::Crio => format!("crio-{cid}"),
                Runtime::Containerd | Runtime::Docker => cid.to_owned(),
            };
            format!("/kubepods/burstable/pod{uid}/{leaf}")
        }
        CgroupDriver::Systemd => {
            let prefix = match layout.runtime {
                Runtime::Containerd => "cri-containerd",
                Runtime::Crio => "crio",
                Runtime::Docker => "docker",
            };
            let uid_ = uid.replace('-', "_");
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/{prefix}-{cid}.scope")
        }
    };
    if layout.version == 2 {
        return format!("0::{path}\n");
    }
    let mut text = String::new();
    for (i, controllers) in [
        "memory",
        "pids",
        "cpu,cpuacct",
        "devices",
        "freezer",
        "blkio",
        "cpuset",
    ]
    .iter()
    .enumerate()
    {
        text.push_str(&format!("{}:{controllers}:{path}\n", 12 - i));
    }
    text.push_str(&format!("1:name=systemd:{path}\n0::/\n"));
    text
}
