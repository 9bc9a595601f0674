//! One mail session: what every protocol shares (reading the client's
//! command lines, decoding SASL answers for [`crate::mail::sasl`], the
//! salt, TLS, the log) and the
//! sequence of the session (see the state diagram in [`crate::mail`]).
//!
//! The protocol's dialogue ([`crate::mail::pop3`], `imap`, `smtp`) reads
//! commands through [`Client`] and ends with the credentials of an
//! [`Auth`]; [`login`] then asks `auth_http`, logs in to the backend and
//! relays.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::core::log::{Level, Logger};
use crate::core::worker::Slot;
use crate::http::conf::ListenAddr;
use crate::mail::auth_http::{self, Verdict};
use crate::mail::conf::{MailServer, Protocol};
use crate::stream::proxy::{self, Sock};
use crate::stream::proxy_protocol as pp;
use crate::tls::client_auth::Refusal;
use crate::tls::TlsInfo;

/// The authentication method, as `Auth-Method` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Plain,
    Login,
    Apop,
    CramMd5,
    External,
    None,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            // AUTH LOGIN is asked as "plain", as nginx does.
            Method::Plain | Method::Login => "plain",
            Method::Apop => "apop",
            Method::CramMd5 => "cram-md5",
            Method::External => "external",
            Method::None => "none",
        }
    }
}

/// Credentials a client gave, for `auth_http`.
#[derive(Debug, Clone)]
pub struct Auth {
    pub method: Method,
    pub login: Vec<u8>,
    pub passwd: Vec<u8>,
}

/// Why reading from the client stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadErr {
    Closed,
    TimedOut,
    /// The client buffer filled without a line end.
    TooLong,
}

/// The client connection and what was read from it but not yet used.
pub struct Client {
    /// None only while a TLS handshake has it.
    pub sock: Option<Sock>,
    pub buf: Vec<u8>,
    /// `*_client_buffer`: the longest command line.
    pub limit: usize,
    pub timeout: Duration,
}

impl Client {
    /// Reads up to and including the next LF; returns the line without
    /// its CRLF (or bare LF).
    pub async fn line(&mut self) -> Result<Vec<u8>, ReadErr> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let mut l: Vec<u8> = self.buf.drain(..=i).collect();
                l.pop();
                if l.last() == Some(&b'\r') {
                    l.pop();
                }
                return Ok(l);
            }
            if self.buf.len() >= self.limit {
                return Err(ReadErr::TooLong);
            }
            self.fill().await?;
        }
    }

    /// Reads more bytes into the buffer (at most up to `limit`).
    pub async fn fill(&mut self) -> Result<(), ReadErr> {
        let mut chunk = [0u8; 4096];
        let room = self
            .limit
            .saturating_sub(self.buf.len())
            .clamp(1, chunk.len());
        let Some(sock) = self.sock.as_mut() else {
            return Err(ReadErr::Closed);
        };
        match tokio::time::timeout(self.timeout, sock.read(&mut chunk[..room])).await {
            Err(_) => Err(ReadErr::TimedOut),
            Ok(Ok(0)) | Ok(Err(_)) => Err(ReadErr::Closed),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
        }
    }

    pub async fn send(&mut self, b: &[u8]) -> bool {
        let Some(sock) = self.sock.as_mut() else {
            return false;
        };
        matches!(
            tokio::time::timeout(self.timeout, async {
                sock.write_all(b).await?;
                sock.flush().await
            })
            .await,
            Ok(Ok(()))
        )
    }
}

