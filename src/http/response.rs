//! A response on its way out, and the header filter that serialises it.
//!
//! Handlers fill a [`Response`], which knows no protocol: a status, the
//! fields ([`fixed_fields`] in nginx's order, then `headers`) and a
//! [`Body`]. The protocol that carries the request renders it
//! (`http::v1::head` writes the status line and HTTP/1's own fields) and
//! sends the body: bytes, a file range through the file-I/O layer, a
//! stream (a proxied body still arriving) piece by piece as it comes.

use std::sync::Arc;

use crate::http::conf::LocConf;
use crate::http::date;
use crate::http::status;
use crate::io::OpenFile;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The nginx version tern reports in `$nginx_version` (the release whose
/// behaviour it follows).
pub const NGINX_VERSION: &str = "1.22.1";

#[derive(Debug, Default)]
pub enum Body {
    #[default]
    Empty,
    Bytes(Vec<u8>),
    /// Bytes shared with a longer-lived owner (the compressed-file cache):
    /// each response holds a reference, so a hit copies nothing before
    /// the socket write (HTTP/2 and HTTP/3 hand the same buffer to their
    /// framing).
    Shared(bytes::Bytes),
    File {
        file: Arc<OpenFile>,
        offset: u64,
        len: u64,
    },
    /// Several pieces in order (multipart/byteranges).
    Multi(Vec<Piece>),
    /// A body still arriving (a proxied response): sent as it comes.
    Stream(Box<dyn BodyStream>),
}

/// The source of a [`Body::Stream`]. The connection pulls pieces until
/// `Ok(None)`; an error means the body is incomplete, and the connection
/// is closed without finishing it (no last chunk), as nginx does when an
/// upstream fails after the head was sent. Dropping the stream tells the
/// producer that the client is gone.
pub trait BodyStream: Send {
    /// The next piece of the body (never empty), or `None` at its end.
    fn next(&mut self) -> std::pin::Pin<Box<dyn StreamFuture<'_> + '_>>;
    /// Whether `next` would answer without waiting (so the head can wait
    /// for the first piece and leave in the same write).
    fn ready(&self) -> bool;
    /// The range filter's one range `[start, end)` of the entity: a source
    /// that can yield just that (it knows where its bytes are, as slice's
    /// does) takes it and says true; otherwise the filter cuts as the body
    /// passes.
    fn cut(&mut self, _start: u64, _end: u64) -> bool {
        false
    }
    /// Trailers may come with the body's end (gRPC's grpc-status): the
    /// writer keeps the stream open after the last piece until it knows.
    fn has_trailers(&self) -> bool {
        false
    }
    /// The trailers that came with the body's end, once `next` gave None
    /// (sent after `Response::trailers`).
    fn trailers(&mut self) -> Vec<(String, Vec<u8>)> {
        Vec::new()
    }
}

/// The error a [`BodyStream`] ends with when the client must get nothing
/// at all, head included: nginx had not sent its postponed output yet
/// (slice's checks of a later slice).
#[derive(Debug)]
pub struct Unsent;

impl std::fmt::Display for Unsent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("response abandoned before it was sent")
    }
}

impl std::error::Error for Unsent {}

/// Whether `e` is [`Unsent`].
pub fn is_unsent(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Unsent>())
}

/// The future of [`BodyStream::next`].
pub trait StreamFuture<'a>:
    std::future::Future<Output = std::io::Result<Option<bytes::Bytes>>> + Send + 'a
{
}

impl<'a, F> StreamFuture<'a> for F where
    F: std::future::Future<Output = std::io::Result<Option<bytes::Bytes>>> + Send + 'a
{
}

impl std::fmt::Debug for dyn BodyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BodyStream")
    }
}

/// One piece of a [`Body::Multi`].
#[derive(Debug)]
pub enum Piece {
    Bytes(Vec<u8>),
    File {
        file: Arc<OpenFile>,
        offset: u64,
        len: u64,
    },
}

