//! What proxy rewrites in the relayed headers: `Set-Cookie` by
//! `proxy_cookie_domain`, `proxy_cookie_path` and `proxy_cookie_flags`,
//! (`Location` and `Refresh`: `redirect.rs`).

use super::{CookieFlags, CookieMatch, CookieRewrite, ProxyLoc};
use crate::http::phases::Ctx;

/// `Set-Cookie` attributes: name, and the value when there is an `=`.
type CookieAttrs = Vec<(Vec<u8>, Option<Vec<u8>>)>;

fn parse_cookie(v: &[u8]) -> CookieAttrs {
    v.split(|&c| c == b';')
        .map(|part| match memchr::memchr(b'=', part) {
            Some(i) => (
                part[..i].trim_ascii().to_vec(),
                Some(part[i + 1..].trim_ascii().to_vec()),
            ),
            None => (part.trim_ascii().to_vec(), None),
        })
        .collect()
}

/// Whether `m` matches `v`: text case-insensitively and whole, a regex
/// anywhere (its captures become `$1`.. for the replacement).
fn cookie_matches(cx: &mut Ctx<'_>, m: &CookieMatch, v: &[u8]) -> bool {
    match m {
        CookieMatch::Text(t) => t.render_vec(&*cx).eq_ignore_ascii_case(v),
        CookieMatch::Regex(re) => match re.captures(v) {
            Some(c) => {
                cx.captures = c;
                cx.capture_src = v.to_vec();
                true
            }
            None => false,
        },
    }
}

/// `proxy_cookie_domain`, `proxy_cookie_path`, `proxy_cookie_flags` on
/// the `Set-Cookie` headers, as nginx: a header that any of them changes
/// is rebuilt as `name=value; attr=value; attr`, others pass as they came.
pub(super) fn rewrite_cookies(
    cx: &mut Ctx<'_>,
    conf: &ProxyLoc,
    headers: &mut [(String, Vec<u8>)],
) {
    let domains = conf.cookie_domain.as_deref().filter(|v| !v.is_empty());
    let paths = conf.cookie_path.as_deref().filter(|v| !v.is_empty());
    let flags = conf.cookie_flags.as_deref().filter(|v| !v.is_empty());
    if domains.is_none() && paths.is_none() && flags.is_none() {
        return;
    }
    for (n, v) in headers.iter_mut() {
        if !n.eq_ignore_ascii_case("set-cookie") {
            continue;
        }
        let mut attrs = parse_cookie(v);
        if attrs.first().is_none_or(|a| a.1.is_none()) {
            continue;
        }
        let mut changed = false;
        for a in attrs.iter_mut().skip(1) {
            let Some(val) = a.1.as_mut() else { continue };
            if let Some(rules) = domains.filter(|_| a.0.eq_ignore_ascii_case(b"domain")) {
                changed |= rewrite_domain(cx, rules, val);
            }
            if let Some(rules) = paths.filter(|_| a.0.eq_ignore_ascii_case(b"path")) {
                changed |= rewrite_path(cx, rules, val);
            }
        }
        if let Some(list) = flags {
            changed |= edit_flags(cx, list, &mut attrs);
        }
        if changed {
            let mut out = Vec::with_capacity(v.len() + 16);
            for (i, (k, val)) in attrs.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b"; ");
                }
                out.extend_from_slice(k);
                if let Some(val) = val {
                    out.push(b'=');
                    out.extend_from_slice(val);
                }
            }
            *v = out;
        }
    }
}

/// The first matching `proxy_cookie_domain` rule replaces the domain (a
/// leading dot is kept and not matched).
fn rewrite_domain(cx: &mut Ctx<'_>, rules: &[CookieRewrite], val: &mut Vec<u8>) -> bool {
    let dot = usize::from(val.first() == Some(&b'.'));
    for r in rules {
        let cur = val[dot..].to_vec();
        if cookie_matches(cx, &r.pattern, &cur) {
            let rep = r.replacement.render_vec(&*cx);
            val.truncate(dot);
            val.extend_from_slice(&rep);
            return true;
        }
    }
    false
}

/// The first matching `proxy_cookie_path` rule: text replaces the prefix
/// it matches (case-sensitively), a regex the whole path.
fn rewrite_path(cx: &mut Ctx<'_>, rules: &[CookieRewrite], val: &mut Vec<u8>) -> bool {
    for r in rules {
        match &r.pattern {
            CookieMatch::Text(t) => {
                let pat = t.render_vec(&*cx);
                if val.starts_with(&pat) {
                    let mut out = r.replacement.render_vec(&*cx);
                    out.extend_from_slice(&val[pat.len()..]);
                    *val = out;
                    return true;
                }
            }
            m @ CookieMatch::Regex(_) => {
                let cur = val.clone();
                if cookie_matches(cx, m, &cur) {
                    *val = r.replacement.render_vec(&*cx);
                    return true;
                }
            }
        }
    }
    false
}

/// The first `proxy_cookie_flags` entry naming the cookie: `secure`,
/// `httponly`, `samesite=strict|lax|none` add (or set) the attribute,
/// `nosecure`, `nohttponly`, `nosamesite` remove it; attributes added go
/// last, in the order Secure, HttpOnly, SameSite (nginx's).
fn edit_flags(cx: &mut Ctx<'_>, list: &[CookieFlags], attrs: &mut CookieAttrs) -> bool {
    let name = attrs.first().map(|a| a.0.clone()).unwrap_or_default();
    let Some(entry) = list.iter().find(|e| cookie_matches(cx, &e.cookie, &name)) else {
        return false;
    };
    let (mut secure, mut httponly, mut samesite): (
        Option<bool>,
        Option<bool>,
        Option<Option<&str>>,
    ) = (None, None, None);
    for f in &entry.flags {
        let f = f.render_vec(&*cx).to_ascii_lowercase();
        match f.as_slice() {
            b"secure" => secure = Some(true),
            b"nosecure" => secure = Some(false),
            b"httponly" => httponly = Some(true),
            b"nohttponly" => httponly = Some(false),
            b"samesite=strict" => samesite = Some(Some("Strict")),
            b"samesite=lax" => samesite = Some(Some("Lax")),
            b"samesite=none" => samesite = Some(Some("None")),
            b"nosamesite" => samesite = Some(None),
            _ => {}
        }
    }
    let (mut has_secure, mut has_httponly, mut has_samesite) = (false, false, false);
    let mut i = 1;
    while i < attrs.len() {
        let k = attrs[i].0.to_ascii_lowercase();
        let remove = match k.as_slice() {
            b"secure" => {
                has_secure = true;
                secure == Some(false)
            }
            b"httponly" => {
                has_httponly = true;
                httponly == Some(false)
            }
            b"samesite" => {
                has_samesite = true;
                match samesite {
                    Some(Some(v)) => {
                        attrs[i] = (b"SameSite".to_vec(), Some(v.as_bytes().to_vec()));
                        false
                    }
                    Some(None) => true,
                    None => false,
                }
            }
            _ => false,
        };
        if remove {
            attrs.remove(i);
        } else {
            i += 1;
        }
    }
    if secure == Some(true) && !has_secure {
        attrs.push((b"Secure".to_vec(), None));
    }
    if httponly == Some(true) && !has_httponly {
        attrs.push((b"HttpOnly".to_vec(), None));
    }
    if let (Some(Some(v)), false) = (samesite, has_samesite) {
        attrs.push((b"SameSite".to_vec(), Some(v.as_bytes().to_vec())));
    }
    true
}
