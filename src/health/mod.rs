//! Event windows and health: what the `DCGM_EXP_*` series and `gpu_exporter_gpus` are made of.
//!
//! [`History`] remembers, per GPU UUID, the XIDs and clock-event reasons seen within a window and
//! the counters needed for rates; [`derive`] turns one GPU's history and latest sample into
//! DCGM-style health checks (0 pass, 10 warn, 20 fail). Both are pure: time is passed in as
//! milliseconds on the sampler's monotonic clock. What the events mean (XID texts, clock-event
//! reasons) is GPU vocabulary, in [`crate::gpu::event_texts`]; re-exported here.

use std::collections::{HashMap, VecDeque};

use crate::catalog::Field;
use crate::gpu::DeviceSample;

pub use crate::gpu::event_texts::{xid_message, CLOCK_EVENTS, UNKNOWN_XID, XID_TEXTS};

/// Health result codes (dcgm-exporter's `health_error_code` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// 0.
    Pass = 0,
    /// 10.
    Warn = 10,
    /// 20.
    Fail = 20,
}

/// One health watch's verdict for a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    /// `health_watch` label: PCIE, NVLINK, MEM, THERMAL, POWER, DRIVER, ALL...
    pub watch: &'static str,
    /// `health_error_code` label, e.g. `DCGM_FR_OK`, `DCGM_FR_FALLEN_OFF_BUS`.
    pub code: &'static str,
    /// The value.
    pub status: Status,
}

/// The watches reported for every GPU, in output order.
pub const WATCHES: &[&str] = &[
    "PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER", "DRIVER", "ALL",
];

/// PCIe replays within the window above which the PCIE watch warns (DCGM warns on a replay
/// rate of 8 per minute; we apply it over the window).
const PCIE_REPLAY_WARN_PER_MIN: f64 = 8.0;

#[derive(Debug, Default, Clone)]
struct GpuHistory {
    xids: VecDeque<(u64, u64)>,
    last_xid: Option<(u64, u64)>,
    clock_events: ClockWindow,
    pcie: Counter,
    nvlink_errors: Counter,
}

/// The clock-event masks sampled within the window, with a running count per bit: what
/// the window holds is read in constant time however many samples it spans (a 1 s interval
/// over dcgm-exporter's 5 min window is 300 samples per GPU, read at every sample).
#[derive(Debug, Clone)]
struct ClockWindow {
    samples: VecDeque<(u64, u64)>,
    per_bit: [u64; 64],
}

impl Default for ClockWindow {
    fn default() -> Self {
        Self {
            samples: VecDeque::new(),
            per_bit: [0; 64],
        }
    }
}

impl ClockWindow {
    fn push(&mut self, now: u64, mask: u64) {
        self.samples.push_back((now, mask));
        for (bit, n) in self.per_bit.iter_mut().enumerate() {
            *n += (mask >> bit) & 1;
        }
    }

    fn expire(&mut self, cutoff: u64) {
        while let Some(&(t, mask)) = self.samples.front() {
            if t >= cutoff {
                break;
            }
            self.samples.pop_front();
            for (bit, n) in self.per_bit.iter_mut().enumerate() {
                *n -= (mask >> bit) & 1;
            }
        }
    }

    /// Samples within the window with any bit of `mask` set (one bit: its running count).
    fn count(&self, mask: u64) -> u64 {
        if mask.is_power_of_two() {
            return self.per_bit[mask.trailing_zeros() as usize];
        }
        self.samples.iter().filter(|&&(_, m)| m & mask != 0).count() as u64
    }
}

/// A monotonically growing device counter and its increases within the window.
#[derive(Debug, Default, Clone)]
struct Counter {
    prev: Option<i64>,
    increases: VecDeque<(u64, i64)>,
}

impl Counter {
    fn observe(&mut self, now: u64, value: Option<i64>) {
        if let Some(v) = value {
            if let Some(p) = self.prev {
                // A decrease is a reset (driver reload): count nothing for this step.
                if v > p {
                    self.increases.push_back((now, v - p));
                }
            }
            self.prev = Some(v);
        }
    }

