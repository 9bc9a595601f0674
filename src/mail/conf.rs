//! The `mail {}` block: its directive table ([`DIRECTIVES`]), the
//! compiler that walks the block, and the compiled, immutable [`MailConf`].
//!
//! Like stream, mail has a setter enum of its own ([`MailSetter`]: a mail
//! directive fills mail structs only), in registry rows looked up with
//! the registry's index and checks. Every directive that nginx allows in both
//! `mail` and `server` is inherited: set in `mail {}`, it is the default
//! of each `server {}` that does not set it ([`SrvBuild::merge`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::registry::{self, arg, ctx, flag, row, set_once, Args};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::{Compiler, ErrorLogSpec};
use crate::core::log::Logger;
use crate::http::conf::{Listen, ListenAddr};
use crate::http::modules::access::Addr;
use crate::http::modules::resolver::{Resolver, ResolverLoc};

/// The mail protocols (`protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Pop3,
    Imap,
    Smtp,
}

impl Protocol {
    /// The `Auth-Protocol` value.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Pop3 => "pop3",
            Protocol::Imap => "imap",
            Protocol::Smtp => "smtp",
        }
    }
}

/// Authentication methods (`pop3_auth`, `imap_auth`, `smtp_auth`) as bits.
pub mod auth {
    pub const PLAIN: u32 = 1 << 1;
    pub const LOGIN: u32 = 1 << 2;
    pub const APOP: u32 = 1 << 3;
    pub const CRAM_MD5: u32 = 1 << 4;
    pub const EXTERNAL: u32 = 1 << 5;
    pub const NONE: u32 = 1 << 6;
}

/// `starttls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartTls {
    #[default]
    Off,
    On,
    Only,
}

/// `auth_http URL`: where to ask, and the `Host` header to send.
#[derive(Debug, Clone)]
pub struct AuthHttp {
    pub addr: SocketAddr,
    pub host: String,
    pub uri: String,
}

/// The compiled `mail {}` block.
#[derive(Debug, Default)]
pub struct MailConf {
    pub servers: Vec<Arc<MailServer>>,
    pub by_addr: HashMap<ListenAddr, Arc<MailServer>>,
    /// Every listening address once, in file order, for the master to bind.
    pub listens: Vec<Listen>,
}

impl MailConf {
    /// The server of a listening address (None once a reload removed it).
    pub fn server_for(&self, addr: &ListenAddr) -> Option<Arc<MailServer>> {
        self.by_addr.get(addr).cloned()
    }
}

/// One compiled mail `server {}`.
#[derive(Debug)]
pub struct MailServer {
    pub listen: Vec<Listen>,
    pub protocol: Protocol,
    /// `server_name` (default: the machine's host name).
    pub server_name: String,
    pub auth_http: AuthHttp,
    /// `auth_http_header NAME VALUE` lines, ready to send.
    pub auth_http_headers: Vec<u8>,
    pub auth_http_timeout: Duration,
    pub auth_http_pass_client_cert: bool,
    pub pass_error_message: bool,
    pub proxy_timeout: Duration,
    pub proxy_buffer: usize,
    /// `timeout`: while talking to the client before the relay, and to
    /// the backend during the login.
    pub timeout: Duration,
    /// The methods the protocol's `*_auth` enables (bits of [`auth`]).
    pub auth_methods: u32,
    /// `pop3_capabilities` / `imap_capabilities` / `smtp_capabilities`.
    pub capabilities: Vec<String>,
    /// `imap_client_buffer` / `smtp_client_buffer`.
    pub client_buffer: usize,
    pub smtp_greeting_delay: Duration,
    pub xclient: bool,
    /// `proxy_protocol on`: a PROXY v1 header to the backend first.
    pub proxy_protocol: bool,
    pub proxy_smtp_auth: bool,
    pub max_errors: u32,
    pub realip_from: Vec<Addr>,
    pub starttls: StartTls,
    /// The TLS configuration (`listen ... ssl` or `starttls`).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub client_auth: Option<Arc<crate::tls::client_auth::ClientAuth>>,
    pub logger: Option<Arc<Logger>>,
    /// `resolver` and `resolver_timeout`: how an SMTP client's name is
    /// looked up (no resolver: it is `[UNAVAILABLE]`).
    pub resolver: ResolverLoc,
}

