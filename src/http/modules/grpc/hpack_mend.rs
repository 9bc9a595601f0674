//! A tolerant pass over the backend's header blocks before the `h2`
//! crate reads them: Huffman-coded strings padded with 8 or more bits
//! are cut to their last whole byte.
//!
//! RFC 7541 (5.2) calls padding longer than 7 bits a decoding error, and
//! the `h2` crate rejects the whole connection for it. nginx's decoder
//! (`ngx_http_huff_decode`) accepts any run of EOS bits shorter than the
//! EOS symbol itself, and backends exist that pad a string whose code
//! fills its last byte with a whole extra byte of ones (nginx's own test
//! backend does, for every such string). So tern accepts what nginx
//! accepts: [`Mend`] sits between the upstream connection and the h2
//! client, passes every frame through untouched except a header block
//! (HEADERS or PUSH_PROMISE and its CONTINUATIONs) that holds such a
//! string, which it writes again with the string cut and without the
//! block's padding. Everything else the h2 crate judges as before.
//!
//! As it reads the frames anyway, it also notes a GOAWAY (or the end of
//! the connection) in [`Mend::going`]: such a connection is not kept for
//! another call (nginx closes it too).
//!
//! Memory: a header block is gathered whole before it is looked at (the
//! strings may span frames), up to [`BLOCK_MAX`]; a larger one passes
//! untouched (the h2 crate's own limits apply to it). Other frames
//! (DATA) stream through without being held.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const GOAWAY: u8 = 0x7;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The largest header block gathered to be looked at.
const BLOCK_MAX: usize = 1 << 20;
/// The frames written for a mended block are at most this long (the
/// h2 client's SETTINGS_MAX_FRAME_SIZE, the protocol's default).
const FRAME_MAX: usize = 16_384;

/// A header block being gathered.
struct Block {
    typ: u8,
    sid: u32,
    /// The first frame's flags, without END_HEADERS and PADDED.
    flags: u8,
    /// What precedes the fragment in the first frame (the priority
    /// fields, or PUSH_PROMISE's promised stream id).
    prefix: Vec<u8>,
    fragment: Vec<u8>,
    /// The frames as they came (sent as they are when nothing changes).
    raw: Vec<u8>,
}

/// The upstream connection as the h2 client sees it (see the module docs).
pub struct Mend<T> {
    io: T,
    /// Read from the peer, not looked at yet.
    inb: Vec<u8>,
    /// Ready for the h2 client.
    out: Vec<u8>,
    out_at: usize,
    /// Bytes of the current frame that pass untouched.
    pass: usize,
    block: Option<Block>,
    /// The rest of a block too large to gather passes untouched.
    skipping: bool,
    eof: bool,
    /// Set on the peer's GOAWAY or the connection's end.
    going: Arc<AtomicBool>,
}

impl<T> Mend<T> {
    /// `going` is set when the peer sends GOAWAY or the connection ends.
    pub fn new(io: T, going: Arc<AtomicBool>) -> Mend<T> {
        Mend {
            going,
            io,
            inb: Vec::new(),
            out: Vec::new(),
            out_at: 0,
            pass: 0,
            block: None,
            skipping: false,
            eof: false,
        }
    }

    /// Moves what can be judged from `inb` to `out`; false when more
    /// bytes are needed.
    fn step(&mut self) -> bool {
        if self.pass > 0 {
            if self.inb.is_empty() {
                return false;
            }
            let n = self.pass.min(self.inb.len());
            self.out.extend(self.inb.drain(..n));
            self.pass -= n;
            return true;
        }
        if self.inb.len() < 9 {
            return false;
        }
        let len = usize::from(self.inb[0]) << 16
            | usize::from(self.inb[1]) << 8
            | usize::from(self.inb[2]);
        let typ = self.inb[3];
        let flags = self.inb[4];
        if typ == GOAWAY {
            self.going.store(true, Ordering::Relaxed);
        }
        let header_frame = matches!(typ, HEADERS | PUSH_PROMISE | CONTINUATION);
        if !header_frame || self.skipping || len > BLOCK_MAX {
            if typ != CONTINUATION {
                // Anything but a CONTINUATION ends a block (a protocol
                // error the h2 client reports): what was gathered goes
                // as it came.
                self.flush_block();
                self.skipping = false;
            }
            if self.skipping && flags & END_HEADERS != 0 {
                self.skipping = false;
            }
            self.out.extend(self.inb.drain(..9));
            self.pass = len;
            return true;
        }
        if self.inb.len() < 9 + len {
            return false;
        }
        let frame: Vec<u8> = self.inb.drain(..9 + len).collect();
        self.header_frame(frame);
        true
    }

