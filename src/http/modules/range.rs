//! `max_ranges` and `Range`/`If-Range`: the range filter (206, multipart,
//! 416), last of the header filters.
//!
//! A response is eligible when it is a 200 with a known length, was marked
//! rangeable by its handler (it carries `Accept-Ranges`, nginx's
//! `allow_ranges`) and no body filter rewrites it (gzip drops
//! `Accept-Ranges` as nginx does). Then, as nginx 1.22:
//!
//! * `max_ranges 0`: no ranges and no `Accept-Ranges` header.
//! * No `Range: bytes=...` (prefix case-insensitive), or an `If-Range` that
//!   is neither the exact ETag (a value ending in `"`) nor the exact
//!   Last-Modified date: 200 with `Accept-Ranges: bytes` (moved after the
//!   headers of `add_header`, where nginx adds it).
//! * A syntax error, or no range inside the body: 416 with
//!   `Content-Range: bytes */LEN` and the error page.
//! * More than `max_ranges` ranges, or ranges adding up to more than the
//!   body: the whole body (200).
//! * One range: 206, `Content-Range: bytes S-E/LEN`, the body cut to it.
//! * Several: 206 `multipart/byteranges; boundary=B` with B a 20-digit
//!   counter shared by the process (nginx's temp number), the parts in the
//!   order asked, each `CRLF--B CRLF Content-Type: T CRLF Content-Range:
//!   bytes S-E/LEN CRLF CRLF data`, then `CRLF--B-- CRLF`.
//!
//! A proxied response is eligible only from the cache, while being cached
//! (one range at most) or under `proxy_force_ranges` (one range at most);
//! otherwise it passes untouched ([`Response::ranges_off`]), as nginx.
//!
//! It finally applies nginx's chunked-filter rule for trailers
//! ([`super::headers::force_chunked_for_trailers`]), which in nginx runs
//! right after this filter.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::registry::{arg, ctx, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::date::parse_http_date;
use crate::http::phases::Ctx;
use crate::http::response::{self, Body, Piece, Response};

#[derive(Debug, Clone, Default)]
pub struct RangeLoc {
    /// `max_ranges N`; unset = unlimited.
    pub max_ranges: Option<u64>,
}

impl RangeLoc {
    pub fn merge(&mut self, p: &RangeLoc) {
        if self.max_ranges.is_none() {
            self.max_ranges = p.max_ranges;
        }
    }
}

fn set_max_ranges(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = value::number(arg(d, 0))
        .ok_or_else(|| ConfError::at("\"max_ranges\" directive invalid number", d))?;
    set_once(&mut l.modules.range.max_ranges, n, d)
}

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "max_ranges",
    ctx: ctx::HSL,
    args: Args::take(1),
    set: Setter::Loc(set_max_ranges),
}];

/// nginx's temp-number counter: the first multipart boundary is 1.
static BOUNDARY: AtomicU64 = AtomicU64::new(0);

/// Header filter (see `phases::HEADER_FILTERS` for the order).
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    ranges(cx, resp);
    super::headers::force_chunked_for_trailers(cx, resp);
}

/// The outcome of parsing a `Range` value against a body length.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// Half-open `[start, end)` ranges, in request order.
    Ranges(Vec<(u64, u64)>),
    /// Serve the whole body.
    Whole,
    Unsatisfiable,
}

fn ranges(cx: &mut Ctx<'_>, resp: &mut Response) {
    // Names as tern writes them: found without case folding (see
    // response::name_eq).
    if resp.status != 200 || resp.ranges_off || resp.header("Accept-Ranges").is_none() {
        return;
    }
    let Some(len) = resp.content_length else {
        return;
    };
    if !resp.filters.iter().all(|f| f.keeps_positions()) {
        return;
    }
    let max = cx.loc.modules.range.max_ranges;
    if max == Some(0) {
        resp.remove_header("Accept-Ranges");
        return;
    }
    let parsed = match cx.req.header("range") {
        Some(v) if v.len() >= 7 && v[..6].eq_ignore_ascii_case(b"bytes=") => {
            if if_range_allows(cx, resp) {
                let most = if resp.single_range {
                    1
                } else {
                    max.unwrap_or(u64::MAX)
                };
                parse(&v[6..], len, most)
            } else {
                Parsed::Whole
            }
        }
        _ => Parsed::Whole,
    };
    let parsed = match parsed {
        // A body still arriving is cut to one range as it passes; several
        // are never asked of one (single_range), but would need it whole.
        Parsed::Ranges(r) if r.len() > 1 && matches!(resp.body, Body::Stream(_)) => Parsed::Whole,
        p => p,
    };
    match parsed {
        Parsed::Whole => {
            // nginx adds Accept-Ranges here, after the add_header headers.
            if let Some(i) = resp
                .headers
                .iter()
                .position(|(n, _)| response::name_eq(n, "Accept-Ranges"))
            {
                resp.headers[i..].rotate_left(1);
            }
        }
        Parsed::Unsatisfiable => unsatisfiable(cx, resp, len),
        Parsed::Ranges(r) => {
            resp.remove_header("accept-ranges");
            resp.status = 206;
            if let [(s, e)] = r[..] {
                single(resp, s, e, len);
            } else {
                multi(resp, &r, len);
            }
        }
    }
}

