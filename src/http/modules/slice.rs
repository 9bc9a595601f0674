//! `slice SIZE` and `$slice_range`: a large response fetched (and cached)
//! in ranges of SIZE bytes, as nginx's `ngx_http_slice_filter_module`.
//!
//! The location passes `$slice_range` upstream (`proxy_set_header Range
//! $slice_range`) and into the cache key, so each slice is its own request
//! and its own cache entry:
//!
//! ```text
//! client request (Range or not)
//!   $slice_range evaluated by the *_pass handler (main request): the slice
//!     holding the client's first byte, `bytes=S-(S+SIZE-1)` (S = 0 when
//!     there is an If-Range, several ranges or a suffix range); the memo
//!     [`MEMO`] remembers S
//!   upstream answers 206 for that slice
//! header_filter (first of the header filters, main request only):
//!   not 206 ──> the response passes untouched (the module steps aside)
//!   Content-Range checked (`bytes S-E/TOTAL`, TOTAL known, S as asked, E
//!     the slice's end) ──> else nothing is sent, the connection closes
//!   the head becomes the whole entity's: 200, Content-Length TOTAL,
//!     Accept-Ranges: bytes (the range filter then cuts what the client
//!     asked for, [`SliceBody::cut`]), the body a SliceBody
//!   a task for the later slices is started; it waits for the body to ask
//! SliceBody (the body the connection pulls):
//!   the first slice's body, then the later slices the task fetches one
//!   after another (a clone of the request in the same location, content
//!   handler only, `$slice_range` the next slice), each checked as above
//!   and its ETag against the first's; only the slices the client's range
//!   needs are asked for; bytes outside the range are dropped
//!   the first output waits until `postpone_output` bytes (or the end):
//!   a failure before then sends nothing at all, as nginx's postponed
//!   output does; after it, a failure ends the response unfinished
//! ```
//!
//! Memory: the task hands bodies over through a channel of two pieces, so
//! a slow client holds back the upstream of the current slice (whose own
//! buffering is the engine's), never more.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::config::registry::{ctx, set_once, size_arg, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::response::{self, Body, BodyStream, Response, StreamFuture};

pub const DIRECTIVES: &[Spec] = &[Spec {
    name: "slice",
    ctx: ctx::HSL,
    args: Args::take(1),
    set: Setter::Loc(set_slice),
}];

#[derive(Debug, Clone, Default)]
pub struct SliceLoc {
    /// `slice SIZE`; unset or 0: off.
    pub size: Option<u64>,
}

impl SliceLoc {
    pub fn merge(&mut self, p: &SliceLoc) {
        if self.size.is_none() {
            self.size = p.size;
        }
    }
}

fn set_slice(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = size_arg(d, 0)?;
    set_once(&mut l.modules.slice.size, n, d)
}

pub const VARS: &[&str] = &["slice_range"];

/// The memo key of a request's slice state.
const MEMO: &str = "slice";

/// A request's slice: where it starts and the `$slice_range` it passes.
#[derive(Debug, Clone)]
struct SliceVar {
    start: u64,
    range: Vec<u8>,
}

fn range_of(start: u64, size: u64) -> Vec<u8> {
    format!("bytes={}-{}", start, start + size - 1).into_bytes()
}

/// `$slice_range`: for the client's request (before its response), the
/// slice holding the first byte asked for, remembered for the header
/// filter; for a slice subrequest, its slice.
pub fn var(cx: &Ctx<'_>, _id: u8, out: &mut Vec<u8>) -> bool {
    if let Some(v) = memo(cx) {
        out.extend_from_slice(&v.range);
        return true;
    }
    let size = cx.loc.modules.slice.size.unwrap_or(0);
    if cx.sub_depth > 0 || cx.sent.status != 0 || size == 0 {
        return false;
    }
    let start = size * (first_byte(cx) / size);
    let v = SliceVar {
        start,
        range: range_of(start, size),
    };
    out.extend_from_slice(&v.range);
    cx.memo.borrow_mut().push((MEMO, Box::new(v)));
    true
}

fn memo(cx: &Ctx<'_>) -> Option<SliceVar> {
    cx.memo
        .borrow()
        .iter()
        .find(|(k, _)| *k == MEMO)
        .and_then(|(_, v)| v.downcast_ref::<SliceVar>())
        .cloned()
}

