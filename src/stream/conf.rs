//! The `stream {}` block: the core module's directive table (`server`,
//! `listen`, `server_name`, `error_log`, `resolver`, `preread_*`,
//! `tcp_nodelay`..., and the small modules without code of their own:
//! `return`, `set`, `map`, `geo`, `split_clients`, `set_real_ip_from`),
//! the compiler that walks the block, and the compiled, immutable
//! [`StreamConf`].
//!
//! Stream directives are registry rows ([`crate::config::registry::Spec`])
//! with a setter enum of their own ([`StreamSetter`]: a stream directive
//! fills stream structs only). Each stream module has its table beside
//! its code, as http's do (`proxy`, `proxy_ssl`, `ssl`, `access`,
//! `limit_conn`, `log`, `upstream`, `pass`, `ssl_preread`; the list is
//! [`crate::stream::TABLES`]), and the lookup, its checks and their
//! wording are the registry's ([`crate::config::registry::Index`]). A
//! module's setters fill its fields of the level's [`ProxyConf`]; its
//! compiled settings are fields of [`StreamServer`], built in
//! [`finish_servers`] (by the module's own `build` where there is work).
//! The core compiler only hands over the `stream` block (see
//! [`compile_stream`]).
//!
//! Inheritance is nginx's: `proxy_*` and `error_log` set in `stream {}` are
//! the defaults of every `server {}` that does not set them itself.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::registry::{self, arg, ctx, flag, row, set_once, Args};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::{Compiler, ErrorLogSpec};
use crate::core::log::{Level, Logger};
use crate::http::conf::{Listen, ListenAddr, ServerName};
use crate::http::modules::access::{Addr, Rule};
use crate::http::modules::access_log::LogSpec;
use crate::http::modules::limit_conn::ConnZone;
use crate::http::vars::{Template, VarTable};
use crate::stream::upstream::{Balance, Peer, PeerAddr, Upstream};
use crate::tls::var_certs::{CertName, VarCerts};

/// nginx's defaults for the stream proxy.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
const DEFAULT_BUFFER_SIZE: usize = 16 * 1024;

/// The compiled `stream {}` block; part of [`crate::core::conf::Config`],
/// so it is swapped whole on reload and a session keeps the `Arc` of the
/// server it started on.
#[derive(Debug, Default)]
pub struct StreamConf {
    pub servers: Vec<Arc<StreamServer>>,
    /// The servers of each listening address.
    pub by_addr: HashMap<ListenAddr, Arc<StreamAddr>>,
    /// Every listening address once, in file order, for the master to bind.
    pub listens: Vec<Listen>,
}

impl StreamConf {
    /// The servers of a listening address (None once a reload removed it).
    pub fn addr_for(&self, addr: &ListenAddr) -> Option<Arc<StreamAddr>> {
        self.by_addr.get(addr).cloned()
    }

    /// The default server of a listening address.
    pub fn server_for(&self, addr: &ListenAddr) -> Option<Arc<StreamServer>> {
        self.by_addr.get(addr).map(|a| a.default.clone())
    }
}

/// The servers sharing one listening address (nginx 1.25.5's stream
/// virtual servers): a session starts in the default one, and moves to
/// the one whose `server_name` matches the SNI name, found by the TLS
/// handshake of an `ssl` address or by `ssl_preread`.
#[derive(Debug)]
pub struct StreamAddr {
    /// The options of the address: the `default_server` listen's, with
    /// `ssl` and `proxy_protocol` set when any server's listen says so.
    pub listen: Listen,
    /// In configuration order.
    pub servers: Vec<Arc<StreamServer>>,
    /// The `default_server`, else the first server.
    pub default: Arc<StreamServer>,
}

impl StreamAddr {
    /// The server an SNI name selects, as http selects by `Host`.
    pub fn select(&self, name: &[u8]) -> &Arc<StreamServer> {
        crate::http::conf::select_by_name(&self.servers, |s| &s.names, name)
            .unwrap_or(&self.default)
    }
}

/// What a server does with a session once the access checks passed.
#[derive(Debug)]
pub enum Content {
    /// `return VALUE`: send it and close.
    Return(Template),
    /// `proxy_pass ADDR|UPSTREAM`.
    Proxy(Arc<Upstream>),
    /// `proxy_pass` with variables: the rendered value names an upstream
    /// block or is an `ip:port` / `unix:path` address.
    ProxyVar(Template, Arc<HashMap<String, Arc<Upstream>>>),
    /// `pass ADDRESS`: the connection goes to another listener.
    Pass(crate::stream::pass::Target),
}

