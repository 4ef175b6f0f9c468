//! One sample's [`GpuTick`]s, from what the sampler already has: each device's sample (its
//! energy counter and, on MIG GPUs, each instance's engine activity), who holds each GPU and MIG
//! instance (kubelet pod-resources), and, with per-process readings, which container runs what
//! where. Pure.
//!
//! **Allocation shares.** A whole GPU is shared by the device ids allocated on it: one holder of
//! the whole GPU holds all of it; time-sliced or MPS replicas (`GPU-…::N`) count one each out of
//! the replicas the device plugin offers (the kubelet's `GetAllocatableResources`), so the
//! replicas nobody holds are `unallocated`; where the kubelet cannot say (before 1.23), out of
//! the replicas held. A MIG instance
//! is its memory slices out of 8 (`placement`), or else its compute slices (`3g.40gb`: 3) out of
//! 7; within an instance, its holders share it equally. What no instance covers, and instances
//! nobody holds, are unallocated.
//!
//! **Activity.** Without MIG: each process's SM utilisation over the interval (NVML's samples
//! since the last read, averaged per process), summed per container; what no container accounts
//! for is outside pods. On MIG (NVML reads no per-process utilisation there): each instance's
//! graphics engine activity (`DCGM_FI_PROF_GR_ENGINE_ACTIVE`, through GPM on Hopper and newer or
//! DCGM with `-r`) times its share, split inside the instance by the framebuffer its containers'
//! processes use (equally when none is reported; to its holders when processes were not read).
//! When any instance of a GPU has no activity reading, none is used for that GPU: its dynamic
//! energy follows the allocation instead.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::types::{Account, Consumer, GpuTick, Shares};
use crate::catalog::Field;
use crate::gpu::{Device, FieldError, GpuProcess, MigInstance, Value};
use crate::pods::usage::EntityUsage;
use crate::pods::{Attribution, EntityKey, Holder, PodRef};
use crate::snapshot::DeviceOutcome;

/// What the sampler has after attribution.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Each device's outcome.
    pub outcomes: &'a [DeviceOutcome],
    /// Holders per GPU and MIG instance.
    pub attribution: &'a Attribution,
    /// Per-container usage per entity (empty without per-process readings).
    pub usage: &'a BTreeMap<EntityKey, EntityUsage>,
    /// Per device, in `outcomes` order, its processes (empty without per-process readings).
    pub processes: &'a [Option<Result<Vec<GpuProcess>, FieldError>>],
}

/// The share of its GPU a MIG instance holds: memory slices out of 8, else compute slices out
/// of 7, else an equal part of `count` instances.
pub fn instance_share(inst: &MigInstance, count: usize) -> f64 {
    if let Some(p) = inst.placement.filter(|p| p.size > 0) {
        return (f64::from(p.size) / 8.0).min(1.0);
    }
    let digits: String = inst
        .profile
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    match digits.parse::<u32>() {
        Ok(g) if g > 0 && inst.profile[digits.len()..].starts_with('g') => {
            (f64::from(g) / 7.0).min(1.0)
        }
        _ => 1.0 / count.max(1) as f64,
    }
}

/// `share` split among `holders` by the device ids each container holds, out of `replicas`
/// when the kubelet says how many the entity is divided into (what nobody holds stays
/// unallocated), else out of those held.
fn holder_shares(
    gi_id: Option<u32>,
    holders: &[Holder],
    replicas: Option<u32>,
    share: f64,
) -> Vec<(Account, f64)> {
    let mut per: BTreeMap<&PodRef, usize> = BTreeMap::new();
    for h in holders {
        *per.entry(&h.pod).or_default() += 1;
    }
    let held: usize = per.values().sum();
    let offered = replicas.map_or(0, |r| r as usize);
    let shared = holders.iter().all(|h| h.vgpu.is_some());
    let n = if shared { held.max(offered) } else { held };
    per.into_iter()
        .map(|(pod, k)| {
            (
                Account::container(gi_id, pod.clone(), true),
                share * k as f64 / n as f64,
            )
        })
        .collect()
}

/// The ticks of one sample: one per device read.
pub fn ticks(i: Inputs<'_>) -> Vec<GpuTick> {
    Allocations::default().ticks(i, None)
}

/// Each GPU's allocation shares, kept while the attribution and the devices they were made
/// from stay the same: pods change at pod events, not at each sample, so a steady sample hands
/// the ledger the same lists (which it recognises by pointer) without copying a pod's names.
#[derive(Debug, Default)]
pub struct Allocations {
    /// The attribution (by pointer) and device generation the lists were made from.
    from: Option<(Arc<Attribution>, u64)>,
    /// By GPU index.
    lists: HashMap<u32, Shares>,
}

