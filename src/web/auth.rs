//! HTTP basic authentication against bcrypt hashes (`basic_auth_users`), cheap under floods.
//!
//! bcrypt at cost 10 takes ~70 ms of CPU by design, so these rules bound what an attacker can
//! burn and keep Prometheus's scrapes out of the attacker's queue:
//! - verdicts are cached by (user, SHA-256 of the password). Right passwords are kept apart from
//!   wrong ones, so a flood of distinct wrong guesses (which clears the bounded cache of
//!   failures) never evicts Prometheus's verdict: Prometheus pays one bcrypt run, once;
//! - repeats of the same wrong password are answered from the cache of failures, and requests
//!   with the same credentials as a check in progress wait for its verdict instead of running
//!   their own (two connections of one scraper logging in at once both get in);
//! - each client address may have one fresh (uncached) check in progress and a budget of
//!   [`FAILURE_BURST`] failed ones, refilled by one every [`FAILURE_REFILL`]; past that its fresh
//!   guesses are answered 429 without running bcrypt;
//! - fresh checks go through a small semaphore, so at most [`MAX_CONCURRENT_VERIFICATIONS`]
//!   bcrypt runs happen at once, and since a client waits there with at most one check, a
//!   client with the right password waits for at most one run per other client. A check that
//!   has started runs to its end even if its request is given up (the 30 s request timeout, a
//!   closed connection), and keeps its semaphore permit, its client's "check in progress" mark
//!   and the charge of a failure until then: giving up a request never lifts a bound.
//!
//! Unknown users are checked against the configured hash with the highest bcrypt cost, so an
//! unknown name takes as long as the slowest user. Users whose hashes have different costs can
//! still be told apart from each other (and a user with a lower cost from an unknown name) by
//! the time a fresh check takes; give every user the same cost to avoid that (a warning is
//! logged when they differ).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::{watch, Semaphore};

use super::ratelimit::RateLimiter;

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

/// What outlives a reload of the web configuration: the bound on parallel bcrypt runs and each
/// client's budget of failures.
#[derive(Debug)]
pub struct Budgets {
    failures: RateLimiter,
    permits: Arc<Semaphore>,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            failures: RateLimiter::new(FAILURE_REFILL, FAILURE_BURST),
            permits: Arc::new(Semaphore::new(MAX_CONCURRENT_VERIFICATIONS)),
        }
    }
}

/// The verdicts of one version of the users (a reload starts afresh, so a revoked password
/// is checked again).
#[derive(Debug, Default)]
struct Verdicts {
    cache: Mutex<Cache>,
    /// Clients with a fresh check in progress.
    checking: Mutex<HashSet<IpAddr>>,
    /// Fresh checks in progress, by credentials: `Some(right)` once decided.
    in_flight: Mutex<HashMap<Key, watch::Receiver<Option<bool>>>>,
}

/// The configured users, the verdict caches and the per-client budgets.
#[derive(Debug)]
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    /// The hash unknown users are checked against: the highest cost configured.
    decoy: String,
    verdicts: Arc<Verdicts>,
    budgets: Arc<Budgets>,
}

/// Clears a fresh check's marks when it ends (or is given up before it starts).
struct Fresh {
    verdicts: Arc<Verdicts>,
    client: IpAddr,
    key: Key,
}

