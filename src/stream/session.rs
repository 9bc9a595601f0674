//! One stream session through nginx's stream phases, in this order (the
//! one place it is written):
//!
//! ```text
//!  accepted
//!   │ post-accept: PROXY protocol header (listen ... proxy_protocol),
//!   │              then realip (set_real_ip_from) ─── broken header ──▶ 400
//!   │ preaccess:   set (in order), limit_conn ──────── over the limit ─▶ 503
//!   │ access:      allow / deny (first match) ─────── denied ─────────▶ 403
//!   │ content:     return VALUE ─── written ────────────────────────────▶ 200
//!   │              proxy_pass ───── no peer / connect failed ──────────▶ 502
//!   │                               bad variable target ──────────────▶ 500
//!   │                               relayed until one side ends ──────▶ 200
//!   ▼ log:         every access_log of the server (with $status)
//!  closed
//! ```
//!
//! [`Session`] holds what the variables read (addresses, counters,
//! upstream timings, `set` values) and is the [`VarCtx`] every template of
//! the server renders against. A `limit_conn` slot is held by the session
//! until it ends, after the log phase.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::core::log::{Level, Logger};
use crate::core::worker::{Slot, WorkerShared};
use crate::http::conf::ListenAddr;
use crate::http::modules::access::matches_addr;
use crate::http::modules::access_log::{write_one, ErrCtx, ScriptCtx};
use crate::http::modules::limit_conn::{ConnState, Take, ZoneState};
use crate::http::response::push_num;
use crate::http::vars::{Var, VarCtx};
use crate::stream::conf::{Content, StreamAddr, StreamServer};
use crate::stream::proxy::{self, Sock};
use crate::stream::proxy_protocol::{self as pp, Parsed};
use crate::stream::ssl_preread::{self, Hello, Preread};
use crate::stream::vars::SVar;
use crate::tls::TlsInfo;

/// One upstream peer tried by a session, for `$upstream_*` (each of
/// those variables lists the attempts, comma-separated, as nginx does).
#[derive(Debug, Default)]
pub struct UpTry {
    /// The peer, or the upstream's name when no peer was left.
    pub addr: String,
    /// None: the connection failed.
    pub connect: Option<Duration>,
    pub first_byte: Option<Duration>,
    pub session: Option<Duration>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

/// What the upstream side of a session did.
#[derive(Debug, Default)]
pub struct UpInfo {
    pub tries: Vec<UpTry>,
}

impl UpInfo {
    /// Appends one value per attempt, comma-separated; false when the
    /// session reached no upstream.
    fn list(&self, out: &mut Vec<u8>, f: impl Fn(&UpTry, &mut Vec<u8>)) -> bool {
        if self.tries.is_empty() {
            return false;
        }
        for (i, t) in self.tries.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b", ");
            }
            f(t, out);
        }
        true
    }
}

/// One session's state.
pub struct Session {
    pub id: u64,
    pub start: Instant,
    /// The client's address after realip (None: a unix socket).
    pub remote: Option<SocketAddr>,
    /// The connection's own peer address.
    pub conn_remote: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    pub listen: ListenAddr,
    /// The server whose settings apply now: the address's default until
    /// an SNI name selects another (see [`Session::select_server`]).
    pub srv: Arc<StreamServer>,
    /// The servers of the listening address (None: UDP, one server).
    pub vaddr: Option<Arc<StreamAddr>>,
    /// The SNI name of the handshake in progress (`$ssl_server_name` of
    /// certificates with variables).
    pub sni: Option<String>,
    pub status: u16,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub up: UpInfo,
    pub pp: Option<pp::Header>,
    /// Values `set` gave, by user-variable index.
    pub set_vals: Vec<Option<Vec<u8>>>,
    pub limit_status: Option<&'static str>,
    pub logger: Arc<Logger>,
    /// What `ssl_preread` found in the ClientHello.
    pub hello: Option<Hello>,
    /// The TLS session of an `ssl` listener.
    pub tls: Option<TlsInfo>,
    /// The protocol ALPN settled on (`$ssl_alpn_protocol`).
    pub alpn: Option<Vec<u8>>,
    /// How many times `pass` has handed this connection on.
    pub passes: u32,
}

