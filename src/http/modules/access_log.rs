//! `log_format`, `access_log`, `open_log_file_cache`: the log phase.
//!
//! # Data flow
//!
//! ```text
//!  worker loop (log phase)                       writer thread ("tern-access-log")
//!  ───────────────────────                       ─────────────────────────────────
//!  render line (compiled Format)
//!   ├─ unbuffered file ──────── Job::Write ───▶  LogFile::write_all (O_APPEND)
//!   ├─ buffered file: append to this thread's
//!   │  buffer; when full / flush= timer /
//!   │  config dropped / exit ── Job::Write ───▶  [gzip member] + write
//!   └─ path with variables ── Job::Script ───▶  stat(root), open via the
//!                                                open_log_file_cache, write
//! ```
//!
//! The loop never calls `open`/`write`/`stat` for a log: every line or
//! buffer goes to one writer thread over a channel, so a slow disk delays
//! log lines, never requests. One thread keeps the order of lines per file.
//! The queue is bounded in bytes ([`MAX_PENDING`]); past it lines are
//! dropped and counted (reported in the error log) rather than blocking the
//! loop or growing memory without limit.
//!
//! Buffers (`buffer=`) are per worker thread and per file, as nginx's are per
//! worker process: a thread appends to its own buffer under an uncontended
//! mutex. A [`BufSet`] (one per path and parameters) is shared by every
//! configuration that uses the same path with the same parameters, so a
//! reload that keeps a log keeps its buffers; when a configuration drops
//! its last reference, the set flushes. At process exit an `atexit` hook
//! flushes every buffer and waits (bounded) for the writer to drain.
//!
//! Static log files are opened at configuration time through
//! [`crate::core::log::open_log`], so USR1 (`reopen_all`) reopens them with
//! the error logs. The default `logs/access.log` (no `access_log` anywhere)
//! is opened by the writer thread on first use, through the same table.
//!
//! # Compile-time state
//!
//! `access_log` is a location-level setter and cannot see the http-level
//! state where `log_format` stores formats. Formats are therefore
//! registered in the compiler's variable table as computed variables under
//! names no configuration can spell (see [`fmt_key`]), which also makes
//! them per-compile (a reload starts from an empty table).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::{Level, LogFile, Logger};
use crate::core::syslog::Peer;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::vars::{Part, Template, UserVar, Var, VarCtx, VarTable};

// ---- formats ---------------------------------------------------------------

/// The predefined format, byte for byte as nginx's.
const COMBINED: &str = "$remote_addr - $remote_user [$time_local] \
     \"$request\" $status $body_bytes_sent \"$http_referer\" \"$http_user_agent\"";

/// `escape=` of a `log_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// `"`, `\`, bytes < 0x20 and >= 0x7f as `\xHH`; a missing value is `-`.
    Default,
    /// JSON string escaping; a missing value is empty.
    Json,
    /// Bytes as they are; a missing value is empty.
    None,
}

/// One step of a compiled format.
#[derive(Debug)]
enum Op {
    Lit(Vec<u8>),
    Var(Var),
    /// `$pipe`: "p" for a pipelined request. The engine does not say, so
    /// this is always ".".
    Pipe,
}

/// A compiled `log_format`.
#[derive(Debug)]
pub struct Format {
    escape: Escape,
    ops: Vec<Op>,
}

impl Format {
    /// Compiles the format strings (already joined by the caller's
    /// iteration) as nginx splits them: `$name` of `[A-Za-z0-9_]`, `${name}`.
    fn compile(escape: Escape, parts: &[&str], vars: &mut VarTable) -> Result<Format, String> {
        let mut ops: Vec<Op> = Vec::new();
        for s in parts {
            let b = s.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] != b'$' {
                    let start = i;
                    while i < b.len() && b[i] != b'$' {
                        i += 1;
                    }
                    match ops.last_mut() {
                        Some(Op::Lit(l)) => l.extend_from_slice(&b[start..i]),
                        _ => ops.push(Op::Lit(b[start..i].to_vec())),
                    }
                    continue;
                }
                let data = &s[i..];
                i += 1;
                let invalid = || format!("invalid parameter \"{}\"", data);
                if i == b.len() {
                    return Err(invalid());
                }
                let bracket = b[i] == b'{';
                if bracket {
                    i += 1;
                    if i == b.len() {
                        return Err(invalid());
                    }
                }
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                let name = &s[start..i];
                if bracket {
                    if b.get(i) != Some(&b'}') {
                        return Err(format!(
                            "the closing bracket in \"{}\" variable is missing",
                            name
                        ));
                    }
                    i += 1;
                }
                if name.is_empty() {
                    return Err(invalid());
                }
                ops.push(match (name, super::module_var_by_name(PIPE_VAR)) {
                    ("pipe", Some(id)) if !vars.stream => Op::Var(Var::Module(id)),
                    ("pipe", _) => Op::Pipe,
                    _ => Op::Var(vars.resolve(name)),
                });
            }
        }
        Ok(Format { escape, ops })
    }

    /// Appends one log line (without the newline).
    pub fn render(&self, cx: &dyn VarCtx, out: &mut Vec<u8>) {
        for op in &self.ops {
            match op {
                Op::Lit(l) => out.extend_from_slice(l),
                Op::Pipe => out.push(b'.'),
                Op::Var(v) => {
                    let start = out.len();
                    let found = cx.var(v, out);
                    self.finish_value(found, start, out);
                }
            }
        }
    }

    /// Escapes the value just appended at `out[start..]`, or writes what
    /// nginx writes for a missing one.
    fn finish_value(&self, found: bool, start: usize, out: &mut Vec<u8>) {
        if !found {
            out.truncate(start);
            if self.escape == Escape::Default {
                out.push(b'-');
            }
            return;
        }
        let needs = match self.escape {
            Escape::None => false,
            Escape::Default => out[start..].iter().any(|&c| escape_default_byte(c)),
            Escape::Json => out[start..]
                .iter()
                .any(|&c| c < 0x20 || c == b'"' || c == b'\\'),
        };
        if !needs {
            return;
        }
        let raw = out.split_off(start);
        match self.escape {
            Escape::Default => escape_default(&raw, out),
            _ => escape_json(&raw, out),
        }
    }
}