/// Settings of `mail` and `server` (the server's win; unset ones inherit).
#[derive(Debug, Clone, Default)]
pub struct Common {
    protocol: Option<Protocol>,
    server_name: Option<String>,
    auth_http: Option<AuthHttp>,
    auth_http_headers: Option<Vec<u8>>,
    auth_http_timeout: Option<Duration>,
    auth_http_pass_client_cert: Option<bool>,
    pass_error_message: Option<bool>,
    proxy_timeout: Option<Duration>,
    proxy_buffer: Option<usize>,
    timeout: Option<Duration>,
    pop3_auth: Option<u32>,
    imap_auth: Option<u32>,
    smtp_auth: Option<u32>,
    pop3_caps: Option<Vec<String>>,
    imap_caps: Option<Vec<String>>,
    smtp_caps: Option<Vec<String>>,
    imap_client_buffer: Option<usize>,
    smtp_client_buffer: Option<usize>,
    smtp_greeting_delay: Option<Duration>,
    xclient: Option<bool>,
    proxy_protocol: Option<bool>,
    proxy_smtp_auth: Option<bool>,
    max_errors: Option<u32>,
    realip_from: Option<Vec<Addr>>,
    starttls: Option<StartTls>,
    error_log: Option<Vec<ErrorLogSpec>>,
    /// `resolver`: Some(None) for `resolver off`.
    resolver: Option<Option<Arc<Resolver>>>,
    resolver_timeout: Option<Duration>,
    ssl: crate::http::modules::ssl_settings::SslConf,
}

impl Common {
    fn merge(&mut self, p: &Common) {
        macro_rules! inherit {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = p.$f.clone(); } )* };
        }
        inherit!(
            protocol,
            server_name,
            auth_http,
            auth_http_headers,
            auth_http_timeout,
            auth_http_pass_client_cert,
            pass_error_message,
            proxy_timeout,
            proxy_buffer,
            timeout,
            pop3_auth,
            imap_auth,
            smtp_auth,
            pop3_caps,
            imap_caps,
            smtp_caps,
            imap_client_buffer,
            smtp_client_buffer,
            smtp_greeting_delay,
            xclient,
            proxy_protocol,
            proxy_smtp_auth,
            max_errors,
            realip_from,
            starttls,
            error_log,
            resolver,
            resolver_timeout
        );
        self.ssl.merge(&p.ssl);
    }
}

#[derive(Default)]
struct SrvBuild {
    listen: Vec<(Listen, Directive)>,
    c: Common,
}

type Set = fn(&mut Common, &Directive, &mut Compiler) -> ConfResult<()>;

/// What a row of the mail table does.
#[derive(Clone, Copy)]
pub enum MailSetter {
    /// `server {}`.
    Block,
    /// `listen` (server only).
    Listen,
    /// A setting of `mail` and `server`.
    Common(Set),
    /// An `ssl_*` directive: http's setter, on the block's `SslConf`.
    Ssl,
}

impl registry::Set for MailSetter {
    fn takes_block(&self) -> bool {
        matches!(self, MailSetter::Block)
    }
    fn unsupported(&self) -> bool {
        false
    }
}

/// One row of the mail directive table.
pub type MailSpec = registry::Spec<MailSetter>;

const M: u32 = ctx::MAIL;
const MS: u32 = ctx::MAIL | ctx::MAIL_SRV;

