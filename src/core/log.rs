//! The error log: nginx's line format and levels, shared log files that
//! USR1 reopens.
//!
//! Every log destination is a [`LogFile`] registered by path in one global
//! table, so that the same file named in several contexts is opened once and
//! `reopen_all()` (USR1) swaps every descriptor in place. A [`Logger`] is a
//! list of (file, level) pairs; the main one is global, and http contexts
//! may carry their own (see `error_log` in the location configuration).
//! Lines are written with one `write(2)` on an `O_APPEND` descriptor, so
//! lines from different worker threads never interleave.

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;

use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::{Compiler, ErrorLogSpec, MainConf};
use crate::http::conf::LocConf;

/// nginx's log levels, most severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Emerg,
    Alert,
    Crit,
    Error,
    Warn,
    Notice,
    Info,
    Debug,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Emerg => "emerg",
            Level::Alert => "alert",
            Level::Crit => "crit",
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Notice => "notice",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "emerg" => Level::Emerg,
            "alert" => Level::Alert,
            "crit" => Level::Crit,
            "error" => Level::Error,
            "warn" => Level::Warn,
            "notice" => Level::Notice,
            "info" => Level::Info,
            "debug" => Level::Debug,
            _ => return None,
        })
    }
}

/// One open log file (or stderr), reopenable in place.
#[derive(Debug)]
pub struct LogFile {
    pub path: Option<PathBuf>,
    file: Mutex<Option<File>>,
}

impl LogFile {
    pub fn write_all(&self, buf: &[u8]) {
        match &self.path {
            None => {
                let _ = std::io::stderr().write_all(buf);
            }
            Some(_) => {
                if let Ok(mut g) = self.file.lock() {
                    if let Some(f) = g.as_mut() {
                        let _ = f.write_all(buf);
                    }
                }
            }
        }
    }

    fn reopen(&self) -> std::io::Result<()> {
        if let Some(p) = &self.path {
            let f = open_append(p)?;
            if let Ok(mut g) = self.file.lock() {
                *g = Some(f);
            }
        }
        Ok(())
    }

    /// The descriptor, for handing to a process that cannot open it itself.
    pub fn path_display(&self) -> String {
        match &self.path {
            Some(p) => p.display().to_string(),
            None => "stderr".into(),
        }
    }
}

fn open_append(p: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC)
        .open(p)
}

fn files() -> &'static Mutex<HashMap<PathBuf, Arc<LogFile>>> {
    static FILES: OnceLock<Mutex<HashMap<PathBuf, Arc<LogFile>>>> = OnceLock::new();
    FILES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Opens (or shares the already open) log file at `path`; `None` is stderr.
pub fn open_log(path: Option<&Path>) -> std::io::Result<Arc<LogFile>> {
    let Some(path) = path else {
        return Ok(Arc::new(LogFile {
            path: None,
            file: Mutex::new(None),
        }));
    };
    let mut map = files()
        .lock()
        .map_err(|_| std::io::Error::other("log table poisoned"))?;
    if let Some(f) = map.get(path) {
        return Ok(f.clone());
    }
    let f = open_append(path)?;
    let lf = Arc::new(LogFile {
        path: Some(path.to_path_buf()),
        file: Mutex::new(Some(f)),
    });
    map.insert(path.to_path_buf(), lf.clone());
    Ok(lf)
}

/// USR1: reopen every log file by its path. Returns the failures.
pub fn reopen_all() -> Vec<(PathBuf, std::io::Error)> {
    let mut failed = Vec::new();
    let list: Vec<Arc<LogFile>> = match files().lock() {
        Ok(m) => m.values().cloned().collect(),
        Err(_) => return failed,
    };
    for f in list {
        if let Err(e) = f.reopen() {
            if let Some(p) = &f.path {
                failed.push((p.clone(), e));
            }
        }
    }
    failed
}

/// Drop files no longer referenced by any configuration (after a reload).
pub fn forget_unused() {
    if let Ok(mut m) = files().lock() {
        m.retain(|_, f| Arc::strong_count(f) > 1);
    }
}

/// A set of destinations with their levels.
#[derive(Debug, Clone, Default)]
pub struct Logger {
    pub sinks: Vec<(Arc<LogFile>, Level)>,
}

