//! [`PodDirectory`]: pure lookups built from one container-runtime (CRI) answer: container id →
//! pod and container, and (namespace, pod) → UID and labels.
//!
//! - A pod can have several sandboxes (one per restart of the sandbox, `attempt`); the ready one
//!   wins, then the newest.
//! - Pod labels come from the sandbox labels, which the kubelet sets to the pod's labels when it
//!   creates the sandbox, plus its own `io.kubernetes.pod.{name,namespace,uid}`; keys under
//!   `io.kubernetes.` are never pod labels and are left out. Labels added to a running pod later
//!   (`kubectl label`) are not in the sandbox: the CRI has no call to update them.
//! - A sandbox id resolves too: the sandbox's own process (the pause process, whose cgroup names
//!   the sandbox id, not a container id) belongs to its pod, with an empty container name
//!   (`container=""`, as cAdvisor labels a containerd sandbox). It is not a container: the
//!   container count leaves it out.
//! - Label names are sanitised as dcgm-exporter does (every character outside `[a-zA-Z0-9_]`
//!   becomes `_`), and a leading digit gets a `_` in front so the name is valid. Names starting
//!   with `__` (reserved by Prometheus) are dropped; of two keys that sanitise to the same name,
//!   the first in key order wins.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use regex::Regex;

use super::cri_proto::{Container, PodSandbox, PodSandboxState};
use super::PodRef;

/// The container runtime's answer: every sandbox and container on the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeSnapshot {
    /// `ListPodSandbox`.
    pub sandboxes: Vec<PodSandbox>,
    /// `ListContainers`.
    pub containers: Vec<Container>,
}

/// Which pod labels become Prometheus labels.
#[derive(Debug, Clone, Default)]
pub struct LabelOptions {
    /// `--kubernetes-enable-pod-labels`.
    pub enabled: bool,
    /// `--kubernetes-pod-label-allowlist-regex`: a label is kept if any pattern matches
    /// (anywhere in) its key; empty keeps every label.
    pub allowlist: Vec<Regex>,
}

impl LabelOptions {
    fn allows(&self, key: &str) -> bool {
        self.enabled
            && (self.allowlist.is_empty() || self.allowlist.iter().any(|r| r.is_match(key)))
    }
}

/// What the runtime says about one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodMeta {
    /// The pod UID.
    pub uid: String,
    /// Allowlisted labels, names sanitised, sorted by name (empty unless pod labels are on).
    pub labels: Vec<(String, String)>,
}

/// What the API server says about one pod (its metadata, as listed or watched).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApiPod {
    /// The pod UID.
    pub uid: String,
    /// All its labels, as the API server has them.
    pub labels: BTreeMap<String, String>,
}

/// What the runtime says about one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerMeta {
    /// Namespace, pod and container name.
    pub pod: PodRef,
    /// The pod's metadata.
    pub meta: Arc<PodMeta>,
}

/// Lookups from one runtime answer. The default is "no answer": nothing is known.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodDirectory {
    available: bool,
    pods: HashMap<(String, String), Arc<PodMeta>>,
    containers: HashMap<String, ContainerMeta>,
    /// Sandbox id → its pod, with an empty container name.
    sandboxes: HashMap<String, ContainerMeta>,
}

const KUBELET_PREFIX: &str = "io.kubernetes.";
const POD_NAME: &str = "io.kubernetes.pod.name";
const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
const POD_UID: &str = "io.kubernetes.pod.uid";
const CONTAINER_NAME: &str = "io.kubernetes.container.name";

