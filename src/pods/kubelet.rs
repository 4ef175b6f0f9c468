//! [`KubeletPodResources`]: the kubelet pod-resources v1 API over its unix socket.
//!
//! One long-lived tonic channel, created lazily: a socket that does not exist yet is not an
//! error at startup, and after the kubelet restarts the channel reconnects by itself on the next
//! call. Every call is bounded by a timeout, and replies may be up to 16 MiB (the kubelet's
//! own client limit; tonic's default of 4 MiB is too small for a full node). This is the only
//! file that uses the generated client.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use super::proto::pod_resources_lister_client::PodResourcesListerClient;
use super::proto::{ListPodResourcesRequest, ListPodResourcesResponse};
use super::{AttributionError, PodResolver};

/// Largest `List` reply accepted, bytes.
pub const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;

/// The default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client of the kubelet's pod-resources socket.
#[derive(Debug, Clone)]
pub struct KubeletPodResources {
    client: PodResourcesListerClient<Channel>,
    path: PathBuf,
    timeout: Duration,
}

impl KubeletPodResources {
    /// Prepares a client for the socket at `path`. Nothing is dialled until the first call.
    /// Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`AttributionError::InvalidPath`] if `path` cannot form an endpoint.
    pub fn new(path: &Path, timeout: Duration) -> Result<Self, AttributionError> {
        let invalid =
            |cause: Box<dyn std::error::Error + Send + Sync>| AttributionError::InvalidPath {
                path: path.to_owned(),
                cause,
            };
        let abs = std::path::absolute(path).map_err(|e| invalid(e.into()))?;
        let text = abs
            .to_str()
            .ok_or_else(|| invalid("the path is not valid UTF-8".into()))?;
        let endpoint = Endpoint::from_shared(format!("unix://{text}"))
            .map_err(|e| invalid(e.into()))?
            .connect_timeout(timeout)
            .timeout(timeout);
        let client = PodResourcesListerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_REPLY_BYTES);
        Ok(Self {
            client,
            path: path.to_owned(),
            timeout,
        })
    }

    fn classify(&self, status: &tonic::Status) -> AttributionError {
        let path = self.path.clone();
        let cause = || -> super::Cause { Box::new(status.clone()) };
        match status.code() {
            Code::ResourceExhausted => AttributionError::RateLimited {
                path,
                cause: cause(),
            },
            Code::OutOfRange if status.message().contains("too large") => {
                AttributionError::TooLarge {
                    path,
                    limit: MAX_REPLY_BYTES,
                    cause: cause(),
                }
            }
            Code::Internal if status.message().contains("decode") => AttributionError::Malformed {
                path,
                cause: cause(),
            },
            Code::DeadlineExceeded => AttributionError::Timeout {
                path,
                after: self.timeout,
            },
            Code::Cancelled if status.message().contains("Timeout") => AttributionError::Timeout {
                path,
                after: self.timeout,
            },
            Code::Unavailable | Code::Unknown | Code::Internal => match io_kind(status) {
                Some(io::ErrorKind::NotFound) => AttributionError::SocketMissing { path },
                Some(io::ErrorKind::PermissionDenied) => AttributionError::PermissionDenied {
                    path,
                    cause: cause(),
                },
                _ if !self.path.exists() => AttributionError::SocketMissing { path },
                _ => AttributionError::Unavailable {
                    path,
                    cause: cause(),
                },
            },
            _ => AttributionError::Rejected {
                path,
                cause: cause(),
            },
        }
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

impl PodResolver for KubeletPodResources {
    fn origin(&self) -> String {
        self.path.display().to_string()
    }

    async fn list(&self) -> Result<ListPodResourcesResponse, AttributionError> {
        let mut client = self.client.clone();
        let call = client.list(ListPodResourcesRequest {});
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(self.classify(&status)),
            Err(_) => Err(AttributionError::Timeout {
                path: self.path.clone(),
                after: self.timeout,
            }),
        }
    }
}
