//! A test Kubernetes API server: real HTTP/1.1 on 127.0.0.1 (hyper), speaking the API's JSON
//! as the exporter's client (kube-rs) reads it: `v1` ConfigMap `get`, Pod `list` (a `PodList`,
//! or a `PartialObjectMetadataList` when the `Accept` header asks for metadata only) with
//! `fieldSelector=spec.nodeName=...` and `resourceVersion`, and `?watch=true` as a chunked
//! stream of `{"type":...,"object":...}` lines (ADDED, MODIFIED, DELETED, BOOKMARK, and ERROR
//! carrying a `Status`, 410 when the resourceVersion is older than the kept history).
//! Bearer-token authentication (401), per verb and resource refusals (403), and calls that
//! never answer (a hung server) are switched on by the tests.

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// The token the kubeconfig carries.
pub const TOKEN: &str = "test-token-0123";

/// A pod for [`ApiServer::expire`]: namespace, name, UID, node, labels.
pub type PodSpec<'a> = (&'a str, &'a str, &'a str, &'a str, &'a [(&'a str, &'a str)]);

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// One pod, as stored.
#[derive(Clone)]
struct StoredPod {
    node: String,
    object: Value,
}

struct Watcher {
    node: Option<String>,
    metadata_only: bool,
    tx: mpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>,
}

#[derive(Default)]
struct State {
    version: u64,
    /// Events older than this resourceVersion are forgotten: a watch from before gets 410.
    compacted: u64,
    pods: BTreeMap<(String, String), StoredPod>,
    history: Vec<(u64, &'static str, StoredPod)>,
    configmaps: BTreeMap<(String, String), BTreeMap<String, String>>,
    watchers: Vec<Watcher>,
    forbidden: HashSet<(String, String)>,
    hang: HashSet<String>,
    requests: Vec<String>,
    /// Every watch is answered with a 410 ERROR event at once.
    expire_watches: bool,
}

/// The server; it runs until the test's runtime ends.
#[derive(Clone)]
pub struct ApiServer {
    state: Arc<Mutex<State>>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// With TLS: the PEM of the CA that signed its certificate (for 127.0.0.1).
    pub ca_pem: Option<String>,
}

/// A CA and a server certificate for 127.0.0.1 signed by it: (CA PEM, server config).
fn tls_identity() -> (String, Arc<rustls::ServerConfig>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let ca = crate::common::tls::Ca::new("test cluster CA");
    let (cert, key) = ca.named_leaf("kube-apiserver", &["127.0.0.1"]);
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
    )
    .unwrap();
    (ca.pem(), Arc::new(config))
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn metadata_view(object: &Value, kind: &str) -> Value {
    json!({
        "kind": kind,
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object["metadata"].clone(),
    })
}

fn event_line(kind: &str, object: Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
    line.push(b'\n');
    Bytes::from(line)
}

fn full(code: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())).boxed())
        .unwrap()
}

