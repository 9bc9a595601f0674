//! The on-disk HTTP cache: keys zones, cache files, the loader and the
//! manager (`proxy_cache_path`).
//!
//! # Layout on disk (nginx's)
//!
//! The key (`proxy_cache_key`) is hashed with MD5; the file is named by
//! the 32 hex digits and sits under `levels` directories taken from the
//! *end* of the name: with `levels=1:2`, key md5 `…c244` lives at
//! `PATH/4/24/…c244`. So an operator's tooling (and `find -name`) works the
//! same on tern's cache as on nginx's. The *contents* of a cache file are
//! tern-specific ([`file`]): nginx's binary header is not reproduced, and
//! a cache directory is not meant to be shared between the two servers.
//!
//! # Cache entry states
//!
//! ```text
//!               MISS/EXPIRED: fetch from upstream
//!   absent ───────────────────────────────────────▶ temp
//!     ▲          (PATH/<levels>/<md5>.tern-tmp-PID-N, written through the
//!     │           file-I/O layer, invisible to lookups)
//!     │                                               │ body complete, header
//!     │   upstream error / not cacheable              │ written: rename(2)
//!     │◀────────────── temp unlinked ─────────────────┤
//!     │                                               ▼
//!     │   evicted (LRU over max_size,           complete = on disk under its
//!     │   inactive, keys zone full)              final name, node in the zone
//!     │◀─────────────────────────────────────────────┤
//!     │                                     ┌────────┴────────┐
//!     │                                     ▼                 ▼
//!     │                                   valid ──time──▶ expired
//!     │                                  (HIT)             (EXPIRED: refetch,
//!     │                                                     back to temp; the
//!     └─────────────────────────────────────────────────── old file serves
//!                                                           until the rename)
//! ```
//!
//! A key being fetched carries an `updating` mark in its zone (nginx's
//! node->updating): the request that holds it ([`UpdateGuard`]) refreshes
//! an expired entry or, with `proxy_cache_lock`, fills a new one; others
//! serve the stale entry (`proxy_cache_use_stale updating`) or wait for
//! the mark to go ([`Zone::wait_update`]). The mark goes when the guard is
//! dropped: after the rename, or when the fetch is given up.
//!
//! Invariants:
//!
//! - a file under a final (32-hex) name is always complete: it only gets
//!   there by `rename` after its last byte was written, and rename is
//!   atomic within a directory (the temp file is in the same directory, so
//!   `use_temp_path` is always effectively `off`);
//! - a temp file is never served: lookups only ever open final names;
//! - a final file is served only if its header parses, names the same key,
//!   and its size is exactly header + body length (a file truncated by a
//!   full disk or a crash of the machine, not of tern, is deleted instead);
//!   a file of another format version ([`file::MAGIC`]) is a miss,
//!   replaced by the next answer stored and deleted by the loader;
//! - the keys zone may lag the disk, never lead it in a harmful way: a
//!   node whose file vanished is a MISS (and the node is dropped), a file
//!   without a node (previous run, loader not there yet) is adopted on
//!   lookup, as nginx does.
//!
//! # Who does what
//!
//! - Workers look entries up, write temp files, rename, insert nodes.
//! - One *keeper* thread per process (started by the master thread while
//!   compiling the configuration, so it keeps the master's credentials)
//!   runs each new zone's **loader** (scan the tree, adopt complete entries,
//!   delete leftovers of a crashed run), then every second the **manager**
//!   (forget entries unused for `inactive`, evict LRU above `max_size`,
//!   evict LRU while the file system has less than `min_free` available,
//!   unlink the files).
//!
//! `min_free`: the manager asks `statvfs` for the space available to
//! unprivileged users (as nginx's `ngx_fs_available`) and, below the
//! threshold, evicts least recently used entries whose sizes add up to the
//! shortfall; the next pass looks again. nginx evicts one entry at a time
//! and looks again after each; the outcome is the same, sooner.
//!
//! Pacing ([`Pacing`], `proxy_cache_path`'s `loader_*`/`manager_*`): each
//! new zone's loader runs on a thread of its own (started by the keeper, so
//! with its credentials) and, as nginx's loader process, sleeps
//! `loader_sleep` after every `loader_files` files or `loader_threshold`
//! of work. A manager pass evicts at most `manager_files` entries for
//! `max_size`/`min_free` and unlinks for at most `manager_threshold` (the
//! rest stays queued); a pass cut short by either is followed by the next
//! after `manager_sleep`, otherwise after a second. As in nginx, space that other
//! files take counts too: if evicting cannot bring it back, the cache
//! empties. It also creates the cache directory and hands it to
//!   the user workers run as, like nginx's master does for its paths:
//!   workers cannot create directories in a root-owned prefix.
//!
//! Zones are process-wide shared state: a reload that keeps a zone's name,
//! size, path and levels keeps the zone (and its nodes).

