//! The error log: nginx's line format and levels, shared log files that
//! USR1 reopens.
//!
//! Every log destination is a [`LogFile`] registered by path in one global
//! table, so that the same file named in several contexts is opened once and
//! `reopen_all()` (USR1) swaps every descriptor in place. A [`Logger`] is a
//! list of (file, level) pairs; the main one is global, and http contexts
//! may carry their own (see `error_log` in the location configuration).
//!
//! # Who writes
//!
//! ```text
//!  before the workers start (startup, `-t`, an emerg before exit)
//!  and after `stop_writer` (exit):     the logging thread writes the line itself
//!
//!  while the workers run:
//!  any thread ── format line ── Job::Line ──▶ queue ──▶ writer thread ("tern-error-log")
//!  master (USR1) ───────────── Job::Reopen ─▶ queue      writes runs of lines per file,
//!                                                        reopens files in queue order
//! ```
//!
//! A worker's event loop must not wait for a disk (or a pipe) to take a
//! line, so while the workers run every line goes through one writer thread.
//! The line is formatted on the logging thread (its time, `pid#tid` and
//! `*conn` are the caller's, as in nginx); the writer writes whole lines with
//! `write(2)` on `O_APPEND` descriptors, so lines never interleave, and one
//! queue keeps the order of lines per file. USR1's reopen is a job in the
//! same queue: lines logged before it go to the old file, lines after it
//! to the new one.
//!
//! The writer is woken for each line that finds it asleep: it does not
//! linger for more, because a line must be in its file about as soon as
//! nginx would have written it (clients and tests read the log right after
//! the response that logged it).
//!
//! The queue is bounded ([`MAX_QUEUED`] bytes). When it is full, the
//! logging thread waits until the writer has made room: no line is ever
//! dropped, and only a log destination slower than the log rate for
//! megabytes on end can hold up a worker (nginx waits for every line).
//!
//! The writer is started by the master just before the workers
//! ([`start_writer`]), so it keeps the master's credentials and can reopen
//! root-owned logs. At exit [`stop_writer`] waits (bounded) for the queue
//! to drain, and from then on lines are written synchronously again; an
//! `atexit` hook does the same for exits that bypass the master.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::config::registry::{arg, ctx, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::{Compiler, ErrorLogSpec, MainConf};
use crate::core::syslog::Peer;
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
    /// Writes, ignoring failures (where there is nowhere to report them,
    /// as for the error log itself).
    pub fn write_all(&self, buf: &[u8]) {
        let _ = self.write(buf);
    }

    /// Writes the whole buffer; the error (a full disk...) for the caller
    /// to report.
    pub fn write(&self, buf: &[u8]) -> std::io::Result<()> {
        match &self.path {
            None => std::io::stderr().write_all(buf),
            Some(_) => match self.file.lock() {
                Ok(mut g) => match g.as_mut() {
                    Some(f) => f.write_all(buf),
                    None => Ok(()),
                },
                Err(_) => Ok(()),
            },
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

/// USR1: reopen every log file by its path, after the lines already
/// queued (see the module doc). Failures are logged.
pub fn reopen_all() {
    if !queue_job(Job::Reopen) {
        reopen_now();
    }
}

/// Reopens every log file now and logs the failures.
fn reopen_now() {
    let list: Vec<Arc<LogFile>> = match files().lock() {
        Ok(m) => m.values().cloned().collect(),
        Err(_) => return,
    };
    for f in list {
        if let Err(e) = f.reopen() {
            if let Some(p) = &f.path {
                crate::elog!(
                    Alert,
                    "open() \"{}\" failed {}",
                    p.display(),
                    crate::core::errno_text(&e)
                );
            }
        }
    }
}

/// Drop files no longer referenced by any configuration (after a reload).
pub fn forget_unused() {
    if let Ok(mut m) = files().lock() {
        m.retain(|_, f| Arc::strong_count(f) > 1);
    }
}

/// Where an `error_log` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogDest {
    Stderr,
    File(PathBuf),
    /// `syslog:...` (see core/syslog.rs).
    Syslog(Arc<Peer>),
}

/// One destination of a [`Logger`].
#[derive(Debug, Clone)]
pub enum Sink {
    /// A file or stderr: lines go through the writer thread.
    File(Arc<LogFile>),
    /// A syslog server: the logging thread sends the datagram itself
    /// (non-blocking, as nginx).
    Syslog(Arc<Peer>),
}

/// A set of destinations with their levels.
#[derive(Debug, Clone, Default)]
pub struct Logger {
    pub sinks: Vec<(Sink, Level)>,
}

impl Logger {
    pub fn from_specs(specs: &[ErrorLogSpec]) -> std::io::Result<Logger> {
        let mut sinks = Vec::new();
        for s in specs {
            let sink = match &s.dest {
                LogDest::Stderr => Sink::File(open_log(None)?),
                LogDest::File(p) => Sink::File(open_log(Some(p))?),
                LogDest::Syslog(p) => Sink::Syslog(p.clone()),
            };
            sinks.push((sink, s.level));
        }
        Ok(Logger { sinks })
    }

    /// The logger of a stream or mail `server {}` with `error_log`s of
    /// its own or inherited (`specs`; None: the main log's), or nginx's
    /// error naming the block `at`.
    pub fn for_block(
        specs: Option<&[ErrorLogSpec]>,
        at: &Directive,
    ) -> ConfResult<Option<Arc<Logger>>> {
        let Some(specs) = specs else {
            return Ok(None);
        };
        let l = Logger::from_specs(specs).map_err(|e| {
            ConfError::at(
                format!("open() error log failed {}", crate::core::errno_text(&e)),
                at,
            )
        })?;
        Ok(Some(Arc::new(l)))
    }

    pub fn enabled(&self, level: Level) -> bool {
        self.sinks.iter().any(|(_, l)| level <= *l)
    }

    /// Writes one line: `YYYY/MM/DD HH:MM:SS [level] pid#tid: *conn msg`.
    pub fn log(&self, level: Level, conn: Option<u64>, msg: fmt::Arguments<'_>) {
        if !self.enabled(level) {
            return;
        }
        self.write_line(level, format_line(level, conn, msg));
    }

    /// [`Self::log`] for a message already in one piece.
    pub fn log_str(&self, level: Level, conn: Option<u64>, msg: &str) {
        self.log_with(level, conn, msg.len(), |line| line.push_str(msg));
    }

    /// [`Self::log`] for a message that `write` appends to the line, after
    /// its head (about `room` bytes of it): the message is written once,
    /// straight into the line that goes to the file, as an error line for
    /// every failed request (a 404 on a busy site) should be.
    pub fn log_with(
        &self,
        level: Level,
        conn: Option<u64>,
        room: usize,
        write: impl FnOnce(&mut String),
    ) {
        if !self.enabled(level) {
            return;
        }
        let mut line = line_start(level, conn, room + 1);
        write(&mut line);
        line.push('\n');
        self.write_line(level, line);
    }

    fn write_line(&self, level: Level, line: String) {
        let mut files = Files::None;
        for (sink, l) in &self.sinks {
            if level > *l {
                continue;
            }
            match sink {
                Sink::File(f) => files.push(f),
                Sink::Syslog(p) => p.send_error_line(level, &line),
            }
        }
        if files.as_slice().is_empty() {
            return;
        }
        match try_queue(Job::Line { files, line }) {
            Err(Job::Line { files, line }) => {
                for f in files.as_slice() {
                    f.write_all(line.as_bytes());
                }
            }
            // An emerg line often comes just before the process (or a
            // thread, with abort) ends: it must be on disk first.
            Ok(()) if level == Level::Emerg => flush(Duration::from_secs(5)),
            _ => {}
        }
    }
}

/// The formatted line, for callers that also print it (e.g. `-t`).
pub fn format_line(level: Level, conn: Option<u64>, msg: fmt::Arguments<'_>) -> String {
    use std::fmt::Write as _;
    let mut line = line_start(level, conn, 192);
    match msg.as_str() {
        Some(text) => line.push_str(text),
        None => {
            let _ = line.write_fmt(msg);
        }
    }
    line.push('\n');
    line
}

/// `2024/01/01 00:00:00 [error] PID#TID: *CONN `, in a buffer with room
/// for `room` more bytes (one allocation for the whole line, not
/// `format!`'s growth by reallocation).
fn line_start(level: Level, conn: Option<u64>, room: usize) -> String {
    let (pid, tid) = pid_tid();
    let mut line = String::with_capacity(64 + room);
    let ts = crate::http::date::err_log_time();
    line.push_str(std::str::from_utf8(&ts).unwrap_or("0000/00/00 00:00:00"));
    line.push_str(" [");
    line.push_str(level.name());
    line.push_str("] ");
    line.push_str(itoa::Buffer::new().format(pid));
    line.push('#');
    line.push_str(itoa::Buffer::new().format(tid));
    line.push_str(": ");
    if let Some(c) = conn {
        line.push('*');
        line.push_str(itoa::Buffer::new().format(c));
        line.push(' ');
    }
    line
}

/// Bumped in a forked child (daemon start), so that the `pid#tid` each
/// thread keeps is asked again there.
static FORK_GEN: AtomicU32 = AtomicU32::new(0);

extern "C" fn forked_child() {
    FORK_GEN.fetch_add(1, Ordering::Relaxed);
}

/// The caller's `pid#tid`, asked of the kernel once per thread (two
/// syscalls per line otherwise) and again after a fork.
fn pid_tid() -> (i32, i32) {
    thread_local! {
        static IDS: Cell<(u32, i32, i32)> = const { Cell::new((u32::MAX, 0, 0)) };
    }
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        // SAFETY: registers a plain extern "C" function, run in the child
        // only, that touches nothing but an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
    let generation = FORK_GEN.load(Ordering::Relaxed);
    IDS.with(|ids| {
        let (g, pid, tid) = ids.get();
        if g == generation {
            return (pid, tid);
        }
        // SAFETY: getpid/gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        ids.set((generation, pid, tid));
        (pid, tid)
    })
}

/// `s` appended to `out` as text, invalid UTF-8 replaced (as
/// `String::from_utf8_lossy`, whose scan costs several times the check
/// when the bytes are valid, as they nearly always are).
pub fn push_lossy(out: &mut String, s: &[u8]) {
    match std::str::from_utf8(s) {
        Ok(t) => out.push_str(t),
        Err(_) => out.push_str(&String::from_utf8_lossy(s)),
    }
}

fn global() -> &'static ArcSwap<Logger> {
    static G: OnceLock<ArcSwap<Logger>> = OnceLock::new();
    G.get_or_init(|| {
        ArcSwap::from_pointee(Logger {
            sinks: vec![(
                Sink::File(Arc::new(LogFile {
                    path: None,
                    file: Mutex::new(None),
                })),
                Level::Error,
            )],
        })
    })
}

