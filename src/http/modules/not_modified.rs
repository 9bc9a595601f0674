//! `if_modified_since` and conditional requests (304/412): the not_modified
//! filter, first of the header filters.
//!
//! Only a 200 response is considered. In nginx 1.22's order:
//!
//! 1. `If-Unmodified-Since`: 412 unless the response has a Last-Modified not
//!    after the given date (an unparsable date fails too).
//! 2. `If-Match`: 412 unless it is `*` or lists the ETag (strong
//!    comparison: `W/"x"` never matches).
//! 3. `If-Modified-Since` / `If-None-Match`: 304 when every one present says
//!    "not modified": the date equals Last-Modified (`exact`, the default) or
//!    is not before it (`before`; `off` never answers 304), and the list
//!    names the ETag with weak comparison, or is `*`.
//!
//! A 412 is a fresh error page (the file's headers go away); a 304 keeps
//! the headers but loses Content-Type, Content-Length, Accept-Ranges,
//! Content-Encoding and the body.

use crate::config::registry::{arg, ctx, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::date::parse_http_date;
use crate::http::phases::Ctx;
use crate::http::response::{self, Body, Response};

/// `if_modified_since` modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ims {
    Off,
    Exact,
    Before,
}

#[derive(Debug, Clone, Default)]
pub struct NotModifiedLoc {
    /// Default `exact`.
    pub if_modified_since: Option<Ims>,
}

impl NotModifiedLoc {
    pub fn merge(&mut self, p: &NotModifiedLoc) {
        if self.if_modified_since.is_none() {
            self.if_modified_since = p.if_modified_since;
        }
    }
}

fn set_ims(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = match arg(d, 0) {
        "off" => Ims::Off,
        "exact" => Ims::Exact,
        "before" => Ims::Before,
        other => return Err(ConfError::at(format!("invalid value \"{}\"", other), d)),
    };
    set_once(&mut l.modules.not_modified.if_modified_since, v, d)
}

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "if_modified_since",
    ctx: ctx::HSL,
    args: Args::take(1),
    set: Setter::Loc(set_ims),
}];

/// Header filter (see `phases::HEADER_FILTERS` for the order).
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    if resp.status != 200 || resp.disable_not_modified {
        return;
    }
    let req = cx.req;
    // Borrowed from the response when a conditional header needs it (no
    // copy on the common request that has none).
    let etag = || resp.header("etag").map(<[u8]>::to_vec);
    let lm = resp.last_modified;
    if let Some(v) = req.header("if-unmodified-since") {
        let ok = match (lm, parse_http_date(v)) {
            (Some(lm), Some(t)) => t >= lm,
            _ => false,
        };
        if !ok {
            return precondition_failed(cx, resp);
        }
    }
    if let Some(v) = req.header("if-match") {
        if !etag_matches(v, etag().as_deref(), false) {
            return precondition_failed(cx, resp);
        }
    }
    let ims = req.header("if-modified-since");
    let inm = req.header("if-none-match");
    if ims.is_none() && inm.is_none() {
        return;
    }
    if let Some(v) = ims {
        let mode = cx.loc.modules.not_modified.if_modified_since;
        if modified_since(v, lm, mode.unwrap_or(Ims::Exact)) {
            return;
        }
    }
    if let Some(v) = inm {
        if !etag_matches(v, etag().as_deref(), true) {
            return;
        }
    }
    resp.status = 304;
    resp.content_type = None;
    resp.content_length = None;
    resp.remove_header("accept-ranges");
    resp.remove_header("content-encoding");
    resp.body = Body::Empty;
    resp.filters.clear();
}

fn precondition_failed(cx: &Ctx<'_>, resp: &mut Response) {
    let mut r = Response::status(412);
    r.force_close = resp.force_close;
    response::special_response_to(&mut r, &cx.loc, cx.req);
    *resp = r;
}

/// Whether `If-Modified-Since: v` lets the full response through.
pub(crate) fn modified_since(v: &[u8], lm: Option<i64>, mode: Ims) -> bool {
    let Some(lm) = lm else {
        return true;
    };
    if mode == Ims::Off {
        return true;
    }
    // An unparsable date counts as "long ago", as nginx's -1 does.
    let t = parse_http_date(v).unwrap_or(-1);
    if t == lm {
        return false;
    }
    mode == Ims::Exact || t < lm
}

/// Whether an `If-Match` / `If-None-Match` value names `etag`. `*` alone
/// matches anything (even a response without an ETag); with `weak`, `W/`
/// prefixes on either side are ignored.
pub fn etag_matches(list: &[u8], etag: Option<&[u8]>, weak: bool) -> bool {
    if list == b"*" {
        return true;
    }
    let Some(mut etag) = etag else {
        return false;
    };
    if weak && etag.len() > 2 && etag.starts_with(b"W/") {
        etag = &etag[2..];
    }
    let mut p = list;
    while !p.is_empty() {
        if weak && p.len() > 2 && p.starts_with(b"W/") {
            p = &p[2..];
        }
        if p.starts_with(etag) {
            let rest = &p[etag.len()..];
            let rest = trim_start(rest, b" \t");
            if rest.is_empty() || rest[0] == b',' {
                return true;
            }
        }
        // Skip to the next element.
        let comma = p.iter().position(|&c| c == b',').unwrap_or(p.len());
        p = trim_start(&p[comma..], b" \t,");
    }
    false
}

fn trim_start<'a>(mut s: &'a [u8], set: &[u8]) -> &'a [u8] {
    while let Some((c, rest)) = s.split_first() {
        if !set.contains(c) {
            break;
        }
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_lists() {
        let e = Some(&b"\"abc\""[..]);
        assert!(etag_matches(b"\"abc\"", e, false));
        assert!(etag_matches(b"\"x\", \"abc\"", e, false));
        assert!(etag_matches(b"\"x\",\t\"abc\" , \"y\"", e, false));
        assert!(!etag_matches(b"W/\"abc\"", e, false));
        assert!(etag_matches(b"W/\"abc\"", e, true));
        assert!(etag_matches(b"\"abc\"", Some(b"W/\"abc\""), true));
        assert!(!etag_matches(b"\"abcd\"", e, true));
        assert!(!etag_matches(b"\"ab\"", e, true));
        assert!(etag_matches(b"*", None, false));
        assert!(!etag_matches(b"*, \"abc\"", None, true));
        assert!(!etag_matches(b"\"abc\"", None, true));
        assert!(!etag_matches(b"", e, true));
    }

    #[test]
    fn ims_modes() {
        assert!(!modified_since(
            b"Mon, 02 Jan 2023 03:04:05 GMT",
            Some(1672628645),
            Ims::Exact
        ));
        assert!(modified_since(
            b"Mon, 02 Jan 2023 03:04:06 GMT",
            Some(1672628645),
            Ims::Exact
        ));
        assert!(!modified_since(
            b"Mon, 02 Jan 2023 03:04:06 GMT",
            Some(1672628645),
            Ims::Before
        ));
        assert!(modified_since(
            b"Mon, 02 Jan 2023 03:04:04 GMT",
            Some(1672628645),
            Ims::Before
        ));
        assert!(modified_since(
            b"Mon, 02 Jan 2023 03:04:05 GMT",
            Some(1672628645),
            Ims::Off
        ));
        assert!(modified_since(b"garbage", Some(1672628645), Ims::Before));
        assert!(modified_since(
            b"Mon, 02 Jan 2023 03:04:05 GMT",
            None,
            Ims::Exact
        ));
    }
}
