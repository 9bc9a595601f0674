//! `proxy_pass` and the `proxy_*` directives: the reverse proxy and its
//! HTTP cache front end (the cache itself is [`crate::cache`]).
//!
//! The upstream side here is shared with [`super::fastcgi`], as nginx
//! shares ngx_http_upstream: the setters of the upstream settings fill
//! proxy's or fastcgi's [`ProxyLoc`] by the directive's prefix
//! ([`up_conf`]), and [`fetch`] (peers, next_upstream, keepalive),
//! [`Producer`]/[`Consumer`] (buffering, temp files, client abort) and the
//! header relaying serve both; [`Limits::fcgi`] switches the wire format
//! (request records out, [`Framing`] decoding records in).
//!
//! # A proxied request
//!
//! ```text
//! content phase
//!   ├─ the request body, read whole (crate::http::body): memory, or a temp
//!   │   file beyond client_body_buffer_size (proxy_request_buffering on)
//!   ├─ proxy_cache? ── key -> md5 -> zone lookup ── HIT ──▶ cache file as Body::File
//!   │                                           └─ MISS / EXPIRED / BYPASS
//!   ├─ pick a peer (round robin) ── connect (+ TLS for https://, see
//!   │   crate::tls::client) ── send head + body ── read head ──────────────┐
//!   │        ▲ error/timeout before a response head: next peer                 │
//!   │        │ (not for POST/LOCK/PATCH once sent, as nginx)                   │
//!   │        └─────────────────────────────────────────────────────────────────┘
//!   ├─ the body part that came with the head, decoded: complete and not
//!   │   being cached ──▶ Body::Bytes (the upstream connection kept alive)
//!   ├─ else Body::Stream: the head goes to the client now, and a Producer
//!   │   task reads the rest as it arrives, independent of the client
//!   └─ 101 to a request with an `Upgrade` header: Response::upgrade takes
//!       the upstream connection and what came after the head, and the
//!       connection tunnels (crate::http::tunnel); a 101 to any other
//!       request is an ordinary answer whose body runs to the close, unframed
//! ```
//!
//! # A cache lookup (`$upstream_cache_status`)
//!
//! ```text
//!  valid entry ───────────────────────────────────────────────▶ HIT
//!  expired entry: take the key's `updating` mark (cache::UpdateGuard)
//!    ├─ someone else holds it, use_stale updating ────────────▶ UPDATING (stale served)
//!    ├─ taken, use_stale updating + background_update ────────▶ STALE (stale served;
//!    │                                       a task refetches and stores, then drops the mark)
//!    └─ else EXPIRED: fetch (If-Modified-Since/If-None-Match with revalidate)
//!         ├─ 304 to a revalidation: validity rewritten in place ▶ REVALIDATED
//!         ├─ error/timeout/invalid_header/http_5xx... listed in
//!         │  proxy_cache_use_stale ───────────────────────────▶ STALE
//!         └─ else the new response (stored; the mark is dropped once it is)
//!  no entry: MISS; with min_uses > 1 stored only from the Nth request;
//!    with proxy_cache_lock one request holds the mark (for at most
//!    lock_age), the others wait for it (up to lock_timeout, then go
//!    upstream uncached) and look again: HIT, or their turn to fill it
//! ```
//!
//! # Streaming the body (nginx's `proxy_buffering`)
//!
//! ```text
//!  upstream ──Producer──▶ Pipe (queue of Seg) ──Consumer──▶ conn::write_streamed ──▶ client
//!              │            Mem: up to proxy_buffers in all
//!              │            File: temp file (unlinked at creation) up to
//!              │                  proxy_max_temp_file_size written in all
//!              └─ both full: stop reading upstream until the client takes data
//! ```
//!
//! A fast upstream is read to its end and released (back to the keepalive
//! cache when reusable) whatever the client's pace. `proxy_buffering off`
//! has no file and proxy_buffer_size of memory. A response being cached is
//! written whole to its cache temp file as it arrives (the client reads it
//! back from there) and does not wait for the client; once complete it gets
//! its header and is renamed into place, and only then does the client get
//! the last piece, so a request that follows a complete response finds the
//! entry. An upstream failure after the head closes the client connection
//! (no error page, no last chunk) and removes the cache temp file; a client
//! that leaves stops the reading (unless the response is being cached, as
//! nginx) and so frees the upstream connection and the temp file.
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

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::tls::client::UpStream;

use super::upstream::{self, PeerAddr, Upstream};
use super::upstream_head::Parse;
use crate::cache::{self, file::EntryHead, md5, Zone};
use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::body::{self, TempDir};
use crate::http::conf::{merge_opts, HttpMain, LocConf};
use crate::http::phases::{Ctx, Step};
use crate::http::request::Method;
use crate::http::response::{Body, Response};
use crate::http::vars::Template;
use crate::io::{OpenFile, Policy};

const LOC: u32 = ctx::LOC | ctx::LIF | ctx::LMT;
const HSL: u32 = ctx::HSL;

pub const DIRECTIVES: &[Spec] = &[
    row("proxy_pass", LOC, Args::take(1), set_pass),
    row("proxy_set_header", HSL, Args::take(2), set_header),
    row("proxy_http_version", HSL, Args::take(1), set_http_version),
    row("proxy_connect_timeout", HSL, Args::take(1), set_timeout),
    row("proxy_read_timeout", HSL, Args::take(1), set_timeout),
    row("proxy_send_timeout", HSL, Args::take(1), set_timeout),
    row("proxy_buffering", HSL, Args::Flag, set_flag),
    row("proxy_buffers", HSL, Args::take(2), set_buffers),
    row("proxy_buffer_size", HSL, Args::take(1), set_size),
    row("proxy_busy_buffers_size", HSL, Args::take(1), set_size),
    row("proxy_max_temp_file_size", HSL, Args::take(1), set_size),
    row("proxy_temp_file_write_size", HSL, Args::take(1), set_size),
    row("proxy_temp_path", HSL, Args::take1234(), set_temp_path),
    row("proxy_cache", HSL, Args::take(1), set_cache),
    row("proxy_cache_key", HSL, Args::take(1), set_cache_key),
    row("proxy_cache_valid", HSL, Args::AtLeast(1), set_cache_valid),
    row(
        "proxy_cache_methods",
        HSL,
        Args::AtLeast(1),
        set_cache_methods,
    ),
    row(
        "proxy_cache_use_stale",
        HSL,
        Args::AtLeast(1),
        set_cache_use_stale,
    ),
    row("proxy_cache_background_update", HSL, Args::Flag, set_flag),
    row("proxy_cache_lock", HSL, Args::Flag, set_flag),
    row("proxy_cache_lock_timeout", HSL, Args::take(1), set_timeout),
    row("proxy_cache_lock_age", HSL, Args::take(1), set_timeout),
    row("proxy_cache_revalidate", HSL, Args::Flag, set_flag),
    row("proxy_cache_convert_head", HSL, Args::Flag, set_flag),
    row(
        "proxy_cache_min_uses",
        HSL,
        Args::take(1),
        set_cache_min_uses,
    ),
    row(
        "proxy_cookie_domain",
        HSL,
        Args::take12(),
        set_cookie_rewrite,
    ),
    row("proxy_cookie_path", HSL, Args::take12(), set_cookie_rewrite),
    row(
        "proxy_cookie_flags",
        HSL,
        Args::take1234(),
        set_cookie_flags,
    ),
    row("proxy_method", HSL, Args::take(1), set_method),
    row("proxy_ignore_client_abort", HSL, Args::Flag, set_flag),
    row("proxy_bind", HSL, Args::take12(), set_bind),
    row("proxy_socket_keepalive", HSL, Args::Flag, set_flag),
    row("proxy_limit_rate", HSL, Args::take(1), set_size),
    row("proxy_store", HSL, Args::take(1), set_store),
    row("proxy_store_access", HSL, Args::take123(), set_store_access),
    row("proxy_cache_bypass", HSL, Args::AtLeast(1), set_predicates),
    row("proxy_no_cache", HSL, Args::AtLeast(1), set_predicates),
    row("proxy_redirect", HSL, Args::take12(), set_redirect),
    row("proxy_intercept_errors", HSL, Args::Flag, set_flag),
    row(
        "proxy_next_upstream",
        HSL,
        Args::AtLeast(1),
        set_next_upstream,
    ),
    row(
        "proxy_next_upstream_tries",
        HSL,
        Args::take(1),
        set_next_upstream_tries,
    ),
    row(
        "proxy_next_upstream_timeout",
        HSL,
        Args::take(1),
        set_timeout,
    ),
    row("proxy_force_ranges", HSL, Args::Flag, set_flag),
    row("proxy_pass_request_headers", HSL, Args::Flag, set_flag),
    row("proxy_pass_request_body", HSL, Args::Flag, set_flag),
    row("proxy_request_buffering", HSL, Args::Flag, set_flag),
    row("proxy_set_body", HSL, Args::take(1), set_body),
    row("proxy_hide_header", HSL, Args::take(1), set_hide_pass),
    row("proxy_pass_header", HSL, Args::take(1), set_hide_pass),
    row(
        "proxy_ignore_headers",
        HSL,
        Args::AtLeast(1),
        set_ignore_headers,
    ),
    row("proxy_ssl_verify", HSL, Args::Flag, set_ssl_flag),
    row("proxy_ssl_server_name", HSL, Args::Flag, set_ssl_flag),
    row("proxy_ssl_session_reuse", HSL, Args::Flag, set_ssl_flag),
    row("proxy_ssl_name", HSL, Args::take(1), set_ssl_name),
    row(
        "proxy_ssl_protocols",
        HSL,
        Args::AtLeast(1),
        set_ssl_protocols,
    ),
    row("proxy_ssl_ciphers", HSL, Args::take(1), set_ssl_ciphers),
    row(
        "proxy_ssl_trusted_certificate",
        HSL,
        Args::take(1),
        set_ssl_trusted,
    ),
    row(
        "proxy_ssl_verify_depth",
        HSL,
        Args::take(1),
        set_ssl_verify_depth,
    ),
    unsupported("proxy_ssl_certificate"),
    unsupported("proxy_ssl_certificate_key"),
    unsupported("proxy_ssl_password_file"),
    unsupported("proxy_ssl_crl"),
    unsupported("proxy_ssl_conf_command"),
    Spec {
        name: "proxy_cache_path",
        ctx: ctx::HTTP,
        args: Args::AtLeast(2),
        set: Setter::HttpMain(set_cache_path),
    },
];

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

/// Module variables (see `modules::VAR_MODULES`).
pub const VARS: &[&str] = &[
    "upstream_cache_status",
    "upstream_addr",
    "upstream_status",
    "proxy_host",
    "proxy_port",
    "proxy_add_x_forwarded_for",
];

