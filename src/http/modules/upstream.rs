//! `upstream NAME { server ADDR [weight= max_fails= fail_timeout= backup down]; keepalive N;
//! keepalive_timeout T; keepalive_requests N; }`
//! and the implicit one-server upstream of `proxy_pass http://HOST:PORT`.
//!
//! # Peer selection
//!
//! nginx's smooth weighted round robin: every live, untried peer adds its
//! effective weight to its current weight; the peer with the highest
//! current weight is chosen and the total is subtracted from it. Over N
//! picks each peer is chosen in proportion to its weight, interleaved.
//!
//! # Peer state (per upstream, shared by all workers)
//!
//! ```text
//!            failure (fails < max_fails)
//!   Up  ───────────────────────────────────▶ Up (fails+1, effective weight lowered)
//!   Up  ── failure reaching max_fails ─────▶ Down(since = checked)
//!   Down ── fail_timeout elapsed ──────────▶ Up on probation: may be picked again
//!   any ── success after the last failure ─▶ Up (fails = 0)
//! ```
//!
//! Invariants: `down` (the config flag) peers are never picked;
//! `max_fails=0` disables accounting; a lone peer (one server, no backup)
//! is never marked down, as in nginx: there is nothing to fail over to,
//! so refusing it would only turn a hiccup into an outage. Backup peers are
//! used only once every primary peer is tried or down.
//!
//! # Keep-alive connections
//!
//! `keepalive N` caches up to N idle connections per worker. Sockets are
//! registered with the worker's own tokio reactor, so the cache is
//! thread-local: a worker only reuses connections it opened. Each cached
//! connection carries the number of requests it has served: one that
//! reached `keepalive_requests` (default 1000, as nginx) is closed instead
//! of cached, so an upstream that leaks per-connection state sees it
//! released.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::tls::client::UpStream;

use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::HttpMain;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "upstream",
        ctx: ctx::HTTP,
        args: Args::take(1),
        set: Setter::HttpMainBlock(set_upstream),
    },
    // Rows for the `upstream` block's own directives: the block compiler
    // looks them up with nginx's context checks; their setters never run
    // through the generic path.
    Spec {
        name: "server",
        ctx: ctx::UPS,
        args: Args::AtLeast(1),
        set: Setter::HttpMain(inside_upstream_only),
    },
    Spec {
        name: "keepalive",
        ctx: ctx::UPS,
        args: Args::take(1),
        set: Setter::HttpMain(inside_upstream_only),
    },
    Spec {
        name: "keepalive_timeout",
        ctx: ctx::UPS,
        args: Args::take(1),
        set: Setter::HttpMain(inside_upstream_only),
    },
    Spec {
        name: "keepalive_requests",
        ctx: ctx::UPS,
        args: Args::take(1),
        set: Setter::HttpMain(inside_upstream_only),
    },
];

fn inside_upstream_only(_: &mut HttpMain, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    Err(ConfError::at(
        format!("\"{}\" directive is not allowed here", d.name),
        d,
    ))
}

/// http-level state: the `upstream` blocks by name.
#[derive(Debug, Clone, Default)]
pub struct UpstreamMain {
    pub upstreams: HashMap<String, Arc<Upstream>>,
}

/// One configured server of an upstream.
#[derive(Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    /// As nginx prints it in `$upstream_addr` and the error log.
    pub name: String,
    pub weight: i64,
    pub max_fails: u32,
    pub fail_timeout: Duration,
    pub down: bool,
}

#[derive(Debug, Clone, Copy)]
struct PeerState {
    current: i64,
    effective: i64,
    fails: u32,
    checked: Option<Instant>,
}

/// An upstream group: primary and backup peers plus their shared state.
#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    pub peers: Vec<Peer>,
    pub backup: Vec<Peer>,
    /// `keepalive N`: idle connections cached per worker (0 = none).
    pub keepalive: usize,
    pub keepalive_timeout: Duration,
    /// `keepalive_requests`: requests one connection may serve before it
    /// is closed instead of cached.
    pub keepalive_requests: u64,
    /// Whether this came from an `upstream` block (affects `$proxy_host`
    /// and error wording only).
    pub explicit: bool,
    id: u64,
    state: Mutex<Vec<PeerState>>,
}

