//! A parsed request head and the checks nginx makes on it.
//!
//! [`parse_head`] turns the bytes of a complete head (request line and
//! headers) into a [`Request`] with `httparse`, then applies nginx's rules:
//! Host required for HTTP/1.1 and validated, `Content-Length` and
//! `Transfer-Encoding` checked against request smuggling, the target split
//! and normalised into `$uri` and `$args`.
//!
//! A `Request` costs one allocation, its list of header ranges: it keeps
//! the head's bytes in one buffer (the connection's read buffer, handed
//! over, when the head is all that was read) and every part (line, method,
//! target, path, args, host, header names and values) is a `u32` range of
//! it. Header names are not lowercased: lookups compare them lowercased.
//! Only a path that normalising changes and a host with capitals are
//! copied, appended to the same buffer.

use crate::http::conf::SrvConf;
use crate::http::uri;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    Other,
}

/// A byte range of a [`Request`]'s buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
}

impl Span {
    /// The range of `part` within `base`, None when `part` is elsewhere (a
    /// constant, such as the `/` of an absolute target without a path).
    /// parse_head refuses a head whose offsets would not fit in u32.
    fn within(base: &[u8], part: &[u8]) -> Option<Span> {
        let start = (part.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
        let end = start.checked_add(part.len())?;
        if end > base.len() {
            return None;
        }
        Some(Span {
            start: u32::try_from(start).ok()?,
            end: u32::try_from(end).ok()?,
        })
    }

    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }

    fn get(self, buf: &[u8]) -> &[u8] {
        buf.get(self.range()).unwrap_or_default()
    }
}

/// One header line's name and value, as ranges of the request's buffer.
#[derive(Debug, Clone, Copy)]
struct Hdr {
    name: Span,
    value: Span,
}

/// A request header as [`Request::headers`] yields it.
#[derive(Debug, Clone, Copy)]
pub struct Header<'r> {
    /// The name as sent.
    pub name: &'r [u8],
    pub value: &'r [u8],
}

impl Header<'_> {
    /// Whether the name, lowercased, is `lname`.
    pub fn is(&self, lname: &str) -> bool {
        name_is(self.name, lname)
    }
}

/// `name` lowercased equals `lname` (a lookup name, lowercase): header
/// names are compared without a lowercased copy of each.
fn name_is(name: &[u8], lname: &str) -> bool {
    name.len() == lname.len()
        && name
            .iter()
            .zip(lname.bytes())
            .all(|(&a, b)| a.to_ascii_lowercase() == b)
}

/// A parsed request head. The head's bytes are kept once, in one buffer
/// (the connection's read buffer when the head was all it held); the parts
/// are ranges of it, read through the accessors. What parsing derives and
/// the head does not contain as such (a host with capitals lowercased, a
/// path that normalising changed) is appended to the same buffer.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: Method,
    /// 9 (HTTP/0.9 is refused), 10 or 11.
    pub minor: u8,
    pub content_length: Option<u64>,
    pub chunked: bool,
    pub keepalive: bool,
    pub expect_continue: bool,
    /// Bytes of the head (request line and headers).
    pub head_len: usize,
    buf: Vec<u8>,
    method_raw: Span,
    line: Span,
    raw_uri: Span,
    uri: Span,
    args: Option<Span>,
    host: Option<Span>,
    headers: Vec<Hdr>,
}

impl Request {
    /// The method as sent (upper-case letters, `_` and `-`: parse_head
    /// refuses anything else, so it is always valid UTF-8).
    pub fn method_raw(&self) -> &str {
        std::str::from_utf8(self.method_raw.get(&self.buf)).unwrap_or_default()
    }

    /// The request line as sent, for `$request` and the error log.
    pub fn line(&self) -> &[u8] {
        self.line.get(&self.buf)
    }

    /// The target as sent (`$request_uri`).
    pub fn raw_uri(&self) -> &[u8] {
        self.raw_uri.get(&self.buf)
    }

    /// Decoded, normalised path (`$uri` before any rewrite).
    pub fn uri(&self) -> &[u8] {
        self.uri.get(&self.buf)
    }

    /// The query of the target (`$args` before any rewrite).
    pub fn args(&self) -> Option<&[u8]> {
        self.args.map(|a| a.get(&self.buf))
    }

    /// Lowercased host (from the absolute target or the Host header), without port.
    pub fn host(&self) -> Option<&[u8]> {
        self.host.map(|h| h.get(&self.buf))
    }

    /// The headers in the order sent (those with invalid names left out
    /// under `ignore_invalid_headers`).
    pub fn headers(&self) -> impl Iterator<Item = Header<'_>> + '_ {
        self.headers.iter().map(|h| Header {
            name: h.name.get(&self.buf),
            value: h.value.get(&self.buf),
        })
    }

