//! Raw NVML calls `nvml-wrapper` lacks or gets wrong, through its loaded symbol table:
//! field values with per-entry `scopeId` (the wrapper always sends 0, so NVLink throughput
//! "all links" is unreachable through it), the GPU/compute instance ids of a MIG device, the
//! GPU instance profile and MIG device attributes, the raw brand, the non-deprecated clock
//! event reasons call, and XID event sets (nvml-wrapper's event data needs an NVML call per
//! event to name the device, which fails for a GPU that fell off the bus, and turns XID 999,
//! "unknown", into nothing).
//!
//! This is the bottom layer of the real backend: it depends on `nvml-wrapper` and [`super::api`]
//! only, and [`super::real`] builds on it.
//!
//! One of the three modules allowed `unsafe` (the crate documentation lists them): every block
//! calls one NVML function with pointers to live, correctly sized locals, as `nvml.h` documents
//! for it, or zero-fills a plain C struct for it; each says so in its `// SAFETY:` note.
#![allow(unsafe_code)]

use std::ffi::CStr;

use nvml_wrapper::error::nvml_try;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlBrandType_t, nvmlDeviceAttributes_t, nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t,
    nvmlEventTypeXidCriticalError, nvmlFieldValue_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstanceProfileInfo_v2_t, nvmlGpuInstance_t, nvmlGridLicensableFeatures_t, nvmlReturn_t,
    nvmlValue_t, NVML_GPU_INSTANCE_PROFILE_COUNT,
};

use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::Device;

use super::api::{
    ApiError, FieldRequest, FieldResult, FieldValue, GiProfile, GridLicensing, ValueType,
};
use super::convert::{translate_field_id, FieldIdScheme};

/// Maps an `nvml-wrapper` error to ours.
pub(super) fn api_error(e: WrapperError) -> ApiError {
    match e {
        WrapperError::NotSupported
        | WrapperError::FailedToLoadSymbol(_)
        | WrapperError::FunctionNotFound => ApiError::NotSupported,
        WrapperError::NoPermission => ApiError::NoPermission,
        WrapperError::NotFound => ApiError::NotFound,
        WrapperError::InvalidArg => ApiError::InvalidArgument,
        WrapperError::GpuLost => ApiError::GpuLost,
        WrapperError::Timeout => ApiError::Timeout,
        other => ApiError::Other(other.to_string()),
    }
}

fn missing(e: impl std::fmt::Display) -> ApiError {
    tracing::debug!(error = %e, "NVML symbol missing from this driver");
    ApiError::NotSupported
}

fn ret(code: nvmlReturn_t) -> Result<(), ApiError> {
    nvml_try(code).map_err(api_error)
}

/// `nvmlReturn` written into each entry before the call: not a code NVML returns, so an entry
/// that still holds it was not filled (NVML bug 2009232: ECC fields with ECC disabled).
const NOT_FILLED: nvmlReturn_t = 0x7E57_0000;
/// `valueType` written before the call: not a type NVML uses, so an entry that still holds it
/// after `NVML_SUCCESS` had its type left unset (NVML bug 2032468).
const TYPE_UNSET: u32 = 0x7E57_0001;

/// `nvmlDeviceGetFieldValues` with each request's `scopeId`, ids translated to the driver's
/// numbering (requests the driver has no id for answer `NotSupported` without being sent).
/// Each entry is pre-set with sentinels, so entries NVML leaves alone are told apart from
/// values (a zeroed entry reads as a successful `0.0`).
pub(super) fn field_values(
    nvml: &Nvml,
    scheme: FieldIdScheme,
    d: &Device<'_>,
    requests: &[FieldRequest],
) -> Result<Vec<FieldResult>, ApiError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(missing)?;
    let ids: Vec<Option<u32>> = requests
        .iter()
        .map(|r| translate_field_id(scheme, r.id))
        .collect();
    let mut values: Vec<nvmlFieldValue_t> = requests
        .iter()
        .zip(&ids)
        .filter_map(|(r, id)| {
            id.map(|id| nvmlFieldValue_t {
                fieldId: id,
                scopeId: r.scope,
                timestamp: 0,
                latencyUsec: 0,
                valueType: TYPE_UNSET,
                nvmlReturn: NOT_FILLED,
                value: nvmlValue_t { ullVal: 0 },
            })
        })
        .collect();
    if !values.is_empty() {
        let count =
            i32::try_from(values.len()).map_err(|_| ApiError::Other("too many fields".into()))?;
        // SAFETY: `values` holds `count` initialised entries that NVML fills in place; the
        // device handle is valid for the lifetime of the leaked `Nvml` it came from.
        ret(unsafe { sym(d.handle(), count, values.as_mut_ptr()) })?;
    }
    let mut filled = values.iter();
    Ok(ids
        .iter()
        .map(|id| match id.and(filled.next()) {
            None => FieldResult {
                timestamp_us: 0,
                value: Err(ApiError::NotSupported),
            },
            Some(v) => FieldResult {
                timestamp_us: v.timestamp,
                value: entry(v),
            },
        })
        .collect())
}

