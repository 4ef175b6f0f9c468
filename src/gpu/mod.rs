//! The GPU seam: the [`GpuSource`] trait and the plain data it returns.
//!
//! A source enumerates [`Device`]s (identity read once per discovery) and, every tick, reads the
//! requested fields of one device into a [`DeviceSample`]. Calls are blocking (NVML is
//! synchronous FFI), so the sampler runs them on a blocking thread. A failing *field* is recorded
//! inside the sample; only a failing *device* (fallen off the bus, driver gone) is an `Err`.

pub mod dcgm;
pub mod event_texts;
pub mod nvml;
pub mod sim;

use std::fmt;

use crate::catalog::Field;

/// A field value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (label-type fields).
    Text(String),
}

/// Why a field has no value this tick. Each is a `reason` label on the field-error self-metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FieldError {
    /// The device does not support the field (expected on some models; not counted as an error).
    NotSupported,
    /// The process lacks the privilege to read it.
    NoPermission,
    /// The read failed (driver error, timeout).
    Failed,
    /// The value read was out of range or otherwise unusable.
    Invalid,
}

impl FieldError {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FieldError::NotSupported => "not_supported",
            FieldError::NoPermission => "no_permission",
            FieldError::Failed => "failed",
            FieldError::Invalid => "invalid",
        }
    }
}

/// Why a source cannot serve a field on a GPU at all, known from the hardware rather than from a
/// failed read. The exporter reports each once (a log line naming the fix) and as the
/// `gpu_exporter_fields_unavailable{field,reason}` gauge; the field's reads on that GPU are
/// [`FieldError::NotSupported`] (no series, no error counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FieldGap {
    /// A `DCGM_FI_PROF_*` field on a GPU without NVML GPM (before Hopper: A100, L40S, A10, T4,
    /// V100) and no DCGM source (`-r`): NVML has no other way to read profiling metrics;
    /// dcgm-exporter reads them from DCGM's profiling module, and so does gpu-exporter with `-r`.
    ProfilingNeedsDcgm,
}

impl FieldGap {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FieldGap::ProfilingNeedsDcgm => "needs_dcgm_profiling",
        }
    }

    /// Why, and the fix, for the log line.
    pub fn explanation(self) -> &'static str {
        match self {
            FieldGap::ProfilingNeedsDcgm => "NVML reads DCGM_FI_PROF_* (profiling) metrics only through GPM, which needs a Hopper or newer GPU; on older GPUs (A100, L40S, A10, T4, V100) they come from DCGM's profiling module, read through a DCGM hostengine: pass `-r host:5555` / DCGM_REMOTE_HOSTENGINE_INFO (e.g. the GPU Operator's standalone DCGM service `nvidia-dcgm:5555`) to serve them; without it these series are absent on those GPUs",
        }
    }
}

/// A field read: a value or why there is none.
pub type Reading = Result<Value, FieldError>;

/// Identity of a physical GPU, read once per discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuIdentity {
    /// NVML index (dcgm-exporter's `gpu` label).
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// PCI bus id, `00000000:8D:00.0` form.
    pub pci_bus_id: String,
    /// Minor number: `/dev/nvidia<minor>` (GKE device-plugin ids name GPUs by it; the `device`
    /// label uses the index, as dcgm-exporter does).
    pub minor: u32,
    /// Product name (`modelName`).
    pub model: String,
}

/// A MIG GPU instance on a physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInstance {
    /// GPU instance id (`GPU_I_ID`).
    pub gi_id: u32,
    /// Compute instance id of the MIG device.
    pub ci_id: u32,
    /// Profile name as the device plugin spells it, e.g. `3g.40gb` (`GPU_I_PROFILE`).
    pub profile: String,
    /// `MIG-…` UUID of the MIG device.
    pub uuid: String,
    /// Where the GPU instance sits on its GPU, when NVML tells (`None`: unknown, e.g. the GPU
    /// instance calls need privileges). NVIDIA's DRA driver names MIG devices by it.
    pub placement: Option<MigPlacement>,
}

/// A GPU instance's profile id and placement (`nvmlGpuInstanceInfo_t`): which memory slices of
/// its GPU it occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigPlacement {
    /// GPU instance profile id (`NVML_GPU_INSTANCE_PROFILE_*`, e.g. 9 for 3g.40gb on an A100).
    pub profile_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

/// A physical GPU and its MIG instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Identity.
    pub identity: GpuIdentity,
    /// Whether MIG mode is enabled.
    pub mig_enabled: bool,
    /// MIG instances (empty slots skipped), ordered by `gi_id`.
    pub instances: Vec<MigInstance>,
}

/// One XID error reported by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEvent {
    /// The XID number.
    pub xid: u64,
}

/// Readings for one MIG instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceSample {
    /// GPU instance id.
    pub gi_id: u32,
    /// Instance-scoped readings ([`crate::catalog::field::MigScope::Instance`] fields).
    pub readings: Vec<(Field, Reading)>,
}

/// Readings for one active NVLink of a physical GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSample {
    /// NVML link index, 0-based (dcgm-exporter's `nvlink` label is this + 1).
    pub link: u32,
    /// Link-scoped readings ([`crate::catalog::field::MigScope::Link`] fields).
    pub readings: Vec<(Field, Reading)>,
}

/// What one tick read from one device.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceSample {
    /// GPU-level readings.
    pub readings: Vec<(Field, Reading)>,
    /// Per-instance readings, for MIG-enabled GPUs.
    pub instances: Vec<InstanceSample>,
    /// Per-link readings of the GPU's active NVLinks, in link order; empty unless a link field
    /// is asked for.
    pub links: Vec<LinkSample>,
}

