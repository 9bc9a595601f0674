//! nginx's dav module (`ngx_http_dav_module`): the WebDAV methods PUT,
//! DELETE, MKCOL, COPY and MOVE on the files under `root`/`alias`, with
//! nginx 1.22's status codes, header checks and error-log wording.
//!
//! ```text
//! content phase (before static files; a method not in dav_methods falls through)
//!   PUT    `/` at the end -> 409; Content-Range -> 501
//!          body::read_to_file: the body in a named temp file under
//!            client_body_temp_path (nginx's request_body_in_file_only)
//!          pool: stat the target (a directory -> 409), chmod to dav_access,
//!            the Date header as mtime, rename into place (create_full_put_path:
//!            the missing directories first; across filesystems: copy to
//!            TARGET.NNNNNNNNNN, then rename) -> 201 + Location | 204
//!   DELETE a body -> 415; min_delete_depth; lstat; a directory needs `/` and
//!          Depth infinity, a file Depth 0 or infinity; the tree is removed
//!          depth first -> 204
//!   MKCOL  a body -> 415; `/` needed (409); mkdir with dav_access (+x where r)
//!          -> 201 + Location
//!   COPY/MOVE  a body -> 415; Destination (`/path`, or http[s]://HOST.../path
//!          of this host), unescaped and checked as nginx's
//!          parse_unsafe_uri; both collections or neither (409); within the
//!          location when it uses `alias`; Depth; Overwrite T|F (412);
//!          an existing target is replaced; a directory is renamed (MOVE) or
//!          copied as a tree (modes and mtimes kept) -> 201; a file is renamed
//!          (MOVE, creating the path) or copied -> 204
//! ```
//!
//! Every filesystem call of a method runs as one job in the location's
//! thread pool (`aio threads=...`, else the `default` pool), never on the
//! worker's loop; the job returns its status and the error-log lines, which
//! are written with the request's context when it is done.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::config::registry::{ctx, flag, num_arg, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::errno_text;
use crate::core::log::Level;
use crate::http::body::TempDir;
use crate::http::conf::LocConf;
use crate::http::phases::{Ctx, Step};
use crate::http::request::Method;
use crate::http::response::Response;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "dav_methods",
        ctx: ctx::HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_methods),
    },
    Spec {
        name: "create_full_put_path",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_full_path),
    },
    Spec {
        name: "min_delete_depth",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_min_depth),
    },
    Spec {
        name: "dav_access",
        ctx: ctx::HSL,
        args: Args::take123(),
        set: Setter::Loc(set_access),
    },
];

const PUT: u8 = 1;
const DELETE: u8 = 2;
const MKCOL: u8 = 4;
const COPY: u8 = 8;
const MOVE: u8 = 16;
/// `off` (a bit of its own, as in nginx's bitmask: `off` with a method
/// set is not an error, the methods stay on).
const OFF: u8 = 32;

#[derive(Debug, Clone, Default)]
pub struct DavLoc {
    pub methods: Option<u8>,
    pub create_full_put_path: Option<bool>,
    pub min_delete_depth: Option<u64>,
    pub access: Option<u32>,
    /// `<prefix>/client_body_temp`, for a PUT body without
    /// `client_body_temp_path`.
    pub temp_default: Option<Arc<TempDir>>,
}

impl DavLoc {
    pub fn merge(&mut self, p: &DavLoc) {
        crate::http::conf::merge_opts!(self, p; methods, create_full_put_path,
            min_delete_depth, access, temp_default);
    }
}

fn set_methods(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    // nginx's bitmask slot: a repeated directive adds to the set.
    let mut m = l.modules.dav.methods.unwrap_or(0);
    for a in &d.args {
        let bit = match a.value.to_ascii_lowercase().as_str() {
            "off" => OFF,
            "put" => PUT,
            "delete" => DELETE,
            "mkcol" => MKCOL,
            "copy" => COPY,
            "move" => MOVE,
            _ => return Err(ConfError::at(format!("invalid value \"{}\"", a.value), d)),
        };
        m |= bit;
    }
    l.modules.dav.methods = Some(m);
    l.modules.dav.temp_default = Some(Arc::new(TempDir::plain(cx.path("client_body_temp"))));
    Ok(())
}

fn set_full_path(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.dav.create_full_put_path, v, d)
}

fn set_min_depth(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = num_arg(d, 0)?;
    set_once(&mut l.modules.dav.min_delete_depth, v, d)
}

fn set_access(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = crate::http::upstream::conf::access_mode(d)?;
    set_once(&mut l.modules.dav.access, v, d)
}

