//! The QUIC endpoint of a worker's `listen ... quic` socket, its
//! connections, and each HTTP/3 request stream run through the
//! protocol-neutral request path (see [`crate::http::v3`] for the
//! picture).

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{Buf, Bytes};
use h3::error::Code;
use tokio::time::timeout;

use crate::core::log::Level;
use crate::core::worker::WorkerShared;
use crate::http::body::BodyIo;
use crate::http::conf::{AddrConf, ListenAddr, LocConf};
use crate::http::phases;
use crate::http::request::Request;
use crate::http::response::{self, Body, Piece, Response};
use crate::http::serve::{log_conn, ConnInfo};

type ReqStream = h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>;

fn addr_conf(shared: &WorkerShared, listen: &ListenAddr) -> Option<Arc<AddrConf>> {
    let config = shared.config.load();
    config.http.as_ref()?.addr_for(listen, None)
}

/// Runs the endpoint of one UDP socket: accepts connections until QUIT,
/// then waits for them to finish (each sends GOAWAY and lets its
/// requests complete).
pub async fn endpoint(
    sock: std::net::UdpSocket,
    listen: ListenAddr,
    shared: Arc<WorkerShared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(addr) = addr_conf(&shared, &listen) else {
        return;
    };
    let sc = match super::conf::server_config(&addr) {
        Ok(s) => s,
        Err(e) => {
            crate::elog!(Emerg, "QUIC configuration of {} failed: {}", listen, e);
            return;
        }
    };
    let _ = sock.set_nonblocking(true);
    let ep = match quinn::Endpoint::new(
        super::conf::endpoint_config(&addr),
        Some(sc),
        sock,
        Arc::new(quinn::TokioRuntime),
    ) {
        Ok(e) => e,
        Err(e) => {
            crate::elog!(Emerg, "QUIC endpoint on {} failed: {}", listen, e);
            return;
        }
    };
    let mut seen = Arc::as_ptr(&shared.config.load_full());
    let conns = Rc::new(Count::default());
    loop {
        if *stop.borrow() {
            break;
        }
        tokio::select! {
            inc = ep.accept() => match inc {
                Some(inc) => incoming(inc, &listen, &shared, &conns),
                None => break,
            },
            r = stop.changed() => if r.is_err() { break },
            // A reload swaps the configuration under the worker: new
            // handshakes get the new certificates and settings; the
            // connections keep going.
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let now = shared.config.load_full();
        if Arc::as_ptr(&now) != seen {
            seen = Arc::as_ptr(&now);
            if let Some(a) = addr_conf(&shared, &listen) {
                match super::conf::server_config(&a) {
                    Ok(sc) => ep.set_server_config(Some(sc)),
                    Err(e) => crate::elog!(Alert, "QUIC configuration of {} failed: {}", listen, e),
                }
            }
        }
    }
    // Graceful stop: no new connections; those open finish their
    // requests after GOAWAY.
    ep.set_server_config(None);
    while conns.n.get() > 0 {
        conns.zero.notified().await;
    }
    let _ = timeout(Duration::from_secs(1), ep.wait_idle()).await;
}

#[derive(Default)]
struct Count {
    n: Cell<usize>,
    zero: tokio::sync::Notify,
}

struct Counted(Rc<Count>);

impl Counted {
    fn new(c: &Rc<Count>) -> Counted {
        c.n.set(c.n.get() + 1);
        Counted(c.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let n = self.0.n.get().saturating_sub(1);
        self.0.n.set(n);
        self.0.zero.notify_waiters();
        self.0.zero.notify_one();
    }
}

/// A new connection attempt: refused past `worker_connections`, sent a
/// Retry under `quic_retry on` until its address is validated, else
/// served on its own task.
fn incoming(
    inc: quinn::Incoming,
    listen: &ListenAddr,
    shared: &Arc<WorkerShared>,
    conns: &Rc<Count>,
) {
    let limit = shared.config.load().main.connections();
    if shared.active.load(std::sync::atomic::Ordering::Acquire) >= limit {
        inc.refuse();
        return;
    }
    let Some(addr) = addr_conf(shared, listen) else {
        inc.refuse();
        return;
    };
    if addr.default.srv.http3.retry.unwrap_or(false) && !inc.remote_address_validated() {
        let _ = inc.retry();
        return;
    }
    shared
        .stats
        .accepts
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    shared
        .stats
        .handled
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let slot = crate::core::worker::ConnSlot::take(shared.clone());
    let counted = Counted::new(conns);
    let listen = listen.clone();
    let shared = shared.clone();
    tokio::task::spawn_local(async move {
        let _slot = slot;
        let _counted = counted;
        connection(inc, listen, addr, shared).await;
    });
}

/// What the accept loop and its stream tasks share.
#[derive(Default)]
struct Streams {
    active: Cell<usize>,
    ended: tokio::sync::Notify,
}

struct Ended(Rc<Streams>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.active.set(self.0.active.get().saturating_sub(1));
        self.0.ended.notify_one();
    }
}

async fn connection(
    inc: quinn::Incoming,
    listen: ListenAddr,
    addr: Arc<AddrConf>,
    shared: Arc<WorkerShared>,
) {
    let srv = &addr.default.srv;
    let header_to = Duration::from_millis(srv.header_timeout_ms());
    let early = srv.ssl.early_data.unwrap_or(false);
    let (hsize, hnum) = srv.large_buffers();
    let core = &addr.default.conf.core;
    // keepalive_timeout 0: no request after the first (GOAWAY after it).
    let no_keepalive = core.keepalive.is_some_and(|k| k.timeout_ms == 0);
    let max_requests = if no_keepalive {
        1
    } else {
        core.keepalive_requests.unwrap_or(1000)
    };
    let keepalive_time = core.keepalive_time.map(Duration::from_millis);
    let default_conf = addr.default.conf.clone();
    drop(addr);
    let id = crate::core::worker::next_conn_id();
    let remote = inc.remote_address();
    let mut info = ConnInfo {
        id,
        remote: Some(remote),
        local: match &listen {
            ListenAddr::Inet(a) | ListenAddr::Udp(a) => Some(*a),
            _ => None,
        },
        listen,
        requests: 0,
        tls: crate::tls::TlsState::Pending,
        started: std::time::Instant::now(),
        proxy: None,
        proxy_pending: false,
        keepalive_ms: 0,
    };
    let Ok(connecting) = inc.accept() else {
        return;
    };
    // With ssl_early_data, requests may come in 0-RTT packets (and are
    // answered at 0.5-RTT) before the handshake completes; they see
    // $ssl_early_data "1".
    let done = Rc::new(Cell::new(!early));
    let conn = if early {
        match connecting.into_0rtt() {
            Ok((c, accepted)) => {
                let d = done.clone();
                tokio::task::spawn_local(async move {
                    let _ = accepted.await;
                    d.set(true);
                });
                c
            }
            Err(connecting) => match timeout(header_to, connecting).await {
                Ok(Ok(c)) => c,
                _ => return,
            },
        }
    } else {
        match timeout(header_to, connecting).await {
            Ok(Ok(c)) => c,
            Ok(Err(_)) => return,
            Err(_) => {
                log_conn(
                    &default_conf,
                    Level::Info,
                    &info,
                    "client timed out (110: Connection timed out) while SSL handshaking",
                );
                return;
            }
        }
    };
    if let Some(ip) = conn.local_ip() {
        if let Some(l) = info.local.as_mut() {
            l.set_ip(ip);
        }
    }
    let tls_done = Arc::new(tls_info(&conn));
    let mut tls_early: Option<Arc<crate::tls::TlsInfo>> = None;
    let mut h3c = match timeout(
        header_to,
        h3::server::builder()
            .max_field_section_size(hsize.saturating_mul(hnum) as u64)
            // nginx sends no GREASE frames or settings (and some clients,
            // nginx-tests' among them, cannot read them).
            .send_grease(false)
            .build::<_, Bytes>(h3_quinn::Connection::new(conn.clone())),
    )
    .await
    {
        Ok(Ok(c)) => c,
        _ => {
            conn.close(
                Code::H3_INTERNAL_ERROR
                    .value()
                    .try_into()
                    .unwrap_or(quinn::VarInt::from_u32(0x102)),
                b"",
            );
            return;
        }
    };
    let streams = Rc::new(Streams::default());
    let mut quit = shared.quit.clone();
    let mut closing = false;
    let mut requests: u64 = 0;
    loop {
        let ended = streams.ended.notified();
        tokio::select! {
            r = h3c.accept() => match r {
                Ok(Some(resolver)) => {
                    requests += 1;
                    streams.active.set(streams.active.get() + 1);
                    let mut info = info.clone();
                    let started = info.started;
                    info.requests = requests;
                    // The client's address as the connection has it now
                    // (it may have migrated since the handshake).
                    info.remote = Some(conn.remote_address());
                    // The connection's TLS facts are shared by its
                    // requests (one for those in 0-RTT, one after).
                    info.tls = crate::tls::TlsState::On(if done.get() {
                        tls_done.clone()
                    } else {
                        tls_early.get_or_insert_with(|| {
                            let mut t = (*tls_done).clone();
                            t.early_data = true;
                            Arc::new(t)
                        }).clone()
                    });
                    let shared = shared.clone();
                    let st = streams.clone();
                    // Boxed: the request's future is large, and a task's
                    // future is moved into place when it is spawned.
                    tokio::task::spawn_local(Box::pin(async move {
                        let _done = Ended(st);
                        let Ok(Ok((req, stream))) = timeout(header_to, resolver.resolve_request()).await else {
                            return;
                        };
                        stream_task(req, stream, info, shared).await;
                    }));
                    // keepalive_requests / keepalive_time: GOAWAY after
                    // this request.
                    let aged = keepalive_time.is_some_and(|t| started.elapsed() >= t);
                    if (requests >= max_requests || aged) && !closing {
                        let _ = h3c.shutdown(1).await;
                        closing = true;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // The client's protocol errors are logged; its close, its
                    // silence (idle timeout) and a lost path are not.
                    if matches!(e, h3::error::ConnectionError::Local { .. }) && !e.is_h3_no_error() {
                        log_conn(&default_conf, Level::Info, &info, &format!("quic connection closed ({})", e));
                    }
                    break;
                }
            },
            _ = ended => {}
            _ = quit.changed(), if !closing => {
                // Graceful stop: GOAWAY, requests in flight finish.
                let _ = h3c.shutdown(1).await;
                closing = true;
            }
        }
        if closing && streams.active.get() == 0 {
            break;
        }
    }
    while streams.active.get() > 0 {
        streams.ended.notified().await;
    }
    // quinn's close drops what is not sent yet: the last answers must
    // reach the client first. A client closes itself after GOAWAY once
    // it has its answers; one that does not gets a moment, then
    // CONNECTION_CLOSE.
    let _ = timeout(Duration::from_secs(1), conn.closed()).await;
    conn.close(quinn::VarInt::from_u32(0x100), b"");
    // Let the endpoint driver send the CONNECTION_CLOSE before the slot
    // is given back (a stopping worker ends when none are held).
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
}

/// The `$ssl_*` facts of a QUIC connection: TLS 1.3 always; the suite,
/// resumption, group and the client's suites as `http::v3::tls` read them
/// from the hello messages.
fn tls_info(conn: &quinn::Connection) -> crate::tls::TlsInfo {
    let hd = conn
        .handshake_data()
        .and_then(|h| h.downcast::<super::tls::Handshake>().ok())
        .map(|b| *b)
        .unwrap_or_default();
    let client_chain = conn.peer_identity().and_then(|p| {
        p.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
            .ok()
            .map(|b| *b)
    });
    let mut session_id = [0u8; 32];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut session_id);
    let f = &hd.facts;
    crate::tls::TlsInfo {
        protocol: "TLSv1.3",
        cipher: f
            .suite
            .and_then(|s| crate::tls::config::openssl_name(rustls::CipherSuite::from(s)))
            .unwrap_or("TLS_AES_128_GCM_SHA256"),
        server_name: hd.server_name,
        reused: f.resumed,
        session_id,
        curve: f.group.map(rustls::NamedGroup::from),
        client_ciphers: f
            .client_suites
            .iter()
            .map(|&s| rustls::CipherSuite::from(s))
            .collect(),
        client_groups: Box::new([]),
        client_chain,
        verify: Ok(()),
        h2: false,
        early_data: false,
    }
}

/// The request body as `http::body` reads a connection: DATA frames as
/// they come. Without a content-length it is presented chunked (the
/// request says so), so the reader's limits apply as to HTTP/1.1.
struct H3Body {
    st: RefCell<BodyState>,
}

struct BodyState {
    /// Taken out when the answer is sent.
    rx: Option<ReqStream>,
    pending: Bytes,
    chunked: bool,
    eof: bool,
}

impl BodyState {
    fn poll_data(&mut self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(Ok(None));
        };
        match rx.poll_recv_data(cx) {
            Poll::Ready(Ok(Some(mut b))) => {
                let n = b.remaining();
                Poll::Ready(Ok(Some(b.copy_to_bytes(n))))
            }
            Poll::Ready(Ok(None)) => Poll::Ready(Ok(None)),
            Poll::Ready(Err(e)) => {
                Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, e)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl BodyIo for H3Body {
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.st.borrow_mut();
        if s.pending.is_empty() {
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
                if !s.pending.is_empty() || s.eof {
                    return Poll::Ready(Ok(()));
                }
                match s.poll_data(cx) {
                    Poll::Ready(Ok(Some(data))) => {
                        if data.is_empty() {
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
                    Poll::Ready(Ok(None)) => {
                        s.eof = true;
                        if s.chunked {
                            s.pending = Bytes::from_static(b"0\r\n\r\n");
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
        }))
    }
    /// The client reset the request stream (or the connection ended)
    /// while the request waits (limit_req's delay, an upstream's head):
    /// nginx's ngx_http_test_reading ends the request as 499. Body bytes
    /// that come meanwhile are kept for the body reader, and from then on
    /// nothing is watched, as over HTTP/1.
    fn hangup(&self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(async move {
            if self.readable().await.is_ok() {
                std::future::pending::<()>().await;
            }
        })
    }
    // No `100 Continue` over HTTP/3: flow control is the permission.
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

async fn stream_task(
    req: http::Request<()>,
    stream: ReqStream,
    info: ConnInfo,
    shared: Arc<WorkerShared>,
) {
    let config = shared.config.load_full();
    let Some(http) = config.http.clone() else {
        return;
    };
    let http = &http;
    let Some(addr) = http.addr_for(&info.listen, None) else {
        return;
    };
    shared.stats.request();
    let _writing = crate::core::worker::StateGuard::enter(&shared.stats.writing);
    let (parts, ()) = req.into_parts();
    let body = H3Body {
        st: RefCell::new(BodyState {
            rx: Some(stream),
            pending: Bytes::new(),
            chunked: false,
            eof: false,
        }),
    };
    // HTTP/3 has no end-of-stream flag on HEADERS: a request without a
    // body usually ends in the packet that carried its HEADERS, so what
    // the stream already holds tells (a FIN: no body).
    {
        let mut s = body.st.borrow_mut();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match s.poll_data(&mut cx) {
            Poll::Ready(Ok(None)) => s.eof = true,
            Poll::Ready(Ok(Some(d))) => s.pending = d,
            Poll::Ready(Err(_)) => return,
            Poll::Pending => {}
        }
    }
    let has_body = {
        let s = body.st.borrow();
        !(s.eof && s.pending.is_empty())
    };
    let mut req: Request = match crate::http::fields::request(
        crate::http::v2::conn::pseudo(&parts),
        crate::http::v2::conn::fields(&parts),
        b"HTTP/3.0",
        &addr.default.srv,
    ) {
        Ok(r) => r,
        Err(mut rej) => {
            if rej.host.is_none() {
                rej.host = crate::http::v2::conn::host_of(&parts).map(<[u8]>::to_vec);
            }
            if let Some(mut rx) = body.st.into_inner().rx {
                phases::refused(&mut rx, rej, http, &addr, &info, &shared).await;
            }
            return;
        }
    };
    let has_body = has_body && req.content_length != Some(0);
    if has_body && req.content_length.is_none() {
        req.chunked = true;
    }
    {
        let mut s = body.st.borrow_mut();
        s.chunked = req.chunked;
        if s.chunked && !s.pending.is_empty() {
            let data = std::mem::take(&mut s.pending);
            let mut v = Vec::with_capacity(data.len() + 16);
            v.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
            v.extend_from_slice(&data);
            v.extend_from_slice(b"\r\n");
            s.pending = Bytes::from(v);
        }
    }
    let server = addr.select(req.host()).clone();
    let mut cx = phases::Ctx::new(http, &req, &server, &info, &shared);
    if has_body {
        cx.body = Some(crate::http::body::ReqBody::new(&body, Vec::new()));
    }
    cx.client = Some(&body);
    let since = cx.start;
    let mut resp = tokio::select! {
        biased;
        r = phases::run(&mut cx) => r,
        () = shared.cut_off(since) => {
            // worker_shutdown_timeout ran out before the answer: the
            // stream is reset and the request ends as one the client
            // closed (nginx logs 499), as over HTTP/2.
            stop(&body, Code::H3_INTERNAL_ERROR);
            phases::log_done(&mut cx, 499);
            return;
        }
    };
    let mut scratch = Vec::new();
    let body_end = crate::http::body::give_back(&mut cx, &mut scratch);
    let loc = cx.loc.clone();
    if let crate::http::body::End::Broken { silent: true, .. } = body_end {
        phases::log_done(&mut cx, resp.status);
        stop(&body, Code::H3_REQUEST_CANCELLED);
        return;
    }
    if resp.close_silently {
        phases::log_done(&mut cx, resp.status);
        stop(&body, Code::H3_INTERNAL_ERROR);
        return;
    }
    // A body nobody read is not waited for (RFC 9114 4.1, as nginx
    // discards a request body over HTTP/3): the answer goes now, and
    // when the stream is dropped after it quinn tells the client to stop
    // sending (STOP_SENDING with code 0; nginx sends H3_NO_ERROR, but
    // h3-quinn's stop_sending panics while a read is pending, as the
    // first look at the body above leaves one).
    let head_only = req.method == crate::http::request::Method::Head;
    // The handlers are done with the body: the stream is taken out for
    // the answer.
    let Some(mut rx) = body.st.borrow_mut().rx.take() else {
        return;
    };
    let r = tokio::select! {
        biased;
        r = send(&mut rx, &mut resp, &loc, head_only, &mut cx.sent) => r,
        () = shared.cut_off(since) => {
            // worker_shutdown_timeout ran out while the answer was going
            // out: reset, logged with its status and the bytes sent so
            // far.
            rx.stop_stream(Code::H3_INTERNAL_ERROR);
            phases::log_done(&mut cx, resp.status);
            return;
        }
    };
    let mut status = resp.status;
    match r {
        Ok(()) => cx.sent.complete = true,
        Err(e) => {
            rx.stop_stream(Code::H3_INTERNAL_ERROR);
            if e.kind() == io::ErrorKind::NotConnected {
                // The client stopped or reset the stream before the
                // answer could start: as nginx, which notices that while
                // the answer is awaited, "client closed request".
                status = 499;
            }
        }
    }
    let answered = cx.sent.complete;
    drop(rx);
    phases::wrap_up(&mut cx, status, answered).await;
}

/// HTTP/3's framing of an answer to a refused request (see
/// [`phases::refused`]).
impl phases::StreamAnswer for ReqStream {
    fn send<'s>(
        &'s mut self,
        resp: &'s mut Response,
        loc: &'s LocConf,
        head_only: bool,
        sent: &'s mut phases::Sent,
    ) -> impl Future<Output = io::Result<()>> + 's {
        send(self, resp, loc, head_only, sent)
    }
    fn reset(&mut self) {
        self.stop_stream(Code::H3_INTERNAL_ERROR);
    }
}

fn stop(body: &H3Body, code: Code) {
    if let Some(rx) = body.st.borrow_mut().rx.as_mut() {
        rx.stop_stream(code);
    }
}

fn h3_io(e: h3::error::StreamError) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, e)
}

/// Sends the response: HEADERS, the body as DATA (files read through the
/// file-I/O layer, through the body filters), trailers, FIN.
async fn send(
    tx: &mut ReqStream,
    resp: &mut Response,
    loc: &LocConf,
    head_only: bool,
    sent: &mut phases::Sent,
) -> io::Result<()> {
    let (head, text) = response::field_list_head(resp, loc, b"HTTP/3.0");
    sent.bytes = text.len() as u64;
    sent.head = text;
    let to = Duration::from_millis(loc.core.send_timeout.unwrap_or(60_000));
    let timed = |r: Result<Result<(), h3::error::StreamError>, tokio::time::error::Elapsed>| match r
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(h3_io(e)),
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "send_timeout")),
    };
    // The head not taken: the stream is gone (NotConnected tells the
    // caller the answer never started).
    match timeout(to, tx.send_response(head)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(io::Error::new(io::ErrorKind::NotConnected, e)),
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "send_timeout")),
    }
    // Trailers that come with the end of a streamed body (gRPC's).
    let mut late = Vec::new();
    let no_body = head_only
        || (resp.filters.is_empty()
            && match &resp.body {
                Body::Empty => true,
                Body::Bytes(b) => b.is_empty(),
                Body::Shared(b) => b.is_empty(),
                _ => false,
            });
    if !no_body {
        let policy = resp.io.take().unwrap_or_default();
        let mut out = Out {
            tx: &mut *tx,
            to,
            sent: &mut *sent,
        };
        let mut filters = std::mem::take(&mut resp.filters);
        let body = std::mem::take(&mut resp.body);
        let piece = loc.io.output_buffers().1.max(16 * 1024) as u64;
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
                        out.data(Bytes::from(b)).await
                    } else {
                        out.filtered(&mut filters, &b, true).await
                    }
                }
                Body::Shared(b) => {
                    if filters.is_empty() {
                        out.data(b).await
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
    }
    let mut all = std::mem::take(&mut resp.trailers);
    all.append(&mut late);
    if !all.is_empty() && !head_only {
        let mut hm = http::HeaderMap::new();
        for (n, v) in &all {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(n.as_bytes()),
                http::HeaderValue::from_bytes(v),
            ) {
                hm.append(n, v);
            }
        }
        timed(timeout(to, tx.send_trailers(hm)).await)?;
    }
    timed(timeout(to, tx.finish()).await)
}

/// A response body on its way out as DATA frames.
struct Out<'o> {
    tx: &'o mut ReqStream,
    to: Duration,
    sent: &'o mut phases::Sent,
}

impl Out<'_> {
    /// Sends `data`, waiting (at most send_timeout) for the stream's
    /// flow-control credit.
    async fn data(&mut self, data: Bytes) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.sent.body_bytes += data.len() as u64;
        self.sent.bytes += data.len() as u64;
        match timeout(self.to, self.tx.send_data(data)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(h3_io(e)),
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "send_timeout")),
        }
    }

    async fn filtered(
        &mut self,
        filters: &mut [Box<dyn response::BodyFilter>],
        input: &[u8],
        last: bool,
    ) -> io::Result<()> {
        if filters.is_empty() {
            return self.data(Bytes::copy_from_slice(input)).await;
        }
        let mut out = Vec::new();
        response::run_filters(filters, input, last, &mut out)?;
        self.data(Bytes::from(out)).await
    }

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
                        let n = (end - off).min(buf);
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
                            self.data(data).await?;
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
