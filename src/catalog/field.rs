//! The closed set of fields gpu-exporter can read, and the DCGM field dictionary.
//!
//! Two tables live here. [`Field`] is what our sources (NVML, the simulator) know how to
//! produce; each variant carries its DCGM field id, its value kind and how it behaves on a MIG
//! instance. The DCGM dictionary ([`lookup`]) is the full list of DCGM 4.6 field names, canonical
//! and deprecated aliases, loaded from `dcgm-fields.tsv`; it lets the CSV parser tell "a real DCGM
//! field we do not collect" (skipped with a warning, as dcgm-exporter does) from "a typo" (a
//! startup error). Nothing here does I/O.

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

/// What kind of value a field yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// An integer (counts, MHz, MiB, °C, %...).
    Int,
    /// A floating point number (watts, ratios, bytes per second).
    Float,
    /// A string; only useful as a `label`-type CSV row.
    Text,
}

/// How a field behaves on a MIG GPU instance entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigScope {
    /// Read per GPU instance (framebuffer, profiling activity).
    Instance,
    /// A property of the physical GPU, repeated on each of its instances (temperature, clocks,
    /// power, ECC), as DCGM reports it for GPU-instance entities: DCGM reads the parent GPU's
    /// value for every NVML-backed field whose entity level is the GPU.
    Parent,
    /// A GPU-level reading DCGM has no data for on GPU-instance entities: the GPM metrics of
    /// the whole GPU (PCIe and NVLink bytes). Repeating them on each instance would make sums
    /// over instances count the GPU's traffic once per instance.
    Gpu,
    /// Not defined for MIG instances (utilization: NVML does not report it in MIG mode).
    Unsupported,
    /// Not a GPU or GPU-instance field at all: read per NVLink of the physical GPU and exported
    /// on dcgm-exporter's link entities (`nvlink` label, DCGM entity group `FE_LINK`).
    Link,
}

