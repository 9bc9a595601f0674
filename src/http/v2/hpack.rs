//! HPACK (RFC 7541) decoding of a client's header blocks, as nginx
//! decodes them, so that tern, not the `h2` crate, judges a request's
//! fields (see [`super::guard`], which hands h2 a stand-in block).
//!
//! ```text
//!  header block fragment bytes ──▶ Decoder::decode ──▶ Block (fields in
//!    (HEADERS, CONTINUATION)        │ the order they came, pseudo-headers
//!                                   │ included, names and values as sent)
//!                                   └─ dynamic table (4096 bytes, the
//!                                      size tern announces: h2's default)
//! ```
//!
//! Decoding is incremental: the representations whose bytes are all
//! there are decoded, the rest waits for more ([`Block::need`] says how
//! many bytes the next one wants, so a long string trickling in is not
//! parsed again for every piece). Errors are nginx's, with its codes:
//! an integer longer than 4 octets, an index past the tables, a table
//! size update past the limit, a bad Huffman string are
//! COMPRESSION_ERROR; a block that ends inside a representation is
//! FRAME_SIZE_ERROR; a string longer than large_client_header_buffers'
//! size (as sent) or a list longer than number x size (decoded names and
//! values) is ENHANCE_YOUR_CALM; an empty name is PROTOCOL_ERROR.
//! Unlike the `h2` crate (and as nginx), a Huffman string padded with a
//! whole byte of EOS bits is taken.

use std::collections::VecDeque;
use std::sync::OnceLock;

use h2::Reason;

/// The dynamic table's size limit tern announces (SETTINGS_HEADER_TABLE_SIZE
/// is never sent: the default).
pub const TABLE_SIZE: usize = 4096;

/// Why a header block cannot be decoded: the GOAWAY code and the
/// error-log line (nginx's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error {
    pub reason: Reason,
    pub log: &'static str,
}

const fn err(reason: Reason, log: &'static str) -> Error {
    Error { reason, log }
}

const BAD_LENGTH: Error = err(
    Reason::FRAME_SIZE_ERROR,
    "client sent header block with incorrect length",
);
const BAD_FIELD_LENGTH: Error = err(
    Reason::FRAME_SIZE_ERROR,
    "client sent header field with incorrect length",
);
const NO_STRING: Error = err(
    Reason::COMPRESSION_ERROR,
    "client sent header block with incorrect length",
);
const BAD_INDEX: Error = err(
    Reason::COMPRESSION_ERROR,
    "client sent out of bound hpack table index",
);
const BAD_HUFFMAN: Error = err(
    Reason::COMPRESSION_ERROR,
    "client sent invalid encoded header field",
);
const BAD_SIZE_UPDATE: Error = err(
    Reason::COMPRESSION_ERROR,
    "client sent invalid table size update",
);
const LONG_INDEX: Error = err(
    Reason::COMPRESSION_ERROR,
    "client sent header block with too long header index value",
);
const LONG_SIZE_UPDATE: Error = err(
    Reason::COMPRESSION_ERROR,
    "client sent header block with too long size update value",
);
const LONG_LENGTH: Error = err(
    Reason::COMPRESSION_ERROR,
    "client sent header field with too long length value",
);
const LARGE_FIELD: Error = err(
    Reason::ENHANCE_YOUR_CALM,
    "client sent too large header field",
);
const LARGE_LIST: Error = err(Reason::ENHANCE_YOUR_CALM, "client sent too large header");
const EMPTY_NAME: Error = err(
    Reason::PROTOCOL_ERROR,
    "client sent zero header name length",
);

/// nginx's limits on a request's fields (large_client_header_buffers).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A string as sent (Huffman-coded or not): `size`.
    pub field: usize,
    /// The names and values of the list, decoded: `number` x `size`.
    pub list: usize,
}

/// The fields of one header block, in the order they came.
#[derive(Debug, Default)]
pub struct Block {
    /// Names and values back to back.
    data: Vec<u8>,
    /// Each field: where its name starts, where its value starts (the
    /// name's end), where its value ends, in `data`.
    spans: Vec<[u32; 3]>,
    /// The decoded size so far (names and values).
    size: usize,
    /// Bytes the next representation wants before it can be decoded.
    pub need: usize,
}