pub fn var(cx: &Ctx<'_>, i: u8, out: &mut Vec<u8>) -> bool {
    if i == 5 {
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

fn append_note(cx: &mut Ctx<'_>, key: &'static str, v: &[u8]) {
    match cx.notes.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => {
            slot.1.extend_from_slice(b", ");
            slot.1.extend_from_slice(v);
        }
        None => cx.notes.push((key, v.to_vec())),
    }
}

// ---- configuration ----------------------------------------------------------

/// http-level state: the cache zones by name.
#[derive(Debug, Clone, Default)]
pub struct ProxyMain {
    pub zones: HashMap<String, Arc<Zone>>,
}

/// Where `proxy_pass` goes.
#[derive(Debug)]
pub enum Target {
    /// An IP literal: one implicit upstream, built at configuration time.
    Fixed(Arc<Upstream>),
    /// A name: an `upstream` block of that name if there is one (looked up
    /// per request in the request's configuration: a location is compiled
    /// without access to the http-level state), else the host resolved on
    /// first use.
    Named {
        name: String,
        port: u16,
        resolved: OnceLock<Option<Arc<Upstream>>>,
    },
}

/// A compiled `proxy_pass http://HOST[:PORT][/URI]`.
#[derive(Debug)]
pub struct Pass {
    /// `http://HOST[:PORT]` as written (for messages).
    pub url: String,
    /// `https://`: TLS to the upstream (`tls::client`).
    pub tls: bool,
    /// `$proxy_host`: the Host header sent by default.
    pub host: Vec<u8>,
    pub port: u16,
    /// The URI part, if any: it replaces the matched location prefix.
    pub uri: Option<Vec<u8>>,
    pub target: Target,
    /// `<prefix>/proxy_temp`, used without `proxy_temp_path`.
    pub temp_default: PathBuf,
    /// `<prefix>/client_body_temp`, used without `client_body_temp_path`.
    pub body_temp_default: Arc<TempDir>,
}

/// `proxy_cache`.
#[derive(Debug, Clone)]
pub enum CacheSel {
    Off,
    Zone(String),
    Var(Template),
}

/// `proxy_cache_valid` entry: status (None = any) and seconds.
pub type Valid = (Option<u16>, u64);

const M_GET: u8 = 1;
const M_HEAD: u8 = 2;
const M_POST: u8 = 4;

const IGN_X_ACCEL_EXPIRES: u8 = 1;
const IGN_EXPIRES: u8 = 2;
const IGN_CACHE_CONTROL: u8 = 4;
const IGN_SET_COOKIE: u8 = 8;
const IGN_VARY: u8 = 16;
const IGN_X_ACCEL_BUFFERING: u8 = 32;
pub(crate) const IGN_X_ACCEL_CHARSET: u8 = 64;
const IGN_X_ACCEL_LIMIT_RATE: u8 = 128;

/// Location-level settings.
#[derive(Debug, Clone, Default)]
pub struct ProxyLoc {
    pub pass: Option<Arc<Pass>>,
    pub headers: Option<Arc<Vec<(String, Template)>>>,
    /// Minor version of HTTP/1.x to upstream.
    pub http_version: Option<u8>,
    pub connect_timeout: Option<u64>,
    pub read_timeout: Option<u64>,
    pub send_timeout: Option<u64>,
    pub buffering: Option<bool>,
    pub buffers: Option<(usize, usize)>,
    pub buffer_size: Option<usize>,
    /// `proxy_max_temp_file_size` (0: no temp files).
    pub max_temp_file_size: Option<u64>,
    /// `proxy_temp_file_write_size`: checked; tern writes each piece of
    /// the body to the temp file as it arrives.
    pub temp_file_write_size: Option<u64>,
    pub temp_path: Option<PathBuf>,
    pub cache: Option<CacheSel>,
    pub cache_key: Option<Template>,
    pub cache_valid: Option<Arc<Vec<Valid>>>,
    pub cache_methods: Option<u8>,
    pub cache_bypass: Option<Arc<Vec<Template>>>,
    pub no_cache: Option<Arc<Vec<Template>>>,
    pub redirect: Option<bool>,
    pub intercept_errors: Option<bool>,
    pub pass_request_headers: Option<bool>,
    pub hide: Option<Arc<Vec<String>>>,
    pub pass_headers: Option<Arc<Vec<String>>>,
    pub ignore_headers: Option<u8>,
    pub pass_request_body: Option<bool>,
    /// `proxy_request_buffering`: accepted; `off` behaves as `on` (the
    /// body is read whole before the upstream is contacted).
    pub request_buffering: Option<bool>,
    pub set_body: Option<Template>,
    /// `proxy_force_ranges`: byte ranges on proxied responses that do
    /// not come from the cache.
    pub force_ranges: Option<bool>,
    pub ssl_verify: Option<bool>,
    pub ssl_server_name: Option<bool>,
    pub ssl_session_reuse: Option<bool>,
    pub ssl_name: Option<String>,
    pub ssl_protocols: Option<(bool, bool)>,
    pub ssl_ciphers: Option<String>,
    pub ssl_trusted: Option<Arc<rustls::RootCertStore>>,
    /// The TLS client configuration of this level, made on its first
    /// `https://` request from the merged settings (not inherited: each
    /// level has its own).
    pub ssl_client: Arc<OnceLock<Option<Arc<rustls::ClientConfig>>>>,
    /// `proxy_next_upstream`: the [`ft`] cases that move to the next peer.
    pub next_upstream: Option<u16>,
    /// `proxy_next_upstream_tries` (0: as many as there are peers).
    pub next_upstream_tries: Option<u64>,
    /// `proxy_next_upstream_timeout` in ms (0: no limit).
    pub next_upstream_timeout: Option<u64>,
    /// `proxy_cache_use_stale`: the [`ft`] cases (and [`ft::UPDATING`])
    /// in which an expired entry is served.
    pub cache_use_stale: Option<u16>,
    pub cache_background_update: Option<bool>,
    pub cache_lock: Option<bool>,
    /// `proxy_cache_lock_timeout` and `_age`, ms.
    pub cache_lock_timeout: Option<u64>,
    pub cache_lock_age: Option<u64>,
    pub cache_revalidate: Option<bool>,
    pub cache_convert_head: Option<bool>,
    pub cache_min_uses: Option<u64>,
    /// `proxy_cookie_domain` / `_path` rules in order (empty: `off`).
    pub cookie_domain: Option<Arc<Vec<CookieRewrite>>>,
    pub cookie_path: Option<Arc<Vec<CookieRewrite>>>,
    /// `proxy_cookie_flags` entries in order (empty: `off`).
    pub cookie_flags: Option<Arc<Vec<CookieFlags>>>,
    /// `proxy_method`.
    pub method: Option<Template>,
    /// `proxy_ignore_client_abort`: `on` keeps reading the upstream's
    /// body after the client hung up (see `Response::watch_client`).
    pub ignore_client_abort: Option<bool>,
    /// `proxy_bind` (None inside: `off`).
    pub bind: Option<Option<BindAddr>>,
    pub socket_keepalive: Option<bool>,
    /// `proxy_limit_rate`, bytes per second (0: unlimited).
    pub limit_rate: Option<u64>,
    /// `proxy_store` (None inside: `off`).
    pub store: Option<Option<StoreTo>>,
    /// `proxy_store_access` as a file mode.
    pub store_access: Option<u32>,
}

/// Where `proxy_store` puts a file.
#[derive(Debug, Clone)]
pub enum StoreTo {
    /// `on`: root (or alias) + URI, as a static file would be found.
    Root,
    Path(Template),
}

/// What a `proxy_cookie_domain`/`_path` rule or a `proxy_cookie_flags`
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

/// `proxy_bind` address: literal or with variables.
#[derive(Debug, Clone)]
pub enum BindAddr {
    Fixed(std::net::IpAddr),
    Var(Template),
}

/// nginx's `proxy_next_upstream` cases (its NGX_HTTP_UPSTREAM_FT_* bits).
pub mod ft {
    pub const ERROR: u16 = 1 << 1;
    pub const TIMEOUT: u16 = 1 << 2;
    pub const INVALID_HEADER: u16 = 1 << 3;
    pub const HTTP_500: u16 = 1 << 4;
    pub const HTTP_502: u16 = 1 << 5;
    pub const HTTP_503: u16 = 1 << 6;
    pub const HTTP_504: u16 = 1 << 7;
    pub const HTTP_403: u16 = 1 << 8;
    pub const HTTP_404: u16 = 1 << 9;
    pub const HTTP_429: u16 = 1 << 10;
    pub const NON_IDEMPOTENT: u16 = 1 << 11;
    /// `proxy_cache_use_stale updating` (not a `proxy_next_upstream` case).
    pub const UPDATING: u16 = 1 << 12;
    /// The default: `error timeout`.
    pub const DEFAULT: u16 = ERROR | TIMEOUT;

    pub const NAMES: &[(&str, u16)] = &[
        ("error", ERROR),
        ("timeout", TIMEOUT),
        ("invalid_header", INVALID_HEADER),
        ("http_500", HTTP_500),
        ("http_502", HTTP_502),
        ("http_503", HTTP_503),
        ("http_504", HTTP_504),
        ("http_403", HTTP_403),
        ("http_404", HTTP_404),
        ("http_429", HTTP_429),
        ("non_idempotent", NON_IDEMPOTENT),
        ("off", 0),
    ];

    pub const STALE_NAMES: &[(&str, u16)] = &[
        ("error", ERROR),
        ("timeout", TIMEOUT),
        ("invalid_header", INVALID_HEADER),
        ("updating", UPDATING),
        ("http_500", HTTP_500),
        ("http_502", HTTP_502),
        ("http_503", HTTP_503),
        ("http_504", HTTP_504),
        ("http_403", HTTP_403),
        ("http_404", HTTP_404),
        ("http_429", HTTP_429),
        ("off", 0),
    ];

    /// The case an upstream's response status is, if it is one.
    pub fn of_status(status: u16) -> Option<u16> {
        Some(match status {
            500 => HTTP_500,
            502 => HTTP_502,
            503 => HTTP_503,
            504 => HTTP_504,
            403 => HTTP_403,
            404 => HTTP_404,
            429 => HTTP_429,
            _ => return None,
        })
    }
}

impl ProxyLoc {
    pub fn merge(&mut self, p: &ProxyLoc) {
        // `pass` is inherited too, so that an `if` block inside a proxied
        // location still proxies (nginx keeps the location's handler there).
        merge_opts!(self, p; pass, headers, http_version, connect_timeout, read_timeout,
            send_timeout, buffering, buffers, buffer_size, max_temp_file_size, temp_file_write_size, temp_path, cache, cache_key,
            cache_valid, cache_methods, cache_bypass, no_cache, redirect, intercept_errors,
            pass_request_headers, hide, pass_headers, ignore_headers, pass_request_body,
            request_buffering, set_body, force_ranges, next_upstream, next_upstream_tries,
            next_upstream_timeout, ssl_verify, ssl_server_name, ssl_session_reuse, ssl_name,
            ssl_protocols, ssl_ciphers, ssl_trusted, cache_use_stale, cache_background_update,
            cache_lock, cache_lock_timeout, cache_lock_age, cache_revalidate, cache_convert_head,
            cache_min_uses, cookie_domain, cookie_path, cookie_flags, method,
            ignore_client_abort, bind, socket_keepalive, limit_rate, store, store_access);
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

/// The upstream settings a directive fills: proxy's own, or the FastCGI
/// module's (`fastcgi_*` rows share these setters, as nginx's modules
/// share one `ngx_http_upstream_conf_t` layout and its slot setters).
pub(crate) fn up_conf<'l>(l: &'l mut LocConf, d: &Directive) -> &'l mut ProxyLoc {
    if d.name.starts_with("fastcgi_") {
        &mut l.modules.fastcgi.up
    } else {
        &mut l.modules.proxy
    }
}

/// A directive's name without its module prefix (`proxy_`, `fastcgi_`).
fn suffix(d: &Directive) -> &str {
    d.name.split_once('_').map_or("", |(_, s)| s)
}

fn set_pass(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.proxy.pass.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let url = arg(d, 0);
    if url.contains('$') {
        return Err(ConfError::at(
            "proxy_pass with variables is not supported by tern yet",
            d,
        ));
    }
    let lower = url.to_ascii_lowercase();
    let tls = lower.starts_with("https://");
    let rest = if lower.starts_with("http://") {
        &url[7..]
    } else if tls {
        &url[8..]
    } else {
        return Err(ConfError::at(
            format!("invalid URL prefix in \"{}\"", url),
            d,
        ));
    };
    let (hostport, uri) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(rest.as_bytes()[i..].to_vec())),
        None => (rest, None),
    };
    if hostport.is_empty() {
        return Err(ConfError::at(format!("no host in \"{}\"", url), d));
    }
    let (host, port) = split_port(hostport)
        .ok_or_else(|| ConfError::at(format!("invalid port in \"{}\"", url), d))?;
    let explicit_port = port.is_some();
    let default_port = if tls { 443 } else { 80 };
    let port = port.unwrap_or(default_port);
    let proxy_host = if port == default_port {
        host.to_string()
    } else {
        format!("{}:{}", host, port)
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let target = if bare.parse::<std::net::IpAddr>().is_ok() {
        let addrs = upstream::resolve(&format!("{}:{}", host, port), d, "upstream")?;
        Target::Fixed(Arc::new(Upstream::implicit(&proxy_host, addrs)))
    } else if explicit_port {
        // A name with a port is never an upstream block: resolve now.
        let addrs = upstream::resolve(&format!("{}:{}", host, port), d, "upstream")?;
        Target::Fixed(Arc::new(Upstream::implicit(&proxy_host, addrs)))
    } else {
        Target::Named {
            name: host.to_string(),
            port,
            resolved: OnceLock::new(),
        }
    };
    // Temp files of unbuffered-in-memory responses go under the prefix
    // unless proxy_temp_path says otherwise; the keeper may create it.
    let temp_default = cx.path("proxy_temp");
    cache::allow_dir(&temp_default);
    l.modules.proxy.pass = Some(Arc::new(Pass {
        url: format!("{}://{}", if tls { "https" } else { "http" }, hostport),
        tls,
        host: proxy_host.into_bytes(),
        port,
        uri,
        target,
        temp_default,
        body_temp_default: Arc::new(TempDir::plain(cx.path("client_body_temp"))),
    }));
    Ok(())
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

pub(crate) fn set_timeout(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let ms = value::time_ms(arg(d, 0)).ok_or_else(|| crate::config::registry::slot_invalid(d))?;
    let p = up_conf(l, d);
    let slot = match suffix(d) {
        "connect_timeout" => &mut p.connect_timeout,
        "read_timeout" => &mut p.read_timeout,
        "next_upstream_timeout" => &mut p.next_upstream_timeout,
        "cache_lock_timeout" => &mut p.cache_lock_timeout,
        "cache_lock_age" => &mut p.cache_lock_age,
        _ => &mut p.send_timeout,
    };
    set_once(slot, ms, d)
}

/// `proxy_next_upstream CASE...`: nginx's bitmask slot (`off` wins over
/// the rest; a repeated case is a warning).
pub(crate) fn set_next_upstream(
    l: &mut LocConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    let mask = ft_mask(d, cx, ft::NAMES)?;
    set_once(&mut up_conf(l, d).next_upstream, mask, d)
}

/// `proxy_cache_use_stale CASE...`: the same bitmask as
/// `proxy_next_upstream`, with `updating` instead of `non_idempotent`.
fn set_cache_use_stale(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let mask = ft_mask(d, cx, ft::STALE_NAMES)?;
    set_once(&mut l.modules.proxy.cache_use_stale, mask, d)
}

/// A cookie pattern: `~re`, `~*re`, or text (with variables; for
/// domains a leading dot is dropped, as nginx matches without it).
fn cookie_match(
    d: &Directive,
    cx: &mut Compiler,
    a: &str,
    domain: bool,
) -> ConfResult<CookieMatch> {
    if let Some(r) = a.strip_prefix('~') {
        let (r, caseless) = match r.strip_prefix('*') {
            Some(r) => (r, true),
            None => (r, false),
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
    let pattern = cookie_match(d, cx, arg(d, 0), domain)?;
    let replacement = cx.template(arg(d, 1), d)?;
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
    let cookie = cookie_match(d, cx, arg(d, 0), false)?;
    let mut flags = Vec::new();
    for a in &d.args[1..] {
        flags.push(cx.template(&a.value, d)?);
    }
    let slot = &mut l.modules.proxy.cookie_flags;
    Arc::make_mut(slot.get_or_insert_with(Default::default)).push(CookieFlags { cookie, flags });
    Ok(())
}

/// `proxy_store on | off | PATH`: incompatible with `proxy_cache` in the
/// same block, as nginx.
fn set_store(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let a = arg(d, 0);
    let v = match a {
        "off" => None,
        "on" => Some(StoreTo::Root),
        // A relative path is under the prefix, as nginx's.
        _ if a.starts_with('$') => Some(StoreTo::Path(cx.template(a, d)?)),
        _ => {
            let p = cx.path(a);
            Some(StoreTo::Path(cx.template(&p.to_string_lossy(), d)?))
        }
    };
    if l.modules.proxy.store.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    if v.is_some()
        && l.modules
            .proxy
            .cache
            .as_ref()
            .is_some_and(|c| !matches!(c, CacheSel::Off))
    {
        return Err(ConfError::at(
            "\"proxy_store\" directive is incompatible with \"proxy_cache\"",
            d,
        ));
    }
    l.modules.proxy.store = Some(v);
    Ok(())
}

/// `proxy_store_access [user:r|rw] [group:r|rw] [all:r|rw]` (the user
/// keeps rw unless `user:` says otherwise).
fn set_store_access(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let mut mode = 0u32;
    let mut user = 0o600;
    for a in d.args.iter().map(|a| a.value.as_str()) {
        let bad = || ConfError::at(format!("invalid value \"{}\"", a), d);
        let (shift, rights) = if let Some(r) = a.strip_prefix("user:") {
            user = 0;
            (6, r)
        } else if let Some(r) = a.strip_prefix("group:") {
            (3, r)
        } else if let Some(r) = a.strip_prefix("all:") {
            (0, r)
        } else {
            return Err(bad());
        };
        let bits = match rights {
            "rw" => 6,
            "r" => 4,
            _ => return Err(bad()),
        };
        mode |= bits << shift;
    }
    set_once(&mut l.modules.proxy.store_access, mode | user, d)
}

fn set_method(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let t = cx.template(arg(d, 0), d)?;
    set_once(&mut l.modules.proxy.method, t, d)
}

/// `proxy_bind ADDRESS [transparent] | off`.
pub(crate) fn set_bind(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let a = arg(d, 0);
    if d.args.len() == 2 {
        if arg(d, 1) != "transparent" {
            return Err(ConfError::at(
                format!("invalid parameter \"{}\"", arg(d, 1)),
                d,
            ));
        }
        return Err(ConfError::at(
            format!("{} transparent is not supported by tern yet", d.name),
            d,
        ));
    }
    let v = if a == "off" {
        None
    } else if a.contains('$') {
        Some(BindAddr::Var(cx.template(a, d)?))
    } else {
        Some(BindAddr::Fixed(parse_bind(a).ok_or_else(|| {
            ConfError::at(format!("invalid address \"{}\"", a), d)
        })?))
    };
    set_once(&mut up_conf(l, d).bind, v, d)
}

/// A local address for `proxy_bind`: an IP, IPv6 in brackets or not.
fn parse_bind(a: &str) -> Option<std::net::IpAddr> {
    a.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

fn set_cache_min_uses(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = crate::config::registry::num_arg(d, 0)?;
    set_once(&mut l.modules.proxy.cache_min_uses, n, d)
}

/// nginx's bitmask slot over `names` (`off` wins over the rest; a
/// repeated case is a warning).
fn ft_mask(d: &Directive, cx: &mut Compiler, names: &[(&str, u16)]) -> ConfResult<u16> {
    let mut mask = 0u16;
    let mut off = false;
    let mut seen: Vec<&str> = Vec::new();
    for a in &d.args {
        let v = a.value.as_str();
        let Some((_, bit)) = names.iter().find(|(n, _)| *n == v) else {
            return Err(ConfError::at(format!("invalid value \"{}\"", v), d));
        };
        if seen.contains(&v) {
            cx.warnings
                .push(ConfError::at(format!("duplicate value \"{}\"", v), d).to_string());
        }
        seen.push(v);
        off |= v == "off";
        mask |= bit;
    }
    Ok(if off { 0 } else { mask })
}

pub(crate) fn set_next_upstream_tries(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let n =
        value::number(arg(d, 0)).ok_or_else(|| crate::config::registry::slot_invalid_number(d))?;
    set_once(&mut up_conf(l, d).next_upstream_tries, n, d)
}

pub(crate) fn set_flag(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    let p = up_conf(l, d);
    let slot = match suffix(d) {
        "buffering" => &mut p.buffering,
        "intercept_errors" => &mut p.intercept_errors,
        "pass_request_body" => &mut p.pass_request_body,
        "request_buffering" => &mut p.request_buffering,
        "force_ranges" => &mut p.force_ranges,
        "cache_background_update" => &mut p.cache_background_update,
        "cache_lock" => &mut p.cache_lock,
        "cache_revalidate" => &mut p.cache_revalidate,
        "cache_convert_head" => &mut p.cache_convert_head,
        "ignore_client_abort" => &mut p.ignore_client_abort,
        "socket_keepalive" => &mut p.socket_keepalive,
        _ => &mut p.pass_request_headers,
    };
    set_once(slot, v, d)
}

fn set_ssl_flag(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    let p = &mut l.modules.proxy;
    let slot = match d.name.as_str() {
        "proxy_ssl_verify" => &mut p.ssl_verify,
        "proxy_ssl_server_name" => &mut p.ssl_server_name,
        _ => &mut p.ssl_session_reuse,
    };
    set_once(slot, v, d)
}

fn set_ssl_name(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = arg(d, 0);
    if v.contains('$') {
        return Err(ConfError::at(
            "proxy_ssl_name with variables is not supported by tern yet",
            d,
        ));
    }
    set_once(&mut l.modules.proxy.ssl_name, v.to_string(), d)
}

fn set_ssl_protocols(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = super::ssl_settings::parse_protocols(d)?;
    set_once(&mut l.modules.proxy.ssl_protocols, v, d)
}

fn set_ssl_ciphers(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    crate::tls::client::check_ciphers(arg(d, 0))?;
    set_once(&mut l.modules.proxy.ssl_ciphers, arg(d, 0).to_string(), d)
}

fn set_ssl_trusted(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = arg(d, 0);
    let path = if p.starts_with('/') {
        p.to_string()
    } else {
        cx.conf_prefix.join(p).to_string_lossy().into_owned()
    };
    // Read here, on the master thread, never on a worker.
    let roots = crate::tls::client::load_roots(&path)?;
    set_once(&mut l.modules.proxy.ssl_trusted, roots, d)
}

fn set_ssl_verify_depth(_: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    value::number(arg(d, 0))
        .map(drop)
        .ok_or_else(|| crate::config::registry::slot_invalid_number(d))
}

/// nginx's check of a location that proxies to `https://` with
/// `proxy_ssl_verify on`.
pub fn check_ssl(l: &LocConf) -> ConfResult<()> {
    let p = &l.modules.proxy;
    if p.pass.as_ref().is_some_and(|x| x.tls)
        && p.ssl_verify == Some(true)
        && p.ssl_trusted.is_none()
    {
        return Err(ConfError::new(
            "no proxy_ssl_trusted_certificate for proxy_ssl_verify",
        ));
    }
    Ok(())
}

/// The location's TLS client configuration and the name to verify (and
/// send as SNI), or None when the configuration cannot be made.
fn ssl_client(
    conf: &ProxyLoc,
    pass: &Pass,
) -> Option<(
    Arc<rustls::ClientConfig>,
    rustls::pki_types::ServerName<'static>,
)> {
    let cfg = conf
        .ssl_client
        .get_or_init(|| {
            let s = crate::tls::client::UpSsl {
                verify: conf.ssl_verify.unwrap_or(false),
                server_name: conf.ssl_server_name.unwrap_or(false),
                // nginx 1.22's default: TLSv1 TLSv1.1 TLSv1.2.
                protocols: conf.ssl_protocols.unwrap_or((true, false)),
                ciphers: conf.ssl_ciphers.clone().unwrap_or_else(|| "DEFAULT".into()),
                roots: conf.ssl_trusted.clone(),
                session_reuse: conf.ssl_session_reuse.unwrap_or(true),
            };
            crate::tls::client::client_config(&s).ok()
        })
        .clone()?;
    let host = String::from_utf8_lossy(&pass.host).into_owned();
    let name = crate::tls::client::server_name(conf.ssl_name.as_deref().unwrap_or(&host))?;
    Some((cfg, name))
}

pub(crate) fn set_buffers(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = value::number(arg(d, 0))
        .filter(|n| *n > 0)
        .ok_or_else(|| crate::config::registry::slot_invalid(d))? as usize;
    let s = value::size(arg(d, 1))
        .filter(|n| *n > 0)
        .ok_or_else(|| crate::config::registry::slot_invalid(d))? as usize;
    set_once(&mut up_conf(l, d).buffers, (n, s), d)
}

pub(crate) fn set_size(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let s = value::size(arg(d, 0)).ok_or_else(|| crate::config::registry::slot_invalid(d))?;
    if suffix(d) == "buffer_size" {
        return set_once(&mut up_conf(l, d).buffer_size, s as usize, d);
    }
    let p = up_conf(l, d);
    match suffix(d) {
        "max_temp_file_size" => set_once(&mut p.max_temp_file_size, s, d),
        "temp_file_write_size" => set_once(&mut p.temp_file_write_size, s, d),
        "limit_rate" => set_once(&mut p.limit_rate, s, d),
        // proxy_busy_buffers_size: nginx's share of the buffers that may be
        // on their way to the client; tern's pieces are handed over whole.
        _ => Ok(()),
    }
}

pub(crate) fn set_temp_path(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    // Checked as nginx does, then unused: proxy temp files are unlinked as
    // soon as they are created, so no directory tree of them ever builds
    // up that levels would spread out (DIFFERENCES.md).
    crate::http::body::temp_levels(d)?;
    let p = cx.path(arg(d, 0));
    cache::allow_dir(&p);
    set_once(&mut up_conf(l, d).temp_path, p, d)
}

fn set_cache(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let a = arg(d, 0);
    if a != "off" && l.modules.proxy.store.as_ref().is_some_and(|s| s.is_some()) {
        return Err(ConfError::at(
            "\"proxy_cache\" directive is incompatible with \"proxy_store\"",
            d,
        ));
    }
    let sel = if a == "off" {
        CacheSel::Off
    } else if a.contains('$') {
        CacheSel::Var(cx.template(a, d)?)
    } else {
        CacheSel::Zone(a.to_string())
    };
    set_once(&mut l.modules.proxy.cache, sel, d)
}

fn set_cache_key(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let t = cx.template(arg(d, 0), d)?;
    set_once(&mut l.modules.proxy.cache_key, t, d)
}

fn set_cache_valid(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = d.args.len();
    let time = arg(d, n - 1);
    let secs = value::time_secs(time)
        .ok_or_else(|| ConfError::at(format!("invalid time value \"{}\"", time), d))?;
    let list = l
        .modules
        .proxy
        .cache_valid
        .get_or_insert_with(Default::default);
    let list = Arc::make_mut(list);
    if n == 1 {
        for c in [200, 301, 302] {
            list.push((Some(c), secs));
        }
        return Ok(());
    }
    for a in d.args[..n - 1].iter().map(|a| a.value.as_str()) {
        if a == "any" {
            list.push((None, secs));
            continue;
        }
        let code = a
            .parse::<u16>()
            .ok()
            .filter(|c| (100..=599).contains(c))
            .ok_or_else(|| ConfError::at(format!("invalid status \"{}\"", a), d))?;
        list.push((Some(code), secs));
    }
    Ok(())
}

fn set_cache_methods(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    // GET and HEAD are always cacheable, as in nginx.
    let mut m = M_GET | M_HEAD;
    for a in d.args.iter().map(|a| a.value.as_str()) {
        m |= match a {
            "GET" => M_GET,
            "HEAD" => M_HEAD,
            "POST" => M_POST,
            _ => return Err(crate::config::registry::invalid_value(d, a)),
        };
    }
    set_once(&mut l.modules.proxy.cache_methods, m, d)
}

fn set_predicates(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let mut v = Vec::new();
    for a in d.args.iter() {
        v.push(cx.template(&a.value, d)?);
    }
    let p = &mut l.modules.proxy;
    let slot = if d.name == "proxy_cache_bypass" {
        &mut p.cache_bypass
    } else {
        &mut p.no_cache
    };
    Arc::make_mut(slot.get_or_insert_with(Default::default)).extend(v);
    Ok(())
}

fn set_redirect(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = match (d.args.len(), arg(d, 0)) {
        (1, "default") => true,
        (1, "off") => false,
        _ => {
            return Err(ConfError::at(
                "proxy_redirect with a replacement is not supported by tern yet",
                d,
            ))
        }
    };
    set_once(&mut l.modules.proxy.redirect, v, d)
}

pub(crate) fn set_hide_pass(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let p = up_conf(l, d);
    let slot = if suffix(d) == "hide_header" {
        &mut p.hide
    } else {
        &mut p.pass_headers
    };
    Arc::make_mut(slot.get_or_insert_with(Default::default)).push(arg(d, 0).to_ascii_lowercase());
    Ok(())
}

pub(crate) fn set_ignore_headers(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let mut m = 0;
    for a in d.args.iter().map(|a| a.value.as_str()) {
        m |= match a.to_ascii_lowercase().as_str() {
            "x-accel-expires" => IGN_X_ACCEL_EXPIRES,
            "expires" => IGN_EXPIRES,
            "cache-control" => IGN_CACHE_CONTROL,
            "set-cookie" => IGN_SET_COOKIE,
            "vary" => IGN_VARY,
            "x-accel-buffering" => IGN_X_ACCEL_BUFFERING,
            "x-accel-charset" => IGN_X_ACCEL_CHARSET,
            "x-accel-limit-rate" => IGN_X_ACCEL_LIMIT_RATE,
            // This steers an nginx feature tern does not have; ignoring
            // it is what was asked.
            "x-accel-redirect" => 0,
            _ => return Err(crate::config::registry::invalid_value(d, a)),
        };
    }
    set_once(&mut up_conf(l, d).ignore_headers, m, d)
}

/// `proxy_cache_path PATH [levels=] keys_zone=NAME:SIZE [inactive=]
/// [max_size=] [min_free=] [use_temp_path=] [loader_*= manager_*=]`.
fn set_cache_path(hm: &mut HttpMain, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let path = cx.path(arg(d, 0));
    let mut levels = Vec::new();
    let mut zone: Option<(String, usize)> = None;
    let mut max_size = None;
    let mut min_free = 0;
    let mut inactive = 600;
    let mut pacing = cache::Pacing::default();
    let bad = |a: &str| ConfError::at(format!("invalid parameter \"{}\"", a), d);
    for a in d.args.iter().skip(1).map(|a| a.value.as_str()) {
        if let Some(v) = a.strip_prefix("levels=") {
            for part in v.split(':') {
                match part {
                    "1" => levels.push(1),
                    "2" => levels.push(2),
                    _ => {
                        return Err(ConfError::at(format!("invalid \"levels\" \"{}\"", a), d));
                    }
                }
            }
            if levels.len() > 3 {
                return Err(ConfError::at(format!("invalid \"levels\" \"{}\"", a), d));
            }
        } else if let Some(v) = a.strip_prefix("keys_zone=") {
            let (name, size) = v
                .split_once(':')
                .ok_or_else(|| ConfError::at(format!("invalid keys zone size \"{}\"", a), d))?;
            let size = value::size(size)
                .filter(|s| *s >= 8192)
                .ok_or_else(|| ConfError::at(format!("invalid keys zone size \"{}\"", a), d))?;
            if name.is_empty() {
                return Err(bad(a));
            }
            zone = Some((name.to_string(), size as usize));
        } else if let Some(v) = a.strip_prefix("max_size=") {
            max_size =
                Some(value::offset(v).ok_or_else(|| {
                    ConfError::at(format!("invalid max_size value \"{}\"", a), d)
                })?);
        } else if let Some(v) = a.strip_prefix("min_free=") {
            min_free = value::offset(v)
                .ok_or_else(|| ConfError::at(format!("invalid min_free value \"{}\"", a), d))?;
        } else if let Some(v) = a.strip_prefix("inactive=") {
            inactive = value::time_secs(v)
                .ok_or_else(|| ConfError::at(format!("invalid inactive value \"{}\"", a), d))?;
        } else if let Some(v) = a.strip_prefix("use_temp_path=") {
            // Temp files are always written next to their final name (see
            // crate::cache): `on` and `off` both mean an atomic rename.
            if v != "on" && v != "off" {
                return Err(ConfError::at(
                    format!(
                        "invalid use_temp_path value \"{}\", it must be \"on\" or \"off\"",
                        v
                    ),
                    d,
                ));
            }
        } else if let Some((name, v)) = a
            .split_once('=')
            .filter(|(n, _)| n.starts_with("loader_") || n.starts_with("manager_"))
        {
            // The loader's and manager's pacing (see crate::cache::Pacing):
            // counts as ngx_atoi, times as ngx_parse_time(, 0).
            let invalid = || ConfError::at(format!("invalid {} value \"{}\"", name, a), d);
            let files = || value::number(v).ok_or_else(invalid);
            let time = || {
                value::time_ms(v)
                    .map(Duration::from_millis)
                    .ok_or_else(invalid)
            };
            match name {
                "loader_files" => pacing.loader_files = files()?,
                "loader_sleep" => pacing.loader_sleep = time()?,
                "loader_threshold" => pacing.loader_threshold = time()?,
                "manager_files" => pacing.manager_files = files()?,
                "manager_sleep" => pacing.manager_sleep = time()?,
                "manager_threshold" => pacing.manager_threshold = time()?,
                _ => return Err(bad(a)),
            }
        } else {
            return Err(bad(a));
        }
    }
    let Some((name, size)) = zone else {
        return Err(ConfError::at(
            "\"proxy_cache_path\" must have \"keys_zone\" parameter",
            d,
        ));
    };
    if hm.modules.proxy.zones.contains_key(&name) {
        return Err(ConfError::at(format!("duplicate zone \"{}\"", name), d));
    }
    if hm.modules.proxy.zones.values().any(|z| z.conf.path == path) {
        return Err(ConfError::at(
            format!("duplicate proxy_cache_path \"{}\"", arg(d, 0)),
            d,
        ));
    }
    let z = cache::zone(cache::PathConf {
        path,
        levels,
        name: name.clone(),
        size,
        max_size,
        inactive_secs: inactive,
        min_free,
        pacing,
    });
    hm.modules.proxy.zones.insert(name, z);
    Ok(())
}

// ---- request handling ------------------------------------------------------

/// The content handler: Some when the location proxies.
pub async fn content(cx: &mut Ctx<'_>) -> Option<Step> {
    let loc = cx.loc.clone();
    let pass = loc.modules.proxy.pass.clone()?;
    // Boxed: the proxy's state is KiBs, and inline it would make every
    // request's future (static files too) that big.
    Some(Step::done(Box::pin(handle(cx, &loc, &pass)).await))
}

/// How long each phase may wait, and the buffer limits.
#[derive(Clone)]
pub(crate) struct Limits {
    pub(crate) connect: Duration,
    pub(crate) send: Duration,
    pub(crate) read: Duration,
    pub(crate) head_max: usize,
    /// In-memory budget for a body on its way to the client: proxy_buffers
    /// in all (proxy_buffer_size when not buffering).
    pub(crate) mem_max: usize,
    /// proxy_max_temp_file_size (0: no temp file).
    pub(crate) temp_max: u64,
    /// proxy_next_upstream and its limits.
    pub(crate) next_mask: u16,
    pub(crate) next_tries: u64,
    pub(crate) next_timeout: Option<Duration>,
    /// `https://`: the client configuration and the upstream's name.
    pub(crate) tls: Option<(
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
    /// The FastCGI protocol instead of HTTP: the request goes out as
    /// records, the response comes back as records
    /// ([`super::fastcgi`]); with `fastcgi_catch_stderr`'s strings.
    pub(crate) fcgi: Option<Arc<Vec<Vec<u8>>>>,
}

impl Limits {
    /// The settings of `conf` (nginx's defaults where unset).
    pub(crate) fn of(conf: &ProxyLoc) -> Limits {
        Limits {
            connect: Duration::from_millis(conf.connect_timeout.unwrap_or(60_000)),
            send: Duration::from_millis(conf.send_timeout.unwrap_or(60_000)),
            read: Duration::from_millis(conf.read_timeout.unwrap_or(60_000)),
            head_max: conf.buffer_size.unwrap_or(4096).max(1024),
            mem_max: conf.buffers.map_or(8 * 4096, |(n, s)| n.saturating_mul(s)),
            temp_max: conf.max_temp_file_size.unwrap_or(1024 * 1024 * 1024),
            next_mask: conf.next_upstream.unwrap_or(ft::DEFAULT),
            next_tries: conf.next_upstream_tries.unwrap_or(0),
            next_timeout: conf
                .next_upstream_timeout
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis),
            tls: None,
            fcgi: None,
        }
    }
}

/// The cache side of one request.
struct CacheReq {
    zone: Arc<Zone>,
    key: Vec<u8>,
    md5: [u8; 16],
    /// `proxy_no_cache` matched: fetch, but do not store.
    no_store: bool,
}

async fn handle(cx: &mut Ctx<'_>, loc: &Arc<LocConf>, pass: &Arc<Pass>) -> Response {
    let conf = &loc.modules.proxy;
    cx.set_note("proxy_host", pass.host.clone());
    cx.set_note("proxy_port", pass.port.to_string().into_bytes());
    // As nginx with proxy_request_buffering on: the whole body first
    // (memory or a temp file), then the upstream.
    if let Err(r) = body::read(cx, &pass.body_temp_default).await {
        return *r;
    }
    let Some(up) = upstream_of(cx, pass).await else {
        return Response::status(502);
    };
    let policy = match cx.io_policy() {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let lim = Limits::of(conf);
    let lim = if pass.tls {
        match ssl_client(conf, pass) {
            Some(t) => Limits {
                tls: Some(t),
                ..lim
            },
            None => {
                cx.log(
                    Level::Error,
                    "SSL_CTX_new() failed (no usable protocol or name for the upstream)",
                );
                return Response::status(502);
            }
        }
    } else {
        lim
    };

    // Cache lookup.
    let mut creq: Option<CacheReq> = None;
    // The expired entry, kept for proxy_cache_use_stale and _revalidate.
    let mut stale: Option<Stale> = None;
    // This request's `updating` mark on the key (proxy_cache_lock, and
    // the UPDATING state of proxy_cache_use_stale): released when the
    // entry is stored or the request is done with it.
    let mut guard: Option<cache::UpdateGuard> = None;
    let zone = match &conf.cache {
        None | Some(CacheSel::Off) => None,
        Some(CacheSel::Zone(n)) => Some(n.clone().into_bytes()),
        Some(CacheSel::Var(t)) => Some(t.render_vec(&*cx)),
    };
    if let Some(zname) = zone {
        let Some(z) = std::str::from_utf8(&zname)
            .ok()
            .and_then(|n| cx.http.main.modules.proxy.zones.get(n))
            .cloned()
        else {
            cx.log(
                Level::Error,
                &format!("cache \"{}\" not found", String::from_utf8_lossy(&zname)),
            );
            return Response::status(500);
        };
        let m = match cx.method {
            Method::Get => M_GET,
            Method::Head => M_HEAD,
            Method::Post => M_POST,
            _ => 0,
        };
        if conf.cache_methods.unwrap_or(M_GET | M_HEAD) & m != 0 {
            let key = match &conf.cache_key {
                Some(t) => t.render_vec(&*cx),
                // nginx's built-in key: the proxy_pass URL's scheme and
                // host, then the URI as sent upstream.
                None => {
                    let mut k = pass.url.as_bytes().to_vec();
                    k.extend_from_slice(&upstream_uri(cx, pass));
                    k
                }
            };
            let md5 = md5::digest(&key);
            let bypass = any_true(cx, conf.cache_bypass.as_deref());
            let mut no_store = any_true(cx, conf.no_cache.as_deref());
            let use_stale = conf.cache_use_stale.unwrap_or(0);
            // proxy_cache_lock waits at most this long, over all rounds.
            let lock_deadline = std::time::Instant::now()
                + Duration::from_millis(conf.cache_lock_timeout.unwrap_or(5000));
            let status: &[u8] = if bypass {
                b"BYPASS"
            } else {
                loop {
                    match lookup(cx, &z, &md5, &key, &policy).await {
                        Lookup::Hit(r) => return cache_answer(cx, conf, *r, b"HIT"),
                        Lookup::Expired(st) => {
                            // The first request to find it expired updates
                            // it (nginx's STALE); others meanwhile find it
                            // UPDATING.
                            let g = z.try_update(&md5, None);
                            if let Some(st) = st {
                                if use_stale & ft::UPDATING != 0 {
                                    match g {
                                        None => {
                                            let r = entry_response(st.eh, st.file, &policy);
                                            return cache_answer(cx, conf, r, b"UPDATING");
                                        }
                                        Some(g)
                                            if conf.cache_background_update.unwrap_or(false) =>
                                        {
                                            let c = CacheReq {
                                                zone: z.clone(),
                                                key,
                                                md5,
                                                no_store,
                                            };
                                            background_update(
                                                cx,
                                                loc,
                                                pass,
                                                &up,
                                                &lim,
                                                &policy,
                                                c,
                                                g,
                                                Some(&st.eh),
                                            );
                                            let r = entry_response(st.eh, st.file, &policy);
                                            return cache_answer(cx, conf, r, b"STALE");
                                        }
                                        Some(g) => guard = Some(g),
                                    }
                                } else {
                                    guard = g;
                                }
                                stale = Some(st);
                            } else {
                                guard = g;
                            }
                            break b"EXPIRED";
                        }
                        Lookup::Miss => {
                            let min_uses = conf.cache_min_uses.unwrap_or(1);
                            if min_uses > 1 && z.count_use(&md5) < min_uses {
                                no_store = true;
                                break b"MISS";
                            }
                            if !conf.cache_lock.unwrap_or(false) {
                                break b"MISS";
                            }
                            let age = Duration::from_millis(conf.cache_lock_age.unwrap_or(5000));
                            if let Some(g) = z.try_update(&md5, Some(age)) {
                                guard = Some(g);
                                break b"MISS";
                            }
                            // Another request is filling it: wait for it,
                            // then look again (a HIT, or this request's
                            // turn to fill it).
                            if !z.wait_update(&md5, lock_deadline).await {
                                cx.log(Level::Info, "cache lock timeout");
                                no_store = true;
                                break b"MISS";
                            }
                        }
                    }
                }
            };
            cx.set_note("upstream_cache_status", status.to_vec());
            creq = Some(CacheReq {
                zone: z,
                key,
                md5,
                no_store,
            });
        }
    }

    let req_uri = upstream_uri(cx, pass);
    let (out_body, body_len) = outgoing_body(cx, conf);
    // proxy_cache_revalidate: ask whether the expired entry still holds.
    let revalidate = stale
        .as_ref()
        .filter(|_| conf.cache_revalidate.unwrap_or(false))
        .map(|st| validators(&st.eh))
        .filter(|v| v.0.is_some() || v.1.is_some());
    let convert_head = conf.cache_convert_head.unwrap_or(true);
    let head = request_head(
        cx,
        conf,
        &req_uri,
        creq.as_ref().map(|_| (convert_head, revalidate.as_ref())),
        body_len,
    );
    let head_only = cx.method == Method::Head && (creq.is_none() || !convert_head);
    let send = Outgoing {
        head: &head,
        body: &out_body,
        policy: &policy,
        // nginx does not pass these to the next server once sent to one
        // (proxy_next_upstream without non_idempotent).
        non_idempotent: matches!(cx.req.method_raw(), "POST" | "LOCK" | "PATCH"),
        bind: bind_addr(cx, conf),
        keepalive: conf.socket_keepalive.unwrap_or(false),
    };
    let at = up.attempt_for(&*cx, cx.remote.map(|a| a.ip()));
    let got = fetch(cx, at, &up, &lim, &send, &req_uri, head_only).await;
    let use_stale = conf.cache_use_stale.unwrap_or(0);
    let mut resp = match got {
        Ok(r) => {
            if cx.http.main.vars.upstream_http {
                cx.upstream_headers = Some(r.headers.clone());
            }
            r
        }
        Err(e) => {
            // proxy_cache_use_stale: the expired entry instead of an error.
            if let Some(st) = stale.filter(|_| use_stale & e.ft != 0) {
                let r = entry_response(st.eh, st.file, &policy);
                return cache_answer(cx, conf, r, b"STALE");
            }
            return Response::status(e.status);
        }
    };
    if let Some(st) = stale.take() {
        let bit = ft::of_status(resp.status).unwrap_or(0);
        if use_stale & bit != 0 {
            let r = entry_response(st.eh, st.file, &policy);
            return cache_answer(cx, conf, r, b"STALE");
        }
        if resp.status == 304 && revalidate.is_some() {
            if let Some(c) = &creq {
                let r = refresh_entry(conf, c, &st.eh, st.file.meta.size, &resp.headers, &policy);
                if let Err(e) = r.await {
                    cx.log(
                        Level::Crit,
                        &format!(
                            "cache file \"{}\" could not be updated {}",
                            c.zone.file_path(&c.md5).display(),
                            crate::core::errno_text(&e)
                        ),
                    );
                }
            }
            let r = entry_response(st.eh, st.file, &policy);
            return cache_answer(cx, conf, r, b"REVALIDATED");
        }
    }
    let mut relayed = relay_headers(loc_prefix(cx), conf, Some(pass), &resp.headers, HIDDEN);
    rewrite_cookies(cx, conf, &mut relayed);
    if resp.status == 101 && cx.req.header("upgrade").is_some() && cx.sub_depth == 0 {
        return upgrade_answer(cx, resp, relayed, &lim, &req_uri);
    }
    let store = creq
        .as_ref()
        .filter(|c| !c.no_store)
        .and_then(|c| cache_validity(conf, resp.status, &resp.headers).map(|v| (c, v)));

    // The body: what came with the head is decoded now; a body complete
    // with it (and not being cached) is answered from memory, anything
    // else streams to the client while it arrives (see `Producer`).
    let url = upstream_url(lim.tls.is_some(), &resp.peer_name, &req_uri);
    let mut framing = Framing::of(&resp);
    let mut first = Vec::new();
    let buffering = buffering(conf, &resp.headers);
    // nginx reads what came with the head as part of the head without
    // buffering, and as the body with it.
    let early_context = if buffering {
        "while reading upstream"
    } else {
        "while reading response header from upstream"
    };
    if let Err(f) = framing.feed(&std::mem::take(&mut resp.early), &mut first) {
        log_upstream(cx, Level::Error, &with_context(&f.msg, early_context), &url);
        // nginx has "sent" the head already and closes the connection
        // without a word.
        let mut r = Response::status(f.status);
        r.close_silently = true;
        return r;
    }
    // (A HEAD answer's body is not read, even when upstream sends one.)
    if let Some(w) = framing.extra_warning().filter(|_| !head_only) {
        log_upstream(cx, Level::Warn, &format!("{} {}", w, early_context), &url);
    }
    if resp.status >= 300
        && conf.intercept_errors.unwrap_or(false)
        && has_error_page(loc, resp.status)
    {
        // proxy_intercept_errors: let error_page answer instead.
        return Response::status(resp.status);
    }
    let (mem_max, temp_max) = if buffering {
        (lim.mem_max, lim.temp_max)
    } else {
        (lim.head_max, 0)
    };
    // nginx does not cache what it does not buffer.
    let store = store.filter(|_| buffering);
    let cache_out = match &store {
        Some((c, valid_until)) => {
            let mut eh = entry_head(c, &resp, &relayed, *valid_until, 0);
            if let Some(n) = resp.declared_len.filter(|_| head_only) {
                // A HEAD response stored as such (proxy_cache_convert_head
                // off): its entry keeps the length it announced.
                eh.headers
                    .push(("Content-Length".into(), n.to_string().into_bytes()));
            }
            let base = eh.header_len() as u64;
            match start_cache_file(c, &policy).await {
                Ok((file, path)) => Some(CacheOut {
                    zone: c.zone.clone(),
                    md5: c.md5,
                    file,
                    path,
                    eh,
                    base,
                    written: 0,
                    held: None,
                    _guard: guard.take(),
                }),
                Err(e) => {
                    // The response is still served; it just is not stored.
                    cx.log(
                        Level::Crit,
                        &format!(
                            "cannot create cache temp file in \"{}\" {}",
                            c.zone.conf.path.display(),
                            crate::core::errno_text(&e)
                        ),
                    );
                    None
                }
            }
        }
        None => None,
    };

    // proxy_store: a 200 read whole goes to its own file as well.
    let store_to = conf.store.as_ref().and_then(|s| s.as_ref());
    let store_out = match store_to {
        Some(to)
            if cache_out.is_none()
                && resp.status == 200
                && buffering
                && !head_only
                && !resp.no_body =>
        {
            let dest = match to {
                StoreTo::Root => cx.request_filename(),
                StoreTo::Path(t) => t.render_vec(&*cx),
            };
            let dest = PathBuf::from(std::ffi::OsString::from_vec(dest));
            let dir = conf
                .temp_path
                .clone()
                .unwrap_or_else(|| pass.temp_default.clone());
            match named_temp(&dir, &policy).await {
                Ok((file, path)) => Some(StoreOut {
                    file,
                    path,
                    dest,
                    mode: conf.store_access.unwrap_or(0o600),
                    mtime: header(&resp.headers, "last-modified")
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .and_then(|s| httpdate::parse_http_date(s.trim()).ok()),
                    written: 0,
                }),
                Err(e) => {
                    cx.log(
                        Level::Crit,
                        &format!(
                            "cannot create temp file in \"{}\" {}",
                            dir.display(),
                            crate::core::errno_text(&e)
                        ),
                    );
                    None
                }
            }
        }
        _ => None,
    };

    let mut out = Response::status(resp.status);
    if !resp.status_line.is_empty() {
        out.status_line = Some((resp.status, std::mem::take(&mut resp.status_line)));
    }
    apply_headers(&mut out, relayed);
    // As nginx: only a response being cached answers If-Modified-Since
    // and the like itself; any other goes as upstream answered.
    out.disable_not_modified = store.is_none();
    if conf.ignore_headers.unwrap_or(0) & IGN_X_ACCEL_CHARSET == 0 {
        // The charset filter's destination; nginx takes the last one.
        out.override_charset = resp
            .headers
            .iter()
            .rev()
            .find(|(n, _)| n.eq_ignore_ascii_case("x-accel-charset"))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    }
    if conf.ignore_headers.unwrap_or(0) & IGN_X_ACCEL_LIMIT_RATE == 0 {
        // The response's rate in bytes per second (nginx's ngx_atoi: digits
        // only; each valid header sets it, so the last one wins).
        if let Some(n) = resp
            .headers
            .iter()
            .rev()
            .filter(|(n, _)| n.eq_ignore_ascii_case("x-accel-limit-rate"))
            .filter_map(|(_, v)| {
                let v = std::str::from_utf8(v).ok()?;
                v.bytes()
                    .all(|c| c.is_ascii_digit())
                    .then(|| v.parse::<u64>().ok())
                    .flatten()
            })
            .next()
        {
            cx.set_note(super::rewrite::LIMIT_RATE, n.to_string());
        }
    }
    // Ranges, as nginx: a response being cached may be cut to one range
    // when upstream allows ranges, proxy_force_ranges cuts any; anything
    // else passes as it came (the Range header went upstream).
    if conf.force_ranges.unwrap_or(false) {
        force_ranges(&mut out);
    } else if store.is_some() {
        out.single_range = true;
    } else {
        out.ranges_off = true;
    }
    if head_only && cache_out.is_none() {
        out.content_length = resp.declared_len;
        out.body = Body::Bytes(Vec::new());
        return out;
    }
    if resp.no_body && cache_out.is_none() {
        out.body = Body::Bytes(Vec::new());
        return out;
    }
    if framing.done() && cache_out.is_none() && store_out.is_none() {
        if reusable(&resp, &framing) {
            if let Some(s) = resp.stream.take() {
                up.put_idle(resp.peer.clone(), s, resp.requests);
            }
        }
        match framing.length {
            Some(_) => {
                out.content_length = Some(first.len() as u64);
                out.body = Body::Bytes(first);
            }
            None => {
                // Chunked from upstream: nginx does not know the length
                // before the end either, and relays it chunked.
                out.force_close = cx.req.minor == 0;
                out.body = complete_stream(first, policy);
            }
        }
        return out;
    }
    let Some(stream) = resp.stream.take() else {
        log_upstream(cx, Level::Error, "upstream connection lost", &url);
        return Response::status(502);
    };
    out.content_length = framing.length;
    if out.content_length.is_none() && cx.req.minor == 0 {
        // An HTTP/1.0 client learns the end from the close.
        out.force_close = true;
    }
    let pipe = Arc::new(Pipe::default());
    if let Some(c) = &cache_out {
        pipe.lock().file = Some(c.file.clone());
    }
    let keep = reusable(&resp, &framing).then(|| (up.clone(), resp.peer.clone(), resp.requests));
    let producer = Producer {
        pipe: pipe.clone(),
        stream,
        _lease: resp.lease.take(),
        framing,
        read_timeout: lim.read,
        mem_max,
        temp_max,
        temp_dir: conf
            .temp_path
            .clone()
            .unwrap_or_else(|| pass.temp_default.clone()),
        policy: policy.clone(),
        temp: None,
        temp_len: 0,
        cache: cache_out,
        keep,
        log: UpLog::of(cx, &url),
        limit_rate: conf.limit_rate.unwrap_or(0),
        store: store_out,
    };
    tokio::spawn(producer.run(first));
    if resp.no_body {
        // Stored all the same (an empty entry); the client needs nothing.
        out.content_length = if head_only { resp.declared_len } else { None };
        out.force_close = false;
        out.body = Body::Bytes(Vec::new());
        return out;
    }
    out.body = Body::Stream(Box::new(Consumer { pipe, policy }));
    out.watch_client = !conf.ignore_client_abort.unwrap_or(false);
    out
}

/// A 101 to a request with an `Upgrade` header (any value, any HTTP
/// version: nginx's test is the header's presence): the head is relayed
/// (with the upstream's Content-Length, if any, though nothing is framed
/// by it) and the connection turns into a tunnel (crate::http::tunnel).
fn upgrade_answer(
    cx: &mut Ctx<'_>,
    mut resp: UpResp,
    relayed: Vec<(String, Vec<u8>)>,
    lim: &Limits,
    req_uri: &[u8],
) -> Response {
    let url = upstream_url(lim.tls.is_some(), &resp.peer_name, req_uri);
    let Some(up) = resp.stream.take() else {
        log_upstream(cx, Level::Error, "upstream connection lost", &url);
        return Response::status(502);
    };
    let mut out = Response::status(101);
    if !resp.status_line.is_empty() {
        out.status_line = Some((101, std::mem::take(&mut resp.status_line)));
    }
    apply_headers(&mut out, relayed);
    out.content_length = resp.declared_len;
    out.disable_not_modified = true;
    out.ranges_off = true;
    out.force_close = true;
    out.upgrade = Some(Box::new(crate::http::tunnel::Upgrade {
        up,
        early: std::mem::take(&mut resp.early),
        read_timeout: lim.read,
        send_timeout: lim.send,
        buffer: lim.head_max,
        url,
        _lease: resp.lease.take(),
    }));
    out
}

/// Opens the cache temp file next to the entry's final path.
async fn start_cache_file(c: &CacheReq, policy: &Policy) -> io::Result<(Arc<File>, PathBuf)> {
    c.zone.ensure_ready().await?;
    let path = c.zone.temp_path(&c.md5);
    let f = create_file(path.clone(), policy).await?;
    Ok((f, path))
}

/// A response from the cache (HIT, STALE, UPDATING, REVALIDATED).
fn cache_answer(cx: &mut Ctx<'_>, conf: &ProxyLoc, mut r: Response, status: &[u8]) -> Response {
    cx.set_note("upstream_cache_status", status.to_vec());
    if cx.method != Method::Head && matches!(&r.body, Body::Bytes(b) if b.is_empty()) {
        // Only a HEAD may be told the length of a body the entry lacks.
        r.content_length = Some(0);
    }
    if conf.force_ranges.unwrap_or(false) {
        force_ranges(&mut r);
        r.single_range = false;
    }
    r
}

/// proxy_buffering, unless upstream says otherwise (X-Accel-Buffering).
pub(crate) fn buffering(conf: &ProxyLoc, hs: &[(String, Vec<u8>)]) -> bool {
    let mut buffering = conf.buffering.unwrap_or(true);
    if conf.ignore_headers.unwrap_or(0) & IGN_X_ACCEL_BUFFERING == 0 {
        match header(hs, "x-accel-buffering") {
            Some(v) if v.eq_ignore_ascii_case(b"yes") => buffering = true,
            Some(v) if v.eq_ignore_ascii_case(b"no") => buffering = false,
            _ => {}
        }
    }
    buffering
}

/// A 304 answered a revalidation (`proxy_cache_revalidate`): the entry
/// gets a new validity (as nginx: what the 304's headers say, else what
/// the entry's own headers and `proxy_cache_valid` say for its status)
/// written into its file in place, and the zone learns it.
async fn refresh_entry(
    conf: &ProxyLoc,
    c: &CacheReq,
    eh: &EntryHead,
    size: u64,
    hs: &[(String, Vec<u8>)],
    policy: &Policy,
) -> io::Result<()> {
    let now = cache::now_secs();
    let valid = match header_validity(conf, hs, now) {
        Some(Some(t)) => Some(t),
        _ => cache_validity(conf, eh.status, &eh.headers),
    };
    let Some(valid) = valid else {
        return Ok(());
    };
    let path = c.zone.file_path(&c.md5);
    cache::blocking(policy, move || {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path)?;
        f.write_all_at(&cache::file::EntryHead::times(valid, now), 16)
    })
    .await?;
    c.zone.insert(c.md5, valid, disk_bytes(size));
    Ok(())
}

/// `proxy_cache_background_update`: the stale entry is being served; a
/// task of its own fetches the response again and stores it, as nginx's
/// background subrequest does. It holds the key's `updating` mark until
/// the new entry is in place.
#[allow(clippy::too_many_arguments)]
fn background_update(
    cx: &Ctx<'_>,
    loc: &Arc<LocConf>,
    pass: &Arc<Pass>,
    up: &Arc<Upstream>,
    lim: &Limits,
    policy: &Policy,
    c: CacheReq,
    g: cache::UpdateGuard,
    stale: Option<&EntryHead>,
) {
    let conf = &loc.modules.proxy;
    let uri = upstream_uri(cx, pass);
    let (body, body_len) = outgoing_body(cx, conf);
    let convert_head = conf.cache_convert_head.unwrap_or(true);
    let validators = stale
        .filter(|_| conf.cache_revalidate.unwrap_or(false))
        .map(validators)
        .filter(|v| v.0.is_some() || v.1.is_some());
    let head = request_head(
        cx,
        conf,
        &uri,
        Some((convert_head, validators.as_ref())),
        body_len,
    );
    let job = Background {
        loc: loc.clone(),
        pass: pass.clone(),
        up: up.clone(),
        lim: lim.clone(),
        policy: policy.clone(),
        head_only: cx.method == Method::Head && !convert_head,
        non_idempotent: matches!(cx.req.method_raw(), "POST" | "LOCK" | "PATCH"),
        bind: bind_addr(cx, conf),
        keepalive: conf.socket_keepalive.unwrap_or(false),
        at: up.attempt_for(cx, cx.remote.map(|a| a.ip())),
        prefix: loc_prefix(cx).to_vec(),
        log: UpLog::of(cx, ""),
        stale: validators.and(stale.cloned()),
        c,
        g,
        uri,
        body,
        head,
    };
    tokio::spawn(job.run());
}

/// A background cache update, with all it needs from the request.
struct Background {
    loc: Arc<LocConf>,
    pass: Arc<Pass>,
    up: Arc<Upstream>,
    lim: Limits,
    policy: Policy,
    c: CacheReq,
    g: cache::UpdateGuard,
    uri: Vec<u8>,
    body: OutBody,
    head: Vec<u8>,
    head_only: bool,
    non_idempotent: bool,
    bind: Option<std::net::IpAddr>,
    keepalive: bool,
    at: upstream::Attempt,
    prefix: Vec<u8>,
    log: UpLog,
    /// The entry being refreshed, when it is revalidated.
    stale: Option<EntryHead>,
}

impl Background {
    async fn run(self) {
        let Background {
            loc,
            pass,
            up,
            lim,
            policy,
            c,
            g,
            uri,
            body,
            head,
            head_only,
            non_idempotent,
            bind,
            keepalive,
            at,
            prefix,
            mut log,
            stale,
        } = self;
        let conf = &loc.modules.proxy;
        let send = Outgoing {
            head: &head,
            body: &body,
            policy: &policy,
            non_idempotent,
            bind,
            keepalive,
        };
        let Ok(mut resp) = fetch(&mut log, at, &up, &lim, &send, &uri, head_only).await else {
            return;
        };
        let url = upstream_url(lim.tls.is_some(), &resp.peer_name, &uri);
        log.upstream = format!(", upstream: \"{}\"", url);
        if let (304, Some(eh)) = (resp.status, &stale) {
            let size = (eh.header_len() as u64).saturating_add(eh.body_len);
            if let Err(e) = refresh_entry(conf, &c, eh, size, &resp.headers, &policy).await {
                log.log(
                    Level::Crit,
                    &format!(
                        "cache file could not be updated {}",
                        crate::core::errno_text(&e)
                    ),
                    false,
                );
            }
            return;
        }
        if c.no_store || !buffering(conf, &resp.headers) {
            return;
        }
        let Some(valid) = cache_validity(conf, resp.status, &resp.headers) else {
            return;
        };
        let relayed = relay_headers(&prefix, conf, Some(&pass), &resp.headers, HIDDEN);
        let mut framing = Framing::of(&resp);
        let mut first = Vec::new();
        if framing
            .feed(&std::mem::take(&mut resp.early), &mut first)
            .is_err()
        {
            return;
        }
        let Some(stream) = resp.stream.take() else {
            return;
        };
        let eh = entry_head(&c, &resp, &relayed, valid, 0);
        let base = eh.header_len() as u64;
        let (file, path) = match start_cache_file(&c, &policy).await {
            Ok(fp) => fp,
            Err(e) => {
                log.log(
                    Level::Crit,
                    &format!(
                        "cannot create cache temp file in \"{}\" {}",
                        c.zone.conf.path.display(),
                        crate::core::errno_text(&e)
                    ),
                    false,
                );
                return;
            }
        };
        // Nobody reads this pipe: the body only goes into the entry.
        let pipe = Arc::new(Pipe::default());
        {
            let mut p = pipe.lock();
            p.gone = true;
            p.file = Some(file.clone());
        }
        let keep =
            reusable(&resp, &framing).then(|| (up.clone(), resp.peer.clone(), resp.requests));
        let producer = Producer {
            pipe,
            stream,
            _lease: resp.lease.take(),
            framing,
            read_timeout: lim.read,
            mem_max: lim.mem_max,
            temp_max: 0,
            temp_dir: PathBuf::new(),
            policy: policy.clone(),
            temp: None,
            temp_len: 0,
            cache: Some(CacheOut {
                zone: c.zone.clone(),
                md5: c.md5,
                file,
                path,
                eh,
                base,
                written: 0,
                held: None,
                _guard: Some(g),
            }),
            keep,
            log,
            limit_rate: conf.limit_rate.unwrap_or(0),
            store: None,
        };
        producer.run(first).await;
    }
}

/// `proxy_force_ranges`: upstream's `Accept-Ranges` gives way to the
/// range filter's mark (the filter writes its own header), one range at most.
pub(crate) fn force_ranges(r: &mut Response) {
    r.remove_header("accept-ranges");
    r.headers
        .push((Cow::Borrowed("Accept-Ranges"), b"bytes".to_vec()));
    r.single_range = true;
}

pub(crate) fn has_error_page(loc: &LocConf, status: u16) -> bool {
    loc.modules.error_page.find(status).is_some()
}

fn any_true(cx: &Ctx<'_>, list: Option<&Vec<Template>>) -> bool {
    list.is_some_and(|l| {
        l.iter().any(|t| {
            let v = t.render_vec(cx);
            !v.is_empty() && v != b"0"
        })
    })
}

/// The upstream for this request (`upstream` block, or the host itself).
async fn upstream_of(cx: &Ctx<'_>, pass: &Pass) -> Option<Arc<Upstream>> {
    upstream_for(cx, &pass.target, &pass.host).await
}

/// The upstream of a `Target` (`host`: the implicit upstream's name).
pub(crate) async fn upstream_for(
    cx: &Ctx<'_>,
    target: &Target,
    host: &[u8],
) -> Option<Arc<Upstream>> {
    match target {
        Target::Fixed(u) => Some(u.clone()),
        Target::Named {
            name,
            port,
            resolved,
        } => {
            if let Some(u) = cx.http.main.modules.upstream.upstreams.get(name) {
                return Some(u.clone());
            }
            if let Some(r) = resolved.get() {
                return r.clone();
            }
            // getaddrinfo blocks: tokio runs it on its resolver threads.
            let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((name.as_str(), *port)).await
            {
                Ok(a) => a.collect(),
                Err(_) => Vec::new(),
            };
            let u = if addrs.is_empty() {
                cx.log(
                    Level::Error,
                    &format!("host not found in upstream \"{}\"", name),
                );
                None
            } else {
                Some(Arc::new(Upstream::implicit(
                    &String::from_utf8_lossy(host),
                    addrs,
                )))
            };
            let _ = resolved.set(u.clone());
            u
        }
    }
}

enum Lookup {
    Hit(Box<Response>),
    /// Expired; the entry itself when its file is intact (what
    /// `proxy_cache_use_stale` serves and `proxy_cache_revalidate` asks
    /// about).
    Expired(Option<Stale>),
    Miss,
}

/// An expired entry, open.
struct Stale {
    eh: EntryHead,
    file: Arc<OpenFile>,
}

/// Looks `md5` up in the zone and, when valid, opens its file.
async fn lookup(
    cx: &mut Ctx<'_>,
    z: &Arc<Zone>,
    md5: &[u8; 16],
    key: &[u8],
    policy: &Policy,
) -> Lookup {
    let now = cache::now_secs();
    let node = z.touch(md5);
    // The loader has seen the whole tree: no node, no file.
    if node.is_none() && z.loaded.load(std::sync::atomic::Ordering::Acquire) {
        return Lookup::Miss;
    }
    let path = z.file_path(md5);
    let f = match crate::io::open(&path, policy).await {
        Ok(f) => f,
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                cx.log(
                    Level::Crit,
                    &format!(
                        "open() \"{}\" failed {}",
                        path.display(),
                        crate::core::errno_text(&e)
                    ),
                );
            }
            if node.is_some() {
                z.remove(md5);
            }
            return Lookup::Miss;
        }
    };
    let eh = match read_entry_head(&f, policy).await {
        Ok(h)
            if h.key == key
                && (h.header_len() as u64).checked_add(h.body_len) == Some(f.meta.size) =>
        {
            h
        }
        Err(cache::file::ParseError::Version) => {
            cx.log(
                Level::Info,
                &format!("cache file \"{}\" version mismatch", path.display()),
            );
            z.remove(md5);
            return Lookup::Miss;
        }
        Ok(h) if h.key != key => {
            cx.log(
                Level::Crit,
                &format!("cache file \"{}\" has md5 collision", path.display()),
            );
            z.remove(md5);
            return Lookup::Miss;
        }
        _ => {
            // Never serve a file that is not a complete entry.
            cx.log(
                Level::Crit,
                &format!("cache file \"{}\" is invalid", path.display()),
            );
            z.remove(md5);
            return Lookup::Miss;
        }
    };
    if node.is_none() {
        z.insert(*md5, eh.valid_until, disk_bytes(f.meta.size));
    }
    // Expired once its second is over, as nginx (`valid_sec < now`).
    if eh.valid_until < now {
        return Lookup::Expired(Some(Stale { eh, file: f }));
    }
    Lookup::Hit(Box::new(entry_response(eh, f, policy)))
}

/// The response a cache entry holds (its body read from the file).
fn entry_response(eh: EntryHead, f: Arc<OpenFile>, policy: &Policy) -> Response {
    let off = eh.header_len() as u64;
    let len = eh.body_len;
    let mut r = Response::status(eh.status);
    if !eh.status_line.is_empty() {
        // The line as upstream sent it, as nginx serves a hit.
        r.status_line = Some((eh.status, eh.status_line));
    }
    r.last_modified = eh.last_modified;
    let announced = header(&eh.headers, "content-length")
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
    apply_headers(&mut r, eh.headers);
    r.content_length = Some(len).filter(|n| *n > 0).or(announced).or(Some(0));
    r.body = if len == 0 {
        Body::Bytes(Vec::new())
    } else {
        r.io = Some(policy.clone());
        Body::File {
            file: f,
            offset: off,
            len,
        }
    };
    r
}

/// Bytes a file of `size` occupies (4k blocks), for max_size accounting.
fn disk_bytes(size: u64) -> u64 {
    size.div_ceil(4096) * 4096
}

async fn read_entry_head(
    f: &Arc<OpenFile>,
    policy: &Policy,
) -> Result<EntryHead, cache::file::ParseError> {
    use cache::file::ParseError;
    let mut want = 4096usize;
    for _ in 0..2 {
        let b = crate::io::read(f, 0, want, policy)
            .await
            .map_err(|_| ParseError::Bad)?;
        match EntryHead::parse(&b) {
            Ok(h) => return Ok(h),
            Err(ParseError::Need(n)) if n > want && (n as u64) <= f.meta.size => want = n,
            Err(ParseError::Need(_)) => return Err(ParseError::Bad),
            Err(e) => return Err(e),
        }
    }
    Err(ParseError::Bad)
}

/// Moves relayed headers into a response (Content-Type to its field).
pub(crate) fn apply_headers(r: &mut Response, headers: Vec<(String, Vec<u8>)>) {
    for (n, v) in headers {
        if n.eq_ignore_ascii_case("content-length") {
            // Only a stored HEAD response has one; see entry_response.
            continue;
        }
        if n.eq_ignore_ascii_case("content-type") {
            r.content_type = Some(String::from_utf8_lossy(&v).into_owned());
            r.charset_param = true;
        } else if n.eq_ignore_ascii_case("last-modified") {
            // Relayed as it came, in its place (as nginx); the filters
            // (not_modified, If-Range, expires modified) get the time of
            // the last one.
            r.last_modified = std::str::from_utf8(&v)
                .ok()
                .and_then(|s| httpdate::parse_http_date(s).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs() as i64);
            r.last_modified_listed = true;
            r.headers.push((Cow::Owned(n), v));
        } else {
            r.headers.push((Cow::Owned(n), v));
        }
    }
}

/// The URI sent upstream: the client's as sent when unchanged, else the
/// current URI (escaped) with the location prefix replaced by the
/// proxy_pass URI, plus the args.
fn upstream_uri(cx: &Ctx<'_>, pass: &Pass) -> Vec<u8> {
    let unchanged = *cx.uri == *cx.req.uri()
        && cx.args.as_deref() == cx.req.args()
        && cx.req.raw_uri().starts_with(b"/");
    let mut out = Vec::new();
    match &pass.uri {
        None if unchanged => return cx.req.raw_uri().to_vec(),
        None => crate::http::uri::escape_uri(&cx.uri, &mut out),
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

/// What goes upstream after the head.
#[derive(Clone)]
pub(crate) enum OutBody {
    None,
    Mem(Bytes),
    /// A client body in its temp file (read back for every attempt).
    File(Arc<OpenFile>, u64),
}

/// One request as sent to each peer tried: the body is buffered, so a
/// retry sends it again.
pub(crate) struct Outgoing<'o> {
    pub(crate) head: &'o [u8],
    pub(crate) body: &'o OutBody,
    pub(crate) policy: &'o Policy,
    /// POST, LOCK, PATCH: not passed to another peer once sent.
    pub(crate) non_idempotent: bool,
    /// `proxy_bind`'s address for this request.
    pub(crate) bind: Option<std::net::IpAddr>,
    /// `proxy_socket_keepalive`.
    pub(crate) keepalive: bool,
}

/// `proxy_bind`'s address for a request (an unusable rendered value is
/// logged and ignored, as nginx does).
pub(crate) fn bind_addr(cx: &Ctx<'_>, conf: &ProxyLoc) -> Option<std::net::IpAddr> {
    match conf.bind.as_ref()?.as_ref()? {
        BindAddr::Fixed(a) => Some(*a),
        BindAddr::Var(t) => {
            let v = t.render_vec(cx);
            if v.is_empty() {
                return None;
            }
            let a = std::str::from_utf8(&v).ok().and_then(parse_bind);
            if a.is_none() {
                cx.log(
                    Level::Error,
                    &format!("invalid local address \"{}\"", String::from_utf8_lossy(&v)),
                );
            }
            a
        }
    }
}

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
    if !conf.pass_request_body.unwrap_or(true) {
        return (OutBody::None, len);
    }
    let out = match body::data(cx) {
        Some(body::Data::Mem(b)) if !b.is_empty() => OutBody::Mem(b.clone()),
        Some(body::Data::File { file, len, .. }) if *len > 0 => OutBody::File(file.clone(), *len),
        _ => OutBody::None,
    };
    (out, len)
}

/// The validators of a cached entry for a revalidation request:
/// `If-Modified-Since` (its Last-Modified) and `If-None-Match` (its ETag).
type Validators = (Option<Vec<u8>>, Option<Vec<u8>>);

fn validators(eh: &EntryHead) -> Validators {
    let lm = header(&eh.headers, "last-modified")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|s| httpdate::parse_http_date(s.trim()).ok())
        .map(|t| httpdate::fmt_http_date(t).into_bytes());
    let etag = header(&eh.headers, "etag").map(|v| v.to_vec());
    (lm, etag)
}

/// The request head for upstream. `caching`: the request may be answered
/// from or stored in the cache: whether HEAD becomes GET
/// (`proxy_cache_convert_head`), and the validators to revalidate an
/// expired entry with.
fn request_head(
    cx: &Ctx<'_>,
    conf: &ProxyLoc,
    uri: &[u8],
    caching: Option<(bool, Option<&Validators>)>,
    body_len: Option<u64>,
) -> Vec<u8> {
    let convert_head = caching.is_some_and(|c| c.0);
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
            // The body is buffered whole, so its length is known even
            // when the client sent it chunked: never Transfer-Encoding.
            "content-length" => {
                if let Some(n) = body_len {
                    push_header(&mut h, b"Content-Length", n.to_string().as_bytes());
                }
            }
            _ => {}
        }
        set_names.push(d.to_string());
    }
    // nginx's defaults when caching: If-Modified-Since
    // $upstream_cache_last_modified, If-None-Match $upstream_cache_etag
    // (set only while revalidating), the other conditionals cleared.
    if let Some((_, Some((lm, etag)))) = caching {
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
    if conf.pass_request_headers.unwrap_or(true) {
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

/// A failure with its status (502/504) and error-log text.
pub(crate) struct Fail {
    pub(crate) status: u16,
    pub(crate) msg: String,
    /// Which `proxy_next_upstream` case this is ([`ft`]; 0: never retried,
    /// e.g. after part of a response was received).
    pub(crate) ft: u16,
    /// The request had started to go out (nginx's `request_sent`).
    pub(crate) sent: bool,
    /// FastCGI: what came on stderr before the failure (logged).
    pub(crate) stderr: Vec<Vec<u8>>,
}

pub(crate) fn fail(status: u16, msg: impl Into<String>, next: bool) -> Fail {
    Fail {
        status,
        msg: msg.into(),
        ft: match (next, status) {
            (false, _) => 0,
            (true, 504) => ft::TIMEOUT,
            (true, _) => ft::ERROR,
        },
        sent: false,
        stderr: Vec::new(),
    }
}

/// An upstream response head nginx counts as `invalid_header`.
pub(crate) fn invalid_header(msg: &str) -> Fail {
    Fail {
        ft: ft::INVALID_HEADER,
        ..fail(502, msg, false)
    }
}

/// `msg` (said `... while reading upstream`) with another context.
fn with_context(msg: &str, context: &str) -> String {
    match msg.strip_suffix("while reading upstream") {
        Some(m) => format!("{}{}", m, context),
        None => msg.to_string(),
    }
}

pub(crate) const TIMED_OUT: &str = "upstream timed out (110: Connection timed out)";

/// One read from the upstream within `limit`: 504 on timeout, 502 on an
/// error, with nginx's log wording (`... while reading upstream`).
pub(crate) async fn timed_read(
    s: &mut UpStream,
    buf: &mut [u8],
    limit: Duration,
    context: &str,
    next: bool,
) -> Result<usize, Fail> {
    match tokio::time::timeout(limit, s.read(buf)).await {
        Err(_) => Err(fail(504, format!("{} {}", TIMED_OUT, context), next)),
        Ok(Err(e)) => Err(fail(
            502,
            format!("recv() failed {} {}", crate::core::errno_text(&e), context),
            next,
        )),
        Ok(Ok(n)) => Ok(n),
    }
}

/// A response head from upstream, with the connection to read the body from.
pub(crate) struct UpResp {
    pub(crate) status: u16,
    pub(crate) minor: u8,
    /// The status line after the version as upstream sent it (`302
    /// Found`), relayed verbatim as nginx does; empty: tern's own.
    pub(crate) status_line: Vec<u8>,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) stream: Option<UpStream>,
    /// Body bytes that came with the head.
    pub(crate) early: Vec<u8>,
    pub(crate) peer: PeerAddr,
    pub(crate) peer_name: String,
    /// Requests the connection has carried, this one included
    /// (`keepalive_requests`).
    pub(crate) requests: u64,
    /// No body follows (HEAD, 1xx, 204, 304).
    pub(crate) no_body: bool,
    /// The Content-Length upstream declared (for HEAD answers).
    pub(crate) declared_len: Option<u64>,
    /// The peer counts as busy (least_conn, max_conns) while this lives:
    /// it moves to the body's producer.
    pub(crate) lease: Option<upstream::Lease>,
    /// FastCGI: the record decoder, in the middle of the stream.
    pub(crate) fcgi: Option<super::fastcgi::Decoder>,
    /// FastCGI: what came on stderr with the head (logged by [`fetch`]).
    pub(crate) stderr: Vec<Vec<u8>>,
}

/// Where [`fetch`] records `$upstream_addr`/`$upstream_status` and logs:
/// the request, or (a background cache update) only the log.
pub(crate) trait FetchEnv {
    fn note(&mut self, key: &'static str, v: &[u8]);
    fn log_up(&self, level: Level, msg: &str, url: &str);
}

impl FetchEnv for Ctx<'_> {
    fn note(&mut self, key: &'static str, v: &[u8]) {
        append_note(self, key, v);
    }

    fn log_up(&self, level: Level, msg: &str, url: &str) {
        log_upstream(self, level, msg, url);
    }
}

impl FetchEnv for UpLog {
    fn note(&mut self, _: &'static str, _: &[u8]) {}

    fn log_up(&self, level: Level, msg: &str, url: &str) {
        self.logger.log(
            level,
            Some(self.conn),
            format_args!("{}{}, upstream: \"{}\"{}", msg, self.tail, url, self.host),
        );
    }
}

/// Why [`fetch`] gave up: the status for the client and the
/// `proxy_next_upstream` case of the last failure (0: none).
pub(crate) struct FetchErr {
    pub(crate) status: u16,
    pub(crate) ft: u16,
}

/// Tries peers until one answers with a response head.
pub(crate) async fn fetch<E: FetchEnv>(
    cx: &mut E,
    mut at: upstream::Attempt,
    up: &Arc<Upstream>,
    lim: &Limits,
    send: &Outgoing<'_>,
    uri: &[u8],
    head_only: bool,
) -> Result<UpResp, FetchErr> {
    let started = std::time::Instant::now();
    let mut tries_left = match lim.next_tries {
        0 => up.tries(),
        n => up.tries().min(n as usize),
    };
    // Whether the case `bit` may go on to the next peer (nginx's
    // ngx_http_upstream_next checks, in its order).
    let may_retry = |bit: u16, sent: bool, tries_left: usize| {
        let mut need = bit;
        if sent && send.non_idempotent {
            need |= ft::NON_IDEMPOTENT;
        }
        bit != 0
            && tries_left > 0
            && lim.next_mask & need == need
            && lim.next_timeout.is_none_or(|t| started.elapsed() < t)
    };
    while let Some(lease) = up.next(&mut at) {
        let pid = lease.id();
        let Some(peer) = up.peer(pid) else { break };
        tries_left = tries_left.saturating_sub(1);
        cx.note("upstream_addr", peer.name.as_bytes());
        let url = lim.url(&peer.name, uri);
        let got = exchange(up, &peer.addr, lim, send, head_only).await;
        let stderr = match &got {
            Ok(r) => &r.stderr,
            Err(f) => &f.stderr,
        };
        for e in stderr {
            cx.log_up(Level::Error, &super::fastcgi::stderr_msg(e, true), &url);
        }
        match got {
            Ok(mut r) => {
                let bit = ft::of_status(r.status).unwrap_or(0);
                if may_retry(bit, true, tries_left) {
                    // The answer goes unread; 403 and 404 do not count
                    // against the peer, the others do.
                    cx.note("upstream_status", r.status.to_string().as_bytes());
                    if bit & (ft::HTTP_403 | ft::HTTP_404) == 0 && up.failed(pid) {
                        cx.log_up(
                            Level::Warn,
                            "upstream server temporarily disabled while reading response header from upstream",
                            &url,
                        );
                    }
                    continue;
                }
                cx.note("upstream_status", r.status.to_string().as_bytes());
                up.succeeded(pid);
                r.peer_name = peer.name.clone();
                r.lease = Some(lease);
                return Ok(r);
            }
            Err(f) => {
                // 500: tern's own failure (proxy_bind, the body's temp
                // file), logged as nginx does such, and not the peer's.
                let local = f.status == 500;
                let level = if local { Level::Crit } else { Level::Error };
                // An empty message: already said (fastcgi_catch_stderr's
                // line is the stderr itself, as nginx logs it).
                if !f.msg.is_empty() {
                    cx.log_up(level, &f.msg, &url);
                }
                cx.note("upstream_status", f.status.to_string().as_bytes());
                if !local && up.failed(pid) {
                    cx.log_up(
                        Level::Warn,
                        "upstream server temporarily disabled while connecting to upstream",
                        &url,
                    );
                }
                if !may_retry(f.ft, f.sent, tries_left) {
                    return Err(FetchErr {
                        status: f.status,
                        ft: f.ft,
                    });
                }
            }
        }
    }
    // Peers were left to try, but none can be used now: nginx records a
    // pseudo-attempt named after the upstream.
    let url = lim.url(&up.name, uri);
    cx.log_up(
        Level::Error,
        "no live upstreams while connecting to upstream",
        &url,
    );
    cx.note("upstream_addr", up.name.as_bytes());
    cx.note("upstream_status", b"502");
    // nginx's NOLIVE case, which `proxy_cache_use_stale error` includes.
    Err(FetchErr {
        status: 502,
        ft: ft::ERROR,
    })
}

impl Limits {
    /// The `upstream: "..."` of error-log lines: nginx names the peer
    /// with the scheme, and (HTTP only) the URI.
    pub(crate) fn url(&self, peer: &str, uri: &[u8]) -> String {
        match self.fcgi {
            Some(_) => format!("fastcgi://{}", peer),
            None => upstream_url(self.tls.is_some(), peer, uri),
        }
    }
}

fn upstream_url(tls: bool, peer: &str, uri: &[u8]) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("{}://{}{}", scheme, peer, String::from_utf8_lossy(uri))
}

/// One attempt on one peer: connect (or reuse), send, read the head.
async fn exchange(
    up: &Upstream,
    addr: &PeerAddr,
    lim: &Limits,
    send: &Outgoing<'_>,
    head_only: bool,
) -> Result<UpResp, Fail> {
    // A cached connection may have been closed by the peer meanwhile; an
    // error on it is retried once on a fresh connection without blaming
    // the peer, as nginx does. A timeout is not a stale connection (the
    // peer may be working on the request): as nginx, it is the attempt's
    // result, and is not sent again here.
    // A kept connection of the other kind (plain vs TLS) is closed.
    if let Some((s, served)) = up
        .take_idle(addr)
        .filter(|(s, _)| s.is_tls() == lim.tls.is_some())
    {
        match send_and_read(s, addr, lim, send, head_only).await {
            Ok(r) => {
                return Ok(UpResp {
                    requests: served + 1,
                    ..r
                })
            }
            Err(f) if f.status == 504 => return Err(Fail { sent: true, ..f }),
            Err(_) => {}
        }
    }
    let s = match tokio::time::timeout(lim.connect, connect(addr, send)).await {
        Err(_) => {
            return Err(fail(
                504,
                format!("{} while connecting to upstream", TIMED_OUT),
                true,
            ))
        }
        Ok(Err(e)) => {
            // proxy_bind's failure carries its own words (nginx's
            // "bind(ADDR) failed (...)").
            if let Some(m) = e
                .get_ref()
                .map(|m| m.to_string())
                .filter(|m| m.starts_with("bind("))
            {
                // A local failure, as nginx: 500, not the peer's fault,
                // no next server.
                return Err(fail(
                    500,
                    format!("{} while connecting to upstream", m),
                    false,
                ));
            }
            return Err(fail(
                502,
                format!(
                    "connect() failed {} while connecting to upstream",
                    crate::core::errno_text(&e)
                ),
                true,
            ));
        }
        Ok(Ok(s)) => s,
    };
    let s = match (s, &lim.tls) {
        (s, None) => s,
        (UpStream::Plain(s), Some((cfg, name))) => {
            let hs = crate::tls::client::connect(s, cfg.clone(), name.clone());
            match tokio::time::timeout(lim.connect, hs).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return Err(fail(
                        502,
                        format!(
                            "SSL_do_handshake() failed ({}) while SSL handshaking to upstream",
                            e
                        ),
                        true,
                    ))
                }
                Err(_) => {
                    return Err(fail(
                        504,
                        format!("{} while SSL handshaking to upstream", TIMED_OUT),
                        true,
                    ))
                }
            }
        }
        (_, Some(_)) => {
            return Err(fail(
                502,
                "SSL to a unix-domain upstream is not supported by tern yet while SSL handshaking to upstream",
                false,
            ))
        }
    };
    send_and_read(s, addr, lim, send, head_only)
        .await
        .map_err(|f| Fail { sent: true, ..f })
}

