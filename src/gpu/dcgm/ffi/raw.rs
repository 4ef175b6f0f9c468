//! The raw C layouts of DCGM 4.x (`dcgm_structs.h`): `#[repr(C)]` structs, their versions
//! (`MAKE_DCGM_VERSION`) and sizes pinned by compile-time assertions, and the constants the
//! safe wrappers in `ffi` pass to the library.

pub(super) type Handle = usize; // dcgmHandle_t is uintptr_t
pub(super) type Return = i32; // dcgmReturn_t is an enum

/// `dcgmConnectV2Params_v2`.
#[repr(C)]
pub(super) struct ConnectV2Params {
    pub(super) version: u32,
    pub(super) persist_after_disconnect: u32,
    pub(super) timeout_ms: u32,
    pub(super) address_is_unix_socket: u32,
}

/// `dcgmGroupEntityPair_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct EntityPair {
    pub(super) group: i32,
    pub(super) id: u32,
}

/// The value union of `dcgmFieldValue_v2` (`i64`, `dbl`, `str[256]`, `blob[4096]`).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) union FieldUnion {
    pub(super) i64: i64,
    pub(super) dbl: f64,
    pub(super) blob: [u8; 4096],
}

/// `dcgmFieldValue_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct FieldValueV2 {
    pub(super) version: u32,
    pub(super) entity_group: i32,
    pub(super) entity_id: u32,
    pub(super) field_id: u16,
    pub(super) field_type: u16,
    pub(super) status: i32,
    pub(super) unused: u32,
    pub(super) ts: i64,
    pub(super) value: FieldUnion,
}

pub(super) const fn make_version(size: usize, version: u32) -> u32 {
    #[allow(clippy::cast_possible_truncation)]
    let size = size as u32;
    size | (version << 24)
}

/// `dcgmProfMetricGroupInfo_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ProfMetricGroupInfoV2 {
    pub(super) major_id: u16,
    pub(super) minor_id: u16,
    pub(super) num_field_ids: u32,
    pub(super) field_ids: [u16; PROF_MAX_FIELD_IDS_PER_GROUP],
}

/// `dcgmProfGetMetricGroups_v3`.
#[repr(C)]
pub(super) struct ProfGetMetricGroupsV3 {
    pub(super) version: u32,
    pub(super) unused: u32,
    pub(super) gpu_id: u32,
    pub(super) num_metric_groups: u32,
    pub(super) metric_groups: [ProfMetricGroupInfoV2; PROF_MAX_NUM_GROUPS],
}

/// `dcgmMigEntityInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct MigEntityInfo {
    pub(super) gpu_uuid: [u8; 128],
    pub(super) nvml_gpu_index: u32,
    pub(super) nvml_instance_id: u32,
    pub(super) nvml_compute_instance_id: u32,
    pub(super) nvml_mig_profile_id: u32,
    pub(super) nvml_profile_slices: u32,
}

/// `dcgmMigHierarchyInfo_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct MigHierarchyInfoV2 {
    pub(super) entity: EntityPair,
    pub(super) parent: EntityPair,
    pub(super) info: MigEntityInfo,
}

/// `dcgmMigHierarchy_v2`.
#[repr(C)]
pub(super) struct MigHierarchyV2 {
    pub(super) version: u32,
    pub(super) count: u32,
    pub(super) entity_list: [MigHierarchyInfoV2; MAX_HIERARCHY_INFO],
}

/// `dcgmDeviceSupportedClockSets_v1` (`dcgmClockSet_v1` is `version, memClock, smClock`).
#[repr(C)]
pub(super) struct SupportedClockSetsV1 {
    pub(super) version: u32,
    pub(super) count: u32,
    pub(super) clock_set: [[u32; 3]; 256],
}

/// `dcgmDeviceIdentifiers_v1`.
#[repr(C)]
pub(super) struct DeviceIdentifiersV1 {
    pub(super) version: u32,
    pub(super) brand_name: [u8; MAX_STR_LENGTH],
    pub(super) device_name: [u8; MAX_STR_LENGTH],
    pub(super) pci_bus_id: [u8; MAX_STR_LENGTH],
    pub(super) serial: [u8; MAX_STR_LENGTH],
    pub(super) uuid: [u8; MAX_STR_LENGTH],
    pub(super) vbios: [u8; MAX_STR_LENGTH],
    pub(super) inforom_image_version: [u8; MAX_STR_LENGTH],
    pub(super) pci_device_id: u32,
    pub(super) pci_sub_system_id: u32,
    pub(super) driver_version: [u8; MAX_STR_LENGTH],
    pub(super) virtualization_mode: u32,
}

