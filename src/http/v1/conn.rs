//! The HTTP/1.1 connection: read a head, run the request, write the
//! response, keep alive or close.
//!
//! ```text
//!            +-------------------------------------------+
//!            v                                           |
//!  [Idle: wait first byte] --bytes--> [ReadingHead] --complete--> [Handling]
//!   | keepalive_timeout / QUIT + 1 s      | client_header_timeout      |
//!   v                                     v (close, 408 logged)        v
//!  close                                 close                 [Writing] --send_timeout--> close
//!                                                                      |
//!                                         keepalive && !quit && n < keepalive_requests
//! ```
//! A response carrying an upgrade (a proxied 101) leaves Handling for a
//! tunnel ([`crate::http::tunnel`]) with the bytes after the request, and
//! the connection closes when the tunnel ends (the request is logged then).
//!
//! Invariants: the read buffer holds only bytes not yet consumed (pipelined
//! requests stay in it); it is freed while the connection idles; a request
//! uses the configuration that was current when its head was complete, so
//! a reload applies from the next request on a kept-alive connection.

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::timeout;

use crate::core::log::Level;
pub use crate::core::stream::Stream;
use crate::core::worker::WorkerShared;
use crate::http::conf::{AddrConf, LocConf, SizeValue};
use crate::http::phases;
use crate::http::request::{self, Reject, Request};
use crate::http::response::{self, Body, Response};
use crate::http::serve::{idle_params, log_conn, ConnInfo, IdleWait, Served, PARK_AFTER};
use crate::http::v1::chunked::ChunkedDecoder;

