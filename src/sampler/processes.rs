//! Per-process attribution in the sampler: the GPU processes a tick read, attributed to
//! containers through their cgroups ([`usage::attribute`]), with each new problem logged once
//! with its fix and every failure counted (`gpu_exporter_process_attribution_errors_total`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tokio::sync::Notify;

use crate::gpu::{Device, FieldError, GpuProcess};
use crate::pods::directory::PodDirectory;
use crate::pods::procfs::ProcRoot;
use crate::pods::usage::{self, Owner, ProcessMetrics};
use crate::pods::EntityKey;
use crate::snapshot::DeviceOutcome;

/// Per-process attribution's state: the host's /proc, and the problems logged and not yet
/// cleared.
#[derive(Debug)]
pub(super) struct ProcessAttribution {
    /// The host's /proc (`--path.procfs`).
    pub(super) root: ProcRoot,
    problems: BTreeSet<&'static str>,
}

impl ProcessAttribution {
    /// Attribution through the host's /proc at `root`.
    pub(super) fn new(root: ProcRoot) -> Self {
        Self {
            root,
            problems: BTreeSet::new(),
        }
    }

    /// Attributes the last sample's processes to containers. For a fresh sample (`examples`
    /// given) records the outcome and failures and logs each new problem once; again after a
    /// change of attribution, only the outcome.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attribute(
        &mut self,
        outcomes: &[DeviceOutcome],
        processes: &[Option<Result<Vec<GpuProcess>, FieldError>>],
        owners: &HashMap<u32, Owner>,
        examples: Option<&BTreeMap<&'static str, String>>,
        directory: &PodDirectory,
        metrics: &ProcessMetrics,
        cri_waker: Option<&Notify>,
    ) -> BTreeMap<EntityKey, usage::EntityUsage> {
        let root = &self.root;
        let mut read: Vec<(&Device, &[GpuProcess])> = Vec::new();
        let mut nvml_errors: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (device, p) in outcomes.iter().map(|o| &o.device).zip(processes) {
            match p {
                Some(Ok(list)) => read.push((device, list.as_slice())),
                Some(Err(FieldError::NotSupported)) | None => {}
                Some(Err(FieldError::NoPermission)) => {
                    *nvml_errors.entry("nvml_no_permission").or_default() += 1;
                }
                Some(Err(_)) => *nvml_errors.entry("nvml_failed").or_default() += 1,
            }
        }
        let mut result = usage::attribute(&read, owners, directory);
        let Some(examples) = examples else {
            // The same readings again: their failures were counted and logged when read.
            metrics.record_tick(&result.outcomes, &BTreeMap::new());
            return result.entities;
        };
        for (r, n) in nvml_errors {
            *result.errors.entry(r).or_default() += n;
        }
        metrics.record_tick(&result.outcomes, &result.errors);
        if result.stale_directory {
            if let Some(w) = cri_waker {
                w.notify_one();
            }
        }
        // Transient (a pod started since the last listing; the runtime is asked again at once),
        // or logged by the runtime task itself: debug only.
        let quiet = |r: &&str| matches!(*r, "unknown_container" | "runtime_unavailable");
        let now: BTreeSet<&'static str> = result
            .errors
            .keys()
            .copied()
            .filter(|r| !quiet(r))
            .collect();
        for reason in result.errors.keys().filter(|r| quiet(r)) {
            tracing::debug!(reason, "GPU processes not attributed this tick");
        }
        for reason in now.difference(&self.problems) {
            let example = examples.get(reason).map_or("", String::as_str);
            tracing::warn!(
                reason,
                example,
                "per-process GPU attribution incomplete: {}; the GPUs concerned keep holder-only attribution (gpu_exporter_process_attribution_errors_total)",
                process_hint(reason, root)
            );
        }
        if !self.problems.is_empty() && now.is_empty() {
            tracing::info!("per-process GPU attribution complete again");
        }
        self.problems = now;
        result.entities
    }
}

/// What to do about a per-process attribution failure.
fn process_hint(reason: &str, root: &ProcRoot) -> String {
    let root = root.root().display();
    match reason {
        "proc_not_found" => format!("GPU processes have no entry under --path.procfs {root}: NVML reports host PIDs, so mount the host's /proc (hostPath /proc at /host/proc with --path.procfs /host/proc) or run the pod with hostPID: true"),
        "proc_permission_denied" => format!("{root}/<pid>/cgroup may not be read: the host's /proc is mounted with hidepid, or a security profile denies it"),
        "proc_unreadable" => format!("{root}/<pid>/cgroup could not be read"),
        "cgroup_unrecognised" => format!("{root}/<pid>/cgroup is not in the cgroup file format: is --path.procfs a procfs?"),
        "nvml_no_permission" => "NVML refuses to list the processes on a GPU (NVML_ERROR_NO_PERMISSION)".to_owned(),
        _ => "NVML could not list the processes on a GPU".to_owned(),
    }
}
