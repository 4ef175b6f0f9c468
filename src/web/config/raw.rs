//! The web configuration file as written: serde's view of exporter-toolkit's YAML, every key
//! known (`deny_unknown_fields`), before any value is checked.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Marks [`unique_keys`]'s error, followed by the key.
pub(super) const DUPLICATE: &str = "duplicate key: ";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    #[serde(default)]
    pub(super) tls_server_config: Option<RawTls>,
    #[serde(default)]
    pub(super) http_server_config: Option<RawHttp>,
    #[serde(default, deserialize_with = "unique_keys")]
    pub(super) basic_auth_users: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub(super) rate_limit: Option<RawRateLimit>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert: Option<String>,
    pub(super) key: Option<String>,
    pub(super) client_ca: Option<String>,
    pub(super) cert_file: Option<String>,
    pub(super) key_file: Option<String>,
    pub(super) client_auth_type: Option<String>,
    pub(super) client_ca_file: Option<String>,
    pub(super) client_allowed_sans: Option<Vec<String>>,
    pub(super) min_version: Option<String>,
    pub(super) max_version: Option<String>,
    pub(super) cipher_suites: Option<Vec<String>>,
    pub(super) prefer_server_cipher_suites: Option<bool>,
    pub(super) curve_preferences: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    pub(super) http2: Option<bool>,
    #[serde(default, deserialize_with = "unique_keys")]
    pub(super) headers: Option<BTreeMap<String, String>>,
}

/// A mapping whose keys must be distinct: YAML parsers differ on a repeated key (most keep the
/// last), so a user or header given twice is an error naming the key and where it is, never a
/// silent pick.
pub(super) fn unique_keys<'de, D>(d: D) -> Result<Option<BTreeMap<String, String>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = Option<BTreeMap<String, String>>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a mapping of names to strings")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_map(Unique)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(k) = map.next_key::<String>()? {
                let v: String = map.next_value()?;
                if out.contains_key(&k) {
                    return Err(serde::de::Error::custom(format!("{DUPLICATE}{k}")));
                }
                out.insert(k, v);
            }
            Ok(Some(out))
        }
    }
    d.deserialize_option(Unique)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRateLimit {
    pub(super) interval: Option<RawDuration>,
    pub(super) burst: Option<u32>,
}

/// A duration as YAML gives it: `100ms` is a string, a bare `0` an integer.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawDuration {
    Number(u64),
    Text(String),
}
