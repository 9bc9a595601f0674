//! `add_header`, `add_trailer`, `expires`, `etag`: the headers filter.
//!
//! Runs after not_modified and before charset/gzip/range (see
//! `phases::HEADER_FILTERS`). Behaviour follows nginx 1.22:
//!
//! * Headers and `expires` apply only to "safe" statuses (200, 201, 204,
//!   206, 301, 302, 303, 304, 307, 308) unless `add_header ... always`.
//! * A level that has any `add_header` replaces its parent's list (same for
//!   `add_trailer`, and `expires` is inherited whole).
//! * `add_header` values are templates; an empty value adds nothing, except
//!   for `ETag` and `Last-Modified`, where it removes the response's header
//!   (nginx replaces those in place instead of adding a second one).
//! * `expires` writes `Expires` and `Cache-Control` (replacing existing
//!   ones): `epoch`, `max`, a time from now, `modified` + time from the
//!   file's mtime, `@time` of day (local time), negative = `no-cache`.
//! * `add_trailer` values are rendered here (nginx renders them after the
//!   body; only `$body_bytes_sent`-like variables could tell). A response
//!   with trailers is sent chunked to HTTP/1.1 clients, as nginx's chunked
//!   filter does; that step runs last, from the range filter
//!   ([`force_chunked_for_trailers`]), so that ranges still see the length.

use std::borrow::Cow;
use std::sync::Arc;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::{Ctx, Sent, WithSent};
use crate::http::request::Method;
use crate::http::response::{BodyFilter, Response};
use crate::http::vars::{Part, Template, Var};

/// What a header row does to the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Appended (nothing when the value is empty).
    Plain,
    /// Replaces the response's ETag in place; empty removes it.
    Etag,
    /// Replaces Last-Modified (the value is sent as written); empty removes it.
    LastModified,
}

/// One `add_header` / `add_trailer` row.
#[derive(Debug, Clone)]
pub struct HeaderRow {
    name: String,
    value: Template,
    always: bool,
    kind: Kind,
}

/// The `expires` setting, as nginx's kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiresKind {
    Off,
    Epoch,
    Max,
    /// `expires TIME`: from the time of the request.
    Access,
    /// `expires modified TIME`: from the response's Last-Modified.
    Modified,
    /// `expires @TIME`: the next such time of day (local time).
    Daily,
}

#[derive(Debug, Clone)]
pub struct Expires {
    kind: ExpiresKind,
    /// Seconds (negative allowed for Access/Modified).
    time: i64,
    /// `expires $var` / `expires modified $var`: parsed per request.
    value: Option<Template>,
}

#[derive(Debug, Clone, Default)]
pub struct HeadersLoc {
    /// `etag on|off` (default on); read by the static handler.
    pub etag: Option<bool>,
    /// `add_header` rows of the nearest level that has any.
    pub headers: Option<Arc<Vec<HeaderRow>>>,
    /// `add_trailer` rows of the nearest level that has any.
    pub trailers: Option<Arc<Vec<HeaderRow>>>,
    pub expires: Option<Expires>,
}

impl HeadersLoc {
    pub fn merge(&mut self, p: &HeadersLoc) {
        if self.etag.is_none() {
            self.etag = p.etag;
        }
        if self.headers.is_none() {
            self.headers = p.headers.clone();
        }
        if self.trailers.is_none() {
            self.trailers = p.trailers.clone();
        }
        if self.expires.is_none() {
            self.expires = p.expires.clone();
        }
    }
}

fn set_etag(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.headers.etag, v, d)
}

