//! What the node shows for parsed assignments: the kubelet's pod-resources reply, the container
//! runtime's listing, each process's `/proc/<pid>/cgroup`, and the processes of the simulated
//! fleet.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use gpu_exporter::config::GpuIdType;
use gpu_exporter::gpu::sim::assignments::{self as sim, derived_uid};
use gpu_exporter::gpu::sim::SimProcess;
use gpu_exporter::gpu::Device;
use gpu_exporter::pods::cri_proto::{
    Container, ContainerMetadata, ContainerState, PodSandbox, PodSandboxMetadata, PodSandboxState,
};
use gpu_exporter::pods::directory::RuntimeSnapshot;
use gpu_exporter::pods::dra::NVIDIA_GPU_DRIVER;
use gpu_exporter::pods::mapping::{assigned_device, GPU_RESOURCE};
use gpu_exporter::pods::proto::{
    CdiDevice, ClaimResource, ContainerDevices, ContainerResources, DynamicResource,
    ListPodResourcesResponse, PodResources,
};

use super::{
    Allocation, AssignmentsError, CgroupDriver, CgroupLayout, FakePod, FakeProcess, HostProcess,
    Runtime,
};

/// A fake node from an assignments file: the reply `List` will give, and the pods behind it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Assignments {
    /// The reply.
    pub reply: ListPodResourcesResponse,
    /// The pods, for the fake CRI server, the proc tree and the simulated processes.
    pub pods: Vec<FakePod>,
    /// Processes outside any pod: in the proc tree under a systemd unit, run by the simulated
    /// fleet, listed by no kubelet or runtime.
    pub host_processes: Vec<HostProcess>,
    /// How the proc tree spells cgroups.
    pub layout: CgroupLayout,
}

impl From<sim::Assignments> for Assignments {
    fn from(a: sim::Assignments) -> Self {
        Self {
            reply: reply(&a.pods),
            pods: a.pods,
            host_processes: a.host_processes,
            layout: a.layout,
        }
    }
}

/// The kubelet's `List` reply for `pods`: pods and containers in file order; a container's
/// device-plugin assignments in its `devices`, its DRA ones in `dynamic_resources` (one entry
/// per claim, its devices in file order).
fn reply(pods: &[FakePod]) -> ListPodResourcesResponse {
    let mut out = Vec::new();
    for p in pods {
        let mut containers = Vec::new();
        for c in &p.containers {
            let mut container = ContainerResources {
                name: c.name.clone(),
                ..Default::default()
            };
            for run in &c.runs {
                match &run.allocation {
                    Allocation::Plugin { resource } => {
                        container.devices.push(ContainerDevices {
                            resource_name: resource
                                .clone()
                                .unwrap_or_else(|| GPU_RESOURCE.to_owned()),
                            device_ids: run.devices.clone(),
                            topology: None,
                        });
                    }
                    Allocation::Dra {
                        claim,
                        claim_namespace,
                        driver,
                        pool,
                    } => {
                        let driver = driver.as_deref().unwrap_or(NVIDIA_GPU_DRIVER);
                        let dr =
                            dynamic_resource(claim, claim_namespace, driver, pool, &run.devices);
                        match container.dynamic_resources.iter_mut().find(|c| {
                            c.claim_name == dr.claim_name && c.claim_namespace == dr.claim_namespace
                        }) {
                            Some(existing) => existing.claim_resources.extend(dr.claim_resources),
                            None => container.dynamic_resources.push(dr),
                        }
                    }
                }
            }
            containers.push(container);
        }
        out.push(PodResources {
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            containers,
            ..Default::default()
        });
    }
    ListPodResourcesResponse { pod_resources: out }
}

/// A DRA claim's entry: one claim resource per device, each with the CDI id NVIDIA's driver
/// would give it.
fn dynamic_resource(
    claim: &str,
    namespace: &str,
    driver: &str,
    pool: &str,
    devices: &[String],
) -> DynamicResource {
    let uid = derived_uid(&format!("claim/{namespace}/{claim}"));
    DynamicResource {
        claim_name: claim.to_owned(),
        claim_namespace: namespace.to_owned(),
        claim_resources: devices
            .iter()
            .map(|d| ClaimResource {
                cdi_devices: vec![CdiDevice {
                    name: format!("k8s.gpu.nvidia.com/claim={uid}-{d}"),
                }],
                driver_name: driver.to_owned(),
                pool_name: pool.to_owned(),
                device_name: d.clone(),
                share_id: None,
            })
            .collect(),
    }
}

impl Assignments {
    /// Reads and parses `path` (the simulator's parser).
    ///
    /// # Errors
    /// [`AssignmentsError`] naming the file (and line).
    pub fn load(path: &Path) -> Result<Self, AssignmentsError> {
        sim::Assignments::load(path).map(Self::from)
    }

    /// Parses assignments text; `origin` names it in errors.
    ///
    /// # Errors
    /// [`AssignmentsError::Invalid`] with the line at fault.
    pub fn parse(text: &str, origin: &str) -> Result<Self, AssignmentsError> {
        sim::Assignments::parse(text, origin).map(Self::from)
    }

    /// The file's pods and host processes, as the simulator reads them.
    fn sim(&self) -> sim::Assignments {
        sim::Assignments {
            pods: self.pods.clone(),
            host_processes: self.host_processes.clone(),
            layout: self.layout,
        }
    }

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
        self.sim().processes()
    }

    /// [`Assignments::processes`] placed on `devices` (the simulated fleet's), for
    /// [`gpu_exporter::gpu::sim::SimulatedSource::with_processes`]: what `--sim-processes` does.
    ///
    /// # Errors
    /// [`AssignmentsError::UnknownDevice`] for a device id or DRA device name that names none
    /// of `devices`.
    pub fn sim_processes(
        &self,
        devices: &[Device],
        id_type: GpuIdType,
    ) -> Result<Vec<SimProcess>, AssignmentsError> {
        self.sim().sim_processes(assigned_device(devices, id_type))
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