/// One compiled `server {}` of the stream block.
#[derive(Debug)]
pub struct StreamServer {
    pub listen: Vec<Listen>,
    /// `server_name`s, matched against the SNI name.
    pub names: Vec<ServerName>,
    /// The first of them (`$server_name`; empty without one).
    pub server_name: String,
    pub content: Content,
    /// The block's variables (shared by its servers).
    pub vars: Arc<VarTable>,
    /// `set $var value` in order: (user variable index, value).
    pub sets: Vec<(usize, Template)>,
    /// `allow`/`deny` in order.
    pub access: Vec<Rule>,
    pub limits: Vec<crate::stream::limit_conn::Limit>,
    pub limit_dry_run: bool,
    pub limit_log_level: Level,
    /// `access_log`s (empty: none, stream has no default log).
    pub logs: Vec<Arc<LogSpec>>,
    /// `set_real_ip_from`.
    pub realip_from: Vec<Addr>,
    /// `proxy_protocol on`: send a PROXY v1 header to the upstream.
    pub proxy_protocol: bool,
    pub proxy_protocol_timeout: Duration,
    /// Bytes per second (may have variables; 0 = no limit).
    pub download_rate: Template,
    pub upload_rate: Template,
    /// `proxy_bind ADDR`: the local address of upstream connections.
    pub bind: Option<Template>,
    pub ssl_preread: bool,
    pub preread_buffer_size: usize,
    pub preread_timeout: Duration,
    /// The TLS configuration of `listen ... ssl` addresses.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// `ssl_certificate` with variables: pairs loaded per handshake.
    pub var_certs: Option<Arc<crate::tls::var_certs::VarCerts>>,
    /// `ssl_reject_handshake on`.
    pub reject_handshake: bool,
    /// `ssl_verify_client` and its certificates (None: off).
    pub client_auth: Option<Arc<crate::tls::client_auth::ClientAuth>>,
    pub ssl_handshake_timeout: Duration,
    /// `proxy_ssl on`: the TLS client configuration toward the upstream.
    pub proxy_ssl: Option<Arc<rustls::ClientConfig>>,
    /// `proxy_ssl_certificate` with variables: loaded per connection.
    pub proxy_ssl_var_certs: Option<Arc<VarCerts>>,
    /// `proxy_ssl_name` (None: the host of `proxy_pass`).
    pub proxy_ssl_name: Option<Template>,
    /// `proxy_ssl_alpn` with variables: the protocols rendered per
    /// session (without variables they are in `proxy_ssl` already).
    pub proxy_ssl_alpn: Option<Vec<Template>>,
    /// `resolver`: names a `proxy_pass` with variables renders.
    pub resolver: crate::http::modules::resolver::ResolverLoc,
    pub connect_timeout: Duration,
    /// Idle timeout between two successive reads or writes (`proxy_timeout`).
    pub timeout: Duration,
    pub buffer_size: usize,
    pub next_upstream: bool,
    /// 0 = no limit.
    pub next_upstream_tries: usize,
    /// None = no limit.
    pub next_upstream_timeout: Option<Duration>,
    pub half_close: bool,
    /// UDP: `proxy_requests` (0: the client stays bound to its session)
    /// and `proxy_responses` (None: not limited).
    pub requests: u64,
    pub responses: Option<u64>,
    pub socket_keepalive: bool,
    pub tcp_nodelay: bool,
    /// `error_log` of this server (or inherited from `stream`); None = main log.
    pub logger: Option<Arc<Logger>>,
}

/// Directives that inherit from `stream` into `server` (nginx's srv conf
/// merged with its main conf), every module's; unset fields take the
/// defaults at the end.
#[derive(Debug, Clone, Default)]
pub struct ProxyConf {
    pub connect_timeout: Option<Duration>,
    pub timeout: Option<Duration>,
    pub buffer_size: Option<usize>,
    pub next_upstream: Option<bool>,
    pub next_upstream_tries: Option<usize>,
    pub next_upstream_timeout: Option<Duration>,
    pub half_close: Option<bool>,
    pub socket_keepalive: Option<bool>,
    pub tcp_nodelay: Option<bool>,
    pub error_log: Option<Vec<ErrorLogSpec>>,
    pub access: Option<Vec<Rule>>,
    /// `limit_conn ZONE N` as written (resolved once the block is read).
    pub limits: Option<Vec<(String, u32, Directive)>>,
    pub limit_dry_run: Option<bool>,
    pub limit_log_level: Option<Level>,
    /// Some(empty) is `access_log off`.
    pub logs: Option<Vec<Arc<LogSpec>>>,
    pub realip_from: Option<Vec<Addr>>,
    pub proxy_protocol: Option<bool>,
    pub proxy_protocol_timeout: Option<Duration>,
    pub download_rate: Option<Template>,
    pub upload_rate: Option<Template>,
    /// Some(None): `proxy_bind off`.
    pub bind: Option<Option<Template>>,
    pub ssl_preread: Option<bool>,
    pub preread_buffer_size: Option<usize>,
    pub preread_timeout: Option<Duration>,
    pub ssl: crate::http::modules::ssl_settings::SslConf,
    pub ssl_handshake_timeout: Option<Duration>,
    pub ssl_alpn: Option<Vec<Vec<u8>>>,
    pub proxy_ssl: Option<bool>,
    pub proxy_ssl_session_reuse: Option<bool>,
    pub proxy_ssl_server_name: Option<bool>,
    pub proxy_ssl_verify: Option<bool>,
    pub proxy_ssl_name: Option<Template>,
    pub proxy_ssl_trusted: Option<Arc<crate::tls::client::Trusted>>,
    pub proxy_ssl_protocols: Option<(bool, bool)>,
    pub proxy_ssl_ciphers: Option<String>,
    pub proxy_ssl_verify_depth: Option<u64>,
    /// `proxy_ssl_certificate`, `_key` (files, `data:`, or names with
    /// variables), `proxy_ssl_password_file` (a path).
    pub proxy_ssl_certificate: Option<CertName>,
    pub proxy_ssl_certificate_key: Option<CertName>,
    pub proxy_ssl_password_file: Option<String>,
    /// `proxy_ssl_crl`, read (DER).
    pub proxy_ssl_crl: Option<Arc<Vec<Vec<u8>>>>,
    /// `proxy_ssl_conf_command`s in order (a level that has any replaces
    /// the inherited ones, as nginx's array).
    pub proxy_ssl_conf_commands: Option<Vec<crate::tls::conf_command::Cmd>>,
    /// `proxy_ssl_alpn`: the protocols, each may have variables.
    pub proxy_ssl_alpn: Option<Vec<Template>>,
    /// `resolver`, `resolver_timeout` (http's parsing and lookups).
    pub resolver: crate::http::modules::resolver::ResolverLoc,
    pub requests: Option<u64>,
    pub responses: Option<u64>,
}

