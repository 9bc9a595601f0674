//! `proxy_pass` and the `proxy_*` directives: the reverse proxy and its
//! HTTP cache front end (the cache itself is [`crate::cache`]).
//!
//! The HTTP protocol on the upstream engine ([`crate::http::upstream`]):
//! this module encodes the request (`proxy_set_header` and the defaults,
//! the URI, `proxy_method`, `proxy_set_body`), reads the response head
//! (`head.rs`) and decodes the body (chunked, a length, or the close:
//! [`head::HttpBody`]), and rewrites `Location` and `Set-Cookie`
//! (`proxy_redirect`, `cookie.rs`); peers, retries, buffering, the cache
//! and the response are the engine's. The shared `proxy_*` rows of the
//! table are the engine's ([`crate::upstream_directives!`]).
//!
//! # A proxied request
//!
//! ```text
//! content phase
//!   ├─ the request body, read whole (crate::http::body): memory, or a temp
//!   │   file beyond client_body_buffer_size (proxy_request_buffering on);
//!   │   off: left on the connection and sent as it arrives (chunked
//!   │   without a length, HTTP/1.1 only), see upstream::run::begin_body
//!   ├─ proxy_cache? ── (the engine's cache.rs) ── HIT ──▶ cache file as Body::File
//!   │                                           └─ MISS / EXPIRED / BYPASS
//!   ├─ pick a peer (round robin) ── connect (+ TLS for https://, see
//!   │   crate::tls::client) ── send head + body ── read head ──────────────┐
//!   │        ▲ error/timeout before a response head: next peer                 │
//!   │        │ (not for POST/LOCK/PATCH once sent, as nginx)                   │
//!   │        └─────────────────────────────────────────────────────────────────┘
//!   ├─ the body part that came with the head, decoded: complete and not
//!   │   being cached ──▶ Body::Bytes (the upstream connection kept alive)
//!   ├─ else Body::Stream: the head goes to the client now, and the
//!   │   engine's Producer reads the rest as it arrives (its pipe.rs)
//!   └─ 101 to a request with an `Upgrade` header: Response::upgrade takes
//!       the upstream connection and what came after the head, and the
//!       connection tunnels (crate::http::tunnel); a 101 to any other
//!       request is an ordinary answer whose body runs to the close, unframed
//! ```
//!
//! # Headers sent upstream (as nginx 1.22)
//!
//! Request line with the (replaced) URI and `HTTP/1.0` (or
//! `proxy_http_version`), then `proxy_set_header` entries in order, then
//! the defaults not overridden (`Host: $proxy_host`, `Connection: close`,
//! `Content-Length` of the body when there is one: the client's chunked
//! body goes with its decoded length, `proxy_set_body` with its own, and
//! `proxy_pass_request_body off` still announces the client's, as nginx),
//! then the client's headers except those named by any of the above and
//! the hop-by-hop ones nginx clears (`TE`, `Keep-Alive`, `Expect`,
//! `Upgrade`, plus the conditional and `Range` headers when caching). An
//! entry whose value renders empty is not sent.
//!
//! # Headers relayed back
//!
//! All but the framing and hop-by-hop ones (`Content-Length`,
//! `Transfer-Encoding`, `Connection`, `Keep-Alive`, ...) and nginx's hidden
//! set (`Date`, `Server`, `X-Pad`, `X-Accel-Expires`, `X-Accel-Redirect`,
//! `X-Accel-Limit-Rate`, `X-Accel-Buffering`, `X-Accel-Charset`); tern
//! writes its own `Date` and `Server`. `X-Accel-Charset` goes to the
//! charset filter instead (`Response::override_charset`) unless
//! `proxy_ignore_headers` names it. `Set-Cookie` goes through
//! `proxy_cookie_domain`/`_path`/`_flags` (a header they change is
//! rebuilt as nginx rebuilds it: `name=value; attr=value; attr`).

mod cookie;
pub mod head;
pub mod redirect;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::config::registry::{arg, ctx, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::body::{self, TempDir};
use crate::http::conf::{merge_opts, LocConf};
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::Response;
use crate::http::upstream::conf::{Limits, Slot, UpstreamConf};
use crate::http::upstream::peers::{self, Target, Upstream};
use crate::http::upstream::run;
use crate::http::upstream::{Caching, HeadReader, OutBody, Protocol, Request};
use crate::http::vars::Template;

const LOC: u32 = ctx::LOC | ctx::LIF | ctx::LMT;
const HSL: u32 = ctx::HSL;

/// proxy's [`UpstreamConf`] in a location.
pub struct Up;

impl Slot for Up {
    fn conf(l: &mut LocConf) -> &mut UpstreamConf {
        &mut l.modules.proxy.up
    }

