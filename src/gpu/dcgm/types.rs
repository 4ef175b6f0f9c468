//! The DCGM source's plain data: entities, latest values, metric groups, MIG entities, return
//! codes, blank sentinels, errors, and how a latest value becomes a [`Reading`]. Pure: both the
//! C ABI layer ([`super::ffi`]) and the reader ([`super::source`]) build on it.

use crate::gpu::{FieldError, Reading, Value};

/// DCGM's entity groups (`dcgm_field_entity_group_t`), the ones the exporter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntityGroup {
    /// `DCGM_FE_GPU`: a whole GPU, by DCGM GPU id.
    Gpu,
    /// `DCGM_FE_GPU_I`: a MIG GPU instance, by DCGM entity id.
    GpuInstance,
    /// `DCGM_FE_GPU_CI`: a MIG compute instance.
    ComputeInstance,
}

impl EntityGroup {
    /// The C enum value (`DCGM_FE_NONE` 0, `_GPU` 1, `_VGPU` 2, `_SWITCH` 3, `_GPU_I` 4,
    /// `_GPU_CI` 5).
    pub fn raw(self) -> i32 {
        match self {
            EntityGroup::Gpu => 1,
            EntityGroup::GpuInstance => 4,
            EntityGroup::ComputeInstance => 5,
        }
    }

    /// The group of a C enum value, if the exporter reads it.
    pub fn from_raw(raw: i32) -> Option<Self> {
        match raw {
            1 => Some(EntityGroup::Gpu),
            4 => Some(EntityGroup::GpuInstance),
            5 => Some(EntityGroup::ComputeInstance),
            _ => None,
        }
    }
}

/// One entity: its group and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entity {
    /// Group.
    pub group: EntityGroup,
    /// Id within the group.
    pub id: u32,
}

/// A value as `dcgmFieldValue_v2` carries it, before blanks are interpreted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RawValue {
    /// `DCGM_FT_DOUBLE`.
    Double(f64),
    /// `DCGM_FT_INT64` (and the other integer types DCGM widens to it).
    Int64(i64),
    /// A type the exporter does not read (string, blob, timestamp...).
    Other(u16),
}

/// One entry of `dcgmEntitiesGetLatestValues`' answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatestValue {
    /// The entity it belongs to (as the library reports it).
    pub entity: Entity,
    /// DCGM field id.
    pub field_id: u16,
    /// The entry's `status`: `DCGM_ST_OK` or why there is no value.
    pub status: i32,
    /// The value.
    pub value: RawValue,
}

/// A profiling metric group (`dcgmProfMetricGroupInfo_v2`): fields the profiling module reads
/// together. Groups with the same `major` cannot be watched at the same time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricGroup {
    /// `majorId`.
    pub major: u16,
    /// `minorId`.
    pub minor: u16,
    /// Its DCGM field ids.
    pub fields: Vec<u16>,
}

/// A MIG entity of `dcgmGetGpuInstanceHierarchy` (`dcgmMigHierarchyInfo_v2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigEntity {
    /// The entity (a GPU instance or a compute instance).
    pub entity: Entity,
    /// Its parent (a GPU, or the GPU instance of a compute instance).
    pub parent: Entity,
    /// The UUID of the physical GPU it is on.
    pub gpu_uuid: String,
    /// NVML's GPU instance id (`GPU_I_ID`).
    pub instance_id: u32,
    /// NVML's compute instance id.
    pub compute_instance_id: u32,
}

