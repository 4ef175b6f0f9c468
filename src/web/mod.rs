//! `--web-config-file`: TLS, client certificates, basic auth, response headers and a rate
//! limit, in Prometheus exporter-toolkit's format, with certificate rotation without restart.
//!
//! [`config`] parses the file (pure); [`tls`] builds the rustls configuration; [`auth`] checks
//! basic-auth credentials; [`x509`] reads a certificate's expiry and a key's type. [`WebSecurity`]
//! holds the [`Active`] settings: the HTTP server takes the TLS configuration for each new
//! connection and the credentials, rate limit and headers for each request, so a revoked
//! password stops working on connections already open. A watcher thread
//! ([`WebSecurity::spawn_watcher`]) re-reads the file and every certificate it names every
//! `recheck` interval, off the accept loop and the request path, so a file that blocks a
//! reader stalls only the reloads. A version that fails to load is logged, counted in
//! `gpu_exporter_web_config_reloads_total{result="failure"}`, and the old one keeps serving.

pub mod auth;
pub mod config;
pub mod metrics;
pub mod ratelimit;
pub mod tls;
pub mod x509;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

pub use config::{WebConfig, WebConfigError};
pub use metrics::{WebConfigState, WebMetrics};
pub use ratelimit::{RateLimiter, MAX_TRACKED_CLIENTS};

/// How often the files are checked for changes.
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(1);

/// The watcher's shortest pause between checks (a `recheck` of zero means this).
pub const MIN_RECHECK: Duration = Duration::from_millis(10);

/// The settings in force: TLS for each new connection, the rest for each request.
#[derive(Debug)]
pub struct Active {
    /// TLS server configuration, when `tls_server_config` names a certificate.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// `notAfter` of the served certificate, Unix seconds.
    pub tls_not_after: Option<i64>,
    /// Basic auth, when users are configured.
    pub auth: Option<auth::BasicAuth>,
    /// Extra response headers.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The request rate limit, per client address.
    pub rate_limit: Option<RateLimiter>,
    /// `client_auth_type` requires a client certificate. The handshake accepts a client
    /// without one (so the kubelet's probes reach `/health` and `/ready`), and every other
    /// path answers 403 to it: the requirement is enforced per request.
    pub client_cert_required: bool,
}

impl Active {
    /// Builds the settings for `config`, reading the certificate files it names. The bcrypt
    /// budgets (the bound on parallel checks, each client's failed logins) carry over from
    /// `previous`, so a reload neither lifts them nor forgives a guessing client.
    ///
    /// # Errors
    /// [`WebConfigError`] naming the key whose material is unusable.
    pub fn build(
        config: &WebConfig,
        origin: &str,
        previous: Option<&Active>,
    ) -> Result<Active, WebConfigError> {
        let (tls, tls_not_after) = match &config.tls {
            Some(t) => {
                let s = tls::server_config(t, origin)?;
                (Some(s.config), s.not_after)
            }
            None => (None, None),
        };
        let budgets = previous
            .and_then(|p| p.auth.as_ref())
            .map(auth::BasicAuth::budgets);
        let auth = (!config.basic_auth_users.is_empty())
            .then(|| auth::BasicAuth::with_budgets(config.basic_auth_users.clone(), budgets));
        if let Some(costs) = auth.as_ref().map(auth::BasicAuth::costs) {
            if costs.len() > 1 {
                tracing::warn!(
                    "{origin}: basic_auth_users: the bcrypt hashes have different costs ({costs:?}); the time a login takes can tell the users apart; hash every password with the same cost"
                );
            }
        }
        let mut headers = Vec::new();
        for (k, v) in &config.headers {
            let bad = |reason: &str| WebConfigError::Invalid {
                origin: origin.to_owned(),
                key: format!("http_server_config.headers.{k}"),
                reason: reason.to_owned(),
            };
            let name = HeaderName::try_from(k.as_str()).map_err(|_| bad("not a header name"))?;
            let value = HeaderValue::try_from(v.as_str()).map_err(|_| bad("not a header value"))?;
            headers.push((name, value));
        }
        let rate_limit = config
            .rate_limit
            .map(|r| RateLimiter::new(r.interval, r.burst));
        let client_cert_required = config.tls.as_ref().is_some_and(|t| {
            matches!(
                t.client_auth,
                config::ClientAuth::RequireAnyClientCert
                    | config::ClientAuth::RequireAndVerifyClientCert
            )
        });
        Ok(Active {
            tls,
            tls_not_after,
            auth,
            headers,
            rate_limit,
            client_cert_required,
        })
    }
}

