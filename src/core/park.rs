//! The parking lot: HTTP connections that wait for a request, kept
//! outside tokio.
//!
//! A connection waiting for a request inside the engine holds a runner
//! (a task of `core::worker` with the `conn::serve` state machine in it,
//! ~4 KiB) and tokio's I/O registration (256 bytes, cache-line aligned):
//! several times what nginx spends on an idle keep-alive connection. So a
//! connection that has waited [`crate::http::serve::PARK_AFTER`] without a
//! byte hands its socket here and gives its runner back (busy keep-alive
//! clients never get here, so the hot path does not pay for parking). A
//! connection just accepted waits here for its first request too
//! ([`wait_first`]): it costs one `EPOLL_CTL_ADD`, as in nginx, and
//! neither a runner nor a tokio registration (whose removal on close would
//! be one more `epoll_ctl`) until its bytes are there. The lot keeps the
//! bare socket, its `ConnInfo`, its `worker_connections` slot and its
//! wait (deadline, first request or not) in one slab entry, and watches
//! the sockets with an epoll instance of its own, which is itself
//! registered with tokio.
//!
//! ```text
//!  accept --------------> wait_first() --+
//!  conn on a runner --idle PARK_AFTER--> park(): deregister from tokio
//!                                        |  epoll_ctl ADD (or MOD), one-shot
//!     readable / hang-up  <--------------+---------> deadline passed: close
//!     back to a runner, bare socket        (RST if first wait and
//!     (core::sock::LazySock):               reset_timedout_connection)
//!     serve::serve(.., Some(wait))     QUIT: close all but first waits
//! ```
//!
//! Sockets are watched one-shot: an event disables the socket in the
//! lot's set instead of removing it (no `EPOLL_CTL_DEL`); closing it
//! removes it, and parking it again re-arms it.
//!
//! One task per worker (the lot's watcher) does the waking and the
//! closing; deadlines sit in a heap, so it sleeps until exactly
//! the earliest one. The lot is reached through a thread-local: every
//! connection task of a worker runs on that worker's thread.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::core::sock::LazySock;
use crate::core::worker::{self, ConnSlot, Either};
use crate::http::serve::{ConnInfo, IdleWait};
use crate::tls::stream::TlsStream;

thread_local! {
    static LOT: RefCell<Option<Rc<Lot>>> = const { RefCell::new(None) };
}

/// A parked connection.
struct Entry {
    fd: OwnedFd,
    tcp: bool,
    /// The session of a TLS connection, kept while its socket waits.
    tls: Option<Box<rustls::ServerConnection>>,
    /// Tells this entry from a later one in the same place, so that a
    /// stale epoll event cannot wake the wrong connection.
    gen: u32,
    wait: IdleWait,
    info: ConnInfo,
    slot: ConnSlot,
}

// Most places hold a parked connection; boxing the entry would cost an
// allocation per park for the sake of the few free ones.
#[allow(clippy::large_enum_variant)]
enum Place {
    Used(Entry),
    /// Next free place, or `NONE`.
    Free(u32),
}

const NONE: u32 = u32::MAX;

struct Places {
    places: Vec<Place>,
    free: u32,
    gen: u32,
    /// (deadline, place, generation), earliest first. An entry is not
    /// removed when its connection wakes (that would be a search): a
    /// stale one is recognised by its generation when it comes up, and
    /// the heap is rebuilt from the live entries when stale ones pile up.
    /// One contiguous buffer: a tree's nodes, allocated as connections
    /// park, would land in the holes their freed tasks leave and keep
    /// those pages from being given back (idle: ~610 against ~360 bytes
    /// per connection).
    deadlines: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    /// Entries in `places` now.
    live: usize,
    /// When to give freed memory back (see [`trim`]); set by the first
    /// park after the last trim.
    trim_at: Option<Instant>,
}

