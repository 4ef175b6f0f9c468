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

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::PollSemaphore;

use super::limits::Limits;
pub use super::limits::{
    check_max_connections, connections_for_fd_limit, fd_limit, raise_fd_limit, raise_fd_limit_for,
    DEFAULT_MAX_ACTIVE_CONNECTIONS, MAX_CONNECTIONS_CEILING, RESERVED_FDS,
};
use super::metrics::{CloseReason, HttpMetrics};

/// Where a connection is in its life (see the module documentation).
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

/// A connection's own state. The request path changes it without the [`Registry`]'s lock (a
/// keep-alive scraper's requests touch nothing shared); the registry reads it when it picks a
/// victim.
#[derive(Debug)]
struct State {
    phase: Phase,
    since: Instant,
    /// Answering a request (from its head to its response flushed); between requests otherwise.
    busy: bool,
    /// When the connection last became busy or idle: the order in which idle ones give way.
    busy_or_idle_since: Instant,
    /// Filed with the registry as past its first request (done once, at that request).
    filed_active: bool,
    /// Times the watch's timer fired (it is set for at most [`PhaseTimeouts::cap`], so that no
    /// phase change has to reset it).
    watchdog_wakes: u64,
    /// The response body has been handed to hyper (`Serving` only).
    body_done: bool,
    /// Bytes of a next request arrived while serving (pipelining or a slow trickle).
    read_while_serving: bool,
    /// Decided from outside (see [`Conn::watch`]): close (evicted), or shut down gracefully.
    close: Option<CloseReason>,
    stop: bool,
    /// The connection's task, woken when one of those is decided.
    task: Option<std::task::Waker>,
}

/// What a connection must do ([`Conn::watch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The server is shutting down: finish the request in flight, then close.
    Stop,
    /// Close now, for this reason.
    Close(CloseReason),
}

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
}

fn lock_state(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Conn {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock_state(&self.state)
    }

    /// Moves to `phase` now; returns the instant. The watchdog is not told: it never sleeps
    /// past the earliest deadline a phase change could bring (see [`PhaseTimeouts::cap`]).
    fn enter(s: &mut State, phase: Phase) -> Instant {
        s.phase = phase;
        s.since = Instant::now();
        s.since
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
        HandshakeIo {
            inner: stream,
            slots: Some(PollSemaphore::new(Arc::clone(&self.handshakes))),
            slot: None,
        }
    }

    /// The TLS handshake finished: the request's first byte is due next.
    pub fn handshake_done(&self) {
        let mut s = self.lock();
        if s.phase == Phase::Handshake {
            Self::enter(&mut s, Phase::FirstByte);
        }
    }

    /// Bytes arrived.
    pub(super) fn read_some(&self) {
        let mut s = self.lock();
        match s.phase {
            Phase::FirstByte | Phase::Idle => {
                Self::enter(&mut s, Phase::Head);
            }
            Phase::Serving => s.read_while_serving = true,
            Phase::Handshake | Phase::Head => {}
        }
    }

    /// A complete request head was read and is being answered. Only a connection's first
    /// request is reported to the registry; later ones change this connection's state alone.
    pub fn request_started(&self) {
        let mut s = self.lock();
        s.body_done = false;
        s.read_while_serving = false;
        s.busy = true;
        s.busy_or_idle_since = Self::enter(&mut s, Phase::Serving);
        let first = !std::mem::replace(&mut s.filed_active, true);
        drop(s);
        if first {
            self.registry.file_active(self.id);
        }
    }

    /// hyper has taken the whole response body.
    pub fn body_done(&self) {
        self.lock().body_done = true;
    }

    /// hyper flushed its output or waits for input: if the response is complete, the
    /// connection is between requests.
    pub(super) fn quiet(&self) {
        let mut s = self.lock();
        if s.phase != Phase::Serving || !s.body_done {
            return;
        }
        let next = if s.read_while_serving {
            Phase::Head
        } else {
            Phase::Idle
        };
        s.busy = false;
        s.busy_or_idle_since = Self::enter(&mut s, next);
    }

    /// Resolves when the connection must close: its phase's deadline passed, it was evicted
    /// or the server stops ([`CloseReason::Shutdown`]).
    pub async fn watchdog(&self, limits: &Limits) -> CloseReason {
        match self.watch(limits).await {
            Decision::Close(reason) => reason,
            Decision::Stop => CloseReason::Shutdown,
        }
    }

    /// Resolves with what the connection must do: close (a phase's deadline passed, or it was
    /// evicted), or finish its request and close (the server stops: said once).
    ///
    /// Polled on each of the connection task's wake-ups (several per request), so it is cheap:
    /// one lock of this connection's own state and a look at one timer. Phase changes do not
    /// reset the timer: it fires at the current phase's deadline or after
    /// [`PhaseTimeouts::cap`], whichever comes first, and is then set again. No phase that can
    /// follow has a shorter timeout than that cap, so no deadline passes unseen, and a
    /// keep-alive connection answering requests back to back never touches its timer.
    pub async fn watch(&self, limits: &Limits) -> Decision {
        let timeouts = PhaseTimeouts::from(limits);
        let timer = tokio::time::sleep_until(Instant::now());
        let mut timer = std::pin::pin!(timer);
        loop {
            // The clock first: a phase entered after this instant has a deadline past `wake`.
            let now = Instant::now();
            let (deadline, reason, cap) = {
                let s = self.lock();
                let (timeout, reason) = timeouts.of(s.phase);
                (s.since + timeout, reason, timeouts.cap(s.phase))
            };
            if now >= deadline {
                return Decision::Close(reason);
            }
            timer.as_mut().reset(deadline.min(now + cap));
            tokio::select! {
                biased;
                decision = self.decision() => return decision,
                () = timer.as_mut() => self.lock().watchdog_wakes += 1,
            }
        }
    }

    /// Resolves with the next decision made for this connection from outside (evicted, or
    /// the server stops); [`Decision::Stop`] is given once.
    fn decision(&self) -> impl std::future::Future<Output = Decision> + '_ {
        std::future::poll_fn(move |cx| {
            let mut s = self.lock();
            if let Some(reason) = s.close {
                return Poll::Ready(Decision::Close(reason));
            }
            if std::mem::take(&mut s.stop) {
                return Poll::Ready(Decision::Stop);
            }
            if !s.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                s.task = Some(cx.waker().clone());
            }
            Poll::Pending
        })
    }
}

