//! An HTTP/2 connection: the h2 handshake, the accept loop, and each
//! stream run through the protocol-neutral request path (see the module
//! doc of [`crate::http::v2`] for the picture).

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use tokio::time::timeout;

use crate::core::log::Level;
use crate::core::stream::Stream;
use crate::core::worker::WorkerShared;
use crate::http::body::BodyIo;
use crate::http::conf::{LocConf, SrvConf};
use crate::http::phases;
use crate::http::request::Request;
use crate::http::response::{self, Body, Piece, Response};
use crate::http::serve::{log_conn, ConnInfo};
use crate::http::v1::parse::Reject;
use crate::http::v2::guard::Guard;
use crate::http::v2::hpack;
use crate::http::v2::io::{Io, Outbox};

/// What the accept loop and its stream tasks share.
struct Streams {
    /// Streams being served.
    active: Cell<usize>,
    /// A stream ended (the idle timer may start).
    ended: tokio::sync::Notify,
}

/// Serves an HTTP/2 connection until it closes. `pre`: bytes already read
/// from it (the preface, on a cleartext listener).
pub async fn serve<S: Stream>(
    stream: &S,
    info: &ConnInfo,
    shared: &Arc<WorkerShared>,
    pre: Vec<u8>,
) {
    let config = shared.config.load_full();
    let Some(http) = config.http.clone() else {
        return;
    };
    let Some(addr) = http.addr_for(&info.listen, info.local) else {
        return;
    };
    let srv = &addr.default.srv;
    let core = &addr.default.conf.core;
    let (hnum, hsize) = srv.large_buffers();
    let mut b = h2::server::Builder::new();
    b.max_concurrent_streams(srv.http2.max_streams())
        .initial_window_size(srv.http2.preread())
        // The connection window: enough for every stream's preread.
        .initial_connection_window_size(
            srv.http2
                .preread()
                .saturating_mul(srv.http2.max_streams().max(1))
                .clamp(65535, i32::MAX as u32),
        )
        // nginx limits a request's header list by
        // large_client_header_buffers, counting names and values (see
        // `too_large`); h2 counts 32 bytes more per field (RFC 9113), so
        // its bound is looser, and still ends an HPACK bomb or a
        // CONTINUATION flood.
        .max_header_list_size(
            hsize
                .saturating_mul(hnum)
                .saturating_mul(2)
                .saturating_add(8192)
                .min(u32::MAX as usize) as u32,
        )
        // Rapid reset (CVE-2023-44487): streams the client opens and
        // cancels before they are served are bounded, past that GOAWAY.
        .max_pending_accept_reset_streams(20)
        .max_local_error_reset_streams(Some(1024))
        .max_send_buffer_size(
            srv.http2
                .recv_buffer_size
                .unwrap_or(256 * 1024)
                .max(16 * 1024),
        );
    let header_to = Duration::from_millis(srv.header_timeout_ms());
    let ka = core.keepalive.map_or(75_000, |k| k.timeout_ms);
    let max_requests = core.keepalive_requests.unwrap_or(1000);
    let keepalive_time = core.keepalive_time.map(Duration::from_millis);
    let reset_timedout = core.reset_timedout_connection.unwrap_or(false);
    let send_to = Duration::from_millis(core.send_timeout.unwrap_or(60_000));
    let default_conf = addr.default.conf.clone();
    let max_streams = srv.http2.max_streams();
    let preread = srv.http2.preread();
    drop((addr, http, config));
    let limits = hpack::Limits {
        field: hsize,
        list: hsize.saturating_mul(hnum),
    };
    let guard = Rc::new(Guard::new(max_streams, header_to, limits, preread));
    let out = Outbox::new(stream, &guard);
    let io = Io::new(stream, &guard, &out, pre);
    let mut hs = std::pin::pin!(b.handshake::<_, Bytes>(io));
    let hs = poll_fn(|cx| flushed(hs.as_mut().poll(cx), &out, &guard, cx));
    let mut conn = match timeout(header_to, hs).await {
        Ok(Ok(c)) => c,
        Ok(Err(_)) => return,
        Err(_) => {
            log_conn(
                &default_conf,
                Level::Info,
                info,
                "client timed out (110: Connection timed out) while reading client request headers",
            );
            if reset_timedout {
                stream.set_linger_zero();
            }
            return;
        }
    };
    let streams = Rc::new(Streams {
        active: Cell::new(0),
        ended: tokio::sync::Notify::new(),
    });
    let mut quit = shared.quit.clone();
    let mut expired = shared.expired.clone();
    let mut closing = false;
    let mut requests: u64 = 0;
    let mut lingering = false;
    loop {
        let idle = streams.active.get() == 0 && !closing;
        // keepalive_timeout (0: GOAWAY as soon as a stream ends; before
        // the first one, client_header_timeout then).
        let idle_wait = if requests == 0 && ka == 0 {
            header_to
        } else {
            Duration::from_millis(ka)
        };
        let ended = streams.ended.notified();
        tokio::select! {
            r = poll_fn(|cx| flushed(conn.poll_accept(cx), &out, &guard, cx)) => match r {
                Some(Ok((req, respond))) => {
                    requests += 1;
                    streams.active.set(streams.active.get() + 1);
                    let aged = keepalive_time.is_some_and(|t| info.started.elapsed() >= t);
                    let mut info = info.clone();
                    info.requests = requests;
                    let shared = shared.clone();
                    let st = streams.clone();
                    let g = guard.clone();
                    // Boxed: the stream's future is large (the whole
                    // request path), and the task moves what it is
                    // given more than once; a box moves as a pointer.
                    tokio::task::spawn_local(Box::pin(async move {
                        let _done = Ended(st);
                        stream_task(req, respond, info, shared, g).await;
                    }));
                    // keepalive_requests / keepalive_time: this stream is
                    // the last, then GOAWAY.
                    if (requests >= max_requests || aged) && !closing {
                        conn.graceful_shutdown();
                        closing = true;
                    }
                }
                Some(Err(e)) => {
                    if !e.is_io() && !e.is_go_away() {
                        log_conn(&default_conf, Level::Info, info, &format!("client sent invalid HTTP/2 frames ({})", e));
                    }
                    break;
                }
                // h2 has closed the connection after a GOAWAY (ours, or
                // the peer's) with no stream left: its last bytes are
                // out, and the close lingers as below.
                None => {
                    lingering = true;
                    break;
                }
            },
            _ = ended => {}
            _ = guard.tripped.notified() => {
                // What the guard made before it tripped goes to h2 first
                // (a failed request's stand-in: the GOAWAY names its
                // stream); such streams are held, unanswered, until the
                // connection is gone.
                let mut held = Vec::new();
                while let Poll::Ready(Some(Ok(s))) =
                    poll_fn(|cx| Poll::Ready(flushed(conn.poll_accept(cx), &out, &guard, cx))).await
                {
                    held.push(s);
                }
                if let Some(t) = guard.trip() {
                    log_conn(&default_conf, Level::Info, info, t.log);
                    conn.abrupt_shutdown(t.reason);
                }
                // The GOAWAY may wait behind what the flood made (its PING
                // ACKs): flush while the socket takes bytes, as a graceful
                // close does, then linger, so that the client's unread
                // frames do not turn the close into a reset that loses it.
                flush_out(&mut conn, &out, &guard, send_to).await;
                drop(held);
                lingering = true;
                break;
            }
            _ = tokio::time::sleep(idle_wait), if idle => {
                if guard.busy() {
                    // A frame is part-way in: not idle.
                    continue;
                }
                // keepalive_timeout with no stream open: GOAWAY, and the
                // connection closes once the peer has seen it.
                conn.graceful_shutdown();
                closing = true;
            }
            _ = quit.changed(), if !closing => {
                // Graceful stop: GOAWAY; streams in flight finish.
                conn.graceful_shutdown();
                closing = true;
            }
            _ = expired.wait_for(|e| *e) => {
                // worker_shutdown_timeout ran out: the connection closes
                // now, as nginx closes it (its streams log themselves).
                break;
            }
        }
        if closing && streams.active.get() == 0 {
            // Let the GOAWAY and what h2 still holds of the last answers
            // go out (a stream's task ends once its last DATA is queued,
            // not sent).
            flush_out(&mut conn, &out, &guard, send_to).await;
            lingering = true;
            break;
        }
    }
    if lingering {
        // As nginx, a lingering close: what the client still sends (a
        // PING, a WINDOW_UPDATE) is read and dropped, so that it does not
        // turn the close into a reset that loses the end of the last
        // response (still in the socket's buffers) on the client's side.
        crate::http::v1::conn::linger(stream, &default_conf).await;
    }
}