impl Session {
    /// A session that starts now, with nothing read yet.
    pub fn new(
        id: u64,
        remote: Option<SocketAddr>,
        local: Option<SocketAddr>,
        listen: ListenAddr,
        srv: Arc<StreamServer>,
    ) -> Session {
        Session {
            id,
            start: Instant::now(),
            remote,
            conn_remote: remote,
            local,
            listen,
            logger: srv
                .logger
                .clone()
                .unwrap_or_else(crate::core::log::main_logger),
            set_vals: vec![None; srv.vars.len()],
            srv,
            vaddr: None,
            sni: None,
            status: 200,
            bytes_received: 0,
            bytes_sent: 0,
            up: UpInfo::default(),
            pp: None,
            limit_status: None,
            hello: None,
            tls: None,
            alpn: None,
            passes: 0,
        }
    }

    /// Moves the session to the server of its address that `name` (an
    /// SNI name) selects, as nginx does in its servername callback and in
    /// ssl_preread; the named captures of a `server_name` regex become
    /// variables. From here on the new server's settings apply.
    pub fn select_server(&mut self, name: &[u8]) {
        let Some(a) = &self.vaddr else { return };
        let srv = a.select(name).clone();
        let lower = name.to_ascii_lowercase();
        let lower = lower.strip_suffix(b".").unwrap_or(&lower);
        let exact = srv.names.iter().any(|n| {
            !matches!(n, crate::http::conf::ServerName::Regex(_))
                && n.matches(std::str::from_utf8(lower).unwrap_or(""))
        });
        if !exact {
            for n in &srv.names {
                let crate::http::conf::ServerName::Regex(re) = n else {
                    continue;
                };
                let Some(caps) = re.captures(lower) else {
                    continue;
                };
                for (i, cn) in re.capture_names().iter().enumerate() {
                    let Some(cn) = cn else { continue };
                    if let Some(Var::User(v)) = srv.vars.lookup(cn) {
                        let val = caps
                            .get(i)
                            .copied()
                            .flatten()
                            .and_then(|(s, e)| lower.get(s..e))
                            .unwrap_or_default()
                            .to_vec();
                        if let Some(slot) = self.set_vals.get_mut(v) {
                            *slot = Some(val);
                        }
                    }
                }
                break;
            }
        }
        if !Arc::ptr_eq(&srv, &self.srv) {
            self.logger = srv
                .logger
                .clone()
                .unwrap_or_else(crate::core::log::main_logger);
            self.srv = srv;
        }
    }

    pub fn log(&self, level: Level, msg: std::fmt::Arguments<'_>) {
        self.logger.log(level, Some(self.id), msg);
    }

    /// nginx's error-log context of a stream session.
    pub fn client_ctx(&self) -> String {
        format!(
            "{}client: {}, server: {}",
            if matches!(self.listen, ListenAddr::Udp(_)) {
                "udp "
            } else {
                ""
            },
            self.conn_remote
                .map(|a| a.ip().to_string())
                .unwrap_or_else(|| "unix:".into()),
            self.listen
        )
    }
}

fn push_addr(out: &mut Vec<u8>, a: Option<SocketAddr>, port: bool) {
    match a {
        Some(a) if port => push_num(out, u64::from(a.port())),
        Some(a) => out.extend_from_slice(a.ip().to_string().as_bytes()),
        None if port => {}
        None => out.extend_from_slice(b"unix:"),
    }
}

/// Seconds with milliseconds, as nginx prints times ("0.012").
fn push_secs(out: &mut Vec<u8>, d: Duration) {
    out.extend_from_slice(format!("{}.{:03}", d.as_secs(), d.subsec_millis()).as_bytes());
}

fn opt_secs(out: &mut Vec<u8>, d: Option<Duration>) {
    match d {
        Some(d) => push_secs(out, d),
        None => out.push(b'-'),
    }
}

