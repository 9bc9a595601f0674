//! One fetch: the peers tried in turn until one answers with a response
//! head (nginx's ngx_http_upstream_connect / _send_request /
//! _process_header / _next), with the timeouts and nginx's log wording.
//!
//! ```text
//!  fetch ── peer = Upstream::next ──▶ exchange ──┬─ Ok(head) ─ status a next_upstream case? ─▶ next peer
//!    ▲                                           │                      └─ else ─▶ UpResp
//!    └──── next_upstream allows it (tries, ◀─────┴─ Err(Fail)
//!          timeout, non_idempotent)
//!  exchange: a kept-alive connection (a stale one is retried fresh once)
//!            or connect (+ TLS) ── send the request (the body framed by
//!            the protocol) ── read until the protocol's HeadReader has a head
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::conf::{ft, parse_bind, BindAddr, Limits, UpstreamConf};
use super::peers::{self, PeerAddr, Upstream};
use super::state::{Slot, States};
use super::{BodyDecoder, Head, HeadReader, Protocol, Session, SessionConn};
use crate::core::log::Level;
use crate::http::phases::Ctx;
use crate::io::{OpenFile, Policy};
use crate::tls::client::UpStream;

/// What goes upstream after the head.
#[derive(Clone)]
pub enum OutBody {
    None,
    Mem(Bytes),
    /// A client body in its temp file (read back for every attempt).
    File(Arc<OpenFile>, u64),
    /// The client's body as it arrives, from the [`BodyFeed`] given to
    /// [`fetch`] (`PREFIX_request_buffering off`), framed by the
    /// protocol's `frame_body` piece by piece.
    Stream,
}

/// A request body read while it is sent (nginx's
/// `request_body_no_buffering`): once any of the request went to a peer,
/// it is not passed to another (nginx's `ngx_http_upstream_next`).
pub trait BodyFeed {
    /// The next piece; None at its end. Err: the status for the client
    /// (the feed has logged why).
    fn next(&mut self) -> impl std::future::Future<Output = Result<Option<Bytes>, u16>>;
    /// Nothing of the body was taken yet.
    fn untouched(&self) -> bool;
    /// The last piece was given.
    fn done(&self) -> bool;
}

impl BodyFeed for crate::http::body::Streaming<'_> {
    fn next(&mut self) -> impl std::future::Future<Output = Result<Option<Bytes>, u16>> {
        crate::http::body::Streaming::next(self)
    }
    fn untouched(&self) -> bool {
        crate::http::body::Streaming::untouched(self)
    }
    fn done(&self) -> bool {
        crate::http::body::Streaming::done(self)
    }
}

/// No feed: the body, if any, is buffered (background cache updates).
pub enum NoFeed {}

impl BodyFeed for NoFeed {
    #[allow(unreachable_code)]
    fn next(&mut self) -> impl std::future::Future<Output = Result<Option<Bytes>, u16>> {
        std::future::ready(match *self {})
    }
    fn untouched(&self) -> bool {
        match *self {}
    }
    fn done(&self) -> bool {
        match *self {}
    }
}

/// One request as sent to each peer tried: the body is buffered, so a
/// retry sends it again.
pub struct Outgoing<'o> {
    pub head: &'o [u8],
    pub body: &'o OutBody,
    pub policy: &'o Policy,
    /// POST, LOCK, PATCH: not passed to another peer once sent.
    pub non_idempotent: bool,
    /// `PREFIX_bind`'s address for this request.
    pub bind: Option<SocketAddr>,
    /// `PREFIX_socket_keepalive`.
    pub keepalive: bool,
}

/// `PREFIX_bind`'s address for a request (an unusable rendered value is
/// logged and ignored, as nginx does).
pub fn bind_addr(cx: &Ctx<'_>, conf: &UpstreamConf) -> Option<SocketAddr> {
    match conf.bind.as_ref()?.as_ref()? {
        BindAddr::Fixed(a) => Some(*a),
        BindAddr::Var(t) => {
            let v = t.render_vec(cx);
            if v.is_empty() {
                return None;
            }
            let a = std::str::from_utf8(&v).ok().and_then(parse_bind);
            if a.is_none() {
                cx.log(
                    Level::Error,
                    &format!("invalid local address \"{}\"", String::from_utf8_lossy(&v)),
                );
            }
            a
        }
    }
}

