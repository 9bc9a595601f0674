//! An upstream response head turned into the client's [`Response`], once
//! for every protocol (nginx's ngx_http_upstream_process_headers and
//! _send_response): the headers relayed (hop-by-hop and the protocol's
//! hidden ones dropped, `PREFIX_hide_header`/`_pass_header`, the
//! protocol's Location and Set-Cookie rewrites), `X-Accel-Charset`,
//! `X-Accel-Limit-Rate`, `X-Accel-Buffering`, `PREFIX_intercept_errors`,
//! ranges, a 101 into a tunnel, and the body: complete with the head
//! (memory), or streamed by a [`Producer`] into the pipe, a cache entry
//! or a `PREFIX_store` file.

use std::borrow::Cow;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::cache::{entry_head, freshness, req_headers, start_cache_file, store_target, CacheReq};
use super::conf::*;
use super::fetch::{log_upstream, UpLog, UpResp};
use super::peers::Upstream;
use super::pipe::{complete_stream, named_temp, CacheOut, Consumer, Pipe, Producer, StoreOut};
use super::Protocol;
use crate::cache::UpdateGuard;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::response::{Body, Response};
use crate::io::Policy;

/// Framing and hop-by-hop headers: never relayed. (`Upgrade` is: nginx
/// passes it on any response, and a 101 needs it.)
const HOP: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
];

/// The part of the URI the location matched (what `proxy_redirect
/// default` puts back).
pub fn loc_prefix<'c>(cx: &'c Ctx<'_>) -> &'c [u8] {
    cx.uri.get(..cx.loc_prefix_len).unwrap_or(b"")
}

/// The headers that go to the client (and into a cache file).
pub fn relayed(
    proto: &dyn Protocol,
    prefix: &[u8],
    hs: &[(String, Vec<u8>)],
) -> Vec<(String, Vec<u8>)> {
    let conf = proto.conf();
    let hidden = proto.hidden();
    let pass_list: &[String] = conf.pass_headers.as_deref().map_or(&[], |v| v);
    let hide_list: &[String] = conf.hide.as_deref().map_or(&[], |v| v);
    let mut out = Vec::new();
    for (n, v) in hs {
        let l = n.to_ascii_lowercase();
        if HOP.contains(&l.as_str()) || hide_list.contains(&l) {
            continue;
        }
        if hidden.contains(&l.as_str()) && !pass_list.contains(&l) {
            continue;
        }
        let rewritten = match l.as_str() {
            "location" => proto.rewrite_location(prefix, v),
            "refresh" => proto.rewrite_refresh(v),
            _ => None,
        };
        if let Some(v) = rewritten {
            out.push((n.clone(), v));
            continue;
        }
        out.push((n.clone(), v.clone()));
    }
    out
}

/// Which of tern's own `Server` and `Date` fields an upstream answer
/// keeps: where the protocol relays upstream's (FastCGI's), its own stand
/// back when upstream sent one; where `PREFIX_pass_header` names one and
/// the protocol says so (proxy's: nginx adds empty stand-ins for the two
/// when upstream sends none), tern's own is never sent.
pub fn own_fields(out: &mut Response, proto: &dyn Protocol) {
    out.upstream_server_date = proto.relays_date();
    if proto.passed_replace_own() {
        let passed: &[String] = proto.conf().pass_headers.as_deref().map_or(&[], |v| v);
        out.no_own_server = passed.iter().any(|n| n == "server");
        out.no_own_date = passed.iter().any(|n| n == "date");
    }
}

/// The headers a cache entry keeps: those relayed, and upstream's
/// `X-Accel-Charset` even where it is not relayed, as nginx keeps
/// upstream's whole head in the file and reads it again for each answer
/// (the charset filter's destination, see [`entry_fields`]).
pub fn stored_headers(
    relayed: &[(String, Vec<u8>)],
    upstream: &[(String, Vec<u8>)],
) -> Vec<(String, Vec<u8>)> {
    let mut out = relayed.to_vec();
    if header(relayed, "x-accel-charset").is_none() {
        if let Some((n, v)) = upstream
            .iter()
            .rev()
            .find(|(n, _)| n.eq_ignore_ascii_case("x-accel-charset"))
        {
            out.push((n.clone(), v.clone()));
        }
    }
    out
}

