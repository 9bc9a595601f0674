//! Typed, merged http/server/location configuration.
//!
//! `compile_http` walks the `http` block: http-level location directives
//! fill the http [`LocConf`], each `server` gets its own [`SrvConf`] and
//! [`LocConf`], each `location` its own [`LocConf`]; then every level is
//! merged with its parent (`child.merge(parent)`: an unset field takes the
//! parent's value, as nginx's merge hooks do) and the defaults are applied at
//! the top. Servers are grouped by listening address into [`AddrConf`]s for
//! name-based virtual hosting.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use crate::core::regex::Regex;

use crate::config::registry::{
    self, arg, ctx, flag, msec_arg, set_once, size_arg, Args, Setter, Spec,
};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::{Compiler, ErrorLogSpec, MainConf};
use crate::core::log::Logger;
use crate::http::vars::Template;

/// State shared by the whole `http` block (filled by http-only directives).
#[derive(Debug, Clone, Default)]
pub struct HttpMain {
    pub vars: crate::http::vars::VarTable,
    pub modules: crate::http::modules::ModMain,
}

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ListenAddr {
    Inet(SocketAddr),
    Unix(PathBuf),
    /// A datagram socket: `listen ... quic` in http, `listen ... udp` in
    /// stream. Its own key, so TCP and UDP on one port are two listeners.
    Udp(SocketAddr),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Inet(a) | ListenAddr::Udp(a) => write!(f, "{}", a),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// A parsed `listen` directive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listen {
    pub addr: ListenAddr,
    pub default_server: bool,
    pub reuseport: bool,
    pub backlog: Option<i32>,
    pub rcvbuf: Option<usize>,
    pub sndbuf: Option<usize>,
    pub deferred: bool,
    pub bind: bool,
    pub ipv6only: bool,
    /// `so_keepalive=on|off|idle:intvl:cnt`.
    pub so_keepalive: Option<SoKeepalive>,
    /// `ssl`: connections speak TLS (any server's `listen` of the address
    /// saying so makes it so, as in nginx).
    pub ssl: bool,
    /// `http2`: HTTP/2 on the address (TLS: offered by ALPN; cleartext:
    /// a connection that starts with the h2 preface).
    pub http2: bool,
    /// `proxy_protocol`: every connection starts with a PROXY header
    /// (`core::proxy_protocol`), read before TLS or HTTP.
    pub proxy_protocol: bool,
}

/// `so_keepalive=`: on/off, then TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT.
pub type SoKeepalive = (bool, Option<u64>, Option<u64>, Option<u32>);

/// Servers gathered per listen address: options, servers, the default.
type AddrGroup = (Listen, Vec<Arc<Server>>, Option<Arc<Server>>);

/// A `server_name` entry.
#[derive(Debug, Clone)]
pub enum ServerName {
    Exact(String),
    /// `*.example.com` (stored as `.example.com`), or `.example.com` which also
    /// matches `example.com` (stored with `also_bare`).
    Leading {
        suffix: String,
        also_bare: bool,
    },
    /// `example.*` (stored as `example.`).
    Trailing(String),
    Regex(Regex),
}

impl ServerName {
    /// Whether a lowercase `host` is this name (any kind of it).
    pub fn matches(&self, host: &str) -> bool {
        match self {
            ServerName::Exact(e) => e == host,
            ServerName::Leading { suffix, also_bare } => {
                host.ends_with(suffix.as_str()) || (*also_bare && host == &suffix[1..])
            }
            ServerName::Trailing(prefix) => host.starts_with(prefix.as_str()),
            ServerName::Regex(re) => re.is_match(host.as_bytes()),
        }
    }
}

/// The server among `servers` (in configuration order) that `host`
/// names, as nginx looks a name up (for `Host` in http, for the SNI name
/// in stream): exact, longest leading wildcard, longest trailing
/// wildcard, first matching regex; None: the address's default server.
/// `host` is compared lowercased and without a trailing dot.
pub fn select_by_name<'a, T>(
    servers: &'a [T],
    names: impl Fn(&T) -> &[ServerName],
    host: &[u8],
) -> Option<&'a T> {
    let host = std::str::from_utf8(host).unwrap_or("");
    let host = host.strip_suffix('.').unwrap_or(host);
    // The engine's hosts are lowercase already (request::validate_host).
    let lower: std::borrow::Cow<'_, str> = if host.bytes().any(|c| c.is_ascii_uppercase()) {
        host.to_ascii_lowercase().into()
    } else {
        host.into()
    };
    let lower: &str = &lower;
    for s in servers {
        if names(s)
            .iter()
            .any(|n| matches!(n, ServerName::Exact(e) if e == lower))
        {
            return Some(s);
        }
    }
    let mut best: Option<(&T, usize)> = None;
    for s in servers {
        for n in names(s) {
            if let ServerName::Leading { suffix, also_bare } = n {
                let hit = lower.ends_with(suffix.as_str()) || (*also_bare && lower == &suffix[1..]);
                if hit && best.is_none_or(|(_, l)| suffix.len() > l) {
                    best = Some((s, suffix.len()));
                }
            }
        }
    }
    if let Some((s, _)) = best {
        return Some(s);
    }
    for s in servers {
        for n in names(s) {
            if let ServerName::Trailing(prefix) = n {
                if lower.starts_with(prefix.as_str()) && best.is_none_or(|(_, l)| prefix.len() > l)
                {
                    best = Some((s, prefix.len()));
                }
            }
        }
    }
    if let Some((s, _)) = best {
        return Some(s);
    }
    servers.iter().find(|s| {
        names(s)
            .iter()
            .any(|n| matches!(n, ServerName::Regex(re) if re.is_match(lower.as_bytes())))
    })
}

/// Server-level configuration (also set at http level as the default).
#[derive(Debug, Clone, Default)]
pub struct SrvConf {
    pub listen: Vec<Listen>,
    pub names: Vec<ServerName>,
    /// The first name, for `$server_name` and redirects.
    pub primary_name: Option<String>,
    pub client_header_buffer_size: Option<usize>,
    pub large_client_header_buffers: Option<(usize, usize)>,
    pub client_header_timeout: Option<u64>,
    pub merge_slashes: Option<bool>,
    pub ignore_invalid_headers: Option<bool>,
    pub underscores_in_headers: Option<bool>,
    /// The `ssl_*` settings (`modules/ssl_settings.rs`).
    pub ssl: crate::http::modules::ssl_settings::SslConf,
    /// The `http2*` settings (`v2/conf.rs`).
    pub http2: crate::http::v2::conf::H2Srv,
    /// The `http3*` and `quic*` settings (`v3/conf.rs`).
    pub http3: crate::http::v3::conf::H3Srv,
}

impl SrvConf {
    fn merge(&mut self, p: &SrvConf) {
        merge_opts!(self, p; client_header_buffer_size, large_client_header_buffers,
            client_header_timeout, merge_slashes, ignore_invalid_headers, underscores_in_headers);
        self.ssl.merge(&p.ssl);
        self.http2.merge(&p.http2);
        self.http3.merge(&p.http3);
    }
    pub fn header_buffer(&self) -> usize {
        self.client_header_buffer_size.unwrap_or(1024)
    }
    pub fn large_buffers(&self) -> (usize, usize) {
        self.large_client_header_buffers.unwrap_or((4, 8192))
    }
    pub fn header_timeout_ms(&self) -> u64 {
        self.client_header_timeout.unwrap_or(60_000)
    }
}

/// `keepalive_timeout TIME [HEADER_TIME]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub timeout_ms: u64,
    pub header_secs: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lingering {
    Off,
    On,
    Always,
}

