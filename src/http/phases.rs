//! The request phases, in nginx's order. This file is the one place that
//! fixes the order:
//!
//! 1. server rewrite (`return` at server level)
//! 2. find location (may loop back after an internal redirect, max 10)
//! 3. location rewrite (`return` in the location)
//! 4. access (internal-only locations, body size)
//! 5. content (index -> static file)
//! 6. output: special responses (error pages), then the header filter and
//!    body writer in [`crate::http::conn`], then the access log.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::core::log::Level;
use crate::core::worker::WorkerShared;
use crate::http::conf::{LocConf, Server};
use crate::http::conn::ConnInfo;
use crate::http::modules::{rewrite, static_file};
use crate::http::request::Request;
use crate::http::response::{self, Response};
use crate::http::vars::{Var, VarCtx};

/// A request in progress: the parts of its state that phases change.
pub struct Ctx<'a> {
    pub req: &'a Request,
    pub server: &'a Arc<Server>,
    pub conn: &'a ConnInfo,
    pub shared: &'a WorkerShared,
    /// The current URI (changes on internal redirects).
    pub uri: Vec<u8>,
    pub loc: Arc<LocConf>,
    /// Regex captures of the location match, as byte ranges of `uri`.
    pub captures: Vec<Option<(usize, usize)>>,
    /// Set once an internal redirect happened (`internal` locations allowed).
    pub internal: bool,
    pub redirects: u32,
    /// Length of the matched location prefix (for `alias`).
    pub loc_prefix_len: usize,
    pub alias: bool,
    pub start: std::time::Instant,
}

/// A finished request: its response and the configuration that produced it.
pub struct Outcome {
    pub resp: Response,
    pub loc: Arc<LocConf>,
    pub server: Arc<Server>,
    pub uri: Vec<u8>,
    pub start: std::time::Instant,
}

pub enum Step {
    /// Go on to the next phase.
    Next,
    /// The response is decided.
    Done(Response),
    /// Look up the location again for the new URI.
    Redirect(Vec<u8>),
}

pub async fn run(req: &Request, server: &Arc<Server>, conn: &ConnInfo, shared: &WorkerShared) -> Outcome {
    let mut cx = Ctx {
        req,
        server,
        conn,
        shared,
        uri: req.uri.clone(),
        loc: server.conf.clone(),
        captures: Vec::new(),
        internal: false,
        redirects: 0,
        loc_prefix_len: 0,
        alias: false,
        start: std::time::Instant::now(),
    };
    let mut resp = run_phases(&mut cx).await;
    response::special_response(&mut resp, &cx.loc);
    Outcome { resp, loc: cx.loc.clone(), server: server.clone(), uri: cx.uri, start: cx.start }
}

async fn run_phases(cx: &mut Ctx<'_>) -> Response {
    // Server rewrite phase.
    if let Step::Done(r) = rewrite::run(cx, &cx.server.conf.clone().modules.rewrite.ops) {
        return r;
    }
    loop {
        find_location(cx);
        if cx.loc.core.internal && !cx.internal {
            return Response::status(404);
        }
        if let Some(cl) = cx.req.content_length {
            let max = cx.loc.core.client_max_body_size.unwrap_or(1 << 20);
            if max != 0 && cl > max {
                cx.log(Level::Error, &format!("client intended to send too large body: {} bytes", cl));
                return Response::status(413);
            }
        }
        let loc = cx.loc.clone();
        match rewrite::run(cx, &loc.modules.rewrite.ops) {
            Step::Done(r) => return r,
            Step::Redirect(u) => {
                if let Some(r) = cx.internal_redirect(u) {
                    return r;
                }
                continue;
            }
            Step::Next => {}
        }
        match static_file::handle(cx).await {
            Step::Done(r) => return r,
            Step::Redirect(u) => {
                if let Some(r) = cx.internal_redirect(u) {
                    return r;
                }
            }
            Step::Next => return Response::status(404),
        }
    }
}

fn find_location(cx: &mut Ctx<'_>) {
    match cx.server.locations.find(&cx.uri) {
        Some(f) => {
            cx.loc = f.loc.conf.clone();
            cx.captures = f.captures;
            cx.loc_prefix_len = match &f.loc.m {
                crate::http::conf::LocMatch::Prefix { prefix, .. } | crate::http::conf::LocMatch::Exact(prefix) => prefix.len(),
                _ => 0,
            };
        }
        None => {
            cx.loc = cx.server.conf.clone();
            cx.captures.clear();
            cx.loc_prefix_len = 0;
        }
    }
    cx.alias = matches!(cx.loc.core.root, Some((_, true)));
}