/// Drives h2 towards its close so that what it holds (a GOAWAY, the end of
/// the last answers) goes out: while the socket takes bytes, up to
/// `send_to` (send_timeout); a second with nothing written ends the wait
/// (a client that stopped reading, or h2 waiting for the rest of a frame
/// the client began before it ends).
async fn flush_out<S: Stream, T>(
    conn: &mut h2::server::Connection<T, Bytes>,
    out: &Outbox<'_, S>,
    guard: &Guard,
    send_to: Duration,
) where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let until = tokio::time::Instant::now() + send_to;
    loop {
        let before = out.written();
        let closed = timeout(
            Duration::from_secs(1),
            poll_fn(|cx| flushed(conn.poll_closed(cx), out, guard, cx)),
        )
        .await;
        if closed.is_ok() || out.written() == before || tokio::time::Instant::now() >= until {
            break;
        }
    }
}

/// `r`, a poll of the h2 connection, after sending what that poll wrote
/// (h2's writes are gathered until then, see [`Outbox`]). A socket that
/// fails here fails h2's next read or write as well.
fn flushed<S: Stream, T>(
    r: Poll<T>,
    out: &Outbox<'_, S>,
    guard: &Guard,
    cx: &mut std::task::Context<'_>,
) -> Poll<T> {
    let _ = out.poll_flush(cx);
    if out.pong_due() && guard.at_frame_boundary() {
        // h2 reads its shutdown PING's answer on its next poll (in the
        // middle of a client's frame it waits for the rest of it).
        cx.waker().wake_by_ref();
    }
    r
}

