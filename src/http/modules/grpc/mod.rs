//! `grpc_pass` and the `grpc_*` directives (nginx's ngx_http_grpc_module):
//! gRPC services behind tern, over an HTTP/2 client to the backend (the
//! `h2` crate), on the upstream engine ([`crate::http::upstream`]) as a
//! protocol with its own [`Session`].
//!
//! # A call
//!
//! ```text
//! content phase (the client speaks HTTP/2, or HTTP/1.1)
//!   ├─ the request body (the client's messages): streamed as it arrives
//!   │   (body::stream_begin; read whole only when already read, mirror)
//!   ├─ the engine: peers, grpc_next_upstream, timeouts, $upstream_* ─┐
//!   │                                                                 │
//!   │   Grpc::exchange on each connection the engine makes (+ TLS    ◀┘
//!   │   with ALPN h2 for grpcs://):
//!   │     h2 handshake ── HEADERS :method :scheme :path :authority,
//!   │     grpc_set_header entries, the client's headers (hop-by-hop and
//!   │     Host dropped; te: trailers) ── DATA (each piece of the client's
//!   │     body as the engine's pump hands it over, as the backend's
//!   │     window allows) ── response HEADERS (grpc_connect/_send/
//!   │     _read_timeout apply)
//!   └─ the engine's response: headers relayed (grpc_hide_header /
//!       _pass_header), grpc_intercept_errors; the body is an [`Answer`]:
//!       DATA pieces as they arrive (window released as the client's
//!       connection takes them), then the trailers (grpc-status), which
//!       the writer sends after the body (HTTP/2 trailers, chunked
//!       trailers to HTTP/1.1)
//! ```
//!
//! Flow control never buffers without bound: the client's body moves one
//! piece at a time, only when the backend's window has room (the client's
//! own window stays closed meanwhile), and the answer's DATA is released
//! to the backend only as the client takes it. A call is half-duplex:
//! once the answer's head arrives, the rest of the client's stream is not
//! sent (see DIFFERENCES.md). With `keepalive` in the upstream block, a
//! connection whose call ended cleanly (both streams closed, no GOAWAY
//! seen) is kept, as nginx keeps it, and the next call to that peer opens
//! its stream there ([`Kept`]).
//!
//! The backend's bytes reach the h2 client through [`hpack_mend::Mend`],
//! which accepts the over-padded Huffman strings nginx's decoder accepts
//! (the h2 crate alone would reject the connection for them).

mod hpack_mend;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::body;
use crate::http::conf::{merge_opts, HttpMain, LocConf};
use crate::http::phases::Ctx;
use crate::http::response::{BodyStream, Response, StreamFuture};
use crate::http::upstream::conf::{Limits, Slot, UpstreamConf};
use crate::http::upstream::fetch::{fail, Outgoing, TIMED_OUT, WHILE_HEAD};
use crate::http::upstream::peers::{self, PassAddr};
use crate::http::upstream::{ssl, state};
use crate::http::upstream::{
    BodyDecoder, BodyRx, Caching, Fail, Head, HeadReader, OutBody, Protocol, Request, Session,
    SessionAnswer, SessionConn,
};
use crate::http::vars::Template;

const LOC: u32 = ctx::LOC | ctx::LIF;
const HSL: u32 = ctx::HSL;

/// grpc's [`UpstreamConf`] in a location.
pub struct Up;

impl Slot for Up {
    fn conf(l: &mut LocConf) -> &mut UpstreamConf {
        &mut l.modules.grpc.up
    }

    fn get(l: &LocConf) -> &UpstreamConf {
        &l.modules.grpc.up
    }
}

