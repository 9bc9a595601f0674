//! `gzip*`: on-the-fly compression of responses (nginx's gzip filter),
//! plus the client test shared with `gzip_static` and `gunzip`.
//!
//! Data flow: the header filter ([`header_filter`]) decides, from the
//! response (status, Content-Encoding, Content-Length, Content-Type) and
//! then from the request ([`gzip_ok`]: Accept-Encoding, User-Agent,
//! HTTP version, `Via`), whether to compress. When it does, it fixes the
//! headers (adds `Content-Encoding: gzip`, drops Content-Length and
//! Accept-Ranges, weakens a strong ETag) and installs a [`BodyFilter`]
//! that deflates each slice the connection feeds it. The filter keeps only
//! zlib's own state (window and hash tables, a few hundred KiB at most), so
//! memory is bounded whatever the body size.
//!
//! Facts of nginx 1.22.1 followed here (checked against the real binary):
//! - only 200, 403 and 404 are compressed, so 206, 304 and the rest pass;
//! - a HEAD request gets the same headers a GET would (Content-Encoding,
//!   no Content-Length, weak ETag) and, of course, no body;
//! - `gzip_proxied` only matters when the request has `Via`; the flags are
//!   tested in nginx's order (off, any, auth, then Expires, then
//!   Cache-Control, then no_last_modified/no_etag) and a response without
//!   Expires or Cache-Control is compressed unless `off`, `no_etag` (with
//!   an ETag) or `no_last_modified` (with a Last-Modified *header*, which a
//!   static file does not have: its time is not a header until written);
//! - the gzip stream is zlib's: header `1f 8b 08 00 00000000 XFL 03`;
//! - `Vary: Accept-Encoding` (with `gzip_vary on`) goes out once the
//!   response was a candidate (right status, type and length), whether or
//!   not this client gets gzip, and it is the first of the extra headers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flate2::{Compress, Compression, FlushCompress, Status};

use crate::config::registry::{arg, ctx, duplicate, flag, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::regex::Regex;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::{Body, BodyFilter, Response};

/// `gzip_proxied` flags (a bit set; several may be given).
pub mod proxied {
    pub const OFF: u32 = 1 << 0;
    pub const EXPIRED: u32 = 1 << 1;
    pub const NO_CACHE: u32 = 1 << 2;
    pub const NO_STORE: u32 = 1 << 3;
    pub const PRIVATE: u32 = 1 << 4;
    pub const NO_LM: u32 = 1 << 5;
    pub const NO_ETAG: u32 = 1 << 6;
    pub const AUTH: u32 = 1 << 7;
    pub const ANY: u32 = 1 << 8;

    pub const NAMES: &[(&str, u32)] = &[
        ("off", OFF),
        ("expired", EXPIRED),
        ("no-cache", NO_CACHE),
        ("no-store", NO_STORE),
        ("private", PRIVATE),
        ("no_last_modified", NO_LM),
        ("no_etag", NO_ETAG),
        ("auth", AUTH),
        ("any", ANY),
    ];
}

/// `gzip_types`: `*` or a list of lowercase MIME types (text/html always in).
#[derive(Debug, Clone)]
pub enum Types {
    Any,
    List(Arc<Vec<String>>),
}

impl Types {
    /// nginx's default for every `*_types` left unset: `text/html` only
    /// (made once: this is asked on every response).
    pub fn html_only() -> &'static Types {
        static HTML: std::sync::OnceLock<Types> = std::sync::OnceLock::new();
        HTML.get_or_init(|| Types::List(Arc::new(vec!["text/html".into()])))
    }

    pub fn matches(&self, content_type: Option<&str>) -> bool {
        match self {
            Types::Any => true,
            Types::List(l) => match content_type {
                // nginx compares the type as its length was measured: up
                // to the `;` that introduces `charset=`, else the whole
                // value (so `text/css; foo=bar` is not `text/css`, and
                // `text/css ; charset=x` is `text/css `).
                // A type without parameters (the usual one) as it is.
                Some(ct) if memchr::memchr(b';', ct.as_bytes()).is_none() => {
                    l.iter().any(|x| x.eq_ignore_ascii_case(ct))
                }
                Some(ct) => {
                    let t = match super::charset::own_charset(ct) {
                        Some((base, _)) => ct.get(..base).unwrap_or(ct),
                        None => ct,
                    };
                    l.iter().any(|x| x.eq_ignore_ascii_case(t))
                }
                None => false,
            },
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct GzipLoc {
    pub enable: Option<bool>,
    pub types: Option<Types>,
    pub min_length: Option<u64>,
    pub comp_level: Option<u32>,
    /// The lowest HTTP minor version compressed for (`1.0` → 0, `1.1` → 1).
    pub http_version: Option<u8>,
    pub proxied: Option<u32>,
    /// `gzip_disable msie6` (merged on its own, as nginx does).
    pub disable_msie6: Option<bool>,
    /// `gzip_disable REGEX...`, case-insensitive, on User-Agent.
    pub disable: Option<Arc<Vec<Regex>>>,
    pub vary: Option<bool>,
    /// `gzip_buffers N SIZE`: accepted for compatibility; tern's output
    /// is bounded by the connection's slice size instead.
    pub buffers: Option<(u64, u64)>,
    /// `gzip_window` as zlib window bits (9..=15).
    pub window_bits: Option<u8>,
    /// `gzip_hash` as zlib memLevel: accepted; flate2 does not expose it.
    pub hash: Option<u8>,
    /// `postpone_gzipping`: accepted; there is no postponing to do when
    /// the body arrives in 64 KiB slices.
    pub postpone: Option<u64>,
    /// `gzip_no_buffer`: accepted, no effect (as in nginx today).
    pub no_buffer: Option<bool>,
}

macro_rules! inherit {
    ($self:ident, $p:ident, $($f:ident),*) => {
        $( if $self.$f.is_none() { $self.$f = $p.$f.clone(); } )*
    };
}

impl GzipLoc {
    pub fn merge(&mut self, p: &GzipLoc) {
        inherit!(
            self,
            p,
            enable,
            types,
            min_length,
            comp_level,
            http_version,
            proxied,
            disable_msie6,
            disable,
            vary,
            buffers,
            window_bits,
            hash,
            postpone,
            no_buffer
        );
    }

    fn types(&self) -> &Types {
        self.types.as_ref().unwrap_or_else(|| Types::html_only())
    }
}

fn set_gzip(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.gzip.enable, flag(d)?, d)
}

fn set_vary(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.gzip.vary, flag(d)?, d)
}

fn set_no_buffer(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.gzip.no_buffer, flag(d)?, d)
}

