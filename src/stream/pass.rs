//! `pass ADDRESS` (nginx 1.25.5's stream pass module): the content
//! phase hands the client connection itself to another listening socket
//! of this server, http or stream, as if it had been accepted there. No
//! upstream connection is made and nothing is copied.
//!
//! ```text
//!  content phase ── `pass` ──▶ render the address (variables allowed)
//!     │── bytes were read ahead (ssl_preread over TLS, a PROXY header
//!     │   read past its end) ─── "cannot pass connection with preread
//!     │   data" ──────────────────────────────────────────────▶ 500
//!     │── more than 10 passes ── "stream pass cycle" ────────────▶ 500
//!     │── an http listener of that address ── the connection joins
//!     │   http's runners (a TLS session made here goes on as it is;
//!     │   a plain one meets the listener's own `ssl`, PROXY header)
//!     │── a stream listener ── a new session there (its phases, log)
//!     └── none ── "port not found for ..." ─────────────────────────▶ 200
//! ```
//!
//! A passed session is not logged by the server that passed it (nginx
//! hands the connection over before its log phase). `ssl_preread` on a
//! plain socket only peeks (see [`super::session`]), so a connection can
//! be routed by its SNI name and passed with nothing consumed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use crate::config::registry::{self, arg, ctx, row, Args};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::core::sock::LazySock;
use crate::core::worker::{ConnSlot, Either, Slot, WorkerShared};
use crate::http::conf::ListenAddr;
use crate::http::vars::Template;
use crate::stream::conf::{SrvBuild, StreamSetter, StreamSpec};
use crate::stream::proxy::Sock;
use crate::stream::session::Session;

/// nginx's bound on passes of one connection (a `pass` to itself).
const MAX_PASSES: u32 = 10;

/// Where `pass` sends connections.
#[derive(Debug)]
pub enum Target {
    Addr(PassAddr),
    /// Rendered per session, parsed as nginx parses it (no name lookup).
    Var(Template),
}

