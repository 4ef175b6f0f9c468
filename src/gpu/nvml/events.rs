//! The XID event thread: registers `nvmlEventTypeXidCriticalError` on every GPU, waits on the
//! event set, and queues each XID under its GPU's UUID for [`GpuSource::drain_xids`].
//!
//! [`GpuSource::drain_xids`]: crate::gpu::GpuSource::drain_xids

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use crate::gpu::XidEvent;

use super::api::{ApiError, EventWait, NvmlApi};
use super::lifecycle::Ready;
use super::NvmlSource;

/// How long the event thread waits per `nvmlEventSetWait` call (bounds shutdown latency).
const EVENT_WAIT_MS: u32 = 500;

/// XIDs recorded by the event thread, waiting for [`GpuSource::drain_xids`].
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

/// The event thread's loop: wait, record XIDs, until stopped or NVML fails.
fn pump_events(mut events: impl EventWait, queue: &XidQueue, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match events.wait(EVENT_WAIT_MS) {
            Ok(Some(r)) => {
                tracing::warn!(gpu = %r.uuid, xid = r.xid, "XID {}: {}", r.xid, crate::health::xid_message(r.xid));
                queue.push(r.uuid, r.xid);
            }
            Ok(None) | Err(ApiError::Timeout) => {}
            Err(e) => {
                tracing::warn!(error = %e, "NVML event wait failed; XID events are re-registered at the next device discovery");
                return;
            }
        }
    }
}

impl<A: NvmlApi> NvmlSource<A> {
    pub(super) fn ensure_events(&self, ready: &mut Ready<A>) {
        let mut uuids: Vec<String> = ready.gpus.keys().cloned().collect();
        uuids.sort();
        let current = ready
            .events
            .as_ref()
            .is_some_and(|t| t.uuids == uuids && !t.thread.is_finished());
        if current || uuids.is_empty() {
            return;
        }
        ready.events = None; // stops the old thread
        let handles: Vec<A::Device> = uuids
            .iter()
            .filter_map(|u| ready.gpus.get(u).map(|g| g.handle.clone()))
            .collect();
        match ready.api.xid_events(&handles) {
            Ok((events, skipped)) => {
                for (i, e) in skipped {
                    tracing::warn!(gpu = %uuids.get(i).map_or("?", |s| s.as_str()), error = %e, "cannot watch XID events on this GPU");
                }
                let stop = Arc::new(AtomicBool::new(false));
                let (q, s) = (Arc::clone(&self.xids), Arc::clone(&stop));
                match std::thread::Builder::new()
                    .name("nvml-events".into())
                    .spawn(move || pump_events(events, &q, &s))
                {
                    Ok(thread) => {
                        ready.events = Some(EventThread {
                            uuids,
                            stop,
                            thread,
                        })
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start the NVML event thread; XIDs are not recorded")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot create an NVML event set; XIDs are not recorded");
            }
        }
    }
}
