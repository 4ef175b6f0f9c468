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
use std::sync::Arc;
use std::time::Duration;

use super::types::{Account, Consumer, GpuTick, Shares};

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

/// What the intervals not charged yet (no reading since) have in common; each account's own
/// weights are in its [`Slot`].
#[derive(Debug, Default)]
struct Pending {
    /// Microseconds.
    dt_us: u64,
    /// Whether a process ran in any of them (or, without process readings, anything was busy).
    active: bool,
    /// Energy read but not split yet (a change seen with no time elapsed since the last
    /// reading), millijoules.
    owed_mj: u64,
}

/// One account on one GPU: its totals and its weights in the intervals not charged yet.
#[derive(Debug, Default)]
struct Slot {
    totals: Totals,
    /// Allocation share x seconds since the last charge.
    pending_allocated: f64,
    /// Busy share x seconds since the last charge.
    pending_busy: f64,
}

/// The accounts of one GPU. Slots are kept in arrival order and found through `index`, whose
/// order (by account) is the order they are split and rendered in, so results do not depend on
/// arrival. A sample's allocation list changes only with the pods (the input hands the same
/// list, by pointer, until then): its slots are looked up once and reused, so a steady sample
/// touches each account without a lookup.
#[derive(Debug, Default)]
pub struct Accounts {
    slots: Vec<Slot>,
    index: BTreeMap<Account, usize>,
    /// The last allocation list seen and the slot of each of its entries.
    resolved: Option<(Shares, Vec<usize>)>,
    /// An account came or went (or its labels changed) since the ledger last looked.
    changed: bool,
}

impl Accounts {
    /// Every account with its totals, in account order.
    pub fn iter(&self) -> impl Iterator<Item = (&Account, &Totals)> {
        self.index.iter().map(|(a, &s)| (a, &self.slots[s].totals))
    }

    /// The slot of `a`, made (with the key copied) when the account is new.
    fn slot(&mut self, a: &Account) -> usize {
        if let Some(&s) = self.index.get(a) {
            return s;
        }
        self.slots.push(Slot::default());
        self.index.insert(a.clone(), self.slots.len() - 1);
        self.changed = true;
        self.slots.len() - 1
    }

    /// The slots of `list`'s entries: without a lookup when it is the list seen last.
    fn resolve(&mut self, list: &Shares) -> Vec<usize> {
        if let Some((seen, slots)) = &self.resolved {
            if Arc::ptr_eq(seen, list) {
                return slots.clone();
            }
        }
        let slots: Vec<usize> = list.iter().map(|(a, _)| self.slot(a)).collect();
        self.resolved = Some((Arc::clone(list), slots.clone()));
        slots
    }

    /// Drops the accounts `keep` refuses; slots move, so the resolved list is forgotten.
    fn retain(&mut self, keep: impl Fn(&Slot) -> bool) {
        if self.slots.iter().all(&keep) {
            return;
        }
        let mut moved = vec![None; self.slots.len()];
        let mut kept = Vec::with_capacity(self.slots.len());
        for (i, s) in std::mem::take(&mut self.slots).into_iter().enumerate() {
            if keep(&s) {
                moved[i] = Some(kept.len());
                kept.push(s);
            }
        }
        self.slots = kept;
        self.index.retain(|_, s| match moved[*s] {
            Some(n) => {
                *s = n;
                true
            }
            None => false,
        });
        self.resolved = None;
        self.changed = true;
    }

    /// The slots `w` gives a positive weight, with it, in account order (the split's order).
    fn weights(&self, w: impl Fn(&Slot) -> f64) -> Vec<(usize, f64)> {
        self.index
            .values()
            .map(|&s| (s, w(&self.slots[s])))
            .filter(|(_, w)| *w > 0.0)
            .collect()
    }
}

/// One GPU's state.
#[derive(Debug)]
struct GpuState {
    index: u32,
    last_at: Duration,
    last_energy: Option<u64>,
    pending: Pending,
    learned_idle_mw: Option<u64>,
    accounts: Accounts,
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

/// What the ledger says about one GPU (a copy, for tests and checks).
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
    pub accounts: &'a Accounts,
}

