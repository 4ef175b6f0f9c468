//! The ledger: per GPU, the running totals of every account, advanced once per fresh sample.
//! Pure: time comes in as an argument, nothing is read here.
//!
//! **Energy is conserved to the millijoule.** For each GPU, the energy charged in an interval is
//! exactly the change of the GPU's own counter over it, split in whole millijoules (largest
//! remainders, in integers), so the accounts of a GPU always add up to the counter's increase
//! since the exporter's first reading of it:
//!
//! - the first reading of a GPU only sets the baseline;
//! - a reading below the last one is a reset (the driver reloaded, the counter wrapped): the
//!   interval's energy is the new reading (what the GPU counted since it restarted), as
//!   Prometheus' `increase()` counts it on the GPU's own series;
//! - an interval without a reading (a failed read, a GPU off the bus) charges nothing yet: its
//!   weights are kept, and the next reading's change is split over all the intervals since the
//!   last reading, each with its own weights (a pod that left in between is still charged for
//!   its part).
//!
//! **The split of one change.** A static part, `idle power x time` (capped at the change),
//! follows the allocation: each holder's share of the GPU (a whole GPU, the time-sliced
//! replicas it holds, its MIG slices) times the time it held it, the rest to `unallocated`. The
//! dynamic part, the rest of the change, follows the measured activity (SM busy time of each
//! container's and each outside process, or a MIG instance's engine activity); with no activity
//! measured it follows the allocation too. Idle power is the flag's value, or else the lowest
//! power the GPU's own counter showed over an interval of at least a second in which no process
//! ran on it (with process readings; without them, in which nothing was measured busy).

use std::collections::BTreeMap;
use std::time::Duration;

use super::types::{Account, Consumer, GpuTick};

/// An interval must be this long to teach the idle power (shorter ones are too noisy).
const IDLE_LEARN_MIN: Duration = Duration::from_secs(1);

/// The running totals of one account on one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Energy charged, millijoules.
    pub energy_mj: u64,
    /// Allocated GPU-seconds: share of the GPU held x seconds.
    pub allocated_gpu_seconds: f64,
    /// SM-busy GPU-seconds measured (utilisation x seconds).
    pub busy_gpu_seconds: f64,
    /// Allocated GPU-seconds in which the account ran no process on it (waste).
    pub idle_allocated_gpu_seconds: f64,
    /// When any of them last grew.
    last_change: Duration,
    /// The account's label set as the metrics render it, made on first use.
    labels: LabelCache,
}

impl Totals {
    /// The account's rendered label set, made by `make` the first time (the labels of an
    /// account never change while it lives: its GPU's index, UUID and the node do not; a
    /// renumbered GPU's accounts are made again).
    pub fn labels(&self, make: impl FnOnce() -> String) -> &str {
        self.labels.0.get_or_init(|| make().into_boxed_str())
    }
}

/// A cache, not part of the totals: equal whatever it holds.
#[derive(Debug, Clone, Default)]
struct LabelCache(std::cell::OnceCell<Box<str>>);

impl PartialEq for LabelCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The weights of the intervals not charged yet (no reading since).
#[derive(Debug, Default)]
struct Pending {
    /// Microseconds.
    dt_us: u64,
    /// Allocation share x seconds.
    allocated: BTreeMap<Account, f64>,
    /// Busy share x seconds.
    busy: BTreeMap<Account, f64>,
    /// Whether a process ran in any of them (or, without process readings, anything was busy).
    active: bool,
    /// Energy read but not split yet (a change seen with no time elapsed since the last
    /// reading), millijoules.
    owed_mj: u64,
}

/// One GPU's state.
#[derive(Debug)]
struct GpuState {
    index: u32,
    last_at: Duration,
    last_energy: Option<u64>,
    pending: Pending,
    learned_idle_mw: Option<u64>,
    totals: BTreeMap<Account, Totals>,
    seen: Duration,
}

/// How the idle power of a GPU is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleSource {
    /// `--accounting-idle-power-watts`.
    Flag,
    /// Learnt from the GPU's own energy counter over intervals without processes.
    Measured,
}

impl IdleSource {
    /// The `source` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleSource::Flag => "flag",
            IdleSource::Measured => "measured",
        }
    }
}

/// What the ledger says about one GPU (for the self-metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuAccounts {
    /// GPU index.
    pub index: u32,
    /// The idle power used for the static part, milliwatts, and how it is known.
    pub idle_mw: Option<(u64, IdleSource)>,
    /// Every account with its totals.
    pub accounts: BTreeMap<Account, Totals>,
}

/// One GPU's accounts, borrowed from the ledger.
#[derive(Debug, Clone, Copy)]
pub struct GpuView<'a> {
    /// Its UUID.
    pub uuid: &'a str,
    /// GPU index.
    pub index: u32,
    /// The idle power used for the static part, milliwatts, and how it is known.
    pub idle_mw: Option<(u64, IdleSource)>,
    /// Every account with its totals.
    pub accounts: &'a BTreeMap<Account, Totals>,
}

