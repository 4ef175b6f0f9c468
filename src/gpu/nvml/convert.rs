//! Pure translation between NVML and DCGM: which NVML call serves each [`Field`], the unit
//! conversions DCGM applies, the way DCGM reads the field values some drivers get wrong, and
//! the `NVML_FI_*` renumberings of ids 251–273.
//!
//! Nothing here calls NVML; every function is a plain function of its arguments.

use crate::catalog::Field;
use crate::gpu::{FieldError, Reading, Value};

use super::api::{
    ApiError, ClockKind, FieldNum, FieldValue, GpmMetric, GridLicensing, InforomObject, ValueType,
};

/// `NVML_FI_*` ids used here, V12 numbering (nvml-wrapper-sys 0.10 / CUDA ≤ 13.0).
pub mod fi {
    /// `NVML_FI_DEV_ECC_CURRENT`.
    pub const ECC_CURRENT: u32 = 1;
    /// `NVML_FI_DEV_ECC_DBE_AGG_CBU`: the last ECC counter id (29–31 are retired pages).
    pub const ECC_LAST: u32 = 28;
    /// `NVML_FI_DEV_ECC_SBE_VOL_TOTAL`.
    pub const ECC_SBE_VOL_TOTAL: u32 = 3;
    /// `NVML_FI_DEV_ECC_DBE_VOL_TOTAL`.
    pub const ECC_DBE_VOL_TOTAL: u32 = 4;
    /// `NVML_FI_DEV_ECC_SBE_AGG_TOTAL`.
    pub const ECC_SBE_AGG_TOTAL: u32 = 5;
    /// `NVML_FI_DEV_ECC_DBE_AGG_TOTAL`.
    pub const ECC_DBE_AGG_TOTAL: u32 = 6;
    /// `NVML_FI_DEV_RETIRED_SBE`.
    pub const RETIRED_SBE: u32 = 29;
    /// `NVML_FI_DEV_RETIRED_DBE`.
    pub const RETIRED_DBE: u32 = 30;
    /// `NVML_FI_DEV_RETIRED_PENDING`.
    pub const RETIRED_PENDING: u32 = 31;
    /// `NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL`.
    pub const NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: u32 = 38;
    /// `NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL`.
    pub const NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: u32 = 45;
    /// `NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL`.
    pub const NVLINK_REPLAY_ERROR_COUNT_TOTAL: u32 = 52;
    /// `NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL`.
    pub const NVLINK_RECOVERY_ERROR_COUNT_TOTAL: u32 = 59;
    /// `NVML_FI_DEV_PERF_POLICY_POWER` (ns).
    pub const PERF_POLICY_POWER: u32 = 74;
    /// `NVML_FI_DEV_PERF_POLICY_THERMAL` (ns).
    pub const PERF_POLICY_THERMAL: u32 = 75;
    /// `NVML_FI_DEV_PERF_POLICY_SYNC_BOOST` (ns).
    pub const PERF_POLICY_SYNC_BOOST: u32 = 76;
    /// `NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT` (ns).
    pub const PERF_POLICY_BOARD_LIMIT: u32 = 77;
    /// `NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION` (ns).
    pub const PERF_POLICY_LOW_UTILIZATION: u32 = 78;
    /// `NVML_FI_DEV_PERF_POLICY_RELIABILITY` (ns).
    pub const PERF_POLICY_RELIABILITY: u32 = 79;
    /// `NVML_FI_DEV_MEMORY_TEMP` (°C).
    pub const MEMORY_TEMP: u32 = 82;
    /// `NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (mJ).
    pub const TOTAL_ENERGY_CONSUMPTION: u32 = 83;
    /// `NVML_FI_DEV_PCIE_REPLAY_COUNTER`.
    pub const PCIE_REPLAY_COUNTER: u32 = 94;
    /// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` (KiB, cumulative; scope = link or all).
    pub const NVLINK_THROUGHPUT_DATA_TX: u32 = 138;
    /// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX` (KiB, cumulative).
    pub const NVLINK_THROUGHPUT_DATA_RX: u32 = 139;
    /// `NVML_FI_DEV_REMAPPED_COR`.
    pub const REMAPPED_COR: u32 = 142;
    /// `NVML_FI_DEV_REMAPPED_UNC`.
    pub const REMAPPED_UNC: u32 = 143;
    /// `NVML_FI_DEV_REMAPPED_PENDING`.
    pub const REMAPPED_PENDING: u32 = 144;
    /// `NVML_FI_DEV_REMAPPED_FAILURE`.
    pub const REMAPPED_FAILURE: u32 = 145;
    /// `NVML_FI_DEV_POWER_INSTANT` (mW).
    pub const POWER_INSTANT: u32 = 186;
    /// `NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN` (first id NVIDIA renumbered).
    pub const CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: u32 = 251;
}

/// `scopeId` meaning "summed over all links" for NVLink fields.
pub const ALL_LINKS: u32 = u32::MAX;

/// The `NVML_FI_*` numbering of ids 251–273 a driver uses. NVIDIA moved these ids twice; the
/// layouts below are those of the `nvml.h` shipped with each CUDA release (checked against
/// the headers of CUDA 12.6, 12.8, 12.9, 13.0, 13.0 Update 1 and later):
///
/// | driver | CUDA | 251–255 | 256–268 | 269–273 |
/// |---|---|---|---|---|
/// | < 570 | ≤ 12.6 | — | — | — |
/// | 570.x | 12.8 | power smoothing | power smoothing | — |
/// | 575.x – 580.81 | 12.9, 13.0 | clock events, power sync | power smoothing | power smoothing |
/// | ≥ 580.82 | 13.0 U1+ | power smoothing | power smoothing | clock events, power sync |
///
/// ("—": the id does not exist; `NVML_FI_MAX` was 230 in CUDA 12.6 and 269 in 12.8.)
/// [`fi`] and every id this crate requests use the 12.9 / 13.0 numbering ([`Self::V12`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldIdScheme {
    /// Drivers before R570: no field ids from 251 on.
    Before570,
    /// R570 (CUDA 12.8): the power-smoothing block at 251–268 (where CUDA 13.0 Update 1 put it
    /// again); the clock-event and power-sync fields do not exist yet.
    R570,
    /// R575 up to 580.81 (CUDA 12.9 and 13.0): clock events and power sync at 251–255, power
    /// smoothing at 256–273. The numbering of [`fi`].
    V12,
    /// Drivers 580.82 and later (CUDA 13.0 Update 1 on): power smoothing at 251–268, clock
    /// events and power sync at 269–273.
    V13Update1,
}

