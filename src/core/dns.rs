//! A small asynchronous DNS client: what nginx's `resolver` does for a
//! `*_pass` with variables that names a host, and for the mail module's
//! look-up of a client's name.
//!
//! Written here rather than taken from a general resolver crate because
//! nginx's semantics are narrow and specific: exactly the servers the
//! `resolver` directive lists (never `/etc/resolv.conf`, no search
//! domains), A and AAAA queries (`ipv4=`/`ipv6=`) and PTR ones, answers
//! kept for their TTL or `valid=`, errors never kept, and the order in
//! which servers are asked, the answers combined and the errors named
//! (`(3: Host not found)`, `(110: Operation timed out)`) as nginx's
//! `ngx_resolver.c`.
//!
//! # A lookup
//!
//! ```text
//! resolve(name)
//!   ├─ cached, not expired: addresses ─────────────────▶ done (rotated)
//!   │                       CNAME ──▶ resolve(its target)
//!   └─ ask: A (and AAAA) to server i (i: the resolver's next server,
//!      │    round robin per new query, as nginx's last_connection)
//!      ├─ an answer with TC set ── that query again over TCP, same server
//!      ├─ FORMERR, a wrong id, a malformed answer ── ignored (logged)
//!      ├─ both answered ── addresses (A first) ─────▶ cached, done
//!      │                   an error in either ─────▶ the error (not cached)
//!      │                   no address, a CNAME ────▶ cached, resolve(it)
//!      ├─ 5 s passed: the unanswered queries again to server i+1
//!      └─ resolver_timeout passed ─────────────────▶ 110 timed out
//! ```
//!
//! Runs on the worker's event loop (tokio's sockets); nothing blocks. A
//! TCP query runs in a task of its own that hands the answers back and
//! ends with the lookup. The cache is shared by the workers (one
//! process), keyed by the name in lower case; an entry is replaced when
//! it expires. Lookups of one name at once are one query, as nginx's
//! (its `rn->waiting`): the first asks ([`Cache::turn`]), the others,
//! whichever worker they run on, wait for its answer within their own
//! `resolver_timeout`; should the first give up (its request ended), a
//! waiter asks for itself.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::{mpsc, watch};

/// How long one server is waited for before the query goes to the next
/// (nginx's resend_timeout).
const RESEND: Duration = Duration::from_secs(5);
/// CNAMEs followed at most (nginx's NGX_RESOLVER_MAX_RECURSION).
const MAX_RECURSION: usize = 50;
/// The largest UDP answer read (nginx's NGX_RESOLVER_UDP_SIZE).
const UDP_SIZE: usize = 4096;

const TYPE_A: u16 = 1;
const TYPE_CNAME: u16 = 5;
const TYPE_PTR: u16 = 12;
const TYPE_AAAA: u16 = 28;
const TYPE_DNAME: u16 = 39;

const FORMERR: u8 = 1;
const NXDOMAIN: u8 = 3;
const REFUSED: u8 = 5;

/// Why a name was not resolved, as nginx reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// A DNS response code (1 format error, 2 server failure, 3 not
    /// found, 4 unimplemented, 5 refused, ...).
    Rcode(u8),
    /// No answer within `resolver_timeout` (nginx's ETIMEDOUT).
    TimedOut,
}

fn rcode_text(c: u8) -> &'static str {
    match c {
        1 => "Format error",
        2 => "Server failure",
        3 => "Host not found",
        4 => "Unimplemented",
        5 => "Operation refused",
        _ => "Unknown error",
    }
}

impl std::fmt::Display for Error {
    /// `3: Host not found`, as nginx's `ngx_resolver_strerror`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::TimedOut => write!(f, "110: Operation timed out"),
            Error::Rcode(c) => write!(f, "{}: {}", c, rcode_text(*c)),
        }
    }
}

impl Error {
    /// "Not found" (nginx's NGX_RESOLVE_NXDOMAIN), as opposed to a
    /// failure that may pass (the mail module's `[UNAVAILABLE]` against
    /// `[TEMPUNAVAIL]`).
    pub fn not_found(self) -> bool {
        self == Error::Rcode(NXDOMAIN)
    }
}

/// What a lookup asks for.
#[derive(Debug, Clone)]
pub struct Query<'a> {
    pub servers: &'a [SocketAddr],
    /// `valid=`: how long answers are kept, instead of their TTL.
    pub valid: Option<u64>,
    pub ipv4: bool,
    pub ipv6: bool,
    /// `resolver_timeout`.
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
enum Value {
    Addrs(Vec<IpAddr>),
    /// The name is an alias of this one (looked up in turn).
    Cname(String),
    /// The name of an address (PTR).
    Name(String),
}

struct Entry {
    value: Value,
    until: Instant,
}