    fn get(l: &LocConf) -> &UpstreamConf {
        &l.modules.proxy.up
    }
}

pub const DIRECTIVES: &[Spec] = crate::upstream_directives!(
    Up,
    "proxy",
    tls,
    [
        row("proxy_pass", LOC, Args::take(1), set_pass),
        row("proxy_set_header", HSL, Args::take(2), set_header),
        row("proxy_http_version", HSL, Args::take(1), set_http_version),
        row(
            "proxy_cache_convert_head",
            HSL,
            Args::Flag,
            crate::http::upstream::conf::set_flag::<Up>
        ),
        row(
            "proxy_cookie_domain",
            HSL,
            Args::take12(),
            set_cookie_rewrite
        ),
        row("proxy_cookie_path", HSL, Args::take12(), set_cookie_rewrite),
        row(
            "proxy_cookie_flags",
            HSL,
            Args::take1234(),
            set_cookie_flags
        ),
        row("proxy_method", HSL, Args::take(1), set_method),
        row("proxy_redirect", HSL, Args::take12(), redirect::set),
        row("proxy_set_body", HSL, Args::take(1), set_body),
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

/// Module variables (see `modules::VAR_MODULES`).
pub const VARS: &[&str] = &["proxy_host", "proxy_port", "proxy_add_x_forwarded_for"];

pub fn var(cx: &Ctx<'_>, i: u8, out: &mut Vec<u8>) -> bool {
    if i == 2 {
        if let Some(x) = cx.req.header("x-forwarded-for") {
            out.extend_from_slice(x);
            out.extend_from_slice(b", ");
        }
        match cx.remote {
            Some(a) => out.extend_from_slice(a.ip().to_string().as_bytes()),
            None => out.extend_from_slice(b"unix:"),
        }
        return true;
    }
    let Some(name) = VARS.get(usize::from(i)) else {
        return false;
    };
    cx.note_var(name, out)
}

// ---- configuration ----------------------------------------------------------

/// A compiled `proxy_pass http://HOST[:PORT][/URI]` (or, with
/// variables, the one a request evaluated it to).
#[derive(Debug)]
pub struct Pass {
    /// `http://HOST[:PORT]` as written (for messages).
    pub url: String,
    /// `https://`: TLS to the upstream (`tls::client`).
    pub tls: bool,
    /// `$proxy_host`: the Host header sent by default.
    pub host: Vec<u8>,
    /// `$proxy_port` (empty for a unix socket).
    pub port: String,
    /// The URI part, if any: it replaces the matched location prefix
    /// (with variables: the whole URI, as it is).
    pub uri: Option<Vec<u8>>,
    /// None only in a location's `proxy_pass` with variables.
    pub target: Option<Target>,
    /// The URL with variables, evaluated per request.
    pub vars: Option<Template>,
    /// `<prefix>/proxy_temp`, used without `proxy_temp_path`.
    pub temp_default: PathBuf,
    /// `<prefix>/client_body_temp`, used without `client_body_temp_path`.
    pub body_temp_default: Arc<TempDir>,
}

/// Location-level settings: the engine's, and HTTP's own.
#[derive(Debug, Clone, Default)]
pub struct ProxyLoc {
    pub pass: Option<Arc<Pass>>,
    /// The shared upstream settings (the engine's `proxy_*` rows).
    pub up: UpstreamConf,
    pub headers: Option<Arc<Vec<(String, Template)>>>,
    /// Minor version of HTTP/1.x to upstream.
    pub http_version: Option<u8>,
    /// `proxy_redirect` rules in order (empty: `off`; None: the
    /// implicit `default`).
    pub redirect: Option<Arc<Vec<redirect::Redirect>>>,
    pub set_body: Option<Template>,
    /// `proxy_cookie_domain` / `_path` rules in order (empty: `off`).
    pub cookie_domain: Option<Arc<Vec<CookieRewrite>>>,
    pub cookie_path: Option<Arc<Vec<CookieRewrite>>>,
    /// `proxy_cookie_flags` entries in order (empty: `off`).
    pub cookie_flags: Option<Arc<Vec<CookieFlags>>>,
    /// `proxy_method`.
    pub method: Option<Template>,
}

/// entry matches: text (with variables), or a regex (`~`, `~*`).
#[derive(Debug, Clone)]
pub enum CookieMatch {
    Text(Template),
    Regex(crate::core::regex::Regex),
}

#[derive(Debug, Clone)]
pub struct CookieRewrite {
    pub pattern: CookieMatch,
    pub replacement: Template,
}

#[derive(Debug, Clone)]
pub struct CookieFlags {
    pub cookie: CookieMatch,
    pub flags: Vec<Template>,
}

impl ProxyLoc {
    pub fn merge(&mut self, p: &ProxyLoc) {
        // `pass` is inherited too, so that an `if` block inside a proxied
        // location still proxies (nginx keeps the location's handler there).
        merge_opts!(self, p; pass, headers, http_version, redirect, set_body,
            cookie_domain, cookie_path, cookie_flags, method);
        self.up.merge(&p.up);
    }
}

/// nginx's refusal of a `proxy_pass` with a URI part where there is no
/// location prefix for it to replace: a regex or named location, an `if`
/// block, a `limit_except` block. `own` is the block's own configuration
/// (before merging), `block` its directives (for the line).
pub fn check_no_uri_part(own: &LocConf, block: &[Directive]) -> ConfResult<()> {
    if own
        .modules
        .proxy
        .pass
        .as_ref()
        .is_none_or(|p| p.uri.is_none())
    {
        return Ok(());
    }
    let d = block.iter().find(|k| k.name == "proxy_pass");
    let msg = "\"proxy_pass\" cannot have URI part in location given by regular expression, \
               or inside named location, or inside \"if\" statement, or inside \
               \"limit_except\" block";
    Err(match d {
        Some(d) => ConfError::at(msg, d),
        None => ConfError::new(msg.to_string()),
    })
}

fn set_pass(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.proxy.pass.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let url = arg(d, 0);
    let temp_default = cx.path("proxy_temp");
    // Temp files of unbuffered-in-memory responses go under the prefix
    // unless proxy_temp_path says otherwise; the keeper may create it.
    crate::cache::allow_dir(&temp_default);
    let body_temp_default = Arc::new(TempDir::plain(cx.path("client_body_temp")));
    l.content = Some(content);
    if url.contains('$') {
        // Evaluated per request (`eval_pass`). As nginx, the location is
        // ready for https:// (its proxy_ssl_* settings are checked).
        let vars = cx.template(url, d)?;
        l.modules.proxy.pass = Some(Arc::new(Pass {
            url: String::new(),
            tls: true,
            host: Vec::new(),
            port: String::new(),
            uri: None,
            target: None,
            temp_default,
            body_temp_default,
            vars: Some(vars),
        }));
        return Ok(());
    }
    let u = parse_url(url).map_err(|m| ConfError::at(m, d))?;
    let target = if u.unix {
        Target::Fixed(Arc::new(Upstream::implicit_unix(u.host.into())))
    } else {
        let port = u.port.unwrap_or(u.default_port());
        let bare = u.host.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<std::net::IpAddr>().is_ok() || u.port.is_some() {
            // An address, or a name with a port (never an upstream
            // block): resolved now, as nginx does.
            let addrs = peers::resolve(&format!("{}:{}", u.host, port), d, "upstream")?;
            Target::Fixed(Arc::new(Upstream::implicit(&u.host_header(), addrs)))
        } else {
            Target::Named {
                name: u.host.to_string(),
                port,
                resolved: OnceLock::new(),
            }
        }
    };
    l.modules.proxy.pass = Some(Arc::new(u.into_pass(
        Some(target),
        temp_default,
        body_temp_default,
    )));
    Ok(())
}

/// Makes a location's `proxy_pass http://NAME:PORT` (a name, not an
/// address) known by its host and port, for `proxy_pass` with variables
/// (see `peers::upstream_resolved`).
pub fn register_implicit(own: &LocConf, hm: &mut crate::http::conf::HttpMain) {
    let Some(p) = own.modules.proxy.pass.as_deref() else {
        return;
    };
    let Some(Target::Fixed(u)) = &p.target else {
        return;
    };
    let Ok(url) = parse_url(&p.url) else { return };
    let Some(port) = url.port.filter(|_| !url.unix) else {
        return;
    };
    let host = url.host.to_ascii_lowercase();
    if host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .is_ok()
    {
        return;
    }
    hm.modules
        .upstream
        .implicit
        .entry((host, port))
        .or_insert_with(|| u.clone());
}

/// A `proxy_pass` URL taken apart as nginx's `ngx_parse_url` does.
#[derive(Debug, PartialEq)]
struct Url<'a> {
    tls: bool,
    /// `HOST[:PORT]` or `unix:PATH`, as written.
    hostport: &'a str,
    /// The host, or the socket's path.
    host: &'a str,
    port: Option<u16>,
    unix: bool,
    /// The URI part (one starting with `?` gets a `/` first).
    uri: Option<Vec<u8>>,
}

impl Url<'_> {
    fn default_port(&self) -> u16 {
        if self.tls {
            443
        } else {
            80
        }
    }

    /// `$proxy_host`: the host, with the port unless it is the default;
    /// `localhost` for a unix socket.
    fn host_header(&self) -> String {
        if self.unix {
            return "localhost".to_string();
        }
        match self.port {
            Some(p) if p != self.default_port() => format!("{}:{}", self.host, p),
            _ => self.host.to_string(),
        }
    }

    fn into_pass(
        self,
        target: Option<Target>,
        temp_default: PathBuf,
        body_temp_default: Arc<TempDir>,
    ) -> Pass {
        Pass {
            url: format!(
                "{}://{}",
                if self.tls { "https" } else { "http" },
                self.hostport
            ),
            tls: self.tls,
            host: self.host_header().into_bytes(),
            port: if self.unix {
                String::new()
            } else {
                self.port.unwrap_or(self.default_port()).to_string()
            },
            uri: self.uri,
            target,
            temp_default,
            body_temp_default,
            vars: None,
        }
    }
}

/// `http[s]://HOST[:PORT][/URI]` or `http[s]://unix:PATH[:URI]`; the
/// error in nginx's words.
fn parse_url(url: &str) -> Result<Url<'_>, String> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    let (tls, rest) = if lower.starts_with("http://") && url.len() > 7 {
        (false, &url[7..])
    } else if lower.starts_with("https://") && url.len() > 8 {
        (true, &url[8..])
    } else {
        return Err("invalid URL prefix".to_string());
    };
    let err = |m: &str| format!("{} in upstream \"{}\"", m, rest);
    if rest.len() >= 5 && rest[..5].eq_ignore_ascii_case("unix:") {
        let path_uri = &rest[5..];
        let (path, uri) = match path_uri.find(':') {
            Some(i) => (&path_uri[..i], Some(path_uri.as_bytes()[i + 1..].to_vec())),
            None => (path_uri, None),
        };
        if path.is_empty() {
            return Err(err("no path in the unix domain socket"));
        }
        return Ok(Url {
            tls,
            hostport: &rest[..5 + path.len()],
            host: path,
            port: None,
            unix: true,
            uri,
        });
    }
    let cut = rest.find(['/', '?']);
    let (hostport, uri) = match cut {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    if hostport.is_empty() {
        return Err(err("no host"));
    }
    let (host, port) = split_port(hostport).ok_or_else(|| err("invalid port"))?;
    if host.is_empty() || host == "[]" {
        return Err(err("no host"));
    }
    let uri = uri.map(|u| {
        if u.starts_with('?') {
            format!("/{}", u).into_bytes()
        } else {
            u.as_bytes().to_vec()
        }
    });
    Ok(Url {
        tls,
        hostport,
        host,
        port,
        unix: false,
        uri,
    })
}