/// Core location-level settings (ngx_http_core_module's loc conf).
#[derive(Debug, Clone, Default)]
pub struct CoreLoc {
    /// `root` (false) or `alias` (true) with its template.
    pub root: Option<(Template, bool)>,
    /// With `alias`: the length of the name of the location that set it
    /// (nginx's `clcf->alias`, inherited by nested locations), the part
    /// of a URI the alias replaces; `usize::MAX` when that location is a
    /// regex (the alias is the whole path, and try_files appends the
    /// whole name to it).
    pub alias_len: Option<usize>,
    pub default_type: Option<Arc<str>>,
    pub types: Option<Arc<TypesMap>>,
    pub sendfile: Option<bool>,
    pub tcp_nopush: Option<bool>,
    pub tcp_nodelay: Option<bool>,
    pub keepalive: Option<Keepalive>,
    pub keepalive_requests: Option<u64>,
    /// `keepalive_time` in ms: the longest a connection serves requests.
    pub keepalive_time: Option<u64>,
    /// `limit_rate` in bytes per second (0: none) and `limit_rate_after`.
    pub limit_rate: Option<SizeValue>,
    pub limit_rate_after: Option<SizeValue>,
    pub send_timeout: Option<u64>,
    pub client_body_timeout: Option<u64>,
    pub client_max_body_size: Option<u64>,
    pub client_body_buffer_size: Option<u64>,
    pub reset_timedout_connection: Option<bool>,
    pub lingering_close: Option<Lingering>,
    pub lingering_time: Option<u64>,
    pub lingering_timeout: Option<u64>,
    pub server_tokens: Option<bool>,
    /// `chunked_transfer_encoding` (default on): off, a body of unknown
    /// length goes out unframed and the connection closes after it.
    pub chunked_transfer_encoding: Option<bool>,
    /// `http2_chunk_size` (default 8k): the most a DATA write carries.
    pub http2_chunk_size: Option<usize>,
    /// `msie_padding` (default on), `msie_refresh` (default off): see
    /// [`crate::http::response::special_response`].
    pub msie_padding: Option<bool>,
    pub msie_refresh: Option<bool>,
    pub postpone_output: Option<u64>,
    /// `subrequest_output_buffer_size` (default 4k, a page): the most a
    /// subrequest whose answer is kept in memory (SSI `include set=`) may
    /// answer.
    pub subrequest_output_buffer_size: Option<u64>,
    /// `post_action URI|@name|off`: see [`crate::http::phases::post_action`].
    pub post_action: Option<Option<Arc<[u8]>>>,
    /// `log_subrequest`: subrequests write access-log lines too.
    pub log_subrequest: Option<bool>,
    /// `keepalive_disable`: (msie6, safari); nginx's default is msie6.
    pub keepalive_disable: Option<(bool, bool)>,
    pub error_log: Option<Vec<ErrorLogSpec>>,
    /// Compiled from `error_log` after merging.
    pub logger: Option<Arc<Logger>>,
    /// Not inherited.
    pub internal: bool,
}

impl CoreLoc {
    fn merge(&mut self, p: &CoreLoc) {
        merge_opts!(self, p; root, alias_len, default_type, types, sendfile, tcp_nopush, tcp_nodelay,
            keepalive, keepalive_requests, keepalive_time, limit_rate, limit_rate_after,
            send_timeout, client_body_timeout,
            client_max_body_size, client_body_buffer_size, reset_timedout_connection,
            lingering_close, lingering_time, lingering_timeout, server_tokens, postpone_output, subrequest_output_buffer_size, post_action, log_subrequest, error_log, logger,
            chunked_transfer_encoding, msie_padding, msie_refresh, http2_chunk_size, keepalive_disable);
        // nginx merges keepalive_timeout's two values apart: a level that
        // gives only the timeout keeps the header time it inherits.
        if let (Some(k), Some(pk)) = (self.keepalive.as_mut(), p.keepalive) {
            if k.header_secs.is_none() {
                k.header_secs = pk.header_secs;
            }
        }
    }

    /// Applied once at http level so every descendant inherits a value.
    fn defaults(&mut self, cx: &Compiler) {
        if self.root.is_none() {
            self.root = Some((Template::literal(&cx.path("html").to_string_lossy()), false));
        }
        self.default_type.get_or_insert_with(|| "text/plain".into());
        self.types.get_or_insert_with(|| {
            let mut m = TypesMap::default();
            m.insert("html".into(), "text/html".into());
            m.insert("gif".into(), "image/gif".into());
            m.insert("jpg".into(), "image/jpeg".into());
            Arc::new(m)
        });
        self.sendfile.get_or_insert(false);
        self.tcp_nopush.get_or_insert(false);
        self.tcp_nodelay.get_or_insert(true);
        self.keepalive.get_or_insert(Keepalive {
            timeout_ms: 75_000,
            header_secs: None,
        });
        self.keepalive_requests.get_or_insert(1000);
        self.send_timeout.get_or_insert(60_000);
        self.client_body_timeout.get_or_insert(60_000);
        self.client_max_body_size.get_or_insert(1 << 20);
        self.client_body_buffer_size.get_or_insert(16 << 10);
        self.reset_timedout_connection.get_or_insert(false);
        self.lingering_close.get_or_insert(Lingering::On);
        self.lingering_time.get_or_insert(30_000);
        self.lingering_timeout.get_or_insert(5_000);
        self.server_tokens.get_or_insert(true);
    }
}

/// Location-level configuration: one field per module.
#[derive(Debug, Clone, Default)]
pub struct LocConf {
    pub core: CoreLoc,
    pub io: crate::io::IoLoc,
    pub modules: crate::http::modules::ModLoc,
    /// The content handler a `*_pass` directive put here (nginx's
    /// `clcf->handler`); inherited by `if` and `limit_except` blocks, not
    /// by nested locations.
    pub content: Option<crate::http::upstream::Handler>,
}

impl LocConf {
    pub fn merge(&mut self, parent: &LocConf) {
        self.content = self.content.or(parent.content);
        self.core.merge(&parent.core);
        self.io.merge(&parent.io);
        self.modules.merge(&parent.modules);
    }
}

/// How a location matches.
#[derive(Debug, Clone)]
pub enum LocMatch {
    Exact(Vec<u8>),
    Prefix { prefix: Vec<u8>, no_regex: bool },
    Regex { re: Regex, source: String },
    Named(String),
}

#[derive(Debug)]
pub struct Location {
    pub m: LocMatch,
    pub conf: Arc<LocConf>,
    pub nested: Locations,
    /// nginx's `auto_redirect`: a prefix or exact name ending in `/` whose
    /// own content handler is a `*_pass` (proxy, fastcgi); the name without
    /// its slash is answered with a 301 to the name.
    pub auto_redirect: bool,
}

/// The locations of one level, in lookup order.
#[derive(Debug, Default)]
pub struct Locations {
    /// Exact and prefix locations, longest prefix first.
    pub statics: Vec<Location>,
    /// Regex locations in config order.
    pub regexes: Vec<Location>,
}

/// The outcome of a location lookup.
pub struct Found<'a> {
    pub loc: &'a Location,
    /// Byte ranges of regex captures in the URI, `$0` first.
    pub captures: Vec<Option<(usize, usize)>>,
    pub capture_names: &'a [Option<String>],
    /// The request is the name of an `auto_redirect` location without its
    /// trailing slash: answer 301 to the name.
    pub auto_redirect: bool,
}

