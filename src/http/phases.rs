//! The request phases, in nginx's order. This file is the one place that
//! fixes the order of phases and of header filters:
//!
//! 1. server rewrite (`rewrite`/`return`/`set`/`if` at server level)
//! 2. find location (loops back after an internal redirect, max 10)
//! 3. location rewrite
//! 4. access: [`ACCESS`] in order (limit_conn, limit_req), then
//!    [`modules::access::phase`] (allow/deny, auth_basic, `satisfy`)
//! 5. content: [`crate::http::modules::content`] (stub_status, metrics,
//!    try_files, index, static...)
//! 6. addition ([`crate::http::modules::addition`]: subrequests around
//!    the body), then header filters: [`HEADER_FILTERS`] in order, which may install body
//!    filters; then the header writer and body writer in
//!    [`crate::http::v1::conn`]
//! 7. log: [`crate::http::modules::log_phase`]

use std::borrow::Cow;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::core::log::Level;
use crate::core::worker::WorkerShared;
use crate::http::conf::{HttpConf, LocConf, Server};
use crate::http::modules::{self, rewrite};
use crate::http::request::{Method, Request};
use crate::http::response::{self, Response};
use crate::http::serve::ConnInfo;
use crate::http::vars::{Var, VarCtx};

/// A request in progress: the parts of its state that phases change.
pub struct Ctx<'a> {
    /// The configuration this request runs on, from start to log.
    pub http: &'a Arc<HttpConf>,
    pub req: &'a Request,
    pub server: &'a Arc<Server>,
    pub conn: &'a ConnInfo,
    pub shared: &'a Arc<WorkerShared>,
    /// 0 for the client's request; a subrequest is one more than its
    /// parent (see [`crate::http::subrequest`]).
    pub sub_depth: u8,
    /// The upstream's response header lines (`$upstream_http_NAME`), kept
    /// only when the configuration mentions such a variable.
    pub upstream_headers: Option<Vec<(String, Vec<u8>)>>,
    /// The current URI (changes on internal redirects and rewrites);
    /// the request's until then.
    pub uri: Cow<'a, [u8]>,
    /// The current args (rewrites may change them).
    pub args: Option<Cow<'a, [u8]>>,
    pub loc: Arc<LocConf>,
    /// Regex captures of the last regex match, as byte ranges of `capture_src`.
    pub captures: Vec<Option<(usize, usize)>>,
    pub capture_src: Vec<u8>,
    /// Set once an internal redirect happened (`internal` locations allowed).
    pub internal: bool,
    pub redirects: u32,
    /// Length of the matched location prefix (for `alias`).
    pub loc_prefix_len: usize,
    pub alias: bool,
    pub start: std::time::Instant,
    /// Values of user variables set with `set` in this request.
    pub user_vars: RefCell<Vec<Option<Vec<u8>>>>,
    /// Dropped when the request ends (e.g. a limit_conn slot).
    pub guards: Vec<Box<dyn std::any::Any>>,
    /// Per-request notes of modules for variables ($limit_conn_status...).
    pub notes: Vec<(&'static str, Vec<u8>)>,
    /// Filled after the response is written, for the log phase.
    pub sent: Sent,
    /// The method handlers see (error_page redirects turn POST into GET).
    pub method: Method,
    /// An error_page redirect happened (recursive_error_pages).
    pub error_paged: bool,
    /// The request body, when one was announced (set by the engine).
    pub body: Option<crate::http::body::ReqBody<'a>>,
    /// The client's connection, watched for a hang-up while a handler
    /// waits on something else (an upstream's head); None where the
    /// protocol cannot tell (HTTP/2) and in subrequests.
    pub client: Option<&'a dyn crate::http::body::BodyIo>,
    /// The URI was rewritten after its location was found and the request
    /// stays there (`rewrite ... break`; nginx's `valid_location` cleared):
    /// a proxy_pass URI part then no longer replaces the location's
    /// prefix, the rewritten URI goes as it is.
    pub location_stale: bool,
    /// In the log phase: error lines name it (`while logging request`),
    /// as nginx's do.
    pub logging: std::cell::Cell<bool>,
    /// The client's address as this request sees it: the connection's,
    /// or the one `set_real_ip_from` trusts a header for (`realip.rs`).
    pub remote: Option<std::net::SocketAddr>,
    /// The realip module has had its one chance.
    pub realip_done: bool,
    /// try_files found a file under an alias set in a regex location: the
    /// file is the alias plus the URI (nginx's `r->add_uri_to_alias`).
    pub add_uri_to_alias: bool,
    /// State a module computes once per request where it only has `&Ctx`
    /// (a variable's evaluation), by module name (userid's identifier).
    pub memo: RefCell<Vec<(&'static str, Box<dyn std::any::Any>)>>,
}

/// What went out, for the log phase's variables.
#[derive(Debug, Default, Clone)]
pub struct Sent {
    pub status: u16,
    pub bytes: u64,
    pub body_bytes: u64,
    /// The head as written (for `$sent_http_*`).
    pub head: Vec<u8>,
    /// The trailers rendered so far (for `$sent_trailer_*`).
    pub trailers: Vec<(String, Vec<u8>)>,
    /// The file-I/O layer's decision (`$tern_io`): "", inline, offload...
    pub io: &'static str,
    /// The whole answer went out (`$request_completion` "OK"); false
    /// while it is going and when sending it failed.
    pub complete: bool,
    /// The rate the body is paced by instead of the location's
    /// `limit_rate` (`set $limit_rate`, `X-Accel-Limit-Rate`), or the
    /// location's `limit_rate` given with variables, evaluated.
    pub limit_rate: Option<u64>,
    /// The location's `limit_rate_after` given with variables, evaluated.
    pub limit_rate_after: Option<u64>,
}

pub enum Step {
    /// Go on to the next phase.
    Next,
    /// The response is decided.
    Done(Box<Response>),
    /// Look up the location again for the new URI.
    Redirect(Vec<u8>),
    /// Continue in a named location (`@name`).
    Named(String),
    /// Access phase only: wait this long on a timer (limit_req's delay),
    /// then go on with the next access handler.
    Delay(std::time::Duration),
}

impl Step {
    pub fn done(r: Response) -> Step {
        Step::Done(Box::new(r))
    }
}

/// An access-phase handler.
pub type AccessFn = fn(&mut Ctx<'_>) -> Step;

/// Access handlers, in order.
pub const ACCESS: &[AccessFn] = modules::ACCESS;

/// A header filter: may change the response and install body filters.
pub type HeaderFilter = fn(&mut Ctx<'_>, &mut Response);

/// Header filters in execution order, as [`modules::HEADER_FILTERS`] lists
/// them: slice, not_modified, headers, userid, gunzip, sub_filter, charset,
/// gzip, range (nginx's order for these modules). [`finish`] runs them on the
/// client's response only (a subrequest's passes through untouched), after
/// msie_refresh and the special-response body. nginx's addition filter
/// (between gunzip and sub_filter there) is not in the list:
/// [`crate::http::modules::addition::apply`] runs before all of them.
pub const HEADER_FILTERS: &[HeaderFilter] = modules::HEADER_FILTERS;

impl<'a> Ctx<'a> {
    pub fn new(
        http: &'a Arc<HttpConf>,
        req: &'a Request,
        server: &'a Arc<Server>,
        conn: &'a ConnInfo,
        shared: &'a Arc<WorkerShared>,
    ) -> Ctx<'a> {
        let nvars = http.main.vars.len();
        Ctx {
            http,
            req,
            server,
            conn,
            shared,
            sub_depth: 0,
            upstream_headers: None,
            uri: Cow::Borrowed(req.uri()),
            args: req.args().map(Cow::Borrowed),
            loc: server.conf.clone(),
            captures: Vec::new(),
            capture_src: Vec::new(),
            internal: false,
            redirects: 0,
            loc_prefix_len: 0,
            alias: false,
            start: std::time::Instant::now(),
            user_vars: RefCell::new(vec![None; nvars]),
            guards: Vec::new(),
            notes: Vec::new(),
            sent: Sent::default(),
            method: req.method,
            error_paged: false,
            body: None,
            client: None,
            location_stale: false,
            logging: std::cell::Cell::new(false),
            remote: conn.remote,
            realip_done: false,
            add_uri_to_alias: false,
            memo: RefCell::new(Vec::new()),
        }
    }

    pub fn note(&self, key: &str) -> Option<&[u8]> {
        self.notes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_slice())
    }

    /// Sets the note `key`, replacing an earlier value.
    pub fn set_note(&mut self, key: &'static str, v: impl Into<Vec<u8>>) {
        let v = v.into();
        match self.notes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, old)) => *old = v,
            None => self.notes.push((key, v)),
        }
    }

    /// A module variable that is the note `key`: appends it to `out`;
    /// false (the variable is not found) when the note was never set.
    pub fn note_var(&self, key: &str, out: &mut Vec<u8>) -> bool {
        match self.note(key) {
            Some(v) => {
                out.extend_from_slice(v);
                true
            }
            None => false,
        }
    }
}

