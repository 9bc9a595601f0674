//! `proxy_redirect`: the `Location` and `Refresh` (its `url=` part)
//! headers of a proxied answer rewritten, as nginx's
//! `ngx_http_proxy_rewrite_redirect`.
//!
//! A location's rules are kept as written ([`Redirect`]); a request turns
//! them into [`Ready`] rules when it starts (variables rendered with the
//! request, `default` spelled out from its `proxy_pass` and location), so
//! the rewriting itself needs no request: it also runs for a background
//! cache update. The first rule that matches rewrites the value:
//! - text: the value starts with the pattern (case-sensitively): that
//!   part becomes the replacement;
//! - regex (`~`, `~*`): the pattern matches the value: the whole value
//!   becomes the replacement, in which `$1`.. are the pattern's captures.
//!
//! A rewritten `Location` that starts with `/` is made absolute as
//! nginx's header filter does with `absolute_redirect on`; one that no
//! rule rewrites passes as it came.

use std::sync::Arc;

use crate::config::registry::{arg, duplicate};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::regex::{Captures, Regex};
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::vars::{Part, Template, Var, VarCtx};

use super::Pass;

/// One `proxy_redirect` rule as configured.
#[derive(Debug, Clone)]
pub enum Redirect {
    /// `default`: the `proxy_pass` URL becomes the location.
    Default,
    Text {
        pattern: Template,
        replacement: Template,
    },
    Regex {
        pattern: Regex,
        replacement: Template,
    },
}

/// A rule ready for one request.
#[derive(Debug, Clone)]
pub enum Ready {
    Text {
        pattern: Vec<u8>,
        replacement: Vec<u8>,
    },
    /// The replacement with only the captures left to fill in.
    Regex {
        pattern: Regex,
        replacement: Template,
    },
}

/// The rules of a request: None without rewriting (`proxy_redirect off`).
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub rules: Vec<Ready>,
    /// `scheme://host[:port]` that a rewritten `/...` Location is made
    /// absolute with (None: `absolute_redirect off`).
    pub base: Option<Vec<u8>>,
}

/// `proxy_redirect default | off | PATTERN REPLACEMENT`, several adding
/// up, with nginx's checks.
pub fn set(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let cur = &l.modules.proxy.redirect;
    if cur.as_ref().is_some_and(|v| v.is_empty()) {
        return Err(duplicate(d));
    }
    let rule = if d.args.len() == 1 {
        match arg(d, 0) {
            "off" => {
                if cur.is_some() {
                    return Err(duplicate(d));
                }
                l.modules.proxy.redirect = Some(Arc::new(Vec::new()));
                return Ok(());
            }
            "default" => {
                match l.modules.proxy.pass.as_deref() {
                    None => {
                        return Err(ConfError::at(
                            "\"proxy_redirect default\" should be placed after the \
                             \"proxy_pass\" directive",
                            d,
                        ))
                    }
                    Some(p) if p.vars.is_some() => {
                        return Err(ConfError::at(
                            "\"proxy_redirect default\" cannot be used with \"proxy_pass\" \
                             directive with variables",
                            d,
                        ))
                    }
                    Some(_) => {}
                }
                Redirect::Default
            }
            a => {
                return Err(ConfError::at(format!("invalid parameter \"{}\"", a), d));
            }
        }
    } else {
        let replacement = cx.template(arg(d, 1), d)?;
        match arg(d, 0).strip_prefix('~') {
            Some(r) => {
                let (r, caseless) = match r.strip_prefix('*') {
                    Some(r) => (r, true),
                    None => (r, false),
                };
                Redirect::Regex {
                    pattern: Regex::compile(d, r, caseless)?,
                    replacement,
                }
            }
            None => Redirect::Text {
                pattern: cx.template(arg(d, 0), d)?,
                replacement,
            },
        }
    };
    let slot = l
        .modules
        .proxy
        .redirect
        .get_or_insert_with(Default::default);
    Arc::make_mut(slot).push(rule);
    Ok(())
}

/// The `default` rule spelled out: the proxy_pass URL with its URI (or
/// with the location's prefix when it has none) becomes the prefix.
fn default_rule(pass: &Pass, prefix: &[u8]) -> Ready {
    let mut pattern = pass.url.as_bytes().to_vec();
    match &pass.uri {
        Some(u) => pattern.extend_from_slice(u),
        None => pattern.extend_from_slice(prefix),
    }
    Ready::Text {
        pattern,
        replacement: prefix.to_vec(),
    }
}

/// A template with every variable but the captures rendered now.
fn bind(t: &Template, cx: &Ctx<'_>) -> Template {
    let mut parts = Vec::with_capacity(t.parts.len());
    for p in &t.parts {
        match p {
            Part::Var(Var::Capture(_)) => parts.push(p.clone()),
            Part::Var(v) => {
                let mut out = Vec::new();
                cx.var(v, &mut out);
                parts.push(Part::Lit(out));
            }
            Part::Lit(_) => parts.push(p.clone()),
        }
    }
    Template { parts }
}

