//! The upstream engine: what every `*_pass` module (proxy, fastcgi, ...)
//! shares, as nginx's `ngx_http_upstream.c` is shared by its protocol
//! modules. A protocol module fills in the [`Protocol`] callbacks (nginx's
//! `create_request`, `process_header`, `input_filter`) and calls [`run`]
//! from its content handler, which it puts in the location's content slot
//! ([`crate::http::conf::LocConf::content`], nginx's `clcf->handler`).
//! Nothing here knows a protocol module.
//!
//! # One request
//!
//! ```text
//! *_pass module's content handler
//!   ├─ the request body, read whole (crate::http::body), or with
//!   │   PREFIX_request_buffering off a body::Streaming that fetch sends
//!   │   as it arrives (run::begin_body, fetch::BodyFeed), the upstream
//!   │   (peers::Upstream), the Limits (+ TLS for https://)
//!   └─ run(cx, proto, upstream, limits)                         run.rs
//!        ├─ PREFIX_cache? key -> md5 -> zone lookup ── HIT ──▶ the entry   cache.rs
//!        ├─ Protocol::create_request: head + body for upstream
//!        ├─ fetch: peers tried until one answers with a head       fetch.rs
//!        │    connect (+TLS), send (body framed by Protocol::frame_body),
//!        │    Protocol::head_reader fed until the head is whole,
//!        │    PREFIX_next_upstream on errors and listed statuses
//!        ├─ stale / revalidated answers from the cache                 cache.rs
//!        └─ the head becomes a Response once                      response.rs
//!             headers relayed (hidden, hop-by-hop, Protocol's rewrites),
//!             X-Accel-*, intercept_errors, ranges, 101 -> tunnel;
//!             X-Accel-Redirect: kept for the content phase, which makes
//!             the internal redirect (response::accel_redirect);
//!             the body: complete with the head ──▶ Body::Bytes, else a
//!             Producer reads it through the BodyDecoder into the pipe  pipe.rs
//!             (memory, temp file, cache file, PREFIX_store file)
//! ```
//!
//! Files, one job each: `conf.rs` the shared settings and their setters
//! (one table per prefix, [`upstream_directives!`]); `peers.rs` the
//! `upstream {}` blocks, balancing and keepalive; `fetch.rs` one fetch
//! with its retries; `cache.rs` lookup, entries, validity, background
//! updates; `pipe.rs` the body's way to the client; `response.rs` the
//! head turned into a Response; `run.rs` the order of it all; `ssl.rs`
//! the `PREFIX_ssl_*` settings and the TLS client of a request, for every
//! protocol that speaks TLS (`tls` in its `upstream_directives!` call).

pub mod cache;
pub mod conf;
pub mod fetch;
pub mod peers;
pub mod pipe;
pub mod purge;
pub mod response;
pub mod run;
pub mod ssl;
pub mod state;

use std::path::Path;

use crate::http::phases::Ctx;
use crate::http::response::Response;

pub use conf::{Limits, UpstreamConf};
pub use fetch::{Fail, OutBody};
pub use run::run;

/// A request for upstream, as the protocol encodes it: the head (for
/// FastCGI, the records up to the body) and the body, which the engine
/// sends again to each peer it tries.
pub struct Request {
    pub head: Vec<u8>,
    pub body: OutBody,
}

/// What the cache asks of a request it may store or revalidate.
#[derive(Clone, Copy)]
pub struct Caching<'a> {
    /// HEAD goes upstream as GET (`proxy_cache_convert_head`).
    pub convert_head: bool,
    /// The expired entry's validators (`If-Modified-Since` value,
    /// `If-None-Match` value) with `PREFIX_cache_revalidate`.
    pub revalidate: Option<&'a cache::Validators>,
}

/// A backend protocol. One value per request (it may carry what the
/// request computed, such as the URI sent upstream); it lives on in a
/// background cache update.
pub trait Protocol: Send + Sync {
    /// The location's shared upstream settings.
    fn conf(&self) -> &UpstreamConf;

    /// The `upstream: "..."` of error-log lines for a peer.
    fn url(&self, peer: &str) -> String;

