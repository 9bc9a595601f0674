//! What the `h2` crate does not judge about a client's frames, judged as
//! nginx does, by watching the bytes on their way to the crate.
//!
//! ```text
//!  socket ──▶ io::Io::poll_read ──▶ Guard::feed(bytes) ──▶ h2 (frames)
//!                                      │ a frame nginx answers with GOAWAY:
//!                                      │   the frame and all after it are
//!                                      │   withheld from h2, `tripped` fires
//!                                      ▼
//!                        conn::serve: GOAWAY(reason) and close
//! ```
//!
//! The guard follows frame boundaries only (a 9-byte header, then the
//! payload is skipped, but for the few bytes of priority fields); it
//! never buffers more than a frame header. What it stops:
//! - floods of frames that cost the server work but carry nothing
//!   (SETTINGS, PING, empty DATA, WINDOW_UPDATE, PRIORITY, RST_STREAM):
//!   nginx's rule, more than 1 MiB plus 8 bytes of frames for every
//!   byte of request headers and body, "http2 flood detected";
//! - rapid reset (CVE-2023-44487): more new streams in one read than
//!   twice `http2_max_concurrent_streams` ("client sent too many streams
//!   at once", as nginx 1.25.3), or streams cancelled by the client far
//!   more often than they are served;
//! - a stream that depends on itself (PRIORITY, or HEADERS with the
//!   priority flag) and a client's PUSH_PROMISE: GOAWAY PROTOCOL_ERROR,
//!   as nginx (RFC 9113 allows a stream error; nginx closes);
//! - a GOAWAY shorter than its fixed fields: FRAME_SIZE_ERROR;
//! - a request whose header block took longer than
//!   client_header_timeout to arrive: the stream is reset with
//!   PROTOCOL_ERROR (as nginx), the connection goes on.
//!
//! Withholding the offending frame means h2's "last processed stream"
//! in the GOAWAY is the one before it, as nginx reports. When the bytes
//! that decide (a priority field) come in a later read than the frame's
//! header, the header and payload bytes of the earlier reads have gone to
//! h2 already; h2 acts on whole frames only, so it never sees the frame
//! (checked by `fuzzing::h2_guard`).

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use h2::Reason;
use tokio::sync::Notify;

/// Frame types (RFC 9113 6).
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const PRIORITY: u8 = 2;
const RST_STREAM: u8 = 3;
const PUSH_PROMISE: u8 = 5;
const GOAWAY: u8 = 7;
const CONTINUATION: u8 = 9;

const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// nginx: a connection may read this much more than 8 x its payload.
const FLOOD_SLACK: u64 = 1 << 20;
/// Client cancellations tolerated before the ratio to served streams
/// is looked at.
const RESET_SLACK: u64 = 200;

/// Why a connection was stopped: the GOAWAY code and the error-log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trip {
    pub reason: Reason,
    pub log: &'static str,
}

pub struct Guard {
    st: RefCell<State>,
    /// Set once; then every later byte is withheld.
    trip: Cell<Option<Trip>>,
    /// Fires when `trip` is set (the connection loop waits on it).
    pub tripped: Notify,
    /// Streams whose response went out whole (told by the connection).
    served: Cell<u64>,
    /// 2 x http2_max_concurrent_streams.
    burst: u64,
    /// client_header_timeout.
    header_to: Duration,
    /// Streams whose header block came too slowly (a few at most).
    late: RefCell<Vec<u32>>,
    /// The size of each new stream's header block (HEADERS and
    /// CONTINUATION payloads: nginx's `$request_length`), until its
    /// stream task takes it; the oldest go first past a bound.
    lens: RefCell<std::collections::VecDeque<(u32, usize)>>,
}

struct State {
    /// Preface bytes still to pass.
    preface: usize,
    head: [u8; 9],
    head_len: usize,
    /// The frame being passed: its header and payload bytes still to come.
    kind: u8,
    flags: u8,
    stream: u32,
    left: usize,
    /// Payload bytes wanted for a look (padding length, priority fields).
    peek: [u8; 6],
    peek_len: usize,
    peek_want: usize,
    total: u64,
    payload: u64,
    max_stream: u32,
    resets: u64,
    /// A new stream's header block being received: its id and when its
    /// first frame began.
    block: Option<(u32, Instant)>,
    /// Bytes of that header block so far.
    block_len: usize,
}

