//! tern: a web server, reverse proxy and HTTP cache that runs nginx.conf.
//!
//! See ARCHITECTURE.md for the request path. Modules:
//! - [`cache`]: the on-disk HTTP cache (keys zones, cache files, loader, manager).
//! - [`config`]: nginx.conf lexer/parser, includes, directive registry, values.
//! - [`core`]: compiled main configuration, master, workers, listeners, signals, logs.
//! - [`http`]: HTTP/1.1 engine, phases, modules (static, return, ...).
//! - [`io`]: the file-I/O layer; the only place that may block on a disk.
//! - [`stream`]: the `stream {}` TCP proxy.
//! - [`tls`]: TLS for `listen ... ssl` (rustls): configuration, handshake, stream.

pub mod cache;
pub mod config;
pub mod core;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod io;
pub mod mail;
pub mod stream;
pub mod tls;
