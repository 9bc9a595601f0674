//! `allow`, `deny`, `satisfy`, `auth_delay` and `limit_except`: the access phase.
//!
//! Rules are checked in order and the first match decides; no match
//! says nothing. [`phase`] runs nginx's access phase: the address rules,
//! then `auth_basic` ([`super::auth_basic::check`]), then `auth_request`
//! ([`super::auth_request::check`], a subrequest), combined as
//! `satisfy` says: with `all` (the default) each must let the request
//! through, the first refusal answers; with `any` the first check that
//! allows lets it through, and if none does the refusal answers (a 401
//! over a 403, so the client is asked for credentials).
//!
//! `limit_except METHODS { ... }` is, as in nginx, a nameless location of
//! its own: its directives (`allow`, `deny`, `access_log`, `proxy_pass`)
//! merged over the enclosing location's configuration. A request whose
//! method is not listed (GET implies HEAD) runs with that configuration
//! instead of the location's from the moment the location is chosen
//! ([`limit_except`]): so the block's rules replace the location's rather
//! than adding to them, its `proxy_pass` or `access_log` applies, and,
//! as nginx's merge does not inherit them, the location's `rewrite`,
//! `return`, `set` and `if` do not run for such a request.

use std::net::IpAddr;
use std::sync::Arc;

use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::{HttpMain, LocConf};
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::Response;

#[derive(Debug, Clone)]
pub enum Addr {
    All,
    Unix,
    Net { addr: IpAddr, prefix: u8 },
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub allow: bool,
    pub addr: Addr,
}

#[derive(Debug, Clone)]
pub struct LimitExcept {
    /// Methods (uppercase names) that are *not* limited.
    pub methods: Vec<String>,
    /// The block's own settings.
    raw: Arc<LocConf>,
    /// The block's settings over the enclosing location's (set once that
    /// location is merged, [`finish_limit_except`]).
    pub conf: Arc<LocConf>,
}

/// After a location's configuration is merged: give its `limit_except`
/// block its final configuration.
pub fn finish_limit_except(l: &mut LocConf) {
    let Some(le) = l.modules.access.limit_except.take() else {
        return;
    };
    let mut c = (*le.raw).clone();
    c.merge(l);
    l.modules.access.limit_except = Some(Arc::new(LimitExcept {
        methods: le.methods.clone(),
        raw: le.raw.clone(),
        conf: Arc::new(c),
    }));
}

/// Once a location is chosen: a method its `limit_except` does not list
/// switches the request to the block's configuration (nginx's
/// `ngx_http_update_location_config`).
pub fn limit_except(cx: &mut Ctx<'_>) {
    let Some(le) = cx.loc.modules.access.limit_except.clone() else {
        return;
    };
    let m = cx.req.method_raw();
    let listed = le
        .methods
        .iter()
        .any(|x| x == m || (x == "GET" && cx.method == Method::Head));
    if !listed {
        cx.loc = le.conf.clone();
    }
}

#[derive(Debug, Clone, Default)]
pub struct AccessLoc {
    pub rules: Option<Vec<Rule>>,
    /// `satisfy any` (true) or `all`.
    pub satisfy_any: Option<bool>,
    /// Not inherited by nested locations (per location, as in nginx).
    pub limit_except: Option<Arc<LimitExcept>>,
    /// `auth_delay`, in milliseconds: how long a 401 from this phase is
    /// held back (against timing attacks on passwords); 0 by default.
    pub auth_delay_ms: Option<u64>,
}

impl AccessLoc {
    pub fn merge(&mut self, p: &AccessLoc) {
        if self.rules.is_none() {
            self.rules = p.rules.clone();
        }
        if self.satisfy_any.is_none() {
            self.satisfy_any = p.satisfy_any;
        }
        if self.auth_delay_ms.is_none() {
            self.auth_delay_ms = p.auth_delay_ms;
        }
    }
}