/// The accounts of every GPU.
#[derive(Debug)]
pub struct Ledger {
    idle_mw_flag: Option<u64>,
    retention: Duration,
    gpus: BTreeMap<String, GpuState>,
}

impl Ledger {
    /// A ledger; `idle_mw_flag` fixes the idle power of every GPU (else it is learnt);
    /// accounts that have not grown for `retention` (a pod long gone) are dropped.
    pub fn new(idle_mw_flag: Option<u64>, retention: Duration) -> Self {
        Self {
            idle_mw_flag,
            retention,
            gpus: BTreeMap::new(),
        }
    }

    /// Advances every GPU of `ticks` to `at` (the sample's time, monotonic). GPUs not in
    /// `ticks` keep their baseline and pending weights (their time passes uncharged).
    pub fn record(&mut self, at: Duration, ticks: &[GpuTick]) {
        for tick in ticks {
            let idle_flag = self.idle_mw_flag;
            let gpu = self
                .gpus
                .entry(tick.uuid.clone())
                .or_insert_with(|| GpuState {
                    index: tick.index,
                    last_at: at,
                    last_energy: None,
                    pending: Pending::default(),
                    learned_idle_mw: None,
                    totals: BTreeMap::new(),
                    seen: at,
                });
            if gpu.index != tick.index {
                gpu.index = tick.index;
                for t in gpu.totals.values_mut() {
                    t.labels = LabelCache::default();
                }
            }
            gpu.seen = at;
            let dt = at.saturating_sub(gpu.last_at);
            gpu.last_at = at;
            gpu.advance(dt, at, tick, idle_flag);
        }
        let retention = self.retention;
        self.gpus
            .retain(|_, g| at.saturating_sub(g.seen) < retention || g.seen == at);
        for gpu in self.gpus.values_mut() {
            if gpu.seen != at {
                // Not read this tick: its time passes uncharged.
                gpu.last_at = at;
            }
            gpu.totals
                .retain(|_, t| at.saturating_sub(t.last_change) < retention);
        }
    }

    /// Every GPU's accounts, by UUID (a copy).
    pub fn accounts(&self) -> BTreeMap<String, GpuAccounts> {
        self.view()
            .map(|v| {
                (
                    v.uuid.to_owned(),
                    GpuAccounts {
                        index: v.index,
                        idle_mw: v.idle_mw,
                        accounts: v.accounts.clone(),
                    },
                )
            })
            .collect()
    }

    /// Every GPU's accounts, borrowed, in UUID order (what the metrics render, without a copy).
    pub fn view(&self) -> impl Iterator<Item = GpuView<'_>> {
        self.gpus.iter().map(|(uuid, g)| GpuView {
            uuid,
            index: g.index,
            idle_mw: match (self.idle_mw_flag, g.learned_idle_mw) {
                (Some(w), _) => Some((w, IdleSource::Flag)),
                (None, Some(w)) => Some((w, IdleSource::Measured)),
                (None, None) => None,
            },
            accounts: &g.totals,
        })
    }
}

impl GpuState {
    fn advance(&mut self, dt: Duration, at: Duration, tick: &GpuTick, idle_flag: Option<u64>) {
        let secs = dt.as_secs_f64();
        if !dt.is_zero() {
            let held: f64 = tick.allocated.iter().map(|(_, s)| *s).sum();
            let rest = (held < 1.0).then(|| (Account::unallocated(None), 1.0 - held));
            for (a, share) in tick.allocated.iter().chain(rest.iter()) {
                if *share <= 0.0 {
                    continue;
                }
                let waste = matches!(a.consumer, Consumer::Container { holder: true, .. })
                    && tick.running.as_ref().is_some_and(|r| !r.contains(a));
                touch(&mut self.totals, a, at, |t| {
                    t.allocated_gpu_seconds += share * secs;
                    if waste {
                        t.idle_allocated_gpu_seconds += share * secs;
                    }
                });
                add(&mut self.pending.allocated, a, share * secs);
            }
            for (a, busy) in &tick.busy {
                if *busy <= 0.0 {
                    continue;
                }
                touch(&mut self.totals, a, at, |t| {
                    t.busy_gpu_seconds += busy * secs
                });
                add(&mut self.pending.busy, a, busy * secs);
            }
            self.pending.dt_us = self
                .pending
                .dt_us
                .saturating_add(u64::try_from(dt.as_micros()).unwrap_or(u64::MAX));
            let active = match &tick.running {
                Some(r) => !r.is_empty(),
                None => tick.busy.iter().any(|(_, b)| *b > 0.0),
            };
            self.pending.active |= active;
        }
        let Some(energy) = tick.energy_mj else {
            return;
        };
        let Some(last) = self.last_energy.replace(energy) else {
            // The first reading: the baseline.
            self.pending = Pending::default();
            return;
        };
        let change = if energy >= last {
            energy - last
        } else {
            energy
        };
        self.pending.owed_mj = self.pending.owed_mj.saturating_add(change);
        if self.pending.dt_us == 0 {
            // Two readings at one instant: no time to split over; the change waits for the
            // next interval.
            return;
        }
        let GpuState {
            pending,
            totals,
            learned_idle_mw,
            ..
        } = self;
        let delta = pending.owed_mj;
        if !pending.active && pending.dt_us >= IDLE_LEARN_MIN.as_micros() as u64 {
            let mw = u64::try_from(u128::from(delta) * 1_000_000 / u128::from(pending.dt_us))
                .unwrap_or(u64::MAX);
            *learned_idle_mw = Some(learned_idle_mw.map_or(mw, |m| m.min(mw)));
        }
        let idle_mw = idle_flag.or(*learned_idle_mw).unwrap_or(0);
        let static_mj = u64::try_from(
            (u128::from(idle_mw) * u128::from(pending.dt_us) / 1_000_000).min(u128::from(delta)),
        )
        .unwrap_or(delta);
        let dynamic_mj = delta - static_mj;
        let mut charge = |a: &Account, mj: u64| {
            if mj > 0 {
                touch(totals, a, at, |t| {
                    t.energy_mj = t.energy_mj.saturating_add(mj)
                });
            }
        };
        split_each(static_mj, &pending.allocated, &mut charge);
        if pending.busy.values().any(|b| *b > 0.0) {
            split_each(dynamic_mj, &pending.busy, &mut charge);
        } else {
            split_each(dynamic_mj, &pending.allocated, &mut charge);
        }
        pending.settle();
    }
}

