//! `SimulatedSource`: a deterministic fleet of fake GPUs, for demos, tests, CI and benchmarks.
//!
//! Values come from a seeded hash, never from the wall clock: each `sample` of a device advances
//! that device's simulated clock by one interval, so the same seed, profile, scenario and number
//! of samples always give the same readings (the golden files rely on it). The values stay
//! consistent the way real GPUs are: power follows utilization, temperature follows power with a
//! lag, energy and error counters only grow, and FB used + free + reserved = total.

use std::sync::Mutex;
use std::time::Duration;

use super::scenario::{Action, Pattern, Scenario};
use super::{
    Device, DeviceSample, FieldError, GpuIdentity, GpuProcess, GpuSource, InstanceSample,
    LinkSample, MigInstance, MigPlacement, ProcessUtilization, Reading, SourceError, Value,
    XidEvent,
};
use crate::catalog::field::MigScope;
use crate::catalog::Field;

/// A GPU model the simulator knows.
#[derive(Debug, Clone, Copy)]
struct Model {
    name: &'static str,
    fb_total_mib: i64,
    fb_reserved_mib: i64,
    tdp_w: f64,
    idle_w: f64,
    max_sm_mhz: i64,
    idle_sm_mhz: i64,
    mem_mhz: i64,
    nvlinks: u32,
    pcie_gen: i64,
    /// Whether NVML GPM works on it (Hopper and newer): the only NVML source of the
    /// `DCGM_FI_PROF_*` fields.
    gpm: bool,
}

const A100_40GB: Model = Model {
    name: "NVIDIA A100-SXM4-40GB",
    fb_total_mib: 40960,
    fb_reserved_mib: 431,
    tdp_w: 400.0,
    idle_w: 52.0,
    max_sm_mhz: 1410,
    idle_sm_mhz: 210,
    mem_mhz: 1215,
    nvlinks: 0,
    pcie_gen: 4,
    gpm: false,
};

const A100_80GB: Model = Model {
    name: "NVIDIA A100-SXM4-80GB",
    fb_total_mib: 81920,
    fb_reserved_mib: 600,
    tdp_w: 400.0,
    idle_w: 62.0,
    max_sm_mhz: 1410,
    idle_sm_mhz: 210,
    mem_mhz: 1593,
    nvlinks: 12,
    pcie_gen: 4,
    gpm: false,
};

const H100_SXM: Model = Model {
    name: "NVIDIA H100 80GB HBM3",
    fb_total_mib: 81559,
    fb_reserved_mib: 528,
    tdp_w: 700.0,
    idle_w: 72.0,
    max_sm_mhz: 1980,
    idle_sm_mhz: 345,
    mem_mhz: 2619,
    nvlinks: 18,
    pcie_gen: 5,
    gpm: true,
};

