//! The GPU models the simulator knows and the fleet profiles built from them (`--sim-profile`),
//! MIG layouts included.

/// A GPU model the simulator knows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Model {
    pub(super) name: &'static str,
    pub(super) fb_total_mib: i64,
    pub(super) fb_reserved_mib: i64,
    pub(super) tdp_w: f64,
    pub(super) idle_w: f64,
    pub(super) max_sm_mhz: i64,
    pub(super) idle_sm_mhz: i64,
    pub(super) mem_mhz: i64,
    pub(super) nvlinks: u32,
    pub(super) pcie_gen: i64,
    /// Whether NVML GPM works on it (Hopper and newer): the only NVML source of the
    /// `DCGM_FI_PROF_*` fields.
    pub(super) gpm: bool,
}

const A100_40GB: Model = Model {
    name: "NVIDIA A100-SXM4-40GB",
    fb_total_mib: 40960,
    fb_reserved_mib: 431,
    tdp_w: 400.0,
    idle_w: 52.0,
    max_sm_mhz: 1410,
    idle_sm_mhz: 210,
    mem_mhz: 1215,
    nvlinks: 0,
    pcie_gen: 4,
    gpm: false,
};

const A100_80GB: Model = Model {
    name: "NVIDIA A100-SXM4-80GB",
    fb_total_mib: 81920,
    fb_reserved_mib: 600,
    tdp_w: 400.0,
    idle_w: 62.0,
    max_sm_mhz: 1410,
    idle_sm_mhz: 210,
    mem_mhz: 1593,
    nvlinks: 12,
    pcie_gen: 4,
    gpm: false,
};

const H100_SXM: Model = Model {
    name: "NVIDIA H100 80GB HBM3",
    fb_total_mib: 81559,
    fb_reserved_mib: 528,
    tdp_w: 700.0,
    idle_w: 72.0,
    max_sm_mhz: 1980,
    idle_sm_mhz: 345,
    mem_mhz: 2619,
    nvlinks: 18,
    pcie_gen: 5,
    gpm: true,
};

/// A fleet profile: a model, a GPU count and, per GPU, its MIG layout.
#[derive(Debug, Clone, Copy)]
pub(super) struct Profile {
    pub(super) name: &'static str,
    pub(super) model: Model,
    pub(super) gpus: u32,
    /// Per GPU: (profile name, GPU instance id, first memory slice), as on a real A100 80GB.
    pub(super) mig: &'static [&'static [(&'static str, u32, u32)]],
}

/// The profiles `--sim-profile` accepts.
///
/// The last two are scale profiles for benchmarks: more GPUs, or more MIG instances, than most
/// nodes have, to show how the cost grows with the number of series.
pub const PROFILES: &[&str] = &[
    "1xA100-40GB",
    "8xH100-SXM",
    "4xA100-80GB-MIG",
    "64xH100-SXM",
    "8xA100-80GB-7xMIG",
];

/// Seven 1g.10gb instances, the most an A100 80GB can hold (GPU instance ids 7-13, on memory
/// slices 0-6).
const SEVEN_1G_10GB: &[(&str, u32, u32)] = &[
    ("1g.10gb", 7, 0),
    ("1g.10gb", 8, 1),
    ("1g.10gb", 9, 2),
    ("1g.10gb", 10, 3),
    ("1g.10gb", 11, 4),
    ("1g.10gb", 12, 5),
    ("1g.10gb", 13, 6),
];

pub(super) fn profile(name: &str) -> Option<Profile> {
    Some(match name {
        "1xA100-40GB" => Profile {
            name: "1xA100-40GB",
            model: A100_40GB,
            gpus: 1,
            mig: &[],
        },
        "8xH100-SXM" => Profile {
            name: "8xH100-SXM",
            model: H100_SXM,
            gpus: 8,
            mig: &[],
        },
        "4xA100-80GB-MIG" => Profile {
            name: "4xA100-80GB-MIG",
            model: A100_80GB,
            gpus: 4,
            // (profile, GPU instance id, first memory slice); GPU 3 has MIG disabled.
            mig: &[
                &[
                    ("3g.40gb", 2, 4),
                    ("2g.20gb", 3, 0),
                    ("1g.10gb", 9, 2),
                    ("1g.10gb", 10, 3),
                ],
                &[("7g.80gb", 0, 0)],
                &[("4g.40gb", 1, 0), ("3g.40gb", 2, 4)],
                &[],
            ],
        },
        "64xH100-SXM" => Profile {
            name: "64xH100-SXM",
            model: H100_SXM,
            gpus: 64,
            mig: &[],
        },
        "8xA100-80GB-7xMIG" => Profile {
            name: "8xA100-80GB-7xMIG",
            model: A100_80GB,
            gpus: 8,
            mig: &[SEVEN_1G_10GB; 8],
        },
        _ => return None,
    })
}

/// GPU instance profile id and size in memory slices of an A100 80GB profile, as NVML reports
/// them (`nvidia-smi mig -lgip`).
pub(super) fn mig_profile_id_and_size(profile: &str) -> (u32, u32) {
    match profile {
        "1g.10gb" => (19, 1),
        "1g.10gb+me" => (20, 1),
        "1g.20gb" => (15, 2),
        "2g.20gb" => (14, 2),
        "3g.40gb" => (9, 4),
        "4g.40gb" => (5, 4),
        _ => (0, 8),
    }
}

/// MIG profile memory in MiB, as NVML reports it for an A100 80GB.
pub(super) fn mig_memory_mib(profile: &str) -> i64 {
    match profile {
        "1g.10gb" => 9728,
        "1g.20gb" | "2g.20gb" => 19968,
        "3g.40gb" | "4g.40gb" => 40192,
        _ => 80896,
    }
}
