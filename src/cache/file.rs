//! The cache file format (tern-specific, not nginx's).
//!
//! ```text
//! offset  size  field
//!      0     8  magic "TERNC\0" "2\n" (format version 2)
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
//!     60     K  the key (so an md5 collision is detected, as nginx does)
//!   60+K     S  the status line as upstream sent it, after "HTTP/1.1 "
//!               (`302 Found`, `200`): a hit sends it as nginx does
//! 60+K+S     T  response headers as "Name: value\r\n" lines
//!      H     B  the body
//! ```
//!
//! A file is valid only if `H == 60 + K + S + T` and its size is exactly
//! `H + B`: a file cut short is never mistaken for a complete entry.
//!
//! Version 1 (before the status line was kept; 56 fixed bytes, no S) is
//! not read: such a file is [`ParseError::Version`], a miss that the next
//! response for its key replaces (and the loader deletes at start-up), as
//! nginx treats a cache file of another version.

use std::io::Read;
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"TERNC\x002\n";
pub const FIXED: usize = 60;

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

    /// Offset of the body (the header's length).
    pub fn header_len(&self) -> usize {
        FIXED + self.key.len() + self.status_line.len() + self.headers_text().len()
    }

    pub fn encode(&self) -> Vec<u8> {
        let text = self.headers_text();
        let hlen = FIXED + self.key.len() + self.status_line.len() + text.len();
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
        b.extend_from_slice(&self.key);
        b.extend_from_slice(&self.status_line);
        b.extend_from_slice(&text);
        b
    }

    /// Parses a header from the start of a file.
    pub fn parse(b: &[u8]) -> Result<EntryHead, ParseError> {
        // The magic is looked at first, so a file of another version
        // (shorter fixed part) is never read with this one's offsets.
        if b.len() >= 8 && &b[..8] != MAGIC {
            return Err(if b[..6] == MAGIC[..6] {
                ParseError::Version
            } else {
                ParseError::Bad
            });
        }
        if b.len() < FIXED {
            return Err(ParseError::Need(FIXED));
        }
        let bad = ParseError::Bad;
        let hlen = u32_at(b, 8).ok_or(ParseError::Bad)? as usize;
        let klen = u32_at(b, 48).ok_or(ParseError::Bad)? as usize;
        let tlen = u32_at(b, 52).ok_or(ParseError::Bad)? as usize;
        let slen = u32_at(b, 56).ok_or(ParseError::Bad)? as usize;
        let sum = FIXED
            .checked_add(klen)
            .and_then(|x| x.checked_add(slen))
            .and_then(|x| x.checked_add(tlen));
        if sum != Some(hlen) {
            return Err(bad);
        }
        if b.len() < hlen {
            return Err(ParseError::Need(hlen));
        }
        let status = u16::from_le_bytes([b[12], b[13]]);
        let valid_until = u64_at(b, 16).ok_or(ParseError::Bad)? as i64;
        let date = u64_at(b, 24).ok_or(ParseError::Bad)? as i64;
        let lm = u64_at(b, 32).ok_or(ParseError::Bad)? as i64;
        let body_len = u64_at(b, 40).ok_or(ParseError::Bad)?;
        let key = b[FIXED..FIXED + klen].to_vec();
        let status_line = b[FIXED + klen..FIXED + klen + slen].to_vec();
        let mut headers = Vec::new();
        for line in b[FIXED + klen + slen..hlen].split(|&c| c == b'\n') {
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
        })
    }
}

/// Whether `path` is a complete entry for a key with hash `md5`: returns
/// its validity and the bytes it takes on disk. Blocking (loader thread).
pub fn check_file(path: &Path, md5: &[u8; 16]) -> Option<(i64, u64)> {
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
                if !complete || super::md5::digest(&h.key) != *md5 {
                    return None;
                }
                return Some((h.valid_until, meta.blocks() * 512));
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
        };
        let e = h.encode();
        assert_eq!(e.len(), h.header_len());
        assert_eq!(EntryHead::parse(&e), Ok(h.clone()));
        assert_eq!(EntryHead::parse(&e[..10]), Err(ParseError::Need(FIXED)));
        assert_eq!(EntryHead::parse(&e[..64]), Err(ParseError::Need(e.len())));
        let mut bad = e.clone();
        bad[0] = b'X';
        assert_eq!(EntryHead::parse(&bad), Err(ParseError::Bad));
        let mut bad = e.clone();
        bad[48] = 200; // key length no longer adds up
        assert_eq!(EntryHead::parse(&bad), Err(ParseError::Bad));
        let mut bad = e;
        bad[56] = 1; // nor does the status line's
        assert_eq!(EntryHead::parse(&bad), Err(ParseError::Bad));
        let empty = EntryHead {
            status_line: Vec::new(),
            ..h
        };
        assert_eq!(EntryHead::parse(&empty.encode()), Ok(empty));
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
