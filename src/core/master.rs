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
//! - USR2, WINCH and the new binary's SIGCHLD: binary upgrade on the fly
//!   (see `core::upgrade`); WINCH stops the workers while the listeners stay
//!   open here, and HUP or the new binary's end starts them again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::core::conf::{self, Config};
use crate::core::log::{self, Level, Logger};
use crate::core::upgrade::{self, Inherited};
use crate::core::user::Creds;
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
    if let Some(m) = &cfg.mail {
        for l in &m.listens {
            if out.iter().any(|(h, _)| h.addr == l.addr) {
                return Err(format!(
                    "bind() to {} failed {}",
                    l.addr,
                    crate::core::errno_text(&std::io::Error::from_raw_os_error(libc::EADDRINUSE))
                ));
            }
            out.push((l.clone(), Proto::Mail));
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
    inherited: &mut Inherited,
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
        if let Some(sa) = crate::core::listen::sock_addr(l) {
            for s in inherited.take(&sa, n) {
                socks.push(crate::core::listen::adopt(s, l)?);
            }
        }
        while socks.len() < n {
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
        ListenAddr::Udp(_) => ListenSock::Udp(dup.into()),
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
            dest: if path.as_os_str() == "stderr" {
                crate::core::log::LogDest::Stderr
            } else {
                crate::core::log::LogDest::File(path)
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

/// Starts serving; returns the process exit code. `inherited` holds the
/// listening sockets an old binary handed over (USR2), if any.
pub fn run(src: Source, cfg: Config, mut inherited: Inherited) -> i32 {
    match main_logger_for(&cfg, &src) {
        Ok(l) => {
            log::set_main_logger(l);
            log::install_panic_hook();
        }
        Err(e) => {
            eprintln!(
                "tern: [emerg] open() error log failed {}",
                crate::core::errno_text(&e)
            );
            return 1;
        }
    }
    if let Some(w) = &inherited.warning {
        crate::elog!(Emerg, "{}", w);
    }
    let was_inherited = !inherited.text.is_empty();
    if was_inherited {
        crate::elog!(
            Notice,
            "using inherited sockets from \"{}\"",
            inherited.text
        );
    }
    for w in cfg.warnings.iter().chain(&cfg.lint) {
        crate::elog!(Warn, "{}", w);
    }
    warn_connections_over_nofile(&cfg);
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
    // A client may send `-s reload` as soon as the port answers, before
    // the handlers below are in; held until then, such a signal is
    // delivered to them instead of killing the process.
    let unheld = hold_signals();
    let mut bound: HashMap<ListenAddr, Bound> = HashMap::new();
    if let Err(msg) =
        listens(&cfg).and_then(|want| bind_all(&want, workers_n, &mut bound, &mut inherited))
    {
        eprintln!("tern: [emerg] {}", msg);
        crate::elog!(Emerg, "{}", msg);
        return 1;
    }
    // Inherited sockets the configuration no longer listens on close here.
    drop(inherited);
    // A new binary started by an old one stays where it was started: the
    // old one is detached already, and must see this process as its child.
    let daemonized = was_inherited || cfg.main.daemon.unwrap_or(true);
    if cfg.main.daemon.unwrap_or(true) && !was_inherited {
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
    release_signals(&unheld);
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
    let mut workers = Workers {
        n: workers_n,
        config: Arc::new(ArcSwap::from_pointee(cfg)),
        stats: Arc::new(Stats::default()),
        pools,
        user,
        senders: Vec::new(),
        handles: Vec::new(),
    };
    workers.start(&bound);
    crate::elog!(
        Notice,
        "tern/{} (nginx/{} compatible) started, {} workers",
        crate::http::response::VERSION,
        crate::http::response::NGINX_VERSION,
        workers_n
    );
    let mut state = State {
        src: &src,
        bound,
        daemonized,
        new_binary: None,
    };
    let graceful = rt.block_on(signals(sigs, &mut state, &mut workers));
    workers.stop();
    if graceful {
        for h in workers.handles.drain(..) {
            let _ = h.join();
        }
    }
    let cfg = workers.config.load();
    // With a new binary running, the pid file and the unix sockets are its.
    let pid_file = pid_path(&cfg);
    if state.new_binary.is_some() {
        let _ = std::fs::remove_file(upgrade::oldbin_path(&pid_file));
    } else {
        let _ = std::fs::remove_file(pid_file);
        for b in state.bound.values() {
            if let ListenAddr::Unix(p) = &b.listen.addr {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    crate::elog!(Notice, "exit");
    // Everything queued goes out before the process exits.
    log::stop_writer(std::time::Duration::from_secs(5));
    0
}

/// The worker threads, which WINCH stops and HUP (or the end of a new
/// binary) starts again while the master keeps the listeners.
struct Workers {
    n: usize,
    config: Arc<ArcSwap<Config>>,
    stats: Arc<Stats>,
    pools: Arc<ArcSwap<crate::io::Pools>>,
    user: Option<Creds>,
    /// One per running worker; empty while stopped.
    senders: Vec<mpsc::UnboundedSender<Ctrl>>,
    /// Running and stopping workers, joined at a graceful exit.
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    fn running(&self) -> bool {
        !self.senders.is_empty()
    }

    fn start(&mut self, bound: &HashMap<ListenAddr, Bound>) {
        for i in 0..self.n {
            let (tx, rx) = mpsc::unbounded_channel();
            let (c, s, p) = (self.config.clone(), self.stats.clone(), self.pools.clone());
            let u = self.user.clone();
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
                    self.senders.push(tx);
                    self.handles.push(h);
                }
                Err(e) => {
                    crate::elog!(Alert, "could not start worker thread: {}", e);
                }
            }
        }
        for b in bound.values() {
            send_listener(&self.senders, b);
        }
    }

    /// Graceful stop: the workers close their listeners, finish their
    /// requests and end; the listening sockets stay in `bound`.
    fn stop(&mut self) {
        for s in self.senders.drain(..) {
            let _ = s.send(Ctrl::Quit);
        }
    }
}

/// What the signal loop changes besides the workers.
struct State<'a> {
    src: &'a Source,
    bound: HashMap<ListenAddr, Bound>,
    /// nginx only honours WINCH when detached (or started by an old binary).
    daemonized: bool,
    /// The new binary started by USR2 while it runs.
    new_binary: Option<std::process::Child>,
}

/// The master's signal streams, installed once at start.
struct Signals {
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    winch: tokio::signal::unix::Signal,
    chld: tokio::signal::unix::Signal,
}

/// The signals the master handles, blocked on this thread (and on threads
/// it starts meanwhile); returns the mask to restore.
fn hold_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise and
    // fill it, and pthread_sigmask only reads `set` and writes `old`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGWINCH,
            libc::SIGCHLD,
        ] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

/// Restores the mask [`hold_signals`] replaced: signals that came
/// meanwhile are delivered now, to the handlers.
fn release_signals(old: &libc::sigset_t) {
    // SAFETY: `old` was filled by pthread_sigmask.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut());
    }
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
            usr2: signal(SignalKind::user_defined2())?,
            winch: signal(SignalKind::window_change())?,
            chld: signal(SignalKind::child())?,
        })
    }
}

