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

use crate::config::registry::{arg, ctx, row, Args};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::stream::conf::{resolve, StreamSetter, StreamSpec, UpsBuild};

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
    /// The `server` address as written (one name may give several
    /// peers): what `hash ... consistent` places on its ring.
    pub server: String,
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

    /// Whether peer `i` may be picked now (not tried, not down, not
    /// failed within `fail_timeout`, under `max_conns`).
    fn usable(
        &self,
        st: &[PeerState],
        tried: &[bool],
        i: usize,
        single: bool,
        now: Instant,
    ) -> bool {
        let (Some(p), Some(s)) = (self.peers.get(i), st.get(i)) else {
            return false;
        };
        if tried.get(i).copied().unwrap_or(true) || p.down {
            return false;
        }
        if !single
            && p.max_fails > 0
            && s.fails >= p.max_fails
            && s.checked
                .is_some_and(|c| now.duration_since(c) <= p.fail_timeout)
        {
            return false;
        }
        !(p.max_conns > 0 && s.conns >= p.max_conns)
    }

    /// Takes peer `i` for a session.
    fn take(&self, st: &mut [PeerState], tried: &mut [bool], i: usize, now: Instant) {
        let p = &self.peers[i];
        let s = &mut st[i];
        if s.checked
            .is_none_or(|c| now.duration_since(c) > p.fail_timeout)
        {
            s.checked = Some(now);
        }
        s.conns += 1;
        if let Some(t) = tried.get_mut(i) {
            *t = true;
        }
    }

    /// nginx's `hash` walk; None after 20 unusable picks (round robin then).
    fn pick_hash(&self, t: &mut Tried, now: Instant) -> Option<usize> {
        let total: u64 = self.peers.iter().map(|p| u64::from(p.weight)).sum();
        if total == 0 {
            return None;
        }
        let mut st = self.lock();
        for _ in 0..20 {
            let mut h = crc32fast::Hasher::new();
            if t.rehash > 0 {
                h.update(t.rehash.to_string().as_bytes());
            }
            h.update(&t.key);
            t.hash = t.hash.wrapping_add((h.finalize() >> 16) & 0x7fff);
            t.rehash += 1;
            let mut w = u64::from(t.hash) % total;
            let mut i = 0;
            while i < self.peers.len() && w >= u64::from(self.peers[i].weight) {
                w -= u64::from(self.peers[i].weight);
                i += 1;
            }
            if self.usable(&st, &t.primary, i, false, now) {
                self.take(&mut st, &mut t.primary, i, now);
                return Some(i);
            }
        }
        None
    }

    /// nginx's consistent-hash walk: from the key's point on, the first
    /// point whose server has a usable peer (several peers of one server
    /// by smooth weighted round robin); None after 20 points (round robin
    /// then). `t.hash` is the point index, kept for the next try.
    fn pick_chash(&self, ring: &Ring, t: &mut Tried, now: Instant) -> Option<usize> {
        let n = ring.points.len();
        if n == 0 {
            return None;
        }
        if t.rehash == 0 {
            t.hash = ring.find(crc32fast::hash(&t.key)) as u32;
        }
        let mut st = self.lock();
        while t.rehash <= 20 {
            let server = &self.peers[ring.points[t.hash as usize % n].1].server;
            let mut best: Option<usize> = None;
            let mut total = 0i64;
            for i in 0..self.peers.len() {
                if self.peers[i].server != *server || !self.usable(&st, &t.primary, i, false, now) {
                    continue;
                }
                let s = &mut st[i];
                s.current += s.effective;
                total += s.effective;
                if s.effective < i64::from(self.peers[i].weight) {
                    s.effective += 1;
                }
                if best.is_none_or(|b| st[i].current > st[b].current) {
                    best = Some(i);
                }
            }
            if let Some(b) = best {
                st[b].current -= total;
                self.take(&mut st, &mut t.primary, b, now);
                return Some(b);
            }
            t.hash = t.hash.wrapping_add(1);
            t.rehash += 1;
        }
        None
    }

    /// Fewest active sessions per weight; ties go to the first such peer
    /// after smooth round robin among them.
    fn pick_least(&self, tried: &mut [bool], single: bool, now: Instant) -> Option<usize> {
        let mut st = self.lock();
        let mut best: Option<usize> = None;
        for i in 0..self.peers.len() {
            if !self.usable(&st, tried, i, single, now) {
                continue;
            }
            let fewer = best.is_none_or(|b| {
                (st[i].conns as u64) * u64::from(self.peers[b].weight)
                    < (st[b].conns as u64) * u64::from(self.peers[i].weight)
            });
            if fewer {
                best = Some(i);
            }
        }
        let b = best?;
        // Among the tied peers, smooth weighted round robin.
        let mut total = 0i64;
        let mut pick: Option<(usize, i64)> = None;
        for i in 0..self.peers.len() {
            if !self.usable(&st, tried, i, single, now)
                || (st[i].conns as u64) * u64::from(self.peers[b].weight)
                    != (st[b].conns as u64) * u64::from(self.peers[i].weight)
            {
                continue;
            }
            let s = &mut st[i];
            s.current += s.effective;
            total += s.effective;
            if s.effective < i64::from(self.peers[i].weight) {
                s.effective += 1;
            }
            if pick.is_none_or(|(_, c)| s.current > c) {
                pick = Some((i, s.current));
            }
        }
        let (p, _) = pick?;
        st[p].current -= total;
        self.take(&mut st, tried, p, now);
        Some(p)
    }

    /// A usable peer drawn by weight (with `two`, the less loaded of two).
    fn pick_random(&self, tried: &mut [bool], two: bool, now: Instant) -> Option<usize> {
        let mut st = self.lock();
        let cands: Vec<usize> = (0..self.peers.len())
            .filter(|&i| self.usable(&st, tried, i, false, now))
            .collect();
        let total: u64 = cands.iter().map(|&i| u64::from(self.peers[i].weight)).sum();
        if total == 0 {
            return None;
        }
        let draw = || {
            let mut w = random_u64() % total;
            for &i in &cands {
                let pw = u64::from(self.peers[i].weight);
                if w < pw {
                    return i;
                }
                w -= pw;
            }
            cands[0]
        };
        let mut p = draw();
        if two && cands.len() > 1 {
            // Two different peers, as nginx draws them (up to 20 draws).
            let mut q = draw();
            for _ in 0..20 {
                if q != p {
                    break;
                }
                q = draw();
            }
            let load = |i: usize| (st[i].conns as u64, u64::from(self.peers[i].weight));
            let ((pc, pw), (qc, qw)) = (load(p), load(q));
            if qc * pw < pc * qw {
                p = q;
            }
        }
        self.take(&mut st, tried, p, now);
        Some(p)
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

/// A per-thread xorshift generator for `random`: cheap, and its
/// predictability does not matter for spreading load.
fn random_u64() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
                | 1,
        );
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    })
}