/// Resolves when the client hangs up (EOF or an error); never once it
/// has sent more bytes (they belong to the next request), nor if the
/// stream cannot tell.
pub(crate) async fn hangup<S: Stream>(stream: &S) {
    loop {
        if stream.readable().await.is_err() {
            return;
        }
        match stream.peek_hangup() {
            Ok(true) => return,
            Ok(false) => std::future::pending::<()>().await,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
    }
}

enum HeadResult {
    Head(usize),
    Closed,
    TimedOut,
    Reject(Reject),
}

/// Serves one connection until it closes or idles long enough to be
/// parked. `resume` is the wait a parked connection was in.
///
/// The request future ([`request`]: phases, handlers, writers, ~3 KiB)
/// lives inside this one, not in a box of its own: the future runs on one
/// of the worker's reusable runners (`core::worker`), so its size is paid
/// once per runner, while a box was a large allocation (glibc's slow path)
/// and a copy on every request. An idle connection gives its runner back
/// after [`PARK_AFTER`], when it is parked. `read`: bytes of the first
/// request already read (while the protocol was chosen), else empty.
pub(crate) async fn serve<S: Stream>(
    stream: S,
    mut info: ConnInfo,
    shared: Arc<WorkerShared>,
    resume: Option<IdleWait>,
    read: Vec<u8>,
) -> Served<S> {
    // Bytes already here: no first wait to resume.
    let resume = if read.is_empty() { resume } else { None };
    match serve_on(&stream, &mut info, shared, resume, read).await {
        Some(wait) => Served::Idle(stream, info, wait),
        None => {
            stream.close();
            Served::Closed
        }
    }
}

/// How long an idle keep-alive connection stays open after a graceful
/// stop (QUIT, a binary upgrade) for a request that may already be on its
/// way. nginx closes such connections at once, and a client that had just
/// sent its next request sees the connection reset.
const QUIT_GRACE: Duration = Duration::from_millis(1000);

/// How much earlier than [`PARK_AFTER`] an idle connection may be parked
/// so that its timer need not be re-armed for every request.
const PARK_SLACK: Duration = Duration::from_millis(250);

/// [`serve`]'s loop: None when the connection is done, else the idle wait
/// to park it with.
async fn serve_on<S: Stream>(
    stream: &S,
    info: &mut ConnInfo,
    shared: Arc<WorkerShared>,
    mut resume: Option<IdleWait>,
    mut buf: Vec<u8>,
) -> Option<IdleWait> {
    let quit = &shared.quit;
    // The waits between requests share one timer and one quit watcher,
    // each registered once for the connection rather than once per
    // request (a timer entry and a watch waiter added and removed per
    // wait cost ~800 instructions a request under keep-alive load).
    // Both are made at the first wait that needs them: a connection whose
    // requests are there when it is served (one request, then a close)
    // makes neither.
    let mut quit_changed = std::pin::pin!(None);
    let mut quit_seen = false;
    let mut idle_timer = std::pin::pin!(None::<tokio::time::Sleep>);
    // Bytes were left in the buffer behind the previous request: the next
    // one is pipelined (nginx's `$pipe`). Bytes read after a wait are not.
    let mut leftover = false;
    loop {
        let first = info.requests == 0;
        let pipelined = std::mem::take(&mut leftover) && !buf.is_empty();
        // Wait for the first byte: keepalive_timeout between requests.
        if buf.is_empty() {
            let (wait_ms, reset, size) = idle_params(&shared, info, first)?;
            let now = tokio::time::Instant::now();
            // A resumed wait keeps the deadline it was parked with.
            let mut wait = resume.take().unwrap_or(IdleWait {
                deadline: now + Duration::from_millis(wait_ms),
                first,
                reset,
            });
            // Graceful stop: a keep-alive connection gets QUIT_GRACE for a
            // request already on its way (it is answered with
            // `Connection: close`) instead of being closed under it.
            let mut quitting = *quit.borrow() && !first;
            if quitting {
                wait.deadline = wait.deadline.min(now + QUIT_GRACE);
            }
            let mut park_at = if quitting {
                wait.deadline
            } else {
                wait.deadline.min(now + PARK_AFTER)
            };
            // A socket not yet registered with the event loop (just
            // accepted, or back from the parking lot) has had no chance to
            // report readiness: its request is most likely there already,
            // so read first and register only if it is not.
            let mut read_now = !stream.is_registered();
            // Wait until bytes are really here (readiness alone can be
            // stale), so the configuration below is the one current when
            // the request arrived. Idle connections hold no buffer.
            loop {
                // An unregistered socket reads before its first wait.
                if !std::mem::take(&mut read_now) {
                    // The timer set before for a park up to PARK_SLACK
                    // earlier is kept: parking a little early is harmless,
                    // and re-arming it costs more than the wait. The
                    // close deadline (keepalive_timeout, the quit grace)
                    // is always kept exactly.
                    match idle_timer.as_mut().as_pin_mut() {
                        Some(timer) => {
                            let set = timer.deadline();
                            let close_at = park_at >= wait.deadline;
                            if close_at
                                || set > park_at
                                || park_at.duration_since(set) > PARK_SLACK
                                || timer.is_elapsed()
                            {
                                timer.reset(park_at);
                            }
                        }
                        None => idle_timer.set(Some(tokio::time::sleep_until(park_at))),
                    }
                    // The first request has no quit watch (see below).
                    if !first && quit_changed.is_none() {
                        quit_changed.set(Some(quit_watch(shared.quit.clone())));
                    }
                    tokio::select! {
                        // Bytes first: polling the quit watch first would
                        // wake it for nothing.
                        biased;
                        r = stream.readable() => match r {
                            Ok(()) => {}
                            Err(_) => return None,
                        },
                        () = std::future::poll_fn(|c| pending_if_none(idle_timer.as_mut(), c)) => {
                            let set = idle_timer.as_ref().get_ref().as_ref().map(|t| t.deadline());
                            if set.is_some_and(|d| d < wait.deadline) {
                                return Some(wait);
                            }
                            if wait.first && wait.reset {
                                stream.set_linger_zero();
                            }
                            return None;
                        },
                        () = std::future::poll_fn(|c| pending_if_none(quit_changed.as_mut(), c)),
                            if !first && !quitting && !quit_seen =>
                        {
                            // (Done once: a finished future is not polled again.)
                            quit_seen = true;
                            quitting = true;
                            let grace = tokio::time::Instant::now() + QUIT_GRACE;
                            wait.deadline = wait.deadline.min(grace);
                            park_at = wait.deadline;
                            continue;
                        }
                    }
                }
                match first_read(stream, size) {
                    Ok(Some(b)) => {
                        buf = b;
                        break;
                    }
                    Ok(None) => return None,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => return None,
                }
            }
        }
        if !request(stream, &mut buf, info, &shared, quit, pipelined).await {
            return None;
        }
        leftover = !buf.is_empty();
        if buf.is_empty() {
            // Idle connections hold no buffer: the next request's first
            // read takes one from the worker's spares.
            request::give_back_buf(std::mem::take(&mut buf));
        }
    }
}

/// Resolves when the worker is told to quit (or can no longer be told).
async fn quit_watch(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.changed().await;
}

/// Polls an optional future; none is pending for ever.
fn pending_if_none<F: std::future::Future>(
    f: std::pin::Pin<&mut Option<F>>,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<F::Output> {
    match f.as_pin_mut() {
        Some(f) => f.poll(cx),
        None => std::task::Poll::Pending,
    }
}

/// Reads what is there, up to `size` bytes (client_header_buffer_size),
/// into a buffer of at least that capacity: one a finished request gave
/// back ([`request::spare_buf`]), so a request allocates none, and a read
/// that finds nothing (stale readiness) gives it back at once.
/// `Ok(None)`: the peer closed.
fn first_read<S: Stream>(stream: &S, size: usize) -> io::Result<Option<Vec<u8>>> {
    let mut buf = request::spare_buf();
    buf.resize(size, 0);
    match stream.try_read(&mut buf[..size]) {
        Ok(n) if n > 0 => {
            buf.truncate(n);
            Ok(Some(buf))
        }
        r => {
            request::give_back_buf(buf);
            r.map(|_| None)
        }
    }
}

/// Reads, runs and answers one request whose first bytes are in `buf`.
/// Returns whether the connection stays open for another. `pipelined`:
/// its first bytes were already here behind the previous request's
/// (until this was told apart, every keep-alive request after the first
/// logged `$pipe` as `p`).
async fn request<S: Stream>(
    stream: &S,
    buf: &mut Vec<u8>,
    info: &mut ConnInfo,
    shared: &Arc<WorkerShared>,
    quit: &tokio::sync::watch::Receiver<bool>,
    pipelined: bool,
) -> bool {
    let first = info.requests == 0;
    // Loaded once the request has started: a reload while this
    // connection idled applies to this request.
    let config = shared.config.load_full();
    let Some(http) = config.http.clone() else {
        return false;
    };
    let http = &http;
    let Some(addr) = http.addr_for(&info.listen, info.local) else {
        return false;
    };
    let dsrv = &addr.default.srv;
    let reading = crate::core::worker::StateGuard::enter(&shared.stats.reading);
    // nginx counts a request once its first bytes arrived.
    shared.stats.request();
    let head = read_head(stream, buf, &addr, first).await;
    drop(reading);
    let _writing = crate::core::worker::StateGuard::enter(&shared.stats.writing);
    let end = match head {
        HeadResult::Head(n) => n,
        HeadResult::Closed => return false,
        HeadResult::TimedOut => {
            log_conn(
                &addr.default.conf,
                Level::Info,
                info,
                "client timed out (110: Connection timed out) while reading client request headers",
            );
            if addr
                .default
                .conf
                .core
                .reset_timedout_connection
                .unwrap_or(false)
            {
                stream.set_linger_zero();
            }
            return false;
        }
        HeadResult::Reject(mut r) => {
            r.pipelined = pipelined;
            info.requests += 1;
            Box::pin(reject_and_close(stream, http, &addr, info, shared, r)).await;
            return false;
        }
    };
    info.requests += 1;
    // The request keeps the head's bytes: the read buffer itself when the
    // head is all it holds (the usual case: no copy, no allocation), else
    // a copy, and what follows (a body, a pipelined request) stays in `buf`.
    let head = if end == buf.len() {
        std::mem::take(buf)
    } else {
        let head = buf[..end].to_vec();
        buf.drain(..end);
        head
    };
    let req = match request::parse_head(head, dsrv) {
        Ok(r) => r,
        Err(mut r) => {
            r.pipelined = pipelined;
            Box::pin(reject_and_close(stream, http, &addr, info, shared, r)).await;
            return false;
        }
    };
    let server = addr.select(req.host()).clone();
    let mut cx = phases::Ctx::new(http, &req, &server, info, shared);
    cx.client = Some(stream);
    if pipelined {
        cx.notes
            .push((crate::http::modules::access_log::PIPELINED, Vec::new()));
    }
    for bad in req.invalid_lines() {
        cx.log(
            Level::Info,
            &format!(
                "client sent invalid header line: \"{}\" while reading client request headers",
                String::from_utf8_lossy(bad)
            ),
        );
    }
    // A handler that needs the body (proxy_pass) reads it through this;
    // the read buffer comes back after the phases (see http::body).
    // An empty body announced with `Expect: 100-continue` too: nginx
    // answers 100 when a handler reads it, whatever its length.
    if req.content_length.is_some_and(|n| n > 0)
        || req.chunked
        || (req.expect_continue && req.content_length == Some(0))
    {
        cx.body = Some(crate::http::body::ReqBody::new(stream, std::mem::take(buf)));
    }
    let since = cx.start;
    let resp = tokio::select! {
        biased;
        r = phases::run(&mut cx) => Some(r),
        () = shared.cut_off(since) => None,
    };
    let Some(mut resp) = resp else {
        // worker_shutdown_timeout ran out before the answer: nginx
        // terminates the request and closes the connection; nothing is
        // sent, and the log has no status (`000`), nothing in the error
        // log.
        phases::log_done(&mut cx, 0);
        return false;
    };
    let body_end = crate::http::body::give_back(&mut cx, buf);
    let loc = cx.loc.clone();
    // A body of unknown length that goes out unframed (see
    // v1::head::unframed) is ended by the close; a HEAD has no body and
    // keeps the connection.
    if crate::http::v1::head::unframed(&resp, req.minor, &loc)
        && req.method != crate::http::request::Method::Head
    {
        resp.force_close = true;
    }
    if let crate::http::body::End::Broken { silent: true, .. } = body_end {
        // A body timeout or a client gone mid-body: nothing is sent
        // (nginx terminates the request); the status is still logged.
        phases::log_done(&mut cx, resp.status);
        if loc.core.reset_timedout_connection.unwrap_or(false) {
            stream.set_linger_zero();
        }
        return false;
    }
    if resp.close_silently {
        // `return 444`, a client gone while upstream was awaited (499):
        // nothing is sent, and the log says so, as nginx's does.
        phases::log_done(&mut cx, resp.status);
        return false;
    }
    if let Some(up) = resp.upgrade.take() {
        // A proxied 101 to an upgrade request: the connection becomes a
        // tunnel, and what the client sent after its request goes into it.
        let pipelined = std::mem::take(buf);
        let minor = req.minor;
        Box::pin(upgraded(
            stream, &resp, *up, pipelined, &loc, minor, &mut cx,
        ))
        .await;
        recycle_head_buf(std::mem::take(&mut cx.sent.head));
        return false;
    }
    let mut keepalive = req.keepalive && !resp.force_close && !*quit.borrow();
    let ka = loc.core.keepalive.map_or(75_000, |k| k.timeout_ms);
    if ka == 0 || info.requests >= loc.core.keepalive_requests.unwrap_or(1000) {
        keepalive = false;
    }
    // keepalive_disable: old MSIE after a POST, Safari on macOS.
    let (msie6, safari) = loc.core.keepalive_disable.unwrap_or((true, false));
    if keepalive && (msie6 || safari) {
        if let Some(ua) = req.header("user-agent") {
            let b = crate::http::response::browser_of(ua);
            if (msie6 && b.msie6 && req.method == crate::http::request::Method::Post)
                || (safari && b.safari)
            {
                keepalive = false;
            }
        }
    }
    // keepalive_time: no further request once the connection is this old.
    if info.started.elapsed() > Duration::from_millis(loc.core.keepalive_time.unwrap_or(3_600_000))
    {
        keepalive = false;
    }
    // A body read half-way leaves the connection unusable.
    if let crate::http::body::End::Broken { linger, .. } = body_end {
        keepalive = false;
        resp.linger |= linger;
    }
    // As nginx: TCP_NODELAY once the connection turns keep-alive (a
    // response written in one go needs no Nagle exemption before that).
    if keepalive && info.requests == 1 && loc.core.tcp_nodelay.unwrap_or(true) {
        stream.set_nodelay(true);
    }
    // Handlers here never consume the body. As nginx does, what has
    // already arrived is discarded now (a malformed body is still a
    // 400), the response goes out without waiting for the rest, and the
    // rest is read and dropped afterwards so the connection can be
    // reused (or lingering close drains it).
    let body_pending = (req.content_length.is_some_and(|n| n > 0) || req.chunked)
        && body_end == crate::http::body::End::Unread;
    let mut discard: Option<Discard> = None;
    if body_pending && resp.status != 413 {
        if req.expect_continue
            && Box::pin(write_all(stream, &[b"HTTP/1.1 100 Continue\r\n\r\n"], &loc))
                .await
                .is_err()
        {
            return false;
        }
        let mut d = Discard::new(&req);
        match d.take_available(stream, buf) {
            Ok(true) => {}
            Ok(false) => {
                if !keepalive {
                    resp.linger = true;
                }
                discard = Some(d);
            }
            Err(DiscardError::Bad) => {
                let r = Reject {
                    status: 400,
                    log: "client sent invalid chunked body",
                    line: Some(req.line().to_vec()),
                    in_headers: true,
                    host: req.header("host").map(<[u8]>::to_vec),
                    ..Default::default()
                };
                Box::pin(reject_and_close(stream, http, &addr, info, shared, r)).await;
                return false;
            }
            Err(DiscardError::Io) => return false,
        }
    } else if body_pending {
        keepalive = false;
        resp.linger = true;
    }
    // Pipelined requests we will not answer: linger so that the client
    // reads this response before the close, as nginx does; `always`
    // lingers whatever the client seems to be doing.
    let linger_after = resp.linger
        || (!keepalive && !buf.is_empty())
        || loc.core.lingering_close == Some(crate::http::conf::Lingering::Always);
    let head_only = req.method == crate::http::request::Method::Head;
    // add_trailer values are rendered again once the body has gone, with
    // the request's variables as they are then; the writer holds what
    // went out meanwhile.
    let own = resp.own_trailers;
    let mut sent = std::mem::take(&mut cx.sent);
    let finish = |s: &phases::Sent, head: &[u8], known: &[(String, Vec<u8>)]| {
        let mut t = known[..known.len().saturating_sub(own)].to_vec();
        t.extend(crate::http::modules::headers::render_trailers(&cx, s, head));
        t
    };
    let fin: Finish<'_> = if own > 0 { Some(&finish) } else { None };
    let written = tokio::select! {
        biased;
        r = write_response(
            stream,
            &mut resp,
            &loc,
            if req.http09 { 9 } else { req.minor },
            keepalive,
            head_only,
            &mut sent,
            fin,
        ) => Some(r),
        () = shared.cut_off(since) => None,
    };
    cx.sent = sent;
    let Some(result) = written else {
        // worker_shutdown_timeout ran out while the answer was going out:
        // the connection closes, the request is logged with its status
        // and the bytes sent so far, as nginx's.
        phases::log_done(&mut cx, resp.status);
        return false;
    };
    cx.sent.complete = result.is_ok();
    phases::wrap_up(&mut cx, resp.status, result.is_ok()).await;
    // Its box and header list serve the worker's next response.
    response::recycle(resp);
    // Module state tied to the request (a limit_conn slot) lives until
    // the unread body is drained, as the request does in nginx.
    let mut request_guards = std::mem::take(&mut cx.guards);
    recycle_head_buf(std::mem::take(&mut cx.sent.head));
    let conn_id = cx.conn.id;
    drop(cx);
    req.recycle();
    // A log with variables in its path is written before the connection
    // goes on, as nginx's log phase (see access_log::settled).
    crate::http::modules::access_log::settled(conn_id).await;
    if result.is_err() {
        if loc.core.reset_timedout_connection.unwrap_or(false) {
            stream.set_linger_zero();
        }
        return false;
    }
    // A cache background update the request started ends before the
    // connection goes on (nginx finalizes the request after it).
    crate::http::upstream::cache::wait_postponed(&mut request_guards).await;
    if keepalive {
        if let Some(mut d) = discard {
            if Box::pin(d.finish(stream, buf, &loc)).await.is_err() {
                return false;
            }
        }
    }
    if !keepalive {
        if linger_after {
            Box::pin(linger(stream, &loc)).await;
        }
        return false;
    }
    drop(request_guards);
    // The wait for the next request is this location's keepalive_timeout.
    info.keepalive_ms = ka;
    true
}

/// Sends the 101 head and relays bytes until the tunnel ends
/// ([`crate::http::tunnel`]); the request is logged then, as nginx logs it
/// when it finalises the upgraded request.
async fn upgraded<S: Stream>(
    stream: &S,
    resp: &Response,
    up: crate::http::tunnel::Upgrade,
    pipelined: Vec<u8>,
    loc: &LocConf,
    minor: u8,
    cx: &mut phases::Ctx<'_>,
) {
    let mut head = take_head_buf();
    crate::http::v1::head::write_head(&mut head, resp, loc, minor, false);
    // As nginx on an upgrade: TCP_NODELAY on the client connection too
    // (upstream connections always have it), so small frames leave at once.
    if loc.core.tcp_nodelay.unwrap_or(true) {
        stream.set_nodelay(true);
    }
    // Not write_all_more: the head must leave now, not wait for the
    // tunnel's first bytes.
    let written = write_all(stream, &[&head], loc).await;
    cx.sent.bytes = head.len() as u64;
    cx.sent.head = head;
    if written.is_ok() {
        let url = up.url.clone();
        let end = crate::http::tunnel::relay(stream, up, pipelined, loc).await;
        cx.sent.bytes += end.to_client;
        cx.sent.body_bytes += end.to_client;
        if let Some((level, msg)) = end.log {
            cx.log_with_upstream(level, &msg, Some(&url));
        }
    }
    phases::log_done(cx, resp.status);
}

/// Reads until a complete head is in `buf`; returns its length.
async fn read_head<S: Stream>(
    stream: &S,
    buf: &mut Vec<u8>,
    addr: &AddrConf,
    _first: bool,
) -> HeadResult {
    let srv = &addr.default.srv;
    let small = srv.header_buffer();
    let (n_large, large) = srv.large_buffers();
    let limit = small.max(n_large * large);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(srv.header_timeout_ms());
    let mut scanned = 0;
    loop {
        // nginx skips empty lines before a request line.
        let blank = buf
            .iter()
            .take_while(|&&c| c == b'\r' || c == b'\n')
            .count();
        if blank > 0 {
            buf.drain(..blank);
            scanned = 0;
        }
        if let Some(end) = head_end(buf, &mut scanned) {
            // A head that arrived whole must obey the same limits.
            if let Some(r) = check_limits(&buf[..end], large, limit) {
                return HeadResult::Reject(r);
            }
            return HeadResult::Head(end);
        }
        if let Some(r) = check_limits(buf, large, limit) {
            return HeadResult::Reject(r);
        }
        // As nginx, a request line is judged as soon as it is there (a
        // TLS hello on a plain port is refused at once), and one without
        // a version (HTTP/0.9) is the whole head.
        match request::parse_line(buf) {
            Err(r) => return HeadResult::Reject(r),
            Ok(Some(l)) if l.minor == 9 => return HeadResult::Head(l.next),
            Ok(_) => {}
        }
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(if buf.capacity() == 0 {
                small
            } else {
                buf.capacity()
            });
        }
        let start = buf.len();
        let cap = buf.capacity();
        buf.resize(cap, 0);
        let r = stream.try_read(&mut buf[start..]);
        match r {
            Ok(0) => {
                buf.truncate(start);
                return HeadResult::Closed;
            }
            Ok(n) => buf.truncate(start + n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                buf.truncate(start);
                match tokio::time::timeout_at(deadline, stream.readable()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return HeadResult::Closed,
                    Err(_) => return HeadResult::TimedOut,
                }
            }
            Err(_) => {
                buf.truncate(start);
                return HeadResult::Closed;
            }
        }
    }
}

/// nginx's limits on a head (complete or not): a request line longer than
/// a large buffer is 414, a header line longer than one is 494, and the
/// whole head may not exceed all the large buffers.
fn check_limits(buf: &[u8], large: usize, limit: usize) -> Option<Reject> {
    // No line of it can be longer than a large buffer, nor the whole
    // longer than all of them (`limit` >= `large`): the usual head.
    if buf.len() <= large && buf.len() <= limit {
        return None;
    }
    let first_nl = memchr::memchr(b'\n', buf);
    let line_len = first_nl.unwrap_or(buf.len());
    if line_len > large {
        return Some(Reject {
            status: 414,
            log: "client sent too long URI",
            // nginx logs the line as far as its buffer held it.
            line: Some(buf[..large.min(buf.len())].to_vec()),
            ..Default::default()
        });
    }
    let first_nl = first_nl?;
    let mut too_long = buf.len() > limit;
    let mut start = first_nl + 1;
    while !too_long {
        let end = memchr::memchr(b'\n', &buf[start..]).map_or(buf.len(), |i| start + i);
        too_long = end - start > large;
        if end == buf.len() {
            break;
        }
        start = end + 1;
    }
    if too_long {
        let line = buf[..first_nl]
            .strip_suffix(b"\r")
            .unwrap_or(&buf[..first_nl]);
        return Some(Reject {
            status: 494,
            log: "client sent too long header line",
            line: Some(line.to_vec()),
            in_headers: true,
            ..Default::default()
        });
    }
    None
}

/// Finds the end of the head (after an empty line, CRLF or bare LF).
fn head_end(buf: &[u8], scanned: &mut usize) -> Option<usize> {
    // Leading empty lines before a request line are skipped by nginx;
    // httparse does too, so only look for the blank line after content.
    let mut i = scanned.saturating_sub(3);
    while let Some(p) = memchr::memchr(b'\n', &buf[i..]) {
        let nl = i + p;
        let rest = &buf[nl + 1..];
        if rest.first() == Some(&b'\n') && nl > 0 {
            return Some(nl + 2);
        }
        if rest.starts_with(b"\r\n") && nl > 0 {
            return Some(nl + 3);
        }
        if rest.len() < 2 {
            *scanned = nl + 1;
            return None;
        }
        i = nl + 1;
    }
    *scanned = buf.len();
    None
}

/// Waits, at most send_timeout, until the socket takes more bytes.
async fn wait_writable<S: Stream>(stream: &S, loc: &LocConf) -> io::Result<()> {
    let to = Duration::from_millis(loc.core.send_timeout.unwrap_or(60_000));
    match timeout(to, crate::io::SendSock::writable(stream)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "send_timeout")),
    }
}

