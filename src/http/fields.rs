//! The protocol-neutral [`Request`] built straight from a field list: the
//! pseudo-headers and name/value pairs of an HTTP/2 or HTTP/3 HEADERS, as
//! the `h2` and `h3` crates decode them. No HTTP/1 text is built or
//! parsed on the way (an h2 request used to be written out as an HTTP/1
//! head and read again by `v1::parse::parse_head`).
//!
//! The checks are the ones nginx makes on such a request (and the ones
//! `parse_head` makes on an HTTP/1 head, where they mean the same): the
//! method's characters, the target, `:authority` against Host, a Host
//! that validates, Content-Length and Authorization at most once,
//! TRACE and CONNECT refused with 405. What comes before (upper-case
//! names, connection-specific fields, the pseudo-headers' rules) is
//! judged by the protocol: `v2::conn` (nginx's checks, from the fields
//! tern decodes itself), the h3 crate for HTTP/3.
//!
//! Layout of the request's one buffer: the request line as nginx builds
//! it for these protocols (`METHOD TARGET HTTP/2.0`, for `$request`),
//! then each field's name and value back to back, `:authority` as a Host
//! field when the request has none, the cookies joined into one field
//! with `; ` (as nginx joins them), then what parsing derives (a
//! normalised path, a lowercased host). Every part is a range of it.

use crate::http::conf::SrvConf;
use crate::http::request::{is_method_char, name_is, validate_host, Hdr, Method, Request, Span};
use crate::http::uri;
use crate::http::v1::parse::{valid_header_name, Reject};

/// The pseudo-headers of a request.
#[derive(Debug, Clone, Copy)]
pub struct Pseudo<'a> {
    /// `:method`.
    pub method: &'a [u8],
    /// `:path` (path and query); empty when there is none (CONNECT), then
    /// the target is `/`.
    pub path: &'a [u8],
    /// `:authority`.
    pub authority: Option<&'a [u8]>,
}

fn refuse(status: u16, log: &'static str, line: &[u8]) -> Reject {
    Reject {
        status,
        log,
        line: Some(line.to_vec()),
        in_headers: true,
        ..Default::default()
    }
}

/// Span of `buf[start..]`, appended last.
fn tail(buf: &[u8], start: usize) -> Span {
    Span {
        start: start as u32,
        end: buf.len() as u32,
    }
}

/// Appends `bytes` to `buf` and returns their range.
fn push(buf: &mut Vec<u8>, bytes: &[u8]) -> Span {
    let start = buf.len();
    buf.extend_from_slice(bytes);
    tail(buf, start)
}