fn query(uri: &hyper::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            let h = u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap();
            out.push(h);
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

impl ApiServer {
    /// Starts serving on 127.0.0.1, an ephemeral port, on a runtime of its own in a thread
    /// (so the tests can block on child processes).
    pub fn spawn() -> Self {
        Self::spawn_with(false)
    }

    /// [`ApiServer::spawn`], serving HTTPS with a certificate from a CA of its own.
    pub fn spawn_tls() -> Self {
        Self::spawn_with(true)
    }

    fn spawn_with(tls: bool) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                tx.send(Self::start(tls).await).unwrap();
                std::future::pending::<()>().await;
            });
        });
        rx.recv().unwrap()
    }

    /// Starts serving on 127.0.0.1, an ephemeral port.
    async fn start(tls: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ca_pem, acceptor) = if tls {
            let (ca, config) = tls_identity();
            (Some(ca), Some(tokio_rustls::TlsAcceptor::from(config)))
        } else {
            (None, None)
        };
        let server = ApiServer {
            state: Arc::new(Mutex::new(State {
                version: 100,
                ..State::default()
            })),
            addr,
            ca_pem,
        };
        let s = server.clone();
        tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(s.handle(req).await) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        Some(a) => {
                            // A refused handshake (a client that does not trust the CA) ends here.
                            if let Ok(tls) = a.accept(conn).await {
                                let _ = http.serve_connection(TokioIo::new(tls), svc).await;
                            }
                        }
                        None => {
                            let _ = http.serve_connection(TokioIo::new(conn), svc).await;
                        }
                    }
                });
            }
        });
        server
    }

    /// A kubeconfig pointing at this server with `token`, written under `dir`; with TLS, it
    /// names the server's CA (`ca`: another one instead).
    pub fn kubeconfig(&self, dir: &Path, token: &str) -> PathBuf {
        self.kubeconfig_with_ca(dir, token, self.ca_pem.as_deref())
    }

    /// [`ApiServer::kubeconfig`] trusting `ca` (PEM).
    pub fn kubeconfig_with_ca(&self, dir: &Path, token: &str, ca: Option<&str>) -> PathBuf {
        let path = dir.join(format!("kubeconfig-{token}"));
        let (scheme, ca_line) = match ca {
            Some(pem) => {
                let ca_path = dir.join(format!("ca-{token}.crt"));
                std::fs::write(&ca_path, pem).unwrap();
                (
                    "https",
                    format!("    certificate-authority: {}\n", ca_path.display()),
                )
            }
            None => ("http", String::new()),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {scheme}://{}\n{ca_line}contexts:\n- name: test\n  context:\n    cluster: test\n    user: exporter\ncurrent-context: test\nusers:\n- name: exporter\n  user:\n    token: {token}\n",
            self.addr
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Adds (or replaces) a ConfigMap.
    pub fn put_configmap(&self, ns: &str, name: &str, data: &[(&str, &str)]) {
        self.state.lock().unwrap().configmaps.insert(
            (ns.into(), name.into()),
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
    }

    /// Refuses `verb` on `resource` with 403.
    pub fn forbid(&self, verb: &str, resource: &str) {
        self.state
            .lock()
            .unwrap()
            .forbidden
            .insert((verb.into(), resource.into()));
    }

    /// Lets `verb` on `resource` through again.
    pub fn allow(&self, verb: &str, resource: &str) {
        self.state
            .lock()
            .unwrap()
            .forbidden
            .remove(&(verb.to_owned(), resource.to_owned()));
    }

    /// Calls with this verb (`get`, `list`, `watch`) are never answered.
    pub fn hang(&self, verb: &str) {
        self.state.lock().unwrap().hang.insert(verb.into());
    }

    /// Every watch from now on ends at once with a 410 ERROR event (a server whose watch cache
    /// is always behind).
    pub fn expire_every_watch(&self) {
        self.state.lock().unwrap().expire_watches = true;
    }

    /// Calls with this verb are answered again.
    pub fn unhang(&self, verb: &str) {
        self.state.lock().unwrap().hang.remove(verb);
    }

    /// The requests so far: `VERB resource ?query`.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }

    fn pod_object(
        version: u64,
        ns: &str,
        name: &str,
        uid: &str,
        node: &str,
        labels: &[(&str, &str)],
    ) -> Value {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
            .collect();
        json!({
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": uid,
                "resourceVersion": version.to_string(),
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "labels": labels,
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "registry.example/app:1"}],
            },
            "status": {"phase": "Running"},
        })
    }

    /// Adds or changes a pod; open watches get ADDED or MODIFIED.
    pub fn put_pod(&self, ns: &str, name: &str, uid: &str, node: &str, labels: &[(&str, &str)]) {
        let mut s = self.state.lock().unwrap();
        s.version += 1;
        let pod = StoredPod {
            node: node.into(),
            object: Self::pod_object(s.version, ns, name, uid, node, labels),
        };
        let kind = if s.pods.contains_key(&(ns.to_owned(), name.to_owned())) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        s.pods.insert((ns.into(), name.into()), pod.clone());
        let v = s.version;
        s.history.push((v, kind, pod.clone()));
        Self::notify(&mut s, kind, &pod);
    }

    /// Deletes a pod; open watches get DELETED.
    pub fn delete_pod(&self, ns: &str, name: &str) {
        let mut s = self.state.lock().unwrap();
        s.version += 1;
        let Some(mut pod) = s.pods.remove(&(ns.to_owned(), name.to_owned())) else {
            return;
        };
        pod.object["metadata"]["resourceVersion"] = json!(s.version.to_string());
        let v = s.version;
        s.history.push((v, "DELETED", pod.clone()));
        Self::notify(&mut s, "DELETED", &pod);
    }

    /// Sends a BOOKMARK with the current resourceVersion to every open watch.
    pub fn bookmark(&self) {
        let mut s = self.state.lock().unwrap();
        let v = s.version;
        s.watchers.retain(|w| {
            let object = json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": v.to_string()}});
            w.tx.send(Ok(Frame::data(event_line("BOOKMARK", object)))).is_ok()
        });
    }

    /// Ends every open watch cleanly (as the server does at the watch's `timeoutSeconds`).
    pub fn end_watches(&self) {
        self.state.lock().unwrap().watchers.clear();
    }

    /// Open watches.
    pub fn open_watches(&self) -> usize {
        let mut s = self.state.lock().unwrap();
        s.watchers.retain(|w| !w.tx.is_closed());
        s.watchers.len()
    }

    /// The watch cache forgets its history (as etcd compaction does): every open watch gets an
    /// ERROR event with a 410 `Status` and ends, and any watch from an older resourceVersion is
    /// refused the same way. `hidden` pods are added in the same step, without any event: only a
    /// new list can see them.
    pub fn expire(&self, hidden: &[PodSpec<'_>]) {
        let mut s = self.state.lock().unwrap();
        for (ns, name, uid, node, labels) in hidden {
            s.version += 1;
            let object = Self::pod_object(s.version, ns, name, uid, node, labels);
            s.pods.insert(
                ((*ns).into(), (*name).into()),
                StoredPod {
                    node: (*node).into(),
                    object,
                },
            );
        }
        s.version += 1;
        s.compacted = s.version;
        s.history.clear();
        let gone = status(410, "Expired", "too old resource version: 101 (150)");
        for w in s.watchers.drain(..) {
            let _ =
                w.tx.send(Ok(Frame::data(event_line("ERROR", gone.clone()))));
        }
    }

    fn notify(s: &mut State, kind: &str, pod: &StoredPod) {
        s.watchers.retain(|w| {
            if w.node.as_ref().is_some_and(|n| *n != pod.node) {
                return !w.tx.is_closed();
            }
            let object = if w.metadata_only {
                metadata_view(&pod.object, "PartialObjectMetadata")
            } else {
                pod.object.clone()
            };
            w.tx.send(Ok(Frame::data(event_line(kind, object)))).is_ok()
        });
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let q = query(req.uri());
        let auth = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let metadata_only = req
            .headers()
            .get("accept")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (verb, resource, ns, name) = match segments.as_slice() {
            ["api", "v1", "pods"] if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                ("watch", "pods", None, None)
            }
            ["api", "v1", "pods"] => ("list", "pods", None, None),
            ["api", "v1", "namespaces", ns, "configmaps", name] => (
                "get",
                "configmaps",
                Some((*ns).to_owned()),
                Some((*name).to_owned()),
            ),
            _ => {
                return full(
                    StatusCode::NOT_FOUND,
                    &status(
                        404,
                        "NotFound",
                        &format!("the server could not find the requested resource ({path})"),
                    ),
                )
            }
        };
        let hang = {
            let mut s = self.state.lock().unwrap();
            s.requests.push(format!(
                "{verb} {resource} ?{}",
                req.uri().query().unwrap_or("")
            ));
            s.hang.contains(verb)
        };
        if auth != format!("Bearer {TOKEN}") {
            return full(
                StatusCode::UNAUTHORIZED,
                &status(401, "Unauthorized", "Unauthorized"),
            );
        }
        if self
            .state
            .lock()
            .unwrap()
            .forbidden
            .contains(&(verb.to_owned(), resource.to_owned()))
        {
            let message = format!("{resource} is forbidden: User \"system:serviceaccount:gpu:gpu-exporter\" cannot {verb} resource \"{resource}\" in API group \"\" at the cluster scope");
            return full(StatusCode::FORBIDDEN, &status(403, "Forbidden", &message));
        }
        if hang {
            std::future::pending::<()>().await;
        }
        let node = q
            .get("fieldSelector")
            .and_then(|f| f.strip_prefix("spec.nodeName="))
            .map(str::to_owned);
        match verb {
            "get" => {
                let (ns, name) = (ns.unwrap(), name.unwrap());
                let s = self.state.lock().unwrap();
                match s.configmaps.get(&(ns.clone(), name.clone())) {
                    Some(data) => full(
                        StatusCode::OK,
                        &json!({
                            "kind": "ConfigMap",
                            "apiVersion": "v1",
                            "metadata": {"name": name, "namespace": ns, "uid": "cm-uid-1", "resourceVersion": "7"},
                            "data": data,
                        }),
                    ),
                    None => full(
                        StatusCode::NOT_FOUND,
                        &status(404, "NotFound", &format!("configmaps \"{name}\" not found")),
                    ),
                }
            }
            "list" => {
                let s = self.state.lock().unwrap();
                let items: Vec<Value> = s
                    .pods
                    .values()
                    .filter(|p| node.as_ref().is_none_or(|n| *n == p.node))
                    .map(|p| {
                        if metadata_only {
                            metadata_view(&p.object, "PartialObjectMetadata")
                        } else {
                            p.object.clone()
                        }
                    })
                    .collect();
                let (kind, api_version) = if metadata_only {
                    ("PartialObjectMetadataList", "meta.k8s.io/v1")
                } else {
                    ("PodList", "v1")
                };
                full(
                    StatusCode::OK,
                    &json!({
                        "kind": kind,
                        "apiVersion": api_version,
                        "metadata": {"resourceVersion": s.version.to_string()},
                        "items": items,
                    }),
                )
            }
            _ => {
                let from: u64 = q
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let (tx, rx) = mpsc::unbounded_channel();
                {
                    let mut s = self.state.lock().unwrap();
                    if s.expire_watches {
                        let gone = status(410, "Expired", "too old resource version");
                        let _ = tx.send(Ok(Frame::data(event_line("ERROR", gone))));
                    } else if from < s.compacted {
                        let gone = status(
                            410,
                            "Expired",
                            &format!("too old resource version: {from} ({})", s.compacted),
                        );
                        let _ = tx.send(Ok(Frame::data(event_line("ERROR", gone))));
                    } else {
                        for (v, kind, pod) in &s.history {
                            if *v > from && node.as_ref().is_none_or(|n| *n == pod.node) {
                                let object = if metadata_only {
                                    metadata_view(&pod.object, "PartialObjectMetadata")
                                } else {
                                    pod.object.clone()
                                };
                                let _ = tx.send(Ok(Frame::data(event_line(kind, object))));
                            }
                        }
                        s.watchers.push(Watcher {
                            node,
                            metadata_only,
                            tx,
                        });
                    }
                }
                let body = StreamBody::new(UnboundedReceiverStream::new(rx));
                Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/json")
                    .body(BodyExt::boxed(body))
                    .unwrap()
            }
        }
    }
}
