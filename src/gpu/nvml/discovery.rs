//! Discovery: enumerating GPUs, reading each new GPU's identity and static facts once, and
//! re-enumerating MIG devices on every discovery.

use std::collections::HashMap;
use std::sync::Arc;

use crate::gpu::{Device, GpuIdentity, MigInstance, SourceError, Value};

use super::api::{self, ApiError, NvmlApi};
use super::call::text;
use super::convert::{self, StaticFact};
use super::error::NvmlError;
use super::events;
use super::nvlink::Links;
use super::processes::ProcessTracker;
use super::state::{GpuState, Ready};
use super::NvmlSource;

impl<A: NvmlApi> NvmlSource<A> {
    pub(super) fn discover(&self, ready: &mut Ready<A>) -> Result<Vec<Device>, SourceError> {
        let api = Arc::clone(&ready.api);
        let count = api.device_count().map_err(|cause| SourceError::Discovery {
            cause: Box::new(NvmlError::Call {
                call: "nvmlDeviceGetCount_v2",
                cause,
            }),
        })?;
        let mut found: HashMap<String, GpuState<A>> = HashMap::new();
        let mut devices = Vec::new();
        let mut old = std::mem::take(&mut ready.gpus);
        for index in 0..count {
            let handle_uuid = api
                .device_by_index(index)
                .and_then(|h| api.uuid(&h).map(|u| (h, u)));
            let (handle, uuid) = match handle_uuid {
                Ok(x) => x,
                Err(ApiError::GpuLost) => {
                    // Keep a GPU we knew at this index: its reads fail as lost, so its health
                    // series say FAIL instead of vanishing.
                    let known = old
                        .iter()
                        .find(|(_, g)| g.identity.index == index)
                        .map(|(u, _)| u.clone());
                    match known.and_then(|u| old.remove_entry(&u)) {
                        Some((uuid, g)) => {
                            tracing::warn!(gpu = index, %uuid, "GPU has fallen off the bus");
                            devices.push(Device {
                                identity: g.identity.clone(),
                                mig_enabled: !g.mig.is_empty(),
                                instances: Vec::new(),
                            });
                            found.insert(uuid, g);
                        }
                        None => {
                            tracing::warn!(gpu = index, "GPU has fallen off the bus before it was ever read; it is not exported");
                        }
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(gpu = index, error = %e, "cannot open GPU; skipping it");
                    continue;
                }
            };
            let mut g = match old.remove(&uuid) {
                Some(mut g) => {
                    g.handle = handle;
                    g.identity.index = index;
                    g
                }
                None => self.read_static(&api, handle, index, uuid.clone()),
            };
            let (mig_enabled, instances) = Self::read_mig(&api, &mut g);
            devices.push(Device {
                identity: g.identity.clone(),
                mig_enabled,
                instances,
            });
            found.insert(uuid, g);
        }
        for uuid in old.keys() {
            tracing::warn!(%uuid, "GPU is gone from NVML's device list");
        }
        ready.gpus = found;
        devices.sort_by_key(|d| d.identity.index);

        let mut gpus: Vec<(String, A::Device)> = ready
            .gpus
            .iter()
            .map(|(uuid, g)| (uuid.clone(), g.handle.clone()))
            .collect();
        gpus.sort_by(|a, b| a.0.cmp(&b.0));
        events::ensure(&ready.api, gpus, &mut ready.events, &self.xids);
        Ok(devices)
    }

    fn read_static(&self, api: &A, handle: A::Device, index: u32, uuid: String) -> GpuState<A> {
        let name = api.name(&handle);
        let identity = GpuIdentity {
            index,
            uuid: uuid.clone(),
            pci_bus_id: api.pci_bus_id(&handle).unwrap_or_else(|e| {
                tracing::warn!(gpu = index, error = %e, "nvmlDeviceGetPciInfo failed");
                String::new()
            }),
            minor: api.minor_number(&handle).unwrap_or_else(|e| {
                tracing::warn!(gpu = index, error = %e, "nvmlDeviceGetMinorNumber failed; using the index");
                index
            }),
            model: name.clone().unwrap_or_default(),
        };
        let statics = vec![
            (StaticFact::Name, text(name)),
            (
                StaticFact::Brand,
                api.brand(&handle)
                    .map(|b| Value::Text(convert::brand_name(b).to_owned()))
                    .map_err(|e| convert::field_error(&e)),
            ),
            (StaticFact::Serial, text(api.serial(&handle))),
            (StaticFact::Vbios, text(api.vbios_version(&handle))),
            (
                StaticFact::InforomImage,
                text(api.inforom_image_version(&handle)),
            ),
            (
                StaticFact::Inforom(api::InforomObject::Oem),
                text(api.inforom_version(&handle, api::InforomObject::Oem)),
            ),
            (
                StaticFact::Inforom(api::InforomObject::Ecc),
                text(api.inforom_version(&handle, api::InforomObject::Ecc)),
            ),
            (
                StaticFact::Inforom(api::InforomObject::Power),
                text(api.inforom_version(&handle, api::InforomObject::Power)),
            ),
        ];
        let gpm = api.gpm_supported(&handle).unwrap_or(false);
        tracing::info!(gpu = index, %uuid, model = %identity.model, gpm, "GPU found");
        GpuState {
            handle,
            identity,
            statics,
            gpm,
            mig: Vec::new(),
            prev_gpm: None,
            prev_mig_gpm: HashMap::new(),
            prev_nvlink: None,
            procs: ProcessTracker::default(),
            links: Links::default(),
            mig_stale: false,
        }
    }

    /// Re-enumerates MIG devices (handles can change on reconfiguration), skipping empty slots.
    fn read_mig(api: &A, g: &mut GpuState<A>) -> (bool, Vec<MigInstance>) {
        let index = g.identity.index;
        let enabled = api.mig_enabled(&g.handle).unwrap_or(false);
        let mut handles = Vec::new();
        let mut instances = Vec::new();
        if enabled {
            let slots = api.mig_device_slots(&g.handle).unwrap_or(0);
            for slot in 0..slots {
                let mig = match api.mig_device_by_index(&g.handle, slot) {
                    Ok(m) => m,
                    Err(ApiError::NotFound) => continue,
                    Err(e) => {
                        tracing::warn!(gpu = index, slot, error = %e, "cannot open MIG device");
                        continue;
                    }
                };
                let (gi_id, uuid) = match (api.gpu_instance_id(&mig), api.uuid(&mig)) {
                    (Ok(gi), Ok(u)) => (gi, u),
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::warn!(gpu = index, slot, error = %e, "cannot identify MIG device");
                        continue;
                    }
                };
                let ci_id = api.compute_instance_id(&mig).unwrap_or(0);
                let profile = Self::profile_name(api, &g.handle, &mig, index, gi_id);
                let placement = api
                    .gpu_instance_placement(&g.handle, gi_id)
                    .map_err(|e| {
                        tracing::debug!(gpu = index, gi_id, error = %e, "GPU instance placement unavailable; DRA MIG device names resolve by profile name only");
                    })
                    .ok();
                // One MIG device per GPU instance is exported (its first compute instance).
                if instances.iter().any(|i: &MigInstance| i.gi_id == gi_id) {
                    continue;
                }
                instances.push(MigInstance {
                    gi_id,
                    ci_id,
                    profile,
                    uuid,
                    placement,
                });
                handles.push((gi_id, mig));
            }
        }
        instances.sort_by_key(|i| i.gi_id);
        g.prev_mig_gpm
            .retain(|gi, _| handles.iter().any(|(h, _)| h == gi));
        g.mig = handles;
        g.mig_stale = false;
        (enabled, instances)
    }

