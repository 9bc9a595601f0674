//! `brotli*`: brotli compression of responses (`Content-Encoding: br`)
//! with the directives of the widely deployed ngx_brotli module (its
//! filter and static parts), which Debian packages as
//! `libnginx-mod-http-brotli-filter` and `-static`.
//!
//! Data flow, as ngx_brotli's filter: the header filter ([`header_filter`],
//! ahead of gzip's, as the dynamically loaded module sits on top of
//! nginx's filter chain) takes 200/403/404 responses that have a body (or
//! answer HEAD), no Content-Encoding, at least `brotli_min_length` bytes when the
//! length is known and a type in `brotli_types`; it marks the response as
//! varying on Accept-Encoding, and if the client accepts `br` it adds
//! `Content-Encoding: br`, drops Content-Length and Accept-Ranges, weakens
//! the ETag (HEAD included: Debian's version encodes those), and installs [`Encoder`], which compresses slice by slice
//! (bounded memory) with the window shrunk to the body when its length is
//! known. gzip then sees the Content-Encoding and leaves the response
//! alone: when a client accepts both, brotli wins whatever the q-values
//! (only `br;q=0` refuses it), as with ngx_brotli.
//!
//! `brotli_static on|always` serves `FILE.br` before `gzip_static` looks
//! for `FILE.gz` (ngx_brotli's static handler runs first in the content
//! phase), through the same lookup ([`super::gzip_static::serve_precompressed`]).
//! Its Accept-Encoding test is the filter's ([`accepts_br`]), as in
//! Debian's ngx_brotli 1.0.0rc (checked: `br;q=0` gets no `.br`).
//!
//! Facts checked against nginx 1.22.1 with ngx_brotli 1.0.0rc (Debian):
//! see tests/it/brotli.rs.

use std::io::Write as _;
use std::sync::Arc;

use crate::config::registry::{arg, ctx, duplicate, flag, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::{Body, BodyFilter, Response};

use super::gzip::{self, Types};
use super::gzip_static::Mode;

#[derive(Debug, Clone, Default)]
pub struct BrotliLoc {
    pub enable: Option<bool>,
    pub static_mode: Option<Mode>,
    pub types: Option<Types>,
    pub min_length: Option<u64>,
    /// Quality 0-11 (default 6).
    pub comp_level: Option<u32>,
    /// `brotli_window` as log2 of the size (10..=24; default 19, 512k).
    pub window_bits: Option<u32>,
    /// `brotli_buffers`: accepted, unused (deprecated in ngx_brotli too).
    pub buffers: Option<(u64, u64)>,
}

impl BrotliLoc {
    pub fn merge(&mut self, p: &BrotliLoc) {
        macro_rules! inherit {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = p.$f.clone(); } )* };
        }
        inherit!(
            enable,
            static_mode,
            types,
            min_length,
            comp_level,
            window_bits,
            buffers
        );
    }
}

fn set_enable(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.brotli.enable, flag(d)?, d)
}

fn set_static(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let m = static_mode(d)?;
    set_once(&mut l.modules.brotli.static_mode, m, d)
}

/// `off|on|always` of the `*_static` directives.
pub fn static_mode(d: &Directive) -> ConfResult<Mode> {
    Ok(match arg(d, 0) {
        "off" => Mode::Off,
        "on" => Mode::On,
        "always" => Mode::Always,
        v => return Err(ConfError::at(format!("invalid value \"{}\"", v), d)),
    })
}

/// `*_types`: repeated directives at one level add up; `text/html` is
/// always in; `*` is any type.
pub fn add_types(slot: &mut Option<Types>, d: &Directive) {
    let mut list = match slot.take() {
        Some(Types::Any) => {
            *slot = Some(Types::Any);
            return;
        }
        Some(Types::List(v)) => (*v).clone(),
        None => vec!["text/html".to_string()],
    };
    for a in &d.args {
        if a.value == "*" {
            *slot = Some(Types::Any);
            return;
        }
        list.push(a.value.to_ascii_lowercase());
    }
    *slot = Some(Types::List(Arc::new(list)));
}

fn set_types(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    add_types(&mut l.modules.brotli.types, d);
    Ok(())
}

/// A size slot (`*_min_length`).
pub fn size_arg(d: &Directive) -> ConfResult<u64> {
    value::size(arg(d, 0))
        .ok_or_else(|| ConfError::at(format!("\"{}\" directive invalid value", d.name), d))
}