/// Waits for signals; returns true for a graceful stop, false for a fast one.
async fn signals(sigs: Signals, st: &mut State<'_>, workers: &mut Workers) -> bool {
    let Signals {
        mut hup,
        mut quit,
        mut term,
        mut int,
        mut usr1,
        mut usr2,
        mut winch,
        mut chld,
    } = sigs;
    loop {
        tokio::select! {
            _ = hup.recv() => {
                if st.new_binary.is_some() {
                    // nginx: with a new binary running, HUP to the old one
                    // brings its workers back (the way to roll back an
                    // upgrade) and reads no configuration.
                    crate::elog!(Notice, "signal 1 (SIGHUP) received, starting worker processes");
                    if !workers.running() {
                        workers.start(&st.bound);
                    }
                    continue;
                }
                crate::elog!(Notice, "signal 1 (SIGHUP) received from {}, reconfiguring", "master");
                reload(st, workers);
                if !workers.running() {
                    workers.start(&st.bound);
                }
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
            _ = usr2.recv() => {
                if st.new_binary.is_some() || upgrade::parent_unchanged() {
                    crate::elog!(Notice, "signal 12 (SIGUSR2) received, ignoring");
                    crate::elog!(Crit, "the changing binary signal is ignored: you should shutdown or terminate before either old or new binary's process");
                } else {
                    crate::elog!(Notice, "signal 12 (SIGUSR2) received, changing binary");
                    st.new_binary = change_binary(&workers.config.load(), &st.bound);
                }
            }
            _ = winch.recv() => {
                if st.daemonized {
                    crate::elog!(Notice, "signal 28 (SIGWINCH) received, stop accepting connections");
                    workers.stop();
                } else {
                    crate::elog!(Notice, "signal 28 (SIGWINCH) received");
                }
            }
            _ = chld.recv() => reap_new_binary(st, workers),
        }
    }
}

/// USR2: hands the listeners to a new process of the binary at argv[0].
fn change_binary(cfg: &Config, bound: &HashMap<ListenAddr, Bound>) -> Option<std::process::Child> {
    crate::elog!(Notice, "changing binary");
    let pid = pid_path(cfg);
    let old = upgrade::oldbin_path(&pid);
    let exe = upgrade::exe_display();
    if let Err(e) = std::fs::rename(&pid, &old) {
        crate::elog!(
            Alert,
            "rename() {} to {} failed {} before executing new binary process \"{}\"",
            pid.display(),
            old.display(),
            crate::core::errno_text(&e),
            exe
        );
        return None;
    }
    let socks: Vec<&socket2::Socket> = bound
        .values()
        .filter(|b| !matches!(b.listen.addr, ListenAddr::Udp(_)))
        .flat_map(|b| b.socks.iter())
        .collect();
    match upgrade::exec_new_binary(&socks) {
        Ok(child) => {
            crate::elog!(Notice, "start new binary process {}", child.id());
            Some(child)
        }
        Err(e) => {
            crate::elog!(
                Alert,
                "execve() failed while executing new binary process \"{}\" {}",
                exe,
                crate::core::errno_text(&e)
            );
            if let Err(e) = std::fs::rename(&old, &pid) {
                crate::elog!(
                    Alert,
                    "rename() {} back to {} failed {} after an attempt to execute new binary process \"{}\"",
                    old.display(),
                    pid.display(),
                    crate::core::errno_text(&e),
                    exe
                );
            }
            None
        }
    }
}

/// SIGCHLD: if the new binary has ended, this process is the server
/// again: the pid file comes back, and stopped workers start.
fn reap_new_binary(st: &mut State<'_>, workers: &mut Workers) {
    let Some(child) = st.new_binary.as_mut() else {
        return;
    };
    let status = match child.try_wait() {
        Ok(Some(s)) => s,
        _ => return,
    };
    let id = child.id();
    st.new_binary = None;
    {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(c), _) => {
                crate::elog!(Notice, "new binary process {} exited with code {}", id, c)
            }
            (None, Some(s)) => {
                crate::elog!(Alert, "new binary process {} exited on signal {}", id, s)
            }
            _ => {}
        }
    }
    let pid = pid_path(&workers.config.load());
    let old = upgrade::oldbin_path(&pid);
    if let Err(e) = std::fs::rename(&old, &pid) {
        crate::elog!(
            Alert,
            "rename() {} back to {} failed {} after the new binary process \"{}\" exited",
            old.display(),
            pid.display(),
            crate::core::errno_text(&e),
            upgrade::exe_display()
        );
    }
    if !workers.running() {
        workers.start(&st.bound);
    }
}