/// A new connection to `addr`, from `proxy_bind`'s address, with
/// `proxy_socket_keepalive` (a unix-domain socket takes neither).
async fn connect(addr: &PeerAddr, send: &Outgoing<'_>) -> io::Result<UpStream> {
    let addr = match addr {
        PeerAddr::Unix(p) => return Ok(UpStream::Unix(tokio::net::UnixStream::connect(p).await?)),
        PeerAddr::Inet(a) => *a,
    };
    let s = connect_tcp(addr, send).await?;
    let _ = s.set_nodelay(true);
    Ok(UpStream::Plain(s))
}

async fn connect_tcp(addr: SocketAddr, send: &Outgoing<'_>) -> io::Result<TcpStream> {
    if send.bind.is_none() && !send.keepalive {
        return TcpStream::connect(addr).await;
    }
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if send.keepalive {
        sock.set_keepalive(true)?;
    }
    if let Some(ip) = send.bind {
        sock.bind(SocketAddr::new(ip, 0)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("bind({}) failed {}", ip, crate::core::errno_text(&e)),
            )
        })?;
    }
    sock.connect(addr).await
}

/// Memory bodies up to this size leave in one write with the head.
const JOIN_BODY_MAX: usize = 16 * 1024;

/// Sends the head and the body (from memory, or read back from its temp
/// file through the file-I/O layer a chunk at a time).
async fn send_request(s: &mut UpStream, lim: &Limits, send: &Outgoing<'_>) -> Result<(), Fail> {
    match send.body {
        OutBody::Mem(b) if b.len() <= JOIN_BODY_MAX => {
            let mut all = Vec::with_capacity(send.head.len() + b.len());
            all.extend_from_slice(send.head);
            all.extend_from_slice(b);
            return write_timed(s, &all, lim).await;
        }
        _ => write_timed(s, send.head, lim).await?,
    }
    match send.body {
        OutBody::None => Ok(()),
        OutBody::Mem(b) => write_timed(s, b, lim).await,
        OutBody::File(f, len) => {
            let mut off = 0u64;
            while off < *len {
                let n = (*len - off).min(64 * 1024) as usize;
                let data = crate::io::read(f, off, n, send.policy).await.map_err(|e| {
                    fail(
                        500,
                        format!(
                            "client request body temp file read failed {}",
                            crate::core::errno_text(&e)
                        ),
                        false,
                    )
                })?;
                if data.is_empty() {
                    return Err(fail(
                        500,
                        "client request body temp file was truncated",
                        false,
                    ));
                }
                match lim.fcgi {
                    Some(_) => write_timed(s, &super::fastcgi::stdin(&data), lim).await?,
                    None => write_timed(s, &data, lim).await?,
                }
                off += data.len() as u64;
            }
            if lim.fcgi.is_some() {
                write_timed(s, &super::fastcgi::stdin(&[]), lim).await?;
            }
            Ok(())
        }
    }
}

