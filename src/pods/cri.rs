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
use super::grpc::{self, Cause, GrpcError};

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

/// Why the container runtime gave no usable answer: the gRPC clients' error with the container
/// runtime's flag, reasons and fixes ([`grpc::Cri`]).
pub type CriError = GrpcError<grpc::Cri>;

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

    async fn bounded<T>(
        &self,
        call: &'static str,
        fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CriError> {
        grpc::bounded(&self.path, call, self.timeout, MAX_REPLY_BYTES, fut).await
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
