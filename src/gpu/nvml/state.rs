//! The state of an [`NvmlSource`](super::NvmlSource): not initialised yet (with the retry
//! schedule), or ready with its GPUs and what each reader keeps between ticks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gpu::{GpuIdentity, Reading};

use super::api::NvmlApi;
use super::convert::{NvlinkCounter, StaticFact};
use super::error::InitError;
use super::events::EventThread;
use super::nvlink::Links;
use super::processes::ProcessTracker;

/// Not initialised yet (why, and when to try again), or ready.
pub(super) enum State<A: NvmlApi> {
    Pending {
        error: InitError,
        delay: Duration,
        next_attempt: Instant,
        attempts: u64,
    },
    Ready(Box<Ready<A>>),
}

/// NVML initialised: the API, the system-wide facts, the GPUs and the XID event thread.
pub(super) struct Ready<A: NvmlApi> {
    pub(super) api: Arc<A>,
    pub(super) system: Vec<(StaticFact, Reading)>,
    pub(super) gpus: HashMap<String, GpuState<A>>,
    pub(super) events: Option<EventThread>,
}

/// One GPU: its handles, static facts and what the readers keep between ticks.
pub(super) struct GpuState<A: NvmlApi> {
    pub(super) handle: A::Device,
    pub(super) identity: GpuIdentity,
    pub(super) statics: Vec<(StaticFact, Reading)>,
    pub(super) gpm: bool,
    pub(super) mig: Vec<(u32, A::Device)>,
    pub(super) prev_gpm: Option<A::GpmSample>,
    pub(super) prev_mig_gpm: HashMap<u32, A::GpmSample>,
    pub(super) prev_nvlink: Option<NvlinkCounter>,
    pub(super) procs: ProcessTracker,
    /// Per-link NVLink state (active links, previous counters, cached error counters).
    pub(super) links: Links,
    /// A MIG handle answered "invalid argument" or "not found" this tick: the instances were
    /// destroyed or recreated, and the handles must be enumerated again.
    pub(super) mig_stale: bool,
}
