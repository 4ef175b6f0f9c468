//! The accounting families, rendered into each body once per sample from the ledger's totals
//! (written here rather than through prometheus-client: each account's label set is rendered
//! once and kept with its totals, so the families cost one line copy and one number per
//! series and sample):
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
//! Labels: `gpu`, `UUID` (the physical GPU), `GPU_I_ID` (the MIG instance; absent for the whole
//! GPU), the node label, `consumer` (`holder`, `not_holder`, `outside_pods`, `unallocated`),
//! `namespace`, `pod`, `container` (absent but for containers). Empty labels are left out:
//! Prometheus treats an empty label as no label.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use std::fmt::Write as _;

use super::ledger::{GpuAccounts, GpuView, Ledger, Totals};
use super::types::{Account, Consumer, GpuTick};
use crate::gzip::Part;
use crate::render::escape_label_value;

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
    /// How often the families are rendered again (`--accounting-publish-interval`); zero:
    /// at every sample. The totals advance at every sample either way.
    pub publish_every: Duration,
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
    publish_every: Duration,
    /// The families as last rendered, the sample time and the ledger generation they were
    /// rendered at.
    published: Option<(Duration, u64, Arc<Part>)>,
}

impl Default for AccountingMetrics {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                ledger: None,
                processes: false,
                hostname: ("hostname".into(), String::new()),
                publish_every: Duration::ZERO,
                published: None,
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
        i.publish_every = opts.publish_every;
        i.published = None;
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

/// A counter family's value: exact millijoules as joules, or a float.
#[derive(Clone, Copy)]
enum Value {
    MilliJoules(u64),
    Float(f64),
}

/// Writes one counter family (`name` ends in `_total`) over every account `value` gives a
/// number for: each account's label set is rendered once and kept with its totals, so a sample
/// costs one line copy and one number per series (no allocation).
fn family(
    out: &mut String,
    gpus: &[GpuView<'_>],
    host: &(String, String),
    name: &str,
    help: &str,
    value: impl Fn(&Account, &Totals) -> Option<Value>,
) {
    let mut header = false;
    for g in gpus {
        for (a, t) in g.accounts.iter() {
            let Some(v) = value(a, t) else {
                continue;
            };
            if !header {
                header = true;
                let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} counter\n");
            }
            out.push_str(name);
            out.push_str(t.labels(|| label_set(g, a, host)));
            let _ = match v {
                Value::MilliJoules(mj) => {
                    out.push(' ');
                    milli(out, mj);
                    writeln!(out)
                }
                Value::Float(f) => {
                    out.push(' ');
                    micro(out, f);
                    writeln!(out)
                }
            };
        }
    }
}

/// `f` to the microsecond (GPU-seconds need no more), without trailing zeros: `12.5`, `3`.
fn micro(out: &mut String, f: f64) {
    let start = out.len();
    let _ = write!(out, "{f:.6}");
    if out[start..].contains('.') {
        let trimmed = out[start..]
            .trim_end_matches('0')
            .trim_end_matches('.')
            .len();
        out.truncate(start + trimmed);
    }
}

/// `n` thousandths, exactly: `2.001`, `0.25`, `3`.
fn milli(out: &mut String, n: u64) {
    let _ = write!(out, "{}", n / 1000);
    let frac = n % 1000;
    if frac != 0 {
        out.push('.');
        let digits = [frac / 100, frac / 10 % 10, frac % 10];
        let last = digits.iter().rposition(|d| *d != 0).unwrap_or(0);
        for d in &digits[..=last] {
            out.push(char::from(b'0' + u8::try_from(*d).unwrap_or(0)));
        }
    }
}

/// `{gpu="0",UUID="GPU-…",GPU_I_ID="2",hostname="node",consumer="holder",namespace="ml",
/// pod="p",container="c"}`; empty labels are left out (to Prometheus an empty label is no
/// label), so the remainders' series are short.
fn label_set(g: &GpuView<'_>, a: &Account, host: &(String, String)) -> String {
    let mut s = String::with_capacity(160);
    let gi = a.gi_id.map(|i| i.to_string()).unwrap_or_default();
    let (ns, pod, container) = match &a.consumer {
        Consumer::Container { pod, .. } => (
            pod.namespace.as_str(),
            pod.pod.as_str(),
            pod.container.as_str(),
        ),
        _ => ("", "", ""),
    };
    let index = g.index.to_string();
    for (k, v) in [
        ("gpu", index.as_str()),
        ("UUID", g.uuid),
        ("GPU_I_ID", gi.as_str()),
        (host.0.as_str(), host.1.as_str()),
        ("consumer", a.consumer.as_str()),
        ("namespace", ns),
        ("pod", pod),
        ("container", container),
    ] {
        if v.is_empty() {
            continue;
        }
        s.push(if s.is_empty() { '{' } else { ',' });
        s.push_str(k);
        s.push_str("=\"");
        escape_label_value(v, &mut s);
        s.push('"');
    }
    if s.is_empty() {
        s.push('{');
    }
    s.push('}');
    s
}

impl AccountingMetrics {
    /// The accounting families for the body of the sample taken at `at` (the time the ledger
    /// was last advanced to), with their compressed form: rendered again when a publish
    /// interval has passed since they last were, or when an account came or went (so a new
    /// pod's series show at once, and a gone one's stop), else as they were. The totals are
    /// exact at each publication; between two, a scrape sees the last one. `None` while
    /// accounting is off.
    /// `unix_seconds` is the sample's wall-clock time, served as
    /// `gpu_exporter_accounting_published_timestamp_seconds` with the families it dates.
    pub fn published(&self, at: Duration, unix_seconds: f64) -> Option<Arc<Part>> {
        let mut inner = self.lock();
        let generation = inner.ledger.as_ref()?.generation();
        if let Some((when, g, part)) = &inner.published {
            let due = at.saturating_sub(*when) >= inner.publish_every;
            if !due && *g == generation {
                return Some(Arc::clone(part));
            }
        }
        let mut text = String::new();
        inner.render(&mut text);
        text.push_str("# HELP gpu_exporter_accounting_published_timestamp_seconds When the accounting families in this body were rendered (unix time): their totals are as of that sample (--accounting-publish-interval).\n# TYPE gpu_exporter_accounting_published_timestamp_seconds gauge\ngpu_exporter_accounting_published_timestamp_seconds ");
        micro(&mut text, unix_seconds);
        text.push('\n');
        let part = Part::new(text);
        inner.published = Some((at, generation, Arc::clone(&part)));
        Some(part)
    }