/// Runs every phase, error_page redirects, and the header filters.
///
/// The response travels boxed from the handler that decides it to the
/// writer: it is ~600 bytes, and each move of it by value (out of a
/// future, into the next) was a `memcpy` (~8 of them a request).
pub async fn run(cx: &mut Ctx<'_>) -> Box<Response> {
    let resp = if matches!(cx.conn.tls, crate::tls::TlsState::PlainOnSsl) {
        // nginx: the request is read, the server chosen, and then no
        // phase runs: 497, which `error_page 497` may catch.
        cx.log(
            Level::Info,
            "client sent plain HTTP request to HTTPS port while reading client request headers",
        );
        Box::new(Response::status(497))
    } else if let Some(status) = ssl_check(cx) {
        Box::new(Response::status(status))
    } else {
        if crate::core::log::fault_panic_uri().is_some_and(|u| u == &cx.uri[..]) {
            panic!("TERN_FAULT_PANIC_URI requested");
        }
        run_phases(cx, Entry::Start).await
    };
    conclude(cx, resp).await
}

/// nginx's checks of a TLS request once its server is known: a `Host`
/// other than the SNI name on a server that verifies client
/// certificates is 421; a bad client certificate is 495 (unless
/// `optional_no_ca` forgives an unknown issuer), a missing one with
/// `ssl_verify_client on` 496. Like 497, these skip every phase and
/// `error_page` may catch them.
fn ssl_check(cx: &Ctx<'_>) -> Option<u16> {
    use crate::tls::client_auth::VerifyMode;
    let info = cx.conn.tls.info()?;
    let mode = cx.server.srv.ssl.verify_client.unwrap_or_default();
    if mode == VerifyMode::Off {
        return None;
    }
    if let (Some(sni), Some(host)) = (&info.server_name, cx.req.host()) {
        if !sni.as_bytes().eq_ignore_ascii_case(host) {
            cx.log(
                Level::Info,
                "client attempted to request the server name different from the one that was negotiated while reading client request headers",
            );
            return Some(421);
        }
    }
    if let Err(e) = info.verify {
        if mode != VerifyMode::OptionalNoCa || !e.is_no_ca() {
            cx.log(
                Level::Info,
                &format!(
                    "client SSL certificate verify error: {} while reading client request headers",
                    e
                ),
            );
            return Some(495);
        }
    }
    if mode == VerifyMode::On && info.client_chain.is_none() {
        cx.log(
            Level::Info,
            "client sent no required SSL certificate while reading client request headers",
        );
        return Some(496);
    }
    None
}