impl Allocations {
    /// The ticks of one sample; `from` names the attribution and device generation `i` comes
    /// from (the same ones reuse the lists made for them; `None` makes them again).
    pub fn ticks(&mut self, i: Inputs<'_>, from: Option<(&Arc<Attribution>, u64)>) -> Vec<GpuTick> {
        let same = match (&self.from, from) {
            (Some((a, g)), Some((b, h))) => Arc::ptr_eq(a, b) && *g == h,
            _ => false,
        };
        if !same {
            self.lists.clear();
            self.from = from.map(|(a, g)| (Arc::clone(a), g));
        }
        let mut out = Vec::new();
        for (n, o) in i.outcomes.iter().enumerate() {
            let Ok(sample) = &o.sample else {
                continue;
            };
            let d = &o.device;
            let index = d.identity.index;
            let processes = match i.processes.get(n) {
                Some(Some(Ok(list))) => Some(list.as_slice()),
                _ => None,
            };
            let allocated = Arc::clone(
                self.lists
                    .entry(index)
                    .or_insert_with(|| allocation(i.attribution, o).into()),
            );
            let mut tick = GpuTick {
                uuid: d.identity.uuid.clone(),
                index,
                energy_mj: sample
                    .get_i64(Field::TotalEnergyConsumption)
                    .and_then(|e| u64::try_from(e).ok()),
                allocated,
                running: processes.map(|_| BTreeSet::new()),
                ..GpuTick::default()
            };
            if d.mig_enabled {
                mig(&mut tick, i, o, processes);
            } else {
                whole(&mut tick, i, index, processes);
            }
            out.push(tick);
        }
        out
    }
}

/// Each MIG instance of `d`: its `GPU_I_ID`, its share of the GPU and the key its holders are
/// filed under.
fn instances(d: &Device) -> impl Iterator<Item = (Option<u32>, f64, EntityKey)> + '_ {
    let count = d.instances.len();
    d.instances.iter().map(move |inst| {
        let key = EntityKey {
            gpu: d.identity.index,
            gi_id: Some(inst.gi_id),
        };
        (key.gi_id, instance_share(inst, count), key)
    })
}

/// Who holds how much of a device: its holders (of the whole GPU, or of each MIG instance by
/// its slices), and the capacity of instances nobody holds or replicas nobody holds.
fn allocation(attribution: &Attribution, o: &DeviceOutcome) -> Vec<(Account, f64)> {
    let d = &o.device;
    if !d.mig_enabled {
        let key = EntityKey {
            gpu: d.identity.index,
            gi_id: None,
        };
        return holder_shares(
            None,
            attribution.holders_of(key),
            attribution.replicas_of(key),
            1.0,
        );
    }
    let mut out = Vec::new();
    for (gi, share, key) in instances(d) {
        let holders = attribution.holders_of(key);
        if holders.is_empty() {
            out.push((Account::unallocated(gi), share));
            continue;
        }
        let shares = holder_shares(gi, holders, attribution.replicas_of(key), share);
        let held: f64 = shares.iter().map(|(_, s)| s).sum();
        if held < share {
            // Replicas of the instance nobody holds.
            out.push((Account::unallocated(gi), share - held));
        }
        out.extend(shares);
    }
    out
}

fn whole(tick: &mut GpuTick, i: Inputs<'_>, index: u32, processes: Option<&[GpuProcess]>) {
    let key = EntityKey {
        gpu: index,
        gi_id: None,
    };
    let holders = i.attribution.holders_of(key);
    let Some(list) = processes else {
        return;
    };
    let holds = |pod: &PodRef| holders.iter().any(|h| &h.pod == pod);
    let mut attributed_sm = 0u64;
    let mut attributed_procs = 0usize;
    if let Some(u) = i.usage.get(&key) {
        for c in &u.containers {
            let a = Account::container(None, c.pod.clone(), holds(&c.pod));
            attributed_procs += c.processes as usize;
            if c.processes > 0 {
                if let Some(r) = tick.running.as_mut() {
                    r.insert(a.clone());
                }
            }
            if let Some(util) = c.utilization {
                attributed_sm += util.sm;
                if util.sm > 0 {
                    tick.busy.push((a, util.sm as f64 / 100.0));
                }
            }
        }
    }
    let total_sm: u64 = list
        .iter()
        .filter_map(|p| p.utilization.map(|u| u64::from(u.sm)))
        .sum();
    let outside = Account {
        gi_id: None,
        consumer: Consumer::OutsidePods,
    };
    if list.len() > attributed_procs {
        if let Some(r) = tick.running.as_mut() {
            r.insert(outside.clone());
        }
    }
    if total_sm > attributed_sm {
        tick.busy
            .push((outside, (total_sm - attributed_sm) as f64 / 100.0));
    }
}

