//! The C ABI of DCGM's client library (`libdcgm.so.4`), loaded with `dlopen` at run time. The
//! struct layouts and versions follow DCGM 4.x's public headers (`dcgm_structs.h`:
//! `MAKE_DCGM_VERSION(type, ver)` is `sizeof(type) | ver << 24`); compile-time assertions pin
//! the sizes.
//!
//! One of the three modules allowed `unsafe` (the crate documentation lists them): every block
//! loads the library, resolves a symbol, or calls one DCGM function, resolved from the library
//! this value keeps loaded, with pointers to live, correctly sized and versioned locals, as
//! `dcgm_agent.h` documents for it; each says so in its `// SAFETY:` note.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::types::{
    status, DcgmError, Entity, EntityGroup, LatestValue, MetricGroup, MigEntity, RawValue,
};

mod raw;

use raw::*;

type InitFn = unsafe extern "C" fn() -> Return;
type ConnectFn =
    unsafe extern "C" fn(*const std::ffi::c_char, *mut ConnectV2Params, *mut Handle) -> Return;
type DisconnectFn = unsafe extern "C" fn(Handle) -> Return;
type StartEmbeddedFn = unsafe extern "C" fn(*mut StartEmbeddedV2ParamsV2) -> Return;
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

type GroupCreateFn =
    unsafe extern "C" fn(Handle, i32, *const std::ffi::c_char, *mut GroupId) -> Return;
type GroupAddEntityFn = unsafe extern "C" fn(Handle, GroupId, i32, u32) -> Return;
type GroupDestroyFn = unsafe extern "C" fn(Handle, GroupId) -> Return;
type FieldGroupCreateFn = unsafe extern "C" fn(
    Handle,
    i32,
    *const u16,
    *const std::ffi::c_char,
    *mut FieldGroupId,
) -> Return;
type FieldGroupDestroyFn = unsafe extern "C" fn(Handle, FieldGroupId) -> Return;
type WatchFieldsFn = unsafe extern "C" fn(Handle, GroupId, FieldGroupId, i64, f64, i32) -> Return;
type UnwatchFieldsFn = unsafe extern "C" fn(Handle, GroupId, FieldGroupId) -> Return;
type ProfMetricGroupsFn = unsafe extern "C" fn(Handle, *mut ProfGetMetricGroupsV3) -> Return;
type MigHierarchyFn = unsafe extern "C" fn(Handle, *mut MigHierarchyV2) -> Return;
type DeviceAttributesFn = unsafe extern "C" fn(Handle, u32, *mut DeviceAttributesV3) -> Return;

/// `dcgmGpuGrp_t`: an entity group on the hostengine.
pub type GroupId = usize;
/// `dcgmFieldGrp_t`: a field group on the hostengine.
pub type FieldGroupId = usize;

/// The loaded library and the functions the exporter calls. `dcgmInit` has been called;
/// dropping it calls `dcgmShutdown`.
pub struct DcgmLibrary {
    path: String,
    init: InitFn,
    /// Whether `dcgmInit` succeeded (then dropping calls `dcgmShutdown`).
    initialised: AtomicBool,
    shutdown: InitFn,
    connect: ConnectFn,
    disconnect: DisconnectFn,
    /// `dcgmStartEmbedded_v2` and `dcgmStopEmbedded`: a library without them still serves
    /// `-r`; only the embedded hostengine needs them.
    start_embedded: Option<StartEmbeddedFn>,
    stop_embedded: Option<DisconnectFn>,
    get_all_devices: GetAllDevicesFn,
    latest_values: LatestValuesFn,
    group_create: GroupCreateFn,
    group_add_entity: GroupAddEntityFn,
    group_destroy: GroupDestroyFn,
    field_group_create: FieldGroupCreateFn,
    field_group_destroy: FieldGroupDestroyFn,
    watch_fields: WatchFieldsFn,
    unwatch_fields: UnwatchFieldsFn,
    prof_metric_groups: ProfMetricGroupsFn,
    mig_hierarchy: MigHierarchyFn,
    device_attributes: DeviceAttributesFn,
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
    if code == status::OK {
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
        let lib = Self::load(path)?;
        lib.init()?;
        Ok(lib)
    }

