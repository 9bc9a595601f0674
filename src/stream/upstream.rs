//! Upstream groups and peer selection: weighted round-robin with passive
//! health checks (`max_fails`/`fail_timeout`), `backup` and `down`, as
//! nginx's round-robin balancer behaves.
//!
//! Peer state is shared by all worker threads (one `Mutex` per group,
//! never held across an await): in nginx it is per worker process unless
//! the upstream has a `zone`; tern behaves as if every upstream had one.
//! A reload builds new groups, so the state starts afresh, as in nginx.
//!
//! A peer's life, as seen by the balancer:
//!
//! ```text
//!            pick()                      connect ok
//!  usable ──────────▶ tried (this session) ─────────▶ usable (fails reset
//!    ▲                     │                           if a fail_timeout
//!    │                     │ connect failed            passed since the
//!    │                     ▼                           last failure)
//!    │               fails += 1 ── fails < max_fails ──▶ usable
//!    │                     │
//!    │                     │ fails >= max_fails
//!    │                     ▼
//!    └── fail_timeout ── unavailable (skipped by pick(); after fail_timeout
//!        passed          one session may try it again)
//! ```
//!
//! `down` peers are never picked. With exactly one peer and no backup, its
//! failures are not counted against it: there is nothing else to try.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where a peer listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAddr {
    Inet(SocketAddr),
    Unix(PathBuf),
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerAddr::Inet(a) => write!(f, "{}", a),
            PeerAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// One `server` of an upstream, as configured.
#[derive(Debug, Clone)]
pub struct Peer {
    pub name: String,
    pub addr: PeerAddr,
    pub weight: u32,
    /// 0 disables the accounting.
    pub max_fails: u32,
    pub fail_timeout: Duration,
    /// 0 = no limit.
    pub max_conns: usize,
    pub down: bool,
}

#[derive(Debug, Default, Clone)]
struct PeerState {
    current: i64,
    effective: i64,
    fails: u32,
    /// Last failure.
    accessed: Option<Instant>,
    /// Start of the current failure window.
    checked: Option<Instant>,
    conns: usize,
}

#[derive(Debug)]
struct PeerSet {
    peers: Vec<Peer>,
    state: Mutex<Vec<PeerState>>,
}

