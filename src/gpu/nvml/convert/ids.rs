//! The `NVML_FI_*` field ids used here and their renumbering across NVML versions (ids
//! 251–273).

/// `NVML_FI_*` ids used here, V12 numbering (nvml-wrapper-sys 0.10 / CUDA ≤ 13.0).
pub mod fi {
    /// `NVML_FI_DEV_ECC_CURRENT`.
    pub const ECC_CURRENT: u32 = 1;
    /// `NVML_FI_DEV_ECC_DBE_AGG_CBU`: the last ECC counter id (29–31 are retired pages).
    pub const ECC_LAST: u32 = 28;
    /// `NVML_FI_DEV_ECC_SBE_VOL_TOTAL`.
    pub const ECC_SBE_VOL_TOTAL: u32 = 3;
    /// `NVML_FI_DEV_ECC_DBE_VOL_TOTAL`.
    pub const ECC_DBE_VOL_TOTAL: u32 = 4;
    /// `NVML_FI_DEV_ECC_SBE_AGG_TOTAL`.
    pub const ECC_SBE_AGG_TOTAL: u32 = 5;
    /// `NVML_FI_DEV_ECC_DBE_AGG_TOTAL`.
    pub const ECC_DBE_AGG_TOTAL: u32 = 6;
    /// `NVML_FI_DEV_RETIRED_SBE`.
    pub const RETIRED_SBE: u32 = 29;
    /// `NVML_FI_DEV_RETIRED_DBE`.
    pub const RETIRED_DBE: u32 = 30;
    /// `NVML_FI_DEV_RETIRED_PENDING`.
    pub const RETIRED_PENDING: u32 = 31;
    /// `NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL`.
    pub const NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: u32 = 38;
    /// `NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL`.
    pub const NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: u32 = 45;
    /// `NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL`.
    pub const NVLINK_REPLAY_ERROR_COUNT_TOTAL: u32 = 52;
    /// `NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL`.
    pub const NVLINK_RECOVERY_ERROR_COUNT_TOTAL: u32 = 59;
    /// `NVML_FI_DEV_PERF_POLICY_POWER` (ns).
    pub const PERF_POLICY_POWER: u32 = 74;
    /// `NVML_FI_DEV_PERF_POLICY_THERMAL` (ns).
    pub const PERF_POLICY_THERMAL: u32 = 75;
    /// `NVML_FI_DEV_PERF_POLICY_SYNC_BOOST` (ns).
    pub const PERF_POLICY_SYNC_BOOST: u32 = 76;
    /// `NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT` (ns).
    pub const PERF_POLICY_BOARD_LIMIT: u32 = 77;
    /// `NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION` (ns).
    pub const PERF_POLICY_LOW_UTILIZATION: u32 = 78;
    /// `NVML_FI_DEV_PERF_POLICY_RELIABILITY` (ns).
    pub const PERF_POLICY_RELIABILITY: u32 = 79;
    /// `NVML_FI_DEV_MEMORY_TEMP` (°C).
    pub const MEMORY_TEMP: u32 = 82;
    /// `NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (mJ).
    pub const TOTAL_ENERGY_CONSUMPTION: u32 = 83;
    /// `NVML_FI_DEV_PCIE_REPLAY_COUNTER`.
    pub const PCIE_REPLAY_COUNTER: u32 = 94;
    /// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` (KiB, cumulative; scope = link or all).
    pub const NVLINK_THROUGHPUT_DATA_TX: u32 = 138;
    /// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX` (KiB, cumulative).
    pub const NVLINK_THROUGHPUT_DATA_RX: u32 = 139;
    /// `NVML_FI_DEV_REMAPPED_COR`.
    pub const REMAPPED_COR: u32 = 142;
    /// `NVML_FI_DEV_REMAPPED_UNC`.
    pub const REMAPPED_UNC: u32 = 143;
    /// `NVML_FI_DEV_REMAPPED_PENDING`.
    pub const REMAPPED_PENDING: u32 = 144;
    /// `NVML_FI_DEV_REMAPPED_FAILURE`.
    pub const REMAPPED_FAILURE: u32 = 145;
    /// `NVML_FI_DEV_POWER_INSTANT` (mW).
    pub const POWER_INSTANT: u32 = 186;
    /// `NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN` (first id NVIDIA renumbered).
    pub const CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: u32 = 251;
}

