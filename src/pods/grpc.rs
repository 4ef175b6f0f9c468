//! What the node-local gRPC clients (kubelet pod-resources, container runtime) share: a lazy
//! channel to a unix socket, and the classification of a failed call into the few cases that
//! call for different fixes, and the one error type, [`GrpcError`], that both clients report:
//! each names its socket, flag, reasons and fixes in a [`ClientTable`].

use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::Code;

/// A boxed cause.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// What differs between the clients in their errors: how they name themselves, their flag, the
/// `reason` of a bad endpoint and what to do about each failure.
#[derive(Debug)]
pub struct ClientTable {
    /// Who answers, in a sentence (`the kubelet`).
    pub subject: &'static str,
    /// What the socket is, after "no … socket at" (`kubelet pod-resources`).
    pub socket: &'static str,
    /// The flag that names the socket.
    pub flag: &'static str,
    /// Why a bad endpoint is bad, after the flag and its value.
    pub not_usable: &'static str,
    /// The `reason` label of a bad endpoint.
    pub invalid_reason: &'static str,
    /// Every `reason` label value, sorted.
    pub reasons: &'static [&'static str],
    /// What to do about a bad endpoint.
    pub invalid_hint: &'static str,
    /// What to do about a missing socket.
    pub socket_missing_hint: &'static str,
    /// What to do about a socket that may not be opened.
    pub permission_denied_hint: &'static str,
    /// What to do about a server that does not answer.
    pub unavailable_hint: &'static str,
    /// What to do about a call that timed out.
    pub timeout_hint: &'static str,
    /// What to do about a rate-limited call.
    pub rate_limited_hint: &'static str,
    /// What to do about a reply too large or not decodable.
    pub malformed_hint: &'static str,
    /// What to do about a call the server rejected.
    pub rejected_hint: &'static str,
}

/// A node-local gRPC client, named by its [`ClientTable`].
pub trait Client: std::fmt::Debug + Send + Sync + 'static {
    /// The client's names, reasons and fixes.
    const TABLE: ClientTable;
}

/// Why a node-local gRPC client (`C`: [`super::kubelet`], [`super::cri`]) gave no usable answer.
/// Each variant names the socket and has a `reason` label ([`GrpcError::reason`]) and a fix
/// ([`GrpcError::hint`]) from `C`'s table.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError<C: Client> {
    /// The endpoint (the flag's value) is not a usable unix socket.
    #[error("{} {endpoint}: {}", C::TABLE.flag, C::TABLE.not_usable)]
    InvalidEndpoint {
        /// What was given.
        endpoint: String,
        /// The cause.
        #[source]
        cause: Cause,
    },
    /// Nothing exists at the socket path.
    #[error("no {} socket at {}", C::TABLE.socket, path.display())]
    SocketMissing {
        /// The path.
        path: PathBuf,
    },
    /// The socket exists but may not be opened.
    #[error("no permission to connect to {}", path.display())]
    PermissionDenied {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        cause: Cause,
    },
    /// Connecting or calling failed (server down or restarting).
    #[error("{} is not answering on {}", C::TABLE.subject, path.display())]
    Unavailable {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        cause: Cause,
    },
    /// No answer in time.
    #[error("{} did not answer {call} on {} within {after:?}", C::TABLE.subject, path.display())]
    Timeout {
        /// The path.
        path: PathBuf,
        /// The call.
        call: &'static str,
        /// The per-call timeout.
        after: Duration,
    },
    /// The server's rate limiter rejected the call.
    #[error("{} rate-limited {call} on {}", C::TABLE.subject, path.display())]
    RateLimited {
        /// The path.
        path: PathBuf,
        /// The call.
        call: &'static str,
        /// The cause.
        #[source]
        cause: Cause,
    },
    /// The reply exceeds the message size limit.
    #[error("the {call} reply on {} is larger than the {limit}-byte limit", path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// The call.
        call: &'static str,
        /// The limit in bytes.
        limit: usize,
        /// The cause.
        #[source]
        cause: Cause,
    },
    /// The reply could not be decoded.
    #[error("the {call} reply on {} could not be decoded", path.display())]
    Malformed {
        /// The path.
        path: PathBuf,
        /// The call.
        call: &'static str,
        /// The cause.
        #[source]
        cause: Cause,
    },
    /// The server answered with another error (e.g. `Unimplemented`).
    #[error("{} rejected {call} on {}", C::TABLE.subject, path.display())]
    Rejected {
        /// The path.
        path: PathBuf,
        /// The call.
        call: &'static str,
        /// The cause.
        #[source]
        cause: Cause,
    },
    /// Never made: holds the client type.
    #[doc(hidden)]
    #[error("unreachable")]
    _Client(std::convert::Infallible, PhantomData<C>),
}

