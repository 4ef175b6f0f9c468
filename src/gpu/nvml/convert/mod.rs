//! Pure translation between NVML and DCGM: which NVML call serves each [`Field`](crate::catalog::Field), the unit
//! conversions DCGM applies, the way DCGM reads the field values some drivers get wrong, and
//! the `NVML_FI_*` renumberings of ids 251–273.
//!
//! Nothing here calls NVML; every function is a plain function of its arguments.
//!
//! Layout: `ids` (field ids and their renumbering), `plan` (which call serves which field),
//! `values` (answers into DCGM's units).

mod ids;
mod plan;
#[cfg(test)]
mod tests;
mod values;

pub use ids::{fi, field_id_to_v12, translate_field_id, FieldIdScheme, ALL_LINKS};
pub use plan::{plan, MemoryPart, Plan, StaticFact, Unit};
pub use values::{
    as_counter, brand_name, bytes_to_mib, dcgm_profile_name, field_error, field_value, gpm_value,
    in_field_unit, kib_per_s_to_mbps, memory_value, milliwatts_to_watts, next_backoff,
    nvlink_bandwidth_mbps, nvlink_rate_kib_per_s, profile_from_device_name, vgpu_license_status,
    NvlinkCounter, GRID_LICENSE_FEATURE_CODE_VGPU, MAX_MEMORY_TEMP_C,
};
