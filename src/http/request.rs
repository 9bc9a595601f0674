//! A request as the phases, modules and filters see it, whatever protocol
//! carried it: method, target (`$request_uri`, `$uri`, `$args`), host and
//! header fields as name/value pairs, what the body will be
//! (`content_length`, `chunked`). The protocols build it: HTTP/1 from its
//! head (`http::v1::parse`), HTTP/2 and HTTP/3 from the fields of their
//! HEADERS (`http::fields`).
//!
//! A `Request` costs at most one allocation, its list of header ranges,
//! and usually none: a finished request gives its buffer and list back to
//! the worker for the next one ([`Request::recycle`]). It keeps the head's
//! bytes in one buffer (the connection's read buffer, handed
//! over, when the head is all that was read) and every part (line, method,
//! target, path, args, host, header names and values) is a `u32` range of
//! it. Header names are not lowercased: lookups compare them lowercased.
//! Only a path that normalising changes and a host with capitals are
//! copied, appended to the same buffer.

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

/// The buffers of finished requests, kept by the worker for its next
/// ones (HTTP/1: the read buffer a head arrives in, the header list
/// parse_head fills, the static handler's path), so a request on the hot
/// path allocates none of them. A few of each, and none larger than
/// [`SPARE_MAX_BYTES`]: what a worker keeps is bounded whatever its
/// clients send. An idle connection holds no buffer either way (see
/// `http::v1::conn`).
#[derive(Default)]
struct Spare {
    bufs: Vec<Vec<u8>>,
    headers: Vec<Vec<Hdr>>,
}

/// How many buffers of each kind a worker keeps.
const SPARE_COUNT: usize = 16;
/// The largest buffer kept (a head in large_client_header_buffers grows
/// its buffer; one much larger is given back to the allocator).
const SPARE_MAX_BYTES: usize = 16 * 1024;

thread_local! {
    static SPARE: std::cell::RefCell<Spare> = std::cell::RefCell::new(Spare::default());
}

/// An empty byte buffer, from the spares if there is one.
pub(crate) fn spare_buf() -> Vec<u8> {
    SPARE
        .try_with(|s| s.borrow_mut().bufs.pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keeps a byte buffer no longer needed for the next request.
pub(crate) fn give_back_buf(mut b: Vec<u8>) {
    if b.capacity() == 0 || b.capacity() > SPARE_MAX_BYTES {
        return;
    }
    b.clear();
    let _ = SPARE.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.bufs.len() < SPARE_COUNT {
            s.bufs.push(b);
        }
    });
}