/// Session-wide state shared by the protocol dialogues.
pub struct Session {
    pub id: u64,
    pub srv: Arc<MailServer>,
    pub logger: Arc<Logger>,
    /// The client's address (after realip).
    pub remote: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    pub listen: ListenAddr,
    /// `<pid.time@server_name>` CRLF, once made (APOP, CRAM-MD5).
    pub salt: Option<Vec<u8>>,
    /// Invalid commands so far (`max_errors`).
    pub errors: u32,
    /// `Auth-Login-Attempt`.
    pub attempt: u32,
    /// The client connection is TLS.
    pub tls: bool,
    /// Its handshake: protocol, cipher, the client's certificate and the
    /// verdict on it (for the `Auth-SSL-*` headers).
    pub tls_info: Option<crate::tls::TlsInfo>,
    pub pp: Option<pp::Header>,
    /// SMTP: HELO/EHLO argument, the MAIL FROM and RCPT TO lines.
    pub smtp_helo: Vec<u8>,
    pub esmtp: bool,
    pub smtp_from: Vec<u8>,
    pub smtp_to: Vec<u8>,
    /// IMAP: the tag of the command being answered.
    pub tag: Vec<u8>,
    /// SMTP: the client's name (`Client-Host`, XCLIENT's `NAME=`), see
    /// [`client_host`].
    pub host: Vec<u8>,
    /// What the log lines say the session is doing.
    pub action: &'static str,
}

impl Session {
    pub fn log(&self, level: Level, msg: std::fmt::Arguments<'_>) {
        if self.logger.enabled(level) {
            self.logger.log(level, Some(self.id), msg);
        }
    }

    /// `, client: X, server: Y, login: "L"` of nginx's mail log lines.
    pub fn ctx(&self, login: Option<&[u8]>) -> String {
        let mut s = format!(
            " while {}, client: {}, server: {}",
            self.action,
            self.remote
                .map(|a| a.ip().to_string())
                .unwrap_or_else(|| "unix:".into()),
            self.listen
        );
        if let Some(l) = login {
            s.push_str(&format!(", login: \"{}\"", String::from_utf8_lossy(l)));
        }
        s
    }

    /// An invalid command: an unknown one (`known` false) counts toward
    /// `max_errors`, as nginx counts only what its parser refuses (a
    /// known command with wrong arguments, or in the wrong state, does
    /// not); true when that many were sent and the session must end
    /// after the answer.
    pub fn invalid(&mut self, known: bool) -> bool {
        if known {
            return false;
        }
        self.errors += 1;
        if self.errors >= self.srv.max_errors {
            let c = self.ctx(None);
            self.log(
                Level::Info,
                format_args!("client sent too many invalid commands{}", c),
            );
            return true;
        }
        false
    }

    /// The salt, made on first use: `<pid.time@server_name>` CRLF.
    pub fn salt(&mut self) -> Vec<u8> {
        if self.salt.is_none() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            self.salt = Some(
                format!(
                    "<{}.{}@{}>\r\n",
                    std::process::id(),
                    now,
                    self.srv.server_name
                )
                .into_bytes(),
            );
        }
        self.salt.clone().unwrap_or_default()
    }

    /// The CRAM-MD5 challenge line: `PREFIX base64(salt)` CRLF.
    pub fn cram_challenge(&mut self, prefix: &str) -> Vec<u8> {
        let salt = self.salt();
        let bare = &salt[..salt.len().saturating_sub(2)];
        let mut out = prefix.as_bytes().to_vec();
        out.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(bare)
                .as_bytes(),
        );
        out.extend_from_slice(b"\r\n");
        out
    }
}

fn b64() -> GeneralPurpose {
    GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    )
}

/// Decodes a SASL argument; logs nginx's line for `what` when it is not
/// base64.
pub fn decode(s: &Session, arg: &[u8], what: &str) -> Option<Vec<u8>> {
    match b64().decode(arg) {
        Ok(v) => Some(v),
        Err(_) => {
            let c = s.ctx(None);
            s.log(
                Level::Info,
                format_args!(
                    "client sent invalid base64 encoding in {} command{}",
                    what, c
                ),
            );
            None
        }
    }
}

/// `AUTH PLAIN` credentials: `authzid NUL authcid NUL passwd`.
pub fn sasl_plain(s: &Session, arg: &[u8]) -> Option<Auth> {
    let v = decode(s, arg, "AUTH PLAIN")?;
    let mut parts = v.splitn(3, |&b| b == 0);
    let (_, login, passwd) = (parts.next(), parts.next(), parts.next());
    match (login, passwd) {
        (Some(l), Some(p)) => Some(Auth {
            method: Method::Plain,
            login: l.to_vec(),
            passwd: p.to_vec(),
        }),
        _ => {
            let c = s.ctx(None);
            s.log(
                Level::Info,
                format_args!("client sent invalid login in AUTH PLAIN command{}", c),
            );
            None
        }
    }
}