/// `If-Range`: a quoted value must equal the ETag, anything else must be
/// the exact Last-Modified date.
fn if_range_allows(cx: &Ctx<'_>, resp: &Response) -> bool {
    let Some(v) = cx.req.header("if-range") else {
        return true;
    };
    if_range_matches(v, resp.header("etag"), resp.last_modified)
}

/// Whether an `If-Range` value `v` names this response: its exact ETag
/// when `v` is quoted, else its exact Last-Modified date.
pub(crate) fn if_range_matches(v: &[u8], etag: Option<&[u8]>, last_modified: Option<i64>) -> bool {
    if v.len() >= 2 && v.ends_with(b"\"") {
        return etag == Some(v);
    }
    match last_modified {
        Some(lm) => parse_http_date(v) == Some(lm),
        None => false,
    }
}

/// Parses the part after `bytes=`. Spaces are allowed around numbers and
/// dashes; anything else malformed makes the request unsatisfiable.
pub(crate) fn parse(v: &[u8], len: u64, max_ranges: u64) -> Parsed {
    const LIMIT: u64 = i64::MAX as u64;
    let mut p = 0;
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let skip_sp = |mut i: usize| {
        while at(i) == b' ' {
            i += 1;
        }
        i
    };
    let number = |i: &mut usize| -> Option<u64> {
        let mut n: u64 = 0;
        while at(*i).is_ascii_digit() {
            n = n.checked_mul(10)?.checked_add(u64::from(at(*i) - b'0'))?;
            if n > LIMIT {
                return None;
            }
            *i += 1;
        }
        Some(n)
    };
    let mut out = Vec::new();
    let mut total: u64 = 0;
    let mut left = max_ranges;
    loop {
        p = skip_sp(p);
        let (start, end);
        if at(p) != b'-' {
            if !at(p).is_ascii_digit() {
                return Parsed::Unsatisfiable;
            }
            let Some(s) = number(&mut p) else {
                return Parsed::Unsatisfiable;
            };
            p = skip_sp(p);
            if at(p) != b'-' {
                return Parsed::Unsatisfiable;
            }
            p = skip_sp(p + 1);
            if at(p) == b',' || p >= v.len() {
                start = s;
                end = len;
            } else {
                if !at(p).is_ascii_digit() {
                    return Parsed::Unsatisfiable;
                }
                let Some(e) = number(&mut p) else {
                    return Parsed::Unsatisfiable;
                };
                p = skip_sp(p);
                if at(p) != b',' && p < v.len() {
                    return Parsed::Unsatisfiable;
                }
                start = s;
                end = if e >= len { len } else { e + 1 };
            }
        } else {
            // A suffix: the last N bytes.
            p += 1;
            if !at(p).is_ascii_digit() {
                return Parsed::Unsatisfiable;
            }
            let Some(n) = number(&mut p) else {
                return Parsed::Unsatisfiable;
            };
            p = skip_sp(p);
            if at(p) != b',' && p < v.len() {
                return Parsed::Unsatisfiable;
            }
            start = len.saturating_sub(n);
            end = len;
        }
        if start < end {
            out.push((start, end));
            total = total.saturating_add(end - start);
            if left == 0 {
                return Parsed::Whole;
            }
            left -= 1;
        } else if start == 0 {
            // An empty body: nothing to cut, send it whole.
            return Parsed::Whole;
        }
        if at(p) != b',' || p >= v.len() {
            break;
        }
        p += 1;
    }
    if out.is_empty() {
        return Parsed::Unsatisfiable;
    }
    if total > len {
        return Parsed::Whole;
    }
    Parsed::Ranges(out)
}

