//! A fake container runtime: the CRI `RuntimeService` (runtime v1) answering `Version`,
//! `ListPodSandbox` and `ListContainers` from a [`RuntimeSnapshot`] (usually
//! [`super::fake_kubelet::Assignments::runtime_snapshot`]), honouring the request filters as a real
//! runtime does. Served by `fake-kubelet --cri-socket`, and by tests on temporary sockets. Every
//! other CRI call answers `Unimplemented`, as the vendored proto has only these three.

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::proto::cri::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use gpu_exporter::pods::cri_proto::{
    Container, ContainerFilter, ListContainersRequest, ListContainersResponse,
    ListPodSandboxRequest, ListPodSandboxResponse, PodSandbox, PodSandboxFilter, VersionRequest,
    VersionResponse,
};
use gpu_exporter::pods::directory::RuntimeSnapshot;

/// The fake runtime: answers from whatever snapshot is current on its `watch` channel.
#[derive(Debug, Clone)]
pub struct FakeRuntime {
    state: watch::Receiver<RuntimeSnapshot>,
}

impl FakeRuntime {
    /// A runtime answering with the current value of `state`.
    pub fn new(state: watch::Receiver<RuntimeSnapshot>) -> Self {
        Self { state }
    }

    /// The tonic service.
    pub fn into_service(self) -> RuntimeServiceServer<Self> {
        RuntimeServiceServer::new(self)
    }
}

fn labels_match(
    labels: &std::collections::HashMap<String, String>,
    selector: &std::collections::HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn sandbox_matches(s: &PodSandbox, f: Option<&PodSandboxFilter>) -> bool {
    let Some(f) = f else { return true };
    (f.id.is_empty() || s.id == f.id)
        && f.state.as_ref().is_none_or(|st| st.state == s.state)
        && labels_match(&s.labels, &f.label_selector)
}

fn container_matches(c: &Container, f: Option<&ContainerFilter>) -> bool {
    let Some(f) = f else { return true };
    (f.id.is_empty() || c.id == f.id)
        && (f.pod_sandbox_id.is_empty() || c.pod_sandbox_id == f.pod_sandbox_id)
        && f.state.as_ref().is_none_or(|st| st.state == c.state)
        && labels_match(&c.labels, &f.label_selector)
}

#[tonic::async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(
        &self,
        _request: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        Ok(Response::new(VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake-cri".into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        let filter = request.into_inner().filter;
        let items = self
            .state
            .borrow()
            .sandboxes
            .iter()
            .filter(|s| sandbox_matches(s, filter.as_ref()))
            .cloned()
            .collect();
        Ok(Response::new(ListPodSandboxResponse { items }))
    }

    async fn list_containers(
        &self,
        request: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        let filter = request.into_inner().filter;
        let containers = self
            .state
            .borrow()
            .containers
            .iter()
            .filter(|c| container_matches(c, filter.as_ref()))
            .cloned()
            .collect();
        Ok(Response::new(ListContainersResponse { containers }))
    }
}

/// Serves `state` on `listener` until `shutdown` completes.
///
/// # Errors
/// The transport error that ended serving.
pub async fn serve(
    listener: tokio::net::UnixListener,
    state: watch::Receiver<RuntimeSnapshot>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(FakeRuntime::new(state).into_service())
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            shutdown,
        )
        .await
}
