//! The rewrite module: `rewrite`, `return`, `set`, `if`, `break`,
//! `rewrite_log`, `uninitialized_variable_warn`, and the core's redirect
//! settings (`absolute_redirect`, `port_in_redirect`,
//! `server_name_in_redirect`).
//!
//! Directives compile into a list of [`Op`]s per level (server, location,
//! `if` block), never inherited, run in order by [`run`] in the server
//! rewrite phase and the location rewrite phase. An `if` whose condition
//! holds switches the request to the `if` block's configuration (merged
//! with its enclosing level after that level is complete, see
//! [`finish_ifs`]) and runs the block's ops, then execution continues after
//! the block, as nginx does.
//!
//! A variable only `set` declares has no value where no `set` ran for it
//! in the request: it reads as empty, and the first read logs nginx's
//! `using uninitialized "NAME" variable` warning unless
//! `uninitialized_variable_warn off` (see `VarCtx for Ctx` in
//! `http/phases.rs`, which evaluates user variables).

use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::core::regex::Regex;
use crate::http::conf::LocConf;
use crate::http::phases::{Ctx, Step};
use crate::http::response::{Body, Response};
use crate::http::vars::{Part, Template, Var, VarCtx};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    /// No flag: go on with the next op, look the location up again at the end.
    None,
    Last,
    Break,
    Redirect,
    Permanent,
}

/// An `if` condition.
#[derive(Debug, Clone)]
pub enum Cond {
    /// `($var)`: true unless empty or "0".
    Var(Template),
    Eq {
        a: Template,
        b: Template,
        negate: bool,
    },
    Match {
        a: Template,
        re: Regex,
        negate: bool,
    },
    /// `-f`, `-d`, `-e`, `-x` with `!`.
    File {
        path: Template,
        test: u8,
        negate: bool,
    },
}

/// One step of the rewrite phase.
#[derive(Debug, Clone)]
pub enum Op {
    /// `set $limit_rate VALUE`: the request's rate (a size), kept in the
    /// note [`LIMIT_RATE`].
    SetLimitRate(Template),
    /// `set $args VALUE`: the request's arguments (nginx's one other
    /// changeable built-in variable).
    SetArgs(Template),
    /// `return CODE [TEXT]` / `return CODE URL` / `return URL`.
    Return {
        code: u16,
        text: Option<Template>,
    },
    Rewrite {
        re: Regex,
        source: String,
        to: Template,
        flag: Flag,
    },
    Set {
        var: usize,
        value: Template,
    },
    If {
        cond: Cond,
        raw: Box<LocConf>,
        conf: Option<Arc<LocConf>>,
    },
    Break,
}

#[derive(Debug, Clone, Default)]
pub struct RewriteLoc {
    /// Ops of this level only (never inherited).
    pub ops: Vec<Op>,
    pub rewrite_log: Option<bool>,
    pub uninitialized_variable_warn: Option<bool>,
    pub absolute_redirect: Option<bool>,
    pub port_in_redirect: Option<bool>,
    pub server_name_in_redirect: Option<bool>,
}

impl RewriteLoc {
    pub fn merge(&mut self, p: &RewriteLoc) {
        crate::http::conf::merge_opts!(self, p; rewrite_log, uninitialized_variable_warn,
            absolute_redirect, port_in_redirect, server_name_in_redirect);
    }
}

/// After a level's configuration is merged: give each `if` block its final
/// configuration (the block's own settings over the enclosing level's).
pub fn finish_ifs(l: &mut LocConf) {
    let mut ops = std::mem::take(&mut l.modules.rewrite.ops);
    for op in ops.iter_mut() {
        if let Op::If { raw, conf, .. } = op {
            let mut c = (**raw).clone();
            c.merge(l);
            finish_ifs(&mut c);
            *conf = Some(Arc::new(c));
        }
    }
    l.modules.rewrite.ops = ops;
}

/// What running a list of ops ended with.
enum Flow {
    Continue,
    Stop(Step),
    /// `break`, or `rewrite ... break`: stop the rewrite phase, stay here.
    Break,
    /// `rewrite ... last`: stop and look the location up again.
    Last,
}

