//! `PREFIX_ssl_*`: TLS to the upstream, the same for every `*_pass`
//! protocol that speaks it (`proxy_pass https://`, `grpc_pass grpcs://`,
//! `uwsgi_pass suwsgi://`): the settings of one location level
//! ([`SslConf`], a field of the engine's [`UpstreamConf`]), their
//! directive rows ([`crate::upstream_ssl_directives!`], written per prefix
//! as the engine's other shared rows are), the checks of a merged location
//! ([`check`]) and the TLS client of one request ([`for_request`]).
//!
//! Why here, in the engine, and not in `modules/ssl_settings.rs`: the
//! handshake is the engine's (`fetch.rs` connects and shakes hands with
//! [`Limits::tls`]), nginx keeps these settings in the upstream's own
//! `ngx_http_upstream_conf_t` for the same reason, and the [`Slot`] each
//! protocol module already names reaches them, so a protocol gets TLS by
//! writing `tls` in its `upstream_directives!` call, giving its scheme a
//! line in `ModLoc::check_ssl`, and calling [`attach`] when its pass
//! says TLS. `ssl_settings.rs` is the server side (`listen ... ssl`);
//! both use `crate::tls` for the work.
//!
//! Data flow: the setters fill `SslConf` at any level; `UpstreamConf::merge`
//! merges it (an unset field takes the parent's); [`check`] runs on each
//! merged location whose pass may use TLS: nginx's errors
//! (`no PREFIX_ssl_trusted_certificate for PREFIX_ssl_verify`, a
//! certificate without its key) and the client certificate read on the
//! master thread (or, with variables, prepared to be read per connection,
//! as nginx 1.22 does). The rustls client configuration is made on the
//! level's first TLS request ([`SslConf::client`]) and kept.

use std::sync::{Arc, OnceLock};

use crate::config::registry::{arg, flag, set_once, slot_invalid_number};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::body;
use crate::http::conf::{merge_opts, LocConf};
use crate::http::phases::Ctx;
use crate::http::response::Response;
use crate::http::vars::Template;
use crate::tls::var_certs::{CertName, VarCerts};

use super::conf::{Limits, Slot};

/// The TLS of one upstream request: the client configuration and the
/// name the upstream's certificate is checked against (sent as SNI with
/// `PREFIX_ssl_server_name on`), as [`super::conf::Limits::tls`] takes it.
pub type Tls = (
    Arc<rustls::ClientConfig>,
    rustls::pki_types::ServerName<'static>,
);

/// One level's `PREFIX_ssl_*` settings.
#[derive(Debug, Clone, Default)]
pub struct SslConf {
    pub verify: Option<bool>,
    pub server_name: Option<bool>,
    pub session_reuse: Option<bool>,
    /// `PREFIX_ssl_name` (variables rendered per request).
    pub name: Option<Template>,
    pub protocols: Option<(bool, bool)>,
    pub ciphers: Option<String>,
    pub trusted: Option<Arc<crate::tls::client::Trusted>>,
    pub verify_depth: Option<u32>,
    /// `PREFIX_ssl_crl`, read.
    pub crl: Option<Arc<Vec<Vec<u8>>>>,
    /// `PREFIX_ssl_certificate` / `_key` as written ("" for none), and
    /// the names they stand for (files, `data:` or with variables).
    pub certificate: Option<String>,
    pub certificate_key: Option<String>,
    pub certificate_name: Option<CertName>,
    pub certificate_key_name: Option<CertName>,
    /// `PREFIX_ssl_password_file`'s passphrases.
    pub passwords: Option<Arc<Vec<Vec<u8>>>>,
    /// `PREFIX_ssl_conf_command`s in order (a level with any replaces
    /// the inherited list), checked when read.
    pub conf_commands: Option<Vec<crate::tls::conf_command::Cmd>>,
    /// The `Certificate`/`PrivateKey` pair of those commands (the last
    /// one), read by [`check`]: it takes `PREFIX_ssl_certificate`'s place.
    pub command_certified: Option<Arc<rustls::sign::CertifiedKey>>,
    /// Made by [`check`] when either certificate name has variables: the
    /// pair is read per upstream connection.
    pub var_certs: Option<Arc<VarCerts>>,
    /// The certificate and key, read by [`check`] on the master thread.
    pub certified: Option<Arc<rustls::sign::CertifiedKey>>,
    /// This level's TLS client configuration, made on its first TLS
    /// request from the merged settings (not inherited: each level has
    /// its own).
    pub client: Arc<OnceLock<Option<Arc<rustls::ClientConfig>>>>,
}