impl Logger {
    pub fn from_specs(specs: &[ErrorLogSpec]) -> std::io::Result<Logger> {
        let mut sinks = Vec::new();
        for s in specs {
            sinks.push((open_log(s.path.as_deref())?, s.level));
        }
        Ok(Logger { sinks })
    }

    pub fn enabled(&self, level: Level) -> bool {
        self.sinks.iter().any(|(_, l)| level <= *l)
    }

    /// Writes one line: `YYYY/MM/DD HH:MM:SS [level] pid#tid: *conn msg`.
    pub fn log(&self, level: Level, conn: Option<u64>, msg: fmt::Arguments<'_>) {
        if !self.enabled(level) {
            return;
        }
        let line = format_line(level, conn, msg);
        for (f, l) in &self.sinks {
            if level <= *l {
                f.write_all(line.as_bytes());
            }
        }
    }
}

/// The formatted line, for callers that also print it (e.g. `-t`).
pub fn format_line(level: Level, conn: Option<u64>, msg: fmt::Arguments<'_>) -> String {
    let ts = String::from_utf8_lossy(&crate::http::date::err_log_time()).into_owned();
    // SAFETY: getpid/gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    match conn {
        Some(c) => format!(
            "{} [{}] {}#{}: *{} {}\n",
            ts,
            level.name(),
            pid,
            tid,
            c,
            msg
        ),
        None => format!("{} [{}] {}#{}: {}\n", ts, level.name(), pid, tid, msg),
    }
}

fn global() -> &'static ArcSwap<Logger> {
    static G: OnceLock<ArcSwap<Logger>> = OnceLock::new();
    G.get_or_init(|| {
        ArcSwap::from_pointee(Logger {
            sinks: vec![(
                Arc::new(LogFile {
                    path: None,
                    file: Mutex::new(None),
                }),
                Level::Error,
            )],
        })
    })
}

/// The main error log (the `error_log` of the main context).
pub fn main_logger() -> Arc<Logger> {
    global().load_full()
}

pub fn set_main_logger(l: Logger) {
    global().store(Arc::new(l));
}

/// Log to the main error log.
#[macro_export]
macro_rules! elog {
    ($lvl:ident, $($arg:tt)*) => {
        $crate::core::log::main_logger().log($crate::core::log::Level::$lvl, None, format_args!($($arg)*))
    };
}

/// Parses `error_log FILE [LEVEL]`.
pub fn parse_error_log(d: &Directive, cx: &Compiler) -> ConfResult<ErrorLogSpec> {
    let target = arg(d, 0);
    let path = if target == "stderr" {
        None
    } else if let Some(rest) = target.strip_prefix("syslog:") {
        return Err(ConfError::at(
            format!(
                "syslog logging (\"syslog:{}\") is not supported by tern yet",
                rest
            ),
            d,
        ));
    } else if target.starts_with("memory:") {
        return Err(ConfError::at(
            "memory logging is not supported by tern yet",
            d,
        ));
    } else {
        Some(cx.path(target))
    };
    let level = match d.args.get(1) {
        None => Level::Error,
        Some(a) => Level::parse(&a.value)
            .ok_or_else(|| ConfError::at(format!("invalid log level \"{}\"", a.value), d))?,
    };
    if d.args.len() > 2 {
        return Err(ConfError::at(
            format!("invalid log level \"{}\"", arg(d, 2)),
            d,
        ));
    }
    Ok(ErrorLogSpec { path, level })
}

fn set_main_error_log(m: &mut MainConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let s = parse_error_log(d, cx)?;
    m.error_log.push(s);
    Ok(())
}

fn set_loc_error_log(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let s = parse_error_log(d, cx)?;
    l.core.error_log.get_or_insert_with(Vec::new).push(s);
    Ok(())
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "error_log",
        ctx: ctx::MAIN,
        args: Args::AtLeast(1),
        set: Setter::Main(set_main_error_log),
    },
    Spec {
        name: "error_log",
        ctx: ctx::HSL,
        args: Args::AtLeast(1),
        set: Setter::Loc(set_loc_error_log),
    },
];