impl VarCtx for Session {
    fn var(&self, v: &Var, out: &mut Vec<u8>) -> bool {
        match v {
            Var::RemoteAddr => push_addr(out, self.remote, false),
            Var::RemotePort => push_addr(out, self.remote, true),
            Var::RealIpRemoteAddr => push_addr(out, self.conn_remote, false),
            Var::RealIpRemotePort => push_addr(out, self.conn_remote, true),
            Var::BinaryRemoteAddr => match self.remote {
                Some(SocketAddr::V4(a)) => out.extend_from_slice(&a.ip().octets()),
                Some(SocketAddr::V6(a)) => out.extend_from_slice(&a.ip().octets()),
                None => {}
            },
            Var::ServerAddr => push_addr(out, self.local, false),
            Var::ServerPort => push_addr(out, self.local, true),
            Var::BytesSent => push_num(out, self.bytes_sent),
            Var::Status => push_num(out, u64::from(self.status)),
            Var::Connection => push_num(out, self.id),
            Var::Hostname => out.extend_from_slice(crate::core::hostname().as_bytes()),
            Var::Pid => push_num(out, u64::from(std::process::id())),
            Var::NginxVersion => {
                out.extend_from_slice(crate::http::response::NGINX_VERSION.as_bytes())
            }
            Var::TernVersion => out.extend_from_slice(crate::http::response::VERSION.as_bytes()),
            Var::ServerName => out.extend_from_slice(self.srv.server_name.as_bytes()),
            Var::TimeLocal => out.extend_from_slice(&crate::http::date::time_local()),
            Var::TimeIso8601 => out.extend_from_slice(&crate::http::date::time_iso8601()),
            Var::Msec => push_secs(
                out,
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default(),
            ),
            Var::Stream(s) => return self.stream_var(*s, out),
            Var::ProxyProtocol(p) => return self.pp.as_ref().is_some_and(|h| h.render(p, out)),
            // During the handshake (certificates with variables).
            Var::SslServerName if self.tls.is_none() => match &self.sni {
                Some(n) => out.extend_from_slice(n.as_bytes()),
                None => return false,
            },
            Var::SslProtocol | Var::SslCipher | Var::SslServerName | Var::SslSessionReused => {
                let Some(t) = &self.tls else { return false };
                match v {
                    Var::SslProtocol => out.extend_from_slice(t.protocol.as_bytes()),
                    Var::SslCipher => out.extend_from_slice(t.cipher.as_bytes()),
                    Var::SslServerName => match &t.server_name {
                        Some(n) => out.extend_from_slice(n.as_bytes()),
                        None => return false,
                    },
                    _ => out.extend_from_slice(if t.reused { b"r" } else { b"." }),
                }
            }
            Var::Ssl(v) => return crate::tls::vars::eval(self.tls.as_ref(), *v, out),
            Var::User(i) => {
                if let Some(Some(v)) = self.set_vals.get(*i) {
                    out.extend_from_slice(v);
                    return true;
                }
                return match self.srv.vars.def(*i) {
                    Some(d) => d.eval(self, out),
                    // Declared by `set` only, not set (yet): empty.
                    None => true,
                };
            }
            _ => return false,
        }
        true
    }
}

impl Session {
    fn stream_var(&self, v: SVar, out: &mut Vec<u8>) -> bool {
        match v {
            SVar::BytesReceived => push_num(out, self.bytes_received),
            SVar::SessionTime => push_secs(out, self.start.elapsed()),
            SVar::Protocol => out.extend_from_slice(match self.listen {
                ListenAddr::Udp(_) => b"UDP",
                _ => b"TCP",
            }),
            SVar::UpstreamAddr => {
                return self
                    .up
                    .list(out, |t, o| o.extend_from_slice(t.addr.as_bytes()))
            }
            SVar::UpstreamBytesSent => return self.up.list(out, |t, o| push_num(o, t.bytes_sent)),
            SVar::UpstreamBytesReceived => {
                return self.up.list(out, |t, o| push_num(o, t.bytes_received))
            }
            SVar::UpstreamConnectTime => return self.up.list(out, |t, o| opt_secs(o, t.connect)),
            SVar::UpstreamFirstByteTime => {
                return self.up.list(out, |t, o| opt_secs(o, t.first_byte))
            }
            SVar::UpstreamSessionTime => return self.up.list(out, |t, o| opt_secs(o, t.session)),
            SVar::SslPrereadServerName => match &self.hello {
                Some(h) => out.extend_from_slice(&h.server_name),
                None => return false,
            },
            SVar::SslPrereadAlpnProtocols => match &self.hello {
                Some(h) => out.extend_from_slice(&h.alpn),
                None => return false,
            },
            SVar::SslPrereadProtocol => match &self.hello {
                Some(h) => out.extend_from_slice(h.protocol.as_bytes()),
                None => return false,
            },
            SVar::SslAlpnProtocol => match (&self.tls, &self.alpn) {
                (Some(_), Some(a)) => out.extend_from_slice(a),
                (Some(_), None) => {}
                (None, _) => return false,
            },
            SVar::LimitConnStatus => match self.limit_status {
                Some(s) => out.extend_from_slice(s.as_bytes()),
                None => return false,
            },
        }
        true
    }
}

