//! Parsing an HTTP/1.x head into a [`Request`], with the checks nginx
//! makes on it.
//!
//! [`parse_head`] turns the bytes of a complete head (request line and
//! headers) into a [`Request`] with `httparse`, then applies nginx's rules:
//! Host required for HTTP/1.1 and validated, `Content-Length` and
//! `Transfer-Encoding` checked against request smuggling, the target split
//! and normalised into `$uri` and `$args`. [`parse_line`] checks a request
//! line as it arrives, so a bad one is refused at once.

use crate::http::conf::SrvConf;
use crate::http::request::{is_method_char, name_is, validate_host, Hdr, Method, Request, Span};
use crate::http::uri;

/// Why a head was refused: the status to answer and the error-log text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reject {
    pub status: u16,
    pub log: &'static str,
    /// The request line, when it was parsed (for the log line and `$request`).
    pub line: Option<Vec<u8>>,
    /// Refused while reading the headers (else the request line): nginx
    /// says which in the error log, and then knows the Host.
    pub in_headers: bool,
    /// The Host header, when one was read (server choice and the log).
    pub host: Option<Vec<u8>>,
    /// Refused as an HTTP/0.9 request: the answer has no head.
    pub http09: bool,
    /// What follows the message in quotes (the bad header line).
    pub detail: Option<Vec<u8>>,
    /// The request line arrived behind the previous request's bytes.
    pub pipelined: bool,
}

fn reject(status: u16, log: &'static str, line: Option<&[u8]>) -> Reject {
    Reject {
        status,
        log,
        line: line.map(<[u8]>::to_vec),
        in_headers: line.is_some(),
        ..Default::default()
    }
}

/// A refusal of the request line: `buf` is what has arrived of it, and
/// nginx logs the line as far as it goes.
fn line_reject(status: u16, log: &'static str, buf: &[u8]) -> Reject {
    // (As far as it goes: to the first CR or LF, or all that came.)
    let line = memchr::memchr2(b'\r', b'\n', buf).map_or(buf, |end| &buf[..end]);
    Reject {
        status,
        log,
        line: Some(line.to_vec()),
        ..Default::default()
    }
}

/// A header name nginx accepts: letters, digits, `-`, and `_` with
/// `underscores_in_headers`; others are invalid (left out, or kept with
/// `ignore_invalid_headers off`).
pub(crate) fn valid_header_name(name: &[u8], underscores: bool) -> bool {
    name.iter()
        .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || (c == b'_' && underscores))
}

/// The parts of a request line, as offsets into the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    method_end: usize,
    target: (usize, usize),
    /// `HTTP/...` up to the line end; None for HTTP/0.9.
    proto: Option<(usize, usize)>,
    /// 0, 1 (any 1.x above 1.0 is served as 1.1) or 9.
    pub minor: u8,
    /// The end of the line's text (before CR LF).
    text_end: usize,
    /// Where the headers start (after the line's LF).
    pub next: usize,
}