    /// The value of the first header whose lowercased name is `lname`.
    pub fn header(&self, lname: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| name_is(h.name.get(&self.buf), lname))
            .map(|h| h.value.get(&self.buf))
    }
}

/// Why a head was refused: the status to answer and the error-log text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub status: u16,
    pub log: &'static str,
    /// The request line, when it was parsed (for the log line and `$request`).
    pub line: Option<Vec<u8>>,
}

fn reject(status: u16, log: &'static str, line: Option<&[u8]>) -> Reject {
    Reject {
        status,
        log,
        line: line.map(<[u8]>::to_vec),
    }
}

/// Parses a complete head: `head` holds exactly its bytes (the request
/// line and headers, ending with the blank line) and becomes the request's
/// buffer.
pub fn parse_head(mut head: Vec<u8>, srv: &SrvConf) -> Result<Request, Reject> {
    // Ranges are u32 and derived bytes may follow the head; a head this
    // large is refused long before (large_client_header_buffers).
    if head.len() > (u32::MAX / 4) as usize {
        return Err(reject(400, "client sent invalid request", None));
    }
    let buf = head.as_slice();
    // Uninitialised slots: 128 initialised headers would be a 4 KiB
    // memset on every request.
    let mut hdrs = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; 128];
    let mut req = httparse::Request::new(&mut []);
    let status = req.parse_with_uninit_headers(buf, &mut hdrs);
    let line_end = memchr::memchr(b'\n', buf).unwrap_or(buf.len());
    let line = trim_cr(&buf[..line_end]);
    let head_len = match status {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return Err(reject(400, "client sent invalid request", None))
        }
        Err(httparse::Error::Version) => {
            // nginx answers a well-formed version above 1.x with 505.
            let status = if major_version_above_one(line) {
                505
            } else {
                400
            };
            let log = if status == 505 {
                "client sent unsupported HTTP version"
            } else {
                "client sent invalid request"
            };
            return Err(reject(status, log, None));
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(reject(494, "client sent too long header line", Some(line)))
        }
        Err(httparse::Error::Token) => return Err(reject(400, "client sent invalid method", None)),
        Err(httparse::Error::HeaderName)
        | Err(httparse::Error::HeaderValue)
        | Err(httparse::Error::NewLine) => {
            return Err(reject(400, "client sent invalid header line", Some(line)))
        }
        Err(_) => return Err(reject(400, "client sent invalid request", None)),
    };
    let method_raw = req.method.unwrap_or("");
    // nginx accepts only upper-case letters, `_` and `-` in a method.
    if !method_raw
        .bytes()
        .all(|c| c.is_ascii_uppercase() || c == b'_' || c == b'-')
    {
        return Err(reject(400, "client sent invalid method", None));
    }
    let method = match method_raw {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "OPTIONS" => Method::Options,
        _ => Method::Other,
    };
    let minor = req.version.unwrap_or(0);
    let raw_target = req.path.unwrap_or("").as_bytes();
    // httparse's slices are of `buf`, so these always succeed.
    let in_head = |part: &[u8]| {
        Span::within(buf, part).ok_or_else(|| reject(400, "client sent invalid request", None))
    };
    let method_raw = in_head(method_raw.as_bytes())?;
    let raw_uri = in_head(raw_target)?;
    let line_span = in_head(line)?;
    let target = uri::split_target(raw_target)
        .map_err(|_| reject(400, "client sent invalid request", Some(line)))?;
    let args = target.query.map(in_head).transpose()?;
    let merge = srv.merge_slashes.unwrap_or(true);
    // The path as sent when normalising would not change it (the usual
    // case); else its normalised copy, appended to the buffer below.
    let path = match Span::within(buf, target.path) {
        Some(p) if uri::is_normal(target.path, merge) => Ok(p),
        _ => Err(uri::normalize_path(target.path, merge)
            .map_err(|_| reject(400, "client sent invalid request", Some(line)))?),
    };
    let mut host = match target.host {
        Some(h) => Some(in_head(validate_host(h).ok_or_else(|| {
            reject(400, "client sent invalid host in request line", Some(line))
        })?)?),
        None => None,
    };
    let underscores = srv.underscores_in_headers.unwrap_or(false);
    let ignore_invalid = srv.ignore_invalid_headers.unwrap_or(true);
    let mut headers = Vec::with_capacity(req.headers.len());
    let mut content_length: Option<u64> = None;
    let mut te: Option<&[u8]> = None;
    let mut seen_host = false;
    let mut connection: Option<&[u8]> = None;
    let mut expect_continue = false;
    let mut seen_authorization = false;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let valid_name = name
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || (c == b'_' && underscores));
        if !valid_name && ignore_invalid {
            continue;
        }
        if name_is(name, "host") {
            if seen_host {
                return Err(reject(400, "client sent duplicate host header", Some(line)));
            }
            seen_host = true;
            let v = validate_host(h.value)
                .ok_or_else(|| reject(400, "client sent invalid host header", Some(line)))?;
            if host.is_none() {
                host = Some(in_head(v)?);
            }
        } else if name_is(name, "content-length") {
            if content_length.is_some() {
                return Err(reject(400, "client sent duplicate header line", Some(line)));
            }
            let s = std::str::from_utf8(h.value).ok().map(str::trim);
            let n = s
                .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| {
                    reject(
                        400,
                        "client sent invalid \"Content-Length\" header",
                        Some(line),
                    )
                })?;
            content_length = Some(n as u64);
        } else if name_is(name, "transfer-encoding") {
            if te.is_some() {
                return Err(reject(400, "client sent duplicate header line", Some(line)));
            }
            te = Some(h.value);
        } else if name_is(name, "connection") {
            connection = Some(h.value);
        } else if name_is(name, "expect") {
            expect_continue = h.value.eq_ignore_ascii_case(b"100-continue");
        } else if name_is(name, "authorization") {
            // nginx keeps one Authorization header (auth_basic, $remote_user).
            if seen_authorization {
                return Err(reject(400, "client sent duplicate header line", Some(line)));
            }
            seen_authorization = true;
        }
        headers.push(Hdr {
            name: in_head(name)?,
            value: in_head(h.value)?,
        });
    }
    if minor >= 1 && !seen_host && target.host.is_none() {
        return Err(reject(
            400,
            "client sent HTTP/1.1 request without \"Host\" header",
            Some(line),
        ));
    }
    let mut chunked = false;
    if let Some(te) = te {
        if minor == 0 {
            return Err(reject(
                400,
                "client sent HTTP/1.0 request with \"Transfer-Encoding\" header",
                Some(line),
            ));
        }
        if !te.eq_ignore_ascii_case(b"chunked") {
            return Err(reject(
                501,
                "client sent unknown \"Transfer-Encoding\"",
                Some(line),
            ));
        }
        if content_length.is_some() {
            return Err(reject(
                400,
                "client sent \"Content-Length\" and \"Transfer-Encoding\" headers at the same time",
                Some(line),
            ));
        }
        chunked = true;
    }
    let keepalive = match connection {
        Some(c) if contains_token(c, b"close") => false,
        Some(c) if contains_token(c, b"keep-alive") => true,
        _ => minor >= 1,
    };
    // Derived bytes that differ from the head's go after it.
    let uri = match path {
        Ok(p) => p,
        Err(normalised) => {
            let start = head.len();
            head.extend_from_slice(&normalised);
            appended(&head, start)?
        }
    };
    let host = match host {
        Some(h) if h.get(&head).iter().any(u8::is_ascii_uppercase) => {
            let start = head.len();
            if h.range().end <= start {
                head.extend_from_within(h.range());
            }
            if let Some(added) = head.get_mut(start..) {
                added.make_ascii_lowercase();
            }
            Some(appended(&head, start)?)
        }
        h => h,
    };
    Ok(Request {
        method,
        minor,
        content_length,
        chunked,
        keepalive,
        expect_continue: expect_continue && minor >= 1,
        head_len,
        buf: head,
        method_raw,
        line: line_span,
        raw_uri,
        uri,
        args,
        host,
        headers,
    })
}

