//! `memcached_pass` (nginx's ngx_http_memcached_module): a response from
//! memcached, on the upstream engine ([`crate::http::upstream`]).
//!
//! ```text
//!  out: "get " $memcached_key (escaped as nginx escapes it) CRLF
//!  in:  "VALUE" SP key SP flags SP length CRLF ─▶ 200, Content-Length, the
//!            type by the URI's extension; flags & memcached_gzip_flag ─▶
//!            Content-Encoding: gzip
//!        the body: length bytes, then CRLF "END" CRLF (checked)
//!       "END" CRLF ─▶ 404 (nginx's error page; logged at info)
//!       anything else ─▶ 502 "memcached sent invalid response"
//! ```
//!
//! The connection is kept for reuse once the trailer is read
//! (`keepalive` in the `upstream` block). The shared `memcached_*` rows
//! (timeouts, next_upstream, buffer_size, bind) are the engine's.

use std::path::Path;
use std::sync::Arc;

use crate::config::registry::{arg, ctx, set_once, Args, Setter, Spec};
use crate::config::{value, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::{merge_opts, HttpMain, LocConf};
use crate::http::phases::Ctx;
use crate::http::response::Response;
use crate::http::upstream::conf::{Limits, Slot, UpstreamConf};
use crate::http::upstream::fetch::{invalid_header, Fail, WHILE_HEAD};
use crate::http::upstream::peers::{self, PassAddr};
use crate::http::upstream::{BodyDecoder, Caching, Head, HeadReader, OutBody, Protocol, Request};
use crate::http::vars::Template;

const LOC: u32 = ctx::LOC | ctx::LIF;
const HSL: u32 = ctx::HSL;

/// memcached's [`UpstreamConf`] in a location.
pub struct Up;

impl Slot for Up {
    fn conf(l: &mut LocConf) -> &mut UpstreamConf {
        &mut l.modules.memcached.up
    }

    fn get(l: &LocConf) -> &UpstreamConf {
        &l.modules.memcached.up
    }
}

pub const DIRECTIVES: &[Spec] = crate::upstream_directives_core!(
    Up,
    "memcached",
    [
        row("memcached_pass", LOC, Args::take(1), set_pass),
        row("memcached_gzip_flag", HSL, Args::take(1), set_gzip_flag),
    ]
);

const fn row(
    name: &'static str,
    ctx: u32,
    args: Args,
    f: fn(&mut LocConf, &Directive, &mut Compiler) -> ConfResult<()>,
) -> Spec {
    Spec {
        name,
        ctx,
        args,
        set: Setter::Loc(f),
    }
}

/// Location-level settings.
#[derive(Debug, Clone, Default)]
pub struct MemcachedLoc {
    pub pass: Option<Arc<PassAddr>>,
    /// The shared upstream settings (the engine's `memcached_*` rows).
    pub up: UpstreamConf,
    pub gzip_flag: Option<u32>,
    /// `$memcached_key`, compiled by `memcached_pass`.
    pub key: Option<Template>,
}

impl MemcachedLoc {
    pub fn merge(&mut self, p: &MemcachedLoc) {
        merge_opts!(self, p; pass, gzip_flag, key);
        self.up.merge(&p.up);
    }
}

fn set_pass(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.memcached.pass.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    l.modules.memcached.pass = Some(Arc::new(peers::pass_addr(
        d,
        cx,
        arg(d, 0),
        "memcached_temp",
    )?));
    // nginx's module declares the variable; `set` gives it its value.
    cx.vars.define("memcached_key");
    l.modules.memcached.key = Some(cx.template("$memcached_key", d)?);
    l.content = Some(content);
    Ok(())
}

fn set_gzip_flag(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = value::number(arg(d, 0))
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| crate::config::registry::slot_invalid_number(d))?;
    set_once(&mut l.modules.memcached.gzip_flag, n, d)
}

/// nginx's `no port in upstream "NAME"` (see [`peers::check_pass`]).
pub fn check_pass(own: &LocConf, hm: &HttpMain, block: &[Directive]) -> ConfResult<()> {
    peers::check_pass(
        own.modules.memcached.pass.as_deref(),
        hm,
        block,
        "memcached_pass",
    )
}

/// The content handler `memcached_pass` puts in its location's slot.
pub fn content<'a>(
    cx: &'a mut Ctx<'_>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + 'a>> {
    Box::pin(handle(cx))
}

