//! An in-memory [`NvmlApi`]: GPUs whose every NVML answer a test sets, and that can be made
//! to fall off the bus, vanish, return, or raise an XID. Used by the backend's tests and by
//! benchmarks that count NVML calls; never by the exporter itself.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::gpu::nvml::api::{
    ApiError, ClockKind, EventWait, FieldNum, FieldRequest, FieldResult, FieldValue, GiProfile,
    GpmMetric, GridLicensing, InforomObject, MemoryInfo, NvlinkErrorCounter, NvmlApi, ProcessInfo,
    ProcessUtilSample, Registered, XidReport,
};
use crate::gpu::MigPlacement;

/// One MIG device of a fake GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeMig {
    /// GPU instance id.
    pub gi_id: u32,
    /// Compute instance id.
    pub ci_id: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
    /// The GPU instance profile name as NVML reports it (`MIG 3g.40gb`).
    pub profile_name: String,
    /// The profile's slice count.
    pub slices: u32,
    /// The profile's memory size, MiB.
    pub profile_mib: u64,
    /// The GPU instance's profile id and placement (start, size), as `nvmlGpuInstanceGetInfo`
    /// reports them.
    pub placement: (u32, u32, u32),
    /// Its framebuffer.
    pub memory: MemoryInfo,
    /// GPM values (NVML units) `nvmlGpmMetricsGet` returns for this GPU instance.
    pub gpm: HashMap<GpmMetric, f64>,
    /// Compute processes listed on this MIG device's handle.
    pub processes: Vec<ProcessInfo>,
}

/// One NVLink of a fake GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FakeLink {
    /// `nvmlDeviceGetNvLinkState` answers enabled.
    pub active: bool,
    /// TX data KiB counter (`NVLINK_THROUGHPUT_DATA_TX` with this link's scope).
    pub tx_kib: u64,
    /// RX data KiB counter.
    pub rx_kib: u64,
    /// Error counters (`nvmlDeviceGetNvLinkErrorCounter`); absent ones answer `NotSupported`.
    pub errors: HashMap<NvlinkErrorCounter, u64>,
}

impl FakeLink {
    /// An active link with zero counters for all four error kinds.
    pub fn active() -> Self {
        Self {
            active: true,
            errors: [
                NvlinkErrorCounter::Replay,
                NvlinkErrorCounter::Recovery,
                NvlinkErrorCounter::CrcFlit,
                NvlinkErrorCounter::CrcData,
            ]
            .into_iter()
            .map(|c| (c, 0))
            .collect(),
            ..Self::default()
        }
    }
}

/// One fake GPU. Fields left `None` (or absent from a map) answer `NotSupported`.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeGpu {
    /// `GPU-…` UUID.
    pub uuid: String,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// Minor number.
    pub minor: u32,
    /// Product name.
    pub name: String,
    /// Board serial.
    pub serial: Option<String>,
    /// Whether NVML lists it (false: vanished from the device list).
    pub present: bool,
    /// Whether it has fallen off the bus (every device call answers `GpuLost`).
    pub lost: bool,
    /// Whether GPM is supported.
    pub gpm_supported: bool,
    /// GPM values (NVML units) for the whole GPU.
    pub gpm: HashMap<GpmMetric, f64>,
    /// MIG enabled.
    pub mig_enabled: bool,
    /// MIG slots; `None` is an empty slot.
    pub mig: Vec<Option<FakeMig>>,
    /// The GPU instance info path answers `NoPermission` (unprivileged container).
    pub gpu_instance_info_denied: bool,
    /// Field values by V12 `NVML_FI_*` id (scope 0).
    pub fields: HashMap<u32, FieldNum>,
    /// `nvmlDeviceGetEccMode`'s current mode; `None` answers `NotSupported`.
    pub ecc_enabled: Option<bool>,
    /// NVLink TX and RX KiB counters summed over links (scope `u32::MAX`).
    pub nvlink_kib: Option<(u64, u64)>,
    /// The NVLinks, by link index (field `NVLINK_LINK_COUNT` answers their number).
    pub links: Vec<FakeLink>,
    /// The driver's field timestamp, µs.
    pub timestamp_us: i64,
    /// Memory info, bytes.
    pub memory: MemoryInfo,
    /// (gpu %, memory %).
    pub utilization: Option<(u32, u32)>,
    /// Encoder %.
    pub encoder: Option<u32>,
    /// Decoder %.
    pub decoder: Option<u32>,
    /// SM, memory, video clocks, MHz.
    pub clocks: (u32, u32, u32),
    /// GPU temperature, °C.
    pub temperature: u32,
    /// Power draw, mW.
    pub power_mw: u32,
    /// Clock event reasons bitmask.
    pub clock_event_reasons: u64,
    /// vGPU software licensing (a vGPU guest); `None` answers `NotSupported` (bare metal).
    pub grid_licensing: Option<GridLicensing>,
    /// Compute processes (`Err`: what the call answers instead).
    pub processes: Result<Vec<ProcessInfo>, ApiError>,
    /// MPS client processes (`Err(NotSupported)` before Volta).
    pub mps_processes: Result<Vec<ProcessInfo>, ApiError>,
    /// The driver's per-process utilisation sample buffer; `nvmlDeviceGetProcessUtilization`
    /// answers the samples newer than its `lastSeenTimeStamp` (`Err`: what it answers instead).
    pub process_samples: Result<Vec<ProcessUtilSample>, ApiError>,
}

