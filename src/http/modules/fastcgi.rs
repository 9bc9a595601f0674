//! `fastcgi_pass` and the `fastcgi_*` directives (nginx's
//! ngx_http_fastcgi_module): a FastCGI client for php-fpm and the like.
//!
//! The upstream side is the proxy's (nginx has one ngx_http_upstream for
//! both): peer selection and `upstream {}` blocks, the keepalive cache,
//! `fastcgi_next_upstream` with its tries and timeout, `$upstream_*`,
//! timeouts, buffering to memory and temp files, header hiding, error
//! interception and client-abort handling all come from
//! [`super::proxy`], whose setters also fill [`FastcgiLoc::up`] for the
//! `fastcgi_` rows of the table below. This module adds the protocol.
//!
//! # A request
//!
//! ```text
//! content phase
//!   ├─ the request body, read whole (crate::http::body)
//!   ├─ records out: BEGIN_REQUEST (responder; FCGI_KEEP_CONN with
//!   │   fastcgi_keep_conn), PARAMS (fastcgi_param entries in order, then
//!   │   the client's headers as HTTP_* unless a param of that name is set),
//!   │   an empty PARAMS, STDIN (the body, 32 KiB a record), an empty STDIN
//!   ├─ records in, until the head is complete (Decoder):
//!   │     STDOUT ─▶ CGI header lines ─ `Status:` gives the status and,
//!   │                verbatim, the status line (`404 Not Here`, `200`),
//!   │                else `Location:` makes it `302 Moved Temporarily`,
//!   │                else `200 OK`
//!   │     STDERR ─▶ error log ("FastCGI sent in stderr: ...")
//!   │     END_REQUEST before the blank line ─▶ 502
//!   └─ the rest of STDOUT is the body: proxy::Producer streams it while
//!      the Decoder strips the framing; END_REQUEST ends it, and with
//!      fastcgi_keep_conn the connection goes back to the upstream's
//!      keepalive cache
//! ```
//!
//! Every record is padded to a multiple of 8 bytes, as nginx pads them.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;

use super::proxy::{self, Fail, OutBody, Outgoing, ProxyLoc, Target};
use super::upstream::Upstream;
use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::body::{self, TempDir};
use crate::http::conf::{merge_opts, HttpMain, LocConf};
use crate::http::phases::{Ctx, Step};
use crate::http::request::Method;
use crate::http::response::{Body, Response};
use crate::http::vars::Template;
use crate::tls::client::UpStream;

const LOC: u32 = ctx::LOC | ctx::LIF;
const HSL: u32 = ctx::HSL;

pub const DIRECTIVES: &[Spec] = &[
    row("fastcgi_pass", LOC, Args::take(1), set_pass),
    row("fastcgi_param", HSL, Args::take23(), set_param),
    row("fastcgi_index", HSL, Args::take(1), set_index),
    row(
        "fastcgi_split_path_info",
        ctx::LOC,
        Args::take(1),
        set_split,
    ),
    row("fastcgi_keep_conn", HSL, Args::Flag, set_keep_conn),
    row("fastcgi_catch_stderr", HSL, Args::take(1), set_catch_stderr),
    // The upstream side: proxy's setters, which fill `FastcgiLoc::up`.
    shared("fastcgi_connect_timeout", Args::take(1), SetFn::Timeout),
    shared("fastcgi_send_timeout", Args::take(1), SetFn::Timeout),
    shared("fastcgi_read_timeout", Args::take(1), SetFn::Timeout),
    shared(
        "fastcgi_next_upstream_timeout",
        Args::take(1),
        SetFn::Timeout,
    ),
    shared(
        "fastcgi_next_upstream",
        Args::AtLeast(1),
        SetFn::NextUpstream,
    ),
    shared("fastcgi_next_upstream_tries", Args::take(1), SetFn::Tries),
    shared("fastcgi_buffering", Args::Flag, SetFn::Flag),
    shared("fastcgi_request_buffering", Args::Flag, SetFn::Flag),
    shared("fastcgi_intercept_errors", Args::Flag, SetFn::Flag),
    shared("fastcgi_pass_request_headers", Args::Flag, SetFn::Flag),
    shared("fastcgi_pass_request_body", Args::Flag, SetFn::Flag),
    shared("fastcgi_force_ranges", Args::Flag, SetFn::Flag),
    shared("fastcgi_ignore_client_abort", Args::Flag, SetFn::Flag),
    shared("fastcgi_socket_keepalive", Args::Flag, SetFn::Flag),
    shared("fastcgi_buffers", Args::take(2), SetFn::Buffers),
    shared("fastcgi_buffer_size", Args::take(1), SetFn::Size),
    shared("fastcgi_busy_buffers_size", Args::take(1), SetFn::Size),
    shared("fastcgi_max_temp_file_size", Args::take(1), SetFn::Size),
    shared("fastcgi_temp_file_write_size", Args::take(1), SetFn::Size),
    shared("fastcgi_limit_rate", Args::take(1), SetFn::Size),
    shared("fastcgi_temp_path", Args::take1234(), SetFn::TempPath),
    shared("fastcgi_hide_header", Args::take(1), SetFn::HidePass),
    shared("fastcgi_pass_header", Args::take(1), SetFn::HidePass),
    shared(
        "fastcgi_ignore_headers",
        Args::AtLeast(1),
        SetFn::IgnoreHeaders,
    ),
    shared("fastcgi_bind", Args::take12(), SetFn::Bind),
    unsupported("fastcgi_store"),
    unsupported("fastcgi_store_access"),
    unsupported("fastcgi_send_lowat"),
    unsupported("fastcgi_cache"),
    unsupported("fastcgi_cache_key"),
    unsupported("fastcgi_cache_valid"),
    unsupported("fastcgi_cache_methods"),
    unsupported("fastcgi_cache_use_stale"),
    unsupported("fastcgi_cache_background_update"),
    unsupported("fastcgi_cache_lock"),
    unsupported("fastcgi_cache_lock_timeout"),
    unsupported("fastcgi_cache_lock_age"),
    unsupported("fastcgi_cache_revalidate"),
    unsupported("fastcgi_cache_min_uses"),
    unsupported("fastcgi_cache_bypass"),
    unsupported("fastcgi_no_cache"),
    unsupported("fastcgi_cache_max_range_offset"),
    Spec {
        name: "fastcgi_cache_path",
        ctx: ctx::HTTP,
        args: Args::Any,
        set: Setter::Unsupported,
    },
];

