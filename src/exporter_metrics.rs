//! All of the exporter's own `gpu_exporter_*` families, in one registry. Each module defines
//! and updates its own families; they are registered here, once, in the order they appear in
//! the body, into the one registry the sampler encodes into each body. `main.rs` builds this
//! once and hands each module its part; the tests build the same, so what they read is what
//! the exporter serves, in the same order.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::accounting::AccountingMetrics;
use crate::hpc::HpcMetrics;
use crate::http::HttpMetrics;
use crate::kubeapi::metrics::KubeApiMetrics;
use crate::pods::cri_refresher::CriMetrics;
use crate::pods::refresher::PodResourcesMetrics;
use crate::pods::usage::ProcessMetrics;
use crate::reload::ReloadMetrics;
use crate::sampler::{AttributionMetrics, SampleMetrics, SamplerMetrics};
use crate::self_metrics::{self as sm, CounterOnceNonZero, Registry};
use crate::web::WebMetrics;

/// Every module's families, and the registry that holds them all.
#[derive(Debug, Clone)]
pub struct ExporterMetrics {
    /// The sampler's own: samples, their duration and errors, GPUs by state, series, fields.
    pub samples: Arc<SampleMetrics>,
    /// The first sample's wait for attribution, and bodies re-published when it changed.
    pub attribution: Arc<AttributionMetrics>,
    /// Per-process attribution.
    pub processes: Arc<ProcessMetrics>,
    /// The accounting ledger and its `gpu_exporter_container_*` families (off unless enabled;
    /// not in the registry: the sampler appends them to each body itself).
    pub accounting: Arc<AccountingMetrics>,
    /// Metrics CSV reloads.
    pub reload: Arc<ReloadMetrics>,
    /// The HTTP server's own.
    pub http: Arc<HttpMetrics>,
    /// The kubelet pod-resources client.
    pub pod_resources: Arc<PodResourcesMetrics>,
    /// The container runtime (CRI) client.
    pub cri: Arc<CriMetrics>,
    /// The Kubernetes API pod watch (pod labels/UID without a runtime socket).
    pub kube_api: Arc<KubeApiMetrics>,
    /// The HPC job mapping (`--hpc-job-mapping-dir`).
    pub hpc_jobs: Arc<HpcMetrics>,
    /// The web configuration's reloads and the serving certificate.
    pub web: Arc<WebMetrics>,
    /// Log lines lost to failed writes, counted by the log writer (`logsink`).
    pub log_write_errors: Arc<AtomicU64>,
    /// All of the above, in body order, and the GPU source's own families last.
    pub registry: Arc<Registry>,
}

impl ExporterMetrics {
    /// Every module's families, registered in body order, with `log_write_errors` (the log
    /// writer's count) and then whatever `last` registers (the GPU source's own families).
    pub fn new(log_write_errors: Arc<AtomicU64>, last: impl FnOnce(&mut Registry)) -> Self {
        let samples = Arc::new(SampleMetrics::default());
        let attribution = Arc::new(AttributionMetrics::default());
        let processes = Arc::new(ProcessMetrics::default());
        let accounting = Arc::new(AccountingMetrics::default());
        let reload = Arc::new(ReloadMetrics::default());
        let http = Arc::new(HttpMetrics::default());
        let pod_resources = Arc::new(PodResourcesMetrics::default());
        let cri = Arc::new(CriMetrics::default());
        let kube_api = Arc::new(KubeApiMetrics::default());
        let hpc_jobs = Arc::new(HpcMetrics::default());
        let web = Arc::new(WebMetrics::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Arc::clone(&samples)));
        registry.register_collector(Box::new(Arc::clone(&reload)));
        registry.register_collector(Box::new(Arc::clone(&http)));
        registry.register_collector(Box::new(CounterOnceNonZero::new(
            "gpu_exporter_log_write_errors",
            "Writes of log lines to stderr that failed (the lines are lost; absent until the first).",
            Arc::clone(&log_write_errors),
        )));
        registry.register_collector(Box::new(Arc::clone(&pod_resources)));
        registry.register_collector(Box::new(Arc::clone(&cri)));
        registry.register_collector(Box::new(Arc::clone(&kube_api)));
        registry.register_collector(Box::new(Arc::clone(&processes)));
        registry.register_collector(Box::new(Arc::clone(&hpc_jobs)));
        registry.register_collector(Box::new(Arc::clone(&attribution)));
        registry.register_collector(Box::new(Arc::clone(&web)));
        last(&mut registry);
        Self {
            samples,
            attribution,
            processes,
            accounting,
            reload,
            http,
            pod_resources,
            cri,
            kube_api,
            hpc_jobs,
            web,
            log_write_errors,
            registry: Arc::new(registry),
        }
    }

    /// What the sampler takes.
    pub fn sampler(&self) -> SamplerMetrics {
        SamplerMetrics {
            samples: Arc::clone(&self.samples),
            attribution: Arc::clone(&self.attribution),
            processes: Arc::clone(&self.processes),
            accounting: Arc::clone(&self.accounting),
            registry: Arc::clone(&self.registry),
        }
    }

    /// The families as the sampler would append them to a body now (accounting's totals as
    /// they are now, without the date a publication carries).
    pub fn text(&self) -> String {
        let mut out = String::new();
        sm::encode_into(&self.registry, &mut out);
        self.accounting.render_into(&mut out);
        out
    }
}

impl Default for ExporterMetrics {
    /// No GPU source's families, and a log writer that has lost nothing.
    fn default() -> Self {
        Self::new(Arc::default(), |_| {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn families_come_in_body_order_and_the_log_counter_shows_once_non_zero() {
        let m = ExporterMetrics::default();
        let names = |text: &str| -> Vec<String> {
            text.lines()
                .filter_map(|l| l.strip_prefix("# TYPE "))
                .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
                .collect()
        };
        let before = names(&m.text());
        assert!(!before
            .iter()
            .any(|n| n.starts_with("gpu_exporter_log_write")));
        m.log_write_errors.fetch_add(3, Ordering::Relaxed);
        let text = m.text();
        assert!(
            text.contains("gpu_exporter_log_write_errors_total 3\n"),
            "{text}"
        );
        // Right after the HTTP families, before the pod-resources client's.
        let after = names(&text);
        let at = after
            .iter()
            .position(|n| n.starts_with("gpu_exporter_log_write_errors"))
            .expect("registered");
        assert!(after[..at]
            .iter()
            .any(|n| n.starts_with("gpu_exporter_http_")));
        assert!(!after[at..]
            .iter()
            .any(|n| n.starts_with("gpu_exporter_http_")));
        assert_eq!(after.len(), before.len() + 1);
    }

    #[test]
    fn what_last_registers_comes_after_every_module() {
        let m = ExporterMetrics::new(Arc::default(), |r| {
            r.register_collector(Box::new(CounterOnceNonZero::new(
                "zz_source_own",
                "A GPU source's own family.",
                Arc::new(AtomicU64::new(1)),
            )))
        });
        // The last module's families (the web configuration's) show once one is loaded.
        m.web.enable(None);
        let text = m.text();
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        assert!(
            types.iter().any(|l| l.contains("gpu_exporter_web_")),
            "{text}"
        );
        assert!(
            types.last().is_some_and(|l| l.contains("zz_source_own")),
            "{text}"
        );
    }
}