/// The mail modules' directives (core, auth_http, proxy, pop3, imap,
/// smtp, ssl, realip).
pub const DIRECTIVES: &[MailSpec] = &[
    row!("server", M, Args::take(0), MailSetter::Block),
    row!(
        "listen",
        ctx::MAIL_SRV,
        Args::AtLeast(1),
        MailSetter::Listen
    ),
    row!(
        "protocol",
        ctx::MAIL_SRV,
        Args::take(1),
        MailSetter::Common(set_protocol)
    ),
    row!(
        "server_name",
        MS,
        Args::take(1),
        MailSetter::Common(set_server_name)
    ),
    row!(
        "timeout",
        MS,
        Args::take(1),
        MailSetter::Common(set_timeout)
    ),
    row!(
        "resolver",
        MS,
        Args::AtLeast(1),
        MailSetter::Common(set_resolver)
    ),
    row!(
        "resolver_timeout",
        MS,
        Args::take(1),
        MailSetter::Common(set_resolver_timeout)
    ),
    row!(
        "error_log",
        MS,
        Args::AtLeast(1),
        MailSetter::Common(set_error_log)
    ),
    row!(
        "max_errors",
        MS,
        Args::take(1),
        MailSetter::Common(set_max_errors)
    ),
    row!(
        "auth_http",
        MS,
        Args::take(1),
        MailSetter::Common(set_auth_http)
    ),
    row!(
        "auth_http_header",
        MS,
        Args::take(2),
        MailSetter::Common(set_auth_http_header)
    ),
    row!(
        "auth_http_timeout",
        MS,
        Args::take(1),
        MailSetter::Common(set_auth_http_timeout)
    ),
    row!(
        "auth_http_pass_client_cert",
        MS,
        Args::Flag,
        MailSetter::Common(set_pass_client_cert)
    ),
    row!("proxy", MS, Args::Flag, MailSetter::Common(check_flag)),
    row!(
        "proxy_buffer",
        MS,
        Args::take(1),
        MailSetter::Common(set_proxy_buffer)
    ),
    row!(
        "proxy_timeout",
        MS,
        Args::take(1),
        MailSetter::Common(set_proxy_timeout)
    ),
    row!(
        "proxy_pass_error_message",
        MS,
        Args::Flag,
        MailSetter::Common(set_pass_error_message)
    ),
    row!(
        "proxy_smtp_auth",
        MS,
        Args::Flag,
        MailSetter::Common(set_proxy_smtp_auth)
    ),
    row!("xclient", MS, Args::Flag, MailSetter::Common(set_xclient)),
    row!(
        "proxy_protocol",
        MS,
        Args::Flag,
        MailSetter::Common(set_proxy_protocol)
    ),
    row!(
        "pop3_auth",
        MS,
        Args::AtLeast(1),
        MailSetter::Common(set_pop3_auth)
    ),
    row!(
        "pop3_capabilities",
        MS,
        Args::AtLeast(1),
        MailSetter::Common(set_pop3_caps)
    ),
    row!(
        "imap_auth",
        MS,
        Args::AtLeast(1),
        MailSetter::Common(set_imap_auth)
    ),
    row!(
        "imap_capabilities",
        MS,
        Args::AtLeast(1),
        MailSetter::Common(set_imap_caps)
    ),
    row!(
        "imap_client_buffer",
        MS,
        Args::take(1),
        MailSetter::Common(set_imap_client_buffer)
    ),
    row!(
        "smtp_auth",
        MS,
        Args::AtLeast(1),
        MailSetter::Common(set_smtp_auth)
    ),
    row!(
        "smtp_capabilities",
        MS,
        Args::AtLeast(1),
        MailSetter::Common(set_smtp_caps)
    ),
    row!(
        "smtp_client_buffer",
        MS,
        Args::take(1),
        MailSetter::Common(set_smtp_client_buffer)
    ),
    row!(
        "smtp_greeting_delay",
        MS,
        Args::take(1),
        MailSetter::Common(set_smtp_greeting_delay)
    ),
    row!(
        "set_real_ip_from",
        MS,
        Args::take(1),
        MailSetter::Common(set_real_ip_from)
    ),
    row!(
        "starttls",
        MS,
        Args::take(1),
        MailSetter::Common(set_starttls)
    ),
    row!("ssl", MS, Args::Flag, MailSetter::Ssl),
    row!("ssl_certificate", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_certificate_key", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_password_file", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_dhparam", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_ecdh_curve", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_protocols", MS, Args::AtLeast(1), MailSetter::Ssl),
    row!("ssl_ciphers", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_prefer_server_ciphers", MS, Args::Flag, MailSetter::Ssl),
    row!("ssl_session_cache", MS, Args::take12(), MailSetter::Ssl),
    row!("ssl_session_tickets", MS, Args::Flag, MailSetter::Ssl),
    row!("ssl_session_ticket_key", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_session_timeout", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_verify_client", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_verify_depth", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_client_certificate", MS, Args::take(1), MailSetter::Ssl),
    row!(
        "ssl_trusted_certificate",
        MS,
        Args::take(1),
        MailSetter::Ssl
    ),
    row!("ssl_crl", MS, Args::take(1), MailSetter::Ssl),
    row!("ssl_conf_command", MS, Args::take(2), MailSetter::Ssl),
];

fn index() -> &'static registry::Index<MailSetter> {
    static INDEX: std::sync::OnceLock<registry::Index<MailSetter>> = std::sync::OnceLock::new();
    INDEX.get_or_init(|| registry::Index::new([DIRECTIVES]))
}

/// Whether `name` is a mail directive.
pub fn known(name: &str) -> bool {
    index().knows(name)
}

/// Finds the row for `d` in context `here`, with the registry's checks and wording.
fn lookup(d: &Directive, here: u32) -> ConfResult<MailSpec> {
    index().find(d, here, crate::core::conf::known_directive)
}

/// Compiles a `mail {}` directive.
pub fn compile_mail(d: &Directive, cx: &mut Compiler) -> ConfResult<MailConf> {
    let mut main = Common::default();
    let mut servers: Vec<(SrvBuild, Directive)> = Vec::new();
    for k in d.block.as_deref().unwrap_or(&[]) {
        let spec = lookup(k, ctx::MAIL)?;
        match spec.set {
            MailSetter::Block => servers.push((server_block(k, cx)?, k.clone())),
            MailSetter::Common(f) => f(&mut main, k, cx)?,
            MailSetter::Ssl => set_ssl(&mut main, k, cx)?,
            MailSetter::Listen => {
                return Err(ConfError::at(
                    format!("\"{}\" directive is not allowed here", k.name),
                    k,
                ))
            }
        }
    }
    let mut out = MailConf::default();
    let keys = &mut crate::tls::config::KeyCache::default();
    for (mut sb, sd) in servers {
        sb.c.merge(&main);
        let srv = Arc::new(finish_server(sb.c, &sb.listen, &sd, keys)?);
        for (l, ld) in &sb.listen {
            if out.by_addr.contains_key(&l.addr) {
                return Err(ConfError::at(
                    format!("duplicate \"{}\" address and port pair", l.addr),
                    ld,
                ));
            }
            out.by_addr.insert(l.addr.clone(), srv.clone());
            out.listens.push(l.clone());
        }
        out.servers.push(srv);
    }
    Ok(out)
}

fn server_block(d: &Directive, cx: &mut Compiler) -> ConfResult<SrvBuild> {
    let mut sb = SrvBuild::default();
    for k in d.block.as_deref().unwrap_or(&[]) {
        let spec = lookup(k, ctx::MAIL_SRV)?;
        match spec.set {
            MailSetter::Listen => {
                let taken = sb.listen.iter().map(|(l, _)| &l.addr);
                let l = crate::stream::conf::compile_listen(k, false, taken)?;
                sb.listen.push((l, k.clone()));
            }
            MailSetter::Common(f) => f(&mut sb.c, k, cx)?,
            MailSetter::Ssl => set_ssl(&mut sb.c, k, cx)?,
            MailSetter::Block => {
                return Err(ConfError::at(
                    format!("\"{}\" directive is not allowed here", k.name),
                    k,
                ))
            }
        }
    }
    Ok(sb)
}

/// nginx's defaults: the protocol guessed from the listen port when not
/// set, each protocol's methods and capabilities.
fn finish_server(
    c: Common,
    listen: &[(Listen, Directive)],
    sd: &Directive,
    keys: &mut crate::tls::config::KeyCache,
) -> ConfResult<MailServer> {
    let port = |l: &Listen| match &l.addr {
        ListenAddr::Inet(a) => a.port(),
        _ => 0,
    };
    let protocol = match c.protocol {
        Some(p) => p,
        None => {
            let guess = listen.iter().find_map(|(l, _)| match port(l) {
                110 | 995 => Some(Protocol::Pop3),
                143 | 993 => Some(Protocol::Imap),
                25 | 465 | 587 => Some(Protocol::Smtp),
                _ => None,
            });
            match guess {
                Some(p) => p,
                None => {
                    return Err(ConfError::at(
                        format!(
                            "unknown mail protocol for server in {}:{}",
                            sd.file.display(),
                            sd.line
                        ),
                        sd,
                    )
                    .without_location())
                }
            }
        }
    };
    let Some(auth_http) = c.auth_http.clone() else {
        return Err(ConfError::at(
            format!(
                "no \"auth_http\" is defined for server in {}:{}",
                sd.file.display(),
                sd.line
            ),
            sd,
        )
        .without_location());
    };
    let words = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (auth_methods, capabilities, client_buffer) = match protocol {
        Protocol::Pop3 => {
            let mut m = c.pop3_auth.unwrap_or(auth::PLAIN);
            // USER/PASS (plain) brings AUTH LOGIN with it.
            if m & auth::PLAIN != 0 {
                m |= auth::LOGIN;
            }
            (
                m,
                c.pop3_caps
                    .clone()
                    .unwrap_or_else(|| words(&["TOP", "USER", "UIDL"])),
                // nginx reads POP3 commands into a fixed 128-byte buffer.
                128,
            )
        }
        Protocol::Imap => (
            c.imap_auth.unwrap_or(auth::PLAIN),
            c.imap_caps
                .clone()
                .unwrap_or_else(|| words(&["IMAP4", "IMAP4rev1", "UIDPLUS"])),
            c.imap_client_buffer.unwrap_or(4096),
        ),
        Protocol::Smtp => (
            c.smtp_auth.unwrap_or(auth::PLAIN | auth::LOGIN),
            c.smtp_caps.clone().unwrap_or_default(),
            c.smtp_client_buffer.unwrap_or(4096),
        ),
    };
    let logger = Logger::for_block(c.error_log.as_deref(), sd)?;
    let starttls = c.starttls.unwrap_or_default();
    let ssl_listen = listen.iter().any(|(l, _)| l.ssl);
    let (mut tls, mut client_auth) = (None, None);
    if ssl_listen || starttls != StartTls::Off {
        let mut ssl = c.ssl.clone();
        crate::tls::config::build(&mut ssl, keys)?;
        client_auth = ssl.client_auth.clone();
        match ssl.tls {
            Some(cfg) => {
                let mut cfg = (*cfg).clone();
                // nginx's mail ALPN: the protocol's own name only; a
                // client offering none of it fails the handshake.
                cfg.alpn_protocols = vec![protocol.name().as_bytes().to_vec()];
                tls = Some(Arc::new(cfg));
            }
            None => {
                let (what, at) = if ssl_listen {
                    (
                        "\"listen ... ssl\" directive",
                        listen.iter().find(|(l, _)| l.ssl).map(|(_, d)| d),
                    )
                } else {
                    ("\"starttls\" directive", None)
                };
                let d = at.unwrap_or(sd);
                return Err(ConfError::at(
                    format!("no \"ssl_certificate\" is defined for the {}", what),
                    d,
                ));
            }
        }
    }
    Ok(MailServer {
        listen: listen.iter().map(|(l, _)| l.clone()).collect(),
        protocol,
        server_name: c.server_name.clone().unwrap_or_else(hostname),
        auth_http,
        auth_http_headers: c.auth_http_headers.clone().unwrap_or_default(),
        auth_http_timeout: c.auth_http_timeout.unwrap_or(Duration::from_secs(60)),
        auth_http_pass_client_cert: c.auth_http_pass_client_cert.unwrap_or(false),
        pass_error_message: c.pass_error_message.unwrap_or(false),
        proxy_timeout: c.proxy_timeout.unwrap_or(Duration::from_secs(24 * 3600)),
        proxy_buffer: c.proxy_buffer.unwrap_or(4096),
        timeout: c.timeout.unwrap_or(Duration::from_secs(60)),
        auth_methods,
        capabilities,
        client_buffer,
        smtp_greeting_delay: c.smtp_greeting_delay.unwrap_or_default(),
        xclient: c.xclient.unwrap_or(true),
        proxy_protocol: c.proxy_protocol.unwrap_or(false),
        proxy_smtp_auth: c.proxy_smtp_auth.unwrap_or(false),
        max_errors: c.max_errors.unwrap_or(5),
        realip_from: c.realip_from.clone().unwrap_or_default(),
        starttls,
        tls,
        client_auth,
        logger,
        resolver: ResolverLoc {
            resolver: c.resolver.clone().flatten(),
            timeout: Some(
                c.resolver_timeout
                    .unwrap_or(Duration::from_secs(30))
                    .as_millis() as u64,
            ),
        },
    })
}

/// The machine's host name (nginx's default `server_name` in mail).
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "localhost".into();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// An `ssl_*` directive: http's setter, on the block's `SslConf`.
fn set_ssl(c: &mut Common, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    crate::http::modules::ssl_settings::set_lent(&mut c.ssl, d, cx)
}

fn secs(d: &Directive) -> ConfResult<Duration> {
    registry::msec_arg(d, 0).map(Duration::from_millis)
}

fn set_protocol(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let p = match arg(d, 0) {
        "pop3" => Protocol::Pop3,
        "imap" => Protocol::Imap,
        "smtp" => Protocol::Smtp,
        v => return Err(ConfError::at(format!("unknown protocol \"{}\"", v), d)),
    };
    set_once(&mut c.protocol, p, d)
}

fn set_server_name(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut c.server_name, arg(d, 0).to_string(), d)
}