/// Which of proxy's setters a shared row uses.
enum SetFn {
    Timeout,
    NextUpstream,
    Tries,
    Flag,
    Buffers,
    Size,
    TempPath,
    HidePass,
    IgnoreHeaders,
    Bind,
}

const fn shared(name: &'static str, args: Args, f: SetFn) -> Spec {
    row(
        name,
        HSL,
        args,
        match f {
            SetFn::Timeout => proxy::set_timeout,
            SetFn::NextUpstream => proxy::set_next_upstream,
            SetFn::Tries => proxy::set_next_upstream_tries,
            SetFn::Flag => proxy::set_flag,
            SetFn::Buffers => proxy::set_buffers,
            SetFn::Size => proxy::set_size,
            SetFn::TempPath => proxy::set_temp_path,
            SetFn::HidePass => proxy::set_hide_pass,
            SetFn::IgnoreHeaders => proxy::set_ignore_headers,
            SetFn::Bind => proxy::set_bind,
        },
    )
}

/// A directive of the module tern does not implement yet (refused with
/// a message naming it, never silently accepted).
const fn unsupported(name: &'static str) -> Spec {
    Spec {
        name,
        ctx: HSL,
        args: Args::Any,
        set: Setter::Unsupported,
    }
}

const fn row(
    name: &'static str,
    ctx: u32,
    args: Args,
    f: fn(&mut LocConf, &Directive, &mut Compiler) -> ConfResult<()>,
) -> Spec {
    Spec {
        name,
        ctx,
        args,
        set: Setter::Loc(f),
    }
}

/// Module variables (see `modules::VAR_MODULES`).
pub const VARS: &[&str] = &["fastcgi_script_name", "fastcgi_path_info"];

pub fn var(cx: &Ctx<'_>, i: u8, out: &mut Vec<u8>) -> bool {
    let (script, info) = split_path(cx);
    match i {
        0 => out.extend_from_slice(&script),
        1 => out.extend_from_slice(info),
        _ => return false,
    }
    true
}

/// `$fastcgi_script_name` and `$fastcgi_path_info` of the current URI:
/// the two captures of `fastcgi_split_path_info` when it matches (else
/// the URI and nothing), with `fastcgi_index` appended to a script name
/// that ends in `/`.
fn split_path<'c>(cx: &'c Ctx<'_>) -> (Cow<'c, [u8]>, &'c [u8]) {
    let conf = &cx.loc.modules.fastcgi;
    let uri: &[u8] = &cx.uri;
    let (script, info) = match conf.split.as_ref().and_then(|re| re.captures(uri)) {
        Some(c) => {
            let group = |i: usize| {
                c.get(i)
                    .copied()
                    .flatten()
                    .and_then(|(s, e)| uri.get(s..e))
                    .unwrap_or(b"")
            };
            (group(1), group(2))
        }
        None => (uri, &b""[..]),
    };
    match &conf.index {
        Some(ix) if script.ends_with(b"/") => {
            let mut s = script.to_vec();
            ix.render(cx, &mut s);
            (Cow::Owned(s), info)
        }
        _ => (Cow::Borrowed(script), info),
    }
}

// ---- configuration ----------------------------------------------------------

/// Where `fastcgi_pass` goes.
#[derive(Debug)]
pub enum PassTo {
    /// An address, a unix socket or an upstream name.
    Static(Target),
    /// With variables: an upstream name or an address, per request.
    Var(Template),
}

#[derive(Debug)]
pub struct Pass {
    pub to: PassTo,
    /// `<prefix>/fastcgi_temp`, used without `fastcgi_temp_path`.
    pub temp_default: std::path::PathBuf,
    /// `<prefix>/client_body_temp`, used without `client_body_temp_path`.
    pub body_temp_default: Arc<TempDir>,
}

