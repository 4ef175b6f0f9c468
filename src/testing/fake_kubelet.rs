//! A fake kubelet pod-resources server, for the `fake-kubelet` binary, tests and demos.
//!
//! It serves `List` from an [`Assignments`] file: a TOML list of which container holds which
//! device ids. The ids are served exactly as written (the fake does not know about GPUs), so a
//! file can describe whole GPUs (`GPU-…`), MIG devices (`MIG-…`), time-slicing replicas
//! (`GPU-…::2`) or GKE names (`nvidia0/gi3`). Format:
//!
//! ```toml
//! # Optional, before the first [[assignment]]: how the proc tree spells cgroups.
//! cgroup_driver = "systemd"        # or "cgroupfs"
//! cgroup_version = 2               # or 1
//! runtime = "containerd"           # or "crio", "docker"
//!
//! [[assignment]]
//! namespace = "ml"                 # required
//! pod = "trainer-0"                # required
//! container = "main"               # required
//! resource = "nvidia.com/gpu"      # optional, this is the default
//! devices = ["GPU-0b8f5a3e-…"]     # required, at least one
//! # Optional, for the container runtime (CRI) and per-process usage:
//! pod_uid = "6f0c…"                # default: derived from namespace and pod
//! container_id = "3b1d…"           # 64 hex digits; default: derived from namespace, pod, container
//! labels = { app = "trainer" }     # pod labels (merged over the pod's assignments)
//! pids = [4242, 4243]              # host PIDs of processes running on each listed device
//! weight = 2.0                     # share of its devices' use against other processes there (default 1)
//! ```
//!
//! An assignment with `claim` is a DRA allocation instead: it goes into the container's
//! `dynamic_resources`, and `devices` are the DRA driver's device names (the optional keys above
//! apply to it too):
//!
//! ```toml
//! [[assignment]]
//! namespace = "ml"
//! pod = "trainer-1"
//! container = "main"
//! claim = "trainer-1-gpus"         # the ResourceClaim's name
//! claim_namespace = "ml"           # optional, default: namespace
//! driver = "gpu.nvidia.com"        # optional, this is the default
//! pool = "node-a"                  # optional, default "fake-node" (NVIDIA's driver: the node)
//! devices = ["gpu-0", "gpu-1-mig-3g40gb-9-4"]
//! ```
//!
//! Each DRA device gets one CDI id, formed as NVIDIA's driver forms them
//! (`k8s.gpu.nvidia.com/claim=<claim uid>-<device>`, with a made-up, stable claim uid).
//!
//! Assignments of the same namespace and pod form one pod, in file order; those of one
//! container and claim form one claim. `Get` answers for one pod, `GetAllocatableResources`
//! lists every device-plugin id in the file (the kubelet lists no DRA devices there).
//!
//! The same file describes the rest of a fake node: [`Assignments::runtime_snapshot`] is what
//! the fake CRI server ([`super::fake_cri`]) lists, [`Assignments::write_proc_tree`] writes
//! `<dir>/<pid>/cgroup` for every PID as the kubelet and runtime would place it, and
//! [`Assignments::processes`] tells the simulated fleet which PIDs run where.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::pods::cri_proto::{
    Container, ContainerMetadata, ContainerState, PodSandbox, PodSandboxMetadata, PodSandboxState,
};
use crate::pods::directory::RuntimeSnapshot;
use crate::pods::dra::NVIDIA_GPU_DRIVER;
use crate::pods::mapping::GPU_RESOURCE;
use crate::pods::proto::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use crate::pods::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, CdiDevice, ClaimResource,
    ContainerDevices, ContainerResources, DynamicResource, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};

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
struct File {
    #[serde(default)]
    cgroup_driver: Option<CgroupDriver>,
    #[serde(default)]
    cgroup_version: Option<toml::Spanned<u8>>,
    #[serde(default)]
    runtime: Option<Runtime>,
    #[serde(default)]
    assignment: Vec<toml::Spanned<Entry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    namespace: String,
    pod: String,
    container: String,
    #[serde(default)]
    resource: Option<String>,
    devices: Vec<String>,
    #[serde(default)]
    pod_uid: Option<String>,
    #[serde(default)]
    container_id: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    pids: Vec<u32>,
    #[serde(default)]
    weight: Option<f64>,
    #[serde(default)]
    claim: Option<String>,
    #[serde(default)]
    claim_namespace: Option<String>,
    #[serde(default)]
    driver: Option<String>,
    #[serde(default)]
    pool: Option<String>,
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

/// Parsed assignments: the reply `List` will give, and the pods behind it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Assignments {
    /// The reply.
    pub reply: ListPodResourcesResponse,
    /// The pods, for the fake CRI server, the proc tree and the simulated processes.
    pub pods: Vec<FakePod>,
    /// How the proc tree spells cgroups.
    pub layout: CgroupLayout,
}

