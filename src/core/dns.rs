//! A small asynchronous DNS client: what nginx's `resolver` does for a
//! `*_pass` with variables that names a host.
//!
//! Written here rather than taken from a general resolver crate because
//! nginx's semantics are narrow and specific: exactly the servers the
//! `resolver` directive lists (never `/etc/resolv.conf`, no search
//! domains), A and AAAA queries over UDP (`ipv4=`/`ipv6=`), answers kept
//! for their TTL or `valid=`, "not found" kept for 10 s (or `valid=`), a
//! resend to the next server every few seconds until `resolver_timeout`,
//! and errors named by their DNS response code as nginx names them
//! (`(3: Host not found)`, `(110: Operation timed out)`).
//!
//! # A lookup
//!
//! ```text
//! resolve(name)
//!   ├─ cache hit, not expired ──────────────────────▶ addresses / error
//!   └─ one UDP socket; A (and AAAA) sent to server i
//!        ├─ answers read, matched by id and question ──▶ both in: done
//!        ├─ RESEND passed: sent again to server i+1
//!        └─ resolver_timeout passed ──────────────────▶ 110 timed out
//!      no address but a CNAME: the CNAME is looked up (a few levels)
//! ```
//!
//! Runs on the worker's event loop (tokio's UDP socket); nothing blocks.
//! The cache is shared by the workers (one process), keyed by the name in
//! lower case; an entry is replaced when it expires.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;

/// How long one server is waited for before the query goes to the next.
const RESEND: Duration = Duration::from_secs(5);
/// How long "not found" and the other DNS errors are kept (nginx's).
const NEGATIVE_TTL: u64 = 10;
/// CNAMEs followed at most.
const CNAME_DEPTH: usize = 8;

const TYPE_A: u16 = 1;
const TYPE_CNAME: u16 = 5;
const TYPE_AAAA: u16 = 28;

/// Why a name was not resolved, as nginx reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// A DNS response code (1 format error, 2 server failure, 3 not
    /// found, 4 unimplemented, 5 refused, ...).
    Rcode(u8),
    /// No answer within `resolver_timeout` (nginx's ETIMEDOUT).
    TimedOut,
}

impl std::fmt::Display for Error {
    /// `3: Host not found`, as nginx's `ngx_resolver_strerror`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::TimedOut => write!(f, "110: Operation timed out"),
            Error::Rcode(c) => {
                let text = match c {
                    1 => "Format error",
                    2 => "Server failure",
                    3 => "Host not found",
                    4 => "Unimplemented",
                    5 => "Operation refused",
                    _ => "Unknown error",
                };
                write!(f, "{}: {}", c, text)
            }
        }
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

struct Entry {
    result: Result<Vec<IpAddr>, Error>,
    until: Instant,
}

/// Answers kept for their TTL (one per resolver configuration).
#[derive(Default)]
pub struct Cache {
    map: Mutex<HashMap<String, Entry>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dns::Cache")
    }
}

impl Cache {
    fn get(&self, name: &str) -> Option<Result<Vec<IpAddr>, Error>> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.get(name)?;
        (Instant::now() < e.until).then(|| e.result.clone())
    }

    fn put(&self, name: String, result: Result<Vec<IpAddr>, Error>, secs: u64) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // Expired entries go when the map grows, so it stays bounded by
        // the names in use.
        if map.len() >= 1024 {
            let now = Instant::now();
            map.retain(|_, e| e.until > now);
        }
        map.insert(
            name,
            Entry {
                result,
                until: Instant::now() + Duration::from_secs(secs),
            },
        );
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
    let key = name.to_ascii_lowercase();
    let mut r = match cache.get(&key) {
        Some(r) => r,
        None => {
            let r = lookup(q, &key).await;
            match &r {
                Ok((addrs, ttl)) => {
                    cache.put(key, Ok(addrs.clone()), q.valid.unwrap_or(u64::from(*ttl)))
                }
                Err(Error::TimedOut) => {}
                Err(e) => cache.put(key, Err(*e), q.valid.unwrap_or(NEGATIVE_TTL)),
            }
            return r.map(|(a, _)| a);
        }
    };
    if let Ok(a) = &mut r {
        if a.len() > 1 {
            let n = (random() % a.len() as u64) as usize;
            a.rotate_left(n);
        }
    }
    r
}

