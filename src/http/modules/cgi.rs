//! What the CGI-style protocols (FastCGI, SCGI, uwsgi) share: the
//! request's parameters (`PREFIX_param` entries in order, then the
//! client's headers as `HTTP_*` unless a param of that name is set), and
//! the response's CGI header block (`Status:`, `Location:`), which SCGI
//! and uwsgi may also open with an HTTP status line ([`CgiHead`], read
//! until the connection closes, as nginx reads them).

use crate::config::registry::arg;
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::phases::Ctx;
use crate::http::upstream::fetch::{invalid_header, Fail, WHILE_HEAD};
use crate::http::upstream::{BodyDecoder, Caching, Head, HeadReader};
use crate::http::vars::Template;

/// A `PREFIX_param NAME VALUE [if_not_empty]`.
#[derive(Debug, Clone)]
pub struct Param {
    pub name: Vec<u8>,
    pub value: Template,
    pub if_not_empty: bool,
}

/// Parses a `PREFIX_param` directive.
pub fn param(d: &Directive, cx: &mut Compiler) -> ConfResult<Param> {
    let if_not_empty = match d.args.get(2).map(|a| a.value.as_str()) {
        None => false,
        Some("if_not_empty") => true,
        Some(v) => return Err(ConfError::at(format!("invalid parameter \"{}\"", v), d)),
    };
    let value = cx.template(arg(d, 1), d)?;
    Ok(Param {
        name: arg(d, 0).as_bytes().to_vec(),
        value,
        if_not_empty,
    })
}

/// The params nginx adds when the response may be cached (its
/// `*_cache_headers`, unless a `PREFIX_param` sets the name): the
/// revalidation's validators, the other conditionals and `Range` cleared.
const CACHE_PARAMS: &[&str] = &[
    "HTTP_IF_MODIFIED_SINCE",
    "HTTP_IF_UNMODIFIED_SINCE",
    "HTTP_IF_NONE_MATCH",
    "HTTP_IF_MATCH",
    "HTTP_RANGE",
    "HTTP_IF_RANGE",
];

/// The request's parameters, in nginx's order, each given to `emit`:
/// the params, the cache's own (when `caching`), the client's headers.
pub fn params(
    cx: &Ctx<'_>,
    list: &[Param],
    pass_headers: bool,
    caching: Option<Caching<'_>>,
    mut emit: impl FnMut(&[u8], &[u8]),
) {
    for p in list {
        let v = p.value.render_vec(cx);
        if p.if_not_empty && v.is_empty() {
            continue;
        }
        emit(&p.name, &v);
    }
    let own = |n: &str| list.iter().any(|p| p.name == n.as_bytes());
    let mut cleared: Vec<&[u8]> = Vec::new();
    if let Some(c) = caching {
        for name in CACHE_PARAMS.iter().filter(|n| !own(n)) {
            cleared.push(&name.as_bytes()[5..]);
            // Only the validators have a value, and only while revalidating
            // (empty ones are skipped, as nginx's defaults).
            let v = match (*name, c.revalidate) {
                ("HTTP_IF_MODIFIED_SINCE", Some((Some(lm), _))) => lm.as_slice(),
                ("HTTP_IF_NONE_MATCH", Some((_, Some(etag)))) => etag.as_slice(),
                _ => continue,
            };
            emit(name.as_bytes(), v);
        }
    }
    if !pass_headers {
        return;
    }
    // A header whose HTTP_ name a param sets is left out (nginx's check
    // is by name, whatever the param's value).
    let set: Vec<&[u8]> = list
        .iter()
        .filter_map(|p| p.name.strip_prefix(b"HTTP_"))
        .chain(cleared)
        .collect();
    let mut full = Vec::new();
    for h in cx.req.headers() {
        full.clear();
        full.extend_from_slice(b"HTTP_");
        full.extend(h.name.iter().map(|c| match c {
            b'-' => b'_',
            c => c.to_ascii_uppercase(),
        }));
        if set.iter().any(|s| s.eq_ignore_ascii_case(&full[5..])) {
            continue;
        }
        emit(&full, h.value);
    }
}

type Headers = Vec<(String, Vec<u8>)>;

