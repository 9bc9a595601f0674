//! The cache side of an upstream request (nginx's ngx_http_upstream_cache
//! and ngx_http_file_cache glue); the cache itself is [`crate::cache`].
//!
//! ```text
//!  a cached error (an intercepted or failed answer, kept in the zone) ▶ HIT (that status)
//!  valid entry ───────────────────────────────────────────────▶ HIT
//!  expired entry: take the key's `updating` mark (cache::UpdateGuard)
//!    "stale updating" = use_stale updating, or the entry's
//!    Cache-Control stale-while-revalidate window is still open
//!    ├─ someone else holds it, stale updating ────────────────▶ UPDATING (stale served)
//!    ├─ taken, stale updating + background_update ────────────▶ STALE (stale served;
//!    │              a task refetches and stores, then drops the mark; the
//!    │              client connection waits for it before going on)
//!    └─ else EXPIRED: fetch (If-Modified-Since/If-None-Match with revalidate)
//!         ├─ 304 to a revalidation: validity rewritten in place ▶ REVALIDATED
//!         ├─ error/timeout/invalid_header listed in use_stale, or
//!         │  within the entry's stale-if-error window ────────▶ STALE
//!         ├─ an http_5xx/403/404/429 status listed in use_stale ▶ STALE
//!         └─ else the new response (stored; the mark is dropped once it is)
//!  no entry: MISS; with min_uses > 1 stored only from the Nth request;
//!    with PREFIX_cache_lock one request holds the mark (for at most
//!    lock_age), the others wait for it (up to lock_timeout, then go
//!    upstream uncached) and look again: HIT, or their turn to fill it
//! ```
//!
//! Vary (nginx's secondary keys): the first response stored for a key
//! lives under the key's md5 with its Vary names and the hash of the
//! request headers they name (its variant). A request whose own hash of
//! those headers differs looks under the md5 that hash is; a response it
//! fetches is stored there when it varies the same way, else under the
//! key's md5, replacing the main entry ([`store_target`]).
//!
//! [`lookup`] is the lookup [`super::run`] makes; the entry being written
//! is a [`super::pipe::CacheOut`] the body's producer fills.

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use super::conf::*;
use super::fetch::{bind_addr, fetch, Outgoing, UpLog, UpResp};
use super::peers::{self, Upstream};
use super::pipe::{create_file, CacheOut, Pipe, Producer};
use super::response::{
    apply_headers, buffering, force_ranges, header, loc_prefix, relayed, reusable,
};
use super::{Caching, Protocol, Request};
use crate::cache::{self, file::EntryHead, Zone};
use crate::core::log::Level;
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::{Body, Response};
use crate::http::vars::Template;
use crate::io::{OpenFile, Policy};

/// The cache side of one request.
pub(super) struct CacheReq {
    pub(super) zone: Arc<Zone>,
    pub(super) key: Vec<u8>,
    /// Where the entry was looked up: the key's hash, or a variant's.
    pub(super) md5: [u8; 16],
    /// The key's own hash.
    pub(super) main: [u8; 16],
    /// Looked up under a variant's hash (the main entry varied otherwise).
    pub(super) secondary: bool,
    /// `PREFIX_no_cache` matched: fetch, but do not store.
    pub(super) no_store: bool,
}

/// Opens the cache temp file next to the entry's final path.
pub(super) async fn start_cache_file(
    c: &CacheReq,
    md5: &[u8; 16],
    policy: &Policy,
) -> io::Result<(Arc<File>, PathBuf)> {
    c.zone.ensure_ready().await?;
    let path = c.zone.temp_path(md5);
    let f = create_file(path.clone(), policy).await?;
    Ok((f, path))
}

/// A response from the cache (HIT, STALE, UPDATING, REVALIDATED).
pub(super) fn cache_answer(
    cx: &mut Ctx<'_>,
    proto: &dyn Protocol,
    mut r: Response,
    status: &[u8],
) -> Response {
    let conf = proto.conf();
    // The entry keeps upstream's Date and Server where the protocol relays them.
    super::response::entry_fields(&mut r, proto);
    cx.set_note("upstream_cache_status", status.to_vec());
    if cx.method != Method::Head && matches!(&r.body, Body::Bytes(b) if b.is_empty()) {
        // Only a HEAD may be told the length of a body the entry lacks.
        r.content_length = Some(0);
    }
    if conf.force_ranges.unwrap_or(false) {
        force_ranges(&mut r);
        r.single_range = false;
    }
    r
}