/// The main error log (the `error_log` of the main context).
pub fn main_logger() -> Arc<Logger> {
    global().load_full()
}

/// The main error log, borrowed for a line (no reference count taken).
pub fn main_logger_ref() -> arc_swap::Guard<Arc<Logger>> {
    global().load()
}

/// The most verbose level of the main error log, as `Level as u8`
/// (`Error` until one is set): whether a debug line would be written at
/// all, asked without loading the logger.
static MAIN_MAX_LEVEL: AtomicU8 = AtomicU8::new(Level::Error as u8);

pub fn set_main_logger(l: Logger) {
    let max = l.sinks.iter().map(|(_, lv)| *lv).max();
    global().store(Arc::new(l));
    MAIN_MAX_LEVEL.store(max.map_or(0, |m| m as u8), Ordering::Relaxed);
}

/// Whether the main error log writes lines of `level` (an early answer
/// for the lines of every request, e.g. the debug line of `io::Policy`).
pub fn main_enabled(level: Level) -> bool {
    level as u8 <= MAIN_MAX_LEVEL.load(Ordering::Relaxed)
}

// ---- the writer thread ---------------------------------------------------------

/// Bytes of lines queued for the writer beyond which a logging thread waits.
const MAX_QUEUED: usize = 4 << 20;