/// The accounts of every GPU.
#[derive(Debug)]
pub struct Ledger {
    idle_mw_flag: Option<u64>,
    retention: Duration,
    gpus: BTreeMap<String, GpuState>,
    /// Bumped by each record that adds or drops an account or a GPU.
    generation: u64,
}

impl Ledger {
    /// A ledger; `idle_mw_flag` fixes the idle power of every GPU (else it is learnt);
    /// accounts that have not grown for `retention` (a pod long gone) are dropped.
    pub fn new(idle_mw_flag: Option<u64>, retention: Duration) -> Self {
        Self {
            idle_mw_flag,
            retention,
            gpus: BTreeMap::new(),
            generation: 0,
        }
    }

    /// Changes when the set of accounts (or a GPU's labels) does: a rendering of the totals
    /// made at one generation has the same series as any later one of that generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Advances every GPU of `ticks` to `at` (the sample's time, monotonic). GPUs not in
    /// `ticks` keep their baseline and pending weights (their time passes uncharged).
    pub fn record(&mut self, at: Duration, ticks: &[GpuTick]) {
        let mut changed = false;
        for tick in ticks {
            let idle_flag = self.idle_mw_flag;
            if !self.gpus.contains_key(&tick.uuid) {
                changed = true;
                self.gpus.insert(
                    tick.uuid.clone(),
                    GpuState {
                        index: tick.index,
                        last_at: at,
                        last_energy: None,
                        pending: Pending::default(),
                        learned_idle_mw: None,
                        accounts: Accounts::default(),
                        seen: at,
                    },
                );
            }
            let Some(gpu) = self.gpus.get_mut(&tick.uuid) else {
                continue;
            };
            if gpu.index != tick.index {
                gpu.index = tick.index;
                gpu.accounts.changed = true;
                for s in &mut gpu.accounts.slots {
                    s.totals.labels = LabelCache::default();
                }
            }
            gpu.seen = at;
            let dt = at.saturating_sub(gpu.last_at);
            gpu.last_at = at;
            gpu.advance(dt, at, tick, idle_flag);
        }
        let retention = self.retention;
        let before = self.gpus.len();
        self.gpus
            .retain(|_, g| at.saturating_sub(g.seen) < retention || g.seen == at);
        changed |= self.gpus.len() != before;
        for gpu in self.gpus.values_mut() {
            if gpu.seen != at {
                // Not read this tick: its time passes uncharged.
                gpu.last_at = at;
            }
            // An account with weights not charged yet stays until they are.
            gpu.accounts.retain(|s| {
                at.saturating_sub(s.totals.last_change) < retention
                    || s.pending_allocated > 0.0
                    || s.pending_busy > 0.0
            });
            changed |= std::mem::take(&mut gpu.accounts.changed);
        }
        if changed {
            self.generation += 1;
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
                        accounts: v
                            .accounts
                            .iter()
                            .map(|(a, t)| (a.clone(), t.clone()))
                            .collect(),
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
            accounts: &g.accounts,
        })
    }
}

