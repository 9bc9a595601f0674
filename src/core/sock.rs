//! Accepted sockets that join the event loop only when they have to wait.
//!
//! A client connection usually arrives with its request already in the
//! socket (on loopback and under load it is there before `accept4`
//! returns), and a short response fits in the send buffer. Such a
//! connection never waits, so registering it with the worker's epoll
//! (`EPOLL_CTL_ADD`), allocating tokio's readiness cell for it and taking
//! it out again on close (`EPOLL_CTL_DEL`) buys nothing. [`LazySock`]
//! holds the bare non-blocking socket and performs reads and writes on it
//! directly; the first time the engine has to wait (a read or write that
//! would block, an idle keep-alive wait) it registers the socket with
//! tokio, and from then on every call goes through tokio's registration.
//!
//! ```text
//!  accept4(NONBLOCK) --> [Raw] --wait needed--> [Registered] --park--> bare fd
//!                          |                         |
//!                        close                 EPOLL_CTL_DEL + close
//! ```
//! Invariant: the socket is in exactly one place, the raw slot or the
//! registration; no await holds a borrow of the raw slot, so reads,
//! writes and the registration never overlap.
//!
//! Registering with `EPOLLET` after a call said `EAGAIN` loses no wake-up:
//! `epoll_ctl(ADD)` checks the socket's current state and reports it if
//! it is already ready.

use std::cell::{OnceCell, RefCell};
use std::future::Future;
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::core::stream::Stream;

/// A tokio socket type that can be made from, and turned back into, its
/// std counterpart.
pub trait Registrable: Stream + AsFd + Sized {
    type Std: AsFd + AsRawFd;
    /// Whether `TCP_*` options apply.
    const TCP: bool;
    fn register(s: Self::Std) -> io::Result<Self>;
    fn deregister(self) -> io::Result<Self::Std>;
    /// Runs a read-like call `f` on the registered socket; a `WouldBlock`
    /// clears tokio's read readiness (tokio's `try_io`).
    fn try_io_read<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
}

impl Registrable for tokio::net::TcpStream {
    type Std = std::net::TcpStream;
    const TCP: bool = true;
    fn register(s: Self::Std) -> io::Result<Self> {
        tokio::net::TcpStream::from_std(s)
    }
    fn deregister(self) -> io::Result<Self::Std> {
        self.into_std()
    }
    fn try_io_read<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.try_io(tokio::io::Interest::READABLE, f)
    }
}

impl Registrable for tokio::net::UnixStream {
    type Std = std::os::unix::net::UnixStream;
    const TCP: bool = false;
    fn register(s: Self::Std) -> io::Result<Self> {
        tokio::net::UnixStream::from_std(s)
    }
    fn deregister(self) -> io::Result<Self::Std> {
        self.into_std()
    }
    fn try_io_read<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.try_io(tokio::io::Interest::READABLE, f)
    }
}

/// An accepted socket, registered with the event loop on its first wait.
pub struct LazySock<T: Registrable> {
    /// The bare socket until the first wait; `None` after.
    raw: RefCell<Option<T::Std>>,
    registered: OnceCell<T>,
    fd: RawFd,
    /// Still in the parking lot's epoll set, disabled (one-shot): taken
    /// out when the socket registers with tokio, since every wake-up of a
    /// socket walks all the sets it is in.
    in_lot: bool,
}

impl<T: Registrable> LazySock<T> {
    /// A non-blocking socket not yet known to the event loop.
    pub fn raw(s: T::Std) -> LazySock<T> {
        let fd = s.as_raw_fd();
        LazySock {
            raw: RefCell::new(Some(s)),
            registered: OnceCell::new(),
            fd,
            in_lot: false,
        }
    }

    /// A bare socket the parking lot has just woken (see `in_lot`).
    pub fn from_lot(s: T::Std) -> LazySock<T> {
        LazySock {
            in_lot: true,
            ..LazySock::raw(s)
        }
    }

