//! `charset`, `charset_types`, `source_charset`, `override_charset`: the
//! charset filter.
//!
//! Appends `; charset=NAME` to the Content-Type of any response (error
//! pages included) whose type is in `charset_types` (`text/html` always is;
//! `*` is any type), as nginx does, the name spelled as in the directive.
//! The type is compared whole, parameters and all, as nginx compares it: a
//! configured `text/html; foo=bar` is not `text/html`. 301 and 302 get no
//! charset (nginx's `ngx_http_set_charset`).
//!
//! A response that carries its own charset (a proxied or cached one whose
//! Content-Type has `; charset=`, see `Response::charset_param`) keeps it
//! as it is: nginx adds no second one. With `override_charset on` that
//! charset is the source: the same name as `charset` (any case, quotes
//! removed) is rewritten to the directive's spelling, as nginx does; a
//! different one would need recoding, which nginx does only through a
//! `charset_map`, and tern has none (below), so the response goes out
//! untouched with its own charset and `no "charset_map"` is logged, which
//! is also what nginx does when it has no map for the pair.
//!
//! The charsets the configuration knows are the names written in
//! `charset` and `source_charset` anywhere in the http block (nginx's
//! charset list, first spelling kept; see [`register`]). They matter where
//! nginx looks a name up: `X-Accel-Charset` from upstream
//! (`Response::override_charset`) is declared, over `charset` and
//! `charset_types`, only if known (else `unknown charset "X" to override`
//! is logged); a `charset $var` value and a response's own charset that
//! are both unknown but alike leave the Content-Type as upstream spelled
//! it, while a known pair is respelled.
//!
//! Recoding is not implemented: `charset_map` stays unsupported (a config
//! using it, such as `include koi-utf`, is refused at startup naming the
//! directive), so tern has no recoding tables. nginx refuses a
//! `charset`/`source_charset` pair without a map at startup; tern does so
//! when both are written at the same level, and otherwise does what nginx
//! does at run time without a map: logs `no "charset_map" between the
//! charsets ...` and leaves the Content-Type alone.

use std::sync::Arc;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::response::Response;
use crate::http::vars::{Template, UserVar, Var, VarCtx};

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
        register(cx, v, d)?;
        Charset::Name(v.to_string())
    };
    set_once(&mut l.modules.charset.charset, c, d)?;
    check_pair(&l.modules.charset)
}

fn set_source(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    register(cx, arg(d, 0), d)?;
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

/// Whether the Content-Type is one the charset applies to. nginx looks
/// the whole value up in its `charset_types` hash, so a type with
/// parameters matches only `*`.
fn type_matches(ct: &str, types: Option<&[String]>) -> bool {
    if ct.eq_ignore_ascii_case("text/html") {
        return true;
    }
    match types {
        Some(t) => t.iter().any(|t| t == "*" || ct.eq_ignore_ascii_case(t)),
        None => DEFAULT_TYPES.iter().any(|t| ct.eq_ignore_ascii_case(t)),
    }
}

/// Splits a response's own Content-Type as nginx's upstream module does
/// (`ngx_http_upstream_copy_content_type`): the length of the type before
/// the `;` that introduces `charset=`, and the charset, which runs to the
/// end of the value less one pair of quotes.
pub(crate) fn own_charset(ct: &str) -> Option<(usize, &str)> {
    let b = ct.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b';' {
            i += 1;
            continue;
        }
        let semi = i;
        i += 1;
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
        let rest = b.get(i..).unwrap_or_default();
        if rest.len() >= 8 && rest[..8].eq_ignore_ascii_case(b"charset=") {
            let mut s = i + 8;
            let mut e = b.len();
            if b.get(s) == Some(&b'"') {
                s += 1;
            }
            if e > s && b[e - 1] == b'"' {
                e -= 1;
            }
            return Some((semi, ct.get(s..e).unwrap_or_default()));
        }
        // nginx's loop steps past the character after the spaces too.
        i += 1;
    }
    None
}

/// The variable-table key under which a charset name written in the
/// configuration is registered (case-folded, as nginx compares names; the
/// NUL keeps it out of reach of configuration text). The table travels
/// with the compiled http block, so the filter can ask at run time.
fn known_key(name: &str) -> String {
    format!("\0charset:{}", name.to_ascii_lowercase())
}

/// A charset name as first written in the configuration.
#[derive(Debug)]
struct Spelling(String);

impl UserVar for Spelling {
    fn eval(&self, _: &dyn VarCtx, out: &mut Vec<u8>) -> bool {
        out.extend_from_slice(self.0.as_bytes());
        true
    }
}

/// Adds a name of `charset`/`source_charset` to the charsets the
/// configuration knows (nginx's `ngx_http_add_charset`: the first
/// spelling stays).
fn register(cx: &mut Compiler, name: &str, d: &Directive) -> ConfResult<()> {
    let key = known_key(name);
    if cx.vars.lookup(&key).is_none() {
        cx.vars
            .define_computed(&key, Arc::new(Spelling(name.to_string())))
            .map_err(|m| ConfError::at(m, d))?;
    }
    Ok(())
}

/// A charset as nginx's filter sees one: its name, and whether the
/// configuration knows it (under which first spelling).
struct Named {
    name: String,
    known: Option<String>,
}

impl Named {
    fn new(cx: &Ctx<'_>, name: String) -> Named {
        let known = match cx.http.main.vars.lookup(&known_key(&name)) {
            Some(Var::User(i)) => cx.http.main.vars.def(i).map(|d| {
                let mut v = Vec::new();
                d.eval(cx, &mut v);
                String::from_utf8_lossy(&v).into_owned()
            }),
            _ => None,
        };
        Named { name, known }
    }

