//! HPC job labels end to end: a real directory, the [`HpcWatcher`] task polling it, the sampler
//! over the simulated MIG fleet reading what it publishes. Files are created, changed, broken
//! and removed while everything runs; each step waits for the watcher to publish the change
//! (the `watch` channel), never for a fixed time.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::hpc::{HpcJobs, HpcWatcher};
use gpu_exporter::pods::EntityKey;
use gpu_exporter::sampler::Sampler;

use common::series;

struct Running {
    sampler: Sampler<SimulatedSource>,
    jobs: watch::Receiver<Arc<HpcJobs>>,
    stop: CancellationToken,
}

impl Running {
    fn start(dir: &Path) -> Self {
        let h = common::harness(
            common::sim("4xA100-80GB-MIG", None),
            common::shipped_catalog(),
            common::build_options(),
        );
        let (tx, rx) = watch::channel(Arc::new(HpcJobs::default()));
        let (inventory_tx, inventory_rx) = watch::channel(Arc::new(Vec::new()));
        let stop = CancellationToken::new();
        let watcher = HpcWatcher::new(
            dir.to_owned(),
            Arc::clone(&h.metrics.hpc_jobs),
            inventory_rx,
        );
        tokio::spawn(watcher.run(tx, Duration::from_millis(20), stop.clone()));
        Self {
            sampler: h
                .sampler
                .with_hpc_jobs(rx.clone())
                .with_inventory(inventory_tx),
            jobs: rx,
            stop,
        }
    }

    /// Waits until the published jobs satisfy `ok`.
    async fn wait_for(&mut self, what: &str, ok: impl Fn(&HpcJobs) -> bool) {
        loop {
            if ok(&self.jobs.borrow_and_update()) {
                return;
            }
            tokio::time::timeout(Duration::from_secs(20), self.jobs.changed())
                .await
                .unwrap_or_else(|_| panic!("the watcher never published {what}"))
                .expect("watcher running");
        }
    }

    async fn body(&mut self) -> String {
        String::from_utf8(self.sampler.tick().await.body.to_vec()).expect("utf-8")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

const FB: &str = "DCGM_FI_DEV_FB_USED";

fn key(gpu: u32, gi_id: Option<u32>) -> EntityKey {
    EntityKey { gpu, gi_id }
}

/// The `hpc_job` values on `metric`'s series of GPU `gpu` (MIG instance `gi`).
fn jobs_on(body: &str, metric: &str, gpu: u32, gi: Option<u32>) -> Vec<String> {
    let g = format!("gpu=\"{gpu}\",");
    series(body, metric)
        .into_iter()
        .filter(|l| l.contains(&g))
        .filter(|l| match gi {
            Some(i) => l.contains(&format!("GPU_I_ID=\"{i}\"")),
            None => !l.contains("GPU_I_ID="),
        })
        .map(|l| {
            l.split("hpc_job=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

/// The label sets of the `DCGM_FI_DEV_FB_USED` series (values move between samples).
fn label_sets(body: &str) -> Vec<&str> {
    series(body, FB)
        .into_iter()
        .map(|l| l.rsplit_once(' ').map_or(l, |(labels, _)| labels))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_added_changed_broken_and_removed_take_effect_without_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hpc");
    let mut r = Running::start(&dir);
    // The first sample finds the devices; the watcher reads nothing before.
    r.body().await;

    // No directory yet: logged, counted, no labels, every series there.
    r.wait_for("the missing directory", |j| {
        j.errors.iter().any(|e| e.reason() == "dir_unreadable")
    })
    .await;
    let plain = r.body().await;
    assert!(!plain.contains("hpc_job="));
    assert!(plain.contains("gpu_exporter_hpc_job_file_errors_total{reason=\"dir_unreadable\"} 1\n"));

    // The scheduler creates it and starts a job on GPU 3 and one on MIG instance 0/2.
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("3"), "4412\n").unwrap();
    std::fs::write(dir.join("0.2"), "etl-7781\n").unwrap();
    r.wait_for("two files", |j| j.jobs.len() == 2).await;
    let body = r.body().await;
    assert_eq!(jobs_on(&body, FB, 3, None), ["4412"]);
    assert_eq!(jobs_on(&body, FB, 0, Some(2)), ["etl-7781"]);
    assert_eq!(jobs_on(&body, FB, 0, Some(3)), [""]);
    assert!(body.contains("gpu_exporter_hpc_job_files{state=\"ok\"} 2\n"));

    // A second job on GPU 3: one copy of each series per job.
    std::fs::write(dir.join("3"), "4412\n4413\n").unwrap();
    r.wait_for("the second job", |j| {
        j.jobs.get(&key(3, None)).is_some_and(|v| v.len() == 2)
    })
    .await;
    let body = r.body().await;
    assert_eq!(jobs_on(&body, FB, 3, None), ["4412", "4413"]);
    assert_eq!(
        series(&body, FB).len(),
        series(&plain, FB).len() + 1,
        "one extra copy"
    );

    // The file is broken: logged and counted once, ignored; the other file still works.
    std::fs::write(dir.join("3"), b"4412\n\xff\xfe\n").unwrap();
    r.wait_for("the broken file", |j| {
        !j.jobs.contains_key(&key(3, None)) && !j.errors.is_empty()
    })
    .await;
    let body = r.body().await;
    assert_eq!(jobs_on(&body, FB, 3, None), [""]);
    assert_eq!(jobs_on(&body, FB, 0, Some(2)), ["etl-7781"]);
    assert_eq!(series(&body, FB).len(), series(&plain, FB).len());
    assert!(body.contains("gpu_exporter_hpc_job_file_errors_total{reason=\"not_utf8\"} 1\n"));
    assert!(body.contains("gpu_exporter_hpc_job_files{state=\"bad\"} 1\n"));
    if common::promtool_available() {
        let (_, findings) = common::promtool_check(&body);
        let ours: Vec<&String> = findings
            .iter()
            .filter(|l| !l.starts_with("DCGM_"))
            .collect();
        assert!(ours.is_empty(), "promtool findings: {ours:?}");
    }

    // Fixed, then the jobs end (epilog empties or removes the files).
    std::fs::write(dir.join("3"), "4414\n").unwrap();
    r.wait_for("the fixed file", |j| {
        j.errors.is_empty() && j.jobs.len() == 2
    })
    .await;
    assert_eq!(jobs_on(&r.body().await, FB, 3, None), ["4414"]);
    std::fs::write(dir.join("3"), "").unwrap();
    std::fs::remove_file(dir.join("0.2")).unwrap();
    r.wait_for("no jobs", |j| j.jobs.is_empty()).await;
    let body = r.body().await;
    assert!(!body.contains("hpc_job="));
    assert_eq!(label_sets(&body), label_sets(&plain));
    // The error count stays what it was: each problem counted once.
    assert!(body.contains("gpu_exporter_hpc_job_file_errors_total{reason=\"not_utf8\"} 1\n"));
}
