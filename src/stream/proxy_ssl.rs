//! `proxy_ssl*` (nginx's ngx_stream_proxy_module, its TLS part): TLS
//! toward the upstream of `proxy_pass`. The directives fill the level's
//! [`ProxyConf`] (inherited from `stream {}` into its servers); [`build`]
//! makes a server's rustls client configuration once, with the same
//! [`crate::tls::client`] code as http's `proxy_ssl_*`. What depends on
//! the session (a `proxy_ssl_certificate` or `proxy_ssl_alpn` with
//! variables, the `proxy_ssl_name`) is rendered by the proxy when it
//! connects ([`super::proxy`]).

use std::sync::Arc;

use crate::config::registry::{self, arg, flag, row, set_once, Args};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::vars::Template;
use crate::stream::conf::{ProxyConf, StreamSetter, StreamSpec, SS};
use crate::tls::var_certs::{CertName, VarCerts};

/// The proxy_ssl directives.
pub const DIRECTIVES: &[StreamSpec] = &[
    row!(
        "proxy_ssl",
        SS,
        Args::Flag,
        StreamSetter::Proxy(set_proxy_ssl)
    ),
    row!(
        "proxy_ssl_session_reuse",
        SS,
        Args::Flag,
        StreamSetter::Proxy(set_proxy_ssl_session_reuse)
    ),
    row!(
        "proxy_ssl_server_name",
        SS,
        Args::Flag,
        StreamSetter::Proxy(set_proxy_ssl_server_name)
    ),
    row!(
        "proxy_ssl_verify",
        SS,
        Args::Flag,
        StreamSetter::Proxy(set_proxy_ssl_verify)
    ),
    row!(
        "proxy_ssl_name",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_ssl_name)
    ),
    row!(
        "proxy_ssl_trusted_certificate",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_ssl_trusted)
    ),
    row!(
        "proxy_ssl_protocols",
        SS,
        Args::AtLeast(1),
        StreamSetter::Proxy(set_proxy_ssl_protocols)
    ),
    row!(
        "proxy_ssl_ciphers",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_ssl_ciphers)
    ),
    row!(
        "proxy_ssl_verify_depth",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_ssl_verify_depth)
    ),
    row!(
        "proxy_ssl_certificate",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_ssl_certificate)
    ),
    row!(
        "proxy_ssl_certificate_key",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_ssl_certificate_key)
    ),
    row!(
        "proxy_ssl_crl",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_ssl_crl)
    ),
    row!(
        "proxy_ssl_password_file",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_proxy_ssl_password_file)
    ),
    row!(
        "proxy_ssl_conf_command",
        SS,
        Args::take(2),
        StreamSetter::Proxy(set_proxy_ssl_conf_command)
    ),
    row!(
        "proxy_ssl_alpn",
        SS,
        Args::AtLeast(1),
        StreamSetter::Proxy(set_proxy_ssl_alpn)
    ),
];

/// A server's TLS toward its upstreams, built once.
#[derive(Default)]
pub struct ProxySsl {
    /// `proxy_ssl on`: the client configuration (None: plain TCP).
    pub client: Option<Arc<rustls::ClientConfig>>,
    /// `proxy_ssl_certificate` with variables: loaded per connection.
    pub var_certs: Option<Arc<VarCerts>>,
    /// `proxy_ssl_alpn` with variables: rendered per session (without
    /// variables the protocols are in `client` already).
    pub alpn: Option<Vec<Template>>,
}