    fn expire(&mut self, cutoff: u64) {
        while self.increases.front().is_some_and(|&(t, _)| t < cutoff) {
            self.increases.pop_front();
        }
    }

    fn sum(&self) -> i64 {
        self.increases.iter().map(|&(_, d)| d).sum()
    }
}

/// Per-GPU event windows.
#[derive(Debug, Clone)]
pub struct History {
    xid_window_ms: u64,
    clock_window_ms: u64,
    gpus: HashMap<String, GpuHistory>,
}

/// What the history says about one GPU now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recent {
    /// The last XID within the XID window (the `DCGM_FI_DEV_XID_ERRORS` value), if any.
    pub last_xid: Option<u64>,
    /// XID counts within the window, by XID, ascending.
    pub xid_counts: Vec<(u64, u64)>,
    /// Samples with each clock event reason set, within the clock window, by reason.
    pub clock_event_counts: Vec<(&'static str, u64)>,
    /// PCIe replays within the XID window.
    pub pcie_replays: i64,
    /// NVLink errors (CRC flit + data + replay + recovery) within the window.
    pub nvlink_errors: i64,
}

impl History {
    /// A history with the given windows (dcgm-exporter's defaults are 300 000 ms each).
    pub fn new(xid_window_ms: u64, clock_window_ms: u64) -> Self {
        Self {
            xid_window_ms,
            clock_window_ms,
            gpus: HashMap::new(),
        }
    }

    /// The XID window, for the `window_size_in_ms` label.
    pub fn xid_window_ms(&self) -> u64 {
        self.xid_window_ms
    }

    /// The clock-event window, for the `window_size_in_ms` label.
    pub fn clock_window_ms(&self) -> u64 {
        self.clock_window_ms
    }

    /// Records an XID for GPU `uuid` at `now`.
    pub fn record_xid(&mut self, uuid: &str, now: u64, xid: u64) {
        let g = self.gpus.entry(uuid.to_owned()).or_default();
        g.xids.push_back((now, xid));
        g.last_xid = Some((now, xid));
    }

    /// Records a sample of GPU `uuid` at `now`.
    pub fn record_sample(&mut self, uuid: &str, now: u64, sample: &DeviceSample) {
        let g = self.gpus.entry(uuid.to_owned()).or_default();
        if let Some(mask) = sample.get_i64(Field::ClocksEventReasons) {
            g.clock_events.push(now, mask as u64);
        }
        g.pcie
            .observe(now, sample.get_i64(Field::PcieReplayCounter));
        let nvlink = [
            Field::NvlinkCrcFlitErrorCountTotal,
            Field::NvlinkCrcDataErrorCountTotal,
            Field::NvlinkReplayErrorCountTotal,
            Field::NvlinkRecoveryErrorCountTotal,
        ]
        .iter()
        .map(|&f| sample.get_i64(f))
        .try_fold(0i64, |acc, v| v.map(|v| acc.saturating_add(v)));
        g.nvlink_errors.observe(now, nvlink);
    }

    /// Drops what fell out of the windows, and GPUs not in `present`.
    pub fn expire(&mut self, now: u64, present: &[&str]) {
        self.gpus.retain(|uuid, _| present.contains(&uuid.as_str()));
        let xid_cutoff = now.saturating_sub(self.xid_window_ms);
        let clock_cutoff = now.saturating_sub(self.clock_window_ms);
        for g in self.gpus.values_mut() {
            while g.xids.front().is_some_and(|&(t, _)| t < xid_cutoff) {
                g.xids.pop_front();
            }
            if g.last_xid.is_some_and(|(t, _)| t < xid_cutoff) {
                g.last_xid = None;
            }
            g.clock_events.expire(clock_cutoff);
            g.pcie.expire(xid_cutoff);
            g.nvlink_errors.expire(xid_cutoff);
        }
    }