impl PodDirectory {
    /// Builds the lookups from a runtime answer.
    pub fn from_runtime(snapshot: &RuntimeSnapshot, labels: &LabelOptions) -> Self {
        // The sandbox that speaks for each pod: ready first, then the newest.
        let rank = |s: &PodSandbox| {
            (
                s.state == PodSandboxState::SandboxReady as i32,
                s.created_at,
            )
        };
        let mut best: HashMap<(String, String), &PodSandbox> = HashMap::new();
        for s in &snapshot.sandboxes {
            let Some(m) = &s.metadata else { continue };
            if m.name.is_empty() || m.namespace.is_empty() {
                continue;
            }
            best.entry((m.namespace.clone(), m.name.clone()))
                .and_modify(|cur| {
                    if rank(s) > rank(cur) {
                        *cur = s;
                    }
                })
                .or_insert(s);
        }
        let meta_of = |s: &PodSandbox| -> Arc<PodMeta> {
            Arc::new(PodMeta {
                uid: s
                    .metadata
                    .as_ref()
                    .map(|m| m.uid.clone())
                    .unwrap_or_default(),
                labels: pod_labels(&s.labels, labels),
            })
        };
        let mut pods = HashMap::with_capacity(best.len());
        let mut by_sandbox: HashMap<&str, (PodRef, Arc<PodMeta>)> = HashMap::new();
        for ((namespace, name), s) in &best {
            pods.insert((namespace.clone(), name.clone()), meta_of(s));
        }
        for s in &snapshot.sandboxes {
            let Some(m) = &s.metadata else { continue };
            let meta = match pods.get(&(m.namespace.clone(), m.name.clone())) {
                // Every sandbox of a pod whose best sandbox has this UID shares its metadata;
                // an older sandbox of a since-recreated pod (another UID) gets its own.
                Some(p) if p.uid == m.uid => Arc::clone(p),
                _ => meta_of(s),
            };
            let pod = PodRef {
                namespace: m.namespace.clone(),
                pod: m.name.clone(),
                container: String::new(),
            };
            by_sandbox.insert(s.id.as_str(), (pod, meta));
        }
        let sandboxes = by_sandbox
            .iter()
            .filter(|(id, _)| !id.is_empty())
            .map(|(id, (pod, meta))| {
                let meta = Arc::clone(meta);
                (
                    id.to_ascii_lowercase(),
                    ContainerMeta {
                        pod: pod.clone(),
                        meta,
                    },
                )
            })
            .collect();
        let mut containers = HashMap::with_capacity(snapshot.containers.len());
        for c in &snapshot.containers {
            if c.id.is_empty() {
                continue;
            }
            let name = c
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .filter(|n| !n.is_empty())
                .or_else(|| c.labels.get(CONTAINER_NAME).cloned())
                .unwrap_or_default();
            let (mut pod, meta) = match by_sandbox.get(c.pod_sandbox_id.as_str()) {
                Some((pod, meta)) => (pod.clone(), Arc::clone(meta)),
                // The sandbox was not listed (created between the two calls): the kubelet's
                // container labels still name the pod.
                None => match (c.labels.get(POD_NAMESPACE), c.labels.get(POD_NAME)) {
                    (Some(ns), Some(p)) => {
                        let meta =
                            pods.get(&(ns.clone(), p.clone()))
                                .cloned()
                                .unwrap_or_else(|| {
                                    Arc::new(PodMeta {
                                        uid: c.labels.get(POD_UID).cloned().unwrap_or_default(),
                                        labels: Vec::new(),
                                    })
                                });
                        let pod = PodRef {
                            namespace: ns.clone(),
                            pod: p.clone(),
                            container: String::new(),
                        };
                        (pod, meta)
                    }
                    _ => continue,
                },
            };
            pod.container = name;
            containers.insert(c.id.to_ascii_lowercase(), ContainerMeta { pod, meta });
        }
        Self {
            available: true,
            pods,
            containers,
            sandboxes,
        }
    }

    /// Builds the pod lookups from the API server's pods, (namespace, name) → metadata: the
    /// same label allowlist and sanitising as [`PodDirectory::from_runtime`]. No containers are
    /// known this way (per-process attribution needs the runtime).
    pub fn from_api<'a>(
        pods: impl IntoIterator<Item = (&'a (String, String), &'a ApiPod)>,
        labels: &LabelOptions,
    ) -> Self {
        let pods = pods
            .into_iter()
            .map(|(key, p)| {
                let meta = PodMeta {
                    uid: p.uid.clone(),
                    labels: pod_labels(&p.labels, labels),
                };
                (key.clone(), Arc::new(meta))
            })
            .collect();
        Self {
            available: true,
            pods,
            containers: HashMap::new(),
            sandboxes: HashMap::new(),
        }
    }

    /// Whether this is a runtime answer (false: none yet, or none within the TTL).
    pub fn is_available(&self) -> bool {
        self.available
    }

    /// The pod `namespace/name`.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Arc<PodMeta>> {
        self.pods.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// The container with runtime id `id` (lowercase hex); a sandbox id gives its pod with an
    /// empty container name (the sandbox's pause process).
    pub fn container(&self, id: &str) -> Option<&ContainerMeta> {
        self.containers.get(id).or_else(|| self.sandboxes.get(id))
    }

    /// Number of pods known.
    pub fn pods_len(&self) -> usize {
        self.pods.len()
    }

    /// Number of containers known.
    pub fn containers_len(&self) -> usize {
        self.containers.len()
    }
}