/// Whether `peer` (None: a unix socket) is in `addr`.
pub(crate) fn matches_addr(addr: &Addr, peer: Option<IpAddr>) -> bool {
    match (addr, peer) {
        (Addr::All, _) => true,
        (Addr::Unix, None) => true,
        (Addr::Net { addr, prefix }, Some(ip)) => match (addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = if *prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - *prefix as u32)
                };
                u32::from(*a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = if *prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - *prefix as u32)
                };
                u128::from(*a) & mask == u128::from(b) & mask
            }
            (IpAddr::V4(a), IpAddr::V6(b)) => b.to_ipv4_mapped().is_some_and(|b| {
                let mask = if *prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - *prefix as u32)
                };
                u32::from(*a) & mask == u32::from(b) & mask
            }),
            _ => false,
        },
        _ => false,
    }
}

/// What one access check says: nginx's `NGX_OK`, `NGX_DECLINED`, a
/// refusal (403, 401) or an error.
pub enum Verdict {
    /// The request may go on (an `allow` matched, valid credentials).
    Allow,
    /// The check has nothing to say (no rule matched, no auth configured).
    Declined,
    /// Refused with this response; under `satisfy any` another check may
    /// still let the request through.
    Refuse(Response),
    /// Ends the request whatever `satisfy` says (500).
    Fail(Response),
}

/// nginx's access phase: allow/deny, auth_basic, auth_request, under `satisfy`.
/// `None` lets the request go on to the content phase. A 401 waits
/// `auth_delay` first (nginx holds the request on a timer the same way).
pub async fn phase(cx: &mut Ctx<'_>) -> Option<Response> {
    let r = decide(cx).await?;
    if r.status == 401 {
        if let Some(ms) = cx.loc.modules.access.auth_delay_ms.filter(|&ms| ms > 0) {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }
    Some(r)
}

/// Whether the location checks anything in the access phase. Most check
/// nothing: the engine then skips [`phase`] without making its future
/// (whose `Option<Response>` output alone cost three copies of a
/// Response a request).
pub fn checks(cx: &Ctx<'_>) -> bool {
    let m = &cx.loc.modules;
    m.access.rules.as_ref().is_some_and(|r| !r.is_empty())
        || m.auth_basic.configured()
        || matches!(m.auth_request.uri, Some(Some(_)))
}

async fn decide(cx: &mut Ctx<'_>) -> Option<Response> {
    // Most locations check nothing: leave before the checks' futures are
    // built (this phase runs for every request).
    if !checks(cx) {
        return None;
    }
    let any = cx.loc.modules.access.satisfy_any.unwrap_or(false);
    let rules = cx.loc.modules.access.rules.clone();
    let mut refused: Option<Response> = None;
    match check(cx, rules.as_deref()) {
        Verdict::Allow if any => return None,
        Verdict::Refuse(r) if any => refused = Some(r),
        Verdict::Refuse(r) | Verdict::Fail(r) => {
            cx.log(Level::Error, "access forbidden by rule");
            return Some(r);
        }
        Verdict::Allow | Verdict::Declined => {}
    }
    match super::auth_basic::check(cx).await {
        Verdict::Allow if any => return None,
        Verdict::Allow | Verdict::Declined => {}
        Verdict::Refuse(r) if any => {
            if refused.as_ref().is_none_or(|p| p.status != 401) {
                refused = Some(r);
            }
        }
        Verdict::Refuse(r) | Verdict::Fail(r) => return Some(r),
    }
    match super::auth_request::check(cx).await {
        Verdict::Allow if any => return None,
        Verdict::Allow | Verdict::Declined => {}
        Verdict::Refuse(r) if any => {
            if refused.as_ref().is_none_or(|p| p.status != 401) {
                refused = Some(r);
            }
        }
        Verdict::Refuse(r) | Verdict::Fail(r) => return Some(r),
    }
    let r = refused?;
    if r.status == 403 {
        // nginx's post-access phase says so for any 403 under `satisfy any`.
        cx.log(Level::Error, "access forbidden by rule");
    }
    Some(r)
}

fn check(cx: &Ctx<'_>, rules: Option<&[Rule]>) -> Verdict {
    let peer = cx.remote.map(|a| a.ip());
    for r in rules.unwrap_or_default() {
        if matches_addr(&r.addr, peer) {
            if r.allow {
                return Verdict::Allow;
            }
            return Verdict::Refuse(Response::status(403));
        }
    }
    Verdict::Declined
}

fn set_auth_delay(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let ms = crate::config::value::time_ms(arg(d, 0))
        .ok_or_else(|| crate::config::registry::slot_invalid(d))?;
    crate::config::registry::set_once(&mut l.modules.access.auth_delay_ms, ms, d)
}

fn set_satisfy(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let any = match arg(d, 0) {
        v if v.eq_ignore_ascii_case("all") => false,
        v if v.eq_ignore_ascii_case("any") => true,
        v => return Err(crate::config::registry::enum_invalid(d, v)),
    };
    crate::config::registry::set_once(&mut l.modules.access.satisfy_any, any, d)
}

pub(crate) fn parse_addr(d: &Directive) -> ConfResult<Addr> {
    let v = arg(d, 0);
    if v == "all" {
        return Ok(Addr::All);
    }
    if v == "unix:" {
        return Ok(Addr::Unix);
    }
    let (a, p) = match v.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (v, None),
    };
    let addr: IpAddr = a
        .parse()
        .map_err(|_| ConfError::at(format!("invalid parameter \"{}\"", v), d))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match p {
        Some(p) => p
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| ConfError::at(format!("invalid parameter \"{}\"", v), d))?,
        None => max,
    };
    Ok(Addr::Net { addr, prefix })
}

