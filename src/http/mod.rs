//! HTTP serving: `/metrics`, `/health`, `/ready` and a landing page.
//!
//! `/metrics` clones the body the sampler published; it never touches a GPU or the kubelet, so a
//! scrape costs the same however many Prometheus replicas ask. The routes ([`router`], in
//! `routes.rs`) are a plain function of their state so tests can drive them as a
//! `tower::Service`; `serve` takes the listener and the shutdown future from the caller.
//!
//! `serve_with` owns the connections (hyper directly, not `axum::serve`) so that it can apply
//! [`Limits`]: a deadline for each phase of a connection (TLS handshake, first byte, request
//! head, response, keep-alive idle), a header size limit, and a connection limit at which the
//! least useful connection is evicted rather than the new one refused ([`conn`]); and the
//! `--web-config-file` settings: TLS, basic auth, a per-client rate limit and extra headers.
//! Every failure of one connection ends that connection only.

pub mod conn;
pub mod io;
pub mod limits;
pub mod listen;
pub mod metrics;
mod routes;

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use conn::{Conn, Registry};
use io::{Stream, Tracked, TrackedBody};
pub use limits::Limits;
pub use metrics::{CloseReason, HttpMetrics, RejectReason};
pub use routes::{
    accepts_gzip, accepts_gzip_in, app_with, router, router_with, App, AppState, HttpOptions,
    CONTENT_TYPE, PROBE_PATHS,
};
use routes::{plain, AnyBody};

use crate::web::auth::Verdict;
use crate::web::{Active, WebSecurity};

/// Serves `router` (an `axum::Router` or an [`App`]) on `listener` with default [`Limits`] and no
/// web configuration, until `shutdown` resolves, then finishes in-flight requests.
///
/// # Errors
/// None at present (accept errors are logged and retried); the type is kept for callers.
pub async fn serve(
    listener: TcpListener,
    router: impl Into<App>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let metrics = Arc::new(HttpMetrics::default());
    serve_with(listener, router, Limits::default(), None, metrics, shutdown).await
}

/// Serves `router` (an `axum::Router` or an [`App`]) on `listener` applying `limits` and, when
/// given, the web configuration
/// (TLS, basic auth, rate limit, headers) until `shutdown` resolves; then lets open
/// connections finish their current request. Connection figures go to `metrics`.
///
/// # Errors
/// None at present (accept errors are logged and retried); the type is kept for callers.
pub async fn serve_with(
    listener: TcpListener,
    router: impl Into<App>,
    limits: Limits,
    web: Option<Arc<WebSecurity>>,
    metrics: Arc<HttpMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Arc::new(router.into());
    let stop = CancellationToken::new();
    if let Some(w) = &web {
        // The files are re-read by a thread of their own, never on this loop.
        if let Err(e) = w.spawn_watcher(stop.clone()) {
            tracing::warn!("cannot start the web configuration watcher ({e}); changes to --web-config-file and its certificates will not be seen");
        }
    }
    let registry = Registry::new(&limits, Arc::clone(&metrics));
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
        registry.evictions_settled().await;
        // The TLS configuration in force now serves this connection to its end; credentials,
        // rate limit and headers are looked up for each request.
        let tls = web.as_ref().and_then(|w| w.current().tls.clone());
        let Some(admitted) = registry.admit(peer.ip(), tls.is_some()) else {
            tracing::debug!(%peer, "every connection is busy; refusing the new one");
            continue;
        };
        let ctx = Ctx {
            app: Arc::clone(&app),
            limits: Arc::clone(&limits),
            web: web.clone(),
            tls,
            metrics: Arc::clone(&metrics),
            peer,
        };
        tokio::spawn(async move {
            let mut admitted = admitted;
            admitted.reason = serve_connection(stream, &admitted.conn, ctx).await;
        });
    }
    stop.cancel();
    registry.stop_all();
    registry.drained().await;
    Ok(())
}