impl Locations {
    /// nginx's lookup: longest prefix (exact wins at once, `^~` stops),
    /// nested locations of the prefix match, then this level's regexes in
    /// order.
    pub fn find<'a>(&'a self, uri: &[u8]) -> Option<Found<'a>> {
        self.find_inner(uri).map(|(f, _)| f)
    }

    /// Returns the match and whether lookup is final (exact or `^~`, or a regex).
    fn find_inner<'a>(&'a self, uri: &[u8]) -> Option<(Found<'a>, bool)> {
        let mut best: Option<&Location> = None;
        for l in &self.statics {
            match &l.m {
                LocMatch::Exact(p) if p.as_slice() == uri => {
                    return Some((
                        Found {
                            loc: l,
                            captures: Vec::new(),
                            capture_names: &[],
                            auto_redirect: false,
                        },
                        true,
                    ));
                }
                LocMatch::Prefix { prefix, .. }
                    if uri.starts_with(prefix)
                        && best.is_none_or(|b| match &b.m {
                            LocMatch::Prefix { prefix: bp, .. } => prefix.len() > bp.len(),
                            _ => true,
                        }) =>
                {
                    best = Some(l);
                }
                _ => {}
            }
        }
        // nginx's auto_redirect: "/a" when "/a/" proxies (and no location
        // is named "/a") is a 301 to "/a/", ahead of regexes and of a
        // shorter prefix.
        let best_len = best.map_or(0, |b| match &b.m {
            LocMatch::Prefix { prefix, .. } => prefix.len(),
            _ => 0,
        });
        if best_len < uri.len() {
            let hit = self.statics.iter().find(|l| {
                l.auto_redirect
                    && match &l.m {
                        LocMatch::Prefix { prefix: n, .. } | LocMatch::Exact(n) => {
                            n.len() == uri.len() + 1 && n.starts_with(uri)
                        }
                        _ => false,
                    }
            });
            if let Some(l) = hit {
                return Some((
                    Found {
                        loc: l,
                        captures: Vec::new(),
                        capture_names: &[],
                        auto_redirect: true,
                    },
                    true,
                ));
            }
        }
        if let Some(b) = best {
            if let LocMatch::Prefix { no_regex: true, .. } = b.m {
                return Some((
                    Found {
                        loc: b,
                        captures: Vec::new(),
                        capture_names: &[],
                        auto_redirect: false,
                    },
                    true,
                ));
            }
            if let Some((f, fin)) = b.nested.find_inner(uri) {
                if fin {
                    return Some((f, true));
                }
                // A nested prefix match still yields to this level's regexes.
                if let Some(r) = self.find_regex(uri) {
                    return Some((r, true));
                }
                return Some((f, false));
            }
        }
        if let Some(r) = self.find_regex(uri) {
            return Some((r, true));
        }
        best.map(|b| {
            (
                Found {
                    loc: b,
                    captures: Vec::new(),
                    capture_names: &[],
                    auto_redirect: false,
                },
                false,
            )
        })
    }

    fn find_regex<'a>(&'a self, uri: &[u8]) -> Option<Found<'a>> {
        for l in &self.regexes {
            if let LocMatch::Regex { re, .. } = &l.m {
                if let Some(captures) = re.captures(uri) {
                    let capture_names = re.capture_names();
                    // Nested locations of a regex location are searched too.
                    if let Some((f, _)) = l.nested.find_inner(uri) {
                        return Some(f);
                    }
                    return Some(Found {
                        loc: l,
                        captures,
                        capture_names,
                        auto_redirect: false,
                    });
                }
            }
        }
        None
    }
}

/// A virtual server.
#[derive(Debug)]
pub struct Server {
    pub srv: SrvConf,
    /// Where the `server` block starts (nginx names it in some errors).
    pub at: (Arc<PathBuf>, usize),
    /// The server-level location configuration (used when no location matches).
    pub conf: Arc<LocConf>,
    pub locations: Locations,
    pub named: HashMap<String, Arc<Location>>,
}

/// The servers reachable through one listening address.
/// `types`: lowercase extension to MIME type. Built from the
/// configuration and only read per request, so a fast unkeyed hash
/// (a request cannot add keys to collide).
/// Extension to MIME type; the types are shared with the responses that
/// carry them (no copy per response).
pub type TypesMap = HashMap<String, Arc<str>, rustc_hash::FxBuildHasher>;

#[derive(Debug)]
pub struct AddrConf {
    pub listen: Listen,
    pub servers: Vec<Arc<Server>>,
    pub default: Arc<Server>,
}

impl AddrConf {
    /// Server selection by `Host` as nginx: exact, longest leading wildcard,
    /// longest trailing wildcard, first matching regex, else the default.
    pub fn select(&self, host: Option<&[u8]>) -> &Arc<Server> {
        // One server on the address: whatever the Host, it is the one
        // (the usual case; saves the name's UTF-8 check and the lookups).
        if let [only] = &self.servers[..] {
            if Arc::ptr_eq(only, &self.default) {
                return &self.default;
            }
        }
        let Some(host) = host else {
            return self.by_empty_name();
        };
        select_by_name(&self.servers, |s| &s.srv.names, host).unwrap_or(&self.default)
    }

    fn by_empty_name(&self) -> &Arc<Server> {
        for s in &self.servers {
            if s.srv
                .names
                .iter()
                .any(|n| matches!(n, ServerName::Exact(e) if e.is_empty()))
            {
                return s;
            }
        }
        &self.default
    }
}

/// The compiled `http` block.
#[derive(Debug)]
pub struct HttpConf {
    pub main: HttpMain,
    pub servers: Vec<Arc<Server>>,
    /// One entry per socket to bind.
    pub addrs: Vec<Arc<AddrConf>>,
    /// For wildcard sockets: the specific addresses sharing them (matched by
    /// the accepted connection's local address).
    pub specific: HashMap<SocketAddr, Arc<AddrConf>>,
}

impl HttpConf {
    /// The address configuration for a connection accepted on `bound`, whose
    /// local address is `local`.
    pub fn addr_for(&self, bound: &ListenAddr, local: Option<SocketAddr>) -> Option<Arc<AddrConf>> {
        if let Some(l) = local {
            if let Some(a) = self.specific.get(&l) {
                return Some(a.clone());
            }
        }
        self.addrs.iter().find(|a| &a.listen.addr == bound).cloned()
    }
}

macro_rules! merge_opts {
    ($s:ident, $p:ident; $($f:ident),* $(,)?) => {
        $( if $s.$f.is_none() { $s.$f = $p.$f.clone(); } )*
    };
}
pub(crate) use merge_opts;

/// Compiles the `http` block.
pub fn compile_http(d: &Directive, cx: &mut Compiler, _main: &MainConf) -> ConfResult<HttpConf> {
    let mut hm = HttpMain::default();
    let mut http_srv = SrvConf::default();
    let mut http_loc = LocConf::default();
    let mut server_dirs: Vec<&Directive> = Vec::new();
    let kids = d.block.as_deref().unwrap_or(&[]);
    // Pass 1: http-level directives. Server blocks are compiled after, so that
    // http-level settings written after a server block still apply to it.
    for k in kids {
        let spec = crate::core::conf::lookup(k, ctx::HTTP)?;
        match spec.set {
            Setter::Block if k.name == "server" => server_dirs.push(k),
            _ => apply(cx, &mut hm, Some(&mut http_srv), &mut http_loc, k, &spec)?,
        }
    }
    http_loc.core.defaults(cx);
    http_loc.modules.defaults();
    finish_loc(&mut http_loc)?;
    cx.io_main.check_loc(&http_loc.io)?;
    let mut servers = Vec::new();
    let mut keys = crate::tls::config::KeyCache::default();
    for sd in server_dirs {
        let mut s = compile_server(sd, cx, &mut hm, &http_srv, &http_loc)?;
        // Certificates are read here, on the master thread, at startup
        // and reload: a bad one fails the reload and the old
        // configuration keeps serving.
        crate::tls::config::build(&mut s.srv.ssl, &mut keys)?;
        if s.srv.http2.enable.unwrap_or(false) || s.srv.listen.iter().any(|l| l.http2) {
            crate::http::v2::conf::offer_h2(&mut s.srv.ssl.tls);
        }
        servers.push(Arc::new(s));
    }
    if let Some(msg) = cx.merge_error.take() {
        return Err(ConfError {
            msg,
            file: Some(d.file.to_path_buf()),
            line: d.end,
        });
    }
    let (addrs, specific) = group_addrs(&servers)?;
    crate::tls::config::check_addrs(addrs.iter().chain(specific.values()))?;
    cx.vars.finish()?;
    hm.vars = std::mem::take(&mut cx.vars);
    Ok(HttpConf {
        main: hm,
        servers,
        addrs,
        specific,
    })
}