impl FakeGpu {
    /// A plausible H100 at index `i`, with all the default CSV's fields answering.
    pub fn h100(i: u32) -> Self {
        let fields = [
            (82, 41),      // MEMORY_TEMP
            (83, 987_654), // TOTAL_ENERGY_CONSUMPTION mJ
            (94, 3),       // PCIE_REPLAY_COUNTER
            (74, 1_000),   // PERF_POLICY_POWER ns
            (75, 2_000),   // PERF_POLICY_THERMAL ns
            (3, 0),
            (4, 0),
            (5, 7),
            (6, 0),
            (29, 0),
            (30, 0),
            (31, 0),
            (142, 0),
            (143, 0),
            (144, 0),
            (145, 0),
            (38, 0),
            (45, 0),
            (52, 0),
            (59, 0),
        ]
        .into_iter()
        .map(|(k, v)| (k, FieldNum::Unsigned(v)))
        .collect();
        let gib = 1_073_741_824u64;
        Self {
            uuid: format!("GPU-fake-{i:04}"),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i),
            minor: i,
            name: "NVIDIA H100 80GB HBM3".into(),
            serial: Some(format!("165000000{i}")),
            present: true,
            lost: false,
            gpm_supported: true,
            gpm: [
                (GpmMetric::GraphicsUtil, 50.0),
                (GpmMetric::SmUtil, 40.0),
                (GpmMetric::SmOccupancy, 20.0),
                (GpmMetric::AnyTensorUtil, 10.0),
                (GpmMetric::DramBwUtil, 30.0),
                (GpmMetric::PcieTxPerSec, 100.0),
                (GpmMetric::PcieRxPerSec, 200.0),
            ]
            .into_iter()
            .collect(),
            mig_enabled: false,
            mig: Vec::new(),
            gpu_instance_info_denied: false,
            fields,
            ecc_enabled: Some(true),
            nvlink_kib: Some((0, 0)),
            links: (0..18).map(|_| FakeLink::active()).collect(),
            timestamp_us: 1_000_000,
            memory: MemoryInfo {
                total: 80 * gib,
                reserved: gib / 2,
                used: 10 * gib,
                free: 80 * gib - gib / 2 - 10 * gib,
            },
            utilization: Some((75, 30)),
            encoder: Some(0),
            decoder: Some(0),
            clocks: (1980, 2619, 1755),
            temperature: 45,
            power_mw: 302_206,
            clock_event_reasons: 0,
            grid_licensing: None,
            processes: Ok(Vec::new()),
            mps_processes: Ok(Vec::new()),
            process_samples: Ok(Vec::new()),
        }
    }
}

/// The whole fake NVML.
#[derive(Debug, Clone, Default)]
pub struct FakeState {
    /// Driver version string.
    pub driver_version: String,
    /// GPUs, including those not `present`.
    pub gpus: Vec<FakeGpu>,
}

/// A device handle of the fake: a GPU index into [`FakeState::gpus`] and, for a MIG device,
/// its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeHandle {
    gpu: usize,
    slot: Option<usize>,
}