/// The `proxy_pass` of a request: the location's, or, with variables,
/// the URL it evaluates to and the upstream that names (an `upstream`
/// block, or the host resolved by `resolver`). Err: the status to
/// answer (logged).
async fn eval_pass(cx: &Ctx<'_>, pass: &Arc<Pass>) -> Result<Arc<Pass>, u16> {
    let Some(t) = &pass.vars else {
        return Ok(pass.clone());
    };
    let v = t.render_vec(cx);
    let url = String::from_utf8_lossy(&v);
    let u = match parse_url(&url) {
        Ok(u) => u,
        Err(m) if m == "invalid URL prefix" => {
            cx.log(Level::Error, &format!("invalid URL prefix in \"{}\"", url));
            return Err(500);
        }
        Err(m) => {
            cx.log(Level::Error, &m);
            return Err(500);
        }
    };
    let up = if u.unix {
        Arc::new(Upstream::implicit_unix(u.host.into()))
    } else {
        let name = u.host_header();
        peers::upstream_resolved(cx, u.host, u.port, u.default_port(), &name)
            .await
            .ok_or(502u16)?
    };
    let mut p = u.into_pass(
        Some(Target::Fixed(up)),
        pass.temp_default.clone(),
        pass.body_temp_default.clone(),
    );
    p.vars = pass.vars.clone();
    Ok(Arc::new(p))
}

