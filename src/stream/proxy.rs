//! One stream session: connect to an upstream peer (trying the next one on
//! failure), then copy bytes both ways until the session ends.
//!
//! The copy is a hand-written poll loop rather than tokio's
//! `copy_bidirectional` because nginx's semantics need two things it does
//! not give: `proxy_timeout` is an *idle* timer reset by every successful
//! read or write on either side, and with `proxy_half_close off` (nginx's
//! default) the end of either direction ends the whole session.
//!
//! Each direction owns a `proxy_buffer_size` buffer and alternates between
//! reading into it and writing it out; it reads only when the buffer is
//! empty, so a slow receiver throttles its sender through TCP instead of
//! growing memory.

use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpSocket, TcpStream, UnixStream};

use crate::core::log::{Level, Logger};
use crate::core::worker::{Slot, WorkerShared};
use crate::http::conf::ListenAddr;
use crate::stream::conf::StreamServer;
use crate::stream::upstream::{PeerAddr, Picked};

/// A connected socket of either family: the client side or the upstream side.
pub enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl AsyncRead for Sock {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Sock::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Sock::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Sock {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Sock::Tcp(s) => Pin::new(s).poll_write(cx, b),
            Sock::Unix(s) => Pin::new(s).poll_write(cx, b),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Sock::Tcp(s) => Pin::new(s).poll_flush(cx),
            Sock::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Sock::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Sock::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Who a session is, for its log lines.
struct Ctx<'a> {
    id: u64,
    client: String,
    server: &'a ListenAddr,
    logger: Arc<Logger>,
}

impl Ctx<'_> {
    fn log(&self, level: Level, msg: std::fmt::Arguments<'_>) {
        self.logger.log(level, Some(self.id), msg);
    }
}

/// Serves one accepted stream connection with the server it arrived on.
/// `slot` is the `worker_connections` slot for the upstream side (None:
/// none was free).
pub async fn serve(
    client: Sock,
    remote: Option<SocketAddr>,
    listen: ListenAddr,
    srv: Arc<StreamServer>,
    slot: Option<Slot>,
    shared: Arc<WorkerShared>,
    id: u64,
) {
    let cx = Ctx {
        id,
        client: remote
            .map(|a| a.ip().to_string())
            .unwrap_or_else(|| "unix:".into()),
        server: &listen,
        logger: srv
            .logger
            .clone()
            .unwrap_or_else(crate::core::log::main_logger),
    };
    cx.log(
        Level::Info,
        format_args!(
            "client {} connected to {}",
            remote
                .map(|a| a.to_string())
                .unwrap_or_else(|| "unix:".into()),
            listen
        ),
    );
    // The upstream connection is a connection of this worker too: nginx's
    // worker_connections counts both sides of a proxied session.
    let Some(_slot) = slot else {
        cx.log(
            Level::Alert,
            format_args!(
                "{} worker_connections are not enough while connecting to upstream, client: {}, server: {}",
                shared.config.load().main.connections(),
                cx.client,
                listen
            ),
        );
        return;
    };
    let Some((upstream, peer)) = connect(&srv, &cx).await else {
        return;
    };
    if let (Sock::Tcp(t), true) = (&client, srv.tcp_nodelay) {
        let _ = t.set_nodelay(true);
    }
    cx.log(
        Level::Info,
        format_args!("proxy connected to {}", peer.name),
    );
    // A graceful stop (QUIT) does not cut sessions: like nginx, a worker
    // waits for them (bounded by worker_shutdown_timeout); only idle http
    // keepalives are closed early.
    let (end, bytes) = pump(client, upstream, &srv).await;
    let tail = format!(
        "client: {}, server: {}, upstream: \"{}\", bytes from/to client:{}/{}, bytes from/to upstream:{}/{}",
        cx.client, listen, peer.name, bytes.from_client, bytes.to_client, bytes.from_upstream, bytes.to_upstream
    );
    match end {
        End::Closed(who) => cx.log(
            Level::Info,
            format_args!(
                "{} disconnected, bytes from/to client:{}/{}, bytes from/to upstream:{}/{} while proxying connection, {}",
                who,
                bytes.from_client,
                bytes.to_client,
                bytes.from_upstream,
                bytes.to_upstream,
                tail
            ),
        ),
        End::TimedOut => cx.log(
            Level::Info,
            format_args!(
                "connection timed out (110: Connection timed out) while proxying connection, {}",
                tail
            ),
        ),
        End::Error(who, e) => cx.log(
            Level::Info,
            format_args!(
                "{}() failed {} while proxying {}, {}",
                who.op,
                crate::core::errno_text(&e),
                who.side,
                tail
            ),
        ),
    }
    drop(peer);
}

