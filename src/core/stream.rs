//! The transport under every protocol: a connected socket (TCP, unix, or
//! a TLS session over either, see `crate::tls::stream`) as the engines
//! use it. It knows nothing of HTTP: reads and writes are readiness-based
//! and non-blocking, so an engine decides itself when to wait (and for how
//! long: its timeouts), and a socket that has not joined the event loop
//! yet (`core::sock::LazySock`) can be read before its first wait.

use std::io::{self, IoSlice};
use std::time::Duration;

/// What a protocol engine needs from a connected socket (TCP, unix, or
/// TLS over either): readiness-based, non-blocking reads and writes.
pub trait Stream: crate::io::SendSock + 'static {
    fn readable(&self) -> impl std::future::Future<Output = io::Result<()>>;
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize>;
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Like `try_write_vectored`, but tells TCP more data follows at once
    /// (`MSG_MORE`): the bytes wait for the next write instead of leaving
    /// as a short segment. This is TCP_CORK for one call, without the two
    /// `setsockopt` calls around it.
    fn try_write_more(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;
    fn set_nodelay(&self, on: bool);
    fn set_cork(&self, on: bool);
    fn set_linger_zero(&self);
    fn shutdown_write(&self);
    /// Whether the socket is known to the event loop (see
    /// [`crate::core::sock::LazySock`]); tokio's own sockets always are.
    fn is_registered(&self) -> bool {
        true
    }
    /// Pushes out bytes a write accepted but could not send yet (TLS
    /// records); `WouldBlock` while some are left. Called after every
    /// complete write.
    fn try_flush(&self) -> io::Result<()> {
        Ok(())
    }
    /// Whether files may be `sendfile`d to the socket (not through TLS).
    fn sendfile_ok(&self) -> bool {
        true
    }
    /// The connection is about to close (TLS sends close_notify).
    fn close(&self) {}
    /// Whether the client has closed its side (`Ok(true)`) or sent more
    /// bytes (`Ok(false)`, left unread for the next request), by a peek;
    /// `WouldBlock` when nothing has come (readiness is cleared, so the
    /// next `readable()` really waits). Streams that cannot tell say
    /// `Ok(false)`.
    fn peek_hangup(&self) -> io::Result<bool> {
        Ok(false)
    }
}

/// A non-blocking one-byte peek: true at EOF.
pub fn peek_eof(s: socket2::SockRef<'_>) -> io::Result<bool> {
    let mut b = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    s.recv_with_flags(&mut b, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        .map(|n| n == 0)
}

macro_rules! impl_stream {
    ($t:ty, $tcp:expr) => {
        impl Stream for $t {
            async fn readable(&self) -> io::Result<()> {
                <$t>::readable(self).await
            }
            fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
                // A read that does not fill `buf` has drained the socket:
                // tell tokio (as if it had said EAGAIN) so the next wait
                // goes to epoll instead of making a `recv` that can only
                // find nothing. New bytes after this read raise a new edge.
                let mut got = None;
                let r = <$t>::try_io(self, tokio::io::Interest::READABLE, || {
                    let sock = socket2::SockRef::from(self);
                    let n = std::io::Read::read(&mut &*sock, buf)?;
                    if n == 0 || n == buf.len() {
                        return Ok(n);
                    }
                    got = Some(n);
                    Err(io::ErrorKind::WouldBlock.into())
                });
                match (r, got) {
                    (_, Some(n)) => Ok(n),
                    (r, None) => r,
                }
            }
            fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
                <$t>::try_write_vectored(self, bufs)
            }
            fn try_write_more(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
                if !$tcp {
                    return <$t>::try_write_vectored(self, bufs);
                }
                let fd = std::os::fd::AsRawFd::as_raw_fd(self);
                crate::io::SendSock::try_io(self, || crate::core::sock::send_more(fd, bufs))
            }
            fn set_nodelay(&self, on: bool) {
                if $tcp {
                    let _ = socket2::SockRef::from(self).set_nodelay(on);
                }
            }
            fn set_cork(&self, on: bool) {
                if $tcp {
                    let _ = socket2::SockRef::from(self).set_cork(on);
                }
            }
            fn set_linger_zero(&self) {
                let _ = socket2::SockRef::from(self).set_linger(Some(Duration::ZERO));
            }
            fn shutdown_write(&self) {
                let _ = socket2::SockRef::from(self).shutdown(std::net::Shutdown::Write);
            }
            fn peek_hangup(&self) -> io::Result<bool> {
                <$t>::try_io(self, tokio::io::Interest::READABLE, || {
                    peek_eof(socket2::SockRef::from(self))
                })
            }
        }
    };
}
impl_stream!(tokio::net::TcpStream, true);
impl_stream!(tokio::net::UnixStream, false);
