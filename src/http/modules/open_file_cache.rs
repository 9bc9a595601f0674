//! `open_file_cache*`: open descriptors (with their size, mtime and inode),
//! directory existence and lookup errors, cached in front of the file-I/O
//! layer and shared by all worker threads.
//!
//! # Directives (nginx 1.22 wording and semantics)
//!
//! - `open_file_cache max=N [inactive=time] | off` (http, server, location;
//!   `inactive` in seconds, default 60s; `max` last one wins; `off`
//!   anywhere in the arguments wins). Each directive instance makes one
//!   [`Cache`]; inner levels without their own directive inherit the same
//!   `Arc<Cache>` through [`OpenFileCacheLoc::merge`].
//! - `open_file_cache_valid time` (default 60s): how long an entry is used
//!   without re-checking the file system.
//! - `open_file_cache_min_uses N` (default 1): a file's descriptor is kept
//!   only once the entry has been looked up N times (the entry itself, and
//!   its use count, lives until `inactive` drops it).
//! - `open_file_cache_errors on|off` (default off): cache lookup errors.
//! - `open_file_cache_events on|off`: accepted, no effect (as nginx on Linux,
//!   which has no file events with epoll).
//!
//! # Entry state machine
//!
//! ```text
//!             lookup, uses < min_uses          uses >= min_uses (or a directory)
//!   (absent) ------------------------> Counted ------------------------------> File{fd, checked}
//!      |  \__ open ok, uses >= min_uses ___________________________________/   ^   |
//!      |                                                                       |   | valid expired:
//!      +-- open failed, errors on, errno cacheable --> Error{errno, checked}   |   | stat(path)
//!                                                                              |   v
//!                                  same dev/ino/size/mtime: checked = now -----+   |
//!                                  changed: open again -> File{new fd} ------------+
//!   any state -- LRU at max / not used for `inactive` / open failed and not cacheable --> (absent)
//! ```
//!
//! # Invariants
//!
//! - A `File` entry holds one `Arc<OpenFile>`; the descriptor, its size,
//!   mtime and inode come from one `open` + `fstat` and are never mixed with
//!   another file's: a changed file gets a new `OpenFile`, never an update
//!   in place. (A file rewritten in place keeps its inode, so within `valid`
//!   its old size is served with whatever the inode now holds, as in nginx.)
//! - A kept `OpenFile` of at most 4 KiB also keeps its bytes after the
//!   first full read ([`crate::io::OpenFile::keep_content`]), so hits are
//!   served from memory; a re-check that finds size, mtime and ctime
//!   unchanged keeps them, any change opens a new `OpenFile` (new bytes).
//! - Descriptors are closed only by dropping the last `Arc<OpenFile>`.
//!   Eviction drops the cache's reference; a response in flight holds its
//!   own clone, so the descriptor stays open until that response finishes
//!   and is never used after close. The cache drops displaced `Arc`s after
//!   releasing its shard lock, so `close(2)` never runs under a lock.
//! - At most `max` entries exist per cache: shard `i` holds at most
//!   `cap_i` entries and `sum(cap_i) == max` (see [`Cache::new`]).
//! - A hit is served only while `now - checked < valid`; after that the
//!   request re-checks (each request that finds it expired does, no
//!   request waits for another's check).
//!
//! # Concurrency and cost
//!
//! The cache is split into power-of-two shards (a `Mutex` each, on its own
//! cache line), chosen by a cheap hash of the path bytes, so workers
//! looking up different files rarely touch the same lock. A hit is: one
//! shard hash, one keyed foldhash map lookup by `&[u8]` (no `PathBuf`, no
//! allocation), an LRU relink, an `Arc` clone, all under the shard lock for
//! tens of nanoseconds; the clock is `CLOCK_MONOTONIC_COARSE` (vDSO, no
//! syscall). One very hot file does map to one shard, but the critical
//! section is so short that even several workers at 60k+ req/s each keep
//! that lock mostly free. Counters ([`STATS`]) are striped per thread so
//! they never bounce between cores. Misses and revalidations go through
//! [`crate::io::open`] / [`crate::io::stat`] with no lock held, so a slow
//! disk offloads to the pool as the location's `aio` says.
//!
//! `inactive` expiry is lazy, as in nginx: at most once a second per cache,
//! the first lookup after that second sweeps every shard it can lock
//! without waiting (`try_lock`), dropping tail entries not used within
//! `inactive` (at most [`SWEEP_BATCH`] per shard and sweep, so one request
//! never closes a huge number of descriptors). An idle server keeps its
//! descriptors until the next request.
//!
//! # Reloads
//!
//! A reload keeps a cache when the new configuration has an
//! `open_file_cache` at the same file and line with the same `max` and
//! `inactive` (a process-wide registry of live caches, by file:line and
//! parameters, finds it); otherwise the new directive starts empty and the
//! old cache is freed (descriptors closed) when the last request on the
//! old configuration finishes.
//! Entries are facts about the file system, so sharing one cache between
//! the old and the new configuration is safe.
//!
//! # Deliberate differences from nginx
//!
//! - Directories are cached with their open descriptor (the file-I/O layer
//!   returns one); nginx closes directory descriptors and caches only the
//!   fact. They count against `max` either way.
//! - Only lookup errors are cached (`ENOENT`, `ENOTDIR`, `EACCES`, `EPERM`,
//!   `ENAMETOOLONG`, `ELOOP`); resource errors (`EMFILE`...) and pool
//!   overflows never are.
//! - The LRU order is exact per shard, approximate across shards: with
//!   `max` >= 32 a full shard may evict while another still has room.
//! - The same directive reached twice through one included file shares one
//!   cache (nginx would make two).

