//! The master: owns the configuration, the listening sockets, the pid file
//! and the signals, and supervises the worker threads.
//!
//! Start: bind every listener, write the pid file, start N workers and hand
//! each its sockets. Then wait for signals on the main thread:
//! - HUP: parse and compile the file again; on failure log and keep serving
//!   the old configuration; on success swap it in (requests already running
//!   keep theirs), open new listeners, close removed ones, update pools.
//!   http and stream listeners are reconciled alike; a listener kept
//!   across a reload keeps its socket (no connection is refused or closed).
//! - QUIT: workers stop accepting, finish what they are doing, exit.
//! - TERM/INT: exit now. USR1: reopen log files.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::core::conf::{self, Config};
use crate::core::log::{self, Level, Logger};
use crate::core::worker::{self, Ctrl, ListenSock, Proto, Stats};
use crate::http::conf::{Listen, ListenAddr};

/// How the configuration is (re)loaded.
#[derive(Debug, Clone)]
pub struct Source {
    pub conf_file: Option<PathBuf>,
    pub prefix: PathBuf,
    pub extra: Option<String>,
    /// `-e`: the error log used before the config names one.
    pub error_log: Option<PathBuf>,
}

impl Source {
    pub fn load(&self) -> Result<Config, crate::config::ConfError> {
        match &self.conf_file {
            Some(f) => conf::load(f, &self.prefix, self.extra.as_deref()),
            None => crate::core::conf::load_embedded(&self.prefix, self.extra.as_deref()),
        }
    }
}

/// Sockets bound for one listen address: one, or one per worker with reuseport.
struct Bound {
    listen: Listen,
    proto: Proto,
    socks: Vec<socket2::Socket>,
}

/// Every address the configuration listens on, and what it serves. The
/// same address in `http` and in `stream` is the error nginx would get
/// binding it twice.
fn listens(cfg: &Config) -> Result<Vec<(Listen, Proto)>, String> {
    let mut out: Vec<(Listen, Proto)> = cfg
        .http
        .as_ref()
        .map(|h| {
            h.addrs
                .iter()
                .map(|a| (a.listen.clone(), Proto::Http))
                .collect()
        })
        .unwrap_or_default();
    if let Some(st) = &cfg.stream {
        for l in &st.listens {
            if out.iter().any(|(h, _)| h.addr == l.addr) {
                return Err(format!(
                    "bind() to {} failed {}",
                    l.addr,
                    crate::core::errno_text(&std::io::Error::from_raw_os_error(libc::EADDRINUSE))
                ));
            }
            out.push((l.clone(), Proto::Stream));
        }
    }
    Ok(out)
}

/// Binds what `want` has and `have` lacks (or has with other socket
/// options). All or nothing: on an error `have` is left as it was, so a
/// failed reload leaves no half-bound listener that the workers never got.
fn bind_all(
    want: &[(Listen, Proto)],
    workers: usize,
    have: &mut HashMap<ListenAddr, Bound>,
) -> Result<Vec<ListenAddr>, String> {
    let mut fresh: Vec<Bound> = Vec::new();
    let mut retag: Vec<(ListenAddr, Proto)> = Vec::new();
    for (l, proto) in want {
        if let Some(b) = have.get(&l.addr) {
            if b.listen.reuseport == l.reuseport && (!l.reuseport || b.socks.len() == workers) {
                if b.proto != *proto {
                    // Same socket, other protocol: hand it to the workers
                    // again with the new kind; nothing to bind.
                    retag.push((l.addr.clone(), *proto));
                }
                continue;
            }
        }
        let n = if l.reuseport { workers } else { 1 };
        let mut socks = Vec::new();
        for _ in 0..n {
            socks.push(crate::core::listen::bind(l)?);
        }
        fresh.push(Bound {
            listen: l.clone(),
            proto: *proto,
            socks,
        });
    }
    let mut added = Vec::new();
    for (a, proto) in retag {
        if let Some(b) = have.get_mut(&a) {
            b.proto = proto;
            added.push(a);
        }
    }
    for b in fresh {
        added.push(b.listen.addr.clone());
        have.insert(b.listen.addr.clone(), b);
    }
    Ok(added)
}

