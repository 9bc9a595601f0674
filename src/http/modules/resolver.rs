//! `resolver` and `resolver_timeout` in http, server and location (and,
//! through [`set_resolver_in`], [`set_timeout_in`] and [`resolve`], in
//! stream and its servers): the DNS servers (and `valid=`, `ipv4=`,
//! `ipv6=`) that name resolution at run time uses, checked and stored as
//! nginx checks them at start-up.
//!
//! A `*_pass` with variables that names a host asks [`resolve`], which
//! queries these servers with [`crate::core::dns`] and keeps the answers
//! per `resolver` line. The values merge down like nginx's (a level
//! without them inherits its parent's). The mail module's `resolver`
//! (`crate::mail::conf`) keeps one of these too, for [`resolve_addr`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use crate::config::registry::{arg, ctx, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "resolver",
        ctx: ctx::HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_resolver),
    },
    Spec {
        name: "resolver_timeout",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_timeout),
    },
];

/// One `resolver` line.
#[derive(Debug)]
pub struct Resolver {
    /// The name servers, port 53 unless given.
    pub servers: Vec<SocketAddr>,
    /// `valid=`: overrides the answers' TTL (seconds).
    pub valid: Option<u64>,
    pub ipv4: bool,
    pub ipv6: bool,
    /// Its answers, kept for their TTL (or `valid=`).
    pub cache: crate::core::dns::Cache,
}

#[derive(Debug, Clone, Default)]
pub struct ResolverLoc {
    pub resolver: Option<Arc<Resolver>>,
    /// `resolver_timeout` in milliseconds (nginx's default 30 s).
    pub timeout: Option<u64>,
}

impl ResolverLoc {
    pub fn merge(&mut self, p: &ResolverLoc) {
        if self.resolver.is_none() {
            self.resolver = p.resolver.clone();
        }
        if self.timeout.is_none() {
            self.timeout = p.timeout;
        }
    }

    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout.unwrap_or(30_000))
    }
}

fn set_resolver(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_resolver_in(&mut l.modules.resolver, d)
}

/// `resolver ADDRESS ... [valid=TIME] [ipv4=on|off] [ipv6=on|off]` into
/// `conf` (http's levels and stream's `stream`/`server` share it).
pub fn set_resolver_in(conf: &mut ResolverLoc, d: &Directive) -> ConfResult<()> {
    if conf.resolver.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let mut r = Resolver {
        servers: Vec::new(),
        valid: None,
        ipv4: true,
        ipv6: true,
        cache: Default::default(),
    };
    let invalid = |a: &str| ConfError::at(format!("invalid parameter: {}", a), d);
    let on_off = |a: &str, v: &str| match v {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(invalid(a)),
    };
    for a in &d.args {
        let a = a.value.as_str();
        if let Some(v) = a.strip_prefix("valid=") {
            r.valid = Some(value::time_secs(v).ok_or_else(|| invalid(a))?);
        } else if let Some(v) = a.strip_prefix("ipv4=") {
            // nginx 1.23.1's parameter; accepted for configurations
            // written for newer nginx (see DIFFERENCES.md).
            r.ipv4 = on_off(a, v)?;
        } else if let Some(v) = a.strip_prefix("ipv6=") {
            r.ipv6 = on_off(a, v)?;
        } else if a.starts_with("status_zone=") {
            // nginx's commercial statistics: nothing to count into here.
        } else {
            r.servers.extend(
                server_addrs(a)
                    .map_err(|e| ConfError::at(format!("{} in resolver \"{}\"", e, a), d))?,
            );
        }
    }
    if !r.ipv4 && !r.ipv6 {
        return Err(ConfError::at(
            "\"ipv4\" and \"ipv6\" cannot both be \"off\"",
            d,
        ));
    }
    conf.resolver = Some(Arc::new(r));
    Ok(())
}

/// `ADDR[:PORT]`, `[V6][:PORT]` or a host name (looked up now, as nginx
/// does while reading its configuration); the error in nginx's words.
fn server_addrs(a: &str) -> Result<Vec<SocketAddr>, &'static str> {
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or("invalid host")?;
        match tail.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if tail.is_empty() => (h, None),
            None => return Err("invalid host"),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            _ => (a, None),
        }
    };
    let port = match port {
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err("invalid port"),
        },
        None => 53,
    };
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    match (host, port).to_socket_addrs() {
        Ok(it) => {
            let v: Vec<SocketAddr> = it.collect();
            if v.is_empty() {
                Err("host not found")
            } else {
                Ok(v)
            }
        }
        Err(_) => Err("host not found"),
    }
}

fn set_timeout(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_timeout_in(&mut l.modules.resolver, d)
}

/// `resolver_timeout TIME` into `conf`.
pub fn set_timeout_in(conf: &mut ResolverLoc, d: &Directive) -> ConfResult<()> {
    let v = value::time_ms(arg(d, 0)).ok_or_else(|| crate::config::registry::slot_invalid(d))?;
    set_once(&mut conf.timeout, v, d)
}

/// Why a host of a `*_pass` with variables has no addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unresolved {
    /// No `resolver` applies to the location.
    NoResolver,
    Dns(crate::core::dns::Error),
}

impl Resolver {
    fn query(&self, timeout: std::time::Duration) -> crate::core::dns::Query<'_> {
        crate::core::dns::Query {
            servers: &self.servers,
            valid: self.valid,
            ipv4: self.ipv4,
            ipv6: self.ipv6,
            timeout,
        }
    }
}

/// The addresses of `host` by the location's `resolver` (an address
/// literal is its own answer, as nginx's).
pub async fn resolve(conf: &ResolverLoc, host: &str) -> Result<Vec<std::net::IpAddr>, Unresolved> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return Ok(vec![ip]);
    }
    let Some(r) = conf.resolver.as_deref() else {
        return Err(Unresolved::NoResolver);
    };
    crate::core::dns::resolve(&r.query(conf.timeout()), &r.cache, host)
        .await
        .map_err(Unresolved::Dns)
}

/// The name of `ip` by `resolver` (a PTR query), as the mail module
/// looks up an SMTP client's name.
pub async fn resolve_addr(conf: &ResolverLoc, ip: std::net::IpAddr) -> Result<String, Unresolved> {
    let Some(r) = conf.resolver.as_deref() else {
        return Err(Unresolved::NoResolver);
    };
    crate::core::dns::resolve_addr(&r.query(conf.timeout()), &r.cache, ip)
        .await
        .map_err(Unresolved::Dns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            server_addrs("127.0.0.1").unwrap(),
            vec!["127.0.0.1:53".parse().unwrap()]
        );
        assert_eq!(
            server_addrs("[::1]:5353").unwrap(),
            vec!["[::1]:5353".parse().unwrap()]
        );
        assert_eq!(server_addrs("127.0.0.1:99999"), Err("invalid port"));
        assert_eq!(
            server_addrs("::1").unwrap(),
            vec!["[::1]:53".parse().unwrap()]
        );
    }
}
