//! Which NVML call serves each [`Field`]: the [`Plan`] per field, and the static facts read
//! once per discovery.

use crate::catalog::Field;

use super::super::api::{ClockKind, GpmMetric, InforomObject};
use super::ids::fi;

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
    /// a float, which [`in_field_unit`](super::in_field_unit) turns into the field's unit (MB/s
    /// or B/s).
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
    /// Read per NVLink by `nvml::nvlink`, not as a GPU-level reading.
    PerLink,
    /// Not available through NVML.
    Unavailable,
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