fn reload(st: &mut State<'_>, w: &Workers) {
    let (src, config, pools, workers, bound) =
        (st.src, &w.config, &w.pools, &w.senders, &mut st.bound);
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
        let added = bind_all(&want, w.n, bound, &mut Inherited::default())?;
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
    let published = config.load();
    for w in published.warnings.iter().chain(&published.lint) {
        crate::elog!(Warn, "{}", w);
    }
    if let Some(ms) = published.main.worker_shutdown_timeout_ms {
        for w in workers {
            let _ = w.send(Ctrl::Reloaded(std::time::Duration::from_millis(ms)));
        }
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

/// nginx's start-up warning when worker_connections cannot all get a
/// descriptor: over the current limit, and over worker_rlimit_nofile when
/// that is set (the limit named is the one that will hold).
fn warn_connections_over_nofile(cfg: &Config) {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct passed by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) } != 0 {
        crate::elog!(Alert, "getrlimit(RLIMIT_NOFILE) failed, ignored");
        return;
    }
    let conns = cfg.main.connections() as u64;
    let set = cfg.main.worker_rlimit_nofile;
    if conns > cur.rlim_cur && set.is_none_or(|n| conns > n) {
        crate::elog!(
            Warn,
            "{} worker_connections exceed open file resource limit: {}",
            conns,
            set.unwrap_or(cur.rlim_cur)
        );
    }
}
