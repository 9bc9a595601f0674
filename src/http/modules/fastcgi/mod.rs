//! `fastcgi_pass` and the `fastcgi_*` directives (nginx's
//! ngx_http_fastcgi_module): a FastCGI client for php-fpm and the like.
//!
//! The protocol on the upstream engine ([`crate::http::upstream`], as
//! nginx has one ngx_http_upstream for all): peer selection and
//! `upstream {}` blocks, the keepalive cache, `fastcgi_next_upstream`
//! with its tries and timeout, `$upstream_*`, timeouts, buffering to
//! memory and temp files, `fastcgi_cache*`, `fastcgi_store`, header
//! hiding, error interception and client-abort handling are the engine's,
//! as are the shared `fastcgi_*` rows of the table below
//! ([`crate::upstream_directives!`]), which fill [`FastcgiLoc::up`]. This
//! module adds the protocol: `records.rs` the wire format.
//!
//! # A request
//!
//! ```text
//! content phase
//!   ├─ the request body, read whole (crate::http::body)
//!   ├─ records out: BEGIN_REQUEST (responder; FCGI_KEEP_CONN with
//!   │   fastcgi_keep_conn), PARAMS (fastcgi_param entries in order, then
//!   │   the client's headers as HTTP_* unless a param of that name is set),
//!   │   an empty PARAMS, STDIN (the body, 32 KiB a record), an empty STDIN
//!   ├─ records in, until the head is complete (Decoder):
//!   │     STDOUT ─▶ CGI header lines ─ `Status:` gives the status and,
//!   │                verbatim, the status line (`404 Not Here`, `200`),
//!   │                else `Location:` makes it `302 Moved Temporarily`,
//!   │                else `200 OK`
//!   │     STDERR ─▶ error log ("FastCGI sent in stderr: ...")
//!   │     END_REQUEST before the blank line ─▶ 502
//!   └─ the rest of STDOUT is the body: the engine's Producer streams it
//!      while the Decoder strips the framing; END_REQUEST ends it, and with
//!      fastcgi_keep_conn the connection goes back to the upstream's
//!      keepalive cache. The script's Content-Length bounds it, as nginx's
//!      `f->rest`: more is dropped (a warning, the connection not reused),
//!      an output that ends short breaks the answer after what came
//! ```
//!
//! Every record is padded to a multiple of 8 bytes, as nginx pads them.

pub(crate) mod records;

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::body;
use crate::http::conf::{merge_opts, HttpMain, LocConf};
use crate::http::modules::cgi::{self, Param};
use crate::http::phases::Ctx;
use crate::http::response::Response;
use crate::http::upstream::conf::{Slot, UpstreamConf};
use crate::http::upstream::peers::{self, PassAddr};
use crate::http::upstream::{Caching, HeadReader, OutBody, Protocol, Request};
use crate::http::vars::Template;

const LOC: u32 = ctx::LOC | ctx::LIF;
const HSL: u32 = ctx::HSL;

/// fastcgi's [`UpstreamConf`] in a location.
pub struct Up;

impl Slot for Up {
    fn conf(l: &mut LocConf) -> &mut UpstreamConf {
        &mut l.modules.fastcgi.up
    }

    fn get(l: &LocConf) -> &UpstreamConf {
        &l.modules.fastcgi.up
    }
}

pub const DIRECTIVES: &[Spec] = crate::upstream_directives!(
    Up,
    "fastcgi",
    [
        row("fastcgi_pass", LOC, Args::take(1), set_pass),
        row("fastcgi_param", HSL, Args::take23(), set_param),
        row("fastcgi_index", HSL, Args::take(1), set_index),
        row(
            "fastcgi_split_path_info",
            ctx::LOC,
            Args::take(1),
            set_split
        ),
        row("fastcgi_keep_conn", HSL, Args::Flag, set_keep_conn),
        row("fastcgi_catch_stderr", HSL, Args::take(1), set_catch_stderr),
        unsupported("fastcgi_send_lowat"),
    ]
);

/// A directive of the module tern does not implement yet (refused with
/// a message naming it, never silently accepted).
const fn unsupported(name: &'static str) -> Spec {
    Spec {
        name,
        ctx: HSL,
        args: Args::Any,
        set: Setter::Unsupported,
    }
}

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

