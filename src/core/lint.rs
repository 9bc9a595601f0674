//! Warnings for configurations that nginx accepts but that are known to be
//! exploitable (the classic list of nginx config analyzers).
//!
//! [`check`] walks the parsed tree (before compilation, so it sees every
//! block as written, includes expanded) with the chain of enclosing blocks,
//! and returns one line per finding in nginx's warning form, `MESSAGE in
//! FILE:LINE`. They are printed by `-t` and logged at start and reload as
//! `[warn]`; they never change the exit status. `-q` and `config_lint
//! off;` (main context, tern's own directive) silence them.
//!
//! What is checked, each with the reason it is dangerous:
//! - `alias` ending in `/` inside a prefix location without a trailing `/`
//!   (`/static../` reaches the alias's parent directory);
//! - `add_header` in a nested block, which drops every header the
//!   enclosing levels set (nginx inherits `add_header` only into blocks
//!   that have none);
//! - `$http_host` in `proxy_set_header Host`, redirects and `Location`
//!   (the client's Host header, unchecked, unlike `$host`);
//! - a `*_pass` whose host part comes from the request (SSRF), directly
//!   or through a variable `set` from the request;
//! - `$uri`, `$document_uri` or a capture of a negated character class in
//!   a header or a redirect (decoded `%0d%0a` splits the response);
//! - `valid_referers none`, and unanchored or dot-unescaped regexes in
//!   `valid_referers`, in `if` checks of `$http_origin` /
//!   `$http_referer` and in the keys of a `map` of either
//!   (`example.com.evil.net` passes);
//! - a line break in an `add_header` value (a folded header line, which
//!   clients reject or read as two headers);
//! - `server_tokens` turned back on below a level that turned it off, or
//!   an upstream's `Server` / `X-Powered-By` passed on where tokens are
//!   off.

use crate::config::registry::{ctx, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::{Compiler, MainConf};

/// `config_lint on|off`: accepted here; [`check`] reads it from the tree.
pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "config_lint",
    ctx: ctx::MAIN,
    args: Args::Flag,
    set: Setter::Main(set_config_lint),
}];

fn set_config_lint(_: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    crate::config::registry::flag(d).map(drop)
}

/// Variables whose value the client chooses.
fn from_request(var: &str) -> bool {
    const PREFIXES: &[&str] = &["http_", "arg_", "cookie_"];
    const NAMES: &[&str] = &[
        "host",
        "uri",
        "document_uri",
        "request_uri",
        "args",
        "query_string",
        "request_body",
        "request",
        "remote_user",
    ];
    NAMES.contains(&var)
        || PREFIXES.iter().any(|p| var.starts_with(p))
        || var.chars().all(|c| c.is_ascii_digit())
}

/// The names of the variables a value refers to (`$name`, `${name}`).
fn vars_in(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'$' {
            i += 1;
            continue;
        }
        i += 1;
        let braced = b.get(i) == Some(&b'{');
        if braced {
            i += 1;
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i > start {
            out.push(&s[start..i]);
        }
    }
    out
}

/// One enclosing block as the walk sees it.
struct Level<'a> {
    d: Option<&'a Directive>,
    /// Header names `add_header` sets here, and the line of the first.
    headers: Vec<String>,
    /// `server_tokens` here.
    tokens: Option<bool>,
}

struct Walk<'a> {
    out: Vec<String>,
    stack: Vec<Level<'a>>,
    /// Variables that a `set` anywhere gives a value from the request:
    /// nginx's variables are global by name, so one set in a server is
    /// what a `proxy_pass` of any of its locations reads.
    tainted: Vec<String>,
}

/// The variables `set` from the request, over the whole tree; a variable
/// set from one that is becomes one too (in file order).
fn tainted_vars(dirs: &[Directive], out: &mut Vec<String>) {
    for d in dirs {
        if d.name == "set" {
            let name = arg(d, 0).trim_start_matches('$');
            let value = arg(d, 1);
            let from_req = vars_in(value)
                .into_iter()
                .any(|v| from_request(v) || out.iter().any(|t| t == v));
            if from_req && !name.is_empty() && !out.iter().any(|t| t == name) {
                out.push(name.to_string());
            }
        }
        if let Some(b) = &d.block {
            if !data_block(d) {
                tainted_vars(b, out);
            }
        }
    }
}