enum Job {
    /// One formatted line for each of `files`.
    Line { files: Files, line: String },
    /// USR1: reopen every file.
    Reopen,
}

/// The files a line goes to: nearly always one, kept without a list
/// (an allocation per line otherwise).
enum Files {
    None,
    One(Arc<LogFile>),
    Many(Vec<Arc<LogFile>>),
}

impl Files {
    fn push(&mut self, f: &Arc<LogFile>) {
        *self = match std::mem::replace(self, Files::None) {
            Files::None => Files::One(f.clone()),
            Files::One(a) => Files::Many(vec![a, f.clone()]),
            Files::Many(mut v) => {
                v.push(f.clone());
                Files::Many(v)
            }
        };
    }

    fn as_slice(&self) -> &[Arc<LogFile>] {
        match self {
            Files::None => &[],
            Files::One(f) => std::slice::from_ref(f),
            Files::Many(v) => v,
        }
    }
}

impl Job {
    fn bytes(&self) -> usize {
        match self {
            Job::Line { files, line } => files.as_slice().len() * line.len(),
            Job::Reopen => 0,
        }
    }
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Bytes of the queued jobs and of the batch being written.
    bytes: usize,
    /// The writer thread runs and takes new jobs.
    on: bool,
    /// The writer is working on a batch taken off `jobs`.
    busy: bool,
    /// The writer sleeps on `work`: only then does a new job need a wake-up
    /// (a futex call per line otherwise, on every failed request).
    idle: bool,
    /// Threads waiting on `done` (for room, or for the queue to drain):
    /// the writer signals it only when there are some.
    waiting: usize,
}