/// A body filter (gzip, ...): transforms the body as it streams out, in
/// bounded memory. Installed by a header filter, which has already fixed
/// the headers (e.g. removed Content-Length).
pub trait BodyFilter: Send {
    /// Transforms one piece of the body; `last` is set on the final call
    /// (which may carry an empty `input`). Output is appended to `out`.
    fn filter(&mut self, input: &[u8], last: bool, out: &mut Vec<u8>) -> std::io::Result<()>;

    /// Each output byte is the input byte at the same position (a
    /// single-byte charset recoding): the range filter can still cut the
    /// body, before or after this filter alike.
    fn keeps_positions(&self) -> bool {
        false
    }
}

#[derive(Debug, Default)]
pub struct Response {
    pub status: u16,
    /// The status line after `HTTP/1.1 ` as a proxied server sent it
    /// (`302 Found`, `200`), for that status: nginx relays it verbatim.
    /// Once a filter changes `status` (304, 206, ...) the line is
    /// tern's own again.
    pub status_line: Option<(u16, Vec<u8>)>,
    /// Shared, not owned: a type from the configuration (the MIME map,
    /// `default_type`) goes out with a reference count, not a copy.
    pub content_type: Option<Arc<str>>,
    pub content_length: Option<u64>,
    pub last_modified: Option<i64>,
    /// A Location the server made absolute (written in the fixed part of
    /// the head, as nginx does); a Location given absolute by the
    /// configuration goes in `headers` instead.
    pub location: Option<Vec<u8>>,
    /// Other headers, in order, after the fixed ones.
    pub headers: Vec<(std::borrow::Cow<'static, str>, Vec<u8>)>,
    pub body: Body,
    /// `return 444`: close without answering.
    pub close_silently: bool,
    /// No further request may follow on this connection after this one
    /// (HTTP/1 closes it; a multiplexing protocol has nothing to do).
    pub force_close: bool,
    /// The client may still be sending (a body left unread): a protocol
    /// that closes the connection drains it first (HTTP/1's lingering
    /// close).
    pub linger: bool,
    /// A streamed body ends as soon as the client hangs up while waiting
    /// for it (proxied responses, unless `proxy_ignore_client_abort`).
    pub watch_client: bool,
    /// Body filters in order; a non-empty list means the body streams
    /// through them (no sendfile) and goes out chunked for HTTP/1.1.
    pub filters: Vec<Box<dyn BodyFilter>>,
    /// Trailers to send after a chunked body (`add_trailer`).
    pub trailers: Vec<(String, Vec<u8>)>,
    /// How many of `trailers` (the last ones) `add_trailer` rendered with
    /// the head; HTTP/1 renders them again once the body has gone, as
    /// nginx renders them (`$msec`, `$body_bytes_sent` then).
    pub own_trailers: usize,
    /// How file pieces of the body are read and sent (the location's `aio`).
    pub io: Option<crate::io::Policy>,
    /// The range filter leaves this response alone, `Accept-Ranges` and
    /// all: a proxied response neither from the cache nor under
    /// `proxy_force_ranges` (nginx's `allow_ranges` unset).
    pub ranges_off: bool,
    /// At most one range is served; several get the whole body (nginx's
    /// `single_range`: a response being cached, `proxy_force_ranges`).
    pub single_range: bool,
    /// A `; charset=` in `content_type` is the body's own charset (nginx's
    /// `headers_out.charset`: a proxied or cached response, autoindex's
    /// xml), not part of a configured type, so the charset filter leaves
    /// it as it is unless `override_charset on`.
    pub charset_param: bool,
    /// `X-Accel-Charset` of a proxied response: the charset the charset
    /// filter declares (nginx's `headers_out.override_charset`).
    pub override_charset: Option<String>,
    /// `headers` may hold upstream's own `Server` and `Date` (FastCGI
    /// relays them, as nginx does): the writer leaves out its own then.
    pub upstream_server_date: bool,
    /// tern's own `Server` / `Date` are left out: proxy_pass_header named
    /// them (nginx's proxy module then relays upstream's, or none at all
    /// when upstream sent none).
    pub no_own_server: bool,
    pub no_own_date: bool,
    /// `Last-Modified` is among `headers` as the proxied server sent it
    /// (nginx writes it there, in its place, rather than formatting
    /// `last_modified`, which still says the time for the filters).
    pub last_modified_listed: bool,
    /// Conditional request headers are not answered with 304/412 (nginx's
    /// `disable_not_modified`: a proxied response not being cached).
    pub disable_not_modified: bool,
    /// A proxied `101` to a request that asked for an upgrade: once the
    /// head is out, the connection relays bytes both ways
    /// ([`crate::http::tunnel`]) instead of sending a body.
    pub upgrade: Option<Box<crate::http::tunnel::Upgrade>>,
}

/// Whether two field names are equal, ignoring ASCII case. A name asked
/// for as tern writes it (`Accept-Ranges`) is found with one comparison;
/// the byte-by-byte case-folding one (~8 instructions a byte) is only
/// for names spelt otherwise.
#[inline]
pub fn name_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a == b || a.eq_ignore_ascii_case(b))
}

