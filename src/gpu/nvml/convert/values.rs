//! NVML answers in DCGM's units and shapes: field values, memory, power, NVLink rates, GPM
//! metrics, vGPU licensing, MIG profile names, error mapping and the retry backoff.

use crate::catalog::Field;
use crate::gpu::{FieldError, Reading, Value};

use super::super::api::{ApiError, FieldNum, FieldValue, GpmMetric, GridLicensing, ValueType};
use super::ids::fi;
use super::plan::{MemoryPart, Unit};

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
/// [`Plan::NvlinkBandwidth`](super::Plan::NvlinkBandwidth) yields an intermediate KiB/s float
/// that every NVLink throughput field converts here.
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
            .map(|kibps| Value::Int(kib_per_s_to_mbps(kibps)))
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
pub fn memory_value(m: &super::super::api::MemoryInfo, part: MemoryPart) -> Value {
    match part {
        MemoryPart::Total => Value::Int(bytes_to_mib(m.total)),
        MemoryPart::Free => Value::Int(bytes_to_mib(m.free)),
        MemoryPart::Used => Value::Int(bytes_to_mib(m.used)),
        MemoryPart::Reserved => Value::Int(bytes_to_mib(m.reserved)),
        MemoryPart::TotalBytes => Value::Int(bytes_to_i64(m.total)),
        MemoryPart::FreeBytes => Value::Int(bytes_to_i64(m.free)),
        MemoryPart::UsedBytes => Value::Int(bytes_to_i64(m.used)),
        MemoryPart::ReservedBytes => Value::Int(bytes_to_i64(m.reserved)),
        // DCGM (`DcgmCacheManager::ReadAndCacheFBMemoryInfo`): used / (total - reserved), in
        // bytes, not in the truncated MiB it publishes; 0 when nothing is usable.
        MemoryPart::UsedRatio => match m.total.checked_sub(m.reserved) {
            Some(usable) if usable > 0 => Value::Float(m.used as f64 / usable as f64),
            _ => Value::Float(0.0),
        },
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
    kib_per_s_to_mbps(nvlink_rate_kib_per_s(prev, cur))
}

/// A KiB/s rate in DCGM's NVLink "MB/s" (÷ 1000), truncated as DCGM's integer arithmetic
/// truncates it (not rounded): 1999.9 KiB/s is 1.
pub fn kib_per_s_to_mbps(kib_per_s: f64) -> i64 {
    (kib_per_s / 1000.0).trunc() as i64
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