/// Picks peers until one accepts, within `proxy_next_upstream*` limits.
async fn connect(srv: &StreamServer, cx: &Ctx<'_>) -> Option<(Sock, Picked)> {
    let started = Instant::now();
    let mut tried = srv.upstream.tried();
    let mut tries = 0usize;
    loop {
        let Some(peer) = srv.upstream.pick(&mut tried) else {
            cx.log(
                Level::Error,
                format_args!(
                    "no live upstreams while connecting to upstream, client: {}, server: {}, upstream: \"{}\"",
                    cx.client, cx.server, srv.upstream.name
                ),
            );
            return None;
        };
        tries += 1;
        let attempt = tokio::time::timeout(srv.connect_timeout, dial(&peer.addr, srv)).await;
        let err = match attempt {
            Ok(Ok(s)) => {
                peer.connected();
                return Some((s, peer));
            }
            Ok(Err(e)) => format!(
                "connect() failed {} while connecting to upstream",
                crate::core::errno_text(&e)
            ),
            Err(_) => "upstream timed out (110: Connection timed out) while connecting to upstream"
                .to_string(),
        };
        cx.log(
            Level::Error,
            format_args!(
                "{}, client: {}, server: {}, upstream: \"{}\"",
                err, cx.client, cx.server, peer.name
            ),
        );
        peer.failed();
        let out_of_tries = srv.next_upstream_tries != 0 && tries >= srv.next_upstream_tries;
        let out_of_time = srv
            .next_upstream_timeout
            .is_some_and(|t| started.elapsed() >= t);
        if !srv.next_upstream || out_of_tries || out_of_time {
            return None;
        }
    }
}

