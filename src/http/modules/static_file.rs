//! Content phase for files: `index` for URIs ending in `/`, then the file
//! itself (nginx's index and static modules). Files are opened through the
//! file-I/O layer, never directly.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::core::log::Level;
use crate::http::phases::{Ctx, Step};
use crate::http::request::Method;
use crate::http::response::{Body, Response};

pub async fn handle(cx: &mut Ctx<'_>) -> Step {
    let method = cx.method;
    if !matches!(method, Method::Get | Method::Head | Method::Post) {
        return Step::done(Response::status(405));
    }
    let policy = match cx.io_policy() {
        Ok(p) => p,
        Err(r) => return Step::Done(r),
    };
    if cx.uri.ends_with(b"/") {
        if let Some(step) = super::random_index::content(cx).await {
            return step;
        }
        return index(cx, &policy).await;
    }
    // The path is built in a spare buffer of the worker's, given back
    // once the file is answered (one allocation less per request).
    let mut path = crate::http::request::spare_buf();
    cx.request_filename_into(&mut path);
    let step = file(cx, &path, policy).await;
    crate::http::request::give_back_buf(path);
    step
}

/// The static handler for a URI not ending in `/`, whose file is `path`.
async fn file(cx: &mut Ctx<'_>, path: &[u8], policy: crate::io::Policy) -> Step {
    let method = cx.method;
    // (Boxed answers: each is a future's output, moved out of it.)
    if let Some(r) = super::brotli::try_static(cx, path).await {
        return Step::Done(r);
    }
    if let Some(r) = super::zstd::try_static(cx, path).await {
        return Step::Done(r);
    }
    if let Some(r) = super::gzip_static::try_serve(cx, path).await {
        return Step::Done(r);
    }
    let file = match open_checked(cx, path, &policy).await {
        Ok(f) => f,
        Err(e) => return Step::done(open_error(cx, path, &e)),
    };
    if file.meta.is_dir {
        // As nginx: the path is escaped, the arguments go as they are.
        let mut escaped = Vec::new();
        crate::http::uri::escape_uri(&cx.uri, &mut escaped);
        escaped.push(b'/');
        if let Some(a) = cx.req.args() {
            escaped.push(b'?');
            escaped.extend_from_slice(a);
        }
        let mut r = Response::status(301);
        r.location = Some(crate::http::modules::rewrite::absolute_location(
            cx, escaped,
        ));
        return Step::done(r);
    }
    if method == Method::Post {
        return Step::done(Response::status(405));
    }
    let mut r = file_response(cx, path, file, policy);
    if !super::compress_cache::apply(cx, &mut r).await {
        r.headers.push(("Accept-Ranges".into(), b"bytes".to_vec()));
    }
    Step::Done(r)
}

/// A 200 with the whole of `file`: the type `path`'s extension maps to,
/// its length, Last-Modified and (unless `etag off`) ETag; the body is
/// read or sent through `policy`. Made in its box (where it stays on its
/// way to the writer, see [`crate::http::phases::run`]), not moved there.
pub fn file_response(
    cx: &Ctx<'_>,
    path: &[u8],
    file: std::sync::Arc<crate::io::OpenFile>,
    policy: crate::io::Policy,
) -> Box<Response> {
    // The box (and header list) of the worker's last finished response.
    let mut r = crate::http::response::boxed();
    r.status = 200;
    r.content_type = Some(content_type(cx, path));
    r.content_length = Some(file.meta.size);
    r.last_modified = Some(file.meta.mtime);
    if cx.loc.modules.headers.etag.unwrap_or(true) {
        r.headers.push(("ETag".into(), etag(&file)));
    }
    let len = file.meta.size;
    r.body = Body::File {
        file,
        offset: 0,
        len,
    };
    r.io = Some(policy);
    r
}

/// nginx's ETag: hex mtime and size, as the header value's bytes.
pub fn etag(f: &crate::io::OpenFile) -> Vec<u8> {
    etag_of(f.meta.mtime, f.meta.size)
}

/// nginx's ETag of a response of `len` bytes from a file of `mtime`
/// (flv and mp4 answer with another length than the file's).
pub fn etag_of(mtime: i64, len: u64) -> Vec<u8> {
    // Written by hand: this runs for every file answered, and the
    // formatting machinery costs more than the digits.
    let mut s = Vec::with_capacity(2 + 16 + 1 + 16);
    s.push(b'"');
    push_hex(&mut s, mtime as u64);
    s.push(b'-');
    push_hex(&mut s, len);
    s.push(b'"');
    s
}

/// Replaces a response's ETag with the one of `len` bytes (nginx makes
/// it from the response's length, which flv and mp4 change).
pub fn set_etag_len(cx: &Ctx<'_>, r: &mut Response, mtime: i64, len: u64) {
    if cx.loc.modules.headers.etag.unwrap_or(true) {
        r.remove_header("ETag");
        r.headers.push(("ETag".into(), etag_of(mtime, len)));
    }
}