/// What a lookup under way will settle, for those waiting on it.
type Settled = Option<Result<Got, Error>>;

/// Answers kept for their TTL, and which server a new query goes to
/// first (one per `resolver` line, as nginx's resolver object).
#[derive(Default)]
pub struct Cache {
    map: Mutex<HashMap<String, Entry>>,
    /// nginx's last_connection: each new query starts at the next server.
    next: AtomicUsize,
    /// Lookups under way, by name and query types.
    asking: Mutex<HashMap<String, watch::Receiver<Settled>>>,
}

/// Whose turn it is to ask for a name.
enum Turn<'c> {
    /// Nobody is asking: this lookup asks, and tells the others.
    Ask(Asking<'c>),
    /// Another lookup is asking: its answer will come here.
    Wait(watch::Receiver<Settled>),
}

/// The lookup that asks for a name; it leaves the table of lookups under
/// way when it ends, answered or not (then its waiters see the channel
/// closed and ask for themselves).
struct Asking<'c> {
    cache: &'c Cache,
    key: String,
    tx: watch::Sender<Settled>,
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        let mut asking = self.cache.asking.lock().unwrap_or_else(|e| e.into_inner());
        if asking
            .get(&self.key)
            .is_some_and(|rx| rx.same_channel(&self.tx.subscribe()))
        {
            asking.remove(&self.key);
        }
    }
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dns::Cache")
    }
}

impl Cache {
    fn get(&self, key: &str) -> Option<Value> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.get(key)?;
        (Instant::now() < e.until).then(|| e.value.clone())
    }

    fn put(&self, key: String, value: Value, secs: u64) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // Expired entries go when the map grows, so it stays bounded by
        // the names in use.
        if map.len() >= 1024 {
            let now = Instant::now();
            map.retain(|_, e| e.until > now);
        }
        map.insert(
            key,
            Entry {
                value,
                until: Instant::now() + Duration::from_secs(secs),
            },
        );
    }

    /// Whether this lookup of `key` asks, or waits for one under way.
    fn turn(&self, key: String) -> Turn<'_> {
        let mut asking = self.asking.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rx) = asking.get(&key) {
            // A closed channel is a lookup that gave up: ask anew.
            if rx.has_changed().is_ok() {
                return Turn::Wait(rx.clone());
            }
        }
        let (tx, rx) = watch::channel(None);
        asking.insert(key.clone(), rx);
        Turn::Ask(Asking {
            cache: self,
            key,
            tx,
        })
    }

    /// The server a new query is sent to first.
    fn first_server(&self, n: usize) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % n.max(1)
    }
}

/// A random number (for query ids and the rotation of answers).
fn random() -> u64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// The addresses of `name`. A fresh answer keeps the server's order; one
/// from the cache is rotated by a random offset, so that later requests
/// spread over the addresses (nginx's `ngx_resolver_export`, which
/// rotates only cached names: a first lookup's peers are tried in the
/// order the server gave, which `proxy_next_upstream_tries` relies on).
pub async fn resolve(q: &Query<'_>, cache: &Cache, name: &str) -> Result<Vec<IpAddr>, Error> {
    if q.servers.is_empty() {
        return Err(Error::Rcode(2));
    }
    let deadline = Instant::now() + q.timeout;
    let mut name = name.trim_end_matches('.').to_ascii_lowercase();
    let mut types = Vec::with_capacity(2);
    if q.ipv4 {
        types.push(TYPE_A);
    }
    if q.ipv6 {
        types.push(TYPE_AAAA);
    }
    for _ in 0..=MAX_RECURSION {
        match cache.get(&name) {
            Some(Value::Addrs(mut a)) => {
                if a.len() > 1 {
                    let n = (random() % a.len() as u64) as usize;
                    a.rotate_left(n);
                }
                return Ok(a);
            }
            Some(Value::Cname(c)) => {
                name = c;
                continue;
            }
            _ => {}
        }
        let valid = |ttl: u32| q.valid.unwrap_or(u64::from(ttl));
        match asked(q, cache, &name, &types, deadline).await? {
            Got::Addrs(a, ttl) => {
                cache.put(name, Value::Addrs(a.clone()), valid(ttl));
                return Ok(a);
            }
            Got::Cname(c, ttl) => {
                let c = c.to_ascii_lowercase();
                cache.put(name, Value::Cname(c.clone()), valid(ttl));
                name = c;
            }
            Got::Name(..) => return Err(Error::Rcode(NXDOMAIN)),
        }
    }
    Err(Error::Rcode(NXDOMAIN))
}

