//! A gRPC test server on a unix socket (tonic), ready when [`serve`] returns.

use std::path::{Path, PathBuf};

use tokio::sync::oneshot;

/// A gRPC server on a unix socket; [`Server::stop`] shuts it down gracefully and removes the
/// socket.
pub struct Server {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    path: PathBuf,
}

impl Server {
    /// Stops serving, waits for the server to end and removes the socket.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `path` (ready on return) and serves `svc` on it. Must be called inside a tokio runtime.
pub fn serve<S>(path: &Path, svc: S) -> Server
where
    S: tower::Service<
            tonic::codegen::http::Request<tonic::body::Body>,
            Response = tonic::codegen::http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = tokio::net::UnixListener::bind(path).expect("bind test socket");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .expect("test server");
    });
    Server {
        stop: Some(stop),
        task,
        path: path.to_owned(),
    }
}
