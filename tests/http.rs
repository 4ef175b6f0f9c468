//! HTTP: the router as a `tower::Service` (status codes, content type, body identity, readiness
//! going stale under paused time) and one real server on 127.0.0.1:0 running the whole pipeline.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use bytes::Bytes;
use gpu_exporter::http::{router, AppState, HttpMetrics, CONTENT_TYPE};
use gpu_exporter::sampler::Published;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const INTERVAL: Duration = Duration::from_secs(10);

fn app() -> (
    axum::Router,
    watch::Sender<Option<Arc<Published>>>,
    Arc<HttpMetrics>,
) {
    let (tx, rx) = watch::channel(None);
    let metrics = Arc::new(HttpMetrics::default());
    let r = router(AppState {
        published: rx,
        interval: INTERVAL,
        metrics: Arc::clone(&metrics),
    });
    (r, tx, metrics)
}

async fn call(r: &axum::Router, method: Method, uri: &str) -> (StatusCode, Option<String>, Bytes) {
    let resp = r
        .clone()
        .oneshot(
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, ct, body)
}

fn publish(tx: &watch::Sender<Option<Arc<Published>>>, body: &'static str) {
    tx.send_replace(Some(Arc::new(Published::new(
        Bytes::from_static(body.as_bytes()),
        Instant::now(),
        1,
        None,
    ))));
}

#[tokio::test]
async fn before_the_first_sample_metrics_and_ready_are_503_and_health_is_200() {
    let (r, _tx, _) = app();
    let (s, _, body) = call(&r, Method::GET, "/metrics").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "no sample taken yet\n");
    let (s, _, body) = call(&r, Method::GET, "/ready").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(std::str::from_utf8(&body).unwrap().contains("no sample"));
    let (s, _, body) = call(&r, Method::GET, "/health").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body, "OK\n");
}

#[tokio::test]
async fn metrics_serves_the_published_bytes_with_the_0_0_4_content_type() {
    let (r, tx, metrics) = app();
    publish(&tx, "# HELP x h\n# TYPE x gauge\nx 1\n");
    let (s, ct, body) = call(&r, Method::GET, "/metrics").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(ct.as_deref(), Some(CONTENT_TYPE));
    assert_eq!(
        ct.as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert_eq!(body, "# HELP x h\n# TYPE x gauge\nx 1\n");
    let (s, _, body) = call(&r, Method::HEAD, "/metrics").await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.is_empty());
    assert_eq!(metrics.scrapes(), 2);
    // A new sample replaces the body.
    publish(&tx, "x 2\n");
    assert_eq!(call(&r, Method::GET, "/metrics").await.2, "x 2\n");
}

#[tokio::test]
async fn unknown_paths_and_methods_get_clean_4xx() {
    let (r, tx, _) = app();
    publish(&tx, "x 1\n");
    assert_eq!(
        call(&r, Method::GET, "/nope").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&r, Method::POST, "/metrics").await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    let (s, ct, body) = call(&r, Method::GET, "/").await;
    assert_eq!(s, StatusCode::OK);
    assert!(ct.unwrap().starts_with("text/html"));
    assert!(std::str::from_utf8(&body).unwrap().contains("/metrics"));
}

#[tokio::test(start_paused = true)]
async fn ready_goes_503_when_the_last_sample_is_older_than_three_intervals() {
    let (r, tx, _) = app();
    publish(&tx, "x 1\n");
    assert_eq!(call(&r, Method::GET, "/ready").await.0, StatusCode::OK);
    tokio::time::advance(INTERVAL * 3).await;
    assert_eq!(call(&r, Method::GET, "/ready").await.0, StatusCode::OK);
    tokio::time::advance(Duration::from_millis(1)).await;
    let (s, _, body) = call(&r, Method::GET, "/ready").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        std::str::from_utf8(&body)
            .unwrap()
            .contains("more than 3 intervals"),
        "{body:?}"
    );
    // Metrics keep serving the last sample meanwhile; a fresh sample makes it ready again.
    assert_eq!(call(&r, Method::GET, "/metrics").await.0, StatusCode::OK);
    publish(&tx, "x 2\n");
    assert_eq!(call(&r, Method::GET, "/ready").await.0, StatusCode::OK);
}

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn real_server_on_loopback_serves_the_sim_fleet_and_shuts_down_gracefully() {
    let h = common::harness(
        common::sim("8xH100-SXM", None),
        common::shipped_catalog(),
        common::build_options(),
    );
    let shutdown = CancellationToken::new();
    let (pub_tx, mut pub_rx) = watch::channel(None);
    let sampler = tokio::spawn(h.sampler.run(pub_tx, shutdown.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let r = router(AppState {
        published: pub_rx.clone(),
        interval: INTERVAL,
        metrics: Arc::clone(&h.metrics.http),
    });
    let stop = shutdown.clone();
    let server = tokio::spawn(gpu_exporter::http::serve(listener, r, async move {
        stop.cancelled().await
    }));

    // Wait for the first sample through the channel, not a sleep.
    pub_rx.wait_for(Option::is_some).await.unwrap();
    let resp = get(addr, "/metrics").await;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
        "{head}"
    );
    assert_eq!(common::series(body, "DCGM_FI_DEV_GPU_UTIL").len(), 8);
    assert!(get(addr, "/ready").await.starts_with("HTTP/1.1 200"));

    shutdown.cancel();
    server.await.unwrap().unwrap();
    sampler.await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener still open after shutdown"
    );
}

