//! Request-target handling the way nginx does it.
//!
//! * [`split_target`] splits the request-line target into host (absolute
//!   form only), path and query, dropping any `#fragment`.
//! * [`normalize_path`] turns the raw path into nginx's `$uri`: it
//!   percent-decodes, resolves `.`/`..` segments and optionally merges
//!   slashes, with exactly the quirks of nginx's complex-URI parser (which is
//!   what location matching and `$uri` see, so any difference would change
//!   routing).
//! * [`arg`] is `$arg_NAME`.
//! * [`escape_uri`] percent-encodes a path for a `Location` header.
//!
//! Everything here takes bytes straight from the peer, so none of it may
//! panic: indexing is either bounds-checked or guarded by the loop condition.

/// The request target is malformed; the caller answers 400.
#[derive(Debug, PartialEq, Eq)]
pub struct BadUri;

/// A split request target. All slices borrow from the raw target.
#[derive(Debug, PartialEq, Eq)]
pub struct Target<'a> {
    /// Host of an absolute-form target, including any `:port` (nginx keeps
    /// the port here too and strips it when validating the host).
    pub host: Option<&'a [u8]>,
    /// The raw (still percent-encoded) path; always starts with `/`.
    pub path: &'a [u8],
    /// The raw query after `?`, without the `?` and without any fragment.
    pub query: Option<&'a [u8]>,
}

/// Bytes nginx refuses anywhere in a request target: controls, space, DEL.
fn is_forbidden(b: u8) -> bool {
    b <= 0x20 || b == 0x7f
}

/// Split an origin-form (`/p?q`) or absolute-form (`scheme://host[:port]/p?q`,
/// any scheme, as nginx) target. Anything else -> BadUri.
/// Absolute-form with no path -> path `/`.
pub fn split_target(raw: &[u8]) -> Result<Target<'_>, BadUri> {
    if raw.iter().any(|&b| is_forbidden(b)) {
        return Err(BadUri);
    }
    match raw.first() {
        Some(b'/') => {
            let (path, query) = split_path_query(raw);
            Ok(Target {
                host: None,
                path,
                query,
            })
        }
        Some(_) => split_absolute(raw),
        None => Err(BadUri),
    }
}

/// Split `path[?query][#fragment]`. The first `?` starts the query and the
/// first `#` ends whatever part it occurs in, as in nginx.
fn split_path_query(s: &[u8]) -> (&[u8], Option<&[u8]>) {
    match memchr::memchr2(b'?', b'#', s) {
        None => (s, None),
        Some(i) if s[i] == b'#' => (&s[..i], None),
        Some(i) => {
            let rest = &s[i + 1..];
            let q = match memchr::memchr(b'#', rest) {
                Some(j) => &rest[..j],
                None => rest,
            };
            (&s[..i], Some(q))
        }
    }
}

fn split_absolute(raw: &[u8]) -> Result<Target<'_>, BadUri> {
    let colon = memchr::memchr(b':', raw).ok_or(BadUri)?;
    // Any scheme (nginx does not look at it): a letter, then letters,
    // digits, `+`, `-` and `.`.
    let scheme = &raw[..colon];
    let scheme_ok = scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return Err(BadUri);
    }
    let rest = raw[colon + 1..].strip_prefix(b"//").ok_or(BadUri)?;

    // Host: an IP literal in brackets, or the characters nginx allows in a
    // request-line host (letters, digits, '.', '-'; no '_').
    let mut i = 0;
    if rest.first() == Some(&b'[') {
        let close = memchr::memchr(b']', rest).ok_or(BadUri)?;
        let inner = &rest[1..close];
        let ok = inner.iter().all(|&c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    b':' | b'-'
                        | b'.'
                        | b'_'
                        | b'~'
                        | b'!'
                        | b'$'
                        | b'&'
                        | b'\''
                        | b'('
                        | b')'
                        | b'*'
                        | b'+'
                        | b','
                        | b';'
                        | b'='
                )
        });
        if !ok {
            return Err(BadUri);
        }
        i = close + 1;
    } else {
        while i < rest.len() && (rest[i].is_ascii_alphanumeric() || matches!(rest[i], b'.' | b'-'))
        {
            i += 1;
        }
    }
    let name_end = i;
    if rest.get(i) == Some(&b':') {
        i += 1;
        while i < rest.len() && rest[i].is_ascii_digit() {
            i += 1;
        }
    }
    // nginx accepts an empty host in the request line but then fails host
    // validation with 400; fail here directly.
    if name_end == 0 {
        return Err(BadUri);
    }
    let host = &rest[..i];
    let tail = &rest[i..];
    match tail.first() {
        None => Ok(Target {
            host: Some(host),
            path: b"/",
            query: None,
        }),
        Some(b'/') => {
            let (path, query) = split_path_query(tail);
            Ok(Target {
                host: Some(host),
                path,
                query,
            })
        }
        Some(b'?') => {
            // "http://h?a=b": nginx substitutes "/" for the empty path.
            let (_, query) = split_path_query(tail);
            Ok(Target {
                host: Some(host),
                path: b"/",
                query,
            })
        }
        Some(_) => Err(BadUri),
    }
}