/// Tells a connection (through its state) what it must do, and wakes its task.
fn decide(state: &Mutex<State>, decision: Decision) {
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
    fn cap(&self, phase: Phase) -> Duration {
        let after_first_byte = self.head.min(self.serving).min(self.idle);
        match phase {
            Phase::Handshake => after_first_byte.min(self.first_byte),
            Phase::FirstByte | Phase::Head | Phase::Serving | Phase::Idle => after_first_byte,
        }
    }

    fn of(&self, phase: Phase) -> (Duration, CloseReason) {
        match phase {
            Phase::Handshake => (self.handshake, CloseReason::HandshakeTimeout),
            Phase::FirstByte => (self.first_byte, CloseReason::FirstByteTimeout),
            Phase::Head => (self.head, CloseReason::HeaderTimeout),
            Phase::Serving => (self.serving, CloseReason::WriteTimeout),
            Phase::Idle => (self.idle, CloseReason::IdleTimeout),
        }
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

/// For eviction: what a connection is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Has sent nothing yet (cheap: no buffers).
    Waiting,
    /// Has sent bytes, but not a complete first request head yet (TLS handshake or head).
    Opening,
    /// Has had a request answered, or is answering its first: idle or busy, as its own state
    /// says (read when a victim is picked, so requests do not update the registry).
    Proven,
    /// Told to close; counted against neither limit any more.
    Evicting,
}

impl Class {
    /// Past the first byte: holding buffers.
    fn active(self) -> bool {
        matches!(self, Class::Opening | Class::Proven)
    }
}

#[derive(Debug)]
struct Entry {
    peer: IpAddr,
    class: Class,
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct Peer {
    /// TLS handshakes this client may have in progress at once.
    handshakes: Arc<Semaphore>,
    open: usize,
    waiting: BTreeSet<u64>,
    opening: BTreeSet<u64>,
    proven: BTreeSet<u64>,
}

impl Default for Peer {
    fn default() -> Self {
        Self {
            handshakes: Arc::new(Semaphore::new(MAX_HANDSHAKES_PER_CLIENT)),
            open: 0,
            waiting: BTreeSet::new(),
            opening: BTreeSet::new(),
            proven: BTreeSet::new(),
        }
    }
}

/// TLS handshake steps one client address may have computing at once; the others wait
/// (within their handshake deadline). A slot is held only from the moment a client's bytes
/// have arrived until the server has processed them and waits for more ([`HandshakeIo`]), so
/// a client that sends half a ClientHello and stalls holds none: a flood of those from the
/// scraper's own address does not delay its handshake. A burst of complete handshakes from one
/// client (an attacker renewing its connections together) costs the CPU a few at a time, and
/// a scraper's handshake from another address does not queue behind the burst.
pub const MAX_HANDSHAKES_PER_CLIENT: usize = 4;

impl Peer {
    fn set(&mut self, class: Class) -> Option<&mut BTreeSet<u64>> {
        match class {
            Class::Waiting => Some(&mut self.waiting),
            Class::Opening => Some(&mut self.opening),
            Class::Proven => Some(&mut self.proven),
            Class::Evicting => None,
        }
    }

    fn forget(&mut self, id: u64, class: Class) {
        if let Some(set) = self.set(class) {
            set.remove(&id);
        }
    }

    fn file(&mut self, id: u64, class: Class) {
        if let Some(set) = self.set(class) {
            set.insert(id);
        }
    }

    /// This client's connection that gives way first: one that has sent nothing (the oldest),
    /// else one still opening (the oldest), else the one idle the longest, else one answering
    /// a request for at least `busy_after`. `active_only`: skip those that have sent nothing.
    /// Proven connections are looked at one by one (their state is their own): a cost paid at
    /// eviction, bounded by the client's active connections, instead of on every request.
    fn victim(
        &self,
        conns: &HashMap<u64, Entry>,
        active_only: bool,
        now: Instant,
        busy_after: Duration,
    ) -> Option<u64> {
        let waiting = if active_only {
            None
        } else {
            self.waiting.first().copied()
        };
        waiting
            .or_else(|| self.opening.first().copied())
            .or_else(|| {
                let mut idle: Option<(Instant, u64)> = None;
                let mut busy: Option<(Instant, u64)> = None;
                for &id in &self.proven {
                    let Some(e) = conns.get(&id) else { continue };
                    let s = lock_state(&e.state);
                    let slot = if s.busy { &mut busy } else { &mut idle };
                    let key = (s.busy_or_idle_since, id);
                    if slot.is_none_or(|k| key < k) {
                        *slot = Some(key);
                    }
                }
                idle.or(busy.filter(|&(since, _)| now.duration_since(since) >= busy_after))
                    .map(|(_, id)| id)
            })
    }
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    conns: HashMap<u64, Entry>,
    peers: HashMap<IpAddr, Peer>,
    /// (open connections, address), to find the heaviest client.
    load: BTreeSet<(usize, IpAddr)>,
    /// Connections told to close and not gone yet.
    evicting: usize,
    /// Connections past their first byte, not counting those told to close.
    active: usize,
}

impl Inner {
    fn set_load(&mut self, ip: IpAddr, from: usize, to: usize) {
        if from > 0 {
            self.load.remove(&(from, ip));
        }
        if to > 0 {
            self.load.insert((to, ip));
        }
    }

    fn reclass(&mut self, id: u64, class: Class) {
        let Some(e) = self.conns.get_mut(&id) else {
            return;
        };
        if e.class == Class::Evicting {
            return;
        }
        let old = std::mem::replace(&mut e.class, class);
        let peer = e.peer;
        match (old.active(), class.active()) {
            (false, true) => self.active += 1,
            (true, false) => self.active -= 1,
            _ => {}
        }
        if let Some(p) = self.peers.get_mut(&peer) {
            p.forget(id, old);
            p.file(id, class);
        }
    }

    /// Picks a victim from the heaviest client that has one, and tells it to close; `false`
    /// when nothing may be evicted.
    fn evict_one(&mut self, active_only: bool, now: Instant, busy_after: Duration) -> bool {
        let victim = self.load.iter().rev().find_map(|(_, ip)| {
            self.peers
                .get(ip)?
                .victim(&self.conns, active_only, now, busy_after)
        });
        let Some(id) = victim else {
            return false;
        };
        self.reclass(id, Class::Evicting);
        if let Some(e) = self.conns.get(&id) {
            decide(&e.state, Decision::Close(CloseReason::Evicted));
        }
        self.evicting += 1;
        true
    }
}

/// Every open connection of one server, with the eviction policy.
#[derive(Debug)]
pub struct Registry {
    limit: usize,
    active_limit: usize,
    busy_evictable_after: Duration,
    metrics: Arc<HttpMetrics>,
    inner: Mutex<Inner>,
    open: watch::Sender<usize>,
    /// Woken when an evicted connection is gone.
    victim_gone: Notify,
}

/// Evicted connections allowed to be still closing before the accept loop waits for them, so
/// that a storm of new connections cannot outrun the closing of the old ones.
pub const MAX_PENDING_EVICTIONS: usize = 64;

impl Registry {
    /// A registry admitting `limits.max_connections` at once, of which
    /// `limits.max_active_connections` past their first byte, counting into `metrics`.
    pub fn new(limits: &Limits, metrics: Arc<HttpMetrics>) -> Arc<Self> {
        let limit = limits.max_connections.max(1);
        let active_limit = limits.max_active_connections.clamp(1, limit);
        metrics.set_limits(limit, active_limit);
        Arc::new(Self {
            limit,
            active_limit,
            busy_evictable_after: limits.busy_evictable_after,
            metrics,
            inner: Mutex::new(Inner::default()),
            open: watch::Sender::new(0),
            victim_gone: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Releases the lock and publishes the counts.
    fn publish(&self, g: MutexGuard<'_, Inner>) {
        let (open, active) = (g.conns.len(), g.active);
        drop(g);
        self.open.send_replace(open);
        self.metrics.set_open(open, active);
    }

    /// Registers a new connection from `peer`, evicting another one when the limit is reached.
    /// `None`: the limit is reached and every open connection is busy (counted as refused).
    pub fn admit(self: &Arc<Self>, peer: IpAddr, tls: bool) -> Option<Admitted> {
        let now = Instant::now();
        let mut g = self.lock();
        if g.conns.len() - g.evicting >= self.limit
            && !g.evict_one(false, now, self.busy_evictable_after)
        {
            drop(g);
            self.metrics.count_closed(CloseReason::Refused);
            return None;
        }
        let id = g.next_id;
        g.next_id += 1;
        let phase = if tls {
            Phase::Handshake
        } else {
            Phase::FirstByte
        };
        let state = Arc::new(Mutex::new(State {
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
        }));
        g.conns.insert(
            id,
            Entry {
                peer,
                class: Class::Waiting,
                state: Arc::clone(&state),
            },
        );
        let p = g.peers.entry(peer).or_default();
        p.open += 1;
        p.waiting.insert(id);
        let open = p.open;
        let handshakes = Arc::clone(&p.handshakes);
        g.set_load(peer, open - 1, open);
        self.publish(g);
        Some(Admitted {
            conn: Arc::new(Conn {
                id,
                registry: Arc::clone(self),
                state,
                handshakes,
            }),
            reason: CloseReason::Closed,
        })
    }

    /// The connection's first byte arrived: from now on it holds buffers. At
    /// `max_active_connections` another active connection is evicted for it; `false` (the
    /// caller closes it) when none may be.
    pub fn activate(&self, id: u64) -> bool {
        let now = Instant::now();
        let mut g = self.lock();
        match g.conns.get(&id).map(|e| e.class) {
            Some(Class::Waiting) => {}
            // Evicted meanwhile, or already active.
            _ => return true,
        }
        if g.active >= self.active_limit && !g.evict_one(true, now, self.busy_evictable_after) {
            return false;
        }
        g.reclass(id, Class::Opening);
        self.publish(g);
        true
    }

    /// The connection's first request is being answered: from now on its own state says
    /// whether it is idle or busy.
    fn file_active(&self, id: u64) {
        self.lock().reclass(id, Class::Proven);
    }

    fn remove(&self, id: u64, reason: CloseReason) {
        let mut g = self.lock();
        let Some(e) = g.conns.remove(&id) else {
            return;
        };
        if e.class == Class::Evicting {
            g.evicting -= 1;
            self.victim_gone.notify_waiters();
        } else if e.class.active() {
            g.active -= 1;
        }
        let open = match g.peers.get_mut(&e.peer) {
            Some(p) => {
                p.forget(id, e.class);
                p.open -= 1;
                p.open
            }
            None => 0,
        };
        if open == 0 {
            g.peers.remove(&e.peer);
        }
        g.set_load(e.peer, open + 1, open);
        self.publish(g);
        self.metrics.count_closed(reason);
    }

    /// Waits while [`MAX_PENDING_EVICTIONS`] evicted connections are still closing, so that the
    /// admission that follows (which may evict one more) keeps at most that many closing, and
    /// at most `limit + MAX_PENDING_EVICTIONS` connections open.
    pub async fn evictions_settled(&self) {
        loop {
            let gone = self.victim_gone.notified();
            if self.lock().evicting < MAX_PENDING_EVICTIONS {
                return;
            }
            gone.await;
        }
    }

    /// The server stops: every open connection finishes the request it is answering (if any)
    /// and closes ([`Conn::watch`]).
    pub fn stop_all(&self) {
        let states: Vec<_> = self
            .lock()
            .conns
            .values()
            .map(|e| Arc::clone(&e.state))
            .collect();
        for s in states {
            decide(&s, Decision::Stop);
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        *self.open.borrow()
    }

    /// Connections past their first byte now (not counting those being evicted).
    pub fn active(&self) -> usize {
        self.lock().active
    }

    /// Resolves when no connection is open.
    pub async fn drained(&self) {
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(|&n| n == 0).await;
    }
}

/// A TLS connection's socket during the handshake: a read waits for the client's bytes without
/// a handshake slot, then takes one of the client's [`MAX_HANDSHAKES_PER_CLIENT`] slots before
/// returning them, and keeps it while the TLS library processes them (signing, key exchange)
/// until it asks for more bytes and none are there. After the handshake
/// ([`HandshakeIo::handshake_done`]) it is a plain socket.
#[derive(Debug)]
pub struct HandshakeIo {
    inner: tokio::net::TcpStream,
    slots: Option<PollSemaphore>,
    slot: Option<OwnedSemaphorePermit>,
}

impl HandshakeIo {
    /// The handshake is over: the slot is given back and reads are no longer gated.
    pub fn handshake_done(&mut self) {
        self.slots = None;
        self.slot = None;
    }

    /// Whether a handshake slot is held now.
    pub fn holds_slot(&self) -> bool {
        self.slot.is_some()
    }
}

impl AsyncRead for HandshakeIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(slots) = &mut this.slots {
            if this.slot.is_none() {
                // Wait for the client without a slot; then wait for a slot.
                std::task::ready!(this.inner.poll_read_ready(cx))?;
                this.slot = std::task::ready!(slots.poll_acquire(cx));
            }
            let r = Pin::new(&mut this.inner).poll_read(cx, buf);
            if r.is_pending() {
                // Processed everything the client sent: waiting again, without the slot.
                this.slot = None;
            }
            return r;
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for HandshakeIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn registry(max: usize) -> (Arc<Registry>, Arc<HttpMetrics>) {
        let metrics = Arc::new(HttpMetrics::default());
        let limits = Limits {
            max_connections: max,
            ..Limits::default()
        };
        (Registry::new(&limits, Arc::clone(&metrics)), metrics)
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn evicted(c: &Admitted) -> bool {
        c.conn.registry.lock().conns[&c.conn.id].class == Class::Evicting
    }

    /// Serves one request on `c`: first byte, head read, response taken and flushed.
    fn serve_one(c: &Admitted) {
        assert!(c.conn.activate());
        c.conn.read_some();
        c.conn.request_started();
        c.conn.body_done();
        c.conn.quiet();
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

    #[tokio::test(start_paused = true)]
    async fn at_the_limit_the_heaviest_clients_oldest_silent_connection_gives_way() {
        let (reg, metrics) = registry(4);
        let scraper = reg.admit(ip(1), false).unwrap();
        serve_one(&scraper);
        assert_eq!(scraper.conn.phase(), Phase::Idle);
        let flood: Vec<_> = (0..3).map(|_| reg.admit(ip(2), false).unwrap()).collect();
        // A fifth connection: the flood's oldest gives way, not the scraper (which is older and
        // idle) and not the newcomer.
        let newcomer = reg.admit(ip(3), false).unwrap();
        assert!(evicted(&flood[0]));
        assert!(!evicted(&flood[1]) && !evicted(&flood[2]) && !evicted(&scraper));
        assert!(!evicted(&newcomer));
        // Until the victim is gone it is open but no longer counts against the limit.
        assert_eq!(reg.open(), 5);
        drop(flood);
        assert_eq!(reg.open(), 2);
        assert_eq!(metrics.closed(CloseReason::Closed), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn proven_idle_connections_go_least_recently_used_first_and_busy_ones_stay() {
        let (reg, metrics) = registry(3);
        let a = reg.admit(ip(2), false).unwrap();
        let b = reg.admit(ip(2), false).unwrap();
        let c = reg.admit(ip(2), false).unwrap();
        serve_one(&a);
        tokio::time::advance(Duration::from_secs(1)).await;
        serve_one(&b);
        serve_one(&c);
        // `a` idle the longest; `c` answering a request now.
        c.conn.read_some();
        c.conn.request_started();
        let mut d = reg.admit(ip(3), false).unwrap();
        assert!(evicted(&a) && !evicted(&b) && !evicted(&c));
        d.reason = CloseReason::Evicted;
        drop(a);
        // Next: `b` (idle); then nothing but busy `c` and the newcomers' unproven ones.
        let e = reg.admit(ip(3), false).unwrap();
        assert!(evicted(&b));
        drop(b);
        // ip(3) now holds two unproven connections: the heavier client gives way.
        let f = reg.admit(ip(4), false).unwrap();
        assert!(evicted(&d) && !evicted(&e) && !evicted(&f) && !evicted(&c));
        drop(d);
        assert_eq!(metrics.closed(CloseReason::Evicted), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn when_everything_is_busy_the_newcomer_is_refused_until_a_response_stalls() {
        let limits = Limits {
            max_connections: 2,
            busy_evictable_after: Duration::from_secs(10),
            ..Limits::default()
        };
        let metrics = Arc::new(HttpMetrics::default());
        let reg = Registry::new(&limits, Arc::clone(&metrics));
        let a = reg.admit(ip(2), false).unwrap();
        let b = reg.admit(ip(2), false).unwrap();
        for c in [&a, &b] {
            assert!(c.conn.activate());
            c.conn.read_some();
            c.conn.request_started();
        }
        assert!(reg.admit(ip(3), false).is_none());
        assert_eq!(metrics.closed(CloseReason::Refused), 1);
        assert_eq!(reg.open(), 2);
        tokio::time::advance(Duration::from_secs(10)).await;
        let c = reg
            .admit(ip(3), false)
            .expect("a stalled response gives way");
        assert!(evicted(&a) && !evicted(&b) && !evicted(&c));
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_active_budget_an_active_connection_gives_way_and_silent_ones_stay() {
        let limits = Limits {
            max_connections: 100,
            max_active_connections: 2,
            ..Limits::default()
        };
        let metrics = Arc::new(HttpMetrics::default());
        let reg = Registry::new(&limits, Arc::clone(&metrics));
        let scraper = reg.admit(ip(1), false).unwrap();
        serve_one(&scraper);
        // The attacker: many silent connections (cheap) and one opening.
        let silent: Vec<_> = (0..10).map(|_| reg.admit(ip(2), false).unwrap()).collect();
        let opening = reg.admit(ip(2), false).unwrap();
        assert!(opening.conn.activate());
        assert_eq!(reg.active(), 2);
        assert_eq!(metrics.active(), 2);
        // A third active one: the attacker's opening one goes, not its silent ones (they cost
        // nothing) and not the scraper.
        assert!(silent[0].conn.activate());
        assert!(evicted(&opening) && !evicted(&scraper));
        assert!(silent[1..].iter().all(|c| !evicted(c)));
        assert_eq!(reg.active(), 2);
        drop(opening);
        assert_eq!(reg.open(), 11);
    }

    #[tokio::test(start_paused = true)]
    async fn an_activation_is_refused_only_when_every_active_connection_is_busy() {
        let limits = Limits {
            max_connections: 100,
            max_active_connections: 1,
            ..Limits::default()
        };
        let reg = Registry::new(&limits, Arc::new(HttpMetrics::default()));
        let a = reg.admit(ip(2), false).unwrap();
        assert!(a.conn.activate());
        a.conn.read_some();
        a.conn.request_started();
        let b = reg.admit(ip(2), false).unwrap();
        assert!(!b.conn.activate());
        assert!(!evicted(&a));
        tokio::time::advance(limits.busy_evictable_after).await;
        assert!(b.conn.activate());
        assert!(evicted(&a));
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

    #[tokio::test(start_paused = true)]
    async fn at_stop_a_connection_is_told_once_and_its_deadlines_still_hold() {
        let limits = Limits::default();
        let (reg, _) = registry(8);
        let t = reg.admit(ip(1), false).unwrap();
        serve_one(&t);
        let start = Instant::now();
        reg.stop_all();
        assert_eq!(t.conn.watch(&limits).await, Decision::Stop);
        assert_eq!(
            t.conn.watch(&limits).await,
            Decision::Close(CloseReason::IdleTimeout)
        );
        assert_eq!(start.elapsed(), limits.idle_timeout);
        // Before its first byte, a stop closes it at once.
        let u = reg.admit(ip(1), false).unwrap();
        reg.stop_all();
        assert_eq!(u.conn.watchdog(&limits).await, CloseReason::Shutdown);
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