async fn get_with_encoding(
    r: &axum::Router,
    accept_encoding: Option<&str>,
) -> (Option<String>, Option<String>, Bytes) {
    let mut req = Request::builder().method(Method::GET).uri("/metrics");
    if let Some(ae) = accept_encoding {
        req = req.header("accept-encoding", ae);
    }
    let resp = r
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (encoding, vary) = (header("content-encoding"), header("vary"));
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (encoding, vary, body)
}

#[tokio::test]
async fn metrics_is_gzipped_when_the_scraper_accepts_gzip_and_plain_otherwise() {
    use std::io::Read as _;
    let (r, tx, _) = app();
    let text = "# HELP x y\n# TYPE x gauge\nx{gpu=\"0\"} 1\n".repeat(200);
    let body: &'static str = Box::leak(text.into_boxed_str());
    publish(&tx, body);

    // What Prometheus sends.
    let prom = "gzip";
    let (encoding, vary, gz) = get_with_encoding(&r, Some(prom)).await;
    assert_eq!(encoding.as_deref(), Some("gzip"));
    assert_eq!(vary.as_deref(), Some("Accept-Encoding"));
    assert!(
        gz.len() * 10 < body.len(),
        "{} bytes compressed to {}",
        body.len(),
        gz.len()
    );
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut plain)
        .expect("valid gzip");
    assert_eq!(plain, body);
    // The same sample is compressed once: a second scrape gets the very same bytes.
    let (_, _, again) = get_with_encoding(&r, Some("deflate, gzip;q=0.5")).await;
    assert_eq!(again.as_ptr(), gz.as_ptr());

    for refused in [
        None,
        Some("identity"),
        Some("gzip;q=0"),
        Some("gzip;q=0, *"),
    ] {
        let (encoding, vary, b) = get_with_encoding(&r, refused).await;
        assert_eq!(encoding, None, "Accept-Encoding {refused:?}");
        assert_eq!(vary.as_deref(), Some("Accept-Encoding"));
        assert_eq!(b, body.as_bytes(), "Accept-Encoding {refused:?}");
    }
}

#[tokio::test]
async fn accept_encoding_on_several_lines_is_one_list() {
    let (r, tx, _) = app();
    publish(&tx, "# HELP x y\n# TYPE x gauge\nx 1\n");
    let get = |lines: &'static [&'static str]| {
        let r = r.clone();
        async move {
            let mut req = Request::builder().method(Method::GET).uri("/metrics");
            for l in lines {
                req = req.header("accept-encoding", *l);
            }
            let resp = r.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            resp.headers()
                .get("content-encoding")
                .map(|v| v.to_str().unwrap().to_owned())
        }
    };
    // gzip refused on one line, anything accepted on the next: gzip stays refused.
    assert_eq!(get(&["gzip;q=0", "*"]).await, None);
    assert_eq!(get(&["*", "gzip;q=0"]).await, None);
    assert_eq!(get(&["identity", "gzip"]).await.as_deref(), Some("gzip"));
    assert_eq!(get(&["br", "*;q=0.5"]).await.as_deref(), Some("gzip"));
}

#[test]
fn accept_encoding_parsing() {
    use gpu_exporter::http::accepts_gzip;
    for yes in [
        "gzip",
        "GZIP",
        "x-gzip",
        "br, gzip",
        "gzip;q=0.1",
        "*",
        "deflate, *;q=1",
    ] {
        assert!(accepts_gzip(yes), "{yes}");
    }
    // Malformed values (garbage, empty items, names that only look like gzip) refuse it.
    for no in [
        "",
        "identity",
        "br, deflate",
        "gzip;q=0",
        "gzip; q=0.0",
        "*;q=0",
        "gzip;q=0, *",
        ";;,,",
        "gzi",
        "gzipx",
        "\u{1}gzip",
    ] {
        assert!(!accepts_gzip(no), "{no}");
    }
}