pub struct Fail {
    pub status: u16,
    pub msg: String,
    /// Which `PREFIX_next_upstream` case this is ([`ft`]; 0: never retried,
    /// e.g. after part of a response was received).
    pub ft: u16,
    /// The request had started to go out (nginx's `request_sent`).
    pub sent: bool,
    /// Lines the protocol logged before the failure (FastCGI's stderr).
    pub logs: Vec<String>,
}

pub fn fail(status: u16, msg: impl Into<String>, next: bool) -> Fail {
    Fail {
        status,
        msg: msg.into(),
        ft: match (next, status) {
            (false, _) => 0,
            (true, 504) => ft::TIMEOUT,
            (true, _) => ft::ERROR,
        },
        sent: false,
        logs: Vec::new(),
    }
}

/// An upstream response head nginx counts as `invalid_header`.
pub fn invalid_header(msg: &str) -> Fail {
    Fail {
        ft: ft::INVALID_HEADER,
        ..fail(502, msg, false)
    }
}

pub const TIMED_OUT: &str = "upstream timed out (110: Connection timed out)";

/// One read from the upstream within `limit`: 504 on timeout, 502 on an
/// error, with nginx's log wording (`recv() failed (104: ...) while
/// reading upstream`); `call` is the system call nginx names there:
/// `recv()`, or `readv()` for a body read into the buffers of its pipe
/// (proxy_buffering on).
pub async fn timed_read(
    s: &mut UpStream,
    buf: &mut [u8],
    limit: Duration,
    context: &str,
    next: bool,
    call: &str,
) -> Result<usize, Fail> {
    match tokio::time::timeout(limit, s.read(buf)).await {
        Err(_) => Err(fail(504, format!("{} {}", TIMED_OUT, context), next)),
        Ok(Err(e)) => Err(fail(
            502,
            format!(
                "{} failed {} {}",
                call,
                crate::core::errno_text(&e),
                context
            ),
            next,
        )),
        Ok(Ok(n)) => Ok(n),
    }
}

/// A response head from upstream, with the connection to read the body from.
pub struct UpResp {
    pub status: u16,
    /// The status line after the version as upstream sent it (`302
    /// Found`), relayed verbatim as nginx does; empty: tern's own.
    pub status_line: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub stream: Option<UpStream>,
    /// Bytes that came after the head, as they came (the body's decoder
    /// gets them first; a tunnel relays them).
    pub early: Vec<u8>,
    /// Body bytes the head reader already decoded.
    pub body: Vec<u8>,
    pub peer: PeerAddr,
    pub peer_name: String,
    /// What the connection has carried, this request included
    /// (`keepalive_requests`, `keepalive_time`).
    pub requests: peers::Uses,
    /// No body follows (HEAD, 1xx, 204, 304).
    pub no_body: bool,
    /// The Content-Length upstream declared.
    pub declared_len: Option<u64>,
    /// The connection may be reused once the body is read whole.
    pub keep: bool,
    /// The peer counts as busy (least_conn, max_conns) while this lives:
    /// it moves to the body's producer.
    pub lease: Option<peers::Lease>,
    /// The body's decoder (nginx's input_filter).
    pub decoder: Box<dyn BodyDecoder>,
    /// Lines the protocol logged with the head (logged by [`fetch`]).
    pub logs: Vec<String>,
    /// This attempt's record (`$upstream_response_time` ... set when the
    /// body has been read).
    pub slot: Slot,
    /// Trailers that followed a body read whole by a protocol's session.
    pub trailers: Vec<(String, Vec<u8>)>,
    /// A session's body still arriving (it goes to the client as it
    /// comes, trailers at its end).
    pub session_body: Option<Box<dyn crate::http::response::BodyStream>>,
}

impl UpResp {
    fn of(h: Head, s: Option<UpStream>, addr: &PeerAddr, logs: Vec<String>) -> UpResp {
        UpResp {
            status: h.status,
            status_line: h.status_line,
            headers: h.headers,
            stream: s,
            early: h.early,
            body: h.body,
            peer: addr.clone(),
            peer_name: String::new(),
            requests: peers::Uses::fresh(),
            no_body: h.no_body,
            declared_len: h.declared_len,
            keep: h.keep,
            lease: None,
            decoder: h.decoder,
            logs,
            slot: Slot::none(),
            trailers: Vec::new(),
            session_body: None,
        }
    }
}