    /// A socket already registered with the event loop.
    pub fn registered(t: T) -> LazySock<T> {
        let fd = t.as_raw_fd();
        LazySock {
            raw: RefCell::new(None),
            registered: OnceCell::from(t),
            fd,
            in_lot: false,
        }
    }

    /// The tokio socket, registering it now if it is not yet.
    fn reg(&self) -> io::Result<&T> {
        if let Some(t) = self.registered.get() {
            return Ok(t);
        }
        let s = self
            .raw
            .try_borrow_mut()
            .ok()
            .and_then(|mut r| r.take())
            .ok_or_else(|| io::Error::other("socket is being used"))?;
        if self.in_lot {
            crate::core::park::unwatch(self.fd);
        }
        let t = T::register(s)?;
        Ok(self.registered.get_or_init(|| t))
    }

    /// Runs `f` on the bare socket, or returns None when it is registered.
    fn with_raw<R>(&self, f: impl FnOnce(&T::Std) -> R) -> Option<R> {
        if self.registered.get().is_some() {
            return None;
        }
        let r = self.raw.try_borrow().ok()?;
        r.as_ref().map(f)
    }

    /// The socket as tokio's type (the stream proxy works on those).
    pub fn into_registered(self) -> io::Result<T> {
        self.reg()?;
        self.registered
            .into_inner()
            .ok_or_else(|| io::Error::other("socket lost"))
    }

    /// The bare socket, taken out of the event loop if it was in it.
    pub fn into_std(self) -> io::Result<T::Std> {
        match self.registered.into_inner() {
            Some(t) => t.deregister(),
            None => self
                .raw
                .into_inner()
                .ok_or_else(|| io::Error::other("socket lost")),
        }
    }

    /// Runs `f` on the socket's options, wherever the socket is.
    fn with_sock<R>(&self, f: impl FnOnce(socket2::SockRef<'_>) -> R) -> Option<R> {
        match self.registered.get() {
            Some(t) => Some(f(socket2::SockRef::from(t))),
            None => self.with_raw(|s| f(socket2::SockRef::from(s))),
        }
    }

    /// The local address (`getsockname`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.with_sock(|s| s.local_addr().ok()?.as_socket())?
    }

    /// Copies the bytes waiting in the socket into `buf` without taking
    /// them (`MSG_PEEK`), waiting for some when there are none; 0 at EOF.
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        if self.registered.get().is_none() {
            match recv_peek(self.fd, buf) {
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
        let t = self.reg()?;
        loop {
            t.readable().await?;
            match t.try_io_read(|| recv_peek(self.fd, buf)) {
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }

    /// A raw call's result: one that would block registers the socket, so
    /// that the caller's next wait has an event to wait for.
    fn raw_result<R>(&self, r: io::Result<R>) -> io::Result<R> {
        if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            self.reg()?;
        }
        r
    }
}

impl<T: Registrable> AsRawFd for LazySock<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl<T: Registrable> crate::io::SendSock for LazySock<T> {
    fn writable(&self) -> impl Future<Output = io::Result<()>> {
        // Unregistered means no write has been refused yet: try it. (A
        // refused raw write registers the socket, see `raw_result`.)
        let reg = self.registered.get();
        async move {
            match reg {
                Some(t) => crate::io::SendSock::writable(t).await,
                None => Ok(()),
            }
        }
    }
    fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        match self.registered.get() {
            Some(t) => crate::io::SendSock::try_io(t, f),
            None => self.raw_result(f()),
        }
    }
}

impl<T: Registrable> Stream for LazySock<T>
where
    for<'a> &'a T::Std: Read + Write,
{
    async fn readable(&self) -> io::Result<()> {
        self.reg()?.readable().await
    }
    fn is_registered(&self) -> bool {
        self.registered.get().is_some()
    }
    fn peek_hangup(&self) -> io::Result<bool> {
        // Only asked after `readable()`, which registers the socket.
        match self.registered.get() {
            Some(t) => t.peek_hangup(),
            None => Ok(false),
        }
    }
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self.with_raw(|s| {
            let mut s = s;
            s.read(buf)
        }) {
            Some(r) => self.raw_result(r),
            None => self.reg()?.try_read(buf),
        }
    }
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self.with_raw(|s| {
            let mut s = s;
            s.write_vectored(bufs)
        }) {
            Some(r) => self.raw_result(r),
            None => self.reg()?.try_write_vectored(bufs),
        }
    }
    fn try_write_more(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if !T::TCP {
            return self.try_write_vectored(bufs);
        }
        match self.registered.get() {
            Some(t) => t.try_write_more(bufs),
            None => self.raw_result(send_more(self.fd, bufs)),
        }
    }
    fn set_nodelay(&self, on: bool) {
        if T::TCP {
            self.with_sock(|s| s.set_nodelay(on));
        }
    }
    fn set_cork(&self, on: bool) {
        if T::TCP {
            self.with_sock(|s| s.set_cork(on));
        }
    }
    fn set_linger_zero(&self) {
        self.with_sock(|s| s.set_linger(Some(Duration::ZERO)));
    }
    fn shutdown_write(&self) {
        self.with_sock(|s| s.shutdown(std::net::Shutdown::Write));
    }
}

