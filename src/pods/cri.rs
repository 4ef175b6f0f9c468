//! [`CriClient`]: the container runtime's CRI `RuntimeService` (runtime v1) over its unix
//! socket, read-only: `Version` once, then `ListPodSandbox` and `ListContainers` on the
//! refresher's cadence.
//!
//! The same client stack as the kubelet pod-resources client ([`super::kubelet`]): one lazily
//! dialled, long-lived channel that reconnects by itself, every call bounded by a timeout, replies
//! up to 16 MiB. The socket serves the whole CRI (it can start and stop containers), so mounting
//! it is a privilege; this client only ever lists.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::Channel;

use super::cri_proto::runtime_service_client::RuntimeServiceClient;
use super::cri_proto::{ListContainersRequest, ListPodSandboxRequest, VersionRequest};
use super::directory::RuntimeSnapshot;
use super::grpc::{self, Failure};
use super::Cause;

/// Largest reply accepted, bytes.
pub const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;

/// The default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// containerd's CRI socket, the default `--container-runtime-endpoint`.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// Lists what the container runtime runs on this node.
pub trait ContainerRuntime: Send + Sync + 'static {
    /// Where the answers come from, for logs (the socket path).
    fn origin(&self) -> String;

    /// `ListPodSandbox` and `ListContainers`, unfiltered. Implementations bound the duration.
    ///
    /// # Errors
    /// A [`CriError`] saying why there is no answer.
    fn list(&self) -> impl Future<Output = Result<RuntimeSnapshot, CriError>> + Send;

    /// The runtime's name and version (`containerd 1.7.27`), for one log line.
    ///
    /// # Errors
    /// A [`CriError`] saying why there is no answer.
    fn version(&self) -> impl Future<Output = Result<String, CriError>> + Send;
}

/// Why the container runtime gave no usable answer. Each variant names the socket and has a
/// `reason` label ([`CriError::reason`]) and a fix ([`CriError::hint`]).
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The endpoint is not a usable unix socket.
    #[error("--container-runtime-endpoint {endpoint}: not a usable unix socket")]
    InvalidEndpoint {
        /// What was given.
        endpoint: String,
        /// The cause.
        #[source]
        cause: Cause,
    },
    /// Nothing exists at the socket path.
    #[error("no container runtime socket at {}", path.display())]
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
    /// Connecting or calling failed.
    #[error("the container runtime is not answering on {}", path.display())]
    Unavailable {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        cause: Cause,
    },
    /// No answer in time.
    #[error("the container runtime did not answer {call} on {} within {after:?}", path.display())]
    Timeout {
        /// The path.
        path: PathBuf,
        /// The call.
        call: &'static str,
        /// The per-call timeout.
        after: Duration,
    },
    /// The runtime rejected the call as over a limit.
    #[error("the container runtime rate-limited {call} on {}", path.display())]
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
    /// The runtime answered with another error (e.g. `Unimplemented`: not CRI runtime v1).
    #[error("the container runtime rejected {call} on {}", path.display())]
    Rejected {
        /// The path.
        path: PathBuf,
        /// The call.
        call: &'static str,
        /// The cause.
        #[source]
        cause: Cause,
    },
}

impl CriError {
    /// Every `reason` label value, for pre-initialised counters.
    pub const REASONS: &'static [&'static str] = &[
        "invalid_endpoint",
        "malformed",
        "permission_denied",
        "rate_limited",
        "rejected",
        "socket_missing",
        "timeout",
        "too_large",
        "unavailable",
    ];

    /// The `reason` label for `gpu_exporter_cri_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            CriError::InvalidEndpoint { .. } => "invalid_endpoint",
            CriError::SocketMissing { .. } => "socket_missing",
            CriError::PermissionDenied { .. } => "permission_denied",
            CriError::Unavailable { .. } => "unavailable",
            CriError::Timeout { .. } => "timeout",
            CriError::RateLimited { .. } => "rate_limited",
            CriError::TooLarge { .. } => "too_large",
            CriError::Malformed { .. } => "malformed",
            CriError::Rejected { .. } => "rejected",
        }
    }

    /// What to do about it, for the log.
    pub fn hint(&self) -> &'static str {
        match self {
            CriError::InvalidEndpoint { .. } => {
                "pass the runtime's unix socket, e.g. unix:///run/containerd/containerd.sock (containerd), unix:///run/crio/crio.sock (CRI-O), unix:///run/cri-dockerd.sock (cri-dockerd)"
            }
            CriError::SocketMissing { .. } => {
                "mount the runtime socket's directory (e.g. /run/containerd) into the exporter's container as a hostPath volume and point --container-runtime-endpoint at the socket; k3s and RKE2 use /run/k3s/containerd/containerd.sock"
            }
            CriError::PermissionDenied { .. } => {
                "the runtime socket is root-only: run the exporter container as root (securityContext.runAsUser: 0)"
            }
            CriError::Unavailable { .. } => {
                "the container runtime may be restarting; gpu-exporter reconnects by itself. If this persists, check the endpoint is the live CRI socket"
            }
            CriError::Timeout { .. } => {
                "the container runtime is overloaded or hung; gpu-exporter keeps the last answer until the TTL and retries"
            }
            CriError::RateLimited { .. } => "another client is overloading the container runtime",
            CriError::TooLarge { .. } | CriError::Malformed { .. } => {
                "the socket does not speak CRI runtime v1 as expected, or the node runs an unusual number of containers"
            }
            CriError::Rejected { .. } => {
                "the endpoint does not serve CRI runtime v1 (runtime.v1.RuntimeService): containerd 1.6+, CRI-O 1.20+, cri-dockerd 0.3+ do; is this the runtime's CRI socket?"
            }
        }
    }
}