/// Errors of the DCGM library and hostengine.
#[derive(Debug, thiserror::Error)]
pub enum DcgmError {
    /// The library could not be loaded.
    #[error("cannot load {path} ({detail}): DCGM's client library is needed for the DCGM_FI_PROF_* fields NVML cannot read, with -r or embedded (the image variant with DCGM's libraries has it; or install datacenter-gpu-manager-4-core, or mount it from the host)")]
    Load {
        /// What was loaded.
        path: String,
        /// The loader's message.
        detail: String,
    },
    /// The library lacks a function the exporter needs.
    #[error("{path} has no {symbol} ({detail}): DCGM 4.x is needed")]
    Symbol {
        /// The library.
        path: String,
        /// The missing function.
        symbol: &'static str,
        /// The loader's message.
        detail: String,
    },
    /// The reader thread could not be started.
    #[error("cannot start the DCGM reader thread")]
    Thread(#[source] std::io::Error),
    /// A DCGM call failed.
    #[error("{call} returned {} ({code})", status_name(*code))]
    Call {
        /// The C function.
        call: &'static str,
        /// Its `dcgmReturn_t`.
        code: i32,
    },
}

impl DcgmError {
    /// Whether the error means the hostengine connection is gone (reconnect).
    pub fn connection_lost(&self) -> bool {
        matches!(self, DcgmError::Call { code, .. } if *code == status::CONNECTION_NOT_VALID)
    }
}

/// The `DcgmLoggingSeverity_t` of a dcgm-exporter `--dcgm-log-level` name: `NONE` (0), `FATAL`,
/// `ERROR`, `WARN`, `INFO`, `DEBUG`, `VERB` (6), spelled as upstream accepts them; `None` for
/// another name.
pub fn log_severity(level: &str) -> Option<i32> {
    ["NONE", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "VERB"]
        .iter()
        .position(|l| *l == level)
        .and_then(|i| i32::try_from(i).ok())
}

/// `dcgmReturn_t` values (dcgm_structs.h) the exporter tells apart.
pub mod status {
    /// `DCGM_ST_OK`.
    pub const OK: i32 = 0;
    /// `DCGM_ST_BADPARAM`.
    pub const BADPARAM: i32 = -1;
    /// `DCGM_ST_GENERIC_ERROR`.
    pub const GENERIC_ERROR: i32 = -3;
    /// `DCGM_ST_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: i32 = -6;
    /// `DCGM_ST_UNINITIALIZED`.
    pub const UNINITIALIZED: i32 = -10;
    /// `DCGM_ST_TIMEOUT`.
    pub const TIMEOUT: i32 = -11;
    /// `DCGM_ST_VER_MISMATCH`.
    pub const VER_MISMATCH: i32 = -12;
    /// `DCGM_ST_NO_DATA`.
    pub const NO_DATA: i32 = -14;
    /// `DCGM_ST_STALE_DATA`.
    pub const STALE_DATA: i32 = -15;
    /// `DCGM_ST_NOT_WATCHED`.
    pub const NOT_WATCHED: i32 = -16;
    /// `DCGM_ST_NO_PERMISSION`.
    pub const NO_PERMISSION: i32 = -17;
    /// `DCGM_ST_CONNECTION_NOT_VALID`.
    pub const CONNECTION_NOT_VALID: i32 = -21;
    /// `DCGM_ST_MAX_LIMIT`: a table of the hostengine (groups, field groups, watches) is full.
    pub const MAX_LIMIT: i32 = -24;
    /// `DCGM_ST_REQUIRES_ROOT`.
    pub const REQUIRES_ROOT: i32 = -29;
    /// `DCGM_ST_MODULE_NOT_LOADED`.
    pub const MODULE_NOT_LOADED: i32 = -33;
    /// `DCGM_ST_PROFILING_NOT_SUPPORTED`.
    pub const PROFILING_NOT_SUPPORTED: i32 = -36;
    /// `DCGM_ST_PROFILING_MULTI_PASS`.
    pub const PROFILING_MULTI_PASS: i32 = -38;
}

/// `DCGM_ST_*` names by `-code` (dcgm_structs.h's `dcgmReturn_t`, DCGM 4.x); -2 is unassigned.
const STATUS_NAMES: [&str; 59] = [
    "DCGM_ST_OK",
    "DCGM_ST_BADPARAM",
    "",
    "DCGM_ST_GENERIC_ERROR",
    "DCGM_ST_MEMORY",
    "DCGM_ST_NOT_CONFIGURED",
    "DCGM_ST_NOT_SUPPORTED",
    "DCGM_ST_INIT_ERROR",
    "DCGM_ST_NVML_ERROR",
    "DCGM_ST_PENDING",
    "DCGM_ST_UNINITIALIZED",
    "DCGM_ST_TIMEOUT",
    "DCGM_ST_VER_MISMATCH",
    "DCGM_ST_UNKNOWN_FIELD",
    "DCGM_ST_NO_DATA",
    "DCGM_ST_STALE_DATA",
    "DCGM_ST_NOT_WATCHED",
    "DCGM_ST_NO_PERMISSION",
    "DCGM_ST_GPU_IS_LOST",
    "DCGM_ST_RESET_REQUIRED",
    "DCGM_ST_FUNCTION_NOT_FOUND",
    "DCGM_ST_CONNECTION_NOT_VALID",
    "DCGM_ST_GPU_NOT_SUPPORTED",
    "DCGM_ST_GROUP_INCOMPATIBLE",
    "DCGM_ST_MAX_LIMIT",
    "DCGM_ST_LIBRARY_NOT_FOUND",
    "DCGM_ST_DUPLICATE_KEY",
    "DCGM_ST_GPU_IN_SYNC_BOOST_GROUP",
    "DCGM_ST_GPU_NOT_IN_SYNC_BOOST_GROUP",
    "DCGM_ST_REQUIRES_ROOT",
    "DCGM_ST_NVVS_ERROR",
    "DCGM_ST_INSUFFICIENT_SIZE",
    "DCGM_ST_FIELD_UNSUPPORTED_BY_API",
    "DCGM_ST_MODULE_NOT_LOADED",
    "DCGM_ST_IN_USE",
    "DCGM_ST_GROUP_IS_EMPTY",
    "DCGM_ST_PROFILING_NOT_SUPPORTED",
    "DCGM_ST_PROFILING_LIBRARY_ERROR",
    "DCGM_ST_PROFILING_MULTI_PASS",
    "DCGM_ST_DIAG_ALREADY_RUNNING",
    "DCGM_ST_DIAG_BAD_JSON",
    "DCGM_ST_DIAG_BAD_LAUNCH",
    "DCGM_ST_DIAG_UNUSED",
    "DCGM_ST_DIAG_THRESHOLD_EXCEEDED",
    "DCGM_ST_INSUFFICIENT_DRIVER_VERSION",
    "DCGM_ST_INSTANCE_NOT_FOUND",
    "DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND",
    "DCGM_ST_CHILD_NOT_KILLED",
    "DCGM_ST_3RD_PARTY_LIBRARY_ERROR",
    "DCGM_ST_INSUFFICIENT_RESOURCES",
    "DCGM_ST_PLUGIN_EXCEPTION",
    "DCGM_ST_NVVS_ISOLATE_ERROR",
    "DCGM_ST_NVVS_BINARY_NOT_FOUND",
    "DCGM_ST_NVVS_KILLED",
    "DCGM_ST_PAUSED",
    "DCGM_ST_ALREADY_INITIALIZED",
    "DCGM_ST_NVML_NOT_LOADED",
    "DCGM_ST_NVML_DRIVER_TIMEOUT",
    "DCGM_ST_NVVS_NO_AVAILABLE_TEST",
];

/// The `DCGM_ST_*` name of a return code.
pub fn status_name(code: i32) -> &'static str {
    code.checked_neg()
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| STATUS_NAMES.get(i))
        .copied()
        .filter(|n| !n.is_empty())
        .unwrap_or("an unknown DCGM status")
}

