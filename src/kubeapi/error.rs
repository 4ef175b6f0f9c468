//! [`KubeError`]: what can go wrong talking to the API server, each naming the call (verb,
//! resource, object) and, for a refusal, what grants it.

use std::fmt;
use std::time::Duration;

/// One call to the API server: `get configmaps gpu-operator/metrics`, `list pods on node n1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The RBAC verb: `get`, `list`, `watch`.
    pub verb: &'static str,
    /// The RBAC resource: `pods`, `configmaps`.
    pub resource: &'static str,
    /// Which objects: `gpu-operator/metrics`, `on node n1`, `in all namespaces`.
    pub target: String,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.verb, self.resource, self.target)
    }
}

/// Errors of the Kubernetes API client.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// Neither a kubeconfig nor the in-cluster service account was found.
    #[error("no Kubernetes API configuration (set KUBECONFIG, or run in a pod with its service account token mounted)")]
    Config(#[source] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("Kubernetes API client for {url}")]
    Client {
        /// The API server.
        url: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// 401: the credentials were refused.
    #[error("{call}: 401 Unauthorized ({message}): the API server refused the credentials (the service account token, or KUBECONFIG's user)")]
    Unauthorized {
        /// The call.
        call: Call,
        /// The server's message.
        message: String,
    },
    /// 403: RBAC does not grant the call.
    #[error("{call}: 403 Forbidden ({message}): grant verb `{verb}` on resource `{resource}` to the exporter's service account (the Helm chart does with kubernetes.rbac.create=true)", verb = call.verb, resource = call.resource)]
    Forbidden {
        /// The call.
        call: Call,
        /// The server's message.
        message: String,
    },
    /// 404.
    #[error("{call}: 404 Not Found ({message})")]
    NotFound {
        /// The call.
        call: Call,
        /// The server's message.
        message: String,
    },
    /// 410 Gone: the watch's resourceVersion is too old; a new list is needed.
    #[error("{call}: 410 Gone ({message}): listing again")]
    Gone {
        /// The call.
        call: Call,
        /// The server's message.
        message: String,
    },
    /// Another error status.
    #[error("{call}: {code} ({message})")]
    Status {
        /// The call.
        call: Call,
        /// The HTTP status code.
        code: u16,
        /// The server's message.
        message: String,
    },
    /// No answer in time.
    #[error("{call}: no answer within {timeout:?}")]
    Timeout {
        /// The call.
        call: Call,
        /// The limit.
        timeout: Duration,
    },
    /// The answer could not be decoded.
    #[error("{call}: undecodable answer")]
    Decode {
        /// The call.
        call: Call,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The server could not be reached, or the connection broke.
    #[error("{call} failed")]
    Transport {
        /// The call.
        call: Call,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The ConfigMap has no such key.
    #[error("configmap {configmap}: no `{key}` key (it has: {keys})")]
    NoKey {
        /// `namespace/name`.
        configmap: String,
        /// The key looked for.
        key: &'static str,
        /// The keys it has.
        keys: String,
    },
    /// The ConfigMap's CSV is over the size limit.
    #[error(
        "configmap {configmap} key {key}: {len} bytes, over the {cap}-byte limit of a metrics CSV"
    )]
    TooLarge {
        /// `namespace/name`.
        configmap: String,
        /// The key.
        key: &'static str,
        /// Its size.
        len: usize,
        /// The limit.
        cap: usize,
    },
}

impl KubeError {
    /// Every [`KubeError::reason`] a call can give (the `reason` label values).
    pub const REASONS: &'static [&'static str] = &[
        "unauthorized",
        "forbidden",
        "not_found",
        "gone",
        "api_error",
        "timeout",
        "decode",
        "unreachable",
    ];

    /// A call's failure, from kube-rs's error.
    pub fn from_kube(call: Call, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => Self::from_status(call, s.code, s.message.clone()),
            e @ kube::Error::SerdeError(_) => Self::Decode { call, source: e },
            source => Self::Transport { call, source },
        }
    }

    /// A call's failure, from a status code and the server's message.
    pub fn from_status(call: Call, code: u16, message: String) -> Self {
        match code {
            401 => Self::Unauthorized { call, message },
            403 => Self::Forbidden { call, message },
            404 => Self::NotFound { call, message },
            410 => Self::Gone { call, message },
            code => Self::Status {
                call,
                code,
                message,
            },
        }
    }

    /// The `reason` label of a failed call.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unauthorized { .. } => "unauthorized",
            Self::Forbidden { .. } => "forbidden",
            Self::NotFound { .. } => "not_found",
            Self::Gone { .. } => "gone",
            Self::Status { .. } | Self::NoKey { .. } | Self::TooLarge { .. } => "api_error",
            Self::Timeout { .. } => "timeout",
            Self::Decode { .. } => "decode",
            Self::Config(_) | Self::Client { .. } | Self::Transport { .. } => "unreachable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> Call {
        Call {
            verb: "watch",
            resource: "pods",
            target: "on node n1".into(),
        }
    }

    #[test]
    fn a_refusal_names_the_verb_and_resource_to_grant() {
        let e = KubeError::from_status(call(), 403, "pods is forbidden".into());
        assert_eq!(e.reason(), "forbidden");
        assert_eq!(
            e.to_string(),
            "watch pods on node n1: 403 Forbidden (pods is forbidden): grant verb `watch` on resource `pods` to the exporter's service account (the Helm chart does with kubernetes.rbac.create=true)"
        );
        assert_eq!(
            KubeError::from_status(call(), 401, String::new()).reason(),
            "unauthorized"
        );
        assert_eq!(
            KubeError::from_status(call(), 410, String::new()).reason(),
            "gone"
        );
        assert_eq!(
            KubeError::from_status(call(), 500, String::new()).reason(),
            "api_error"
        );
        for e in [
            KubeError::from_status(call(), 404, String::new()),
            KubeError::Timeout {
                call: call(),
                timeout: Duration::from_secs(1),
            },
        ] {
            assert!(KubeError::REASONS.contains(&e.reason()), "{e}");
        }
    }
}
