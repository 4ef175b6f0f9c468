//! The exporter's own families as `main.rs` registers them: one registry, every module's
//! collector in body order. Tests that need only one module's figures use that module's type.
#![allow(dead_code)]

use std::sync::Arc;

use gpu_exporter::hpc::HpcMetrics;
use gpu_exporter::http::HttpMetrics;
use gpu_exporter::pods::cri_refresher::CriMetrics;
use gpu_exporter::pods::refresher::PodResourcesMetrics;
use gpu_exporter::pods::usage::ProcessMetrics;
use gpu_exporter::reload::ReloadMetrics;
use gpu_exporter::sampler::{AttributionMetrics, SampleMetrics, SamplerMetrics};
use gpu_exporter::self_metrics::{self as sm, Registry};
use gpu_exporter::web::WebMetrics;

/// Every module's figures, and the registry (in `main.rs`'s order) the sampler encodes.
#[derive(Debug, Clone)]
pub struct SelfMetrics {
    pub samples: Arc<SampleMetrics>,
    pub attribution: Arc<AttributionMetrics>,
    pub processes: Arc<ProcessMetrics>,
    pub reload: Arc<ReloadMetrics>,
    pub http: Arc<HttpMetrics>,
    pub pod_resources: Arc<PodResourcesMetrics>,
    pub cri: Arc<CriMetrics>,
    pub hpc_jobs: Arc<HpcMetrics>,
    pub web: Arc<WebMetrics>,
    pub registry: Arc<Registry>,
}

impl Default for SelfMetrics {
    fn default() -> Self {
        let samples = Arc::new(SampleMetrics::default());
        let attribution = Arc::new(AttributionMetrics::default());
        let processes = Arc::new(ProcessMetrics::default());
        let reload = Arc::new(ReloadMetrics::default());
        let http = Arc::new(HttpMetrics::default());
        let pod_resources = Arc::new(PodResourcesMetrics::default());
        let cri = Arc::new(CriMetrics::default());
        let hpc_jobs = Arc::new(HpcMetrics::default());
        let web = Arc::new(WebMetrics::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Arc::clone(&samples)));
        registry.register_collector(Box::new(Arc::clone(&reload)));
        registry.register_collector(Box::new(Arc::clone(&http)));
        registry.register_collector(Box::new(Arc::clone(&pod_resources)));
        registry.register_collector(Box::new(Arc::clone(&cri)));
        registry.register_collector(Box::new(Arc::clone(&processes)));
        registry.register_collector(Box::new(Arc::clone(&hpc_jobs)));
        registry.register_collector(Box::new(Arc::clone(&attribution)));
        registry.register_collector(Box::new(Arc::clone(&web)));
        Self {
            samples,
            attribution,
            processes,
            reload,
            http,
            pod_resources,
            cri,
            hpc_jobs,
            web,
            registry: Arc::new(registry),
        }
    }
}

impl SelfMetrics {
    /// What the sampler takes.
    pub fn sampler(&self) -> SamplerMetrics {
        SamplerMetrics {
            samples: Arc::clone(&self.samples),
            attribution: Arc::clone(&self.attribution),
            processes: Arc::clone(&self.processes),
            registry: Arc::clone(&self.registry),
        }
    }

    /// The families as the sampler would append them to a body now.
    pub fn text(&self) -> String {
        let mut out = String::new();
        sm::encode_into(&self.registry, &mut out);
        out
    }
}