/// A `limit_conn` slot held for the session's life.
pub struct Held {
    state: Arc<ConnState>,
    key: Vec<u8>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.state.release(&self.key);
    }
}

/// Serves one accepted stream connection with the server it arrived on.
/// `slot` is the `worker_connections` slot for the upstream side (None:
/// none was free).
pub async fn serve(
    client: Sock,
    remote: Option<SocketAddr>,
    listen: ListenAddr,
    vaddr: Arc<StreamAddr>,
    slot: Option<Slot>,
    shared: Arc<WorkerShared>,
    id: u64,
) {
    let local = match (&listen, &client) {
        // A listener on a specific address is its connections' local address.
        (ListenAddr::Inet(a), _) if !a.ip().is_unspecified() => Some(*a),
        (_, Sock::Tcp(t)) => t.local_addr().ok(),
        _ => None,
    };
    serve_passed(client, remote, local, listen, vaddr, slot, shared, id, 0).await
}

/// [`serve`] for a connection that `pass` handed over (`passes` times):
/// its local address is the one it was passed to.
#[allow(clippy::too_many_arguments)]
pub async fn serve_passed(
    mut client: Sock,
    remote: Option<SocketAddr>,
    local: Option<SocketAddr>,
    listen: ListenAddr,
    vaddr: Arc<StreamAddr>,
    slot: Option<Slot>,
    shared: Arc<WorkerShared>,
    id: u64,
    passes: u32,
) {
    let srv = vaddr.default.clone();
    let mut s = Session::new(id, remote, local, listen.clone(), srv);
    s.vaddr = Some(vaddr);
    s.passes = passes;
    if s.logger.enabled(Level::Info) {
        s.log(
            Level::Info,
            format_args!(
                "client {} connected to {}",
                remote
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "unix:".into()),
                listen
            ),
        );
    }
    let mut held: Vec<Held> = Vec::new();
    if let Some(pre) = phases(&mut s, &mut client, &mut held).await {
        if let Some((client, pre)) = tls_and_preread(&mut s, client, pre).await {
            if content(&mut s, client, pre, slot, &shared).await {
                // Passed to another listener: logged there, not here.
                return;
            }
        }
    }
    log_phase(&s);
    drop(held);
}

/// post-accept, preaccess and access: Some(bytes already read from the
/// client) to go on to the content phase, None when the session ended.
async fn phases(s: &mut Session, client: &mut Sock, held: &mut Vec<Held>) -> Option<Vec<u8>> {
    let srv = s.srv.clone();
    let mut pre = Vec::new();
    if s.vaddr.as_ref().is_some_and(|a| a.listen.proxy_protocol) {
        match read_pp(client, srv.proxy_protocol_timeout).await {
            Ok((h, rest)) => {
                s.bytes_received += rest.len() as u64;
                pre = rest;
                s.pp = Some(h);
            }
            Err(msg) => {
                s.log(Level::Error, format_args!("{}, {}", msg, s.client_ctx()));
                s.status = 400;
                return None;
            }
        }
        // realip: a trusted sender's PROXY header names the client.
        let trusted = srv
            .realip_from
            .iter()
            .any(|a| matches_addr(a, s.conn_remote.map(|r| r.ip())));
        if trusted {
            if let Some(Some((ip, port))) = s.pp.as_ref().map(|h| h.src) {
                s.remote = Some(SocketAddr::new(ip, port));
            }
        }
    }
    checks(s, held).then_some(pre)
}

