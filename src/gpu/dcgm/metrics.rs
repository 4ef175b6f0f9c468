//! The DCGM source's `gpu_exporter_dcgm_*` self-metrics, as `prometheus-client` families.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::{Mutex, PoisonError};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as PromFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::plan::Refusal;
use crate::catalog::Field;

/// The `reason` label values of `gpu_exporter_dcgm_errors_total`.
const ERROR_REASONS: [&str; 5] = ["connect", "connection_lost", "entities", "watch", "read"];

/// The `gpu_exporter_dcgm_*` self-metrics, as `prometheus-client` families.
#[derive(Debug, Default)]
pub struct DcgmMetrics {
    /// 1 while connected to the hostengine.
    pub connected: Gauge<i64, AtomicI64>,
    /// Successful latest-value reads.
    pub reads: Counter<u64, AtomicU64>,
    /// Reconnections after a lost or failed connection.
    pub reconnects: Counter<u64, AtomicU64>,
    /// Failures by reason: `connect`, `connection_lost`, `entities`, `watch`, `read`.
    pub errors: PromFamily<Vec<(String, String)>, Counter<u64, AtomicU64>>,
    /// 1 for each field DCGM does not serve now, by field and reason.
    pub fields_refused: PromFamily<Vec<(String, String)>, Gauge<i64, AtomicI64>>,
    /// The fields refused now (the gauge family cannot be listed).
    refused_now: Mutex<BTreeMap<Field, Refusal>>,
}

impl DcgmMetrics {
    /// Registers the families (names without `_total`: `prometheus-client` adds it to counters).
    pub fn register(&self, registry: &mut Registry) {
        for r in ERROR_REASONS {
            self.errors
                .get_or_create(&vec![("reason".to_owned(), r.to_owned())])
                .inc_by(0);
        }
        registry.register(
            "gpu_exporter_dcgm_connected",
            "1 while the DCGM hostengine (-r) is connected",
            self.connected.clone(),
        );
        registry.register(
            "gpu_exporter_dcgm_reads",
            "Latest-value reads from the DCGM hostengine",
            self.reads.clone(),
        );
        registry.register(
            "gpu_exporter_dcgm_reconnects",
            "Reconnections to the DCGM hostengine after it was lost or unreachable",
            self.reconnects.clone(),
        );
        registry.register(
            "gpu_exporter_dcgm_errors",
            "DCGM failures by reason (connect, connection_lost, entities, watch, read)",
            self.errors.clone(),
        );
        registry.register(
            "gpu_exporter_dcgm_fields_refused",
            "Fields the DCGM hostengine does not serve now, by reason (their series are absent)",
            self.fields_refused.clone(),
        );
    }

    pub(super) fn count_error(&self, reason: &'static str) {
        self.errors
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
    }

    pub(super) fn set_refused(&self, now: BTreeMap<Field, Refusal>) {
        let mut cur = self
            .refused_now
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let labels = |f: &Field, r: &Refusal| {
            vec![
                ("field".to_owned(), f.dcgm_name().to_owned()),
                ("reason".to_owned(), r.as_str().to_owned()),
            ]
        };
        for (f, r) in cur.iter() {
            if now.get(f) != Some(r) {
                self.fields_refused.remove(&labels(f, r));
            }
        }
        for (f, r) in &now {
            self.fields_refused.get_or_create(&labels(f, r)).set(1);
        }
        *cur = now;
    }
}
