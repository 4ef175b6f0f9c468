//! DRA (Dynamic Resource Allocation, GA in Kubernetes 1.34): which GPU or MIG instance a device
//! of NVIDIA's GPU DRA driver is, decided on the node from the device's name alone.
//!
//! The kubelet's `List` reply names, per container, the ResourceClaims it uses
//! (`dynamic_resources`) and the devices allocated to each: driver, pool and device name, plus
//! CDI device ids. None of these is a UUID. dcgm-exporter resolves them through a cluster-wide
//! ResourceSlice informer (API server access and RBAC). This module needs neither, because
//! NVIDIA's driver (`gpu.nvidia.com`, `k8s-dra-driver-gpu`) derives its device names from
//! hardware facts NVML reports:
//!
//! | device name | driver versions | entity |
//! |---|---|---|
//! | `gpu-<minor>` | all | the GPU `/dev/nvidia<minor>` (minor number, not NVML index) |
//! | `gpu-<minor>-mig-<profile>-<profile id>-<start>` | 25.12 and later | the MIG instance of that GPU with that GPU instance profile id and placement start |
//! | `gpu-<minor>-mig-<profile id>-<start>-<size>` | 25.3 – 25.8 | the same, with the placement size |
//!
//! `<profile>` is the MIG profile name without dots, lower-cased, other characters turned into
//! `-` (`1g.10gb` → `1g10gb`, `1g.10gb+me` → `1g10gb-me`). When NVML does not give a GPU
//! instance's placement (the GPU instance calls need privileges), the 25.12 form falls back to
//! the profile name if exactly one instance of the GPU has that profile.
//!
//! What cannot be resolved is counted by reason and skipped: names of another form (e.g.
//! `gpu-vfio-<n>` passthrough devices, which NVML does not see), and names that match no
//! local GPU or instance (a dynamically created MIG device not yet rediscovered, a stale
//! inventory). The CDI ids (`k8s.gpu.nvidia.com/claim=<claim uid>-<device name>`) carry no
//! more than the device name, and the CDI spec files the driver writes under `/var/run/cdi`
//! name device nodes, not UUIDs, so neither is read.

use crate::gpu::{Device, MigInstance};
use crate::pods::EntityKey;

/// The driver name of NVIDIA's GPU DRA driver. Devices of other drivers are ignored.
pub const NVIDIA_GPU_DRIVER: &str = "gpu.nvidia.com";

/// A parsed device name of NVIDIA's GPU DRA driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceName {
    /// `gpu-<minor>`: a whole GPU.
    Gpu {
        /// Minor number (`/dev/nvidia<minor>`).
        minor: u32,
    },
    /// `gpu-<minor>-mig-<profile>-<profile id>-<start>` (driver 25.12 and later).
    Mig {
        /// The parent GPU's minor number.
        parent_minor: u32,
        /// The profile token (`1g10gb`).
        profile: String,
        /// GPU instance profile id.
        profile_id: u32,
        /// Placement start.
        start: u32,
    },
    /// `gpu-<minor>-mig-<profile id>-<start>-<size>` (driver 25.3 – 25.8).
    LegacyMig {
        /// The parent GPU's minor number.
        parent_minor: u32,
        /// GPU instance profile id.
        profile_id: u32,
        /// Placement start.
        start: u32,
        /// Placement size.
        size: u32,
    },
}

/// Why a device of NVIDIA's driver could not be resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unresolved {
    /// The name is not of a form above (e.g. `gpu-vfio-0`).
    UnrecognisedName,
    /// The name parses but no local GPU or MIG instance matches it.
    NoMatch,
}

impl Unresolved {
    /// Every `reason` label value, for pre-initialised series.
    pub const REASONS: &'static [&'static str] = &["no_match", "unrecognised_name"];

    /// The `reason` label value.
    pub fn reason(self) -> &'static str {
        match self {
            Unresolved::UnrecognisedName => "unrecognised_name",
            Unresolved::NoMatch => "no_match",
        }
    }
}