pub const DIRECTIVES: &[Spec] = crate::upstream_directives_core!(
    Up,
    "grpc",
    tls,
    [
        row("grpc_pass", LOC, Args::take(1), set_pass),
        row("grpc_set_header", HSL, Args::take(2), set_header),
        row(
            "grpc_intercept_errors",
            HSL,
            Args::Flag,
            crate::http::upstream::conf::set_flag::<Up>
        ),
        row(
            "grpc_hide_header",
            HSL,
            Args::take(1),
            crate::http::upstream::conf::set_hide_pass::<Up>
        ),
        row(
            "grpc_pass_header",
            HSL,
            Args::take(1),
            crate::http::upstream::conf::set_hide_pass::<Up>
        ),
        row(
            "grpc_ignore_headers",
            HSL,
            Args::AtLeast(1),
            crate::http::upstream::conf::set_ignore_headers::<Up>
        ),
    ]
);

const fn row(
    name: &'static str,
    ctx: u32,
    args: Args,
    f: fn(&mut LocConf, &Directive, &mut Compiler) -> ConfResult<()>,
) -> Spec {
    Spec {
        name,
        ctx,
        args,
        set: Setter::Loc(f),
    }
}

// ---- configuration ----------------------------------------------------------

/// A compiled `grpc_pass [grpc://|grpcs://]ADDRESS`.
#[derive(Debug)]
pub struct GrpcPass {
    pub addr: PassAddr,
    /// `grpcs://`: TLS (with ALPN h2) to the backend.
    pub tls: bool,
    /// The address as written: `:authority` and the TLS name by default.
    pub authority: String,
}

/// Location-level settings.
#[derive(Debug, Clone, Default)]
pub struct GrpcLoc {
    pub pass: Option<Arc<GrpcPass>>,
    /// The shared upstream settings (the engine's `grpc_*` rows).
    pub up: UpstreamConf,
    /// `grpc_set_header` entries in order (a level with any replaces the
    /// inherited list).
    pub headers: Option<Arc<Vec<(String, Template)>>>,
}

impl GrpcLoc {
    pub fn merge(&mut self, p: &GrpcLoc) {
        merge_opts!(self, p; pass, headers);
        self.up.merge(&p.up);
    }
}

fn set_pass(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.grpc.pass.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let url = arg(d, 0);
    let lower = url.to_ascii_lowercase();
    let (tls, rest) = if lower.starts_with("grpc://") {
        (false, &url[7..])
    } else if lower.starts_with("grpcs://") {
        (true, &url[8..])
    } else if lower.contains("://") {
        return Err(ConfError::at(
            format!("invalid URL prefix in \"{}\"", url),
            d,
        ));
    } else {
        (false, url)
    };
    if rest.is_empty() {
        return Err(ConfError::at(format!("no host in \"{}\"", url), d));
    }
    let addr = peers::pass_addr(d, cx, rest, "grpc_temp")?;
    l.modules.grpc.pass = Some(Arc::new(GrpcPass {
        addr,
        tls,
        authority: rest.to_string(),
    }));
    l.content = Some(content);
    Ok(())
}

/// Whether a location's `grpc_pass` may use TLS (`grpcs://`, or an
/// address with variables, which may render one): its `grpc_ssl_*`
/// settings are then checked, as nginx does.
pub fn may_use_tls(l: &LocConf) -> bool {
    l.modules
        .grpc
        .pass
        .as_ref()
        .is_some_and(|p| p.tls || matches!(p.addr.to, peers::PassTo::Var(_)))
}

/// nginx's `no port in upstream "NAME"` (see [`peers::check_pass`]).
pub fn check_pass(own: &LocConf, hm: &HttpMain, block: &[Directive]) -> ConfResult<()> {
    peers::check_pass(
        own.modules.grpc.pass.as_deref().map(|p| &p.addr),
        hm,
        block,
        "grpc_pass",
    )
}

fn set_header(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let v = cx.template(arg(d, 1), d)?;
    let list = l.modules.grpc.headers.get_or_insert_with(Default::default);
    Arc::make_mut(list).push((arg(d, 0).to_string(), v));
    Ok(())
}