/// The name of `ip` (a PTR query: `d.c.b.a.in-addr.arpa`, or the
/// nibbles of an IPv6 address under `ip6.arpa`), kept for its TTL.
pub async fn resolve_addr(q: &Query<'_>, cache: &Cache, ip: IpAddr) -> Result<String, Error> {
    if q.servers.is_empty() {
        return Err(Error::Rcode(2));
    }
    let ip = canonical(ip);
    // A key no host name can be.
    let key = format!("\0ptr {}", ip);
    if let Some(Value::Name(n)) = cache.get(&key) {
        return Ok(n);
    }
    let deadline = Instant::now() + q.timeout;
    match asked(q, cache, &reverse_name(ip), &[TYPE_PTR], deadline).await? {
        Got::Name(n, ttl) => {
            cache.put(
                key,
                Value::Name(n.clone()),
                q.valid.unwrap_or(u64::from(ttl)),
            );
            Ok(n)
        }
        _ => Err(Error::Rcode(NXDOMAIN)),
    }
}

/// What one round of queries for `name` settles: asked by this lookup,
/// or by another one of the same name under way (see [`Cache::turn`]).
/// The answer is cached by the caller, so a waiter's copy changes nothing.
async fn asked(
    q: &Query<'_>,
    cache: &Cache,
    name: &str,
    types: &[u16],
    deadline: Instant,
) -> Result<Got, Error> {
    let mut key = String::with_capacity(name.len() + 12);
    key.push_str(name);
    for t in types {
        key.push_str(&format!("\0{}", t));
    }
    match cache.turn(key) {
        Turn::Ask(asking) => {
            let r = ask(q, cache, name, types, deadline).await;
            asking.tx.send_replace(Some(r.clone()));
            r
        }
        Turn::Wait(mut rx) => loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                return r;
            }
            match tokio::time::timeout_at(deadline.into(), rx.changed()).await {
                Err(_) => return Err(Error::TimedOut),
                Ok(Ok(())) => {}
                // The one asking gave up unanswered: ask for ourselves.
                Ok(Err(_)) => match rx.borrow().clone() {
                    Some(r) => return r,
                    None => return ask(q, cache, name, types, deadline).await,
                },
            }
        },
    }
}

/// An IPv4 address mapped into IPv6 is the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// The name a PTR query asks about.
fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            format!("{}.{}.{}.{}.in-addr.arpa", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(a) => {
            let mut s = String::with_capacity(72);
            for b in a.octets().iter().rev() {
                s.push_str(&format!("{:x}.{:x}.", b & 0xf, b >> 4));
            }
            s.push_str("ip6.arpa");
            s
        }
    }
}

/// What one round of queries for a name settled.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    /// The addresses (A before AAAA) and the smallest TTL of the answers.
    Addrs(Vec<IpAddr>, u32),
    /// An alias, with the smallest TTL.
    Cname(String, u32),
    /// A PTR answer.
    Name(String, u32),
}

/// One query of a round: its type, id, packet, whether it goes over TCP
/// (its UDP answer was truncated), and its answer once in.
struct Sent {
    qtype: u16,
    id: u16,
    packet: Vec<u8>,
    tcp: bool,
    answer: Option<Vec<IpAddr>>,
}

/// The state of a round besides its queries (nginx's rn->code, rn->ttl).
struct Round {
    name: String,
    sent: Vec<Sent>,
    /// An error one query got while the other was still out.
    code: u8,
    /// The smallest TTL among the records read.
    ttl: u32,
}

/// What an answer does to a round.
#[derive(Debug, PartialEq)]
enum Step {
    Wait,
    /// Query `sent[i]` again over TCP (its answer was truncated).
    Tcp(usize),
    Done(Result<Got, Error>),
}

/// The UDP socket of a round: one for every server (a dual-stack one
/// when the servers mix address families).
struct Udp {
    sock: UdpSocket,
    mapped: bool,
}

impl Udp {
    async fn bind(servers: &[SocketAddr]) -> Option<Udp> {
        let v4 = servers.iter().any(SocketAddr::is_ipv4);
        let v6 = servers.iter().any(SocketAddr::is_ipv6);
        let bind: SocketAddr = if v6 {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        };
        let sock = UdpSocket::bind(bind).await.ok()?;
        Some(Udp {
            sock,
            mapped: v4 && v6,
        })
    }

    async fn send(&self, p: &[u8], to: SocketAddr) -> bool {
        let to = match (self.mapped, to) {
            (true, SocketAddr::V4(a)) => {
                SocketAddr::new(IpAddr::V6(a.ip().to_ipv6_mapped()), a.port())
            }
            _ => to,
        };
        matches!(self.sock.send_to(p, to).await, Ok(n) if n == p.len())
    }
}