/// `host`, `host:port`, `[v6]:port`; None for a bad port.
fn split_port(hp: &str) -> Option<(&str, Option<u16>)> {
    if hp.starts_with('[') {
        return match hp.rsplit_once("]:") {
            Some((h, p)) => Some((&hp[..h.len() + 1], Some(p.parse().ok().filter(|p| *p > 0)?))),
            None => Some((hp, None)),
        };
    }
    match hp.rsplit_once(':') {
        Some((h, p)) => Some((h, Some(p.parse().ok().filter(|p| *p > 0)?))),
        None => Some((hp, None)),
    }
}

fn set_header(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let v = cx.template(arg(d, 1), d)?;
    let list = l.modules.proxy.headers.get_or_insert_with(Default::default);
    Arc::make_mut(list).push((arg(d, 0).to_string(), v));
    Ok(())
}

fn set_body(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let v = cx.template(arg(d, 0), d)?;
    set_once(&mut l.modules.proxy.set_body, v, d)
}

fn set_http_version(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = match arg(d, 0) {
        "1.0" => 0,
        "1.1" => 1,
        v => return Err(crate::config::registry::enum_invalid(d, v)),
    };
    set_once(&mut l.modules.proxy.http_version, v, d)
}

/// A cookie pattern: `~re`, `~*re`, or text (with variables; for
/// domains a leading dot is dropped, as nginx matches without it).
fn cookie_match(
    d: &Directive,
    cx: &mut Compiler,
    a: &str,
    domain: bool,
    caseless_re: bool,
) -> ConfResult<CookieMatch> {
    if let Some(r) = a.strip_prefix('~') {
        let (r, caseless) = match r.strip_prefix('*') {
            Some(r) => (r, true),
            // Domains and cookie names are compared without case, by a
            // regex too (nginx).
            None => (r, caseless_re),
        };
        let re = crate::core::regex::Regex::compile(d, r, caseless)?;
        return Ok(CookieMatch::Regex(re));
    }
    let a = if domain {
        a.strip_prefix('.').unwrap_or(a)
    } else {
        a
    };
    Ok(CookieMatch::Text(cx.template(a, d)?))
}