/// The preaccess and access phases (`set`, `limit_conn`, `allow`/`deny`):
/// false when the session ended there (its status set).
pub fn checks(s: &mut Session, held: &mut Vec<Held>) -> bool {
    let srv = s.srv.clone();
    for (i, t) in &srv.sets {
        let v = t.render_vec(&*s);
        if let Some(slot) = s.set_vals.get_mut(*i) {
            *slot = Some(v);
        }
    }
    for l in &srv.limits {
        let key = l.zone.key.render_vec(&*s);
        if key.is_empty() {
            continue;
        }
        if key.len() > 255 {
            s.log(
                Level::Error,
                format_args!(
                    "the value of the \"{}\" key is more than 255 bytes: \"{}\", {}",
                    l.zone.state.key_src(),
                    String::from_utf8_lossy(&key),
                    s.client_ctx()
                ),
            );
            continue;
        }
        match l.zone.state.take(&key, l.n) {
            Take::Ok => held.push(Held {
                state: l.zone.state.clone(),
                key,
            }),
            Take::Limited | Take::NoMemory => {
                let dry = if srv.limit_dry_run { ", dry run," } else { "" };
                s.log(
                    srv.limit_log_level,
                    format_args!(
                        "limiting connections{} by zone \"{}\", {}",
                        dry,
                        l.zone.name,
                        s.client_ctx()
                    ),
                );
                if srv.limit_dry_run {
                    s.limit_status = Some("REJECTED_DRY_RUN");
                    continue;
                }
                s.limit_status = Some("REJECTED");
                held.clear();
                s.status = 503;
                return false;
            }
        }
    }
    if !srv.limits.is_empty() && s.limit_status.is_none() {
        s.limit_status = Some("PASSED");
    }
    let peer: Option<IpAddr> = s.remote.map(|a| a.ip());
    if let Some(r) = srv.access.iter().find(|r| matches_addr(&r.addr, peer)) {
        if !r.allow {
            s.log(
                Level::Error,
                format_args!("access forbidden by rule, {}", s.client_ctx()),
            );
            s.status = 403;
            return false;
        }
    }
    true
}

/// The ssl phase (handshake on an `ssl` listener) and the preread phase
/// (`ssl_preread`); None when the session ended there.
async fn tls_and_preread(
    s: &mut Session,
    client: Sock,
    mut pre: Vec<u8>,
) -> Option<(Sock, Vec<u8>)> {
    let mut client = client;
    if s.vaddr.as_ref().is_some_and(|a| a.listen.ssl) {
        let default = s.srv.clone();
        // Bytes read ahead of the handshake (after a PROXY header) belong
        // to it: the handshake reads them first.
        let inner = if pre.is_empty() {
            client
        } else {
            Sock::Prefixed(std::mem::take(&mut pre), 0, Box::new(client))
        };
        let hs = handshake(s, inner, &default);
        let r = tokio::time::timeout(default.ssl_handshake_timeout, hs).await;
        match r {
            Ok(Some((t, hello, id, auth))) => {
                let (_, c) = t.get_ref();
                let mut info = tls_info(c, hello, id, auth.as_deref());
                // `ssl_ocsp`: the responders are asked about a chain found
                // good (as http's handshake does).
                if let (Some(a), Some(chain), Ok(())) =
                    (auth.as_deref(), &info.client_chain, info.verify)
                {
                    if let Some(o) = &a.ocsp {
                        let ctx = s.client_ctx();
                        let logger = s.logger.clone();
                        let id = s.id;
                        let log = |m: &str| {
                            logger.log(Level::Info, Some(id), format_args!("{}, {}", m, ctx))
                        };
                        // Boxed: the check's future is large (~12 KB), and
                        // inline it would grow every session's future, which
                        // tokio moves several times when it spawns it.
                        info.verify =
                            Box::pin(crate::tls::ocsp::check(o, chain, a.store(), &log)).await;
                    }
                }
                s.alpn = c.alpn_protocol().map(<[u8]>::to_vec);
                client = Sock::Tls(Box::new(t));
                let refused = client_cert_refused(auth.as_deref(), &info);
                s.tls = Some(info);
                if let Some(why) = refused {
                    s.log(Level::Info, format_args!("{}, {}", why, s.client_ctx()));
                    s.status = 500;
                    return None;
                }
            }
            Ok(None) => {
                s.log(
                    Level::Info,
                    format_args!(
                        "SSL handshake failed while SSL handshaking, {}",
                        s.client_ctx()
                    ),
                );
                s.status = 500;
                return None;
            }
            Err(_) => {
                s.log(
                    Level::Info,
                    format_args!(
                        "client timed out (110: Connection timed out) while SSL handshaking, {}",
                        s.client_ctx()
                    ),
                );
                s.status = 500;
                return None;
            }
        }
    }
    let srv = s.srv.clone();
    if !srv.ssl_preread {
        return Some((client, pre));
    }
    // A plain TCP socket is only peeked at, as nginx 1.25.5 does: the
    // ClientHello stays in the socket for whoever comes next (`proxy_pass`
    // relays it, `pass` hands it over untouched). Through TLS, or after
    // bytes were read ahead, it is read.
    let peek = matches!(client, Sock::Tcp(_)) && pre.is_empty();
    let mut peeked: Vec<u8> = Vec::new();
    let read = async {
        loop {
            let seen = if peek { &peeked } else { &pre };
            match ssl_preread::parse(seen) {
                Preread::Done(h) => return Ok(Some(h)),
                Preread::NotTls => return Ok(None),
                Preread::Partial => {}
            }
            if seen.len() >= srv.preread_buffer_size {
                return Err(());
            }
            if let (true, Sock::Tcp(t)) = (peek, &client) {
                match peek_more(t, peeked.len(), srv.preread_buffer_size).await {
                    Some(v) => peeked = v,
                    None => return Ok(None),
                }
                continue;
            }
            let mut chunk = vec![0u8; srv.preread_buffer_size - pre.len()];
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => return Ok(None),
                Ok(n) => {
                    s.bytes_received += n as u64;
                    pre.extend_from_slice(&chunk[..n]);
                }
            }
        }
    };
    match tokio::time::timeout(srv.preread_timeout, read).await {
        Ok(Ok(h)) => {
            // The SNI name selects the server, as in a handshake.
            if let Some(name) = h.as_ref().map(|h| h.server_name.clone()) {
                if !name.is_empty() && s.tls.is_none() {
                    s.select_server(&name);
                }
            }
            s.hello = h;
            Some((client, pre))
        }
        Ok(Err(())) => {
            s.log(
                Level::Error,
                format_args!("preread buffer full, {}", s.client_ctx()),
            );
            s.status = 400;
            None
        }
        // nginx ends the session when the preread times out, with 200.
        Err(_) => None,
    }
}

