//! [`UpstreamConf`]: the settings every `*_pass` module shares (nginx's
//! `ngx_http_upstream_conf_t`), their merge, their defaults ([`Limits`]),
//! and their directive setters.
//!
//! A protocol module embeds one `UpstreamConf` in its location slice and
//! names it through a [`Slot`]; [`upstream_directives!`] then writes the
//! module's whole table of shared rows (`PREFIX_connect_timeout`,
//! `PREFIX_buffers`, `PREFIX_cache*`, `PREFIX_next_upstream`...) with
//! these setters instantiated for that slot. A setter tells the rows of
//! one kind apart by the name after the prefix (`connect_timeout` vs
//! `read_timeout`), as nginx's slot setters do by offset.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::cache;
use crate::config::registry::{arg, flag, set_once};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::{merge_opts, HttpMain, LocConf};
use crate::http::vars::Template;

/// `PREFIX_cache`.
#[derive(Debug, Clone)]
pub enum CacheSel {
    Off,
    Zone(String),
    Var(Template),
}

/// `PREFIX_cache_valid` entry: status (None = any) and seconds.
pub type Valid = (Option<u16>, u64);

pub const M_GET: u8 = 1;
pub const M_HEAD: u8 = 2;
pub const M_POST: u8 = 4;

pub const IGN_X_ACCEL_EXPIRES: u16 = 1;
pub const IGN_EXPIRES: u16 = 2;
pub const IGN_CACHE_CONTROL: u16 = 4;
pub const IGN_SET_COOKIE: u16 = 8;
pub const IGN_VARY: u16 = 16;
pub const IGN_X_ACCEL_BUFFERING: u16 = 32;
pub const IGN_X_ACCEL_CHARSET: u16 = 64;
pub const IGN_X_ACCEL_LIMIT_RATE: u16 = 128;
pub const IGN_X_ACCEL_REDIRECT: u16 = 256;

/// Where `PREFIX_store` puts a file.
#[derive(Debug, Clone)]
pub enum StoreTo {
    /// `on`: root (or alias) + URI, as a static file would be found.
    Root,
    Path(Template),
}

/// `PREFIX_bind` address: literal or with variables.
#[derive(Debug, Clone)]
pub enum BindAddr {
    Fixed(std::net::SocketAddr),
    Var(Template),
}

/// The shared upstream settings of one location level.
#[derive(Debug, Clone, Default)]
pub struct UpstreamConf {
    /// `PREFIX_cache_purge ZONE KEY`: this location purges (not inherited).
    pub purge: Option<std::sync::Arc<super::purge::Purge>>,
    pub connect_timeout: Option<u64>,
    pub read_timeout: Option<u64>,
    pub send_timeout: Option<u64>,
    pub buffering: Option<bool>,
    pub buffers: Option<(usize, usize)>,
    pub buffer_size: Option<usize>,
    /// `PREFIX_max_temp_file_size` (0: no temp files).
    pub max_temp_file_size: Option<u64>,
    /// `PREFIX_temp_file_write_size`: checked; tern writes each piece of
    /// the body to the temp file as it arrives.
    pub temp_file_write_size: Option<u64>,
    pub temp_path: Option<PathBuf>,
    pub cache: Option<CacheSel>,
    pub cache_key: Option<Template>,
    pub cache_valid: Option<Arc<Vec<Valid>>>,
    pub cache_methods: Option<u8>,
    pub cache_bypass: Option<Arc<Vec<Template>>>,
    pub no_cache: Option<Arc<Vec<Template>>>,
    pub intercept_errors: Option<bool>,
    pub pass_request_headers: Option<bool>,
    pub hide: Option<Arc<Vec<String>>>,
    pub pass_headers: Option<Arc<Vec<String>>>,
    pub ignore_headers: Option<u16>,
    pub pass_request_body: Option<bool>,
    /// `PREFIX_request_buffering`: `off` sends the body as it arrives
    /// (`run::begin_body`); gRPC's body is always read whole.
    pub request_buffering: Option<bool>,
    /// `PREFIX_force_ranges`: byte ranges on responses that do not come
    /// from the cache.
    pub force_ranges: Option<bool>,
    /// `PREFIX_next_upstream`: the [`ft`] cases that move to the next peer.
    pub next_upstream: Option<u16>,
    /// `PREFIX_next_upstream_tries` (0: as many as there are peers).
    pub next_upstream_tries: Option<u64>,
    /// `PREFIX_next_upstream_timeout` in ms (0: no limit).
    pub next_upstream_timeout: Option<u64>,
    /// `PREFIX_cache_use_stale`: the [`ft`] cases (and [`ft::UPDATING`])
    /// in which an expired entry is served.
    pub cache_use_stale: Option<u16>,
    pub cache_background_update: Option<bool>,
    pub cache_lock: Option<bool>,
    /// `PREFIX_cache_lock_timeout` and `_age`, ms.
    pub cache_lock_timeout: Option<u64>,
    pub cache_lock_age: Option<u64>,
    pub cache_revalidate: Option<bool>,
    /// `proxy_cache_convert_head` (only proxy has the directive; the
    /// default is the protocol's, see `Protocol::convert_head`).
    pub cache_convert_head: Option<bool>,
    pub cache_min_uses: Option<u64>,
    /// `PREFIX_cache_max_range_offset`: a range request starting at or
    /// beyond it is not cached (its Range goes upstream).
    pub cache_max_range_offset: Option<u64>,
    /// `PREFIX_ignore_client_abort`: `on` keeps reading the upstream's
    /// body after the client hung up (see `Response::watch_client`).
    pub ignore_client_abort: Option<bool>,
    /// `PREFIX_bind` (None inside: `off`).
    pub bind: Option<Option<BindAddr>>,
    pub socket_keepalive: Option<bool>,
    /// `PREFIX_limit_rate`, bytes per second (0: unlimited); with
    /// variables (nginx 1.27's), evaluated once the head is in, so
    /// `$upstream_http_*` may set it.
    pub limit_rate: Option<crate::http::conf::SizeValue>,
    /// `PREFIX_store` (None inside: `off`).
    pub store: Option<Option<StoreTo>>,
    /// `PREFIX_store_access` as a file mode.
    pub store_access: Option<u32>,
    /// `PREFIX_ssl_*` (for the protocols that speak TLS; see `ssl.rs`).
    pub ssl: super::ssl::SslConf,
}