/// A TCP connection to one server, run by a task of its own: queries go
/// in over `tx`, each answer comes back over the round's channel. The
/// task ends with the round.
struct TcpLink {
    server: usize,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TcpLink {
    fn open(server: usize, to: SocketAddr, answers: mpsc::UnboundedSender<Vec<u8>>) -> TcpLink {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(tcp_task(to, rx, answers));
        TcpLink { server, tx, task }
    }
}

async fn tcp_task(
    to: SocketAddr,
    mut queries: mpsc::UnboundedReceiver<Vec<u8>>,
    answers: mpsc::UnboundedSender<Vec<u8>>,
) {
    let Ok(Ok(s)) = tokio::time::timeout(RESEND, TcpStream::connect(to)).await else {
        return;
    };
    let (mut r, mut w) = s.into_split();
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 4096];
    loop {
        tokio::select! {
            q = queries.recv() => {
                let Some(q) = q else { return };
                let Ok(len) = u16::try_from(q.len()) else { continue };
                let mut frame = len.to_be_bytes().to_vec();
                frame.extend_from_slice(&q);
                if w.write_all(&frame).await.is_err() {
                    return;
                }
            }
            n = r.read(&mut chunk) => {
                let n = match n {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                while buf.len() >= 2 {
                    let len = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
                    if buf.len() < 2 + len {
                        break;
                    }
                    if answers.send(buf[2..2 + len].to_vec()).is_err() {
                        return;
                    }
                    buf.drain(..2 + len);
                }
            }
        }
    }
}

/// Sends the queries still unanswered to server `i`, each over UDP or
/// over TCP if its UDP answer came truncated. False if a send failed.
async fn send_round(
    round: &Round,
    servers: &[SocketAddr],
    i: usize,
    udp: &Option<Udp>,
    links: &mut Vec<TcpLink>,
    answers: &mpsc::UnboundedSender<Vec<u8>>,
) -> bool {
    let mut ok = true;
    for s in round.sent.iter().filter(|s| s.answer.is_none()) {
        if s.tcp {
            send_tcp(&s.packet, servers, i, links, answers);
        } else {
            match udp {
                Some(u) => ok &= u.send(&s.packet, servers[i]).await,
                None => ok = false,
            }
        }
    }
    ok
}

fn send_tcp(
    packet: &[u8],
    servers: &[SocketAddr],
    i: usize,
    links: &mut Vec<TcpLink>,
    answers: &mpsc::UnboundedSender<Vec<u8>>,
) {
    if let Some(l) = links.iter().find(|l| l.server == i) {
        if l.tx.send(packet.to_vec()).is_ok() && !l.task.is_finished() {
            return;
        }
    }
    links.retain(|l| l.server != i);
    let l = TcpLink::open(i, servers[i], answers.clone());
    let _ = l.tx.send(packet.to_vec());
    links.push(l);
}

/// Sends one query per type for `name` and reads the answers until they
/// settle the round, resending what is unanswered to the next server
/// every [`RESEND`] until `deadline`.
async fn ask(
    q: &Query<'_>,
    cache: &Cache,
    name: &str,
    types: &[u16],
    deadline: Instant,
) -> Result<Got, Error> {
    let servers = q.servers;
    let n = servers.len();
    let mut cur = cache.first_server(n);
    let base = random();
    let mut round = Round {
        name: name.to_string(),
        sent: types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let id = (base >> (16 * i)) as u16;
                Sent {
                    qtype: *t,
                    id,
                    packet: query(id, name, *t),
                    tcp: false,
                    answer: None,
                }
            })
            .collect(),
        code: 0,
        ttl: u32::MAX,
    };
    let udp = Udp::bind(servers).await;
    let (answers_tx, mut answers) = mpsc::unbounded_channel::<Vec<u8>>();
    let mut links: Vec<TcpLink> = Vec::new();
    if !send_round(&round, servers, cur, &udp, &mut links, &answers_tx).await {
        // nginx retries a failed send once, at the next server.
        cur = (cur + 1) % n;
        send_round(&round, servers, cur, &udp, &mut links, &answers_tx).await;
    }
    let mut resend_at = Instant::now() + RESEND;
    let mut buf = vec![0u8; UDP_SIZE];
    loop {
        enum Ev {
            Udp(usize, SocketAddr),
            Tcp(Vec<u8>),
            Timer,
        }
        let wake = resend_at.min(deadline);
        let ev = tokio::select! {
            r = async {
                match &udp {
                    Some(u) => u.sock.recv_from(&mut buf).await,
                    None => std::future::pending().await,
                }
            } => match r {
                Ok((len, from)) => Ev::Udp(len, from),
                // An ICMP error on the socket: the answer is awaited still.
                Err(_) => continue,
            },
            Some(m) = answers.recv() => Ev::Tcp(m),
            () = tokio::time::sleep_until(wake.into()) => Ev::Timer,
        };
        let step = match ev {
            Ev::Timer => {
                if Instant::now() >= deadline {
                    return Err(Error::TimedOut);
                }
                cur = (cur + 1) % n;
                send_round(&round, servers, cur, &udp, &mut links, &answers_tx).await;
                resend_at = Instant::now() + RESEND;
                continue;
            }
            Ev::Udp(len, from) => {
                let from = SocketAddr::new(canonical(from.ip()), from.port());
                if !servers.contains(&from) {
                    continue;
                }
                process(&buf[..len], false, &mut round)
            }
            Ev::Tcp(m) => process(&m, true, &mut round),
        };
        match step {
            Step::Wait => {}
            Step::Tcp(i) => {
                round.sent[i].tcp = true;
                send_tcp(&round.sent[i].packet, servers, cur, &mut links, &answers_tx);
                resend_at = Instant::now() + RESEND;
            }
            Step::Done(r) => return r,
        }
    }
}

