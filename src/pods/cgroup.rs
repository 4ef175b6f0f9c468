//! Pure parser of `/proc/<pid>/cgroup`: which pod (UID) and container (runtime id) a process
//! belongs to.
//!
//! Every line is `hierarchy-id:controllers:path`: one `0::/path` line on cgroup v2, one line per
//! controller hierarchy on v1, both on hybrid hosts. The kubelet puts each pod in a cgroup named
//! after its UID and the runtime puts each container in a child of it named after the container
//! id, in one of these forms (QoS level `besteffort`/`burstable`, absent for Guaranteed pods):
//!
//! | driver | runtime | container cgroup |
//! |---|---|---|
//! | cgroupfs | containerd, cri-dockerd | `/kubepods/burstable/pod<uid>/<id>` |
//! | cgroupfs | CRI-O | `/kubepods/burstable/pod<uid>/crio-<id>` |
//! | systemd | containerd | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope` |
//! | systemd | CRI-O | `…/kubepods-burstable-pod<uid_>.slice/crio-<id>.scope` |
//! | systemd | cri-dockerd | `…/kubepods-burstable-pod<uid_>.slice/docker-<id>.scope` |
//!
//! `<uid_>` is the UID with `-` escaped as `_` (systemd unit names). Static pods have 32-digit
//! UIDs without dashes. The parser does not depend on where the hierarchy starts: a reader in
//! its own cgroup namespace sees `0::/../../kubepods-…-pod<uid>.slice/cri-containerd-<id>.scope`,
//! kind nodes nest everything under `/kubelet.slice/kubelet-kubepods.slice/…`, and Docker-in-Docker
//! under `/docker/<id>/kubepods/…`. It finds the pod component anywhere in the path, and takes the
//! container id from the component right below it, so runtimes that run the payload in a
//! sub-cgroup (`crio-<id>.scope/container`) still resolve. A CRI-O `crio-conmon-<id>.scope` is the
//! container's monitor, not the container.

/// Whose process it is, as far as its cgroup says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupOwner {
    /// A process of a Kubernetes pod.
    Pod {
        /// The pod UID, with dashes (`_` from systemd names turned back into `-`).
        uid: String,
        /// The container id (64 lowercase hex digits), when the process is in a container's
        /// cgroup rather than in the pod's own.
        container_id: Option<String>,
    },
    /// Not in any pod's cgroup: a host process, or a container Kubernetes does not manage.
    OutsidePods,
}

/// The file has no line of the `id:controllers:path` form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no `hierarchy:controllers:path` line")]
pub struct Unrecognised;

/// Parses the text of `/proc/<pid>/cgroup`.
///
/// # Errors
/// [`Unrecognised`] if no line has the `id:controllers:path` form.
pub fn parse(text: &str) -> Result<CgroupOwner, Unrecognised> {
    let mut valid = false;
    let mut pod_only = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) || !path.starts_with('/') {
            continue;
        }
        valid = true;
        match parse_path(path) {
            Some((uid, Some(container_id))) => {
                return Ok(CgroupOwner::Pod {
                    uid,
                    container_id: Some(container_id),
                })
            }
            Some((uid, None)) => {
                pod_only.get_or_insert(uid);
            }
            None => {}
        }
    }
    match (pod_only, valid) {
        (Some(uid), _) => Ok(CgroupOwner::Pod {
            uid,
            container_id: None,
        }),
        (None, true) => Ok(CgroupOwner::OutsidePods),
        (None, false) => Err(Unrecognised),
    }
}

/// The pod UID and container id in one cgroup path.
fn parse_path(path: &str) -> Option<(String, Option<String>)> {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != "." && *p != "..")
        .collect();
    let (at, uid) = parts
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, p)| pod_uid(p).map(|u| (i, u)))?;
    let container = parts.get(at + 1).and_then(|p| container_id(p));
    Some((uid, container))
}

/// `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid_>.slice` (systemd).
fn pod_uid(part: &str) -> Option<String> {
    let raw = if let Some(slice) = part.strip_suffix(".slice") {
        let at = slice.rfind("-pod")?;
        &slice[at + 4..]
    } else {
        part.strip_prefix("pod")?
    };
    let uid = raw.replace('_', "-");
    let hex = uid.bytes().filter(u8::is_ascii_hexdigit).count();
    let shape_ok = uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    (hex == 32 && shape_ok && !uid.starts_with('-')).then(|| uid.to_ascii_lowercase())
}