impl UpstreamConf {
    pub fn merge(&mut self, p: &UpstreamConf) {
        merge_opts!(self, p; connect_timeout, read_timeout,
            send_timeout, buffering, buffers, buffer_size, max_temp_file_size, temp_file_write_size,
            temp_path, cache, cache_key, cache_valid, cache_methods, cache_bypass, no_cache,
            intercept_errors, pass_request_headers, hide, pass_headers, ignore_headers,
            pass_request_body, request_buffering, force_ranges, next_upstream, next_upstream_tries,
            next_upstream_timeout, cache_use_stale, cache_background_update,
            cache_lock, cache_lock_timeout, cache_lock_age, cache_revalidate, cache_convert_head,
            cache_min_uses, cache_max_range_offset, ignore_client_abort, bind, socket_keepalive, limit_rate, store,
            store_access);
        self.ssl.merge(&p.ssl);
    }

    /// Whether a cache is configured (`PREFIX_cache ZONE`).
    pub fn caches(&self) -> bool {
        self.cache
            .as_ref()
            .is_some_and(|c| !matches!(c, CacheSel::Off))
    }
}

/// nginx's refusal of `PREFIX_cache` without `PREFIX_cache_key` (for the
/// modules with no built-in key), checked on the merged location.
pub fn check_cache_key(c: &UpstreamConf, prefix: &str) -> ConfResult<()> {
    if c.caches() && c.cache_key.is_none() {
        return Err(ConfError::new(format!(
            "no \"{}_cache_key\" for \"{}_cache\"",
            prefix, prefix
        )));
    }
    Ok(())
}

/// nginx's `PREFIX_next_upstream` cases (its NGX_HTTP_UPSTREAM_FT_* bits).
pub mod ft {
    pub const ERROR: u16 = 1 << 1;
    pub const TIMEOUT: u16 = 1 << 2;
    pub const INVALID_HEADER: u16 = 1 << 3;
    pub const HTTP_500: u16 = 1 << 4;
    pub const HTTP_502: u16 = 1 << 5;
    pub const HTTP_503: u16 = 1 << 6;
    pub const HTTP_504: u16 = 1 << 7;
    pub const HTTP_403: u16 = 1 << 8;
    pub const HTTP_404: u16 = 1 << 9;
    pub const HTTP_429: u16 = 1 << 10;
    pub const NON_IDEMPOTENT: u16 = 1 << 11;
    /// `PREFIX_cache_use_stale updating` (not a `next_upstream` case).
    pub const UPDATING: u16 = 1 << 12;
    /// The default: `error timeout`.
    pub const DEFAULT: u16 = ERROR | TIMEOUT;

    pub const NAMES: &[(&str, u16)] = &[
        ("error", ERROR),
        ("timeout", TIMEOUT),
        ("invalid_header", INVALID_HEADER),
        ("http_500", HTTP_500),
        ("http_502", HTTP_502),
        ("http_503", HTTP_503),
        ("http_504", HTTP_504),
        ("http_403", HTTP_403),
        ("http_404", HTTP_404),
        ("http_429", HTTP_429),
        ("non_idempotent", NON_IDEMPOTENT),
        ("off", 0),
    ];

    /// `memcached_next_upstream`'s cases (nginx names two differently).
    pub const MEMCACHED_NAMES: &[(&str, u16)] = &[
        ("error", ERROR),
        ("timeout", TIMEOUT),
        ("invalid_response", INVALID_HEADER),
        ("not_found", HTTP_404),
        ("off", 0),
    ];

