//! The C ABI of DCGM's client library (`libdcgm.so.4`), loaded with `dlopen` at run time. The
//! struct layouts and versions follow DCGM 4.x's public headers (`dcgm_structs.h`:
//! `MAKE_DCGM_VERSION(type, ver)` is `sizeof(type) | ver << 24`); compile-time assertions pin
//! the sizes. This and `gpu::nvml::ffi` are the crate's only `unsafe` code: every block calls one
//! DCGM function, resolved from the library this value keeps loaded, with pointers to live,
//! correctly sized and versioned locals, as `dcgm_agent.h` documents for it.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::sync::Arc;

use super::{DcgmError, Entity, EntityGroup, LatestValue, RawValue};

type Handle = usize; // dcgmHandle_t is uintptr_t
type Return = i32; // dcgmReturn_t is an enum

/// `dcgmConnectV2Params_v2`.
#[repr(C)]
struct ConnectV2Params {
    version: u32,
    persist_after_disconnect: u32,
    timeout_ms: u32,
    address_is_unix_socket: u32,
}

/// `dcgmGroupEntityPair_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct EntityPair {
    group: i32,
    id: u32,
}

/// The value union of `dcgmFieldValue_v2` (`i64`, `dbl`, `str[256]`, `blob[4096]`).
#[repr(C)]
#[derive(Clone, Copy)]
union FieldUnion {
    i64: i64,
    dbl: f64,
    blob: [u8; 4096],
}

/// `dcgmFieldValue_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
struct FieldValueV2 {
    version: u32,
    entity_group: i32,
    entity_id: u32,
    field_id: u16,
    field_type: u16,
    status: i32,
    unused: u32,
    ts: i64,
    value: FieldUnion,
}

const fn make_version(size: usize, version: u32) -> u32 {
    #[allow(clippy::cast_possible_truncation)]
    let size = size as u32;
    size | (version << 24)
}

const _: () = assert!(std::mem::size_of::<ConnectV2Params>() == 16);
const _: () = assert!(std::mem::size_of::<FieldValueV2>() == 4128);
const _: () = assert!(std::mem::size_of::<EntityPair>() == 8);
const CONNECT_V2_PARAMS_VERSION2: u32 = make_version(std::mem::size_of::<ConnectV2Params>(), 2);
const FIELD_VALUE_VERSION2: u32 = make_version(std::mem::size_of::<FieldValueV2>(), 2);
const MAX_NUM_DEVICES: usize = 32;
const FT_DOUBLE: u16 = b'd' as u16;
const FT_INT64: u16 = b'i' as u16;

type InitFn = unsafe extern "C" fn() -> Return;
type ConnectFn =
    unsafe extern "C" fn(*const std::ffi::c_char, *mut ConnectV2Params, *mut Handle) -> Return;
type DisconnectFn = unsafe extern "C" fn(Handle) -> Return;
type GetAllDevicesFn = unsafe extern "C" fn(Handle, *mut u32, *mut i32) -> Return;
type LatestValuesFn = unsafe extern "C" fn(
    Handle,
    *mut EntityPair,
    u32,
    *mut u16,
    u32,
    u32,
    *mut FieldValueV2,
) -> Return;

/// The loaded library and the functions the exporter calls. `dcgmInit` has been called;
/// dropping it calls `dcgmShutdown`.
pub struct DcgmLibrary {
    path: String,
    shutdown: InitFn,
    connect: ConnectFn,
    disconnect: DisconnectFn,
    get_all_devices: GetAllDevicesFn,
    latest_values: LatestValuesFn,
    // Last: the function pointers above point into it.
    _lib: libloading::Library,
}

impl std::fmt::Debug for DcgmLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcgmLibrary")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn check(call: &'static str, code: Return) -> Result<(), DcgmError> {
    if code == super::status::OK {
        Ok(())
    } else {
        Err(DcgmError::Call { call, code })
    }
}

impl DcgmLibrary {
    /// Loads the library (`libdcgm.so.4` through the loader's search path, or a path) and calls
    /// `dcgmInit`.
    ///
    /// # Errors
    /// [`DcgmError::Load`], [`DcgmError::Symbol`], or `dcgmInit`'s failure.
    pub fn open(path: &str) -> Result<Arc<Self>, DcgmError> {
        // SAFETY: loading runs the library's initialisers; DCGM's client library has no
        // initialisers with preconditions.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| DcgmError::Load {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
        fn sym<T: Copy>(
            lib: &libloading::Library,
            path: &str,
            name: &'static str,
        ) -> Result<T, DcgmError> {
            // SAFETY: `T` is the function type `dcgm_agent.h` declares for `name`.
            unsafe { lib.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| DcgmError::Symbol {
                    path: path.to_owned(),
                    symbol: name,
                    detail: e.to_string(),
                })
        }
        let init: InitFn = sym(&lib, path, "dcgmInit")?;
        let me = Self {
            path: path.to_owned(),
            shutdown: sym(&lib, path, "dcgmShutdown")?,
            connect: sym(&lib, path, "dcgmConnect_v2")?,
            disconnect: sym(&lib, path, "dcgmDisconnect")?,
            get_all_devices: sym(&lib, path, "dcgmGetAllDevices")?,
            latest_values: sym(&lib, path, "dcgmEntitiesGetLatestValues")?,
            _lib: lib,
        };
        // SAFETY: no arguments.
        check("dcgmInit", unsafe { init() })?;
        Ok(Arc::new(me))
    }

