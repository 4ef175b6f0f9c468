//! The NVML backend's errors: why initialisation failed, and what a call or a device
//! lookup reports as the `cause` of a [`SourceError`](crate::gpu::SourceError).

use super::api::ApiError;

/// Why NVML could not be initialised. The text says what is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InitError {
    /// The library could not be loaded.
    #[error("cannot load libnvidia-ml.so.1 ({detail}): the NVIDIA driver is not installed on this node, or its libraries are not mounted into the container (run with the NVIDIA container runtime)")]
    LibraryNotFound {
        /// The loader's message.
        detail: String,
    },
    /// The library loaded but the kernel driver is not running.
    #[error("libnvidia-ml.so.1 loaded but the NVIDIA kernel driver is not loaded (NVML_ERROR_DRIVER_NOT_LOADED); waiting for the driver")]
    DriverNotLoaded,
    /// No permission to talk to the driver.
    #[error("NVML initialisation was refused (NVML_ERROR_NO_PERMISSION): the process cannot open /dev/nvidiactl and /dev/nvidia*")]
    NoPermission,
    /// Anything else.
    #[error("NVML initialisation failed: {0}")]
    Failed(String),
}

/// Errors of this module, as the `cause` of a [`SourceError`](crate::gpu::SourceError).
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// NVML is not initialised (yet); initialisation is retried with backoff.
    #[error("NVML is not initialised")]
    NotInitialised(#[source] InitError),
    /// An NVML call failed.
    #[error("{call}")]
    Call {
        /// The C function.
        call: &'static str,
        /// What it returned.
        #[source]
        cause: ApiError,
    },
    /// The device was not found by the last discovery.
    #[error("GPU {0} is not among the discovered devices")]
    Unknown(String),
}