    pub const STALE_NAMES: &[(&str, u16)] = &[
        ("error", ERROR),
        ("timeout", TIMEOUT),
        ("invalid_header", INVALID_HEADER),
        ("updating", UPDATING),
        ("http_500", HTTP_500),
        ("http_502", HTTP_502),
        ("http_503", HTTP_503),
        ("http_504", HTTP_504),
        ("http_403", HTTP_403),
        ("http_404", HTTP_404),
        ("http_429", HTTP_429),
        ("off", 0),
    ];

    /// The case an upstream's response status is, if it is one.
    pub fn of_status(status: u16) -> Option<u16> {
        Some(match status {
            500 => HTTP_500,
            502 => HTTP_502,
            503 => HTTP_503,
            504 => HTTP_504,
            403 => HTTP_403,
            404 => HTTP_404,
            429 => HTTP_429,
            _ => return None,
        })
    }
}

/// How long each phase may wait, and the buffer limits.
#[derive(Clone)]
pub struct Limits {
    pub connect: Duration,
    pub send: Duration,
    pub read: Duration,
    pub head_max: usize,
    /// In-memory budget for a body on its way to the client: PREFIX_buffers
    /// in all (PREFIX_buffer_size when not buffering).
    pub mem_max: usize,
    /// PREFIX_max_temp_file_size (0: no temp file).
    pub temp_max: u64,
    /// PREFIX_next_upstream and its limits.
    pub next_mask: u16,
    pub next_tries: u64,
    pub next_timeout: Option<Duration>,
    /// TLS to the upstream: the client configuration and the upstream's name.
    pub tls: Option<super::ssl::Tls>,
}

impl Limits {
    /// The settings of `conf` (nginx's defaults where unset).
    pub fn of(conf: &UpstreamConf) -> Limits {
        Limits {
            connect: Duration::from_millis(conf.connect_timeout.unwrap_or(60_000)),
            send: Duration::from_millis(conf.send_timeout.unwrap_or(60_000)),
            read: Duration::from_millis(conf.read_timeout.unwrap_or(60_000)),
            head_max: conf.buffer_size.unwrap_or(4096).max(1024),
            mem_max: conf.buffers.map_or(8 * 4096, |(n, s)| n.saturating_mul(s)),
            temp_max: conf.max_temp_file_size.unwrap_or(1024 * 1024 * 1024),
            next_mask: conf.next_upstream.unwrap_or(ft::DEFAULT),
            next_tries: conf.next_upstream_tries.unwrap_or(0),
            next_timeout: conf
                .next_upstream_timeout
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis),
            tls: None,
        }
    }
}

// ---- the shared setters -----------------------------------------------------

/// Where a protocol module keeps its [`UpstreamConf`] in a location.
pub trait Slot {
    fn conf(l: &mut LocConf) -> &mut UpstreamConf;
    fn get(l: &LocConf) -> &UpstreamConf;
}

/// The shared rows of a `*_pass` module's directive table, with the
/// module's own rows first: `upstream_directives!(Slot, "prefix", [rows])`;
/// with `tls` after the prefix, the `PREFIX_ssl_*` rows too
/// (`upstream_directives!(Slot, "prefix", tls, [rows])`, see `ssl.rs`).
/// The rows of a module whose answers are neither buffered to disk nor
/// cached (memcached): `upstream_directives_core!(Slot, "prefix", [rows])`.
#[macro_export]
macro_rules! upstream_directives_core {
    ($slot:ty, $p:literal, tls, [$($own:expr),* $(,)?]) => {
        $crate::upstream_ssl_directives!(upstream_directives_core, $slot, $p, [$($own),*])
    };
    ($slot:ty, $p:literal, [$($own:expr),* $(,)?]) => {{
        use $crate::config::registry::{ctx, Args, Setter, Spec};
        use $crate::http::upstream::conf as c;
        const fn __up_row(
            name: &'static str,
            args: Args,
            f: fn(&mut $crate::http::conf::LocConf, &$crate::config::Directive, &mut $crate::core::conf::Compiler) -> $crate::config::ConfResult<()>,
        ) -> Spec {
            Spec { name, ctx: ctx::HSL, args, set: Setter::Loc(f) }
        }
        &[
            $($own,)*
            __up_row(concat!($p, "_connect_timeout"), Args::take(1), c::set_timeout::<$slot>),
            __up_row(concat!($p, "_send_timeout"), Args::take(1), c::set_timeout::<$slot>),
            __up_row(concat!($p, "_read_timeout"), Args::take(1), c::set_timeout::<$slot>),
            __up_row(concat!($p, "_next_upstream"), Args::AtLeast(1), c::set_next_upstream::<$slot>),
            __up_row(concat!($p, "_next_upstream_tries"), Args::take(1), c::set_next_upstream_tries::<$slot>),
            __up_row(concat!($p, "_next_upstream_timeout"), Args::take(1), c::set_timeout::<$slot>),
            __up_row(concat!($p, "_buffer_size"), Args::take(1), c::set_size::<$slot>),
            __up_row(concat!($p, "_bind"), Args::take12(), c::set_bind::<$slot>),
            __up_row(concat!($p, "_socket_keepalive"), Args::Flag, c::set_flag::<$slot>),
        ]
    }};
}