    /// Loads the library and resolves its functions, without calling any: `dcgmInit` may take
    /// its time, so the DCGM source calls [`DcgmLibrary::init`] on its own thread.
    ///
    /// # Errors
    /// [`DcgmError::Load`], [`DcgmError::Symbol`].
    pub fn load(path: &str) -> Result<Arc<Self>, DcgmError> {
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
        let me = Self {
            path: path.to_owned(),
            init: sym(&lib, path, "dcgmInit")?,
            initialised: AtomicBool::new(false),
            shutdown: sym(&lib, path, "dcgmShutdown")?,
            connect: sym(&lib, path, "dcgmConnect_v2")?,
            disconnect: sym(&lib, path, "dcgmDisconnect")?,
            start_embedded: sym(&lib, path, "dcgmStartEmbedded_v2").ok(),
            stop_embedded: sym(&lib, path, "dcgmStopEmbedded").ok(),
            get_all_devices: sym(&lib, path, "dcgmGetAllDevices")?,
            latest_values: sym(&lib, path, "dcgmEntitiesGetLatestValues")?,
            group_create: sym(&lib, path, "dcgmGroupCreate")?,
            group_add_entity: sym(&lib, path, "dcgmGroupAddEntity")?,
            group_destroy: sym(&lib, path, "dcgmGroupDestroy")?,
            field_group_create: sym(&lib, path, "dcgmFieldGroupCreate")?,
            field_group_destroy: sym(&lib, path, "dcgmFieldGroupDestroy")?,
            watch_fields: sym(&lib, path, "dcgmWatchFields")?,
            unwatch_fields: sym(&lib, path, "dcgmUnwatchFields")?,
            prof_metric_groups: sym(&lib, path, "dcgmProfGetSupportedMetricGroups")?,
            mig_hierarchy: sym(&lib, path, "dcgmGetGpuInstanceHierarchy")?,
            device_attributes: sym(&lib, path, "dcgmGetDeviceAttributes")?,
            _lib: lib,
        };
        Ok(Arc::new(me))
    }

    /// Calls `dcgmInit` once it has succeeded no more.
    ///
    /// # Errors
    /// `dcgmInit`'s failure.
    pub fn init(&self) -> Result<(), DcgmError> {
        if self.initialised.load(Ordering::Acquire) {
            return Ok(());
        }
        // SAFETY: no arguments.
        check("dcgmInit", unsafe { (self.init)() })?;
        self.initialised.store(true, Ordering::Release);
        Ok(())
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
            code: status::BADPARAM,
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
            embedded: false,
        })
    }

    /// Starts DCGM's hostengine inside this process (`dcgmStartEmbedded_v2`,
    /// `dcgmStartEmbeddedV2Params_v2`, `DCGM_OPERATION_MODE_AUTO`: it samples the watched fields
    /// by itself), logging to stdout at `log` (a `DcgmLoggingSeverity_t`, dcgm-exporter's
    /// `--enable-dcgm-log`), or without a log file; the connection it returns stops it when
    /// dropped (`dcgmStopEmbedded`). `dcgmInit` must have succeeded.
    ///
    /// # Errors
    /// [`DcgmError::Symbol`] for a library without the embedded entry points, or
    /// `dcgmStartEmbedded_v2`'s failure (`DCGM_ST_UNINITIALIZED`, a driver DCGM cannot use...).
    pub fn start_embedded(self: &Arc<Self>, log: Option<i32>) -> Result<Connection, DcgmError> {
        let missing = |symbol| DcgmError::Symbol {
            path: self.path.clone(),
            symbol,
            detail: "not exported".to_owned(),
        };
        let start = self
            .start_embedded
            .ok_or_else(|| missing("dcgmStartEmbedded_v2"))?;
        if self.stop_embedded.is_none() {
            return Err(missing("dcgmStopEmbedded"));
        }
        let mut params = StartEmbeddedV2ParamsV2 {
            version: START_EMBEDDED_V2_PARAMS_VERSION2,
            op_mode: OPERATION_MODE_AUTO,
            handle: 0,
            // "-": stdout, as dcgm-exporter's __DCGM_DBG_FILE=- does.
            log_file: log.map_or(std::ptr::null(), |_| c"-".as_ptr()),
            severity: log.unwrap_or(LOGGING_SEVERITY_UNSPECIFIED),
            deny_list_count: 0,
            service_account: std::ptr::null(),
            deny_list: [0; 10],
        };
        // SAFETY: a versioned params struct (a static log file name or NULL, no service account:
        // NULL, as the header allows), live for the call; the library writes the handle into it.
        check("dcgmStartEmbedded_v2", unsafe { start(&mut params) })?;
        Ok(Connection {
            lib: Arc::clone(self),
            handle: params.handle,
            embedded: true,
        })
    }
}