/// Writes all of `data` within proxy_send_timeout, with nginx's log
/// wording on failure.
async fn write_timed(s: &mut UpStream, data: &[u8], lim: &Limits) -> Result<(), Fail> {
    // The flush pushes out what TLS still holds (a no-op for plain TCP).
    let write = async {
        s.write_all(data).await?;
        s.flush().await
    };
    match tokio::time::timeout(lim.send, write).await {
        Err(_) => Err(fail(
            504,
            format!("{} while sending request to upstream", TIMED_OUT),
            true,
        )),
        Ok(Err(e)) => Err(fail(
            502,
            format!(
                "writev() failed {} while sending request to upstream",
                crate::core::errno_text(&e)
            ),
            true,
        )),
        Ok(Ok(())) => Ok(()),
    }
}

async fn send_and_read(
    mut s: UpStream,
    addr: &PeerAddr,
    lim: &Limits,
    send: &Outgoing<'_>,
    head_only: bool,
) -> Result<UpResp, Fail> {
    send_request(&mut s, lim, send).await?;
    if let Some(catch) = &lim.fcgi {
        let h = super::fastcgi::read_head(&mut s, lim.read, lim.head_max, catch).await?;
        return Ok(UpResp {
            status: h.status,
            minor: 1,
            status_line: Vec::new(),
            no_body: head_only,
            declared_len: header(&h.headers, "content-length")
                .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok()),
            headers: h.headers,
            stream: Some(s),
            early: h.body,
            peer: addr.clone(),
            peer_name: String::new(),
            requests: 1,
            lease: None,
            fcgi: Some(h.decoder),
            stderr: h.stderr,
        });
    }
    let mut buf = vec![0u8; lim.head_max];
    let mut have = 0usize;
    // Set when an interim (1xx) response was dropped and bytes of the next
    // response are already buffered: parse them before reading again.
    let mut reparse = false;
    loop {
        if !reparse {
            if have == buf.len() {
                return Err(invalid_header(
                    "upstream sent too big header while reading response header from upstream",
                ));
            }
            let n = timed_read(
                &mut s,
                &mut buf[have..],
                lim.read,
                "while reading response header from upstream",
                true,
            )
            .await?;
            if n == 0 {
                return Err(fail(
                502,
                "upstream prematurely closed connection while reading response header from upstream",
                true,
            ));
            }
            have += n;
        }
        reparse = false;
        match super::upstream_head::parse(&buf[..have]) {
            Parse::Partial => continue,
            Parse::Done(h) => {
                if (100..200).contains(&h.code) && h.code != 101 {
                    // An interim response: drop it and read the real one.
                    // (nginx 1.22 relays it as the final answer, its body
                    // unframed: see DIFFERENCES.md.)
                    buf.copy_within(h.end..have, 0);
                    have -= h.end;
                    reparse = have > 0;
                    continue;
                }
                // (A chunked answer to HEAD announces no length, as nginx.)
                let chunked = h.headers.iter().any(|(n, v)| {
                    n.eq_ignore_ascii_case("transfer-encoding") && mentions_chunked(v)
                });
                let declared_len = content_length(&h.headers).filter(|_| !chunked);
                return Ok(UpResp {
                    status: h.code,
                    minor: u8::from(h.http11),
                    status_line: h.line,
                    no_body: head_only || h.code == 204 || h.code == 304,
                    declared_len,
                    headers: h.headers,
                    stream: Some(s),
                    early: buf[h.end..have].to_vec(),
                    peer: addr.clone(),
                    peer_name: String::new(),
                    requests: 1,
                    lease: None,
                    fcgi: None,
                    stderr: Vec::new(),
                });
            }
            Parse::NotHttp => {
                return Err(invalid_header(
                    "upstream sent no valid HTTP/1.0 header while reading response header from upstream",
                ))
            }
            Parse::Invalid(msg) => return Err(invalid_header(&msg)),
        }
    }
}

