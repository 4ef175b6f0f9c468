//! An in-memory [`NvmlApi`](gpu_exporter::gpu::nvml::api::NvmlApi): GPUs whose every NVML answer a test sets, and that can be made
//! to fall off the bus, vanish, return, or raise an XID. Used by the backend's tests and by
//! benchmarks that count NVML calls; never by the exporter itself.
//!
//! Layout: `gpu` holds one fake GPU (its MIG devices, links and every answer); this file the
//! fake NVML that holds the fleet and the calls a test makes on it; `api` its answers to each
//! [`NvmlApi`](gpu_exporter::gpu::nvml::api::NvmlApi) call.

mod api;
mod gpu;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use gpu_exporter::gpu::nvml::api::{ApiError, EventWait, GpmMetric, ProcessInfo, XidReport};

pub use gpu::{FakeGpu, FakeLink, FakeMig};

/// The whole fake NVML.
#[derive(Debug, Clone, Default)]
pub struct FakeState {
    /// Driver version string.
    pub driver_version: String,
    /// GPUs, including those not `present`.
    pub gpus: Vec<FakeGpu>,
}

/// A device handle of the fake: a GPU index into [`FakeState::gpus`] and, for a MIG device,
/// its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeHandle {
    gpu: usize,
    slot: Option<usize>,
}

/// A GPM sample of the fake: the values configured when it was taken.
#[derive(Debug)]
pub struct FakeGpmSample {
    owner: (usize, Option<u32>),
    seq: u64,
    values: HashMap<GpmMetric, f64>,
}

/// The fake's event set.
#[derive(Debug)]
pub struct FakeEvents {
    rx: mpsc::Receiver<XidReport>,
    failures: Arc<Mutex<VecDeque<ApiError>>>,
    at_once: Arc<Mutex<Option<WaitAnswer>>>,
    waits: Arc<AtomicU64>,
}

/// What `nvmlEventSetWait_v2` answers: an XID, nothing (`Ok(None)`), or an error.
pub type WaitAnswer = Result<Option<XidReport>, ApiError>;

impl EventWait for FakeEvents {
    fn wait(&mut self, timeout_ms: u32) -> Result<Option<XidReport>, ApiError> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        let at_once = self
            .at_once
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(answer) = at_once {
            return answer;
        }
        let failure = self
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        if let Some(e) = failure {
            return Err(e);
        }
        match self
            .rx
            .recv_timeout(Duration::from_millis(u64::from(timeout_ms)))
        {
            Ok(r) => Ok(Some(r)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(ApiError::Other("event set closed".into()))
            }
        }
    }
}

/// The in-memory NVML. Clones share state, so a test keeps one to change the fleet while the
/// source under test holds another.
#[derive(Debug, Clone, Default)]
pub struct FakeNvml {
    state: Arc<Mutex<FakeState>>,
    events: Arc<Mutex<Option<Registration>>>,
    wait_failures: Arc<Mutex<VecDeque<ApiError>>>,
    wait_at_once: Arc<Mutex<Option<WaitAnswer>>>,
    waits: Arc<AtomicU64>,
    sets_created: Arc<Mutex<u64>>,
    seq: Arc<Mutex<u64>>,
}

/// The current event set's sender and the GPUs (indices into [`FakeState::gpus`]) it
/// registered, by position.
#[derive(Debug)]
struct Registration {
    tx: mpsc::Sender<XidReport>,
    gpus: Vec<Option<usize>>,
}

impl FakeNvml {
    /// A fake with `gpus` and driver `driver_version`.
    pub fn new(driver_version: &str, gpus: Vec<FakeGpu>) -> Self {
        Self {
            state: Arc::new(Mutex::new(FakeState {
                driver_version: driver_version.into(),
                gpus,
            })),
            ..Self::default()
        }
    }

    /// Changes the fleet.
    pub fn update(&self, f: impl FnOnce(&mut FakeState)) {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Delivers an XID on the GPU with `uuid` through the current event set. Returns false if
    /// no set is registered for that GPU. Like NVML, it works for a GPU that fell off the bus.
    pub fn raise_xid(&self, uuid: &str, xid: u64) -> bool {
        let gpu = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .gpus
            .iter()
            .position(|g| g.uuid == uuid);
        let reg = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        reg.as_ref().is_some_and(|r| {
            r.gpus
                .iter()
                .position(|g| g.is_some() && *g == gpu)
                .is_some_and(|device| r.tx.send(XidReport { device, xid }).is_ok())
        })
    }

    /// Makes the next waits on any event set fail with these errors, in order.
    pub fn fail_event_waits(&self, errors: impl IntoIterator<Item = ApiError>) {
        self.wait_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(errors);
    }

    /// Makes every wait on any event set return `answer` at once instead of blocking (a driver
    /// that answers `NVML_ERROR_TIMEOUT` or an error without waiting, or floods XIDs); `None`
    /// restores blocking waits.
    pub fn answer_event_waits_at_once(&self, answer: Option<WaitAnswer>) {
        *self
            .wait_at_once
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = answer;
    }

    /// `nvmlEventSetWait_v2` calls so far, on every event set.
    pub fn event_waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// Event sets created so far.
    pub fn event_sets_created(&self) -> u64 {
        *self
            .sets_created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn with<T>(
        &self,
        h: &FakeHandle,
        f: impl FnOnce(&FakeGpu, Option<&FakeMig>) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let g = st.gpus.get(h.gpu).ok_or(ApiError::NotFound)?;
        if g.lost {
            return Err(ApiError::GpuLost);
        }
        match h.slot {
            None => f(g, None),
            Some(s) => match g.mig.get(s) {
                Some(Some(m)) => f(g, Some(m)),
                _ => Err(ApiError::NotFound),
            },
        }
    }

    fn gpu<T>(&self, h: &FakeHandle, f: impl FnOnce(&FakeGpu) -> Option<T>) -> Result<T, ApiError> {
        self.with(h, |g, m| match m {
            None => f(g).ok_or(ApiError::NotSupported),
            Some(_) => Err(ApiError::NotSupported),
        })
    }
}

impl FakeNvml {
    fn processes_of(&self, d: &FakeHandle, mps: bool) -> Result<Vec<ProcessInfo>, ApiError> {
        self.with(d, |g, m| match (m, mps) {
            (Some(m), false) => Ok(m.processes.clone()),
            (Some(_), true) => Ok(Vec::new()),
            (None, false) => g.processes.clone(),
            (None, true) => g.mps_processes.clone(),
        })
    }

    fn gpm_take(
        &self,
        owner: (usize, Option<u32>),
        values: HashMap<GpmMetric, f64>,
    ) -> FakeGpmSample {
        let mut seq = self.seq.lock().unwrap_or_else(PoisonError::into_inner);
        *seq += 1;
        FakeGpmSample {
            owner,
            seq: *seq,
            values,
        }
    }
}
