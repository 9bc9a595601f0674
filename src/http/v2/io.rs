//! The transport as the `h2` crate wants it (tokio's `AsyncRead` and
//! `AsyncWrite`), over the engine's readiness-based [`Stream`]. Bytes
//! already read while choosing the protocol (the preface on a cleartext
//! listener) are given back first.
//!
//! Writes are gathered ([`Outbox`]): h2 writes frame by frame (a DATA
//! frame's payload apart from what precedes it, and it flushes whenever
//! one is queued), which would be a TLS record and a `writev` for each
//! response. Its bytes are copied into one buffer instead and go out
//! when the connection task has done what it could in one wake-up
//! ([`Outbox::poll_flush`], called by `conn` after every poll of the h2
//! connection): the responses of streams that finished together leave
//! as one record and one system call, as nginx's output queue does.

use std::cell::RefCell;
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::core::stream::Stream;
use crate::http::v2::guard::Guard;

type Wait<'a> = Pin<Box<dyn Future<Output = io::Result<()>> + 'a>>;

/// Gathered bytes past this go out at once (h2 may be writing a large
/// body; the buffer never grows much beyond it).
const GATHER: usize = 64 * 1024;

thread_local! {
    /// A spare gathering buffer: a connection holds one only while it
    /// has bytes waiting (an idle connection holds none).
    static SPARE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The connection's outgoing bytes on their way to the socket.
pub struct Outbox<'a, S: Stream> {
    s: &'a S,
    buf: RefCell<Vec<u8>>,
    wr: RefCell<Option<Wait<'a>>>,
}

impl<'a, S: Stream> Outbox<'a, S> {
    pub fn new(s: &'a S) -> Outbox<'a, S> {
        Outbox {
            s,
            buf: RefCell::new(Vec::new()),
            wr: RefCell::new(None),
        }
    }

    /// Waits (through `wr`) until the socket may take more bytes.
    fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let s = self.s;
        let mut wr = self.wr.borrow_mut();
        let w = wr.get_or_insert_with(|| Box::pin(crate::io::SendSock::writable(s)));
        let r = ready!(w.as_mut().poll(cx));
        *wr = None;
        Poll::Ready(r)
    }

    /// Takes `bufs` (all of them, or as much as the socket took when the
    /// gathered bytes had to go first).
    fn poll_write(&self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        loop {
            let mut b = self.buf.borrow_mut();
            if b.len() + total <= GATHER {
                if b.capacity() == 0 {
                    *b = SPARE.take();
                }
                for s in bufs {
                    b.extend_from_slice(s);
                }
                return Poll::Ready(Ok(total));
            }
            // Too much to gather: what is gathered goes first, with
            // these bytes in the same write.
            let r = if b.is_empty() {
                self.s.try_write_vectored(bufs)
            } else if bufs.len() < 8 {
                let mut iov = [IoSlice::new(&[]); 8];
                iov[0] = IoSlice::new(&b);
                iov[1..=bufs.len()].copy_from_slice(bufs);
                self.s.try_write_vectored(&iov[..=bufs.len()])
            } else {
                self.s.try_write_vectored(&[IoSlice::new(&b)])
            };
            match r {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) if n >= b.len() => {
                    let theirs = n - b.len();
                    b.clear();
                    if theirs > 0 {
                        return Poll::Ready(Ok(theirs));
                    }
                }
                Ok(n) => {
                    b.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drop(b);
                    ready!(self.poll_writable(cx))?;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Sends everything gathered (and, over TLS, the records made of
    /// it); `Pending` while the socket is full.
    pub fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut b = self.buf.borrow_mut();
            if b.is_empty() {
                if b.capacity() > 0 && b.capacity() <= 2 * GATHER {
                    SPARE.set(std::mem::take(&mut *b));
                } else {
                    *b = Vec::new();
                }
                break;
            }
            match self.s.try_write_vectored(&[IoSlice::new(&b)]) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    b.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drop(b);
                    ready!(self.poll_writable(cx))?;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        loop {
            match self.s.try_flush() {
                Ok(()) => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.poll_writable(cx))?;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

pub struct Io<'a, 'o, S: Stream> {
    s: &'a S,
    /// Sees every byte before h2 does (see [`Guard`]).
    guard: &'a Guard,
    out: &'o Outbox<'a, S>,
    /// Bytes read before the connection was handed to h2.
    pre: Vec<u8>,
    pre_off: usize,
    rd: Option<Wait<'a>>,
}

impl<'a, 'o, S: Stream> Io<'a, 'o, S> {
    pub fn new(s: &'a S, guard: &'a Guard, out: &'o Outbox<'a, S>, pre: Vec<u8>) -> Io<'a, 'o, S> {
        Io {
            s,
            guard,
            out,
            pre,
            pre_off: 0,
            rd: None,
        }
    }
}

impl<S: Stream> AsyncRead for Io<'_, '_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.guard.trip().is_some() {
            // The connection is ending: h2 gets nothing more (the guard's
            // notice wakes the connection loop, not this read).
            return Poll::Pending;
        }
        if me.pre_off < me.pre.len() {
            let n = (me.pre.len() - me.pre_off).min(buf.remaining());
            let n = me.guard.feed(&me.pre[me.pre_off..me.pre_off + n]);
            if n == 0 {
                return Poll::Pending;
            }
            buf.put_slice(&me.pre[me.pre_off..me.pre_off + n]);
            me.pre_off += n;
            if me.pre_off == me.pre.len() {
                me.pre = Vec::new();
                me.pre_off = 0;
            }
            return Poll::Ready(Ok(()));
        }
        loop {
            if let Some(w) = me.rd.as_mut() {
                let r = ready!(w.as_mut().poll(cx));
                me.rd = None;
                r?;
            }
            let space = buf.initialize_unfilled();
            match me.s.try_read(space) {
                Ok(0) => return Poll::Ready(Ok(())),
                Ok(n) => {
                    let keep = me.guard.feed(&space[..n]);
                    if keep == 0 {
                        return Poll::Pending;
                    }
                    buf.advance(keep);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let s = me.s;
                    me.rd = Some(Box::pin(s.readable()));
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl<S: Stream> AsyncWrite for Io<'_, '_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.out.poll_write(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.out.poll_write(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Nothing here: h2 flushes after every frame that carries a body
    /// piece; the gathered bytes go out once the connection task's poll
    /// of h2 is over (see [`Outbox`]).
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        ready!(me.out.poll_flush(cx))?;
        me.s.shutdown_write();
        Poll::Ready(Ok(()))
    }
}