// ---- the content handler ----------------------------------------------------

/// Headers nginx hides from the client by default for grpc.
const HIDDEN: &[&str] = &[
    "date",
    "server",
    "x-accel-expires",
    "x-accel-redirect",
    "x-accel-limit-rate",
    "x-accel-buffering",
    "x-accel-charset",
];

/// The client's headers that never go upstream (HTTP/2 forbids the
/// connection-specific ones; Host becomes `:authority`).
const NOT_SENT: &[&str] = &[
    "host",
    "connection",
    "transfer-encoding",
    "keep-alive",
    "expect",
    "upgrade",
    "proxy-connection",
    "te",
    "content-length",
];

/// The content handler `grpc_pass` puts in its location's slot.
pub fn content<'a>(cx: &'a mut Ctx<'_>) -> Pin<Box<dyn Future<Output = Response> + 'a>> {
    Box::pin(handle(cx))
}

async fn handle(cx: &mut Ctx<'_>) -> Response {
    let loc = cx.loc.clone();
    let Some(pass) = loc.modules.grpc.pass.clone() else {
        return Response::status(500);
    };
    let conf = &loc.modules.grpc;
    // As nginx's grpc module, the body always goes upstream as it
    // arrives (request_body_no_buffering): a streaming call's messages
    // are not held back. A body read already (mirror) goes from memory.
    let mut stream = match body::stream_begin(cx).await {
        Ok(Some(s)) => Some(s),
        Ok(None) => {
            if let Err(r) = body::read(cx, &pass.addr.body_temp_default).await {
                return *r;
            }
            None
        }
        Err(r) => return *r,
    };
    // With variables, the value may carry its own scheme (`grpc_pass
    // $arg_b` with `grpcs://...`); the address is also the authority.
    let (up, tls, authority) = match &pass.addr.to {
        peers::PassTo::Var(t) => {
            let v = t.render_vec(&*cx);
            let v = String::from_utf8_lossy(&v).into_owned();
            let lower = v.to_ascii_lowercase();
            let (tls, rest) = if lower.starts_with("grpc://") {
                (false, &v[7..])
            } else if lower.starts_with("grpcs://") {
                (true, &v[8..])
            } else {
                (pass.tls, &v[..])
            };
            (
                peers::upstream_by_value(cx, rest).await,
                tls,
                rest.to_string(),
            )
        }
        to => (
            peers::upstream_of(cx, to).await,
            pass.tls,
            pass.authority.clone(),
        ),
    };
    let Some(up) = up else {
        if let Some(s) = stream {
            s.finish(cx);
        }
        return Response::status(502);
    };
    let mut lim = Limits::of(&conf.up);
    // The name to check is the authority's host; a gRPC server speaks
    // nothing but h2, offered by ALPN.
    let alpn: &[&[u8]] = &[b"h2"];
    if tls {
        let ssl = &conf.up.ssl;
        if let Err(r) = ssl::attach(cx, ssl, &authority, alpn, &mut lim, &mut stream).await {
            return *r;
        }
    }
    let call = call_head(cx, conf, &authority);
    let proto = Arc::new(Grpc {
        loc: loc.clone(),
        pass,
        tls,
        call,
    });
    crate::http::upstream::run::run_with(cx, proto, up, lim, stream).await
}