fn set_types(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    // Repeated gzip_types at one level add up; text/html is always in.
    let mut list = match l.modules.gzip.types.take() {
        Some(Types::Any) => {
            l.modules.gzip.types = Some(Types::Any);
            return Ok(());
        }
        Some(Types::List(v)) => (*v).clone(),
        None => vec!["text/html".to_string()],
    };
    for a in &d.args {
        if a.value == "*" {
            l.modules.gzip.types = Some(Types::Any);
            return Ok(());
        }
        list.push(a.value.to_ascii_lowercase());
    }
    l.modules.gzip.types = Some(Types::List(Arc::new(list)));
    Ok(())
}

fn set_min_length(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = value::size(arg(d, 0))
        .ok_or_else(|| ConfError::at(format!("\"{}\" directive invalid value", d.name), d))?;
    set_once(&mut l.modules.gzip.min_length, v, d)
}

fn set_comp_level(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if l.modules.gzip.comp_level.is_some() {
        return Err(duplicate(d));
    }
    let v = value::number(arg(d, 0))
        .ok_or_else(|| ConfError::at(format!("\"{}\" directive invalid number", d.name), d))?;
    if !(1..=9).contains(&v) {
        return Err(ConfError::at("value must be between 1 and 9", d));
    }
    l.modules.gzip.comp_level = Some(v as u32);
    Ok(())
}

fn set_http_version(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if l.modules.gzip.http_version.is_some() {
        return Err(duplicate(d));
    }
    let v = match arg(d, 0) {
        "1.0" => 0,
        "1.1" => 1,
        other => {
            return Err(ConfError::at(format!("invalid value \"{}\"", other), d));
        }
    };
    l.modules.gzip.http_version = Some(v);
    Ok(())
}

fn set_proxied(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let mut bits = l.modules.gzip.proxied.unwrap_or(0);
    for a in &d.args {
        match proxied::NAMES.iter().find(|(n, _)| *n == a.value) {
            // nginx only warns on a repeated value; it is harmless.
            Some((_, m)) => bits |= m,
            None => return Err(ConfError::at(format!("invalid value \"{}\"", a.value), d)),
        }
    }
    l.modules.gzip.proxied = Some(bits);
    Ok(())
}

fn set_disable(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let mut list: Vec<Regex> = l
        .modules
        .gzip
        .disable
        .as_deref()
        .cloned()
        .unwrap_or_default();
    for a in &d.args {
        if a.value == "msie6" {
            l.modules.gzip.disable_msie6 = Some(true);
            continue;
        }
        let re = Regex::compile(d, &a.value, true)?;
        list.push(re);
    }
    l.modules.gzip.disable = Some(Arc::new(list));
    Ok(())
}

/// `N SIZE` as nginx's bufs slot: both positive.
pub fn bufs(d: &Directive) -> ConfResult<(u64, u64)> {
    let bad = || ConfError::at(format!("\"{}\" directive invalid value", d.name), d);
    let n = value::number(arg(d, 0)).ok_or_else(bad)?;
    let size = value::size(arg(d, 1)).ok_or_else(bad)?;
    if n == 0 || size == 0 {
        return Err(bad());
    }
    Ok((n, size))
}

fn set_buffers(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = bufs(d)?;
    set_once(&mut l.modules.gzip.buffers, v, d)
}

fn set_window(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let bad = || {
        ConfError::at(
            format!(
                "\"{}\" directive must be 512, 1k, 2k, 4k, 8k, 16k, or 32k",
                d.name
            ),
            d,
        )
    };
    let v = value::size(arg(d, 0)).ok_or_else(bad)?;
    if !(512..=32768).contains(&v) || !v.is_power_of_two() {
        return Err(bad());
    }
    // 512 bytes is 2^9: zlib's window bits are log2 of the size.
    set_once(&mut l.modules.gzip.window_bits, v.trailing_zeros() as u8, d)
}

fn set_hash(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let bad = || {
        ConfError::at(
            format!(
                "\"{}\" directive must be 512, 1k, 2k, 4k, 8k, 16k, 32k, 64k, or 128k",
                d.name
            ),
            d,
        )
    };
    let v = value::size(arg(d, 0)).ok_or_else(bad)?;
    if !(512..=131072).contains(&v) || !v.is_power_of_two() {
        return Err(bad());
    }
    // nginx's memLevel: 512 bytes → 1 ... 128k → 9.
    set_once(&mut l.modules.gzip.hash, (v.trailing_zeros() - 8) as u8, d)
}

fn set_postpone(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = value::size(arg(d, 0))
        .ok_or_else(|| ConfError::at(format!("\"{}\" directive invalid value", d.name), d))?;
    set_once(&mut l.modules.gzip.postpone, v, d)
}

