//! A parsed request head and the checks nginx makes on it.
//!
//! [`parse_head`] turns the bytes of a complete head (request line and
//! headers) into a [`Request`] with `httparse`, then applies nginx's rules:
//! Host required for HTTP/1.1 and validated, `Content-Length` and
//! `Transfer-Encoding` checked against request smuggling, the target split
//! and normalised into `$uri` and `$args`.

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
    fn of(buf: &[u8], start: usize, end: usize) -> Span {
        // parse_head refuses a buffer whose offsets would not fit.
        let c = |n: usize| u32::try_from(n.min(buf.len())).unwrap_or(0);
        Span {
            start: c(start),
            end: c(end),
        }
    }

    fn get(self, buf: &[u8]) -> &[u8] {
        buf.get(self.start as usize..self.end as usize)
            .unwrap_or_default()
    }
}

/// One header line's name, lowercased name and value, as ranges of the
/// request's buffer.
#[derive(Debug, Clone, Copy)]
struct Hdr {
    name: Span,
    lname: Span,
    value: Span,
}

/// A request header as [`Request::headers`] yields it.
#[derive(Debug, Clone, Copy)]
pub struct Header<'r> {
    /// The name as sent.
    pub name: &'r str,
    /// The name lowercased, for lookups.
    pub lname: &'r str,
    pub value: &'r [u8],
}

/// A parsed request head. The head's bytes are kept once, in one buffer,
/// followed by what parsing derived from them when that differs from the
/// bytes sent (lowercased header names and host, a normalised path); the
/// parts are ranges of that buffer, read through the accessors.
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
    /// The method as sent (upper-case letters, `_` and `-`).
    pub fn method_raw(&self) -> &str {
        ascii(self.method_raw.get(&self.buf))
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
            name: ascii(h.name.get(&self.buf)),
            lname: ascii(h.lname.get(&self.buf)),
            value: h.value.get(&self.buf),
        })
    }

    /// The value of the first header named `lname` (lowercase).
    pub fn header(&self, lname: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.lname.get(&self.buf) == lname.as_bytes())
            .map(|h| h.value.get(&self.buf))
    }
}