/// Blocks whose entries are data (map keys, MIME types...), not
/// directives: not walked as directives.
fn data_block(d: &Directive) -> bool {
    matches!(
        d.name.as_str(),
        "map" | "geo" | "split_clients" | "types" | "charset_map"
    )
}

fn place(d: &Directive) -> String {
    format!("in {}:{}", d.file.display(), d.line)
}

fn arg(d: &Directive, i: usize) -> &str {
    d.args.get(i).map(|a| a.value.as_str()).unwrap_or("")
}

/// A location's modifier and URI.
fn location_of(d: &Directive) -> (&str, &str) {
    match d.args.len() {
        1 => ("", arg(d, 0)),
        _ => (arg(d, 0), arg(d, 1)),
    }
}

/// The capture groups of `re` that may match a newline (a negated class,
/// or `.` under the `s` flag), by number.
fn newline_captures(re: &str) -> Vec<usize> {
    let b = re.as_bytes();
    let dotall = re.starts_with("(?s") || re.contains("(?s)");
    let mut groups: Vec<(usize, bool)> = Vec::new(); // open groups: (number, risky)
    let mut risky = Vec::new();
    let mut n = 0;
    let mut i = 0;
    let mut in_class = false;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'[' if !in_class => {
                in_class = true;
                if b.get(i + 1) == Some(&b'^') {
                    for g in groups.iter_mut() {
                        g.1 = true;
                    }
                }
            }
            b']' if in_class => in_class = false,
            b'.' if !in_class && dotall => {
                for g in groups.iter_mut() {
                    g.1 = true;
                }
            }
            b'(' if !in_class => {
                let capturing = b.get(i + 1) != Some(&b'?')
                    || (b.get(i + 2) == Some(&b'<') && !matches!(b.get(i + 3), Some(b'=' | b'!')))
                    || b.get(i + 2) == Some(&b'P');
                if capturing {
                    n += 1;
                    groups.push((n, false));
                } else {
                    groups.push((0, false));
                }
            }
            b')' if !in_class => {
                if let Some((num, r)) = groups.pop() {
                    if num > 0 && r {
                        risky.push(num);
                    }
                    if r {
                        if let Some(outer) = groups.last_mut() {
                            outer.1 = true;
                        }
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    risky
}

/// Whether a regex meant to match a host or origin lets other hosts
/// through: no `^`/`$` anchor, or a `.` that is not escaped.
fn loose_host_regex(re: &str) -> Option<&'static str> {
    let body = re.trim_start_matches("(?i)");
    if !body.starts_with('^') && !body.starts_with("https?://") {
        return Some("is not anchored at the start");
    }
    if !body.ends_with('$') && !body.ends_with(")$") {
        return Some("is not anchored at the end");
    }
    let b = body.as_bytes();
    let mut in_class = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'[' => in_class = true,
            b']' => in_class = false,
            // `.*` / `.+` as a wildcard part is a choice, not a slip.
            b'.' if !in_class && !matches!(b.get(i + 1), Some(b'*' | b'+')) => {
                return Some("has an unescaped \".\"");
            }
            _ => {}
        }
        i += 1;
    }
    None
}

impl<'a> Walk<'a> {
    fn warn(&mut self, msg: String, d: &Directive) {
        self.out.push(format!("{} {}", msg, place(d)));
    }

    /// Captures that the enclosing regex locations make risky.
    fn risky_captures(&self) -> Vec<usize> {
        let mut v = Vec::new();
        for l in &self.stack {
            if let Some(d) = l.d {
                if d.name == "location" {
                    let (m, uri) = location_of(d);
                    if m == "~" || m == "~*" {
                        v = newline_captures(uri);
                    }
                }
            }
        }
        v
    }