/// What goes in the call's HEADERS frame.
struct CallHead {
    method: http::Method,
    path: Vec<u8>,
    /// None: `grpc_set_header Host` took its place (sent as `host`).
    authority: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

fn call_head(cx: &Ctx<'_>, conf: &GrpcLoc, authority: &str) -> CallHead {
    let method =
        http::Method::from_bytes(cx.req.method_raw().as_bytes()).unwrap_or(http::Method::POST);
    // The URI as the client sent it (nginx's r->unparsed_uri), or the
    // current one after a rewrite.
    let unchanged = *cx.uri == *cx.req.uri() && cx.args.as_deref() == cx.req.args();
    let path = if unchanged && cx.req.raw_uri().starts_with(b"/") {
        cx.req.raw_uri().to_vec()
    } else {
        let mut out = Vec::new();
        crate::http::uri::escape_uri(&cx.uri, &mut out);
        if let Some(a) = &cx.args {
            out.push(b'?');
            out.extend_from_slice(a);
        }
        out
    };
    let user: &[(String, Template)] = conf.headers.as_deref().map_or(&[], |v| v.as_slice());
    let mut authority = Some(authority.as_bytes().to_vec());
    let mut headers = Vec::new();
    for (n, t) in user {
        let v = t.render_vec(cx);
        if n.eq_ignore_ascii_case("host") {
            authority = None;
        }
        if !v.is_empty() {
            headers.push((n.to_ascii_lowercase(), v));
        }
    }
    if conf.up.pass_request_headers.unwrap_or(true) {
        for h in cx.req.headers() {
            let lower = h.name.to_ascii_lowercase();
            let lower = String::from_utf8_lossy(&lower).into_owned();
            if NOT_SENT.contains(&lower.as_str())
                || user.iter().any(|(n, _)| n.eq_ignore_ascii_case(&lower))
            {
                continue;
            }
            headers.push((lower, h.value.to_vec()));
        }
    }
    // gRPC needs trailers; nginx sends `te: trailers` when the client did.
    if cx
        .req
        .header("te")
        .is_some_and(|v| crate::http::upstream::response::has_token(v, "trailers"))
    {
        headers.push(("te".into(), b"trailers".to_vec()));
    }
    CallHead {
        method,
        path,
        authority,
        headers,
    }
}

/// gRPC to one request's upstream.
struct Grpc {
    loc: Arc<LocConf>,
    pass: Arc<GrpcPass>,
    /// grpcs:// (the pass's, or the scheme its value rendered with).
    tls: bool,
    call: CallHead,
}

impl Protocol for Grpc {
    fn conf(&self) -> &UpstreamConf {
        &self.loc.modules.grpc.up
    }

    fn url(&self, peer: &str) -> String {
        let scheme = if self.tls { "grpcs" } else { "grpc" };
        format!("{}://{}", scheme, peer)
    }

    fn create_request(
        &self,
        cx: &Ctx<'_>,
        _: Option<Caching<'_>>,
    ) -> Result<Request, Box<Response>> {
        let body = match body::data(cx) {
            _ if body::streaming(cx) => OutBody::Stream,
            Some(body::Data::Mem(b)) if !b.is_empty() => OutBody::Mem(Bytes::clone(b)),
            Some(body::Data::File { file, len, .. }) if *len > 0 => {
                OutBody::File(file.clone(), *len)
            }
            _ => OutBody::None,
        };
        Ok(Request {
            head: Vec::new(),
            body,
        })
    }

    fn head_reader(&self, _: bool, _: usize) -> Box<dyn HeadReader> {
        // Never fed: the session reads the answer.
        Box::new(NoHead)
    }

    fn hidden(&self) -> &'static [&'static str] {
        HIDDEN
    }

    fn cache_key(&self, _: &Ctx<'_>) -> Vec<u8> {
        Vec::new()
    }

    fn temp_default(&self) -> &Path {
        &self.pass.addr.temp_default
    }

    fn session(&self) -> Option<&dyn Session> {
        Some(self)
    }
}

struct NoHead;

impl HeadReader for NoHead {
    fn feed(&mut self, _: &[u8]) -> Result<Option<Head>, Fail> {
        Err(fail(502, "upstream sent no valid HTTP/2 answer", false))
    }
}

/// The body of a session's answer: complete with the head.
struct Whole;

impl BodyDecoder for Whole {
    fn feed(&mut self, _: &[u8], _: &mut Vec<u8>) -> Result<(), Fail> {
        Ok(())
    }

