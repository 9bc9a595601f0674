//! HTTP: the protocol-neutral request path (request, response, phases,
//! modules, filters) and the protocols that carry it: [`v1`] (HTTP/1.x);
//! [`serve`] picks one per connection.
pub mod body;
pub mod conf;
pub mod date;
pub mod fields;
pub mod modules;
pub mod phases;
pub mod request;
pub mod response;
pub mod serve;
pub mod status;
pub mod subrequest;
pub mod tunnel;
pub mod upstream;
pub mod uri;
pub mod v1;
pub mod v2;
pub mod v3;
// Chunked coding is HTTP/1 framing, also read from upstreams (proxy).
pub use v1::chunked;
pub mod vars;