/// Answers a head that was refused and closes, as nginx finalises such a
/// request: the error log says why (and while reading what), the answer
/// is the status's page with the server's `add_header ... always` lines,
/// and the access log has the request as far as it was read.
async fn reject_and_close<S: Stream>(
    stream: &S,
    http: &Arc<crate::http::conf::HttpConf>,
    addr: &AddrConf,
    info: &ConnInfo,
    shared: &Arc<WorkerShared>,
    r: Reject,
) {
    let line = r.line.as_deref().unwrap_or_default();
    let req = Request::refused(line, r.host.as_deref());
    // The server the Host names once the headers were read, else the
    // listener's default one.
    let server = match req.host() {
        Some(h) => addr.select(Some(h)).clone(),
        None => addr.default.clone(),
    };
    let mut cx = phases::Ctx::new(http, &req, &server, info, shared);
    let reading = if r.in_headers {
        "request headers"
    } else if r.pipelined {
        "pipelined request line"
    } else {
        "request line"
    };
    let detail = r
        .detail
        .as_ref()
        .map(|d| format!(": \"{}\"", String::from_utf8_lossy(d)))
        .unwrap_or_default();
    // (The refused request has a Host only when the headers were read,
    // so the context names one only then, as nginx's does.)
    cx.log(
        Level::Info,
        &format!("{}{} while reading client {}", r.log, detail, reading),
    );
    let mut resp = phases::conclude(&mut cx, Box::new(Response::status(r.status))).await;
    // An error page may not keep the connection: nginx closes after these.
    resp.force_close = true;
    let loc = cx.loc.clone();
    // Once the request line is known, a HEAD gets no body even here.
    let head_only = line.starts_with(b"HEAD ") && !r.http09;
    let minor = if r.http09 { 9 } else { 1 };
    let written = write_response(
        stream,
        &mut resp,
        &loc,
        minor,
        false,
        head_only,
        &mut cx.sent,
        None,
    )
    .await;
    cx.sent.complete = written.is_ok();
    phases::log_done(&mut cx, r.status);
    drop(cx);
    linger(stream, &loc).await;
}

