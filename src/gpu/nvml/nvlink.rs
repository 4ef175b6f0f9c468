//! Per-NVLink readings for dcgm-exporter's link entities: the DCGM `FE_LINK` fields 1525-1531
//! (per-link CRC flit / CRC data / replay / recovery error counters, per-link TX+RX, TX and RX
//! throughput), read through NVML's per-link scope.
//!
//! NVML calls, per GPU (docs/nvml.md, "Call budget"):
//! - which links are active: `NVML_FI_DEV_NVLINK_LINK_COUNT` (in one field-values call) and
//!   `nvmlDeviceGetNvLinkState` per link, at most once per [`STATE_PERIOD`];
//! - throughput: one batched `nvmlDeviceGetFieldValues` with `NVLINK_THROUGHPUT_DATA_TX/RX` for
//!   every active link (scope = link), every tick;
//! - error counters: `nvmlDeviceGetNvLinkErrorCounter` per active link and counter asked for,
//!   the costly part (up to 4 × 18 calls on an H100), on their own slower cadence: at most once
//!   per error period (30 s by default, see [`super::NvmlSource::with_link_error_period`]); the
//!   ticks in between serve the last values read.
//!
//! Nothing is called unless the CSV lists a link field.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::catalog::Field;
use crate::gpu::{FieldError, LinkSample, Reading, Value};

use super::api::{ApiError, FieldNum, FieldRequest, FieldValue, NvlinkErrorCounter, NvmlApi};
use super::call::{check, Lost};
use super::convert::{self, NvlinkCounter};

/// How often the set of active links is re-read.
pub const STATE_PERIOD: Duration = Duration::from_secs(60);

/// The default period of the per-link error counters.
pub const DEFAULT_ERROR_PERIOD: Duration = Duration::from_secs(30);

/// Links probed when the driver does not report `NVML_FI_DEV_NVLINK_LINK_COUNT`
/// (`NVML_NVLINK_MAX_LINKS`).
const MAX_LINKS: u32 = 18;

/// `NVML_FI_DEV_NVLINK_LINK_COUNT`.
const FI_NVLINK_LINK_COUNT: u32 = 91;

/// Per-GPU link state kept between ticks.
#[derive(Debug, Default)]
pub(super) struct Links {
    active: Vec<u32>,
    states_read_at: Option<Instant>,
    /// Previous (TX, RX) KiB counters per link.
    prev: HashMap<u32, (NvlinkCounter, NvlinkCounter)>,
    /// Last error counter values per (link, counter).
    errors: HashMap<(u32, NvlinkErrorCounter), Reading>,
    errors_read_at: Option<Instant>,
}

impl Links {
    /// Forgets everything (after the GPU fell off the bus: rates across it are meaningless).
    pub(super) fn reset(&mut self) {
        *self = Self::default();
    }
}

fn error_counter(field: Field) -> Option<NvlinkErrorCounter> {
    Some(match field {
        Field::NvlinkCrcFlitErrorPerLinkTotal => NvlinkErrorCounter::CrcFlit,
        Field::NvlinkCrcDataErrorPerLinkTotal => NvlinkErrorCounter::CrcData,
        Field::NvlinkReplayErrorPerLinkTotal => NvlinkErrorCounter::Replay,
        Field::NvlinkRecoveryErrorPerLinkTotal => NvlinkErrorCounter::Recovery,
        _ => return None,
    })
}

fn is_throughput(field: Field) -> bool {
    matches!(
        field,
        Field::NvlinkThroughputPerLink
            | Field::NvlinkTxThroughputPerLink
            | Field::NvlinkRxThroughputPerLink
    )
}

