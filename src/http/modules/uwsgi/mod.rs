//! `uwsgi_pass` and the `uwsgi_*` directives (nginx's
//! ngx_http_uwsgi_module): a uwsgi client (the protocol of the uWSGI
//! application server), on the upstream engine ([`crate::http::upstream`]).
//!
//! # A request
//!
//! ```text
//! content phase
//!   ├─ the request body, read whole (crate::http::body)
//!   ├─ out: a 4-byte header: uwsgi_modifier1, the vars' size (u16,
//!   │     little-endian), uwsgi_modifier2; then the vars, each a u16 LE
//!   │     length + name, a u16 LE length + value: uwsgi_param entries in
//!   │     order, then the client's headers as HTTP_* (unless a param sets
//!   │     that name); then the body as it is
//!   ├─ in: an HTTP status line and headers (what uWSGI sends), or CGI
//!   │   header lines: crate::http::modules::cgi::CgiHead
//!   └─ the body runs to the connection's close (never kept alive)
//! ```
//!
//! Everything else (peers, next_upstream, buffering, `uwsgi_cache*`,
//! `uwsgi_store`, header hiding) is the engine's, from the shared
//! `uwsgi_*` rows of the table ([`crate::upstream_directives!`]).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::registry::{arg, ctx, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
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

const LOC: u32 = ctx::LOC | ctx::LIF;
const HSL: u32 = ctx::HSL;

/// uwsgi's [`UpstreamConf`] in a location.
pub struct Up;

impl Slot for Up {
    fn conf(l: &mut LocConf) -> &mut UpstreamConf {
        &mut l.modules.uwsgi.up
    }

    fn get(l: &LocConf) -> &UpstreamConf {
        &l.modules.uwsgi.up
    }
}

pub const DIRECTIVES: &[Spec] = crate::upstream_directives!(
    Up,
    "uwsgi",
    [
        row("uwsgi_pass", LOC, Args::take(1), set_pass),
        row("uwsgi_param", HSL, Args::take23(), set_param),
        row("uwsgi_modifier1", HSL, Args::take(1), set_modifier),
        row("uwsgi_modifier2", HSL, Args::take(1), set_modifier),
        unsupported("uwsgi_ssl_certificate"),
        unsupported("uwsgi_ssl_certificate_key"),
        unsupported("uwsgi_ssl_ciphers"),
        unsupported("uwsgi_ssl_crl"),
        unsupported("uwsgi_ssl_name"),
        unsupported("uwsgi_ssl_password_file"),
        unsupported("uwsgi_ssl_protocols"),
        unsupported("uwsgi_ssl_server_name"),
        unsupported("uwsgi_ssl_session_reuse"),
        unsupported("uwsgi_ssl_trusted_certificate"),
        unsupported("uwsgi_ssl_verify"),
        unsupported("uwsgi_ssl_verify_depth"),
        unsupported("uwsgi_ssl_conf_command"),
    ]
);

/// A directive of the module tern does not implement yet.
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

/// Location-level settings.
#[derive(Debug, Clone, Default)]
pub struct UwsgiLoc {
    pub pass: Option<Arc<PassAddr>>,
    /// The shared upstream settings (the engine's `uwsgi_*` rows).
    pub up: UpstreamConf,
    /// `uwsgi_param` entries: a level with any replaces the inherited list.
    pub params: Option<Arc<Vec<Param>>>,
    pub modifier1: Option<u8>,
    pub modifier2: Option<u8>,
}

impl UwsgiLoc {
    pub fn merge(&mut self, p: &UwsgiLoc) {
        merge_opts!(self, p; pass, params, modifier1, modifier2);
        self.up.merge(&p.up);
    }
}

fn set_pass(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.uwsgi.pass.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let a = arg(d, 0);
    let lower = a.to_ascii_lowercase();
    let a = if lower.starts_with("uwsgi://") {
        &a[8..]
    } else if lower.starts_with("suwsgi://") {
        return Err(ConfError::at(
            "uwsgi_pass to suwsgi:// is not supported by tern yet",
            d,
        ));
    } else {
        a
    };
    l.modules.uwsgi.pass = Some(Arc::new(peers::pass_addr(d, cx, a, "uwsgi_temp")?));
    l.content = Some(content);
    Ok(())
}

/// nginx's `no port in upstream "NAME"` (see [`peers::check_pass`]).
pub fn check_pass(own: &LocConf, hm: &HttpMain, block: &[Directive]) -> ConfResult<()> {
    peers::check_pass(own.modules.uwsgi.pass.as_deref(), hm, block, "uwsgi_pass")
}