macro_rules! fields {
    ($( $(#[$doc:meta])* $variant:ident = $id:literal, $kind:ident, $mig:ident; )*) => {
        /// A field gpu-exporter can collect. The discriminant is the DCGM field id (exporter-only
        /// `DCGM_EXP_*` fields use dcgm-exporter's internal ids, 9001 and up).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum Field {
            $( $(#[$doc])* $variant = $id, )*
        }

        impl Field {
            /// Every field, in DCGM id order.
            pub const ALL: &'static [Field] = &[$(Field::$variant,)*];

            /// The field with this DCGM id, if we collect it.
            pub fn from_id(id: u16) -> Option<Field> {
                match id {
                    $( $id => Some(Field::$variant), )*
                    _ => None,
                }
            }

            /// The kind of value this field yields.
            pub fn kind(self) -> ValueKind {
                match self { $( Field::$variant => ValueKind::$kind, )* }
            }

            /// How this field behaves on a MIG instance.
            pub fn mig_scope(self) -> MigScope {
                match self { $( Field::$variant => MigScope::$mig, )* }
            }
        }
    };
}

fields! {
    /// Driver version string (`DCGM_FI_DRIVER_VERSION`).
    DriverVersion = 1, Text, Parent;
    /// NVML library version string.
    NvmlVersion = 2, Text, Parent;
    /// CUDA driver version (major*1000 + minor*10).
    CudaDriverVersion = 5, Int, Parent;
    /// Product name.
    DevName = 50, Text, Parent;
    /// Brand string.
    Brand = 51, Text, Parent;
    /// Board serial number.
    Serial = 53, Text, Parent;
    /// OEM infoROM version.
    OemInforomVer = 56, Text, Parent;
    /// ECC infoROM version.
    EccInforomVer = 80, Text, Parent;
    /// Power infoROM version.
    PowerInforomVer = 81, Text, Parent;
    /// infoROM image version.
    InforomImageVer = 82, Text, Parent;
    /// VBIOS version.
    VbiosVersion = 85, Text, Parent;
    /// SM clock, MHz.
    SmClock = 100, Int, Parent;
    /// Memory clock, MHz.
    MemClock = 101, Int, Parent;
    /// Video clock, MHz.
    VideoClock = 102, Int, Parent;
    /// Current clock event (throttle) reasons, a bitmask.
    ClocksEventReasons = 112, Int, Parent;
    /// Memory (HBM) temperature, °C.
    MemoryTemp = 140, Int, Parent;
    /// GPU temperature, °C.
    GpuTemp = 150, Int, Parent;
    /// Board power draw, W.
    PowerUsage = 155, Float, Parent;
    /// Energy since the driver loaded, mJ.
    TotalEnergyConsumption = 156, Int, Parent;
    /// Instantaneous power draw, W.
    PowerUsageInstant = 157, Float, Parent;
    /// Current power management limit, W.
    PowerMgmtLimit = 160, Float, Parent;
    /// Enforced power limit, W.
    EnforcedPowerLimit = 164, Float, Parent;
    /// Performance state, 0-15.
    Pstate = 190, Int, Parent;
    /// Fan speed, %.
    FanSpeed = 191, Int, Parent;
    /// PCIe replay counter.
    PcieReplayCounter = 202, Int, Parent;
    /// GPU utilization, %.
    GpuUtil = 203, Int, Unsupported;
    /// Memory copy utilization, %.
    MemCopyUtil = 204, Int, Unsupported;
    /// Encoder utilization, %.
    EncUtil = 206, Int, Unsupported;
    /// Decoder utilization, %.
    DecUtil = 207, Int, Unsupported;
    /// Value of the last XID error seen.
    XidErrors = 230, Int, Parent;
    /// Current PCIe link generation.
    PcieLinkGen = 237, Int, Parent;
    /// Current PCIe link width.
    PcieLinkWidth = 238, Int, Parent;
    /// Time throttled by power, ns.
    PowerViolation = 240, Int, Parent;
    /// Time throttled by temperature, ns.
    ThermalViolation = 241, Int, Parent;
    /// Time throttled by sync boost, ns.
    SyncBoostViolation = 242, Int, Parent;
    /// Time throttled by the board limit, ns.
    BoardLimitViolation = 243, Int, Parent;
    /// Time throttled by low utilization, ns.
    LowUtilViolation = 244, Int, Parent;
    /// Time throttled by reliability, ns.
    ReliabilityViolation = 245, Int, Parent;
    /// Framebuffer total, MiB.
    FbTotal = 250, Int, Instance;
    /// Framebuffer free, MiB.
    FbFree = 251, Int, Instance;
    /// Framebuffer used, MiB.
    FbUsed = 252, Int, Instance;
    /// Framebuffer reserved by the driver, MiB.
    FbReserved = 253, Int, Instance;
    /// Framebuffer used / (total - reserved), 0-1.
    FbUsedPercent = 254, Float, Instance;
    /// ECC mode currently enabled (1) or not (0).
    EccCurrent = 300, Int, Parent;
    /// Single-bit ECC errors since the driver loaded.
    EccSbeVolTotal = 310, Int, Parent;
    /// Double-bit ECC errors since the driver loaded.
    EccDbeVolTotal = 311, Int, Parent;
    /// Single-bit ECC errors over the board's lifetime.
    EccSbeAggTotal = 312, Int, Parent;
    /// Double-bit ECC errors over the board's lifetime.
    EccDbeAggTotal = 313, Int, Parent;
    /// Pages retired for multiple single-bit errors.
    RetiredSbe = 390, Int, Parent;
    /// Pages retired for double-bit errors.
    RetiredDbe = 391, Int, Parent;
    /// Whether pages are pending retirement (1) or not (0).
    RetiredPending = 392, Int, Parent;
    /// Rows remapped for uncorrectable errors.
    UncorrectableRemappedRows = 393, Int, Parent;
    /// Rows remapped for correctable errors.
    CorrectableRemappedRows = 394, Int, Parent;
    /// Whether row remapping has failed (1) or not (0).
    RowRemapFailure = 395, Int, Parent;
    /// Whether a row remap is pending (1) or not (0).
    RowRemapPending = 396, Int, Parent;
    /// NVLink flow-control CRC errors, all links.
    NvlinkCrcFlitErrorCountTotal = 409, Int, Parent;
    /// vGPU licence status in a vGPU guest: 1 licensed, 0 not (or vGPU licensing does not
    /// apply); absent where NVML does not support the call (as DCGM).
    VgpuLicenseStatus = 526, Int, Parent;
    /// NVLink data CRC errors, all links.
    NvlinkCrcDataErrorCountTotal = 419, Int, Parent;
    /// NVLink replay errors, all links.
    NvlinkReplayErrorCountTotal = 429, Int, Parent;
    /// NVLink recovery errors, all links.
    NvlinkRecoveryErrorCountTotal = 439, Int, Parent;
    /// NVLink TX+RX throughput over all links, MB/s (a rate, as DCGM computes it).
    NvlinkBandwidthTotal = 449, Int, Parent;
    /// Per link: NVLink flow-control CRC errors.
    NvlinkCrcFlitErrorPerLinkTotal = 1525, Int, Link;
    /// Per link: NVLink data CRC errors.
    NvlinkCrcDataErrorPerLinkTotal = 1526, Int, Link;
    /// Per link: NVLink replay errors.
    NvlinkReplayErrorPerLinkTotal = 1527, Int, Link;
    /// Per link: NVLink recovery errors.
    NvlinkRecoveryErrorPerLinkTotal = 1528, Int, Link;
    /// Per link: TX+RX throughput, MB/s (DCGM's KiB/s ÷ 1000).
    NvlinkThroughputPerLink = 1529, Int, Link;
    /// Per link: TX throughput, MB/s.
    NvlinkTxThroughputPerLink = 1530, Int, Link;
    /// Per link: RX throughput, MB/s.
    NvlinkRxThroughputPerLink = 1531, Int, Link;
    /// Ratio of time the graphics engine is active.
    ProfGrEngineActive = 1001, Float, Instance;
    /// Ratio of cycles an SM has at least one warp assigned.
    ProfSmActive = 1002, Float, Instance;
    /// Ratio of resident warps to the maximum.
    ProfSmOccupancy = 1003, Float, Instance;
    /// Ratio of cycles a tensor pipe is active.
    ProfPipeTensorActive = 1004, Float, Instance;
    /// Ratio of cycles the memory interface is active.
    ProfDramActive = 1005, Float, Instance;
    /// Ratio of cycles the FP64 pipe is active.
    ProfPipeFp64Active = 1006, Float, Instance;
    /// Ratio of cycles the FP32 pipe is active.
    ProfPipeFp32Active = 1007, Float, Instance;
    /// Ratio of cycles the FP16 pipe is active.
    ProfPipeFp16Active = 1008, Float, Instance;
    /// PCIe transmit rate, bytes/s.
    ProfPcieTxBytes = 1009, Float, Gpu;
    /// PCIe receive rate, bytes/s.
    ProfPcieRxBytes = 1010, Float, Gpu;
    /// NVLink transmit rate, bytes/s.
    ProfNvlinkTxBytes = 1011, Float, Gpu;
    /// NVLink receive rate, bytes/s.
    ProfNvlinkRxBytes = 1012, Float, Gpu;
    /// SM clock, Hz (DCGM 4.6.1's base-unit field).
    SmClockHertz = 1603, Int, Parent;
    /// Memory clock, Hz.
    MemoryClockHertz = 1604, Int, Parent;
    /// Video clock, Hz.
    VideoClockHertz = 1605, Int, Parent;
    /// Energy since the driver loaded, whole joules.
    GpuEnergyJoulesTotal = 1611, Int, Parent;
    /// Fan speed as a ratio of the maximum (0-1, may exceed 1).
    FanSpeedRatio = 1612, Float, Parent;
    /// GPU utilization, 0-1 (DCGM 4.7).
    GpuUtilRatio = 1613, Float, Unsupported;
    /// Memory copy utilization, 0-1.
    MemoryUtilRatio = 1614, Float, Unsupported;
    /// Encoder utilization, 0-1.
    EncUtilRatio = 1615, Float, Unsupported;
    /// Decoder utilization, 0-1.
    DecUtilRatio = 1616, Float, Unsupported;
    /// Framebuffer total, bytes.
    FbCapacityBytes = 1625, Int, Instance;
    /// Framebuffer free, bytes.
    FbFreeBytes = 1626, Int, Instance;
    /// Framebuffer used, bytes.
    FbUsedBytes = 1627, Int, Instance;
    /// Framebuffer reserved by the driver, bytes.
    FbReservedBytes = 1628, Int, Instance;
    /// NVLink TX+RX throughput over all links, bytes/s (DCGM's KiB/s × 1024).
    NvlinkThroughputBytesPerSecond = 1648, Int, Parent;
    /// Exporter field: clock events seen in the window, by reason.
    ExpClockEventsCount = 9001, Int, Parent;
    /// Exporter field: XIDs seen in the window, by XID.
    ExpXidErrorsCount = 9002, Int, Parent;
    /// Exporter field: health status by watch (0 pass, 10 warn, 20 fail).
    ExpGpuHealthStatus = 9003, Int, Parent;
    /// Exporter field: NVLink P2P status by peer.
    ExpP2pStatus = 9004, Int, Parent;
}

impl Field {
    /// The DCGM field id.
    pub fn id(self) -> u16 {
        self as u16
    }

    /// Whether this is a DCGM profiling (`DCGM_FI_PROF_*`, ids 1000-1099) field.
    pub fn is_profiling(self) -> bool {
        (1000..1100).contains(&self.id())
    }

    /// Whether this field is synthesised by the exporter (`DCGM_EXP_*`).
    pub fn is_exporter(self) -> bool {
        self.id() >= 9000
    }

    /// Whether this field is read per NVLink and exported on link entities.
    pub fn is_link(self) -> bool {
        self.mig_scope() == MigScope::Link
    }

    /// Whether this is a system-wide field (driver, NVML, CUDA versions: DCGM's entity level
    /// `FE_NONE`), which dcgm-exporter also attaches to link entities.
    pub fn is_system(self) -> bool {
        self.id() < 50
    }

    /// The name dcgm-exporter uses for this field (the legacy DCGM name).
    pub fn dcgm_name(self) -> &'static str {
        dictionary()
            .legacy_by_id
            .get(&self.id())
            .copied()
            .unwrap_or("DCGM_FI_UNKNOWN")
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dcgm_name())
    }
}

/// What the DCGM dictionary knows about a field name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcgmField {
    /// DCGM field id.
    pub id: u16,
    /// The field, if gpu-exporter collects it.
    pub field: Option<Field>,
}