#[macro_export]
macro_rules! upstream_directives {
    ($slot:ty, $p:literal, tls, [$($own:expr),* $(,)?]) => {
        $crate::upstream_ssl_directives!(upstream_directives, $slot, $p, [$($own),*])
    };
    ($slot:ty, $p:literal, [$($own:expr),* $(,)?]) => {{
        use $crate::config::registry::{ctx, Args, Setter, Spec};
        use $crate::http::upstream::conf as c;
        const fn __up_row(
            name: &'static str,
            args: Args,
            f: fn(&mut $crate::http::conf::LocConf, &$crate::config::Directive, &mut $crate::core::conf::Compiler) -> $crate::config::ConfResult<()>,
        ) -> Spec {
            Spec { name, ctx: ctx::HSL, args, set: Setter::Loc(f) }
        }
        &[
            $($own,)*
            __up_row(concat!($p, "_connect_timeout"), Args::take(1), c::set_timeout::<$slot>),
            __up_row(concat!($p, "_send_timeout"), Args::take(1), c::set_timeout::<$slot>),
            __up_row(concat!($p, "_read_timeout"), Args::take(1), c::set_timeout::<$slot>),
            __up_row(concat!($p, "_next_upstream"), Args::AtLeast(1), c::set_next_upstream::<$slot>),
            __up_row(concat!($p, "_next_upstream_tries"), Args::take(1), c::set_next_upstream_tries::<$slot>),
            __up_row(concat!($p, "_next_upstream_timeout"), Args::take(1), c::set_timeout::<$slot>),
            __up_row(concat!($p, "_buffering"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_request_buffering"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_intercept_errors"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_pass_request_headers"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_pass_request_body"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_force_ranges"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_ignore_client_abort"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_socket_keepalive"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_buffers"), Args::take(2), c::set_buffers::<$slot>),
            __up_row(concat!($p, "_buffer_size"), Args::take(1), c::set_size::<$slot>),
            __up_row(concat!($p, "_busy_buffers_size"), Args::take(1), c::set_size::<$slot>),
            __up_row(concat!($p, "_max_temp_file_size"), Args::take(1), c::set_size::<$slot>),
            __up_row(concat!($p, "_temp_file_write_size"), Args::take(1), c::set_size::<$slot>),
            __up_row(concat!($p, "_limit_rate"), Args::take(1), c::set_limit_rate::<$slot>),
            __up_row(concat!($p, "_temp_path"), Args::take1234(), c::set_temp_path::<$slot>),
            __up_row(concat!($p, "_hide_header"), Args::take(1), c::set_hide_pass::<$slot>),
            __up_row(concat!($p, "_pass_header"), Args::take(1), c::set_hide_pass::<$slot>),
            __up_row(concat!($p, "_ignore_headers"), Args::AtLeast(1), c::set_ignore_headers::<$slot>),
            __up_row(concat!($p, "_bind"), Args::take12(), c::set_bind::<$slot>),
            __up_row(concat!($p, "_store"), Args::take(1), c::set_store::<$slot>),
            __up_row(concat!($p, "_store_access"), Args::take123(), c::set_store_access::<$slot>),
            __up_row(concat!($p, "_cache"), Args::take(1), c::set_cache::<$slot>),
            __up_row(concat!($p, "_cache_key"), Args::take(1), c::set_cache_key::<$slot>),
            __up_row(concat!($p, "_cache_valid"), Args::AtLeast(1), c::set_cache_valid::<$slot>),
            __up_row(concat!($p, "_cache_methods"), Args::AtLeast(1), c::set_cache_methods::<$slot>),
            __up_row(concat!($p, "_cache_use_stale"), Args::AtLeast(1), c::set_cache_use_stale::<$slot>),
            __up_row(concat!($p, "_cache_background_update"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_cache_lock"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_cache_lock_timeout"), Args::take(1), c::set_timeout::<$slot>),
            __up_row(concat!($p, "_cache_lock_age"), Args::take(1), c::set_timeout::<$slot>),
            __up_row(concat!($p, "_cache_revalidate"), Args::Flag, c::set_flag::<$slot>),
            __up_row(concat!($p, "_cache_min_uses"), Args::take(1), c::set_cache_min_uses::<$slot>),
            __up_row(concat!($p, "_cache_max_range_offset"), Args::take(1), c::set_cache_max_range_offset::<$slot>),
            __up_row(concat!($p, "_cache_bypass"), Args::AtLeast(1), c::set_predicates::<$slot>),
            __up_row(concat!($p, "_no_cache"), Args::AtLeast(1), c::set_predicates::<$slot>),
            __up_row(concat!($p, "_cache_purge"), Args::AtLeast(1), $crate::http::upstream::purge::set_purge::<$slot>),
            Spec {
                name: concat!($p, "_cache_path"),
                ctx: ctx::HTTP,
                args: Args::AtLeast(2),
                set: Setter::HttpMain(c::set_cache_path),
            },
        ]
    }};
}