impl Drop for Fresh {
    fn drop(&mut self) {
        lock(&self.verdicts.checking).remove(&self.client);
        lock(&self.verdicts.in_flight).remove(&self.key);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The cost field of a bcrypt hash (`$2b$10$...` → 10).
fn cost(hash: &str) -> u32 {
    hash.get(4..6).and_then(|c| c.parse().ok()).unwrap_or(0)
}

impl BasicAuth {
    /// `users`: user name → bcrypt hash (already validated by the config parser).
    pub fn new(users: BTreeMap<String, String>) -> Self {
        Self::with_budgets(users, None)
    }

    /// Like [`Self::new`], sharing `budgets` (from the configuration this one replaces).
    pub fn with_budgets(users: BTreeMap<String, String>, budgets: Option<Arc<Budgets>>) -> Self {
        let decoy = users
            .values()
            .max_by_key(|h| cost(h))
            .cloned()
            .unwrap_or_default();
        Self {
            users,
            decoy,
            verdicts: Arc::default(),
            budgets: budgets.unwrap_or_default(),
        }
    }

    /// The budgets, to hand on to the next version of the configuration.
    pub fn budgets(&self) -> Arc<Budgets> {
        Arc::clone(&self.budgets)
    }

    /// The distinct bcrypt costs of the configured hashes, lowest first.
    pub fn costs(&self) -> Vec<u32> {
        let mut c: Vec<u32> = self.users.values().map(|h| cost(h)).collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    /// The verdict on an `Authorization` header value when it needs no bcrypt check and no
    /// waiting: a header that is not Basic credentials, or credentials whose verdict is cached.
    /// `None`: ask [`Self::check`]. (A scraper's every request after its first is answered
    /// here, without a future that holds the request.)
    pub fn check_now(&self, authorization: Option<&[u8]>) -> Option<Verdict> {
        let Some((user, password)) = authorization.and_then(decode_basic) else {
            return Some(Verdict::Denied);
        };
        self.cached(&(user, Sha256::digest(password.as_bytes()).into()))
    }

    fn cached(&self, key: &Key) -> Option<Verdict> {
        let cache = lock(&self.verdicts.cache);
        if cache.right.contains(key) {
            Some(Verdict::Allowed)
        } else if cache.wrong.contains(key) {
            Some(Verdict::Denied)
        } else {
            None
        }
    }

    /// The verdict on an `Authorization` header value sent by `client`.
    pub async fn check(&self, authorization: Option<&[u8]>, client: IpAddr) -> Verdict {
        let Some((user, password)) = authorization.and_then(decode_basic) else {
            return Verdict::Denied;
        };
        let key: Key = (user, Sha256::digest(password.as_bytes()).into());
        loop {
            if let Some(v) = self.cached(&key) {
                return v;
            }
            // The same credentials are being checked: wait for that verdict. If that check is
            // given up before it starts, look again.
            let pending = lock(&self.verdicts.in_flight).get(&key).cloned();
            if let Some(mut rx) = pending {
                if let Ok(v) = rx.wait_for(Option::is_some).await {
                    return if v.unwrap_or(false) {
                        Verdict::Allowed
                    } else {
                        Verdict::Denied
                    };
                }
                continue;
            }
            if let Some(v) = self.fresh(key.clone(), password.clone(), client).await {
                return v;
            }
        }
    }

    /// Runs bcrypt for credentials seen neither in the caches nor in progress; `None` when
    /// another request started checking the same ones meanwhile (wait for that one).
    async fn fresh(&self, key: Key, password: String, client: IpAddr) -> Option<Verdict> {
        if self.users.is_empty() {
            return Some(Verdict::Denied);
        }
        // Unknown users are checked against a real hash (and always fail), so that the time
        // taken does not tell which user names exist.
        let (hash, known) = match self.users.get(&key.0) {
            Some(h) => (h.clone(), true),
            None => (self.decoy.clone(), false),
        };
        if !self.budgets.failures.available(client) {
            return Some(Verdict::Throttled);
        }
        let (tx, rx) = watch::channel(None);
        let fresh = {
            let mut checking = lock(&self.verdicts.checking);
            let mut in_flight = lock(&self.verdicts.in_flight);
            if in_flight.contains_key(&key) {
                return None;
            }
            if !checking.insert(client) {
                return Some(Verdict::Throttled);
            }
            in_flight.insert(key.clone(), rx);
            Fresh {
                verdicts: Arc::clone(&self.verdicts),
                client,
                key,
            }
        };
        let Ok(permit) = Arc::clone(&self.budgets.permits).acquire_owned().await else {
            return Some(Verdict::Denied);
        };
        // From here the check runs to its end even if this request is given up: the permit,
        // the client's mark and the failure charge go with the worker, not with the request.
        let verdicts = Arc::clone(&self.verdicts);
        let budgets = Arc::clone(&self.budgets);
        let worker = tokio::task::spawn_blocking(move || {
            let verified = bcrypt::verify(password, &hash).unwrap_or(false);
            let right = known && verified;
            {
                let mut cache = lock(&verdicts.cache);
                let kept = if right {
                    &mut cache.right
                } else {
                    &mut cache.wrong
                };
                if kept.len() >= CACHE_CAPACITY {
                    kept.clear();
                }
                kept.insert(fresh.key.clone());
            }
            if !right {
                budgets.failures.spend(client);
            }
            tx.send_replace(Some(right));
            drop(fresh);
            drop(permit);
            right
        });
        Some(match worker.await {
            Ok(true) => Verdict::Allowed,
            _ => Verdict::Denied,
        })
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

/// Standard base64 with canonical padding (RFC 4648 §4), as browsers and Prometheus send it;
/// unused bits in the last character are accepted, as Go's `base64.StdEncoding` (net/http's
/// `BasicAuth`) accepts them. At most 8 KiB of text is decoded.
fn decode_base64(s: &str) -> Option<Vec<u8>> {
    use base64::engine::{general_purpose, GeneralPurpose};
    use base64::Engine as _;
    const GO_STD: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        general_purpose::PAD.with_decode_allow_trailing_bits(true),
    );
    if s.len() > 8192 {
        return None;
    }
    GO_STD.decode(s).ok()
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
        let cache = lock(&auth.verdicts.cache);
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
            lock(&auth.verdicts.cache).wrong.len(),
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
            lock(&auth.verdicts.cache).wrong.len() < CACHE_CAPACITY,
            "the failures were cleared"
        );
        // The scraper's verdict survived: answered from the cache.
        assert!(lock(&auth.verdicts.cache)
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
        let held = auth.budgets.permits.acquire_many(2).await.unwrap();
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

    #[tokio::test]
    async fn simultaneous_logins_with_the_same_credentials_share_one_check() {
        let auth = prom();
        let right = header("prom", "s3cret");
        let scraper = client(1);
        // Hold both permits so the first login's check waits with its client marked.
        let held = auth.budgets.permits.acquire_many(2).await.unwrap();
        let mut first = std::pin::pin!(auth.check(Some(right.as_bytes()), scraper));
        assert!(futures_poll(first.as_mut()).is_none());
        // A second connection of the same scraper logs in at the same moment: it waits for
        // the first check's verdict rather than being told 429.
        let mut second = std::pin::pin!(auth.check(Some(right.as_bytes()), scraper));
        assert!(
            futures_poll(second.as_mut()).is_none(),
            "the second login was not kept waiting"
        );
        drop(held);
        assert_eq!(first.await, Verdict::Allowed);
        assert_eq!(second.await, Verdict::Allowed);
        assert_eq!(lock(&auth.verdicts.cache).right.len(), 1);
    }

    /// Polls `cond` until it holds, for at most ten seconds.
    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting: {what}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    #[tokio::test]
    async fn a_check_whose_request_is_given_up_keeps_its_permit_and_is_charged() {
        // Cost 12: the check takes a few hundred milliseconds, far longer than what happens
        // between starting it and giving it up below.
        let hash = bcrypt::hash("s3cret", 12).unwrap();
        let auth = BasicAuth::new(BTreeMap::from([("prom".to_owned(), hash)]));
        let attacker = client(2);
        let guess = header("prom", "guess");
        {
            let mut check = std::pin::pin!(auth.check(Some(guess.as_bytes()), attacker));
            assert!(futures_poll(check.as_mut()).is_none());
            assert_eq!(auth.budgets.permits.available_permits(), 1);
            // The request is given up (the request timeout, a closed connection).
        }
        // bcrypt still runs: its permit is still taken and the client still has a check in
        // progress, so the bound of two parallel runs and one per client holds.
        assert_eq!(auth.budgets.permits.available_permits(), 1);
        let other = header("prom", "other");
        assert_eq!(
            auth.check(Some(other.as_bytes()), attacker).await,
            Verdict::Throttled
        );
        until("the given-up check to finish", || {
            auth.budgets.permits.available_permits() == MAX_CONCURRENT_VERIFICATIONS
        })
        .await;
        // It was charged to the client's failures and its verdict cached.
        let left = auth.budgets.failures.with_bucket(attacker, |t| *t);
        assert!(
            (left - f64::from(FAILURE_BURST - 1)).abs() < 0.01,
            "failures left {left}"
        );
        assert_eq!(
            auth.check(Some(guess.as_bytes()), attacker).await,
            Verdict::Denied
        );
    }

    #[test]
    fn unknown_users_are_checked_against_the_costliest_hash() {
        let cheap = bcrypt::hash("a", 4).unwrap();
        let dear = bcrypt::hash("b", 6).unwrap();
        let auth = BasicAuth::new(BTreeMap::from([
            ("a-cheap".to_owned(), cheap),
            ("b-dear".to_owned(), dear.clone()),
        ]));
        assert_eq!(auth.decoy, dear);
        assert_eq!(auth.costs(), vec![4, 6]);
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

    #[test]
    fn base64_acceptance_is_go_std_encoding() {
        // Unused bits set in the last character: Go's StdEncoding accepts them, so do we.
        assert_eq!(
            decode_basic(b"Basic YTp="),
            Some(("a".into(), String::new()))
        );
        // Padding is required, and nothing may stand inside the text.
        assert_eq!(decode_basic(b"Basic YTo"), None);
        assert_eq!(decode_basic(b"Basic YT o="), None);
        assert_eq!(
            decode_basic(b"Basic YTo=\n"),
            Some(("a".into(), String::new()))
        );
        // At most 8 KiB of base64 is decoded.
        let long = format!(
            "Basic {}",
            encode(format!("a:{}", "b".repeat(6200)).as_bytes())
        );
        assert!(long.len() > 8192 + 6);
        assert_eq!(decode_basic(long.as_bytes()), None);
        let fits = format!(
            "Basic {}",
            encode(format!("a:{}", "b".repeat(6000)).as_bytes())
        );
        assert!(decode_basic(fits.as_bytes()).is_some());
    }

    fn encode(b: &[u8]) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(b)
    }
}
