//! The `ssl_*` directives of the http and server levels (nginx's
//! ngx_http_ssl_module): their table, their checks in nginx's words, and
//! the server-level slice [`SslConf`] they fill.
//!
//! Data flow: the setters below fill `SrvConf::ssl` at the http and
//! server levels; `http::conf` merges a server's slice with the http
//! level's (an unset field takes the parent's; `ssl_certificate` and
//! `ssl_certificate_key` are lists that a level replaces whole, as in
//! nginx), then [`crate::tls::config::build`] loads the certificates
//! (on the master thread, at startup and reload) and makes the rustls
//! configuration the handshake uses. What rustls cannot do is accepted and
//! listed in DIFFERENCES.md (`ssl_dhparam`, `ssl_stapling*`, ...).

use std::sync::Arc;

use crate::config::registry::{
    arg, ctx, flag, num_arg, sec_arg, set_once, size_arg, Args, Setter, Spec,
};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::SrvConf;
use crate::tls::client_auth::{ClientAuth, VerifyMode};

/// `ssl_session_cache`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCache {
    /// `off`: no cache, and clients are told sessions cannot be reused.
    Off,
    /// `none` (nginx's default): no cache.
    None,
    /// `builtin[:N]` and/or `shared:NAME:SIZE`.
    Cache {
        builtin: Option<usize>,
        shared: Option<(String, u64)>,
    },
}

/// Runs this table's setter of an `ssl_*` directive on `ssl`: the
/// `stream` and `mail` blocks keep an [`SslConf`] of their own and lend
/// it to a server conf for the setter (which fills a server's).
pub fn set_lent(ssl: &mut SslConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let Some(Spec {
        set: Setter::Srv(f),
        ..
    }) = DIRECTIVES.iter().find(|s| s.name == d.name)
    else {
        return Err(ConfError::at(
            format!("\"{}\" directive is not supported by tern yet", d.name),
            d,
        ));
    };
    let mut tmp = SrvConf {
        ssl: std::mem::take(ssl),
        ..Default::default()
    };
    let r = f(&mut tmp, d, cx);
    *ssl = tmp.ssl;
    r
}

/// Server-level TLS settings (set at http level as the default).
#[derive(Debug, Clone, Default)]
pub struct SslConf {
    /// `ssl_certificate` paths (a level that sets any replaces the
    /// parent's list).
    pub certificates: Option<Vec<crate::tls::var_certs::CertName>>,
    pub certificate_keys: Option<Vec<crate::tls::var_certs::CertName>>,
    /// `ssl_protocols`: (TLSv1.2, TLSv1.3) wanted.
    pub protocols: Option<(bool, bool)>,
    /// The `ssl_protocols` names this level gave (nginx's bitmask slot:
    /// lines add up, a repeated name is a warning). Not inherited.
    pub protocols_mask: u8,
    pub ciphers: Option<String>,
    pub prefer_server_ciphers: Option<bool>,
    pub session_cache: Option<SessionCache>,
    /// Seconds.
    pub session_timeout: Option<u64>,
    pub session_tickets: Option<bool>,
    pub buffer_size: Option<usize>,
    pub ecdh_curve: Option<String>,
    pub dhparam: Option<String>,
    /// The legacy `ssl on;`: every `listen` of the server is `ssl`.
    pub legacy_on: Option<bool>,
    pub verify_client: Option<VerifyMode>,
    pub client_certificate: Option<String>,
    pub trusted_certificate: Option<String>,
    pub verify_depth: Option<u32>,
    pub crl: Option<String>,
    /// `ssl_reject_handshake on`: handshakes that select this server
    /// fail (it needs no certificate).
    pub reject_handshake: Option<bool>,
    /// `ssl_password_file`: passphrases tried on encrypted keys.
    pub password_file: Option<String>,
    /// `ssl_session_ticket_key` files (a level that sets any replaces the
    /// parent's list; the first key encrypts).
    pub session_ticket_keys: Option<Vec<String>>,
    pub early_data: Option<bool>,
    /// `ssl_stapling_file`: a DER OCSP response stapled as it is.
    pub stapling_file: Option<String>,
    pub stapling: Option<bool>,
    pub stapling_responder: Option<crate::tls::ocsp::Responder>,
    pub stapling_verify: Option<bool>,
    /// `ssl_ocsp on|leaf|off` (Some(None): off).
    pub ocsp: Option<Option<crate::tls::ocsp::Mode>>,
    pub ocsp_responder: Option<crate::tls::ocsp::Responder>,
    /// `ssl_ocsp_cache` (Some(None): off).
    pub ocsp_cache: Option<Option<String>>,
    /// `ssl_conf_command`s in order (a level that has any replaces the
    /// parent's list, as nginx).
    pub conf_commands: Option<Vec<crate::tls::conf_command::Cmd>>,
    /// Built with `tls` when client certificates are asked for.
    pub client_auth: Option<Arc<ClientAuth>>,
    /// Built after merging (see `tls::config::build`): None when the
    /// server has no certificate.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Built with `tls` when the certificates have variables: loaded per
    /// handshake (`tls::var_certs`).
    pub var_certs: Option<Arc<crate::tls::var_certs::VarCerts>>,
}