fn pod_labels<'a>(
    raw: impl IntoIterator<Item = (&'a String, &'a String)>,
    opts: &LabelOptions,
) -> Vec<(String, String)> {
    if !opts.enabled {
        return Vec::new();
    }
    let mut kept: Vec<(&String, &String)> = raw
        .into_iter()
        .filter(|(k, _)| !k.starts_with(KUBELET_PREFIX) && opts.allows(k))
        .collect();
    kept.sort();
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in kept {
        let name = sanitize_label_name(k);
        if name.starts_with("__") {
            continue;
        }
        out.entry(name).or_insert_with(|| v.clone());
    }
    out.into_iter().collect()
}

/// dcgm-exporter's label name sanitisation (`[^a-zA-Z0-9_]` → `_`), with a `_` in front of a
/// leading digit so the result is always a valid Prometheus label name.
pub fn sanitize_label_name(key: &str) -> String {
    let mut s: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::cri_proto::{ContainerMetadata, PodSandboxMetadata};

    fn sandbox(id: &str, ns: &str, name: &str, uid: &str, ready: bool, created: i64) -> PodSandbox {
        let mut labels: HashMap<String, String> = [
            (POD_NAME, name),
            (POD_NAMESPACE, ns),
            (POD_UID, uid),
            ("app.kubernetes.io/name", "embed"),
            ("team", "search"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        labels.insert("pod-template-hash".into(), "7f9c8d6b5".into());
        PodSandbox {
            id: id.into(),
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: ns.into(),
                attempt: 0,
            }),
            state: if ready {
                PodSandboxState::SandboxReady as i32
            } else {
                PodSandboxState::SandboxNotready as i32
            },
            created_at: created,
            labels,
            ..Default::default()
        }
    }

    fn container(id: &str, sandbox: &str, name: &str) -> Container {
        Container {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            ..Default::default()
        }
    }

    fn all_labels() -> LabelOptions {
        LabelOptions {
            enabled: true,
            allowlist: vec![],
        }
    }

    #[test]
    fn api_pods_get_the_same_labels_as_runtime_pods() {
        let labels: BTreeMap<String, String> = [
            ("app.kubernetes.io/name", "embed"),
            ("team", "search"),
            ("io.kubernetes.pod.name", "embed-0"),
            ("9lives", "yes"),
            ("__reserved", "x"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let pods = [(
            ("infer".to_owned(), "embed-0".to_owned()),
            ApiPod {
                uid: "u-1".into(),
                labels,
            },
        )];
        let dir = PodDirectory::from_api(pods.iter().map(|(k, p)| (k, p)), &all_labels());
        assert!(dir.is_available());
        assert_eq!((dir.pods_len(), dir.containers_len()), (1, 0));
        let meta = dir.pod("infer", "embed-0").expect("the pod");
        assert_eq!(meta.uid, "u-1");
        assert_eq!(
            meta.labels,
            [
                ("_9lives", "yes"),
                ("app_kubernetes_io_name", "embed"),
                ("team", "search")
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        let only = LabelOptions {
            enabled: true,
            allowlist: vec![Regex::new("^team$").unwrap()],
        };
        let dir = PodDirectory::from_api(pods.iter().map(|(k, p)| (k, p)), &only);
        assert_eq!(
            dir.pod("infer", "embed-0").unwrap().labels,
            vec![("team".to_owned(), "search".to_owned())]
        );
        let off =
            PodDirectory::from_api(pods.iter().map(|(k, p)| (k, p)), &LabelOptions::default());
        assert!(off.pod("infer", "embed-0").unwrap().labels.is_empty());
    }

    #[test]
    fn containers_resolve_to_pods_and_the_ready_sandbox_speaks_for_the_pod() {
        let snap = RuntimeSnapshot {
            sandboxes: vec![
                sandbox("s-old", "infer", "embed-a", "uid-old", false, 1),
                sandbox("s-new", "infer", "embed-a", "uid-new", true, 2),
                sandbox("s-b", "infer", "embed-b", "uid-b", true, 1),
            ],
            containers: vec![
                container("ABC", "s-new", "server"),
                container("old", "s-old", "server"),
                container("b1", "s-b", "sidecar"),
            ],
        };
        let d = PodDirectory::from_runtime(&snap, &LabelOptions::default());
        assert!(d.is_available());
        assert_eq!(d.pod("infer", "embed-a").unwrap().uid, "uid-new");
        assert!(d.pod("infer", "embed-a").unwrap().labels.is_empty());
        let c = d.container("abc").unwrap();
        assert_eq!(
            (
                c.pod.namespace.as_str(),
                c.pod.pod.as_str(),
                c.pod.container.as_str()
            ),
            ("infer", "embed-a", "server")
        );
        assert_eq!(c.meta.uid, "uid-new");
        // The old sandbox's container keeps its own UID.
        assert_eq!(d.container("old").unwrap().meta.uid, "uid-old");
        assert_eq!(d.container("b1").unwrap().pod.container, "sidecar");
        assert_eq!((d.pods_len(), d.containers_len()), (2, 3));
        assert!(!PodDirectory::default().is_available());
    }

    #[test]
    fn a_sandbox_id_resolves_to_its_pod_without_a_container() {
        // The pause process's cgroup names the sandbox id (seen under containerd 1.6 + runc:
        // `.../pod<uid>/<sandbox id>`); it belongs to the pod, not to any container.
        let snap = RuntimeSnapshot {
            sandboxes: vec![
                sandbox("S-NEW", "infer", "embed-a", "uid-new", true, 2),
                sandbox("s-old", "infer", "embed-a", "uid-old", false, 1),
            ],
            containers: vec![container("abc", "S-NEW", "server")],
        };
        let d = PodDirectory::from_runtime(&snap, &all_labels());
        let pause = d.container("s-new").unwrap();
        assert_eq!(
            (
                pause.pod.namespace.as_str(),
                pause.pod.pod.as_str(),
                pause.pod.container.as_str()
            ),
            ("infer", "embed-a", "")
        );
        assert_eq!(pause.meta.uid, "uid-new");
        assert!(Arc::ptr_eq(&pause.meta, d.pod("infer", "embed-a").unwrap()));
        // An old sandbox of a recreated pod keeps its own UID, as its containers do.
        assert_eq!(d.container("s-old").unwrap().meta.uid, "uid-old");
        // Sandboxes are not counted as containers.
        assert_eq!((d.pods_len(), d.containers_len()), (1, 1));
        assert!(d.container("s-gone").is_none());
    }

    #[test]
    fn a_container_whose_sandbox_is_not_listed_is_named_by_its_labels() {
        let mut c = container("c1", "unlisted", "");
        c.labels = [
            (POD_NAME, "p"),
            (POD_NAMESPACE, "ns"),
            (POD_UID, "u1"),
            (CONTAINER_NAME, "main"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let snap = RuntimeSnapshot {
            sandboxes: vec![],
            containers: vec![c, container("c2", "unlisted", "x")],
        };
        let d = PodDirectory::from_runtime(&snap, &all_labels());
        let c1 = d.container("c1").unwrap();
        assert_eq!(
            (c1.pod.pod.as_str(), c1.pod.container.as_str()),
            ("p", "main")
        );
        assert_eq!(c1.meta.uid, "u1");
        // Neither the sandbox nor labels: unknown.
        assert!(d.container("c2").is_none());
    }

    #[test]
    fn labels_are_allowlisted_sanitised_and_kubelet_keys_dropped() {
        let snap = RuntimeSnapshot {
            sandboxes: vec![sandbox("s", "ns", "p", "u", true, 1)],
            containers: vec![],
        };
        let d = PodDirectory::from_runtime(&snap, &all_labels());
        assert_eq!(
            d.pod("ns", "p").unwrap().labels,
            vec![
                ("app_kubernetes_io_name".to_owned(), "embed".to_owned()),
                ("pod_template_hash".to_owned(), "7f9c8d6b5".to_owned()),
                ("team".to_owned(), "search".to_owned()),
            ]
        );
        let only = LabelOptions {
            enabled: true,
            allowlist: vec![
                Regex::new("^team$").unwrap(),
                Regex::new("kubernetes\\.io/").unwrap(),
            ],
        };
        let d = PodDirectory::from_runtime(&snap, &only);
        let names: Vec<&str> = d
            .pod("ns", "p")
            .unwrap()
            .labels
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(names, ["app_kubernetes_io_name", "team"]);
    }

    #[test]
    fn sanitising_matches_dcgm_exporter_and_stays_valid() {
        assert_eq!(
            sanitize_label_name("label.with.dots/and-slashes"),
            "label_with_dots_and_slashes"
        );
        assert_eq!(
            sanitize_label_name("label@with#special!chars"),
            "label_with_special_chars"
        );
        assert_eq!(sanitize_label_name("valid_label_name"), "valid_label_name");
        assert_eq!(sanitize_label_name("3d.example.com/x"), "_3d_example_com_x");
        assert_eq!(sanitize_label_name("ünï"), "_n_");
        // Two keys that collide after sanitising: the first in key order wins.
        let raw: HashMap<String, String> = [("a-b", "1"), ("a.b", "2"), ("a_b", "3")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(
            pod_labels(&raw, &all_labels()),
            vec![("a_b".to_owned(), "1".to_owned())]
        );
    }
}
