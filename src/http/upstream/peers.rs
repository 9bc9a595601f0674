//! `upstream NAME { server ADDR [weight= max_fails= fail_timeout= backup down]; keepalive N;
//! keepalive_timeout T; keepalive_requests N; }`
//! and the implicit one-server upstream of `proxy_pass http://HOST:PORT`
//! (any `*_pass` to an address): the engine's peers.
//!
//! # Peer selection
//!
//! nginx's smooth weighted round robin: every live, untried peer adds its
//! effective weight to its current weight; the peer with the highest
//! current weight is chosen and the total is subtracted from it. Over N
//! picks each peer is chosen in proportion to its weight, interleaved.
//!
//! The other methods, as nginx computes them so that a key or a client
//! goes to the same server as with nginx:
//! - `ip_hash`: the first three bytes of an IPv4 client address (all
//!   sixteen of IPv6) folded into a hash (`h = (h * 113 + byte) % 6271`,
//!   from 89), taken modulo the total weight of the primary peers and
//!   walked by weight; an unusable peer folds the bytes in again, up to 20
//!   times, then round robin decides.
//! - `hash KEY`: the same walk with `(crc32(N KEY) >> 16) & 0x7fff` added up
//!   over the tries (N, the try number, is left out of the first).
//! - `hash KEY consistent`: ketama points, 160 per unit of weight, each
//!   the CRC32 of the `server` text's host, a NUL, its port and the previous
//!   point; a key's CRC32 finds the first point at or after it, and the
//!   usable peers of that point's `server` share it by weight.
//! - `least_conn`: the fewest active requests per unit of weight, ties by
//!   weighted round robin; backups when no primary is usable.
//! - `random [two [least_conn]]`: a peer drawn by weight; with `two`, two
//!   drawn and the one with fewer active requests per weight taken.
//!
//! Active requests per peer (for `least_conn`, `random two` and
//! `max_conns=`) are counted from the pick until the [`Lease`] the pick
//! returned is dropped, i.e. until the proxy is done with that peer.
//!
//! # Peer state (per upstream, shared by all workers)
//!
//! ```text
//!            failure (fails < max_fails)
//!   Up  ───────────────────────────────────▶ Up (fails+1, effective weight lowered)
//!   Up  ── failure reaching max_fails ─────▶ Down(since = checked)
//!   Down ── fail_timeout elapsed ──────────▶ Up on probation: may be picked again
//!   any ── success, picked again after fail_timeout since the last
//!          failure (nginx's accessed < checked) ─▶ Up (fails = 0)
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
use crate::http::vars::{Template, VarCtx};

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
    Spec {
        name: "keepalive_time",
        ctx: ctx::UPS,
        args: Args::take(1),
        set: Setter::HttpMain(inside_upstream_only),
    },
    // Peer state is ordinary memory of the one tern process, shared by
    // all workers with or without a zone: the name and size are checked
    // and otherwise have nothing to size.
    Spec {
        name: "zone",
        ctx: ctx::UPS,
        args: Args::take12(),
        set: Setter::HttpMain(inside_upstream_only),
    },
    Spec {
        name: "ip_hash",
        ctx: ctx::UPS,
        args: Args::take(0),
        set: Setter::HttpMain(inside_upstream_only),
    },
    Spec {
        name: "hash",
        ctx: ctx::UPS,
        args: Args::take12(),
        set: Setter::HttpMain(inside_upstream_only),
    },
    Spec {
        name: "least_conn",
        ctx: ctx::UPS,
        args: Args::take(0),
        set: Setter::HttpMain(inside_upstream_only),
    },
    Spec {
        name: "random",
        ctx: ctx::UPS,
        args: Args::Take(0b111),
        set: Setter::HttpMain(inside_upstream_only),
    },
];

fn inside_upstream_only(_: &mut HttpMain, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    Err(ConfError::at(
        format!("\"{}\" directive is not allowed here", d.name),
        d,
    ))
}

/// http-level state: the `upstream` blocks and the cache zones
/// (`PREFIX_cache_path`, all modules' in one namespace) by name.
#[derive(Debug, Clone, Default)]
pub struct UpstreamMain {
    pub upstreams: HashMap<String, Arc<Upstream>>,
    /// The implicit upstreams of `proxy_pass http://HOST:PORT`, by host (in
    /// lower case) and port: a `proxy_pass` with variables that evaluates
    /// to the same host and port uses them, unresolved, as nginx does.
    pub implicit: HashMap<(String, u16), Arc<Upstream>>,
    pub zones: HashMap<String, Arc<crate::cache::Zone>>,
}

/// Where a `*_pass` goes.
#[derive(Debug)]
pub enum Target {
    /// An address: one implicit upstream, built at configuration time.
    Fixed(Arc<Upstream>),
    /// A name: an `upstream` block of that name if there is one (looked up
    /// per request in the request's configuration: a location is compiled
    /// without access to the http-level state), else the host resolved on
    /// first use (port 0: only a block can be meant).
    Named {
        name: String,
        port: u16,
        resolved: std::sync::OnceLock<Option<Arc<Upstream>>>,
    },
}

/// Where a `*_pass ADDRESS` goes (fastcgi, scgi, uwsgi, memcached).
#[derive(Debug)]
pub enum PassTo {
    /// An address, a unix socket or an upstream name.
    Static(Target),
    /// With variables: an upstream name or an address, per request.
    Var(Template),
}