/// Which peer a request is using: index into primary then backup peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerId(usize);

/// One request's walk over the peers (which ones it already tried).
#[derive(Debug)]
pub struct Attempt {
    tried: Vec<bool>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// nginx's default `keepalive_requests` (since 1.19.10; 100 before).
const KEEPALIVE_REQUESTS: u64 = 1000;

impl Upstream {
    fn new(name: String, peers: Vec<Peer>, backup: Vec<Peer>, explicit: bool) -> Upstream {
        let state = peers
            .iter()
            .chain(backup.iter())
            .map(|p| PeerState {
                current: 0,
                effective: p.weight,
                fails: 0,
                checked: None,
            })
            .collect();
        Upstream {
            name,
            peers,
            backup,
            keepalive: 0,
            keepalive_timeout: Duration::from_secs(60),
            keepalive_requests: KEEPALIVE_REQUESTS,
            explicit,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(state),
        }
    }

    /// The implicit upstream of `proxy_pass http://HOST:PORT` (all the
    /// addresses HOST resolves to, weight 1).
    pub fn implicit(name: &str, addrs: Vec<SocketAddr>) -> Upstream {
        let peers = addrs
            .into_iter()
            .map(|a| Peer {
                addr: a,
                name: a.to_string(),
                weight: 1,
                max_fails: 1,
                fail_timeout: Duration::from_secs(10),
                down: false,
            })
            .collect();
        Upstream::new(name.to_string(), peers, Vec::new(), false)
    }

    pub fn peer(&self, id: PeerId) -> Option<&Peer> {
        self.peers.get(id.0).or_else(|| {
            id.0.checked_sub(self.peers.len())
                .and_then(|i| self.backup.get(i))
        })
    }