    fn done(&self) -> bool {
        true
    }
}

impl Session for Grpc {
    fn exchange<'a>(
        &'a self,
        conn: SessionConn,
        keep: Option<peers::KeepTo>,
        send: &'a Outgoing<'a>,
        lim: &'a Limits,
        slot: &'a state::Slot,
        body: Option<BodyRx>,
    ) -> Pin<Box<dyn Future<Output = Result<SessionAnswer, Fail>> + Send + 'a>> {
        Box::pin(call(self, conn, keep, send, lim, slot, body))
    }
}

/// A connection kept for the next call (upstream `keepalive`): the h2
/// client's handle (its driver task runs on, answering the peer's PINGs
/// and SETTINGS meanwhile) and whether the peer said GOAWAY.
struct Kept {
    client: h2::client::SendRequest<Bytes>,
    going: Arc<AtomicBool>,
}

impl Kept {
    /// Back to the upstream's cache, unless the peer is going away.
    fn put(self, to: peers::KeepTo) {
        if !self.going.load(Ordering::Relaxed) {
            to.put(Box::new(self));
        }
    }
}

/// nginx's wording for an HTTP/2 failure on the upstream connection: a
/// broken connection is an `error`, a stream the peer reset or refused
/// (or a protocol error) an `invalid_header` for grpc_next_upstream.
fn h2_fail(e: &h2::Error, context: &str) -> Fail {
    if e.is_io() {
        return fail(
            502,
            format!("upstream connection failed ({}) {}", e, context),
            true,
        );
    }
    let msg = match e.reason() {
        // Found wrong here (the h2 client answered with GOAWAY): a header
        // block that does not decode is nginx's "invalid encoded header".
        Some(h2::Reason::COMPRESSION_ERROR) if e.is_library() => {
            format!("upstream sent invalid encoded header {}", context)
        }
        Some(r) if e.is_library() => {
            format!("upstream sent invalid HTTP/2 data ({}) {}", r, context)
        }
        Some(r) => format!(
            "upstream rejected request with error {} {}",
            u32::from(r),
            context
        ),
        None => format!("upstream sent invalid HTTP/2 data ({}) {}", e, context),
    };
    crate::http::upstream::fetch::invalid_header(&msg)
}

fn timed_out(context: &str) -> Fail {
    fail(504, format!("{} {}", TIMED_OUT, context), true)
}

async fn within<T>(
    d: Duration,
    context: &str,
    f: impl Future<Output = Result<T, h2::Error>>,
) -> Result<T, Fail> {
    match tokio::time::timeout(d, f).await {
        Err(_) => Err(timed_out(context)),
        Ok(Err(e)) => Err(h2_fail(&e, context)),
        Ok(Ok(v)) => Ok(v),
    }
}

const WHILE_SEND: &str = "while sending request to upstream";
const WHILE_READ: &str = "while reading upstream";

/// One call, on a new connection or a kept one. A failure before the
/// request went has `sent` unset (a kept connection found closed: the
/// engine tries a new one); after, set.
async fn call(
    g: &Grpc,
    conn: SessionConn,
    keep: Option<peers::KeepTo>,
    send: &Outgoing<'_>,
    lim: &Limits,
    slot: &state::Slot,
    body: Option<BodyRx>,
) -> Result<SessionAnswer, Fail> {
    let (client, going) = match conn {
        SessionConn::Fresh(s) => {
            let going = Arc::new(AtomicBool::new(false));
            let io = hpack_mend::Mend::new(s, going.clone());
            let (client, conn) = within(
                lim.connect,
                "while connecting to upstream",
                h2::client::Builder::new().handshake::<_, Bytes>(io),
            )
            .await?;
            // The connection's driver; it ends when both ends are dropped.
            tokio::spawn(async move {
                let _ = conn.await;
            });
            (client, going)
        }
        SessionConn::Kept(k) => match k.downcast::<Kept>() {
            Ok(k) => (k.client, k.going),
            Err(_) => return Err(fail(502, "", false)),
        },
    };
    if going.load(Ordering::Relaxed) {
        return Err(fail(
            502,
            format!("upstream connection closed {}", WHILE_SEND),
            true,
        ));
    }
    let client = within(lim.connect, WHILE_SEND, client.ready()).await?;
    let kept = Kept {
        client: client.clone(),
        going,
    };
    send_call(g, client, kept, keep, send, lim, slot, body)
        .await
        .map_err(|f| Fail { sent: true, ..f })
}