/// Applies `error_page` to a decided response (internal redirects, named
/// locations, redirects), then the header filters. Also how a head that
/// was refused while being read gets its answer, as in nginx.
pub async fn conclude(cx: &mut Ctx<'_>, mut resp: Box<Response>) -> Box<Response> {
    crate::http::upstream::response::accel_carried(cx, &mut resp);
    let mut hops = 0;
    while resp.status >= 300
        && matches!(resp.body, crate::http::response::Body::Empty)
        && !resp.close_silently
    {
        let Some(page) = cx.loc.modules.error_page.find(resp.status).cloned() else {
            break;
        };
        if cx.error_paged && !cx.loc.modules.error_page.recursive.unwrap_or(false) {
            break;
        }
        hops += 1;
        if hops > 10 {
            break;
        }
        cx.error_paged = true;
        let orig = resp.status;
        let target = page.target.render_vec(&*cx);
        use crate::http::modules::error_page::Overwrite;
        if target.starts_with(b"http://")
            || target.starts_with(b"https://")
            || !(target.starts_with(b"/") || target.starts_with(b"@"))
        {
            let code = match page.overwrite {
                Overwrite::Code(c) if matches!(c, 301 | 302 | 303 | 307 | 308) => c,
                _ => 302,
            };
            *resp = Response::status(code);
            rewrite::set_location(cx, &mut resp, target);
            break;
        }
        // nginx turns the method into GET for a URI, not for a named
        // location (`error_page 404 = @app` passes a POST on as POST).
        if cx.method != Method::Head && !target.starts_with(b"@") {
            cx.method = Method::Get;
        }
        let entry = if let Some(name) = target.strip_prefix(b"@") {
            Entry::Named(format!("@{}", String::from_utf8_lossy(name)))
        } else {
            let mut u = target;
            cx.take_args(&mut u);
            cx.uri = u.into();
            cx.internal = true;
            Entry::Find
        };
        // An authentication challenge stays with the page that replaces
        // the response: nginx keeps `WWW-Authenticate` in the response
        // headers through the internal redirect (a target that asks again
        // adds its own after it).
        let challenge: Vec<_> = resp
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("www-authenticate"))
            .cloned()
            .collect();
        // So does a redirect's Location, unless the target redirects
        // anew (nginx clears the old one then).
        let old_location = resp.location.take();
        let old_location_hdr: Vec<_> = resp
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("location"))
            .cloned()
            .collect();
        let r2 = run_phases(cx, entry).await;
        // A target that ends in an error or a redirect of its own (return,
        // rewrite, a directory or auto redirect) gives the status: nginx's
        // special response handler sets `err_status` anew.
        let target_failed =
            r2.status >= 300 && matches!(r2.body, crate::http::response::Body::Empty);
        resp = r2;
        resp.headers.splice(0..0, challenge);
        let redirects = resp.location.is_some()
            || resp
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("location"));
        if !redirects {
            resp.location = old_location;
            resp.headers.extend(old_location_hdr);
        }
        if !target_failed {
            resp.status = match page.overwrite {
                Overwrite::Keep => orig,
                Overwrite::Code(c) => c,
                Overwrite::FromTarget => resp.status,
            };
        }
    }
    // nginx's SSI filter (it runs the included documents' own commands).
    modules::ssi::apply(cx, &mut resp).await;
    // nginx's addition filter: the subrequests' output around the body.
    modules::addition::apply(cx, &mut resp).await;
    finish(cx, &mut resp);
    resp
}

/// Error pages, then the header filters.
pub fn finish(cx: &mut Ctx<'_>, resp: &mut Response) {
    if matches!(resp.status, 301 | 302)
        && matches!(resp.body, response::Body::Empty)
        && cx.loc.core.msie_refresh.unwrap_or(false)
        && response::browser(cx.req).msie
    {
        if let Some(target) = refresh_target(cx, resp) {
            response::msie_refresh(resp, &target);
        }
    }
    response::special_response_to(resp, &cx.loc, cx.req);
    if resp.status != 200 {
        resp.remove_header("Accept-Ranges");
    }
    // nginx's header filters pass a subrequest's response on untouched
    // (`r != r->main`): its headers never reach the client.
    if cx.sub_depth > 0 {
        return;
    }
    for f in HEADER_FILTERS {
        f(cx, resp);
    }
    cx.sent.limit_rate = rewrite::limit_rate_override(cx).or_else(|| {
        eval_size(cx, cx.loc.core.limit_rate.as_ref())
            .or(crate::http::conf::SizeValue::fixed(&cx.loc.core.limit_rate))
    });
    cx.sent.limit_rate_after = eval_size(cx, cx.loc.core.limit_rate_after.as_ref());
    // nginx sets the request's rate as the head goes out: from here on
    // (the access log) `$limit_rate` reads the rate the body is paced by.
    if let Some(rate) = cx.sent.limit_rate {
        cx.set_note(rewrite::LIMIT_RATE, rate.to_string());
    }
}

/// The Location of a redirect as its handler set it: nginx builds the
/// `msie_refresh` page before its header filter makes a relative Location
/// absolute, so the prefix tern already added is taken off again.
fn refresh_target(cx: &Ctx<'_>, resp: &Response) -> Option<Vec<u8>> {
    if let Some(abs) = &resp.location {
        let mut base = rewrite::absolute_location(cx, b"/".to_vec());
        base.pop();
        return Some(match abs.strip_prefix(base.as_slice()) {
            Some(rest) if rest.starts_with(b"/") => rest.to_vec(),
            _ => abs.clone(),
        });
    }
    resp.header("Location").map(<[u8]>::to_vec)
}

/// The captures of the `server_name` regex that chose the server, as
/// variables and `$1`..: nginx sets them while it selects the server; the
/// engine's selection only says which server, so the match is made again
/// here, for servers with regex names only, unless the host is one of
/// the server's other names.
fn server_name_captures(cx: &mut Ctx<'_>) {
    use crate::http::conf::ServerName;
    let server = cx.server.clone();
    let names = &server.srv.names;
    if !names.iter().any(|n| matches!(n, ServerName::Regex(_))) {
        return;
    }
    let Some(host) = cx.req.host() else { return };
    let host = host.strip_suffix(b".").unwrap_or(host).to_ascii_lowercase();
    let lower = std::str::from_utf8(&host).unwrap_or("");
    if names
        .iter()
        .any(|n| !matches!(n, ServerName::Regex(_)) && n.matches(lower))
    {
        return;
    }
    for n in names {
        if let ServerName::Regex(re) = n {
            if let Some(c) = re.captures(&host) {
                set_named_captures(cx, re.capture_names(), &c, &host);
                cx.captures = c;
                cx.capture_src = host;
                return;
            }
        }
    }
}

/// `post_action`: once the answer has gone out, the request runs again,
/// internally redirected to the URI or named location, and what that
/// answers is dropped (nginx makes it header-only and sends nothing more).
/// The access log then describes it as nginx's does: the last location's
/// log, the client's status.
pub async fn post_action(cx: &mut Ctx<'_>) {
    let Some(Some(target)) = cx.loc.core.post_action.clone() else {
        return;
    };
    if cx.sub_depth > 0 {
        return;
    }
    let entry = if let Some(name) = target.strip_prefix(b"@") {
        Entry::Named(format!("@{}", String::from_utf8_lossy(name)))
    } else {
        let mut u = target.to_vec();
        cx.take_args(&mut u);
        cx.uri = u.into();
        cx.internal = true;
        Entry::Find
    };
    drop(Box::pin(run_phases(cx, entry)).await);
}