/// Runs a level's ops. Returns `Step::Redirect(uri)` when the location must
/// be looked up again (a `last` flag, or a changed URI without a flag).
pub async fn run(cx: &mut Ctx<'_>, ops: &[Op]) -> Step {
    // Most levels have no ops: no copy of the URI, no boxed future.
    if ops.is_empty() {
        return Step::Next;
    }
    let before = cx.uri.clone();
    let flow = Box::pin(run_ops(cx, ops)).await;
    match flow {
        Flow::Stop(s) => s,
        Flow::Last => Step::Redirect(cx.uri.to_vec()),
        Flow::Break => {
            // A URI rewritten, then `break`: the location no longer
            // matches what it was found for (nginx's break code clears
            // valid_location when the URI changed).
            if cx.uri != before {
                cx.location_stale = true;
            }
            Step::Next
        }
        Flow::Continue if cx.uri != before => Step::Redirect(cx.uri.to_vec()),
        Flow::Continue => Step::Next,
    }
}

async fn run_ops(cx: &mut Ctx<'_>, ops: &[Op]) -> Flow {
    for op in ops {
        match op {
            Op::Return { code, text } => {
                return Flow::Stop(Step::done(ret(cx, *code, text.as_ref())))
            }
            Op::Break => return Flow::Break,
            Op::SetLimitRate(value) => {
                let v = value.render_vec(&*cx);
                match std::str::from_utf8(&v)
                    .ok()
                    .and_then(crate::config::value::size)
                {
                    Some(n) => cx.set_note(LIMIT_RATE, n.to_string()),
                    None => cx.log(
                        Level::Error,
                        &format!("invalid $limit_rate \"{}\"", String::from_utf8_lossy(&v)),
                    ),
                }
            }
            Op::SetArgs(value) => {
                let v = value.render_vec(&*cx);
                cx.args = (!v.is_empty()).then(|| v.into());
            }
            Op::Set { var, value } => {
                let v = value.render_vec(&*cx);
                if let Some(slot) = cx.user_vars.borrow_mut().get_mut(*var) {
                    *slot = Some(v);
                }
            }
            Op::Rewrite {
                re,
                source,
                to,
                flag,
            } => {
                let uri = cx.uri.clone();
                let Some(c) = re.captures(&uri) else {
                    if cx.loc.modules.rewrite.rewrite_log.unwrap_or(false) {
                        cx.log(
                            Level::Notice,
                            &format!(
                                "\"{}\" does not match \"{}\"",
                                source,
                                String::from_utf8_lossy(&uri)
                            ),
                        );
                    }
                    continue;
                };
                record_captures(cx, re, c, &uri);
                if cx.loc.modules.rewrite.rewrite_log.unwrap_or(false) {
                    cx.log(
                        Level::Notice,
                        &format!(
                            "\"{}\" matches \"{}\"",
                            source,
                            String::from_utf8_lossy(&uri)
                        ),
                    );
                }
                let mut target = render_replacement(cx, to);
                let external = target.starts_with(b"http://") || target.starts_with(b"https://");
                if external || matches!(flag, Flag::Redirect | Flag::Permanent) {
                    unescape_redirect(&mut target);
                    // Redirects keep the original args (after the replacement's
                    // own), unless the replacement ends with "?".
                    if target.ends_with(b"?") {
                        target.pop();
                    } else if let Some(a) = &cx.args {
                        target.push(if target.contains(&b'?') { b'&' } else { b'?' });
                        target.extend_from_slice(a);
                    }
                    let code = if *flag == Flag::Permanent { 301 } else { 302 };
                    let mut r = Response::status(code);
                    set_location(cx, &mut r, target);
                    return Flow::Stop(Step::done(r));
                }
                // An internal rewrite: split new args off.
                if let Some(q) = target.iter().position(|&b| b == b'?') {
                    let mut new_args = target[q + 1..].to_vec();
                    let keep_old = !new_args.is_empty() || q + 1 < target.len();
                    target.truncate(q);
                    if keep_old {
                        if let Some(a) = &cx.args {
                            if !new_args.is_empty() {
                                new_args.push(b'&');
                            }
                            new_args.extend_from_slice(a);
                        }
                    }
                    cx.args = if new_args.is_empty() {
                        None
                    } else {
                        Some(new_args.into())
                    };
                }
                if cx.loc.modules.rewrite.rewrite_log.unwrap_or(false) {
                    cx.log(
                        Level::Notice,
                        &format!(
                            "rewritten data: \"{}\", args: \"{}\"",
                            String::from_utf8_lossy(&target),
                            String::from_utf8_lossy(cx.args.as_deref().unwrap_or(b""))
                        ),
                    );
                }
                cx.uri = target.into();
                match flag {
                    Flag::Last => return Flow::Last,
                    Flag::Break => {
                        cx.location_stale = true;
                        return Flow::Break;
                    }
                    _ => {}
                }
            }
            Op::If { cond, conf, .. } => {
                if eval(cx, cond).await {
                    if let Some(c) = conf {
                        let before = cx.loc.content;
                        cx.loc = c.clone();
                        if c.content.is_none() && before.is_some() {
                            // An earlier `if` chose the content handler: as
                            // nginx's r->content_handler, it stays, and runs
                            // with this block's settings (a proxy_pass
                            // there then finds no upstream: 500).
                            let mut l = (**c).clone();
                            l.content = before;
                            cx.loc = std::sync::Arc::new(l);
                        }
                        let inner = c.clone();
                        match Box::pin(run_ops(cx, &inner.modules.rewrite.ops)).await {
                            Flow::Continue => {}
                            other => return other,
                        }
                    }
                }
            }
        }
    }
    Flow::Continue
}

