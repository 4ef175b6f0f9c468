//! The sampling loop under paused time: ticks publish on the interval, a failing field or device
//! removes only its own series and is counted, lost GPUs come back, re-discovery notices a vanished
//! GPU, and a reloaded catalog takes effect on the next tick.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpu_exporter::catalog::{self, Field};
use gpu_exporter::gpu::scenario;
use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::gpu::{Device, DeviceSample, FieldError, GpuSource, SourceError, XidEvent};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Wraps the sim to inject failures.
struct Faulty {
    inner: SimulatedSource,
    fail_field: Option<(u32, Field)>,
    fail_device: Option<u32>,
    hide_gpu: Option<(u32, Arc<AtomicBool>)>,
}

impl GpuSource for Faulty {
    fn name(&self) -> &'static str {
        "faulty"
    }
    fn supports(&self, field: Field) -> bool {
        self.inner.supports(field)
    }
    fn devices(&self) -> Result<Vec<Device>, SourceError> {
        let mut d = self.inner.devices()?;
        if let Some((i, hidden)) = &self.hide_gpu {
            if hidden.load(Ordering::SeqCst) {
                d.retain(|d| d.identity.index != *i);
            }
        }
        Ok(d)
    }
    fn sample(&self, device: &Device, fields: &[Field]) -> Result<DeviceSample, SourceError> {
        if self.fail_device == Some(device.identity.index) {
            return Err(SourceError::Device {
                index: device.identity.index,
                uuid: device.identity.uuid.clone(),
                cause: "injected".into(),
            });
        }
        let mut s = self.inner.sample(device, fields)?;
        if let Some((i, f)) = self.fail_field {
            if i == device.identity.index {
                for (field, r) in &mut s.readings {
                    if *field == f {
                        *r = Err(FieldError::Failed);
                    }
                }
            }
        }
        Ok(s)
    }
    fn drain_xids(&self) -> Vec<(String, XidEvent)> {
        self.inner.drain_xids()
    }
}

fn faulty() -> Faulty {
    Faulty {
        inner: common::sim("8xH100-SXM", None),
        fail_field: None,
        fail_device: None,
        hide_gpu: None,
    }
}