/// Counts a stream out when its task ends, however it ends.
struct Ended(Rc<Streams>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.active.set(self.0.active.get().saturating_sub(1));
        self.0.ended.notify_one();
    }
}

/// The request body as the body reader (`http::body`) reads a
/// connection: bytes of DATA frames as they come, flow-control window given
/// back as they are taken. Without a content-length the body is presented
/// chunked (the request says so), so the reader's size limits apply as
/// they do to an HTTP/1.1 chunked body.
struct H2Body {
    st: RefCell<BodyState>,
}

struct BodyState {
    rx: RecvStream,
    pending: Bytes,
    chunked: bool,
    eof: bool,
    /// The request's Content-Length, and the DATA bytes so far: h2 is
    /// not told the length (see `guard`), so the body is held to it
    /// here, as nginx holds it.
    declared: Option<u64>,
    got: u64,
    /// More DATA came than declared: the body reader answers 400.
    over: bool,
    /// The DATA did not match the length (RFC 9113 8.1.1: malformed).
    malformed: bool,
}

impl H2Body {
    /// Whether the DATA did not match the Content-Length.
    fn malformed(&self) -> bool {
        self.st.borrow().malformed
    }
}

/// The error the body reader answers with 400 and nginx's "client
/// intended to send body data larger than declared".
fn larger_than_declared() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "larger than declared")
}

impl BodyIo for H2Body {
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.st.borrow_mut();
        if s.pending.is_empty() {
            if s.over {
                return Err(larger_than_declared());
            }
            if s.eof {
                return Ok(0);
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = s.pending.len().min(buf.len());
        let piece = s.pending.split_to(n);
        buf[..n].copy_from_slice(&piece);
        Ok(n)
    }
    fn readable(&self) -> Pin<Box<dyn Future<Output = io::Result<()>> + '_>> {
        Box::pin(poll_fn(move |cx| {
            let mut s = self.st.borrow_mut();
            loop {
                if s.over {
                    return Poll::Ready(Err(larger_than_declared()));
                }
                if !s.pending.is_empty() || s.eof {
                    return Poll::Ready(Ok(()));
                }
                match s.rx.poll_data(cx) {
                    Poll::Ready(Some(Ok(data))) => {
                        let _ = s.rx.flow_control().release_capacity(data.len());
                        if data.is_empty() {
                            continue;
                        }
                        s.got += data.len() as u64;
                        if s.declared.is_some_and(|d| s.got > d) {
                            s.over = true;
                            s.malformed = true;
                            continue;
                        }
                        if s.chunked {
                            let mut v = Vec::with_capacity(data.len() + 16);
                            v.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                            v.extend_from_slice(&data);
                            v.extend_from_slice(b"\r\n");
                            s.pending = Bytes::from(v);
                        } else {
                            s.pending = data;
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, e)));
                    }
                    Poll::Ready(None) => {
                        s.eof = true;
                        if s.declared.is_some_and(|d| s.got < d) {
                            // The reader answers 400 ("client prematurely
                            // closed stream").
                            s.malformed = true;
                        }
                        if s.chunked {
                            s.pending = Bytes::from_static(b"0\r\n\r\n");
                        }
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
        }))
    }
    // `Expect: 100-continue` needs no answer over HTTP/2: the window is
    // the client's permission to send.
    fn try_write(&self, data: &[u8]) -> io::Result<usize> {
        Ok(data.len())
    }
    fn writable(&self) -> Pin<Box<dyn Future<Output = io::Result<()>> + '_>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn try_flush(&self) -> io::Result<()> {
        Ok(())
    }
}

/// How much of an unread body is read before the answer goes without
/// waiting for the rest: more than one DATA frame of the default size is
/// an upload, not the small body of a protocol check (h2spec sends such a
/// body, then a malformed end or frames on the stream, and expects the
/// stream to be open until then; nginx answers at once).
const UPLOAD: usize = 16 * 1024;