/// Where [`fetch`] records its attempts (`$upstream_addr` and the other
/// [`super::state`] variables) and logs: the request, or (a background
/// cache update) only the log.
pub trait FetchEnv {
    /// A record for an attempt on `peer`.
    fn attempt(&mut self, peer: &str) -> Slot;
    fn log_up(&self, level: Level, msg: &str, url: &str);
}

impl FetchEnv for Ctx<'_> {
    fn attempt(&mut self, peer: &str) -> Slot {
        match States::of(self) {
            Some(s) => s.attempt(peer),
            None => States::begin_use(self).attempt(peer),
        }
    }

    fn log_up(&self, level: Level, msg: &str, url: &str) {
        log_upstream(self, level, msg, url);
    }
}

impl FetchEnv for UpLog {
    fn attempt(&mut self, _: &str) -> Slot {
        Slot::none()
    }

    fn log_up(&self, level: Level, msg: &str, url: &str) {
        self.logger.log(
            level,
            Some(self.conn),
            format_args!("{}{}, upstream: \"{}\"{}", msg, self.tail, url, self.host),
        );
    }
}

/// Why [`fetch`] gave up: the status for the client and the
/// `PREFIX_next_upstream` case of the last failure (0: none).
pub struct FetchErr {
    pub status: u16,
    pub ft: u16,
}

/// Tries peers until one answers with a response head. `feed`: the body
/// of an `OutBody::Stream` request.
#[allow(clippy::too_many_arguments)]
pub async fn fetch<E: FetchEnv, B: BodyFeed>(
    cx: &mut E,
    mut at: peers::Attempt,
    up: &Arc<Upstream>,
    lim: &Limits,
    proto: &dyn Protocol,
    send: &Outgoing<'_>,
    head_only: bool,
    mut feed: Option<&mut B>,
) -> Result<UpResp, FetchErr> {
    let streamed = feed.is_some();
    let started = std::time::Instant::now();
    let mut tries_left = match lim.next_tries {
        0 => up.tries(),
        n => up.tries().min(n as usize),
    };
    // Whether the case `bit` may go on to the next peer (nginx's
    // ngx_http_upstream_next checks, in its order).
    let may_retry = |bit: u16, sent: bool, tries_left: usize| {
        if sent && streamed {
            return false;
        }
        let mut need = bit;
        if sent && send.non_idempotent {
            need |= ft::NON_IDEMPOTENT;
        }
        bit != 0
            && tries_left > 0
            && lim.next_mask & need == need
            && lim.next_timeout.is_none_or(|t| started.elapsed() < t)
    };
    while let Some(lease) = up.next(&mut at) {
        let pid = lease.id();
        let Some(peer) = up.peer(pid) else { break };
        tries_left = tries_left.saturating_sub(1);
        let mut slot = cx.attempt(&peer.name);
        let url = proto.url(&peer.name);
        let got = exchange(
            up,
            &peer.addr,
            lim,
            proto,
            send,
            head_only,
            &slot,
            feed.as_deref_mut(),
        )
        .await;
        let logs = match &got {
            Ok(r) => &r.logs,
            Err(f) => &f.logs,
        };
        for e in logs {
            cx.log_up(Level::Error, e, &url);
        }
        match got {
            Ok(mut r) => {
                let bit = ft::of_status(r.status).unwrap_or(0);
                if may_retry(bit, true, tries_left) {
                    // The answer goes unread (its connection kept when
                    // nothing of it is left to read); 403 and 404 do not
                    // count against the peer, the others do.
                    super::response::release_unread(up, &mut r);
                    slot.finish();
                    if bit & (ft::HTTP_403 | ft::HTTP_404) == 0 && up.failed(pid) {
                        cx.log_up(
                            Level::Warn,
                            "upstream server temporarily disabled while reading response header from upstream",
                            &url,
                        );
                    }
                    continue;
                }
                up.succeeded(pid);
                r.peer_name = peer.name.clone();
                r.lease = Some(lease);
                r.slot = slot;
                return Ok(r);
            }
            Err(f) => {
                // 500: tern's own failure (PREFIX_bind, the body's temp
                // file), logged as nginx does such, and not the peer's;
                // 4xx: the client's (a streamed body), not the peer's.
                let local = f.status <= 500;
                let level = if local { Level::Crit } else { Level::Error };
                // An empty message: already said (fastcgi_catch_stderr's
                // line is the stderr itself, as nginx logs it).
                if !f.msg.is_empty() {
                    cx.log_up(level, &f.msg, &url);
                }
                slot.status(f.status);
                slot.finish();
                if !local && up.failed(pid) {
                    cx.log_up(
                        Level::Warn,
                        "upstream server temporarily disabled while connecting to upstream",
                        &url,
                    );
                }
                if !may_retry(f.ft, f.sent, tries_left) {
                    return Err(FetchErr {
                        status: f.status,
                        ft: f.ft,
                    });
                }
            }
        }
    }
    // Peers were left to try, but none can be used now: nginx records a
    // pseudo-attempt named after the upstream.
    let url = proto.url(&up.name);
    cx.log_up(
        Level::Error,
        "no live upstreams while connecting to upstream",
        &url,
    );
    cx.attempt(&up.name).status(502);
    // nginx's NOLIVE case, which `PREFIX_cache_use_stale error` includes.
    Err(FetchErr {
        status: 502,
        ft: ft::ERROR,
    })
}