async fn eval(cx: &mut Ctx<'_>, cond: &Cond) -> bool {
    match cond {
        Cond::Var(t) => {
            let v = t.render_vec(&*cx);
            !(v.is_empty() || v == b"0")
        }
        Cond::Eq { a, b, negate } => (a.render_vec(&*cx) == b.render_vec(&*cx)) != *negate,
        Cond::Match { a, re, negate } => {
            let v = a.render_vec(&*cx);
            match re.captures(&v) {
                Some(c) => {
                    if !negate {
                        record_captures(cx, re, c, &v);
                    }
                    !negate
                }
                None => *negate,
            }
        }
        Cond::File { path, test, negate } => {
            let p = path.render_vec(&*cx);
            let policy = cx.io_policy().unwrap_or_default();
            // disable_symlinks holds here too: nginx tests the file with
            // the same open as the static handler's, so a refused link
            // is no file (and `!-e` is true).
            let m = match super::static_file::symlink_check(cx, &p, &policy).await {
                Ok(()) => {
                    crate::io::stat(
                        std::path::Path::new(std::ffi::OsStr::from_bytes(&p)),
                        &policy,
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            let r = match (test, m) {
                (b'f', Ok(m)) => !m.is_dir,
                (b'd', Ok(m)) => m.is_dir,
                (b'e', Ok(_)) => true,
                // nginx's ngx_is_exec: the owner's x bit, directories too.
                (b'x', Ok(m)) => m.mode & 0o100 != 0,
                _ => false,
            };
            r != *negate
        }
    }
}

/// The response of `return`.
pub fn ret(cx: &Ctx<'_>, code: u16, text: Option<&Template>) -> Response {
    if code == 444 {
        let mut r = Response::status(444);
        r.close_silently = true;
        return r;
    }
    let mut r = Response::status(code);
    if text.is_none() && (200..300).contains(&code) && code != 204 {
        // nginx sends the empty text as a body (typed, `Content-Length:
        // 0`); as the target of an error page, that empty body goes out
        // under the error's status, without the error's page.
        r.content_type = Some(super::static_file::content_type(cx, &cx.uri));
        r.content_length = Some(0);
        r.body = Body::Bytes(Vec::new());
    }
    if let Some(t) = text {
        let v = t.render_vec(cx);
        if matches!(code, 301 | 302 | 303 | 307 | 308) {
            set_location(cx, &mut r, v);
        } else {
            // nginx types the text by the URI's extension, like a file.
            r.content_type = Some(super::static_file::content_type(cx, &cx.uri));
            r.content_length = Some(v.len() as u64);
            r.body = Body::Bytes(v);
        }
    }
    r
}

/// Sets a redirect target: a relative one is made absolute and written in
/// the head's fixed part; an absolute one is an ordinary header.
pub fn set_location(cx: &Ctx<'_>, r: &mut Response, target: Vec<u8>) {
    if target.starts_with(b"/") {
        r.location = Some(absolute_location(cx, target));
    } else {
        r.headers.push(("Location".into(), target));
    }
}

/// A relative redirect target made absolute as nginx does with
/// `absolute_redirect on`: scheme, host (Host header, or the server name
/// with `server_name_in_redirect on`), and the port unless it is 80.
pub fn absolute_location(cx: &Ctx<'_>, v: Vec<u8>) -> Vec<u8> {
    let rw = &cx.loc.modules.rewrite;
    if !v.starts_with(b"/") || !rw.absolute_redirect.unwrap_or(true) {
        return v;
    }
    let tls = cx.conn.tls.info().is_some();
    let mut out = if tls {
        b"https://".to_vec()
    } else {
        b"http://".to_vec()
    };
    let primary = cx.server.srv.primary_name.as_deref().unwrap_or("");
    // As nginx: the server's name when server_name_in_redirect is on,
    // else the host the client sent, else the local address.
    match cx.req.host() {
        _ if rw.server_name_in_redirect.unwrap_or(false) => {
            out.extend_from_slice(primary.as_bytes())
        }
        Some(h) => out.extend_from_slice(h),
        None => out.extend_from_slice(
            cx.conn
                .local
                .map(|a| a.ip().to_string())
                .unwrap_or_default()
                .as_bytes(),
        ),
    }
    if rw.port_in_redirect.unwrap_or(true) {
        if let Some(a) = cx.conn.local {
            if a.port() != if tls { 443 } else { 80 } {
                out.push(b':');
                out.extend_from_slice(a.port().to_string().as_bytes());
            }
        }
    }
    out.extend_from_slice(&v);
    out
}

// ---- directives -----------------------------------------------------------

fn set_return(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let first = arg(d, 0);
    let op = match first.parse::<u16>() {
        Ok(code) => {
            if code > 999 {
                return Err(ConfError::at(
                    format!("invalid return code \"{}\"", first),
                    d,
                ));
            }
            let text = match d.args.get(1) {
                Some(a) => Some(cx.template(&a.value, d)?),
                None => None,
            };
            Op::Return { code, text }
        }
        Err(_) => {
            if d.args.len() == 2
                || !(first.starts_with("http://")
                    || first.starts_with("https://")
                    || first.starts_with("$scheme"))
            {
                return Err(ConfError::at(
                    format!("invalid return code \"{}\"", first),
                    d,
                ));
            }
            Op::Return {
                code: 302,
                text: Some(cx.template(first, d)?),
            }
        }
    };
    l.modules.rewrite.ops.push(op);
    Ok(())
}

fn set_rewrite(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let source = arg(d, 0).to_string();
    let re = compile_regex(d, &source, false, cx)?;
    let flag = match d.args.get(2).map(|a| a.value.as_str()) {
        None => Flag::None,
        Some("last") => Flag::Last,
        Some("break") => Flag::Break,
        Some("redirect") => Flag::Redirect,
        Some("permanent") => Flag::Permanent,
        Some(v) => return Err(ConfError::at(format!("invalid parameter \"{}\"", v), d)),
    };
    let to = cx.template(arg(d, 1), d)?;
    l.modules.rewrite.ops.push(Op::Rewrite {
        re,
        source,
        to,
        flag,
    });
    Ok(())
}

fn set_set(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let name = arg(d, 0);
    let Some(name) = name.strip_prefix('$') else {
        return Err(ConfError::at(
            format!("invalid variable name \"{}\"", name),
            d,
        ));
    };
    // `$limit_rate` is the request's rate: setting it paces the response
    // (see [`limit_rate_var`]).
    if name == "limit_rate" {
        let value = cx.template(arg(d, 1), d)?;
        l.modules.rewrite.ops.push(Op::SetLimitRate(value));
        return Ok(());
    }
    if name == "args" {
        let value = cx.template(arg(d, 1), d)?;
        l.modules.rewrite.ops.push(Op::SetArgs(value));
        return Ok(());
    }
    // nginx refuses the builtins; a prefix variable (`$http_foo`,
    // `$arg_x`, `$cookie_y`...) may be set, and answers as itself where
    // `set` has not run.
    let builtin = !matches!(
        crate::http::vars::VarTable::default().lookup(name),
        None | Some(
            crate::http::vars::Var::Http(_)
                | crate::http::vars::Var::SentHttp(_)
                | crate::http::vars::Var::SentTrailer(_)
                | crate::http::vars::Var::UpstreamHttp(_)
                | crate::http::vars::Var::UpstreamCookie(_)
                | crate::http::vars::Var::Arg(_)
                | crate::http::vars::Var::Cookie(_)
        )
    );
    if builtin {
        return Err(ConfError::at(
            format!("the duplicate \"{}\" variable", name),
            d,
        ));
    }
    let var = cx.vars.define_set(name);
    let value = cx.template(arg(d, 1), d)?;
    l.modules.rewrite.ops.push(Op::Set { var, value });
    Ok(())
}

fn set_break(l: &mut LocConf, _d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    l.modules.rewrite.ops.push(Op::Break);
    Ok(())
}

macro_rules! flag_setter {
    ($f:ident, $field:ident) => {
        fn $f(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
            let v = flag(d)?;
            set_once(&mut l.modules.rewrite.$field, v, d)
        }
    };
}
flag_setter!(set_rewrite_log, rewrite_log);
flag_setter!(set_uninit_warn, uninitialized_variable_warn);
flag_setter!(set_absolute_redirect, absolute_redirect);
flag_setter!(set_port_in_redirect, port_in_redirect);
flag_setter!(set_server_name_in_redirect, server_name_in_redirect);

fn compile_regex(d: &Directive, r: &str, caseless: bool, cx: &mut Compiler) -> ConfResult<Regex> {
    let re = Regex::compile(d, r, caseless)?;
    // Named captures become variables, as with PCRE in nginx.
    for name in re.names() {
        cx.vars.define(name);
    }
    Ok(re)
}

/// A rewrite's replacement. When the request's path came escaped (`%`) or
/// with `+` (nginx's `quoted_uri`, `plus_in_uri`), a capture copied into
/// the arguments part (after a literal `?`) is escaped as nginx's
/// `NGX_ESCAPE_ARGS` does, since the captures hold the unescaped URI.
fn render_replacement(cx: &Ctx<'_>, to: &Template) -> Vec<u8> {
    let raw = cx.req.raw_uri();
    let path = raw.split(|&b| b == b'?').next().unwrap_or(b"");
    if !path.iter().any(|&b| b == b'%' || b == b'+') {
        return to.render_vec(cx);
    }
    let mut out = Vec::new();
    let mut in_args = false;
    for p in &to.parts {
        match p {
            Part::Lit(l) => {
                in_args |= l.contains(&b'?');
                out.extend_from_slice(l);
            }
            Part::Var(v @ Var::Capture(_)) if in_args => {
                let mut cap = Vec::new();
                cx.var(v, &mut cap);
                escape_args(&cap, &mut out);
            }
            Part::Var(v) => {
                cx.var(v, &mut out);
            }
        }
    }
    out
}

/// nginx's `NGX_ESCAPE_ARGS`: controls, space, `#`, `%`, `&`, `+`, `;`,
/// `?` and non-ASCII bytes, upper-case hex.
fn escape_args(s: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in s {
        if !(0x21..0x7f).contains(&b) || matches!(b, b'#' | b'%' | b'&' | b'+' | b';' | b'?') {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        } else {
            out.push(b);
        }
    }
}

/// nginx unescapes a rewrite's redirect target (`NGX_UNESCAPE_REDIRECT`)
/// up to its first literal `?`: `%XX` becomes the byte when that is
/// printable and above `%` (so `%0D%0A`, `%20` and `%25` stay escaped).
/// A `%` not followed by two hex digits is dropped with the digits read so
/// far, as nginx's state machine does.
fn unescape_redirect(t: &mut Vec<u8>) {
    fn hex(c: u8) -> Option<u8> {
        (c as char).to_digit(16).map(|d| d as u8)
    }
    let end = t.iter().position(|&b| b == b'?').unwrap_or(t.len());
    if !t[..end].contains(&b'%') {
        return;
    }
    let mut out = Vec::with_capacity(t.len());
    let mut i = 0;
    while i < end {
        let b = t[i];
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        match (
            t.get(i + 1).filter(|_| i + 1 < end),
            t.get(i + 2).filter(|_| i + 2 < end),
        ) {
            (Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let c = (hex(h).unwrap_or(0) << 4) | hex(l).unwrap_or(0);
                if c > b'%' && c < 0x7f {
                    out.push(c);
                } else {
                    out.extend_from_slice(&t[i..i + 3]);
                }
                i += 3;
            }
            // "%" then a non-hex byte: both go, the byte is kept.
            (Some(&h), _) if hex(h).is_none() => {
                out.push(h);
                i += 2;
            }
            // "%H" then a non-hex byte: "%H" goes, the byte is kept.
            (Some(_), Some(&l)) => {
                out.push(l);
                i += 3;
            }
            _ => i = end,
        }
    }
    out.extend_from_slice(&t[end..]);
    *t = out;
}

/// Records a regex match: numbered captures for `$1`.., named ones in their variables.
fn record_captures(cx: &mut Ctx<'_>, re: &Regex, c: Vec<Option<(usize, usize)>>, src: &[u8]) {
    cx.captures = c;
    cx.capture_src = src.to_vec();
    let caps = std::mem::take(&mut cx.captures);
    crate::http::phases::set_named_captures(cx, re.capture_names(), &caps, src);
    cx.captures = caps;
}

/// Parses an `if (...)` condition from the directive's arguments.
fn parse_cond(d: &Directive, cx: &mut Compiler) -> ConfResult<Cond> {
    let mut args: Vec<String> = d.args.iter().map(|a| a.value.clone()).collect();
    // An empty quoted operand (`if ($x = "")`) is an argument; a lone
    // `(` or `)` is not.
    let quoted: Vec<bool> = d.args.iter().map(|a| a.quoted).collect();
    let bad = || {
        ConfError::at(
            format!(
                "invalid condition \"{}\"",
                d.args
                    .iter()
                    .map(|a| a.value.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            d,
        )
    };
    match args.first_mut() {
        Some(f) if f.starts_with('(') => {
            f.remove(0);
        }
        _ => return Err(bad()),
    }
    match args.last_mut() {
        Some(l) if l.ends_with(')') => {
            l.pop();
        }
        _ => return Err(bad()),
    }
    let mut i = 0;
    args.retain(|a| {
        i += 1;
        !a.is_empty() || quoted.get(i - 1).copied().unwrap_or(false)
    });
    match args.as_slice() {
        [v] if v.starts_with('$') => Ok(Cond::Var(cx.template(v, d)?)),
        [a, op, b] if op == "=" || op == "!=" => Ok(Cond::Eq {
            a: cx.template(a, d)?,
            b: cx.template(b, d)?,
            negate: op == "!=",
        }),
        [a, op, r] if matches!(op.as_str(), "~" | "~*" | "!~" | "!~*") => Ok(Cond::Match {
            a: cx.template(a, d)?,
            re: compile_regex(d, r, op.ends_with('*'), cx)?,
            negate: op.starts_with('!'),
        }),
        [op, p]
            if matches!(
                op.as_str(),
                "-f" | "-d" | "-e" | "-x" | "!-f" | "!-d" | "!-e" | "!-x"
            ) =>
        {
            Ok(Cond::File {
                path: cx.template(p, d)?,
                test: op.as_bytes()[op.len() - 1],
                negate: op.starts_with('!'),
            })
        }
        _ => Err(bad()),
    }
}

/// Compiles an `if` block (server or location level).
pub fn compile_if(
    d: &Directive,
    cx: &mut Compiler,
    hm: &mut crate::http::conf::HttpMain,
    parent: &mut LocConf,
    in_server: bool,
) -> ConfResult<()> {
    let cond = parse_cond(d, cx)?;
    let mut raw = LocConf::default();
    let here = if in_server { ctx::SIF } else { ctx::LIF };
    for k in d.block.as_deref().unwrap_or(&[]) {
        let spec = crate::core::conf::lookup(k, here)?;
        match spec.set {
            Setter::Block if k.name == "if" => compile_if(k, cx, hm, &mut raw, in_server)?,
            _ => crate::http::conf::apply(cx, hm, None, &mut raw, k, &spec)?,
        }
    }
    super::proxy::check_no_uri_part(&raw, d.block.as_deref().unwrap_or(&[]))?;
    parent.modules.rewrite.ops.push(Op::If {
        cond,
        raw: Box::new(raw),
        conf: None,
    });
    Ok(())
}

const RW: u32 = ctx::SRV | ctx::LOC | ctx::SIF | ctx::LIF;
const HSLI: u32 = ctx::HSL | ctx::SIF | ctx::LIF;

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "return",
        ctx: RW,
        args: Args::take12(),
        set: Setter::Loc(set_return),
    },
    Spec {
        name: "rewrite",
        ctx: RW,
        args: Args::take23(),
        set: Setter::Loc(set_rewrite),
    },
    Spec {
        name: "set",
        ctx: RW,
        args: Args::take(2),
        set: Setter::Loc(set_set),
    },
    Spec {
        name: "break",
        ctx: RW,
        args: Args::take(0),
        set: Setter::Loc(set_break),
    },
    Spec {
        name: "if",
        ctx: ctx::SRV | ctx::LOC | ctx::SIF | ctx::LIF,
        args: Args::AtLeast(1),
        set: Setter::Block,
    },
    Spec {
        name: "rewrite_log",
        ctx: HSLI,
        args: Args::Flag,
        set: Setter::Loc(set_rewrite_log),
    },
    Spec {
        name: "uninitialized_variable_warn",
        ctx: HSLI,
        args: Args::Flag,
        set: Setter::Loc(set_uninit_warn),
    },
    Spec {
        name: "absolute_redirect",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_absolute_redirect),
    },
    Spec {
        name: "port_in_redirect",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_port_in_redirect),
    },
    Spec {
        name: "server_name_in_redirect",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_server_name_in_redirect),
    },
];

