//! The rewrite module's `return` (rewrite, set and if come with the static
//! content work). Runs in the server rewrite phase (server-level
//! directives) and the location rewrite phase; not inherited, as in nginx.

use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::vars::Template;

/// One step of the rewrite phase.
#[derive(Debug, Clone)]
pub enum Op {
    /// `return CODE [TEXT]` / `return CODE URL` / `return URL`.
    Return { code: u16, text: Option<Template> },
}

#[derive(Debug, Clone, Default)]
pub struct RewriteLoc {
    /// Ops of this level only (never inherited).
    pub ops: Vec<Op>,
}

impl RewriteLoc {
    pub fn merge(&mut self, _p: &RewriteLoc) {}
}

fn set_return(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let first = arg(d, 0);
    let op = match first.parse::<u16>() {
        Ok(code) => {
            if code > 999 {
                return Err(ConfError::at(
                    format!("invalid return code \"{}\"", first),
                    d,
                ));
            }
            let text = match d.args.get(1) {
                Some(a) => Some(cx.template(&a.value, d)?),
                None => None,
            };
            Op::Return { code, text }
        }
        Err(_) => {
            if d.args.len() == 2 {
                return Err(ConfError::at(
                    format!("invalid return code \"{}\"", first),
                    d,
                ));
            }
            if !(first.starts_with("http://")
                || first.starts_with("https://")
                || first.starts_with('$'))
            {
                return Err(ConfError::at(
                    format!("invalid return code \"{}\"", first),
                    d,
                ));
            }
            Op::Return {
                code: 302,
                text: Some(cx.template(first, d)?),
            }
        }
    };
    l.modules.rewrite.ops.push(op);
    Ok(())
}

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "return",
    ctx: ctx::SRV | ctx::LOC | ctx::SIF | ctx::LIF,
    args: Args::take12(),
    set: Setter::Loc(set_return),
}];

/// Runs a list of rewrite-phase ops.
// More ops (rewrite, set, if) come with the rewrite module.
#[allow(clippy::never_loop)]
pub fn run(cx: &mut crate::http::phases::Ctx<'_>, ops: &[Op]) -> crate::http::phases::Step {
    use crate::http::phases::Step;
    use crate::http::response::{Body, Response};
    for op in ops {
        match op {
            Op::Return { code, text } => {
                let code = *code;
                if code == 444 {
                    let mut r = Response::status(444);
                    r.close_silently = true;
                    return Step::done(r);
                }
                let mut r = Response::status(code);
                if let Some(t) = text {
                    let v = t.render_vec(&*cx);
                    if matches!(code, 301 | 302 | 303 | 307 | 308) {
                        r.location = Some(absolute_location(cx, v));
                    } else {
                        r.content_type = Some(
                            cx.loc
                                .core
                                .default_type
                                .clone()
                                .unwrap_or_else(|| "text/plain".into()),
                        );
                        r.content_length = Some(v.len() as u64);
                        r.body = Body::Bytes(v);
                    }
                }
                return Step::done(r);
            }
        }
    }
    Step::Next
}

/// A relative redirect target made absolute as nginx does with
/// `absolute_redirect on`: scheme, Host (or server name) and port.
pub fn absolute_location(cx: &crate::http::phases::Ctx<'_>, v: Vec<u8>) -> Vec<u8> {
    if !v.starts_with(b"/") {
        return v;
    }
    let mut out = b"http://".to_vec();
    match &cx.req.host {
        Some(h) => out.extend_from_slice(h),
        None => out.extend_from_slice(
            cx.server
                .srv
                .primary_name
                .as_deref()
                .unwrap_or("")
                .as_bytes(),
        ),
    }
    if let Some(a) = cx.conn.local {
        if a.port() != 80 {
            out.push(b':');
            out.extend_from_slice(a.port().to_string().as_bytes());
        }
    }
    out.extend_from_slice(&v);
    out
}