impl FieldIdScheme {
    /// The scheme of a driver version string such as `580.82.07`. An unparseable version is
    /// taken as the [`Self::V12`] numbering (ids below 251 are the same in all of them).
    pub fn for_driver(version: &str) -> Self {
        let mut parts = version.trim().split('.');
        let Some(major) = parts.next().and_then(|s| s.parse::<u32>().ok()) else {
            return Self::V12;
        };
        let minor: u32 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        match (major, minor) {
            (..570, _) => Self::Before570,
            (570..575, _) => Self::R570,
            (m, n) if (m, n) < (580, 82) => Self::V12,
            _ => Self::V13Update1,
        }
    }
}

/// A [`FieldIdScheme::V12`] field id in `scheme`'s numbering, or `None` where that driver has
/// no such field (it must not be requested: the id may mean another field there).
pub fn translate_field_id(scheme: FieldIdScheme, v12: u32) -> Option<u32> {
    match (scheme, v12) {
        (_, id @ ..=250) | (FieldIdScheme::V12, id) => Some(id),
        (FieldIdScheme::Before570, 251..=273) | (FieldIdScheme::R570, 251..=255) => None,
        (FieldIdScheme::R570 | FieldIdScheme::V13Update1, id @ 256..=273) => Some(id - 5),
        (FieldIdScheme::V13Update1, id @ 251..=255) => Some(id + 18),
        // Ids after 273 were added later, without moving.
        (_, id) => Some(id),
    }
}

/// The inverse of [`translate_field_id`]: a driver's id in V12 numbering.
pub fn field_id_to_v12(scheme: FieldIdScheme, id: u32) -> Option<u32> {
    match (scheme, id) {
        (_, id @ ..=250) | (FieldIdScheme::V12, id) => Some(id),
        (FieldIdScheme::Before570, 251..=273) | (FieldIdScheme::R570, 269..=273) => None,
        (FieldIdScheme::R570 | FieldIdScheme::V13Update1, id @ 251..=268) => Some(id + 5),
        (FieldIdScheme::V13Update1, id @ 269..=273) => Some(id - 18),
        (_, id) => Some(id),
    }
}

/// Static facts read once per discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaticFact {
    /// `nvmlSystemGetDriverVersion`.
    DriverVersion,
    /// `nvmlSystemGetNVMLVersion`.
    NvmlVersion,
    /// `nvmlSystemGetCudaDriverVersion_v2`.
    CudaDriverVersion,
    /// `nvmlDeviceGetName`.
    Name,
    /// `nvmlDeviceGetBrand`.
    Brand,
    /// `nvmlDeviceGetSerial`.
    Serial,
    /// `nvmlDeviceGetInforomVersion`.
    Inforom(InforomObject),
    /// `nvmlDeviceGetInforomImageVersion`.
    InforomImage,
    /// `nvmlDeviceGetVbiosVersion`.
    Vbios,
}

/// How NVML serves one field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Plan {
    /// Cached at discovery.
    Static(StaticFact),
    /// One entry of the batched field-values call; the value is converted with `unit`.
    FieldValue(u32, Unit),
    /// `NVLINK_THROUGHPUT_DATA_TX` + `_RX` with scope "all links", turned into a rate: KiB/s as
    /// a float, which [`in_field_unit`] turns into the field's unit (MB/s or B/s).
    NvlinkBandwidth,
    /// `nvmlDeviceGetMemoryInfo_v2`.
    Memory(MemoryPart),
    /// `nvmlDeviceGetUtilizationRates` (`true`: the GPU share, `false`: memory).
    Utilization(bool),
    /// `nvmlDeviceGetEncoderUtilization`.
    EncoderUtil,
    /// `nvmlDeviceGetDecoderUtilization`.
    DecoderUtil,
    /// `nvmlDeviceGetClockInfo`.
    Clock(ClockKind),
    /// `nvmlDeviceGetTemperature`.
    Temperature,
    /// `nvmlDeviceGetPowerUsage`.
    PowerUsage,
    /// `nvmlDeviceGetPowerManagementLimit`.
    PowerLimit,
    /// `nvmlDeviceGetEnforcedPowerLimit`.
    EnforcedPowerLimit,
    /// `nvmlDeviceGetPerformanceState`.
    Pstate,
    /// `nvmlDeviceGetFanSpeed_v2`.
    Fan,
    /// `nvmlDeviceGetCurrPcieLinkGeneration`.
    PcieLinkGen,
    /// `nvmlDeviceGetCurrPcieLinkWidth`.
    PcieLinkWidth,
    /// `nvmlDeviceGetCurrentClocksEventReasons`.
    ClocksEventReasons,
    /// `nvmlDeviceGetGridLicensableFeatures_v4` (vGPU guests).
    VgpuLicense,
    /// GPM metric over the interval since the previous tick.
    Gpm(GpmMetric),
    /// Produced by the exporter from events and history, not read per tick.
    Derived,
    /// Read per NVLink by [`super::nvlink`], not as a GPU-level reading.
    PerLink,
    /// Not available through NVML.
    Unavailable,
}

/// NVML's `NVML_GRID_LICENSE_FEATURE_CODE_VGPU`.
pub const GRID_LICENSE_FEATURE_CODE_VGPU: u32 = 1;