use std::collections::HashMap;

/// The hash of the cache's maps. Clients choose the paths that become
/// keys, so it must be keyed (a random seed per map: colliding paths
/// cannot be precomputed), not a fixed-seed hash like FxHash; foldhash
/// is such a hash at a fraction of SipHash's cost (SipHash was ~250
/// instructions of a cached 1 KiB request under callgrind).
type PathHash = foldhash::fast::RandomState;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};

use crate::config::registry::{arg, ctx, duplicate, flag, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::LocConf;
use crate::io::{OpenFile, Policy};

/// `open_file_cache_valid` default: 60 s.
pub const DEFAULT_VALID_MS: u64 = 60_000;
/// `open_file_cache_min_uses` default.
pub const DEFAULT_MIN_USES: u64 = 1;
/// `open_file_cache ... inactive=` default: 60 s.
pub const DEFAULT_INACTIVE_MS: u64 = 60_000;
/// How often (at most) one cache sweeps for inactive entries.
const SWEEP_EVERY_MS: u64 = 1000;
/// At most this many inactive entries are dropped per shard and sweep.
pub const SWEEP_BATCH: usize = 256;
/// No more shards than this: enough for many workers, few enough that
/// sweeping them all once a second is nothing.
const MAX_SHARDS: usize = 64;
/// Each shard gets at least this many entries before the cache is split
/// further, so small caches keep an exact LRU.
const MIN_PER_SHARD: usize = 16;

/// The location-level configuration of this module.
#[derive(Debug, Clone, Default)]
pub struct OpenFileCacheLoc {
    /// `None`: not set at this level (inherit); `Some(None)`: `off`;
    /// `Some(Some(c))`: the cache of the directive set here or inherited.
    pub cache: Option<Option<Arc<Cache>>>,
    pub valid_ms: Option<u64>,
    pub min_uses: Option<u64>,
    pub errors: Option<bool>,
    pub events: Option<bool>,
}

impl OpenFileCacheLoc {
    pub fn merge(&mut self, p: &OpenFileCacheLoc) {
        if self.cache.is_none() {
            self.cache = p.cache.clone();
        }
        self.valid_ms = self.valid_ms.or(p.valid_ms);
        self.min_uses = self.min_uses.or(p.min_uses);
        self.errors = self.errors.or(p.errors);
        self.events = self.events.or(p.events);
    }

    /// The cache in effect, if any.
    pub fn cache(&self) -> Option<&Arc<Cache>> {
        self.cache.as_ref().and_then(|c| c.as_ref())
    }

    /// The lookup parameters in effect (defaults filled in).
    pub fn params(&self) -> Params {
        Params {
            valid_ms: self.valid_ms.unwrap_or(DEFAULT_VALID_MS),
            min_uses: self.min_uses.unwrap_or(DEFAULT_MIN_USES),
            errors: self.errors.unwrap_or(false),
        }
    }
}

/// The per-location settings a lookup uses (they may differ between
/// locations sharing one cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub valid_ms: u64,
    pub min_uses: u64,
    pub errors: bool,
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "open_file_cache",
        ctx: ctx::HSL,
        args: Args::take12(),
        set: Setter::Loc(set_cache),
    },
    Spec {
        name: "open_file_cache_valid",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_valid),
    },
    Spec {
        name: "open_file_cache_min_uses",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(set_min_uses),
    },
    Spec {
        name: "open_file_cache_errors",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_errors),
    },
    Spec {
        name: "open_file_cache_events",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(set_events),
    },
];

fn bad_param(d: &Directive, a: &str) -> ConfError {
    ConfError::at(format!("invalid \"{}\" parameter \"{}\"", d.name, a), d)
}

