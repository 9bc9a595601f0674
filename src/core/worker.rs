//! Worker threads: each runs a tokio `current_thread` runtime (its own
//! event loop), accepts on the listeners the master hands it, and serves
//! connections as local tasks.
//!
//! Control flows one way, master -> worker, over a channel of [`Ctrl`]
//! messages: add or remove a listener (reload), quit gracefully, stop now.
//! A listener is either http or stream ([`Proto`]); both kinds share the
//! accept loop and the `worker_connections` budget, and differ only in
//! the function a connection is handed to.
//! The configuration is read per request from the shared [`ArcSwap`], so
//! a reload needs no message at all.
//!
//! An HTTP connection is a task while it works and for its first second
//! of idleness; after that its socket waits in the worker's parking lot
//! ([`crate::core::park`]) and [`spawn_http`] gives it a new task when
//! bytes arrive. Its `worker_connections` slot ([`ConnSlot`]) travels
//! with it, so the accounting does not see the difference.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, watch, Notify};

use crate::core::conf::Config;
use crate::core::park;
use crate::core::sock::{LazySock, Registrable};
use crate::http::conf::ListenAddr;
use crate::http::serve::{self, ConnInfo, IdleWait, Served};
use crate::tls::stream::{Accepted, TlsStream};
use crate::tls::TlsState;

/// Counters shared by all workers (stub_status and metrics read them).
#[derive(Debug, Default)]
pub struct Stats {
    pub accepts: AtomicU64,
    pub handled: AtomicU64,
    pub requests: AtomicU64,
    pub active: AtomicU64,
    /// Connections reading a request head (stub_status "Reading").
    pub reading: AtomicU64,
    /// Connections handling a request or writing a response ("Writing").
    pub writing: AtomicU64,
}

impl Stats {
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Idle keep-alive connections ("Waiting"): active minus the others.
    pub fn waiting(&self) -> u64 {
        let a = self.active.load(Ordering::Relaxed);
        a.saturating_sub(
            self.reading.load(Ordering::Relaxed) + self.writing.load(Ordering::Relaxed),
        )
    }
}

/// Counts a connection in one stub_status state while alive.
pub struct StateGuard<'a>(&'a AtomicU64);

