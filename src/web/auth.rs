//! HTTP basic authentication against bcrypt hashes (`basic_auth_users`), cheap under floods.
//!
//! bcrypt at cost 10 takes ~70 ms of CPU by design, so three rules bound what an attacker can
//! burn: verdicts are cached by (user, SHA-256 of the password), so Prometheus scraping with
//! the right password pays once; repeats of the same wrong password are served from the same
//! (bounded) cache; and fresh guesses go through a small semaphore, so at most
//! [`MAX_CONCURRENT_VERIFICATIONS`] bcrypt runs happen at once whatever the request rate.
//! Unknown users are checked against a real hash too, so timing does not reveal user names.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

/// bcrypt runs allowed in parallel.
pub const MAX_CONCURRENT_VERIFICATIONS: usize = 2;

/// Cached verdicts kept before the cache is cleared (a bound on memory, not on correctness).
const CACHE_CAPACITY: usize = 1024;

/// The configured users and the verdict cache.
#[derive(Debug)]
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    cache: Mutex<HashMap<(String, [u8; 32]), bool>>,
    permits: Semaphore,
}

impl BasicAuth {
    /// `users`: user name → bcrypt hash (already validated by the config parser).
    pub fn new(users: BTreeMap<String, String>) -> Self {
        Self {
            users,
            cache: Mutex::new(HashMap::new()),
            permits: Semaphore::new(MAX_CONCURRENT_VERIFICATIONS),
        }
    }

    /// Whether an `Authorization` header value grants access.
    pub async fn allows(&self, authorization: Option<&[u8]>) -> bool {
        let Some((user, password)) = authorization.and_then(decode_basic) else {
            return false;
        };
        let key = (user, Sha256::digest(password.as_bytes()).into());
        if let Some(&verdict) = self.lock().get(&key) {
            return verdict;
        }
        // Unknown users are checked against some real hash (and always fail), so that the time
        // taken does not tell which user names exist.
        let (hash, known) = match self.users.get(&key.0) {
            Some(h) => (h.clone(), true),
            None => match self.users.values().next() {
                Some(h) => (h.clone(), false),
                None => return false,
            },
        };
        let Ok(_permit) = self.permits.acquire().await else {
            return false;
        };
        let verified = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(false);
        let verdict = known && verified;
        let mut cache = self.lock();
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(key, verdict);
        verdict
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, [u8; 32]), bool>> {
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

    #[tokio::test]
    async fn right_password_passes_and_wrong_ones_fail_including_unknown_users() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let auth = BasicAuth::new(BTreeMap::from([("prom".to_owned(), hash)]));
        let header = |u: &str, p: &str| {
            let raw = format!("{u}:{p}");
            format!("Basic {}", encode(raw.as_bytes()))
        };
        assert!(auth.allows(Some(header("prom", "s3cret").as_bytes())).await);
        // Second time from the cache: same verdict.
        assert!(auth.allows(Some(header("prom", "s3cret").as_bytes())).await);
        assert!(
            !auth
                .allows(Some(header("prom", "s3cret ").as_bytes()))
                .await
        );
        assert!(!auth.allows(Some(header("eve", "s3cret").as_bytes())).await);
        assert!(!auth.allows(None).await);
        assert_eq!(auth.lock().len(), 3);
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
