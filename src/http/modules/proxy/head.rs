//! The head of a proxied server's response, read as nginx 1.22 reads it.
//!
//! [`parse`] looks at the bytes received so far (the proxy's read loop
//! calls it again after each read until it is not [`Parse::Partial`]):
//!
//! ```text
//!  "HTTP/" major "." minor SP+ 3DIGIT ( (SP | ".") text )? CRLF   -> code, version, status line
//!  ( name [":" SP* value SP*] CRLF )*                              -> headers, in order
//!  CRLF                                                            -> Done(end of the head)
//! ```
//!
//! This is more lenient than a request head, as nginx's upstream side is:
//! any major version from 1 to 999 and minor up to 999, any three-digit
//! code, any reason text (kept verbatim: nginx relays the status line as
//! it came), bare LF line ends, header names of any bytes but controls,
//! space, DEL and ':' (so `X@Y` or `X/Y` pass), a line without a colon
//! (a header with an empty value), values with control bytes other than
//! NUL, CR and LF (tabs are kept; only spaces are trimmed), and a repeated
//! `HTTP/...` line among the headers (sent by IIS) skipped. What nginx
//! refuses is [`Parse::Invalid`], with nginx's log text showing the line
//! up to the offending byte. A first line that is not a status line is
//! [`Parse::NotHttp`] (nginx would pass such an answer on raw as
//! HTTP/0.9; tern answers 502, see DIFFERENCES.md).
//!
//! Names are kept as text: a name that is not UTF-8 (a Latin-1 byte, say)
//! is left out, as tern's headers are strings.
//!
//! [`HttpHead`] is proxy's head reader for the engine (interim 1xx
//! answers dropped), [`HttpBody`] its body decoder: chunked, a
//! Content-Length, or the connection's close.

use crate::http::upstream::fetch::{fail, invalid_header, Fail, WHILE_HEAD};
use crate::http::upstream::response::{has_token, header};
use crate::http::upstream::{BodyDecoder, Head as UpHead, HeadReader};

/// Reads an HTTP/1.x response head as it arrives.
pub struct HttpHead {
    buf: Vec<u8>,
    head_only: bool,
    head_max: usize,
}

impl HttpHead {
    pub fn new(head_only: bool, head_max: usize) -> HttpHead {
        HttpHead {
            buf: Vec::new(),
            head_only,
            head_max,
        }
    }
}

impl HeadReader for HttpHead {
    fn feed(&mut self, data: &[u8]) -> Result<Option<UpHead>, Fail> {
        self.buf.extend_from_slice(data);
        loop {
            // The head must fit proxy_buffer_size.
            let window = &self.buf[..self.buf.len().min(self.head_max)];
            match parse(window) {
                Parse::Partial if self.buf.len() >= self.head_max => {
                    return Err(invalid_header(&format!(
                        "upstream sent too big header {}",
                        WHILE_HEAD
                    )))
                }
                Parse::Partial => return Ok(None),
                Parse::Done(h) => {
                    if (100..200).contains(&h.code) && h.code != 101 {
                        // An interim response: drop it and read the real
                        // one. (nginx 1.22 relays it as the final answer,
                        // its body unframed: see DIFFERENCES.md.)
                        self.buf.drain(..h.end);
                        if self.buf.is_empty() {
                            return Ok(None);
                        }
                        continue;
                    }
                    return Ok(Some(self.head(h)));
                }
                Parse::NotHttp => {
                    return Err(invalid_header(&format!(
                        "upstream sent no valid HTTP/1.0 header {}",
                        WHILE_HEAD
                    )))
                }
                Parse::Invalid(msg) => return Err(invalid_header(&msg)),
            }
        }
    }
}

impl HttpHead {
    fn head(&mut self, h: Head) -> UpHead {
        // (A chunked answer to HEAD announces no length, as nginx.)
        let chunked = h
            .headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && mentions_chunked(v));
        let declared_len = content_length(&h.headers).filter(|_| !chunked);
        let no_body = self.head_only || h.code == 204 || h.code == 304;
        // nginx never reuses an HTTP/1.0 connection, whatever its
        // Connection header says, nor one that answered 101.
        let keep = !(header(&h.headers, "connection").is_some_and(|v| has_token(v, "close"))
            || !h.http11
            || h.code == 101);
        let decoder = HttpBody::of(no_body, &h.headers);
        UpHead {
            status: h.code,
            status_line: h.line,
            early: self.buf[h.end..].to_vec(),
            body: Vec::new(),
            headers: h.headers,
            declared_len,
            no_body,
            keep,
            decoder: Box::new(decoder),
        }
    }
}