/// Reads the body and drops it, to its end or until more than `enough`
/// bytes came; the reset reason when the peer broke the stream (or
/// `PROTOCOL_ERROR` when it went quiet longer than `each`, as nginx).
async fn drain(body: &H2Body, each: Duration, enough: usize) -> Result<(), h2::Reason> {
    let mut taken = 0;
    let declared = body.st.borrow().declared;
    while taken <= enough {
        let next = timeout(each, poll_fn(|cx| body.st.borrow_mut().rx.poll_data(cx))).await;
        match next {
            Ok(Some(Ok(d))) => {
                taken += d.len();
                // A body longer or shorter than its Content-Length is
                // malformed: the stream is reset (as h2 did when it knew
                // the length).
                if declared.is_some_and(|l| taken as u64 > l) {
                    return Err(h2::Reason::PROTOCOL_ERROR);
                }
                let _ = body
                    .st
                    .borrow_mut()
                    .rx
                    .flow_control()
                    .release_capacity(d.len());
            }
            Ok(Some(Err(e))) => return Err(e.reason().unwrap_or(h2::Reason::PROTOCOL_ERROR)),
            Ok(None) if declared.is_some_and(|l| (taken as u64) < l) => {
                return Err(h2::Reason::PROTOCOL_ERROR)
            }
            Ok(None) => return Ok(()),
            // client_body_timeout: nginx resets with PROTOCOL_ERROR.
            Err(_) => return Err(h2::Reason::PROTOCOL_ERROR),
        }
    }
    Ok(())
}

/// The pseudo-headers of a request as the h2 (or h3) crate hands it over.
pub(crate) fn pseudo(parts: &http::request::Parts) -> crate::http::fields::Pseudo<'_> {
    crate::http::fields::Pseudo {
        method: parts.method.as_str().as_bytes(),
        path: parts
            .uri
            .path_and_query()
            .map_or(&b""[..], |p| p.as_str().as_bytes()),
        authority: parts.uri.authority().map(|a| a.as_str().as_bytes()),
    }
}

/// The fields of a request as `fields::request` walks them.
pub(crate) type FieldIter<'a> = std::iter::Map<
    http::header::Iter<'a, http::HeaderValue>,
    fn((&'a http::HeaderName, &'a http::HeaderValue)) -> (&'a [u8], &'a [u8]),
>;

/// The fields of a request in the order h2 (or h3) keeps them (each
/// name's values together, names in the order they first came).
pub(crate) fn fields<'a>(parts: &'a http::request::Parts) -> impl Fn() -> FieldIter<'a> + 'a {
    move || parts.headers.iter().map(field as fn(_) -> _)
}

fn field<'a>((n, v): (&'a http::HeaderName, &'a http::HeaderValue)) -> (&'a [u8], &'a [u8]) {
    (n.as_str().as_bytes(), v.as_bytes())
}

