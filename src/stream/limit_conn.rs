//! `limit_conn`, `limit_conn_zone`, `limit_conn_log_level`,
//! `limit_conn_dry_run` (nginx's ngx_stream_limit_conn_module): the
//! preaccess phase's connection limits. Zones are http's
//! ([`crate::http::modules::limit_conn`]: the same counting state, kept
//! across reloads), in a namespace of their own (a stream zone and an
//! http zone of one name are two zones).
//!
//! A session takes one slot per `limit_conn` of its server, keyed by the
//! zone's rendered key, and holds it ([`Held`]) until it ends, after its
//! log phase; over the limit, it ends with 503 (or, with `dry_run`, goes
//! on with `$limit_conn_status` `REJECTED_DRY_RUN`).

use std::sync::Arc;

use crate::config::registry::{self, arg, ctx, flag, row, set_once, Args};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::modules::limit_conn::{
    self as lc, ConnState, ConnZone, Take, ZoneKind, ZoneState,
};
use crate::stream::conf::{MainBuild, ProxyConf, StreamSetter, StreamSpec, SS};
use crate::stream::session::Session;

/// The limit_conn module's directives.
pub const DIRECTIVES: &[StreamSpec] = &[
    row!(
        "limit_conn",
        SS,
        Args::take(2),
        StreamSetter::Proxy(set_limit_conn)
    ),
    row!(
        "limit_conn_zone",
        ctx::STREAM,
        Args::take(2),
        StreamSetter::Main(set_limit_conn_zone)
    ),
    row!(
        "limit_conn_log_level",
        SS,
        Args::take(1),
        StreamSetter::Proxy(set_limit_conn_log_level)
    ),
    row!(
        "limit_conn_dry_run",
        SS,
        Args::Flag,
        StreamSetter::Proxy(set_limit_conn_dry_run)
    ),
];

/// One `limit_conn ZONE N` of a server.
#[derive(Debug, Clone)]
pub struct Limit {
    pub zone: Arc<ConnZone>,
    pub n: u32,
}

fn set_limit_conn_zone(m: &mut MainBuild, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let key_src = arg(d, 0);
    let key = cx.template(key_src, d)?;
    let v = arg(d, 1);
    if !v.starts_with("zone=") {
        return Err(ConfError::at(format!("invalid parameter \"{}\"", v), d));
    }
    let (name, size) = lc::parse_zone_param(v, d)?;
    if let Some(z) = m.zones.get(&name) {
        return Err(lc::already_bound(
            d,
            &name,
            lc::ZoneState::key_src(&*z.state),
        ));
    }
    // Stream zones are a namespace of their own: the registry key says so.
    let state = lc::zone_state(
        ZoneKind::Conn,
        &format!("stream\0{}", name),
        size,
        key_src,
        "limit_conn_zone",
        d,
        || ConnState::new(size, key_src),
    )?;
    m.zones
        .insert(name.clone(), Arc::new(ConnZone { name, key, state }));
    Ok(())
}

fn set_limit_conn(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let zone = arg(d, 0).to_string();
    let nv = arg(d, 1);
    let n = match value::number(nv) {
        Some(n) if n > 0 => n,
        _ => {
            return Err(ConfError::at(
                format!("invalid number of connections \"{}\"", nv),
                d,
            ))
        }
    };
    if n > 65535 {
        return Err(ConfError::at("connection limit must be less 65536", d));
    }
    let limits = p.limits.get_or_insert_with(Vec::new);
    if limits.iter().any(|(z, _, _)| *z == zone) {
        return Err(registry::duplicate(d));
    }
    limits.push((zone, n as u32, d.clone()));
    Ok(())
}

fn set_limit_conn_log_level(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    lc::set_level(&mut p.limit_log_level, d)
}

fn set_limit_conn_dry_run(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.limit_dry_run, v, d)
}

/// A server's `limit_conn`s with their zones, once the whole block is
/// read (a zone may be defined after the server that uses it).
pub fn resolve(p: &ProxyConf, m: &MainBuild) -> ConfResult<Vec<Limit>> {
    let mut limits = Vec::new();
    for (zone, n, ld) in p.limits.as_deref().unwrap_or(&[]) {
        let z = m
            .zones
            .get(zone)
            .ok_or_else(|| ConfError::at(format!("zone \"{}\" is unknown", zone), ld))?;
        limits.push(Limit {
            zone: z.clone(),
            n: *n,
        });
    }
    Ok(limits)
}

/// A `limit_conn` slot held for the session's life.
pub struct Held {
    state: Arc<ConnState>,
    key: Vec<u8>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.state.release(&self.key);
    }
}

/// The limits of the session's server: false when one is over (logged
/// at `limit_conn_log_level`, status 503, no slot kept). The slots
/// taken go to `held`.
pub fn check(s: &mut Session, held: &mut Vec<Held>) -> bool {
    let srv = s.srv.clone();
    for l in &srv.limits {
        let key = l.zone.key.render_vec(&*s);
        if key.is_empty() {
            continue;
        }
        if key.len() > 255 {
            s.log(
                Level::Error,
                format_args!(
                    "the value of the \"{}\" key is more than 255 bytes: \"{}\", {}",
                    l.zone.state.key_src(),
                    String::from_utf8_lossy(&key),
                    s.client_ctx()
                ),
            );
            continue;
        }
        match l.zone.state.take(&key, l.n) {
            Take::Ok => held.push(Held {
                state: l.zone.state.clone(),
                key,
            }),
            Take::Limited | Take::NoMemory => {
                let dry = if srv.limit_dry_run { ", dry run," } else { "" };
                s.log(
                    srv.limit_log_level,
                    format_args!(
                        "limiting connections{} by zone \"{}\", {}",
                        dry,
                        l.zone.name,
                        s.client_ctx()
                    ),
                );
                if srv.limit_dry_run {
                    s.limit_status = Some("REJECTED_DRY_RUN");
                    continue;
                }
                s.limit_status = Some("REJECTED");
                held.clear();
                s.status = 503;
                return false;
            }
        }
    }
    if !srv.limits.is_empty() && s.limit_status.is_none() {
        s.limit_status = Some("PASSED");
    }
    true
}
