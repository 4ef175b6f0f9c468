//! The narrow low-level NVML seam, in our vocabulary.
//!
//! [`NvmlApi`] lists exactly the NVML calls gpu-exporter makes, one method per C call (so a
//! [`super::counting::Counting`] wrapper can count them), returning plain data in NVML's own
//! units. [`super::real::RealNvml`] implements it over `nvml-wrapper`; `FakeNvml`
//! (crates/gpu-exporter-testing)
//! implements it in memory for tests and benchmarks. Everything above this trait (field mapping,
//! unit conversion, MIG, GPM deltas, GPU loss) is testable without a GPU.

/// Why one NVML call failed, in the terms the source acts on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// `NVML_ERROR_NOT_SUPPORTED` (or a symbol missing from an old driver).
    #[error("not supported")]
    NotSupported,
    /// `NVML_ERROR_NO_PERMISSION`.
    #[error("no permission")]
    NoPermission,
    /// `NVML_ERROR_NOT_FOUND` (an empty MIG slot, a GPU that went away).
    #[error("not found")]
    NotFound,
    /// `NVML_ERROR_INVALID_ARGUMENT`: among others, a MIG device handle whose instance was
    /// destroyed or recreated.
    #[error("invalid argument")]
    InvalidArgument,
    /// `NVML_ERROR_GPU_IS_LOST`: the GPU fell off the bus.
    #[error("GPU is lost")]
    GpuLost,
    /// `NVML_ERROR_TIMEOUT`.
    #[error("timed out")]
    Timeout,
    /// Any other failure, with NVML's text.
    #[error("{0}")]
    Other(String),
}

/// One entry of a batched `nvmlDeviceGetFieldValues` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldRequest {
    /// `NVML_FI_*` id in the V12 numbering (translated to the driver's numbering by the
    /// implementation, see [`super::convert::translate_field_id`]).
    pub id: u32,
    /// `scopeId`: 0 for device-wide fields, a link id, or `u32::MAX` for "all links".
    pub scope: u32,
}

/// A numeric field value, interpreted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldNum {
    /// `NVML_VALUE_TYPE_UNSIGNED_*`.
    Unsigned(u64),
    /// `NVML_VALUE_TYPE_SIGNED_*`.
    Signed(i64),
    /// `NVML_VALUE_TYPE_DOUBLE`.
    Float(f64),
}

/// `nvmlValueType_t` of a field-values entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// `NVML_VALUE_TYPE_DOUBLE`.
    Double,
    /// `NVML_VALUE_TYPE_UNSIGNED_INT`.
    UnsignedInt,
    /// `NVML_VALUE_TYPE_UNSIGNED_LONG`.
    UnsignedLong,
    /// `NVML_VALUE_TYPE_UNSIGNED_LONG_LONG`.
    UnsignedLongLong,
    /// `NVML_VALUE_TYPE_SIGNED_LONG_LONG`.
    SignedLongLong,
    /// `NVML_VALUE_TYPE_SIGNED_INT`.
    SignedInt,
    /// `NVML_VALUE_TYPE_UNSIGNED_SHORT`.
    UnsignedShort,
    /// NVML answered `NVML_SUCCESS` but left `valueType` as the caller set it (NVML bug
    /// 2032468, seen on ECC fields).
    Unset,
    /// A type this build does not know.
    Unknown(u32),
}

impl ValueType {
    /// The type of an `nvmlValueType_t` value.
    pub fn from_raw(t: u32) -> Self {
        match t {
            0 => Self::Double,
            1 => Self::UnsignedInt,
            2 => Self::UnsignedLong,
            3 => Self::UnsignedLongLong,
            4 => Self::SignedLongLong,
            5 => Self::SignedInt,
            6 => Self::UnsignedShort,
            other => Self::Unknown(other),
        }
    }
}

/// A filled field-values entry as NVML left it: its `valueType` and the 8 bytes of its `value`
/// union, in memory order. Interpreting them is [`super::convert`]'s job, because some drivers
/// label values wrongly (see [`super::convert::field_value`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldValue {
    /// `valueType`.
    pub value_type: ValueType,
    /// The `value` union's bytes.
    pub raw: [u8; 8],
}