impl Assignments {
    /// Reads and parses `path`.
    ///
    /// # Errors
    /// [`AssignmentsError`] naming the file (and line).
    pub fn load(path: &Path) -> Result<Self, AssignmentsError> {
        let text = crate::fsread::read_text(
            path,
            crate::fsread::Cap::SIMULATOR,
            crate::fsread::Symlinks::Follow,
        )
        .map_err(|e| AssignmentsError::Read {
            path: path.to_owned(),
            cause: std::io::Error::other(e),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses assignments text; `origin` names it in errors.
    ///
    /// # Errors
    /// [`AssignmentsError::Invalid`] with the line at fault.
    pub fn parse(text: &str, origin: &str) -> Result<Self, AssignmentsError> {
        let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
        let invalid = |offset: usize, message: String| AssignmentsError::Invalid {
            origin: origin.to_owned(),
            line: line_of(offset),
            message,
        };
        let file: File = toml::from_str(text).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start);
            invalid(offset, e.message().to_owned())
        })?;
        let layout = CgroupLayout {
            driver: file.cgroup_driver.unwrap_or_default(),
            version: match file.cgroup_version {
                None => 2,
                Some(v) if matches!(*v.get_ref(), 1 | 2) => *v.get_ref(),
                Some(v) => {
                    return Err(invalid(
                        v.span().start,
                        format!("cgroup_version {}: must be 1 or 2", v.get_ref()),
                    ))
                }
            },
            runtime: file.runtime.unwrap_or_default(),
        };
        let mut pods: Vec<PodResources> = Vec::new();
        let mut fakes: Vec<FakePod> = Vec::new();
        let mut pids_seen: BTreeMap<u32, String> = BTreeMap::new();
        for spanned in file.assignment {
            let at = spanned.span().start;
            let e = spanned.into_inner();
            for (what, v) in [
                ("namespace", &e.namespace),
                ("pod", &e.pod),
                ("container", &e.container),
            ] {
                if v.trim().is_empty() {
                    return Err(invalid(at, format!("assignment has an empty {what}")));
                }
            }
            let who = format!("{}/{}/{}", e.namespace, e.pod, e.container);
            if e.devices.is_empty() || e.devices.iter().any(|d| d.trim().is_empty()) {
                return Err(invalid(
                    at,
                    format!("assignment {who}: devices must list at least one non-empty id"),
                ));
            }
            let weight = e.weight.unwrap_or(1.0);
            if !(weight.is_finite() && weight > 0.0) {
                return Err(invalid(
                    at,
                    format!("assignment {who}: weight must be a positive number"),
                ));
            }
            if let Some(id) = &e.container_id {
                if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(invalid(
                        at,
                        format!("assignment {who}: container_id must be 64 hex digits"),
                    ));
                }
            }
            if let Some(uid) = &e.pod_uid {
                if uid.bytes().filter(u8::is_ascii_hexdigit).count() != 32
                    || !uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
                {
                    return Err(invalid(at, format!("assignment {who}: pod_uid must be a UID (32 hex digits, dashes allowed)")));
                }
            }
            let container_id = e
                .container_id
                .clone()
                .map(|c| c.to_ascii_lowercase())
                .unwrap_or_else(|| hex_id(&format!("container/{who}")));
            for pid in &e.pids {
                match pids_seen.get(pid) {
                    Some(other) if *other != container_id => {
                        return Err(invalid(at, format!("assignment {who}: pid {pid} is already a process of another container")));
                    }
                    _ => {
                        pids_seen.insert(*pid, container_id.clone());
                    }
                }
            }
            let claim = match (&e.claim, &e.resource) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        at,
                        format!("assignment {who}: either `resource` (device plugin) or `claim` (DRA), not both"),
                    ))
                }
                (Some(name), None) => {
                    if name.trim().is_empty() {
                        return Err(invalid(at, format!("assignment {who}: empty claim")));
                    }
                    let claim_namespace = e
                        .claim_namespace
                        .clone()
                        .unwrap_or_else(|| e.namespace.clone());
                    let driver = e
                        .driver
                        .clone()
                        .unwrap_or_else(|| NVIDIA_GPU_DRIVER.to_owned());
                    let pool = e.pool.clone().unwrap_or_else(|| DEFAULT_POOL.to_owned());
                    Some(dynamic_resource(
                        name,
                        &claim_namespace,
                        &driver,
                        &pool,
                        &e.devices,
                    ))
                }
                (None, _) => {
                    for (what, set) in [
                        ("claim_namespace", e.claim_namespace.is_some()),
                        ("driver", e.driver.is_some()),
                        ("pool", e.pool.is_some()),
                    ] {
                        if set {
                            return Err(invalid(
                                at,
                                format!("assignment {who}: `{what}` needs `claim` (it describes a DRA allocation)"),
                            ));
                        }
                    }
                    None
                }
            };
            let naming = if claim.is_some() {
                DeviceNaming::Dra
            } else {
                DeviceNaming::Plugin
            };
            let pod = match pods
                .iter_mut()
                .position(|p| p.namespace == e.namespace && p.name == e.pod)
            {
                Some(i) => &mut pods[i],
                None => {
                    pods.push(PodResources {
                        name: e.pod.clone(),
                        namespace: e.namespace.clone(),
                        ..Default::default()
                    });
                    pods.last_mut().expect("just pushed")
                }
            };
            let container = match pod.containers.iter().position(|c| c.name == e.container) {
                Some(i) => &mut pod.containers[i],
                None => {
                    pod.containers.push(ContainerResources {
                        name: e.container.clone(),
                        ..Default::default()
                    });
                    pod.containers.last_mut().expect("just pushed")
                }
            };
            match claim {
                Some(dr) => match container.dynamic_resources.iter_mut().find(|c| {
                    c.claim_name == dr.claim_name && c.claim_namespace == dr.claim_namespace
                }) {
                    Some(existing) => existing.claim_resources.extend(dr.claim_resources),
                    None => container.dynamic_resources.push(dr),
                },
                None => container.devices.push(ContainerDevices {
                    resource_name: e
                        .resource
                        .clone()
                        .unwrap_or_else(|| GPU_RESOURCE.to_owned()),
                    device_ids: e.devices.clone(),
                    topology: None,
                }),
            }

            let fake = match fakes
                .iter_mut()
                .position(|p| p.namespace == e.namespace && p.name == e.pod)
            {
                Some(i) => &mut fakes[i],
                None => {
                    let key = format!("{}/{}", e.namespace, e.pod);
                    fakes.push(FakePod {
                        namespace: e.namespace.clone(),
                        name: e.pod.clone(),
                        uid: e.pod_uid.clone().unwrap_or_else(|| uid_from(&key)),
                        sandbox_id: hex_id(&format!("sandbox/{key}")),
                        labels: BTreeMap::new(),
                        containers: Vec::new(),
                    });
                    fakes.last_mut().expect("just pushed")
                }
            };
            if let Some(uid) = &e.pod_uid {
                if !uid.eq_ignore_ascii_case(&fake.uid) {
                    return Err(invalid(at, format!("assignment {who}: pod_uid differs from an earlier assignment of the same pod")));
                }
            }
            fake.labels.extend(e.labels);
            let run = Run {
                devices: e.devices,
                naming,
                pids: e.pids,
                weight,
            };
            match fake.containers.iter_mut().find(|c| c.name == e.container) {
                Some(c) if c.id != container_id => {
                    return Err(invalid(at, format!("assignment {who}: container_id differs from an earlier assignment of the same container")));
                }
                Some(c) => c.runs.push(run),
                None => fake.containers.push(FakeContainer {
                    name: e.container,
                    id: container_id,
                    runs: vec![run],
                }),
            }
        }
        Ok(Self {
            reply: ListPodResourcesResponse {
                pod_resources: pods,
            },
            pods: fakes,
            layout,
        })
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