impl SslConf {
    pub fn merge(&mut self, p: &SslConf) {
        // The certificate read (or prepared) by `check` is inherited too:
        // `if` and `limit_except` blocks, which are not checked on their
        // own, use their location's (a checked level makes its own).
        merge_opts!(self, p; verify, server_name, session_reuse, name, protocols, ciphers,
            trusted, verify_depth, crl, certificate, certificate_key, certificate_name,
            certificate_key_name, passwords, var_certs, certified, conf_commands,
            command_certified);
    }

    /// The level's client configuration (`alpn`: the protocols offered,
    /// the same on every call of a level: gRPC's `h2`), and the name to
    /// check, `name` (`PREFIX_ssl_name` rendered, else the pass's host; a
    /// port is dropped). `PREFIX_ssl_conf_command`s apply last, as nginx
    /// hands them to OpenSSL after its own settings. None when no
    /// configuration can be made of the settings.
    pub fn client(&self, name: &str, alpn: &[&[u8]]) -> Option<Tls> {
        let cfg = self
            .client
            .get_or_init(|| {
                let d = crate::tls::client::UpSsl::default();
                let mut s = crate::tls::client::UpSsl {
                    verify: self.verify.unwrap_or(d.verify),
                    server_name: self.server_name.unwrap_or(d.server_name),
                    protocols: self.protocols.unwrap_or(d.protocols),
                    ciphers: self.ciphers.clone().unwrap_or(d.ciphers),
                    roots: self.trusted.clone(),
                    session_reuse: self.session_reuse.unwrap_or(d.session_reuse),
                    verify_depth: self.verify_depth.unwrap_or(d.verify_depth),
                    crls: self.crl.clone(),
                    certificate: self.certified.clone(),
                    alpn: alpn.iter().map(|p| p.to_vec()).collect(),
                    ..d
                };
                if let Some(cmds) = &self.conf_commands {
                    // Checked by `check` already; the files were read there.
                    let fx = crate::tls::conf_command::effect(cmds, s.protocols).ok()?;
                    s.apply_effect(&fx);
                    if self.command_certified.is_some() {
                        s.certificate = self.command_certified.clone();
                    }
                }
                crate::tls::client::client_config(&s).ok()
            })
            .clone()?;
        let name = crate::tls::client::server_name(name)?;
        Some((cfg, name))
    }
}

/// The TLS of one request to the upstream (see [`SslConf::client`]),
/// with this connection's client certificate when its name has variables.
/// `host` is the pass's host, the name checked unless `PREFIX_ssl_name`
/// says another (rendered here when it has variables).
/// Err: the answer, the reason logged (500 when the certificate cannot be
/// read, 502 when no client can be made), as nginx.
pub async fn for_request(
    cx: &Ctx<'_>,
    ssl: &SslConf,
    host: &str,
    alpn: &[&[u8]],
) -> Result<Tls, Box<Response>> {
    let rendered;
    let name = match &ssl.name {
        Some(t) => match t.as_literal() {
            Some(v) => String::from_utf8_lossy(v),
            None => {
                rendered = t.render_vec(cx);
                String::from_utf8_lossy(&rendered)
            }
        },
        None => std::borrow::Cow::Borrowed(host),
    };
    // A name that renders empty: the pass's host (nginx then sends no
    // SNI; a certificate checked against nothing would fail anyway).
    let name = if name.is_empty() { host } else { &name };
    let Some((cfg, name)) = ssl.client(name, alpn) else {
        cx.log(
            Level::Error,
            "SSL_CTX_new() failed (no usable protocol or name for the upstream)",
        );
        return Err(Box::new(Response::status(502)));
    };
    let cfg = match &ssl.var_certs {
        // A certificate with variables: this connection's pair (none when
        // the name renders empty).
        Some(v) => match v.load_client(cx).await {
            Ok(Some(k)) => crate::tls::var_certs::client_config(&cfg, k),
            Ok(None) => cfg,
            Err(msg) => {
                cx.log(Level::Error, &msg);
                return Err(Box::new(Response::status(500)));
            }
        },
        None => cfg,
    };
    Ok((cfg, name))
}

/// What every `*_pass` content handler does when its pass says TLS: the
/// request's TLS client ([`for_request`]) put in `lim`; when none can be
/// had, the client's body stream (if one was begun) is finished and the
/// answer is returned for the handler to give.
pub async fn attach<'c>(
    cx: &mut Ctx<'c>,
    ssl: &SslConf,
    host: &str,
    alpn: &[&[u8]],
    lim: &mut Limits,
    stream: &mut Option<body::Streaming<'c>>,
) -> Result<(), Box<Response>> {
    match for_request(cx, ssl, host, alpn).await {
        Ok(t) => {
            lim.tls = Some(t);
            Ok(())
        }
        Err(r) => {
            if let Some(s) = stream.take() {
                s.finish(cx);
            }
            Err(r)
        }
    }
}