/// `DCGM_FI_DEV_VGPU_LICENSE_STATUS` from the licensable features, as DCGM's cache manager
/// computes it: 0 where vGPU licensing does not apply, else 1 if the vGPU feature's state is
/// non-zero (licensed) and 0 if it is zero; no value (absent) when NVML lists no vGPU feature.
pub fn vgpu_license_status(l: &GridLicensing) -> Result<Value, FieldError> {
    if !l.supported {
        return Ok(Value::Int(0));
    }
    l.features
        .iter()
        .find(|(code, _)| *code == GRID_LICENSE_FEATURE_CODE_VGPU)
        .map(|(_, state)| Value::Int(i64::from(*state > 0)))
        .ok_or(FieldError::NotSupported)
}

/// Which part of the memory info a field reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryPart {
    /// Total, MiB.
    Total,
    /// Free, MiB.
    Free,
    /// Used, MiB.
    Used,
    /// Reserved, MiB.
    Reserved,
    /// used / (total − reserved), 0–1.
    UsedRatio,
    /// Total, bytes.
    TotalBytes,
    /// Free, bytes.
    FreeBytes,
    /// Used, bytes.
    UsedBytes,
    /// Reserved, bytes.
    ReservedBytes,
}

/// The unit conversion of a field-values entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Kept as an integer.
    Same,
    /// mW → W.
    MilliwattsToWatts,
    /// mJ → whole J (truncated, as DCGM's INT64 joules field).
    MillijoulesToJoules,
}

/// How NVML serves `field`.
pub fn plan(field: Field) -> Plan {
    use Field as F;
    let fv = |id| Plan::FieldValue(id, Unit::Same);
    match field {
        F::DriverVersion => Plan::Static(StaticFact::DriverVersion),
        F::NvmlVersion => Plan::Static(StaticFact::NvmlVersion),
        F::CudaDriverVersion => Plan::Static(StaticFact::CudaDriverVersion),
        F::DevName => Plan::Static(StaticFact::Name),
        F::Brand => Plan::Static(StaticFact::Brand),
        F::Serial => Plan::Static(StaticFact::Serial),
        F::OemInforomVer => Plan::Static(StaticFact::Inforom(InforomObject::Oem)),
        F::EccInforomVer => Plan::Static(StaticFact::Inforom(InforomObject::Ecc)),
        F::PowerInforomVer => Plan::Static(StaticFact::Inforom(InforomObject::Power)),
        F::InforomImageVer => Plan::Static(StaticFact::InforomImage),
        F::VbiosVersion => Plan::Static(StaticFact::Vbios),
        F::SmClock | F::SmClockHertz => Plan::Clock(ClockKind::Sm),
        F::MemClock | F::MemoryClockHertz => Plan::Clock(ClockKind::Memory),
        F::VideoClock | F::VideoClockHertz => Plan::Clock(ClockKind::Video),
        F::ClocksEventReasons => Plan::ClocksEventReasons,
        F::VgpuLicenseStatus => Plan::VgpuLicense,
        F::MemoryTemp => fv(fi::MEMORY_TEMP),
        F::GpuTemp => Plan::Temperature,
        F::PowerUsage => Plan::PowerUsage,
        F::TotalEnergyConsumption => fv(fi::TOTAL_ENERGY_CONSUMPTION),
        F::GpuEnergyJoulesTotal => {
            Plan::FieldValue(fi::TOTAL_ENERGY_CONSUMPTION, Unit::MillijoulesToJoules)
        }
        F::PowerUsageInstant => Plan::FieldValue(fi::POWER_INSTANT, Unit::MilliwattsToWatts),
        F::PowerMgmtLimit => Plan::PowerLimit,
        F::EnforcedPowerLimit => Plan::EnforcedPowerLimit,
        F::Pstate => Plan::Pstate,
        F::FanSpeed | F::FanSpeedRatio => Plan::Fan,
        F::PcieReplayCounter => fv(fi::PCIE_REPLAY_COUNTER),
        F::GpuUtil | F::GpuUtilRatio => Plan::Utilization(true),
        F::MemCopyUtil | F::MemoryUtilRatio => Plan::Utilization(false),
        F::EncUtil | F::EncUtilRatio => Plan::EncoderUtil,
        F::DecUtil | F::DecUtilRatio => Plan::DecoderUtil,
        F::PcieLinkGen => Plan::PcieLinkGen,
        F::PcieLinkWidth => Plan::PcieLinkWidth,
        F::PowerViolation => fv(fi::PERF_POLICY_POWER),
        F::ThermalViolation => fv(fi::PERF_POLICY_THERMAL),
        F::SyncBoostViolation => fv(fi::PERF_POLICY_SYNC_BOOST),
        F::BoardLimitViolation => fv(fi::PERF_POLICY_BOARD_LIMIT),
        F::LowUtilViolation => fv(fi::PERF_POLICY_LOW_UTILIZATION),
        F::ReliabilityViolation => fv(fi::PERF_POLICY_RELIABILITY),
        F::FbTotal => Plan::Memory(MemoryPart::Total),
        F::FbFree => Plan::Memory(MemoryPart::Free),
        F::FbUsed => Plan::Memory(MemoryPart::Used),
        F::FbReserved => Plan::Memory(MemoryPart::Reserved),
        F::FbUsedPercent => Plan::Memory(MemoryPart::UsedRatio),
        F::FbCapacityBytes => Plan::Memory(MemoryPart::TotalBytes),
        F::FbFreeBytes => Plan::Memory(MemoryPart::FreeBytes),
        F::FbUsedBytes => Plan::Memory(MemoryPart::UsedBytes),
        F::FbReservedBytes => Plan::Memory(MemoryPart::ReservedBytes),
        F::EccCurrent => fv(fi::ECC_CURRENT),
        F::EccSbeVolTotal => fv(fi::ECC_SBE_VOL_TOTAL),
        F::EccDbeVolTotal => fv(fi::ECC_DBE_VOL_TOTAL),
        F::EccSbeAggTotal => fv(fi::ECC_SBE_AGG_TOTAL),
        F::EccDbeAggTotal => fv(fi::ECC_DBE_AGG_TOTAL),
        F::RetiredSbe => fv(fi::RETIRED_SBE),
        F::RetiredDbe => fv(fi::RETIRED_DBE),
        F::RetiredPending => fv(fi::RETIRED_PENDING),
        F::UncorrectableRemappedRows => fv(fi::REMAPPED_UNC),
        F::CorrectableRemappedRows => fv(fi::REMAPPED_COR),
        F::RowRemapFailure => fv(fi::REMAPPED_FAILURE),
        F::RowRemapPending => fv(fi::REMAPPED_PENDING),
        F::NvlinkCrcFlitErrorCountTotal => fv(fi::NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
        F::NvlinkCrcDataErrorCountTotal => fv(fi::NVLINK_CRC_DATA_ERROR_COUNT_TOTAL),
        F::NvlinkReplayErrorCountTotal => fv(fi::NVLINK_REPLAY_ERROR_COUNT_TOTAL),
        F::NvlinkRecoveryErrorCountTotal => fv(fi::NVLINK_RECOVERY_ERROR_COUNT_TOTAL),
        F::NvlinkBandwidthTotal | F::NvlinkThroughputBytesPerSecond => Plan::NvlinkBandwidth,
        F::NvlinkCrcFlitErrorPerLinkTotal
        | F::NvlinkCrcDataErrorPerLinkTotal
        | F::NvlinkReplayErrorPerLinkTotal
        | F::NvlinkRecoveryErrorPerLinkTotal
        | F::NvlinkThroughputPerLink
        | F::NvlinkTxThroughputPerLink
        | F::NvlinkRxThroughputPerLink => Plan::PerLink,
        F::ProfGrEngineActive => Plan::Gpm(GpmMetric::GraphicsUtil),
        F::ProfSmActive => Plan::Gpm(GpmMetric::SmUtil),
        F::ProfSmOccupancy => Plan::Gpm(GpmMetric::SmOccupancy),
        F::ProfPipeTensorActive => Plan::Gpm(GpmMetric::AnyTensorUtil),
        F::ProfDramActive => Plan::Gpm(GpmMetric::DramBwUtil),
        F::ProfPipeFp64Active => Plan::Gpm(GpmMetric::Fp64Util),
        F::ProfPipeFp32Active => Plan::Gpm(GpmMetric::Fp32Util),
        F::ProfPipeFp16Active => Plan::Gpm(GpmMetric::Fp16Util),
        F::ProfPcieTxBytes => Plan::Gpm(GpmMetric::PcieTxPerSec),
        F::ProfPcieRxBytes => Plan::Gpm(GpmMetric::PcieRxPerSec),
        F::ProfNvlinkTxBytes => Plan::Gpm(GpmMetric::NvlinkTotalTxPerSec),
        F::ProfNvlinkRxBytes => Plan::Gpm(GpmMetric::NvlinkTotalRxPerSec),
        F::XidErrors | F::ExpClockEventsCount | F::ExpXidErrorsCount | F::ExpGpuHealthStatus => {
            Plan::Derived
        }
        F::ExpP2pStatus => Plan::Unavailable,
    }
}

/// The [`FieldError`] an NVML call error becomes (`GpuLost` is handled before this, for the
/// whole device).
pub fn field_error(e: &ApiError) -> FieldError {
    match e {
        ApiError::NotSupported | ApiError::NotFound => FieldError::NotSupported,
        ApiError::NoPermission => FieldError::NoPermission,
        ApiError::GpuLost | ApiError::Timeout | ApiError::InvalidArgument | ApiError::Other(_) => {
            FieldError::Failed
        }
    }
}

/// DCGM's text for an `nvmlBrandType_t` (`DCGM_FI_DEV_BRAND`): the strings DCGM's cache
/// manager writes (taken by DCGM from nvidia-smi), "Unknown" for anything else.
pub fn brand_name(brand: u32) -> &'static str {
    match brand {
        1 => "Quadro",
        2 => "Tesla",
        3 => "NVS",
        4 => "Grid",
        5 => "GeForce",
        6 => "Titan",
        7 => "NVIDIA Virtual Applications",
        8 => "NVIDIA Virtual PC",
        9 => "NVIDIA Virtual Compute Server",
        10 => "NVIDIA RTX Virtual Workstation",
        11 => "NVIDIA vGaming",
        12 => "Quadro RTX",
        13 => "NVIDIA RTX",
        14 => "NVIDIA",
        15 => "GeForce RTX",
        16 => "Titan RTX",
        _ => "Unknown",
    }
}

