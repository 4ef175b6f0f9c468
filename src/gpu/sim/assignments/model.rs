//! What an assignments file is once parsed: [`Assignments`], its pods, containers and
//! processes, and how the node spells cgroups.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::gpu::sim::SimProcess;

/// An assignments file that cannot be used. Names the file and line.
#[derive(Debug, thiserror::Error)]
pub enum AssignmentsError {
    /// The file cannot be read.
    #[error("{}: cannot read", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        cause: std::io::Error,
    },
    /// A proc tree file cannot be written (the fake kubelet's `--proc-root`).
    #[error("{}: cannot write", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        cause: std::io::Error,
    },
    /// A PID's device id is none of the given devices.
    #[error("pid {pid}: device {id:?} is none of the simulated fleet's GPUs or MIG instances (see --list-devices)")]
    UnknownDevice {
        /// The PID.
        pid: u32,
        /// The device id.
        id: String,
    },
    /// The file is not valid.
    #[error("{origin}:{line}: {message}")]
    Invalid {
        /// The file.
        origin: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    #[serde(default)]
    pub(super) cgroup_driver: Option<CgroupDriver>,
    #[serde(default)]
    pub(super) cgroup_version: Option<toml::Spanned<u8>>,
    #[serde(default)]
    pub(super) runtime: Option<Runtime>,
    #[serde(default)]
    pub(super) assignment: Vec<toml::Spanned<Entry>>,
    #[serde(default)]
    pub(super) host_process: Vec<toml::Spanned<HostEntry>>,
}

/// A `[[host_process]]`: a process outside any pod (a host daemon, another runtime's job).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HostEntry {
    pub(super) pid: u32,
    pub(super) device: String,
    #[serde(default)]
    pub(super) weight: Option<f64>,
    #[serde(default)]
    pub(super) unit: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Entry {
    pub(super) namespace: String,
    pub(super) pod: String,
    pub(super) container: String,
    #[serde(default)]
    pub(super) resource: Option<String>,
    pub(super) devices: Vec<String>,
    #[serde(default)]
    pub(super) pod_uid: Option<String>,
    #[serde(default)]
    pub(super) container_id: Option<String>,
    #[serde(default)]
    pub(super) labels: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) pids: Vec<u32>,
    #[serde(default)]
    pub(super) weight: Option<f64>,
    #[serde(default)]
    pub(super) claim: Option<String>,
    #[serde(default)]
    pub(super) claim_namespace: Option<String>,
    #[serde(default)]
    pub(super) driver: Option<String>,
    #[serde(default)]
    pub(super) pool: Option<String>,
}

/// The default pool of DRA assignments.
pub const DEFAULT_POOL: &str = "fake-node";

/// The kubelet's cgroup driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// `kubepods.slice/…/kubepods-<qos>-pod<uid_>.slice/<runtime>-<id>.scope`.
    #[default]
    Systemd,
    /// `/kubepods/<qos>/pod<uid>/<id>`.
    Cgroupfs,
}

/// The container runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// containerd (`cri-containerd-<id>.scope`, `<id>`).
    #[default]
    Containerd,
    /// CRI-O (`crio-<id>.scope`, `crio-<id>`).
    Crio,
    /// cri-dockerd (`docker-<id>.scope`, `<id>`).
    Docker,
}

/// How a node lays out cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLayout {
    /// The kubelet's cgroup driver.
    pub driver: CgroupDriver,
    /// 1 (one line per controller) or 2 (the unified `0::` line).
    pub version: u8,
    /// The runtime.
    pub runtime: Runtime,
}

impl Default for CgroupLayout {
    fn default() -> Self {
        Self {
            driver: CgroupDriver::Systemd,
            version: 2,
            runtime: Runtime::Containerd,
        }
    }
}

/// How an assignment names its devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceNaming {
    /// Device-plugin ids (`GPU-…`, `MIG-…`, `GPU-…::2`, `nvidia0`).
    Plugin,
    /// NVIDIA's DRA driver's device names (`gpu-0`, `gpu-1-mig-3g40gb-9-4`).
    Dra,
}