/// Parses the request line at the start of `buf` by nginx's rules: a
/// method of upper-case letters, `_` and `-`; one or more spaces; a target
/// that starts with `/` or a scheme and holds no controls or spaces; and
/// either the line end (HTTP/0.9, GET only) or spaces, `HTTP/1.N` and
/// optional spaces. A major version above 1 is 505; anything else wrong
/// is 400. `Ok(None)`: valid so far, the line has not ended yet (so a
/// connection can be refused as soon as its first bytes are wrong).
pub fn parse_line(buf: &[u8]) -> Result<Option<Line>, Reject> {
    let bad = |log| Err(line_reject(400, log, buf));
    let method_end = buf
        .iter()
        .position(|&c| !is_method_char(c))
        .unwrap_or(buf.len());
    let Some(&after_method) = buf.get(method_end) else {
        return Ok(None);
    };
    if method_end == 0 || after_method != b' ' {
        return bad("client sent invalid method");
    }
    let mut i = method_end;
    while buf.get(i) == Some(&b' ') {
        i += 1;
    }
    match buf.get(i) {
        None => return Ok(None),
        Some(c) if *c == b'/' || c.is_ascii_alphabetic() => {}
        Some(_) => return bad("client sent invalid request"),
    }
    let target_start = i;
    while let Some(&c) = buf.get(i) {
        if c == b' ' || c == b'\r' || c == b'\n' {
            break;
        }
        if c < 0x20 || c == 0x7f {
            return bad("client sent invalid request");
        }
        i += 1;
    }
    let target = (target_start, i);
    while buf.get(i) == Some(&b' ') {
        i += 1;
    }
    // The line end: LF or CR LF; None while it has not arrived.
    let eol = |j: usize| -> Result<Option<usize>, Reject> {
        match (buf.get(j), buf.get(j + 1)) {
            (Some(b'\n'), _) => Ok(Some(j + 1)),
            (Some(b'\r'), Some(b'\n')) => Ok(Some(j + 2)),
            (Some(b'\r'), None) | (None, _) => Ok(None),
            _ => Err(line_reject(400, "client sent invalid request", buf)),
        }
    };
    match buf.get(i) {
        None => return Ok(None),
        Some(b'\r') | Some(b'\n') => {
            let Some(next) = eol(i)? else { return Ok(None) };
            if &buf[..method_end] != b"GET" {
                let mut r = line_reject(400, "client sent invalid method in HTTP/0.9 request", buf);
                r.http09 = true;
                return Err(r);
            }
            return Ok(Some(Line {
                method_end,
                target,
                proto: None,
                minor: 9,
                text_end: target.1,
                next,
            }));
        }
        Some(_) => {}
    }
    let proto_start = i;
    let rest = &buf[i..];
    if rest.len() < 5 {
        return if b"HTTP/".starts_with(rest) {
            Ok(None)
        } else {
            bad("client sent invalid request")
        };
    }
    if !rest.starts_with(b"HTTP/") {
        return bad("client sent invalid request");
    }
    i += 5;
    match buf.get(i) {
        None => return Ok(None),
        Some(b'1'..=b'9') => {}
        Some(_) => return bad("client sent invalid request"),
    }
    let mut major: u32 = 0;
    while let Some(c @ b'0'..=b'9') = buf.get(i) {
        major = (major * 10 + u32::from(c - b'0')).min(1000);
        i += 1;
    }
    if major > 1 {
        // nginx refuses it as soon as the major version is known.
        return Err(line_reject(505, "client sent invalid version", buf));
    }
    match buf.get(i) {
        None => return Ok(None),
        Some(b'.') => i += 1,
        Some(_) => return bad("client sent invalid request"),
    }
    let minor_start = i;
    let mut minor: u32 = 0;
    while let Some(c @ b'0'..=b'9') = buf.get(i) {
        minor = (minor * 10 + u32::from(c - b'0')).min(1000);
        i += 1;
    }
    if i == buf.len() {
        return Ok(None);
    }
    if i == minor_start {
        return bad("client sent invalid request");
    }
    while buf.get(i) == Some(&b' ') {
        i += 1;
    }
    let text_end = i;
    match eol(i)? {
        None => Ok(None),
        Some(next) => Ok(Some(Line {
            method_end,
            target,
            proto: Some((proto_start, text_end)),
            minor: minor.min(1) as u8,
            text_end,
            next,
        })),
    }
}

/// One header line as nginx reads it, or why it is refused.
enum HeaderLine<'b> {
    Header(&'b [u8], &'b [u8]),
    /// A name with characters nginx does not accept (left out under
    /// `ignore_invalid_headers`): the whole line.
    Invalid(&'b [u8], &'b [u8], &'b [u8]),
}

/// A refusal carries nginx's report of the line and the Host read before it.
type LenientError<'b> = (Vec<u8>, Option<&'b [u8]>);

