//! The HTTP/1 response head: the status line, the fields every protocol
//! sends ([`response::fixed_fields`]), then HTTP/1's own
//! (`Transfer-Encoding`, `Connection`, `Keep-Alive`), then the rest.

use crate::http::conf::LocConf;
use crate::http::response::{self, Response};
use crate::http::status;

/// Whether the body goes out with chunked transfer-encoding: its length is
/// unknown, the request is HTTP/1.1, `chunked_transfer_encoding` is on, and
/// the status is not an interim one (nginx's chunked filter leaves those
/// alone: an upstream's `000`, a FastCGI `Status: 100`).
pub fn chunked(resp: &Response, minor: u8, loc: &LocConf) -> bool {
    resp.length_unknown()
        && minor == 1
        && loc.core.chunked_transfer_encoding.unwrap_or(true)
        && resp.status >= 200
}

/// A body of unknown length that is not chunked to an HTTP/1.1 client
/// (chunked_transfer_encoding off, a status below 100 such as an
/// upstream's `000`): it goes as it is, ended by the close.
pub fn unframed(resp: &Response, minor: u8, loc: &LocConf) -> bool {
    // An interim status (a proxied 101 without an upgrade) is neither
    // chunked nor closed after: its body runs as it is.
    resp.length_unknown()
        && minor == 1
        && !(100..200).contains(&resp.status)
        && !chunked(resp, minor, loc)
}

/// Serialises the head. `minor` is the request's HTTP minor version (9
/// for HTTP/0.9, which gets no head at all).
pub fn write_head(out: &mut Vec<u8>, resp: &Response, loc: &LocConf, minor: u8, keepalive: bool) {
    if minor == 9 {
        return;
    }
    // nginx answers 1.0 and 1.1 requests with an HTTP/1.1 status line.
    let code = match resp.status {
        494..=497 => 400,
        c => c,
    };
    out.extend_from_slice(b"HTTP/1.1 ");
    match &resp.status_line {
        Some((c, line)) if *c == resp.status => out.extend_from_slice(line),
        _ => {
            response::push_num(out, code as u64);
            out.push(b' ');
            if let Some(r) = status::reason(code) {
                out.extend_from_slice(r.as_bytes());
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    response::fixed_fields(resp, loc, |n, v| {
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    });
    if chunked(resp, minor, loc) {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    if resp.status == 101 {
        // nginx says so on any 101, whether the connection is upgraded
        // or not (and then may still keep it alive).
        out.extend_from_slice(b"Connection: upgrade\r\n");
    } else if keepalive {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
        if let Some(ka) = loc.core.keepalive.and_then(|k| k.header_secs) {
            out.extend_from_slice(b"Keep-Alive: timeout=");
            response::push_num(out, ka);
            out.extend_from_slice(b"\r\n");
        }
    } else {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    for (n, v) in &resp.headers {
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}