/// The end of a request, whatever protocol carried it, once its answer
/// went out (`answered`: whole) or failed to: `post_action` for an
/// answered one, then [`log_done`]. A request cut by the worker's
/// shutdown (see [`WorkerShared::cut_off`]) during its post action is
/// logged at once.
///
/// [`WorkerShared::cut_off`]: crate::core::worker::WorkerShared::cut_off
pub async fn wrap_up(cx: &mut Ctx<'_>, status: u16, answered: bool) {
    if answered && cx.loc.core.post_action.is_some() {
        let (shared, since) = (cx.shared, cx.start);
        tokio::select! {
            biased;
            () = post_action(cx) => {}
            () = shared.cut_off(since) => {}
        }
    }
    log_done(cx, status);
}

/// How a multiplexed protocol (HTTP/2, HTTP/3) answers on one of its
/// streams, in its own framing.
pub trait StreamAnswer {
    /// Sends `resp`: the head, the body through its filters, trailers,
    /// the end of the stream; `sent` counts what went.
    fn send<'s>(
        &'s mut self,
        resp: &'s mut Response,
        loc: &'s LocConf,
        head_only: bool,
        sent: &'s mut Sent,
    ) -> impl std::future::Future<Output = std::io::Result<()>> + 's;
    /// Ends the stream without (the rest of) an answer: a reset.
    fn reset(&mut self);
}

/// Answers a request a stream carried that was refused as it was read
/// (400, 405: see [`crate::http::fields::request`]), as nginx finalises
/// one: the error log says why, `error_page` applies (an internal
/// redirect, a redirect, `return 444` resetting the stream), the access
/// log has the request as far as it was read. HTTP/1 has its own (the
/// connection closes after it).
pub async fn refused(
    stream: &mut impl StreamAnswer,
    rej: crate::http::v1::parse::Reject,
    http: &Arc<HttpConf>,
    addr: &crate::http::conf::AddrConf,
    info: &ConnInfo,
    shared: &Arc<WorkerShared>,
) {
    let line = rej.line.as_deref().unwrap_or_default();
    let req = Request::refused(line, rej.host.as_deref());
    // The server the host names, else the address's default one.
    let server = match req.host() {
        Some(h) => addr.select(Some(h)).clone(),
        None => addr.default.clone(),
    };
    let log = match &rej.detail {
        Some(d) => format!("{}: \"{}\"", rej.log, String::from_utf8_lossy(d)),
        None => rej.log.to_string(),
    };
    let mut cx = Ctx::new(http, &req, &server, info, shared);
    cx.log(Level::Info, &log);
    let mut resp = conclude(&mut cx, Box::new(Response::status(rej.status))).await;
    if resp.close_silently {
        stream.reset();
    } else {
        let loc = cx.loc.clone();
        let head_only = line.starts_with(b"HEAD ");
        match stream.send(&mut resp, &loc, head_only, &mut cx.sent).await {
            Ok(()) => cx.sent.complete = true,
            Err(_) => stream.reset(),
        }
    }
    log_done(&mut cx, resp.status);
}

/// The log phase of a request: `status` as the client saw it (nginx logs
/// 494-497 as the 400 they answer with; 0 is `000`, no status chosen),
/// counted for stub_status and the metrics with the bytes sent.
pub fn log_done(cx: &mut Ctx<'_>, status: u16) {
    cx.sent.status = crate::http::status::wire_code(status);
    modules::stub_status::metrics::record_response(status, cx.sent.bytes);
    modules::log_phase(cx);
}

/// Where phase processing starts.
enum Entry {
    /// Server rewrite, then location lookup.
    Start,
    /// Location lookup for `cx.uri`.
    Find,
    /// A named location (its rewrite phase onward).
    Named(String),
}

async fn run_phases(cx: &mut Ctx<'_>, entry: Entry) -> Box<Response> {
    let mut named = None;
    match entry {
        Entry::Start => {
            server_name_captures(cx);
            modules::realip::apply(cx, true);
            let srv_conf = cx.server.conf.clone();
            match rewrite::run(cx, &srv_conf.modules.rewrite.ops).await {
                Step::Done(r) => return r,
                Step::Redirect(u) => cx.uri = u.into(),
                Step::Named(n) => named = Some(n),
                Step::Next | Step::Delay(_) => {}
            }
        }
        Entry::Find => {}
        Entry::Named(n) => named = Some(n),
    }
    loop {
        if let Some(n) = named.take() {
            if !named_location(cx, &n) {
                cx.log(
                    Level::Error,
                    &format!("could not find named location \"{}\"", n),
                );
                return Box::new(Response::status(500));
            }
        } else if let Some(r) = find_location(cx) {
            return Box::new(r);
        }
        // nginx checks the body size when it picks the location, before
        // the location's rewrite phase.
        if let Some(cl) = cx.req.content_length {
            let max = cx.loc.core.client_max_body_size.unwrap_or(1 << 20);
            if max != 0 && cl > max {
                cx.log(
                    Level::Error,
                    &format!("client intended to send too large body: {} bytes", cl),
                );
                return Box::new(Response::status(413));
            }
        }
        let loc = cx.loc.clone();
        match rewrite::run(cx, &loc.modules.rewrite.ops).await {
            Step::Done(r) => return r,
            Step::Redirect(u) => {
                if let Some(r) = cx.internal_redirect(u) {
                    return Box::new(r);
                }
                continue;
            }
            Step::Named(n) => {
                named = Some(n);
                continue;
            }
            Step::Next | Step::Delay(_) => {}
        }
        if cx.loc.core.internal && !cx.internal {
            return Box::new(Response::status(404));
        }
        modules::realip::apply(cx, false);
        let mut again = false;
        for a in ACCESS {
            match a(cx) {
                Step::Next => {}
                Step::Delay(d) => {
                    // nginx watches the client while limit_req holds the
                    // request (ngx_http_test_reading): one that hangs up
                    // ends it as 499, instead of a graceful stop waiting
                    // out the whole delay.
                    let gone = match cx.client {
                        Some(c) => tokio::select! {
                            () = tokio::time::sleep(d) => false,
                            () = c.hangup() => true,
                        },
                        None => {
                            tokio::time::sleep(d).await;
                            false
                        }
                    };
                    if gone {
                        cx.log(Level::Info, "client prematurely closed connection");
                        let mut r = Response::status(499);
                        r.close_silently = true;
                        return Box::new(r);
                    }
                }
                Step::Done(r) => return r,
                Step::Redirect(u) => {
                    if let Some(r) = cx.internal_redirect(u) {
                        return Box::new(r);
                    }
                    again = true;
                    break;
                }
                Step::Named(n) => {
                    named = Some(n);
                    again = true;
                    break;
                }
            }
        }
        if again {
            continue;
        }
        // nginx's access phase passes subrequests through (`r != r->main`):
        // an auth_request location is not itself guarded by auth_request.
        if cx.sub_depth == 0 && modules::access::checks(cx) {
            if let Some(r) = modules::access::phase(cx).await {
                return Box::new(r);
            }
        }
        match modules::content(cx).await {
            Step::Done(r) => return r,
            Step::Redirect(u) => {
                if let Some(r) = cx.internal_redirect(u) {
                    return Box::new(r);
                }
            }
            Step::Named(n) => {
                cx.redirects += 1;
                if cx.redirects > 10 {
                    return Box::new(Response::status(500));
                }
                named = Some(n);
            }
            Step::Next | Step::Delay(_) => return Box::new(Response::status(404)),
        }
    }
}