/// A GPU-level reading, as the NVML call that serves `field` returned it, in `field`'s own
/// unit. Several fields share one call and differ only in unit: the classic ones keep DCGM's
/// classic units (MHz, %, MB/s), the DCGM 4.7 base-unit ones get theirs (Hz, 0–1, B/s).
/// [`Plan::NvlinkBandwidth`] yields an intermediate KiB/s float that every NVLink throughput
/// field converts here.
pub fn in_field_unit(field: Field, reading: Reading) -> Reading {
    use Field as F;
    let v = reading?;
    let num = |v: &Value| match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        Value::Text(_) => None,
    };
    match field {
        F::SmClockHertz | F::MemoryClockHertz | F::VideoClockHertz => match v {
            Value::Int(mhz) => mhz
                .checked_mul(1_000_000)
                .map(Value::Int)
                .ok_or(FieldError::Invalid),
            _ => Err(FieldError::Invalid),
        },
        F::GpuUtilRatio
        | F::MemoryUtilRatio
        | F::EncUtilRatio
        | F::DecUtilRatio
        | F::FanSpeedRatio => num(&v)
            .map(|pct| Value::Float(pct / 100.0))
            .ok_or(FieldError::Invalid),
        F::NvlinkBandwidthTotal => num(&v)
            .map(|kibps| Value::Int((kibps / 1000.0).round() as i64))
            .ok_or(FieldError::Invalid),
        F::NvlinkThroughputBytesPerSecond => num(&v)
            .map(|kibps| Value::Int((kibps * 1024.0).round() as i64))
            .ok_or(FieldError::Invalid),
        _ => Ok(v),
    }
}

