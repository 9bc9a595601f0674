//! The one place a connection's protocol is chosen, and what every
//! protocol shares about a connection.
//!
//! ```text
//!  core::worker (accept, TLS handshake) / core::park (bytes after idling)
//!        │ serve(stream, ConnInfo, resume)
//!        ▼
//!  TLS with ALPN "h2" ─────────────────────────────▶ v2 (HTTP/2)
//!  cleartext `listen ... http2`, first bytes are the h2 preface ─▶ v2
//!  anything else ──────────────────────────────────▶ v1 (HTTP/1.x)
//! ```
//!
//! The core (workers, the parking lot) knows only this module's types:
//! [`ConnInfo`] (facts about the connection for variables and logs),
//! [`IdleWait`] (a wait that outlives the task it started in) and
//! [`Served`] (how serving ended: closed, or idle and to be parked).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::core::log::Level;
use crate::core::stream::Stream;
use crate::core::worker::WorkerShared;
use crate::http::conf::{AddrConf, ListenAddr, LocConf};

/// Per-connection facts (variables, logs).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub id: u64,
    pub remote: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    pub listen: ListenAddr,
    pub requests: u64,
    pub tls: crate::tls::TlsState,
    /// When the connection was accepted (`keepalive_time`).
    pub started: std::time::Instant,
    /// The PROXY header the connection began with (`listen ...
    /// proxy_protocol`): the `$proxy_protocol_*` variables and
    /// `real_ip_header proxy_protocol` read it.
    pub proxy: Option<Arc<crate::core::proxy_protocol::Header>>,
    /// A PROXY header is due and not read yet (set at accept).
    pub proxy_pending: bool,
}

/// How long an idle connection waits inside its task before it is
/// parked (see [`crate::core::park`]): a busy keep-alive client never pays
/// for parking, a quiet one stops costing a task and an I/O registration.
pub const PARK_AFTER: Duration = Duration::from_secs(1);

/// The state of an idle wait that outlives the task it started in.
#[derive(Debug, Clone, Copy)]
pub struct IdleWait {
    /// When the wait times out (client_header_timeout before the first
    /// request, keepalive_timeout after).
    pub deadline: tokio::time::Instant,
    /// Waiting for the first request (QUIT does not close it).
    pub first: bool,
    /// A timeout resets the connection (reset_timedout_connection).
    pub reset: bool,
}

/// How [`serve`] ended.
pub enum Served<S> {
    /// The connection is done; dropping the stream closes it.
    Closed,
    /// Idle for [`PARK_AFTER`] with no request: the caller parks the
    /// socket and calls [`serve`] again with the wait once bytes arrive.
    Idle(S, ConnInfo, IdleWait),
}

/// Serves one connection until it closes or idles long enough to be
/// parked. `resume` is the wait a parked connection was in. The protocol
/// is chosen here, once, before the first request: TLS's ALPN, or on a
/// cleartext `http2` listener the first bytes (the h2 preface or not).
pub async fn serve<S: Stream>(
    stream: S,
    info: ConnInfo,
    shared: Arc<WorkerShared>,
    resume: Option<IdleWait>,
) -> Served<S> {
    // The HTTP/2 connection's state is boxed (once per connection) so
    // that it does not size the task of every HTTP/1 connection.
    if info.requests == 0 {
        if info.tls.info().is_some_and(|t| t.h2) {
            Box::pin(crate::http::v2::conn::serve(
                &stream,
                &info,
                &shared,
                Vec::new(),
            ))
            .await;
            stream.close();
            return Served::Closed;
        }
        if matches!(info.tls, crate::tls::TlsState::Plain) && h2_listener(&shared, &info) {
            return match sniff(&stream, &shared, &info, resume).await {
                Sniffed::H2(pre) => {
                    Box::pin(crate::http::v2::conn::serve(&stream, &info, &shared, pre)).await;
                    stream.close();
                    Served::Closed
                }
                Sniffed::H1(pre) => {
                    crate::http::v1::conn::serve(stream, info, shared, resume, pre).await
                }
                Sniffed::Closed => Served::Closed,
            };
        }
    }
    crate::http::v1::conn::serve(stream, info, shared, resume, Vec::new()).await
}

/// Whether the connection came to a cleartext address that serves h2:
/// `listen ... http2`, or `http2 on` in its default server (nginx 1.25).
fn h2_listener(shared: &WorkerShared, info: &ConnInfo) -> bool {
    let config = shared.config.load();
    config
        .http
        .as_ref()
        .and_then(|h| h.addr_for(&info.listen, info.local))
        .is_some_and(|a| {
            !a.listen.ssl && (a.listen.http2 || a.default.srv.http2.enable.unwrap_or(false))
        })
}

enum Sniffed {
    /// The h2 preface (and what followed it) was read.
    H2(Vec<u8>),
    /// Something else: an HTTP/1.x request, whose first bytes these are.
    H1(Vec<u8>),
    Closed,
}