struct Shared {
    q: Mutex<Queue>,
    /// Signalled when a job is queued or the writer is told to stop.
    work: Condvar,
    /// Signalled when the writer has finished a batch.
    done: Condvar,
}

fn shared() -> &'static Shared {
    static S: OnceLock<Shared> = OnceLock::new();
    S.get_or_init(|| Shared {
        q: Mutex::new(Queue::default()),
        work: Condvar::new(),
        done: Condvar::new(),
    })
}

/// A poisoned lock only means a thread panicked while holding it; the
/// queue itself is always consistent between statements.
fn lock_queue() -> MutexGuard<'static, Queue> {
    shared().q.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// Set on the writer thread: its own lines (a failed reopen) are
    /// written in place, in queue order, and never wait for room.
    static IS_WRITER: Cell<bool> = const { Cell::new(false) };
}

/// Queues `job` for the writer if it runs (waiting for room if the queue
/// is full); gives it back when the caller must do it itself.
fn try_queue(job: Job) -> Result<(), Job> {
    if IS_WRITER.with(|w| w.get()) {
        return Err(job);
    }
    let sh = shared();
    let mut q = lock_queue();
    if !q.on {
        return Err(job);
    }
    let n = job.bytes();
    // A line larger than the whole queue still goes in once the queue is
    // empty, so that nothing waits forever.
    while q.on && q.bytes > 0 && q.bytes + n > MAX_QUEUED {
        q.waiting += 1;
        q = sh.done.wait(q).unwrap_or_else(|e| e.into_inner());
        q.waiting -= 1;
    }
    if !q.on {
        return Err(job);
    }
    q.bytes += n;
    q.jobs.push_back(job);
    let wake = q.idle;
    drop(q);
    if wake {
        sh.work.notify_one();
    }
    Ok(())
}