enum DiscardError {
    Bad,
    Io,
}

/// A request body being read and dropped.
enum Discard {
    Length(u64),
    Chunked(ChunkedDecoder),
}

impl Discard {
    fn new(req: &Request) -> Discard {
        match req.content_length {
            Some(n) => Discard::Length(n),
            None => Discard::Chunked(ChunkedDecoder::new()),
        }
    }

    /// Drops body bytes from `buf`; bytes after the body stay (pipelining).
    fn eat(&mut self, buf: &mut Vec<u8>) -> Result<bool, DiscardError> {
        match self {
            Discard::Length(left) => {
                let take = (buf.len() as u64).min(*left) as usize;
                buf.drain(..take);
                *left -= take as u64;
                Ok(*left == 0)
            }
            Discard::Chunked(dec) => {
                // The sink is never filled much: `buf` holds one read at most.
                let mut sink = Vec::new();
                let used = dec.decode(buf, &mut sink).map_err(|_| DiscardError::Bad)?;
                buf.drain(..used);
                Ok(dec.is_done())
            }
        }
    }

    /// How much may be read from the socket without passing the body's end.
    fn want(&self) -> usize {
        match self {
            Discard::Length(left) => (*left).min(16384) as usize,
            Discard::Chunked(_) => 16384,
        }
    }

