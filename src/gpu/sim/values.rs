//! What one sample of a simulated GPU reads: utilization, power, temperature, clocks, memory,
//! error counters, MIG instances and NVLinks, consistent with each other.

use super::profiles::mig_memory_mib;
use super::seeded::hash;
use super::{GpuState, LastTick, SimulatedSource};
use crate::catalog::field::MigScope;
use crate::catalog::Field;
use crate::gpu::{
    Device, DeviceSample, FieldError, InstanceSample, LinkSample, MigInstance, Reading, Value,
};

impl SimulatedSource {
    /// Baseline utilization of GPU `index` at simulated time `t` (seconds).
    fn base_utilization(&self, index: u32, t: f64) -> f64 {
        let h = |c| hash(self.seed, index, 0, c);
        // One GPU in five idles (allocated but unused); the rest run a slow wave plus jitter.
        if h(10) < 0.2 {
            return (h(11) * 2.0).floor();
        }
        let level = 45.0 + 40.0 * h(12);
        let period = 120.0 + 480.0 * h(13);
        let wave = 12.0 * (t / period * std::f64::consts::TAU + h(14) * 6.0).sin();
        let jitter = 6.0 * (hash(self.seed, index, (t * 10.0) as u64, 15) - 0.5);
        (level + wave + jitter).clamp(0.0, 100.0)
    }

