//! HTTP/3 over QUIC: the third framing of the protocol-neutral request.
//!
//! The master binds each `listen ... quic` address as a datagram socket
//! (one `SO_REUSEPORT` socket per worker with `reuseport`) and hands it to
//! every worker, whose control loop calls [`serve`] instead of an accept
//! loop. Until the QUIC stack lands here, a quic listener is bound (so the
//! port is taken and `tern -t` checks it) but its datagrams are not read.

use std::sync::Arc;

use tokio::sync::watch;

use crate::core::worker::WorkerShared;
use crate::http::conf::ListenAddr;

/// Serves one quic listener of this worker until `stop` turns true.
pub async fn serve(
    addr: ListenAddr,
    sock: std::net::UdpSocket,
    shared: Arc<WorkerShared>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = (&sock, &shared);
    if shared.worker == 0 {
        crate::elog!(Warn, "HTTP/3 on {} is not served yet", addr);
    }
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            break;
        }
    }
}