enum Outcome {
    Connected,
    Failed,
    /// The session using the peer ended.
    Released,
}

/// The load-balancing method of an upstream (`hash`, `least_conn`,
/// `random`; round robin without one).
#[derive(Debug)]
pub enum Balance {
    RoundRobin,
    /// `hash KEY [consistent]`: nginx's walk of `(crc32(N KEY) >> 16) &
    /// 0x7fff` summed over the tries, modulo the total weight; with
    /// `consistent`, nginx's ketama ring (see [`Ring`]).
    Hash {
        key: crate::http::vars::Template,
        consistent: bool,
    },
    /// Fewest active sessions per unit of weight; ties by round robin.
    LeastConn,
    /// A peer drawn by weight; with `two`, the less loaded of two draws.
    Random {
        two: bool,
    },
}

/// An `upstream {}` block, or the implicit group of a `proxy_pass host:port`.
#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    primary: PeerSet,
    backup: PeerSet,
    single: bool,
    pub balance: Balance,
    /// `hash ... consistent`: the points of the primary peers.
    ring: Ring,
}

/// nginx's ketama ring for `hash ... consistent`, point for point: each
/// `server` (as written) gets `weight * 160` points, the first
/// `crc32(HOST "\0" PORT prev)` with `prev` the previous point (4 bytes,
/// little-endian; 0 at first), as Cache::Memcached::Fast places them;
/// points sorted, duplicates dropped. A key goes to the first point at or
/// after `crc32(key)`, and on to the next points while its server has no
/// usable peer.
#[derive(Debug, Default)]
struct Ring {
    /// (hash, a peer of the point's server).
    points: Vec<(u32, usize)>,
}