/// nginx's checks of a merged location whose pass may use TLS (`on`: a
/// TLS scheme, or a pass with variables, which may render one):
/// `PREFIX_ssl_verify on` needs trusted certificates, a certificate needs
/// its key; and the certificate read.
pub fn check(s: &mut SslConf, prefix: &str, on: bool) -> ConfResult<()> {
    if !on {
        return Ok(());
    }
    // This level's own, made below (not the parent's merged in).
    s.certified = None;
    s.var_certs = None;
    s.command_certified = None;
    let passwords = s.passwords.as_deref().map_or(&[][..], |v| &v[..]);
    if let Some(cmds) = &s.conf_commands {
        // nginx 1.22's default protocols: what the commands start from.
        let fx = crate::tls::conf_command::effect(cmds, s.protocols.unwrap_or((true, false)))
            .map_err(|e| {
                ConfError::new(
                    e.msg
                        .replace("ssl_conf_command", &format!("{}_ssl_conf_command", prefix)),
                )
            })?;
        if let Some((c, k)) = fx.pairs.last() {
            // Read here, on the master thread; it stands in for
            // PREFIX_ssl_certificate (OpenSSL's client has one pair).
            s.command_certified = Some(crate::tls::client::load_certificate(c, k, passwords)?);
        }
    }
    if s.verify == Some(true) && s.trusted.is_none() {
        return Err(ConfError::new(format!(
            "no {p}_ssl_trusted_certificate for {p}_ssl_verify",
            p = prefix
        )));
    }
    if s.command_certified.is_some() {
        return Ok(());
    }
    let Some(cert) = s.certificate.as_deref().filter(|c| !c.is_empty()) else {
        return Ok(());
    };
    if s.certificate_key.as_deref().is_none_or(str::is_empty) {
        return Err(ConfError::new(format!(
            "no \"{}_ssl_certificate_key\" is defined for certificate \"{}\"",
            prefix, cert
        )));
    }
    let (Some(c), Some(k)) = (s.certificate_name.clone(), s.certificate_key_name.clone()) else {
        return Ok(());
    };
    if c.has_vars() || k.has_vars() {
        s.var_certs = Some(Arc::new(VarCerts {
            pairs: vec![(c, k)],
            passwords: passwords.to_vec(),
            negotiate: None,
        }));
        return Ok(());
    }
    s.certified = Some(crate::tls::config::load_named(&c, &k, passwords)?);
    Ok(())
}

// ---- the setters ------------------------------------------------------------

/// The directive's name after `PREFIX_ssl_`.
fn what(d: &Directive) -> &str {
    d.name.split_once("_ssl_").map_or("", |(_, s)| s)
}

fn ssl<S: Slot>(l: &mut LocConf) -> &mut SslConf {
    &mut S::conf(l).ssl
}

/// `PREFIX_ssl_verify`, `_server_name`, `_session_reuse`.
pub fn set_flag<S: Slot>(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    let s = ssl::<S>(l);
    let slot = match what(d) {
        "verify" => &mut s.verify,
        "server_name" => &mut s.server_name,
        _ => &mut s.session_reuse,
    };
    set_once(slot, v, d)
}

/// `PREFIX_ssl_name NAME`: the name checked (and sent as SNI) instead of
/// the pass's host; with variables, rendered per request.
pub fn set_name<S: Slot>(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let v = cx.template(arg(d, 0), d)?;
    set_once(&mut ssl::<S>(l).name, v, d)
}

/// `PREFIX_ssl_conf_command NAME VALUE`: OpenSSL's SSL_CONF commands,
/// checked as the server side's `ssl_conf_command` (`tls::conf_command`:
/// an unknown command or a bad value is refused with nginx's error, one
/// rustls has no equivalent for is named in a warning), applied to the
/// client configuration last.
pub fn set_conf_command<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    let cmds = crate::http::modules::ssl_settings::conf_command_of(d, cx)?;
    ssl::<S>(l)
        .conf_commands
        .get_or_insert_with(Vec::new)
        .extend(cmds);
    Ok(())
}

pub fn set_protocols<S: Slot>(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = crate::http::modules::ssl_settings::parse_protocols(d)?;
    set_once(&mut ssl::<S>(l).protocols, v, d)
}

pub fn set_ciphers<S: Slot>(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    crate::tls::client::check_ciphers(arg(d, 0))?;
    set_once(&mut ssl::<S>(l).ciphers, arg(d, 0).to_string(), d)
}

pub fn set_trusted<S: Slot>(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = arg(d, 0);
    let path = if p.starts_with('/') {
        p.to_string()
    } else {
        cx.conf_prefix.join(p).to_string_lossy().into_owned()
    };
    // Read here, on the master thread, never on a worker.
    let roots = crate::tls::client::load_roots(&path)?;
    set_once(&mut ssl::<S>(l).trusted, roots, d)
}