/// The body length upstream declared, as nginx 1.22 reads it: the last
/// `Content-Length` header, digits only; anything else (`+3`, `3, 3`,
/// empty, too big) counts as none, so the body ends with the connection.
pub(crate) fn content_length(hs: &[(String, Vec<u8>)]) -> Option<u64> {
    let (_, v) = hs
        .iter()
        .rev()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))?;
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // Digits only, so only an overflow (past nginx's off_t) fails here.
    let n: i64 = std::str::from_utf8(v).ok()?.parse().ok()?;
    u64::try_from(n).ok()
}

/// nginx's test of a Transfer-Encoding value: "chunked" anywhere in it.
fn mentions_chunked(v: &[u8]) -> bool {
    v.windows(7).any(|w| w.eq_ignore_ascii_case(b"chunked"))
}

pub(crate) fn header<'h>(hs: &'h [(String, Vec<u8>)], name: &str) -> Option<&'h [u8]> {
    hs.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

fn has_token(v: &[u8], tok: &str) -> bool {
    v.split(|&c| c == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(tok.as_bytes()))
}

// ---- the response body: framing, and the pipe to the client -----------------

/// How the upstream body ends: chunked, a length, or the connection's close.
pub(crate) struct Framing {
    dec: Option<crate::http::chunked::ChunkedDecoder>,
    /// FastCGI records (the body is their stdout).
    fcgi: Option<super::fastcgi::Decoder>,
    /// Bytes still expected with a Content-Length.
    left: Option<u64>,
    /// The declared Content-Length (what the client is told).
    pub(crate) length: Option<u64>,
    /// Bytes after the body's end arrived (the connection cannot be reused).
    pub(crate) extra: bool,
}