/// 64 hex digits derived from `key` (container and sandbox ids).
fn hex_id(key: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(key.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A UUID-shaped pod UID derived from `key`.
fn uid_from(key: &str) -> String {
    let h = hex_id(&format!("uid/{key}"));
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
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
    let uid = uid_from(&format!("claim/{namespace}/{claim}"));
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

/// The fake server: answers from whatever reply is current on its `watch` channel.
#[derive(Debug, Clone)]
pub struct FakeKubelet {
    reply: watch::Receiver<ListPodResourcesResponse>,
}

impl FakeKubelet {
    /// A server answering with the current value of `reply`.
    pub fn new(reply: watch::Receiver<ListPodResourcesResponse>) -> Self {
        Self { reply }
    }

    /// The tonic service.
    pub fn into_service(self) -> PodResourcesListerServer<Self> {
        PodResourcesListerServer::new(self)
    }
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(self.reply.borrow().clone()))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        let reply = self.reply.borrow();
        let mut devices: Vec<ContainerDevices> = Vec::new();
        for d in reply
            .pod_resources
            .iter()
            .flat_map(|p| &p.containers)
            .flat_map(|c| &c.devices)
        {
            match devices
                .iter_mut()
                .find(|x| x.resource_name == d.resource_name)
            {
                Some(x) => x.device_ids.extend(d.device_ids.iter().cloned()),
                None => devices.push(d.clone()),
            }
        }
        for d in &mut devices {
            d.device_ids.sort();
            d.device_ids.dedup();
        }
        Ok(Response::new(AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let want = request.into_inner();
        let reply = self.reply.borrow();
        let pod = reply
            .pod_resources
            .iter()
            .find(|p| p.name == want.pod_name && p.namespace == want.pod_namespace)
            .cloned()
            .ok_or_else(|| {
                Status::not_found(format!(
                    "pod {}/{} not found",
                    want.pod_namespace, want.pod_name
                ))
            })?;
        Ok(Response::new(GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}

/// Serves `reply` on `listener` until `shutdown` completes.
///
/// # Errors
/// The transport error that ended serving.
pub async fn serve(
    listener: tokio::net::UnixListener,
    reply: watch::Receiver<ListPodResourcesResponse>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(FakeKubelet::new(reply).into_service())
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            shutdown,
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_group_into_pods_and_containers() {
        let text = r#"
[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
devices = ["GPU-1"]

[[assignment]]
namespace = "ml"
pod = "q"
container = "b"
resource = "nvidia.com/mig-1g.10gb"
devices = ["MIG-2", "MIG-3"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "c"
devices = ["GPU-4::1"]
"#;
        let a = Assignments::parse(text, "a.toml").unwrap();
        let pods = &a.reply.pod_resources;
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0].name, "p");
        assert_eq!(pods[0].containers.len(), 2);
        assert_eq!(pods[0].containers[1].devices[0].device_ids, ["GPU-4::1"]);
        assert_eq!(pods[0].containers[0].devices[0].resource_name, GPU_RESOURCE);
        assert_eq!(
            pods[1].containers[0].devices[0].resource_name,
            "nvidia.com/mig-1g.10gb"
        );
    }

    #[test]
    fn errors_name_file_and_line() {
        let missing = "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ndevices = [\"GPU-1\"]\n";
        let e = Assignments::parse(missing, "a.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("a.toml:1: "), "{e}");
        assert!(e.contains("container"), "{e}");

        let unknown = "\n\n[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\ndevice = [\"x\"]\ndevices = [\"x\"]\n";
        let e = Assignments::parse(unknown, "b.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("b.toml:7: "), "{e}");
        assert!(e.contains("unknown field"), "{e}");

        let empty =
            "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\ndevices = []\n";
        let e = Assignments::parse(empty, "c.toml").unwrap_err().to_string();
        assert!(e.starts_with("c.toml:1: "), "{e}");

        let syntax = "[[assignment]]\nnamespace = \"ml\npod = \"p\"\n";
        let e = Assignments::parse(syntax, "d.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("d.toml:2: "), "{e}");

        let e = Assignments::load(Path::new("/nonexistent/x.toml"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "/nonexistent/x.toml: cannot read");
    }
    const NODE: &str = r#"
cgroup_driver = "cgroupfs"
runtime = "crio"

[[assignment]]
namespace = "infer"
pod = "embed-a"
container = "server"
devices = ["GPU-1::0"]
labels = { app = "embed", "app.kubernetes.io/part-of" = "search" }
pids = [101, 102]
weight = 2.0

[[assignment]]
namespace = "infer"
pod = "embed-b"
container = "server"
pod_uid = "0b8f5a3e-1111-2222-3333-444455556666"
container_id = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
devices = ["GPU-1::1", "GPU-2"]
pids = [201]
"#;

    #[test]
    fn a_node_file_describes_runtime_processes_and_proc_tree() {
        let a = Assignments::parse(NODE, "n.toml").unwrap();
        assert_eq!(
            a.layout,
            CgroupLayout {
                driver: CgroupDriver::Cgroupfs,
                version: 2,
                runtime: Runtime::Crio
            }
        );
        let snap = a.runtime_snapshot();
        assert_eq!(snap.sandboxes.len(), 2);
        assert_eq!(snap.containers.len(), 2);
        let a_box = &snap.sandboxes[0];
        assert_eq!(a_box.labels["app"], "embed");
        assert_eq!(a_box.labels["io.kubernetes.pod.name"], "embed-a");
        let b = &snap.sandboxes[1];
        assert_eq!(
            b.metadata.as_ref().unwrap().uid,
            "0b8f5a3e-1111-2222-3333-444455556666"
        );
        assert_eq!(
            snap.containers[1].id,
            "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
        );
        // Derived ids are stable and well-formed.
        let again = Assignments::parse(NODE, "n.toml").unwrap();
        assert_eq!(again.runtime_snapshot(), snap);
        assert_eq!(snap.containers[0].id.len(), 64);
        assert_eq!(a.pods[0].uid.len(), 36);

        let procs = a.processes();
        let got: Vec<(u32, &str, f64)> = procs
            .iter()
            .map(|p| (p.pid, p.device_id.as_str(), p.weight))
            .collect();
        assert_eq!(
            got,
            [
                (101, "GPU-1::0", 2.0),
                (102, "GPU-1::0", 2.0),
                (201, "GPU-1::1", 1.0),
                (201, "GPU-2", 1.0)
            ]
        );

        // The proc tree parses back to the pods and containers the runtime lists.
        let dir = tempfile::tempdir().unwrap();
        let written = a.write_proc_tree(dir.path(), &[]).unwrap();
        assert_eq!(written, [101, 102, 201]);
        let root = crate::pods::procfs::ProcRoot::new(dir.path());
        for (pid, pod, container) in [(101, 0, 0), (201, 1, 0)] {
            assert_eq!(
                root.owner(pid).unwrap(),
                crate::pods::cgroup::CgroupOwner::Pod {
                    uid: a.pods[pod].uid.clone(),
                    container_id: Some(a.pods[pod].containers[container].id.clone()),
                }
            );
        }
        // Rewriting without 102 removes its directory.
        let fewer = Assignments::parse(&NODE.replace("[101, 102]", "[101]"), "n.toml").unwrap();
        fewer.write_proc_tree(dir.path(), &written).unwrap();
        assert!(!dir.path().join("102").exists());
        assert!(dir.path().join("101/cgroup").exists());
    }

    #[test]
    fn every_layout_round_trips_through_the_parser() {
        let uid = "0b8f5a3e-1111-2222-3333-444455556666";
        let cid = "ab".repeat(32);
        for driver in [CgroupDriver::Systemd, CgroupDriver::Cgroupfs] {
            for version in [1, 2] {
                for runtime in [Runtime::Containerd, Runtime::Crio, Runtime::Docker] {
                    let layout = CgroupLayout {
                        driver,
                        version,
                        runtime,
                    };
                    let text = cgroup_file(layout, uid, &cid);
                    assert_eq!(
                        crate::pods::cgroup::parse(&text),
                        Ok(crate::pods::cgroup::CgroupOwner::Pod {
                            uid: uid.into(),
                            container_id: Some(cid.clone())
                        }),
                        "{layout:?}: {text}"
                    );
                }
            }
        }
    }

    #[test]
    fn node_file_errors_name_the_line() {
        let cases = [
            ("cgroup_version = 3\n", "n.toml:1: cgroup_version 3: must be 1 or 2"),
            ("[[assignment]]\nnamespace = \"a\"\npod = \"p\"\ncontainer = \"c\"\ndevices = [\"x\"]\nweight = 0\n", "n.toml:1: assignment a/p/c: weight must be a positive number"),
            ("[[assignment]]\nnamespace = \"a\"\npod = \"p\"\ncontainer = \"c\"\ndevices = [\"x\"]\ncontainer_id = \"xyz\"\n", "n.toml:1: assignment a/p/c: container_id must be 64 hex digits"),
            ("[[assignment]]\nnamespace = \"a\"\npod = \"p\"\ncontainer = \"c\"\ndevices = [\"x\"]\npids = [1]\n\n[[assignment]]\nnamespace = \"a\"\npod = \"q\"\ncontainer = \"c\"\ndevices = [\"y\"]\npids = [1]\n", "n.toml:8: assignment a/q/c: pid 1 is already a process of another container"),
            ("runtime = \"rkt\"\n", "n.toml:1: "),
        ];
        for (text, want) in cases {
            let e = Assignments::parse(text, "n.toml").unwrap_err().to_string();
            assert!(e.starts_with(want), "{e} (want {want})");
        }
    }

    #[test]
    fn dra_assignments_become_dynamic_resources_grouped_by_claim() {
        let text = r#"
[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
claim = "gpus"
pool = "node-a"
devices = ["gpu-0"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
devices = ["GPU-1"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
claim = "gpus"
pool = "node-a"
devices = ["gpu-1-mig-3g40gb-9-4"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "b"
claim = "shared"
claim_namespace = "infra"
driver = "dra.example.com"
devices = ["nic-0"]
"#;
        let a = Assignments::parse(text, "dra.toml").unwrap();
        let pod = &a.reply.pod_resources[0];
        let c = &pod.containers[0];
        assert_eq!(c.devices[0].device_ids, ["GPU-1"]);
        assert_eq!(c.dynamic_resources.len(), 1);
        let claim = &c.dynamic_resources[0];
        assert_eq!(
            (claim.claim_name.as_str(), claim.claim_namespace.as_str()),
            ("gpus", "ml")
        );
        let devices: Vec<(&str, &str, &str)> = claim
            .claim_resources
            .iter()
            .map(|r| {
                (
                    r.driver_name.as_str(),
                    r.pool_name.as_str(),
                    r.device_name.as_str(),
                )
            })
            .collect();
        assert_eq!(
            devices,
            [
                (NVIDIA_GPU_DRIVER, "node-a", "gpu-0"),
                (NVIDIA_GPU_DRIVER, "node-a", "gpu-1-mig-3g40gb-9-4")
            ]
        );
        // One CDI id per device, as the driver forms them, with the same claim uid.
        let cdi: Vec<&str> = claim
            .claim_resources
            .iter()
            .flat_map(|r| r.cdi_devices.iter().map(|d| d.name.as_str()))
            .collect();
        assert_eq!(cdi.len(), 2);
        let uid = cdi[0]
            .strip_prefix("k8s.gpu.nvidia.com/claim=")
            .and_then(|r| r.strip_suffix("-gpu-0"))
            .unwrap();
        assert_eq!(uid.len(), 36, "{uid}");
        assert_eq!(
            cdi[1],
            format!("k8s.gpu.nvidia.com/claim={uid}-gpu-1-mig-3g40gb-9-4")
        );
        let other = &pod.containers[1].dynamic_resources[0];
        assert_eq!(other.claim_namespace, "infra");
        assert_eq!(other.claim_resources[0].driver_name, "dra.example.com");
        assert_eq!(other.claim_resources[0].pool_name, DEFAULT_POOL);
    }

    #[test]
    fn dra_fields_are_checked() {
        let both = "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\nresource = \"nvidia.com/gpu\"\nclaim = \"x\"\ndevices = [\"gpu-0\"]\n";
        let e = Assignments::parse(both, "a.toml").unwrap_err().to_string();
        assert!(e.starts_with("a.toml:1: ") && e.contains("not both"), "{e}");
        let pool = "\n[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\npool = \"n\"\ndevices = [\"GPU-0\"]\n";
        let e = Assignments::parse(pool, "b.toml").unwrap_err().to_string();
        assert!(
            e.starts_with("b.toml:2: ") && e.contains("`pool` needs `claim`"),
            "{e}"
        );
        let empty = "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\nclaim = \" \"\ndevices = [\"gpu-0\"]\n";
        let e = Assignments::parse(empty, "c.toml").unwrap_err().to_string();
        assert!(e.contains("empty claim"), "{e}");
    }
}