impl<'a> StateGuard<'a> {
    pub fn enter(c: &'a AtomicU64) -> StateGuard<'a> {
        c.fetch_add(1, Ordering::Relaxed);
        StateGuard(c)
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What every connection of a worker can reach.
pub struct WorkerShared {
    pub config: Arc<ArcSwap<Config>>,
    pub quit: watch::Receiver<bool>,
    /// Set when worker_shutdown_timeout runs out after a graceful stop:
    /// the connections still open close now, and the requests still in
    /// flight on them are logged as they end (as nginx's 499).
    pub expired: watch::Receiver<bool>,
    pub stats: Arc<Stats>,
    pub pools: Arc<ArcSwap<crate::io::Pools>>,
    pub worker: usize,
    /// Open connections of this worker.
    pub active: AtomicUsize,
    /// Signalled when a connection of this worker closes.
    pub freed: Notify,
}

impl WorkerShared {
    /// Resolves when a request that began at `since` must end unfinished,
    /// as nginx's worker_shutdown_timeout ends the requests of a worker
    /// that is going away: after a graceful stop (QUIT) once the timeout
    /// runs out, or after a reload that came while the request ran (tern
    /// reloads in place; nginx's old worker would end it then). Never
    /// without `worker_shutdown_timeout`.
    ///
    /// Nothing is registered until it is first polled: a request that
    /// completes on its first poll (a static file from the page cache)
    /// pays for none of it when it is the second branch of a biased
    /// `select!`.
    pub async fn cut_off(&self, since: std::time::Instant) {
        let mut expired = self.expired.clone();
        let stopped = async move {
            if expired.wait_for(|e| *e).await.is_err() {
                // The worker is gone without expiring: nothing to cut.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = stopped => {}
            () = park::drained_since(since) => {}
        }
    }

    /// Takes one `worker_connections` slot for an outgoing connection (the
    /// upstream side of a stream session), or None when all are in use.
    pub fn take_slot(self: &Arc<Self>) -> Option<Slot> {
        let limit = self.config.load().main.connections();
        let mut cur = self.active.load(Ordering::Acquire);
        loop {
            if cur >= limit {
                return None;
            }
            match self
                .active
                .compare_exchange(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(Slot(self.clone())),
                Err(now) => cur = now,
            }
        }
    }
}

/// A `worker_connections` slot held by an outgoing connection; given back
/// (and the accept loop woken) on drop.
pub struct Slot(Arc<WorkerShared>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_waiters();
    }
}

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Http,
    Stream,
    /// `mail {}`: a POP3, IMAP or SMTP proxy session.
    Mail,
}

/// A listening socket handed to a worker.
pub enum ListenSock {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
    /// `listen ... quic` (http) or `listen ... udp` (stream).
    Udp(std::net::UdpSocket),
}

pub enum Ctrl {
    Listen(ListenAddr, ListenSock, Proto),
    Unlisten(ListenAddr),
    /// Graceful stop: close listeners, finish requests, close idle keepalives.
    Quit,
    /// A reload with `worker_shutdown_timeout`: connections accepted
    /// before it close once they wait idle past that long after it, as
    /// nginx's old workers close theirs when the timeout ends.
    Reloaded(Duration),
}

static CONN_ID: AtomicU64 = AtomicU64::new(0);

/// The next connection number (`$connection`, the `*N` of log lines);
/// also taken by each UDP session of a stream listener and each QUIC
/// connection (`http::v3`).
pub fn next_conn_id() -> u64 {
    CONN_ID.fetch_add(1, Ordering::Relaxed) + 1
}

/// Runs a worker until it is told to quit (or its channel closes).
pub fn run(
    worker: usize,
    config: Arc<ArcSwap<Config>>,
    stats: Arc<Stats>,
    pools: Arc<ArcSwap<crate::io::Pools>>,
    mut ctrl: mpsc::UnboundedReceiver<Ctrl>,
) {
    crate::core::affinity::bind_worker(&config.load().main, worker);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::elog!(
                Emerg,
                "worker {} could not start its event loop: {}",
                worker,
                e
            );
            return;
        }
    };
    let (quit_tx, quit_rx) = watch::channel(false);
    let (expired_tx, expired_rx) = watch::channel(false);
    let shared = Arc::new(WorkerShared {
        config,
        quit: quit_rx,
        expired: expired_rx,
        stats,
        pools,
        worker,
        active: AtomicUsize::new(0),
        freed: Notify::new(),
    });
    let local = tokio::task::LocalSet::new();
    let lot_quit = shared.quit.clone();
    local.block_on(&rt, async move {
        park::start(lot_quit);
        tokio::task::spawn_local(crate::io::reuse_sweeper());
        tokio::task::spawn_local(timer_floor());
        let mut stops: HashMap<ListenAddr, watch::Sender<bool>> = HashMap::new();
        loop {
            match ctrl.recv().await {
                Some(Ctrl::Listen(addr, sock, proto)) => {
                    let (tx, rx) = watch::channel(false);
                    stops.insert(addr.clone(), tx);
                    match (sock, proto) {
                        (ListenSock::Udp(u), Proto::Http) => {
                            tokio::task::spawn_local(crate::http::v3::serve(
                                addr,
                                u,
                                shared.clone(),
                                rx,
                            ));
                        }
                        (ListenSock::Udp(u), Proto::Stream) => {
                            tokio::task::spawn_local(crate::stream::udp::serve(
                                addr,
                                u,
                                shared.clone(),
                                rx,
                            ));
                        }
                        (sock, proto) => {
                            tokio::task::spawn_local(accept_loop(
                                addr,
                                sock,
                                proto,
                                shared.clone(),
                                rx,
                            ));
                        }
                    }
                }
                Some(Ctrl::Unlisten(addr)) => {
                    if let Some(tx) = stops.remove(&addr) {
                        let _ = tx.send(true);
                    }
                }
                Some(Ctrl::Reloaded(after)) => park::close_after_reload(after),
                Some(Ctrl::Quit) | None => break,
            }
        }
        for (_, tx) in stops.drain() {
            let _ = tx.send(true);
        }
        let _ = quit_tx.send(true);
        let limit = shared.config.load().main.worker_shutdown_timeout_ms;
        let deadline = limit.map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
        loop {
            // Register for the wake-up before reading the counter: a
            // connection that closes between the check and the await would
            // otherwise call `notify_waiters` with nobody registered, and
            // this loop would sleep until the deadline (or forever).
            let wait = shared.freed.notified();
            tokio::pin!(wait);
            wait.as_mut().enable();
            if shared.active.load(Ordering::Acquire) == 0 {
                break;
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d, wait).await.is_err() {
                        // worker_shutdown_timeout ran out: connections
                        // that watch for it end their requests (logged)
                        // and close; they are given a few turns of the
                        // loop for that (no waiting on a peer is left in
                        // it), the rest close with the worker.
                        let _ = expired_tx.send(true);
                        for _ in 0..64 {
                            if shared.active.load(Ordering::Acquire) == 0 {
                                break;
                            }
                            tokio::task::yield_now().await;
                        }
                        break;
                    }
                }
                None => wait.await,
            }
        }
    });
    // Parked connections still open (worker_shutdown_timeout ran out)
    // close with the worker.
    park::stop();
}