/// A response from a cache entry takes what a fresh answer takes from
/// upstream's head: tern's own `Server` / `Date` or not ([`own_fields`]),
/// and the charset `X-Accel-Charset` names (the header itself leaves
/// unless the location relays it).
pub fn entry_fields(r: &mut Response, proto: &dyn Protocol) {
    own_fields(r, proto);
    let Some(i) = r
        .headers
        .iter()
        .rposition(|(n, _)| n.eq_ignore_ascii_case("x-accel-charset"))
    else {
        return;
    };
    let conf = proto.conf();
    let passed = conf
        .pass_headers
        .as_deref()
        .is_some_and(|p| p.iter().any(|n| n == "x-accel-charset"));
    let hidden_here = conf
        .hide
        .as_deref()
        .is_some_and(|h| h.iter().any(|n| n == "x-accel-charset"));
    let relayed = !hidden_here && (passed || !proto.hidden().contains(&"x-accel-charset"));
    let v = if relayed {
        r.headers[i].1.clone()
    } else {
        r.headers.remove(i).1
    };
    if conf.ignore_headers.unwrap_or(0) & IGN_X_ACCEL_CHARSET == 0 {
        r.override_charset = Some(String::from_utf8_lossy(&v).into_owned());
    }
}

/// Whether the upstream connection can go back to the keepalive cache
/// once its body was read whole.
pub fn reusable(r: &UpResp) -> bool {
    r.keep && !r.decoder.extra() && !r.decoder.by_close()
}

/// An answer that is not relayed (retried, or replaced by an error page)
/// whose body came whole with its head leaves its connection to the
/// keepalive cache, as nginx's keepalive peer takes it back when the
/// protocol set `u->keepalive` with the head (memcached's `END`).
pub fn release_unread(up: &Upstream, r: &mut UpResp) {
    if r.early.is_empty() && r.decoder.done() && reusable(r) {
        if let Some(s) = r.stream.take() {
            up.put_idle(r.peer.clone(), s, r.requests);
        }
    }
}

pub fn header<'h>(hs: &'h [(String, Vec<u8>)], name: &str) -> Option<&'h [u8]> {
    hs.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

/// A comma-separated header value lists `tok`.
pub fn has_token(v: &[u8], tok: &str) -> bool {
    v.split(|&c| c == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(tok.as_bytes()))
}

/// `msg` (said `... while reading upstream`) with another context.
fn with_context(msg: &str, context: &str) -> String {
    match msg.strip_suffix("while reading upstream") {
        Some(m) => format!("{}{}", m, context),
        None => msg.to_string(),
    }
}