    /// What was gathered of a block, untouched.
    fn flush_block(&mut self) {
        if let Some(b) = self.block.take() {
            self.out.extend_from_slice(&b.raw);
        }
    }

    fn header_frame(&mut self, frame: Vec<u8>) {
        let typ = frame[3];
        let flags = frame[4];
        let sid = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        if typ == CONTINUATION {
            let Some(b) = self.block.as_mut() else {
                // Not in a block: the h2 client's error to find.
                self.out.extend_from_slice(&frame);
                return;
            };
            b.fragment.extend_from_slice(&frame[9..]);
            b.raw.extend_from_slice(&frame);
            if flags & END_HEADERS != 0 {
                if let Some(b) = self.block.take() {
                    self.finish(b);
                }
            } else if b.raw.len() > BLOCK_MAX {
                self.flush_block();
                self.skipping = true;
            }
            return;
        }
        self.flush_block();
        let payload = &frame[9..];
        let (pad, body) = if flags & PADDED != 0 {
            match payload.split_first() {
                Some((p, rest)) => (usize::from(*p), rest),
                None => return self.out.extend_from_slice(&frame),
            }
        } else {
            (0, payload)
        };
        let prefix_len = match typ {
            PUSH_PROMISE => 4,
            _ if flags & PRIORITY != 0 => 5,
            _ => 0,
        };
        if body.len() < prefix_len + pad {
            return self.out.extend_from_slice(&frame);
        }
        let b = Block {
            typ,
            sid,
            flags: flags & !(END_HEADERS | PADDED),
            prefix: body[..prefix_len].to_vec(),
            fragment: body[prefix_len..body.len() - pad].to_vec(),
            raw: Vec::new(),
        };
        let mut b = b;
        b.raw = frame;
        if flags & END_HEADERS != 0 {
            self.finish(b);
        } else {
            self.block = Some(b);
        }
    }

    /// A whole block: as it came, or written again mended.
    fn finish(&mut self, b: Block) {
        let Some(fixed) = mend_block(&b.fragment) else {
            return self.out.extend_from_slice(&b.raw);
        };
        let first = (FRAME_MAX - b.prefix.len()).min(fixed.len());
        let (head, mut rest) = fixed.split_at(first);
        let mut payload = b.prefix.clone();
        payload.extend_from_slice(head);
        let end = if rest.is_empty() { END_HEADERS } else { 0 };
        frame_head(&mut self.out, payload.len(), b.typ, b.flags | end, b.sid);
        self.out.extend_from_slice(&payload);
        while !rest.is_empty() {
            let n = rest.len().min(FRAME_MAX);
            let (piece, after) = rest.split_at(n);
            let end = if after.is_empty() { END_HEADERS } else { 0 };
            frame_head(&mut self.out, n, CONTINUATION, end, b.sid);
            self.out.extend_from_slice(piece);
            rest = after;
        }
    }
}

fn frame_head(out: &mut Vec<u8>, len: usize, typ: u8, flags: u8, sid: u32) {
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, typ, flags]);
    out.extend_from_slice(&sid.to_be_bytes());
}