impl Drop for DcgmLibrary {
    fn drop(&mut self) {
        if self.initialised.load(Ordering::Acquire) {
            // SAFETY: no arguments; the library is still loaded (`_lib` drops after this).
            let _ = unsafe { (self.shutdown)() };
        }
    }
}

/// A connection to a hostengine; dropping it disconnects, or stops the embedded hostengine.
pub struct Connection {
    lib: Arc<DcgmLibrary>,
    handle: Handle,
    /// The hostengine runs in this process (`dcgmStartEmbedded_v2`).
    embedded: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("handle", &self.handle)
            .field("embedded", &self.embedded)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Whether the hostengine runs in this process.
    pub fn embedded(&self) -> bool {
        self.embedded
    }

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
        // Each entry starts as "no data" for the entity and field it is asked for, so that an
        // entry the library leaves unfilled is read as no value of its own entity, never as a
        // value of entity 0.
        let mut values: Vec<FieldValueV2> = entities
            .iter()
            .flat_map(|e| {
                fields.iter().map(move |&f| FieldValueV2 {
                    version: FIELD_VALUE_VERSION2,
                    entity_group: e.group.raw(),
                    entity_id: e.id,
                    field_id: f,
                    field_type: FT_DOUBLE,
                    status: status::NO_DATA,
                    unused: 0,
                    ts: 0,
                    value: FieldUnion { blob: [0; 4096] },
                })
            })
            .collect();
        let (Ok(n_entities), Ok(n_fields)) = (u32::try_from(pairs.len()), u32::try_from(ids.len()))
        else {
            return Err(DcgmError::Call {
                call: "dcgmEntitiesGetLatestValues",
                code: status::BADPARAM,
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
                // The entity the library names, when it names one the exporter reads; the one
                // asked for otherwise.
                entity: EntityGroup::from_raw(v.entity_group).map_or(*e, |group| Entity {
                    group,
                    id: v.entity_id,
                }),
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

/// A NUL-terminated C string of `s`, or `DCGM_ST_BADPARAM` for `call` when it holds a NUL.
fn c_string(call: &'static str, s: &str) -> Result<CString, DcgmError> {
    CString::new(s).map_err(|_| DcgmError::Call {
        call,
        code: status::BADPARAM,
    })
}

/// The text of a NUL-padded C char array.
fn c_text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

impl Connection {
    /// Creates an entity group named `name` holding `entities` (`dcgmGroupCreate` with
    /// `DCGM_GROUP_EMPTY`, then `dcgmGroupAddEntity` for each); destroys it again when adding
    /// fails.
    ///
    /// # Errors
    /// The first failing call.
    pub fn create_group(&self, name: &str, entities: &[Entity]) -> Result<GroupId, DcgmError> {
        let cname = c_string("dcgmGroupCreate", name)?;
        let mut id: GroupId = 0;
        // SAFETY: a NUL-terminated name and a group id slot, live for the call.
        check("dcgmGroupCreate", unsafe {
            (self.lib.group_create)(self.handle, GROUP_EMPTY, cname.as_ptr(), &mut id)
        })?;
        for e in entities {
            // SAFETY: plain values.
            let code = unsafe { (self.lib.group_add_entity)(self.handle, id, e.group.raw(), e.id) };
            if let Err(err) = check("dcgmGroupAddEntity", code) {
                let _ = self.destroy_group(id);
                return Err(err);
            }
        }
        Ok(id)
    }

    /// Destroys an entity group (`dcgmGroupDestroy`).
    ///
    /// # Errors
    /// The call's failure.
    pub fn destroy_group(&self, id: GroupId) -> Result<(), DcgmError> {
        // SAFETY: plain values.
        check("dcgmGroupDestroy", unsafe {
            (self.lib.group_destroy)(self.handle, id)
        })
    }

    /// Creates a field group named `name` (`dcgmFieldGroupCreate`).
    ///
    /// # Errors
    /// The call's failure.
    pub fn create_field_group(
        &self,
        name: &str,
        fields: &[u16],
    ) -> Result<FieldGroupId, DcgmError> {
        let cname = c_string("dcgmFieldGroupCreate", name)?;
        let n = i32::try_from(fields.len()).map_err(|_| DcgmError::Call {
            call: "dcgmFieldGroupCreate",
            code: status::BADPARAM,
        })?;
        let mut id: FieldGroupId = 0;
        // SAFETY: `n` field ids, a NUL-terminated name and an id slot, live for the call.
        check("dcgmFieldGroupCreate", unsafe {
            (self.lib.field_group_create)(self.handle, n, fields.as_ptr(), cname.as_ptr(), &mut id)
        })?;
        Ok(id)
    }

    /// Destroys a field group (`dcgmFieldGroupDestroy`).
    ///
    /// # Errors
    /// The call's failure.
    pub fn destroy_field_group(&self, id: FieldGroupId) -> Result<(), DcgmError> {
        // SAFETY: plain values.
        check("dcgmFieldGroupDestroy", unsafe {
            (self.lib.field_group_destroy)(self.handle, id)
        })
    }

    /// Asks the hostengine to sample `fields` of `group` every `update_us` microseconds,
    /// keeping `keep_samples` samples (`dcgmWatchFields`; a keep age of 0: no age limit).
    ///
    /// # Errors
    /// The call's failure: `DCGM_ST_PROFILING_NOT_SUPPORTED`, `DCGM_ST_PROFILING_MULTI_PASS`
    /// (metric groups that cannot be watched together), `DCGM_ST_REQUIRES_ROOT`...
    pub fn watch(
        &self,
        group: GroupId,
        fields: FieldGroupId,
        update_us: i64,
        keep_samples: i32,
    ) -> Result<(), DcgmError> {
        // SAFETY: plain values.
        check("dcgmWatchFields", unsafe {
            (self.lib.watch_fields)(self.handle, group, fields, update_us, 0.0, keep_samples)
        })
    }

    /// Stops watching (`dcgmUnwatchFields`).
    ///
    /// # Errors
    /// The call's failure.
    pub fn unwatch(&self, group: GroupId, fields: FieldGroupId) -> Result<(), DcgmError> {
        // SAFETY: plain values.
        check("dcgmUnwatchFields", unsafe {
            (self.lib.unwatch_fields)(self.handle, group, fields)
        })
    }

    /// The profiling metric groups the GPU `gpu_id` supports
    /// (`dcgmProfGetSupportedMetricGroups`, `dcgmProfGetMetricGroups_v3`).
    ///
    /// # Errors
    /// The call's failure (`DCGM_ST_PROFILING_NOT_SUPPORTED` on a GPU without profiling,
    /// `DCGM_ST_MODULE_NOT_LOADED` without the profiling module).
    pub fn metric_groups(&self, gpu_id: u32) -> Result<Vec<MetricGroup>, DcgmError> {
        let mut req = Box::new(ProfGetMetricGroupsV3 {
            version: PROF_GET_METRIC_GROUPS_VERSION3,
            unused: 0,
            gpu_id,
            num_metric_groups: 0,
            metric_groups: [ProfMetricGroupInfoV2 {
                major_id: 0,
                minor_id: 0,
                num_field_ids: 0,
                field_ids: [0; PROF_MAX_FIELD_IDS_PER_GROUP],
            }; PROF_MAX_NUM_GROUPS],
        });
        // SAFETY: a versioned request, live for the call.
        check("dcgmProfGetSupportedMetricGroups", unsafe {
            (self.lib.prof_metric_groups)(self.handle, &mut *req)
        })?;
        let n = (req.num_metric_groups as usize).min(PROF_MAX_NUM_GROUPS);
        Ok(req.metric_groups[..n]
            .iter()
            .map(|g| MetricGroup {
                major: g.major_id,
                minor: g.minor_id,
                fields: g.field_ids[..(g.num_field_ids as usize).min(PROF_MAX_FIELD_IDS_PER_GROUP)]
                    .to_vec(),
            })
            .collect())
    }

    /// The MIG entities the hostengine knows (`dcgmGetGpuInstanceHierarchy`,
    /// `dcgmMigHierarchy_v2`): GPU instances and compute instances with their parents.
    ///
    /// # Errors
    /// The call's failure.
    pub fn mig_hierarchy(&self) -> Result<Vec<MigEntity>, DcgmError> {
        let blank = MigHierarchyInfoV2 {
            entity: EntityPair { group: 0, id: 0 },
            parent: EntityPair { group: 0, id: 0 },
            info: MigEntityInfo {
                gpu_uuid: [0; 128],
                nvml_gpu_index: 0,
                nvml_instance_id: 0,
                nvml_compute_instance_id: 0,
                nvml_mig_profile_id: 0,
                nvml_profile_slices: 0,
            },
        };
        let mut h = Box::new(MigHierarchyV2 {
            version: MIG_HIERARCHY_VERSION2,
            count: 0,
            entity_list: [blank; MAX_HIERARCHY_INFO],
        });
        // SAFETY: a versioned hierarchy, live for the call.
        check("dcgmGetGpuInstanceHierarchy", unsafe {
            (self.lib.mig_hierarchy)(self.handle, &mut *h)
        })?;
        let n = (h.count as usize).min(MAX_HIERARCHY_INFO);
        Ok(h.entity_list[..n]
            .iter()
            .filter_map(|e| {
                Some(MigEntity {
                    entity: Entity {
                        group: EntityGroup::from_raw(e.entity.group)?,
                        id: e.entity.id,
                    },
                    parent: Entity {
                        group: EntityGroup::from_raw(e.parent.group)?,
                        id: e.parent.id,
                    },
                    gpu_uuid: c_text(&e.info.gpu_uuid),
                    instance_id: e.info.nvml_instance_id,
                    compute_instance_id: e.info.nvml_compute_instance_id,
                })
            })
            .collect())
    }

    /// The UUID of GPU `gpu_id` (`dcgmGetDeviceAttributes`, `dcgmDeviceAttributes_v3`).
    ///
    /// # Errors
    /// The call's failure.
    pub fn gpu_uuid(&self, gpu_id: u32) -> Result<String, DcgmError> {
        // SAFETY: all-zero bytes are a valid value of this plain C struct (integers and byte
        // arrays only).
        let mut attrs: Box<DeviceAttributesV3> = Box::new(unsafe { std::mem::zeroed() });
        attrs.version = DEVICE_ATTRIBUTES_VERSION3;
        // SAFETY: a versioned attributes struct, live for the call.
        check("dcgmGetDeviceAttributes", unsafe {
            (self.lib.device_attributes)(self.handle, gpu_id, &mut *attrs)
        })?;
        Ok(c_text(&attrs.identifiers.uuid))
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        match (self.embedded, self.lib.stop_embedded) {
            (true, Some(stop)) => {
                // SAFETY: the handle came from dcgmStartEmbedded_v2 on this library, which
                // `self.lib` keeps loaded, and is stopped once, here.
                let _ = unsafe { stop(self.handle) };
            }
            (true, None) => {}
            (false, _) => {
                // SAFETY: the handle came from dcgmConnect_v2 on this library, which `self.lib`
                // keeps loaded, and is disconnected once, here.
                let _ = unsafe { (self.lib.disconnect)(self.handle) };
            }
        }
    }
}
