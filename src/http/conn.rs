//! Connection bookkeeping: what phase each connection is in, when it must move on, and which
//! one gives way when the server is full.
//!
//! A connection goes through these phases, each with its own deadline ([`Limits`]):
//!
//! | Phase | Until | Deadline (from the phase's start) |
//! |---|---|---|
//! | `Handshake` | the TLS handshake completes | `handshake_timeout` |
//! | `FirstByte` | the first byte of a request arrives | `first_byte_timeout` |
//! | `Head` | the request head is complete | `header_read_timeout` |
//! | `Serving` | the response is written out | `write_timeout` |
//! | `Idle` | the next request's first byte (keep-alive) | `idle_timeout` |
//!
//! A connection whose deadline passes is closed, and the reason counted.
//!
//! The [`Registry`] admits every new connection and keeps two budgets: `max_connections` open
//! at all (a connection that has sent nothing costs about 2 KiB: no hyper buffers, no TLS
//! state are allocated before its first byte), and `max_active_connections` past their first
//! byte (those hold buffers: tens of KiB each). At either limit it evicts a connection rather
//! than refuse the newcomer, as long as one may be evicted. The victim comes from the client
//! address holding the most connections, and from that address's connections in this order:
//! the oldest that has sent nothing, the oldest still opening (TLS handshake or first request
//! head), the one idle the longest, the oldest answering one request for longer than
//! `busy_evictable_after` (a stalled reader). A scraper with its own address and one keep-alive
//! connection is therefore never the victim of a flood from another address.
//!
//! Layered, each file importing only from below: `state` (a connection's own state: its phase,
//! the decisions made for it, each phase's deadline), `registry` (admission and eviction over
//! those states; it never names a connection), and this file, the connection ([`Conn`]) built on
//! both, with [`Registry::admit`] and the [`Admitted`] guard. `handshake` ([`HandshakeIo`]) stands
//! alone.

mod handshake;
mod registry;
mod state;

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use tokio::sync::Semaphore;
use tokio::time::Instant;

pub use handshake::HandshakeIo;
pub use registry::{Registry, MAX_HANDSHAKES_PER_CLIENT, MAX_PENDING_EVICTIONS};
use state::{lock_state, PollClock, State};
pub use state::{Decision, Phase, PhaseTimeouts};

use super::limits::Limits;
pub use super::limits::{
    check_max_connections, connections_for_fd_limit, fd_limit, raise_fd_limit, raise_fd_limit_for,
    DEFAULT_MAX_ACTIVE_CONNECTIONS, MAX_CONNECTIONS_CEILING, RESERVED_FDS,
};
use super::metrics::CloseReason;

/// One open connection, shared by its I/O wrapper, its service and its watchdog.
#[derive(Debug)]
pub struct Conn {
    id: u64,
    registry: Arc<Registry>,
    /// Shared with the registry's entry, which reads it to pick a victim and writes its
    /// decisions (evicted, stop) into it.
    state: Arc<Mutex<State>>,
    /// The client's TLS handshake slots.
    handshakes: Arc<Semaphore>,
    /// The response body has been handed to hyper, and the connection has not yet been found
    /// quiet since (see [`Conn::quiet`]). Outside the state's lock: hyper waits for input many
    /// times between requests, and each wait reads this flag alone.
    body_done: AtomicBool,
    /// The time for phase changes within one poll of the connection's task.
    clock: PollClock,
}

