//! `index`: which file answers a request for a directory (`/dir/`).

use crate::config::registry::{ctx, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::vars::Template;

#[derive(Debug, Clone, Default)]
pub struct IndexLoc {
    pub files: Option<Vec<Template>>,
}

impl IndexLoc {
    pub fn merge(&mut self, p: &IndexLoc) {
        if self.files.is_none() {
            self.files = p.files.clone();
        }
    }
    pub fn defaults(&mut self) {
        self.files
            .get_or_insert_with(|| vec![Template::literal("index.html")]);
    }
}

fn set_index(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let files = l.modules.index.files.get_or_insert_with(Vec::new);
    for a in &d.args {
        if a.value.is_empty() {
            return Err(crate::config::ConfError::at(
                format!("index \"{}\" in \"index\" directive is invalid", a.value),
                d,
            ));
        }
        files.push(cx.template(&a.value, d)?);
    }
    Ok(())
}

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "index",
    ctx: ctx::HSL,
    args: Args::AtLeast(1),
    set: Setter::Loc(set_index),
}];