/// Exporter-only fields (`DCGM_EXP_*`), which are not in DCGM's header.
const EXPORTER_FIELDS: &[(&str, Field)] = &[
    ("DCGM_EXP_CLOCK_EVENTS_COUNT", Field::ExpClockEventsCount),
    ("DCGM_EXP_XID_ERRORS_COUNT", Field::ExpXidErrorsCount),
    ("DCGM_EXP_GPU_HEALTH_STATUS", Field::ExpGpuHealthStatus),
    ("DCGM_EXP_P2P_STATUS", Field::ExpP2pStatus),
];

struct Dictionary {
    by_name: HashMap<&'static str, u16>,
    /// DCGM's own value type and unit of the fields newer than DCGM 4.6.0, for the docs test.
    #[cfg_attr(not(test), allow(dead_code))]
    newer_units: HashMap<u16, (&'static str, &'static str)>,
    /// The name dcgm-exporter's CSVs use: the deprecated alias where DCGM 4.6 renamed it.
    legacy_by_id: HashMap<u16, &'static str>,
}

/// The DCGM 4.6 field list (id, canonical name, type, tag, unit, description), followed by the
/// deprecated aliases (id, old name, empty columns).
const DCGM_FIELDS_TSV: &str = include_str!("dcgm-fields.tsv");

