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
//! An assignment with `claim` is a DRA allocation instead: it goes into the container's
//! `dynamic_resources`, and `devices` are the DRA driver's device names:
//!
//! ```toml
//! [[assignment]]
//! namespace = "ml"
//! pod = "trainer-1"
//! container = "main"
//! claim = "trainer-1-gpus"         # the ResourceClaim's name
//! claim_namespace = "ml"           # optional, default: namespace
//! driver = "gpu.nvidia.com"        # optional, this is the default
//! pool = "node-a"                  # optional, default "fake-node" (NVIDIA's driver: the node)
//! devices = ["gpu-0", "gpu-1-mig-3g40gb-9-4"]
//! ```
//!
//! Each DRA device gets one CDI id, formed as NVIDIA's driver forms them
//! (`k8s.gpu.nvidia.com/claim=<claim uid>-<device>`, with a made-up, stable claim uid).
//!
//! Assignments of the same namespace and pod form one pod, in file order; those of one
//! container and claim form one claim. `Get` answers for one pod, `GetAllocatableResources`
//! lists every device-plugin id in the file (the kubelet lists no DRA devices there).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::dra::NVIDIA_GPU_DRIVER;
use super::mapping::GPU_RESOURCE;
use super::proto::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use super::proto::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, CdiDevice, ClaimResource,
    ContainerDevices, ContainerResources, DynamicResource, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
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
    #[serde(default)]
    claim: Option<String>,
    #[serde(default)]
    claim_namespace: Option<String>,
    #[serde(default)]
    driver: Option<String>,
    #[serde(default)]
    pool: Option<String>,
}