/// 416: nginx answers with the error page (the file's validators go away),
/// keeps the headers added so far, and runs the header filters again for
/// the page (so `add_header ... always` rows are added a second time and
/// charset applies to the page).
fn unsatisfiable(cx: &mut Ctx<'_>, resp: &mut Response, len: u64) {
    resp.status = 416;
    resp.body = Body::Empty;
    resp.content_type = None;
    resp.content_length = None;
    resp.last_modified = None;
    resp.remove_header("etag");
    resp.remove_header("accept-ranges");
    let mut v = b"bytes */".to_vec();
    response::push_num(&mut v, len);
    resp.headers.push(("Content-Range".into(), v));
    response::special_response_to(resp, &cx.loc, cx.req);
    super::headers::apply(cx, resp);
    super::charset::header_filter(cx, resp);
}

fn content_range(s: u64, e: u64, len: u64) -> Vec<u8> {
    format!("{}-{}/{}", s, e - 1, len).into_bytes()
}

pub(crate) fn single(resp: &mut Response, s: u64, e: u64, len: u64) {
    let mut v = b"bytes ".to_vec();
    v.extend_from_slice(&content_range(s, e, len));
    resp.headers.push(("Content-Range".into(), v));
    resp.content_length = Some(e - s);
    resp.body = match std::mem::take(&mut resp.body) {
        Body::File { file, offset, .. } => Body::File {
            file,
            offset: offset + s,
            len: e - s,
        },
        Body::Bytes(b) => Body::Bytes(slice(&b, s, e).to_vec()),
        Body::Shared(b) => Body::Shared(b.slice(bounds(b.len(), s, e))),
        Body::Stream(mut src) => {
            if !src.cut(s, e) {
                resp.filters.push(Box::new(Slice {
                    skip: s,
                    take: e - s,
                }));
            }
            Body::Stream(src)
        }
        other => cut_multi(other, &[(s, e)]),
    };
}

/// Cuts a streamed body to one range as it passes.
struct Slice {
    skip: u64,
    take: u64,
}

impl response::BodyFilter for Slice {
    fn filter(&mut self, input: &[u8], _last: bool, out: &mut Vec<u8>) -> std::io::Result<()> {
        let skip = self.skip.min(input.len() as u64) as usize;
        self.skip -= skip as u64;
        let rest = &input[skip..];
        let take = self.take.min(rest.len() as u64) as usize;
        self.take -= take as u64;
        out.extend_from_slice(&rest[..take]);
        Ok(())
    }
}

pub(crate) fn multi(resp: &mut Response, r: &[(u64, u64)], len: u64) {
    let boundary = BOUNDARY.fetch_add(1, Ordering::Relaxed) + 1;
    let mut part_head = format!("\r\n--{:020}\r\n", boundary).into_bytes();
    if let Some(ct) = resp.content_type.as_deref().filter(|c| !c.is_empty()) {
        part_head.extend_from_slice(b"Content-Type: ");
        part_head.extend_from_slice(ct.as_bytes());
        part_head.extend_from_slice(b"\r\n");
    }
    part_head.extend_from_slice(b"Content-Range: bytes ");
    resp.content_type = Some(format!("multipart/byteranges; boundary={:020}", boundary).into());
    let body = std::mem::take(&mut resp.body);
    let mut pieces = Vec::with_capacity(r.len() * 2 + 1);
    for &(s, e) in r {
        let mut h = part_head.clone();
        h.extend_from_slice(&content_range(s, e, len));
        h.extend_from_slice(b"\r\n\r\n");
        pieces.push(Piece::Bytes(h));
        match &body {
            Body::File { file, offset, .. } => pieces.push(Piece::File {
                file: file.clone(),
                offset: offset + s,
                len: e - s,
            }),
            Body::Bytes(b) => pieces.push(Piece::Bytes(slice(b, s, e).to_vec())),
            Body::Shared(b) => pieces.push(Piece::Bytes(slice(b, s, e).to_vec())),
            Body::Multi(_) | Body::Empty | Body::Stream(_) => {
                if let Body::Multi(p) = cut_multi(clone_pieces(&body), &[(s, e)]) {
                    pieces.extend(p);
                }
            }
        }
    }
    pieces.push(Piece::Bytes(
        format!("\r\n--{:020}--\r\n", boundary).into_bytes(),
    ));
    resp.body = Body::Multi(pieces);
    resp.content_length = Some(resp.body_len());
}