impl Places {
    fn put(&mut self, mut e: Entry) -> (u32, u32) {
        self.gen = self.gen.wrapping_add(1);
        e.gen = self.gen;
        let deadline = e.wait.deadline;
        let idx = if self.free == NONE {
            self.places.push(Place::Used(e));
            self.places.len() as u32 - 1
        } else {
            let idx = self.free;
            let p = &mut self.places[idx as usize];
            if let Place::Free(next) = *p {
                self.free = next;
            }
            *p = Place::Used(e);
            idx
        };
        self.deadlines.push(Reverse((deadline, idx, self.gen)));
        self.live += 1;
        if self.deadlines.len() > 2 * self.live + 1024 {
            self.deadlines = self
                .places
                .iter()
                .enumerate()
                .filter_map(|(i, p)| match p {
                    Place::Used(e) => Some(Reverse((e.wait.deadline, i as u32, e.gen))),
                    Place::Free(_) => None,
                })
                .collect();
        }
        (idx, self.gen)
    }

    /// Takes the entry at `idx` (of generation `gen`, if given).
    fn take(&mut self, idx: u32, gen: Option<u32>) -> Option<Entry> {
        let p = self.places.get_mut(idx as usize)?;
        match p {
            Place::Used(e) if gen.is_none_or(|g| g == e.gen) => {}
            _ => return None,
        }
        let Place::Used(e) = std::mem::replace(p, Place::Free(self.free)) else {
            return None;
        };
        self.free = idx;
        self.live -= 1;
        Some(e)
    }

    /// The earliest deadline of a parked entry (stale heap tops dropped).
    fn earliest(&mut self) -> Option<Instant> {
        while let Some(&Reverse((d, idx, gen))) = self.deadlines.peek() {
            match self.places.get(idx as usize) {
                Some(Place::Used(e)) if e.gen == gen => return Some(d),
                _ => {
                    self.deadlines.pop();
                }
            }
        }
        None
    }
}

struct Lot {
    epoll: AsyncFd<OwnedFd>,
    places: RefCell<Places>,
    /// Signalled when a parked entry has the earliest deadline.
    sooner: Notify,
    quit: watch::Receiver<bool>,
    /// After a reload with worker_shutdown_timeout: (when it happened,
    /// when the connections accepted before it are closed at the latest).
    drain: std::cell::Cell<Option<(std::time::Instant, Instant)>>,
    /// Woken when `drain` is set (a busy connection, such as an upgraded
    /// tunnel, waits on it rather than polling).
    reloaded: Notify,
}

/// Sets up this worker's lot and its watcher task. Called from inside the
/// worker's `LocalSet`. Without a lot (no epoll instance), idle
/// connections simply stay in their tasks.
pub fn start(quit: watch::Receiver<bool>) {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        crate::elog!(
            Alert,
            "epoll_create1() failed {}",
            crate::core::errno_text(&e)
        );
        return;
    }
    // SAFETY: `fd` was just returned by epoll_create1 and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: the OwnedFd stays inside the AsyncFd, open and unchanged,
    // for the AsyncFd's whole life.
    let epoll = match unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
    {
        Ok(a) => a,
        Err(e) => {
            crate::elog!(Alert, "epoll fd could not be registered: {}", e);
            return;
        }
    };
    let lot = Rc::new(Lot {
        epoll,
        places: RefCell::new(Places {
            places: Vec::new(),
            free: NONE,
            gen: 0,
            deadlines: BinaryHeap::new(),
            live: 0,
            trim_at: None,
        }),
        sooner: Notify::new(),
        quit,
        drain: std::cell::Cell::new(None),
        reloaded: Notify::new(),
    });
    LOT.with(|l| *l.borrow_mut() = Some(lot.clone()));
    tokio::task::spawn_local(watch_lot(lot));
}

/// Closes every connection still parked (the worker is exiting).
pub fn stop() {
    if let Some(lot) = LOT.with(|l| l.borrow_mut().take()) {
        let places = std::mem::take(&mut lot.places.borrow_mut().places);
        drop(places);
    }
}