/// Redirect to a named location (`@name`), used by try_files and error_page.
pub fn named_location(cx: &mut Ctx<'_>, name: &str) -> bool {
    match cx.server.named.get(name) {
        Some(l) => {
            cx.loc = l.conf.clone();
            cx.location_stale = false;
            crate::http::modules::access::limit_except(cx);
            cx.internal = true;
            cx.loc_prefix_len = 0;
            cx.alias = matches!(cx.loc.core.root, Some((_, true)));
            true
        }
        None => false,
    }
}

/// Finds the location for `cx.uri`; a response when the lookup answers
/// by itself (nginx's `auto_redirect`).
fn find_location(cx: &mut Ctx<'_>) -> Option<Response> {
    cx.location_stale = false;
    match cx.server.locations.find(&cx.uri) {
        Some(f) if f.auto_redirect => {
            cx.loc = f.loc.conf.clone();
            let name = match &f.loc.m {
                crate::http::conf::LocMatch::Prefix { prefix: n, .. }
                | crate::http::conf::LocMatch::Exact(n) => n.as_slice(),
                _ => b"/",
            };
            // As nginx: the location's escaped name, then the arguments.
            let mut target = Vec::new();
            crate::http::uri::escape_uri(name, &mut target);
            if let Some(a) = &cx.args {
                target.push(b'?');
                target.extend_from_slice(a);
            }
            let mut r = Response::status(301);
            r.location = Some(rewrite::absolute_location(cx, target));
            return Some(r);
        }
        Some(f) => {
            cx.loc = f.loc.conf.clone();
            if !f.captures.is_empty() {
                set_named_captures(cx, f.capture_names, &f.captures, &cx.uri.clone());
                cx.captures = f.captures;
                cx.capture_src = cx.uri.to_vec();
            }
            cx.loc_prefix_len = match &f.loc.m {
                crate::http::conf::LocMatch::Prefix { prefix, .. }
                | crate::http::conf::LocMatch::Exact(prefix) => prefix.len(),
                // An alias in a regex location is the whole path.
                _ => cx.uri.len(),
            };
        }
        None => {
            cx.loc = cx.server.conf.clone();
            cx.loc_prefix_len = 0;
        }
    }
    crate::http::modules::access::limit_except(cx);
    cx.alias = matches!(cx.loc.core.root, Some((_, true)));
    None
}

/// Stores named regex captures in their variables.
pub fn set_named_captures(
    cx: &Ctx<'_>,
    names: &[Option<String>],
    caps: &[Option<(usize, usize)>],
    src: &[u8],
) {
    for (i, n) in names.iter().enumerate() {
        let Some(n) = n else { continue };
        if let Some(Var::User(v)) = cx.http.main.vars.lookup(n) {
            // A group that took no part in the match is empty, not unset,
            // as PCRE's -1 offsets give nginx a found empty value.
            let val = caps
                .get(i)
                .copied()
                .flatten()
                .and_then(|(s, e)| src.get(s..e))
                .unwrap_or_default()
                .to_vec();
            if let Some(slot) = cx.user_vars.borrow_mut().get_mut(v) {
                *slot = Some(val);
            }
        }
    }
}

