//! The XID event thread: registers `nvmlEventTypeXidCriticalError` on every GPU, waits on the
//! event set, and queues each XID under its GPU's UUID for [`GpuSource::drain_xids`].
//!
//! The thread outlives any NVML error: a failed wait is retried with backoff, and after
//! [`REREGISTER_AFTER`] failures in a row the GPUs are registered on a fresh event set (GPUs
//! that cannot register any more, such as one that fell off the bus, are left out). Each event
//! names its GPU by the UUID recorded at registration, so no NVML call is needed per event: a
//! call on a lost GPU would fail, and the XIDs of the other GPUs must still get through.
//!
//! [`GpuSource::drain_xids`]: crate::gpu::GpuSource::drain_xids

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::gpu::XidEvent;

use super::api::{ApiError, EventWait, NvmlApi};

/// How long the event thread waits per `nvmlEventSetWait` call (bounds shutdown latency).
const EVENT_WAIT_MS: u32 = 500;

/// Failed waits in a row after which the GPUs are registered on a new event set.
pub(super) const REREGISTER_AFTER: u32 = 5;

/// The backoff after the first failed wait; it doubles per failure in a row, up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// XIDs recorded by the event thread, waiting for [`GpuSource::drain_xids`].
///
/// [`GpuSource::drain_xids`]: crate::gpu::GpuSource::drain_xids
#[derive(Debug, Default)]
pub(super) struct XidQueue {
    pub(super) items: Mutex<Vec<(String, XidEvent)>>,
    pub(super) added: Condvar,
}

impl XidQueue {
    fn push(&self, uuid: String, xid: u64) {
        self.items
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((uuid, XidEvent { xid }));
        self.added.notify_all();
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

/// The event thread's loop: wait, record XIDs, until stopped. Never ends on an NVML error.
fn pump_events<A: NvmlApi>(mut w: Watch<A>, queue: &XidQueue, stop: &AtomicBool) {
    let mut failures = 0u32;
    while !stop.load(Ordering::Relaxed) {
        match w.events.wait(EVENT_WAIT_MS) {
            Ok(Some(r)) => {
                failures = 0;
                let Some(uuid) = w.uuids.get(r.device) else {
                    tracing::warn!(
                        device = r.device,
                        xid = r.xid,
                        "XID from a device that was not registered; dropped"
                    );
                    continue;
                };
                tracing::warn!(gpu = %uuid, xid = r.xid, "XID {}: {}", r.xid, crate::health::xid_message(r.xid));
                queue.push(uuid.clone(), r.xid);
            }
            Ok(None) | Err(ApiError::Timeout) => failures = 0,
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(error = %e, "NVML event wait failed; retrying with backoff");
                } else {
                    tracing::debug!(error = %e, failures, "NVML event wait failed again");
                }
                if failures.is_multiple_of(REREGISTER_AFTER) {
                    tracing::warn!(error = %e, failures, "NVML event waits keep failing; registering the GPUs on a new event set");
                    w.register_again();
                }
                pause(backoff(failures), stop);
            }
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
        .spawn(move || pump_events(watch, &q, &s))
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

    #[test]
    fn backoff_doubles_from_100_ms_to_5_s() {
        let ms: Vec<u128> = (1..=8).map(|f| backoff(f).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