/// States of the complex-URI machine (named after what was just written).
#[derive(Clone, Copy, PartialEq, Eq)]
enum St {
    Usual,
    Slash,
    Dot,
    DotDot,
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Drop the last path segment for a `..`: `out` ends with `/..`; cut back
/// to just after the slash that precedes the previous segment.
fn climb(out: &mut Vec<u8>) -> Result<(), BadUri> {
    // Skip the "/.." itself plus one byte, so the previous segment's own
    // trailing slash is not found; exactly nginx's `u -= 4` walk.
    let mut i = out.len().checked_sub(4).ok_or(BadUri)?;
    loop {
        if out[i] == b'/' {
            out.truncate(i + 1);
            return Ok(());
        }
        i = i.checked_sub(1).ok_or(BadUri)?;
    }
}

/// nginx's complex-URI handling: percent-decode (`%XX`; an invalid `%`
/// sequence -> BadUri; decoded bytes re-enter the state machine so `%2e%2e`
/// is `..` and `%2F` is `/`), resolve `.` and `..` segments (climbing above
/// `/` -> BadUri), merge consecutive slashes when `merge_slashes`. Returns
/// the decoded path (`$uri`).
///
/// nginx quirks kept on purpose:
/// * `%00` -> BadUri (nginx refuses a decoded NUL).
/// * `%25` (`%`), `%23` (`#`) and `%3F` (`?`) are stored literally and do
///   not re-enter the machine, so `/a/.%3F` keeps the `.`.
/// * A raw `?` or `#` ends the path (normally [`split_target`] already cut
///   there).
pub fn normalize_path(raw_path: &[u8], merge_slashes: bool) -> Result<Vec<u8>, BadUri> {
    if raw_path.first() != Some(&b'/') {
        return Err(BadUri);
    }
    let mut out = Vec::with_capacity(raw_path.len());
    let mut st = St::Usual;
    let mut i = 0;

    'outer: while i < raw_path.len() {
        let mut ch = raw_path[i];
        i += 1;

        if ch == b'%' {
            let hi = raw_path.get(i).copied().and_then(hex_val).ok_or(BadUri)?;
            let lo = raw_path
                .get(i + 1)
                .copied()
                .and_then(hex_val)
                .ok_or(BadUri)?;
            i += 2;
            ch = (hi << 4) | lo;
            match ch {
                0 => return Err(BadUri),
                b'%' | b'#' | b'?' => {
                    out.push(ch);
                    st = St::Usual;
                    continue;
                }
                _ => {} // re-enter below with the decoded byte
            }
        } else if ch == b'?' || ch == b'#' {
            // End of path. A pending "." or ".." segment is resolved as at
            // end of input.
            break 'outer;
        }

        match (st, ch) {
            (St::Usual, b'/') => {
                out.push(b'/');
                st = St::Slash;
            }
            (St::Usual, _) => out.push(ch),
            (St::Slash, b'/') => {
                if !merge_slashes {
                    out.push(b'/');
                }
            }
            (St::Slash, b'.') => {
                out.push(b'.');
                st = St::Dot;
            }
            (St::Dot, b'/') => {
                // "/./" -> "/": drop the dot, keep the slash already written.
                out.pop();
                st = St::Slash;
            }
            (St::Dot, b'.') => {
                out.push(b'.');
                st = St::DotDot;
            }
            (St::DotDot, b'/') => {
                climb(&mut out)?;
                st = St::Slash;
            }
            (_, _) => {
                out.push(ch);
                st = St::Usual;
            }
        }
    }

    match st {
        St::Dot => {
            out.pop();
        }
        St::DotDot => climb(&mut out)?,
        _ => {}
    }
    Ok(out)
}