    /// Connects to the hostengine at `address` (`host:port`, or a unix socket path when
    /// `unix_socket`), waiting at most `timeout_ms`.
    ///
    /// # Errors
    /// `dcgmConnect_v2`'s failure (`DCGM_ST_CONNECTION_NOT_VALID`: no hostengine there).
    pub fn connect(
        self: &Arc<Self>,
        address: &str,
        unix_socket: bool,
        timeout_ms: u32,
    ) -> Result<Connection, DcgmError> {
        let addr = CString::new(address).map_err(|_| DcgmError::Call {
            call: "dcgmConnect_v2",
            code: super::status::BADPARAM,
        })?;
        let mut params = ConnectV2Params {
            version: CONNECT_V2_PARAMS_VERSION2,
            persist_after_disconnect: 0,
            timeout_ms,
            address_is_unix_socket: u32::from(unix_socket),
        };
        let mut handle: Handle = 0;
        // SAFETY: a NUL-terminated address, a versioned params struct and a handle slot, all
        // live for the call.
        check("dcgmConnect_v2", unsafe {
            (self.connect)(addr.as_ptr(), &mut params, &mut handle)
        })?;
        Ok(Connection {
            lib: Arc::clone(self),
            handle,
        })
    }
}

impl Drop for DcgmLibrary {
    fn drop(&mut self) {
        // SAFETY: no arguments; the library is still loaded (`_lib` drops after this).
        let _ = unsafe { (self.shutdown)() };
    }
}

/// A connection to a hostengine; dropping it disconnects.
pub struct Connection {
    lib: Arc<DcgmLibrary>,
    handle: Handle,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// The hostengine's GPU ids (`dcgmGetAllDevices`).
    ///
    /// # Errors
    /// The call's failure.
    pub fn gpu_ids(&self) -> Result<Vec<u32>, DcgmError> {
        let mut ids = [0u32; MAX_NUM_DEVICES];
        let mut count: i32 = 0;
        // SAFETY: an array of DCGM_MAX_NUM_DEVICES ids and a count, live for the call.
        check("dcgmGetAllDevices", unsafe {
            (self.lib.get_all_devices)(self.handle, ids.as_mut_ptr(), &mut count)
        })?;
        let n = usize::try_from(count).unwrap_or(0).min(MAX_NUM_DEVICES);
        Ok(ids[..n].to_vec())
    }

    /// The latest value of every field of `fields` for every entity of `entities`
    /// (`dcgmEntitiesGetLatestValues`), entity-major.
    ///
    /// # Errors
    /// The call's failure; per-entry problems are in each [`LatestValue`]'s status.
    pub fn latest(
        &self,
        entities: &[Entity],
        fields: &[u16],
    ) -> Result<Vec<LatestValue>, DcgmError> {
        let mut pairs: Vec<EntityPair> = entities
            .iter()
            .map(|e| EntityPair {
                group: e.group.raw(),
                id: e.id,
            })
            .collect();
        let mut ids = fields.to_vec();
        let blank = FieldValueV2 {
            version: FIELD_VALUE_VERSION2,
            entity_group: 0,
            entity_id: 0,
            field_id: 0,
            field_type: 0,
            status: 0,
            unused: 0,
            ts: 0,
            value: FieldUnion { blob: [0; 4096] },
        };
        let mut values = vec![blank; pairs.len() * ids.len()];
        let (Ok(n_entities), Ok(n_fields)) = (u32::try_from(pairs.len()), u32::try_from(ids.len()))
        else {
            return Err(DcgmError::Call {
                call: "dcgmEntitiesGetLatestValues",
                code: super::status::BADPARAM,
            });
        };
        // SAFETY: `values` holds entities × fields versioned entries, as the call writes.
        check("dcgmEntitiesGetLatestValues", unsafe {
            (self.lib.latest_values)(
                self.handle,
                pairs.as_mut_ptr(),
                n_entities,
                ids.as_mut_ptr(),
                n_fields,
                0,
                values.as_mut_ptr(),
            )
        })?;
        Ok(values
            .iter()
            .zip(
                entities
                    .iter()
                    .flat_map(|e| fields.iter().map(move |f| (e, f))),
            )
            .map(|(v, (e, f))| LatestValue {
                entity: Entity {
                    group: EntityGroup::from_raw(v.entity_group).unwrap_or(e.group),
                    id: v.entity_id,
                },
                field_id: if v.field_id == 0 { *f } else { v.field_id },
                status: v.status,
                value: match v.field_type {
                    // SAFETY: the type says which member the library wrote.
                    FT_DOUBLE => RawValue::Double(unsafe { v.value.dbl }),
                    // SAFETY: as above.
                    FT_INT64 => RawValue::Int64(unsafe { v.value.i64 }),
                    other => RawValue::Other(other),
                },
            })
            .collect())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: the handle came from dcgmConnect_v2 on this library.
        let _ = unsafe { (self.lib.disconnect)(self.handle) };
    }
}