pub(crate) fn apply(
    cx: &mut Compiler,
    hm: &mut HttpMain,
    srv: Option<&mut SrvConf>,
    loc: &mut LocConf,
    d: &Directive,
    spec: &Spec,
) -> ConfResult<()> {
    match spec.set {
        Setter::HttpMain(f) | Setter::HttpMainBlock(f) => f(hm, d, cx),
        Setter::Srv(f) => match srv {
            Some(s) => f(s, d, cx),
            None => Err(ConfError::at(
                format!("\"{}\" directive is not allowed here", d.name),
                d,
            )),
        },
        Setter::Loc(f) | Setter::LocBlock(f) => f(loc, d, cx),
        Setter::Main(_) | Setter::Block | Setter::Unsupported => Err(ConfError::at(
            format!("\"{}\" directive is not allowed here", d.name),
            d,
        )),
    }
}

/// Per-level work after a LocConf has been merged (e.g. opening error logs).
fn finish_loc(l: &mut LocConf) -> ConfResult<()> {
    if let Some(specs) = &l.core.error_log {
        let lg = Logger::from_specs(specs)
            .map_err(|e| ConfError::new(format!("open() error log failed ({})", e)))?;
        l.core.logger = Some(Arc::new(lg));
    }
    Ok(())
}

fn compile_server(
    d: &Directive,
    cx: &mut Compiler,
    hm: &mut HttpMain,
    http_srv: &SrvConf,
    http_loc: &LocConf,
) -> ConfResult<Server> {
    let mut srv = SrvConf::default();
    let mut loc = LocConf::default();
    let mut loc_dirs = Vec::new();
    for k in d.block.as_deref().unwrap_or(&[]) {
        let spec = crate::core::conf::lookup(k, ctx::SRV)?;
        match spec.set {
            Setter::Block if k.name == "location" => loc_dirs.push(k),
            Setter::Block if k.name == "server" => {
                return Err(ConfError::at("\"server\" directive is not allowed here", k))
            }
            Setter::Block => crate::http::modules::srv_block(k, cx, hm, &mut loc)?,
            _ => apply(cx, hm, Some(&mut srv), &mut loc, k, &spec)?,
        }
    }
    let own_error_log = loc.core.error_log.is_some();
    srv.merge(http_srv);
    loc.merge(http_loc);
    cx.io_main.check_loc(&loc.io)?;
    // The level's own error log first: its `if` blocks log there too.
    if own_error_log {
        loc.core.logger = None;
        finish_loc(&mut loc)?;
    }
    crate::http::modules::rewrite::finish_ifs(&mut loc);
    if srv.listen.is_empty() {
        // SAFETY: geteuid has no preconditions.
        let port = if unsafe { libc::geteuid() } == 0 {
            80
        } else {
            8000
        };
        srv.listen
            .push(default_listen(ListenAddr::Inet(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                port,
            ))));
    }
    if srv.names.is_empty() {
        srv.names.push(ServerName::Exact(String::new()));
    }
    if srv.ssl.legacy_on == Some(true) {
        for l in &mut srv.listen {
            l.ssl = true;
        }
    }
    let loc = Arc::new(loc);
    let mut locations = Locations::default();
    let mut named = HashMap::new();
    for ld in loc_dirs {
        let l = compile_location(ld, cx, hm, &loc, None)?;
        add_location(&mut locations, &mut named, l, ld)?;
    }
    sort_statics(&mut locations);
    Ok(Server {
        at: (d.file.clone(), d.line),
        srv,
        conf: loc,
        locations,
        named,
    })
}

fn default_listen(addr: ListenAddr) -> Listen {
    Listen {
        addr,
        default_server: false,
        reuseport: false,
        backlog: None,
        rcvbuf: None,
        sndbuf: None,
        deferred: false,
        bind: false,
        ipv6only: true,
        so_keepalive: None,
        ssl: false,
        http2: false,
        proxy_protocol: false,
    }
}

fn add_location(
    locs: &mut Locations,
    named: &mut HashMap<String, Arc<Location>>,
    l: Location,
    d: &Directive,
) -> ConfResult<()> {
    let dup = |a: &Location| match (&a.m, &l.m) {
        (LocMatch::Exact(x), LocMatch::Exact(y)) => x == y,
        (LocMatch::Prefix { prefix: x, .. }, LocMatch::Prefix { prefix: y, .. }) => x == y,
        _ => false,
    };
    if locs.statics.iter().any(dup) {
        let name = match &l.m {
            LocMatch::Exact(p) | LocMatch::Prefix { prefix: p, .. } => {
                String::from_utf8_lossy(p).into_owned()
            }
            _ => String::new(),
        };
        return Err(ConfError::at(format!("duplicate location \"{}\"", name), d));
    }
    match &l.m {
        LocMatch::Named(n) => {
            if named.contains_key(n) {
                return Err(ConfError::at(format!("duplicate location \"{}\"", n), d));
            }
            named.insert(n.clone(), Arc::new(l));
        }
        LocMatch::Regex { .. } => locs.regexes.push(l),
        _ => locs.statics.push(l),
    }
    Ok(())
}

fn sort_statics(l: &mut Locations) {
    // Exact first at equal length doesn't matter (exact is tested by equality);
    // longest prefix wins, so order by length for readability only.
    l.statics.sort_by_key(|x| match &x.m {
        LocMatch::Exact(p) | LocMatch::Prefix { prefix: p, .. } => std::cmp::Reverse(p.len()),
        _ => std::cmp::Reverse(0),
    });
}