impl SslConf {
    pub fn merge(&mut self, p: &SslConf) {
        crate::http::conf::merge_opts!(self, p; certificates, certificate_keys, protocols,
            ciphers, prefer_server_ciphers, session_cache, session_timeout, session_tickets,
            buffer_size, ecdh_curve, dhparam, legacy_on, verify_client, client_certificate,
            trusted_certificate, verify_depth, crl, reject_handshake, password_file,
            session_ticket_keys, early_data, stapling_file, stapling, stapling_responder,
            stapling_verify, ocsp, ocsp_responder,
            ocsp_cache, conf_commands);
    }
}

/// Paths are relative to the directory of nginx.conf, as nginx's
/// `ngx_conf_full_name(.., conf_prefix)`.
fn conf_path(cx: &Compiler, p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else {
        cx.conf_prefix.join(p).to_string_lossy().into_owned()
    }
}

/// A certificate or key argument: a file (relative to the directory of
/// nginx.conf), `data:` PEM, or a name with variables, loaded per
/// handshake (`tls::var_certs`).
fn cert_arg(d: &Directive, cx: &mut Compiler) -> ConfResult<crate::tls::var_certs::CertName> {
    let prefix = cx.conf_prefix.clone();
    crate::tls::var_certs::CertName::parse(arg(d, 0), &prefix, |v| cx.template(v, d))
}

fn certificate(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = cert_arg(d, cx)?;
    s.ssl.certificates.get_or_insert_with(Vec::new).push(p);
    Ok(())
}

fn certificate_key(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = cert_arg(d, cx)?;
    s.ssl.certificate_keys.get_or_insert_with(Vec::new).push(p);
    Ok(())
}

/// `ssl_protocols` is a bitmask slot in nginx: a second line at the same
/// level (a site's own and the one in an included options file, as
/// certbot installs) adds its names, with `duplicate value "X"` warned
/// for a name already given; names are case-insensitive.
fn protocols(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    const NAMES: [&str; 6] = ["SSLv2", "SSLv3", "TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"];
    let mut mask = s.ssl.protocols_mask;
    for a in &d.args {
        let v = a.value.as_str();
        let Some(i) = NAMES.iter().position(|n| n.eq_ignore_ascii_case(v)) else {
            return Err(ConfError::at(format!("invalid value \"{}\"", v), d));
        };
        let bit = 1u8 << i;
        if mask & bit != 0 {
            cx.warnings
                .push(ConfError::at(format!("duplicate value \"{}\"", v), d).to_string());
        }
        mask |= bit;
    }
    s.ssl.protocols_mask = mask;
    s.ssl.protocols = Some((mask & 1 << 4 != 0, mask & 1 << 5 != 0));
    Ok(())
}

/// `ssl_protocols`-style arguments: (TLSv1.2, TLSv1.3) wanted; the older
/// names are accepted and mean nothing to rustls.
pub fn parse_protocols(d: &Directive) -> ConfResult<(bool, bool)> {
    let (mut v12, mut v13) = (false, false);
    for a in &d.args {
        match a.value.as_str() {
            "SSLv2" | "SSLv3" | "TLSv1" | "TLSv1.1" => {}
            "TLSv1.2" => v12 = true,
            "TLSv1.3" => v13 = true,
            v => return Err(ConfError::at(format!("invalid value \"{}\"", v), d)),
        }
    }
    Ok((v12, v13))
}

fn ciphers(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut s.ssl.ciphers, arg(d, 0).to_string(), d)
}

fn prefer_server_ciphers(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut s.ssl.prefer_server_ciphers, v, d)
}

fn session_tickets(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut s.ssl.session_tickets, v, d)
}

fn session_timeout(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = sec_arg(d, 0)?;
    set_once(&mut s.ssl.session_timeout, v, d)
}

fn buffer_size(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = size_arg(d, 0)? as usize;
    set_once(&mut s.ssl.buffer_size, v, d)
}

fn ecdh_curve(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut s.ssl.ecdh_curve, arg(d, 0).to_string(), d)
}

