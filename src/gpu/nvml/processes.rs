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
use std::time::{SystemTime, UNIX_EPOCH};

use super::api::{ApiError, NvmlApi, ProcessInfo, ProcessUtilSample};
use super::call::is_stale;
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
) -> Result<Vec<ProcessInfo>, ApiError> {
    let mut procs = api.compute_processes(handle)?;
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
/// device's list with MIG. A MIG handle answering "invalid argument" or "not found" (the
/// instances were destroyed or recreated) sets `mig_stale`: no process of the GPU is reported
/// this tick, as the handles may name other instances now.
pub(super) fn read<A: NvmlApi>(
    api: &A,
    gpu: &A::Device,
    mig: &[(u32, A::Device)],
    tracker: &mut ProcessTracker,
    mig_stale: &mut bool,
    device: &Device,
) -> Result<Vec<GpuProcess>, FieldError> {
    if device.mig_enabled {
        let mut out = Vec::new();
        for (gi, handle) in mig {
            let procs = match list(api, handle, tracker) {
                Ok(p) => p,
                Err(e) => {
                    if is_stale(&e) {
                        *mig_stale = true;
                    }
                    return Err(field_error(&e));
                }
            };
            for p in procs {
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
    let procs = list(api, gpu, tracker).map_err(|e| field_error(&e))?;
    let util = if tracker.util_unsupported {
        None
    } else {
        if tracker.cursor_us > now_us().saturating_add(CLOCK_STEP_US) {
            tracker.cursor_us = 0;
        }
        match api.process_utilization(gpu, tracker.cursor_us) {
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

    use super::super::api::MemoryInfo;
    use super::super::counting::Counting;
    use super::super::{NvmlSource, RetryPolicy};
    use crate::fake_nvml::{FakeGpu, FakeMig, FakeNvml};
    use crate::gpu::GpuSource;

    fn source<A: NvmlApi + Clone>(api: &A) -> NvmlSource<A> {
        let a = api.clone();
        NvmlSource::new(
            move || Ok(a.clone()),
            RetryPolicy {
                initial: std::time::Duration::ZERO,
                max: std::time::Duration::ZERO,
            },
        )
    }

    fn info(pid: u32, mib: Option<u64>) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_memory: mib.map(|m| m * 1_048_576),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    fn by_pid(ps: &[GpuProcess]) -> std::collections::BTreeMap<u32, &GpuProcess> {
        ps.iter().map(|p| (p.pid, p)).collect()
    }

    #[test]
    fn memory_mps_clients_and_utilisation_windows_through_the_source() {
        let mut g = FakeGpu::h100(0);
        g.processes = Ok(vec![info(10, Some(1000)), info(11, None)]);
        // An MPS client, and pid 11 listed again with its memory.
        g.mps_processes = Ok(vec![info(12, Some(300)), info(11, Some(200))]);
        g.process_samples = Ok(vec![
            sample(10, 100, 40),
            sample(10, 200, 60),
            sample(12, 200, 8),
        ]);
        let fake = FakeNvml::new("570.172.08", vec![g]);
        let src = source(&fake);
        let d = &src.devices().unwrap()[0];

        let first = src.processes(d).unwrap();
        assert_eq!(first.len(), 3);
        let p = by_pid(&first);
        assert_eq!(p[&10].used_memory_bytes, Some(1000 * 1_048_576));
        assert_eq!(p[&11].used_memory_bytes, Some(200 * 1_048_576));
        assert_eq!(p[&10].utilization.unwrap().sm, 50);
        assert_eq!(p[&12].utilization.unwrap().sm, 8);
        // No sample for 11: idle, not unknown.
        assert_eq!(p[&11].utilization, Some(ProcessUtilization::default()));
        assert!(first.iter().all(|p| p.gi_id.is_none()));

        // Next tick: two new samples in the driver's buffer; the old ones are not counted again.
        fake.update(|s| {
            if let Ok(buf) = &mut s.gpus[0].process_samples {
                buf.push(sample(10, 300, 90));
                buf.push(sample(11, 300, 20));
            }
        });
        let second = src.processes(d).unwrap();
        let p = by_pid(&second);
        assert_eq!(p[&10].utilization.unwrap().sm, 90);
        assert_eq!(p[&11].utilization.unwrap().sm, 20);
        assert_eq!(p[&12].utilization.unwrap().sm, 0);

        // Nothing new (NVML answers NOT_FOUND): everyone idle, nothing lost.
        let third = src.processes(d).unwrap();
        assert!(third
            .iter()
            .all(|p| p.utilization == Some(ProcessUtilization::default())));
    }

    #[test]
    fn mig_processes_come_from_each_instance_without_utilisation() {
        let mut g = FakeGpu::h100(0);
        g.mig_enabled = true;
        let inst = |gi_id: u32, pids: &[u32]| FakeMig {
            gi_id,
            ci_id: 0,
            uuid: format!("MIG-fake-{gi_id}"),
            profile_name: "MIG 1g.10gb".into(),
            slices: 1,
            profile_mib: 9_856,
            // 1g.10gb on an H100 80GB: profile id 19, one memory slice each.
            placement: (19, gi_id, 1),
            memory: MemoryInfo::default(),
            gpm: HashMap::new(),
            processes: pids
                .iter()
                .map(|&pid| ProcessInfo {
                    gpu_instance_id: Some(gi_id),
                    compute_instance_id: Some(0),
                    ..info(pid, Some(64))
                })
                .collect(),
        };
        g.mig = vec![Some(inst(7, &[70, 71])), None, Some(inst(8, &[80]))];
        let fake = FakeNvml::new("570.172.08", vec![g]);
        let src = source(&fake);
        let d = &src.devices().unwrap()[0];
        let ps = src.processes(d).unwrap();
        let got: Vec<(u32, Option<u32>)> = ps.iter().map(|p| (p.pid, p.gi_id)).collect();
        assert_eq!(got, [(70, Some(7)), (71, Some(7)), (80, Some(8))]);
        assert!(ps.iter().all(|p| p.utilization.is_none()));
        assert!(!src.wants_rediscovery());

        // GPU instance 7 is destroyed: its handle answers NOT_FOUND. Nothing of the GPU is
        // reported this tick (the other handles may name other instances now), and the
        // instances are enumerated again.
        fake.update(|st| st.gpus[0].mig[0] = None);
        assert_eq!(src.processes(d), Err(FieldError::Failed));
        assert!(src.wants_rediscovery());
        let d = &src.devices().unwrap()[0];
        let got: Vec<u32> = src.processes(d).unwrap().iter().map(|p| p.pid).collect();
        assert_eq!(got, [80]);
        assert!(!src.wants_rediscovery());
    }

    #[test]
    fn call_budget_and_unsupported_calls_are_dropped() {
        let mut g = FakeGpu::h100(0);
        g.mps_processes = Err(ApiError::NotSupported);
        g.process_samples = Err(ApiError::NotSupported);
        let counting = Counting::new(FakeNvml::new("570.172.08", vec![g, FakeGpu::h100(1)]));
        let counter = counting.counter();
        let src = source(&counting);
        let devices = src.devices().unwrap();
        counter.take();
        for d in &devices {
            src.processes(d).unwrap();
        }
        // Per GPU: the compute list, the MPS list, the utilisation samples.
        let calls = counter.take();
        assert_eq!(calls["nvmlDeviceGetComputeRunningProcesses_v3"], 2);
        assert_eq!(calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"], 2);
        assert_eq!(calls["nvmlDeviceGetProcessUtilization"], 2);
        // GPU 0 said NOT_SUPPORTED to two of them: they are not asked again.
        for d in &devices {
            src.processes(d).unwrap();
        }
        let calls = counter.take();
        assert_eq!(calls["nvmlDeviceGetComputeRunningProcesses_v3"], 2);
        assert_eq!(calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"], 1);
        assert_eq!(calls["nvmlDeviceGetProcessUtilization"], 1);
        let p0 = src.processes(&devices[0]).unwrap();
        assert!(p0.is_empty());
    }

    #[test]
    fn failures_are_field_errors() {
        let mut g = FakeGpu::h100(0);
        g.processes = Err(ApiError::NoPermission);
        let mut lost = FakeGpu::h100(1);
        lost.processes = Err(ApiError::Other("unknown error".into()));
        let fake = FakeNvml::new("570.172.08", vec![g, lost]);
        let src = source(&fake);
        let devices = src.devices().unwrap();
        assert_eq!(src.processes(&devices[0]), Err(FieldError::NoPermission));
        assert_eq!(src.processes(&devices[1]), Err(FieldError::Failed));
        fake.update(|s| s.gpus[1].lost = true);
        assert_eq!(src.processes(&devices[1]), Err(FieldError::Failed));
    }
}