/// Module variables (see `modules::VAR_MODULES`).
pub const VARS: &[&str] = &["fastcgi_script_name", "fastcgi_path_info"];

pub fn var(cx: &Ctx<'_>, i: u8, out: &mut Vec<u8>) -> bool {
    let (script, info) = split_path(cx);
    match i {
        0 => out.extend_from_slice(&script),
        1 => out.extend_from_slice(info),
        _ => return false,
    }
    true
}

/// `$fastcgi_script_name` and `$fastcgi_path_info` of the current URI:
/// the two captures of `fastcgi_split_path_info` when it matches (else
/// the URI and nothing), with `fastcgi_index` appended to a script name
/// that ends in `/`.
fn split_path<'c>(cx: &'c Ctx<'_>) -> (Cow<'c, [u8]>, &'c [u8]) {
    let conf = &cx.loc.modules.fastcgi;
    let uri: &[u8] = &cx.uri;
    let (script, info) = match conf.split.as_ref().and_then(|re| re.captures(uri)) {
        Some(c) => {
            let group = |i: usize| {
                c.get(i)
                    .copied()
                    .flatten()
                    .and_then(|(s, e)| uri.get(s..e))
                    .unwrap_or(b"")
            };
            (group(1), group(2))
        }
        None => (uri, &b""[..]),
    };
    match &conf.index {
        Some(ix) if script.ends_with(b"/") => {
            let mut s = script.to_vec();
            ix.render(cx, &mut s);
            (Cow::Owned(s), info)
        }
        _ => (Cow::Borrowed(script), info),
    }
}

// ---- configuration ----------------------------------------------------------

/// Location-level settings.
#[derive(Debug, Clone, Default)]
pub struct FastcgiLoc {
    pub pass: Option<Arc<PassAddr>>,
    /// The shared upstream settings (the engine's `fastcgi_*` rows).
    pub up: UpstreamConf,
    /// `fastcgi_param` entries: a level with any replaces the inherited list.
    pub params: Option<Arc<Vec<Param>>>,
    pub index: Option<Template>,
    pub split: Option<crate::core::regex::Regex>,
    pub keep_conn: Option<bool>,
    pub catch_stderr: Option<Arc<Vec<Vec<u8>>>>,
}

impl FastcgiLoc {
    pub fn merge(&mut self, p: &FastcgiLoc) {
        // `pass` is inherited into `if` blocks; conf.rs drops it for
        // nested locations, as for proxy_pass.
        merge_opts!(self, p; pass, params, index, split, keep_conn, catch_stderr);
        self.up.merge(&p.up);
    }
}

fn set_pass(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.fastcgi.pass.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    l.modules.fastcgi.pass = Some(Arc::new(peers::pass_addr(
        d,
        cx,
        arg(d, 0),
        "fastcgi_temp",
    )?));
    l.content = Some(content);
    Ok(())
}

/// nginx's `no port in upstream "NAME"` (see [`peers::check_pass`]).
pub fn check_pass(own: &LocConf, hm: &HttpMain, block: &[Directive]) -> ConfResult<()> {
    let p = own.modules.fastcgi.pass.as_deref();
    peers::check_pass(p, hm, block, "fastcgi_pass")
}

fn set_param(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = cgi::param(d, cx)?;
    let list = l
        .modules
        .fastcgi
        .params
        .get_or_insert_with(Default::default);
    Arc::make_mut(list).push(p);
    Ok(())
}

fn set_index(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let t = cx.template(arg(d, 0), d)?;
    set_once(&mut l.modules.fastcgi.index, t, d)
}

fn set_split(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let p = arg(d, 0);
    let re = crate::core::regex::Regex::compile(d, p, false)?;
    // Group 0 is the whole match.
    if re.capture_names().len() != 3 {
        return Err(ConfError::at(
            format!("pattern \"{}\" must have 2 captures", p),
            d,
        ));
    }
    set_once(&mut l.modules.fastcgi.split, re, d)
}

fn set_keep_conn(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.fastcgi.keep_conn, v, d)
}