fn set_rule(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let addr = parse_addr(d)?;
    l.modules
        .access
        .rules
        .get_or_insert_with(Vec::new)
        .push(Rule {
            allow: d.name == "allow",
            addr,
        });
    Ok(())
}

const METHODS: &[&str] = &[
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "DELETE",
    "MKCOL",
    "COPY",
    "MOVE",
    "OPTIONS",
    "PROPFIND",
    "PROPPATCH",
    "LOCK",
    "UNLOCK",
    "PATCH",
];

/// Compiles `limit_except METHOD... { ... }` inside a location.
pub fn compile_limit_except(
    d: &Directive,
    cx: &mut Compiler,
    hm: &mut HttpMain,
    parent: &mut LocConf,
) -> ConfResult<()> {
    if parent.modules.access.limit_except.is_some() {
        return Err(ConfError::at("\"limit_except\" directive is duplicate", d));
    }
    let mut methods = Vec::new();
    for a in &d.args {
        let m = a.value.to_ascii_uppercase();
        if !METHODS.contains(&m.as_str()) || a.value != m {
            return Err(ConfError::at(format!("invalid method \"{}\"", a.value), d));
        }
        methods.push(m);
    }
    let mut raw = LocConf::default();
    for k in d.block.as_deref().unwrap_or(&[]) {
        let spec = crate::core::conf::lookup(k, ctx::LMT)?;
        crate::http::conf::apply(cx, hm, None, &mut raw, k, &spec)?;
    }
    // The block has no location name for a URI part to replace.
    super::proxy::check_no_uri_part(&raw, d.block.as_deref().unwrap_or(&[]))?;
    let raw = Arc::new(raw);
    parent.modules.access.limit_except = Some(Arc::new(LimitExcept {
        methods,
        conf: raw.clone(),
        raw,
    }));
    Ok(())
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "allow",
        ctx: ctx::HSL | ctx::LMT,
        args: Args::take(1),
        set: Setter::Loc(set_rule),
    },
    Spec {
        name: "deny",
        ctx: ctx::HSL | ctx::LMT,
        args: Args::take(1),
        set: Setter::Loc(set_rule),
    },
    Spec {
        name: "satisfy",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_satisfy),
    },
    Spec {
        name: "auth_delay",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_auth_delay),
    },
    Spec {
        name: "limit_except",
        ctx: ctx::LOC,
        args: Args::AtLeast(1),
        set: Setter::Block,
    },
];