const HSL: u32 = ctx::HSL;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "gzip",
        ctx: HSL | ctx::LIF,
        args: Args::Flag,
        set: Setter::Loc(set_gzip),
    },
    Spec {
        name: "gzip_types",
        ctx: HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_types),
    },
    Spec {
        name: "gzip_min_length",
        ctx: HSL,
        args: Args::take(1),
        set: Setter::Loc(set_min_length),
    },
    Spec {
        name: "gzip_comp_level",
        ctx: HSL,
        args: Args::take(1),
        set: Setter::Loc(set_comp_level),
    },
    Spec {
        name: "gzip_http_version",
        ctx: HSL,
        args: Args::take(1),
        set: Setter::Loc(set_http_version),
    },
    Spec {
        name: "gzip_proxied",
        ctx: HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_proxied),
    },
    Spec {
        name: "gzip_disable",
        ctx: HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_disable),
    },
    Spec {
        name: "gzip_vary",
        ctx: HSL,
        args: Args::Flag,
        set: Setter::Loc(set_vary),
    },
    Spec {
        name: "gzip_buffers",
        ctx: HSL,
        args: Args::take(2),
        set: Setter::Loc(set_buffers),
    },
    Spec {
        name: "gzip_window",
        ctx: HSL,
        args: Args::take(1),
        set: Setter::Loc(set_window),
    },
    Spec {
        name: "gzip_hash",
        ctx: HSL,
        args: Args::take(1),
        set: Setter::Loc(set_hash),
    },
    Spec {
        name: "postpone_gzipping",
        ctx: HSL,
        args: Args::take(1),
        set: Setter::Loc(set_postpone),
    },
    Spec {
        name: "gzip_no_buffer",
        ctx: HSL,
        args: Args::Flag,
        set: Setter::Loc(set_no_buffer),
    },
];

// ---------------------------------------------------------------------
// The client test.

/// nginx's `Accept-Encoding` test: a `gzip` token (case-insensitive) at
/// the start or after `,`/` `, followed by the end, `,`, spaces, or a
/// `;q=` whose value is not zero. The first such token decides; anything
/// else after it (`gzipx`, `gzip;x=1`) refuses.
pub fn accepts_gzip(ae: &[u8]) -> bool {
    if ae.len() < 4 {
        return false;
    }
    // The common case "gzip,..." needs no parsing (nginx compares it as is).
    if ae.starts_with(b"gzip,") {
        return true;
    }
    let mut from = 0;
    let mut p = loop {
        let rest = match ae.get(from..) {
            Some(r) => r,
            None => return false,
        };
        let at = match rest
            .windows(4)
            .position(|w| w.eq_ignore_ascii_case(b"gzip"))
        {
            Some(i) => from + i,
            None => return false,
        };
        if at == 0 || matches!(ae[at - 1], b',' | b' ') {
            break at + 4;
        }
        from = at + 4;
    };
    // After the token: spaces, then the end, a comma, or parameters.
    loop {
        match ae.get(p) {
            None | Some(b',') => return true,
            Some(b' ') => p += 1,
            Some(b';') => {
                p += 1;
                break;
            }
            Some(_) => return false,
        }
    }
    loop {
        match ae.get(p) {
            None => return true,
            Some(b'q') | Some(b'Q') => {
                p += 1;
                break;
            }
            Some(b' ') => p += 1,
            Some(_) => return false,
        }
    }
    // "=" and at least one character of quality value.
    if p + 2 > ae.len() || ae[p] != b'=' {
        return false;
    }
    quality(&ae[p + 1..]) != 0
}

/// A quality value in thousandths-ish as nginx sums its digits: only
/// zero versus non-zero matters, and malformed values count as zero.
fn quality(v: &[u8]) -> u32 {
    let mut it = v.iter();
    let q = match it.next() {
        Some(b'0') => 0,
        Some(b'1') => 100,
        _ => return 0,
    };
    let mut q: u32 = q;
    match it.next() {
        None | Some(b',') | Some(b' ') => return q,
        Some(b'.') => {}
        Some(_) => return 0,
    }
    let mut n = 0;
    for &c in it {
        if c == b',' || c == b' ' {
            break;
        }
        if c.is_ascii_digit() {
            q += u32::from(c - b'0');
            n += 1;
            continue;
        }
        return 0;
    }
    if q > 100 || n > 3 {
        return 0;
    }
    q
}

/// nginx's `msie6` mask: "MSIE 4.x" and "MSIE 5.x" always, "MSIE 6.x"
/// unless "SV1" follows (XP SP2 fixed its gzip bugs), never Opera (which
/// pretends to be MSIE).
pub fn is_msie6(ua: &[u8]) -> bool {
    let find = |h: &[u8], n: &[u8]| h.windows(n.len()).position(|w| w == n);
    if find(ua, b"Opera").is_some() {
        return false;
    }
    let m = match find(ua, b"MSIE ") {
        Some(m) => m,
        None => return false,
    };
    // nginx wants "MSIE X.Y" complete before it looks at the version.
    if m + 7 >= ua.len() || ua[m + 6] != b'.' {
        return false;
    }
    match ua[m + 5] {
        b'4' | b'5' => true,
        b'6' => find(ua.get(m + 8..).unwrap_or(b""), b"SV1").is_none(),
        _ => false,
    }
}

