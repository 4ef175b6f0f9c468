//! What an assignments file is once parsed: [`Assignments`], its pods, containers and processes,
//! and how the node spells cgroups.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::pods::proto::ListPodResourcesResponse;

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
    /// A proc tree file cannot be written.
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

/// One assignment's processes: they run on each of its devices.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The devices, as written in the file.
    pub devices: Vec<String>,
    /// How `devices` are named.
    pub naming: DeviceNaming,
    /// Host PIDs.
    pub pids: Vec<u32>,
    /// Their share of each device against the other processes there.
    pub weight: f64,
}

/// A container of a fake pod.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeContainer {
    /// Its name.
    pub name: String,
    /// Runtime id, 64 hex digits.
    pub id: String,
    /// Per assignment: its devices and the processes running on them.
    pub runs: Vec<Run>,
}

/// A fake pod.
#[derive(Debug, Clone, PartialEq)]
pub struct FakePod {
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
    pub containers: Vec<FakeContainer>,
}

/// One simulated process: it runs on the device `device_id` with `weight`.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeProcess {
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

/// Parsed assignments: the reply `List` will give, and the pods behind it.
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
