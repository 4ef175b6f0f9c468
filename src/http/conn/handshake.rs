//! A TLS connection's socket during its handshake, which takes one of its client's handshake
//! slots only while the TLS library works on bytes the client sent.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::PollSemaphore;

/// A TLS connection's socket during the handshake: a read waits for the client's bytes without
/// a handshake slot, then takes one of the client's
/// [`MAX_HANDSHAKES_PER_CLIENT`](super::MAX_HANDSHAKES_PER_CLIENT) slots before
/// returning them, and keeps it while the TLS library processes them (signing, key exchange)
/// until it asks for more bytes and none are there. After the handshake
/// ([`HandshakeIo::handshake_done`]) it is a plain socket.
#[derive(Debug)]
pub struct HandshakeIo {
    inner: tokio::net::TcpStream,
    slots: Option<PollSemaphore>,
    slot: Option<OwnedSemaphorePermit>,
}

impl HandshakeIo {
    /// Wraps `inner`, whose reads take one of `slots` (the client's handshake slots).
    pub(super) fn new(inner: tokio::net::TcpStream, slots: Arc<Semaphore>) -> Self {
        Self {
            inner,
            slots: Some(PollSemaphore::new(slots)),
            slot: None,
        }
    }

    /// The handshake is over: the slot is given back and reads are no longer gated.
    pub fn handshake_done(&mut self) {
        self.slots = None;
        self.slot = None;
    }

    /// Whether a handshake slot is held now.
    pub fn holds_slot(&self) -> bool {
        self.slot.is_some()
    }
}

impl AsyncRead for HandshakeIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(slots) = &mut this.slots {
            if this.slot.is_none() {
                // Wait for the client without a slot; then wait for a slot.
                std::task::ready!(this.inner.poll_read_ready(cx))?;
                this.slot = std::task::ready!(slots.poll_acquire(cx));
            }
            let r = Pin::new(&mut this.inner).poll_read(cx, buf);
            if r.is_pending() {
                // Processed everything the client sent: waiting again, without the slot.
                this.slot = None;
            }
            return r;
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for HandshakeIo {
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
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