fn dhparam(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = conf_path(cx, arg(d, 0));
    set_once(&mut s.ssl.dhparam, p, d)
}

fn verify_client(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = match arg(d, 0) {
        "on" => VerifyMode::On,
        "off" => VerifyMode::Off,
        "optional" => VerifyMode::Optional,
        "optional_no_ca" => VerifyMode::OptionalNoCa,
        v => {
            return Err(ConfError::at(
                format!("invalid value \"{}\" in \"{}\" directive, it must be \"on\", \"off\", \"optional\" or \"optional_no_ca\"", v, d.name),
                d,
            ))
        }
    };
    set_once(&mut s.ssl.verify_client, v, d)
}

fn client_certificate(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = conf_path(cx, arg(d, 0));
    set_once(&mut s.ssl.client_certificate, p, d)
}

fn trusted_certificate(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = conf_path(cx, arg(d, 0));
    set_once(&mut s.ssl.trusted_certificate, p, d)
}

fn verify_depth(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = num_arg(d, 0)?;
    set_once(
        &mut s.ssl.verify_depth,
        u32::try_from(v).unwrap_or(u32::MAX),
        d,
    )
}

fn crl(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = conf_path(cx, arg(d, 0));
    set_once(&mut s.ssl.crl, p, d)
}

fn reject_handshake(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut s.ssl.reject_handshake, v, d)
}

fn password_file(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = conf_path(cx, arg(d, 0));
    set_once(&mut s.ssl.password_file, p, d)
}

fn session_ticket_key(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = conf_path(cx, arg(d, 0));
    s.ssl
        .session_ticket_keys
        .get_or_insert_with(Vec::new)
        .push(p);
    Ok(())
}

fn early_data(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut s.ssl.early_data, v, d)
}

fn stapling(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut s.ssl.stapling, v, d)
}

fn stapling_file(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = conf_path(cx, arg(d, 0));
    set_once(&mut s.ssl.stapling_file, p, d)
}

fn stapling_verify(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut s.ssl.stapling_verify, v, d)
}

/// `ssl_stapling_responder URL` (http only, as nginx).
fn stapling_responder(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = crate::tls::ocsp::Responder::parse(arg(d, 0))
        .ok_or_else(|| ConfError::at(format!("invalid URL prefix in \"{}\"", arg(d, 0)), d))?;
    set_once(&mut s.ssl.stapling_responder, v, d)
}

/// `ssl_ocsp on|off|leaf`.
fn ocsp(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    use crate::tls::ocsp::Mode;
    let v = match arg(d, 0) {
        "on" => Some(Mode::On),
        "leaf" => Some(Mode::Leaf),
        "off" => None,
        other => {
            return Err(ConfError::at(
                format!(
                "invalid value \"{}\" in \"{}\" directive, it must be \"on\", \"off\" or \"leaf\"",
                other, d.name
            ),
                d,
            ))
        }
    };
    set_once(&mut s.ssl.ocsp, v, d)
}

/// `ssl_ocsp_responder URL` (http only, as nginx).
fn ocsp_responder(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = crate::tls::ocsp::Responder::parse(arg(d, 0))
        .ok_or_else(|| ConfError::at(format!("invalid URL prefix in \"{}\"", arg(d, 0)), d))?;
    set_once(&mut s.ssl.ocsp_responder, v, d)
}

fn ocsp_cache(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = crate::tls::ocsp::parse_cache(arg(d, 0)).map_err(|e| ConfError::at(e.msg, d))?;
    set_once(&mut s.ssl.ocsp_cache, v, d)
}

/// `ssl_conf_command NAME VALUE`: OpenSSL's SSL_CONF commands, checked
/// here and applied last by `tls::config::build` where rustls has the
/// setting (`tls::conf_command`); the others are warned about.
fn conf_command(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let cmds = conf_command_of(d, cx)?;
    s.ssl
        .conf_commands
        .get_or_insert_with(Vec::new)
        .extend(cmds);
    Ok(())
}

