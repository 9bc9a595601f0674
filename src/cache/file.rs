//! The cache file format (tern-specific, not nginx's).
//!
//! ```text
//! offset  size  field
//!      0     8  magic "TERNC\0" "3\n" (format version 3)
//!      8     4  header length H (u32 LE): the body starts at offset H
//!     12     2  status (u16 LE)
//!     14     2  reserved (0)
//!     16     8  valid until, unix seconds (i64 LE)
//!     24     8  stored at, unix seconds (i64 LE)
//!     32     8  Last-Modified, unix seconds, -1 if none (i64 LE)
//!     40     8  body length B (u64 LE)
//!     48     4  key length K (u32 LE)
//!     52     4  headers length T (u32 LE)
//!     56     4  status line length S (u32 LE)
//!     60     4  stale-while-revalidate seconds past "valid until" (u32 LE)
//!     64     4  stale-if-error seconds past "valid until" (u32 LE)
//!     68     4  Vary length V (u32 LE)
//!     72    16  variant: the hash of the Vary'd request headers this
//!               response was stored for (zero without Vary)
//!     88     K  the key (so an md5 collision is detected, as nginx does)
//!   88+K     S  the status line as upstream sent it, after "HTTP/1.1 "
//!               (`302 Found`, `200`): a hit sends it as nginx does
//! 88+K+S     V  the response's Vary header names, as sent (comma-joined)
//! ...+V      T  response headers as "Name: value\r\n" lines
//!      H     B  the body
//! ```
//!
//! A file is valid only if `H == 88 + K + S + V + T` and its size is
//! exactly `H + B`: a file cut short is never mistaken for a complete entry.
//!
//! An entry whose response had `Vary` (nginx's secondary keys): the first
//! variant of a key lives under the key's own md5, with the Vary names and
//! its variant hash; a request whose Vary'd headers hash differently looks
//! under the md5 named by its own variant hash (see
//! `http::upstream::cache`). So a file's name is the md5 of its key or,
//! for such a secondary entry, its variant.
//!
//! Version 2 (before the stale extensions and Vary: 60 fixed bytes, the
//! fields at 60..88 absent, V = 0) is read as such: its entries had no
//! Vary and no extensions, so an upgrade keeps the cache. Version 1
//! (before the status line was kept; 56 fixed bytes, no S) is not read:
//! such a file is [`ParseError::Version`], a miss that the next response
//! for its key replaces (and the loader deletes at start-up), as nginx
//! treats a cache file of another version.

use std::io::Read;
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"TERNC\x003\n";
pub const FIXED: usize = 88;
/// Version 2's magic and fixed part (still read).
const MAGIC_2: &[u8; 8] = b"TERNC\x002\n";
const FIXED_2: usize = 60;
/// Where the stale extensions sit (rewritten with the validity by a
/// revalidation).
pub const EXT_AT: u64 = 60;

/// The header of a cache file: everything but the body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EntryHead {
    pub status: u16,
    pub valid_until: i64,
    pub date: i64,
    pub last_modified: Option<i64>,
    pub body_len: u64,
    pub key: Vec<u8>,
    /// The status line after `HTTP/1.1 ` as upstream sent it; empty when
    /// there was none to keep (the line is then tern's own for `status`).
    pub status_line: Vec<u8>,
    /// Response headers as relayed to the client (Content-Type included).
    pub headers: Vec<(String, Vec<u8>)>,
    /// `Cache-Control: stale-while-revalidate=N` (seconds past validity).
    pub updating_secs: u32,
    /// `Cache-Control: stale-if-error=N` (seconds past validity).
    pub error_secs: u32,
    /// The response's Vary header names (empty: no Vary).
    pub vary: Vec<u8>,
    /// The hash of the request headers Vary names, for the request this
    /// entry was stored for.
    pub variant: [u8; 16],
    /// Read from a version 2 file (60 fixed bytes): its header is that
    /// long, and has no room for the extensions.
    pub legacy: bool,
}

