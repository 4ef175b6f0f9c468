//! The [`GpuSource`] implementation of the simulated fleet.

use super::profiles::mig_profile_id_and_size;
use super::seeded::uuid;
use super::{SimProcess, SimulatedSource};
use crate::catalog::Field;
use crate::gpu::{
    Device, DeviceSample, FieldError, FieldGap, GpuProcess, GpuSource, MigInstance, MigPlacement,
    ProcessUtilization, SourceError, XidEvent,
};

impl GpuSource for SimulatedSource {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn supports(&self, field: Field) -> bool {
        field != Field::ExpP2pStatus
    }

    fn field_gap(&self, _device: &Device, field: Field) -> Option<FieldGap> {
        (field.is_profiling() && !self.serves_profiling()).then_some(FieldGap::ProfilingNeedsDcgm)
    }

    fn devices(&self) -> Result<Vec<Device>, SourceError> {
        Ok((0..self.profile.gpus)
            .map(|i| {
                let layout = self.profile.mig.get(i as usize).copied().unwrap_or(&[]);
                let mut instances: Vec<MigInstance> = layout
                    .iter()
                    .map(|&(profile, gi_id, start)| {
                        let (profile_id, size) = mig_profile_id_and_size(profile);
                        MigInstance {
                            gi_id,
                            ci_id: 0,
                            profile: profile.to_owned(),
                            uuid: uuid("MIG", self.seed, i, u64::from(gi_id) + 1),
                            placement: Some(MigPlacement {
                                profile_id,
                                start,
                                size,
                            }),
                        }
                    })
                    .collect();
                instances.sort_by_key(|m| m.gi_id);
                Device {
                    identity: self.identity(i),
                    mig_enabled: !layout.is_empty(),
                    instances,
                }
            })
            .collect())
    }

    fn sample(&self, device: &Device, fields: &[Field]) -> Result<DeviceSample, SourceError> {
        let index = device.identity.index;
        let Some(cell) = self.state.get(index as usize) else {
            return Err(SourceError::Device {
                index,
                uuid: device.identity.uuid.clone(),
                cause: "no such simulated GPU".into(),
            });
        };
        let mut st = cell
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = self.interval * u32::try_from(st.ticks).unwrap_or(u32::MAX);
        self.apply_events(index, &mut st, now);
        if st.lost {
            st.ticks += 1;
            return Err(SourceError::GpuLost {
                index,
                uuid: device.identity.uuid.clone(),
            });
        }
        let sample = self.read(device, &mut st, fields);
        st.ticks += 1;
        Ok(sample)
    }

    fn processes(&self, device: &Device) -> Result<Vec<GpuProcess>, FieldError> {
        let index = device.identity.index;
        let cell = self.state.get(index as usize).ok_or(FieldError::Failed)?;
        let st = cell
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.lost {
            return Err(FieldError::Failed);
        }
        let Some(last) = &st.last else {
            return Ok(Vec::new());
        };
        let mut groups: Vec<(Option<u32>, Vec<&SimProcess>)> = Vec::new();
        for p in self.processes.iter().filter(|p| p.gpu == index) {
            match groups.iter_mut().find(|(gi, _)| *gi == p.gi_id) {
                Some((_, v)) => v.push(p),
                None => groups.push((p.gi_id, vec![p])),
            }
        }
        let mut out = Vec::new();
        for (gi, procs) in groups {
            let total: f64 = procs.iter().map(|p| p.weight).sum();
            let fb = match gi {
                None => last.fb_used_mib,
                Some(g) => last
                    .instances
                    .iter()
                    .find(|(i, _)| *i == g)
                    .map_or(0, |(_, used)| *used),
            };
            let mib = split(fb.max(0) as u64, procs.iter().map(|p| p.weight / total));
            for (p, mib) in procs.iter().zip(mib) {
                let share = p.weight / total;
                let pct = |v: f64| (v * share).round().clamp(0.0, 100.0) as u32;
                out.push(GpuProcess {
                    pid: p.pid,
                    gi_id: gi,
                    used_memory_bytes: Some(mib * 1024 * 1024),
                    utilization: gi.is_none().then(|| ProcessUtilization {
                        sm: pct(last.util),
                        memory: pct(last.mem_util),
                        encoder: 0,
                        decoder: 0,
                    }),
                });
            }
        }
        Ok(out)
    }

    fn drain_xids(&self) -> Vec<(String, XidEvent)> {
        let mut out = Vec::new();
        for (i, cell) in self.state.iter().enumerate() {
            let mut st = cell
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let uuid = uuid("GPU", self.seed, i as u32, 0);
            out.extend(st.pending_xids.drain(..).map(|x| (uuid.clone(), x)));
        }
        out
    }
}

/// Splits `total` by `shares` (summing to 1) into whole parts that add up to `total` exactly:
/// each part rounded down, the remainder given one by one from the first part on.
fn split(total: u64, shares: impl Iterator<Item = f64>) -> Vec<u64> {
    let mut parts: Vec<u64> = shares.map(|s| (total as f64 * s).floor() as u64).collect();
    let mut rest = total.saturating_sub(parts.iter().sum());
    let n = parts.len();
    let mut i = 0;
    while rest > 0 && n > 0 {
        parts[i % n] += 1;
        rest -= 1;
        i += 1;
    }
    parts
}