pub mod file;
pub mod md5;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::io::{Aio, Policy};

/// Seconds since the epoch (cache validity is persisted, so wall clock).
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A `proxy_cache_path` as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathConf {
    pub path: PathBuf,
    /// Directory name lengths, outermost first (`levels=1:2` = `[1, 2]`).
    pub levels: Vec<usize>,
    pub name: String,
    pub size: usize,
    pub max_size: Option<u64>,
    pub inactive_secs: u64,
    /// `min_free` in bytes (0: not checked).
    pub min_free: u64,
    pub pacing: Pacing,
}

/// The loader's and the manager's pacing (`loader_files=`, ...), with
/// nginx's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    pub loader_files: u64,
    pub loader_sleep: Duration,
    pub loader_threshold: Duration,
    pub manager_files: u64,
    pub manager_sleep: Duration,
    pub manager_threshold: Duration,
}

impl Default for Pacing {
    fn default() -> Pacing {
        Pacing {
            loader_files: 100,
            loader_sleep: Duration::from_millis(50),
            loader_threshold: Duration::from_millis(200),
            manager_files: 100,
            manager_sleep: Duration::from_millis(50),
            manager_threshold: Duration::from_millis(200),
        }
    }
}

impl PathConf {
    /// What identifies a zone across reloads (limits may change).
    fn same_zone(&self, o: &PathConf) -> bool {
        self.name == o.name && self.size == o.size && self.path == o.path && self.levels == o.levels
    }
}

/// What the zone knows of one entry.
#[derive(Debug, Clone, Copy)]
pub struct Node {
    pub valid_until: i64,
    /// Bytes the file takes (what `max_size` counts).
    pub disk: u64,
    last_access: i64,
    lru: u64,
}

#[derive(Debug, Default)]
struct Inner {
    nodes: HashMap<[u8; 16], Node>,
    /// LRU order: sequence number of the last use -> key.
    lru: BTreeMap<u64, [u8; 16]>,
    seq: u64,
    disk: u64,
    /// Evicted entries whose files the keeper must unlink.
    doomed: Vec<[u8; 16]>,
    /// Keys a request is fetching (nginx's `updating` node flag): the
    /// holder's token, and when another request may take over
    /// (`proxy_cache_lock_age`; None: only when the holder is done).
    updating: HashMap<[u8; 16], (u64, Option<Instant>)>,
    /// Requests seen for keys not stored yet (`proxy_cache_min_uses`).
    uses: HashMap<[u8; 16], u64>,
    /// Error statuses answered for a key, and until when (nginx's
    /// node->error: an intercepted error, or a 502/504 of a failed
    /// upstream, that `proxy_cache_valid` or the answer's headers let be
    /// cached). Memory only, as in nginx.
    errors: HashMap<[u8; 16], (u16, i64)>,
    /// The Vary variants stored under hashes of their own, by the hash
    /// of their key: a purge of the key removes them too.
    variants: HashMap<[u8; 16], Vec<[u8; 16]>>,
}

