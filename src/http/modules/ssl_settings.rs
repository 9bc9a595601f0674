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

use crate::config::registry::{arg, ctx, flag, sec_arg, set_once, size_arg, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::SrvConf;

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

/// Server-level TLS settings (set at http level as the default).
#[derive(Debug, Clone, Default)]
pub struct SslConf {
    /// `ssl_certificate` paths (a level that sets any replaces the
    /// parent's list).
    pub certificates: Option<Vec<String>>,
    pub certificate_keys: Option<Vec<String>>,
    /// `ssl_protocols`: (TLSv1.2, TLSv1.3) wanted.
    pub protocols: Option<(bool, bool)>,
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
    /// Built after merging (see `tls::config::build`): None when the
    /// server has no certificate.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl SslConf {
    pub fn merge(&mut self, p: &SslConf) {
        crate::http::conf::merge_opts!(self, p; certificates, certificate_keys, protocols,
            ciphers, prefer_server_ciphers, session_cache, session_timeout, session_tickets,
            buffer_size, ecdh_curve, dhparam, legacy_on);
    }
}

fn any(_: &mut SrvConf, _: &Directive, _: &mut Compiler) -> ConfResult<()> {
    Ok(())
}

fn on_off(_: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    flag(d).map(drop)
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

/// Certificates named through variables (`ssl_certificate $var`, loaded
/// per handshake by nginx) or inline (`data:`) are not supported.
fn file_arg(d: &Directive, cx: &Compiler) -> ConfResult<String> {
    let p = arg(d, 0);
    if p.contains('$') || p.starts_with("data:") {
        return Err(ConfError::at(
            format!(
                "\"{}\" with variables or \"data:\" is not supported by tern yet",
                d.name
            ),
            d,
        ));
    }
    Ok(conf_path(cx, p))
}

fn certificate(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = file_arg(d, cx)?;
    s.ssl.certificates.get_or_insert_with(Vec::new).push(p);
    Ok(())
}

fn certificate_key(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = file_arg(d, cx)?;
    s.ssl.certificate_keys.get_or_insert_with(Vec::new).push(p);
    Ok(())
}

fn protocols(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = parse_protocols(d)?;
    set_once(&mut s.ssl.protocols, v, d)
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
    row("ssl_stapling", Args::Flag, on_off),
    row("ssl_stapling_verify", Args::Flag, on_off),
    row("ssl_trusted_certificate", Args::take(1), any),
    row("ssl_early_data", Args::Flag, on_off),
    row("ssl_stapling_file", Args::take(1), any),
    row("ssl_stapling_responder", Args::take(1), any),
    // Client certificates, key files of other forms, OpenSSL commands:
    // refused by name rather than taken for unknown.
    refused("ssl_verify_client"),
    refused("ssl_client_certificate"),
    refused("ssl_verify_depth"),
    refused("ssl_crl"),
    refused("ssl_password_file"),
    refused("ssl_session_ticket_key"),
    refused("ssl_conf_command"),
    refused("ssl_reject_handshake"),
    refused("ssl_ocsp"),
    refused("ssl_ocsp_responder"),
    refused("ssl_ocsp_cache"),
];

/// A directive of the module tern does not implement yet.
const fn refused(name: &'static str) -> Spec {
    Spec {
        name,
        ctx: HS,
        args: Args::Any,
        set: Setter::Unsupported,
    }
}