/// Builds the request from its pseudo-headers and fields (in the order
/// they came: `fields()` walks them, and is called more than once).
/// `proto` names the protocol (`HTTP/2.0`, `$server_protocol`).
pub fn request<'f, F, I>(
    p: Pseudo<'_>,
    fields: F,
    proto: &[u8],
    srv: &SrvConf,
) -> Result<Request, Reject>
where
    F: Fn() -> I,
    I: Iterator<Item = (&'f [u8], &'f [u8])>,
{
    let target: &[u8] = if p.path.is_empty() { b"/" } else { p.path };
    // The first pass: the buffer's size (one allocation), whether a Host
    // field came, and the cookies' share.
    let mut size = p.method.len() + target.len() + proto.len() + 2;
    let mut host_field: Option<&[u8]> = None;
    let mut count = 0;
    let mut cookies = 0;
    for (n, v) in fields() {
        size += n.len() + v.len();
        count += 1;
        if n == b"cookie" {
            cookies += 1;
            size += 2;
        } else if host_field.is_none() && n == b"host" {
            host_field = Some(v);
        }
    }
    if let (None, Some(a)) = (host_field, p.authority) {
        size += 4 + a.len();
    }
    // Derived parts (a normalised path, a lowercased host) may follow.
    size += 16;
    if size > (u32::MAX / 4) as usize {
        return Err(refuse(400, "client sent invalid request", b""));
    }
    let mut buf = Vec::with_capacity(size);
    let method_raw = push(&mut buf, p.method);
    buf.push(b' ');
    let target_span = push(&mut buf, target);
    buf.push(b' ');
    let proto_span = push(&mut buf, proto);
    let line = Span {
        start: 0,
        end: proto_span.end,
    };
    if p.method.is_empty() || !p.method.iter().all(|&c| is_method_char(c)) {
        return Err(refuse(400, "client sent invalid method", line.get(&buf)));
    }
    // As parse_line: a target that starts with `/` (or a scheme) and holds
    // no space or control.
    let target_ok = matches!(target.first(), Some(c) if *c == b'/' || c.is_ascii_alphabetic())
        && !target.iter().any(|&c| c <= b' ' || c == 0x7f);
    if !target_ok {
        return Err(refuse(400, "client sent invalid request", line.get(&buf)));
    }
    if let (Some(a), Some(h)) = (p.authority, host_field) {
        if !a.eq_ignore_ascii_case(h) {
            return Err(refuse(
                400,
                "client sent \":authority\" and \"Host\" headers with different values",
                line.get(&buf),
            ));
        }
    }
    let method = match p.method {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        b"POST" => Method::Post,
        b"PUT" => Method::Put,
        b"DELETE" => Method::Delete,
        b"OPTIONS" => Method::Options,
        _ => Method::Other,
    };
    let underscores = srv.underscores_in_headers.unwrap_or(false);
    let ignore_invalid = srv.ignore_invalid_headers.unwrap_or(true);
    let mut headers = Vec::with_capacity(count + usize::from(host_field.is_none()));
    let mut invalid = Vec::new();
    let mut host: Option<Span> = None;
    let mut seen_host = false;
    let mut content_length: Option<u64> = None;
    let mut te: Option<Span> = None;
    let mut seen_authorization = false;
    if let (None, Some(a)) = (host_field, p.authority) {
        let name = push(&mut buf, b"host");
        let value = push(&mut buf, a);
        headers.push(Hdr { name, value });
    }
    for (n, v) in fields() {
        if n == b"cookie" {
            continue;
        }
        let name = push(&mut buf, n);
        let value = push(&mut buf, v);
        if !valid_header_name(n, underscores) && ignore_invalid {
            invalid.push(name);
            continue;
        }
        headers.push(Hdr { name, value });
        let bad = |log| Err(refuse(400, log, line.get(&buf)));
        if n == b"content-length" {
            if content_length.is_some() {
                return bad("client sent duplicate header line");
            }
            let s = std::str::from_utf8(v).ok().map(str::trim);
            match s
                .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                .and_then(|s| s.parse::<i64>().ok())
            {
                Some(len) => content_length = Some(len as u64),
                None => return bad("client sent invalid \"Content-Length\" header"),
            }
        } else if n == b"transfer-encoding" {
            if te.is_some() {
                return bad("client sent duplicate header line");
            }
            te = Some(value);
        } else if n == b"authorization" {
            // nginx keeps one Authorization header (auth_basic, $remote_user).
            if seen_authorization {
                return bad("client sent duplicate header line");
            }
            seen_authorization = true;
        }
    }
    // `:authority` stands for Host when none came; a Host field (equal
    // to it, checked above) is the one validated otherwise.
    for h in &headers {
        if !name_is(h.name.get(&buf), "host") {
            continue;
        }
        if seen_host {
            return Err(refuse(
                400,
                "client sent duplicate host header",
                line.get(&buf),
            ));
        }
        seen_host = true;
        let v = h.value.get(&buf);
        let Some(valid) = validate_host(v) else {
            let mut r = refuse(400, "client sent invalid host header", line.get(&buf));
            r.host = Some(v.to_vec());
            return Err(r);
        };
        host = Span::within(&buf, valid);
    }
    if cookies > 0 {
        let name = push(&mut buf, b"cookie");
        let start = buf.len();
        for (i, (_, v)) in fields().filter(|(n, _)| *n == b"cookie").enumerate() {
            if i > 0 {
                buf.extend_from_slice(b"; ");
            }
            buf.extend_from_slice(v);
        }
        headers.push(Hdr {
            name,
            value: tail(&buf, start),
        });
    }
    if p.method == b"TRACE" || p.method == b"CONNECT" {
        let mut r = refuse(
            405,
            if p.method == b"TRACE" {
                "client sent TRACE method"
            } else {
                "client sent CONNECT method"
            },
            line.get(&buf),
        );
        r.host = host.map(|h| h.get(&buf).to_vec());
        return Err(r);
    }
    let merge = srv.merge_slashes.unwrap_or(true);
    let (raw_uri, args, path) = {
        let raw_target = target_span.get(&buf);
        let bad = |log| refuse(400, log, line.get(&buf));
        let t = uri::split_target(raw_target).map_err(|_| bad("client sent invalid request"))?;
        // An absolute target (h2 clients send a `:path` that starts with
        // `/`): its host wins, `$request_uri` starts at its path.
        let raw_uri = match t.host {
            Some(h) => {
                let valid = validate_host(h)
                    .ok_or_else(|| bad("client sent invalid host in request line"))?;
                host = Span::within(&buf, valid);
                let from = (h.as_ptr() as usize - raw_target.as_ptr() as usize) + h.len();
                Span::within(&buf, &raw_target[from..]).unwrap_or_default()
            }
            None => target_span,
        };
        let args = t.query.and_then(|q| Span::within(&buf, q));
        // The path as sent when normalising would not change it (the
        // usual case); else its normalised copy, appended below.
        let path = match Span::within(&buf, t.path) {
            Some(p) if uri::is_normal(t.path, merge) => Ok(p),
            _ => Err(uri::normalize_path(t.path, merge)
                .map_err(|_| bad("client sent invalid request"))?),
        };
        (raw_uri, args, path)
    };
    if host.is_none() {
        return Err(refuse(
            400,
            "client sent HTTP/1.1 request without \"Host\" header",
            line.get(&buf),
        ));
    }
    let uri = match path {
        Ok(s) => s,
        Err(normalised) => push(&mut buf, &normalised),
    };
    let mut chunked = false;
    if let Some(te) = te {
        let line = line.get(&buf);
        if !te.get(&buf).eq_ignore_ascii_case(b"chunked") {
            return Err(refuse(
                501,
                "client sent unknown \"Transfer-Encoding\"",
                line,
            ));
        }
        if content_length.is_some() {
            return Err(refuse(
                400,
                "client sent \"Content-Length\" and \"Transfer-Encoding\" headers at the same time",
                line,
            ));
        }
        chunked = true;
    }
    let host = match host {
        Some(h) if h.get(&buf).iter().any(u8::is_ascii_uppercase) => {
            let start = buf.len();
            buf.extend_from_within(h.range());
            buf[start..].make_ascii_lowercase();
            Some(tail(&buf, start))
        }
        h => h,
    };
    if u32::try_from(buf.len()).is_err() {
        return Err(refuse(400, "client sent invalid request", b""));
    }
    Ok(Request {
        method,
        minor: 1,
        http09: false,
        content_length,
        chunked,
        keepalive: false,
        expect_continue: false,
        head_len: 0,
        buf,
        method_raw,
        line,
        raw_uri,
        proto: proto_span,
        uri,
        args,
        host,
        headers,
        invalid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(
        method: &str,
        path: &str,
        authority: Option<&str>,
        fields: &[(&str, &str)],
    ) -> Result<Request, Reject> {
        let f: Vec<(&[u8], &[u8])> = fields
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
            .collect();
        request(
            Pseudo {
                method: method.as_bytes(),
                path: path.as_bytes(),
                authority: authority.map(str::as_bytes),
            },
            || f.iter().copied(),
            b"HTTP/2.0",
            &SrvConf::default(),
        )
    }

    #[test]
    fn parts_are_ranges_of_one_buffer() {
        let r = build(
            "GET",
            "/a/./b//c.txt?x=1",
            Some("Example.COM:8443"),
            &[
                ("user-agent", "t"),
                ("cookie", "a=1"),
                ("accept", "*/*"),
                ("cookie", "b=2"),
            ],
        )
        .unwrap();
        assert_eq!(r.line(), b"GET /a/./b//c.txt?x=1 HTTP/2.0");
        assert_eq!(r.proto(), b"HTTP/2.0");
        assert_eq!(r.method_raw(), "GET");
        assert_eq!(r.method, Method::Get);
        assert_eq!(r.raw_uri(), b"/a/./b//c.txt?x=1");
        assert_eq!(r.uri(), b"/a/b/c.txt");
        assert_eq!(r.args(), Some(&b"x=1"[..]));
        assert_eq!(r.host(), Some(&b"example.com"[..]));
        // `:authority` as Host first, the cookies joined last.
        let all: Vec<(&[u8], &[u8])> = r.headers().map(|h| (h.name, h.value)).collect();
        assert_eq!(
            all,
            [
                (&b"host"[..], &b"Example.COM:8443"[..]),
                (b"user-agent", b"t"),
                (b"accept", b"*/*"),
                (b"cookie", b"a=1; b=2"),
            ]
        );
        assert!(!r.keepalive && !r.chunked && r.content_length.is_none());
    }

    #[test]
    fn host_field_and_authority() {
        let r = build("GET", "/", None, &[("host", "h.example")]).unwrap();
        assert_eq!(r.host(), Some(&b"h.example"[..]));
        assert_eq!(r.headers().count(), 1);
        let r = build("GET", "/", Some("H.example"), &[("host", "h.EXAMPLE")]).unwrap();
        assert_eq!(r.host(), Some(&b"h.example"[..]));
        let e = build("GET", "/", Some("a"), &[("host", "b")]).unwrap_err();
        assert_eq!(
            e.log,
            "client sent \":authority\" and \"Host\" headers with different values"
        );
        let e = build("GET", "/", None, &[]).unwrap_err();
        assert_eq!(
            e.log,
            "client sent HTTP/1.1 request without \"Host\" header"
        );
        for bad in ["", "a/b", "a..b", "x\x02"] {
            let e = build("GET", "/", Some(bad), &[]).unwrap_err();
            assert_eq!((e.status, e.log), (400, "client sent invalid host header"));
        }
        let e = build("GET", "/", None, &[("host", "a"), ("host", "a")]).unwrap_err();
        assert_eq!(e.log, "client sent duplicate host header");
    }

    #[test]
    fn nginx_refusals() {
        let e = build("get", "/", Some("h"), &[]).unwrap_err();
        assert_eq!((e.status, e.log), (400, "client sent invalid method"));
        assert_eq!(e.line.as_deref(), Some(&b"get / HTTP/2.0"[..]));
        let e = build("CONNECT", "", Some("h:443"), &[]).unwrap_err();
        assert_eq!((e.status, e.log), (405, "client sent CONNECT method"));
        let e = build("TRACE", "/", Some("h"), &[]).unwrap_err();
        assert_eq!(e.status, 405);
        let e = build("GET", "/a\x02", Some("h"), &[]).unwrap_err();
        assert_eq!(e.status, 400);
        let e = build("GET", "/../x", Some("h"), &[]).unwrap_err();
        assert_eq!((e.status, e.log), (400, "client sent invalid request"));
        let e = build("POST", "/", Some("h"), &[("content-length", "x")]).unwrap_err();
        assert_eq!(e.log, "client sent invalid \"Content-Length\" header");
        let e = build(
            "POST",
            "/",
            Some("h"),
            &[("content-length", "1"), ("content-length", "1")],
        )
        .unwrap_err();
        assert_eq!(e.log, "client sent duplicate header line");
        let r = build("POST", "/", Some("h"), &[("content-length", "12")]).unwrap();
        assert_eq!(r.content_length, Some(12));
    }

    #[test]
    fn invalid_names_are_left_out() {
        let r = build("GET", "/", Some("h"), &[("x_a", "1"), ("x-b", "2")]).unwrap();
        assert_eq!(r.header("x_a"), None);
        assert_eq!(r.header("x-b"), Some(&b"2"[..]));
        assert_eq!(r.invalid_lines().collect::<Vec<_>>(), [&b"x_a"[..]]);
        let srv = SrvConf {
            underscores_in_headers: Some(true),
            ..SrvConf::default()
        };
        let f: [(&[u8], &[u8]); 1] = [(b"x_a", b"1")];
        let p = Pseudo {
            method: b"GET",
            path: b"/",
            authority: Some(b"h"),
        };
        let r = request(p, || f.iter().copied(), b"HTTP/2.0", &srv).unwrap();
        assert_eq!(r.header("x_a"), Some(&b"1"[..]));
    }
}