/// The rows of `add_header`/`add_trailer` (shared argument syntax).
fn header_row(d: &Directive, cx: &mut Compiler, trailer: bool) -> ConfResult<HeaderRow> {
    let always = match d.args.get(2) {
        None => false,
        Some(a) if a.value == "always" => true,
        Some(a) => {
            return Err(ConfError::at(
                format!("invalid parameter \"{}\"", a.value),
                d,
            ))
        }
    };
    let name = arg(d, 0).to_string();
    let kind = if trailer {
        Kind::Plain
    } else if name.eq_ignore_ascii_case("etag") {
        Kind::Etag
    } else if name.eq_ignore_ascii_case("last-modified") {
        Kind::LastModified
    } else {
        Kind::Plain
    };
    Ok(HeaderRow {
        name,
        value: cx.template(arg(d, 1), d)?,
        always,
        kind,
    })
}

fn set_add_header(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let row = header_row(d, cx, false)?;
    let rows = l
        .modules
        .headers
        .headers
        .get_or_insert_with(|| Arc::new(Vec::new()));
    Arc::make_mut(rows).push(row);
    Ok(())
}

fn set_add_trailer(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let row = header_row(d, cx, true)?;
    let rows = l
        .modules
        .headers
        .trailers
        .get_or_insert_with(|| Arc::new(Vec::new()));
    Arc::make_mut(rows).push(row);
    Ok(())
}

/// Parses an `expires` time argument (`epoch`, `max`, `off`, `@T`, `-T`,
/// `T`); `kind` comes in as Access or Modified. Errors are nginx's texts.
fn parse_expires(s: &str, kind: ExpiresKind) -> Result<(ExpiresKind, i64), &'static str> {
    // nginx reads these words only without "modified".
    match s {
        "epoch" if kind != ExpiresKind::Modified => return Ok((ExpiresKind::Epoch, 0)),
        "max" if kind != ExpiresKind::Modified => return Ok((ExpiresKind::Max, 0)),
        "off" if kind != ExpiresKind::Modified => return Ok((ExpiresKind::Off, 0)),
        _ => {}
    }
    let (kind, rest, minus) = if let Some(r) = s.strip_prefix('@') {
        if kind == ExpiresKind::Modified {
            return Err("daily time cannot be used with \"modified\" parameter");
        }
        (ExpiresKind::Daily, r, false)
    } else if let Some(r) = s.strip_prefix('-') {
        (kind, r, true)
    } else {
        (kind, s, false)
    };
    let t = value::time_secs(rest).ok_or("invalid value")?;
    let t = i64::try_from(t).map_err(|_| "invalid value")?;
    if kind == ExpiresKind::Daily && t > 24 * 60 * 60 {
        return Err("daily time value must be less than 24 hours");
    }
    Ok((kind, if minus { -t } else { t }))
}

fn set_expires(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.headers.expires.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let err = |m: &str| ConfError::at(format!("\"expires\" directive {}", m), d);
    let (kind, v) = if d.args.len() == 2 {
        if arg(d, 0) != "modified" {
            return Err(err("invalid value"));
        }
        (ExpiresKind::Modified, arg(d, 1))
    } else {
        (ExpiresKind::Access, arg(d, 0))
    };
    let t = cx.template(v, d)?;
    let e = if t.has_vars() {
        Expires {
            kind,
            time: 0,
            value: Some(t),
        }
    } else {
        let (kind, time) = parse_expires(v, kind).map_err(err)?;
        Expires {
            kind,
            time,
            value: None,
        }
    };
    l.modules.headers.expires = Some(e);
    Ok(())
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "etag",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_etag),
    },
    Spec {
        name: "add_header",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::take23(),
        set: Setter::Loc(set_add_header),
    },
    Spec {
        name: "add_trailer",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::take23(),
        set: Setter::Loc(set_add_trailer),
    },
    Spec {
        name: "expires",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::take12(),
        set: Setter::Loc(set_expires),
    },
];

/// The statuses for which headers without `always` (and `expires`) apply.
fn safe_status(code: u16) -> bool {
    matches!(
        code,
        200 | 201 | 204 | 206 | 301 | 302 | 303 | 304 | 307 | 308
    )
}

/// Header filter (see `phases::HEADER_FILTERS` for the order).
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    apply(cx, resp);
}