fn set_cache(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    let slot = &mut l.modules.open_file_cache.cache;
    if slot.is_some() {
        return Err(duplicate(d));
    }
    let mut max = None;
    let mut inactive_ms = DEFAULT_INACTIVE_MS;
    let mut off = false;
    for a in d.args.iter().map(|a| a.value.as_str()) {
        if let Some(v) = a.strip_prefix("max=") {
            // nginx: the last max= wins; 0 and non-numbers are invalid.
            match value::number(v).and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n > 0 => max = Some(n),
                _ => return Err(bad_param(d, a)),
            }
        } else if let Some(v) = a.strip_prefix("inactive=") {
            match value::time_secs(v).and_then(|s| s.checked_mul(1000)) {
                Some(ms) => inactive_ms = ms,
                None => return Err(bad_param(d, a)),
            }
        } else if a == "off" {
            off = true;
        } else {
            return Err(bad_param(d, a));
        }
    }
    if off {
        *slot = Some(None);
        return Ok(());
    }
    let Some(max) = max else {
        return Err(ConfError::at(
            format!("\"{}\" must have the \"max\" parameter", d.name),
            d,
        ));
    };
    *slot = Some(Some(Cache::obtain(&d.file, d.line, max, inactive_ms)));
    Ok(())
}

fn set_valid(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    let v = value::time_secs(arg(d, 0))
        .and_then(|s| s.checked_mul(1000))
        .ok_or_else(|| ConfError::at(format!("\"{}\" directive invalid value", d.name), d))?;
    set_once(&mut l.modules.open_file_cache.valid_ms, v, d)
}

fn set_min_uses(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    let v = value::number(arg(d, 0))
        .ok_or_else(|| ConfError::at(format!("\"{}\" directive invalid number", d.name), d))?;
    set_once(&mut l.modules.open_file_cache.min_uses, v, d)
}

fn set_errors(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.open_file_cache.errors, v, d)
}

fn set_events(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.modules.open_file_cache.events, v, d)
}

/// Opens `path` through the location's open file cache (or directly through
/// the file-I/O layer when the cache is off).
pub async fn open(
    cx: &crate::http::phases::Ctx<'_>,
    path: &Path,
    policy: &Policy,
) -> io::Result<Arc<OpenFile>> {
    let conf = &cx.loc.modules.open_file_cache;
    match conf.cache() {
        Some(cache) => cache.open(path, policy, conf.params()).await,
        None => crate::io::open_reusing(path, policy).await,
    }
}

// ---------------------------------------------------------------------------
// Counters

/// Counters of all caches together, for the metrics endpoint: read them
/// with [`Stats::snapshot`]. Each thread adds to its own stripe (a cache
/// line of its own), so counting never bounces a line between workers.
pub struct Stats {
    stripes: [Stripe; STRIPES],
}

const STRIPES: usize = 32;

#[repr(align(64))]
struct Stripe {
    hits: AtomicU64,
    misses: AtomicU64,
    revalidations: AtomicU64,
    evictions: AtomicU64,
    expirations: AtomicU64,
    error_hits: AtomicU64,
    /// Entries holding a descriptor (incremented and decremented in
    /// different stripes; only the sum means anything).
    open: AtomicI64,
}

impl Stripe {
    const fn new() -> Stripe {
        Stripe {
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            revalidations: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            expirations: AtomicU64::new(0),
            error_hits: AtomicU64::new(0),
            open: AtomicI64::new(0),
        }
    }
}

/// A sum of all stripes at one moment (each counter read once; not a
/// transaction across counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Lookups served without opening (a fresh entry, a cached error, or an
    /// entry whose re-check found the file unchanged).
    pub hits: u64,
    /// Lookups that opened the file (absent, not yet kept, or changed).
    pub misses: u64,
    /// `stat`s made because `open_file_cache_valid` had expired.
    pub revalidations: u64,
    /// Entries dropped because a cache was at `max`.
    pub evictions: u64,
    /// Entries dropped by `inactive`.
    pub expirations: u64,
    /// Hits that returned a cached error (also counted in `hits`).
    pub error_hits: u64,
    /// Descriptors currently held by all caches.
    pub open: i64,
}

impl Stats {
    const fn new() -> Stats {
        Stats {
            stripes: [const { Stripe::new() }; STRIPES],
        }
    }

    fn mine(&self) -> &Stripe {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static MINE: usize = NEXT.fetch_add(1, Relaxed) % STRIPES;
        }
        let i = MINE.with(|i| *i);
        &self.stripes[i % STRIPES]
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        for st in &self.stripes {
            s.hits += st.hits.load(Relaxed);
            s.misses += st.misses.load(Relaxed);
            s.revalidations += st.revalidations.load(Relaxed);
            s.evictions += st.evictions.load(Relaxed);
            s.expirations += st.expirations.load(Relaxed);
            s.error_hits += st.error_hits.load(Relaxed);
            s.open += st.open.load(Relaxed);
        }
        s
    }
}

/// The counters of every open file cache in the process.
pub static STATS: Stats = Stats::new();

fn count(f: impl FnOnce(&Stripe) -> &AtomicU64) {
    f(STATS.mine()).fetch_add(1, Relaxed);
}

fn count_open(delta: i64) {
    if delta != 0 {
        STATS.mine().open.fetch_add(delta, Relaxed);
    }
}

// ---------------------------------------------------------------------------
// The cache

fn now_ms() -> u64 {
    crate::io::coarse_ms()
}

