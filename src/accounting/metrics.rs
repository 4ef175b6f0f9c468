//! The accounting families, rendered once per sample from the ledger's totals:
//!
//! - `gpu_exporter_container_energy_joules_total`: energy charged to each account. Summed by
//!   `UUID` it is the GPU's own energy counter's increase (to the millijoule) since the exporter
//!   first read it: every remainder (unallocated capacity, processes outside pods) is a series of
//!   this same family.
//! - `gpu_exporter_container_allocated_gpu_seconds_total`: share of the GPU held x seconds.
//! - `gpu_exporter_container_sm_busy_gpu_seconds_total`: measured activity x seconds (with
//!   per-process readings, or MIG instance activity).
//! - `gpu_exporter_container_idle_allocated_gpu_seconds_total`: allocated GPU-seconds in which
//!   the holder ran no process on the GPU or instance (with per-process readings).
//! - `gpu_exporter_gpu_idle_power_watts`: the idle power used for the static part, by source.
//!
//! Labels: `gpu`, `UUID` (the physical GPU), `GPU_I_ID` (the MIG instance, empty for the whole
//! GPU), `consumer` (`holder`, `not_holder`, `outside_pods`, `unallocated`), `namespace`, `pod`,
//! `container` (empty but for containers).

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

use super::ledger::{GpuAccounts, GpuView, Ledger, Totals};
use super::types::{Account, Consumer, GpuTick};
use crate::self_metrics::{self, Collector, Num};

/// How accounting runs.
#[derive(Debug, Clone)]
pub struct AccountingOptions {
    /// Fixes every GPU's idle power, milliwatts (else it is learnt).
    pub idle_mw: Option<u64>,
    /// Per-process readings are on: busy time of containers and waste are known.
    pub processes: bool,
    /// Accounts idle this long are dropped.
    pub retention: Duration,
    /// The node label's name (`hostname`, or `Hostname` as dcgm-exporter 4.8.2 and older
    /// named it) and value, as on the GPU series.
    pub hostname: (String, String),
}

/// The ledger and its families; off (nothing rendered, nothing recorded) until enabled.
#[derive(Debug)]
pub struct AccountingMetrics {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    ledger: Option<Ledger>,
    processes: bool,
    hostname: (String, String),
}

impl Default for AccountingMetrics {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                ledger: None,
                processes: false,
                hostname: ("hostname".into(), String::new()),
            }),
        }
    }
}

impl AccountingMetrics {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns accounting on.
    pub fn enable(&self, opts: AccountingOptions) {
        let mut i = self.lock();
        i.ledger = Some(Ledger::new(opts.idle_mw, opts.retention));
        i.processes = opts.processes;
        i.hostname = opts.hostname;
    }

    /// Whether accounting is on.
    pub fn enabled(&self) -> bool {
        self.lock().ledger.is_some()
    }

    /// Advances the ledger to `at` with one sample's ticks.
    pub fn record(&self, at: Duration, ticks: &[GpuTick]) {
        if let Some(l) = self.lock().ledger.as_mut() {
            l.record(at, ticks);
        }
    }

    /// Every GPU's accounts now (empty when off).
    pub fn accounts(&self) -> std::collections::BTreeMap<String, GpuAccounts> {
        self.lock()
            .ledger
            .as_ref()
            .map(Ledger::accounts)
            .unwrap_or_default()
    }
}

/// Writes one float counter family over every account `value` gives a number for, with the
/// labels borrowed from the ledger (nothing is copied but the two numbers of each series).
fn family(
    e: &mut DescriptorEncoder,
    gpus: &[GpuView<'_>],
    host: &(String, String),
    name: &str,
    help: &str,
    value: impl Fn(&Account, &Totals) -> Option<f64>,
) -> std::fmt::Result {
    let mut rows = gpus
        .iter()
        .flat_map(|g| g.accounts.iter().map(move |(a, t)| (g, a, t)))
        .filter_map(|(g, a, t)| Some((g, a, value(a, t)?)))
        .peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let mut f = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (g, a, v) in rows {
        let (ns, pod, container) = match &a.consumer {
            Consumer::Container { pod, .. } => (
                pod.namespace.as_str(),
                pod.pod.as_str(),
                pod.container.as_str(),
            ),
            _ => ("", "", ""),
        };
        let index = g.index.to_string();
        let gi = a.gi_id.map(|i| i.to_string()).unwrap_or_default();
        let labels: [(&str, &str); 8] = [
            ("gpu", &index),
            ("UUID", g.uuid),
            ("GPU_I_ID", &gi),
            (&host.0, &host.1),
            ("consumer", a.consumer.as_str()),
            ("namespace", ns),
            ("pod", pod),
            ("container", container),
        ];
        ConstCounter::new(v).encode(f.encode_family(&labels.to_vec())?)?;
    }
    Ok(())
}

impl Collector for AccountingMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let inner = self.lock();
        let Some(ledger) = inner.ledger.as_ref() else {
            return Ok(());
        };
        let (processes, host) = (inner.processes, &inner.hostname);
        let gpus: Vec<GpuView<'_>> = ledger.view().collect();
        #[allow(clippy::cast_precision_loss)]
        family(
            &mut e,
            &gpus,
            host,
            "gpu_exporter_container_energy_joules",
            "Energy charged to each consumer of a GPU (J): summed by UUID, the GPU's own energy counter's increase since the exporter first read it, to the millijoule (static part by allocation, dynamic part by measured activity: docs/accounting.md).",
            |_, t| Some(t.energy_mj as f64 / 1000.0),
        )?;
        family(
            &mut e,
            &gpus,
            host,
            "gpu_exporter_container_allocated_gpu_seconds",
            "Share of the GPU held x seconds (a whole GPU for a second is 1; unallocated capacity is consumer=\"unallocated\").",
            |_, t| (t.allocated_gpu_seconds > 0.0).then_some(t.allocated_gpu_seconds),
        )?;
        family(
            &mut e,
            &gpus,
            host,
            "gpu_exporter_container_sm_busy_gpu_seconds",
            "Measured activity x seconds, as a share of the whole GPU (per-process SM utilisation; on MIG, the instance's engine activity).",
            |_, t| (t.busy_gpu_seconds > 0.0).then_some(t.busy_gpu_seconds),
        )?;
        if processes {
            family(
                &mut e,
                &gpus,
                host,
                "gpu_exporter_container_idle_allocated_gpu_seconds",
                "Allocated GPU-seconds in which the holder ran no process on the GPU or MIG instance (waste).",
                |a, t| {
                    matches!(a.consumer, Consumer::Container { holder: true, .. })
                        .then_some(t.idle_allocated_gpu_seconds)
                },
            )?;
        }
        #[derive(
            Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet,
        )]
        #[allow(non_snake_case)]
        struct Idle {
            gpu: String,
            UUID: String,
            source: &'static str,
        }
        self_metrics::gauge(
            &mut e,
            "gpu_exporter_gpu_idle_power_watts",
            "The idle power of each GPU the energy split uses for its static part (W), and how it is known: flag (--accounting-idle-power-watts) or measured (the lowest power over an interval without processes).",
            gpus.iter().filter_map(|g| {
                let (mw, source) = g.idle_mw?;
                #[allow(clippy::cast_precision_loss)]
                Some((
                    Idle {
                        gpu: g.index.to_string(),
                        UUID: g.uuid.to_owned(),
                        source: source.as_str(),
                    },
                    Num::Float(mw as f64 / 1000.0),
                ))
            }),
        )
    }
}