fn body_of(p: &Arc<gpu_exporter::sampler::Published>) -> String {
    String::from_utf8(p.body.to_vec()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn run_publishes_once_per_interval() {
    let h = common::harness(
        common::sim("1xA100-40GB", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    let (tx, mut rx) = watch::channel(None);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(h.sampler.run(tx, shutdown.clone()));
    let mut times = Vec::new();
    for _ in 0..4 {
        rx.changed().await.unwrap();
        let p = rx.borrow_and_update().clone().unwrap();
        times.push(p.at);
    }
    shutdown.cancel();
    task.await.unwrap();
    for w in times.windows(2) {
        assert_eq!(w[1] - w[0], common::INTERVAL);
    }
    let last = rx.borrow().clone().unwrap();
    assert!(body_of(&last).contains("gpu_exporter_samples_total 4\n"));
}

#[tokio::test(start_paused = true)]
async fn a_failing_field_removes_only_its_series_and_is_counted() {
    let mut src = faulty();
    src.fail_field = Some((2, Field::FbUsed));
    let mut h = common::harness(src, common::shipped_catalog(), common::build_options());
    let body = body_of(&h.sampler.tick().await);
    let fb = common::series(&body, "DCGM_FI_DEV_FB_USED");
    assert_eq!(fb.len(), 7);
    assert!(!fb.iter().any(|l| l.contains("gpu=\"2\"")));
    assert_eq!(common::series(&body, "DCGM_FI_DEV_FB_FREE").len(), 8);
    assert!(
        body.contains(
            "gpu_exporter_field_errors_total{field=\"DCGM_FI_DEV_FB_USED\",reason=\"failed\"} 1\n"
        ),
        "{body}"
    );
    let body = body_of(&h.sampler.tick().await);
    assert!(body.contains(
        "gpu_exporter_field_errors_total{field=\"DCGM_FI_DEV_FB_USED\",reason=\"failed\"} 2\n"
    ));
}

#[tokio::test(start_paused = true)]
async fn an_unreadable_device_removes_only_its_own_series() {
    let mut src = faulty();
    src.fail_device = Some(5);
    let mut h = common::harness(src, common::shipped_catalog(), common::build_options());
    let body = body_of(&h.sampler.tick().await);
    let temps = common::series(&body, "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temps.len(), 7);
    assert!(!temps.iter().any(|l| l.contains("gpu=\"5\"")));
    assert!(body.contains("gpu_exporter_sample_errors_total{reason=\"device_error\"} 1\n"));
    assert!(body.contains("gpu_exporter_gpus{state=\"unreadable\"} 1\n"));
    assert!(body.contains("gpu_exporter_gpus{state=\"healthy\"} 7\n"));
}

#[tokio::test(start_paused = true)]
async fn a_gpu_that_falls_off_the_bus_fails_health_and_comes_back() {
    let sc = scenario::parse(
        "[[event]]\nat = \"10s\"\ngpu = 4\naction = \"fall-off-bus\"\n[[event]]\nat = \"30s\"\ngpu = 4\naction = \"recover\"\n",
        "t.toml",
    )
    .unwrap();
    let src = common::sim("8xH100-SXM", Some((sc, "t.toml".into())));
    let mut h = common::harness(src, common::shipped_catalog(), common::build_options());
    let t0 = body_of(&h.sampler.tick().await);
    assert_eq!(common::series(&t0, "DCGM_FI_DEV_GPU_UTIL").len(), 8);
    let t1 = body_of(&h.sampler.tick().await);
    let util = common::series(&t1, "DCGM_FI_DEV_GPU_UTIL");
    assert_eq!(util.len(), 7, "the lost GPU's series go, the others stay");
    assert!(t1.contains("gpu_exporter_gpus{state=\"lost\"} 1\n"));
    let health: Vec<&str> = common::series(&t1, "DCGM_EXP_GPU_HEALTH_STATUS")
        .into_iter()
        .filter(|l| l.contains("gpu=\"4\"") && l.contains("health_watch=\"ALL\""))
        .collect();
    assert_eq!(health.len(), 1);
    assert!(
        health[0].contains("health_error_code=\"DCGM_FR_FALLEN_OFF_BUS\"")
            && health[0].ends_with(" 20")
    );
    let xid: Vec<&str> = common::series(&t1, "DCGM_FI_DEV_XID_ERRORS")
        .into_iter()
        .filter(|l| l.contains("gpu=\"4\""))
        .collect();
    assert!(xid[0].ends_with(" 79") && xid[0].contains("err_msg=\"GPU has fallen off the bus\""));
    h.sampler.tick().await;
    let t3 = body_of(&h.sampler.tick().await);
    assert_eq!(
        common::series(&t3, "DCGM_FI_DEV_GPU_UTIL").len(),
        8,
        "recovered GPU is back"
    );
    assert!(t3.contains("gpu_exporter_gpus{state=\"lost\"} 0\n"));
}

#[tokio::test(start_paused = true)]
async fn rediscovery_notices_a_vanished_gpu() {
    let hidden = Arc::new(AtomicBool::new(false));
    let mut src = faulty();
    src.hide_gpu = Some((7, Arc::clone(&hidden)));
    let mut h = common::harness(src, common::shipped_catalog(), common::build_options());
    let before = body_of(&h.sampler.tick().await);
    assert_eq!(common::series(&before, "DCGM_FI_DEV_GPU_TEMP").len(), 8);
    hidden.store(true, Ordering::SeqCst);
    // Not yet due: the old device list is kept.
    tokio::time::advance(Duration::from_secs(30)).await;
    let mid = body_of(&h.sampler.tick().await);
    assert_eq!(common::series(&mid, "DCGM_FI_DEV_GPU_TEMP").len(), 8);
    tokio::time::advance(Duration::from_secs(31)).await;
    let after = body_of(&h.sampler.tick().await);
    assert_eq!(common::series(&after, "DCGM_FI_DEV_GPU_TEMP").len(), 7);
    assert!(!after.contains("gpu=\"7\""));
}

#[tokio::test(start_paused = true)]
async fn when_the_selected_gpu_vanishes_the_exporter_degrades_to_not_ready_and_recovers() {
    let hidden = Arc::new(AtomicBool::new(false));
    let mut src = faulty();
    src.hide_gpu = Some((7, Arc::clone(&hidden)));
    let mut opts = common::build_options();
    opts.selection = gpu_exporter::snapshot::DeviceSelection::Gpus(Some(vec![7]));
    let mut h = common::harness(src, common::shipped_catalog(), opts);
    let before = h.sampler.tick().await;
    assert_eq!(before.not_ready, None);
    assert_eq!(
        common::series(&body_of(&before), "DCGM_FI_DEV_GPU_TEMP").len(),
        1
    );
    // GPU 7 falls off: the process keeps running, /ready says why.
    hidden.store(true, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(61)).await;
    let gone = h.sampler.tick().await;
    assert_eq!(
        gone.not_ready.as_deref(),
        Some("-d/--devices \"g:7\" selects none of the 7 GPUs (indices 0, 1, 2, 3, 4, 5, 6) and 0 MIG instances found, so no GPU series would be exported")
    );
    // It comes back: ready again.
    hidden.store(false, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(61)).await;
    let back = h.sampler.tick().await;
    assert_eq!(back.not_ready, None);
    assert_eq!(
        common::series(&body_of(&back), "DCGM_FI_DEV_GPU_TEMP").len(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_catalog_takes_effect_on_the_next_tick() {
    let mut h = common::harness(
        common::sim("1xA100-40GB", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    let before = body_of(&h.sampler.tick().await);
    assert!(before.contains("DCGM_FI_DEV_SM_CLOCK{"));
    let (small, _) = catalog::parse("DCGM_FI_DEV_GPU_TEMP, gauge, temp\n", "new.csv").unwrap();
    h.catalog_tx.send_replace(Arc::new(small));
    let after = body_of(&h.sampler.tick().await);
    assert!(!after.contains("DCGM_FI_DEV_SM_CLOCK"));
    assert_eq!(common::series(&after, "DCGM_FI_DEV_GPU_TEMP").len(), 1);
    // The label-type field is gone too, since the new CSV does not ask for it.
    assert!(!after.contains("DCGM_FI_DRIVER_VERSION="));
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_body() {
    let mut a = common::harness(
        common::sim("4xA100-80GB-MIG", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    let mut b = common::harness(
        common::sim("4xA100-80GB-MIG", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    for _ in 0..3 {
        let x = common::normalise(&a.sampler.tick().await.body);
        let y = common::normalise(&b.sampler.tick().await.body);
        assert_eq!(x, y);
    }
}
