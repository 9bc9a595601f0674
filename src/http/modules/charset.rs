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
//! Recoding (`charset_map SRC DST { XX YY; ... }`, http level): the
//! filter recodes a body whose source and destination charsets have a
//! map, in either direction, as nginx does: between two single-byte
//! charsets byte by byte (the length stays, so ranges still apply to
//! the recoded body), and to or from UTF-8 (a map whose destination is
//! `utf-8` gives each byte its UTF-8 sequence; the length changes, so
//! Content-Length goes). Bytes a single-byte map does not name stay as
//! they are; to UTF-8 they become `?`; a UTF-8 character the map has no
//! byte for becomes `&#N;`, as in nginx. A body with a Content-Encoding
//! is not recoded and keeps its Content-Type. nginx refuses a
//! `charset`/`source_charset` pair without a map at startup; tern does
//! so when both are written at the same level, and otherwise does what
//! nginx does at run time without a map: logs `no "charset_map" between
//! the charsets ...` and leaves the Content-Type alone.

use std::sync::Arc;

use std::collections::HashMap;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::{HttpMain, LocConf};
use crate::http::phases::Ctx;
use crate::http::response::{Body, BodyFilter, Response};
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

/// Refuses a recoding pair written at one level that no `charset_map`
/// (they are all read before any server) joins.
fn check_pair(c: &CharsetLoc, cx: &Compiler) -> ConfResult<()> {
    if let (Some(Charset::Name(dst)), Some(src)) = (&c.charset, &c.source) {
        if !dst.eq_ignore_ascii_case(src) && cx.vars.lookup(&pair_key(src, dst)).is_none() {
            return Err(no_map(src, dst));
        }
    }
    Ok(())
}

/// The variable-table key that marks a pair as having a map (either
/// direction is registered).
fn pair_key(src: &str, dst: &str) -> String {
    format!(
        "\0charset_map:{}\0{}",
        src.to_ascii_lowercase(),
        dst.to_ascii_lowercase()
    )
}

/// The recoding tables of the http block, keyed by (source, destination),
/// lowercase.
#[derive(Debug, Clone, Default)]
pub struct CharsetMain {
    pub tables: HashMap<(String, String), Arc<Recode>>,
}

/// How a body is recoded from one charset to another.
#[derive(Debug)]
pub enum Recode {
    /// Byte to byte.
    Bytes(Box<[u8; 256]>),
    /// Each byte to its UTF-8 sequence.
    ToUtf8(Vec<Vec<u8>>),
    /// UTF-8 characters to bytes.
    FromUtf8(HashMap<u32, u8>),
}

/// The longest UTF-8 sequence a map may give (nginx's NGX_UTF_LEN).
const UTF_LEN: usize = 4;