    /// Discards what is buffered or readable now, without waiting.
    fn take_available<S: Stream>(
        &mut self,
        stream: &S,
        buf: &mut Vec<u8>,
    ) -> Result<bool, DiscardError> {
        loop {
            if self.eat(buf)? {
                return Ok(true);
            }
            let start = buf.len();
            buf.resize(start + self.want(), 0);
            match stream.try_read(&mut buf[start..]) {
                Ok(0) => return Err(DiscardError::Io),
                Ok(n) => buf.truncate(start + n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    buf.truncate(start);
                    return Ok(false);
                }
                Err(_) => return Err(DiscardError::Io),
            }
        }
    }

    /// Discards the rest, waiting at most client_body_timeout between reads.
    async fn finish<S: Stream>(
        &mut self,
        stream: &S,
        buf: &mut Vec<u8>,
        loc: &LocConf,
    ) -> Result<(), DiscardError> {
        let to = Duration::from_millis(loc.core.client_body_timeout.unwrap_or(60_000));
        loop {
            if self.take_available(stream, buf)? {
                return Ok(());
            }
            match timeout(to, stream.readable()).await {
                Ok(Ok(())) => {}
                _ => return Err(DiscardError::Io),
            }
        }
    }
}

/// After a final response on a connection the client may still be
/// sending: read and drop for up to lingering_time, so that the client
/// sees our response rather than a reset.
pub(crate) async fn linger<S: Stream>(stream: &S, loc: &LocConf) {
    if loc.core.lingering_close == Some(crate::http::conf::Lingering::Off) {
        return;
    }
    stream.shutdown_write();
    let total = Duration::from_millis(loc.core.lingering_time.unwrap_or(30_000));
    let each = Duration::from_millis(loc.core.lingering_timeout.unwrap_or(5_000));
    let deadline = tokio::time::Instant::now() + total;
    let mut scratch = [0u8; 4096];
    loop {
        match stream.try_read(&mut scratch) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let until = (tokio::time::Instant::now() + each).min(deadline);
                if tokio::time::timeout_at(until, stream.readable())
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

/// What renders the trailers once the body has gone (`add_trailer`, as
/// nginx renders them then): given what went out, the head as written and
/// the trailers known with the head, the trailers to send.
type Finish<'f> =
    Option<&'f dyn Fn(&phases::Sent, &[u8], &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)>>;

#[allow(clippy::too_many_arguments)]
async fn write_response<S: Stream>(
    stream: &S,
    resp: &mut Response,
    loc: &LocConf,
    minor: u8,
    keepalive: bool,
    head_only: bool,
    sent: &mut phases::Sent,
    fin: Finish<'_>,
) -> io::Result<()> {
    let mut head = take_head_buf();
    crate::http::v1::head::write_head(&mut head, resp, loc, minor, keepalive);
    let r = write_body(
        stream, resp, loc, minor, head_only, !keepalive, &head, sent, fin,
    )
    .await;
    sent.head = head;
    r
}

thread_local! {
    /// A head buffer kept between requests of this worker: every response
    /// needs one, and the previous one is free again once its request has
    /// been logged. Tasks that overlap simply allocate their own.
    static HEAD_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

fn take_head_buf() -> Vec<u8> {
    let mut v = HEAD_BUF.take();
    v.clear();
    v.reserve(256);
    v
}

/// Gives a head buffer back for the next response (an unusually large one
/// is dropped rather than kept).
fn recycle_head_buf(v: Vec<u8>) {
    if v.capacity() <= 4096 {
        HEAD_BUF.set(v);
    }
}

/// Sends the body: bytes with the head in one writev; files with sendfile
/// (under TCP_CORK with tcp_nopush) or read through the file-I/O layer;
/// through the body filters (chunked for HTTP/1.1) when there are any.
/// `closing`: the connection closes right after this response.
#[allow(clippy::too_many_arguments)]
async fn write_body<S: Stream>(
    stream: &S,
    resp: &mut Response,
    loc: &LocConf,
    minor: u8,
    head_only: bool,
    closing: bool,
    head: &[u8],
    sent: &mut phases::Sent,
    fin: Finish<'_>,
) -> io::Result<()> {
    let policy = resp.io.take().unwrap_or_default();
    let r = write_body_with(
        stream, resp, loc, minor, head_only, closing, head, sent, &policy, fin,
    )
    .await;
    sent.io = policy.decision().as_str();
    r
}

/// File bodies up to this size are read through the file-I/O layer and
/// leave with the head in one `writev`: one syscall and one segment,
/// where writev + sendfile under TCP_CORK costs four syscalls. The copy
/// of a few KiB costs less than the calls it saves; bigger bodies keep
/// sendfile's zero copy (measured: at 16 KiB sendfile after a MSG_MORE
/// head costs ~1 µs/request less than the copy; see
/// bench/RESULTS-hot-path.md). It is the size whose bytes a cached
/// descriptor keeps, so with open_file_cache these reads cost no syscall.
const INLINE_FILE_MAX: u64 = crate::io::SMALL_CONTENT_MAX;

#[allow(clippy::too_many_arguments)]
async fn write_body_with<S: Stream>(
    stream: &S,
    resp: &mut Response,
    loc: &LocConf,
    minor: u8,
    head_only: bool,
    closing: bool,
    head: &[u8],
    sent: &mut phases::Sent,
    policy: &crate::io::Policy,
    fin: Finish<'_>,
) -> io::Result<()> {
    // A response written in one go on a connection that closes next goes
    // with MSG_MORE: the bytes wait in the socket for the close, and the
    // FIN leaves in the same segment (as nginx's TCP_CORK does until its
    // close). One segment and one ACK fewer per connection.
    if head_only || matches!(resp.body, Body::Empty) {
        sent.bytes = head.len() as u64;
        return write_all_more(stream, &[head], loc, closing).await;
    }
    if !resp.filters.is_empty() || matches!(resp.body, Body::Stream(_)) {
        return write_filtered(stream, resp, loc, minor, head, sent, policy, fin).await;
    }
    let body = std::mem::take(&mut resp.body);
    // The common bodies go out without building a piece list.
    match body {
        Body::Bytes(b) => write_memory(stream, &b, loc, head, sent, closing).await?,
        Body::Shared(b) => write_memory(stream, &b, loc, head, sent, closing).await?,
        Body::File { file, offset, len }
            if len <= INLINE_FILE_MAX && Pacer::rate(loc, sent).is_none() =>
        {
            let data = crate::io::read(&file, offset, len as usize, policy).await?;
            sent.body_bytes += data.len() as u64;
            write_all_more(stream, &[head, &data], loc, closing).await?;
            if (data.len() as u64) < len {
                // Shrunk since it was opened: the client gets what was
                // there, and the connection closes (as with sendfile).
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file was truncated while being sent",
                ));
            }
        }
        Body::File { file, offset, len } => {
            let pieces = [response::Piece::File { file, offset, len }];
            write_pieces(stream, &pieces, loc, head, sent, policy).await?;
        }
        Body::Multi(p) => write_pieces(stream, &p, loc, head, sent, policy).await?,
        Body::Empty | Body::Stream(_) => write_all(stream, &[head], loc).await?,
    }
    sent.bytes = head.len() as u64 + sent.body_bytes;
    Ok(())
}

/// A body from memory after its head, in one `writev` (or paced).
async fn write_memory<S: Stream>(
    stream: &S,
    b: &[u8],
    loc: &LocConf,
    head: &[u8],
    sent: &mut phases::Sent,
    closing: bool,
) -> io::Result<()> {
    sent.body_bytes += b.len() as u64;
    match Pacer::new(loc, sent, 0) {
        None => write_all_more(stream, &[head, b], loc, closing).await,
        // limit_rate holds for a page from memory too (an error
        // page, `return` text), its head included, as nginx's
        // write filter counts every byte of the connection.
        Some(mut p) => write_paced(stream, &[head, b], loc, &mut p).await,
    }
}

/// `limit_rate`/`limit_rate_after` as nginx paces a response: by the end
/// of second N (counted from the response's start) at most
/// `limit_rate_after + rate * (N + 1)` bytes, head included, have gone.
struct Pacer {
    rate: u64,
    after: u64,
    start: std::time::Instant,
    sent: u64,
}

impl Pacer {
    /// The rate the response is paced by, if any.
    fn rate(loc: &LocConf, sent: &phases::Sent) -> Option<u64> {
        sent.limit_rate
            .or(SizeValue::fixed(&loc.core.limit_rate))
            .filter(|r| *r > 0)
    }

    fn new(loc: &LocConf, sent: &phases::Sent, head_len: usize) -> Option<Pacer> {
        let rate = Pacer::rate(loc, sent)?;
        Some(Pacer {
            rate,
            after: sent
                .limit_rate_after
                .or(SizeValue::fixed(&loc.core.limit_rate_after))
                .unwrap_or(0),
            start: std::time::Instant::now(),
            sent: head_len as u64,
        })
    }

    /// [`Pacer::allowance`], ended by the client closing its side while
    /// the pace holds the response back (nginx's read handler of a
    /// delayed response notices it and ends the request).
    async fn allowance_watched<S: Stream>(&mut self, stream: &S) -> io::Result<u64> {
        tokio::select! {
            biased;
            n = self.allowance() => Ok(n),
            () = hangup(stream) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "client prematurely closed connection",
            )),
        }
    }

    /// Bytes that may go now, after waiting as long as nothing may.
    async fn allowance(&mut self) -> u64 {
        loop {
            let budget = self
                .rate
                .saturating_mul(self.start.elapsed().as_secs() + 1)
                .saturating_add(self.after);
            if budget > self.sent {
                return budget - self.sent;
            }
            let missing = self.sent - budget;
            let ms = missing.saturating_mul(1000) / self.rate + 1;
            tokio::time::sleep(Duration::from_millis(ms.min(1000))).await;
        }
    }
}

