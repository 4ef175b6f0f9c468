//! Conservation and monotonicity of the ledger over random histories: pods that come and go
//! between samples, time-sliced and MIG shares, readings that go missing, counters that reset
//! or wrap, GPUs that vanish and come back.

// Parallel per-GPU vectors (counter, oracle, baseline) are indexed by GPU.
#![allow(clippy::needless_range_loop)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::ledger::Ledger;
use super::types::{Account, Consumer, GpuTick};
use crate::pods::PodRef;

/// One GPU's reading at one step.
#[derive(Debug, Clone)]
enum Reading {
    /// The counter grew by this much.
    Grow(u64),
    /// The counter restarted from 0 and counted this much since.
    Reset(u64),
    /// No reading.
    Missing,
    /// The GPU is not read at all (off the bus).
    Absent,
}

fn reading() -> impl Strategy<Value = Reading> {
    prop_oneof![
        6 => (0u64..5_000_000).prop_map(Reading::Grow),
        1 => (0u64..5_000_000).prop_map(Reading::Reset),
        1 => Just(Reading::Missing),
        1 => Just(Reading::Absent),
    ]
}

fn account() -> impl Strategy<Value = Account> {
    (0u8..6, prop::option::of(0u32..3), any::<bool>()).prop_map(|(p, gi, holder)| match p {
        0 => Account::unallocated(gi),
        1 => Account {
            gi_id: gi,
            consumer: Consumer::OutsidePods,
        },
        n => Account::container(
            gi,
            PodRef {
                namespace: "ns".into(),
                pod: format!("pod-{n}"),
                container: "c".into(),
            },
            holder,
        ),
    })
}

#[derive(Debug, Clone)]
struct Step {
    dt_ms: u64,
    readings: Vec<Reading>,
    allocated: Vec<(Account, f64)>,
    busy: Vec<(Account, f64)>,
    running: Option<Vec<Account>>,
}

fn step(gpus: usize) -> impl Strategy<Value = Step> {
    (
        0u64..30_000,
        prop::collection::vec(reading(), gpus),
        prop::collection::vec((account(), 0.0f64..0.6), 0..4),
        prop::collection::vec((account(), 0.0f64..1.0), 0..4),
        prop::option::of(prop::collection::vec(account(), 0..3)),
    )
        .prop_map(|(dt_ms, readings, allocated, busy, running)| Step {
            dt_ms,
            readings,
            allocated,
            busy,
            running,
        })
}

fn history() -> impl Strategy<Value = (usize, Option<u64>, Vec<Step>)> {
    (1usize..4, prop::option::of(0u64..400_000)).prop_flat_map(|(gpus, idle)| {
        (
            Just(gpus),
            Just(idle),
            prop::collection::vec(step(gpus), 1..40),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn energy_adds_up_to_the_gpus_own_counter_and_no_counter_decreases(
        (gpus, idle, steps) in history(),
        start in 0u64..(u64::MAX / 2),
    ) {
        // Retention longer than any history: nothing is dropped, so sums are comparable.
        let mut ledger = Ledger::new(idle.map(|w| w * 1000), Duration::from_secs(1_000_000));
        let uuid = |g: usize| format!("GPU-{g}");
        let mut counter: Vec<u64> = vec![start; gpus];
        // The oracle: what the GPU's own counter rose by since the ledger's first reading,
        // counting a reset as Prometheus' increase() does (the new value).
        let mut oracle: Vec<u64> = vec![0; gpus];
        let mut baseline: Vec<bool> = vec![false; gpus];
        // A change seen at a reading is charged only when the time since the last reading
        // is not zero; pending ones wait.
        let mut last_read: Vec<Option<u64>> = vec![None; gpus];
        let mut now = Duration::ZERO;
        let mut before: BTreeMap<(String, Account), (u64, f64, f64, f64)> = BTreeMap::new();
        // An allocation that does not change is the same list, as the input hands it: the
        // ledger's reuse of its lookups is exercised with every other path.
        let mut allocated: Arc<[(Account, f64)]> = Arc::from(Vec::new());
        for s in &steps {
            if allocated[..] != s.allocated[..] {
                allocated = s.allocated.clone().into();
            }
            now += Duration::from_millis(s.dt_ms);
            let mut ticks = Vec::new();
            for g in 0..gpus {
                let energy = match s.readings[g] {
                    Reading::Grow(d) => {
                        counter[g] = counter[g].wrapping_add(d);
                        Some(counter[g])
                    }
                    Reading::Reset(v) => {
                        counter[g] = v;
                        Some(v)
                    }
                    Reading::Missing => None,
                    Reading::Absent => continue,
                };
                ticks.push(GpuTick {
                    uuid: uuid(g),
                    index: g as u32,
                    energy_mj: energy,
                    allocated: Arc::clone(&allocated),
                    busy: s.busy.clone(),
                    running: s.running.as_ref().map(|r| r.iter().cloned().collect()),
                });
            }
            ledger.record(now, &ticks);
            for t in &ticks {
                let g: usize = t.uuid[4..].parse().unwrap();
                if let Some(e) = t.energy_mj {
                    if baseline[g] {
                        if let Some(prev) = last_read[g] {
                            oracle[g] += if e >= prev { e - prev } else { e };
                        }
                    }
                    baseline[g] = true;
                    last_read[g] = Some(e);
                }
            }
            // No counter of any account ever decreases.
            let accounts = ledger.accounts();
            for (u, ga) in &accounts {
                for (a, t) in &ga.accounts {
                    let now_v = (t.energy_mj, t.allocated_gpu_seconds, t.busy_gpu_seconds, t.idle_allocated_gpu_seconds);
                    if let Some(b) = before.get(&(u.clone(), a.clone())) {
                        prop_assert!(now_v.0 >= b.0 && now_v.1 >= b.1 && now_v.2 >= b.2 && now_v.3 >= b.3,
                            "{u} {a:?}: {b:?} -> {now_v:?}");
                    }
                    before.insert((u.clone(), a.clone()), now_v);
                }
            }
        }
        // One last reading of every GPU, a second later and unchanged, so that nothing is left
        // pending (a change read with no time elapsed waits for the next interval).
        now += Duration::from_secs(1);
        let flush: Vec<GpuTick> = (0..gpus)
            .map(|g| GpuTick {
                uuid: uuid(g),
                index: g as u32,
                energy_mj: Some(counter[g]),
                ..GpuTick::default()
            })
            .collect();
        ledger.record(now, &flush);
        for g in 0..gpus {
            if let (true, Some(prev)) = (baseline[g], last_read[g]) {
                let e = counter[g];
                oracle[g] += if e >= prev { e - prev } else { e };
            }
        }
        // Conservation, to the millijoule: the accounts of each GPU add up to its counter's
        // increase since the ledger's first reading of it.
        let accounts = ledger.accounts();
        for g in 0..gpus {
            let charged: u128 = accounts
                .get(&uuid(g))
                .map(|a| a.accounts.values().map(|t| u128::from(t.energy_mj)).sum())
                .unwrap_or(0);
            prop_assert_eq!(charged, u128::from(oracle[g]), "GPU {}", g);
        }
    }
}
