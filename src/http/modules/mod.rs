//! HTTP modules: each owns its directive table and its slice of the
//! location configuration ([`ModLoc`]), and plugs into a phase.
//!
//! Phase order (one constant, see [`crate::http::phases`]): server rewrite,
//! location lookup, location rewrite, access, content, then output filters
//! and logging.

pub mod access;
pub mod access_log;
pub mod addition;
pub mod auth_basic;
pub mod auth_request;
pub mod autoindex;
pub mod brotli;
pub mod cgi;
pub mod charset;
pub mod compress_cache;
pub mod dav;
pub mod empty_gif;
pub mod error_page;
pub mod fastcgi;
pub mod flv;
pub mod geo;
pub mod grpc;
pub mod gzip;
pub mod gzip_static;
pub mod hash_sizes;
pub mod headers;
pub mod index;
pub mod limit_conn;
pub mod limit_req;
pub mod map;
pub mod memcached;
pub mod mirror;
pub mod mp4;
pub mod not_modified;
pub mod open_file_cache;
pub mod proxy;
pub mod random_index;
pub mod range;
pub mod realip;
pub mod referer;
pub mod resolver;
pub mod rewrite;
pub mod scgi;
pub mod secure_link;
pub mod slice;
pub mod ssi;
pub mod ssl_settings;
pub mod static_file;
pub mod stub_status;
pub mod sub_filter;
pub mod try_files;
pub mod userid;
pub mod uwsgi;
pub mod zstd;

