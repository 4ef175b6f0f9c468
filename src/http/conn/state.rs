//! A connection's own state, shared by the connection (which moves it through its phases) and
//! the [`Registry`](super::Registry) (which reads it to pick a victim and writes its decisions
//! into it): the phase and since when, what was decided from outside, and each phase's deadline.
//! The bottom layer of `http::conn`: it names neither the connection nor the registry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::http::limits::Limits;
use crate::http::metrics::CloseReason;

/// Where a connection is in its life (see [`http::conn`](super)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// TLS handshake in progress.
    Handshake,
    /// Waiting for the first byte of the first request.
    FirstByte,
    /// Reading a request head.
    Head,
    /// A request is being answered.
    Serving,
    /// Keep-alive, between requests.
    Idle,
}

/// A connection's own state. The request path changes it without the registry's lock (a
/// keep-alive scraper's requests touch nothing shared); the registry reads it when it picks a
/// victim.
#[derive(Debug)]
pub(super) struct State {
    pub(super) phase: Phase,
    pub(super) since: Instant,
    /// Answering a request (from its head to its response flushed); between requests otherwise.
    pub(super) busy: bool,
    /// When the connection last became busy or idle: the order in which idle ones give way.
    pub(super) busy_or_idle_since: Instant,
    /// Filed with the registry as past its first request (done once, at that request).
    pub(super) filed_active: bool,
    /// Times the watch's timer fired (it is set for at most [`PhaseTimeouts::cap`], so that no
    /// phase change has to reset it).
    pub(super) watchdog_wakes: u64,
    /// Bytes of a next request arrived while serving (pipelining or a slow trickle).
    pub(super) read_while_serving: bool,
    /// Decided from outside (see [`Conn::watchdog`](super::Conn::watchdog)): close (evicted),
    /// or shut down gracefully (kept: it closes the connection once no request is answered).
    pub(super) close: Option<CloseReason>,
    pub(super) stop: bool,
    /// The watchdog's task, woken when one of those is decided (and, at stop, when an answer
    /// is out).
    pub(super) task: Option<std::task::Waker>,
}

impl State {
    /// A new connection's state: in `phase` (the TLS handshake or waiting for the first byte)
    /// since `now`, nothing decided.
    pub(super) fn new(phase: Phase, now: Instant) -> Self {
        Self {
            phase,
            since: now,
            busy: false,
            busy_or_idle_since: now,
            filed_active: false,
            watchdog_wakes: 0,
            read_while_serving: false,
            close: None,
            stop: false,
            task: None,
        }
    }

    /// Moves to `phase` at `now`; returns it. The watchdog is not told: it never sleeps past
    /// the earliest deadline a phase change could bring (see [`PhaseTimeouts::cap`]).
    pub(super) fn enter(&mut self, phase: Phase, now: Instant) -> Instant {
        self.phase = phase;
        self.since = now;
        now
    }
}

/// What is decided for a connection from outside ([`Conn::watchdog`](super::Conn::watchdog)
/// acts on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The server is shutting down: finish the request in flight, then close.
    Stop,
    /// Close now, for this reason.
    Close(CloseReason),
}

