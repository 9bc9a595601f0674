//! `proxy_pass` and the `proxy_*` directives (nginx's
//! ngx_stream_proxy_module, less its TLS part: [`super::proxy_ssl`]): the
//! content phase of a proxied session. Find the upstream ([`target`]: a
//! `proxy_pass` with variables is rendered, a name resolved), connect to
//! a peer (trying the next one on failure), then copy bytes both ways
//! until the session ends. The directive table and setters are at the
//! end of the file.
//!
//! The copy is a hand-written poll loop rather than tokio's
//! `copy_bidirectional` because nginx's semantics need two things it does
//! not give: `proxy_timeout` is an *idle* timer reset by every successful
//! read or write on either side, and with `proxy_half_close off` (nginx's
//! default) the end of either direction ends the whole session.
//!
//! Each direction owns a `proxy_buffer_size` buffer and alternates between
//! reading into it and writing it out; it reads only when the buffer is
//! empty, so a slow receiver throttles its sender through TCP instead of
//! growing memory.

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream, UnixStream};

use crate::config::registry::{self, arg, ctx, flag, row, set_once, Args};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::core::worker::WorkerShared;
use crate::http::vars::Template;
use crate::stream::conf::{
    msecs, split_host_port, Content, ProxyConf, SrvBuild, StreamServer, StreamSetter, StreamSpec,
    SS,
};
use crate::stream::session::{Session, UpTry};
use crate::stream::upstream::{Balance, Peer, PeerAddr, Picked, Upstream};

/// A connected socket of either family: the client side or the upstream side.
pub enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// A client connection on a `listen ... ssl` address, after the handshake.
    Tls(Box<tokio_rustls::server::TlsStream<Sock>>),
    /// A connection to an upstream with `proxy_ssl on`.
    TlsUp(Box<tokio_rustls::client::TlsStream<Sock>>),
    /// A socket with bytes already read from it (`buf[pos..]`), which
    /// reads return first.
    Prefixed(Vec<u8>, usize, Box<Sock>),
}

impl AsyncRead for Sock {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Sock::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Sock::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Sock::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
            Sock::TlsUp(s) => Pin::new(&mut **s).poll_read(cx, buf),
            Sock::Prefixed(pre, pos, s) => {
                if *pos < pre.len() {
                    let n = (pre.len() - *pos).min(buf.remaining());
                    buf.put_slice(&pre[*pos..*pos + n]);
                    *pos += n;
                    return Poll::Ready(Ok(()));
                }
                Pin::new(&mut **s).poll_read(cx, buf)
            }
        }
    }
}

