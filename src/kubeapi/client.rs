//! The API client: kube-rs configured from `KUBECONFIG` (or `~/.kube/config`), else the pod's
//! service account, with a connect timeout. Each call is bounded by its own timeout
//! ([`bounded`]); a watch's stream is bounded by the server-side timeout it asks for.

use std::future::Future;
use std::time::Duration;

use super::error::{Call, KubeError};

/// A connected client and the API server's URL (for the log).
#[derive(Clone)]
pub struct KubeClient {
    /// The kube-rs client.
    pub client: kube::Client,
    /// The API server.
    pub url: String,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("url", &self.url)
            .finish()
    }
}

/// How long a watch stream may stay silent before it is taken as broken: longer than the
/// server-side timeout the watch asks for ([`WATCH_SECONDS`]), so a healthy watch ends first.
pub const WATCH_IDLE: Duration = Duration::from_secs(330);

/// The server-side timeout a watch asks for (`timeoutSeconds`); it is then opened again from
/// the last resourceVersion.
pub const WATCH_SECONDS: u32 = 290;

impl KubeClient {
    /// The configuration (`KUBECONFIG`, `~/.kube/config`, else in-cluster) and a client on it.
    /// Nothing is sent yet.
    ///
    /// # Errors
    /// [`KubeError::Config`] when there is no configuration; [`KubeError::Client`] when the
    /// client cannot be built from it (a bad certificate, say).
    pub async fn connect(timeout: Duration) -> Result<Self, KubeError> {
        let mut cfg = kube::Config::infer().await.map_err(KubeError::Config)?;
        cfg.connect_timeout = Some(timeout);
        cfg.read_timeout = Some(WATCH_IDLE);
        cfg.write_timeout = Some(timeout);
        let url = cfg.cluster_url.to_string();
        let client = kube::Client::try_from(cfg).map_err(|source| KubeError::Client {
            url: url.clone(),
            source,
        })?;
        Ok(Self { client, url })
    }
}

/// Runs one call with a deadline, naming it in any error.
///
/// # Errors
/// The call's own error, or [`KubeError::Timeout`].
pub async fn bounded<T>(
    call: Call,
    timeout: Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(KubeError::from_kube(call, e)),
        Err(_) => Err(KubeError::Timeout { call, timeout }),
    }
}