fn set_catch_stderr(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let list = l
        .modules
        .fastcgi
        .catch_stderr
        .get_or_insert_with(Default::default);
    Arc::make_mut(list).push(arg(d, 0).as_bytes().to_vec());
    Ok(())
}

// ---- the request ------------------------------------------------------------

/// nginx's fastcgi hidden headers; Date and Server are relayed.
const HIDDEN: &[&str] = &[
    "status",
    "x-accel-expires",
    "x-accel-redirect",
    "x-accel-limit-rate",
    "x-accel-buffering",
    "x-accel-charset",
];

/// The content handler `fastcgi_pass` puts in its location's slot.
pub fn content<'a>(
    cx: &'a mut Ctx<'_>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + 'a>> {
    Box::pin(handle(cx))
}

async fn handle(cx: &mut Ctx<'_>) -> Response {
    let loc = cx.loc.clone();
    let pass = loc.modules.fastcgi.pass.clone();
    crate::http::upstream::run::pass_addr(cx, pass, &loc.modules.fastcgi.up, true, |pass| {
        Arc::new(Fcgi {
            loc: loc.clone(),
            pass,
        })
    })
    .await
}

/// FastCGI to one request's upstream.
struct Fcgi {
    loc: Arc<LocConf>,
    pass: Arc<PassAddr>,
}

impl Protocol for Fcgi {
    fn conf(&self) -> &UpstreamConf {
        &self.loc.modules.fastcgi.up
    }

    fn url(&self, peer: &str) -> String {
        format!("fastcgi://{}", peer)
    }

    fn create_request(
        &self,
        cx: &Ctx<'_>,
        caching: Option<Caching<'_>>,
    ) -> Result<Request, Box<Response>> {
        let fconf = &self.loc.modules.fastcgi;
        let keep_conn = fconf.keep_conn.unwrap_or(false);
        let mut head = match records::request_head(cx, fconf, keep_conn, caching) {
            Ok(h) => h,
            Err(m) => {
                cx.log(Level::Alert, &m);
                return Err(Box::new(Response::status(500)));
            }
        };
        // The body: in memory, framed now; from its temp file, framed
        // piece by piece as it is read back (frame_body).
        let body = if body::streaming(cx) {
            OutBody::Stream
        } else if fconf.up.pass_request_body.unwrap_or(true) {
            match body::data(cx) {
                Some(body::Data::Mem(b)) if !b.is_empty() => {
                    let mut v = records::stdin(b);
                    v.extend_from_slice(&records::stdin(&[]));
                    OutBody::Mem(Bytes::from(v))
                }
                Some(body::Data::File { file, len, .. }) if *len > 0 => {
                    OutBody::File(file.clone(), *len)
                }
                _ => OutBody::None,
            }
        } else {
            OutBody::None
        };
        if matches!(body, OutBody::None) {
            head.extend_from_slice(&records::stdin(&[]));
        }
        Ok(Request { head, body })
    }

    fn frame_body(&self, data: &[u8], out: &mut Vec<u8>) -> bool {
        out.extend_from_slice(&records::stdin(data));
        true
    }

    fn end_body(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&records::stdin(&[]));
    }

    fn head_reader(&self, head_only: bool, head_max: usize) -> Box<dyn HeadReader> {
        let f = &self.loc.modules.fastcgi;
        Box::new(records::FcgiHead::new(
            head_only,
            head_max,
            f.keep_conn.unwrap_or(false),
            f.catch_stderr.clone().unwrap_or_default(),
        ))
    }

    fn hidden(&self) -> &'static [&'static str] {
        HIDDEN
    }

    /// The script's Date and Server go to the client. (`Location:` is
    /// relayed as it came, also a relative one: nginx keeps upstream
    /// redirects out of its header filter's absolute_redirect.)
    fn relays_date(&self) -> bool {
        true
    }

    /// nginx requires `fastcgi_cache_key` (checked when the location is
    /// compiled); this is never used.
    fn cache_key(&self, _: &Ctx<'_>) -> Vec<u8> {
        Vec::new()
    }

    fn temp_default(&self) -> &Path {
        &self.pass.temp_default
    }
}
