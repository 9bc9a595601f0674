//! `ssi` and its directives: server-side includes in response bodies
//! (nginx's `ngx_http_ssi_filter_module`).
//!
//! Data flow: once a response is decided (error pages applied, before
//! the addition module and the header filters), [`apply`] looks at a
//! response of a location with `ssi on` whose type is in `ssi_types`
//! (`text/html` always is) and whose body is not known to be empty. For
//! the client's request it clears Content-Length and Accept-Ranges, and
//! Last-Modified and ETag unless `ssi_last_modified on` (then the ETag
//! turns weak), as nginx's header filter does. Unless the request is
//! HEAD, the body is then read whole (tern's difference: nginx streams
//! it; see DIFFERENCES.md), and the commands (`<!--#cmd param="v" -->`)
//! run in order, each one's output taking its place:
//!
//! ```text
//! body ── parse ──> text | command
//!   echo var= default= encoding=   value of an SSI or nginx variable
//!   set var= value=                an SSI variable (seen by includes too)
//!   include virtual=|file= stub= set= wait=
//!                                  a subrequest (GET, the request's body
//!                                  shared), its body SSI-processed in
//!                                  turn, then put in place, kept in a
//!                                  variable (set=), or the stub block on
//!                                  an error or an empty answer
//!   config errmsg= timefmt=        error text, $date_local/$date_gmt format
//!   block name= ... endblock       a stub, not output
//!   if expr= / elif / else / endif one level, as nginx (no nesting)
//! ```
//!
//! The includes of a document run at once, as nginx's subrequests do:
//! an include starts its subrequest and the commands after it go on
//! (an `echo` after it does not see what it sets), while the output keeps
//! the document's order; an include with `wait="yes"` or `set=` waits
//! until it (and those before it) are done before the next command runs.
//! An included answer is read whole (as before), so what is held is what
//! the page's output holds anyway; nginx holds the answers that finish
//! before the ones ahead of them the same way (its postpone filter). Each
//! include's subrequest starts with a copy of the request's variables and
//! gives back what it changed when it ends ([`crate::http::subrequest`]).
//! The SSI variables (and the captures an `if` regex sets)
//! live for the whole client request, shared with the included
//! documents, as in nginx. A command that fails outputs the `errmsg`
//! (`[an error occurred while processing the directive]`) unless
//! `ssi_silent_errors on`, and logs the reason.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use crate::config::registry::{arg, ctx, flag, set_once, size_arg, Args, Setter, Spec};
use crate::config::{value, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::core::regex::Regex;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::{Body, Piece, Response};
use crate::http::vars::{Var, VarCtx};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "ssi",
        ctx: ctx::HSL | ctx::LIF | ctx::SIF,
        args: Args::Flag,
        set: Setter::Loc(set_flag),
    },
    Spec {
        name: "ssi_silent_errors",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_flag),
    },
    Spec {
        name: "ssi_ignore_recycled_buffers",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_flag),
    },
    Spec {
        name: "ssi_last_modified",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_flag),
    },
    Spec {
        name: "ssi_min_file_chunk",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_min_file_chunk),
    },
    Spec {
        name: "ssi_value_length",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_value_length),
    },
    Spec {
        name: "ssi_types",
        ctx: ctx::HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_types),
    },
];

/// Variables the module provides (`$date_local`, `$date_gmt`).
pub const VARS: &[&str] = &["date_local", "date_gmt"];

/// nginx's default `timefmt`.
const DEFAULT_TIMEFMT: &str = "%A, %d-%b-%Y %H:%M:%S %Z";
const DEFAULT_ERRMSG: &[u8] = b"[an error occurred while processing the directive]";
/// nginx's NGX_HTTP_SSI_COMMAND_LEN and NGX_HTTP_SSI_PARAM_LEN.
const NAME_LEN: usize = 32;
/// nginx's NGX_HTTP_SSI_MAX_PARAMS.
const MAX_PARAMS: usize = 16;

#[derive(Debug, Clone, Default)]
pub struct SsiLoc {
    pub enable: Option<bool>,
    pub silent_errors: Option<bool>,
    pub ignore_recycled_buffers: Option<bool>,
    pub last_modified: Option<bool>,
    pub min_file_chunk: Option<u64>,
    pub value_length: Option<usize>,
    /// `Some(None)`: `*`; else lowercase types (text/html always matches).
    pub types: Option<Option<Arc<Vec<String>>>>,
}

impl SsiLoc {
    pub fn merge(&mut self, p: &SsiLoc) {
        if self.enable.is_none() {
            self.enable = p.enable;
        }
        if self.silent_errors.is_none() {
            self.silent_errors = p.silent_errors;
        }
        if self.ignore_recycled_buffers.is_none() {
            self.ignore_recycled_buffers = p.ignore_recycled_buffers;
        }
        if self.last_modified.is_none() {
            self.last_modified = p.last_modified;
        }
        if self.min_file_chunk.is_none() {
            self.min_file_chunk = p.min_file_chunk;
        }
        if self.value_length.is_none() {
            self.value_length = p.value_length;
        }
        if self.types.is_none() {
            self.types = p.types.clone();
        }
    }

    fn type_matches(&self, content_type: Option<&str>) -> bool {
        let t = content_type
            .and_then(|ct| ct.split(';').next())
            .unwrap_or("")
            .trim();
        if t.eq_ignore_ascii_case("text/html") {
            return true;
        }
        match &self.types {
            Some(None) => true,
            Some(Some(list)) => list.iter().any(|x| x.eq_ignore_ascii_case(t)),
            None => false,
        }
    }
}