/// The `gzip_proxied` decision for a request with `Via`.
pub fn proxied_ok(p: u32, has_auth: bool, resp: &Response, now: i64) -> bool {
    if p & proxied::OFF != 0 {
        return false;
    }
    if p & proxied::ANY != 0 {
        return true;
    }
    if has_auth && p & proxied::AUTH != 0 {
        return true;
    }
    if let Some(e) = resp.header("Expires") {
        if p & proxied::EXPIRED == 0 {
            return false;
        }
        let expires = match crate::http::date::parse_http_date(e) {
            Some(t) => t,
            None => return false,
        };
        let date = match resp.header("Date") {
            Some(d) => match crate::http::date::parse_http_date(d) {
                Some(t) => t,
                None => return false,
            },
            None => now,
        };
        return expires < date;
    }
    let cc: Vec<&[u8]> = resp
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("Cache-Control"))
        .map(|(_, v)| v.as_slice())
        .collect();
    if !cc.is_empty() {
        let has = |tok: &[u8]| cc.iter().any(|v| cc_has(v, tok));
        return (p & proxied::NO_CACHE != 0 && has(b"no-cache"))
            || (p & proxied::NO_STORE != 0 && has(b"no-store"))
            || (p & proxied::PRIVATE != 0 && has(b"private"));
    }
    // A Last-Modified *header* (from a backend); a file's time is not one.
    if p & proxied::NO_LM != 0 && resp.header("Last-Modified").is_some() {
        return false;
    }
    if p & proxied::NO_ETAG != 0 && resp.header("ETag").is_some() {
        return false;
    }
    true
}

/// Whether a Cache-Control value lists `tok` as a bare directive (no
/// `=value`), case-insensitively, as nginx's multi-header token test.
fn cc_has(v: &[u8], tok: &[u8]) -> bool {
    v.split(|&c| c == b',').any(|part| {
        let part = part.trim_ascii();
        part.len() >= tok.len()
            && part[..tok.len()].eq_ignore_ascii_case(tok)
            && part[tok.len()..].trim_ascii().is_empty()
    })
}

/// Whether this client may get a gzip-encoded response (nginx's
/// `ngx_http_gzip_ok` decision). `resp` supplies the headers that
/// `gzip_proxied` looks at. The answer is remembered for the request, as
/// nginx does, so gzip_static, gunzip and gzip agree.
pub fn gzip_ok(cx: &mut Ctx<'_>, resp: &Response) -> bool {
    if let Some(v) = cx.note("gzip_ok") {
        return v == b"1";
    }
    let ok = gzip_ok_uncached(cx, resp);
    // "1", or refused as the empty value: the usual answer to a client
    // that asks for no gzip costs no allocation.
    cx.notes
        .push(("gzip_ok", if ok { b"1".to_vec() } else { Vec::new() }));
    ok
}

fn gzip_ok_uncached(cx: &Ctx<'_>, resp: &Response) -> bool {
    let g = &cx.loc.modules.gzip;
    let req = cx.req;
    match req.header("accept-encoding") {
        Some(ae) if accepts_gzip(ae) => {}
        _ => return false,
    }
    let ua = req.header("user-agent");
    if g.disable_msie6.unwrap_or(false) && ua.is_some_and(is_msie6) {
        return false;
    }
    if req.minor < g.http_version.unwrap_or(1) {
        return false;
    }
    if req.header("via").is_some() {
        let p = g.proxied.unwrap_or(proxied::OFF);
        let now = crate::http::date::now_secs();
        if !proxied_ok(p, req.header("authorization").is_some(), resp, now) {
            return false;
        }
    }
    if let (Some(res), Some(ua)) = (&g.disable, ua) {
        if res.iter().any(|r| r.is_match(ua)) {
            return false;
        }
    }
    true
}

// ---------------------------------------------------------------------
// Header filter.

/// Records that the response depends on Accept-Encoding (nginx's
/// `r->gzip_vary`); the Vary header is added at the end of [`header_filter`].
pub fn mark_vary(cx: &mut Ctx<'_>) {
    if cx.note("gzip_vary").is_none() {
        cx.notes.push(("gzip_vary", Vec::new()));
    }
}

/// nginx's weak ETag: `"x"` becomes `W/"x"`, a weak one stays, anything
/// else is dropped (it could not be weakened correctly).
pub fn weaken_etag(resp: &mut Response) {
    let mut drop = false;
    for (n, v) in resp.headers.iter_mut() {
        if !n.eq_ignore_ascii_case("ETag") {
            continue;
        }
        if v.starts_with(b"W/") {
            continue;
        }
        if v.starts_with(b"\"") {
            v.splice(0..0, *b"W/");
        } else {
            drop = true;
        }
    }
    if drop {
        resp.remove_header("ETag");
    }
}

/// The response is going out with a new encoding: its length is unknown
/// and byte ranges of the old representation make no sense.
pub fn clear_length(cx: &Ctx<'_>, resp: &mut Response) {
    resp.content_length = None;
    resp.remove_header("Content-Length");
    resp.remove_header("Accept-Ranges");
    weaken_etag(resp);
    // Without chunked encoding (HTTP/1.0) only closing ends the body.
    if cx.req.minor == 0 {
        resp.force_close = true;
    }
}

/// Whether the body will actually be sent (so a body filter is needed).
pub fn has_body(cx: &Ctx<'_>, resp: &Response) -> bool {
    cx.req.method != Method::Head && !matches!(resp.body, Body::Empty)
}

/// Header filter: the gzip decision, then `Vary` (gunzip is its own
/// filter, earlier in `HEADER_FILTERS`, as in nginx's order).
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    compress_filter(cx, resp);
    if cx.note("gzip_vary").is_some() && cx.loc.modules.gzip.vary.unwrap_or(false) {
        // nginx writes Vary right after Connection/Keep-Alive, before the
        // other headers.
        resp.headers
            .insert(0, ("Vary".into(), b"Accept-Encoding".to_vec()));
    }
}

/// Whether the response is a candidate for compression (before asking
/// about the client).
pub fn candidate(cx: &Ctx<'_>, resp: &Response) -> bool {
    let g = &cx.loc.modules.gzip;
    g.enable.unwrap_or(false)
        && matches!(resp.status, 200 | 403 | 404)
        && resp.header("Content-Encoding").is_none_or(|v| v.is_empty())
        && resp
            .content_length
            .is_none_or(|n| n >= g.min_length.unwrap_or(20))
        && g.types().matches(resp.content_type.as_deref())
        // A response with no body at all (not HEAD) has nothing to encode.
        && (cx.req.method == Method::Head || !matches!(resp.body, Body::Empty))
}

