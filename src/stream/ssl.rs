//! TLS termination on `listen ... ssl` addresses (nginx's
//! ngx_stream_ssl_module): the `ssl_*` directives and the ssl phase of a
//! session.
//!
//! The settings are http's: its `ssl_*` setters fill the same
//! [`SslConf`](crate::http::modules::ssl_settings::SslConf), built by the
//! same [`crate::tls::config`] code (certificates, protocols, session
//! cache and tickets, client certificates, OCSP). Stream adds
//! `ssl_handshake_timeout` and `ssl_alpn` (a stream server offers no ALPN
//! protocol unless it lists some).
//!
//! ```text
//!  ClientHello ── SNI name selects the server of the address
//!     │── ssl_reject_handshake ── "unrecognized_name" alert ──────▶ 500
//!     │── certificates with variables: loaded for this handshake
//!     ▼ handshake (ssl_handshake_timeout) ── failed / timed out ───▶ 500
//!  ssl_verify_client: bad or missing certificate (ssl_ocsp asked) ─▶ 500
//!     ▼ preread, content ...
//! ```

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::config::registry::{self, row, set_once, Args};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::stream::conf::{msecs, ProxyConf, StreamServer, StreamSetter, StreamSpec, SS};
use crate::stream::proxy::Sock;
use crate::stream::session::Session;
use crate::tls::client_auth::ClientAuth;
use crate::tls::TlsInfo;

/// The ssl module's directives. Most are http's rows, filling the
/// server's `SslConf` through [`set_ssl`].
pub const DIRECTIVES: &[StreamSpec] = &[
    row!("ssl_certificate", SS, Args::take(1), SSL),
    row!("ssl_certificate_key", SS, Args::take(1), SSL),
    row!("ssl_protocols", SS, Args::AtLeast(1), SSL),
    row!("ssl_ciphers", SS, Args::take(1), SSL),
    row!("ssl_prefer_server_ciphers", SS, Args::Flag, SSL),
    row!("ssl_session_cache", SS, Args::take12(), SSL),
    row!("ssl_session_timeout", SS, Args::take(1), SSL),
    row!("ssl_session_tickets", SS, Args::Flag, SSL),
    row!("ssl_ecdh_curve", SS, Args::take(1), SSL),
    row!("ssl_dhparam", SS, Args::take(1), SSL),
    row!(
        "ssl_handshake_timeout",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_ssl_handshake_timeout)
    ),
    row!(
        "ssl_alpn",
        SS,
        Args::AtLeast(1),
        StreamSetter::Proxy(set_ssl_alpn)
    ),
    row!("ssl_verify_client", SS, Args::take(1), SSL),
    row!("ssl_client_certificate", SS, Args::take(1), SSL),
    row!("ssl_trusted_certificate", SS, Args::take(1), SSL),
    row!("ssl_verify_depth", SS, Args::take(1), SSL),
    row!("ssl_crl", SS, Args::take(1), SSL),
    row!("ssl_password_file", SS, Args::take(1), SSL),
    // As http's (tls::config builds them): OpenSSL commands tern maps,
    // ticket keys, OCSP stapling, OCSP checks of client certificates.
    row!("ssl_conf_command", SS, Args::take(2), SSL),
    row!("ssl_session_ticket_key", SS, Args::take(1), SSL),
    row!("ssl_stapling", SS, Args::Flag, SSL),
    row!("ssl_stapling_verify", SS, Args::Flag, SSL),
    row!("ssl_stapling_file", SS, Args::take(1), SSL),
    row!("ssl_stapling_responder", SS, Args::take(1), SSL),
    row!("ssl_ocsp", SS, Args::take(1), SSL),
    row!("ssl_ocsp_responder", SS, Args::take(1), SSL),
    row!("ssl_ocsp_cache", SS, Args::take(1), SSL),
    row!("ssl_reject_handshake", SS, Args::Flag, SSL),
];

/// An `ssl_*` directive of http's ssl_settings table.
const SSL: StreamSetter = StreamSetter::Proxy(set_ssl);

/// http's setter, on the level's `SslConf`.
fn set_ssl(p: &mut ProxyConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    crate::http::modules::ssl_settings::set_lent(&mut p.ssl, d, cx)
}

fn set_ssl_handshake_timeout(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = msecs(d)?;
    set_once(&mut p.ssl_handshake_timeout, v, d)
}

/// `ssl_alpn PROTOCOL ...`: what the server accepts, in its order.
fn set_ssl_alpn(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if p.ssl_alpn.is_some() {
        return Err(registry::duplicate(d));
    }
    let mut list = Vec::new();
    for a in &d.args {
        if a.value.is_empty() || a.value.len() > 255 {
            return Err(ConfError::at(
                format!("protocol too long \"{}\"", a.value),
                d,
            ));
        }
        list.push(a.value.as_bytes().to_vec());
    }
    p.ssl_alpn = Some(list);
    Ok(())
}

