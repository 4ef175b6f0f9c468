//! Per-tick reading of one device: the batched field-values call, GPM deltas, the calls that
//! have no field id, and the MIG instances' own readings.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::catalog::field::MigScope;
use crate::catalog::Field;
use crate::gpu::{Device, DeviceSample, FieldError, InstanceSample, Reading, Value};

use super::api::{self, ApiError, FieldRequest, GpmMetric, MemoryInfo, NvmlApi};
use super::call::{check, is_stale, Lost};
use super::convert::{self, NvlinkCounter, Plan, StaticFact};
use super::error::NvmlError;
use super::state::GpuState;

/// Calls `f` once and keeps its result for the other fields the same call serves.
fn once<T: Clone>(
    slot: &mut Option<Result<T, ApiError>>,
    f: impl FnOnce() -> Result<T, ApiError>,
) -> Result<Result<T, ApiError>, Lost> {
    if slot.is_none() {
        *slot = Some(check(f())?);
    }
    Ok(slot.clone().unwrap_or(Err(ApiError::NotSupported)))
}

fn int(r: Result<u32, ApiError>) -> Reading {
    r.map(|v| Value::Int(i64::from(v)))
        .map_err(|e| convert::field_error(&e))
}

/// Reads one device. `Err(Lost)` when any call says the GPU fell off the bus.
pub(super) fn read_device<A: NvmlApi>(
    api: &A,
    system: &[(StaticFact, Reading)],
    g: &mut GpuState<A>,
    device: &Device,
    fields: &[Field],
    link_error_period: Duration,
) -> Result<Result<DeviceSample, NvmlError>, Lost> {
    let plans: Vec<(Field, Plan)> = fields
        .iter()
        .copied()
        .filter(|f| !device.mig_enabled || f.mig_scope() != MigScope::Unsupported)
        // Per-link fields are read per link (`nvlink`), not as GPU readings.
        .filter(|f| !f.is_link())
        .map(|f| (f, convert::plan(f)))
        .collect();
    let fv = match field_values(api, &g.handle, &plans)? {
        Ok(fv) => fv,
        Err(e) => return Ok(Err(e)),
    };
    let gpm = if g.gpm {
        let h = g.handle.clone();
        let metrics = gpm_metrics(&plans);
        if metrics.is_empty() {
            HashMap::new()
        } else {
            gpm_delta(api, &mut g.prev_gpm, check(api.gpm_sample(&h))?, &metrics)?
        }
    } else {
        HashMap::new()
    };
    let readings = gpu_readings(api, system, g, &plans, &fv, &gpm)?;
    let instances = if device.mig_enabled {
        instance_readings(api, g, device, fields)?
    } else {
        Vec::new()
    };
    let h = g.handle.clone();
    let links = super::nvlink::read(
        api,
        &h,
        &mut g.links,
        fields,
        link_error_period,
        Instant::now(),
    )?;
    Ok(Ok(DeviceSample {
        readings,
        instances,
        links,
    }))
}

/// Answers of the batched field-values call, by request.
type FieldValues = HashMap<FieldRequest, api::FieldResult>;

/// The one batched `nvmlDeviceGetFieldValues` call for every field-value plan. The outer
/// `Err(Lost)` aborts the device; an inner error fails the device's sample.
fn field_values<A: NvmlApi>(
    api: &A,
    h: &A::Device,
    plans: &[(Field, Plan)],
) -> Result<Result<FieldValues, NvmlError>, Lost> {
    let mut requests: Vec<FieldRequest> = Vec::new();
    for (_, p) in plans {
        match p {
            Plan::FieldValue(id, _) => requests.push(FieldRequest { id: *id, scope: 0 }),
            Plan::NvlinkBandwidth => {
                for id in [
                    convert::fi::NVLINK_THROUGHPUT_DATA_TX,
                    convert::fi::NVLINK_THROUGHPUT_DATA_RX,
                ] {
                    requests.push(FieldRequest {
                        id,
                        scope: convert::ALL_LINKS,
                    });
                }
            }
            _ => {}
        }
    }
    requests.sort_by_key(|r| (r.id, r.scope));
    requests.dedup();
    let fv: FieldValues = if requests.is_empty() {
        HashMap::new()
    } else {
        match check(api.field_values(h, &requests))? {
            Ok(results) => requests.iter().copied().zip(results).collect(),
            Err(ApiError::NotSupported) => HashMap::new(),
            Err(cause) => {
                return Ok(Err(NvmlError::Call {
                    call: "nvmlDeviceGetFieldValues",
                    cause,
                }))
            }
        }
    };
    if fv.values().any(|r| r.value == Err(ApiError::GpuLost)) {
        return Err(Lost);
    }
    Ok(Ok(fv))
}

/// The distinct GPM metrics the plans ask for, sorted.
fn gpm_metrics<'a>(plans: impl IntoIterator<Item = &'a (Field, Plan)>) -> Vec<GpmMetric> {
    let mut m: Vec<GpmMetric> = plans
        .into_iter()
        .filter_map(|(_, p)| match p {
            Plan::Gpm(m) => Some(*m),
            _ => None,
        })
        .collect();
    m.sort();
    m.dedup();
    m
}