/// A number slot with nginx's bounds message.
pub fn level_arg(d: &Directive, lo: u64, hi: u64) -> ConfResult<u32> {
    let v = value::number(arg(d, 0))
        .ok_or_else(|| ConfError::at(format!("\"{}\" directive invalid number", d.name), d))?;
    if !(lo..=hi).contains(&v) {
        return Err(ConfError::at(
            format!("value must be between {} and {}", lo, hi),
            d,
        ));
    }
    Ok(v as u32)
}

fn set_min_length(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = size_arg(d)?;
    set_once(&mut l.modules.brotli.min_length, v, d)
}

fn set_comp_level(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if l.modules.brotli.comp_level.is_some() {
        return Err(duplicate(d));
    }
    l.modules.brotli.comp_level = Some(level_arg(d, 0, 11)?);
    Ok(())
}

fn set_window(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if l.modules.brotli.window_bits.is_some() {
        return Err(duplicate(d));
    }
    let v = size_arg(d)?;
    let bits = (10..=24u32).find(|b| 1u64 << b == v).ok_or_else(|| {
        ConfError::at(
            format!(
                "\"{}\" directive must be 1k, 2k, 4k, 8k, 16k, 32k, 64k, 128k, 256k, 512k, 1m, 2m, 4m, 8m or 16m",
                d.name
            ),
            d,
        )
    })?;
    l.modules.brotli.window_bits = Some(bits);
    Ok(())
}

fn set_buffers(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = gzip::bufs(d)?;
    set_once(&mut l.modules.brotli.buffers, v, d)
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "brotli",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::Flag,
        set: Setter::Loc(set_enable),
    },
    Spec {
        name: "brotli_static",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_static),
    },
    Spec {
        name: "brotli_types",
        ctx: ctx::HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_types),
    },
    Spec {
        name: "brotli_min_length",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_min_length),
    },
    Spec {
        name: "brotli_comp_level",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_comp_level),
    },
    Spec {
        name: "brotli_window",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_window),
    },
    Spec {
        name: "brotli_buffers",
        ctx: ctx::HSL,
        args: Args::take(2),
        set: Setter::Loc(set_buffers),
    },
];

/// ngx_brotli filter's Accept-Encoding test: a `br` token (after the
/// start, `,` or ` `; followed by the end, `,`, ` ` or `;`), refused only
/// by a `;q=0` (`0`, `0.`, `0.0`, `0.00`, `0.000`) right after it. The
/// first `br` token that stands alone decides.
pub fn accepts_br(ae: &[u8]) -> bool {
    let at = |i: usize| ae.get(i).copied();
    let mut from = 0;
    loop {
        let Some(i) = ae
            .get(from..)
            .and_then(|r| r.windows(2).position(|w| w.eq_ignore_ascii_case(b"br")))
        else {
            return false;
        };
        let start = from + i;
        from = start + 2;
        let before = if start == 0 { b' ' } else { ae[start - 1] };
        let after = at(from).unwrap_or(b' ');
        if !matches!(before, b',' | b' ') || !matches!(after, b',' | b' ' | b';') {
            continue;
        }
        // Parameters: only an explicit zero quality refuses.
        let mut p = from;
        let skip = |p: &mut usize| {
            while at(*p) == Some(b' ') {
                *p += 1;
            }
        };
        skip(&mut p);
        if at(p) != Some(b';') {
            return true;
        }
        p += 1;
        skip(&mut p);
        if at(p) != Some(b'q') {
            return true;
        }
        p += 1;
        skip(&mut p);
        if at(p) != Some(b'=') {
            return true;
        }
        p += 1;
        skip(&mut p);
        if at(p) != Some(b'0') {
            return true;
        }
        p += 1;
        if at(p) != Some(b'.') {
            return false;
        }
        p += 1;
        for _ in 0..3 {
            match at(p) {
                Some(c @ b'0'..=b'9') => {
                    if c > b'0' {
                        return true;
                    }
                }
                _ => return false,
            }
            p += 1;
        }
        return false;
    }
}