fn compile_location(
    d: &Directive,
    cx: &mut Compiler,
    hm: &mut HttpMain,
    parent: &Arc<LocConf>,
    parent_match: Option<&LocMatch>,
) -> ConfResult<Location> {
    let a: Vec<&str> = d.args.iter().map(|a| a.value.as_str()).collect();
    let m = match a.as_slice() {
        ["=", p] => LocMatch::Exact(p.as_bytes().to_vec()),
        ["^~", p] => LocMatch::Prefix {
            prefix: p.as_bytes().to_vec(),
            no_regex: true,
        },
        ["~", r] => LocMatch::Regex {
            re: location_regex(d, r, false)?,
            source: r.to_string(),
        },
        ["~*", r] => LocMatch::Regex {
            re: location_regex(d, r, true)?,
            source: r.to_string(),
        },
        [p] if p.starts_with('@') => LocMatch::Named(p.to_string()),
        [p] if p.starts_with("~*") => LocMatch::Regex {
            re: location_regex(d, &p[2..], true)?,
            source: p[2..].to_string(),
        },
        [p] if p.starts_with('~') => LocMatch::Regex {
            re: location_regex(d, &p[1..], false)?,
            source: p[1..].to_string(),
        },
        [p] if p.starts_with('=') => LocMatch::Exact(p.as_bytes()[1..].to_vec()),
        [p] if p.starts_with("^~") => LocMatch::Prefix {
            prefix: p.as_bytes()[2..].to_vec(),
            no_regex: true,
        },
        [p] => LocMatch::Prefix {
            prefix: p.as_bytes().to_vec(),
            no_regex: false,
        },
        [m, _] => {
            return Err(ConfError::at(
                format!("invalid location modifier \"{}\"", m),
                d,
            ))
        }
        _ => return Err(registry::invalid_args(d)),
    };
    if let Some(pm) = parent_match {
        if matches!(pm, LocMatch::Exact(_)) {
            return Err(ConfError::at(
                format!(
                    "location \"{}\" cannot be inside the exact location \"{}\"",
                    a.last().unwrap_or(&""),
                    match pm {
                        LocMatch::Exact(p) => String::from_utf8_lossy(p).into_owned(),
                        _ => String::new(),
                    }
                ),
                d,
            ));
        }
        if matches!(pm, LocMatch::Named(_)) {
            return Err(ConfError::at(
                "location \"@\" could not be inside location",
                d,
            ));
        }
        if let (
            LocMatch::Prefix { prefix: pp, .. },
            LocMatch::Prefix { prefix: cp, .. } | LocMatch::Exact(cp),
        ) = (pm, &m)
        {
            if !cp.starts_with(pp) {
                return Err(ConfError::at(
                    format!(
                        "location \"{}\" is outside location \"{}\"",
                        String::from_utf8_lossy(cp),
                        String::from_utf8_lossy(pp)
                    ),
                    d,
                ));
            }
        }
        if matches!(m, LocMatch::Named(_)) {
            return Err(ConfError::at(
                format!(
                    "named location \"{}\" can be on the server level only",
                    a.last().unwrap_or(&"")
                ),
                d,
            ));
        }
    }
    if let LocMatch::Regex { re, .. } = &m {
        // Named captures become variables, as with PCRE in nginx.
        for name in re.names() {
            cx.vars.define(name);
        }
    }
    let mut loc = LocConf::default();
    let mut nested_dirs = Vec::new();
    for k in d.block.as_deref().unwrap_or(&[]) {
        let spec = crate::core::conf::lookup(k, ctx::LOC)?;
        match spec.set {
            Setter::Block if k.name == "location" => nested_dirs.push(k),
            Setter::Block => crate::http::modules::loc_block(k, cx, hm, &mut loc)?,
            _ => apply(cx, hm, None, &mut loc, k, &spec)?,
        }
    }
    if matches!(m, LocMatch::Regex { .. } | LocMatch::Named(_)) {
        crate::http::modules::proxy::check_no_uri_part(&loc, d.block.as_deref().unwrap_or(&[]))?;
    }
    if matches!(loc.core.root, Some((_, true))) {
        loc.core.alias_len = Some(match &m {
            LocMatch::Prefix { prefix: n, .. } | LocMatch::Exact(n) => n.len(),
            _ => usize::MAX,
        });
    }
    let own_error_log = loc.core.error_log.is_some();
    let own_content = loc.content.is_some();
    crate::http::modules::ModLoc::check_pass(&loc, hm, d.block.as_deref().unwrap_or(&[]))?;
    crate::http::modules::proxy::register_implicit(&loc, hm);
    if let Some(e) = crate::http::modules::secure_link::check_own(&loc.modules.secure_link) {
        cx.merge_error.get_or_insert_with(|| e.to_string());
    }
    loc.merge(parent);
    // A content handler belongs to its location: nginx does not pass the
    // enclosing location's proxy_pass on to a nested one (only to its
    // `if` and `limit_except` blocks, which merge on their own).
    if !own_content {
        loc.content = None;
        loc.modules.drop_inherited_pass();
    }
    // nginx's `unknown thread pool "NAME"` for `aio threads=NAME`.
    cx.io_main.check_loc(&loc.io)?;
    crate::http::modules::ModLoc::check_ssl(&mut loc)?;
    crate::http::modules::ModLoc::check_merged(&loc)?;
    // The location's own error log first: its `if` blocks log there too.
    if own_error_log {
        loc.core.logger = None;
        finish_loc(&mut loc)?;
    }
    crate::http::modules::rewrite::finish_ifs(&mut loc);
    // After the location's own error log is open: the block logs there.
    crate::http::modules::access::finish_limit_except(&mut loc);
    let loc = Arc::new(loc);
    let mut nested = Locations::default();
    let mut named = HashMap::new();
    for nd in nested_dirs {
        let l = compile_location(nd, cx, hm, &loc, Some(&m))?;
        add_location(&mut nested, &mut named, l, nd)?;
    }
    sort_statics(&mut nested);
    // Every `*_pass` sets nginx's auto_redirect (the content handler).
    let auto_redirect = own_content
        && match &m {
            LocMatch::Prefix { prefix: n, .. } | LocMatch::Exact(n) => n.ends_with(b"/"),
            _ => false,
        };
    Ok(Location {
        m,
        conf: loc,
        nested,
        auto_redirect,
    })
}

fn location_regex(d: &Directive, r: &str, caseless: bool) -> ConfResult<Regex> {
    Regex::compile(d, r, caseless)
}

type Grouped = (Vec<Arc<AddrConf>>, HashMap<SocketAddr, Arc<AddrConf>>);

fn group_addrs(servers: &[Arc<Server>]) -> ConfResult<Grouped> {
    // Gather (addr -> listen options, servers, default).
    let mut order: Vec<ListenAddr> = Vec::new();
    let mut by: HashMap<ListenAddr, AddrGroup> = HashMap::new();
    for s in servers {
        for l in &s.srv.listen {
            let e = by.entry(l.addr.clone()).or_insert_with(|| {
                order.push(l.addr.clone());
                (l.clone(), Vec::new(), None)
            });
            // `ssl`, `http2` and `proxy_protocol` on any server's listen
            // hold for the address (nginx ORs them).
            let (ssl, http2) = (e.0.ssl || l.ssl, e.0.http2 || l.http2);
            let pp = e.0.proxy_protocol || l.proxy_protocol;
            if l.default_server {
                if e.2.is_some() {
                    return Err(ConfError::new(format!(
                        "a duplicate default server for {}",
                        l.addr
                    )));
                }
                e.2 = Some(s.clone());
                // Socket options come from the default_server's listen.
                e.0 = l.clone();
            }
            e.0.ssl = ssl;
            e.0.http2 = http2;
            e.0.proxy_protocol = pp;
            if !e.1.iter().any(|x| Arc::ptr_eq(x, s)) {
                e.1.push(s.clone());
            }
        }
    }
    let build = |a: &ListenAddr, by: &HashMap<ListenAddr, AddrGroup>| -> Option<Arc<AddrConf>> {
        let (l, svs, def) = by.get(a)?;
        let default = def.clone().or_else(|| svs.first().cloned())?;
        Some(Arc::new(AddrConf {
            listen: l.clone(),
            servers: svs.clone(),
            default,
        }))
    };
    let mut addrs = Vec::new();
    let mut specific = HashMap::new();
    for a in &order {
        let Some(ac) = build(a, &by) else { continue };
        if let ListenAddr::Inet(sa) = a {
            if !sa.ip().is_unspecified() && !ac.listen.bind && !ac.listen.reuseport {
                let wild = SocketAddr::new(
                    if sa.is_ipv4() {
                        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                    } else {
                        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
                    },
                    sa.port(),
                );
                if by.contains_key(&ListenAddr::Inet(wild)) {
                    specific.insert(*sa, ac);
                    continue;
                }
            }
        }
        addrs.push(ac);
    }
    Ok((addrs, specific))
}

// ---- directives -----------------------------------------------------------

