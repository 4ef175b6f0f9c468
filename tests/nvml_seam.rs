//! The NVML backend through the whole pipeline (sampler → snapshot → render → HTTP router):
//! against the fake NVML for GPU loss and XIDs, and against the real library on this machine
//! (no driver) for the not-ready path.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::watch;
use tower::ServiceExt;

use gpu_exporter::catalog;
use gpu_exporter::config::BUILTIN_COUNTERS;
use gpu_exporter::gpu::nvml::{NvmlSource, RetryPolicy};
use gpu_exporter::gpu::GpuSource;
use gpu_exporter::http::{router, AppState, HttpMetrics};
use gpu_exporter::pods::Attribution;
use gpu_exporter::sampler::{Published, Sampler, SamplerMetrics, SamplerOptions};
use gpu_exporter::snapshot::BuildOptions;
use gpu_exporter_testing::fake_nvml::{FakeGpu, FakeNvml};

fn options() -> SamplerOptions {
    SamplerOptions {
        interval: Duration::from_secs(1),
        rediscover_every: Duration::from_secs(60),
        build: BuildOptions {
            hostname_label: "hostname".into(),
            hostname: "node-1".into(),
            replace_blanks_in_model_name: false,
            selection: Default::default(),
            virtual_gpus: false,
            xid_window_ms: 300_000,
            clock_window_ms: 300_000,
            pod_uid: false,
            container_labels: false,
            old_namespace: false,
        },
    }
}

fn sampler<S: GpuSource>(source: Arc<S>) -> Sampler<S> {
    let (mut cat, _) = catalog::parse(BUILTIN_COUNTERS, "default-counters.csv").unwrap();
    cat.retain_supported(|f| source.supports(f));
    let (_ctx, crx) = watch::channel(Arc::new(cat));
    let (_ptx, prx) = watch::channel(Arc::new(Attribution::default()));
    // The senders may drop: the sampler only borrows the last value.
    Sampler::new(source, crx, prx, options(), SamplerMetrics::standalone())
}

async fn get(published: Arc<Published>, path: &str) -> (StatusCode, String) {
    let (_tx, rx) = watch::channel(Some(published));
    let app = router(AppState {
        published: rx,
        interval: Duration::from_secs(1),
        metrics: Arc::new(HttpMetrics::default()),
    });
    let resp = app
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn lines_with<'a>(body: &'a str, name: &str, needle: &str) -> Vec<&'a str> {
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(needle))
        .collect()
}

#[tokio::test]
async fn without_a_driver_ready_is_503_with_the_reason_and_health_is_200() {
    let source = Arc::new(NvmlSource::real(RetryPolicy::default()));
    let Some(err) = source.init_error() else {
        eprintln!("NVML initialised on this machine: the no-driver path cannot be tested here");
        return;
    };
    let text = err.to_string();
    assert!(text.contains("libnvidia-ml.so.1"), "{text}");
    let mut s = sampler(Arc::clone(&source));
    let published = s.tick().await;
    let reason = published.not_ready.clone().expect("not ready without NVML");
    assert!(reason.contains("libnvidia-ml.so.1"), "{reason}");

    let (status, body) = get(Arc::clone(&published), "/ready").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("NVML is not initialised"), "{body}");
    assert!(body.contains("libnvidia-ml.so.1"), "{body}");
    let (status, _) = get(Arc::clone(&published), "/health").await;
    assert_eq!(status, StatusCode::OK);
    // /metrics still answers, with the exporter's own series and no GPU series.
    let (status, body) = get(published, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("gpu_exporter_sample_errors_total"), "{body}");
    assert!(!body.contains("DCGM_FI_DEV_GPU_TEMP{"), "{body}");
}

#[tokio::test]
async fn a_gpu_falling_off_the_bus_fails_its_health_and_the_other_keeps_reporting() {
    let fake = FakeNvml::new("570.172.08", vec![FakeGpu::h100(0), FakeGpu::h100(1)]);
    let f = fake.clone();
    let source = Arc::new(NvmlSource::new(
        move || Ok(f.clone()),
        RetryPolicy::default(),
    ));
    let mut s = sampler(Arc::clone(&source));
    let first = s.tick().await;
    assert!(first.not_ready.is_none());
    let (status, _) = get(Arc::clone(&first), "/ready").await;
    assert_eq!(status, StatusCode::OK);

    fake.update(|st| st.gpus[1].lost = true);
    assert!(fake.raise_xid("GPU-fake-0001", 79));
    assert!(source.wait_for_xids(1, Duration::from_secs(30)));
    let p = s.tick().await;
    let body = std::str::from_utf8(&p.body).unwrap();

    assert_eq!(
        lines_with(body, "DCGM_FI_DEV_GPU_TEMP{", "GPU-fake-0000").len(),
        1,
        "{body}"
    );
    assert!(lines_with(body, "DCGM_FI_DEV_GPU_TEMP{", "GPU-fake-0001").is_empty());
    let fail = lines_with(body, "DCGM_EXP_GPU_HEALTH_STATUS{", "GPU-fake-0001");
    assert!(
        fail.iter().any(|l| l.contains("health_watch=\"ALL\"")
            && l.contains("DCGM_FR_FALLEN_OFF_BUS")
            && l.ends_with(" 20")),
        "{fail:#?}"
    );
    assert!(
        lines_with(body, "DCGM_EXP_XID_ERRORS_COUNT{", "GPU-fake-0001")
            .iter()
            .any(|l| l.contains("xid=\"79\"") && l.ends_with(" 1")),
        "{body}"
    );
    assert!(
        body.lines()
            .any(|l| l == "gpu_exporter_gpus{state=\"lost\"} 1"),
        "{body}"
    );
}