/// A directive's name without its module prefix (`proxy_`, `fastcgi_`).
fn suffix(d: &Directive) -> &str {
    d.name.split_once('_').map_or("", |(_, s)| s)
}

/// The module prefix of a directive's name (`proxy`, `fastcgi`).
fn prefix(d: &Directive) -> &str {
    d.name.split_once('_').map_or("", |(p, _)| p)
}

pub fn set_timeout<S: Slot>(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let ms = value::time_ms(arg(d, 0)).ok_or_else(|| crate::config::registry::slot_invalid(d))?;
    let p = S::conf(l);
    let slot = match suffix(d) {
        "connect_timeout" => &mut p.connect_timeout,
        "read_timeout" => &mut p.read_timeout,
        "next_upstream_timeout" => &mut p.next_upstream_timeout,
        "cache_lock_timeout" => &mut p.cache_lock_timeout,
        "cache_lock_age" => &mut p.cache_lock_age,
        _ => &mut p.send_timeout,
    };
    set_once(slot, ms, d)
}

/// `PREFIX_next_upstream CASE...`: nginx's bitmask slot (`off` wins over
/// the rest; a repeated case is a warning).
pub fn set_next_upstream<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    let names = if prefix(d) == "memcached" {
        ft::MEMCACHED_NAMES
    } else {
        ft::NAMES
    };
    let mask = ft_mask(d, cx, names)?;
    set_once(&mut S::conf(l).next_upstream, mask, d)
}

/// `PREFIX_cache_use_stale CASE...`: the same bitmask as
/// `PREFIX_next_upstream`, with `updating` instead of `non_idempotent`.
pub fn set_cache_use_stale<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    let mask = ft_mask(d, cx, ft::STALE_NAMES)?;
    set_once(&mut S::conf(l).cache_use_stale, mask, d)
}

/// `PREFIX_store on | off | PATH`: incompatible with `PREFIX_cache` in the
/// same block, as nginx.
pub fn set_store<S: Slot>(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let a = arg(d, 0);
    let v = match a {
        "off" => None,
        "on" => Some(StoreTo::Root),
        // A relative path is under the prefix, as nginx's.
        _ if a.starts_with('$') => Some(StoreTo::Path(cx.template(a, d)?)),
        _ => {
            let p = cx.path(a);
            Some(StoreTo::Path(cx.template(&p.to_string_lossy(), d)?))
        }
    };
    let c = S::conf(l);
    if c.store.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    if v.is_some() && c.caches() {
        let p = prefix(d);
        return Err(ConfError::at(
            format!(
                "\"{}_store\" directive is incompatible with \"{}_cache\"",
                p, p
            ),
            d,
        ));
    }
    c.store = Some(v);
    Ok(())
}

/// `PREFIX_store_access [user:r|rw] [group:r|rw] [all:r|rw]` (the user
/// keeps rw unless `user:` says otherwise).
pub fn set_store_access<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    set_once(&mut S::conf(l).store_access, access_mode(d)?, d)
}

/// nginx's access slot (`PREFIX_store_access`, `dav_access`):
/// `user:rw|r group:rw|r all:rw|r`, user `rw` unless given.
pub fn access_mode(d: &Directive) -> ConfResult<u32> {
    let mut mode = 0u32;
    let mut user = 0o600;
    for a in d.args.iter().map(|a| a.value.as_str()) {
        let bad = || ConfError::at(format!("invalid value \"{}\"", a), d);
        let (shift, rights) = if let Some(r) = a.strip_prefix("user:") {
            user = 0;
            (6, r)
        } else if let Some(r) = a.strip_prefix("group:") {
            (3, r)
        } else if let Some(r) = a.strip_prefix("all:") {
            (0, r)
        } else {
            return Err(bad());
        };
        let bits = match rights {
            "rw" => 6,
            "r" => 4,
            _ => return Err(bad()),
        };
        mode |= bits << shift;
    }
    Ok(mode | user)
}

/// `PREFIX_bind ADDRESS [transparent] | off`.
pub fn set_bind<S: Slot>(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let a = arg(d, 0);
    if d.args.len() == 2 {
        if arg(d, 1) != "transparent" {
            return Err(ConfError::at(
                format!("invalid parameter \"{}\"", arg(d, 1)),
                d,
            ));
        }
        return Err(ConfError::at(
            format!("{} transparent is not supported by tern yet", d.name),
            d,
        ));
    }
    let v = if a == "off" {
        None
    } else if a.contains('$') {
        Some(BindAddr::Var(cx.template(a, d)?))
    } else {
        Some(BindAddr::Fixed(parse_bind(a).ok_or_else(|| {
            ConfError::at(format!("invalid address \"{}\"", a), d)
        })?))
    };
    set_once(&mut S::conf(l).bind, v, d)
}

/// A local address for `PREFIX_bind`: an IP (IPv6 in brackets or not),
/// with a port or not (nginx's ngx_parse_addr_port; port 0: any).
pub fn parse_bind(a: &str) -> Option<std::net::SocketAddr> {
    if let Ok(sa) = a.parse() {
        return Some(sa);
    }
    let ip = a
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    Some(std::net::SocketAddr::new(ip, 0))
}