/// Peeks at what a TCP client has sent (up to `size` bytes) once more
/// than `seen` bytes are there; None at the end of the stream or on an
/// error. Readiness is cleared when nothing new has come, so the wait is
/// for new bytes, not a spin over the old ones.
async fn peek_more(t: &tokio::net::TcpStream, seen: usize, size: usize) -> Option<Vec<u8>> {
    use std::task::{Context, Poll, Waker};
    let mut buf = vec![0u8; size];
    loop {
        let ready = t.ready(tokio::io::Interest::READABLE).await.ok()?;
        let r = t.try_io(tokio::io::Interest::READABLE, || {
            let mut rb = tokio::io::ReadBuf::new(&mut buf);
            match t.poll_peek(&mut Context::from_waker(Waker::noop()), &mut rb) {
                Poll::Ready(Ok(n)) if n == 0 || n > seen => Ok(n),
                Poll::Ready(Ok(_)) | Poll::Pending => Err(std::io::ErrorKind::WouldBlock.into()),
                Poll::Ready(Err(e)) => Err(e),
            }
        });
        match r {
            Ok(0) => return None,
            Ok(n) => {
                buf.truncate(n);
                return Some(buf);
            }
            // Nothing new, and the client has finished sending.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && ready.is_read_closed() => {
                return None
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return None,
        }
    }
}

type Handshaken = (
    tokio_rustls::server::TlsStream<Sock>,
    Offered,
    [u8; 32],
    Option<Arc<crate::tls::client_auth::ClientAuth>>,
);