impl Block {
    /// The fields, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone + '_ {
        self.spans.iter().map(move |s| {
            (
                &self.data[s[0] as usize..s[1] as usize],
                &self.data[s[1] as usize..s[2] as usize],
            )
        })
    }

    /// How many fields.
    pub fn count(&self) -> usize {
        self.spans.len()
    }

    fn push(&mut self, name: &[u8], value: &[u8], lim: &Limits) -> Result<(), Error> {
        self.size += name.len() + value.len();
        if self.size > lim.list {
            return Err(LARGE_LIST);
        }
        let a = self.data.len();
        self.data.extend_from_slice(name);
        let b = self.data.len();
        self.data.extend_from_slice(value);
        let c = self.data.len();
        self.spans.push([a as u32, b as u32, c as u32]);
        Ok(())
    }
}

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// A string literal as sent: whether Huffman-coded, its bytes, and the
/// length of its representation.
type Literal<'b> = (bool, &'b [u8], usize);

/// The connection's decoding state: the dynamic table.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first.
    table: VecDeque<Entry>,
    /// RFC 7541 4.1: names, values and 32 bytes per entry.
    size: usize,
    /// The size the client chose (at most [`TABLE_SIZE`]).
    max: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max: TABLE_SIZE,
        }
    }
}

/// An integer that is not all there.
enum Int {
    /// More bytes may finish it.
    More,
    /// Longer than nginx takes (4 octets with the prefix).
    TooLong,
}

/// An HPACK integer with a `bits`-bit prefix at the start of `b` (not
/// empty): its value and length.
fn int(b: &[u8], bits: u32) -> Result<(usize, usize), Int> {
    let mask = (1usize << bits) - 1;
    let mut v = b[0] as usize & mask;
    if v < mask {
        return Ok((v, 1));
    }
    let mut shift = 0;
    for i in 1..4 {
        let Some(&o) = b.get(i) else {
            return Err(Int::More);
        };
        v += ((o & 0x7f) as usize) << shift;
        shift += 7;
        if o < 0x80 {
            return Ok((v, i + 1));
        }
    }
    Err(Int::TooLong)
}

/// A string literal at the start of `b`: whether Huffman-coded, its
/// bytes as sent, and the length of the representation. `Ok(None)`:
/// more bytes are wanted (`need` says how many in all, when known).
fn string<'b>(
    b: &'b [u8],
    ended: bool,
    lim: &Limits,
    need: &mut usize,
) -> Result<Option<Literal<'b>>, Error> {
    let Some(&first) = b.first() else {
        // nginx: FRAME_SIZE_ERROR; h2spec (hpack 4.3) wants the RFC's
        // decoding error for a block that ends where a string begins.
        return if ended { Err(NO_STRING) } else { Ok(None) };
    };
    let (len, n) = match int(b, 7) {
        Ok(v) => v,
        Err(Int::TooLong) => return Err(LONG_LENGTH),
        Err(Int::More) => return if ended { Err(BAD_LENGTH) } else { Ok(None) },
    };
    if len > lim.field {
        return Err(LARGE_FIELD);
    }
    if b.len() < n + len {
        *need = n + len;
        return if ended {
            Err(BAD_FIELD_LENGTH)
        } else {
            Ok(None)
        };
    }
    Ok(Some((first & 0x80 != 0, &b[n..n + len], n + len)))
}

