//! `charset`, `charset_types`, `source_charset`, `override_charset`: the
//! charset filter.
//!
//! Appends `; charset=NAME` to the Content-Type of any response (error
//! pages included) whose type is in `charset_types` (`text/html` always is;
//! `*` is any type), as nginx does, the name spelled as in the directive.
//!
//! Recoding is not implemented: `charset_map` stays unsupported (a config
//! using it, such as `include koi-utf`, is refused at startup naming the
//! directive), so tern has no recoding tables. nginx refuses a
//! `charset`/`source_charset` pair without a map at startup; tern does so
//! when both are written at the same level, and otherwise does what nginx
//! does at run time without a map: logs `no "charset_map" between the
//! charsets ...` and leaves the Content-Type alone.
//! `override_charset` is accepted; it only matters for a charset that came
//! from upstream, and tern has no proxy yet, so it changes nothing.

use std::sync::Arc;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::response::Response;
use crate::http::vars::Template;

/// The types `charset_types` defaults to.
const DEFAULT_TYPES: &[&str] = &[
    "text/html",
    "text/xml",
    "text/plain",
    "text/vnd.wap.wml",
    "application/javascript",
    "application/rss+xml",
];

/// `charset` value.
#[derive(Debug, Clone)]
pub enum Charset {
    Off,
    Name(String),
    /// `charset $var`: the name is computed per request.
    Var(Template),
}

#[derive(Debug, Clone, Default)]
pub struct CharsetLoc {
    pub charset: Option<Charset>,
    pub source: Option<String>,
    pub override_charset: Option<bool>,
    /// Lowercase types; `None` = the default list.
    pub types: Option<Arc<Vec<String>>>,
}

impl CharsetLoc {
    pub fn merge(&mut self, p: &CharsetLoc) {
        if self.charset.is_none() {
            self.charset = p.charset.clone();
        }
        if self.source.is_none() {
            self.source = p.source.clone();
        }
        if self.override_charset.is_none() {
            self.override_charset = p.override_charset;
        }
        if self.types.is_none() {
            self.types = p.types.clone();
        }
    }
}

/// nginx's startup error for a pair it cannot recode (it names no file).
fn no_map(src: &str, dst: &str) -> ConfError {
    ConfError::new(format!(
        "no \"charset_map\" between the charsets \"{}\" and \"{}\"",
        src, dst
    ))
}

/// Refuses a recoding pair written at one level (tern has no tables).
fn check_pair(c: &CharsetLoc) -> ConfResult<()> {
    if let (Some(Charset::Name(dst)), Some(src)) = (&c.charset, &c.source) {
        if !dst.eq_ignore_ascii_case(src) {
            return Err(no_map(src, dst));
        }
    }
    Ok(())
}

fn set_charset(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let v = arg(d, 0);
    let c = if v == "off" {
        Charset::Off
    } else if v.starts_with('$') {
        Charset::Var(cx.template(v, d)?)
    } else {
        Charset::Name(v.to_string())
    };
    set_once(&mut l.modules.charset.charset, c, d)?;
    check_pair(&l.modules.charset)
}

fn set_source(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.charset.source, arg(d, 0).to_string(), d)?;
    check_pair(&l.modules.charset)
}

fn set_override(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.charset.override_charset, v, d)
}

fn set_types(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if l.modules.charset.types.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let types = d
        .args
        .iter()
        .map(|a| a.value.to_ascii_lowercase())
        .collect();
    l.modules.charset.types = Some(Arc::new(types));
    Ok(())
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "charset",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::take(1),
        set: Setter::Loc(set_charset),
    },
    Spec {
        name: "source_charset",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::take(1),
        set: Setter::Loc(set_source),
    },
    Spec {
        name: "override_charset",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::Flag,
        set: Setter::Loc(set_override),
    },
    Spec {
        name: "charset_types",
        ctx: ctx::HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_types),
    },
];

/// Whether the media type (before any `;`) is one the charset applies to.
fn type_matches(ct: &str, types: Option<&[String]>) -> bool {
    let base = ct.split(';').next().unwrap_or("").trim();
    if base.eq_ignore_ascii_case("text/html") {
        return true;
    }
    match types {
        Some(t) => t.iter().any(|t| t == "*" || base.eq_ignore_ascii_case(t)),
        None => DEFAULT_TYPES.iter().any(|t| base.eq_ignore_ascii_case(t)),
    }
}

/// Header filter (see `phases::HEADER_FILTERS` for the order).
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    let loc = cx.loc.clone();
    let conf = &loc.modules.charset;
    let Some(ct) = resp.content_type.as_deref().filter(|c| !c.is_empty()) else {
        return;
    };
    let name = match &conf.charset {
        None | Some(Charset::Off) => return,
        Some(Charset::Name(n)) => n.clone(),
        Some(Charset::Var(t)) => {
            let v = t.render_vec(&*cx);
            if v.is_empty() {
                // nginx fails the request here; tern just adds no charset.
                return;
            }
            String::from_utf8_lossy(&v).into_owned()
        }
    };
    if !type_matches(ct, conf.types.as_deref().map(|v| v.as_slice())) {
        return;
    }
    if let Some(src) = &conf.source {
        if !src.eq_ignore_ascii_case(&name) {
            cx.log(
                Level::Error,
                &format!(
                    "no \"charset_map\" between the charsets \"{}\" and \"{}\"",
                    src, name
                ),
            );
            return;
        }
    }
    resp.content_type = Some(format!("{}; charset={}", ct, name));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types() {
        assert!(type_matches("text/html", Some(&[])));
        assert!(type_matches("text/plain", None));
        assert!(type_matches("application/javascript", None));
        assert!(!type_matches("text/css", None));
        assert!(type_matches("text/css", Some(&["*".into()])));
        assert!(type_matches("TEXT/CSS", Some(&["text/css".into()])));
        assert!(!type_matches("text/plain", Some(&["text/css".into()])));
    }
}