/// Where the header block ends: (end of the lines, start of the body).
pub(crate) fn head_end(b: &[u8]) -> Option<(usize, usize)> {
    // An empty first line: no headers at all.
    if b.starts_with(b"\r\n") {
        return Some((0, 2));
    }
    if b.starts_with(b"\n") {
        return Some((0, 1));
    }
    let mut i = 0;
    while let Some(p) = b[i..].iter().position(|&c| c == b'\n') {
        let nl = i + p;
        let rest = &b[nl + 1..];
        if rest.starts_with(b"\r\n") {
            return Some((nl + 1, nl + 3));
        }
        if rest.starts_with(b"\n") {
            return Some((nl + 1, nl + 2));
        }
        i = nl + 1;
    }
    None
}

/// The CGI header lines: the status (see [`status_of`]) and the headers
/// (`Status` among them; it is hidden when relayed). Values lose the
/// spaces around them, not tabs, as nginx's header parser.
pub(crate) fn parse_head(b: &[u8]) -> Result<(u16, Headers), String> {
    let mut headers = Vec::new();
    for line in b.split(|&c| c == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let Some(colon) = line.iter().position(|&c| c == b':') else {
            return Err("upstream sent invalid header".into());
        };
        let name = &line[..colon];
        if name.is_empty()
            || !name
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_'))
        {
            return Err("upstream sent invalid header".into());
        }
        let value = trim_spaces(&line[colon + 1..]);
        let name = String::from_utf8_lossy(name).into_owned();
        headers.push((name, value.to_vec()));
    }
    let (status, _) = status_of(&headers)?;
    Ok((status, headers))
}

fn trim_spaces(mut v: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' '] = v {
        v = rest;
    }
    v
}

/// The status a script's header lines give, and the status line nginx
/// sends for it (after `HTTP/1.1 `): the first `Status:` value verbatim
/// (`404 Not Here`, `200`, `404Not`; its first three bytes must be
/// digits, any of them, `000` and `999` too; later `Status:` lines are
/// not looked at), else `302 Moved Temporarily` with a `Location:`, else
/// `200 OK`.
pub(crate) fn status_of(headers: &Headers) -> Result<(u16, &[u8]), String> {
    let first = |n: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(n));
    if let Some((_, value)) = first("status") {
        let code = value
            .get(..3)
            .filter(|d| d.iter().all(u8::is_ascii_digit))
            .map(|d| d.iter().fold(0u16, |a, c| a * 10 + u16::from(c - b'0')));
        return match code {
            Some(c) => Ok((c, value.as_slice())),
            None => Err(format!(
                "upstream sent invalid status \"{}\"",
                String::from_utf8_lossy(value)
            )),
        };
    }
    Ok(if first("location").is_some() {
        (302, &b"302 Moved Temporarily"[..])
    } else {
        (200, &b"200 OK"[..])
    })
}

/// Reads an SCGI or uwsgi response head: an HTTP status line and
/// headers, or CGI header lines (nginx falls back to them when the first
/// line is no status line); the body runs to the connection's close.
pub struct CgiHead {
    buf: Vec<u8>,
    head_only: bool,
    head_max: usize,
}

impl CgiHead {
    pub fn new(head_only: bool, head_max: usize) -> CgiHead {
        CgiHead {
            buf: Vec::new(),
            head_only,
            head_max,
        }
    }

    fn head(&self, status: u16, status_line: Vec<u8>, headers: Headers, end: usize) -> Head {
        let declared_len = crate::http::modules::proxy::head::content_length(&headers);
        let none = status == 204 || status == 304;
        Head {
            status,
            status_line,
            headers,
            early: self.buf[end..].to_vec(),
            body: Vec::new(),
            declared_len,
            no_body: none || self.head_only,
            keep: false,
            // An answer to HEAD is read (when it is, for the cache) to the
            // close whatever its Content-Length, as nginx does; the cache
            // then keeps it only if the two agree.
            decoder: Box::new(ToClose {
                none,
                left: declared_len.filter(|_| !self.head_only),
                extra: false,
            }),
        }
    }
}