impl Guard {
    pub fn new(max_streams: u32, header_to: Duration) -> Guard {
        Guard {
            st: RefCell::new(State {
                preface: super::PREFACE.len(),
                head: [0; 9],
                head_len: 0,
                kind: 0,
                flags: 0,
                stream: 0,
                left: 0,
                peek: [0; 6],
                peek_len: 0,
                peek_want: 0,
                total: 0,
                payload: 0,
                max_stream: 0,
                resets: 0,
                block: None,
                block_len: 0,
            }),
            trip: Cell::new(None),
            tripped: Notify::new(),
            served: Cell::new(0),
            burst: (max_streams as u64).saturating_mul(2).max(2),
            header_to,
            late: RefCell::new(Vec::new()),
            lens: RefCell::new(std::collections::VecDeque::new()),
        }
    }

    /// The size of `stream`'s header block, once (0 if unknown).
    pub fn head_len(&self, stream: u32) -> usize {
        let mut l = self.lens.borrow_mut();
        match l.iter().position(|&(s, _)| s == stream) {
            Some(i) => l.remove(i).map_or(0, |e| e.1),
            None => 0,
        }
    }

    /// Whether a frame, or a header block, is part-way in: the
    /// connection is not idle then.
    pub fn busy(&self) -> bool {
        let s = self.st.borrow();
        s.head_len > 0 || s.left > 0 || s.peek_want > 0 || s.block.is_some()
    }

    /// Whether the bytes passed so far end with a whole frame (after the
    /// preface): a frame of tern's own may be handed to h2 here.
    pub fn at_frame_boundary(&self) -> bool {
        let s = self.st.borrow();
        s.preface == 0 && s.head_len == 0 && s.left == 0 && s.peek_want == 0
    }