/// Framebuffer bytes → MiB, truncated, as DCGM reports `DCGM_FI_DEV_FB_*`.
pub fn bytes_to_mib(bytes: u64) -> i64 {
    i64::try_from(bytes / 1_048_576).unwrap_or(i64::MAX)
}

fn bytes_to_i64(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// A memory-info part in DCGM's unit.
pub fn memory_value(m: &super::api::MemoryInfo, part: MemoryPart) -> Value {
    match part {
        MemoryPart::Total => Value::Int(bytes_to_mib(m.total)),
        MemoryPart::Free => Value::Int(bytes_to_mib(m.free)),
        MemoryPart::Used => Value::Int(bytes_to_mib(m.used)),
        MemoryPart::Reserved => Value::Int(bytes_to_mib(m.reserved)),
        MemoryPart::TotalBytes => Value::Int(bytes_to_i64(m.total)),
        MemoryPart::FreeBytes => Value::Int(bytes_to_i64(m.free)),
        MemoryPart::UsedBytes => Value::Int(bytes_to_i64(m.used)),
        MemoryPart::ReservedBytes => Value::Int(bytes_to_i64(m.reserved)),
        MemoryPart::UsedRatio => {
            let usable = bytes_to_mib(m.total) - bytes_to_mib(m.reserved);
            if usable <= 0 {
                Value::Float(0.0)
            } else {
                Value::Float(bytes_to_mib(m.used) as f64 / usable as f64)
            }
        }
    }
}

/// Milliwatts → watts (`DCGM_FI_DEV_POWER_USAGE` = `nvmlDeviceGetPowerUsage` / 1000).
pub fn milliwatts_to_watts(mw: u64) -> f64 {
    mw as f64 / 1000.0
}

/// Memory temperatures above this are not readings (DCGM rejects them).
pub const MAX_MEMORY_TEMP_C: u32 = 200;

/// A field-values entry of field `id` in DCGM's unit, read as DCGM reads it:
///
/// - `MEMORY_TEMP` and `POWER_INSTANT`: the union's `uiVal`, whatever `valueType` says. Some
///   drivers label them `DOUBLE` but store an unsigned int (NVIDIA bug 4300930, r545); read as
///   a double that is a denormal near 0. A memory temperature above 200 °C is rejected.
/// - ECC fields (ids 1–28) whose `valueType` NVML left unset (NVML bug 2032468):
///   `UNSIGNED_LONG_LONG`, as DCGM forces.
/// - everything else: as its `valueType` says.
///
/// # Errors
/// [`FieldError::Invalid`] for a value that does not fit (a negative count, NaN, an unset or
/// unknown type).
pub fn field_value(id: u32, v: FieldValue, unit: Unit) -> Result<Value, FieldError> {
    let n = match id {
        fi::MEMORY_TEMP => {
            let t = v.ui_val();
            return if t > MAX_MEMORY_TEMP_C {
                Err(FieldError::Invalid)
            } else {
                Ok(Value::Int(i64::from(t)))
            };
        }
        fi::POWER_INSTANT => FieldNum::Unsigned(u64::from(v.ui_val())),
        fi::ECC_CURRENT..=fi::ECC_LAST if v.value_type == ValueType::Unset => {
            FieldNum::Unsigned(v.ull_val())
        }
        _ => v.typed().ok_or(FieldError::Invalid)?,
    };
    match unit {
        Unit::Same => match n {
            FieldNum::Unsigned(u) => i64::try_from(u)
                .map(Value::Int)
                .map_err(|_| FieldError::Invalid),
            FieldNum::Signed(i) => Ok(Value::Int(i)),
            FieldNum::Float(f) if f.is_finite() => Ok(Value::Float(f)),
            FieldNum::Float(_) => Err(FieldError::Invalid),
        },
        Unit::MillijoulesToJoules => match n {
            FieldNum::Unsigned(u) => i64::try_from(u / 1000)
                .map(Value::Int)
                .map_err(|_| FieldError::Invalid),
            FieldNum::Signed(i) if i >= 0 => Ok(Value::Int(i / 1000)),
            FieldNum::Float(f) if f.is_finite() && f >= 0.0 => {
                Ok(Value::Int((f / 1000.0).trunc() as i64))
            }
            _ => Err(FieldError::Invalid),
        },
        Unit::MilliwattsToWatts => match n {
            FieldNum::Unsigned(u) => Ok(Value::Float(milliwatts_to_watts(u))),
            FieldNum::Signed(i) if i >= 0 => Ok(Value::Float(milliwatts_to_watts(i as u64))),
            FieldNum::Float(f) if f.is_finite() && f >= 0.0 => Ok(Value::Float(f / 1000.0)),
            _ => Err(FieldError::Invalid),
        },
    }
}

/// A field-values entry as an unsigned counter (for the NVLink throughput sums).
pub fn as_counter(v: FieldValue) -> Option<u64> {
    match v.typed()? {
        FieldNum::Unsigned(u) => Some(u),
        FieldNum::Signed(i) => u64::try_from(i).ok(),
        FieldNum::Float(f) if f.is_finite() && f >= 0.0 => Some(f as u64),
        FieldNum::Float(_) => None,
    }
}

/// One reading of the NVLink TX+RX throughput counters: KiB summed over all links and both
/// directions, and the driver's timestamp of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvlinkCounter {
    /// TX + RX, KiB.
    pub kib: u64,
    /// Driver timestamp, µs.
    pub timestamp_us: i64,
}

/// The NVLink throughput rate as DCGM computes it: the increase of the summed TX+RX KiB
/// counters over the interval, per second (KiB/s). The first reading (no previous one), a
/// counter reset and a non-advancing clock give 0, as in DCGM. DCGM reports it as
/// `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` ÷ 1000 (≈ MB/s) and as
/// `DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND` × 1024 (B/s).
pub fn nvlink_rate_kib_per_s(prev: Option<NvlinkCounter>, cur: NvlinkCounter) -> f64 {
    let Some(prev) = prev else { return 0.0 };
    let dt_us = cur.timestamp_us - prev.timestamp_us;
    if dt_us <= 0 || cur.kib < prev.kib {
        return 0.0;
    }
    (cur.kib - prev.kib) as f64 / (dt_us as f64 / 1e6)
}