/// `{:x}` of `n`. An mtime before 1970 is negative and prints as its
/// two's complement, as `{:x}` of the i64 does.
fn push_hex(s: &mut Vec<u8>, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 16];
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = HEX[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    // Bytes in one copy (pushed as chars, each push checked for room
    // and encoded: ~170 instructions per number in the profile).
    s.extend_from_slice(&buf[i..]);
}

async fn index(cx: &mut Ctx<'_>, policy: &crate::io::Policy) -> Step {
    let files = cx.loc.modules.index.files.clone().unwrap_or_default();
    let dir = cx.request_filename();
    for t in &files {
        let name = t.render_vec(&*cx);
        // An absolute index ("/index.html", the last one nginx allows)
        // is an internal redirect, made without looking for the file.
        if name.starts_with(b"/") {
            return Step::Redirect(name);
        }
        let (path, uri) = {
            let mut p = dir.clone();
            p.extend_from_slice(&name);
            let mut u = cx.uri.to_vec();
            u.extend_from_slice(&name);
            (p, u)
        };
        match open_checked(cx, &path, policy).await {
            Ok(f) if !f.meta.is_dir => return Step::Redirect(uri),
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {}
            Err(e) => return Step::done(open_error(cx, &path, &e)),
        }
    }
    match open_checked(cx, &dir, policy).await {
        Ok(f) if f.meta.is_dir => {
            if let Some(r) = super::autoindex::handle(cx, &dir).await {
                return Step::done(r);
            }
            cx.log(
                Level::Error,
                &format!(
                    "directory index of \"{}\" is forbidden",
                    String::from_utf8_lossy(&dir)
                ),
            );
            Step::done(Response::status(403))
        }
        Ok(_) => Step::done(Response::status(404)),
        Err(e) => {
            let mut d = dir.clone();
            if d.len() > 1 && d.ends_with(b"/") {
                d.pop();
            }
            Step::done(open_error(cx, &d, &e))
        }
    }
}

pub fn open_error(cx: &Ctx<'_>, path: &[u8], e: &io::Error) -> Response {
    let code = match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ENAMETOOLONG) => 404,
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::ELOOP) => 403,
        _ => 500,
    };
    if code == 404 && !cx.loc.modules.static_file.log_not_found.unwrap_or(true) {
        return Response::status(code);
    }
    let level = if code == 500 {
        Level::Crit
    } else {
        Level::Error
    };
    let errno = e.raw_os_error().unwrap_or(0);
    // Written into the line as it is built (no `format!` of its own):
    // this runs for every request of a missing file.
    cx.log_with(level, path.len() + 64, |m| {
        m.push_str("open() \"");
        crate::core::log::push_lossy(m, path);
        m.push_str("\" failed (");
        m.push_str(itoa::Buffer::new().format(errno));
        m.push_str(": ");
        m.push_str(&crate::core::strerror_text(errno));
        m.push(')');
    });
    Response::status(code)
}

pub fn content_type(cx: &Ctx<'_>, path: &[u8]) -> std::sync::Arc<str> {
    let ext = path.rsplit(|&c| c == b'/').next().and_then(|name| {
        let dot = name.iter().rposition(|&c| c == b'.')?;
        std::str::from_utf8(&name[dot + 1..]).ok()
    });
    if let (Some(ext), Some(types)) = (ext, &cx.loc.core.types) {
        // Extensions are nearly always lowercase already: no copy then.
        let hit = if ext.bytes().any(|c| c.is_ascii_uppercase()) {
            types.get(&ext.to_ascii_lowercase())
        } else {
            types.get(ext)
        };
        if let Some(t) = hit {
            return t.clone();
        }
    }
    cx.loc
        .core
        .default_type
        .clone()
        .unwrap_or_else(|| "text/plain".into())
}

/// `disable_symlinks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    Off,
    On,
    IfNotOwner,
}

#[derive(Debug, Clone, Default)]
pub struct StaticLoc {
    pub log_not_found: Option<bool>,
    pub disable_symlinks: Option<(Symlinks, Option<crate::http::vars::Template>)>,
}

impl StaticLoc {
    pub fn merge(&mut self, p: &StaticLoc) {
        crate::http::conf::merge_opts!(self, p; log_not_found, disable_symlinks);
    }
}

/// A file a content handler of its own (flv, mp4) answers from: the
/// opening steps nginx's handlers share. GET and HEAD only (405); a URI
/// ending in `/` or naming a directory falls through (None); the file is
/// opened through the file-I/O layer, or its error page answers.
pub(super) struct HandlerFile {
    pub path: Vec<u8>,
    pub file: std::sync::Arc<crate::io::OpenFile>,
    pub policy: crate::io::Policy,
}

pub(super) async fn open_for_handler(cx: &mut Ctx<'_>) -> Option<Result<HandlerFile, Step>> {
    if !matches!(cx.method, Method::Get | Method::Head) {
        return Some(Err(Step::done(Response::status(405))));
    }
    if cx.uri.ends_with(b"/") {
        return None;
    }
    let policy = match cx.io_policy() {
        Ok(p) => p,
        Err(r) => return Some(Err(Step::Done(r))),
    };
    let path = cx.request_filename();
    let file = match open_checked(cx, &path, &policy).await {
        Ok(f) => f,
        Err(e) => return Some(Err(Step::done(open_error(cx, &path, &e)))),
    };
    if file.meta.is_dir {
        return None;
    }
    Some(Ok(HandlerFile { path, file, policy }))
}