/// Queries the servers for `name`, following CNAMEs: the addresses and
/// the smallest TTL.
async fn lookup(q: &Query<'_>, name: &str) -> Result<(Vec<IpAddr>, u32), Error> {
    if q.servers.is_empty() {
        return Err(Error::Rcode(2));
    }
    let deadline = Instant::now() + q.timeout;
    let mut name = name.to_string();
    for _ in 0..CNAME_DEPTH {
        let mut types = Vec::with_capacity(2);
        if q.ipv4 {
            types.push(TYPE_A);
        }
        if q.ipv6 {
            types.push(TYPE_AAAA);
        }
        let answers = ask(q.servers, &name, &types, deadline).await?;
        let mut addrs = Vec::new();
        let mut ttl = u32::MAX;
        let mut cname = None;
        let mut first_err = None;
        for a in answers {
            match a {
                Ok(a) => {
                    if !a.addrs.is_empty() {
                        ttl = ttl.min(a.ttl);
                    }
                    addrs.extend(a.addrs);
                    if cname.is_none() {
                        cname = a.cname;
                    }
                }
                Err(c) => {
                    first_err.get_or_insert(c);
                }
            }
        }
        if !addrs.is_empty() {
            return Ok((addrs, if ttl == u32::MAX { 0 } else { ttl }));
        }
        if let Some(c) = first_err {
            return Err(Error::Rcode(c));
        }
        match cname {
            Some(c) if !c.eq_ignore_ascii_case(&name) => name = c.to_ascii_lowercase(),
            _ => return Err(Error::Rcode(3)),
        }
    }
    Err(Error::Rcode(3))
}

/// One answer: the addresses of the asked type, the smallest TTL among
/// them, and a CNAME if the answer had one.
#[derive(Debug, Clone, Default, PartialEq)]
struct Answer {
    addrs: Vec<IpAddr>,
    ttl: u32,
    cname: Option<String>,
}

/// Sends one query per type and waits for all their answers (Err(rcode)
/// for an answer with an error code), resending to the next server
/// every [`RESEND`] until `deadline`.
async fn ask(
    servers: &[SocketAddr],
    name: &str,
    types: &[u16],
    deadline: Instant,
) -> Result<Vec<Result<Answer, u8>>, Error> {
    let base = random();
    let ids: Vec<u16> = (0..types.len())
        .map(|i| (base >> (16 * i)) as u16)
        .collect();
    let packets: Vec<Vec<u8>> = types
        .iter()
        .zip(&ids)
        .map(|(t, id)| query(*id, name, *t))
        .collect();
    let mut got: Vec<Option<Result<Answer, u8>>> = vec![None; types.len()];
    let mut server = (random() % servers.len() as u64) as usize;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::TimedOut);
        }
        let to = servers[server % servers.len()];
        server += 1;
        let bind: SocketAddr = if to.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let until = deadline.min(now + RESEND);
        let Ok(sock) = UdpSocket::bind(bind).await else {
            tokio::time::sleep_until(until.into()).await;
            continue;
        };
        for (p, g) in packets.iter().zip(&got) {
            if g.is_none() {
                // A lost datagram is as a lost answer: resent later.
                let _ = sock.send_to(p, to).await;
            }
        }
        let mut buf = vec![0u8; 4096];
        loop {
            let r = tokio::time::timeout_at(until.into(), sock.recv_from(&mut buf)).await;
            let Ok(Ok((n, from))) = r else { break };
            if !servers.contains(&from) {
                continue;
            }
            let Some((id, ans)) = parse(&buf[..n], name) else {
                continue;
            };
            if let Some(i) = ids.iter().position(|want| *want == id) {
                if got[i].is_none() {
                    let t = types[i];
                    got[i] = Some(ans.map(|a| filter(a, t)));
                }
            }
            if got.iter().all(Option::is_some) {
                return Ok(got.into_iter().flatten().collect());
            }
        }
    }
}

/// Keeps the addresses of the type asked for.
fn filter(mut a: Answer, t: u16) -> Answer {
    a.addrs.retain(|ip| ip.is_ipv4() == (t == TYPE_A));
    a
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

fn u16_at(m: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*m.get(at)?, *m.get(at + 1)?]))
}