/// `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` (and the per-link MB/s fields): the rate ÷ 1000.
pub fn nvlink_bandwidth_mbps(prev: Option<NvlinkCounter>, cur: NvlinkCounter) -> i64 {
    (nvlink_rate_kib_per_s(prev, cur) / 1000.0).round() as i64
}

/// A GPM metric in DCGM's unit: utilisations 0–100 % → 0–1 ratios (DCGM divides by 100),
/// PCIe/NVLink MiB/s → whole bytes/s (DCGM multiplies by 1048576 and truncates).
///
/// # Errors
/// [`FieldError::Invalid`] for a negative or non-finite value.
pub fn gpm_value(metric: GpmMetric, raw: f64) -> Result<Value, FieldError> {
    if !raw.is_finite() || raw < 0.0 {
        return Err(FieldError::Invalid);
    }
    Ok(Value::Float(match metric {
        GpmMetric::PcieTxPerSec
        | GpmMetric::PcieRxPerSec
        | GpmMetric::NvlinkTotalTxPerSec
        // DCGM truncates: `(long long)(value * 1024.0 * 1024.0)`.
        | GpmMetric::NvlinkTotalRxPerSec => (raw * 1_048_576.0).trunc(),
        _ => (raw / 100.0).min(1.0),
    }))
}

/// A GPU instance profile named as DCGM names it, and so as dcgm-exporter prints
/// `GPU_I_PROFILE`: `{slices}g.{ceil(memory MiB / 1024)}gb`. NVML's own names carry suffixes
/// (`1g.10gb+me`, `1g.24gb+gfx`) and round differently on some boards (an H100 NVL `1g.12gb`
/// has 11008 MiB, which DCGM calls `1g.11gb`); DCGM never uses them.
pub fn dcgm_profile_name(slices: u32, memory_mib: u64) -> String {
    format!("{slices}g.{}gb", memory_mib.div_ceil(1024))
}

/// The profile part of a MIG device's name (`NVIDIA A100-SXM4-40GB MIG 3g.20gb+me` →
/// `3g.20gb`): the last resort when NVML gives neither the profile nor the device attributes.
/// The name's rounding is NVML's, which DCGM's rule may not match.
pub fn profile_from_device_name(name: &str) -> String {
    let p = name.rfind("MIG ").map_or(name, |at| &name[at + 4..]).trim();
    match p.find("gb") {
        Some(end) => p[..end + 2].to_owned(),
        None => p.to_owned(),
    }
}