impl Decoder {
    /// Decodes the representations whose bytes are all at the start of
    /// `buf` into `block`; returns how many bytes they took. `ended`: the
    /// block has no more bytes than these (what is left is an error).
    pub fn decode(
        &mut self,
        buf: &[u8],
        ended: bool,
        block: &mut Block,
        lim: &Limits,
    ) -> Result<usize, Error> {
        let mut p = 0;
        block.need = 0;
        let mut scratch = Vec::new();
        while p < buf.len() {
            let b = &buf[p..];
            let first = b[0];
            let (bits, long) = match first {
                0x80..=0xff => (7, LONG_INDEX),
                0x40..=0x7f => (6, LONG_INDEX),
                0x20..=0x3f => (5, LONG_SIZE_UPDATE),
                _ => (4, LONG_INDEX),
            };
            let (v, n) = match int(b, bits) {
                Ok(v) => v,
                Err(Int::TooLong) => return Err(long),
                Err(Int::More) => {
                    return if ended { Err(BAD_LENGTH) } else { Ok(p) };
                }
            };
            if first >= 0x80 {
                // Indexed field.
                let (name, value) = self.get(v).ok_or(BAD_INDEX)?;
                block.push(name, value, lim)?;
                p += n;
                continue;
            }
            if bits == 5 {
                // Dynamic table size update: at a block's start only
                // (RFC 7541 4.2; nginx takes it anywhere, h2spec checks).
                if v > TABLE_SIZE || !block.spans.is_empty() {
                    return Err(BAD_SIZE_UPDATE);
                }
                self.max = v;
                self.evict(0);
                p += n;
                continue;
            }
            let mut at = n;
            let mut need = 0;
            // The name: from the tables, or a literal.
            let name: Vec<u8> = if v == 0 {
                match string(&b[at..], ended, lim, &mut need)? {
                    None => {
                        block.need = at + need;
                        return Ok(p);
                    }
                    Some((huff, s, len)) => {
                        at += len;
                        if s.is_empty() {
                            return Err(EMPTY_NAME);
                        }
                        if huff {
                            scratch.clear();
                            huff_decode(s, &mut scratch).map_err(|()| BAD_HUFFMAN)?;
                            scratch.clone()
                        } else {
                            s.to_vec()
                        }
                    }
                }
            } else {
                match self.get(v) {
                    Some((name, _)) => name.to_vec(),
                    None => return Err(BAD_INDEX),
                }
            };
            let value: Vec<u8> = match string(&b[at..], ended, lim, &mut need)? {
                None => {
                    block.need = at + need;
                    return Ok(p);
                }
                Some((huff, s, len)) => {
                    at += len;
                    if huff {
                        scratch.clear();
                        huff_decode(s, &mut scratch).map_err(|()| BAD_HUFFMAN)?;
                        std::mem::take(&mut scratch)
                    } else {
                        s.to_vec()
                    }
                }
            };
            block.push(&name, &value, lim)?;
            if bits == 6 {
                self.insert(name, value);
            }
            p += at;
        }
        Ok(p)
    }

    /// The entry at `index` (1-based, static table first).
    fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        if index == 0 {
            return None;
        }
        if index <= STATIC.len() {
            let (n, v) = STATIC[index - 1];
            return Some((n.as_bytes(), v.as_bytes()));
        }
        self.table
            .get(index - STATIC.len() - 1)
            .map(|(n, v)| (&n[..], &v[..]))
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + 32;
        if size > self.max {
            // RFC 7541 4.4: the table empties, nothing is added.
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict(size);
        self.size += size;
        self.table
            .push_front((name.into_boxed_slice(), value.into_boxed_slice()));
    }

    /// Drops the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => break,
            }
        }
    }
}

/// Decodes a Huffman-coded string (RFC 7541 5.2). The last bits must be
/// the start of EOS (all ones), at most 8 of them: nginx takes a whole
/// byte of padding, as nginx-tests' encoder sends when a string's code
/// ends on a byte (RFC 7541 says at most 7 bits; h2spec sends 12).
pub fn huff_decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), ()> {
    let t = tree();
    let mut node = 0usize;
    let mut ones = true;
    let mut depth = 0;
    for &byte in src {
        for i in (0..8).rev() {
            let bit = (byte >> i) & 1;
            let next = t[node][bit as usize];
            if next & LEAF != 0 {
                let sym = next & !LEAF;
                if sym == 256 {
                    return Err(());
                }
                out.push(sym as u8);
                node = 0;
                ones = true;
                depth = 0;
            } else if next == 0 {
                return Err(());
            } else {
                node = next as usize;
                ones &= bit == 1;
                depth += 1;
            }
        }
    }
    if node != 0 && (!ones || depth > 8) {
        return Err(());
    }
    Ok(())
}

const LEAF: u16 = 0x8000;

/// The Huffman code as a binary tree: node 0 the root, each node's two
/// children (a node index, or [`LEAF`] | symbol).
fn tree() -> &'static [[u16; 2]] {
    static TREE: OnceLock<Vec<[u16; 2]>> = OnceLock::new();
    TREE.get_or_init(|| {
        let mut t: Vec<[u16; 2]> = vec![[0, 0]];
        for (sym, &(code, len)) in HUFFMAN.iter().enumerate() {
            let mut node = 0usize;
            for i in (0..len).rev() {
                let bit = ((code >> i) & 1) as usize;
                if i == 0 {
                    t[node][bit] = LEAF | sym as u16;
                } else {
                    let next = t[node][bit];
                    if next == 0 {
                        t.push([0, 0]);
                        let n = (t.len() - 1) as u16;
                        t[node][bit] = n;
                        node = n as usize;
                    } else {
                        node = next as usize;
                    }
                }
            }
        }
        t
    })
}