/// A client of the container runtime's CRI socket.
#[derive(Debug, Clone)]
pub struct CriClient {
    client: RuntimeServiceClient<Channel>,
    path: PathBuf,
    timeout: Duration,
}

impl CriClient {
    /// Prepares a client for `endpoint` (`unix:///path` or `/path`). Nothing is dialled until the
    /// first call. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`CriError::InvalidEndpoint`] if `endpoint` is not a unix socket path.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self, CriError> {
        let invalid = |cause: Cause| CriError::InvalidEndpoint {
            endpoint: endpoint.to_owned(),
            cause,
        };
        let path = grpc::socket_path(endpoint)
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or_else(|| {
                invalid("only unix:// endpoints (node-local sockets) are supported".into())
            })?;
        let channel = grpc::unix_channel(&path, timeout).map_err(invalid)?;
        let client = RuntimeServiceClient::new(channel).max_decoding_message_size(MAX_REPLY_BYTES);
        Ok(Self {
            client,
            path,
            timeout,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn classify(&self, call: &'static str, status: &tonic::Status) -> CriError {
        let path = self.path.clone();
        match grpc::classify(status, &self.path) {
            Failure::SocketMissing => CriError::SocketMissing { path },
            Failure::NotASocket(cause) => CriError::InvalidEndpoint {
                endpoint: path.display().to_string(),
                cause,
            },
            Failure::PermissionDenied(cause) => CriError::PermissionDenied { path, cause },
            Failure::Unavailable(cause) => CriError::Unavailable { path, cause },
            Failure::Timeout => CriError::Timeout {
                path,
                call,
                after: self.timeout,
            },
            Failure::RateLimited(cause) => CriError::RateLimited { path, call, cause },
            Failure::TooLarge(cause) => CriError::TooLarge {
                path,
                call,
                limit: MAX_REPLY_BYTES,
                cause,
            },
            Failure::Malformed(cause) => CriError::Malformed { path, call, cause },
            Failure::Rejected(cause) => CriError::Rejected { path, call, cause },
        }
    }

    async fn bounded<T>(
        &self,
        call: &'static str,
        fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CriError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(self.classify(call, &status)),
            Err(_) => Err(CriError::Timeout {
                path: self.path.clone(),
                call,
                after: self.timeout,
            }),
        }
    }
}

impl ContainerRuntime for CriClient {
    fn origin(&self) -> String {
        self.path.display().to_string()
    }

    async fn list(&self) -> Result<RuntimeSnapshot, CriError> {
        let mut client = self.client.clone();
        let sandboxes = self
            .bounded(
                "ListPodSandbox",
                client.list_pod_sandbox(ListPodSandboxRequest { filter: None }),
            )
            .await?
            .items;
        let containers = self
            .bounded(
                "ListContainers",
                client.list_containers(ListContainersRequest { filter: None }),
            )
            .await?
            .containers;
        Ok(RuntimeSnapshot {
            sandboxes,
            containers,
        })
    }

    async fn version(&self) -> Result<String, CriError> {
        let mut client = self.client.clone();
        let v = self
            .bounded(
                "Version",
                client.version(VersionRequest {
                    version: "v1".into(),
                }),
            )
            .await?;
        Ok(format!(
            "{} {} (CRI {})",
            v.runtime_name, v.runtime_version, v.runtime_api_version
        ))
    }
}