/// One field-values entry as NVML left it.
fn entry(v: &nvmlFieldValue_t) -> Result<FieldValue, ApiError> {
    if v.nvmlReturn == NOT_FILLED {
        return Err(ApiError::NotSupported);
    }
    ret(v.nvmlReturn)?;
    // SAFETY: every member of the union covers its first bytes and `ullVal` all eight; all
    // eight were initialised (to 0) before NVML wrote the member it chose.
    let raw = unsafe { v.value.ullVal }.to_ne_bytes();
    let value_type = if v.valueType == TYPE_UNSET {
        ValueType::Unset
    } else {
        ValueType::from_raw(v.valueType)
    };
    Ok(FieldValue { value_type, raw })
}

/// `nvmlDeviceGetBrand`, as the raw `nvmlBrandType_t` (nvml-wrapper's enum refuses values it
/// does not know, and its names are not DCGM's).
pub(super) fn brand(nvml: &Nvml, d: &Device<'_>) -> Result<u32, ApiError> {
    let sym = nvml.lib().nvmlDeviceGetBrand.as_ref().map_err(missing)?;
    let mut brand: nvmlBrandType_t = 0;
    // SAFETY: `brand` is a live enum-sized out-value the call writes; the handle is valid.
    ret(unsafe { sym(d.handle(), &mut brand) })?;
    Ok(brand)
}

/// `nvmlDeviceGetGpuInstanceId`.
pub(super) fn gpu_instance_id(nvml: &Nvml, mig: &Device<'_>) -> Result<u32, ApiError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetGpuInstanceId
        .as_ref()
        .map_err(missing)?;
    let mut id = 0u32;
    // SAFETY: `id` is a live u32 the call writes; the handle is a valid MIG device handle.
    ret(unsafe { sym(mig.handle(), &mut id) })?;
    Ok(id)
}

/// `nvmlDeviceGetComputeInstanceId`.
pub(super) fn compute_instance_id(nvml: &Nvml, mig: &Device<'_>) -> Result<u32, ApiError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetComputeInstanceId
        .as_ref()
        .map_err(missing)?;
    let mut id = 0u32;
    // SAFETY: as for `gpu_instance_id`.
    ret(unsafe { sym(mig.handle(), &mut id) })?;
    Ok(id)
}

/// `nvmlDeviceGetGridLicensableFeatures_v4` (the versioned name `nvml.h` maps the call to; its
/// structure has the licence expiry the older versions lack).
pub(super) fn grid_licensing(nvml: &Nvml, d: &Device<'_>) -> Result<GridLicensing, ApiError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetGridLicensableFeatures_v4
        .as_ref()
        .map_err(missing)?;
    // SAFETY: a plain C struct of integers, arrays and chars: all zero bits is a valid value.
    let mut f: nvmlGridLicensableFeatures_t = unsafe { std::mem::zeroed() };
    // SAFETY: `f` is a live, correctly sized struct the call fills; the handle is valid.
    ret(unsafe { sym(d.handle(), &mut f) })?;
    let count = usize::try_from(f.licensableFeaturesCount)
        .unwrap_or(usize::MAX)
        .min(f.gridLicensableFeatures.len());
    Ok(GridLicensing {
        supported: f.isGridLicenseSupported != 0,
        features: f.gridLicensableFeatures[..count]
            .iter()
            .map(|x| (x.featureCode, x.featureState))
            .collect(),
    })
}

/// `nvmlDeviceGetCurrentClocksEventReasons`.
pub(super) fn clocks_event_reasons(nvml: &Nvml, d: &Device<'_>) -> Result<u64, ApiError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetCurrentClocksEventReasons
        .as_ref()
        .map_err(missing)?;
    let mut mask = 0u64;
    // SAFETY: `mask` is a live u64 the call writes; the handle is valid.
    ret(unsafe { sym(d.handle(), &mut mask) })?;
    Ok(mask)
}