/// `scopeId` meaning "summed over all links" for NVLink fields.
pub const ALL_LINKS: u32 = u32::MAX;

/// The `NVML_FI_*` numbering of ids 251–273 a driver uses. NVIDIA moved these ids twice; the
/// layouts below are those of the `nvml.h` shipped with each CUDA release (checked against
/// the headers of CUDA 12.6, 12.8, 12.9, 13.0, 13.0 Update 1 and later):
///
/// | driver | CUDA | 251–255 | 256–268 | 269–273 |
/// |---|---|---|---|---|
/// | < 570 | ≤ 12.6 | — | — | — |
/// | 570.x | 12.8 | power smoothing | power smoothing | — |
/// | 575.x – 580.81 | 12.9, 13.0 | clock events, power sync | power smoothing | power smoothing |
/// | ≥ 580.82 | 13.0 U1+ | power smoothing | power smoothing | clock events, power sync |
///
/// ("—": the id does not exist; `NVML_FI_MAX` was 230 in CUDA 12.6 and 269 in 12.8.)
/// [`fi`] and every id this crate requests use the 12.9 / 13.0 numbering ([`Self::V12`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldIdScheme {
    /// Drivers before R570: no field ids from 251 on.
    Before570,
    /// R570 (CUDA 12.8): the power-smoothing block at 251–268 (where CUDA 13.0 Update 1 put it
    /// again); the clock-event and power-sync fields do not exist yet.
    R570,
    /// R575 up to 580.81 (CUDA 12.9 and 13.0): clock events and power sync at 251–255, power
    /// smoothing at 256–273. The numbering of [`fi`].
    V12,
    /// Drivers 580.82 and later (CUDA 13.0 Update 1 on): power smoothing at 251–268, clock
    /// events and power sync at 269–273.
    V13Update1,
}

impl FieldIdScheme {
    /// The scheme of a driver version string such as `580.82.07`. An unparseable version is
    /// taken as the [`Self::V12`] numbering (ids below 251 are the same in all of them).
    pub fn for_driver(version: &str) -> Self {
        let mut parts = version.trim().split('.');
        let Some(major) = parts.next().and_then(|s| s.parse::<u32>().ok()) else {
            return Self::V12;
        };
        let minor: u32 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        match (major, minor) {
            (..570, _) => Self::Before570,
            (570..575, _) => Self::R570,
            (m, n) if (m, n) < (580, 82) => Self::V12,
            _ => Self::V13Update1,
        }
    }
}

/// A [`FieldIdScheme::V12`] field id in `scheme`'s numbering, or `None` where that driver has
/// no such field (it must not be requested: the id may mean another field there).
pub fn translate_field_id(scheme: FieldIdScheme, v12: u32) -> Option<u32> {
    match (scheme, v12) {
        (_, id @ ..=250) | (FieldIdScheme::V12, id) => Some(id),
        (FieldIdScheme::Before570, 251..=273) | (FieldIdScheme::R570, 251..=255) => None,
        (FieldIdScheme::R570 | FieldIdScheme::V13Update1, id @ 256..=273) => Some(id - 5),
        (FieldIdScheme::V13Update1, id @ 251..=255) => Some(id + 18),
        // Ids after 273 were added later, without moving.
        (_, id) => Some(id),
    }
}

/// The inverse of [`translate_field_id`]: a driver's id in V12 numbering.
pub fn field_id_to_v12(scheme: FieldIdScheme, id: u32) -> Option<u32> {
    match (scheme, id) {
        (_, id @ ..=250) | (FieldIdScheme::V12, id) => Some(id),
        (FieldIdScheme::Before570, 251..=273) | (FieldIdScheme::R570, 269..=273) => None,
        (FieldIdScheme::R570 | FieldIdScheme::V13Update1, id @ 251..=268) => Some(id + 5),
        (FieldIdScheme::V13Update1, id @ 269..=273) => Some(id - 18),
        (_, id) => Some(id),
    }
}