impl AsyncWrite for Sock {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Sock::Tcp(s) => Pin::new(s).poll_write(cx, b),
            Sock::Unix(s) => Pin::new(s).poll_write(cx, b),
            Sock::Tls(s) => Pin::new(&mut **s).poll_write(cx, b),
            Sock::TlsUp(s) => Pin::new(&mut **s).poll_write(cx, b),
            Sock::Prefixed(_, _, s) => Pin::new(&mut **s).poll_write(cx, b),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Sock::Tcp(s) => Pin::new(s).poll_flush(cx),
            Sock::Unix(s) => Pin::new(s).poll_flush(cx),
            Sock::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
            Sock::TlsUp(s) => Pin::new(&mut **s).poll_flush(cx),
            Sock::Prefixed(_, _, s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Sock::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Sock::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Sock::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
            Sock::TlsUp(s) => Pin::new(&mut **s).poll_shutdown(cx),
            Sock::Prefixed(_, _, s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

/// Connects to a peer of `upstream` (trying the next on failure, within
/// `proxy_next_upstream*`), relays until the session ends, and records
/// what happened in the session (status, counters, `$upstream_*`).
pub async fn run(
    s: &mut Session,
    client: Sock,
    pre: Vec<u8>,
    upstream: Arc<Upstream>,
    shared: &Arc<WorkerShared>,
) {
    let srv = s.srv.clone();
    let key = match &upstream.balance {
        Balance::Hash { key, .. } => key.render_vec(&*s),
        _ => Vec::new(),
    };
    let bind = srv.bind.as_ref().and_then(|t| {
        std::str::from_utf8(&t.render_vec(&*s))
            .ok()
            .and_then(|a| a.parse::<std::net::IpAddr>().ok())
    });
    let rate = |t: &crate::http::vars::Template| {
        std::str::from_utf8(&t.render_vec(&*s))
            .ok()
            .and_then(crate::config::value::size)
            .unwrap_or(0)
    };
    let rates = (rate(&srv.upload_rate), rate(&srv.download_rate));
    let ssl_name = match (&srv.proxy_ssl, &srv.proxy_ssl_name) {
        (None, _) => None,
        (Some(_), Some(t)) => Some(String::from_utf8_lossy(&t.render_vec(&*s)).into_owned()),
        (Some(_), None) => Some(upstream.name.clone()),
    };
    let pp = (srv.proxy_protocol && srv.proxy_ssl.is_some())
        .then(|| crate::stream::proxy_protocol::v1_line(s.remote, s.local));
    let tls = match (&srv.proxy_ssl, &srv.proxy_ssl_var_certs) {
        // proxy_ssl_certificate with variables: this session's pair
        // (none when the name renders empty).
        (Some(cfg), Some(v)) => match Box::pin(v.load_client(&*s)).await {
            Ok(Some(k)) => Some(crate::tls::var_certs::client_config(cfg, k)),
            Ok(None) => Some(cfg.clone()),
            Err(msg) => {
                s.log(
                    Level::Error,
                    format_args!(
                        "{} while SSL handshaking to upstream, {}",
                        msg,
                        s.client_ctx()
                    ),
                );
                s.status = 500;
                return;
            }
        },
        (cfg, _) => cfg.clone(),
    };
    // proxy_ssl_alpn with variables: this session's protocols (a clone of
    // the configuration shares its session cache).
    let tls = match (tls, &srv.proxy_ssl_alpn) {
        (Some(cfg), Some(list)) => {
            let alpn: Vec<Vec<u8>> = list
                .iter()
                .map(|t| t.render_vec(&*s))
                .filter(|p| !p.is_empty())
                .collect();
            if alpn.is_empty() {
                Some(cfg)
            } else {
                let mut c = (*cfg).clone();
                c.alpn_protocols = alpn;
                Some(Arc::new(c))
            }
        }
        (tls, _) => tls,
    };
    let how = Dial {
        bind,
        tls,
        ssl_name,
        pp,
    };
    let Some((up, peer)) = connect(s, &srv, &upstream, key, &how).await else {
        s.status = 502;
        return;
    };
    // tcp_nodelay: set before the second send on each plain TCP socket
    // (see Dir::nodelay), so a session of one answer costs no setsockopt.
    let nodelay = (
        srv.tcp_nodelay && matches!(up, Sock::Tcp(_)) && srv.proxy_ssl.is_none(),
        srv.tcp_nodelay && matches!(client, Sock::Tcp(_)),
    );
    s.log(
        Level::Info,
        format_args!("proxy connected to {}", peer.name),
    );
    // What goes to the upstream before the client's next bytes: the
    // PROXY header (proxy_protocol on), then what was read ahead.
    let mut first = Vec::new();
    if srv.proxy_protocol && srv.proxy_ssl.is_none() {
        first = crate::stream::proxy_protocol::v1_line(s.remote, s.local);
    }
    let pre_len = pre.len() as u64;
    first.extend_from_slice(&pre);
    let connected_at = Instant::now();
    // A graceful stop (QUIT) does not cut sessions: like nginx, a worker
    // waits for them (bounded by worker_shutdown_timeout); only idle http
    // keepalives are closed early. A reload cuts nothing either, unless
    // worker_shutdown_timeout is set: then, as nginx's old workers do, a
    // session of the replaced configuration ends that long after it.
    let drain = shared
        .config
        .load()
        .main
        .worker_shutdown_timeout_ms
        .map(|ms| Drain {
            shared: shared.clone(),
            listen: s.listen.clone(),
            srv: Served::Stream(srv.clone()),
            after: Duration::from_millis(ms),
        });
    let opts = Relay {
        buffer_size: srv.buffer_size,
        timeout: srv.timeout,
        half_close: srv.half_close,
    };
    let (end, bytes, first_byte) = pump(client, up, opts, first, rates, nodelay, drain).await;
    if let Some(t) = s.up.tries.last_mut() {
        let connect = t.connect.unwrap_or_default();
        t.session = Some(connected_at.elapsed() + connect);
        t.first_byte = first_byte.map(|f| f.duration_since(connected_at) + connect);
        t.bytes_sent = bytes.to_upstream;
        t.bytes_received = bytes.from_upstream;
    }
    s.bytes_received += bytes.from_client;
    s.bytes_sent += bytes.to_client;
    let from_client = bytes.from_client + pre_len;
    // The closing lines are all info: most configurations do not log
    // them, so nothing is built for them then.
    if !s.logger.enabled(Level::Info) {
        drop(peer);
        return;
    }
    let tail = format!(
        "{}, upstream: \"{}\", bytes from/to client:{}/{}, bytes from/to upstream:{}/{}",
        s.client_ctx(),
        peer.name,
        from_client,
        bytes.to_client,
        bytes.from_upstream,
        bytes.to_upstream
    );
    match end {
        End::Closed(who) => s.log(
            Level::Info,
            format_args!(
                "{} disconnected, bytes from/to client:{}/{}, bytes from/to upstream:{}/{} while proxying connection, {}",
                who,
                from_client,
                bytes.to_client,
                bytes.from_upstream,
                bytes.to_upstream,
                tail
            ),
        ),
        End::Shutdown => s.log(
            Level::Info,
            format_args!("*{} shutdown timeout, {}", s.id, tail),
        ),
        End::TimedOut => s.log(
            Level::Info,
            format_args!(
                "connection timed out (110: Connection timed out) while proxying connection, {}",
                tail
            ),
        ),
        End::Error(who, e) => s.log(
            Level::Info,
            format_args!(
                "{}() failed {} while proxying {}, {}",
                who.op,
                crate::core::errno_text(&e),
                who.side,
                tail
            ),
        ),
    }
    drop(peer);
}

/// Picks peers until one accepts, within `proxy_next_upstream*` limits.
async fn connect(
    s: &mut Session,
    srv: &StreamServer,
    upstream: &Arc<Upstream>,
    key: Vec<u8>,
    how: &Dial,
) -> Option<(Sock, Picked)> {
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
        let attempt = tokio::time::timeout(srv.connect_timeout, async {
            let mut sock = dial(&peer.addr, srv, how.bind).await?;
            if let (Some(cfg), Some(name)) = (&how.tls, &how.ssl_name) {
                if let Some(pp) = &how.pp {
                    sock.write_all(pp).await?;
                }
                let name = crate::tls::client::server_name(name).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "invalid proxy_ssl_name")
                })?;
                // Boxed: the handshake's future holds a whole rustls
                // connection, and inline it would grow every session's
                // future, plain ones too (see [`crate::stream::session`]).
                let t = Box::pin(tokio_rustls::TlsConnector::from(cfg.clone()).connect(name, sock))
                    .await?;
                sock = Sock::TlsUp(Box::new(t));
            }
            Ok::<Sock, io::Error>(sock)
        })
        .await;
        let err = match attempt {
            Ok(Ok(sock)) => {
                if let Some(t) = s.up.tries.last_mut() {
                    t.connect = Some(t0.elapsed());
                }
                peer.connected();
                return Some((sock, peer));
            }
            Ok(Err(e)) => format!(
                "connect() failed {} while connecting to upstream",
                crate::core::errno_text(&e)
            ),
            Err(_) => "upstream timed out (110: Connection timed out) while connecting to upstream"
                .to_string(),
        };
        s.log(
            Level::Error,
            format_args!("{}, {}, upstream: \"{}\"", err, s.client_ctx(), peer.name),
        );
        peer.failed();
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

/// How to reach a peer: the local address (`proxy_bind`), the TLS name
/// (`proxy_ssl`), and a PROXY header to send before the TLS handshake.
struct Dial {
    bind: Option<std::net::IpAddr>,
    /// `proxy_ssl`'s configuration for this session's connections.
    tls: Option<Arc<rustls::ClientConfig>>,
    ssl_name: Option<String>,
    pp: Option<Vec<u8>>,
}

async fn dial(
    addr: &PeerAddr,
    srv: &StreamServer,
    bind: Option<std::net::IpAddr>,
) -> io::Result<Sock> {
    match addr {
        PeerAddr::Inet(a) => {
            let s = if a.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            if srv.socket_keepalive {
                s.set_keepalive(true)?;
            }
            if let Some(ip) = bind.filter(|ip| ip.is_ipv4() == a.is_ipv4()) {
                s.bind(std::net::SocketAddr::new(ip, 0))?;
            }
            let t = s.connect(*a).await?;
            // With proxy_ssl the handshake writes first, outside the relay;
            // otherwise the relay sets it when needed (see Dir::nodelay).
            if srv.tcp_nodelay && srv.proxy_ssl.is_some() {
                let _ = t.set_nodelay(true);
            }
            Ok(Sock::Tcp(t))
        }
        PeerAddr::Unix(p) => Ok(Sock::Unix(UnixStream::connect(p).await?)),
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Bytes {
    pub from_client: u64,
    pub to_client: u64,
    pub from_upstream: u64,
    pub to_upstream: u64,
}

/// Which socket call failed, on which side, for the log line.
pub struct Failed {
    pub op: &'static str,
    pub side: &'static str,
}

/// How a session ended.
pub enum End {
    /// A side closed ("client" or "upstream"), all its data delivered.
    Closed(&'static str),
    TimedOut,
    /// worker_shutdown_timeout ran out after a reload.
    Shutdown,
    Error(Failed, io::Error),
}

/// How a session notices that a reload replaced its configuration: its
/// listening address is served by another server object now (or none).
/// Checked once a second, only when worker_shutdown_timeout is set.
pub struct Drain {
    shared: Arc<WorkerShared>,
    listen: crate::http::conf::ListenAddr,
    srv: Served,
    after: Duration,
}

/// The server object a session belongs to.
enum Served {
    Stream(Arc<StreamServer>),
    Mail(Arc<crate::mail::conf::MailServer>),
}

impl Drain {
    const CHECK: Duration = Duration::from_secs(1);

    /// For a mail session on `listen` served by `srv`: None without
    /// worker_shutdown_timeout (a reload then cuts nothing).
    pub fn mail(
        shared: &Arc<WorkerShared>,
        listen: &crate::http::conf::ListenAddr,
        srv: &Arc<crate::mail::conf::MailServer>,
    ) -> Option<Drain> {
        let ms = shared.config.load().main.worker_shutdown_timeout_ms?;
        Some(Drain {
            shared: shared.clone(),
            listen: listen.clone(),
            srv: Served::Mail(srv.clone()),
            after: Duration::from_millis(ms),
        })
    }

    fn replaced(&self) -> bool {
        let cfg = self.shared.config.load();
        match &self.srv {
            Served::Stream(srv) => match cfg
                .stream
                .as_ref()
                .and_then(|c| c.by_addr.get(&self.listen))
            {
                Some(now) => !now.servers.iter().any(|n| Arc::ptr_eq(n, srv)),
                None => true,
            },
            Served::Mail(srv) => match cfg.mail.as_ref().and_then(|c| c.server_for(&self.listen)) {
                Some(now) => !Arc::ptr_eq(&now, srv),
                None => true,
            },
        }
    }
}

/// The settings of a relay (a stream server's, or a mail server's).
#[derive(Debug, Clone, Copy)]
pub struct Relay {
    pub buffer_size: usize,
    /// Idle time after which the session ends.
    pub timeout: Duration,
    pub half_close: bool,
}

/// Copies both ways between an established client and upstream until
/// one side closes, an error, or `timeout` passes without a byte moving
/// (the mail proxy's relay after its login). `first` goes to the
/// upstream before anything read from the client. `drain`: the session
/// ends worker_shutdown_timeout after a reload replaced its server.
pub async fn relay(
    client: Sock,
    upstream: Sock,
    opts: Relay,
    first: Vec<u8>,
    drain: Option<Drain>,
) -> (End, Bytes) {
    let (end, bytes, _) = pump(client, upstream, opts, first, (0, 0), (false, false), drain).await;
    (end, bytes)
}

/// Relay buffers of ended sessions, kept by each worker for the next
/// ones: a session needs two `proxy_buffer_size` buffers, and allocating
/// them zeroed cost more user-space instructions than the rest of a short
/// session together (callgrind: 33k of 58k per proxied connection, the
/// memset, plus malloc's consolidation of its fast bins before each large
/// request). A buffer's old bytes are never sent: a direction writes only
/// what it has read since it began (`pos..end`).
const KEPT_BUFS: usize = 64;

thread_local! {
    static BUFS: std::cell::RefCell<Vec<Box<[u8]>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A relay buffer of `size` bytes (contents unspecified).
fn take_buf(size: usize) -> Box<[u8]> {
    let kept = BUFS.with(|b| {
        let mut b = b.borrow_mut();
        // Servers with another proxy_buffer_size keep theirs here too.
        let i = b.iter().rposition(|x| x.len() == size)?;
        Some(b.swap_remove(i))
    });
    kept.unwrap_or_else(|| vec![0u8; size].into_boxed_slice())
}

/// Returns a relay buffer to the worker's pool (full: it is freed).
fn give_back(buf: Box<[u8]>) {
    BUFS.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < KEPT_BUFS {
            b.push(buf);
        }
    });
}

impl Drop for Dir {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.buf));
    }
}