/// One attempt on one peer: connect (or reuse), send, read the head.
#[allow(clippy::too_many_arguments)]
async fn exchange<B: BodyFeed>(
    up: &Upstream,
    addr: &PeerAddr,
    lim: &Limits,
    proto: &dyn Protocol,
    send: &Outgoing<'_>,
    head_only: bool,
    slot: &Slot,
    mut feed: Option<&mut B>,
) -> Result<UpResp, Fail> {
    // A cached connection may have been closed by the peer meanwhile; an
    // error on it is retried once on a fresh connection without blaming
    // the peer, as nginx does. A timeout is not a stale connection (the
    // peer may be working on the request): as nginx, it is the attempt's
    // result, and is not sent again here.
    // A kept connection of the other kind (plain vs TLS) is closed.
    // A protocol with its own session keeps its own kind of connection.
    if let Some(sess) = proto.session() {
        let tls = lim.tls.is_some();
        if let Some((kept, served)) = up.take_idle_session(addr, tls) {
            slot.connected();
            let keep = up.keep_to(addr, tls, served.next());
            let conn = SessionConn::Kept(kept);
            match session(sess, conn, keep, addr, lim, send, slot, feed.as_deref_mut()).await {
                Ok(r) => {
                    return Ok(UpResp {
                        requests: served.next(),
                        ..r
                    })
                }
                // Found closed before the request went: a new connection.
                Err(f) if !f.sent => {}
                Err(f) => return Err(f),
            }
        }
    }
    if let Some((s, served)) = up
        .take_idle(addr)
        .filter(|_| proto.session().is_none())
        .filter(|(s, _)| s.is_tls() == lim.tls.is_some())
    {
        slot.connected();
        match send_and_read(
            s,
            addr,
            lim,
            proto,
            send,
            head_only,
            slot,
            feed.as_deref_mut(),
        )
        .await
        {
            Ok(r) => {
                return Ok(UpResp {
                    requests: served.next(),
                    ..r
                })
            }
            Err(f) if f.status == 504 => return Err(Fail { sent: true, ..f }),
            // A streamed body that began to go cannot be sent again.
            Err(f) if feed.as_deref().is_some_and(|b| !b.untouched()) || f.status < 500 => {
                return Err(Fail { sent: true, ..f })
            }
            Err(_) => {}
        }
    }
    let s = match tokio::time::timeout(lim.connect, connect(addr, send)).await {
        Err(_) => {
            return Err(fail(
                504,
                format!("{} while connecting to upstream", TIMED_OUT),
                true,
            ))
        }
        Ok(Err(e)) => {
            // PREFIX_bind's failure carries its own words (nginx's
            // "bind(ADDR) failed (...)").
            if let Some(m) = e
                .get_ref()
                .map(|m| m.to_string())
                .filter(|m| m.starts_with("bind("))
            {
                // A local failure, as nginx: 500, not the peer's fault,
                // no next server.
                return Err(fail(
                    500,
                    format!("{} while connecting to upstream", m),
                    false,
                ));
            }
            return Err(fail(
                502,
                format!(
                    "connect() failed {} while connecting to upstream",
                    crate::core::errno_text(&e)
                ),
                true,
            ));
        }
        Ok(Ok(s)) => s,
    };
    let s = match (s, &lim.tls) {
        (s, None) => s,
        (UpStream::Plain(s), Some((cfg, name))) => {
            let hs = crate::tls::client::connect(s, cfg.clone(), name.clone());
            match tokio::time::timeout(lim.connect, hs).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return Err(fail(
                        502,
                        format!(
                            "{} while SSL handshaking to upstream",
                            crate::tls::client::handshake_error_text(&e)
                        ),
                        true,
                    ))
                }
                Err(_) => {
                    return Err(fail(
                        504,
                        format!("{} while SSL handshaking to upstream", TIMED_OUT),
                        true,
                    ))
                }
            }
        }
        (_, Some(_)) => {
            return Err(fail(
                502,
                "SSL to a unix-domain upstream is not supported by tern yet while SSL handshaking to upstream",
                false,
            ))
        }
    };
    slot.connected();
    if let Some(sess) = proto.session() {
        let keep = up.keep_to(addr, lim.tls.is_some(), peers::Uses::fresh());
        let conn = SessionConn::Fresh(s);
        return session(sess, conn, keep, addr, lim, send, slot, feed)
            .await
            .map_err(|f| Fail { sent: true, ..f });
    }
    send_and_read(s, addr, lim, proto, send, head_only, slot, feed)
        .await
        .map_err(|f| Fail { sent: true, ..f })
}