fn set_flag(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    let s = &mut l.modules.ssi;
    let slot = match d.name.as_str() {
        "ssi" => &mut s.enable,
        "ssi_silent_errors" => &mut s.silent_errors,
        "ssi_ignore_recycled_buffers" => &mut s.ignore_recycled_buffers,
        _ => &mut s.last_modified,
    };
    set_once(slot, v, d)
}

fn set_min_file_chunk(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = size_arg(d, 0)?;
    set_once(&mut l.modules.ssi.min_file_chunk, v, d)
}

fn set_value_length(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v =
        value::number(arg(d, 0)).ok_or_else(|| crate::config::registry::slot_invalid_number(d))?;
    set_once(&mut l.modules.ssi.value_length, v as usize, d)
}

fn set_types(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let s = &mut l.modules.ssi;
    if s.types.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let mut list = Vec::new();
    for a in &d.args {
        if a.value == "*" {
            s.types = Some(None);
            return Ok(());
        }
        list.push(a.value.to_ascii_lowercase());
    }
    s.types = Some(Some(Arc::new(list)));
    Ok(())
}

/// The state one client request's SSI processing shares with the
/// documents it includes (nginx keeps it in the main request's context).
/// Included documents are processed at once, so it sits in cells,
/// borrowed only between awaits.
#[derive(Debug, Default)]
struct Shared {
    /// `set` variables and `if` captures, by lowercase name.
    vars: RefCell<HashMap<Vec<u8>, Vec<u8>>>,
    /// An included answer broke a limit that ends the whole request
    /// (nginx finalizes it with an error: the client gets no answer).
    failed: Cell<bool>,
}

/// One document's settings (`config` changes them for the rest of it).
struct Doc {
    errmsg: Vec<u8>,
    timefmt: String,
    /// `block` contents, by name.
    blocks: HashMap<Vec<u8>, Vec<Token>>,
    silent: bool,
    value_len: usize,
}

/// Runs the SSI commands of a response's body (see the module docs).
pub async fn apply(cx: &mut Ctx<'_>, resp: &mut Response) {
    // The common case returns here without touching anything shared.
    if cx.loc.modules.ssi.enable != Some(true) || cx.sub_depth > 0 {
        return;
    }
    let shared = Shared::default();
    process(cx, resp, &shared).await;
}

/// Whether this response is one SSI applies to; for the client's
/// request, its headers are changed as nginx's header filter does.
fn takes(cx: &Ctx<'_>, resp: &mut Response) -> bool {
    let conf = &cx.loc.modules.ssi;
    if conf.enable != Some(true)
        || resp.content_length == Some(0)
        || matches!(resp.body, Body::Empty)
        || !conf.type_matches(resp.content_type.as_deref())
    {
        return false;
    }
    if cx.sub_depth == 0 {
        resp.content_length = None;
        resp.remove_header("Content-Length");
        resp.remove_header("Accept-Ranges");
        resp.ranges_off = true;
        if conf.last_modified == Some(true) {
            super::gzip::weaken_etag(resp);
        } else {
            resp.last_modified = None;
            resp.remove_header("Last-Modified");
            resp.remove_header("ETag");
        }
        if cx.req.minor == 0 {
            resp.force_close = true;
        }
    }
    true
}

/// SSI over one response (the client's or an included one).
async fn process(cx: &mut Ctx<'_>, resp: &mut Response, shared: &Shared) {
    if !takes(cx, resp) {
        return;
    }
    if cx.method == Method::Head || cx.req.method == Method::Head {
        return;
    }
    let policy = resp.io.take().unwrap_or_default();
    let body = match read_all(std::mem::take(&mut resp.body), &policy).await {
        Ok(b) => b,
        Err(e) => {
            cx.log(
                Level::Error,
                &format!("ssi: reading the body failed: {}", e),
            );
            return;
        }
    };
    let conf = &cx.loc.modules.ssi;
    let mut doc = Doc {
        errmsg: DEFAULT_ERRMSG.to_vec(),
        timefmt: DEFAULT_TIMEFMT.to_string(),
        blocks: HashMap::new(),
        silent: conf.silent_errors == Some(true),
        value_len: conf.value_length.unwrap_or(256),
    };
    let tokens = parse(&body, doc.value_len);
    let mut out = Vec::with_capacity(body.len());
    run(cx, &tokens, &mut doc, shared, &mut out).await;
    if shared.failed.get() {
        resp.close_silently = true;
        return;
    }
    resp.body = Body::Bytes(out);
}

/// A body gathered into memory.
async fn read_all(body: Body, policy: &crate::io::Policy) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut pieces = Vec::new();
    match body {
        Body::Empty => {}
        Body::Bytes(b) => out = b,
        Body::Shared(b) => out = b.to_vec(),
        Body::File { file, offset, len } => pieces.push(Piece::File { file, offset, len }),
        Body::Multi(p) => pieces = p,
        Body::Stream(mut s) => {
            while let Some(b) = s.next().await? {
                out.extend_from_slice(&b);
            }
        }
    }
    for p in pieces {
        match p {
            Piece::Bytes(b) => out.extend_from_slice(&b),
            Piece::File { file, offset, len } => {
                let mut at = 0u64;
                while at < len {
                    let n = (len - at).min(1 << 16) as usize;
                    let data = crate::io::read(&file, offset + at, n, policy).await?;
                    if data.is_empty() {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "file was truncated",
                        ));
                    }
                    at += data.len() as u64;
                    out.extend_from_slice(&data);
                }
            }
        }
    }
    Ok(out)
}

