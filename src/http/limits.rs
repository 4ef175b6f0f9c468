//! What one server may hold: the connection and request [`Limits`], and the file descriptor
//! budget the connection limit is derived from and checked against (`RLIMIT_NOFILE`).

use std::io;
use std::time::Duration;

/// Connection and request limits. Each one is meant to bound what a hostile client can hold
/// without ever turning a flood into a denial of service for the scraper: a new connection is
/// always admitted (something else gives way), and every phase of a connection has its own
/// deadline. docs/security.md has the rationale and the measured figures.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time from accepting a TLS connection to the end of its handshake.
    pub handshake_timeout: Duration,
    /// Time from accepting a connection (or from its TLS handshake) to the first byte of its
    /// first request.
    pub first_byte_timeout: Duration,
    /// Time from a request's first byte to the end of its head (slowloris).
    pub header_read_timeout: Duration,
    /// Time a handler may take to produce a response; 503 after it.
    pub request_timeout: Duration,
    /// Time from a request head to the last byte of its response handed to the kernel (slow
    /// readers); the connection is closed after it.
    pub write_timeout: Duration,
    /// Time a keep-alive connection may wait between requests. Longer than any scrape interval
    /// in use (Prometheus keeps idle connections up to 5 minutes).
    pub idle_timeout: Duration,
    /// A connection answering one request for longer than this may be evicted at the limit.
    pub busy_evictable_after: Duration,
    /// Largest request head accepted; larger ones get 431. hyper's floor is 8192.
    pub max_header_bytes: usize,
    /// Connections open at once. At the limit a new connection evicts another one (see
    /// [`super::conn`]); it is refused only when every open connection is busy answering a request.
    /// Default: [`connections_for_fd_limit`] of the process's descriptor limit.
    pub max_connections: usize,
    /// Connections past their first byte (holding buffers) at once; the bound on memory. At
    /// the limit a connection whose first byte arrives evicts another active one.
    pub max_active_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(3),
            first_byte_timeout: Duration::from_secs(2),
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(330),
            busy_evictable_after: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            max_connections: connections_for_fd_limit(fd_limit()),
            max_active_connections: DEFAULT_MAX_ACTIVE_CONNECTIONS,
        }
    }
}

/// The flags that shape [`Limits`] (dcgm-exporter's Go server timeouts and our connection
/// limits).
#[derive(Debug, Clone, Copy, Default)]
pub struct LimitFlags {
    /// `--http-max-connections` (0: derived from the descriptor limit).
    pub max_connections: usize,
    /// `--http-max-active-connections`.
    pub max_active_connections: u64,
    /// `--web-read-timeout`: bounds reading a request head.
    pub read_timeout: Option<Duration>,
    /// `--web-write-timeout`: bounds the time from a request head to the end of its response.
    pub write_timeout: Option<Duration>,
}

/// Limits the flags ask for that cannot be held.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    /// More connections than the descriptor limit allows.
    #[error("--http-max-connections: {0}")]
    MaxConnections(String),
}

impl LimitFlags {
    /// The connections to raise the descriptor limit for: the explicit limit, or the default
    /// ceiling.
    pub fn wanted_connections(&self) -> usize {
        if self.max_connections > 0 {
            self.max_connections
        } else {
            MAX_CONNECTIONS_CEILING
        }
    }
}

impl Limits {
    /// The defaults, with the flags applied, under the soft descriptor limit `soft` (`None`:
    /// unlimited): an explicit connection limit is checked against it, an absent one derived
    /// from it. dcgm-exporter's Go server timeouts map onto the per-phase deadlines:
    /// ReadTimeout bounds reading the request (our request-head deadline), WriteTimeout the
    /// time from the request head to the end of the response (ours exactly); a handler gets
    /// at most that long too.
    ///
    /// # Errors
    /// An explicit connection limit the descriptor limit cannot hold.
    pub fn from_flags(flags: &LimitFlags, soft: Option<u64>) -> Result<Self, LimitsError> {
        let max_connections = if flags.max_connections > 0 {
            check_max_connections(flags.max_connections, soft)
                .map_err(LimitsError::MaxConnections)?;
            flags.max_connections
        } else {
            connections_for_fd_limit(soft)
        };
        let defaults = Limits::default();
        let write_timeout = flags.write_timeout.unwrap_or(defaults.write_timeout);
        Ok(Limits {
            header_read_timeout: flags.read_timeout.unwrap_or(defaults.header_read_timeout),
            request_timeout: defaults.request_timeout.min(write_timeout),
            write_timeout,
            max_connections,
            max_active_connections: usize::try_from(flags.max_active_connections)
                .unwrap_or(usize::MAX)
                .min(max_connections),
            ..defaults
        })
    }
}

/// File descriptors kept back from connections for everything else (listener, NVML device
/// files, the kubelet socket, the CSV and certificate files, the runtime).
pub const RESERVED_FDS: u64 = 128;

/// The most connections admitted by default, whatever the descriptor limit: a bound on memory
/// (see docs/security.md for the measured cost per connection).
pub const MAX_CONNECTIONS_CEILING: usize = 4096;

/// The default `max_active_connections`: with the measured cost of an active connection (up to
/// ~45 KiB with TLS, docs/security.md) about 23 MiB at most, inside the DaemonSet's 64 MiB
/// limit; far above what scrapers need (one connection each).
pub const DEFAULT_MAX_ACTIVE_CONNECTIONS: usize = 512;