impl ProxyConf {
    fn merge(&mut self, p: &ProxyConf) {
        macro_rules! inherit {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = p.$f.clone(); } )* };
        }
        inherit!(
            connect_timeout,
            timeout,
            buffer_size,
            next_upstream,
            next_upstream_tries,
            next_upstream_timeout,
            half_close,
            socket_keepalive,
            tcp_nodelay,
            error_log,
            access,
            limits,
            limit_dry_run,
            limit_log_level,
            logs,
            realip_from,
            proxy_protocol,
            proxy_protocol_timeout,
            download_rate,
            upload_rate,
            bind,
            ssl_preread,
            preread_buffer_size,
            preread_timeout,
            ssl_handshake_timeout,
            ssl_alpn,
            proxy_ssl,
            proxy_ssl_session_reuse,
            proxy_ssl_server_name,
            proxy_ssl_verify,
            proxy_ssl_name,
            proxy_ssl_trusted,
            proxy_ssl_protocols,
            proxy_ssl_ciphers,
            proxy_ssl_verify_depth,
            proxy_ssl_certificate,
            proxy_ssl_certificate_key,
            proxy_ssl_password_file,
            proxy_ssl_crl,
            proxy_ssl_conf_commands,
            proxy_ssl_alpn,
            requests,
            responses
        );
        self.ssl.merge(&p.ssl);
        self.resolver.merge(&p.resolver);
    }
}

/// A `server {}` while its block is being read.
#[derive(Debug, Default)]
pub struct SrvBuild {
    pub listen: Vec<Listen>,
    /// `proxy_pass` target as written, with its directive for error locations.
    pub pass: Option<(String, Directive)>,
    pub ret: Option<Template>,
    /// `pass ADDRESS` (the pass module).
    pub pass_to: Option<crate::stream::pass::Target>,
    /// The content directive written last (`return`, `proxy_pass`,
    /// `pass`): it is the server's handler, as in nginx.
    pub last_content: &'static str,
    pub sets: Vec<(usize, Template)>,
    pub names: Vec<ServerName>,
    pub primary_name: Option<String>,
    /// Each `listen` with whether it says `ssl` (for error locations).
    pub listen_dirs: Vec<(bool, Directive)>,
    pub proxy: ProxyConf,
}

/// An `upstream {}` while its block is being read.
#[derive(Debug, Default)]
pub struct UpsBuild {
    pub peers: Vec<Peer>,
    pub backup: Vec<Peer>,
    pub balance: Option<Balance>,
}

/// The `stream {}` block while it is being read.
#[derive(Debug, Default)]
pub struct MainBuild {
    pub proxy: ProxyConf,
    pub servers: Vec<(SrvBuild, Directive)>,
    pub upstreams: HashMap<String, Arc<Upstream>>,
    /// `limit_conn_zone`s by name.
    pub zones: HashMap<String, Arc<ConnZone>>,
}

/// Which struct a stream directive's setter fills.
#[derive(Clone, Copy)]
pub enum StreamSetter {
    /// `proxy_*`/`error_log`: allowed in `stream` and `server`, inherited.
    Proxy(fn(&mut ProxyConf, &Directive, &mut Compiler) -> ConfResult<()>),
    /// Server-only (`listen`, `proxy_pass`).
    Srv(fn(&mut SrvBuild, &Directive, &mut Compiler) -> ConfResult<()>),
    /// Inside `upstream {}`.
    Ups(fn(&mut UpsBuild, &Directive, &mut Compiler) -> ConfResult<()>),
    /// `stream`-level state (`limit_conn_zone`).
    Main(fn(&mut MainBuild, &Directive, &mut Compiler) -> ConfResult<()>),
    /// Fills only the block's variable table (`map`, `geo`,
    /// `split_clients`, `log_format`): http's compilers, run against the
    /// stream table.
    Vars(fn(&Directive, &mut Compiler) -> ConfResult<()>),
    /// Like `Vars`, for a directive with a `{}` block.
    VarsBlock(fn(&Directive, &mut Compiler) -> ConfResult<()>),
    /// `server` and `upstream` blocks, handled by the walker itself.
    Block,
    /// Accepted for compatibility; has no effect in tern (the reason is at
    /// the row). The function checks the value as nginx would.
    Ignored(fn(&Directive) -> ConfResult<()>),
    /// nginx has it, tern does not yet: a startup error naming it.
    Unsupported,
}

