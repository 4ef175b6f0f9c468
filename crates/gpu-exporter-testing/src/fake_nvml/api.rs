//! The fake's answer to each [`NvmlApi`] call, from the GPUs a test set up.

use std::sync::mpsc;
use std::sync::{Arc, PoisonError};

use gpu_exporter::gpu::nvml::api::{
    ApiError, ClockKind, FieldNum, FieldRequest, FieldResult, FieldValue, GiProfile, GpmMetric,
    GridLicensing, InforomObject, MemoryInfo, NvlinkErrorCounter, NvmlApi, ProcessInfo,
    ProcessUtilSample, Registered,
};
use gpu_exporter::gpu::MigPlacement;

use super::{FakeEvents, FakeGpmSample, FakeHandle, FakeNvml, Registration};

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
                at_once: Arc::clone(&self.wait_at_once),
                waits: Arc::clone(&self.waits),
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
