//! nginx's hash-table sizing directives (`*_hash_max_size`,
//! `*_hash_bucket_size`): accepted with their values checked as nginx
//! checks them, and no effect.
//!
//! nginx builds static hash tables for server names, MIME types,
//! variables, `map` keys and proxied header names, and these directives
//! size them; a table that does not fit is a startup error. tern keeps
//! those sets in growable Rust hash maps that have no such limits, so
//! there is nothing to size. Distribution configs carry them (Debian's
//! stock nginx.conf has `types_hash_max_size 2048;`), so they must load.

use crate::config::registry::{ctx, num_arg, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::{HttpMain, LocConf};

fn check_http(_: &mut HttpMain, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    num_arg(d, 0).map(drop)
}

fn check_loc(_: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    num_arg(d, 0).map(drop)
}

const fn http(name: &'static str) -> Spec {
    Spec {
        name,
        ctx: ctx::HTTP,
        args: Args::take(1),
        set: Setter::HttpMain(check_http),
    }
}

const fn hsl(name: &'static str) -> Spec {
    Spec {
        name,
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(check_loc),
    }
}

const fn sl(name: &'static str) -> Spec {
    Spec {
        name,
        ctx: ctx::SRV | ctx::LOC,
        args: Args::take(1),
        set: Setter::Loc(check_loc),
    }
}

pub const DIRECTIVES: &[Spec] = &[
    http("server_names_hash_max_size"),
    http("server_names_hash_bucket_size"),
    http("variables_hash_max_size"),
    http("variables_hash_bucket_size"),
    http("map_hash_max_size"),
    http("map_hash_bucket_size"),
    hsl("types_hash_max_size"),
    hsl("types_hash_bucket_size"),
    hsl("proxy_headers_hash_max_size"),
    hsl("proxy_headers_hash_bucket_size"),
    sl("referer_hash_max_size"),
    sl("referer_hash_bucket_size"),
];
