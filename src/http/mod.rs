//! HTTP: the HTTP/1.1 engine, phases, and modules.
pub mod body;
pub mod chunked;
pub mod conf;
pub mod conn;
pub mod date;
pub mod modules;
pub mod phases;
pub mod request;
pub mod response;
pub mod status;
pub mod subrequest;
pub mod tunnel;
pub mod upstream;
pub mod uri;
pub mod vars;