impl Conn {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock_state(&self.state)
    }

    /// A number that tells this connection from those opened just before and after it (to
    /// spread per-connection work over shared counters).
    pub fn shard(&self) -> usize {
        // Only the low bits matter to the modulo taken by the user.
        self.id as usize
    }

    /// Polls `f` as the connection's task: the phase changes made within one poll share one
    /// reading of the clock (see `PollClock`).
    pub fn poll_timed<F: std::future::Future>(
        &self,
        f: std::pin::Pin<&mut F>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<F::Output> {
        self.clock.begin();
        let r = f.poll(cx);
        self.clock.end();
        r
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.lock().phase
    }

    /// The first byte arrived (before hyper or TLS allocate anything): see
    /// [`Registry::activate`].
    pub fn activate(&self) -> bool {
        self.registry.activate(self.id)
    }

    /// Wraps a TLS connection's socket for its handshake: see [`HandshakeIo`].
    pub fn handshake_io(&self, stream: tokio::net::TcpStream) -> HandshakeIo {
        HandshakeIo::new(stream, Arc::clone(&self.handshakes))
    }

    /// The TLS handshake finished: the request's first byte is due next.
    pub fn handshake_done(&self) {
        let mut s = self.lock();
        if s.phase == Phase::Handshake {
            s.enter(Phase::FirstByte, self.clock.now());
        }
    }

    /// Bytes arrived.
    pub(super) fn read_some(&self) {
        let mut s = self.lock();
        match s.phase {
            Phase::FirstByte | Phase::Idle => {
                s.enter(Phase::Head, self.clock.now());
            }
            Phase::Serving => s.read_while_serving = true,
            Phase::Handshake | Phase::Head => {}
        }
    }

    /// A complete request head was read and is being answered. Only a connection's first
    /// request is reported to the registry; later ones change this connection's state alone.
    pub fn request_started(&self) {
        self.body_done.store(false, Ordering::Relaxed);
        let mut s = self.lock();
        s.read_while_serving = false;
        s.busy = true;
        s.busy_or_idle_since = s.enter(Phase::Serving, self.clock.now());
        let first = !std::mem::replace(&mut s.filed_active, true);
        drop(s);
        if first {
            self.registry.file_active(self.id);
        }
    }

    /// hyper has taken the whole response body.
    pub fn body_done(&self) {
        self.body_done.store(true, Ordering::Relaxed);
    }

    /// hyper flushed its output or waits for input: if the response is complete, the
    /// connection is between requests.
    pub(super) fn quiet(&self) {
        // The connection's own task calls this and the two above: no ordering to keep.
        if !self.body_done.load(Ordering::Relaxed) {
            return;
        }
        let mut s = self.lock();
        self.body_done.store(false, Ordering::Relaxed);
        if s.phase != Phase::Serving {
            return;
        }
        let next = if s.read_while_serving {
            Phase::Head
        } else {
            Phase::Idle
        };
        s.busy = false;
        s.busy_or_idle_since = s.enter(next, self.clock.now());
        // At stop, the watchdog closes the connection once its answer is out.
        let task = if s.stop { s.task.take() } else { None };
        drop(s);
        if let Some(t) = task {
            t.wake();
        }
    }

    /// Resolves when the connection must close, with the reason: its phase's deadline passed,
    /// it was evicted, or the server stops ([`CloseReason::Shutdown`]: at once, unless a request
    /// is being answered; then once the answer is out, as hyper's graceful shutdown does).
    ///
    /// It runs in a task of its own beside the connection's, and wakes only for its timer or a
    /// decision. Phase changes do not reset the timer: it fires at the current phase's
    /// deadline or after `PhaseTimeouts::cap`, whichever comes first, and is then set again.
    /// No phase that can follow has a shorter timeout than that cap, so no deadline passes
    /// unseen, and a keep-alive connection answering requests back to back never touches its
    /// timer.
    pub async fn watchdog(&self, limits: &Limits) -> CloseReason {
        let timeouts = PhaseTimeouts::from(limits);
        let timer = tokio::time::sleep_until(Instant::now());
        let mut timer = std::pin::pin!(timer);
        loop {
            // The clock first: a phase entered after this instant has a deadline past `wake`.
            let now = Instant::now();
            // Checked: a timeout can be longer than the clock can count (a Go duration may be
            // 292 years); such a deadline never comes.
            let (deadline, reason, cap) = {
                let s = self.lock();
                let (timeout, reason) = timeouts.of(s.phase);
                (s.since.checked_add(timeout), reason, timeouts.cap(s.phase))
            };
            if deadline.is_some_and(|d| now >= d) {
                return reason;
            }
            let Some(wake) = deadline.into_iter().chain(now.checked_add(cap)).min() else {
                return self.decision().await;
            };
            timer.as_mut().reset(wake);
            tokio::select! {
                biased;
                decision = self.decision() => return decision,
                () = timer.as_mut() => self.lock().watchdog_wakes += 1,
            }
        }
    }

    /// Resolves with the reason to close decided from outside: evicted, or the server stops
    /// and no request is being answered.
    fn decision(&self) -> impl std::future::Future<Output = CloseReason> + '_ {
        std::future::poll_fn(move |cx| {
            let mut s = self.lock();
            if let Some(reason) = s.close {
                return Poll::Ready(reason);
            }
            if s.stop && s.phase != Phase::Serving {
                return Poll::Ready(CloseReason::Shutdown);
            }
            if !s.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                s.task = Some(cx.waker().clone());
            }
            Poll::Pending
        })
    }
}