async fn handle(cx: &mut Ctx<'_>) -> Response {
    let loc = cx.loc.clone();
    let Some(pass) = loc.modules.memcached.pass.clone() else {
        return Response::status(500);
    };
    let key = match &loc.modules.memcached.key {
        Some(t) => t.render_vec(&*cx),
        None => Vec::new(),
    };
    if key.is_empty() {
        cx.log(Level::Error, "the \"$memcached_key\" variable is not set");
        return Response::status(500);
    }
    // The body is not sent; read and dropped as for any handler that
    // does not use it.
    if let Err(r) = crate::http::body::read(cx, &pass.body_temp_default).await {
        return *r;
    }
    let Some(up) = peers::upstream_of(cx, &pass.to).await else {
        return Response::status(502);
    };
    let mut conf = loc.modules.memcached.up.clone();
    // nginx reads memcached unbuffered (buffer_size of memory, no file).
    conf.buffering = Some(false);
    let lim = Limits::of(&conf);
    let proto = Arc::new(Memcached {
        loc: loc.clone(),
        conf,
        pass,
        key: escape(&key),
        content_type: crate::http::modules::static_file::content_type(cx, &cx.uri),
    });
    crate::http::upstream::run(cx, proto, up, lim).await
}

/// The key as nginx sends it: bytes up to space, `%` and DEL escaped.
fn escape(k: &[u8]) -> Vec<u8> {
    let mut o = Vec::with_capacity(k.len());
    for &c in k {
        if c <= b' ' || c == b'%' || c == 0x7f {
            o.extend_from_slice(format!("%{:02X}", c).as_bytes());
        } else {
            o.push(c);
        }
    }
    o
}

/// memcached to one request's upstream.
struct Memcached {
    loc: Arc<LocConf>,
    conf: UpstreamConf,
    pass: Arc<PassAddr>,
    /// `$memcached_key`, escaped.
    key: Vec<u8>,
    content_type: Arc<str>,
}

impl Protocol for Memcached {
    fn conf(&self) -> &UpstreamConf {
        &self.conf
    }

    fn url(&self, peer: &str) -> String {
        format!("memcached://{}", peer)
    }

    fn create_request(
        &self,
        _: &Ctx<'_>,
        _: Option<Caching<'_>>,
    ) -> Result<Request, Box<Response>> {
        let mut head = b"get ".to_vec();
        head.extend_from_slice(&self.key);
        head.extend_from_slice(b"\r\n");
        Ok(Request {
            head,
            body: OutBody::None,
        })
    }

    fn head_reader(&self, head_only: bool, head_max: usize) -> Box<dyn HeadReader> {
        Box::new(McHead {
            buf: Vec::new(),
            key: self.key.clone(),
            head_only,
            head_max,
            gzip_flag: self.loc.modules.memcached.gzip_flag.unwrap_or(0),
            content_type: self.content_type.clone(),
        })
    }

    fn hidden(&self) -> &'static [&'static str] {
        &[]
    }

    fn ranges(&self) -> bool {
        true
    }

    /// A key memcached does not have is nginx's 404 page.
    fn intercepts(&self, status: u16) -> bool {
        status == 404
    }

    fn cache_key(&self, _: &Ctx<'_>) -> Vec<u8> {
        Vec::new()
    }

    fn temp_default(&self) -> &Path {
        &self.pass.temp_default
    }
}

/// Reads the `VALUE` (or `END`) line.
struct McHead {
    buf: Vec<u8>,
    key: Vec<u8>,
    head_only: bool,
    head_max: usize,
    gzip_flag: u32,
    content_type: Arc<str>,
}

