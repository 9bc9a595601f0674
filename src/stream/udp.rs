//! UDP listeners of `stream` (`listen ... udp`): datagram sessions.
//!
//! The master binds each `listen ... udp` address as a datagram socket (one
//! `SO_REUSEPORT` socket per worker with `reuseport`) and hands it to every
//! worker, whose control loop calls [`serve`] instead of an accept loop.
//!
//! As in nginx, a session is keyed by the client's address: the first
//! datagram from an address starts one (the stream phases run: `set`,
//! `limit_conn`, `allow`/`deny`, then `return` or `proxy_pass`), and later
//! datagrams from it go to that session while it stays bound.
//!
//! ```text
//!  listener (one task per socket)          session (one task each)
//!  recv_from -> peer bound to a session?    phases (set, limit_conn, access)
//!     yes: into its inbox, wake it          return: one datagram back, end
//!     no:  new session, inbox = [datagram]  proxy_pass: a connected UDP socket
//!                                            to a peer, then relay:
//!                                            inbox -> send() to the upstream
//!                                            recv() from it -> send_to(client)
//!                                            through the listening socket
//! ```
//!
//! A session ends (`$status` 200) when `proxy_requests` datagrams came from
//! the client (0: no limit) and `proxy_responses` datagrams per request came
//! back (unset: no limit, so only `proxy_timeout` ends it; an idle session
//! that got every response it expected also ends with 200, one that did not
//! with 502, "upstream timed out"). Reaching `proxy_requests` unbinds the
//! client: its next datagram starts a new session while this one waits for
//! its responses. An ICMP error from the upstream (a refused port) counts
//! as its last response and as a failure of the peer.
//!
//! No datagram costs an allocation: the listener reads into one buffer per
//! socket; a session's inbox is one byte buffer (and a list of lengths)
//! that keeps its capacity, and its upstream buffer is allocated once
//! (`proxy_buffer_size`, as nginx: a longer response is cut). An inbox
//! holds at most [`MAX_QUEUED`] datagrams; more are dropped, as UDP may.
//!
//! Replies leave through the listening socket, so their source is the
//! listening address; on a wildcard address the kernel chooses it (nginx
//! sets it with `IP_PKTINFO`; see DIFFERENCES.md).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::{watch, Notify};

use crate::core::log::Level;
use crate::core::worker::{Slot, WorkerShared};
use crate::http::conf::ListenAddr;
use crate::stream::conf::{Content, StreamServer};
use crate::stream::session::{self, Session, UpTry};
use crate::stream::upstream::{PeerAddr, Picked, Upstream};

/// Datagrams an inbox holds before it drops new ones.
pub const MAX_QUEUED: usize = 64;

/// The biggest UDP payload (IPv4: 65535 less the IP and UDP headers).
const MAX_DATAGRAM: usize = 65535;

/// Datagrams a session has not sent on yet, in one reused buffer.
#[derive(Default)]
struct Queue {
    data: Vec<u8>,
    lens: VecDeque<usize>,
    head: usize,
}

impl Queue {
    /// False (and dropped) when the queue is full.
    fn push(&mut self, d: &[u8]) -> bool {
        if self.lens.len() >= MAX_QUEUED {
            return false;
        }
        self.data.extend_from_slice(d);
        self.lens.push_back(d.len());
        true
    }

    fn front(&self) -> Option<&[u8]> {
        let n = *self.lens.front()?;
        self.data.get(self.head..self.head + n)
    }

    fn pop(&mut self) {
        if let Some(n) = self.lens.pop_front() {
            self.head += n;
        }
        if self.lens.is_empty() {
            self.data.clear();
            self.head = 0;
        }
    }

    fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }
}

/// What the listener and one session share.
struct Inbox {
    queue: RefCell<Queue>,
    /// The listener still hands this client's datagrams to the session.
    bound: Cell<bool>,
    /// Datagrams handed over so far, and how many the session takes
    /// (`proxy_requests`; 0: no limit). Counted here, as they arrive,
    /// so a burst beyond the limit starts the next session at once.
    taken: Cell<u64>,
    limit: u64,
    wake: Notify,
}