/// A `fastcgi_param NAME VALUE [if_not_empty]`.
#[derive(Debug, Clone)]
pub struct Param {
    pub name: Vec<u8>,
    pub value: Template,
    pub if_not_empty: bool,
}

/// Location-level settings.
#[derive(Debug, Clone, Default)]
pub struct FastcgiLoc {
    pub pass: Option<Arc<Pass>>,
    /// The upstream side, shared with proxy (its setters fill it).
    pub up: ProxyLoc,
    /// `fastcgi_param` entries: a level with any replaces the inherited list.
    pub params: Option<Arc<Vec<Param>>>,
    pub index: Option<Template>,
    pub split: Option<crate::core::regex::Regex>,
    pub keep_conn: Option<bool>,
    pub catch_stderr: Option<Arc<Vec<Vec<u8>>>>,
}

impl FastcgiLoc {
    pub fn merge(&mut self, p: &FastcgiLoc) {
        // `pass` is inherited into `if` blocks; conf.rs drops it for
        // nested locations, as for proxy_pass.
        merge_opts!(self, p; pass, params, index, split, keep_conn, catch_stderr);
        self.up.merge(&p.up);
    }
}

fn set_pass(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.fastcgi.pass.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let a = arg(d, 0);
    let to = if a.contains('$') {
        PassTo::Var(cx.template(a, d)?)
    } else {
        PassTo::Static(target(a).map_err(|m| ConfError::at(m, d))?)
    };
    let temp_default = cx.path("fastcgi_temp");
    crate::cache::allow_dir(&temp_default);
    l.modules.fastcgi.pass = Some(Arc::new(Pass {
        to,
        temp_default,
        body_temp_default: Arc::new(TempDir::plain(cx.path("client_body_temp"))),
    }));
    Ok(())
}

/// A `fastcgi_pass` address as nginx parses it: `unix:PATH`,
/// `HOST:PORT`, or a name without a port (an `upstream` block).
fn target(a: &str) -> Result<Target, String> {
    if let Some(path) = a.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(format!("no path in the unix domain socket \"{}\"", a));
        }
        return Ok(Target::Fixed(Arc::new(Upstream::implicit_unix(
            path.into(),
        ))));
    }
    if a.contains("://") {
        return Err(format!("invalid host in upstream \"{}\"", a));
    }
    let port = if a.starts_with('[') {
        a.rsplit_once("]:").map(|(_, p)| p)
    } else {
        a.rsplit_once(':').map(|(_, p)| p)
    };
    match port {
        None => Ok(Target::Named {
            name: a.to_string(),
            // No port: only an upstream block can be meant.
            port: 0,
            resolved: OnceLock::new(),
        }),
        Some(p) => {
            if p.parse::<u16>().ok().filter(|p| *p > 0).is_none() {
                return Err(format!("invalid port in upstream \"{}\"", a));
            }
            let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(a)
                .map(|i| i.collect())
                .unwrap_or_default();
            if addrs.is_empty() {
                let host = a.rsplit_once(':').map_or(a, |(h, _)| h);
                return Err(format!("host not found in upstream \"{}\"", host));
            }
            Ok(Target::Fixed(Arc::new(Upstream::implicit(a, addrs))))
        }
    }
}

/// nginx's `no port in upstream "NAME"` for a `fastcgi_pass NAME` with
/// no `upstream NAME` block. Checked per location once it is compiled:
/// upstream blocks are http-level directives, all applied before any
/// server is compiled. `own` is the location's own configuration,
/// `block` its directives (for the line).
pub fn check_pass(own: &LocConf, hm: &HttpMain, block: &[Directive]) -> ConfResult<()> {
    let Some(p) = own.modules.fastcgi.pass.as_ref() else {
        return Ok(());
    };
    match &p.to {
        PassTo::Static(Target::Named { name, .. })
            if !hm.modules.upstream.upstreams.contains_key(name) =>
        {
            let msg = format!("no port in upstream \"{}\"", name);
            Err(match block.iter().find(|k| k.name == "fastcgi_pass") {
                Some(d) => ConfError::at(msg, d),
                None => ConfError::new(msg),
            })
        }
        _ => Ok(()),
    }
}

fn set_param(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let if_not_empty = match d.args.get(2).map(|a| a.value.as_str()) {
        None => false,
        Some("if_not_empty") => true,
        Some(v) => return Err(ConfError::at(format!("invalid parameter \"{}\"", v), d)),
    };
    let value = cx.template(arg(d, 1), d)?;
    let list = l
        .modules
        .fastcgi
        .params
        .get_or_insert_with(Default::default);
    Arc::make_mut(list).push(Param {
        name: arg(d, 0).as_bytes().to_vec(),
        value,
        if_not_empty,
    });
    Ok(())
}

fn set_index(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let t = cx.template(arg(d, 0), d)?;
    set_once(&mut l.modules.fastcgi.index, t, d)
}

fn set_split(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let p = arg(d, 0);
    let re = crate::core::regex::Regex::compile(d, p, false)?;
    // Group 0 is the whole match.
    if re.capture_names().len() != 3 {
        return Err(ConfError::at(
            format!("pattern \"{}\" must have 2 captures", p),
            d,
        ));
    }
    set_once(&mut l.modules.fastcgi.split, re, d)
}