pub fn set_cache_min_uses<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let n = crate::config::registry::num_arg(d, 0)?;
    set_once(&mut S::conf(l).cache_min_uses, n, d)
}

pub fn set_cache_max_range_offset<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let n = crate::config::registry::offset_arg(d, 0)?;
    set_once(&mut S::conf(l).cache_max_range_offset, n, d)
}

/// Whether the request's Range makes it uncacheable by
/// `PREFIX_cache_max_range_offset`, as nginx's check: `0` refuses any
/// Range; otherwise a suffix range (`bytes=-N`) or a first range that
/// starts at or beyond the offset.
pub fn range_beyond(conf: &UpstreamConf, range: Option<&[u8]>) -> bool {
    let (Some(max), Some(h)) = (conf.cache_max_range_offset, range) else {
        return false;
    };
    if max == 0 {
        return true;
    }
    if h.len() < 7 || !h[..6].eq_ignore_ascii_case(b"bytes=") {
        return false;
    }
    let p = h[6..].trim_ascii_start();
    if p.starts_with(b"-") {
        return true;
    }
    let digits = p.iter().take_while(|c| c.is_ascii_digit()).count();
    let offset = std::str::from_utf8(&p[..digits])
        .ok()
        .and_then(|d| d.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    offset >= max
}

/// nginx's bitmask slot over `names` (`off` wins over the rest; a
/// repeated case is a warning).
fn ft_mask(d: &Directive, cx: &mut Compiler, names: &[(&str, u16)]) -> ConfResult<u16> {
    let mut mask = 0u16;
    let mut off = false;
    let mut seen: Vec<&str> = Vec::new();
    for a in &d.args {
        let v = a.value.as_str();
        let Some((_, bit)) = names.iter().find(|(n, _)| *n == v) else {
            return Err(ConfError::at(format!("invalid value \"{}\"", v), d));
        };
        if seen.contains(&v) {
            cx.warnings
                .push(ConfError::at(format!("duplicate value \"{}\"", v), d).to_string());
        }
        seen.push(v);
        off |= v == "off";
        mask |= bit;
    }
    Ok(if off { 0 } else { mask })
}

pub fn set_next_upstream_tries<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let n =
        value::number(arg(d, 0)).ok_or_else(|| crate::config::registry::slot_invalid_number(d))?;
    set_once(&mut S::conf(l).next_upstream_tries, n, d)
}

pub fn set_flag<S: Slot>(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    let p = S::conf(l);
    let slot = match suffix(d) {
        "buffering" => &mut p.buffering,
        "intercept_errors" => &mut p.intercept_errors,
        "pass_request_body" => &mut p.pass_request_body,
        "request_buffering" => &mut p.request_buffering,
        "force_ranges" => &mut p.force_ranges,
        "cache_background_update" => &mut p.cache_background_update,
        "cache_lock" => &mut p.cache_lock,
        "cache_revalidate" => &mut p.cache_revalidate,
        "cache_convert_head" => &mut p.cache_convert_head,
        "ignore_client_abort" => &mut p.ignore_client_abort,
        "socket_keepalive" => &mut p.socket_keepalive,
        _ => &mut p.pass_request_headers,
    };
    set_once(slot, v, d)
}

pub fn set_buffers<S: Slot>(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = value::number(arg(d, 0))
        .filter(|n| *n > 0)
        .ok_or_else(|| crate::config::registry::slot_invalid(d))? as usize;
    let s = value::size(arg(d, 1))
        .filter(|n| *n > 0)
        .ok_or_else(|| crate::config::registry::slot_invalid(d))? as usize;
    set_once(&mut S::conf(l).buffers, (n, s), d)
}

pub fn set_size<S: Slot>(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let s = value::size(arg(d, 0)).ok_or_else(|| crate::config::registry::slot_invalid(d))?;
    let p = S::conf(l);
    match suffix(d) {
        "buffer_size" => set_once(&mut p.buffer_size, s as usize, d),
        "max_temp_file_size" => set_once(&mut p.max_temp_file_size, s, d),
        "temp_file_write_size" => set_once(&mut p.temp_file_write_size, s, d),
        // PREFIX_busy_buffers_size: nginx's share of the buffers that may
        // be on their way to the client; tern's pieces are handed over whole.
        _ => Ok(()),
    }
}

pub fn set_limit_rate<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    use crate::http::conf::SizeValue;
    let t = cx.template(arg(d, 0), d)?;
    let v = if t.has_vars() {
        SizeValue::Vars(t)
    } else {
        SizeValue::Fixed(
            value::size(arg(d, 0)).ok_or_else(|| crate::config::registry::slot_invalid(d))?,
        )
    };
    set_once(&mut S::conf(l).limit_rate, v, d)
}