/// Sends the head and a list of pieces: files with sendfile (the head
/// sent with MSG_MORE first under `tcp_nopush`, so it shares the first
/// segment with the file) or read through the file-I/O layer.
async fn write_pieces<S: Stream>(
    stream: &S,
    pieces: &[response::Piece],
    loc: &LocConf,
    head: &[u8],
    sent: &mut phases::Sent,
    policy: &crate::io::Policy,
) -> io::Result<()> {
    let sendfile = loc.core.sendfile.unwrap_or(false) && stream.sendfile_ok();
    let nopush = sendfile && loc.core.tcp_nopush.unwrap_or(false);
    let mut pending: Vec<u8> = head.to_vec();
    let to = Duration::from_millis(loc.core.send_timeout.unwrap_or(60_000));
    let mut pacer = Pacer::new(loc, sent, 0);
    // nginx's write filter counts the head as any other byte of the
    // connection: under limit_rate it is paced too, and a head longer
    // than the first second's allowance goes out in parts.
    if let Some(p) = pacer.as_mut() {
        write_paced(stream, &[&pending], loc, p).await?;
        pending.clear();
    }
    for p in pieces {
        match p {
            response::Piece::Bytes(b) => {
                pending.extend_from_slice(b);
                sent.body_bytes += b.len() as u64;
            }
            response::Piece::File { file, offset, len } => {
                if sendfile {
                    if !pending.is_empty() {
                        // What precedes a file waits for it (tcp_nopush):
                        // sendfile pushes the last partial segment itself.
                        if nopush && *len > 0 {
                            write_more(stream, &pending, loc).await?;
                        } else {
                            write_all(stream, &[&pending], loc).await?;
                        }
                        if let Some(p) = pacer.as_mut() {
                            p.sent += pending.len() as u64;
                        }
                        pending.clear();
                    }
                    match pacer.as_mut() {
                        None => {
                            let progress = &mut sent.body_bytes;
                            crate::io::send_file(stream, file, *offset, *len, policy, to, progress)
                                .await?;
                        }
                        Some(p) => {
                            let (mut off, end) = (*offset, offset + len);
                            while off < end {
                                let n = (end - off).min(p.allowance_watched(stream).await?);
                                let before = sent.body_bytes;
                                let progress = &mut sent.body_bytes;
                                crate::io::send_file(stream, file, off, n, policy, to, progress)
                                    .await?;
                                p.sent += sent.body_bytes - before;
                                off += n;
                            }
                        }
                    }
                } else {
                    let mut off = *offset;
                    let end = offset + len;
                    // Read `output_buffers`' size at a time (one buffer
                    // at a time: it goes out before the next is read).
                    let piece = loc.io.output_buffers().1.max(1) as u64;
                    while off < end {
                        let mut n = (end - off).min(piece);
                        if let Some(p) = pacer.as_mut() {
                            n = n.min(p.allowance_watched(stream).await?);
                            p.sent += n + pending.len() as u64;
                        }
                        let data = crate::io::read(file, off, n as usize, policy).await?;
                        pending.extend_from_slice(&data);
                        write_all(stream, &[&pending], loc).await?;
                        pending.clear();
                        off += n;
                        sent.body_bytes += n;
                        // A fast reader never makes the socket block: yield
                        // between chunks so one client cannot hold the loop.
                        tokio::task::consume_budget().await;
                    }
                }
            }
        }
    }
    if !pending.is_empty() {
        write_all(stream, &[&pending], loc).await?;
    }
    Ok(())
}