/// nginx's error lines of the resolver (the cycle's log, level error).
macro_rules! rlog {
    ($($arg:tt)*) => {
        crate::elog!(Error, $($arg)*)
    };
}

fn u16_at(m: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*m.get(at)?, *m.get(at + 1)?]))
}

/// One answer for a round, as nginx's `ngx_resolver_process_response`.
fn process(m: &[u8], tcp: bool, round: &mut Round) -> Step {
    let short = || {
        rlog!("short DNS response");
        Step::Wait
    };
    if m.len() < 12 {
        return short();
    }
    let (Some(id), Some(flags), Some(nqs), Some(nan)) =
        (u16_at(m, 0), u16_at(m, 2), u16_at(m, 4), u16_at(m, 6))
    else {
        return short();
    };
    let trunc = flags & 0x0200 != 0;
    if flags & 0xf870 != 0x8000 || (trunc && tcp) {
        rlog!(
            "invalid {} DNS response {} fl:{:04X}",
            if tcp { "TCP" } else { "UDP" },
            id,
            flags
        );
        return Step::Wait;
    }
    let code = (flags & 0xf) as u8;
    if code == FORMERR {
        // A query the server could not parse is sent again later.
        if round.sent.iter().any(|s| s.id == id) {
            rlog!(
                "DNS error ({}: {}), query id:{}, name:\"{}\"",
                code,
                rcode_text(code),
                id,
                round.name
            );
        } else {
            rlog!(
                "DNS error ({}: {}), query id:{}",
                code,
                rcode_text(code),
                id
            );
        }
        return Step::Wait;
    }
    if code > REFUSED {
        rlog!(
            "DNS error ({}: {}), query id:{}",
            code,
            rcode_text(code),
            id
        );
        return Step::Wait;
    }
    if nqs != 1 {
        rlog!("invalid number of questions in DNS response");
        return Step::Wait;
    }
    // The question: plain labels (no compression), not empty.
    let mut i = 12;
    let mut qname = String::new();
    loop {
        let Some(&len) = m.get(i) else {
            return short();
        };
        if len & 0xc0 != 0 {
            rlog!("unexpected compression pointer in DNS response");
            return Step::Wait;
        }
        if len == 0 {
            break;
        }
        let Some(label) = m.get(i + 1..i + 1 + usize::from(len)) else {
            return short();
        };
        if !qname.is_empty() {
            qname.push('.');
        }
        qname.push_str(&String::from_utf8_lossy(label));
        i += 1 + usize::from(len);
    }
    if i == 12 {
        rlog!("zero-length domain name in DNS response");
        return Step::Wait;
    }
    i += 1;
    if i + 4 + usize::from(nan) * 12 > m.len() {
        return short();
    }
    let (Some(qtype), Some(qclass)) = (u16_at(m, i), u16_at(m, i + 2)) else {
        return short();
    };
    if qclass != 1 {
        rlog!("unknown query class {} in DNS response", qclass);
        return Step::Wait;
    }
    if !matches!(qtype, TYPE_A | TYPE_AAAA | TYPE_PTR) {
        rlog!("unknown query type {} in DNS response", qtype);
        return Step::Wait;
    }
    let which = round.sent.iter().position(|s| s.qtype == qtype);
    let Some(k) = which.filter(|_| qname.eq_ignore_ascii_case(&round.name)) else {
        rlog!("unexpected DNS response for {}", qname.to_ascii_lowercase());
        return Step::Wait;
    };
    if round.sent[k].answer.is_some() {
        rlog!("unexpected DNS response for {}", qname.to_ascii_lowercase());
        return Step::Wait;
    }
    if trunc && round.sent[k].tcp {
        return Step::Wait;
    }
    if id != round.sent[k].id {
        rlog!(
            "wrong ident {} in DNS response for {}, expect {}",
            id,
            qname.to_ascii_lowercase(),
            round.sent[k].id
        );
        return Step::Wait;
    }
    if trunc {
        return Step::Tcp(k);
    }
    let at = i + 4;
    if qtype == TYPE_PTR {
        process_ptr(m, at, code, nan)
    } else {
        process_a(m, at, code, nan, k, round)
    }
}