/// Reads the link fields among `fields` for every active link of the GPU `h`.
pub(super) fn read<A: NvmlApi>(
    api: &A,
    h: &A::Device,
    links: &mut Links,
    fields: &[Field],
    error_period: Duration,
    now: Instant,
) -> Result<Vec<LinkSample>, Lost> {
    let wanted: Vec<Field> = fields.iter().copied().filter(|f| f.is_link()).collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    if links
        .states_read_at
        .is_none_or(|t| now.duration_since(t) >= STATE_PERIOD)
    {
        refresh_states(api, h, links)?;
        links.states_read_at = Some(now);
    }
    if links.active.is_empty() {
        return Ok(Vec::new());
    }

    // Error counters, on their own cadence. A little slack so that a period equal to the
    // sampling interval reads every tick despite timer jitter.
    let mut counters: Vec<NvlinkErrorCounter> =
        wanted.iter().filter_map(|&f| error_counter(f)).collect();
    counters.sort();
    counters.dedup();
    let missing = links.active.iter().any(|&l| {
        counters
            .iter()
            .any(|&c| !links.errors.contains_key(&(l, c)))
    });
    let due = links
        .errors_read_at
        .is_none_or(|t| now.duration_since(t) + Duration::from_millis(500) >= error_period);
    if !counters.is_empty() && (due || missing) {
        links.errors.clear();
        for &l in &links.active {
            for &c in &counters {
                let r = check(api.nvlink_error_counter(h, l, c))?
                    .map_err(|e| convert::field_error(&e))
                    .and_then(|v| {
                        i64::try_from(v)
                            .map(Value::Int)
                            .map_err(|_| FieldError::Invalid)
                    });
                links.errors.insert((l, c), r);
            }
        }
        links.errors_read_at = Some(now);
    }

    // Throughput: one batched call for every active link, every tick.
    let mut rates: HashMap<u32, Result<(f64, f64), FieldError>> = HashMap::new();
    if wanted.iter().any(|&f| is_throughput(f)) {
        let requests: Vec<FieldRequest> = links
            .active
            .iter()
            .flat_map(|&l| {
                [
                    convert::fi::NVLINK_THROUGHPUT_DATA_TX,
                    convert::fi::NVLINK_THROUGHPUT_DATA_RX,
                ]
                .map(|id| FieldRequest { id, scope: l })
            })
            .collect();
        match check(api.field_values(h, &requests))? {
            Ok(results) => {
                if results.iter().any(|r| r.value == Err(ApiError::GpuLost)) {
                    return Err(Lost);
                }
                for (&l, pair) in links.active.iter().zip(results.chunks(2)) {
                    let counter = |i: usize| -> Result<NvlinkCounter, FieldError> {
                        let r = pair.get(i).ok_or(FieldError::Failed)?;
                        let v = r.value.as_ref().map_err(convert::field_error)?;
                        let kib = convert::as_counter(*v).ok_or(FieldError::Invalid)?;
                        Ok(NvlinkCounter {
                            kib,
                            timestamp_us: r.timestamp_us,
                        })
                    };
                    let rate = match (counter(0), counter(1)) {
                        (Ok(tx), Ok(rx)) => {
                            let prev = links.prev.insert(l, (tx, rx));
                            Ok((
                                convert::nvlink_rate_kib_per_s(prev.map(|p| p.0), tx),
                                convert::nvlink_rate_kib_per_s(prev.map(|p| p.1), rx),
                            ))
                        }
                        (Err(e), _) | (_, Err(e)) => Err(e),
                    };
                    rates.insert(l, rate);
                }
            }
            Err(e) => {
                let err = convert::field_error(&e);
                for &l in &links.active {
                    rates.insert(l, Err(err));
                }
            }
        }
    }

    let mbps = |kib_per_s: f64| Value::Int(convert::kib_per_s_to_mbps(kib_per_s));
    Ok(links
        .active
        .iter()
        .map(|&l| {
            let readings = wanted
                .iter()
                .map(|&f| {
                    let r = if let Some(c) = error_counter(f) {
                        links
                            .errors
                            .get(&(l, c))
                            .cloned()
                            .unwrap_or(Err(FieldError::NotSupported))
                    } else {
                        let rate = rates
                            .get(&l)
                            .cloned()
                            .unwrap_or(Err(FieldError::NotSupported));
                        rate.map(|(tx, rx)| match f {
                            Field::NvlinkTxThroughputPerLink => mbps(tx),
                            Field::NvlinkRxThroughputPerLink => mbps(rx),
                            _ => mbps(tx + rx),
                        })
                    };
                    (f, r)
                })
                .collect();
            LinkSample { link: l, readings }
        })
        .collect())
}

fn refresh_states<A: NvmlApi>(api: &A, h: &A::Device, links: &mut Links) -> Result<(), Lost> {
    let request = [FieldRequest {
        id: FI_NVLINK_LINK_COUNT,
        scope: 0,
    }];
    let count = match check(api.field_values(h, &request))? {
        Ok(rs) => match rs.first().map(|r| r.value.as_ref().map(FieldValue::typed)) {
            Some(Ok(Some(FieldNum::Unsigned(n)))) => u32::try_from(n).unwrap_or(MAX_LINKS),
            Some(Ok(Some(FieldNum::Signed(n)))) => u32::try_from(n).unwrap_or(MAX_LINKS),
            Some(Err(ApiError::GpuLost)) => return Err(Lost),
            _ => MAX_LINKS,
        },
        Err(_) => MAX_LINKS,
    };
    let mut active = Vec::new();
    for l in 0..count.min(64) {
        if let Ok(true) = check(api.nvlink_active(h, l))? {
            active.push(l);
        }
    }
    if active != links.active {
        links.prev.retain(|l, _| active.contains(l));
        links.errors.clear();
        links.errors_read_at = None;
        links.active = active;
    }
    Ok(())
}