impl UserVar for Format {
    fn eval(&self, cx: &dyn VarCtx, out: &mut Vec<u8>) -> bool {
        self.render(cx, out);
        true
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn escape_default_byte(c: u8) -> bool {
    !(0x20..0x7f).contains(&c) || c == b'"' || c == b'\\'
}

/// nginx's access-log escaping: `\xHH` with upper-case hex.
fn escape_default(src: &[u8], out: &mut Vec<u8>) {
    for &c in src {
        if escape_default_byte(c) {
            out.extend_from_slice(&[b'\\', b'x', HEX[(c >> 4) as usize], HEX[(c & 15) as usize]]);
        } else {
            out.push(c);
        }
    }
}

/// JSON string escaping as nginx does it: short forms for the usual
/// controls, `\u00HH` (upper-case hex) for the others; bytes >= 0x7f as is.
fn escape_json(src: &[u8], out: &mut Vec<u8>) {
    for &c in src {
        match c {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', c]),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            0..=0x1f => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(c >> 4) as usize],
                HEX[(c & 15) as usize],
            ]),
            _ => out.push(c),
        }
    }
}

/// The predefined `combined` format (compiled once: it uses builtins only).
fn combined() -> Arc<dyn UserVar> {
    static C: OnceLock<Arc<Format>> = OnceLock::new();
    C.get_or_init(|| {
        let mut vars = VarTable::default();
        let f = Format::compile(Escape::Default, &[COMBINED], &mut vars).unwrap_or(Format {
            escape: Escape::Default,
            ops: Vec::new(),
        });
        Arc::new(f)
    })
    .clone()
}

/// The variable-table name a format is registered under: case-folded,
/// because `access_log` looks formats up case-insensitively. The NUL makes
/// it unreachable from configuration text.
fn fmt_key(name: &str) -> String {
    format!("\0log_format:{}", name.to_ascii_lowercase())
}

/// Marks a name as defined by `log_format` (exact case: nginx's duplicate
/// check is case-sensitive).
fn fmt_defined_key(name: &str) -> String {
    format!("\0log_format=:{}", name)
}

/// Marks a buffered path as configured in this compile.
fn buf_key(path: &Path) -> String {
    format!("\0access_log_buffer:{}", path.display())
}

fn set_log_format(
    _hm: &mut crate::http::conf::HttpMain,
    d: &Directive,
    cx: &mut Compiler,
) -> ConfResult<()> {
    compile_log_format(d, cx)
}

/// Compiles a `log_format` into the compiler's variable table (http's and
/// stream's: each block has its own table, so their names do not meet).
pub(crate) fn compile_log_format(d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let name = arg(d, 0);
    let dkey = fmt_defined_key(name);
    if name == "combined" || cx.vars.lookup(&dkey).is_some() {
        return Err(ConfError::at(
            format!("duplicate \"log_format\" name \"{}\"", name),
            d,
        ));
    }
    let mut rest: Vec<&str> = d.args[1..].iter().map(|a| a.value.as_str()).collect();
    let mut escape = Escape::Default;
    if let Some(e) = rest.first().and_then(|a| a.strip_prefix("escape=")) {
        escape = match e {
            "json" => Escape::Json,
            "none" => Escape::None,
            "default" => Escape::Default,
            _ => {
                return Err(ConfError::at(
                    format!("unknown log format escaping \"{}\"", e),
                    d,
                ))
            }
        };
        rest.remove(0);
    }
    let f = Format::compile(escape, &rest, &mut cx.vars).map_err(|m| ConfError::at(m, d))?;
    cx.vars.define(&dkey);
    let key = fmt_key(name);
    // The first of several names equal but for case wins, as in nginx.
    if cx.vars.lookup(&key).is_none() {
        cx.vars
            .define_computed(&key, Arc::new(f))
            .map_err(|m| ConfError::at(m, d))?;
    }
    Ok(())
}

fn find_format(cx: &Compiler, name: &str, combined_known: bool) -> Option<Arc<dyn UserVar>> {
    if combined_known && name.eq_ignore_ascii_case("combined") {
        return Some(combined());
    }
    match cx.vars.lookup(&fmt_key(name)) {
        Some(Var::User(i)) => cx.vars.def(i).cloned(),
        _ => None,
    }
}

// ---- configuration -----------------------------------------------------------

/// `open_log_file_cache` parameters.
#[derive(Debug)]
pub struct CacheConf {
    /// Identifies this cache's descriptors in the writer thread.
    id: u64,
    max: usize,
    inactive: Duration,
    min_uses: u64,
    valid: Duration,
}

/// Where one `access_log` writes.
#[derive(Debug)]
enum Dest {
    /// A fixed path, unbuffered: each line is handed to the writer.
    File(Arc<LogFile>),
    /// A fixed path with `buffer=` (and maybe `flush=`, `gzip`).
    Buffered(Arc<BufSet>),
    /// A path with variables (absolute: the prefix is compiled in).
    Script(Template),
    /// `syslog:...`: each line one datagram, sent by the logging thread
    /// (non-blocking, as nginx; see core/syslog.rs).
    Syslog(Arc<Peer>),
}

