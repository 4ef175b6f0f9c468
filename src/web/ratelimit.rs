//! Per-client token buckets: `rate_limit` in the web configuration, and the budget of failed
//! logins ([`super::auth`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

/// Token buckets kept per client address (`rate_limit`, and the budget of failed logins), so
/// that a flood from one client empties only its own bucket. exporter-toolkit keeps one bucket
/// for all clients, which lets any client starve Prometheus.
#[derive(Debug)]
pub struct RateLimiter {
    interval: Duration,
    burst: u32,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: tokio::time::Instant,
}

/// Client addresses with a bucket kept; beyond it, full buckets are dropped first (they are
/// the same as a new one), then the least recently used.
pub const MAX_TRACKED_CLIENTS: usize = 4096;

impl RateLimiter {
    /// `burst` tokens per client, one more every `interval`.
    pub fn new(interval: Duration, burst: u32) -> Self {
        Self {
            interval,
            burst,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn refilled(&self, b: Bucket, now: tokio::time::Instant) -> f64 {
        let refill = now.duration_since(b.at).as_secs_f64() / self.interval.as_secs_f64();
        (b.tokens + refill).min(f64::from(self.burst))
    }

    pub(super) fn with_bucket<T>(&self, client: IpAddr, f: impl FnOnce(&mut f64) -> T) -> T {
        let mut map = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = tokio::time::Instant::now();
        if map.len() >= MAX_TRACKED_CLIENTS && !map.contains_key(&client) {
            let full = f64::from(self.burst);
            map.retain(|_, b| self.refilled(*b, now) < full);
            if map.len() >= MAX_TRACKED_CLIENTS {
                if let Some(oldest) = map.iter().min_by_key(|(_, b)| b.at).map(|(k, _)| *k) {
                    map.remove(&oldest);
                }
            }
        }
        let full = Bucket {
            tokens: f64::from(self.burst),
            at: now,
        };
        let b = map.entry(client).or_insert(full);
        let mut tokens = self.refilled(*b, now);
        let out = f(&mut tokens);
        *b = Bucket { tokens, at: now };
        out
    }

    /// Takes one of `client`'s tokens; `false` when its bucket is empty.
    pub fn allow(&self, client: IpAddr) -> bool {
        self.with_bucket(client, |t| {
            if *t >= 1.0 {
                *t -= 1.0;
                true
            } else {
                false
            }
        })
    }

    /// Whether `client` has a token, without taking it.
    pub fn available(&self, client: IpAddr) -> bool {
        self.with_bucket(client, |t| *t >= 1.0)
    }

    /// Takes one of `client`'s tokens if it has one.
    pub fn spend(&self, client: IpAddr) {
        self.with_bucket(client, |t| *t = (*t - 1.0).max(0.0));
    }

    /// Clients with a bucket kept.
    pub fn tracked(&self) -> usize {
        self.buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(a: u8, b: u8) -> IpAddr {
        IpAddr::from([10, 0, a, b])
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limiter_allows_a_burst_then_one_per_interval_per_client() {
        let r = RateLimiter::new(Duration::from_secs(1), 2);
        let (flood, scraper) = (ip(0, 1), ip(0, 2));
        assert!(r.allow(flood));
        assert!(r.allow(flood));
        assert!(!r.allow(flood));
        // Another client's bucket is untouched by the first one's flood.
        assert!(r.allow(scraper));
        assert!(r.available(scraper));
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(r.allow(flood));
        assert!(!r.allow(flood));
        assert!(!r.available(flood));
        r.spend(scraper);
        r.spend(scraper);
        assert!(!r.available(scraper));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limiter_memory_is_bounded_and_busy_clients_keep_their_state() {
        // Twice as many clients as kept, each emptying its bucket: the least recently used
        // buckets go.
        let r = RateLimiter::new(Duration::from_secs(60), 1);
        for i in 0..(MAX_TRACKED_CLIENTS as u32 * 2) {
            let [_, _, a, b] = i.to_be_bytes();
            let client = IpAddr::from([10, 1, a, b]);
            assert!(r.allow(client));
            assert!(!r.allow(client));
            assert!(r.tracked() <= MAX_TRACKED_CLIENTS);
        }
        assert_eq!(r.tracked(), MAX_TRACKED_CLIENTS);
        // Full buckets go before empty ones.
        let r = RateLimiter::new(Duration::from_secs(60), 1);
        let flood = ip(255, 255);
        assert!(r.allow(flood));
        for i in 0..MAX_TRACKED_CLIENTS as u32 {
            let [_, _, a, b] = i.to_be_bytes();
            assert!(r.available(IpAddr::from([10, 1, a, b])));
        }
        assert!(
            !r.allow(flood),
            "the empty bucket was dropped before full ones"
        );
    }
}
