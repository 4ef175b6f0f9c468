//! HTTP basic authentication against bcrypt hashes (`basic_auth_users`), cheap under floods.
//!
//! bcrypt at cost 10 takes ~70 ms of CPU by design, so these rules bound what an attacker can
//! burn and keep Prometheus's scrapes out of the attacker's queue:
//! - verdicts are cached by (user, SHA-256 of the password). Right passwords are kept apart from
//!   wrong ones, so a flood of distinct wrong guesses (which clears the bounded cache of
//!   failures) never evicts Prometheus's verdict: Prometheus pays one bcrypt run, once;
//! - repeats of the same wrong password are answered from the cache of failures;
//! - each client address may have one fresh (uncached) check in progress and a budget of
//!   [`FAILURE_BURST`] failed ones, refilled by one every [`FAILURE_REFILL`]; past that its fresh
//!   guesses are answered 429 without running bcrypt;
//! - fresh checks go through a small semaphore, so at most [`MAX_CONCURRENT_VERIFICATIONS`]
//!   bcrypt runs happen at once, and since a client waits there with at most one check, a
//!   client with the right password waits for at most one run per other client.
//!
//! Unknown users are checked against a real hash too, so timing does not reveal user names.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use super::RateLimiter;

/// bcrypt runs allowed in parallel.
pub const MAX_CONCURRENT_VERIFICATIONS: usize = 2;

/// Failed fresh checks a client may cause before it is throttled.
pub const FAILURE_BURST: u32 = 10;

/// One more failed check allowed per client every this long.
pub const FAILURE_REFILL: Duration = Duration::from_secs(6);

/// Cached verdicts of each kind kept before that cache is cleared (a bound on memory, not on
/// correctness).
const CACHE_CAPACITY: usize = 1024;

/// What a request's credentials get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Right credentials.
    Allowed,
    /// Missing or wrong credentials (401).
    Denied,
    /// Unchecked: the client has a check in progress or has used up its failures (429).
    Throttled,
}

type Key = (String, [u8; 32]);

#[derive(Debug, Default)]
struct Cache {
    right: HashSet<Key>,
    wrong: HashSet<Key>,
}

/// The configured users, the verdict caches and the per-client budgets.
#[derive(Debug)]
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    cache: Mutex<Cache>,
    checking: Mutex<HashSet<IpAddr>>,
    failures: RateLimiter,
    permits: Semaphore,
}

/// Removes a client from the set of those with a check in progress.
struct Checking<'a>(&'a Mutex<HashSet<IpAddr>>, IpAddr);

impl Drop for Checking<'_> {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.1);
    }
}

impl BasicAuth {
    /// `users`: user name → bcrypt hash (already validated by the config parser).
    pub fn new(users: BTreeMap<String, String>) -> Self {
        Self {
            users,
            cache: Mutex::new(Cache::default()),
            checking: Mutex::new(HashSet::new()),
            failures: RateLimiter::new(FAILURE_REFILL, FAILURE_BURST),
            permits: Semaphore::new(MAX_CONCURRENT_VERIFICATIONS),
        }
    }