/// `brotli_static`: `FILE.br` for a client that takes br (or everyone,
/// with `always`). Called by the static handler before gzip_static.
pub async fn try_static(cx: &mut Ctx<'_>, path: &[u8]) -> Option<Box<Response>> {
    if !matches!(cx.req.method, Method::Get | Method::Head) {
        return None;
    }
    let mode = cx.loc.modules.brotli.static_mode.unwrap_or(Mode::Off);
    let ok = match mode {
        Mode::Off => return None,
        Mode::On => cx.sub_depth == 0 && cx.req.header("accept-encoding").is_some_and(accepts_br),
        Mode::Always => true,
    };
    if ok && mode == Mode::On {
        // As ngx_brotli: gzip is then not offered to this client.
        set_gzip_refused(cx);
    }
    super::gzip_static::serve_precompressed(cx, path, mode, ok, "br").await
}

/// ngx_brotli's `gzip_tested = 1; gzip_ok = 0`.
fn set_gzip_refused(cx: &mut Ctx<'_>) {
    cx.notes.retain(|(k, _)| *k != "gzip_ok");
    // Refused is the empty value (no allocation); see gzip::gzip_ok.
    cx.notes.push(("gzip_ok", Vec::new()));
}

/// Whether the brotli filter would take this response (status, body,
/// encoding, length, type), before asking the client.
pub fn candidate(cx: &Ctx<'_>, resp: &Response) -> bool {
    let b = &cx.loc.modules.brotli;
    b.enable.unwrap_or(false)
        && matches!(resp.status, 200 | 403 | 404)
        // Debian's ngx_brotli (1.0.0rc) encodes HEAD responses too (later
        // versions skip header-only ones); the body of a HEAD answer is
        // never sent anyway.
        && (cx.req.method == Method::Head || !matches!(resp.body, Body::Empty))
        && resp.header("Content-Encoding").is_none_or(|v| v.is_empty())
        && resp
            .content_length
            .is_none_or(|n| n >= b.min_length.unwrap_or(20))
        && b.types
            .as_ref()
            .unwrap_or_else(|| Types::html_only())
            .matches(resp.content_type.as_deref())
}

/// Whether this client takes br from the filter (and so gets no gzip).
pub fn client_ok(cx: &mut Ctx<'_>) -> bool {
    let ok = cx.sub_depth == 0 && cx.req.header("accept-encoding").is_some_and(accepts_br);
    if ok {
        set_gzip_refused(cx);
    }
    ok
}

/// The brotli header filter (runs before gzip's).
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    if !candidate(cx, resp) {
        return;
    }
    gzip::mark_vary(cx);
    if !client_ok(cx) {
        return;
    }
    let b = &cx.loc.modules.brotli;
    let quality = b.comp_level.unwrap_or(6);
    let max_bits = b.window_bits.unwrap_or(19);
    let lgwin = window_for(resp.content_length, max_bits);
    let w = if gzip::has_body(cx, resp) {
        // The directives' ranges are the encoder's, so this does not fail
        // short of memory; if it did, the body would go out as it is.
        let Ok(w) = new_writer(quality, lgwin) else {
            return;
        };
        Some(w)
    } else {
        None
    };
    resp.headers
        .push(("Content-Encoding".into(), b"br".to_vec()));
    gzip::clear_length(cx, resp);
    let Some(w) = w else {
        return;
    };
    let ratio = Arc::new(gzip::Ratio::default());
    cx.guards.push(Box::new(BrRatio(ratio.clone())));
    resp.filters.push(Box::new(Encoder {
        w: Some(w),
        zin: 0,
        zout: 0,
        ratio,
    }));
}

/// ngx_brotli's window: the smallest from 2^10 up that holds a body of
/// known length, at most the configured one.
pub fn window_for(len: Option<u64>, max_bits: u32) -> u32 {
    match len.filter(|&n| n > 0) {
        Some(n) => {
            let mut w = 10;
            while w < max_bits && n > (1u64 << w) {
                w += 1;
            }
            w
        }
        None => max_bits,
    }
}

/// A brotli stream: Google's C encoder (the library ngx_brotli links)
/// through the `brotlic` crate. Measured against the pure-Rust `brotli`
/// crate on bench/gzip_small.py's pages (BENCHMARKS.md, "brotli: Google's
/// C encoder"): 1.5-3.2x fewer instructions per response at quality 4 and
/// 6, with ngx_brotli's very bytes at quality 4.
type Writer = brotlic::CompressorWriter<Vec<u8>>;