impl GpuState {
    fn advance(&mut self, dt: Duration, at: Duration, tick: &GpuTick, idle_flag: Option<u64>) {
        let secs = dt.as_secs_f64();
        let accounts = &mut self.accounts;
        if !dt.is_zero() {
            let held: f64 = tick.allocated.iter().map(|(_, s)| *s).sum();
            let slots = accounts.resolve(&tick.allocated);
            let rest = (held < 1.0).then(|| {
                let a = Account::unallocated(None);
                (accounts.slot(&a), a, 1.0 - held)
            });
            let listed = tick
                .allocated
                .iter()
                .zip(slots)
                .map(|((a, share), s)| (s, a, *share));
            for (s, a, share) in listed.chain(rest.iter().map(|(s, a, r)| (*s, a, *r))) {
                if share <= 0.0 {
                    continue;
                }
                let waste = matches!(a.consumer, Consumer::Container { holder: true, .. })
                    && tick.running.as_ref().is_some_and(|r| !r.contains(a));
                let slot = &mut accounts.slots[s];
                slot.totals.last_change = at;
                slot.totals.allocated_gpu_seconds += share * secs;
                if waste {
                    slot.totals.idle_allocated_gpu_seconds += share * secs;
                }
                slot.pending_allocated += share * secs;
            }
            for (a, busy) in &tick.busy {
                if *busy <= 0.0 {
                    continue;
                }
                let s = accounts.slot(a);
                let slot = &mut accounts.slots[s];
                slot.totals.last_change = at;
                slot.totals.busy_gpu_seconds += busy * secs;
                slot.pending_busy += busy * secs;
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
            self.accounts.settle();
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
            accounts,
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
        let allocated = accounts.weights(|s| s.pending_allocated);
        let busy = accounts.weights(|s| s.pending_busy);
        let mut charge = |s: Option<usize>, mj: u64| {
            if mj == 0 {
                return;
            }
            let s = s.unwrap_or_else(|| accounts.slot(&Account::unallocated(None)));
            let t = &mut accounts.slots[s].totals;
            t.last_change = at;
            t.energy_mj = t.energy_mj.saturating_add(mj);
        };
        split_each(static_mj, &allocated, &mut charge);
        let dynamic_by = if busy.is_empty() { &allocated } else { &busy };
        split_each(dynamic_mj, dynamic_by, &mut charge);
        accounts.settle();
        *pending = Pending::default();
    }
}

impl Accounts {
    /// Starts the next interval: every account's weights back to zero.
    fn settle(&mut self) {
        for s in &mut self.slots {
            s.pending_allocated = 0.0;
            s.pending_busy = 0.0;
        }
    }
}

/// `total` split by `weights` in whole units, exactly: each gets the floor of its quota and
/// the units left go to the largest remainders (ties to the first). Weights are made integers
/// first, so the split is exact and deterministic. No positive weight: all to the
/// unallocated account of the whole GPU.
pub fn split(total: u64, weights: &BTreeMap<Account, f64>) -> Vec<(Account, u64)> {
    let listed: Vec<(&Account, f64)> = weights.iter().map(|(a, w)| (a, *w)).collect();
    let mut out = Vec::new();
    split_each(total, &listed, |a, n| {
        out.push((
            a.map_or_else(|| Account::unallocated(None), Clone::clone),
            n,
        ));
    });
    out
}

/// [`split`] over any keys, handing each key's units to `f` in `weights` order; `None` is
/// the unallocated account of the whole GPU (no positive weight).
pub fn split_each<K: Copy>(total: u64, weights: &[(K, f64)], mut f: impl FnMut(Option<K>, u64)) {
    const SCALE: f64 = (1u64 << 40) as f64;
    let positive = |w: f64| w.is_finite() && w > 0.0;
    let sum: f64 = weights
        .iter()
        .map(|(_, w)| *w)
        .filter(|w| positive(*w))
        .sum();
    if total == 0 {
        return;
    }
    if sum <= 0.0 || !sum.is_finite() {
        f(None, total);
        return;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let ints: Vec<(K, u128)> = weights
        .iter()
        .filter(|(_, w)| positive(*w))
        .map(|(k, w)| (*k, ((w / sum) * SCALE).round().max(1.0) as u128))
        .collect();
    let denom: u128 = ints.iter().map(|(_, w)| w).sum();
    let total128 = u128::from(total);
    let mut out: Vec<(K, u64, u128)> = ints
        .iter()
        .map(|(k, w)| {
            let q = total128 * w;
            (*k, u64::try_from(q / denom).unwrap_or(u64::MAX), q % denom)
        })
        .collect();
    let given: u64 = out.iter().map(|(_, n, _)| n).sum();
    let mut left = total - given;
    if left > 0 {
        let mut order: Vec<usize> = (0..out.len()).collect();
        order.sort_by(|&a, &b| out[b].2.cmp(&out[a].2).then(a.cmp(&b)));
        for i in order {
            if left == 0 {
                break;
            }
            out[i].1 += 1;
            left -= 1;
        }
    }
    for (k, n, _) in out {
        f(Some(k), n);
    }
}

#[cfg(test)]
mod tests;
