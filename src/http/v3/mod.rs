//! HTTP/3 (RFC 9114) over QUIC (RFC 9000), with `quinn` doing QUIC
//! (packets, loss recovery, congestion control, TLS 1.3 through rustls)
//! and `h3` doing HTTP/3 framing and QPACK; this module maps each request
//! stream onto the protocol-neutral request path, as `http::v2` does for
//! HTTP/2.
//!
//! ```text
//!  core::worker ── a `listen ... quic` UDP socket of this worker
//!    serve: a quinn Endpoint on it (server config from conf::server_config:
//!      certificates by SNI from tls::config's pairs, ALPN h3/hq-interop;
//!      the rustls session wrapped by tls: $ssl_* facts from the hellos)
//!      accept loop ── Incoming: worker_connections (refuse), quic_retry
//!         │            (Retry until the address is validated), else accept
//!         ▼
//!      conn::serve: handshake (0-RTT with ssl_early_data), h3 connection
//!         accept loop ── a request stream ──▶ spawn_local(stream task)
//!              │          Request from the pseudo-headers and fields
//!              │          (nginx's checks, as for an HTTP/1 head),
//!              │          phases::run, the body from DATA frames,
//!              │          the Response as HEADERS + DATA (files read
//!              │          through the file-I/O layer, body filters),
//!              │          log phase ($server_protocol HTTP/3.0, $http3 h3)
//!         QUIT: GOAWAY, requests in flight finish, then CONNECTION_CLOSE
//!      reload: the endpoint's server config is rebuilt for new handshakes;
//!         connections stay, and each new request uses the new configuration
//! ```
//!
//! Which worker gets a packet: one `reuseport` UDP socket per worker, and
//! the kernel hashes the 4-tuple, so a connection's packets reach the
//! worker that owns it while the client's address stays the same (see
//! DIFFERENCES.md on migration and `quic_bpf`).
//!
//! Invariants: a stream task owns what it uses (the connection's facts
//! are cloned), a peer's invalid move is the `h3`/`quinn` crates' protocol
//! error (a stream reset or CONNECTION_CLOSE), never a panic.

pub mod conf;
pub mod conn;
pub mod probe;
pub mod tls;

use std::sync::Arc;

use tokio::sync::watch;

use crate::core::worker::WorkerShared;
use crate::http::conf::ListenAddr;

/// Serves one `listen ... quic` socket of this worker: new connections
/// until `stop` turns true (graceful stop, or a reload that removed the
/// address), then the open ones until they are done.
pub async fn serve(
    addr: ListenAddr,
    sock: std::net::UdpSocket,
    shared: Arc<WorkerShared>,
    stop: watch::Receiver<bool>,
) {
    conn::endpoint(sock, addr, shared, stop).await
}
