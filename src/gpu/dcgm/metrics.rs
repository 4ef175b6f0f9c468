//! The DCGM source's `gpu_exporter_dcgm_*` self-metrics: a [`Collector`] over the reader's
//! latest state, written in a fixed order (families as listed, series sorted), help texts
//! verbatim, as the other modules' families.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::plan::Refusal;
use crate::catalog::Field;
use crate::self_metrics::{self, Collector, DescriptorEncoder, Num, Reason, Registry};

/// The `reason` label values of `gpu_exporter_dcgm_errors_total`.
pub const ERROR_REASONS: [&str; 7] = [
    "connect",
    "connection_lost",
    "entities",
    "init",
    "read",
    "start_embedded",
    "watch",
];

/// What the families say.
#[derive(Debug, Default)]
struct State {
    /// `embedded` or `remote` (empty until the source sets it).
    mode: &'static str,
    connected: bool,
    reads: u64,
    reconnects: u64,
    watched: usize,
    errors: BTreeMap<&'static str, u64>,
    refused: BTreeMap<Field, Refusal>,
}

/// The `gpu_exporter_dcgm_*` self-metrics, updated by the DCGM source's reader thread.
#[derive(Debug, Default)]
pub struct DcgmMetrics {
    state: Mutex<State>,
}

/// The label set of `gpu_exporter_dcgm_fields_refused`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
struct Refused {
    field: &'static str,
    reason: &'static str,
}

impl DcgmMetrics {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers the families.
    pub fn register(self: &std::sync::Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(Shared(std::sync::Arc::clone(self))));
    }

    /// Whether the hostengine is connected now.
    pub fn connected(&self) -> bool {
        self.lock().connected
    }

    /// Successful latest-value reads so far.
    pub fn reads(&self) -> u64 {
        self.lock().reads
    }

    /// The failures counted for `reason`.
    pub fn errors(&self, reason: &str) -> u64 {
        self.lock().errors.get(reason).copied().unwrap_or(0)
    }

    pub(super) fn set_mode(&self, mode: &'static str) {
        self.lock().mode = mode;
    }

    pub(super) fn set_connected(&self, up: bool) {
        self.lock().connected = up;
    }

    pub(super) fn count_read(&self) {
        self.lock().reads += 1;
    }

    pub(super) fn count_reconnect(&self) {
        self.lock().reconnects += 1;
    }

    pub(super) fn set_watched(&self, fields: usize) {
        self.lock().watched = fields;
    }

    pub(super) fn count_error(&self, reason: &'static str) {
        debug_assert!(ERROR_REASONS.contains(&reason), "{reason}");
        *self.lock().errors.entry(reason).or_default() += 1;
    }

    pub(super) fn set_refused(&self, now: BTreeMap<Field, Refusal>) {
        self.lock().refused = now;
    }
}

/// The label set of `gpu_exporter_dcgm_mode`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
struct Mode {
    mode: &'static str,
}

/// The registered collector: the metrics are shared with the reader thread.
#[derive(Debug)]
struct Shared(std::sync::Arc<DcgmMetrics>);