/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`.
fn profile_info_v2_version() -> u32 {
    (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24)
}

/// Where GPU instance `gi_id` on `parent` sits: `nvmlGpuInstanceGetInfo`'s profile id and
/// placement.
pub(super) fn gpu_instance_placement(
    nvml: &Nvml,
    parent: &Device<'_>,
    gi_id: u32,
) -> Result<crate::gpu::MigPlacement, ApiError> {
    let lib = nvml.lib();
    let by_id = lib.nvmlDeviceGetGpuInstanceById.as_ref().map_err(missing)?;
    let get_info = lib.nvmlGpuInstanceGetInfo.as_ref().map_err(missing)?;
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `gi` is a live out-pointer; the parent handle is valid.
    ret(unsafe { by_id(parent.handle(), gi_id, &mut gi) })?;
    // SAFETY: all-zero is a valid bit pattern for this plain C struct (ints and pointers).
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `gi` was just returned by NVML; `info` is a live out-struct.
    ret(unsafe { get_info(gi, &mut info) })?;
    Ok(crate::gpu::MigPlacement {
        profile_id: info.profileId,
        start: info.placement.start,
        size: info.placement.size,
    })
}

/// The profile of GPU instance `gi_id` on `parent`: GPU instance → its profile id → the v2
/// profile info (slice count, memory size, name).
pub(super) fn gpu_instance_profile(
    nvml: &Nvml,
    parent: &Device<'_>,
    gi_id: u32,
) -> Result<GiProfile, ApiError> {
    let lib = nvml.lib();
    let by_id = lib.nvmlDeviceGetGpuInstanceById.as_ref().map_err(missing)?;
    let get_info = lib.nvmlGpuInstanceGetInfo.as_ref().map_err(missing)?;
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `gi` is a live out-pointer; the parent handle is valid.
    ret(unsafe { by_id(parent.handle(), gi_id, &mut gi) })?;
    // SAFETY: all-zero is a valid bit pattern for this plain C struct (ints and pointers).
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `gi` was just returned by NVML; `info` is a live out-struct.
    ret(unsafe { get_info(gi, &mut info) })?;

    // SAFETY: all-zero is a valid bit pattern (ints and a char array).
    let mut p: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    p.version = profile_info_v2_version();
    let found = match lib.nvmlDeviceGetGpuInstanceProfileInfoByIdV.as_ref() {
        // SAFETY: `p` is a live, versioned out-struct; the handle is valid.
        Ok(sym) => ret(unsafe { sym(parent.handle(), info.profileId, &mut p) }).is_ok(),
        Err(_) => false,
    };
    if !found {
        // Older drivers: scan the profiles for the one with this id.
        let sym = lib
            .nvmlDeviceGetGpuInstanceProfileInfoV
            .as_ref()
            .map_err(missing)?;
        let mut hit = false;
        for profile in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            // SAFETY: all-zero is a valid bit pattern.
            let mut q: nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
            q.version = profile_info_v2_version();
            // SAFETY: `q` is a live, versioned out-struct; the handle is valid.
            if ret(unsafe { sym(parent.handle(), profile, &mut q) }).is_ok()
                && q.id == info.profileId
            {
                p = q;
                hit = true;
                break;
            }
        }
        if !hit {
            return Err(ApiError::NotFound);
        }
    }
    // The name is NUL-terminated within its fixed array; never read past it.
    let bytes: Vec<u8> = p.name.iter().map(|&c| c as u8).collect();
    let name = CStr::from_bytes_until_nul(&bytes)
        .map_err(|_| ApiError::Other("profile name not terminated".into()))?;
    Ok(GiProfile {
        slices: p.sliceCount,
        memory_mib: p.memorySizeMB,
        name: name.to_string_lossy().into_owned(),
    })
}

/// `nvmlDeviceGetAttributes_v2` of a MIG device: its GPU instance's slices and memory.
pub(super) fn mig_attributes(nvml: &Nvml, mig: &Device<'_>) -> Result<GiProfile, ApiError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetAttributes_v2
        .as_ref()
        .map_err(missing)?;
    // SAFETY: all-zero is a valid bit pattern for this plain C struct of integers.
    let mut a: nvmlDeviceAttributes_t = unsafe { std::mem::zeroed() };
    // SAFETY: `a` is a live out-struct the call fills; the handle is a valid MIG handle.
    ret(unsafe { sym(mig.handle(), &mut a) })?;
    Ok(GiProfile {
        slices: a.gpuInstanceSliceCount,
        memory_mib: a.memorySizeMB,
        name: String::new(),
    })
}

/// `nvmlEventTypeXidCriticalError`.
const XID_CRITICAL_ERROR: u64 = nvmlEventTypeXidCriticalError as u64;

/// A registered NVML event set, freed on drop. Waits map each event's device handle to the
/// position the device had at registration, so reporting an event needs no further NVML call
/// (one on a GPU that fell off the bus would fail).
pub(super) struct EventSet {
    nvml: &'static Nvml,
    set: nvmlEventSet_t,
    /// Registered device handles and their positions in the registration request.
    devices: Vec<(nvmlDevice_t, usize)>,
}

// SAFETY: NVML is thread-safe; the set and the handles are plain identifiers NVML owns, valid
// for the process (the library is never unloaded), and the set is used from one thread at a
// time (`wait` takes `&mut self`).
unsafe impl Send for EventSet {}

impl std::fmt::Debug for EventSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSet")
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

impl Drop for EventSet {
    fn drop(&mut self) {
        if let Ok(free) = self.nvml.lib().nvmlEventSetFree.as_ref() {
            // SAFETY: `set` came from nvmlEventSetCreate and is freed exactly once, here.
            let _ = unsafe { free(self.set) };
        }
    }
}

/// One event taken from a set.
pub(super) enum Event {
    /// An XID on the device at this registration position.
    Xid {
        /// Position of the device in the registration request.
        device: usize,
        /// `eventData`: the XID (999 for an XID the driver does not know).
        xid: u64,
    },
    /// Any other event type, or an event from a handle that was not registered.
    Other,
}

impl EventSet {
    /// `nvmlEventSetWait_v2`. `Ok(None)` on timeout.
    pub(super) fn wait(&mut self, timeout_ms: u32) -> Result<Option<Event>, ApiError> {
        let sym = self
            .nvml
            .lib()
            .nvmlEventSetWait_v2
            .as_ref()
            .map_err(missing)?;
        // SAFETY: all-zero is a valid bit pattern (a null handle and integers).
        let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is live (freed only on drop); `data` is a live out-struct.
        match ret(unsafe { sym(self.set, &mut data, timeout_ms) }) {
            Ok(()) => {}
            Err(ApiError::Timeout) => return Ok(None),
            Err(e) => return Err(e),
        }
        if data.eventType & XID_CRITICAL_ERROR == 0 {
            return Ok(Some(Event::Other));
        }
        Ok(Some(
            match self.devices.iter().find(|(h, _)| *h == data.device) {
                Some(&(_, device)) => Event::Xid {
                    device,
                    xid: data.eventData,
                },
                None => Event::Other,
            },
        ))
    }
}

/// `nvmlEventSetCreate` + `nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError)` on each
/// device. A device that cannot register is skipped and returned with its error; after any
/// failure other than `NOT_SUPPORTED` (which leaves the set usable, per nvml.h) registration
/// starts over on a fresh set without that device.
pub(super) fn xid_event_set(
    nvml: &'static Nvml,
    devices: &[&Device<'_>],
) -> Result<(EventSet, Vec<(usize, ApiError)>), ApiError> {
    let lib = nvml.lib();
    let create = lib.nvmlEventSetCreate.as_ref().map_err(missing)?;
    let register = lib.nvmlDeviceRegisterEvents.as_ref().map_err(missing)?;
    let mut skipped: Vec<(usize, ApiError)> = Vec::new();
    'fresh: loop {
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        // SAFETY: `set` is a live out-pointer.
        ret(unsafe { create(&mut set) })?;
        let mut out = EventSet {
            nvml,
            set,
            devices: Vec::with_capacity(devices.len()),
        };
        for (i, d) in devices.iter().enumerate() {
            if skipped.iter().any(|(s, _)| *s == i) {
                continue;
            }
            // SAFETY: the handle is valid; the set is live.
            let handle = unsafe { d.handle() };
            // SAFETY: as above.
            match ret(unsafe { register(handle, XID_CRITICAL_ERROR, set) }) {
                Ok(()) => out.devices.push((handle, i)),
                Err(ApiError::NotSupported) => skipped.push((i, ApiError::NotSupported)),
                Err(e) => {
                    skipped.push((i, e));
                    continue 'fresh; // `out` drops here, freeing the set
                }
            }
        }
        return Ok((out, skipped));
    }
}