/// Passes one piece of a body through the filters in order; what the
/// last one gives is appended to `out`.
pub fn run_filters(
    filters: &mut [Box<dyn BodyFilter>],
    input: &[u8],
    last: bool,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut cur = input.to_vec();
    for f in filters.iter_mut() {
        let mut next = Vec::new();
        f.filter(&cur, last, &mut next)?;
        cur = next;
    }
    out.extend_from_slice(&cur);
    Ok(())
}

impl std::fmt::Debug for dyn BodyFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BodyFilter")
    }
}

thread_local! {
    /// The box of the worker thread's last finished response, with its
    /// header list's room, for the next one ([`boxed`]): a file response
    /// then allocates neither (two allocations per request otherwise).
    static SPARE: std::cell::Cell<Option<Box<Response>>> = const { std::cell::Cell::new(None) };
}

/// A default [`Response`] in a box: the one a finished response gave
/// back ([`recycle`]) if there is one.
pub fn boxed() -> Box<Response> {
    SPARE
        .try_with(|s| s.take())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Gives a finished response's box back for [`boxed`]; its contents are
/// dropped now, its header list kept empty unless it grew unusually large.
pub fn recycle(mut r: Box<Response>) {
    let mut headers = std::mem::take(&mut r.headers);
    *r = Response::default();
    if headers.capacity() <= 16 {
        headers.clear();
        r.headers = headers;
    }
    let _ = SPARE.try_with(|s| s.set(Some(r)));
}

impl Response {
    pub fn status(code: u16) -> Response {
        Response {
            status: code,
            ..Default::default()
        }
    }

    pub fn body_len(&self) -> u64 {
        match &self.body {
            Body::Empty => 0,
            Body::Bytes(b) => b.len() as u64,
            Body::Shared(b) => b.len() as u64,
            Body::File { len, .. } => *len,
            Body::Stream(_) => self.content_length.unwrap_or(0),
            Body::Multi(p) => p
                .iter()
                .map(|p| match p {
                    Piece::Bytes(b) => b.len() as u64,
                    Piece::File { len, .. } => *len,
                })
                .sum(),
        }
    }

    /// A header by name (case-insensitive) among the extra headers.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| name_eq(n, name))
            .map(|(_, v)| v.as_slice())
    }

    /// Removes a header from the extra headers.
    pub fn remove_header(&mut self, name: &str) {
        self.headers.retain(|(n, _)| !name_eq(n, name));
    }

    /// Whether the body's length is unknown when the head goes out (a
    /// stream, or filters that change it): HTTP/1.1 chunks such a body.
    pub fn length_unknown(&self) -> bool {
        self.content_length.is_none()
            && (!self.filters.is_empty() || matches!(self.body, Body::Stream(_)))
    }
}