/// Writes `parts` one after the other, no faster than `pacer` allows.
async fn write_paced<S: Stream>(
    stream: &S,
    parts: &[&[u8]],
    loc: &LocConf,
    pacer: &mut Pacer,
) -> io::Result<()> {
    for part in parts {
        let mut off = 0;
        while off < part.len() {
            let allowed = pacer.allowance_watched(stream).await?;
            let n = (part.len() - off).min(usize::try_from(allowed).unwrap_or(usize::MAX));
            write_all(stream, &[&part[off..off + n]], loc).await?;
            pacer.sent += n as u64;
            off += n;
        }
    }
    Ok(())
}

/// Writes all of `data` with MSG_MORE, waiting at most send_timeout
/// between two successful writes.
async fn write_more<S: Stream>(stream: &S, data: &[u8], loc: &LocConf) -> io::Result<()> {
    let mut off = 0;
    while off < data.len() {
        match stream.try_write_more(&[IoSlice::new(&data[off..])]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, loc).await?,
            Err(e) => return Err(e),
        }
    }
    flush(stream, loc).await
}

/// Waits until `stream.try_flush` has pushed everything out, at most
/// send_timeout between two steps.
async fn flush<S: Stream>(stream: &S, loc: &LocConf) -> io::Result<()> {
    loop {
        match stream.try_flush() {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, loc).await?,
            Err(e) => return Err(e),
        }
    }
}

/// Streams the body through the filters, chunk-encoding the output for HTTP/1.1.
#[allow(clippy::too_many_arguments)]
async fn write_filtered<S: Stream>(
    stream: &S,
    resp: &mut Response,
    loc: &LocConf,
    minor: u8,
    head: &[u8],
    sent: &mut phases::Sent,
    policy: &crate::io::Policy,
    fin: Finish<'_>,
) -> io::Result<()> {
    let chunked = crate::http::v1::head::chunked(resp, minor, loc);
    let body = std::mem::take(&mut resp.body);
    let pieces: Vec<response::Piece> = match body {
        Body::Stream(src) => {
            let mut filters = std::mem::take(&mut resp.filters);
            let r = write_streamed(
                stream,
                src,
                &mut filters,
                loc,
                head,
                chunked,
                &resp.trailers,
                sent,
                resp.watch_client,
                fin,
            )
            .await;
            resp.filters = filters;
            return r;
        }
        Body::Empty => Vec::new(),
        Body::Bytes(b) => vec![response::Piece::Bytes(b)],
        // Through filters (rare for a cache hit): a copy is made anyway.
        Body::Shared(b) => vec![response::Piece::Bytes(b.to_vec())],
        Body::File { file, offset, len } => vec![response::Piece::File { file, offset, len }],
        Body::Multi(p) => p,
    };
    let mut filters = std::mem::take(&mut resp.filters);
    let mut first = true;
    let mut out = Vec::new();
    // The input is fed in bounded slices so memory stays bounded for any size.
    let total_pieces = pieces.len();
    for (pi, p) in pieces.iter().enumerate() {
        let last_piece = pi + 1 == total_pieces;
        let piece_len = match p {
            response::Piece::Bytes(b) => b.len() as u64,
            response::Piece::File { len, .. } => *len,
        };
        let mut off = 0u64;
        loop {
            let n = (piece_len - off).min(65536);
            let read_buf;
            let data: &[u8] = match p {
                response::Piece::Bytes(b) => &b[off as usize..(off + n) as usize],
                response::Piece::File { file, offset, .. } => {
                    read_buf = if n > 0 {
                        crate::io::read(file, offset + off, n as usize, policy).await?
                    } else {
                        Default::default()
                    };
                    &read_buf
                }
            };
            off += n;
            let last = last_piece && off >= piece_len;
            response::run_filters(&mut filters, data, last, &mut out)?;
            // A filter that gathers the whole body (gzip through
            // libdeflate) gives nothing until the end: the head waits for
            // the first output rather than going alone.
            if !(first && out.is_empty() && !last) {
                emit(
                    stream,
                    loc,
                    head,
                    &mut first,
                    &mut out,
                    chunked,
                    last,
                    &resp.trailers,
                    sent,
                    fin,
                )
                .await?;
            }
            // Compression can be slower than the client reads, so the
            // socket never blocks: let the loop's other connections run
            // between chunks.
            tokio::task::consume_budget().await;
            if off >= piece_len {
                break;
            }
        }
    }
    if total_pieces == 0 {
        response::run_filters(&mut filters, b"", true, &mut out)?;
        emit(
            stream,
            loc,
            head,
            &mut first,
            &mut out,
            chunked,
            true,
            &resp.trailers,
            sent,
            fin,
        )
        .await?;
    }
    resp.filters = filters;
    Ok(())
}

