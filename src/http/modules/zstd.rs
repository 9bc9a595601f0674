//! `zstd*`: Zstandard compression of responses (`Content-Encoding: zstd`,
//! which current browsers accept) with the directives of
//! zstd-nginx-module (`zstd`, `zstd_comp_level`, `zstd_static`,
//! `zstd_types`, `zstd_min_length`, `zstd_buffers`).
//!
//! Data flow as that module's filter, and as [`super::brotli`]'s: the
//! header filter runs after brotli's and before gzip's (so a client that
//! accepts br and zstd gets br, one that accepts zstd and gzip gets zstd);
//! it takes 200/403/404 responses with a body (not HEAD), no
//! Content-Encoding, a length of at least `zstd_min_length` when known,
//! and a type in `zstd_types`, marks Vary, and for a client whose
//! Accept-Encoding starts with `zstd` or has it as a token (q-values are
//! not looked at, as in the module) sets `Content-Encoding: zstd`, drops
//! Content-Length and Accept-Ranges, weakens the ETag, and installs
//! [`Encoder`] (one zstd frame, output drained after each slice).
//! `$zstd_ratio` has three decimals, truncated, as the module prints it.
//!
//! `zstd_static on|always` serves `FILE.zst` (after `FILE.br`, before
//! `FILE.gz`). `zstd_dict_file` is not supported.

use std::io::Write as _;
use std::sync::Arc;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::{Body, BodyFilter, Response};

use super::brotli::{add_types, size_arg, static_mode};
use super::gzip::{self, Types};
use super::gzip_static::Mode;

#[derive(Debug, Clone, Default)]
pub struct ZstdLoc {
    pub enable: Option<bool>,
    pub static_mode: Option<Mode>,
    pub types: Option<Types>,
    pub min_length: Option<u64>,
    /// Default 1; negative levels are zstd's fast modes.
    pub comp_level: Option<i32>,
    /// `zstd_buffers`: accepted; output goes out per slice.
    pub buffers: Option<(u64, u64)>,
}

impl ZstdLoc {
    pub fn merge(&mut self, p: &ZstdLoc) {
        macro_rules! inherit {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = p.$f.clone(); } )* };
        }
        inherit!(enable, static_mode, types, min_length, comp_level, buffers);
    }
}

fn set_enable(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.zstd.enable, flag(d)?, d)
}

fn set_static(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let m = static_mode(d)?;
    set_once(&mut l.modules.zstd.static_mode, m, d)
}

fn set_types(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    add_types(&mut l.modules.zstd.types, d);
    Ok(())
}

fn set_min_length(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = size_arg(d)?;
    set_once(&mut l.modules.zstd.min_length, v, d)
}

fn set_comp_level(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if l.modules.zstd.comp_level.is_some() {
        return Err(ConfError::at(
            format!("\"{}\" directive is duplicate", d.name),
            d,
        ));
    }
    let a = arg(d, 0);
    let (neg, digits) = match a.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, a),
    };
    let n = value::number(digits)
        .ok_or_else(|| ConfError::at(format!("\"{}\" directive invalid number", d.name), d))?;
    let v = if neg { -(n as i64) } else { n as i64 };
    let (lo, hi) = (
        i64::from(zstd::zstd_safe::min_c_level()),
        i64::from(zstd::zstd_safe::max_c_level()),
    );
    if v == 0 || v < lo || v > hi {
        return Err(ConfError::at(
            format!(
                "zstd compress level must between {} and {} excluding 0",
                lo, hi
            ),
            d,
        ));
    }
    l.modules.zstd.comp_level = Some(v as i32);
    Ok(())
}

fn set_buffers(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = gzip::bufs(d)?;
    set_once(&mut l.modules.zstd.buffers, v, d)
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "zstd",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::Flag,
        set: Setter::Loc(set_enable),
    },
    Spec {
        name: "zstd_static",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_static),
    },
    Spec {
        name: "zstd_types",
        ctx: ctx::HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_types),
    },
    Spec {
        name: "zstd_min_length",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_min_length),
    },
    Spec {
        name: "zstd_comp_level",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_comp_level),
    },
    Spec {
        name: "zstd_buffers",
        ctx: ctx::HSL,
        args: Args::take(2),
        set: Setter::Loc(set_buffers),
    },
];

/// zstd-nginx-module's test: the value starts with `zstd`, or its first
/// `zstd` (case-insensitive) stands as a token (start, `,` or ` ` before;
/// end, `,`, ` ` or `;` after). No q-values.
pub fn accepts_zstd(ae: &[u8]) -> bool {
    if ae.len() < 4 {
        return false;
    }
    if ae.starts_with(b"zstd") {
        return true;
    }
    let Some(p) = ae.windows(4).position(|w| w.eq_ignore_ascii_case(b"zstd")) else {
        return false;
    };
    if p != 0 && !matches!(ae[p - 1], b',' | b' ') {
        return false;
    }
    matches!(ae.get(p + 4), None | Some(b',' | b' ' | b';'))
}

fn client_takes(cx: &Ctx<'_>) -> bool {
    cx.sub_depth == 0 && cx.req.header("accept-encoding").is_some_and(accepts_zstd)
}

/// The module's `gzip_tested = 1; gzip_ok = 0`.
fn set_gzip_refused(cx: &mut Ctx<'_>) {
    cx.notes.retain(|(k, _)| *k != "gzip_ok");
    // Refused is the empty value (no allocation); see gzip::gzip_ok.
    cx.notes.push(("gzip_ok", Vec::new()));
}