impl FieldValue {
    /// The union's `uiVal` member (its first four bytes).
    pub fn ui_val(&self) -> u32 {
        u32::from_ne_bytes([self.raw[0], self.raw[1], self.raw[2], self.raw[3]])
    }

    /// The union's `ullVal` member.
    pub fn ull_val(&self) -> u64 {
        u64::from_ne_bytes(self.raw)
    }

    /// The value as its `valueType` says; `None` when the type is unset or unknown.
    pub fn typed(&self) -> Option<FieldNum> {
        let r = &self.raw;
        Some(match self.value_type {
            ValueType::Double => FieldNum::Float(f64::from_ne_bytes(*r)),
            ValueType::UnsignedInt => FieldNum::Unsigned(u64::from(self.ui_val())),
            ValueType::UnsignedLong | ValueType::UnsignedLongLong => {
                FieldNum::Unsigned(self.ull_val())
            }
            ValueType::SignedLongLong => FieldNum::Signed(i64::from_ne_bytes(*r)),
            ValueType::SignedInt => {
                FieldNum::Signed(i64::from(i32::from_ne_bytes([r[0], r[1], r[2], r[3]])))
            }
            ValueType::UnsignedShort => {
                FieldNum::Unsigned(u64::from(u16::from_ne_bytes([r[0], r[1]])))
            }
            ValueType::Unset | ValueType::Unknown(_) => return None,
        })
    }
}

impl From<FieldNum> for FieldValue {
    /// The entry a well-behaved driver writes for `n`.
    fn from(n: FieldNum) -> Self {
        match n {
            FieldNum::Unsigned(u) => Self {
                value_type: ValueType::UnsignedLongLong,
                raw: u.to_ne_bytes(),
            },
            FieldNum::Signed(i) => Self {
                value_type: ValueType::SignedLongLong,
                raw: i.to_ne_bytes(),
            },
            FieldNum::Float(f) => Self {
                value_type: ValueType::Double,
                raw: f.to_ne_bytes(),
            },
        }
    }
}

/// One entry of a batched field-values answer.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldResult {
    /// When the driver sampled the value, µs since the epoch.
    pub timestamp_us: i64,
    /// The value, or the per-field error. An entry NVML did not fill at all (NVML bug 2009232:
    /// ECC fields with ECC disabled) is `NotSupported`.
    pub value: Result<FieldValue, ApiError>,
}

/// `nvmlDeviceGetGridLicensableFeatures_v4`, reduced to what DCGM reads from it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GridLicensing {
    /// `isGridLicenseSupported`: whether vGPU software licensing applies (a vGPU guest).
    pub supported: bool,
    /// (`featureCode`, `featureState`) of each licensable feature, in NVML's order.
    pub features: Vec<(u32, u32)>,
}

/// `nvmlDeviceGetMemoryInfo_v2`, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryInfo {
    /// Total installed framebuffer.
    pub total: u64,
    /// Unallocated.
    pub free: u64,
    /// Allocated (excluding `reserved`).
    pub used: u64,
    /// Reserved by the driver.
    pub reserved: u64,
}

/// A GPU instance profile, as NVML describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GiProfile {
    /// `sliceCount` (`gpuInstanceSliceCount` for a MIG device).
    pub slices: u32,
    /// `memorySizeMB` (MiB).
    pub memory_mib: u64,
    /// NVML's profile name (`MIG 1g.10gb+me`); empty when it comes from device attributes.
    pub name: String,
}

/// Which clock `nvmlDeviceGetClockInfo` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockKind {
    /// Streaming multiprocessor clock.
    Sm,
    /// Memory clock.
    Memory,
    /// Video engine clock.
    Video,
}

/// An infoROM object (`nvmlDeviceGetInforomVersion`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InforomObject {
    /// OEM object.
    Oem,
    /// ECC object.
    Ecc,
    /// Power management object.
    Power,
}

