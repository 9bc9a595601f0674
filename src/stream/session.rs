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
//! A session is one task, whose future tokio moves several times when it
//! spawns it (five copies per connection under callgrind): the phases a
//! plain proxied session does not use (PROXY header, TLS handshake,
//! preread, a resolver lookup, certificates with variables, a TLS
//! connection to the upstream) are awaited boxed, so their large futures
//! are allocated only when they run and do not grow every session's.
//!
//! [`Session`] holds what the variables read (addresses, counters,
//! upstream timings, `set` values) and is the [`VarCtx`] every template of
//! the server renders against. A `limit_conn` slot is held by the session
//! until it ends, after the log phase.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use crate::core::log::{Level, Logger};
use crate::core::worker::{Slot, WorkerShared};
use crate::http::conf::ListenAddr;
use crate::http::modules::access::matches_addr;
use crate::http::response::push_num;
use crate::http::vars::{Var, VarCtx};
use crate::stream::conf::{Content, StreamAddr, StreamServer};
use crate::stream::limit_conn::Held;
use crate::stream::log::log_phase;
use crate::stream::proxy::{self, Sock};
use crate::stream::proxy_protocol as pp;
use crate::stream::ssl_preread::{self, Hello};
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

// ---- what stream and mail sessions share at accept ------------------------

/// A session's local address: the listener's own when it listens on a
/// specific address (no system call), else the socket's; None on a unix
/// socket.
pub fn local_addr(listen: &ListenAddr, sock: &Sock) -> Option<SocketAddr> {
    match (listen, sock) {
        (ListenAddr::Inet(a), _) if !a.ip().is_unspecified() => Some(*a),
        (_, Sock::Tcp(t)) => t.local_addr().ok(),
        _ => None,
    }
}

/// nginx's first info line of a session: "client ADDR connected to LISTEN".
pub struct Connected<'a>(pub Option<SocketAddr>, pub &'a ListenAddr);

impl std::fmt::Display for Connected<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(a) => write!(f, "client {} connected to {}", a, self.1),
            None => write!(f, "client unix: connected to {}", self.1),
        }
    }
}

/// realip (`set_real_ip_from`): the client a PROXY header names, when
/// the connection comes from a trusted address (`conn`: its peer).
pub fn real_client(
    from: &[crate::http::modules::access::Addr],
    conn: Option<SocketAddr>,
    h: &pp::Header,
) -> Option<SocketAddr> {
    let (ip, port) = h.src?;
    from.iter()
        .any(|a| matches_addr(a, conn.map(|r| r.ip())))
        .then_some(SocketAddr::new(ip, port))
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
    let local = local_addr(&listen, &client);
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
        s.log(Level::Info, format_args!("{}", Connected(remote, &listen)));
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
        match Box::pin(pp::read_buffered(
            client,
            &mut pre,
            srv.proxy_protocol_timeout,
        ))
        .await
        {
            Ok(h) => {
                s.bytes_received += pre.len() as u64;
                // realip: a trusted sender's PROXY header names the client.
                if let Some(a) = real_client(&srv.realip_from, s.conn_remote, &h) {
                    s.remote = Some(a);
                }
                s.pp = Some(h);
            }
            Err(msg) => {
                s.log(Level::Error, format_args!("{}, {}", msg, s.client_ctx()));
                s.status = 400;
                return None;
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
    crate::stream::limit_conn::check(s, held) && crate::stream::access::check(s)
}

/// The ssl phase (handshake on an `ssl` listener: [`crate::stream::ssl`])
/// and the preread phase (`ssl_preread`: [`ssl_preread`]); None when the
/// session ended there.
async fn tls_and_preread(s: &mut Session, client: Sock, pre: Vec<u8>) -> Option<(Sock, Vec<u8>)> {
    let (client, pre) = if s.vaddr.as_ref().is_some_and(|a| a.listen.ssl) {
        (
            Box::pin(crate::stream::ssl::phase(s, client, pre)).await?,
            Vec::new(),
        )
    } else {
        (client, pre)
    };
    if !s.srv.ssl_preread {
        return Some((client, pre));
    }
    Box::pin(ssl_preread::phase(s, client, pre)).await
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
        Content::Proxy(_) | Content::ProxyVar(..) => match proxy::target(s).await {
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
