//! `sub_filter`, `sub_filter_once`, `sub_filter_types`,
//! `sub_filter_last_modified`: replace strings in response bodies.
//!
//! Data flow: the header filter (after `add_header`, before `charset` and
//! `gzip`, as in nginx's filter order) evaluates the location's search
//! strings and replacements for this request, drops what the new body
//! invalidates (Content-Length, Accept-Ranges, Last-Modified unless kept;
//! the ETag is made weak) and pushes a [`Substitute`] body filter. The body
//! filter scans each piece as it streams: at every position the first
//! search string (in configuration order) that matches, case-insensitively
//! for ASCII, is replaced; with `sub_filter_once` (the default) each string
//! is replaced at its first occurrence only. The longest tail of a piece
//! that could still begin a match is held back until the next piece.

use std::sync::Arc;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::{Body, BodyFilter, Response};
use crate::http::vars::Template;

const HSL: u32 = ctx::HSL;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "sub_filter",
        ctx: HSL,
        args: Args::take(2),
        set: Setter::Loc(set_sub_filter),
    },
    Spec {
        name: "sub_filter_once",
        ctx: HSL,
        args: Args::Flag,
        set: Setter::Loc(set_once_flag),
    },
    Spec {
        name: "sub_filter_last_modified",
        ctx: HSL,
        args: Args::Flag,
        set: Setter::Loc(set_last_modified),
    },
    Spec {
        name: "sub_filter_types",
        ctx: HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_types),
    },
];

#[derive(Debug, Clone, Default)]
pub struct SubFilterLoc {
    /// (search, replacement) pairs; a level with any replaces its parent's.
    pub pairs: Option<Arc<Vec<(Template, Template)>>>,
    pub once: Option<bool>,
    pub last_modified: Option<bool>,
    /// `None` inside: `*` (any type); else lowercase types, text/html in.
    pub types: Option<Option<Arc<Vec<String>>>>,
}

impl SubFilterLoc {
    pub fn merge(&mut self, p: &SubFilterLoc) {
        if self.pairs.is_none() {
            self.pairs = p.pairs.clone();
        }
        if self.once.is_none() {
            self.once = p.once;
        }
        if self.last_modified.is_none() {
            self.last_modified = p.last_modified;
        }
        if self.types.is_none() {
            self.types = p.types.clone();
        }
    }

    fn type_matches(&self, content_type: Option<&str>) -> bool {
        let t = content_type
            .and_then(|ct| ct.split(';').next())
            .unwrap_or("")
            .trim();
        match &self.types {
            Some(None) => true,
            Some(Some(list)) => list.iter().any(|x| x.eq_ignore_ascii_case(t)),
            None => t.eq_ignore_ascii_case("text/html"),
        }
    }
}

/// The pairs being collected at one level (several `sub_filter` lines add up).
fn set_sub_filter(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if arg(d, 0).is_empty() {
        return Err(ConfError::at("empty search pattern", d));
    }
    let search = cx.template(arg(d, 0), d)?;
    let replace = cx.template(arg(d, 1), d)?;
    let mut pairs = l
        .modules
        .sub_filter
        .pairs
        .take()
        .map(|p| (*p).clone())
        .unwrap_or_default();
    pairs.push((search, replace));
    l.modules.sub_filter.pairs = Some(Arc::new(pairs));
    Ok(())
}

fn set_once_flag(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.sub_filter.once, flag(d)?, d)
}

fn set_last_modified(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.sub_filter.last_modified, flag(d)?, d)
}

fn set_types(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let s = &mut l.modules.sub_filter;
    if matches!(s.types, Some(None)) {
        return Ok(());
    }
    let mut list = match s.types.take() {
        Some(Some(v)) => (*v).clone(),
        _ => vec!["text/html".to_string()],
    };
    for a in &d.args {
        if a.value == "*" {
            s.types = Some(None);
            return Ok(());
        }
        list.push(a.value.to_ascii_lowercase());
    }
    s.types = Some(Some(Arc::new(list)));
    Ok(())
}

/// Header filter: sets up the substitution for this response.
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    let conf = &cx.loc.modules.sub_filter;
    let Some(pairs) = conf.pairs.clone() else {
        return;
    };
    if resp.content_length == Some(0) || !conf.type_matches(resp.content_type.as_deref()) {
        return;
    }
    let once = conf.once.unwrap_or(true);
    let keep_last_modified = conf.last_modified.unwrap_or(false);
    let mut strings = Vec::with_capacity(pairs.len());
    for (search, replace) in pairs.iter() {
        let s = search.render_vec(&*cx).to_ascii_lowercase();
        if s.is_empty() {
            continue;
        }
        strings.push((s, replace.render_vec(&*cx)));
    }
    if strings.is_empty() {
        return;
    }
    // The length changes. A file's Accept-Ranges goes (nginx's range
    // filter only announces ranges for a known length); one relayed from
    // upstream stays, as in nginx.
    if matches!(resp.body, Body::File { .. }) {
        resp.remove_header("Accept-Ranges");
    }
    resp.content_length = None;
    resp.remove_header("Content-Length");
    if cx.req.minor == 0 {
        resp.force_close = true;
    }
    // Without sub_filter_last_modified the validators go; with it the
    // ETag is weak.
    if keep_last_modified {
        super::gzip::weaken_etag(resp);
    } else {
        resp.last_modified = None;
        resp.remove_header("Last-Modified");
        resp.remove_header("ETag");
    }
    if cx.req.method == Method::Head || matches!(resp.body, Body::Empty) {
        return;
    }
    resp.filters.push(Box::new(Substitute::new(strings, once)));
}