fn set_keep_conn(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.fastcgi.keep_conn, v, d)
}

fn set_catch_stderr(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let list = l
        .modules
        .fastcgi
        .catch_stderr
        .get_or_insert_with(Default::default);
    Arc::make_mut(list).push(arg(d, 0).as_bytes().to_vec());
    Ok(())
}

// ---- records ----------------------------------------------------------------

const VERSION: u8 = 1;
const BEGIN_REQUEST: u8 = 1;
const END_REQUEST: u8 = 3;
const PARAMS: u8 = 4;
const STDIN: u8 = 5;
const STDOUT: u8 = 6;
const STDERR: u8 = 7;
const RESPONDER: u8 = 1;
const KEEP_CONN: u8 = 1;
/// nginx's largest STDIN record content.
const STDIN_MAX: usize = 32 * 1024;

/// Appends one record (request id 1) with its padding.
fn record(out: &mut Vec<u8>, kind: u8, content: &[u8]) {
    let len = content.len();
    let pad = (8 - len % 8) % 8;
    out.extend_from_slice(&[
        VERSION,
        kind,
        0,
        1,
        (len >> 8) as u8,
        len as u8,
        pad as u8,
        0,
    ]);
    out.extend_from_slice(content);
    out.extend_from_slice(&[0u8; 8][..pad]);
}

/// The body as STDIN records; an empty `data` is the closing record.
pub(crate) fn stdin(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 16);
    if data.is_empty() {
        record(&mut out, STDIN, &[]);
    }
    for piece in data.chunks(STDIN_MAX) {
        record(&mut out, STDIN, piece);
    }
    out
}

/// A name-value pair's length: one byte below 128, else four with the
/// top bit set.
fn nv_len(out: &mut Vec<u8>, n: usize) {
    if n < 128 {
        out.push(n as u8);
    } else {
        out.extend_from_slice(&((n as u32) | 0x8000_0000).to_be_bytes());
    }
}

fn nv(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    nv_len(out, name.len());
    nv_len(out, value.len());
    out.extend_from_slice(name);
    out.extend_from_slice(value);
}

/// BEGIN_REQUEST, the params (one record, as nginx), the empty PARAMS
/// record. Err: nginx's message when they do not fit one record.
fn request_head(cx: &Ctx<'_>, conf: &FastcgiLoc, keep_conn: bool) -> Result<Vec<u8>, String> {
    let mut params = Vec::new();
    let list: &[Param] = conf.params.as_deref().map_or(&[], |v| v);
    for p in list {
        let v = p.value.render_vec(cx);
        if p.if_not_empty && v.is_empty() {
            continue;
        }
        nv(&mut params, &p.name, &v);
    }
    if conf.up.pass_request_headers.unwrap_or(true) {
        // A header whose HTTP_ name a fastcgi_param sets is left out
        // (nginx's check is by name, whatever the param's value).
        let set: Vec<&[u8]> = list
            .iter()
            .filter_map(|p| p.name.strip_prefix(b"HTTP_"))
            .collect();
        let mut name = Vec::new();
        for h in cx.req.headers() {
            name.clear();
            name.extend(h.name.iter().map(|c| match c {
                b'-' => b'_',
                c => c.to_ascii_uppercase(),
            }));
            if set.iter().any(|s| s.eq_ignore_ascii_case(&name)) {
                continue;
            }
            let mut full = b"HTTP_".to_vec();
            full.extend_from_slice(&name);
            nv(&mut params, &full, h.value);
        }
    }
    if params.len() > 65535 {
        return Err(format!(
            "fastcgi request record is too big: {}",
            params.len()
        ));
    }
    let mut out = Vec::with_capacity(params.len() + 48);
    let flags = if keep_conn { KEEP_CONN } else { 0 };
    record(
        &mut out,
        BEGIN_REQUEST,
        &[0, RESPONDER, flags, 0, 0, 0, 0, 0],
    );
    if !params.is_empty() {
        record(&mut out, PARAMS, &params);
    }
    record(&mut out, PARAMS, &[]);
    Ok(out)
}

/// Where the decoder is in the record stream.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// Collecting the 8-byte header (`have` of it so far).
    Header,
    /// Content of a record of `kind`, `left` bytes to go, then `pad`.
    Content {
        kind: u8,
        left: usize,
        pad: usize,
    },
    Padding {
        left: usize,
    },
}

/// The response's record stream, fed as it arrives: STDOUT content goes
/// to the caller, STDERR content is collected for the log, END_REQUEST
/// ends it.
#[derive(Debug)]
pub(crate) struct Decoder {
    part: Part,
    hdr: [u8; 8],
    have: usize,
    /// STDERR text since the last look (one entry per record).
    pub(crate) stderr: Vec<Vec<u8>>,
    cur_err: Vec<u8>,
    /// END_REQUEST arrived.
    pub(crate) done: bool,
    /// Bytes came after END_REQUEST.
    pub(crate) extra: bool,
}

impl Decoder {
    fn new() -> Decoder {
        Decoder {
            part: Part::Header,
            hdr: [0; 8],
            have: 0,
            stderr: Vec::new(),
            cur_err: Vec::new(),
            done: false,
            extra: false,
        }
    }