impl Pending {
    /// Starts the next interval. The accounts weighed in this one keep their entries (at
    /// zero), so the next interval finds them without copying their keys again; those not
    /// weighed in this one (a pod gone) are dropped.
    fn settle(&mut self) {
        for m in [&mut self.allocated, &mut self.busy] {
            m.retain(|_, w| {
                let keep = *w > 0.0;
                *w = 0.0;
                keep
            });
        }
        self.dt_us = 0;
        self.active = false;
        self.owed_mj = 0;
    }
}

/// Applies `f` to the totals of `a`, marked as changed at `at`: one lookup, and the key is
/// copied only when the account is new.
fn touch(
    map: &mut BTreeMap<Account, Totals>,
    a: &Account,
    at: Duration,
    f: impl FnOnce(&mut Totals),
) {
    if let Some(t) = map.get_mut(a) {
        t.last_change = at;
        f(t);
        return;
    }
    let mut t = Totals {
        last_change: at,
        ..Totals::default()
    };
    f(&mut t);
    map.insert(a.clone(), t);
}

/// Adds `w` to the pending weight of `a` (the key copied only when new).
fn add(map: &mut BTreeMap<Account, f64>, a: &Account, w: f64) {
    match map.get_mut(a) {
        Some(v) => *v += w,
        None => {
            map.insert(a.clone(), w);
        }
    }
}

/// `total` split by `weights` in whole units, exactly: each gets the floor of its quota and
/// the units left go to the largest remainders (ties to the first). Weights are made integers
/// first, so the split is exact and deterministic. No positive weight: all to the
/// unallocated account of the whole GPU.
pub fn split(total: u64, weights: &BTreeMap<Account, f64>) -> Vec<(Account, u64)> {
    let mut out = Vec::new();
    split_each(total, weights, |a, n| out.push((a.clone(), n)));
    out
}

/// [`split`], handing each account's units to `f` (nothing is copied).
pub fn split_each(total: u64, weights: &BTreeMap<Account, f64>, mut f: impl FnMut(&Account, u64)) {
    const SCALE: f64 = (1u64 << 40) as f64;
    let sum: f64 = weights
        .values()
        .filter(|w| w.is_finite() && **w > 0.0)
        .sum();
    if total == 0 {
        return;
    }
    if sum <= 0.0 || !sum.is_finite() {
        f(&Account::unallocated(None), total);
        return;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let ints: Vec<(&Account, u128)> = weights
        .iter()
        .filter(|(_, w)| w.is_finite() && **w > 0.0)
        .map(|(a, w)| (a, ((w / sum) * SCALE).round().max(1.0) as u128))
        .collect();
    let denom: u128 = ints.iter().map(|(_, w)| w).sum();
    let total128 = u128::from(total);
    let mut out: Vec<(&Account, u64, u128)> = ints
        .iter()
        .map(|(a, w)| {
            let q = total128 * w;
            (*a, u64::try_from(q / denom).unwrap_or(u64::MAX), q % denom)
        })
        .collect();
    let given: u64 = out.iter().map(|(_, n, _)| n).sum();
    let mut left = total - given;
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|&a, &b| out[b].2.cmp(&out[a].2).then(a.cmp(&b)));
    for i in order {
        if left == 0 {
            break;
        }
        out[i].1 += 1;
        left -= 1;
    }
    for (a, n, _) in out {
        f(a, n);
    }
}

#[cfg(test)]
mod tests;
