//! `stub_status` and `tern_metrics`: the status page and the Prometheus
//! endpoint (content phase), and the `$connections_*` variables.
//!
//! `stub_status` prints nginx's text byte for byte:
//!
//! ```text
//! Active connections: 1
//! server accepts handled requests
//!  1 1 1
//! Reading: 0 Writing: 1 Waiting: 0
//! ```
//!
//! from the counters every worker shares ([`crate::core::worker::Stats`]);
//! the request being answered counts as active, writing and one request,
//! as in nginx. `tern_metrics` is in [`metrics`].

#[path = "metrics.rs"]
pub mod metrics;

use std::sync::atomic::Ordering;

use crate::config::registry::{ctx, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::phases::{Ctx, Step};
use crate::http::request::Method;
use crate::http::response::{push_num, Body, Response};

/// What a location answers with, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    StubStatus,
    Metrics,
}

#[derive(Debug, Clone, Default)]
pub struct StubStatusLoc {
    /// Set only on the level that has the directive: like nginx's content
    /// handlers, it is not inherited by nested locations.
    pub handler: Option<Handler>,
}

impl StubStatusLoc {
    pub fn merge(&mut self, _p: &StubStatusLoc) {}
}

fn set_stub_status(l: &mut LocConf, _d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    // nginx accepts and ignores one argument (the old `stub_status on`).
    l.modules.stub_status.handler = Some(Handler::StubStatus);
    Ok(())
}

fn set_metrics(l: &mut LocConf, _d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    l.modules.stub_status.handler = Some(Handler::Metrics);
    Ok(())
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "stub_status",
        ctx: ctx::SRV | ctx::LOC,
        args: Args::Take(0b11),
        set: Setter::Loc(set_stub_status),
    },
    Spec {
        name: "tern_metrics",
        ctx: ctx::SRV | ctx::LOC,
        args: Args::take(0),
        set: Setter::Loc(set_metrics),
    },
];

/// Content handler: answers when the location has `stub_status` or
/// `tern_metrics`; None lets the next content handler run.
pub fn content(cx: &mut Ctx<'_>) -> Option<Step> {
    let h = cx.loc.modules.stub_status.handler?;
    // nginx: only GET and HEAD (the body, if any, is discarded by the engine).
    if !matches!(cx.req.method, Method::Get | Method::Head) {
        return Some(Step::done(Response::status(405)));
    }
    let (ctype, body) = match h {
        Handler::StubStatus => ("text/plain", status_text(cx)),
        Handler::Metrics => (metrics::CONTENT_TYPE, metrics::render(cx)),
    };
    let mut r = Response::status(200);
    r.content_type = Some(ctype.into());
    r.content_length = Some(body.len() as u64);
    r.body = Body::Bytes(body);
    Some(Step::done(r))
}

/// The counters as stub_status reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub active: u64,
    pub accepts: u64,
    pub handled: u64,
    pub requests: u64,
    pub reading: u64,
    pub writing: u64,
    pub waiting: u64,
}

pub fn counts(cx: &Ctx<'_>) -> Counts {
    let s = &cx.shared.stats;
    let g = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    Counts {
        active: g(&s.active),
        accepts: g(&s.accepts),
        handled: g(&s.handled),
        requests: g(&s.requests),
        reading: g(&s.reading),
        writing: g(&s.writing),
        waiting: s.waiting(),
    }
}

fn status_text(cx: &Ctx<'_>) -> Vec<u8> {
    let c = counts(cx);
    let mut o = Vec::with_capacity(128);
    o.extend_from_slice(b"Active connections: ");
    push_num(&mut o, c.active);
    o.extend_from_slice(b" \nserver accepts handled requests\n ");
    push_num(&mut o, c.accepts);
    o.push(b' ');
    push_num(&mut o, c.handled);
    o.push(b' ');
    push_num(&mut o, c.requests);
    o.extend_from_slice(b" \nReading: ");
    push_num(&mut o, c.reading);
    o.extend_from_slice(b" Writing: ");
    push_num(&mut o, c.writing);
    o.extend_from_slice(b" Waiting: ");
    push_num(&mut o, c.waiting);
    o.extend_from_slice(b" \n");
    o
}

/// Module variables: nginx's stub_status variables.
pub const VARS: &[&str] = &[
    "connections_active",
    "connections_reading",
    "connections_writing",
    "connections_waiting",
];

pub fn var(cx: &Ctx<'_>, i: u8, out: &mut Vec<u8>) -> bool {
    let c = counts(cx);
    let v = match i {
        0 => c.active,
        1 => c.reading,
        2 => c.writing,
        3 => c.waiting,
        _ => return false,
    };
    push_num(out, v);
    true
}