impl Framing {
    fn of(r: &UpResp) -> Framing {
        if r.no_body {
            return Framing {
                dec: None,
                fcgi: None,
                left: Some(0),
                length: None,
                extra: false,
            };
        }
        // nginx 1.22 decodes a chunked body whatever the version, when
        // Transfer-Encoding mentions "chunked" anywhere; a Content-Length
        // then does not count, and one it cannot read means none.
        let chunked = r
            .headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && mentions_chunked(v));
        let length = if chunked {
            None
        } else {
            content_length(&r.headers)
        };
        Framing {
            dec: chunked.then(crate::http::chunked::ChunkedDecoder::new),
            fcgi: None,
            left: length,
            length,
            extra: false,
        }
    }

    /// A FastCGI response's body: the rest of the records `dec` is in
    /// the middle of; `length` is what the script's Content-Length said.
    pub(crate) fn fcgi(dec: super::fastcgi::Decoder, length: Option<u64>) -> Framing {
        Framing {
            dec: None,
            fcgi: Some(dec),
            left: None,
            length,
            extra: false,
        }
    }

    /// Decodes what arrived, appending body bytes to `out`.
    fn feed(&mut self, buf: &[u8], out: &mut Vec<u8>) -> Result<(), Fail> {
        if let Some(d) = self.fcgi.as_mut() {
            d.feed(buf, out)
                .map_err(|m| fail(502, format!("{} while reading upstream", m), false))?;
            self.extra |= d.extra;
        } else if let Some(d) = self.dec.as_mut() {
            let used = d.decode(buf, out).map_err(|_| {
                fail(
                    502,
                    "upstream sent invalid chunked response while reading upstream",
                    false,
                )
            })?;
            self.extra |= used < buf.len() && d.is_done();
        } else if let Some(l) = self.left.as_mut() {
            let take = (*l).min(buf.len() as u64) as usize;
            self.extra |= take < buf.len();
            *l -= take as u64;
            out.extend_from_slice(&buf[..take]);
        } else {
            out.extend_from_slice(buf);
        }
        Ok(())
    }

    pub(crate) fn done(&self) -> bool {
        if let Some(d) = &self.fcgi {
            return d.done;
        }
        match (&self.dec, self.left) {
            (Some(d), _) => d.is_done(),
            (None, Some(l)) => l == 0,
            (None, None) => false,
        }
    }

    /// nginx's warning once bytes came after the body's end (they are
    /// dropped, and the connection is not reused).
    fn extra_warning(&self) -> Option<&'static str> {
        if !self.extra || self.fcgi.is_some() {
            return None;
        }
        Some(match self.dec {
            Some(_) => "upstream sent data after final chunk",
            None => "upstream sent more data than specified in \"Content-Length\" header",
        })
    }

    /// The body ends with the connection (HTTP/1.0 style).
    fn by_close(&self) -> bool {
        self.dec.is_none() && self.fcgi.is_none() && self.left.is_none()
    }
}