fn set_timeout(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = secs(d)?;
    set_once(&mut c.timeout, v, d)
}

fn check_flag(_: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    flag(d).map(drop)
}

/// `resolver ADDRESS ... [valid=] [ipv4=] [ipv6=]` (parsed as http's)
/// or `resolver off` (none, not inherited).
fn set_resolver(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if c.resolver.is_some() {
        return Err(registry::duplicate(d));
    }
    if d.args.len() == 1 && arg(d, 0) == "off" {
        c.resolver = Some(None);
        return Ok(());
    }
    let mut r = ResolverLoc::default();
    crate::http::modules::resolver::set_resolver_in(&mut r, d)?;
    c.resolver = Some(r.resolver);
    Ok(())
}

fn set_resolver_timeout(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = secs(d)?;
    set_once(&mut c.resolver_timeout, v, d)
}

fn set_error_log(c: &mut Common, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let s = crate::core::log::parse_error_log(d, cx)?;
    c.error_log.get_or_insert_with(Vec::new).push(s);
    Ok(())
}

fn set_max_errors(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = registry::num_arg(d, 0)? as u32;
    set_once(&mut c.max_errors, v, d)
}

/// `auth_http URL`: an http URL with an IP address (tern resolves host
/// names at startup through the system resolver).
fn set_auth_http(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let url = arg(d, 0);
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (hostport, uri) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let with_port = if hostport.rsplit_once(':').is_some_and(|(h, p)| {
        !h.is_empty() && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())
    }) && !hostport.ends_with(']')
    {
        hostport.to_string()
    } else {
        format!("{}:80", hostport)
    };
    use std::net::ToSocketAddrs;
    let addr = with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            ConfError::at(
                format!(
                    "host not found in \"{}\" of the \"auth_http\" directive",
                    url
                ),
                d,
            )
        })?;
    let a = AuthHttp {
        addr,
        host: hostport.to_string(),
        uri: uri.to_string(),
    };
    set_once(&mut c.auth_http, a, d)
}