/// A compiled `*_pass ADDRESS`, with the module's default directories.
#[derive(Debug)]
pub struct PassAddr {
    pub to: PassTo,
    /// `<prefix>/PREFIX_temp`, used without `PREFIX_temp_path`.
    pub temp_default: std::path::PathBuf,
    /// `<prefix>/client_body_temp`, used without `client_body_temp_path`.
    pub body_temp_default: Arc<crate::http::body::TempDir>,
}

/// `*_pass ADDRESS` (`a`: the address, `temp`: the module's temp
/// directory under the prefix).
pub fn pass_addr(d: &Directive, cx: &mut Compiler, a: &str, temp: &str) -> ConfResult<PassAddr> {
    let to = if a.contains('$') {
        PassTo::Var(cx.template(a, d)?)
    } else {
        PassTo::Static(target(a).map_err(|m| ConfError::at(m, d))?)
    };
    let temp_default = cx.path(temp);
    crate::cache::allow_dir(&temp_default);
    Ok(PassAddr {
        to,
        temp_default,
        body_temp_default: Arc::new(crate::http::body::TempDir::plain(
            cx.path("client_body_temp"),
        )),
    })
}

/// A `*_pass` address as nginx parses it: `unix:PATH`, `HOST:PORT`, or a
/// name without a port (an `upstream` block).
pub fn target(a: &str) -> Result<Target, String> {
    if let Some(path) = a.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(format!("no path in the unix domain socket \"{}\"", a));
        }
        return Ok(Target::Fixed(Arc::new(Upstream::implicit_unix(
            path.into(),
        ))));
    }
    if a.contains("://") {
        return Err(format!("invalid host in upstream \"{}\"", a));
    }
    let port = if a.starts_with('[') {
        a.rsplit_once("]:").map(|(_, p)| p)
    } else {
        a.rsplit_once(':').map(|(_, p)| p)
    };
    match port {
        None => Ok(Target::Named {
            name: a.to_string(),
            // No port: only an upstream block can be meant.
            port: 0,
            resolved: std::sync::OnceLock::new(),
        }),
        Some(p) => {
            if p.parse::<u16>().ok().filter(|p| *p > 0).is_none() {
                return Err(format!("invalid port in upstream \"{}\"", a));
            }
            let addrs: Vec<SocketAddr> =
                a.to_socket_addrs().map(|i| i.collect()).unwrap_or_default();
            if addrs.is_empty() {
                let host = a.rsplit_once(':').map_or(a, |(h, _)| h);
                return Err(format!("host not found in upstream \"{}\"", host));
            }
            Ok(Target::Fixed(Arc::new(Upstream::implicit(a, addrs))))
        }
    }
}

/// nginx's `no port in upstream "NAME"` for a `*_pass NAME` with no
/// `upstream NAME` block. Checked per location once it is compiled:
/// upstream blocks are http-level directives, all applied before any
/// server is compiled. `block` is the location's directives (for the
/// line), `name` the directive's.
pub fn check_pass(
    p: Option<&PassAddr>,
    hm: &HttpMain,
    block: &[Directive],
    name: &str,
) -> ConfResult<()> {
    match p.map(|p| &p.to) {
        Some(PassTo::Static(Target::Named { name: up, .. }))
            if !hm.modules.upstream.upstreams.contains_key(up) =>
        {
            let msg = format!("no port in upstream \"{}\"", up);
            Err(match block.iter().find(|k| k.name == name) {
                Some(d) => ConfError::at(msg, d),
                None => ConfError::new(msg),
            })
        }
        _ => Ok(()),
    }
}

/// The upstream of a `*_pass ADDRESS` for this request.
pub async fn upstream_of(cx: &crate::http::phases::Ctx<'_>, to: &PassTo) -> Option<Arc<Upstream>> {
    use crate::core::log::Level;
    match to {
        PassTo::Static(t @ Target::Fixed(_)) => upstream_for(cx, t, b"").await,
        PassTo::Static(Target::Named { name, .. }) => {
            let u = cx.http.main.modules.upstream.upstreams.get(name).cloned();
            if u.is_none() {
                cx.log(Level::Error, &format!("no port in upstream \"{}\"", name));
            }
            u
        }
        PassTo::Var(t) => {
            let v = t.render_vec(cx);
            upstream_by_value(cx, &String::from_utf8_lossy(&v)).await
        }
    }
}

/// The upstream a `*_pass` with variables names once rendered: an
/// `upstream` block of that name, a unix socket, or `HOST:PORT` (the host
/// resolved by the location's `resolver`).
pub async fn upstream_by_value(
    cx: &crate::http::phases::Ctx<'_>,
    v: &str,
) -> Option<Arc<Upstream>> {
    use crate::core::log::Level;
    if let Some(u) = block_named(cx, v) {
        return Some(u);
    }
    if v.starts_with("unix:") || v.contains("://") {
        return match target(v) {
            Ok(Target::Fixed(u)) => Some(u),
            Ok(Target::Named { .. }) => None,
            Err(m) => {
                cx.log(Level::Error, &m);
                None
            }
        };
    }
    let (host, port) = if v.starts_with('[') {
        match v.rsplit_once("]:") {
            Some((h, p)) => (&v[..h.len() + 1], Some(p)),
            None => (v, None),
        }
    } else {
        match v.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (v, None),
        }
    };
    let Some(port) = port else {
        cx.log(Level::Error, &format!("no port in upstream \"{}\"", v));
        return None;
    };
    let Some(port) = port.parse::<u16>().ok().filter(|p| *p > 0) else {
        cx.log(Level::Error, &format!("invalid port in upstream \"{}\"", v));
        return None;
    };
    upstream_resolved(cx, host, Some(port), port, v).await
}