/// A piece of a parsed document.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Text(Vec<u8>),
    /// A command: its name and parameters (lowercase names, values as
    /// written, quotes and escapes removed).
    Cmd(String, Vec<(String, Vec<u8>)>),
    /// A command that could not be parsed: the reason, for the log.
    Bad(String),
}

/// Splits a document into text and commands, as nginx's parser reads
/// `<!--#name param="value" ... -->`.
fn parse(b: &[u8], value_len: usize) -> Vec<Token> {
    let mut out = Vec::new();
    let mut text_from = 0;
    let mut i = 0;
    while let Some(off) = memchr::memmem::find(&b[i..], b"<!--#") {
        let start = i + off;
        let (tok, end) = match command(b, start + 5, value_len) {
            Some(x) => x,
            None => {
                // Unterminated: the rest is text, as nginx leaves it.
                break;
            }
        };
        if start > text_from {
            out.push(Token::Text(b[text_from..start].to_vec()));
        }
        out.push(tok);
        i = end;
        text_from = end;
    }
    if text_from < b.len() {
        out.push(Token::Text(b[text_from..].to_vec()));
    }
    out
}

/// One command from just after `<!--#`: the token and where the text
/// after its `-->` starts; None when no `-->` ends it.
fn command(b: &[u8], mut i: usize, value_len: usize) -> Option<(Token, usize)> {
    let close = |from: usize| memchr::memmem::find(&b[from..], b"-->").map(|o| from + o + 3);
    let bad = |why: String, from: usize| close(from).map(|e| (Token::Bad(why), e));
    // nginx lets blanks come between `<!--#` and the command's name.
    while matches!(b.get(i), Some(b' ' | b'\r' | b'\n' | b'\t')) {
        i += 1;
    }
    let name_end = b[i..]
        .iter()
        .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
        .map_or(b.len(), |p| i + p);
    if name_end == i {
        return bad("invalid SSI command".into(), i);
    }
    if name_end - i > NAME_LEN {
        return bad(
            format!(
                "the \"{}\" SSI command is longer than {} characters",
                String::from_utf8_lossy(&b[i..name_end]),
                NAME_LEN
            ),
            i,
        );
    }
    let name = String::from_utf8_lossy(&b[i..name_end]).to_ascii_lowercase();
    i = name_end;
    let mut params: Vec<(String, Vec<u8>)> = Vec::new();
    loop {
        while b.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
            i += 1;
        }
        if b.get(i..i + 3) == Some(b"-->") {
            return Some((Token::Cmd(name, params), i + 3));
        }
        let p_end = b[i..]
            .iter()
            .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-'))
            .map_or(b.len(), |p| i + p);
        if p_end == i || b.get(p_end) != Some(&b'=') {
            return bad(format!("invalid parameter in \"{}\" SSI command", name), i);
        }
        if p_end - i > NAME_LEN {
            return bad(format!("too long \"{}\" SSI command parameter", name), i);
        }
        let pname = String::from_utf8_lossy(&b[i..p_end]).to_ascii_lowercase();
        i = p_end + 1;
        let quote = match b.get(i) {
            Some(&q) if q == b'"' || q == b'\'' => q,
            _ => {
                return bad(
                    format!(
                        "invalid \"{}\" parameter in \"{}\" SSI command",
                        pname, name
                    ),
                    i,
                )
            }
        };
        i += 1;
        let mut v = Vec::new();
        loop {
            let c = *b.get(i)?;
            i += 1;
            if c == quote {
                break;
            }
            if c == b'\\' {
                // `\"` is the quote; any other escaped character keeps its
                // backslash (the value's own evaluation reads it).
                let n = *b.get(i)?;
                if n == quote {
                    v.push(n);
                    i += 1;
                    continue;
                }
            }
            v.push(c);
        }
        if v.len() > value_len {
            return bad(
                format!(
                    "too long \"{}\" value of \"{}\" parameter in \"{}\" SSI command",
                    String::from_utf8_lossy(&v),
                    pname,
                    name
                ),
                i,
            );
        }
        if params.iter().any(|(n, _)| *n == pname) {
            return bad(
                format!(
                    "duplicate \"{}\" parameter in \"{}\" SSI command",
                    pname, name
                ),
                i,
            );
        }
        if params.len() >= MAX_PARAMS {
            return bad(format!("too many SSI command parameters: \"{}\"", name), i);
        }
        params.push((pname, v));
    }
}

/// Where an `if` chain stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cond {
    /// Outside any `if`.
    None,
    /// In a branch being output.
    Taken,
    /// In a branch skipped, a later one may still be taken.
    Waiting,
    /// A branch was taken; the rest are skipped.
    Done,
}

/// A piece of a document's output: ready, or an include still running.
enum Part<'f> {
    Ready(Vec<u8>),
    Running(Pin<Box<dyn Future<Output = Vec<u8>> + 'f>>),
}