/// [`try_queue`] for jobs without a payload to give back.
fn queue_job(job: Job) -> bool {
    try_queue(job).is_ok()
}

/// Starts the writer thread; from now on lines are queued. Called by the
/// master before it starts the workers.
pub fn start_writer() -> std::io::Result<()> {
    let mut q = lock_queue();
    if q.on {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("tern-error-log".into())
        .spawn(writer_loop)?;
    q.on = true;
    drop(q);
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(at_exit) };
    });
    Ok(())
}

/// Waits (at most `within`) until every line queued so far is written
/// (and what was queued meanwhile: the writer does not say which batch is
/// which). Never waits on the writer thread itself.
pub fn flush(within: Duration) {
    if IS_WRITER.with(|w| w.get()) {
        return;
    }
    drop(drained(within));
}

/// The queue, locked, once empty and idle or after `within`.
fn drained(within: Duration) -> MutexGuard<'static, Queue> {
    let sh = shared();
    let deadline = Instant::now() + within;
    let mut q = lock_queue();
    while q.on && (q.busy || !q.jobs.is_empty()) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        q.waiting += 1;
        q = sh
            .done
            .wait_timeout(q, left)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
        q.waiting -= 1;
    }
    q
}

/// Waits (at most `within`) until every queued line is written, then stops
/// the writer: later lines are written by the thread that logs them.
pub fn stop_writer(within: Duration) {
    let sh = shared();
    let mut q = drained(within);
    q.on = false;
    drop(q);
    // Wake the writer (to exit once the queue is empty) and every thread
    // waiting for room (to write its line itself).
    sh.work.notify_all();
    sh.done.notify_all();
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| stop_writer(Duration::from_secs(5)));
}

fn writer_loop() {
    IS_WRITER.with(|w| w.set(true));
    let sh = shared();
    let mut batch: Vec<Job> = Vec::new();
    let mut run: Vec<u8> = Vec::new();
    let mut q = lock_queue();
    loop {
        while q.jobs.is_empty() {
            if !q.on {
                return;
            }
            q.idle = true;
            q = sh.work.wait(q).unwrap_or_else(|e| e.into_inner());
            q.idle = false;
        }
        batch.extend(q.jobs.drain(..));
        q.busy = true;
        drop(q);
        let bytes: usize = batch.iter().map(Job::bytes).sum();
        write_batch(&mut batch, &mut run);
        q = lock_queue();
        q.bytes -= bytes;
        q.busy = false;
        if q.waiting > 0 {
            sh.done.notify_all();
        }
    }
}

/// Writes a batch in order. Consecutive lines to the same single file go
/// out in one `write(2)` (whole lines only, so nothing interleaves).
fn write_batch(batch: &mut Vec<Job>, run: &mut Vec<u8>) {
    let mut run_file: Option<Arc<LogFile>> = None;
    for job in batch.drain(..) {
        match job {
            Job::Line { files, line } => {
                let files = files.as_slice();
                if let ([f], Some(rf)) = (files, &run_file) {
                    if Arc::ptr_eq(f, rf) && run.len() < 64 * 1024 {
                        run.extend_from_slice(line.as_bytes());
                        continue;
                    }
                }
                flush_run(&mut run_file, run);
                if let [f] = files {
                    run_file = Some(f.clone());
                    run.extend_from_slice(line.as_bytes());
                } else {
                    for f in files {
                        f.write_all(line.as_bytes());
                    }
                }
            }
            Job::Reopen => {
                flush_run(&mut run_file, run);
                reopen_now();
            }
        }
    }
    flush_run(&mut run_file, run);
}

fn flush_run(file: &mut Option<Arc<LogFile>>, run: &mut Vec<u8>) {
    if let Some(f) = file.take() {
        f.write_all(run);
    }
    run.clear();
}

