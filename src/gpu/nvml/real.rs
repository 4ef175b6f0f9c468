//! [`RealNvml`]: the [`NvmlApi`] over `nvml-wrapper`. The only module (with `ffi`)
//! that names `nvml_wrapper`.

use std::sync::Arc;

use nvml_wrapper::enum_wrappers::device::{Clock, InfoRom, TemperatureSensor};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::{GpmSample, Nvml};

use super::api::{
    ApiError, ClockKind, EventWait, FieldRequest, FieldResult, GiProfile, GpmMetric, GridLicensing,
    InforomObject, MemoryInfo, NvlinkErrorCounter, NvmlApi, ProcessInfo, ProcessUtilSample,
    Registered, XidReport,
};
use super::convert::FieldIdScheme;
use super::error::InitError;
use super::ffi::{self, api_error};

/// NVML through `libnvidia-ml.so.1`. The library handle lives for the rest of the process
/// (NVML is initialised once; `nvmlShutdown` is never needed by an exporter).
#[derive(Debug, Clone, Copy)]
pub struct RealNvml {
    nvml: &'static Nvml,
    scheme: FieldIdScheme,
}

/// A device handle of the real NVML.
pub type RealDevice = Arc<nvml_wrapper::Device<'static>>;

impl RealNvml {
    /// Loads `libnvidia-ml.so.1` and calls `nvmlInit_v2`.
    ///
    /// # Errors
    /// An [`InitError`] saying what is missing.
    pub fn init() -> Result<Self, InitError> {
        let nvml = Nvml::init().map_err(|e| match e {
            WrapperError::LibloadingError(l) => InitError::LibraryNotFound {
                detail: l.to_string(),
            },
            WrapperError::DriverNotLoaded => InitError::DriverNotLoaded,
            WrapperError::NoPermission => InitError::NoPermission,
            other => InitError::Failed(other.to_string()),
        })?;
        let scheme = nvml
            .sys_driver_version()
            .map(|v| FieldIdScheme::for_driver(&v))
            .unwrap_or(FieldIdScheme::V12);
        // Initialised once per process; leaking keeps `Device<'static>` handles valid without
        // a global.
        Ok(Self {
            nvml: Box::leak(Box::new(nvml)),
            scheme,
        })
    }
}

fn gpm_id(m: GpmMetric) -> GpmMetricId {
    match m {
        GpmMetric::GraphicsUtil => GpmMetricId::GraphicsUtil,
        GpmMetric::SmUtil => GpmMetricId::SmUtil,
        GpmMetric::SmOccupancy => GpmMetricId::SmOccupancy,
        GpmMetric::AnyTensorUtil => GpmMetricId::AnyTensorUtil,
        GpmMetric::DramBwUtil => GpmMetricId::DramBwUtil,
        GpmMetric::Fp64Util => GpmMetricId::Fp64Util,
        GpmMetric::Fp32Util => GpmMetricId::Fp32Util,
        GpmMetric::Fp16Util => GpmMetricId::Fp16Util,
        GpmMetric::PcieTxPerSec => GpmMetricId::PcieTxPerSec,
        GpmMetric::PcieRxPerSec => GpmMetricId::PcieRxPerSec,
        GpmMetric::NvlinkTotalTxPerSec => GpmMetricId::NvlinkTotalTxPerSec,
        GpmMetric::NvlinkTotalRxPerSec => GpmMetricId::NvlinkTotalRxPerSec,
    }
}

/// The real event set, waited on by the event thread.
#[derive(Debug)]
pub struct RealEvents {
    set: ffi::EventSet,
}

impl EventWait for RealEvents {
    fn wait(&mut self, timeout_ms: u32) -> Result<Option<XidReport>, ApiError> {
        Ok(match self.set.wait(timeout_ms)? {
            Some(ffi::Event::Xid { device, xid }) => Some(XidReport { device, xid }),
            Some(ffi::Event::Other) | None => None,
        })
    }
}

impl NvmlApi for RealNvml {
    type Device = RealDevice;
    type GpmSample = GpmSample<'static>;
    type Events = RealEvents;