fn hex(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 8 {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

/// Decodes one UTF-8 character at the start of `b`: the code point and
/// its length, `Err(true)` when `b` ends inside it, `Err(false)` when the
/// bytes are not UTF-8.
fn utf8_decode(b: &[u8]) -> Result<(u32, usize), bool> {
    let c = *b.first().ok_or(true)?;
    let (len, init) = match c {
        0x00..=0x7f => return Ok((u32::from(c), 1)),
        0xc2..=0xdf => (2, u32::from(c & 0x1f)),
        0xe0..=0xef => (3, u32::from(c & 0x0f)),
        0xf0..=0xf4 => (4, u32::from(c & 0x07)),
        _ => return Err(false),
    };
    let mut n = init;
    for i in 1..len {
        let Some(&x) = b.get(i) else {
            return Err(true);
        };
        if x & 0xc0 != 0x80 {
            return Err(false);
        }
        n = (n << 6) | u32::from(x & 0x3f);
    }
    Ok((n, len))
}

/// `charset_map SRC DST { ... }`: builds both directions' tables.
fn set_charset_map(hm: &mut HttpMain, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let (src, dst) = (arg(d, 0), arg(d, 1));
    let (ls, ld) = (src.to_ascii_lowercase(), dst.to_ascii_lowercase());
    let tables = &mut hm.modules.charset.tables;
    if tables.contains_key(&(ls.clone(), ld.clone())) {
        return Err(ConfError::at(
            format!(
                "duplicate \"charset_map\" between \"{}\" and \"{}\"",
                src, dst
            ),
            d,
        ));
    }
    if ld == "utf-8" && ls == "utf-8" {
        return Err(ConfError::at(
            format!(
                "\"charset_map\" between the same charsets \"{}\" and \"{}\"",
                src, dst
            ),
            d,
        ));
    }
    let to_utf8 = ld == "utf-8";
    let mut fwd = [0u8; 256];
    let mut back = [0u8; 256];
    // As nginx: ASCII maps to itself, an upper byte the map does not
    // name becomes `?` (both ways).
    for (i, (f, b)) in fwd.iter_mut().zip(back.iter_mut()).enumerate() {
        let same = if i < 128 { i as u8 } else { b'?' };
        *f = same;
        *b = same;
    }
    let mut to: Vec<Vec<u8>> = (0..256u32)
        .map(|i| {
            if i < 128 {
                vec![i as u8]
            } else {
                b"?".to_vec()
            }
        })
        .collect();
    let mut from: HashMap<u32, u8> = HashMap::new();
    for e in d.block.as_deref().unwrap_or(&[]) {
        super::map::no_block(e)?;
        let mut words = vec![e.name.as_str()];
        words.extend(e.args.iter().map(|a| a.value.as_str()));
        if words.len() != 2 {
            return Err(ConfError::at("invalid parameters number", e));
        }
        let invalid = |v: &str| ConfError::at(format!("invalid value \"{}\"", v), e);
        let s = hex(words[0])
            .filter(|&v| v <= 255)
            .ok_or_else(|| invalid(words[0]))? as usize;
        if to_utf8 {
            let w = words[1];
            if w.len() % 2 != 0 || w.is_empty() || w.len() > 2 * UTF_LEN {
                return Err(invalid(w));
            }
            let mut bytes = Vec::with_capacity(w.len() / 2);
            for i in (0..w.len()).step_by(2) {
                let b = w.get(i..i + 2).and_then(hex).ok_or_else(|| invalid(w))?;
                bytes.push(b as u8);
            }
            let (cp, _) = utf8_decode(&bytes).map_err(|_| invalid(w))?;
            from.insert(cp, s as u8);
            to[s] = bytes;
        } else {
            let t = hex(words[1])
                .filter(|&v| v <= 255)
                .ok_or_else(|| invalid(words[1]))? as u8;
            fwd[s] = t;
            back[usize::from(t)] = s as u8;
        }
    }
    let (f, b) = if to_utf8 {
        (Recode::ToUtf8(to), Recode::FromUtf8(from))
    } else {
        (Recode::Bytes(Box::new(fwd)), Recode::Bytes(Box::new(back)))
    };
    tables.insert((ls.clone(), ld.clone()), Arc::new(f));
    tables.insert((ld, ls), Arc::new(b));
    register(cx, src, d)?;
    register(cx, dst, d)?;
    for (a, b) in [(src, dst), (dst, src)] {
        let key = pair_key(a, b);
        if cx.vars.lookup(&key).is_none() {
            cx.vars
                .define_computed(&key, Arc::new(Spelling(String::new())))
                .map_err(|m| ConfError::at(m, d))?;
        }
    }
    Ok(())
}

/// The body filter that recodes.
struct Recoder {
    table: Arc<Recode>,
    /// The start of a UTF-8 character cut by the end of a piece.
    held: Vec<u8>,
}

impl BodyFilter for Recoder {
    fn filter(&mut self, input: &[u8], last: bool, out: &mut Vec<u8>) -> std::io::Result<()> {
        match &*self.table {
            Recode::Bytes(t) => out.extend(input.iter().map(|&b| t[usize::from(b)])),
            Recode::ToUtf8(t) => {
                for &b in input {
                    if let Some(seq) = t.get(usize::from(b)) {
                        out.extend_from_slice(seq);
                    }
                }
            }
            Recode::FromUtf8(t) => {
                let mut data = std::mem::take(&mut self.held);
                data.extend_from_slice(input);
                let mut i = 0;
                while i < data.len() {
                    let c = data[i];
                    if c < 0x80 {
                        out.push(c);
                        i += 1;
                        continue;
                    }
                    match utf8_decode(&data[i..]) {
                        Ok((n, len)) => {
                            match t.get(&n) {
                                Some(&b) => out.push(b),
                                None => out.extend_from_slice(format!("&#{};", n).as_bytes()),
                            }
                            i += len;
                        }
                        // A character cut by the end of the piece waits
                        // for the next; cut by the end of the body, nginx
                        // drops it.
                        Err(true) => {
                            if !last {
                                self.held = data[i..].to_vec();
                            }
                            break;
                        }
                        Err(_) => {
                            out.push(b'?');
                            i += 1;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn keeps_positions(&self) -> bool {
        matches!(*self.table, Recode::Bytes(_))
    }
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
    check_pair(&l.modules.charset, cx)
}

fn set_source(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    register(cx, arg(d, 0), d)?;
    set_once(&mut l.modules.charset.source, arg(d, 0).to_string(), d)?;
    check_pair(&l.modules.charset, cx)
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
        name: "charset_map",
        ctx: ctx::HTTP,
        args: Args::take(2),
        set: Setter::HttpMainBlock(set_charset_map),
    },
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
    let Some(ct) = resp
        .content_type
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(str::to_string)
    else {
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
    // Recoding. nginx checks the encoding first and passes an encoded
    // body silently.
    if resp
        .header("content-encoding")
        .is_some_and(|v| !v.is_empty())
    {
        return;
    }
    let key = (
        src.known.clone().unwrap_or_default().to_ascii_lowercase(),
        dst.known.clone().unwrap_or_default().to_ascii_lowercase(),
    );
    let Some(table) = cx.http.main.modules.charset.tables.get(&key).cloned() else {
        // The body keeps its bytes, so the header keeps the charset that
        // describes them.
        no_map(cx);
        return;
    };
    declare(resp, ct, base, &dst.name);
    if !matches!(*table, Recode::Bytes(_)) {
        resp.content_length = None;
        resp.remove_header("Content-Length");
        if cx.req.minor == 0 {
            resp.force_close = true;
        }
    }
    if matches!(resp.body, Body::Empty) {
        return;
    }
    resp.filters.push(Box::new(Recoder {
        table,
        held: Vec::new(),
    }));
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
    resp.content_type = Some(ct.into());
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

    fn recode(t: Recode, pieces: &[&[u8]]) -> Vec<u8> {
        let mut f = Recoder {
            table: Arc::new(t),
            held: Vec::new(),
        };
        let mut out = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            f.filter(p, i + 1 == pieces.len(), &mut out)
                .expect("filter");
        }
        out
    }

    #[test]
    fn recodes_to_and_from_utf8_across_pieces() {
        let mut to: Vec<Vec<u8>> = (0..256u32)
            .map(|i| {
                if i < 128 {
                    vec![i as u8]
                } else {
                    b"?".to_vec()
                }
            })
            .collect();
        to[0xc0] = vec![0xd1, 0x8e];
        assert_eq!(recode(Recode::ToUtf8(to), &[b"a\xc0\xc1"]), b"a\xd1\x8e?");
        let from: HashMap<u32, u8> = [(0x44e, 0xc0)].into_iter().collect();
        assert_eq!(
            recode(
                Recode::FromUtf8(from),
                &[b"a\xd1", b"\x8e\xd0\xb0\xff", b"\xd1"]
            ),
            b"a\xc0&#1072;?"
        );
        assert_eq!(utf8_decode(b"\xe2\x82"), Err(true));
        assert_eq!(utf8_decode(b"\xe2\x82\xac"), Ok((0x20ac, 3)));
    }
}
