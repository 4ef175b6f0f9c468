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
    /// Something other than a socket is at the path (a directory: a hostPath volume of type
    /// `DirectoryOrCreate` mounted where the socket should be); says what.
    NotASocket(Cause),
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

/// The longest unix socket path the kernel accepts, bytes (`sun_path` is 108 with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// A lazily connected channel to the unix socket at `path`, every call bounded by `timeout`.
/// Nothing is dialled until the first call; after the server restarts the channel reconnects by
/// itself on the next call. Must be called inside a tokio runtime.
///
/// # Errors
/// The reason `path` cannot form an endpoint.
pub fn unix_channel(path: &Path, timeout: Duration) -> Result<Channel, Cause> {
    let abs = std::path::absolute(path)?;
    let text = abs.to_str().ok_or("the path is not valid UTF-8")?;
    if text.len() > MAX_SOCKET_PATH {
        return Err(format!(
            "the path is {} bytes long; a unix socket path can be at most {MAX_SOCKET_PATH} bytes (the kernel's sun_path limit), so it could never be connected: mount the socket's directory at a shorter path",
            text.len()
        )
        .into());
    }
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
                _ => match not_a_socket(path) {
                    Some(kind) => Failure::NotASocket(
                        format!("{} is {kind}, not a socket", path.display()).into(),
                    ),
                    None => Failure::Unavailable(cause()),
                },
            }
        }
        _ => Failure::Rejected(cause()),
    }
}

/// What is at `path` if it exists and is not a socket.
fn not_a_socket(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::metadata(path).ok()?.file_type();
    if t.is_socket() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_file() {
        Some("a regular file")
    } else {
        Some("neither a socket nor a directory")
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
        // A real socket (nobody accepting on it matters not: only its existence is looked at).
        let sockets = tempfile::tempdir().unwrap();
        let here = sockets.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&here).unwrap();
        let c = |code, msg: &str| classify(&tonic::Status::new(code, msg), &here);
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
        // A directory at the socket path (a hostPath volume created as a directory): not
        // "unavailable" (the kubelet restarting), but what it is.
        let dir = tempfile::tempdir().unwrap();
        match classify(&tonic::Status::new(Code::Unavailable, ""), dir.path()) {
            Failure::NotASocket(why) => assert_eq!(
                why.to_string(),
                format!("{} is a directory, not a socket", dir.path().display())
            ),
            f => panic!("{f:?}"),
        }
    }

    #[tokio::test]
    async fn a_socket_path_over_the_kernel_limit_is_refused() {
        let long = format!("/run/{}/kubelet.sock", "d".repeat(100));
        let e = unix_channel(Path::new(&long), Duration::from_secs(1)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the path is 118 bytes long; a unix socket path can be at most 107 bytes (the kernel's sun_path limit), so it could never be connected: mount the socket's directory at a shorter path"
        );
        let fits = format!("/{}", "d".repeat(106));
        assert!(unix_channel(Path::new(&fits), Duration::from_secs(1)).is_ok());
    }
}