/// The delay before the next NVML initialisation attempt: `initial` after the first failure,
/// doubling after each further one, at most `max`.
pub fn next_backoff(
    previous: Option<std::time::Duration>,
    initial: std::time::Duration,
    max: std::time::Duration,
) -> std::time::Duration {
    match previous {
        None => initial.min(max),
        Some(p) => p.saturating_mul(2).min(max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn driver_versions_pick_the_field_id_scheme() {
        use FieldIdScheme::*;
        for (version, scheme) in [
            ("535.230.02", Before570),
            ("560.35.03", Before570),
            ("570.86.10", R570),
            ("570.172.08", R570),
            ("575.51.03", V12),
            ("580.65.06", V12),
            ("580.81", V12),
            ("580.82.07", V13Update1),
            ("580.95.05", V13Update1),
            ("590.10", V13Update1),
            ("garbage", V12),
        ] {
            assert_eq!(FieldIdScheme::for_driver(version), scheme, "{version}");
        }
    }

    #[test]
    fn r570_has_power_smoothing_where_cuda_13_0_update_1_put_it_again() {
        let s = FieldIdScheme::R570;
        // V12 256 (PWR_SMOOTHING_ENABLED) is 251 on R570 (CUDA 12.8's nvml.h).
        assert_eq!(translate_field_id(s, 256), Some(251));
        assert_eq!(translate_field_id(s, 273), Some(268));
        // The clock-event fields do not exist on R570: 251 there is PWR_SMOOTHING_ENABLED.
        assert_eq!(
            translate_field_id(s, fi::CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN),
            None
        );
        assert_eq!(translate_field_id(s, 255), None);
        assert_eq!(field_id_to_v12(s, 251), Some(256));
        assert_eq!(field_id_to_v12(s, 269), None);
        // Before R570 none of 251-273 exists.
        for id in 251..=273 {
            assert_eq!(
                translate_field_id(FieldIdScheme::Before570, id),
                None,
                "{id}"
            );
        }
    }

    #[test]
    fn renumbered_block_moves_and_the_rest_stays() {
        let s = FieldIdScheme::V13Update1;
        assert_eq!(
            translate_field_id(s, fi::CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN),
            Some(269)
        );
        assert_eq!(translate_field_id(s, 253), Some(271));
        assert_eq!(translate_field_id(s, 255), Some(273));
        assert_eq!(translate_field_id(s, 256), Some(251));
        assert_eq!(translate_field_id(s, 273), Some(268));
        for scheme in [
            FieldIdScheme::Before570,
            FieldIdScheme::R570,
            FieldIdScheme::V12,
            s,
        ] {
            for id in [
                fi::MEMORY_TEMP,
                fi::POWER_INSTANT,
                fi::NVLINK_THROUGHPUT_DATA_RX,
                250,
                274,
            ] {
                assert_eq!(translate_field_id(scheme, id), Some(id), "{scheme:?} {id}");
            }
            for id in 0..300 {
                if let Some(t) = translate_field_id(scheme, id) {
                    assert_eq!(field_id_to_v12(scheme, t), Some(id), "{scheme:?} {id}");
                }
            }
        }
        // The translation is a permutation of 251..=273.
        let mut moved: Vec<u32> = (251..=273)
            .filter_map(|id| translate_field_id(s, id))
            .collect();
        moved.sort_unstable();
        assert_eq!(moved, (251..=273).collect::<Vec<_>>());
    }

    #[test]
    fn newer_fields_share_the_call_and_get_their_own_unit() {
        assert_eq!(plan(Field::SmClockHertz), plan(Field::SmClock));
        assert_eq!(plan(Field::GpuUtilRatio), plan(Field::GpuUtil));
        assert_eq!(
            plan(Field::NvlinkThroughputBytesPerSecond),
            plan(Field::NvlinkBandwidthTotal)
        );
        assert_eq!(plan(Field::NvlinkReplayErrorPerLinkTotal), Plan::PerLink);
        let ok = |v| Ok(v);
        assert_eq!(
            in_field_unit(Field::SmClockHertz, ok(Value::Int(1980))),
            Ok(Value::Int(1_980_000_000))
        );
        assert_eq!(
            in_field_unit(Field::SmClock, ok(Value::Int(1980))),
            Ok(Value::Int(1980))
        );
        assert_eq!(
            in_field_unit(Field::GpuUtilRatio, ok(Value::Int(69))),
            Ok(Value::Float(0.69))
        );
        assert_eq!(
            in_field_unit(Field::GpuUtil, ok(Value::Int(69))),
            Ok(Value::Int(69))
        );
        assert_eq!(
            in_field_unit(Field::FanSpeedRatio, ok(Value::Int(105))),
            Ok(Value::Float(1.05))
        );
        // 1 000 000 KiB/s: 1000 "MB/s" as DCGM divides by 1000, 1 024 000 000 B/s.
        assert_eq!(
            in_field_unit(Field::NvlinkBandwidthTotal, ok(Value::Float(1e6))),
            Ok(Value::Int(1000))
        );
        assert_eq!(
            in_field_unit(Field::NvlinkThroughputBytesPerSecond, ok(Value::Float(1e6))),
            Ok(Value::Int(1_024_000_000))
        );
        assert_eq!(
            in_field_unit(Field::GpuUtilRatio, Err(FieldError::NoPermission)),
            Err(FieldError::NoPermission)
        );
        assert_eq!(
            field_value(
                fi::TOTAL_ENERGY_CONSUMPTION,
                FieldValue::from(FieldNum::Unsigned(987_654)),
                Unit::MillijoulesToJoules
            ),
            Ok(Value::Int(987))
        );
        let m = super::super::api::MemoryInfo {
            total: 80 * 1_073_741_824,
            reserved: 512 * 1_048_576,
            used: 3_000_000_123,
            free: 1,
        };
        assert_eq!(
            memory_value(&m, MemoryPart::UsedBytes),
            Value::Int(3_000_000_123)
        );
        assert_eq!(memory_value(&m, MemoryPart::Used), Value::Int(2861));
        assert_eq!(
            memory_value(&m, MemoryPart::TotalBytes),
            Value::Int(85_899_345_920)
        );
    }

    #[test]
    fn every_collected_field_has_a_plan_except_p2p() {
        for &f in Field::ALL {
            let p = plan(f);
            assert_eq!(
                p == Plan::Unavailable,
                f == Field::ExpP2pStatus,
                "{f:?} -> {p:?}"
            );
            if (f.is_exporter() && f != Field::ExpP2pStatus) || f == Field::XidErrors {
                assert_eq!(p, Plan::Derived, "{f:?}");
            }
        }
        assert_eq!(plan(Field::MemoryTemp), Plan::FieldValue(82, Unit::Same));
        assert_eq!(
            plan(Field::ProfPipeTensorActive),
            Plan::Gpm(GpmMetric::AnyTensorUtil)
        );
    }

    #[test]
    fn framebuffer_is_integer_mib_and_ratio_excludes_reserved() {
        assert_eq!(bytes_to_mib(0), 0);
        assert_eq!(bytes_to_mib(1_048_575), 0);
        assert_eq!(bytes_to_mib(1_048_576), 1);
        assert_eq!(bytes_to_mib(42_949_672_960), 40_960);
        let m = super::super::api::MemoryInfo {
            total: 1024 * 1_048_576,
            reserved: 24 * 1_048_576,
            used: 250 * 1_048_576 + 5,
            free: 750 * 1_048_576,
        };
        assert_eq!(memory_value(&m, MemoryPart::Used), Value::Int(250));
        assert_eq!(memory_value(&m, MemoryPart::Reserved), Value::Int(24));
        assert_eq!(memory_value(&m, MemoryPart::UsedRatio), Value::Float(0.25));
    }

    fn v(n: FieldNum) -> FieldValue {
        FieldValue::from(n)
    }

    /// An entry whose union holds `uiVal = n` (the other bytes zero) under `value_type`.
    fn ui(value_type: ValueType, n: u32) -> FieldValue {
        let mut raw = [0u8; 8];
        raw[..4].copy_from_slice(&n.to_ne_bytes());
        FieldValue { value_type, raw }
    }

    #[test]
    fn field_values_convert_to_dcgm_units() {
        let energy = fi::TOTAL_ENERGY_CONSUMPTION;
        assert_eq!(
            field_value(
                fi::POWER_INSTANT,
                ui(ValueType::UnsignedInt, 302_206),
                Unit::MilliwattsToWatts
            ),
            Ok(Value::Float(302.206))
        );
        assert_eq!(
            field_value(energy, v(FieldNum::Unsigned(123_456_789)), Unit::Same),
            Ok(Value::Int(123_456_789))
        );
        assert_eq!(
            field_value(energy, v(FieldNum::Unsigned(u64::MAX)), Unit::Same),
            Err(FieldError::Invalid)
        );
        assert_eq!(
            field_value(energy, v(FieldNum::Signed(-1)), Unit::MilliwattsToWatts),
            Err(FieldError::Invalid)
        );
        assert_eq!(
            field_value(energy, ui(ValueType::UnsignedInt, 7), Unit::Same),
            Ok(Value::Int(7))
        );
        assert_eq!(milliwatts_to_watts(700_000), 700.0);
    }

    #[test]
    fn memory_temperature_and_instant_power_are_read_from_uival_whatever_the_type() {
        // NVIDIA bug 4300930: labelled DOUBLE, stored in uiVal. As a double it is ~3.5e-322.
        let mislabelled = ui(ValueType::Double, 71);
        assert!(matches!(mislabelled.typed(), Some(FieldNum::Float(f)) if f < 1e-300));
        assert_eq!(
            field_value(fi::MEMORY_TEMP, mislabelled, Unit::Same),
            Ok(Value::Int(71))
        );
        assert_eq!(
            field_value(fi::MEMORY_TEMP, ui(ValueType::UnsignedInt, 71), Unit::Same),
            Ok(Value::Int(71))
        );
        assert_eq!(
            field_value(fi::MEMORY_TEMP, ui(ValueType::UnsignedInt, 201), Unit::Same),
            Err(FieldError::Invalid)
        );
        assert_eq!(
            field_value(
                fi::POWER_INSTANT,
                ui(ValueType::Double, 350_123),
                Unit::MilliwattsToWatts
            ),
            Ok(Value::Float(350.123))
        );
    }

    #[test]
    fn ecc_fields_without_a_value_type_are_unsigned_long_long() {
        // NVML bug 2032468: success and a value, but valueType not set.
        let unset = FieldValue {
            value_type: ValueType::Unset,
            raw: 8u64.to_ne_bytes(),
        };
        assert_eq!(
            field_value(fi::ECC_SBE_AGG_TOTAL, unset, Unit::Same),
            Ok(Value::Int(8))
        );
        // Outside the ECC ids an unset type is not guessed.
        assert_eq!(
            field_value(fi::RETIRED_SBE, unset, Unit::Same),
            Err(FieldError::Invalid)
        );
        assert_eq!(
            field_value(fi::PCIE_REPLAY_COUNTER, unset, Unit::Same),
            Err(FieldError::Invalid)
        );
    }

    #[test]
    fn nvlink_bandwidth_is_a_rate_over_the_interval() {
        let at = |kib, s: i64| NvlinkCounter {
            kib,
            timestamp_us: s * 1_000_000,
        };
        assert_eq!(nvlink_bandwidth_mbps(None, at(5_000, 10)), 0);
        // 30 000 000 KiB over 30 s = 1 000 000 KiB/s = 1000 "MB/s" as DCGM divides by 1000.
        assert_eq!(
            nvlink_bandwidth_mbps(Some(at(0, 0)), at(30_000_000, 30)),
            1000
        );
        assert_eq!(nvlink_bandwidth_mbps(Some(at(10, 5)), at(5, 6)), 0);
        assert_eq!(nvlink_bandwidth_mbps(Some(at(10, 5)), at(20, 5)), 0);
    }

    #[test]
    fn gpm_percentages_become_ratios_and_mib_become_bytes() {
        assert_eq!(gpm_value(GpmMetric::SmUtil, 87.5), Ok(Value::Float(0.875)));
        assert_eq!(gpm_value(GpmMetric::Fp16Util, 100.4), Ok(Value::Float(1.0)));
        assert_eq!(
            gpm_value(GpmMetric::PcieRxPerSec, 2.0),
            Ok(Value::Float(2_097_152.0))
        );
        assert_eq!(
            gpm_value(GpmMetric::NvlinkTotalTxPerSec, 0.5),
            Ok(Value::Float(524_288.0))
        );
        // 1.0000009 MiB/s is 1048576.94 B/s: DCGM truncates to 1048576.
        assert_eq!(
            gpm_value(GpmMetric::PcieTxPerSec, 1.000_000_9),
            Ok(Value::Float(1_048_576.0))
        );
        assert_eq!(
            gpm_value(GpmMetric::DramBwUtil, f64::NAN),
            Err(FieldError::Invalid)
        );
    }

    #[test]
    fn profile_names_follow_dcgm() {
        assert_eq!(dcgm_profile_name(3, 40_448), "3g.40gb");
        assert_eq!(dcgm_profile_name(1, 9_856), "1g.10gb");
        assert_eq!(dcgm_profile_name(7, 81_920), "7g.80gb");
        // H100 NVL: NVML says 1g.12gb; DCGM (and dcgm-exporter) 1g.11gb.
        assert_eq!(dcgm_profile_name(1, 11_008), "1g.11gb");
        assert_eq!(
            profile_from_device_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me"),
            "1g.10gb"
        );
        assert_eq!(
            profile_from_device_name("NVIDIA B200 MIG 1g.23gb-me"),
            "1g.23gb"
        );
        assert_eq!(profile_from_device_name("MIG 3g.40gb"), "3g.40gb");
        assert_eq!(profile_from_device_name("MIG 7g.80gb"), "7g.80gb");
    }

    #[test]
    fn brands_are_dcgms_strings() {
        assert_eq!(brand_name(14), "NVIDIA");
        assert_eq!(brand_name(2), "Tesla");
        assert_eq!(brand_name(10), "NVIDIA RTX Virtual Workstation");
        assert_eq!(brand_name(11), "NVIDIA vGaming");
        assert_eq!(brand_name(0), "Unknown");
        assert_eq!(brand_name(99), "Unknown");
    }

    #[test]
    fn backoff_doubles_to_the_cap() {
        let (i, m) = (Duration::from_secs(1), Duration::from_secs(60));
        let mut d = None;
        let mut seen = Vec::new();
        for _ in 0..8 {
            let n = next_backoff(d, i, m);
            seen.push(n.as_secs());
            d = Some(n);
        }
        assert_eq!(seen, vec![1, 2, 4, 8, 16, 32, 60, 60]);
    }

    #[test]
    fn call_errors_map_to_field_errors() {
        assert_eq!(
            field_error(&ApiError::NotSupported),
            FieldError::NotSupported
        );
        assert_eq!(
            field_error(&ApiError::NoPermission),
            FieldError::NoPermission
        );
        assert_eq!(
            field_error(&ApiError::Other("x".into())),
            FieldError::Failed
        );
    }
}