impl registry::Set for StreamSetter {
    fn takes_block(&self) -> bool {
        matches!(self, StreamSetter::Block | StreamSetter::VarsBlock(_))
    }
    fn unsupported(&self) -> bool {
        matches!(self, StreamSetter::Unsupported)
    }
}

/// One row of a stream module's directive table.
pub type StreamSpec = registry::Spec<StreamSetter>;

/// `stream` and `server`: where most stream directives may stand.
pub const SS: u32 = ctx::STREAM | ctx::STREAM_SRV;

/// The stream module's directives.
pub const DIRECTIVES: &[StreamSpec] = &[
    row!("server", ctx::STREAM, Args::take(0), StreamSetter::Block),
    row!(
        "listen",
        ctx::STREAM_SRV,
        Args::AtLeast(1),
        StreamSetter::Srv(set_listen)
    ),
    row!(
        "server_name",
        ctx::STREAM_SRV,
        Args::AtLeast(1),
        StreamSetter::Srv(set_server_name)
    ),
    // Names are matched without a hash table: nothing to size.
    row!(
        "server_names_hash_max_size",
        ctx::STREAM,
        Args::take(1),
        StreamSetter::Ignored(check_number)
    ),
    row!(
        "server_names_hash_bucket_size",
        ctx::STREAM,
        Args::take(1),
        StreamSetter::Ignored(check_number)
    ),
    row!(
        "error_log",
        SS,
        Args::AtLeast(1),
        StreamSetter::Proxy(set_error_log)
    ),
    row!(
        "tcp_nodelay",
        SS,
        Args::Flag,
        StreamSetter::Proxy(set_tcp_nodelay)
    ),
    row!(
        "preread_buffer_size",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_preread_buffer_size)
    ),
    row!(
        "preread_timeout",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_preread_timeout)
    ),
    row!(
        "variables_hash_max_size",
        ctx::STREAM,
        Args::take(1),
        StreamSetter::Ignored(check_number)
    ),
    row!(
        "variables_hash_bucket_size",
        ctx::STREAM,
        Args::take(1),
        StreamSetter::Ignored(check_number)
    ),
    row!(
        "map",
        ctx::STREAM,
        Args::take(2),
        StreamSetter::VarsBlock(crate::http::modules::map::compile_map)
    ),
    row!(
        "geo",
        ctx::STREAM,
        Args::take12(),
        StreamSetter::VarsBlock(crate::http::modules::geo::compile_geo)
    ),
    row!(
        "split_clients",
        ctx::STREAM,
        Args::take(2),
        StreamSetter::VarsBlock(crate::http::modules::map::compile_split_clients)
    ),
    row!(
        "return",
        ctx::STREAM_SRV,
        Args::take(1),
        StreamSetter::Srv(set_return)
    ),
    row!(
        "set",
        ctx::STREAM_SRV,
        Args::take(2),
        StreamSetter::Srv(set_set)
    ),
    row!(
        "resolver",
        SS,
        Args::AtLeast(1),
        StreamSetter::Proxy(set_resolver)
    ),
    row!(
        "resolver_timeout",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_resolver_timeout)
    ),
    row!(
        "proxy_protocol_timeout",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_protocol_timeout)
    ),
    row!(
        "set_real_ip_from",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_real_ip_from)
    ),
];

fn index() -> &'static registry::Index<StreamSetter> {
    static INDEX: std::sync::OnceLock<registry::Index<StreamSetter>> = std::sync::OnceLock::new();
    INDEX.get_or_init(|| registry::Index::new(crate::stream::TABLES.iter().copied()))
}

/// Whether `name` is a stream directive (the core compiler uses this to
/// say "not allowed here" rather than "unknown" outside `stream {}`).
pub fn known(name: &str) -> bool {
    index().knows(name)
}

/// Finds the row for `d` in context `here`, with the registry's checks and wording.
fn lookup(d: &Directive, here: u32) -> ConfResult<StreamSpec> {
    index().find(d, here, crate::core::conf::known_directive)
}

// Checks of the directives accepted without effect: a value nginx would
// refuse is refused here too, in nginx's words.
fn check_number(d: &Directive) -> ConfResult<()> {
    crate::config::registry::num_arg(d, 0).map(drop)
}