/// nginx's `ngx_dir_access`: execute where read is allowed.
fn dir_access(a: u32) -> u32 {
    a | (a & 0o444) >> 2
}

/// The request's DAV method bit, if it is one of the five.
fn method_bit(cx: &Ctx<'_>) -> Option<u8> {
    match cx.method {
        Method::Put => Some(PUT),
        Method::Delete => Some(DELETE),
        Method::Other => match cx.req.method_raw() {
            "MKCOL" => Some(MKCOL),
            "COPY" => Some(COPY),
            "MOVE" => Some(MOVE),
            _ => None,
        },
        _ => None,
    }
}

/// The content handler: None when the location does not take this method
/// (the static handler answers then, 405 for these methods).
pub async fn content(cx: &mut Ctx<'_>) -> Option<Step> {
    let methods = cx.loc.modules.dav.methods.unwrap_or(0);
    if methods & !OFF == 0 {
        return None;
    }
    let bit = method_bit(cx)?;
    if methods & bit == 0 {
        return None;
    }
    let r = match bit {
        PUT => put(cx).await,
        DELETE => delete(cx).await,
        MKCOL => mkcol(cx).await,
        _ => copy_move(cx, bit == MOVE).await,
    };
    Some(Step::done(r))
}

// ---- the job in the pool ----------------------------------------------------

/// What a job found: the status and the error-log lines to write.
#[derive(Debug, Default)]
struct Fs {
    logs: Vec<(Level, String)>,
}

impl Fs {
    fn log(&mut self, level: Level, msg: String) {
        self.logs.push((level, msg));
    }

    /// `CALL "PATH" failed (errno: text)` at crit.
    fn crit(&mut self, call: &str, path: &Path, e: &io::Error) {
        self.log(
            Level::Crit,
            format!("{} \"{}\" failed {}", call, path.display(), errno_text(e)),
        );
    }

    /// nginx's ngx_http_dav_error: the status an errno maps to (`not_found`
    /// for a missing path), logged at its level.
    fn error(&mut self, e: &io::Error, not_found: u16, call: &str, path: &Path) -> u16 {
        let (level, status) = match e.raw_os_error().unwrap_or(0) {
            libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG => (Level::Error, not_found),
            libc::EACCES | libc::EPERM => (Level::Error, 403),
            libc::EEXIST => (Level::Error, 405),
            libc::ENOSPC => (Level::Crit, 507),
            _ => (Level::Crit, 500),
        };
        self.log(
            level,
            format!("{} \"{}\" failed {}", call, path.display(), errno_text(e)),
        );
        status
    }
}

/// Runs `job` in the location's pool (else the `default` pool), then writes
/// its log lines; the status it returned, or 500 when no pool took it.
async fn run<F>(cx: &Ctx<'_>, job: F) -> u16
where
    F: FnOnce(&mut Fs) -> u16 + Send + 'static,
{
    let pool = match cx.io_policy() {
        Ok(p) => match &p.aio {
            crate::io::Aio::Threads(pool) => Some(pool.clone()),
            crate::io::Aio::Uring | crate::io::Aio::Off => None,
        },
        Err(r) => return r.status,
    }
    .or_else(|| cx.shared.pools.load().get(crate::io::DEFAULT_POOL));
    let Some(pool) = pool else {
        cx.log(Level::Error, "thread pool \"default\" not found");
        return 500;
    };
    let done = pool
        .run(move || {
            let mut fs = Fs::default();
            let status = job(&mut fs);
            (status, fs)
        })
        .await;
    match done {
        Ok((status, fs)) => {
            for (level, msg) in &fs.logs {
                cx.log(*level, msg);
            }
            status
        }
        Err(e) => {
            cx.log(Level::Error, &e.to_string());
            500
        }
    }
}

fn path_of(b: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(b))
}

/// A response of `status` with nginx's framing for DAV answers: 201 with
/// an empty body (and the escaped URI as Location where nginx gives one).
fn answer(cx: &Ctx<'_>, status: u16, location: bool) -> Response {
    let mut r = Response::status(status);
    if status == 201 {
        r.content_length = Some(0);
        if location {
            let mut esc = Vec::new();
            crate::http::uri::escape_uri(&cx.uri, &mut esc);
            r.location = Some(crate::http::modules::rewrite::absolute_location(cx, esc));
        }
    }
    r
}

/// Whether the request announced a body (nginx: `content_length_n > 0 ||
/// chunked`).
fn has_body(cx: &Ctx<'_>) -> bool {
    cx.req.content_length.is_some_and(|n| n > 0) || cx.req.chunked
}

