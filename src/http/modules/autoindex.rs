//! `autoindex`, `autoindex_exact_size`, `autoindex_localtime`,
//! `autoindex_format`: directory listings, byte for byte as nginx 1.22
//! writes them.
//!
//! Runs in the content phase for a URI ending in `/` whose directory has
//! no index file (called by `static_file`), for GET and HEAD only. Reading
//! a directory and stat-ing every entry can block on a cold disk, so the
//! whole listing is built in a thread pool: the location's `aio threads`
//! pool, else `default`; the event loop only awaits the result.
//!
//! Listing rules (nginx's): entries whose name starts with `.` are
//! skipped; directories come first, then names in byte order; symlinks are
//! followed, a broken one is described by `lstat` (type "other" in
//! json/xml). The html form pads names to 50 columns and cuts longer ones
//! to 47 followed by `..>`; a name is measured in characters only when the
//! response charset is utf-8, otherwise in bytes.
//!
//! The body has no Content-Length: it goes out chunked to HTTP/1.1
//! clients (nginx builds the listing as a stream of buffers).

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::{Body, BodyFilter, Response};

/// `autoindex_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Html,
    Json,
    Jsonp,
    Xml,
}

#[derive(Debug, Clone, Default)]
pub struct AutoindexLoc {
    pub on: Option<bool>,
    pub exact_size: Option<bool>,
    pub localtime: Option<bool>,
    pub format: Option<Format>,
}

impl AutoindexLoc {
    pub fn merge(&mut self, p: &AutoindexLoc) {
        crate::http::conf::merge_opts!(self, p; on, exact_size, localtime, format);
    }
}

fn set_autoindex(l: &mut LocConf, d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.autoindex.on, flag(d)?, d)
}

fn set_exact_size(l: &mut LocConf, d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.autoindex.exact_size, flag(d)?, d)
}

fn set_localtime(l: &mut LocConf, d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.autoindex.localtime, flag(d)?, d)
}

fn set_format(l: &mut LocConf, d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    let f = match arg(d, 0) {
        "html" => Format::Html,
        "json" => Format::Json,
        "jsonp" => Format::Jsonp,
        "xml" => Format::Xml,
        // nginx's enum setter words it without the directive name.
        v => return Err(ConfError::at(format!("invalid value \"{}\"", v), d)),
    };
    set_once(&mut l.modules.autoindex.format, f, d)
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "autoindex",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_autoindex),
    },
    Spec {
        name: "autoindex_exact_size",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_exact_size),
    },
    Spec {
        name: "autoindex_localtime",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_localtime),
    },
    Spec {
        name: "autoindex_format",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_format),
    },
];

/// What a listing shows of one directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub kind: Kind,
    pub mtime: i64,
    pub size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    /// A broken symlink, a socket, a fifo...
    Other,
}

/// Why a listing could not be read: the failing call, the path, the error.
#[derive(Debug)]
pub struct ListError {
    pub call: &'static str,
    pub path: Vec<u8>,
    pub err: io::Error,
}

