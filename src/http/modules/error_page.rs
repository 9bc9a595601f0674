//! `error_page` and `recursive_error_pages`: when a request ends with an
//! error status and no body of its own, redirect it (internally to a URI
//! or a named location, or externally with a 302/301...), as nginx does.

use crate::config::registry::{ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::vars::Template;

#[derive(Debug, Clone)]
pub struct ErrorPage {
    pub codes: Vec<u16>,
    /// `=code` overrides the status; `=` alone takes the target's status.
    pub overwrite: Overwrite,
    pub target: Template,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    Keep,
    Code(u16),
    FromTarget,
}

#[derive(Debug, Clone, Default)]
pub struct ErrorPageLoc {
    pub pages: Option<Vec<ErrorPage>>,
    pub recursive: Option<bool>,
}

impl ErrorPageLoc {
    pub fn merge(&mut self, p: &ErrorPageLoc) {
        crate::http::conf::merge_opts!(self, p; pages, recursive);
    }

    pub fn find(&self, code: u16) -> Option<&ErrorPage> {
        self.pages
            .as_ref()?
            .iter()
            .find(|p| p.codes.contains(&code))
    }
}

fn set_error_page(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let n = d.args.len();
    let target = d.args[n - 1].value.clone();
    let mut codes = Vec::new();
    let mut overwrite = Overwrite::Keep;
    for a in &d.args[..n - 1] {
        let v = a.value.as_str();
        if let Some(c) = v.strip_prefix('=') {
            overwrite = if c.is_empty() {
                Overwrite::FromTarget
            } else {
                Overwrite::Code(
                    c.parse()
                        .map_err(|_| ConfError::at(format!("invalid value \"{}\"", v), d))?,
                )
            };
            continue;
        }
        let code: u16 = v
            .parse()
            .map_err(|_| ConfError::at(format!("invalid value \"{}\"", v), d))?;
        if !(300..=599).contains(&code) {
            return Err(ConfError::at(
                format!("value \"{}\" must be between 300 and 599", v),
                d,
            ));
        }
        if code == 499 {
            return Err(ConfError::at(format!("invalid value \"{}\"", v), d));
        }
        codes.push(code);
    }
    if codes.is_empty() {
        return Err(crate::config::registry::invalid_args(d));
    }
    let target = cx.template(&target, d)?;
    l.modules
        .error_page
        .pages
        .get_or_insert_with(Vec::new)
        .push(ErrorPage {
            codes,
            overwrite,
            target,
        });
    Ok(())
}

fn set_recursive(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.error_page.recursive, v, d)
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "error_page",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::AtLeast(2),
        set: Setter::Loc(set_error_page),
    },
    Spec {
        name: "recursive_error_pages",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_recursive),
    },
];