/// A 304 answered a revalidation (`PREFIX_cache_revalidate`): the entry
/// gets a new validity (as nginx: what the 304's headers say, else what
/// the entry's own headers and `PREFIX_cache_valid` say for its status)
/// written into its file in place, and the zone learns it.
pub(super) async fn refresh_entry(
    conf: &UpstreamConf,
    c: &CacheReq,
    eh: &EntryHead,
    size: u64,
    hs: &[(String, Vec<u8>)],
    policy: &Policy,
) -> io::Result<()> {
    let now = cache::now_secs();
    // The 304's own caching headers, else the entry's (with
    // PREFIX_cache_valid for its status).
    let fresh = match header_fresh(conf, hs, now) {
        Some(HeaderFresh {
            valid: Some(t),
            updating,
            error,
        }) => Some(Fresh {
            valid_until: t,
            updating,
            error,
        }),
        _ => freshness(conf, eh.status, &eh.headers),
    };
    let Some(fresh) = fresh else {
        return Ok(());
    };
    let path = c.zone.file_path(&c.md5);
    let legacy = eh.legacy;
    cache::blocking(policy, move || {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path)?;
        f.write_all_at(&EntryHead::times(fresh.valid_until, now), 16)?;
        if !legacy {
            let exts = EntryHead::exts(fresh.updating, fresh.error);
            f.write_all_at(&exts, cache::file::EXT_AT)?;
        }
        Ok(())
    })
    .await?;
    c.zone.insert(c.md5, fresh.valid_until, disk_bytes(size));
    Ok(())
}

/// The end of a background update, which the client connection that
/// started it waits for before it takes its next request or closes: in
/// nginx the request is not finalized before its background subrequest
/// is, and nginx-tests count on it (a request after the first one's
/// close finds the entry updated). Held in the request's `guards`.
pub struct Postponed(tokio::sync::oneshot::Receiver<()>);

/// Waits for the background updates a request started (see [`Postponed`]).
pub async fn wait_postponed(guards: &mut [Box<dyn std::any::Any>]) {
    for g in guards.iter_mut() {
        if let Some(p) = g.downcast_mut::<Postponed>() {
            let _ = (&mut p.0).await;
        }
    }
}

/// `PREFIX_cache_background_update`: the stale entry is being served; a
/// task of its own fetches the response again and stores it, as nginx's
/// background subrequest does. It holds the key's `updating` mark until
/// the new entry is in place; the request waits for it once answered
/// ([`Postponed`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn background_update(
    cx: &mut Ctx<'_>,
    proto: &Arc<dyn Protocol>,
    up: &Arc<Upstream>,
    lim: &Limits,
    policy: &Policy,
    c: CacheReq,
    g: cache::UpdateGuard,
    stale: Option<&EntryHead>,
) {
    let conf = proto.conf();
    let convert_head = conf.cache_convert_head.unwrap_or(proto.convert_head());
    let validators = stale
        .filter(|_| conf.cache_revalidate.unwrap_or(false))
        .map(validators)
        .filter(|v| v.0.is_some() || v.1.is_some());
    let Ok(req) = proto.create_request(
        cx,
        Some(Caching {
            convert_head,
            revalidate: validators.as_ref(),
        }),
    ) else {
        return;
    };
    let (done, postponed) = tokio::sync::oneshot::channel();
    let job = Background {
        req_headers: cx
            .req
            .headers()
            .map(|h| (h.name.to_vec(), h.value.to_vec()))
            .collect(),
        _done: done,
        proto: proto.clone(),
        up: up.clone(),
        lim: lim.clone(),
        policy: policy.clone(),
        head_only: cx.method == Method::Head && !convert_head,
        non_idempotent: matches!(cx.req.method_raw(), "POST" | "LOCK" | "PATCH"),
        bind: bind_addr(cx, conf),
        keepalive: conf.socket_keepalive.unwrap_or(false),
        at: up.attempt_for(cx, cx.remote.map(|a| a.ip())),
        prefix: loc_prefix(cx).to_vec(),
        log: UpLog::of(cx, ""),
        stale: validators.and(stale.cloned()),
        c,
        g,
        req,
    };
    tokio::spawn(job.run());
    cx.guards.push(Box::new(Postponed(postponed)));
}

