//! The `--web-config-file` format (Prometheus exporter-toolkit's `web-config.yml`), parsed and
//! validated without touching the file system.
//!
//! [`parse`] turns YAML text into a [`WebConfig`] whose every value has been checked: TLS
//! versions, client-auth policy, cipher suites and curves are mapped to what rustls can do, and
//! anything it cannot (TLS 1.0/1.1, CBC suites, P-521) is an error naming the key, never a silent
//! downgrade. Unknown keys are errors too (`deny_unknown_fields`). Reading certificate files is
//! [`super::tls`]'s business; this module only records their paths.
//!
//! Layout: `types` holds what a parsed file is ([`WebConfig`] and its parts) and
//! [`WebConfigError`]; `raw` the file as written (serde's view); `parse` reading and checking
//! it; `validate` the `tls_server_config` checks.

mod parse;
mod raw;
#[cfg(test)]
mod tests;
mod types;
mod validate;

pub use parse::{load, parse, read_file};
pub use types::{
    CipherSuite, ClientAuth, Curve, Pem, RateLimit, TlsSettings, TlsVersion, WebConfig,
    WebConfigError,
};