/// Fills in nginx's built-in page for an error or redirect status without a body.
pub fn special_response(resp: &mut Response, loc: &LocConf) {
    if !matches!(resp.body, Body::Empty) || resp.status < 300 || resp.status == 304 {
        return;
    }
    if let Some(page) = builtin_page(resp.status, loc.core.server_tokens.unwrap_or(true)) {
        resp.content_type = Some(text_html());
        resp.content_length = Some(page.len() as u64);
        resp.body = Body::Shared(bytes::Bytes::from_static(page));
    } else {
        // A status without a built-in page (e.g. `return 418;`) goes out
        // with an explicit empty body, as nginx frames it.
        resp.content_length = Some(0);
    }
    // nginx stops keep-alive after these errors.
    if matches!(
        resp.status,
        400 | 413 | 414 | 494 | 495 | 496 | 497 | 500 | 501
    ) {
        resp.force_close = true;
    }
    if matches!(resp.status, 400 | 413 | 414 | 494) {
        resp.linger = true;
    }
}

/// nginx's built-in page for `code` (with `server_tokens` or not), made
/// once per process: an error answered on every request of a busy site
/// (a 404) shares it instead of writing and allocating its own.
fn builtin_page(code: u16, tokens: bool) -> Option<&'static [u8]> {
    type Pages = Vec<(u16, [Vec<u8>; 2])>;
    static PAGES: std::sync::OnceLock<Pages> = std::sync::OnceLock::new();
    let pages = PAGES.get_or_init(|| {
        (300..600)
            .filter_map(|c| {
                let (mut off, mut on) = (Vec::new(), Vec::new());
                let made = status::error_page(c, false, VERSION, &mut off)
                    && status::error_page(c, true, VERSION, &mut on);
                made.then_some((c, [off, on]))
            })
            .collect()
    });
    let i = pages.binary_search_by_key(&code, |(c, _)| *c).ok()?;
    Some(pages[i].1[usize::from(tokens)].as_slice())
}

/// `text/html`, the type of the built-in pages, shared (a reference
/// count, not an allocation per page).
fn text_html() -> Arc<str> {
    static T: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    T.get_or_init(|| "text/html".into()).clone()
}

/// [`special_response`] for a request: nginx's `msie_padding` then adds
/// six HTML comments to an error page (status 400 and up) sent to MSIE or
/// Chrome, so that their "friendly" error page does not replace it.
pub fn special_response_to(
    resp: &mut Response,
    loc: &LocConf,
    req: &crate::http::request::Request,
) {
    let was_empty = matches!(resp.body, Body::Empty);
    special_response(resp, loc);
    if !was_empty || resp.status < 400 || !loc.core.msie_padding.unwrap_or(true) {
        return;
    }
    let b = browser(req);
    if !(b.msie || b.chrome) {
        return;
    }
    // The built-in page is shared: the padded one is a copy.
    let mut page = match std::mem::take(&mut resp.body) {
        Body::Bytes(p) => p,
        Body::Shared(b) => b.to_vec(),
        other => {
            resp.body = other;
            return;
        }
    };
    if !page.is_empty() {
        for _ in 0..6 {
            page.extend_from_slice(MSIE_PADDING_LINE);
        }
        resp.content_length = Some(page.len() as u64);
    }
    resp.body = Body::Bytes(page);
}

const MSIE_PADDING_LINE: &[u8] =
    b"<!-- a padding to disable MSIE and Chrome friendly error page -->\r\n";

/// The browsers nginx recognises in the first `User-Agent` (the
/// flags of `ngx_http_process_user_agent` that tern uses).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Browser {
    /// "MSIE " with at least three more bytes after it, and no "Opera".
    pub msie: bool,
    /// "Chrome/", when neither MSIE, Opera nor "Gecko/" matched.
    pub chrome: bool,
    /// MSIE 4, 5, or 6 before SP2 (`keepalive_disable msie6`).
    pub msie6: bool,
    /// Safari on macOS (`keepalive_disable safari`).
    pub safari: bool,
}

pub fn browser(req: &crate::http::request::Request) -> Browser {
    let Some(ua) = req.header("user-agent") else {
        return Browser::default();
    };
    browser_of(ua)
}

