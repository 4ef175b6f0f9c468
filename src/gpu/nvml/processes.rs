//! Per-process readings, on the sampling tick's budget: which processes run on each GPU and MIG
//! instance, their framebuffer and their utilisation since the previous tick.
//!
//! Calls per tick (only with per-process attribution on):
//!
//! - GPU without MIG: `nvmlDeviceGetComputeRunningProcesses_v3`,
//!   `nvmlDeviceGetMPSComputeRunningProcesses_v3` (MPS clients; dropped after the first
//!   `NOT_SUPPORTED`), `nvmlDeviceGetProcessUtilization` (dropped after the first
//!   `NOT_SUPPORTED`). Each is a count call plus a fill call inside `nvml-wrapper`.
//! - MIG-enabled GPU: the two process lists on each MIG device handle (per-instance processes;
//!   the parent handle gives an aggregate only to privileged callers). No utilisation: NVML
//!   does not report per-process utilisation on MIG ("not currently supported").
//!
//! **Utilisation samples.** The driver keeps a buffer of per-process samples, one per process
//! and driver sample period in which the process had non-zero utilisation, each with a CPU
//! timestamp (µs). Each tick asks for the samples newer than the newest one already consumed
//! (`lastSeenTimeStamp`), keeps only those (in case a driver returns older ones), and moves the
//! cursor to the newest returned. So every sample counts in exactly one tick: none is counted
//! twice, and none is lost while the buffer holds more than one tick's worth. A process's value
//! for the tick is the mean of its samples in the window; a process without a sample was idle
//! (`NOT_FOUND`, "no samples since lastSeenTimeStamp", means every process was idle). The first
//! tick after startup uses everything the driver holds. A cursor ahead of the clock (the
//! wall clock was stepped back) is reset, so samples are not suppressed until the clock catches up.
//!
//! **MPS.** MPS clients are listed by the MPS call (and some drivers list them in the compute
//! list too); a PID in both is counted once. Per-process utilisation of MPS clients is what the
//! driver attributes to each client; their sum can exceed the device's utilisation, since the
//! clients run concurrently.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use super::api::{ApiError, NvmlApi, ProcessInfo, ProcessUtilSample};
use super::{GpuState, NvmlSource, State};
use crate::gpu::{Device, FieldError, GpuProcess, ProcessUtilization};

/// A cursor this far ahead of the wall clock means the clock was stepped back.
const CLOCK_STEP_US: u64 = 300_000_000;

/// Per-GPU state of the process readings.
#[derive(Debug, Default)]
pub(super) struct ProcessTracker {
    /// The newest utilisation sample consumed, µs.
    cursor_us: u64,
    /// `nvmlDeviceGetProcessUtilization` answered `NOT_SUPPORTED`.
    util_unsupported: bool,
    /// `nvmlDeviceGetMPSComputeRunningProcesses_v3` answered `NOT_SUPPORTED`.
    mps_unsupported: bool,
}

/// The samples newer than `cursor`, averaged per PID, and the new cursor.
pub(super) fn fold_samples(
    samples: &[ProcessUtilSample],
    cursor: u64,
) -> (HashMap<u32, ProcessUtilization>, u64) {
    let mut sums: HashMap<u32, ([u64; 4], u64)> = HashMap::new();
    let mut newest = cursor;
    for s in samples.iter().filter(|s| s.timestamp_us > cursor) {
        newest = newest.max(s.timestamp_us);
        let e = sums.entry(s.pid).or_default();
        for (acc, v) in e.0.iter_mut().zip([s.sm, s.memory, s.encoder, s.decoder]) {
            *acc += u64::from(v);
        }
        e.1 += 1;
    }
    let mean = |total: u64, n: u64| u32::try_from((total + n / 2) / n).unwrap_or(u32::MAX);
    let out = sums
        .into_iter()
        .map(|(pid, (t, n))| {
            (
                pid,
                ProcessUtilization {
                    sm: mean(t[0], n),
                    memory: mean(t[1], n),
                    encoder: mean(t[2], n),
                    decoder: mean(t[3], n),
                },
            )
        })
        .collect();
    (out, newest)
}