/// Builds a server's `proxy_ssl` client configuration from its merged
/// settings (`sd`: the server block, for error locations).
pub fn build(p: &ProxyConf, sd: &Directive) -> ConfResult<ProxySsl> {
    let mut proxy_ssl_var_certs = None;
    // `proxy_ssl_alpn`: without variables, the protocols go into the
    // client configuration; with them, each session renders its own.
    let alpn = p.proxy_ssl_alpn.as_deref().unwrap_or(&[]);
    let alpn_literal: Option<Vec<Vec<u8>>> = alpn
        .iter()
        .map(|t| t.as_literal().map(|v| v.to_vec()))
        .collect::<Option<Vec<_>>>()
        .map(|v| v.into_iter().filter(|p| !p.is_empty()).collect());
    let proxy_ssl_alpn = match alpn_literal {
        Some(_) => None,
        None => p.proxy_ssl_alpn.clone(),
    };
    let proxy_ssl = if p.proxy_ssl.unwrap_or(false) {
        let up = crate::tls::client::UpSsl {
            verify: p.proxy_ssl_verify.unwrap_or(false),
            server_name: p.proxy_ssl_server_name.unwrap_or(false),
            // nginx 1.22's default: TLSv1 TLSv1.1 TLSv1.2.
            protocols: p.proxy_ssl_protocols.unwrap_or((true, false)),
            ciphers: p
                .proxy_ssl_ciphers
                .clone()
                .unwrap_or_else(|| "DEFAULT".into()),
            roots: p.proxy_ssl_trusted.clone(),
            session_reuse: p.proxy_ssl_session_reuse.unwrap_or(true),
            verify_depth: p.proxy_ssl_verify_depth.map_or(1, |v| v as u32),
            crls: p.proxy_ssl_crl.clone(),
            alpn: alpn_literal.clone().unwrap_or_default(),
            ..Default::default()
        };
        let mut up = up;
        if let Some(cmds) = &p.proxy_ssl_conf_commands {
            let passwords = match &p.proxy_ssl_password_file {
                Some(f) => crate::tls::keys::read_passwords(f)?,
                None => Vec::new(),
            };
            up.apply_commands(cmds, &passwords)
                .map_err(|e| ConfError::at(e.msg, sd))?;
        }
        if up.verify && up.roots.is_none() {
            return Err(ConfError::at(
                "no proxy_ssl_trusted_certificate for proxy_ssl_verify",
                sd,
            ));
        }
        let cfg = crate::tls::client::client_config(&up)
            .map_err(|e| ConfError::at(format!("SSL_CTX_new() failed ({})", e), sd))?;
        // A Certificate of proxy_ssl_conf_command (applied last, in
        // `up`) stands in for proxy_ssl_certificate.
        let (cfg, vars) = if up.certificate.is_some() {
            (cfg, None)
        } else {
            with_client_cert(cfg, p, sd)?
        };
        proxy_ssl_var_certs = vars;
        Some(cfg)
    } else {
        None
    };
    Ok(ProxySsl {
        client: proxy_ssl,
        var_certs: proxy_ssl_var_certs,
        alpn: proxy_ssl_alpn,
    })
}

fn set_proxy_ssl(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.proxy_ssl, v, d)
}

fn set_proxy_ssl_session_reuse(
    p: &mut ProxyConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.proxy_ssl_session_reuse, v, d)
}

fn set_proxy_ssl_server_name(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.proxy_ssl_server_name, v, d)
}

fn set_proxy_ssl_verify(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.proxy_ssl_verify, v, d)
}

fn set_proxy_ssl_name(p: &mut ProxyConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let t = cx.template(arg(d, 0), d)?;
    set_once(&mut p.proxy_ssl_name, t, d)
}

fn set_proxy_ssl_trusted(p: &mut ProxyConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let roots = crate::tls::client::load_roots(&ssl_file(d, cx)?)?;
    set_once(&mut p.proxy_ssl_trusted, roots, d)
}

fn set_proxy_ssl_protocols(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = crate::http::modules::ssl_settings::parse_protocols(d)?;
    set_once(&mut p.proxy_ssl_protocols, v, d)
}

fn set_proxy_ssl_ciphers(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    crate::tls::client::check_ciphers(arg(d, 0))?;
    set_once(&mut p.proxy_ssl_ciphers, arg(d, 0).to_string(), d)
}

fn set_proxy_ssl_certificate(
    p: &mut ProxyConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    let n = cert_name(d, cx)?;
    set_once(&mut p.proxy_ssl_certificate, n, d)
}

fn set_proxy_ssl_certificate_key(
    p: &mut ProxyConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    let n = cert_name(d, cx)?;
    set_once(&mut p.proxy_ssl_certificate_key, n, d)
}