/// The compiled TLS side of a server on an `ssl` address.
#[derive(Default)]
pub struct ServerTls {
    /// None without a certificate of its own (the address's default
    /// server's answers for it: checked once the addresses are grouped).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub var_certs: Option<Arc<crate::tls::var_certs::VarCerts>>,
    pub reject_handshake: bool,
    pub client_auth: Option<Arc<ClientAuth>>,
    pub handshake_timeout: Duration,
}

/// Builds a server's TLS configuration (`on_ssl_addr`: one of its
/// addresses is `ssl`; otherwise there is nothing to build).
pub fn build(
    p: &ProxyConf,
    on_ssl_addr: bool,
    keys: &mut crate::tls::config::KeyCache,
) -> ConfResult<ServerTls> {
    let mut out = ServerTls {
        handshake_timeout: p.ssl_handshake_timeout.unwrap_or(Duration::from_secs(60)),
        ..ServerTls::default()
    };
    if !on_ssl_addr {
        return Ok(out);
    }
    let mut ssl = p.ssl.clone();
    crate::tls::config::build(&mut ssl, keys)?;
    out.client_auth = ssl.client_auth.clone();
    out.reject_handshake = ssl.reject_handshake == Some(true);
    out.var_certs = ssl.var_certs.clone();
    if let Some(cfg) = ssl.tls {
        // http's build offers http/1.1; a stream server offers what
        // `ssl_alpn` lists (nothing by default).
        let mut c = (*cfg).clone();
        c.alpn_protocols = p.ssl_alpn.clone().unwrap_or_default();
        out.tls = Some(Arc::new(c));
    }
    Ok(out)
}

/// The ssl phase of a session on an `ssl` address: the handshake (bytes
/// read ahead of it, after a PROXY header, are its first bytes), then
/// the client-certificate checks. None when the session ended here
/// (logged, status 500).
pub async fn phase(s: &mut Session, client: Sock, pre: Vec<u8>) -> Option<Sock> {
    let default = s.srv.clone();
    let inner = if pre.is_empty() {
        client
    } else {
        Sock::Prefixed(pre, 0, Box::new(client))
    };
    let hs = handshake(s, inner, &default);
    let (t, hello, id, auth) = match tokio::time::timeout(default.ssl_handshake_timeout, hs).await {
        Ok(Some(h)) => h,
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
    };
    let (_, c) = t.get_ref();
    let mut info = TlsInfo::of_server(
        c,
        hello.server_name,
        (hello.ciphers, hello.groups),
        id,
        auth.as_deref(),
    );
    // Stream sessions carry no HTTP: ALPN's h2 means nothing here.
    info.h2 = false;
    // `ssl_ocsp`: the responders are asked about a chain found good (as
    // http's handshake does).
    if let (Some(a), Some(chain), Ok(())) = (auth.as_deref(), &info.client_chain, info.verify) {
        if let Some(o) = &a.ocsp {
            let ctx = s.client_ctx();
            let logger = s.logger.clone();
            let id = s.id;
            let log = |m: &str| logger.log(Level::Info, Some(id), format_args!("{}, {}", m, ctx));
            // Boxed: the check's future is large (~12 KB), and inline it
            // would grow every session's future, which tokio moves several
            // times when it spawns it.
            info.verify = Box::pin(crate::tls::ocsp::check(o, chain, a.store(), &log)).await;
        }
    }
    s.alpn = c.alpn_protocol().map(<[u8]>::to_vec);
    let refused = crate::tls::client_auth::refusal(auth.as_deref(), &info);
    s.tls = Some(info);
    if let Some(why) = refused {
        s.log(Level::Info, format_args!("{}, {}", why, s.client_ctx()));
        s.status = 500;
        return None;
    }
    Some(Sock::Tls(Box::new(t)))
}

type Handshaken = (
    tokio_rustls::server::TlsStream<Sock>,
    Offered,
    [u8; 32],
    Option<Arc<ClientAuth>>,
);

/// What a ClientHello offered (for `$ssl_server_name`, `$ssl_ciphers`,
/// `$ssl_curves`).
struct Offered {
    server_name: Option<String>,
    ciphers: Box<[rustls::CipherSuite]>,
    groups: Box<[rustls::NamedGroup]>,
}

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
    // The ClientHello is processed here, and a TLS 1.2 resumption
    // answered: inside sessions::client_hello, a session resumed from a
    // ticket gets no fresh ticket, as OpenSSL does (an OpenSSL client
    // given one drops the session it resumed, and its next connection,
    // to this server or another with the same certificates, is a full
    // handshake: stream_ssl_certificate.t's "session id context match").
    let accept = crate::tls::sessions::client_hello(|| {
        start.into_stream_with(cfg, |c| id = crate::tls::session_id(c))
    });
    let t = accept.await.ok()?;
    Some((t, hello, id, src.client_auth.clone()))
}