/// One `access_log` directive.
#[derive(Debug)]
pub struct LogSpec {
    dest: Dest,
    format: Arc<dyn UserVar>,
    /// `if=`: skip when the value is empty or "0".
    cond: Option<Template>,
}

#[derive(Debug, Clone, Default)]
pub struct AccessLogLoc {
    /// This level's logs (None: not set here, inherit).
    pub logs: Option<Vec<Arc<LogSpec>>>,
    /// `access_log off` at this level (wins over logs of the same level).
    pub off: bool,
    /// `open_log_file_cache`: None unset, Some(None) off.
    pub cache: Option<Option<Arc<CacheConf>>>,
}

impl AccessLogLoc {
    /// nginx's merge: a level with any `access_log` (or `off`) keeps its
    /// own; otherwise it takes the parent's. None after merging at every
    /// level means the default `logs/access.log combined`.
    pub fn merge(&mut self, p: &AccessLogLoc) {
        if self.cache.is_none() {
            self.cache = p.cache.clone();
        }
        if self.logs.is_none() && !self.off {
            self.logs = p.logs.clone();
            self.off = p.off;
        }
        if self.logs.is_none() && !self.off {
            // The default log will be opened on first use; make sure a
            // thread with the master's credentials exists to open it.
            opener();
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct AccessLogMain {}

fn set_access_log(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    match parse_access_log(d, cx, true)? {
        None => l.modules.access_log.off = true,
        Some(spec) => l
            .modules
            .access_log
            .logs
            .get_or_insert_with(Vec::new)
            .push(spec),
    }
    Ok(())
}

/// Compiles one `access_log` directive (http's and stream's); None for
/// `access_log off`. Without a format name, http logs `combined`; stream
/// has no default format (`default_combined` false).
pub(crate) fn parse_access_log(
    d: &Directive,
    cx: &mut Compiler,
    default_combined: bool,
) -> ConfResult<Option<Arc<LogSpec>>> {
    let first = arg(d, 0);
    if first == "off" {
        if d.args.len() == 1 {
            return Ok(None);
        }
        return Err(ConfError::at(
            format!("invalid parameter \"{}\"", arg(d, 1)),
            d,
        ));
    }
    if !default_combined && d.args.len() < 2 {
        return Err(crate::config::registry::invalid_args(d));
    }
    let syslog = match first.strip_prefix("syslog:") {
        Some(rest) => Some(Arc::new(
            Peer::parse(rest).map_err(|m| ConfError::at(m, d))?,
        )),
        None => None,
    };
    let name = if d.args.len() >= 2 {
        arg(d, 1)
    } else {
        "combined"
    };
    let path_t = match syslog {
        Some(_) => Template::default(),
        None => cx.template(first, d)?,
    };
    let format = find_format(cx, name, default_combined)
        .ok_or_else(|| ConfError::at(format!("unknown log format \"{}\"", name), d))?;
    let mut size = 0usize;
    let mut flush = 0u64;
    let mut gzip = 0u32;
    let mut cond = None;
    for a in d.args.iter().skip(2).map(|a| a.value.as_str()) {
        if let Some(s) = a.strip_prefix("buffer=") {
            size = value::size(s)
                .filter(|&n| n > 0)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| ConfError::at(format!("invalid buffer size \"{}\"", s), d))?;
        } else if let Some(s) = a.strip_prefix("flush=") {
            flush = value::time_ms(s)
                .filter(|&n| n > 0)
                .ok_or_else(|| ConfError::at(format!("invalid flush time \"{}\"", s), d))?;
        } else if a == "gzip" || a.starts_with("gzip=") {
            if size == 0 {
                size = 64 * 1024;
            }
            gzip = match a.strip_prefix("gzip=") {
                None => 1,
                Some(s) => value::number(s)
                    .filter(|n| (1..=9).contains(n))
                    .map(|n| n as u32)
                    .ok_or_else(|| {
                        ConfError::at(format!("invalid compression level \"{}\"", s), d)
                    })?,
            };
        } else if let Some(s) = a.strip_prefix("if=") {
            cond = Some(cx.template(s, d)?);
        } else {
            return Err(ConfError::at(format!("invalid parameter \"{}\"", a), d));
        }
    }
    if flush > 0 && size == 0 {
        return Err(ConfError::at(
            format!("no buffer is defined for access_log \"{}\"", first),
            d,
        ));
    }
    let dest = if let Some(peer) = syslog {
        if size > 0 {
            return Err(ConfError::at("logs to syslog cannot be buffered", d));
        }
        Dest::Syslog(peer)
    } else if path_t.has_vars() {
        if size > 0 {
            return Err(ConfError::at(
                "buffered logs cannot have variables in name",
                d,
            ));
        }
        let mut t = path_t;
        if !first.starts_with('/') {
            // nginx makes the name absolute against the prefix at config time.
            let mut pre = cx.prefix.as_os_str().as_bytes().to_vec();
            if !pre.ends_with(b"/") {
                pre.push(b'/');
            }
            t.parts.insert(0, Part::Lit(pre));
        }
        Dest::Script(t)
    } else {
        let path = cx.path(first);
        let file = crate::core::log::open_log(Some(&path)).map_err(|e| {
            ConfError::new(format!(
                "open() \"{}\" failed {}",
                path.display(),
                crate::core::errno_text(&e)
            ))
        })?;
        if size > 0 {
            let flush = (flush > 0).then(|| Duration::from_millis(flush));
            Dest::Buffered(bufset(cx, d, first, &path, file, size, flush, gzip)?)
        } else {
            Dest::File(file)
        }
    };
    Ok(Some(Arc::new(LogSpec { dest, format, cond })))
}

/// The buffer set of a path: the same for every `access_log` of this path
/// in a compile (parameters must agree, as in nginx), and reused from the
/// running configuration when the parameters are unchanged.
#[allow(clippy::too_many_arguments)]
fn bufset(
    cx: &mut Compiler,
    d: &Directive,
    name: &str,
    path: &Path,
    file: Arc<LogFile>,
    size: usize,
    flush: Option<Duration>,
    gzip: u32,
) -> ConfResult<Arc<BufSet>> {
    let key = buf_key(path);
    let this_compile = cx.vars.lookup(&key).is_some();
    let mut reg = lock(bufsets());
    reg.retain(|_, w| w.strong_count() > 0);
    if let Some(old) = reg.get(path).and_then(Weak::upgrade) {
        let same = old.size == size && old.flush == flush && old.gzip == gzip;
        if same {
            cx.vars.define(&key);
            return Ok(old);
        }
        if this_compile {
            return Err(ConfError::at(
                format!(
                    "access_log \"{}\" already defined with conflicting parameters",
                    name
                ),
                d,
            ));
        }
    }
    cx.vars.define(&key);
    let set = Arc::new(BufSet {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        file,
        size,
        flush,
        gzip,
        bufs: Mutex::new(Vec::new()),
    });
    reg.insert(path.to_path_buf(), Arc::downgrade(&set));
    Ok(set)
}

fn set_open_log_file_cache(l: &mut LocConf, d: &Directive, _cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.access_log.cache.is_some() {
        return Err(crate::config::registry::duplicate(d));
    }
    let mut max = 0u64;
    let mut inactive = 10u64;
    let mut valid = 60u64;
    let mut min_uses = 1u64;
    let mut off = false;
    for a in d.args.iter().map(|a| a.value.as_str()) {
        let v = if let Some(s) = a.strip_prefix("max=") {
            value::number(s).map(|n| max = n)
        } else if let Some(s) = a.strip_prefix("inactive=") {
            value::time_secs(s).map(|n| inactive = n)
        } else if let Some(s) = a.strip_prefix("min_uses=") {
            value::number(s).map(|n| min_uses = n)
        } else if let Some(s) = a.strip_prefix("valid=") {
            value::time_secs(s).map(|n| valid = n)
        } else if a == "off" {
            off = true;
            Some(())
        } else {
            None
        };
        if v.is_none() {
            return Err(ConfError::at(
                format!("invalid \"open_log_file_cache\" parameter \"{}\"", a),
                d,
            ));
        }
    }
    if off {
        l.modules.access_log.cache = Some(None);
        return Ok(());
    }
    if max == 0 {
        return Err(ConfError::at(
            "\"open_log_file_cache\" must have \"max\" parameter",
            d,
        ));
    }
    l.modules.access_log.cache = Some(Some(Arc::new(CacheConf {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        max: usize::try_from(max).unwrap_or(usize::MAX),
        inactive: Duration::from_secs(inactive),
        min_uses,
        valid: Duration::from_secs(valid),
    })));
    Ok(())
}

/// `$pipe` of a log format: `p` for a pipelined request, else `.`. Only
/// log formats reach it (the name cannot be written in a configuration).
const PIPE_VAR: &str = "\0pipe";
pub const VARS: &[&str] = &[PIPE_VAR];
/// The note the HTTP/1 connection leaves on a pipelined request.
pub const PIPELINED: &str = "access_log.pipelined";

pub fn var(cx: &Ctx<'_>, _idx: u8, out: &mut Vec<u8>) -> bool {
    out.push(if cx.note(PIPELINED).is_some() {
        b'p'
    } else {
        b'.'
    });
    true
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "log_format",
        ctx: ctx::HTTP,
        args: Args::AtLeast(2),
        set: Setter::HttpMain(set_log_format),
    },
    Spec {
        name: "access_log",
        ctx: ctx::HSL | ctx::LIF | ctx::LMT,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_access_log),
    },
    Spec {
        name: "open_log_file_cache",
        ctx: ctx::HSL,
        args: Args::take1234(),
        set: Setter::Loc(set_open_log_file_cache),
    },
];