/// A background cache update, with all it needs from the request.
struct Background {
    proto: Arc<dyn Protocol>,
    up: Arc<Upstream>,
    lim: Limits,
    policy: Policy,
    c: CacheReq,
    g: cache::UpdateGuard,
    req: Request,
    head_only: bool,
    non_idempotent: bool,
    bind: Option<std::net::SocketAddr>,
    keepalive: bool,
    at: peers::Attempt,
    prefix: Vec<u8>,
    log: UpLog,
    /// The entry being refreshed, when it is revalidated.
    stale: Option<EntryHead>,
    /// The request's headers (the new entry's variant is computed on them).
    req_headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// Dropped when the update is over, which ends [`Postponed`].
    _done: tokio::sync::oneshot::Sender<()>,
}

impl Background {
    async fn run(self) {
        let Background {
            proto,
            up,
            lim,
            policy,
            c,
            g,
            req,
            head_only,
            non_idempotent,
            bind,
            keepalive,
            at,
            prefix,
            mut log,
            stale,
            req_headers,
            _done,
        } = self;
        let conf = proto.conf();
        let send = Outgoing {
            head: &req.head,
            body: &req.body,
            policy: &policy,
            non_idempotent,
            bind,
            keepalive,
        };
        let Ok(mut resp) = fetch(
            &mut log,
            at,
            &up,
            &lim,
            &*proto,
            &send,
            head_only,
            None::<&mut super::fetch::NoFeed>,
        )
        .await
        else {
            return;
        };
        let url = proto.url(&resp.peer_name);
        log.upstream = format!(", upstream: \"{}\"", url);
        if let (304, Some(eh)) = (resp.status, &stale) {
            let size = (eh.header_len() as u64).saturating_add(eh.body_len);
            if let Err(e) = refresh_entry(conf, &c, eh, size, &resp.headers, &policy).await {
                log.log(
                    Level::Crit,
                    &format!(
                        "cache file could not be updated {}",
                        crate::core::errno_text(&e)
                    ),
                    false,
                );
            }
            return;
        }
        if c.no_store || !buffering(conf, &resp.headers) {
            return;
        }
        let Some(fresh) = freshness(conf, resp.status, &resp.headers) else {
            return;
        };
        let relayed = relayed(&*proto, &prefix, &resp.headers);
        let mut first = std::mem::take(&mut resp.body);
        if resp
            .decoder
            .feed(&std::mem::take(&mut resp.early), &mut first)
            .is_err()
        {
            return;
        }
        let Some(stream) = resp.stream.take() else {
            return;
        };
        let hs: ReqHeaders<'_> = req_headers
            .iter()
            .map(|(n, v)| (n.as_slice(), v.as_slice()))
            .collect();
        let target = store_target(&c, conf, &resp.headers, &hs);
        let eh = entry_head(&c, &resp, &relayed, fresh, &target, 0);
        let base = eh.header_len() as u64;
        let (file, path) = match start_cache_file(&c, &target.md5, &policy).await {
            Ok(fp) => fp,
            Err(e) => {
                log.log(
                    Level::Crit,
                    &format!(
                        "cannot create cache temp file in \"{}\" {}",
                        c.zone.conf.path.display(),
                        crate::core::errno_text(&e)
                    ),
                    false,
                );
                return;
            }
        };
        // Nobody reads this pipe: the body only goes into the entry.
        let pipe = Arc::new(Pipe::default());
        {
            let mut p = pipe.lock();
            p.gone = true;
            p.file = Some(file.clone());
        }
        let keep = reusable(&resp).then(|| (up.clone(), resp.peer.clone(), resp.requests));
        let producer = Producer {
            pipe,
            stream,
            _lease: resp.lease.take(),
            decoder: resp.decoder,
            read_timeout: lim.read,
            mem_max: lim.mem_max,
            temp_max: 0,
            buffered: true,
            temp_dir: PathBuf::new(),
            policy: policy.clone(),
            temp: None,
            temp_len: 0,
            cache: Some(CacheOut {
                zone: c.zone.clone(),
                md5: target.md5,
                file,
                path,
                eh,
                base,
                written: 0,
                declared: resp.declared_len,
                held: None,
                _guard: Some(g),
            }),
            keep,
            log,
            limit_rate: super::conf::limit_rate(conf, None),
            store: None,
            slot: super::state::Slot::none(),
        };
        producer.run(first).await;
    }
}