fn mig(tick: &mut GpuTick, i: Inputs<'_>, o: &DeviceOutcome, processes: Option<&[GpuProcess]>) {
    let d = &o.device;
    let Ok(sample) = &o.sample else {
        return;
    };
    let mut busy = Vec::new();
    let mut all_active_known = true;
    for (gi, share, key) in instances(d) {
        let holders = i.attribution.holders_of(key);
        let holds = |pod: &PodRef| holders.iter().any(|h| &h.pod == pod);
        // Who runs here, and their framebuffer.
        let mut users: Vec<(Account, u64)> = Vec::new();
        let mut attributed = 0usize;
        if let Some(u) = i.usage.get(&key) {
            for c in u.containers.iter().filter(|c| c.processes > 0) {
                attributed += c.processes as usize;
                users.push((
                    Account::container(gi, c.pod.clone(), holds(&c.pod)),
                    c.fb_used_bytes.unwrap_or(0),
                ));
            }
        }
        if let Some(list) = processes {
            let here: Vec<&GpuProcess> = list.iter().filter(|p| p.gi_id == gi).collect();
            if here.len() > attributed {
                let fb: u64 = here.iter().filter_map(|p| p.used_memory_bytes).sum::<u64>();
                let attributed_fb: u64 = users.iter().map(|(_, b)| b).sum();
                users.push((
                    Account {
                        gi_id: gi,
                        consumer: Consumer::OutsidePods,
                    },
                    fb.saturating_sub(attributed_fb),
                ));
            }
            if let Some(r) = tick.running.as_mut() {
                r.extend(users.iter().map(|(a, _)| a.clone()));
            }
        }
        let activity = sample
            .instances
            .iter()
            .find(|s| Some(s.gi_id) == gi)
            .and_then(|s| {
                s.readings
                    .iter()
                    .find(|(f, _)| *f == Field::ProfGrEngineActive)
            })
            .and_then(|(_, r)| match r {
                Ok(Value::Float(v)) if v.is_finite() && *v >= 0.0 => Some(v.min(1.0)),
                _ => None,
            });
        let Some(activity) = activity else {
            all_active_known = false;
            continue;
        };
        let inst_busy = activity * share;
        if inst_busy <= 0.0 {
            continue;
        }
        if users.is_empty() {
            // No process seen (not read, or not visible): the instance's holders, or its
            // unallocated capacity.
            if holders.is_empty() {
                busy.push((Account::unallocated(gi), inst_busy));
            } else {
                busy.extend(holder_shares(gi, holders, None, inst_busy));
            }
            continue;
        }
        let fb: u64 = users.iter().map(|(_, b)| b).sum();
        for (a, b) in users.iter() {
            let part = if fb > 0 {
                *b as f64 / fb as f64
            } else {
                1.0 / users.len() as f64
            };
            busy.push((a.clone(), inst_busy * part));
        }
    }
    if all_active_known {
        tick.busy = busy;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pod: &str, vgpu: Option<&str>) -> Holder {
        Holder {
            pod: PodRef {
                namespace: "ml".into(),
                pod: pod.into(),
                container: "main".into(),
            },
            vgpu: vgpu.map(str::to_owned),
            dra: None,
        }
    }

    fn shares(holders: &[Holder], replicas: Option<u32>, share: f64) -> Vec<(String, f64)> {
        holder_shares(Some(3), holders, replicas, share)
            .into_iter()
            .map(|(a, s)| match a.consumer {
                Consumer::Container { pod, holder: true } => (pod.pod, s),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_shared_entity_is_divided_by_the_replicas_offered_and_the_rest_left_unallocated() {
        // One pod holds two of four replicas, another one: 2/4 and 1/4 of the instance's 1/2.
        let h = [
            holder("a", Some("0")),
            holder("a", Some("1")),
            holder("b", Some("2")),
        ];
        assert_eq!(
            shares(&h, Some(4), 0.5),
            vec![("a".into(), 0.25), ("b".into(), 0.125)]
        );
        // The kubelet could not say: among the replicas held.
        let got = shares(&h, None, 0.5);
        assert!((got[0].1 - 1.0 / 3.0).abs() < 1e-12 && (got[1].1 - 1.0 / 6.0).abs() < 1e-12);
        // Fewer offered than held (a stale answer): never more than the whole.
        let got: f64 = shares(&h, Some(2), 0.5).iter().map(|(_, s)| s).sum();
        assert!((got - 0.5).abs() < 1e-12);
        // A whole-entity holder holds all of it, whatever the replica count says.
        assert_eq!(
            shares(&[holder("w", None)], Some(4), 1.0),
            vec![("w".into(), 1.0)]
        );
    }
}