    /// Decodes `buf`, appending STDOUT content to `out`. Err: nginx's
    /// words for a broken stream.
    pub(crate) fn feed(&mut self, mut buf: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        while !buf.is_empty() {
            if self.done {
                self.extra = true;
                return Ok(());
            }
            match self.part {
                Part::Header => {
                    let take = (8 - self.have).min(buf.len());
                    self.hdr[self.have..self.have + take].copy_from_slice(&buf[..take]);
                    self.have += take;
                    buf = &buf[take..];
                    if self.have < 8 {
                        continue;
                    }
                    self.have = 0;
                    let h = self.hdr;
                    if h[0] != VERSION {
                        return Err(format!(
                            "upstream sent unsupported FastCGI protocol version: {}",
                            h[0]
                        ));
                    }
                    if !matches!(h[1], STDOUT | STDERR | END_REQUEST) {
                        return Err(format!(
                            "upstream sent invalid FastCGI record type: {}",
                            h[1]
                        ));
                    }
                    let left = usize::from(h[4]) << 8 | usize::from(h[5]);
                    let pad = usize::from(h[6]);
                    self.part = Part::Content {
                        kind: h[1],
                        left,
                        pad,
                    };
                    self.after_content(false);
                }
                Part::Content { kind, left, pad } => {
                    let take = left.min(buf.len());
                    match kind {
                        STDOUT => out.extend_from_slice(&buf[..take]),
                        STDERR => self.cur_err.extend_from_slice(&buf[..take]),
                        // END_REQUEST's body (app status, protocol
                        // status) is not used, as nginx.
                        _ => {}
                    }
                    buf = &buf[take..];
                    self.part = Part::Content {
                        kind,
                        left: left - take,
                        pad,
                    };
                    self.after_content(false);
                }
                Part::Padding { left } => {
                    let take = left.min(buf.len());
                    buf = &buf[take..];
                    self.part = Part::Padding { left: left - take };
                    self.after_content(true);
                }
            }
        }
        Ok(())
    }

    /// Moves on once a record's content (and then its padding) is whole.
    fn after_content(&mut self, padding: bool) {
        match self.part {
            Part::Content { kind, left: 0, pad } if !padding => {
                if kind == STDERR && !self.cur_err.is_empty() {
                    self.stderr.push(std::mem::take(&mut self.cur_err));
                }
                if kind == END_REQUEST {
                    self.done = true;
                }
                self.part = Part::Padding { left: pad };
                self.after_content(true);
            }
            Part::Padding { left: 0 } => self.part = Part::Header,
            _ => {}
        }
    }
}

/// The error-log line for a STDERR record (nginx trims trailing line
/// ends and logs it at error level).
pub(crate) fn stderr_msg(e: &[u8], head: bool) -> String {
    let mut t = e;
    while let Some((&last, rest)) = t.split_last() {
        if last == b'\r' || last == b'\n' || last == b' ' || last == b'.' {
            t = rest;
        } else {
            break;
        }
    }
    format!(
        "FastCGI sent in stderr: \"{}\" while reading {}",
        String::from_utf8_lossy(t),
        if head {
            "response header from upstream"
        } else {
            "upstream"
        }
    )
}

type Headers = Vec<(String, Vec<u8>)>;

/// A response head read from the records.
pub(crate) struct Head {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    /// Body bytes (STDOUT after the blank line) already decoded.
    pub(crate) body: Vec<u8>,
    pub(crate) decoder: Decoder,
    pub(crate) stderr: Vec<Vec<u8>>,
}

const WHILE_HEAD: &str = "while reading response header from upstream";