/// `dcgmDeviceAttributes_v3`: clock sets, thermals (`dcgmDeviceThermals_v1`, 3 words), power
/// limits (`dcgmDevicePowerLimits_v1`, 6 words), identifiers, memory usage
/// (`dcgmDeviceMemoryUsage_v1`, 5 words), settings (`dcgmDeviceSettings_v2`, 4 words).
#[repr(C)]
pub(super) struct DeviceAttributesV3 {
    pub(super) version: u32,
    pub(super) clock_sets: SupportedClockSetsV1,
    pub(super) thermal_settings: [u32; 3],
    pub(super) power_limits: [u32; 6],
    pub(super) identifiers: DeviceIdentifiersV1,
    pub(super) memory_usage: [u32; 5],
    pub(super) settings: [u32; 4],
}

/// `dcgmStartEmbeddedV2Params_v2` (DCGM 2.4 and later, `dcgmStartEmbedded_v2`): the operation
/// mode, the handle it returns, the log file (NULL: no log; `-`: stdout) and severity
/// (`DcgmLoggingSeverity_t`), the service account, and `DCGM_MODULE_ID_COUNT_V1` (10) module ids
/// to deny.
#[repr(C)]
pub(super) struct StartEmbeddedV2ParamsV2 {
    pub(super) version: u32,
    pub(super) op_mode: i32,
    pub(super) handle: Handle,
    pub(super) log_file: *const std::ffi::c_char,
    pub(super) severity: i32,
    pub(super) deny_list_count: u32,
    pub(super) service_account: *const std::ffi::c_char,
    pub(super) deny_list: [u32; 10],
}

const _: () = assert!(std::mem::size_of::<ConnectV2Params>() == 16);
const _: () = assert!(std::mem::size_of::<StartEmbeddedV2ParamsV2>() == 80);
const _: () = assert!(std::mem::size_of::<ProfMetricGroupInfoV2>() == 136);
const _: () = assert!(std::mem::size_of::<ProfGetMetricGroupsV3>() == 1376);
const _: () = assert!(std::mem::size_of::<MigEntityInfo>() == 148);
const _: () = assert!(std::mem::size_of::<MigHierarchyInfoV2>() == 164);
const _: () = assert!(std::mem::size_of::<MigHierarchyV2>() == 8 + 164 * 448);
const _: () = assert!(std::mem::size_of::<DeviceIdentifiersV1>() == 2064);
const _: () = assert!(std::mem::size_of::<DeviceAttributesV3>() == 5220);
const _: () = assert!(std::mem::size_of::<FieldValueV2>() == 4128);
const _: () = assert!(std::mem::size_of::<EntityPair>() == 8);
pub(super) const CONNECT_V2_PARAMS_VERSION2: u32 =
    make_version(std::mem::size_of::<ConnectV2Params>(), 2);
pub(super) const START_EMBEDDED_V2_PARAMS_VERSION2: u32 =
    make_version(std::mem::size_of::<StartEmbeddedV2ParamsV2>(), 2);
/// `DCGM_OPERATION_MODE_AUTO`: the embedded hostengine samples watched fields by itself.
pub(super) const OPERATION_MODE_AUTO: i32 = 1;
/// `DcgmLoggingSeverityUnspecified`: inherit DCGM's own default (its `__DCGM_DBG_*` variables).
pub(super) const LOGGING_SEVERITY_UNSPECIFIED: i32 = -1;
pub(super) const FIELD_VALUE_VERSION2: u32 = make_version(std::mem::size_of::<FieldValueV2>(), 2);
pub(super) const PROF_GET_METRIC_GROUPS_VERSION3: u32 =
    make_version(std::mem::size_of::<ProfGetMetricGroupsV3>(), 3);
pub(super) const MIG_HIERARCHY_VERSION2: u32 =
    make_version(std::mem::size_of::<MigHierarchyV2>(), 2);
pub(super) const DEVICE_ATTRIBUTES_VERSION3: u32 =
    make_version(std::mem::size_of::<DeviceAttributesV3>(), 3);
pub(super) const MAX_NUM_DEVICES: usize = 32;
pub(super) const MAX_STR_LENGTH: usize = 256;
/// `DCGM_PROF_MAX_NUM_GROUPS_V2`.
pub(super) const PROF_MAX_NUM_GROUPS: usize = 10;
/// `DCGM_PROF_MAX_FIELD_IDS_PER_GROUP_V2`.
pub(super) const PROF_MAX_FIELD_IDS_PER_GROUP: usize = 64;
/// `DCGM_MAX_HIERARCHY_INFO`: `DCGM_MAX_NUM_DEVICES * DCGM_MAX_TOTAL_INSTANCES_PER_GPU` (14).
pub(super) const MAX_HIERARCHY_INFO: usize = MAX_NUM_DEVICES * 14;
/// `DCGM_GROUP_EMPTY` (`dcgmGroupType_t`).
pub(super) const GROUP_EMPTY: i32 = 1;
pub(super) const FT_DOUBLE: u16 = b'd' as u16;
pub(super) const FT_INT64: u16 = b'i' as u16;