fn set_auth_http_header(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let h = c.auth_http_headers.get_or_insert_with(Vec::new);
    h.extend_from_slice(arg(d, 0).as_bytes());
    h.extend_from_slice(b": ");
    h.extend_from_slice(arg(d, 1).as_bytes());
    h.extend_from_slice(b"\r\n");
    Ok(())
}

fn set_auth_http_timeout(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = secs(d)?;
    set_once(&mut c.auth_http_timeout, v, d)
}

fn set_pass_client_cert(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut c.auth_http_pass_client_cert, v, d)
}

fn set_proxy_buffer(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = registry::size_arg(d, 0)? as usize;
    set_once(&mut c.proxy_buffer, v, d)
}

fn set_proxy_timeout(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = secs(d)?;
    set_once(&mut c.proxy_timeout, v, d)
}

fn set_pass_error_message(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut c.pass_error_message, v, d)
}

fn set_proxy_smtp_auth(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut c.proxy_smtp_auth, v, d)
}

fn set_proxy_protocol(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut c.proxy_protocol, v, d)
}

fn set_xclient(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut c.xclient, v, d)
}

/// The bits of `*_auth` arguments, from the protocol's word list.
fn auth_bits(d: &Directive, words: &[(&str, u32)]) -> ConfResult<u32> {
    let mut m = 0;
    for a in &d.args {
        let w = a.value.to_ascii_lowercase();
        match words.iter().find(|(n, _)| *n == w) {
            Some((_, b)) => m |= b,
            None => return Err(ConfError::at(format!("invalid value \"{}\"", a.value), d)),
        }
    }
    Ok(m)
}

