//! The HTTP server's own series (`gpu_exporter_scrapes_total`, `gpu_exporter_http_*`): scrapes
//! served, connections open and their limits, connections closed and requests turned away by
//! reason. Counted here by the server ([`super::conn`], the handlers), encoded by the
//! [`Collector`] into the sampler's body.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::self_metrics::{self, Collector, DescriptorEncoder, Num, Reason};

/// Why a connection was closed (`gpu_exporter_http_connections_closed_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The client closed it, or the exchange ended it (`Connection: close`).
    Closed,
    /// An I/O or HTTP protocol error (malformed request, reset).
    Error,
    /// The TLS handshake failed.
    TlsError,
    /// The TLS handshake did not complete within `handshake_timeout`.
    HandshakeTimeout,
    /// No request byte within `first_byte_timeout` of accepting (or of the handshake).
    FirstByteTimeout,
    /// The request head was not complete within `header_read_timeout` of its first byte.
    HeaderTimeout,
    /// The response was not written out within `write_timeout` of the request head.
    WriteTimeout,
    /// A keep-alive connection sent nothing for `idle_timeout`.
    IdleTimeout,
    /// Closed to make room for a new connection at `max_connections`.
    Evicted,
    /// Closed at accept: `max_connections` open and none of them could be evicted.
    Refused,
    /// The server shut down.
    Shutdown,
}

impl CloseReason {
    /// Every reason, in label order.
    pub const ALL: [CloseReason; 11] = [
        CloseReason::Closed,
        CloseReason::Error,
        CloseReason::Evicted,
        CloseReason::FirstByteTimeout,
        CloseReason::HandshakeTimeout,
        CloseReason::HeaderTimeout,
        CloseReason::IdleTimeout,
        CloseReason::Refused,
        CloseReason::Shutdown,
        CloseReason::TlsError,
        CloseReason::WriteTimeout,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::Closed => "closed",
            CloseReason::Error => "error",
            CloseReason::TlsError => "tls_error",
            CloseReason::HandshakeTimeout => "handshake_timeout",
            CloseReason::FirstByteTimeout => "first_byte_timeout",
            CloseReason::HeaderTimeout => "header_timeout",
            CloseReason::WriteTimeout => "write_timeout",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::Evicted => "evicted",
            CloseReason::Refused => "refused",
            CloseReason::Shutdown => "shutdown",
        }
    }

    /// Index into [`CloseReason::ALL`].
    pub fn index(self) -> usize {
        CloseReason::ALL
            .iter()
            .position(|&r| r == self)
            .unwrap_or_default()
    }
}

/// Why a request was turned away before reaching a handler
/// (`gpu_exporter_http_requests_rejected_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The client's `rate_limit` bucket was empty (429).
    RateLimit,
    /// Missing or wrong basic-auth credentials (401).
    Unauthorized,
    /// The client has used up its budget of failed password checks, or has one in progress
    /// (429, no bcrypt run).
    AuthThrottled,
}

impl RejectReason {
    /// Every reason, in label order.
    pub const ALL: [RejectReason; 3] = [
        RejectReason::AuthThrottled,
        RejectReason::RateLimit,
        RejectReason::Unauthorized,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::RateLimit => "rate_limit",
            RejectReason::Unauthorized => "unauthorized",
            RejectReason::AuthThrottled => "auth_throttled",
        }
    }

    /// Index into [`RejectReason::ALL`].
    pub fn index(self) -> usize {
        RejectReason::ALL
            .iter()
            .position(|&r| r == self)
            .unwrap_or_default()
    }
}

/// A label set of one label, `scope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
struct Scope {
    scope: &'static str,
}

/// How many parts the scrape counter is kept in (see [`HttpMetrics::count_scrape`]).
pub const SCRAPE_SHARDS: usize = 8;

/// One part of a counter, alone on its cache line (two lines: the CPU may fetch in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(AtomicU64);

/// The HTTP server's figures. Counters only grow; the gauges are the server's current state.
#[derive(Debug)]
pub struct HttpMetrics {
    /// Scrapes served, in parts: each connection counts into one ([`SCRAPE_SHARDS`]), so that
    /// two CPUs serving scrapes rarely take the same cache line from each other.
    scrapes: [Shard; SCRAPE_SHARDS],
    open: tokio::sync::watch::Sender<u64>,
    active: Gauge<u64, AtomicU64>,
    limit: Gauge<u64, AtomicU64>,
    active_limit: Gauge<u64, AtomicU64>,
    closed: [Counter; CloseReason::ALL.len()],
    rejected: [Counter; RejectReason::ALL.len()],
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            scrapes: Default::default(),
            open: tokio::sync::watch::Sender::new(0),
            active: Gauge::default(),
            limit: Gauge::default(),
            active_limit: Gauge::default(),
            closed: Default::default(),
            rejected: Default::default(),
        }
    }
}