async fn accept_loop(
    addr: ListenAddr,
    sock: ListenSock,
    proto: Proto,
    shared: Arc<WorkerShared>,
    mut stop: watch::Receiver<bool>,
) {
    enum L {
        // Accepted with a bare accept4 (see `core::sock`): tokio's
        // TcpListener would register every connection it returns.
        Tcp(tokio::io::unix::AsyncFd<std::net::TcpListener>),
        Unix(tokio::net::UnixListener),
    }
    let l = match sock {
        ListenSock::Tcp(s) => s.set_nonblocking(true).and_then(|()| {
            // SAFETY: the listener stays inside the AsyncFd, open and
            // unchanged, for the AsyncFd's whole life.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(s, tokio::io::Interest::READABLE)
            }
            .map(L::Tcp)
            .map_err(|e| e.into())
        }),
        ListenSock::Unix(s) => tokio::net::UnixListener::from_std(s).map(L::Unix),
        // Datagram listeners never reach an accept loop (see `run`).
        ListenSock::Udp(_) => return,
    };
    let l = match l {
        Ok(l) => l,
        Err(e) => {
            crate::elog!(Emerg, "listener {} could not be registered: {}", addr, e);
            return;
        }
    };
    let mut warned = false;
    let mut reuse_warned = None;
    let mut queued = 0;
    // One wait for the stop for the whole loop: a new `changed()` per
    // accept registered a waiter on the watch and removed it again (a
    // lock each) whenever the listener had to be waited for.
    let stopped = stop.changed();
    tokio::pin!(stopped);
    loop {
        // A stream session needs a second slot for its upstream side;
        // waiting for both here keeps a client in the backlog instead of
        // accepting it only to close it for want of that slot.
        loop {
            let limit = shared.config.load().main.connections();
            let need = if proto != Proto::Http {
                limit.min(2)
            } else {
                1
            };
            if shared.active.load(Ordering::Acquire) + need <= limit {
                // Alert again the next time the limit is hit, as nginx does.
                warned = false;
                break;
            }
            // Registered before the second check: a connection that closes
            // in between would otherwise notify nobody.
            let freed = shared.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if shared.active.load(Ordering::Acquire) + need <= limit {
                continue;
            }
            // A new connection waiting makes room as in nginx: the idle
            // connections held longest are closed (see `park::drain`).
            // Only once one is waiting, so that nothing is closed for a
            // client that never comes.
            let pending = async {
                match &l {
                    L::Tcp(t) => {
                        // Readiness is left set for accept_tcp.
                        let _ = t.readable().await;
                    }
                    L::Unix(_) => std::future::pending::<()>().await,
                }
            };
            let drained = tokio::select! {
                _ = freed.as_mut() => None,
                () = pending => Some(reuse_connections(limit, &mut reuse_warned)),
                _ = stopped.as_mut() => return,
            };
            if drained != Some(0) {
                continue;
            }
            if !warned {
                crate::elog!(Alert, "{} worker_connections are not enough", limit);
                warned = true;
            }
            // New connections wait in the backlog until one closes.
            tokio::select! {
                _ = freed => {}
                _ = stopped.as_mut() => return,
            }
        }
        // Accepting first: the stop watch is only polled (and a waiter
        // registered on it) when no connection is waiting.
        let accepted = tokio::select! {
            biased;
            r = async {
                match &l {
                    L::Tcp(t) => accept_tcp(t, &mut queued)
                        .await
                        .map(|(s, p)| (Either::Tcp(LazySock::raw(s)), p)),
                    L::Unix(u) => u
                        .accept()
                        .await
                        .map(|(s, _)| (Either::Unix(LazySock::registered(s)), None)),
                }
            } => r,
            _ = stopped.as_mut() => return,
        };
        match accepted {
            Ok((s, peer)) => {
                shared.stats.accepts.fetch_add(1, Ordering::Relaxed);
                shared.stats.handled.fetch_add(1, Ordering::Relaxed);
                let id = CONN_ID.fetch_add(1, Ordering::Relaxed) + 1;
                if proto == Proto::Stream {
                    serve_proxy(
                        s,
                        peer,
                        &addr,
                        &shared,
                        id,
                        |c| c.stream.as_ref()?.addr_for(&addr),
                        crate::stream::session::serve,
                    );
                    continue;
                }
                if proto == Proto::Mail {
                    serve_proxy(
                        s,
                        peer,
                        &addr,
                        &shared,
                        id,
                        |c| c.mail.as_ref()?.server_for(&addr),
                        crate::mail::session::serve,
                    );
                    continue;
                }
                let local = match &s {
                    // A listener on a specific address is its connections'
                    // local address: no getsockname() per connection.
                    Either::Tcp(t) => match &addr {
                        ListenAddr::Inet(a) if !a.ip().is_unspecified() => Some(*a),
                        _ => t.local_addr(),
                    },
                    Either::Unix(_) | Either::TlsTcp(_) | Either::TlsUnix(_) => None,
                };
                let mut info = ConnInfo {
                    id,
                    remote: peer,
                    local,
                    listen: addr.clone(),
                    requests: 0,
                    tls: crate::tls::TlsState::Plain,
                    started: std::time::Instant::now(),
                    proxy: None,
                    proxy_pending: false,
                    keepalive_ms: 0,
                };
                // TCP_NODELAY is set by the engine when the connection
                // turns keep-alive (as nginx), not per accept.
                let slot = ConnSlot::take(shared.clone());
                // A TCP client's request usually follows the handshake
                // by a moment: the connection waits for it in the parking
                // lot's epoll (one EPOLL_CTL_ADD, as nginx) and gets its
                // task when the bytes are there.
                match (&s, serve::first_wait(&shared, &mut info)) {
                    (Either::Tcp(_), Some(wait)) => park::wait_first(s, info, slot, wait),
                    _ => spawn_http(s, info, slot, None),
                }
            }
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(0);
                crate::elog!(Crit, "accept4() failed {}", crate::core::errno_text(&e));
                if errno == libc::EMFILE
                    || errno == libc::ENFILE
                    || errno == libc::ENOBUFS
                    || errno == libc::ENOMEM
                {
                    // Out of descriptors: give back the files kept for
                    // reuse, and stop accepting for a while rather than spin.
                    crate::io::drop_kept_files();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
}

/// Closes some parked idle connections (see [`park::drain`]), warning as
/// nginx does, at most once a second.
fn reuse_connections(limit: usize, warned: &mut Option<std::time::Instant>) -> usize {
    let n = park::drain();
    if n == 0 {
        return 0;
    }
    if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
        *warned = Some(std::time::Instant::now());
        crate::elog!(
            Warn,
            "{} worker_connections are not enough, reusing connections",
            limit
        );
    }
    n
}

/// Keeps a timer of the worker's due within a second, always.
///
/// tokio's time driver wakes its own event loop (an eventfd `write` and
/// one more event for `epoll_wait` to hand back) whenever a timer is
/// registered earlier than the wake-up the loop last parked for. With no
/// timer pending that is every new timer, so each proxied stream session
/// paid a syscall for its `proxy_connect_timeout` (strace of the bench's
/// connection row: 17 syscalls per session against nginx's 16). With this
/// one-second timer pending, the timers of connections (seconds away)
/// are never the earliest and are just put in the wheel. It costs one
/// wake-up a second per worker.
async fn timer_floor() {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

/// Accepts one connection from a TCP listener registered (edge-triggered)
/// with tokio. `queued`: connections counted in the accept queue and not
/// yet taken, kept by the caller between calls.
///
/// Edge-triggered readiness asks the caller to accept until `EAGAIN`, but
/// an `accept4` that finds the queue empty is not cheap: the kernel
/// allocates the new socket and its file before it looks at the queue,
/// and frees both (the inode through RCU) when there is nothing there.
/// On this project's test VM that is 4-6 µs per empty call, a fifth of
/// what a whole connection costs the server, and a busy worker paid it
/// once per burst of connections. So on each edge the listener's queue is
/// counted instead (`TCP_INFO`, one cheap `getsockopt`), readiness is
/// cleared, and exactly that many are accepted. Clearing before the
/// accepts loses no wake-up: a connection queued after the count raises
/// a new edge, which tokio records after the clear.
async fn accept_tcp(
    l: &tokio::io::unix::AsyncFd<std::net::TcpListener>,
    queued: &mut u32,
) -> std::io::Result<(std::net::TcpStream, Option<std::net::SocketAddr>)> {
    let fd = l.as_raw_fd();
    loop {
        if *queued == 0 {
            let mut ready = l.readable().await?;
            match crate::core::sock::accept_queue_len(fd) {
                Some(n) => {
                    ready.clear_ready();
                    *queued = n;
                    continue;
                }
                // Not countable: accept until EAGAIN, as the edge asks.
                None => match crate::core::sock::accept_raw(fd) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        ready.clear_ready();
                        continue;
                    }
                    r => return r,
                },
            }
        }
        // The other connections get their turn between accepts.
        tokio::task::coop::consume_budget().await;
        match crate::core::sock::accept_raw(fd) {
            Ok(accepted) => {
                *queued -= 1;
                return Ok(accepted);
            }
            // Another worker sharing the socket took the rest.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => *queued = 0,
            Err(e) => {
                *queued = 0;
                return Err(e);
            }
        }
    }
}