    /// What the windows hold for GPU `uuid`.
    pub fn recent(&self, uuid: &str) -> Recent {
        let Some(g) = self.gpus.get(uuid) else {
            return Recent::default();
        };
        let mut xid_counts: Vec<(u64, u64)> = Vec::new();
        for &(_, x) in &g.xids {
            match xid_counts.iter_mut().find(|(k, _)| *k == x) {
                Some((_, n)) => *n += 1,
                None => xid_counts.push((x, 1)),
            }
        }
        xid_counts.sort_unstable();
        let clock_event_counts = CLOCK_EVENTS
            .iter()
            .map(|&(bit, name)| (name, g.clock_events.count(bit)))
            .filter(|&(_, n)| n > 0)
            .collect();
        Recent {
            last_xid: g.last_xid.map(|(_, x)| x),
            xid_counts,
            clock_event_counts,
            pcie_replays: g.pcie.sum(),
            nvlink_errors: g.nvlink_errors.sum(),
        }
    }
}

/// Derives the health checks of one GPU, one per [`WATCHES`] entry. `sample` is `None` when
/// the GPU could not be read; `lost` says it fell off the bus.
///
/// Each finding is filed under the watch DCGM files it under; `ALL` is not a summary of the
/// others but carries only the incidents DCGM files under `DCGM_HEALTH_WATCH_ALL` (a GPU fallen
/// off the bus, an uncontained error), as upstream's `gpu_health_collector.go` reports them: a
/// volatile DBE fails `MEM` and leaves `ALL` passing.
pub fn derive(
    sample: Option<&DeviceSample>,
    lost: bool,
    recent: &Recent,
    window_ms: u64,
) -> Vec<Check> {
    let pass = |watch| Check {
        watch,
        code: "DCGM_FR_OK",
        status: Status::Pass,
    };
    let mut checks: Vec<Check> = WATCHES.iter().map(|&w| pass(w)).collect();
    let mut set = |watch: &str, status: Status, code: &'static str| {
        if let Some(c) = checks.iter_mut().find(|c| c.watch == watch) {
            // The worst finding wins; the first of equal severity keeps its code.
            if status > c.status {
                c.status = status;
                c.code = code;
            }
        }
    };
    let xid_seen = |x: u64| recent.xid_counts.iter().any(|&(k, _)| k == x);

    if lost || xid_seen(79) {
        set("ALL", Status::Fail, "DCGM_FR_FALLEN_OFF_BUS");
        set("PCIE", Status::Fail, "DCGM_FR_FALLEN_OFF_BUS");
    }
    if xid_seen(95) {
        set("MEM", Status::Fail, "DCGM_FR_UNCONTAINED_ERROR");
        set("ALL", Status::Fail, "DCGM_FR_UNCONTAINED_ERROR");
    }
    if xid_seen(48) {
        set("MEM", Status::Fail, "DCGM_FR_VOLATILE_DBE_DETECTED");
    }
    if xid_seen(119) || xid_seen(120) {
        set("DRIVER", Status::Fail, "DCGM_FR_XID_ERROR");
    }
    if xid_seen(74) {
        set("NVLINK", Status::Warn, "DCGM_FR_NVLINK_DOWN");
    }
    let window_min = (window_ms as f64 / 60_000.0).max(1.0 / 60.0);
    if recent.pcie_replays as f64 / window_min > PCIE_REPLAY_WARN_PER_MIN {
        set("PCIE", Status::Warn, "DCGM_FR_PCI_REPLAY_RATE");
    }
    if recent.nvlink_errors > 0 {
        set("NVLINK", Status::Warn, "DCGM_FR_NVLINK_ERROR_THRESHOLD");
    }
    if let Some(s) = sample {
        let flag = |f: Field| s.get_i64(f).is_some_and(|v| v > 0);
        if flag(Field::EccDbeVolTotal) {
            set("MEM", Status::Fail, "DCGM_FR_VOLATILE_DBE_DETECTED");
        }
        if flag(Field::RowRemapFailure) {
            set("MEM", Status::Fail, "DCGM_FR_ROW_REMAP_FAILURE");
        }
        if flag(Field::RetiredPending) {
            set("MEM", Status::Warn, "DCGM_FR_PENDING_PAGE_RETIREMENTS");
        }
        if flag(Field::RowRemapPending) {
            set("MEM", Status::Warn, "DCGM_FR_PENDING_ROW_REMAP");
        }
        let reasons = s.get_i64(Field::ClocksEventReasons).unwrap_or(0);
        if reasons & (0x20 | 0x40) != 0 {
            set("THERMAL", Status::Warn, "DCGM_FR_CLOCKS_EVENT_THERMAL");
        }
        if reasons & 0x80 != 0 {
            set("POWER", Status::Warn, "DCGM_FR_CLOCKS_EVENT_POWER");
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Value;

    fn sample(pairs: &[(Field, i64)]) -> DeviceSample {
        DeviceSample {
            readings: pairs.iter().map(|&(f, v)| (f, Ok(Value::Int(v)))).collect(),
            ..DeviceSample::default()
        }
    }

    fn status(checks: &[Check], watch: &str) -> (Status, &'static str) {
        let c = checks.iter().find(|c| c.watch == watch).unwrap();
        (c.status, c.code)
    }

    #[test]
    fn xids_are_counted_within_the_window_and_last_xid_expires() {
        let mut h = History::new(1000, 1000);
        h.record_xid("GPU-a", 0, 13);
        h.record_xid("GPU-a", 100, 13);
        h.record_xid("GPU-a", 200, 79);
        h.expire(500, &["GPU-a"]);
        let r = h.recent("GPU-a");
        assert_eq!(r.xid_counts, vec![(13, 2), (79, 1)]);
        assert_eq!(r.last_xid, Some(79));
        h.expire(1150, &["GPU-a"]);
        assert_eq!(h.recent("GPU-a").xid_counts, vec![(79, 1)]);
        h.expire(1300, &["GPU-a"]);
        assert_eq!(h.recent("GPU-a"), Recent::default());
    }

    #[test]
    fn clock_events_count_samples_with_each_bit() {
        let mut h = History::new(10_000, 10_000);
        h.record_sample("g", 0, &sample(&[(Field::ClocksEventReasons, 0x1)]));
        h.record_sample("g", 10, &sample(&[(Field::ClocksEventReasons, 0x41)]));
        h.record_sample("g", 20, &sample(&[(Field::ClocksEventReasons, 0x40)]));
        let r = h.recent("g");
        assert_eq!(
            r.clock_event_counts,
            vec![("gpu_idle", 2), ("hw_thermal", 2)]
        );
    }

    #[test]
    fn clock_event_counts_follow_the_window_as_samples_expire() {
        let mut h = History::new(10_000, 1_000);
        let masks = [0x1u64, 0x41, 0x40, 0x0, 0x4, 0x1ff, 0x40];
        for (i, &m) in masks.iter().cycle().take(700).enumerate() {
            let now = i as u64 * 10;
            h.record_sample("g", now, &sample(&[(Field::ClocksEventReasons, m as i64)]));
            h.expire(now, &["g"]);
            // A recount of the samples still within the window, bit by bit.
            let cutoff = now.saturating_sub(1_000);
            let within: Vec<u64> = (0..=i)
                .filter(|&j| j as u64 * 10 >= cutoff)
                .map(|j| masks[j % masks.len()])
                .collect();
            let want: Vec<(&str, u64)> = CLOCK_EVENTS
                .iter()
                .map(|&(bit, name)| {
                    (
                        name,
                        within.iter().filter(|&&m| m & bit != 0).count() as u64,
                    )
                })
                .filter(|&(_, n)| n > 0)
                .collect();
            assert_eq!(h.recent("g").clock_event_counts, want, "at {now}");
        }
        assert!(CLOCK_EVENTS.iter().all(|(bit, _)| bit.is_power_of_two()));
    }

    #[test]
    fn counters_ignore_resets_and_count_increases() {
        let mut h = History::new(60_000, 60_000);
        for (t, v) in [(0, 10), (1000, 15), (2000, 3), (3000, 5)] {
            h.record_sample("g", t, &sample(&[(Field::PcieReplayCounter, v)]));
        }
        assert_eq!(h.recent("g").pcie_replays, 7);
    }

    #[test]
    fn departed_gpus_are_forgotten() {
        let mut h = History::new(1000, 1000);
        h.record_xid("gone", 0, 13);
        h.expire(1, &[]);
        assert_eq!(h.recent("gone"), Recent::default());
    }

    #[test]
    fn healthy_gpu_passes_every_watch() {
        let checks = derive(Some(&sample(&[])), false, &Recent::default(), 300_000);
        assert_eq!(checks.len(), WATCHES.len());
        assert!(checks
            .iter()
            .all(|c| c.status == Status::Pass && c.code == "DCGM_FR_OK"));
    }

    #[test]
    fn lost_gpu_fails_all() {
        let checks = derive(None, true, &Recent::default(), 300_000);
        assert_eq!(
            status(&checks, "ALL"),
            (Status::Fail, "DCGM_FR_FALLEN_OFF_BUS")
        );
        assert_eq!(status(&checks, "MEM").0, Status::Pass);
    }

    #[test]
    fn dbe_fails_mem_only_and_pending_retirement_warns() {
        let checks = derive(
            Some(&sample(&[
                (Field::EccDbeVolTotal, 2),
                (Field::RetiredPending, 1),
            ])),
            false,
            &Recent::default(),
            300_000,
        );
        assert_eq!(
            status(&checks, "MEM"),
            (Status::Fail, "DCGM_FR_VOLATILE_DBE_DETECTED")
        );
        // DCGM files a volatile DBE under MEM, not under ALL (issue 35 item 10).
        assert_eq!(status(&checks, "ALL"), (Status::Pass, "DCGM_FR_OK"));
        let checks = derive(
            Some(&sample(&[(Field::RetiredPending, 1)])),
            false,
            &Recent::default(),
            300_000,
        );
        assert_eq!(
            status(&checks, "MEM"),
            (Status::Warn, "DCGM_FR_PENDING_PAGE_RETIREMENTS")
        );
    }

    #[test]
    fn thermal_throttle_warns_and_replay_storm_warns() {
        let checks = derive(
            Some(&sample(&[(Field::ClocksEventReasons, 0x40)])),
            false,
            &Recent {
                pcie_replays: 100,
                ..Recent::default()
            },
            300_000,
        );
        assert_eq!(
            status(&checks, "THERMAL"),
            (Status::Warn, "DCGM_FR_CLOCKS_EVENT_THERMAL")
        );
        assert_eq!(
            status(&checks, "PCIE"),
            (Status::Warn, "DCGM_FR_PCI_REPLAY_RATE")
        );
        assert_eq!(status(&checks, "ALL"), (Status::Pass, "DCGM_FR_OK"));
    }

    #[test]
    fn all_carries_only_incidents_filed_under_the_all_watch() {
        // Every per-watch finding at once: none of them reaches ALL.
        let checks = derive(
            Some(&sample(&[
                (Field::EccDbeVolTotal, 1),
                (Field::RowRemapFailure, 1),
                (Field::ClocksEventReasons, 0xe0),
            ])),
            false,
            &Recent {
                xid_counts: vec![(48, 1), (74, 1), (119, 1)],
                pcie_replays: 1000,
                nvlink_errors: 3,
                ..Recent::default()
            },
            300_000,
        );
        assert_eq!(status(&checks, "MEM").0, Status::Fail);
        assert_eq!(status(&checks, "DRIVER").0, Status::Fail);
        assert_eq!(status(&checks, "ALL"), (Status::Pass, "DCGM_FR_OK"));
        // XID 95 and XID 79 are filed under ALL.
        for (xid, code) in [
            (95, "DCGM_FR_UNCONTAINED_ERROR"),
            (79, "DCGM_FR_FALLEN_OFF_BUS"),
        ] {
            let recent = Recent {
                xid_counts: vec![(xid, 1)],
                ..Recent::default()
            };
            let checks = derive(Some(&sample(&[])), false, &recent, 300_000);
            assert_eq!(status(&checks, "ALL"), (Status::Fail, code));
        }
    }
}