pub(super) fn any_true(cx: &Ctx<'_>, list: Option<&Vec<Template>>) -> bool {
    list.is_some_and(|l| {
        l.iter().any(|t| {
            let v = t.render_vec(cx);
            !v.is_empty() && v != b"0"
        })
    })
}

/// What a lookup found.
pub(super) enum Lookup {
    Hit(Box<Response>),
    /// Expired; the entry itself when its file is intact (what
    /// `PREFIX_cache_use_stale` serves and `PREFIX_cache_revalidate` asks
    /// about).
    Expired(Option<Stale>),
    Miss,
    /// The entry under the key's hash varies, and not as this request:
    /// look under this variant's hash.
    Vary([u8; 16]),
}

/// An expired entry, open.
pub(super) struct Stale {
    pub(super) eh: EntryHead,
    pub(super) file: Arc<OpenFile>,
}

/// Looks `md5` up in the zone and, when valid, opens its file. `main`
/// is the key's hash; `secondary`: `md5` is a variant's (an entry there
/// must vary as this request does).
pub(super) async fn lookup(
    cx: &mut Ctx<'_>,
    z: &Arc<Zone>,
    (md5, main, secondary): (&[u8; 16], &[u8; 16], bool),
    key: &[u8],
    policy: &Policy,
) -> Lookup {
    let now = cache::now_secs();
    let node = z.touch(md5);
    // The loader has seen the whole tree: no node, no file.
    if node.is_none() && z.loaded.load(std::sync::atomic::Ordering::Acquire) {
        return Lookup::Miss;
    }
    let path = z.file_path(md5);
    let f = match crate::io::open(&path, policy).await {
        Ok(f) => f,
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                cx.log(
                    Level::Crit,
                    &format!(
                        "open() \"{}\" failed {}",
                        path.display(),
                        crate::core::errno_text(&e)
                    ),
                );
            }
            if node.is_some() {
                z.remove(md5);
            }
            return Lookup::Miss;
        }
    };
    let eh = match read_entry_head(&f, policy).await {
        Ok(h)
            if h.key == key
                && (h.header_len() as u64).checked_add(h.body_len) == Some(f.meta.size) =>
        {
            h
        }
        Err(cache::file::ParseError::Version) => {
            cx.log(
                Level::Info,
                &format!("cache file \"{}\" version mismatch", path.display()),
            );
            z.remove(md5);
            return Lookup::Miss;
        }
        Ok(h) if h.key != key => {
            cx.log(
                Level::Crit,
                &format!("cache file \"{}\" has md5 collision", path.display()),
            );
            z.remove(md5);
            return Lookup::Miss;
        }
        _ => {
            // Never serve a file that is not a complete entry.
            cx.log(
                Level::Crit,
                &format!("cache file \"{}\" is invalid", path.display()),
            );
            z.remove(md5);
            return Lookup::Miss;
        }
    };
    if node.is_none() {
        z.insert(*md5, eh.valid_until, disk_bytes(f.meta.size));
    }
    if !eh.vary.is_empty() {
        let v = variant(main, &eh.vary, &req_headers(cx));
        if v != eh.variant {
            if secondary {
                cx.log(
                    Level::Crit,
                    &format!("cache file \"{}\" has incorrect vary hash", path.display()),
                );
                return Lookup::Miss;
            }
            return Lookup::Vary(v);
        }
    }
    if secondary {
        // A variant found (maybe adopted from disk before the loader got
        // to it): a purge of the key must find it.
        z.add_variant(*main, *md5);
    }
    // Expired once its second is over, as nginx (`valid_sec < now`).
    if eh.valid_until < now {
        return Lookup::Expired(Some(Stale { eh, file: f }));
    }
    Lookup::Hit(Box::new(entry_response(eh, f, policy)))
}