/// An HPACK integer with an `n`-bit prefix at the start of `b`: its
/// value and length. None: cut short or absurdly long.
fn integer(b: &[u8], n: u32) -> Option<(usize, usize)> {
    let mask = (1usize << n) - 1;
    let mut v = usize::from(*b.first()?) & mask;
    if v < mask {
        return Some((v, 1));
    }
    let mut shift = 0;
    for (j, &x) in b.iter().enumerate().skip(1).take(4) {
        v += usize::from(x & 0x7f) << shift;
        shift += 7;
        if x & 0x80 == 0 {
            return Some((v, j + 1));
        }
    }
    None
}

/// A string length with the Huffman bit, as HPACK writes it.
fn huffman_len(out: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        out.push(0x80 | n as u8);
        return;
    }
    out.push(0xff);
    n -= 127;
    while n >= 128 {
        out.push((n & 0x7f) as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// The block with its over-padded Huffman strings cut; None when it has
/// none (or cannot be read: the h2 client says why).
pub fn mend_block(f: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    // What of `f` is in `out` already.
    let mut copied = 0;
    let mut i = 0;
    while i < f.len() {
        let b = f[i];
        let (prefix, literal) = match b {
            _ if b & 0x80 != 0 => (7, false),
            _ if b & 0x40 != 0 => (6, true),
            _ if b & 0x20 != 0 => (5, false),
            _ => (4, true),
        };
        let (index, n) = integer(&f[i..], prefix)?;
        i += n;
        if !literal {
            continue;
        }
        let strings = if index == 0 { 2 } else { 1 };
        for _ in 0..strings {
            let huff = *f.get(i)? & 0x80 != 0;
            let (len, n) = integer(&f[i..], 7)?;
            let data = f.get(i + n..i + n + len)?;
            if let Some(keep) = huff.then(|| overpadded(data)).flatten() {
                let o = out.get_or_insert_with(|| Vec::with_capacity(f.len()));
                o.extend_from_slice(&f[copied..i]);
                huffman_len(o, keep);
                o.extend_from_slice(&data[..keep]);
                copied = i + n + len;
            }
            i += n + len;
        }
    }
    let mut o = out?;
    o.extend_from_slice(&f[copied..]);
    Some(o)
}

/// How many codes of each length (0..=30 bits) the HPACK Huffman code
/// has (RFC 7541, Appendix B; the code is canonical, so these give it).
const COUNT: [u32; 31] = [
    0, 0, 0, 0, 0, 10, 26, 32, 6, 0, 5, 3, 2, 6, 2, 3, 0, 0, 0, 3, 8, 13, 26, 29, 12, 4, 15, 19,
    29, 0, 4,
];

/// The first code of each length in the canonical order.
const FIRST: [u32; 31] = {
    let mut f = [0u32; 31];
    let mut l = 1;
    while l < 31 {
        f[l] = (f[l - 1] + COUNT[l - 1]) << 1;
        l += 1;
    }
    f
};

/// For a Huffman string whose padding is 8 to 29 bits of ones (which
/// nginx decodes and RFC 7541 calls an error): the length that keeps
/// every symbol and at most 7 bits of padding. None for any other.
fn overpadded(data: &[u8]) -> Option<usize> {
    // 8 or more bits of padding end in a whole byte of ones.
    if data.last() != Some(&0xff) {
        return None;
    }
    let total = data.len() * 8;
    // The last 0 bit: every symbol but EOS has one, so the symbols end
    // at the first boundary past it (or at 0 when there is none).
    let last_zero = data
        .iter()
        .rposition(|&b| b != 0xff)
        .map(|i| i * 8 + 7 - data[i].trailing_ones() as usize);
    let mut end = 0;
    if let Some(z) = last_zero {
        let (mut code, mut len) = (0u32, 0usize);
        let mut bit = 0;
        while end <= z {
            if bit >= total {
                return None;
            }
            code = code << 1 | u32::from(data[bit / 8] >> (7 - bit % 8) & 1);
            len += 1;
            bit += 1;
            if len > 30 {
                return None;
            }
            if code < FIRST[len] + COUNT[len] {
                end = bit;
                code = 0;
                len = 0;
            }
        }
    }
    let padding = total - end;
    (8..30).contains(&padding).then(|| end.div_ceil(8))
}

impl<T: AsyncRead + Unpin> AsyncRead for Mend<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if me.out_at < me.out.len() {
                let n = (me.out.len() - me.out_at).min(buf.remaining());
                buf.put_slice(&me.out[me.out_at..me.out_at + n]);
                me.out_at += n;
                if me.out_at == me.out.len() {
                    me.out.clear();
                    me.out_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if me.step() {
                continue;
            }
            if me.eof {
                // A frame cut short: what there is goes as it is (the h2
                // client sees the connection end mid-frame).
                if !me.inb.is_empty() || me.block.is_some() {
                    me.flush_block();
                    me.out.append(&mut me.inb);
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            let mut tmp = [0u8; 16 * 1024];
            let mut rb = ReadBuf::new(&mut tmp);
            match Pin::new(&mut me.io).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    me.going.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        me.eof = true;
                        me.going.store(true, Ordering::Relaxed);
                    } else {
                        me.inb.extend_from_slice(rb.filled());
                    }
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Mend<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nginx-tests' encoder: the codes, then a whole byte more of ones
    /// when they fill their last byte (`huff` in Test::Nginx::HTTP2).
    fn overpad(bits: &str) -> Vec<u8> {
        let mut s = bits.to_string();
        let pad = 8 - s.len() % 8;
        s.push_str(&"1".repeat(pad));
        s.as_bytes()
            .chunks(8)
            .map(|c| u8::from_str_radix(std::str::from_utf8(c).unwrap(), 2).unwrap())
            .collect()
    }

    #[test]
    fn cuts_whole_bytes_of_padding() {
        // "" padded with a byte of ones.
        assert_eq!(overpadded(&[0xff]), Some(0));
        // '0' (00000), '1' (00001), '2' (00010): 15 bits, 1 of padding.
        assert_eq!(overpadded(&overpad("000000000100010")), None);
        // "00" = 10 bits: 6 of padding, fine.
        assert_eq!(overpadded(&overpad("0000000000")), None);
        // 'a' 'a' 'a' 'a' 'a' 'a' 'a' 'a' (00011 x 8) = 40 bits: a byte more.
        let v = overpad(&"00011".repeat(8));
        assert_eq!(v.len(), 6);
        assert_eq!(overpadded(&v), Some(5));
        // A code that itself ends in ones before the padding: '?' is
        // 1111111100 (10 bits); "??..." keeps its symbols.
        let v = overpad(&"1111111100".repeat(4));
        assert_eq!(overpadded(&v), Some(5));
        // Ones that are not padding: '!' 1111111000 then 6 bits of
        // padding ending the byte... plus a legit symbol ending in 0xff
        // is impossible (no code but EOS ends the string all ones).
        assert_eq!(overpadded(&[0b1111_1110, 0b0011_1111]), None);
        // 30 or more bits of ones: EOS itself, an error as in nginx.
        assert_eq!(overpadded(&[0xff, 0xff, 0xff, 0xff]), None);
    }

    #[test]
    fn block_rewritten_only_when_needed() {
        // :status 200 (indexed), then a literal without indexing of
        // "content-type" (index 31) with an over-padded empty value.
        let block = [0x88, 0x0f, 0x10, 0x81, 0xff];
        assert_eq!(mend_block(&block), Some(vec![0x88, 0x0f, 0x10, 0x80]));
        let fine = [0x88, 0x0f, 0x10, 0x80];
        assert_eq!(mend_block(&fine), None);
        // A new name, both strings over-padded.
        let block = [0x00, 0x81, 0xff, 0x81, 0xff];
        assert_eq!(mend_block(&block), Some(vec![0x00, 0x80, 0x80]));
        // Cut short: left for the h2 client to reject.
        assert_eq!(mend_block(&[0x00, 0x85, 0xff]), None);
    }
}
