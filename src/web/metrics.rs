//! The web configuration's own series, `gpu_exporter_web_*`: reloads of `--web-config-file`
//! and the serving certificate's expiry, updated by [`super::WebSecurity`] and rendered only
//! with a web configuration.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;

use crate::self_metrics::{self, Collector, DescriptorEncoder, Num};

/// The web configuration's reloads and the serving certificate.
#[derive(Debug, Default)]
pub struct WebMetrics {
    inner: Mutex<WebConfigState>,
}

/// A copy of [`WebMetrics`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebConfigState {
    /// Whether `--web-config-file` is set (the families are rendered only then).
    pub enabled: bool,
    /// Changes of the file (or of a certificate, key or CA it names) taken into use.
    pub reloads_ok: u64,
    /// Changes rejected (the previous configuration keeps serving).
    pub reloads_failed: u64,
    /// Whether the last change was rejected.
    pub last_reload_failed: bool,
    /// `notAfter` of the certificate being served, Unix seconds (`None`: no TLS).
    pub certificate_expiry_seconds: Option<f64>,
}

/// A label set of one label, `result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Outcome {
    result: &'static str,
}

impl WebMetrics {
    fn lock(&self) -> MutexGuard<'_, WebConfigState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns the families on, with the expiry of the certificate served at startup.
    pub fn enable(&self, certificate_expiry_seconds: Option<f64>) {
        let mut s = self.lock();
        s.enabled = true;
        s.certificate_expiry_seconds = certificate_expiry_seconds;
    }

    /// Records a change taken into use, with the expiry of the certificate served from now on.
    pub fn record_success(&self, certificate_expiry_seconds: Option<f64>) {
        let mut s = self.lock();
        s.reloads_ok += 1;
        s.last_reload_failed = false;
        s.certificate_expiry_seconds = certificate_expiry_seconds;
    }

    /// Records a rejected change (the certificate served does not change).
    pub fn record_failure(&self) {
        let mut s = self.lock();
        s.reloads_failed += 1;
        s.last_reload_failed = true;
    }

    /// A copy of the current state.
    pub fn state(&self) -> WebConfigState {
        self.lock().clone()
    }
}

impl Collector for WebMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = self.state();
        if !s.enabled {
            return Ok(());
        }
        self_metrics::counter(
            &mut e,
            "gpu_exporter_web_config_reloads",
            "Changes of --web-config-file or of a certificate, key or CA it names, by result: success (in use), failure (rejected; the previous configuration keeps serving).",
            [
                (Outcome { result: "failure" }, s.reloads_failed),
                (Outcome { result: "success" }, s.reloads_ok),
            ],
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_web_config_last_reload_success",
            "1 if the last change of --web-config-file or its certificates was taken into use (or none was seen), 0 if it was rejected and the previous configuration is serving.",
            Num::Int(i64::from(!s.last_reload_failed)),
        )?;
        if let Some(t) = s.certificate_expiry_seconds {
            self_metrics::gauge1(
                &mut e,
                "gpu_exporter_web_tls_certificate_expiry_timestamp_seconds",
                "notAfter of the TLS certificate being served, as Unix time: after it, verifying scrapers fail.",
                Num::Float(t),
            )?;
        }
        Ok(())
    }
}