/// Parses a `listen` directive (also used by the stream module, which
/// rejects the http-only parameters itself).
pub fn parse_listen(d: &Directive) -> ConfResult<Listen> {
    let a = arg(d, 0);
    let addr = if let Some(p) = a.strip_prefix("unix:") {
        ListenAddr::Unix(PathBuf::from(p))
    } else {
        ListenAddr::Inet(parse_inet(a).ok_or_else(|| {
            // nginx blames the port when the part after the last `:` is not one.
            let port_bad = a
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.parse::<u16>().is_err() && !p.ends_with(']'));
            if (a.starts_with('[') || a.contains(':')) && !port_bad {
                ConfError::at(
                    format!("invalid host in \"{}\" of the \"listen\" directive", a),
                    d,
                )
            } else {
                ConfError::at(
                    format!("invalid port in \"{}\" of the \"listen\" directive", a),
                    d,
                )
            }
        })?)
    };
    let mut l = default_listen(addr);
    for p in d.args.iter().skip(1).map(|x| x.value.as_str()) {
        match p {
            "default_server" | "default" => l.default_server = true,
            "reuseport" => l.reuseport = true,
            "deferred" => l.deferred = true,
            "bind" => l.bind = true,
            _ if p.starts_with("backlog=") => {
                let v = &p[8..];
                let n: i32 = v
                    .parse()
                    .map_err(|_| ConfError::at(format!("invalid backlog \"{}\"", p), d))?;
                if n == 0 {
                    return Err(ConfError::at(format!("invalid backlog \"{}\"", p), d));
                }
                l.backlog = Some(n);
            }
            _ if p.starts_with("rcvbuf=") => {
                l.rcvbuf =
                    Some(value::size(&p[7..]).ok_or_else(|| {
                        ConfError::at(format!("invalid rcvbuf \"{}\"", &p[7..]), d)
                    })? as usize)
            }
            _ if p.starts_with("sndbuf=") => {
                l.sndbuf =
                    Some(value::size(&p[7..]).ok_or_else(|| {
                        ConfError::at(format!("invalid sndbuf \"{}\"", &p[7..]), d)
                    })? as usize)
            }
            _ if p.starts_with("ipv6only=") => match &p[9..] {
                "on" => l.ipv6only = true,
                "off" => l.ipv6only = false,
                v => {
                    return Err(ConfError::at(
                        format!("invalid ipv6only flags \"{}\"", v),
                        d,
                    ))
                }
            },
            _ if p.starts_with("so_keepalive=") => {
                let v = &p[13..];
                l.so_keepalive = Some(match v {
                    "on" => (true, None, None, None),
                    "off" => (false, None, None, None),
                    _ => {
                        let parts: Vec<&str> = v.split(':').collect();
                        if parts.len() != 3 {
                            return Err(ConfError::at(
                                format!("invalid so_keepalive value: \"{}\"", v),
                                d,
                            ));
                        }
                        let t = |s: &str| -> ConfResult<Option<u64>> {
                            if s.is_empty() {
                                Ok(None)
                            } else {
                                value::time_secs(s).map(Some).ok_or_else(|| {
                                    ConfError::at(
                                        format!("invalid so_keepalive value: \"{}\"", v),
                                        d,
                                    )
                                })
                            }
                        };
                        let cnt = if parts[2].is_empty() {
                            None
                        } else {
                            Some(parts[2].parse().map_err(|_| {
                                ConfError::at(format!("invalid so_keepalive value: \"{}\"", v), d)
                            })?)
                        };
                        (true, t(parts[0])?, t(parts[1])?, cnt)
                    }
                });
            }
            "ssl" => l.ssl = true,
            "http2" => l.http2 = true,
            "quic" => match l.addr {
                ListenAddr::Inet(a) => l.addr = ListenAddr::Udp(a),
                _ => return Err(ConfError::at(format!("invalid parameter \"{}\"", p), d)),
            },
            "proxy_protocol" => l.proxy_protocol = true,
            _ => return Err(ConfError::at(format!("invalid parameter \"{}\"", p), d)),
        }
    }
    if matches!(l.addr, ListenAddr::Udp(_)) {
        // nginx's checks, in its order.
        for (on, what) in [(l.ssl, "ssl"), (l.http2, "http2")] {
            if on {
                return Err(ConfError::at(
                    format!("\"{}\" parameter is incompatible with \"quic\"", what),
                    d,
                ));
            }
        }
    }
    Ok(l)
}

/// `addr:port`, `port`, `*:port`, `[v6]:port`, `addr` (port 80).
pub fn parse_inet(a: &str) -> Option<SocketAddr> {
    if let Ok(port) = a.parse::<u16>() {
        if port == 0 {
            return None;
        }
        return Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    }
    if let Some(rest) = a.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let ip: Ipv6Addr = ip.parse().ok()?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0)?,
            None if after.is_empty() => 80,
            None => return None,
        };
        return Some(SocketAddr::new(IpAddr::V6(ip), port));
    }
    let (host, port) = match a.rsplit_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().ok().filter(|p| *p != 0)?),
        None => (a, 80),
    };
    let ip = match host {
        "*" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        h => IpAddr::V4(h.parse().ok()?),
    };
    Some(SocketAddr::new(ip, port))
}

fn set_listen(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let mut ls = Vec::new();
    match port_range(arg(d, 0)) {
        // `listen ADDR:FIRST-LAST`: one listen per port, as nginx expands it.
        Some(Ok((host, first, last))) => {
            for port in first..=last {
                let mut one = d.clone();
                if let Some(a) = one.args.first_mut() {
                    a.value = format!("{}{}", host, port);
                }
                ls.push(parse_listen(&one)?);
            }
        }
        Some(Err(())) => {
            return Err(ConfError::at(
                format!(
                    "invalid port in \"{}\" of the \"listen\" directive",
                    arg(d, 0)
                ),
                d,
            ))
        }
        None => ls.push(parse_listen(d)?),
    }
    // A set, not a scan per address: a port range is one listen per port.
    let mut seen: std::collections::HashSet<ListenAddr> =
        s.listen.iter().map(|x| x.addr.clone()).collect();
    for l in ls {
        if !seen.insert(l.addr.clone()) {
            return Err(ConfError::at(format!("duplicate listen {}", l.addr), d));
        }
        s.listen.push(l);
    }
    Ok(())
}

/// `[HOST:]FIRST-LAST` (nginx's listen port range): what goes before
/// each port (`HOST:` or nothing) and the ports, `Err` for a range nginx
/// refuses (a port out of 1-65535, or the last below the first); `None`
/// when the address is not a range.
pub fn port_range(a: &str) -> Option<Result<(&str, u16, u16), ()>> {
    if a.starts_with("unix:") {
        return None;
    }
    let (host, ports) = match a.rfind(':') {
        Some(i) if !a[i + 1..].ends_with(']') => (&a[..=i], &a[i + 1..]),
        Some(_) => return None,
        None => ("", a),
    };
    let (f, l) = ports.split_once('-')?;
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
    if !digits(f) || !digits(l) {
        return None;
    }
    let num = |x: &str| x.parse::<u32>().ok().filter(|&n| (1..=65535).contains(&n));
    Some(match (num(f), num(l)) {
        (Some(f), Some(l)) if f <= l => Ok((host, f as u16, l as u16)),
        _ => Err(()),
    })
}

fn set_server_name(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    parse_server_names(d, cx, &mut s.names, &mut s.primary_name)
}