/// Names newer than DCGM 4.6.0 (4.6.1 base-unit fields, DCGM 4.7 and 4.8 names) and
/// dcgm-exporter's 1.x names: id, name, DCGM type, unit, source. They win over the 4.6.0 table.
const NEWER_FIELDS_TSV: &str = include_str!("dcgm-fields-newer.tsv");

fn dictionary() -> &'static Dictionary {
    static DICT: OnceLock<Dictionary> = OnceLock::new();
    DICT.get_or_init(|| {
        let mut by_name = HashMap::new();
        let mut legacy_by_id = HashMap::new();
        for line in DCGM_FIELDS_TSV.lines() {
            if line.starts_with('#') || line.starts_with("id\t") {
                continue;
            }
            let mut cols = line.split('\t');
            let (Some(id), Some(name)) = (cols.next(), cols.next()) else {
                continue;
            };
            let Ok(id) = id.parse::<u16>() else { continue };
            by_name.insert(name, id);
            // Rows with an empty type column are the deprecated aliases; they are the names
            // dcgm-exporter still emits, so they win over the canonical name.
            let is_alias = cols.next().is_none_or(str::is_empty);
            if is_alias || !legacy_by_id.contains_key(&id) {
                legacy_by_id.insert(id, name);
            }
        }
        let mut newer_units = HashMap::new();
        for line in NEWER_FIELDS_TSV.lines() {
            if line.starts_with('#') || line.starts_with("id\t") {
                continue;
            }
            let cols: Vec<&'static str> = line.split('\t').collect();
            let (Some(id), Some(&name)) = (
                cols.first().and_then(|i| i.parse::<u16>().ok()),
                cols.get(1),
            ) else {
                continue;
            };
            by_name.insert(name, id);
            // A new id's own name is the one to emit; the 1.x and rename rows are aliases.
            legacy_by_id.entry(id).or_insert(name);
            let (ty, unit) = (
                cols.get(2).copied().unwrap_or(""),
                cols.get(3).copied().unwrap_or(""),
            );
            if !ty.is_empty() {
                newer_units.insert(id, (ty, unit));
            }
        }
        for (name, field) in EXPORTER_FIELDS {
            by_name.insert(name, field.id());
            legacy_by_id.insert(field.id(), name);
        }
        Dictionary {
            by_name,
            legacy_by_id,
            newer_units,
        }
    })
}