fn set_pop3_auth(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let m = auth_bits(
        d,
        &[
            ("plain", auth::PLAIN),
            ("apop", auth::APOP),
            ("cram-md5", auth::CRAM_MD5),
            ("external", auth::EXTERNAL),
        ],
    )?;
    set_once(&mut c.pop3_auth, m, d)
}

fn set_imap_auth(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let m = auth_bits(
        d,
        &[
            ("plain", auth::PLAIN),
            ("login", auth::LOGIN),
            ("cram-md5", auth::CRAM_MD5),
            ("external", auth::EXTERNAL),
        ],
    )?;
    set_once(&mut c.imap_auth, m, d)
}

fn set_smtp_auth(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let m = auth_bits(
        d,
        &[
            ("plain", auth::PLAIN),
            ("login", auth::LOGIN),
            ("cram-md5", auth::CRAM_MD5),
            ("external", auth::EXTERNAL),
            ("none", auth::NONE),
        ],
    )?;
    set_once(&mut c.smtp_auth, m, d)
}

fn caps(d: &Directive) -> Vec<String> {
    d.args.iter().map(|a| a.value.clone()).collect()
}

fn set_pop3_caps(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut c.pop3_caps, caps(d), d)
}

fn set_imap_caps(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut c.imap_caps, caps(d), d)
}

fn set_smtp_caps(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut c.smtp_caps, caps(d), d)
}

fn set_imap_client_buffer(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = registry::size_arg(d, 0)? as usize;
    set_once(&mut c.imap_client_buffer, v, d)
}

fn set_smtp_client_buffer(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = registry::size_arg(d, 0)? as usize;
    set_once(&mut c.smtp_client_buffer, v, d)
}

fn set_smtp_greeting_delay(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = secs(d)?;
    set_once(&mut c.smtp_greeting_delay, v, d)
}

fn set_real_ip_from(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let list = crate::http::modules::realip::parse_from(d)?;
    c.realip_from.get_or_insert_with(Vec::new).extend(list);
    Ok(())
}

fn set_starttls(c: &mut Common, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = match arg(d, 0) {
        "on" => StartTls::On,
        "off" => StartTls::Off,
        "only" => StartTls::Only,
        v => return Err(registry::enum_invalid(d, v)),
    };
    set_once(&mut c.starttls, v, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_unique_per_context() {
        for (i, a) in DIRECTIVES.iter().enumerate() {
            for b in &DIRECTIVES[i + 1..] {
                assert!(a.name != b.name || a.ctx & b.ctx == 0, "{}", a.name);
            }
        }
    }
}