/// The TLS handshake of an `ssl` address: the SNI name selects the
/// server (its certificate, or the default server's when it has none),
/// `ssl_reject_handshake` refuses it with nginx's "unrecognized_name"
/// alert, and certificates with variables are loaded for it. None: the
/// handshake failed.
async fn handshake(
    s: &mut Session,
    inner: Sock,
    default: &Arc<StreamServer>,
) -> Option<Handshaken> {
    let mut start =
        tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), inner)
            .await
            .ok()?;
    let ch = start.client_hello();
    let hello = Offered {
        server_name: ch.server_name().map(str::to_string),
        ciphers: ch.cipher_suites().into(),
        groups: ch.named_groups().unwrap_or_default().into(),
    };
    if let Some(n) = &hello.server_name {
        s.select_server(n.as_bytes());
    }
    s.sni = hello.server_name.clone();
    let chosen = s.srv.clone();
    let src = if chosen.tls.is_some() || chosen.reject_handshake {
        chosen
    } else {
        default.clone()
    };
    if src.reject_handshake {
        let _ = start
            .io
            .write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70])
            .await;
        return None;
    }
    let mut cfg = src.tls.clone()?;
    if let Some(v) = &src.var_certs {
        // Loaded for this handshake; one that cannot be loaded fails it
        // (no certificate to offer).
        let pairs = match v.load(&*s).await {
            Ok(p) => p,
            Err(msg) => {
                s.log(
                    Level::Error,
                    format_args!("{} while SSL handshaking, {}", msg, s.client_ctx()),
                );
                Vec::new()
            }
        };
        cfg = v.server_config(&cfg, pairs);
    }
    let mut id = [0u8; 32];
    let t = start
        .into_stream_with(cfg, |c| id = crate::tls::session_id(c))
        .await
        .ok()?;
    Some((t, hello, id, src.client_auth.clone()))
}

/// What a ClientHello offered (for `$ssl_server_name`, `$ssl_ciphers`,
/// `$ssl_curves`).
struct Offered {
    server_name: Option<String>,
    ciphers: Box<[rustls::CipherSuite]>,
    groups: Box<[rustls::NamedGroup]>,
}

/// The `$ssl_*` values of a handshake (as http's TLS info), with the
/// verdict on the client's certificate when `ssl_verify_client` asks for one.
fn tls_info(
    c: &rustls::ServerConnection,
    hello: Offered,
    session_id: [u8; 32],
    auth: Option<&crate::tls::client_auth::ClientAuth>,
) -> TlsInfo {
    let client_chain = c.peer_certificates().map(<[_]>::to_vec);
    let verify = match (&client_chain, auth) {
        (Some(ch), Some(a)) => a.verify(ch),
        _ => Ok(()),
    };
    TlsInfo {
        protocol: match c.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
            Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
            _ => "unknown",
        },
        cipher: c
            .negotiated_cipher_suite()
            .and_then(|s| {
                crate::tls::config::openssl_name(s.suite()).or_else(|| s.suite().as_str())
            })
            .unwrap_or("unknown"),
        server_name: hello.server_name,
        reused: c.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
        session_id,
        // Stream sessions carry no HTTP: ALPN's h2 means nothing here.
        h2: false,
        early_data: false,
        curve: c.negotiated_key_exchange_group().map(|g| g.name()),
        client_ciphers: hello.ciphers,
        client_groups: hello.groups,
        client_chain,
        verify,
    }
}

/// nginx's check after a stream handshake (`ngx_stream_ssl_handler`): a
/// certificate that failed verification ends the session (unless
/// `optional_no_ca` lets an unknown issuer through), and so does a missing
/// one with `ssl_verify_client on`. The error-log text when refused.
fn client_cert_refused(
    auth: Option<&crate::tls::client_auth::ClientAuth>,
    info: &TlsInfo,
) -> Option<String> {
    use crate::tls::client_auth::VerifyMode;
    let a = auth?;
    if let Err(e) = info.verify {
        if a.mode != VerifyMode::OptionalNoCa || !e.is_no_ca() {
            return Some(format!("client SSL certificate verify error: {}", e));
        }
    }
    if a.mode == VerifyMode::On && info.client_chain.is_none() {
        return Some("client sent no required SSL certificate".to_string());
    }
    None
}

