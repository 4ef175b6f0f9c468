//! The XID event thread: registers `nvmlEventTypeXidCriticalError` on every GPU, waits on the
//! event set, and queues each XID under its GPU's UUID for [`GpuSource::drain_xids`].
//!
//! The thread outlives any NVML error and never spins: each wait round lasts at least a minimum
//! period measured on the clock (the wait's own timeout when it answered nothing, a short one per
//! XID, the backoff after an error), so a driver whose `nvmlEventSetWait_v2` returns at once
//! (TIMEOUT, an error, or the same XID again and again) costs a bounded number of calls per
//! second. A failed wait is retried with backoff, and after
//! [`REREGISTER_AFTER`] failures in a row the GPUs are registered on a fresh event set (GPUs
//! that cannot register any more, such as one that fell off the bus, are left out). Each event
//! names its GPU by the UUID recorded at registration, so no NVML call is needed per event: a
//! call on a lost GPU would fail, and the XIDs of the other GPUs must still get through.
//!
//! [`GpuSource::drain_xids`]: crate::gpu::GpuSource::drain_xids

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::gpu::XidEvent;

use super::api::{ApiError, EventWait, NvmlApi};

/// How long the event thread waits per `nvmlEventSetWait` call (bounds shutdown latency).
const EVENT_WAIT_MS: u32 = 500;

/// The shortest round that delivered an XID: a driver that answers an XID at once for ever is
/// read at most 100 times a second (a real burst of XIDs is drained between two ticks anyway).
const MIN_XID_ROUND: Duration = Duration::from_millis(10);

/// Failed waits in a row after which the GPUs are registered on a new event set.
pub(super) const REREGISTER_AFTER: u32 = 5;

/// The backoff after the first failed wait; it doubles per failure in a row, up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The most XIDs kept per GPU between two drains: beyond it the oldest of that GPU's are
/// dropped (and counted), so a GPU flooding XIDs cannot grow the queue without bound, nor crowd
/// out the other GPUs' XIDs.
pub(super) const MAX_QUEUED_PER_GPU: usize = 256;

/// XIDs recorded by the event thread, waiting for [`GpuSource::drain_xids`]: at most
/// [`MAX_QUEUED_PER_GPU`] per GPU, the newest.
///
/// [`GpuSource::drain_xids`]: crate::gpu::GpuSource::drain_xids
#[derive(Debug, Default)]
pub(super) struct XidQueue {
    pub(super) items: Mutex<Vec<(String, XidEvent)>>,
    pub(super) added: Condvar,
    /// XIDs dropped since the last drain (the queue was full for their GPU).
    dropped: AtomicU64,
}

impl XidQueue {
    /// Queues an XID of GPU `uuid`; false when the GPU's queue was full, so that its oldest XID
    /// was dropped for it.
    fn push(&self, uuid: String, xid: u64) -> bool {
        let mut items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let mut kept_all = true;
        if items.iter().filter(|(u, _)| *u == uuid).count() >= MAX_QUEUED_PER_GPU {
            if let Some(oldest) = items.iter().position(|(u, _)| *u == uuid) {
                items.remove(oldest);
                self.dropped.fetch_add(1, Ordering::Relaxed);
                kept_all = false;
            }
        }
        items.push((uuid, XidEvent { xid }));
        drop(items);
        self.added.notify_all();
        kept_all
    }

    /// Takes every queued XID, in arrival order; logs once how many were dropped since the
    /// last drain, if any.
    pub(super) fn drain(&self) -> Vec<(String, XidEvent)> {
        let items = std::mem::take(&mut *self.items.lock().unwrap_or_else(PoisonError::into_inner));
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                kept_per_gpu = MAX_QUEUED_PER_GPU,
                "more XIDs arrived between two samples than are kept per GPU; the oldest were dropped"
            );
        }
        items
    }

    /// XIDs dropped since the last drain.
    #[cfg(test)]
    pub(super) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The running event thread and the GPUs it was started for.
pub(super) struct EventThread {
    uuids: Vec<String>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Drop for EventThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What the event thread waits on: the API (to register again), the GPUs by UUID, and their
/// current event set.
struct Watch<A: NvmlApi> {
    api: Arc<A>,
    handles: Vec<A::Device>,
    uuids: Vec<String>,
    events: A::Events,
}

impl<A: NvmlApi> Watch<A> {
    /// Registers the GPUs on a new event set, replacing the current one.
    fn register_again(&mut self) {
        match self.api.xid_events(&self.handles) {
            Ok((events, skipped)) => {
                self.events = events;
                log_skipped(&self.uuids, &skipped);
                tracing::info!(
                    gpus = self.handles.len() - skipped.len(),
                    "XID events registered on a new NVML event set"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot create a new NVML event set; waiting on the old one")
            }
        }
    }
}

fn log_skipped(uuids: &[String], skipped: &[(usize, ApiError)]) {
    for (i, e) in skipped {
        tracing::warn!(gpu = %uuids.get(*i).map_or("?", String::as_str), error = %e, "cannot watch XID events on this GPU");
    }
}

/// The delay after `failures` failed waits in a row.
fn backoff(failures: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_BACKOFF)
}

/// The event loop's clock: what paces its rounds. [`RealClock`] in the exporter; tests use a
/// simulated one to count rounds without sleeping.
trait Clock {
    /// The current instant.
    fn now(&self) -> Instant;
    /// Waits `d`, returning early when `stop` is set.
    fn pause(&self, d: Duration, stop: &AtomicBool);
}

/// Wall-clock time and real sleeps.
struct RealClock;

impl Clock for RealClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn pause(&self, d: Duration, stop: &AtomicBool) {
        pause(d, stop);
    }
}

