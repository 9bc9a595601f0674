//! `gzip_static`, `gunzip`: serving precompressed `.gz` files, and
//! decompressing gzip-encoded responses for clients that cannot take them.
//!
//! `gzip_static on` serves `FILE.gz` instead of `FILE` when it exists and
//! the client accepts gzip ([`super::gzip::gzip_ok`]); `always` serves it
//! to everyone. The `.gz` is opened through the open-file cache and sent
//! through the file-I/O layer (sendfile, thread pools) like any file, with
//! its own size, Last-Modified and ETag, the type of the original name and
//! `Content-Encoding: gzip`. As in nginx 1.22.1 it does not advertise or
//! serve byte ranges (no Accept-Ranges).
//!
//! `gunzip on` is a header and body filter: a response with
//! `Content-Encoding: gzip` going to a client without gzip support loses
//! the encoding and streams through an inflater (bounded per input slice;
//! see [`Inflater`]).

use flate2::{Decompress, FlushDecompress, Status};

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::{BodyFilter, Response};

use super::gzip;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Off,
    On,
    Always,
}

#[derive(Debug, Clone, Default)]
pub struct GzipStaticLoc {
    pub mode: Option<Mode>,
    pub gunzip: Option<bool>,
    /// `gunzip_buffers N SIZE`: accepted; output is bounded per slice.
    pub gunzip_buffers: Option<(u64, u64)>,
}

impl GzipStaticLoc {
    pub fn merge(&mut self, p: &GzipStaticLoc) {
        if self.mode.is_none() {
            self.mode = p.mode;
        }
        if self.gunzip.is_none() {
            self.gunzip = p.gunzip;
        }
        if self.gunzip_buffers.is_none() {
            self.gunzip_buffers = p.gunzip_buffers;
        }
    }
}

fn set_static(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let m = match arg(d, 0) {
        "off" => Mode::Off,
        "on" => Mode::On,
        "always" => Mode::Always,
        v => return Err(ConfError::at(format!("invalid value \"{}\"", v), d)),
    };
    set_once(&mut l.modules.gzip_static.mode, m, d)
}

fn set_gunzip(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.gzip_static.gunzip, flag(d)?, d)
}

fn set_gunzip_buffers(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = gzip::bufs(d)?;
    set_once(&mut l.modules.gzip_static.gunzip_buffers, v, d)
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "gzip_static",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_static),
    },
    Spec {
        name: "gunzip",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_gunzip),
    },
    Spec {
        name: "gunzip_buffers",
        ctx: ctx::HSL,
        args: Args::take(2),
        set: Setter::Loc(set_gunzip_buffers),
    },
];

/// Called by the static handler for a regular file at `path`: returns a
/// response serving `path.gz` instead, when gzip_static applies. A `.gz`
/// that exists but cannot be opened is logged and the plain file is served.
pub async fn try_serve(cx: &mut Ctx<'_>, path: &[u8]) -> Option<Box<Response>> {
    if !matches!(cx.req.method, Method::Get | Method::Head) {
        return None;
    }
    let mode = cx.loc.modules.gzip_static.mode.unwrap_or(Mode::Off);
    let ok = match mode {
        Mode::Off => return None,
        Mode::On => gzip::gzip_ok(cx, &Response::default()),
        Mode::Always => true,
    };
    serve_precompressed(cx, path, mode, ok, "gzip").await
}

/// The `*_static` lookup shared by gzip_static, brotli_static and
/// zstd_static: `path.EXT` (EXT: `gz`, `br`, `zst`) served with
/// `Content-Encoding: TOKEN` when `ok` (the client takes it, or `always`).
/// Even a client that will not get it must learn (through Vary, with
/// gzip_vary on) that others might, so the file is looked for then too.
pub async fn serve_precompressed(
    cx: &mut Ctx<'_>,
    path: &[u8],
    mode: Mode,
    ok: bool,
    token: &'static str,
) -> Option<Box<Response>> {
    if !ok && !cx.loc.modules.gzip.vary.unwrap_or(false) {
        return None;
    }
    let policy = match cx.io_policy() {
        Ok(p) => p,
        Err(r) => return Some(r),
    };
    let ext: &[u8] = match token {
        "gzip" => b".gz",
        "br" => b".br",
        _ => b".zst",
    };
    let mut gz = path.to_vec();
    gz.extend_from_slice(ext);
    let file = match super::static_file::open_checked(cx, &gz, &policy).await {
        Ok(f) => f,
        // As nginx: a .gz that cannot be opened (refused by
        // disable_symlinks included) is logged, and the plain file served.
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(0);
            if !matches!(errno, libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG) {
                let level = if errno == libc::EACCES {
                    Level::Error
                } else {
                    Level::Crit
                };
                cx.log(
                    level,
                    &format!(
                        "open() \"{}\" failed ({}: {})",
                        String::from_utf8_lossy(&gz),
                        errno,
                        crate::core::strerror_text(errno)
                    ),
                );
            }
            return None;
        }
    };
    if mode == Mode::On {
        gzip::mark_vary(cx);
    }
    if !ok || file.meta.is_dir {
        return None;
    }
    if file.meta.mode & libc::S_IFMT != libc::S_IFREG {
        cx.log(
            Level::Crit,
            &format!("\"{}\" is not a regular file", String::from_utf8_lossy(&gz)),
        );
        return Some(Box::new(Response::status(404)));
    }
    // The type is the original name's, not ".gz"'s.
    let mut r = super::static_file::file_response(cx, path, file, policy);
    r.headers
        .push(("Content-Encoding".into(), token.as_bytes().to_vec()));
    Some(r)
}