/// A keys zone: the in-memory index of one cache directory.
#[derive(Debug)]
pub struct Zone {
    /// As first configured; `max_size` and `inactive` live in the atomics
    /// below so that a reload can change them on a kept zone.
    pub conf: PathConf,
    /// `max_size` in bytes (`u64::MAX` = unlimited).
    max_size: AtomicU64,
    inactive_secs: AtomicU64,
    min_free: AtomicU64,
    /// As last configured (a reload may change it on a kept zone).
    pacing: Mutex<Pacing>,
    inner: Mutex<Inner>,
    /// Nodes the zone may hold (nginx: about 8000 per megabyte).
    max_nodes: usize,
    /// The directory exists and belongs to the workers' user.
    ready: AtomicBool,
    /// Loader finished (for tests and the status page).
    pub loaded: AtomicBool,
    /// Woken whenever an [`UpdateGuard`] is released.
    released: tokio::sync::Notify,
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Suffix of temp files: `<md5>.tern-tmp-<pid>-<n>`.
pub const TEMP_MARK: &str = ".tern-tmp-";

impl Zone {
    fn new(conf: PathConf) -> Zone {
        let z = Zone {
            max_nodes: (conf.size / 128).max(8),
            inner: Mutex::new(Inner::default()),
            ready: AtomicBool::new(false),
            loaded: AtomicBool::new(false),
            max_size: AtomicU64::new(u64::MAX),
            inactive_secs: AtomicU64::new(600),
            min_free: AtomicU64::new(0),
            pacing: Mutex::new(conf.pacing),
            released: tokio::sync::Notify::new(),
            conf,
        };
        z.set_limits(&z.conf.clone());
        z
    }

    fn set_limits(&self, c: &PathConf) {
        self.max_size
            .store(c.max_size.unwrap_or(u64::MAX), Ordering::Relaxed);
        self.inactive_secs.store(c.inactive_secs, Ordering::Relaxed);
        self.min_free.store(c.min_free, Ordering::Relaxed);
        *self.pacing.lock().unwrap_or_else(|e| e.into_inner()) = c.pacing;
    }