/// A GPM sample of the fake: the values configured when it was taken.
#[derive(Debug)]
pub struct FakeGpmSample {
    owner: (usize, Option<u32>),
    seq: u64,
    values: HashMap<GpmMetric, f64>,
}

/// The fake's event set.
#[derive(Debug)]
pub struct FakeEvents {
    rx: mpsc::Receiver<XidReport>,
    failures: Arc<Mutex<VecDeque<ApiError>>>,
}

impl EventWait for FakeEvents {
    fn wait(&mut self, timeout_ms: u32) -> Result<Option<XidReport>, ApiError> {
        let failure = self
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        if let Some(e) = failure {
            return Err(e);
        }
        match self
            .rx
            .recv_timeout(Duration::from_millis(u64::from(timeout_ms)))
        {
            Ok(r) => Ok(Some(r)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(ApiError::Other("event set closed".into()))
            }
        }
    }
}

/// The in-memory NVML. Clones share state, so a test keeps one to change the fleet while the
/// source under test holds another.
#[derive(Debug, Clone, Default)]
pub struct FakeNvml {
    state: Arc<Mutex<FakeState>>,
    events: Arc<Mutex<Option<Registration>>>,
    wait_failures: Arc<Mutex<VecDeque<ApiError>>>,
    sets_created: Arc<Mutex<u64>>,
    seq: Arc<Mutex<u64>>,
}

/// The current event set's sender and the GPUs (indices into [`FakeState::gpus`]) it
/// registered, by position.
#[derive(Debug)]
struct Registration {
    tx: mpsc::Sender<XidReport>,
    gpus: Vec<Option<usize>>,
}

impl FakeNvml {
    /// A fake with `gpus` and driver `driver_version`.
    pub fn new(driver_version: &str, gpus: Vec<FakeGpu>) -> Self {
        Self {
            state: Arc::new(Mutex::new(FakeState {
                driver_version: driver_version.into(),
                gpus,
            })),
            ..Self::default()
        }
    }