/// A relay buffer of the worker's pool that goes back to it when dropped
/// (a UDP session's upstream buffer: without the pool, each session
/// allocated its `proxy_buffer_size` zeroed, 16k instructions of memset
/// per DNS-like datagram under callgrind, a third of the session's).
pub(crate) struct PooledBuf(Box<[u8]>);

impl PooledBuf {
    /// `size` bytes (contents unspecified: write before reading).
    pub(crate) fn take(size: usize) -> PooledBuf {
        PooledBuf(take_buf(size))
    }
}

impl std::ops::Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.0));
    }
}

/// One direction of the copy.
struct Dir {
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// The source sent FIN.
    eof: bool,
    /// FIN passed on to the destination (half-close mode only).
    shut: bool,
    read: u64,
    written: u64,
    /// `proxy_upload_rate` / `proxy_download_rate` (bytes/s; 0 = none).
    rate: u64,
    start: Instant,
    /// Waiting for the rate to allow the next read.
    delay: Option<Pin<Box<tokio::time::Sleep>>>,
    /// When the first byte was read.
    first_read: Option<Instant>,
    /// `tcp_nodelay` still to be set on the destination (a plain TCP
    /// socket), before its second send: Nagle never holds the first send
    /// on a connection (Linux delays a partial segment only while an
    /// earlier small one is unacknowledged), so this is the same as
    /// setting it at once, without a setsockopt for a one-send session.
    nodelay: bool,
}