impl Collector for Shared {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let s = self.0.lock();
        self_metrics::gauge(
            &mut e,
            "gpu_exporter_dcgm_mode",
            "Where the DCGM hostengine runs: embedded (started in the exporter, no -r) or remote (-r); always 1.",
            (!s.mode.is_empty())
                .then_some((Mode { mode: s.mode }, Num::Int(1))),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_dcgm_connected",
            "1 while the DCGM hostengine (embedded, or -r) is connected.",
            Num::Int(i64::from(s.connected)),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_dcgm_fields_watched",
            "Profiling fields the DCGM hostengine watches for the exporter now (0 while it is connected means no DCGM_FI_PROF_* series: see gpu_exporter_dcgm_errors_total).",
            Num::count(s.watched as u64),
        )?;
        self_metrics::counter1(
            &mut e,
            "gpu_exporter_dcgm_reads",
            "Latest-value reads from the DCGM hostengine.",
            s.reads,
        )?;
        self_metrics::counter1(
            &mut e,
            "gpu_exporter_dcgm_reconnects",
            "Reconnections to the DCGM hostengine after it was lost or unreachable.",
            s.reconnects,
        )?;
        self_metrics::counter(
            &mut e,
            "gpu_exporter_dcgm_errors",
            "DCGM failures by reason (connect, connection_lost, entities, init, read, start_embedded, watch).",
            ERROR_REASONS.iter().map(|&reason| {
                (
                    Reason { reason },
                    s.errors.get(reason).copied().unwrap_or(0),
                )
            }),
        )?;
        self_metrics::gauge(
            &mut e,
            "gpu_exporter_dcgm_fields_refused",
            "Fields the DCGM hostengine does not serve now, by reason (their series are absent).",
            s.refused.iter().map(|(f, r)| {
                (
                    Refused {
                        field: f.dcgm_name(),
                        reason: r.as_str(),
                    },
                    Num::Int(1),
                )
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn body(m: &Arc<DcgmMetrics>) -> String {
        let mut r = Registry::default();
        m.register(&mut r);
        let mut out = String::new();
        self_metrics::encode_into(&r, &mut out);
        out
    }

    #[test]
    fn the_families_come_out_in_one_order_with_help_verbatim_whatever_the_updates() {
        let m = Arc::new(DcgmMetrics::default());
        assert!(
            !body(&m).contains("gpu_exporter_dcgm_mode{"),
            "no mode before it is set"
        );
        m.set_mode("embedded");
        m.set_connected(true);
        m.set_watched(3);
        m.count_read();
        m.count_error("watch");
        m.count_error("connect");
        m.count_error("watch");
        let dram = Field::from_id(1005).expect("DRAM_ACTIVE");
        let tensor = Field::from_id(1004).expect("PIPE_TENSOR_ACTIVE");
        m.set_refused(BTreeMap::from([
            (dram, Refusal::NotSupported),
            (tensor, Refusal::MultiPass),
        ]));
        let text = body(&m);
        // The same state encodes to the same bytes (no hash order).
        assert_eq!(text, body(&m));
        let lines: Vec<&str> = text.lines().collect();
        let at = |needle: &str| {
            lines
                .iter()
                .position(|l| l.starts_with(needle))
                .unwrap_or_else(|| panic!("no {needle} in\n{text}"))
        };
        assert!(
            at("gpu_exporter_dcgm_mode{mode=\"embedded\"} 1") < at("gpu_exporter_dcgm_connected 1")
        );
        assert!(at("gpu_exporter_dcgm_connected 1") < at("gpu_exporter_dcgm_fields_watched 3"));
        assert!(at("gpu_exporter_dcgm_fields_watched") < at("gpu_exporter_dcgm_reads_total 1"));
        assert!(
            at("gpu_exporter_dcgm_errors_total{reason=\"connect\"} 1")
                < at("gpu_exporter_dcgm_errors_total{reason=\"init\"} 0")
        );
        assert!(
            at("gpu_exporter_dcgm_errors_total{reason=\"init\"}")
                < at("gpu_exporter_dcgm_errors_total{reason=\"watch\"} 2")
        );
        // Refused fields in the fields' order.
        let (first, second) = if dram < tensor {
            (
                "DCGM_FI_PROF_DRAM_ACTIVE",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            )
        } else {
            (
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                "DCGM_FI_PROF_DRAM_ACTIVE",
            )
        };
        assert!(
            at(&format!(
                "gpu_exporter_dcgm_fields_refused{{field=\"{first}\""
            )) < at(&format!(
                "gpu_exporter_dcgm_fields_refused{{field=\"{second}\""
            ))
        );
        // Help texts verbatim: one full stop, not two.
        assert!(
            text.contains("# HELP gpu_exporter_dcgm_connected 1 while the DCGM hostengine (embedded, or -r) is connected.\n"),
            "{text}"
        );
        assert!(!text.contains(".."), "{text}");
        // A refusal that ends removes its series.
        m.set_refused(BTreeMap::from([(dram, Refusal::NotSupported)]));
        let text = body(&m);
        assert!(!text.contains("PIPE_TENSOR_ACTIVE"), "{text}");
        m.set_refused(BTreeMap::new());
        assert!(!body(&m).contains("gpu_exporter_dcgm_fields_refused"));
    }
}