// ---- PUT ----------------------------------------------------------------------

async fn put(cx: &mut Ctx<'_>) -> Response {
    if cx.uri.ends_with(b"/") {
        cx.log(Level::Error, "cannot PUT to a collection");
        return Response::status(409);
    }
    if cx.req.header("content-range").is_some() {
        cx.log(Level::Error, "PUT with range is unsupported");
        return Response::status(501);
    }
    let loc = cx.loc.clone();
    let dav = &loc.modules.dav;
    let temp: Arc<TempDir> = match (&loc.modules.body.temp_path, &dav.temp_default) {
        (Some(t), _) | (None, Some(t)) => t.clone(),
        (None, None) => Arc::new(TempDir::plain("client_body_temp".into())),
    };
    if let Err(r) = crate::http::body::read_to_file(cx, &temp).await {
        return *r;
    }
    let source = match crate::http::body::take_named_file(cx) {
        Some(p) => Source::Named(p),
        None => match crate::http::body::data(cx) {
            Some(crate::http::body::Data::Mem(b)) => Source::Mem(b.clone()),
            Some(crate::http::body::Data::File { file, len, .. }) => Source::Unnamed(
                file.file
                    .try_clone()
                    .map(Arc::new)
                    .map_err(|e| e.to_string()),
                *len,
            ),
            None => Source::Mem(Bytes::new()),
        },
    };
    let dest = path_of(&cx.request_filename());
    let access = dav.access.unwrap_or(0o600);
    let create_path = dav.create_full_put_path.unwrap_or(false);
    let time = cx
        .req
        .header("date")
        .and_then(crate::http::date::parse_http_date);
    let status = run(cx, move |fs| {
        put_job(fs, source, &temp, &dest, access, create_path, time)
    })
    .await;
    answer(cx, status, true)
}

/// Where a PUT body is.
enum Source {
    /// A named temp file of ours (the usual case).
    Named(PathBuf),
    /// Read earlier into memory, or into a file without a name (by a
    /// handler that ran before, such as `mirror`): copied to a named
    /// temp file first.
    Mem(Bytes),
    Unnamed(Result<Arc<fs::File>, String>, u64),
}

fn put_job(
    fs: &mut Fs,
    source: Source,
    temp: &TempDir,
    dest: &Path,
    access: u32,
    create_path: bool,
    time: Option<i64>,
) -> u16 {
    let src = match source {
        Source::Named(p) => p,
        other => match named_copy(other, temp) {
            Ok(p) => p,
            Err((call, p, e)) => {
                fs.crit(call, &p, &e);
                return 500;
            }
        },
    };
    let status = match fs::metadata(dest) {
        Err(_) => 201,
        Ok(m) if m.is_dir() => {
            let e = io::Error::from_raw_os_error(libc::EISDIR);
            fs.log(
                Level::Error,
                format!(
                    "\"{}\" could not be created {}",
                    dest.display(),
                    errno_text(&e)
                ),
            );
            if let Err(e) = fs::remove_file(&src) {
                fs.crit("unlink()", &src, &e);
            }
            return 409;
        }
        Ok(_) => 204,
    };
    let ext = ExtRename {
        access,
        path_access: access,
        time,
        create_path,
        delete_file: true,
    };
    if ext_rename(fs, &src, dest, &ext) {
        status
    } else {
        500
    }
}

/// Writes a body that is not in a named file into one under `temp`.
fn named_copy(
    source: Source,
    temp: &TempDir,
) -> Result<PathBuf, (&'static str, PathBuf, io::Error)> {
    let path = temp.file_path(&crate::http::body::next_temp_name());
    let open = || {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
    };
    let mut f = match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                let _ = fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent);
            }
            open()
        }
        r => r,
    }
    .map_err(|e| ("open()", path.clone(), e))?;
    let written = match source {
        Source::Mem(b) => io::Write::write_all(&mut f, &b),
        Source::Unnamed(Ok(file), len) => copy_at(&file, len, &mut f),
        Source::Unnamed(Err(e), _) => Err(io::Error::other(e)),
        Source::Named(_) => Ok(()),
    };
    if let Err(e) = written {
        let _ = fs::remove_file(&path);
        return Err(("write()", path, e));
    }
    Ok(path)
}

/// Copies the first `len` bytes of `file` (by offset: its position is
/// shared with the body's other readers) to `out`.
fn copy_at(file: &fs::File, len: u64, out: &mut fs::File) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 64 * 1024];
    let mut off = 0u64;
    while off < len {
        let want = (len - off).min(buf.len() as u64) as usize;
        let n = file.read_at(&mut buf[..want], off)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        io::Write::write_all(out, &buf[..n])?;
        off += n as u64;
    }
    Ok(())
}

