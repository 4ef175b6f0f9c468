//! Reading an assignments file: the TOML checked line by line into [`Assignments`], with the
//! ids a real kubelet and runtime would give (pod UIDs, container ids, DRA CDI devices).

use std::collections::BTreeMap;
use std::path::Path;

use crate::pods::dra::NVIDIA_GPU_DRIVER;
use crate::pods::mapping::GPU_RESOURCE;
use crate::pods::proto::{
    CdiDevice, ClaimResource, ContainerDevices, ContainerResources, DynamicResource,
    ListPodResourcesResponse, PodResources,
};

use super::model::*;

impl Assignments {
    /// Reads and parses `path`.
    ///
    /// # Errors
    /// [`AssignmentsError`] naming the file (and line).
    pub fn load(path: &Path) -> Result<Self, AssignmentsError> {
        let text = crate::fsread::read_text(
            path,
            crate::fsread::Cap::SIMULATOR,
            crate::fsread::Symlinks::Follow,
        )
        .map_err(|e| AssignmentsError::Read {
            path: path.to_owned(),
            cause: std::io::Error::other(e),
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
        let layout = CgroupLayout {
            driver: file.cgroup_driver.unwrap_or_default(),
            version: match file.cgroup_version {
                None => 2,
                Some(v) if matches!(*v.get_ref(), 1 | 2) => *v.get_ref(),
                Some(v) => {
                    return Err(invalid(
                        v.span().start,
                        format!("cgroup_version {}: must be 1 or 2", v.get_ref()),
                    ))
                }
            },
            runtime: file.runtime.unwrap_or_default(),
        };
        let mut pods: Vec<PodResources> = Vec::new();
        let mut fakes: Vec<FakePod> = Vec::new();
        let mut pids_seen: BTreeMap<u32, String> = BTreeMap::new();
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
            let who = format!("{}/{}/{}", e.namespace, e.pod, e.container);
            if e.devices.is_empty() || e.devices.iter().any(|d| d.trim().is_empty()) {
                return Err(invalid(
                    at,
                    format!("assignment {who}: devices must list at least one non-empty id"),
                ));
            }
            let weight = e.weight.unwrap_or(1.0);
            if !(weight.is_finite() && weight > 0.0) {
                return Err(invalid(
                    at,
                    format!("assignment {who}: weight must be a positive number"),
                ));
            }
            if let Some(id) = &e.container_id {
                if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(invalid(
                        at,
                        format!("assignment {who}: container_id must be 64 hex digits"),
                    ));
                }
            }
            if let Some(uid) = &e.pod_uid {
                if uid.bytes().filter(u8::is_ascii_hexdigit).count() != 32
                    || !uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
                {
                    return Err(invalid(at, format!("assignment {who}: pod_uid must be a UID (32 hex digits, dashes allowed)")));
                }
            }
            let container_id = e
                .container_id
                .clone()
                .map(|c| c.to_ascii_lowercase())
                .unwrap_or_else(|| hex_id(&format!("container/{who}")));
            for pid in &e.pids {
                match pids_seen.get(pid) {
                    Some(other) if *other != container_id => {
                        return Err(invalid(at, format!("assignment {who}: pid {pid} is already a process of another container")));
                    }
                    _ => {
                        pids_seen.insert(*pid, container_id.clone());
                    }
                }
            }
            let claim = match (&e.claim, &e.resource) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        at,
                        format!("assignment {who}: either `resource` (device plugin) or `claim` (DRA), not both"),
                    ))
                }
                (Some(name), None) => {
                    if name.trim().is_empty() {
                        return Err(invalid(at, format!("assignment {who}: empty claim")));
                    }
                    let claim_namespace = e
                        .claim_namespace
                        .clone()
                        .unwrap_or_else(|| e.namespace.clone());
                    let driver = e
                        .driver
                        .clone()
                        .unwrap_or_else(|| NVIDIA_GPU_DRIVER.to_owned());
                    let pool = e.pool.clone().unwrap_or_else(|| DEFAULT_POOL.to_owned());
                    Some(dynamic_resource(
                        name,
                        &claim_namespace,
                        &driver,
                        &pool,
                        &e.devices,
                    ))
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
                                format!("assignment {who}: `{what}` needs `claim` (it describes a DRA allocation)"),
                            ));
                        }
                    }
                    None
                }
            };
            let naming = if claim.is_some() {
                DeviceNaming::Dra
            } else {
                DeviceNaming::Plugin
            };
            let pod = match pods
                .iter_mut()
                .position(|p| p.namespace == e.namespace && p.name == e.pod)
            {
                Some(i) => &mut pods[i],
                None => {
                    pods.push(PodResources {
                        name: e.pod.clone(),
                        namespace: e.namespace.clone(),
                        ..Default::default()
                    });
                    pods.last_mut().expect("just pushed")
                }
            };
            let container = match pod.containers.iter().position(|c| c.name == e.container) {
                Some(i) => &mut pod.containers[i],
                None => {
                    pod.containers.push(ContainerResources {
                        name: e.container.clone(),
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
                    resource_name: e
                        .resource
                        .clone()
                        .unwrap_or_else(|| GPU_RESOURCE.to_owned()),
                    device_ids: e.devices.clone(),
                    topology: None,
                }),
            }

            let fake = match fakes
                .iter_mut()
                .position(|p| p.namespace == e.namespace && p.name == e.pod)
            {
                Some(i) => &mut fakes[i],
                None => {
                    let key = format!("{}/{}", e.namespace, e.pod);
                    fakes.push(FakePod {
                        namespace: e.namespace.clone(),
                        name: e.pod.clone(),
                        uid: e.pod_uid.clone().unwrap_or_else(|| uid_from(&key)),
                        sandbox_id: hex_id(&format!("sandbox/{key}")),
                        labels: BTreeMap::new(),
                        containers: Vec::new(),
                    });
                    fakes.last_mut().expect("just pushed")
                }
            };
            if let Some(uid) = &e.pod_uid {
                if !uid.eq_ignore_ascii_case(&fake.uid) {
                    return Err(invalid(at, format!("assignment {who}: pod_uid differs from an earlier assignment of the same pod")));
                }
            }
            fake.labels.extend(e.labels);
            let run = Run {
                devices: e.devices,
                naming,
                pids: e.pids,
                weight,
            };
            match fake.containers.iter_mut().find(|c| c.name == e.container) {
                Some(c) if c.id != container_id => {
                    return Err(invalid(at, format!("assignment {who}: container_id differs from an earlier assignment of the same container")));
                }
                Some(c) => c.runs.push(run),
                None => fake.containers.push(FakeContainer {
                    name: e.container,
                    id: container_id,
                    runs: vec![run],
                }),
            }
        }
        let mut host_processes = Vec::new();
        for h in file.host_process {
            let at = h.span().start;
            let h = h.into_inner();
            if let Some(owner) = pids_seen.get(&h.pid) {
                return Err(invalid(
                    at,
                    format!(
                        "host_process {}: pid is already a process of container {owner}",
                        h.pid
                    ),
                ));
            }
            pids_seen.insert(h.pid, "(host)".to_owned());
            let weight = h.weight.unwrap_or(1.0);
            if !(weight.is_finite() && weight > 0.0) {
                return Err(invalid(
                    at,
                    format!("host_process {}: weight must be a positive number", h.pid),
                ));
            }
            let unit = h.unit.unwrap_or_else(|| format!("host-{}", h.pid));
            if unit.is_empty() || unit.contains(['/', '\n']) {
                return Err(invalid(
                    at,
                    format!("host_process {}: unit {unit:?} is not a unit name", h.pid),
                ));
            }
            host_processes.push(HostProcess {
                pid: h.pid,
                device: h.device,
                weight,
                unit,
            });
        }
        Ok(Self {
            reply: ListPodResourcesResponse {
                pod_resources: pods,
            },
            pods: fakes,
            host_processes,
            layout,
        })
    }
}

/// 64 hex digits derived from `key` (container and sandbox ids).
pub(super) fn hex_id(key: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(key.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A UUID-shaped pod UID derived from `key`.
pub(super) fn uid_from(key: &str) -> String {
    let h = hex_id(&format!("uid/{key}"));
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
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
    let uid = uid_from(&format!("claim/{namespace}/{claim}"));
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
