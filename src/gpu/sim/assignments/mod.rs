//! The assignments file of `--sim-processes` (and of the fake kubelet in
//! crates/gpu-exporter-testing, which serves the same file): which pod's container holds which
//! devices, and which PIDs run on them. The format is documented in docs/pods.md.
//!
//! The simulator owns the format: [`Assignments::load`] reads a file into its pods, containers
//! and processes (with the ids a real kubelet and runtime would give), and
//! [`Assignments::sim_processes`] places the processes on the simulated devices. What a kubelet
//! or container runtime would serve from it is the fake kubelet's business, not the exporter's.

mod model;
mod parse;
#[cfg(test)]
mod tests;

pub use model::{
    Allocation, Assignments, AssignmentsError, CgroupDriver, CgroupLayout, Container, DeviceNaming,
    HostProcess, Pod, Process, Run, Runtime, DEFAULT_POOL,
};
pub use parse::derived_uid;