/// A fleet profile: a model, a GPU count and, per GPU, its MIG layout.
#[derive(Debug, Clone, Copy)]
struct Profile {
    name: &'static str,
    model: Model,
    gpus: u32,
    /// Per GPU: (profile name, GPU instance id, first memory slice), as on a real A100 80GB.
    mig: &'static [&'static [(&'static str, u32, u32)]],
}

/// The profiles `--sim-profile` accepts.
///
/// The last two are scale profiles for benchmarks: more GPUs, or more MIG instances, than most
/// nodes have, to show how the cost grows with the number of series.
pub const PROFILES: &[&str] = &[
    "1xA100-40GB",
    "8xH100-SXM",
    "4xA100-80GB-MIG",
    "64xH100-SXM",
    "8xA100-80GB-7xMIG",
];

/// Seven 1g.10gb instances, the most an A100 80GB can hold (GPU instance ids 7-13, on memory
/// slices 0-6).
const SEVEN_1G_10GB: &[(&str, u32, u32)] = &[
    ("1g.10gb", 7, 0),
    ("1g.10gb", 8, 1),
    ("1g.10gb", 9, 2),
    ("1g.10gb", 10, 3),
    ("1g.10gb", 11, 4),
    ("1g.10gb", 12, 5),
    ("1g.10gb", 13, 6),
];

fn profile(name: &str) -> Option<Profile> {
    Some(match name {
        "1xA100-40GB" => Profile {
            name: "1xA100-40GB",
            model: A100_40GB,
            gpus: 1,
            mig: &[],
        },
        "8xH100-SXM" => Profile {
            name: "8xH100-SXM",
            model: H100_SXM,
            gpus: 8,
            mig: &[],
        },
        "4xA100-80GB-MIG" => Profile {
            name: "4xA100-80GB-MIG",
            model: A100_80GB,
            gpus: 4,
            // (profile, GPU instance id, first memory slice); GPU 3 has MIG disabled.
            mig: &[
                &[
                    ("3g.40gb", 2, 4),
                    ("2g.20gb", 3, 0),
                    ("1g.10gb", 9, 2),
                    ("1g.10gb", 10, 3),
                ],
                &[("7g.80gb", 0, 0)],
                &[("4g.40gb", 1, 0), ("3g.40gb", 2, 4)],
                &[],
            ],
        },
        "64xH100-SXM" => Profile {
            name: "64xH100-SXM",
            model: H100_SXM,
            gpus: 64,
            mig: &[],
        },
        "8xA100-80GB-7xMIG" => Profile {
            name: "8xA100-80GB-7xMIG",
            model: A100_80GB,
            gpus: 8,
            mig: &[SEVEN_1G_10GB; 8],
        },
        _ => return None,
    })
}

/// GPU instance profile id and size in memory slices of an A100 80GB profile, as NVML reports
/// them (`nvidia-smi mig -lgip`).
fn mig_profile_id_and_size(profile: &str) -> (u32, u32) {
    match profile {
        "1g.10gb" => (19, 1),
        "1g.10gb+me" => (20, 1),
        "1g.20gb" => (15, 2),
        "2g.20gb" => (14, 2),
        "3g.40gb" => (9, 4),
        "4g.40gb" => (5, 4),
        _ => (0, 8),
    }
}

/// MIG profile memory in MiB, as NVML reports it for an A100 80GB.
fn mig_memory_mib(profile: &str) -> i64 {
    match profile {
        "1g.10gb" => 9728,
        "1g.20gb" | "2g.20gb" => 19968,
        "3g.40gb" | "4g.40gb" => 40192,
        _ => 80896,
    }
}

/// Errors creating a simulated source.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The profile name is unknown.
    #[error("unknown simulation profile {0:?}; known profiles: {list}", list = PROFILES.join(", "))]
    UnknownProfile(String),
    /// A simulated process names a GPU or MIG instance the profile does not have.
    #[error("simulated process {pid}: {what} does not exist in profile {profile}")]
    NoSuchEntity {
        /// The PID.
        pid: u32,
        /// The GPU or instance named.
        what: String,
        /// The profile.
        profile: String,
    },
    /// A scenario event names a GPU the profile does not have.
    #[error("{origin}:{line}: GPU {gpu} does not exist in profile {profile} ({count} GPUs)")]
    NoSuchGpu {
        /// Scenario file.
        origin: String,
        /// Line of the event.
        line: usize,
        /// The index named.
        gpu: u32,
        /// The profile.
        profile: String,
        /// How many GPUs it has.
        count: u32,
    },
}

/// Per-GPU mutable state: counters that only grow, and the scenario's effects.
#[derive(Debug, Default, Clone)]
struct GpuState {
    ticks: u64,
    temp_c: f64,
    energy_mj: u64,
    pcie_replays: i64,
    ecc_sbe_vol: i64,
    ecc_dbe_vol: i64,
    ecc_sbe_agg_base: i64,
    ecc_dbe_agg_base: i64,
    retired_sbe: i64,
    retired_dbe: i64,
    retired_pending: bool,
    remap_cor: i64,
    remap_unc: i64,
    remap_failure: bool,
    nvlink_crc_flit: i64,
    nvlink_crc_data: i64,
    nvlink_replay: i64,
    nvlink_recovery: i64,
    power_violation_ns: i64,
    thermal_violation_ns: i64,
    lost: bool,
    throttle: Option<(i64, Duration)>,
    utilization: Option<(Pattern, Duration, Option<Duration>)>,
    pending_xids: Vec<XidEvent>,
    next_event: usize,
    /// What the last sample read, for the processes of the same tick.
    last: Option<LastTick>,
}

/// The values of a GPU's last sample that its processes share.
#[derive(Debug, Default, Clone)]
struct LastTick {
    util: f64,
    mem_util: f64,
    fb_used_mib: i64,
    /// Framebuffer used per MIG instance, MiB.
    instances: Vec<(u32, i64)>,
}

/// A simulated process: `pid` on GPU `gpu` (MIG instance `gi_id`), using a `weight` share of
/// what the GPU or instance does against the other processes there.
#[derive(Debug, Clone, PartialEq)]
pub struct SimProcess {
    /// Host PID.
    pub pid: u32,
    /// GPU index.
    pub gpu: u32,
    /// MIG GPU instance id, on MIG-enabled GPUs.
    pub gi_id: Option<u32>,
    /// Relative share.
    pub weight: f64,
}

/// A simulated GPU fleet.
#[derive(Debug)]
pub struct SimulatedSource {
    profile: Profile,
    seed: u64,
    interval: Duration,
    scenario: Scenario,
    state: Vec<Mutex<GpuState>>,
    processes: Vec<SimProcess>,
}

impl SimulatedSource {
    /// Creates a fleet. `interval` is how far simulated time advances per sample.
    ///
    /// # Errors
    /// [`SimError`] for an unknown profile or a scenario event naming a missing GPU.
    pub fn new(
        profile_name: &str,
        seed: u64,
        interval: Duration,
        scenario: Scenario,
        scenario_origin: &str,
    ) -> Result<Self, SimError> {
        let profile = profile(profile_name)
            .ok_or_else(|| SimError::UnknownProfile(profile_name.to_owned()))?;
        for ev in &scenario.events {
            if let super::scenario::Target::Gpu(g) = ev.target {
                if g >= profile.gpus {
                    return Err(SimError::NoSuchGpu {
                        origin: scenario_origin.to_owned(),
                        line: ev.line,
                        gpu: g,
                        profile: profile.name.to_owned(),
                        count: profile.gpus,
                    });
                }
            }
        }
        let state = (0..profile.gpus)
            .map(|i| {
                let h = |c| hash(seed, i, 0, c);
                Mutex::new(GpuState {
                    temp_c: 30.0 + 4.0 * h(1),
                    // Energy since driver load: a few days' worth at idle.
                    energy_mj: 1_000_000_000 + (h(2) * 5e10) as u64,
                    ecc_sbe_agg_base: (h(3) * 20.0) as i64,
                    ..GpuState::default()
                })
            })
            .collect();
        Ok(Self {
            profile,
            seed,
            interval,
            scenario,
            state,
            processes: Vec::new(),
        })
    }

