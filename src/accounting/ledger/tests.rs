use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::accounting::types::{Account, Consumer, GpuTick};
use crate::pods::PodRef;

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "ml".into(),
        pod: name.into(),
        container: "main".into(),
    }
}

fn holder(name: &str) -> Account {
    Account::container(None, pod(name), true)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn tick(energy: Option<u64>, allocated: &[(Account, f64)], busy: &[(Account, f64)]) -> GpuTick {
    GpuTick {
        uuid: "GPU-a".into(),
        index: 0,
        energy_mj: energy,
        allocated: allocated.to_vec().into(),
        busy: busy.to_vec(),
        running: Some(
            busy.iter()
                .filter(|(_, b)| *b > 0.0)
                .map(|(a, _)| a.clone())
                .collect(),
        ),
    }
}

fn energy(l: &Ledger) -> BTreeMap<Account, u64> {
    l.accounts()["GPU-a"]
        .accounts
        .iter()
        .map(|(a, t)| (a.clone(), t.energy_mj))
        .collect()
}

#[test]
fn split_is_exact_in_whole_units_and_gives_the_rest_to_the_largest_remainders() {
    let w = |v: &[(&str, f64)]| -> BTreeMap<Account, f64> {
        v.iter().map(|(n, x)| (holder(n), *x)).collect()
    };
    let got: BTreeMap<Account, u64> = split(10, &w(&[("a", 1.0), ("b", 1.0), ("c", 1.0)]))
        .into_iter()
        .collect();
    assert_eq!(got.values().sum::<u64>(), 10);
    assert_eq!(got[&holder("a")], 4, "{got:?}");
    let got: BTreeMap<Account, u64> = split(1000, &w(&[("a", 0.25), ("b", 0.75)]))
        .into_iter()
        .collect();
    assert_eq!((got[&holder("a")], got[&holder("b")]), (250, 750));
    assert!(split(0, &w(&[("a", 1.0)])).is_empty());
    // Nobody to charge: all of it to the unallocated capacity.
    assert_eq!(
        split(7, &w(&[("a", 0.0)])),
        vec![(Account::unallocated(None), 7)]
    );
    assert_eq!(
        split(u64::MAX, &w(&[("a", 1.0), ("b", 2.0)]))
            .iter()
            .map(|(_, n)| u128::from(*n))
            .sum::<u128>(),
        u128::from(u64::MAX)
    );
}

#[test]
fn two_time_sliced_pods_busy_25_and_75_percent_split_the_dynamic_energy_25_75() {
    // Idle 100 W (flag). 10 s at 400 W: 4,000 J; static 1,000 J split by allocation (half
    // each), dynamic 3,000 J by busy time (25 / 75).
    let mut l = Ledger::new(Some(100_000), secs(600));
    let shares = [(holder("a"), 0.5), (holder("b"), 0.5)];
    let busy = [(holder("a"), 0.25), (holder("b"), 0.75)];
    l.record(secs(0), &[tick(Some(1_000_000), &shares, &busy)]);
    l.record(secs(10), &[tick(Some(5_000_000), &shares, &busy)]);
    let e = energy(&l);
    assert_eq!(e[&holder("a")], 500_000 + 750_000);
    assert_eq!(e[&holder("b")], 500_000 + 2_250_000);
    assert_eq!(e.values().sum::<u64>(), 4_000_000);
    let t = &l.accounts()["GPU-a"].accounts[&holder("a")];
    assert!((t.allocated_gpu_seconds - 5.0).abs() < 1e-9);
    assert!((t.busy_gpu_seconds - 2.5).abs() < 1e-9);
    assert_eq!(t.idle_allocated_gpu_seconds, 0.0);
}

#[test]
fn an_idle_holder_is_charged_static_energy_only_and_accrues_waste() {
    // Pod "idle" holds half the GPU and runs nothing; "busy" holds the other half, 50 % busy.
    let mut l = Ledger::new(Some(50_000), secs(600));
    let shares = [(holder("idle"), 0.5), (holder("busy"), 0.5)];
    let busy = [(holder("busy"), 0.5)];
    l.record(secs(0), &[tick(Some(0), &shares, &busy)]);
    l.record(secs(20), &[tick(Some(3_000_000), &shares, &busy)]);
    let e = energy(&l);
    // Static: 50 W x 20 s = 1,000 J, half each; the dynamic 2,000 J all to the busy pod.
    assert_eq!(e[&holder("idle")], 500_000);
    assert_eq!(e[&holder("busy")], 2_500_000);
    let t = &l.accounts()["GPU-a"].accounts[&holder("idle")];
    assert!((t.idle_allocated_gpu_seconds - 10.0).abs() < 1e-9, "{t:?}");
    let t = &l.accounts()["GPU-a"].accounts[&holder("busy")];
    assert_eq!(t.idle_allocated_gpu_seconds, 0.0);
}

#[test]
fn a_counter_reset_charges_the_new_reading_and_a_missing_reading_waits_for_the_next() {
    let mut l = Ledger::new(Some(0), secs(600));
    let a = [(holder("a"), 1.0)];
    let b = [(holder("b"), 1.0)];
    l.record(secs(0), &[tick(Some(9_000), &a, &[])]);
    // Missing for one interval in which pod "a" held the GPU, then "b" holds it and the
    // reading is back: the change is split over both intervals (10 s each).
    l.record(secs(10), &[tick(None, &a, &[])]);
    l.record(secs(20), &[tick(Some(11_000), &b, &[])]);
    let e = energy(&l);
    assert_eq!((e[&holder("a")], e[&holder("b")]), (1_000, 1_000));
    // The driver reloads: the counter restarts; what it counted since is charged.
    l.record(secs(30), &[tick(Some(700), &b, &[])]);
    let e = energy(&l);
    assert_eq!(e[&holder("b")], 1_700);
    assert_eq!(e.values().sum::<u64>(), 2_000 + 700);
}

#[test]
fn idle_power_is_learnt_from_intervals_without_processes_and_the_flag_wins() {
    let mut l = Ledger::new(None, secs(600));
    let none = tick(Some(0), &[], &[]);
    l.record(secs(0), std::slice::from_ref(&none));
    // 10 s with no process: 60 W.
    l.record(secs(10), &[tick(Some(600_000), &[], &[])]);
    let g = &l.accounts()["GPU-a"];
    assert_eq!(g.idle_mw, Some((60_000, IdleSource::Measured)));
    // All of it to the unallocated capacity: nobody held the GPU.
    assert_eq!(g.accounts[&Account::unallocated(None)].energy_mj, 600_000);
    // A busy interval at a higher power does not raise it.
    let a = [(holder("a"), 1.0)];
    l.record(
        secs(20),
        &[tick(Some(2_600_000), &a, &[(holder("a"), 1.0)])],
    );
    assert_eq!(
        l.accounts()["GPU-a"].idle_mw,
        Some((60_000, IdleSource::Measured))
    );
    let l = Ledger::new(Some(75_000), secs(600));
    let mut l2 = l;
    l2.record(secs(0), std::slice::from_ref(&none));
    assert_eq!(
        l2.accounts()["GPU-a"].idle_mw,
        Some((75_000, IdleSource::Flag))
    );
}

#[test]
fn work_outside_pods_is_charged_to_its_own_account_and_gone_pods_are_dropped_after_retention() {
    let mut l = Ledger::new(Some(0), secs(60));
    let outside = Account {
        gi_id: None,
        consumer: Consumer::OutsidePods,
    };
    let a = [(holder("a"), 1.0)];
    l.record(secs(0), &[tick(Some(0), &a, &[])]);
    l.record(
        secs(10),
        &[tick(Some(1_000), &a, &[(outside.clone(), 0.5)])],
    );
    assert_eq!(energy(&l)[&outside], 1_000);
    // Pod "a" leaves; two minutes later its account is gone, the GPU's others stay.
    for t in [20, 100, 200] {
        l.record(secs(t), &[tick(Some(1_000 + t), &[], &[])]);
    }
    let e = energy(&l);
    assert!(!e.contains_key(&holder("a")), "{e:?}");
    assert!(e.contains_key(&Account::unallocated(None)));
    let _ = BTreeSet::<Account>::new();
}

#[test]
fn a_list_seen_before_keeps_charging_its_own_accounts_after_others_are_dropped() {
    // Pod "c" holds the GPU first (its account takes the first slot); then "a" and "b" hold it
    // through one list that the input hands again at every sample (the same pointer). When
    // "c" is dropped after retention the slots move: the list must still charge "a" and "b".
    let mut l = Ledger::new(Some(0), secs(60));
    let mk = |v: &[(Account, f64)]| -> GpuTick {
        let mut t = tick(None, v, &[]);
        t.running = None;
        t
    };
    let at_energy = |l: &mut Ledger, t: u64, e: u64, list: &Arc<[(Account, f64)]>| {
        let mut k = mk(&[]);
        k.allocated = Arc::clone(list);
        k.energy_mj = Some(e);
        l.record(secs(t), &[k]);
    };
    let c: Arc<[(Account, f64)]> = vec![(holder("c"), 1.0)].into();
    let ab: Arc<[(Account, f64)]> = vec![(holder("a"), 0.5), (holder("b"), 0.5)].into();
    at_energy(&mut l, 0, 0, &c);
    at_energy(&mut l, 10, 1_000, &c);
    for t in (20..=200).step_by(10) {
        at_energy(&mut l, t, 1_000 + (t - 10) * 100, &ab);
    }
    let g = &l.accounts()["GPU-a"];
    assert!(
        !g.accounts.contains_key(&holder("c")),
        "dropped after retention"
    );
    let (a, b) = (&g.accounts[&holder("a")], &g.accounts[&holder("b")]);
    // 19 intervals of 10 s at half the GPU each.
    assert!((a.allocated_gpu_seconds - 95.0).abs() < 1e-9, "{a:?}");
    assert!((b.allocated_gpu_seconds - 95.0).abs() < 1e-9, "{b:?}");
    assert_eq!(a.energy_mj + b.energy_mj, 19 * 1_000);
    assert_eq!(a.energy_mj, b.energy_mj);
}
