//! What NVML's answers mean to a reader, below every reader: a lost GPU aborts the device read,
//! a stale MIG handle asks for rediscovery, text answers become readings.

use crate::gpu::{Reading, Value};

use super::api::ApiError;
use super::convert;

/// A device read aborted because the GPU fell off the bus.
pub(super) struct Lost;

/// Passes a call result through, aborting the device read on `GpuLost`.
pub(super) fn check<T>(r: Result<T, ApiError>) -> Result<Result<T, ApiError>, Lost> {
    match r {
        Err(ApiError::GpuLost) => Err(Lost),
        other => Ok(other),
    }
}

/// A text answer as a reading.
pub(super) fn text(r: Result<String, ApiError>) -> Reading {
    r.map(Value::Text).map_err(|e| convert::field_error(&e))
}

/// Whether an error from a MIG handle (or a GPU instance id) means the instance behind it was
/// destroyed or recreated since discovery.
pub(super) fn is_stale(e: &ApiError) -> bool {
    matches!(e, ApiError::InvalidArgument | ApiError::NotFound)
}