/// One resource record's header: its type, class, TTL, data length and
/// where its data starts. Err: the answer is malformed (logged).
fn record(m: &[u8], at: &mut usize) -> Result<(u16, u16, u32, usize, usize), ()> {
    let short = || {
        rlog!("short DNS response");
    };
    let start = *at;
    loop {
        let Some(&len) = m.get(*at) else {
            short();
            return Err(());
        };
        if len & 0xc0 != 0 {
            *at += 2;
            break;
        }
        if len == 0 {
            *at += 1;
            if *at - start < 2 {
                rlog!("invalid name in DNS response");
                return Err(());
            }
            break;
        }
        *at += 1 + usize::from(len);
    }
    // nginx wants at least one byte after the record's header.
    if *at + 10 >= m.len() {
        short();
        return Err(());
    }
    let (Some(t), Some(class), Some(len)) =
        (u16_at(m, *at), u16_at(m, *at + 2), u16_at(m, *at + 8))
    else {
        short();
        return Err(());
    };
    let raw = u32::from_be_bytes([m[*at + 4], m[*at + 5], m[*at + 6], m[*at + 7]]);
    // A negative TTL counts as 0.
    let ttl = if raw > i32::MAX as u32 { 0 } else { raw };
    if class != 1 {
        rlog!("unexpected RR class {} in DNS response", class);
        return Err(());
    }
    let data = *at + 10;
    *at = data + usize::from(len);
    Ok((t, class, ttl, usize::from(len), data))
}

/// An A or AAAA answer, combined with the other type's as nginx's
/// `ngx_resolver_process_a`: an error in either is the round's error;
/// "no records" in both is "not found"; addresses in either are the
/// answer; else the CNAME of the answer read last is followed.
fn process_a(m: &[u8], ans: usize, code: u8, nan: u16, k: usize, round: &mut Round) -> Step {
    let mut code = code;
    if code == 0 && round.code != 0 {
        code = round.code;
    }
    let other_out = round
        .sent
        .iter()
        .enumerate()
        .any(|(j, s)| j != k && s.answer.is_none());
    if code == 0 && nan == 0 {
        round.sent[k].answer = Some(Vec::new());
        if other_out {
            return Step::Wait;
        }
        if let Some(a) = export(round) {
            return Step::Done(Ok(a));
        }
        code = NXDOMAIN;
    }
    if code != 0 {
        round.sent[k].answer = Some(Vec::new());
        if other_out {
            round.code = code;
            return Step::Wait;
        }
        return Step::Done(Err(Error::Rcode(code)));
    }
    let qtype = round.sent[k].qtype;
    let mut at = ans;
    let mut addrs = Vec::new();
    let mut cname = None;
    for _ in 0..nan {
        let Ok((t, _, ttl, len, data)) = record(m, &mut at) else {
            return Step::Wait;
        };
        round.ttl = round.ttl.min(ttl);
        match t {
            TYPE_A | TYPE_AAAA => {
                let (want, size) = if t == TYPE_A { ("A", 4) } else { ("AAAA", 16) };
                if qtype != t {
                    rlog!("unexpected {} record in DNS response", want);
                    return Step::Wait;
                }
                if len != size {
                    rlog!("invalid {} record in DNS response", want);
                    return Step::Wait;
                }
                let Some(b) = m.get(data..data + size) else {
                    rlog!("short DNS response");
                    return Step::Wait;
                };
                addrs.push(match <[u8; 16]>::try_from(b) {
                    Ok(b16) => IpAddr::V6(Ipv6Addr::from(b16)),
                    Err(_) => IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])),
                });
            }
            TYPE_CNAME => cname = Some(data),
            TYPE_DNAME => {}
            _ => rlog!("unexpected RR type {} in DNS response", t),
        }
    }
    let found = !addrs.is_empty();
    round.sent[k].answer = Some(addrs);
    if other_out {
        if found {
            return Step::Wait;
        }
    } else if let Some(a) = export(round) {
        return Step::Done(Ok(a));
    }
    if let Some(c) = cname {
        if other_out {
            return Step::Wait;
        }
        return match read_name(m, c) {
            Some((n, _)) => Step::Done(Ok(Got::Cname(n, round.ttl))),
            None => Step::Wait,
        };
    }
    rlog!("no A or CNAME types in DNS response");
    Step::Wait
}

/// The addresses of a round whose queries are all answered, A first (None
/// if there are none).
fn export(round: &Round) -> Option<Got> {
    let mut all = Vec::new();
    for t in [TYPE_A, TYPE_AAAA] {
        for s in round.sent.iter().filter(|s| s.qtype == t) {
            all.extend(s.answer.iter().flatten().copied());
        }
    }
    let ttl = if round.ttl == u32::MAX { 0 } else { round.ttl };
    (!all.is_empty()).then_some(Got::Addrs(all, ttl))
}