/// Names and methods are ASCII tokens (httparse and parse_head check them).
fn ascii(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap_or_default()
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

/// Where a part of the head is: `base`'s range `part`, or not in `base`
/// (a constant, such as the `/` of an absolute target without path).
fn locate(base: &[u8], part: &[u8]) -> Option<(usize, usize)> {
    let start = (part.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= base.len()).then_some((start, end))
}

/// A part of the request still to be placed in the buffer.
enum Part {
    /// These bytes of the head, as they are.
    Same(usize, usize),
    /// These bytes of the head, lowercased.
    Lower(usize, usize),
    /// Other bytes (a normalised path that differs from the one sent).
    Other(Vec<u8>),
}

impl Part {
    fn of(base: &[u8], part: &[u8]) -> Part {
        match locate(base, part) {
            Some((s, e)) => Part::Same(s, e),
            None => Part::Other(part.to_vec()),
        }
    }

    fn lower(base: &[u8], part: &[u8]) -> Part {
        match locate(base, part) {
            Some((s, e)) if part.iter().any(u8::is_ascii_uppercase) => Part::Lower(s, e),
            Some((s, e)) => Part::Same(s, e),
            None => Part::Other(part.to_ascii_lowercase()),
        }
    }

    /// Bytes it adds to the buffer.
    fn extra(&self) -> usize {
        match self {
            Part::Same(..) => 0,
            Part::Lower(s, e) => e - s,
            Part::Other(v) => v.len(),
        }
    }

    fn place(self, buf: &mut Vec<u8>) -> Span {
        let at = buf.len();
        match self {
            Part::Same(s, e) => return Span::of(buf, s, e),
            Part::Lower(s, e) => {
                if s <= e && e <= at {
                    buf.extend_from_within(s..e);
                }
                if let Some(added) = buf.get_mut(at..) {
                    added.make_ascii_lowercase();
                }
            }
            Part::Other(v) => buf.extend_from_slice(&v),
        }
        Span::of(buf, at, buf.len())
    }
}

/// Parses a complete head: `head` holds exactly its bytes (the request
/// line and headers, ending with the blank line), and becomes the
/// request's buffer (with room to spare, it costs no allocation).
pub fn parse_head(mut head: Vec<u8>, srv: &SrvConf) -> Result<Request, Reject> {
    // Ranges are u32; a head this large is refused long before (the
    // large_client_header_buffers limit), this only keeps them exact.
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
    let target = uri::split_target(raw_target)
        .map_err(|_| reject(400, "client sent invalid request", Some(line)))?;
    let merge = srv.merge_slashes.unwrap_or(true);
    // The path as sent when normalising would not change it (the usual
    // case), else its normalised copy.
    let path = if uri::is_normal(target.path, merge) {
        Part::of(buf, target.path)
    } else {
        Part::Other(
            uri::normalize_path(target.path, merge)
                .map_err(|_| reject(400, "client sent invalid request", Some(line)))?,
        )
    };
    let mut host: Option<Part> = match target.host {
        Some(h) => Some(Part::lower(
            buf,
            validate_host(h).ok_or_else(|| {
                reject(400, "client sent invalid host in request line", Some(line))
            })?,
        )),
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
    // Bytes the lowercased names add to the buffer.
    let mut extra = 0;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let valid_name = name
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || (c == b'_' && underscores));
        if !valid_name && ignore_invalid {
            continue;
        }
        if name.eq_ignore_ascii_case(b"host") {
            if seen_host {
                return Err(reject(400, "client sent duplicate host header", Some(line)));
            }
            seen_host = true;
            let v = validate_host(h.value)
                .ok_or_else(|| reject(400, "client sent invalid host header", Some(line)))?;
            if host.is_none() {
                host = Some(Part::lower(buf, v));
            }
        } else if name.eq_ignore_ascii_case(b"content-length") {
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
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if te.is_some() {
                return Err(reject(400, "client sent duplicate header line", Some(line)));
            }
            te = Some(h.value);
        } else if name.eq_ignore_ascii_case(b"connection") {
            connection = Some(h.value);
        } else if name.eq_ignore_ascii_case(b"expect") {
            expect_continue = h.value.eq_ignore_ascii_case(b"100-continue");
        }
        let (Some((ns, ne)), Some((vs, ve))) = (locate(buf, name), locate(buf, h.value)) else {
            // httparse's slices are of `buf`; nothing else can occur.
            return Err(reject(400, "client sent invalid header line", Some(line)));
        };
        if name.iter().any(u8::is_ascii_uppercase) {
            extra += name.len();
        }
        let name = Span::of(buf, ns, ne);
        headers.push(Hdr {
            name,
            lname: name,
            value: Span::of(buf, vs, ve),
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
    let method_raw = Part::of(buf, method_raw.as_bytes());
    let line = Part::of(buf, line);
    let raw_uri = Part::of(buf, raw_target);
    let args = target.query.map(|q| Part::of(buf, q));
    // Derived bytes go after the head: one allocation at most, none when
    // the buffer has room.
    extra += path.extra() + host.as_ref().map_or(0, Part::extra);
    head.reserve(extra);
    for h in &mut headers {
        let name = h.name.get(&head);
        if name.iter().any(u8::is_ascii_uppercase) {
            h.lname = Part::Lower(h.name.start as usize, h.name.end as usize).place(&mut head);
        }
    }
    Ok(Request {
        method,
        minor,
        content_length,
        chunked,
        keepalive,
        expect_continue: expect_continue && minor >= 1,
        head_len,
        method_raw: method_raw.place(&mut head),
        line: line.place(&mut head),
        raw_uri: raw_uri.place(&mut head),
        uri: path.place(&mut head),
        args: args.map(|a| a.place(&mut head)),
        host: host.map(|h| h.place(&mut head)),
        headers,
        buf: head,
    })
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