/// One exchange of a protocol with its own session (see [`Session`]),
/// the request body pumped to it as the client sends it.
#[allow(clippy::too_many_arguments)]
async fn session<B: BodyFeed>(
    sess: &dyn Session,
    conn: SessionConn,
    keep: Option<peers::KeepTo>,
    addr: &PeerAddr,
    lim: &Limits,
    send: &Outgoing<'_>,
    slot: &Slot,
    feed: Option<&mut B>,
) -> Result<UpResp, Fail> {
    {
        let a = match feed {
            Some(feed) if matches!(send.body, OutBody::Stream) => {
                // The body goes to the session as the client sends it, a
                // piece at a time (the session takes one when the peer's
                // window lets it send).
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                let exchange = sess.exchange(conn, keep, send, lim, slot, Some(rx));
                let pump = async move {
                    loop {
                        let (piece, end) = match feed.next().await {
                            Ok(Some(b)) => {
                                let last = feed.done();
                                (Ok((b, last)), last)
                            }
                            Ok(None) => (Ok((Bytes::new(), true)), true),
                            Err(st) => (Err(st), true),
                        };
                        if tx.send(piece).await.is_err() || end {
                            break;
                        }
                    }
                    std::future::pending::<()>().await
                };
                tokio::select! {
                    r = exchange => r,
                    () = pump => unreachable!("the pump never ends"),
                }
            }
            _ => sess.exchange(conn, keep, send, lim, slot, None).await,
        }?;
        slot.head(a.head.status);
        let mut r = UpResp::of(a.head, None, addr, Vec::new());
        r.trailers = a.trailers;
        r.session_body = a.body;
        Ok(r)
    }
}

/// A new connection to `addr`, from `PREFIX_bind`'s address, with
/// `PREFIX_socket_keepalive` (a unix-domain socket takes neither).
async fn connect(addr: &PeerAddr, send: &Outgoing<'_>) -> io::Result<UpStream> {
    let addr = match addr {
        PeerAddr::Unix(p) => return Ok(UpStream::Unix(tokio::net::UnixStream::connect(p).await?)),
        PeerAddr::Inet(a) => *a,
    };
    let s = connect_tcp(addr, send).await?;
    let _ = s.set_nodelay(true);
    Ok(UpStream::Plain(s))
}

async fn connect_tcp(addr: SocketAddr, send: &Outgoing<'_>) -> io::Result<TcpStream> {
    if send.bind.is_none() && !send.keepalive {
        return TcpStream::connect(addr).await;
    }
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if send.keepalive {
        sock.set_keepalive(true)?;
    }
    if let Some(local) = send.bind {
        sock.bind(local).map_err(|e| {
            // nginx names the address with its port only when one was given.
            let shown = if local.port() == 0 {
                local.ip().to_string()
            } else {
                local.to_string()
            };
            io::Error::new(
                e.kind(),
                format!("bind({}) failed {}", shown, crate::core::errno_text(&e)),
            )
        })?;
    }
    sock.connect(addr).await
}