    /// Whether the header block of `stream` took longer than
    /// client_header_timeout (once: the answer is forgotten).
    pub fn late(&self, stream: u32) -> bool {
        let mut l = self.late.borrow_mut();
        match l.iter().position(|&s| s == stream) {
            Some(i) => {
                l.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Why the connection must end, once it must.
    pub fn trip(&self) -> Option<Trip> {
        self.trip.get()
    }

    /// A stream's response went out whole.
    pub fn served(&self) {
        self.served.set(self.served.get() + 1);
    }

    /// The connection must end with GOAWAY `reason` (a stream found
    /// what nginx treats as a connection error).
    pub fn refuse(&self, reason: Reason, log: &'static str) {
        self.stop(reason, log);
    }

    fn stop(&self, reason: Reason, log: &'static str) {
        if self.trip.get().is_none() {
            self.trip.set(Some(Trip { reason, log }));
            self.tripped.notify_one();
        }
    }

    /// Looks at bytes just read (one socket read); returns how many of
    /// them h2 may have (all, unless a frame among them ends the
    /// connection: then those before it).
    pub fn feed(&self, bytes: &[u8]) -> usize {
        if self.trip.get().is_some() {
            return 0;
        }
        let mut s = self.st.borrow_mut();
        s.total += bytes.len() as u64;
        let now = Instant::now();
        let mut new_streams: u64 = 0;
        let mut i = 0;
        // Where the frame being passed began in `bytes` (0 if before).
        let mut frame_at = 0;
        while i < bytes.len() {
            if s.preface > 0 {
                let n = s.preface.min(bytes.len() - i);
                s.preface -= n;
                i += n;
                continue;
            }
            if s.left == 0 && s.peek_want == 0 {
                // A frame header.
                if s.head_len == 0 {
                    frame_at = i;
                }
                let n = (9 - s.head_len).min(bytes.len() - i);
                let hl = s.head_len;
                s.head[hl..hl + n].copy_from_slice(&bytes[i..i + n]);
                s.head_len += n;
                i += n;
                if s.head_len < 9 {
                    break;
                }
                s.head_len = 0;
                let h = s.head;
                let len = ((h[0] as usize) << 16) | ((h[1] as usize) << 8) | h[2] as usize;
                s.kind = h[3];
                s.flags = h[4];
                s.stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                s.left = len;
                s.peek_len = 0;
                s.peek_want = 0;
                match s.kind {
                    DATA => s.payload += len as u64,
                    HEADERS | CONTINUATION => {
                        s.payload += len as u64;
                        if s.kind == CONTINUATION {
                            s.block_len += len;
                        }
                        if s.kind == HEADERS && s.stream > s.max_stream {
                            s.max_stream = s.stream;
                            s.block = Some((s.stream, now));
                            s.block_len = len;
                            new_streams += 1;
                            if new_streams > self.burst {
                                self.stop(
                                    Reason::ENHANCE_YOUR_CALM,
                                    "client sent too many streams at once",
                                );
                                return frame_at;
                            }
                        }
                        if s.kind == HEADERS && s.flags & FLAG_PRIORITY != 0 {
                            let pad = usize::from(s.flags & FLAG_PADDED != 0);
                            s.peek_want = (pad + 5).min(len);
                        }
                    }
                    PRIORITY => s.peek_want = 5.min(len),
                    RST_STREAM => {
                        s.resets += 1;
                        if s.resets > RESET_SLACK.max(self.burst)
                            && s.resets > 2 * self.served.get()
                        {
                            self.stop(Reason::ENHANCE_YOUR_CALM, "client reset too many streams");
                            return frame_at;
                        }
                    }
                    PUSH_PROMISE => {
                        self.stop(Reason::PROTOCOL_ERROR, "client sent PUSH_PROMISE frame");
                        return frame_at;
                    }
                    GOAWAY if len < 8 => {
                        self.stop(
                            Reason::FRAME_SIZE_ERROR,
                            "client sent GOAWAY frame with incorrect length",
                        );
                        return frame_at;
                    }
                    _ => {}
                }
                if s.total / 8 > s.payload + FLOOD_SLACK {
                    self.stop(Reason::ENHANCE_YOUR_CALM, "http2 flood detected");
                    return frame_at;
                }
                if s.left == 0 {
                    // No payload: the frame ends with its header (an
                    // empty HEADERS or CONTINUATION may end a block).
                    self.frame_end(&mut s, now);
                }
                continue;
            }
            if s.peek_want > 0 {
                let n = (s.peek_want - s.peek_len).min(bytes.len() - i);
                let pl = s.peek_len;
                s.peek[pl..pl + n].copy_from_slice(&bytes[i..i + n]);
                s.peek_len += n;
                s.left -= n;
                i += n;
                if s.peek_len < s.peek_want {
                    break;
                }
                s.peek_want = 0;
                let off = if s.kind == HEADERS && s.flags & FLAG_PADDED != 0 {
                    1
                } else {
                    0
                };
                if s.peek_len >= off + 4 {
                    let p = &s.peek[off..off + 4];
                    let dep = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
                    if dep == s.stream && dep != 0 {
                        let log = if s.kind == PRIORITY {
                            "client sent PRIORITY frame with incorrect dependency"
                        } else {
                            "client sent HEADERS frame with incorrect dependency"
                        };
                        self.stop(Reason::PROTOCOL_ERROR, log);
                        return frame_at;
                    }
                }
                if s.left == 0 {
                    self.frame_end(&mut s, now);
                }
                continue;
            }
            // Payload: skipped.
            let n = s.left.min(bytes.len() - i);
            s.left -= n;
            i += n;
            if s.left == 0 {
                self.frame_end(&mut s, now);
            }
        }
        if s.left == 0 && s.peek_want == 0 && s.head_len == 0 {
            // A frame with no payload (or the last of one) ended here.
            self.frame_end(&mut s, now);
        }
        bytes.len()
    }
}

impl Guard {
    /// The frame in `s` is whole: a header block that ends with it is
    /// judged for its pace.
    fn frame_end(&self, s: &mut State, now: Instant) {
        const END_HEADERS: u8 = 0x4;
        if matches!(s.kind, HEADERS | CONTINUATION) && s.flags & END_HEADERS != 0 {
            if let Some((id, began)) = s.block.take() {
                let mut lens = self.lens.borrow_mut();
                if lens.len() >= 256 {
                    lens.pop_front();
                }
                lens.push_back((id, s.block_len));
                if now.duration_since(began) > self.header_to {
                    let mut l = self.late.borrow_mut();
                    if l.len() < 16 {
                        l.push(id);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let n = payload.len();
        let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn hello() -> Vec<u8> {
        let mut v = crate::http::v2::PREFACE.to_vec();
        v.extend(frame(4, 0, 0, &[]));
        v
    }

    #[test]
    fn passes_ordinary_frames_byte_by_byte() {
        let g = Guard::new(128, Duration::from_secs(60));
        let mut v = hello();
        v.extend(frame(HEADERS, 0x25, 1, &[0, 0, 0, 3, 15, 0x82]));
        v.extend(frame(DATA, 1, 1, b"hello"));
        for b in v.chunks(1) {
            assert_eq!(g.feed(b), 1);
        }
        assert!(g.trip().is_none());
    }

    #[test]
    fn self_dependency_is_withheld_and_trips() {
        let g = Guard::new(128, Duration::from_secs(60));
        let mut v = hello();
        let at = v.len();
        v.extend(frame(PRIORITY, 0, 3, &[0, 0, 0, 3, 0]));
        assert_eq!(g.feed(&v), at);
        assert_eq!(g.trip().map(|t| t.reason), Some(Reason::PROTOCOL_ERROR));
        assert_eq!(g.feed(b"more"), 0);
        // Padded HEADERS with the priority flag, split across reads.
        let g = Guard::new(128, Duration::from_secs(60));
        let mut v = hello();
        v.extend(frame(HEADERS, 0x2c, 5, &[0, 0, 0, 0, 5, 1, 0x82]));
        let (a, b) = v.split_at(v.len() - 4);
        assert_eq!(g.feed(a), a.len());
        assert_eq!(g.feed(b), 0);
        assert!(g.trip().is_some());
    }

    /// An empty HEADERS (or CONTINUATION) ending a header block, with
    /// more frames in the same read, ends the block: it used to stay open
    /// (found by fuzzing::h2_guard), so the connection never looked idle
    /// to keepalive_timeout.
    #[test]
    fn empty_frame_ends_its_header_block() {
        for tail in [
            frame(HEADERS, 4, 1, &[]),
            [
                frame(HEADERS, 0, 1, &[0x82]),
                frame(CONTINUATION, 4, 1, &[]),
            ]
            .concat(),
        ] {
            let g = Guard::new(128, Duration::from_secs(60));
            let mut v = hello();
            v.extend(tail);
            v.extend(frame(6, 0, 0, &[0; 8]));
            assert_eq!(g.feed(&v), v.len());
            assert!(!g.busy(), "header block left open");
        }
    }

    #[test]
    fn floods_trip() {
        let g = Guard::new(128, Duration::from_secs(60));
        assert_eq!(g.feed(&hello()), 33);
        let ping = frame(6, 0, 0, &[0; 8]);
        let mut tripped = false;
        for _ in 0..1_000_000 {
            if g.feed(&ping) < ping.len() {
                tripped = true;
                break;
            }
        }
        assert!(tripped);
        assert_eq!(g.trip().map(|t| t.log), Some("http2 flood detected"));
    }

    #[test]
    fn rapid_reset_trips() {
        let g = Guard::new(8, Duration::from_secs(60));
        g.feed(&hello());
        let mut n = 0;
        for i in 0..10_000u32 {
            let id = 2 * i + 1;
            let mut v = frame(HEADERS, 5, id, &[0x82]);
            v.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
            n += 1;
            if g.feed(&v) < v.len() {
                break;
            }
        }
        assert!(n < 1000, "{}", n);
        assert_eq!(g.trip().map(|t| t.reason), Some(Reason::ENHANCE_YOUR_CALM));
        // Many streams in one read.
        let g = Guard::new(8, Duration::from_secs(60));
        g.feed(&hello());
        let mut v = Vec::new();
        for i in 0..17u32 {
            v.extend(frame(HEADERS, 5, 2 * i + 1, &[0x82]));
        }
        assert!(g.feed(&v) < v.len());
    }
}