/// The GPM metrics gpu-exporter asks for (`NVML_GPM_METRIC_*`). Utilisations are 0-100 %,
/// rates MiB/s, as NVML defines them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpmMetric {
    /// `GRAPHICS_UTIL`.
    GraphicsUtil,
    /// `SM_UTIL`.
    SmUtil,
    /// `SM_OCCUPANCY`.
    SmOccupancy,
    /// `ANY_TENSOR_UTIL`.
    AnyTensorUtil,
    /// `DRAM_BW_UTIL`.
    DramBwUtil,
    /// `FP64_UTIL`.
    Fp64Util,
    /// `FP32_UTIL`.
    Fp32Util,
    /// `FP16_UTIL`.
    Fp16Util,
    /// `PCIE_TX_PER_SEC`.
    PcieTxPerSec,
    /// `PCIE_RX_PER_SEC`.
    PcieRxPerSec,
    /// `NVLINK_TOTAL_TX_PER_SEC`.
    NvlinkTotalTxPerSec,
    /// `NVLINK_TOTAL_RX_PER_SEC`.
    NvlinkTotalRxPerSec,
}

/// A per-link NVLink error counter (`nvmlNvLinkErrorCounter_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NvlinkErrorCounter {
    /// `NVML_NVLINK_ERROR_DL_REPLAY`: data link transmit replays.
    Replay,
    /// `NVML_NVLINK_ERROR_DL_RECOVERY`: data link transmit recoveries.
    Recovery,
    /// `NVML_NVLINK_ERROR_DL_CRC_FLIT`: flow-control digit CRC errors received.
    CrcFlit,
    /// `NVML_NVLINK_ERROR_DL_CRC_DATA`: data CRC errors received.
    CrcData,
}

/// An XID reported through the event set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidReport {
    /// The GPU it happened on: its position in the slice given to [`NvmlApi::xid_events`].
    pub device: usize,
    /// The XID (`eventData`; 999 for an XID the driver does not know).
    pub xid: u64,
}

/// A process with a compute context (`nvmlProcessInfo_t`, v2 layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Host PID.
    pub pid: u32,
    /// `usedGpuMemory`, bytes; `None` for `NVML_VALUE_NOT_AVAILABLE` (and the all-ones value some
    /// drivers return instead).
    pub used_memory: Option<u64>,
    /// `gpuInstanceId`; `None` when MIG is off (`0xFFFFFFFF`).
    pub gpu_instance_id: Option<u32>,
    /// `computeInstanceId`; `None` when MIG is off.
    pub compute_instance_id: Option<u32>,
}

/// One per-process utilisation sample (`nvmlProcessUtilizationSample_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessUtilSample {
    /// Host PID.
    pub pid: u32,
    /// When the driver took it, CPU µs since the epoch.
    pub timestamp_us: u64,
    /// SM %.
    pub sm: u32,
    /// Memory controller %.
    pub memory: u32,
    /// Encoder %.
    pub encoder: u32,
    /// Decoder %.
    pub decoder: u32,
}

/// An event set and the devices (by position in the request) that could not register, with why.
pub type Registered<E> = (E, Vec<(usize, ApiError)>);

/// A registered NVML event set (`nvmlEventSetWait_v2`). `Send`, used from one thread.
pub trait EventWait: Send + 'static {
    /// Waits up to `timeout_ms` for the next critical XID. `Ok(None)` on timeout or another
    /// kind of event. Names the device without any further NVML call.
    ///
    /// # Errors
    /// The NVML error that stopped waiting.
    fn wait(&mut self, timeout_ms: u32) -> Result<Option<XidReport>, ApiError>;
}