/// The response for a fetched head: headers, then the body as it comes.
#[allow(clippy::too_many_arguments)]
pub(super) async fn respond(
    cx: &mut Ctx<'_>,
    proto: &Arc<dyn Protocol>,
    up: &Arc<Upstream>,
    lim: &Limits,
    mut resp: UpResp,
    creq: Option<CacheReq>,
    mut guard: Option<UpdateGuard>,
    head_only: bool,
    policy: Policy,
) -> Response {
    let conf = proto.conf();
    let mut relayed = relayed(&**proto, loc_prefix(cx), &resp.headers);
    proto.rewrite_cookies(cx, &mut relayed);
    if resp.status == 101
        && proto.upgrades()
        && cx.req.header("upgrade").is_some()
        && cx.sub_depth == 0
    {
        return upgrade_answer(cx, &**proto, resp, relayed, lim);
    }
    let store = creq
        .as_ref()
        .filter(|c| !c.no_store)
        .and_then(|c| freshness(conf, resp.status, &resp.headers).map(|v| (c, v)));

    // The body: what came with the head is decoded now; a body complete
    // with it (and not being cached) is answered from memory, anything
    // else streams to the client while it arrives (see `Producer`).
    let url = proto.url(&resp.peer_name);
    // $upstream_response_length: what came with the head is the body's
    // (counted once the answer is known to be relayed).
    let with_head = resp.early.len() + resp.body.len();
    let mut first = std::mem::take(&mut resp.body);
    let buffering = buffering(conf, &resp.headers);
    // nginx reads what came with the head as part of the head without
    // buffering, and as the body with it.
    let early_context = if buffering {
        "while reading upstream"
    } else {
        "while reading response header from upstream"
    };
    if let Err(f) = resp
        .decoder
        .feed(&std::mem::take(&mut resp.early), &mut first)
    {
        log_upstream(cx, Level::Error, &with_context(&f.msg, early_context), &url);
        // nginx has "sent" the head already and closes the connection
        // without a word.
        let mut r = Response::status(f.status);
        r.close_silently = true;
        return r;
    }
    for e in resp.decoder.logs() {
        log_upstream(cx, Level::Error, &e, &url);
    }
    // (A HEAD answer's body is not read, even when upstream sends one.)
    if let Some(w) = resp.decoder.extra_warning().filter(|_| !head_only) {
        log_upstream(cx, Level::Warn, &format!("{} {}", w, early_context), &url);
    }
    if conf.ignore_headers.unwrap_or(0) & IGN_X_ACCEL_LIMIT_RATE == 0 {
        // The response's rate in bytes per second (nginx's ngx_atoi: digits
        // only; each valid header sets it, so the last one wins). nginx
        // applies it while parsing the head, so it holds for an
        // intercepted error or an X-Accel-Redirect target too.
        if let Some(n) = resp
            .headers
            .iter()
            .rev()
            .filter(|(n, _)| n.eq_ignore_ascii_case("x-accel-limit-rate"))
            .filter_map(|(_, v)| {
                let v = std::str::from_utf8(v).ok()?;
                v.bytes()
                    .all(|c| c.is_ascii_digit())
                    .then(|| v.parse::<u64>().ok())
                    .flatten()
            })
            .next()
        {
            cx.set_note(crate::http::modules::rewrite::LIMIT_RATE, n.to_string());
        }
    }
    if proto.intercepts(resp.status)
        || (resp.status >= 300
            && conf.intercept_errors.unwrap_or(false)
            && has_error_page(&cx.loc, resp.status))
    {
        // PREFIX_intercept_errors: let error_page answer instead. A
        // cacheable error is remembered in the zone (nginx's
        // ngx_http_upstream_intercept_errors; PREFIX_no_cache is not
        // consulted there, as in nginx).
        if let Some(c) = &creq {
            if let Some(f) = freshness(conf, resp.status, &resp.headers) {
                c.zone.set_error(c.main, resp.status, f.valid_until);
            }
        }
        release_unread(up, &mut resp);
        let mut r = Response::status(resp.status);
        if resp.status == 401 {
            // The challenge goes with the page error_page makes (every
            // WWW-Authenticate line, as nginx from 1.23 on).
            r.headers.extend(
                relayed
                    .iter()
                    .filter(|(n, _)| n.eq_ignore_ascii_case("www-authenticate"))
                    .map(|(n, v)| (Cow::Owned(n.clone()), v.clone())),
            );
        }
        return r;
    }
    if conf.ignore_headers.unwrap_or(0) & IGN_X_ACCEL_REDIRECT == 0 {
        if let Some(v) = header(&resp.headers, "x-accel-redirect") {
            // nginx's ngx_http_upstream_process_headers: the answer is
            // dropped (its connection too), a few of its headers stay
            // for the response the redirect target makes.
            let carried = relayed
                .iter()
                .filter(|(n, _)| CARRIED.iter().any(|c| n.eq_ignore_ascii_case(c)))
                .cloned()
                .collect();
            let target = v.to_vec();
            resp.slot.finish();
            cx.memo.borrow_mut().push((
                ACCEL_KEY,
                Box::new(AccelRedirect {
                    target: Some(target),
                    carried,
                }),
            ));
            return Response::status(200);
        }
    }
    resp.slot.body(with_head);
    let (mem_max, temp_max) = if buffering {
        (lim.mem_max, lim.temp_max)
    } else {
        (lim.head_max, 0)
    };
    // nginx does not cache what it does not buffer.
    let store = store.filter(|_| buffering);
    let cache_out = match &store {
        Some((c, fresh)) => {
            let target = store_target(c, conf, &resp.headers, &req_headers(cx));
            let mut eh = entry_head(c, &resp, &relayed, *fresh, &target, 0);
            if let Some(n) = resp.declared_len.filter(|_| head_only) {
                // A HEAD response stored as such (PREFIX_cache_convert_head
                // off): its entry keeps the length it announced.
                eh.headers
                    .push(("Content-Length".into(), n.to_string().into_bytes()));
            }
            let base = eh.header_len() as u64;
            match start_cache_file(c, &target.md5, &policy).await {
                Ok((file, path)) => Some(CacheOut {
                    zone: c.zone.clone(),
                    md5: target.md5,
                    file,
                    path,
                    eh,
                    base,
                    written: 0,
                    declared: resp.declared_len,
                    held: None,
                    _guard: guard.take(),
                }),
                Err(e) => {
                    // The response is still served; it just is not stored.
                    cx.log(
                        Level::Crit,
                        &format!(
                            "cannot create cache temp file in \"{}\" {}",
                            c.zone.conf.path.display(),
                            crate::core::errno_text(&e)
                        ),
                    );
                    None
                }
            }
        }
        None => None,
    };

    // PREFIX_store: a 200 read whole goes to its own file as well.
    let store_to = conf.store.as_ref().and_then(|s| s.as_ref());
    let store_out = match store_to {
        Some(to)
            if cache_out.is_none()
                && resp.status == 200
                && buffering
                && !head_only
                && !resp.no_body =>
        {
            let dest = match to {
                StoreTo::Root => cx.request_filename(),
                StoreTo::Path(t) => t.render_vec(&*cx),
            };
            let dest = PathBuf::from(std::ffi::OsString::from_vec(dest));
            let dir = conf
                .temp_path
                .clone()
                .unwrap_or_else(|| proto.temp_default().to_path_buf());
            match named_temp(&dir, &policy).await {
                Ok((file, path)) => Some(StoreOut {
                    file,
                    path,
                    dest,
                    mode: conf.store_access.unwrap_or(0o600),
                    mtime: header(&resp.headers, "last-modified")
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .and_then(|s| httpdate::parse_http_date(s.trim()).ok()),
                    written: 0,
                }),
                Err(e) => {
                    cx.log(
                        Level::Crit,
                        &format!(
                            "cannot create temp file in \"{}\" {}",
                            dir.display(),
                            crate::core::errno_text(&e)
                        ),
                    );
                    None
                }
            }
        }
        _ => None,
    };

    let mut out = Response::status(resp.status);
    if !resp.status_line.is_empty() {
        out.status_line = Some((resp.status, std::mem::take(&mut resp.status_line)));
    }
    own_fields(&mut out, &**proto);
    apply_headers(&mut out, relayed);
    // As nginx: only a response being cached answers If-Modified-Since
    // and the like itself; any other goes as upstream answered.
    out.disable_not_modified = store.is_none();
    if conf.ignore_headers.unwrap_or(0) & IGN_X_ACCEL_CHARSET == 0 {
        // The charset filter's destination; nginx takes the last one.
        out.override_charset = resp
            .headers
            .iter()
            .rev()
            .find(|(n, _)| n.eq_ignore_ascii_case("x-accel-charset"))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    }
    // Ranges, as nginx: a response being cached may be cut to one range
    // when upstream allows ranges, PREFIX_force_ranges cuts any; anything
    // else passes as it came (the Range header went upstream).
    if conf.force_ranges.unwrap_or(false) {
        force_ranges(&mut out);
    } else if store.is_some() {
        out.single_range = true;
    } else if proto.ranges() {
        // Rangeable as a file is: the range filter sees the mark.
        out.headers
            .push((Cow::Borrowed("Accept-Ranges"), b"bytes".to_vec()));
    } else {
        out.ranges_off = true;
    }
    if (head_only || resp.no_body) && cache_out.is_none() && resp.decoder.done() {
        // Nothing to read (an answer to HEAD, a 204, a 304): the
        // connection is free at once, as nginx finds it.
        if reusable(&resp) {
            if let Some(s) = resp.stream.take() {
                up.put_idle(resp.peer.clone(), s, resp.requests);
            }
        }
    }
    if head_only && cache_out.is_none() {
        out.content_length = resp.declared_len;
        out.body = Body::Bytes(Vec::new());
        return out;
    }
    if resp.no_body && cache_out.is_none() {
        out.body = Body::Bytes(Vec::new());
        return out;
    }
    if resp.status == 101 && buffering && cache_out.is_none() && store_out.is_none() {
        return held_101(cx, resp, out, first, lim, &url).await;
    }
    // What the client is told of the length.
    let length = resp.declared_len.filter(|_| !resp.no_body);
    if let Some(body) = resp.session_body.take() {
        // A session's body (gRPC's messages) goes to the client as it
        // arrives, unbuffered as nginx's grpc module sends it.
        out.content_length = length;
        if length.is_none() && cx.req.minor == 0 {
            out.force_close = true;
        }
        out.body = Body::Stream(Box::new(Counted {
            inner: body,
            slot: resp.slot.take(),
        }));
        return out;
    }
    if resp.decoder.done() && cache_out.is_none() && store_out.is_none() {
        if reusable(&resp) {
            if let Some(s) = resp.stream.take() {
                up.put_idle(resp.peer.clone(), s, resp.requests);
            }
        }
        match length {
            Some(_) => {
                out.content_length = Some(first.len() as u64);
                out.body = Body::Bytes(first);
            }
            None => {
                // Chunked from upstream: nginx does not know the length
                // before the end either, and relays it chunked.
                out.force_close = cx.req.minor == 0;
                out.body = complete_stream(first, policy);
            }
        }
        // A session's trailers (gRPC's grpc-status) follow the body.
        out.trailers.append(&mut resp.trailers);
        return out;
    }
    let Some(stream) = resp.stream.take() else {
        log_upstream(cx, Level::Error, "upstream connection lost", &url);
        return Response::status(502);
    };
    out.content_length = length;
    if out.content_length.is_none() && cx.req.minor == 0 {
        // An HTTP/1.0 client learns the end from the close.
        out.force_close = true;
    }
    let pipe = Arc::new(Pipe::default());
    if let Some(c) = &cache_out {
        pipe.lock().file = Some(c.file.clone());
    }
    let keep = reusable(&resp).then(|| (up.clone(), resp.peer.clone(), resp.requests));
    let producer = Producer {
        pipe: pipe.clone(),
        stream,
        _lease: resp.lease.take(),
        decoder: resp.decoder,
        read_timeout: lim.read,
        mem_max,
        temp_max,
        buffered: buffering,
        temp_dir: conf
            .temp_path
            .clone()
            .unwrap_or_else(|| proto.temp_default().to_path_buf()),
        policy: policy.clone(),
        temp: None,
        temp_len: 0,
        cache: cache_out,
        keep,
        log: UpLog::of(cx, &url),
        limit_rate: super::conf::limit_rate(conf, Some(&*cx)),
        store: store_out,
        slot: resp.slot.take(),
    };
    if cx.method == crate::http::request::Method::Head
        && producer.cache.is_some()
        && out.content_length.is_some()
        && !resp.no_body
    {
        // A HEAD answered with a GET being cached (PREFIX_cache_convert_head):
        // the client takes no body, and a request that follows must find
        // the entry, as it does with nginx, which has stored it by the time
        // it is done with the HEAD. So the entry is written first.
        producer.run(first).await;
        out.body = Body::Bytes(Vec::new());
        return out;
    }
    if resp.no_body {
        // Stored all the same (an empty entry); the client needs nothing.
        // The entry is in place before the answer goes, as with nginx: a
        // request that follows finds it (no last piece of a body holds
        // the answer back here).
        producer.run(first).await;
        out.content_length = if head_only { resp.declared_len } else { None };
        out.force_close = false;
        out.body = Body::Bytes(Vec::new());
        return out;
    }
    tokio::spawn(producer.run(first));
    out.body = Body::Stream(Box::new(Consumer { pipe, policy }));
    out.watch_client = !conf.ignore_client_abort.unwrap_or(false);
    out
}