/// An `upstream` block by name (case-insensitively, as nginx).
fn block_named(cx: &crate::http::phases::Ctx<'_>, name: &str) -> Option<Arc<Upstream>> {
    let ups = &cx.http.main.modules.upstream.upstreams;
    ups.get(name).cloned().or_else(|| {
        ups.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, u)| u.clone())
    })
}

/// The upstream of a host a request evaluated (nginx's `u->resolved`):
/// without a port, an `upstream` block of that name; else the host's
/// addresses by the location's `resolver`, as an implicit upstream named
/// `name`. None: nothing to connect to (logged; answered with 502).
pub async fn upstream_resolved(
    cx: &crate::http::phases::Ctx<'_>,
    host: &str,
    port: Option<u16>,
    default_port: u16,
    name: &str,
) -> Option<Arc<Upstream>> {
    use crate::core::log::Level;
    use crate::http::modules::resolver::{self, Unresolved};
    if port.is_none() {
        if let Some(u) = block_named(cx, host) {
            return Some(u);
        }
    }
    let port = port.unwrap_or(default_port);
    let implicit = &cx.http.main.modules.upstream.implicit;
    if !implicit.is_empty() {
        if let Some(u) = implicit.get(&(host.to_ascii_lowercase(), port)) {
            return Some(u.clone());
        }
    }
    match resolver::resolve(&cx.loc.modules.resolver, host).await {
        Ok(ips) => {
            let addrs = ips
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect();
            Some(Arc::new(Upstream::implicit(name, addrs)))
        }
        Err(Unresolved::NoResolver) => {
            cx.log(
                Level::Error,
                &format!("no resolver defined to resolve {}", host),
            );
            None
        }
        Err(Unresolved::Dns(e)) => {
            cx.log(
                Level::Error,
                &format!("{} could not be resolved ({})", host, e),
            );
            None
        }
    }
}

/// The upstream of a `Target` (`host`: the implicit upstream's name).
pub async fn upstream_for(
    cx: &crate::http::phases::Ctx<'_>,
    target: &Target,
    host: &[u8],
) -> Option<Arc<Upstream>> {
    match target {
        Target::Fixed(u) => Some(u.clone()),
        Target::Named {
            name,
            port,
            resolved,
        } => {
            if let Some(u) = cx.http.main.modules.upstream.upstreams.get(name) {
                return Some(u.clone());
            }
            if let Some(r) = resolved.get() {
                return r.clone();
            }
            // getaddrinfo blocks: tokio runs it on its resolver threads.
            let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((name.as_str(), *port)).await
            {
                Ok(a) => a.collect(),
                Err(_) => Vec::new(),
            };
            let u = if addrs.is_empty() {
                cx.log(
                    crate::core::log::Level::Error,
                    &format!("host not found in upstream \"{}\"", name),
                );
                None
            } else {
                Some(Arc::new(Upstream::implicit(
                    &String::from_utf8_lossy(host),
                    addrs,
                )))
            };
            let _ = resolved.set(u.clone());
            u
        }
    }
}

/// Where a peer listens: a TCP address or a unix-domain socket
/// (`server unix:/path`, `fastcgi_pass unix:/path`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PeerAddr {
    Inet(SocketAddr),
    Unix(std::path::PathBuf),
}

