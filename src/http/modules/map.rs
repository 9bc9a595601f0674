//! `map` and `split_clients`: variables computed from another value.
//!
//! Both are `http`-level blocks compiled once into a [`UserVar`] that the
//! variable table evaluates when the variable is read.
//!
//! `map SOURCE $var { ... }` looks the rendered source up in this order,
//! as nginx does:
//!
//! 1. exact keys (compared ASCII case-insensitively: nginx lowercases the
//!    keys and the looked-up value alike);
//! 2. with `hostnames`: the longest matching leading wildcard
//!    (`*.example.com`, or `.example.com` which also matches
//!    `example.com`), then the longest trailing wildcard (`www.example.*`);
//!    a trailing dot of the source is ignored;
//! 3. `~regex` / `~*regex` entries in file order (never for an empty
//!    source); a matching regex's captures (`$1`, `$0`, named groups) are
//!    what the entry's value sees;
//! 4. `default`, else the empty string.
//!
//! `split_clients STRING $var { 10% a; * b; }` hashes the rendered string
//! with nginx's MurmurHash2 and picks the first bucket whose cumulative
//! bound (percent in hundredths, scaled to 0..=0xFFFFFFFF) is above the
//! hash, so a key lands in the same bucket as with nginx.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::regex::Regex;
use crate::http::conf::HttpMain;
use crate::http::vars::{Template, UserVar, Var, VarCtx};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "map",
        ctx: ctx::HTTP,
        args: Args::take(2),
        set: Setter::HttpMainBlock(set_map),
    },
    Spec {
        name: "split_clients",
        ctx: ctx::HTTP,
        args: Args::take(2),
        set: Setter::HttpMainBlock(set_split_clients),
    },
];

/// A `~regex` entry with what its value needs to see the captures.
#[derive(Debug)]
struct MapRegex {
    re: Regex,
    /// Index into [`MapVar::values`].
    value: usize,
    /// Named groups as (user variable index, group index): the value may
    /// refer to them as `$name`.
    named: Vec<(usize, usize)>,
}

/// A compiled `map` block.
#[derive(Debug, Default)]
struct MapVar {
    source: Template,
    hostnames: bool,
    /// `volatile`: computed on every read, not once per request.
    volatile: bool,
    values: Vec<Template>,
    /// Lowercased exact keys.
    exact: HashMap<Vec<u8>, usize>,
    /// Leading wildcards by lowercased suffix (`a.com` for `*.a.com` and
    /// `.a.com`): (value, whether the bare suffix itself matches).
    head: HashMap<Vec<u8>, (usize, bool)>,
    /// Trailing wildcards by lowercased prefix (`www.a` for `www.a.*`).
    tail: HashMap<Vec<u8>, usize>,
    regexes: Vec<MapRegex>,
    default: Option<usize>,
}

/// Captures of a map regex, layered over the request's variables while the
/// matching entry's value renders.
struct Captured<'a> {
    inner: &'a dyn VarCtx,
    src: &'a [u8],
    caps: Vec<Option<(usize, usize)>>,
    named: &'a [(usize, usize)],
}

impl VarCtx for Captured<'_> {
    fn var(&self, v: &Var, out: &mut Vec<u8>) -> bool {
        let group = match v {
            Var::Capture(n) => Some(*n),
            Var::User(i) => self.named.iter().find(|(u, _)| u == i).map(|(_, g)| *g),
            _ => None,
        };
        match group {
            Some(g) => match self.caps.get(g).copied().flatten() {
                Some((s, e)) => {
                    out.extend_from_slice(self.src.get(s..e).unwrap_or(b""));
                    true
                }
                None => false,
            },
            None => self.inner.var(v, out),
        }
    }
}

