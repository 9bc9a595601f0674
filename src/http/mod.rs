//! HTTP: the HTTP/1.1 engine, phases, and modules.
pub mod chunked;
pub mod conf;
pub mod date;
pub mod status;
pub mod uri;