/// The GPU-level readings: field values from the batch, GPM from the delta, and the calls
/// without a field id, each made once however many fields it serves.
fn gpu_readings<A: NvmlApi>(
    api: &A,
    system: &[(StaticFact, Reading)],
    g: &mut GpuState<A>,
    plans: &[(Field, Plan)],
    fv: &FieldValues,
    gpm: &HashMap<GpmMetric, Reading>,
) -> Result<Vec<(Field, Reading)>, Lost> {
    let h = g.handle.clone();
    let fv_get = |id: u32, scope: u32| -> Result<&api::FieldResult, FieldError> {
        fv.get(&FieldRequest { id, scope })
            .ok_or(FieldError::NotSupported)
    };
    let mut mem = None;
    let mut util = None;
    let mut nvl = None;
    let mut readings = Vec::with_capacity(plans.len());
    for &(f, p) in plans {
        let reading: Reading = match p {
            Plan::Static(fact) => system
                .iter()
                .chain(g.statics.iter())
                .find(|(s, _)| *s == fact)
                .map_or(Err(FieldError::NotSupported), |(_, r)| r.clone()),
            Plan::FieldValue(id, unit) => match fv_get(id, 0).and_then(|r| match &r.value {
                Ok(v) => convert::field_value(id, *v, unit),
                Err(e) => Err(convert::field_error(e)),
            }) {
                // With ECC disabled NVML may leave the ECC entries unfilled (bug 2009232);
                // the mode itself is then read as DCGM reads it, with nvmlDeviceGetEccMode.
                Err(FieldError::NotSupported) if id == convert::fi::ECC_CURRENT => {
                    check(api.ecc_enabled(&h))?
                        .map(|on| Value::Int(i64::from(on)))
                        .map_err(|e| convert::field_error(&e))
                }
                other => other,
            },
            // Once per tick however many NVLink throughput fields ask for it (a second reading
            // would see no interval); `convert::in_field_unit` gives each its unit.
            Plan::NvlinkBandwidth => nvl
                .get_or_insert_with(|| {
                    nvlink_bandwidth(
                        &mut g.prev_nvlink,
                        fv_get(convert::fi::NVLINK_THROUGHPUT_DATA_TX, convert::ALL_LINKS),
                        fv_get(convert::fi::NVLINK_THROUGHPUT_DATA_RX, convert::ALL_LINKS),
                    )
                })
                .clone(),
            Plan::Memory(part) => once(&mut mem, || api.memory_info(&h))?
                .map(|m| convert::memory_value(&m, part))
                .map_err(|e| convert::field_error(&e)),
            Plan::Utilization(gpu) => once(&mut util, || api.utilization(&h))?
                .map(|(g, m)| Value::Int(i64::from(if gpu { g } else { m })))
                .map_err(|e| convert::field_error(&e)),
            Plan::EncoderUtil => int(check(api.encoder_utilization(&h))?),
            Plan::DecoderUtil => int(check(api.decoder_utilization(&h))?),
            Plan::Clock(kind) => int(check(api.clock(&h, kind))?),
            Plan::Temperature => int(check(api.temperature(&h))?),
            Plan::PowerUsage => watts(check(api.power_usage(&h))?),
            Plan::PowerLimit => watts(check(api.power_limit(&h))?),
            Plan::EnforcedPowerLimit => watts(check(api.enforced_power_limit(&h))?),
            Plan::Pstate => int(check(api.performance_state(&h))?),
            Plan::Fan => int(check(api.fan_speed(&h))?),
            Plan::PcieLinkGen => int(check(api.pcie_link_gen(&h))?),
            Plan::PcieLinkWidth => int(check(api.pcie_link_width(&h))?),
            Plan::ClocksEventReasons => check(api.clocks_event_reasons(&h))?
                .map_err(|e| convert::field_error(&e))
                .and_then(|m| {
                    i64::try_from(m)
                        .map(Value::Int)
                        .map_err(|_| FieldError::Invalid)
                }),
            Plan::VgpuLicense => check(api.grid_licensing(&h))?
                .map_err(|e| convert::field_error(&e))
                .and_then(|l| convert::vgpu_license_status(&l)),
            Plan::Gpm(m) => gpm
                .get(&m)
                .cloned()
                .unwrap_or(Err(FieldError::NotSupported)),
            Plan::Derived | Plan::Unavailable | Plan::PerLink => Err(FieldError::NotSupported),
        };
        readings.push((f, convert::in_field_unit(f, reading)));
    }
    Ok(readings)
}