/// nginx's ngx_ext_rename_file_t.
struct ExtRename {
    /// Mode given to the file before the rename (0: left as it is).
    access: u32,
    /// Mode of directories made on the way (`create_path`).
    path_access: u32,
    /// mtime (and atime) to set.
    time: Option<i64>,
    create_path: bool,
    /// The source is removed when the rename fails.
    delete_file: bool,
}

/// nginx's ngx_ext_rename_file: chmod, set the time, rename; a missing
/// directory made when allowed; across filesystems a copy beside the
/// target, renamed over it. Logs as nginx does; false on failure.
fn ext_rename(fs: &mut Fs, src: &Path, to: &Path, ext: &ExtRename) -> bool {
    let mut err: Option<io::Error> = None;
    'failed: {
        if ext.access != 0 {
            if let Err(e) = fs::set_permissions(src, fs::Permissions::from_mode(ext.access)) {
                fs.crit("chmod()", src, &e);
                break 'failed;
            }
        }
        if let Some(t) = ext.time {
            if let Err(e) = set_time(src, t) {
                fs.crit("utimes()", src, &e);
                break 'failed;
            }
        }
        let mut r = fs::rename(src, to);
        if let Err(e) = &r {
            if e.raw_os_error() == Some(libc::ENOENT) {
                if !ext.create_path {
                    err = r.err();
                    break 'failed;
                }
                if let Some(e) = create_full_path(to, dir_access(ext.path_access)) {
                    fs.crit("mkdir()", to, &e);
                    break 'failed;
                }
                r = fs::rename(src, to);
            }
        }
        let e = match r {
            Ok(()) => return true,
            Err(e) => e,
        };
        if e.raw_os_error() == Some(libc::EXDEV) {
            let mut name = to.as_os_str().as_bytes().to_vec();
            name.extend_from_slice(format!(".{}", crate::http::body::next_temp_name()).as_bytes());
            let name = path_of(&name);
            let mode = if ext.access != 0 { ext.access } else { 0o600 };
            if copy_file(fs, src, &name, None, mode, ext.time) {
                match fs::rename(&name, to) {
                    Ok(()) => {
                        if let Err(e) = fs::remove_file(src) {
                            fs.crit("unlink()", src, &e);
                            return false;
                        }
                        return true;
                    }
                    Err(e) => {
                        fs.log(
                            Level::Crit,
                            format!(
                                "rename() \"{}\" to \"{}\" failed {}",
                                name.display(),
                                to.display(),
                                errno_text(&e)
                            ),
                        );
                        if let Err(e) = fs::remove_file(&name) {
                            fs.crit("unlink()", &name, &e);
                        }
                    }
                }
            }
            break 'failed;
        }
        err = Some(e);
    }
    if ext.delete_file {
        if let Err(e) = fs::remove_file(src) {
            fs.crit("unlink()", src, &e);
        }
    }
    if let Some(e) = err {
        fs.log(
            Level::Crit,
            format!(
                "rename() \"{}\" to \"{}\" failed {}",
                src.display(),
                to.display(),
                errno_text(&e)
            ),
        );
    }
    false
}

/// nginx's ngx_create_full_path: each directory above `to` (not `to`
/// itself); an existing one is fine, a refused one (EACCES) is passed
/// over, the last error is returned.
fn create_full_path(to: &Path, mode: u32) -> Option<io::Error> {
    let b = to.as_os_str().as_bytes();
    let mut err = None;
    for (i, &c) in b.iter().enumerate().skip(1) {
        if c != b'/' {
            continue;
        }
        match fs::DirBuilder::new().mode(mode).create(path_of(&b[..i])) {
            Ok(()) => err = None,
            Err(e) => match e.raw_os_error() {
                Some(libc::EEXIST) => err = None,
                Some(libc::EACCES) => err = Some(e),
                _ => return Some(e),
            },
        }
    }
    err
}

/// Sets atime and mtime of `path` to `t` (nginx's ngx_set_file_time).
fn set_time(path: &Path, t: i64) -> io::Result<()> {
    let when = if t >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(t as u64)
    } else {
        std::time::UNIX_EPOCH
    };
    let times = fs::FileTimes::new().set_accessed(when).set_modified(when);
    // Opened for reading: futimens with explicit times needs ownership,
    // not write access, as utimes does.
    fs::File::open(path)?.set_times(times)
}