/// A PTR answer, as nginx's `ngx_resolver_process_ptr`: the first PTR
/// record's name (CNAMEs are passed over).
fn process_ptr(m: &[u8], ans: usize, code: u8, nan: u16) -> Step {
    let code = if code == 0 && nan == 0 {
        NXDOMAIN
    } else {
        code
    };
    if code != 0 {
        return Step::Done(Err(Error::Rcode(code)));
    }
    let mut at = ans;
    for _ in 0..nan {
        let Ok((t, _, ttl, _, data)) = record(m, &mut at) else {
            return Step::Wait;
        };
        match t {
            TYPE_PTR => {
                return match read_name(m, data) {
                    Some((n, _)) if !n.is_empty() => Step::Done(Ok(Got::Name(n, ttl))),
                    _ => Step::Wait,
                };
            }
            TYPE_CNAME => {}
            _ => rlog!("unexpected RR type {} in DNS response", t),
        }
    }
    rlog!("no PTR type in DNS response");
    Step::Wait
}

/// A query for `name` of type `t`, recursion desired.
fn query(id: u16, name: &str, t: u16) -> Vec<u8> {
    let mut p = Vec::with_capacity(name.len() + 18);
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        let l = &label.as_bytes()[..label.len().min(63)];
        p.push(l.len() as u8);
        p.extend_from_slice(l);
    }
    p.push(0);
    p.extend_from_slice(&t.to_be_bytes());
    p.extend_from_slice(&1u16.to_be_bytes());
    p
}

