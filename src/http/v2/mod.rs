//! HTTP/2 (RFC 9113) on a connection, with the `h2` crate doing framing,
//! flow control, the stream state machine and the HPACK of answers; the
//! client's header blocks are decoded here (`hpack`, fed by `guard`, which
//! hands h2 a stand-in for each request's block), so that a request's
//! fields are judged as nginx judges them; this module maps each stream
//! onto the protocol-neutral request path.
//!
//! ```text
//!  http::serve ── ALPN "h2", or the preface on a cleartext `http2` listener
//!    conn::serve: h2 handshake (SETTINGS from http2_* and the header limits)
//!      socket ─▶ guard (floods, HPACK: fields kept per stream) ─▶ h2
//!      accept loop ── a stream's HEADERS ──▶ spawn_local(stream task)
//!         │              Request built from the fields the guard kept
//!         │              (nginx's HTTP/2 checks: 400, then RST_STREAM
//!         │              PROTOCOL_ERROR; then those of an HTTP/1 head),
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
//! move is a protocol error (the guard's or the `h2` crate's: RST_STREAM or
//! GOAWAY), never a panic; a reload applies from the next stream.

pub mod conf;
pub mod conn;
pub(crate) mod guard;
pub(crate) mod hpack;
mod io;

/// The client connection preface (RFC 9113 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
