//! The NVML backend: real NVIDIA GPUs through `libnvidia-ml.so.1`.
//!
//! Layers, top to bottom; each file imports only from the layers below it (checked by
//! `scripts/import-cycles.py`):
//! 1. [`NvmlSource`] (this file) implements [`GpuSource`]; `lifecycle` (NVML initialisation
//!    retried with backoff while the driver is not there yet) and `discovery` (enumerating GPUs:
//!    identity and static facts read once per GPU, MIG instances every discovery, the XID event
//!    thread started for them) add methods to it, and nothing below names it.
//! 2. `read`: one tick of one device: one batched field-values call plus the few calls that have
//!    no field id, GPM deltas across ticks, GPU loss; it works on a `state::GpuState`.
//! 3. `state`: the source's state (pending with its retry schedule, or ready with its GPUs),
//!    made of what each reader below keeps between ticks.
//! 4. The readers with their own state: `nvlink` (the per-link NVLink fields, dcgm-exporter's
//!    link entities, error counters on their own cadence), `processes` (per-process readings,
//!    utilisation sample windows), `events` (the XID event thread and its queue).
//! 5. `call`: what an NVML answer means to a reader (GPU lost, stale MIG handle, text); `error`:
//!    [`InitError`] and [`NvmlError`].
//! 6. [`convert`]: pure mapping from DCGM fields to NVML calls and units.
//! 7. [`api::NvmlApi`]: the narrow seam, one method per NVML call; [`real::RealNvml`] is the
//!    only code that touches `nvml-wrapper` (over `ffi`, the raw calls it lacks),
//!    `FakeNvml` (crates/gpu-exporter-testing) an in-memory GPU fleet for tests, [`counting::Counting`] counts calls.

pub mod api;
mod call;
pub mod convert;
pub mod counting;
mod discovery;
mod error;
mod events;
mod ffi;
mod lifecycle;
mod nvlink;
mod processes;
mod read;
pub mod real;
mod state;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::catalog::Field;
use crate::gpu::{Device, DeviceSample, FieldError, GpuProcess, GpuSource, SourceError, XidEvent};

use api::NvmlApi;
use call::Lost;
use convert::Plan;
pub use error::{InitError, NvmlError};
use events::XidQueue;
use state::State;

/// How NVML initialisation is retried while it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay after the first failure.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    /// 1 s, doubling to 60 s.
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

type InitFn<A> = dyn Fn() -> Result<A, InitError> + Send + Sync;

/// The NVML-backed [`GpuSource`], generic over the low-level API so it runs against
/// `FakeNvml` (crates/gpu-exporter-testing) in tests. Construct the real one with [`NvmlSource::real`].
pub struct NvmlSource<A: NvmlApi> {
    init: Box<InitFn<A>>,
    retry: RetryPolicy,
    state: Mutex<State<A>>,
    xids: Arc<XidQueue>,
    /// Set when a MIG handle turned out stale; taken by [`GpuSource::wants_rediscovery`].
    rediscover: AtomicBool,
    /// How often the per-link NVLink error counters are re-read (`nvlink`).
    link_error_period: Duration,
}

impl<A: NvmlApi> std::fmt::Debug for NvmlSource<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("init_error", &self.init_error())
            .finish_non_exhaustive()
    }
}
impl<A: NvmlApi> NvmlSource<A> {
    /// A source that initialises NVML with `init` now and, while that fails, again at most
    /// once per backoff delay (on [`GpuSource::devices`] calls).
    pub fn new(
        init: impl Fn() -> Result<A, InitError> + Send + Sync + 'static,
        retry: RetryPolicy,
    ) -> Self {
        let source = Self {
            init: Box::new(init),
            retry,
            state: Mutex::new(State::Pending {
                error: InitError::Failed("not attempted".into()),
                delay: Duration::ZERO,
                next_attempt: Instant::now(),
                attempts: 0,
            }),
            rediscover: AtomicBool::new(false),
            xids: Arc::new(XidQueue::default()),
            link_error_period: nvlink::DEFAULT_ERROR_PERIOD,
        };
        // The first attempt (and discovery) happens now, so the composition root knows whether
        // NVML is up before it filters the catalog.
        if let Err(e) = source.devices() {
            tracing::debug!(error = %crate::error_chain(&e), "NVML not available at startup");
        }
        source
    }

    /// Why NVML is not initialised, or `None` once it is.
    pub fn init_error(&self) -> Option<InitError> {
        match &*self.lock() {
            State::Pending { error, .. } => Some(error.clone()),
            State::Ready(_) => None,
        }
    }

    /// Initialisation attempts made so far (0 once initialised counts the successful one).
    pub fn init_attempts(&self) -> u64 {
        match &*self.lock() {
            State::Pending { attempts, .. } => *attempts,
            State::Ready(_) => 0,
        }
    }

