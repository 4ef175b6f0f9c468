//! [`Counting`]: an [`NvmlApi`] wrapper that counts the calls made through it, by C function.
//!
//! Used to check the NVML call budget (how many calls one tick costs per device) against the
//! fake, and available to benchmarks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::api::{
    ApiError, ClockKind, FieldRequest, FieldResult, GiProfile, GpmMetric, GridLicensing,
    InforomObject, MemoryInfo, NvlinkErrorCounter, NvmlApi, ProcessInfo, ProcessUtilSample,
    Registered,
};

/// Call counts by NVML function name.
#[derive(Debug, Default)]
pub struct CallCounter {
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl CallCounter {
    fn hit(&self, call: &'static str) {
        *self
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(call)
            .or_default() += 1;
    }

    /// The counts since the last `take`, resetting them.
    pub fn take(&self) -> BTreeMap<&'static str, u64> {
        std::mem::take(&mut *self.counts.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Wraps an [`NvmlApi`], counting every call in a shared [`CallCounter`].
#[derive(Debug, Clone)]
pub struct Counting<A> {
    inner: A,
    counter: Arc<CallCounter>,
}

impl<A> Counting<A> {
    /// Wraps `inner`.
    pub fn new(inner: A) -> Self {
        Self {
            inner,
            counter: Arc::default(),
        }
    }

    /// The shared counter (keep it before moving the wrapper into a source).
    pub fn counter(&self) -> Arc<CallCounter> {
        Arc::clone(&self.counter)
    }
}

macro_rules! counted {
    ($( fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty = $c:literal; )*) => {
        $(
            fn $name(&self $(, $arg: $ty)*) -> $ret {
                self.counter.hit($c);
                self.inner.$name($($arg),*)
            }
        )*
    };
}

impl<A: NvmlApi> NvmlApi for Counting<A> {
    type Device = A::Device;
    type GpmSample = A::GpmSample;
    type Events = A::Events;

    counted! {
        fn driver_version(&self) -> Result<String, ApiError> = "nvmlSystemGetDriverVersion";
        fn nvml_version(&self) -> Result<String, ApiError> = "nvmlSystemGetNVMLVersion";
        fn cuda_driver_version(&self) -> Result<i32, ApiError> = "nvmlSystemGetCudaDriverVersion_v2";
        fn device_count(&self) -> Result<u32, ApiError> = "nvmlDeviceGetCount_v2";
        fn device_by_index(&self, index: u32) -> Result<A::Device, ApiError> = "nvmlDeviceGetHandleByIndex_v2";
        fn uuid(&self, d: &A::Device) -> Result<String, ApiError> = "nvmlDeviceGetUUID";
        fn pci_bus_id(&self, d: &A::Device) -> Result<String, ApiError> = "nvmlDeviceGetPciInfo_v3";
        fn minor_number(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetMinorNumber";
        fn name(&self, d: &A::Device) -> Result<String, ApiError> = "nvmlDeviceGetName";
        fn brand(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetBrand";
        fn serial(&self, d: &A::Device) -> Result<String, ApiError> = "nvmlDeviceGetSerial";
        fn vbios_version(&self, d: &A::Device) -> Result<String, ApiError> = "nvmlDeviceGetVbiosVersion";
        fn inforom_version(&self, d: &A::Device, obj: InforomObject) -> Result<String, ApiError> = "nvmlDeviceGetInforomVersion";
        fn inforom_image_version(&self, d: &A::Device) -> Result<String, ApiError> = "nvmlDeviceGetInforomImageVersion";
        fn gpm_supported(&self, d: &A::Device) -> Result<bool, ApiError> = "nvmlGpmQueryDeviceSupport";
        fn mig_enabled(&self, d: &A::Device) -> Result<bool, ApiError> = "nvmlDeviceGetMigMode";
        fn mig_device_slots(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetMaxMigDeviceCount";
        fn mig_device_by_index(&self, d: &A::Device, slot: u32) -> Result<A::Device, ApiError> = "nvmlDeviceGetMigDeviceHandleByIndex";
        fn gpu_instance_id(&self, mig: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetGpuInstanceId";
        fn compute_instance_id(&self, mig: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetComputeInstanceId";
        fn gpu_instance_profile(&self, parent: &A::Device, gi_id: u32) -> Result<GiProfile, ApiError> = "nvmlGpuInstanceGetInfo+ProfileInfo";
        fn mig_attributes(&self, mig: &A::Device) -> Result<GiProfile, ApiError> = "nvmlDeviceGetAttributes_v2";
        fn gpu_instance_placement(&self, parent: &A::Device, gi_id: u32) -> Result<crate::gpu::MigPlacement, ApiError> = "nvmlGpuInstanceGetInfo";
        fn field_values(&self, d: &A::Device, requests: &[FieldRequest]) -> Result<Vec<FieldResult>, ApiError> = "nvmlDeviceGetFieldValues";
        fn ecc_enabled(&self, d: &A::Device) -> Result<bool, ApiError> = "nvmlDeviceGetEccMode";
        fn memory_info(&self, d: &A::Device) -> Result<MemoryInfo, ApiError> = "nvmlDeviceGetMemoryInfo_v2";
        fn utilization(&self, d: &A::Device) -> Result<(u32, u32), ApiError> = "nvmlDeviceGetUtilizationRates";
        fn encoder_utilization(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetEncoderUtilization";
        fn decoder_utilization(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetDecoderUtilization";
        fn clock(&self, d: &A::Device, kind: ClockKind) -> Result<u32, ApiError> = "nvmlDeviceGetClockInfo";
        fn temperature(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetTemperature";
        fn power_usage(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetPowerUsage";
        fn power_limit(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetPowerManagementLimit";
        fn enforced_power_limit(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetEnforcedPowerLimit";
        fn performance_state(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetPerformanceState";
        fn fan_speed(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetFanSpeed_v2";
        fn pcie_link_gen(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetCurrPcieLinkGeneration";
        fn pcie_link_width(&self, d: &A::Device) -> Result<u32, ApiError> = "nvmlDeviceGetCurrPcieLinkWidth";
        fn clocks_event_reasons(&self, d: &A::Device) -> Result<u64, ApiError> = "nvmlDeviceGetCurrentClocksEventReasons";
        fn grid_licensing(&self, d: &A::Device) -> Result<GridLicensing, ApiError> = "nvmlDeviceGetGridLicensableFeatures_v4";
        fn nvlink_active(&self, d: &A::Device, link: u32) -> Result<bool, ApiError> = "nvmlDeviceGetNvLinkState";
        fn nvlink_error_counter(&self, d: &A::Device, link: u32, counter: NvlinkErrorCounter) -> Result<u64, ApiError> = "nvmlDeviceGetNvLinkErrorCounter";
        fn gpm_sample(&self, d: &A::Device) -> Result<A::GpmSample, ApiError> = "nvmlGpmSampleGet";
        fn gpm_mig_sample(&self, parent: &A::Device, gi_id: u32) -> Result<A::GpmSample, ApiError> = "nvmlGpmMigSampleGet";
        fn gpm_metrics(&self, earlier: &A::GpmSample, later: &A::GpmSample, metrics: &[GpmMetric]) -> Result<Vec<Result<f64, ApiError>>, ApiError> = "nvmlGpmMetricsGet";
        fn xid_events(&self, devices: &[A::Device]) -> Result<Registered<A::Events>, ApiError> = "nvmlEventSetCreate+RegisterEvents";
        fn compute_processes(&self, d: &A::Device) -> Result<Vec<ProcessInfo>, ApiError> = "nvmlDeviceGetComputeRunningProcesses_v3";
        fn mps_compute_processes(&self, d: &A::Device) -> Result<Vec<ProcessInfo>, ApiError> = "nvmlDeviceGetMPSComputeRunningProcesses_v3";
        fn process_utilization(&self, d: &A::Device, last_seen_us: u64) -> Result<Vec<ProcessUtilSample>, ApiError> = "nvmlDeviceGetProcessUtilization";
    }
}