/// Makes a panic an `[alert]` in the error log instead of a line on a
/// stderr nobody reads. A panic while serving is contained by the task
/// that runs the connection (or HTTP/2 stream): unwinding drops its socket
/// and its `worker_connections` slot, and the worker goes on with every
/// other connection. nginx's counterpart is a worker that dies on a signal
/// and is respawned, taking all of its connections with it.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = info.payload().downcast_ref::<String>() {
            s.clone()
        } else {
            "(no message)".to_string()
        };
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("a thread");
        crate::elog!(
            Alert,
            "panic in {} at {}: {}; the task that ran it ended, closing what it served",
            name,
            at,
            msg
        );
    }));
}

/// The request URI that panics on purpose (`TERN_FAULT_PANIC_URI`, read
/// once at start), so tests can prove a panic is contained. Only whoever
/// starts tern can set it; unset, the check is one load of a static.
pub fn fault_panic_uri() -> Option<&'static [u8]> {
    static URI: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    URI.get_or_init(|| {
        std::env::var_os("TERN_FAULT_PANIC_URI")
            .map(|v| std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()).to_vec())
    })
    .as_deref()
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
    let dest = if target == "stderr" {
        LogDest::Stderr
    } else if let Some(rest) = target.strip_prefix("syslog:") {
        LogDest::Syslog(Arc::new(
            Peer::parse(rest).map_err(|m| ConfError::at(m, d))?,
        ))
    } else if target.starts_with("memory:") {
        return Err(ConfError::at(
            "memory logging is not supported by tern yet",
            d,
        ));
    } else {
        LogDest::File(cx.path(target))
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
    Ok(ErrorLogSpec { dest, level })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines from several threads through the writer: whole, each thread's
    /// in order, none lost; a reopen queued between them splits the file
    /// where it was queued; after `stop_writer` lines are written in place.
    #[test]
    fn writer_keeps_lines_whole_ordered_and_reopens_in_order() {
        let dir = std::env::temp_dir().join(format!("tern-log-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("e.log");
        let lg = Arc::new(Logger {
            sinks: vec![(
                Sink::File(open_log(Some(&path)).expect("open")),
                Level::Info,
            )],
        });
        start_writer().expect("writer");
        let burst = |tag: &'static str| {
            let ts: Vec<_> = (0..4)
                .map(|t| {
                    let lg = lg.clone();
                    std::thread::spawn(move || {
                        for i in 0..500 {
                            lg.log(
                                Level::Info,
                                None,
                                format_args!("{tag} t{t} n{i:04} {}", "x".repeat(300)),
                            );
                        }
                    })
                })
                .collect();
            for t in ts {
                t.join().expect("thread");
            }
        };
        burst("before");
        std::fs::rename(&path, dir.join("e.log.1")).expect("rename");
        reopen_all();
        burst("after");
        stop_writer(Duration::from_secs(10));
        lg.log(Level::Info, None, format_args!("in place"));
        let check = |p: &Path, tag: &str| -> String {
            let text = std::fs::read_to_string(p).expect("read");
            for t in 0..4 {
                let mine: Vec<&str> = text
                    .lines()
                    .filter(|l| l.contains(&format!("{tag} t{t} ")))
                    .collect();
                assert_eq!(mine.len(), 500, "{tag} t{t}");
                for (i, l) in mine.iter().enumerate() {
                    assert!(l.contains(" [info] "), "{l}");
                    assert!(
                        l.ends_with(&format!("{tag} t{t} n{i:04} {}", "x".repeat(300))),
                        "{l}"
                    );
                }
            }
            text
        };
        let old = check(&dir.join("e.log.1"), "before");
        assert!(!old.contains("after"));
        let new = check(&path, "after");
        assert!(!new.contains("before"));
        assert!(new.ends_with("in place\n"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