/// An empty header list, from the spares if there is one.
pub(crate) fn spare_headers() -> Vec<Hdr> {
    SPARE
        .try_with(|s| s.borrow_mut().headers.pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// A byte range of a [`Request`]'s buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u32,
    pub(crate) end: u32,
}

impl Span {
    /// The range of `part` within `base`, None when `part` is elsewhere (a
    /// constant, such as the `/` of an absolute target without a path).
    /// parse_head refuses a head whose offsets would not fit in u32.
    pub(crate) fn within(base: &[u8], part: &[u8]) -> Option<Span> {
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

    pub(crate) fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }

    pub(crate) fn get(self, buf: &[u8]) -> &[u8] {
        buf.get(self.range()).unwrap_or_default()
    }
}

/// One header line's name and value, as ranges of the request's buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hdr {
    pub(crate) name: Span,
    pub(crate) value: Span,
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
pub(crate) fn name_is(name: &[u8], lname: &str) -> bool {
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
    /// 0 (HTTP/1.0 and 0.9) or 1 (1.1 and any later 1.x).
    pub minor: u8,
    /// An HTTP/0.9 request (`GET /path` alone): answered with the body only.
    pub http09: bool,
    pub content_length: Option<u64>,
    pub chunked: bool,
    pub keepalive: bool,
    pub expect_continue: bool,
    /// Bytes of the head (request line and headers).
    pub head_len: usize,
    pub(crate) buf: Vec<u8>,
    pub(crate) method_raw: Span,
    pub(crate) line: Span,
    pub(crate) raw_uri: Span,
    /// `HTTP/x.y` as sent, up to the end of the line (`$server_protocol`);
    /// empty for HTTP/0.9.
    pub(crate) proto: Span,
    pub(crate) uri: Span,
    pub(crate) args: Option<Span>,
    pub(crate) host: Option<Span>,
    pub(crate) headers: Vec<Hdr>,
    /// Header lines left out as invalid (`ignore_invalid_headers`), which
    /// nginx reports in the error log.
    pub(crate) invalid: Vec<Span>,
}

impl Request {
    /// Ends the request, keeping its buffer and header list for the
    /// worker's next requests (see [`spare_buf`]).
    pub(crate) fn recycle(self) {
        give_back_buf(self.buf);
        let mut h = self.headers;
        if h.capacity() == 0 || h.capacity() * std::mem::size_of::<Hdr>() > SPARE_MAX_BYTES {
            return;
        }
        h.clear();
        let _ = SPARE.try_with(|s| {
            let mut s = s.borrow_mut();
            if s.headers.len() < SPARE_COUNT {
                s.headers.push(h);
            }
        });
    }

    /// The method as sent (upper-case letters, `_` and `-`: parse_head
    /// refuses anything else, so it is always valid UTF-8).
    pub fn method_raw(&self) -> &str {
        std::str::from_utf8(self.method_raw.get(&self.buf)).unwrap_or_default()
    }

    /// The request line as sent, for `$request` and the error log.
    pub fn line(&self) -> &[u8] {
        self.line.get(&self.buf)
    }

    /// The target as sent, from its path on (`$request_uri`: an
    /// absolute-form target loses its scheme and host, as in nginx).
    pub fn raw_uri(&self) -> &[u8] {
        self.raw_uri.get(&self.buf)
    }

    /// The protocol as sent (`$server_protocol`), empty for HTTP/0.9.
    pub fn proto(&self) -> &[u8] {
        self.proto.get(&self.buf)
    }

    /// Header lines left out as invalid, for the error log.
    pub fn invalid_lines(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.invalid.iter().map(|s| s.get(&self.buf))
    }

    /// The request nginx logs for a head it refused: only the request
    /// line (possibly empty) and, when it was read, the Host header.
    pub fn refused(line: &[u8], host: Option<&[u8]>) -> Request {
        let mut buf = line.to_vec();
        let line_span = Span {
            start: 0,
            end: buf.len() as u32,
        };
        let method_len = line.iter().take_while(|&&c| is_method_char(c)).count();
        let mut host_span = None;
        let headers = match host {
            Some(h) => {
                let start = buf.len() as u32;
                buf.extend_from_slice(b"Host");
                let vstart = buf.len() as u32;
                buf.extend_from_slice(h);
                let hdr_end = buf.len();
                if let Some(v) = validate_host(h) {
                    let hs = buf.len();
                    buf.extend_from_slice(v);
                    buf[hs..].make_ascii_lowercase();
                    host_span = Some(Span {
                        start: hs as u32,
                        end: buf.len() as u32,
                    });
                }
                vec![Hdr {
                    name: Span { start, end: vstart },
                    value: Span {
                        start: vstart,
                        end: hdr_end as u32,
                    },
                }]
            }
            None => Vec::new(),
        };
        Request {
            method: Method::Other,
            minor: 1,
            http09: false,
            content_length: None,
            chunked: false,
            keepalive: false,
            expect_continue: false,
            head_len: 0,
            method_raw: Span {
                start: 0,
                end: method_len as u32,
            },
            line: line_span,
            raw_uri: Span::default(),
            proto: Span::default(),
            uri: Span::default(),
            args: None,
            host: host_span,
            headers,
            invalid: Vec::new(),
            buf,
        }
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

    /// `$http_NAME`: the value of the first header that [`var_name_is`]
    /// `lname`.
    pub fn header_var(&self, lname: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| var_name_is(h.name.get(&self.buf), lname))
            .map(|h| h.value.get(&self.buf))
    }

    /// The value of the first header whose lowercased name is `lname`.
    pub fn header(&self, lname: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| name_is(h.name.get(&self.buf), lname))
            .map(|h| h.value.get(&self.buf))
    }
}

/// `name` lowercased equals `lname` with `-` and `_` taken as one: nginx
/// finds `$http_NAME` by reading `-` in a header's name as `_`, so
/// `$http_x_foo` is `X-Foo` or `x_foo` (when underscores_in_headers or
/// `ignore_invalid_headers off` kept it).
pub(crate) fn var_name_is(name: &[u8], lname: &str) -> bool {
    let fold = |c: u8| {
        if c == b'_' {
            b'-'
        } else {
            c.to_ascii_lowercase()
        }
    };
    name.len() == lname.len()
        && name
            .iter()
            .zip(lname.bytes())
            .all(|(&a, b)| fold(a) == fold(b))
}

/// nginx accepts only upper-case letters, `_` and `-` in a method.
pub(crate) fn is_method_char(c: u8) -> bool {
    c.is_ascii_uppercase() || c == b'_' || c == b'-'
}

/// nginx's host validation: strip the port and a trailing dot, refuse
/// `..`, `/`, a backslash, NUL and controls; an empty host is invalid.
/// Returns the host within `h` (the caller lowercases it).
pub fn validate_host(h: &[u8]) -> Option<&[u8]> {
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
            // As nginx: the path separator, spaces and controls (a
            // backslash is an ordinary character).
            b'/' => return None,
            c if c <= b' ' || c == 0x7f => return None,
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

pub use crate::http::v1::parse::{parse_head, parse_line, Line, Reject};