async fn stream_task(
    req: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    info: ConnInfo,
    shared: Arc<WorkerShared>,
    guard: Rc<Guard>,
) {
    let config = shared.config.load_full();
    let Some(http) = config.http.clone() else {
        return;
    };
    let http = &http;
    let Some(addr) = http.addr_for(&info.listen, info.local) else {
        return;
    };
    // The connection task goes on with the frames that came with this
    // HEADERS (a WINDOW_UPDATE, a RST_STREAM) before the request runs.
    tokio::task::yield_now().await;
    let stream_id = u32::from(respond.stream_id());
    let Some(head) = guard.take_head(stream_id) else {
        // Its header block is gone (the client opened far more streams
        // than are served at once): refused.
        respond.send_reset(h2::Reason::REFUSED_STREAM);
        return;
    };
    if head.failed {
        // Its block could not be decoded: the connection is ending.
        return;
    }
    if guard.late(stream_id) {
        // Its headers took longer than client_header_timeout: nginx
        // resets the stream (and the connection goes on).
        log_conn(
            &addr.default.conf,
            Level::Info,
            &info,
            "client timed out (110: Connection timed out) while reading client request headers",
        );
        respond.send_reset(h2::Reason::PROTOCOL_ERROR);
        return;
    }
    if head.early {
        // As nginx: a body may not come before the client has taken
        // tern's SETTINGS (its smaller preread window).
        log_conn(
            &addr.default.conf,
            Level::Info,
            &info,
            "client sent stream with data before settings were acknowledged",
        );
        respond.send_reset(h2::Reason::REFUSED_STREAM);
        return;
    }
    let (_, rx) = req.into_parts();
    shared.stats.request();
    let _writing = crate::core::worker::StateGuard::enter(&shared.stats.writing);
    let has_body = !rx.is_end_stream();
    let mut req: Request = match request_of(&head.block, has_body, &addr.default.srv) {
        Ok(r) => r,
        Err(mut rej) => {
            if rej.host.is_none() {
                rej.host = host_in(&head.block).map(<[u8]>::to_vec);
            }
            if rej.status == 400 {
                // Malformed (RFC 9113 8.1.1): nginx's 400, then the
                // stream error the RFC asks for.
                guard.reset_after_answer(stream_id);
            }
            phases::refused(&mut respond, rej, http, &addr, &info, &shared).await;
            return;
        }
    };
    drop(head.block);
    // $request_length: the header block as it came (HPACK bytes).
    req.head_len = head.len;
    if has_body && req.content_length.is_none() {
        req.chunked = true;
    }
    let body_io = H2Body {
        st: RefCell::new(BodyState {
            rx,
            pending: Bytes::new(),
            chunked: req.chunked,
            eof: !has_body,
            declared: req.content_length,
            got: 0,
            over: false,
            malformed: false,
        }),
    };
    let server = addr.select(req.host()).clone();
    if server.srv.http2.enable == Some(false) {
        // The request names a server with `http2 off`: 421, as nginx.
        log_conn(
            &server.conf,
            Level::Info,
            &info,
            "client attempted to request the server name with HTTP/2 disabled",
        );
        let mut resp = Response::status(421);
        response::special_response(&mut resp, &server.conf);
        let mut sent = phases::Sent::default();
        let _ = send(&mut respond, &mut resp, &server.conf, false, &mut sent).await;
        return;
    }
    let mut cx = phases::Ctx::new(http, &req, &server, &info, &shared);
    if has_body {
        cx.body = Some(crate::http::body::ReqBody::new(&body_io, Vec::new()));
    }
    let since = cx.start;
    let mut resp = tokio::select! {
        biased;
        r = phases::run(&mut cx) => r,
        () = shared.cut_off(since) => {
            // worker_shutdown_timeout ran out before the answer: the
            // request ends as one the client closed (nginx logs 499).
            end_expired(&mut cx, &mut respond, 499);
            return;
        }
    };
    if body_io.malformed() {
        guard.reset_after_answer(stream_id);
    }
    let mut scratch = Vec::new();
    let body_end = crate::http::body::give_back(&mut cx, &mut scratch);
    let loc = cx.loc.clone();
    if let crate::http::body::End::Broken { silent: true, .. } = body_end {
        phases::log_done(&mut cx, resp.status);
        // As nginx: a body that timed out resets with PROTOCOL_ERROR.
        respond.send_reset(h2::Reason::PROTOCOL_ERROR);
        return;
    }
    if resp.close_silently {
        phases::log_done(&mut cx, resp.status);
        respond.send_reset(h2::Reason::INTERNAL_ERROR);
        return;
    }
    // A body nobody read is read (and dropped) before the answer, each
    // wait bounded by client_body_timeout, so that a malformed end of it
    // (a length that does not match, pseudo-headers in trailers, a reset)
    // resets the stream rather than being answered. An upload, past
    // UPLOAD bytes, is not waited for to its end, as nginx: the answer
    // goes, and when the stream's handles are dropped after it h2 tells
    // the client to stop sending with RST_STREAM(NO_ERROR) (RFC 9113 8.1).
    if has_body && body_end == crate::http::body::End::Unread {
        let to = Duration::from_millis(loc.core.client_body_timeout.unwrap_or(60_000));
        if let Err(reason) = drain(&body_io, to, UPLOAD).await {
            cx.sent.status = resp.status;
            respond.send_reset(reason);
            return;
        }
    }
    let head_only = req.method == crate::http::request::Method::Head;
    let r = tokio::select! {
        biased;
        r = send(&mut respond, &mut resp, &loc, head_only, &mut cx.sent) => r,
        () = shared.cut_off(since) => {
            // worker_shutdown_timeout ran out while the answer was going
            // out: logged with its status and the bytes sent so far.
            end_expired(&mut cx, &mut respond, resp.status);
            return;
        }
    };
    if r.is_err() {
        respond.send_reset(h2::Reason::INTERNAL_ERROR);
    } else {
        cx.sent.complete = true;
        guard.served();
    }
    phases::wrap_up(&mut cx, resp.status, r.is_ok()).await;
}

/// Ends a stream cut short by worker_shutdown_timeout: reset (the
/// connection closes anyway), logged with `status`.
fn end_expired(cx: &mut phases::Ctx<'_>, respond: &mut SendResponse<Bytes>, status: u16) {
    respond.send_reset(h2::Reason::INTERNAL_ERROR);
    phases::log_done(cx, status);
}

/// The host a request names: its Host field, else `:authority`.
pub(crate) fn host_of(parts: &http::request::Parts) -> Option<&[u8]> {
    parts
        .headers
        .get(http::header::HOST)
        .map(|h| h.as_bytes())
        .or_else(|| parts.uri.authority().map(|a| a.as_str().as_bytes()))
}

/// HTTP/2's framing of an answer to a refused request (see
/// [`phases::refused`]).
impl phases::StreamAnswer for SendResponse<Bytes> {
    fn send<'s>(
        &'s mut self,
        resp: &'s mut Response,
        loc: &'s LocConf,
        head_only: bool,
        sent: &'s mut phases::Sent,
    ) -> impl std::future::Future<Output = io::Result<()>> + 's {
        send(self, resp, loc, head_only, sent)
    }
    fn reset(&mut self) {
        self.send_reset(h2::Reason::INTERNAL_ERROR);
    }
}

