//! One fake GPU: its identity, MIG devices, NVLinks and the answer to every NVML call on it.

use std::collections::HashMap;

use gpu_exporter::gpu::nvml::api::{
    ApiError, FieldNum, GpmMetric, GridLicensing, MemoryInfo, NvlinkErrorCounter, ProcessInfo,
    ProcessUtilSample,
};

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