impl Inbox {
    /// Hands a datagram over; false when the client is unbound by it
    /// (its `proxy_requests`-th datagram).
    fn take(&self, d: &[u8]) -> bool {
        if self.queue.borrow_mut().push(d) {
            self.wake.notify_one();
        }
        self.taken.set(self.taken.get() + 1);
        let open = self.limit == 0 || self.taken.get() < self.limit;
        if !open {
            self.bound.set(false);
        }
        open
    }
}

/// The sessions of one listening socket, by client address.
type Sessions = Rc<RefCell<HashMap<SocketAddr, Rc<Inbox>>>>;

/// Serves one UDP listener of this worker until `stop` turns true.
pub async fn serve(
    addr: ListenAddr,
    sock: std::net::UdpSocket,
    shared: Arc<WorkerShared>,
    mut stop: watch::Receiver<bool>,
) {
    let sock = match sock
        .set_nonblocking(true)
        .and_then(|()| UdpSocket::from_std(sock))
    {
        Ok(s) => Rc::new(s),
        Err(e) => {
            crate::elog!(
                Alert,
                "UDP listener {} failed {}",
                addr,
                crate::core::errno_text(&e)
            );
            return;
        }
    };
    let sessions: Sessions = Rc::default();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        if *stop.borrow() {
            break;
        }
        let got = tokio::select! {
            r = stop.changed() => {
                if r.is_err() {
                    break;
                }
                continue;
            }
            r = sock.recv_from(&mut buf) => r,
        };
        let (n, peer) = match got {
            Ok(v) => v,
            // An ICMP error for an earlier reply, or a datagram cut short:
            // nothing for any session.
            Err(_) => continue,
        };
        let d = &buf[..n];
        let bound = sessions.borrow().get(&peer).cloned();
        if let Some(inbox) = bound {
            if !inbox.take(d) {
                sessions.borrow_mut().remove(&peer);
            }
            continue;
        }
        let srv = shared
            .config
            .load()
            .stream
            .as_ref()
            .and_then(|c| c.server_for(&addr));
        // None: a reload removed this listener; its stop is on the way.
        let Some(srv) = srv else { continue };
        let Some(slot) = shared.take_slot() else {
            crate::elog!(
                Alert,
                "{} worker_connections are not enough",
                shared.config.load().main.connections()
            );
            continue;
        };
        let inbox = Rc::new(Inbox {
            queue: RefCell::default(),
            bound: Cell::new(true),
            taken: Cell::new(0),
            limit: srv.requests,
            wake: Notify::new(),
        });
        if inbox.take(d) {
            sessions.borrow_mut().insert(peer, inbox.clone());
        }
        let ctx = Ctx {
            sock: sock.clone(),
            peer,
            first_len: n,
            inbox,
            sessions: sessions.clone(),
        };
        tokio::task::spawn_local(run(ctx, addr.clone(), srv, slot, shared.clone()));
    }
}

/// A session's side of its listener.
struct Ctx {
    sock: Rc<UdpSocket>,
    peer: SocketAddr,
    /// The size of the datagram that started the session (counted in
    /// `$bytes_received` at once, as nginx does, whatever the content).
    first_len: usize,
    inbox: Rc<Inbox>,
    sessions: Sessions,
}

impl Ctx {
    /// The client's next datagram starts a new session.
    fn unbind(&self) {
        if !self.inbox.bound.replace(false) {
            return;
        }
        let mut m = self.sessions.borrow_mut();
        if m.get(&self.peer)
            .is_some_and(|i| Rc::ptr_eq(i, &self.inbox))
        {
            m.remove(&self.peer);
        }
    }
}