// ---- the log phase -------------------------------------------------------------

/// The log phase: writes the request to every access log of its location.
pub fn log(cx: &Ctx<'_>) {
    // Start the writer from a worker thread, so that it has the workers'
    // credentials (logs with variables are opened as the worker user, as in
    // nginx), even if its first job comes from elsewhere (a reload, exit).
    writer();
    let conf = &cx.loc.modules.access_log;
    if conf.off {
        return;
    }
    let Some(logs) = &conf.logs else {
        let mut line = Vec::with_capacity(256);
        combined().eval(cx, &mut line);
        line.push(b'\n');
        submit(Job::Write {
            target: Target::Path(default_path(cx)),
            data: line,
            gzip: 0,
        });
        return;
    };
    for l in logs {
        write_one(l, cx, &|| ScriptCtx {
            root: cx.root(),
            cache: conf.cache.clone().flatten(),
            err: err_ctx(cx),
            wait: true,
        });
    }
}

/// What a log with variables in its path needs besides the line: the
/// root that must exist (empty: none), the descriptor cache, and how to
/// report a failure.
pub(crate) struct ScriptCtx {
    pub root: Vec<u8>,
    pub cache: Option<Arc<CacheConf>>,
    pub err: ErrCtx,
    /// The connection waits for the write ([`settled`]) before it goes
    /// on (http's log phase).
    pub wait: bool,
}

