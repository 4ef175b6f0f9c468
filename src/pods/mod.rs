//! Pod attribution: which pods hold which GPUs and MIG instances.
//!
//! - [`PodResolver`]: the seam, "list what the pods on this node hold"; implemented by
//!   [`kubelet::KubeletPodResources`] (the kubelet pod-resources v1 API on its unix socket).
//! - [`mapping`]: pure, reply + device inventory → [`Attribution`].
//! - [`refresher`]: the task that asks on its own cadence, keeps the last good answer for a TTL
//!   and publishes [`Attribution`] on the `watch` channel the sampler reads. Nothing on the
//!   scrape path waits for the kubelet.
//!
//! Who *uses* a GPU, node-local (no API server):
//!
//! - [`cri`]: the container runtime's CRI socket (`ListPodSandbox`, `ListContainers`), read by
//!   [`cri_refresher`] on its own cadence into a [`directory::PodDirectory`]: container id →
//!   pod and container, pod → UID and labels.
//! - [`procfs`] and [`cgroup`]: a GPU process's PID → its pod UID and container id, from
//!   `/proc/<pid>/cgroup` under `--path.procfs`.
//! - [`usage`]: pure, NVML's per-process readings + owners + directory → per-container usage.
//! - The fake kubelet and container runtime, for running all of it without a cluster, are test
//!   doubles in crates/gpu-exporter-testing.
//!
//! The rest of the pipeline sees only the plain data below.

pub mod cgroup;
pub mod client_health;
pub mod cri;
pub mod cri_proto;
pub mod cri_refresher;
pub mod directory;
pub mod dra;
pub mod grpc;
mod id_type;
pub mod kubelet;
pub mod mapping;
pub mod procfs;
pub mod proto;
pub mod refresh;
pub mod refresher;
pub mod usage;

use std::collections::BTreeMap;
use std::future::Future;

use self::proto::{AllocatableResourcesResponse, ListPodResourcesResponse};

pub use id_type::GpuIdType;

/// A container that holds a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
}

/// One holder of a device: a container, and the shared-GPU replica it was given, if any.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holder {
    /// The container.
    pub pod: PodRef,
    /// Replica id for time-sliced or MPS GPUs (`GPU-…::3` gives `3`).
    pub vgpu: Option<String>,
    /// The DRA claim the device was allocated through (`--kubernetes-enable-dra`); `None` for
    /// device-plugin allocations.
    pub dra: Option<DraClaim>,
}

/// A device allocated through a DRA ResourceClaim: dcgm-exporter's `dra_*` labels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DraClaim {
    /// The ResourceClaim's name (generated for claims made from a template).
    pub claim_name: String,
    /// The ResourceClaim's namespace.
    pub claim_namespace: String,
    /// The DRA driver (`gpu.nvidia.com`).
    pub driver: String,
    /// The driver's pool (the node's name for NVIDIA's driver).
    pub pool: String,
    /// The device's name in the pool (`gpu-0`, `gpu-0-mig-1g10gb-19-2`).
    pub device: String,
}

/// An exported entity: a whole GPU (`gi_id: None`) or one of its MIG instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntityKey {
    /// GPU index.
    pub gpu: u32,
    /// GPU instance id, for MIG instances.
    pub gi_id: Option<u32>,
}

/// Who uses what. Entities absent from the maps are unallocated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    /// Holders per entity, sorted and deduplicated (from the kubelet).
    pub holders: BTreeMap<EntityKey, Vec<Holder>>,
    /// HPC job ids per entity, deduplicated, in file order (from `--hpc-job-mapping-dir`; see
    /// [`crate::hpc`]). The sampler merges them in; the kubelet refresher leaves this empty.
    pub jobs: BTreeMap<EntityKey, Vec<String>>,
    /// Time-slicing or MPS replicas (`GPU-…::N`, `MIG-…::N`) the device plugin offers per
    /// entity, held or not (the kubelet's `GetAllocatableResources`); absent where the entity is
    /// not shared or the kubelet did not say. Accounting divides a shared GPU by it.
    pub replicas: BTreeMap<EntityKey, u32>,
}

impl Attribution {
    /// The holders of `key` (empty if unallocated).
    pub fn holders_of(&self, key: EntityKey) -> &[Holder] {
        self.holders.get(&key).map_or(&[], Vec::as_slice)
    }

    /// The replicas the device plugin offers of `key`, if it is shared and the kubelet said.
    pub fn replicas_of(&self, key: EntityKey) -> Option<u32> {
        self.replicas.get(&key).copied()
    }

    /// The HPC jobs running on `key` (empty if none).
    pub fn jobs_of(&self, key: EntityKey) -> &[String] {
        self.jobs.get(&key).map_or(&[], Vec::as_slice)
    }
}

/// How far an attribution task (kubelet, container runtime, HPC directory) has got, published
/// on a `watch` channel after each good answer. The sampler waits for the first one of every
/// configured source before its first sample, so that sample is already attributed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answered {
    /// Good answers so far (replies of the kubelet or the runtime, scans of the HPC directory).
    pub answers: u64,
    /// The device inventory the published attribution was mapped with (the kubelet's device
    /// ids are matched against it); `None` for sources that need no inventory.
    pub inventory: Option<std::sync::Arc<Vec<crate::gpu::Device>>>,
    /// Why the source cannot answer soon, so the first sample need not wait for it: its socket
    /// does not exist (`socket_missing`); `None` once it answers.
    pub unavailable: Option<&'static str>,
}

impl Answered {
    /// Whether this source has answered, and (where it maps device ids) with `devices`.
    pub fn covers(&self, devices: &[crate::gpu::Device]) -> bool {
        // (`unavailable` is not an answer: see `FirstAnswers`, which stops waiting on it.)
        self.answers > 0
            && self
                .inventory
                .as_ref()
                .is_none_or(|i| i.as_slice() == devices)
    }
}

/// Marks `a` unavailable when a call failed with `reason` and that failure will not go away
/// within a call timeout (the socket does not exist); whether it changed.
pub(crate) fn unavailable(a: &mut Answered, reason: &'static str) -> bool {
    let now = (reason == "socket_missing").then_some(reason);
    let changed = a.unavailable != now;
    a.unavailable = now;
    changed
}

/// Lists the device assignments of the pods on this node.
pub trait PodResolver: Send + Sync + 'static {
    /// Where the answers come from, for logs (the socket path).
    fn origin(&self) -> String;

    /// One `List` call. Implementations bound its duration themselves.
    ///
    /// # Errors
    /// An [`AttributionError`] saying why there is no answer.
    fn list(
        &self,
    ) -> impl Future<Output = Result<ListPodResourcesResponse, AttributionError>> + Send;

    /// One `GetAllocatableResources` call: every device the device plugins offer, held or not
    /// (how many replicas a shared GPU has). A resolver that cannot say answers `Ok(None)`.
    ///
    /// # Errors
    /// An [`AttributionError`] saying why there is no answer.
    fn allocatable(
        &self,
    ) -> impl Future<Output = Result<Option<AllocatableResourcesResponse>, AttributionError>> + Send
    {
        std::future::ready(Ok(None))
    }
}

pub use grpc::Cause;

/// Why the pod-resources API gave no usable answer: the gRPC clients' error with the kubelet's
/// flag, reasons and fixes ([`grpc::Kubelet`]).
pub type AttributionError = grpc::GrpcError<grpc::Kubelet>;