/// A CRAM-MD5 answer: `login SP hex-digest`.
pub fn sasl_cram(s: &Session, arg: &[u8]) -> Option<Auth> {
    let v = decode(s, arg, "AUTH CRAM-MD5")?;
    match v.iter().rposition(|&b| b == b' ') {
        Some(i) if i > 0 => Some(Auth {
            method: Method::CramMd5,
            login: v[..i].to_vec(),
            passwd: v[i + 1..].to_vec(),
        }),
        _ => {
            let c = s.ctx(None);
            s.log(
                Level::Info,
                format_args!(
                    "client sent invalid CRAM-MD5 hash in AUTH CRAM-MD5 command{}",
                    c
                ),
            );
            None
        }
    }
}

/// What the dialogue decided.
pub enum Next {
    /// Ask auth_http with these credentials.
    Auth(Auth),
    /// The session ends (after whatever was sent).
    Quit,
}

/// Serves one accepted mail connection.
pub async fn serve(
    sock: Sock,
    remote: Option<SocketAddr>,
    listen: ListenAddr,
    srv: Arc<MailServer>,
    slot: Option<Slot>,
    shared: Arc<crate::core::worker::WorkerShared>,
    id: u64,
) {
    let local = crate::stream::session::local_addr(&listen, &sock);
    let logger = srv
        .logger
        .clone()
        .unwrap_or_else(crate::core::log::main_logger);
    let mut s = Session {
        id,
        logger,
        remote,
        local,
        listen: listen.clone(),
        salt: None,
        errors: 0,
        attempt: 1,
        tls: false,
        tls_info: None,
        pp: None,
        smtp_helo: Vec::new(),
        esmtp: false,
        smtp_from: Vec::new(),
        smtp_to: Vec::new(),
        tag: Vec::new(),
        host: UNAVAILABLE.to_vec(),
        action: "in auth state",
        srv: srv.clone(),
    };
    s.log(
        Level::Info,
        format_args!("{}", crate::stream::session::Connected(remote, &listen)),
    );
    let mut client = Client {
        sock: Some(sock),
        buf: Vec::new(),
        limit: srv.client_buffer,
        timeout: srv.timeout,
    };
    if srv
        .listen
        .iter()
        .any(|l| l.addr == listen && l.proxy_protocol)
    {
        s.action = "reading PROXY protocol";
        let Some(sock) = client.sock.as_mut() else {
            return;
        };
        match pp::read_buffered(sock, &mut client.buf, srv.timeout).await {
            Ok(h) => {
                // realip: a trusted sender's PROXY header names the client.
                if let Some(a) = crate::stream::session::real_client(&srv.realip_from, remote, &h) {
                    s.remote = Some(a);
                    s.log(Level::Info, format_args!("realip client {}", a.ip()));
                }
                s.pp = Some(h);
            }
            Err(msg) => {
                s.log(Level::Error, format_args!("{}", msg));
                return;
            }
        }
    }
    if srv.listen.iter().any(|l| l.addr == listen && l.ssl) {
        s.action = "SSL handshaking";
        if !starttls(&mut s, &mut client).await {
            return;
        }
    }
    if srv.protocol == Protocol::Smtp {
        // Before the greeting, as nginx's smtp_init_session; what the
        // client sends meanwhile waits in the socket.
        s.host = client_host(&mut s).await;
    }
    s.action = "in auth state";
    let next = match srv.protocol {
        Protocol::Pop3 => crate::mail::pop3::dialogue(&mut s, &mut client, true).await,
        Protocol::Imap => crate::mail::imap::dialogue(&mut s, &mut client, true).await,
        Protocol::Smtp => crate::mail::smtp::dialogue(&mut s, &mut client, true).await,
    };
    let mut next = next;
    loop {
        let auth = match next {
            Next::Quit => return,
            Next::Auth(a) => a,
        };
        match login(&mut s, &mut client, &auth, slot.is_some()).await {
            Login::Relay(up, login_name) => {
                let drain = proxy::Drain::mail(&shared, &s.listen, &srv);
                relay(&mut s, client, up, &login_name, drain).await;
                return;
            }
            Login::Quit => return,
            Login::Again => {
                s.attempt += 1;
                next = match srv.protocol {
                    Protocol::Pop3 => crate::mail::pop3::dialogue(&mut s, &mut client, false).await,
                    Protocol::Imap => crate::mail::imap::dialogue(&mut s, &mut client, false).await,
                    Protocol::Smtp => crate::mail::smtp::dialogue(&mut s, &mut client, false).await,
                };
            }
        }
    }
}

