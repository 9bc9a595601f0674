//! `compress_cache*` (tern's own, no nginx counterpart): a process-wide
//! cache of the compressed forms of static files, so that a file asked for
//! by many clients is compressed once, not once per request as nginx's gzip
//! filter does.
//!
//! Data flow: the static handler opens a file and builds its 200
//! ([`super::static_file::file_response`]); [`apply`] then asks whether the
//! on-the-fly compressor would encode this response for this client (the
//! same decision as the gzip header filter: [`super::gzip::candidate`] and
//! [`super::gzip::gzip_ok`]). If so, the compressed bytes are looked up by
//! the file's identity, `(dev, inode, size, mtime, ctime)` with nanoseconds,
//! plus the encoding and level. A file edited in place changes its ctime
//! (even when the writer puts size and mtime back), a file replaced by
//! rename changes its inode, so neither can be answered from a stale copy.
//!
//! A miss compresses off the event loop: the file is read and compressed
//! whole (libdeflate, [`super::gzip::gzip_whole`]; brotli,
//! [`super::brotli::compress_whole`]) on a file-I/O pool
//! thread (the location's `aio threads` pool, else `default`). The entry
//! is a once-cell: requests that arrive while it is being made wait for
//! that one compression instead of starting their own.
//!
//! The response then goes out as a `gzip_static` file would: the original's
//! type and Last-Modified, `Content-Encoding`, `Content-Length` of the
//! compressed form, no byte ranges (as nginx 1.22.1's gzip_static), and the ETag weakened as nginx's gzip
//! filter weakens it. `$gzip_ratio` is the entry's ratio. A hit copies
//! nothing: an entry of up to 4 KiB is its own response body
//! ([`Body::Shared`], written with the head in one `writev`), a larger one
//! is kept in an anonymous in-memory file (`memfd_create`) and sent with
//! sendfile, as gzip_static sends its `.gz` ([`Form`]).
//!
//! Memory: entries live in memory within `compress_cache_max_size`, least
//! recently used evicted first. With `compress_cache_path`, an evicted
//! entry is written to a file in that directory (by a pool thread) and
//! later hits are sent from it with sendfile; spilled files are bounded by
//! `max_size=` (default eight times the memory budget) and removed when
//! evicted. The directory should be tern's alone: names are the entries'
//! keys, and files left by an earlier run are not reused. Workers write it
//! as the `user` they run as, so it must be writable by that user; a
//! failed write is logged at `crit` and the entry dropped.
//!
//! Counters ([`STATS`]) go to `tern_metrics`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::config::registry::{arg, ctx, flag, set_once, Args, Setter, Spec};
use crate::config::{value, ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::http::conf::{HttpMain, LocConf};
use crate::http::phases::Ctx;
use crate::http::request::Method;
use crate::http::response::{Body, Response};
use crate::io::OpenFile;

/// Default memory budget: modest, a few hundred typical pages and scripts.
pub const DEFAULT_MAX_SIZE: u64 = 32 * 1024 * 1024;

/// A file is cached only if it is at most this fraction of the budget
/// (a larger one streams through the compressor as without the cache).
const MAX_ENTRY_SHARE: u64 = 8;

#[derive(Debug, Clone, Default)]
pub struct CompressCacheLoc {
    pub enable: Option<bool>,
}

impl CompressCacheLoc {
    pub fn merge(&mut self, p: &CompressCacheLoc) {
        if self.enable.is_none() {
            self.enable = p.enable;
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct CompressCacheMain {
    pub max_size: Option<u64>,
    pub path: Option<PathBuf>,
    /// `compress_cache_path PATH max_size=SIZE`: bound on spilled files
    /// (default eight times the memory budget).
    pub disk_max_size: Option<u64>,
}

fn set_enable(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.compress_cache.enable, flag(d)?, d)
}

fn set_max_size(m: &mut HttpMain, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = value::size(arg(d, 0))
        .ok_or_else(|| ConfError::at(format!("\"{}\" directive invalid value", d.name), d))?;
    set_once(&mut m.modules.compress_cache.max_size, v, d)
}

fn set_path(m: &mut HttpMain, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    // Relative to the prefix, as nginx's paths are.
    let p = crate::core::conf::prefix_path(cx, arg(d, 0));
    for a in d.args.iter().skip(1) {
        let v = a
            .value
            .strip_prefix("max_size=")
            .and_then(value::size)
            .ok_or_else(|| ConfError::at(format!("invalid parameter \"{}\"", a.value), d))?;
        m.modules.compress_cache.disk_max_size = Some(v);
    }
    set_once(&mut m.modules.compress_cache.path, p, d)
}

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "compress_cache",
        ctx: ctx::HSL | ctx::LIF,
        args: Args::Flag,
        set: Setter::Loc(set_enable),
    },
    Spec {
        name: "compress_cache_max_size",
        ctx: ctx::HTTP,
        args: Args::take(1),
        set: Setter::HttpMain(set_max_size),
    },
    Spec {
        name: "compress_cache_path",
        ctx: ctx::HTTP,
        args: Args::take12(),
        set: Setter::HttpMain(set_path),
    },
];

/// A content coding the cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Coding {
    Gzip,
    Br,
    Zstd,
}