/// nginx's ngx_copy_file: `size` bytes (None: all) of `from` into `to`
/// (created or truncated with `mode`), then its times; logged as nginx.
fn copy_file(
    fs: &mut Fs,
    from: &Path,
    to: &Path,
    size: Option<u64>,
    mode: u32,
    time: Option<i64>,
) -> bool {
    let src = match fs::File::open(from) {
        Ok(f) => f,
        Err(e) => {
            fs.crit("open()", from, &e);
            return false;
        }
    };
    let size = match size {
        Some(s) => s,
        None => match src.metadata() {
            Ok(m) => m.len(),
            Err(e) => {
                fs.log(
                    Level::Alert,
                    format!("fstat() \"{}\" failed {}", from.display(), errno_text(&e)),
                );
                return false;
            }
        },
    };
    let mut dst = match fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(to)
    {
        Ok(f) => f,
        Err(e) => {
            fs.crit("open()", to, &e);
            return false;
        }
    };
    match io::copy(&mut io::Read::take(&src, size), &mut dst) {
        Ok(n) if n == size => {}
        Ok(n) => {
            fs.log(
                Level::Alert,
                format!(
                    "read() has read only {} of {} from {}",
                    n,
                    size,
                    from.display()
                ),
            );
            return false;
        }
        Err(e) => {
            fs.crit("read()", from, &e);
            return false;
        }
    }
    if let Some(t) = time {
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t.max(0) as u64);
        if let Err(e) = dst.set_times(fs::FileTimes::new().set_accessed(when).set_modified(when)) {
            fs.log(
                Level::Alert,
                format!("utimes() \"{}\" failed {}", to.display(), errno_text(&e)),
            );
        }
    }
    true
}

// ---- DELETE -------------------------------------------------------------------

/// nginx's Depth header values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Depth {
    Zero,
    One,
    Infinity,
    Invalid,
}

/// The Depth header (`dflt` without one); an invalid one is logged.
fn depth(cx: &Ctx<'_>, dflt: Depth) -> Depth {
    let Some(v) = cx.req.header("depth") else {
        return dflt;
    };
    match v {
        b"0" => Depth::Zero,
        b"1" => Depth::One,
        b"infinity" => Depth::Infinity,
        _ => {
            cx.log(
                Level::Error,
                &format!(
                    "client sent invalid \"Depth\" header: \"{}\"",
                    String::from_utf8_lossy(v)
                ),
            );
            Depth::Invalid
        }
    }
}

async fn delete(cx: &mut Ctx<'_>) -> Response {
    if has_body(cx) {
        cx.log(Level::Error, "DELETE with body is unsupported");
        return Response::status(415);
    }
    let min = cx.loc.modules.dav.min_delete_depth.unwrap_or(0);
    if min > 0 {
        let uri = &cx.uri;
        let mut d = 0u64;
        let mut ok = false;
        for (i, &c) in uri.iter().enumerate() {
            if c == b'/' {
                d += 1;
                if d >= min && i + 1 < uri.len() {
                    ok = true;
                    break;
                }
            }
        }
        if !ok {
            cx.log(
                Level::Error,
                &format!("insufficient URI depth:{} to DELETE", d),
            );
            return Response::status(409);
        }
    }
    let path = cx.request_filename();
    let slash = cx.uri.ends_with(b"/");
    // lstat first (in the pool), then the header checks, as nginx.
    let p = path_of(&path);
    let meta = {
        let p = p.clone();
        let mut found = None;
        let status = run(cx, move |fs| match fs::symlink_metadata(&p) {
            Ok(m) => {
                if m.is_dir() {
                    1
                } else {
                    2
                }
            }
            Err(e) => {
                let nf = if e.raw_os_error() == Some(libc::ENOTDIR) {
                    409
                } else {
                    404
                };
                fs.error(&e, nf, "lstat()", &p)
            }
        })
        .await;
        match status {
            1 => found = Some(true),
            2 => found = Some(false),
            _ => {}
        }
        match found {
            Some(is_dir) => is_dir,
            None => return Response::status(status),
        }
    };
    let dir = if meta {
        if !slash {
            let e = io::Error::from_raw_os_error(libc::EISDIR);
            cx.log(
                Level::Error,
                &format!("DELETE \"{}\" failed {}", p.display(), errno_text(&e)),
            );
            return Response::status(409);
        }
        if depth(cx, Depth::Infinity) != Depth::Infinity {
            cx.log(Level::Error, "\"Depth\" header must be infinity");
            return Response::status(400);
        }
        true
    } else {
        let d = depth(cx, Depth::Zero);
        if d != Depth::Zero && d != Depth::Infinity {
            cx.log(Level::Error, "\"Depth\" header must be 0 or infinity");
            return Response::status(400);
        }
        false
    };
    // A directory keeps its `/`: nginx removes (and names in its log)
    // "DIR/" last.
    let target = p;
    let status = run(cx, move |fs| match delete_path(fs, &target, dir) {
        0 => 204,
        s => s,
    })
    .await;
    Response::status(status)
}