/// The response a cache entry holds (its body read from the file).
pub(super) fn entry_response(eh: EntryHead, f: Arc<OpenFile>, policy: &Policy) -> Response {
    let off = eh.header_len() as u64;
    let len = eh.body_len;
    let mut r = Response::status(eh.status);
    if !eh.status_line.is_empty() {
        // The line as upstream sent it, as nginx serves a hit.
        r.status_line = Some((eh.status, eh.status_line));
    }
    r.last_modified = eh.last_modified;
    let announced = header(&eh.headers, "content-length")
        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
    apply_headers(&mut r, eh.headers);
    r.content_length = Some(len).filter(|n| *n > 0).or(announced).or(Some(0));
    r.body = if len == 0 {
        Body::Bytes(Vec::new())
    } else {
        r.io = Some(policy.clone());
        Body::File {
            file: f,
            offset: off,
            len,
        }
    };
    r
}

/// Bytes a file of `size` occupies (4k blocks), for max_size accounting.
pub(super) fn disk_bytes(size: u64) -> u64 {
    size.div_ceil(4096) * 4096
}

async fn read_entry_head(
    f: &Arc<OpenFile>,
    policy: &Policy,
) -> Result<EntryHead, cache::file::ParseError> {
    use cache::file::ParseError;
    let mut want = 4096usize;
    for _ in 0..2 {
        let b = crate::io::read(f, 0, want, policy)
            .await
            .map_err(|_| ParseError::Bad)?;
        match EntryHead::parse(&b) {
            Ok(h) => return Ok(h),
            Err(ParseError::Need(n)) if n > want && (n as u64) <= f.meta.size => want = n,
            Err(ParseError::Need(_)) => return Err(ParseError::Bad),
            Err(e) => return Err(e),
        }
    }
    Err(ParseError::Bad)
}

/// The validators of a cached entry for a revalidation request:
/// `If-Modified-Since` (its Last-Modified) and `If-None-Match` (its ETag).
pub type Validators = (Option<Vec<u8>>, Option<Vec<u8>>);

pub(super) fn validators(eh: &EntryHead) -> Validators {
    // As nginx, only a 200 or 206 entry is revalidated.
    if !matches!(eh.status, 200 | 206) {
        return (None, None);
    }
    let lm = header(&eh.headers, "last-modified")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|s| httpdate::parse_http_date(s.trim()).ok())
        .map(|t| httpdate::fmt_http_date(t).into_bytes());
    let etag = header(&eh.headers, "etag").map(|v| v.to_vec());
    (lm, etag)
}

/// The head of a cache entry for a response (its body length is written
/// once the body is complete).
pub(super) fn entry_head(
    c: &CacheReq,
    r: &UpResp,
    relayed: &[(String, Vec<u8>)],
    fresh: Fresh,
    target: &Target,
    body_len: u64,
) -> EntryHead {
    EntryHead {
        status: r.status,
        valid_until: fresh.valid_until,
        updating_secs: fresh.updating,
        error_secs: fresh.error,
        vary: target.vary.clone(),
        variant: target.variant,
        legacy: false,
        date: cache::now_secs(),
        last_modified: None,
        body_len,
        key: c.key.clone(),
        status_line: r.status_line.clone(),
        headers: super::response::stored_headers(relayed, &r.headers),
    }
}

/// How long a response may be served from the cache: until
/// `valid_until`, then `updating` more seconds while it is being
/// refreshed (`stale-while-revalidate`) and `error` more when the refresh
/// fails (`stale-if-error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fresh {
    pub(super) valid_until: i64,
    pub(super) updating: u32,
    pub(super) error: u32,
}

/// Whether a response with these headers may be cached, and how long
/// (None: not cacheable). As nginx: Set-Cookie and `Vary: *` forbid it,
/// then the headers' own time (see [`header_fresh`]), else
/// `PREFIX_cache_valid`'s for the status.
pub(super) fn freshness(
    conf: &UpstreamConf,
    status: u16,
    hs: &[(String, Vec<u8>)],
) -> Option<Fresh> {
    let ign = conf.ignore_headers.unwrap_or(0);
    let now = cache::now_secs();
    if ign & IGN_SET_COOKIE == 0 && header(hs, "set-cookie").is_some() {
        return None;
    }
    if ign & IGN_VARY == 0 {
        // nginx keeps at most 128 bytes of Vary; "*" varies on anything.
        let v = response_vary(conf, hs);
        if v.len() > VARY_MAX || v.trim_ascii() == b"*" {
            return None;
        }
    }
    let h = header_fresh(conf, hs, now)?;
    let valid_until = match h.valid {
        Some(t) => t,
        None => valid_for(conf, status, now)?,
    };
    Some(Fresh {
        valid_until,
        updating: h.updating,
        error: h.error,
    })
}