impl Dir {
    /// A direction whose buffer starts with `first` (sent before anything
    /// read from the source).
    fn new(size: usize, rate: u64, first: Vec<u8>, nodelay: bool) -> Dir {
        let end = first.len();
        let buf = if end > size {
            first.into_boxed_slice()
        } else {
            let mut b = take_buf(size);
            b[..end].copy_from_slice(&first);
            b
        };
        Dir {
            buf,
            pos: 0,
            end,
            eof: false,
            shut: false,
            read: 0,
            written: 0,
            rate,
            start: Instant::now(),
            delay: None,
            first_read: None,
            nodelay,
        }
    }

    /// How many bytes the rate allows now: nginx's limit, the rate times
    /// the whole seconds since the start plus one, less what was read.
    /// When none, arms the delay until the second in which some will be.
    fn allowance(&mut self) -> usize {
        if self.rate == 0 {
            return self.buf.len();
        }
        let secs = self.start.elapsed().as_secs();
        let limit = self.rate.saturating_mul(secs + 1);
        if limit > self.read {
            return usize::try_from(limit - self.read)
                .unwrap_or(usize::MAX)
                .min(self.buf.len());
        }
        // The first whole second s with rate * (s + 1) > read.
        let s = (self.read + 1).div_ceil(self.rate).saturating_sub(1);
        let at = self.start + Duration::from_secs(s);
        self.delay = Some(Box::pin(tokio::time::sleep_until(at.into())));
        0
    }