/// Runs the includes among `parts` at once until every one is done.
async fn settle(parts: &mut [Part<'_>]) {
    std::future::poll_fn(|c| {
        let mut pending = false;
        for p in parts.iter_mut() {
            let Part::Running(f) = p else { continue };
            match f.as_mut().poll(c) {
                Poll::Ready(b) => *p = Part::Ready(b),
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await
}

/// Waits for the includes among `parts`, then puts their output, in the
/// document's order, before what `out` holds.
async fn gather(parts: &mut Vec<Part<'_>>, out: &mut Vec<u8>) {
    if parts.is_empty() {
        return;
    }
    settle(parts).await;
    let tail = std::mem::take(out);
    for p in parts.drain(..) {
        if let Part::Ready(b) = p {
            out.extend_from_slice(&b);
        }
    }
    out.extend_from_slice(&tail);
}

/// Runs a document's tokens, appending the output.
fn run<'f, 'a: 'f>(
    cx: &'f Ctx<'a>,
    tokens: &'f [Token],
    doc: &'f mut Doc,
    shared: &'f Shared,
    out: &'f mut Vec<u8>,
) -> Pin<Box<dyn Future<Output = ()> + 'f>> {
    Box::pin(async move {
        // What came before the includes still running, and those, in order.
        let mut parts: Vec<Part<'f>> = Vec::new();
        let mut cond = Cond::None;
        let mut i = 0;
        while i < tokens.len() && !shared.failed.get() {
            let t = &tokens[i];
            i += 1;
            let skipping = matches!(cond, Cond::Waiting | Cond::Done);
            match t {
                Token::Text(x) => {
                    if !skipping {
                        out.extend_from_slice(x);
                    }
                }
                Token::Bad(why) => {
                    if !skipping {
                        error(cx, doc, out, why);
                    }
                }
                Token::Cmd(name, params) => match name.as_str() {
                    "if" => {
                        if cond != Cond::None {
                            error(cx, doc, out, "the \"if\" command inside the \"if\" command");
                            continue;
                        }
                        cond = match eval_cond(cx, doc, shared, params) {
                            Ok(true) => Cond::Taken,
                            Ok(false) => Cond::Waiting,
                            Err(why) => {
                                error(cx, doc, out, &why);
                                Cond::Done
                            }
                        };
                    }
                    "elif" => {
                        cond = match cond {
                            Cond::None => {
                                error(
                                    cx,
                                    doc,
                                    out,
                                    "the \"elif\" command without the \"if\" command",
                                );
                                Cond::None
                            }
                            Cond::Taken | Cond::Done => Cond::Done,
                            Cond::Waiting => match eval_cond(cx, doc, shared, params) {
                                Ok(true) => Cond::Taken,
                                Ok(false) => Cond::Waiting,
                                Err(why) => {
                                    error(cx, doc, out, &why);
                                    Cond::Done
                                }
                            },
                        };
                    }
                    "else" => {
                        cond = match cond {
                            Cond::None => {
                                error(
                                    cx,
                                    doc,
                                    out,
                                    "the \"else\" command without the \"if\" command",
                                );
                                Cond::None
                            }
                            Cond::Waiting => Cond::Taken,
                            _ => Cond::Done,
                        };
                    }
                    "endif" => {
                        if cond == Cond::None {
                            error(
                                cx,
                                doc,
                                out,
                                "the \"endif\" command without the \"if\" command",
                            );
                        }
                        cond = Cond::None;
                    }
                    _ if skipping => {
                        // A block in a skipped branch is skipped whole.
                        if name == "block" {
                            i = block_end(tokens, i).1;
                        }
                    }
                    "block" => {
                        let (end, next) = block_end(tokens, i);
                        let body = tokens[i..end].to_vec();
                        match param(params, "name") {
                            Some(n) => {
                                doc.blocks.insert(n.to_vec(), body);
                            }
                            None => error(
                                cx,
                                doc,
                                out,
                                "no parameter \"name\" in \"block\" SSI command",
                            ),
                        }
                        i = next;
                    }
                    "endblock" => {
                        error(
                            cx,
                            doc,
                            out,
                            "the \"endblock\" command without the \"block\" command",
                        );
                    }
                    "echo" => echo(cx, doc, shared, params, out),
                    "set" => set(cx, doc, shared, params, out),
                    "config" => {
                        if let Some(m) = param(params, "errmsg") {
                            doc.errmsg = m.to_vec();
                        }
                        if let Some(f) = param(params, "timefmt") {
                            doc.timefmt = String::from_utf8_lossy(f).into_owned();
                        }
                    }
                    "include" => {
                        if let Some(inc) = include(cx, doc, shared, params, out) {
                            let waits = inc.waits();
                            parts.push(Part::Ready(std::mem::take(out)));
                            parts.push(Part::Running(Box::pin(included(cx, shared, inc))));
                            if waits {
                                gather(&mut parts, out).await;
                            }
                        }
                    }
                    other => {
                        let why = format!("unknown SSI command \"{}\"", other);
                        error(cx, doc, out, &why);
                    }
                },
            }
        }
        gather(&mut parts, out).await;
    })
}

/// Where the contents of a block starting at `from` end (its
/// `endblock`, or the end of the document), and where the text after it
/// starts.
fn block_end(tokens: &[Token], from: usize) -> (usize, usize) {
    match tokens[from..]
        .iter()
        .position(|t| matches!(t, Token::Cmd(n, _) if n == "endblock"))
    {
        Some(p) => (from + p, from + p + 1),
        None => (tokens.len(), tokens.len()),
    }
}

fn param<'p>(params: &'p [(String, Vec<u8>)], name: &str) -> Option<&'p [u8]> {
    params
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_slice())
}