/// The body length upstream declared, as nginx 1.22 reads it: the last
/// `Content-Length` header, digits only; anything else (`+3`, `3, 3`,
/// empty, too big) counts as none, so the body ends with the connection.
pub fn content_length(hs: &[(String, Vec<u8>)]) -> Option<u64> {
    let (_, v) = hs
        .iter()
        .rev()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))?;
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Digits only, so only an overflow (past nginx's off_t) fails here.
    let n: i64 = std::str::from_utf8(v).ok()?.parse().ok()?;
    u64::try_from(n).ok()
}

/// nginx's test of a Transfer-Encoding value: "chunked" anywhere in it.
fn mentions_chunked(v: &[u8]) -> bool {
    v.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked"))
}

/// How the upstream body ends: chunked, a length, or the connection's close.
pub struct HttpBody {
    dec: Option<crate::http::chunked::ChunkedDecoder>,
    /// Bytes still expected with a Content-Length.
    left: Option<u64>,
    /// Bytes after the body's end arrived (the connection cannot be reused).
    extra: bool,
}

impl HttpBody {
    fn of(no_body: bool, headers: &[(String, Vec<u8>)]) -> HttpBody {
        if no_body {
            return HttpBody {
                dec: None,
                left: Some(0),
                extra: false,
            };
        }
        // nginx 1.22 decodes a chunked body whatever the version, when
        // Transfer-Encoding mentions "chunked" anywhere; a Content-Length
        // then does not count, and one it cannot read means none.
        let chunked = headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && mentions_chunked(v));
        let length = if chunked {
            None
        } else {
            content_length(headers)
        };
        HttpBody {
            dec: chunked.then(crate::http::chunked::ChunkedDecoder::new),
            left: length,
            extra: false,
        }
    }
}

impl BodyDecoder for HttpBody {
    fn feed(&mut self, buf: &[u8], out: &mut Vec<u8>) -> Result<(), Fail> {
        if let Some(d) = self.dec.as_mut() {
            let used = d.decode(buf, out).map_err(|_| {
                fail(
                    502,
                    "upstream sent invalid chunked response while reading upstream",
                    false,
                )
            })?;
            self.extra |= used < buf.len() && d.is_done();
        } else if let Some(l) = self.left.as_mut() {
            let take = (*l).min(buf.len() as u64) as usize;
            self.extra |= take < buf.len();
            *l -= take as u64;
            out.extend_from_slice(&buf[..take]);
        } else {
            out.extend_from_slice(buf);
        }
        Ok(())
    }

    fn done(&self) -> bool {
        match (&self.dec, self.left) {
            (Some(d), _) => d.is_done(),
            (None, Some(l)) => l == 0,
            (None, None) => false,
        }
    }

    fn extra(&self) -> bool {
        self.extra
    }

    fn extra_warning(&self) -> Option<&'static str> {
        if !self.extra {
            return None;
        }
        Some(match self.dec {
            Some(_) => "upstream sent data after final chunk",
            None => "upstream sent more data than specified in \"Content-Length\" header",
        })
    }

    fn by_close(&self) -> bool {
        self.dec.is_none() && self.left.is_none()
    }
}

/// A complete response head.
pub(crate) struct Head {
    pub(crate) code: u16,
    /// HTTP/1.1 or later: the connection stays open by default.
    pub(crate) http11: bool,
    /// The status line after the version, as sent: `302 Found`, `200`.
    pub(crate) line: Vec<u8>,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    /// Where the body starts.
    pub(crate) end: usize,
}

pub(crate) enum Parse {
    /// More bytes are needed.
    Partial,
    Done(Head),
    /// The first line is no HTTP/1.x status line.
    NotHttp,
    /// A header line nginx refuses; the text for the error log.
    Invalid(String),
}

pub(crate) fn parse(buf: &[u8]) -> Parse {
    let (code, http11, line, mut at) = match status_line(buf) {
        Ok(Some(s)) => s,
        Ok(None) => return Parse::Partial,
        Err(()) => return Parse::NotHttp,
    };
    let mut headers = Vec::new();
    loop {
        match header_line(buf, at) {
            Line::Partial => return Parse::Partial,
            Line::End(end) => {
                return Parse::Done(Head {
                    code,
                    http11,
                    line: line.to_vec(),
                    headers,
                    end,
                })
            }
            Line::Skip(next) => at = next,
            Line::Header(name, value, next) => {
                if let Ok(n) = std::str::from_utf8(name) {
                    headers.push((n.to_string(), value.to_vec()));
                }
                at = next;
            }
            Line::Bad(bad) => return Parse::Invalid(invalid_text(&buf[at..], bad - at)),
        }
    }
}