/// The NVML calls gpu-exporter makes. One method per C call; blocking.
pub trait NvmlApi: Send + Sync + 'static {
    /// A device handle (physical GPU or MIG device). Cheap to clone.
    type Device: Clone + Send + Sync + 'static;
    /// A GPM sample buffer.
    type GpmSample: Send + 'static;
    /// The event set type.
    type Events: EventWait;

    /// `nvmlSystemGetDriverVersion`.
    fn driver_version(&self) -> Result<String, ApiError>;
    /// `nvmlSystemGetNVMLVersion`.
    fn nvml_version(&self) -> Result<String, ApiError>;
    /// `nvmlSystemGetCudaDriverVersion_v2` (major*1000 + minor*10).
    fn cuda_driver_version(&self) -> Result<i32, ApiError>;
    /// `nvmlDeviceGetCount_v2`.
    fn device_count(&self) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetHandleByIndex_v2`.
    fn device_by_index(&self, index: u32) -> Result<Self::Device, ApiError>;

    /// `nvmlDeviceGetUUID`.
    fn uuid(&self, d: &Self::Device) -> Result<String, ApiError>;
    /// `nvmlDeviceGetPciInfo_v3`: the bus id, `00000000:8D:00.0` form.
    fn pci_bus_id(&self, d: &Self::Device) -> Result<String, ApiError>;
    /// `nvmlDeviceGetMinorNumber`.
    fn minor_number(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetName`.
    fn name(&self, d: &Self::Device) -> Result<String, ApiError>;
    /// `nvmlDeviceGetBrand`: the `nvmlBrandType_t` value (see [`super::convert::brand_name`]).
    fn brand(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetSerial`.
    fn serial(&self, d: &Self::Device) -> Result<String, ApiError>;
    /// `nvmlDeviceGetVbiosVersion`.
    fn vbios_version(&self, d: &Self::Device) -> Result<String, ApiError>;
    /// `nvmlDeviceGetInforomVersion`.
    fn inforom_version(&self, d: &Self::Device, obj: InforomObject) -> Result<String, ApiError>;
    /// `nvmlDeviceGetInforomImageVersion`.
    fn inforom_image_version(&self, d: &Self::Device) -> Result<String, ApiError>;
    /// `nvmlGpmQueryDeviceSupport`.
    fn gpm_supported(&self, d: &Self::Device) -> Result<bool, ApiError>;

    /// `nvmlDeviceGetMigMode`: whether MIG is currently enabled.
    fn mig_enabled(&self, d: &Self::Device) -> Result<bool, ApiError>;
    /// `nvmlDeviceGetMaxMigDeviceCount`: MIG device *slots*.
    fn mig_device_slots(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetMigDeviceHandleByIndex`; `Err(NotFound)` for an empty slot.
    fn mig_device_by_index(&self, d: &Self::Device, slot: u32) -> Result<Self::Device, ApiError>;
    /// `nvmlDeviceGetGpuInstanceId` of a MIG device.
    fn gpu_instance_id(&self, mig: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetComputeInstanceId` of a MIG device.
    fn compute_instance_id(&self, mig: &Self::Device) -> Result<u32, ApiError>;
    /// The profile of GPU instance `gi_id` of `parent` (`nvmlDeviceGetGpuInstanceById` →
    /// `nvmlGpuInstanceGetInfo` → `nvmlDeviceGetGpuInstanceProfileInfoByIdV`). Needs
    /// privileges on some drivers.
    fn gpu_instance_profile(
        &self,
        parent: &Self::Device,
        gi_id: u32,
    ) -> Result<GiProfile, ApiError>;
    /// `nvmlDeviceGetAttributes_v2` of a MIG device: its GPU instance's slice count and memory
    /// size, as a profile without a name. Needs no privileges.
    fn mig_attributes(&self, mig: &Self::Device) -> Result<GiProfile, ApiError>;
    /// Where GPU instance `gi_id` of `parent` sits: its profile id and placement
    /// (`nvmlDeviceGetGpuInstanceById` → `nvmlGpuInstanceGetInfo`). Needs privileges on some
    /// drivers. NVIDIA's DRA driver names MIG devices by it.
    fn gpu_instance_placement(
        &self,
        parent: &Self::Device,
        gi_id: u32,
    ) -> Result<crate::gpu::MigPlacement, ApiError>;

    /// `nvmlDeviceGetFieldValues`: one call for the whole batch. The outer error is the call's;
    /// per-field errors are inside, in request order.
    fn field_values(
        &self,
        d: &Self::Device,
        requests: &[FieldRequest],
    ) -> Result<Vec<FieldResult>, ApiError>;
    /// `nvmlDeviceGetEccMode`: whether ECC is currently enabled.
    fn ecc_enabled(&self, d: &Self::Device) -> Result<bool, ApiError>;
    /// `nvmlDeviceGetMemoryInfo_v2` (works on MIG device handles).
    fn memory_info(&self, d: &Self::Device) -> Result<MemoryInfo, ApiError>;
    /// `nvmlDeviceGetUtilizationRates`: (gpu %, memory %).
    fn utilization(&self, d: &Self::Device) -> Result<(u32, u32), ApiError>;
    /// `nvmlDeviceGetEncoderUtilization`, %.
    fn encoder_utilization(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetDecoderUtilization`, %.
    fn decoder_utilization(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetClockInfo`, MHz.
    fn clock(&self, d: &Self::Device, kind: ClockKind) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)`, °C.
    fn temperature(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetPowerUsage`, mW.
    fn power_usage(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetPowerManagementLimit`, mW.
    fn power_limit(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetEnforcedPowerLimit`, mW.
    fn enforced_power_limit(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetPerformanceState`, 0-15.
    fn performance_state(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetFanSpeed_v2(fan 0)`, %.
    fn fan_speed(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetCurrPcieLinkGeneration`.
    fn pcie_link_gen(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetCurrPcieLinkWidth`.
    fn pcie_link_width(&self, d: &Self::Device) -> Result<u32, ApiError>;
    /// `nvmlDeviceGetCurrentClocksEventReasons`: the bitmask.
    fn clocks_event_reasons(&self, d: &Self::Device) -> Result<u64, ApiError>;
    /// `nvmlDeviceGetGridLicensableFeatures_v4`: vGPU software licensing (vGPU guests).
    fn grid_licensing(&self, d: &Self::Device) -> Result<GridLicensing, ApiError>;

    /// `nvmlDeviceGetNvLinkState`: whether NVLink `link` (0-based) is active.
    fn nvlink_active(&self, d: &Self::Device, link: u32) -> Result<bool, ApiError>;
    /// `nvmlDeviceGetNvLinkErrorCounter`: one error counter of NVLink `link`.
    fn nvlink_error_counter(
        &self,
        d: &Self::Device,
        link: u32,
        counter: NvlinkErrorCounter,
    ) -> Result<u64, ApiError>;

    /// `nvmlGpmSampleGet` on a physical GPU.
    fn gpm_sample(&self, d: &Self::Device) -> Result<Self::GpmSample, ApiError>;
    /// `nvmlGpmMigSampleGet` for GPU instance `gi_id` of `parent`.
    fn gpm_mig_sample(
        &self,
        parent: &Self::Device,
        gi_id: u32,
    ) -> Result<Self::GpmSample, ApiError>;
    /// `nvmlGpmMetricsGet` over two samples of the same device, in request order.
    fn gpm_metrics(
        &self,
        earlier: &Self::GpmSample,
        later: &Self::GpmSample,
        metrics: &[GpmMetric],
    ) -> Result<Vec<Result<f64, ApiError>>, ApiError>;

    /// `nvmlEventSetCreate` + `nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError)` for
    /// each device. Devices that cannot register are skipped and returned (by position) with
    /// their error. Events name devices by their position in `devices`.
    fn xid_events(&self, devices: &[Self::Device]) -> Result<Registered<Self::Events>, ApiError>;

    /// `nvmlDeviceGetComputeRunningProcesses_v3`: on a MIG device handle, that instance's
    /// processes.
    fn compute_processes(&self, d: &Self::Device) -> Result<Vec<ProcessInfo>, ApiError>;
    /// `nvmlDeviceGetMPSComputeRunningProcesses_v3`: MPS clients (Volta and newer).
    fn mps_compute_processes(&self, d: &Self::Device) -> Result<Vec<ProcessInfo>, ApiError>;
    /// `nvmlDeviceGetProcessUtilization`: the samples newer than `last_seen_us` (0: every sample
    /// the driver holds). `Err(NotFound)` when there is none (every process idle since then).
    fn process_utilization(
        &self,
        d: &Self::Device,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessUtilSample>, ApiError>;
}
