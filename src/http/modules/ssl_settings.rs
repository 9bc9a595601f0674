//! `ssl_*` settings at the http and server levels: accepted, with their
//! values checked as nginx checks them, while tern has no TLS.
//!
//! These directives only act on servers that listen with `ssl`, and
//! tern refuses `listen ... ssl` at startup (see `http/conf.rs`), so a
//! configuration that loads has no TLS server for them to act on: they
//! change nothing, exactly as in nginx without an ssl listener. They are
//! accepted because distribution configs set them at the http level for
//! every server (Debian's stock nginx.conf has `ssl_protocols` and
//! `ssl_prefer_server_ciphers`). Certificate files are not read.

use crate::config::registry::{ctx, flag, sec_arg, size_arg, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::SrvConf;

const PROTOCOLS: &[&str] = &["SSLv2", "SSLv3", "TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"];

fn any(_: &mut SrvConf, _: &Directive, _: &mut Compiler) -> ConfResult<()> {
    Ok(())
}

fn on_off(_: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    flag(d).map(drop)
}

fn protocols(_: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    match d
        .args
        .iter()
        .find(|a| !PROTOCOLS.contains(&a.value.as_str()))
    {
        Some(a) => Err(ConfError::at(format!("invalid value \"{}\"", a.value), d)),
        None => Ok(()),
    }
}

fn time(_: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    sec_arg(d, 0).map(drop)
}

fn size(_: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    size_arg(d, 0).map(drop)
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
    row("ssl_protocols", Args::AtLeast(1), protocols),
    row("ssl_prefer_server_ciphers", Args::Flag, on_off),
    row("ssl_ciphers", Args::take(1), any),
    row("ssl_certificate", Args::take(1), any),
    row("ssl_certificate_key", Args::take(1), any),
    row("ssl_dhparam", Args::take(1), any),
    row("ssl_ecdh_curve", Args::take(1), any),
    row("ssl_session_cache", Args::AtLeast(1), any),
    row("ssl_session_timeout", Args::take(1), time),
    row("ssl_session_tickets", Args::Flag, on_off),
    row("ssl_buffer_size", Args::take(1), size),
    row("ssl_stapling", Args::Flag, on_off),
    row("ssl_stapling_verify", Args::Flag, on_off),
    row("ssl_trusted_certificate", Args::take(1), any),
];