fn trim_slash(path: &[u8]) -> PathBuf {
    let mut p = path;
    if p.len() > 1 && p.ends_with(b"/") {
        p = &p[..p.len() - 1];
    }
    path_of(p)
}

/// nginx's ngx_http_dav_delete_path: a tree depth first (failures inside
/// logged, not fatal), then the directory or file itself. 0 when done,
/// else the status.
fn delete_path(fs: &mut Fs, path: &Path, dir: bool) -> u16 {
    if dir {
        if !walk(fs, path, &mut |fs, v| {
            match v {
                Visit::File(p, _) | Visit::Special(p) => {
                    if let Err(e) = fs::remove_file(p) {
                        fs.error(&e, 0, "unlink()", p);
                    }
                }
                Visit::DirPost(p, _) => {
                    if let Err(e) = fs::remove_dir(p) {
                        fs.error(&e, 0, "rmdir()", p);
                    }
                }
                Visit::DirPre(..) => {}
            }
            true
        }) {
            return 500;
        }
        match fs::remove_dir(path) {
            Ok(()) => 0,
            Err(e) => fs.error(&e, 404, "rmdir()", path),
        }
    } else {
        match fs::remove_file(path) {
            Ok(()) => 0,
            Err(e) => fs.error(&e, 404, "unlink()", path),
        }
    }
}

/// What [`walk`] found.
enum Visit<'p> {
    File(&'p Path, &'p fs::Metadata),
    /// A directory, before its contents (false: do not enter it).
    DirPre(&'p Path, &'p fs::Metadata),
    DirPost(&'p Path, &'p fs::Metadata),
    /// Neither a regular file nor a directory (a symlink, a socket...).
    Special(&'p Path),
}

/// nginx's ngx_walk_tree: every entry of `dir` but `.` and `..`, typed by
/// the directory entry (a symlink is special), its attributes by stat (an
/// entry stat refuses is logged and passed over). False when the
/// directory could not be read.
fn walk(fs: &mut Fs, dir: &Path, f: &mut dyn FnMut(&mut Fs, Visit<'_>) -> bool) -> bool {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            fs.crit("opendir()", dir, &e);
            return false;
        }
    };
    for ent in rd {
        let ent = match ent {
            Ok(e) => e,
            Err(e) => {
                fs.crit("readdir()", dir, &e);
                return false;
            }
        };
        let path = ent.path();
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                fs.crit("stat()", &path, &e);
                continue;
            }
        };
        let ty = match ent.file_type() {
            Ok(t) => t,
            Err(_) => meta.file_type(),
        };
        if ty.is_file() {
            f(fs, Visit::File(&path, &meta));
        } else if ty.is_dir() {
            if !f(fs, Visit::DirPre(&path, &meta)) {
                continue;
            }
            walk(fs, &path, f);
            f(fs, Visit::DirPost(&path, &meta));
        } else {
            f(fs, Visit::Special(&path));
        }
    }
    true
}

// ---- MKCOL --------------------------------------------------------------------

async fn mkcol(cx: &mut Ctx<'_>) -> Response {
    if has_body(cx) {
        cx.log(Level::Error, "MKCOL with body is unsupported");
        return Response::status(415);
    }
    if !cx.uri.ends_with(b"/") {
        cx.log(Level::Error, "MKCOL can create a collection only");
        return Response::status(409);
    }
    let path = trim_slash(&cx.request_filename());
    let mode = dir_access(cx.loc.modules.dav.access.unwrap_or(0o600));
    let status = run(cx, move |fs| {
        match fs::DirBuilder::new().mode(mode).create(&path) {
            Ok(()) => 201,
            Err(e) => fs.error(&e, 409, "mkdir()", &path),
        }
    })
    .await;
    answer(cx, status, true)
}

// ---- COPY and MOVE ------------------------------------------------------------