impl MapVar {
    /// Exact, then wildcards; the value index.
    fn find_hashed(&self, key: &[u8]) -> Option<usize> {
        let low = key.to_ascii_lowercase();
        if let Some(v) = self.exact.get(&low) {
            return Some(*v);
        }
        if !self.hostnames {
            return None;
        }
        // Leading wildcards, longest suffix first: the whole name (only
        // `.name` entries match it bare), then what follows each dot.
        if let Some((v, true)) = self.head.get(&low) {
            return Some(*v);
        }
        for (i, _) in low.iter().enumerate().filter(|(_, &c)| c == b'.') {
            if let Some((v, _)) = self.head.get(&low[i + 1..]) {
                return Some(*v);
            }
        }
        // Trailing wildcards, longest prefix first; something must follow
        // the dot.
        for (i, _) in low.iter().enumerate().rev().filter(|(_, &c)| c == b'.') {
            if i + 1 < low.len() {
                if let Some(v) = self.tail.get(&low[..i]) {
                    return Some(*v);
                }
            }
        }
        None
    }
}

impl UserVar for MapVar {
    fn cacheable(&self) -> bool {
        !self.volatile
    }

    fn eval(&self, cx: &dyn VarCtx, out: &mut Vec<u8>) -> bool {
        let mut src = self.source.render_vec(cx);
        if self.hostnames && src.last() == Some(&b'.') {
            src.pop();
        }
        if let Some(v) = self.find_hashed(&src) {
            self.values[v].render(cx, out);
            return true;
        }
        // nginx tries the regexes only for a non-empty value.
        if !src.is_empty() {
            for r in &self.regexes {
                // A match replaces the captures, even with no groups
                // (then `$1` is empty), as in nginx.
                let Some(caps) = r.re.captures(&src) else {
                    continue;
                };
                let layered = Captured {
                    inner: cx,
                    src: &src,
                    caps,
                    named: &r.named,
                };
                self.values[r.value].render(&layered, out);
                return true;
            }
        }
        if let Some(v) = self.default {
            self.values[v].render(cx, out);
        }
        true
    }
}

/// The `$name` argument of `map`/`split_clients`, without the `$`.
pub(super) fn var_name<'a>(d: &Directive, a: &'a str) -> ConfResult<&'a str> {
    match a.strip_prefix('$') {
        Some(n) if !n.is_empty() => Ok(n),
        _ => Err(ConfError::at(format!("invalid variable name \"{}\"", a), d)),
    }
}

/// Registers the computed variable, refusing builtin names as nginx
/// refuses its non-changeable variables.
pub(super) fn define(
    cx: &mut Compiler,
    d: &Directive,
    name: &str,
    def: Arc<dyn UserVar>,
) -> ConfResult<()> {
    if let Some(v) = cx.vars.lookup(name) {
        if !matches!(v, Var::User(_)) {
            return Err(ConfError::at(
                format!("the duplicate \"{}\" variable", name),
                d,
            ));
        }
    }
    cx.vars
        .define_computed(name, def)
        .map(|_| ())
        .map_err(|m| ConfError::at(m, d))
}

/// An entry of a block: a `name args;` line; a nested block is nginx's
/// `unexpected "{"`.
pub(super) fn no_block(e: &Directive) -> ConfResult<()> {
    if e.block.is_some() {
        return Err(ConfError::at("unexpected \"{\"", e));
    }
    Ok(())
}

/// Where a key goes with `hostnames` on.
enum HostKey<'a> {
    Exact,
    /// `.a.com` (bare too) or `*.a.com`: the suffix and whether bare matches.
    Head(&'a str, bool),
    /// `www.a.*`: the prefix.
    Tail(&'a str),
}

/// nginx's rules for a key under `hostnames`: at most one `*`, no `..`,
/// and a wildcard only as `*.` / `.` at the start or `.*` at the end.
fn host_key(k: &str) -> Option<HostKey<'_>> {
    let b = k.as_bytes();
    if b.iter().filter(|&&c| c == b'*').count() > 1 || k.contains("..") || b.contains(&0) {
        return None;
    }
    if b.len() > 1 && b[0] == b'.' {
        return Some(HostKey::Head(&k[1..], true));
    }
    if b.len() > 2 {
        if let Some(rest) = k.strip_prefix("*.") {
            return Some(HostKey::Head(rest, false));
        }
        if let Some(rest) = k.strip_suffix(".*") {
            return Some(HostKey::Tail(rest));
        }
    }
    if b.contains(&b'*') {
        return None;
    }
    Some(HostKey::Exact)
}

