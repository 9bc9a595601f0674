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
                return Err(ConfError::at(format!("invalid return code \"{}\"", first), d));
            }
            let text = match d.args.get(1) {
                Some(a) => Some(cx.template(&a.value, d)?),
                None => None,
            };
            Op::Return { code, text }
        }
        Err(_) => {
            if d.args.len() == 2 {
                return Err(ConfError::at(format!("invalid return code \"{}\"", first), d));
            }
            if !(first.starts_with("http://") || first.starts_with("https://") || first.starts_with('$')) {
                return Err(ConfError::at(format!("invalid return code \"{}\"", first), d));
            }
            Op::Return { code: 302, text: Some(cx.template(first, d)?) }
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