/// Writes one line to one `access_log` (unless its `if=` says no): the
/// log phase of http and of stream.
pub(crate) fn write_one(l: &LogSpec, cx: &dyn VarCtx, script: &dyn Fn() -> ScriptCtx) {
    writer();
    if let Some(c) = &l.cond {
        let v = c.render_vec(cx);
        if v.is_empty() || v == b"0" {
            return;
        }
    }
    let mut line = Vec::with_capacity(256);
    l.format.eval(cx, &mut line);
    line.push(b'\n');
    match &l.dest {
        Dest::File(f) => submit(Job::Write {
            target: Target::File(f.clone()),
            data: line,
            gzip: 0,
        }),
        Dest::Buffered(set) => write_buffered(set, line),
        Dest::Syslog(peer) => {
            if peer.send_access(&line).is_err() {
                let err = script().err;
                err.logger.log(
                    Level::Warn,
                    Some(err.conn),
                    format_args!("send() to syslog failed{}", err.suffix),
                );
            }
        }
        Dest::Script(t) => {
            let path = t.render_vec(cx);
            let sc = script();
            let done = sc.wait.then(|| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let conn = sc.err.conn;
                SCRIPT_PENDING.with(|p| {
                    let mut p = p.borrow_mut();
                    // Those done (or whose connection never waited) go.
                    p.retain_mut(|(_, rx)| {
                        matches!(
                            rx.try_recv(),
                            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
                        )
                    });
                    p.push((conn, rx));
                });
                tx
            });
            submit(Job::Script(Box::new(ScriptJob {
                path,
                root: sc.root,
                data: line,
                cache: sc.cache,
                err: sc.err,
                done,
            })));
        }
    }
}

thread_local! {
    /// Lines of logs with variables in their paths handed to the writer
    /// and not yet written, by connection id.
    static SCRIPT_PENDING: RefCell<Vec<(u64, tokio::sync::oneshot::Receiver<()>)>> =
        const { RefCell::new(Vec::new()) };
}

/// Waits until the lines connection `conn` logged to logs with variables
/// in their paths are written. nginx opens such a log in the log phase,
/// before the connection reads its next request or closes, so a client
/// that saw the close knows the line is in the file (and a directory
/// renamed after that does not lose it). The open and write stay on the
/// writer thread; the connection only awaits their end (bounded, should
/// the disk hang).
pub async fn settled(conn: u64) {
    let mine: Vec<_> = SCRIPT_PENDING.with(|p| {
        let mut p = p.borrow_mut();
        if p.is_empty() {
            return Vec::new();
        }
        let (mine, rest) = std::mem::take(&mut *p)
            .into_iter()
            .partition(|(c, _)| *c == conn);
        *p = rest;
        mine
    });
    for (_, rx) in mine {
        let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
    }
}

/// `PREFIX/logs/access.log`, the log nginx writes when none is configured.
fn default_path(cx: &Ctx<'_>) -> PathBuf {
    // The prefix comes from the command line and never changes.
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| cx.shared.config.load().prefix.join("logs/access.log"))
        .clone()
}

/// What the writer needs to report a failure as the request would.
pub(crate) struct ErrCtx {
    pub logger: Arc<Logger>,
    pub conn: u64,
    pub suffix: String,
}

fn err_ctx(cx: &Ctx<'_>) -> ErrCtx {
    ErrCtx {
        logger: cx.logger(),
        conn: cx.conn.id,
        // nginx names the action of the log phase in its error lines.
        suffix: format!(
            " while logging request{}{}",
            cx.log_request_ctx(),
            cx.log_host_ctx()
        ),
    }
}

// ---- per-thread buffers -----------------------------------------------------------

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The buffers of one buffered path: one per worker thread that wrote to it.
#[derive(Debug)]
pub struct BufSet {
    id: u64,
    file: Arc<LogFile>,
    size: usize,
    flush: Option<Duration>,
    gzip: u32,
    bufs: Mutex<Vec<Arc<Mutex<Buf>>>>,
}

#[derive(Debug, Default)]
struct Buf {
    data: Vec<u8>,
    /// A flush timer is pending for this buffer.
    timer: bool,
    /// The set was dropped: the thread-local cache may forget this buffer.
    retired: bool,
}

impl BufSet {
    /// Hands the buffer's content to the writer.
    fn flush(&self, b: &mut Buf) {
        if b.data.is_empty() {
            return;
        }
        let data = std::mem::replace(&mut b.data, Vec::with_capacity(self.size));
        submit(Job::Write {
            target: Target::File(self.file.clone()),
            data,
            gzip: self.gzip,
        });
    }

    fn flush_all(&self) {
        let bufs: Vec<Arc<Mutex<Buf>>> = lock(&self.bufs).clone();
        for b in bufs {
            self.flush(&mut lock(&b));
        }
    }
}

impl Drop for BufSet {
    /// No configuration uses this set any more (reload): write out what
    /// the threads still hold. Only hands data over, so it may run anywhere.
    fn drop(&mut self) {
        let bufs = std::mem::take(&mut *lock(&self.bufs));
        for b in bufs {
            let mut g = lock(&b);
            self.flush(&mut g);
            g.retired = true;
        }
    }
}

/// Buffered sets by path, for reuse across reloads and the exit flush.
fn bufsets() -> &'static Mutex<HashMap<PathBuf, Weak<BufSet>>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, Weak<BufSet>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A poisoned lock only means another thread panicked mid-update of a
/// buffer; the bytes are still usable for a log.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// This thread's buffer in each set it wrote to, by set id.
    static LOCAL: RefCell<Vec<(u64, Arc<Mutex<Buf>>)>> = const { RefCell::new(Vec::new()) };
}