/// One UDP session: its phases, its content, its log line.
async fn run(
    ctx: Ctx,
    listen: ListenAddr,
    srv: Arc<StreamServer>,
    _slot: Slot,
    shared: Arc<WorkerShared>,
) {
    let id = crate::core::worker::next_conn_id();
    let local = match listen {
        ListenAddr::Udp(a) if !a.ip().is_unspecified() => Some(a),
        _ => ctx.sock.local_addr().ok(),
    };
    let mut s = Session::new(id, Some(ctx.peer), local, listen.clone(), srv.clone());
    s.bytes_received = ctx.first_len as u64;
    s.log(
        Level::Info,
        format_args!("udp client {} connected to {}", ctx.peer, listen),
    );
    let mut held = Vec::new();
    if session::checks(&mut s, &mut held) {
        content(&mut s, &ctx, &shared).await;
    }
    ctx.unbind();
    crate::stream::log::log_phase(&s);
    drop(held);
}

async fn content(s: &mut Session, ctx: &Ctx, shared: &Arc<WorkerShared>) {
    let srv = s.srv.clone();
    if let Content::Return(t) = &srv.content {
        let v = t.render_vec(&*s);
        if ctx.sock.send_to(&v, ctx.peer).await.is_ok() {
            s.bytes_sent += v.len() as u64;
        }
        return;
    }
    if let Content::Pass(_) = &srv.content {
        s.log(
            Level::Error,
            format_args!(
                "cannot pass udp connection, {} while passing connection to port",
                s.client_ctx()
            ),
        );
        s.status = 500;
        return;
    }
    let Some(upstream) = crate::stream::proxy::target(s).await else {
        return;
    };
    // The upstream socket is a connection of this worker too.
    let Some(_up_slot) = shared.take_slot() else {
        s.log(
            Level::Alert,
            format_args!(
                "{} worker_connections are not enough while connecting to upstream, {}",
                shared.config.load().main.connections(),
                s.client_ctx()
            ),
        );
        s.status = 502;
        return;
    };
    let Some((up, peer)) = connect(s, &srv, &upstream) else {
        s.status = 502;
        return;
    };
    let mut quit = shared.quit.clone();
    let r = relay(s, ctx, &srv, &up, &mut quit).await;
    if let Some(t) = s.up.tries.last_mut() {
        t.session = Some(s.start.elapsed());
        t.first_byte = r.first_byte.map(|f| f.duration_since(s.start));
        t.bytes_sent = r.to_upstream;
        t.bytes_received = r.from_upstream;
    }
    if r.upstream_error {
        peer.failed();
    }
}

/// Picks a peer and opens a connected UDP socket to it (trying the next
/// peer when the socket cannot be made, within `proxy_next_upstream*`).
fn connect(
    s: &mut Session,
    srv: &StreamServer,
    upstream: &Arc<Upstream>,
) -> Option<(UdpSocket, Picked)> {
    let key = match &upstream.balance {
        crate::stream::upstream::Balance::Hash { key, .. } => key.render_vec(&*s),
        _ => Vec::new(),
    };
    let bind = srv.bind.as_ref().and_then(|t| {
        std::str::from_utf8(&t.render_vec(&*s))
            .ok()
            .and_then(|a| a.parse::<std::net::IpAddr>().ok())
    });
    let started = Instant::now();
    let mut tried = upstream.tried(key);
    let mut tries = 0usize;
    loop {
        let Some(peer) = upstream.pick(&mut tried) else {
            s.up.tries.push(UpTry {
                addr: upstream.name.clone(),
                ..Default::default()
            });
            s.log(
                Level::Error,
                format_args!(
                    "no live upstreams while connecting to upstream, {}, upstream: \"{}\"",
                    s.client_ctx(),
                    upstream.name
                ),
            );
            return None;
        };
        tries += 1;
        s.up.tries.push(UpTry {
            addr: peer.name.clone(),
            ..Default::default()
        });
        let t0 = Instant::now();
        match dial(&peer.addr, bind) {
            Ok(sock) => {
                if let Some(t) = s.up.tries.last_mut() {
                    t.connect = Some(t0.elapsed());
                }
                peer.connected();
                s.log(
                    Level::Info,
                    format_args!(
                        "udp proxy {} connected to {}",
                        sock.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                        peer.name
                    ),
                );
                return Some((sock, peer));
            }
            Err(e) => {
                s.log(
                    Level::Error,
                    format_args!(
                        "connect() failed {} while connecting to upstream, {}, upstream: \"{}\"",
                        crate::core::errno_text(&e),
                        s.client_ctx(),
                        peer.name
                    ),
                );
                peer.failed();
            }
        }
        let out_of_tries = (srv.next_upstream_tries != 0 && tries >= srv.next_upstream_tries)
            || tries >= upstream.max_tries();
        let out_of_time = srv
            .next_upstream_timeout
            .is_some_and(|t| started.elapsed() >= t);
        if !srv.next_upstream || out_of_tries || out_of_time {
            return None;
        }
    }
}