/// Compiles a `stream {}` directive.
///
/// The block has its own variable table (in stream mode): the compiler's
/// http table is set aside while the block is read, so `map`, `geo`,
/// `split_clients` and `log_format` of http's modules fill the stream
/// table, and stream names never meet http's.
pub fn compile_stream(d: &Directive, cx: &mut Compiler) -> ConfResult<StreamConf> {
    let table = VarTable::for_stream();
    let http_vars = std::mem::replace(&mut cx.vars, table);
    let r = compile_block(d, cx);
    let stream_vars = std::mem::replace(&mut cx.vars, http_vars);
    let (m, builds) = r?;
    stream_vars.finish()?;
    finish_servers(m, builds, Arc::new(stream_vars))
}

type Builds = Vec<(SrvBuild, Directive)>;

fn compile_block(d: &Directive, cx: &mut Compiler) -> ConfResult<(MainBuild, Builds)> {
    let mut m = MainBuild::default();
    let kids = d.block.as_deref().unwrap_or(&[]);
    // Servers are only collected here; their `proxy_pass` is resolved once
    // the whole block is read, because it may name an upstream defined
    // further down, as nginx allows.
    for k in kids {
        let spec = lookup(k, ctx::STREAM)?;
        match spec.set {
            StreamSetter::Proxy(f) => f(&mut m.proxy, k, cx)?,
            StreamSetter::Block if k.name == "upstream" => upstream_block(&mut m, k, cx)?,
            StreamSetter::Block => m.servers.push((server_block(k, cx)?, k.clone())),
            StreamSetter::Ignored(check) => check(k)?,
            StreamSetter::Main(f) => f(&mut m, k, cx)?,
            StreamSetter::Vars(f) | StreamSetter::VarsBlock(f) => f(k, cx)?,
            // lookup() only returns these in other contexts.
            StreamSetter::Srv(_) | StreamSetter::Ups(_) | StreamSetter::Unsupported => {
                return Err(ConfError::at(
                    format!("\"{}\" directive is not allowed here", k.name),
                    k,
                ))
            }
        }
    }
    let builds = std::mem::take(&mut m.servers);
    Ok((m, builds))
}

fn finish_servers(m: MainBuild, builds: Builds, vars: Arc<VarTable>) -> ConfResult<StreamConf> {
    let mut out = StreamConf::default();
    let keys = &mut crate::tls::config::KeyCache::default();
    let mut implicit: HashMap<String, Arc<Upstream>> = HashMap::new();
    let mut grouped = Grouped::default();
    let all_upstreams = Arc::new(m.upstreams.clone());
    // `ssl` on one server's listen makes the address TLS for every
    // server on it (nginx ORs the listen options of an address).
    let ssl_addrs: std::collections::HashSet<ListenAddr> = builds
        .iter()
        .flat_map(|(sb, _)| sb.listen.iter().filter(|l| l.ssl).map(|l| l.addr.clone()))
        .collect();
    for (mut sb, sd) in builds {
        sb.proxy.merge(&m.proxy);
        let content = match (sb.ret.take(), sb.pass.take()) {
            (Some(t), _) => Content::Return(t),
            (None, None) if sb.pass_to.is_some() => Content::Pass(
                sb.pass_to
                    .take()
                    .ok_or_else(|| ConfError::at("no handler for server", &sd))?,
            ),
            (None, Some((target, pd))) if target.contains('$') => {
                let t = Template::compile_existing(&target, &vars)
                    .map_err(|msg| ConfError::at(msg, &pd))?;
                Content::ProxyVar(t, all_upstreams.clone())
            }
            (None, Some((target, pd))) => {
                let u = match m.upstreams.get(&target).or_else(|| implicit.get(&target)) {
                    Some(u) => u.clone(),
                    None => {
                        let u = crate::stream::proxy::implicit_upstream(
                            &target,
                            resolve(&target, &pd, "upstream")?,
                        );
                        implicit.insert(target.clone(), u.clone());
                        u
                    }
                };
                Content::Proxy(u)
            }
            (None, None) => return Err(ConfError::at("no handler for server", &sd)),
        };
        let p = &sb.proxy;
        let logger = Logger::for_block(p.error_log.as_deref(), &sd)?;
        let on_ssl_addr = sb.listen.iter().any(|l| ssl_addrs.contains(&l.addr));
        let tls = crate::stream::ssl::build(p, on_ssl_addr, keys)?;
        let pssl = crate::stream::proxy_ssl::build(p, &sd)?;
        let limits = crate::stream::limit_conn::resolve(p, &m)?;
        let srv = Arc::new(StreamServer {
            listen: sb.listen.clone(),
            names: std::mem::take(&mut sb.names),
            server_name: sb.primary_name.take().unwrap_or_default(),
            content,
            vars: vars.clone(),
            sets: std::mem::take(&mut sb.sets),
            access: p.access.clone().unwrap_or_default(),
            limits,
            limit_dry_run: p.limit_dry_run.unwrap_or(false),
            limit_log_level: p.limit_log_level.unwrap_or(Level::Error),
            logs: p.logs.clone().unwrap_or_default(),
            realip_from: p.realip_from.clone().unwrap_or_default(),
            proxy_protocol: p.proxy_protocol.unwrap_or(false),
            proxy_protocol_timeout: p.proxy_protocol_timeout.unwrap_or(Duration::from_secs(30)),
            download_rate: p
                .download_rate
                .clone()
                .unwrap_or_else(|| Template::literal("0")),
            upload_rate: p
                .upload_rate
                .clone()
                .unwrap_or_else(|| Template::literal("0")),
            bind: p.bind.clone().flatten(),
            ssl_preread: p.ssl_preread.unwrap_or(false),
            preread_buffer_size: p.preread_buffer_size.unwrap_or(16384),
            preread_timeout: p.preread_timeout.unwrap_or(Duration::from_secs(30)),
            tls: tls.tls,
            var_certs: tls.var_certs,
            reject_handshake: tls.reject_handshake,
            client_auth: tls.client_auth,
            ssl_handshake_timeout: tls.handshake_timeout,
            proxy_ssl: pssl.client,
            proxy_ssl_var_certs: pssl.var_certs,
            proxy_ssl_name: p.proxy_ssl_name.clone(),
            proxy_ssl_alpn: pssl.alpn,
            resolver: p.resolver.clone(),
            connect_timeout: p.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            timeout: p.timeout.unwrap_or(DEFAULT_TIMEOUT),
            buffer_size: p.buffer_size.unwrap_or(DEFAULT_BUFFER_SIZE),
            next_upstream: p.next_upstream.unwrap_or(true),
            next_upstream_tries: p.next_upstream_tries.unwrap_or(0),
            next_upstream_timeout: p.next_upstream_timeout.filter(|t| !t.is_zero()),
            half_close: p.half_close.unwrap_or(false),
            requests: p.requests.unwrap_or(0),
            responses: p.responses,
            socket_keepalive: p.socket_keepalive.unwrap_or(false),
            tcp_nodelay: p.tcp_nodelay.unwrap_or(true),
            logger,
        });
        for (l, (_, ld)) in sb.listen.iter().zip(&sb.listen_dirs) {
            grouped.add(l, &srv, ld)?;
        }
        out.servers.push(srv);
    }
    for a in grouped.order {
        let Some((listen, servers, default, dirs)) = grouped.by.remove(&a) else {
            continue;
        };
        let Some(default) = default.or_else(|| servers.first().cloned()) else {
            continue;
        };
        // As nginx 1.25.5 checks an `ssl` address: its default server
        // (the one a handshake without SNI gets) must have a certificate.
        if listen.ssl && default.tls.is_none() && !default.reject_handshake {
            let at = servers
                .iter()
                .position(|s| Arc::ptr_eq(s, &default))
                .and_then(|i| dirs.get(i))
                .or(dirs.first());
            if let Some(d) = at {
                return Err(ConfError::at(
                    "no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive",
                    d,
                ));
            }
        }
        out.listens.push(listen.clone());
        out.by_addr.insert(
            a,
            Arc::new(StreamAddr {
                listen,
                servers,
                default,
            }),
        );
    }
    Ok(out)
}

