//! The order of one upstream request (nginx's ngx_http_upstream_init,
//! _cache, _connect ... _send_response): cache lookup, fetch, stale and
//! revalidated answers, then the response ([`super::response::respond`]).

use std::sync::Arc;
use std::time::Duration;

use super::cache::{
    self, any_true, cache_answer, entry_response, lookup, refresh_entry, validators, CacheReq,
    Lookup, Stale,
};
use super::conf::UpstreamConf;
use super::conf::{ft, CacheSel, Limits, M_GET, M_HEAD, M_POST};
use super::fetch::{bind_addr, fetch, Outgoing};
use super::peers::{self, PassAddr, Upstream};
use super::{Caching, Protocol};
use crate::cache::{self as store, md5};
use crate::core::log::Level;
use crate::http::body::{self, TempDir};
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::Response;

/// The content handler of a `*_pass` to an address (fastcgi, scgi,
/// uwsgi): the request body read (or streamed, see [`begin_body`];
/// `chunked_ok`: the protocol can frame a body of unknown length), the
/// upstream found, then [`run`] with the protocol `proto` makes of the
/// pass.
pub async fn pass_addr(
    cx: &mut Ctx<'_>,
    pass: Option<Arc<PassAddr>>,
    conf: &UpstreamConf,
    chunked_ok: bool,
    proto: impl FnOnce(Arc<PassAddr>) -> Arc<dyn Protocol>,
) -> Response {
    let Some(pass) = pass else {
        return Response::status(500);
    };
    let stream = match begin_body(cx, conf, &pass.body_temp_default, |_| chunked_ok).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let Some(up) = peers::upstream_of(cx, &pass.to).await else {
        if let Some(s) = stream {
            s.finish(cx);
        }
        return Response::status(502);
    };
    run_with(cx, proto(pass), up, Limits::of(conf), stream).await
}

/// The request body before the upstream is asked: read whole (memory or
/// a temp file), or with `PREFIX_request_buffering off` (and a body to
/// pass) left to arrive while it is sent ([`body::stream_begin`]), when
/// `unknown_ok` allows a body of unknown length (chunked) for this
/// protocol, as nginx's handlers decide `request_body_no_buffering`.
pub async fn begin_body<'c>(
    cx: &mut Ctx<'c>,
    conf: &UpstreamConf,
    temp: &TempDir,
    unknown_ok: impl FnOnce(&Ctx<'c>) -> bool,
) -> Result<Option<body::Streaming<'c>>, Box<Response>> {
    let unbuffered = conf.request_buffering == Some(false)
        && conf.pass_request_body.unwrap_or(true)
        && (cx.req.content_length.is_some() || unknown_ok(cx));
    if unbuffered {
        if let Some(s) = body::stream_begin(cx).await? {
            return Ok(Some(s));
        }
    }
    body::read(cx, temp).await?;
    Ok(None)
}

/// Serves the request from `up` with `proto` (the request body has been
/// read), through the cache when the location has one.
pub async fn run(
    cx: &mut Ctx<'_>,
    proto: Arc<dyn Protocol>,
    up: Arc<Upstream>,
    lim: Limits,
) -> Response {
    run_with(cx, proto, up, lim, None).await
}

/// [`run`], with the body streamed from `stream` when there is one (the
/// protocol's request then has `OutBody::Stream`). The body goes back to
/// the request once the upstream has answered or failed.
pub async fn run_with<'c>(
    cx: &mut Ctx<'c>,
    proto: Arc<dyn Protocol>,
    up: Arc<Upstream>,
    lim: Limits,
    mut stream: Option<body::Streaming<'c>>,
) -> Response {
    let r = run_inner(cx, proto, up, lim, &mut stream).await;
    if let Some(s) = stream {
        s.finish(cx);
    }
    r
}