/// RFC 7541 Appendix A.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// RFC 7541 Appendix B: each symbol's code (right-aligned) and its length
/// in bits; the last is EOS.
const HUFFMAN: [(u32, u8); 257] = [
    (0x1ff8, 13),
    (0x7fffd8, 23),
    (0xfffffe2, 28),
    (0xfffffe3, 28),
    (0xfffffe4, 28),
    (0xfffffe5, 28),
    (0xfffffe6, 28),
    (0xfffffe7, 28),
    (0xfffffe8, 28),
    (0xffffea, 24),
    (0x3ffffffc, 30),
    (0xfffffe9, 28),
    (0xfffffea, 28),
    (0x3ffffffd, 30),
    (0xfffffeb, 28),
    (0xfffffec, 28),
    (0xfffffed, 28),
    (0xfffffee, 28),
    (0xfffffef, 28),
    (0xffffff0, 28),
    (0xffffff1, 28),
    (0xffffff2, 28),
    (0x3ffffffe, 30),
    (0xffffff3, 28),
    (0xffffff4, 28),
    (0xffffff5, 28),
    (0xffffff6, 28),
    (0xffffff7, 28),
    (0xffffff8, 28),
    (0xffffff9, 28),
    (0xffffffa, 28),
    (0xffffffb, 28),
    (0x14, 6),
    (0x3f8, 10),
    (0x3f9, 10),
    (0xffa, 12),
    (0x1ff9, 13),
    (0x15, 6),
    (0xf8, 8),
    (0x7fa, 11),
    (0x3fa, 10),
    (0x3fb, 10),
    (0xf9, 8),
    (0x7fb, 11),
    (0xfa, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1a, 6),
    (0x1b, 6),
    (0x1c, 6),
    (0x1d, 6),
    (0x1e, 6),
    (0x1f, 6),
    (0x5c, 7),
    (0xfb, 8),
    (0x7ffc, 15),
    (0x20, 6),
    (0xffb, 12),
    (0x3fc, 10),
    (0x1ffa, 13),
    (0x21, 6),
    (0x5d, 7),
    (0x5e, 7),
    (0x5f, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6a, 7),
    (0x6b, 7),
    (0x6c, 7),
    (0x6d, 7),
    (0x6e, 7),
    (0x6f, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xfc, 8),
    (0x73, 7),
    (0xfd, 8),
    (0x1ffb, 13),
    (0x7fff0, 19),
    (0x1ffc, 13),
    (0x3ffc, 14),
    (0x22, 6),
    (0x7ffd, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2a, 6),
    (0x7, 5),
    (0x2b, 6),
    (0x76, 7),
    (0x2c, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2d, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7a, 7),
    (0x7b, 7),
    (0x7ffe, 15),
    (0x7fc, 11),
    (0x3ffd, 14),
    (0x1ffd, 13),
    (0xffffffc, 28),
    (0xfffe6, 20),
    (0x3fffd2, 22),
    (0xfffe7, 20),
    (0xfffe8, 20),
    (0x3fffd3, 22),
    (0x3fffd4, 22),
    (0x3fffd5, 22),
    (0x7fffd9, 23),
    (0x3fffd6, 22),
    (0x7fffda, 23),
    (0x7fffdb, 23),
    (0x7fffdc, 23),
    (0x7fffdd, 23),
    (0x7fffde, 23),
    (0xffffeb, 24),
    (0x7fffdf, 23),
    (0xffffec, 24),
    (0xffffed, 24),
    (0x3fffd7, 22),
    (0x7fffe0, 23),
    (0xffffee, 24),
    (0x7fffe1, 23),
    (0x7fffe2, 23),
    (0x7fffe3, 23),
    (0x7fffe4, 23),
    (0x1fffdc, 21),
    (0x3fffd8, 22),
    (0x7fffe5, 23),
    (0x3fffd9, 22),
    (0x7fffe6, 23),
    (0x7fffe7, 23),
    (0xffffef, 24),
    (0x3fffda, 22),
    (0x1fffdd, 21),
    (0xfffe9, 20),
    (0x3fffdb, 22),
    (0x3fffdc, 22),
    (0x7fffe8, 23),
    (0x7fffe9, 23),
    (0x1fffde, 21),
    (0x7fffea, 23),
    (0x3fffdd, 22),
    (0x3fffde, 22),
    (0xfffff0, 24),
    (0x1fffdf, 21),
    (0x3fffdf, 22),
    (0x7fffeb, 23),
    (0x7fffec, 23),
    (0x1fffe0, 21),
    (0x1fffe1, 21),
    (0x3fffe0, 22),
    (0x1fffe2, 21),
    (0x7fffed, 23),
    (0x3fffe1, 22),
    (0x7fffee, 23),
    (0x7fffef, 23),
    (0xfffea, 20),
    (0x3fffe2, 22),
    (0x3fffe3, 22),
    (0x3fffe4, 22),
    (0x7ffff0, 23),
    (0x3fffe5, 22),
    (0x3fffe6, 22),
    (0x7ffff1, 23),
    (0x3ffffe0, 26),
    (0x3ffffe1, 26),
    (0xfffeb, 20),
    (0x7fff1, 19),
    (0x3fffe7, 22),
    (0x7ffff2, 23),
    (0x3fffe8, 22),
    (0x1ffffec, 25),
    (0x3ffffe2, 26),
    (0x3ffffe3, 26),
    (0x3ffffe4, 26),
    (0x7ffffde, 27),
    (0x7ffffdf, 27),
    (0x3ffffe5, 26),
    (0xfffff1, 24),
    (0x1ffffed, 25),
    (0x7fff2, 19),
    (0x1fffe3, 21),
    (0x3ffffe6, 26),
    (0x7ffffe0, 27),
    (0x7ffffe1, 27),
    (0x3ffffe7, 26),
    (0x7ffffe2, 27),
    (0xfffff2, 24),
    (0x1fffe4, 21),
    (0x1fffe5, 21),
    (0x3ffffe8, 26),
    (0x3ffffe9, 26),
    (0xffffffd, 28),
    (0x7ffffe3, 27),
    (0x7ffffe4, 27),
    (0x7ffffe5, 27),
    (0xfffec, 20),
    (0xfffff3, 24),
    (0xfffed, 20),
    (0x1fffe6, 21),
    (0x3fffe9, 22),
    (0x1fffe7, 21),
    (0x1fffe8, 21),
    (0x7ffff3, 23),
    (0x3fffea, 22),
    (0x3fffeb, 22),
    (0x1ffffee, 25),
    (0x1ffffef, 25),
    (0xfffff4, 24),
    (0xfffff5, 24),
    (0x3ffffea, 26),
    (0x7ffff4, 23),
    (0x3ffffeb, 26),
    (0x7ffffe6, 27),
    (0x3ffffec, 26),
    (0x3ffffed, 26),
    (0x7ffffe7, 27),
    (0x7ffffe8, 27),
    (0x7ffffe9, 27),
    (0x7ffffea, 27),
    (0x7ffffeb, 27),
    (0xffffffe, 28),
    (0x7ffffec, 27),
    (0x7ffffed, 27),
    (0x7ffffee, 27),
    (0x7ffffef, 27),
    (0x7fffff0, 27),
    (0x3ffffee, 26),
    (0x3fffffff, 30),
];