/// Servers gathered per listening address, in file order.
#[derive(Default)]
struct Grouped {
    order: Vec<ListenAddr>,
    #[allow(clippy::type_complexity)]
    by: HashMap<
        ListenAddr,
        (
            Listen,
            Vec<Arc<StreamServer>>,
            Option<Arc<StreamServer>>,
            Vec<Directive>,
        ),
    >,
}

impl Grouped {
    fn add(&mut self, l: &Listen, srv: &Arc<StreamServer>, d: &Directive) -> ConfResult<()> {
        let e = self.by.entry(l.addr.clone()).or_insert_with(|| {
            self.order.push(l.addr.clone());
            (l.clone(), Vec::new(), None, Vec::new())
        });
        let (ssl, pp) = (e.0.ssl || l.ssl, e.0.proxy_protocol || l.proxy_protocol);
        if l.default_server {
            if e.2.is_some() {
                return Err(ConfError::at(
                    format!("a duplicate default server for {}", l.addr),
                    d,
                ));
            }
            e.2 = Some(srv.clone());
            // Socket options come from the default_server's listen.
            e.0 = l.clone();
        }
        e.0.ssl = ssl;
        e.0.proxy_protocol = pp;
        e.1.push(srv.clone());
        e.3.push(d.clone());
        Ok(())
    }
}

fn server_block(d: &Directive, cx: &mut Compiler) -> ConfResult<SrvBuild> {
    let mut sb = SrvBuild::default();
    for k in d.block.as_deref().unwrap_or(&[]) {
        let spec = lookup(k, ctx::STREAM_SRV)?;
        match spec.set {
            StreamSetter::Srv(f) => f(&mut sb, k, cx)?,
            StreamSetter::Proxy(f) => f(&mut sb.proxy, k, cx)?,
            StreamSetter::Ignored(check) => check(k)?,
            _ => {
                return Err(ConfError::at(
                    format!("\"{}\" directive is not allowed here", k.name),
                    k,
                ))
            }
        }
    }
    // Each sets the server's content handler in nginx: the last one wins.
    if sb.last_content != "return" {
        sb.ret = None;
    }
    if sb.last_content != "proxy_pass" {
        sb.pass = None;
    }
    if sb.last_content != "pass" {
        sb.pass_to = None;
    }
    Ok(sb)
}