impl PeerSet {
    fn new(peers: Vec<Peer>) -> PeerSet {
        let state = peers
            .iter()
            .map(|p| PeerState {
                effective: i64::from(p.weight),
                ..Default::default()
            })
            .collect();
        PeerSet {
            peers,
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<PeerState>> {
        // The state is plain counters: a panic elsewhere cannot leave it
        // inconsistent in a way that matters, so keep using it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Smooth weighted round-robin over the usable, untried peers.
    fn pick(&self, tried: &mut [bool], single: bool, now: Instant) -> Option<usize> {
        let mut st = self.lock();
        let mut best: Option<(usize, i64)> = None;
        let mut total: i64 = 0;
        for (i, p) in self.peers.iter().enumerate() {
            let Some(s) = st.get_mut(i) else { break };
            if tried.get(i).copied().unwrap_or(true) || p.down {
                continue;
            }
            if !single
                && p.max_fails > 0
                && s.fails >= p.max_fails
                && s.checked
                    .is_some_and(|c| now.duration_since(c) <= p.fail_timeout)
            {
                continue;
            }
            if p.max_conns > 0 && s.conns >= p.max_conns {
                continue;
            }
            s.current += s.effective;
            total += s.effective;
            if s.effective < i64::from(p.weight) {
                s.effective += 1;
            }
            if best.is_none_or(|(_, c)| s.current > c) {
                best = Some((i, s.current));
            }
        }
        let (b, _) = best?;
        let p = &self.peers[b];
        let s = &mut st[b];
        s.current -= total;
        if s.checked
            .is_none_or(|c| now.duration_since(c) > p.fail_timeout)
        {
            s.checked = Some(now);
        }
        s.conns += 1;
        if let Some(t) = tried.get_mut(b) {
            *t = true;
        }
        Some(b)
    }

    fn forgive(&self) {
        for s in self.lock().iter_mut() {
            s.fails = 0;
        }
    }

    fn finish(&self, i: usize, outcome: Outcome, single: bool, now: Instant) {
        let mut st = self.lock();
        let (Some(p), Some(s)) = (self.peers.get(i), st.get_mut(i)) else {
            return;
        };
        match outcome {
            Outcome::Released => s.conns = s.conns.saturating_sub(1),
            Outcome::Failed => {
                s.conns = s.conns.saturating_sub(1);
                if single {
                    return;
                }
                s.fails += 1;
                s.accessed = Some(now);
                s.checked = Some(now);
                // Lower its share until it proves itself again (pick()
                // raises it back by one per round).
                if let Some(step) = p.weight.checked_div(p.max_fails) {
                    s.effective = (s.effective - i64::from(step)).max(0);
                }
            }
            Outcome::Connected => {
                // Successes inside the failure window do not forgive it;
                // the first success after the window was reopened does.
                if s.accessed.is_some_and(|a| s.checked.is_some_and(|c| a < c)) {
                    s.fails = 0;
                }
            }
        }
    }
}

enum Outcome {
    Connected,
    Failed,
    /// The session using the peer ended.
    Released,
}

/// An `upstream {}` block, or the implicit group of a `proxy_pass host:port`.
#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    primary: PeerSet,
    backup: PeerSet,
    single: bool,
}

impl Upstream {
    pub fn new(name: String, primary: Vec<Peer>, backup: Vec<Peer>) -> Upstream {
        let single = primary.len() == 1 && backup.is_empty();
        Upstream {
            name,
            primary: PeerSet::new(primary),
            backup: PeerSet::new(backup),
            single,
        }
    }

    /// Bookkeeping of the peers one session has tried.
    pub fn tried(&self) -> Tried {
        Tried {
            primary: vec![false; self.primary.peers.len()],
            backup: vec![false; self.backup.peers.len()],
        }
    }

    /// The next peer to try, or None: "no live upstreams". Backup peers are
    /// used only when no primary peer is usable.
    pub fn pick(self: &Arc<Self>, tried: &mut Tried) -> Option<Picked> {
        let now = Instant::now();
        if let Some(i) = self.primary.pick(&mut tried.primary, self.single, now) {
            return Some(Picked::new(self.clone(), false, i, &self.primary.peers[i]));
        }
        if let Some(i) = self.backup.pick(&mut tried.backup, false, now) {
            return Some(Picked::new(self.clone(), true, i, &self.backup.peers[i]));
        }
        // Nothing left for this session. As nginx does, forget all failures
        // so that the next session tries every peer again at once rather
        // than refusing clients for a whole fail_timeout.
        self.primary.forgive();
        self.backup.forgive();
        None
    }

    fn set(&self, backup: bool) -> &PeerSet {
        if backup {
            &self.backup
        } else {
            &self.primary
        }
    }
}

/// Which peers of an upstream a session has already tried.
#[derive(Debug)]
pub struct Tried {
    primary: Vec<bool>,
    backup: Vec<bool>,
}

/// A peer chosen for one connection attempt; counts toward its
/// `max_conns` until dropped.
#[derive(Debug)]
pub struct Picked {
    up: Arc<Upstream>,
    backup: bool,
    idx: usize,
    pub addr: PeerAddr,
    pub name: String,
    done: bool,
}

impl Picked {
    fn new(up: Arc<Upstream>, backup: bool, idx: usize, p: &Peer) -> Picked {
        Picked {
            up,
            backup,
            idx,
            addr: p.addr.clone(),
            name: p.name.clone(),
            done: false,
        }
    }

    /// The connection attempt failed: count it against the peer.
    pub fn failed(mut self) {
        self.done = true;
        let single = self.up.single && !self.backup;
        self.up
            .set(self.backup)
            .finish(self.idx, Outcome::Failed, single, Instant::now());
    }

    /// The connection is up.
    pub fn connected(&self) {
        self.up
            .set(self.backup)
            .finish(self.idx, Outcome::Connected, false, Instant::now());
    }
}

impl Drop for Picked {
    fn drop(&mut self) {
        if !self.done {
            self.up
                .set(self.backup)
                .finish(self.idx, Outcome::Released, false, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16, weight: u32) -> Peer {
        let addr = PeerAddr::Inet(SocketAddr::from(([127, 0, 0, 1], port)));
        Peer {
            name: addr.to_string(),
            addr,
            weight,
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
            max_conns: 0,
            down: false,
        }
    }

    fn port(p: &Picked) -> u16 {
        match &p.addr {
            PeerAddr::Inet(a) => a.port(),
            PeerAddr::Unix(_) => 0,
        }
    }

    #[test]
    fn smooth_weighted_order() {
        let u = Arc::new(Upstream::new(
            "u".into(),
            vec![peer(1, 5), peer(2, 1), peer(3, 1)],
            vec![],
        ));
        let seq: Vec<u16> = (0..7)
            .map(|_| port(&u.pick(&mut u.tried()).expect("a peer")))
            .collect();
        // nginx's smooth round-robin spreads the heavy peer out.
        assert_eq!(seq, vec![1, 1, 2, 1, 3, 1, 1]);
    }

    #[test]
    fn failed_peer_skipped_then_backup() {
        let u = Arc::new(Upstream::new(
            "u".into(),
            vec![peer(1, 1), peer(2, 1)],
            vec![peer(9, 1)],
        ));
        let mut t = u.tried();
        let a = u.pick(&mut t).expect("first");
        assert_eq!(port(&a), 1);
        a.failed();
        let b = u.pick(&mut t).expect("second");
        assert_eq!(port(&b), 2);
        b.failed();
        let c = u.pick(&mut t).expect("backup");
        assert_eq!(port(&c), 9);
        c.failed();
        assert!(u.pick(&mut t).is_none());
        // Everything failed: all are live again for the next session.
        let mut t = u.tried();
        assert_ne!(port(&u.pick(&mut t).expect("primary again")), 9);
    }

    #[test]
    fn failed_primary_skipped_by_next_session() {
        let u = Arc::new(Upstream::new(
            "u".into(),
            vec![peer(1, 1), peer(2, 1)],
            vec![],
        ));
        let a = u.pick(&mut u.tried()).expect("first");
        assert_eq!(port(&a), 1);
        a.failed();
        for _ in 0..3 {
            let p = u.pick(&mut u.tried()).expect("live peer");
            assert_eq!(port(&p), 2, "failed peer within fail_timeout");
            p.connected();
        }
    }

    #[test]
    fn single_peer_never_marked_down() {
        let u = Arc::new(Upstream::new("u".into(), vec![peer(1, 1)], vec![]));
        for _ in 0..3 {
            let p = u.pick(&mut u.tried()).expect("single peer always tried");
            p.failed();
        }
    }

    #[test]
    fn down_and_max_conns() {
        let mut d = peer(1, 1);
        d.down = true;
        let mut m = peer(2, 1);
        m.max_conns = 1;
        let u = Arc::new(Upstream::new("u".into(), vec![d, m], vec![]));
        let held = u.pick(&mut u.tried()).expect("peer 2");
        assert_eq!(port(&held), 2);
        assert!(u.pick(&mut u.tried()).is_none(), "max_conns reached");
        drop(held);
        assert!(u.pick(&mut u.tried()).is_some());
    }
}