/// `PREFIX_limit_rate` for a request (`None`: a background cache update,
/// where a value with variables counts as none). A value that is not a
/// size is logged and counts as none.
pub fn limit_rate(conf: &UpstreamConf, cx: Option<&crate::http::phases::Ctx<'_>>) -> u64 {
    use crate::http::conf::SizeValue;
    match (&conf.limit_rate, cx) {
        (None, _) => 0,
        (Some(SizeValue::Fixed(n)), _) => *n,
        (Some(SizeValue::Vars(_)), None) => 0,
        (Some(SizeValue::Vars(t)), Some(cx)) => {
            let v = t.render_vec(cx);
            match std::str::from_utf8(&v).ok().and_then(value::size) {
                Some(n) => n,
                None => {
                    cx.log(
                        crate::core::log::Level::Error,
                        &format!("invalid size \"{}\"", String::from_utf8_lossy(&v)),
                    );
                    0
                }
            }
        }
    }
}

pub fn set_temp_path<S: Slot>(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    // Checked as nginx does, then unused: temp files are unlinked as soon
    // as they are created, so no directory tree of them ever builds up
    // that levels would spread out (DIFFERENCES.md).
    crate::http::body::temp_levels(d)?;
    let p = cx.path(arg(d, 0));
    cache::allow_dir(&p);
    set_once(&mut S::conf(l).temp_path, p, d)
}

pub fn set_cache<S: Slot>(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let a = arg(d, 0);
    if a != "off" && S::conf(l).store.as_ref().is_some_and(|s| s.is_some()) {
        let p = prefix(d);
        return Err(ConfError::at(
            format!(
                "\"{}_cache\" directive is incompatible with \"{}_store\"",
                p, p
            ),
            d,
        ));
    }
    let sel = if a == "off" {
        CacheSel::Off
    } else if a.contains('$') {
        CacheSel::Var(cx.template(a, d)?)
    } else {
        CacheSel::Zone(a.to_string())
    };
    set_once(&mut S::conf(l).cache, sel, d)
}

pub fn set_cache_key<S: Slot>(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let t = cx.template(arg(d, 0), d)?;
    set_once(&mut S::conf(l).cache_key, t, d)
}

pub fn set_cache_valid<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let n = d.args.len();
    let time = arg(d, n - 1);
    let secs = value::time_secs(time)
        .ok_or_else(|| ConfError::at(format!("invalid time value \"{}\"", time), d))?;
    let list = S::conf(l).cache_valid.get_or_insert_with(Default::default);
    let list = Arc::make_mut(list);
    if n == 1 {
        for c in [200, 301, 302] {
            list.push((Some(c), secs));
        }
        return Ok(());
    }
    for a in d.args[..n - 1].iter().map(|a| a.value.as_str()) {
        if a == "any" {
            list.push((None, secs));
            continue;
        }
        let code = a
            .parse::<u16>()
            .ok()
            .filter(|c| (100..=599).contains(c))
            .ok_or_else(|| ConfError::at(format!("invalid status \"{}\"", a), d))?;
        list.push((Some(code), secs));
    }
    Ok(())
}

pub fn set_cache_methods<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    // GET and HEAD are always cacheable, as in nginx.
    let mut m = M_GET | M_HEAD;
    for a in d.args.iter().map(|a| a.value.as_str()) {
        m |= match a {
            "GET" => M_GET,
            "HEAD" => M_HEAD,
            "POST" => M_POST,
            _ => return Err(crate::config::registry::invalid_value(d, a)),
        };
    }
    set_once(&mut S::conf(l).cache_methods, m, d)
}

pub fn set_predicates<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    let mut v = Vec::new();
    for a in d.args.iter() {
        v.push(cx.template(&a.value, d)?);
    }
    let p = S::conf(l);
    let slot = if suffix(d) == "cache_bypass" {
        &mut p.cache_bypass
    } else {
        &mut p.no_cache
    };
    Arc::make_mut(slot.get_or_insert_with(Default::default)).extend(v);
    Ok(())
}

pub fn set_hide_pass<S: Slot>(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let p = S::conf(l);
    let slot = if suffix(d) == "hide_header" {
        &mut p.hide
    } else {
        &mut p.pass_headers
    };
    Arc::make_mut(slot.get_or_insert_with(Default::default)).push(arg(d, 0).to_ascii_lowercase());
    Ok(())
}

pub fn set_ignore_headers<S: Slot>(
    l: &mut LocConf,
    d: &Directive,
    _: &mut Compiler,
) -> ConfResult<()> {
    let mut m = 0;
    for a in d.args.iter().map(|a| a.value.as_str()) {
        m |= match a.to_ascii_lowercase().as_str() {
            "x-accel-expires" => IGN_X_ACCEL_EXPIRES,
            "expires" => IGN_EXPIRES,
            "cache-control" => IGN_CACHE_CONTROL,
            "set-cookie" => IGN_SET_COOKIE,
            "vary" => IGN_VARY,
            "x-accel-buffering" => IGN_X_ACCEL_BUFFERING,
            "x-accel-charset" => IGN_X_ACCEL_CHARSET,
            "x-accel-limit-rate" => IGN_X_ACCEL_LIMIT_RATE,
            "x-accel-redirect" => IGN_X_ACCEL_REDIRECT,
            _ => return Err(crate::config::registry::invalid_value(d, a)),
        };
    }
    // nginx's bitmask slot: a second line adds to the first (no
    // "is duplicate").
    let slot = &mut S::conf(l).ignore_headers;
    *slot = Some(slot.unwrap_or(0) | m);
    Ok(())
}