async fn run_inner<'c>(
    cx: &mut Ctx<'c>,
    proto: Arc<dyn Protocol>,
    up: Arc<Upstream>,
    lim: Limits,
    stream: &mut Option<body::Streaming<'c>>,
) -> Response {
    let conf = proto.conf();
    // $upstream_addr and the like: this use of an upstream starts here
    // (after an earlier one, the variables join them with " : ").
    super::state::States::begin_use(cx);
    let policy = match cx.io_policy() {
        Ok(p) => p,
        Err(r) => return *r,
    };
    // Cache lookup.
    let mut creq: Option<CacheReq> = None;
    // The expired entry, kept for PREFIX_cache_use_stale and _revalidate.
    let mut stale: Option<Stale> = None;
    // Within the expired entry's stale-if-error window.
    let mut stale_error = false;
    // This request's `updating` mark on the key (PREFIX_cache_lock, and
    // the UPDATING state of PREFIX_cache_use_stale): released when the
    // entry is stored or the request is done with it.
    let mut guard: Option<store::UpdateGuard> = None;
    let zone = match &conf.cache {
        None | Some(CacheSel::Off) => None,
        Some(CacheSel::Zone(n)) => Some(n.clone().into_bytes()),
        // A value that renders empty: no cache for this request (nginx's
        // ngx_http_upstream_cache_get), not an unknown zone.
        Some(CacheSel::Var(t)) => Some(t.render_vec(&*cx)).filter(|v| !v.is_empty()),
    };
    if let Some(zname) = zone {
        let Some(z) = std::str::from_utf8(&zname)
            .ok()
            .and_then(|n| cx.http.main.modules.upstream.zones.get(n))
            .cloned()
        else {
            cx.log(
                Level::Error,
                &format!("cache \"{}\" not found", String::from_utf8_lossy(&zname)),
            );
            return Response::status(500);
        };
        let m = match cx.method {
            Method::Get => M_GET,
            Method::Head => M_HEAD,
            Method::Post => M_POST,
            _ => 0,
        };
        if conf.cache_methods.unwrap_or(M_GET | M_HEAD) & m != 0 {
            let key = match &conf.cache_key {
                Some(t) => t.render_vec(&*cx),
                None => proto.cache_key(cx),
            };
            let main = md5::digest(&key);
            // Where the entry is looked up: the key's hash, or a
            // variant's when the entry there varies otherwise.
            let mut md5 = main;
            let mut secondary = false;
            let bypass = any_true(cx, conf.cache_bypass.as_deref());
            let mut scarce = false;
            let mut no_store = any_true(cx, conf.no_cache.as_deref());
            let use_stale = conf.cache_use_stale.unwrap_or(0);
            // PREFIX_cache_lock waits at most this long, over all rounds.
            let lock_deadline = std::time::Instant::now()
                + Duration::from_millis(conf.cache_lock_timeout.unwrap_or(5000));
            let status: &[u8] = if bypass {
                b"BYPASS"
            } else {
                // A cached error (nginx's node->error): answered as is,
                // for error_page to catch.
                if let Some(status) = z.cached_error(&main) {
                    cx.set_note("upstream_cache_status", b"HIT".to_vec());
                    return Response::status(status);
                }
                loop {
                    match lookup(cx, &z, (&md5, &main, secondary), &key, &policy).await {
                        Lookup::Hit(r) => return cache_answer(cx, &*proto, *r, b"HIT"),
                        Lookup::Vary(v) => {
                            md5 = v;
                            secondary = true;
                        }
                        Lookup::Expired(st) => {
                            // The first request to find it expired updates
                            // it (nginx's STALE); others meanwhile find it
                            // UPDATING.
                            let g = z.try_update(&md5, None);
                            if let Some(st) = st {
                                // The entry's Cache-Control extensions.
                                let now = store::now_secs();
                                let until =
                                    |secs: u32| st.eh.valid_until.saturating_add(i64::from(secs));
                                let stale_updating = until(st.eh.updating_secs) >= now;
                                stale_error = until(st.eh.error_secs) >= now;
                                if use_stale & ft::UPDATING != 0 || stale_updating {
                                    match g {
                                        None => {
                                            let r = entry_response(st.eh, st.file, &policy);
                                            return cache_answer(cx, &*proto, r, b"UPDATING");
                                        }
                                        Some(g)
                                            if conf.cache_background_update.unwrap_or(false) =>
                                        {
                                            let c = CacheReq {
                                                zone: z.clone(),
                                                key,
                                                md5,
                                                main,
                                                secondary,
                                                no_store,
                                            };
                                            cache::background_update(
                                                cx,
                                                &proto,
                                                &up,
                                                &lim,
                                                &policy,
                                                c,
                                                g,
                                                Some(&st.eh),
                                            );
                                            let r = entry_response(st.eh, st.file, &policy);
                                            return cache_answer(cx, &*proto, r, b"STALE");
                                        }
                                        Some(g) => guard = Some(g),
                                    }
                                } else {
                                    guard = g;
                                }
                                stale = Some(st);
                            } else {
                                guard = g;
                            }
                            break b"EXPIRED";
                        }
                        Lookup::Miss => {
                            let min_uses = conf.cache_min_uses.unwrap_or(1);
                            if min_uses > 1 && z.count_use(&md5) < min_uses {
                                // nginx's SCARCE: not cacheable, so the
                                // request goes as without a cache.
                                scarce = true;
                                break b"MISS";
                            }
                            if !conf.cache_lock.unwrap_or(false) {
                                break b"MISS";
                            }
                            let age = Duration::from_millis(conf.cache_lock_age.unwrap_or(5000));
                            if let Some(g) = z.try_update(&md5, Some(age)) {
                                guard = Some(g);
                                break b"MISS";
                            }
                            // Another request is filling it: wait for it,
                            // then look again (a HIT, or this request's
                            // turn to fill it).
                            if !z.wait_update(&md5, lock_deadline).await {
                                cx.log(Level::Info, "cache lock timeout");
                                no_store = true;
                                break b"MISS";
                            }
                        }
                    }
                }
            };
            cx.set_note("upstream_cache_status", status.to_vec());
            // A request not answered from the cache that is not to be
            // cached either (nginx's `u->cacheable = 0`) goes upstream as
            // without a cache: its Range and conditionals too.
            let uncacheable = scarce
                || (!bypass
                    && crate::http::upstream::conf::range_beyond(conf, cx.req.header("range")));
            if uncacheable {
                guard = None;
            } else {
                creq = Some(CacheReq {
                    zone: z,
                    key,
                    md5,
                    main,
                    secondary,
                    no_store,
                });
            }
        }
    }

    // PREFIX_cache_revalidate: ask whether the expired entry still holds.
    let revalidate = stale
        .as_ref()
        .filter(|_| conf.cache_revalidate.unwrap_or(false))
        .map(|st| validators(&st.eh))
        .filter(|v| v.0.is_some() || v.1.is_some());
    let convert_head = conf.cache_convert_head.unwrap_or(proto.convert_head());
    let caching = creq.as_ref().map(|_| Caching {
        convert_head,
        revalidate: revalidate.as_ref(),
    });
    let req = match proto.create_request(cx, caching) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let head_only = cx.method == Method::Head && (creq.is_none() || !convert_head);
    let send = Outgoing {
        head: &req.head,
        body: &req.body,
        policy: &policy,
        // nginx does not pass these to the next server once sent to one
        // (PREFIX_next_upstream without non_idempotent).
        non_idempotent: matches!(cx.req.method_raw(), "POST" | "LOCK" | "PATCH"),
        bind: bind_addr(cx, conf),
        keepalive: conf.socket_keepalive.unwrap_or(false),
    };
    let at = up.attempt_for(&*cx, cx.remote.map(|a| a.ip()));
    let streamed = matches!(req.body, super::OutBody::Stream);
    let got = fetch(
        cx,
        at,
        &up,
        &lim,
        &*proto,
        &send,
        head_only,
        stream.as_mut().filter(|_| streamed),
    )
    .await;
    // The body is the request's again (`$request_body`, error_page).
    if let Some(s) = stream.take() {
        s.finish(cx);
    }
    let use_stale = conf.cache_use_stale.unwrap_or(0);
    let resp = match got {
        Ok(r) => {
            if cx.http.main.vars.upstream_http {
                cx.upstream_headers = Some(r.headers.clone());
            }
            r
        }
        Err(e) => {
            // PREFIX_cache_use_stale (or the entry's stale-if-error): the
            // expired entry instead of an error.
            if let Some(st) = stale.filter(|_| use_stale & e.ft != 0 || stale_error) {
                let r = entry_response(st.eh, st.file, &policy);
                return cache_answer(cx, &*proto, r, b"STALE");
            }
            // A 502 or 504 that PREFIX_cache_valid lets be cached is, in
            // the zone (nginx's ngx_http_upstream_finalize_request).
            if let Some(c) = creq.as_ref().filter(|_| matches!(e.status, 502 | 504)) {
                if let Some(until) = cache::valid_for(conf, e.status, store::now_secs()) {
                    c.zone.set_error(c.main, e.status, until);
                }
            }
            return Response::status(e.status);
        }
    };
    if let Some(st) = stale.take() {
        let bit = ft::of_status(resp.status).unwrap_or(0);
        if use_stale & bit != 0 {
            let r = entry_response(st.eh, st.file, &policy);
            return cache_answer(cx, &*proto, r, b"STALE");
        }
        if resp.status == 304 && revalidate.is_some() {
            if let Some(c) = &creq {
                let r = refresh_entry(conf, c, &st.eh, st.file.meta.size, &resp.headers, &policy);
                if let Err(e) = r.await {
                    cx.log(
                        Level::Crit,
                        &format!(
                            "cache file \"{}\" could not be updated {}",
                            c.zone.file_path(&c.md5).display(),
                            crate::core::errno_text(&e)
                        ),
                    );
                }
            }
            let r = entry_response(st.eh, st.file, &policy);
            return cache_answer(cx, &*proto, r, b"REVALIDATED");
        }
    }
    super::response::respond(cx, &proto, &up, &lim, resp, creq, guard, head_only, policy).await
}