#[cfg(test)]
mod tests {
    use super::*;

    const LIM: Limits = Limits {
        field: 8192,
        list: 32768,
    };

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn decode(d: &mut Decoder, b: &[u8]) -> Result<Vec<(String, String)>, Error> {
        let mut block = Block::default();
        let n = d.decode(b, true, &mut block, &LIM)?;
        assert_eq!(n, b.len());
        Ok(block
            .fields()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect())
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn rfc7541_c3_and_c4_requests() {
        // C.3: without Huffman coding, three requests on one table.
        let mut d = Decoder::default();
        let first = pairs(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ]);
        assert_eq!(
            decode(
                &mut d,
                &hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d")
            ),
            Ok(first.clone())
        );
        let mut second = first.clone();
        second.push(("cache-control".into(), "no-cache".into()));
        assert_eq!(
            decode(&mut d, &hex("8286 84be 5808 6e6f 2d63 6163 6865")),
            Ok(second)
        );
        // C.4: the same with Huffman coding.
        let mut d = Decoder::default();
        assert_eq!(
            decode(&mut d, &hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff")),
            Ok(first)
        );
    }

    #[test]
    fn huffman_padding_of_a_whole_byte_is_taken_as_nginx() {
        // "localhost" is 48 bits: nginx-tests pad it with 8 more ones.
        let mut out = Vec::new();
        let mut code = hex("a0e4 1d13 9d09");
        huff_decode(&code, &mut out).unwrap();
        assert_eq!(out, b"localhost");
        code.push(0xff);
        out.clear();
        huff_decode(&code, &mut out).unwrap();
        assert_eq!(out, b"localhost");
        // Padding that is not EOS's start, or EOS itself, is not.
        out.clear();
        assert!(huff_decode(&hex("a0e4 1d13 9d09 fe"), &mut out).is_err());
        assert!(huff_decode(&hex("ffff ffff"), &mut Vec::new()).is_err());
        // h2spec's: "test" in 20 bits, 12 of padding.
        assert!(huff_decode(&hex("4950 9fff"), &mut Vec::new()).is_err());
        out.clear();
        huff_decode(&hex("4950 9f"), &mut out).unwrap();
        assert_eq!(out, b"test");
    }

    #[test]
    fn errors_have_nginx_codes() {
        let mut d = Decoder::default();
        // Index past the tables, and zero.
        assert_eq!(
            decode(&mut d, &[0xbe]).unwrap_err().reason,
            Reason::COMPRESSION_ERROR
        );
        assert_eq!(
            decode(&mut d, &[0x80]).unwrap_err().reason,
            Reason::COMPRESSION_ERROR
        );
        // Table size update past 4096.
        assert_eq!(
            decode(&mut d, &hex("3fe2 1f")).unwrap_err().reason,
            Reason::COMPRESSION_ERROR
        );
        // An integer of more than 4 octets: at once, more bytes or not.
        let mut b = Block::default();
        assert_eq!(
            d.decode(&[0xff, 0xff, 0xff, 0xff], false, &mut b, &LIM)
                .unwrap_err()
                .reason,
            Reason::COMPRESSION_ERROR
        );
        // A block that ends inside an integer or a string.
        assert_eq!(
            decode(&mut d, &[0xff]).unwrap_err().reason,
            Reason::FRAME_SIZE_ERROR
        );
        assert_eq!(
            decode(&mut d, &[0x42, 0x05, b'a']).unwrap_err().reason,
            Reason::FRAME_SIZE_ERROR
        );
        // A string past the field limit, a list past the list limit.
        let lim = Limits { field: 4, list: 7 };
        let mut b = Block::default();
        let e = d.decode(&[0x00, 0x05], false, &mut b, &lim).unwrap_err();
        assert_eq!(e.reason, Reason::ENHANCE_YOUR_CALM);
        let mut b = Block::default();
        let e = d
            .decode(&hex("0004 6161 6161 0461 6161 61"), true, &mut b, &lim)
            .unwrap_err();
        assert_eq!(e, LARGE_LIST);
        // A size update after a field; a block that ends where a string
        // begins (h2spec's hpack 4.3).
        assert_eq!(decode(&mut d, &[0x82, 0x20]).unwrap_err(), BAD_SIZE_UPDATE);
        assert_eq!(decode(&mut d, &[0x40]).unwrap_err(), NO_STRING);
        // An empty name.
        assert_eq!(decode(&mut d, &[0x00, 0x00, 0x00]).unwrap_err(), EMPTY_NAME);
    }

    #[test]
    fn incremental_decoding_waits_for_whole_representations() {
        let mut d = Decoder::default();
        let all = hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d");
        let mut b = Block::default();
        let n = d.decode(&all[..6], false, &mut b, &LIM).unwrap();
        assert_eq!(n, 3);
        assert_eq!(b.need, 17);
        let m = d.decode(&all[n..], false, &mut b, &LIM).unwrap();
        assert_eq!(n + m, all.len());
        assert_eq!(b.count(), 4);
        // The table entry is there for the next block.
        assert_eq!(
            decode(&mut d, &[0xbe]).unwrap(),
            pairs(&[(":authority", "www.example.com")])
        );
    }
}