/// Memory bodies up to this size leave in one write with the head.
const JOIN_BODY_MAX: usize = 16 * 1024;

/// Sends the head and the body (from memory, or read back from its temp
/// file through the file-I/O layer a chunk at a time).
async fn send_request<B: BodyFeed>(
    s: &mut UpStream,
    lim: &Limits,
    proto: &dyn Protocol,
    send: &Outgoing<'_>,
    slot: &Slot,
    feed: Option<&mut B>,
) -> Result<(), Fail> {
    if let OutBody::Stream = send.body {
        let Some(feed) = feed else {
            return Err(fail(500, "no request body to stream", false));
        };
        return send_streamed(s, lim, proto, send, slot, feed).await;
    }
    match send.body {
        OutBody::Mem(b) if b.len() <= JOIN_BODY_MAX => {
            let mut all = Vec::with_capacity(send.head.len() + b.len());
            all.extend_from_slice(send.head);
            all.extend_from_slice(b);
            return write_timed(s, &all, lim, slot).await;
        }
        _ => write_timed(s, send.head, lim, slot).await?,
    }
    match send.body {
        OutBody::None | OutBody::Stream => Ok(()),
        OutBody::Mem(b) => write_timed(s, b, lim, slot).await,
        OutBody::File(f, len) => {
            let mut off = 0u64;
            while off < *len {
                let n = (*len - off).min(64 * 1024) as usize;
                let data = crate::io::read(f, off, n, send.policy).await.map_err(|e| {
                    fail(
                        500,
                        format!(
                            "client request body temp file read failed {}",
                            crate::core::errno_text(&e)
                        ),
                        false,
                    )
                })?;
                if data.is_empty() {
                    return Err(fail(
                        500,
                        "client request body temp file was truncated",
                        false,
                    ));
                }
                let mut framed = Vec::new();
                match proto.frame_body(&data, &mut framed) {
                    true => write_timed(s, &framed, lim, slot).await?,
                    false => write_timed(s, &data, lim, slot).await?,
                }
                off += data.len() as u64;
            }
            let mut end = Vec::new();
            proto.end_body(&mut end);
            if !end.is_empty() {
                write_timed(s, &end, lim, slot).await?;
            }
            Ok(())
        }
    }
}

/// Sends the head, then the body piece by piece as the client's
/// connection delivers it (what came with the request head goes out with
/// the request's head, as nginx's preread buffer).
async fn send_streamed<B: BodyFeed>(
    s: &mut UpStream,
    lim: &Limits,
    proto: &dyn Protocol,
    send: &Outgoing<'_>,
    slot: &Slot,
    feed: &mut B,
) -> Result<(), Fail> {
    let client = |status: u16| Fail {
        // Already logged by the feed; not the peer's fault, not retried.
        sent: true,
        ..fail(status, "", false)
    };
    let mut out = send.head.to_vec();
    // The first piece only if it is there already: the head must not wait
    // for the client.
    if feed.untouched() {
        if let Some(r) = ready_now(feed.next()) {
            match r {
                Ok(Some(b)) => {
                    frame(proto, &b, &mut out);
                    if feed.done() {
                        proto.end_body(&mut out);
                        return write_timed(s, &out, lim, slot).await;
                    }
                }
                Ok(None) => {
                    proto.end_body(&mut out);
                    return write_timed(s, &out, lim, slot).await;
                }
                Err(st) => return Err(client(st)),
            }
        }
    }
    write_timed(s, &out, lim, slot).await?;
    loop {
        out.clear();
        match feed.next().await {
            // The last piece carries the body's end (FastCGI's empty
            // stdin record, the last chunk) in the same write.
            Ok(Some(b)) => {
                frame(proto, &b, &mut out);
                if feed.done() {
                    proto.end_body(&mut out);
                    return write_timed(s, &out, lim, slot).await;
                }
            }
            Ok(None) => {
                proto.end_body(&mut out);
                if !out.is_empty() {
                    write_timed(s, &out, lim, slot).await?;
                }
                return Ok(());
            }
            Err(st) => return Err(client(st)),
        }
        write_timed(s, &out, lim, slot).await?;
    }
}

