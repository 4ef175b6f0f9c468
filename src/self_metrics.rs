//! What every module's own `gpu_exporter_*` families share, and nothing more: the
//! [`prometheus-client`](prometheus_client) registry they are registered in, the 0.0.4 text
//! encoding of it, and small helpers for collectors that emit families in a fixed order.
//!
//! Each module defines and updates its own families (the HTTP layer its connection figures, the
//! kubelet and CRI clients their health, the sampler its samples...) and implements
//! [`Collector`] for them; `main.rs` registers every one into one [`Registry`], in the order
//! they appear in the body; the sampler encodes that registry into the pre-rendered body once
//! per sample ([`encode_into`]), so a scrape still costs nothing and sees the figures as of the
//! last sample. This module imports nothing from the rest of the crate, so no import circle can
//! form through it.
//!
//! Why collectors rather than registered `Family`s: `Family` iterates in `HashMap` order, and
//! the body must be byte-stable (golden files, diffs between samples); most of our families
//! are either snapshots of the latest state (GPUs by state, the kubelet's last answer) or
//! counters over a fixed list of reasons, both of which a collector emits in a fixed order
//! without `Family::remove` bookkeeping. A collector's help text is also written verbatim
//! (`Registry::register` appends a "."), so the HELP lines stay as they were.
//!
//! The `DCGM_*` series do not go through this: prometheus-client appends `_total` to every
//! counter, which would rename dcgm-exporter's counters (`DCGM_FI_DEV_PCIE_REPLAY_COUNTER`);
//! they keep the crate's own renderer ([`crate::render`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use prometheus_client::collector::Collector;
pub use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::{
    EncodeGaugeValue, EncodeLabelSet, EncodeMetric, GaugeValueEncoder,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
pub use prometheus_client::registry::Registry;

/// Appends every family of `registry` to `out`, in Prometheus text format 0.0.4.
pub fn encode_into(registry: &Registry, out: &mut String) {
    prometheus_client::encoding::prometheus_text::encode(out, registry)
        .expect("encoding into a String: writing to memory cannot fail");
}

/// A gauge's value: whole numbers (counts, and floats without a fraction such as Unix times in
/// whole seconds) are written without a decimal point, as the crate's renderer writes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// A count.
    Int(i64),
    /// A measurement.
    Float(f64),
}

impl Num {
    /// A count, saturating at `i64::MAX`.
    pub fn count(n: u64) -> Self {
        Self::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl EncodeGaugeValue for Num {
    fn encode(&self, encoder: &mut GaugeValueEncoder) -> fmt::Result {
        match *self {
            Self::Int(i) => i.encode(encoder),
            // Whole and exactly representable: "1936742400", not "1936742400.0".
            #[allow(clippy::cast_possible_truncation)]
            Self::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => (f as i64).encode(encoder),
            Self::Float(f) => f.encode(encoder),
        }
    }
}

/// A label set of one label, `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
pub struct Reason {
    /// Why.
    pub reason: &'static str,
}

/// Writes a counter family (`name` without `_total`: the encoder appends it) with one series
/// per item, in the order given; nothing at all when there are none.
///
/// # Errors
/// Only the writer's.
pub fn counter<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, u64)>,
) -> fmt::Result {
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, n) in series {
        ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes an unlabelled counter (`name` without `_total`).
///
/// # Errors
/// Only the writer's.
pub fn counter1(encoder: &mut DescriptorEncoder, name: &str, help: &str, n: u64) -> fmt::Result {
    ConstCounter::new(n).encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// Writes a gauge family with one series per item, in the order given; nothing at all when
/// there are none.
///
/// # Errors
/// Only the writer's.
pub fn gauge<L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, Num)>,
) -> fmt::Result {
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes an unlabelled gauge.
///
/// # Errors
/// Only the writer's.
pub fn gauge1(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: Num) -> fmt::Result {
    ConstGauge::new(v).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// An unlabelled counter kept by someone else in a shared atomic (the log writer's failed
/// writes), written only once it is non-zero, so that the bodies of healthy exporters do not
/// change.
#[derive(Debug)]
pub struct CounterOnceNonZero {
    name: &'static str,
    help: &'static str,
    count: Arc<AtomicU64>,
}

impl CounterOnceNonZero {
    /// Writes `count` as counter `name` (without `_total`) with `help`, once non-zero.
    pub fn new(name: &'static str, help: &'static str, count: Arc<AtomicU64>) -> Self {
        Self { name, help, count }
    }
}

impl Collector for CounterOnceNonZero {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        match self.count.load(Ordering::Relaxed) {
            0 => Ok(()),
            n => counter1(&mut encoder, self.name, self.help, n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed;

    impl Collector for Fixed {
        fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
            counter(
                &mut e,
                "x_errors",
                "Errors, by reason (no dot appended)",
                [(Reason { reason: "b\"q" }, 2), (Reason { reason: "a" }, 1)],
            )?;
            counter::<Reason>(&mut e, "x_none", "Never written.", [])?;
            gauge1(
                &mut e,
                "x_time_seconds",
                "A time.",
                Num::Float(1_936_742_400.0),
            )?;
            gauge1(&mut e, "x_ratio", "A ratio.", Num::Float(0.25))?;
            counter1(&mut e, "x_samples", "Samples.", 3)
        }
    }

    #[test]
    fn a_counter_kept_elsewhere_appears_once_non_zero() {
        let count = Arc::new(AtomicU64::new(0));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(CounterOnceNonZero::new(
            "x_lost",
            "Lost.",
            Arc::clone(&count),
        )));
        let mut out = String::new();
        encode_into(&registry, &mut out);
        assert_eq!(out, "");
        count.store(2, Ordering::Relaxed);
        encode_into(&registry, &mut out);
        assert_eq!(
            out,
            "# HELP x_lost_total Lost.\n# TYPE x_lost_total counter\nx_lost_total 2\n"
        );
    }

    #[test]
    fn families_come_out_in_the_order_given_with_help_verbatim_and_total_appended() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed));
        let mut out = String::from("before\n");
        encode_into(&registry, &mut out);
        assert_eq!(
            out,
            "before\n\
             # HELP x_errors_total Errors, by reason (no dot appended)\n\
             # TYPE x_errors_total counter\n\
             x_errors_total{reason=\"b\\\"q\"} 2\n\
             x_errors_total{reason=\"a\"} 1\n\
             # HELP x_time_seconds A time.\n\
             # TYPE x_time_seconds gauge\n\
             x_time_seconds 1936742400\n\
             # HELP x_ratio A ratio.\n\
             # TYPE x_ratio gauge\n\
             x_ratio 0.25\n\
             # HELP x_samples_total Samples.\n\
             # TYPE x_samples_total counter\n\
             x_samples_total 3\n"
        );
    }
}