/// The names of a `server_name` directive (http's and stream's), appended
/// to `names`; the first name ever given becomes `primary` (`$server_name`).
pub fn parse_server_names(
    d: &Directive,
    cx: &mut Compiler,
    names: &mut Vec<ServerName>,
    primary: &mut Option<String>,
) -> ConfResult<()> {
    for a in &d.args {
        let n = a.value.as_str();
        if primary.is_none() {
            // `.example.com` names the server `example.com` ($server_name).
            let p = match n.strip_prefix('.') {
                Some(rest) if !rest.is_empty() => rest,
                _ => n,
            };
            *primary = Some(p.to_string());
        }
        let entry = if let Some(r) = n.strip_prefix('~') {
            // nginx compiles a name caseless when it has an uppercase letter
            // (hosts are compared lowercased).
            let re = Regex::compile(d, r, r.bytes().any(|b| b.is_ascii_uppercase()))?;
            // Named captures become variables, as with PCRE in nginx.
            for name in re.names() {
                cx.vars.define(name);
            }
            ServerName::Regex(re)
        } else if let Some(rest) = n.strip_prefix("*.") {
            ServerName::Leading {
                suffix: format!(".{}", rest.to_ascii_lowercase()),
                also_bare: false,
            }
        } else if n.starts_with('.') && n.len() > 1 {
            ServerName::Leading {
                suffix: n.to_ascii_lowercase(),
                also_bare: true,
            }
        } else if let Some(rest) = n.strip_suffix(".*") {
            ServerName::Trailing(format!("{}.", rest.to_ascii_lowercase()))
        } else if n.contains('*') {
            return Err(ConfError::at(
                format!("invalid server name or wildcard \"{}\"", n),
                d,
            ));
        } else {
            ServerName::Exact(n.to_ascii_lowercase())
        };
        names.push(entry);
    }
    Ok(())
}

macro_rules! srv_size {
    ($f:ident, $field:ident) => {
        fn $f(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
            let v = size_arg(d, 0)? as usize;
            set_once(&mut s.$field, v, d)
        }
    };
}
macro_rules! srv_flag {
    ($f:ident, $field:ident) => {
        fn $f(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
            let v = flag(d)?;
            set_once(&mut s.$field, v, d)
        }
    };
}
macro_rules! loc_flag {
    ($f:ident, $field:ident) => {
        fn $f(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
            let v = flag(d)?;
            set_once(&mut l.core.$field, v, d)
        }
    };
}
macro_rules! loc_msec {
    ($f:ident, $field:ident) => {
        fn $f(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
            let v = msec_arg(d, 0)?;
            set_once(&mut l.core.$field, v, d)
        }
    };
}
macro_rules! loc_size {
    ($f:ident, $field:ident) => {
        fn $f(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
            let v = size_arg(d, 0)?;
            set_once(&mut l.core.$field, v, d)
        }
    };
}

srv_size!(set_client_header_buffer_size, client_header_buffer_size);
srv_flag!(set_merge_slashes, merge_slashes);
srv_flag!(set_ignore_invalid_headers, ignore_invalid_headers);
srv_flag!(set_underscores_in_headers, underscores_in_headers);
loc_flag!(set_sendfile, sendfile);
loc_flag!(set_tcp_nopush, tcp_nopush);
loc_flag!(set_tcp_nodelay, tcp_nodelay);
loc_flag!(set_chunked_transfer_encoding, chunked_transfer_encoding);
loc_flag!(set_msie_padding, msie_padding);
loc_flag!(set_msie_refresh, msie_refresh);
loc_flag!(set_reset_timedout, reset_timedout_connection);
loc_msec!(set_send_timeout, send_timeout);
loc_msec!(set_client_body_timeout, client_body_timeout);
loc_msec!(set_lingering_time, lingering_time);
loc_msec!(set_lingering_timeout, lingering_timeout);
// An off_t slot in nginx: `8G` is valid here (not in size slots).
fn set_client_max_body_size(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = crate::config::registry::offset_arg(d, 0)?;
    set_once(&mut l.core.client_max_body_size, v, d)
}
loc_size!(set_client_body_buffer_size, client_body_buffer_size);

fn set_client_header_timeout(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = msec_arg(d, 0)?;
    set_once(&mut s.client_header_timeout, v, d)
}

fn set_large_buffers(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = value::number(arg(d, 0))
        .filter(|n| *n > 0)
        .ok_or_else(|| registry::slot_invalid(d))?;
    let size = size_arg(d, 1)?;
    if size == 0 {
        return Err(registry::slot_invalid(d));
    }
    set_once(
        &mut s.large_client_header_buffers,
        (n as usize, size as usize),
        d,
    )
}

fn set_server_tokens(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = match arg(d, 0) {
        "on" => true,
        "off" => false,
        "build" => true,
        v => return Err(registry::enum_invalid(d, v)),
    };
    set_once(&mut l.core.server_tokens, v, d)
}

fn set_keepalive_timeout(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let timeout_ms = msec_arg(d, 0)?;
    let header_secs = match d.args.get(1) {
        Some(a) => Some(value::time_secs(&a.value).ok_or_else(|| registry::slot_invalid(d))?),
        None => None,
    };
    set_once(
        &mut l.core.keepalive,
        Keepalive {
            timeout_ms,
            header_secs,
        },
        d,
    )
}

/// A size that may be given with variables (nginx's "complex value" of a
/// size: `limit_rate $rate;`), evaluated per request.
#[derive(Debug, Clone)]
pub enum SizeValue {
    Fixed(u64),
    Vars(Template),
}

impl SizeValue {
    /// The value when it needs no request.
    pub fn fixed(v: &Option<SizeValue>) -> Option<u64> {
        match v {
            Some(SizeValue::Fixed(n)) => Some(*n),
            _ => None,
        }
    }
}

fn set_limit_rate(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let t = cx.template(arg(d, 0), d)?;
    let v = if t.has_vars() {
        SizeValue::Vars(t)
    } else {
        SizeValue::Fixed(registry::size_arg(d, 0)?)
    };
    let slot = if d.name == "limit_rate" {
        &mut l.core.limit_rate
    } else {
        &mut l.core.limit_rate_after
    };
    set_once(slot, v, d)
}

fn set_log_subrequest(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.core.log_subrequest, registry::flag(d)?, d)
}

fn set_keepalive_time(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = registry::msec_arg(d, 0)?;
    set_once(&mut l.core.keepalive_time, v, d)
}

/// Directives of nginx's core module that size its memory pools or act
/// only on other platforms: values checked as nginx checks them, no
/// effect (see DIFFERENCES.md).
fn check_core_no_effect(_: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    match d.name.as_str() {
        "connection_pool_size" | "request_pool_size" => {
            let v = registry::size_arg(d, 0)?;
            if v < 112 {
                return Err(ConfError::at("the pool size must be no less than 112", d));
            }
            if v % 16 != 0 {
                return Err(ConfError::at("the pool size must be a multiple of 16", d));
            }
        }
        "send_lowat" => {
            registry::size_arg(d, 0)?;
            cx.warnings
                .push(ConfError::at("\"send_lowat\" is not supported, ignored", d).to_string());
        }
        _ => {
            for a in &d.args {
                if !matches!(a.value.as_str(), "none" | "msie6" | "safari") {
                    return Err(ConfError::at(format!("invalid value \"{}\"", a.value), d));
                }
            }
        }
    }
    Ok(())
}

fn set_keepalive_disable(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    check_core_no_effect(l, d, cx)?;
    let mut v = (false, false);
    for a in &d.args {
        match a.value.as_str() {
            "msie6" => v.0 = true,
            "safari" => v.1 = true,
            _ => {}
        }
    }
    set_once(&mut l.core.keepalive_disable, v, d)
}

fn set_keepalive_requests(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = value::number(arg(d, 0)).ok_or_else(|| registry::slot_invalid_number(d))?;
    set_once(&mut l.core.keepalive_requests, v, d)
}