/// A reload with worker_shutdown_timeout `after` happened: every
/// connection accepted before it that waits here is closed at the latest
/// `after` from now, and so is one that comes to wait here later (nginx's
/// old worker closes all its connections when the timeout ends; tern's
/// requests in progress finish, see DIFFERENCES.md).
pub fn close_after_reload(after: Duration) {
    let Some(lot) = LOT.with(|l| l.borrow().clone()) else {
        return;
    };
    let at = std::time::Instant::now();
    let until = Instant::now() + after;
    lot.drain.set(Some((at, until)));
    let mut places = lot.places.borrow_mut();
    let mut sooner = Vec::new();
    for (i, p) in places.places.iter_mut().enumerate() {
        if let Place::Used(e) = p {
            if e.info.started < at && e.wait.deadline > until {
                e.wait.deadline = until;
                sooner.push(Reverse((until, i as u32, e.gen)));
            }
        }
    }
    // The entries' older deadlines stay in the heap, stale: the first to
    // come up closes the connection, and its place's generation moves on.
    places.deadlines.extend(sooner);
    drop(places);
    lot.sooner.notify_one();
    lot.reloaded.notify_waiters();
}

/// Ends when a connection busy since `since` (an upgraded tunnel) must be
/// closed because a reload with worker_shutdown_timeout happened after
/// that and its time ran out, as nginx's old worker closes it; never
/// ends otherwise.
pub async fn drained_since(since: std::time::Instant) {
    let Some(lot) = LOT.with(|l| l.borrow().clone()) else {
        return std::future::pending().await;
    };
    loop {
        // Registered before the check: a reload between the two is seen.
        let reloaded = lot.reloaded.notified();
        if let Some((at, until)) = lot.drain.get() {
            if since < at {
                tokio::time::sleep_until(until).await;
                return;
            }
        }
        reloaded.await;
    }
}

/// Parks an idle connection whose task is ending.
pub(crate) fn park(s: Either, info: ConnInfo, slot: ConnSlot, wait: IdleWait) {
    put(s, info, slot, wait, true);
}

/// Parks a connection just accepted until its first request arrives: it
/// gets a task only once there is something to read. No task ended, so
/// there is no memory to give back.
pub(crate) fn wait_first(s: Either, info: ConnInfo, slot: ConnSlot, wait: IdleWait) {
    put(s, info, slot, wait, false);
}

/// Parks a connection; `trim`: schedule a [`trim`] for the memory its
/// task freed.
fn put(s: Either, info: ConnInfo, slot: ConnSlot, wait: IdleWait, trim: bool) {
    let Some(lot) = LOT.with(|l| l.borrow().clone()) else {
        worker::spawn_http(s, info, slot, Some(wait));
        return;
    };
    if *lot.quit.borrow() && !wait.first {
        return;
    }
    // Deregisters from tokio: the lot's epoll watches it from now on.
    let (fd, tls) = match s {
        Either::Tcp(t) => (t.into_std().map(|t| (OwnedFd::from(t), true)), None),
        Either::Unix(u) => (u.into_std().map(|u| (OwnedFd::from(u), false)), None),
        Either::TlsTcp(t) => {
            let (t, c) = t.into_parts();
            (t.into_std().map(|t| (OwnedFd::from(t), true)), Some(c))
        }
        Either::TlsUnix(u) => {
            let (u, c) = u.into_parts();
            (u.into_std().map(|u| (OwnedFd::from(u), false)), Some(c))
        }
    };
    let Ok((fd, tcp)) = fd else {
        return;
    };
    let mut wait = wait;
    if let Some((at, until)) = lot.drain.get() {
        if info.started < at && wait.deadline > until {
            wait.deadline = until;
        }
    }
    let raw = fd.as_raw_fd();
    let e = Entry {
        fd,
        tcp,
        tls,
        gen: 0,
        wait,
        info,
        slot,
    };
    let mut places = lot.places.borrow_mut();
    let earliest = places.earliest();
    let (idx, gen) = places.put(e);
    // One-shot: after its event the socket stays in the set, disabled,
    // so waking it needs no EPOLL_CTL_DEL (its close removes it); a
    // socket parked again is re-armed with MOD.
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
        u64: (u64::from(gen) << 32) | u64::from(idx),
    };
    let epfd = lot.epoll.as_raw_fd();
    // SAFETY: both descriptors are open (the socket is owned by the entry
    // just stored); `ev` is initialised.
    let mut r = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, raw, &mut ev) };
    if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
        // SAFETY: as above.
        r = unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, raw, &mut ev) };
    }
    if r < 0 {
        // Could not be watched: close it rather than leave it unheard.
        let e = places.take(idx, Some(gen));
        drop(places);
        drop(e);
        return;
    }
    let trim = trim && places.trim_at.is_none();
    if trim {
        places.trim_at = Some(Instant::now() + TRIM_AFTER);
    }
    drop(places);
    if trim || earliest.is_none_or(|d| wait.deadline < d) {
        lot.sooner.notify_one();
    }
}