impl DeviceSample {
    /// The GPU-level value of `field`, if it was read.
    pub fn get(&self, field: Field) -> Option<&Value> {
        self.readings
            .iter()
            .find(|(f, _)| *f == field)
            .and_then(|(_, r)| r.as_ref().ok())
    }

    /// The GPU-level value of `field` as an integer, if it was read and is numeric.
    pub fn get_i64(&self, field: Field) -> Option<i64> {
        match self.get(field)? {
            Value::Int(v) => Some(*v),
            #[allow(clippy::cast_possible_truncation)]
            Value::Float(v) => Some(*v as i64),
            Value::Text(_) => None,
        }
    }
}

/// Utilisation of one process over the time since the previous tick, % (NVML's per-process
/// `smUtil`, `memUtil`, `encUtil`, `decUtil`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessUtilization {
    /// Streaming multiprocessors (3D / compute).
    pub sm: u32,
    /// Memory controller (framebuffer bandwidth).
    pub memory: u32,
    /// Video encoder.
    pub encoder: u32,
    /// Video decoder.
    pub decoder: u32,
}

/// One process with a compute context on a GPU, as read in one tick. PIDs are the host's (the
/// driver does not know PID namespaces).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// Host PID.
    pub pid: u32,
    /// The MIG GPU instance it runs in; `None` on a GPU without MIG.
    pub gi_id: Option<u32>,
    /// Framebuffer it uses, bytes; `None` when the driver does not say.
    pub used_memory_bytes: Option<u64>,
    /// Its utilisation since the previous tick (zero when it had no sample: idle); `None` when
    /// the GPU cannot report per-process utilisation (MIG, old GPUs).
    pub utilization: Option<ProcessUtilization>,
}

/// A device-level failure.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The GPU is no longer reachable (NVML `GpuLost`, XID 79).
    #[error("GPU {index} ({uuid}) has fallen off the bus")]
    GpuLost {
        /// Index.
        index: u32,
        /// UUID.
        uuid: String,
    },
    /// Reading the device failed for another reason.
    #[error("reading GPU {index} ({uuid})")]
    Device {
        /// Index.
        index: u32,
        /// UUID.
        uuid: String,
        /// The cause.
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Enumerating GPUs failed.
    #[error("enumerating GPUs")]
    Discovery {
        /// The cause.
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl SourceError {
    /// The `reason` label for self-metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            SourceError::GpuLost { .. } => "gpu_lost",
            SourceError::Device { .. } => "device_error",
            SourceError::Discovery { .. } => "discovery_error",
        }
    }
}

/// Reads GPU state. Blocking: callers run it on a blocking thread, never on the async runtime.
pub trait GpuSource: Send + Sync + 'static {
    /// Short name for logs and the `source` label (`nvml`, `sim`).
    fn name(&self) -> &'static str;

    /// Whether this source can ever produce `field` (unsupported CSV rows are skipped at startup
    /// with one warning each).
    fn supports(&self, field: Field) -> bool;

    /// Why `field` can never be read on `device` (a hardware generation without the field's
    /// source), or `None` when it can or when only a read can tell. Asked after each discovery
    /// for the fields in the catalog; the reads of such a field are
    /// [`FieldError::NotSupported`].
    fn field_gap(&self, device: &Device, field: Field) -> Option<FieldGap> {
        let _ = (device, field);
        None
    }

    /// Enumerates devices. Called at startup and again on a slow cadence, so GPUs that vanish or
    /// return are noticed without a restart.
    ///
    /// # Errors
    /// [`SourceError::Discovery`] if the devices cannot be listed at all.
    fn devices(&self) -> Result<Vec<Device>, SourceError>;

    /// Reads `fields` from one device.
    ///
    /// # Errors
    /// [`SourceError::GpuLost`] or [`SourceError::Device`] when the device as a whole cannot be
    /// read; per-field failures are recorded in the sample instead.
    fn sample(&self, device: &Device, fields: &[Field]) -> Result<DeviceSample, SourceError>;

    /// Whether the source saw, since the last call, that its device list is out of date (a
    /// MIG reconfiguration invalidates instance handles): the sampler then re-enumerates at
    /// its next tick instead of waiting for the periodic discovery. Reading clears it.
    fn wants_rediscovery(&self) -> bool {
        false
    }

    /// XID errors reported since the last call, keyed by GPU UUID. NVML delivers these through
    /// its event path, which keeps working when a GPU's reads fail (XID 79: fallen off the bus),
    /// so they are drained separately from [`GpuSource::sample`].
    fn drain_xids(&self) -> Vec<(String, XidEvent)>;

    /// The processes running on `device` (and its MIG instances) with their memory and their
    /// utilisation since the previous call for this device. Called once per tick after
    /// [`GpuSource::sample`], only when per-process attribution is on; blocking like it.
    ///
    /// # Errors
    /// Why the processes could not be listed; [`FieldError::NotSupported`] for sources without
    /// processes (the default).
    fn processes(&self, device: &Device) -> Result<Vec<GpuProcess>, FieldError> {
        let _ = device;
        Err(FieldError::NotSupported)
    }

    /// Registers the self-metrics the source keeps itself (the DCGM source's
    /// `gpu_exporter_dcgm_*`) into the exporter's registry; none by default.
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let _ = registry;
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            // Rust's float Display never uses exponent notation and prints the shortest string
            // that round-trips: 302.206 stays "302.206", 1e-7 is "0.0000001", 45.0 is "45".
            Value::Float(v) if v.is_nan() => f.write_str("NaN"),
            Value::Float(v) if v.is_infinite() => {
                f.write_str(if *v > 0.0 { "+Inf" } else { "-Inf" })
            }
            Value::Float(v) => write!(f, "{v}"),
            Value::Text(s) => f.write_str(s),
        }
    }
}