/// An accepted stream or mail connection as the relay's socket: None when
/// registering it fails (the connection closes) or, never expected, it
/// is TLS already (those listeners do their TLS in the session).
fn proxy_sock(s: Either) -> Option<crate::stream::proxy::Sock> {
    match s {
        Either::Tcp(t) => t
            .into_registered()
            .map(crate::stream::proxy::Sock::Tcp)
            .ok(),
        Either::Unix(u) => u
            .into_registered()
            .map(crate::stream::proxy::Sock::Unix)
            .ok(),
        Either::TlsTcp(_) | Either::TlsUnix(_) => None,
    }
}

/// Hands an accepted connection to a proxy module (stream or mail):
/// `lookup` finds what the current configuration has for its listener,
/// and `serve` runs the session on it, in a task of its own that holds
/// the connection's `worker_connections` slot, plus one for the upstream
/// side when one is free (None: the session logs it as nginx does).
#[allow(clippy::too_many_arguments)]
fn serve_proxy<C, F, Fut>(
    s: Either,
    peer: Option<std::net::SocketAddr>,
    addr: &ListenAddr,
    shared: &Arc<WorkerShared>,
    id: u64,
    lookup: impl FnOnce(&Config) -> Option<C>,
    serve: F,
) where
    C: 'static,
    F: FnOnce(
            crate::stream::proxy::Sock,
            Option<std::net::SocketAddr>,
            ListenAddr,
            C,
            Option<Slot>,
            Arc<WorkerShared>,
            u64,
        ) -> Fut
        + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    // None: a reload removed this listener and its Unlisten has not
    // reached us yet; dropping the socket closes the connection.
    let Some(srv) = lookup(&shared.config.load()) else {
        return;
    };
    let conn_slot = ConnSlot::take(shared.clone());
    // Taken now, while the accept loop's check still holds.
    let slot = shared.take_slot();
    let Some(sock) = proxy_sock(s) else { return };
    let sh = shared.clone();
    let addr = addr.clone();
    tokio::task::spawn_local(async move {
        // Released on drop: also when the task panics.
        let _conn_slot = conn_slot;
        serve(sock, peer, addr, srv, slot, sh, id).await;
    });
}