/// The first byte the client asks for, as nginx's slice module reads it:
/// 0 unless there is exactly one `bytes=N-...` range and no If-Range.
fn first_byte(cx: &Ctx<'_>) -> u64 {
    if cx.req.header("if-range").is_some() {
        return 0;
    }
    let Some(v) = cx.req.header("range") else {
        return 0;
    };
    if v.len() < 7 || !v[..6].eq_ignore_ascii_case(b"bytes=") || v.contains(&b',') {
        return 0;
    }
    let mut n: u64 = 0;
    for &c in v[6..].iter().skip_while(|&&c| c == b' ') {
        if !c.is_ascii_digit() {
            break;
        }
        match n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(c - b'0')))
        {
            Some(m) if m <= i64::MAX as u64 => n = m,
            _ => return 0,
        }
    }
    n
}

/// A `Content-Range: bytes S-E/TOTAL` as nginx's slice module parses it:
/// `[S, E+1)` and TOTAL (None for `*`).
fn content_range(v: &[u8]) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.strip_prefix(b"bytes ")?;
    let mut p = 0;
    let at = |i: usize| rest.get(i).copied().unwrap_or(0);
    let sp = |p: &mut usize| {
        while at(*p) == b' ' {
            *p += 1;
        }
    };
    let num = |p: &mut usize| -> Option<u64> {
        if !at(*p).is_ascii_digit() {
            return None;
        }
        let mut n: u64 = 0;
        while at(*p).is_ascii_digit() {
            n = n.checked_mul(10)?.checked_add(u64::from(at(*p) - b'0'))?;
            if n > i64::MAX as u64 {
                return None;
            }
            *p += 1;
        }
        Some(n)
    };
    sp(&mut p);
    let start = num(&mut p)?;
    sp(&mut p);
    if at(p) != b'-' {
        return None;
    }
    p += 1;
    sp(&mut p);
    let end = num(&mut p)?.checked_add(1)?;
    sp(&mut p);
    if at(p) != b'/' {
        return None;
    }
    p += 1;
    sp(&mut p);
    let total = if at(p) == b'*' {
        p += 1;
        None
    } else {
        Some(num(&mut p)?)
    };
    sp(&mut p);
    if p != rest.len() {
        return None;
    }
    Some((start, end, total))
}

/// Checks a slice's response head: 206, the ETag of the first slice (when
/// it had one), a Content-Range for exactly `[start, start+size)` (cut at
/// the total). The total, or nginx's error line.
fn check(resp: &Response, start: u64, size: u64, etag: Option<&[u8]>) -> Result<u64, String> {
    if resp.status != 206 {
        return Err(format!(
            "unexpected status code {} in slice response",
            resp.status
        ));
    }
    if let Some(e) = etag {
        if resp.header("etag") != Some(e) {
            return Err("etag mismatch in slice response".into());
        }
    }
    let Some((s, e, total)) = resp.header("content-range").and_then(content_range) else {
        return Err("invalid range in slice response".into());
    };
    let Some(total) = total else {
        return Err("no complete length in slice response".into());
    };
    if s != start || e != start.saturating_add(size).min(total) {
        return Err(format!("unexpected range in slice response: {}-{}", s, e));
    }
    Ok(total)
}

/// Header filter, first of them: a main request's 206 for its first slice
/// becomes the whole entity's 200 (see the module docs).
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    let Some(v) = memo(cx) else { return };
    let size = cx.loc.modules.slice.size.unwrap_or(0);
    if resp.status != 206 || size == 0 {
        // nginx's slice context goes: the response is the handler's own.
        cx.memo.borrow_mut().retain(|(k, _)| *k != MEMO);
        return;
    }
    let etag = resp.header("etag").map(<[u8]>::to_vec);
    let total = match check(resp, v.start, size, None) {
        Ok(t) => t,
        Err(msg) => {
            cx.log(Level::Error, &msg);
            resp.body = Body::Empty;
            resp.close_silently = true;
            return;
        }
    };
    let first_end = v.start.saturating_add(size).min(total);
    resp.status = 200;
    resp.status_line = None;
    resp.content_length = Some(total);
    resp.remove_header("content-range");
    resp.remove_header("accept-ranges");
    // Rangeable, one range at most, as nginx marks it (allow_ranges,
    // single_range): the range filter picks what the client asked for.
    resp.headers
        .push(("Accept-Ranges".into(), b"bytes".to_vec()));
    resp.ranges_off = false;
    resp.single_range = true;
    let policy = Arc::new(resp.io.take().unwrap_or_default());
    let first = crate::http::modules::addition::into_stream(std::mem::take(&mut resp.body), policy);
    let (go_tx, go_rx) = oneshot::channel();
    let (tx, rx) = mpsc::channel(2);
    spawn_rest(cx, size, etag, go_rx, tx);
    let postpone = cx.loc.core.postpone_output.unwrap_or(1460) as usize;
    resp.body = Body::Stream(Box::new(SliceBody {
        first: Some(first),
        pos: v.start,
        first_end,
        size,
        total,
        cut: None,
        go: Some(go_tx),
        rx,
        rest: false,
        hold: Vec::new(),
        postpone: postpone.max(1),
        yielded: false,
    }));
}

