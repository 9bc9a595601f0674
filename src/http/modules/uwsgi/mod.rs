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
//! `uwsgi_pass suwsgi://ADDRESS` (or a value with variables that renders
//! one) goes over TLS, with the `uwsgi_ssl_*` settings: the engine's
//! (`crate::http::upstream::ssl`), as proxy's and grpc's.
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
use crate::http::upstream::conf::{Limits, Slot, UpstreamConf};
use crate::http::upstream::peers::{self, PassAddr, PassTo};
use crate::http::upstream::{run, ssl, Caching, HeadReader, OutBody, Protocol, Request};

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
    tls,
    [
        row("uwsgi_pass", LOC, Args::take(1), set_pass),
        row("uwsgi_param", HSL, Args::take23(), set_param),
        row("uwsgi_modifier1", HSL, Args::take(1), set_modifier),
        row("uwsgi_modifier2", HSL, Args::take(1), set_modifier),
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

/// A compiled `uwsgi_pass [uwsgi://|suwsgi://]ADDRESS`.
#[derive(Debug)]
pub struct UwsgiPass {
    pub addr: PassAddr,
    /// `suwsgi://`: TLS to the backend (the engine's `uwsgi_ssl_*`).
    pub tls: bool,
    /// The address as written, without the scheme: the TLS name by
    /// default.
    pub host: String,
}

/// Location-level settings.
#[derive(Debug, Clone, Default)]
pub struct UwsgiLoc {
    pub pass: Option<Arc<UwsgiPass>>,
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
    let (tls, a) = scheme(arg(d, 0)).unwrap_or((false, arg(d, 0)));
    l.modules.uwsgi.pass = Some(Arc::new(UwsgiPass {
        addr: peers::pass_addr(d, cx, a, "uwsgi_temp")?,
        tls,
        host: a.to_string(),
    }));
    l.content = Some(content);
    Ok(())
}

/// `uwsgi://` or `suwsgi://` (any case) at the start of `a`: whether it
/// is TLS, and the rest.
fn scheme(a: &str) -> Option<(bool, &str)> {
    let starts = |p: &str| a.get(..p.len()).is_some_and(|s| s.eq_ignore_ascii_case(p));
    if starts("uwsgi://") {
        Some((false, &a[8..]))
    } else if starts("suwsgi://") {
        Some((true, &a[9..]))
    } else {
        None
    }
}

/// Whether a location's `uwsgi_pass` may use TLS (a `suwsgi://` address,
/// or one with variables, which may render one): its `uwsgi_ssl_*`
/// settings are then checked, as nginx does.
pub fn may_use_tls(l: &LocConf) -> bool {
    l.modules
        .uwsgi
        .pass
        .as_ref()
        .is_some_and(|p| p.tls || matches!(p.addr.to, PassTo::Var(_)))
}

/// nginx's `no port in upstream "NAME"` (see [`peers::check_pass`]).
pub fn check_pass(own: &LocConf, hm: &HttpMain, block: &[Directive]) -> ConfResult<()> {
    let pass = own.modules.uwsgi.pass.as_deref().map(|p| &p.addr);
    peers::check_pass(pass, hm, block, "uwsgi_pass")
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
    let Some(pass) = loc.modules.uwsgi.pass.clone() else {
        return Response::status(500);
    };
    let conf = &loc.modules.uwsgi;
    let temp = &pass.addr.body_temp_default;
    let mut stream = match run::begin_body(cx, &conf.up, temp, |_| false).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    // With variables, the value may carry its own scheme, as nginx's
    // (`uwsgi_pass suwsgi://$arg_b`).
    let (up, tls, host) = match &pass.addr.to {
        PassTo::Var(t) => {
            let v = t.render_vec(&*cx);
            let v = String::from_utf8_lossy(&v).into_owned();
            let (tls, rest) = scheme(&v).unwrap_or((pass.tls, &v[..]));
            let up = peers::upstream_by_value(cx, rest).await;
            (up, tls, rest.to_string())
        }
        to => (
            peers::upstream_of(cx, to).await,
            pass.tls,
            pass.host.clone(),
        ),
    };
    let Some(up) = up else {
        if let Some(s) = stream {
            s.finish(cx);
        }
        return Response::status(502);
    };
    let mut lim = Limits::of(&conf.up);
    if tls {
        let ssl = &conf.up.ssl;
        if let Err(r) = ssl::attach(cx, ssl, &host, &[], &mut lim, &mut stream).await {
            return *r;
        }
    }
    let proto = Arc::new(Uwsgi {
        loc: loc.clone(),
        pass,
        tls,
    });
    run::run_with(cx, proto, up, lim, stream).await
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
    pass: Arc<UwsgiPass>,
    /// This request's connection is TLS (`suwsgi://`).
    tls: bool,
}

impl Protocol for Uwsgi {
    fn conf(&self) -> &UpstreamConf {
        &self.loc.modules.uwsgi.up
    }

    fn url(&self, peer: &str) -> String {
        let scheme = if self.tls { "suwsgi" } else { "uwsgi" };
        format!("{}://{}", scheme, peer)
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
        &self.pass.addr.temp_default
    }
}