use crate::config::registry::{ctx, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::{HttpMain, LocConf};
use crate::http::phases::{AccessFn, Ctx, HeaderFilter, Step};

/// Every module's directive table. `UNSUPPORTED` is last: a real row for a
/// name shadows its placeholder.
pub const TABLES: &[&[Spec]] = &[
    index::DIRECTIVES,
    static_file::DIRECTIVES,
    access::DIRECTIVES,
    rewrite::DIRECTIVES,
    access_log::DIRECTIVES,
    autoindex::DIRECTIVES,
    charset::DIRECTIVES,
    gzip::DIRECTIVES,
    gzip_static::DIRECTIVES,
    compress_cache::DIRECTIVES,
    brotli::DIRECTIVES,
    zstd::DIRECTIVES,
    headers::DIRECTIVES,
    limit_conn::DIRECTIVES,
    limit_req::DIRECTIVES,
    map::DIRECTIVES,
    not_modified::DIRECTIVES,
    open_file_cache::DIRECTIVES,
    range::DIRECTIVES,
    stub_status::DIRECTIVES,
    try_files::DIRECTIVES,
    error_page::DIRECTIVES,
    proxy::DIRECTIVES,
    fastcgi::DIRECTIVES,
    scgi::DIRECTIVES,
    grpc::DIRECTIVES,
    uwsgi::DIRECTIVES,
    memcached::DIRECTIVES,
    crate::http::upstream::peers::DIRECTIVES,
    crate::http::body::DIRECTIVES,
    hash_sizes::DIRECTIVES,
    ssl_settings::DIRECTIVES,
    realip::DIRECTIVES,
    auth_basic::DIRECTIVES,
    auth_request::DIRECTIVES,
    geo::DIRECTIVES,
    sub_filter::DIRECTIVES,
    referer::DIRECTIVES,
    resolver::DIRECTIVES,
    empty_gif::DIRECTIVES,
    secure_link::DIRECTIVES,
    random_index::DIRECTIVES,
    dav::DIRECTIVES,
    flv::DIRECTIVES,
    mp4::DIRECTIVES,
    userid::DIRECTIVES,
    mirror::DIRECTIVES,
    addition::DIRECTIVES,
    slice::DIRECTIVES,
    ssi::DIRECTIVES,
    crate::http::v2::conf::DIRECTIVES,
    crate::http::v3::conf::DIRECTIVES,
    UNSUPPORTED,
];

/// Access-phase handlers in order (nginx's pre-access ones; then
/// [`access::phase`] runs allow/deny and auth_basic under `satisfy`).
pub const ACCESS: &[AccessFn] = &[limit_conn::access, limit_req::access];

/// Header filters in execution order (as nginx runs them).
pub const HEADER_FILTERS: &[HeaderFilter] = &[
    slice::header_filter,
    not_modified::header_filter,
    headers::header_filter,
    userid::header_filter,
    gzip_static::gunzip_header_filter,
    sub_filter::header_filter,
    charset::header_filter,
    brotli::header_filter,
    zstd::header_filter,
    gzip::header_filter,
    range::header_filter,
];

/// The content phase: try_files, then mirror (nginx's precontent phase,
/// in its order), then the location's content handler (the slot a `*_pass`
/// fills), then status pages,
/// then dav (PUT, DELETE, MKCOL, COPY, MOVE), then files.
pub async fn content(cx: &mut Ctx<'_>) -> Step {
    match try_files::run(cx).await {
        Step::Next => {}
        other => return other,
    }
    if let Some(step) = mirror::precontent(cx).await {
        return step;
    }
    // The location's content handler (its `*_pass`, nginx's clcf->handler).
    if let Some(handler) = cx.loc.content {
        let r = handler(cx).await;
        // An upstream's X-Accel-Redirect: the internal redirect instead.
        if let Some(step) = crate::http::upstream::response::accel_redirect(cx).await {
            return step;
        }
        return Step::done(r);
    }
    // `flv` is its location's content handler (it declines a directory).
    if let Some(step) = flv::content(cx).await {
        return step;
    }
    if let Some(step) = mp4::content(cx).await {
        return step;
    }
    if let Some(step) = stub_status::content(cx) {
        return step;
    }
    if let Some(step) = empty_gif::content(cx) {
        return step;
    }
    // nginx's dav handler runs before the static one (index, autoindex
    // and random_index decline these methods).
    if let Some(step) = dav::content(cx).await {
        return step;
    }
    static_file::handle(cx).await
}

/// The log phase.
pub fn log_phase(cx: &Ctx<'_>) {
    cx.logging.set(true);
    access_log::log(cx);
}

type VarFn = fn(&Ctx<'_>, u8, &mut Vec<u8>) -> bool;

/// Modules that provide variables: their names and evaluator.
const VAR_MODULES: &[(&[&str], VarFn)] = &[
    (limit_conn::VARS, limit_conn::var),
    (limit_req::VARS, limit_req::var),
    (gzip::VARS, gzip::var),
    (brotli::VARS, brotli::var),
    (zstd::VARS, zstd::var),
    (stub_status::VARS, stub_status::var),
    (crate::http::upstream::VARS, crate::http::upstream::var),
    (proxy::VARS, proxy::var),
    (fastcgi::VARS, fastcgi::var),
    (crate::http::body::VARS, crate::http::body::var),
    (auth_basic::VARS, auth_basic::var),
    (referer::VARS, referer::var),
    (secure_link::VARS, secure_link::var),
    (userid::VARS, userid::var),
    (rewrite::VARS, rewrite::limit_rate_var),
    (ssi::VARS, ssi::var_value),
    (access_log::VARS, access_log::var),
    (slice::VARS, slice::var),
];

/// The id of a module variable: module index and variable index.
pub fn module_var_by_name(name: &str) -> Option<u16> {
    for (m, (names, _)) in VAR_MODULES.iter().enumerate() {
        if let Some(i) = names.iter().position(|n| *n == name) {
            return Some(((m as u16) << 8) | i as u16);
        }
    }
    None
}

pub fn module_var(cx: &Ctx<'_>, id: u16, out: &mut Vec<u8>) -> bool {
    match VAR_MODULES.get((id >> 8) as usize) {
        Some((_, f)) => f(cx, (id & 0xff) as u8, out),
        None => false,
    }
}

/// The modules' location-level configuration.
#[derive(Debug, Clone, Default)]
pub struct ModLoc {
    pub index: index::IndexLoc,
    pub rewrite: rewrite::RewriteLoc,
    pub access_log: access_log::AccessLogLoc,
    pub autoindex: autoindex::AutoindexLoc,
    pub charset: charset::CharsetLoc,
    pub ssi: ssi::SsiLoc,
    pub gzip: gzip::GzipLoc,
    pub gzip_static: gzip_static::GzipStaticLoc,
    pub compress_cache: compress_cache::CompressCacheLoc,
    pub brotli: brotli::BrotliLoc,
    pub zstd: zstd::ZstdLoc,
    pub headers: headers::HeadersLoc,
    pub limit_conn: limit_conn::LimitConnLoc,
    pub limit_req: limit_req::LimitReqLoc,
    pub not_modified: not_modified::NotModifiedLoc,
    pub open_file_cache: open_file_cache::OpenFileCacheLoc,
    pub range: range::RangeLoc,
    pub stub_status: stub_status::StubStatusLoc,
    pub try_files: try_files::TryFilesLoc,
    pub access: access::AccessLoc,
    pub static_file: static_file::StaticLoc,
    pub error_page: error_page::ErrorPageLoc,
    pub proxy: proxy::ProxyLoc,
    pub fastcgi: fastcgi::FastcgiLoc,
    pub scgi: scgi::ScgiLoc,
    pub grpc: grpc::GrpcLoc,
    pub uwsgi: uwsgi::UwsgiLoc,
    pub memcached: memcached::MemcachedLoc,
    pub body: crate::http::body::BodyLoc,
    pub realip: realip::RealIpLoc,
    pub auth_basic: auth_basic::AuthBasicLoc,
    pub auth_request: auth_request::AuthRequestLoc,
    pub sub_filter: sub_filter::SubFilterLoc,
    pub referer: referer::RefererLoc,
    pub resolver: resolver::ResolverLoc,
    pub empty_gif: empty_gif::EmptyGifLoc,
    pub secure_link: secure_link::SecureLinkLoc,
    pub random_index: random_index::RandomIndexLoc,
    pub dav: dav::DavLoc,
    pub flv: flv::FlvLoc,
    pub mp4: mp4::Mp4Loc,
    pub userid: userid::UseridLoc,
    pub mirror: mirror::MirrorLoc,
    pub addition: addition::AdditionLoc,
    pub slice: slice::SliceLoc,
}

impl ModLoc {
    /// A nested location does not inherit its parent's `*_pass` (nginx's
    /// content handler belongs to its location; `if` and `limit_except`
    /// blocks keep it).
    pub fn drop_inherited_pass(&mut self) {
        self.proxy.pass = None;
        self.fastcgi.pass = None;
        self.scgi.pass = None;
        self.grpc.pass = None;
        self.uwsgi.pass = None;
        self.memcached.pass = None;
        self.flv.drop_inherited();
        self.mp4.drop_inherited();
    }

    /// The checks of a merged location (`PREFIX_cache` needs a key where
    /// the protocol has none of its own).
    pub fn check_merged(l: &LocConf) -> ConfResult<()> {
        use crate::http::upstream::conf::check_cache_key;
        check_cache_key(&l.modules.fastcgi.up, "fastcgi")?;
        check_cache_key(&l.modules.scgi.up, "scgi")?;
        check_cache_key(&l.modules.uwsgi.up, "uwsgi")
    }

    /// nginx's checks of the `PREFIX_ssl_*` settings of a merged location
    /// whose pass may use TLS, and its client certificate read
    /// ([`crate::http::upstream::ssl::check`]); one line per protocol
    /// that speaks TLS.
    pub fn check_ssl(l: &mut LocConf) -> ConfResult<()> {
        use crate::http::upstream::ssl::check;
        let on = l.modules.proxy.pass.as_ref().is_some_and(|p| p.tls);
        check(&mut l.modules.proxy.up.ssl, "proxy", on)?;
        let on = grpc::may_use_tls(l);
        check(&mut l.modules.grpc.up.ssl, "grpc", on)?;
        let on = uwsgi::may_use_tls(l);
        check(&mut l.modules.uwsgi.up.ssl, "uwsgi", on)
    }

    /// The `*_pass` modules' checks of a compiled location (`own`: its
    /// own configuration, `block`: its directives).
    pub fn check_pass(own: &LocConf, hm: &HttpMain, block: &[Directive]) -> ConfResult<()> {
        fastcgi::check_pass(own, hm, block)?;
        scgi::check_pass(own, hm, block)?;
        grpc::check_pass(own, hm, block)?;
        uwsgi::check_pass(own, hm, block)?;
        memcached::check_pass(own, hm, block)
    }

    pub fn merge(&mut self, p: &ModLoc) {
        self.index.merge(&p.index);
        self.sub_filter.merge(&p.sub_filter);
        self.referer.merge(&p.referer);
        self.resolver.merge(&p.resolver);
        self.rewrite.merge(&p.rewrite);
        self.access_log.merge(&p.access_log);
        self.autoindex.merge(&p.autoindex);
        self.charset.merge(&p.charset);
        self.gzip.merge(&p.gzip);
        self.gzip_static.merge(&p.gzip_static);
        self.compress_cache.merge(&p.compress_cache);
        self.brotli.merge(&p.brotli);
        self.zstd.merge(&p.zstd);
        self.headers.merge(&p.headers);
        self.limit_conn.merge(&p.limit_conn);
        self.limit_req.merge(&p.limit_req);
        self.not_modified.merge(&p.not_modified);
        self.open_file_cache.merge(&p.open_file_cache);
        self.range.merge(&p.range);
        self.stub_status.merge(&p.stub_status);
        self.try_files.merge(&p.try_files);
        self.access.merge(&p.access);
        self.realip.merge(&p.realip);
        self.static_file.merge(&p.static_file);
        self.error_page.merge(&p.error_page);
        self.proxy.merge(&p.proxy);
        self.fastcgi.merge(&p.fastcgi);
        self.scgi.merge(&p.scgi);
        self.grpc.merge(&p.grpc);
        self.uwsgi.merge(&p.uwsgi);
        self.memcached.merge(&p.memcached);
        self.body.merge(&p.body);
        self.auth_basic.merge(&p.auth_basic);
        self.secure_link.merge(&p.secure_link);
        self.random_index.merge(&p.random_index);
        self.dav.merge(&p.dav);
        self.flv.merge(&p.flv);
        self.mp4.merge(&p.mp4);
        self.userid.merge(&p.userid);
        self.auth_request.merge(&p.auth_request);
        self.mirror.merge(&p.mirror);
        self.addition.merge(&p.addition);
        self.slice.merge(&p.slice);
        self.ssi.merge(&p.ssi);
    }
    pub fn defaults(&mut self) {
        self.index.defaults();
    }
}

/// The modules' http-level state (formats, zones...).
#[derive(Debug, Clone, Default)]
pub struct ModMain {
    pub access_log: access_log::AccessLogMain,
    pub limit_conn: limit_conn::LimitConnMain,
    pub limit_req: limit_req::LimitReqMain,
    pub upstream: crate::http::upstream::peers::UpstreamMain,
    pub compress_cache: compress_cache::CompressCacheMain,
    pub charset: charset::CharsetMain,
}

/// A block directive inside `server` that a module owns (`if`).
pub fn srv_block(
    d: &Directive,
    cx: &mut Compiler,
    hm: &mut HttpMain,
    loc: &mut LocConf,
) -> ConfResult<()> {
    match d.name.as_str() {
        "if" => rewrite::compile_if(d, cx, hm, loc, true),
        _ => Err(ConfError::at(
            format!("\"{}\" directive is not supported by tern yet", d.name),
            d,
        )),
    }
}

/// A block directive inside `location` that a module owns (`if`, `limit_except`).
pub fn loc_block(
    d: &Directive,
    cx: &mut Compiler,
    hm: &mut HttpMain,
    loc: &mut LocConf,
) -> ConfResult<()> {
    match d.name.as_str() {
        "if" => rewrite::compile_if(d, cx, hm, loc, false),
        "limit_except" => access::compile_limit_except(d, cx, hm, loc),
        _ => Err(ConfError::at(
            format!("\"{}\" directive is not supported by tern yet", d.name),
            d,
        )),
    }
}

macro_rules! unsupported {
    ($($name:literal : $ctx:expr),* $(,)?) => {
        &[ $( Spec { name: $name, ctx: $ctx, args: Args::Any, set: Setter::Unsupported }, )* ]
    };
}

const H: u32 = ctx::HTTP;
const HSL: u32 = ctx::HSL | ctx::LIF | ctx::SIF;

/// nginx directives tern recognises but does not implement yet: a config
/// using one is refused at startup with a message naming it.
const UNSUPPORTED: &[Spec] = unsupported![
    "access_log": HSL | ctx::LMT, "log_format": H, "open_log_file_cache": ctx::HSL,
    "gzip": HSL, "gzip_types": ctx::HSL, "gzip_min_length": ctx::HSL, "gzip_comp_level": ctx::HSL,
    "gzip_proxied": ctx::HSL, "gzip_disable": ctx::HSL, "gzip_vary": ctx::HSL, "gzip_buffers": ctx::HSL,
    "gzip_http_version": ctx::HSL, "gzip_static": ctx::HSL, "gunzip": ctx::HSL,
    "limit_conn_zone": H, "limit_conn": ctx::HSL, "limit_conn_status": ctx::HSL, "limit_conn_log_level": ctx::HSL,
    "limit_conn_dry_run": ctx::HSL, "limit_req_zone": H, "limit_req": ctx::HSL, "limit_req_status": ctx::HSL,
    "limit_req_log_level": ctx::HSL, "limit_req_dry_run": ctx::HSL,
    "charset": HSL, "charset_types": ctx::HSL, "source_charset": ctx::HSL, "override_charset": HSL, "charset_map": H,
    "map": H, "split_clients": H, "geo": H,
    "grpc_pass": ctx::LOC | ctx::LIF,

    "autoindex": ctx::HSL,
    "autoindex_exact_size": ctx::HSL, "autoindex_localtime": ctx::HSL, "autoindex_format": ctx::HSL,
    "add_header": HSL, "add_trailer": HSL, "expires": HSL, "etag": ctx::HSL, "if_modified_since": ctx::HSL, "max_ranges": ctx::HSL,
    "limit_except": ctx::LOC, "disable_symlinks": ctx::HSL, "log_not_found": ctx::HSL,
    "stub_status": ctx::SRV | ctx::LOC,
    "satisfy": ctx::HSL, "allow": HSL | ctx::LMT, "deny": HSL | ctx::LMT, "auth_basic": HSL | ctx::LMT,
    "auth_basic_user_file": HSL | ctx::LMT,
];