/// How an assignment's devices were allocated, as the file says.
#[derive(Debug, Clone, PartialEq)]
pub enum Allocation {
    /// By a device plugin, for `resource` (`None`: the file leaves it out, meaning
    /// `nvidia.com/gpu`).
    Plugin {
        /// The extended resource name.
        resource: Option<String>,
    },
    /// By a DRA driver, for a ResourceClaim.
    Dra {
        /// The claim's name.
        claim: String,
        /// The claim's namespace (the pod's unless the file says otherwise).
        claim_namespace: String,
        /// The driver (`None`: the file leaves it out, meaning NVIDIA's `gpu.nvidia.com`).
        driver: Option<String>,
        /// The pool ([`DEFAULT_POOL`] unless the file says otherwise).
        pool: String,
    },
}

/// One assignment's processes: they run on each of its devices.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The devices, as written in the file.
    pub devices: Vec<String>,
    /// How `devices` are named.
    pub naming: DeviceNaming,
    /// How they were allocated.
    pub allocation: Allocation,
    /// Host PIDs.
    pub pids: Vec<u32>,
    /// Their share of each device against the other processes there.
    pub weight: f64,
}

/// A container of an assigned pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    /// Its name.
    pub name: String,
    /// Runtime id, 64 hex digits.
    pub id: String,
    /// Per assignment: its devices and the processes running on them.
    pub runs: Vec<Run>,
}

/// A pod of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Sandbox id, 64 hex digits.
    pub sandbox_id: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Containers, in file order.
    pub containers: Vec<Container>,
}

/// One simulated process: it runs on the device `device_id` with `weight`.
#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    /// Host PID.
    pub pid: u32,
    /// A device as written in the file (`GPU-…`, `MIG-…`, `GPU-…::2`, `nvidia0`, or a DRA
    /// device name such as `gpu-0`).
    pub device_id: String,
    /// How `device_id` is named.
    pub naming: DeviceNaming,
    /// Its share of the device against the other processes there.
    pub weight: f64,
}

/// A process outside any pod.
#[derive(Debug, Clone, PartialEq)]
pub struct HostProcess {
    /// Host PID.
    pub pid: u32,
    /// Its device, as a device-plugin id (`GPU-…`, `MIG-…`).
    pub device: String,
    /// Its share of the device against the other processes there.
    pub weight: f64,
    /// The systemd unit its cgroup names (`<unit>.service`).
    pub unit: String,
}

/// A parsed assignments file: its pods (in file order) and the processes outside any pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Assignments {
    /// The pods, in file order.
    pub pods: Vec<Pod>,
    /// Processes outside any pod: in the proc tree under a systemd unit, run by the simulated
    /// fleet, listed by no kubelet or runtime.
    pub host_processes: Vec<HostProcess>,
    /// How the proc tree spells cgroups.
    pub layout: CgroupLayout,
}

impl Assignments {
    /// Every PID with the device it runs on, in file order (a PID listed for an assignment with
    /// several devices runs on each of them); then the host processes.
    pub fn processes(&self) -> Vec<Process> {
        let mut out = Vec::new();
        for p in &self.pods {
            for c in &p.containers {
                for run in &c.runs {
                    for pid in &run.pids {
                        for d in &run.devices {
                            out.push(Process {
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
        out.extend(self.host_processes.iter().map(|h| Process {
            pid: h.pid,
            device_id: h.device.clone(),
            naming: DeviceNaming::Plugin,
            weight: h.weight,
        }));
        out
    }

    /// [`Assignments::processes`] placed on the simulated fleet's devices, for
    /// [`super::SimulatedSource::with_processes`]. `resolve` finds the GPU index and MIG GPU
    /// instance a device id or DRA device name stands for (the kubelet's naming rules, which
    /// the caller brings: `pods::mapping::resolve`, `pods::dra::resolve`).
    ///
    /// # Errors
    /// [`AssignmentsError::UnknownDevice`] for a device `resolve` does not find.
    pub fn sim_processes(
        &self,
        resolve: impl Fn(&str, DeviceNaming) -> Option<(u32, Option<u32>)>,
    ) -> Result<Vec<SimProcess>, AssignmentsError> {
        self.processes()
            .into_iter()
            .map(|p| {
                let (gpu, gi_id) =
                    resolve(&p.device_id, p.naming).ok_or(AssignmentsError::UnknownDevice {
                        pid: p.pid,
                        id: p.device_id.clone(),
                    })?;
                Ok(SimProcess {
                    pid: p.pid,
                    gpu,
                    gi_id,
                    weight: p.weight,
                })
            })
            .collect()
    }
}