/// Takes a woken socket out of the lot's epoll set, where it stays
/// disabled after its one-shot event: a socket about to live in tokio's
/// set (a keep-alive connection) would otherwise make every one of its
/// wake-ups visit both sets. A connection that just closes skips this.
pub(crate) fn unwatch(fd: std::os::fd::RawFd) {
    let Some(lot) = LOT.with(|l| l.borrow().clone()) else {
        return;
    };
    // SAFETY: both descriptors are open (the caller owns `fd`); DEL takes
    // no event. A socket not in the set gets ENOENT, which is harmless.
    unsafe {
        libc::epoll_ctl(
            lot.epoll.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd,
            std::ptr::null_mut(),
        );
    }
}

/// How long after a park the memory its task freed is given back: long
/// enough to batch the parks of a burst of connections into one trim.
const TRIM_AFTER: Duration = Duration::from_millis(250);

/// Gives free heap pages back to the system. A parked connection's task
/// cell and tokio registration are freed in the middle of the heap, among
/// live allocations, where malloc keeps them resident; without this the
/// memory parking saves would stay in the worker's RSS until reused.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // malloc_trim walks every arena and can take milliseconds on a big
        // heap: it runs on a thread of its own, never on a worker's event
        // loop. One pending request covers any that come while it is queued.
        static TRIMMER: std::sync::OnceLock<Option<std::sync::mpsc::SyncSender<()>>> =
            std::sync::OnceLock::new();
        let tx = TRIMMER.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
            std::thread::Builder::new()
                .name("tern-trim".into())
                .spawn(move || {
                    while rx.recv().is_ok() {
                        // SAFETY: malloc_trim only walks and releases the
                        // allocator's free memory; it takes no pointers.
                        unsafe {
                            libc::malloc_trim(0);
                        }
                    }
                })
                .ok()
                .map(|_| tx)
        });
        if let Some(tx) = tx {
            let _ = tx.try_send(());
        }
    }
}

async fn watch_lot(lot: Rc<Lot>) {
    let mut quit = lot.quit.clone();
    let mut quitting = *quit.borrow_and_update();
    if quitting {
        close_waiting(&lot);
    }
    loop {
        let (next, trim_at) = {
            let mut places = lot.places.borrow_mut();
            let next = places.earliest();
            (next, places.trim_at)
        };
        tokio::select! {
            r = lot.epoll.readable() => match r {
                Ok(mut guard) => {
                    if !wake_ready(&lot) {
                        guard.clear_ready();
                    }
                }
                // The runtime is going away.
                Err(_) => return,
            },
            _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                expire(&lot);
            }
            _ = tokio::time::sleep_until(trim_at.unwrap_or_else(Instant::now)), if trim_at.is_some() => {
                lot.places.borrow_mut().trim_at = None;
                trim();
            }
            _ = lot.sooner.notified() => {}
            _ = quit.changed(), if !quitting => {
                quitting = true;
                close_waiting(&lot);
            }
        }
    }
}

