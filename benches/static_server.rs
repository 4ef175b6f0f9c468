//! The limit for scrape throughput: an HTTP/1.1 server that answers every request with the same
//! body bytes from memory and does nothing else. Same stack as gpu-exporter's `/metrics` (hyper 1
//! on a 2-worker tokio runtime, keep-alive), minus routing, limits, self-metrics and sampling.
//!
//! ```text
//! cargo build --release --example static-body-server
//! target/release/examples/static-body-server BODY_FILE 127.0.0.1:9499 [gzip]
//! ```
//!
//! With `gzip`, BODY_FILE is taken to be gzip-compressed and sent with `Content-Encoding: gzip`.
//!
//! Used by `benches/load.py`; prints `listening on ADDR` once bound.
#![allow(missing_docs)]

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

type Body = http_body_util::Full<Bytes>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(body_path), Some(addr)) = (args.next(), args.next()) else {
        return Err("usage: static-body-server BODY_FILE LISTEN_ADDR [gzip]".into());
    };
    let gzip = match args.next().as_deref() {
        None => false,
        Some("gzip") => true,
        Some(other) => return Err(format!("third argument {other:?}: only `gzip` is known").into()),
    };
    let body =
        Bytes::from(std::fs::read(&body_path).map_err(|e| format!("BODY_FILE {body_path}: {e}"))?);
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| format!("LISTEN_ADDR {addr}: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(serve(body, addr, gzip))
}

async fn serve(
    body: Bytes,
    addr: SocketAddr,
    gzip: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("bind {addr}: {e}"))?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let body = body.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                let mut resp = Response::new(Body::new(body.clone()));
                resp.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                if gzip {
                    resp.headers_mut()
                        .insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                }
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