fn to_worker_sock(s: &socket2::Socket, addr: &ListenAddr) -> std::io::Result<ListenSock> {
    let dup = s.try_clone()?;
    Ok(match addr {
        ListenAddr::Inet(_) => ListenSock::Tcp(dup.into()),
        ListenAddr::Unix(_) => ListenSock::Unix(dup.into()),
    })
}

fn send_listener(workers: &[mpsc::UnboundedSender<Ctrl>], b: &Bound) {
    for (i, w) in workers.iter().enumerate() {
        let s = if b.socks.len() > 1 {
            &b.socks[i % b.socks.len()]
        } else {
            &b.socks[0]
        };
        match to_worker_sock(s, &b.listen.addr) {
            Ok(ls) => {
                let _ = w.send(Ctrl::Listen(b.listen.addr.clone(), ls, b.proto));
            }
            Err(e) => crate::elog!(
                Alert,
                "dup() of listener {} failed {}",
                b.listen.addr,
                crate::core::errno_text(&e)
            ),
        }
    }
}

fn main_logger_for(cfg: &Config, src: &Source) -> std::io::Result<Logger> {
    if cfg.main.error_log.is_empty() {
        let path = src
            .error_log
            .clone()
            .unwrap_or_else(|| cfg.prefix.join("logs/error.log"));
        let spec = crate::core::conf::ErrorLogSpec {
            path: if path.as_os_str() == "stderr" {
                None
            } else {
                Some(path)
            },
            level: Level::Error,
        };
        Logger::from_specs(&[spec])
    } else {
        Logger::from_specs(&cfg.main.error_log)
    }
}

fn pid_path(cfg: &Config) -> PathBuf {
    cfg.main
        .pid
        .clone()
        .unwrap_or_else(|| cfg.prefix.join("logs/nginx.pid"))
}