/// Sleeps `d`, in short steps, returning early when `stop` is set.
fn pause(d: Duration, stop: &AtomicBool) {
    let step = Duration::from_millis(50);
    let mut left = d;
    while !left.is_zero() && !stop.load(Ordering::Relaxed) {
        let s = left.min(step);
        std::thread::sleep(s);
        left -= s;
    }
}

/// The event thread's loop: wait, record XIDs, until stopped. Never ends on an NVML error, and
/// never spins: a round that took less than its minimum period (see the module doc) is padded
/// with a pause, whatever the driver answered.
fn pump_events<A: NvmlApi, C: Clock>(
    mut w: Watch<A>,
    queue: &XidQueue,
    stop: &AtomicBool,
    clock: &C,
) {
    let mut failures = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let started = clock.now();
        let min_round = match w.events.wait(EVENT_WAIT_MS) {
            Ok(Some(r)) => {
                failures = 0;
                match w.uuids.get(r.device) {
                    // Logged while the GPU's queue has room: a flood costs at most
                    // MAX_QUEUED_PER_GPU lines per sample, then one line with the drops.
                    Some(uuid) => {
                        if queue.push(uuid.clone(), r.xid) {
                            tracing::warn!(gpu = %uuid, xid = r.xid, "XID {}: {}", r.xid, crate::gpu::event_texts::xid_message(r.xid));
                        }
                    }
                    None => tracing::warn!(
                        device = r.device,
                        xid = r.xid,
                        "XID from a device that was not registered; dropped"
                    ),
                }
                MIN_XID_ROUND
            }
            // A wait that answered nothing lasts its timeout, even if the driver returned early.
            Ok(None) | Err(ApiError::Timeout) => {
                failures = 0;
                Duration::from_millis(u64::from(EVENT_WAIT_MS))
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(error = %e, "NVML event wait failed; retrying with backoff");
                } else {
                    tracing::debug!(error = %e, failures, "NVML event wait failed again");
                }
                if failures.is_multiple_of(REREGISTER_AFTER) {
                    tracing::warn!(error = %e, failures, "NVML event waits keep failing; registering the GPUs on a new event set");
                    w.register_again();
                }
                backoff(failures)
            }
        };
        let spent = clock.now().saturating_duration_since(started);
        if spent < min_round {
            clock.pause(min_round - spent, stop);
        }
    }
}

