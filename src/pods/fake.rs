//! A fake kubelet pod-resources server, for the `fake-kubelet` binary, tests and demos.
//!
//! It serves `List` from an [`Assignments`] file: a TOML list of which container holds which
//! device ids. The ids are served exactly as written (the fake does not know about GPUs), so a
//! file can describe whole GPUs (`GPU-…`), MIG devices (`MIG-…`), time-slicing replicas
//! (`GPU-…::2`) or GKE names (`nvidia0/gi3`). Format:
//!
//! ```toml
//! [[assignment]]
//! namespace = "ml"                 # required
//! pod = "trainer-0"                # required
//! container = "main"               # required
//! resource = "nvidia.com/gpu"      # optional, this is the default
//! devices = ["GPU-0b8f5a3e-…"]     # required, at least one
//! ```
//!
//! Assignments of the same namespace and pod form one pod, in file order. `Get` answers for one
//! pod, `GetAllocatableResources` lists every device id in the file.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::mapping::GPU_RESOURCE;
use super::proto::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use super::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};

/// An assignments file that cannot be used. Names the file and line.
#[derive(Debug, thiserror::Error)]
pub enum AssignmentsError {
    /// The file cannot be read.
    #[error("{}: cannot read", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        cause: std::io::Error,
    },
    /// The file is not valid.
    #[error("{origin}:{line}: {message}")]
    Invalid {
        /// The file.
        origin: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    assignment: Vec<toml::Spanned<Entry>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    namespace: String,
    pod: String,
    container: String,
    #[serde(default)]
    resource: Option<String>,
    devices: Vec<String>,
}

/// Parsed assignments: the reply `List` will give.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Assignments {
    /// The reply.
    pub reply: ListPodResourcesResponse,
}

impl Assignments {
    /// Reads and parses `path`.
    ///
    /// # Errors
    /// [`AssignmentsError`] naming the file (and line).
    pub fn load(path: &Path) -> Result<Self, AssignmentsError> {
        let text = std::fs::read_to_string(path).map_err(|cause| AssignmentsError::Read {
            path: path.to_owned(),
            cause,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses assignments text; `origin` names it in errors.
    ///
    /// # Errors
    /// [`AssignmentsError::Invalid`] with the line at fault.
    pub fn parse(text: &str, origin: &str) -> Result<Self, AssignmentsError> {
        let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
        let invalid = |offset: usize, message: String| AssignmentsError::Invalid {
            origin: origin.to_owned(),
            line: line_of(offset),
            message,
        };
        let file: File = toml::from_str(text).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start);
            invalid(offset, e.message().to_owned())
        })?;
        let mut pods: Vec<PodResources> = Vec::new();
        for spanned in file.assignment {
            let at = spanned.span().start;
            let e = spanned.into_inner();
            for (what, v) in [
                ("namespace", &e.namespace),
                ("pod", &e.pod),
                ("container", &e.container),
            ] {
                if v.trim().is_empty() {
                    return Err(invalid(at, format!("assignment has an empty {what}")));
                }
            }
            if e.devices.is_empty() || e.devices.iter().any(|d| d.trim().is_empty()) {
                return Err(invalid(
                    at,
                    format!(
                        "assignment {}/{}/{}: devices must list at least one non-empty id",
                        e.namespace, e.pod, e.container
                    ),
                ));
            }
            let devices = ContainerDevices {
                resource_name: e.resource.unwrap_or_else(|| GPU_RESOURCE.to_owned()),
                device_ids: e.devices,
                topology: None,
            };
            let pod = match pods
                .iter_mut()
                .position(|p| p.namespace == e.namespace && p.name == e.pod)
            {
                Some(i) => &mut pods[i],
                None => {
                    pods.push(PodResources {
                        name: e.pod,
                        namespace: e.namespace,
                        ..Default::default()
                    });
                    pods.last_mut().expect("just pushed")
                }
            };
            match pod.containers.iter_mut().find(|c| c.name == e.container) {
                Some(c) => c.devices.push(devices),
                None => pod.containers.push(ContainerResources {
                    name: e.container,
                    devices: vec![devices],
                    ..Default::default()
                }),
            }
        }
        Ok(Self {
            reply: ListPodResourcesResponse {
                pod_resources: pods,
            },
        })
    }
}