/// `proxy_cookie_domain off | DOMAIN REPLACEMENT`, `proxy_cookie_path
/// off | PATH REPLACEMENT` (several rules add up; `off` only alone).
fn set_cookie_rewrite(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let domain = d.name == "proxy_cookie_domain";
    let p = &mut l.modules.proxy;
    let slot = if domain {
        &mut p.cookie_domain
    } else {
        &mut p.cookie_path
    };
    if slot.as_ref().is_some_and(|v| v.is_empty()) {
        return Err(crate::config::registry::duplicate(d));
    }
    if d.args.len() == 1 {
        if arg(d, 0) != "off" {
            return Err(ConfError::at(
                format!("invalid parameter \"{}\"", arg(d, 0)),
                d,
            ));
        }
        if slot.is_some() {
            return Err(crate::config::registry::duplicate(d));
        }
        *slot = Some(Arc::new(Vec::new()));
        return Ok(());
    }
    let pattern = cookie_match(d, cx, arg(d, 0), domain, domain)?;
    // A domain's replacement goes without its leading dot too (the
    // value's own dot, if it has one, is kept when rewritten).
    let r = arg(d, 1);
    let r = if domain {
        r.strip_prefix('.').unwrap_or(r)
    } else {
        r
    };
    let replacement = cx.template(r, d)?;
    let p = &mut l.modules.proxy;
    let slot = if domain {
        &mut p.cookie_domain
    } else {
        &mut p.cookie_path
    };
    Arc::make_mut(slot.get_or_insert_with(Default::default)).push(CookieRewrite {
        pattern,
        replacement,
    });
    Ok(())
}

/// `proxy_cookie_flags off | COOKIE [FLAG...]`: flags are text with
/// variables, read when applied (unknown ones are ignored, as nginx).
fn set_cookie_flags(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let cur = &l.modules.proxy.cookie_flags;
    if cur.as_ref().is_some_and(|v| v.is_empty()) {
        return Err(crate::config::registry::duplicate(d));
    }
    if d.args.len() == 1 && arg(d, 0) == "off" {
        if cur.is_some() {
            return Err(crate::config::registry::duplicate(d));
        }
        l.modules.proxy.cookie_flags = Some(Arc::new(Vec::new()));
        return Ok(());
    }
    let cookie = cookie_match(d, cx, arg(d, 0), false, true)?;
    let mut flags = Vec::new();
    for a in &d.args[1..] {
        flags.push(cx.template(&a.value, d)?);
    }
    let slot = &mut l.modules.proxy.cookie_flags;
    Arc::make_mut(slot.get_or_insert_with(Default::default)).push(CookieFlags { cookie, flags });
    Ok(())
}

fn set_method(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let t = cx.template(arg(d, 0), d)?;
    set_once(&mut l.modules.proxy.method, t, d)
}

// ---- the protocol -----------------------------------------------------------

/// Headers nginx hides from the client by default.
const HIDDEN: &[&str] = &[
    "date",
    "server",
    "x-pad",
    "x-accel-expires",
    "x-accel-redirect",
    "x-accel-limit-rate",
    "x-accel-buffering",
    "x-accel-charset",
];