/// A 101 the client did not ask for (no `Upgrade` in its request), with
/// proxy_buffering on: as nginx's buffers hold what follows it, the bytes
/// are read until upstream closes and then sent after the head, unframed,
/// the client connection kept as nginx keeps it; if upstream fails or
/// times out first, only the head goes and the connection closes.
async fn held_101(
    cx: &mut Ctx<'_>,
    mut resp: UpResp,
    mut out: Response,
    mut body: Vec<u8>,
    lim: &Limits,
    url: &str,
) -> Response {
    out.content_length = None;
    let Some(mut s) = resp.stream.take() else {
        out.force_close = true;
        out.body = Body::Bytes(Vec::new());
        return out;
    };
    let mut buf = vec![0u8; 16 * 1024];
    let complete = loop {
        if resp.decoder.done() {
            break true;
        }
        let n = match super::fetch::timed_read(
            &mut s,
            &mut buf,
            lim.read,
            "while reading upstream",
            false,
            "readv()",
        )
        .await
        {
            Ok(n) => n,
            Err(f) => {
                log_upstream(cx, Level::Error, &f.msg, url);
                break false;
            }
        };
        if n == 0 {
            break true;
        }
        resp.slot.received(n);
        resp.slot.body(n);
        if resp.decoder.feed(&buf[..n], &mut body).is_err() || body.len() > lim.mem_max {
            break false;
        }
    };
    resp.slot.finish();
    out.force_close = !complete;
    out.body = Body::Bytes(if complete { body } else { Vec::new() });
    out
}