    /// Runs `processes` on the fleet: each tick they share their GPU's (or MIG instance's)
    /// utilisation and framebuffer by weight, so they add up to the device's values (memory
    /// exactly, in MiB; utilisation within the rounding of each share to whole percent). Per-process
    /// utilisation is not reported on MIG instances, as NVML does not report it there.
    ///
    /// # Errors
    /// [`SimError::NoSuchEntity`] for a GPU or MIG instance the profile does not have, or an
    /// instance named on a GPU without MIG.
    pub fn with_processes(mut self, processes: Vec<SimProcess>) -> Result<Self, SimError> {
        let devices = self.devices().unwrap_or_default();
        for p in &processes {
            let err = |what: String| SimError::NoSuchEntity {
                pid: p.pid,
                what,
                profile: self.profile.name.to_owned(),
            };
            let d = devices
                .iter()
                .find(|d| d.identity.index == p.gpu)
                .ok_or_else(|| err(format!("GPU {}", p.gpu)))?;
            match p.gi_id {
                Some(gi) if !d.instances.iter().any(|i| i.gi_id == gi) => {
                    return Err(err(format!("MIG instance {gi} of GPU {}", p.gpu)))
                }
                None if d.mig_enabled => {
                    return Err(err(format!(
                        "GPU {} without a MIG instance (it has MIG enabled)",
                        p.gpu
                    )))
                }
                _ => {}
            }
        }
        self.processes = processes;
        Ok(self)
    }

    /// Whether the simulated GPUs have a source for the `DCGM_FI_PROF_*` fields, as real ones
    /// of the model would: NVML GPM on Hopper and newer. (A simulated DCGM source, when there is
    /// one, serves them on every model: it would be checked here.)
    fn serves_profiling(&self) -> bool {
        self.profile.model.gpm
    }