fn compress_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    if !candidate(cx, resp) {
        return;
    }
    mark_vary(cx);
    if !gzip_ok(cx, resp) {
        return;
    }
    let g = &cx.loc.modules.gzip;
    let level = g.comp_level.unwrap_or(1);
    let mut wbits = g.window_bits.unwrap_or(15);
    // As nginx: a small known body needs no big window (less memory).
    if let Some(n) = resp.content_length.filter(|&n| n > 0) {
        while n < (1u64 << (wbits - 1)) && wbits > 9 {
            wbits -= 1;
        }
    }
    resp.headers
        .push(("Content-Encoding".into(), b"gzip".to_vec()));
    clear_length(cx, resp);
    if !has_body(cx, resp) {
        return;
    }
    let ratio = Arc::new(Ratio::default());
    cx.guards.push(Box::new(ratio.clone()));
    // A body whose whole length is known and small enough goes through
    // libdeflate in one call (see `WHOLE_MAX`); anything else streams.
    let whole = match &resp.body {
        Body::Bytes(_) | Body::Shared(_) => true,
        Body::File { len, .. } => *len <= WHOLE_MAX,
        _ => false,
    };
    let key = (zlib_level(level), wbits);
    resp.filters.push(Box::new(Deflater {
        z: None,
        whole: whole.then(Vec::new),
        level,
        key,
        ratio,
        done: false,
    }));
}

thread_local! {
    /// Compressors kept by the worker thread for reuse: setting up a
    /// deflate state (window and hash tables) costs more than compressing
    /// a small response, and `reset` is cheap.
    static COMPRESSORS: std::cell::RefCell<Vec<((u32, u8), Compress)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// At most this many idle compressors per worker thread.
const KEEP_COMPRESSORS: usize = 16;

fn take_compressor(key: (u32, u8)) -> Compress {
    let reused = COMPRESSORS.with(|c| {
        let mut c = c.borrow_mut();
        let i = c.iter().position(|(k, _)| *k == key)?;
        Some(c.swap_remove(i).1)
    });
    reused.unwrap_or_else(|| Compress::new_gzip(Compression::new(key.0), key.1))
}

fn give_back_compressor(key: (u32, u8), mut z: Compress) {
    z.reset();
    COMPRESSORS.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() < KEEP_COMPRESSORS {
            c.push((key, z));
        }
    });
}

// ---------------------------------------------------------------------
// Body filter.

/// The zlib-rs level for an nginx `gzip_comp_level`. zlib-rs's level 1 is
/// a "quick" strategy whose output is far larger than zlib's level 1
/// (35 KB against 21 KB on 104 KB of HTML); its level 2 gives zlib's
/// level-1 size and is still several times faster than zlib, so level 1
/// (nginx's default) maps to 2. The other levels match zlib's sizes.
///
/// Written as `clamp`: rustc 1.95.0 (LLVM) compiles the equivalent
/// `if level <= 1 { 2 } else { level.min(9) }` at -O to `min(level, 9)`,
/// i.e. level 1 stayed 1 (checked with a standalone program; the unit
/// test below guards it).
pub fn zlib_level(level: u32) -> u32 {
    level.clamp(2, 9)
}

/// Bytes in and out of the compressor, for `$gzip_ratio`; written by the
/// body filter when the stream ends, read by the log phase.
#[derive(Debug, Default)]
pub struct Ratio {
    zin: AtomicU64,
    zout: AtomicU64,
}

impl Ratio {
    /// For a body compressed elsewhere (the compressed-file cache).
    pub fn set(&self, zin: u64, zout: u64) {
        self.zin.store(zin, Ordering::Relaxed);
        self.zout.store(zout, Ordering::Relaxed);
    }

    /// Bytes in and out.
    pub fn get(&self) -> (u64, u64) {
        (
            self.zin.load(Ordering::Relaxed),
            self.zout.load(Ordering::Relaxed),
        )
    }
}

/// The deflate body filter: one gzip stream, made by libdeflate in one
/// call when the whole body is at hand ([`gzip_whole`]), else by zlib-rs
/// slice by slice.
struct Deflater {
    /// The zlib-rs stream, once streaming (given back for reuse on drop).
    z: Option<Compress>,
    /// Whole-body mode: the body gathered until its last slice (empty
    /// while the body arrives in one call, as bodies in memory and files
    /// up to 64 KiB do, which are then compressed without a copy).
    whole: Option<Vec<u8>>,
    /// nginx's `gzip_comp_level`.
    level: u32,
    key: (u32, u8),
    ratio: Arc<Ratio>,
    done: bool,
}

impl Drop for Deflater {
    fn drop(&mut self) {
        if let Some(z) = self.z.take() {
            give_back_compressor(self.key, z);
        }
    }
}

/// Room made in the output before each zlib call.
const OUT_STEP: usize = 16 * 1024;

/// Whole-body compression applies to files up to this size (bodies in
/// memory always qualify): the gathered body and its compressed form are
/// held at once, so this bounds that memory per response. Measured
/// (BENCHMARKS.md, "gzip through libdeflate"): at 256 KiB libdeflate in
/// one call still beats zlib-rs streaming per byte by a wide margin.
pub const WHOLE_MAX: u64 = 1024 * 1024;

/// libdeflate's level for each nginx `gzip_comp_level` 1-9: the fastest
/// one whose total output on the corpus (bench/gzip_levels.py and
/// bench/gzip_levels_libdeflate.rs) is no larger than zlib 1.2.13's at that level, at
/// each of the 1 KiB, 16 KiB and whole-file cuts (DIFFERENCES.md).
pub const LIBDEFLATE_LEVEL: [i32; 9] = [1, 1, 1, 4, 6, 7, 8, 8, 8];