/// Errors that describe the path, not the server's state: worth caching.
fn cacheable(e: &io::Error) -> Option<i32> {
    match e.raw_os_error() {
        Some(
            n @ (libc::ENOENT
            | libc::ENOTDIR
            | libc::EACCES
            | libc::EPERM
            | libc::ENAMETOOLONG
            | libc::ELOOP),
        ) => Some(n),
        _ => None,
    }
}

/// One `open_file_cache` directive's cache.
pub struct Cache {
    max: usize,
    inactive_ms: u64,
    shards: Box<[Shard]>,
    /// `shards.len() - 1` (a power of two minus one).
    mask: usize,
    /// Monotonic ms after which the next lookup sweeps inactive entries.
    next_sweep: AtomicU64,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("max", &self.max)
            .field("inactive_ms", &self.inactive_ms)
            .field("shards", &self.shards.len())
            .finish()
    }
}

/// A shard on a cache line of its own, so two workers locking different
/// shards do not false-share.
#[repr(align(64))]
struct Shard(Mutex<Lru>);

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Lru> {
        // A panic while holding the lock cannot leave the LRU half-linked
        // (no operation calls out while relinking), so poison is ignored.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn try_lock(&self) -> Option<MutexGuard<'_, Lru>> {
        match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// What a lookup must do after releasing the shard lock.
enum Plan {
    Open,
    Revalidate(Arc<OpenFile>),
}

/// What the cache knows about one path.
enum State {
    /// Looked up fewer than `min_uses` times: only the count is kept.
    Counted,
    /// An open file or directory, checked against the path at `checked`.
    File { file: Arc<OpenFile>, checked: u64 },
    /// The lookup failed with `errno` at `checked` (`open_file_cache_errors`).
    Error { errno: i32, checked: u64 },
}

impl State {
    fn holds_fd(&self) -> i64 {
        i64::from(matches!(self, State::File { .. }))
    }
}

const NIL: u32 = u32::MAX;

struct Node {
    path: Arc<[u8]>,
    /// Towards the most recently used end.
    prev: u32,
    /// Towards the least recently used end.
    next: u32,
    uses: u64,
    accessed: u64,
    state: State,
}

/// One shard: a map from path bytes to a slot of `nodes`, and a doubly
/// linked LRU list through the slots (`head` = most recently used).
/// Free slots are reused so the slab never grows past `cap`.
struct Lru {
    map: HashMap<Arc<[u8]>, u32, PathHash>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    cap: usize,
}

impl Lru {
    fn new(cap: usize) -> Lru {
        Lru {
            map: HashMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            cap,
        }
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        self.map.get(key).copied()
    }

    fn unlink(&mut self, i: u32) {
        let (p, n) = {
            let node = &self.nodes[i as usize];
            (node.prev, node.next)
        };
        if p == NIL {
            self.head = n;
        } else {
            self.nodes[p as usize].next = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.nodes[n as usize].prev = p;
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        {
            let node = &mut self.nodes[i as usize];
            node.prev = NIL;
            node.next = old;
        }
        if old == NIL {
            self.tail = i;
        } else {
            self.nodes[old as usize].prev = i;
        }
        self.head = i;
    }

    /// A use of entry `i`: most recently used now, one more use.
    fn touch(&mut self, i: u32, now: u64) -> &mut Node {
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
        let node = &mut self.nodes[i as usize];
        node.uses = node.uses.saturating_add(1);
        node.accessed = now;
        node
    }

    /// Removes entry `i`; returns its state for the caller to drop after
    /// unlocking.
    fn remove(&mut self, i: u32) -> State {
        self.unlink(i);
        let node = &mut self.nodes[i as usize];
        let state = std::mem::replace(&mut node.state, State::Counted);
        let path = std::mem::replace(&mut node.path, Arc::from(&[][..]));
        self.map.remove(&path);
        self.free.push(i);
        count_open(-state.holds_fd());
        state
    }

    /// Adds an entry (one use) for `key`, evicting the least recently used
    /// one when full; returns the slot and the evicted state.
    fn insert(&mut self, key: &[u8], now: u64) -> (u32, Option<State>) {
        let evicted = if self.len() >= self.cap && self.tail != NIL {
            count(|s| &s.evictions);
            Some(self.remove(self.tail))
        } else {
            None
        };
        let path: Arc<[u8]> = Arc::from(key);
        let node = Node {
            path: Arc::clone(&path),
            prev: NIL,
            next: NIL,
            uses: 1,
            accessed: now,
            state: State::Counted,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                // The slab never exceeds `cap` < u32::MAX (see `Cache::new`).
                (self.nodes.len() - 1) as u32
            }
        };
        self.map.insert(path, i);
        self.push_front(i);
        (i, evicted)
    }

    /// Replaces the state of `i`, returning the old one (to drop unlocked).
    fn set_state(&mut self, i: u32, state: State) -> State {
        let node = &mut self.nodes[i as usize];
        count_open(state.holds_fd() - node.state.holds_fd());
        std::mem::replace(&mut node.state, state)
    }

    /// Drops up to `limit` least recently used entries not used within
    /// `inactive_ms`.
    fn expire(&mut self, now: u64, inactive_ms: u64, limit: usize, out: &mut Vec<State>) {
        for _ in 0..limit {
            let t = self.tail;
            if t == NIL || now.saturating_sub(self.nodes[t as usize].accessed) <= inactive_ms {
                return;
            }
            count(|s| &s.expirations);
            out.push(self.remove(t));
        }
    }
}

/// Caches alive anywhere in the process, by the directive that made them
/// (file, line) and its parameters: a reload whose directive is unchanged
/// gets the same cache back.
static REGISTRY: Mutex<Vec<(RegKey, Weak<Cache>)>> = Mutex::new(Vec::new());

#[derive(PartialEq, Eq)]
struct RegKey {
    file: PathBuf,
    line: usize,
    max: usize,
    inactive_ms: u64,
}

impl Cache {
    /// An empty cache of at most `max` entries, split into shards of
    /// capacities summing to exactly `max`.
    pub fn new(max: usize, inactive_ms: u64) -> Cache {
        // Slots are u32 indices; a max beyond 4 billion descriptors is not
        // a real configuration, so it is clamped.
        let max = max.clamp(1, u32::MAX as usize - 1);
        let mut n = 1usize;
        while n * 2 <= MAX_SHARDS && n * 2 * MIN_PER_SHARD <= max {
            n *= 2;
        }
        let (per, extra) = (max / n, max % n);
        let shards = (0..n)
            .map(|i| Shard(Mutex::new(Lru::new(per + usize::from(i < extra)))))
            .collect::<Vec<_>>()
            .into_boxed_slice();
        Cache {
            max,
            inactive_ms,
            shards,
            mask: n - 1,
            next_sweep: AtomicU64::new(0),
        }
    }

    /// The cache for the directive at `file:line` with these parameters:
    /// the live one from before a reload if there is one, else a new one.
    pub fn obtain(file: &Path, line: usize, max: usize, inactive_ms: u64) -> Arc<Cache> {
        let key = RegKey {
            file: file.to_path_buf(),
            line,
            max,
            inactive_ms,
        };
        let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        reg.retain(|(_, w)| w.strong_count() > 0);
        if let Some(c) = reg
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            return c;
        }
        let c = Arc::new(Cache::new(max, inactive_ms));
        reg.push((key, Arc::downgrade(&c)));
        c
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn inactive_ms(&self) -> u64 {
        self.inactive_ms
    }

    /// Entries currently cached (all shards; a moment's view).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard of `key`: a multiply-rotate hash, 8 bytes at a time. It
    /// only spreads paths over shards; the map inside uses a keyed hash
    /// ([`PathHash`]), so
    /// crafted paths cannot degrade lookups.
    fn shard(&self, key: &[u8]) -> &Shard {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut h = key.len() as u64;
        let mut chunks = key.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
        // The high bits are the well-mixed ones.
        &self.shards[(h >> 40) as usize & self.mask]
    }

    /// At most once per [`SWEEP_EVERY_MS`]: drop inactive entries from every
    /// shard that is not locked right now.
    fn maybe_sweep(&self, now: u64) {
        let next = self.next_sweep.load(Relaxed);
        if now < next {
            return;
        }
        // One thread wins the sweep; the others go on serving.
        if self
            .next_sweep
            .compare_exchange(next, now + SWEEP_EVERY_MS, Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        let mut dead = Vec::new();
        for s in self.shards.iter() {
            if let Some(mut g) = s.try_lock() {
                g.expire(now, self.inactive_ms, SWEEP_BATCH, &mut dead);
            }
        }
        // Descriptors close here, with no lock held.
        drop(dead);
    }

    /// Drops every entry (descriptors held by responses in flight stay open
    /// until those finish).
    pub fn clear(&self) {
        for s in self.shards.iter() {
            let mut dead = Vec::new();
            {
                let mut g = s.lock();
                while g.tail != NIL {
                    let t = g.tail;
                    dead.push(g.remove(t));
                }
            }
            drop(dead);
        }
    }

    /// Looks `path` up; opens or re-checks it through the file-I/O layer
    /// when needed. Errors are the `open(2)`/`stat(2)` errors (cached ones
    /// included), as [`crate::io::open`] returns them.
    pub async fn open(&self, path: &Path, policy: &Policy, p: Params) -> io::Result<Arc<OpenFile>> {
        let key = path.as_os_str().as_bytes();
        let now = now_ms();
        self.maybe_sweep(now);
        let shard = self.shard(key);
        let plan = {
            let mut g = shard.lock();
            match g.find(key) {
                None => Plan::Open,
                Some(i) => {
                    let node = g.touch(i, now);
                    let fresh = |checked: u64| now.saturating_sub(checked) < p.valid_ms;
                    match &node.state {
                        State::File { file, checked } if fresh(*checked) => {
                            count(|s| &s.hits);
                            return Ok(Arc::clone(file));
                        }
                        // A cached error is served even where errors are
                        // not cached (nginx does the same).
                        State::Error { errno, checked } if fresh(*checked) => {
                            count(|s| &s.hits);
                            count(|s| &s.error_hits);
                            return Err(io::Error::from_raw_os_error(*errno));
                        }
                        State::File { file, .. } => Plan::Revalidate(Arc::clone(file)),
                        State::Error { .. } | State::Counted => Plan::Open,
                    }
                }
            }
        };
        let result = match plan {
            Plan::Revalidate(old) => {
                count(|s| &s.revalidations);
                match crate::io::stat(path, policy).await {
                    Ok(m) if old.unchanged_by(&m) && m.is_dir == old.meta.is_dir => {
                        count(|s| &s.hits);
                        self.refresh(shard, key, &old, now);
                        return Ok(old);
                    }
                    // Changed (or became a directory, or a file): a new
                    // descriptor, never the old one with new attributes.
                    Ok(_) => {
                        count(|s| &s.misses);
                        crate::io::open(path, policy).await
                    }
                    Err(e) => Err(e),
                }
            }
            Plan::Open => {
                count(|s| &s.misses);
                crate::io::open(path, policy).await
            }
        };
        // `now` (taken before the check) is the entry's check time: the
        // validity window never extends past `valid` after the check began.
        self.store(shard, key, &result, p, now);
        result
    }

    /// The re-check found the file unchanged: restart its validity, unless
    /// another request replaced the entry meanwhile (then that one is newer).
    fn refresh(&self, shard: &Shard, key: &[u8], old: &Arc<OpenFile>, now: u64) {
        let mut g = shard.lock();
        if let Some(i) = g.find(key) {
            if let State::File { file, checked } = &mut g.nodes[i as usize].state {
                if Arc::ptr_eq(file, old) {
                    *checked = now;
                }
            }
        }
    }

    /// Records the outcome of an open (or failed re-check) of `key`.
    fn store(
        &self,
        shard: &Shard,
        key: &[u8],
        result: &io::Result<Arc<OpenFile>>,
        p: Params,
        now: u64,
    ) {
        let cached_err = match result {
            Err(e) if p.errors => cacheable(e),
            _ => None,
        };
        // Declared before the guard so that they drop (closing descriptors)
        // after it is released.
        let old: Option<State>;
        let evicted: Option<State>;
        let mut g = shard.lock();
        let i = match g.find(key) {
            Some(i) => {
                evicted = None;
                i
            }
            // Nothing to remember about a failure that is not cached.
            None if result.is_err() && cached_err.is_none() => return,
            None => {
                let (i, ev) = g.insert(key, now);
                evicted = ev;
                i
            }
        };
        let uses = g.nodes[i as usize].uses;
        let state = match (result, cached_err) {
            (Ok(f), _) if f.meta.is_dir || uses >= p.min_uses => {
                // A kept descriptor also keeps a small file's bytes (see
                // `crate::io::OpenFile`): a hit then costs no read at all.
                f.keep_content();
                State::File {
                    file: Arc::clone(f),
                    checked: now,
                }
            }
            (Ok(_), _) => State::Counted,
            (Err(_), Some(errno)) => State::Error {
                errno,
                checked: now,
            },
            // A failure that is not cached drops what was known (nginx's
            // behaviour: the next lookup starts over).
            (Err(_), None) => {
                old = Some(g.remove(i));
                drop(g);
                drop((old, evicted));
                return;
            }
        };
        old = Some(g.set_state(i, state));
        drop(g);
        drop((old, evicted));
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // Keep the `open` gauge right: the entries' descriptors go now.
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn dir(name: &str, args: &[&str]) -> Directive {
        Directive::for_test(name, args, "/etc/tern/ofc-unit.conf", 3)
    }

    fn set(l: &mut LocConf, name: &str, args: &[&str]) -> Result<(), String> {
        let d = dir(name, args);
        let row = DIRECTIVES.iter().find(|s| s.name == name);
        match row.map(|r| r.set) {
            Some(Setter::Loc(f)) => f(l, &d, &mut Compiler::default()).map_err(|e| e.msg.clone()),
            _ => Err(format!("no loc row {name}")),
        }
    }

    #[test]
    fn directive_errors_match_nginx() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["max=0"],
                "invalid \"open_file_cache\" parameter \"max=0\"",
            ),
            (
                &["max=x"],
                "invalid \"open_file_cache\" parameter \"max=x\"",
            ),
            (
                &["max=-1"],
                "invalid \"open_file_cache\" parameter \"max=-1\"",
            ),
            (&["OFF"], "invalid \"open_file_cache\" parameter \"OFF\""),
            (
                &["max=10", "inactive=500ms"],
                "invalid \"open_file_cache\" parameter \"inactive=500ms\"",
            ),
            (
                &["max=10", "foo"],
                "invalid \"open_file_cache\" parameter \"foo\"",
            ),
            (
                &["inactive=10s"],
                "\"open_file_cache\" must have the \"max\" parameter",
            ),
        ];
        for (args, want) in cases {
            let mut l = LocConf::default();
            assert_eq!(set(&mut l, "open_file_cache", args), Err(want.to_string()));
        }
        let mut l = LocConf::default();
        set(&mut l, "open_file_cache", &["off", "max=10"]).unwrap();
        assert!(l.modules.open_file_cache.cache().is_none());
        assert!(l.modules.open_file_cache.cache.is_some());
        assert_eq!(
            set(&mut l, "open_file_cache", &["max=1"]),
            Err("\"open_file_cache\" directive is duplicate".into())
        );

        let mut l = LocConf::default();
        set(
            &mut l,
            "open_file_cache",
            &["max=10", "max=20", "inactive=0"],
        )
        .unwrap();
        let c = l.modules.open_file_cache.cache().unwrap();
        assert_eq!((c.max(), c.inactive_ms()), (20, 0));

        let mut l = LocConf::default();
        assert_eq!(
            set(&mut l, "open_file_cache_valid", &["1x"]),
            Err("\"open_file_cache_valid\" directive invalid value".into())
        );
        set(&mut l, "open_file_cache_valid", &["2m"]).unwrap();
        assert_eq!(
            set(&mut l, "open_file_cache_valid", &["1s"]),
            Err("\"open_file_cache_valid\" directive is duplicate".into())
        );
        assert_eq!(
            set(&mut l, "open_file_cache_min_uses", &["x"]),
            Err("\"open_file_cache_min_uses\" directive invalid number".into())
        );
        set(&mut l, "open_file_cache_min_uses", &["0"]).unwrap();
        assert_eq!(
            set(&mut l, "open_file_cache_errors", &["maybe"]),
            Err("invalid value \"maybe\" in \"open_file_cache_errors\" directive, it must be \"on\" or \"off\"".into())
        );
        set(&mut l, "open_file_cache_errors", &["ON"]).unwrap();
        set(&mut l, "open_file_cache_events", &["on"]).unwrap();
        let p = l.modules.open_file_cache.params();
        assert_eq!(
            p,
            Params {
                valid_ms: 120_000,
                min_uses: 0,
                errors: true
            }
        );
    }

    #[test]
    fn inheritance_shares_one_cache_and_off_stops_it() {
        let mut http = LocConf::default();
        set(&mut http, "open_file_cache", &["max=7"]).unwrap();
        set(&mut http, "open_file_cache_valid", &["5s"]).unwrap();
        let mut loc = LocConf::default();
        loc.modules
            .open_file_cache
            .merge(&http.modules.open_file_cache);
        let (a, b) = (
            http.modules.open_file_cache.cache().unwrap(),
            loc.modules.open_file_cache.cache().unwrap(),
        );
        assert!(Arc::ptr_eq(a, b));
        assert_eq!(loc.modules.open_file_cache.params().valid_ms, 5000);
        let mut off = LocConf::default();
        set(&mut off, "open_file_cache", &["off"]).unwrap();
        off.modules
            .open_file_cache
            .merge(&http.modules.open_file_cache);
        assert!(off.modules.open_file_cache.cache().is_none());
        assert_eq!(
            LocConf::default().modules.open_file_cache.params().valid_ms,
            60_000
        );
    }

    #[test]
    fn reload_gets_the_same_cache_only_when_unchanged() {
        let f = Path::new("/etc/tern/reload-unit.conf");
        let a = Cache::obtain(f, 9, 100, 60_000);
        let b = Cache::obtain(f, 9, 100, 60_000);
        assert!(Arc::ptr_eq(&a, &b));
        let c = Cache::obtain(f, 9, 101, 60_000);
        assert!(!Arc::ptr_eq(&a, &c));
        let d = Cache::obtain(f, 10, 100, 60_000);
        assert!(!Arc::ptr_eq(&a, &d));
        drop((a, b));
        let e = Cache::obtain(f, 9, 100, 60_000);
        assert_eq!(e.len(), 0);
    }

    #[test]
    fn shard_capacities_sum_to_max() {
        for max in [1usize, 2, 15, 16, 31, 32, 33, 100, 1000, 1023, 200_000] {
            let c = Cache::new(max, 0);
            let caps: usize = c.shards.iter().map(|s| s.lock().cap).sum();
            assert_eq!(caps, max, "max={max}");
            assert!(c.shards.len().is_power_of_two());
            assert!(c.shards.len() <= MAX_SHARDS);
        }
        assert_eq!(Cache::new(31, 0).shards.len(), 1);
    }

    // --- behaviour on real files, through the io layer (aio off: inline) ---

    struct Tmp(PathBuf);
    impl Tmp {
        fn new() -> Tmp {
            static N: AtomicU32 = AtomicU32::new(0);
            let d = std::env::temp_dir().join(format!(
                "tern-ofc-unit-{}-{}",
                std::process::id(),
                N.fetch_add(1, Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Tmp(d)
        }
        fn file(&self, name: &str, data: &str) -> PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, data).unwrap();
            p
        }
    }
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn params(valid_ms: u64, min_uses: u64, errors: bool) -> Params {
        Params {
            valid_ms,
            min_uses,
            errors,
        }
    }

    #[test]
    fn hit_returns_the_same_descriptor_until_valid_expires() {
        let t = Tmp::new();
        let a = t.file("a", "one");
        let c = Cache::new(8, 60_000);
        let pol = Policy::default();
        run(async {
            let p = params(60_000, 1, false);
            let f1 = c.open(&a, &pol, p).await.unwrap();
            let f2 = c.open(&a, &pol, p).await.unwrap();
            assert!(Arc::ptr_eq(&f1, &f2));
            // Replaced by rename: still the old inode within `valid`...
            t.file("a.new", "second");
            std::fs::rename(t.0.join("a.new"), &a).unwrap();
            let f3 = c.open(&a, &pol, p).await.unwrap();
            assert!(Arc::ptr_eq(&f1, &f3));
            // ...and the new one, with its own size, once it expired.
            let f4 = c.open(&a, &pol, params(0, 1, false)).await.unwrap();
            assert_ne!(f4.meta.ino, f1.meta.ino);
            assert_eq!(f4.meta.size, 6);
            // Unchanged after a re-check: the same descriptor is kept.
            let f5 = c.open(&a, &pol, params(0, 1, false)).await.unwrap();
            assert!(Arc::ptr_eq(&f4, &f5));
        });
    }

    #[test]
    fn lru_at_max_drops_the_least_recently_used_and_closes_it() {
        let t = Tmp::new();
        let c = Cache::new(2, 60_000);
        let pol = Policy::default();
        let p = params(60_000, 1, false);
        run(async {
            let a = c.open(&t.file("a", "a"), &pol, p).await.unwrap();
            let b = c.open(&t.file("b", "b"), &pol, p).await.unwrap();
            let weak_a = Arc::downgrade(&a);
            let weak_b = Arc::downgrade(&b);
            drop((a, b));
            // Touch a, so b is the least recently used.
            c.open(&t.0.join("a"), &pol, p).await.unwrap();
            let x = c.open(&t.file("x", "x"), &pol, p).await.unwrap();
            assert_eq!(c.len(), 2);
            assert!(weak_b.upgrade().is_none(), "b was closed");
            assert!(weak_a.upgrade().is_some(), "a is still cached");
            // A response in flight keeps an evicted descriptor open.
            let y_held = c.open(&t.file("y", "y"), &pol, p).await.unwrap();
            let weak_x = Arc::downgrade(&x);
            c.open(&t.file("z", "z"), &pol, p).await.unwrap();
            c.open(&t.0.join("a"), &pol, p).await.unwrap();
            assert!(weak_x.upgrade().is_some(), "held by its response");
            drop(x);
            assert!(weak_x.upgrade().is_none());
            drop(y_held);
        });
    }

    #[test]
    fn min_uses_keeps_the_descriptor_from_the_nth_use() {
        let t = Tmp::new();
        let a = t.file("a", "a");
        let c = Cache::new(8, 60_000);
        let pol = Policy::default();
        let p = params(60_000, 3, false);
        run(async {
            let f1 = c.open(&a, &pol, p).await.unwrap();
            let f2 = c.open(&a, &pol, p).await.unwrap();
            assert!(!Arc::ptr_eq(&f1, &f2), "not kept before 3 uses");
            let f3 = c.open(&a, &pol, p).await.unwrap();
            let f4 = c.open(&a, &pol, p).await.unwrap();
            assert!(Arc::ptr_eq(&f3, &f4), "kept from the 3rd use");
        });
    }

    #[test]
    fn errors_are_cached_only_when_asked() {
        let t = Tmp::new();
        let a = t.0.join("late");
        let c = Cache::new(8, 60_000);
        let pol = Policy::default();
        run(async {
            let off = params(60_000, 1, false);
            let e = c.open(&a, &pol, off).await.unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
            assert_eq!(c.len(), 0);
            let b = t.0.join("late2");
            let on = params(60_000, 1, true);
            assert!(c.open(&b, &pol, on).await.is_err());
            t.file("late2", "now");
            let e = c.open(&b, &pol, on).await.unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "cached");
            let f = c.open(&b, &pol, params(0, 1, true)).await.unwrap();
            assert_eq!(f.meta.size, 3);
        });
    }

    #[test]
    fn inactive_entries_are_swept() {
        let t = Tmp::new();
        let c = Cache::new(8, 0);
        let pol = Policy::default();
        let p = params(60_000, 1, false);
        run(async {
            let a = c.open(&t.file("a", "a"), &pol, p).await.unwrap();
            let w = Arc::downgrade(&a);
            drop(a);
            // Force the next lookup to sweep, a few ms later than the use.
            std::thread::sleep(std::time::Duration::from_millis(30));
            c.next_sweep.store(0, Relaxed);
            c.open(&t.file("b", "b"), &pol, p).await.unwrap();
            assert!(w.upgrade().is_none());
            assert_eq!(c.len(), 1);
        });
    }
}