    fn identity(&self, index: u32) -> GpuIdentity {
        const BUS: [u8; 8] = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB];
        GpuIdentity {
            index,
            uuid: uuid("GPU", self.seed, index, 0),
            // Eight GPUs per PCI domain, so the 64-GPU scale profile has distinct addresses.
            pci_bus_id: format!(
                "{:08X}:{:02X}:00.0",
                index as usize / BUS.len(),
                BUS[index as usize % BUS.len()]
            ),
            minor: index,
            model: self.profile.model.name.to_owned(),
        }
    }

    /// Applies scenario events due at or before `now` to `st`.
    fn apply_events(&self, index: u32, st: &mut GpuState, now: Duration) {
        while let Some(ev) = self.scenario.events.get(st.next_event) {
            if ev.at > now {
                break;
            }
            st.next_event += 1;
            if !ev.target.matches(index) {
                continue;
            }
            match &ev.action {
                Action::FallOffBus => {
                    st.lost = true;
                    st.pending_xids.push(XidEvent { xid: 79 });
                }
                Action::Recover => st.lost = false,
                Action::Xid(x) => st.pending_xids.push(XidEvent { xid: *x }),
                Action::EccDbe(n) => {
                    st.ecc_dbe_vol += to_i64(*n);
                    st.retired_pending = true;
                    st.remap_unc += to_i64(*n);
                    st.pending_xids.push(XidEvent { xid: 48 });
                }
                Action::EccSbe(n) => st.ecc_sbe_vol += to_i64(*n),
                Action::ThermalThrottle {
                    temperature,
                    duration,
                } => st.throttle = Some((*temperature, now + *duration)),
                Action::Utilization { pattern, duration } => {
                    st.utilization = Some((*pattern, now, duration.map(|d| now + d)));
                }
                Action::RowRemapFailure => st.remap_failure = true,
                Action::RetiredPagesPending => st.retired_pending = true,
                Action::PcieReplays(n) => st.pcie_replays += to_i64(*n),
                Action::NvlinkErrors(n) => {
                    st.nvlink_crc_flit += to_i64(*n);
                    st.nvlink_replay += (to_i64(*n) + 3) / 4;
                }
            }
        }
    }

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
    fn read(&self, device: &Device, st: &mut GpuState, fields: &[Field]) -> DeviceSample {
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
            st.pcie_replays += 1;
        }
        if n(22) < 0.01 {
            st.ecc_sbe_vol += 1;
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
                Field::EccSbeAggTotal => int(st.ecc_sbe_agg_base + st.ecc_sbe_vol),
                Field::EccDbeAggTotal => int(st.ecc_dbe_agg_base + st.ecc_dbe_vol),
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

impl GpuSource for SimulatedSource {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn supports(&self, field: Field) -> bool {
        field != Field::ExpP2pStatus
    }

    fn field_gap(&self, _device: &Device, field: Field) -> Option<super::FieldGap> {
        (field.is_profiling() && !self.serves_profiling())
            .then_some(super::FieldGap::ProfilingNeedsDcgm)
    }

    fn devices(&self) -> Result<Vec<Device>, SourceError> {
        Ok((0..self.profile.gpus)
            .map(|i| {
                let layout = self.profile.mig.get(i as usize).copied().unwrap_or(&[]);
                let mut instances: Vec<MigInstance> = layout
                    .iter()
                    .map(|&(profile, gi_id, start)| {
                        let (profile_id, size) = mig_profile_id_and_size(profile);
                        MigInstance {
                            gi_id,
                            ci_id: 0,
                            profile: profile.to_owned(),
                            uuid: uuid("MIG", self.seed, i, u64::from(gi_id) + 1),
                            placement: Some(MigPlacement {
                                profile_id,
                                start,
                                size,
                            }),
                        }
                    })
                    .collect();
                instances.sort_by_key(|m| m.gi_id);
                Device {
                    identity: self.identity(i),
                    mig_enabled: !layout.is_empty(),
                    instances,
                }
            })
            .collect())
    }

    fn sample(&self, device: &Device, fields: &[Field]) -> Result<DeviceSample, SourceError> {
        let index = device.identity.index;
        let Some(cell) = self.state.get(index as usize) else {
            return Err(SourceError::Device {
                index,
                uuid: device.identity.uuid.clone(),
                cause: "no such simulated GPU".into(),
            });
        };
        let mut st = cell
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = self.interval * u32::try_from(st.ticks).unwrap_or(u32::MAX);
        self.apply_events(index, &mut st, now);
        if st.lost {
            st.ticks += 1;
            return Err(SourceError::GpuLost {
                index,
                uuid: device.identity.uuid.clone(),
            });
        }
        let sample = self.read(device, &mut st, fields);
        st.ticks += 1;
        Ok(sample)
    }

    fn processes(&self, device: &Device) -> Result<Vec<GpuProcess>, FieldError> {
        let index = device.identity.index;
        let cell = self.state.get(index as usize).ok_or(FieldError::Failed)?;
        let st = cell
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.lost {
            return Err(FieldError::Failed);
        }
        let Some(last) = &st.last else {
            return Ok(Vec::new());
        };
        let mut groups: Vec<(Option<u32>, Vec<&SimProcess>)> = Vec::new();
        for p in self.processes.iter().filter(|p| p.gpu == index) {
            match groups.iter_mut().find(|(gi, _)| *gi == p.gi_id) {
                Some((_, v)) => v.push(p),
                None => groups.push((p.gi_id, vec![p])),
            }
        }
        let mut out = Vec::new();
        for (gi, procs) in groups {
            let total: f64 = procs.iter().map(|p| p.weight).sum();
            let fb = match gi {
                None => last.fb_used_mib,
                Some(g) => last
                    .instances
                    .iter()
                    .find(|(i, _)| *i == g)
                    .map_or(0, |(_, used)| *used),
            };
            let mib = split(fb.max(0) as u64, procs.iter().map(|p| p.weight / total));
            for (p, mib) in procs.iter().zip(mib) {
                let share = p.weight / total;
                let pct = |v: f64| (v * share).round().clamp(0.0, 100.0) as u32;
                out.push(GpuProcess {
                    pid: p.pid,
                    gi_id: gi,
                    used_memory_bytes: Some(mib * 1024 * 1024),
                    utilization: gi.is_none().then(|| ProcessUtilization {
                        sm: pct(last.util),
                        memory: pct(last.mem_util),
                        encoder: 0,
                        decoder: 0,
                    }),
                });
            }
        }
        Ok(out)
    }

    fn drain_xids(&self) -> Vec<(String, XidEvent)> {
        let mut out = Vec::new();
        for (i, cell) in self.state.iter().enumerate() {
            let mut st = cell
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let uuid = uuid("GPU", self.seed, i as u32, 0);
            out.extend(st.pending_xids.drain(..).map(|x| (uuid.clone(), x)));
        }
        out
    }
}

/// Splits `total` by `shares` (summing to 1) into whole parts that add up to `total` exactly:
/// each part rounded down, the remainder given one by one from the first part on.
fn split(total: u64, shares: impl Iterator<Item = f64>) -> Vec<u64> {
    let mut parts: Vec<u64> = shares.map(|s| (total as f64 * s).floor() as u64).collect();
    let mut rest = total.saturating_sub(parts.iter().sum());
    let n = parts.len();
    let mut i = 0;
    while rest > 0 && n > 0 {
        parts[i % n] += 1;
        rest -= 1;
        i += 1;
    }
    parts
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn round6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

/// splitmix64 of (seed, gpu, tick, channel) mapped to [0, 1).
fn hash(seed: u64, gpu: u32, tick: u64, channel: u64) -> f64 {
    let mut z = seed
        ^ (u64::from(gpu).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        ^ tick.wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ channel.wrapping_mul(0x94D0_49BB_1331_11EB);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

fn uuid(prefix: &str, seed: u64, gpu: u32, sub: u64) -> String {
    let word = |c: u64| (hash(seed, gpu, sub, 100 + c) * 4_294_967_296.0) as u64;
    let (a, b, c, d) = (word(0), word(1), word(2), word(3));
    format!(
        "{prefix}-{a:08x}-{:04x}-{:04x}-{:04x}-{:04x}{c:08x}",
        b >> 16,
        b & 0xffff,
        d >> 16,
        d & 0xffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::scenario;

    fn fleet(profile: &str, scenario_text: &str) -> SimulatedSource {
        let sc = scenario::parse(scenario_text, "t.toml").unwrap();
        SimulatedSource::new(profile, 1, Duration::from_secs(10), sc, "t.toml").unwrap()
    }

    fn int(s: &DeviceSample, f: Field) -> i64 {
        s.get_i64(f).unwrap()
    }

    #[test]
    fn is_deterministic_for_a_seed() {
        let a = fleet("8xH100-SXM", "");
        let b = fleet("8xH100-SXM", "");
        let da = a.devices().unwrap();
        assert_eq!(da, b.devices().unwrap());
        for _ in 0..3 {
            for d in &da {
                assert_eq!(
                    a.sample(d, Field::ALL).unwrap(),
                    b.sample(d, Field::ALL).unwrap()
                );
            }
        }
    }

    #[test]
    fn values_stay_consistent_over_time() {
        let s = fleet("8xH100-SXM", "");
        let devices = s.devices().unwrap();
        for d in &devices {
            let mut prev_energy = 0;
            let mut prev_sbe = 0;
            for _ in 0..50 {
                let x = s.sample(d, Field::ALL).unwrap();
                assert_eq!(
                    int(&x, Field::FbUsed) + int(&x, Field::FbFree) + int(&x, Field::FbReserved),
                    int(&x, Field::FbTotal)
                );
                let e = int(&x, Field::TotalEnergyConsumption);
                assert!(e > prev_energy);
                prev_energy = e;
                let sbe = int(&x, Field::EccSbeVolTotal);
                assert!(sbe >= prev_sbe);
                prev_sbe = sbe;
                let util = int(&x, Field::GpuUtil);
                assert!((0..=100).contains(&util));
                let Some(Value::Float(p)) = x.get(Field::PowerUsage) else {
                    panic!()
                };
                assert!(*p >= 72.0 && *p <= 700.0);
            }
        }
    }

    #[test]
    fn power_follows_utilization() {
        let s = fleet(
            "8xH100-SXM",
            "[[event]]\nat=\"0s\"\ngpu=0\naction=\"utilization\"\nvalue=0\n[[event]]\nat=\"0s\"\ngpu=1\naction=\"utilization\"\nvalue=100\n",
        );
        let d = s.devices().unwrap();
        let idle = s.sample(&d[0], Field::ALL).unwrap();
        let busy = s.sample(&d[1], Field::ALL).unwrap();
        let p = |x: &DeviceSample| match x.get(Field::PowerUsage) {
            Some(Value::Float(v)) => *v,
            _ => panic!(),
        };
        assert!(p(&busy) > 4.0 * p(&idle));
        assert_eq!(int(&idle, Field::GpuUtil), 0);
    }

    #[test]
    fn scenario_events_take_effect_on_time() {
        let s = fleet(
            "8xH100-SXM",
            "[[event]]\nat=\"20s\"\ngpu=3\naction=\"fall-off-bus\"\n[[event]]\nat=\"40s\"\ngpu=3\naction=\"recover\"\n[[event]]\nat=\"10s\"\ngpu=1\naction=\"ecc-dbe\"\ncount=2\n[[event]]\nat=\"0s\"\ngpu=2\naction=\"thermal-throttle\"\ntemperature=95\nduration=\"30s\"\n",
        );
        let d = s.devices().unwrap();
        // t=0, 10s: fine; t=20s, 30s: lost; t=40s: back.
        assert!(s.sample(&d[3], Field::ALL).is_ok());
        assert!(s.sample(&d[3], Field::ALL).is_ok());
        assert!(matches!(
            s.sample(&d[3], Field::ALL),
            Err(SourceError::GpuLost { index: 3, .. })
        ));
        let uuid3 = d[3].identity.uuid.clone();
        assert_eq!(s.drain_xids(), vec![(uuid3, XidEvent { xid: 79 })]);
        assert!(s.sample(&d[3], Field::ALL).is_err());
        assert!(s.sample(&d[3], Field::ALL).is_ok());

        let first = s.sample(&d[1], Field::ALL).unwrap();
        assert_eq!(int(&first, Field::EccDbeVolTotal), 0);
        let second = s.sample(&d[1], Field::ALL).unwrap();
        assert_eq!(int(&second, Field::EccDbeVolTotal), 2);
        assert_eq!(
            s.drain_xids(),
            vec![(d[1].identity.uuid.clone(), XidEvent { xid: 48 })]
        );

        let hot = s.sample(&d[2], Field::ALL).unwrap();
        assert_eq!(int(&hot, Field::GpuTemp), 95);
        assert_eq!(int(&hot, Field::ClocksEventReasons) & 0x40, 0x40);
    }

    #[test]
    fn scale_profiles_have_distinct_identities() {
        let big = fleet("64xH100-SXM", "").devices().unwrap();
        assert_eq!(big.len(), 64);
        let mut buses: Vec<&str> = big.iter().map(|d| d.identity.pci_bus_id.as_str()).collect();
        buses.sort_unstable();
        buses.dedup();
        assert_eq!(buses.len(), 64, "PCI bus ids repeat");
        assert_eq!(big[9].identity.pci_bus_id, "00000001:2A:00.0");

        let mig = fleet("8xA100-80GB-7xMIG", "").devices().unwrap();
        assert_eq!(mig.len(), 8);
        for d in &mig {
            assert!(d.mig_enabled);
            let ids: Vec<u32> = d.instances.iter().map(|i| i.gi_id).collect();
            assert_eq!(ids, (7..14).collect::<Vec<_>>());
        }
        let mut uuids: Vec<&str> = mig
            .iter()
            .flat_map(|d| d.instances.iter().map(|i| i.uuid.as_str()))
            .collect();
        uuids.sort_unstable();
        uuids.dedup();
        assert_eq!(uuids.len(), 56, "MIG UUIDs repeat");
    }

    #[test]
    fn mig_profile_has_instances_and_no_gpu_utilization() {
        let s = fleet("4xA100-80GB-MIG", "");
        let d = s.devices().unwrap();
        assert_eq!(d[0].instances.len(), 4);
        assert!(d[0].mig_enabled);
        assert!(!d[3].mig_enabled);
        assert_eq!(d[0].instances[0].profile, "3g.40gb");
        assert!(d[0].instances[0].uuid.starts_with("MIG-"));
        let x = s.sample(&d[0], Field::ALL).unwrap();
        assert!(x.get(Field::GpuUtil).is_none());
        assert_eq!(x.instances.len(), 4);
        let fb = |f| {
            x.instances[0]
                .readings
                .iter()
                .find(|(g, _)| *g == f)
                .and_then(|(_, r)| r.clone().ok())
        };
        let (Some(Value::Int(used)), Some(Value::Int(free)), Some(Value::Int(total))) =
            (fb(Field::FbUsed), fb(Field::FbFree), fb(Field::FbTotal))
        else {
            panic!()
        };
        assert_eq!(used + free, total);
    }

    #[test]
    fn profiling_fields_only_where_a_real_source_serves_them() {
        use crate::gpu::FieldGap;
        let prof: Vec<Field> = Field::ALL
            .iter()
            .copied()
            .filter(|f| f.is_profiling())
            .collect();
        assert!(prof.contains(&Field::ProfGrEngineActive));
        // Hopper: NVML GPM serves them (the NVLink ones need NVLinks, which the H100 has).
        let h100 = fleet("8xH100-SXM", "");
        let d = h100.devices().unwrap();
        let x = h100.sample(&d[0], Field::ALL).unwrap();
        for &f in &prof {
            assert!(x.get(f).is_some(), "{f:?} missing on an H100");
            assert_eq!(h100.field_gap(&d[0], f), None);
        }
        // Ampere (whole GPUs and MIG instances): no GPM and no DCGM source, so none.
        for profile in ["1xA100-40GB", "4xA100-80GB-MIG"] {
            let a100 = fleet(profile, "");
            for d in a100.devices().unwrap() {
                let x = a100.sample(&d, Field::ALL).unwrap();
                for &f in &prof {
                    assert_eq!(a100.field_gap(&d, f), Some(FieldGap::ProfilingNeedsDcgm));
                    if let Some((_, r)) = x.readings.iter().find(|(g, _)| *g == f) {
                        assert_eq!(*r, Err(FieldError::NotSupported), "{profile} {f:?}");
                    }
                    for inst in &x.instances {
                        if let Some((_, r)) = inst.readings.iter().find(|(g, _)| *g == f) {
                            assert_eq!(*r, Err(FieldError::NotSupported), "{profile} {f:?}");
                        }
                    }
                }
                assert_eq!(a100.field_gap(&d, Field::GpuTemp), None);
                // Other instance fields are still there.
                for inst in &x.instances {
                    assert!(inst
                        .readings
                        .iter()
                        .any(|(f, r)| *f == Field::FbUsed && r.is_ok()));
                }
            }
        }
    }

    #[test]
    fn rejects_unknown_profile_and_missing_gpu() {
        let e = SimulatedSource::new(
            "9xB300",
            1,
            Duration::from_secs(1),
            Scenario::default(),
            "-",
        )
        .unwrap_err();
        assert!(e.to_string().contains("8xH100-SXM"));
        let sc = scenario::parse(
            "[[event]]\nat=\"0s\"\ngpu=5\naction=\"recover\"\n",
            "x.toml",
        )
        .unwrap();
        let e = SimulatedSource::new("1xA100-40GB", 1, Duration::from_secs(1), sc, "x.toml")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "x.toml:1: GPU 5 does not exist in profile 1xA100-40GB (1 GPUs)"
        );
    }

    #[test]
    fn uuids_look_like_nvml_uuids() {
        let u = uuid("GPU", 1, 0, 0);
        assert_eq!(u.len(), 40);
        assert_eq!(u.matches('-').count(), 5);
    }

    #[test]
    fn processes_share_their_gpus_use_by_weight() {
        let proc = |pid, gpu, gi_id, weight| SimProcess {
            pid,
            gpu,
            gi_id,
            weight,
        };
        let s = fleet("4xA100-80GB-MIG", "")
            .with_processes(vec![
                proc(1, 3, None, 3.0),
                proc(2, 3, None, 2.0),
                proc(3, 3, None, 1.0),
                proc(4, 0, Some(2), 1.0),
                proc(5, 0, Some(2), 1.0),
            ])
            .unwrap();
        let d = s.devices().unwrap();
        // Before the first sample there is nothing to share.
        assert!(s.processes(&d[3]).unwrap().is_empty());
        for _ in 0..5 {
            let x = s.sample(&d[3], Field::ALL).unwrap();
            let ps = s.processes(&d[3]).unwrap();
            assert_eq!(ps.len(), 3);
            let mib: i64 = ps
                .iter()
                .map(|p| (p.used_memory_bytes.unwrap() / 1_048_576) as i64)
                .sum();
            assert_eq!(mib, int(&x, Field::FbUsed));
            let sm: i64 = ps
                .iter()
                .map(|p| i64::from(p.utilization.unwrap().sm))
                .sum();
            assert!(
                (sm - int(&x, Field::GpuUtil)).abs() <= 2,
                "{sm} vs {}",
                int(&x, Field::GpuUtil)
            );
            // 3:2:1.
            let a = ps[0].utilization.unwrap().sm;
            let c = ps[2].utilization.unwrap().sm;
            assert!(a + 1 >= 3 * c && a <= 3 * c + 3, "{a} vs {c}");
        }
        let x = s.sample(&d[0], Field::ALL).unwrap();
        let ps = s.processes(&d[0]).unwrap();
        assert_eq!(
            ps.iter().map(|p| p.gi_id).collect::<Vec<_>>(),
            [Some(2), Some(2)]
        );
        assert!(ps.iter().all(|p| p.utilization.is_none()));
        let inst = x.instances.iter().find(|i| i.gi_id == 2).unwrap();
        let Some((_, Ok(Value::Int(used)))) =
            inst.readings.iter().find(|(f, _)| *f == Field::FbUsed)
        else {
            panic!()
        };
        let total: u64 = ps
            .iter()
            .map(|p| p.used_memory_bytes.unwrap() / 1_048_576)
            .sum();
        assert_eq!(total as i64, *used);
        // GPUs without processes have none.
        s.sample(&d[1], Field::ALL).unwrap();
        assert!(s.processes(&d[1]).unwrap().is_empty());
    }

    #[test]
    fn processes_must_name_real_entities() {
        let p = |gpu, gi_id| SimProcess {
            pid: 9,
            gpu,
            gi_id,
            weight: 1.0,
        };
        let e = |procs| {
            fleet("4xA100-80GB-MIG", "")
                .with_processes(procs)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e(vec![p(7, None)]),
            "simulated process 9: GPU 7 does not exist in profile 4xA100-80GB-MIG"
        );
        assert!(e(vec![p(0, Some(4))]).contains("MIG instance 4 of GPU 0"));
        assert!(e(vec![p(0, None)]).contains("has MIG enabled"));
        assert!(e(vec![p(3, Some(0))]).contains("MIG instance 0 of GPU 3"));
    }
}