impl HeadReader for McHead {
    fn feed(&mut self, data: &[u8]) -> Result<Option<Head>, Fail> {
        self.buf.extend_from_slice(data);
        let Some(nl) = memchr::memchr(b'\n', &self.buf) else {
            if self.buf.len() >= self.head_max {
                return Err(invalid_header(&format!(
                    "upstream sent too big header {}",
                    WHILE_HEAD
                )));
            }
            return Ok(None);
        };
        let line = &self.buf[..nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let text = String::from_utf8_lossy(line).into_owned();
        let rest = self.buf[nl + 1..].to_vec();
        if line == b"END" {
            return Ok(Some(Head {
                status: 404,
                status_line: Vec::new(),
                headers: Vec::new(),
                early: rest,
                body: Vec::new(),
                declared_len: Some(0),
                no_body: true,
                keep: true,
                decoder: Box::new(McBody::empty()),
            }));
        }
        let invalid = || {
            invalid_header(&format!(
                "memcached sent invalid response: \"{}\" {}",
                text, WHILE_HEAD
            ))
        };
        let Some(v) = line.strip_prefix(b"VALUE ") else {
            return Err(invalid());
        };
        let mut parts = v.split(|&c| c == b' ');
        let key = parts.next().unwrap_or_default();
        if key != self.key.as_slice() {
            return Err(invalid_header(&format!(
                "memcached sent invalid key in response \"{}\" for key \"{}\" {}",
                String::from_utf8_lossy(v),
                String::from_utf8_lossy(&self.key),
                WHILE_HEAD
            )));
        }
        let num = |p: Option<&[u8]>| -> Option<u64> { std::str::from_utf8(p?).ok()?.parse().ok() };
        let (Some(flags), Some(len)) = (num(parts.next()), num(parts.next())) else {
            return Err(invalid());
        };
        let mut headers = vec![(
            "Content-Type".to_string(),
            self.content_type.as_bytes().to_vec(),
        )];
        if self.gzip_flag != 0 && flags & u64::from(self.gzip_flag) != 0 {
            headers.push(("Content-Encoding".to_string(), b"gzip".to_vec()));
        }
        Ok(Some(Head {
            status: 200,
            status_line: Vec::new(),
            headers,
            early: rest,
            body: Vec::new(),
            declared_len: Some(len),
            no_body: self.head_only,
            // nginx reads no value for HEAD, and so does not know the
            // connection clean: it is closed (memcached_keepalive.t).
            keep: !self.head_only,
            decoder: Box::new(McBody {
                left: len,
                trailer: 0,
                extra: false,
                logs: Vec::new(),
            }),
        }))
    }
}

const TRAILER: &[u8] = b"\r\nEND\r\n";

/// The value's bytes, then the trailer, checked.
struct McBody {
    left: u64,
    /// Bytes of the trailer seen.
    trailer: usize,
    extra: bool,
    logs: Vec<String>,
}

impl McBody {
    fn empty() -> McBody {
        McBody {
            left: 0,
            trailer: TRAILER.len(),
            extra: false,
            logs: Vec::new(),
        }
    }
}

impl BodyDecoder for McBody {
    fn feed(&mut self, mut buf: &[u8], out: &mut Vec<u8>) -> Result<(), Fail> {
        let take = self.left.min(buf.len() as u64) as usize;
        out.extend_from_slice(&buf[..take]);
        self.left -= take as u64;
        buf = &buf[take..];
        while let Some((&c, rest)) = buf.split_first() {
            if self.trailer == TRAILER.len() {
                self.extra = true;
                return Ok(());
            }
            if c != TRAILER[self.trailer] {
                // As nginx: logged, the value stands as it is, and the
                // connection is not reused.
                self.trailer = TRAILER.len();
                self.extra = true;
                self.logs
                    .push("memcached sent invalid trailer while reading upstream".into());
                return Ok(());
            }
            self.trailer += 1;
            buf = rest;
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.left == 0 && self.trailer == TRAILER.len()
    }

    fn extra(&self) -> bool {
        self.extra
    }

    fn logs(&mut self) -> Vec<String> {
        std::mem::take(&mut self.logs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_escape() {
        assert_eq!(escape(b"/a b%c"), b"/a%20b%25c");
    }

    #[test]
    fn body_and_trailer() {
        let mut d = McBody {
            left: 3,
            trailer: 0,
            extra: false,
            logs: Vec::new(),
        };
        let mut out = Vec::new();
        for c in b"abc\r\nEND\r\n".chunks(2) {
            assert!(d.feed(c, &mut out).is_ok());
        }
        assert!(d.done() && !d.extra);
        assert_eq!(out, b"abc");
        let mut d = McBody {
            left: 1,
            trailer: 0,
            extra: false,
            logs: Vec::new(),
        };
        assert!(d.feed(b"aXX", &mut Vec::new()).is_ok());
        assert!(d.done() && d.extra && d.logs().len() == 1);
    }
}