/// nginx's `upstream sent invalid header: "PREFIX\xHH..."`: the line up to
/// the offending byte, then that byte in hex.
fn invalid_text(line: &[u8], bad: usize) -> String {
    format!(
        "upstream sent invalid header: \"{}\\x{:02x}...\" while reading response header from upstream",
        String::from_utf8_lossy(&line[..bad]),
        line.get(bad).copied().unwrap_or(0)
    )
}

type StatusLine<'b> = (u16, bool, &'b [u8], usize);

/// The status line: `Ok(None)` while it may still become one.
fn status_line(b: &[u8]) -> Result<Option<StatusLine<'_>>, ()> {
    let mut i = 0;
    // Reads the byte at `i`, or stops with "need more".
    macro_rules! next {
        () => {
            match b.get(i) {
                Some(&c) => c,
                None => return Ok(None),
            }
        };
    }
    for &want in b"HTTP/" {
        if next!() != want {
            return Err(());
        }
        i += 1;
    }
    // The major version starts with 1-9 (HTTP/0.9 and HTTP/01.1 are no
    // status lines for nginx).
    if !(b'1'..=b'9').contains(&next!()) {
        return Err(());
    }
    let major = number(b, &mut i, b'.')?;
    let minor = number(b, &mut i, b' ')?;
    let (Some(major), Some(minor)) = (major, minor) else {
        return Ok(None);
    };
    while next!() == b' ' {
        i += 1;
    }
    let start = i;
    let mut code = 0u16;
    for _ in 0..3 {
        let c = next!();
        if !c.is_ascii_digit() {
            return Err(());
        }
        code = code * 10 + u16::from(c - b'0');
        i += 1;
    }
    // After the code: the reason (IIS also sends "403.1"), or the end.
    match next!() {
        b' ' | b'.' => {
            while !matches!(next!(), b'\r' | b'\n') {
                i += 1;
            }
        }
        b'\r' | b'\n' => {}
        _ => return Err(()),
    }
    let end = i;
    if next!() == b'\r' {
        i += 1;
        if next!() != b'\n' {
            return Err(());
        }
    }
    let http11 = major > 1 || minor >= 1;
    Ok(Some((code, http11, &b[start..end], i + 1)))
}

/// A version number of at most 999 ending with `term`, which is consumed;
/// `Ok(None)` when the buffer ends first.
fn number(b: &[u8], i: &mut usize, term: u8) -> Result<Option<u32>, ()> {
    let mut n: u32 = 0;
    let mut digits = 0;
    loop {
        let Some(&c) = b.get(*i) else {
            return Ok(None);
        };
        *i += 1;
        match c {
            b'0'..=b'9' => {
                n = n * 10 + u32::from(c - b'0');
                digits += 1;
                if n > 999 {
                    return Err(());
                }
            }
            c if c == term && digits > 0 => return Ok(Some(n)),
            _ => return Err(()),
        }
    }
}

enum Line<'b> {
    Partial,
    /// The blank line: the body starts here.
    End(usize),
    /// A line to skip; the next starts here.
    Skip(usize),
    Header(&'b [u8], &'b [u8], usize),
    /// Refused; the offending byte is here.
    Bad(usize),
}

/// A byte that may not stand in a name (nor start a line).
fn bad_in_name(c: u8) -> bool {
    c <= 0x20 || c == 0x7f
}

/// One header line starting at `at`.
fn header_line(b: &[u8], at: usize) -> Line<'_> {
    let Some(&first) = b.get(at) else {
        return Line::Partial;
    };
    // The blank line that ends the head.
    match first {
        b'\n' => return Line::End(at + 1),
        b'\r' => {
            return match b.get(at + 1) {
                None => Line::Partial,
                Some(b'\n') => Line::End(at + 2),
                Some(_) => Line::Bad(at),
            }
        }
        c if bad_in_name(c) || c == b':' => return Line::Bad(at),
        _ => {}
    }
    // The name: up to ':' or the line's end.
    let mut i = at + 1;
    let name_end = loop {
        let Some(&c) = b.get(i) else {
            return Line::Partial;
        };
        match c {
            b':' => break i,
            b'\r' | b'\n' => return line_end(b, i, &b[at..i], &[]),
            // IIS repeats its status line among the headers.
            b'/' if &b[at..i] == b"HTTP" => {
                return match b[i..].iter().position(|&c| c == b'\n') {
                    Some(n) => Line::Skip(i + n + 1),
                    None => Line::Partial,
                }
            }
            c if bad_in_name(c) => return Line::Bad(i),
            _ => i += 1,
        }
    };
    let name = &b[at..name_end];
    // Spaces before the value.
    i = name_end + 1;
    loop {
        match b.get(i) {
            None => return Line::Partial,
            Some(b' ') => i += 1,
            Some(_) => break,
        }
    }
    let start = i;
    // The value ends at CR/LF; trailing spaces are not part of it. `end`
    // is where the value stopped (nginx reports the byte there when what
    // follows a CR is not LF).
    let mut end = i;
    loop {
        let Some(&c) = b.get(i) else {
            return Line::Partial;
        };
        match c {
            b'\r' | b'\n' => return line_end(b, i, name, &b[start..end.max(start)]),
            0 => return Line::Bad(i),
            b' ' => {}
            _ => end = i + 1,
        }
        i += 1;
    }
}