/// A response to a query for `name`: its id and the answer (Err: the
/// response code). None for what is not a well-formed response to it.
fn parse(m: &[u8], name: &str) -> Option<(u16, Result<Answer, u8>)> {
    let id = u16_at(m, 0)?;
    let flags = u16_at(m, 2)?;
    if flags & 0x8000 == 0 {
        return None;
    }
    let (qd, an) = (u16_at(m, 4)?, u16_at(m, 6)?);
    let mut at = 12;
    for _ in 0..qd {
        let (q, next) = read_name(m, at)?;
        if !q
            .trim_end_matches('.')
            .eq_ignore_ascii_case(name.trim_end_matches('.'))
        {
            return None;
        }
        at = next + 4;
    }
    let rcode = (flags & 0xf) as u8;
    if rcode != 0 {
        return Some((id, Err(rcode)));
    }
    let mut a = Answer {
        ttl: u32::MAX,
        ..Answer::default()
    };
    for _ in 0..an {
        let (_, next) = read_name(m, at)?;
        let t = u16_at(m, next)?;
        let ttl = u32::from_be_bytes(m.get(next + 4..next + 8)?.try_into().ok()?);
        let len = u16_at(m, next + 8)? as usize;
        let data_at = next + 10;
        let data = m.get(data_at..data_at + len)?;
        match (t, len) {
            (TYPE_A, 4) => {
                a.addrs.push(IpAddr::V4(Ipv4Addr::new(
                    data[0], data[1], data[2], data[3],
                )));
                a.ttl = a.ttl.min(ttl);
            }
            (TYPE_AAAA, 16) => {
                let b: [u8; 16] = data.try_into().ok()?;
                a.addrs.push(IpAddr::V6(Ipv6Addr::from(b)));
                a.ttl = a.ttl.min(ttl);
            }
            (TYPE_CNAME, _) if a.cname.is_none() => {
                a.cname = Some(read_name(m, data_at)?.0);
            }
            _ => {}
        }
        at = data_at + len;
    }
    if a.ttl == u32::MAX {
        a.ttl = 0;
    }
    Some((id, Ok(a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as a server writes it: the question, then `records`
    /// (type, rdata) named by a pointer to the question's name.
    fn answer(id: u16, rcode: u16, name: &str, t: u16, records: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let q = query(id, name, t);
        let mut m = q.clone();
        m[2] = 0x81;
        m[3] = 0x80 | rcode as u8;
        m[7] = records.len() as u8;
        for (rt, data) in records {
            m.extend_from_slice(&[0xc0, 0x0c]);
            m.extend_from_slice(&rt.to_be_bytes());
            m.extend_from_slice(&[0, 1, 0, 0, 0x0e, 0x10]);
            m.extend_from_slice(&(data.len() as u16).to_be_bytes());
            m.extend_from_slice(data);
        }
        m
    }

    #[test]
    fn parses_addresses_and_errors() {
        let m = answer(7, 0, "a.example", TYPE_A, &[(TYPE_A, vec![127, 0, 0, 1])]);
        let (id, a) = parse(&m, "a.example").unwrap();
        assert_eq!(id, 7);
        let a = a.unwrap();
        assert_eq!(a.addrs, vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]);
        assert_eq!(a.ttl, 3600);
        let m = answer(8, 3, "a.example", TYPE_A, &[]);
        assert_eq!(parse(&m, "a.example").unwrap().1, Err(3));
        // Another name's answer is not this query's.
        assert!(parse(&m, "b.example").is_none());
        // Truncated input never panics.
        for n in 0..m.len() {
            let _ = parse(&m[..n], "a.example");
        }
    }

    #[test]
    fn cname_target() {
        let mut target = Vec::new();
        for l in ["b", "example"] {
            target.push(l.len() as u8);
            target.extend_from_slice(l.as_bytes());
        }
        target.push(0);
        let m = answer(1, 0, "a.example", TYPE_A, &[(TYPE_CNAME, target)]);
        let a = parse(&m, "a.example").unwrap().1.unwrap();
        assert_eq!(a.cname.as_deref(), Some("b.example"));
        assert!(a.addrs.is_empty());
    }

    #[test]
    fn error_text() {
        assert_eq!(Error::Rcode(3).to_string(), "3: Host not found");
        assert_eq!(Error::TimedOut.to_string(), "110: Operation timed out");
    }
}