/// A piece of the body as the protocol frames it.
fn frame(proto: &dyn Protocol, data: &[u8], out: &mut Vec<u8>) {
    let mut framed = Vec::new();
    if proto.frame_body(data, &mut framed) {
        out.extend_from_slice(&framed);
    } else {
        out.extend_from_slice(data);
    }
}

/// Polls a future once: its output when it is ready at once.
fn ready_now<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// Writes all of `data` within PREFIX_send_timeout, with nginx's log
/// wording on failure.
async fn write_timed(s: &mut UpStream, data: &[u8], lim: &Limits, slot: &Slot) -> Result<(), Fail> {
    // The flush pushes out what TLS still holds (a no-op for plain TCP).
    let write = async {
        s.write_all(data).await?;
        s.flush().await
    };
    match tokio::time::timeout(lim.send, write).await {
        Err(_) => Err(fail(
            504,
            format!("{} while sending request to upstream", TIMED_OUT),
            true,
        )),
        Ok(Err(e)) => Err(fail(
            502,
            format!(
                "writev() failed {} while sending request to upstream",
                crate::core::errno_text(&e)
            ),
            true,
        )),
        Ok(Ok(())) => {
            slot.sent(data.len());
            Ok(())
        }
    }
}

/// Sends the request and reads until the protocol's head reader has the
/// response head.
#[allow(clippy::too_many_arguments)]
async fn send_and_read<B: BodyFeed>(
    mut s: UpStream,
    addr: &PeerAddr,
    lim: &Limits,
    proto: &dyn Protocol,
    send: &Outgoing<'_>,
    head_only: bool,
    slot: &Slot,
    feed: Option<&mut B>,
) -> Result<UpResp, Fail> {
    send_request(&mut s, lim, proto, send, slot, feed).await?;
    let mut reader = proto.head_reader(head_only, lim.head_max);
    let mut buf = vec![0u8; lim.head_max.max(8 * 1024)];
    loop {
        let n = timed_read(&mut s, &mut buf, lim.read, WHILE_HEAD, true, "recv()").await;
        let n = match n {
            Ok(n) => n,
            Err(f) => return Err(with_logs(f, reader.as_mut())),
        };
        if n == 0 {
            let f = fail(
                502,
                format!("upstream prematurely closed connection {}", WHILE_HEAD),
                true,
            );
            return Err(with_logs(f, reader.as_mut()));
        }
        match reader.feed(&buf[..n]) {
            Ok(Some(h)) => {
                slot.received(n);
                slot.head(h.status);
                let logs = reader.logs();
                return Ok(UpResp::of(h, Some(s), addr, logs));
            }
            Ok(None) => slot.received(n),
            Err(f) => {
                slot.received(n);
                return Err(with_logs(f, reader.as_mut()));
            }
        }
    }
}

/// The context of errors while the head is read.
pub const WHILE_HEAD: &str = "while reading response header from upstream";

/// A failure with the lines the head reader logged before it.
fn with_logs(f: Fail, reader: &mut dyn HeadReader) -> Fail {
    let mut logs = reader.logs();
    logs.extend(f.logs);
    Fail { logs, ..f }
}

/// What an upstream error is logged with once the request's context is
/// out of reach (the reader outlives the handler).
pub struct UpLog {
    pub logger: Arc<crate::core::log::Logger>,
    pub conn: u64,
    /// `, client: ..., server: ..., request: "..."`.
    pub tail: String,
    /// `, upstream: "..."` and `, host: "..."`.
    pub upstream: String,
    pub host: String,
}

impl UpLog {
    pub fn of(cx: &Ctx<'_>, url: &str) -> UpLog {
        UpLog {
            logger: cx.logger(),
            conn: cx.conn.id,
            tail: cx.log_request_ctx(),
            upstream: format!(", upstream: \"{}\"", url),
            host: cx.log_host_ctx(),
        }
    }

    pub fn log(&self, level: Level, msg: &str, with_upstream: bool) {
        let up = if with_upstream {
            &self.upstream[..]
        } else {
            ""
        };
        self.logger.log(
            level,
            Some(self.conn),
            format_args!("{}{}{}{}", msg, self.tail, up, self.host),
        );
    }
}

/// Logs with nginx's upstream context: `..., request: "...", upstream: "...", host: "..."`.
pub fn log_upstream(cx: &Ctx<'_>, level: Level, msg: &str, upstream: &str) {
    cx.log_with_upstream(level, msg, Some(upstream));
}