/// Adds this location's headers for the response's current status. Also
/// run again by the range filter for a 416 page, as nginx runs its whole
/// filter chain again for an error page produced inside it.
pub fn apply(cx: &mut Ctx<'_>, resp: &mut Response) {
    let loc = cx.loc.clone();
    let conf = &loc.modules.headers;
    if conf.headers.is_none() && conf.trailers.is_none() && conf.expires.is_none() {
        return;
    }
    // `$status` is the status being sent; the log phase overwrites this.
    cx.sent.status = resp.status;
    let safe = safe_status(resp.status);
    if let Some(e) = &conf.expires {
        if safe {
            set_expires_headers(cx, resp, e);
        }
    }
    if let Some(rows) = &conf.headers {
        // nginx adds each header to headers_out before rendering the next,
        // so `$sent_http_*` in a value sees the ones before it: tern shows
        // them through a provisional head (only where a value asks).
        let provisional = cx.sent.head.is_empty()
            && rows.iter().any(|h| {
                h.value
                    .parts
                    .iter()
                    .any(|p| matches!(p, Part::Var(Var::SentHttp(_))))
            });
        for h in rows.iter().filter(|h| safe || h.always) {
            if provisional {
                cx.sent.head = provisional_head(resp);
            }
            let v = h.value.render_vec(&*cx);
            match h.kind {
                Kind::Plain => {
                    if !v.is_empty() {
                        resp.headers.push((Cow::Owned(h.name.clone()), v));
                    }
                }
                Kind::Etag => replace_in_place(resp, "ETag", &h.name, v),
                Kind::LastModified => {
                    // nginx keeps the time for the filters after this one
                    // (If-Range), -1 for an empty or unparsable value.
                    resp.last_modified = crate::http::date::parse_http_date(&v);
                    resp.last_modified_listed = true;
                    replace_in_place(resp, "Last-Modified", &h.name, v);
                }
            }
        }
        if provisional {
            cx.sent.head.clear();
        }
    }
    if let Some(rows) = &conf.trailers {
        // nginx decides here that trailers will follow (which makes the
        // response chunked) and renders them after the body, with the
        // final status; see `force_chunked_for_trailers`.
        if rows.iter().any(|t| safe || t.always) && cx.note(EXPECT_TRAILERS).is_none() {
            cx.notes.push((EXPECT_TRAILERS, Vec::new()));
        }
    }
}