thread_local! {
    /// libdeflate compressors by level, kept by the worker thread: one is
    /// a few hundred KiB to allocate, and it carries no state between calls.
    static WHOLE_COMPRESSORS: std::cell::RefCell<Vec<Option<libdeflater::Compressor>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The largest input libdeflate stores uncompressed at level `lvl` (its
/// `max_passthrough_size`, 55 - 4 x level): a stored block costs 5 bytes
/// where zlib's fixed-Huffman block of the same few bytes costs about 1,
/// so `gzip_min_length 0` bodies came out 3-5 bytes longer than nginx's
/// (proxy_cache.t's 8-byte and empty bodies, 31 and 23 bytes against
/// zlib's 28 and 20).
const fn libdeflate_passthrough(lvl: i32) -> usize {
    if lvl <= 0 {
        usize::MAX
    } else {
        (55 - 4 * lvl) as usize
    }
}

thread_local! {
    /// Raw-deflate zlib-rs streams for [`tiny_deflate`], by zlib-rs level.
    static TINY_COMPRESSORS: std::cell::RefCell<Vec<(u32, Compress)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Raw deflate of a body of a few dozen bytes at most through zlib-rs,
/// whose output for such inputs is zlib's (a fixed-Huffman block, with
/// matches), appended to `out`. Only bodies below libdeflate's
/// pass-through size come here, so zlib-rs's per-stream reset (it clears
/// its hash table) is paid only by them.
fn tiny_deflate(level: u32, data: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    let zl = zlib_level(level);
    let mut z = TINY_COMPRESSORS
        .with(|c| {
            let mut c = c.borrow_mut();
            let i = c.iter().position(|(k, _)| *k == zl)?;
            Some(c.swap_remove(i).1)
        })
        .unwrap_or_else(|| Compress::new(Compression::new(zl), false));
    // A fixed-Huffman block of n literals takes at most 9n + 10 bits.
    out.reserve(data.len() * 2 + 16);
    let r = z.compress_vec(data, out, FlushCompress::Finish);
    let done = matches!(r, Ok(Status::StreamEnd));
    z.reset();
    TINY_COMPRESSORS.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() < 4 {
            c.push((zl, z));
        }
    });
    match r {
        Ok(_) if done => Ok(()),
        Ok(_) => Err(std::io::Error::other(
            "deflate() failed: output not finished",
        )),
        Err(e) => Err(std::io::Error::other(format!("deflate() failed: {}", e))),
    }
}

/// The gzip stream of `data` at nginx level `level`, appended to `out`:
/// zlib's own 10-byte header (so the bytes before the deflate data are
/// those nginx sends: XFL 4 at level 1, 2 at level 9, OS 3), libdeflate's
/// raw deflate (zlib-rs's for the few bytes libdeflate would store
/// uncompressed: [`tiny_deflate`]), then CRC-32 and length.
pub fn gzip_whole(level: u32, data: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    let i = (level.clamp(1, 9) - 1) as usize;
    let lvl = LIBDEFLATE_LEVEL[i];
    let xfl = match level {
        0 | 1 => 4,
        9 => 2,
        _ => 0,
    };
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, xfl, 3]);
    if data.len() <= libdeflate_passthrough(lvl) {
        tiny_deflate(level, data, out)?;
        out.extend_from_slice(&libdeflater::crc32(data).to_le_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        return Ok(());
    }
    let start = out.len();
    let n = WHOLE_COMPRESSORS.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() <= i {
            c.resize_with(i + 1, || None);
        }
        let comp = c[i].get_or_insert_with(|| {
            libdeflater::Compressor::new(libdeflater::CompressionLvl::new(lvl).unwrap_or_default())
        });
        let bound = comp.deflate_compress_bound(data.len());
        out.resize(start + bound, 0);
        comp.deflate_compress(data, &mut out[start..])
    });
    let n = n.map_err(|e| std::io::Error::other(format!("deflate() failed: {:?}", e)))?;
    out.truncate(start + n);
    out.extend_from_slice(&libdeflater::crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    Ok(())
}

impl Deflater {
    /// Leaves whole-body mode (the file grew past what was announced):
    /// what was gathered goes into a zlib-rs stream first.
    fn start_streaming(&mut self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let gathered = self.whole.take().unwrap_or_default();
        self.z = Some(take_compressor(self.key));
        self.stream(&gathered, false, out)
    }

    fn stream(&mut self, input: &[u8], last: bool, out: &mut Vec<u8>) -> std::io::Result<()> {
        let Some(z) = self.z.as_mut() else {
            return Ok(());
        };
        let flush = if last {
            FlushCompress::Finish
        } else {
            FlushCompress::None
        };
        let mut pos = 0;
        loop {
            if out.capacity() - out.len() < OUT_STEP {
                out.reserve(OUT_STEP);
            }
            let before = z.total_in();
            let st = z
                .compress_vec(&input[pos..], out, flush)
                .map_err(|e| std::io::Error::other(format!("deflate() failed: {}", e)))?;
            pos += (z.total_in() - before) as usize;
            if st == Status::StreamEnd {
                self.done = true;
                self.ratio.zin.store(z.total_in(), Ordering::Relaxed);
                self.ratio.zout.store(z.total_out(), Ordering::Relaxed);
                return Ok(());
            }
            // Not finishing: done once all input is taken and zlib did not
            // fill the room it had (nothing more is pending for now).
            if !last && pos >= input.len() && out.len() < out.capacity() {
                return Ok(());
            }
        }
    }
}