/// Sends the response: HEADERS, then the body as DATA (files read through
/// the file-I/O layer, in `http2_chunk_size` pieces, through the body
/// filters), then trailers if any.
async fn send(
    respond: &mut SendResponse<Bytes>,
    resp: &mut Response,
    loc: &LocConf,
    head_only: bool,
    sent: &mut phases::Sent,
) -> io::Result<()> {
    let (head, text) = response::field_list_head(resp, loc, b"HTTP/2.0");
    sent.bytes = text.len() as u64;
    sent.head = text;
    let no_body = head_only
        || (resp.filters.is_empty()
            && match &resp.body {
                Body::Empty => true,
                Body::Bytes(b) => b.is_empty(),
                Body::Shared(b) => b.is_empty(),
                _ => false,
            });
    let mut tx = respond
        .send_response(head, no_body && resp.trailers.is_empty())
        .map_err(h2_io)?;
    if no_body {
        if !resp.trailers.is_empty() && !head_only {
            tx.send_trailers(trailers(&resp.trailers)).map_err(h2_io)?;
        }
        return Ok(());
    }
    let policy = resp.io.take().unwrap_or_default();
    // A body whose end may bring trailers keeps the stream open until then.
    let late_trailers = matches!(&resp.body, Body::Stream(s) if s.has_trailers());
    let mut late = Vec::new();
    let mut out = Out {
        tx: &mut tx,
        to: Duration::from_millis(loc.core.send_timeout.unwrap_or(60_000)),
        chunk: loc.core.http2_chunk_size.unwrap_or(8192),
        sent,
        trailers: !resp.trailers.is_empty() || late_trailers,
        carry: Bytes::new(),
    };
    let mut filters = std::mem::take(&mut resp.filters);
    let body = std::mem::take(&mut resp.body);
    let piece = loc.io.output_buffers().1.max(1) as u64;
    let r = async {
        match body {
            Body::Stream(mut src) => loop {
                match src.next().await? {
                    Some(data) => out.filtered(&mut filters, &data, false).await?,
                    None => {
                        late = src.trailers();
                        return out.filtered(&mut filters, b"", true).await;
                    }
                }
            },
            Body::Empty => out.filtered(&mut filters, b"", true).await,
            Body::Bytes(b) => {
                if filters.is_empty() {
                    out.data(Bytes::from(b), true).await
                } else {
                    out.filtered(&mut filters, &b, true).await
                }
            }
            Body::Shared(b) => {
                if filters.is_empty() {
                    out.data(b, true).await
                } else {
                    out.filtered(&mut filters, &b, true).await
                }
            }
            Body::File { file, offset, len } => {
                out.pieces(
                    &[Piece::File { file, offset, len }],
                    &mut filters,
                    piece,
                    &policy,
                )
                .await
            }
            Body::Multi(p) => out.pieces(&p, &mut filters, piece, &policy).await,
        }
    }
    .await;
    sent.io = policy.decision().as_str();
    r?;
    let mut all = std::mem::take(&mut resp.trailers);
    all.append(&mut late);
    if !all.is_empty() {
        tx.send_trailers(trailers(&all)).map_err(h2_io)?;
    } else if late_trailers {
        // None came after all: the stream ends with an empty DATA frame.
        tx.send_data(Bytes::new(), true).map_err(h2_io)?;
    }
    Ok(())
}

fn trailers(list: &[(String, Vec<u8>)]) -> http::HeaderMap {
    let mut hm = http::HeaderMap::new();
    for (n, v) in list {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(n.as_bytes()),
            http::HeaderValue::from_bytes(v),
        ) {
            hm.append(n, v);
        }
    }
    hm
}

fn h2_io(e: h2::Error) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, e)
}

/// A response body on its way out as DATA frames.
struct Out<'o> {
    tx: &'o mut SendStream<Bytes>,
    to: Duration,
    chunk: usize,
    sent: &'o mut phases::Sent,
    /// Trailers follow: the last DATA does not end the stream.
    trailers: bool,
    /// The tail of a file read that the window cut short: it goes out
    /// with the next read, in one frame, as nginx's would.
    carry: Bytes,
}