/// A failed command: logged, and the `errmsg` output unless silent.
fn error(cx: &Ctx<'_>, doc: &Doc, out: &mut Vec<u8>, why: &str) {
    cx.log(Level::Error, why);
    if !doc.silent {
        out.extend_from_slice(&doc.errmsg);
    }
}

/// The value of a variable as SSI sees it: an SSI variable, `$date_*`
/// in the document's format, else nginx's variable of that name.
fn var(cx: &Ctx<'_>, doc: &Doc, shared: &Shared, name: &[u8]) -> Option<Vec<u8>> {
    let lower = name.to_ascii_lowercase();
    if let Some(v) = shared.vars.borrow().get(&lower) {
        return Some(v.clone());
    }
    let name = std::str::from_utf8(&lower).ok()?;
    match name {
        "date_local" => return Some(strftime(&doc.timefmt, false)),
        "date_gmt" => return Some(strftime(&doc.timefmt, true)),
        _ => {}
    }
    let vars = &cx.http.main.vars;
    let v = match vars.lookup(name) {
        Some(Var::User(i)) => {
            let set_here = matches!(cx.user_vars.borrow().get(i), Some(Some(_)));
            if !set_here && vars.def(i).is_none() {
                // Declared by `set` somewhere else: the prefix variable of
                // that name (`$http_*`...) answers, as in nginx.
                prefix_var(name)?
            } else {
                Var::User(i)
            }
        }
        Some(v) => v,
        None => prefix_var(name)?,
    };
    let mut out = Vec::new();
    cx.var(&v, &mut out).then_some(out)
}

/// A builtin or prefix variable (`$http_*`, `$arg_*`...) of that name.
fn prefix_var(name: &str) -> Option<Var> {
    match crate::http::vars::VarTable::default().resolve(name) {
        Var::User(_) => None,
        v => Some(v),
    }
}

/// A parameter value with `$name`, `${name}` and `\` escapes evaluated.
fn evaluate(cx: &Ctx<'_>, doc: &Doc, shared: &Shared, s: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == b'\\' {
            match s.get(i + 1) {
                Some(&n) => {
                    out.push(n);
                    i += 2;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
            continue;
        }
        if c != b'$' {
            out.push(c);
            i += 1;
            continue;
        }
        i += 1;
        let (name, next) = if s.get(i) == Some(&b'{') {
            let Some(close) = s[i..].iter().position(|&x| x == b'}') else {
                return Err(format!(
                    "the closing bracket in \"{}\" variable is missing",
                    String::from_utf8_lossy(&s[i + 1..])
                ));
            };
            (&s[i + 1..i + close], i + close + 1)
        } else {
            let end = s[i..]
                .iter()
                .position(|x| !(x.is_ascii_alphanumeric() || *x == b'_'))
                .map_or(s.len(), |p| i + p);
            (&s[i..end], end)
        };
        if name.is_empty() {
            return Err(format!(
                "invalid variable name in \"{}\"",
                String::from_utf8_lossy(s)
            ));
        }
        if let Some(v) = var(cx, doc, shared, name) {
            out.extend_from_slice(&v);
        }
        i = next;
    }
    Ok(out)
}

fn echo(cx: &Ctx<'_>, doc: &Doc, shared: &Shared, params: &[(String, Vec<u8>)], out: &mut Vec<u8>) {
    let Some(name) = param(params, "var") else {
        error(cx, doc, out, "no parameter \"var\" in \"echo\" SSI command");
        return;
    };
    let value = match var(cx, doc, shared, name) {
        Some(v) => v,
        // nginx outputs `default` as written (no variables).
        None => param(params, "default").unwrap_or(b"(none)").to_vec(),
    };
    match param(params, "encoding") {
        None | Some(b"entity") => escape_html(&value, out),
        Some(b"none") => out.extend_from_slice(&value),
        Some(b"url") => escape_url(&value, out),
        Some(e) => {
            let why = format!(
                "unknown encoding \"{}\" in the \"echo\" command",
                String::from_utf8_lossy(e)
            );
            error(cx, doc, out, &why)
        }
    }
}

/// nginx's `ngx_escape_html`.
fn escape_html(v: &[u8], out: &mut Vec<u8>) {
    for &c in v {
        match c {
            b'<' => out.extend_from_slice(b"&lt;"),
            b'>' => out.extend_from_slice(b"&gt;"),
            b'&' => out.extend_from_slice(b"&amp;"),
            b'"' => out.extend_from_slice(b"&quot;"),
            _ => out.push(c),
        }
    }
}

/// nginx's `ngx_escape_uri` with NGX_ESCAPE_HTML: controls, space, `"`,
/// `#`, `%`, `'`, `<`, `>`, `?` and bytes above 0x7e as `%XX`.
fn escape_url(v: &[u8], out: &mut Vec<u8>) {
    for &c in v {
        if c <= 0x20 || c >= 0x7f || b"\"#%'<>?".contains(&c) {
            out.extend_from_slice(format!("%{:02X}", c).as_bytes());
        } else {
            out.push(c);
        }
    }
}