/// The note holding the request's rate once `set $limit_rate` or an
/// upstream's `X-Accel-Limit-Rate` gave one (bytes per second).
pub const LIMIT_RATE: &str = "limit_rate";

pub const VARS: &[&str] = &["limit_rate"];

/// `$limit_rate`: the rate set for this request, as nginx prints it: 0
/// until `set` or `X-Accel-Limit-Rate` sets one, or until the head goes
/// out, when the location's `limit_rate` (evaluated, if it has variables)
/// becomes the request's rate (see `phases::finish`).
pub fn limit_rate_var(cx: &Ctx<'_>, _id: u8, out: &mut Vec<u8>) -> bool {
    match cx.note(LIMIT_RATE) {
        Some(v) => out.extend_from_slice(v),
        None => out.push(b'0'),
    }
    true
}

/// The rate this request's response is paced by, when it overrides the
/// location's `limit_rate`.
pub fn limit_rate_override(cx: &Ctx<'_>) -> Option<u64> {
    cx.note(LIMIT_RATE)
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::unescape_redirect;

    fn un(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        unescape_redirect(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    }

    #[test]
    fn redirect_unescaping_as_nginx() {
        assert_eq!(
            un("http%3A%2F%2Fexample.com%2F%3Ffrom"),
            "http://example.com/?from"
        );
        assert_eq!(
            un("http%3A%2F%2Fexample.com%0D%0Asplit"),
            "http://example.com%0D%0Asplit"
        );
        assert_eq!(un("/a%20b%25c"), "/a%20b%25c");
        assert_eq!(un("/a?b=%2F"), "/a?b=%2F");
        assert_eq!(un("/a%zz"), "/azz");
        assert_eq!(un("/a%2zb"), "/azb");
        assert_eq!(un("/a%2"), "/a");
    }
}