fn set_param(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = cgi::param(d, cx)?;
    let list = l.modules.uwsgi.params.get_or_insert_with(Default::default);
    Arc::make_mut(list).push(p);
    Ok(())
}

/// `uwsgi_modifier1 N`, `uwsgi_modifier2 N`: 0..255.
fn set_modifier(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n =
        value::number(arg(d, 0)).ok_or_else(|| crate::config::registry::slot_invalid_number(d))?;
    let n = u8::try_from(n).map_err(|_| {
        ConfError::at(
            format!("value must be less than or equal to 255 in \"{}\"", d.name),
            d,
        )
    })?;
    let c = &mut l.modules.uwsgi;
    let slot = if d.name == "uwsgi_modifier1" {
        &mut c.modifier1
    } else {
        &mut c.modifier2
    };
    set_once(slot, n, d)
}

// ---- the request ------------------------------------------------------------

/// nginx's uwsgi hidden headers; Date and Server are relayed.
const HIDDEN: &[&str] = &[
    "x-accel-expires",
    "x-accel-redirect",
    "x-accel-limit-rate",
    "x-accel-buffering",
    "x-accel-charset",
];

/// The content handler `uwsgi_pass` puts in its location's slot.
pub fn content<'a>(
    cx: &'a mut Ctx<'_>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + 'a>> {
    Box::pin(handle(cx))
}

async fn handle(cx: &mut Ctx<'_>) -> Response {
    let loc = cx.loc.clone();
    let pass = loc.modules.uwsgi.pass.clone();
    crate::http::upstream::run::pass_addr(cx, pass, &loc.modules.uwsgi.up, false, |pass| {
        Arc::new(Uwsgi {
            loc: loc.clone(),
            pass,
        })
    })
    .await
}

/// One var: u16 LE length and name, u16 LE length and value (longer ones
/// are cut, as nginx's 16-bit fields would wrap).
fn var(out: &mut Vec<u8>, n: &[u8], v: &[u8]) {
    let n = &n[..n.len().min(65535)];
    let v = &v[..v.len().min(65535)];
    out.extend_from_slice(&(n.len() as u16).to_le_bytes());
    out.extend_from_slice(n);
    out.extend_from_slice(&(v.len() as u16).to_le_bytes());
    out.extend_from_slice(v);
}

/// The packet header and vars. Err: nginx's message when they exceed the
/// 16-bit size.
fn request_head(
    cx: &Ctx<'_>,
    conf: &UwsgiLoc,
    caching: Option<Caching<'_>>,
) -> Result<Vec<u8>, String> {
    let mut vars = Vec::with_capacity(512);
    let list: &[Param] = conf.params.as_deref().map_or(&[], |v| v);
    let headers = conf.up.pass_request_headers.unwrap_or(true);
    cgi::params(cx, list, headers, caching, |n, v| var(&mut vars, n, v));
    if vars.len() > 65535 {
        return Err(format!("uwsgi request is too big: {}", vars.len()));
    }
    let mut out = Vec::with_capacity(vars.len() + 4);
    out.push(conf.modifier1.unwrap_or(0));
    out.extend_from_slice(&(vars.len() as u16).to_le_bytes());
    out.push(conf.modifier2.unwrap_or(0));
    out.extend_from_slice(&vars);
    Ok(out)
}

/// uwsgi to one request's upstream.
struct Uwsgi {
    loc: Arc<LocConf>,
    pass: Arc<PassAddr>,
}

impl Protocol for Uwsgi {
    fn conf(&self) -> &UpstreamConf {
        &self.loc.modules.uwsgi.up
    }

    fn url(&self, peer: &str) -> String {
        format!("uwsgi://{}", peer)
    }

    fn create_request(
        &self,
        cx: &Ctx<'_>,
        caching: Option<Caching<'_>>,
    ) -> Result<Request, Box<Response>> {
        let conf = &self.loc.modules.uwsgi;
        let head = match request_head(cx, conf, caching) {
            Ok(h) => h,
            Err(m) => {
                cx.log(Level::Alert, &m);
                return Err(Box::new(Response::status(500)));
            }
        };
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
        Ok(Request { head, body })
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

    /// nginx requires `uwsgi_cache_key` (checked when the location is
    /// compiled); this is never used.
    fn cache_key(&self, _: &Ctx<'_>) -> Vec<u8> {
        Vec::new()
    }

    fn temp_default(&self) -> &Path {
        &self.pass.temp_default
    }
}