    /// Appends the accounting families to `out` as they are now, in Prometheus text format
    /// 0.0.4; nothing while accounting is off.
    pub fn render_into(&self, out: &mut String) {
        self.lock().render(out);
    }
}

impl Inner {
    fn render(&self, out: &mut String) {
        let Some(ledger) = self.ledger.as_ref() else {
            return;
        };
        let (processes, host) = (self.processes, &self.hostname);
        let gpus: Vec<GpuView<'_>> = ledger.view().collect();
        family(
            out,
            &gpus,
            host,
            "gpu_exporter_container_energy_joules_total",
            "Energy charged to each consumer of a GPU (J): summed by UUID, the GPU's own energy counter's increase since the exporter first read it, to the millijoule (static part by allocation, dynamic part by measured activity: docs/accounting.md).",
            |_, t| Some(Value::MilliJoules(t.energy_mj)),
        );
        family(
            out,
            &gpus,
            host,
            "gpu_exporter_container_allocated_gpu_seconds_total",
            "Share of the GPU held x seconds (a whole GPU for a second is 1; unallocated capacity is consumer=\"unallocated\").",
            |_, t| (t.allocated_gpu_seconds > 0.0).then_some(Value::Float(t.allocated_gpu_seconds)),
        );
        family(
            out,
            &gpus,
            host,
            "gpu_exporter_container_sm_busy_gpu_seconds_total",
            "Measured activity x seconds, as a share of the whole GPU (per-process SM utilisation; on MIG, the instance's engine activity).",
            |_, t| (t.busy_gpu_seconds > 0.0).then_some(Value::Float(t.busy_gpu_seconds)),
        );
        if processes {
            family(
                out,
                &gpus,
                host,
                "gpu_exporter_container_idle_allocated_gpu_seconds_total",
                "Allocated GPU-seconds in which the holder ran no process on the GPU or MIG instance (waste).",
                |a, t| {
                    matches!(a.consumer, Consumer::Container { holder: true, .. })
                        .then_some(Value::Float(t.idle_allocated_gpu_seconds))
                },
            );
        }
        let mut header = false;
        for g in &gpus {
            let Some((mw, source)) = g.idle_mw else {
                continue;
            };
            if !header {
                header = true;
                out.push_str("# HELP gpu_exporter_gpu_idle_power_watts The idle power of each GPU the energy split uses for its static part (W), and how it is known: flag (--accounting-idle-power-watts) or measured (the lowest power over an interval without processes).\n# TYPE gpu_exporter_gpu_idle_power_watts gauge\n");
            }
            out.push_str("gpu_exporter_gpu_idle_power_watts{gpu=\"");
            let _ = write!(out, "{}", g.index);
            out.push_str("\",UUID=\"");
            escape_label_value(g.uuid, out);
            let _ = write!(out, "\",source=\"{}\"}} ", source.as_str());
            milli(out, mw);
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pods::PodRef;

    fn tick(index: u32, mj: u64) -> GpuTick {
        let holder = Account::container(
            None,
            PodRef {
                namespace: "ml".into(),
                pod: "trainer-\"0\"".into(),
                container: "main".into(),
            },
            true,
        );
        GpuTick {
            uuid: "GPU-a".into(),
            index,
            energy_mj: Some(mj),
            allocated: vec![(holder.clone(), 0.5)].into(),
            busy: vec![(holder, 0.25)],
            running: None,
        }
    }

    fn body(m: &AccountingMetrics) -> String {
        let mut out = String::new();
        m.render_into(&mut out);
        out
    }

    #[test]
    fn families_are_published_again_only_after_the_publish_interval_and_exact_when_they_are() {
        let m = AccountingMetrics::default();
        assert!(m.published(Duration::ZERO, 0.0).is_none(), "off: no part");
        m.enable(AccountingOptions {
            idle_mw: Some(0),
            processes: false,
            retention: Duration::from_secs(600),
            hostname: ("hostname".into(), "node-a".into()),
            publish_every: Duration::from_secs(60),
        });
        let text = |p: &Arc<Part>| String::from_utf8(p.text().to_vec()).expect("utf-8");
        let joules = |p: &Arc<Part>| {
            let t = text(p);
            let line = t
                .lines()
                .find(|l| {
                    l.starts_with("gpu_exporter_container_energy_joules_total{")
                        && l.contains("consumer=\"holder\"")
                })
                .map(str::to_owned);
            line.map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
        };
        let secs = Duration::from_secs;
        m.record(secs(0), &[tick(0, 1_000)]);
        let empty = m.published(secs(0), 1e9 + 0.0).expect("on");
        assert_eq!(joules(&empty), None, "the first reading is the baseline");
        // The accounts appear: published at once, though the interval has not passed.
        m.record(secs(10), &[tick(0, 2_000)]);
        let first = m.published(secs(10), 1e9 + 10.0).expect("on");
        assert_eq!(joules(&first).as_deref(), Some("1"), "{}", text(&first));
        // Within the interval, the same accounts: the same part (not rendered or compressed
        // again), though the totals advanced.
        m.record(secs(30), &[tick(0, 4_000)]);
        let kept = m.published(secs(30), 1e9 + 30.0).expect("on");
        assert!(Arc::ptr_eq(&first, &kept));
        assert_eq!(joules(&kept).as_deref(), Some("1"));
        // A minute after the last publication: rendered again, with every joule since.
        m.record(secs(70), &[tick(0, 6_500)]);
        let next = m.published(secs(70), 1e9 + 70.0).expect("on");
        assert!(!Arc::ptr_eq(&first, &next));
        assert_eq!(joules(&next).as_deref(), Some("5.5"), "{}", text(&next));
        // The families as render_into writes them at that moment, then their date.
        let mut now = String::new();
        m.render_into(&mut now);
        assert!(text(&next).starts_with(&now));
        assert!(text(&next)
            .ends_with("\ngpu_exporter_accounting_published_timestamp_seconds 1000000070\n"));
        assert!(text(&kept)
            .ends_with("\ngpu_exporter_accounting_published_timestamp_seconds 1000000010\n"));
        // Zero: every sample.
        m.enable(AccountingOptions {
            idle_mw: Some(0),
            processes: false,
            retention: Duration::from_secs(600),
            hostname: ("hostname".into(), "node-a".into()),
            publish_every: Duration::ZERO,
        });
        let a = m.published(secs(71), 1e9 + 71.0).expect("on");
        let b = m.published(secs(71), 1e9 + 71.0).expect("on");
        assert!(!Arc::ptr_eq(&a, &b));
    }

    #[test]
    fn families_render_exact_joules_with_cached_label_sets_that_follow_a_renumbered_gpu() {
        let m = AccountingMetrics::default();
        assert_eq!(body(&m), "", "off: nothing");
        m.enable(AccountingOptions {
            idle_mw: Some(0),
            processes: false,
            retention: Duration::from_secs(60),
            hostname: ("Hostname".into(), "node-a".into()),
            publish_every: std::time::Duration::ZERO,
        });
        m.record(Duration::from_secs(0), &[tick(0, 1_000)]);
        m.record(Duration::from_secs(2), &[tick(0, 3_001)]);
        let text = body(&m);
        // Idle power 0: all 2.001 J are dynamic, all to the only busy account; the
        // unallocated half of the GPU gets its allocated seconds, not a series without labels.
        assert!(
            text.contains(
                "# TYPE gpu_exporter_container_energy_joules_total counter\n\
                 gpu_exporter_container_energy_joules_total{gpu=\"0\",UUID=\"GPU-a\",Hostname=\"node-a\",consumer=\"holder\",namespace=\"ml\",pod=\"trainer-\\\"0\\\"\",container=\"main\"} 2.001\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "gpu_exporter_container_allocated_gpu_seconds_total{gpu=\"0\",UUID=\"GPU-a\",Hostname=\"node-a\",consumer=\"unallocated\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "gpu_exporter_gpu_idle_power_watts{gpu=\"0\",UUID=\"GPU-a\",source=\"flag\"} 0\n"
            ),
            "{text}"
        );
        let mut s = String::new();
        for n in [0, 1, 10, 250, 2_001, 3_000, 1_234_567] {
            milli(&mut s, n);
            s.push(' ');
        }
        assert_eq!(s, "0 0.001 0.01 0.25 2.001 3 1234.567 ");
        let mut s = String::new();
        for f in [0.0, 1.0, 0.5, 12.345_678_9, 1e-9, 3_600.000_000_4] {
            micro(&mut s, f);
            s.push(' ');
        }
        assert_eq!(s, "0 1 0.5 12.345679 0 3600 ");
        assert_eq!(text, body(&m), "the same body from the cache");
        // The GPU renumbered (a rediscovery): its accounts' labels are made again.
        m.record(Duration::from_secs(3), &[tick(4, 3_500)]);
        let text = body(&m);
        assert!(!text.contains("gpu=\"0\""), "{text}");
        assert!(text.contains("energy_joules_total{gpu=\"4\",UUID=\"GPU-a\",Hostname=\"node-a\",consumer=\"holder\""), "{text}");
    }
}
