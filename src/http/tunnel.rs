//! An upgraded connection (HTTP/1.1 `Upgrade`, WebSocket): after a proxied
//! `101 Switching Protocols` to a request that had an `Upgrade` header,
//! the client connection and the upstream one are joined, as nginx does.
//!
//! ```text
//!  proxy::handle: 101 + client's Upgrade ──▶ Response::upgrade (the upstream
//!     connection, the bytes that came after its head, the timeouts)
//!  conn::request: the 101 head goes out (no MSG_MORE: nothing follows at once)
//!     then relay():
//!        client ──try_read──▶ buffer ──write_all (proxy_send_timeout)──▶ upstream
//!        client ◀──write_all (send_timeout)── buffer ◀──read── upstream
//!          first: the client's bytes after its request head (pipelined),
//!                 the upstream's bytes after the 101 head
//!  either side's end of stream (or an error) ends both, as nginx does,
//!  and so does worker_shutdown_timeout running out after a reload:
//!  there is no half-close; the request is logged then (status 101,
//!  $body_bytes_sent = what was relayed to the client).
//! ```
//!
//! Each direction reads one buffer (proxy_buffer_size) and writes it whole
//! before reading again, so a slow reader holds back its writer. Timeouts
//! follow nginx's timers on an upgraded connection: proxy_read_timeout
//! with no bytes moving either way (nginx re-arms its upstream read timer
//! whenever either side makes progress), proxy_send_timeout for a write
//! to the upstream, send_timeout for a write to the client. Everything
//! runs on the connection's task with non-blocking I/O.

use std::cell::Cell;
use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::core::log::Level;
use crate::core::stream::Stream;
use crate::http::conf::LocConf;
use crate::http::upstream::peers::Lease;
use crate::tls::client::UpStream;

/// The upstream side of an upgrade, handed from the proxy to the connection.
pub struct Upgrade {
    pub(crate) up: UpStream,
    /// Bytes that came from upstream after the 101 head.
    pub(crate) early: Vec<u8>,
    /// proxy_read_timeout: the tunnel closes after this long without traffic.
    pub(crate) read_timeout: Duration,
    /// proxy_send_timeout: a write to upstream may wait this long.
    pub(crate) send_timeout: Duration,
    /// Each direction's buffer (proxy_buffer_size).
    pub(crate) buffer: usize,
    /// `upstream: "..."` in error-log lines.
    pub(crate) url: String,
    /// The peer stays busy (least_conn, max_conns) while the tunnel lives.
    pub(crate) _lease: Option<Lease>,
}

impl std::fmt::Debug for Upgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgrade").field("url", &self.url).finish()
    }
}

/// How a tunnel ended.
pub struct Outcome {
    /// Bytes relayed to the client.
    pub to_client: u64,
    /// What nginx logs about the end, if anything.
    pub log: Option<(Level, String)>,
}

const CONTEXT: &str = "while proxying upgraded connection";

fn timed_out(who: &str) -> (Level, String) {
    (
        Level::Info,
        format!("{} timed out (110: Connection timed out) {}", who, CONTEXT),
    )
}

/// nginx logs a failed call on the client connection at `info`, on the
/// upstream one at `error`.
fn failed(level: Level, call: &str, e: &io::Error) -> (Level, String) {
    (
        level,
        format!(
            "{}() failed {} {}",
            call,
            crate::core::errno_text(e),
            CONTEXT
        ),
    )
}

/// Relays bytes between `client` and the upgraded upstream until either
/// side closes, a timeout or an error; `pipelined` is what the client sent
/// after its request (and body).
pub async fn relay<S: Stream>(
    client: &S,
    t: Upgrade,
    pipelined: Vec<u8>,
    loc: &LocConf,
) -> Outcome {
    let Upgrade {
        mut up,
        early,
        read_timeout,
        send_timeout,
        buffer,
        _lease,
        ..
    } = t;
    let buffer = buffer.max(1);
    // Progress in either direction; a write to the client in progress
    // counts as progress too (nginx holds the upstream's bytes it could
    // not pass on, and its read timer waits; send_timeout bounds the write).
    let began = std::time::Instant::now();
    let last = Cell::new(Instant::now());
    let writing_client = Cell::new(false);
    let to_client = Cell::new(0u64);
    let (mut ur, mut uw) = tokio::io::split(&mut up);

    let downstream = async {
        let sent = async |data: &[u8]| {
            writing_client.set(true);
            let r = send_client(client, data, loc).await;
            writing_client.set(false);
            last.set(Instant::now());
            if r.is_ok() {
                to_client.set(to_client.get() + data.len() as u64);
            }
            r
        };
        if !early.is_empty() {
            if let Err(e) = sent(&early).await {
                return Some(e);
            }
        }
        let mut b = vec![0u8; buffer];
        loop {
            let n = match ur.read(&mut b).await {
                Ok(0) => return None,
                Ok(n) => n,
                Err(e) => return Some(failed(Level::Error, "recv", &e)),
            };
            last.set(Instant::now());
            if let Err(e) = sent(&b[..n]).await {
                return Some(e);
            }
        }
    };

    let upstream = async {
        if !pipelined.is_empty() {
            let r = send_upstream(&mut uw, &pipelined, send_timeout).await;
            last.set(Instant::now());
            if let Err(e) = r {
                return Some(e);
            }
        }
        let mut b = vec![0u8; buffer];
        loop {
            let n = match client.try_read(&mut b) {
                Ok(0) => return None,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if client.readable().await.is_err() {
                        return None;
                    }
                    continue;
                }
                Err(e) => return Some(failed(Level::Info, "recv", &e)),
            };
            last.set(Instant::now());
            let r = send_upstream(&mut uw, &b[..n], send_timeout).await;
            last.set(Instant::now());
            if let Err(e) = r {
                return Some(e);
            }
        }
    };

    let idle = async {
        loop {
            if writing_client.get() {
                last.set(Instant::now());
            }
            let due = last.get() + read_timeout;
            if Instant::now() >= due {
                return timed_out("upstream");
            }
            tokio::time::sleep_until(due).await;
        }
    };

    let log = tokio::select! {
        e = downstream => e,
        e = upstream => e,
        e = idle => Some(e),
        // A reload with worker_shutdown_timeout: closed when it runs out.
        () = crate::core::park::drained_since(began) => None,
    };
    Outcome {
        to_client: to_client.get(),
        log,
    }
}

/// Writes `data` to the client, waiting at most send_timeout for room.
async fn send_client<S: Stream>(
    client: &S,
    data: &[u8],
    loc: &LocConf,
) -> Result<(), (Level, String)> {
    match crate::http::v1::conn::write_all(client, &[data], loc).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(timed_out("client")),
        Err(e) => Err(failed(Level::Info, "send", &e)),
    }
}

/// Writes `data` to the upstream within proxy_send_timeout.
async fn send_upstream<W: AsyncWrite + Unpin>(
    w: &mut W,
    data: &[u8],
    limit: Duration,
) -> Result<(), (Level, String)> {
    let write = async {
        w.write_all(data).await?;
        w.flush().await
    };
    match tokio::time::timeout(limit, write).await {
        Err(_) => Err(timed_out("upstream")),
        Ok(Err(e)) => Err(failed(Level::Error, "send", &e)),
        Ok(Ok(())) => Ok(()),
    }
}
