//! The [`Registry`]: every open connection of one server, the two budgets (`max_connections`
//! open, `max_active_connections` past their first byte) and the eviction policy (see
//! [`http::conn`](super)). It knows each connection by its id and shared [`State`]; the
//! connection itself ([`Conn`](super::Conn)) is built on top of it, by
//! [`Registry::admit`](super::Registry::admit), in the layer above.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;

use super::state::{decide, lock_state, Decision, Phase, State};
use crate::http::limits::Limits;
use crate::http::metrics::{CloseReason, HttpMetrics};

/// A connection just registered: what the connection built on it needs.
#[derive(Debug)]
pub(super) struct Registration {
    /// Its id in the registry.
    pub(super) id: u64,
    /// Its state, shared with the registry's entry.
    pub(super) state: Arc<Mutex<State>>,
    /// Its client's TLS handshake slots.
    pub(super) handshakes: Arc<Semaphore>,
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
/// have arrived until the server has processed them and waits for more
/// ([`HandshakeIo`](super::HandshakeIo)), so
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

    /// Publishes the counts, then releases the lock. Published under the lock, so two changes
    /// never publish in the reverse of their order (a stale count left standing).
    fn publish(&self, g: MutexGuard<'_, Inner>) {
        let (open, active) = (g.conns.len(), g.active);
        self.metrics.set_open(open, active);
        self.open.send_replace(open);
        drop(g);
    }

    /// Registers a new connection from `peer`, evicting another one when the limit is reached.
    /// `None`: the limit is reached and every open connection is busy (counted as refused).
    pub(super) fn register(&self, peer: IpAddr, tls: bool) -> Option<Registration> {
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
        let state = Arc::new(Mutex::new(State::new(phase, now)));
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
        Some(Registration {
            id,
            state,
            handshakes,
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
    pub(super) fn file_active(&self, id: u64) {
        self.lock().reclass(id, Class::Proven);
    }

    /// The connection is gone (closed for `reason`).
    pub(super) fn remove(&self, id: u64, reason: CloseReason) {
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
    /// and closes ([`Conn::watch`](super::Conn::watch)).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::conn::tests::{ip, registry, serve_one};
    use crate::http::conn::Admitted;

    fn evicted(c: &Admitted) -> bool {
        c.conn.registry.lock().conns[&c.conn.id].class == Class::Evicting
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
}