/// A name at `at` (with compression pointers) and the offset after it.
fn read_name(m: &[u8], mut at: usize) -> Option<(String, usize)> {
    let mut out = String::new();
    let mut end = None;
    for _ in 0..128 {
        let len = *m.get(at)? as usize;
        if len == 0 {
            return Some((out, end.unwrap_or(at + 1)));
        }
        if len & 0xc0 == 0xc0 {
            let ptr = ((len & 0x3f) << 8) | *m.get(at + 1)? as usize;
            end.get_or_insert(at + 2);
            at = ptr;
            continue;
        }
        let label = m.get(at + 1..at + 1 + len)?;
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(&String::from_utf8_lossy(label));
        at += 1 + len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as a server writes it: the question, then `records`
    /// (type, ttl, rdata) named by a pointer to the question's name.
    fn answer(id: u16, flags: u16, name: &str, t: u16, records: &[(u16, u32, Vec<u8>)]) -> Vec<u8> {
        let mut m = query(id, name, t);
        m[2..4].copy_from_slice(&flags.to_be_bytes());
        m[7] = records.len() as u8;
        for (rt, ttl, data) in records {
            m.extend_from_slice(&[0xc0, 0x0c]);
            m.extend_from_slice(&rt.to_be_bytes());
            m.extend_from_slice(&[0, 1]);
            m.extend_from_slice(&ttl.to_be_bytes());
            m.extend_from_slice(&(data.len() as u16).to_be_bytes());
            m.extend_from_slice(data);
        }
        m
    }

    fn round(name: &str, types: &[u16]) -> Round {
        Round {
            name: name.into(),
            sent: types
                .iter()
                .enumerate()
                .map(|(i, t)| Sent {
                    qtype: *t,
                    id: 100 + i as u16,
                    packet: query(100 + i as u16, name, *t),
                    tcp: false,
                    answer: None,
                })
                .collect(),
            code: 0,
            ttl: u32::MAX,
        }
    }

    fn wire_name(n: &str) -> Vec<u8> {
        let mut v = Vec::new();
        for l in n.split('.') {
            v.push(l.len() as u8);
            v.extend_from_slice(l.as_bytes());
        }
        v.push(0);
        v
    }

    const OK: u16 = 0x8180;
    const LOCAL: [u8; 4] = [127, 0, 0, 1];

    #[test]
    fn a_and_aaaa_combine() {
        let mut r = round("a.example", &[TYPE_A, TYPE_AAAA]);
        let a = answer(
            100,
            OK,
            "a.example",
            TYPE_A,
            &[(TYPE_A, 60, LOCAL.to_vec())],
        );
        assert_eq!(process(&a, false, &mut r), Step::Wait);
        let six = answer(101, OK, "a.example", TYPE_AAAA, &[]);
        assert_eq!(
            process(&six, false, &mut r),
            Step::Done(Ok(Got::Addrs(vec![IpAddr::V4(Ipv4Addr::LOCALHOST)], 60)))
        );
        // An error in either type is the answer, as nginx's.
        let mut r = round("a.example", &[TYPE_A, TYPE_AAAA]);
        assert_eq!(process(&a, false, &mut r), Step::Wait);
        let fail = answer(101, OK | 2, "a.example", TYPE_AAAA, &[]);
        assert_eq!(
            process(&fail, false, &mut r),
            Step::Done(Err(Error::Rcode(2)))
        );
        // Nothing in both: not found.
        let mut r = round("a.example", &[TYPE_A, TYPE_AAAA]);
        let none = answer(100, OK, "a.example", TYPE_A, &[]);
        assert_eq!(process(&none, false, &mut r), Step::Wait);
        assert_eq!(
            process(&six, false, &mut r),
            Step::Done(Err(Error::Rcode(3)))
        );
    }

    #[test]
    fn ignored_answers() {
        let mut r = round("a.example", &[TYPE_A]);
        // Another id, another name, a format error: the query stays out.
        let wrong = answer(7, OK, "a.example", TYPE_A, &[(TYPE_A, 60, LOCAL.to_vec())]);
        assert_eq!(process(&wrong, false, &mut r), Step::Wait);
        let other = answer(
            100,
            OK,
            "b.example",
            TYPE_A,
            &[(TYPE_A, 60, LOCAL.to_vec())],
        );
        assert_eq!(process(&other, false, &mut r), Step::Wait);
        let fe = answer(100, OK | 1, "a.example", TYPE_A, &[]);
        assert_eq!(process(&fe, false, &mut r), Step::Wait);
        // Zero-length address data: malformed.
        let bad = answer(100, OK, "a.example", TYPE_A, &[(TYPE_A, 60, Vec::new())]);
        assert_eq!(process(&bad, false, &mut r), Step::Wait);
        assert!(r.sent[0].answer.is_none());
        // Truncated: again over TCP; a truncated TCP answer is invalid.
        let tc = answer(
            100,
            OK | 0x0200,
            "a.example",
            TYPE_A,
            &[(TYPE_A, 60, LOCAL.to_vec())],
        );
        assert_eq!(process(&tc, false, &mut r), Step::Tcp(0));
        assert_eq!(process(&tc, true, &mut r), Step::Wait);
        // Truncated input never panics.
        for n in 0..tc.len() {
            let _ = process(&tc[..n], false, &mut round("a.example", &[TYPE_A]));
        }
    }

    #[test]
    fn cname_ttl_and_last_cname() {
        // CNAME (ttl 1) and A (ttl 3600) in one answer: kept 1 s.
        let mut r = round("c.example", &[TYPE_A]);
        let mut target = wire_name("d.example");
        let m = answer(
            100,
            OK,
            "c.example",
            TYPE_A,
            &[
                (TYPE_CNAME, 1, target.clone()),
                (TYPE_A, 3600, LOCAL.to_vec()),
            ],
        );
        assert_eq!(
            process(&m, false, &mut r),
            Step::Done(Ok(Got::Addrs(vec![IpAddr::V4(Ipv4Addr::LOCALHOST)], 1)))
        );
        // Each type a CNAME of its own: the one read last is followed.
        let mut r = round("c.example", &[TYPE_A, TYPE_AAAA]);
        let a = answer(
            100,
            OK,
            "c.example",
            TYPE_A,
            &[(TYPE_CNAME, 60, target.clone())],
        );
        assert_eq!(process(&a, false, &mut r), Step::Wait);
        target = wire_name("e.example");
        let six = answer(101, OK, "c.example", TYPE_AAAA, &[(TYPE_CNAME, 60, target)]);
        assert_eq!(
            process(&six, false, &mut r),
            Step::Done(Ok(Got::Cname("e.example".into(), 60)))
        );
    }

    #[test]
    fn ptr() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let name = reverse_name(ip);
        assert_eq!(name, "1.0.0.127.in-addr.arpa");
        assert_eq!(
            reverse_name("::1".parse().unwrap()),
            format!("1.0.{}ip6.arpa", "0.".repeat(30))
        );
        let mut r = round(&name, &[TYPE_PTR]);
        let m = answer(
            100,
            OK,
            &name,
            TYPE_PTR,
            &[(TYPE_PTR, 30, wire_name("a.example"))],
        );
        assert_eq!(
            process(&m, false, &mut r),
            Step::Done(Ok(Got::Name("a.example".into(), 30)))
        );
        let fail = answer(100, OK | 2, &name, TYPE_PTR, &[]);
        assert_eq!(
            process(&fail, false, &mut round(&name, &[TYPE_PTR])),
            Step::Done(Err(Error::Rcode(2)))
        );
    }

    #[test]
    fn error_text() {
        assert_eq!(Error::Rcode(3).to_string(), "3: Host not found");
        assert_eq!(Error::TimedOut.to_string(), "110: Operation timed out");
    }
}