impl<C: Client> GrpcError<C> {
    /// Every `reason` label value, for pre-initialised counters.
    pub const REASONS: &'static [&'static str] = C::TABLE.reasons;

    /// The error for a failed `call` on the socket at `path`, bounded by `timeout`, whose replies
    /// may be up to `limit` bytes.
    pub fn from_status(
        status: &tonic::Status,
        path: &Path,
        call: &'static str,
        timeout: Duration,
        limit: usize,
    ) -> Self {
        let path = path.to_owned();
        match classify(status, &path) {
            Failure::SocketMissing => Self::SocketMissing { path },
            Failure::NotASocket(cause) => Self::InvalidEndpoint {
                endpoint: path.display().to_string(),
                cause,
            },
            Failure::PermissionDenied(cause) => Self::PermissionDenied { path, cause },
            Failure::Unavailable(cause) => Self::Unavailable { path, cause },
            Failure::Timeout => Self::Timeout {
                path,
                call,
                after: timeout,
            },
            Failure::RateLimited(cause) => Self::RateLimited { path, call, cause },
            Failure::TooLarge(cause) => Self::TooLarge {
                path,
                call,
                limit,
                cause,
            },
            Failure::Malformed(cause) => Self::Malformed { path, call, cause },
            Failure::Rejected(cause) => Self::Rejected { path, call, cause },
        }
    }

    /// The `reason` label for the client's errors counter.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidEndpoint { .. } => C::TABLE.invalid_reason,
            Self::SocketMissing { .. } => "socket_missing",
            Self::PermissionDenied { .. } => "permission_denied",
            Self::Unavailable { .. } => "unavailable",
            Self::Timeout { .. } => "timeout",
            Self::RateLimited { .. } => "rate_limited",
            Self::TooLarge { .. } => "too_large",
            Self::Malformed { .. } => "malformed",
            Self::Rejected { .. } => "rejected",
            Self::_Client(never, _) => match *never {},
        }
    }

    /// What to do about it, for the log.
    pub fn hint(&self) -> &'static str {
        let t = &C::TABLE;
        match self {
            Self::InvalidEndpoint { .. } => t.invalid_hint,
            Self::SocketMissing { .. } => t.socket_missing_hint,
            Self::PermissionDenied { .. } => t.permission_denied_hint,
            Self::Unavailable { .. } => t.unavailable_hint,
            Self::Timeout { .. } => t.timeout_hint,
            Self::RateLimited { .. } => t.rate_limited_hint,
            Self::TooLarge { .. } | Self::Malformed { .. } => t.malformed_hint,
            Self::Rejected { .. } => t.rejected_hint,
            Self::_Client(never, _) => match *never {},
        }
    }
}

/// Every `reason` value of a client whose bad-endpoint reason is `invalid` (which sorts first).
const fn reasons(invalid: &'static str) -> [&'static str; 9] {
    [
        invalid,
        "malformed",
        "permission_denied",
        "rate_limited",
        "rejected",
        "socket_missing",
        "timeout",
        "too_large",
        "unavailable",
    ]
}

/// The kubelet pod-resources client ([`super::kubelet`]).
#[derive(Debug)]
pub enum Kubelet {}

impl Client for Kubelet {
    const TABLE: ClientTable = ClientTable {
        subject: "the kubelet",
        socket: "kubelet pod-resources",
        flag: "--pod-resources-kubelet-socket",
        not_usable: "not a usable socket path",
        invalid_reason: "invalid_path",
        reasons: &reasons("invalid_path"),
        invalid_hint: "pass the kubelet socket's path, e.g. /var/lib/kubelet/pod-resources/kubelet.sock",
        socket_missing_hint: "mount the host's /var/lib/kubelet/pod-resources into the exporter's container as a hostPath volume (read-only is enough) and point --pod-resources-kubelet-socket at kubelet.sock inside it",
        permission_denied_hint: "the kubelet socket is root-only: run the exporter container as root (securityContext.runAsUser: 0) or grant it access to the socket",
        unavailable_hint: "the kubelet may be restarting; gpu-exporter reconnects by itself. If this persists, check the kubelet and that the socket path is the live one",
        timeout_hint: "the kubelet is overloaded or hung; gpu-exporter keeps the last answer until the TTL and retries",
        rate_limited_hint: "the kubelet allows 100 pod-resources calls per second for all clients on the node; another client is using them up",
        malformed_hint: "the socket does not speak pod-resources v1 as expected, or the node runs an unusual number of pods; check the kubelet version and the socket path",
        rejected_hint: "the kubelet does not serve pod-resources v1 List (Kubernetes before 1.20, or the KubeletPodResources feature gate is off)",
    };
}

/// The container runtime's CRI client ([`super::cri`]).
#[derive(Debug)]
pub enum Cri {}