/// The request's rules (`rules`: the location's merged setting; None:
/// the implicit `default`, which a `proxy_pass` with variables has not).
pub fn ready(
    cx: &Ctx<'_>,
    rules: Option<&[Redirect]>,
    pass: &Pass,
    prefix: &[u8],
) -> Option<Rules> {
    let list: Vec<Ready> = match rules {
        None if pass.vars.is_some() => return None,
        None => vec![default_rule(pass, prefix)],
        Some([]) => return None,
        Some(rules) => rules
            .iter()
            .map(|r| match r {
                Redirect::Default => default_rule(pass, prefix),
                Redirect::Text {
                    pattern,
                    replacement,
                } => Ready::Text {
                    pattern: pattern.render_vec(cx),
                    replacement: replacement.render_vec(cx),
                },
                Redirect::Regex {
                    pattern,
                    replacement,
                } => Ready::Regex {
                    pattern: pattern.clone(),
                    replacement: bind(replacement, cx),
                },
            })
            .collect(),
    };
    let base = crate::http::modules::rewrite::absolute_location(cx, b"/".to_vec());
    let base = base
        .strip_suffix(b"/")
        .filter(|b| !b.is_empty())
        .map(<[u8]>::to_vec);
    Some(Rules { rules: list, base })
}

/// Captures of a regex match, for a bound replacement.
struct Caps<'a> {
    caps: &'a Captures,
    src: &'a [u8],
}

impl VarCtx for Caps<'_> {
    fn var(&self, v: &Var, out: &mut Vec<u8>) -> bool {
        let Var::Capture(n) = v else { return false };
        match self.caps.get(*n).copied().flatten() {
            Some((s, e)) => {
                out.extend_from_slice(self.src.get(s..e).unwrap_or(b""));
                true
            }
            None => false,
        }
    }
}

impl Rules {
    /// `v[at..]` rewritten by the first rule that matches it.
    fn apply(&self, v: &[u8], at: usize) -> Option<Vec<u8>> {
        let (head, tail) = v.split_at(at.min(v.len()));
        for r in &self.rules {
            let mut out = head.to_vec();
            match r {
                Ready::Text {
                    pattern,
                    replacement,
                } => {
                    let Some(rest) = tail.strip_prefix(pattern.as_slice()) else {
                        continue;
                    };
                    out.extend_from_slice(replacement);
                    out.extend_from_slice(rest);
                }
                Ready::Regex {
                    pattern,
                    replacement,
                } => {
                    let Some(caps) = pattern.captures(tail) else {
                        continue;
                    };
                    replacement.render(
                        &Caps {
                            caps: &caps,
                            src: tail,
                        },
                        &mut out,
                    );
                }
            }
            return Some(out);
        }
        None
    }

    /// A `Location` value rewritten (None: no rule matched).
    pub fn location(&self, v: &[u8]) -> Option<Vec<u8>> {
        let out = self.apply(v, 0)?;
        Some(match &self.base {
            Some(b) if out.starts_with(b"/") => {
                let mut a = b.clone();
                a.extend_from_slice(&out);
                a
            }
            _ => out,
        })
    }

    /// A `Refresh` value with its `url=` part rewritten.
    pub fn refresh(&self, v: &[u8]) -> Option<Vec<u8>> {
        let at = v.windows(4).position(|w| w.eq_ignore_ascii_case(b"url="))?;
        self.apply(v, at + 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_regex() {
        let r = Rules {
            rules: vec![
                Ready::Text {
                    pattern: b"http://u:81/a/".to_vec(),
                    replacement: b"/b/".to_vec(),
                },
                Ready::Regex {
                    pattern: Regex::new("^(.+)/x_([^/]+)", false).unwrap(),
                    replacement: Template {
                        parts: vec![
                            Part::Var(Var::Capture(1)),
                            Part::Lit(b"/".to_vec()),
                            Part::Var(Var::Capture(2)),
                        ],
                    },
                },
            ],
            base: Some(b"http://h:8080".to_vec()),
        };
        assert_eq!(
            r.location(b"http://u:81/a/t.html").unwrap(),
            b"http://h:8080/b/t.html"
        );
        assert_eq!(r.location(b"http://u:81/x_y/z").unwrap(), b"http://u:81/y");
        assert_eq!(r.location(b"http://other/"), None);
        assert_eq!(
            r.refresh(b"7; url=http://u:81/a/t.html").unwrap(),
            b"7; url=/b/t.html"
        );
        assert_eq!(r.refresh(b"7"), None);
    }
}