    fn splitting(&mut self, value: &str, d: &Directive) {
        let risky = self.risky_captures();
        for v in vars_in(value) {
            let bad = v == "uri"
                || v == "document_uri"
                || v.parse::<usize>().is_ok_and(|n| risky.contains(&n));
            if bad {
                self.warn(
                    format!(
                        "possible HTTP response splitting: \"${v}\" in \"{}\" holds decoded bytes, \
                         and a \"%0d%0a\" in the request becomes a new header line; use $request_uri \
                         or a capture that cannot match a newline",
                        d.name
                    ),
                    d,
                );
                return;
            }
        }
    }

    fn http_host(&mut self, value: &str, d: &Directive) {
        if vars_in(value).contains(&"http_host") {
            self.warn(
                format!(
                    "\"$http_host\" in \"{}\" is the client's Host header unchecked; \"$host\" \
                     is validated and falls back to the server name",
                    d.name
                ),
                d,
            );
        }
    }

    fn pass(&mut self, d: &Directive) {
        let target = arg(d, 0);
        let rest = target.split_once("://").map(|(_, r)| r).unwrap_or(target);
        let host = rest.split('/').next().unwrap_or("");
        let direct = vars_in(host).into_iter().find(|v| from_request(v));
        let set = vars_in(host)
            .into_iter()
            .find(|v| self.tainted.iter().any(|t| t == v));
        if let Some(v) = direct {
            self.warn(
                format!(
                    "possible SSRF: the address of \"{}\" comes from the request (\"${v}\"), so a \
                     client chooses which server tern connects to",
                    d.name
                ),
                d,
            );
        } else if let Some(v) = set {
            self.warn(
                format!(
                    "possible SSRF: the address of \"{}\" comes from the request (\"${v}\" is \
                     \"set\" from it), so a client chooses which server tern connects to",
                    d.name
                ),
                d,
            );
        }
    }

    fn redirect_target(d: &Directive) -> Option<&str> {
        match d.name.as_str() {
            "return" => {
                let first = arg(d, 0);
                // `return URL;` is a 302 to it (nginx takes an argument
                // starting with a scheme or `$scheme` as the URL).
                if d.args.len() == 1 {
                    let url = first.starts_with("http://")
                        || first.starts_with("https://")
                        || first.starts_with("$scheme");
                    return url.then_some(first);
                }
                let code: u16 = first.parse().ok()?;
                // A 30x's text is its Location; another code's is the
                // body, which no header line comes from.
                (d.args.len() == 2 && matches!(code, 301 | 302 | 303 | 307 | 308))
                    .then(|| arg(d, 1))
            }
            "rewrite" => {
                let r = arg(d, 1);
                let flag = arg(d, 2);
                (r.starts_with("http://")
                    || r.starts_with("https://")
                    || r.starts_with("$scheme")
                    || flag == "redirect"
                    || flag == "permanent")
                    .then_some(r)
            }
            _ => None,
        }
    }