fn local_buf(set: &BufSet) -> Arc<Mutex<Buf>> {
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        if let Some((_, b)) = l.iter().find(|(id, _)| *id == set.id) {
            return b.clone();
        }
        l.retain(|(_, b)| !lock(b).retired);
        let b = Arc::new(Mutex::new(Buf {
            data: Vec::with_capacity(set.size),
            ..Buf::default()
        }));
        lock(&set.bufs).push(b.clone());
        l.push((set.id, b.clone()));
        b
    })
}

/// Appends a line to this thread's buffer, as nginx: a line that does not
/// fit flushes the buffer first; a line larger than the buffer is written
/// on its own; the flush timer starts when an empty buffer gets data.
fn write_buffered(set: &Arc<BufSet>, line: Vec<u8>) {
    let b = local_buf(set);
    let mut g = lock(&b);
    if g.data.len() + line.len() > set.size {
        set.flush(&mut g);
    }
    if line.len() > set.size {
        submit(Job::Write {
            target: Target::File(set.file.clone()),
            data: line,
            gzip: set.gzip,
        });
        return;
    }
    g.data.extend_from_slice(&line);
    let Some(after) = set.flush else { return };
    if g.timer {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            g.timer = true;
            let weak = Arc::downgrade(set);
            let buf = b.clone();
            h.spawn(async move {
                tokio::time::sleep(after).await;
                // Upgrade before locking: if this is the last reference,
                // the set's Drop locks every buffer, so the guard must be
                // gone by then.
                let set = weak.upgrade();
                {
                    let mut g = lock(&buf);
                    g.timer = false;
                    // A dropped set has flushed everything already.
                    if let Some(set) = &set {
                        set.flush(&mut g);
                    }
                }
                drop(set);
            });
        }
        // No event loop to time the flush: write now rather than never.
        Err(_) => set.flush(&mut g),
    }
}

// ---- the writer thread ----------------------------------------------------------------

/// Bytes queued for the writer beyond which new lines are dropped.
const MAX_PENDING: usize = 64 << 20;

enum Target {
    File(Arc<LogFile>),
    /// Opened (and registered for USR1) by the writer on first use.
    Path(PathBuf),
}

struct ScriptJob {
    path: Vec<u8>,
    root: Vec<u8>,
    data: Vec<u8>,
    cache: Option<Arc<CacheConf>>,
    err: ErrCtx,
    /// Told when the line is written (or failed); see [`settled`].
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

enum Job {
    Write {
        target: Target,
        data: Vec<u8>,
        /// Compression level; 0: plain.
        gzip: u32,
    },
    Script(Box<ScriptJob>),
    /// Answered once every earlier job is done.
    Barrier(mpsc::SyncSender<()>),
}

impl Job {
    fn bytes(&self) -> usize {
        match self {
            Job::Write { data, .. } => data.len(),
            Job::Script(s) => s.data.len(),
            Job::Barrier(_) => 0,
        }
    }
}

struct Writer {
    tx: mpsc::Sender<Job>,
    pending: AtomicUsize,
    dropped: AtomicUsize,
}

fn writer() -> Option<&'static Writer> {
    static W: OnceLock<Option<Writer>> = OnceLock::new();
    W.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("tern-access-log".into())
            .spawn(move || writer_loop(rx));
        if let Err(e) = spawned {
            crate::elog!(Alert, "could not start the access log writer: {}", e);
            return None;
        }
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(at_exit) };
        Some(Writer {
            tx,
            pending: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
        })
    })
    .as_ref()
}

/// Queues a job for the writer; never blocks on I/O.
fn submit(job: Job) {
    let Some(w) = writer() else { return };
    let n = job.bytes();
    if n > 0 && w.pending.fetch_add(n, Ordering::Relaxed) + n > MAX_PENDING {
        w.pending.fetch_sub(n, Ordering::Relaxed);
        w.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if w.tx.send(job).is_err() {
        w.pending.fetch_sub(n, Ordering::Relaxed);
    }
}

/// At exit: flush every buffer and give the writer a bounded time to drain.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let sets: Vec<Arc<BufSet>> = lock(bufsets()).values().filter_map(Weak::upgrade).collect();
        for s in &sets {
            s.flush_all();
        }
        drain(Duration::from_secs(5));
    });
}

/// Waits until the writer has done every job queued so far.
fn drain(within: Duration) {
    let (tx, rx) = mpsc::sync_channel(1);
    submit(Job::Barrier(tx));
    let _ = rx.recv_timeout(within);
}