    #[allow(clippy::too_many_lines)]
    pub(super) fn read(
        &self,
        device: &Device,
        st: &mut GpuState,
        fields: &[Field],
    ) -> DeviceSample {
        let m = self.profile.model;
        let index = device.identity.index;
        let t = self.interval.as_secs_f64() * st.ticks as f64;
        let now = self.interval * u32::try_from(st.ticks).unwrap_or(u32::MAX);
        let dt = self.interval.as_secs_f64();
        let n = |c| hash(self.seed, index, st.ticks, c);

        let util = match st.utilization {
            Some((p, start, end)) if end.is_none_or(|e| now < e) => p.at(now - start),
            _ => self.base_utilization(index, t),
        };
        let util_i = util.round() as i64;
        let throttling = st.throttle.filter(|(_, until)| now < *until);
        if throttling.is_none() {
            st.throttle = None;
        }
        let power =
            (m.idle_w + (m.tdp_w - m.idle_w) * util / 100.0 * (0.92 + 0.06 * n(20))).min(m.tdp_w);
        let power = (power * 1000.0).round() / 1000.0;
        // Temperature approaches a power-dependent target with a lag; throttling pins it.
        let target = 28.0 + 50.0 * power / m.tdp_w;
        st.temp_c += (target - st.temp_c) * 0.3;
        let temp = match throttling {
            Some((c, _)) => c,
            None => st.temp_c.round() as i64,
        };
        st.energy_mj += (power * dt * 1000.0) as u64;
        if n(21) < 0.02 {
            st.pcie_replays = st.pcie_replays.saturating_add(1);
        }
        if n(22) < 0.01 {
            st.ecc_sbe_vol = st.ecc_sbe_vol.saturating_add(1);
        }
        let power_capped = util > 95.0;
        if power_capped {
            st.power_violation_ns += (dt * 1e9 * 0.2) as i64;
        }
        let mut reasons = 0u64;
        if util < 5.0 {
            reasons |= 0x1; // GPU_IDLE
        }
        if power_capped {
            reasons |= 0x4; // SW_POWER_CAP
        }
        if throttling.is_some() {
            reasons |= 0x20 | 0x40; // SW_THERMAL | HW_THERMAL
            st.thermal_violation_ns += (dt * 1e9) as i64;
        }
        let sm_clock = match (throttling, util >= 5.0) {
            (Some(_), _) => m.max_sm_mhz * 6 / 10,
            (None, true) => m.max_sm_mhz - (n(23) * 30.0) as i64,
            (None, false) => m.idle_sm_mhz,
        };
        let fb_usable = m.fb_total_mib - m.fb_reserved_mib;
        let fb_used = if util >= 5.0 {
            (fb_usable as f64 * (0.35 + 0.6 * hash(self.seed, index, 0, 24))) as i64
        } else {
            (n(25) * 4.0) as i64
        };
        let has_nvlink = m.nvlinks > 0;
        let nvlink_mbps = (util * 3000.0 * (0.8 + 0.4 * n(26))) as i64;
        let video_clock = if util >= 5.0 { 1755 } else { 765 };
        let mem_copy = (util * 0.6).round() as i64;
        let ratio = |scale: f64, c| round6((util / 100.0 * scale * (0.9 + 0.1 * n(c))).min(1.0));

        let value = |f: Field| -> Reading {
            let int = |v: i64| Ok(Value::Int(v));
            let float = |v: f64| Ok(Value::Float(v));
            let nvlink = |v: i64| {
                if has_nvlink {
                    int(v)
                } else {
                    Err(FieldError::NotSupported)
                }
            };
            match f {
                Field::DriverVersion => Ok(Value::Text("570.172.08".into())),
                Field::NvmlVersion => Ok(Value::Text("12.570.172.08".into())),
                Field::CudaDriverVersion => int(12080),
                Field::DevName => Ok(Value::Text(m.name.into())),
                Field::Brand => Ok(Value::Text("NVIDIA".into())),
                Field::Serial => Ok(Value::Text(format!(
                    "1654{:09}",
                    (hash(self.seed, index, 0, 30) * 1e9) as u64
                ))),
                Field::OemInforomVer => Ok(Value::Text("1.1".into())),
                Field::EccInforomVer => Ok(Value::Text("7.0".into())),
                Field::PowerInforomVer => Err(FieldError::NotSupported),
                Field::InforomImageVer => Ok(Value::Text("G520.0200.00.05".into())),
                Field::VbiosVersion => Ok(Value::Text("96.00.89.00.01".into())),
                Field::SmClock => int(sm_clock),
                Field::MemClock => int(m.mem_mhz),
                Field::VideoClock => int(video_clock),
                // DCGM 4.6.1+ base units: the same readings in Hz, J, 0-1 and bytes.
                Field::SmClockHertz => int(sm_clock * 1_000_000),
                Field::MemoryClockHertz => int(m.mem_mhz * 1_000_000),
                Field::VideoClockHertz => int(video_clock * 1_000_000),
                Field::GpuEnergyJoulesTotal => int((st.energy_mj / 1000) as i64),
                Field::FanSpeedRatio => Err(FieldError::NotSupported),
                Field::GpuUtilRatio => float(util_i as f64 / 100.0),
                Field::MemoryUtilRatio => float(mem_copy as f64 / 100.0),
                Field::EncUtilRatio | Field::DecUtilRatio => float(0.0),
                Field::FbCapacityBytes => int(m.fb_total_mib * MIB),
                Field::FbFreeBytes => int((fb_usable - fb_used) * MIB),
                Field::FbUsedBytes => int(fb_used * MIB),
                Field::FbReservedBytes => int(m.fb_reserved_mib * MIB),
                // DCGM: MB/s is KiB/s ÷ 1000, B/s is KiB/s × 1024.
                Field::NvlinkThroughputBytesPerSecond => nvlink(nvlink_mbps * 1_024_000),
                // Read per link below, never as GPU readings.
                Field::NvlinkCrcFlitErrorPerLinkTotal
                | Field::NvlinkCrcDataErrorPerLinkTotal
                | Field::NvlinkReplayErrorPerLinkTotal
                | Field::NvlinkRecoveryErrorPerLinkTotal
                | Field::NvlinkThroughputPerLink
                | Field::NvlinkTxThroughputPerLink
                | Field::NvlinkRxThroughputPerLink => Err(FieldError::NotSupported),
                Field::ClocksEventReasons => int(reasons as i64),
                Field::MemoryTemp => int(temp + 4),
                Field::GpuTemp => int(temp),
                Field::PowerUsage => float(power),
                Field::TotalEnergyConsumption => int(st.energy_mj as i64),
                Field::PowerUsageInstant => float(round6(power * (0.97 + 0.06 * n(27)))),
                Field::PowerMgmtLimit | Field::EnforcedPowerLimit => float(m.tdp_w),
                Field::Pstate => int(if util >= 5.0 { 0 } else { 8 }),
                Field::FanSpeed => Err(FieldError::NotSupported),
                Field::PcieReplayCounter => int(st.pcie_replays),
                Field::GpuUtil => int(util_i),
                Field::MemCopyUtil => int(mem_copy),
                Field::EncUtil | Field::DecUtil => int(0),
                // Exporter-derived from the XID events: the sampler fills these in.
                Field::XidErrors
                | Field::ExpXidErrorsCount
                | Field::ExpClockEventsCount
                | Field::ExpGpuHealthStatus => Err(FieldError::NotSupported),
                Field::ExpP2pStatus => Err(FieldError::NotSupported),
                // The simulated GPUs are bare metal, modelled with NVML not supporting the vGPU
                // licensing call there: the series is absent, with no read error.
                Field::VgpuLicenseStatus => Err(FieldError::NotSupported),
                Field::PcieLinkGen => int(m.pcie_gen),
                Field::PcieLinkWidth => int(16),
                Field::PowerViolation => int(st.power_violation_ns),
                Field::ThermalViolation => int(st.thermal_violation_ns),
                Field::SyncBoostViolation
                | Field::BoardLimitViolation
                | Field::LowUtilViolation
                | Field::ReliabilityViolation => int(0),
                Field::FbTotal => int(m.fb_total_mib),
                Field::FbFree => int(fb_usable - fb_used),
                Field::FbUsed => int(fb_used),
                Field::FbReserved => int(m.fb_reserved_mib),
                Field::FbUsedPercent => float(round6(fb_used as f64 / fb_usable as f64)),
                Field::EccCurrent => int(1),
                Field::EccSbeVolTotal => int(st.ecc_sbe_vol),
                Field::EccDbeVolTotal => int(st.ecc_dbe_vol),
                Field::EccSbeAggTotal => int(st.ecc_sbe_agg_base.saturating_add(st.ecc_sbe_vol)),
                Field::EccDbeAggTotal => int(st.ecc_dbe_agg_base.saturating_add(st.ecc_dbe_vol)),
                Field::RetiredSbe => int(st.retired_sbe),
                Field::RetiredDbe => int(st.retired_dbe),
                Field::RetiredPending => int(i64::from(st.retired_pending)),
                Field::UncorrectableRemappedRows => int(st.remap_unc),
                Field::CorrectableRemappedRows => int(st.remap_cor),
                Field::RowRemapFailure => int(i64::from(st.remap_failure)),
                Field::RowRemapPending => int(0),
                Field::NvlinkCrcFlitErrorCountTotal => nvlink(st.nvlink_crc_flit),
                Field::NvlinkCrcDataErrorCountTotal => nvlink(st.nvlink_crc_data),
                Field::NvlinkReplayErrorCountTotal => nvlink(st.nvlink_replay),
                Field::NvlinkRecoveryErrorCountTotal => nvlink(st.nvlink_recovery),
                Field::NvlinkBandwidthTotal => nvlink(nvlink_mbps),
                Field::ProfGrEngineActive => float(ratio(0.98, 40)),
                Field::ProfSmActive => float(ratio(0.9, 41)),
                Field::ProfSmOccupancy => float(ratio(0.45, 42)),
                Field::ProfPipeTensorActive => float(ratio(0.55, 43)),
                Field::ProfDramActive => float(ratio(0.6, 44)),
                Field::ProfPipeFp64Active => float(ratio(0.02, 45)),
                Field::ProfPipeFp32Active => float(ratio(0.25, 46)),
                Field::ProfPipeFp16Active => float(ratio(0.3, 47)),
                Field::ProfPcieTxBytes => float((util * 1.2e8 * n(48)).round()),
                Field::ProfPcieRxBytes => float((util * 2.0e8 * n(49)).round()),
                Field::ProfNvlinkTxBytes => {
                    if has_nvlink {
                        float((nvlink_mbps as f64 * 5e5).round())
                    } else {
                        Err(FieldError::NotSupported)
                    }
                }
                Field::ProfNvlinkRxBytes => {
                    if has_nvlink {
                        float((nvlink_mbps as f64 * 5e5 * (0.9 + 0.2 * n(50))).round())
                    } else {
                        Err(FieldError::NotSupported)
                    }
                }
            }
        };

        let gpu_fields: Vec<Field> = fields
            .iter()
            .copied()
            .filter(|f| !device.mig_enabled || f.mig_scope() != MigScope::Unsupported)
            .filter(|f| !f.is_link())
            .collect();
        let profiling = self.serves_profiling();
        let readings = gpu_fields
            .iter()
            .map(|&f| {
                if f.is_profiling() && !profiling {
                    (f, Err(FieldError::NotSupported))
                } else {
                    (f, value(f))
                }
            })
            .collect();
        let instance_used = |inst: &MigInstance| {
            let mem = mig_memory_mib(&inst.profile);
            let share = hash(self.seed, index, u64::from(inst.gi_id), 60);
            let iu = (util * (0.5 + share)).min(100.0) / 100.0;
            (mem as f64 * (0.2 + 0.7 * share) * iu.max(0.05)) as i64
        };
        let instances = device
            .instances
            .iter()
            .map(|inst| {
                let mem = mig_memory_mib(&inst.profile);
                let share = hash(self.seed, index, u64::from(inst.gi_id), 60);
                let iu = (util * (0.5 + share)).min(100.0) / 100.0;
                let used = instance_used(inst);
                let readings = fields
                    .iter()
                    .filter(|f| f.mig_scope() == MigScope::Instance)
                    .map(|&f| {
                        let r = match f {
                            _ if f.is_profiling() && !profiling => Err(FieldError::NotSupported),
                            Field::FbTotal => Ok(Value::Int(mem)),
                            Field::FbUsed => Ok(Value::Int(used)),
                            Field::FbFree => Ok(Value::Int(mem - used)),
                            Field::FbReserved => Ok(Value::Int(0)),
                            Field::FbUsedPercent => {
                                Ok(Value::Float(round6(used as f64 / mem as f64)))
                            }
                            Field::FbCapacityBytes => Ok(Value::Int(mem * MIB)),
                            Field::FbUsedBytes => Ok(Value::Int(used * MIB)),
                            Field::FbFreeBytes => Ok(Value::Int((mem - used) * MIB)),
                            Field::FbReservedBytes => Ok(Value::Int(0)),
                            Field::ProfGrEngineActive => Ok(Value::Float(round6(iu * 0.97))),
                            Field::ProfSmActive => Ok(Value::Float(round6(iu * 0.88))),
                            Field::ProfSmOccupancy => Ok(Value::Float(round6(iu * 0.41))),
                            Field::ProfPipeTensorActive => Ok(Value::Float(round6(iu * 0.5))),
                            Field::ProfDramActive => Ok(Value::Float(round6(iu * 0.57))),
                            Field::ProfPipeFp64Active => Ok(Value::Float(round6(iu * 0.01))),
                            Field::ProfPipeFp32Active => Ok(Value::Float(round6(iu * 0.22))),
                            Field::ProfPipeFp16Active => Ok(Value::Float(round6(iu * 0.28))),
                            _ => Err(FieldError::NotSupported),
                        };
                        (f, r)
                    })
                    .collect();
                InstanceSample {
                    gi_id: inst.gi_id,
                    readings,
                }
            })
            .collect();
        st.last = Some(LastTick {
            util,
            mem_util: (util * 0.6).round(),
            fb_used_mib: fb_used,
            instances: device
                .instances
                .iter()
                .map(|inst| (inst.gi_id, instance_used(inst)))
                .collect(),
        });
        // NVLinks: all of the model's links are up, except in MIG mode. A GPU's NVLink errors
        // all happen on one link (its "bad cable"), so the per-link counters add up to the GPU's
        // totals; the throughput is spread evenly, so the per-link rates add up to its total.
        let link_fields: Vec<Field> = fields.iter().copied().filter(|f| f.is_link()).collect();
        let links = if link_fields.is_empty() || !has_nvlink || device.mig_enabled {
            Vec::new()
        } else {
            let count = i64::from(m.nvlinks);
            let bad = (hash(self.seed, index, 0, 70) * f64::from(m.nvlinks)) as u32;
            (0..m.nvlinks)
                .map(|l| {
                    let errors = |total: i64| if l == bad { total } else { 0 };
                    let per_link =
                        nvlink_mbps / count + i64::from(i64::from(l) < nvlink_mbps % count);
                    let readings = link_fields
                        .iter()
                        .map(|&f| {
                            let v = match f {
                                Field::NvlinkCrcFlitErrorPerLinkTotal => errors(st.nvlink_crc_flit),
                                Field::NvlinkCrcDataErrorPerLinkTotal => errors(st.nvlink_crc_data),
                                Field::NvlinkReplayErrorPerLinkTotal => errors(st.nvlink_replay),
                                Field::NvlinkRecoveryErrorPerLinkTotal => {
                                    errors(st.nvlink_recovery)
                                }
                                Field::NvlinkTxThroughputPerLink => (per_link + 1) / 2,
                                Field::NvlinkRxThroughputPerLink => per_link / 2,
                                _ => per_link,
                            };
                            (f, Ok(Value::Int(v)))
                        })
                        .collect();
                    LinkSample { link: l, readings }
                })
                .collect()
        };
        DeviceSample {
            readings,
            instances,
            links,
        }
    }
}

/// Bytes per MiB.
const MIB: i64 = 1_048_576;

fn round6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}