    /// nginx's `create_request`. Err: the answer instead (logged).
    fn create_request(
        &self,
        cx: &Ctx<'_>,
        caching: Option<Caching<'_>>,
    ) -> Result<Request, Box<Response>>;

    /// Frames a piece of the request body read back from its temp file
    /// into `out`; false: it goes as it is.
    fn frame_body(&self, _data: &[u8], _out: &mut Vec<u8>) -> bool {
        false
    }

    /// What follows the last piece of a body read from its temp file.
    fn end_body(&self, _out: &mut Vec<u8>) {}

    /// A reader of the response head for one attempt (nginx's
    /// `process_header`); `head_max` is PREFIX_buffer_size.
    fn head_reader(&self, head_only: bool, head_max: usize) -> Box<dyn HeadReader>;

    /// Response headers not relayed unless PREFIX_pass_header names them.
    fn hidden(&self) -> &'static [&'static str];

    /// Upstream's `Date` and `Server` are relayed (else tern writes its own).
    fn relays_date(&self) -> bool {
        false
    }

    /// `Server` and `Date` named by `PREFIX_pass_header` replace tern's
    /// own even when upstream sent none (nginx's proxy module).
    fn passed_replace_own(&self) -> bool {
        false
    }

    /// A relayed `Location` value rewritten (`proxy_redirect`); `prefix`
    /// is the part of the URI the location matched.
    fn rewrite_location(&self, _prefix: &[u8], _v: &[u8]) -> Option<Vec<u8>> {
        None
    }

    /// A relayed `Refresh` value rewritten (its `url=` part).
    fn rewrite_refresh(&self, _v: &[u8]) -> Option<Vec<u8>> {
        None
    }

    /// Relayed `Set-Cookie` headers rewritten (`proxy_cookie_*`).
    fn rewrite_cookies(&self, _cx: &mut Ctx<'_>, _headers: &mut [(String, Vec<u8>)]) {}

    /// The status is answered by tern (error_page or its own page), as
    /// nginx's `intercept_404` for memcached.
    fn intercepts(&self, _status: u16) -> bool {
        false
    }

    /// Byte ranges are served from the answer as from a file (memcached's
    /// values), not only with `PREFIX_force_ranges`.
    fn ranges(&self) -> bool {
        false
    }

    /// A 101 to a request with `Upgrade` turns the connection into a tunnel.
    fn upgrades(&self) -> bool {
        false
    }

    /// The cache key without `PREFIX_cache_key`.
    fn cache_key(&self, cx: &Ctx<'_>) -> Vec<u8>;

    /// `PREFIX_cache_convert_head`'s default.
    fn convert_head(&self) -> bool {
        false
    }

    /// Where temp files go without `PREFIX_temp_path`.
    fn temp_default(&self) -> &Path;

    /// A protocol that runs its own session on the connection (gRPC's
    /// HTTP/2 client) instead of the engine's byte-stream exchange
    /// (`create_request`'s head, the body framed by `frame_body`, the
    /// answer fed to `head_reader`).
    fn session(&self) -> Option<&dyn Session> {
        None
    }
}

/// A whole answer from a [`Session`]: the head (its body complete, its
/// decoder done) and the trailers that followed the body.
pub struct SessionAnswer {
    pub head: Head,
    pub trailers: Vec<(String, Vec<u8>)>,
    /// The body still arriving, its trailers at its end
    /// ([`crate::http::response::BodyStream::trailers`]); None: the body
    /// is complete in `head.body`.
    pub body: Option<Box<dyn crate::http::response::BodyStream>>,
}

/// One exchange on a connection a protocol drives itself: the request
/// (the head `create_request` made, which the session may ignore, and
/// the body) sent, the answer read whole within the [`Limits`]' timeouts.
/// An Err after the request went out is not retried for non-idempotent
/// requests, as the engine's own exchange. `body`: for an
/// `OutBody::Stream` request, the client's body as it arrives (the engine
/// pumps its feed into it while the session runs).
pub trait Session: Send + Sync {
    /// One exchange on `conn`. `keep`: where the connection goes back
    /// once the exchange ended cleanly (upstream `keepalive`). A failure
    /// with `sent` unset on a kept connection means it was found closed
    /// before the request went: the engine tries a new one.
    fn exchange<'a>(
        &'a self,
        conn: SessionConn,
        keep: Option<peers::KeepTo>,
        send: &'a fetch::Outgoing<'a>,
        lim: &'a Limits,
        slot: &'a state::Slot,
        body: Option<BodyRx>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<SessionAnswer, Fail>> + Send + 'a>>;
}

/// The connection a [`Session`] runs on: a new one, or one it kept from
/// an earlier exchange ([`peers::KeepTo`]), opaque to the engine.
pub enum SessionConn {
    Fresh(crate::tls::client::UpStream),
    Kept(Box<dyn std::any::Any + Send>),
}

/// A streamed request body handed to a [`Session`]: each piece with
/// whether it is the last (an empty last piece: the body ended after the
/// previous one); Err: the status for the client (the feed logged why).
pub type BodyRx = tokio::sync::mpsc::Receiver<Result<(bytes::Bytes, bool), u16>>;

/// A response head, as the protocol read it.
pub struct Head {
    pub status: u16,
    /// The status line after `HTTP/1.x ` as it is to be sent; empty:
    /// tern's own.
    pub status_line: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Bytes that came after the head, undecoded.
    pub early: Vec<u8>,
    /// Body bytes already decoded with the head.
    pub body: Vec<u8>,
    /// The length upstream declared.
    pub declared_len: Option<u64>,
    /// No body follows (an answer to HEAD, 204, 304).
    pub no_body: bool,
    /// The connection may be reused once the body is read whole.
    pub keep: bool,
    pub decoder: Box<dyn BodyDecoder>,
}

/// Reads one response head as its bytes arrive.
pub trait HeadReader: Send {
    /// The next bytes; Some once the head is complete. Err: nginx's
    /// message and next_upstream case.
    fn feed(&mut self, data: &[u8]) -> Result<Option<Head>, Fail>;

    /// Error-log lines (at `error`) produced so far, taken.
    fn logs(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// The response body's decoder (nginx's `input_filter`).
pub trait BodyDecoder: Send {
    /// Decodes what arrived, appending body bytes to `out`.
    fn feed(&mut self, buf: &[u8], out: &mut Vec<u8>) -> Result<(), Fail>;

    /// The body is complete.
    fn done(&self) -> bool;

    /// Bytes came after the body's end (the connection cannot be reused).
    fn extra(&self) -> bool {
        false
    }

    /// nginx's warning for those bytes.
    fn extra_warning(&self) -> Option<&'static str> {
        None
    }

    /// The body ends with the connection.
    fn by_close(&self) -> bool {
        false
    }

    /// The body ended short of what upstream declared (FastCGI's
    /// END_REQUEST before `Content-Length` bytes), once: what was decoded
    /// goes to the client, then the connection closes as after any
    /// failure once the head is out (nginx's `p->upstream_error`). A
    /// broken body is never `done`.
    fn broken(&mut self) -> Option<Fail> {
        None
    }

    /// Error-log lines (at `error`) produced so far, taken.
    fn logs(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// A content handler: what a `*_pass` directive puts in its location's
/// content slot.
pub type Handler =
    for<'a, 'c> fn(
        &'a mut Ctx<'c>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + 'a>>;

/// Engine variables (see `modules::VAR_MODULES`).
pub const VARS: &[&str] = &[
    "upstream_cache_status",
    "upstream_addr",
    "upstream_status",
    "upstream_connect_time",
    "upstream_header_time",
    "upstream_response_time",
    "upstream_response_length",
    "upstream_bytes_sent",
    "upstream_bytes_received",
];

pub fn var(cx: &Ctx<'_>, i: u8, out: &mut Vec<u8>) -> bool {
    let Some(name) = VARS.get(usize::from(i)) else {
        return false;
    };
    match state::Var::of(name) {
        Some(v) => state::States::of(cx).is_some_and(|s| s.render(v, out)),
        None => cx.note_var(name, out),
    }
}