/// Reads the first bytes of a connection to a cleartext `http2` listener
/// until they are the h2 preface or cannot be (client_header_timeout, or
/// the wait the connection was parked with).
async fn sniff<S: Stream>(
    stream: &S,
    shared: &WorkerShared,
    info: &ConnInfo,
    resume: Option<IdleWait>,
) -> Sniffed {
    let (deadline, size) = {
        let config = shared.config.load();
        let Some(addr) = config
            .http
            .as_ref()
            .and_then(|h| h.addr_for(&info.listen, info.local))
        else {
            return Sniffed::Closed;
        };
        let srv = &addr.default.srv;
        (
            resume.map(|w| w.deadline).unwrap_or_else(|| {
                tokio::time::Instant::now() + Duration::from_millis(srv.header_timeout_ms())
            }),
            srv.header_buffer().max(crate::http::v2::PREFACE.len()),
        )
    };
    let mut buf = vec![0u8; size];
    let mut got = 0;
    loop {
        match stream.try_read(&mut buf[got..]) {
            Ok(0) => return Sniffed::Closed,
            Ok(n) => {
                got += n;
                let p = crate::http::v2::PREFACE;
                let k = got.min(p.len());
                if buf[..k] != p[..k] {
                    buf.truncate(got);
                    return Sniffed::H1(buf);
                }
                if got >= p.len() {
                    buf.truncate(got);
                    return Sniffed::H2(buf);
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return Sniffed::Closed,
        }
        match tokio::time::timeout_at(deadline, stream.readable()).await {
            Ok(Ok(())) => {}
            _ => return Sniffed::Closed,
        }
    }
}

/// The wait of a connection just accepted for its first request, or None
/// when its listener accepts only once data has arrived (`deferred`), so
/// the request is there to be read at once.
pub(crate) fn first_wait(shared: &WorkerShared, info: &mut ConnInfo) -> Option<IdleWait> {
    let config = shared.config.load();
    let addr = config.http.as_ref()?.addr_for(&info.listen, info.local)?;
    if addr.listen.ssl {
        info.tls = crate::tls::TlsState::Pending;
    }
    info.proxy_pending = addr.listen.proxy_protocol;
    if addr.listen.deferred {
        return None;
    }
    let (wait_ms, reset, _) = idle_params_of(&addr, true);
    Some(IdleWait {
        deadline: tokio::time::Instant::now() + Duration::from_millis(wait_ms),
        first: true,
        reset,
    })
}

/// Takes the PROXY header off a connection to a `listen ...
/// proxy_protocol` address, before TLS or HTTP see the socket, within the
/// first request's wait (client_header_timeout, as nginx). False when the
/// connection is to be closed: nothing is answered, and a broken header is
/// logged as nginx logs it.
pub(crate) async fn read_proxy_header<T: crate::core::sock::Registrable>(
    s: &crate::core::sock::LazySock<T>,
    info: &mut ConnInfo,
    shared: &WorkerShared,
    wait: Option<IdleWait>,
) -> bool
where
    for<'a> &'a T::Std: std::io::Read + std::io::Write,
{
    use crate::core::proxy_protocol::{read_header, ReadError};
    info.proxy_pending = false;
    let config = shared.config.load_full();
    let Some(addr) = config
        .http
        .as_ref()
        .and_then(|h| h.addr_for(&info.listen, info.local))
    else {
        return false;
    };
    let deadline = wait.map_or_else(
        || {
            tokio::time::Instant::now()
                + Duration::from_millis(addr.default.srv.header_timeout_ms())
        },
        |w| w.deadline,
    );
    let loc = &addr.default.conf;
    match tokio::time::timeout_at(deadline, read_header(s)).await {
        Ok(Ok(h)) => {
            info.proxy = Some(Arc::new(h));
            true
        }
        Ok(Err(ReadError::Broken(msg))) => {
            log_conn(
                loc,
                Level::Error,
                info,
                &format!("{} while reading PROXY protocol", msg),
            );
            false
        }
        Ok(Err(ReadError::Closed)) => {
            log_conn(
                loc,
                Level::Info,
                info,
                "client closed connection while reading PROXY protocol",
            );
            false
        }
        Err(_) => {
            log_conn(
                loc,
                Level::Info,
                info,
                "client timed out (110: Connection timed out) while reading PROXY protocol",
            );
            false
        }
    }
}

/// The idle wait before a request (client_header_timeout for the first,
/// keepalive_timeout after), whether a timeout resets the connection, and
/// the first read buffer's size (client_header_buffer_size).
pub(crate) fn idle_params(
    shared: &WorkerShared,
    info: &ConnInfo,
    first: bool,
) -> Option<(u64, bool, usize)> {
    let config = shared.config.load();
    let addr = config.http.as_ref()?.addr_for(&info.listen, info.local)?;
    Some(idle_params_of(&addr, first))
}

fn idle_params_of(addr: &AddrConf, first: bool) -> (u64, bool, usize) {
    let wait_ms = if first {
        addr.default.srv.header_timeout_ms()
    } else {
        addr.default
            .conf
            .core
            .keepalive
            .map_or(75_000, |k| k.timeout_ms)
    };
    let reset = addr
        .default
        .conf
        .core
        .reset_timedout_connection
        .unwrap_or(false);
    (wait_ms, reset, addr.default.srv.header_buffer().max(1))
}

pub(crate) fn log_conn(loc: &LocConf, level: Level, info: &ConnInfo, msg: &str) {
    let client = info
        .remote
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|| "unix:".into());
    let logger = loc
        .core
        .logger
        .clone()
        .unwrap_or_else(crate::core::log::main_logger);
    logger.log(
        level,
        Some(info.id),
        format_args!(
            "{}, client: {}, server: {}",
            msg,
            client,
            info.local.map(|a| a.to_string()).unwrap_or_default()
        ),
    );
}