/// Runs an HTTP connection on this worker: a new one (`wait` None) or one
/// the parking lot hands back with bytes to read. When the connection
/// idles long enough, its socket goes to the parking lot.
///
/// Connections run on the worker's runners: tasks that serve one
/// connection after another. A task per connection would cost, for every
/// connection, a 128-byte-aligned task cell (glibc's slow `memalign`
/// path), its registration in the task list and its teardown; a runner
/// pays that once. A connection queues here and wakes an idle runner, or
/// gets a new one when all are busy, so no connection waits for another.
pub(crate) fn spawn_http(s: Either, info: ConnInfo, slot: ConnSlot, wait: Option<IdleWait>) {
    let runners = RUNNERS.with(Rc::clone);
    runners.jobs.borrow_mut().push_back(Job {
        s,
        info,
        slot,
        wait,
    });
    // Every runner listed idle is waiting for exactly this.
    let idle = runners.idle.borrow_mut().pop();
    match idle {
        Some((woken, waker)) => {
            woken.set(true);
            waker.wake();
        }
        None => {
            tokio::task::spawn_local(runner(runners));
        }
    }
}

/// A connection waiting for a runner.
struct Job {
    s: Either,
    info: ConnInfo,
    slot: ConnSlot,
    wait: Option<IdleWait>,
}