/// The range of what was appended to the buffer from `start` on.
fn appended(buf: &[u8], start: usize) -> Result<Span, Reject> {
    let span = |n: usize| u32::try_from(n).ok();
    match (span(start), span(buf.len())) {
        (Some(start), Some(end)) => Ok(Span { start, end }),
        _ => Err(reject(400, "client sent invalid request", None)),
    }
}

/// True for a request line ending in `HTTP/<major>.<minor>` with major > 1.
fn major_version_above_one(line: &[u8]) -> bool {
    let Some(sp) = memchr::memrchr(b' ', line) else {
        return false;
    };
    let Some(v) = line[sp + 1..].strip_prefix(b"HTTP/") else {
        return false;
    };
    let mut parts = v.splitn(2, |&c| c == b'.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        return false;
    };
    let digits = |d: &[u8]| !d.is_empty() && d.len() <= 3 && d.iter().all(u8::is_ascii_digit);
    digits(major) && digits(minor) && major != b"1" && major != b"0"
}

fn contains_token(v: &[u8], tok: &[u8]) -> bool {
    v.split(|&c| c == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(tok))
}

fn trim_cr(l: &[u8]) -> &[u8] {
    l.strip_suffix(b"\r").unwrap_or(l)
}

/// nginx's host validation: strip the port and a trailing dot, refuse
/// `..`, `/`, a backslash, NUL and controls; an empty host is invalid.
/// Returns the host within `h` (the caller lowercases it).
pub fn validate_host(h: &[u8]) -> Option<&[u8]> {
    let h = h.trim_ascii();
    let mut in_brackets = false;
    let mut dot_pos: Option<usize> = None;
    let mut host_len = h.len();
    for (i, &c) in h.iter().enumerate() {
        match c {
            b'.' => {
                if dot_pos == Some(i.wrapping_sub(1)) {
                    return None;
                }
                dot_pos = Some(i);
            }
            b':' if !in_brackets => {
                host_len = i;
                break;
            }
            b'[' if i == 0 => in_brackets = true,
            b']' => in_brackets = false,
            b'\0' | b'/' | b'\\' => return None,
            c if c.is_ascii_control() => return None,
            _ => {}
        }
    }
    let mut host = &h[..host_len];
    if host.last() == Some(&b'.') {
        host = &host[..host.len() - 1];
    }
    if host.is_empty() {
        return None;
    }
    Some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str) -> Result<Request, Reject> {
        parse_head(head.as_bytes().to_vec(), &SrvConf::default())
    }

    #[test]
    fn parts_are_the_bytes_sent() {
        let r = parse(
            "GET /a/b.txt?x=1&y HTTP/1.1\r\nHost: example.com:8080\r\n\
             User-Agent: t\r\nX-Dup: 1\r\nx-dup: 2\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.method_raw(), "GET");
        assert_eq!(r.line(), b"GET /a/b.txt?x=1&y HTTP/1.1");
        assert_eq!(r.raw_uri(), b"/a/b.txt?x=1&y");
        assert_eq!(r.uri(), b"/a/b.txt");
        assert_eq!(r.args(), Some(&b"x=1&y"[..]));
        assert_eq!(r.host(), Some(&b"example.com"[..]));
        assert_eq!(r.header("user-agent"), Some(&b"t"[..]));
        // The first of repeated headers; lookups ignore the case sent.
        assert_eq!(r.header("x-dup"), Some(&b"1"[..]));
        assert_eq!(r.header("User-Agent"), None, "lookup names are lowercase");
        let names: Vec<&[u8]> = r.headers().map(|h| h.name).collect();
        assert_eq!(names, [&b"Host"[..], b"User-Agent", b"X-Dup", b"x-dup"]);
        assert!(r.headers().nth(1).unwrap().is("user-agent"));
        assert!(r.keepalive);
        assert_eq!(r.head_len, r.buf.len());
    }

    #[test]
    fn derived_parts_follow_the_head() {
        // A path that normalising changes and a host with capitals.
        let r = parse("GET /a/./b/../%63//d? HTTP/1.1\r\nHost: WWW.Example.COM.\r\n\r\n").unwrap();
        assert_eq!(r.uri(), b"/a/c/d");
        assert_eq!(r.raw_uri(), b"/a/./b/../%63//d?");
        assert_eq!(r.args(), Some(&b""[..]));
        assert_eq!(r.host(), Some(&b"www.example.com"[..]));
        assert_eq!(r.header("host"), Some(&b"WWW.Example.COM."[..]));
        // An absolute target: its host wins, its missing path is "/".
        let r = parse("GET http://Foo.example HTTP/1.1\r\nHost: bar\r\n\r\n").unwrap();
        assert_eq!(r.uri(), b"/");
        assert_eq!(r.args(), None);
        assert_eq!(r.host(), Some(&b"foo.example"[..]));
        assert_eq!(r.raw_uri(), b"http://Foo.example");
    }

    #[test]
    fn connection_and_transfer_encoding_ignore_case() {
        let r =
            parse("GET / HTTP/1.1\r\nHost: h\r\nConnection: Keep-Alive, CLOSE\r\n\r\n").unwrap();
        assert!(!r.keepalive);
        let r = parse("GET / HTTP/1.0\r\nConnection: KEEP-ALIVE\r\n\r\n").unwrap();
        assert!(r.keepalive);
        let r = parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n").unwrap();
        assert!(r.chunked);
        let e = parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n").unwrap_err();
        assert_eq!(e.status, 501);
        let e = parse("GET / HTTP/1.1\r\nHost: h\r\nhOsT: h\r\n\r\n").unwrap_err();
        assert_eq!(e.log, "client sent duplicate host header");
        assert_eq!(e.line.as_deref(), Some(&b"GET / HTTP/1.1"[..]));
    }

    #[test]
    fn invalid_names_are_left_out() {
        let r = parse("GET / HTTP/1.1\r\nHost: h\r\nX_Under: 1\r\nX-Ok: 2\r\n\r\n").unwrap();
        assert_eq!(r.headers().count(), 2);
        assert_eq!(r.header("x_under"), None);
        assert_eq!(r.header("x-ok"), Some(&b"2"[..]));
    }
}