/// The longest Vary nginx keeps with an entry (NGX_HTTP_CACHE_VARY_LEN).
const VARY_MAX: usize = 128;

/// `PREFIX_cache_valid`'s time for `status`, from `now`.
pub(super) fn valid_for(conf: &UpstreamConf, status: u16, now: i64) -> Option<i64> {
    let list = conf.cache_valid.as_deref()?;
    let secs = list
        .iter()
        .find(|(c, _)| *c == Some(status))
        .or_else(|| list.iter().find(|(c, _)| c.is_none()))?
        .1;
    (secs > 0).then(|| now.saturating_add(i64::try_from(secs).unwrap_or(i64::MAX)))
}

/// What the caching headers of a response say.
#[derive(Debug, Default)]
struct HeaderFresh {
    /// The validity they give (None: they do not say).
    valid: Option<i64>,
    updating: u32,
    error: u32,
}

/// The number after `name` (`max-age=`) in a lowercased Cache-Control
/// value; None when absent or not a number.
fn cc_number(l: &[u8], name: &str) -> Option<u64> {
    let i = l.windows(name.len()).position(|w| w == name.as_bytes())?;
    let digits: Vec<u8> = l[i + name.len()..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// X-Accel-Expires, Cache-Control and Expires, by precedence rather than
/// by the order they came in (nginx 1.23's rules, which nginx-tests
/// check): a valid X-Accel-Expires decides alone (0: not cacheable);
/// otherwise Cache-Control's `no-cache`, `no-store` or `private` forbid
/// caching and its `s-maxage`/`max-age` give the time (0: not
/// cacheable); otherwise Expires does (a past date: not cacheable). The
/// `stale-while-revalidate` and `stale-if-error` extensions are taken
/// whatever gave the time. None: not cacheable. The first X-Accel-Expires
/// counts; every Cache-Control line does.
fn header_fresh(conf: &UpstreamConf, hs: &[(String, Vec<u8>)], now: i64) -> Option<HeaderFresh> {
    let ign = conf.ignore_headers.unwrap_or(0);
    let mut out = HeaderFresh::default();
    let mut accel: Option<i64> = None;
    if ign & IGN_X_ACCEL_EXPIRES == 0 {
        if let Some(v) = header(hs, "x-accel-expires") {
            let s = std::str::from_utf8(v).unwrap_or("").trim();
            match s.strip_prefix('@') {
                Some(abs) => accel = abs.parse::<i64>().ok(),
                None => match s.parse::<i64>() {
                    Ok(0) => return None,
                    Ok(n) if n > 0 => accel = Some(now.saturating_add(n)),
                    // Not a number: as if absent (nginx's NGX_ERROR).
                    _ => {}
                },
            }
        }
    }
    let cc: Vec<Vec<u8>> = if ign & IGN_CACHE_CONTROL == 0 {
        hs.iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("cache-control"))
            .map(|(_, v)| v.to_ascii_lowercase())
            .collect()
    } else {
        Vec::new()
    };
    let secs = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    for l in &cc {
        if let Some(n) = cc_number(l, "stale-while-revalidate=") {
            out.updating = secs(n);
        }
        if let Some(n) = cc_number(l, "stale-if-error=") {
            out.error = secs(n);
        }
    }
    if accel.is_some() {
        out.valid = accel;
        return Some(out);
    }
    for l in &cc {
        for bad in ["no-cache", "no-store", "private"] {
            if l.windows(bad.len()).any(|w| w == bad.as_bytes()) {
                return None;
            }
        }
    }
    let age = cc
        .iter()
        .find_map(|l| cc_number(l, "s-maxage="))
        .or_else(|| cc.iter().find_map(|l| cc_number(l, "max-age=")));
    if let Some(n) = age {
        if n == 0 {
            return None;
        }
        out.valid = Some(now.saturating_add(i64::try_from(n).unwrap_or(i64::MAX)));
        return Some(out);
    }
    if ign & IGN_EXPIRES == 0 {
        if let Some(v) = header(hs, "expires") {
            let t = std::str::from_utf8(v)
                .ok()
                .and_then(|s| httpdate::parse_http_date(s.trim()).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs() as i64);
            match t {
                Some(t) if t > now => out.valid = Some(t),
                _ => return None,
            }
        }
    }
    Some(out)
}

/// The response's Vary names: every Vary line, comma-joined (nginx from
/// 1.23 on; ticket #1423), empty when there is none or it is ignored.
pub(super) fn response_vary(conf: &UpstreamConf, hs: &[(String, Vec<u8>)]) -> Vec<u8> {
    if conf.ignore_headers.unwrap_or(0) & IGN_VARY != 0 {
        return Vec::new();
    }
    let mut v = Vec::new();
    for (_, val) in hs.iter().filter(|(n, _)| n.eq_ignore_ascii_case("vary")) {
        if !v.is_empty() {
            v.extend_from_slice(b", ");
        }
        v.extend_from_slice(val);
    }
    v
}

/// A request's headers, as [`variant`] reads them.
pub(super) type ReqHeaders<'a> = Vec<(&'a [u8], &'a [u8])>;

/// The variant hash of a request for an entry that varies on `vary` (a
/// Vary value): over the key's hash and, for each name Vary lists, the
/// values of the request's headers of that name. As nginx, only
/// whitespace is normalised: elements are trimmed and empty ones dropped
/// (`foo, bar` and `foo,,bar ,` match; `bar,foo` and `foobar` do not).
pub(super) fn variant(main: &[u8; 16], vary: &[u8], req: &[(&[u8], &[u8])]) -> [u8; 16] {
    let mut buf = main.to_vec();
    let names = vary
        .split(|&c| c == b',' || c == b' ' || c == b'\t')
        .filter(|n| !n.is_empty());
    for name in names {
        buf.extend(name.iter().map(u8::to_ascii_lowercase));
        buf.push(b':');
        for (_, v) in req.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)) {
            for el in v.split(|&c| c == b',') {
                let el = el.trim_ascii();
                if !el.is_empty() {
                    buf.extend_from_slice(el);
                    buf.push(b',');
                }
            }
        }
        buf.extend_from_slice(b"\r\n");
    }
    cache::md5::digest(&buf)
}