/// The commands of one `ssl_conf_command` (or stream's
/// `proxy_ssl_conf_command`) directive, checked, with its warnings
/// (named after the directive) queued for start-up.
pub fn conf_command_of(
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<Vec<crate::tls::conf_command::Cmd>> {
    let (cmds, warnings) = crate::tls::conf_command::parse(arg(d, 0), arg(d, 1), &cx.conf_prefix)
        .map_err(|e| ConfError::at(e.msg, d))?;
    for w in warnings {
        let w = w.replacen("ssl_conf_command", &d.name, 1);
        cx.warnings
            .push(format!("{} in {}:{}", w, d.file.display(), d.line));
    }
    Ok(cmds)
}

/// `ssl on|off`: deprecated in nginx 1.15 (with a warning), still obeyed.
fn legacy_ssl(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    cx.warnings.push(format!(
        "the \"ssl\" directive is deprecated, use the \"listen ... ssl\" directive instead in {}:{}",
        d.file.display(),
        d.line
    ));
    set_once(&mut s.ssl.legacy_on, v, d)
}

/// nginx's `ssl_session_cache off | none | [builtin[:size]] [shared:name:size]`.
fn session_cache(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let invalid = |v: &str| ConfError::at(format!("invalid session cache \"{}\"", v), d);
    let mut builtin = None;
    let mut shared = None;
    let mut plain = None;
    for a in &d.args {
        let v = a.value.as_str();
        match v {
            "off" => plain = Some(SessionCache::Off),
            "none" => plain = Some(SessionCache::None),
            "builtin" => builtin = Some(20480),
            _ if v.starts_with("builtin:") => {
                let n = value::number(&v[8..]).filter(|n| *n > 0);
                builtin = Some(n.ok_or_else(|| invalid(v))? as usize);
            }
            _ if v.starts_with("shared:") => {
                let (name, size) = v[7..].rsplit_once(':').ok_or_else(|| invalid(v))?;
                let size = value::size(size).ok_or_else(|| invalid(v))?;
                if name.is_empty() {
                    return Err(invalid(v));
                }
                if size < 8 * 4096 {
                    return Err(ConfError::at(
                        format!("session cache \"{}\" is too small", v),
                        d,
                    ));
                }
                shared = Some((name.to_string(), size));
            }
            _ => return Err(invalid(v)),
        }
    }
    // `none`/`off` beside a shared cache only turn the builtin one off.
    let v = match (builtin, shared, plain) {
        (b, Some(sh), _) => SessionCache::Cache {
            builtin: b,
            shared: Some(sh),
        },
        (Some(b), None, _) => SessionCache::Cache {
            builtin: Some(b),
            shared: None,
        },
        (None, None, Some(p)) => p,
        (None, None, None) => return Err(crate::config::registry::invalid_args(d)),
    };
    set_once(&mut s.ssl.session_cache, v, d)
}

const HS: u32 = ctx::HTTP | ctx::SRV;

const fn row(
    name: &'static str,
    args: Args,
    set: fn(&mut SrvConf, &Directive, &mut Compiler) -> ConfResult<()>,
) -> Spec {
    Spec {
        name,
        ctx: HS,
        args,
        set: Setter::Srv(set),
    }
}

pub const DIRECTIVES: &[Spec] = &[
    row("ssl", Args::Flag, legacy_ssl),
    row("ssl_protocols", Args::AtLeast(1), protocols),
    row(
        "ssl_prefer_server_ciphers",
        Args::Flag,
        prefer_server_ciphers,
    ),
    row("ssl_ciphers", Args::take(1), ciphers),
    row("ssl_certificate", Args::take(1), certificate),
    row("ssl_certificate_key", Args::take(1), certificate_key),
    row("ssl_dhparam", Args::take(1), dhparam),
    row("ssl_ecdh_curve", Args::take(1), ecdh_curve),
    row("ssl_session_cache", Args::take12(), session_cache),
    row("ssl_session_timeout", Args::take(1), session_timeout),
    row("ssl_session_tickets", Args::Flag, session_tickets),
    row("ssl_buffer_size", Args::take(1), buffer_size),
    row("ssl_stapling", Args::Flag, stapling),
    row("ssl_stapling_verify", Args::Flag, stapling_verify),
    row(
        "ssl_trusted_certificate",
        Args::take(1),
        trusted_certificate,
    ),
    row("ssl_early_data", Args::Flag, early_data),
    row("ssl_stapling_file", Args::take(1), stapling_file),
    row("ssl_stapling_responder", Args::take(1), stapling_responder),
    row("ssl_verify_client", Args::take(1), verify_client),
    row("ssl_client_certificate", Args::take(1), client_certificate),
    row("ssl_verify_depth", Args::take(1), verify_depth),
    row("ssl_crl", Args::take(1), crl),
    row("ssl_password_file", Args::take(1), password_file),
    row("ssl_session_ticket_key", Args::take(1), session_ticket_key),
    row("ssl_conf_command", Args::take(2), conf_command),
    row("ssl_reject_handshake", Args::Flag, reject_handshake),
    // OCSP for client certificates (tls::ocsp).
    row("ssl_ocsp", Args::take(1), ocsp),
    row("ssl_ocsp_responder", Args::take(1), ocsp_responder),
    row("ssl_ocsp_cache", Args::take(1), ocsp_cache),
];