    /// `GPU_I_PROFILE` of GPU instance `gi_id`, named as DCGM names it (see
    /// [`convert::dcgm_profile_name`]): from the GPU instance's profile, or, where that path is
    /// refused (it needs privileges), from the MIG device's attributes, or, on drivers without
    /// either, from the MIG device's name with NVML's suffixes dropped.
    fn profile_name(
        api: &A,
        parent: &A::Device,
        mig: &A::Device,
        index: u32,
        gi_id: u32,
    ) -> String {
        let named = |p: api::GiProfile| convert::dcgm_profile_name(p.slices, p.memory_mib);
        api.gpu_instance_profile(parent, gi_id)
            .map(named)
            .or_else(|e| {
                tracing::debug!(gpu = index, gi_id, error = %e, "GPU instance profile unavailable; using the MIG device's attributes");
                api.mig_attributes(mig).map(named)
            })
            .or_else(|e| {
                tracing::debug!(gpu = index, gi_id, error = %e, "MIG device attributes unavailable; using the MIG device's name");
                api.name(mig).map(|n| convert::profile_from_device_name(&n))
            })
            .unwrap_or_else(|e| {
                tracing::warn!(gpu = index, gi_id, error = %e, "cannot tell the profile of this GPU instance");
                String::new()
            })
    }
}
