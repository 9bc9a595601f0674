//! HTTP/2 (RFC 9113) on a connection, with the `h2` crate doing framing,
//! HPACK, flow control and the stream state machine; this module maps
//! each stream onto the protocol-neutral request path.
//!
//! ```text
//!  http::serve ── ALPN "h2", or the preface on a cleartext `http2` listener
//!    conn::serve: h2 handshake (SETTINGS from http2_* and the header limits)
//!      accept loop ── a stream's HEADERS ──▶ spawn_local(stream task)
//!         │              Request built from the pseudo-headers and fields
//!         │              (nginx's checks, as for an HTTP/1 head),
//!         │              phases::run, the body (if a handler reads it)
//!         │              from DATA frames, flow control released as read;
//!         │              the Response as HEADERS + DATA (files read
//!         │              through the file-I/O layer, body filters, streams)
//!         │              log phase
//!      QUIT: GOAWAY, streams in flight finish, then the connection closes
//!        (lingering); worker_shutdown_timeout running out first closes
//!        it, each stream in flight logged (499 before its answer)
//!      keepalive_timeout with no stream open: GOAWAY and close
//! ```
//!
//! Invariants: a stream task owns everything it uses (the connection's
//! facts are cloned), so a stream never holds up another; a peer's invalid
//! move is the `h2` crate's protocol error (RST_STREAM or GOAWAY), never a
//! panic; a reload applies from the next stream.

pub mod conf;
pub mod conn;
pub(crate) mod guard;
pub(crate) mod hpack;
mod io;

/// The client connection preface (RFC 9113 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