/// `recv(MSG_PEEK)`: the bytes waiting in the socket, left there.
fn recv_peek(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: recv(2) writes at most `buf.len()` bytes into `buf`, which is
    // valid and exclusively borrowed for the call; a bad `fd` is an error
    // return, not undefined behaviour.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `sendmsg(MSG_MORE)`: the bytes wait in the socket for the next write,
/// a shutdown or the close, which push them (with the FIN, on a close).
pub fn send_more(fd: RawFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len() as _;
    // SAFETY: fd is an open socket of the caller's; msg points at `bufs`,
    // which outlives the call, and IoSlice is ABI-compatible with iovec.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_MORE | libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One `accept4` on a listening TCP socket: the connection comes back
/// non-blocking and close-on-exec, and not registered anywhere.
pub fn accept_raw(listener: RawFd) -> io::Result<(std::net::TcpStream, Option<SocketAddr>)> {
    // SAFETY: try_init hands a zeroed sockaddr_storage and its length to
    // the closure, which only passes them to accept4 as out-parameters.
    let (fd, peer) = unsafe {
        socket2::SockAddr::try_init(|storage, len| {
            let fd = libc::accept4(
                listener,
                storage.cast(),
                len,
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            );
            if fd < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(fd)
            }
        })?
    };
    // SAFETY: accept4 returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok((std::net::TcpStream::from(fd), peer.as_socket()))
}

/// How many connections wait in a TCP listener's accept queue, or `None`
/// if the kernel will not say.
pub fn accept_queue_len(listener: RawFd) -> Option<u32> {
    // For a listening socket Linux reports the accept queue's length in
    // `tcpi_unacked` and returns early, without locking the socket; only
    // the head of `struct tcp_info` up to that field is asked for.
    const UNACKED_AT: usize = 24;
    let mut head = [0u8; UNACKED_AT + 8];
    let mut len = head.len() as libc::socklen_t;
    // SAFETY: `head` is writable for `len` bytes; the kernel writes at
    // most `len` and stores the length it wrote in `len`.
    let r = unsafe {
        libc::getsockopt(
            listener,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            head.as_mut_ptr().cast(),
            &mut len,
        )
    };
    // The first byte is the socket's state: 10 is TCP_LISTEN.
    if r != 0 || (len as usize) < UNACKED_AT + 4 || head[0] != 10 {
        return None;
    }
    let mut n = [0u8; 4];
    n.copy_from_slice(&head[UNACKED_AT..UNACKED_AT + 4]);
    Some(u32::from_ne_bytes(n))
}
