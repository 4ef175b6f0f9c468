//! NVML's lifecycle inside [`NvmlSource`]: initialisation retried with backoff while the
//! library or the driver is missing, into the ready state (`state`).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use crate::gpu::Value;

use super::api::NvmlApi;
use super::call::text;
use super::convert::{self, StaticFact};
use super::error::InitError;
use super::state::{Ready, State};
use super::NvmlSource;

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