/// Locks a connection's state (a panic while it was held leaves it usable).
pub(super) fn lock_state(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Tells a connection (through its state) what it must do, and wakes its task.
pub(super) fn decide(state: &Mutex<State>, decision: Decision) {
    let mut s = lock_state(state);
    match decision {
        Decision::Stop => s.stop = true,
        Decision::Close(reason) => {
            s.close.get_or_insert(reason);
        }
    }
    let task = s.task.take();
    drop(s);
    if let Some(t) = task {
        t.wake();
    }
}

/// The deadline of each phase (from [`Limits`]) and the reason counted when it passes.
#[derive(Debug, Clone, Copy)]
pub struct PhaseTimeouts {
    handshake: Duration,
    first_byte: Duration,
    head: Duration,
    serving: Duration,
    idle: Duration,
}

impl From<&Limits> for PhaseTimeouts {
    fn from(l: &Limits) -> Self {
        Self {
            handshake: l.handshake_timeout,
            first_byte: l.first_byte_timeout,
            head: l.header_read_timeout,
            serving: l.write_timeout,
            idle: l.idle_timeout,
        }
    }
}

impl PhaseTimeouts {
    /// The longest the watchdog sleeps in `phase` before looking again: the shortest timeout
    /// of the phases that can follow it. A phase entered after the watchdog went to sleep thus
    /// has its deadline no earlier than the wake-up.
    pub(super) fn cap(&self, phase: Phase) -> Duration {
        let after_first_byte = self.head.min(self.serving).min(self.idle);
        match phase {
            Phase::Handshake => after_first_byte.min(self.first_byte),
            Phase::FirstByte | Phase::Head | Phase::Serving | Phase::Idle => after_first_byte,
        }
    }

    /// The deadline of `phase` and the reason counted when it passes.
    pub(super) fn of(&self, phase: Phase) -> (Duration, CloseReason) {
        match phase {
            Phase::Handshake => (self.handshake, CloseReason::HandshakeTimeout),
            Phase::FirstByte => (self.first_byte, CloseReason::FirstByteTimeout),
            Phase::Head => (self.head, CloseReason::HeaderTimeout),
            Phase::Serving => (self.serving, CloseReason::WriteTimeout),
            Phase::Idle => (self.idle, CloseReason::IdleTimeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_changes_of_one_poll_share_one_reading_and_others_read_the_clock() {
        let clock = PollClock::new(Instant::now());
        let step = Duration::from_millis(1500);
        // Outside a poll: the clock itself.
        let a = clock.now();
        tokio::time::advance(step).await;
        assert_eq!(clock.now(), a + step);
        // In a poll: the first reading, however late the later changes come.
        tokio::time::advance(step).await;
        clock.begin();
        let first = clock.now();
        assert_eq!(first, a + 2 * step);
        tokio::time::advance(step).await;
        assert_eq!(clock.now(), first);
        clock.end();
        // The next poll reads again.
        clock.begin();
        assert_eq!(clock.now(), a + 3 * step);
        clock.end();
        assert_eq!(clock.now(), a + 3 * step);
    }

    #[test]
    fn no_phase_that_can_follow_has_a_deadline_before_the_watchdogs_wake_up() {
        let limits = Limits {
            handshake_timeout: Duration::from_secs(7),
            first_byte_timeout: Duration::from_secs(1),
            header_read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(3),
            idle_timeout: Duration::from_secs(9),
            ..Limits::default()
        };
        let t = PhaseTimeouts::from(&limits);
        // Which phase may follow which (Conn::handshake_done, read_some, request_started,
        // quiet), and the closure of that relation.
        let next = |p: Phase| match p {
            Phase::Handshake => vec![Phase::FirstByte],
            Phase::FirstByte => vec![Phase::Head],
            Phase::Head => vec![Phase::Serving],
            Phase::Serving => vec![Phase::Idle, Phase::Head],
            Phase::Idle => vec![Phase::Head],
        };
        let all = [
            Phase::Handshake,
            Phase::FirstByte,
            Phase::Head,
            Phase::Serving,
            Phase::Idle,
        ];
        for p in all {
            let mut seen = Vec::new();
            let mut todo = next(p);
            while let Some(q) = todo.pop() {
                if !seen.contains(&q) {
                    seen.push(q);
                    todo.extend(next(q));
                }
            }
            let shortest = seen.iter().map(|&q| t.of(q).0).min().unwrap();
            assert_eq!(t.cap(p), shortest, "{p:?}");
        }
    }
}

/// The time of the phase changes made in one poll of the connection's task: the clock is read
/// at the first change of a poll and that reading serves the others. (A request arriving whole
/// changes the phase three times in one poll, and a clock read costs about as much as the rest
/// of a change; the readings of one poll lie microseconds apart.) Outside a poll (the opening
/// stage, tests) each change reads the clock.
#[derive(Debug)]
pub(super) struct PollClock {
    base: Instant,
    /// [`Self::IDLE`] outside a poll, [`Self::UNREAD`] in one before its first reading, else
    /// the reading as nanoseconds after `base`, plus one. Only the connection's task writes it.
    at: AtomicU64,
}

impl PollClock {
    const IDLE: u64 = u64::MAX;
    const UNREAD: u64 = 0;

    pub(super) fn new(base: Instant) -> Self {
        Self {
            base,
            at: AtomicU64::new(Self::IDLE),
        }
    }

    /// A poll of the connection's task begins.
    pub(super) fn begin(&self) {
        self.at.store(Self::UNREAD, Ordering::Relaxed);
    }

    /// The poll ended.
    pub(super) fn end(&self) {
        self.at.store(Self::IDLE, Ordering::Relaxed);
    }

    /// Now, as this poll reads it.
    pub(super) fn now(&self) -> Instant {
        match self.at.load(Ordering::Relaxed) {
            Self::IDLE => Instant::now(),
            Self::UNREAD => {
                let now = Instant::now();
                let nanos = u64::try_from(now.saturating_duration_since(self.base).as_nanos())
                    .unwrap_or(Self::IDLE - 2);
                self.at.store(nanos + 1, Ordering::Relaxed);
                now
            }
            at => self.base + Duration::from_nanos(at - 1),
        }
    }
}
