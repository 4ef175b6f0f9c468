//! The routes: `/metrics` (the published body, or its gzipped copy made by the sampler for
//! scrapers that accept it, with `--max-concurrent-scrapes` slots), `/health`, `/ready` and a landing page. A plain
//! function of its state ([`router`]), so tests drive it as a `tower::Service`; the server
//! ([`super::serve_with`]) adds the connection handling and the web configuration around it.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use super::metrics::{HttpMetrics, SCRAPE_SHARDS};
use crate::sampler::Published;

/// The content type of Prometheus text format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the handlers read.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The latest published sample (`None` until the first one).
    pub published: watch::Receiver<Option<Arc<Published>>>,
    /// The sampling interval; `/ready` fails when the last sample is older than three of them.
    pub interval: Duration,
    /// The HTTP server's own series (scrapes counted here).
    pub metrics: Arc<HttpMetrics>,
}

/// What the handlers do beyond serving the published sample.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// `/metrics` responses in flight at once; more get 503 (`--max-concurrent-scrapes`).
    /// 0: no limit.
    pub max_concurrent_scrapes: usize,
    /// `/health` answers 503 while no GPU is collected (`--health-require-gpus`).
    pub health_require_gpus: bool,
}

/// The router's state: the published sample and the options.
#[derive(Debug, Clone)]
struct Shared {
    app: AppState,
    opts: Arc<HttpOptions>,
    in_flight: Arc<AtomicUsize>,
    headers: Arc<ScrapeHeaders>,
    /// The published sample as scrapes take it.
    latest: Arc<Latest>,
}

/// The published sample as scrapes take it, in [`SCRAPE_SHARDS`] parts; each connection keeps
/// to one. A part keeps the sample it took last and looks at the shared one's version, a plain
/// read, before each scrape; only a new sample is taken from the channel. (The channel's lock
/// and the sample's reference count are shared by every scrape: two CPUs taking the same
/// cache line from each other on each scrape cost more than the rest of the scrape's own
/// work.) The first scrape of a new sample hands it to the other parts too, so none keeps an
/// old one alive for long.
#[derive(Debug)]
struct Latest([Part; SCRAPE_SHARDS]);

/// One part, alone on its cache line (two lines: the CPU may fetch in pairs).
#[derive(Debug)]
#[repr(align(128))]
struct Part(Mutex<Taken>);

#[derive(Debug)]
struct Taken {
    rx: watch::Receiver<Option<Arc<Published>>>,
    sample: Option<Arc<Published>>,
}

impl Taken {
    /// Takes the channel's sample if it changed since; whether it did. A closed channel (in
    /// tests) is read each time.
    fn refresh(&mut self) -> bool {
        if matches!(self.rx.has_changed(), Ok(false)) {
            return false;
        }
        self.sample = self.rx.borrow_and_update().clone();
        true
    }
}

impl Latest {
    fn new(rx: &watch::Receiver<Option<Arc<Published>>>) -> Self {
        Latest(std::array::from_fn(|_| {
            let mut rx = rx.clone();
            let sample = rx.borrow_and_update().clone();
            Part(Mutex::new(Taken { rx, sample }))
        }))
    }

    /// What `f` makes of the latest sample, taken through part `shard`.
    fn with<T>(&self, shard: usize, f: impl FnOnce(Option<&Published>) -> T) -> T {
        let shard = shard % SCRAPE_SHARDS;
        let mut part = lock(&self.0[shard]);
        if part.refresh() {
            // The others, unless busy (then they take it at their next scrape).
            for (i, other) in self.0.iter().enumerate() {
                if i != shard {
                    if let Ok(mut o) = other.0.try_lock() {
                        o.refresh();
                    }
                }
            }
        }
        f(part.sample.as_deref())
    }
}

fn lock(part: &Part) -> std::sync::MutexGuard<'_, Taken> {
    part.0.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The headers of a scrape's answer, built once: a copy of a small map costs a fraction of
/// filling one (each insert hashes its name and probes).
#[derive(Debug)]
struct ScrapeHeaders {
    identity: header::HeaderMap,
    gzip: header::HeaderMap,
}

impl ScrapeHeaders {
    fn new() -> Self {
        let identity = header::HeaderMap::from_iter([
            (header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE)),
            (header::VARY, HeaderValue::from_static("Accept-Encoding")),
        ]);
        let mut gzip = identity.clone();
        gzip.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        Self { identity, gzip }
    }
}

/// The paths the kubelet probes. They say nothing but whether the exporter works, so they
/// are served without basic auth or a client certificate (the kubelet has neither) and
/// outside the rate limit; `/metrics` keeps requiring them. docs/security.md.
pub const PROBE_PATHS: [&str; 2] = ["/health", "/ready"];