impl Coding {
    pub fn token(self) -> &'static [u8] {
        match self {
            Coding::Gzip => b"gzip",
            Coding::Br => b"br",
            Coding::Zstd => b"zstd",
        }
    }

    /// `level` is gzip's level, or brotli's quality with its maximum
    /// window bits above bit 8.
    fn encode(self, level: u32, data: &[u8]) -> std::io::Result<Vec<u8>> {
        match self {
            Coding::Gzip => {
                let mut out = Vec::with_capacity(data.len() / 3 + 64);
                super::gzip::gzip_whole(level, data, &mut out)?;
                Ok(out)
            }
            Coding::Br => super::brotli::compress_whole(level & 0xff, level >> 8, data),
            // The level as its bits (zstd's fast levels are negative).
            Coding::Zstd => super::zstd::compress_whole(level as i32, data),
        }
    }
}

/// A file's identity and the form asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    coding: Coding,
    level: u32,
}

impl Key {
    fn of(m: &crate::io::Meta, coding: Coding, level: u32) -> Key {
        Key {
            dev: m.dev,
            ino: m.ino,
            size: m.size,
            mtime: (m.mtime, m.mtime_nsec),
            ctime: (m.ctime, m.ctime_nsec),
            coding,
            level,
        }
    }

    fn file_name(&self) -> String {
        format!(
            "{:x}-{:x}-{:x}-{:x}.{:x}-{:x}.{:x}-{}{}",
            self.dev,
            self.ino,
            self.size,
            self.mtime.0,
            self.mtime.1,
            self.ctime.0,
            self.ctime.1,
            String::from_utf8_lossy(self.coding.token()),
            self.level
        )
    }
}

/// Compressed forms above this size are kept in an in-memory file
/// (`memfd_create`) and sent with sendfile, as `gzip_static` sends its
/// `.gz`: the same size above which HTTP/1.1 sends any file with sendfile
/// rather than a copy ([`crate::io::SMALL_CONTENT_MAX`]). Measured on a
/// 256 KiB page (87 KB at level 6, BENCHMARKS.md): a `writev` of the
/// bytes cost ~25 µs of CPU per request more than gzip_static's sendfile.
const FILE_MIN: usize = crate::io::SMALL_CONTENT_MAX as usize;

/// At most this share of the descriptor limit is held by in-memory
/// files; past it, entries stay plain bytes (served with a copy), so
/// the cache never starves `accept` of descriptors.
const FD_SHARE: u64 = 8;

/// A compressed form held in memory.
#[derive(Debug, Clone)]
enum Form {
    /// Sent from the buffer itself, with the head in one write.
    Bytes(Bytes),
    /// An in-memory file, sent with sendfile.
    File(Arc<OpenFile>),
}

impl Form {
    fn len(&self) -> u64 {
        match self {
            Form::Bytes(b) => b.len() as u64,
            Form::File(f) => f.meta.size,
        }
    }

    /// `v` as an in-memory file when it is large enough and `file_ok`,
    /// else as bytes (also when the file cannot be made).
    fn of(v: Vec<u8>, file_ok: bool) -> Form {
        if file_ok && v.len() > FILE_MIN {
            if let Ok(f) = OpenFile::in_memory(c"tern-compress-cache", &v) {
                return Form::File(Arc::new(f));
            }
        }
        Form::Bytes(Bytes::from(v))
    }

    /// The bytes, for a spill file (blocking: a pool thread's).
    fn contents(&self) -> std::io::Result<Vec<u8>> {
        match self {
            Form::Bytes(b) => Ok(b.to_vec()),
            Form::File(f) => {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0; usize::try_from(f.meta.size).unwrap_or(0)];
                f.file.read_exact_at(&mut buf, 0)?;
                Ok(buf)
            }
        }
    }
}