/// Why a header could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    /// The buffer holds only part of the header: read this many bytes.
    Need(usize),
    /// Not a (complete, current-format) cache file.
    Bad,
    /// A tern cache file of another format version.
    Version,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl EntryHead {
    fn headers_text(&self) -> Vec<u8> {
        let mut t = Vec::new();
        for (n, v) in &self.headers {
            t.extend_from_slice(n.as_bytes());
            t.extend_from_slice(b": ");
            t.extend_from_slice(v);
            t.extend_from_slice(b"\r\n");
        }
        t
    }

    /// Bytes 16..32 of a header: validity and store time, which a
    /// revalidation (`proxy_cache_revalidate`) rewrites in place.
    pub fn times(valid_until: i64, date: i64) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&valid_until.to_le_bytes());
        b[8..].copy_from_slice(&date.to_le_bytes());
        b
    }

    /// Bytes 60..68 of a header: the stale extensions, which a
    /// revalidation rewrites in place too.
    pub fn exts(updating_secs: u32, error_secs: u32) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&updating_secs.to_le_bytes());
        b[4..].copy_from_slice(&error_secs.to_le_bytes());
        b
    }

    /// Offset of the body (the header's length).
    pub fn header_len(&self) -> usize {
        (if self.legacy { FIXED_2 } else { FIXED })
            + self.key.len()
            + self.status_line.len()
            + self.vary.len()
            + self.headers_text().len()
    }

    pub fn encode(&self) -> Vec<u8> {
        let text = self.headers_text();
        let hlen = FIXED + self.key.len() + self.status_line.len() + self.vary.len() + text.len();
        let mut b = Vec::with_capacity(hlen);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&(hlen as u32).to_le_bytes());
        b.extend_from_slice(&self.status.to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.valid_until.to_le_bytes());
        b.extend_from_slice(&self.date.to_le_bytes());
        b.extend_from_slice(&self.last_modified.unwrap_or(-1).to_le_bytes());
        b.extend_from_slice(&self.body_len.to_le_bytes());
        b.extend_from_slice(&(self.key.len() as u32).to_le_bytes());
        b.extend_from_slice(&(text.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.status_line.len() as u32).to_le_bytes());
        b.extend_from_slice(&Self::exts(self.updating_secs, self.error_secs));
        b.extend_from_slice(&(self.vary.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.variant);
        b.extend_from_slice(&self.key);
        b.extend_from_slice(&self.status_line);
        b.extend_from_slice(&self.vary);
        b.extend_from_slice(&text);
        b
    }

    /// Parses a header from the start of a file.
    pub fn parse(b: &[u8]) -> Result<EntryHead, ParseError> {
        // The magic is looked at first, so a file of another version
        // (shorter fixed part) is never read with this one's offsets.
        let fixed = if b.len() < 8 || &b[..8] == MAGIC {
            FIXED
        } else if &b[..8] == MAGIC_2 {
            FIXED_2
        } else if b[..6] == MAGIC[..6] {
            return Err(ParseError::Version);
        } else {
            return Err(ParseError::Bad);
        };
        if b.len() < fixed {
            return Err(ParseError::Need(fixed));
        }
        let bad = || ParseError::Bad;
        let hlen = u32_at(b, 8).ok_or_else(bad)? as usize;
        let klen = u32_at(b, 48).ok_or_else(bad)? as usize;
        let tlen = u32_at(b, 52).ok_or_else(bad)? as usize;
        let slen = u32_at(b, 56).ok_or_else(bad)? as usize;
        let (updating_secs, error_secs, vlen, variant) = if fixed == FIXED {
            let mut v = [0u8; 16];
            v.copy_from_slice(&b[72..88]);
            (
                u32_at(b, 60).ok_or_else(bad)?,
                u32_at(b, 64).ok_or_else(bad)?,
                u32_at(b, 68).ok_or_else(bad)? as usize,
                v,
            )
        } else {
            (0, 0, 0, [0u8; 16])
        };
        let sum = fixed
            .checked_add(klen)
            .and_then(|x| x.checked_add(slen))
            .and_then(|x| x.checked_add(vlen))
            .and_then(|x| x.checked_add(tlen));
        if sum != Some(hlen) {
            return Err(ParseError::Bad);
        }
        if b.len() < hlen {
            return Err(ParseError::Need(hlen));
        }
        let status = u16::from_le_bytes([b[12], b[13]]);
        let valid_until = u64_at(b, 16).ok_or_else(bad)? as i64;
        let date = u64_at(b, 24).ok_or_else(bad)? as i64;
        let lm = u64_at(b, 32).ok_or_else(bad)? as i64;
        let body_len = u64_at(b, 40).ok_or_else(bad)?;
        let mut at = fixed;
        let key = b[at..at + klen].to_vec();
        at += klen;
        let status_line = b[at..at + slen].to_vec();
        at += slen;
        let vary = b[at..at + vlen].to_vec();
        at += vlen;
        let mut headers = Vec::new();
        for line in b[at..hlen].split(|&c| c == b'\n') {
            let line = match line.strip_suffix(b"\r") {
                Some(l) => l,
                None if line.is_empty() => continue,
                None => return Err(ParseError::Bad),
            };
            let colon = memchr::memchr(b':', line).ok_or(ParseError::Bad)?;
            let name = std::str::from_utf8(&line[..colon]).map_err(|_| ParseError::Bad)?;
            let value = line[colon + 1..]
                .strip_prefix(b" ")
                .unwrap_or(&line[colon + 1..]);
            headers.push((name.to_string(), value.to_vec()));
        }
        Ok(EntryHead {
            status,
            valid_until,
            date,
            last_modified: (lm >= 0).then_some(lm),
            body_len,
            key,
            status_line,
            headers,
            updating_secs,
            error_secs,
            vary,
            variant,
            legacy: fixed == FIXED_2,
        })
    }

    /// Whether the file holding this header may be named `md5`: the hash
    /// of its key, or, for a secondary (Vary) entry, its variant.
    pub fn named_by(&self, md5: &[u8; 16]) -> bool {
        super::md5::digest(&self.key) == *md5 || (!self.vary.is_empty() && self.variant == *md5)
    }
}