/// `<id>`, `cri-containerd-<id>.scope`, `crio-<id>[.scope]`, `docker-<id>.scope`; not conmon.
fn container_id(part: &str) -> Option<String> {
    let base = part.strip_suffix(".scope").unwrap_or(part);
    if base.starts_with("crio-conmon-") {
        return None;
    }
    let id = ["cri-containerd-", "crio-", "docker-", "containerd-"]
        .iter()
        .find_map(|p| base.strip_prefix(p))
        .unwrap_or(base);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "a9c80282-3f6b-4d5b-84d5-a137a6668011";
    const UID_: &str = "a9c80282_3f6b_4d5b_84d5_a137a6668011";
    const CID: &str = "4f1c0b7e93a2d5c8e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9";

    fn pod(container: Option<&str>) -> Result<CgroupOwner, Unrecognised> {
        Ok(CgroupOwner::Pod {
            uid: UID.into(),
            container_id: container.map(str::to_owned),
        })
    }

    #[test]
    fn v2_systemd_containerd() {
        let text = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n");
        assert_eq!(parse(&text), pod(Some(CID)));
    }

    #[test]
    fn v2_systemd_crio_with_payload_sub_cgroup_and_conmon() {
        let text = format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope/container\n");
        assert_eq!(parse(&text), pod(Some(CID)));
        let conmon = format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-conmon-{CID}.scope\n");
        assert_eq!(parse(&conmon), pod(None));
    }

    #[test]
    fn v2_systemd_guaranteed_pod_under_cri_dockerd() {
        let text = format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope\n");
        assert_eq!(parse(&text), pod(Some(CID)));
    }

    #[test]
    fn v2_cgroupfs_containerd_and_crio() {
        let text = format!("0::/kubepods/burstable/pod{UID}/{CID}\n");
        assert_eq!(parse(&text), pod(Some(CID)));
        let crio = format!("0::/kubepods/besteffort/pod{UID}/crio-{CID}\n");
        assert_eq!(parse(&crio), pod(Some(CID)));
        let guaranteed = format!("0::/kubepods/pod{UID}/{CID}\n");
        assert_eq!(parse(&guaranteed), pod(Some(CID)));
    }

    #[test]
    fn v1_cgroupfs_containerd_every_controller_line() {
        // As on an Ubuntu 20.04 node with cgroup v1 and the cgroupfs driver.
        let p = format!("/kubepods/besteffort/pod{UID}/{CID}");
        let text = format!(
            "12:freezer:{p}\n11:devices:{p}\n10:memory:{p}\n9:pids:{p}\n8:cpu,cpuacct:{p}\n\
             7:blkio:{p}\n6:net_cls,net_prio:{p}\n5:perf_event:{p}\n4:hugetlb:{p}\n\
             3:cpuset:{p}\n2:rdma:/\n1:name=systemd:{p}\n0::/\n"
        );
        assert_eq!(parse(&text), pod(Some(CID)));
    }

    #[test]
    fn hybrid_cgroupfs_containerd_runc_as_read_from_a_real_pod() {
        // Read from /proc/<pid>/cgroup of a real containerd 1.6.20 + runc 1.1.5 pod (cgroupfs
        // driver, hybrid host: v1 controllers and cgroup2 at /sys/fs/cgroup/unified), the
        // workload and then the sandbox's pause process: the same path on every line, `0::`
        // included, ending in the container id or the sandbox id.
        let uid = "1591d3d5-6f96-4cc3-ab34-5573981b199c";
        for id in [
            "6c5eaaeb949c296e23f940599cc40d825bc9f0d117c9b598fc88849836d767dd",
            "440c0468fec2240222898a75822d4208d8af0640c9882805f7abf25662ae8ef9",
        ] {
            let p = format!("/kubepods/besteffort/pod{uid}/{id}");
            let text = format!(
                "9:name=systemd:{p}\n8:pids:{p}\n7:blkio:{p}\n6:freezer:{p}\n5:devices:{p}\n\
                 4:memory:{p}\n3:cpuset:{p}\n2:cpuacct:{p}\n1:cpu:{p}\n0::{p}\n"
            );
            assert_eq!(
                parse(&text),
                Ok(CgroupOwner::Pod {
                    uid: uid.into(),
                    container_id: Some(id.into()),
                })
            );
        }
    }

    #[test]
    fn v1_systemd_containerd_and_crio() {
        // cgroup v1 with the systemd driver (e.g. RHEL 8 / OpenShift 4.x before cgroup v2):
        // containerd's `cri-containerd-<id>.scope`, CRI-O's `crio-<id>.scope`, next to
        // controllers the runtime did not place (`rdma` at the root).
        for scope in [
            format!("cri-containerd-{CID}.scope"),
            format!("crio-{CID}.scope"),
        ] {
            let p = format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/{scope}"
            );
            let text = format!(
                "12:rdma:/\n11:memory:{p}\n10:cpu,cpuacct:{p}\n7:pids:{p}\n1:name=systemd:{p}\n"
            );
            assert_eq!(parse(&text), pod(Some(CID)), "{text}");
        }
    }

    #[test]
    fn crio_cgroupfs_v1_infra_container() {
        // CRI-O with the cgroupfs driver names the pod's infra (pause) container like any other:
        // `crio-<sandbox id>` under the pod cgroup; conmon sits in the pod cgroup itself.
        let p = format!("/kubepods/besteffort/pod{UID}/crio-{CID}");
        let text = format!("11:memory:{p}\n4:pids:{p}\n1:name=systemd:{p}\n");
        assert_eq!(parse(&text), pod(Some(CID)));
        let conmon = format!("11:memory:/kubepods/besteffort/pod{UID}\n1:name=systemd:/kubepods/besteffort/pod{UID}\n");
        assert_eq!(parse(&conmon), pod(None));
    }

    #[test]
    fn v1_systemd_docker_and_hybrid_host() {
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope"
        );
        let text = format!(
            "11:memory:{p}\n4:pids:{p}\n1:name=systemd:{p}\n0::/system.slice/containerd.service\n"
        );
        assert_eq!(parse(&text), pod(Some(CID)));
    }

    #[test]
    fn private_cgroup_namespace_and_nested_roots() {
        // containerd's default on cgroup v2: the reader sees paths relative to its own cgroup.
        let ns =
            format!("0::/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n");
        assert_eq!(parse(&ns), pod(Some(CID)));
        // kind, and Docker-in-Docker.
        let kind = format!("0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n");
        assert_eq!(parse(&kind), pod(Some(CID)));
        let dind = format!("0::/docker/{CID}/kubepods/burstable/pod{UID}/{CID}\n");
        assert_eq!(parse(&dind), pod(Some(CID)));
    }

    #[test]
    fn static_pod_uids_have_no_dashes() {
        let text = format!("0::/kubepods/burstable/pod6b2e7f09c6a54a91b38e0cce77f1d3a2/{CID}\n");
        assert_eq!(
            parse(&text),
            Ok(CgroupOwner::Pod {
                uid: "6b2e7f09c6a54a91b38e0cce77f1d3a2".into(),
                container_id: Some(CID.into()),
            })
        );
    }

    #[test]
    fn processes_outside_pods() {
        for text in [
            "0::/system.slice/nvidia-persistenced.service\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "0::/\n",
            // A standalone Docker container: a container, but no pod.
            &format!("0::/system.slice/docker-{CID}.scope\n"),
            &format!("12:memory:/docker/{CID}\n0::/\n"),
        ] {
            assert_eq!(parse(text), Ok(CgroupOwner::OutsidePods), "{text}");
        }
    }

    #[test]
    fn near_misses_are_not_pods() {
        for text in [
            // Too short a UID (dcgm-exporter's test vector), not hex, the QoS slice itself.
            "0::/kubepods/pod123/container\n",
            "0::/kubepods/podzzzzzzzz-3f6b-4d5b-84d5-a137a6668011/x\n",
            "0::/kubepods.slice/kubepods-burstable.slice\n",
            "0::/kubepods\n",
        ] {
            assert_eq!(parse(text), Ok(CgroupOwner::OutsidePods), "{text}");
        }
        // A pod cgroup with a leaf that is no container id.
        let text = format!("0::/kubepods/burstable/pod{UID}/not-a-container\n");
        assert_eq!(parse(&text), pod(None));
    }

    #[test]
    fn garbage_is_unrecognised() {
        for text in ["", "\n", "hello\n", "x:y:z\n", "1:memory:relative/path\n"] {
            assert_eq!(parse(text), Err(Unrecognised), "{text:?}");
        }
    }

    #[test]
    fn uppercase_ids_are_normalised() {
        let text = format!(
            "0::/kubepods/pod{}/{}\n",
            UID.to_uppercase(),
            CID.to_uppercase()
        );
        assert_eq!(parse(&text), pod(Some(CID)));
    }
}