fn field_error(e: &ApiError) -> FieldError {
    match e {
        ApiError::NotSupported => FieldError::NotSupported,
        ApiError::NoPermission => FieldError::NoPermission,
        _ => FieldError::Failed,
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The compute and (unless known unsupported) MPS processes on `handle`, one entry per PID.
fn list<A: NvmlApi>(
    api: &A,
    handle: &A::Device,
    tracker: &mut ProcessTracker,
) -> Result<Vec<ProcessInfo>, FieldError> {
    let mut procs = api.compute_processes(handle).map_err(|e| field_error(&e))?;
    if !tracker.mps_unsupported {
        match api.mps_compute_processes(handle) {
            Ok(mps) => {
                for m in mps {
                    match procs.iter_mut().find(|p| p.pid == m.pid) {
                        Some(p) => {
                            if p.used_memory.is_none() {
                                p.used_memory = m.used_memory;
                            }
                        }
                        None => procs.push(m),
                    }
                }
            }
            Err(ApiError::NotSupported) => tracker.mps_unsupported = true,
            // The compute list is still good; MPS clients are missing this tick.
            Err(e) => {
                tracing::debug!(error = %e, "nvmlDeviceGetMPSComputeRunningProcesses_v3 failed")
            }
        }
    }
    Ok(procs)
}

/// Reads the processes of one GPU: its own list (and utilisation) without MIG, each MIG
/// device's list with MIG.
pub(super) fn read<A: NvmlApi>(
    api: &A,
    g: &mut GpuState<A>,
    device: &Device,
) -> Result<Vec<GpuProcess>, FieldError> {
    let tracker = &mut g.procs;
    if device.mig_enabled {
        let mut out = Vec::new();
        for (gi, handle) in &g.mig {
            for p in list(api, handle, tracker)? {
                out.push(GpuProcess {
                    pid: p.pid,
                    gi_id: Some(p.gpu_instance_id.unwrap_or(*gi)),
                    used_memory_bytes: p.used_memory,
                    utilization: None,
                });
            }
        }
        return Ok(out);
    }
    let procs = list(api, &g.handle, tracker)?;
    let util = if tracker.util_unsupported {
        None
    } else {
        if tracker.cursor_us > now_us().saturating_add(CLOCK_STEP_US) {
            tracker.cursor_us = 0;
        }
        match api.process_utilization(&g.handle, tracker.cursor_us) {
            Ok(samples) => {
                let (by_pid, cursor) = fold_samples(&samples, tracker.cursor_us);
                tracker.cursor_us = cursor;
                Some(by_pid)
            }
            Err(ApiError::NotFound) => Some(HashMap::new()),
            Err(ApiError::NotSupported) => {
                tracker.util_unsupported = true;
                None
            }
            Err(e) => {
                tracing::debug!(gpu = device.identity.index, error = %e, "nvmlDeviceGetProcessUtilization failed; no per-process utilisation this tick");
                None
            }
        }
    };
    Ok(procs
        .into_iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            gi_id: None,
            used_memory_bytes: p.used_memory,
            utilization: util
                .as_ref()
                .map(|u| u.get(&p.pid).copied().unwrap_or_default()),
        })
        .collect())
}

impl<A: NvmlApi> NvmlSource<A> {
    /// [`crate::gpu::GpuSource::processes`] for NVML.
    pub(super) fn read_processes(&self, device: &Device) -> Result<Vec<GpuProcess>, FieldError> {
        let mut state = self.lock();
        let State::Ready(ready) = &mut *state else {
            return Err(FieldError::Failed);
        };
        let api = Arc::clone(&ready.api);
        let g = ready
            .gpus
            .get_mut(&device.identity.uuid)
            .ok_or(FieldError::Failed)?;
        read(&*api, g, device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, ts: u64, sm: u32) -> ProcessUtilSample {
        ProcessUtilSample {
            pid,
            timestamp_us: ts,
            sm,
            memory: sm / 2,
            encoder: 0,
            decoder: 3,
        }
    }

    #[test]
    fn each_sample_counts_in_exactly_one_window() {
        // The driver's buffer grows; each tick asks from the cursor on.
        let buffer = [
            sample(1, 100, 40),
            sample(2, 100, 10),
            sample(1, 200, 60),
            sample(1, 300, 90),
            sample(2, 400, 30),
        ];
        // Tick 1 sees the first three.
        let (t1, c1) = fold_samples(&buffer[..3], 0);
        assert_eq!(c1, 200);
        assert_eq!(t1[&1].sm, 50); // mean of 40 and 60
        assert_eq!(t1[&2].sm, 10);
        // Tick 2: the driver returns everything newer than 200 (and a misbehaving driver might
        // return older samples too: they are ignored, not counted twice).
        let (t2, c2) = fold_samples(&buffer, c1);
        assert_eq!(c2, 400);
        assert_eq!(t2[&1].sm, 90);
        assert_eq!(t2[&2].sm, 30);
        assert_eq!(t2[&2].memory, 15);
        assert_eq!(t2[&2].decoder, 3);
        // Nothing newer: no values, the cursor stays.
        let (t3, c3) = fold_samples(&buffer, c2);
        assert!(t3.is_empty());
        assert_eq!(c3, 400);
        // Every sample was used once: 3 in the first window, 2 in the second.
        let used = buffer.iter().filter(|s| s.timestamp_us <= c1).count()
            + buffer
                .iter()
                .filter(|s| s.timestamp_us > c1 && s.timestamp_us <= c2)
                .count();
        assert_eq!(used, buffer.len());
    }

    #[test]
    fn means_round_to_nearest() {
        let (t, _) = fold_samples(&[sample(7, 1, 1), sample(7, 2, 2)], 0);
        assert_eq!(t[&7].sm, 2); // 1.5 rounds up
        let (t, _) = fold_samples(&[sample(7, 1, 1), sample(7, 2, 1), sample(7, 3, 2)], 0);
        assert_eq!(t[&7].sm, 1); // 1.33
    }
}
