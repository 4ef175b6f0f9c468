//! Pod attribution: which pods hold which GPUs and MIG instances.
//!
//! The kubelet client and the id mapping land in the pod-attribution issue; this module holds
//! the plain data the snapshot builder consumes, so the rest of the pipeline does not depend on
//! how attribution is obtained.

use std::collections::BTreeMap;

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
}

/// An exported entity: a whole GPU (`gi_id: None`) or one of its MIG instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntityKey {
    /// GPU index.
    pub gpu: u32,
    /// GPU instance id, for MIG instances.
    pub gi_id: Option<u32>,
}

/// Who holds what. Entities absent from the map are unallocated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    /// Holders per entity, sorted and deduplicated.
    pub holders: BTreeMap<EntityKey, Vec<Holder>>,
}

impl Attribution {
    /// The holders of `key` (empty if unallocated).
    pub fn holders_of(&self, key: EntityKey) -> &[Holder] {
        self.holders.get(&key).map_or(&[], Vec::as_slice)
    }
}
