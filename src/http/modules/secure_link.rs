//! nginx's secure_link module: `$secure_link` and `$secure_link_expires`,
//! checked when the variables are used (typically in an `if`).
//!
//! Two modes, as in nginx:
//! - `secure_link_secret WORD` (location only): the request URI is
//!   `/PREFIX/HASH/LINK`; `$secure_link` is `LINK` when `HASH` is the hex
//!   MD5 of `LINK` followed by `WORD`, else not found.
//! - `secure_link EXPR` with `secure_link_md5 EXPR`: `EXPR` renders as
//!   `HASH[,EXPIRES]`; `HASH` is the base64url MD5 of the rendered
//!   `secure_link_md5`. `$secure_link` is `1` when it matches, `0` when it
//!   matches but `EXPIRES` (seconds since the epoch) has passed, and not
//!   found otherwise; `$secure_link_expires` is `EXPIRES`.

use std::cell::Cell;
use std::sync::Arc;

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use md5::{Digest, Md5};

use crate::config::registry::{arg, ctx, set_once, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::vars::Template;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "secure_link",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_secure_link),
    },
    Spec {
        name: "secure_link_md5",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_secure_link_md5),
    },
    Spec {
        name: "secure_link_secret",
        ctx: ctx::LOC,
        args: Args::take(1),
        set: Setter::Loc(set_secure_link_secret),
    },
];

pub const VARS: &[&str] = &["secure_link", "secure_link_expires"];

#[derive(Debug, Clone, Default)]
pub struct SecureLinkLoc {
    pub variable: Option<Arc<Template>>,
    pub md5: Option<Arc<Template>>,
    pub secret: Option<Arc<str>>,
}

impl SecureLinkLoc {
    /// nginx's rule: a location with its own `secure_link_secret` takes
    /// nothing from outside; otherwise `secure_link` and `secure_link_md5`
    /// are inherited, and the outer secret only when neither is set here
    /// (the new style set in a nested location wins over an outer old one).
    pub fn merge(&mut self, p: &SecureLinkLoc) {
        if self.secret.is_some() {
            return;
        }
        if self.variable.is_none() {
            self.variable = p.variable.clone();
        }
        if self.md5.is_none() {
            self.md5 = p.md5.clone();
        }
        if self.variable.is_none() && self.md5.is_none() {
            self.secret = p.secret.clone();
        }
    }
}

/// nginx's merge-time refusal of a location that sets both modes itself
/// (an inherited `secure_link` or `secure_link_md5` is simply dropped
/// there, see [`SecureLinkLoc::merge`]).
pub fn check_own(own: &SecureLinkLoc) -> Option<&'static str> {
    (own.secret.is_some() && (own.variable.is_some() || own.md5.is_some())).then_some(
        "\"secure_link_secret\" cannot be mixed with \"secure_link\" and \"secure_link_md5\"",
    )
}

fn set_secure_link(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let t = Arc::new(cx.template(arg(d, 0), d)?);
    set_once(&mut l.modules.secure_link.variable, t, d)
}

fn set_secure_link_md5(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let t = Arc::new(cx.template(arg(d, 0), d)?);
    set_once(&mut l.modules.secure_link.md5, t, d)
}

fn set_secure_link_secret(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.secure_link.secret, Arc::from(arg(d, 0)), d)
}

thread_local! {
    /// How deep `secure_link` renderings nest: `secure_link_md5` uses
    /// `$secure_link_expires` (one level); a configuration whose
    /// expressions refer to themselves finds the variables not found past
    /// a few levels instead of recursing forever.
    static DEPTH: Cell<u8> = const { Cell::new(0) };
}

/// Renders `t` one level deeper, or None past the limit.
fn render_nested(t: &Template, cx: &Ctx<'_>) -> Option<Vec<u8>> {
    let d = DEPTH.with(Cell::get);
    if d >= 4 {
        return None;
    }
    DEPTH.with(|c| c.set(d + 1));
    let v = t.render_vec(cx);
    DEPTH.with(|c| c.set(d));
    Some(v)
}