fn set(cx: &Ctx<'_>, doc: &Doc, shared: &Shared, params: &[(String, Vec<u8>)], out: &mut Vec<u8>) {
    let (Some(name), Some(value)) = (param(params, "var"), param(params, "value")) else {
        error(
            cx,
            doc,
            out,
            "no parameter \"var\" or \"value\" in \"set\" SSI command",
        );
        return;
    };
    match evaluate(cx, doc, shared, value) {
        Ok(v) => {
            shared
                .vars
                .borrow_mut()
                .insert(name.to_ascii_lowercase(), v);
        }
        Err(why) => error(cx, doc, out, &why),
    }
}

/// An `if`/`elif` condition: `$var` (true when not empty), `a = b`,
/// `a != b`, `a = /regex/`, `a != /regex/` (captures become variables).
fn eval_cond(
    cx: &Ctx<'_>,
    doc: &Doc,
    shared: &Shared,
    params: &[(String, Vec<u8>)],
) -> Result<bool, String> {
    let Some(expr) = param(params, "expr") else {
        return Err("no parameter \"expr\" in \"if\" SSI command".into());
    };
    let e = expr.trim_ascii();
    let mut negate = false;
    let mut e = e;
    if let Some(rest) = e.strip_prefix(b"!") {
        negate = true;
        e = rest.trim_ascii_start();
    }
    // The left side runs to a space or an operator (`=`, `!=`).
    let left_end = (0..e.len())
        .find(|&k| e[k] == b' ' || e[k] == b'=' || e[k..].starts_with(b"!="))
        .unwrap_or(e.len());
    let left = evaluate(cx, doc, shared, &e[..left_end])?;
    let rest = e[left_end..].trim_ascii_start();
    if rest.is_empty() {
        return Ok(left.is_empty() == negate);
    }
    let (noeq, right) = if let Some(r) = rest.strip_prefix(b"!=") {
        (true, r)
    } else if let Some(r) = rest.strip_prefix(b"=") {
        (false, r)
    } else {
        return Err(format!(
            "invalid expression in \"{}\"",
            String::from_utf8_lossy(expr)
        ));
    };
    let right = right.trim_ascii();
    let matched = if right.len() >= 2 && right[0] == b'/' && right[right.len() - 1] == b'/' {
        let pat = String::from_utf8_lossy(&right[1..right.len() - 1]).into_owned();
        let re = Regex::new(&pat, false)?;
        match re.captures(&left) {
            Some(caps) => {
                let mut vars = shared.vars.borrow_mut();
                for (n, c) in caps.iter().enumerate() {
                    if let Some((s, e)) = c {
                        vars.insert(n.to_string().into_bytes(), left[*s..*e].to_vec());
                    }
                }
                for (n, name) in re.capture_names().iter().enumerate() {
                    if let (Some(name), Some(Some((s, e)))) = (name, caps.get(n)) {
                        vars.insert(
                            name.to_ascii_lowercase().into_bytes(),
                            left[*s..*e].to_vec(),
                        );
                    }
                }
                true
            }
            None => false,
        }
    } else {
        left == evaluate(cx, doc, shared, right)?
    };
    Ok((matched != noeq) != negate)
}

/// An include whose subrequest is made: what [`included`] needs to run
/// it and put its answer in place.
struct Include<'a> {
    sub: Ctx<'a>,
    /// The variables it started with (see `subrequest_alongside`).
    vars_before: Vec<Option<Vec<u8>>>,
    /// The `stub` block's tokens.
    stub: Option<Vec<Token>>,
    /// `set=`: the SSI variable the answer goes to.
    set_var: Option<Vec<u8>>,
    wait: bool,
    /// The document's settings at the include (errors, the stub's run).
    doc: Doc,
}

impl Include<'_> {
    /// Whether the document waits for it (`wait="yes"`, or `set=`, which
    /// nginx waits for too) before its next command.
    fn waits(&self) -> bool {
        self.wait || self.set_var.is_some()
    }
}