/// Builds the router.
pub fn router(state: AppState) -> Router {
    router_with(state, HttpOptions::default())
}

/// Builds the router with `opts`.
pub fn router_with(state: AppState, opts: HttpOptions) -> Router {
    app_with(state, opts).router
}

/// What [`super::serve_with`] serves: a router, and, from [`app_with`], the `/metrics`
/// endpoint answered without it. A scrape is the one request served thousands of times a
/// second; the router's per-request machinery (cloning the route, boxing the handler's future,
/// request extensions) cost about as much as the rest of the exporter's work per scrape.
#[derive(Debug, Clone)]
pub struct App {
    pub(super) router: Router,
    metrics: Option<Shared>,
}

impl From<Router> for App {
    fn from(router: Router) -> Self {
        App {
            router,
            metrics: None,
        }
    }
}

impl App {
    /// The answer to `GET /metrics` without the router, when this app has one. `shard`: the
    /// part of the scrape counter the connection counts into ([`HttpMetrics::count_scrape`]).
    #[inline]
    pub(super) fn direct_metrics<B>(
        &self,
        req: &axum::http::Request<B>,
        shard: usize,
    ) -> Option<Response<AnyBody>> {
        let sh = self.metrics.as_ref()?;
        (req.method() == Method::GET && req.uri().path() == "/metrics")
            .then(|| metrics_response(sh, req.headers(), shard))
    }
}

/// The router with `opts`, and `GET /metrics` answered directly (the same answer, without
/// the router's machinery).
pub fn app_with(state: AppState, opts: HttpOptions) -> App {
    let latest = Arc::new(Latest::new(&state.published));
    let shared = Shared {
        app: state,
        opts: Arc::new(opts),
        in_flight: Arc::new(AtomicUsize::new(0)),
        headers: Arc::new(ScrapeHeaders::new()),
        latest,
    };
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/", get(index))
        .fallback(not_found)
        .with_state(shared.clone());
    App {
        router,
        metrics: Some(shared),
    }
}

/// A `/metrics` response slot, given back when the response body is dropped (sent or not).
#[derive(Debug)]
struct ScrapeSlot(Arc<AtomicUsize>);

impl Drop for ScrapeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ScrapeSlot {
    fn take(counter: &Arc<AtomicUsize>, limit: usize) -> Option<ScrapeSlot> {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| ScrapeSlot(Arc::clone(counter)))
    }
}

/// A response body: a scrape's bytes, sent as they are, or any other body (boxed).
#[derive(Debug)]
pub(super) enum AnyBody {
    /// A scrape's answer.
    Scrape(SlotBody),
    /// The router's and the refusals' answers.
    Boxed(axum::body::Body),
}

impl From<axum::body::Body> for AnyBody {
    fn from(b: axum::body::Body) -> Self {
        AnyBody::Boxed(b)
    }
}

impl http_body::Body for AnyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        match self.get_mut() {
            AnyBody::Scrape(b) => std::pin::Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map_err(|never| match never {}))),
            AnyBody::Boxed(b) => std::pin::Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AnyBody::Scrape(b) => b.is_end_stream(),
            AnyBody::Boxed(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            AnyBody::Scrape(b) => b.size_hint(),
            AnyBody::Boxed(b) => b.size_hint(),
        }
    }
}

/// A body of one byte chunk that holds its scrape slot (with `--max-concurrent-scrapes`) until
/// dropped.
#[derive(Debug)]
pub(super) struct SlotBody {
    /// Taken as sent.
    chunk: Option<Bytes>,
    _slot: Option<ScrapeSlot>,
}

impl http_body::Body for SlotBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let next = self.chunk.take();
        std::task::Poll::Ready(next.map(|c| Ok(http_body::Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunk.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.chunk.as_ref().map_or(0, |c| c.len() as u64))
    }
}

async fn not_found() -> (StatusCode, &'static str) {
    (StatusCode::NOT_FOUND, "not found\n")
}

// The request itself, not a `HeaderMap` extractor: that one clones every header per scrape.
async fn metrics(State(sh): State<Shared>, req: axum::extract::Request) -> Response {
    metrics_response(&sh, req.headers(), 0).map(axum::body::Body::new)
}