/// The NVLink throughput rate, KiB/s (an intermediate value that `convert::in_field_unit`
/// turns into `DEV_NVLINK_BANDWIDTH_TOTAL`'s MB/s or `…_THROUGHPUT_BYTES_PER_SECOND`'s B/s), from
/// the TX and RX "all links" counters and the previous reading (which `cur` replaces).
fn nvlink_bandwidth(
    prev: &mut Option<NvlinkCounter>,
    tx: Result<&api::FieldResult, FieldError>,
    rx: Result<&api::FieldResult, FieldError>,
) -> Reading {
    let (tx, rx) = match (tx, rx) {
        (Ok(tx), Ok(rx)) => (tx, rx),
        (Err(e), _) | (_, Err(e)) => return Err(e),
    };
    let (t, r) = match (&tx.value, &rx.value) {
        (Ok(t), Ok(r)) => (*t, *r),
        (Err(e), _) | (_, Err(e)) => return Err(convert::field_error(e)),
    };
    match (convert::as_counter(t), convert::as_counter(r)) {
        (Some(t), Some(r)) => {
            let cur = NvlinkCounter {
                kib: t.saturating_add(r),
                timestamp_us: tx.timestamp_us.max(rx.timestamp_us),
            };
            let rate = convert::nvlink_rate_kib_per_s(*prev, cur);
            *prev = Some(cur);
            Ok(Value::Float(rate))
        }
        _ => Err(FieldError::Invalid),
    }
}

/// MIG instances' own readings: framebuffer on the MIG handle, GPM per GPU instance.
fn instance_readings<A: NvmlApi>(
    api: &A,
    g: &mut GpuState<A>,
    device: &Device,
    fields: &[Field],
) -> Result<Vec<InstanceSample>, Lost> {
    let inst_fields: Vec<(Field, Plan)> = fields
        .iter()
        .filter(|f| f.mig_scope() == MigScope::Instance)
        .map(|&f| (f, convert::plan(f)))
        .collect();
    let mut instances = Vec::new();
    if inst_fields.is_empty() {
        return Ok(instances);
    }
    let h = g.handle.clone();
    let inst_metrics = gpm_metrics(&inst_fields);
    let mig = g.mig.clone();
    for inst in &device.instances {
        let Some((_, mh)) = mig.iter().find(|(gi, _)| *gi == inst.gi_id) else {
            continue;
        };
        let mut mem: Option<Result<MemoryInfo, ApiError>> = None;
        let igpm = if inst_metrics.is_empty() || !g.gpm {
            HashMap::new()
        } else {
            let cur = check(api.gpm_mig_sample(&h, inst.gi_id))?;
            if cur.as_ref().is_err_and(is_stale) {
                g.mig_stale = true;
            }
            let mut prev = g.prev_mig_gpm.remove(&inst.gi_id);
            let out = gpm_delta(api, &mut prev, cur, &inst_metrics)?;
            if let Some(p) = prev {
                g.prev_mig_gpm.insert(inst.gi_id, p);
            }
            out
        };
        let mut rs = Vec::with_capacity(inst_fields.len());
        for (f, p) in &inst_fields {
            let r = match p {
                Plan::Memory(part) => {
                    let m = once(&mut mem, || api.memory_info(mh))?;
                    if m.as_ref().is_err_and(is_stale) {
                        g.mig_stale = true;
                    }
                    m.map(|m| convert::memory_value(&m, *part))
                        .map_err(|e| convert::field_error(&e))
                }
                Plan::Gpm(m) => igpm
                    .get(m)
                    .cloned()
                    .unwrap_or(Err(FieldError::NotSupported)),
                _ => Err(FieldError::NotSupported),
            };
            rs.push((*f, r));
        }
        instances.push(InstanceSample {
            gi_id: inst.gi_id,
            readings: rs,
        });
    }
    if g.mig_stale {
        // The handles may name other instances now (nvml.h: "handles may be reused and their
        // properties can change"): nothing read through them this tick is kept.
        instances.clear();
        g.prev_mig_gpm.clear();
    }
    Ok(instances)
}

fn watts(r: Result<u32, ApiError>) -> Reading {
    r.map(|mw| Value::Float(convert::milliwatts_to_watts(u64::from(mw))))
        .map_err(|e| convert::field_error(&e))
}

/// GPM metrics between the previous sample and `cur` (which becomes the previous one). The
/// first sample of a device has nothing to compare with: its fields are absent this tick.
fn gpm_delta<A: NvmlApi>(
    api: &A,
    prev: &mut Option<A::GpmSample>,
    cur: Result<A::GpmSample, ApiError>,
    metrics: &[GpmMetric],
) -> Result<HashMap<GpmMetric, Reading>, Lost> {
    let cur = match cur {
        Ok(c) => c,
        Err(e) => {
            let err = convert::field_error(&e);
            return Ok(metrics.iter().map(|&m| (m, Err(err))).collect());
        }
    };
    let out = match prev.as_ref() {
        None => HashMap::new(),
        Some(p) => match check(api.gpm_metrics(p, &cur, metrics))? {
            Ok(vals) => metrics
                .iter()
                .zip(vals)
                .map(|(&m, v)| {
                    let r = match v {
                        Ok(x) => convert::gpm_value(m, x),
                        Err(e) => Err(convert::field_error(&e)),
                    };
                    (m, r)
                })
                .collect(),
            Err(e) => {
                let err = convert::field_error(&e);
                metrics.iter().map(|&m| (m, Err(err))).collect()
            }
        },
    };
    *prev = Some(cur);
    Ok(out)
}
