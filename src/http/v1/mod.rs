//! HTTP/1.x on the wire: the connection state machine ([`conn`]), the
//! chunked transfer coding ([`chunked`]). Everything protocol-specific of
//! HTTP/1 lives here; the request's phases, modules and filters see only
//! [`crate::http::request::Request`] and [`crate::http::response::Response`].
pub mod chunked;
pub mod conn;
pub mod head;
pub mod parse;