/// Whether the upstream connection can go back to the keepalive cache
/// once its body was read whole.
fn reusable(r: &UpResp, f: &Framing) -> bool {
    // nginx never reuses an HTTP/1.0 connection, whatever its Connection
    // header says, nor one that answered 101.
    let close = header(&r.headers, "connection").is_some_and(|v| has_token(v, "close"))
        || r.minor == 0
        || r.status == 101;
    !f.extra && !close && !f.by_close()
}

/// A part of the body waiting for the client: in memory, or a range of
/// the temp (or cache) file.
enum Seg {
    Mem(Bytes),
    File(u64, u64),
}

#[derive(Default)]
struct PipeState {
    queue: std::collections::VecDeque<Seg>,
    /// Bytes of `Seg::Mem` queued (bounded by proxy_buffers).
    mem: usize,
    /// The file `Seg::File` ranges are in.
    file: Option<Arc<File>>,
    /// Set once the body is complete (Ok) or broken (Err: what to tell
    /// the connection).
    end: Option<Result<(), String>>,
    /// The client side was dropped (client gone, or it needed no body).
    gone: bool,
}

/// The body on its way from the upstream reader ([`Producer`]) to the
/// connection ([`Consumer`]).
#[derive(Default)]
pub(crate) struct Pipe {
    state: std::sync::Mutex<PipeState>,
    /// Data or the end was queued.
    data: tokio::sync::Notify,
    /// The consumer took data, or left.
    room: tokio::sync::Notify,
}

impl Pipe {
    fn lock(&self) -> std::sync::MutexGuard<'_, PipeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, seg: Seg) {
        {
            let mut p = self.lock();
            match (seg, p.queue.back_mut()) {
                (Seg::File(o, l), Some(Seg::File(bo, bl))) if *bo + *bl == o => *bl += l,
                (Seg::Mem(b), _) => {
                    p.mem += b.len();
                    p.queue.push_back(Seg::Mem(b));
                }
                (s, _) => p.queue.push_back(s),
            }
        }
        self.data.notify_one();
    }

    fn finish(&self, end: Result<(), String>) {
        self.lock().end = Some(end);
        self.data.notify_one();
    }
}

/// A body already complete in memory, sent as a stream all the same:
/// the client is told no length (chunked), as nginx tells it when
/// upstream did not say one.
pub(crate) fn complete_stream(data: Vec<u8>, policy: Policy) -> Body {
    let pipe = Arc::new(Pipe::default());
    if !data.is_empty() {
        pipe.push(Seg::Mem(Bytes::from(data)));
    }
    pipe.finish(Ok(()));
    Body::Stream(Box::new(Consumer { pipe, policy }))
}

/// Pieces read back from a file are at most this big.
const FILE_PIECE: u64 = 64 * 1024;

/// The connection's end of the pipe: a [`BodyStream`].
pub(crate) struct Consumer {
    pub(crate) pipe: Arc<Pipe>,
    pub(crate) policy: Policy,
}

impl Consumer {
    async fn next_piece(&mut self) -> io::Result<Option<Bytes>> {
        loop {
            let from_file = {
                let mut p = self.pipe.lock();
                match p.queue.pop_front() {
                    Some(Seg::Mem(b)) => {
                        p.mem -= b.len();
                        drop(p);
                        self.pipe.room.notify_one();
                        return Ok(Some(b));
                    }
                    Some(Seg::File(off, len)) => {
                        let n = len.min(FILE_PIECE);
                        if len > n {
                            p.queue.push_front(Seg::File(off + n, len - n));
                        }
                        p.file.clone().map(|f| (f, off, n))
                    }
                    None => match &p.end {
                        Some(Ok(())) => return Ok(None),
                        Some(Err(e)) => return Err(io::Error::other(e.clone())),
                        None => None,
                    },
                }
            };
            if let Some((f, off, n)) = from_file {
                let policy = self.policy.clone();
                let data = cache::blocking(&policy, move || {
                    use std::os::unix::fs::FileExt;
                    let mut b = vec![0u8; n as usize];
                    f.read_exact_at(&mut b, off)?;
                    Ok(Bytes::from(b))
                })
                .await?;
                self.pipe.room.notify_one();
                return Ok(Some(data));
            }
            self.pipe.data.notified().await;
        }
    }
}

impl crate::http::response::BodyStream for Consumer {
    fn next(&mut self) -> std::pin::Pin<Box<dyn crate::http::response::StreamFuture<'_> + '_>> {
        Box::pin(self.next_piece())
    }

    fn ready(&self) -> bool {
        let p = self.pipe.lock();
        !p.queue.is_empty() || p.end.is_some()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.pipe.lock().gone = true;
        self.pipe.room.notify_one();
        self.pipe.data.notify_one();
    }
}

/// What an upstream error is logged with once the request's context is
/// out of reach (the reader outlives the handler).
pub(crate) struct UpLog {
    pub(crate) logger: Arc<crate::core::log::Logger>,
    pub(crate) conn: u64,
    /// `, client: ..., server: ..., request: "..."`.
    pub(crate) tail: String,
    /// `, upstream: "..."` and `, host: "..."`.
    pub(crate) upstream: String,
    pub(crate) host: String,
}

impl UpLog {
    pub(crate) fn of(cx: &Ctx<'_>, url: &str) -> UpLog {
        UpLog {
            logger: cx.logger(),
            conn: cx.conn.id,
            tail: cx.log_request_ctx(),
            upstream: format!(", upstream: \"{}\"", url),
            host: cx.log_host_ctx(),
        }
    }

    fn log(&self, level: Level, msg: &str, with_upstream: bool) {
        let up = if with_upstream {
            &self.upstream[..]
        } else {
            ""
        };
        self.logger.log(
            level,
            Some(self.conn),
            format_args!("{}{}{}{}", msg, self.tail, up, self.host),
        );
    }
}

/// The cache entry being written as the body arrives.
pub(crate) struct CacheOut {
    zone: Arc<Zone>,
    md5: [u8; 16],
    file: Arc<File>,
    path: PathBuf,
    eh: EntryHead,
    /// Where the body starts (the header's length).
    base: u64,
    written: u64,
    /// The last range written, shown to the client only after the entry
    /// is committed, so that a request made once this response is
    /// complete finds the entry.
    held: Option<(u64, u64)>,
    /// The key's `updating` mark, released once the entry is stored (or
    /// given up).
    _guard: Option<cache::UpdateGuard>,
}

/// Why the reader stopped early.
enum Stop {
    Fail(Fail),
    /// The client left and nothing needs the rest.
    Gone,
}

impl From<Fail> for Stop {
    fn from(f: Fail) -> Stop {
        Stop::Fail(f)
    }
}

/// Reads the upstream body as it comes, independent of the client: into
/// memory up to proxy_buffers, then a temp file up to
/// proxy_max_temp_file_size, then it waits for the client; a response
/// being cached goes whole into its cache file.
pub(crate) struct Producer {
    pub(crate) pipe: Arc<Pipe>,
    pub(crate) stream: UpStream,
    /// Dropped with the producer, when the body is done.
    pub(crate) _lease: Option<upstream::Lease>,
    pub(crate) framing: Framing,
    pub(crate) read_timeout: Duration,
    pub(crate) mem_max: usize,
    pub(crate) temp_max: u64,
    pub(crate) temp_dir: PathBuf,
    pub(crate) policy: Policy,
    pub(crate) temp: Option<Arc<File>>,
    pub(crate) temp_len: u64,
    pub(crate) cache: Option<CacheOut>,
    /// Where a complete, reusable connection goes, and the requests it
    /// has carried.
    pub(crate) keep: Option<(Arc<Upstream>, PeerAddr, u64)>,
    pub(crate) log: UpLog,
    /// `proxy_limit_rate` in bytes per second (0: none).
    pub(crate) limit_rate: u64,
    /// `proxy_store`: the file the body is copied to.
    pub(crate) store: Option<StoreOut>,
}

/// A `proxy_store` file being written: a named temp file, renamed to
/// `dest` (directories made as needed) once the body is complete.
pub(crate) struct StoreOut {
    file: Arc<File>,
    path: PathBuf,
    dest: PathBuf,
    mode: u32,
    mtime: Option<std::time::SystemTime>,
    written: u64,
}

/// A named temp file in `dir` (made when missing).
async fn named_temp(dir: &Path, policy: &Policy) -> io::Result<(Arc<File>, PathBuf)> {
    let path = dir.join(format!(
        "tern-store-{}-{}",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    match create_file(path.clone(), policy).await {
        Ok(f) => Ok((f, path)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
            ) =>
        {
            cache::prepare_dir(dir).await?;
            Ok((create_file(path.clone(), policy).await?, path))
        }
        Err(e) => Err(e),
    }
}

/// Puts a complete `proxy_store` file in place: its mode
/// (`proxy_store_access`), its mtime (upstream's Last-Modified), then the
/// rename (a copy across file systems), making directories as nginx does
/// (the file's mode plus x where r is).
async fn commit_store(st: StoreOut, policy: &Policy) -> io::Result<()> {
    cache::blocking(policy, move || {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        st.file
            .set_permissions(std::fs::Permissions::from_mode(st.mode))?;
        if let Some(t) = st.mtime {
            st.file.set_modified(t)?;
        }
        let place = || match std::fs::rename(&st.path, &st.dest) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                std::fs::copy(&st.path, &st.dest)?;
                std::fs::remove_file(&st.path)
            }
            r => r,
        };
        match place() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(parent) = st.dest.parent() {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(st.mode | (st.mode & 0o444) >> 2)
                        .create(parent)?;
                }
                place()
            }
            r => r,
        }
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&st.path);
        })
    })
    .await
}

impl Producer {
    pub(crate) async fn run(mut self, first: Vec<u8>) {
        match self.pump(first).await {
            Ok(()) => {
                if let Some(c) = self.cache.take() {
                    let held = c.held;
                    if let Err((e, c)) = commit(c, &self.policy).await {
                        self.log.log(
                            Level::Crit,
                            &format!(
                                "cache file \"{}\" could not be stored {}",
                                c.zone.file_path(&c.md5).display(),
                                crate::core::errno_text(&e)
                            ),
                            false,
                        );
                    }
                    if let Some((o, l)) = held {
                        self.pipe.push(Seg::File(o, l));
                    }
                }
                if let Some(st) = self.store.take() {
                    let (from, to) = (st.path.clone(), st.dest.clone());
                    if let Err(e) = commit_store(st, &self.policy).await {
                        self.log.log(
                            Level::Crit,
                            &format!(
                                "rename() \"{}\" to \"{}\" failed {}",
                                from.display(),
                                to.display(),
                                crate::core::errno_text(&e)
                            ),
                            false,
                        );
                    }
                }
                // Bytes after the body make the connection unusable.
                if let Some((up, addr, n)) = self.keep.take().filter(|_| !self.framing.extra) {
                    up.put_idle(addr, self.stream, n);
                }
                self.pipe.finish(Ok(()));
            }
            Err(stop) => {
                if let Some(st) = self.store.take() {
                    let _ = remove(&st.path, &self.policy).await;
                }
                if let Some(c) = self.cache.take() {
                    // The client gets all that came; the entry never exists.
                    if let Some((o, l)) = c.held {
                        self.pipe.push(Seg::File(o, l));
                    }
                    let path = c.path;
                    let _ =
                        cache::blocking(&self.policy, move || std::fs::remove_file(&path)).await;
                }
                if let Stop::Fail(f) = stop {
                    self.log.log(Level::Error, &f.msg, true);
                    self.pipe.finish(Err(f.msg));
                }
            }
        }
    }

    async fn pump(&mut self, first: Vec<u8>) -> Result<(), Stop> {
        self.place(first).await?;
        let mut rbuf = vec![0u8; 64 * 1024];
        let started = std::time::Instant::now();
        let mut read_len = 0u64;
        while !self.framing.done() {
            let pipe = self.pipe.clone();
            // A response being cached or stored is read whole.
            let caching = self.cache.is_some() || self.store.is_some();
            let mut room = rbuf.len();
            if self.limit_rate > 0 {
                // nginx's pipe: up to rate x (whole seconds since the
                // start + 1) read so far; past that, wait.
                let secs = started.elapsed().as_secs();
                let allowed = self.limit_rate.saturating_mul(secs + 1);
                if read_len >= allowed {
                    // Until the second in which more is allowed.
                    let at = Duration::from_secs(read_len / self.limit_rate);
                    let wait = tokio::time::sleep(at.saturating_sub(started.elapsed()));
                    tokio::select! {
                        () = wait => {}
                        () = gone(&pipe), if !caching => return Err(Stop::Gone),
                    }
                    continue;
                }
                room = room.min((allowed - read_len) as usize);
            }
            let n = tokio::select! {
                r = timed_read(&mut self.stream, &mut rbuf[..room], self.read_timeout, "while reading upstream", false) => r?,
                // A client gone is noticed at once, also while upstream is
                // silent; a response being cached is still read whole.
                () = gone(&pipe), if !caching => return Err(Stop::Gone),
            };
            if n == 0 {
                if self.framing.by_close() {
                    return Ok(());
                }
                return Err(fail(
                    502,
                    "upstream prematurely closed connection while reading upstream",
                    false,
                )
                .into());
            }
            read_len += n as u64;
            let mut data = Vec::new();
            let extra = self.framing.extra;
            self.framing.feed(&rbuf[..n], &mut data)?;
            if let Some(w) = self.framing.extra_warning().filter(|_| !extra) {
                let msg = format!("{} while reading upstream", w);
                self.log.log(Level::Warn, &msg, true);
            }
            if let Some(d) = self.framing.fcgi.as_mut() {
                for e in d.stderr.drain(..) {
                    self.log
                        .log(Level::Error, &super::fastcgi::stderr_msg(&e, false), true);
                }
            }
            self.place(data).await?;
        }
        Ok(())
    }

    /// Queues a piece of the body for the client (see [`Producer`]).
    async fn place(&mut self, data: Vec<u8>) -> Result<(), Stop> {
        if data.is_empty() {
            return Ok(());
        }
        let len = data.len() as u64;
        if let Some(c) = self.cache.as_mut() {
            let at = c.base + c.written;
            crate::io::write_at(&c.file, at, Bytes::from(data), &self.policy)
                .await
                .map_err(temp_write_failed)?;
            c.written += len;
            if let Some((o, l)) = c.held.replace((at, len)) {
                self.pipe.push(Seg::File(o, l));
            }
            return Ok(());
        }
        if let Some(st) = self.store.as_mut() {
            crate::io::write_at(
                &st.file,
                st.written,
                Bytes::from(data.clone()),
                &self.policy,
            )
            .await
            .map_err(temp_write_failed)?;
            st.written += len;
            if self.pipe.lock().gone {
                // As nginx, a body being stored is read whole even when
                // the client left.
                return Ok(());
            }
        }
        loop {
            {
                let p = self.pipe.lock();
                if p.gone {
                    return Err(Stop::Gone);
                }
                if p.mem == 0 || p.mem + data.len() <= self.mem_max {
                    drop(p);
                    self.pipe.push(Seg::Mem(Bytes::from(data)));
                    return Ok(());
                }
            }
            if self.temp_max > 0 && self.temp_len + len <= self.temp_max {
                let f = match &self.temp {
                    Some(f) => f.clone(),
                    None => {
                        let f = temp_file(&self.temp_dir, &self.policy)
                            .await
                            .map_err(temp_write_failed)?;
                        self.pipe.lock().file = Some(f.clone());
                        self.temp = Some(f.clone());
                        f
                    }
                };
                let at = self.temp_len;
                crate::io::write_at(&f, at, Bytes::from(data), &self.policy)
                    .await
                    .map_err(temp_write_failed)?;
                self.temp_len += len;
                self.pipe.push(Seg::File(at, len));
                return Ok(());
            }
            // Memory and temp file are full: upstream waits for the client.
            self.pipe.room.notified().await;
        }
    }
}