/// Hands every connection the lot's epoll reports back to a task.
/// Returns whether more may be waiting (a full batch was taken).
fn wake_ready(lot: &Lot) -> bool {
    const N: usize = 64;
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; N];
    // SAFETY: `evs` has room for N events; timeout 0 does not block.
    let n = unsafe { libc::epoll_wait(lot.epoll.as_raw_fd(), evs.as_mut_ptr(), N as i32, 0) };
    if n <= 0 {
        return false;
    }
    // A batch that was not full emptied the ready list: any later event
    // raises a new edge on the lot's descriptor, so the caller can clear
    // its readiness now instead of asking again and finding nothing.
    let more = n as usize == N;
    for ev in &evs[..n as usize] {
        let key = { ev.u64 };
        let e = lot
            .places
            .borrow_mut()
            .take(key as u32, Some((key >> 32) as u32));
        let Some(e) = e else { continue };
        // Back to a task as a bare socket: it joins tokio's epoll only
        // if the request does not arrive whole.
        let s = match (e.tcp, e.tls) {
            (true, None) => Either::Tcp(LazySock::from_lot(std::net::TcpStream::from(e.fd))),
            (false, None) => Either::Unix(LazySock::from_lot(
                std::os::unix::net::UnixStream::from(e.fd),
            )),
            (true, Some(c)) => Either::TlsTcp(TlsStream::from_parts(
                LazySock::from_lot(std::net::TcpStream::from(e.fd)),
                c,
            )),
            (false, Some(c)) => Either::TlsUnix(TlsStream::from_parts(
                LazySock::from_lot(std::os::unix::net::UnixStream::from(e.fd)),
                c,
            )),
        };
        worker::spawn_http(s, e.info, e.slot, Some(e.wait));
    }
    more
}

/// Closes the connections whose wait timed out.
fn expire(lot: &Lot) {
    let now = Instant::now();
    loop {
        let e = {
            let mut places = lot.places.borrow_mut();
            match places.deadlines.peek() {
                Some(&Reverse((d, idx, gen))) if d <= now => {
                    places.deadlines.pop();
                    places.take(idx, Some(gen))
                }
                _ => break,
            }
        };
        let Some(e) = e else { continue };
        if e.wait.first && e.wait.reset {
            let _ = socket2::SockRef::from(&e.fd).set_linger(Some(Duration::ZERO));
        }
    }
}

/// Closes the connections parked longest ago to make room for new ones
/// (nginx's reuse of "reusable" connections, which are exactly those a
/// worker keeps here: waiting for a first or a next request): at most 32,
/// an eighth of those parked, at least one. Returns how many it closed.
pub(crate) fn drain() -> usize {
    let Some(lot) = LOT.with(|l| l.borrow().clone()) else {
        return 0;
    };
    let closed: Vec<Entry> = {
        let mut places = lot.places.borrow_mut();
        if places.live == 0 {
            return 0;
        }
        let n = (places.live / 8).clamp(1, 32);
        // Generations grow with each park: the smallest are the oldest
        // (distance from the current one, for the wrap-around).
        let now = places.gen;
        let mut parked: Vec<(u32, u32)> = places
            .places
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match p {
                Place::Used(e) => Some((now.wrapping_sub(e.gen), i as u32)),
                Place::Free(_) => None,
            })
            .collect();
        if parked.len() > n {
            parked.select_nth_unstable_by(n - 1, |a, b| b.0.cmp(&a.0));
            parked.truncate(n);
        }
        parked
            .into_iter()
            .filter_map(|(_, i)| places.take(i, None))
            .collect()
    };
    let n = closed.len();
    drop(closed);
    n
}

/// QUIT: closes every connection waiting for a next request (one still
/// waiting for its first request stays, as in `conn::serve`).
fn close_waiting(lot: &Lot) {
    let closed: Vec<Entry> = {
        let mut places = lot.places.borrow_mut();
        let waiting: Vec<u32> = places
            .places
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p, Place::Used(e) if !e.wait.first))
            .map(|(i, _)| i as u32)
            .collect();
        waiting
            .into_iter()
            .filter_map(|i| places.take(i, None))
            .collect()
    };
    drop(closed);
}