    /// Moves data from `src` to `dst` until blocked. Ready(Ok) means the
    /// direction is finished: the source closed and everything it sent was
    /// written (and, with `half_close`, the FIN passed on). `active` is set
    /// when any byte moved, to restart the idle timer.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        src: &mut Sock,
        dst: &mut Sock,
        half_close: bool,
        active: &mut bool,
    ) -> Poll<Result<(), (&'static str, bool, io::Error)>> {
        loop {
            if self.pos < self.end {
                if self.nodelay && self.written > 0 {
                    if let Sock::Tcp(t) = &*dst {
                        let _ = t.set_nodelay(true);
                    }
                    self.nodelay = false;
                }
                match Pin::new(&mut *dst).poll_write(cx, &self.buf[self.pos..self.end]) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err((
                            "send",
                            false,
                            io::Error::from(io::ErrorKind::WriteZero),
                        )))
                    }
                    Poll::Ready(Ok(n)) => {
                        self.pos += n;
                        self.written += n as u64;
                        *active = true;
                        if self.pos == self.end {
                            self.pos = 0;
                            self.end = 0;
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(("send", false, e))),
                    Poll::Pending => return Poll::Pending,
                }
            } else if self.eof {
                if !half_close || self.shut {
                    return Poll::Ready(Ok(()));
                }
                match Pin::new(&mut *dst).poll_shutdown(cx) {
                    Poll::Ready(Ok(())) => self.shut = true,
                    // The peer may already be gone; the direction is over anyway.
                    Poll::Ready(Err(_)) => self.shut = true,
                    Poll::Pending => return Poll::Pending,
                }
            } else {
                if let Some(d) = &mut self.delay {
                    match d.as_mut().poll(cx) {
                        Poll::Ready(()) => self.delay = None,
                        Poll::Pending => return Poll::Pending,
                    }
                }
                let room = self.allowance();
                if room == 0 {
                    continue;
                }
                let mut rb = ReadBuf::new(&mut self.buf[..room]);
                match Pin::new(&mut *src).poll_read(cx, &mut rb) {
                    Poll::Ready(Ok(())) => {
                        let n = rb.filled().len();
                        if n == 0 {
                            self.eof = true;
                        } else {
                            self.end = n;
                            self.read += n as u64;
                            self.first_read.get_or_insert_with(Instant::now);
                            *active = true;
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(("recv", true, e))),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }
    }
}

