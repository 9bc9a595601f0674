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

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::core::stream::Stream;
use crate::http::v2::guard::{Fed, Guard};

type Wait<'a> = Pin<Box<dyn Future<Output = io::Result<()>> + 'a>>;

/// Gathered bytes past this go out before more are taken.
const GATHER: usize = 64 * 1024;

/// The payload of the PING the h2 crate sends in a graceful shutdown.
const SHUTDOWN_PING: [u8; 8] = [0x0b, 0x7b, 0xa2, 0xf0, 0x8b, 0x9b, 0xfe, 0x54];

thread_local! {
    /// A spare gathering buffer: a connection holds one only while it
    /// has bytes waiting (an idle connection holds none).
    static SPARE: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The connection's outgoing bytes on their way to the socket.
///
/// It also makes the h2 crate's graceful shutdown look as nginx's on the
/// wire: h2 sends GOAWAY with the largest stream id (2^31-1) and a PING,
/// and only when the PING's answer comes a second GOAWAY with the last
/// stream it processed; nginx sends that second one at once, alone. So
/// the first GOAWAY and the PING are left out, and the answer is handed
/// to h2 as if the client had sent it ([`Outbox::pong_due`]); h2's
/// GOAWAY with the last stream then goes out straight away.
pub struct Outbox<'a, S: Stream> {
    s: &'a S,
    /// Says which of tern's answers a reset follows.
    guard: &'a Guard,
    buf: RefCell<Vec<u8>>,
    wr: RefCell<Option<Wait<'a>>>,
    /// h2's shutdown PING was left out: its answer is due to h2.
    pong: Cell<bool>,
    /// Bytes written to the socket so far (the closing connection waits
    /// while they grow).
    written: Cell<u64>,
}