/// The body filter: see the module doc.
pub struct Substitute {
    /// (lowercase search string, replacement, still active).
    strings: Vec<(Vec<u8>, Vec<u8>, bool)>,
    once: bool,
    /// Bytes that may begin a match, waiting for the next piece.
    held: Vec<u8>,
    /// Which bytes (lowercased) begin an active search string.
    first: [bool; 256],
}

impl Substitute {
    fn new(strings: Vec<(Vec<u8>, Vec<u8>)>, once: bool) -> Substitute {
        let mut s = Substitute {
            strings: strings.into_iter().map(|(a, b)| (a, b, true)).collect(),
            once,
            held: Vec::new(),
            first: [false; 256],
        };
        s.index_first_bytes();
        s
    }

    fn index_first_bytes(&mut self) {
        self.first = [false; 256];
        for (s, _, active) in &self.strings {
            if let (true, Some(&b)) = (*active, s.first()) {
                self.first[usize::from(b)] = true;
            }
        }
    }

    /// At `data[i..]`: a full match (index of the string), or whether an
    /// active string could still match once more bytes arrive.
    fn match_at(&self, data: &[u8], i: usize) -> (Option<usize>, bool) {
        let rest = &data[i..];
        let mut partial = false;
        for (k, (s, _, active)) in self.strings.iter().enumerate() {
            if !*active {
                continue;
            }
            let n = s.len().min(rest.len());
            if !rest[..n]
                .iter()
                .zip(s)
                .all(|(a, b)| a.to_ascii_lowercase() == *b)
            {
                continue;
            }
            if n == s.len() {
                return (Some(k), partial);
            }
            partial = true;
        }
        (None, partial)
    }
}

impl BodyFilter for Substitute {
    fn filter(&mut self, input: &[u8], last: bool, out: &mut Vec<u8>) -> std::io::Result<()> {
        let mut data = std::mem::take(&mut self.held);
        data.extend_from_slice(input);
        let mut i = 0;
        let mut copied = 0;
        while i < data.len() {
            if !self.strings.iter().any(|s| s.2) {
                break;
            }
            // Skip to the next byte that can begin a match.
            match data[i..]
                .iter()
                .position(|b| self.first[usize::from(b.to_ascii_lowercase())])
            {
                Some(off) => i += off,
                None => break,
            }
            match self.match_at(&data, i) {
                (Some(k), _) => {
                    out.extend_from_slice(&data[copied..i]);
                    let (s, r, active) = &mut self.strings[k];
                    out.extend_from_slice(r);
                    i += s.len();
                    copied = i;
                    if self.once {
                        *active = false;
                        self.index_first_bytes();
                    }
                }
                (None, true) if !last => {
                    // Could be the start of a match cut by the piece's end.
                    out.extend_from_slice(&data[copied..i]);
                    self.held = data[i..].to_vec();
                    return Ok(());
                }
                (None, _) => i += 1,
            }
        }
        out.extend_from_slice(&data[copied..]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(strings: &[(&str, &str)], once: bool, pieces: &[&str]) -> String {
        let mut f = Substitute::new(
            strings
                .iter()
                .map(|(a, b)| (a.to_ascii_lowercase().into_bytes(), b.as_bytes().to_vec()))
                .collect(),
            once,
        );
        let mut out = Vec::new();
        for (n, p) in pieces.iter().enumerate() {
            f.filter(p.as_bytes(), n + 1 == pieces.len(), &mut out)
                .expect("filter");
        }
        String::from_utf8(out).expect("utf8")
    }

    #[test]
    fn replaces_across_piece_boundaries_case_insensitively() {
        let got = run(
            &[("Hello", "bye")],
            false,
            &["say hEl", "lo, HELLO", " hel", ""],
        );
        assert_eq!(got, "say bye, bye hel");
    }

    #[test]
    fn once_replaces_each_string_at_its_first_occurrence() {
        let got = run(&[("a", "1"), ("b", "2")], true, &["ab ab", " ab"]);
        assert_eq!(got, "12 ab ab");
    }

    #[test]
    fn first_string_in_order_wins_at_a_position() {
        let got = run(&[("abc", "X"), ("ab", "Y")], false, &["abcab"]);
        assert_eq!(got, "XY");
    }
}