impl HeadReader for CgiHead {
    fn feed(&mut self, data: &[u8]) -> Result<Option<Head>, Fail> {
        use crate::http::modules::proxy::head::{parse, Parse};
        self.buf.extend_from_slice(data);
        let window = &self.buf[..self.buf.len().min(self.head_max)];
        let too_big = || {
            Err(invalid_header(&format!(
                "upstream sent too big header {}",
                WHILE_HEAD
            )))
        };
        if window.len() < 5 && b"HTTP/".starts_with(window) {
            return Ok(None);
        }
        if window.starts_with(b"HTTP/") {
            match parse(window) {
                Parse::Partial if self.buf.len() >= self.head_max => return too_big(),
                Parse::Partial => return Ok(None),
                Parse::Done(h) => {
                    let (code, line, headers, end) = (h.code, h.line, h.headers, h.end);
                    return Ok(Some(self.head(code, line, headers, end)));
                }
                Parse::Invalid(msg) => return Err(invalid_header(&msg)),
                Parse::NotHttp => {}
            }
        }
        match head_end(window) {
            Some((end, body_at)) => {
                let (status, headers) = parse_head(&window[..end])
                    .map_err(|m| invalid_header(&format!("{} {}", m, WHILE_HEAD)))?;
                let line = status_of(&headers)
                    .map(|(_, l)| l.to_vec())
                    .unwrap_or_default();
                Ok(Some(self.head(status, line, headers, body_at)))
            }
            None if self.buf.len() >= self.head_max => too_big(),
            None => Ok(None),
        }
    }
}

/// A body of the declared Content-Length (nginx then takes the close
/// before its end as premature), else one that ends with the connection;
/// none at all for 204, 304.
struct ToClose {
    none: bool,
    /// Bytes still expected with a Content-Length.
    left: Option<u64>,
    extra: bool,
}

impl BodyDecoder for ToClose {
    fn feed(&mut self, buf: &[u8], out: &mut Vec<u8>) -> Result<(), Fail> {
        if self.none {
            self.extra |= !buf.is_empty();
        } else if let Some(l) = self.left.as_mut() {
            let take = (*l).min(buf.len() as u64) as usize;
            self.extra |= take < buf.len();
            *l -= take as u64;
            out.extend_from_slice(&buf[..take]);
        } else {
            out.extend_from_slice(buf);
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.none || self.left == Some(0)
    }

    fn extra(&self) -> bool {
        self.extra
    }

    fn by_close(&self) -> bool {
        !self.none && self.left.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgi_heads() {
        let (s, h) = parse_head(b"Status: 404 Not Found\r\nX: y\r\n").unwrap();
        assert_eq!(s, 404);
        assert_eq!(h.len(), 2);
        let line = |b: &[u8]| {
            let (_, h) = parse_head(b).unwrap();
            let (c, l) = status_of(&h).unwrap();
            (c, String::from_utf8(l.to_vec()).unwrap())
        };
        assert_eq!(
            line(b"Status:  404  Not Here \n"),
            (404, "404  Not Here".into())
        );
        assert_eq!(line(b"Status: 200\n"), (200, "200".into()));
        assert_eq!(line(b"Status: 000\n"), (0, "000".into()));
        assert_eq!(line(b"Status: 4041 x\n"), (404, "4041 x".into()));
        assert_eq!(line(b"Status: 200 \t\n"), (200, "200 \t".into()));
        assert_eq!(line(b"status: 201 A\nStatus: abc\n"), (201, "201 A".into()));
        assert_eq!(
            line(b"Location: /x\n"),
            (302, "302 Moved Temporarily".into())
        );
        assert_eq!(
            line(b"Location: /x\nStatus: 201 M\n"),
            (201, "201 M".into())
        );
        assert_eq!(line(b"X: y\n"), (200, "200 OK".into()));
        assert!(parse_head(b"Status: 42\n").is_err());
        assert!(parse_head(b"Status:\t200\n").is_err());
        assert!(parse_head(b"Status:\n").is_err());
        assert_eq!(parse_head(b"Location: /x\n").unwrap().0, 302);
        assert_eq!(parse_head(b"Content-Type: text/html\n").unwrap().0, 200);
        assert!(parse_head(b"Status: abc\n").is_err());
        assert!(parse_head(b"no colon\n").is_err());
        assert_eq!(head_end(b"A: b\r\n\r\nxy"), Some((6, 8)));
        assert_eq!(head_end(b"A: b\n\nxy"), Some((5, 6)));
        assert_eq!(head_end(b"\r\nxy"), Some((0, 2)));
        assert_eq!(head_end(b"A: b\r\n"), None);
    }
}