impl BodyFilter for Deflater {
    fn filter(&mut self, input: &[u8], last: bool, out: &mut Vec<u8>) -> std::io::Result<()> {
        if self.done {
            return Ok(());
        }
        if let Some(buf) = self.whole.as_mut() {
            if !last {
                if buf.len() + input.len() > WHOLE_MAX as usize {
                    self.start_streaming(out)?;
                    return self.stream(input, false, out);
                }
                buf.extend_from_slice(input);
                return Ok(());
            }
            let before = out.len();
            let zin = if buf.is_empty() {
                gzip_whole(self.level, input, out)?;
                input.len()
            } else {
                buf.extend_from_slice(input);
                let data = std::mem::take(buf);
                gzip_whole(self.level, &data, out)?;
                data.len()
            };
            self.done = true;
            self.ratio.zin.store(zin as u64, Ordering::Relaxed);
            self.ratio
                .zout
                .store((out.len() - before) as u64, Ordering::Relaxed);
            return Ok(());
        }
        if self.z.is_none() {
            self.z = Some(take_compressor(self.key));
        }
        self.stream(input, last, out)
    }
}

// ---------------------------------------------------------------------
// Variables.

/// Module variables (`$gzip_ratio`).
pub const VARS: &[&str] = &["gzip_ratio"];

pub fn var(cx: &Ctx<'_>, i: u8, out: &mut Vec<u8>) -> bool {
    if i != 0 {
        return false;
    }
    let r = match cx
        .guards
        .iter()
        .find_map(|g| g.downcast_ref::<Arc<Ratio>>())
    {
        Some(r) => r,
        None => return false,
    };
    let zin = r.zin.load(Ordering::Relaxed);
    let zout = r.zout.load(Ordering::Relaxed);
    match format_ratio(zin, zout) {
        Some(s) => {
            out.extend_from_slice(s.as_bytes());
            true
        }
        None => false,
    }
}