/// Parses a device name of NVIDIA's GPU DRA driver.
pub fn parse(name: &str) -> Option<DeviceName> {
    let rest = name.strip_prefix("gpu-")?;
    let (minor, mig) = match rest.split_once("-mig-") {
        Some((m, tail)) => (number(m)?, Some(tail)),
        None => (number(rest)?, None),
    };
    let Some(tail) = mig else {
        return Some(DeviceName::Gpu { minor });
    };
    // Both MIG forms end in two numbers after a first part: a number in the legacy form, a
    // profile token (which always contains a letter, and may contain `-`) in the current one.
    let mut parts = tail.rsplitn(3, '-');
    let last = number(parts.next()?)?;
    let middle = number(parts.next()?)?;
    let first = parts.next()?;
    if let Some(profile_id) = number(first) {
        return Some(DeviceName::LegacyMig {
            parent_minor: minor,
            profile_id,
            start: middle,
            size: last,
        });
    }
    let token_ok = first.bytes().any(|b| b.is_ascii_alphabetic())
        && first
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !first.starts_with('-')
        && !first.ends_with('-');
    token_ok.then(|| DeviceName::Mig {
        parent_minor: minor,
        profile: first.to_owned(),
        profile_id: middle,
        start: last,
    })
}

/// Resolves a device name of NVIDIA's GPU DRA driver to a GPU or MIG instance of `devices`.
///
/// # Errors
/// [`Unresolved`] saying why not.
pub fn resolve(name: &str, devices: &[Device]) -> Result<EntityKey, Unresolved> {
    let parsed = parse(name).ok_or(Unresolved::UnrecognisedName)?;
    let minor = match &parsed {
        DeviceName::Gpu { minor } => *minor,
        DeviceName::Mig { parent_minor, .. } | DeviceName::LegacyMig { parent_minor, .. } => {
            *parent_minor
        }
    };
    let device = devices
        .iter()
        .find(|d| d.identity.minor == minor)
        .ok_or(Unresolved::NoMatch)?;
    let gpu = device.identity.index;
    let instance = match parsed {
        DeviceName::Gpu { .. } => return Ok(EntityKey { gpu, gi_id: None }),
        DeviceName::Mig {
            profile,
            profile_id,
            start,
            ..
        } => {
            by_placement(device, |p| p.profile_id == profile_id && p.start == start).or_else(|| {
                // No placement from NVML: the profile name, if it is unambiguous.
                let mut same = device
                    .instances
                    .iter()
                    .filter(|i| i.placement.is_none() && profile_token(&i.profile) == profile);
                match (same.next(), same.next()) {
                    (Some(one), None) => Some(one),
                    _ => None,
                }
            })
        }
        DeviceName::LegacyMig {
            profile_id,
            start,
            size,
            ..
        } => by_placement(device, |p| {
            p.profile_id == profile_id && p.start == start && p.size == size
        }),
    };
    instance
        .map(|i| EntityKey {
            gpu,
            gi_id: Some(i.gi_id),
        })
        .ok_or(Unresolved::NoMatch)
}

fn by_placement(
    device: &Device,
    matches: impl Fn(&crate::gpu::MigPlacement) -> bool,
) -> Option<&MigInstance> {
    device
        .instances
        .iter()
        .find(|i| i.placement.as_ref().is_some_and(&matches))
}

/// The name NVIDIA's DRA driver gives a whole GPU with minor number `minor`.
pub fn gpu_device_name(minor: u32) -> String {
    format!("gpu-{minor}")
}

/// The name NVIDIA's DRA driver (25.12 and later) gives MIG instance `inst` of the GPU with
/// minor number `parent_minor`; `None` without the instance's placement.
pub fn mig_device_name(parent_minor: u32, inst: &MigInstance) -> Option<String> {
    let p = inst.placement?;
    Some(format!(
        "gpu-{parent_minor}-mig-{}-{}-{}",
        profile_token(&inst.profile),
        p.profile_id,
        p.start
    ))
}