    fn directive(&mut self, d: &'a Directive) {
        match d.name.as_str() {
            "alias" => self.alias(d),
            "add_header" => {
                let value = arg(d, 1).to_string();
                if value.contains(['\n', '\r']) {
                    self.warn(
                        format!(
                            "the value of \"add_header {}\" has a line break: it goes out as a \
                             folded header line, which clients reject or read as a header of \
                             its own",
                            arg(d, 0)
                        ),
                        d,
                    );
                }
                if arg(d, 0).eq_ignore_ascii_case("location") {
                    self.http_host(&value, d);
                }
                self.splitting(&value, d);
                if let Some(l) = self.stack.last_mut() {
                    l.headers.push(arg(d, 0).to_ascii_lowercase());
                }
                if self.stack.last().map(|l| l.headers.len()) == Some(1) {
                    self.dropped_headers(d);
                }
            }
            "proxy_set_header" => {
                let value = arg(d, 1);
                if arg(d, 0).eq_ignore_ascii_case("host") {
                    self.http_host(value, d);
                }
                self.splitting(value, d);
            }
            "return" | "rewrite" => {
                if let Some(t) = Self::redirect_target(d) {
                    self.http_host(t, d);
                    self.splitting(t, d);
                }
            }
            "proxy_pass" | "fastcgi_pass" | "uwsgi_pass" | "scgi_pass" | "grpc_pass"
            | "memcached_pass" => self.pass(d),
            "valid_referers" => self.referers(d),
            "if" => self.origin_check(d),
            "map" => self.origin_map(d),
            "server_tokens" => {
                let on = arg(d, 0) != "off";
                let hidden_above = self
                    .stack
                    .iter()
                    .rev()
                    .skip(1)
                    .find_map(|l| l.tokens)
                    .is_some_and(|t| !t);
                if on && hidden_above {
                    self.warn(
                        "\"server_tokens\" is turned on again here, below a level that turned it \
                         off: the version shows in this block's answers"
                            .into(),
                        d,
                    );
                }
                if let Some(l) = self.stack.last_mut() {
                    l.tokens = Some(on);
                }
            }
            "proxy_pass_header"
            | "fastcgi_pass_header"
            | "uwsgi_pass_header"
            | "scgi_pass_header" => {
                let h = arg(d, 0);
                let hidden = self.stack.iter().rev().find_map(|l| l.tokens) == Some(false);
                if hidden
                    && (h.eq_ignore_ascii_case("server") || h.eq_ignore_ascii_case("x-powered-by"))
                {
                    self.warn(
                        format!(
                            "\"{}\" passes the upstream's \"{h}\" header on, which shows what \
                             \"server_tokens off\" hides",
                            d.name
                        ),
                        d,
                    );
                }
            }
            _ => {}
        }
        if let Some(block) = d.block.as_ref().filter(|_| !data_block(d)) {
            self.stack.push(Level {
                d: Some(d),
                headers: Vec::new(),
                tokens: None,
            });
            for c in block {
                self.directive(c);
            }
            self.stack.pop();
        }
    }

    fn alias(&mut self, d: &Directive) {
        let Some(loc) = self.stack.last().and_then(|l| l.d) else {
            return;
        };
        if loc.name != "location" {
            return;
        }
        let (m, uri) = location_of(loc);
        let prefix = m.is_empty() || m == "^~";
        let path = arg(d, 0);
        if prefix && !uri.ends_with('/') && path.ends_with('/') {
            self.warn(
                format!(
                    "possible path traversal: \"alias {path}\" in location \"{uri}\" without a \
                     trailing slash serves \"{uri}../\" from the parent of \"{path}\"; end both \
                     with \"/\" or neither"
                ),
                d,
            );
        }
    }

    /// The first `add_header` of a nested block: the headers of the
    /// nearest enclosing level that has any are no longer sent here.
    fn dropped_headers(&mut self, d: &Directive) {
        let n = self.stack.len();
        if n < 2 {
            return;
        }
        // The whole block's own headers, so that one repeated here does
        // not count as dropped.
        let own: Vec<String> = self.stack[n - 1]
            .d
            .and_then(|b| b.block.as_ref())
            .map(|b| {
                b.iter()
                    .filter(|c| c.name == "add_header")
                    .map(|c| arg(c, 0).to_ascii_lowercase())
                    .collect()
            })
            .unwrap_or_default();
        let parent = self.stack[..n - 1]
            .iter()
            .rev()
            .find_map(|l| level_headers(l).filter(|h| !h.is_empty()));
        let Some(parent) = parent else { return };
        let dropped: Vec<String> = parent.into_iter().filter(|h| !own.contains(h)).collect();
        if !dropped.is_empty() {
            self.warn(
                format!(
                    "\"add_header\" here replaces every \"add_header\" of the enclosing level, so \
                     {} no longer sent in this block; repeat them here",
                    if dropped.len() == 1 {
                        format!("\"{}\" is", dropped[0])
                    } else {
                        format!("\"{}\" are", dropped.join("\", \""))
                    }
                ),
                d,
            );
        }
    }

    fn referers(&mut self, d: &Directive) {
        for a in &d.args {
            let v = a.value.as_str();
            if v == "none" {
                self.warn(
                    "\"valid_referers none\" lets every request without a Referer through, which \
                     any client can send"
                        .into(),
                    d,
                );
            } else if let Some(re) = v.strip_prefix('~') {
                // nginx matches these against the referer without its
                // scheme, from the host on.
                if let Some(why) = loose_host_regex(re) {
                    self.warn(
                        format!(
                            "the \"valid_referers\" regex \"{re}\" {why}, so other hosts match"
                        ),
                        d,
                    );
                }
            }
        }
    }

