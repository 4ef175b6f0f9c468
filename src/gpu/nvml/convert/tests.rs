//! Tests of the NVML-to-DCGM translation.

use super::*;
use crate::catalog::Field;
use crate::gpu::nvml::api::{ApiError, FieldNum, FieldValue, GpmMetric, ValueType};
use crate::gpu::{FieldError, Value};
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
    assert_eq!(
        memory_value(&m, MemoryPart::UsedRatio),
        Value::Float((250.0 * 1_048_576.0 + 5.0) / (1000.0 * 1_048_576.0))
    );
}

#[test]
fn used_ratio_is_computed_in_bytes_as_dcgm_does() {
    // DCGM: used / (total - reserved) in bytes. From the truncated MiB (5 / 10) it was 0.5.
    let m = super::super::api::MemoryInfo {
        total: 11 * 1_048_576 - 1,
        reserved: 0,
        used: 6 * 1_048_576 - 1,
        free: 5 * 1_048_576,
    };
    assert_eq!(memory_value(&m, MemoryPart::Used), Value::Int(5));
    assert_eq!(memory_value(&m, MemoryPart::Total), Value::Int(10));
    assert_eq!(
        memory_value(&m, MemoryPart::UsedRatio),
        Value::Float((6.0 * 1_048_576.0 - 1.0) / (11.0 * 1_048_576.0 - 1.0))
    );
    // Nothing usable (reserved >= total): 0, not a division by zero or an underflow.
    for reserved in [11 * 1_048_576 - 1, 12 * 1_048_576] {
        let m = super::super::api::MemoryInfo { reserved, ..m };
        assert_eq!(memory_value(&m, MemoryPart::UsedRatio), Value::Float(0.0));
    }
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
fn nvlink_bandwidth_truncates_as_dcgm_does() {
    let at = |kib, s: i64| NvlinkCounter {
        kib,
        timestamp_us: s * 1_000_000,
    };
    // 59 999 KiB over 30 s = 1999.97 KiB/s: DCGM's 1 "MB/s", not 2 (issue 35 item 11).
    assert_eq!(nvlink_bandwidth_mbps(Some(at(0, 0)), at(59_999, 30)), 1);
    assert_eq!(kib_per_s_to_mbps(999.999), 0);
    assert_eq!(
        in_field_unit(Field::NvlinkBandwidthTotal, Ok(Value::Float(1999.9))),
        Ok(Value::Int(1))
    );
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
