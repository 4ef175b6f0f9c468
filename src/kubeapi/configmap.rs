//! `-m` / `--configmap-data` / `DCGM_EXPORTER_CONFIGMAP_DATA` `NAMESPACE:NAME`: the metrics CSV
//! is the ConfigMap's `metrics` key, read once at startup (as dcgm-exporter does; it then wins
//! over `-f`).

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use super::client::{bounded, KubeClient};
use super::error::{Call, KubeError};

/// The ConfigMap key holding the CSV (dcgm-exporter's).
pub const KEY: &str = "metrics";

/// The largest CSV taken (the same limit as a metrics CSV file).
pub const MAX_CSV: usize = 1 << 20;

/// `NAMESPACE:NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapRef {
    /// The namespace.
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
}

impl ConfigMapRef {
    /// Parses `NAMESPACE:NAME` (exactly one colon, both parts non-empty, as dcgm-exporter splits
    /// it; whitespace around either is an error, not trimmed).
    ///
    /// # Errors
    /// Why it is not one, in words.
    pub fn parse(value: &str) -> Result<Self, &'static str> {
        let mut parts = value.split(':');
        let (Some(namespace), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err("expected NAMESPACE:NAME (one colon)");
        };
        if namespace.is_empty() || name.is_empty() {
            return Err("expected NAMESPACE:NAME (neither empty)");
        }
        let dns = |s: &str| {
            s.len() <= 253
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        if !dns(namespace) || !dns(name) {
            return Err("expected NAMESPACE:NAME, each lowercase letters, digits, '-' and '.'");
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl fmt::Display for ConfigMapRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Reads the ConfigMap's `metrics` key.
///
/// # Errors
/// The call's ([`KubeError`], naming `get configmaps NS/NAME`), [`KubeError::NoKey`],
/// [`KubeError::TooLarge`].
pub async fn read_csv(
    client: &KubeClient,
    cm: &ConfigMapRef,
    timeout: Duration,
) -> Result<String, KubeError> {
    let api: Api<ConfigMap> = Api::namespaced(client.client.clone(), &cm.namespace);
    let call = Call {
        verb: "get",
        resource: "configmaps",
        target: cm.to_string(),
    };
    let got = bounded(call, timeout, api.get(&cm.name)).await?;
    let mut data = got.data.unwrap_or_default();
    let Some(csv) = data.remove(KEY) else {
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        return Err(KubeError::NoKey {
            configmap: cm.to_string(),
            key: KEY,
            keys: if keys.is_empty() {
                "no data keys".to_owned()
            } else {
                keys.join(", ")
            },
        });
    };
    if csv.len() > MAX_CSV {
        return Err(KubeError::TooLarge {
            configmap: cm.to_string(),
            key: KEY,
            len: csv.len(),
            cap: MAX_CSV,
        });
    }
    Ok(csv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_value_is_namespace_colon_name() {
        let r = ConfigMapRef::parse("gpu-operator:metrics-config").unwrap();
        assert_eq!(r.namespace, "gpu-operator");
        assert_eq!(r.name, "metrics-config");
        assert_eq!(r.to_string(), "gpu-operator/metrics-config");
        for bad in ["", "metrics", "a:b:c", ":b", "a:", "a/b", "A:b", "a: b"] {
            assert!(ConfigMapRef::parse(bad).is_err(), "{bad:?}");
        }
    }
}