/// Copies both ways until the session ends; returns why, the byte
/// counts, and when the upstream's first byte came. `first` goes to the
/// upstream before anything the client sends from now on.
async fn pump(
    mut client: Sock,
    mut upstream: Sock,
    srv: Relay,
    first: Vec<u8>,
    (upload_rate, download_rate): (u64, u64),
    (nodelay_up, nodelay_client): (bool, bool),
    drain: Option<Drain>,
) -> (End, Bytes, Option<Instant>) {
    // The reload check: None without worker_shutdown_timeout; once the
    // configuration was replaced, the timer runs to the session's end.
    let mut check = drain
        .as_ref()
        .map(|_| Box::pin(tokio::time::sleep(Drain::CHECK)));
    let mut draining = false;
    let mut down = Dir::new(srv.buffer_size, download_rate, Vec::new(), nodelay_client); // upstream -> client
    let mut up = Dir::new(srv.buffer_size, upload_rate, first, nodelay_up); // client -> upstream
    let (mut up_done, mut down_done) = (false, false);
    let idle = tokio::time::sleep(srv.timeout);
    tokio::pin!(idle);
    let end = poll_fn(|cx| {
        let mut active = false;
        if !up_done {
            match up.poll(cx, &mut client, &mut upstream, srv.half_close, &mut active) {
                Poll::Ready(Ok(())) => up_done = true,
                Poll::Ready(Err((op, on_src, e))) => {
                    let side = if on_src { "client" } else { "upstream" };
                    return Poll::Ready(End::Error(Failed { op, side }, e));
                }
                Poll::Pending => {}
            }
        }
        if !down_done {
            match down.poll(cx, &mut upstream, &mut client, srv.half_close, &mut active) {
                Poll::Ready(Ok(())) => down_done = true,
                Poll::Ready(Err((op, on_src, e))) => {
                    let side = if on_src { "upstream" } else { "client" };
                    return Poll::Ready(End::Error(Failed { op, side }, e));
                }
                Poll::Pending => {}
            }
        }
        // Without half-close, the first side to finish ends the session
        // (after its data went through); with it, both must finish.
        let finished = if srv.half_close {
            up_done && down_done
        } else {
            up_done || down_done
        };
        if finished {
            return Poll::Ready(End::Closed(if up_done { "client" } else { "upstream" }));
        }
        if active {
            idle.as_mut()
                .reset(tokio::time::Instant::now() + srv.timeout);
        }
        if let (Some(t), Some(d)) = (&mut check, &drain) {
            while t.as_mut().poll(cx).is_ready() {
                if draining {
                    return Poll::Ready(End::Shutdown);
                }
                let next = if d.replaced() {
                    draining = true;
                    d.after
                } else {
                    Drain::CHECK
                };
                t.as_mut().reset(tokio::time::Instant::now() + next);
            }
        }
        match idle.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(End::TimedOut),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    // A TLS client gets close_notify (one try, as nginx's SSL_shutdown):
    // without it, clients drop the session instead of caching it.
    if matches!(client, Sock::Tls(_)) {
        let _ = poll_fn(|cx| Poll::Ready(Pin::new(&mut client).poll_shutdown(cx))).await;
    }
    let bytes = Bytes {
        from_client: up.read,
        to_upstream: up.written,
        from_upstream: down.read,
        to_client: down.written,
    };
    (end, bytes, down.first_read)
}

// ---- the upstream of proxy_pass --------------------------------------------

/// The upstream of `proxy_pass` for this session (a variable target is
/// rendered now): an `upstream` block of that name, an address, or a
/// `host:port` whose host the server's `resolver` looks up (nginx's
/// `ngx_stream_proxy_eval` and resolve handler). None when it names
/// nothing to connect to (logged, status 500 as nginx 1.22 logs it, a
/// name that did not resolve too), or when the server has no `proxy_pass`.
pub async fn target(s: &mut Session) -> Option<Arc<Upstream>> {
    use crate::http::modules::resolver::{self, Unresolved};
    let srv = s.srv.clone();
    let (t, ups) = match &srv.content {
        Content::Return(_) | Content::Pass(_) => return None,
        Content::Proxy(u) => return Some(u.clone()),
        Content::ProxyVar(t, ups) => (t, ups),
    };
    let target = String::from_utf8_lossy(&t.render_vec(&*s)).into_owned();
    if let Some(u) = ups.get(&target).cloned().or_else(|| runtime_peer(&target)) {
        return Some(u);
    }
    let (host, port) = match split_host_port(&target) {
        Some((h, p)) => (h, p.parse::<u16>().ok().filter(|p| *p != 0)),
        None => (&*target, None),
    };
    let why = match port {
        None if host.len() == target.len() => format!("no port in upstream \"{}\"", host),
        None => format!("invalid port in upstream \"{}\"", target),
        // Boxed, as the rare paths of a session are (see session's doc).
        Some(port) => match Box::pin(resolver::resolve(&srv.resolver, host)).await {
            Ok(ips) => {
                let addrs = ips
                    .into_iter()
                    .map(|ip| std::net::SocketAddr::new(ip, port))
                    .collect();
                return Some(resolved_upstream(host, addrs));
            }
            Err(Unresolved::NoResolver) => format!("no resolver defined to resolve {}", host),
            Err(Unresolved::Dns(e)) => format!("{} could not be resolved ({})", host, e),
        },
    };
    s.log(Level::Error, format_args!("{}, {}", why, s.client_ctx()));
    s.status = 500;
    None
}

// ---- the directives ---------------------------------------------------------

/// The proxy module's directives (its TLS ones: [`super::proxy_ssl`]).
pub const DIRECTIVES: &[StreamSpec] = &[
    row!(
        "proxy_pass",
        ctx::STREAM_SRV,
        Args::take(1),
        StreamSetter::Srv(set_proxy_pass)
    ),
    row!(
        "proxy_connect_timeout",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_connect_timeout)
    ),
    row!(
        "proxy_timeout",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_timeout)
    ),
    row!(
        "proxy_buffer_size",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_buffer_size)
    ),
    row!(
        "proxy_next_upstream",
        SS,
        Args::Flag,
        StreamSetter::Proxy(set_next_upstream)
    ),
    row!(
        "proxy_next_upstream_tries",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_next_upstream_tries)
    ),
    row!(
        "proxy_next_upstream_timeout",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_next_upstream_timeout)
    ),
    row!(
        "proxy_half_close",
        SS,
        Args::Flag,
        StreamSetter::Proxy(set_half_close)
    ),
    row!(
        "proxy_socket_keepalive",
        SS,
        Args::Flag,
        StreamSetter::Proxy(set_socket_keepalive)
    ),
    row!(
        "proxy_bind",
        SS,
        Args::take12(),
        StreamSetter::Proxy(set_bind)
    ),
    row!(
        "proxy_protocol",
        SS,
        Args::Flag,
        StreamSetter::Proxy(set_proxy_protocol)
    ),
    row!(
        "proxy_download_rate",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_download_rate)
    ),
    row!(
        "proxy_upload_rate",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_upload_rate)
    ),
    row!(
        "proxy_responses",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_responses)
    ),
    row!(
        "proxy_requests",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_requests)
    ),
];