/// `include virtual="URI"` / `file="URI"`: its parameters checked and its
/// subrequest made (None: the error is in `out`); [`included`] runs it.
fn include<'a>(
    cx: &Ctx<'a>,
    doc: &Doc,
    shared: &Shared,
    params: &[(String, Vec<u8>)],
    out: &mut Vec<u8>,
) -> Option<Include<'a>> {
    let (virt, file) = (param(params, "virtual"), param(params, "file"));
    let target = match (virt, file) {
        (Some(v), Some(f)) => {
            let why = format!(
                "inclusion may be either virtual=\"{}\" or file=\"{}\"",
                String::from_utf8_lossy(v),
                String::from_utf8_lossy(f)
            );
            error(cx, doc, out, &why);
            return None;
        }
        (Some(v), None) | (None, Some(v)) => v,
        (None, None) => {
            error(cx, doc, out, "no parameter in \"include\" SSI command");
            return None;
        }
    };
    let stub_name = param(params, "stub");
    let set_var = param(params, "set").map(<[u8]>::to_ascii_lowercase);
    let wait = match param(params, "wait") {
        None => false,
        Some(w) if w.eq_ignore_ascii_case(b"no") => false,
        Some(w) if w.eq_ignore_ascii_case(b"yes") => true,
        Some(w) => {
            let why = format!(
                "invalid value \"{}\" for the \"wait\" parameter",
                String::from_utf8_lossy(w)
            );
            error(cx, doc, out, &why);
            return None;
        }
    };
    let stub = match stub_name {
        Some(s) => match doc.blocks.get(s) {
            Some(t) => Some(t.clone()),
            None => {
                let why = format!(
                    "\"{}\" SSI block is not defined",
                    String::from_utf8_lossy(s)
                );
                error(cx, doc, out, &why);
                return None;
            }
        },
        None => None,
    };
    let uri = match evaluate(cx, doc, shared, target) {
        Ok(u) => u,
        Err(why) => {
            error(cx, doc, out, &why);
            return None;
        }
    };
    let (path, args) = match memchr::memchr(b'?', &uri) {
        Some(q) => (uri[..q].to_vec(), Some(uri[q + 1..].to_vec())),
        None => (uri, None),
    };
    // A relative URI is relative to the document's directory.
    let path = if path.first() == Some(&b'/') {
        path
    } else {
        let base = match memchr::memrchr(b'/', &cx.uri) {
            Some(p) => cx.uri[..=p].to_vec(),
            None => b"/".to_vec(),
        };
        [base, path].concat()
    };
    let path = match crate::http::uri::normalize_path(&path, false) {
        Ok(p) => p,
        Err(_) => {
            let why = format!(
                "unsafe URI \"{}\" was detected",
                String::from_utf8_lossy(&path)
            );
            error(cx, doc, out, &why);
            return None;
        }
    };
    let Some((sub, vars_before)) = cx.subrequest_alongside(path, args, Method::Get, true) else {
        error(cx, doc, out, "subrequest failed");
        return None;
    };
    // The stub's blocks go with it; otherwise only the settings count.
    let doc = Doc {
        errmsg: doc.errmsg.clone(),
        timefmt: doc.timefmt.clone(),
        blocks: if stub.is_some() {
            doc.blocks.clone()
        } else {
            HashMap::new()
        },
        silent: doc.silent,
        value_len: doc.value_len,
    };
    Some(Include {
        sub,
        vars_before,
        stub,
        set_var,
        wait,
        doc,
    })
}

/// Runs an include's subrequest: its answer (SSI-processed in turn), the
/// stub block instead of an error page or nothing, or nothing when the
/// answer went to a variable (`set=`).
async fn included<'a>(cx: &Ctx<'a>, shared: &Shared, inc: Include<'a>) -> Vec<u8> {
    let Include {
        mut sub,
        vars_before,
        stub,
        set_var,
        mut doc,
        ..
    } = inc;
    let mut out = Vec::new();
    let mut r = crate::http::subrequest::run(&mut sub).await;
    // nginx's gunzip filter always inflates a subrequest's answer (its
    // bytes go inside the page, whatever the client accepts).
    if sub.loc.modules.gzip_static.gunzip == Some(true)
        && r.header("Content-Encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case(b"gzip"))
    {
        r.remove_header("Content-Encoding");
        r.content_length = None;
        r.filters
            .insert(0, Box::new(super::gzip_static::Inflater::new()));
    }
    process(&mut sub, &mut r, shared).await;
    let policy = r.io.take().unwrap_or_default();
    let status = r.status;
    let body = match read_all(std::mem::take(&mut r.body), &policy).await {
        Ok(b) if !r.filters.is_empty() => {
            let mut out = Vec::with_capacity(b.len());
            crate::http::response::run_filters(&mut r.filters, &b, true, &mut out).map(|()| out)
        }
        other => other,
    };
    // An answer kept in a variable lives in memory: nginx bounds it with
    // the subrequest's `subrequest_output_buffer_size` and fails the
    // whole request past it.
    let limit = sub.loc.core.subrequest_output_buffer_size.unwrap_or(4096);
    if let (Some(_), Ok(b)) = (&set_var, &body) {
        if b.len() as u64 > limit {
            sub.log(
                Level::Error,
                &format!(
                    "too big subrequest response: {} while sending to client",
                    b.len()
                ),
            );
            crate::http::subrequest::finish_alongside(cx, sub, &vars_before);
            shared.failed.set(true);
            return out;
        }
    }
    crate::http::subrequest::finish_alongside(cx, sub, &vars_before);
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            let why = format!("ssi: reading the included body failed: {}", e);
            error(cx, &doc, &mut out, &why);
            return out;
        }
    };
    // nginx's stub: the block instead of an error page or nothing.
    if let Some(tokens) = stub {
        if status >= 300 || body.is_empty() {
            let mut stub_out = Vec::new();
            run(cx, &tokens, &mut doc, shared, &mut stub_out).await;
            match set_var {
                Some(v) => {
                    shared.vars.borrow_mut().insert(v, stub_out);
                }
                None => out.extend_from_slice(&stub_out),
            }
            return out;
        }
    }
    match set_var {
        Some(v) => {
            shared.vars.borrow_mut().insert(v, body);
        }
        None => out.extend_from_slice(&body),
    }
    out
}

/// `$date_local` / `$date_gmt` outside SSI: nginx's default format.
pub fn var_value(_cx: &Ctx<'_>, idx: u8, out: &mut Vec<u8>) -> bool {
    out.extend_from_slice(&strftime(DEFAULT_TIMEFMT, idx == 1));
    true
}