    fn driver_version(&self) -> Result<String, ApiError> {
        self.nvml.sys_driver_version().map_err(api_error)
    }
    fn nvml_version(&self) -> Result<String, ApiError> {
        self.nvml.sys_nvml_version().map_err(api_error)
    }
    fn cuda_driver_version(&self) -> Result<i32, ApiError> {
        self.nvml.sys_cuda_driver_version().map_err(api_error)
    }
    fn device_count(&self) -> Result<u32, ApiError> {
        self.nvml.device_count().map_err(api_error)
    }
    fn device_by_index(&self, index: u32) -> Result<RealDevice, ApiError> {
        self.nvml
            .device_by_index(index)
            .map(Arc::new)
            .map_err(api_error)
    }
    fn uuid(&self, d: &RealDevice) -> Result<String, ApiError> {
        d.uuid().map_err(api_error)
    }
    fn pci_bus_id(&self, d: &RealDevice) -> Result<String, ApiError> {
        d.pci_info().map(|p| p.bus_id).map_err(api_error)
    }
    fn minor_number(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.minor_number().map_err(api_error)
    }
    fn name(&self, d: &RealDevice) -> Result<String, ApiError> {
        d.name().map_err(api_error)
    }
    fn brand(&self, d: &RealDevice) -> Result<u32, ApiError> {
        ffi::brand(self.nvml, d)
    }
    fn serial(&self, d: &RealDevice) -> Result<String, ApiError> {
        d.serial().map_err(api_error)
    }
    fn vbios_version(&self, d: &RealDevice) -> Result<String, ApiError> {
        d.vbios_version().map_err(api_error)
    }
    fn inforom_version(&self, d: &RealDevice, obj: InforomObject) -> Result<String, ApiError> {
        let obj = match obj {
            InforomObject::Oem => InfoRom::OEM,
            InforomObject::Ecc => InfoRom::ECC,
            InforomObject::Power => InfoRom::Power,
        };
        d.info_rom_version(obj).map_err(api_error)
    }
    fn inforom_image_version(&self, d: &RealDevice) -> Result<String, ApiError> {
        d.info_rom_image_version().map_err(api_error)
    }
    fn gpm_supported(&self, d: &RealDevice) -> Result<bool, ApiError> {
        d.gpm_support().map_err(api_error)
    }
    fn mig_enabled(&self, d: &RealDevice) -> Result<bool, ApiError> {
        d.mig_mode().map(|m| m.current == 1).map_err(api_error)
    }
    fn mig_device_slots(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.mig_device_count().map_err(api_error)
    }
    fn mig_device_by_index(&self, d: &RealDevice, slot: u32) -> Result<RealDevice, ApiError> {
        d.mig_device_by_index(slot).map(Arc::new).map_err(api_error)
    }
    fn gpu_instance_id(&self, mig: &RealDevice) -> Result<u32, ApiError> {
        ffi::gpu_instance_id(self.nvml, mig)
    }
    fn compute_instance_id(&self, mig: &RealDevice) -> Result<u32, ApiError> {
        ffi::compute_instance_id(self.nvml, mig)
    }
    fn gpu_instance_profile(&self, parent: &RealDevice, gi_id: u32) -> Result<GiProfile, ApiError> {
        ffi::gpu_instance_profile(self.nvml, parent, gi_id)
    }
    fn mig_attributes(&self, mig: &RealDevice) -> Result<GiProfile, ApiError> {
        ffi::mig_attributes(self.nvml, mig)
    }
    fn gpu_instance_placement(
        &self,
        parent: &RealDevice,
        gi_id: u32,
    ) -> Result<crate::gpu::MigPlacement, ApiError> {
        ffi::gpu_instance_placement(self.nvml, parent, gi_id)
    }
    fn field_values(
        &self,
        d: &RealDevice,
        requests: &[FieldRequest],
    ) -> Result<Vec<FieldResult>, ApiError> {
        ffi::field_values(self.nvml, self.scheme, d, requests)
    }
    fn ecc_enabled(&self, d: &RealDevice) -> Result<bool, ApiError> {
        d.is_ecc_enabled()
            .map(|m| m.currently_enabled)
            .map_err(api_error)
    }
    fn memory_info(&self, d: &RealDevice) -> Result<MemoryInfo, ApiError> {
        d.memory_info()
            .map(|m| MemoryInfo {
                total: m.total,
                free: m.free,
                used: m.used,
                reserved: m.reserved,
            })
            .map_err(api_error)
    }
    fn utilization(&self, d: &RealDevice) -> Result<(u32, u32), ApiError> {
        d.utilization_rates()
            .map(|u| (u.gpu, u.memory))
            .map_err(api_error)
    }
    fn encoder_utilization(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.encoder_utilization()
            .map(|u| u.utilization)
            .map_err(api_error)
    }
    fn decoder_utilization(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.decoder_utilization()
            .map(|u| u.utilization)
            .map_err(api_error)
    }
    fn clock(&self, d: &RealDevice, kind: ClockKind) -> Result<u32, ApiError> {
        let c = match kind {
            ClockKind::Sm => Clock::SM,
            ClockKind::Memory => Clock::Memory,
            ClockKind::Video => Clock::Video,
        };
        d.clock_info(c).map_err(api_error)
    }
    fn temperature(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.temperature(TemperatureSensor::Gpu).map_err(api_error)
    }
    fn power_usage(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.power_usage().map_err(api_error)
    }
    fn power_limit(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.power_management_limit().map_err(api_error)
    }
    fn enforced_power_limit(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.enforced_power_limit().map_err(api_error)
    }
    fn performance_state(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.performance_state().map(|p| p.as_c()).map_err(api_error)
    }
    fn fan_speed(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.fan_speed(0).map_err(api_error)
    }
    fn pcie_link_gen(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.current_pcie_link_gen().map_err(api_error)
    }
    fn pcie_link_width(&self, d: &RealDevice) -> Result<u32, ApiError> {
        d.current_pcie_link_width().map_err(api_error)
    }
    fn clocks_event_reasons(&self, d: &RealDevice) -> Result<u64, ApiError> {
        ffi::clocks_event_reasons(self.nvml, d)
    }
    fn grid_licensing(&self, d: &RealDevice) -> Result<GridLicensing, ApiError> {
        ffi::grid_licensing(self.nvml, d)
    }
    fn nvlink_active(&self, d: &RealDevice, link: u32) -> Result<bool, ApiError> {
        d.link_wrapper_for(link).is_active().map_err(api_error)
    }
    fn nvlink_error_counter(
        &self,
        d: &RealDevice,
        link: u32,
        counter: NvlinkErrorCounter,
    ) -> Result<u64, ApiError> {
        let c = match counter {
            NvlinkErrorCounter::Replay => ErrorCounter::DlReplay,
            NvlinkErrorCounter::Recovery => ErrorCounter::DlRecovery,
            NvlinkErrorCounter::CrcFlit => ErrorCounter::DlCrcFlit,
            NvlinkErrorCounter::CrcData => ErrorCounter::DlCrcData,
        };
        d.link_wrapper_for(link).error_counter(c).map_err(api_error)
    }
    fn gpm_sample(&self, d: &RealDevice) -> Result<GpmSample<'static>, ApiError> {
        d.gpm_sample().map_err(api_error)
    }
    fn gpm_mig_sample(
        &self,
        parent: &RealDevice,
        gi_id: u32,
    ) -> Result<GpmSample<'static>, ApiError> {
        parent.gpm_mig_sample(gi_id).map_err(api_error)
    }
    fn gpm_metrics(
        &self,
        earlier: &GpmSample<'static>,
        later: &GpmSample<'static>,
        metrics: &[GpmMetric],
    ) -> Result<Vec<Result<f64, ApiError>>, ApiError> {
        let ids: Vec<GpmMetricId> = metrics.iter().map(|&m| gpm_id(m)).collect();
        nvml_wrapper::gpm::gpm_metrics_get(self.nvml, earlier, later, &ids)
            .map(|rs| {
                rs.into_iter()
                    .map(|r| r.map(|v| v.value).map_err(api_error))
                    .collect()
            })
            .map_err(api_error)
    }
    fn xid_events(&self, devices: &[RealDevice]) -> Result<Registered<RealEvents>, ApiError> {
        let devices: Vec<&nvml_wrapper::Device<'static>> = devices.iter().map(|d| &**d).collect();
        ffi::xid_event_set(self.nvml, &devices).map(|(set, skipped)| (RealEvents { set }, skipped))
    }

    fn compute_processes(&self, d: &RealDevice) -> Result<Vec<ProcessInfo>, ApiError> {
        retry_on_growth(|| d.running_compute_processes())
            .map(|ps| ps.into_iter().map(process_info).collect())
    }
    fn mps_compute_processes(&self, d: &RealDevice) -> Result<Vec<ProcessInfo>, ApiError> {
        retry_on_growth(|| d.mps_running_compute_processes())
            .map(|ps| ps.into_iter().map(process_info).collect())
    }
    fn process_utilization(
        &self,
        d: &RealDevice,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessUtilSample>, ApiError> {
        retry_on_growth(|| d.process_utilization_stats(last_seen_us)).map(|ss| {
            ss.into_iter()
                .map(|s| ProcessUtilSample {
                    pid: s.pid,
                    timestamp_us: s.timestamp,
                    sm: s.sm_util,
                    memory: s.mem_util,
                    encoder: s.enc_util,
                    decoder: s.dec_util,
                })
                .collect()
        })
    }
}

/// The wrapper sizes its buffer with a count call first; a process or sample added between the
/// two calls makes the second answer `InsufficientSize`. Two more tries, then give up.
fn retry_on_growth<T>(
    mut call: impl FnMut() -> Result<Vec<T>, WrapperError>,
) -> Result<Vec<T>, ApiError> {
    let mut tries = 0;
    loop {
        match call() {
            Err(WrapperError::InsufficientSize(_)) if tries < 2 => tries += 1,
            other => return other.map_err(api_error),
        }
    }
}

fn process_info(p: nvml_wrapper::struct_wrappers::device::ProcessInfo) -> ProcessInfo {
    ProcessInfo {
        pid: p.pid,
        used_memory: match p.used_gpu_memory {
            nvml_wrapper::enums::device::UsedGpuMemory::Used(b) if b != u64::MAX => Some(b),
            _ => None,
        },
        gpu_instance_id: p.gpu_instance_id,
        compute_instance_id: p.compute_instance_id,
    }
}