/// A piece of a later slice: its offset in the entity, and the bytes.
type Piece = std::io::Result<(u64, Bytes)>;

/// Starts the task that fetches the later slices once the body asks
/// (`go`: from where to where), one clone of the request per slice.
fn spawn_rest(
    cx: &Ctx<'_>,
    size: u64,
    etag: Option<Vec<u8>>,
    go: oneshot::Receiver<(u64, u64)>,
    tx: mpsc::Sender<Piece>,
) {
    let http = cx.http.clone();
    let req = cx.req.clone();
    let server = cx.server.clone();
    let conn = cx.conn.clone();
    let shared = cx.shared.clone();
    let from = (cx.sub_depth + 1, cx.remote);
    let vars = cx.user_vars.borrow().clone();
    let body = cx.body.as_ref().and_then(|b| b.share());
    let loc = cx.loc.clone();
    let uri = cx.uri.to_vec();
    let args = cx.args.as_ref().map(|a| a.to_vec());
    let method = cx.method;
    let place = (
        cx.captures.clone(),
        cx.capture_src.clone(),
        cx.loc_prefix_len,
        cx.alias,
    );
    tokio::task::spawn_local(async move {
        // Nothing is fetched for a body nobody reads (HEAD, 304, 416...).
        let Ok((mut start, end)) = go.await else {
            return;
        };
        while start < end {
            let mut sub = Ctx::new(&http, &req, &server, &conn, &shared);
            crate::http::subrequest::prepare(
                &mut sub,
                from,
                uri.clone(),
                args.clone(),
                method,
                vars.clone(),
                body.as_ref().and_then(|b| b.share()),
            );
            sub.loc = loc.clone();
            (sub.captures, sub.capture_src, sub.loc_prefix_len, sub.alias) = place.clone();
            sub.memo.borrow_mut().push((
                MEMO,
                Box::new(SliceVar {
                    start,
                    range: range_of(start, size),
                }),
            ));
            // nginx's clone subrequest starts at the content phase of the
            // same location.
            let mut r = match sub.loc.content {
                Some(handler) => handler(&mut sub).await,
                None => Response::status(500),
            };
            sub.sent.status = r.status;
            let outcome = check(&r, start, size, etag.as_deref());
            if sub.loc.core.log_subrequest.unwrap_or(false) {
                crate::http::modules::log_phase(&sub);
            }
            if let Err(msg) = outcome {
                sub.log(Level::Error, &msg);
                let _ = tx.send(Err(std::io::Error::other(response::Unsent))).await;
                return;
            }
            let policy = Arc::new(r.io.take().unwrap_or_default());
            let mut src =
                crate::http::modules::addition::into_stream(std::mem::take(&mut r.body), policy);
            let mut pos = start;
            loop {
                match src.next().await {
                    Ok(Some(b)) => {
                        let n = b.len() as u64;
                        if tx.send(Ok((pos, b))).await.is_err() {
                            return;
                        }
                        pos += n;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
            start = start.saturating_add(size);
        }
    });
}

/// The client's body: the first slice's, then the later ones' (see the
/// module docs).
struct SliceBody {
    /// The first slice's body, until it ends.
    first: Option<Box<dyn BodyStream>>,
    /// The entity offset of the next byte of the first slice.
    pos: u64,
    /// Where the first slice ends (the next slice's start).
    first_end: u64,
    size: u64,
    total: u64,
    /// The one range the client gets, `[s, e)`, when the range filter cut.
    cut: Option<(u64, u64)>,
    go: Option<oneshot::Sender<(u64, u64)>>,
    rx: mpsc::Receiver<Piece>,
    /// The later slices were asked for.
    rest: bool,
    /// Output held back until `postpone` bytes or the end.
    hold: Vec<u8>,
    postpone: usize,
    yielded: bool,
}

impl SliceBody {
    fn bounds(&self) -> (u64, u64) {
        self.cut.unwrap_or((0, self.total))
    }

    /// Keeps the part of `b` (at entity offset `at`) the client gets.
    fn keep(&mut self, at: u64, b: &[u8]) {
        let (lo, hi) = self.bounds();
        let s = lo.max(at);
        let e = hi.min(at + b.len() as u64);
        if s < e {
            self.hold
                .extend_from_slice(&b[(s - at) as usize..(e - at) as usize]);
        }
    }

    /// An error: before anything went out, the client gets nothing.
    fn fail(&self, e: std::io::Error) -> std::io::Error {
        if self.yielded || response::is_unsent(&e) {
            e
        } else {
            std::io::Error::other(response::Unsent)
        }
    }

    fn take(&mut self) -> Option<Bytes> {
        self.yielded = true;
        Some(Bytes::from(std::mem::take(&mut self.hold)))
    }
}

impl BodyStream for SliceBody {
    fn next(&mut self) -> std::pin::Pin<Box<dyn StreamFuture<'_> + '_>> {
        Box::pin(async move {
            loop {
                if !self.hold.is_empty() && (self.yielded || self.hold.len() >= self.postpone) {
                    return Ok(self.take());
                }
                if let Some(first) = self.first.as_mut() {
                    match first.next().await {
                        Ok(Some(b)) => {
                            let at = self.pos;
                            self.pos += b.len() as u64;
                            self.keep(at, &b);
                        }
                        Ok(None) => {
                            self.first = None;
                            let (lo, hi) = self.bounds();
                            let mut start = self.first_end;
                            // A range past the next slice skips ahead.
                            if start.saturating_add(self.size) <= lo {
                                start = self.size * (lo / self.size);
                            }
                            if start < hi {
                                if let Some(go) = self.go.take() {
                                    let _ = go.send((start, hi));
                                }
                                self.rest = true;
                            }
                        }
                        Err(e) => return Err(self.fail(e)),
                    }
                    continue;
                }
                if self.rest {
                    match self.rx.recv().await {
                        Some(Ok((at, b))) => self.keep(at, &b),
                        Some(Err(e)) => return Err(self.fail(e)),
                        None => self.rest = false,
                    }
                    continue;
                }
                if self.hold.is_empty() {
                    return Ok(None);
                }
                return Ok(self.take());
            }
        })
    }

    fn ready(&self) -> bool {
        // Until the first output, the head waits with it (so that a
        // failure before it sends nothing).
        !self.yielded || !self.hold.is_empty()
    }

    fn cut(&mut self, start: u64, end: u64) -> bool {
        self.cut = Some((start, end));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_as_nginx_reads_it() {
        assert_eq!(content_range(b"bytes 0-1/100"), Some((0, 2, Some(100))));
        assert_eq!(content_range(b"bytes  2 - 3 / 16 "), Some((2, 4, Some(16))));
        assert_eq!(content_range(b"bytes 0-1/*"), Some((0, 2, None)));
        assert_eq!(content_range(b"bytes"), None);
        assert_eq!(content_range(b"bytes 0-1/100x"), None);
        assert_eq!(content_range(b"bytes -1/100"), None);
        assert_eq!(content_range(b"Bytes 0-1/100"), None);
    }

    #[test]
    fn slice_checks() {
        let mut r = Response::status(206);
        r.headers
            .push(("Content-Range".into(), b"bytes 2-3/16".to_vec()));
        r.headers.push(("ETag".into(), b"\"a\"".to_vec()));
        assert_eq!(check(&r, 2, 2, Some(b"\"a\"")), Ok(16));
        assert_eq!(
            check(&r, 2, 2, Some(b"\"b\"")),
            Err("etag mismatch in slice response".into())
        );
        assert_eq!(
            check(&r, 0, 2, None),
            Err("unexpected range in slice response: 2-4".into())
        );
        // The last slice is cut at the total.
        let mut r = Response::status(206);
        r.headers
            .push(("Content-Range".into(), b"bytes 14-15/16".to_vec()));
        assert_eq!(check(&r, 14, 4, None), Ok(16));
        r.status = 200;
        assert_eq!(
            check(&r, 14, 4, None),
            Err("unexpected status code 200 in slice response".into())
        );
    }
}