/// The compressed form, where it is kept.
#[derive(Debug)]
enum Stored {
    Memory(Form),
    /// Spilled: the file in `compress_cache_path`, and its length.
    Disk(PathBuf, u64),
}

type Cell = Arc<tokio::sync::OnceCell<Option<Form>>>;

struct Entry {
    /// Filled once by the first request's compression (None: it failed).
    cell: Cell,
    stored: Option<Stored>,
    /// Last use, in the cache's own clock (LRU).
    used: u64,
}

#[derive(Default)]
struct Cache {
    map: HashMap<Key, Entry>,
    /// Bytes held in memory.
    bytes: u64,
    /// Entries held as in-memory files (each one a descriptor).
    files: u64,
    /// Bytes of spilled files.
    disk_bytes: u64,
    clock: u64,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

/// The counters `tern_metrics` exports.
#[derive(Debug, Default)]
pub struct Stats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    /// Bytes of original content that hits did not compress again.
    pub saved_bytes: AtomicU64,
    /// Bytes hits did not send (original minus compressed size).
    pub saved_sent_bytes: AtomicU64,
    pub memory_bytes: AtomicU64,
    pub disk_bytes: AtomicU64,
    pub spilled: AtomicU64,
}

pub static STATS: Stats = Stats {
    hits: AtomicU64::new(0),
    misses: AtomicU64::new(0),
    evictions: AtomicU64::new(0),
    saved_bytes: AtomicU64::new(0),
    saved_sent_bytes: AtomicU64::new(0),
    memory_bytes: AtomicU64::new(0),
    disk_bytes: AtomicU64::new(0),
    spilled: AtomicU64::new(0),
};

fn with_cache<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    let mut g = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Cache::default))
}

/// The form of a cached file a hit serves.
enum Found {
    Memory(Form),
    Disk(PathBuf, u64),
}

/// Swaps the body of `r` (a 200 for the whole of a regular file) for its
/// cached compressed form when the gzip filter would compress it for this
/// client and the cache is on (true). Leaves `r` as it was otherwise
/// (including on any failure: the filter then compresses the file as it
/// streams).
/// Whether a filter that changes the body (SSI, sub_filter, addition,
/// charset recoding) may run before the compression: then the file's own
/// bytes are not what gets compressed, and the cache stays out of it.
fn body_filtered(cx: &Ctx<'_>) -> bool {
    let m = &cx.loc.modules;
    m.ssi.enable == Some(true)
        || m.sub_filter.pairs.is_some()
        || m.addition.before.as_ref().is_some_and(|u| !u.is_empty())
        || m.addition.after.as_ref().is_some_and(|u| !u.is_empty())
        || m.charset.source.is_some()
}

pub async fn apply(cx: &mut Ctx<'_>, r: &mut Response) -> bool {
    if !cx.loc.modules.compress_cache.enable.unwrap_or(true)
        || !matches!(cx.req.method, Method::Get | Method::Head)
        || body_filtered(cx)
    {
        return false;
    }
    let file = match &r.body {
        Body::File {
            file,
            offset: 0,
            len,
        } if *len == file.meta.size && *len > 0 => file.clone(),
        _ => return false,
    };
    let main = &cx.http.main.modules.compress_cache;
    let budget = main.max_size.unwrap_or(DEFAULT_MAX_SIZE);
    if budget == 0 || file.meta.size > budget / MAX_ENTRY_SHARE {
        return false;
    }
    // The filters' own decisions, in their order: brotli, zstd, gzip.
    // From a candidate on, the answer depends on Accept-Encoding, whoever
    // gets it (Vary).
    let (coding, level) = if super::brotli::candidate(cx, r) && {
        super::gzip::mark_vary(cx);
        super::brotli::client_ok(cx)
    } {
        let b = &cx.loc.modules.brotli;
        let bits = b.window_bits.unwrap_or(19);
        (Coding::Br, b.comp_level.unwrap_or(6) | bits << 8)
    } else if super::zstd::candidate(cx, r) && {
        super::gzip::mark_vary(cx);
        super::zstd::client_ok(cx)
    } {
        let l = cx.loc.modules.zstd.comp_level.unwrap_or(1);
        (Coding::Zstd, l as u32)
    } else if super::gzip::candidate(cx, r) && {
        super::gzip::mark_vary(cx);
        super::gzip::gzip_ok(cx, r)
    } {
        (Coding::Gzip, cx.loc.modules.gzip.comp_level.unwrap_or(1))
    } else {
        return false;
    };
    let key = Key::of(&file.meta, coding, level);
    let spill = main
        .path
        .clone()
        .map(|p| (p, main.disk_max_size.unwrap_or(budget * 8)));
    let Some(found) = lookup(cx, key, file.clone(), budget, spill).await else {
        return false;
    };
    let size = file.meta.size;
    let (len, body) = match found {
        // The entry itself, shared: nothing is copied before the socket.
        Found::Memory(Form::Bytes(b)) => (b.len() as u64, Body::Shared(b)),
        Found::Memory(Form::File(f)) => {
            let len = f.meta.size;
            (
                len,
                Body::File {
                    file: f,
                    offset: 0,
                    len,
                },
            )
        }
        Found::Disk(path, len) => {
            let policy = r.io.clone().unwrap_or_default();
            match crate::io::open(&path, &policy).await {
                Ok(f) if f.meta.size == len => (
                    len,
                    Body::File {
                        file: f,
                        offset: 0,
                        len,
                    },
                ),
                _ => return false,
            }
        }
    };
    let ratio = Arc::new(super::gzip::Ratio::default());
    ratio.set(size, len);
    match coding {
        Coding::Gzip => cx.guards.push(Box::new(ratio)),
        Coding::Br => cx.guards.push(Box::new(super::brotli::BrRatio::new(ratio))),
        Coding::Zstd => cx.guards.push(Box::new(super::zstd::ZstdRatio::new(ratio))),
    }
    r.headers
        .push(("Content-Encoding".into(), coding.token().to_vec()));
    r.content_length = Some(len);
    r.body = body;
    super::gzip::weaken_etag(r);
    // As gzip_static in nginx 1.22.1: no byte ranges of the compressed form.
    r.ranges_off = true;
    true
}