    fn pacing(&self) -> Pacing {
        *self.pacing.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The final path of the entry with this key hash.
    pub fn file_path(&self, md5: &[u8; 16]) -> PathBuf {
        entry_path(&self.conf.path, &self.conf.levels, md5)
    }

    /// A fresh temp path in the entry's own directory (same filesystem, so
    /// the final rename is atomic).
    pub fn temp_path(&self, md5: &[u8; 16]) -> PathBuf {
        let mut p = self.file_path(md5).into_os_string();
        p.push(format!(
            "{}{}-{}",
            TEMP_MARK,
            std::process::id(),
            TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        PathBuf::from(p)
    }

    /// Looks a key up, marking it used. None when the zone has no node.
    pub fn touch(&self, md5: &[u8; 16]) -> Option<Node> {
        let mut g = self.lock();
        let inner = &mut *g;
        inner.seq += 1;
        let seq = inner.seq;
        let n = inner.nodes.get_mut(md5)?;
        inner.lru.remove(&n.lru);
        n.lru = seq;
        n.last_access = now_secs();
        inner.lru.insert(seq, *md5);
        Some(*n)
    }

    /// Records a complete entry (after its rename, or adopted from disk).
    /// Evicts LRU entries when the zone is full.
    pub fn insert(&self, md5: [u8; 16], valid_until: i64, disk: u64) {
        let mut g = self.lock();
        let inner = &mut *g;
        inner.seq += 1;
        let seq = inner.seq;
        if let Some(old) = inner.nodes.remove(&md5) {
            inner.lru.remove(&old.lru);
            inner.disk = inner.disk.saturating_sub(old.disk);
        }
        inner.nodes.insert(
            md5,
            Node {
                valid_until,
                disk,
                last_access: now_secs(),
                lru: seq,
            },
        );
        inner.lru.insert(seq, md5);
        inner.disk += disk;
        // Re-inserted: whatever eviction was pending for this key is void.
        inner.doomed.retain(|d| *d != md5);
        inner.uses.remove(&md5);
        // A stored answer replaces a cached error.
        inner.errors.remove(&md5);
        while inner.nodes.len() > self.max_nodes {
            let Some((_, k)) = inner.lru.pop_first() else {
                break;
            };
            if let Some(n) = inner.nodes.remove(&k) {
                inner.disk = inner.disk.saturating_sub(n.disk);
                inner.doomed.push(k);
            }
        }
    }

    /// Remembers that the key's answer is the error `status` until
    /// `valid_until` (its file, if any, stays).
    pub fn set_error(&self, md5: [u8; 16], status: u16, valid_until: i64) {
        let mut g = self.lock();
        if g.errors.len() >= self.max_nodes && !g.errors.contains_key(&md5) {
            let now = now_secs();
            g.errors.retain(|_, (_, v)| *v >= now);
            if g.errors.len() >= self.max_nodes {
                return;
            }
        }
        g.errors.insert(md5, (status, valid_until));
    }

    /// The cached error for the key, while it is valid (an expired one is
    /// forgotten: the request goes upstream, as nginx's "renew").
    pub fn cached_error(&self, md5: &[u8; 16]) -> Option<u16> {
        let mut g = self.lock();
        let (status, until) = *g.errors.get(md5)?;
        if until < now_secs() {
            g.errors.remove(md5);
            return None;
        }
        Some(status)
    }

    /// Records that the entry named `md5` is a Vary variant of the key
    /// whose hash is `main`.
    pub fn add_variant(&self, main: [u8; 16], md5: [u8; 16]) {
        let mut g = self.lock();
        let v = g.variants.entry(main).or_default();
        if !v.contains(&md5) {
            v.push(md5);
        }
    }

    /// The variants recorded for the key whose hash is `main`, forgotten.
    pub fn take_variants(&self, main: &[u8; 16]) -> Vec<[u8; 16]> {
        self.lock().variants.remove(main).unwrap_or_default()
    }

    /// Forgets a node (its file vanished or is invalid).
    pub fn remove(&self, md5: &[u8; 16]) {
        let mut g = self.lock();
        if let Some(n) = g.nodes.remove(md5) {
            g.lru.remove(&n.lru);
            g.disk = g.disk.saturating_sub(n.disk);
        }
    }

    /// The key hashes of every entry the zone knows (a wildcard purge
    /// reads their files' keys).
    pub fn hashes(&self) -> Vec<[u8; 16]> {
        self.lock().nodes.keys().copied().collect()
    }

    /// Total bytes of the entries the zone knows.
    pub fn disk_size(&self) -> u64 {
        self.lock().disk
    }

    pub fn len(&self) -> usize {
        self.lock().nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes sure the cache directory exists and is writable by the calling
    /// (worker) thread's user: asks the keeper once, then remembers.
    pub async fn ensure_ready(&self) -> io::Result<()> {
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        prepare_dir(&self.conf.path).await?;
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// The shortfall of the cache's file system below `min_free` (0 when
    /// not configured, not short, or the directory cannot be examined yet).
    fn free_shortfall(&self) -> u64 {
        let min = self.min_free.load(Ordering::Relaxed);
        if min == 0 {
            return 0;
        }
        crate::io::fs_available(&self.conf.path).map_or(0, |free| min.saturating_sub(free))
    }

    /// One manager pass: forget inactive entries, evict LRU over max_size,
    /// then LRU entries adding up to `short` bytes (the file system's
    /// shortfall below min_free), at most `max_evict` of these two kinds.
    /// Returns the files to unlink and whether the cap cut the pass short.
    fn manage(&self, short: u64, max_evict: u64) -> (Vec<[u8; 16]>, bool) {
        let now = now_secs();
        let mut g = self.lock();
        let inner = &mut *g;
        let mut out = std::mem::take(&mut inner.doomed);
        // What this pass frees for inactive and max_size counts towards
        // the min_free shortfall too.
        let before = inner.disk;
        let inactive = self.inactive_secs.load(Ordering::Relaxed) as i64;
        inner.errors.retain(|_, (_, v)| *v >= now);
        {
            let Inner {
                nodes, variants, ..
            } = &mut *inner;
            variants.retain(|_, v| {
                v.retain(|m| nodes.contains_key(m));
                !v.is_empty()
            });
        }
        let stale: Vec<[u8; 16]> = inner
            .nodes
            .iter()
            .filter(|(_, n)| now - n.last_access > inactive)
            .map(|(k, _)| *k)
            .collect();
        for k in stale {
            if let Some(n) = inner.nodes.remove(&k) {
                inner.lru.remove(&n.lru);
                inner.disk = inner.disk.saturating_sub(n.disk);
                out.push(k);
            }
        }
        let max = self.max_size.load(Ordering::Relaxed);
        let mut evicted = 0u64;
        let mut capped = false;
        while inner.disk > max || before.saturating_sub(inner.disk) < short {
            if evicted >= max_evict {
                capped = true;
                break;
            }
            let Some((_, k)) = inner.lru.pop_first() else {
                break;
            };
            if let Some(n) = inner.nodes.remove(&k) {
                inner.disk = inner.disk.saturating_sub(n.disk);
                out.push(k);
                evicted += 1;
            }
        }
        (out, capped)
    }

    /// Files whose unlink a pass did not reach: the next pass does them.
    fn doom(&self, keys: &[[u8; 16]]) {
        self.lock().doomed.extend_from_slice(keys);
    }

    /// Takes the key's `updating` mark (nginx's node->updating): None when
    /// another request holds it and, with a `lock_age`, has held it for
    /// less than that. The mark goes with the guard.
    pub fn try_update(
        self: &Arc<Zone>,
        md5: &[u8; 16],
        lock_age: Option<Duration>,
    ) -> Option<UpdateGuard> {
        static TOKEN: AtomicU64 = AtomicU64::new(1);
        let now = Instant::now();
        let mut g = self.lock();
        if let Some((_, until)) = g.updating.get(md5) {
            if until.is_none_or(|u| u > now) {
                return None;
            }
        }
        let token = TOKEN.fetch_add(1, Ordering::Relaxed);
        g.updating.insert(*md5, (token, lock_age.map(|a| now + a)));
        Some(UpdateGuard {
            zone: self.clone(),
            md5: *md5,
            token,
        })
    }

    /// Waits until the key's `updating` mark is released or aged
    /// (`proxy_cache_lock_age`), or until `deadline`. True unless the
    /// deadline came first.
    pub async fn wait_update(&self, md5: &[u8; 16], deadline: Instant) -> bool {
        loop {
            let n = self.released.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            let until = match self.lock().updating.get(md5) {
                None => return true,
                Some((_, Some(u))) if *u <= Instant::now() => return true,
                Some((_, u)) => u.map_or(deadline, |u| u.min(deadline)),
            };
            if tokio::time::timeout_at(until.into(), n).await.is_err() && until == deadline {
                return false;
            }
        }
    }

    /// Counts a request for a key not stored yet; returns the count so
    /// far (`proxy_cache_min_uses`). The counts are forgotten when the
    /// table outgrows the zone.
    pub fn count_use(&self, md5: &[u8; 16]) -> u64 {
        let mut g = self.lock();
        if g.uses.len() >= self.max_nodes && !g.uses.contains_key(md5) {
            g.uses.clear();
        }
        let n = g.uses.entry(*md5).or_insert(0);
        *n += 1;
        *n
    }

    fn still_absent(&self, md5: &[u8; 16]) -> bool {
        !self.lock().nodes.contains_key(md5)
    }
}

/// A request's hold on a key's `updating` mark; released when dropped
/// (after the entry was stored, or the fetch failed), waking waiters.
#[derive(Debug)]
pub struct UpdateGuard {
    zone: Arc<Zone>,
    md5: [u8; 16],
    token: u64,
}

impl Drop for UpdateGuard {
    fn drop(&mut self) {
        {
            let mut g = self.zone.lock();
            if g.updating
                .get(&self.md5)
                .is_some_and(|(t, _)| *t == self.token)
            {
                g.updating.remove(&self.md5);
            }
        }
        self.zone.released.notify_waiters();
    }
}

/// `PATH/<levels>/<md5 hex>`: each level takes the next characters from
/// the end of the hex name (nginx's layout).
pub fn entry_path(root: &Path, levels: &[usize], md5: &[u8; 16]) -> PathBuf {
    let name = md5::hex(md5);
    let mut p = root.to_path_buf();
    let mut end = name.len();
    for &l in levels {
        let start = end.saturating_sub(l);
        p.push(&name[start..end]);
        end = start;
    }
    p.push(&name);
    p
}

// ---- zone registry (kept across reloads) -----------------------------------

fn registry() -> MutexGuard<'static, Vec<Weak<Zone>>> {
    static REG: Mutex<Vec<Weak<Zone>>> = Mutex::new(Vec::new());
    REG.lock().unwrap_or_else(|e| e.into_inner())
}

/// The zone for `conf`: the live one with the same name, size, path and
/// levels (a reload keeps its nodes), else a new one, whose loader is
/// queued on the keeper.
pub fn zone(conf: PathConf) -> Arc<Zone> {
    let mut reg = registry();
    reg.retain(|w| w.strong_count() > 0);
    for w in reg.iter() {
        let Some(z) = w.upgrade() else { continue };
        if z.conf.same_zone(&conf) {
            z.set_limits(&conf);
            return z;
        }
    }
    let z = Arc::new(Zone::new(conf));
    reg.push(Arc::downgrade(&z));
    allowed_dirs().insert(z.conf.path.clone());
    send(Msg::Load(Arc::downgrade(&z)));
    z
}

/// Registers a temp directory (`proxy_temp_path`) the keeper may create
/// and hand to the workers' user.
pub fn allow_dir(p: &Path) {
    allowed_dirs().insert(p.to_path_buf());
    // Called while compiling the configuration: the keeper will be
    // needed ([`start_keeper`] starts it on the master thread).
    sender();
}

fn allowed_dirs() -> MutexGuard<'static, HashSet<PathBuf>> {
    static DIRS: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    DIRS.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

// ---- the keeper thread ------------------------------------------------------

enum Msg {
    Load(Weak<Zone>),
    Prepare {
        path: PathBuf,
        uid: u32,
        gid: u32,
        reply: tokio::sync::oneshot::Sender<io::Result<()>>,
    },
}

fn send(m: Msg) {
    let _ = sender().lock().unwrap_or_else(|e| e.into_inner()).send(m);
}

/// The keeper's receiving end until [`start_keeper`] hands it to the
/// thread: messages sent while the configuration is compiled wait here.
static KEEPER_RX: Mutex<Option<mpsc::Receiver<Msg>>> = Mutex::new(None);

/// Set once the master may start threads (after the fork).
static KEEPER_GO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn sender() -> &'static Mutex<mpsc::Sender<Msg>> {
    static TX: OnceLock<Mutex<mpsc::Sender<Msg>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        *KEEPER_RX.lock().unwrap_or_else(|e| e.into_inner()) = Some(rx);
        // First needed by a reload (compiled on the master thread too).
        if KEEPER_GO.load(Ordering::Acquire) {
            spawn_keeper();
        }
        Mutex::new(tx)
    })
}

/// Starts the keeper thread, once, if a configuration asked for it. The
/// master calls this after daemonizing: a thread started before the fork
/// would not exist in the daemon (its requests would wait forever). It
/// runs from the master thread, so it keeps the master's credentials. If
/// the spawn fails the cache still serves; only loading, eviction and
/// temp-directory creation stop.
pub fn start_keeper() {
    KEEPER_GO.store(true, Ordering::Release);
    spawn_keeper();
}

fn spawn_keeper() {
    let Some(rx) = KEEPER_RX.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("tern-cache".into())
        .spawn(move || keeper(rx));
    if let Err(e) = spawned {
        crate::elog!(Alert, "could not start the cache manager thread: {}", e);
    }
}

fn keeper(rx: mpsc::Receiver<Msg>) {
    // Each zone with the time its next manager pass is due.
    let mut zones: Vec<(Weak<Zone>, Instant)> = Vec::new();
    loop {
        let now = Instant::now();
        let wait = zones
            .iter()
            .map(|(_, due)| due.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1));
        match rx.recv_timeout(wait) {
            Ok(Msg::Load(w)) => {
                if let Some(z) = w.upgrade() {
                    spawn_loader(z);
                }
                zones.push((w, Instant::now() + Duration::from_secs(1)));
            }
            Ok(Msg::Prepare {
                path,
                uid,
                gid,
                reply,
            }) => {
                let _ = reply.send(prepare(&path, uid, gid));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        zones.retain(|(w, _)| w.strong_count() > 0);
        for (w, due) in zones.iter_mut() {
            if Instant::now() < *due {
                continue;
            }
            if let Some(z) = w.upgrade() {
                *due = Instant::now() + manager_pass(&z);
            }
        }
    }
}

/// One manager pass on `z`; returns the time until the next.
fn manager_pass(z: &Zone) -> Duration {
    let pace = z.pacing();
    let start = Instant::now();
    // nginx evicts one entry before it counts against manager_files.
    let (keys, capped) = z.manage(z.free_shortfall(), pace.manager_files.max(1));
    let mut cut = capped;
    for (i, k) in keys.iter().enumerate() {
        if start.elapsed() >= pace.manager_threshold {
            z.doom(&keys[i..]);
            cut = true;
            break;
        }
        // Skip a key that came back since it was evicted: its path now
        // holds a fresh entry.
        if z.still_absent(k) {
            let _ = std::fs::remove_file(z.file_path(k));
        }
    }
    if cut {
        pace.manager_sleep
    } else {
        Duration::from_secs(1)
    }
}

/// Runs a new zone's loader on its own thread, so that its pauses hold up
/// neither the manager nor directory creation.
fn spawn_loader(z: Arc<Zone>) {
    let spawned = std::thread::Builder::new()
        .name("tern-cache-load".into())
        .spawn({
            let z = z.clone();
            move || {
                load(&z);
                z.loaded.store(true, Ordering::Release);
            }
        });
    if let Err(e) = spawned {
        crate::elog!(Alert, "could not start the cache loader thread: {}", e);
        load(&z);
        z.loaded.store(true, Ordering::Release);
    }
}

/// Creates `path` and gives it to the workers' user (only for directories
/// the configuration named).
fn prepare(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    if !allowed_dirs().contains(path) {
        return Err(io::Error::from(io::ErrorKind::PermissionDenied));
    }
    std::fs::create_dir_all(path)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Asks the keeper to create `path` for the calling thread's user.
pub async fn prepare_dir(path: &Path) -> io::Result<()> {
    // SAFETY: geteuid/getegid have no preconditions; on Linux they report
    // the calling thread's credentials (the worker's, after its drop).
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (reply, rx) = tokio::sync::oneshot::channel();
    send(Msg::Prepare {
        path: path.to_path_buf(),
        uid,
        gid,
        reply,
    });
    rx.await
        .unwrap_or_else(|_| Err(io::Error::other("cache manager is not running")))
}

/// The loader: adopts complete entries, deletes temp files of dead runs
/// and files that are not valid entries (partial, foreign, misnamed).
fn load(z: &Zone) {
    let pid_mark = format!("{}{}-", TEMP_MARK, std::process::id());
    let mut stack = vec![(z.conf.path.clone(), 0usize)];
    // nginx's loader pacing: a pause after `loader_files` files or
    // `loader_threshold` of work, whichever comes first.
    let mut files = 0u64;
    let mut batch = Instant::now();
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let pace = z.pacing();
            if files >= pace.loader_files || batch.elapsed() >= pace.loader_threshold {
                std::thread::sleep(pace.loader_sleep);
                files = 0;
                batch = Instant::now();
            }
            files += 1;
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            let name = e.file_name().to_string_lossy().into_owned();
            if ft.is_dir() {
                if depth < z.conf.levels.len() {
                    stack.push((p, depth + 1));
                }
                continue;
            }
            if !ft.is_file() {
                continue;
            }
            if name.contains(&pid_mark) {
                // In flight in this very process (a reload made a new zone).
                continue;
            }
            let adopt = md5::unhex(&name)
                .filter(|_| depth == z.conf.levels.len())
                .filter(|k| z.file_path(k) == p)
                .and_then(|k| file::check_file(&p, &k).map(|h| (k, h)));
            match adopt {
                Some((k, (valid_until, disk, main))) => {
                    if z.still_absent(&k) {
                        z.insert(k, valid_until, disk);
                    }
                    if let Some(main) = main {
                        z.add_variant(main, k);
                    }
                }
                None => {
                    crate::elog!(Notice, "cache loader removes \"{}\"", p.display());
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
    }
}

/// Runs a blocking file-system call (mkdir, create, rename, unlink) in the
/// location's pool when it has one, inline otherwise (as nginx, which does
/// these inline, and `aio off` promises).
pub async fn blocking<F, R>(policy: &Policy, f: F) -> io::Result<R>
where
    F: FnOnce() -> io::Result<R> + Send + 'static,
    R: Send + 'static,
{
    match &policy.aio {
        Aio::Threads(p) => p.run(f).await?,
        // io_uring has no mkdir/rename here worth the ring: inline, as with aio off.
        Aio::Uring | Aio::Off => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_levels_layout() {
        let k = md5::digest(b"http://backend/c/k?1");
        assert_eq!(
            entry_path(Path::new("/c"), &[1, 2], &k),
            PathBuf::from("/c/4/24/3fda2c167f54ceac7fefa9687230c244")
        );
        assert_eq!(
            entry_path(Path::new("/c"), &[2], &k),
            PathBuf::from("/c/44/3fda2c167f54ceac7fefa9687230c244")
        );
        assert_eq!(
            entry_path(Path::new("/c"), &[], &k),
            PathBuf::from("/c/3fda2c167f54ceac7fefa9687230c244")
        );
    }

    fn test_zone(max_size: Option<u64>, size: usize) -> Zone {
        Zone::new(PathConf {
            path: "/nonexistent".into(),
            levels: vec![1, 2],
            name: "t".into(),
            size,
            max_size,
            inactive_secs: 600,
            min_free: 0,
            pacing: Pacing::default(),
        })
    }

    #[test]
    fn lru_eviction_over_max_size() {
        let z = test_zone(Some(250), 1 << 20);
        let k = |i: u8| [i; 16];
        z.insert(k(1), 0, 100);
        z.insert(k(2), 0, 100);
        assert!(z.touch(&k(1)).is_some());
        z.insert(k(3), 0, 100);
        // 300 > 250: the least recently used (2) goes.
        assert_eq!(z.manage(0, u64::MAX).0, vec![k(2)]);
        assert!(z.touch(&k(2)).is_none());
        assert_eq!(z.disk_size(), 200);
    }

    #[test]
    fn full_keys_zone_evicts_lru() {
        let z = test_zone(None, 1024);
        for i in 0..9u8 {
            z.insert([i; 16], 0, 1);
        }
        assert_eq!(z.len(), 8);
        assert!(z.touch(&[0; 16]).is_none());
        assert_eq!(z.manage(0, u64::MAX).0, vec![[0; 16]]);
    }

    #[test]
    fn manager_files_caps_evictions_per_pass() {
        let z = test_zone(Some(100), 1 << 20);
        for i in 0..5u8 {
            z.insert([i; 16], 0, 100);
        }
        // 500 > 100: four must go, two per pass.
        assert_eq!(z.manage(0, 2), (vec![[0; 16], [1; 16]], true));
        // The cap reached exactly when nothing is left to do: not cut short.
        assert_eq!(z.manage(0, 2), (vec![[2; 16], [3; 16]], false));
        assert_eq!(z.manage(0, 2), (vec![], false));
        // Unlinks a pass did not reach come first in the next one.
        z.doom(&[[9; 16]]);
        assert_eq!(z.manage(0, 2), (vec![[9; 16]], false));
    }

    #[test]
    fn free_space_shortfall_evicts_lru_entries_covering_it() {
        let z = test_zone(None, 1 << 20);
        let k = |i: u8| [i; 16];
        for i in 1..=4 {
            z.insert(k(i), 0, 100);
        }
        assert!(z.touch(&k(1)).is_some());
        // 150 bytes short: the two least recently used (2, 3) go.
        assert_eq!(z.manage(150, u64::MAX).0, vec![k(2), k(3)]);
        assert_eq!(z.len(), 2);
        assert_eq!(z.manage(0, u64::MAX).0, Vec::<[u8; 16]>::new());
        // More short than the cache holds: all of it goes.
        assert_eq!(z.manage(u64::MAX, u64::MAX).0, vec![k(4), k(1)]);
        assert!(z.is_empty());
    }
}