/// The call's request and the head of its answer, on a ready client.
#[allow(clippy::too_many_arguments)]
async fn send_call(
    g: &Grpc,
    mut client: h2::client::SendRequest<Bytes>,
    kept: Kept,
    keep: Option<peers::KeepTo>,
    send: &Outgoing<'_>,
    lim: &Limits,
    slot: &state::Slot,
    body: Option<BodyRx>,
) -> Result<SessionAnswer, Fail> {
    let scheme = if g.tls { "https" } else { "http" };
    let authority = g.call.authority.as_deref().unwrap_or(b"localhost");
    let mut uri = Vec::with_capacity(authority.len() + g.call.path.len() + 8);
    uri.extend_from_slice(scheme.as_bytes());
    uri.extend_from_slice(b"://");
    uri.extend_from_slice(authority);
    uri.extend_from_slice(&g.call.path);
    let uri = http::Uri::try_from(uri).map_err(|_| {
        fail(
            502,
            format!("invalid request URI for upstream {}", WHILE_SEND),
            false,
        )
    })?;
    let mut req = http::Request::new(());
    *req.method_mut() = g.call.method.clone();
    *req.uri_mut() = uri;
    {
        let hm = req.headers_mut();
        for (n, v) in &g.call.headers {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(n.as_bytes()),
                http::HeaderValue::from_bytes(v),
            ) {
                hm.append(n, v);
            }
        }
        if let Some(n) = body_len(send.body) {
            hm.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(n));
        }
    }
    let empty = matches!(send.body, OutBody::None);
    let (answer, mut tx) = client
        .send_request(req, empty)
        .map_err(|e| h2_fail(&e, WHILE_SEND))?;
    // The body goes out as the peer's window allows.
    if !empty {
        let sending = async {
            match body {
                Some(rx) => send_stream(&mut tx, rx, lim, slot).await,
                None => send_body(&mut tx, send, lim, slot).await,
            }
        };
        // A server may answer (an error, usually) before it took the
        // whole body: then the rest is not sent.
        tokio::pin!(sending);
        tokio::pin!(answer);
        let early = tokio::select! {
            r = &mut sending => { r?; None }
            r = &mut answer => Some(r),
        };
        let (resp, sent_all) = match early {
            Some(r) => {
                let resp = r.map_err(|e| h2_fail(&e, WHILE_HEAD))?;
                // An answer that is more than a final status: the rest of
                // the client's body goes first (a call is half-duplex
                // here, see the module docs); meanwhile the answer's DATA
                // waits in the backend's window.
                let more = !resp.body().is_end_stream();
                if more {
                    sending.await?;
                }
                (resp, more)
            }
            None => (within(lim.read, WHILE_HEAD, answer).await?, true),
        };
        // A stream our side did not finish is not a clean end: such a
        // connection is not kept.
        let keep = keep.filter(|_| sent_all);
        return read_answer(resp, lim, slot, keep.map(|k| (k, kept))).await;
    }
    let resp = within(lim.read, WHILE_HEAD, answer).await?;
    read_answer(resp, lim, slot, keep.map(|k| (k, kept))).await
}

fn body_len(b: &OutBody) -> Option<u64> {
    match b {
        OutBody::None | OutBody::Stream => None,
        OutBody::Mem(b) => Some(b.len() as u64),
        OutBody::File(_, n) => Some(*n),
    }
}