impl Client for Cri {
    const TABLE: ClientTable = ClientTable {
        subject: "the container runtime",
        socket: "container runtime",
        flag: "--container-runtime-endpoint",
        not_usable: "not a usable unix socket",
        invalid_reason: "invalid_endpoint",
        reasons: &reasons("invalid_endpoint"),
        invalid_hint: "pass the runtime's unix socket, e.g. unix:///run/containerd/containerd.sock (containerd), unix:///run/crio/crio.sock (CRI-O), unix:///run/cri-dockerd.sock (cri-dockerd)",
        socket_missing_hint: "mount the runtime socket's directory (e.g. /run/containerd) into the exporter's container as a hostPath volume and point --container-runtime-endpoint at the socket; k3s and RKE2 use /run/k3s/containerd/containerd.sock",
        permission_denied_hint: "the runtime socket is root-only: run the exporter container as root (securityContext.runAsUser: 0)",
        unavailable_hint: "the container runtime may be restarting; gpu-exporter reconnects by itself. If this persists, check the endpoint is the live CRI socket",
        timeout_hint: "the container runtime is overloaded or hung; gpu-exporter keeps the last answer until the TTL and retries",
        rate_limited_hint: "another client is overloading the container runtime",
        malformed_hint: "the socket does not speak CRI runtime v1 as expected, or the node runs an unusual number of containers",
        rejected_hint: "the endpoint does not serve CRI runtime v1 (runtime.v1.RuntimeService): containerd 1.6+, CRI-O 1.20+, cri-dockerd 0.3+ do; is this the runtime's CRI socket?",
    };
}

/// `fut`, the `call` on the socket at `path`, within `timeout`; its failure classified (replies
/// may be up to `limit` bytes).
///
/// # Errors
/// The [`GrpcError`] saying why there is no answer.
pub async fn bounded<C: Client, T>(
    path: &Path,
    call: &'static str,
    timeout: Duration,
    limit: usize,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, GrpcError<C>> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(reply)) => Ok(reply.into_inner()),
        Ok(Err(status)) => Err(GrpcError::from_status(&status, path, call, timeout, limit)),
        Err(_) => Err(GrpcError::Timeout {
            path: path.to_owned(),
            call,
            after: timeout,
        }),
    }
}

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
fn classify(status: &tonic::Status, path: &Path) -> Failure {
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

    #[test]
    fn each_client_names_itself_its_flag_and_its_reasons() {
        let path = || PathBuf::from("/s.sock");
        let cause = || -> Cause { "x".into() };
        let kubelet: Vec<GrpcError<Kubelet>> = vec![
            GrpcError::InvalidEndpoint {
                endpoint: "/s.sock".into(),
                cause: cause(),
            },
            GrpcError::SocketMissing { path: path() },
            GrpcError::Timeout {
                path: path(),
                call: "List",
                after: Duration::from_secs(5),
            },
            GrpcError::RateLimited {
                path: path(),
                call: "List",
                cause: cause(),
            },
            GrpcError::Rejected {
                path: path(),
                call: "List",
                cause: cause(),
            },
        ];
        let texts: Vec<_> = kubelet
            .iter()
            .map(|e| (e.to_string(), e.reason()))
            .collect();
        assert_eq!(
            texts,
            [
                (
                    "--pod-resources-kubelet-socket /s.sock: not a usable socket path".into(),
                    "invalid_path"
                ),
                (
                    "no kubelet pod-resources socket at /s.sock".into(),
                    "socket_missing"
                ),
                (
                    "the kubelet did not answer List on /s.sock within 5s".into(),
                    "timeout"
                ),
                (
                    "the kubelet rate-limited List on /s.sock".into(),
                    "rate_limited"
                ),
                ("the kubelet rejected List on /s.sock".into(), "rejected"),
            ]
        );
        let cri: GrpcError<Cri> = GrpcError::InvalidEndpoint {
            endpoint: "tcp://x".into(),
            cause: cause(),
        };
        assert_eq!(
            cri.to_string(),
            "--container-runtime-endpoint tcp://x: not a usable unix socket"
        );
        assert_eq!(cri.reason(), "invalid_endpoint");
        assert!(cri.hint().starts_with("pass the runtime's unix socket"));
        let down: GrpcError<Cri> = GrpcError::Unavailable {
            path: path(),
            cause: cause(),
        };
        assert_eq!(
            down.to_string(),
            "the container runtime is not answering on /s.sock"
        );
        assert!(GrpcError::<Cri>::REASONS.contains(&"invalid_endpoint"));
        assert!(GrpcError::<Kubelet>::REASONS.contains(&"invalid_path"));
        assert!(!GrpcError::<Kubelet>::REASONS.contains(&"invalid_endpoint"));
        // Sorted, as the counters are rendered in this order.
        for reasons in [GrpcError::<Cri>::REASONS, GrpcError::<Kubelet>::REASONS] {
            assert!(reasons.is_sorted(), "{reasons:?}");
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