/// Whether `path` is a complete entry for a key with hash `md5`: returns
/// its validity, the bytes it takes on disk and, for a Vary variant named
/// by its variant hash, the hash of its key. Blocking (loader thread).
pub fn check_file(path: &Path, md5: &[u8; 16]) -> Option<(i64, u64, Option<[u8; 16]>)> {
    use std::os::unix::fs::MetadataExt;
    let mut f = std::fs::File::open(path).ok()?;
    let meta = f.metadata().ok()?;
    let mut buf = vec![0u8; 4096];
    let mut have = 0;
    loop {
        let n = f.read(&mut buf[have..]).ok()?;
        have += n;
        match EntryHead::parse(&buf[..have]) {
            Ok(h) => {
                let complete = (h.header_len() as u64).checked_add(h.body_len) == Some(meta.len());
                if !complete || !h.named_by(md5) {
                    return None;
                }
                let main = super::md5::digest(&h.key);
                let variant_of = (main != *md5).then_some(main);
                return Some((h.valid_until, meta.blocks() * 512, variant_of));
            }
            Err(ParseError::Need(n2)) if n > 0 || have >= n2 => {
                if buf.len() < n2 {
                    buf.resize(n2, 0);
                }
            }
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let h = EntryHead {
            status: 200,
            valid_until: 1234,
            date: 1000,
            last_modified: Some(99),
            body_len: 5,
            key: b"/k".to_vec(),
            status_line: b"200 Fine: \r\n".to_vec(),
            headers: vec![
                ("Content-Type".into(), b"text/plain".to_vec()),
                ("X-A".into(), b"b: c".to_vec()),
            ],
            updating_secs: 7,
            error_secs: u32::MAX,
            vary: b"Accept-Encoding, Foo".to_vec(),
            variant: [9; 16],
            legacy: false,
        };
        let e = h.encode();
        assert_eq!(e.len(), h.header_len());
        assert_eq!(EntryHead::parse(&e), Ok(h.clone()));
        assert_eq!(EntryHead::parse(&e[..10]), Err(ParseError::Need(FIXED)));
        assert_eq!(EntryHead::parse(&e[..90]), Err(ParseError::Need(e.len())));
        let mut bad = e.clone();
        bad[0] = b'X';
        assert_eq!(EntryHead::parse(&bad), Err(ParseError::Bad));
        let mut bad = e.clone();
        bad[48] = 200; // key length no longer adds up
        assert_eq!(EntryHead::parse(&bad), Err(ParseError::Bad));
        let mut bad = e.clone();
        bad[56] = 1; // nor does the status line's
        assert_eq!(EntryHead::parse(&bad), Err(ParseError::Bad));
        let mut bad = e;
        bad[68] = 1; // nor does Vary's
        assert_eq!(EntryHead::parse(&bad), Err(ParseError::Bad));
        let empty = EntryHead {
            status_line: Vec::new(),
            ..h
        };
        assert_eq!(EntryHead::parse(&empty.encode()), Ok(empty));
    }

    /// A version-2 file (60 fixed bytes, no extensions, no Vary) is read
    /// as what it is: an entry without either.
    #[test]
    fn version_2_is_read() {
        let mut v2 = MAGIC_2.to_vec();
        let (key, line, text) = (&b"/k"[..], &b"200 OK"[..], &b"X-A: b\r\n"[..]);
        let hlen = FIXED_2 + key.len() + line.len() + text.len();
        v2.extend_from_slice(&(hlen as u32).to_le_bytes());
        v2.extend_from_slice(&200u16.to_le_bytes());
        v2.extend_from_slice(&[0, 0]);
        v2.extend_from_slice(&50i64.to_le_bytes());
        v2.extend_from_slice(&40i64.to_le_bytes());
        v2.extend_from_slice(&(-1i64).to_le_bytes());
        v2.extend_from_slice(&4u64.to_le_bytes());
        for n in [key.len(), text.len(), line.len()] {
            v2.extend_from_slice(&(n as u32).to_le_bytes());
        }
        v2.extend_from_slice(key);
        v2.extend_from_slice(line);
        v2.extend_from_slice(text);
        let h = EntryHead::parse(&v2).unwrap();
        assert_eq!(h.header_len(), hlen);
        assert!(h.legacy && h.vary.is_empty() && h.updating_secs == 0);
        assert_eq!((h.valid_until, h.body_len), (50, 4));
        assert_eq!(h.headers, vec![("X-A".to_string(), b"b".to_vec())]);
        assert!(h.named_by(&super::super::md5::digest(b"/k")));
    }

    /// A version-1 file (56 fixed bytes, no status line) is refused as
    /// such, however long, never read with version 2's offsets.
    #[test]
    fn version_1_is_refused() {
        let mut v1 = b"TERNC\x001\n".to_vec();
        v1.extend_from_slice(&[0u8; 48]);
        v1.extend_from_slice(b"/k200 OK\r\nbody");
        for n in [8, 20, 56, v1.len()] {
            assert_eq!(EntryHead::parse(&v1[..n]), Err(ParseError::Version));
        }
        assert_eq!(EntryHead::parse(b"TERN"), Err(ParseError::Need(FIXED)));
    }
}