/// A UDP socket connected to `addr` (bound to `proxy_bind`'s address).
fn dial(addr: &PeerAddr, bind: Option<std::net::IpAddr>) -> io::Result<UdpSocket> {
    let PeerAddr::Inet(a) = addr else {
        // nginx proxies UDP to unix datagram sockets; tern does not yet.
        return Err(io::Error::from(io::ErrorKind::Unsupported));
    };
    let local = match bind.filter(|ip| ip.is_ipv4() == a.is_ipv4()) {
        Some(ip) => SocketAddr::new(ip, 0),
        None if a.is_ipv4() => SocketAddr::from(([0, 0, 0, 0], 0)),
        None => SocketAddr::from(([0u16; 8], 0)),
    };
    let s = std::net::UdpSocket::bind(local)?;
    s.connect(a)?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s)
}

/// What a relay did.
#[derive(Default)]
struct Relayed {
    to_upstream: u64,
    from_upstream: u64,
    first_byte: Option<Instant>,
    /// The upstream refused (an ICMP error) or timed out owing responses:
    /// the peer failed.
    upstream_error: bool,
}

/// nginx's rate limit for one direction: how long to wait before the next
/// read, given the bytes moved since `start` (`proxy_upload_rate`,
/// `proxy_download_rate`; a datagram is never split).
struct Rate {
    rate: u64,
    start: Instant,
    moved: u64,
    until: Option<tokio::time::Instant>,
}

impl Rate {
    fn new(rate: u64, start: Instant) -> Rate {
        Rate {
            rate,
            start,
            moved: 0,
            until: None,
        }
    }

    /// Whether a datagram may move now; arms the wait when not.
    fn ready(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if self.until.is_some_and(|u| u > now) {
            return false;
        }
        self.until = None;
        if self.rate == 0 {
            return true;
        }
        let secs = self.start.elapsed().as_secs();
        let limit = self.rate.saturating_mul(secs + 1);
        if limit > self.moved {
            return true;
        }
        let ms = (self.moved - limit).saturating_mul(1000) / self.rate + 1;
        self.until = Some(now + Duration::from_millis(ms));
        false
    }

    /// Counts a datagram that moved, and the pause it earns.
    fn moved(&mut self, n: usize) {
        self.moved += n as u64;
        if let Some(ms) = (n as u64).saturating_mul(1000).checked_div(self.rate) {
            if ms > 0 {
                self.until = Some(tokio::time::Instant::now() + Duration::from_millis(ms));
            }
        }
    }
}