async fn dial(addr: &PeerAddr, srv: &StreamServer) -> io::Result<Sock> {
    match addr {
        PeerAddr::Inet(a) => {
            let s = if a.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            if srv.socket_keepalive {
                s.set_keepalive(true)?;
            }
            let t = s.connect(*a).await?;
            if srv.tcp_nodelay {
                let _ = t.set_nodelay(true);
            }
            Ok(Sock::Tcp(t))
        }
        PeerAddr::Unix(p) => Ok(Sock::Unix(UnixStream::connect(p).await?)),
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Bytes {
    from_client: u64,
    to_client: u64,
    from_upstream: u64,
    to_upstream: u64,
}

/// Which socket call failed, on which side, for the log line.
struct Failed {
    op: &'static str,
    side: &'static str,
}

/// How a session ended.
enum End {
    /// A side closed ("client" or "upstream"), all its data delivered.
    Closed(&'static str),
    TimedOut,
    Error(Failed, io::Error),
}

/// One direction of the copy.
struct Dir {
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// The source sent FIN.
    eof: bool,
    /// FIN passed on to the destination (half-close mode only).
    shut: bool,
    read: u64,
    written: u64,
}

impl Dir {
    fn new(size: usize) -> Dir {
        Dir {
            buf: vec![0u8; size].into_boxed_slice(),
            pos: 0,
            end: 0,
            eof: false,
            shut: false,
            read: 0,
            written: 0,
        }
    }

    /// Moves data from `src` to `dst` until blocked. Ready(Ok) means the
    /// direction is finished: the source closed and everything it sent was
    /// written (and, with `half_close`, the FIN passed on). `active` is set
    /// when any byte moved, to restart the idle timer.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        src: &mut Sock,
        dst: &mut Sock,
        half_close: bool,
        active: &mut bool,
    ) -> Poll<Result<(), (&'static str, bool, io::Error)>> {
        loop {
            if self.pos < self.end {
                match Pin::new(&mut *dst).poll_write(cx, &self.buf[self.pos..self.end]) {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err((
                            "send",
                            false,
                            io::Error::from(io::ErrorKind::WriteZero),
                        )))
                    }
                    Poll::Ready(Ok(n)) => {
                        self.pos += n;
                        self.written += n as u64;
                        *active = true;
                        if self.pos == self.end {
                            self.pos = 0;
                            self.end = 0;
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(("send", false, e))),
                    Poll::Pending => return Poll::Pending,
                }
            } else if self.eof {
                if !half_close || self.shut {
                    return Poll::Ready(Ok(()));
                }
                match Pin::new(&mut *dst).poll_shutdown(cx) {
                    Poll::Ready(Ok(())) => self.shut = true,
                    // The peer may already be gone; the direction is over anyway.
                    Poll::Ready(Err(_)) => self.shut = true,
                    Poll::Pending => return Poll::Pending,
                }
            } else {
                let mut rb = ReadBuf::new(&mut self.buf[..]);
                match Pin::new(&mut *src).poll_read(cx, &mut rb) {
                    Poll::Ready(Ok(())) => {
                        let n = rb.filled().len();
                        if n == 0 {
                            self.eof = true;
                        } else {
                            self.end = n;
                            self.read += n as u64;
                            *active = true;
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(("recv", true, e))),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }
    }
}

/// Copies both ways until the session ends; returns why, and the byte counts.
async fn pump(mut client: Sock, mut upstream: Sock, srv: &StreamServer) -> (End, Bytes) {
    let mut down = Dir::new(srv.buffer_size); // upstream -> client
    let mut up = Dir::new(srv.buffer_size); // client -> upstream
    let (mut up_done, mut down_done) = (false, false);
    let idle = tokio::time::sleep(srv.timeout);
    tokio::pin!(idle);
    let end = poll_fn(|cx| {
        let mut active = false;
        if !up_done {
            match up.poll(cx, &mut client, &mut upstream, srv.half_close, &mut active) {
                Poll::Ready(Ok(())) => up_done = true,
                Poll::Ready(Err((op, on_src, e))) => {
                    let side = if on_src { "client" } else { "upstream" };
                    return Poll::Ready(End::Error(Failed { op, side }, e));
                }
                Poll::Pending => {}
            }
        }
        if !down_done {
            match down.poll(cx, &mut upstream, &mut client, srv.half_close, &mut active) {
                Poll::Ready(Ok(())) => down_done = true,
                Poll::Ready(Err((op, on_src, e))) => {
                    let side = if on_src { "upstream" } else { "client" };
                    return Poll::Ready(End::Error(Failed { op, side }, e));
                }
                Poll::Pending => {}
            }
        }
        // Without half-close, the first side to finish ends the session
        // (after its data went through); with it, both must finish.
        let finished = if srv.half_close {
            up_done && down_done
        } else {
            up_done || down_done
        };
        if finished {
            return Poll::Ready(End::Closed(if up_done { "client" } else { "upstream" }));
        }
        if active {
            idle.as_mut()
                .reset(tokio::time::Instant::now() + srv.timeout);
        }
        match idle.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(End::TimedOut),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    let bytes = Bytes {
        from_client: up.read,
        to_upstream: up.written,
        from_upstream: down.read,
        to_client: down.written,
    };
    (end, bytes)
}
