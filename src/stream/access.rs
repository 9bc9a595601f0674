//! `allow` / `deny` (nginx's ngx_stream_access_module): the access
//! phase of a stream session. The rules of a server (or inherited from
//! `stream {}`) are tried in order against the client's address (after
//! realip); the first that matches decides, and a `deny` ends the session
//! with 403 and nginx's error line. The address forms and their parsing
//! are http's ([`crate::http::modules::access`]).

use crate::config::registry::{row, Args};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::modules::access::{matches_addr, Rule};
use crate::stream::conf::{ProxyConf, StreamSetter, StreamSpec, SS};
use crate::stream::session::Session;

/// The access module's directives.
pub const DIRECTIVES: &[StreamSpec] = &[
    row!("allow", SS, Args::take(1), StreamSetter::Proxy(set_rule)),
    row!("deny", SS, Args::take(1), StreamSetter::Proxy(set_rule)),
];

fn set_rule(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let addr = crate::http::modules::access::parse_addr(d)?;
    p.access.get_or_insert_with(Vec::new).push(Rule {
        allow: d.name == "allow",
        addr,
    });
    Ok(())
}

/// The access phase: false when a `deny` matched (logged, status 403).
pub fn check(s: &mut Session) -> bool {
    let peer = s.remote.map(|a| a.ip());
    let denied = s
        .srv
        .access
        .iter()
        .find(|r| matches_addr(&r.addr, peer))
        .is_some_and(|r| !r.allow);
    if denied {
        s.log(
            Level::Error,
            format_args!("access forbidden by rule, {}", s.client_ctx()),
        );
        s.status = 403;
    }
    !denied
}