#[derive(Debug, Clone)]
pub enum PassAddr {
    Inet(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for PassAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PassAddr::Inet(a) => write!(f, "{}", a),
            PassAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Why an address does not parse, in nginx's words (`ngx_parse_url`
/// with `no_resolve`): "has no port", "has no addresses" or an error
/// that names the URL.
enum Bad {
    NoPort,
    NoAddrs,
    Err(&'static str),
}

fn parse(s: &str) -> Result<PassAddr, Bad> {
    if let Some(p) = s.strip_prefix("unix:") {
        if p.is_empty() {
            return Err(Bad::Err("no path in the unix domain socket"));
        }
        return Ok(PassAddr::Unix(PathBuf::from(p)));
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((h, tail)) = rest.split_once(']') else {
            return Err(Bad::Err("invalid host"));
        };
        match tail.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if tail.is_empty() => (h, None),
            None => return Err(Bad::Err("invalid host")),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        None => return Err(Bad::NoPort),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err(Bad::Err("invalid port")),
        },
    };
    match host.parse::<IpAddr>() {
        Ok(ip) => Ok(PassAddr::Inet(SocketAddr::new(ip, port))),
        // A name is not looked up: it has no addresses.
        Err(_) if !host.is_empty() => Err(Bad::NoAddrs),
        Err(_) => Err(Bad::Err("no host")),
    }
}

/// `pass ADDRESS`: the server's content handler (the last of `pass`,
/// `proxy_pass` and `return` wins, as each sets nginx's handler).
pub fn set_pass(sb: &mut SrvBuild, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if sb.pass_to.is_some() {
        return Err(registry::duplicate(d));
    }
    let a = arg(d, 0);
    let t = if a.contains('$') {
        Target::Var(cx.template(a, d)?)
    } else {
        match parse(a) {
            Ok(p) => Target::Addr(p),
            Err(Bad::NoPort) => {
                return Err(ConfError::at("\"pass\" directive has no port", d));
            }
            Err(Bad::NoAddrs) => {
                return Err(ConfError::at("\"pass\" directive has no addresses", d));
            }
            Err(Bad::Err(e)) => {
                return Err(ConfError::at(
                    format!("{} in \"{}\" of the \"pass\" directive", e, a),
                    d,
                ))
            }
        }
    };
    sb.pass_to = Some(t);
    sb.last_content = "pass";
    Ok(())
}

/// The content phase of `pass`. True when the connection went to another
/// listener (the session then ends without being logged); false when it
/// ended here (status set, logged by the caller).
pub async fn run(
    s: &mut Session,
    client: Sock,
    pre: Vec<u8>,
    target: &Target,
    slot: Option<Slot>,
    shared: &Arc<WorkerShared>,
) -> bool {
    let ctx = |s: &Session| format!("{} while passing connection to port", s.client_ctx());
    if !pre.is_empty() || matches!(client, Sock::Prefixed(..)) {
        s.log(
            Level::Error,
            format_args!("cannot pass connection with preread data, {}", ctx(s)),
        );
        s.status = 500;
        return false;
    }
    let addr = match target {
        Target::Addr(a) => a.clone(),
        Target::Var(t) => {
            let url = String::from_utf8_lossy(&t.render_vec(&*s)).into_owned();
            match parse(&url) {
                Ok(a) => a,
                Err(b) => {
                    let why = match b {
                        Bad::NoPort => format!("no port in pass \"{}\"", url),
                        Bad::NoAddrs => format!("no addresses in pass \"{}\"", url),
                        Bad::Err(e) => format!("{} in pass \"{}\"", e, url),
                    };
                    s.log(Level::Error, format_args!("{}, {}", why, ctx(s)));
                    s.status = 500;
                    return false;
                }
            }
        }
    };
    if s.passes >= MAX_PASSES {
        s.log(Level::Error, format_args!("stream pass cycle, {}", ctx(s)));
        s.status = 500;
        return false;
    }
    let config = shared.config.load_full();
    // A stream listener of that address.
    let stream_hit = config.stream.as_ref().and_then(|c| {
        candidates(&addr)
            .into_iter()
            .find_map(|l| c.addr_for(&l).map(|a| (l, a)))
    });
    if let Some((listen, vaddr)) = stream_hit {
        let local = match &addr {
            PassAddr::Inet(a) => Some(*a),
            PassAddr::Unix(_) => None,
        };
        let (remote, id, passes) = (s.conn_remote, s.id, s.passes + 1);
        Box::pin(crate::stream::session::serve_passed(
            client,
            remote,
            local,
            listen,
            vaddr,
            slot,
            shared.clone(),
            id,
            passes,
        ))
        .await;
        return true;
    }
    // An http listener.
    let http_hit = config.http.as_ref().and_then(|h| {
        let local = match &addr {
            PassAddr::Inet(a) => Some(*a),
            PassAddr::Unix(_) => None,
        };
        candidates(&addr)
            .into_iter()
            .find(|l| h.addr_for(l, local).is_some())
    });
    if let Some(listen) = http_hit {
        drop(config);
        return to_http(s, client, &addr, listen, shared);
    }
    s.log(
        Level::Error,
        format_args!("port not found for \"{}\", {}", addr, ctx(s)),
    );
    s.status = 200;
    false
}

/// The listening addresses that take connections for `addr`: itself,
/// then the wildcard address of its port (nginx's `ngx_stream_pass_match`).
fn candidates(addr: &PassAddr) -> Vec<ListenAddr> {
    match addr {
        PassAddr::Unix(p) => vec![ListenAddr::Unix(p.clone())],
        PassAddr::Inet(a) => {
            let any = if a.is_ipv4() {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            };
            vec![
                ListenAddr::Inet(*a),
                ListenAddr::Inet(SocketAddr::new(any, a.port())),
            ]
        }
    }
}

/// Hands the connection to http's runners, as an accept on `listen`
/// would: a TLS session made by the stream server goes on as it is (http
/// reads the requests inside it), a plain connection meets the http
/// listener's own `ssl` and `proxy_protocol`.
fn to_http(
    s: &mut Session,
    client: Sock,
    addr: &PassAddr,
    listen: ListenAddr,
    shared: &Arc<WorkerShared>,
) -> bool {
    let mut info = crate::http::serve::ConnInfo {
        id: s.id,
        remote: s.conn_remote,
        local: match addr {
            PassAddr::Inet(a) => Some(*a),
            PassAddr::Unix(_) => None,
        },
        listen,
        requests: 0,
        tls: crate::tls::TlsState::Plain,
        started: std::time::Instant::now(),
        proxy: None,
        proxy_pending: false,
        keepalive_ms: 0,
    };
    let wait = crate::http::serve::first_wait(shared, &mut info);
    let sock = match client {
        Sock::Tcp(t) => Either::Tcp(LazySock::registered(t)),
        Sock::Unix(u) => Either::Unix(LazySock::registered(u)),
        Sock::Tls(t) => {
            let (io, conn) = t.into_inner();
            let Some(tls) = s.tls.take() else {
                s.status = 500;
                return false;
            };
            info.tls = crate::tls::TlsState::On(Arc::new(tls));
            match io {
                Sock::Tcp(t) => Either::TlsTcp(crate::tls::stream::TlsStream::from_parts(
                    LazySock::registered(t),
                    Box::new(conn),
                )),
                Sock::Unix(u) => Either::TlsUnix(crate::tls::stream::TlsStream::from_parts(
                    LazySock::registered(u),
                    Box::new(conn),
                )),
                _ => {
                    s.log(
                        Level::Error,
                        format_args!(
                            "cannot pass connection with preread data, {} while passing connection to port",
                            s.client_ctx()
                        ),
                    );
                    s.status = 500;
                    return false;
                }
            }
        }
        Sock::TlsUp(_) | Sock::Prefixed(..) => {
            s.status = 500;
            return false;
        }
    };
    crate::core::worker::spawn_http(sock, info, ConnSlot::take(shared.clone()), wait);
    true
}

/// The pass module's directive.
pub const DIRECTIVES: &[StreamSpec] = &[row!(
    "pass",
    ctx::STREAM_SRV,
    Args::take(1),
    StreamSetter::Srv(set_pass)
)];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_as_nginx_without_lookup() {
        assert!(matches!(parse("127.0.0.1:80"), Ok(PassAddr::Inet(_))));
        assert!(matches!(parse("[::1]:80"), Ok(PassAddr::Inet(_))));
        assert!(matches!(parse("unix:/tmp/s"), Ok(PassAddr::Unix(_))));
        assert!(matches!(parse("127.0.0.1"), Err(Bad::NoPort)));
        assert!(matches!(parse("localhost:80"), Err(Bad::NoAddrs)));
        assert!(matches!(
            parse("127.0.0.1:0"),
            Err(Bad::Err("invalid port"))
        ));
        assert!(matches!(parse("unix:"), Err(Bad::Err(_))));
    }
}
