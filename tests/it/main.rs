//! Integration tests: each starts the real `tern` binary with a real
//! configuration on free loopback ports and talks to it over sockets.
//! One test binary; one module per area. The harness is in `harness.rs`.

mod harness;

mod open_file_cache;
mod smoke;