fn set_map(_hm: &mut HttpMain, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    compile_map(d, cx)
}

/// Compiles a `map` block into the compiler's variable table; the stream
/// module's `map` is this too (against its own table).
pub(crate) fn compile_map(d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let name = var_name(d, arg(d, 1))?;
    let mut m = MapVar {
        source: cx.template(arg(d, 0), d)?,
        ..Default::default()
    };
    // Names claimed by `.name` entries, which conflict with an exact `name`.
    let mut bare: std::collections::HashSet<Vec<u8>> = Default::default();
    for e in d.block.as_deref().unwrap_or(&[]) {
        no_block(e)?;
        let key = e.name.as_str();
        if e.args.is_empty() && key == "hostnames" {
            m.hostnames = true;
            continue;
        }
        if e.args.is_empty() && key == "volatile" {
            m.volatile = true;
            continue;
        }
        if e.args.len() != 1 {
            return Err(ConfError::at("invalid number of the map parameters", e));
        }
        let value_src = arg(e, 0);
        let value_at = m.values.len();
        if key == "default" {
            if m.default.is_some() {
                return Err(ConfError::at("duplicate default map parameter", e));
            }
            m.values.push(cx.template(value_src, e)?);
            m.default = Some(value_at);
            continue;
        }
        if let Some(pat) = key.strip_prefix('~') {
            let (pat, caseless) = match pat.strip_prefix('*') {
                Some(p) => (p, true),
                None => (pat, false),
            };
            let re = Regex::compile(e, pat, caseless)?;
            // Named groups are variables in nginx; declaring them keeps a
            // value that uses `$name` valid.
            let named = re
                .capture_names()
                .iter()
                .enumerate()
                .filter_map(|(g, n)| n.as_deref().map(|n| (cx.vars.define(n), g)))
                .collect();
            m.values.push(cx.template(value_src, e)?);
            m.regexes.push(MapRegex {
                re,
                value: value_at,
                named,
            });
            continue;
        }
        // A leading backslash escapes a key that would read as a keyword
        // or a regex (`\default`, `\~name`).
        let key = key.strip_prefix('\\').unwrap_or(key);
        let conflict = || {
            ConfError::at(
                format!("conflicting parameter \"{}\"", key.to_ascii_lowercase()),
                e,
            )
        };
        let kind = if m.hostnames {
            host_key(key).ok_or_else(|| {
                ConfError::at(format!("invalid hostname or wildcard \"{}\"", key), e)
            })?
        } else {
            HostKey::Exact
        };
        match kind {
            HostKey::Exact => {
                let low = key.as_bytes().to_ascii_lowercase();
                if m.exact.contains_key(&low) || bare.contains(&low) {
                    return Err(conflict());
                }
                m.exact.insert(low, value_at);
            }
            HostKey::Head(suffix, also_bare) => {
                let low = suffix.as_bytes().to_ascii_lowercase();
                if also_bare && (m.exact.contains_key(&low) || !bare.insert(low.clone())) {
                    return Err(conflict());
                }
                if m.head.contains_key(&low) {
                    return Err(conflict());
                }
                m.head.insert(low, (value_at, also_bare));
            }
            HostKey::Tail(prefix) => {
                let low = prefix.as_bytes().to_ascii_lowercase();
                if m.tail.contains_key(&low) {
                    return Err(conflict());
                }
                m.tail.insert(low, value_at);
            }
        }
        m.values.push(cx.template(value_src, e)?);
    }
    define(cx, d, name, Arc::new(m))
}

/// nginx's MurmurHash2 (`ngx_murmur_hash2`): seed 0, mixed with the length.
pub fn murmur_hash2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let mut h = data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        for (i, &b) in rest.iter().enumerate().rev() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// A compiled `split_clients` block: (upper bound, value) in order; a
/// bound of `None` is `*`, which takes every hash.
#[derive(Debug)]
struct SplitVar {
    source: Template,
    parts: Vec<(Option<u32>, Vec<u8>)>,
}