fn set_proxy_pass(sb: &mut SrvBuild, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if sb.pass.is_some() {
        return Err(registry::duplicate(d));
    }
    sb.pass = Some((arg(d, 0).to_string(), d.clone()));
    sb.last_content = "proxy_pass";
    Ok(())
}

fn set_connect_timeout(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = msecs(d)?;
    set_once(&mut p.connect_timeout, v, d)
}

fn set_timeout(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = msecs(d)?;
    set_once(&mut p.timeout, v, d)
}

fn set_buffer_size(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = value::size(arg(d, 0))
        .filter(|n| *n > 0)
        .ok_or_else(|| registry::slot_invalid(d))? as usize;
    set_once(&mut p.buffer_size, v, d)
}

fn set_next_upstream(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.next_upstream, v, d)
}

fn set_next_upstream_tries(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = value::number(arg(d, 0)).ok_or_else(|| registry::slot_invalid_number(d))? as usize;
    set_once(&mut p.next_upstream_tries, v, d)
}

fn set_next_upstream_timeout(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = msecs(d)?;
    set_once(&mut p.next_upstream_timeout, v, d)
}

fn set_half_close(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.half_close, v, d)
}

fn set_socket_keepalive(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.socket_keepalive, v, d)
}

/// `proxy_bind ADDR | off` (ADDR may have variables).
fn set_bind(p: &mut ProxyConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if p.bind.is_some() {
        return Err(registry::duplicate(d));
    }
    let a = arg(d, 0);
    if d.args.len() > 1 {
        // `transparent` needs CAP_NET_ADMIN and routing set up for it.
        return Err(ConfError::at(
            format!(
                "the \"{}\" parameter of \"proxy_bind\" is not supported by tern yet",
                arg(d, 1)
            ),
            d,
        ));
    }
    if a == "off" {
        p.bind = Some(None);
        return Ok(());
    }
    let t = cx.template(a, d)?;
    if !t.has_vars() && a.parse::<std::net::IpAddr>().is_err() {
        return Err(ConfError::at(format!("invalid address \"{}\"", a), d));
    }
    p.bind = Some(Some(t));
    Ok(())
}