/// Reads records until STDOUT holds the CGI header block: `Name: value`
/// lines ending with an empty line (CRLF or LF), at most `head_max`
/// bytes (fastcgi_buffer_size).
pub(crate) async fn read_head(
    s: &mut UpStream,
    read: Duration,
    head_max: usize,
    catch: &[Vec<u8>],
) -> Result<Head, Fail> {
    let mut dec = Decoder::new();
    let mut out = Vec::new();
    let mut stderr = Vec::new();
    let mut buf = vec![0u8; head_max.max(8 * 1024)];
    loop {
        let n = proxy::timed_read(s, &mut buf, read, WHILE_HEAD, true).await;
        let n = match n {
            Ok(n) => n,
            Err(f) => return Err(Fail { stderr, ..f }),
        };
        if n == 0 {
            return Err(Fail {
                stderr,
                ..proxy::fail(
                    502,
                    format!("upstream prematurely closed connection {}", WHILE_HEAD),
                    true,
                )
            });
        }
        if let Err(m) = dec.feed(&buf[..n], &mut out) {
            return Err(Fail {
                stderr,
                ..proxy::invalid_header(&format!("{} {}", m, WHILE_HEAD))
            });
        }
        let caught = dec
            .stderr
            .iter()
            .any(|e| catch.iter().any(|c| contains(e, c)));
        stderr.append(&mut dec.stderr);
        if caught {
            // fastcgi_catch_stderr: an invalid response (nginx logs the
            // stderr line only).
            return Err(Fail {
                stderr,
                ..proxy::invalid_header("")
            });
        }
        if let Some((end, body_at)) = head_end(&out) {
            let (status, headers) = parse_head(&out[..end])
                .map_err(|m| proxy::invalid_header(&format!("{} {}", m, WHILE_HEAD)))?;
            return Ok(Head {
                status,
                headers,
                body: out[body_at..].to_vec(),
                decoder: dec,
                stderr,
            });
        }
        if out.len() > head_max {
            return Err(Fail {
                stderr,
                ..proxy::invalid_header(&format!("upstream sent too big header {}", WHILE_HEAD))
            });
        }
        if dec.done {
            return Err(Fail {
                stderr,
                ..proxy::fail(
                    502,
                    format!("upstream prematurely closed FastCGI stdout {}", WHILE_HEAD),
                    true,
                )
            });
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// Where the header block ends: (end of the lines, start of the body).
fn head_end(b: &[u8]) -> Option<(usize, usize)> {
    // An empty first line: no headers at all.
    if b.starts_with(b"\r\n") {
        return Some((0, 2));
    }
    if b.starts_with(b"\n") {
        return Some((0, 1));
    }
    let mut i = 0;
    while let Some(p) = b[i..].iter().position(|&c| c == b'\n') {
        let nl = i + p;
        let rest = &b[nl + 1..];
        if rest.starts_with(b"\r\n") {
            return Some((nl + 1, nl + 3));
        }
        if rest.starts_with(b"\n") {
            return Some((nl + 1, nl + 2));
        }
        i = nl + 1;
    }
    None
}

/// The CGI header lines: the status (see [`status_of`]) and the headers
/// (`Status` among them; it is hidden when relayed). Values lose the
/// spaces around them, not tabs, as nginx's header parser.
fn parse_head(b: &[u8]) -> Result<(u16, Headers), String> {
    let mut headers = Vec::new();
    for line in b.split(|&c| c == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let Some(colon) = line.iter().position(|&c| c == b':') else {
            return Err("upstream sent invalid header".into());
        };
        let name = &line[..colon];
        if name.is_empty()
            || !name
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_'))
        {
            return Err("upstream sent invalid header".into());
        }
        let value = trim_spaces(&line[colon + 1..]);
        let name = String::from_utf8_lossy(name).into_owned();
        headers.push((name, value.to_vec()));
    }
    let (status, _) = status_of(&headers)?;
    Ok((status, headers))
}

fn trim_spaces(mut v: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' '] = v {
        v = rest;
    }
    v
}

/// The status a script's header lines give, and the status line nginx
/// sends for it (after `HTTP/1.1 `): the first `Status:` value verbatim
/// (`404 Not Here`, `200`, `404Not`; its first three bytes must be
/// digits, any of them, `000` and `999` too; later `Status:` lines are
/// not looked at), else `302 Moved Temporarily` with a `Location:`, else
/// `200 OK`.
fn status_of(headers: &Headers) -> Result<(u16, &[u8]), String> {
    let first = |n: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(n));
    if let Some((_, value)) = first("status") {
        let code = value
            .get(..3)
            .filter(|d| d.iter().all(u8::is_ascii_digit))
            .map(|d| d.iter().fold(0u16, |a, c| a * 10 + u16::from(c - b'0')));
        return match code {
            Some(c) => Ok((c, value.as_slice())),
            None => Err(format!(
                "upstream sent invalid status \"{}\"",
                String::from_utf8_lossy(value)
            )),
        };
    }
    Ok(if first("location").is_some() {
        (302, &b"302 Moved Temporarily"[..])
    } else {
        (200, &b"200 OK"[..])
    })
}

// ---- the request ------------------------------------------------------------

/// nginx's fastcgi hidden headers; Date and Server are relayed.
const HIDDEN: &[&str] = &[
    "status",
    "x-accel-expires",
    "x-accel-redirect",
    "x-accel-limit-rate",
    "x-accel-buffering",
    "x-accel-charset",
];

pub async fn content(cx: &mut Ctx<'_>) -> Option<Step> {
    let loc = cx.loc.clone();
    let pass = loc.modules.fastcgi.pass.clone()?;
    Some(Step::done(Box::pin(handle(cx, &loc, &pass)).await))
}

/// The upstream of `fastcgi_pass` for this request.
async fn upstream_of(cx: &Ctx<'_>, pass: &Pass) -> Option<Arc<Upstream>> {
    match &pass.to {
        PassTo::Static(t @ Target::Fixed(_)) => proxy::upstream_for(cx, t, b"").await,
        PassTo::Static(Target::Named { name, .. }) => {
            let u = cx.http.main.modules.upstream.upstreams.get(name).cloned();
            if u.is_none() {
                cx.log(Level::Error, &format!("no port in upstream \"{}\"", name));
            }
            u
        }
        PassTo::Var(t) => {
            let v = t.render_vec(cx);
            let v = String::from_utf8_lossy(&v).into_owned();
            if let Some(u) = cx.http.main.modules.upstream.upstreams.get(&v) {
                return Some(u.clone());
            }
            match target(&v) {
                Ok(Target::Fixed(u)) => Some(u),
                Ok(Target::Named { .. }) => {
                    cx.log(Level::Error, &format!("no port in upstream \"{}\"", v));
                    None
                }
                Err(m) => {
                    cx.log(Level::Error, &m);
                    None
                }
            }
        }
    }
}

async fn handle(cx: &mut Ctx<'_>, loc: &Arc<LocConf>, pass: &Arc<Pass>) -> Response {
    let fconf = &loc.modules.fastcgi;
    let conf = &fconf.up;
    if let Err(r) = body::read(cx, &pass.body_temp_default).await {
        return *r;
    }
    let Some(up) = upstream_of(cx, pass).await else {
        return Response::status(502);
    };
    let policy = match cx.io_policy() {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let mut lim = proxy::Limits::of(conf);
    lim.fcgi = Some(fconf.catch_stderr.clone().unwrap_or_default());
    let keep_conn = fconf.keep_conn.unwrap_or(false);
    let mut head = match request_head(cx, fconf, keep_conn) {
        Ok(h) => h,
        Err(m) => {
            cx.log(Level::Alert, &m);
            return Response::status(500);
        }
    };
    // The body: in memory, framed now; from its temp file, framed piece
    // by piece as it is read back (proxy's send_request).
    let out_body = if conf.pass_request_body.unwrap_or(true) {
        match body::data(cx) {
            Some(body::Data::Mem(b)) if !b.is_empty() => {
                let mut v = stdin(b);
                v.extend_from_slice(&stdin(&[]));
                OutBody::Mem(Bytes::from(v))
            }
            Some(body::Data::File { file, len, .. }) if *len > 0 => {
                OutBody::File(file.clone(), *len)
            }
            _ => OutBody::None,
        }
    } else {
        OutBody::None
    };
    if matches!(out_body, OutBody::None) {
        head.extend_from_slice(&stdin(&[]));
    }
    let head_only = cx.method == Method::Head;
    let send = Outgoing {
        head: &head,
        body: &out_body,
        policy: &policy,
        non_idempotent: matches!(cx.req.method_raw(), "POST" | "LOCK" | "PATCH"),
        bind: proxy::bind_addr(cx, conf),
        keepalive: conf.socket_keepalive.unwrap_or(false),
    };
    let at = up.attempt_for(&*cx, cx.remote.map(|a| a.ip()));
    let mut resp = match proxy::fetch(cx, at, &up, &lim, &send, b"", head_only).await {
        Ok(r) => r,
        Err(e) => return Response::status(e.status),
    };
    let url = lim.url(&resp.peer_name, b"");
    if resp.status >= 300
        && conf.intercept_errors.unwrap_or(false)
        && proxy::has_error_page(loc, resp.status)
    {
        return Response::status(resp.status);
    }
    // `Location:` is relayed as it came, also a relative one: nginx keeps
    // upstream redirects out of its header filter's absolute_redirect.
    let relayed = proxy::relay_headers(b"", conf, None, &resp.headers, HIDDEN);
    let mut out = Response::status(resp.status);
    // nginx's status line is the script's `Status:` as it came (or its
    // own for 302/200); a filter that changes the status replaces it.
    if let Ok((code, line)) = status_of(&resp.headers) {
        out.status_line = Some((code, line.to_vec()));
    }
    out.upstream_server_date = true;
    proxy::apply_headers(&mut out, relayed);
    // As nginx: a response not being cached (tern has no fastcgi_cache)
    // goes as the script answered, whatever If-Modified-Since,
    // If-None-Match, If-Match or If-Unmodified-Since ask.
    out.disable_not_modified = true;
    if conf.ignore_headers.unwrap_or(0) & proxy::IGN_X_ACCEL_CHARSET == 0 {
        out.override_charset = resp
            .headers
            .iter()
            .rev()
            .find(|(n, _)| n.eq_ignore_ascii_case("x-accel-charset"))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    }
    if conf.force_ranges.unwrap_or(false) {
        proxy::force_ranges(&mut out);
    } else {
        out.ranges_off = true;
    }
    let Some(dec) = resp.fcgi.take() else {
        return Response::status(502);
    };
    let framing = proxy::Framing::fcgi(dec, resp.declared_len);
    let first = std::mem::take(&mut resp.early);
    if head_only || resp.status == 204 || resp.status == 304 {
        // No body for the client; the connection is not reused (the
        // rest of the records are not read).
        out.content_length = if head_only { resp.declared_len } else { None };
        out.body = Body::Bytes(Vec::new());
        return out;
    }
    let buffering = proxy::buffering(conf, &resp.headers);
    let (mem_max, temp_max) = if buffering {
        (lim.mem_max, lim.temp_max)
    } else {
        (lim.head_max, 0)
    };
    let keep = keep_conn.then(|| (up.clone(), resp.peer.clone(), resp.requests));
    if framing.done() {
        if let (Some(s), Some((up, peer, n))) = (resp.stream.take(), keep) {
            if !framing.extra {
                up.put_idle(peer, s, n);
            }
        }
        // As nginx: the script's Content-Length if it sent one, else
        // chunked (or the close, for HTTP/1.0), however short the body.
        match resp.declared_len {
            Some(_) => {
                out.content_length = Some(first.len() as u64);
                out.body = Body::Bytes(first);
            }
            None => {
                out.force_close = cx.req.minor == 0;
                out.body = proxy::complete_stream(first, policy);
            }
        }
        return out;
    }
    let Some(stream) = resp.stream.take() else {
        proxy::log_upstream(cx, Level::Error, "upstream connection lost", &url);
        return Response::status(502);
    };
    out.content_length = framing.length;
    if out.content_length.is_none() && cx.req.minor == 0 {
        out.force_close = true;
    }
    let pipe = Arc::new(proxy::Pipe::default());
    let producer = proxy::Producer {
        pipe: pipe.clone(),
        stream,
        _lease: resp.lease.take(),
        framing,
        read_timeout: lim.read,
        mem_max,
        temp_max,
        temp_dir: conf
            .temp_path
            .clone()
            .unwrap_or_else(|| pass.temp_default.clone()),
        policy: policy.clone(),
        temp: None,
        temp_len: 0,
        cache: None,
        keep,
        log: proxy::UpLog::of(cx, &url),
        limit_rate: conf.limit_rate.unwrap_or(0),
        store: None,
    };
    tokio::spawn(producer.run(first));
    out.body = Body::Stream(Box::new(proxy::Consumer { pipe, policy }));
    out.watch_client = !conf.ignore_client_abort.unwrap_or(false);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_padded_and_split() {
        let r = stdin(b"abc");
        assert_eq!(r, b"\x01\x05\x00\x01\x00\x03\x05\x00abc\0\0\0\0\0");
        assert_eq!(stdin(&[]), b"\x01\x05\x00\x01\x00\x00\x00\x00");
        let big = vec![b'x'; STDIN_MAX + 1];
        let r = stdin(&big);
        assert_eq!(r.len(), 8 + STDIN_MAX + 8 + 1 + 7);
    }

    #[test]
    fn name_value_lengths() {
        let mut o = Vec::new();
        nv(&mut o, b"A", &[b'v'; 200]);
        assert_eq!(&o[..5], &[1, 0x80, 0, 0, 200]);
        assert_eq!(o[5], b'A');
    }

    #[test]
    fn decoder_splits_streams_at_any_byte() {
        let mut s = Vec::new();
        record(&mut s, STDOUT, b"Status: 404\r\nX: y\r\n\r\nbody");
        record(&mut s, STDERR, b"oops\n");
        record(&mut s, STDOUT, b"-more");
        record(&mut s, END_REQUEST, &[0; 8]);
        for step in [1, 3, 7, 64] {
            let mut d = Decoder::new();
            let mut out = Vec::new();
            for c in s.chunks(step) {
                d.feed(c, &mut out).unwrap();
            }
            assert!(d.done && !d.extra);
            assert_eq!(out, b"Status: 404\r\nX: y\r\n\r\nbody-more");
            assert_eq!(d.stderr, vec![b"oops\n".to_vec()]);
        }
    }

    #[test]
    fn cgi_heads() {
        let (s, h) = parse_head(b"Status: 404 Not Found\r\nX: y\r\n").unwrap();
        assert_eq!(s, 404);
        assert_eq!(h.len(), 2);
        let line = |b: &[u8]| {
            let (_, h) = parse_head(b).unwrap();
            let (c, l) = status_of(&h).unwrap();
            (c, String::from_utf8(l.to_vec()).unwrap())
        };
        assert_eq!(
            line(b"Status:  404  Not Here \n"),
            (404, "404  Not Here".into())
        );
        assert_eq!(line(b"Status: 200\n"), (200, "200".into()));
        assert_eq!(line(b"Status: 000\n"), (0, "000".into()));
        assert_eq!(line(b"Status: 4041 x\n"), (404, "4041 x".into()));
        assert_eq!(line(b"Status: 200 \t\n"), (200, "200 \t".into()));
        assert_eq!(line(b"status: 201 A\nStatus: abc\n"), (201, "201 A".into()));
        assert_eq!(
            line(b"Location: /x\n"),
            (302, "302 Moved Temporarily".into())
        );
        assert_eq!(
            line(b"Location: /x\nStatus: 201 M\n"),
            (201, "201 M".into())
        );
        assert_eq!(line(b"X: y\n"), (200, "200 OK".into()));
        assert!(parse_head(b"Status: 42\n").is_err());
        assert!(parse_head(b"Status:\t200\n").is_err());
        assert!(parse_head(b"Status:\n").is_err());
        assert_eq!(parse_head(b"Location: /x\n").unwrap().0, 302);
        assert_eq!(parse_head(b"Content-Type: text/html\n").unwrap().0, 200);
        assert!(parse_head(b"Status: abc\n").is_err());
        assert!(parse_head(b"no colon\n").is_err());
        assert_eq!(head_end(b"A: b\r\n\r\nxy"), Some((6, 8)));
        assert_eq!(head_end(b"A: b\n\nxy"), Some((5, 6)));
        assert_eq!(head_end(b"\r\nxy"), Some((0, 2)));
        assert_eq!(head_end(b"A: b\r\n"), None);
    }
}