/// The URI sent upstream: the client's as sent when unchanged, else the
/// current URI (escaped) with the location prefix replaced by the
/// proxy_pass URI, plus the args.
fn upstream_uri(cx: &Ctx<'_>, pass: &Pass) -> Vec<u8> {
    let unchanged = *cx.uri == *cx.req.uri()
        && cx.args.as_deref() == cx.req.args()
        && cx.req.raw_uri().starts_with(b"/");
    let mut out = Vec::new();
    match &pass.uri {
        // With variables, the URI part is the whole URI (as nginx).
        Some(u) if pass.vars.is_some() => return u.clone(),
        None if unchanged => return cx.req.raw_uri().to_vec(),
        None => crate::http::uri::escape_uri(&cx.uri, &mut out),
        // After `rewrite ... break` the URI part is ignored: the rewritten
        // URI goes whole (nginx copies its URI part only while
        // valid_location holds).
        Some(_) if cx.location_stale => crate::http::uri::escape_uri(&cx.uri, &mut out),
        Some(u) => {
            out.extend_from_slice(u);
            let rest = cx.uri.get(cx.loc_prefix_len..).unwrap_or(b"");
            crate::http::uri::escape_uri(rest, &mut out);
        }
    }
    if let Some(a) = &cx.args {
        out.push(b'?');
        out.extend_from_slice(a);
    }
    out
}

/// Names nginx always sets (or clears) itself, in its default order.
const DEFAULT_SET: &[&str] = &["host", "connection", "content-length", "transfer-encoding"];
const CLEARED: &[&str] = &["te", "keep-alive", "expect", "upgrade"];
const CLEARED_WHEN_CACHING: &[&str] = &[
    "if-modified-since",
    "if-unmodified-since",
    "if-none-match",
    "if-match",
    "range",
    "if-range",
];

/// The body to send and the length for `Content-Length` (as nginx:
/// `proxy_set_body`'s length, else the client's body length even when
/// `proxy_pass_request_body off` sends none).
fn outgoing_body(cx: &Ctx<'_>, conf: &ProxyLoc) -> (OutBody, Option<u64>) {
    if let Some(t) = &conf.set_body {
        let b = t.render_vec(cx);
        let n = b.len() as u64;
        return (OutBody::Mem(Bytes::from(b)), Some(n));
    }
    let len = body::length(cx);
    if !conf.up.pass_request_body.unwrap_or(true) {
        return (OutBody::None, len);
    }
    if body::streaming(cx) {
        return (OutBody::Stream, len);
    }
    let out = match body::data(cx) {
        Some(body::Data::Mem(b)) if !b.is_empty() => OutBody::Mem(b.clone()),
        Some(body::Data::File { file, len, .. }) if *len > 0 => OutBody::File(file.clone(), *len),
        _ => OutBody::None,
    };
    (out, len)
}

/// The request head for upstream. `caching`: the request may be answered
/// from or stored in the cache: whether HEAD becomes GET
/// (`proxy_cache_convert_head`), and the validators to revalidate an
/// expired entry with.
fn request_head(
    cx: &Ctx<'_>,
    conf: &ProxyLoc,
    uri: &[u8],
    caching: Option<Caching<'_>>,
    body_len: Option<u64>,
    chunked: bool,
) -> Vec<u8> {
    let convert_head = caching.is_some_and(|c| c.convert_head);
    let set_method = conf.method.as_ref().map(|t| t.render_vec(cx));
    let method: &[u8] = if convert_head && cx.method == Method::Head {
        b"GET"
    } else if let Some(m) = &set_method {
        m
    } else if cx.method != cx.req.method {
        // An error_page redirect turned the request into a GET.
        b"GET"
    } else {
        cx.req.method_raw().as_bytes()
    };
    let mut h = Vec::with_capacity(512);
    h.extend_from_slice(method);
    h.push(b' ');
    h.extend_from_slice(uri);
    h.extend_from_slice(if conf.http_version == Some(1) {
        b" HTTP/1.1\r\n"
    } else {
        b" HTTP/1.0\r\n"
    });
    let user: &[(String, Template)] = conf.headers.as_deref().map_or(&[], |v| v.as_slice());
    let mut set_names: Vec<String> = user.iter().map(|(n, _)| n.to_ascii_lowercase()).collect();
    for (n, t) in user {
        let v = t.render_vec(cx);
        if !v.is_empty() {
            push_header(&mut h, n.as_bytes(), &v);
        }
    }
    for d in DEFAULT_SET {
        if set_names.iter().any(|n| n == d) {
            continue;
        }
        match *d {
            "host" => push_header(&mut h, b"Host", cx.note("proxy_host").unwrap_or(b"")),
            "connection" => push_header(&mut h, b"Connection", b"close"),
            // A buffered body's length is known even when the client
            // sent it chunked; a streamed one of unknown length goes
            // chunked (HTTP/1.1 only, see `handle`).
            "content-length" => {
                if let Some(n) = body_len.filter(|_| !chunked) {
                    push_header(&mut h, b"Content-Length", n.to_string().as_bytes());
                }
            }
            "transfer-encoding" if chunked => {
                push_header(&mut h, b"Transfer-Encoding", b"chunked");
            }
            _ => {}
        }
        set_names.push(d.to_string());
    }
    // nginx's defaults when caching: If-Modified-Since
    // $upstream_cache_last_modified, If-None-Match $upstream_cache_etag
    // (set only while revalidating), the other conditionals cleared.
    if let Some((lm, etag)) = caching.and_then(|c| c.revalidate) {
        for (name, lower, v) in [
            ("If-Modified-Since", "if-modified-since", lm),
            ("If-None-Match", "if-none-match", etag),
        ] {
            if let Some(v) = v.as_ref().filter(|_| !set_names.iter().any(|n| n == lower)) {
                push_header(&mut h, name.as_bytes(), v);
            }
        }
    }
    set_names.extend(CLEARED.iter().map(|s| s.to_string()));
    if caching.is_some() {
        set_names.extend(CLEARED_WHEN_CACHING.iter().map(|s| s.to_string()));
    }
    if conf.up.pass_request_headers.unwrap_or(true) {
        for hd in cx.req.headers() {
            if set_names.iter().any(|n| hd.is(n)) {
                continue;
            }
            push_header(&mut h, hd.name, hd.value);
        }
    }
    h.extend_from_slice(b"\r\n");
    h
}