fn clone_pieces_vec(p: &[Piece]) -> Vec<Piece> {
    p.iter()
        .map(|p| match p {
            Piece::Bytes(b) => Piece::Bytes(b.clone()),
            Piece::File { file, offset, len } => Piece::File {
                file: file.clone(),
                offset: *offset,
                len: *len,
            },
        })
        .collect()
}

fn clone_pieces(b: &Body) -> Body {
    match b {
        Body::Multi(p) => Body::Multi(clone_pieces_vec(p)),
        _ => Body::Empty,
    }
}

/// `b[s..e]`, clamped (the ranges were checked against the length).
fn slice(b: &[u8], s: u64, e: u64) -> &[u8] {
    &b[bounds(b.len(), s, e)]
}

/// `[s, e)` kept within a body of `len` bytes.
fn bounds(len: usize, s: u64, e: u64) -> std::ops::Range<usize> {
    let s = usize::try_from(s).unwrap_or(len).min(len);
    let e = usize::try_from(e).unwrap_or(len).clamp(s, len);
    s..e
}

/// Cuts a body made of pieces to the given ranges of its concatenation.
fn cut_multi(body: Body, r: &[(u64, u64)]) -> Body {
    let Body::Multi(pieces) = body else {
        return Body::Empty;
    };
    let mut out = Vec::new();
    for &(s, e) in r {
        let mut pos = 0u64;
        for p in &pieces {
            let plen = match p {
                Piece::Bytes(b) => b.len() as u64,
                Piece::File { len, .. } => *len,
            };
            let (ps, pe) = (pos, pos + plen);
            pos = pe;
            let (a, z) = (s.max(ps), e.min(pe));
            if a >= z {
                continue;
            }
            match p {
                Piece::Bytes(b) => out.push(Piece::Bytes(slice(b, a - ps, z - ps).to_vec())),
                Piece::File { file, offset, .. } => out.push(Piece::File {
                    file: file.clone(),
                    offset: offset + (a - ps),
                    len: z - a,
                }),
            }
        }
    }
    Body::Multi(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(v: &str, len: u64) -> Parsed {
        parse(v.as_bytes(), len, u64::MAX)
    }

    #[test]
    fn parses_like_nginx() {
        assert_eq!(r("0-3", 21), Parsed::Ranges(vec![(0, 4)]));
        assert_eq!(r(" 2 - 3 ", 21), Parsed::Ranges(vec![(2, 4)]));
        assert_eq!(r("15-", 21), Parsed::Ranges(vec![(15, 21)]));
        assert_eq!(r("15-100", 21), Parsed::Ranges(vec![(15, 21)]));
        assert_eq!(r("-5", 21), Parsed::Ranges(vec![(16, 21)]));
        assert_eq!(r("-50", 21), Parsed::Ranges(vec![(0, 21)]));
        assert_eq!(
            r("0-1,15-100,0-0", 21),
            Parsed::Ranges(vec![(0, 2), (15, 21), (0, 1)])
        );
        assert_eq!(r("0-1,100-200", 21), Parsed::Ranges(vec![(0, 2)]));
        assert_eq!(r("-0", 21), Parsed::Unsatisfiable);
        assert_eq!(r("5-2", 21), Parsed::Unsatisfiable);
        assert_eq!(r("abc", 21), Parsed::Unsatisfiable);
        assert_eq!(r("0-1,", 21), Parsed::Unsatisfiable);
        assert_eq!(r("0-1x", 21), Parsed::Unsatisfiable);
        assert_eq!(r("1-", 0), Parsed::Unsatisfiable);
        assert_eq!(r("0-", 0), Parsed::Whole);
        assert_eq!(r("0-100,1-100", 21), Parsed::Whole);
        assert_eq!(r("99999999999999999999-", 21), Parsed::Unsatisfiable);
        assert_eq!(parse(b"1-2,4-5", 21, 1), Parsed::Whole);
        assert_eq!(
            parse(b"1-2,4-5", 21, 2),
            Parsed::Ranges(vec![(1, 3), (4, 6)])
        );
    }
}