/// `PREFIX_cache_path PATH [levels=] keys_zone=NAME:SIZE [inactive=]
/// [max_size=] [min_free=] [use_temp_path=] [loader_*= manager_*=]`.
/// The zones of all modules share one namespace.
pub fn set_cache_path(hm: &mut HttpMain, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let path = cx.path(arg(d, 0));
    let mut levels = Vec::new();
    let mut zone: Option<(String, usize)> = None;
    let mut max_size = None;
    let mut min_free = 0;
    let mut inactive = 600;
    let mut pacing = cache::Pacing::default();
    let bad = |a: &str| ConfError::at(format!("invalid parameter \"{}\"", a), d);
    for a in d.args.iter().skip(1).map(|a| a.value.as_str()) {
        if let Some(v) = a.strip_prefix("levels=") {
            for part in v.split(':') {
                match part {
                    "1" => levels.push(1),
                    "2" => levels.push(2),
                    _ => {
                        return Err(ConfError::at(format!("invalid \"levels\" \"{}\"", a), d));
                    }
                }
            }
            if levels.len() > 3 {
                return Err(ConfError::at(format!("invalid \"levels\" \"{}\"", a), d));
            }
        } else if let Some(v) = a.strip_prefix("keys_zone=") {
            let (name, size) = v
                .split_once(':')
                .ok_or_else(|| ConfError::at(format!("invalid keys zone size \"{}\"", a), d))?;
            let size = value::size(size)
                .filter(|s| *s >= 8192)
                .ok_or_else(|| ConfError::at(format!("invalid keys zone size \"{}\"", a), d))?;
            if name.is_empty() {
                return Err(bad(a));
            }
            zone = Some((name.to_string(), size as usize));
        } else if let Some(v) = a.strip_prefix("max_size=") {
            max_size =
                Some(value::offset(v).ok_or_else(|| {
                    ConfError::at(format!("invalid max_size value \"{}\"", a), d)
                })?);
        } else if let Some(v) = a.strip_prefix("min_free=") {
            min_free = value::offset(v)
                .ok_or_else(|| ConfError::at(format!("invalid min_free value \"{}\"", a), d))?;
        } else if let Some(v) = a.strip_prefix("inactive=") {
            inactive = value::time_secs(v)
                .ok_or_else(|| ConfError::at(format!("invalid inactive value \"{}\"", a), d))?;
        } else if let Some(v) = a.strip_prefix("use_temp_path=") {
            // Temp files are always written next to their final name (see
            // crate::cache): `on` and `off` both mean an atomic rename.
            if v != "on" && v != "off" {
                return Err(ConfError::at(
                    format!(
                        "invalid use_temp_path value \"{}\", it must be \"on\" or \"off\"",
                        v
                    ),
                    d,
                ));
            }
        } else if let Some((name, v)) = a
            .split_once('=')
            .filter(|(n, _)| n.starts_with("loader_") || n.starts_with("manager_"))
        {
            // The loader's and manager's pacing (see crate::cache::Pacing):
            // counts as ngx_atoi, times as ngx_parse_time(, 0).
            let invalid = || ConfError::at(format!("invalid {} value \"{}\"", name, a), d);
            let files = || value::number(v).ok_or_else(invalid);
            let time = || {
                value::time_ms(v)
                    .map(Duration::from_millis)
                    .ok_or_else(invalid)
            };
            match name {
                "loader_files" => pacing.loader_files = files()?,
                "loader_sleep" => pacing.loader_sleep = time()?,
                "loader_threshold" => pacing.loader_threshold = time()?,
                "manager_files" => pacing.manager_files = files()?,
                "manager_sleep" => pacing.manager_sleep = time()?,
                "manager_threshold" => pacing.manager_threshold = time()?,
                _ => return Err(bad(a)),
            }
        } else {
            return Err(bad(a));
        }
    }
    let Some((name, size)) = zone else {
        return Err(ConfError::at(
            format!("\"{}\" must have \"keys_zone\" parameter", d.name),
            d,
        ));
    };
    let zones = &mut hm.modules.upstream.zones;
    if zones.contains_key(&name) {
        return Err(ConfError::at(format!("duplicate zone \"{}\"", name), d));
    }
    if zones.values().any(|z| z.conf.path == path) {
        return Err(ConfError::at(
            format!("duplicate {} \"{}\"", d.name, arg(d, 0)),
            d,
        ));
    }
    let z = cache::zone(cache::PathConf {
        path,
        levels,
        name: name.clone(),
        size,
        max_size,
        inactive_secs: inactive,
        min_free,
        pacing,
    });
    zones.insert(name, z);
    Ok(())
}