/// Opens `path` (through the location's open-file cache) after the
/// `disable_symlinks` check: a refused path fails as nginx's open would
/// (ELOOP, answered 403; ENOTDIR for a directory component, 404).
pub(super) async fn open_checked(
    cx: &Ctx<'_>,
    path: &[u8],
    policy: &crate::io::Policy,
) -> io::Result<std::sync::Arc<crate::io::OpenFile>> {
    symlink_check(cx, path, policy).await?;
    super::open_file_cache::open(cx, Path::new(std::ffi::OsStr::from_bytes(path)), policy).await
}

/// With `disable_symlinks on|if_not_owner`: refuses a path any of whose
/// components (after the `from=` part) is a symbolic link (owned by
/// someone else than its target, for if_not_owner), as nginx does with
/// O_NOFOLLOW opens. Runs the lstat calls through the file-I/O layer.
pub async fn symlink_check(
    cx: &Ctx<'_>,
    path: &[u8],
    policy: &crate::io::Policy,
) -> Result<(), io::Error> {
    let Some((mode, from)) = &cx.loc.modules.static_file.disable_symlinks else {
        return Ok(());
    };
    if *mode == Symlinks::Off {
        return Ok(());
    }
    let skip = from
        .as_ref()
        .map(|t| t.render_vec(cx))
        .filter(|f| path.starts_with(f))
        .map_or(0, |f| f.len());
    let mut end = skip;
    while end < path.len() {
        let next = path[end + 1..]
            .iter()
            .position(|&c| c == b'/')
            .map_or(path.len(), |p| end + 1 + p);
        let part = &path[..next];
        end = next;
        if part.is_empty() || part == b"/" {
            continue;
        }
        let p = Path::new(std::ffi::OsStr::from_bytes(part));
        let m = match crate::io::lstat(p, policy).await {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        if m.is_symlink {
            if *mode == Symlinks::IfNotOwner {
                if let Ok(t) = crate::io::stat(p, policy).await {
                    if t.uid == m.uid {
                        continue;
                    }
                }
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            // nginx opens a directory component with O_DIRECTORY|O_NOFOLLOW,
            // which a symlink fails with ENOTDIR (404), and the last one
            // with O_NOFOLLOW, which fails with ELOOP (403).
            let errno = if next < path.len() {
                libc::ENOTDIR
            } else {
                libc::ELOOP
            };
            return Err(io::Error::from_raw_os_error(errno));
        }
    }
    Ok(())
}

fn set_log_not_found(
    l: &mut crate::http::conf::LocConf,
    d: &crate::config::Directive,
    _: &mut crate::core::conf::Compiler,
) -> crate::config::ConfResult<()> {
    let v = crate::config::registry::flag(d)?;
    crate::config::registry::set_once(&mut l.modules.static_file.log_not_found, v, d)
}

fn set_disable_symlinks(
    l: &mut crate::http::conf::LocConf,
    d: &crate::config::Directive,
    cx: &mut crate::core::conf::Compiler,
) -> crate::config::ConfResult<()> {
    use crate::config::ConfError;
    let mode = match crate::config::registry::arg(d, 0) {
        "off" => Symlinks::Off,
        "on" => Symlinks::On,
        "if_not_owner" => Symlinks::IfNotOwner,
        v => return Err(ConfError::at(format!("invalid value \"{}\"", v), d)),
    };
    let mut from = None;
    for a in d.args.iter().skip(1) {
        match a.value.strip_prefix("from=") {
            Some(f) if mode != Symlinks::Off => from = Some(cx.template(f, d)?),
            _ => {
                return Err(ConfError::at(
                    format!("invalid parameter \"{}\"", a.value),
                    d,
                ))
            }
        }
    }
    crate::config::registry::set_once(&mut l.modules.static_file.disable_symlinks, (mode, from), d)
}

pub const DIRECTIVES: &[crate::config::registry::Spec] = {
    use crate::config::registry::{ctx, Args, Setter, Spec};
    &[
        Spec {
            name: "log_not_found",
            ctx: ctx::HSL,
            args: Args::Flag,
            set: Setter::Loc(set_log_not_found),
        },
        Spec {
            name: "disable_symlinks",
            ctx: ctx::HSL,
            args: Args::take12(),
            set: Setter::Loc(set_disable_symlinks),
        },
    ]
};

#[cfg(test)]
mod tests {
    #[test]
    fn hex_matches_format() {
        for n in [
            0u64,
            1,
            0xf,
            0x10,
            0x400,
            0x6a3f_2c00,
            u64::MAX,
            (-1i64) as u64,
        ] {
            let mut s = Vec::new();
            super::push_hex(&mut s, n);
            assert_eq!(s, format!("{:x}", n).into_bytes());
        }
        let m = -5i64;
        let mut s = Vec::new();
        super::push_hex(&mut s, m as u64);
        assert_eq!(s, format!("{:x}", m).into_bytes());
    }
}
