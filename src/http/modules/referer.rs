//! `valid_referers` and `$invalid_referer` (nginx's referer module).
//!
//! The configuration is compiled into [`Valid`]: `none`, `blocked`,
//! `server_names`, and entries (exact host, `*.host`/`.host` leading
//! wildcards, `host.*` trailing wildcards, each with an optional URI
//! prefix, and `~regex`es). `$invalid_referer` is computed when used, as
//! nginx computes it: no `Referer` is valid only with `none`; one that does
//! not start with `http://` or `https://` (case-insensitive) only with
//! `blocked`; otherwise its host (up to `/` or `:`, lowercased, at most 256
//! bytes) is looked up exactly, then among leading, then trailing
//! wildcards (the entry's URI prefix, if any, must then start the path),
//! then the server's regex names (on the host) and the regex entries (on
//! all that follows the scheme, case-insensitively). The value is `""`
//! when valid and `"1"` when not, and `""` where no `valid_referers` applies.

use std::sync::Arc;

use crate::config::registry::{ctx, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::regex::Regex;
use crate::http::conf::{LocConf, ServerName};
use crate::http::phases::Ctx;

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "valid_referers",
    ctx: ctx::SRV | ctx::LOC,
    args: Args::AtLeast(1),
    set: Setter::Loc(set_valid_referers),
}];

pub const VARS: &[&str] = &["invalid_referer"];

#[derive(Debug)]
struct Entry {
    /// Never a regex: `~` entries go to `Valid::regexes`.
    host: ServerName,
    /// The URI prefix the path must start with (`example.org/pics/`).
    uri: Option<String>,
}

#[derive(Debug, Default)]
pub struct Valid {
    none: bool,
    blocked: bool,
    server_names: bool,
    entries: Vec<Entry>,
    regexes: Vec<Regex>,
}

#[derive(Debug, Clone, Default)]
pub struct RefererLoc {
    pub valid: Option<Arc<Valid>>,
}

impl RefererLoc {
    pub fn merge(&mut self, p: &RefererLoc) {
        if self.valid.is_none() {
            self.valid = p.valid.clone();
        }
    }
}

fn set_valid_referers(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    // Several lines at one level add up, as nginx's do.
    let mut v = match l.modules.referer.valid.take() {
        Some(old) => Arc::try_unwrap(old).unwrap_or_default(),
        None => Valid::default(),
    };
    for a in &d.args {
        let s = a.value.as_str();
        match s {
            "none" => v.none = true,
            "blocked" => v.blocked = true,
            "server_names" => v.server_names = true,
            _ if s.starts_with('~') => {
                // nginx compiles these caseless.
                let re = Regex::compile(d, &s[1..], true)?;
                v.regexes.push(re);
            }
            _ => {
                let (host, uri) = match s.find('/') {
                    Some(i) => (&s[..i], Some(s[i..].to_string())),
                    None => (s, None),
                };
                let host = host.to_ascii_lowercase();
                let host = if let Some(rest) = host.strip_prefix("*.") {
                    ServerName::Leading {
                        suffix: format!(".{}", rest),
                        also_bare: false,
                    }
                } else if host.starts_with('.') && host.len() > 1 {
                    ServerName::Leading {
                        suffix: host,
                        also_bare: true,
                    }
                } else if let Some(rest) = host.strip_suffix(".*") {
                    ServerName::Trailing(format!("{}.", rest))
                } else if host.contains('*') {
                    return Err(ConfError::at(format!("invalid referer \"{}\"", s), d));
                } else {
                    ServerName::Exact(host)
                };
                v.entries.push(Entry { host, uri });
            }
        }
    }
    l.modules.referer.valid = Some(Arc::new(v));
    Ok(())
}

/// Where a host is found among `entries` (exact, then the longest
/// leading, then the longest trailing wildcard): `None` if nowhere, else
/// the entry's URI prefix (`Some(None)`: none to check).
fn lookup<'e>(entries: &'e [Entry], host: &str) -> Option<Option<&'e str>> {
    let wildcard_len = |e: &Entry| match &e.host {
        ServerName::Leading { suffix, .. } => suffix.len(),
        ServerName::Trailing(prefix) => prefix.len(),
        _ => 0,
    };
    let best = |kind: fn(&ServerName) -> bool| {
        // The first of equals wins (max_by_key keeps the last).
        entries
            .iter()
            .rev()
            .filter(|e| kind(&e.host) && e.host.matches(host))
            .max_by_key(|e| wildcard_len(e))
    };
    best(|n| matches!(n, ServerName::Exact(_)))
        .or_else(|| best(|n| matches!(n, ServerName::Leading { .. })))
        .or_else(|| best(|n| matches!(n, ServerName::Trailing(_))))
        .map(|e| e.uri.as_deref())
}

fn invalid(cx: &Ctx<'_>, v: &Valid) -> bool {
    let Some(value) = cx.req.header("referer") else {
        return !v.none;
    };
    let rest = if value.len() >= "http://i.ru".len() {
        if value[..7].eq_ignore_ascii_case(b"http://") {
            Some(&value[7..])
        } else if value[..8].eq_ignore_ascii_case(b"https://") {
            Some(&value[8..])
        } else {
            None
        }
    } else {
        None
    };
    let Some(rest) = rest else {
        return !v.blocked;
    };
    let end = rest
        .iter()
        .position(|&b| b == b'/' || b == b':')
        .unwrap_or(rest.len());
    // nginx copies the host into a 256-byte buffer; a longer one is invalid.
    if end > 256 {
        return true;
    }
    let host = String::from_utf8_lossy(&rest[..end]).to_ascii_lowercase();
    if let Some(uri) = lookup(&v.entries, &host) {
        let Some(uri) = uri else { return false };
        // The path starts at the first '/' after the host (and port).
        let path = rest[end..]
            .iter()
            .position(|&b| b == b'/')
            .map_or(&b""[..], |i| &rest[end + i..]);
        return !path.starts_with(uri.as_bytes());
    }
    if v.server_names && cx.server.srv.names.iter().any(|n| n.matches(&host)) {
        return false;
    }
    !v.regexes.iter().any(|re| re.is_match(rest))
}

pub fn var(cx: &Ctx<'_>, _id: u8, out: &mut Vec<u8>) -> bool {
    if let Some(v) = &cx.loc.modules.referer.valid {
        if invalid(cx, v) {
            out.push(b'1');
        }
    }
    true
}