/// Relays datagrams both ways until the session ends (see the module doc).
async fn relay(
    s: &mut Session,
    ctx: &Ctx,
    srv: &StreamServer,
    up: &UdpSocket,
    quit: &mut watch::Receiver<bool>,
) -> Relayed {
    let rate = |t: &crate::http::vars::Template| {
        std::str::from_utf8(&t.render_vec(&*s))
            .ok()
            .and_then(crate::config::value::size)
            .unwrap_or(0)
    };
    let mut upload = Rate::new(rate(&srv.upload_rate), s.start);
    let mut download = Rate::new(rate(&srv.download_rate), s.start);
    let mut buf = crate::stream::proxy::PooledBuf::take(srv.buffer_size.max(1));
    let mut r = Relayed::default();
    let (mut requests, mut responses) = (0u64, 0u64);
    // The upstream sent an ICMP error: nothing more comes from it.
    let mut up_eof = false;
    let idle = tokio::time::sleep(srv.timeout);
    tokio::pin!(idle);
    loop {
        // Client to upstream: what the inbox holds, as the rate allows.
        let mut active = false;
        loop {
            let q = ctx.inbox.queue.borrow();
            let Some(d) = q.front() else { break };
            if !upload.ready() {
                break;
            }
            match up.try_send(d) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // A refused port shows here too (ICMP for an earlier
                // datagram): that datagram is lost, as in nginx.
                Err(_) => {}
            }
            let n = d.len();
            drop(q);
            ctx.inbox.queue.borrow_mut().pop();
            // The first one was counted when the session started.
            if requests > 0 {
                s.bytes_received += n as u64;
            }
            requests += 1;
            r.to_upstream += n as u64;
            upload.moved(n);
            active = true;
        }
        if active {
            idle.as_mut()
                .reset(tokio::time::Instant::now() + srv.timeout);
        }
        // nginx's test after each event (ngx_stream_proxy_test_finalize).
        let owed = srv.responses.map(|n| n.saturating_mul(requests));
        let requests_done = srv.requests == 0 || requests >= srv.requests;
        let queued = !ctx.inbox.queue.borrow().is_empty();
        if requests_done && !queued && owed.is_some_and(|o| responses >= o) {
            s.log(
                Level::Info,
                format_args!(
                    "udp done, packets from/to client:{}/{}, bytes from/to client:{}/{}, bytes from/to upstream:{}/{}",
                    requests, responses, s.bytes_received, s.bytes_sent, r.from_upstream, r.to_upstream
                ),
            );
            return r;
        }
        let waiting_send = queued && upload.until.is_none();
        let can_read = !up_eof && download.ready();
        let upload_wait = upload.until;
        let download_wait = download.until;
        tokio::select! {
            () = ctx.inbox.wake.notified() => {}
            _ = up.writable(), if waiting_send => {}
            () = sleep_opt(upload_wait) => { upload.until = None; }
            () = sleep_opt(download_wait) => { download.until = None; }
            got = up.recv(&mut buf), if can_read => {
                responses += 1;
                idle.as_mut().reset(tokio::time::Instant::now() + srv.timeout);
                match got {
                    Ok(n) => {
                        r.from_upstream += n as u64;
                        r.first_byte.get_or_insert_with(Instant::now);
                        if ctx.sock.send_to(&buf[..n], ctx.peer).await.is_ok() {
                            s.bytes_sent += n as u64;
                        }
                        download.moved(n);
                    }
                    Err(e) => {
                        s.log(
                            Level::Error,
                            format_args!(
                                "recv() failed {} while proxying and reading from upstream, {}, upstream: \"{}\"",
                                crate::core::errno_text(&e),
                                s.client_ctx(),
                                s.up.tries.last().map(|t| t.addr.as_str()).unwrap_or("")
                            ),
                        );
                        up_eof = true;
                        r.upstream_error = true;
                    }
                }
            }
            () = &mut idle => {
                if owed.is_none_or(|o| responses >= o) {
                    s.log(
                        Level::Info,
                        format_args!(
                            "udp timed out, packets from/to client:{}/{}, bytes from/to client:{}/{}, bytes from/to upstream:{}/{}",
                            requests, responses, s.bytes_received, s.bytes_sent, r.from_upstream, r.to_upstream
                        ),
                    );
                } else {
                    s.log(
                        Level::Error,
                        format_args!(
                            "upstream timed out (110: Connection timed out) while proxying connection, {}, upstream: \"{}\"",
                            s.client_ctx(),
                            s.up.tries.last().map(|t| t.addr.as_str()).unwrap_or("")
                        ),
                    );
                    r.upstream_error = true;
                    s.status = 502;
                }
                return r;
            }
            r2 = quit.changed() => {
                if r2.is_err() || *quit.borrow() {
                    s.log(Level::Info, format_args!("disconnected on shutdown"));
                    return r;
                }
            }
        }
    }
}

/// Sleeps until `at`, or forever when None.
async fn sleep_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