    pub fn attempt(&self) -> Attempt {
        Attempt {
            tried: vec![false; self.peers.len() + self.backup.len()],
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PeerState>> {
        // A poisoned lock only means a panic elsewhere; the counters stay usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Picks the next peer for this attempt, or None when none is left
    /// ("no live upstreams").
    pub fn next(&self, at: &mut Attempt) -> Option<PeerId> {
        let now = Instant::now();
        let lone = self.peers.len() == 1 && self.backup.is_empty();
        let mut st = self.lock();
        for (lo, hi) in [
            (0, self.peers.len()),
            (self.peers.len(), self.peers.len() + self.backup.len()),
        ] {
            let mut best: Option<usize> = None;
            let mut total = 0i64;
            for i in lo..hi {
                let Some(p) = self.peer(PeerId(i)) else {
                    continue;
                };
                if p.down || at.tried.get(i).copied().unwrap_or(true) {
                    continue;
                }
                let s = st[i];
                if !lone
                    && p.max_fails > 0
                    && s.fails >= p.max_fails
                    && s.checked
                        .is_some_and(|c| now.duration_since(c) <= p.fail_timeout)
                {
                    continue;
                }
                let s = &mut st[i];
                s.current += s.effective;
                total += s.effective;
                if s.effective < p.weight {
                    s.effective += 1;
                }
                if best.is_none_or(|b| st[i].current > st[b].current) {
                    best = Some(i);
                }
            }
            if let Some(b) = best {
                st[b].current -= total;
                if let Some(t) = at.tried.get_mut(b) {
                    *t = true;
                }
                return Some(PeerId(b));
            }
        }
        None
    }

    /// Records a failed attempt; returns true when it just disabled the
    /// peer (for nginx's "upstream server temporarily disabled" warning).
    pub fn failed(&self, id: PeerId) -> bool {
        let Some(p) = self.peer(id) else { return false };
        let mut st = self.lock();
        let Some(s) = st.get_mut(id.0) else {
            return false;
        };
        s.fails += 1;
        s.checked = Some(Instant::now());
        if p.max_fails > 0 {
            s.effective -= p.weight / i64::from(p.max_fails);
            s.effective = s.effective.max(0);
            return s.fails == p.max_fails && !(self.peers.len() == 1 && self.backup.is_empty());
        }
        false
    }

    /// Records a success: the failure count starts over.
    pub fn succeeded(&self, id: PeerId) {
        if let Some(s) = self.lock().get_mut(id.0) {
            s.fails = 0;
        }
    }

    /// An idle cached connection to `peer`, if this worker has one, with
    /// the number of requests it has served.
    pub fn take_idle(&self, addr: SocketAddr) -> Option<(UpStream, u64)> {
        if self.keepalive == 0 {
            return None;
        }
        IDLE.with(|m| {
            let mut m = m.borrow_mut();
            let list = m.get_mut(&self.id)?;
            let now = Instant::now();
            list.retain(|e| now.duration_since(e.since) < self.keepalive_timeout);
            let i = list.iter().rposition(|e| e.addr == addr)?;
            let e = list.remove(i);
            Some((e.stream, e.requests))
        })
    }

    /// Caches an idle connection that has served `requests` requests
    /// (dropping the oldest beyond `keepalive`); one that has served
    /// `keepalive_requests` is dropped, which closes it.
    pub fn put_idle(&self, addr: SocketAddr, s: UpStream, requests: u64) {
        if self.keepalive == 0 || requests >= self.keepalive_requests {
            return;
        }
        IDLE.with(|m| {
            let mut m = m.borrow_mut();
            let list = m.entry(self.id).or_default();
            if list.len() >= self.keepalive {
                list.remove(0);
            }
            list.push(Idle {
                addr,
                stream: s,
                since: Instant::now(),
                requests,
            });
        });
    }
}

struct Idle {
    addr: SocketAddr,
    stream: UpStream,
    since: Instant,
    requests: u64,
}

type IdleList = Vec<Idle>;

thread_local! {
    /// This worker's idle upstream connections, by upstream id.
    static IDLE: RefCell<HashMap<u64, IdleList>> = RefCell::new(HashMap::new());
}

/// Resolves `host:port` (at configuration time, as nginx does).
pub fn resolve(hostport: &str, d: &Directive, what: &str) -> ConfResult<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = hostport
        .to_socket_addrs()
        .map(|a| a.collect())
        .unwrap_or_default();
    if addrs.is_empty() {
        let host = hostport.rsplit_once(':').map_or(hostport, |(h, _)| h);
        return Err(ConfError::at(
            format!("host not found in {} \"{}\"", what, host),
            d,
        ));
    }
    Ok(addrs)
}

fn set_upstream(hm: &mut HttpMain, d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    let name = arg(d, 0).to_string();
    if hm.modules.upstream.upstreams.contains_key(&name) {
        return Err(ConfError::at(format!("duplicate upstream \"{}\"", name), d));
    }
    let mut peers = Vec::new();
    let mut backup = Vec::new();
    let mut keepalive = 0usize;
    let mut keepalive_timeout = Duration::from_secs(60);
    let mut keepalive_requests: Option<u64> = None;
    for k in d.block.as_deref().unwrap_or(&[]) {
        crate::core::conf::lookup(k, ctx::UPS)?;
        match k.name.as_str() {
            "server" => {
                let (list, is_backup) = parse_server(k)?;
                if is_backup {
                    backup.extend(list);
                } else {
                    peers.extend(list);
                }
            }
            "keepalive" => {
                keepalive = value::number(arg(k, 0)).filter(|n| *n > 0).ok_or_else(|| {
                    ConfError::at(
                        format!("invalid value \"{}\" in \"keepalive\" directive", arg(k, 0)),
                        k,
                    )
                })? as usize;
            }
            "keepalive_timeout" => {
                keepalive_timeout = Duration::from_millis(
                    value::time_ms(arg(k, 0))
                        .ok_or_else(|| crate::config::registry::slot_invalid(k))?,
                );
            }
            "keepalive_requests" => {
                let n = value::number(arg(k, 0))
                    .ok_or_else(|| crate::config::registry::slot_invalid_number(k))?;
                crate::config::registry::set_once(&mut keepalive_requests, n, k)?;
            }
            _ => {
                return Err(ConfError::at(
                    format!("\"{}\" directive is not allowed here", k.name),
                    k,
                ))
            }
        }
    }
    if peers.is_empty() {
        return Err(ConfError::at(
            format!("no servers are inside upstream \"{}\"", name),
            d,
        ));
    }
    let mut u = Upstream::new(name.clone(), peers, backup, true);
    u.keepalive = keepalive;
    u.keepalive_timeout = keepalive_timeout;
    u.keepalive_requests = keepalive_requests.unwrap_or(KEEPALIVE_REQUESTS);
    hm.modules.upstream.upstreams.insert(name, Arc::new(u));
    Ok(())
}

/// `server ADDR [weight=N] [max_fails=N] [fail_timeout=T] [backup] [down]`.
fn parse_server(d: &Directive) -> ConfResult<(Vec<Peer>, bool)> {
    let addr = arg(d, 0);
    let hostport = if addr.parse::<std::net::IpAddr>().is_ok()
        || (addr.starts_with('[') && addr.ends_with(']'))
        || !addr.contains(':')
    {
        format!("{}:80", addr)
    } else {
        addr.to_string()
    };
    if addr.starts_with("unix:") {
        return Err(ConfError::at(
            "unix upstream servers are not supported by tern yet",
            d,
        ));
    }
    let (mut weight, mut max_fails, mut fail_timeout) = (1i64, 1u32, Duration::from_secs(10));
    let (mut is_backup, mut down) = (false, false);
    let bad = |v: &str| ConfError::at(format!("invalid parameter \"{}\"", v), d);
    for a in d.args.iter().skip(1).map(|a| a.value.as_str()) {
        if let Some(v) = a.strip_prefix("weight=") {
            weight = value::number(v).filter(|n| *n > 0).ok_or_else(|| bad(a))? as i64;
        } else if let Some(v) = a.strip_prefix("max_fails=") {
            max_fails = value::number(v)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad(a))?;
        } else if let Some(v) = a.strip_prefix("fail_timeout=") {
            fail_timeout = Duration::from_secs(value::time_secs(v).ok_or_else(|| bad(a))?);
        } else if a == "backup" {
            is_backup = true;
        } else if a == "down" {
            down = true;
        } else {
            return Err(bad(a));
        }
    }
    let addrs = resolve(&hostport, d, "upstream")?;
    let peers = addrs
        .into_iter()
        .map(|a| Peer {
            addr: a,
            name: a.to_string(),
            weight,
            max_fails,
            fail_timeout,
            down,
        })
        .collect();
    Ok((peers, is_backup))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(weights: &[i64]) -> Upstream {
        let peers = weights
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let addr: SocketAddr = format!("127.0.0.1:{}", 1000 + i).parse().unwrap();
                Peer {
                    addr,
                    name: addr.to_string(),
                    weight: *w,
                    max_fails: 1,
                    fail_timeout: Duration::from_secs(10),
                    down: false,
                }
            })
            .collect();
        Upstream::new("u".into(), peers, Vec::new(), true)
    }

    #[test]
    fn smooth_weighted_round_robin() {
        let u = up(&[5, 1, 1]);
        let picks: Vec<usize> = (0..7)
            .map(|_| u.next(&mut u.attempt()).unwrap().0)
            .collect();
        // nginx's documented sequence for weights 5,1,1: a a b a c a a.
        assert_eq!(picks, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn failover_skips_tried_and_failed_peers() {
        let u = up(&[1, 1]);
        let mut at = u.attempt();
        let a = u.next(&mut at).unwrap();
        assert!(u.failed(a));
        let b = u.next(&mut at).unwrap();
        assert_ne!(a, b);
        assert!(u.next(&mut at).is_none());
        // The failed peer is down for fail_timeout: new requests avoid it.
        for _ in 0..3 {
            assert_eq!(u.next(&mut u.attempt()), Some(b));
        }
    }
}
