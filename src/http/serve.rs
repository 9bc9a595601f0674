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
/// parked. `resume` is the wait a parked connection was in.
pub async fn serve<S: Stream>(
    stream: S,
    info: ConnInfo,
    shared: Arc<WorkerShared>,
    resume: Option<IdleWait>,
) -> Served<S> {
    crate::http::v1::conn::serve(stream, info, shared, resume).await
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