/// The request's headers for [`variant`].
pub(super) fn req_headers<'a>(cx: &'a Ctx<'_>) -> ReqHeaders<'a> {
    cx.req.headers().map(|h| (h.name, h.value)).collect()
}

/// Where a response is stored, and the Vary it is stored with.
pub(super) struct Target {
    pub(super) md5: [u8; 16],
    pub(super) vary: Vec<u8>,
    pub(super) variant: [u8; 16],
}

/// nginx's ngx_http_file_cache_update_variant: a response looked up
/// under the key's own hash is stored there; one looked up under a
/// variant's hash (the main entry varied differently) stays there only
/// when it varies the same way, else it replaces the main entry.
pub(super) fn store_target(
    c: &CacheReq,
    conf: &UpstreamConf,
    resp_headers: &[(String, Vec<u8>)],
    req: &[(&[u8], &[u8])],
) -> Target {
    let vary = response_vary(conf, resp_headers);
    let variant = if vary.is_empty() {
        [0u8; 16]
    } else {
        self::variant(&c.main, &vary, req)
    };
    // Varies as the variant it was looked up under: stays there.
    let same_variant = !vary.is_empty() && variant == c.md5;
    let md5 = if c.secondary && !same_variant {
        c.main
    } else {
        c.md5
    };
    Target { md5, vary, variant }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_order() {
        let conf = UpstreamConf {
            cache_valid: Some(Arc::new(vec![(Some(200), 600)])),
            ..Default::default()
        };
        let h = |v: &[(&str, &str)]| -> Vec<(String, Vec<u8>)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.as_bytes().to_vec()))
                .collect()
        };
        let now = cache::now_secs();
        let cache_validity = |c: &UpstreamConf, s: u16, h: &[(String, Vec<u8>)]| {
            freshness(c, s, h).map(|f| f.valid_until)
        };
        let v = cache_validity(&conf, 200, &[]).unwrap();
        assert!((now + 599..=now + 601).contains(&v));
        assert_eq!(cache_validity(&conf, 404, &[]), None);
        assert_eq!(
            cache_validity(&conf, 200, &h(&[("Set-Cookie", "a=b")])),
            None
        );
        assert_eq!(
            cache_validity(&conf, 200, &h(&[("Cache-Control", "private, max-age=5")])),
            None
        );
        let v = cache_validity(&conf, 404, &h(&[("Cache-Control", "max-age=5")])).unwrap();
        assert!((now + 4..=now + 6).contains(&v));
        assert_eq!(
            cache_validity(
                &conf,
                200,
                &h(&[("X-Accel-Expires", "0"), ("Cache-Control", "max-age=5")])
            ),
            None
        );
        assert_eq!(
            cache_validity(
                &conf,
                200,
                &h(&[("Expires", "Thu, 01 Jan 1970 00:00:00 GMT")])
            ),
            None
        );
    }

    /// nginx 1.23's precedence, whatever the order of the lines, and the
    /// extensions kept under X-Accel-Expires.
    #[test]
    fn header_precedence_and_extensions() {
        let conf = UpstreamConf::default();
        let h = |v: &[(&str, &str)]| -> Vec<(String, Vec<u8>)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.as_bytes().to_vec()))
                .collect()
        };
        let now = cache::now_secs();
        let past = ("Expires", "Thu, 01 Jan 1970 00:00:01 GMT");
        let cached = |hs: &[(&str, &str)]| freshness(&conf, 200, &h(hs)).is_some();
        assert!(cached(&[("Cache-Control", "max-age=60"), past]));
        assert!(cached(&[past, ("Cache-Control", "max-age=60")]));
        assert!(!cached(&[
            ("Cache-Control", "no-cache"),
            ("Cache-Control", "max-age=60")
        ]));
        assert!(cached(&[
            ("X-Accel-Expires", "60"),
            past,
            ("Cache-Control", "no-cache")
        ]));
        assert!(cached(&[
            past,
            ("Cache-Control", "no-cache"),
            ("X-Accel-Expires", "60")
        ]));
        assert!(!cached(&[
            ("Cache-Control", "max-age=60"),
            ("X-Accel-Expires", "0")
        ]));
        // Only the first X-Accel-Expires counts.
        assert!(cached(&[
            ("X-Accel-Expires", "60"),
            ("X-Accel-Expires", "0")
        ]));
        assert!(!cached(&[("Vary", "*"), ("Cache-Control", "max-age=60")]));
        let f = freshness(
            &conf,
            200,
            &h(&[
                ("X-Accel-Expires", "@1"),
                (
                    "Cache-Control",
                    "stale-while-revalidate=5, stale-if-error=9999999999",
                ),
            ]),
        )
        .unwrap();
        assert_eq!(
            f,
            Fresh {
                valid_until: 1,
                updating: 5,
                error: u32::MAX
            }
        );
        let f = freshness(&conf, 200, &h(&[("Cache-Control", "max-age=10")])).unwrap();
        assert!((now + 9..=now + 11).contains(&f.valid_until));
        assert_eq!((f.updating, f.error), (0, 0));
    }

    #[test]
    fn variants() {
        let main = cache::md5::digest(b"/k");
        let v = |vary: &str, hs: &[(&str, &str)]| {
            let hs: Vec<(&[u8], &[u8])> = hs
                .iter()
                .map(|(a, b)| (a.as_bytes(), b.as_bytes()))
                .collect();
            variant(&main, vary.as_bytes(), &hs)
        };
        let ae = |x: &str| v("Accept-Encoding", &[("accept-encoding", x)]);
        assert_eq!(ae("foo, bar"), ae("foo,bar"));
        assert_eq!(ae("foo, bar"), ae("foo,,  ,bar , "));
        assert_ne!(ae("foo, bar"), ae("foobar"));
        assert_ne!(ae("foo, bar"), ae("bar,foo"));
        assert_eq!(
            ae("gzip"),
            v(",, Accept-encoding , ,", &[("Accept-Encoding", "gzip")])
        );
        assert_ne!(ae("gzip"), ae("deflate"));
        // Two lines of a header are one list.
        assert_eq!(v("X", &[("x", "a"), ("x", "b")]), v("X", &[("x", "a, b")]));
        // Absent and empty are the same; another name is not.
        assert_eq!(v("X", &[]), v("X", &[("x", "")]));
        assert_ne!(v("X", &[]), v("Y", &[]));
    }
}