/// Blank sentinels (dcgm_structs.h): values at or above `*_BLANK` are not data.
pub mod blank {
    /// `DCGM_FP64_BLANK`.
    pub const FP64: f64 = 140_737_488_355_328.0;
    /// `DCGM_INT64_BLANK`.
    pub const INT64: i64 = 0x7fff_ffff_ffff_fff0;
}

/// Why a blank sentinel says there is no value: `*_BLANK + 2` is "not supported", `+ 3` "not
/// permissioned"; the rest (blank, not found) is no data.
fn blank_error(offset: i64) -> FieldError {
    match offset {
        2 => FieldError::NotSupported,
        3 => FieldError::NoPermission,
        _ => FieldError::Failed,
    }
}

/// A latest value as a [`Reading`]: the entry's status first, then DCGM's blank sentinels.
pub fn reading(v: &LatestValue) -> Reading {
    match v.status {
        status::OK => {}
        status::NOT_SUPPORTED | status::PROFILING_NOT_SUPPORTED => {
            return Err(FieldError::NotSupported)
        }
        status::NO_PERMISSION | status::REQUIRES_ROOT => return Err(FieldError::NoPermission),
        _ => return Err(FieldError::Failed),
    }
    match v.value {
        RawValue::Double(d) if d.is_nan() => Err(FieldError::Invalid),
        #[allow(clippy::cast_possible_truncation)]
        RawValue::Double(d) if d >= blank::FP64 => Err(blank_error((d - blank::FP64) as i64)),
        RawValue::Double(d) => Ok(Value::Float(d)),
        RawValue::Int64(i) if i >= blank::INT64 => Err(blank_error(i - blank::INT64)),
        RawValue::Int64(i) => Ok(Value::Int(i)),
        RawValue::Other(_) => Err(FieldError::Invalid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels_are_dcgm_exporters_names_mapped_to_dcgm_severities() {
        let all: Vec<Option<i32>> = ["NONE", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "VERB"]
            .iter()
            .map(|l| log_severity(l))
            .collect();
        assert_eq!(all, (0..=6).map(Some).collect::<Vec<_>>());
        // As upstream: exact names only.
        assert_eq!(log_severity("warn"), None);
        assert_eq!(log_severity("WARNING"), None);
        assert_eq!(log_severity(""), None);
    }

    fn v(status: i32, value: RawValue) -> LatestValue {
        LatestValue {
            entity: Entity {
                group: EntityGroup::Gpu,
                id: 0,
            },
            field_id: 1001,
            status,
            value,
        }
    }

    #[test]
    fn statuses_and_blank_sentinels_become_field_errors() {
        assert_eq!(
            reading(&v(status::OK, RawValue::Double(0.25))),
            Ok(Value::Float(0.25))
        );
        assert_eq!(
            reading(&v(status::OK, RawValue::Int64(7))),
            Ok(Value::Int(7))
        );
        let d = |x| reading(&v(status::OK, RawValue::Double(blank::FP64 + x)));
        assert_eq!(d(0.0), Err(FieldError::Failed));
        assert_eq!(d(1.0), Err(FieldError::Failed));
        assert_eq!(d(2.0), Err(FieldError::NotSupported));
        assert_eq!(d(3.0), Err(FieldError::NoPermission));
        let i = |x| reading(&v(status::OK, RawValue::Int64(blank::INT64 + x)));
        assert_eq!(i(0), Err(FieldError::Failed));
        assert_eq!(i(2), Err(FieldError::NotSupported));
        assert_eq!(i(3), Err(FieldError::NoPermission));
        let s = |st| reading(&v(st, RawValue::Double(0.5)));
        assert_eq!(s(status::NO_DATA), Err(FieldError::Failed));
        assert_eq!(s(status::NOT_SUPPORTED), Err(FieldError::NotSupported));
        assert_eq!(
            s(status::PROFILING_NOT_SUPPORTED),
            Err(FieldError::NotSupported)
        );
        assert_eq!(s(status::REQUIRES_ROOT), Err(FieldError::NoPermission));
        assert_eq!(
            reading(&v(status::OK, RawValue::Other(u16::from(b's')))),
            Err(FieldError::Invalid)
        );
    }

    #[test]
    fn errors_name_the_status() {
        let e = DcgmError::Call {
            call: "dcgmConnect_v2",
            code: status::CONNECTION_NOT_VALID,
        };
        assert_eq!(
            e.to_string(),
            "dcgmConnect_v2 returned DCGM_ST_CONNECTION_NOT_VALID (-21)"
        );
        assert!(e.connection_lost());
        assert_eq!(status_name(-999), "an unknown DCGM status");
        assert_eq!(status_name(-2), "an unknown DCGM status");
        assert_eq!(status_name(1), "an unknown DCGM status");
        assert_eq!(status_name(i32::MIN), "an unknown DCGM status");
        // Every constant the exporter tells apart has its own name, and the standard statuses
        // it does not tell apart are named too (a full group table: -24).
        for (code, name) in [
            (status::OK, "DCGM_ST_OK"),
            (status::BADPARAM, "DCGM_ST_BADPARAM"),
            (status::GENERIC_ERROR, "DCGM_ST_GENERIC_ERROR"),
            (status::NOT_SUPPORTED, "DCGM_ST_NOT_SUPPORTED"),
            (status::UNINITIALIZED, "DCGM_ST_UNINITIALIZED"),
            (status::TIMEOUT, "DCGM_ST_TIMEOUT"),
            (status::VER_MISMATCH, "DCGM_ST_VER_MISMATCH"),
            (status::NO_DATA, "DCGM_ST_NO_DATA"),
            (status::STALE_DATA, "DCGM_ST_STALE_DATA"),
            (status::NOT_WATCHED, "DCGM_ST_NOT_WATCHED"),
            (status::NO_PERMISSION, "DCGM_ST_NO_PERMISSION"),
            (status::CONNECTION_NOT_VALID, "DCGM_ST_CONNECTION_NOT_VALID"),
            (status::MAX_LIMIT, "DCGM_ST_MAX_LIMIT"),
            (status::REQUIRES_ROOT, "DCGM_ST_REQUIRES_ROOT"),
            (status::MODULE_NOT_LOADED, "DCGM_ST_MODULE_NOT_LOADED"),
            (
                status::PROFILING_NOT_SUPPORTED,
                "DCGM_ST_PROFILING_NOT_SUPPORTED",
            ),
            (status::PROFILING_MULTI_PASS, "DCGM_ST_PROFILING_MULTI_PASS"),
            (-26, "DCGM_ST_DUPLICATE_KEY"),
            (-18, "DCGM_ST_GPU_IS_LOST"),
            (-58, "DCGM_ST_NVVS_NO_AVAILABLE_TEST"),
        ] {
            assert_eq!(status_name(code), name, "{code}");
        }
        let e = DcgmError::Call {
            call: "dcgmGroupCreate",
            code: -24,
        };
        assert_eq!(
            e.to_string(),
            "dcgmGroupCreate returned DCGM_ST_MAX_LIMIT (-24)"
        );
    }
}