/// Starts serving; returns the process exit code.
pub fn run(src: Source, cfg: Config) -> i32 {
    match main_logger_for(&cfg, &src) {
        Ok(l) => log::set_main_logger(l),
        Err(e) => {
            eprintln!(
                "tern: [emerg] open() error log failed {}",
                crate::core::errno_text(&e)
            );
            return 1;
        }
    }
    for w in &cfg.warnings {
        crate::elog!(Warn, "{}", w);
    }
    if let Some(n) = cfg.main.worker_rlimit_nofile {
        let r = libc::rlimit {
            rlim_cur: n,
            rlim_max: n,
        };
        // SAFETY: a valid rlimit struct is passed by pointer.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
            let e = std::io::Error::last_os_error();
            crate::elog!(
                Alert,
                "setrlimit(RLIMIT_NOFILE, {}) failed {}",
                n,
                crate::core::errno_text(&e)
            );
        }
    }
    let workers_n = cfg.main.workers();
    let mut bound: HashMap<ListenAddr, Bound> = HashMap::new();
    if let Err(msg) = listens(&cfg).and_then(|want| bind_all(&want, workers_n, &mut bound)) {
        eprintln!("tern: [emerg] {}", msg);
        crate::elog!(Emerg, "{}", msg);
        return 1;
    }
    if cfg.main.daemon.unwrap_or(true) {
        if let Err(e) = daemonize() {
            eprintln!(
                "tern: [emerg] daemon() failed {}",
                crate::core::errno_text(&e)
            );
            return 1;
        }
    }
    crate::cache::start_keeper();
    // Signal handlers go in before the pid file and the workers: a signal
    // that arrives between the first accept and their installation would otherwise
    // take its default action (QUIT would kill the process mid-response).
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::elog!(Emerg, "master event loop: {}", e);
            return 1;
        }
    };
    let sigs = {
        let _in_rt = rt.enter();
        match Signals::install() {
            Ok(s) => s,
            Err(e) => {
                crate::elog!(Emerg, "could not install signal handlers: {}", e);
                return 1;
            }
        }
    };
    let pid_file = pid_path(&cfg);
    if let Err(e) = std::fs::write(&pid_file, format!("{}\n", std::process::id())) {
        let msg = format!(
            "open() \"{}\" failed {}",
            pid_file.display(),
            crate::core::errno_text(&e)
        );
        eprintln!("tern: [emerg] {}", msg);
        crate::elog!(Emerg, "{}", msg);
        return 1;
    }
    let user = match crate::core::user::resolve(&cfg.main) {
        Ok(u) => u,
        Err(msg) => {
            eprintln!("tern: [emerg] {}", msg);
            crate::elog!(Emerg, "{}", msg);
            let _ = std::fs::remove_file(&pid_file);
            return 1;
        }
    };
    if let Some(u) = user.clone() {
        crate::io::set_thread_init(Box::new(move || {
            if let Err(e) = crate::core::user::drop_thread_privileges(&u) {
                crate::elog!(Emerg, "thread pool thread could not drop privileges: {}", e);
                // A pool thread that kept root would serve files as root: stop here.
                std::process::abort();
            }
        }));
    }
    let pools = match crate::io::Pools::start(&cfg.main.io) {
        Ok(p) => Arc::new(ArcSwap::from_pointee(p)),
        Err(e) => {
            crate::elog!(Emerg, "thread pool start failed: {}", e);
            return 1;
        }
    };
    // From here on a worker never writes an error-log line itself (see
    // core/log.rs); started by this thread, the writer keeps its rights
    // to reopen the logs.
    if let Err(e) = log::start_writer() {
        crate::elog!(
            Alert,
            "could not start the error log writer, lines are written in place: {}",
            e
        );
    }
    let config = Arc::new(ArcSwap::from_pointee(cfg));
    let stats = Arc::new(Stats::default());
    let mut senders = Vec::new();
    let mut handles = Vec::new();
    for i in 0..workers_n {
        let (tx, rx) = mpsc::unbounded_channel();
        let (c, s, p) = (config.clone(), stats.clone(), pools.clone());
        let u = user.clone();
        let h = std::thread::Builder::new()
            .name(format!("tern-worker-{}", i))
            .spawn(move || {
                if let Some(u) = u {
                    if let Err(e) = crate::core::user::drop_thread_privileges(&u) {
                        crate::elog!(Emerg, "worker {} could not drop privileges: {}", i, e);
                        return;
                    }
                }
                worker::run(i, c, s, p, rx)
            });
        match h {
            Ok(h) => {
                senders.push(tx);
                handles.push(h);
            }
            Err(e) => {
                crate::elog!(Alert, "could not start worker thread: {}", e);
            }
        }
    }
    for b in bound.values() {
        send_listener(&senders, b);
    }
    crate::elog!(
        Notice,
        "tern/{} started, {} workers",
        crate::http::response::VERSION,
        workers_n
    );
    let graceful = rt.block_on(signals(sigs, &src, &config, &pools, &senders, &mut bound));
    if graceful {
        for s in &senders {
            let _ = s.send(Ctrl::Quit);
        }
        for h in handles {
            let _ = h.join();
        }
    }
    let cfg = config.load();
    let _ = std::fs::remove_file(pid_path(&cfg));
    for b in bound.values() {
        if let ListenAddr::Unix(p) = &b.listen.addr {
            let _ = std::fs::remove_file(p);
        }
    }
    crate::elog!(Notice, "exit");
    // Everything queued goes out before the process exits.
    log::stop_writer(std::time::Duration::from_secs(5));
    0
}

/// The master's signal streams, installed once at start.
struct Signals {
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
}

impl Signals {
    /// Must run inside the master runtime's context.
    fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            usr1: signal(SignalKind::user_defined1())?,
        })
    }
}