/// The web configuration in force, re-read when its files change.
#[derive(Debug)]
pub struct WebSecurity {
    path: PathBuf,
    recheck: Duration,
    active: RwLock<Arc<Active>>,
    watch: Mutex<Watch>,
    metrics: Arc<WebMetrics>,
    /// Changes seen so far (taken into use or rejected), for waiting on a reload.
    changes: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug)]
struct Watch {
    fingerprint: [u8; 32],
    /// SHA-256 of the file's text last parsed, and what parsing it gave (`None`: an error): an
    /// unchanged file is not parsed again, however long a broken one stays.
    text: [u8; 32],
    parsed: Option<WebConfig>,
    /// Times the watcher parsed the file (for the tests).
    parses: u64,
}

fn unix_seconds(t: Option<i64>) -> Option<f64> {
    #[allow(clippy::cast_precision_loss)]
    t.map(|s| s as f64)
}

impl WebSecurity {
    /// Loads `path` at startup; every error is fatal here. Reloads are counted into
    /// `metrics.web`.
    ///
    /// # Errors
    /// [`WebConfigError`] naming the file and key.
    pub fn load(
        path: &Path,
        recheck: Duration,
        metrics: Arc<WebMetrics>,
    ) -> Result<Self, WebConfigError> {
        let origin = path.display().to_string();
        let text = config::read_file(path)?;
        let config = config::parse(&text, &origin)?;
        let active = Active::build(&config, &origin, None)?;
        metrics.enable(unix_seconds(active.tls_not_after));
        Ok(Self {
            path: path.to_owned(),
            recheck,
            active: RwLock::new(Arc::new(active)),
            watch: Mutex::new(Watch {
                fingerprint: fingerprint(&text, Some(&config)),
                text: Sha256::digest(text.as_bytes()).into(),
                parsed: Some(config),
                parses: 0,
            }),
            metrics,
            changes: tokio::sync::watch::Sender::new(0),
        })
    }

    /// Whether TLS is on (it cannot be switched on or off without a restart).
    pub fn tls_enabled(&self) -> bool {
        self.current().tls.is_some()
    }