/// Reads the header lines of `block` (ending with the blank line) by
/// nginx's rules, for heads httparse refuses: a name may not hold spaces,
/// controls or NUL (400); other characters outside letters, digits, `-`
/// (and `_` with `underscores_in_headers`) make the line invalid; a line
/// without a colon is a header with an empty value; a value may hold any
/// byte but NUL, CR and LF; a line may not start with white space.
fn lenient_headers(
    block: &[u8],
    underscores: bool,
) -> Result<Vec<HeaderLine<'_>>, LenientError<'_>> {
    // nginx's report of a refused line: what precedes the bad byte, the
    // byte in hex, and "...".
    let mut host = None;
    let refuse = |line: &[u8], at: usize, host| {
        let mut m = line[..at].to_vec();
        m.extend_from_slice(format!("\\x{:02x}...", line.get(at).copied().unwrap_or(0)).as_bytes());
        (m, host)
    };
    let mut out = Vec::new();
    let mut rest = block;
    loop {
        let nl = memchr::memchr(b'\n', rest).ok_or((Vec::new(), host))?;
        let line = trim_cr(&rest[..nl]);
        rest = &rest[nl + 1..];
        if line.is_empty() {
            return Ok(out);
        }
        let (name, value) = match memchr::memchr(b':', line) {
            Some(c) => (&line[..c], &line[c + 1..]),
            // (An empty value within the line: parts are ranges of the head.)
            None => (line, &line[line.len()..]),
        };
        if let Some(at) = name.iter().position(|&c| c <= 0x20 || c == 0x7f) {
            return Err(refuse(line, at, host));
        }
        if name.is_empty() {
            return Err(refuse(line, 0, host));
        }
        if let Some(at) = line.iter().position(|&c| c == b'\r' || c == 0) {
            return Err(refuse(line, at, host));
        }
        // Only spaces around a value are dropped, as nginx does.
        let from = value.iter().position(|&c| c != b' ').unwrap_or(value.len());
        let value = &value[from..];
        let value = match value.iter().rposition(|&c| c != b' ') {
            Some(e) => &value[..=e],
            None => &value[..0],
        };
        let valid = valid_header_name(name, underscores);
        if valid && host.is_none() && name_is(name, "host") {
            host = Some(value);
        }
        out.push(if valid {
            HeaderLine::Header(name, value)
        } else {
            HeaderLine::Invalid(name, value, line)
        });
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
    let line = match parse_line(buf)? {
        Some(l) => l,
        None => return Err(reject(400, "client sent invalid request", None)),
    };
    let line_text = &buf[..line.text_end];
    // HTTP/0.9 is served as 1.0 is (no keep-alive, no chunking), but
    // its answer has no head.
    let http09 = line.minor == 9;
    let minor = if http09 { 0 } else { line.minor };
    let head_len = buf.len();
    let method_raw = std::str::from_utf8(&buf[..line.method_end]).unwrap_or("");
    let method = match method_raw {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "OPTIONS" => Method::Options,
        _ => Method::Other,
    };
    let raw_target = &buf[line.target.0..line.target.1];
    // The slices below are of `buf`, so these always succeed.
    let in_head = |part: &[u8]| {
        Span::within(buf, part).ok_or_else(|| reject(400, "client sent invalid request", None))
    };
    let method_raw = in_head(method_raw.as_bytes())?;
    let line_span = in_head(line_text)?;
    let proto = match line.proto {
        Some((a, b)) => in_head(&buf[a..b])?,
        None => Span::default(),
    };
    let target = uri::split_target(raw_target).map_err(|_| {
        // "scheme://" with nothing before the path: nginx names the host.
        let empty_host = memchr::memmem::find(raw_target, b"://")
            .is_some_and(|i| matches!(raw_target.get(i + 3), None | Some(b'/' | b'?' | b':')));
        let log = if empty_host {
            "client sent invalid host in request line"
        } else {
            "client sent invalid request"
        };
        line_reject(400, log, buf)
    })?;
    // `$request_uri` starts at the path: an absolute-form target's scheme
    // and host are not part of it.
    let raw_uri = match target.host {
        Some(h) => {
            let from = (h.as_ptr() as usize - raw_target.as_ptr() as usize) + h.len();
            in_head(&raw_target[from..])?
        }
        None => in_head(raw_target)?,
    };
    let args = target.query.map(in_head).transpose()?;
    let merge = srv.merge_slashes.unwrap_or(true);
    // The path as sent when normalising would not change it (the usual
    // case); else its normalised copy, appended to the buffer below.
    let path = match Span::within(buf, target.path) {
        Some(p) if uri::is_normal(target.path, merge) => Ok(p),
        _ => Err(uri::normalize_path(target.path, merge)
            .map_err(|_| line_reject(400, "client sent invalid request", buf))?),
    };
    let mut host = match target.host {
        Some(h) => Some(in_head(validate_host(h).ok_or_else(|| {
            line_reject(400, "client sent invalid host in request line", buf)
        })?)?),
        None => None,
    };
    let underscores = srv.underscores_in_headers.unwrap_or(false);
    let ignore_invalid = srv.ignore_invalid_headers.unwrap_or(true);
    let block = &buf[line.next..];
    // httparse reads the usual head; what it refuses is read again by
    // nginx's more lenient rules (and refused only where nginx refuses).
    // The request line is parse_line's: httparse reads the header lines
    // after it, into a few initialised slots (the line parsed a second
    // time cost ~300 instructions a request). A head with more headers
    // goes through httparse whole, into 128 uninitialised slots (128
    // initialised ones would be a 4 KiB memset on every request).
    let mut few = [httparse::EMPTY_HEADER; 16];
    let mut hdrs = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; 128];
    let mut hreq = httparse::Request::new(&mut []);
    let mut parsed: Vec<HeaderLine<'_>> = Vec::new();
    let fast = if http09 {
        Some(&[][..])
    } else {
        match httparse::parse_headers(block, &mut few) {
            Ok(httparse::Status::Complete((_, h))) => Some(h),
            Err(httparse::Error::TooManyHeaders) => {
                match hreq.parse_with_uninit_headers(buf, &mut hdrs) {
                    Ok(httparse::Status::Complete(_)) => Some(&*hreq.headers),
                    _ => None,
                }
            }
            _ => None,
        }
    };
    let fast = match fast {
        Some(h) => h,
        None => {
            parsed = lenient_headers(block, underscores).map_err(|(detail, host)| {
                let mut r = reject(400, "client sent invalid header line", Some(line_text));
                r.detail = Some(detail);
                r.host = host.map(<[u8]>::to_vec);
                r
            })?;
            &[][..]
        }
    };
    let lines = fast
        .iter()
        .map(|h| {
            let name = h.name.as_bytes();
            if valid_header_name(name, underscores) {
                HeaderLine::Header(name, h.value)
            } else {
                // The whole line, from the name to the value's end.
                let end = h.value.as_ptr() as usize + h.value.len() - name.as_ptr() as usize;
                let whole = buf
                    .get(name.as_ptr() as usize - buf.as_ptr() as usize..)
                    .and_then(|b| b.get(..end))
                    .unwrap_or(name);
                HeaderLine::Invalid(name, h.value, whole)
            }
        })
        .chain(parsed);
    let mut headers = crate::http::request::spare_headers();
    headers.reserve(fast.len());
    let mut invalid = Vec::new();
    let mut content_length: Option<u64> = None;
    let mut te: Option<&[u8]> = None;
    let mut seen_host: Option<&[u8]> = None;
    let mut connection: Option<&[u8]> = None;
    let mut expect_continue = false;
    let mut seen_authorization = false;
    let hdr_reject = |log: &'static str, host: Option<&[u8]>| {
        let mut r = reject(400, log, Some(line_text));
        r.host = host.map(<[u8]>::to_vec);
        r
    };
    // The first of a header that may come once, for nginx's report of
    // the second: `"NAME: VALUE", previous value: "NAME: FIRST"`.
    let mut firsts: [Option<(&[u8], &[u8])>; 4] = [None; 4];
    // The first of each of the other headers nginx 1.22 keeps one of
    // (ngx_http_process_unique_header_line), by [`unique_slot`].
    let mut uniques: [Option<(&[u8], &[u8])>; 7] = [None; 7];
    let dup = |log: &'static str,
               first: Option<(&[u8], &[u8])>,
               name: &[u8],
               value: &[u8],
               host: Option<&[u8]>| {
        let mut r = hdr_reject(log, host);
        if let Some((n, v)) = first {
            let mut d = [name, b": ", value, b"\", previous value: \"", n, b": ", v].concat();
            d.shrink_to_fit();
            r.detail = Some(d);
        }
        r
    };
    for hl in lines {
        let (name, value) = match hl {
            HeaderLine::Header(n, v) => (n, v),
            HeaderLine::Invalid(n, v, whole) => {
                if ignore_invalid {
                    invalid.push(in_head(whole)?);
                    continue;
                }
                (n, v)
            }
        };
        if name_is(name, "host") {
            if seen_host.is_some() {
                return Err(dup(
                    "client sent duplicate host header",
                    firsts[0],
                    name,
                    value,
                    seen_host,
                ));
            }
            firsts[0] = Some((name, value));
            seen_host = Some(value);
            // nginx skips only spaces around a value: a tab there is
            // part of the host, which makes it invalid.
            let around = |a: usize, b: usize| buf.get(a..b).is_some_and(|g| g.contains(&b'\t'));
            let (n_end, v_start) = (
                name.as_ptr() as usize - buf.as_ptr() as usize + name.len(),
                value.as_ptr() as usize - buf.as_ptr() as usize,
            );
            let v_end = v_start + value.len();
            let line_end = memchr::memchr(b'\n', &buf[v_end..]).map_or(v_end, |i| v_end + i);
            if around(n_end, v_start) || around(v_end, line_end) {
                // nginx logs the value as it read it (tabs included).
                let raw = trim_cr(buf.get(n_end + 1..line_end).unwrap_or_default());
                let raw = &raw[raw.iter().take_while(|&&c| c == b' ').count()..];
                return Err(hdr_reject("client sent invalid host header", Some(raw)));
            }
            let v = validate_host(value)
                .ok_or_else(|| hdr_reject("client sent invalid host header", Some(value)))?;
            if host.is_none() {
                host = Some(in_head(v)?);
            }
        } else if name_is(name, "content-length") {
            if content_length.is_some() {
                return Err(dup(
                    "client sent duplicate header line",
                    firsts[1],
                    name,
                    value,
                    seen_host,
                ));
            }
            firsts[1] = Some((name, value));
            let s = std::str::from_utf8(value).ok().map(str::trim);
            let n = s
                .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| {
                    hdr_reject("client sent invalid \"Content-Length\" header", seen_host)
                })?;
            content_length = Some(n as u64);
        } else if name_is(name, "transfer-encoding") {
            if te.is_some() {
                return Err(dup(
                    "client sent duplicate header line",
                    firsts[2],
                    name,
                    value,
                    seen_host,
                ));
            }
            firsts[2] = Some((name, value));
            te = Some(value);
        } else if name_is(name, "connection") {
            connection = Some(value);
        } else if let Some(k) = unique_slot(name) {
            if uniques[k].is_some() {
                return Err(dup(
                    "client sent duplicate header line",
                    uniques[k],
                    name,
                    value,
                    seen_host,
                ));
            }
            uniques[k] = Some((name, value));
            if k == EXPECT_SLOT {
                expect_continue = value.eq_ignore_ascii_case(b"100-continue");
            }
        } else if name_is(name, "authorization") {
            // nginx keeps one Authorization header (auth_basic, $remote_user).
            if seen_authorization {
                return Err(dup(
                    "client sent duplicate header line",
                    firsts[3],
                    name,
                    value,
                    seen_host,
                ));
            }
            firsts[3] = Some((name, value));
            seen_authorization = true;
        }
        headers.push(Hdr {
            name: in_head(name)?,
            value: in_head(value)?,
        });
    }
    let line = line_text;
    // nginx refuses these once the headers are read (so the Host chose
    // the server that answers).
    if method_raw.get(buf) == b"TRACE" || method_raw.get(buf) == b"CONNECT" {
        let mut r = hdr_reject(
            if method_raw.get(buf) == b"TRACE" {
                "client sent TRACE method"
            } else {
                "client sent CONNECT method"
            },
            seen_host,
        );
        r.status = 405;
        return Err(r);
    }
    let host_hdr = seen_host;
    let seen_host = seen_host.is_some();
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
            let mut r = hdr_reject(
                "client sent HTTP/1.0 request with \"Transfer-Encoding\" header",
                host_hdr,
            );
            r.status = 400;
            return Err(r);
        }
        if !te.eq_ignore_ascii_case(b"chunked") {
            let mut r = hdr_reject("client sent unknown \"Transfer-Encoding\"", host_hdr);
            r.status = 501;
            return Err(r);
        }
        if content_length.is_some() {
            let mut r = hdr_reject(
                "client sent \"Content-Length\" and \"Transfer-Encoding\" headers at the same time",
                host_hdr,
            );
            r.status = 400;
            return Err(r);
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
        http09,
        content_length,
        chunked,
        keepalive,
        expect_continue: expect_continue && minor >= 1,
        head_len,
        buf: head,
        method_raw,
        line: line_span,
        raw_uri,
        proto,
        uri,
        args,
        host,
        headers,
        invalid,
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

fn contains_token(v: &[u8], tok: &[u8]) -> bool {
    v.split(|&c| c == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(tok))
}

fn trim_cr(l: &[u8]) -> &[u8] {
    l.strip_suffix(b"\r").unwrap_or(l)
}

/// `Expect`'s place among [`unique_slot`]'s.
const EXPECT_SLOT: usize = 0;

/// The request headers besides Host, Content-Length, Transfer-Encoding
/// and Authorization that nginx 1.22 accepts once (a second is a 400):
/// their place in the parser's table, by length first.
fn unique_slot(name: &[u8]) -> Option<usize> {
    let is = |l: &str| name.eq_ignore_ascii_case(l.as_bytes());
    match name.len() {
        6 if is("expect") => Some(EXPECT_SLOT),
        8 if is("if-match") => Some(1),
        8 if is("if-range") => Some(2),
        13 if is("if-none-match") => Some(3),
        13 if is("content-range") => Some(4),
        17 if is("if-modified-since") => Some(5),
        19 if is("if-unmodified-since") => Some(6),
        _ => None,
    }
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
        // `$request_uri` is from the path on: empty here, as nginx has it.
        assert_eq!(r.raw_uri(), b"");
        let r = parse("GET ftp://h:81/p?q HTTP/1.1\r\nHost: bar\r\n\r\n").unwrap();
        assert_eq!(r.raw_uri(), b"/p?q");
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
