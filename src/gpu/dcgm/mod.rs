//! The start of the DCGM source (issue 27): DCGM's client library, `libdcgm.so.4`, loaded at run
//! time (no link-time dependency: a node without DCGM never loads it), a connection to a
//! hostengine (`-r host:5555`, e.g. the GPU Operator's `nvidia-dcgm:5555`), and the latest values
//! of fields for entities, converted to [`Reading`](crate::gpu::Reading)s with DCGM's status codes and blank
//! sentinels. [`ffi`] is the only code that touches the C ABI; the data it returns is in `types`
//! (re-exported here), which is pure.
//!
//! [`source::DcgmSource`] wraps the NVML source with it (`-r`): the watch groups, the mapping
//! of DCGM entities to ours ([`plan`]), reconnection and the `gpu_exporter_dcgm_*` self-metrics.

pub mod ffi;
pub mod metrics;
pub mod plan;
pub mod source;

mod types;

pub use ffi::{Connection, DcgmLibrary, FieldGroupId, GroupId};
pub use types::{
    blank, log_severity, reading, status, status_name, DcgmError, Entity, EntityGroup, LatestValue,
    MetricGroup, MigEntity, RawValue,
};