/// The head as far as the response has it (Content-Type and the listed
/// headers), for `$sent_http_*` before the real head is written.
fn provisional_head(resp: &Response) -> Vec<u8> {
    let mut head = b"HTTP/1.1\r\n".to_vec();
    if let Some(ct) = &resp.content_type {
        head.extend_from_slice(b"Content-Type: ");
        head.extend_from_slice(ct.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    for (n, v) in &resp.headers {
        head.extend_from_slice(n.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(v);
        head.extend_from_slice(b"\r\n");
    }
    head
}

/// The note that marks a response as expecting trailers.
const EXPECT_TRAILERS: &str = "headers.expect_trailers";

/// Sets a single-instance header: replaces the first one in place, or
/// appends; an empty value removes it.
fn replace_in_place(resp: &mut Response, key: &str, name: &str, v: Vec<u8>) {
    if v.is_empty() {
        resp.remove_header(key);
        return;
    }
    match resp
        .headers
        .iter_mut()
        .find(|(n, _)| n.eq_ignore_ascii_case(key))
    {
        Some(h) => {
            h.0 = Cow::Owned(name.to_string());
            h.1 = v;
        }
        None => resp.headers.push((Cow::Owned(name.to_string()), v)),
    }
}

fn set_expires_headers(cx: &Ctx<'_>, resp: &mut Response, e: &Expires) {
    let (kind, time) = match &e.value {
        None => (e.kind, e.time),
        Some(t) => {
            let s = t.render_vec(cx);
            match std::str::from_utf8(&s)
                .ok()
                .and_then(|s| parse_expires(s, e.kind).ok())
            {
                Some(v) => v,
                None => {
                    // nginx fails the request here; tern leaves the
                    // headers alone and says why.
                    cx.log(
                        Level::Error,
                        &format!(
                            "invalid \"expires\" value \"{}\"",
                            String::from_utf8_lossy(&s)
                        ),
                    );
                    return;
                }
            }
        }
    };
    let now = crate::http::date::now_secs();
    let (expires, cc): (Vec<u8>, Vec<u8>) = match kind {
        ExpiresKind::Off => return,
        ExpiresKind::Epoch => (
            b"Thu, 01 Jan 1970 00:00:01 GMT".to_vec(),
            b"no-cache".to_vec(),
        ),
        ExpiresKind::Max => (
            b"Thu, 31 Dec 2037 23:55:55 GMT".to_vec(),
            b"max-age=315360000".to_vec(),
        ),
        _ if time == 0 && kind != ExpiresKind::Daily => (
            crate::http::date::http_date().to_vec(),
            b"max-age=0".to_vec(),
        ),
        _ => {
            let (at, max_age) = match kind {
                ExpiresKind::Daily => {
                    let at = next_time_of_day(now, time);
                    (at, at - now)
                }
                ExpiresKind::Modified if resp.last_modified.is_some() => {
                    let at = resp.last_modified.unwrap_or(now).saturating_add(time);
                    (at, at - now)
                }
                _ => (now.saturating_add(time), time),
            };
            let cc = if time < 0 || max_age < 0 {
                b"no-cache".to_vec()
            } else {
                format!("max-age={}", max_age).into_bytes()
            };
            (crate::http::date::http_date_at(at).to_vec(), cc)
        }
    };
    set_single(resp, "Expires", expires);
    set_single(resp, "Cache-Control", cc);
}

/// Replaces the first header `name` and drops the others, or appends it.
fn set_single(resp: &mut Response, name: &'static str, v: Vec<u8>) {
    let mut seen = false;
    resp.headers.retain_mut(|(n, val)| {
        if !n.eq_ignore_ascii_case(name) {
            return true;
        }
        if seen {
            return false;
        }
        seen = true;
        val.clone_from(&v);
        true
    });
    if !seen {
        resp.headers.push((Cow::Borrowed(name), v));
    }
}

/// The next moment (strictly after `now`) whose local time of day is
/// `secs` after midnight.
fn next_time_of_day(now: i64, secs: i64) -> i64 {
    let t: libc::time_t = now as libc::time_t;
    // SAFETY: localtime_r and mktime only read/write the given structs.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return now + secs;
        }
        tm.tm_hour = (secs / 3600) as libc::c_int;
        tm.tm_min = ((secs % 3600) / 60) as libc::c_int;
        tm.tm_sec = (secs % 60) as libc::c_int;
        tm.tm_isdst = -1;
        let next = libc::mktime(&mut tm) as i64;
        if next == -1 {
            return now + secs;
        }
        if next > now {
            return next;
        }
        tm.tm_mday += 1;
        tm.tm_isdst = -1;
        libc::mktime(&mut tm) as i64
    }
}

/// Passes the body through unchanged: installed only to make the engine
/// stream the body chunked so that trailers can follow it.
struct Passthrough;

impl BodyFilter for Passthrough {
    fn filter(&mut self, input: &[u8], _last: bool, out: &mut Vec<u8>) -> std::io::Result<()> {
        out.extend_from_slice(input);
        Ok(())
    }
}

/// nginx's chunked filter, for trailers: a response for which the headers
/// filter expected trailers goes out chunked to HTTP/1.1 clients
/// (Content-Length dropped), except for HEAD, 1xx, 204 and 304, which get
/// no trailers.
pub fn force_chunked_for_trailers(cx: &mut Ctx<'_>, resp: &mut Response) {
    if cx.note(EXPECT_TRAILERS).is_none() {
        return;
    }
    let no_body = resp.status < 200 || resp.status == 204 || resp.status == 304;
    if no_body || cx.req.method == Method::Head || cx.req.minor < 1 {
        return;
    }
    let loc = cx.loc.clone();
    let Some(rows) = &loc.modules.headers.trailers else {
        return;
    };
    resp.content_length = None;
    if resp.filters.is_empty() {
        resp.filters.push(Box::new(Passthrough));
    }
    // nginx renders trailers once the body is done; tern renders them now,
    // with the final status (only `$body_bytes_sent`-like values differ).
    cx.sent.status = resp.status;
    let safe = safe_status(resp.status);
    // nginx renders trailers after the head has gone out, so
    // `$sent_http_*` sees it: tern renders them now, from the headers
    // the head will carry (the writer puts the real head in its place).
    let provisional = cx.sent.head.is_empty();
    if provisional {
        cx.sent.head = provisional_head(resp);
    }
    // Each trailer sees those before it (`$sent_trailer_*`).
    cx.sent.trailers.clear();
    let before = resp.trailers.len();
    for t in rows.iter().filter(|t| safe || t.always) {
        let v = t.value.render_vec(&*cx);
        if !v.is_empty() {
            cx.sent.trailers.push((t.name.clone(), v.clone()));
            resp.trailers.push((t.name.clone(), v));
        }
    }
    resp.own_trailers = resp.trailers.len() - before;
    if provisional {
        cx.sent.head.clear();
    }
}

/// The `add_trailer` values rendered once the body has gone (what the
/// HTTP/1 writer sends in place of those rendered with the head): `sent`
/// is what went out, `head` the head as written.
pub fn render_trailers(cx: &Ctx<'_>, sent: &Sent, head: &[u8]) -> Vec<(String, Vec<u8>)> {
    let Some(rows) = &cx.loc.modules.headers.trailers else {
        return Vec::new();
    };
    let safe = safe_status(sent.status);
    let mut s = sent.clone();
    s.head = head.to_vec();
    s.trailers.clear();
    let mut out = Vec::new();
    for t in rows.iter().filter(|t| safe || t.always) {
        let v = t.value.render_vec(&WithSent { cx, sent: &s });
        if !v.is_empty() {
            s.trailers.push((t.name.clone(), v.clone()));
            out.push((t.name.clone(), v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expires_values() {
        use ExpiresKind::*;
        assert_eq!(parse_expires("epoch", Access), Ok((Epoch, 0)));
        assert_eq!(parse_expires("max", Modified), Err("invalid value"));
        assert_eq!(parse_expires("epoch", Modified), Err("invalid value"));
        assert_eq!(parse_expires("off", Access), Ok((Off, 0)));
        assert_eq!(parse_expires("1h", Access), Ok((Access, 3600)));
        assert_eq!(parse_expires("-1h", Modified), Ok((Modified, -3600)));
        assert_eq!(parse_expires("@15h30m", Access), Ok((Daily, 55800)));
        assert_eq!(parse_expires("@24h", Access), Ok((Daily, 86400)));
        assert_eq!(
            parse_expires("@25h", Access),
            Err("daily time value must be less than 24 hours")
        );
        assert_eq!(
            parse_expires("@1h", Modified),
            Err("daily time cannot be used with \"modified\" parameter")
        );
        assert_eq!(parse_expires("", Access), Err("invalid value"));
        assert_eq!(parse_expires("1x", Access), Err("invalid value"));
        assert_eq!(parse_expires("--1", Access), Err("invalid value"));
    }

    #[test]
    fn safe_statuses() {
        for c in [200, 201, 204, 206, 301, 302, 303, 304, 307, 308] {
            assert!(safe_status(c));
        }
        for c in [202, 404, 412, 416, 500] {
            assert!(!safe_status(c));
        }
    }
}