impl UserVar for SplitVar {
    fn eval(&self, cx: &dyn VarCtx, out: &mut Vec<u8>) -> bool {
        let hash = murmur_hash2(&self.source.render_vec(cx));
        for (bound, value) in &self.parts {
            if bound.is_none_or(|b| hash < b) {
                out.extend_from_slice(value);
                break;
            }
        }
        // Past the last bucket the value is empty, not "not found".
        true
    }
}

/// `NN.NN%` in hundredths, as nginx's `ngx_atofp(s, len, 2)`: digits and
/// one dot, at most two decimals, no overflow of a signed 64-bit value.
fn percent(s: &str) -> Option<i64> {
    let num = s.strip_suffix('%')?;
    if num.is_empty() {
        return None;
    }
    let (mut value, mut dot, mut decimals) = (0i64, false, 0u32);
    for c in num.bytes() {
        match c {
            b'.' if !dot => dot = true,
            b'0'..=b'9' => {
                if dot {
                    if decimals == 2 {
                        return None;
                    }
                    decimals += 1;
                }
                value = value.checked_mul(10)?.checked_add(i64::from(c - b'0'))?;
            }
            _ => return None,
        }
    }
    for _ in decimals..2 {
        value = value.checked_mul(10)?;
    }
    Some(value)
}

fn set_split_clients(_hm: &mut HttpMain, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    compile_split_clients(d, cx)
}

/// Compiles a `split_clients` block (http's and stream's).
pub(crate) fn compile_split_clients(d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let source = cx.template(arg(d, 0), d)?;
    let name = var_name(d, arg(d, 1))?;
    let mut parts = Vec::new();
    let mut sum: u64 = 0;
    for e in d.block.as_deref().unwrap_or(&[]) {
        no_block(e)?;
        // nginx reads only the first value; extra words are ignored.
        let value = arg(e, 0).as_bytes().to_vec();
        if e.name == "*" {
            sum = 10_000;
            parts.push((None, value));
            continue;
        }
        let invalid = || ConfError::at(format!("invalid percent value \"{}\"", e.name), e);
        let n = match percent(&e.name) {
            Some(n) if n != 0 => n,
            _ => return Err(invalid()),
        };
        // nginx keeps the percentage in 32 bits.
        let n = n as u32;
        sum += u64::from(n);
        if sum > 10_000 {
            return Err(ConfError::at("percent total is greater than 100%", e));
        }
        parts.push((Some((sum * 0xffff_ffff / 10_000) as u32), value));
    }
    define(cx, d, name, Arc::new(SplitVar { source, parts }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur_matches_reference_values() {
        // Values of MurmurHash2 with seed 0 (checked against nginx buckets in
        // the integration tests).
        assert_eq!(murmur_hash2(b""), 0);
        assert_eq!(murmur_hash2(b"a"), 0x92685f5e);
        assert_eq!(murmur_hash2(b"abcd"), 0x26873021);
        assert_eq!(murmur_hash2(b"hello world"), 0x44a81419);
    }

    #[test]
    fn percents_in_hundredths() {
        assert_eq!(percent("10%"), Some(1000));
        assert_eq!(percent("33.3%"), Some(3330));
        assert_eq!(percent("0.01%"), Some(1));
        assert_eq!(percent("10.555%"), None);
        assert_eq!(percent("1.2.3%"), None);
        assert_eq!(percent("%"), None);
        assert_eq!(percent("10"), None);
        assert_eq!(percent("99999999999999999999%"), None);
    }

    #[test]
    fn host_keys() {
        assert!(matches!(
            host_key(".a.com"),
            Some(HostKey::Head("a.com", true))
        ));
        assert!(matches!(
            host_key("*.a.com"),
            Some(HostKey::Head("a.com", false))
        ));
        assert!(matches!(host_key("www.a.*"), Some(HostKey::Tail("www.a"))));
        assert!(matches!(host_key("a.com"), Some(HostKey::Exact)));
        for bad in ["*", "*.", "a*b", "a.*.b", "*.a.*", "a..com", "www.a*"] {
            assert!(host_key(bad).is_none(), "{}", bad);
        }
    }
}
