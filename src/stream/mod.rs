//! The `stream` module: a TCP, UDP and unix-socket proxy configured by
//! nginx's `stream {}` block, with its modules (`return`, `set`, `map`,
//! `geo`, `split_clients`, `access`, `limit_conn`, `realip`, `access_log`,
//! `ssl`, `ssl_preread`, upstream balancing).
//!
//! - [`conf`]: the core directive table, the walker of the block and the
//!   compiled [`conf::StreamConf`]; each module's table (beside its
//!   code) is listed in [`TABLES`].
//!   The block compiles against its own variable table (stream mode), so
//!   http's compilers of `map`, `geo`, `split_clients`, `log_format` and
//!   `access_log`, and its `ssl_*` setters, serve stream unchanged.
//! - [`session`]: the phases of one session, in order, and the session as
//!   the variables' context; [`vars`]: the stream variables. The phases'
//!   modules: [`ssl`] (TLS termination), [`ssl_preread`],
//!   [`limit_conn`], [`access`], [`log`].
//! - [`upstream`]: `upstream {}` groups, weighted round-robin, `hash`,
//!   `least_conn`, `random`, passive health checks.
//! - [`proxy`]: the content phase of `proxy_pass`: connect (with
//!   `proxy_bind`, `proxy_ssl` ([`proxy_ssl`]), a PROXY header), then
//!   copy both ways. A `proxy_pass` with variables is rendered first
//!   ([`proxy::target`]): an upstream block, an address, or a
//!   `host:port` looked up with the server's `resolver` (http's, shared:
//!   [`crate::http::modules::resolver`]).
//! - [`proxy_protocol`] (shared with http, in `core`), [`ssl_preread`]:
//!   the two parsers of what a client sends before its data.
//! - [`udp`]: `listen ... udp`: datagrams grouped into sessions by the
//!   client's address, each through the same phases, relayed over a
//!   connected UDP socket (`proxy_requests`, `proxy_responses`).
//!
//! Listening sockets of stream servers go through the same machinery as
//! http ones: the master binds them (one `SO_REUSEPORT` socket per worker
//! with `listen ... reuseport`), reconciles them on reload and hands them
//! to the workers, whose accept loop counts connections against
//! `worker_connections` and spawns [`session::serve`] for a stream listener.
//! The server for a connection is looked up in the configuration current
//! at accept time; a session keeps that server (an `Arc`) to its end, so a
//! reload closes no session.
//!
//! # Session states
//!
//! ```text
//!  accepted ──no worker_connections slot for the upstream side──▶ closed
//!     │
//!     ▼ pick a peer (round-robin, skipping tried/down/failed peers)
//!  connecting ──refused / proxy_connect_timeout──▶ next peer, while
//!     │           proxy_next_upstream on and tries/timeout allow;
//!     │           "no live upstreams" ──────────────────────────▶ closed
//!     ▼ connected
//!  proxying (both directions copy; any byte moved restarts proxy_timeout)
//!     │── one side sent FIN, its data delivered, proxy_half_close off ──▶ closed
//!     │── proxy_half_close on: FIN passed on (shutdown(SHUT_WR));
//!     │      the other direction goes on ─── its FIN too ──────────────▶ closed
//!     │── a read or write error (reset) ──────────────────────────────▶ closed
//!     └── proxy_timeout without any byte moving ──────────────────────▶ closed
//! ```
//!
//! Invariants: a direction reads only into an empty buffer (memory per
//! session is two `proxy_buffer_size` buffers); a peer chosen for a session
//! counts toward its `max_conns` until the session ends; nothing a peer
//! sends can panic the worker.

pub mod access;
pub mod conf;
pub mod limit_conn;
pub mod log;
pub mod pass;
pub mod proxy;
pub mod proxy_ssl;
pub use crate::core::proxy_protocol;
pub mod session;
pub mod ssl;
pub mod ssl_preread;
pub mod udp;
pub mod upstream;
pub mod vars;

/// Every stream module's directive table (looked up as http's are, with
/// the registry's index and checks: [`crate::config::registry::Index`]).
/// A new module adds its table here.
pub const TABLES: &[&[conf::StreamSpec]] = &[
    conf::DIRECTIVES,
    proxy::DIRECTIVES,
    proxy_ssl::DIRECTIVES,
    ssl::DIRECTIVES,
    access::DIRECTIVES,
    limit_conn::DIRECTIVES,
    log::DIRECTIVES,
    upstream::DIRECTIVES,
    pass::DIRECTIVES,
    ssl_preread::DIRECTIVES,
];