/// The answer to a scrape with these request headers.
fn metrics_response(sh: &Shared, headers: &header::HeaderMap, shard: usize) -> Response<AnyBody> {
    let st = &sh.app;
    // Several `Accept-Encoding` lines are one comma-separated list (RFC 9110 §5.3). The
    // one line Prometheus sends, `gzip`, needs no parsing.
    let encodings = headers.get_all(header::ACCEPT_ENCODING);
    let mut lines = encodings.iter();
    let gzip = match (lines.next(), lines.next()) {
        (Some(v), None) if v.as_bytes() == b"gzip" => true,
        _ => accepts_gzip_in(encodings.iter().filter_map(|v| v.to_str().ok())),
    };
    let body = sh.latest.with(shard, |p| {
        p.map(|p| {
            if gzip {
                p.gzip_body().clone()
            } else {
                p.body.clone()
            }
        })
    });
    let Some(body) = body else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "no sample taken yet\n").map(AnyBody::from);
    };
    // Without a limit, no slot is counted (a shared counter touched twice per scrape).
    let limit = sh.opts.max_concurrent_scrapes;
    let slot = match limit {
        0 => None,
        _ => match ScrapeSlot::take(&sh.in_flight, limit) {
            Some(slot) => Some(slot),
            None => {
                return plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too many concurrent scrapes (--max-concurrent-scrapes)\n",
                )
                .map(AnyBody::from)
            }
        },
    };
    st.metrics.count_scrape(shard);
    // The `process_*` series (`--enable-exporter-metrics`) are in the body: the sampler reads
    // `/proc` at its tick, so a scrape does no file I/O and no compression.
    let mut response = Response::new(AnyBody::Scrape(SlotBody {
        chunk: Some(body),
        _slot: slot,
    }));
    *response.headers_mut() = if gzip {
        sh.headers.gzip.clone()
    } else {
        sh.headers.identity.clone()
    };
    response
}

/// Whether an `Accept-Encoding` value accepts gzip: `gzip` (or `x-gzip`) with a non-zero
/// quality, or, when gzip is not named, `*` with a non-zero quality. `gzip;q=0` refuses it.
pub fn accepts_gzip(accept_encoding: &str) -> bool {
    accepts_gzip_in([accept_encoding])
}

/// [`accepts_gzip`] for a header sent on several lines: the lines are read as one list, so
/// `gzip;q=0` on one line and `*` on another refuses gzip.
pub fn accepts_gzip_in<'a>(lines: impl IntoIterator<Item = &'a str>) -> bool {
    let mut gzip = None;
    let mut any = None;
    for item in lines.into_iter().flat_map(|l| l.split(',')) {
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

async fn health(State(sh): State<Shared>) -> (StatusCode, &'static str) {
    if sh.opts.health_require_gpus {
        let published = sh.app.published.borrow().clone();
        let gpus = published.is_some_and(|p| p.not_ready.is_none() && p.series > 0);
        if !gpus {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "unhealthy: no GPU is collected (--health-require-gpus)\n",
            );
        }
    }
    (StatusCode::OK, "OK\n")
}

async fn ready(State(sh): State<Shared>) -> (StatusCode, String) {
    let st = &sh.app;
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

/// A short text/plain answer.
pub(super) fn plain(status: StatusCode, body: &'static str) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &'static str) -> Arc<Published> {
        Arc::new(Published::new(
            Bytes::from_static(text.as_bytes()),
            Instant::now(),
            1,
            None,
        ))
    }

    fn body(latest: &Latest, shard: usize) -> Option<Bytes> {
        latest.with(shard, |p| p.map(|p| p.body.clone()))
    }

    #[test]
    fn every_part_serves_the_newest_sample_and_none_keeps_an_old_one() {
        let (tx, rx) = watch::channel(None);
        let latest = Latest::new(&rx);
        assert_eq!(body(&latest, 0), None);
        let first = sample("first\n");
        tx.send_replace(Some(Arc::clone(&first)));
        // Each part sees the new sample on its next scrape, whichever part saw it first.
        for shard in 0..SCRAPE_SHARDS {
            assert_eq!(body(&latest, shard).as_deref(), Some(&b"first\n"[..]));
        }
        // The channel and every part share one sample.
        assert_eq!(Arc::strong_count(&first), 2 + SCRAPE_SHARDS);
        tx.send_replace(Some(sample("second\n")));
        // The first scrape of the new sample, through part 3, takes it into every part; the
        // old one is left to this test alone.
        assert_eq!(body(&latest, 3).as_deref(), Some(&b"second\n"[..]));
        assert_eq!(Arc::strong_count(&first), 1);
        for shard in (0..SCRAPE_SHARDS).rev() {
            assert_eq!(body(&latest, shard).as_deref(), Some(&b"second\n"[..]));
        }
        // Shards past the count wrap around.
        assert_eq!(
            body(&latest, SCRAPE_SHARDS + 3).as_deref(),
            Some(&b"second\n"[..])
        );
    }
}