fn upstream_block(m: &mut MainBuild, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let name = arg(d, 0).to_string();
    if m.upstreams.contains_key(&name) {
        return Err(ConfError::at(format!("duplicate upstream \"{}\"", name), d));
    }
    let mut ub = UpsBuild::default();
    for k in d.block.as_deref().unwrap_or(&[]) {
        let spec = lookup(k, ctx::STREAM_UPS)?;
        match spec.set {
            StreamSetter::Ups(f) => f(&mut ub, k, cx)?,
            StreamSetter::Ignored(check) => check(k)?,
            _ => {
                return Err(ConfError::at(
                    format!("\"{}\" directive is not allowed here", k.name),
                    k,
                ))
            }
        }
    }
    if ub.peers.is_empty() {
        return Err(ConfError::at("no servers are inside upstream", d));
    }
    let u = Upstream::new(
        name.clone(),
        ub.peers,
        ub.backup,
        ub.balance.unwrap_or(Balance::RoundRobin),
    );
    m.upstreams.insert(name, Arc::new(u));
    Ok(())
}

// ---- address parsing --------------------------------------------------------

/// `unix:PATH`, `host:port` or `[v6]:port` (a port is required, as in
/// nginx's stream module), resolved now, as nginx resolves at startup.
/// `what` is the noun nginx puts in the error ("upstream").
pub(crate) fn resolve(target: &str, d: &Directive, what: &str) -> ConfResult<Vec<PeerAddr>> {
    if let Some(p) = target.strip_prefix("unix:") {
        if p.is_empty() {
            return Err(ConfError::at(
                format!(
                    "no path in the unix domain socket in {} \"{}\"",
                    what, target
                ),
                d,
            ));
        }
        return Ok(vec![PeerAddr::Unix(PathBuf::from(p))]);
    }
    if target.contains('$') {
        return Err(ConfError::at(
            format!(
                "variables in \"{}\" of the \"{}\" directive are not supported by tern yet",
                target, d.name
            ),
            d,
        ));
    }
    let (host, port) = split_host_port(target)
        .ok_or_else(|| ConfError::at(format!("no port in {} \"{}\"", what, target), d))?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| ConfError::at(format!("invalid port in {} \"{}\"", what, target), d))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![PeerAddr::Inet(SocketAddr::new(ip, port))]);
    }
    let not_found = || ConfError::at(format!("host not found in {} \"{}\"", what, target), d);
    if host.is_empty() {
        return Err(not_found());
    }
    let mut addrs: Vec<PeerAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|_| not_found())?
        .map(PeerAddr::Inet)
        .collect();
    // getaddrinfo lists an address once per socket type on some systems.
    addrs.dedup();
    if addrs.is_empty() {
        return Err(not_found());
    }
    Ok(addrs)
}

/// Splits `host:port` / `[v6]:port`; None when there is no port.
pub fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if s.starts_with('[') {
        let end = s.find(']')?;
        let rest = s[end + 1..].strip_prefix(':')?;
        return Some((&s[..=end], rest));
    }
    let (h, p) = s.rsplit_once(':')?;
    // A bare IPv6 address without brackets has no port part.
    if h.contains(':') {
        return None;
    }
    Some((h, p))
}

// ---- setters ----------------------------------------------------------------

fn set_listen(sb: &mut SrvBuild, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let l = compile_listen(d, true, sb.listen.iter().map(|l| &l.addr))?;
    sb.listen_dirs.push((l.ssl, d.clone()));
    sb.listen.push(l);
    Ok(())
}

/// `listen` in a `server {}` of stream or mail (`udp`: whether the block
/// takes `udp`; mail does not): the address and its options
/// ([`parse_stream_listen`]), refused when the server listens there
/// already (`taken`).
pub fn compile_listen<'a>(
    d: &Directive,
    udp: bool,
    taken: impl IntoIterator<Item = &'a ListenAddr>,
) -> ConfResult<Listen> {
    if !udp && d.args.iter().skip(1).any(|a| a.value == "udp") {
        return Err(ConfError::at("invalid parameter \"udp\"", d));
    }
    let l = parse_stream_listen(d)?;
    if taken.into_iter().any(|a| *a == l.addr) {
        return Err(ConfError::at(
            format!("duplicate \"{}\" address and port pair", l.addr),
            d,
        ));
    }
    Ok(l)
}

