//! NVML's lifecycle inside [`NvmlSource`]: the source's state (not initialised yet, or ready
//! with its GPUs), and initialisation retried with backoff while the library or the driver is
//! missing.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use crate::gpu::{GpuIdentity, Reading, Value};

use super::api::NvmlApi;
use super::convert::{self, NvlinkCounter, StaticFact};
use super::events::EventThread;
use super::read::text;
use super::{InitError, NvmlSource};

pub(super) enum State<A: NvmlApi> {
    Pending {
        error: InitError,
        delay: Duration,
        next_attempt: Instant,
        attempts: u64,
    },
    Ready(Box<Ready<A>>),
}

pub(super) struct Ready<A: NvmlApi> {
    pub(super) api: Arc<A>,
    pub(super) system: Vec<(StaticFact, Reading)>,
    pub(super) gpus: HashMap<String, GpuState<A>>,
    pub(super) events: Option<EventThread>,
}

pub(super) struct GpuState<A: NvmlApi> {
    pub(super) handle: A::Device,
    pub(super) identity: GpuIdentity,
    pub(super) statics: Vec<(StaticFact, Reading)>,
    pub(super) gpm: bool,
    pub(super) mig: Vec<(u32, A::Device)>,
    pub(super) prev_gpm: Option<A::GpmSample>,
    pub(super) prev_mig_gpm: HashMap<u32, A::GpmSample>,
    pub(super) prev_nvlink: Option<NvlinkCounter>,
    pub(super) procs: super::processes::ProcessTracker,
    /// Per-link NVLink state (active links, previous counters, cached error counters).
    pub(super) links: super::nvlink::Links,
    /// A MIG handle answered "invalid argument" or "not found" this tick: the instances were
    /// destroyed or recreated, and the handles must be enumerated again.
    pub(super) mig_stale: bool,
}

impl<A: NvmlApi> NvmlSource<A> {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State<A>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tries to initialise if due. Returns the ready state or the init error.
    pub(super) fn ensure_ready<'a>(
        &self,
        state: &'a mut State<A>,
    ) -> Result<&'a mut Ready<A>, InitError> {
        if let State::Pending {
            error,
            delay,
            next_attempt,
            attempts,
        } = state
        {
            let now = Instant::now();
            if now < *next_attempt {
                return Err(error.clone());
            }
            *attempts += 1;
            match (self.init)() {
                Ok(api) => {
                    let api = Arc::new(api);
                    let system = vec![
                        (StaticFact::DriverVersion, text(api.driver_version())),
                        (StaticFact::NvmlVersion, text(api.nvml_version())),
                        (
                            StaticFact::CudaDriverVersion,
                            api.cuda_driver_version()
                                .map(|v| Value::Int(i64::from(v)))
                                .map_err(|e| convert::field_error(&e)),
                        ),
                    ];
                    let driver = match &system[0].1 {
                        Ok(v) => v.to_string(),
                        Err(e) => e.as_str().to_owned(),
                    };
                    tracing::info!(%driver, attempts = *attempts, "NVML initialised");
                    *state = State::Ready(Box::new(Ready {
                        api,
                        system,
                        gpus: HashMap::new(),
                        events: None,
                    }));
                }
                Err(e) => {
                    let prev = (*attempts > 1).then_some(*delay);
                    *delay = convert::next_backoff(prev, self.retry.initial, self.retry.max);
                    *next_attempt = now + *delay;
                    if *error != e || *attempts == 1 {
                        tracing::warn!(retry_in_s = delay.as_secs_f64(), "{e}");
                    }
                    *error = e.clone();
                    return Err(e);
                }
            }
        }
        match state {
            State::Ready(r) => Ok(r),
            State::Pending { error, .. } => Err(error.clone()),
        }
    }
}