/// C's strftime for now, in UTC (`gmt`) or local time, for the
/// conversions SSI documents use.
fn strftime(fmt: &str, gmt: bool) -> Vec<u8> {
    let now = crate::http::date::now_secs();
    let tm = broken_down(now, gmt);
    let mut out = Vec::new();
    let mut it = fmt.bytes();
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let day = DAYS[tm.wday as usize % 7];
    let mon = MONTHS[(tm.mon as usize + 11) % 12];
    while let Some(c) = it.next() {
        if c != b'%' {
            out.push(c);
            continue;
        }
        let Some(f) = it.next() else {
            out.push(b'%');
            break;
        };
        let s = match f {
            b'a' => day[..3].to_string(),
            b'A' => day.to_string(),
            b'b' | b'h' => mon[..3].to_string(),
            b'B' => mon.to_string(),
            b'd' => format!("{:02}", tm.mday),
            b'e' => format!("{:2}", tm.mday),
            b'H' => format!("{:02}", tm.hour),
            b'I' => format!("{:02}", (tm.hour + 11) % 12 + 1),
            b'M' => format!("{:02}", tm.min),
            b'S' => format!("{:02}", tm.sec),
            b'm' => format!("{:02}", tm.mon),
            b'y' => format!("{:02}", tm.year.rem_euclid(100)),
            b'Y' => tm.year.to_string(),
            b'p' => if tm.hour < 12 { "AM" } else { "PM" }.to_string(),
            b'j' => format!("{:03}", tm.yday + 1),
            b'T' => format!("{:02}:{:02}:{:02}", tm.hour, tm.min, tm.sec),
            b'R' => format!("{:02}:{:02}", tm.hour, tm.min),
            b'D' => format!(
                "{:02}/{:02}/{:02}",
                tm.mon,
                tm.mday,
                tm.year.rem_euclid(100)
            ),
            b'F' => format!("{}-{:02}-{:02}", tm.year, tm.mon, tm.mday),
            b's' => now.to_string(),
            b'u' => (if tm.wday == 0 { 7 } else { tm.wday }).to_string(),
            b'w' => tm.wday.to_string(),
            b'z' => {
                let m = tm.gmtoff.unsigned_abs() / 60;
                format!(
                    "{}{:02}{:02}",
                    if tm.gmtoff < 0 { '-' } else { '+' },
                    m / 60,
                    m % 60
                )
            }
            b'Z' => {
                if gmt {
                    "GMT".to_string()
                } else {
                    tm.zone.clone()
                }
            }
            b'n' => "\n".to_string(),
            b't' => "\t".to_string(),
            b'%' => "%".to_string(),
            other => format!("%{}", other as char),
        };
        out.extend_from_slice(s.as_bytes());
    }
    out
}

/// A moment in UTC or local time, with what strftime needs.
struct Tm {
    year: i64,
    /// 1..=12
    mon: u32,
    mday: u32,
    hour: u32,
    min: u32,
    sec: u32,
    /// 0 = Sunday
    wday: u32,
    /// 0 = January 1st
    yday: u32,
    gmtoff: i64,
    zone: String,
}

fn broken_down(t: i64, gmt: bool) -> Tm {
    let tt = libc::time_t::try_from(t).unwrap_or(0);
    // SAFETY: gmtime_r/localtime_r only write the struct given; tm_zone
    // then points at a static string of the C library (or is null).
    let (tm, zone) = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        let r = if gmt {
            libc::gmtime_r(&tt, &mut tm)
        } else {
            libc::localtime_r(&tt, &mut tm)
        };
        if r.is_null() {
            tm = std::mem::zeroed();
            tm.tm_mday = 1;
            tm.tm_year = 70;
        }
        let zone = if tm.tm_zone.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(tm.tm_zone)
                .to_string_lossy()
                .into_owned()
        };
        (tm, zone)
    };
    let u = |v: libc::c_int| u32::try_from(v).unwrap_or(0);
    Tm {
        year: i64::from(tm.tm_year) + 1900,
        mon: u(tm.tm_mon) + 1,
        mday: u(tm.tm_mday),
        hour: u(tm.tm_hour),
        min: u(tm.tm_min),
        sec: u(tm.tm_sec),
        wday: u(tm.tm_wday),
        yday: u(tm.tm_yday),
        gmtoff: tm.tm_gmtoff,
        zone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_and_text() {
        let t = parse(
            b"a<!--#echo var=\"x\" --><!--#set var='v' value=\"q\\\"w\" -->b<!--#bad",
            256,
        );
        assert_eq!(
            t,
            vec![
                Token::Text(b"a".to_vec()),
                Token::Cmd("echo".into(), vec![("var".into(), b"x".to_vec())]),
                Token::Cmd(
                    "set".into(),
                    vec![
                        ("var".into(), b"v".to_vec()),
                        ("value".into(), b"q\"w".to_vec())
                    ]
                ),
                Token::Text(b"b<!--#bad".to_vec()),
            ]
        );
        assert!(matches!(parse(b"<!--#x a=b -->", 256)[0], Token::Bad(_)));
        assert!(matches!(
            &parse(b"<!--# \tinclude virtual=\"t\" -->", 256)[0],
            Token::Cmd(name, _) if name == "include"
        ));
        assert!(matches!(
            parse(b"<!--#x a=\"bbb\" -->", 2)[0],
            Token::Bad(_)
        ));
    }

    #[test]
    fn escapes() {
        let mut o = Vec::new();
        escape_url(b"<a b>", &mut o);
        assert_eq!(o, b"%3Ca%20b%3E");
        o.clear();
        escape_html(b"<&\">", &mut o);
        assert_eq!(o, b"&lt;&amp;&quot;&gt;");
    }
}