/// A `listen` of a non-http block (stream, and mail without `udp`): an
/// address with a port (no default), http's socket options, `ssl`,
/// `proxy_protocol`, `udp`; http-only parameters refused in nginx's words.
pub fn parse_stream_listen(d: &Directive) -> ConfResult<Listen> {
    for p in d.args.iter().skip(1).map(|a| a.value.as_str()) {
        match p {
            "proxy_protocol" | "ssl" | "udp" => {}
            _ if p.starts_with("fastopen=") => {
                return Err(ConfError::at(
                    "the \"fastopen\" parameter of \"listen\" is not supported by tern yet",
                    d,
                ))
            }
            // http-only parameters that the shared parser knows.
            "default" | "deferred" | "http2" | "quic" => {
                return Err(ConfError::at(format!("invalid parameter \"{}\"", p), d))
            }
            _ => {}
        }
    }
    let a = arg(d, 0);
    // The http parser defaults the port to 80; a stream listen has no default.
    if !a.starts_with("unix:") && a.parse::<u16>().is_err() && split_host_port(a).is_none() {
        return Err(ConfError::at(
            format!("no port in \"{}\" of the \"listen\" directive", a),
            d,
        ));
    }
    // The shared parser knows http's parameters; stream's own are taken
    // out first.
    let mut plain = d.clone();
    plain
        .args
        .retain(|a| a.value != "proxy_protocol" && a.value != "udp");
    let mut l = crate::http::conf::parse_listen(&plain)?;
    let udp = d.args.iter().skip(1).any(|a| a.value == "udp");
    if udp {
        // nginx's checks, in its order.
        let has = |p: &str| d.args.iter().skip(1).any(|a| a.value.starts_with(p));
        for (on, what) in [
            (l.backlog.is_some(), "backlog"),
            (l.ssl, "ssl"),
            (l.so_keepalive.is_some(), "so_keepalive"),
            (has("proxy_protocol"), "proxy_protocol"),
        ] {
            if on {
                return Err(ConfError::at(
                    format!("\"{}\" parameter is incompatible with \"udp\"", what),
                    d,
                ));
            }
        }
        match l.addr {
            ListenAddr::Inet(a) => l.addr = ListenAddr::Udp(a),
            // nginx binds unix datagram sockets; tern does not yet.
            _ => return Err(ConfError::at(
                "the \"udp\" parameter of \"listen\" on a unix socket is not supported by tern yet",
                d,
            )),
        }
    }
    l.proxy_protocol = d.args.iter().skip(1).any(|a| a.value == "proxy_protocol");
    Ok(l)
}

fn set_server_name(sb: &mut SrvBuild, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    crate::http::conf::parse_server_names(d, cx, &mut sb.names, &mut sb.primary_name)
}

fn set_resolver(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    crate::http::modules::resolver::set_resolver_in(&mut p.resolver, d)
}

fn set_resolver_timeout(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    crate::http::modules::resolver::set_timeout_in(&mut p.resolver, d)
}

fn set_preread_buffer_size(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = value::size(arg(d, 0)).ok_or_else(|| registry::slot_invalid(d))? as usize;
    set_once(&mut p.preread_buffer_size, v, d)
}

fn set_preread_timeout(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = msecs(d)?;
    set_once(&mut p.preread_timeout, v, d)
}

fn set_return(sb: &mut SrvBuild, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if sb.ret.is_some() {
        return Err(registry::duplicate(d));
    }
    sb.ret = Some(cx.template(arg(d, 0), d)?);
    sb.last_content = "return";
    Ok(())
}

/// `set $var value`: run in order before the access checks.
fn set_set(sb: &mut SrvBuild, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let a = arg(d, 0);
    let name = match a.strip_prefix('$') {
        Some(n) if !n.is_empty() => n,
        _ => return Err(ConfError::at(format!("invalid variable name \"{}\"", a), d)),
    };
    if let Some(v) = cx.vars.lookup(name) {
        if !matches!(v, crate::http::vars::Var::User(_)) {
            return Err(ConfError::at(
                format!("the duplicate \"{}\" variable", name),
                d,
            ));
        }
    }
    let i = cx.vars.define_set(name);
    let t = cx.template(arg(d, 1), d)?;
    sb.sets.push((i, t));
    Ok(())
}

fn set_real_ip_from(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let list = crate::http::modules::realip::parse_from(d)?;
    p.realip_from.get_or_insert_with(Vec::new).extend(list);
    Ok(())
}

fn set_proxy_protocol_timeout(
    p: &mut ProxyConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let v = msecs(d)?;
    set_once(&mut p.proxy_protocol_timeout, v, d)
}

/// A time argument in milliseconds (`proxy_timeout 10s`), nginx's slot check.
pub(crate) fn msecs(d: &Directive) -> ConfResult<Duration> {
    value::time_ms(arg(d, 0))
        .map(Duration::from_millis)
        .ok_or_else(|| registry::slot_invalid(d))
}

fn set_error_log(p: &mut ProxyConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let s = crate::core::log::parse_error_log(d, cx)?;
    p.error_log.get_or_insert_with(Vec::new).push(s);
    Ok(())
}

fn set_tcp_nodelay(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.tcp_nodelay, v, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_split() {
        assert_eq!(split_host_port("a:1"), Some(("a", "1")));
        assert_eq!(split_host_port("[::1]:5"), Some(("[::1]", "5")));
        assert_eq!(split_host_port("[::1]"), None);
        assert_eq!(split_host_port("::1"), None);
        assert_eq!(split_host_port("name"), None);
    }

    #[test]
    fn table_names_unique_per_context() {
        let all: Vec<&StreamSpec> = crate::stream::TABLES
            .iter()
            .flat_map(|t| t.iter())
            .collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert!(
                    a.name != b.name || a.ctx & b.ctx == 0,
                    "{} twice in one context",
                    a.name
                );
            }
        }
    }
}