/// Reads and stats a directory (blocking: run it in a pool), sorted as
/// nginx sorts: directories first, then by name bytes.
pub fn read_listing(dir: &[u8]) -> Result<Vec<Entry>, ListError> {
    let dir_path = std::path::Path::new(std::ffi::OsStr::from_bytes(dir));
    let fail = |call, path: &[u8], err| ListError {
        call,
        path: path.to_vec(),
        err,
    };
    let rd = std::fs::read_dir(dir_path).map_err(|e| fail("opendir()", dir, e))?;
    let mut out = Vec::new();
    for de in rd {
        let de = de.map_err(|e| fail("readdir()", dir, e))?;
        let name = de.file_name().as_bytes().to_vec();
        if name.first() == Some(&b'.') {
            continue;
        }
        let full = de.path();
        let meta = match std::fs::metadata(&full) {
            Ok(m) => m,
            // A dangling or looping symlink is listed as itself.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ELOOP)) => {
                std::fs::symlink_metadata(&full)
                    .map_err(|e| fail("lstat()", full.as_os_str().as_bytes(), e))?
            }
            // nginx skips an entry it may not stat.
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => continue,
            Err(e) => return Err(fail("stat()", full.as_os_str().as_bytes(), e)),
        };
        let kind = if meta.is_dir() {
            Kind::Dir
        } else if meta.is_file() {
            Kind::File
        } else {
            Kind::Other
        };
        out.push(Entry {
            name,
            kind,
            mtime: meta.mtime(),
            size: meta.size(),
        });
    }
    out.sort_by(|a, b| {
        (b.kind == Kind::Dir)
            .cmp(&(a.kind == Kind::Dir))
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(out)
}

/// Passes the body through unchanged: its presence makes the listing go
/// out chunked, as nginx sends it, since there is no Content-Length.
struct Stream;

impl BodyFilter for Stream {
    fn filter(&mut self, input: &[u8], _last: bool, out: &mut Vec<u8>) -> io::Result<()> {
        out.extend_from_slice(input);
        Ok(())
    }
}

/// Called for a directory URI with no index file: a listing, or None
/// (then the directory is forbidden, 403). `dir` is the directory's path
/// with its trailing slash.
pub async fn handle(cx: &mut Ctx<'_>, dir: &[u8]) -> Option<Response> {
    let conf = &cx.loc.modules.autoindex;
    if !conf.on.unwrap_or(false) || !matches!(cx.req.method, Method::Get | Method::Head) {
        return None;
    }
    let format = conf.format.unwrap_or(Format::Html);
    let exact_size = conf.exact_size.unwrap_or(true);
    let localtime = conf.localtime.unwrap_or(false);

    // jsonp wraps the listing in `callback(...)` when the argument is given.
    let mut callback = None;
    if format == Format::Jsonp {
        if let Some(cb) = cx
            .args
            .as_deref()
            .and_then(|a| crate::http::uri::arg(a, b"callback"))
            .filter(|cb| !cb.is_empty())
        {
            if !cb
                .iter()
                .all(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
            {
                cx.log(
                    Level::Info,
                    &format!(
                        "client sent invalid callback name: \"{}\"",
                        String::from_utf8_lossy(cb)
                    ),
                );
                return Some(Response::status(400));
            }
            callback = Some(cb.to_vec());
        }
    }

    let entries = match list(cx, dir).await {
        Ok(e) => e,
        Err(r) => return Some(r),
    };

    let mut r = Response::status(200);
    let (ctype, body) = match format {
        Format::Html => {
            let opts = HtmlOpts {
                exact_size,
                gmtoff: if localtime { local_gmtoff() } else { 0 },
                utf8: utf8_charset(cx),
            };
            ("text/html", html(&cx.uri, &entries, &opts))
        }
        Format::Json => ("application/json", json(&entries)),
        Format::Jsonp => match &callback {
            Some(cb) => ("application/javascript", jsonp(cb, &entries)),
            None => ("application/json", json(&entries)),
        },
        // nginx declares the charset of its xml itself.
        Format::Xml => ("text/xml; charset=utf-8", xml(&entries)),
    };
    r.content_type = Some(ctype.into());
    r.charset_param = format == Format::Xml;
    if cx.req.method == Method::Head {
        // Only the head goes out; nginx does not announce chunking for it.
        return Some(r);
    }
    r.body = Body::Bytes(body);
    r.filters.push(Box::new(Stream));
    // An HTTP/1.0 client gets no chunking, so the end of the body is the
    // end of the connection.
    if cx.req.minor == 0 {
        r.force_close = true;
    }
    Some(r)
}

/// Reads the directory `dir` (its path, trailing slash or not) in the
/// location's thread pool (`aio threads=NAME`, else `default`): the
/// entries as [`read_listing`] gives them, or the error response, logged
/// as nginx logs it.
pub async fn list(cx: &Ctx<'_>, dir: &[u8]) -> Result<Vec<Entry>, Response> {
    let pool = match cx.io_policy() {
        Ok(p) => match &p.aio {
            crate::io::Aio::Threads(pool) => Some(pool.clone()),
            crate::io::Aio::Uring | crate::io::Aio::Off => None,
        },
        Err(r) => return Err(*r),
    }
    .or_else(|| cx.shared.pools.load().get(crate::io::DEFAULT_POOL));
    let Some(pool) = pool else {
        cx.log(Level::Error, "thread pool \"default\" not found");
        return Err(Response::status(500));
    };
    // nginx opens the directory by its name without the trailing slash.
    let mut path = dir.to_vec();
    if path.len() > 1 && path.ends_with(b"/") {
        path.pop();
    }
    match pool.run(move || read_listing(&path)).await {
        Ok(Ok(e)) => Ok(e),
        Ok(Err(e)) => Err(list_error(cx, &e)),
        Err(e) => {
            cx.log(Level::Error, &e.to_string());
            Err(Response::status(500))
        }
    }
}

/// The response for a directory that could not be listed, logged as nginx
/// logs it.
fn list_error(cx: &Ctx<'_>, e: &ListError) -> Response {
    let errno = e.err.raw_os_error().unwrap_or(0);
    let (level, code) = match errno {
        libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG if e.call == "opendir()" => {
            (Level::Error, 404)
        }
        libc::EACCES if e.call == "opendir()" => (Level::Error, 403),
        _ => (Level::Crit, 500),
    };
    cx.log(
        level,
        &format!(
            "{} \"{}\" failed ({}: {})",
            e.call,
            String::from_utf8_lossy(&e.path),
            errno,
            crate::core::strerror_text(errno)
        ),
    );
    Response::status(code)
}

/// Whether names are measured in characters: when the response's charset
/// is utf-8. The charset filter runs after the listing is built, so this
/// asks the location's charset configuration.
fn utf8_charset(cx: &Ctx<'_>) -> bool {
    use super::charset::Charset;
    match &cx.loc.modules.charset.charset {
        Some(Charset::Name(n)) => n.eq_ignore_ascii_case("utf-8"),
        Some(Charset::Var(t)) => t.render_vec(cx).eq_ignore_ascii_case(b"utf-8"),
        _ => false,
    }
}

/// The current offset of local time from UTC in seconds (nginx applies the
/// current offset to every mtime, not the offset at that mtime).
fn local_gmtoff() -> i64 {
    // `$time_local` ends in "+hhmm": reuse its conversion.
    let t = crate::http::date::time_local();
    let Some(z) = t.get(t.len().saturating_sub(5)..) else {
        return 0;
    };
    let digits = |s: &[u8]| -> i64 {
        s.iter()
            .fold(0i64, |n, &c| n * 10 + i64::from(c.wrapping_sub(b'0') % 10))
    };
    let secs = digits(&z[1..3]) * 3600 + digits(&z[3..5]) * 60;
    if z[0] == b'-' {
        -secs
    } else {
        secs
    }
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// (year, month 1..=12, day, hour, minute, second) of Unix time `t` in UTC.
fn civil(t: i64) -> (i64, usize, u32, u32, u32, u32) {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    // Days to civil date (proleptic Gregorian, eras of 400 years).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m as usize,
        d as u32,
        (secs / 3600) as u32,
        (secs / 60 % 60) as u32,
        (secs % 60) as u32,
    )
}

/// Unreserved characters stay, everything else is `%XX` (nginx's escaping
/// of a URI component).
fn escape_component(s: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &c in s {
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(c);
        } else {
            out.extend_from_slice(&[b'%', HEX[(c >> 4) as usize], HEX[(c & 15) as usize]]);
        }
    }
}

/// `<`, `>`, `&`, `"` as entities (nginx's html escaping; `'` stays).
fn escape_html(s: &[u8], out: &mut Vec<u8>) {
    for &c in s {
        match c {
            b'<' => out.extend_from_slice(b"&lt;"),
            b'>' => out.extend_from_slice(b"&gt;"),
            b'&' => out.extend_from_slice(b"&amp;"),
            b'"' => out.extend_from_slice(b"&quot;"),
            _ => out.push(c),
        }
    }
}

/// JSON string escaping as nginx does it: `\"`, `\\`, the short forms of
/// control characters, `\u00XX` (upper-case hex) for the rest below 0x20.
fn escape_json(s: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &c in s {
        match c {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            c if c < 0x20 => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(c >> 4) as usize]);
                out.push(HEX[(c & 15) as usize]);
            }
            c => out.push(c),
        }
    }
}