/// A 101 to a request with an `Upgrade` header (any value, any HTTP
/// version: nginx's test is the header's presence): the head is relayed
/// (with the upstream's Content-Length, if any, though nothing is framed
/// by it) and the connection turns into a tunnel (crate::http::tunnel).
fn upgrade_answer(
    cx: &mut Ctx<'_>,
    proto: &dyn Protocol,
    mut resp: UpResp,
    relayed: Vec<(String, Vec<u8>)>,
    lim: &Limits,
) -> Response {
    let url = proto.url(&resp.peer_name);
    let Some(up) = resp.stream.take() else {
        log_upstream(cx, Level::Error, "upstream connection lost", &url);
        return Response::status(502);
    };
    let mut out = Response::status(101);
    if !resp.status_line.is_empty() {
        out.status_line = Some((101, std::mem::take(&mut resp.status_line)));
    }
    apply_headers(&mut out, relayed);
    out.content_length = resp.declared_len;
    out.disable_not_modified = true;
    out.ranges_off = true;
    out.force_close = true;
    out.upgrade = Some(Box::new(crate::http::tunnel::Upgrade {
        up,
        early: std::mem::take(&mut resp.early),
        read_timeout: lim.read,
        send_timeout: lim.send,
        buffer: lim.head_max,
        url,
        _lease: resp.lease.take(),
    }));
    out
}