/// Whether [`normalize_path`] would return `raw_path` unchanged: it starts
/// with `/` and has no `%`, `?` or `#`, no `.` or `..` segment and, when
/// `merge_slashes`, no `//`. This is the usual request, which can then keep
/// the path as sent.
pub fn is_normal(raw_path: &[u8], merge_slashes: bool) -> bool {
    if raw_path.first() != Some(&b'/') {
        return false;
    }
    // One pass (paths are short: memchr's setup would cost more). `seg`
    // is what the current segment holds so far: 0 none, 1 ".", 2 "..",
    // 3 anything else.
    let mut seg = 3;
    for &c in raw_path {
        seg = match (c, seg) {
            (b'%' | b'?' | b'#', _) => return false,
            (b'/', 0) if merge_slashes => return false,
            (b'/', 1 | 2) => return false,
            (b'/', _) => 0,
            (b'.', 0 | 1) => seg + 1,
            _ => 3,
        };
    }
    !matches!(seg, 1 | 2)
}

/// `$arg_NAME`: find `name` in an args string `a=1&b=2` and return its raw
/// (not decoded) value. As nginx's `ngx_http_arg`, the name matches
/// case-insensitively, must start the string or follow `&`, and must be
/// followed by `=` (a bare `name` or `name&` does not match). First match
/// wins.
pub fn arg<'a>(args: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    if name.is_empty() || args.len() <= name.len() {
        return None;
    }
    let mut start = 0;
    while start + name.len() < args.len() {
        let end = start + name.len();
        if args[start..end].eq_ignore_ascii_case(name) && args[end] == b'=' {
            let v = &args[end + 1..];
            let len = memchr::memchr(b'&', v).unwrap_or(v.len());
            return Some(&v[..len]);
        }
        // Next candidate: just after the next '&'.
        match memchr::memchr(b'&', &args[start..]) {
            Some(j) => start += j + 1,
            None => return None,
        }
    }
    None
}

/// Whether nginx's `NGX_ESCAPE_URI` escapes this byte: controls, space,
/// `"`, `#`, `%`, `<`, `>`, `?`, `\`, `^`, backquote, `{`, `|`, `}`, DEL
/// and every non-ASCII byte. Everything RFC 3986 allows stays literal.
fn needs_escape(b: u8) -> bool {
    !(0x21..0x7f).contains(&b)
        || matches!(
            b,
            b'"' | b'#' | b'%' | b'<' | b'>' | b'?' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}'
        )
}