pub fn browser_of(ua: &[u8]) -> Browser {
    let find = |n: &[u8]| memchr::memmem::find(ua, n);
    // nginx: `msie + 7 < end`, i.e. "MSIE X.Y" fits.
    let mut msie = find(b"MSIE ").is_some_and(|i| i + 7 < ua.len());
    let opera = find(b"Opera").is_some();
    if opera {
        msie = false;
    }
    let chrome = !msie && !opera && find(b"Gecko/").is_none() && find(b"Chrome/").is_some();
    // nginx: "MSIE 4.", "MSIE 5.", and "MSIE 6." without "SV1" after it.
    let msie6 = msie
        && find(b"MSIE ").is_some_and(|i| {
            ua.get(i + 6) == Some(&b'.')
                && match ua.get(i + 5) {
                    Some(b'4') | Some(b'5') => true,
                    Some(b'6') => {
                        memchr::memmem::find(ua.get(i + 8..).unwrap_or_default(), b"SV1").is_none()
                    }
                    _ => false,
                }
        });
    // nginx: "Safari/" and "Mac OS X", not Chrome.
    let safari = !msie
        && !opera
        && find(b"Gecko/").is_none()
        && find(b"Chrome/").is_none()
        && find(b"Safari/").is_some()
        && find(b"Mac OS X").is_some();
    Browser {
        msie,
        chrome,
        msie6,
        safari,
    }
}

/// nginx's `msie_refresh`: a 301 or 302 to MSIE becomes a 200 page whose
/// `<meta http-equiv="Refresh">` points at `target` (the Location as the
/// handler set it, before it is made absolute), with controls, space,
/// `"'<>\^`{|~` and bytes from 0x7f up %-escaped (nginx's
/// NGX_ESCAPE_REFRESH).
pub fn msie_refresh(resp: &mut Response, target: &[u8]) {
    let mut body = b"<html><head><meta http-equiv=\"Refresh\" content=\"0; URL=".to_vec();
    for &c in target {
        if c <= 0x20 || c >= 0x7f || b"\"'<>\\^`{|~".contains(&c) {
            body.extend_from_slice(format!("%{:02X}", c).as_bytes());
        } else {
            body.push(c);
        }
    }
    body.extend_from_slice(b"\"></head><body></body></html>\r\n");
    resp.status = 200;
    resp.content_type = Some("text/html".into());
    resp.location = None;
    resp.remove_header("Location");
    resp.remove_header("Accept-Ranges");
    resp.last_modified = None;
    resp.content_length = Some(body.len() as u64);
    resp.body = Body::Bytes(body);
}

/// The fields of the head every protocol sends, in nginx's order, before
/// the protocol's own (HTTP/1's Transfer-Encoding, Connection): Server,
/// Date, Content-Type, Content-Length, Last-Modified, Location. The
/// handlers' other fields (`headers`) follow those, in order.
pub fn fixed_fields(resp: &Response, loc: &LocConf, mut f: impl FnMut(&'static str, &[u8])) {
    let has = |n: &str| {
        resp.upstream_server_date && resp.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n))
    };
    if !has("server") && !resp.no_own_server {
        if loc.core.server_tokens.unwrap_or(true) {
            f("Server", SERVER_FULL.as_bytes());
        } else {
            f("Server", b"tern");
        }
    }
    if !has("date") && !resp.no_own_date {
        f("Date", &date::http_date());
    }
    if let Some(ct) = &resp.content_type {
        f("Content-Type", ct.as_bytes());
    }
    if let Some(n) = resp.content_length {
        let mut b = itoa::Buffer::new();
        f("Content-Length", b.format(n).as_bytes());
    }
    // nginx sends Last-Modified only with 200, 206 and 304.
    if let Some(t) = resp
        .last_modified
        .filter(|_| matches!(resp.status, 200 | 206 | 304) && !resp.last_modified_listed)
    {
        f("Last-Modified", &date::http_date_of(t));
    }
    if let Some(l) = &resp.location {
        f("Location", l);
    }
}

/// `Server:` with `server_tokens on`.
const SERVER_FULL: &str = concat!("tern/", env!("CARGO_PKG_VERSION"));