/// What one connection's tasks share.
struct Ctx {
    app: Arc<App>,
    limits: Arc<Limits>,
    web: Option<Arc<WebSecurity>>,
    tls: Option<Arc<rustls::ServerConfig>>,
    metrics: Arc<HttpMetrics>,
    peer: SocketAddr,
}

/// Whether the TLS client presented a certificate (verified in the handshake).
fn has_client_cert(s: &tokio_rustls::server::TlsStream<conn::HandshakeIo>) -> bool {
    s.get_ref()
        .1
        .peer_certificates()
        .is_some_and(|c| !c.is_empty())
}

async fn serve_connection(stream: TcpStream, conn: &Arc<Conn>, ctx: Ctx) -> CloseReason {
    let _ = stream.set_nodelay(true);
    let tls = ctx.tls.clone();
    // Nothing is allocated for the connection (no hyper buffers, no TLS state) until its
    // first byte arrives.
    let opening = async {
        // `readable()` may report readiness before any byte arrives; `peek` really waits (and
        // sees 0 at end of stream).
        match stream.peek(&mut [0u8; 1]).await {
            Ok(0) => return Err(CloseReason::Closed),
            Ok(_) => {}
            Err(_) => return Err(CloseReason::Error),
        }
        if !conn.activate() {
            tracing::debug!(peer = %ctx.peer, "every active connection is busy; closing this one");
            return Err(CloseReason::Refused);
        }
        match tls {
            // Boxed, as is the HTTP stage below: an idle connection's task stays small.
            Some(config) => {
                // One of the client's handshake slots is held only while the server processes
                // what the client sent (conn::HandshakeIo), not while it waits for the client.
                let io = conn.handshake_io(stream);
                match Box::pin(tokio_rustls::TlsAcceptor::from(config).accept(io)).await {
                    Ok(mut s) => {
                        s.get_mut().0.handshake_done();
                        conn.handshake_done();
                        Ok(Stream::Tls(Box::new(s)))
                    }
                    // The client went away during the handshake.
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        Err(CloseReason::Closed)
                    }
                    Err(e) => {
                        tracing::debug!(peer = %ctx.peer, "TLS handshake failed: {e}");
                        Err(CloseReason::TlsError)
                    }
                }
            }
            None => Ok(Stream::Plain(stream)),
        }
    };
    let stream = tokio::select! {
        s = opening => match s {
            Ok(s) => s,
            Err(reason) => return reason,
        },
        reason = conn.watchdog(&ctx.limits) => return reason,
    };
    let cert = match &stream {
        Stream::Plain(_) => false,
        Stream::Tls(s) => has_client_cert(s),
    };
    Box::pin(serve_http1(stream, conn, ctx, cert)).await
}

/// Serves HTTP/1 on `io` in a task of its own, and watches it from this one: a deadline that
/// passes, an eviction or a stop (once no request is being answered) aborts that task. The
/// watchdog is polled only when its timer fires or a decision is made for the connection,
/// not on each of the connection's wake-ups (several per request).
async fn serve_http1<I>(io: I, conn: &Arc<Conn>, ctx: Ctx, client_cert: bool) -> CloseReason
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let limits = Arc::clone(&ctx.limits);
    let mut task = AbortOnDrop(tokio::spawn(http1(io, Arc::clone(conn), ctx, client_cert)));
    let task = &mut task.0;
    tokio::select! {
        biased;
        ended = &mut *task => ended.unwrap_or_else(|e| {
            tracing::warn!("an HTTP connection's task failed: {e}");
            CloseReason::Error
        }),
        reason = conn.watchdog(&limits) => {
            task.abort();
            // Its socket is closed once the task is gone, before the connection is counted
            // closed.
            let _ = task.await;
            reason
        }
    }
}

