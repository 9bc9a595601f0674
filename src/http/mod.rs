//! HTTP: the HTTP/1.1 engine, phases, and modules.
pub mod conf;