async fn copy_move(cx: &mut Ctx<'_>, is_move: bool) -> Response {
    if has_body(cx) {
        cx.log(Level::Error, "COPY and MOVE with body are unsupported");
        return Response::status(415);
    }
    let Some(dest) = cx.req.header("destination").map(<[u8]>::to_vec) else {
        cx.log(Level::Error, "client sent no \"Destination\" header");
        return Response::status(400);
    };
    let dest_text = String::from_utf8_lossy(&dest).into_owned();
    let invalid = |cx: &Ctx<'_>| {
        cx.log(
            Level::Error,
            &format!(
                "client sent invalid \"Destination\" header: \"{}\"",
                dest_text
            ),
        );
        Response::status(400)
    };
    let duri_raw: &[u8] = if dest.starts_with(b"/") {
        &dest
    } else {
        let Some(host) = cx.req.host().filter(|h| !h.is_empty()) else {
            cx.log(Level::Error, "client sent no \"Host\" header");
            return Response::status(400);
        };
        let scheme: &[u8] = if cx.conn.tls.info().is_some() {
            b"https://"
        } else {
            b"http://"
        };
        let Some(rest) = dest.strip_prefix(scheme) else {
            return invalid(cx);
        };
        // As nginx: the host is compared as a prefix, and whatever
        // follows it up to the first `/` (a port) is not looked at.
        if !rest.starts_with(host) {
            cx.log(
                Level::Error,
                &format!(
                    "\"Destination\" URI \"{}\" is handled by different repository than the source URI",
                    dest_text
                ),
            );
            return Response::status(400);
        }
        match rest[host.len()..].iter().position(|&b| b == b'/') {
            Some(i) => &rest[host.len() + i..],
            None => return invalid(cx),
        }
    };
    let duri = match (
        duri_raw.is_empty(),
        crate::http::upstream::response::unsafe_uri(duri_raw),
    ) {
        (false, Some((p, _))) if !p.is_empty() => p,
        _ => {
            cx.log(
                Level::Error,
                &format!(
                    "unsafe URI \"{}\" was detected",
                    String::from_utf8_lossy(duri_raw)
                ),
            );
            return invalid(cx);
        }
    };
    let src_coll = cx.uri.ends_with(b"/");
    // nginx looks at the last byte of the Destination as sent (its
    // arguments included).
    let dst_coll = dest.ends_with(b"/");
    if src_coll != dst_coll {
        cx.log(
            Level::Error,
            &format!(
                "both URI \"{}\" and \"Destination\" URI \"{}\" should be either collections or non-collections",
                String::from_utf8_lossy(&cx.uri),
                dest_text
            ),
        );
        return Response::status(409);
    }
    if cx.alias && cx.loc.core.alias_len != Some(usize::MAX) {
        let n = cx.loc.core.alias_len.unwrap_or(cx.loc_prefix_len);
        if n > duri.len() || cx.uri.get(..n) != duri.get(..n) {
            cx.log(
                Level::Error,
                &format!(
                    "\"Destination\" URI \"{}\" must be within location prefix when using \"alias\"",
                    dest_text
                ),
            );
            return Response::status(400);
        }
    }
    match depth(cx, Depth::Infinity) {
        Depth::Infinity => {}
        Depth::Zero if !is_move => {}
        _ if !is_move => {
            cx.log(Level::Error, "\"Depth\" header must be 0 or infinity");
            return Response::status(400);
        }
        _ => {
            cx.log(Level::Error, "\"Depth\" header must be infinity");
            return Response::status(400);
        }
    }
    let overwrite = match cx.req.header("overwrite") {
        None => true,
        Some(b"T" | b"t") => true,
        Some(b"F" | b"f") => false,
        Some(v) => {
            cx.log(
                Level::Error,
                &format!(
                    "client sent invalid \"Overwrite\" header: \"{}\"",
                    String::from_utf8_lossy(v)
                ),
            );
            return Response::status(400);
        }
    };
    let src = cx.request_filename();
    let saved = std::mem::replace(&mut cx.uri, std::borrow::Cow::Owned(duri));
    let dst = cx.request_filename();
    cx.uri = saved;
    let (dst, slash) = match dst.strip_suffix(b"/") {
        Some(d) => (d.to_vec(), true),
        None => (dst, false),
    };
    let job = CopyMove {
        src,
        dst: path_of(&dst),
        slash,
        overwrite,
        is_move,
        uri: String::from_utf8_lossy(&cx.uri).into_owned(),
        uri_coll: src_coll,
        method: if is_move { "MOVE" } else { "COPY" },
        dest: dest_text,
        access: cx.loc.modules.dav.access.unwrap_or(0o600),
    };
    let status = run(cx, move |fs| job.run(fs)).await;
    answer(cx, status, false)
}