/// Reads a PROXY protocol header; Ok((header, bytes after it)).
async fn read_pp(client: &mut Sock, timeout: Duration) -> Result<(pp::Header, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(pp::MAX_V1);
    let read = async {
        let mut chunk = [0u8; 512];
        loop {
            match pp::parse(&buf) {
                Parsed::Done(h, n) => return Ok((h, buf[n..].to_vec())),
                Parsed::Broken => {
                    let end = buf.len().min(pp::MAX_V1);
                    return Err(format!(
                        "broken header: \"{}\"",
                        String::from_utf8_lossy(&buf[..end])
                    ));
                }
                Parsed::Partial => {}
            }
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    return Err(
                        "client closed connection while reading PROXY protocol header".to_string(),
                    )
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(
            "client timed out (110: Connection timed out) while reading PROXY protocol header"
                .to_string(),
        ),
    }
}

/// The content phase; true when `pass` handed the connection over.
async fn content(
    s: &mut Session,
    mut client: Sock,
    pre: Vec<u8>,
    slot: Option<Slot>,
    shared: &Arc<WorkerShared>,
) -> bool {
    let srv = s.srv.clone();
    let upstream = match &srv.content {
        Content::Return(t) => {
            let v = t.render_vec(&*s);
            if client.write_all(&v).await.is_ok() {
                s.bytes_sent += v.len() as u64;
            }
            let _ = client.shutdown().await;
            return false;
        }
        Content::Pass(t) => {
            return crate::stream::pass::run(s, client, pre, t, slot, shared).await;
        }
        Content::Proxy(_) | Content::ProxyVar(..) => match proxy_target(s).await {
            Some(u) => u,
            None => return false,
        },
    };
    // The upstream connection is a connection of this worker too: nginx's
    // worker_connections counts both sides of a proxied session.
    let Some(_slot) = slot else {
        s.log(
            Level::Alert,
            format_args!(
                "{} worker_connections are not enough while connecting to upstream, {}",
                shared.config.load().main.connections(),
                s.client_ctx()
            ),
        );
        s.status = 502;
        return false;
    };
    proxy::run(s, client, pre, upstream, shared).await;
    false
}

/// The upstream of `proxy_pass` for this session (a variable target is
/// rendered now): an `upstream` block of that name, an address, or a
/// `host:port` whose host the server's `resolver` looks up (nginx's
/// `ngx_stream_proxy_eval` and resolve handler). None when it names
/// nothing to connect to (logged, status 500 as nginx 1.22 logs it, a
/// name that did not resolve too), or when the server has no `proxy_pass`.
pub async fn proxy_target(s: &mut Session) -> Option<Arc<crate::stream::upstream::Upstream>> {
    use crate::http::modules::resolver::{self, Unresolved};
    let srv = s.srv.clone();
    let (t, ups) = match &srv.content {
        Content::Return(_) | Content::Pass(_) => return None,
        Content::Proxy(u) => return Some(u.clone()),
        Content::ProxyVar(t, ups) => (t, ups),
    };
    let target = String::from_utf8_lossy(&t.render_vec(&*s)).into_owned();
    if let Some(u) = ups
        .get(&target)
        .cloned()
        .or_else(|| crate::stream::conf::runtime_peer(&target))
    {
        return Some(u);
    }
    let (host, port) = match crate::stream::conf::split_host_port(&target) {
        Some((h, p)) => (h, p.parse::<u16>().ok().filter(|p| *p != 0)),
        None => (&*target, None),
    };
    let why = match port {
        None if host.len() == target.len() => format!("no port in upstream \"{}\"", host),
        None => format!("invalid port in upstream \"{}\"", target),
        Some(port) => match resolver::resolve(&srv.resolver, host).await {
            Ok(ips) => {
                let addrs = ips
                    .into_iter()
                    .map(|ip| std::net::SocketAddr::new(ip, port))
                    .collect();
                return Some(crate::stream::conf::resolved_upstream(host, addrs));
            }
            Err(Unresolved::NoResolver) => format!("no resolver defined to resolve {}", host),
            Err(Unresolved::Dns(e)) => format!("{} could not be resolved ({})", host, e),
        },
    };
    s.log(Level::Error, format_args!("{}, {}", why, s.client_ctx()));
    s.status = 500;
    None
}

/// The log phase: every `access_log` of the server.
pub fn log_phase(s: &Session) {
    for l in &s.srv.logs {
        write_one(l, s, &|| ScriptCtx {
            root: Vec::new(),
            cache: None,
            err: ErrCtx {
                logger: s.logger.clone(),
                conn: s.id,
                suffix: format!(" while logging session, {}", s.client_ctx()),
            },
            // The session is over: nothing follows that the line must precede.
            wait: false,
        });
    }
}