impl Ctx<'_> {
    /// The file-I/O policy of the current location (`aio`, `directio`...),
    /// with variables in the pool name resolved for this request.
    pub fn io_policy(&self) -> Result<crate::io::Policy, Box<Response>> {
        let pools = self.shared.pools.load();
        let name = match self.loc.io.aio() {
            crate::io::AioConf::Threads { pool: Some(p), .. } if p.contains('$') => {
                match crate::http::vars::Template::compile_existing(p, &self.http.main.vars) {
                    Ok(t) => Some(String::from_utf8_lossy(&t.render_vec(self)).into_owned()),
                    Err(_) => None,
                }
            }
            _ => None,
        };
        crate::io::Policy::from_loc(&self.loc.io, &pools, name.as_deref()).map_err(|e| {
            self.log(Level::Error, &e.to_string());
            Box::new(Response::status(500))
        })
    }

    /// Returns a response when the redirect limit is hit.
    pub fn internal_redirect(&mut self, uri: Vec<u8>) -> Option<Response> {
        self.redirects += 1;
        if self.redirects > 10 {
            self.log(
                Level::Error,
                &format!(
                    "rewrite or internal redirection cycle while internally redirecting to \"{}\"",
                    String::from_utf8_lossy(&uri)
                ),
            );
            return Some(Response::status(500));
        }
        self.uri = uri.into();
        self.internal = true;
        None
    }

    /// Logs with nginx's request context suffix.
    pub fn log(&self, level: Level, msg: &str) {
        self.log_with_upstream(level, msg, None);
    }

    /// Logs with nginx's request context, and `upstream: "..."` when given
    /// (`..., request: "...", upstream: "...", host: "..."`).
    pub fn log_with_upstream(&self, level: Level, msg: &str, upstream: Option<&str>) {
        self.log_built(level, msg.len(), |t| t.push_str(msg), upstream);
    }

    /// [`Self::log`] for a message that `write` appends to the line
    /// (about `room` bytes of it), rather than one formatted first.
    pub fn log_with(&self, level: Level, room: usize, write: impl FnOnce(&mut String)) {
        self.log_built(level, room, write, None);
    }

    fn log_built(
        &self,
        level: Level,
        room: usize,
        write: impl FnOnce(&mut String),
        upstream: Option<&str>,
    ) {
        // The message and its context written straight into the line: an
        // error line is written for every failed request (a 404 on a busy
        // site), so its pieces are not each formatted into a string of
        // their own, nor the message copied from one buffer to another.
        let text = |text: &mut String| {
            write(text);
            if self.logging.get() {
                text.push_str(" while logging request");
            }
            self.write_request_ctx(text);
            // nginx names a subrequest by its URI after the client's request.
            if self.sub_depth > 0 {
                text.push_str(", subrequest: \"");
                crate::core::log::push_lossy(text, &self.uri);
                text.push('"');
            }
            if let Some(u) = upstream {
                text.push_str(", upstream: \"");
                text.push_str(u);
                text.push('"');
            }
            self.write_host_ctx(text);
        };
        let conn = Some(self.conn.id);
        // The location's log, else the main one borrowed (no reference
        // count taken for a line).
        match &self.loc.core.logger {
            Some(l) => l.log_with(level, conn, room + 192, text),
            None => crate::core::log::main_logger_ref().log_with(level, conn, room + 192, text),
        }
    }

    /// Splits `?args` off the target of an internal redirect (error_page,
    /// try_files): they replace the request's args (an empty `?`: none).
    pub fn take_args(&mut self, u: &mut Vec<u8>) {
        if let Some(q) = u.iter().position(|&b| b == b'?') {
            let args = u[q + 1..].to_vec();
            u.truncate(q);
            self.args = if args.is_empty() {
                None
            } else {
                Some(args.into())
            };
        }
    }

    /// The server's primary name (`$server_name`; empty when it has none).
    pub fn server_name(&self) -> &str {
        self.server.srv.primary_name.as_deref().unwrap_or("")
    }

    /// The error log of the current location (the main one if it has none).
    pub fn logger(&self) -> Arc<crate::core::log::Logger> {
        self.loc
            .core
            .logger
            .clone()
            .unwrap_or_else(crate::core::log::main_logger)
    }

    /// nginx's request context of an error line:
    /// `, client: ADDR, server: NAME, request: "LINE"`.
    pub fn log_request_ctx(&self) -> String {
        let mut out = String::with_capacity(128);
        self.write_request_ctx(&mut out);
        out
    }

    /// [`Self::log_request_ctx`] appended to `out`.
    pub fn write_request_ctx(&self, out: &mut String) {
        use std::fmt::Write as _;
        out.push_str(", client: ");
        match self.remote.map(|a| a.ip()) {
            // The common case without the formatting machinery.
            Some(std::net::IpAddr::V4(ip)) => {
                let mut num = itoa::Buffer::new();
                for (i, octet) in ip.octets().into_iter().enumerate() {
                    if i > 0 {
                        out.push('.');
                    }
                    out.push_str(num.format(octet));
                }
            }
            Some(ip) => {
                let _ = write!(out, "{}", ip);
            }
            None => out.push_str("unix:"),
        }
        out.push_str(", server: ");
        out.push_str(self.server_name());
        out.push_str(", request: \"");
        crate::core::log::push_lossy(out, self.req.line());
        out.push('"');
    }

    /// The end of an error line's context: `, host: "..."`, or nothing
    /// when the request has no Host.
    pub fn log_host_ctx(&self) -> String {
        let mut out = String::new();
        self.write_host_ctx(&mut out);
        out
    }

    /// [`Self::log_host_ctx`] appended to `out`.
    pub fn write_host_ctx(&self, out: &mut String) {
        if let Some(h) = self.req.header("host") {
            out.push_str(", host: \"");
            crate::core::log::push_lossy(out, h);
            out.push('"');
        }
    }

    /// The document root (rendered) for the current location.
    pub fn root(&self) -> Vec<u8> {
        match &self.loc.core.root {
            Some((t, _)) => t.render_vec(self),
            None => Vec::new(),
        }
    }

    /// `$request_filename`: root + uri, or alias + the rest of the uri.
    pub fn request_filename(&self) -> Vec<u8> {
        let mut p = Vec::new();
        self.request_filename_into(&mut p);
        p
    }

    /// [`Ctx::request_filename`], appended to `p`.
    pub fn request_filename_into(&self, p: &mut Vec<u8>) {
        let rest: &[u8] = if self.alias {
            let n = match self.loc.core.alias_len {
                Some(usize::MAX) if self.add_uri_to_alias => 0,
                n => n.unwrap_or(self.loc_prefix_len),
            };
            self.uri.get(n..).unwrap_or(b"")
        } else {
            &self.uri
        };
        // Sized once (root's literal text, room for variables, the uri):
        // this runs for every file answered, and growing the root's
        // buffer for the uri cost a realloc.
        let Some((t, _)) = &self.loc.core.root else {
            p.extend_from_slice(rest);
            return;
        };
        p.reserve(t.literal_len() + 64 + rest.len());
        t.render(self, p);
        p.extend_from_slice(rest);
    }
}

fn push_addr(out: &mut Vec<u8>, a: Option<SocketAddr>, port: bool) {
    match a {
        Some(a) if port => out.extend_from_slice(a.port().to_string().as_bytes()),
        Some(a) => out.extend_from_slice(a.ip().to_string().as_bytes()),
        None if port => {}
        None => out.extend_from_slice(b"unix:"),
    }
}

impl Ctx<'_> {
    /// `$request_id`: drawn on first use, then the same for the request
    /// (nginx caches it in the request's variables).
    /// Gives a subrequest the `$request_id` of `parent`.
    pub(crate) fn share_request_id(&self, parent: &Ctx<'_>) {
        let id = parent.request_id();
        self.memo.borrow_mut().push(("request_id", Box::new(id)));
    }

    fn request_id(&self) -> [u8; 32] {
        const KEY: &str = "request_id";
        let mut memo = self.memo.borrow_mut();
        if let Some(id) = memo
            .iter()
            .find(|(k, _)| *k == KEY)
            .and_then(|(_, v)| v.downcast_ref::<[u8; 32]>())
        {
            return *id;
        }
        let id = crate::core::random_hex16();
        memo.push((KEY, Box::new(id)));
        id
    }
}

impl VarCtx for Ctx<'_> {
    fn var(&self, v: &Var, out: &mut Vec<u8>) -> bool {
        self.var_sent(&self.sent, v, out)
    }
}

/// A request's variables with what went out given apart (the writer
/// holds the request's [`Sent`] while it renders trailers at the end of
/// the body).
pub struct WithSent<'c, 'a> {
    pub cx: &'c Ctx<'a>,
    pub sent: &'c Sent,
}

impl VarCtx for WithSent<'_, '_> {
    fn var(&self, v: &Var, out: &mut Vec<u8>) -> bool {
        self.cx.var_sent(self.sent, v, out)
    }
}