/// This worker's runners and the connections queued for them.
#[derive(Default)]
struct Runners {
    jobs: RefCell<VecDeque<Job>>,
    /// Runners waiting for a connection: the flag each waits to see set,
    /// and its waker. All on the worker's thread, so no `Notify` (a lock
    /// and its waiter list per hand-off, ~400 instructions a connection).
    idle: RefCell<Vec<(Rc<Cell<bool>>, std::task::Waker)>>,
}

thread_local! {
    static RUNNERS: Rc<Runners> = Rc::new(Runners::default());
}

/// Runners kept waiting after a burst; more end when their queue is empty.
const MAX_IDLE_RUNNERS: usize = 64;

async fn runner(runners: Rc<Runners>) {
    // Set by the connection that wakes this runner (one per runner).
    let woken = Rc::new(Cell::new(false));
    loop {
        let job = runners.jobs.borrow_mut().pop_front();
        match job {
            Some(Job {
                s,
                mut info,
                slot,
                wait,
            }) => match s {
                // `listen ... proxy_protocol`: the header comes first, then
                // the connection goes on as any other (a dropped socket
                // closes it).
                Either::Tcp(t) if info.proxy_pending => {
                    if serve::read_proxy_header(&t, &mut info, &slot.0, wait).await {
                        requeue(&runners, Either::Tcp(t), info, slot, wait);
                    }
                }
                Either::Unix(u) if info.proxy_pending => {
                    if serve::read_proxy_header(&u, &mut info, &slot.0, wait).await {
                        requeue(&runners, Either::Unix(u), info, slot, wait);
                    }
                }
                // Boxed: a TLS connection's state is three times a plain
                // one's, and inline it would size every runner.
                Either::Tcp(t) if matches!(info.tls, TlsState::Pending) => {
                    Box::pin(run_tls(t, info, slot, wait, Either::TlsTcp)).await
                }
                Either::Unix(u) if matches!(info.tls, TlsState::Pending) => {
                    Box::pin(run_tls(u, info, slot, wait, Either::TlsUnix)).await
                }
                Either::Tcp(t) => run_http(t, info, slot, wait, Either::Tcp).await,
                Either::Unix(u) => run_http(u, info, slot, wait, Either::Unix).await,
                Either::TlsTcp(t) => run_http(t, info, slot, wait, Either::TlsTcp).await,
                Either::TlsUnix(u) => run_http(u, info, slot, wait, Either::TlsUnix).await,
            },
            None => {
                if runners.idle.borrow().len() >= MAX_IDLE_RUNNERS {
                    return;
                }
                // Listed idle at the first poll, ready once a connection
                // has taken this runner off the list (a poll without that
                // is spurious and waits on).
                woken.set(false);
                let mut listed = false;
                std::future::poll_fn(|cx| {
                    if woken.get() {
                        return std::task::Poll::Ready(());
                    }
                    if !listed {
                        listed = true;
                        let entry = (woken.clone(), cx.waker().clone());
                        runners.idle.borrow_mut().push(entry);
                    }
                    std::task::Poll::Pending
                })
                .await;
            }
        }
    }
}