/// Sends the request body (from memory or its temp file) with END_STREAM
/// on the last piece, waiting for window within grpc_send_timeout.
async fn send_body(
    tx: &mut h2::SendStream<Bytes>,
    send: &Outgoing<'_>,
    lim: &Limits,
    slot: &state::Slot,
) -> Result<(), Fail> {
    let total = body_len(send.body).unwrap_or(0);
    let mut off = 0u64;
    while off < total {
        let mut piece = match send.body {
            OutBody::Mem(b) => b.slice(off as usize..),
            OutBody::File(f, len) => {
                let n = (*len - off).min(64 * 1024) as usize;
                let data = crate::io::read(f, off, n, send.policy).await.map_err(|e| {
                    fail(
                        500,
                        format!(
                            "client request body temp file read failed {}",
                            crate::core::errno_text(&e)
                        ),
                        false,
                    )
                })?;
                if data.is_empty() {
                    return Err(fail(
                        500,
                        "client request body temp file was truncated",
                        false,
                    ));
                }
                data
            }
            OutBody::None | OutBody::Stream => break,
        };
        while !piece.is_empty() {
            tx.reserve_capacity(piece.len());
            let cap = within(
                lim.send,
                WHILE_SEND,
                std::future::poll_fn(|c| match tx.poll_capacity(c) {
                    std::task::Poll::Ready(None) => std::task::Poll::Ready(Ok(0)),
                    std::task::Poll::Ready(Some(r)) => std::task::Poll::Ready(r),
                    std::task::Poll::Pending => std::task::Poll::Pending,
                }),
            )
            .await?;
            if cap == 0 {
                return Err(fail(
                    502,
                    format!("upstream closed the stream {}", WHILE_SEND),
                    true,
                ));
            }
            let chunk = piece.split_to(cap.min(piece.len()));
            off += chunk.len() as u64;
            slot.sent(chunk.len());
            let last = off >= total;
            tx.send_data(chunk, last)
                .map_err(|e| h2_fail(&e, WHILE_SEND))?;
        }
    }
    Ok(())
}

/// Sends the client's body as it arrives: each piece as soon as the
/// peer's window allows, END_STREAM with the last (an empty DATA frame
/// when the body ended after its last piece, as nginx's special last
/// buffer). One piece at a time: what the peer does not take holds the
/// client back (its own window stays closed), nothing piles up here.
async fn send_stream(
    tx: &mut h2::SendStream<Bytes>,
    mut rx: BodyRx,
    lim: &Limits,
    slot: &state::Slot,
) -> Result<(), Fail> {
    loop {
        let (mut piece, last) = match rx.recv().await {
            Some(Ok(p)) => p,
            // Logged by the feed; the client's status, not the peer's fault.
            Some(Err(st)) => return Err(fail(st, "", false)),
            None => return Err(fail(400, "", false)),
        };
        if piece.is_empty() {
            if last {
                tx.send_data(Bytes::new(), true)
                    .map_err(|e| h2_fail(&e, WHILE_SEND))?;
                return Ok(());
            }
            continue;
        }
        while !piece.is_empty() {
            tx.reserve_capacity(piece.len());
            let cap = within(
                lim.send,
                WHILE_SEND,
                std::future::poll_fn(|c| match tx.poll_capacity(c) {
                    std::task::Poll::Ready(None) => std::task::Poll::Ready(Ok(0)),
                    std::task::Poll::Ready(Some(r)) => std::task::Poll::Ready(r),
                    std::task::Poll::Pending => std::task::Poll::Pending,
                }),
            )
            .await?;
            if cap == 0 {
                return Err(fail(
                    502,
                    format!("upstream closed the stream {}", WHILE_SEND),
                    true,
                ));
            }
            let chunk = piece.split_to(cap.min(piece.len()));
            slot.sent(chunk.len());
            let end = last && piece.is_empty();
            tx.send_data(chunk, end)
                .map_err(|e| h2_fail(&e, WHILE_SEND))?;
        }
        if last {
            return Ok(());
        }
    }
}