impl Out<'_> {
    /// Sends `data`, waiting (at most send_timeout each time) for the
    /// peer's flow-control window; `last` ends the stream.
    async fn data(&mut self, data: Bytes, last: bool) -> io::Result<()> {
        self.send_data(data, last, false).await
    }

    /// [`Out::data`]; `hold`: more of a file follows at once, so a tail
    /// shorter than a chunk that would wait for the window is kept for
    /// the next read instead of going out as a frame of its own.
    async fn send_data(&mut self, mut data: Bytes, last: bool, hold: bool) -> io::Result<()> {
        let end = last && !self.trailers;
        self.sent.body_bytes += data.len() as u64;
        self.sent.bytes += data.len() as u64;
        if !self.carry.is_empty() {
            let mut v = Vec::with_capacity(self.carry.len() + data.len());
            v.extend_from_slice(&self.carry);
            v.extend_from_slice(&data);
            self.carry = Bytes::new();
            data = Bytes::from(v);
        }
        if data.is_empty() {
            if end {
                self.tx.send_data(data, true).map_err(h2_io)?;
            }
            return Ok(());
        }
        while !data.is_empty() {
            if hold && data.len() < self.chunk && self.tx.capacity() < data.len() {
                self.carry = data;
                return Ok(());
            }
            let want = data.len().min(self.chunk);
            self.tx.reserve_capacity(want);
            let cap = match timeout(self.to, poll_fn(|cx| self.tx.poll_capacity(cx))).await {
                Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "send_timeout")),
                Ok(None) => return Err(io::ErrorKind::ConnectionAborted.into()),
                Ok(Some(Err(e))) => return Err(h2_io(e)),
                Ok(Some(Ok(n))) => n,
            };
            if cap == 0 {
                continue;
            }
            let piece = data.split_to(cap.min(want));
            self.tx
                .send_data(piece, end && data.is_empty())
                .map_err(h2_io)?;
        }
        Ok(())
    }

    /// Passes `input` through the body filters and sends what comes out.
    async fn filtered(
        &mut self,
        filters: &mut [Box<dyn response::BodyFilter>],
        input: &[u8],
        last: bool,
    ) -> io::Result<()> {
        if filters.is_empty() {
            return self.data(Bytes::copy_from_slice(input), last).await;
        }
        let mut out = Vec::new();
        response::run_filters(filters, input, last, &mut out)?;
        self.data(Bytes::from(out), last).await
    }

    /// Sends pieces (bytes, file ranges read through the file-I/O layer a
    /// buffer at a time), through the filters when there are any.
    async fn pieces(
        &mut self,
        pieces: &[Piece],
        filters: &mut [Box<dyn response::BodyFilter>],
        buf: u64,
        policy: &crate::io::Policy,
    ) -> io::Result<()> {
        let n_pieces = pieces.len();
        if n_pieces == 0 {
            return self.filtered(filters, b"", true).await;
        }
        for (i, p) in pieces.iter().enumerate() {
            let last_piece = i + 1 == n_pieces;
            match p {
                Piece::Bytes(b) => self.filtered(filters, b, last_piece).await?,
                Piece::File { file, offset, len } => {
                    let (mut off, end) = (*offset, offset + len);
                    if off == end {
                        self.filtered(filters, b"", last_piece).await?;
                    }
                    while off < end {
                        let n = (end - off).min(buf.max(self.chunk as u64));
                        let data = crate::io::read(file, off, n as usize, policy).await?;
                        if data.is_empty() {
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "file was truncated while being sent",
                            ));
                        }
                        off += data.len() as u64;
                        let last = last_piece && off >= end;
                        if filters.is_empty() {
                            self.send_data(data, last, !last).await?;
                        } else {
                            self.filtered(filters, &data, last).await?;
                        }
                        tokio::task::consume_budget().await;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The host a request's fields name: its Host field, else `:authority`.
fn host_in(b: &hpack::Block) -> Option<&[u8]> {
    let mut authority = None;
    for (n, v) in b.fields() {
        if n == b"host" {
            return Some(v);
        }
        if n == b":authority" {
            authority = Some(v);
        }
    }
    authority
}

/// Whether `m` is a method nginx knows, or one of its characters.
fn method_ok(m: &[u8]) -> bool {
    const KNOWN: [&[u8]; 16] = [
        b"GET",
        b"POST",
        b"HEAD",
        b"OPTIONS",
        b"PROPFIND",
        b"PUT",
        b"MKCOL",
        b"DELETE",
        b"COPY",
        b"MOVE",
        b"PROPPATCH",
        b"LOCK",
        b"UNLOCK",
        b"PATCH",
        b"TRACE",
        b"CONNECT",
    ];
    KNOWN.contains(&m)
        || m.iter()
            .all(|&c| c.is_ascii_uppercase() || c == b'_' || c == b'-')
}

/// A request's fields judged as nginx judges an HTTP/2 request's, field
/// by field in the order they came (ngx_http_v2_state_process_header:
/// names and values, the pseudo-headers, then what the request as a
/// whole must have), then built by `fields::request` (the checks all
/// protocols share). Every refusal here is a 400 (the request is
/// malformed).
fn request_of(b: &hpack::Block, has_body: bool, srv: &SrvConf) -> Result<Request, Reject> {
    let underscores = srv.underscores_in_headers.unwrap_or(false);
    let bad = |log: &'static str, detail: Option<&[u8]>| Reject {
        status: 400,
        log,
        in_headers: true,
        detail: detail.map(<[u8]>::to_vec),
        ..Default::default()
    };
    let mut method: Option<&[u8]> = None;
    let mut scheme: Option<&[u8]> = None;
    let mut path: Option<&[u8]> = None;
    let mut authority: Option<&[u8]> = None;
    let mut regular = false;
    let mut host = false;
    let mut content_length: Option<&[u8]> = None;
    let mut te = 0;
    let missing = |method: Option<&[u8]>, scheme: Option<&[u8]>, path: Option<&[u8]>| {
        if method.is_none() {
            Err(bad("client sent no :method header", None))
        } else if scheme.is_none() {
            Err(bad("client sent no :scheme header", None))
        } else if path.is_none() {
            Err(bad("client sent no :path header", None))
        } else {
            Ok(())
        }
    };
    for (n, v) in b.fields() {
        let pseudo = n.first() == Some(&b':');
        for &c in &n[usize::from(pseudo)..] {
            let fine = c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || c == b'-'
                || (c == b'_' && underscores);
            if !fine && (c <= 0x20 || c == 0x7f || c == b':' || c.is_ascii_uppercase()) {
                return Err(bad("client sent invalid header name", Some(n)));
            }
        }
        if v.iter().any(|&c| c == 0 || c == b'\n' || c == b'\r') {
            return Err(bad("client sent header with invalid value", Some(n)));
        }
        if pseudo {
            if regular {
                return Err(bad("client sent out of order pseudo-headers", None));
            }
            let (slot, what) = match &n[1..] {
                b"method" => (&mut method, "client sent duplicate :method header"),
                b"scheme" => (&mut scheme, "client sent duplicate :scheme header"),
                b"path" => (&mut path, "client sent duplicate :path header"),
                b"authority" => (
                    &mut authority,
                    "client sent duplicate \":authority\" header",
                ),
                _ => return Err(bad("client sent unknown pseudo-header", Some(n))),
            };
            if slot.is_some() {
                return Err(bad(what, None));
            }
            *slot = Some(v);
            match &n[1..] {
                b"method" if v.is_empty() => {
                    return Err(bad("client sent empty :method header", None))
                }
                b"method" if !method_ok(v) => {
                    return Err(bad("client sent invalid method", Some(v)))
                }
                b"scheme" if v.is_empty() => {
                    return Err(bad("client sent empty :scheme header", None))
                }
                b"scheme" => {
                    let ok = v.iter().enumerate().all(|(i, &c)| {
                        c.is_ascii_alphabetic()
                            || (i > 0 && (c.is_ascii_digit() || matches!(c, b'+' | b'-' | b'.')))
                    });
                    if !ok {
                        return Err(bad("client sent invalid :scheme header", Some(v)));
                    }
                }
                b"path" if v.is_empty() => return Err(bad("client sent empty :path header", None)),
                b"path" if v[0] != b'/' || v.iter().any(|&c| c <= 0x20 || c == 0x7f) => {
                    return Err(bad("client sent invalid :path header", Some(v)));
                }
                b"authority" if crate::http::request::validate_host(v).is_none() => {
                    return Err(bad("client sent invalid \":authority\" header", None));
                }
                _ => {}
            }
            continue;
        }
        if !regular {
            regular = true;
            missing(method, scheme, path)?;
        }
        match n {
            b"host" => host = true,
            b"content-length" => content_length = Some(v),
            b"connection" => return Err(bad("client sent \"Connection\" header", None)),
            b"keep-alive" => return Err(bad("client sent \"Keep-Alive\" header", None)),
            b"transfer-encoding" => {
                return Err(bad("client sent \"Transfer-Encoding\" header", None))
            }
            b"upgrade" => return Err(bad("client sent \"Upgrade\" header", None)),
            b"te" => {
                te += 1;
                if te > 1 || !v.eq_ignore_ascii_case(b"trailers") {
                    return Err(bad("client sent invalid \"TE\" header", None));
                }
            }
            _ => {}
        }
    }
    missing(method, scheme, path)?;
    if authority.is_none() && !host {
        return Err(bad(
            "client sent neither \":authority\" nor \"Host\" header",
            None,
        ));
    }
    if let (Some(cl), false) = (content_length, has_body) {
        let n = std::str::from_utf8(cl)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if n.is_some_and(|n| n > 0) {
            return Err(bad("client prematurely closed stream", None));
        }
    }
    crate::http::fields::request(
        crate::http::fields::Pseudo {
            method: method.unwrap_or_default(),
            path: path.unwrap_or_default(),
            authority,
        },
        || b.fields().filter(|(n, _)| n.first() != Some(&b':')),
        b"HTTP/2.0",
        srv,
    )
}