fn new_writer(quality: u32, lgwin: u32) -> std::io::Result<Writer> {
    let bad = |e: brotlic::SetParameterError| std::io::Error::other(e.to_string());
    let q = brotlic::Quality::new(quality.min(11) as u8).map_err(bad)?;
    let w = brotlic::WindowSize::new(lgwin.clamp(10, 24) as u8).map_err(bad)?;
    let enc = brotlic::BrotliEncoderOptions::new()
        .quality(q)
        .window_size(w)
        .build()
        .map_err(bad)?;
    Ok(brotlic::CompressorWriter::with_encoder(enc, Vec::new()))
}

/// Finishes the stream and gives what it wrote.
fn finish(w: Writer) -> std::io::Result<Vec<u8>> {
    w.into_inner()
        .map_err(|e| std::io::Error::other(e.error().to_string()))
}

/// `data` compressed whole, for the compressed-file cache (the same bytes
/// the filter sends for it).
pub fn compress_whole(quality: u32, max_bits: u32, data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut w = new_writer(quality, window_for(Some(data.len() as u64), max_bits))?;
    w.write_all(data)?;
    finish(w)
}

/// `$brotli_ratio`'s source, told apart from gzip's in the guards.
pub struct BrRatio(Arc<gzip::Ratio>);

impl BrRatio {
    pub fn new(r: Arc<gzip::Ratio>) -> BrRatio {
        BrRatio(r)
    }
}

/// The brotli body filter: one stream; output drained after each slice.
struct Encoder {
    w: Option<Writer>,
    zin: u64,
    zout: u64,
    ratio: Arc<gzip::Ratio>,
}

impl Drop for Encoder {
    fn drop(&mut self) {
        // A response cut short (the client left): the writer would finish
        // the stream on drop, compressing what it holds for nobody.
        if let Some(w) = self.w.take() {
            drop(w.into_parts());
        }
    }
}

impl BodyFilter for Encoder {
    fn filter(&mut self, input: &[u8], last: bool, out: &mut Vec<u8>) -> std::io::Result<()> {
        let Some(w) = self.w.as_mut() else {
            return Ok(());
        };
        w.write_all(input)?;
        self.zin += input.len() as u64;
        let before = out.len();
        if last {
            if let Some(w) = self.w.take() {
                out.extend_from_slice(&finish(w)?);
            }
        } else {
            out.append(w.get_mut());
        }
        self.zout += (out.len() - before) as u64;
        if last {
            self.ratio.set(self.zin, self.zout);
        }
        Ok(())
    }
}

/// Module variables (`$brotli_ratio`).
pub const VARS: &[&str] = &["brotli_ratio"];

pub fn var(cx: &Ctx<'_>, i: u8, out: &mut Vec<u8>) -> bool {
    if i != 0 {
        return false;
    }
    let Some(r) = cx.guards.iter().find_map(|g| g.downcast_ref::<BrRatio>()) else {
        return false;
    };
    let (zin, zout) = r.0.get();
    match gzip::format_ratio(zin, zout) {
        Some(s) => {
            out.extend_from_slice(s.as_bytes());
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_as_ngx_brotli() {
        for ok in [
            &b"br"[..],
            b"gzip, br",
            b"br;q=0.5",
            b"br; q=1",
            b"gzip,br",
            b"BR",
            b"br;q=0.001",
            b"br;x=0",
            b"deflate, gzip, br, zstd",
        ] {
            assert!(accepts_br(ok), "{}", String::from_utf8_lossy(ok));
        }
        for no in [
            &b""[..],
            b"b",
            b"gzip",
            b"brotli",
            b"xbr",
            b"br;q=0",
            b"br;q=0.",
            b"br; q=0.0",
            b"br;q=0.000",
        ] {
            assert!(!accepts_br(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn encoder_round_trip() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 97) as u8).collect();
        let ratio = Arc::new(gzip::Ratio::default());
        let mut f = Encoder {
            w: Some(new_writer(4, 19).expect("encoder")),
            zin: 0,
            zout: 0,
            ratio: ratio.clone(),
        };
        let mut out = Vec::new();
        for c in data.chunks(65536) {
            f.filter(c, false, &mut out).expect("encode");
        }
        f.filter(b"", true, &mut out).expect("finish");
        let mut back = Vec::new();
        brotli::BrotliDecompress(&mut &out[..], &mut back).expect("decode");
        assert_eq!(back, data);
        assert_eq!(ratio.get(), (data.len() as u64, out.len() as u64));
        assert_eq!(window_for(Some(1000), 19), 10);
        assert_eq!(window_for(Some(5000), 19), 13);
        assert_eq!(window_for(Some(10_000_000), 19), 19);
    }
}