    /// nginx's charset index comparison: the same known charset, or both
    /// unknown.
    fn same_index(&self, o: &Named) -> bool {
        match (&self.known, &o.known) {
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            (None, None) => true,
            _ => false,
        }
    }
}

/// Header filter (see `phases::HEADER_FILTERS` for the order). Follows
/// nginx's `ngx_http_charset_header_filter`: the destination charset
/// (`X-Accel-Charset`, else `charset`), then the source (the response's
/// own charset, else `source_charset`), then what to do with the pair.
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    // Without `charset` and without X-Accel-Charset every path below ends
    // with the header unchanged: skip the copies it makes first.
    if resp.override_charset.is_none()
        && matches!(cx.loc.modules.charset.charset, None | Some(Charset::Off))
    {
        return;
    }
    let loc = cx.loc.clone();
    let conf = &loc.modules.charset;
    let Some(ct) = resp.content_type.clone().filter(|c| !c.is_empty()) else {
        return;
    };
    let own = if resp.charset_param {
        own_charset(&ct)
    } else {
        None
    };
    let dst = if let Some(x) = resp.override_charset.take().filter(|x| !x.is_empty()) {
        // X-Accel-Charset from upstream: whatever `charset` and the types
        // say, if the configuration knows the name.
        let dst = Named::new(cx, x);
        if dst.known.is_none() {
            cx.log(
                Level::Error,
                &format!("unknown charset \"{}\" to override", dst.name),
            );
            return;
        }
        dst
    } else {
        match own {
            // An empty `charset=` is none to nginx, but the type it measured
            // ends before it, so the header goes out as it came.
            Some((_, "")) => return,
            Some(_) if !conf.override_charset.unwrap_or(false) => return,
            Some(_) => {}
            None if !type_matches(&ct, conf.types.as_deref().map(|v| v.as_slice())) => return,
            None => {}
        }
        match &conf.charset {
            None | Some(Charset::Off) => return,
            Some(Charset::Name(n)) => {
                let mut d = Named::new(cx, n.clone());
                // The first spelling in the configuration is the name.
                if let Some(k) = &d.known {
                    d.name = k.clone();
                }
                d
            }
            Some(Charset::Var(t)) => {
                let v = t.render_vec(&*cx);
                if v.is_empty() {
                    // nginx fails the request here; tern just adds no charset.
                    return;
                }
                // The variable's value is the name, as it is spelled.
                Named::new(cx, String::from_utf8_lossy(&v).into_owned())
            }
        }
    };
    let (base, src) = match own.filter(|(_, cs)| !cs.is_empty()) {
        Some((base, cs)) => (Some(base), Some(Named::new(cx, cs.to_string()))),
        None => (
            None,
            conf.source.clone().map(|s| {
                let mut n = Named::new(cx, s);
                if let Some(k) = &n.known {
                    n.name = k.clone();
                }
                n
            }),
        ),
    };
    let Some(src) = src else {
        // No source charset: the destination is declared.
        declare(resp, ct, None, &dst.name);
        return;
    };
    let no_map = |cx: &Ctx<'_>| {
        cx.log(
            Level::Error,
            &format!(
                "no \"charset_map\" between the charsets \"{}\" and \"{}\"",
                src.name, dst.name
            ),
        );
    };
    if dst.known.is_none() || src.known.is_none() {
        // nginx compares the source's first bytes, as many as the
        // destination has, with the destination's.
        let prefix = src
            .name
            .as_bytes()
            .get(..dst.name.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(dst.name.as_bytes()));
        if !dst.same_index(&src) || !prefix {
            no_map(cx);
        }
        // Both unknown and alike: nginx declares the destination but keeps
        // the response's own Content-Type (whose length is not the
        // type's), so the header goes out as it came.
        return;
    }
    if dst.same_index(&src) {
        declare(resp, ct, base, &dst.name);
        return;
    }
    // Recoding would need a charset_map (tern has none). nginx checks
    // the encoding first and passes an encoded body silently.
    if resp
        .header("content-encoding")
        .is_some_and(|v| !v.is_empty())
    {
        return;
    }
    // The body keeps its bytes, so the header keeps the charset that
    // describes them.
    no_map(cx);
}

/// Declares `name` as the charset: the type (cut before the response's
/// own charset, if any) plus `; charset=NAME`, except on 301 and 302,
/// where nginx declares none (Netscape 4 applied it to the page
/// redirected to).
fn declare(resp: &mut Response, mut ct: String, base: Option<usize>, name: &str) {
    if let Some(base) = base {
        ct.truncate(base);
    }
    if !matches!(resp.status, 301 | 302) {
        ct.push_str("; charset=");
        ct.push_str(name);
    }
    resp.content_type = Some(ct);
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
        assert!(!type_matches("text/html; foo=bar", None));
        assert!(type_matches("text/html; foo=bar", Some(&["*".into()])));
    }

    #[test]
    fn own() {
        assert_eq!(own_charset("text/html"), None);
        assert_eq!(own_charset("text/html; foo=bar"), None);
        assert_eq!(
            own_charset("text/html; charset=koi8-r"),
            Some((9, "koi8-r"))
        );
        assert_eq!(
            own_charset("text/html;charset=\"KOI8-R\""),
            Some((9, "KOI8-R"))
        );
        assert_eq!(
            own_charset("text/html; a=b; Charset=x; y=z"),
            Some((14, "x; y=z"))
        );
        assert_eq!(own_charset("text/html;  "), None);
        assert_eq!(own_charset("text/html; charset="), Some((9, "")));
        assert_eq!(own_charset("a;charset=\""), Some((1, "")));
    }
}
