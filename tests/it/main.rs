//! Integration tests: each starts the real `tern` binary with a real
//! configuration on free loopback ports and talks to it over sockets.
//! One test binary; one module per area. The harness is in `harness.rs`.

mod harness;

mod accept;
mod access_log;
mod auth;
mod autoindex;
mod cache_status_line;
mod charset;
mod client_abort;
mod core_directives;
mod core_msie_chunked;
mod differential;
mod empty_gif;
mod engine;
mod fastcgi;
mod geo;
mod gzip;
mod idle;
mod io;
mod limit_rate_var;
mod limits;
mod lint;
mod map;
mod next_upstream;
mod open_file_cache;
mod origin;
mod proxy;
mod proxy_body;
mod proxy_cache_stale;
mod proxy_directives;
mod proxy_more;
mod proxy_range;
mod proxy_stream;
mod proxy_upstream_answers;
mod proxy_websocket;
mod random_index;
mod referer;
mod request_line;
mod runtime;
mod secure_link;
mod seeds;
mod smoke;
mod static_headers;
mod status;
mod stream;
mod stream_modules;
mod sub_filter;
mod subrequest;
mod tls;
mod tls_client_cert;
mod upgrade;
mod upstream_balance;
mod userid;