fn push_header(h: &mut Vec<u8>, n: &[u8], v: &[u8]) {
    h.extend_from_slice(n);
    h.extend_from_slice(b": ");
    h.extend_from_slice(v);
    h.extend_from_slice(b"\r\n");
}

// ---- the content handler ----------------------------------------------------

/// The content handler `proxy_pass` puts in its location's slot.
/// Boxed: the proxy's state is KiBs, and inline it would make every
/// request's future (static files too) that big.
pub fn content<'a>(
    cx: &'a mut Ctx<'_>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + 'a>> {
    Box::pin(handle(cx))
}

async fn handle(cx: &mut Ctx<'_>) -> Response {
    let loc = cx.loc.clone();
    let Some(pass) = loc.modules.proxy.pass.as_ref() else {
        // The handler an earlier `if` chose, run with a block that has
        // no proxy_pass (see rewrite's `if`).
        cx.log(Level::Alert, "no upstream configuration");
        return Response::status(500);
    };
    let pass = match eval_pass(cx, pass).await {
        Ok(p) => p,
        Err(status) => return Response::status(status),
    };
    let conf = &loc.modules.proxy;
    cx.set_note("proxy_host", pass.host.clone());
    cx.set_note("proxy_port", pass.port.clone().into_bytes());
    // As nginx: with proxy_request_buffering on the whole body first
    // (memory or a temp file), then the upstream; off, the body goes as
    // it arrives, unless proxy_set_body replaces it or it has no length
    // and HTTP/1.0 could not carry it chunked.
    let conf_up = if conf.set_body.is_some() {
        None
    } else {
        Some(&conf.up)
    };
    let http11 = conf.http_version == Some(1);
    let stream = match conf_up {
        Some(up) => run::begin_body(cx, up, &pass.body_temp_default, |_| http11).await,
        None => body::read(cx, &pass.body_temp_default).await.map(|()| None),
    };
    let mut stream = match stream {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let chunked = stream.as_ref().is_some_and(|s| s.length().is_none());
    let up = match &pass.target {
        Some(t) => peers::upstream_for(cx, t, &pass.host).await,
        None => None,
    };
    let Some(up) = up else {
        if let Some(s) = stream {
            s.finish(cx);
        }
        return Response::status(502);
    };
    let mut lim = Limits::of(&conf.up);
    if pass.tls {
        let host = String::from_utf8_lossy(&pass.host).into_owned();
        let ssl = &conf.up.ssl;
        if let Err(r) =
            crate::http::upstream::ssl::attach(cx, ssl, &host, &[], &mut lim, &mut stream).await
        {
            return *r;
        }
    }
    let uri = upstream_uri(cx, &pass);
    let redirects = redirect::ready(
        cx,
        conf.redirect.as_deref().map(Vec::as_slice),
        &pass,
        crate::http::upstream::response::loc_prefix(cx),
    );
    let proto = Arc::new(Http {
        loc: loc.clone(),
        pass,
        uri,
        chunked,
        redirects,
    });
    run::run_with(cx, proto, up, lim, stream).await
}

/// HTTP to one request's upstream.
struct Http {
    loc: Arc<LocConf>,
    pass: Arc<Pass>,
    /// The URI sent upstream.
    uri: Vec<u8>,
    /// The body is streamed without a length: chunked upstream.
    chunked: bool,
    /// `proxy_redirect`, ready for this request (None: off).
    redirects: Option<redirect::Rules>,
}

impl Protocol for Http {
    fn conf(&self) -> &UpstreamConf {
        &self.loc.modules.proxy.up
    }

    /// nginx names the peer with the scheme and the URI.
    fn url(&self, peer: &str) -> String {
        let scheme = if self.pass.tls { "https" } else { "http" };
        // A unix socket's path and the URI are told apart by a colon.
        let sep = if peer.starts_with("unix:") { ":" } else { "" };
        format!(
            "{}://{}{}{}",
            scheme,
            peer,
            sep,
            String::from_utf8_lossy(&self.uri)
        )
    }

    fn create_request(
        &self,
        cx: &Ctx<'_>,
        caching: Option<Caching<'_>>,
    ) -> Result<Request, Box<Response>> {
        let conf = &self.loc.modules.proxy;
        let (body, body_len) = outgoing_body(cx, conf);
        let head = request_head(cx, conf, &self.uri, caching, body_len, self.chunked);
        Ok(Request { head, body })
    }

    /// A streamed body of unknown length: one chunk per piece received.
    fn frame_body(&self, data: &[u8], out: &mut Vec<u8>) -> bool {
        if !self.chunked {
            return false;
        }
        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
        true
    }

    fn end_body(&self, out: &mut Vec<u8>) {
        if self.chunked {
            out.extend_from_slice(b"0\r\n\r\n");
        }
    }

    fn head_reader(&self, head_only: bool, head_max: usize) -> Box<dyn HeadReader> {
        Box::new(head::HttpHead::new(head_only, head_max))
    }

    fn hidden(&self) -> &'static [&'static str] {
        HIDDEN
    }

    /// nginx's proxy adds empty `Server` and `Date` to an answer that
    /// lacks them, so a passed one that never came leaves the client
    /// with neither upstream's nor nginx's.
    fn passed_replace_own(&self) -> bool {
        true
    }

    fn rewrite_location(&self, _prefix: &[u8], v: &[u8]) -> Option<Vec<u8>> {
        self.redirects.as_ref()?.location(v)
    }

    fn rewrite_refresh(&self, v: &[u8]) -> Option<Vec<u8>> {
        self.redirects.as_ref()?.refresh(v)
    }

    fn rewrite_cookies(&self, cx: &mut Ctx<'_>, headers: &mut [(String, Vec<u8>)]) {
        cookie::rewrite_cookies(cx, &self.loc.modules.proxy, headers);
    }

    fn upgrades(&self) -> bool {
        true
    }

    /// nginx's built-in key: the proxy_pass URL's scheme and host, then
    /// the URI as sent upstream.
    fn cache_key(&self, _: &Ctx<'_>) -> Vec<u8> {
        let mut k = self.pass.url.as_bytes().to_vec();
        k.extend_from_slice(&self.uri);
        k
    }

    fn convert_head(&self) -> bool {
        true
    }

    fn temp_default(&self) -> &Path {
        &self.pass.temp_default
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_split() {
        assert_eq!(split_port("a:81"), Some(("a", Some(81))));
        assert_eq!(split_port("a"), Some(("a", None)));
        assert_eq!(split_port("[::1]:81"), Some(("[::1]", Some(81))));
        assert_eq!(split_port("a:x"), None);
    }

    #[test]
    fn urls() {
        let u = parse_url("http://unix:/tmp/s.sock:/x").unwrap();
        assert!(u.unix);
        assert_eq!(u.host, "/tmp/s.sock");
        assert_eq!(u.hostport, "unix:/tmp/s.sock");
        assert_eq!(u.uri.as_deref(), Some(&b"/x"[..]));
        assert_eq!(u.host_header(), "localhost");
        let u = parse_url("https://a.example:8443?x").unwrap();
        assert_eq!((u.host, u.port), ("a.example", Some(8443)));
        assert_eq!(u.uri.as_deref(), Some(&b"/?x"[..]));
        assert_eq!(u.host_header(), "a.example:8443");
        assert_eq!(parse_url("http://a:80").unwrap().host_header(), "a");
        assert_eq!(parse_url("ftp://a").unwrap_err(), "invalid URL prefix");
        assert_eq!(
            parse_url("http://127.0.0.1:xx/a").unwrap_err(),
            "invalid port in upstream \"127.0.0.1:xx/a\""
        );
        assert_eq!(
            parse_url("http://unix:").unwrap_err(),
            "no path in the unix domain socket in upstream \"unix:\""
        );
    }
}
