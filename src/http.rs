//! HTTP serving: `/metrics`, `/health`, `/ready` and a landing page.
//!
//! `/metrics` clones the body the sampler published; it never touches a GPU or the kubelet, so a
//! scrape costs the same however many Prometheus replicas ask. `router` is a plain function of
//! its state so tests can drive it as a `tower::Service`; `serve` takes the listener and the
//! shutdown future from the caller.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::sampler::Published;
use crate::self_metrics::SelfMetrics;

/// The content type of Prometheus text format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the handlers read.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The latest published sample (`None` until the first one).
    pub published: watch::Receiver<Option<Arc<Published>>>,
    /// The sampling interval; `/ready` fails when the last sample is older than three of them.
    pub interval: Duration,
    /// Self-metrics (scrape counter).
    pub metrics: Arc<SelfMetrics>,
}

/// Builds the router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/", get(index))
        .with_state(state)
}

async fn metrics(State(st): State<AppState>) -> Response {
    let published = st.published.borrow().clone();
    let Some(p) = published else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            )],
            "no sample taken yet\n",
        )
            .into_response();
    };
    st.metrics.scrapes.fetch_add(1, Ordering::Relaxed);
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE))],
        p.body.clone(),
    )
        .into_response()
}

async fn health() -> &'static str {
    "OK\n"
}

async fn ready(State(st): State<AppState>) -> (StatusCode, String) {
    let published = st.published.borrow().clone();
    match published {
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no sample taken yet\n".into(),
        ),
        Some(p) if p.not_ready.is_some() => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: {}\n",
                p.not_ready.as_deref().unwrap_or_default()
            ),
        ),
        Some(p) => {
            let age = Instant::now().duration_since(p.at);
            if age > st.interval * 3 {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "not ready: last sample is {:.1}s old (more than 3 intervals of {:.1}s)\n",
                        age.as_secs_f64(),
                        st.interval.as_secs_f64()
                    ),
                )
            } else {
                (StatusCode::OK, "ready\n".into())
            }
        }
    }
}

async fn index() -> Html<&'static str> {
    Html(concat!(
        "<!doctype html><html><head><title>gpu-exporter</title></head><body>",
        "<h1>gpu-exporter</h1><p>Prometheus exporter for NVIDIA GPUs (version ",
        env!("CARGO_PKG_VERSION"),
        ").</p><ul><li><a href=\"/metrics\">/metrics</a></li>",
        "<li><a href=\"/health\">/health</a></li><li><a href=\"/ready\">/ready</a></li></ul>",
        "</body></html>\n"
    ))
}

/// Serves `router` on `listener` until `shutdown` resolves, then finishes in-flight requests.
///
/// # Errors
/// The I/O error that stopped the server.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
