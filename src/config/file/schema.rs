//! dcgm-exporter's configuration file as serde reads it: both schema versions, every key known
//! (`deny_unknown_fields`), before any value is checked.

use serde::Deserialize;

#[derive(Deserialize)]
pub(super) struct Header {
    pub(super) version: Option<serde_yaml::Value>,
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
    pub(super) max_concurrent_scrapes: Option<i64>,
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
    #[allow(dead_code)]
    pub(super) max_samples: Option<i64>,
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
    #[allow(dead_code)]
    pub(super) max_keep_samples: Option<i64>,
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