fn app_with(
    opts: gpu_exporter::http::HttpOptions,
) -> (axum::Router, watch::Sender<Option<Arc<Published>>>) {
    let (tx, rx) = watch::channel(None);
    let r = gpu_exporter::http::router_with(
        AppState {
            published: rx,
            interval: INTERVAL,
            metrics: Arc::new(HttpMetrics::default()),
        },
        opts,
    );
    (r, tx)
}

#[tokio::test]
async fn max_concurrent_scrapes_turns_away_scrapes_past_the_limit_until_one_is_sent() {
    let (r, tx) = app_with(gpu_exporter::http::HttpOptions {
        max_concurrent_scrapes: 1,
        ..Default::default()
    });
    publish(&tx, "x 1\n");
    let req = || Request::get("/metrics").body(Body::empty()).unwrap();
    // The first response is not sent yet (its body is held): it holds the one slot.
    let first = r.clone().oneshot(req()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let (status, _, body) = call(&r, Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        &body[..],
        b"too many concurrent scrapes (--max-concurrent-scrapes)\n"
    );
    // Probes are not scrapes.
    assert_eq!(call(&r, Method::GET, "/health").await.0, StatusCode::OK);
    let sent = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&sent[..], b"x 1\n");
    let (status, _, body) = call(&r, Method::GET, "/metrics").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"x 1\n"[..]));
}

#[tokio::test]
async fn health_require_gpus_fails_health_until_a_gpu_series_is_published() {
    let (r, tx) = app_with(gpu_exporter::http::HttpOptions {
        health_require_gpus: true,
        ..Default::default()
    });
    assert_eq!(
        call(&r, Method::GET, "/health").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let with = |series| {
        Some(Arc::new(Published::new(
            Bytes::from_static(b"x 1\n"),
            Instant::now(),
            series,
            None,
        )))
    };
    tx.send_replace(with(0));
    let (status, _, body) = call(&r, Method::GET, "/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(std::str::from_utf8(&body).unwrap().contains("no GPU"));
    tx.send_replace(with(3));
    assert_eq!(call(&r, Method::GET, "/health").await.0, StatusCode::OK);
    // Without the flag /health does not look at GPUs.
    let (r, tx) = app_with(Default::default());
    tx.send_replace(with(0));
    assert_eq!(call(&r, Method::GET, "/health").await.0, StatusCode::OK);
}

/// Sends `request` to `addr` and returns the response's status line, the headers named in
/// `keep` (lower case, in that order) and the body.
async fn exchange(
    addr: std::net::SocketAddr,
    request: &str,
    keep: &[&str],
) -> (String, Vec<String>, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(out[..split].to_vec()).unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().to_owned();
    let headers: Vec<String> = lines.map(str::to_ascii_lowercase).collect();
    let kept = keep
        .iter()
        .filter_map(|k| {
            headers
                .iter()
                .find(|h| h.starts_with(&format!("{k}:")))
                .cloned()
        })
        .collect();
    (status, kept, out[split + 4..].to_vec())
}

#[tokio::test]
async fn the_exporters_direct_metrics_answer_is_the_routers_answer() {
    let (tx, rx) = watch::channel(None);
    let state = || AppState {
        published: rx.clone(),
        interval: INTERVAL,
        metrics: Arc::new(HttpMetrics::default()),
    };
    let text = "# HELP x y\n# TYPE x gauge\nx{gpu=\"0\"} 1\n".repeat(50);
    publish(&tx, Box::leak(text.into_boxed_str()));
    let stop = CancellationToken::new();
    let mut addrs = Vec::new();
    // What the exporter serves (GET /metrics answered without the router), and the router.
    let apps: [gpu_exporter::http::App; 2] = [
        gpu_exporter::http::app_with(state(), Default::default()),
        gpu_exporter::http::router_with(state(), Default::default()).into(),
    ];
    for app in apps {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        let stop = stop.clone();
        tokio::spawn(gpu_exporter::http::serve(listener, app, async move {
            stop.cancelled().await
        }));
    }
    let keep = [
        "content-type",
        "content-encoding",
        "content-length",
        "vary",
        "transfer-encoding",
    ];
    for request in [
        "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        "GET /metrics?x=1 HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nHost: t\r\nAccept-Encoding: br\r\nAccept-Encoding: *;q=0.1\r\nConnection: close\r\n\r\n",
        "HEAD /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        "POST /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        "GET /metrics/ HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    ] {
        let direct = exchange(addrs[0], request, &keep).await;
        let routed = exchange(addrs[1], request, &keep).await;
        assert_eq!(direct, routed, "{request:?}");
    }
    // And the answers are what they should be (not just equal).
    let (status, headers, body) = exchange(
        addrs[0],
        "GET /metrics HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
        &keep,
    )
    .await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(
        headers.contains(&"content-encoding: gzip".to_owned()),
        "{headers:?}"
    );
    assert_eq!(&body[..2], &[0x1f, 0x8b]);
    stop.cancel();
}