pub fn set_verify_depth<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let v = value::number(arg(d, 0)).ok_or_else(|| slot_invalid_number(d))?;
    set_once(
        &mut ssl::<S>(l).verify_depth,
        u32::try_from(v).unwrap_or(u32::MAX),
        d,
    )
}

/// A file argument (`PREFIX_ssl_password_file`, `_crl`), relative to the
/// directory of nginx.conf.
fn file_arg(d: &Directive, cx: &Compiler) -> ConfResult<String> {
    let a = arg(d, 0);
    if a.contains('$') || a.starts_with("data:") {
        return Err(ConfError::at(
            format!(
                "\"{}\" with variables or \"data:\" is not supported by tern yet",
                d.name
            ),
            d,
        ));
    }
    Ok(if a.is_empty() || a.starts_with('/') {
        a.to_string()
    } else {
        cx.conf_prefix.join(a).to_string_lossy().into_owned()
    })
}

/// `PREFIX_ssl_certificate`, `PREFIX_ssl_certificate_key`: files (read
/// by [`check`]), `data:`, or names with variables (read per upstream
/// connection).
pub fn set_cert<S: Slot>(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let a = arg(d, 0);
    let prefix = cx.conf_prefix.clone();
    let name = CertName::parse(a, &prefix, |v| cx.template(v, d))?;
    // As written: nginx's `no "..._key" is defined for certificate "X"`.
    let shown = a.to_string();
    let s = ssl::<S>(l);
    let (slot, name_slot) = if what(d) == "certificate" {
        (&mut s.certificate, &mut s.certificate_name)
    } else {
        (&mut s.certificate_key, &mut s.certificate_key_name)
    };
    set_once(slot, shown, d)?;
    *name_slot = Some(name);
    Ok(())
}

pub fn set_password_file<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    let path = file_arg(d, cx)?;
    let v = crate::tls::keys::read_passwords(&path)?;
    set_once(&mut ssl::<S>(l).passwords, Arc::new(v), d)
}

pub fn set_crl<S: Slot>(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let path = file_arg(d, cx)?;
    let v = crate::tls::client::load_crls(&path)?;
    set_once(&mut ssl::<S>(l).crl, v, d)
}

/// The `PREFIX_ssl_*` rows of a `*_pass` module's table, then the module's
/// own rows, handed on to the table macro `$then` (`upstream_directives`
/// or `upstream_directives_core`); a module asks for them by writing `tls`
/// in that call: `upstream_directives!(Up, "uwsgi", tls, [rows])`.
#[macro_export]
macro_rules! upstream_ssl_directives {
    ($then:ident, $slot:ty, $p:literal, [$($own:expr),* $(,)?]) => {
        $crate::$then!($slot, $p, [
            $($own,)*
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_verify"), $crate::config::registry::Args::Flag, $crate::http::upstream::ssl::set_flag::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_server_name"), $crate::config::registry::Args::Flag, $crate::http::upstream::ssl::set_flag::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_session_reuse"), $crate::config::registry::Args::Flag, $crate::http::upstream::ssl::set_flag::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_name"), $crate::config::registry::Args::take(1), $crate::http::upstream::ssl::set_name::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_protocols"), $crate::config::registry::Args::AtLeast(1), $crate::http::upstream::ssl::set_protocols::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_ciphers"), $crate::config::registry::Args::take(1), $crate::http::upstream::ssl::set_ciphers::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_trusted_certificate"), $crate::config::registry::Args::take(1), $crate::http::upstream::ssl::set_trusted::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_verify_depth"), $crate::config::registry::Args::take(1), $crate::http::upstream::ssl::set_verify_depth::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_certificate"), $crate::config::registry::Args::take(1), $crate::http::upstream::ssl::set_cert::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_certificate_key"), $crate::config::registry::Args::take(1), $crate::http::upstream::ssl::set_cert::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_password_file"), $crate::config::registry::Args::take(1), $crate::http::upstream::ssl::set_password_file::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_crl"), $crate::config::registry::Args::take(1), $crate::http::upstream::ssl::set_crl::<$slot>),
            $crate::http::upstream::ssl::row(concat!($p, "_ssl_conf_command"), $crate::config::registry::Args::take(2), $crate::http::upstream::ssl::set_conf_command::<$slot>),
        ])
    };
}

/// A `PREFIX_ssl_*` row (http, server and location levels).
pub const fn row(
    name: &'static str,
    args: crate::config::registry::Args,
    f: fn(&mut LocConf, &Directive, &mut Compiler) -> ConfResult<()>,
) -> crate::config::registry::Spec {
    crate::config::registry::Spec {
        name,
        ctx: crate::config::registry::ctx::HSL,
        args,
        set: crate::config::registry::Setter::Loc(f),
    }
}
