//! A fake kubelet pod-resources server, for the `fake-kubelet` binary, tests and demos.
//!
//! It serves `List` from an [`Assignments`] file (parsed by the simulator's
//! [`gpu_exporter::gpu::sim::assignments`], which `--sim-processes` reads too): a TOML list of which container holds which
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
//!
//! # A process outside any pod (a host daemon, another runtime's job): the simulated fleet runs
//! # it and the proc tree places it under a systemd unit; no kubelet or runtime lists it.
//! [[host_process]]
//! pid = 7001                       # required
//! device = "GPU-0b8f5a3e-…"        # required: a device-plugin id
//! weight = 1.0                     # optional, as above
//! unit = "nvidia-persistenced"     # optional: its cgroup is /system.slice/<unit>.service
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

//!
//! Layout: `node` derives what the node shows from a parsed file ([`Assignments`]: the
//! kubelet's reply, the container runtime's listing, the proc tree's cgroups, the simulated
//! processes); this file serves the pod-resources API.

mod node;
#[cfg(test)]
mod tests;

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::proto::pod_resources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpu_exporter::pods::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse,
};

pub use gpu_exporter::gpu::sim::assignments::{
    Allocation, AssignmentsError, CgroupDriver, CgroupLayout, Container as FakeContainer,
    DeviceNaming, HostProcess, Pod as FakePod, Process as FakeProcess, Run, Runtime, DEFAULT_POOL,
};
pub use node::{cgroup_file, Assignments};

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
