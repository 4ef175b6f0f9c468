//! dcgm-exporter's configuration file as serde reads it: both schema versions, every key known
//! (`deny_unknown_fields`), before any value is checked.

use serde::Deserialize;

#[derive(Deserialize)]
pub(super) struct Header {
    pub(super) version: Option<yaml_serde::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Metrics {
    pub(super) file: Option<String>,
    pub(super) fields: Option<Vec<InlineField>>,
    pub(super) enable_exporter_metrics: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct InlineField {
    pub(super) name: String,
    pub(super) prometheus_type: String,
    pub(super) help: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Server {
    pub(super) max_concurrent_scrapes: Option<Number>,
}

/// A YAML number as written, of any size (yaml_serde reads integers past 64 bits as 128-bit
/// ones), so that one too large for its key is named as such rather than as a wrong type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Number {
    /// An integer (saturated at the bounds of `i128`).
    Int(i128),
    /// A number with a fraction or an exponent.
    Float(f64),
}

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Number::Int(i) => write!(f, "{i}"),
            Number::Float(x) => write!(f, "{x}"),
        }
    }
}

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Number;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Number, E> {
                Ok(Number::Int(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Number, E> {
                Ok(Number::Int(v.into()))
            }
            fn visit_i128<E>(self, v: i128) -> Result<Number, E> {
                Ok(Number::Int(v))
            }
            fn visit_u128<E>(self, v: u128) -> Result<Number, E> {
                Ok(Number::Int(i128::try_from(v).unwrap_or(i128::MAX)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Number, E> {
                Ok(Number::Float(v))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct DetectBindUnbind {
    pub(super) enabled: Option<bool>,
    pub(super) poll_interval: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct V1 {
    #[allow(dead_code)]
    pub(super) version: i64,
    pub(super) metrics: Option<Metrics>,
    pub(super) collection: Option<V1Collection>,
    pub(super) sources: Option<V1Sources>,
    pub(super) server: Option<Server>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct V1Collection {
    pub(super) interval: Option<String>,
    pub(super) retention: Option<V1Retention>,
    pub(super) watch_groups: Option<Vec<V1WatchGroup>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct V1Retention {
    pub(super) max_age: Option<String>,
    pub(super) max_samples: Option<Number>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct V1WatchGroup {
    pub(super) name: String,
    pub(super) interval: String,
    pub(super) fields: Vec<String>,
    pub(super) retention: Option<V1Retention>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct V1Sources {
    pub(super) dcgm: Option<V1Dcgm>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct V1Dcgm {
    pub(super) detect_bind_unbind: Option<DetectBindUnbind>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct V2 {
    #[allow(dead_code)]
    pub(super) version: i64,
    pub(super) metrics: Option<Metrics>,
    pub(super) collections: Option<Vec<Collection>>,
    pub(super) sources: Option<V2Sources>,
    pub(super) server: Option<Server>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Collection {
    pub(super) name: String,
    pub(super) every: String,
    pub(super) metrics: CollectionMetrics,
    pub(super) sources: Option<CollectionSources>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CollectionMetrics {
    pub(super) include: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CollectionSources {
    pub(super) dcgm: Option<CollectionDcgm>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CollectionDcgm {
    pub(super) watch: Option<Watch>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Watch {
    pub(super) max_keep_age: Option<String>,
    pub(super) max_keep_samples: Option<Number>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct V2Sources {
    pub(super) dcgm: Option<V2Dcgm>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct V2Dcgm {
    pub(super) watch: Option<Watch>,
    pub(super) detect_bind_unbind: Option<DetectBindUnbind>,
}