impl Registry {
    /// Registers a new connection from `peer`, evicting another one when the limit is reached.
    /// `None`: the limit is reached and every open connection is busy (counted as refused).
    pub fn admit(self: &Arc<Self>, peer: IpAddr, tls: bool) -> Option<Admitted> {
        let r = self.register(peer, tls)?;
        Some(Admitted {
            conn: Arc::new(Conn {
                id: r.id,
                registry: Arc::clone(self),
                state: r.state,
                handshakes: r.handshakes,
                body_done: AtomicBool::new(false),
                clock: PollClock::new(Instant::now()),
            }),
            reason: CloseReason::Closed,
        })
    }
}

/// Unregisters a connection when dropped, counting `reason`.
#[derive(Debug)]
pub struct Admitted {
    /// The connection.
    pub conn: Arc<Conn>,
    /// Why it closes; set before the guard is dropped.
    pub reason: CloseReason,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.conn.registry.remove(self.conn.id, self.reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::http::metrics::HttpMetrics;

    pub(super) fn registry(max: usize) -> (Arc<Registry>, Arc<HttpMetrics>) {
        let metrics = Arc::new(HttpMetrics::default());
        let limits = Limits {
            max_connections: max,
            ..Limits::default()
        };
        (Registry::new(&limits, Arc::clone(&metrics)), metrics)
    }

    pub(super) fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// Serves one request on `c`: first byte, head read, response taken and flushed.
    pub(super) fn serve_one(c: &Admitted) {
        assert!(c.conn.activate());
        c.conn.read_some();
        c.conn.request_started();
        c.conn.body_done();
        c.conn.quiet();
    }

    #[tokio::test(start_paused = true)]
    async fn each_phase_has_its_own_deadline() {
        let limits = Limits::default();
        let (reg, _) = registry(8);
        let t = reg.admit(ip(1), true).unwrap();
        let c = Arc::clone(&t.conn);
        let start = Instant::now();
        assert_eq!(c.watchdog(&limits).await, CloseReason::HandshakeTimeout);
        assert_eq!(start.elapsed(), limits.handshake_timeout);

        c.handshake_done();
        let start = Instant::now();
        assert_eq!(c.watchdog(&limits).await, CloseReason::FirstByteTimeout);
        assert_eq!(start.elapsed(), limits.first_byte_timeout);

        c.read_some();
        let start = Instant::now();
        assert_eq!(c.watchdog(&limits).await, CloseReason::HeaderTimeout);
        assert_eq!(start.elapsed(), limits.header_read_timeout);

        c.request_started();
        let start = Instant::now();
        assert_eq!(c.watchdog(&limits).await, CloseReason::WriteTimeout);
        assert_eq!(start.elapsed(), limits.write_timeout);

        c.body_done();
        c.quiet();
        let start = Instant::now();
        assert_eq!(c.watchdog(&limits).await, CloseReason::IdleTimeout);
        assert_eq!(start.elapsed(), limits.idle_timeout);
        assert!(limits.idle_timeout >= Duration::from_secs(120));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_longer_than_the_clock_can_count_never_passes() {
        // `--web-read-timeout 2562047h47m16s` (Go's longest) and beyond: the watchdog's
        // `since + timeout` overflowed `Instant` and panicked the connection's task.
        for timeout in [crate::godur::MAX, Duration::MAX] {
            let limits = Limits {
                header_read_timeout: timeout,
                write_timeout: timeout,
                ..Limits::default()
            };
            let (reg, _) = registry(8);
            let t = reg.admit(ip(1), false).unwrap();
            let c = Arc::clone(&t.conn);
            assert!(c.activate());
            c.read_some();
            let day = Duration::from_secs(86_400);
            assert!(tokio::time::timeout(day, c.watchdog(&limits))
                .await
                .is_err());
            c.request_started();
            assert!(tokio::time::timeout(day, c.watchdog(&limits))
                .await
                .is_err());
            // A decision still ends it.
            reg.stop_all();
            c.body_done();
            c.quiet();
            assert_eq!(c.watchdog(&limits).await, CloseReason::Shutdown);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_phase_change_moves_the_deadline_while_the_watchdog_waits() {
        let limits = Limits::default();
        let (reg, _) = registry(8);
        let t = reg.admit(ip(1), false).unwrap();
        serve_one(&t);
        let c = Arc::clone(&t.conn);
        let watch = tokio::spawn(async move {
            let start = Instant::now();
            (c.watchdog(&Limits::default()).await, start.elapsed())
        });
        // Idle for a minute, then one byte of a next request: the header deadline applies now.
        tokio::time::sleep(Duration::from_secs(60)).await;
        t.conn.read_some();
        let (reason, after) = watch.await.unwrap();
        assert_eq!(reason, CloseReason::HeaderTimeout);
        assert_eq!(after, Duration::from_secs(60) + limits.header_read_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_back_to_back_do_not_wake_the_watchdog_and_deadlines_still_hold() {
        let limits = Limits::default();
        let (reg, _) = registry(8);
        let t = reg.admit(ip(1), false).unwrap();
        let c = Arc::clone(&t.conn);
        let watch = tokio::spawn(async move {
            let start = Instant::now();
            (c.watchdog(&Limits::default()).await, start.elapsed())
        });
        tokio::task::yield_now().await;
        // A keep-alive scraper's requests, each moving the phase four times: none wakes it.
        for _ in 0..100 {
            serve_one(&t);
            tokio::task::yield_now().await;
        }
        assert_eq!(t.conn.lock().watchdog_wakes, 0);
        // Idle for 60 s: it looks again once per cap (the shortest timeout that can follow),
        // and a request head's first byte then still gets its exact deadline.
        let cap = PhaseTimeouts::from(&limits).cap(Phase::Idle);
        assert_eq!(cap, limits.header_read_timeout);
        tokio::time::sleep(Duration::from_secs(60)).await;
        t.conn.read_some();
        let (reason, after) = watch.await.unwrap();
        assert_eq!(reason, CloseReason::HeaderTimeout);
        assert_eq!(after, Duration::from_secs(60) + limits.header_read_timeout);
        let wakes = t.conn.lock().watchdog_wakes;
        // One per cap, and one at the first-byte deadline it slept towards at the start.
        let most =
            (Duration::from_secs(60) + limits.header_read_timeout).as_secs() / cap.as_secs() + 1;
        assert!(
            (1..=most).contains(&wakes),
            "{wakes} wake-ups, at most {most}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn at_stop_a_connection_closes_once_its_answer_is_out_and_its_deadline_still_holds() {
        let limits = Limits::default();
        let (reg, _) = registry(8);
        // Between requests: at once.
        let idle = reg.admit(ip(1), false).unwrap();
        serve_one(&idle);
        // Before its first byte: at once.
        let fresh = reg.admit(ip(1), false).unwrap();
        // Answering a request: once the answer is flushed.
        let busy = reg.admit(ip(1), false).unwrap();
        assert!(busy.conn.activate());
        busy.conn.read_some();
        busy.conn.request_started();
        let c = Arc::clone(&busy.conn);
        let watch = tokio::spawn(async move {
            let start = Instant::now();
            (c.watchdog(&Limits::default()).await, start.elapsed())
        });
        tokio::task::yield_now().await;
        reg.stop_all();
        assert_eq!(idle.conn.watchdog(&limits).await, CloseReason::Shutdown);
        assert_eq!(fresh.conn.watchdog(&limits).await, CloseReason::Shutdown);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!watch.is_finished());
        busy.conn.body_done();
        busy.conn.quiet();
        let (reason, after) = watch.await.unwrap();
        assert_eq!(reason, CloseReason::Shutdown);
        assert_eq!(after, Duration::from_secs(1));
        // One whose answer never gets out still meets its write deadline.
        let stuck = reg.admit(ip(1), false).unwrap();
        assert!(stuck.conn.activate());
        stuck.conn.read_some();
        stuck.conn.request_started();
        let start = Instant::now();
        reg.stop_all();
        assert_eq!(
            stuck.conn.watchdog(&limits).await,
            CloseReason::WriteTimeout
        );
        assert_eq!(start.elapsed(), limits.write_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn an_evicted_connections_watchdog_fires_at_once() {
        let (reg, _) = registry(1);
        let a = reg.admit(ip(2), false).unwrap();
        let c = Arc::clone(&a.conn);
        let watch = tokio::spawn(async move { c.watchdog(&Limits::default()).await });
        tokio::task::yield_now().await;
        let _b = reg.admit(ip(3), false).unwrap();
        assert_eq!(watch.await.unwrap(), CloseReason::Evicted);
    }
}
