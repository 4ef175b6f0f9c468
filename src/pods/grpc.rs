//! What the node-local gRPC clients (kubelet pod-resources, container runtime) share: a lazy
//! channel to a unix socket, and the classification of a failed call into the few cases that
//! call for different fixes. Each client wraps [`Failure`] into its own error type, which names
//! its socket and flag.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use super::Cause;

/// Why a call on a unix-socket gRPC channel failed.
#[derive(Debug)]
pub enum Failure {
    /// Nothing exists at the socket path.
    SocketMissing,
    /// The socket exists but may not be opened.
    PermissionDenied(Cause),
    /// Connecting or calling failed (server down or restarting).
    Unavailable(Cause),
    /// No answer in time.
    Timeout,
    /// The server's rate limiter rejected the call.
    RateLimited(Cause),
    /// The reply exceeds the message size limit.
    TooLarge(Cause),
    /// The reply could not be decoded.
    Malformed(Cause),
    /// The server answered with another error (e.g. `Unimplemented`).
    Rejected(Cause),
}

/// A lazily connected channel to the unix socket at `path`, every call bounded by `timeout`.
/// Nothing is dialled until the first call; after the server restarts the channel reconnects by
/// itself on the next call. Must be called inside a tokio runtime.
///
/// # Errors
/// The reason `path` cannot form an endpoint.
pub fn unix_channel(path: &Path, timeout: Duration) -> Result<Channel, Cause> {
    let abs = std::path::absolute(path)?;
    let text = abs.to_str().ok_or("the path is not valid UTF-8")?;
    let endpoint = Endpoint::from_shared(format!("unix://{text}"))?
        .connect_timeout(timeout)
        .timeout(timeout);
    Ok(endpoint.connect_lazy())
}

/// Classifies a failed call on the socket at `path`.
pub fn classify(status: &tonic::Status, path: &Path) -> Failure {
    let cause = || -> Cause { Box::new(status.clone()) };
    match status.code() {
        Code::ResourceExhausted => Failure::RateLimited(cause()),
        Code::OutOfRange if status.message().contains("too large") => Failure::TooLarge(cause()),
        Code::Internal if status.message().contains("decode") => Failure::Malformed(cause()),
        Code::DeadlineExceeded => Failure::Timeout,
        Code::Cancelled if status.message().contains("Timeout") => Failure::Timeout,
        // Cancelled otherwise: the transport dropped the call (the peer closed the connection).
        Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled => {
            match io_kind(status) {
                Some(io::ErrorKind::NotFound) => Failure::SocketMissing,
                Some(io::ErrorKind::PermissionDenied) => Failure::PermissionDenied(cause()),
                _ if !path.exists() => Failure::SocketMissing,
                _ => Failure::Unavailable(cause()),
            }
        }
        _ => Failure::Rejected(cause()),
    }
}

/// The kind of the first I/O error in `status`'s cause chain.
fn io_kind(status: &tonic::Status) -> Option<io::ErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        cur = e.source();
    }
    None
}

/// Strips a `unix://` scheme (the CRI endpoint form, e.g. `unix:///run/containerd/containerd.sock`)
/// and returns the socket path. `None` for other schemes (`tcp://`, `npipe://`), which are not
/// node-local sockets.
pub fn socket_path(endpoint: &str) -> Option<PathBuf> {
    match endpoint.split_once("://") {
        Some(("unix", rest)) => Some(PathBuf::from(rest)),
        Some(_) => None,
        None => Some(PathBuf::from(endpoint)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_sockets_with_or_without_scheme() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock"),
            Some(PathBuf::from("/run/containerd/containerd.sock"))
        );
        assert_eq!(
            socket_path("/run/crio/crio.sock"),
            Some(PathBuf::from("/run/crio/crio.sock"))
        );
        assert_eq!(socket_path("tcp://127.0.0.1:1234"), None);
        assert_eq!(socket_path("npipe:////./pipe/containerd"), None);
    }

    #[test]
    fn status_codes_map_to_failures() {
        let here = Path::new("/");
        let c = |code, msg: &str| classify(&tonic::Status::new(code, msg), here);
        assert!(matches!(
            c(Code::ResourceExhausted, "x"),
            Failure::RateLimited(_)
        ));
        assert!(matches!(
            c(Code::OutOfRange, "message too large"),
            Failure::TooLarge(_)
        ));
        assert!(matches!(
            c(Code::Internal, "failed to decode"),
            Failure::Malformed(_)
        ));
        assert!(matches!(c(Code::DeadlineExceeded, ""), Failure::Timeout));
        assert!(matches!(c(Code::Unimplemented, ""), Failure::Rejected(_)));
        // Unavailable on a path that exists is the server being down; on a missing path, the
        // socket is missing.
        assert!(matches!(c(Code::Unavailable, ""), Failure::Unavailable(_)));
        let gone = classify(
            &tonic::Status::new(Code::Unavailable, ""),
            Path::new("/nonexistent/socket"),
        );
        assert!(matches!(gone, Failure::SocketMissing));
    }
}