/// The gunzip header filter (run from [`gzip::header_filter`], since
/// nginx runs gunzip before gzip): a gzip-encoded response for a client
/// that does not accept gzip is decoded on the way out.
pub fn gunzip_header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    if !cx.loc.modules.gzip_static.gunzip.unwrap_or(false) {
        return;
    }
    // Only exactly "gzip": a list of codings is left alone, as nginx does.
    match resp.header("Content-Encoding") {
        Some(v) if v.eq_ignore_ascii_case(b"gzip") => {}
        _ => return,
    }
    gzip::mark_vary(cx);
    if gzip::gzip_ok(cx, resp) {
        return;
    }
    resp.remove_header("Content-Encoding");
    gzip::clear_length(cx, resp);
    if gzip::has_body(cx, resp) {
        // First in the chain: the other filters (charset...) see plain text.
        resp.filters.insert(0, Box::new(Inflater::new()));
    }
}

/// The gunzip body filter: inflates gzip members one after another.
///
/// Memory: zlib's 32 KiB window plus the output of one input slice, which
/// is the slice times the compression ratio (a 64 KiB slice of a
/// pathological stream can inflate to tens of MiB; the body-filter
/// interface has no way to hand output back in pieces).
pub struct Inflater {
    z: Decompress,
    /// Between members: the next byte starts a new one.
    ended: bool,
}

impl Inflater {
    pub fn new() -> Inflater {
        Inflater {
            z: Decompress::new_gzip(15),
            ended: false,
        }
    }
}

impl Default for Inflater {
    fn default() -> Self {
        Self::new()
    }
}

const OUT_STEP: usize = 32 * 1024;

impl BodyFilter for Inflater {
    fn filter(&mut self, input: &[u8], last: bool, out: &mut Vec<u8>) -> std::io::Result<()> {
        let mut pos = 0;
        while pos < input.len() {
            if self.ended {
                self.z = Decompress::new_gzip(15);
                self.ended = false;
            }
            if out.capacity() - out.len() < OUT_STEP {
                out.reserve(OUT_STEP);
            }
            let before = self.z.total_in();
            let before_out = out.len();
            let st = self
                .z
                .decompress_vec(&input[pos..], out, FlushDecompress::None)
                .map_err(|e| std::io::Error::other(format!("inflate() failed: {}", e)))?;
            let used = (self.z.total_in() - before) as usize;
            pos += used;
            match st {
                Status::StreamEnd => self.ended = true,
                Status::Ok | Status::BufError => {
                    if used == 0 && out.len() == before_out && out.len() < out.capacity() {
                        // No progress with room to spare: zlib wants more
                        // input than this slice has (cannot happen while
                        // input remains, but never spin).
                        break;
                    }
                }
            }
        }
        if last && !self.ended && self.z.total_in() > 0 {
            // Drain what zlib still holds, then insist the member ended.
            loop {
                if out.capacity() - out.len() < OUT_STEP {
                    out.reserve(OUT_STEP);
                }
                let before_out = out.len();
                let st = self
                    .z
                    .decompress_vec(&[], out, FlushDecompress::Finish)
                    .map_err(|e| std::io::Error::other(format!("inflate() failed: {}", e)))?;
                if st == Status::StreamEnd {
                    break;
                }
                if out.len() == before_out {
                    return Err(std::io::Error::other("gunzip: truncated gzip stream"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        e.write_all(data).expect("gzip");
        e.finish().expect("gzip")
    }

    #[test]
    fn inflates_in_slices_and_members() {
        let a: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let b = b"second member".to_vec();
        let mut stream = gz(&a);
        stream.extend_from_slice(&gz(&b));
        let mut f = Inflater::new();
        let mut out = Vec::new();
        let chunks: Vec<&[u8]> = stream.chunks(1000).collect();
        for (i, c) in chunks.iter().enumerate() {
            f.filter(c, i + 1 == chunks.len(), &mut out)
                .expect("inflate");
        }
        let mut want = a.clone();
        want.extend_from_slice(&b);
        assert_eq!(out, want);
    }

    #[test]
    fn truncated_and_garbage_are_errors() {
        let s = gz(b"hello hello hello hello");
        let mut f = Inflater::new();
        let mut out = Vec::new();
        assert!(f.filter(&s[..s.len() - 6], true, &mut out).is_err());
        let mut f = Inflater::new();
        assert!(f.filter(b"not gzip at all", true, &mut out).is_err());
    }
}