    /// Blocks until at least `n` XIDs are queued or `timeout` passes; returns whether they are.
    /// For tests and tools that need to know the event thread has delivered.
    pub fn wait_for_xids(&self, n: usize, timeout: Duration) -> bool {
        let items = self
            .xids
            .items
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (items, _) = self
            .xids
            .added
            .wait_timeout_while(items, timeout, |v| v.len() < n)
            .unwrap_or_else(PoisonError::into_inner);
        items.len() >= n
    }

    /// How often the per-link NVLink error counters are re-read (default
    /// `nvlink::DEFAULT_ERROR_PERIOD`, 30 s); the ticks in between serve the last values.
    /// `Duration::ZERO` reads them every tick.
    #[must_use]
    pub fn with_link_error_period(mut self, period: Duration) -> Self {
        self.link_error_period = period;
        self
    }
}

impl NvmlSource<real::RealNvml> {
    /// The NVML source over the real library, retrying initialisation per `retry`.
    pub fn real(retry: RetryPolicy) -> Self {
        NvmlSource::new(real::RealNvml::init, retry)
    }
}

impl<A: NvmlApi> GpuSource for NvmlSource<A> {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn supports(&self, field: Field) -> bool {
        // GPM (profiling) fields are decided per GPU: `field_gap` says which GPUs lack them.
        !matches!(convert::plan(field), Plan::Unavailable)
    }

    fn field_gap(&self, device: &Device, field: Field) -> Option<crate::gpu::FieldGap> {
        if !matches!(convert::plan(field), Plan::Gpm(_)) {
            return None;
        }
        let state = self.lock();
        let State::Ready(ready) = &*state else {
            return None;
        };
        let g = ready.gpus.get(&device.identity.uuid)?;
        (!g.gpm).then_some(crate::gpu::FieldGap::ProfilingNeedsDcgm)
    }

    fn devices(&self) -> Result<Vec<Device>, SourceError> {
        let mut state = self.lock();
        let ready = self
            .ensure_ready(&mut state)
            .map_err(|e| SourceError::Discovery {
                cause: Box::new(NvmlError::NotInitialised(e)),
            })?;
        self.discover(ready)
    }

    fn sample(&self, device: &Device, fields: &[Field]) -> Result<DeviceSample, SourceError> {
        let index = device.identity.index;
        let uuid = device.identity.uuid.clone();
        let mut state = self.lock();
        let State::Ready(ready) = &mut *state else {
            let cause = match &*state {
                State::Pending { error, .. } => NvmlError::NotInitialised(error.clone()),
                State::Ready(_) => NvmlError::Unknown(uuid.clone()),
            };
            return Err(SourceError::Device {
                index,
                uuid,
                cause: Box::new(cause),
            });
        };
        let api = Arc::clone(&ready.api);
        let Some(g) = ready.gpus.get_mut(&uuid) else {
            return Err(SourceError::Device {
                index,
                uuid: uuid.clone(),
                cause: Box::new(NvmlError::Unknown(uuid)),
            });
        };
        let result = read::read_device(
            &*api,
            &ready.system,
            g,
            device,
            fields,
            self.link_error_period,
        );
        if std::mem::take(&mut g.mig_stale) {
            tracing::info!(gpu = index, %uuid, "a MIG device handle is no longer valid (instances destroyed or recreated); re-enumerating at the next tick");
            self.rediscover.store(true, Ordering::Relaxed);
        }
        match result {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(SourceError::Device {
                index,
                uuid,
                cause: Box::new(e),
            }),
            Err(Lost) => {
                // Deltas across a loss are meaningless.
                g.prev_gpm = None;
                g.prev_mig_gpm.clear();
                g.prev_nvlink = None;
                g.links.reset();
                Err(SourceError::GpuLost { index, uuid })
            }
        }
    }

    fn processes(&self, device: &Device) -> Result<Vec<GpuProcess>, FieldError> {
        let mut state = self.lock();
        let State::Ready(ready) = &mut *state else {
            return Err(FieldError::Failed);
        };
        let api = Arc::clone(&ready.api);
        let g = ready
            .gpus
            .get_mut(&device.identity.uuid)
            .ok_or(FieldError::Failed)?;
        let result = processes::read(
            &*api,
            &g.handle,
            &g.mig,
            &mut g.procs,
            &mut g.mig_stale,
            device,
        );
        if std::mem::take(&mut g.mig_stale) {
            tracing::info!(gpu = device.identity.index, uuid = %device.identity.uuid, "a MIG device handle is no longer valid (instances destroyed or recreated); re-enumerating at the next tick");
            self.rediscover.store(true, Ordering::Relaxed);
        }
        result
    }

    fn wants_rediscovery(&self) -> bool {
        self.rediscover.swap(false, Ordering::Relaxed)
    }

    fn drain_xids(&self) -> Vec<(String, XidEvent)> {
        self.xids.drain()
    }
}

#[cfg(test)]
mod tests;