/// The compressed form for `key`: from the cache, or made now (once,
/// whoever else asks meanwhile). None when it cannot be made.
async fn lookup(
    cx: &Ctx<'_>,
    key: Key,
    file: Arc<OpenFile>,
    budget: u64,
    spill: Option<(PathBuf, u64)>,
) -> Option<Found> {
    let (cell, disk) = with_cache(|c| {
        c.clock += 1;
        let now = c.clock;
        let e = c.map.entry(key).or_insert_with(|| Entry {
            cell: Arc::default(),
            stored: None,
            used: now,
        });
        e.used = now;
        let disk = match &e.stored {
            Some(Stored::Disk(p, n)) => Some((p.clone(), *n)),
            _ => None,
        };
        (e.cell.clone(), disk)
    });
    if let Some((p, n)) = disk {
        count_hit(key.size, n);
        return Some(Found::Disk(p, n));
    }
    if let Some(v) = cell.get() {
        let v = v.clone()?;
        count_hit(key.size, v.len());
        return Some(Found::Memory(v));
    }
    let pool = match cx.io_policy().ok().map(|p| p.aio.clone()) {
        Some(crate::io::Aio::Threads(p)) => Some(p),
        _ => None,
    }
    .or_else(|| cx.shared.pools.load().get(crate::io::DEFAULT_POOL))?;
    let mut made = false;
    let v = cell
        .get_or_init(|| async {
            made = true;
            STATS.misses.fetch_add(1, Ordering::Relaxed);
            let file_ok = with_cache(|c| c.files < fd_budget());
            let job = move || -> Option<Form> {
                let data = read_whole(&file)?;
                let v = key.coding.encode(key.level, &data).ok()?;
                Some(Form::of(v, file_ok))
            };
            pool.run(job).await.ok().flatten()
        })
        .await
        .clone();
    if !made {
        // Waited for another request's compression.
        if let Some(v) = &v {
            count_hit(key.size, v.len());
        }
    }
    match &v {
        Some(v) if made => admit(key, v.clone(), budget, spill, &pool),
        None if made => {
            with_cache(|c| {
                c.map.remove(&key);
            });
        }
        _ => {}
    }
    v.map(Found::Memory)
}

/// How many entries may be in-memory files: a share of this process's
/// descriptor limit (read once).
fn fd_budget() -> u64 {
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| crate::io::nofile_limit().unwrap_or(1024) / FD_SHARE)
}

fn count_hit(size: u64, len: u64) {
    STATS.hits.fetch_add(1, Ordering::Relaxed);
    STATS.saved_bytes.fetch_add(size, Ordering::Relaxed);
    STATS
        .saved_sent_bytes
        .fetch_add(size.saturating_sub(len), Ordering::Relaxed);
}