pub fn var(cx: &Ctx<'_>, id: u8, out: &mut Vec<u8>) -> bool {
    let conf = &cx.loc.modules.secure_link;
    if id == 0 {
        if let Some(secret) = &conf.secret {
            return match old_link(cx.req.raw_uri(), secret.as_bytes()) {
                Some(link) => {
                    out.extend_from_slice(link);
                    true
                }
                None => false,
            };
        }
    }
    let (Some(variable), Some(md5)) = (&conf.variable, &conf.md5) else {
        return false;
    };
    let Some(value) = render_nested(variable, cx) else {
        return false;
    };
    let Some((hash, expires)) = split(&value) else {
        return false;
    };
    if id == 1 {
        return match expires {
            Some((raw, _)) => {
                out.extend_from_slice(raw);
                true
            }
            None => false,
        };
    }
    let Some(hash) = decode_base64url(hash) else {
        return false;
    };
    let Some(text) = render_nested(md5, cx) else {
        return false;
    };
    if Md5::digest(&text).as_slice() != hash.as_slice() {
        return false;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let expired = expires.is_some_and(|(_, t)| t < now);
    out.push(if expired { b'0' } else { b'1' });
    true
}

/// An expiry as written and as a time.
type Expiry<'a> = (&'a [u8], u64);

/// `HASH[,EXPIRES]`: the hash (at most 24 bytes) and, after the first
/// comma, the expiry as written and as a time; None where nginx finds the
/// variable not found (an expiry that is not a positive number).
fn split(v: &[u8]) -> Option<(&[u8], Option<Expiry<'_>>)> {
    let (hash, expires) = match memchr::memchr(b',', v) {
        Some(i) => {
            let raw = &v[i + 1..];
            let t = positive_time(raw)?;
            (&v[..i], Some((raw, t)))
        }
        None => (v, None),
    };
    if hash.len() > 24 {
        return None;
    }
    Some((hash, expires))
}

/// nginx's `ngx_atotm` for an expiry: decimal digits only, not empty, not
/// overflowing, and greater than zero.
fn positive_time(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: i64 = std::str::from_utf8(s).ok()?.parse().ok()?;
    (n > 0).then_some(n as u64)
}

/// base64url as nginx decodes it: the text ends at the first `=`, any
/// other byte outside the alphabet fails, and a partial last group is
/// taken as far as it goes.
fn decode_base64url(s: &[u8]) -> Option<Vec<u8>> {
    const ENGINE: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    );
    let end = memchr::memchr(b'=', s).unwrap_or(s.len());
    ENGINE.decode(&s[..end]).ok()
}

/// `secure_link_secret`: in `/PREFIX/HASH/LINK` (the request URI as
/// sent, arguments included), the LINK when HASH is 32 hex digits of
/// MD5(LINK + secret).
fn old_link<'u>(uri: &'u [u8], secret: &[u8]) -> Option<&'u [u8]> {
    let rest = uri.get(1..)?;
    let start = memchr::memchr(b'/', rest)? + 1;
    let after = &rest[start..];
    let end = memchr::memchr(b'/', after)?;
    let (hex, link) = (&after[..end], &after[end + 1..]);
    if hex.len() != 32 || link.is_empty() {
        return None;
    }
    let mut h = Md5::new();
    h.update(link);
    h.update(secret);
    let digest = h.finalize();
    if !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    for (i, byte) in digest.iter().enumerate() {
        let pair = std::str::from_utf8(&hex[2 * i..2 * i + 2]).ok()?;
        if u8::from_str_radix(pair, 16).ok()? != *byte {
            return None;
        }
    }
    Some(link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_mode_links() {
        // md5("linkSECRET")
        let d = Md5::digest(b"a/b.txtS");
        let hex: String = d.iter().map(|b| format!("{:02X}", b)).collect();
        let uri = format!("/p/{}/a/b.txt", hex);
        assert_eq!(old_link(uri.as_bytes(), b"S"), Some(&b"a/b.txt"[..]));
        assert_eq!(old_link(uri.as_bytes(), b"T"), None);
        assert_eq!(old_link(format!("/p/{}/", hex).as_bytes(), b"S"), None);
        assert_eq!(old_link(b"/p/abc/x", b"S"), None);
        assert_eq!(old_link(b"/", b"S"), None);
        assert_eq!(old_link(b"", b"S"), None);
    }

    #[test]
    fn hash_and_expiry() {
        assert_eq!(
            split(b"abc,10"),
            Some((&b"abc"[..], Some((&b"10"[..], 10))))
        );
        assert_eq!(split(b"abc,0"), None);
        assert_eq!(split(b"abc,"), None);
        assert_eq!(split(b"abc,1x"), None);
        assert_eq!(split(b"abc,-1"), None);
        assert_eq!(split(&[b'a'; 25]), None);
        assert_eq!(decode_base64url(b"AQID"), Some(vec![1, 2, 3]));
        assert_eq!(decode_base64url(b"AQI"), Some(vec![1, 2]));
        assert_eq!(decode_base64url(b"AQI=junk"), Some(vec![1, 2]));
        assert_eq!(decode_base64url(b"A+"), None);
        assert_eq!(decode_base64url(b"AQIDB"), None);
    }
}