/// Puts a connection back at the front of the queue, for this runner to
/// take next.
fn requeue(runners: &Runners, s: Either, info: ConnInfo, slot: ConnSlot, wait: Option<IdleWait>) {
    runners.jobs.borrow_mut().push_front(Job {
        s,
        info,
        slot,
        wait,
    });
}

async fn run_http<S: crate::core::stream::Stream>(
    s: S,
    info: ConnInfo,
    slot: ConnSlot,
    wait: Option<IdleWait>,
    kind: fn(S) -> Either,
) {
    // `slot` is released on drop: also when the connection panics.
    let sh = slot.0.clone();
    if let Served::Idle(s, info, w) = serve::serve(s, info, sh, wait).await {
        park::park(kind(s), info, slot, w);
    }
}

/// A connection accepted on an `ssl` address: the TLS handshake (within
/// client_header_timeout, as nginx), then HTTP over it. A client that
/// speaks plain HTTP instead gets its request answered with 497.
async fn run_tls<T: Registrable>(
    s: LazySock<T>,
    mut info: ConnInfo,
    slot: ConnSlot,
    wait: Option<IdleWait>,
    kind: fn(TlsStream<LazySock<T>>) -> Either,
) where
    for<'a> &'a T::Std: std::io::Read + std::io::Write,
{
    let sh = slot.0.clone();
    let config = sh.config.load_full();
    let Some(addr) = config
        .http
        .as_ref()
        .and_then(|h| h.addr_for(&info.listen, info.local))
    else {
        return;
    };
    let deadline = wait.map_or_else(
        || {
            tokio::time::Instant::now()
                + Duration::from_millis(addr.default.srv.header_timeout_ms())
        },
        |w| w.deadline,
    );
    let Some(http) = config.http.as_ref() else {
        return;
    };
    match crate::tls::stream::accept(s, &addr, &http.main.vars, &info, deadline).await {
        Accepted::Tls(t, tls) => {
            info.tls = TlsState::On(Arc::new(tls));
            drop((addr, config));
            run_http(t, info, slot, None, kind).await;
        }
        Accepted::Plain(p) => {
            info.tls = TlsState::PlainOnSsl;
            drop((addr, config));
            // Answered with 497 and closed: never idle.
            let _ = serve::serve(p, info, sh, wait).await;
        }
        Accepted::Failed => {}
    }
}

/// An accepted socket of any kind.
pub(crate) enum Either {
    Tcp(LazySock<tokio::net::TcpStream>),
    Unix(LazySock<tokio::net::UnixStream>),
    TlsTcp(TlsStream<LazySock<tokio::net::TcpStream>>),
    TlsUnix(TlsStream<LazySock<tokio::net::UnixStream>>),
}

/// One connection's share of `worker_connections`, given back on drop so
/// that a task that ends any way (including a panic) frees its slot.
pub struct ConnSlot(Arc<WorkerShared>);

impl ConnSlot {
    pub fn take(sh: Arc<WorkerShared>) -> ConnSlot {
        sh.active.fetch_add(1, Ordering::AcqRel);
        sh.stats.active.fetch_add(1, Ordering::Relaxed);
        ConnSlot(sh)
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
        self.0.stats.active.fetch_sub(1, Ordering::Relaxed);
        self.0.freed.notify_waiters();
    }
}