/// Moves relayed headers into a response (Content-Type to its field).
pub fn apply_headers(r: &mut Response, headers: Vec<(String, Vec<u8>)>) {
    for (n, v) in headers {
        if n.eq_ignore_ascii_case("content-length") {
            // Only a stored HEAD response has one; see entry_response.
            continue;
        }
        if n.eq_ignore_ascii_case("content-type") {
            r.content_type = Some(String::from_utf8_lossy(&v).into());
            r.charset_param = true;
        } else if n.eq_ignore_ascii_case("last-modified") {
            // Relayed as it came, in its place (as nginx); the filters
            // (not_modified, If-Range, expires modified) get the time of
            // the last one.
            r.last_modified = std::str::from_utf8(&v)
                .ok()
                .and_then(|s| httpdate::parse_http_date(s).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs() as i64);
            r.last_modified_listed = true;
            r.headers.push((Cow::Owned(n), v));
        } else {
            r.headers.push((Cow::Owned(n), v));
        }
    }
}

/// PREFIX_buffering, unless upstream says otherwise (X-Accel-Buffering).
pub fn buffering(conf: &UpstreamConf, hs: &[(String, Vec<u8>)]) -> bool {
    let mut buffering = conf.buffering.unwrap_or(true);
    if conf.ignore_headers.unwrap_or(0) & IGN_X_ACCEL_BUFFERING == 0 {
        match header(hs, "x-accel-buffering") {
            Some(v) if v.eq_ignore_ascii_case(b"yes") => buffering = true,
            Some(v) if v.eq_ignore_ascii_case(b"no") => buffering = false,
            _ => {}
        }
    }
    buffering
}

