//! A connection's byte stream and response bodies, wrapped to report activity to its
//! [`Conn`] (reads, flushes, the end of a response), which moves it through its phases.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::conn::{Conn, HandshakeIo};

/// A connection's byte stream once its first byte arrived (and its TLS handshake, if any).
/// One type for both, so that hyper's connection code is built once: a second copy made the
/// compiler keep parts of the plain one out of line, at a cost on every scrape.
#[derive(Debug)]
pub enum Stream {
    /// Plain TCP.
    Plain(tokio::net::TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::server::TlsStream<HandshakeIo>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Wraps a connection's byte stream to report reads and flushes to its [`Conn`].
#[derive(Debug)]
pub struct Tracked<I> {
    inner: I,
    conn: Arc<Conn>,
}

impl<I> Tracked<I> {
    /// Wraps `inner`.
    pub fn new(inner: I, conn: Arc<Conn>) -> Self {
        Self { inner, conn }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        match r {
            Poll::Ready(Ok(())) if buf.filled().len() > before => self.conn.read_some(),
            Poll::Pending => self.conn.quiet(),
            _ => {}
        }
        r
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Tracked<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            self.conn.quiet();
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A response body that tells its [`Conn`] when hyper has taken all of it.
#[derive(Debug)]
pub struct TrackedBody<B> {
    inner: B,
    conn: Arc<Conn>,
}

impl<B> TrackedBody<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, conn: Arc<Conn>) -> Self {
        Self { inner, conn }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None)) {
            self.conn.body_done();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for TrackedBody<B> {
    fn drop(&mut self) {
        self.conn.body_done();
    }
}