/// Starts the event thread for `gpus` (UUID and handle, sorted by UUID) into `slot`, unless the
/// one there runs for exactly them; the thread queues XIDs into `xids`.
pub(super) fn ensure<A: NvmlApi>(
    api: &Arc<A>,
    gpus: Vec<(String, A::Device)>,
    slot: &mut Option<EventThread>,
    xids: &Arc<XidQueue>,
) {
    let current = slot
        .as_ref()
        .is_some_and(|t| gpus.iter().map(|(u, _)| u).eq(&t.uuids) && !t.thread.is_finished());
    if current || gpus.is_empty() {
        return;
    }
    *slot = None; // stops the old thread
    let (uuids, handles): (Vec<String>, Vec<A::Device>) = gpus.into_iter().unzip();
    let events = match api.xid_events(&handles) {
        Ok((events, skipped)) => {
            log_skipped(&uuids, &skipped);
            events
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot create an NVML event set; XIDs are not recorded until the next discovery");
            return;
        }
    };
    let watch = Watch {
        api: Arc::clone(api),
        handles,
        uuids: uuids.clone(),
        events,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (q, s) = (Arc::clone(xids), Arc::clone(&stop));
    match std::thread::Builder::new()
        .name("nvml-events".into())
        .spawn(move || pump_events(watch, &q, &s, &RealClock))
    {
        Ok(thread) => {
            *slot = Some(EventThread {
                uuids,
                stop,
                thread,
            });
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the NVML event thread; XIDs are not recorded")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_nvml::{FakeGpu, FakeNvml, WaitAnswer};
    use crate::gpu::nvml::api::XidReport;
    use std::cell::Cell;

    /// Simulated time: only pauses move it. It stops the loop once `limit` has passed, or after
    /// `max_rounds` rounds (two clock reads each) so that a loop that never pauses ends too.
    struct FakeClock {
        start: Instant,
        elapsed: Cell<Duration>,
        reads: Cell<u64>,
        limit: Duration,
        max_rounds: u64,
        stop: Arc<AtomicBool>,
    }

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            self.reads.set(self.reads.get() + 1);
            if self.reads.get() > 2 * self.max_rounds {
                self.stop.store(true, Ordering::Relaxed);
            }
            self.start + self.elapsed.get()
        }
        fn pause(&self, d: Duration, _stop: &AtomicBool) {
            self.elapsed.set(self.elapsed.get() + d);
            if self.elapsed.get() >= self.limit {
                self.stop.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Runs the event loop against a fake NVML whose waits all return `answer` at once, for
    /// 60 simulated seconds (or 100 000 rounds); returns the waits made and the simulated time.
    fn waits_in_a_minute(answer: WaitAnswer) -> (u64, Duration, usize) {
        let fake = FakeNvml::new("570.172.08", vec![FakeGpu::h100(0)]);
        let api = Arc::new(fake.clone());
        let handle = api.device_by_index(0).unwrap();
        let (events, _) = api.xid_events(std::slice::from_ref(&handle)).unwrap();
        let watch = Watch {
            api,
            handles: vec![handle],
            uuids: vec!["GPU-fake-0000".into()],
            events,
        };
        fake.answer_event_waits_at_once(Some(answer));
        let stop = Arc::new(AtomicBool::new(false));
        let clock = FakeClock {
            start: Instant::now(),
            elapsed: Cell::new(Duration::ZERO),
            reads: Cell::new(0),
            limit: Duration::from_secs(60),
            max_rounds: 100_000,
            stop: Arc::clone(&stop),
        };
        let queue = XidQueue::default();
        pump_events(watch, &queue, &stop, &clock);
        let queued = queue.items.lock().unwrap().len();
        assert!(queued <= MAX_QUEUED_PER_GPU);
        (fake.event_waits(), clock.elapsed.get(), queued)
    }

    #[test]
    fn a_wait_that_returns_at_once_never_makes_the_loop_spin() {
        // Issue 35 item 12: a TIMEOUT (or nothing) at once costs one wait per 500 ms...
        for answer in [Err(ApiError::Timeout), Ok(None)] {
            let (waits, elapsed, _) = waits_in_a_minute(answer.clone());
            assert!(
                elapsed >= Duration::from_secs(60),
                "{answer:?}: {elapsed:?}"
            );
            assert!(waits <= 121, "{answer:?}: {waits} waits in a minute");
        }
        // ...an error at once backs off (100 ms doubling to 5 s)...
        let (waits, elapsed, _) = waits_in_a_minute(Err(ApiError::Other("Unknown Error".into())));
        assert!(elapsed >= Duration::from_secs(60), "{elapsed:?}");
        assert!(waits <= 20, "{waits} failed waits in a minute");
        // ...and the same XID answered at once for ever is read at most 100 times a second.
        let xid = Ok(Some(XidReport { device: 0, xid: 13 }));
        let (waits, elapsed, queued) = waits_in_a_minute(xid);
        assert!(elapsed >= Duration::from_secs(60), "{elapsed:?}");
        assert!(waits <= 6001, "{waits} XID waits in a minute");
        assert!(queued > 0);
    }

    #[test]
    fn the_queue_keeps_the_newest_xids_per_gpu_and_counts_the_dropped() {
        // Issue 35 item 13: a GPU flooding XIDs between two ticks grew the queue without bound.
        let q = XidQueue::default();
        q.push("GPU-b".into(), 79);
        let kept: Vec<bool> = (0..(MAX_QUEUED_PER_GPU as u64 + 1000))
            .map(|i| q.push("GPU-a".into(), i))
            .collect();
        // Full from the 257th on (those are not logged one by one).
        assert!(kept[..MAX_QUEUED_PER_GPU].iter().all(|&k| k));
        assert!(kept[MAX_QUEUED_PER_GPU..].iter().all(|&k| !k));
        assert!(q.push("GPU-b".into(), 48), "the other GPU's queue has room");
        assert_eq!(q.dropped(), 1000);
        let got = q.drain();
        assert_eq!(got.len(), MAX_QUEUED_PER_GPU + 2);
        let a: Vec<u64> = got
            .iter()
            .filter(|(u, _)| u == "GPU-a")
            .map(|(_, x)| x.xid)
            .collect();
        assert_eq!(
            a,
            (1000..MAX_QUEUED_PER_GPU as u64 + 1000).collect::<Vec<_>>()
        );
        let b: Vec<u64> = got
            .iter()
            .filter(|(u, _)| u == "GPU-b")
            .map(|(_, x)| x.xid)
            .collect();
        assert_eq!(b, [79, 48], "the other GPU's XIDs are all kept");
        assert_eq!(q.dropped(), 0, "the count restarts after a drain");
        assert!(q.drain().is_empty());
    }

    #[test]
    fn backoff_doubles_from_100_ms_to_5_s() {
        let ms: Vec<u128> = (1..=8).map(|f| backoff(f).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