/// The default pool of DRA assignments.
pub const DEFAULT_POOL: &str = "fake-node";

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
            let claim = match (&e.claim, &e.resource) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        at,
                        "an assignment has either `resource` (device plugin) or `claim` (DRA), not both".to_owned(),
                    ))
                }
                (Some(name), None) => {
                    if name.trim().is_empty() {
                        return Err(invalid(at, "assignment has an empty claim".to_owned()));
                    }
                    let claim_namespace = e.claim_namespace.unwrap_or_else(|| e.namespace.clone());
                    let driver = e.driver.unwrap_or_else(|| NVIDIA_GPU_DRIVER.to_owned());
                    let pool = e.pool.unwrap_or_else(|| DEFAULT_POOL.to_owned());
                    Some(dynamic_resource(name, &claim_namespace, &driver, &pool, &e.devices))
                }
                (None, _) => {
                    for (what, set) in [
                        ("claim_namespace", e.claim_namespace.is_some()),
                        ("driver", e.driver.is_some()),
                        ("pool", e.pool.is_some()),
                    ] {
                        if set {
                            return Err(invalid(
                                at,
                                format!("`{what}` needs `claim` (it describes a DRA allocation)"),
                            ));
                        }
                    }
                    None
                }
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
            let container = match pod.containers.iter().position(|c| c.name == e.container) {
                Some(i) => &mut pod.containers[i],
                None => {
                    pod.containers.push(ContainerResources {
                        name: e.container,
                        ..Default::default()
                    });
                    pod.containers.last_mut().expect("just pushed")
                }
            };
            match claim {
                Some(dr) => match container.dynamic_resources.iter_mut().find(|c| {
                    c.claim_name == dr.claim_name && c.claim_namespace == dr.claim_namespace
                }) {
                    Some(existing) => existing.claim_resources.extend(dr.claim_resources),
                    None => container.dynamic_resources.push(dr),
                },
                None => container.devices.push(ContainerDevices {
                    resource_name: e.resource.unwrap_or_else(|| GPU_RESOURCE.to_owned()),
                    device_ids: e.devices,
                    topology: None,
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

/// A DRA claim's entry: one claim resource per device, each with the CDI id NVIDIA's driver
/// would give it.
fn dynamic_resource(
    claim: &str,
    namespace: &str,
    driver: &str,
    pool: &str,
    devices: &[String],
) -> DynamicResource {
    let uid = fake_uid(&format!("{namespace}/{claim}"));
    DynamicResource {
        claim_name: claim.to_owned(),
        claim_namespace: namespace.to_owned(),
        claim_resources: devices
            .iter()
            .map(|d| ClaimResource {
                cdi_devices: vec![CdiDevice {
                    name: format!("k8s.gpu.nvidia.com/claim={uid}-{d}"),
                }],
                driver_name: driver.to_owned(),
                pool_name: pool.to_owned(),
                device_name: d.clone(),
                share_id: None,
            })
            .collect(),
    }
}

/// A stable UUID-shaped id for `name` (FNV-1a, twice).
fn fake_uid(name: &str) -> String {
    let fnv = |seed: u64| {
        name.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    };
    let (a, b) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x8422_2325_cbf2_9ce4));
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
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

    #[test]
    fn dra_assignments_become_dynamic_resources_grouped_by_claim() {
        let text = r#"
[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
claim = "gpus"
pool = "node-a"
devices = ["gpu-0"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
devices = ["GPU-1"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
claim = "gpus"
pool = "node-a"
devices = ["gpu-1-mig-3g40gb-9-4"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "b"
claim = "shared"
claim_namespace = "infra"
driver = "dra.example.com"
devices = ["nic-0"]
"#;
        let a = Assignments::parse(text, "dra.toml").unwrap();
        let pod = &a.reply.pod_resources[0];
        let c = &pod.containers[0];
        assert_eq!(c.devices[0].device_ids, ["GPU-1"]);
        assert_eq!(c.dynamic_resources.len(), 1);
        let claim = &c.dynamic_resources[0];
        assert_eq!(
            (claim.claim_name.as_str(), claim.claim_namespace.as_str()),
            ("gpus", "ml")
        );
        let devices: Vec<(&str, &str, &str)> = claim
            .claim_resources
            .iter()
            .map(|r| {
                (
                    r.driver_name.as_str(),
                    r.pool_name.as_str(),
                    r.device_name.as_str(),
                )
            })
            .collect();
        assert_eq!(
            devices,
            [
                (NVIDIA_GPU_DRIVER, "node-a", "gpu-0"),
                (NVIDIA_GPU_DRIVER, "node-a", "gpu-1-mig-3g40gb-9-4")
            ]
        );
        // One CDI id per device, as the driver forms them, with the same claim uid.
        let cdi: Vec<&str> = claim
            .claim_resources
            .iter()
            .flat_map(|r| r.cdi_devices.iter().map(|d| d.name.as_str()))
            .collect();
        assert_eq!(cdi.len(), 2);
        let uid = cdi[0]
            .strip_prefix("k8s.gpu.nvidia.com/claim=")
            .and_then(|r| r.strip_suffix("-gpu-0"))
            .unwrap();
        assert_eq!(uid.len(), 36, "{uid}");
        assert_eq!(
            cdi[1],
            format!("k8s.gpu.nvidia.com/claim={uid}-gpu-1-mig-3g40gb-9-4")
        );
        let other = &pod.containers[1].dynamic_resources[0];
        assert_eq!(other.claim_namespace, "infra");
        assert_eq!(other.claim_resources[0].driver_name, "dra.example.com");
        assert_eq!(other.claim_resources[0].pool_name, DEFAULT_POOL);
    }

    #[test]
    fn dra_fields_are_checked() {
        let both = "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\nresource = \"nvidia.com/gpu\"\nclaim = \"x\"\ndevices = [\"gpu-0\"]\n";
        let e = Assignments::parse(both, "a.toml").unwrap_err().to_string();
        assert!(e.starts_with("a.toml:1: ") && e.contains("not both"), "{e}");
        let pool = "\n[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\npool = \"n\"\ndevices = [\"GPU-0\"]\n";
        let e = Assignments::parse(pool, "b.toml").unwrap_err().to_string();
        assert!(
            e.starts_with("b.toml:2: ") && e.contains("`pool` needs `claim`"),
            "{e}"
        );
        let empty = "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\nclaim = \" \"\ndevices = [\"gpu-0\"]\n";
        let e = Assignments::parse(empty, "c.toml").unwrap_err().to_string();
        assert!(e.contains("empty claim"), "{e}");
    }
}