/// Resolves once the consumer has left.
async fn gone(pipe: &Pipe) {
    loop {
        if pipe.lock().gone {
            return;
        }
        pipe.room.notified().await;
    }
}

fn temp_write_failed(e: io::Error) -> Stop {
    Stop::Fail(fail(
        502,
        format!("temp file write failed {}", crate::core::errno_text(&e)),
        false,
    ))
}

/// A plain temp file for a body that outgrew proxy_buffers, unlinked at
/// once: it goes away with its last descriptor, however the response ends.
async fn temp_file(dir: &Path, policy: &Policy) -> io::Result<Arc<File>> {
    let path = dir.join(format!(
        "tern-proxy-{}-{}",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let f = match create_file(path.clone(), policy).await {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
            ) =>
        {
            cache::prepare_dir(dir).await?;
            create_file(path.clone(), policy).await?
        }
        Err(e) => return Err(e),
    };
    cache::blocking(policy, move || std::fs::remove_file(&path)).await?;
    Ok(f)
}

/// Completes a cache entry: its header, the rename into place, the node.
async fn commit(mut c: CacheOut, policy: &Policy) -> Result<(), (io::Error, CacheOut)> {
    c.eh.body_len = c.written;
    let head = c.eh.encode();
    if head.len() as u64 != c.base {
        let _ = remove(&c.path, policy).await;
        return Err((io::Error::other("cache header length changed"), c));
    }
    if let Err(e) = crate::io::write_at(&c.file, 0, Bytes::from(head), policy).await {
        let _ = remove(&c.path, policy).await;
        return Err((e, c));
    }
    let (src, dst) = (c.path.clone(), c.zone.file_path(&c.md5));
    if let Err(e) = cache::blocking(policy, move || std::fs::rename(&src, &dst)).await {
        let _ = remove(&c.path, policy).await;
        return Err((e, c));
    }
    c.zone
        .insert(c.md5, c.eh.valid_until, disk_bytes(c.base + c.written));
    Ok(())
}

async fn remove(path: &Path, policy: &Policy) -> io::Result<()> {
    let p = path.to_path_buf();
    cache::blocking(policy, move || std::fs::remove_file(&p)).await
}

static TEMP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Creates a new temp file (0600), making its directory when missing.
async fn create_file(path: PathBuf, policy: &Policy) -> io::Result<Arc<File>> {
    crate::http::body::create(path, false, policy).await
}

fn entry_head(
    c: &CacheReq,
    r: &UpResp,
    relayed: &[(String, Vec<u8>)],
    valid_until: i64,
    body_len: u64,
) -> EntryHead {
    EntryHead {
        status: r.status,
        valid_until,
        date: cache::now_secs(),
        last_modified: None,
        body_len,
        key: c.key.clone(),
        status_line: r.status_line.clone(),
        headers: relayed.to_vec(),
    }
}

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
/// Framing and hop-by-hop headers: never relayed. (`Upgrade` is: nginx
/// passes it on any response, and a 101 needs it.)
const HOP: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
];

/// The part of the URI the location matched (what `proxy_redirect
/// default` puts back).
fn loc_prefix<'c>(cx: &'c Ctx<'_>) -> &'c [u8] {
    cx.uri.get(..cx.loc_prefix_len).unwrap_or(b"")
}

/// The headers that go to the client (and into a cache file).
pub(crate) fn relay_headers(
    prefix: &[u8],
    conf: &ProxyLoc,
    pass: Option<&Pass>,
    hs: &[(String, Vec<u8>)],
    hidden: &[&str],
) -> Vec<(String, Vec<u8>)> {
    let pass_list: &[String] = conf.pass_headers.as_deref().map_or(&[], |v| v);
    let hide_list: &[String] = conf.hide.as_deref().map_or(&[], |v| v);
    let mut out = Vec::new();
    for (n, v) in hs {
        let l = n.to_ascii_lowercase();
        if HOP.contains(&l.as_str()) || hide_list.contains(&l) {
            continue;
        }
        if hidden.contains(&l.as_str()) && !pass_list.contains(&l) {
            continue;
        }
        if let Some(pass) = pass.filter(|_| l == "location" && conf.redirect.unwrap_or(true)) {
            out.push((n.clone(), rewrite_location(prefix, pass, v)));
            continue;
        }
        out.push((n.clone(), v.clone()));
    }
    out
}

/// `Set-Cookie` attributes: name, and the value when there is an `=`.
type CookieAttrs = Vec<(Vec<u8>, Option<Vec<u8>>)>;

fn parse_cookie(v: &[u8]) -> CookieAttrs {
    v.split(|&c| c == b';')
        .map(|part| match memchr::memchr(b'=', part) {
            Some(i) => (
                part[..i].trim_ascii().to_vec(),
                Some(part[i + 1..].trim_ascii().to_vec()),
            ),
            None => (part.trim_ascii().to_vec(), None),
        })
        .collect()
}

/// Whether `m` matches `v`: text case-insensitively and whole, a regex
/// anywhere (its captures become `$1`.. for the replacement).
fn cookie_matches(cx: &mut Ctx<'_>, m: &CookieMatch, v: &[u8]) -> bool {
    match m {
        CookieMatch::Text(t) => t.render_vec(&*cx).eq_ignore_ascii_case(v),
        CookieMatch::Regex(re) => match re.captures(v) {
            Some(c) => {
                cx.captures = c;
                cx.capture_src = v.to_vec();
                true
            }
            None => false,
        },
    }
}

/// `proxy_cookie_domain`, `proxy_cookie_path`, `proxy_cookie_flags` on
/// the `Set-Cookie` headers, as nginx: a header that any of them changes
/// is rebuilt as `name=value; attr=value; attr`, others pass as they came.
fn rewrite_cookies(cx: &mut Ctx<'_>, conf: &ProxyLoc, headers: &mut [(String, Vec<u8>)]) {
    let domains = conf.cookie_domain.as_deref().filter(|v| !v.is_empty());
    let paths = conf.cookie_path.as_deref().filter(|v| !v.is_empty());
    let flags = conf.cookie_flags.as_deref().filter(|v| !v.is_empty());
    if domains.is_none() && paths.is_none() && flags.is_none() {
        return;
    }
    for (n, v) in headers.iter_mut() {
        if !n.eq_ignore_ascii_case("set-cookie") {
            continue;
        }
        let mut attrs = parse_cookie(v);
        if attrs.first().is_none_or(|a| a.1.is_none()) {
            continue;
        }
        let mut changed = false;
        for a in attrs.iter_mut().skip(1) {
            let Some(val) = a.1.as_mut() else { continue };
            if let Some(rules) = domains.filter(|_| a.0.eq_ignore_ascii_case(b"domain")) {
                changed |= rewrite_domain(cx, rules, val);
            }
            if let Some(rules) = paths.filter(|_| a.0.eq_ignore_ascii_case(b"path")) {
                changed |= rewrite_path(cx, rules, val);
            }
        }
        if let Some(list) = flags {
            changed |= edit_flags(cx, list, &mut attrs);
        }
        if changed {
            let mut out = Vec::with_capacity(v.len() + 16);
            for (i, (k, val)) in attrs.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b"; ");
                }
                out.extend_from_slice(k);
                if let Some(val) = val {
                    out.push(b'=');
                    out.extend_from_slice(val);
                }
            }
            *v = out;
        }
    }
}

/// The first matching `proxy_cookie_domain` rule replaces the domain (a
/// leading dot is kept and not matched).
fn rewrite_domain(cx: &mut Ctx<'_>, rules: &[CookieRewrite], val: &mut Vec<u8>) -> bool {
    let dot = usize::from(val.first() == Some(&b'.'));
    for r in rules {
        let cur = val[dot..].to_vec();
        if cookie_matches(cx, &r.pattern, &cur) {
            let rep = r.replacement.render_vec(&*cx);
            val.truncate(dot);
            val.extend_from_slice(&rep);
            return true;
        }
    }
    false
}

/// The first matching `proxy_cookie_path` rule: text replaces the prefix
/// it matches (case-sensitively), a regex the whole path.
fn rewrite_path(cx: &mut Ctx<'_>, rules: &[CookieRewrite], val: &mut Vec<u8>) -> bool {
    for r in rules {
        match &r.pattern {
            CookieMatch::Text(t) => {
                let pat = t.render_vec(&*cx);
                if val.starts_with(&pat) {
                    let mut out = r.replacement.render_vec(&*cx);
                    out.extend_from_slice(&val[pat.len()..]);
                    *val = out;
                    return true;
                }
            }
            m @ CookieMatch::Regex(_) => {
                let cur = val.clone();
                if cookie_matches(cx, m, &cur) {
                    *val = r.replacement.render_vec(&*cx);
                    return true;
                }
            }
        }
    }
    false
}

/// The first `proxy_cookie_flags` entry naming the cookie: `secure`,
/// `httponly`, `samesite=strict|lax|none` add (or set) the attribute,
/// `nosecure`, `nohttponly`, `nosamesite` remove it; attributes added go
/// last, in the order Secure, HttpOnly, SameSite (nginx's).
fn edit_flags(cx: &mut Ctx<'_>, list: &[CookieFlags], attrs: &mut CookieAttrs) -> bool {
    let name = attrs.first().map(|a| a.0.clone()).unwrap_or_default();
    let Some(entry) = list.iter().find(|e| cookie_matches(cx, &e.cookie, &name)) else {
        return false;
    };
    let (mut secure, mut httponly, mut samesite): (
        Option<bool>,
        Option<bool>,
        Option<Option<&str>>,
    ) = (None, None, None);
    for f in &entry.flags {
        let f = f.render_vec(&*cx).to_ascii_lowercase();
        match f.as_slice() {
            b"secure" => secure = Some(true),
            b"nosecure" => secure = Some(false),
            b"httponly" => httponly = Some(true),
            b"nohttponly" => httponly = Some(false),
            b"samesite=strict" => samesite = Some(Some("Strict")),
            b"samesite=lax" => samesite = Some(Some("Lax")),
            b"samesite=none" => samesite = Some(Some("None")),
            b"nosamesite" => samesite = Some(None),
            _ => {}
        }
    }
    let (mut has_secure, mut has_httponly, mut has_samesite) = (false, false, false);
    let mut i = 1;
    while i < attrs.len() {
        let k = attrs[i].0.to_ascii_lowercase();
        let remove = match k.as_slice() {
            b"secure" => {
                has_secure = true;
                secure == Some(false)
            }
            b"httponly" => {
                has_httponly = true;
                httponly == Some(false)
            }
            b"samesite" => {
                has_samesite = true;
                match samesite {
                    Some(Some(v)) => {
                        attrs[i] = (b"SameSite".to_vec(), Some(v.as_bytes().to_vec()));
                        false
                    }
                    Some(None) => true,
                    None => false,
                }
            }
            _ => false,
        };
        if remove {
            attrs.remove(i);
        } else {
            i += 1;
        }
    }
    if secure == Some(true) && !has_secure {
        attrs.push((b"Secure".to_vec(), None));
    }
    if httponly == Some(true) && !has_httponly {
        attrs.push((b"HttpOnly".to_vec(), None));
    }
    if let (Some(Some(v)), false) = (samesite, has_samesite) {
        attrs.push((b"SameSite".to_vec(), Some(v.as_bytes().to_vec())));
    }
    true
}

/// `proxy_redirect default`: `http://HOST[:PORT]/URI...` of the proxy_pass
/// becomes the location's prefix.
fn rewrite_location(prefix: &[u8], pass: &Pass, v: &[u8]) -> Vec<u8> {
    let mut pattern = pass.url.as_bytes().to_vec();
    match &pass.uri {
        Some(u) => pattern.extend_from_slice(u),
        None => pattern.extend_from_slice(prefix),
    }
    match v.strip_prefix(pattern.as_slice()) {
        Some(rest) if !pattern.is_empty() => {
            let mut o = prefix.to_vec();
            o.extend_from_slice(rest);
            o
        }
        _ => v.to_vec(),
    }
}

/// How long a response may be cached (unix time it expires), or None.
/// Order as nginx: X-Accel-Expires, Cache-Control, Expires, then
/// proxy_cache_valid; Set-Cookie and `Vary: *` prevent caching.
fn cache_validity(conf: &ProxyLoc, status: u16, hs: &[(String, Vec<u8>)]) -> Option<i64> {
    let ign = conf.ignore_headers.unwrap_or(0);
    let now = cache::now_secs();
    if ign & IGN_SET_COOKIE == 0 && header(hs, "set-cookie").is_some() {
        return None;
    }
    // nginx keeps one variant per Vary'd request header set; tern does not
    // store variants yet, so a varying response is not cached at all
    // (serving one client's variant to another would be wrong).
    if ign & IGN_VARY == 0 && header(hs, "vary").is_some() {
        return None;
    }
    if let Some(t) = header_validity(conf, hs, now)? {
        return Some(t);
    }
    valid_for(conf, status, now)
}

/// `proxy_cache_valid`'s time for `status`, from `now`.
fn valid_for(conf: &ProxyLoc, status: u16, now: i64) -> Option<i64> {
    let list = conf.cache_valid.as_deref()?;
    let secs = list
        .iter()
        .find(|(c, _)| *c == Some(status))
        .or_else(|| list.iter().find(|(c, _)| c.is_none()))?
        .1;
    (secs > 0).then(|| now.saturating_add(i64::try_from(secs).unwrap_or(i64::MAX)))
}

/// What X-Accel-Expires, Cache-Control and Expires say: Some(None) when
/// none of them decides, None when they forbid caching.
fn header_validity(conf: &ProxyLoc, hs: &[(String, Vec<u8>)], now: i64) -> Option<Option<i64>> {
    let ign = conf.ignore_headers.unwrap_or(0);
    let mut from_headers: Option<i64> = None;
    if ign & IGN_X_ACCEL_EXPIRES == 0 {
        if let Some(v) = header(hs, "x-accel-expires") {
            let s = std::str::from_utf8(v).ok()?.trim();
            let t = match s.strip_prefix('@') {
                Some(abs) => abs.parse::<i64>().ok()?,
                None => {
                    let n = s.parse::<i64>().ok()?;
                    if n == 0 {
                        return None;
                    }
                    now.saturating_add(n)
                }
            };
            from_headers = Some(t);
        }
    }
    if from_headers.is_none() && ign & IGN_CACHE_CONTROL == 0 {
        if let Some(v) = header(hs, "cache-control") {
            let l = v.to_ascii_lowercase();
            for bad in ["no-cache", "no-store", "private"] {
                if has_token(&l, bad) || l.windows(bad.len()).any(|w| w == bad.as_bytes()) {
                    return None;
                }
            }
            let age = |name: &str| -> Option<i64> {
                let i = l.windows(name.len()).position(|w| w == name.as_bytes())?;
                let digits: Vec<u8> = l[i + name.len()..]
                    .iter()
                    .take_while(|c| c.is_ascii_digit())
                    .copied()
                    .collect();
                std::str::from_utf8(&digits).ok()?.parse().ok()
            };
            if let Some(n) = age("s-maxage=").or_else(|| age("max-age=")) {
                if n == 0 {
                    return None;
                }
                from_headers = Some(now.saturating_add(n));
            }
        }
    }
    if from_headers.is_none() && ign & IGN_EXPIRES == 0 {
        if let Some(v) = header(hs, "expires") {
            let t = std::str::from_utf8(v)
                .ok()
                .and_then(|s| httpdate::parse_http_date(s.trim()).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs() as i64);
            match t {
                Some(t) if t > now => from_headers = Some(t),
                _ => return None,
            }
        }
    }
    Some(from_headers)
}

/// Logs with nginx's upstream context: `..., request: "...", upstream: "...", host: "..."`.
pub(crate) fn log_upstream(cx: &Ctx<'_>, level: Level, msg: &str, upstream: &str) {
    cx.log_with_upstream(level, msg, Some(upstream));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_order() {
        let conf = ProxyLoc {
            cache_valid: Some(Arc::new(vec![(Some(200), 600)])),
            ..Default::default()
        };
        let h = |v: &[(&str, &str)]| -> Vec<(String, Vec<u8>)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.as_bytes().to_vec()))
                .collect()
        };
        let now = cache::now_secs();
        let v = cache_validity(&conf, 200, &[]).unwrap();
        assert!((now + 599..=now + 601).contains(&v));
        assert_eq!(cache_validity(&conf, 404, &[]), None);
        assert_eq!(
            cache_validity(&conf, 200, &h(&[("Set-Cookie", "a=b")])),
            None
        );
        assert_eq!(
            cache_validity(&conf, 200, &h(&[("Cache-Control", "private, max-age=5")])),
            None
        );
        let v = cache_validity(&conf, 404, &h(&[("Cache-Control", "max-age=5")])).unwrap();
        assert!((now + 4..=now + 6).contains(&v));
        assert_eq!(
            cache_validity(
                &conf,
                200,
                &h(&[("X-Accel-Expires", "0"), ("Cache-Control", "max-age=5")])
            ),
            None
        );
        assert_eq!(
            cache_validity(
                &conf,
                200,
                &h(&[("Expires", "Thu, 01 Jan 1970 00:00:00 GMT")])
            ),
            None
        );
    }

    #[test]
    fn port_split() {
        assert_eq!(split_port("a:81"), Some(("a", Some(81))));
        assert_eq!(split_port("a"), Some(("a", None)));
        assert_eq!(split_port("[::1]:81"), Some(("[::1]", Some(81))));
        assert_eq!(split_port("a:x"), None);
    }
}