fn set_proxy_protocol(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.proxy_protocol, v, d)
}

/// A size that may have variables (checked now when it has none).
fn rate(d: &Directive, cx: &mut Compiler) -> ConfResult<Template> {
    let t = cx.template(arg(d, 0), d)?;
    if !t.has_vars() && value::size(arg(d, 0)).is_none() {
        return Err(registry::slot_invalid(d));
    }
    Ok(t)
}

fn set_download_rate(p: &mut ProxyConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let v = rate(d, cx)?;
    set_once(&mut p.download_rate, v, d)
}

fn set_upload_rate(p: &mut ProxyConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let v = rate(d, cx)?;
    set_once(&mut p.upload_rate, v, d)
}

fn set_proxy_responses(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = registry::num_arg(d, 0)?;
    set_once(&mut p.responses, v, d)
}

fn set_proxy_requests(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = registry::num_arg(d, 0)?;
    set_once(&mut p.requests, v, d)
}

/// nginx's implicit upstream of `proxy_pass host:port`: every address of
/// the name, default weight and failure accounting.
pub(crate) fn implicit_upstream(target: &str, peers: Vec<PeerAddr>) -> Arc<Upstream> {
    let peers = peers
        .into_iter()
        .map(|addr| Peer {
            name: addr.to_string(),
            server: target.to_string(),
            addr,
            weight: 1,
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
            max_conns: 0,
            down: false,
        })
        .collect();
    Arc::new(Upstream::new(
        target.to_string(),
        peers,
        Vec::new(),
        Balance::RoundRobin,
    ))
}

/// The upstream of a name `proxy_pass` with variables rendered, resolved
/// at run time: named by the host, a peer per address in the order the
/// resolver gave them (nginx's `ngx_stream_upstream_create_round_robin_peer`).
pub fn resolved_upstream(host: &str, addrs: Vec<SocketAddr>) -> Arc<Upstream> {
    implicit_upstream(host, addrs.into_iter().map(PeerAddr::Inet).collect())
}

/// An address that `proxy_pass` with variables rendered: `unix:PATH` or
/// `ip:port` (a name goes to the resolver: see [`target`]).
pub fn runtime_peer(target: &str) -> Option<Arc<Upstream>> {
    if let Some(p) = target.strip_prefix("unix:") {
        if p.is_empty() {
            return None;
        }
        return Some(implicit_upstream(
            target,
            vec![PeerAddr::Unix(PathBuf::from(p))],
        ));
    }
    let (host, port) = split_host_port(target)?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    let ip: std::net::IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    Some(implicit_upstream(
        target,
        vec![PeerAddr::Inet(SocketAddr::new(ip, port))],
    ))
}
