//! HTTP serving: `/metrics`, `/health`, `/ready` and a landing page.
//!
//! `/metrics` clones the body the sampler published; it never touches a GPU or the kubelet, so a
//! scrape costs the same however many Prometheus replicas ask. `router` is a plain function of
//! its state so tests can drive it as a `tower::Service`; `serve` takes the listener and the
//! shutdown future from the caller.
//!
//! `serve_with` owns the connections (hyper directly, not `axum::serve`) so that it can apply
//! [`Limits`]: a header read timeout (slowloris), a header size limit, a connection limit and a
//! request timeout; and the `--web-config-file` settings: TLS, basic auth, a rate limit and
//! extra headers. Every failure of one connection ends that connection only.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::sampler::Published;
use crate::self_metrics::SelfMetrics;
use crate::web::{Active, WebSecurity};

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
        .fallback(not_found)
        .with_state(state)
}

async fn not_found() -> (StatusCode, &'static str) {
    (StatusCode::NOT_FOUND, "not found\n")
}

async fn metrics(State(st): State<AppState>, headers: axum::http::HeaderMap) -> Response {
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
    let vary = (header::VARY, HeaderValue::from_static("Accept-Encoding"));
    let content_type = (header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    let gzip = headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(accepts_gzip);
    if gzip {
        let encoding = (header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        ([content_type, encoding, vary], p.gzip_body().clone()).into_response()
    } else {
        ([content_type, vary], p.body.clone()).into_response()
    }
}

/// Whether an `Accept-Encoding` value accepts gzip: `gzip` (or `x-gzip`) with a non-zero
/// quality, or, when gzip is not named, `*` with a non-zero quality. `gzip;q=0` refuses it.
pub fn accepts_gzip(accept_encoding: &str) -> bool {
    let mut gzip = None;
    let mut any = None;
    for item in accept_encoding.split(',') {
        let mut parts = item.split(';').map(str::trim);
        let coding = parts.next().unwrap_or_default();
        let quality = parts
            .filter_map(|p| p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            gzip = Some(quality);
        } else if coding == "*" {
            any = Some(quality);
        }
    }
    gzip.or(any).is_some_and(|q| q > 0.0)
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

/// Per-connection limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time a client has to send a complete request head (and, with TLS, to finish the
    /// handshake) before the connection is closed. Also closes idle keep-alive connections.
    pub header_read_timeout: Duration,
    /// Time a request may take from its head being read to its response being ready.
    pub request_timeout: Duration,
    /// Largest request head accepted; larger ones get 431. hyper's floor is 8192.
    pub max_header_bytes: usize,
    /// Connections served at once; more are closed on accept.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_header_bytes: 16 * 1024,
            max_connections: 128,
        }
    }
}

/// Serves `router` on `listener` with default [`Limits`] and no web configuration, until
/// `shutdown` resolves, then finishes in-flight requests.
///
/// # Errors
/// None at present (accept errors are logged and retried); the type is kept for callers.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, router, Limits::default(), None, shutdown).await
}

/// Serves `router` on `listener` applying `limits` and, when given, the web configuration
/// (TLS, basic auth, rate limit, headers) until `shutdown` resolves; then lets open
/// connections finish their current request.
///
/// # Errors
/// None at present (accept errors are logged and retried); the type is kept for callers.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    web: Option<Arc<WebSecurity>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stop = CancellationToken::new();
    let max = limits.max_connections.clamp(1, 1_000_000);
    let slots = Arc::new(Semaphore::new(max));
    let limits = Arc::new(limits);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, "connection limit ({max}) reached; closing the new connection");
            drop(stream);
            continue;
        };
        let active = web.as_ref().map(|w| w.current());
        let (router, limits, stop) = (router.clone(), Arc::clone(&limits), stop.clone());
        tokio::spawn(async move {
            serve_connection(stream, router, &limits, active, stop).await;
            drop(permit);
        });
    }
    stop.cancel();
    // Every connection holds a permit until it is done: taking them all waits for the last.
    let _ = slots.acquire_many(max as u32).await;
    Ok(())
}

async fn serve_connection(
    stream: TcpStream,
    router: Router,
    limits: &Limits,
    active: Option<Arc<Active>>,
    stop: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    match active.as_ref().and_then(|a| a.tls.clone()) {
        Some(config) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            let handshake =
                tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream));
            match handshake.await {
                Ok(Ok(tls)) => serve_http1(TokioIo::new(tls), router, limits, active, stop).await,
                Ok(Err(e)) => tracing::debug!("TLS handshake failed: {e}"),
                Err(_) => tracing::debug!("TLS handshake timed out"),
            }
        }
        None => serve_http1(TokioIo::new(stream), router, limits, active, stop).await,
    }
}

async fn serve_http1<I>(
    io: I,
    router: Router,
    limits: &Limits,
    active: Option<Arc<Active>>,
    stop: CancellationToken,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let request_timeout = limits.request_timeout;
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        handle(router.clone(), request_timeout, active.clone(), req)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r {
            tracing::debug!("HTTP connection ended: {e}");
        },
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

fn plain(status: StatusCode, body: &'static str) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

async fn handle(
    router: Router,
    request_timeout: Duration,
    active: Option<Arc<Active>>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response, Infallible> {
    let work = async {
        if let Some(a) = &active {
            if a.rate_limit.as_ref().is_some_and(|r| !r.allow()) {
                return plain(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded\n");
            }
            if let Some(auth) = &a.auth {
                let given = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .map(HeaderValue::as_bytes);
                if !auth.allows(given).await {
                    let mut r = plain(StatusCode::UNAUTHORIZED, "unauthorized\n");
                    r.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        HeaderValue::from_static("Basic realm=\"gpu-exporter\""),
                    );
                    return r;
                }
            }
        }
        match router.oneshot(req.map(axum::body::Body::new)).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    };
    let mut response = match tokio::time::timeout(request_timeout, work).await {
        Ok(r) => r,
        Err(_) => plain(StatusCode::SERVICE_UNAVAILABLE, "request timed out\n"),
    };
    if let Some(a) = &active {
        for (k, v) in &a.headers {
            response.headers_mut().insert(k.clone(), v.clone());
        }
    }
    Ok(response)
}