/// `PREFIX_force_ranges`: upstream's `Accept-Ranges` gives way to the
/// range filter's mark (the filter writes its own header), one range at most.
pub fn force_ranges(r: &mut Response) {
    r.remove_header("accept-ranges");
    r.headers
        .push((Cow::Borrowed("Accept-Ranges"), b"bytes".to_vec()));
    r.single_range = true;
}

pub fn has_error_page(loc: &LocConf, status: u16) -> bool {
    loc.modules.error_page.find(status).is_some()
}

// ---- X-Accel-Redirect ---------------------------------------------------

/// Headers of an X-Accel-Redirect answer that the redirect's response
/// keeps (nginx's upstream header table, `redirect` set).
const CARRIED: &[&str] = &[
    "content-type",
    "set-cookie",
    "content-disposition",
    "cache-control",
    "expires",
    "accept-ranges",
];

const ACCEL_KEY: &str = "x_accel_redirect";

/// An X-Accel-Redirect seen by [`respond`]: the target, taken by
/// [`accel_redirect`] after the content handler; the headers, applied to
/// the final response by [`accel_carried`].
struct AccelRedirect {
    target: Option<Vec<u8>>,
    carried: Vec<(String, Vec<u8>)>,
}

/// After a content handler: the internal redirect an upstream asked for
/// with X-Accel-Redirect, as nginx makes it: `@name` a named location,
/// else the URI (its `?args` the request's args, `%XX` unescaped, `..`
/// refused with 404), the method GET (HEAD stays), and as for any nginx
/// internal redirect, the server's rewrite directives run again.
pub async fn accel_redirect(cx: &mut Ctx<'_>) -> Option<crate::http::phases::Step> {
    use crate::http::phases::Step;
    let target = {
        let mut memo = cx.memo.borrow_mut();
        let (_, b) = memo.iter_mut().find(|(k, _)| *k == ACCEL_KEY)?;
        b.downcast_mut::<AccelRedirect>()?.target.take()?
    };
    if cx.method != crate::http::request::Method::Head {
        cx.method = crate::http::request::Method::Get;
    }
    if let Some(name) = target.strip_prefix(b"@") {
        return Some(Step::Named(format!("@{}", String::from_utf8_lossy(name))));
    }
    let Some((path, args)) = unsafe_uri(&target) else {
        cx.log(
            Level::Error,
            &format!(
                "unsafe URI \"{}\" was detected",
                String::from_utf8_lossy(&target)
            ),
        );
        return Some(Step::done(Response::status(404)));
    };
    cx.args = args.map(Cow::Owned);
    cx.uri = Cow::Owned(path.clone());
    if let Some(r) = cx.internal_redirect(path) {
        return Some(Step::done(r));
    }
    // internal_redirect counted this hop; the phases count it again.
    cx.redirects = cx.redirects.saturating_sub(1);
    let srv = cx.server.conf.clone();
    Some(
        match crate::http::modules::rewrite::run(cx, &srv.modules.rewrite.ops).await {
            Step::Next | Step::Delay(_) => Step::Redirect(cx.uri.to_vec()),
            other => other,
        },
    )
}