/// A COPY or MOVE, checked, for the pool.
struct CopyMove {
    /// The source's file name (a trailing `/` for a collection).
    src: Vec<u8>,
    /// The destination's, without its trailing `/`.
    dst: PathBuf,
    /// The destination is a collection.
    slash: bool,
    overwrite: bool,
    is_move: bool,
    uri: String,
    uri_coll: bool,
    method: &'static str,
    dest: String,
    access: u32,
}

impl CopyMove {
    fn run(self, fs: &mut Fs) -> u16 {
        let mut overwrite = self.overwrite;
        let dir = match fs::symlink_metadata(&self.dst) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                overwrite = false;
                false
            }
            Err(e) => return fs.error(&e, 404, "lstat()", &self.dst),
            Ok(m) => {
                if m.is_dir() && !self.slash {
                    fs.log(
                        Level::Error,
                        format!(
                            "\"{}\" could not be {}ed to collection \"{}\"",
                            self.uri, self.method, self.dest
                        ),
                    );
                    return 409;
                }
                if !overwrite {
                    let e = io::Error::from_raw_os_error(libc::EEXIST);
                    fs.log(
                        Level::Error,
                        format!(
                            "\"{}\" could not be created {}",
                            self.dst.display(),
                            errno_text(&e)
                        ),
                    );
                    return 412;
                }
                m.is_dir()
            }
        };
        let src = path_of(&self.src);
        let fi = match fs::symlink_metadata(&src) {
            Ok(m) => m,
            Err(e) => return fs.error(&e, 404, "lstat()", &src),
        };
        if fi.is_dir() {
            if !self.uri_coll {
                fs.log(Level::Error, format!("\"{}\" is collection", self.uri));
                return 400;
            }
            if overwrite {
                let rc = delete_path(fs, &self.dst, dir);
                if rc != 0 {
                    return rc;
                }
            }
            let from = trim_slash(&self.src);
            if self.is_move && fs::rename(&from, &self.dst).is_ok() {
                return 201;
            }
            if let Err(e) = fs::DirBuilder::new()
                .mode(fi.mode() & 0o7777)
                .create(&self.dst)
            {
                return fs.error(&e, 404, "mkdir()", &self.dst);
            }
            let base = from.as_os_str().len();
            let target = |p: &Path| {
                let mut t = self.dst.as_os_str().as_bytes().to_vec();
                t.extend_from_slice(&p.as_os_str().as_bytes()[base..]);
                path_of(&t)
            };
            let ok = walk(fs, &from, &mut |fs, v| {
                match v {
                    Visit::DirPre(p, m) => {
                        let t = target(p);
                        if let Err(e) = fs::DirBuilder::new()
                            .mode(dir_access(m.mode() & 0o7777))
                            .create(&t)
                        {
                            fs.error(&e, 0, "mkdir()", &t);
                        }
                    }
                    Visit::DirPost(p, m) => {
                        let t = target(p);
                        if let Err(e) = set_time(&t, m.mtime()) {
                            fs.log(
                                Level::Alert,
                                format!("utimes() \"{}\" failed {}", t.display(), errno_text(&e)),
                            );
                        }
                    }
                    Visit::File(p, m) => {
                        let t = target(p);
                        copy_file(fs, p, &t, Some(m.len()), m.mode() & 0o7777, Some(m.mtime()));
                    }
                    Visit::Special(_) => {}
                }
                true
            });
            if ok {
                if self.is_move {
                    let rc = delete_path(fs, &src, true);
                    if rc != 0 {
                        return rc;
                    }
                }
                return 201;
            }
            500
        } else {
            if self.is_move {
                let ext = ExtRename {
                    access: 0,
                    path_access: self.access,
                    time: None,
                    create_path: true,
                    delete_file: false,
                };
                return if ext_rename(fs, &src, &self.dst, &ext) {
                    204
                } else {
                    500
                };
            }
            if copy_file(
                fs,
                &src,
                &self.dst,
                Some(fi.len()),
                fi.mode() & 0o7777,
                Some(fi.mtime()),
            ) {
                204
            } else {
                500
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_access_adds_search_where_read() {
        assert_eq!(dir_access(0o600), 0o700);
        assert_eq!(dir_access(0o644), 0o755);
        assert_eq!(dir_access(0o640), 0o750);
    }

    #[test]
    fn full_path_makes_the_parents_only() {
        let d = std::env::temp_dir().join(format!("tern-dav-{}", std::process::id()));
        let target = d.join("a/b/c/file");
        assert!(create_full_path(&target, 0o700).is_none());
        assert!(d.join("a/b/c").is_dir());
        assert!(!target.exists());
        let _ = fs::remove_dir_all(&d);
    }
}