/// The TLS handshake with the client (`listen ... ssl`, STARTTLS, STLS).
/// Bytes the client sent before the handshake (pipelined after
/// STARTTLS) are dropped, as nginx does. False: the session ends.
pub async fn starttls(s: &mut Session, c: &mut Client) -> bool {
    let (Some(cfg), Some(sock)) = (s.srv.tls.clone(), c.sock.take()) else {
        return false;
    };
    c.buf.clear();
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    match tokio::time::timeout(c.timeout, acceptor.accept(sock)).await {
        Ok(Ok(t)) => {
            let auth = s.srv.client_auth.as_deref();
            let conn = t.get_ref().1;
            let name = conn.server_name().map(str::to_string);
            let mut info = TlsInfo::of_server(conn, name, Default::default(), [0; 32], auth);
            // Mail carries no HTTP: ALPN's h2 means nothing here.
            info.h2 = false;
            c.sock = Some(Sock::Tls(Box::new(t)));
            s.tls = true;
            let refused = crate::tls::client_auth::refusal(auth, &info);
            s.tls_info = Some(info);
            if let Some(why) = refused {
                s.log(Level::Info, format_args!("{}{}", why, s.ctx(None)));
                // nginx's `ngx_mail_verify_cert`: the client's message.
                let msg = match why {
                    Refusal::Invalid(_) => "SSL certificate error",
                    Refusal::Missing => "No required SSL certificate",
                };
                let line = match s.srv.protocol {
                    Protocol::Pop3 => format!("-ERR {}\r\n", msg),
                    Protocol::Imap => format!("* BYE {}\r\n", msg),
                    Protocol::Smtp => format!("421 4.7.1 {}\r\n", msg),
                };
                let _ = c.send(line.as_bytes()).await;
                return false;
            }
            true
        }
        _ => {
            s.log(
                Level::Info,
                format_args!("SSL handshake failed{}", s.ctx(None)),
            );
            false
        }
    }
}

/// How the login ended.
enum Login {
    /// Logged in to the backend: relay (the login name for the log).
    Relay(Sock, Vec<u8>),
    /// The auth server refused with Auth-Wait: the dialogue goes on.
    Again,
    Quit,
}

/// The protocol's "internal server error" line.
pub fn internal_error(p: Protocol) -> &'static [u8] {
    match p {
        Protocol::Pop3 => b"-ERR internal server error\r\n",
        Protocol::Imap => b"* BAD internal server error\r\n",
        Protocol::Smtp => b"451 4.3.2 Internal server error\r\n",
    }
}

async fn login(s: &mut Session, client: &mut Client, auth: &Auth, have_slot: bool) -> Login {
    s.action = "in http auth state";
    let v = auth_http::ask(s, auth).await;
    let (addr, login, passwd) = match v {
        Verdict::Ok {
            addr,
            login,
            passwd,
        } => (addr, login, passwd),
        Verdict::Refused { msg, wait } => {
            match wait {
                Some(w) => {
                    // The answer waits Auth-Wait seconds; the session goes on.
                    tokio::time::sleep(w).await;
                    if !client.send(&msg).await {
                        return Login::Quit;
                    }
                    s.action = "in auth state";
                    return Login::Again;
                }
                None => {
                    let _ = client.send(&msg).await;
                    return Login::Quit;
                }
            }
        }
        Verdict::Error => {
            let _ = client.send(internal_error(s.srv.protocol)).await;
            return Login::Quit;
        }
    };
    if !have_slot {
        let _ = client.send(internal_error(s.srv.protocol)).await;
        return Login::Quit;
    }
    let auth = Auth {
        method: auth.method,
        login: login.unwrap_or_else(|| auth.login.clone()),
        passwd: passwd.unwrap_or_else(|| auth.passwd.clone()),
    };
    s.action = "in upstream auth state";
    match crate::mail::backend::login(s, client, addr, &auth).await {
        Some(up) => Login::Relay(up, auth.login),
        None => Login::Quit,
    }
}

