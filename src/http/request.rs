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

#[derive(Debug, Clone)]
pub struct Header {
    pub name: String,
    /// Lowercase name for lookups.
    pub lname: String,
    pub value: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct Request {
    pub method: Method,
    pub method_raw: String,
    /// 9 (HTTP/0.9 is refused), 10 or 11.
    pub minor: u8,
    /// The request line as sent, for `$request` and the error log.
    pub line: Vec<u8>,
    /// The target as sent (`$request_uri`).
    pub raw_uri: Vec<u8>,
    /// Decoded, normalised path (`$uri`).
    pub uri: Vec<u8>,
    pub args: Option<Vec<u8>>,
    pub headers: Vec<Header>,
    /// Lowercased host (from the absolute target or the Host header), without port.
    pub host: Option<Vec<u8>>,
    pub content_length: Option<u64>,
    pub chunked: bool,
    pub keepalive: bool,
    pub expect_continue: bool,
    /// Bytes of the head (request line and headers).
    pub head_len: usize,
}

impl Request {
    pub fn header(&self, lname: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.lname == lname)
            .map(|h| h.value.as_slice())
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

/// Parses a complete head (`buf` ends with the blank line).
pub fn parse_head(buf: &[u8], srv: &SrvConf) -> Result<Request, Reject> {
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
    let method_raw = req.method.unwrap_or("").to_string();
    // nginx accepts only upper-case letters, `_` and `-` in a method.
    if !method_raw
        .bytes()
        .all(|c| c.is_ascii_uppercase() || c == b'_' || c == b'-')
    {
        return Err(reject(400, "client sent invalid method", None));
    }
    let method = match method_raw.as_str() {
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
    let path = uri::normalize_path(target.path, merge)
        .map_err(|_| reject(400, "client sent invalid request", Some(line)))?;
    let args = target.query.map(<[u8]>::to_vec);
    let mut host: Option<Vec<u8>> =
        match target.host {
            Some(h) => Some(validate_host(h).ok_or_else(|| {
                reject(400, "client sent invalid host in request line", Some(line))
            })?),
            None => None,
        };
    let underscores = srv.underscores_in_headers.unwrap_or(false);
    let ignore_invalid = srv.ignore_invalid_headers.unwrap_or(true);
    let mut headers = Vec::with_capacity(req.headers.len());
    let mut content_length: Option<u64> = None;
    let mut te: Option<Vec<u8>> = None;
    let mut seen_host = false;
    let mut connection: Option<Vec<u8>> = None;
    let mut expect_continue = false;
    for h in req.headers.iter() {
        let valid_name = h
            .name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || (c == b'_' && underscores));
        if !valid_name && ignore_invalid {
            continue;
        }
        let lname = h.name.to_ascii_lowercase();
        match lname.as_str() {
            "host" => {
                if seen_host {
                    return Err(reject(400, "client sent duplicate host header", Some(line)));
                }
                seen_host = true;
                let v = validate_host(h.value)
                    .ok_or_else(|| reject(400, "client sent invalid host header", Some(line)))?;
                if host.is_none() {
                    host = Some(v);
                }
            }
            "content-length" => {
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
            }
            "transfer-encoding" => {
                if te.is_some() {
                    return Err(reject(400, "client sent duplicate header line", Some(line)));
                }
                te = Some(h.value.to_vec());
            }
            "connection" => connection = Some(h.value.to_ascii_lowercase()),
            "expect" => expect_continue = h.value.eq_ignore_ascii_case(b"100-continue"),
            _ => {}
        }
        headers.push(Header {
            name: h.name.to_string(),
            lname,
            value: h.value.to_vec(),
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
    let keepalive = match &connection {
        Some(c) if contains_token(c, b"close") => false,
        Some(c) if contains_token(c, b"keep-alive") => true,
        _ => minor >= 1,
    };
    Ok(Request {
        method,
        method_raw,
        minor,
        line: line.to_vec(),
        raw_uri: raw_target.to_vec(),
        uri: path,
        args,
        headers,
        host,
        content_length,
        chunked,
        keepalive,
        expect_continue: expect_continue && minor >= 1,
        head_len,
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
    v.split(|&c| c == b',').any(|t| t.trim_ascii() == tok)
}

fn trim_cr(l: &[u8]) -> &[u8] {
    l.strip_suffix(b"\r").unwrap_or(l)
}

/// nginx's host validation: lowercase, strip the port and a trailing dot,
/// refuse `..`, `/` and NUL; an empty host is invalid.
pub fn validate_host(h: &[u8]) -> Option<Vec<u8>> {
    let h = h.trim_ascii();
    let mut out = Vec::with_capacity(h.len());
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
    out.extend(host.iter().map(u8::to_ascii_lowercase));
    Some(out)
}