/// A MIG profile name as the driver puts it into device names: dots removed, lower case,
/// anything but `[a-z0-9-]` turned into `-`, no leading or trailing `-`.
pub fn profile_token(profile: &str) -> String {
    let mapped: String = profile
        .chars()
        .filter(|&c| c != '.')
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    mapped.trim_matches('-').to_owned()
}

fn number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{GpuIdentity, MigPlacement};

    fn inst(gi_id: u32, profile: &str, placement: Option<(u32, u32, u32)>) -> MigInstance {
        MigInstance {
            gi_id,
            ci_id: 0,
            profile: profile.to_owned(),
            uuid: format!("MIG-{gi_id}"),
            placement: placement.map(|(profile_id, start, size)| MigPlacement {
                profile_id,
                start,
                size,
            }),
        }
    }

    fn device(index: u32, minor: u32, instances: Vec<MigInstance>) -> Device {
        Device {
            identity: GpuIdentity {
                index,
                uuid: format!("GPU-{index}"),
                pci_bus_id: String::new(),
                minor,
                model: "NVIDIA A100-SXM4-80GB".into(),
            },
            mig_enabled: !instances.is_empty(),
            instances,
        }
    }

    /// GPU 0 is /dev/nvidia2 (index ≠ minor) with no MIG; GPU 1 is /dev/nvidia0 with a
    /// 3g.40gb (GI 2, slices 4-7), a 2g.20gb (GI 3, 0-1) and two 1g.10gb (GI 9 and 10, slices 2
    /// and 3); GPU 2 is /dev/nvidia1, MIG without placement info (unprivileged NVML).
    fn inventory() -> Vec<Device> {
        vec![
            device(0, 2, vec![]),
            device(
                1,
                0,
                vec![
                    inst(2, "3g.40gb", Some((9, 4, 4))),
                    inst(3, "2g.20gb", Some((14, 0, 2))),
                    inst(9, "1g.10gb", Some((19, 2, 1))),
                    inst(10, "1g.10gb", Some((19, 3, 1))),
                ],
            ),
            device(
                2,
                1,
                vec![
                    inst(1, "4g.40gb", None),
                    inst(5, "1g.10gb+me", None),
                    inst(13, "1g.10gb", None),
                    inst(14, "1g.10gb", None),
                ],
            ),
        ]
    }

    fn key(gpu: u32, gi: Option<u32>) -> Result<EntityKey, Unresolved> {
        Ok(EntityKey { gpu, gi_id: gi })
    }

    #[test]
    fn names_parse_in_every_driver_version() {
        assert_eq!(parse("gpu-0"), Some(DeviceName::Gpu { minor: 0 }));
        assert_eq!(parse("gpu-17"), Some(DeviceName::Gpu { minor: 17 }));
        assert_eq!(
            parse("gpu-1-mig-2g47gb-14-0"),
            Some(DeviceName::Mig {
                parent_minor: 1,
                profile: "2g47gb".into(),
                profile_id: 14,
                start: 0
            })
        );
        assert_eq!(
            parse("gpu-3-mig-1g10gb-me-20-6"),
            Some(DeviceName::Mig {
                parent_minor: 3,
                profile: "1g10gb-me".into(),
                profile_id: 20,
                start: 6
            })
        );
        assert_eq!(
            parse("gpu-1-mig-19-4-1"),
            Some(DeviceName::LegacyMig {
                parent_minor: 1,
                profile_id: 19,
                start: 4,
                size: 1
            })
        );
        for bad in [
            "",
            "gpu",
            "gpu-",
            "gpu-x",
            "gpu--1",
            "gpu-vfio-0",
            "gpu-0-mig-",
            "gpu-0-mig-1g10gb",
            "gpu-0-mig-1g10gb-19",
            "gpu-0-mig-19-4",
            "gpu-0-mig-19-4-1-2",
            "gpu-0-mig--19-4",
            "gpu-0-mig-1g10gb-x-4",
            "gpu-x-mig-1g10gb-19-4",
            "nvidia0",
            "GPU-0",
            "channel-0",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn whole_gpus_resolve_by_minor_number_not_index() {
        let inv = inventory();
        assert_eq!(resolve("gpu-2", &inv), key(0, None));
        assert_eq!(resolve("gpu-0", &inv), key(1, None));
        assert_eq!(resolve("gpu-7", &inv), Err(Unresolved::NoMatch));
    }

    #[test]
    fn mig_instances_resolve_by_profile_id_and_placement() {
        let inv = inventory();
        // 25.12+ names.
        assert_eq!(resolve("gpu-0-mig-3g40gb-9-4", &inv), key(1, Some(2)));
        assert_eq!(resolve("gpu-0-mig-1g10gb-19-2", &inv), key(1, Some(9)));
        assert_eq!(resolve("gpu-0-mig-1g10gb-19-3", &inv), key(1, Some(10)));
        // Legacy names carry the size too.
        assert_eq!(resolve("gpu-0-mig-14-0-2", &inv), key(1, Some(3)));
        assert_eq!(resolve("gpu-0-mig-19-3-1", &inv), key(1, Some(10)));
        assert_eq!(resolve("gpu-0-mig-19-3-2", &inv), Err(Unresolved::NoMatch));
        // A placement no instance has (a dynamic MIG device not created yet), or another GPU.
        assert_eq!(
            resolve("gpu-0-mig-1g10gb-19-5", &inv),
            Err(Unresolved::NoMatch)
        );
        assert_eq!(
            resolve("gpu-9-mig-1g10gb-19-2", &inv),
            Err(Unresolved::NoMatch)
        );
        // Placement known: the profile token is not used to guess.
        assert_eq!(
            resolve("gpu-0-mig-3g40gb-9-0", &inv),
            Err(Unresolved::NoMatch)
        );
    }

    #[test]
    fn without_placements_an_unambiguous_profile_name_still_resolves() {
        let inv = inventory();
        assert_eq!(resolve("gpu-1-mig-4g40gb-5-0", &inv), key(2, Some(1)));
        assert_eq!(resolve("gpu-1-mig-1g10gb-me-20-4", &inv), key(2, Some(5)));
        // Two 1g.10gb instances: which one is unknowable.
        assert_eq!(
            resolve("gpu-1-mig-1g10gb-19-2", &inv),
            Err(Unresolved::NoMatch)
        );
        // Legacy names have no profile name to fall back on.
        assert_eq!(resolve("gpu-1-mig-5-0-4", &inv), Err(Unresolved::NoMatch));
    }

    #[test]
    fn other_forms_are_unrecognised() {
        let inv = inventory();
        for name in ["gpu-vfio-0", "nvidia0", "", "gpu-0-mig-x"] {
            assert_eq!(
                resolve(name, &inv),
                Err(Unresolved::UnrecognisedName),
                "{name}"
            );
        }
    }

    #[test]
    fn generated_names_resolve_back_to_their_entities() {
        let inv = inventory();
        for d in &inv {
            assert_eq!(
                resolve(&gpu_device_name(d.identity.minor), &inv),
                key(d.identity.index, None)
            );
            for i in &d.instances {
                if let Some(name) = mig_device_name(d.identity.minor, i) {
                    assert_eq!(
                        resolve(&name, &inv),
                        key(d.identity.index, Some(i.gi_id)),
                        "{name}"
                    );
                }
            }
        }
        assert_eq!(
            mig_device_name(0, &inv[1].instances[0]).as_deref(),
            Some("gpu-0-mig-3g40gb-9-4")
        );
        assert_eq!(mig_device_name(1, &inv[2].instances[0]), None);
    }

    #[test]
    fn profile_tokens_follow_the_driver() {
        assert_eq!(profile_token("1g.10gb"), "1g10gb");
        assert_eq!(profile_token("1g.10gb+me"), "1g10gb-me");
        assert_eq!(profile_token("1g.24gb+gfx"), "1g24gb-gfx");
        assert_eq!(profile_token("7G.80GB"), "7g80gb");
        assert_eq!(profile_token("+1g.5gb+"), "1g5gb");
    }
}