impl Ctx<'_> {
    /// A variable's value, `$status`, `$bytes_sent`, `$sent_http_*` and
    /// the like read from `sent`.
    fn var_sent(&self, sent: &Sent, v: &Var, out: &mut Vec<u8>) -> bool {
        let r = self.req;
        match v {
            Var::Uri => out.extend_from_slice(&self.uri),
            Var::RequestUri => out.extend_from_slice(r.raw_uri()),
            Var::Args => match &self.args {
                Some(a) if !a.is_empty() => out.extend_from_slice(a),
                _ => return false,
            },
            Var::IsArgs => {
                if self.args.is_some() {
                    out.push(b'?')
                }
            }
            Var::Host => match r.host() {
                Some(h) => out.extend_from_slice(h),
                None => out.extend_from_slice(self.server_name().as_bytes()),
            },
            Var::Hostname => out.extend_from_slice(crate::core::hostname().as_bytes()),
            Var::Http(name) => match name.as_str() {
                "cookie" => {
                    let mut first = true;
                    for h in r.headers().filter(|h| h.is("cookie")) {
                        if !first {
                            out.extend_from_slice(b"; ");
                        }
                        first = false;
                        out.extend_from_slice(h.value);
                    }
                    return !first;
                }
                // nginx 1.22 joins this one's lines too (its only other
                // multi-valued request header), with ", ".
                "x-forwarded-for" => {
                    let mut first = true;
                    for h in r.headers().filter(|h| h.is("x-forwarded-for")) {
                        if !first {
                            out.extend_from_slice(b", ");
                        }
                        first = false;
                        out.extend_from_slice(h.value);
                    }
                    return !first;
                }
                _ => match r.header_var(name) {
                    Some(v) => out.extend_from_slice(v),
                    None => return false,
                },
            },
            Var::Arg(name) => match self
                .args
                .as_deref()
                .and_then(|a| crate::http::uri::arg(a, name.as_bytes()))
            {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
            Var::RemoteAddr => push_addr(out, self.remote, false),
            Var::RealIpRemoteAddr => push_addr(out, self.conn.remote, false),
            Var::RealIpRemotePort => push_addr(out, self.conn.remote, true),
            Var::BinaryRemoteAddr => match self.remote {
                Some(SocketAddr::V4(a)) => out.extend_from_slice(&a.ip().octets()),
                Some(SocketAddr::V6(a)) => out.extend_from_slice(&a.ip().octets()),
                None => {}
            },
            Var::RemotePort => push_addr(out, self.remote, true),
            Var::ServerAddr => push_addr(out, self.conn.local, false),
            Var::ServerPort => push_addr(out, self.conn.local, true),
            Var::ServerName => out.extend_from_slice(self.server_name().as_bytes()),
            Var::ServerProtocol => out.extend_from_slice(r.proto()),
            Var::Scheme => out.extend_from_slice(if self.conn.tls.info().is_some() {
                b"https"
            } else {
                b"http"
            }),
            Var::Https => {
                if self.conn.tls.info().is_some() {
                    out.extend_from_slice(b"on");
                }
            }
            Var::Http2 => {
                // Known from the request (HTTP/2 names itself HTTP/2.0)
                // rather than kept per connection: parked connections
                // keep their ConnInfo, which stays small.
                if self.req.proto() == b"HTTP/2.0" {
                    let tls = self.conn.tls.info().is_some();
                    out.extend_from_slice(if tls { b"h2" } else { b"h2c" });
                }
            }
            Var::Http3 => {
                if self.req.proto() == b"HTTP/3.0" {
                    out.extend_from_slice(b"h3");
                }
            }
            Var::SslProtocol => match self.conn.tls.info() {
                Some(t) => out.extend_from_slice(t.protocol.as_bytes()),
                None => return false,
            },
            Var::SslCipher => match self.conn.tls.info() {
                Some(t) => out.extend_from_slice(t.cipher.as_bytes()),
                None => return false,
            },
            Var::SslServerName => match self.conn.tls.info().and_then(|t| t.server_name.as_ref()) {
                Some(n) => out.extend_from_slice(n.as_bytes()),
                None => return false,
            },
            Var::SslSessionReused => match self.conn.tls.info() {
                Some(t) => out.push(if t.reused { b'r' } else { b'.' }),
                None => return false,
            },
            Var::Ssl(v) => return crate::tls::vars::eval(self.conn.tls.info(), *v, out),
            Var::Request => out.extend_from_slice(r.line()),
            // An internal redirect that turned the request into a GET
            // (error_page, X-Accel-Redirect) renames it, as nginx's
            // method_name.
            Var::RequestMethod if self.method == Method::Get && r.method != Method::Get => {
                out.extend_from_slice(b"GET")
            }
            Var::RequestMethod => out.extend_from_slice(r.method_raw().as_bytes()),
            Var::RequestLength => response::push_num(out, r.head_len as u64),
            Var::DocumentRoot => out.extend_from_slice(&self.root()),
            Var::RequestFilename => out.extend_from_slice(&self.request_filename()),
            Var::ContentType => match r.header("content-type") {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
            Var::ContentLength => match r.header("content-length") {
                Some(v) => out.extend_from_slice(v),
                None => return crate::http::body::content_length_var(self, out),
            },
            Var::Connection => response::push_num(out, self.conn.id),
            Var::ConnectionRequests => response::push_num(out, self.conn.requests),
            Var::ConnectionTime => {
                let e = self.conn.started.elapsed();
                out.extend_from_slice(
                    format!("{}.{:03}", e.as_secs(), e.subsec_millis()).as_bytes(),
                );
            }
            Var::RequestId => out.extend_from_slice(&self.request_id()),
            Var::Pid => response::push_num(out, std::process::id() as u64),
            Var::NginxVersion => out.extend_from_slice(response::NGINX_VERSION.as_bytes()),
            Var::TernVersion => out.extend_from_slice(response::VERSION.as_bytes()),
            Var::TimeLocal => out.extend_from_slice(&crate::http::date::time_local()),
            Var::TimeIso8601 => out.extend_from_slice(&crate::http::date::time_iso8601()),
            Var::Msec => {
                let d = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                out.extend_from_slice(
                    format!("{}.{:03}", d.as_secs(), d.subsec_millis()).as_bytes(),
                );
            }
            Var::RequestTime => {
                let e = self.start.elapsed();
                out.extend_from_slice(
                    format!("{}.{:03}", e.as_secs(), e.subsec_millis()).as_bytes(),
                );
            }
            Var::Capture(n) => match self.captures.get(*n).copied().flatten() {
                Some((s, e)) => out.extend_from_slice(self.capture_src.get(s..e).unwrap_or(b"")),
                None => return false,
            },
            Var::Cookie(name) => match cookie(r, name.as_bytes()) {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
            Var::RealpathRoot => {
                let root = self.root();
                match std::fs::canonicalize(std::path::Path::new(std::ffi::OsStr::from_bytes(
                    &root,
                ))) {
                    Ok(p) => out.extend_from_slice(p.as_os_str().as_bytes()),
                    Err(_) => return false,
                }
            }
            Var::TernIo => out.extend_from_slice(sent.io.as_bytes()),
            Var::Status => {
                if sent.status == 0 {
                    out.extend_from_slice(b"000");
                } else {
                    response::push_num(out, sent.status as u64)
                }
            }
            Var::BodyBytesSent => response::push_num(out, sent.body_bytes),
            Var::RequestCompletion => {
                if sent.complete {
                    out.extend_from_slice(b"OK");
                }
            }
            Var::BytesSent => response::push_num(out, sent.bytes),
            Var::UpstreamHttp(name) => match self
                .upstream_headers
                .as_deref()
                .and_then(|hs| hs.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)))
            {
                Some((_, v)) => out.extend_from_slice(v),
                None => return false,
            },
            Var::UpstreamCookie(name) => match self
                .upstream_headers
                .as_deref()
                .and_then(|hs| upstream_cookie(hs, name.as_bytes()))
            {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
            // nginx 1.22 joins the values of these two (its multi-value
            // headers_out fields) with ", "; other names give the first.
            Var::SentHttp(name) if name == "cache-control" || name == "link" => {
                let mut found = false;
                for v in sent_headers(&sent.head, name.as_bytes()) {
                    if found {
                        out.extend_from_slice(b", ");
                    }
                    out.extend_from_slice(v);
                    found = true;
                }
                return found;
            }
            Var::SentHttp(name) => match sent_header(&sent.head, name.as_bytes()) {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
            Var::SentTrailer(name) => match sent
                .trailers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                Some((_, v)) => out.extend_from_slice(v),
                None => return false,
            },
            Var::User(i) => {
                if let Some(Some(v)) = self.user_vars.borrow().get(*i) {
                    out.extend_from_slice(v);
                    return true;
                }
                let vars = &self.http.main.vars;
                if let Some(d) = vars.def(*i) {
                    if !d.cacheable() {
                        return d.eval(self, out);
                    }
                    let start = out.len();
                    let found = d.eval(self, out);
                    if found {
                        if let Some(slot) = self.user_vars.borrow_mut().get_mut(*i) {
                            *slot = Some(out[start..].to_vec());
                        }
                    }
                    return found;
                }
                if !vars.set_only(*i) {
                    return false;
                }
                if let Some(v) = vars.fallback(*i) {
                    return self.var(v, out);
                }
                if self.loc.modules.rewrite.uninitialized_variable_warn != Some(false) {
                    self.log(
                        Level::Warn,
                        &format!("using uninitialized \"{}\" variable", vars.name(*i)),
                    );
                }
                // nginx keeps the empty value it substituted, so a request
                // warns once per variable, and the value counts as found
                // (an access log shows it empty, not "-").
                if let Some(slot) = self.user_vars.borrow_mut().get_mut(*i) {
                    *slot = Some(Vec::new());
                }
            }
            Var::Module(m) => return modules::module_var(self, *m, out),
            // An http table never resolves to stream variables.
            Var::Stream(_) => return false,
            Var::ProxyProtocol(p) => {
                return self.conn.proxy.as_ref().is_some_and(|h| h.render(p, out))
            }
        }
        true
    }
}

fn cookie<'r>(r: &'r Request, name: &[u8]) -> Option<&'r [u8]> {
    for h in r.headers().filter(|h| h.is("cookie")) {
        for part in h.value.split(|&c| c == b';') {
            let part = part.trim_ascii_start();
            if let Some(rest) = part.strip_prefix(name) {
                if let Some(v) = rest.strip_prefix(b"=") {
                    return Some(v);
                }
            }
        }
    }
    None
}

