//! The transport as the `h2` crate wants it (tokio's `AsyncRead` and
//! `AsyncWrite`), over the engine's readiness-based [`Stream`]. Bytes
//! already read while choosing the protocol (the preface on a cleartext
//! listener) are given back first.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::core::stream::Stream;
use crate::http::v2::guard::Guard;

type Wait<'a> = Pin<Box<dyn Future<Output = io::Result<()>> + 'a>>;

pub struct Io<'a, S: Stream> {
    s: &'a S,
    /// Sees every byte before h2 does (see [`Guard`]).
    guard: &'a Guard,
    /// Bytes read before the connection was handed to h2.
    pre: Vec<u8>,
    pre_off: usize,
    rd: Option<Wait<'a>>,
    wr: Option<Wait<'a>>,
}

impl<'a, S: Stream> Io<'a, S> {
    pub fn new(s: &'a S, guard: &'a Guard, pre: Vec<u8>) -> Io<'a, S> {
        Io {
            s,
            guard,
            pre,
            pre_off: 0,
            rd: None,
            wr: None,
        }
    }

    /// Waits (through `wr`) until the socket may take more bytes.
    fn poll_writable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let s = self.s;
        let w = self
            .wr
            .get_or_insert_with(|| Box::pin(crate::io::SendSock::writable(s)));
        let r = ready!(w.as_mut().poll(cx));
        self.wr = None;
        Poll::Ready(r)
    }

    fn poll_flush_inner(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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

impl<S: Stream> AsyncRead for Io<'_, S> {
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

impl<S: Stream> AsyncWrite for Io<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        loop {
            match me.s.try_write_vectored(bufs) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(me.poll_writable(cx))?;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_flush_inner(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        ready!(me.poll_flush_inner(cx))?;
        me.s.shutdown_write();
        Poll::Ready(Ok(()))
    }
}