/// The whole content of `f` as opened (blocking: runs on a pool thread).
/// None if it shrank meanwhile.
fn read_whole(f: &OpenFile) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let n = usize::try_from(f.meta.size).ok()?;
    let mut buf = vec![0; n];
    f.file.read_exact_at(&mut buf, 0).ok()?;
    Some(buf)
}

/// Accounts a new entry and evicts the least recently used ones while
/// the memory held is over budget (spilling them when a path is set).
fn admit(
    key: Key,
    v: Form,
    budget: u64,
    spill: Option<(PathBuf, u64)>,
    pool: &Arc<crate::io::ThreadPool>,
) {
    let evicted = with_cache(|c| {
        let Some(e) = c.map.get_mut(&key) else {
            return Vec::new();
        };
        let n = v.len();
        if matches!(v, Form::File(_)) {
            c.files += 1;
        }
        e.stored = Some(Stored::Memory(v));
        c.bytes += n;
        let mut out = Vec::new();
        while c.bytes > budget {
            let victim = c
                .map
                .iter()
                .filter(|(_, e)| matches!(e.stored, Some(Stored::Memory(_))))
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| *k);
            let Some(k) = victim else { break };
            let Some(e) = c.map.remove(&k) else { break };
            if let Some(Stored::Memory(b)) = e.stored {
                c.bytes -= b.len();
                if matches!(b, Form::File(_)) {
                    c.files = c.files.saturating_sub(1);
                }
                out.push((k, b));
            }
            STATS.evictions.fetch_add(1, Ordering::Relaxed);
        }
        STATS.memory_bytes.store(c.bytes, Ordering::Relaxed);
        out
    });
    let Some((dir, disk_max)) = spill else { return };
    for (k, b) in evicted {
        let path = dir.join(k.file_name());
        let len = b.len();
        let pool2 = pool.clone();
        // Written by a pool thread; the entry comes back (as a disk one)
        // only once the file is complete under its final name.
        let p2 = path.clone();
        let write = move || -> std::io::Result<()> {
            let tmp = p2.with_extension("tmp");
            std::fs::write(&tmp, b.contents()?)?;
            std::fs::rename(&tmp, &p2)
        };
        tokio::task::spawn_local(async move {
            match pool2.run(write).await {
                Ok(Ok(())) => {}
                // A full pool queue is logged by the pool; the entry is
                // just dropped, as without a spill directory.
                Err(_) => return,
                Ok(Err(e)) => {
                    // nginx's wording for a failed temp-file write.
                    crate::elog!(
                        Crit,
                        "open() \"{}\" failed ({}: {})",
                        path.with_extension("tmp").display(),
                        e.raw_os_error().unwrap_or(0),
                        crate::core::strerror_text(e.raw_os_error().unwrap_or(0))
                    );
                    return;
                }
            }
            let dropped = with_cache(|c| {
                c.clock += 1;
                let now = c.clock;
                if c.map.contains_key(&k) {
                    // Made again meanwhile: the memory copy wins.
                    return vec![path];
                }
                c.map.insert(
                    k,
                    Entry {
                        cell: Arc::default(),
                        stored: Some(Stored::Disk(path, len)),
                        used: now,
                    },
                );
                c.disk_bytes += len;
                let mut out = Vec::new();
                while c.disk_bytes > disk_max {
                    let victim = c
                        .map
                        .iter()
                        .filter(|(_, e)| matches!(e.stored, Some(Stored::Disk(..))))
                        .min_by_key(|(_, e)| e.used)
                        .map(|(k, _)| *k);
                    let Some(v) = victim else { break };
                    if let Some(Entry {
                        stored: Some(Stored::Disk(p, n)),
                        ..
                    }) = c.map.remove(&v)
                    {
                        c.disk_bytes -= n;
                        out.push(p);
                    }
                    STATS.evictions.fetch_add(1, Ordering::Relaxed);
                }
                STATS.disk_bytes.store(c.disk_bytes, Ordering::Relaxed);
                out
            });
            STATS.spilled.fetch_add(1, Ordering::Relaxed);
            if !dropped.is_empty() {
                // A client still sending one of these keeps its open
                // descriptor; the name goes now.
                let _ = pool2
                    .run(move || {
                        for p in dropped {
                            let _ = std::fs::remove_file(p);
                        }
                    })
                    .await;
            }
        });
    }
}

/// Empties the cache (all entries, memory and spilled files' index).
pub fn clear() {
    with_cache(|c| {
        c.map.clear();
        c.bytes = 0;
        c.files = 0;
        c.disk_bytes = 0;
    });
    STATS.memory_bytes.store(0, Ordering::Relaxed);
}