/// Waits for signals; returns true for a graceful stop, false for a fast one.
async fn signals(
    sigs: Signals,
    src: &Source,
    config: &Arc<ArcSwap<Config>>,
    pools: &Arc<ArcSwap<crate::io::Pools>>,
    workers: &[mpsc::UnboundedSender<Ctrl>],
    bound: &mut HashMap<ListenAddr, Bound>,
) -> bool {
    let Signals {
        mut hup,
        mut quit,
        mut term,
        mut int,
        mut usr1,
    } = sigs;
    loop {
        tokio::select! {
            _ = hup.recv() => {
                crate::elog!(Notice, "signal 1 (SIGHUP) received from {}, reconfiguring", "master");
                reload(src, config, pools, workers, bound);
            }
            _ = quit.recv() => {
                crate::elog!(Notice, "signal 3 (SIGQUIT) received, shutting down");
                return true;
            }
            _ = term.recv() => {
                crate::elog!(Notice, "signal 15 (SIGTERM) received, exiting");
                return false;
            }
            _ = int.recv() => {
                crate::elog!(Notice, "signal 2 (SIGINT) received, exiting");
                return false;
            }
            _ = usr1.recv() => {
                crate::elog!(Notice, "signal 10 (SIGUSR1) received, reopening logs");
                log::reopen_all();
            }
        }
    }
}

fn reload(
    src: &Source,
    config: &Arc<ArcSwap<Config>>,
    pools: &Arc<ArcSwap<crate::io::Pools>>,
    workers: &[mpsc::UnboundedSender<Ctrl>],
    bound: &mut HashMap<ListenAddr, Bound>,
) {
    let new = match src.load() {
        Ok(c) => c,
        Err(e) => {
            crate::elog!(Emerg, "{}", e);
            crate::elog!(
                Alert,
                "reload failed, the previous configuration keeps serving"
            );
            return;
        }
    };
    let (want, added) = match listens(&new).and_then(|want| {
        let added = bind_all(&want, workers.len(), bound)?;
        Ok((want, added))
    }) {
        Ok(a) => a,
        Err(msg) => {
            crate::elog!(Emerg, "{}", msg);
            crate::elog!(
                Alert,
                "reload failed, the previous configuration keeps serving"
            );
            return;
        }
    };
    let new_pools = match pools.load().reconcile(&new.main.io) {
        Ok(p) => p,
        Err(e) => {
            crate::elog!(Emerg, "thread pool start failed: {}", e);
            return;
        }
    };
    let logger = match main_logger_for(&new, src) {
        Ok(l) => l,
        Err(e) => {
            crate::elog!(
                Emerg,
                "open() error log failed {}",
                crate::core::errno_text(&e)
            );
            return;
        }
    };
    // The new configuration is complete: publish it, then move listeners.
    config.store(Arc::new(new));
    pools.store(Arc::new(new_pools));
    log::set_main_logger(logger);
    for w in &config.load().warnings {
        crate::elog!(Warn, "{}", w);
    }
    let removed: Vec<ListenAddr> = bound
        .keys()
        .filter(|a| !want.iter().any(|(l, _)| &l.addr == *a))
        .cloned()
        .collect();
    for a in &removed {
        for w in workers {
            let _ = w.send(Ctrl::Unlisten(a.clone()));
        }
        if let Some(b) = bound.remove(a) {
            if let ListenAddr::Unix(p) = &b.listen.addr {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    for a in &added {
        if let Some(b) = bound.get(a) {
            for w in workers {
                let _ = w.send(Ctrl::Unlisten(a.clone()));
            }
            send_listener(workers, b);
        }
    }
    log::forget_unused();
    crate::elog!(
        Notice,
        "reconfigured: {} listeners added, {} removed",
        added.len(),
        removed.len()
    );
}

fn daemonize() -> std::io::Result<()> {
    // SAFETY: fork before any thread is started; the parent exits at once.
    match unsafe { libc::fork() } {
        -1 => return Err(std::io::Error::last_os_error()),
        0 => {}
        _ => std::process::exit(0),
    }
    // SAFETY: setsid has no preconditions.
    if unsafe { libc::setsid() } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    use std::os::fd::AsRawFd;
    for fd in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors with a valid source fd.
        unsafe { libc::dup2(null.as_raw_fd(), fd) };
    }
    Ok(())
}