    /// The settings in force. Never touches the file system.
    pub fn current(&self) -> Arc<Active> {
        Arc::clone(
            &self
                .active
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Follows the number of changes seen (taken into use or rejected), to wait for a reload.
    pub fn changes_seen(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Starts the thread that calls [`Self::check_for_changes`] every `recheck` (at least
    /// [`MIN_RECHECK`]) until `stop` is cancelled. A plain thread, not a runtime task: a read
    /// that blocks holds up only the reloads, never the server or its shutdown.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn spawn_watcher(self: &Arc<Self>, stop: CancellationToken) -> std::io::Result<()> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("web-config".to_owned())
            .spawn(move || {
                let every = me.recheck.max(MIN_RECHECK);
                while !stop.is_cancelled() {
                    std::thread::sleep(every);
                    if !stop.is_cancelled() {
                        me.check_for_changes();
                    }
                }
            })
            .map(drop)
    }

    /// Re-reads the files and takes a changed version into use. A version that fails to load
    /// is logged and counted once and ignored; the old settings stay. The file is parsed again
    /// only when its bytes change. Blocking: file I/O.
    pub fn check_for_changes(&self) {
        let mut watch = self
            .watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let origin = self.path.display().to_string();
        let text = match config::read_file(&self.path) {
            Ok(t) => t,
            Err(e) => {
                let e = crate::error_chain(&e);
                let fp = fingerprint(&format!("unreadable: {e}"), None);
                if fp != watch.fingerprint {
                    watch.fingerprint = fp;
                    self.metrics.record_failure();
                    self.changes.send_modify(|n| *n += 1);
                    tracing::warn!("{origin}: cannot re-read the web configuration ({e}); keeping the current one");
                }
                return;
            }
        };
        // Parsed only when the text changed; the certificate files it names are read each time.
        let text_hash: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        let parsed = if text_hash == watch.text {
            Ok(watch.parsed.clone())
        } else {
            watch.parses += 1;
            let parsed = config::parse(&text, &origin);
            watch.text = text_hash;
            watch.parsed = parsed.as_ref().ok().cloned();
            parsed.map(Some)
        };
        let fp = match &parsed {
            Ok(c) => fingerprint(&text, c.as_ref()),
            Err(_) => fingerprint(&text, None),
        };
        if fp == watch.fingerprint {
            return;
        }
        watch.fingerprint = fp;
        let current = self.current();
        let built = parsed
            .and_then(|c| match c {
                Some(c) => Ok(c),
                // The text of a version already rejected, readable again after an error: parsed
                // again for its reason, to log it.
                None => {
                    watch.parses += 1;
                    config::parse(&text, &origin)
                }
            })
            .and_then(|c| Active::build(&c, &origin, Some(&current)));
        match built {
            Ok(new) if new.tls.is_some() != current.tls.is_some() => {
                self.metrics.record_failure();
                tracing::warn!(
                    "{origin}: the new web configuration switches TLS {}; that needs a restart, keeping the current configuration",
                    if new.tls.is_some() { "on" } else { "off" }
                );
            }
            Ok(new) => {
                self.metrics.record_success(unix_seconds(new.tls_not_after));
                *self
                    .active
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(new);
                tracing::info!(
                    "{origin}: web configuration reloaded (certificates, users, headers)"
                );
            }
            Err(e) => {
                self.metrics.record_failure();
                tracing::warn!(
                    "rejected the changed web configuration, keeping the current one: {}",
                    crate::error_chain(&e)
                );
            }
        }
        self.changes.send_modify(|n| *n += 1);
    }
}

/// SHA-256 over the file and every PEM file it names, so rotation of any of them is noticed.
fn fingerprint(text: &str, config: Option<&WebConfig>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(text.as_bytes());
    if let Some(t) = config.and_then(|c| c.tls.as_ref()) {
        for pem in [Some(&t.cert), Some(&t.key), t.client_ca.as_ref()]
            .into_iter()
            .flatten()
        {
            if let config::Pem::File(p) = pem {
                h.update(p.as_os_str().as_encoded_bytes());
                match tls::read_pem_file(p) {
                    Ok(b) => h.update(&b),
                    Err(e) => h.update(e.to_string().as_bytes()),
                }
            }
        }
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_change_keeps_the_old_settings_and_a_good_one_replaces_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("web.yml");
        std::fs::write(
            &p,
            "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
        )
        .unwrap();
        let metrics = Arc::new(WebMetrics::default());
        let w = WebSecurity::load(&p, Duration::ZERO, Arc::clone(&metrics)).unwrap();
        assert_eq!(w.current().headers[0].1, "deny");
        assert!(metrics.state().enabled);
        std::fs::write(&p, "http_server_config:\n  headerz: {}\n").unwrap();
        w.check_for_changes();
        assert_eq!(w.current().headers[0].1, "deny");
        let s = metrics.state();
        assert_eq!(
            (s.reloads_ok, s.reloads_failed, s.last_reload_failed),
            (0, 1, true)
        );
        // Unchanged: not counted again.
        w.check_for_changes();
        assert_eq!(metrics.state().reloads_failed, 1);
        assert_eq!(w.watch.lock().unwrap().parses, 1);
        std::fs::write(
            &p,
            "http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n",
        )
        .unwrap();
        w.check_for_changes();
        assert_eq!(w.current().headers[0].1, "sameorigin");
        let s = metrics.state();
        assert_eq!(
            (s.reloads_ok, s.reloads_failed, s.last_reload_failed),
            (1, 1, false)
        );
        assert_eq!(*w.changes_seen().borrow(), 2);
    }

    #[test]
    fn an_unchanged_file_is_not_parsed_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("web.yml");
        std::fs::write(&p, "http_server_config:\n  http2: true\n").unwrap();
        let metrics = Arc::new(WebMetrics::default());
        let w = WebSecurity::load(&p, Duration::ZERO, Arc::clone(&metrics)).unwrap();
        let parses = || w.watch.lock().unwrap().parses;
        for _ in 0..3 {
            w.check_for_changes();
        }
        assert_eq!(parses(), 0);
        // A broken version (nested as deep as the cap allows) is parsed once, however long it
        // stays; the watcher checks every second.
        std::fs::write(&p, format!("rate_limit: {}", "[".repeat(1 << 19))).unwrap();
        for _ in 0..5 {
            w.check_for_changes();
        }
        assert_eq!(parses(), 1);
        assert_eq!(metrics.state().reloads_failed, 1);
        // Unreadable, then the same broken text again: parsed again to log its reason, once.
        std::fs::remove_file(&p).unwrap();
        w.check_for_changes();
        std::fs::write(&p, format!("rate_limit: {}", "[".repeat(1 << 19))).unwrap();
        w.check_for_changes();
        w.check_for_changes();
        assert_eq!((parses(), metrics.state().reloads_failed), (2, 3));
        // A good version is parsed and taken into use.
        std::fs::write(&p, "http_server_config:\n  http2: false\n").unwrap();
        w.check_for_changes();
        w.check_for_changes();
        assert_eq!(parses(), 3);
        assert_eq!(metrics.state().reloads_ok, 1);
    }
}