    /// A `map` of `$http_origin` or `$http_referer` is the usual way to
    /// allow a list of CORS origins: its regex keys are checked as an
    /// `if` would be.
    fn origin_map(&mut self, d: &Directive) {
        let src = arg(d, 0);
        if src != "$http_origin" && src != "$http_referer" {
            return;
        }
        let Some(block) = &d.block else { return };
        for entry in block {
            let key = entry.name.as_str();
            let Some(re) = key.strip_prefix("~*").or_else(|| key.strip_prefix('~')) else {
                continue;
            };
            if let Some(why) = loose_host_regex(re) {
                self.warn(
                    format!(
                        "the \"map\" regex \"{re}\" for \"{src}\" {why}, so an attacker's \
                         host (\"example.com.evil.net\") matches"
                    ),
                    entry,
                );
            }
        }
    }

    fn origin_check(&mut self, d: &Directive) {
        let a0 = arg(d, 0).trim_start_matches('(');
        if a0 != "$http_origin" && a0 != "$http_referer" {
            return;
        }
        let op = arg(d, 1);
        if op != "~" && op != "~*" {
            return;
        }
        let re = d
            .args
            .get(2)
            .map(|a| a.value.trim_end_matches(')'))
            .unwrap_or("");
        if let Some(why) = loose_host_regex(re) {
            self.warn(
                format!(
                    "the regex \"{re}\" checking \"{a0}\" {why}, so an attacker's host \
                     (\"example.com.evil.net\") matches"
                ),
                d,
            );
        }
    }
}

fn level_headers(l: &Level<'_>) -> Option<Vec<String>> {
    let b = l.d.and_then(|d| d.block.as_ref());
    match b {
        Some(b) => Some(
            b.iter()
                .filter(|c| c.name == "add_header")
                .map(|c| arg(c, 0).to_ascii_lowercase())
                .collect(),
        ),
        None => Some(l.headers.clone()),
    }
}

