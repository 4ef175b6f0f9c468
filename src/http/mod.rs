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
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use conn::{Conn, Decision, Registry};
use io::{Tracked, TrackedBody};
pub use limits::Limits;
pub use metrics::{CloseReason, HttpMetrics, RejectReason};
use routes::plain;
pub use routes::{
    accepts_gzip, accepts_gzip_in, app_with, router, router_with, App, AppState, HttpOptions,
    CONTENT_TYPE, PROBE_PATHS,
};

use crate::web::auth::Verdict;
use crate::web::{Active, WebSecurity};

/// The listen backlog asked for; the kernel caps it at `net.core.somaxconn` (4096 by default
/// since Linux 5.4). A long queue keeps a scraper's SYN from being dropped (and retried a second
/// later) while the server works through a burst of new connections.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds `addr` with [`LISTEN_BACKLOG`] and `SO_REUSEADDR` (as `TcpListener::bind` does).
///
/// # Errors
/// The socket, bind or listen error.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

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

/// The byte stream after the first byte arrived (and the TLS handshake, if any).
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<conn::HandshakeIo>>),
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
    match stream {
        Stream::Plain(s) => Box::pin(serve_http1(s, conn, ctx, false)).await,
        Stream::Tls(s) => {
            let cert = has_client_cert(&s);
            Box::pin(serve_http1(*s, conn, ctx, cert)).await
        }
    }
}

async fn serve_http1<I>(io: I, conn: &Arc<Conn>, ctx: Ctx, client_cert: bool) -> CloseReason
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
    });
    let service_conn = Arc::clone(conn);
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        service_conn.request_started();
        let done = Arc::clone(&service_conn);
        let work = handle(Arc::clone(&per_conn), req);
        async move {
            let response = work.await;
            Ok::<_, Infallible>(response.map(|b| TrackedBody::new(b, done)))
        }
    });
    let http = hyper::server::conn::http1::Builder::new()
        // Deadlines are the watchdog's (hyper's header timer would also run while idle).
        .header_read_timeout(None)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .serve_connection(TokioIo::new(Tracked::new(io, Arc::clone(conn))), service);
    let mut http = std::pin::pin!(http);
    let mut stopping = false;
    loop {
        tokio::select! {
            biased;
            r = http.as_mut() => return match r {
                Ok(()) if stopping => CloseReason::Shutdown,
                Ok(()) => CloseReason::Closed,
                Err(e) => {
                    tracing::debug!(%peer, "HTTP connection ended: {e}");
                    CloseReason::Error
                }
            },
            decision = conn.watch(&limits) => match decision {
                Decision::Close(reason) => return reason,
                Decision::Stop => {
                    stopping = true;
                    http.as_mut().graceful_shutdown();
                }
            },
        }
    }
}

/// What one connection's requests need. Held once per connection and cloned per request: a
/// reference count no other connection touches. (The server-wide handles, shared by every
/// connection, would have their counts bounce between CPUs on every scrape.)
struct PerConn {
    app: App,
    request_timeout: Duration,
    web: Option<Arc<WebSecurity>>,
    metrics: Arc<HttpMetrics>,
    client: IpAddr,
    client_cert: bool,
}

async fn handle(per_conn: Arc<PerConn>, req: Request<hyper::body::Incoming>) -> Response {
    let PerConn {
        app,
        request_timeout,
        web,
        metrics,
        client,
        client_cert,
    } = &*per_conn;
    let (client, client_cert) = (*client, *client_cert);
    // The settings in force for this request: a password revoked since the connection opened
    // no longer works on it.
    let active: Option<Arc<Active>> = web.as_ref().map(|w| w.current());
    let probe = PROBE_PATHS.contains(&req.uri().path());
    let work = async {
        if let Some(a) = active.as_ref().filter(|_| !probe) {
            if a.client_cert_required && !client_cert {
                metrics.count_rejected(RejectReason::Unauthorized);
                return plain(
                    StatusCode::FORBIDDEN,
                    "client certificate required (only /health and /ready answer without one)\n",
                );
            }
            if a.rate_limit.as_ref().is_some_and(|r| !r.allow(client)) {
                metrics.count_rejected(RejectReason::RateLimit);
                return plain(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded\n");
            }
            if let Some(auth) = &a.auth {
                let given = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .map(HeaderValue::as_bytes);
                match auth.check(given, client).await {
                    Verdict::Allowed => {}
                    Verdict::Denied => {
                        metrics.count_rejected(RejectReason::Unauthorized);
                        let mut r = plain(StatusCode::UNAUTHORIZED, "unauthorized\n");
                        r.headers_mut().insert(
                            header::WWW_AUTHENTICATE,
                            HeaderValue::from_static("Basic realm=\"gpu-exporter\""),
                        );
                        return r;
                    }
                    Verdict::Throttled => {
                        metrics.count_rejected(RejectReason::AuthThrottled);
                        return plain(
                            StatusCode::TOO_MANY_REQUESTS,
                            "too many failed logins from this client\n",
                        );
                    }
                }
            }
        }
        if let Some(r) = app.direct_metrics(&req) {
            return r;
        }
        match app
            .router
            .clone()
            .oneshot(req.map(axum::body::Body::new))
            .await
        {
            Ok(r) => r,
            Err(never) => match never {},
        }
    };
    // Most answers (`/metrics` above all) are ready at the first poll: the timer is only set
    // for one that is not, so the common case does not register and cancel a timer.
    let mut work = std::pin::pin!(work);
    let first = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await;
    let mut response = match first {
        Poll::Ready(r) => r,
        Poll::Pending => match tokio::time::timeout(*request_timeout, work).await {
            Ok(r) => r,
            Err(_) => plain(StatusCode::SERVICE_UNAVAILABLE, "request timed out\n"),
        },
    };
    if let Some(a) = &active {
        for (k, v) in &a.headers {
            response.headers_mut().insert(k.clone(), v.clone());
        }
    }
    response
}
