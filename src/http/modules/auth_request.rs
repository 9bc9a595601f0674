//! `auth_request` and `auth_request_set`: access decided by a subrequest
//! (nginx's `ngx_http_auth_request_module`).
//!
//! Data flow: in the access phase, after `allow`/`deny` and `auth_basic`
//! (nginx runs its access handlers in that order; [`super::access::phase`]
//! combines them under `satisfy`), [`check`] runs a subrequest for the
//! configured URI ([`crate::http::subrequest`]): method GET, no request
//! body (nginx gives it an empty one; the client's headers, a
//! Content-Length included, are still the subrequest's), its body
//! dropped. Then, in the subrequest's context (`$upstream_http_x_user`,
//! `$upstream_status`...), every `auth_request_set` value is rendered into
//! its variable, which the parent shares. The subrequest's status decides:
//! 2xx allows; 401 refuses with the subrequest's `WWW-Authenticate`; 403
//! refuses; anything else is a 500 with nginx's
//! `auth request unexpected status: N`.

use std::sync::Arc;

use super::access::Verdict;
use crate::config::registry::{arg, ctx, duplicate, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::Response;
use crate::http::vars::Template;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "auth_request",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_uri),
    },
    Spec {
        name: "auth_request_set",
        ctx: ctx::HSL,
        args: Args::take(2),
        set: Setter::Loc(set_var),
    },
];

#[derive(Debug, Clone, Default)]
pub struct AuthRequestLoc {
    /// `auth_request URI`; `Some(None)`: `off`.
    pub uri: Option<Option<Arc<[u8]>>>,
    /// `auth_request_set $var value` lines of one level (not added up
    /// across levels: a level with its own replaces the inherited ones).
    pub vars: Option<Arc<Vec<(SetTarget, Template)>>>,
}

/// What an `auth_request_set` line assigns: a variable of the
/// configuration, or one of the two builtins nginx lets `set` change
/// (`$args`, `$limit_rate`: the request's own state).
#[derive(Debug, Clone, Copy)]
pub enum SetTarget {
    User(usize),
    Args,
    LimitRate,
}

impl AuthRequestLoc {
    pub fn merge(&mut self, p: &AuthRequestLoc) {
        if self.uri.is_none() {
            self.uri = p.uri.clone();
        }
        if self.vars.is_none() {
            self.vars = p.vars.clone();
        }
    }
}

fn set_uri(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let a = &mut l.modules.auth_request;
    if a.uri.is_some() {
        return Err(duplicate(d));
    }
    let v = arg(d, 0);
    a.uri = Some((v != "off").then(|| Arc::from(v.as_bytes())));
    Ok(())
}

fn set_var(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let name = arg(d, 0);
    let Some(var) = name.strip_prefix('$') else {
        return Err(ConfError::at(
            format!("invalid variable name \"{}\"", name),
            d,
        ));
    };
    let target = match var {
        "args" => SetTarget::Args,
        "limit_rate" => SetTarget::LimitRate,
        _ => SetTarget::User(cx.vars.define(var)),
    };
    let value = cx.template(arg(d, 1), d)?;
    let mut list = l
        .modules
        .auth_request
        .vars
        .take()
        .map(|v| (*v).clone())
        .unwrap_or_default();
    list.push((target, value));
    l.modules.auth_request.vars = Some(Arc::new(list));
    Ok(())
}

/// The access check: `Declined` when no `auth_request` applies.
pub async fn check(cx: &mut Ctx<'_>) -> Verdict {
    if !matches!(cx.loc.modules.auth_request.uri, Some(Some(_))) {
        return Verdict::Declined;
    }
    let loc = cx.loc.clone();
    let conf = &loc.modules.auth_request;
    let Some(Some(uri)) = &conf.uri else {
        return Verdict::Declined;
    };
    // nginx passes the URI as written: no `?args` split off.
    let Some(mut sub) = cx.subrequest(uri.to_vec(), None, Method::Get, false) else {
        return Verdict::Fail(Response::status(500));
    };
    let resp = crate::http::subrequest::run(&mut sub).await;
    let status = resp.status;
    let mut builtins = Vec::new();
    if let Some(vars) = &conf.vars {
        for (target, t) in vars.iter() {
            let v = t.render_vec(&sub);
            match target {
                SetTarget::User(i) => {
                    if let Some(slot) = sub.user_vars.borrow_mut().get_mut(*i) {
                        *slot = Some(v);
                    }
                }
                _ => builtins.push((*target, v)),
            }
        }
    }
    let challenge: Vec<_> = resp
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("www-authenticate"))
        .cloned()
        .collect();
    // The body is not wanted (nginx's header_only subrequest): a proxied
    // one is dropped unread.
    drop(resp);
    crate::http::subrequest::finish(cx, sub);
    for (target, v) in builtins {
        match target {
            SetTarget::Args => cx.args = (!v.is_empty()).then(|| v.into()),
            SetTarget::LimitRate => {
                match std::str::from_utf8(&v)
                    .ok()
                    .and_then(crate::config::value::size)
                {
                    Some(n) => cx.set_note(super::rewrite::LIMIT_RATE, n.to_string()),
                    None => cx.log(
                        Level::Error,
                        &format!("invalid $limit_rate \"{}\"", String::from_utf8_lossy(&v)),
                    ),
                }
            }
            SetTarget::User(_) => {}
        }
    }
    match status {
        200..=299 => Verdict::Allow,
        401 => {
            let mut r = Response::status(401);
            r.headers = challenge;
            Verdict::Refuse(r)
        }
        403 => Verdict::Refuse(Response::status(403)),
        s => {
            cx.log(
                Level::Error,
                &format!("auth request unexpected status: {}", s),
            );
            Verdict::Fail(Response::status(500))
        }
    }
}