/// The answer's head; its body (the messages) and then its trailers
/// follow as they arrive ([`Answer`]).
async fn read_answer(
    resp: http::Response<h2::RecvStream>,
    lim: &Limits,
    _slot: &state::Slot,
    keep: Option<(peers::KeepTo, Kept)>,
) -> Result<SessionAnswer, Fail> {
    let (parts, rx) = resp.into_parts();
    let status = parts.status.as_u16();
    let mut headers = Vec::with_capacity(parts.headers.len());
    for (n, v) in &parts.headers {
        headers.push((n.as_str().to_string(), v.as_bytes().to_vec()));
    }
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let no_body = rx.is_end_stream();
    let mut keep = keep;
    if no_body {
        // The whole answer is in: the connection may serve another call.
        if let Some((to, k)) = keep.take() {
            k.put(to);
        }
    }
    let body: Option<Box<dyn BodyStream>> = (!no_body).then(|| {
        Box::new(Answer {
            rx,
            read: lim.read,
            trailers: Vec::new(),
            done: false,
            keep,
        }) as Box<dyn BodyStream>
    });
    Ok(SessionAnswer {
        head: Head {
            status,
            status_line: Vec::new(),
            headers,
            early: Vec::new(),
            body: Vec::new(),
            declared_len: declared,
            no_body,
            keep: false,
            decoder: Box::new(Whole),
        },
        trailers: Vec::new(),
        body,
    })
}

/// The answer's DATA as the client's body, piece by piece as it arrives
/// (each piece's window given back to the backend once the client's
/// connection asks for the next: the backend is held back by a slow
/// client, nothing piles up here), then its trailers (grpc-status).
struct Answer {
    rx: h2::RecvStream,
    read: Duration,
    trailers: Vec<(String, Vec<u8>)>,
    done: bool,
    /// Where the connection goes once the answer ended cleanly.
    keep: Option<(peers::KeepTo, Kept)>,
}

fn read_error(what: String) -> std::io::Error {
    std::io::Error::other(format!("{} {}", what, WHILE_READ))
}

impl BodyStream for Answer {
    fn next(&mut self) -> Pin<Box<dyn StreamFuture<'_> + '_>> {
        Box::pin(async move {
            loop {
                if self.done {
                    return Ok(None);
                }
                match tokio::time::timeout(self.read, self.rx.data()).await {
                    Err(_) => return Err(read_error(TIMED_OUT.to_string())),
                    Ok(Some(Err(e))) => return Err(read_error(format!("{}", e))),
                    Ok(Some(Ok(d))) => {
                        let _ = self.rx.flow_control().release_capacity(d.len());
                        if !d.is_empty() {
                            return Ok(Some(d));
                        }
                    }
                    Ok(None) => {
                        match tokio::time::timeout(self.read, self.rx.trailers()).await {
                            Err(_) => return Err(read_error(TIMED_OUT.to_string())),
                            Ok(Err(e)) => return Err(read_error(format!("{}", e))),
                            Ok(Ok(Some(t))) => {
                                for (n, v) in &t {
                                    self.trailers
                                        .push((n.as_str().to_string(), v.as_bytes().to_vec()));
                                }
                            }
                            Ok(Ok(None)) => {}
                        }
                        self.done = true;
                        if let Some((to, k)) = self.keep.take() {
                            k.put(to);
                        }
                        return Ok(None);
                    }
                }
            }
        })
    }

    fn ready(&self) -> bool {
        self.done
    }

    fn has_trailers(&self) -> bool {
        true
    }

    fn trailers(&mut self) -> Vec<(String, Vec<u8>)> {
        std::mem::take(&mut self.trailers)
    }
}