/// `zstd_static`: `FILE.zst` for a client that takes zstd (or everyone
/// with `always`).
pub async fn try_static(cx: &mut Ctx<'_>, path: &[u8]) -> Option<Box<Response>> {
    if !matches!(cx.req.method, Method::Get | Method::Head) {
        return None;
    }
    let mode = cx.loc.modules.zstd.static_mode.unwrap_or(Mode::Off);
    let ok = match mode {
        Mode::Off => return None,
        Mode::On => client_takes(cx),
        Mode::Always => true,
    };
    if ok && mode == Mode::On {
        set_gzip_refused(cx);
    }
    super::gzip_static::serve_precompressed(cx, path, mode, ok, "zstd").await
}

/// Whether the zstd filter would take this response, before asking the client.
pub fn candidate(cx: &Ctx<'_>, resp: &Response) -> bool {
    let z = &cx.loc.modules.zstd;
    z.enable.unwrap_or(false)
        && matches!(resp.status, 200 | 403 | 404)
        && cx.req.method != Method::Head
        && !matches!(resp.body, Body::Empty)
        && resp.header("Content-Encoding").is_none_or(|v| v.is_empty())
        && resp
            .content_length
            .is_none_or(|n| n >= z.min_length.unwrap_or(20))
        && z.types
            .as_ref()
            .unwrap_or_else(|| Types::html_only())
            .matches(resp.content_type.as_deref())
}

/// Whether this client takes zstd (and then gets no gzip).
pub fn client_ok(cx: &mut Ctx<'_>) -> bool {
    let ok = client_takes(cx);
    if ok {
        set_gzip_refused(cx);
    }
    ok
}

/// The zstd header filter (after brotli's, before gzip's).
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    if !candidate(cx, resp) {
        return;
    }
    gzip::mark_vary(cx);
    if !client_ok(cx) {
        return;
    }
    let level = cx.loc.modules.zstd.comp_level.unwrap_or(1);
    let enc = match zstd::stream::write::Encoder::new(Vec::new(), level) {
        Ok(e) => e,
        // Nothing sent yet: the response goes out uncompressed.
        Err(_) => return,
    };
    resp.headers
        .push(("Content-Encoding".into(), b"zstd".to_vec()));
    gzip::clear_length(cx, resp);
    let ratio = Arc::new(gzip::Ratio::default());
    cx.guards.push(Box::new(ZstdRatio(ratio.clone())));
    resp.filters.push(Box::new(Encoder {
        e: Some(enc),
        zin: 0,
        zout: 0,
        ratio,
    }));
}

/// `data` compressed whole (one frame, with its size), for the cache.
pub fn compress_whole(level: i32, data: &[u8]) -> std::io::Result<Vec<u8>> {
    zstd::bulk::compress(data, level)
}

/// `$zstd_ratio`'s source, told apart from gzip's in the guards.
pub struct ZstdRatio(Arc<gzip::Ratio>);

impl ZstdRatio {
    pub fn new(r: Arc<gzip::Ratio>) -> ZstdRatio {
        ZstdRatio(r)
    }
}

type Enc = zstd::stream::write::Encoder<'static, Vec<u8>>;

/// The zstd body filter.
struct Encoder {
    e: Option<Enc>,
    zin: u64,
    zout: u64,
    ratio: Arc<gzip::Ratio>,
}

impl BodyFilter for Encoder {
    fn filter(&mut self, input: &[u8], last: bool, out: &mut Vec<u8>) -> std::io::Result<()> {
        let Some(e) = self.e.as_mut() else {
            return Ok(());
        };
        e.write_all(input)?;
        self.zin += input.len() as u64;
        let before = out.len();
        if last {
            if let Some(e) = self.e.take() {
                out.extend_from_slice(&e.finish()?);
            }
            self.zout += (out.len() - before) as u64;
            self.ratio.set(self.zin, self.zout);
        } else {
            out.append(e.get_mut());
            self.zout += (out.len() - before) as u64;
        }
        Ok(())
    }
}

/// Module variables (`$zstd_ratio`).
pub const VARS: &[&str] = &["zstd_ratio"];

pub fn var(cx: &Ctx<'_>, i: u8, out: &mut Vec<u8>) -> bool {
    if i != 0 {
        return false;
    }
    let Some(r) = cx.guards.iter().find_map(|g| g.downcast_ref::<ZstdRatio>()) else {
        return false;
    };
    let (zin, zout) = r.0.get();
    if zout == 0 {
        return false;
    }
    out.extend_from_slice(format!("{}.{:03}", zin / zout, zin * 1000 / zout % 1000).as_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_as_the_module() {
        for ok in [
            &b"zstd"[..],
            b"zstd;q=0",
            b"gzip, zstd",
            b"br,zstd;q=0.5",
            b"ZSTD",
            b"zstdx",
        ] {
            assert!(accepts_zstd(ok), "{}", String::from_utf8_lossy(ok));
        }
        for no in [&b""[..], b"zst", b"gzip", b"xzstd", b"gzip, zstdx"] {
            assert!(!accepts_zstd(no), "{}", String::from_utf8_lossy(no));
        }
    }

    #[test]
    fn encoder_round_trip() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 89) as u8).collect();
        let ratio = Arc::new(gzip::Ratio::default());
        let mut f = Encoder {
            e: Some(zstd::stream::write::Encoder::new(Vec::new(), 3).expect("encoder")),
            zin: 0,
            zout: 0,
            ratio: ratio.clone(),
        };
        let mut out = Vec::new();
        for c in data.chunks(65536) {
            f.filter(c, false, &mut out).expect("encode");
        }
        f.filter(b"", true, &mut out).expect("finish");
        assert_eq!(zstd::decode_all(&out[..]).expect("decode"), data);
        assert_eq!(ratio.get(), (data.len() as u64, out.len() as u64));
    }
}