/// Name column width of the html listing.
const NAME_LEN: usize = 50;

pub struct HtmlOpts {
    pub exact_size: bool,
    /// Seconds added to every mtime (`autoindex_localtime`).
    pub gmtoff: i64,
    /// Measure names in utf-8 characters (charset utf-8).
    pub utf8: bool,
}

/// The length of a name as the html column counts it, and the byte length
/// of its first `n` units.
fn units(name: &[u8], utf8: bool) -> (usize, Box<dyn Fn(usize) -> usize + '_>) {
    match std::str::from_utf8(name) {
        Ok(s) if utf8 => (
            s.chars().count(),
            Box::new(move |n| s.char_indices().nth(n).map_or(s.len(), |(i, _)| i)),
        ),
        // Invalid utf-8 is measured in bytes, as nginx falls back.
        _ => (name.len(), Box::new(move |n| n.min(name.len()))),
    }
}

/// The `autoindex_format html` page for `uri`.
pub fn html(uri: &[u8], entries: &[Entry], o: &HtmlOpts) -> Vec<u8> {
    let mut b = Vec::with_capacity(256 + entries.len() * 160);
    b.extend_from_slice(b"<html>\r\n<head><title>Index of ");
    escape_html(uri, &mut b);
    b.extend_from_slice(b"</title></head>\r\n<body>\r\n<h1>Index of ");
    escape_html(uri, &mut b);
    b.extend_from_slice(b"</h1><hr><pre><a href=\"../\">../</a>\r\n");
    for e in entries {
        let dir = e.kind == Kind::Dir;
        b.extend_from_slice(b"<a href=\"");
        escape_component(&e.name, &mut b);
        if dir {
            b.push(b'/');
        }
        b.extend_from_slice(b"\">");
        let (mut len, prefix) = units(&e.name, o.utf8);
        if len > NAME_LEN {
            // Cut to 47 units and mark the cut.
            escape_html(&e.name[..prefix(NAME_LEN - 3)], &mut b);
            b.extend_from_slice(b"..&gt;</a>");
        } else {
            escape_html(&e.name, &mut b);
            if dir && len < NAME_LEN {
                b.push(b'/');
                len += 1;
            }
            b.extend_from_slice(b"</a>");
            b.resize(b.len() + (NAME_LEN - len), b' ');
        }
        let (y, m, d, hh, mm, _) = civil(e.mtime + o.gmtoff);
        b.extend_from_slice(
            format!(
                " {:02}-{}-{} {:02}:{:02} ",
                d,
                MONTHS[(m + 11) % 12],
                y,
                hh,
                mm
            )
            .as_bytes(),
        );
        b.extend_from_slice(size_column(e, o.exact_size).as_bytes());
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(b"</pre><hr></body>\r\n</html>\r\n");
    b
}

/// The size column: 19 wide exact, or 7 wide with K/M/G rounded to the
/// nearest unit (half up); `-` for directories.
fn size_column(e: &Entry, exact: bool) -> String {
    const K: u64 = 1024;
    const M: u64 = K * K;
    const G: u64 = M * K;
    match (e.kind == Kind::Dir, exact) {
        (true, true) => format!("{:>19}", "-"),
        (true, false) => format!("{:>7}", "-"),
        (false, true) => format!("{:>19}", e.size),
        (false, false) => {
            let n = e.size;
            let scaled = |unit: u64, c: char| {
                let v = n / unit + u64::from(n % unit >= unit / 2);
                format!("{:>6}{}", v, c)
            };
            if n >= G {
                scaled(G, 'G')
            } else if n >= M {
                scaled(M, 'M')
            } else if n > 9999 {
                scaled(K, 'K')
            } else {
                format!(" {:>6}", n)
            }
        }
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Dir => "directory",
        Kind::File => "file",
        Kind::Other => "other",
    }
}

/// The `autoindex_format json` array (mtime as an HTTP date, size for files).
pub fn json(entries: &[Entry]) -> Vec<u8> {
    let mut b = Vec::with_capacity(8 + entries.len() * 100);
    b.extend_from_slice(b"[\r\n");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            b.extend_from_slice(b",\r\n");
        }
        b.extend_from_slice(b"{ \"name\":\"");
        escape_json(&e.name, &mut b);
        b.extend_from_slice(b"\", \"type\":\"");
        b.extend_from_slice(kind_name(e.kind).as_bytes());
        b.extend_from_slice(b"\", \"mtime\":\"");
        b.extend_from_slice(&crate::http::date::http_date_at(e.mtime));
        b.push(b'"');
        if e.kind == Kind::File {
            b.extend_from_slice(format!(", \"size\":{}", e.size).as_bytes());
        }
        b.extend_from_slice(b" }");
    }
    if !entries.is_empty() {
        b.extend_from_slice(b"\r\n");
    }
    b.push(b']');
    b
}