fn writer_loop(rx: mpsc::Receiver<Job>) {
    let mut st = WriterState::default();
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(job) => {
                let n = job.bytes();
                st.run(job);
                if let Some(w) = writer() {
                    w.pending.fetch_sub(n, Ordering::Relaxed);
                    let lost = w.dropped.swap(0, Ordering::Relaxed);
                    if lost > 0 {
                        crate::elog!(
                            Alert,
                            "{} access log lines dropped: the log writer is behind",
                            lost
                        );
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => st.expire(),
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[derive(Default)]
struct WriterState {
    /// Default logs opened on demand, by path.
    opened: HashMap<PathBuf, Arc<LogFile>>,
    /// `open_log_file_cache` descriptors, by cache id.
    caches: HashMap<u64, FdCache>,
    /// Time of the last write-error report per path (nginx: one a minute).
    errors: HashMap<PathBuf, Instant>,
}

impl WriterState {
    fn run(&mut self, job: Job) {
        match job {
            Job::Barrier(tx) => {
                let _ = tx.send(());
            }
            Job::Write { target, data, gzip } => {
                let file = match target {
                    Target::File(f) => f,
                    Target::Path(p) => match self.open_default(&p) {
                        Some(f) => f,
                        None => return,
                    },
                };
                let written = if gzip > 0 {
                    match gzip_member(&data, gzip) {
                        Ok(z) => file.write(&z),
                        Err(e) => {
                            crate::elog!(Alert, "gzip of access log failed: {}", e);
                            Ok(())
                        }
                    }
                } else {
                    file.write(&data)
                };
                // As nginx: an alert at most once a minute per log (a full
                // disk would otherwise write one per request).
                if let (Err(e), Some(p)) = (written, file.path.as_ref()) {
                    let msg = format!(
                        "write() to \"{}\" failed {}",
                        p.display(),
                        crate::core::errno_text(&e)
                    );
                    self.report(&p.clone(), msg);
                }
            }
            Job::Script(mut s) => {
                let done = s.done.take();
                self.script(*s);
                if let Some(tx) = done {
                    let _ = tx.send(());
                }
            }
        }
    }

    fn open_default(&mut self, p: &Path) -> Option<Arc<LogFile>> {
        if let Some(f) = self.opened.get(p) {
            return Some(f.clone());
        }
        match open_privileged(p) {
            Ok(f) => {
                self.opened.insert(p.to_path_buf(), f.clone());
                Some(f)
            }
            Err(e) => {
                self.report(
                    p,
                    format!(
                        "open() \"{}\" failed {}",
                        p.display(),
                        crate::core::errno_text(&e)
                    ),
                );
                None
            }
        }
    }

    fn report(&mut self, p: &Path, msg: String) {
        let now = Instant::now();
        if self
            .errors
            .get(p)
            .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(60))
        {
            return;
        }
        self.errors.insert(p.to_path_buf(), now);
        crate::elog!(Alert, "{}", msg);
    }

    /// A log whose path has variables: nginx first checks that the
    /// request's root directory exists, then opens (or reuses a cached)
    /// descriptor and writes.
    fn script(&mut self, s: ScriptJob) {
        let e = &s.err;
        if !s.root.is_empty() {
            let root = Path::new(std::ffi::OsStr::from_bytes(&s.root));
            let err = match std::fs::metadata(root) {
                Ok(m) if m.is_dir() => None,
                Ok(_) => Some(std::io::Error::from_raw_os_error(libc::ENOTDIR)),
                Err(err) => Some(err),
            };
            if let Some(err) = err {
                e.logger.log(
                    Level::Error,
                    Some(e.conn),
                    format_args!(
                        "testing \"{}\" existence failed {}{}",
                        root.display(),
                        crate::core::errno_text(&err),
                        e.suffix
                    ),
                );
                return;
            }
        }
        if s.path.contains(&0) {
            return;
        }
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(&s.path));
        let res = match &s.cache {
            Some(c) => self
                .caches
                .entry(c.id)
                .or_insert_with(|| FdCache {
                    conf: c.clone(),
                    map: HashMap::new(),
                })
                .write(&path, &s.data),
            None => open_append(&path)
                .map_err(|e| ("open()", e))
                .and_then(|mut f| f.write_all(&s.data).map_err(|e| ("write()", e))),
        };
        match res {
            Ok(()) => {}
            Err(("open()", err)) => e.logger.log(
                Level::Crit,
                Some(e.conn),
                format_args!(
                    "open() \"{}\" failed {}{}",
                    path.display(),
                    crate::core::errno_text(&err),
                    e.suffix
                ),
            ),
            Err((what, err)) => {
                let msg = format!(
                    "{} to \"{}\" failed {}",
                    what,
                    path.display(),
                    crate::core::errno_text(&err)
                );
                self.report(&path, msg);
            }
        }
    }

    fn expire(&mut self) {
        for c in self.caches.values_mut() {
            c.expire(Instant::now());
        }
        self.caches.retain(|_, c| !c.map.is_empty());
    }
}

type OpenReq = (PathBuf, mpsc::SyncSender<std::io::Result<Arc<LogFile>>>);

/// A thread started at configuration time, so with the master's
/// credentials: nginx's master opens `logs/access.log` before workers give
/// up root, and the writer thread (started from a worker) may not be able
/// to. It only ever opens the default log path.
fn opener() -> Option<&'static Mutex<mpsc::Sender<OpenReq>>> {
    static O: OnceLock<Option<Mutex<mpsc::Sender<OpenReq>>>> = OnceLock::new();
    O.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<OpenReq>();
        std::thread::Builder::new()
            .name("tern-log-opener".into())
            .spawn(move || {
                for (p, reply) in rx {
                    let _ = reply.send(crate::core::log::open_log(Some(&p)));
                }
            })
            .ok()?;
        Some(Mutex::new(tx))
    })
    .as_ref()
}

/// Opens (and registers for USR1) the default log through [`opener`].
fn open_privileged(p: &Path) -> std::io::Result<Arc<LogFile>> {
    let Some(o) = opener() else {
        return crate::core::log::open_log(Some(p));
    };
    let (tx, rx) = mpsc::sync_channel(1);
    lock(o)
        .send((p.to_path_buf(), tx))
        .map_err(|_| std::io::Error::other("log opener stopped"))?;
    rx.recv_timeout(Duration::from_secs(10))
        .map_err(|_| std::io::Error::other("log opener did not answer"))?
}