/// The end of a header line at `i` (CR LF, a bare LF, or CRs then LF).
fn line_end<'b>(b: &'b [u8], i: usize, name: &'b [u8], value: &'b [u8]) -> Line<'b> {
    let mut j = i;
    loop {
        match b.get(j) {
            None => return Line::Partial,
            Some(b'\n') => return Line::Header(name, value, j + 1),
            Some(b'\r') => j += 1,
            // nginx points at where the value ended (the CR, or the first
            // of the spaces before it).
            Some(_) => return Line::Bad(trimmed_end(b, i)),
        }
    }
}

/// Where trailing spaces before position `i` start.
fn trimmed_end(b: &[u8], mut i: usize) -> usize {
    while i > 0 && b[i - 1] == b' ' {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(b: &[u8]) -> Head {
        match parse(b) {
            Parse::Done(h) => h,
            Parse::Partial => panic!("partial"),
            Parse::NotHttp => panic!("not http"),
            Parse::Invalid(m) => panic!("invalid: {}", m),
        }
    }

    #[test]
    fn status_lines() {
        let h = done(b"HTTP/1.1 302 Found\r\nLocation: /x\r\n\r\nabc");
        assert_eq!(
            (h.code, h.http11, &h.line[..]),
            (302, true, &b"302 Found"[..])
        );
        assert_eq!(
            &b"HTTP/1.1 302 Found\r\nLocation: /x\r\n\r\nabc"[h.end..],
            b"abc"
        );
        let h = done(b"HTTP/1.0 200\r\n\r\n");
        assert_eq!((h.code, h.http11, &h.line[..]), (200, false, &b"200"[..]));
        assert_eq!(done(b"HTTP/10.1  099 X\n\n").code, 99);
        assert!(done(b"HTTP/999.999 200 OK\r\n\r\n").http11);
        assert_eq!(&done(b"HTTP/1.1 403.1 F\r\n\r\n").line[..], b"403.1 F");
        for bad in [
            &b"http/1.1 200 OK\r\n\r\n"[..],
            b"HTTP/0.9 200 OK\r\n\r\n",
            b"HTTP/2 200 OK\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 2000\r\n\r\n",
            b"HTTP/1.1 200\tOK\r\n\r\n",
            b"HTTP/1.1000 200 OK\r\n\r\n",
            b"HTTP/01.1 200 OK\r\n\r\n",
            b"HTTP/1. 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\r\n\r\n",
            b"\r\nHTTP/1.1 200 OK\r\n\r\n",
            b"garbage",
        ] {
            assert!(matches!(parse(bad), Parse::NotHttp), "{:?}", bad);
        }
        assert!(matches!(parse(b"HTTP/1.1 200 O"), Parse::Partial));
        assert!(matches!(parse(b"HT"), Parse::Partial));
    }

    #[test]
    fn header_lines() {
        let h = done(b"HTTP/1.1 200 OK\r\nX@Y: z\r\nNoColon\r\r\nHTTP/1.1 200 OK\r\nX-T:\tv\t  \r\nE:\r\n\r\n");
        let names: Vec<_> = h
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), &v[..]))
            .collect();
        assert_eq!(
            names,
            [
                ("X@Y", &b"z"[..]),
                ("NoColon", b""),
                ("X-T", b"\tv\t"),
                ("E", b"")
            ]
        );
        let bad = |b: &[u8]| match parse(b) {
            Parse::Invalid(m) => m,
            _ => panic!("not refused: {:?}", b),
        };
        assert!(bad(b"HTTP/1.1 200 OK\r\nFoo Bar: x\r\n\r\n").contains("\"Foo\\x20...\""));
        assert!(bad(b"HTTP/1.1 200 OK\r\n: x\r\n\r\n").contains("\"\\x3a...\""));
        assert!(bad(b"HTTP/1.1 200 OK\r\nX-C: a\rb\r\n\r\n").contains("\"X-C: a\\x0d...\""));
        assert!(bad(b"HTTP/1.1 200 OK\r\nX-Y: a\0b\r\n\r\n").contains("\"X-Y: a\\x00...\""));
        assert!(bad(b"HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n").contains("\"\\x20...\""));
    }
}