/// Sends a body that is still arriving, piece by piece as the source
/// yields it, through the body filters (if any). The head goes with the
/// first piece. A source error ends the response unfinished (no last
/// chunk): the caller closes the connection, as nginx does after an
/// upstream failure once the head is out.
#[allow(clippy::too_many_arguments)]
async fn write_streamed<S: Stream>(
    stream: &S,
    mut src: Box<dyn response::BodyStream>,
    filters: &mut [Box<dyn response::BodyFilter>],
    loc: &LocConf,
    head: &[u8],
    chunked: bool,
    trailers: &[(String, Vec<u8>)],
    sent: &mut phases::Sent,
    watch_client: bool,
    fin: Finish<'_>,
) -> io::Result<()> {
    let mut first = true;
    let mut out = Vec::new();
    let mut pacer = Pacer::new(loc, sent, 0);
    if !src.ready() {
        // The body keeps the client waiting: the head goes now.
        emit(
            stream, loc, head, &mut first, &mut out, chunked, false, trailers, sent, None,
        )
        .await?;
    }
    loop {
        // While the source keeps the client waiting, a client that hangs
        // up ends the response at once (nginx's broken-connection check),
        // so that the upstream behind it is let go.
        let next = if watch_client && !src.ready() {
            tokio::select! {
                biased;
                p = src.next() => p,
                () = hangup(stream) => Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "client prematurely closed connection",
                )),
            }
        } else {
            src.next().await
        };
        let piece = match next {
            Ok(p) => p,
            Err(e) => {
                if first && !response::is_unsent(&e) {
                    // Nothing reached the client yet: at least the head does.
                    sent.bytes += head.len() as u64;
                    let _ = write_all(stream, &[head], loc).await;
                }
                return Err(e);
            }
        };
        let last = piece.is_none();
        let data = piece.unwrap_or_default();
        // Trailers that came with the body's end go after the ones known
        // with the head.
        let late = if last { src.trailers() } else { Vec::new() };
        let finished;
        let known: &[(String, Vec<u8>)] = match fin.filter(|_| last) {
            Some(f) => {
                finished = f(sent, head, trailers);
                &finished
            }
            None => trailers,
        };
        let all;
        let trailers: &[(String, Vec<u8>)] = if late.is_empty() {
            known
        } else {
            all = [known, &late[..]].concat();
            &all
        };
        if filters.is_empty() {
            // As it came, framed when chunked, without copying the data.
            let before: &[u8] = if first { head } else { b"" };
            first = false;
            let mut size = Vec::new();
            let mut after = Vec::new();
            if chunked && !data.is_empty() {
                size = format!("{:x}\r\n", data.len()).into_bytes();
                after.extend_from_slice(b"\r\n");
            }
            if chunked && last {
                after.extend_from_slice(b"0\r\n");
                for (n, v) in trailers {
                    after.extend_from_slice(n.as_bytes());
                    after.extend_from_slice(b": ");
                    after.extend_from_slice(v);
                    after.extend_from_slice(b"\r\n");
                }
                after.extend_from_slice(b"\r\n");
            }
            sent.body_bytes += data.len() as u64;
            let piece_len = (before.len() + size.len() + data.len() + after.len()) as u64;
            sent.bytes += piece_len;
            if let Some(p) = pacer.as_mut() {
                // A piece goes whole once the pace allows any of it.
                p.allowance().await;
                p.sent += piece_len;
            }
            write_all(stream, &[before, &size, &data, &after], loc).await?;
            if last {
                return Ok(());
            }
            tokio::task::consume_budget().await;
            continue;
        }
        response::run_filters(filters, &data, last, &mut out)?;
        emit(
            stream, loc, head, &mut first, &mut out, chunked, last, trailers, sent, None,
        )
        .await?;
        if last {
            return Ok(());
        }
        tokio::task::consume_budget().await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn emit<S: Stream>(
    stream: &S,
    loc: &LocConf,
    head: &[u8],
    first: &mut bool,
    out: &mut Vec<u8>,
    chunked: bool,
    last: bool,
    trailers: &[(String, Vec<u8>)],
    sent: &mut phases::Sent,
    fin: Finish<'_>,
) -> io::Result<()> {
    let mut frame = Vec::with_capacity(out.len() + 64);
    if *first {
        frame.extend_from_slice(head);
        *first = false;
    }
    // Trailers rendered below see the body bytes gone before this frame
    // (nginx renders them before its last write).
    let body_now = out.len() as u64;
    if chunked {
        if !out.is_empty() {
            frame.extend_from_slice(format!("{:x}\r\n", out.len()).as_bytes());
            frame.extend_from_slice(out);
            frame.extend_from_slice(b"\r\n");
        }
        if last {
            frame.extend_from_slice(b"0\r\n");
            let finished;
            let trailers = match fin {
                Some(f) => {
                    finished = f(sent, head, trailers);
                    &finished[..]
                }
                None => trailers,
            };
            for (n, v) in trailers {
                frame.extend_from_slice(n.as_bytes());
                frame.extend_from_slice(b": ");
                frame.extend_from_slice(v);
                frame.extend_from_slice(b"\r\n");
            }
            frame.extend_from_slice(b"\r\n");
        }
    } else {
        frame.extend_from_slice(out);
    }
    out.clear();
    sent.body_bytes += body_now;
    sent.bytes += frame.len() as u64;
    if frame.is_empty() {
        return Ok(());
    }
    write_all(stream, &[&frame], loc).await
}

/// Writes all of `bufs` with writev, waiting at most send_timeout between
/// two successful writes.
pub(crate) async fn write_all<S: Stream>(
    stream: &S,
    bufs: &[&[u8]],
    loc: &LocConf,
) -> io::Result<()> {
    write_all_more(stream, bufs, loc, false).await
}

/// [`write_all`], with MSG_MORE on every write when `more`: the last
/// partial segment stays in the socket until the next write, a shutdown
/// or the close pushes it.
async fn write_all_more<S: Stream>(
    stream: &S,
    bufs: &[&[u8]],
    loc: &LocConf,
    more: bool,
) -> io::Result<()> {
    // A fixed iovec on the stack: callers pass a handful of buffers, and
    // more than MAX_IOV go out over several calls.
    const MAX_IOV: usize = 8;
    let mut idx = 0;
    let mut off = 0;
    while idx < bufs.len() {
        if off >= bufs[idx].len() {
            idx += 1;
            off = 0;
            continue;
        }
        let mut iov = [IoSlice::new(&[]); MAX_IOV];
        iov[0] = IoSlice::new(&bufs[idx][off..]);
        let mut k = 1;
        for b in bufs[idx + 1..].iter().take(MAX_IOV - 1) {
            iov[k] = IoSlice::new(b);
            k += 1;
        }
        let r = if more {
            stream.try_write_more(&iov[..k])
        } else {
            stream.try_write_vectored(&iov[..k])
        };
        match r {
            Ok(mut n) => {
                while n > 0 && idx < bufs.len() {
                    let left = bufs[idx].len() - off;
                    if n >= left {
                        n -= left;
                        idx += 1;
                        off = 0;
                    } else {
                        off += n;
                        n = 0;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, loc).await?,
            Err(e) => return Err(e),
        }
    }
    flush(stream, loc).await
}

pub use response::Response as Resp;
pub type Shared = Arc<WorkerShared>;
pub type LocRef = Arc<LocConf>;