/// Looks up a DCGM field name (canonical, deprecated alias, or `DCGM_EXP_*`).
pub fn lookup(name: &str) -> Option<DcgmField> {
    dictionary().by_name.get(name).map(|&id| DcgmField {
        id,
        field: Field::from_id(id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_and_canonical_names_resolve_to_the_same_field() {
        assert_eq!(
            lookup("DCGM_FI_DEV_GPU_TEMP").unwrap().field,
            Some(Field::GpuTemp)
        );
        assert_eq!(
            lookup("DCGM_FI_DEV_GPU_TEMP_CELSIUS").unwrap().field,
            Some(Field::GpuTemp)
        );
        assert_eq!(lookup("DCGM_FI_DEV_GPU_TEMP").unwrap().id, 150);
    }

    #[test]
    fn every_field_has_its_dcgm_exporter_name() {
        for f in Field::ALL {
            let name = f.dcgm_name();
            assert_ne!(name, "DCGM_FI_UNKNOWN", "{f:?} has no name");
            assert_eq!(lookup(name).unwrap().field, Some(*f), "{name}");
        }
        assert_eq!(Field::GpuUtil.dcgm_name(), "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(Field::DriverVersion.dcgm_name(), "DCGM_FI_DRIVER_VERSION");
        assert_eq!(
            Field::NvlinkBandwidthTotal.dcgm_name(),
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
        );
        assert_eq!(Field::FbUsed.dcgm_name(), "DCGM_FI_DEV_FB_USED");
    }

    #[test]
    fn known_dcgm_field_we_do_not_collect_is_recognised() {
        let f = lookup("DCGM_FI_DEV_VGPU_MEMORY_USAGE").unwrap();
        assert_eq!(f.id, 525);
        assert_eq!(f.field, None);
        let f = lookup("DCGM_FI_DEV_VGPU_LICENSE_STATUS").unwrap();
        assert_eq!((f.id, f.field), (526, Some(Field::VgpuLicenseStatus)));
        assert!(lookup("DCGM_FI_DEV_GPU_TMEP").is_none());
    }

    #[test]
    fn newer_names_have_their_own_ids_and_units() {
        // DCGM 4.7 moved DCGM_FI_DEV_GPU_UTIL_RATIO from 203 (a percentage) to a 0-1 field.
        assert_eq!(
            lookup("DCGM_FI_DEV_GPU_UTIL_RATIO").unwrap().field,
            Some(Field::GpuUtilRatio)
        );
        assert_eq!(
            lookup("DCGM_FI_DEV_GPU_UTIL").unwrap().field,
            Some(Field::GpuUtil)
        );
        for (name, field, ty, unit) in [
            (
                "DCGM_FI_DEV_SM_CLOCK_HERTZ",
                Field::SmClockHertz,
                "INT64",
                "Hz",
            ),
            (
                "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ",
                Field::MemoryClockHertz,
                "INT64",
                "Hz",
            ),
            (
                "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
                Field::GpuEnergyJoulesTotal,
                "INT64",
                "J",
            ),
            (
                "DCGM_FI_DEV_MEMORY_UTIL_RATIO",
                Field::MemoryUtilRatio,
                "DOUBLE",
                "ratio",
            ),
            (
                "DCGM_FI_DEV_FB_CAPACITY_BYTES",
                Field::FbCapacityBytes,
                "INT64",
                "B",
            ),
            (
                "DCGM_FI_DEV_FB_USED_BYTES",
                Field::FbUsedBytes,
                "INT64",
                "B",
            ),
            (
                "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
                Field::NvlinkThroughputBytesPerSecond,
                "INT64",
                "B/s",
            ),
        ] {
            assert_eq!(lookup(name).unwrap().field, Some(field), "{name}");
            assert_eq!(field.dcgm_name(), name);
            assert_eq!(
                dictionary().newer_units.get(&field.id()),
                Some(&(ty, unit)),
                "{name}"
            );
        }
        // DCGM 4.8 names for the same profiling fields, and the 1.x names.
        assert_eq!(
            lookup("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND")
                .unwrap()
                .field,
            Some(Field::ProfPcieTxBytes)
        );
        assert_eq!(
            Field::ProfPcieTxBytes.dcgm_name(),
            "DCGM_FI_PROF_PCIE_TX_BYTES"
        );
        assert_eq!(lookup("dcgm_sm_clock").unwrap().field, Some(Field::SmClock));
        assert_eq!(
            lookup("dcgm_fi_prof_pcie_tx_bytes").unwrap().field,
            Some(Field::ProfPcieTxBytes)
        );
        // Known, not collected.
        assert_eq!(lookup("DCGM_FI_DEV_BAR1_USED_BYTES").unwrap().field, None);
        assert!(Field::NvlinkReplayErrorPerLinkTotal.is_link());
        assert!(!Field::NvlinkReplayErrorCountTotal.is_link());
        assert!(Field::DriverVersion.is_system() && !Field::DevName.is_system());
    }

    #[test]
    fn profiling_range_is_detected() {
        assert!(Field::ProfSmActive.is_profiling());
        assert!(!Field::GpuUtil.is_profiling());
        assert!(Field::ExpGpuHealthStatus.is_exporter());
    }
}
