//! The cache side of an upstream request (nginx's ngx_http_upstream_cache
//! and ngx_http_file_cache glue); the cache itself is [`crate::cache`].
//!
//! ```text
//!  valid entry ───────────────────────────────────────────────▶ HIT
//!  expired entry: take the key's `updating` mark (cache::UpdateGuard)
//!    ├─ someone else holds it, use_stale updating ────────────▶ UPDATING (stale served)
//!    ├─ taken, use_stale updating + background_update ────────▶ STALE (stale served;
//!    │                                       a task refetches and stores, then drops the mark)
//!    └─ else EXPIRED: fetch (If-Modified-Since/If-None-Match with revalidate)
//!         ├─ 304 to a revalidation: validity rewritten in place ▶ REVALIDATED
//!         ├─ error/timeout/invalid_header/http_5xx... listed in
//!         │  PREFIX_cache_use_stale ──────────────────────────▶ STALE
//!         └─ else the new response (stored; the mark is dropped once it is)
//!  no entry: MISS; with min_uses > 1 stored only from the Nth request;
//!    with PREFIX_cache_lock one request holds the mark (for at most
//!    lock_age), the others wait for it (up to lock_timeout, then go
//!    upstream uncached) and look again: HIT, or their turn to fill it
//! ```
//!
//! [`decide`] runs the lookup for [`super::run`]; the entry being written
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
    apply_headers, buffering, force_ranges, has_token, header, loc_prefix, relayed, reusable,
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
    pub(super) md5: [u8; 16],
    /// `PREFIX_no_cache` matched: fetch, but do not store.
    pub(super) no_store: bool,
}

/// Opens the cache temp file next to the entry's final path.
pub(super) async fn start_cache_file(
    c: &CacheReq,
    policy: &Policy,
) -> io::Result<(Arc<File>, PathBuf)> {
    c.zone.ensure_ready().await?;
    let path = c.zone.temp_path(&c.md5);
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
    let valid = match header_validity(conf, hs, now) {
        Some(Some(t)) => Some(t),
        _ => cache_validity(conf, eh.status, &eh.headers),
    };
    let Some(valid) = valid else {
        return Ok(());
    };
    let path = c.zone.file_path(&c.md5);
    cache::blocking(policy, move || {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path)?;
        f.write_all_at(&cache::file::EntryHead::times(valid, now), 16)
    })
    .await?;
    c.zone.insert(c.md5, valid, disk_bytes(size));
    Ok(())
}

/// `PREFIX_cache_background_update`: the stale entry is being served; a
/// task of its own fetches the response again and stores it, as nginx's
/// background subrequest does. It holds the key's `updating` mark until
/// the new entry is in place.
#[allow(clippy::too_many_arguments)]
pub(super) fn background_update(
    cx: &Ctx<'_>,
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
    let job = Background {
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
        let Some(valid) = cache_validity(conf, resp.status, &resp.headers) else {
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
        let eh = entry_head(&c, &resp, &relayed, valid, 0);
        let base = eh.header_len() as u64;
        let (file, path) = match start_cache_file(&c, &policy).await {
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
                md5: c.md5,
                file,
                path,
                eh,
                base,
                written: 0,
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
}

/// An expired entry, open.
pub(super) struct Stale {
    pub(super) eh: EntryHead,
    pub(super) file: Arc<OpenFile>,
}

/// Looks `md5` up in the zone and, when valid, opens its file.
pub(super) async fn lookup(
    cx: &mut Ctx<'_>,
    z: &Arc<Zone>,
    md5: &[u8; 16],
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
    valid_until: i64,
    body_len: u64,
) -> EntryHead {
    EntryHead {
        status: r.status,
        valid_until,
        date: cache::now_secs(),
        last_modified: None,
        body_len,
        key: c.key.clone(),
        status_line: r.status_line.clone(),
        headers: super::response::stored_headers(relayed, &r.headers),
    }
}

pub(super) fn cache_validity(
    conf: &UpstreamConf,
    status: u16,
    hs: &[(String, Vec<u8>)],
) -> Option<i64> {
    let ign = conf.ignore_headers.unwrap_or(0);
    let now = cache::now_secs();
    if ign & IGN_SET_COOKIE == 0 && header(hs, "set-cookie").is_some() {
        return None;
    }
    // nginx keeps one variant per Vary'd request header set; tern does not
    // store variants yet, so a varying response is not cached at all
    // (serving one client's variant to another would be wrong).
    if ign & IGN_VARY == 0 && header(hs, "vary").is_some() {
        return None;
    }
    if let Some(t) = header_validity(conf, hs, now)? {
        return Some(t);
    }
    valid_for(conf, status, now)
}

/// `PREFIX_cache_valid`'s time for `status`, from `now`.
fn valid_for(conf: &UpstreamConf, status: u16, now: i64) -> Option<i64> {
    let list = conf.cache_valid.as_deref()?;
    let secs = list
        .iter()
        .find(|(c, _)| *c == Some(status))
        .or_else(|| list.iter().find(|(c, _)| c.is_none()))?
        .1;
    (secs > 0).then(|| now.saturating_add(i64::try_from(secs).unwrap_or(i64::MAX)))
}

/// What X-Accel-Expires, Cache-Control and Expires say: Some(None) when
/// none of them decides, None when they forbid caching.
fn header_validity(conf: &UpstreamConf, hs: &[(String, Vec<u8>)], now: i64) -> Option<Option<i64>> {
    let ign = conf.ignore_headers.unwrap_or(0);
    let mut from_headers: Option<i64> = None;
    if ign & IGN_X_ACCEL_EXPIRES == 0 {
        if let Some(v) = header(hs, "x-accel-expires") {
            let s = std::str::from_utf8(v).ok()?.trim();
            let t = match s.strip_prefix('@') {
                Some(abs) => abs.parse::<i64>().ok()?,
                None => {
                    let n = s.parse::<i64>().ok()?;
                    if n == 0 {
                        return None;
                    }
                    now.saturating_add(n)
                }
            };
            from_headers = Some(t);
        }
    }
    if from_headers.is_none() && ign & IGN_CACHE_CONTROL == 0 {
        if let Some(v) = header(hs, "cache-control") {
            let l = v.to_ascii_lowercase();
            for bad in ["no-cache", "no-store", "private"] {
                if has_token(&l, bad) || l.windows(bad.len()).any(|w| w == bad.as_bytes()) {
                    return None;
                }
            }
            let age = |name: &str| -> Option<i64> {
                let i = l.windows(name.len()).position(|w| w == name.as_bytes())?;
                let digits: Vec<u8> = l[i + name.len()..]
                    .iter()
                    .take_while(|c| c.is_ascii_digit())
                    .copied()
                    .collect();
                std::str::from_utf8(&digits).ok()?.parse().ok()
            };
            if let Some(n) = age("s-maxage=").or_else(|| age("max-age=")) {
                if n == 0 {
                    return None;
                }
                from_headers = Some(now.saturating_add(n));
            }
        }
    }
    if from_headers.is_none() && ign & IGN_EXPIRES == 0 {
        if let Some(v) = header(hs, "expires") {
            let t = std::str::from_utf8(v)
                .ok()
                .and_then(|s| httpdate::parse_http_date(s.trim()).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs() as i64);
            match t {
                Some(t) if t > now => from_headers = Some(t),
                _ => return None,
            }
        }
    }
    Some(from_headers)
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
}