/// The findings for a parsed configuration, in file order; empty when
/// `config_lint off;` is set at the main level.
pub fn check(top: &[Directive]) -> Vec<String> {
    let off = top
        .iter()
        .any(|d| d.name == "config_lint" && arg(d, 0).eq_ignore_ascii_case("off"));
    if off {
        return Vec::new();
    }
    let mut tainted = Vec::new();
    tainted_vars(top, &mut tainted);
    let mut w = Walk {
        out: Vec::new(),
        stack: vec![Level {
            d: None,
            headers: Vec::new(),
            tokens: None,
        }],
        tainted,
    };
    for d in top {
        w.directive(d);
    }
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lint(text: &str) -> Vec<String> {
        let mut tree = crate::config::Tree::default();
        let dirs = crate::config::parse::parse_str(
            text,
            std::sync::Arc::new("t.conf".into()),
            std::path::Path::new("/nonexistent"),
            &mut tree,
        )
        .unwrap();
        check(&dirs)
    }

    #[test]
    fn captures_that_may_hold_a_newline() {
        assert_eq!(newline_captures(r"^/x/([^/]+)/(\d+)$"), vec![1]);
        assert_eq!(newline_captures(r"^/(.*)$"), Vec::<usize>::new());
        assert_eq!(newline_captures(r"(?s)^/(.*)$"), vec![1]);
        assert_eq!(newline_captures(r"^/(?:a|[^b])(c)"), Vec::<usize>::new());
    }

    #[test]
    fn host_regexes() {
        assert!(loose_host_regex(r"^https?://(www\.)?example\.com$").is_none());
        assert!(loose_host_regex(r"example\.com").is_some());
        assert!(loose_host_regex(r"^https://example.com$").is_some());
        assert!(loose_host_regex(r"^https://example\.com").is_some());
    }

    #[test]
    fn each_rule_fires_once_with_its_line() {
        let w = lint(
            "http {\n\
             add_header X-Frame-Options DENY;\n\
             server {\n\
             server_tokens off;\n\
             location /static { alias /srv/static/; }\n\
             location /a { add_header X-A 1; }\n\
             location / { proxy_pass http://$host; proxy_set_header Host $http_host; }\n\
             location ~ ^/u/([^/]+)$ { add_header X-U $1; return 302 https://$http_host$uri; }\n\
             location /r { valid_referers none ~example.com; proxy_pass_header Server; }\n\
             location /o { if ($http_origin ~* example\\.com) { add_header X-O 1; } }\n\
             location /t { server_tokens on; }\n\
             }\n}\n",
        );
        let lines: Vec<&str> = w.iter().map(|s| s.rsplit(':').next().unwrap()).collect();
        assert_eq!(
            lines,
            ["5", "6", "7", "7", "8", "8", "8", "8", "9", "9", "9", "10", "10", "11"],
            "{w:#?}"
        );
    }

    /// The rules added in session 15: `return URL;`, an origin `map`, a
    /// `set` variable in a `*_pass`, a folded `add_header` value; and the
    /// cases they must leave alone.
    #[test]
    fn redirect_url_origin_map_set_ssrf_and_folded_header() {
        let w = lint(
            "http {\n\
             map $http_origin $cors {\n\
             default \"\";\n\
             ~^https://(www\\.)?example\\.com$ $http_origin;\n\
             ~*example.com $http_origin;\n\
             }\n\
             map $uri $safe { default 1; ~example.com 2; }\n\
             server {\n\
             set $target $arg_to;\n\
             set $again $target;\n\
             set $fixed backend;\n\
             location /a { return https://$http_host$uri; }\n\
             location /b { proxy_pass http://$again; }\n\
             location /c { proxy_pass http://$fixed; return 200 \"$uri\"; }\n\
             location /d { add_header X-Two \"a\n b\"; }\n\
             }\n}\n",
        );
        let lines: Vec<&str> = w.iter().map(|s| s.rsplit(':').next().unwrap()).collect();
        // Line 5: the unanchored key; 12: $http_host and $uri in the
        // URL of `return`; 13: $again, set from $target, set from $arg_to;
        // 16: the folded value (a directive's line is where it ends, as
        // in nginx's messages).
        assert_eq!(lines, ["5", "12", "12", "13", "16"], "{w:#?}");
        assert!(w[0].contains("\"map\" regex \"example.com\" for \"$http_origin\""));
        assert!(w[3].contains("(\"$again\" is \"set\" from it)"), "{}", w[3]);
        assert!(
            w[4].contains("add_header X-Two\" has a line break"),
            "{}",
            w[4]
        );
    }

    #[test]
    fn quiet_for_safe_and_off() {
        assert!(lint(
            "http { add_header X 1; server { location /static/ { alias /srv/static/; } \
             location / { add_header X 1; proxy_pass http://backend; proxy_set_header Host $host; } } }"
        )
        .is_empty());
        assert!(lint("config_lint off; http { server { location /s { alias /x/; } } }").is_empty());
    }

    /// The shipped sample, the embedded default and every seed
    /// configuration warn about nothing.
    #[test]
    fn quiet_on_the_project_configs_and_the_seeds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = vec![root.join("conf/nginx.conf")];
        if let Ok(d) = std::fs::read_dir(root.join("../shared/seed-configs")) {
            files.extend(
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                    .filter(|p| !p.to_string_lossy().contains("broken")),
            );
        }
        for f in &files {
            // Includes (mime.types) resolve in the project's conf/.
            let text = std::fs::read_to_string(f).unwrap();
            let mut tree = crate::config::Tree::default();
            let dirs = crate::config::parse::parse_str(
                &text,
                std::sync::Arc::new(f.clone()),
                &root.join("conf"),
                &mut tree,
            )
            .unwrap();
            assert_eq!(check(&dirs), Vec::<String>::new(), "{}", f.display());
        }
        let embedded = crate::core::conf::embedded_text(root);
        assert!(lint(&embedded).is_empty());
    }
}
