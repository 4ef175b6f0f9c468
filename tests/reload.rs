//! Metrics CSV hot reload through the real loop: a file on disk, SIGHUP-style requests and
//! polling, observed through the catalog channel the sampler reads and the self-metrics.

use std::sync::Arc;
use std::time::Duration;

use gpu_exporter::catalog::{self, Catalog};
use gpu_exporter::exporter_metrics::ExporterMetrics as SelfMetrics;
use gpu_exporter::reload::CatalogReloader;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const OLD: &str = "DCGM_FI_DEV_GPU_TEMP, gauge, Temperature (in C).\n";
const NEW: &str = "DCGM_FI_DEV_GPU_TEMP, gauge, Temperature (in C).\nDCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\n";
const BAD: &str =
    "DCGM_FI_DEV_GPU_TEMP, gauge, Temperature (in C).\nDCGM_FI_DEV_POWER_USAGE, gauge\n";

fn names(c: &Catalog) -> Vec<&str> {
    c.metrics.iter().map(|m| m.name.as_str()).collect()
}

fn self_metrics_text(m: &SelfMetrics) -> String {
    m.text()
}

async fn wait_for(m: &SelfMetrics, needle: &str) {
    for _ in 0..1_000_000 {
        if self_metrics_text(m).contains(needle) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never saw {needle}");
}

#[tokio::test(start_paused = true)]
async fn sighup_rejects_a_bad_file_keeps_the_old_catalog_then_accepts_a_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counters.csv");
    std::fs::write(&path, OLD).unwrap();
    let (initial, _) = catalog::load(&path).unwrap();
    let (tx, mut rx) = watch::channel(Arc::new(initial));
    let (req_tx, req_rx) = mpsc::channel(1);
    let metrics = Arc::new(SelfMetrics::default());
    let stop = CancellationToken::new();
    let reloader = CatalogReloader::new(path.clone(), OLD.as_bytes(), |_| true, "sim");
    let task = tokio::spawn(reloader.run(
        tx,
        req_rx,
        Duration::from_secs(3600),
        Arc::clone(&metrics.reload),
        stop.clone(),
    ));

    std::fs::write(&path, BAD).unwrap();
    req_tx.send(()).await.unwrap();
    // Wait (by yielding, not sleeping) until the loop has counted the rejection.
    wait_for(
        &metrics,
        "gpu_exporter_config_reloads_total{result=\"failure\"} 1",
    )
    .await;
    assert!(
        !rx.has_changed().unwrap(),
        "a rejected file reached the sampler"
    );
    assert_eq!(names(&rx.borrow()), ["DCGM_FI_DEV_GPU_TEMP"]);
    assert!(self_metrics_text(&metrics).contains("gpu_exporter_config_last_reload_success 0"));
    std::fs::write(&path, NEW).unwrap();
    req_tx.send(()).await.unwrap();
    rx.changed().await.unwrap();
    assert_eq!(
        names(&rx.borrow_and_update()),
        ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"]
    );
    let text = self_metrics_text(&metrics);
    assert!(
        text.contains("gpu_exporter_config_reloads_total{result=\"failure\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("gpu_exporter_config_reloads_total{result=\"success\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("gpu_exporter_config_last_reload_success 1"),
        "{text}"
    );

    // A bad file alone: counted, the gauge drops to 0, and the channel keeps the good catalog.
    std::fs::write(&path, BAD).unwrap();
    req_tx.send(()).await.unwrap();
    drop(req_tx);
    task.await.unwrap();
    assert!(!rx.has_changed().unwrap_or(false));
    assert_eq!(rx.borrow().metrics.len(), 2);
    let text = self_metrics_text(&metrics);
    assert!(
        text.contains("gpu_exporter_config_reloads_total{result=\"failure\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("gpu_exporter_config_last_reload_success 0"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_changed_file_is_picked_up_by_polling_without_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counters.csv");
    std::fs::write(&path, OLD).unwrap();
    let (initial, _) = catalog::load(&path).unwrap();
    let (tx, mut rx) = watch::channel(Arc::new(initial));
    let (_req_tx, req_rx) = mpsc::channel(1);
    let metrics = Arc::new(SelfMetrics::default());
    let stop = CancellationToken::new();
    // POWER_USAGE "unsupported" by this source: the reload filters it out as startup does.
    let reloader = CatalogReloader::new(
        path.clone(),
        OLD.as_bytes(),
        |f| f != catalog::Field::PowerUsage,
        "sim",
    );
    let task = tokio::spawn(reloader.run(
        tx,
        req_rx,
        Duration::from_secs(5),
        Arc::clone(&metrics.reload),
        stop.clone(),
    ));
    std::fs::write(&path, NEW.replace("Temperature", "GPU temperature")).unwrap();
    rx.changed().await.unwrap();
    let c = rx.borrow_and_update().clone();
    assert_eq!(names(&c), ["DCGM_FI_DEV_GPU_TEMP"]);
    assert_eq!(c.metrics[0].help, "GPU temperature (in C).");
    stop.cancel();
    task.await.unwrap();
}