impl<'a, S: Stream> Outbox<'a, S> {
    pub fn new(s: &'a S, guard: &'a Guard) -> Outbox<'a, S> {
        Outbox {
            s,
            guard,
            buf: RefCell::new(Vec::new()),
            wr: RefCell::new(None),
            pong: Cell::new(false),
            written: Cell::new(0),
        }
    }

    /// Bytes written to the socket so far.
    pub fn written(&self) -> u64 {
        self.written.get()
    }

    /// Whether h2 is owed the answer to its shutdown PING.
    pub fn pong_due(&self) -> bool {
        self.pong.get()
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

    /// Takes all of `bufs` (once what was gathered before has gone, when
    /// there is too much of it). h2 writes whole frames each time, so
    /// the bytes taken are whole frames: the two of its graceful
    /// shutdown are dropped here (see [`Outbox`]), and the resets that
    /// follow answers to malformed requests added
    /// ([`Guard::reset_due`]).
    fn poll_write(&self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        loop {
            let mut b = self.buf.borrow_mut();
            if b.is_empty() || b.len() + total <= GATHER {
                if b.capacity() == 0 {
                    *b = SPARE.take();
                }
                let from = b.len();
                for s in bufs {
                    b.extend_from_slice(s);
                }
                self.rewrite_frames(&mut b, from);
                return Poll::Ready(Ok(total));
            }
            drop(b);
            ready!(self.poll_send(cx))?;
        }
    }

    /// Removes h2's first shutdown GOAWAY and its PING from the frames
    /// in `b[from..]`, and puts RST_STREAM(PROTOCOL_ERROR) after the
    /// last frame of an answer to a malformed request.
    fn rewrite_frames(&self, b: &mut Vec<u8>, from: usize) {
        let mut i = from;
        while i + 9 <= b.len() {
            let len = (b[i] as usize) << 16 | (b[i + 1] as usize) << 8 | b[i + 2] as usize;
            let end = i + 9 + len;
            if end > b.len() {
                // Not a whole frame (h2 always writes whole ones): leave
                // the rest alone.
                return;
            }
            let (kind, flags, sid) = (b[i + 3], b[i + 4], &b[i + 5..i + 9]);
            let payload = &b[i + 9..end];
            let goaway_max = kind == 7
                && len == 8
                && sid == [0, 0, 0, 0]
                && payload == [0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0];
            let shutdown_ping =
                kind == 6 && flags == 0 && sid == [0, 0, 0, 0] && payload == SHUTDOWN_PING;
            if goaway_max || shutdown_ping {
                if shutdown_ping {
                    self.pong.set(true);
                }
                b.drain(i..end);
                continue;
            }
            if self.guard.reset_due(
                kind,
                flags,
                u32::from_be_bytes([sid[0], sid[1], sid[2], sid[3]]),
            ) {
                let mut rst = [0, 0, 4, 3, 0, 0, 0, 0, 0, 0, 0, 0, 1];
                rst[5..9].copy_from_slice(&b[i + 5..i + 9]);
                b.splice(end..end, rst);
                i = end + rst.len();
                continue;
            }
            i = end;
        }
    }

    /// Writes gathered bytes until none are left; `Pending` while the
    /// socket is full.
    fn poll_send(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut b = self.buf.borrow_mut();
            if b.is_empty() {
                return Poll::Ready(Ok(()));
            }
            match self.s.try_write_vectored(&[IoSlice::new(&b)]) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    b.drain(..n);
                    self.written.set(self.written.get() + n as u64);
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
        ready!(self.poll_send(cx))?;
        {
            let mut b = self.buf.borrow_mut();
            if b.capacity() > 0 && b.capacity() <= 2 * GATHER {
                SPARE.set(std::mem::take(&mut *b));
            } else {
                *b = Vec::new();
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
    /// What the guard made of a read (header blocks replaced), not
    /// yet handed to h2.
    made: Vec<u8>,
    made_off: usize,
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
            made: Vec::new(),
            made_off: 0,
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
        if me.made_off < me.made.len() {
            // What the guard made of an earlier read, first (even once
            // it tripped: a failed request's stand-in is among it).
            let n = (me.made.len() - me.made_off).min(buf.remaining());
            buf.put_slice(&me.made[me.made_off..me.made_off + n]);
            me.made_off += n;
            if me.made_off == me.made.len() {
                me.made_done();
            }
            return Poll::Ready(Ok(()));
        }
        if me.guard.trip().is_some() {
            // The connection is ending: h2 gets nothing more (the guard's
            // notice wakes the connection loop, not this read).
            return Poll::Pending;
        }
        if me.out.pong.get() && me.pre_off == me.pre.len() && me.guard.at_frame_boundary() {
            // The answer to h2's shutdown PING (see [`Outbox`]), between
            // two of the client's frames.
            if buf.remaining() >= 17 {
                me.out.pong.set(false);
                buf.put_slice(&[0, 0, 8, 6, 1, 0, 0, 0, 0]);
                buf.put_slice(&SHUTDOWN_PING);
                return Poll::Ready(Ok(()));
            }
        }
        while me.pre_off < me.pre.len() {
            let n = (me.pre.len() - me.pre_off).min(buf.remaining());
            let from = me.pre_off;
            me.pre_off += n;
            if me.pre_off == me.pre.len() {
                // Freed once read (the connection keeps no copy).
                me.pre_off = 0;
                let pre = std::mem::take(&mut me.pre);
                if let Some(r) = me.give(&pre[from..from + n], buf) {
                    return r;
                }
            } else {
                let pre = std::mem::take(&mut me.pre);
                let r = me.give(&pre[from..from + n], buf);
                me.pre = pre;
                if let Some(r) = r {
                    return r;
                }
            }
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
                Ok(n) => match me.guard.feed(&space[..n], &mut me.made) {
                    Fed::Pass(0) => return Poll::Pending,
                    Fed::Pass(keep) => {
                        buf.advance(keep);
                        return Poll::Ready(Ok(()));
                    }
                    Fed::Rewritten => {
                        // The read's bytes are replaced by the guard's
                        // (in the same space, as far as they fit).
                        let m = me.made.len().min(space.len());
                        space[..m].copy_from_slice(&me.made[..m]);
                        me.made_off = m;
                        if me.made_off == me.made.len() {
                            me.made_done();
                        }
                        if m > 0 {
                            buf.advance(m);
                            return Poll::Ready(Ok(()));
                        }
                        if me.guard.trip().is_some() {
                            return Poll::Pending;
                        }
                        // All of it held (a header block's first frames):
                        // read on.
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let s = me.s;
                    me.rd = Some(Box::pin(s.readable()));
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl<S: Stream> Io<'_, '_, S> {
    /// The guard's bytes are all handed over: the buffer is kept for the
    /// next header block unless it grew large.
    fn made_done(&mut self) {
        self.made_off = 0;
        if self.made.capacity() > 4096 {
            self.made = Vec::new();
        } else {
            self.made.clear();
        }
    }

    /// Hands h2 what the guard makes of `bytes` (read before h2 had the
    /// connection); `None`: all of them were held, read on.
    fn give(&mut self, bytes: &[u8], buf: &mut ReadBuf<'_>) -> Option<Poll<io::Result<()>>> {
        match self.guard.feed(bytes, &mut self.made) {
            Fed::Pass(0) => Some(Poll::Pending),
            Fed::Pass(n) => {
                buf.put_slice(&bytes[..n]);
                Some(Poll::Ready(Ok(())))
            }
            Fed::Rewritten => {
                let m = self.made.len().min(buf.remaining());
                buf.put_slice(&self.made[..m]);
                self.made_off = m;
                if self.made_off == self.made.len() {
                    self.made_done();
                }
                if m > 0 {
                    Some(Poll::Ready(Ok(())))
                } else if self.guard.trip().is_some() {
                    Some(Poll::Pending)
                } else {
                    None
                }
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