fn open_append(p: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC)
        .open(p)
}

/// One gzip member of `data`, as nginx writes per buffer flush.
fn gzip_member(data: &[u8], level: u32) -> std::io::Result<Vec<u8>> {
    let mut z = flate2::GzBuilder::new()
        // zlib's gzip header says Unix; keep the bytes close to nginx's.
        .operating_system(3)
        .write(
            Vec::with_capacity(data.len() / 4 + 64),
            flate2::Compression::new(level),
        );
    z.write_all(data)?;
    z.finish()
}

/// Descriptors of `open_log_file_cache`: kept after `min_uses` uses within
/// `inactive`, closed after `inactive` without use, reopened after `valid`,
/// at most `max` (the least recently used goes first).
struct FdCache {
    conf: Arc<CacheConf>,
    map: HashMap<PathBuf, FdEntry>,
}

struct FdEntry {
    file: Option<(File, Instant)>,
    uses: u64,
    last: Instant,
}

impl FdCache {
    fn write(&mut self, path: &Path, data: &[u8]) -> Result<(), (&'static str, std::io::Error)> {
        let now = Instant::now();
        let c = self.conf.clone();
        let Some(e) = self.map.get_mut(path) else {
            // A new name: only a file that opens takes a place (and may
            // push the least recently used out), as in nginx's
            // ngx_open_cached_file, so a failed open costs no other entry.
            let mut f = open_append(path).map_err(|err| ("open()", err))?;
            if self.map.len() >= c.max {
                let oldest = self
                    .map
                    .iter()
                    .min_by_key(|(_, e)| e.last)
                    .map(|(p, _)| p.clone());
                if let Some(p) = oldest {
                    self.map.remove(&p);
                }
            }
            let r = f.write_all(data).map_err(|err| ("write()", err));
            self.map.insert(
                path.to_path_buf(),
                FdEntry {
                    file: (c.min_uses <= 1).then_some((f, now)),
                    uses: 1,
                    last: now,
                },
            );
            return r;
        };
        if now.duration_since(e.last) > c.inactive {
            e.uses = 0;
            e.file = None;
        }
        e.uses += 1;
        e.last = now;
        if e.file
            .as_ref()
            .is_some_and(|(_, at)| now.duration_since(*at) >= c.valid)
        {
            e.file = None;
        }
        if let Some((f, _)) = e.file.as_mut() {
            return f.write_all(data).map_err(|err| ("write()", err));
        }
        let mut f = open_append(path).map_err(|err| ("open()", err))?;
        let r = f.write_all(data).map_err(|err| ("write()", err));
        if e.uses >= c.min_uses {
            e.file = Some((f, now));
        }
        r
    }

    fn expire(&mut self, now: Instant) {
        let inactive = self.conf.inactive;
        self.map
            .retain(|_, e| now.duration_since(e.last) <= inactive);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<(Var, Option<&'static [u8]>)>);
    impl VarCtx for Fixed {
        fn var(&self, v: &Var, out: &mut Vec<u8>) -> bool {
            match self.0.iter().find(|(k, _)| k == v) {
                Some((_, Some(val))) => {
                    out.extend_from_slice(val);
                    true
                }
                _ => false,
            }
        }
    }

    fn render(escape: Escape, fmt: &str, cx: &Fixed) -> Vec<u8> {
        let mut vars = VarTable::default();
        let f = Format::compile(escape, &[fmt], &mut vars).expect("compiles");
        let mut out = Vec::new();
        f.render(cx, &mut out);
        out
    }

    #[test]
    fn escaping_matches_nginx() {
        let cx = Fixed(vec![
            (
                Var::Http("x-a".into()),
                Some(b"q\"\\\x01\x7f\xc3\xa9\t\x08\x0c\x1f\x1b/end"),
            ),
            (Var::Http("empty".into()), Some(b"")),
        ]);
        assert_eq!(
            render(Escape::Default, "$http_x_a|$http_empty|$http_none", &cx),
            b"q\\x22\\x5C\\x01\\x7F\\xC3\\xA9\\x09\\x08\\x0C\\x1F\\x1B/end||-".to_vec()
        );
        assert_eq!(
            render(Escape::Json, "$http_x_a|$http_none", &cx),
            b"q\\\"\\\\\\u0001\x7f\xc3\xa9\\t\\b\\f\\u001F\\u001B/end|".to_vec()
        );
        assert_eq!(
            render(Escape::None, "${http_x_a}x|$http_none|", &cx),
            b"q\"\\\x01\x7f\xc3\xa9\t\x08\x0c\x1f\x1b/endx||".to_vec()
        );
    }

    #[test]
    fn format_errors_are_nginx_wording() {
        let mut vars = VarTable::default();
        let e = |s: &str, vars: &mut VarTable| {
            Format::compile(Escape::Default, &[s], vars)
                .err()
                .unwrap_or_default()
        };
        assert_eq!(e("a $", &mut vars), "invalid parameter \"$\"");
        assert_eq!(e("a ${", &mut vars), "invalid parameter \"${\"");
        assert_eq!(
            e("${abc", &mut vars),
            "the closing bracket in \"abc\" variable is missing"
        );
        assert_eq!(e("$-x", &mut vars), "invalid parameter \"$-x\"");
    }

    #[test]
    fn gzip_member_round_trips() {
        use std::io::Read;
        let z = gzip_member(b"line\n", 6).expect("gzip");
        let mut out = String::new();
        flate2::read::GzDecoder::new(&z[..])
            .read_to_string(&mut out)
            .expect("gunzip");
        assert_eq!(out, "line\n");
    }
}
