//! [`GpuIdType`]: how the kubelet's device ids name GPUs. Vocabulary shared by the mapping that
//! interprets the ids and the configuration that picks the rule (`--kubernetes-gpu-id-type`),
//! so it sits here, below both.

use clap::ValueEnum;

/// How kubelet device ids are matched to GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GpuIdType {
    /// GPU and MIG UUIDs (NVIDIA device plugin).
    Uid,
    /// `nvidia<N>` device names (GKE's device plugin).
    DeviceName,
}
