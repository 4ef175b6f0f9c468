//! The Kubernetes API server, where dcgm-exporter reads it: the metrics CSV from a ConfigMap
//! (`-m namespace:name`), and pod UIDs and labels from a node-scoped list and watch of pods when
//! no container runtime socket is mounted (the GPU Operator's case).
//!
//! Read-only: `get` on one ConfigMap, `list` and `watch` on pods. The client is kube-rs
//! (rustls on ring); its configuration is `KUBECONFIG` (or `~/.kube/config`) when there is one,
//! else the pod's service account (in-cluster).

pub mod client;
pub mod configmap;
pub mod error;
pub mod metrics;
pub mod pods;

pub use error::{Call, KubeError};