impl Ring {
    fn new(peers: &[Peer]) -> Ring {
        let mut points = Vec::new();
        for (i, p) in peers.iter().enumerate() {
            let s = p.server.as_bytes();
            let (host, port): (&[u8], &[u8]) =
                if s.len() >= 5 && s[..5].eq_ignore_ascii_case(b"unix:") {
                    (&s[5..], b"")
                } else {
                    let digits = s.iter().rev().take_while(|c| c.is_ascii_digit()).count();
                    match s.len().checked_sub(digits + 1) {
                        Some(colon) if s[colon] == b':' => (&s[..colon], &s[colon + 1..]),
                        _ => (s, b""),
                    }
                };
            let mut base = crc32fast::Hasher::new();
            base.update(host);
            base.update(&[0]);
            base.update(port);
            let mut prev = 0u32;
            for _ in 0..u64::from(p.weight) * 160 {
                let mut h = base.clone();
                h.update(&prev.to_le_bytes());
                prev = h.finalize();
                points.push((prev, i));
            }
        }
        points.sort_by_key(|&(h, _)| h);
        points.dedup_by_key(|&mut (h, _)| h);
        Ring { points }
    }

    /// The index of the first point at or after `hash` (may be the end:
    /// the walk takes it modulo the number of points).
    fn find(&self, hash: u32) -> usize {
        self.points.partition_point(|&(h, _)| h < hash)
    }
}

impl Upstream {
    pub fn new(name: String, primary: Vec<Peer>, backup: Vec<Peer>, balance: Balance) -> Upstream {
        let single = primary.len() == 1 && backup.is_empty();
        let ring = match balance {
            Balance::Hash {
                consistent: true, ..
            } => Ring::new(&primary),
            _ => Ring::default(),
        };
        Upstream {
            name,
            primary: PeerSet::new(primary),
            backup: PeerSet::new(backup),
            single,
            balance,
            ring,
        }
    }

    /// How many peers one session may try: those not marked `down`
    /// (nginx's `peer.tries`).
    pub fn max_tries(&self) -> usize {
        let up = |set: &PeerSet| set.peers.iter().filter(|p| !p.down).count();
        up(&self.primary) + up(&self.backup)
    }

    /// Bookkeeping of the peers one session has tried; `key` is the
    /// rendered `hash` key (empty for other methods).
    pub fn tried(&self, key: Vec<u8>) -> Tried {
        Tried {
            primary: vec![false; self.primary.peers.len()],
            backup: vec![false; self.backup.peers.len()],
            key,
            hash: 0,
            rehash: 0,
        }
    }