impl Ctx<'_> {
    /// Returns a response when the redirect limit is hit.
    pub fn internal_redirect(&mut self, uri: Vec<u8>) -> Option<Response> {
        self.redirects += 1;
        if self.redirects > 10 {
            self.log(Level::Error, &format!("rewrite or internal redirection cycle while internally redirecting to \"{}\"", String::from_utf8_lossy(&uri)));
            return Some(Response::status(500));
        }
        self.uri = uri;
        self.internal = true;
        None
    }

    /// Logs with nginx's request context suffix.
    pub fn log(&self, level: Level, msg: &str) {
        let logger = self.loc.core.logger.clone().unwrap_or_else(crate::core::log::main_logger);
        if !logger.enabled(level) {
            return;
        }
        let client = self.conn.remote.map(|a| a.ip().to_string()).unwrap_or_else(|| "unix:".into());
        let server = self.server.srv.primary_name.clone().unwrap_or_default();
        let host = self.req.header("host").map(|h| format!(", host: \"{}\"", String::from_utf8_lossy(h))).unwrap_or_default();
        logger.log(
            level,
            Some(self.conn.id),
            format_args!("{}, client: {}, server: {}, request: \"{}\"{}", msg, client, server, String::from_utf8_lossy(&self.req.line), host),
        );
    }

    /// The document root (rendered) for the current location.
    pub fn root(&self) -> Vec<u8> {
        match &self.loc.core.root {
            Some((t, _)) => t.render_vec(self),
            None => Vec::new(),
        }
    }

    /// `$request_filename`: root + uri, or alias + the rest of the uri.
    pub fn request_filename(&self) -> Vec<u8> {
        let mut p = self.root();
        if self.alias {
            let rest = self.uri.get(self.loc_prefix_len..).unwrap_or(b"");
            p.extend_from_slice(rest);
        } else {
            p.extend_from_slice(&self.uri);
        }
        p
    }
}

fn push_addr(out: &mut Vec<u8>, a: Option<SocketAddr>, port: bool) {
    match a {
        Some(a) if port => out.extend_from_slice(a.port().to_string().as_bytes()),
        Some(a) => out.extend_from_slice(a.ip().to_string().as_bytes()),
        None if port => {}
        None => out.extend_from_slice(b"unix:"),
    }
}

impl VarCtx for Ctx<'_> {
    fn var(&self, v: &Var, out: &mut Vec<u8>) -> bool {
        let r = self.req;
        match v {
            Var::Uri => out.extend_from_slice(&self.uri),
            Var::RequestUri => out.extend_from_slice(&r.raw_uri),
            Var::Args => out.extend_from_slice(r.args.as_deref().unwrap_or(b"")),
            Var::IsArgs => {
                if r.args.is_some() {
                    out.push(b'?')
                }
            }
            Var::Host => match &r.host {
                Some(h) => out.extend_from_slice(h),
                None => out.extend_from_slice(self.server.srv.primary_name.as_deref().unwrap_or("").as_bytes()),
            },
            Var::Hostname => out.extend_from_slice(crate::core::hostname().as_bytes()),
            Var::Http(name) => match name.as_str() {
                "cookie" => {
                    let mut first = true;
                    for h in r.headers.iter().filter(|h| h.lname == "cookie") {
                        if !first {
                            out.extend_from_slice(b"; ");
                        }
                        first = false;
                        out.extend_from_slice(&h.value);
                    }
                    return !first;
                }
                _ => match r.header(name) {
                    Some(v) => out.extend_from_slice(v),
                    None => return false,
                },
            },
            Var::Arg(name) => match r.args.as_deref().and_then(|a| crate::http::uri::arg(a, name.as_bytes())) {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
            Var::RemoteAddr => push_addr(out, self.conn.remote, false),
            Var::BinaryRemoteAddr => match self.conn.remote {
                Some(SocketAddr::V4(a)) => out.extend_from_slice(&a.ip().octets()),
                Some(SocketAddr::V6(a)) => out.extend_from_slice(&a.ip().octets()),
                None => {}
            },
            Var::RemotePort => push_addr(out, self.conn.remote, true),
            Var::ServerAddr => push_addr(out, self.conn.local, false),
            Var::ServerPort => push_addr(out, self.conn.local, true),
            Var::ServerName => out.extend_from_slice(self.server.srv.primary_name.as_deref().unwrap_or("").as_bytes()),
            Var::ServerProtocol => out.extend_from_slice(if r.minor == 0 { b"HTTP/1.0" } else { b"HTTP/1.1" }),
            Var::Scheme => out.extend_from_slice(b"http"),
            Var::Request => out.extend_from_slice(&r.line),
            Var::RequestMethod => out.extend_from_slice(r.method_raw.as_bytes()),
            Var::RequestLength => response::push_num(out, r.head_len as u64),
            Var::DocumentRoot => out.extend_from_slice(&self.root()),
            Var::RequestFilename => out.extend_from_slice(&self.request_filename()),
            Var::ContentType => match r.header("content-type") {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
            Var::ContentLength => match r.header("content-length") {
                Some(v) => out.extend_from_slice(v),
                None => return false,
            },
            Var::Connection => response::push_num(out, self.conn.id),
            Var::ConnectionRequests => response::push_num(out, self.conn.requests),
            Var::Pid => response::push_num(out, std::process::id() as u64),
            Var::NginxVersion => out.extend_from_slice(response::NGINX_VERSION.as_bytes()),
            Var::TernVersion => out.extend_from_slice(response::VERSION.as_bytes()),
            Var::TimeLocal => out.extend_from_slice(&crate::http::date::time_local()),
            Var::TimeIso8601 => out.extend_from_slice(&crate::http::date::time_iso8601()),
            Var::Msec => {
                let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                out.extend_from_slice(format!("{}.{:03}", d.as_secs(), d.subsec_millis()).as_bytes());
            }
            Var::RequestTime => {
                let e = self.start.elapsed();
                out.extend_from_slice(format!("{}.{:03}", e.as_secs(), e.subsec_millis()).as_bytes());
            }
            Var::Capture(n) => match self.captures.get(*n).copied().flatten() {
                Some((s, e)) => out.extend_from_slice(self.uri.get(s..e).unwrap_or(b"")),
                None => return false,
            },
            _ => return false,
        }
        true
    }
}
