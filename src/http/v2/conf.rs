//! The `http2*` directives (nginx's ngx_http_v2_module): `http2 on|off`
//! (1.25.1 syntax, per server; `listen ... http2` per address), the limits
//! the h2 handshake announces, and the obsolete ones nginx still accepts
//! with a warning.

use crate::config::registry::{arg, ctx, flag, set_once, size_arg, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::{LocConf, SrvConf};

/// Server-level HTTP/2 settings (merged http -> server).
#[derive(Debug, Clone, Default)]
pub struct H2Srv {
    /// `http2 on|off`.
    pub enable: Option<bool>,
    pub max_concurrent_streams: Option<u32>,
    pub body_preread_size: Option<u32>,
    pub recv_buffer_size: Option<usize>,
}

impl H2Srv {
    pub fn merge(&mut self, p: &H2Srv) {
        crate::http::conf::merge_opts!(self, p; enable, max_concurrent_streams,
            body_preread_size, recv_buffer_size);
    }
    /// nginx's default: 128.
    pub fn max_streams(&self) -> u32 {
        self.max_concurrent_streams.unwrap_or(128)
    }
    /// nginx's default: 64k (the initial window the client may fill
    /// before a handler asks for the body).
    pub fn preread(&self) -> u32 {
        self.body_preread_size.unwrap_or(65536)
    }
}

const fn srv(
    name: &'static str,
    args: Args,
    set: fn(&mut SrvConf, &Directive, &mut Compiler) -> ConfResult<()>,
) -> Spec {
    Spec {
        name,
        ctx: ctx::HTTP | ctx::SRV,
        args,
        set: Setter::Srv(set),
    }
}

const fn loc(
    name: &'static str,
    args: Args,
    set: fn(&mut LocConf, &Directive, &mut Compiler) -> ConfResult<()>,
) -> Spec {
    Spec {
        name,
        ctx: ctx::HSL,
        args,
        set: Setter::Loc(set),
    }
}

pub const DIRECTIVES: &[Spec] = &[
    srv("http2", Args::Flag, set_enable),
    srv(
        "http2_max_concurrent_streams",
        Args::take(1),
        set_max_streams,
    ),
    srv("http2_body_preread_size", Args::take(1), set_preread),
    Spec {
        name: "http2_recv_buffer_size",
        ctx: ctx::HTTP,
        args: Args::take(1),
        set: Setter::Srv(set_recv_buffer),
    },
    loc("http2_chunk_size", Args::take(1), set_chunk_size),
    // Obsolete since 1.19.7: accepted with nginx's warning.
    srv(
        "http2_idle_timeout",
        Args::take(1),
        obsolete_keepalive_timeout,
    ),
    srv(
        "http2_recv_timeout",
        Args::take(1),
        obsolete_client_header_timeout,
    ),
    srv(
        "http2_max_requests",
        Args::take(1),
        obsolete_keepalive_requests,
    ),
    srv(
        "http2_max_field_size",
        Args::take(1),
        obsolete_header_buffers,
    ),
    srv(
        "http2_max_header_size",
        Args::take(1),
        obsolete_header_buffers,
    ),
    // Server push is gone since 1.25.1: accepted and ignored, with a warning.
    loc("http2_push", Args::take(1), obsolete_push),
    loc("http2_push_preload", Args::Flag, obsolete_push),
    srv(
        "http2_max_concurrent_pushes",
        Args::take(1),
        obsolete_push_srv,
    ),
];

fn set_enable(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut s.http2.enable, v, d)
}

fn set_max_streams(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = crate::config::registry::num_arg(d, 0)?;
    set_once(
        &mut s.http2.max_concurrent_streams,
        n.min(u32::MAX as u64) as u32,
        d,
    )
}

fn set_preread(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = size_arg(d, 0)?;
    // nginx: "the maximum body preread buffer size is 2147483647"
    if n > (i32::MAX as u64) {
        return Err(ConfError::at(
            format!("the maximum body preread buffer size is {}", i32::MAX),
            d,
        ));
    }
    set_once(&mut s.http2.body_preread_size, n as u32, d)
}

fn set_recv_buffer(s: &mut SrvConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = size_arg(d, 0)?;
    // nginx: the buffer must hold at least twice the state buffer (16 bytes).
    if n <= 32 {
        return Err(ConfError::at(
            "the http2 receive buffer size is too small",
            d,
        ));
    }
    set_once(&mut s.http2.recv_buffer_size, n as usize, d)
}

fn set_chunk_size(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = size_arg(d, 0)?;
    if n == 0 {
        return Err(ConfError::at("the http2 chunk size cannot be zero", d));
    }
    // nginx caps it at the largest frame size it sends (2^24 - 1).
    set_once(
        &mut l.core.http2_chunk_size,
        n.min((1 << 24) - 1) as usize,
        d,
    )
}

fn obsolete(cx: &mut Compiler, d: &Directive, instead: &str) {
    cx.warnings.push(format!(
        "the \"{}\" directive is obsolete, use the \"{}\" directive instead in {}:{}",
        d.name,
        instead,
        d.file.display(),
        d.line
    ));
}

fn obsolete_keepalive_timeout(_: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    obsolete(cx, d, "keepalive_timeout");
    Ok(())
}

fn obsolete_client_header_timeout(
    _: &mut SrvConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    obsolete(cx, d, "client_header_timeout");
    Ok(())
}

fn obsolete_keepalive_requests(
    _: &mut SrvConf,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    obsolete(cx, d, "keepalive_requests");
    Ok(())
}

fn obsolete_header_buffers(_: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    obsolete(cx, d, "large_client_header_buffers");
    Ok(())
}

fn push_warning(cx: &mut Compiler, d: &Directive) {
    let _ = arg(d, 0);
    cx.warnings.push(format!(
        "the \"{}\" directive is obsolete, ignored in {}:{}",
        d.name,
        d.file.display(),
        d.line
    ));
}

fn obsolete_push(_: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    push_warning(cx, d);
    Ok(())
}

fn obsolete_push_srv(_: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    push_warning(cx, d);
    Ok(())
}

/// ALPN offers `h2` first on a server that serves HTTP/2 (`http2 on`, or a
/// `listen ... http2` of its own), then HTTP/1.x as before.
pub fn offer_h2(tls: &mut Option<std::sync::Arc<rustls::ServerConfig>>) {
    if let Some(cfg) = tls.as_mut() {
        let cfg = std::sync::Arc::make_mut(cfg);
        if !cfg.alpn_protocols.iter().any(|p| p == b"h2") {
            cfg.alpn_protocols.insert(0, b"h2".to_vec());
        }
    }
}
