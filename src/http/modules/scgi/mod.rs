//! `scgi_pass` and the `scgi_*` directives (nginx's ngx_http_scgi_module):
//! an SCGI client, on the upstream engine ([`crate::http::upstream`]).
//!
//! # A request
//!
//! ```text
//! content phase
//!   ├─ the request body, read whole (crate::http::body)
//!   ├─ out: a netstring of NUL-separated names and values,
//!   │     "LEN:" CONTENT_LENGTH \0 <body length> \0 (always first, as nginx)
//!   │           scgi_param entries \0-separated, in order
//!   │           the client's headers as HTTP_* (unless a param sets that name)
//!   │     ","  then the body as it is
//!   ├─ in: an HTTP status line and headers, or CGI header lines
//!   │   (`Status:`, else `Location:` makes it 302, else 200):
//!   │   crate::http::modules::cgi::CgiHead
//!   └─ the body runs to the connection's close (never kept alive)
//! ```
//!
//! Everything else (peers, next_upstream, buffering, `scgi_cache*`,
//! `scgi_store`, header hiding) is the engine's, from the shared
//! `scgi_*` rows of the table ([`crate::upstream_directives!`]).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::body;
use crate::http::conf::{merge_opts, HttpMain, LocConf};
use crate::http::modules::cgi::{self, Param};
use crate::http::phases::Ctx;
use crate::http::response::Response;
use crate::http::upstream::conf::{Slot, UpstreamConf};
use crate::http::upstream::peers::{self, PassAddr};
use crate::http::upstream::{Caching, HeadReader, OutBody, Protocol, Request};

const LOC: u32 = ctx::LOC | ctx::LIF;
const HSL: u32 = ctx::HSL;

/// scgi's [`UpstreamConf`] in a location.
pub struct Up;

impl Slot for Up {
    fn conf(l: &mut LocConf) -> &mut UpstreamConf {
        &mut l.modules.scgi.up
    }

    fn get(l: &LocConf) -> &UpstreamConf {
        &l.modules.scgi.up
    }
}

pub const DIRECTIVES: &[Spec] = crate::upstream_directives!(
    Up,
    "scgi",
    [
        row("scgi_pass", LOC, Args::take(1), set_pass),
        row("scgi_param", HSL, Args::take23(), set_param),
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
pub struct ScgiLoc {
    pub pass: Option<Arc<PassAddr>>,
    /// The shared upstream settings (the engine's `scgi_*` rows).
    pub up: UpstreamConf,
    /// `scgi_param` entries: a level with any replaces the inherited list.
    pub params: Option<Arc<Vec<Param>>>,
}

impl ScgiLoc {
    pub fn merge(&mut self, p: &ScgiLoc) {
        merge_opts!(self, p; pass, params);
        self.up.merge(&p.up);
    }
}

fn set_pass(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.scgi.pass.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    l.modules.scgi.pass = Some(Arc::new(peers::pass_addr(d, cx, arg(d, 0), "scgi_temp")?));
    l.content = Some(content);
    Ok(())
}

/// nginx's `no port in upstream "NAME"` (see [`peers::check_pass`]).
pub fn check_pass(own: &LocConf, hm: &HttpMain, block: &[Directive]) -> ConfResult<()> {
    peers::check_pass(own.modules.scgi.pass.as_deref(), hm, block, "scgi_pass")
}

fn set_param(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = cgi::param(d, cx)?;
    let list = l.modules.scgi.params.get_or_insert_with(Default::default);
    Arc::make_mut(list).push(p);
    Ok(())
}

// ---- the request ------------------------------------------------------------

/// nginx's scgi hidden headers; Date and Server are relayed.
const HIDDEN: &[&str] = &[
    "status",
    "x-accel-expires",
    "x-accel-redirect",
    "x-accel-limit-rate",
    "x-accel-buffering",
    "x-accel-charset",
];

/// The content handler `scgi_pass` puts in its location's slot.
pub fn content<'a>(
    cx: &'a mut Ctx<'_>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + 'a>> {
    Box::pin(handle(cx))
}

async fn handle(cx: &mut Ctx<'_>) -> Response {
    let loc = cx.loc.clone();
    let pass = loc.modules.scgi.pass.clone();
    crate::http::upstream::run::pass_addr(cx, pass, &loc.modules.scgi.up, false, |pass| {
        Arc::new(Scgi {
            loc: loc.clone(),
            pass,
        })
    })
    .await
}

/// The netstring of the request's headers (with CONTENT_LENGTH first).
fn request_head(
    cx: &Ctx<'_>,
    conf: &ScgiLoc,
    body_len: u64,
    caching: Option<Caching<'_>>,
) -> Vec<u8> {
    let mut h = Vec::with_capacity(512);
    h.extend_from_slice(b"CONTENT_LENGTH\0");
    h.extend_from_slice(body_len.to_string().as_bytes());
    h.push(0);
    let list: &[Param] = conf.params.as_deref().map_or(&[], |v| v);
    let headers = conf.up.pass_request_headers.unwrap_or(true);
    cgi::params(cx, list, headers, caching, |n, v| {
        h.extend_from_slice(n);
        h.push(0);
        h.extend_from_slice(v);
        h.push(0);
    });
    let mut out = Vec::with_capacity(h.len() + 12);
    out.extend_from_slice(h.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(&h);
    out.push(b',');
    out
}

/// SCGI to one request's upstream.
struct Scgi {
    loc: Arc<LocConf>,
    pass: Arc<PassAddr>,
}

impl Protocol for Scgi {
    fn conf(&self) -> &UpstreamConf {
        &self.loc.modules.scgi.up
    }

    fn url(&self, peer: &str) -> String {
        format!("scgi://{}", peer)
    }

    fn create_request(
        &self,
        cx: &Ctx<'_>,
        caching: Option<Caching<'_>>,
    ) -> Result<Request, Box<Response>> {
        let conf = &self.loc.modules.scgi;
        let body = if body::streaming(cx) {
            OutBody::Stream
        } else if conf.up.pass_request_body.unwrap_or(true) {
            match body::data(cx) {
                Some(body::Data::Mem(b)) if !b.is_empty() => OutBody::Mem(Bytes::clone(b)),
                Some(body::Data::File { file, len, .. }) if *len > 0 => {
                    OutBody::File(file.clone(), *len)
                }
                _ => OutBody::None,
            }
        } else {
            OutBody::None
        };
        // CONTENT_LENGTH is the client's body length, also when
        // scgi_pass_request_body off sends none (as nginx).
        let len = body::length(cx).unwrap_or(0);
        Ok(Request {
            head: request_head(cx, conf, len, caching),
            body,
        })
    }

    fn head_reader(&self, head_only: bool, head_max: usize) -> Box<dyn HeadReader> {
        Box::new(cgi::CgiHead::new(head_only, head_max))
    }

    fn hidden(&self) -> &'static [&'static str] {
        HIDDEN
    }

    fn relays_date(&self) -> bool {
        true
    }

    /// nginx requires `scgi_cache_key` (checked when the location is
    /// compiled); this is never used.
    fn cache_key(&self, _: &Ctx<'_>) -> Vec<u8> {
        Vec::new()
    }

    fn temp_default(&self) -> &Path {
        &self.pass.temp_default
    }
}