/// A task that ends with its handle: a connection's HTTP task never outlives its watchdog.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The HTTP/1 connection itself, until the client closes it or it fails.
async fn http1<I>(io: I, conn: Arc<Conn>, ctx: Ctx, client_cert: bool) -> CloseReason
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Ctx {
        app,
        limits,
        web,
        tls: _,
        metrics,
        peer,
    } = ctx;
    let per_conn = Arc::new(PerConn {
        app: App::clone(&app),
        request_timeout: limits.request_timeout,
        web,
        metrics,
        client: peer.ip(),
        client_cert,
        shard: conn.shard(),
    });
    let service_conn = Arc::clone(&conn);
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        service_conn.request_started();
        per_conn.answer(req, &service_conn)
    });
    let http = hyper::server::conn::http1::Builder::new()
        // Deadlines are the watchdog's (hyper's header timer would also run while idle).
        .header_read_timeout(None)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .serve_connection(TokioIo::new(Tracked::new(io, Arc::clone(&conn))), service);
    let mut http = std::pin::pin!(http);
    match std::future::poll_fn(|cx| conn.poll_timed(http.as_mut(), cx)).await {
        Ok(()) => CloseReason::Closed,
        Err(e) => {
            tracing::debug!(%peer, "HTTP connection ended: {e}");
            CloseReason::Error
        }
    }
}

/// What one connection's requests need. Held once per connection: a reference count no other
/// connection touches. (The server-wide handles, shared by every connection, would have their
/// counts bounce between CPUs on every scrape.)
struct PerConn {
    app: App,
    request_timeout: Duration,
    web: Option<Arc<WebSecurity>>,
    metrics: Arc<HttpMetrics>,
    client: IpAddr,
    client_cert: bool,
    /// The part of the scrape counter this connection counts into.
    shard: usize,
}

/// A response whose body tells the connection when hyper has taken all of it.
type TrackedResponse = Response<TrackedBody<AnyBody>>;

/// The answer to one request, as hyper polls it: ready when the service is called (a scrape,
/// a refusal, a login whose verdict is cached), or the work that produces it (the router's
/// routes, a login to check with bcrypt), boxed and bounded by the request timeout.
///
/// A ready answer keeps nothing of the request: it is dropped before hyper reads on, so the
/// connection's read buffer is free again and is reused for the next request rather than
/// replaced (hyper reads ahead while an answer is pending, into a buffer the request's headers
/// still share).
enum Answer {
    Ready(Option<TrackedResponse>),
    Later(Pin<Box<dyn Future<Output = TrackedResponse> + Send>>),
}

impl Future for Answer {
    type Output = Result<TrackedResponse, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Answer::Ready(r) => Poll::Ready(Ok(r
                .take()
                .expect("hyper polls a response future only until it is ready"))),
            Answer::Later(work) => work.as_mut().poll(cx).map(Ok),
        }
    }
}

/// `response` with its body tracked for `conn`'s phases.
fn tracked(response: Response<AnyBody>, conn: &Arc<Conn>) -> TrackedResponse {
    response.map(|b| TrackedBody::new(b, Arc::clone(conn)))
}

/// What the web configuration's checks say of a request before it is answered.
enum Gate {
    Pass,
    Refused(Response<AnyBody>),
    /// Credentials to check with bcrypt (or a check of the same ones to wait for).
    CheckLogin,
}

/// A short text/plain answer that ends a request.
fn refusal(status: StatusCode, body: &'static str) -> Response<AnyBody> {
    plain(status, body).map(AnyBody::from)
}

/// The web configuration's extra headers, on every answer.
fn finish(mut response: Response<AnyBody>, active: &Active) -> Response<AnyBody> {
    for (k, v) in &active.headers {
        response.headers_mut().insert(k.clone(), v.clone());
    }
    response
}

