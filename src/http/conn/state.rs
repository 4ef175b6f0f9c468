//! A connection's own state, shared by the connection (which moves it through its phases) and
//! the [`Registry`](super::Registry) (which reads it to pick a victim and writes its decisions
//! into it): the phase and since when, what was decided from outside, and each phase's deadline.
//! The bottom layer of `http::conn`: it names neither the connection nor the registry.

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
    /// The response body has been handed to hyper (`Serving` only).
    pub(super) body_done: bool,
    /// Bytes of a next request arrived while serving (pipelining or a slow trickle).
    pub(super) read_while_serving: bool,
    /// Decided from outside (see [`Conn::watch`](super::Conn::watch)): close (evicted), or shut
    /// down gracefully.
    pub(super) close: Option<CloseReason>,
    pub(super) stop: bool,
    /// The connection's task, woken when one of those is decided.
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
            body_done: false,
            read_while_serving: false,
            close: None,
            stop: false,
            task: None,
        }
    }

    /// Moves to `phase` now; returns the instant. The watchdog is not told: it never sleeps
    /// past the earliest deadline a phase change could bring (see [`PhaseTimeouts::cap`]).
    pub(super) fn enter(&mut self, phase: Phase) -> Instant {
        self.phase = phase;
        self.since = Instant::now();
        self.since
    }
}

/// What a connection must do ([`Conn::watch`](super::Conn::watch)).
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