    /// Changes the fleet.
    pub fn update(&self, f: impl FnOnce(&mut FakeState)) {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Delivers an XID on the GPU with `uuid` through the current event set. Returns false if
    /// no set is registered for that GPU. Like NVML, it works for a GPU that fell off the bus.
    pub fn raise_xid(&self, uuid: &str, xid: u64) -> bool {
        let gpu = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .gpus
            .iter()
            .position(|g| g.uuid == uuid);
        let reg = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        reg.as_ref().is_some_and(|r| {
            r.gpus
                .iter()
                .position(|g| g.is_some() && *g == gpu)
                .is_some_and(|device| r.tx.send(XidReport { device, xid }).is_ok())
        })
    }

    /// Makes the next waits on any event set fail with these errors, in order.
    pub fn fail_event_waits(&self, errors: impl IntoIterator<Item = ApiError>) {
        self.wait_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(errors);
    }

    /// Event sets created so far.
    pub fn event_sets_created(&self) -> u64 {
        *self
            .sets_created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn with<T>(
        &self,
        h: &FakeHandle,
        f: impl FnOnce(&FakeGpu, Option<&FakeMig>) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let g = st.gpus.get(h.gpu).ok_or(ApiError::NotFound)?;
        if g.lost {
            return Err(ApiError::GpuLost);
        }
        match h.slot {
            None => f(g, None),
            Some(s) => match g.mig.get(s) {
                Some(Some(m)) => f(g, Some(m)),
                _ => Err(ApiError::NotFound),
            },
        }
    }

    fn gpu<T>(&self, h: &FakeHandle, f: impl FnOnce(&FakeGpu) -> Option<T>) -> Result<T, ApiError> {
        self.with(h, |g, m| match m {
            None => f(g).ok_or(ApiError::NotSupported),
            Some(_) => Err(ApiError::NotSupported),
        })
    }
}

impl NvmlApi for FakeNvml {
    type Device = FakeHandle;
    type GpmSample = FakeGpmSample;
    type Events = FakeEvents;

    fn driver_version(&self) -> Result<String, ApiError> {
        Ok(self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .driver_version
            .clone())
    }
    fn nvml_version(&self) -> Result<String, ApiError> {
        Ok(format!("12.{}", self.driver_version()?))
    }
    fn cuda_driver_version(&self) -> Result<i32, ApiError> {
        Ok(12080)
    }
    fn device_count(&self) -> Result<u32, ApiError> {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(st.gpus.iter().filter(|g| g.present).count() as u32)
    }
    fn device_by_index(&self, index: u32) -> Result<FakeHandle, ApiError> {
        let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (gpu, g) = st
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.present)
            .nth(index as usize)
            .ok_or(ApiError::NotFound)?;
        if g.lost {
            return Err(ApiError::GpuLost);
        }
        Ok(FakeHandle { gpu, slot: None })
    }
    fn uuid(&self, d: &FakeHandle) -> Result<String, ApiError> {
        self.with(d, |g, m| {
            Ok(m.map_or_else(|| g.uuid.clone(), |m| m.uuid.clone()))
        })
    }
    fn pci_bus_id(&self, d: &FakeHandle) -> Result<String, ApiError> {
        self.gpu(d, |g| Some(g.pci_bus_id.clone()))
    }
    fn minor_number(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |g| Some(g.minor))
    }
    fn name(&self, d: &FakeHandle) -> Result<String, ApiError> {
        self.with(d, |g, m| {
            Ok(match m {
                None => g.name.clone(),
                Some(m) => format!("{} {}", g.name, m.profile_name),
            })
        })
    }
    fn brand(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |_| Some(14)) // NVML_BRAND_NVIDIA
    }
    fn serial(&self, d: &FakeHandle) -> Result<String, ApiError> {
        self.gpu(d, |g| g.serial.clone())
    }
    fn vbios_version(&self, d: &FakeHandle) -> Result<String, ApiError> {
        self.gpu(d, |_| Some("96.00.89.00.01".into()))
    }
    fn inforom_version(&self, d: &FakeHandle, obj: InforomObject) -> Result<String, ApiError> {
        self.gpu(d, |_| match obj {
            InforomObject::Oem => Some("1.1".into()),
            InforomObject::Ecc => Some("7.0".into()),
            InforomObject::Power => None,
        })
    }
    fn inforom_image_version(&self, d: &FakeHandle) -> Result<String, ApiError> {
        self.gpu(d, |_| Some("G520.0200.00.05".into()))
    }
    fn gpm_supported(&self, d: &FakeHandle) -> Result<bool, ApiError> {
        self.gpu(d, |g| Some(g.gpm_supported))
    }
    fn mig_enabled(&self, d: &FakeHandle) -> Result<bool, ApiError> {
        self.gpu(d, |g| Some(g.mig_enabled))
    }
    fn mig_device_slots(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |g| Some(g.mig.len() as u32))
    }
    fn mig_device_by_index(&self, d: &FakeHandle, slot: u32) -> Result<FakeHandle, ApiError> {
        self.with(d, |g, _| match g.mig.get(slot as usize) {
            Some(Some(_)) => Ok(FakeHandle {
                gpu: d.gpu,
                slot: Some(slot as usize),
            }),
            _ => Err(ApiError::NotFound),
        })
    }
    fn gpu_instance_id(&self, mig: &FakeHandle) -> Result<u32, ApiError> {
        self.with(mig, |_, m| m.map(|m| m.gi_id).ok_or(ApiError::NotSupported))
    }
    fn compute_instance_id(&self, mig: &FakeHandle) -> Result<u32, ApiError> {
        self.with(mig, |_, m| m.map(|m| m.ci_id).ok_or(ApiError::NotSupported))
    }
    fn gpu_instance_profile(&self, parent: &FakeHandle, gi_id: u32) -> Result<GiProfile, ApiError> {
        let denied = self.gpu(parent, |g| Some(g.gpu_instance_info_denied))?;
        if denied {
            return Err(ApiError::NoPermission);
        }
        self.gpu(parent, |g| {
            g.mig
                .iter()
                .flatten()
                .find(|m| m.gi_id == gi_id)
                .map(|m| GiProfile {
                    slices: m.slices,
                    memory_mib: m.profile_mib,
                    name: m.profile_name.clone(),
                })
        })
    }
    fn gpu_instance_placement(
        &self,
        parent: &FakeHandle,
        gi_id: u32,
    ) -> Result<MigPlacement, ApiError> {
        let denied = self.gpu(parent, |g| Some(g.gpu_instance_info_denied))?;
        if denied {
            return Err(ApiError::NoPermission);
        }
        self.gpu(parent, |g| {
            g.mig
                .iter()
                .flatten()
                .find(|m| m.gi_id == gi_id)
                .map(|m| MigPlacement {
                    profile_id: m.placement.0,
                    start: m.placement.1,
                    size: m.placement.2,
                })
        })
    }
    fn mig_attributes(&self, mig: &FakeHandle) -> Result<GiProfile, ApiError> {
        self.with(mig, |_, m| {
            m.map(|m| GiProfile {
                slices: m.slices,
                memory_mib: m.profile_mib,
                name: String::new(),
            })
            .ok_or(ApiError::NotSupported)
        })
    }
    fn field_values(
        &self,
        d: &FakeHandle,
        requests: &[FieldRequest],
    ) -> Result<Vec<FieldResult>, ApiError> {
        self.gpu(d, |g| {
            Some(
                requests
                    .iter()
                    .map(|r| {
                        let link = g.links.get(r.scope as usize).filter(|l| l.active);
                        let value = match (r.id, r.scope, g.nvlink_kib) {
                            (138, u32::MAX, Some((tx, _))) => Ok(FieldNum::Unsigned(tx)),
                            (139, u32::MAX, Some((_, rx))) => Ok(FieldNum::Unsigned(rx)),
                            (138, _, _) => link
                                .map(|l| FieldNum::Unsigned(l.tx_kib))
                                .ok_or(ApiError::NotSupported),
                            (139, _, _) => link
                                .map(|l| FieldNum::Unsigned(l.rx_kib))
                                .ok_or(ApiError::NotSupported),
                            // NVML_FI_DEV_NVLINK_LINK_COUNT
                            (91, 0, _) if !g.links.is_empty() => {
                                Ok(FieldNum::Unsigned(g.links.len() as u64))
                            }
                            (id, 0, _) => g.fields.get(&id).copied().ok_or(ApiError::NotSupported),
                            _ => Err(ApiError::NotSupported),
                        }
                        .map(FieldValue::from);
                        FieldResult {
                            timestamp_us: g.timestamp_us,
                            value,
                        }
                    })
                    .collect(),
            )
        })
    }
    fn ecc_enabled(&self, d: &FakeHandle) -> Result<bool, ApiError> {
        self.gpu(d, |g| g.ecc_enabled)
    }
    fn memory_info(&self, d: &FakeHandle) -> Result<MemoryInfo, ApiError> {
        self.with(d, |g, m| Ok(m.map_or(g.memory, |m| m.memory)))
    }
    fn utilization(&self, d: &FakeHandle) -> Result<(u32, u32), ApiError> {
        self.gpu(d, |g| g.utilization.filter(|_| !g.mig_enabled))
    }
    fn encoder_utilization(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |g| g.encoder)
    }
    fn decoder_utilization(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |g| g.decoder)
    }
    fn clock(&self, d: &FakeHandle, kind: ClockKind) -> Result<u32, ApiError> {
        self.gpu(d, |g| {
            Some(match kind {
                ClockKind::Sm => g.clocks.0,
                ClockKind::Memory => g.clocks.1,
                ClockKind::Video => g.clocks.2,
            })
        })
    }
    fn temperature(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |g| Some(g.temperature))
    }
    fn power_usage(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |g| Some(g.power_mw))
    }
    fn power_limit(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |_| Some(700_000))
    }
    fn enforced_power_limit(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |_| Some(700_000))
    }
    fn performance_state(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |_| Some(0))
    }
    fn fan_speed(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |_| None)
    }
    fn pcie_link_gen(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |_| Some(5))
    }
    fn pcie_link_width(&self, d: &FakeHandle) -> Result<u32, ApiError> {
        self.gpu(d, |_| Some(16))
    }
    fn clocks_event_reasons(&self, d: &FakeHandle) -> Result<u64, ApiError> {
        self.gpu(d, |g| Some(g.clock_event_reasons))
    }
    fn grid_licensing(&self, d: &FakeHandle) -> Result<GridLicensing, ApiError> {
        self.gpu(d, |g| g.grid_licensing.clone())
    }
    fn nvlink_active(&self, d: &FakeHandle, link: u32) -> Result<bool, ApiError> {
        self.gpu(d, |g| g.links.get(link as usize).map(|l| l.active))
    }
    fn nvlink_error_counter(
        &self,
        d: &FakeHandle,
        link: u32,
        counter: NvlinkErrorCounter,
    ) -> Result<u64, ApiError> {
        self.gpu(d, |g| {
            g.links
                .get(link as usize)
                .filter(|l| l.active)
                .and_then(|l| l.errors.get(&counter).copied())
        })
    }
    fn gpm_sample(&self, d: &FakeHandle) -> Result<FakeGpmSample, ApiError> {
        let values = self.gpu(d, |g| g.gpm_supported.then(|| g.gpm.clone()))?;
        Ok(self.gpm_take((d.gpu, None), values))
    }
    fn gpm_mig_sample(&self, parent: &FakeHandle, gi_id: u32) -> Result<FakeGpmSample, ApiError> {
        let values = self.gpu(parent, |g| {
            g.mig
                .iter()
                .flatten()
                .find(|m| m.gi_id == gi_id)
                .filter(|_| g.gpm_supported)
                .map(|m| m.gpm.clone())
        })?;
        Ok(self.gpm_take((parent.gpu, Some(gi_id)), values))
    }
    fn gpm_metrics(
        &self,
        earlier: &FakeGpmSample,
        later: &FakeGpmSample,
        metrics: &[GpmMetric],
    ) -> Result<Vec<Result<f64, ApiError>>, ApiError> {
        if earlier.owner != later.owner || earlier.seq >= later.seq {
            return Err(ApiError::Other("GPM samples out of order".into()));
        }
        Ok(metrics
            .iter()
            .map(|m| later.values.get(m).copied().ok_or(ApiError::NotSupported))
            .collect())
    }
    fn xid_events(&self, devices: &[FakeHandle]) -> Result<Registered<FakeEvents>, ApiError> {
        let mut skipped = Vec::new();
        let mut gpus = Vec::with_capacity(devices.len());
        for (i, d) in devices.iter().enumerate() {
            match self.uuid(d) {
                Ok(_) => gpus.push(Some(d.gpu)),
                Err(e) => {
                    skipped.push((i, e));
                    gpus.push(None);
                }
            }
        }
        let (tx, rx) = mpsc::channel();
        *self.events.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Registration { tx, gpus });
        *self
            .sets_created
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
        Ok((
            FakeEvents {
                rx,
                failures: Arc::clone(&self.wait_failures),
            },
            skipped,
        ))
    }
    fn compute_processes(&self, d: &FakeHandle) -> Result<Vec<ProcessInfo>, ApiError> {
        self.processes_of(d, false)
    }
    fn mps_compute_processes(&self, d: &FakeHandle) -> Result<Vec<ProcessInfo>, ApiError> {
        self.processes_of(d, true)
    }
    fn process_utilization(
        &self,
        d: &FakeHandle,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessUtilSample>, ApiError> {
        self.with(d, |g, m| {
            if m.is_some() || g.mig_enabled {
                // "On MIG-enabled GPUs, querying process utilization is not currently supported."
                return Err(ApiError::NotSupported);
            }
            let newer: Vec<ProcessUtilSample> = g
                .process_samples
                .clone()?
                .into_iter()
                .filter(|s| s.timestamp_us > last_seen_us)
                .collect();
            if newer.is_empty() {
                Err(ApiError::NotFound)
            } else {
                Ok(newer)
            }
        })
    }
}

impl FakeNvml {
    fn processes_of(&self, d: &FakeHandle, mps: bool) -> Result<Vec<ProcessInfo>, ApiError> {
        self.with(d, |g, m| match (m, mps) {
            (Some(m), false) => Ok(m.processes.clone()),
            (Some(_), true) => Ok(Vec::new()),
            (None, false) => g.processes.clone(),
            (None, true) => g.mps_processes.clone(),
        })
    }

    fn gpm_take(
        &self,
        owner: (usize, Option<u32>),
        values: HashMap<GpmMetric, f64>,
    ) -> FakeGpmSample {
        let mut seq = self.seq.lock().unwrap_or_else(PoisonError::into_inner);
        *seq += 1;
        FakeGpmSample {
            owner,
            seq: *seq,
            values,
        }
    }
}