impl HttpMetrics {
    /// Counts a `/metrics` request served, into part `shard` (taken modulo
    /// [`SCRAPE_SHARDS`]; a connection keeps to one).
    pub fn count_scrape(&self, shard: usize) {
        self.scrapes[shard % SCRAPE_SHARDS]
            .0
            .fetch_add(1, Ordering::Relaxed);
    }

    /// `/metrics` requests served so far.
    pub fn scrapes(&self) -> u64 {
        self.scrapes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }

    /// Sets the number of open connections, and of those past their first byte. Both are set
    /// before the watchers of [`HttpMetrics::watch_open`] wake, so one woken reads both new.
    pub fn set_open(&self, open: usize, active: usize) {
        self.active.set(active as u64);
        self.open.send_replace(open as u64);
    }

    /// Open connections past their first byte.
    pub fn active(&self) -> u64 {
        self.active.get()
    }

    /// Open connections.
    pub fn open(&self) -> u64 {
        *self.open.borrow()
    }

    /// Follows the number of open connections (for waiting on it).
    pub fn watch_open(&self) -> tokio::sync::watch::Receiver<u64> {
        self.open.subscribe()
    }

    /// Sets the connection limits in force: open at all, and past their first byte.
    pub fn set_limits(&self, open: usize, active: usize) {
        self.limit.set(open as u64);
        self.active_limit.set(active as u64);
    }

    /// Counts a closed connection.
    pub fn count_closed(&self, reason: CloseReason) {
        self.closed[reason.index()].inc();
    }

    /// Connections closed for `reason` so far.
    pub fn closed(&self, reason: CloseReason) -> u64 {
        self.closed[reason.index()].get()
    }

    /// Counts a request turned away.
    pub fn count_rejected(&self, reason: RejectReason) {
        self.rejected[reason.index()].inc();
    }

    /// Requests turned away for `reason` so far.
    pub fn rejected(&self, reason: RejectReason) -> u64 {
        self.rejected[reason.index()].get()
    }
}

fn load(g: &Gauge<u64, AtomicU64>) -> Num {
    Num::count(g.get())
}

impl Collector for HttpMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        self_metrics::counter1(
            &mut e,
            "gpu_exporter_scrapes",
            "Requests for /metrics served, as of the last sample.",
            self.scrapes(),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_http_connections_open",
            "HTTP connections open, as of the last sample.",
            Num::count(self.open()),
        )?;
        self_metrics::gauge1(
            &mut e,
            "gpu_exporter_http_connections_active",
            "HTTP connections open that have sent at least one byte (and hold buffers), as of the last sample.",
            load(&self.active),
        )?;
        self_metrics::gauge(
            &mut e,
            "gpu_exporter_http_connections_limit",
            "HTTP connection limits: open at all, and active (past their first byte). At a limit the least useful connection of the heaviest client is closed for the new one.",
            [
                (Scope { scope: "active" }, load(&self.active_limit)),
                (Scope { scope: "open" }, load(&self.limit)),
            ],
        )?;
        self_metrics::counter(
            &mut e,
            "gpu_exporter_http_connections_closed",
            "HTTP connections closed, by reason (timeouts by phase, evicted at the connection limit, refused, closed normally).",
            CloseReason::ALL
                .iter()
                .map(|r| (Reason { reason: r.as_str() }, self.closed(*r))),
        )?;
        self_metrics::counter(
            &mut e,
            "gpu_exporter_http_requests_rejected",
            "HTTP requests turned away before reaching a handler, by reason (per-client rate limit, bad credentials, per-client limit on failed logins).",
            RejectReason::ALL
                .iter()
                .map(|r| (Reason { reason: r.as_str() }, self.rejected(*r))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrapes_counted_into_any_part_from_any_thread_add_up() {
        let m = std::sync::Arc::new(HttpMetrics::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let m = std::sync::Arc::clone(&m);
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        m.count_scrape(t * 1000 + i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(m.scrapes(), 4000);
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(m));
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("gpu_exporter_scrapes_total 4000\n"), "{text}");
    }

    #[test]
    fn reasons_are_listed_once_in_label_order() {
        let labels: Vec<_> = CloseReason::ALL.iter().map(|r| r.as_str()).collect();
        let mut sorted = labels.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(labels, sorted);
        for (i, r) in CloseReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }
}