impl PerConn {
    fn answer(self: &Arc<Self>, req: Request<hyper::body::Incoming>, conn: &Arc<Conn>) -> Answer {
        // The settings in force for this request: a password revoked since the connection
        // opened no longer works on it.
        let active: Option<Arc<Active>> = self.web.as_ref().map(|w| w.current());
        if let Some(a) = active.as_deref() {
            if !PROBE_PATHS.contains(&req.uri().path()) {
                match self.gate(a, &req) {
                    Gate::Pass => {}
                    Gate::Refused(r) => return Answer::Ready(Some(tracked(finish(r, a), conn))),
                    Gate::CheckLogin => return self.later(active, req, true, conn),
                }
            }
        }
        if let Some(r) = self.app.direct_metrics(&req, self.shard) {
            drop(req);
            let r = match active.as_deref() {
                None => r,
                Some(a) => finish(r, a),
            };
            return Answer::Ready(Some(tracked(r, conn)));
        }
        self.later(active, req, false, conn)
    }

    /// The checks that need no waiting, in order: client certificate, rate limit, cached
    /// login verdict.
    fn gate(&self, a: &Active, req: &Request<hyper::body::Incoming>) -> Gate {
        if a.client_cert_required && !self.client_cert {
            self.metrics.count_rejected(RejectReason::Unauthorized);
            return Gate::Refused(refusal(
                StatusCode::FORBIDDEN,
                "client certificate required (only /health and /ready answer without one)\n",
            ));
        }
        if a.rate_limit.as_ref().is_some_and(|r| !r.allow(self.client)) {
            self.metrics.count_rejected(RejectReason::RateLimit);
            return Gate::Refused(refusal(
                StatusCode::TOO_MANY_REQUESTS,
                "rate limit exceeded\n",
            ));
        }
        let Some(auth) = &a.auth else {
            return Gate::Pass;
        };
        match auth.check_now(authorization(req)) {
            None => Gate::CheckLogin,
            Some(v) => self.refusal_for(v).map_or(Gate::Pass, Gate::Refused),
        }
    }

    /// The answer to a login refused (counted), or `None` when it is allowed.
    fn refusal_for(&self, v: Verdict) -> Option<Response<AnyBody>> {
        match v {
            Verdict::Allowed => None,
            Verdict::Denied => {
                self.metrics.count_rejected(RejectReason::Unauthorized);
                let mut r = refusal(StatusCode::UNAUTHORIZED, "unauthorized\n");
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"gpu-exporter\""),
                );
                Some(r)
            }
            Verdict::Throttled => {
                self.metrics.count_rejected(RejectReason::AuthThrottled);
                Some(refusal(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many failed logins from this client\n",
                ))
            }
        }
    }

    /// The answer that is not ready at once: the login checked first when `check_login`,
    /// then the route; all of it within the request timeout.
    fn later(
        self: &Arc<Self>,
        active: Option<Arc<Active>>,
        req: Request<hyper::body::Incoming>,
        check_login: bool,
        conn: &Arc<Conn>,
    ) -> Answer {
        let me = Arc::clone(self);
        let conn = Arc::clone(conn);
        Answer::Later(Box::pin(async move {
            let work = async {
                let auth = active.as_ref().and_then(|a| a.auth.as_ref());
                if let Some(auth) = auth.filter(|_| check_login) {
                    let v = auth.check(authorization(&req), me.client).await;
                    if let Some(r) = me.refusal_for(v) {
                        return r;
                    }
                }
                me.route(req).await
            };
            let response = match tokio::time::timeout(me.request_timeout, work).await {
                Ok(r) => r,
                Err(_) => refusal(StatusCode::SERVICE_UNAVAILABLE, "request timed out\n"),
            };
            let response = match active.as_deref() {
                None => response,
                Some(a) => finish(response, a),
            };
            tracked(response, &conn)
        }))
    }

    async fn route(&self, req: Request<hyper::body::Incoming>) -> Response<AnyBody> {
        if let Some(r) = self.app.direct_metrics(&req, self.shard) {
            return r;
        }
        match self
            .app
            .router
            .clone()
            .oneshot(req.map(axum::body::Body::new))
            .await
        {
            Ok(r) => r.map(AnyBody::from),
            Err(never) => match never {},
        }
    }
}

/// The request's `Authorization` header value.
fn authorization<B>(req: &Request<B>) -> Option<&[u8]> {
    req.headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes)
}