/// `zin/zout` with two decimals, rounded half up on the third (nginx's
/// format, e.g. "2.13").
pub fn format_ratio(zin: u64, zout: u64) -> Option<String> {
    if zin == 0 || zout == 0 {
        return None;
    }
    let mut int = zin / zout;
    let mut frac = (zin * 100 / zout) % 100;
    if (zin * 1000 / zout) % 10 > 4 {
        frac += 1;
        if frac > 99 {
            int += 1;
            frac = 0;
        }
    }
    Some(format!("{}.{:02}", int, frac))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_as_nginx() {
        for ok in [
            &b"gzip"[..],
            b"gzip, deflate",
            b"deflate, gzip",
            b"deflate,gzip",
            b"GZIP",
            b"gzip;q=0.5",
            b"gzip; q=1",
            b"gzip;q=1.0",
            b"gzip;q=0.001",
            b"gzip ,br",
            b"br, gzip;q=0.1, deflate",
            b"x-gzip, gzip",
        ] {
            assert!(accepts_gzip(ok), "{}", String::from_utf8_lossy(ok));
        }
        for no in [
            &b""[..],
            b"gzi",
            b"deflate",
            b"gzip;q=0",
            b"gzip;q=0.0",
            b"gzip;q=0.000",
            b"gzip; q=0",
            b"x-gzip",
            b"gzipx",
            b"gzip;level=1",
            b"gzip;q=2",
            b"gzip;q=0.0001",
            b"identity",
        ] {
            assert!(!accepts_gzip(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn msie6_mask() {
        assert!(is_msie6(
            b"Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1)"
        ));
        assert!(is_msie6(b"Mozilla/4.0 (compatible; MSIE 5.5; Windows 98)"));
        assert!(is_msie6(b"Mozilla/4.0 (compatible; MSIE 4.01; Windows 95)"));
        assert!(!is_msie6(
            b"Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1; SV1)"
        ));
        assert!(!is_msie6(
            b"Mozilla/4.0 (compatible; MSIE 7.0; Windows NT 6.0)"
        ));
        assert!(!is_msie6(b"Mozilla/4.0 (compatible; MSIE 6.0; Opera 8.0)"));
        assert!(is_msie6(b"MSIE 6.0"));
        assert!(!is_msie6(b"MSIE 6."), "needs a byte after the dot");
        assert!(!is_msie6(b"curl/8.0"));
    }

    fn resp_with(h: &[(&'static str, &str)]) -> Response {
        let mut r = Response::status(200);
        for (n, v) in h {
            r.headers.push(((*n).into(), v.as_bytes().to_vec()));
        }
        r
    }

    #[test]
    fn proxied_flags() {
        use proxied::*;
        let now = 1_700_000_000;
        let plain = resp_with(&[]);
        assert!(!proxied_ok(OFF, false, &plain, now));
        assert!(!proxied_ok(OFF | ANY, false, &plain, now));
        assert!(proxied_ok(ANY, false, &plain, now));
        // No Expires/Cache-Control: everything but off passes.
        for f in [EXPIRED, NO_CACHE, NO_STORE, PRIVATE, NO_LM, NO_ETAG, AUTH] {
            assert!(proxied_ok(f, false, &plain, now), "{:x}", f);
        }
        let past = resp_with(&[("Expires", "Thu, 01 Jan 1970 00:00:01 GMT")]);
        let future = resp_with(&[("Expires", "Thu, 01 Jan 2099 00:00:01 GMT")]);
        let bad = resp_with(&[("Expires", "0")]);
        assert!(proxied_ok(EXPIRED, false, &past, now));
        assert!(!proxied_ok(EXPIRED, false, &future, now));
        assert!(!proxied_ok(EXPIRED, false, &bad, now));
        assert!(!proxied_ok(NO_CACHE, false, &past, now));
        let cc = |v: &str| resp_with(&[("Cache-Control", v)]);
        assert!(proxied_ok(NO_CACHE, false, &cc("no-cache"), now));
        assert!(proxied_ok(NO_CACHE, false, &cc("max-age=0, No-Cache"), now));
        assert!(!proxied_ok(NO_CACHE, false, &cc("no-cache=x"), now));
        assert!(!proxied_ok(NO_CACHE, false, &cc("no-store"), now));
        assert!(proxied_ok(NO_STORE, false, &cc("no-store"), now));
        assert!(proxied_ok(PRIVATE, false, &cc("private"), now));
        assert!(!proxied_ok(PRIVATE, false, &cc("public"), now));
        assert!(!proxied_ok(EXPIRED, false, &cc("private"), now));
        let lm = resp_with(&[("Last-Modified", "Thu, 01 Jan 1970 00:00:01 GMT")]);
        assert!(!proxied_ok(NO_LM, false, &lm, now));
        assert!(proxied_ok(NO_ETAG, false, &lm, now));
        let et = resp_with(&[("ETag", "\"x\"")]);
        assert!(!proxied_ok(NO_ETAG, false, &et, now));
        assert!(proxied_ok(AUTH, true, &et, now));
        assert!(!proxied_ok(AUTH | NO_ETAG, false, &et, now));
    }

    #[test]
    fn weak_etag() {
        let mut r = resp_with(&[("ETag", "\"a-b\"")]);
        weaken_etag(&mut r);
        assert_eq!(r.header("ETag"), Some(&b"W/\"a-b\""[..]));
        weaken_etag(&mut r);
        assert_eq!(r.header("ETag"), Some(&b"W/\"a-b\""[..]));
        let mut r = resp_with(&[("ETag", "odd")]);
        weaken_etag(&mut r);
        assert_eq!(r.header("ETag"), None);
    }

    #[test]
    fn ratio_format() {
        assert_eq!(format_ratio(0, 5), None);
        assert_eq!(format_ratio(1000, 1000).as_deref(), Some("1.00"));
        assert_eq!(format_ratio(2125, 1000).as_deref(), Some("2.13"));
        assert_eq!(format_ratio(2124, 1000).as_deref(), Some("2.12"));
        assert_eq!(format_ratio(1999, 1000).as_deref(), Some("2.00"));
    }

    #[test]
    fn deflater_streams_and_ends() {
        let ratio = Arc::new(Ratio::default());
        let mut f = Deflater {
            z: None,
            whole: None,
            level: 1,
            key: (1, 15),
            ratio: ratio.clone(),
            done: false,
        };
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        for (i, c) in data.chunks(65536).enumerate() {
            let mut o = Vec::new();
            f.filter(c, false, &mut o).expect("deflate");
            // Each slice's output stays small: no whole-body buffering.
            assert!(o.len() < 200_000, "slice {} gave {}", i, o.len());
            out.extend_from_slice(&o);
        }
        f.filter(b"", true, &mut out).expect("finish");
        assert_eq!(&out[..4], b"\x1f\x8b\x08\x00");
        let mut d = flate2::read::GzDecoder::new(&out[..]);
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut d, &mut back).expect("inflate");
        assert_eq!(back, data);
        assert_eq!(ratio.zin.load(Ordering::Relaxed), data.len() as u64);
        assert_eq!(ratio.zout.load(Ordering::Relaxed), out.len() as u64);
    }

    #[test]
    fn tiny_bodies_are_deflated_as_zlib_does() {
        // zlib 1.2.13 (nginx's): the gzip stream of "SEE-THIS" is 28
        // bytes and of an empty body 20 (proxy_cache.t 12 and 13), where
        // libdeflate alone stores them (31 and 23).
        for (data, deflated) in [
            (
                &b"SEE-THIS"[..],
                &b"\x0b\x76\x75\xd5\x0d\xf1\xf0\x0c\x06\x00"[..],
            ),
            (b"", b"\x03\x00"),
        ] {
            for level in [1, 6, 9] {
                let mut out = Vec::new();
                gzip_whole(level, data, &mut out).expect("gzip");
                assert_eq!(&out[10..out.len() - 8], deflated, "level {}", level);
                let mut d = flate2::read::GzDecoder::new(&out[..]);
                let mut back = Vec::new();
                std::io::Read::read_to_end(&mut d, &mut back).expect("inflate");
                assert_eq!(back, data);
            }
        }
        // Past the pass-through size, libdeflate again (and valid).
        let data = b"<html><body>a page of more than fifty-five bytes</body></html>";
        let mut out = Vec::new();
        gzip_whole(1, data, &mut out).expect("gzip");
        let mut d = flate2::read::GzDecoder::new(&out[..]);
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut d, &mut back).expect("inflate");
        assert_eq!(back, data);
    }

    #[test]
    fn types_match_without_parameters() {
        let t = Types::List(Arc::new(vec!["text/html".into(), "text/css".into()]));
        assert!(t.matches(Some("text/html; charset=utf-8")));
        assert!(t.matches(Some("text/css;charset=\"utf-8\"")));
        assert!(!t.matches(Some("text/css; foo=bar")));
        assert!(!t.matches(Some("text/css ; charset=utf-8")));
        assert!(!t.matches(Some("text/css; foo=bar; charset=utf-8")));
        assert!(t.matches(Some("Text/CSS")));
        assert!(!t.matches(Some("text/plain")));
        assert!(!t.matches(None));
        assert!(Types::Any.matches(None));
    }
}
#[cfg(test)]
mod level_map {
    /// Run in release by `cargo test --release` (where the miscompile was).
    #[test]
    fn level_one_is_zlib_rs_two() {
        assert_eq!(super::zlib_level(std::hint::black_box(1)), 2);
        assert_eq!(super::zlib_level(std::hint::black_box(0)), 2);
        assert_eq!(super::zlib_level(std::hint::black_box(6)), 6);
        assert_eq!(super::zlib_level(std::hint::black_box(9)), 9);
        assert_eq!(super::zlib_level(std::hint::black_box(12)), 9);
    }
}