async fn relay(
    s: &mut Session,
    client: Client,
    up: Sock,
    login: &[u8],
    drain: Option<proxy::Drain>,
) {
    s.action = "proxying";
    let opts = proxy::Relay {
        buffer_size: s.srv.proxy_buffer,
        timeout: s.srv.proxy_timeout,
        half_close: false,
    };
    let Client { sock, buf, .. } = client;
    let Some(sock) = sock else { return };
    let (end, bytes) = proxy::relay(sock, up, opts, buf, drain).await;
    let c = s.ctx(Some(login));
    match end {
        proxy::End::TimedOut => s.log(
            Level::Info,
            format_args!("upstream timed out (110: Connection timed out){}", c),
        ),
        proxy::End::Closed(who) => s.log(
            Level::Info,
            format_args!(
                "{} disconnected, bytes from/to client:{}/{}, bytes from/to upstream:{}/{}{}",
                who, bytes.from_client, bytes.to_client, bytes.from_upstream, bytes.to_upstream, c
            ),
        ),
        // worker_shutdown_timeout ran out after a reload, as nginx's
        // mail proxy handler logs it for a connection it closes.
        proxy::End::Shutdown => s.log(Level::Info, format_args!("shutdown timeout{}", c)),
        _ => s.log(Level::Info, format_args!("proxied session done{}", c)),
    }
}

/// nginx's `[UNAVAILABLE]`: the client's name is not known (no
/// `resolver`, no name for its address, or a name whose addresses do not
/// include the client's).
pub const UNAVAILABLE: &[u8] = b"[UNAVAILABLE]";
/// nginx's `[TEMPUNAVAIL]`: the look-up failed (an error other than "not
/// found", a timeout), or the client is on a unix socket.
pub const TEMPUNAVAIL: &[u8] = b"[TEMPUNAVAIL]";

/// The SMTP client's name, as nginx's `ngx_mail_smtp_init_session`
/// finds it before the greeting: the name of the client's address (PTR)
/// by the server's `resolver`, kept only if its addresses (A/AAAA)
/// include the client's. It becomes `Client-Host` for auth_http and the
/// `NAME=` of XCLIENT.
async fn client_host(s: &mut Session) -> Vec<u8> {
    use crate::http::modules::resolver::{self, Unresolved};
    let srv = s.srv.clone();
    let conf = &srv.resolver;
    if conf.resolver.is_none() {
        return UNAVAILABLE.to_vec();
    }
    let Some(ip) = s.remote.map(|r| r.ip()) else {
        return TEMPUNAVAIL.to_vec();
    };
    let placeholder = |e: crate::core::dns::Error| {
        if e.not_found() {
            UNAVAILABLE.to_vec()
        } else {
            TEMPUNAVAIL.to_vec()
        }
    };
    s.action = "in resolving client address";
    let name = match resolver::resolve_addr(conf, ip).await {
        Ok(n) => n,
        Err(Unresolved::NoResolver) => return UNAVAILABLE.to_vec(),
        Err(Unresolved::Dns(e)) => {
            let c = s.ctx(None);
            s.log(
                Level::Error,
                format_args!("{} could not be resolved ({}){}", ip, e, c),
            );
            return placeholder(e);
        }
    };
    s.action = "in resolving client hostname";
    match resolver::resolve(conf, &name).await {
        Ok(addrs) if addrs.contains(&ip) => name.into_bytes(),
        Ok(_) | Err(Unresolved::NoResolver) => UNAVAILABLE.to_vec(),
        Err(Unresolved::Dns(e)) => {
            let c = s.ctx(None);
            s.log(
                Level::Error,
                format_args!("\"{}\" could not be resolved ({}){}", name, e, c),
            );
            placeholder(e)
        }
    }
}