/// `callback(` json `);` after nginx's comment line.
pub fn jsonp(callback: &[u8], entries: &[Entry]) -> Vec<u8> {
    let mut b = b"/* callback */\r\n".to_vec();
    b.extend_from_slice(callback);
    b.push(b'(');
    b.extend_from_slice(&json(entries));
    b.extend_from_slice(b");");
    b
}

/// The `autoindex_format xml` document (mtime in UTC ISO 8601).
pub fn xml(entries: &[Entry]) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + entries.len() * 80);
    b.extend_from_slice(b"<?xml version=\"1.0\"?>\r\n<list>\r\n");
    for e in entries {
        let tag = kind_name(e.kind);
        let (y, m, d, hh, mm, ss) = civil(e.mtime);
        b.extend_from_slice(
            format!(
                "<{} mtime=\"{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z\"",
                tag, y, m, d, hh, mm, ss
            )
            .as_bytes(),
        );
        if e.kind == Kind::File {
            b.extend_from_slice(format!(" size=\"{}\"", e.size).as_bytes());
        }
        b.push(b'>');
        escape_html(&e.name, &mut b);
        b.extend_from_slice(format!("</{}>\r\n", tag).as_bytes());
    }
    b.extend_from_slice(b"</list>\r\n");
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, size: u64) -> Entry {
        Entry {
            name: name.as_bytes().to_vec(),
            kind: Kind::File,
            mtime: 1_614_834_367, // 2021-03-04 05:06:07 UTC
            size,
        }
    }

    #[test]
    fn sizes_round_like_nginx() {
        let col = |n| size_column(&file("x", n), false);
        assert_eq!(col(9999), "   9999");
        assert_eq!(col(10000), "    10K");
        assert_eq!(col(10751), "    10K");
        assert_eq!(col(10752), "    11K");
        assert_eq!(col(1_048_575), "  1024K");
        assert_eq!(col(1_572_863), "     1M");
        assert_eq!(col(1_572_864), "     2M");
        assert_eq!(col(5_000_000_000), "     5G");
        assert_eq!(size_column(&file("x", 3), true), "                  3");
    }

    #[test]
    fn names_are_cut_at_47_and_padded_to_50() {
        let long = "m".repeat(51);
        let e = [file(&long, 0), file("a<b", 1)];
        let o = HtmlOpts {
            exact_size: true,
            gmtoff: 0,
            utf8: false,
        };
        let page = String::from_utf8(html(b"/d/", &e, &o)).unwrap_or_default();
        let cut = format!("{}..&gt;</a> 04-Mar-2021 05:06 ", "m".repeat(47));
        assert!(page.contains(&cut), "{}", page);
        let padded = format!("<a href=\"a%3Cb\">a&lt;b</a>{} 04-Mar-2021", " ".repeat(47));
        assert!(page.contains(&padded), "{}", page);
    }

    #[test]
    fn utf8_names_count_characters() {
        let e = [file(&"ж".repeat(30), 0)];
        let o = HtmlOpts {
            exact_size: true,
            gmtoff: 0,
            utf8: true,
        };
        let page = String::from_utf8(html(b"/", &e, &o)).unwrap_or_default();
        assert!(page.contains(&format!("{}</a>{} 04", "ж".repeat(30), " ".repeat(20))));
    }
}
