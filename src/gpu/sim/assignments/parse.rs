//! Reading an assignments file: the TOML checked line by line into [`Assignments`], with the
//! ids a real kubelet and runtime would give (pod UIDs, container ids).

use std::collections::BTreeMap;
use std::path::Path;

use super::model::{
    Allocation, Assignments, AssignmentsError, CgroupLayout, Container, DeviceNaming, File,
    HostProcess, Pod, Run, DEFAULT_POOL,
};

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
        let mut pods: Vec<Pod> = Vec::new();
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
            let allocation = match (&e.claim, &e.resource) {
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
                    Allocation::Dra {
                        claim: name.clone(),
                        claim_namespace: e
                            .claim_namespace
                            .clone()
                            .unwrap_or_else(|| e.namespace.clone()),
                        driver: e.driver.clone(),
                        pool: e.pool.clone().unwrap_or_else(|| DEFAULT_POOL.to_owned()),
                    }
                }
                (None, resource) => {
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
                    Allocation::Plugin {
                        resource: resource.clone(),
                    }
                }
            };
            let naming = match allocation {
                Allocation::Dra { .. } => DeviceNaming::Dra,
                Allocation::Plugin { .. } => DeviceNaming::Plugin,
            };
            let pod = match pods
                .iter_mut()
                .position(|p| p.namespace == e.namespace && p.name == e.pod)
            {
                Some(i) => &mut pods[i],
                None => {
                    let key = format!("{}/{}", e.namespace, e.pod);
                    pods.push(Pod {
                        namespace: e.namespace.clone(),
                        name: e.pod.clone(),
                        uid: e.pod_uid.clone().unwrap_or_else(|| derived_uid(&key)),
                        sandbox_id: hex_id(&format!("sandbox/{key}")),
                        labels: BTreeMap::new(),
                        containers: Vec::new(),
                    });
                    pods.last_mut().expect("just pushed")
                }
            };
            if let Some(uid) = &e.pod_uid {
                if !uid.eq_ignore_ascii_case(&pod.uid) {
                    return Err(invalid(at, format!("assignment {who}: pod_uid differs from an earlier assignment of the same pod")));
                }
            }
            pod.labels.extend(e.labels);
            let run = Run {
                devices: e.devices,
                naming,
                allocation,
                pids: e.pids,
                weight,
            };
            match pod.containers.iter_mut().find(|c| c.name == e.container) {
                Some(c) if c.id != container_id => {
                    return Err(invalid(at, format!("assignment {who}: container_id differs from an earlier assignment of the same container")));
                }
                Some(c) => c.runs.push(run),
                None => pod.containers.push(Container {
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
            pods,
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

/// A UUID-shaped UID derived from `key`: the pod UIDs here, and the fake kubelet's DRA claim
/// UIDs.
pub fn derived_uid(key: &str) -> String {
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