impl std::fmt::Display for PeerAddr {
    /// As nginx prints it (`$upstream_addr`, the error log).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerAddr::Inet(a) => write!(f, "{}", a),
            PeerAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// One configured server of an upstream.
#[derive(Debug)]
pub struct Peer {
    pub addr: PeerAddr,
    /// As nginx prints it in `$upstream_addr` and the error log.
    pub name: String,
    /// The `server` directive's address as written (consistent hashing
    /// places a server by it, as nginx does).
    pub server: String,
    pub weight: i64,
    pub max_fails: u32,
    pub fail_timeout: Duration,
    pub down: bool,
    /// `max_conns=`: active requests at most (0: no limit).
    pub max_conns: u32,
}

#[derive(Debug, Clone, Copy)]
struct PeerState {
    current: i64,
    effective: i64,
    fails: u32,
    /// When the peer last failed (nginx's `accessed`).
    accessed: Option<Instant>,
    /// When the peer last failed, or was picked again after
    /// `fail_timeout` (nginx's `checked`): a success resets the failures
    /// only after such a check, so that failures within `fail_timeout`
    /// add up even with successes between them.
    checked: Option<Instant>,
    /// Requests using the peer now (picked, lease not yet dropped).
    conns: u32,
}

/// The load-balancing method of an upstream.
#[derive(Debug, Default)]
pub enum Balance {
    #[default]
    RoundRobin,
    IpHash,
    Hash {
        key: Template,
        /// Ketama points (hash, index of a primary peer's `server`), sorted;
        /// `None` for plain `hash`.
        points: Option<Vec<(u32, usize)>>,
    },
    LeastConn,
    Random {
        two: bool,
    },
}

impl Balance {
    /// Whether `server ... backup` is allowed with this method.
    fn allows_backup(&self) -> bool {
        matches!(self, Balance::RoundRobin | Balance::LeastConn)
    }
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
    /// `keepalive_time`: how long one connection may be reused; an older
    /// one serves its current request and is closed.
    pub keepalive_time: Duration,
    /// Whether this came from an `upstream` block (affects `$proxy_host`
    /// and error wording only).
    pub explicit: bool,
    pub balance: Balance,
    id: u64,
    state: Mutex<Vec<PeerState>>,
}

/// Which peer a request is using: index into primary then backup peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerId(usize);

/// One request's walk over the peers (which ones it already tried, and
/// where a hashing method is in its sequence).
#[derive(Debug)]
pub struct Attempt {
    tried: Vec<bool>,
    /// ip_hash: the address bytes; hash: the evaluated key.
    input: Vec<u8>,
    hash: u32,
    rehash: u32,
    tries: u32,
}

/// A peer picked for a request; it counts as active for `least_conn`,
/// `random two` and `max_conns=` until this is dropped.
#[derive(Debug)]
pub struct Lease {
    up: Arc<Upstream>,
    id: PeerId,
}

impl Lease {
    pub fn id(&self) -> PeerId {
        self.id
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(s) = self.up.lock().get_mut(self.id.0) {
            s.conns = s.conns.saturating_sub(1);
        }
    }
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
                accessed: None,
                checked: None,
                conns: 0,
            })
            .collect();
        Upstream {
            name,
            peers,
            backup,
            keepalive: 0,
            keepalive_timeout: Duration::from_secs(60),
            keepalive_requests: KEEPALIVE_REQUESTS,
            keepalive_time: Duration::from_secs(3600),
            explicit,
            balance: Balance::RoundRobin,
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
                addr: PeerAddr::Inet(a),
                name: a.to_string(),
                server: name.to_string(),
                weight: 1,
                max_fails: 1,
                fail_timeout: Duration::from_secs(10),
                down: false,
                max_conns: 0,
            })
            .collect();
        Upstream::new(name.to_string(), peers, Vec::new(), false)
    }

    /// The implicit upstream of `fastcgi_pass unix:PATH`: one peer.
    pub fn implicit_unix(path: std::path::PathBuf) -> Upstream {
        let addr = PeerAddr::Unix(path);
        let peer = Peer {
            name: addr.to_string(),
            server: addr.to_string(),
            addr,
            weight: 1,
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
            down: false,
            max_conns: 0,
        };
        Upstream::new(peer.name.clone(), vec![peer], Vec::new(), false)
    }

    pub fn peer(&self, id: PeerId) -> Option<&Peer> {
        self.peers.get(id.0).or_else(|| {
            id.0.checked_sub(self.peers.len())
                .and_then(|i| self.backup.get(i))
        })
    }

    /// A request's walk; `client` is the address `ip_hash` hashes (after
    /// realip), `vars` evaluates a `hash` key.
    pub fn attempt_for(&self, vars: &dyn VarCtx, client: Option<std::net::IpAddr>) -> Attempt {
        let mut at = self.attempt();
        match &self.balance {
            Balance::IpHash => {
                at.hash = 89;
                at.input = match client {
                    Some(std::net::IpAddr::V4(a)) => a.octets()[..3].to_vec(),
                    Some(std::net::IpAddr::V6(a)) => a.octets().to_vec(),
                    // nginx's pseudo address for unix-socket clients.
                    None => vec![0, 0, 0],
                };
            }
            Balance::Hash { key, .. } => at.input = key.render_vec(vars),
            _ => {}
        }
        at
    }

    /// How many peers one request may try (nginx's `peer.tries`: those
    /// not marked `down`).
    pub fn tries(&self) -> usize {
        self.peers
            .iter()
            .chain(self.backup.iter())
            .filter(|p| !p.down)
            .count()
    }

    /// A walk with no request context (round robin and its relatives).
    pub fn attempt(&self) -> Attempt {
        Attempt {
            tried: vec![false; self.peers.len() + self.backup.len()],
            input: Vec::new(),
            hash: 0,
            rehash: 0,
            tries: 0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PeerState>> {
        // A poisoned lock only means a panic elsewhere; the counters stay usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether peer `i` may be picked now by this attempt.
    fn usable(&self, st: &[PeerState], at: &Attempt, i: usize, now: Instant) -> bool {
        let Some(p) = self.peer(PeerId(i)) else {
            return false;
        };
        let Some(s) = st.get(i) else { return false };
        if p.down || at.tried.get(i).copied().unwrap_or(true) {
            return false;
        }
        if p.max_conns > 0 && s.conns >= p.max_conns {
            return false;
        }
        let lone = self.peers.len() == 1 && self.backup.is_empty();
        !(!lone
            && p.max_fails > 0
            && s.fails >= p.max_fails
            && s.checked
                .is_some_and(|c| now.duration_since(c) <= p.fail_timeout))
    }

    /// Picks the next peer for this attempt, or None when none is left
    /// ("no live upstreams").
    pub fn next(self: &Arc<Self>, at: &mut Attempt) -> Option<Lease> {
        let now = Instant::now();
        let mut st = self.lock();
        let primary = 0..self.peers.len();
        let backup = self.peers.len()..self.peers.len() + self.backup.len();
        let single = self.peers.len() == 1;
        let picked = match &self.balance {
            Balance::RoundRobin => self
                .smooth_pick(&mut st, at, primary, now, |_| true)
                .or_else(|| self.smooth_pick(&mut st, at, backup, now, |_| true)),
            Balance::IpHash if !single && at.tries <= 20 => self.hash_walk(&st, at, now, |at| {
                for &b in &at.input {
                    at.hash = (at.hash * 113 + u32::from(b)) % 6271;
                }
                at.hash
            }),
            Balance::Hash { points: None, .. }
                if !single && at.tries <= 20 && !at.input.is_empty() =>
            {
                self.hash_walk(&st, at, now, |at| {
                    let mut h = crc32fast::Hasher::new();
                    if at.rehash > 0 {
                        h.update(at.rehash.to_string().as_bytes());
                    }
                    h.update(&at.input);
                    at.hash = at.hash.wrapping_add((h.finalize() >> 16) & 0x7fff);
                    at.rehash += 1;
                    at.hash
                })
            }
            Balance::Hash {
                points: Some(points),
                ..
            } if !single && !at.input.is_empty() => self.chash_pick(&mut st, at, points, now),
            Balance::LeastConn => self
                .least_conn_pick(&mut st, at, primary, now)
                .or_else(|| self.least_conn_pick(&mut st, at, backup, now)),
            Balance::Random { two } if !single => self.random_pick(&st, at, *two, now),
            // A lone peer, an empty key, or too many tries: round robin.
            _ => self
                .smooth_pick(&mut st, at, primary, now, |_| true)
                .or_else(|| self.smooth_pick(&mut st, at, backup, now, |_| true)),
        }?;
        if let Some(t) = at.tried.get_mut(picked) {
            *t = true;
        }
        st[picked].conns += 1;
        if let Some(p) = self.peer(PeerId(picked)) {
            let s = &mut st[picked];
            if s.checked
                .is_none_or(|c| now.duration_since(c) > p.fail_timeout)
            {
                s.checked = Some(now);
            }
        }
        drop(st);
        Some(Lease {
            up: self.clone(),
            id: PeerId(picked),
        })
    }

    /// nginx's smooth weighted round robin over the usable peers of
    /// `range` that `keep` accepts.
    fn smooth_pick(
        &self,
        st: &mut [PeerState],
        at: &Attempt,
        range: std::ops::Range<usize>,
        now: Instant,
        keep: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let mut best: Option<usize> = None;
        let mut total = 0i64;
        for i in range {
            if !keep(i) || !self.usable(st, at, i, now) {
                continue;
            }
            let weight = self.peer(PeerId(i)).map_or(1, |p| p.weight);
            let s = &mut st[i];
            s.current += s.effective;
            total += s.effective;
            if s.effective < weight {
                s.effective += 1;
            }
            if best.is_none_or(|b| st[i].current > st[b].current) {
                best = Some(i);
            }
        }
        let b = best?;
        st[b].current -= total;
        Some(b)
    }

    /// ip_hash and hash: `step` advances the attempt's hash; the result,
    /// modulo the primary peers' total weight, is walked by weight. After
    /// 20 unusable picks round robin decides.
    fn hash_walk(
        &self,
        st: &[PeerState],
        at: &mut Attempt,
        now: Instant,
        step: impl Fn(&mut Attempt) -> u32,
    ) -> Option<usize> {
        let total: i64 = self.peers.iter().map(|p| p.weight).sum();
        if total <= 0 {
            return None;
        }
        loop {
            let mut w = i64::from(step(at)) % total;
            let mut i = 0;
            while let Some(p) = self.peers.get(i) {
                if w < p.weight {
                    break;
                }
                w -= p.weight;
                i += 1;
            }
            if self.usable(st, at, i, now) {
                return Some(i);
            }
            at.tries += 1;
            if at.tries > 20 {
                break;
            }
        }
        // nginx hands over to round robin here (its tried peers included).
        let mut st = st.to_vec();
        self.smooth_pick(&mut st, at, 0..self.peers.len(), now, |_| true)
    }

    /// `hash ... consistent`: the point at or after the key's CRC32, then
    /// the following points while none of a point's peers is usable.
    fn chash_pick(
        &self,
        st: &mut [PeerState],
        at: &mut Attempt,
        points: &[(u32, usize)],
        now: Instant,
    ) -> Option<usize> {
        if points.is_empty() {
            return None;
        }
        if at.tries == 0 && at.rehash == 0 {
            let key = crc32fast::hash(&at.input);
            at.hash = points.partition_point(|(h, _)| *h < key) as u32;
            at.rehash = 1;
        }
        loop {
            let server = &self
                .peers
                .get(points[at.hash as usize % points.len()].1)?
                .server;
            let picked = self.smooth_pick(st, at, 0..self.peers.len(), now, |i| {
                &self.peers[i].server == server
            });
            if picked.is_some() {
                return picked;
            }
            at.hash = at.hash.wrapping_add(1);
            at.tries += 1;
            if at.tries as usize >= points.len() {
                return None;
            }
        }
    }

    /// Fewest active requests per unit of weight; ties by round robin.
    fn least_conn_pick(
        &self,
        st: &mut [PeerState],
        at: &Attempt,
        range: std::ops::Range<usize>,
        now: Instant,
    ) -> Option<usize> {
        let load = |i: usize, st: &[PeerState]| {
            (
                i64::from(st[i].conns),
                self.peer(PeerId(i)).map_or(1, |p| p.weight),
            )
        };
        let mut best: Option<usize> = None;
        for i in range.clone() {
            if !self.usable(st, at, i, now) {
                continue;
            }
            match best {
                None => best = Some(i),
                Some(b) => {
                    let ((ci, wi), (cb, wb)) = (load(i, st), load(b, st));
                    if ci * wb < cb * wi {
                        best = Some(i);
                    }
                }
            }
        }
        let b = best?;
        let (cb, wb) = load(b, st);
        // The peers as loaded as the best share the pick by weight.
        let tied: Vec<bool> = (0..st.len())
            .map(|i| {
                let (ci, wi) = load(i, st);
                ci * wb == cb * wi
            })
            .collect();
        self.smooth_pick(st, at, range, now, |i| tied[i])
            .or(Some(b))
    }

    /// `random`: a primary peer drawn by weight (up to 20 draws, then
    /// round robin); with `two`, the less loaded of two different draws.
    fn random_pick(
        &self,
        st: &[PeerState],
        at: &Attempt,
        two: bool,
        now: Instant,
    ) -> Option<usize> {
        let total: i64 = self.peers.iter().map(|p| p.weight).sum();
        if total <= 0 {
            return None;
        }
        let draw = || {
            let mut w = (random_u64() % total as u64) as i64;
            let mut i = 0;
            while let Some(p) = self.peers.get(i) {
                if w < p.weight {
                    break;
                }
                w -= p.weight;
                i += 1;
            }
            i
        };
        let mut first: Option<usize> = None;
        for _ in 0..20 {
            let i = draw();
            if !self.usable(st, at, i, now) || first == Some(i) {
                continue;
            }
            let Some(f) = first else {
                if !two {
                    return Some(i);
                }
                first = Some(i);
                continue;
            };
            let (pf, pi) = (&self.peers[f], &self.peers[i]);
            let load_f = i64::from(st[f].conns) * pi.weight;
            let load_i = i64::from(st[i].conns) * pf.weight;
            return Some(if load_i < load_f { i } else { f });
        }
        if first.is_some() {
            return first;
        }
        let mut st = st.to_vec();
        self.smooth_pick(&mut st, at, 0..self.peers.len(), now, |_| true)
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
        let now = Instant::now();
        s.accessed = Some(now);
        s.checked = Some(now);
        if p.max_fails > 0 {
            s.effective -= p.weight / i64::from(p.max_fails);
            s.effective = s.effective.max(0);
            return s.fails == p.max_fails && !(self.peers.len() == 1 && self.backup.is_empty());
        }
        false
    }

    /// Records a success: the failure count starts over if the peer was
    /// checked since its last failure (nginx's `accessed < checked`).
    pub fn succeeded(&self, id: PeerId) {
        if let Some(s) = self.lock().get_mut(id.0) {
            let reset = match (s.accessed, s.checked) {
                (None, _) => true,
                (Some(a), Some(c)) => a < c,
                (Some(_), None) => false,
            };
            if reset {
                s.fails = 0;
            }
        }
    }

    /// An idle cached connection to `peer`, if this worker has one, with
    /// what it has served.
    pub fn take_idle(&self, addr: &PeerAddr) -> Option<(UpStream, Uses)> {
        if self.keepalive == 0 {
            return None;
        }
        IDLE.with(|m| {
            let mut m = m.borrow_mut();
            let list = m.get_mut(&self.id)?;
            let now = Instant::now();
            list.retain(|e| now.duration_since(e.since) < self.keepalive_timeout);
            let i = list.iter().rposition(|e| e.addr == *addr)?;
            let e = list.remove(i);
            Some((e.stream, e.uses))
        })
    }

    /// An idle connection a session kept (see [`KeepTo`]) to `addr`,
    /// plain or TLS as asked, with what it has served.
    pub fn take_idle_session(
        &self,
        addr: &PeerAddr,
        tls: bool,
    ) -> Option<(Box<dyn std::any::Any + Send>, Uses)> {
        if self.keepalive == 0 {
            return None;
        }
        IDLE_SESSIONS.with(|m| {
            let mut m = m.borrow_mut();
            let list = m.get_mut(&self.id)?;
            let now = Instant::now();
            list.retain(|e| now.duration_since(e.since) < self.keepalive_timeout);
            let i = list.iter().rposition(|e| e.addr == *addr && e.tls == tls)?;
            let e = list.remove(i);
            Some((e.conn, e.uses))
        })
    }

    /// Where a session's connection to `addr` goes back (None without
    /// `keepalive`).
    pub fn keep_to(&self, addr: &PeerAddr, tls: bool, uses: Uses) -> Option<KeepTo> {
        (self.keepalive > 0).then(|| KeepTo {
            id: self.id,
            keepalive: self.keepalive,
            keepalive_requests: self.keepalive_requests,
            keepalive_time: self.keepalive_time,
            addr: addr.clone(),
            tls,
            uses,
        })
    }

    /// Caches an idle connection (dropping the oldest beyond
    /// `keepalive`); one that has served `keepalive_requests` or lived
    /// `keepalive_time` is dropped, which closes it.
    pub fn put_idle(&self, addr: PeerAddr, s: UpStream, uses: Uses) {
        if self.keepalive == 0
            || uses.requests >= self.keepalive_requests
            || uses.born.elapsed() > self.keepalive_time
        {
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
                uses,
            });
        });
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

struct Idle {
    addr: PeerAddr,
    stream: UpStream,
    since: Instant,
    uses: Uses,
}

/// What an upstream connection has served: requests (this one included)
/// and since when it is open (`keepalive_requests`, `keepalive_time`).
#[derive(Debug, Clone, Copy)]
pub struct Uses {
    pub requests: u64,
    pub born: Instant,
}

impl Uses {
    /// A connection just opened, carrying its first request.
    pub fn fresh() -> Uses {
        Uses {
            requests: 1,
            born: Instant::now(),
        }
    }

    /// The same connection carrying one more request.
    pub fn next(self) -> Uses {
        Uses {
            requests: self.requests + 1,
            ..self
        }
    }
}

type IdleList = Vec<Idle>;

/// An idle connection of a protocol that runs its own session on it
/// (gRPC's HTTP/2 client): what the session keeps, opaque here.
struct IdleSession {
    addr: PeerAddr,
    tls: bool,
    conn: Box<dyn std::any::Any + Send>,
    since: Instant,
    uses: Uses,
}

thread_local! {
    /// This worker's idle upstream connections, by upstream id.
    static IDLE: RefCell<HashMap<u64, IdleList>> = RefCell::new(HashMap::new());
    /// Likewise for sessions' connections (see [`Upstream::take_idle_session`]).
    static IDLE_SESSIONS: RefCell<HashMap<u64, Vec<IdleSession>>> = RefCell::new(HashMap::new());
}

/// Where a session gives its connection back once its exchange ended
/// cleanly: the upstream's `keepalive` settings, the peer, and what the
/// connection has served.
#[derive(Debug, Clone)]
pub struct KeepTo {
    id: u64,
    keepalive: usize,
    keepalive_requests: u64,
    keepalive_time: Duration,
    pub addr: PeerAddr,
    pub tls: bool,
    pub uses: Uses,
}

impl KeepTo {
    /// Caches the session's connection as [`Upstream::put_idle`] caches a
    /// socket (dropped, which closes it, past `keepalive_requests` or
    /// `keepalive_time`; the oldest goes beyond `keepalive`).
    pub fn put(self, conn: Box<dyn std::any::Any + Send>) {
        if self.keepalive == 0
            || self.uses.requests >= self.keepalive_requests
            || self.uses.born.elapsed() > self.keepalive_time
        {
            return;
        }
        IDLE_SESSIONS.with(|m| {
            let mut m = m.borrow_mut();
            let list = m.entry(self.id).or_default();
            if list.len() >= self.keepalive {
                list.remove(0);
            }
            list.push(IdleSession {
                addr: self.addr,
                tls: self.tls,
                conn,
                since: Instant::now(),
                uses: self.uses,
            });
        });
    }
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

fn set_upstream(hm: &mut HttpMain, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let name = arg(d, 0).to_string();
    if hm.modules.upstream.upstreams.contains_key(&name) {
        return Err(ConfError::at(format!("duplicate upstream \"{}\"", name), d));
    }
    let mut peers = Vec::new();
    let mut backup = Vec::new();
    let mut keepalive = 0usize;
    let mut keepalive_timeout = Duration::from_secs(60);
    let mut keepalive_requests: Option<u64> = None;
    let mut keepalive_time: Option<Duration> = None;
    let mut zone = false;
    let mut balance: Option<Balance> = None;
    let mut consistent = false;
    for k in d.block.as_deref().unwrap_or(&[]) {
        crate::core::conf::lookup(k, ctx::UPS)?;
        let method = match k.name.as_str() {
            "server" => {
                let (list, is_backup) = parse_server(k)?;
                if is_backup {
                    // nginx checks the method chosen so far (a method
                    // named after the backup server does not object).
                    if balance.as_ref().is_some_and(|b| !b.allows_backup()) {
                        return Err(ConfError::at(
                            "balancing method does not support parameter \"backup\"",
                            k,
                        ));
                    }
                    backup.extend(list);
                } else {
                    peers.extend(list);
                }
                None
            }
            "keepalive" => {
                keepalive = value::number(arg(k, 0)).filter(|n| *n > 0).ok_or_else(|| {
                    ConfError::at(
                        format!("invalid value \"{}\" in \"keepalive\" directive", arg(k, 0)),
                        k,
                    )
                })? as usize;
                None
            }
            "keepalive_timeout" => {
                keepalive_timeout = Duration::from_millis(
                    value::time_ms(arg(k, 0))
                        .ok_or_else(|| crate::config::registry::slot_invalid(k))?,
                );
                None
            }
            "keepalive_requests" => {
                let n = value::number(arg(k, 0))
                    .ok_or_else(|| crate::config::registry::slot_invalid_number(k))?;
                crate::config::registry::set_once(&mut keepalive_requests, n, k)?;
                None
            }
            "keepalive_time" => {
                let t = Duration::from_millis(
                    value::time_ms(arg(k, 0))
                        .ok_or_else(|| crate::config::registry::slot_invalid(k))?,
                );
                crate::config::registry::set_once(&mut keepalive_time, t, k)?;
                None
            }
            "zone" => {
                if zone {
                    return Err(crate::config::registry::duplicate(k));
                }
                zone = true;
                if let Some(a) = k.args.get(1) {
                    if value::size(&a.value).is_none() {
                        return Err(ConfError::at(
                            format!("invalid zone size \"{}\"", a.value),
                            k,
                        ));
                    }
                }
                None
            }
            "ip_hash" => Some(Balance::IpHash),
            "least_conn" => Some(Balance::LeastConn),
            "hash" => {
                consistent = match k.args.get(1).map(|a| a.value.as_str()) {
                    None => false,
                    Some("consistent") => true,
                    Some(other) => {
                        return Err(ConfError::at(format!("invalid parameter \"{}\"", other), k))
                    }
                };
                Some(Balance::Hash {
                    key: cx.template(arg(k, 0), k)?,
                    points: None,
                })
            }
            "random" => {
                let words: Vec<&str> = k.args.iter().map(|a| a.value.as_str()).collect();
                match words.as_slice() {
                    [] => Some(Balance::Random { two: false }),
                    ["two"] | ["two", "least_conn"] => Some(Balance::Random { two: true }),
                    ["two", bad] | [bad, ..] => {
                        return Err(ConfError::at(format!("invalid parameter \"{}\"", bad), k))
                    }
                }
            }
            _ => {
                return Err(ConfError::at(
                    format!("\"{}\" directive is not allowed here", k.name),
                    k,
                ))
            }
        };
        if let Some(m) = method {
            if balance.is_some() {
                cx.warnings
                    .push(ConfError::at("load balancing method redefined", k).to_string());
            }
            balance = Some(m);
        }
    }
    if peers.is_empty() {
        return Err(if backup.is_empty() {
            ConfError::at("no servers are inside upstream", d)
        } else {
            ConfError::at(format!("no servers in upstream \"{}\"", name), d)
        });
    }
    let mut balance = balance.unwrap_or_default();
    if let Balance::Hash { points, .. } = &mut balance {
        if consistent {
            *points = Some(ketama_points(&peers));
        }
    }
    let mut u = Upstream::new(name.clone(), peers, backup, true);
    u.keepalive = keepalive;
    u.keepalive_timeout = keepalive_timeout;
    u.keepalive_requests = keepalive_requests.unwrap_or(KEEPALIVE_REQUESTS);
    if let Some(t) = keepalive_time {
        u.keepalive_time = t;
    }
    u.balance = balance;
    hm.modules.upstream.upstreams.insert(name, Arc::new(u));
    Ok(())
}

/// The consistent-hash ring of the primary peers, as nginx builds it: per
/// peer, 160 points per unit of weight, each the CRC32 of the `server`
/// text's host, a NUL byte, its port and the previous point (little-endian);
/// sorted, duplicates dropped.
fn ketama_points(peers: &[Peer]) -> Vec<(u32, usize)> {
    let mut points = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let (host, port) = split_server(&p.server);
        let mut base = crc32fast::Hasher::new();
        base.update(host.as_bytes());
        base.update(&[0]);
        base.update(port.as_bytes());
        let mut prev = 0u32;
        for _ in 0..p.weight.max(0) * 160 {
            let mut h = base.clone();
            h.update(&prev.to_le_bytes());
            prev = h.finalize();
            points.push((prev, i));
        }
    }
    points.sort_by_key(|(h, _)| *h);
    points.dedup_by_key(|(h, _)| *h);
    points
}

/// A `server` address split as nginx does for hashing: `unix:PATH` is all
/// host; otherwise a trailing `:DIGITS` is the port.
fn split_server(s: &str) -> (&str, &str) {
    if s.len() >= 5 && s[..5].eq_ignore_ascii_case("unix:") {
        return (&s[5..], "");
    }
    match s.rfind(':') {
        Some(c) if !s[c + 1..].is_empty() && s[c + 1..].bytes().all(|b| b.is_ascii_digit()) => {
            (&s[..c], &s[c + 1..])
        }
        _ => (s, ""),
    }
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
    let (mut weight, mut max_fails, mut fail_timeout) = (1i64, 1u32, Duration::from_secs(10));
    let (mut is_backup, mut down, mut max_conns) = (false, false, 0u32);
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
        } else if let Some(v) = a.strip_prefix("max_conns=") {
            max_conns = value::number(v)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad(a))?;
        } else if a == "backup" {
            is_backup = true;
        } else if a == "down" {
            down = true;
        } else {
            return Err(bad(a));
        }
    }
    let addrs = match addr.strip_prefix("unix:") {
        Some(path) => vec![PeerAddr::Unix(path.into())],
        None => resolve(&hostport, d, "upstream")?
            .into_iter()
            .map(PeerAddr::Inet)
            .collect(),
    };
    let peers = addrs
        .into_iter()
        .map(|a| Peer {
            name: a.to_string(),
            addr: a,
            server: addr.to_string(),
            weight,
            max_fails,
            fail_timeout,
            down,
            max_conns,
        })
        .collect();
    Ok((peers, is_backup))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(weights: &[i64]) -> Arc<Upstream> {
        let peers = weights
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let addr: SocketAddr = format!("127.0.0.1:{}", 1000 + i).parse().unwrap();
                Peer {
                    addr: PeerAddr::Inet(addr),
                    name: addr.to_string(),
                    server: addr.to_string(),
                    weight: *w,
                    max_fails: 1,
                    fail_timeout: Duration::from_secs(10),
                    down: false,
                    max_conns: 0,
                }
            })
            .collect();
        Arc::new(Upstream::new("u".into(), peers, Vec::new(), true))
    }

    #[test]
    fn smooth_weighted_round_robin() {
        let u = up(&[5, 1, 1]);
        let picks: Vec<usize> = (0..7)
            .map(|_| u.next(&mut u.attempt()).unwrap().id().0)
            .collect();
        // nginx's documented sequence for weights 5,1,1: a a b a c a a.
        assert_eq!(picks, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn failover_skips_tried_and_failed_peers() {
        let u = up(&[1, 1]);
        let mut at = u.attempt();
        let a = u.next(&mut at).unwrap().id();
        assert!(u.failed(a));
        let b = u.next(&mut at).unwrap().id();
        assert_ne!(a, b);
        assert!(u.next(&mut at).is_none());
        // The failed peer is down for fail_timeout: new requests avoid it.
        for _ in 0..3 {
            assert_eq!(u.next(&mut u.attempt()).map(|l| l.id()), Some(b));
        }
    }
}
