//! `set_real_ip_from`, `real_ip_header`, `real_ip_recursive`: the client
//! address taken from a header sent by a trusted proxy (nginx's realip
//! module).
//!
//! Data flow: the directives fill [`RealIpLoc`] (each inherited when a
//! level does not set it). [`apply`] runs twice per request, as nginx's
//! handler runs in two phases, and acts once: before the server's rewrite
//! phase with the server level's settings (nginx's post-read phase), and
//! otherwise before the access phase with the location's (pre-access).
//! When the connection's address is trusted, the header's address becomes
//! the request's `Ctx::remote`, which `$remote_addr`, `$binary_remote_addr`,
//! allow/deny, limit_conn/limit_req keys, `X-Forwarded-For` to upstreams
//! and the `client:` of error lines read; `$realip_remote_addr` and
//! `$realip_remote_port` keep the connection's.

use std::net::{IpAddr, SocketAddr};

use super::access::{matches_addr, parse_addr, Addr};
use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::{merge_opts, LocConf};
use crate::http::phases::Ctx;

/// Where the address comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `X-Real-IP` (the default) or any other single-address header.
    Header(String),
    /// `X-Forwarded-For`: a list, read from the right.
    XForwardedFor,
    /// `proxy_protocol`: the source address and port of the connection's
    /// PROXY header (`listen ... proxy_protocol`).
    ProxyProtocol,
}

#[derive(Debug, Clone, Default)]
pub struct RealIpLoc {
    pub from: Option<Vec<Addr>>,
    pub header: Option<Source>,
    pub recursive: Option<bool>,
}

impl RealIpLoc {
    pub fn merge(&mut self, p: &RealIpLoc) {
        merge_opts!(self, p; from, header, recursive);
    }
}

fn trusted(from: &[Addr], ip: Option<IpAddr>) -> bool {
    from.iter().any(|a| matches_addr(a, ip))
}

/// The address the header names for a client at `peer`, or None.
fn real_addr(cx: &Ctx<'_>, conf: &RealIpLoc, from: &[Addr]) -> Option<SocketAddr> {
    // The port is the connection's (nginx keeps it too), except for a
    // PROXY header, which names the client's.
    let port = cx.conn.remote.map_or(0, |a| a.port());
    let ip = match conf
        .header
        .clone()
        .unwrap_or(Source::Header("X-Real-IP".into()))
    {
        Source::ProxyProtocol => {
            let (ip, port) = cx.conn.proxy.as_ref()?.src?;
            return Some(SocketAddr::new(ip, port));
        }
        Source::Header(name) => {
            let v = cx.req.header(&name.to_ascii_lowercase())?;
            std::str::from_utf8(v).ok()?.trim().parse().ok()
        }
        Source::XForwardedFor => {
            // Every X-Forwarded-For line, in order, as one list.
            let mut list: Vec<IpAddr> = Vec::new();
            for h in cx.req.headers().filter(|h| h.is("x-forwarded-for")) {
                for part in h.value.split(|&c| c == b',') {
                    let s = std::str::from_utf8(part).ok()?.trim();
                    if s.is_empty() {
                        continue;
                    }
                    list.push(s.parse().ok()?);
                }
            }
            let recursive = conf.recursive.unwrap_or(false);
            let mut found = None;
            for ip in list.iter().rev() {
                found = Some(*ip);
                if !recursive || !trusted(from, Some(*ip)) {
                    break;
                }
            }
            found
        }
    }?;
    Some(SocketAddr::new(ip, port))
}

/// Replaces the request's client address when `conf` trusts the
/// connection's; `server_level` marks the first of the two chances. As in
/// nginx, only a replacement ends the matter: where the server level
/// finds no header (or does not trust the peer), the location level tries
/// with its own settings.
pub fn apply(cx: &mut Ctx<'_>, server_level: bool) {
    if cx.realip_done {
        return;
    }
    // An Arc clone, not a copy of the settings: this runs per request.
    let level = if server_level {
        cx.server.conf.clone()
    } else {
        cx.loc.clone()
    };
    let conf = &level.modules.realip;
    let Some(from) = conf.from.as_deref() else {
        return;
    };
    let peer = cx.conn.remote.map(|a| a.ip());
    if !trusted(from, peer) {
        return;
    }
    if let Some(addr) = real_addr(cx, conf, from) {
        cx.remote = Some(addr);
        cx.realip_done = true;
    }
}

/// `set_real_ip_from`'s argument: an address or network, `unix:`, or a
/// host name, which stands for every address it resolves to now (nginx
/// resolves it at start-up). Shared with stream's realip.
pub fn parse_from(d: &Directive) -> ConfResult<Vec<Addr>> {
    match parse_addr(d) {
        // nginx's set_real_ip_from takes a network, not "all".
        Ok(Addr::All) => Err(ConfError::at(
            format!("invalid parameter \"{}\"", arg(d, 0)),
            d,
        )),
        Ok(a) => Ok(vec![a]),
        Err(e) => {
            use std::net::ToSocketAddrs;
            let host = arg(d, 0);
            if host.contains('/') {
                return Err(e);
            }
            let addrs: Vec<IpAddr> = (host, 0u16)
                .to_socket_addrs()
                .map(|it| it.map(|a| a.ip()).collect())
                .unwrap_or_default();
            if addrs.is_empty() {
                return Err(e);
            }
            Ok(addrs
                .into_iter()
                .map(|addr| Addr::Net {
                    addr,
                    prefix: if addr.is_ipv4() { 32 } else { 128 },
                })
                .collect())
        }
    }
}

fn set_from(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let list = parse_from(d)?;
    l.modules
        .realip
        .from
        .get_or_insert_with(Vec::new)
        .extend(list);
    Ok(())
}

fn set_header(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = arg(d, 0);
    let s = if v.eq_ignore_ascii_case("x-forwarded-for") {
        Source::XForwardedFor
    } else if v == "proxy_protocol" {
        Source::ProxyProtocol
    } else {
        Source::Header(v.to_string())
    };
    set_once(&mut l.modules.realip.header, s, d)
}

fn set_recursive(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.realip.recursive, flag(d)?, d)
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "set_real_ip_from",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_from),
    },
    Spec {
        name: "real_ip_header",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_header),
    },
    Spec {
        name: "real_ip_recursive",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_recursive),
    },
];