/// The default `max_connections` for a soft `RLIMIT_NOFILE` of `soft` (`None`: unlimited):
/// the limit less [`RESERVED_FDS`], at most [`MAX_CONNECTIONS_CEILING`], at least 64.
pub fn connections_for_fd_limit(soft: Option<u64>) -> usize {
    let usable = soft.map_or(u64::MAX, |s| s.saturating_sub(RESERVED_FDS));
    usize::try_from(usable)
        .unwrap_or(usize::MAX)
        .clamp(64, MAX_CONNECTIONS_CEILING)
}

/// The soft `RLIMIT_NOFILE` (`None`: unlimited).
pub fn fd_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Checks an explicit connection limit against the soft `RLIMIT_NOFILE` (`None`: unlimited):
/// each connection is a descriptor, and [`RESERVED_FDS`] are kept for everything else. Past
/// the limit the server would spin on `EMFILE` instead of evicting; the error says what to
/// change.
///
/// # Errors
/// A message naming the flag, the descriptors needed and the limit.
pub fn check_max_connections(requested: usize, soft: Option<u64>) -> Result<(), String> {
    let Some(soft) = soft else {
        return Ok(());
    };
    let need = (requested as u64).saturating_add(RESERVED_FDS);
    if need <= soft {
        return Ok(());
    }
    Err(format!(
        "{requested} connections need {need} file descriptors ({RESERVED_FDS} kept for the rest of the exporter) but the limit (RLIMIT_NOFILE) is {soft}: raise the limit (ulimit -n, or the container runtime's nofile limit) or set --http-max-connections to at most {} (0 picks that)",
        soft.saturating_sub(RESERVED_FDS)
    ))
}

/// Raises the soft `RLIMIT_NOFILE` towards the hard one, as far as the default connection
/// ceiling needs (Go programs such as dcgm-exporter raise it all the way at startup). Returns
/// the soft limit before and after.
///
/// # Errors
/// The `setrlimit` error.
pub fn raise_fd_limit() -> io::Result<(Option<u64>, Option<u64>)> {
    raise_fd_limit_for(MAX_CONNECTIONS_CEILING)
}

/// [`raise_fd_limit`] for `connections` connections.
///
/// # Errors
/// The `setrlimit` error.
pub fn raise_fd_limit_for(connections: usize) -> io::Result<(Option<u64>, Option<u64>)> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    let want = (connections as u64).saturating_add(RESERVED_FDS);
    let target = now.maximum.map_or(want, |hard| hard.min(want));
    match now.current {
        Some(soft) if soft < target => {
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(target),
                    maximum: now.maximum,
                },
            )?;
            Ok((now.current, Some(target)))
        }
        _ => Ok((now.current, now.current)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_shape_the_limits_under_the_descriptor_limit() {
        let flags = LimitFlags {
            max_connections: 0,
            max_active_connections: 10_000,
            read_timeout: Some(Duration::from_secs(5)),
            write_timeout: Some(Duration::from_secs(20)),
        };
        let l = Limits::from_flags(&flags, Some(1024)).unwrap();
        assert_eq!(l.max_connections, 1024 - RESERVED_FDS as usize);
        // Never more active connections than connections.
        assert_eq!(l.max_active_connections, l.max_connections);
        assert_eq!(l.header_read_timeout, Duration::from_secs(5));
        assert_eq!(l.write_timeout, Duration::from_secs(20));
        // A handler never gets longer than the response may take.
        assert_eq!(l.request_timeout, Duration::from_secs(20));
        assert_eq!(flags.wanted_connections(), MAX_CONNECTIONS_CEILING);
    }

    #[test]
    fn an_explicit_connection_limit_past_the_descriptor_limit_is_refused_naming_the_flag() {
        let flags = LimitFlags {
            max_connections: 1000,
            ..LimitFlags::default()
        };
        let e = Limits::from_flags(&flags, Some(1024))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--http-max-connections: 1000 connections need 1128 file descriptors"),
            "{e}"
        );
        let l = Limits::from_flags(&flags, None).unwrap();
        assert_eq!(l.max_connections, 1000);
        assert_eq!(flags.wanted_connections(), 1000);
    }

    #[test]
    fn an_explicit_limit_past_the_descriptor_limit_is_refused_with_what_to_change() {
        assert_eq!(check_max_connections(896, Some(1024)), Ok(()));
        assert_eq!(check_max_connections(1_000_000, None), Ok(()));
        let e = check_max_connections(10_000, Some(1024)).unwrap_err();
        assert!(
            e.contains("10000 connections need 10128 file descriptors"),
            "{e}"
        );
        assert!(e.contains("RLIMIT_NOFILE) is 1024"), "{e}");
        assert!(e.contains("--http-max-connections to at most 896"), "{e}");
        assert!(check_max_connections(897, Some(1024)).is_err());
    }

    #[test]
    fn the_default_cap_follows_the_descriptor_limit() {
        assert_eq!(connections_for_fd_limit(Some(1024)), 1024 - 128);
        assert_eq!(connections_for_fd_limit(Some(100)), 64);
        assert_eq!(
            connections_for_fd_limit(Some(1 << 20)),
            MAX_CONNECTIONS_CEILING
        );
        assert_eq!(connections_for_fd_limit(None), MAX_CONNECTIONS_CEILING);
    }
}