/// The X-Accel-Redirect answer's kept headers on the response the
/// redirect made (its Content-Type wins, as nginx's is set first).
pub fn accel_carried(cx: &Ctx<'_>, r: &mut Response) {
    let mut memo = cx.memo.borrow_mut();
    let Some(a) = memo
        .iter_mut()
        .find(|(k, _)| *k == ACCEL_KEY)
        .and_then(|(_, b)| b.downcast_mut::<AccelRedirect>())
    else {
        return;
    };
    for (n, v) in std::mem::take(&mut a.carried) {
        if n.eq_ignore_ascii_case("content-type") {
            r.content_type = Some(String::from_utf8_lossy(&v).into());
        } else {
            r.headers.retain(|(h, _)| !h.eq_ignore_ascii_case(&n));
            r.headers.push((Cow::Owned(n), v));
        }
    }
}

/// nginx's ngx_http_parse_unsafe_uri: the path (unescaped when it has
/// `%`) and the args; None for a path with `..` segments or a NUL.
pub(crate) fn unsafe_uri(v: &[u8]) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let (raw, args) = match v.iter().position(|&b| b == b'?') {
        Some(q) => (&v[..q], Some(v[q + 1..].to_vec())),
        None => (v, None),
    };
    let path = if raw.contains(&b'%') {
        let mut out = Vec::with_capacity(raw.len());
        let mut i = 0;
        while i < raw.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            match (
                raw[i],
                raw.get(i + 1).copied().and_then(hex),
                raw.get(i + 2).copied().and_then(hex),
            ) {
                (b'%', Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                }
                (b, _, _) => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        out
    } else {
        raw.to_vec()
    };
    if path.contains(&0) || args.as_ref().is_some_and(|a| a.contains(&0)) {
        return None;
    }
    if path.split(|&b| b == b'/').any(|seg| seg == b"..") {
        return None;
    }
    Some((path, args))
}

/// A session's body on its way to the client, counted into its attempt's
/// record (`$upstream_bytes_received`, `_response_length`, the response
/// time set when it ends).
struct Counted {
    inner: Box<dyn crate::http::response::BodyStream>,
    slot: super::state::Slot,
}

impl crate::http::response::BodyStream for Counted {
    fn next(&mut self) -> std::pin::Pin<Box<dyn crate::http::response::StreamFuture<'_> + '_>> {
        Box::pin(async move {
            let r = self.inner.next().await;
            match &r {
                Ok(Some(b)) => {
                    self.slot.received(b.len());
                    self.slot.body(b.len());
                }
                Ok(None) | Err(_) => self.slot.finish(),
            }
            r
        })
    }

    fn ready(&self) -> bool {
        self.inner.ready()
    }

    fn has_trailers(&self) -> bool {
        self.inner.has_trailers()
    }

    fn trailers(&mut self) -> Vec<(String, Vec<u8>)> {
        self.inner.trailers()
    }
}

#[cfg(test)]
mod accel_tests {
    use super::unsafe_uri;

    #[test]
    fn unsafe_uris_as_nginx() {
        assert_eq!(
            unsafe_uri(b"/foo?bar"),
            Some((b"/foo".to_vec(), Some(b"bar".to_vec())))
        );
        assert_eq!(
            unsafe_uri(b"/foo%20bar"),
            Some((b"/foo bar".to_vec(), None))
        );
        for bad in [
            &b".."[..],
            b"../foo",
            b"/foo/..",
            b"/foo/.%2e",
            b"/a/../b",
            b"/a%00",
        ] {
            assert_eq!(unsafe_uri(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(unsafe_uri(b"/a..b/.c").is_some());
    }
}
