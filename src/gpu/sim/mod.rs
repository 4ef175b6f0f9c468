//! `SimulatedSource`: a deterministic fleet of fake GPUs, for demos, tests, CI and benchmarks.
//!
//! Values come from a seeded hash, never from the wall clock: each `sample` of a device advances
//! that device's simulated clock by one interval, so the same seed, profile, scenario and number
//! of samples always give the same readings (the golden files rely on it). The values stay
//! consistent the way real GPUs are: power follows utilization, temperature follows power with a
//! lag, energy and error counters only grow, and FB used + free + reserved = total.
//!
//! Layout: `profiles` holds the GPU models and fleet profiles (MIG layouts included);
//! this file the fleet's state and its scenario handling; `values` what one sample of a GPU
//! reads; `source` the [`GpuSource`] implementation; `seeded` the seeded hash every value and
//! id comes from; `assignments` the file of pods and processes that `--sim-processes` reads.

pub mod assignments;
mod profiles;
pub mod scenario;
mod seeded;
mod source;
#[cfg(test)]
mod tests;
mod values;

use std::sync::Mutex;
use std::time::Duration;

use super::{GpuIdentity, GpuSource, XidEvent};
pub use profiles::PROFILES;
use profiles::{profile, Profile};
use scenario::{Action, Pattern, Scenario};
use seeded::{hash, uuid};

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
    dcgm: bool,
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
            if let scenario::Target::Gpu(g) = ev.target {
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
            dcgm: false,
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

    /// Plays a node with a DCGM hostengine (`--sim-dcgm`, as `-r` on a real node): the
    /// `DCGM_FI_PROF_*` fields are served on every model, GPUs before Hopper included.
    pub fn with_dcgm(mut self, dcgm: bool) -> Self {
        self.dcgm = dcgm;
        self
    }

    /// Whether the simulated GPUs have a source for the `DCGM_FI_PROF_*` fields, as real ones
    /// of the model would: NVML GPM on Hopper and newer, or a (simulated) DCGM hostengine.
    fn serves_profiling(&self) -> bool {
        self.profile.model.gpm || self.dcgm
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

    /// Applies scenario events due at or before `now` to `st`. Counts add up saturating: a
    /// scenario built in code can carry any `u64` (files are capped at `scenario::MAX_COUNT`).
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
                    st.ecc_dbe_vol = st.ecc_dbe_vol.saturating_add(to_i64(*n));
                    st.retired_pending = true;
                    st.remap_unc = st.remap_unc.saturating_add(to_i64(*n));
                    st.pending_xids.push(XidEvent { xid: 48 });
                }
                Action::EccSbe(n) => st.ecc_sbe_vol = st.ecc_sbe_vol.saturating_add(to_i64(*n)),
                Action::ThermalThrottle {
                    temperature,
                    duration,
                } => st.throttle = Some((*temperature, now + *duration)),
                Action::Utilization { pattern, duration } => {
                    st.utilization = Some((*pattern, now, duration.map(|d| now + d)));
                }
                Action::RowRemapFailure => st.remap_failure = true,
                Action::RetiredPagesPending => st.retired_pending = true,
                Action::PcieReplays(n) => {
                    st.pcie_replays = st.pcie_replays.saturating_add(to_i64(*n))
                }
                Action::NvlinkErrors(n) => {
                    st.nvlink_crc_flit = st.nvlink_crc_flit.saturating_add(to_i64(*n));
                    st.nvlink_replay = st.nvlink_replay.saturating_add(to_i64(n.div_ceil(4)));
                }
            }
        }
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