    /// The verdict on an `Authorization` header value sent by `client`.
    pub async fn check(&self, authorization: Option<&[u8]>, client: IpAddr) -> Verdict {
        let Some((user, password)) = authorization.and_then(decode_basic) else {
            return Verdict::Denied;
        };
        let key = (user, Sha256::digest(password.as_bytes()).into());
        {
            let cache = self.lock();
            if cache.right.contains(&key) {
                return Verdict::Allowed;
            }
            if cache.wrong.contains(&key) {
                return Verdict::Denied;
            }
        }
        // Unknown users are checked against some real hash (and always fail), so that the time
        // taken does not tell which user names exist.
        let (hash, known) = match self.users.get(&key.0) {
            Some(h) => (h.clone(), true),
            None => match self.users.values().next() {
                Some(h) => (h.clone(), false),
                None => return Verdict::Denied,
            },
        };
        if !self.failures.available(client) {
            return Verdict::Throttled;
        }
        let _checking = {
            let mut c = self
                .checking
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !c.insert(client) {
                return Verdict::Throttled;
            }
            Checking(&self.checking, client)
        };
        let Ok(_permit) = self.permits.acquire().await else {
            return Verdict::Denied;
        };
        let verified = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(false);
        let right = known && verified;
        let mut cache = self.lock();
        let kept = if right {
            &mut cache.right
        } else {
            &mut cache.wrong
        };
        if kept.len() >= CACHE_CAPACITY {
            kept.clear();
        }
        kept.insert(key);
        drop(cache);
        if right {
            Verdict::Allowed
        } else {
            self.failures.spend(client);
            Verdict::Denied
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Splits `Basic <base64(user:password)>` into user and password.
pub fn decode_basic(header: &[u8]) -> Option<(String, String)> {
    let header = std::str::from_utf8(header).ok()?.trim();
    let (scheme, rest) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = decode_base64(rest.trim())?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// Standard base64 with padding (RFC 4648 §4), as browsers and Prometheus send it.
fn decode_base64(s: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(4) || bytes.len() > 8192 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let last = i + 1 == bytes.len() / 4;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * pad as u32;
        let b = n.to_be_bytes();
        out.extend_from_slice(&b[1..4 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_headers_decode() {
        // "prometheus:s3cr:et" — the password may contain ':'.
        assert_eq!(
            decode_basic(b"Basic cHJvbWV0aGV1czpzM2NyOmV0"),
            Some(("prometheus".into(), "s3cr:et".into()))
        );
        assert_eq!(decode_basic(b"basic YTpi"), Some(("a".into(), "b".into())));
        assert_eq!(
            decode_basic(b"Basic YTo="),
            Some(("a".into(), String::new()))
        );
        assert_eq!(decode_basic(b"Bearer YTpi"), None);
        assert_eq!(decode_basic(b"Basic YTpi="), None);
        assert_eq!(decode_basic(b"Basic Y=pi"), None);
        assert_eq!(decode_basic(b"Basic YWJj"), None, "no colon");
        assert_eq!(decode_basic(b"Basic"), None);
        assert_eq!(decode_basic(&[0xff, 0xfe]), None);
    }

    fn header(u: &str, p: &str) -> String {
        let raw = format!("{u}:{p}");
        format!("Basic {}", encode(raw.as_bytes()))
    }

    fn client(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    fn prom() -> BasicAuth {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        BasicAuth::new(BTreeMap::from([("prom".to_owned(), hash)]))
    }

    #[tokio::test]
    async fn right_password_passes_and_wrong_ones_fail_including_unknown_users() {
        let auth = prom();
        let c = client(1);
        let check = |u: &'static str, p: &'static str| {
            let h = header(u, p);
            let auth = &auth;
            async move { auth.check(Some(h.as_bytes()), c).await }
        };
        assert_eq!(check("prom", "s3cret").await, Verdict::Allowed);
        // Second time from the cache: same verdict.
        assert_eq!(check("prom", "s3cret").await, Verdict::Allowed);
        assert_eq!(check("prom", "s3cret ").await, Verdict::Denied);
        assert_eq!(check("eve", "s3cret").await, Verdict::Denied);
        assert_eq!(auth.check(None, c).await, Verdict::Denied);
        let cache = auth.lock();
        assert_eq!((cache.right.len(), cache.wrong.len()), (1, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_guessing_client_is_throttled_after_its_failure_budget() {
        let auth = prom();
        let attacker = client(2);
        let mut denied = 0;
        let mut throttled = 0;
        for i in 0..100 {
            let guess = header("prom", &format!("guess{i}"));
            match auth.check(Some(guess.as_bytes()), attacker).await {
                Verdict::Denied => denied += 1,
                Verdict::Throttled => throttled += 1,
                Verdict::Allowed => panic!("a wrong guess passed"),
            }
            if i == 50 {
                // Refill time passes: one more check for the attacker.
                tokio::time::advance(FAILURE_REFILL).await;
            }
        }
        assert_eq!(denied, FAILURE_BURST as usize + 1);
        assert_eq!(throttled, 100 - denied);
        assert_eq!(
            auth.lock().wrong.len(),
            denied,
            "throttled guesses ran no bcrypt"
        );
        // A repeat of a checked wrong guess is still answered from the cache, not throttled.
        let first = header("prom", "guess0");
        assert_eq!(
            auth.check(Some(first.as_bytes()), attacker).await,
            Verdict::Denied
        );
        // The right password from another client is checked while the attacker is throttled.
        let right = header("prom", "s3cret");
        assert_eq!(
            auth.check(Some(right.as_bytes()), client(1)).await,
            Verdict::Allowed
        );
    }

    #[tokio::test]
    async fn a_flood_of_wrong_guesses_never_evicts_the_right_password() {
        let auth = prom();
        let right = header("prom", "s3cret");
        assert_eq!(
            auth.check(Some(right.as_bytes()), client(1)).await,
            Verdict::Allowed
        );
        // More distinct wrong guesses than the cache holds (so it is cleared), from many clients.
        for i in 0..(CACHE_CAPACITY as u32 + 10) {
            let [_, _, a, b] = i.to_be_bytes();
            let guess = header("prom", &format!("guess{i}"));
            let from = IpAddr::from([10, 1, a, b]);
            assert_eq!(
                auth.check(Some(guess.as_bytes()), from).await,
                Verdict::Denied
            );
        }
        assert!(
            auth.lock().wrong.len() < CACHE_CAPACITY,
            "the failures were cleared"
        );
        // The scraper's verdict survived: answered from the cache.
        assert!(auth
            .lock()
            .right
            .contains(&("prom".to_owned(), Sha256::digest(b"s3cret").into())));
        assert_eq!(
            auth.check(Some(right.as_bytes()), client(1)).await,
            Verdict::Allowed
        );
    }

    #[tokio::test]
    async fn one_client_has_at_most_one_fresh_check_in_progress() {
        let auth = prom();
        let (a, b) = (header("prom", "guess-a"), header("prom", "guess-b"));
        let attacker = client(2);
        // Hold both bcrypt permits so the first check waits in the queue.
        let held = auth.permits.acquire_many(2).await.unwrap();
        let first = auth.check(Some(a.as_bytes()), attacker);
        let mut first = std::pin::pin!(first);
        assert!(
            futures_poll(first.as_mut()).is_none(),
            "the first check waits"
        );
        assert_eq!(
            auth.check(Some(b.as_bytes()), attacker).await,
            Verdict::Throttled
        );
        drop(held);
        assert_eq!(first.await, Verdict::Denied);
        // Done: the client may check again.
        assert_eq!(
            auth.check(Some(b.as_bytes()), attacker).await,
            Verdict::Denied
        );
    }

    fn futures_poll<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match f.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[test]
    fn base64_round_trips() {
        for s in ["", "a", "ab", "abc", "abcd", "user:pässword"] {
            assert_eq!(decode_base64(&encode(s.as_bytes())).unwrap(), s.as_bytes());
        }
    }

    fn encode(b: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for c in b.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= c.len() {
                    s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    s.push('=');
                }
            }
        }
        s
    }
}