/// A `proxy_ssl_certificate*` name as http's proxy takes it: a file,
/// `data:`, or a name with variables (loaded per upstream connection).
fn cert_name(d: &Directive, cx: &mut Compiler) -> ConfResult<CertName> {
    let prefix = cx.conf_prefix.clone();
    CertName::parse(arg(d, 0), &prefix, |v| cx.template(v, d))
}

fn set_proxy_ssl_password_file(
    p: &mut ProxyConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    let f = ssl_file(d, cx)?;
    set_once(&mut p.proxy_ssl_password_file, f, d)
}

/// A file argument of a `proxy_ssl_*` directive, relative to the
/// directory of nginx.conf.
fn ssl_file(d: &Directive, cx: &Compiler) -> ConfResult<String> {
    let a = arg(d, 0);
    Ok(if a.starts_with('/') {
        a.to_string()
    } else {
        cx.conf_prefix.join(a).to_string_lossy().into_owned()
    })
}

/// `proxy_ssl_certificate`: the client certificate offered to upstreams
/// (whatever CA names the upstream hints, as OpenSSL does for nginx),
/// read now, or, when a name has variables, the pair to load per
/// connection (`tls::var_certs`, as http's proxy).
fn with_client_cert(
    cfg: Arc<rustls::ClientConfig>,
    p: &ProxyConf,
    sd: &Directive,
) -> ConfResult<(Arc<rustls::ClientConfig>, Option<Arc<VarCerts>>)> {
    let Some(cert) = &p.proxy_ssl_certificate else {
        return Ok((cfg, None));
    };
    let Some(key) = &p.proxy_ssl_certificate_key else {
        return Err(ConfError::at(
            format!(
                "no \"proxy_ssl_certificate_key\" is defined for certificate \"{}\"",
                cert.shown()
            ),
            sd,
        ));
    };
    let passwords = match &p.proxy_ssl_password_file {
        Some(f) => crate::tls::keys::read_passwords(f)?,
        None => Vec::new(),
    };
    if cert.has_vars() || key.has_vars() {
        let v = VarCerts {
            pairs: vec![(cert.clone(), key.clone())],
            passwords,
            negotiate: None,
        };
        return Ok((cfg, Some(Arc::new(v))));
    }
    let pair = crate::tls::config::load_named(cert, key, &passwords)?;
    Ok((crate::tls::var_certs::client_config(&cfg, pair), None))
}

fn set_proxy_ssl_crl(p: &mut ProxyConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let crls =
        crate::tls::client::load_crls(&ssl_file(d, cx)?).map_err(|e| ConfError::at(e.msg, d))?;
    set_once(&mut p.proxy_ssl_crl, crls, d)
}

/// `proxy_ssl_conf_command NAME VALUE`: checked as `ssl_conf_command`
/// (tls::conf_command), applied to the client configuration last.
fn set_proxy_ssl_conf_command(
    p: &mut ProxyConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    let cmds = crate::http::modules::ssl_settings::conf_command_of(d, cx)?;
    p.proxy_ssl_conf_commands
        .get_or_insert_with(Vec::new)
        .extend(cmds);
    Ok(())
}

/// `proxy_ssl_alpn PROTOCOL ...`: the ALPN protocols offered to the
/// upstream; a value that renders empty is not sent.
fn set_proxy_ssl_alpn(p: &mut ProxyConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if p.proxy_ssl_alpn.is_some() {
        return Err(registry::duplicate(d));
    }
    let mut v = Vec::with_capacity(d.args.len());
    for a in &d.args {
        v.push(cx.template(&a.value, d)?);
    }
    p.proxy_ssl_alpn = Some(v);
    Ok(())
}

/// `proxy_ssl_verify_depth N`: the bound of the upstream's chain, as
/// OpenSSL's (tls::client's verifier).
fn set_proxy_ssl_verify_depth(
    p: &mut ProxyConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let v = value::number(arg(d, 0)).ok_or_else(|| registry::slot_invalid_number(d))?;
    set_once(&mut p.proxy_ssl_verify_depth, v, d)
}
