//! [`KubeletPodResources`]: the kubelet pod-resources v1 API over its unix socket.
//!
//! One long-lived tonic channel, created lazily: a socket that does not exist yet is not an
//! error at startup, and after the kubelet restarts the channel reconnects by itself on the next
//! call. Every call is bounded by a timeout, and replies may be up to 16 MiB (the kubelet's
//! own client limit; tonic's default of 4 MiB is too small for a full node). This is the only
//! file that uses the generated client.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::Channel;

use super::grpc;
use super::proto::pod_resources_lister_client::PodResourcesListerClient;
use super::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse,
};
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
    /// [`AttributionError::InvalidEndpoint`] if `path` cannot form an endpoint.
    pub fn new(path: &Path, timeout: Duration) -> Result<Self, AttributionError> {
        let channel = grpc::unix_channel(path, timeout).map_err(|cause| {
            AttributionError::InvalidEndpoint {
                endpoint: path.display().to_string(),
                cause,
            }
        })?;
        let client =
            PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_REPLY_BYTES);
        Ok(Self {
            client,
            path: path.to_owned(),
            timeout,
        })
    }

    /// `call` within the timeout, its failure classified. Every call is named `List` in the
    /// messages, as it always has been.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, AttributionError> {
        grpc::bounded(&self.path, "List", self.timeout, MAX_REPLY_BYTES, call).await
    }
}

impl PodResolver for KubeletPodResources {
    fn origin(&self) -> String {
        self.path.display().to_string()
    }

    async fn list(&self) -> Result<ListPodResourcesResponse, AttributionError> {
        let mut client = self.client.clone();
        let call = client.list(ListPodResourcesRequest {});
        self.bounded(call).await
    }

    async fn allocatable(&self) -> Result<Option<AllocatableResourcesResponse>, AttributionError> {
        let mut client = self.client.clone();
        let call = client.get_allocatable_resources(AllocatableResourcesRequest {});
        self.bounded(call).await.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_directory_or_an_overlong_path_is_reported_as_what_it_is() {
        // A directory where the socket should be (hostPath DirectoryOrCreate): not "the kubelet
        // may be restarting", but the path and what is there.
        let dir = tempfile::tempdir().unwrap();
        let k = KubeletPodResources::new(dir.path(), Duration::from_secs(2)).unwrap();
        let e = k.list().await.unwrap_err();
        assert_eq!(e.reason(), "invalid_path");
        assert_eq!(
            crate::error_chain(&e),
            format!(
                "--pod-resources-kubelet-socket {0}: not a usable socket path: {0} is a directory, not a socket",
                dir.path().display()
            )
        );
        // A path over the kernel's 107-byte limit can never connect: refused when configured.
        let long = dir.path().join("x".repeat(120));
        let e = KubeletPodResources::new(&long, Duration::from_secs(2)).unwrap_err();
        assert_eq!(e.reason(), "invalid_path");
        assert!(
            crate::error_chain(&e).contains("a unix socket path can be at most 107 bytes"),
            "{e}"
        );
    }
}