fn set_lingering_close(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = match arg(d, 0) {
        "off" => Lingering::Off,
        "on" => Lingering::On,
        "always" => Lingering::Always,
        v => return Err(registry::enum_invalid(d, v)),
    };
    set_once(&mut l.core.lingering_close, v, d)
}

fn set_root(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let alias = d.name == "alias";
    if let Some((_, was_alias)) = &l.core.root {
        return Err(if *was_alias == alias {
            registry::duplicate(d)
        } else {
            ConfError::at(
                format!(
                    "\"{}\" directive is duplicate, \"{}\" directive was specified earlier",
                    d.name,
                    if *was_alias { "alias" } else { "root" }
                ),
                d,
            )
        });
    }
    let raw = arg(d, 0);
    let path = if raw.starts_with('$') || raw.starts_with('/') {
        raw.to_string()
    } else {
        cx.path(raw).to_string_lossy().into_owned()
    };
    let t = cx.template(&path, d)?;
    l.core.root = Some((t, alias));
    Ok(())
}

fn set_default_type(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.core.default_type, arg(d, 0).into(), d)
}

fn set_types(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let mut m: TypesMap = match &l.core.types {
        Some(t) => (**t).clone(),
        None => TypesMap::default(),
    };
    for e in d.block.as_deref().unwrap_or(&[]) {
        if e.block.is_some() {
            return Err(ConfError::at("unexpected \"{\"", e));
        }
        for ext in &e.args {
            // nginx keeps the first type given for an extension and warns.
            let key = ext.value.to_ascii_lowercase();
            if let Some(prev) = m.get(&key) {
                if **prev != *e.name {
                    crate::elog!(Warn, "duplicate extension \"{}\", content type: \"{}\", previous content type: \"{}\" in {}:{}", ext.value, e.name, prev, e.file.display(), e.line);
                }
                continue;
            }
            m.insert(key, e.name.as_str().into());
        }
    }
    l.core.types = Some(Arc::new(m));
    Ok(())
}

fn set_internal(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if l.core.internal {
        return Err(registry::duplicate(d));
    }
    l.core.internal = true;
    Ok(())
}

/// `postpone_output SIZE`: validated and kept. tern writes a response head
/// and small bodies in one `writev` and streams the rest in large chunks,
/// so there is no small output left to postpone.
fn set_postpone_output(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = size_arg(d, 0)?;
    set_once(&mut l.core.postpone_output, v, d)
}

fn set_post_action(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = arg(d, 0);
    set_once(
        &mut l.core.post_action,
        (v != "off").then(|| Arc::from(v.as_bytes())),
        d,
    )
}

fn set_subrequest_output_buffer_size(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let v = size_arg(d, 0)?;
    set_once(&mut l.core.subrequest_output_buffer_size, v, d)
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "server",
        ctx: ctx::HTTP,
        args: Args::take(0),
        set: Setter::Block,
    },
    Spec {
        name: "location",
        ctx: ctx::SRV | ctx::LOC,
        args: Args::take12(),
        set: Setter::Block,
    },
    Spec {
        name: "listen",
        ctx: ctx::SRV,
        args: Args::AtLeast(1),
        set: Setter::Srv(set_listen),
    },
    Spec {
        name: "server_name",
        ctx: ctx::SRV,
        args: Args::AtLeast(1),
        set: Setter::Srv(set_server_name),
    },
    Spec {
        name: "client_header_buffer_size",
        ctx: ctx::HTTP | ctx::SRV,
        args: Args::take(1),
        set: Setter::Srv(set_client_header_buffer_size),
    },
    Spec {
        name: "large_client_header_buffers",
        ctx: ctx::HTTP | ctx::SRV,
        args: Args::take(2),
        set: Setter::Srv(set_large_buffers),
    },
    Spec {
        name: "client_header_timeout",
        ctx: ctx::HTTP | ctx::SRV,
        args: Args::take(1),
        set: Setter::Srv(set_client_header_timeout),
    },
    Spec {
        name: "merge_slashes",
        ctx: ctx::HTTP | ctx::SRV,
        args: Args::Flag,
        set: Setter::Srv(set_merge_slashes),
    },
    Spec {
        name: "ignore_invalid_headers",
        ctx: ctx::HTTP | ctx::SRV,
        args: Args::Flag,
        set: Setter::Srv(set_ignore_invalid_headers),
    },
    Spec {
        name: "underscores_in_headers",
        ctx: ctx::HTTP | ctx::SRV,
        args: Args::Flag,
        set: Setter::Srv(set_underscores_in_headers),
    },
    Spec {
        name: "root",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::take(1),
        set: Setter::Loc(set_root),
    },
    Spec {
        name: "alias",
        ctx: ctx::LOC,
        args: Args::take(1),
        set: Setter::Loc(set_root),
    },
    Spec {
        name: "internal",
        ctx: ctx::LOC,
        args: Args::take(0),
        set: Setter::Loc(set_internal),
    },
    Spec {
        name: "types",
        ctx: ctx::HSL,
        args: Args::take(0),
        set: Setter::LocBlock(set_types),
    },
    Spec {
        name: "default_type",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_default_type),
    },
    Spec {
        name: "sendfile",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::Flag,
        set: Setter::Loc(set_sendfile),
    },
    Spec {
        name: "tcp_nopush",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_tcp_nopush),
    },
    Spec {
        name: "tcp_nodelay",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_tcp_nodelay),
    },
    Spec {
        name: "keepalive_timeout",
        ctx: ctx::HSL,
        args: Args::take12(),
        set: Setter::Loc(set_keepalive_timeout),
    },
    Spec {
        name: "limit_rate",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::take(1),
        set: Setter::Loc(set_limit_rate),
    },
    Spec {
        name: "limit_rate_after",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::take(1),
        set: Setter::Loc(set_limit_rate),
    },
    Spec {
        name: "keepalive_time",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_keepalive_time),
    },
    Spec {
        name: "connection_pool_size",
        ctx: ctx::HTTP | ctx::SRV,
        args: Args::take(1),
        set: Setter::Loc(check_core_no_effect),
    },
    Spec {
        name: "request_pool_size",
        ctx: ctx::HTTP | ctx::SRV,
        args: Args::take(1),
        set: Setter::Loc(check_core_no_effect),
    },
    Spec {
        name: "send_lowat",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(check_core_no_effect),
    },
    Spec {
        name: "post_action",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_post_action),
    },
    Spec {
        name: "subrequest_output_buffer_size",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_subrequest_output_buffer_size),
    },
    Spec {
        name: "log_subrequest",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_log_subrequest),
    },
    Spec {
        name: "keepalive_disable",
        ctx: ctx::HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_keepalive_disable),
    },
    Spec {
        name: "keepalive_requests",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_keepalive_requests),
    },
    Spec {
        name: "send_timeout",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_send_timeout),
    },
    Spec {
        name: "client_body_timeout",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_client_body_timeout),
    },
    Spec {
        name: "client_max_body_size",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_client_max_body_size),
    },
    Spec {
        name: "client_body_buffer_size",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_client_body_buffer_size),
    },
    Spec {
        name: "reset_timedout_connection",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_reset_timedout),
    },
    Spec {
        name: "lingering_close",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_lingering_close),
    },
    Spec {
        name: "lingering_time",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_lingering_time),
    },
    Spec {
        name: "lingering_timeout",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_lingering_timeout),
    },
    Spec {
        name: "chunked_transfer_encoding",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_chunked_transfer_encoding),
    },
    Spec {
        name: "msie_padding",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_msie_padding),
    },
    Spec {
        name: "msie_refresh",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_msie_refresh),
    },
    Spec {
        name: "server_tokens",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_server_tokens),
    },
    Spec {
        name: "postpone_output",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_postpone_output),
    },
];