/// The fake server: answers from whatever reply is current on its `watch` channel.
#[derive(Debug, Clone)]
pub struct FakeKubelet {
    reply: watch::Receiver<ListPodResourcesResponse>,
}

impl FakeKubelet {
    /// A server answering with the current value of `reply`.
    pub fn new(reply: watch::Receiver<ListPodResourcesResponse>) -> Self {
        Self { reply }
    }

    /// The tonic service.
    pub fn into_service(self) -> PodResourcesListerServer<Self> {
        PodResourcesListerServer::new(self)
    }
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(self.reply.borrow().clone()))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        let reply = self.reply.borrow();
        let mut devices: Vec<ContainerDevices> = Vec::new();
        for d in reply
            .pod_resources
            .iter()
            .flat_map(|p| &p.containers)
            .flat_map(|c| &c.devices)
        {
            match devices
                .iter_mut()
                .find(|x| x.resource_name == d.resource_name)
            {
                Some(x) => x.device_ids.extend(d.device_ids.iter().cloned()),
                None => devices.push(d.clone()),
            }
        }
        for d in &mut devices {
            d.device_ids.sort();
            d.device_ids.dedup();
        }
        Ok(Response::new(AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let want = request.into_inner();
        let reply = self.reply.borrow();
        let pod = reply
            .pod_resources
            .iter()
            .find(|p| p.name == want.pod_name && p.namespace == want.pod_namespace)
            .cloned()
            .ok_or_else(|| {
                Status::not_found(format!(
                    "pod {}/{} not found",
                    want.pod_namespace, want.pod_name
                ))
            })?;
        Ok(Response::new(GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}

/// Serves `reply` on `listener` until `shutdown` completes.
///
/// # Errors
/// The transport error that ended serving.
pub async fn serve(
    listener: tokio::net::UnixListener,
    reply: watch::Receiver<ListPodResourcesResponse>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(FakeKubelet::new(reply).into_service())
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            shutdown,
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_group_into_pods_and_containers() {
        let text = r#"
[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
devices = ["GPU-1"]

[[assignment]]
namespace = "ml"
pod = "q"
container = "b"
resource = "nvidia.com/mig-1g.10gb"
devices = ["MIG-2", "MIG-3"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "c"
devices = ["GPU-4::1"]
"#;
        let a = Assignments::parse(text, "a.toml").unwrap();
        let pods = &a.reply.pod_resources;
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0].name, "p");
        assert_eq!(pods[0].containers.len(), 2);
        assert_eq!(pods[0].containers[1].devices[0].device_ids, ["GPU-4::1"]);
        assert_eq!(pods[0].containers[0].devices[0].resource_name, GPU_RESOURCE);
        assert_eq!(
            pods[1].containers[0].devices[0].resource_name,
            "nvidia.com/mig-1g.10gb"
        );
    }

    #[test]
    fn errors_name_file_and_line() {
        let missing = "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ndevices = [\"GPU-1\"]\n";
        let e = Assignments::parse(missing, "a.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("a.toml:1: "), "{e}");
        assert!(e.contains("container"), "{e}");

        let unknown = "\n\n[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\ndevice = [\"x\"]\ndevices = [\"x\"]\n";
        let e = Assignments::parse(unknown, "b.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("b.toml:7: "), "{e}");
        assert!(e.contains("unknown field"), "{e}");

        let empty =
            "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\ndevices = []\n";
        let e = Assignments::parse(empty, "c.toml").unwrap_err().to_string();
        assert!(e.starts_with("c.toml:1: "), "{e}");

        let syntax = "[[assignment]]\nnamespace = \"ml\npod = \"p\"\n";
        let e = Assignments::parse(syntax, "d.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("d.toml:2: "), "{e}");

        let e = Assignments::load(Path::new("/nonexistent/x.toml"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "/nonexistent/x.toml: cannot read");
    }
}