/// Fields that belong to an HTTP/1 connection and that HTTP/2 and HTTP/3
/// forbid in a field list.
fn connection_specific(name: &str) -> bool {
    // By length first: most names are none of these.
    match name.len() {
        7 => name.eq_ignore_ascii_case("upgrade"),
        10 => name.eq_ignore_ascii_case("connection") || name.eq_ignore_ascii_case("keep-alive"),
        16 => name.eq_ignore_ascii_case("proxy-connection"),
        17 => name.eq_ignore_ascii_case("transfer-encoding"),
        _ => false,
    }
}

/// The field name as the `http` crate holds it: the names tern itself
/// writes map to its constants (no parsing), others are parsed.
fn field_name(n: &str) -> Option<::http::HeaderName> {
    use ::http::header as h;
    Some(match n {
        "Server" => h::SERVER,
        "Date" => h::DATE,
        "Content-Type" => h::CONTENT_TYPE,
        "Content-Length" => h::CONTENT_LENGTH,
        "Last-Modified" => h::LAST_MODIFIED,
        "Location" => h::LOCATION,
        "ETag" => h::ETAG,
        "Accept-Ranges" => h::ACCEPT_RANGES,
        "Content-Range" => h::CONTENT_RANGE,
        "Content-Encoding" => h::CONTENT_ENCODING,
        "Cache-Control" => h::CACHE_CONTROL,
        "Expires" => h::EXPIRES,
        "Vary" => h::VARY,
        _ => return ::http::HeaderName::from_bytes(n.as_bytes()).ok(),
    })
}

/// The response head for a protocol that sends fields as a list (HTTP/2,
/// HTTP/3): the status as it may go there (494-497 as 400, an interim
/// status, which cannot end such a request, as 502), the fields without
/// the connection-specific ones, and the same head as HTTP/1 lines under
/// `version` (e.g. `HTTP/2.0`), which `$sent_http_*` and the byte counts
/// read.
pub fn field_list_head(
    resp: &Response,
    loc: &LocConf,
    version: &[u8],
) -> (::http::Response<()>, Vec<u8>) {
    let code = match resp.status {
        494..=497 => 400,
        c if c < 200 => 502,
        c => c,
    };
    let mut head = ::http::Response::new(());
    *head.status_mut() =
        ::http::StatusCode::from_u16(code).unwrap_or(::http::StatusCode::BAD_GATEWAY);
    let mut text = Vec::with_capacity(256);
    text.extend_from_slice(version);
    text.push(b' ');
    push_num(&mut text, code as u64);
    text.extend_from_slice(b"\r\n");
    // The HTTP/1 lines are written first; the field list's values are
    // then slices of one shared copy of them (one allocation for all the
    // values rather than one each).
    let mut fields: Vec<(::http::HeaderName, usize, usize)> =
        Vec::with_capacity(resp.headers.len() + 6);
    {
        let mut add = |n: &str, v: &[u8]| {
            if connection_specific(n) {
                return;
            }
            text.extend_from_slice(n.as_bytes());
            text.extend_from_slice(b": ");
            let at = text.len();
            text.extend_from_slice(v);
            if let Some(name) = field_name(n) {
                fields.push((name, at, text.len()));
            }
            text.extend_from_slice(b"\r\n");
        };
        fixed_fields(resp, loc, &mut add);
        for (n, v) in &resp.headers {
            add(n, v);
        }
    }
    text.extend_from_slice(b"\r\n");
    let shared = bytes::Bytes::copy_from_slice(&text);
    let hm = head.headers_mut();
    hm.reserve(fields.len());
    for (name, a, b) in fields {
        if let Ok(v) = ::http::HeaderValue::from_maybe_shared(shared.slice(a..b)) {
            hm.append(name, v);
        }
    }
    (head, text)
}

pub fn push_num(out: &mut Vec<u8>, n: u64) {
    let mut b = itoa::Buffer::new();
    out.extend_from_slice(b.format(n).as_bytes());
}