    /// The next peer to try, or None: "no live upstreams". Backup peers are
    /// used only when no primary peer is usable.
    pub fn pick(self: &Arc<Self>, tried: &mut Tried) -> Option<Picked> {
        let now = Instant::now();
        let special = match &self.balance {
            Balance::RoundRobin => None,
            Balance::Hash { .. } if self.single || tried.key.is_empty() => None,
            Balance::Hash {
                consistent: true, ..
            } => self.primary.pick_chash(&self.ring, tried, now),
            Balance::Hash { .. } => self.primary.pick_hash(tried, now),
            Balance::LeastConn => self
                .primary
                .pick_least(&mut tried.primary, self.single, now),
            Balance::Random { .. } if self.single => None,
            Balance::Random { two } => self.primary.pick_random(&mut tried.primary, *two, now),
        };
        if let Some(i) = special {
            return Some(Picked::new(self.clone(), false, i, &self.primary.peers[i]));
        }
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

/// Which peers of an upstream a session has already tried (and where a
/// `hash` walk is).
#[derive(Debug)]
pub struct Tried {
    primary: Vec<bool>,
    backup: Vec<bool>,
    key: Vec<u8>,
    hash: u32,
    rehash: u32,
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

// ---- directives ----------------------------------------------------------------

/// The upstream module's directives: the `upstream {}` block (read by
/// [`crate::stream::conf`]'s walker) and what stands in it.
pub const DIRECTIVES: &[StreamSpec] = &[
    row!("upstream", ctx::STREAM, Args::take(1), StreamSetter::Block),
    row!(
        "server",
        ctx::STREAM_UPS,
        Args::AtLeast(1),
        StreamSetter::Ups(set_ups_server)
    ),
    // Peer state is ordinary shared memory of the one tern process, so a
    // zone is always there; the name and size have nothing to size.
    row!(
        "zone",
        ctx::STREAM_UPS,
        Args::take12(),
        StreamSetter::Ignored(check_zone)
    ),
    row!(
        "hash",
        ctx::STREAM_UPS,
        Args::take12(),
        StreamSetter::Ups(set_hash)
    ),
    row!(
        "least_conn",
        ctx::STREAM_UPS,
        Args::take(0),
        StreamSetter::Ups(set_least_conn)
    ),
    row!(
        "random",
        ctx::STREAM_UPS,
        Args::Take(0b111),
        StreamSetter::Ups(set_random)
    ),
];

fn check_zone(d: &Directive) -> ConfResult<()> {
    match d.args.get(1) {
        Some(a) if crate::config::value::size(&a.value).is_none() => Err(ConfError::at(
            format!("invalid zone size \"{}\"", a.value),
            d,
        )),
        _ => Ok(()),
    }
}

fn set_balance(ub: &mut UpsBuild, b: Balance, d: &Directive) -> ConfResult<()> {
    if ub.balance.is_some() {
        return Err(ConfError::at("load balancing method redefined", d));
    }
    ub.balance = Some(b);
    Ok(())
}

/// `hash KEY [consistent]`.
fn set_hash(ub: &mut UpsBuild, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let key = cx.template(arg(d, 0), d)?;
    let consistent = match d.args.get(1).map(|a| a.value.as_str()) {
        None => false,
        Some("consistent") => true,
        Some(o) => return Err(ConfError::at(format!("invalid parameter \"{}\"", o), d)),
    };
    set_balance(ub, Balance::Hash { key, consistent }, d)
}

fn set_least_conn(ub: &mut UpsBuild, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_balance(ub, Balance::LeastConn, d)
}

/// `random [two [least_conn]]`.
fn set_random(ub: &mut UpsBuild, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let words: Vec<&str> = d.args.iter().map(|a| a.value.as_str()).collect();
    let two = match words.as_slice() {
        [] => false,
        ["two"] | ["two", "least_conn"] => true,
        ["two", bad] | [bad, ..] => {
            return Err(ConfError::at(format!("invalid parameter \"{}\"", bad), d))
        }
    };
    set_balance(ub, Balance::Random { two }, d)
}

/// `server ADDR [weight=N] [max_fails=N] [fail_timeout=T] [max_conns=N] [backup] [down]`.
fn set_ups_server(ub: &mut UpsBuild, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let mut weight = 1u32;
    let mut max_fails = 1u32;
    let mut fail_timeout = Duration::from_secs(10);
    let mut max_conns = 0usize;
    let mut backup = false;
    let mut down = false;
    let invalid = |p: &str| ConfError::at(format!("invalid parameter \"{}\"", p), d);
    for p in d.args.iter().skip(1).map(|a| a.value.as_str()) {
        if let Some(v) = p.strip_prefix("weight=") {
            weight = v
                .parse::<u32>()
                .ok()
                .filter(|w| *w > 0)
                .ok_or_else(|| invalid(p))?;
        } else if let Some(v) = p.strip_prefix("max_fails=") {
            max_fails = v.parse::<u32>().map_err(|_| invalid(p))?;
        } else if let Some(v) = p.strip_prefix("fail_timeout=") {
            fail_timeout = value::time_secs(v)
                .map(Duration::from_secs)
                .ok_or_else(|| invalid(p))?;
        } else if let Some(v) = p.strip_prefix("max_conns=") {
            max_conns = v.parse::<usize>().map_err(|_| invalid(p))?;
        } else if p == "backup" {
            backup = true;
        } else if p == "down" {
            down = true;
        } else {
            return Err(invalid(p));
        }
    }
    let target = arg(d, 0);
    for addr in resolve(target, d, "upstream")? {
        let peer = Peer {
            name: addr.to_string(),
            server: target.to_string(),
            addr,
            weight,
            max_fails,
            fail_timeout,
            max_conns,
            down,
        };
        if backup {
            ub.backup.push(peer);
        } else {
            ub.peers.push(peer);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(port: u16, weight: u32) -> Peer {
        let addr = PeerAddr::Inet(SocketAddr::from(([127, 0, 0, 1], port)));
        Peer {
            name: addr.to_string(),
            server: addr.to_string(),
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
            Balance::RoundRobin,
        ));
        let seq: Vec<u16> = (0..7)
            .map(|_| port(&u.pick(&mut u.tried(Vec::new())).expect("a peer")))
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
            Balance::RoundRobin,
        ));
        let mut t = u.tried(Vec::new());
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
        let mut t = u.tried(Vec::new());
        assert_ne!(port(&u.pick(&mut t).expect("primary again")), 9);
    }

    #[test]
    fn failed_primary_skipped_by_next_session() {
        let u = Arc::new(Upstream::new(
            "u".into(),
            vec![peer(1, 1), peer(2, 1)],
            vec![],
            Balance::RoundRobin,
        ));
        let a = u.pick(&mut u.tried(Vec::new())).expect("first");
        assert_eq!(port(&a), 1);
        a.failed();
        for _ in 0..3 {
            let p = u.pick(&mut u.tried(Vec::new())).expect("live peer");
            assert_eq!(port(&p), 2, "failed peer within fail_timeout");
            p.connected();
        }
    }

    #[test]
    fn single_peer_never_marked_down() {
        let u = Arc::new(Upstream::new(
            "u".into(),
            vec![peer(1, 1)],
            vec![],
            Balance::RoundRobin,
        ));
        for _ in 0..3 {
            let p = u
                .pick(&mut u.tried(Vec::new()))
                .expect("single peer always tried");
            p.failed();
        }
    }

    #[test]
    fn down_and_max_conns() {
        let mut d = peer(1, 1);
        d.down = true;
        let mut m = peer(2, 1);
        m.max_conns = 1;
        let u = Arc::new(Upstream::new(
            "u".into(),
            vec![d, m],
            vec![],
            Balance::RoundRobin,
        ));
        let held = u.pick(&mut u.tried(Vec::new())).expect("peer 2");
        assert_eq!(port(&held), 2);
        assert!(
            u.pick(&mut u.tried(Vec::new())).is_none(),
            "max_conns reached"
        );
        drop(held);
        assert!(u.pick(&mut u.tried(Vec::new())).is_some());
    }
}