/// Percent-encode a path for a Location header the way nginx escapes URIs
/// (`ngx_escape_uri` with `NGX_ESCAPE_URI`; upper-case hex).
pub fn escape_uri(path: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.reserve(path.len());
    for &b in path {
        if needs_escape(b) {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
        } else {
            out.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> Result<String, BadUri> {
        normalize_path(s.as_bytes(), true).map(|v| String::from_utf8(v).unwrap())
    }

    fn norm_nomerge(s: &str) -> Result<String, BadUri> {
        normalize_path(s.as_bytes(), false).map(|v| String::from_utf8(v).unwrap())
    }

    fn t(h: Option<&'static str>, p: &'static str, q: Option<&'static str>) -> Target<'static> {
        Target {
            host: h.map(str::as_bytes),
            path: p.as_bytes(),
            query: q.map(str::as_bytes),
        }
    }

    #[test]
    fn split_origin_form() {
        assert_eq!(split_target(b"/").unwrap(), t(None, "/", None));
        assert_eq!(split_target(b"/a/b").unwrap(), t(None, "/a/b", None));
        assert_eq!(split_target(b"/a?x=1").unwrap(), t(None, "/a", Some("x=1")));
        assert_eq!(split_target(b"/a?").unwrap(), t(None, "/a", Some("")));
        assert_eq!(split_target(b"/a?x?y").unwrap(), t(None, "/a", Some("x?y")));
        assert_eq!(split_target(b"/a#frag").unwrap(), t(None, "/a", None));
        assert_eq!(split_target(b"/a?q#f?g").unwrap(), t(None, "/a", Some("q")));
        assert_eq!(split_target(b"/a#f?g").unwrap(), t(None, "/a", None));
    }

    #[test]
    fn split_absolute_form() {
        assert_eq!(
            split_target(b"http://example.com/p?q").unwrap(),
            t(Some("example.com"), "/p", Some("q"))
        );
        assert_eq!(
            split_target(b"HTTPS://Example.COM:8443/p").unwrap(),
            t(Some("Example.COM:8443"), "/p", None)
        );
        assert_eq!(
            split_target(b"http://example.com").unwrap(),
            t(Some("example.com"), "/", None)
        );
        assert_eq!(
            split_target(b"http://example.com:80").unwrap(),
            t(Some("example.com:80"), "/", None)
        );
        assert_eq!(
            split_target(b"http://example.com?a=1").unwrap(),
            t(Some("example.com"), "/", Some("a=1"))
        );
        assert_eq!(
            split_target(b"http://[::1]:8080/x").unwrap(),
            t(Some("[::1]:8080"), "/x", None)
        );
        assert_eq!(
            split_target(b"http://1.2.3.4/").unwrap(),
            t(Some("1.2.3.4"), "/", None)
        );
    }

    #[test]
    fn split_errors() {
        for bad in [
            &b""[..],
            b"*",
            b"a/b",
            b"http:/h/",
            b"http:h/",
            b"http//h/",
            b"http://",
            b"http:///p",
            b"http://:80/p",
            b"http://h_x/",
            b"http://h#f",
            b"http://h:80x/",
            b"http://[::1/",
            b"http://[::1%]/",
            b"/a b",
            b"/a\tb",
            b"/a\x7f",
            b"/a\x00",
            b"/a?b\x01",
            b"1http://h/",
            b"ht_tp://h/",
        ] {
            assert_eq!(split_target(bad), Err(BadUri), "{:?}", bad);
        }
    }

    #[test]
    fn normalize_plain() {
        assert_eq!(norm("/").unwrap(), "/");
        assert_eq!(norm("/a/b/c").unwrap(), "/a/b/c");
        assert_eq!(norm("/a/b/").unwrap(), "/a/b/");
        assert_eq!(norm("/a.b/c.d").unwrap(), "/a.b/c.d");
        assert_eq!(norm("/a+b").unwrap(), "/a+b");
        assert_eq!(norm("/...").unwrap(), "/...");
        assert_eq!(norm("/.a/..b/a..").unwrap(), "/.a/..b/a..");
    }

    #[test]
    fn normalize_dots() {
        assert_eq!(norm("/.").unwrap(), "/");
        assert_eq!(norm("/./").unwrap(), "/");
        assert_eq!(norm("/a/./b").unwrap(), "/a/b");
        assert_eq!(norm("/a/.").unwrap(), "/a/");
        assert_eq!(norm("/a/..").unwrap(), "/");
        assert_eq!(norm("/a/../").unwrap(), "/");
        assert_eq!(norm("/a/b/../c").unwrap(), "/a/c");
        assert_eq!(norm("/a/b/../../c").unwrap(), "/c");
        assert_eq!(norm("/a/b/c/..").unwrap(), "/a/b/");
    }

    #[test]
    fn normalize_above_root() {
        for bad in [
            "/..",
            "/../",
            "/../a",
            "/a/../..",
            "/a/../../b",
            "/%2e%2e",
            "/%2E%2E/x",
            "/.%2e",
            "/%2e.",
            "/a/%2e%2e%2f%2e%2e",
            "/a%2f..%2f..",
        ] {
            assert_eq!(norm(bad), Err(BadUri), "{bad}");
            assert_eq!(norm_nomerge(bad), Err(BadUri), "{bad}");
        }
    }

    #[test]
    fn normalize_percent() {
        assert_eq!(norm("/a%20b").unwrap(), "/a b");
        assert_eq!(norm("/%41%42").unwrap(), "/AB");
        assert_eq!(norm("/a/%2e%2e/b").unwrap(), "/b");
        assert_eq!(norm("/a/%2E/b").unwrap(), "/a/b");
        assert_eq!(norm("/a%2Fb").unwrap(), "/a/b");
        assert_eq!(norm("/a%2f%2fb").unwrap(), "/a/b");
        assert_eq!(norm_nomerge("/a%2f%2fb").unwrap(), "/a//b");
        assert_eq!(norm("/a/b%2f..%2fc").unwrap(), "/a/c");
        // Literal-only decodes.
        assert_eq!(norm("/a%25").unwrap(), "/a%");
        assert_eq!(norm("/a%252e").unwrap(), "/a%2e");
        assert_eq!(norm("/a%23b").unwrap(), "/a#b");
        assert_eq!(norm("/a%3Fb").unwrap(), "/a?b");
        assert_eq!(norm("/a%3fb").unwrap(), "/a?b");
        assert_eq!(norm("/a/.%3F").unwrap(), "/a/.?");
        assert_eq!(norm("/a/..%23").unwrap(), "/a/..#");
        assert_eq!(norm("/%e4%bd%a0").unwrap().as_bytes(), "/你".as_bytes());
        assert_eq!(norm("/%0a").unwrap(), "/\n");
    }

    #[test]
    fn normalize_percent_errors() {
        for bad in [
            "/%", "/%2", "/%g0", "/%0g", "/a%", "/a%zz", "/%00", "/a%00b", "/%%41",
        ] {
            assert_eq!(norm(bad), Err(BadUri), "{bad}");
        }
    }

    #[test]
    fn normalize_slashes() {
        assert_eq!(norm("//").unwrap(), "/");
        assert_eq!(norm("//a///b//").unwrap(), "/a/b/");
        assert_eq!(norm_nomerge("//a///b//").unwrap(), "//a///b//");
        assert_eq!(norm_nomerge("/a//..").unwrap(), "/a/");
        assert_eq!(norm_nomerge("//..").unwrap(), "/");
        assert_eq!(norm("//..").unwrap_err(), BadUri);
        assert_eq!(norm_nomerge("/a//./b").unwrap(), "/a//b");
        assert_eq!(norm("/a//./b").unwrap(), "/a/b");
    }

    #[test]
    fn normalize_terminators_and_errors() {
        assert_eq!(norm("/a?b").unwrap(), "/a");
        assert_eq!(norm("/a/.?b").unwrap(), "/a/");
        assert_eq!(norm("/a/b/..#x").unwrap(), "/a/");
        assert_eq!(norm("/..?x"), Err(BadUri));
        assert_eq!(norm(""), Err(BadUri));
        assert_eq!(norm("a/b"), Err(BadUri));
        assert_eq!(norm("%2fa"), Err(BadUri));
    }

    #[test]
    fn normalize_never_panics() {
        // Exhaustive over short inputs from an alphabet of the interesting
        // bytes: every combination must return, and results start with '/'.
        let alpha = [b'/', b'.', b'%', b'2', b'e', b'f', b'a', b'?', b'#'];
        let mut buf = vec![b'/'];
        fn rec(buf: &mut Vec<u8>, alpha: &[u8], depth: usize) {
            for m in [true, false] {
                let r = normalize_path(buf, m);
                if let Ok(v) = &r {
                    assert_eq!(v.first(), Some(&b'/'), "{:?}", buf);
                }
                // is_normal is exactly "normalisation changes nothing".
                let same = r.as_deref() == Ok(buf.as_slice());
                assert_eq!(is_normal(buf, m), same, "{:?} merge={m}", buf);
            }
            if depth == 0 {
                return;
            }
            for &c in alpha {
                buf.push(c);
                rec(buf, alpha, depth - 1);
                buf.pop();
            }
        }
        rec(&mut buf, &alpha, 5);
    }

    #[test]
    fn arg_lookup() {
        let a = b"a=1&bb=2&c=&d&Ee=5&f=x=y";
        assert_eq!(arg(a, b"a"), Some(&b"1"[..]));
        assert_eq!(arg(a, b"bb"), Some(&b"2"[..]));
        assert_eq!(arg(a, b"b"), None);
        assert_eq!(arg(a, b"c"), Some(&b""[..]));
        assert_eq!(arg(a, b"d"), None);
        assert_eq!(arg(a, b"ee"), Some(&b"5"[..]));
        assert_eq!(arg(a, b"EE"), Some(&b"5"[..]));
        assert_eq!(arg(a, b"f"), Some(&b"x=y"[..]));
        assert_eq!(arg(a, b"zz"), None);
        assert_eq!(arg(a, b""), None);
        assert_eq!(arg(b"", b"a"), None);
        assert_eq!(arg(b"a", b"a"), None);
        assert_eq!(arg(b"a=", b"a"), Some(&b""[..]));
        assert_eq!(arg(b"xa=1&a=2", b"a"), Some(&b"2"[..]));
        assert_eq!(arg(b"a=1&a=2", b"a"), Some(&b"1"[..]));
        assert_eq!(arg(b"a%20b=1", b"a%20b"), Some(&b"1"[..]));
        assert_eq!(arg(b"&&a=%41", b"a"), Some(&b"%41"[..]));
        // The name is not decoded and '=' must follow immediately.
        assert_eq!(arg(b"a =1", b"a"), None);
    }

    #[test]
    fn escape() {
        let mut out = Vec::new();
        escape_uri(b"/a b/c%d?e#f\"<>\\^`{|}~!$&'()*+,;=:@[]-._", &mut out);
        assert_eq!(
            out,
            b"/a%20b/c%25d%3Fe%23f%22%3C%3E%5C%5E%60%7B%7C%7D~!$&'()*+,;=:@[]-._".to_vec()
        );
        out.clear();
        escape_uri("/你\x01\x7f".as_bytes(), &mut out);
        assert_eq!(out, b"/%E4%BD%A0%01%7F".to_vec());
        out.clear();
        escape_uri(b"", &mut out);
        assert!(out.is_empty());
    }
}