/// A header value from a written head (`$sent_http_NAME`).
fn sent_header<'h>(head: &'h [u8], lname: &'h [u8]) -> Option<&'h [u8]> {
    sent_headers(head, lname).next()
}

/// Every value of a header in a written head, in order.
fn sent_headers<'h>(head: &'h [u8], lname: &'h [u8]) -> impl Iterator<Item = &'h [u8]> + 'h {
    head.split(|&c| c == b'\n').skip(1).filter_map(move |line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = memchr::memchr(b':', line)?;
        line[..colon]
            .eq_ignore_ascii_case(lname)
            .then(|| line[colon + 1..].trim_ascii())
    })
}

/// A size given with variables, as nginx evaluates one: a value that is
/// not a size is logged and counts as 0. `None` for a fixed size (the
/// location's value applies as it is).
fn eval_size(cx: &Ctx<'_>, v: Option<&crate::http::conf::SizeValue>) -> Option<u64> {
    let Some(crate::http::conf::SizeValue::Vars(t)) = v else {
        return None;
    };
    let text = t.render_vec(cx);
    match std::str::from_utf8(&text)
        .ok()
        .and_then(crate::config::value::size)
    {
        Some(n) => Some(n),
        None => {
            cx.log(
                Level::Error,
                &format!(
                    "invalid size \"{}\" while sending response to client",
                    String::from_utf8_lossy(&text)
                ),
            );
            Some(0)
        }
    }
}

/// The value `Set-Cookie` headers give cookie `name` (the first that
/// names it; names compare case-insensitively, as nginx's).
fn upstream_cookie<'h>(hs: &'h [(String, Vec<u8>)], name: &[u8]) -> Option<&'h [u8]> {
    hs.iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie"))
        .find_map(|(_, v)| {
            let first = v.split(|&c| c == b';').next()?;
            let eq = memchr::memchr(b'=', first)?;
            // Spaces around the name and value, not tabs (nginx's parser).
            let spaces = |v: &'h [u8]| -> &'h [u8] {
                let s = v.iter().position(|&c| c != b' ').unwrap_or(v.len());
                let e = v.iter().rposition(|&c| c != b' ').map_or(s, |e| e + 1);
                &v[s..e.max(s)]
            };
            spaces(&first[..eq])
                .eq_ignore_ascii_case(name)
                .then(|| spaces(&first[eq + 1..]))
        })
}
