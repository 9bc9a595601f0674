//! The file operations the HTTP engine calls, each deciding per call
//! whether to run inline on the event loop or in a thread pool.
//!
//! | op | `aio off` | `aio threads` | `aio on` (io_uring) |
//! |----|-----------|---------------|---------------------|
//! | [`open`] | inline | `openat2(RESOLVE_CACHED)` inline; EAGAIN (path not in the dentry cache) -> pool | same, EAGAIN -> `IORING_OP_OPENAT` |
//! | [`stat`], [`lstat`] | inline | as [`open`] | `RESOLVE_CACHED` inline; EAGAIN -> inline (rare: the open-file cache is in front) |
//! | [`read`] | inline `pread` | `preadv2(RWF_NOWAIT)` inline; EAGAIN or short -> the rest in the pool | same, the rest with `IORING_OP_READ` (buffered) |
//! | [`read`] with `directio` | inline (blocking, as configured) | pool | aligned middle `IORING_OP_READ` on the O_DIRECT fd; head/tail buffered (inline when resident) |
//! | [`send_file`] | inline `sendfile` | per chunk: resident (`cachestat`, else [`resident::probe`]) -> inline; cold -> pool warms the range, then inline | cold -> the ring warms the range, then inline |
//! | [`write_at`] | inline | pool if `aio_write on`, else inline | `IORING_OP_WRITE` if `aio_write on` |
//!
//! When the kernel has no io_uring, `aio on` is `aio threads` on the
//! `default` pool, with a notice in the error log (once).

use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use std::time::Duration;

use bytes::Bytes;

use super::conf::{AioConf, IoLoc, DEFAULT_POOL};
use super::pool::{IoError, Pools, ThreadPool};
use super::resident;
use super::stats::{bump, Decision, DecisionCell, STATS};
use super::sys::{self, Nowait, Residency};
use super::uring;

/// The resolved `aio` mode of one request.
#[derive(Debug, Clone)]
pub enum Aio {
    /// Everything inline (nginx's default).
    Off,
    /// `aio threads[=NAME]`: inline when the data is resident, this pool otherwise.
    Threads(Arc<ThreadPool>),
    /// `aio on`: inline when the data is resident, io_uring otherwise
    /// (only built when [`uring::available`]; else `Threads(default)`).
    Uring,
}

/// What the HTTP side passes to every call: the location's I/O settings,
/// resolved. It also accumulates the heaviest [`Decision`] taken under it
/// (read it with [`Policy::decision`] for `$tern_io`).
#[derive(Debug)]
pub struct Policy {
    pub aio: Aio,
    pub aio_write: bool,
    /// `directio` threshold: files at least this big are read with O_DIRECT.
    pub directio: Option<u64>,
    pub directio_alignment: u64,
    /// 0 = unlimited.
    pub sendfile_max_chunk: u64,
    /// With a pool: send opens/stats whose path is not in the dentry cache
    /// to the pool (default true). When the kernel cannot tell
    /// (no `RESOLVE_CACHED`, Linux < 5.12) they run inline: the open-file
    /// cache in front makes misses rare, and offloading every open would
    /// cost a hand-off on each request.
    pub offload_cold_open: bool,
    /// `read_ahead` set (non-zero): files over [`READ_AHEAD_MIN`] are
    /// opened with `POSIX_FADV_SEQUENTIAL`, as nginx does on Linux (which
    /// ignores the size).
    pub read_ahead: bool,
    decision: DecisionCell,
}

/// nginx's `NGX_MIN_READ_AHEAD`: smaller files get no read-ahead advice.
pub const READ_AHEAD_MIN: u64 = 128 * 1024;

impl Clone for Policy {
    fn clone(&self) -> Policy {
        let p = Policy {
            aio: self.aio.clone(),
            aio_write: self.aio_write,
            directio: self.directio,
            directio_alignment: self.directio_alignment,
            sendfile_max_chunk: self.sendfile_max_chunk,
            offload_cold_open: self.offload_cold_open,
            read_ahead: self.read_ahead,
            decision: DecisionCell::default(),
        };
        p.decision.record(self.decision.get());
        p
    }
}

impl Default for Policy {
    fn default() -> Policy {
        Policy::new(Aio::Off)
    }
}

/// Logged once (notice) when `aio on` first falls back to a pool.
pub const URING_FALLBACK_NOTICE: &str =
    "io_uring is not available, \"aio on\" uses thread pool \"default\"";
static URING_NOTICE_PENDING: AtomicBool = AtomicBool::new(true);

/// The notice to log (once per process) when `aio on` falls back to a pool.
pub fn take_uring_notice() -> Option<&'static str> {
    URING_NOTICE_PENDING
        .swap(false, Ordering::Relaxed)
        .then_some(URING_FALLBACK_NOTICE)
}

impl Policy {
    /// Defaults of every directive, with the given `aio`.
    pub fn new(aio: Aio) -> Policy {
        let d = IoLoc::default();
        Policy {
            aio,
            aio_write: d.aio_write(),
            directio: d.directio(),
            directio_alignment: d.directio_alignment(),
            sendfile_max_chunk: d.sendfile_max_chunk(),
            offload_cold_open: true,
            read_ahead: d.read_ahead() > 0,
            decision: DecisionCell::default(),
        }
    }

    /// Builds the policy of a merged location. `pool_name` is the
    /// `aio threads=NAME` name with variables already expanded (ignored
    /// unless the location has `aio threads=...`).
    pub fn from_loc(
        loc: &IoLoc,
        pools: &Pools,
        pool_name: Option<&str>,
    ) -> Result<Policy, IoError> {
        let aio = match loc.aio() {
            AioConf::Off => Aio::Off,
            AioConf::On if uring::available() => Aio::Uring,
            AioConf::On => {
                bump(&STATS.uring_fallbacks);
                if let Some(n) = take_uring_notice() {
                    crate::elog!(Notice, "{}", n);
                }
                Aio::Threads(pools.resolve(DEFAULT_POOL)?)
            }
            AioConf::Threads { pool, .. } => {
                let name = pool_name.or(pool.as_deref()).unwrap_or(DEFAULT_POOL);
                Aio::Threads(pools.resolve(name)?)
            }
        };
        Ok(Policy {
            aio,
            aio_write: loc.aio_write(),
            directio: loc.directio(),
            directio_alignment: loc.directio_alignment(),
            sendfile_max_chunk: loc.sendfile_max_chunk(),
            offload_cold_open: true,
            read_ahead: loc.read_ahead() > 0,
            decision: DecisionCell::default(),
        })
    }

    /// The heaviest decision taken under this policy so far.
    pub fn decision(&self) -> Decision {
        self.decision.get()
    }

    pub fn reset_decision(&self) {
        self.decision.reset();
    }

    /// The pool to offload to, if any.
    fn pool(&self) -> Option<&Arc<ThreadPool>> {
        match &self.aio {
            Aio::Threads(p) => Some(p),
            Aio::Off | Aio::Uring => None,
        }
    }

    fn uring(&self) -> bool {
        matches!(self.aio, Aio::Uring)
    }

    pub(super) fn inline(&self) {
        self.decision.record(Decision::Inline);
    }

    fn offload(&self) {
        self.decision.record(Decision::Offload);
    }

    fn submitted(&self) {
        self.decision.record(Decision::Uring);
    }

    /// The per-request line logged at `debug` level when the policy is
    /// dropped: `tern io: inline|offload|uring [pool "NAME"]`.
    pub fn describe(&self) -> String {
        match &self.aio {
            Aio::Threads(p) => format!("tern io: {} pool \"{}\"", self.decision(), p.name()),
            Aio::Uring => format!("tern io: {} (aio on)", self.decision()),
            Aio::Off => format!("tern io: {}", self.decision()),
        }
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        // Asked first without loading the logger: this runs for every
        // request, and debug lines are seldom on.
        if self.decision() != Decision::None
            && crate::core::log::main_enabled(crate::core::log::Level::Debug)
        {
            let log = crate::core::log::main_logger();
            if log.enabled(crate::core::log::Level::Debug) {
                log.log(
                    crate::core::log::Level::Debug,
                    None,
                    format_args!("{}", self.describe()),
                );
            }
        }
    }
}

/// File attributes, from `fstat`/`stat`/`lstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: i64,
    /// Status-change time: moves on every write even when the writer puts
    /// the old mtime back, so an unchanged (ino, size, mtime, ctime) means
    /// unchanged content for the open-file cache's content copy.
    pub ctime: i64,
    pub ctime_nsec: i64,
    pub ino: u64,
    pub dev: u64,
    pub mode: u32,
    pub uid: u32,
    pub is_dir: bool,
    pub is_file: bool,
    pub is_symlink: bool,
}

/// An open file with the attributes taken right after opening it.
#[derive(Debug)]
pub struct OpenFile {
    pub file: File,
    /// Its `fstat` right after opening.
    pub meta: Meta,
    /// A second open file description with O_DIRECT, made on first directio read.
    direct: OnceLock<Option<File>>,
    /// Set by the open-file cache when it keeps this descriptor: then the
    /// whole content of a small file is kept after its first full read.
    keep_content: AtomicBool,
    /// That content ([`SMALL_CONTENT_MAX`] bytes at most). The attributes
    /// above and this copy come from the same open file and are replaced
    /// together (a changed file gets a new `OpenFile`), so a response never
    /// mixes an old length with new bytes.
    content: OnceLock<Bytes>,
    /// Until when (`sys::coarse_ms`) the whole file counts as resident
    /// without asking the kernel again; see [`RESIDENT_MEMO_MS`].
    resident_until_ms: AtomicU64,
}

/// How long a file that `send_file` found wholly resident is sent again
/// without a residency check. The check is not free where `cachestat(2)`
/// refuses (a worker that neither owns nor may write the file, the usual
/// deployment): the probe then copies the range with `RWF_NOWAIT`, a
/// 16 KiB copy per 16 KiB response. Pages that `sendfile` read within
/// the last fraction of a second are at the hot end of the page cache's
/// LRU; reclaim takes them only under pressure that stalls everything
/// else too, so this costs no measurable risk of a blocking send.
const RESIDENT_MEMO_MS: u64 = 200;

/// Largest file whose content the open-file cache keeps in memory: the
/// size the HTTP engine sends with one `writev` instead of `sendfile`.
pub const SMALL_CONTENT_MAX: u64 = 4 * 1024;

/// Bound on all kept contents together (a cache of 200,000 entries must
/// not turn into 800 MiB of copies).
const SMALL_CONTENT_BUDGET: usize = 64 << 20;

/// Bytes of content kept now, across all open-file caches.
static SMALL_CONTENT_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for OpenFile {
    fn drop(&mut self) {
        if let Some(b) = self.content.get() {
            SMALL_CONTENT_BYTES.fetch_sub(b.len(), Ordering::Relaxed);
        }
    }
}

impl Meta {
    /// `fstat` of an open file. std's `File::metadata` asks `statx` for
    /// every field (birth time, mount id); measured on the 1 KiB path at
    /// ~0.5 µs per call against ~0.03 µs for `fstat`.
    pub fn of_file(file: &File) -> io::Result<Meta> {
        sys::fstat(file).map(|st| Meta::of_stat(&st))
    }

    /// The attributes in a `struct stat`.
    pub(super) fn of_stat(st: &libc::stat) -> Meta {
        let fmt = st.st_mode & libc::S_IFMT;
        Meta {
            size: st.st_size as u64,
            mtime: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec,
            ctime: st.st_ctime,
            ctime_nsec: st.st_ctime_nsec,
            ino: st.st_ino,
            dev: st.st_dev,
            mode: st.st_mode,
            uid: st.st_uid,
            is_dir: fmt == libc::S_IFDIR,
            is_file: fmt == libc::S_IFREG,
            is_symlink: fmt == libc::S_IFLNK,
        }
    }
}

impl OpenFile {
    pub(super) fn new(file: File) -> io::Result<OpenFile> {
        let meta = Meta::of_file(&file)?;
        Ok(OpenFile {
            file,
            meta,
            direct: OnceLock::new(),
            keep_content: AtomicBool::new(false),
            content: OnceLock::new(),
            resident_until_ms: AtomicU64::new(0),
        })
    }

    /// Whether `m`, a later `stat` of the path this file was opened by,
    /// shows this very file (dev, inode) with the size, mtime and ctime
    /// it had when opened. The callers that keep descriptors (the
    /// open-file cache, `reuse.rs`) reuse one only then.
    pub fn unchanged_by(&self, m: &Meta) -> bool {
        let o = &self.meta;
        m.dev == o.dev
            && m.ino == o.ino
            && m.size == o.size
            && m.mtime == o.mtime
            && m.mtime_nsec == o.mtime_nsec
            && m.ctime == o.ctime
            && m.ctime_nsec == o.ctime_nsec
    }

    /// Called by the open-file cache for a descriptor it keeps: small
    /// contents read from now on are kept with it.
    pub fn keep_content(&self) {
        if !self.meta.is_dir && self.meta.size <= SMALL_CONTENT_MAX {
            self.keep_content.store(true, Ordering::Relaxed);
        }
    }

    /// The kept content of `offset..offset+len`, if there is one.
    fn kept(&self, offset: u64, len: usize) -> Option<Bytes> {
        let b = self.content.get()?;
        let start = usize::try_from(offset).ok()?.min(b.len());
        let end = start.saturating_add(len).min(b.len());
        Some(b.slice(start..end))
    }

    /// Keeps `data` if it is this (small, cached) file's whole content.
    fn maybe_keep(&self, offset: u64, data: &Bytes) {
        if offset != 0
            || data.len() as u64 != self.meta.size
            || !self.keep_content.load(Ordering::Relaxed)
            || self.content.get().is_some()
        {
            return;
        }
        let n = data.len();
        if SMALL_CONTENT_BYTES.fetch_add(n, Ordering::Relaxed) + n > SMALL_CONTENT_BUDGET
            || self.content.set(data.clone()).is_err()
        {
            SMALL_CONTENT_BYTES.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Whether the whole file was found resident less than
    /// [`RESIDENT_MEMO_MS`] ago.
    fn resident_recently(&self, now_ms: u64) -> bool {
        now_ms < self.resident_until_ms.load(Ordering::Relaxed)
    }

    fn mark_resident(&self, now_ms: u64) {
        self.resident_until_ms
            .store(now_ms + RESIDENT_MEMO_MS, Ordering::Relaxed);
    }

    /// Wraps a file the caller made (a request body's temp file, already
    /// written), `fstat`ing it; blocking, so called from a pool or where
    /// an inline metadata call is acceptable.
    pub fn from_file(file: File) -> io::Result<OpenFile> {
        Self::new(file)
    }

    /// `data` in an anonymous in-memory file (`memfd_create`), opened,
    /// so that it can be sent with `sendfile` like any file (the
    /// compressed-file cache's larger entries). Blocking only in the
    /// sense of a memory copy; called from a pool thread.
    pub fn in_memory(name: &std::ffi::CStr, data: &[u8]) -> io::Result<OpenFile> {
        use std::io::Write as _;
        let mut f = sys::memfd(name)?;
        f.write_all(data)?;
        Self::new(f)
    }

    fn direct(&self) -> Option<&File> {
        self.direct
            .get_or_init(|| sys::reopen_direct(&self.file).ok())
            .as_ref()
    }
}

const OPEN_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC;

async fn offload<F, R>(pool: &ThreadPool, f: F) -> io::Result<R>
where
    F: FnOnce() -> io::Result<R> + Send + 'static,
    R: Send + 'static,
{
    pool.run(f).await?
}

/// Opens `path` read-only (`O_NONBLOCK|O_CLOEXEC`) and `fstat`s it.
/// Directories open fine (`is_dir`).
pub async fn open(path: &Path, policy: &Policy) -> io::Result<Arc<OpenFile>> {
    let f = open_plain(path, policy).await?;
    if policy.read_ahead && !f.meta.is_dir && f.meta.size > READ_AHEAD_MIN {
        // Advice only: a refusal changes nothing the client sees.
        let _ = sys::fadvise(&f.file, 0, 0, libc::POSIX_FADV_SEQUENTIAL);
    }
    Ok(f)
}

async fn open_plain(path: &Path, policy: &Policy) -> io::Result<Arc<OpenFile>> {
    // With io_uring or a pool to hand a cold open to, the dentry cache is
    // asked first; only a path it cannot resolve leaves the worker.
    if policy.offload_cold_open && (policy.uring() || policy.pool().is_some()) {
        match sys::open_cached(path, OPEN_FLAGS)? {
            Nowait::Done(f) => {
                bump(&STATS.opens_inline);
                policy.inline();
                // The inode is in memory once the open succeeded: fstat is cheap.
                return Ok(Arc::new(OpenFile::new(f)?));
            }
            Nowait::WouldBlock => {
                bump(&STATS.opens_offloaded);
                if let Some(pool) = policy.pool() {
                    policy.offload();
                    let p = path.to_path_buf();
                    let of =
                        offload(pool, move || OpenFile::new(sys::open(&p, OPEN_FLAGS)?)).await?;
                    return Ok(Arc::new(of));
                }
                policy.submitted();
                let f = uring::open(sys::cpath(path)?, OPEN_FLAGS).await?;
                return Ok(Arc::new(OpenFile::new(f)?));
            }
            Nowait::Unsupported => {}
        }
    }
    bump(&STATS.opens_inline);
    policy.inline();
    Ok(Arc::new(OpenFile::new(sys::open(path, OPEN_FLAGS)?)?))
}

async fn stat_impl(path: &Path, policy: &Policy, follow: bool) -> io::Result<Meta> {
    if let Some(pool) = policy.pool().filter(|_| policy.offload_cold_open) {
        let mut flags = libc::O_PATH | libc::O_CLOEXEC;
        if !follow {
            flags |= libc::O_NOFOLLOW;
        }
        match sys::open_cached(path, flags)? {
            Nowait::Done(f) => {
                bump(&STATS.stats_inline);
                policy.inline();
                return Meta::of_file(&f);
            }
            Nowait::WouldBlock => {
                bump(&STATS.stats_offloaded);
                policy.offload();
                let p: PathBuf = path.to_path_buf();
                return offload(pool, move || stat_blocking(&p, follow)).await;
            }
            Nowait::Unsupported => {}
        }
    }
    bump(&STATS.stats_inline);
    policy.inline();
    stat_blocking(path, follow)
}

/// `stat` or `lstat` of `path` where the caller may block.
fn stat_blocking(path: &Path, follow: bool) -> io::Result<Meta> {
    let st = if follow {
        sys::stat(path)?
    } else {
        sys::lstat(path)?
    };
    Ok(Meta::of_stat(&st))
}

/// `stat(2)`: attributes of `path`, following symlinks.
pub async fn stat(path: &Path, policy: &Policy) -> io::Result<Meta> {
    stat_impl(path, policy, true).await
}

/// `lstat(2)`: attributes of `path` itself (a symlink is not followed).
pub async fn lstat(path: &Path, policy: &Policy) -> io::Result<Meta> {
    stat_impl(path, policy, false).await
}

/// `pread` until `buf` is full or EOF; returns the bytes read.
fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Reads `[offset, offset+len)` of `file` (clamped to the size seen at
/// open; shorter only if the file shrank since). The whole range is
/// buffered: callers read in `output_buffers`-sized pieces.
pub async fn read(
    file: &Arc<OpenFile>,
    offset: u64,
    len: usize,
    policy: &Policy,
) -> io::Result<Bytes> {
    let avail = file.meta.size.saturating_sub(offset);
    let len = usize::try_from(avail).map_or(len, |a| a.min(len));
    if len == 0 {
        return Ok(Bytes::new());
    }
    if let Some(b) = file.kept(offset, len) {
        // Not a file read at all: no read counter moves.
        policy.inline();
        return Ok(b);
    }
    let data = read_uncached(file, offset, len, policy).await?;
    file.maybe_keep(offset, &data);
    Ok(data)
}

async fn read_uncached(
    file: &Arc<OpenFile>,
    offset: u64,
    len: usize,
    policy: &Policy,
) -> io::Result<Bytes> {
    let align = policy.directio_alignment;
    if policy.directio.is_some_and(|t| file.meta.size >= t) && align.is_power_of_two() {
        bump(&STATS.reads_direct);
        if policy.uring() {
            return read_direct_uring(file, offset, len, align, policy).await;
        }
        return match policy.pool() {
            None => {
                policy.inline();
                read_direct(file, offset, len, align)
            }
            Some(pool) => {
                policy.offload();
                let f = Arc::clone(file);
                offload(pool, move || read_direct(&f, offset, len, align)).await
            }
        };
    }
    // Read into capacity, not into zeroed memory: a 16 KiB response
    // would otherwise cost a 16 KiB memset first.
    let mut buf = Vec::with_capacity(len);
    let pool = policy.pool();
    if !policy.uring() && pool.is_none() {
        bump(&STATS.reads_inline);
        policy.inline();
        // A zero-length read: EOF (the file shrank since it was opened).
        while buf.len() < len {
            let at = offset + buf.len() as u64;
            let want = len - buf.len();
            match sys::pread_append(&file.file, &mut buf, want, at, false)? {
                Nowait::Done(0) | Nowait::WouldBlock | Nowait::Unsupported => break,
                Nowait::Done(_) => {}
            }
        }
        return Ok(Bytes::from(buf));
    }
    // aio on or threads: what is already in memory is read inline.
    let got = match sys::pread_append(&file.file, &mut buf, len, offset, true)? {
        Nowait::Done(n) => n,
        Nowait::WouldBlock | Nowait::Unsupported => 0,
    };
    if got == len || (got > 0 && offset + got as u64 >= file.meta.size) {
        bump(&STATS.reads_inline);
        policy.inline();
        return Ok(Bytes::from(buf));
    }
    // The rest is read by the pool or io_uring into the usual zeroed
    // tail (this path waits for the disk anyway).
    buf.resize(len, 0);
    if let (false, Some(pool)) = (policy.uring(), pool) {
        bump(&STATS.reads_offloaded);
        policy.offload();
        let f = Arc::clone(file);
        let buf = offload(pool, move || {
            let n = pread_full(&f.file, &mut buf[got..], offset + got as u64)?;
            buf.truncate(got + n);
            Ok(buf)
        })
        .await?;
        return Ok(Bytes::from(buf));
    }
    bump(&STATS.reads_uring);
    policy.submitted();
    let fd = file.file.as_raw_fd();
    let (mut buf, r) = uring::read_full(
        Arc::clone(file),
        fd,
        buf,
        got,
        len - got,
        offset + got as u64,
    )
    .await;
    buf.truncate(got + r?);
    Ok(Bytes::from(buf))
}

/// The parts of an O_DIRECT read of `[offset, offset+len)`: the
/// `align`-aligned middle `[a_start, a_end)` (`mid` bytes) after `head`
/// unaligned bytes, then the unaligned tail.
#[derive(Clone, Copy)]
struct Aligned {
    a_start: u64,
    a_end: u64,
    head: usize,
    mid: usize,
    /// The alignment.
    a: usize,
}

impl Aligned {
    /// None when the range holds no whole aligned block.
    fn of(offset: u64, len: usize, align: u64) -> Option<Aligned> {
        let a_start = offset.div_ceil(align) * align;
        let a_end = (offset + len as u64) / align * align;
        (a_start < a_end).then(|| Aligned {
            a_start,
            a_end,
            head: (a_start - offset) as usize,
            mid: (a_end - a_start) as usize,
            a: align as usize,
        })
    }

    /// A buffer for the `len` bytes and where in it they start (`pad`):
    /// shifted so that the middle lands on an aligned address.
    fn buffer(&self, len: usize) -> (Vec<u8>, usize) {
        let buf = vec![0u8; len + self.a];
        let pad = (self.a - (buf.as_ptr() as usize + self.head) % self.a) % self.a;
        (buf, pad)
    }
}

/// Blocking O_DIRECT read of `[offset, offset+len)`, byte-exact: the
/// `align`-aligned middle goes through the O_DIRECT descriptor into an
/// aligned part of the buffer, the unaligned head and tail through the
/// normal one (seed 000: "the parts before and after whole blocks are read
/// the blocking way"). Falls back to a normal read where O_DIRECT is refused.
fn read_direct(file: &OpenFile, offset: u64, len: usize, align: u64) -> io::Result<Bytes> {
    let direct = file.direct();
    let (Some(direct), Some(parts)) = (direct, Aligned::of(offset, len, align)) else {
        let mut buf = vec![0u8; len];
        let n = pread_full(&file.file, &mut buf, offset)?;
        buf.truncate(n);
        return Ok(Bytes::from(buf));
    };
    let Aligned {
        a_start,
        a_end,
        head,
        mid,
        a,
    } = parts;
    let (mut buf, pad) = parts.buffer(len);
    let mut total = pread_full(&file.file, &mut buf[pad..pad + head], offset)?;
    if total == head {
        let mut got = 0;
        let mut use_direct = true;
        while got < mid {
            let dst = &mut buf[pad + head + got..pad + head + mid];
            let r = if use_direct {
                direct.read_at(dst, a_start + got as u64)
            } else {
                file.file.read_at(dst, a_start + got as u64)
            };
            match r {
                Ok(0) => break,
                Ok(n) => {
                    got += n;
                    // A partial block can only be EOF for O_DIRECT; finish
                    // normally (offsets would no longer be aligned).
                    if n % a != 0 {
                        use_direct = false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if use_direct && e.raw_os_error() == Some(libc::EINVAL) => {
                    use_direct = false
                }
                Err(e) => return Err(e),
            }
        }
        total += got;
        if got == mid {
            let tail_at = pad + head + mid;
            total += pread_full(&file.file, &mut buf[tail_at..pad + len], a_end)?;
        }
    }
    Ok(Bytes::from(buf).slice(pad..pad + total))
}

/// [`read_direct`] with io_uring: the aligned middle is one (or a few)
/// `IORING_OP_READ` on the O_DIRECT descriptor; the unaligned head and
/// tail are read inline when resident (`RWF_NOWAIT`), else through the
/// ring with a buffered read. Nothing blocks the calling thread.
async fn read_direct_uring(
    file: &Arc<OpenFile>,
    offset: u64,
    len: usize,
    align: u64,
    policy: &Policy,
) -> io::Result<Bytes> {
    policy.submitted();
    let fd = file.file.as_raw_fd();
    let direct_fd = file.direct().map(|d| d.as_raw_fd());
    let (Some(direct_fd), Some(parts)) = (direct_fd, Aligned::of(offset, len, align)) else {
        bump(&STATS.reads_uring);
        let (mut buf, r) =
            uring::read_full(Arc::clone(file), fd, vec![0u8; len], 0, len, offset).await;
        buf.truncate(r?);
        return Ok(Bytes::from(buf));
    };
    let Aligned {
        a_start,
        a_end,
        head,
        mid,
        a,
    } = parts;
    let (mut buf, pad) = parts.buffer(len);
    // Buffered part: inline when resident, else through the ring.
    async fn buffered(
        file: &Arc<OpenFile>,
        fd: RawFd,
        mut buf: Vec<u8>,
        at: usize,
        n: usize,
        off: u64,
    ) -> (Vec<u8>, io::Result<usize>) {
        if n == 0 {
            return (buf, Ok(0));
        }
        if let Ok(Nowait::Done(k)) = sys::pread_nowait(&file.file, &mut buf[at..at + n], off) {
            if k == n {
                return (buf, Ok(k));
            }
        }
        bump(&STATS.reads_uring);
        uring::read_full(Arc::clone(file), fd, buf, at, n, off).await
    }
    let (b, r) = buffered(file, fd, buf, pad, head, offset).await;
    buf = b;
    let mut total = r?;
    if total == head {
        let mut got = 0;
        let mut dfd = Some(direct_fd);
        while got < mid {
            bump(&STATS.reads_uring);
            let (b, r) = uring::read(
                Arc::clone(file),
                dfd.unwrap_or(fd),
                buf,
                pad + head + got,
                mid - got,
                a_start + got as u64,
            )
            .await;
            buf = b;
            match r {
                Ok(0) => break,
                Ok(n) => {
                    got += n;
                    // A partial block is EOF for O_DIRECT; finish buffered.
                    if n % a != 0 {
                        dfd = None;
                    }
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN)) => {}
                Err(e) if dfd.is_some() && e.raw_os_error() == Some(libc::EINVAL) => dfd = None,
                Err(e) => return Err(e),
            }
        }
        total += got;
        if got == mid {
            let tail_at = pad + head + mid;
            let (b, r) = buffered(file, fd, buf, tail_at, len - head - mid, a_end).await;
            buf = b;
            total += r?;
        }
    }
    Ok(Bytes::from(buf).slice(pad..pad + total))
}

/// A socket `send_file` can write to: non-blocking, registered with the
/// runtime. Implemented for tokio's `TcpStream` and `UnixStream`.
pub trait SendSock: AsRawFd {
    /// Waits until the socket may be writable.
    fn writable(&self) -> impl Future<Output = io::Result<()>>;
    /// Runs `f`, a raw write on the fd; a `WouldBlock` from it clears the
    /// readiness so the next `writable()` really waits.
    fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
}

impl SendSock for tokio::net::TcpStream {
    fn writable(&self) -> impl Future<Output = io::Result<()>> {
        tokio::net::TcpStream::writable(self)
    }
    fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        tokio::net::TcpStream::try_io(self, tokio::io::Interest::WRITABLE, f)
    }
}

impl SendSock for tokio::net::UnixStream {
    fn writable(&self) -> impl Future<Output = io::Result<()>> {
        tokio::net::UnixStream::writable(self)
    }
    fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        tokio::net::UnixStream::try_io(self, tokio::io::Interest::WRITABLE, f)
    }
}

/// Reads `[offset, offset+len)` into a scratch buffer so the pages are
/// resident when the loop `sendfile`s them. Runs in a pool thread.
fn warm(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let mut scratch = vec![0u8; 128 * 1024];
    let mut done = 0u64;
    while done < len {
        let n = usize::try_from(len - done).map_or(scratch.len(), |r| r.min(scratch.len()));
        let got = pread_full(file, &mut scratch[..n], offset + done)?;
        if got == 0 {
            break;
        }
        done += got as u64;
    }
    Ok(())
}

/// [`warm`] through the ring: reads the range into a scratch buffer (at
/// most 1 MiB at a time) so the loop's `sendfile` finds it resident.
async fn warm_uring(file: &Arc<OpenFile>, offset: u64, len: u64) -> io::Result<()> {
    let fd = file.file.as_raw_fd();
    let size = usize::try_from(len).map_or(1 << 20, |l| l.min(1 << 20));
    let mut scratch = vec![0u8; size];
    let mut done = 0u64;
    while done < len {
        let n = usize::try_from(len - done).map_or(size, |r| r.min(size));
        bump(&STATS.reads_uring);
        let (b, r) = uring::read_full(Arc::clone(file), fd, scratch, 0, n, offset + done).await;
        scratch = b;
        let got = r?;
        if got == 0 {
            break;
        }
        done += got as u64;
    }
    Ok(())
}

/// Sends `[offset, offset+len)` of `file` to `sock` with `sendfile(2)`, in
/// chunks of at most `sendfile_max_chunk`, yielding to the runtime between
/// chunks. With a pool, each chunk's residency is checked first
/// (`cachestat`, else [`resident::probe`]); a cold chunk is read into the page cache by
/// the pool, then sent inline. Bytes are added to `progress` as they go
/// out (so an aborted transfer still logs what was sent); a wait for the
/// client longer than `send_timeout` is `TimedOut`; a file that shrank
/// under us is `UnexpectedEof`.
pub async fn send_file<S: SendSock>(
    sock: &S,
    file: &Arc<OpenFile>,
    offset: u64,
    len: u64,
    policy: &Policy,
    send_timeout: Duration,
    progress: &mut u64,
) -> io::Result<()> {
    let max_chunk = if policy.sendfile_max_chunk == 0 {
        u64::MAX
    } else {
        policy.sendfile_max_chunk
    };
    let fd: RawFd = sock.as_raw_fd();
    let mut sent = 0u64;
    while sent < len {
        let off = offset + sent;
        let n = (len - sent).min(max_chunk);
        if policy.pool().is_some() || policy.uring() {
            let whole = off == 0 && n >= file.meta.size;
            let now_ms = if whole { sys::coarse_ms() } else { 0 };
            let memo = whole && file.resident_recently(now_ms);
            let asked = (!memo && resident::cachestat_may_answer(file))
                .then(|| sys::cachestat_residency(&file.file, off, n, file.meta.size));
            let cold = match asked {
                None if memo => {
                    bump(&STATS.residency_memo);
                    false
                }
                Some(Ok(r)) => {
                    bump(&STATS.cachestat_calls);
                    r == Residency::Cold
                }
                // cachestat is refused for files the worker may not write
                // and does not own (Linux 6.x), or missing (< 6.5): ask
                // the page tables or RWF_NOWAIT instead.
                None => {
                    bump(&STATS.cachestat_fallbacks);
                    !resident::probe(file, off, n).resident()
                }
                Some(Err(e))
                    if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::ENOSYS)) =>
                {
                    bump(&STATS.cachestat_fallbacks);
                    !resident::probe(file, off, n).resident()
                }
                // Cannot tell: assume the worst, the pool is cheap next to a stall.
                Some(Err(_)) => true,
            };
            if cold {
                bump(&STATS.sends_warmed);
                if let Some(pool) = policy.pool() {
                    policy.offload();
                    let f = Arc::clone(file);
                    offload(pool, move || warm(&f.file, off, n)).await?;
                } else {
                    policy.submitted();
                    warm_uring(file, off, n).await?;
                }
            } else {
                bump(&STATS.sends_inline);
                policy.inline();
            }
            if whole {
                file.mark_resident(now_ms);
            }
        } else {
            bump(&STATS.sends_inline);
            policy.inline();
        }
        let mut done = 0u64;
        while done < n {
            // nginx's send_timeout: a limit on each wait for the client,
            // not on the whole transfer (a slow reader that keeps reading
            // is served to the end).
            match tokio::time::timeout(send_timeout, sock.writable()).await {
                Ok(r) => r?,
                Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "send_timeout")),
            }
            let want = usize::try_from(n - done)
                .unwrap_or(usize::MAX)
                .min(0x7fff_f000);
            match sock.try_io(|| sys::sendfile(fd, &file.file, off + done, want)) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file was truncated while being sent",
                    ))
                }
                Ok(k) => {
                    done += k as u64;
                    *progress += k as u64;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        sent += n;
        if sent < len {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// Writes all of `data` at `offset` of a temp file (proxy buffering,
/// cache files): in the pool with `aio threads` + `aio_write on`, inline
/// otherwise (as nginx).
pub async fn write_at(
    file: &Arc<File>,
    offset: u64,
    data: Bytes,
    policy: &Policy,
) -> io::Result<()> {
    if policy.uring() && policy.aio_write {
        bump(&STATS.writes_offloaded);
        policy.submitted();
        return uring::write_all(Arc::clone(file), data, offset).await;
    }
    match policy.pool().filter(|_| policy.aio_write) {
        Some(pool) => {
            bump(&STATS.writes_offloaded);
            policy.offload();
            let f = Arc::clone(file);
            offload(pool, move || f.write_all_at(&data, offset)).await
        }
        None => {
            bump(&STATS.writes_inline);
            policy.inline();
            file.write_all_at(&data, offset)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::conf::PoolConf;
    use crate::io::test_files::rt;
    use tokio::io::AsyncReadExt;

    use crate::io::test_files::make_file;

    /// Drops the file's pages; returns false if the kernel kept them.
    /// Drops the file's pages from the page cache; true if not one is
    /// left. The data is written back first: DONTNEED skips dirty pages,
    /// and a page it skipped made a "cold" read come back inline.
    fn evict(path: &Path) -> bool {
        let f = File::open(path).expect("open for evict");
        let size = f.metadata().expect("meta").len();
        let _ = f.sync_all();
        let _ = sys::fadvise(&f, 0, 0, libc::POSIX_FADV_DONTNEED);
        let ps = 4096;
        (0..size.div_ceil(ps)).all(|p| {
            matches!(
                sys::cachestat_residency(&f, p * ps, ps, size),
                Ok(Residency::Cold)
            )
        })
    }

    fn pool(name: &str) -> Arc<ThreadPool> {
        let pc = PoolConf {
            name: name.into(),
            threads: 2,
            max_queue: 64,
            file: None,
            line: 0,
        };
        Arc::new(ThreadPool::start(pc).expect("pool"))
    }

    /// The decision for a read of an evicted file, tried up to 10 times
    /// until it is `want`. On Linux 6.x a `RWF_NOWAIT` read that misses
    /// the page cache starts the readahead before it says EAGAIN, and this
    /// VM's disk reads ahead 8 MiB: when the test thread is preempted in
    /// between (a loaded machine), the data is there by the check and
    /// the read is rightly inline. Only a cold read that never offloads
    /// is a failure.
    async fn cold_decision<F, Fut>(path: &Path, want: Decision, mut attempt: F) -> Decision
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Decision>,
    {
        let mut got = Decision::Inline;
        for _ in 0..10 {
            assert!(evict(path), "eviction stopped working");
            got = attempt().await;
            if got == want {
                break;
            }
        }
        got
    }

    #[test]
    fn cold_read_offloads_warm_read_is_inline() {
        let (tf, data) = make_file("read", 256 * 1024);
        if !evict(&tf.0) {
            eprintln!("page cache eviction not honoured here; skipping");
            return;
        }
        let policy = Policy::new(Aio::Threads(pool("rd")));
        rt().block_on(async {
            let f = open(&tf.0, &policy).await.expect("open");
            assert_eq!(f.meta.size, data.len() as u64);
            let before = STATS.snapshot();
            let decision = cold_decision(&tf.0, Decision::Offload, || async {
                policy.reset_decision();
                let got = read(&f, 1000, 64 * 1024, &policy).await.expect("cold read");
                assert_eq!(&got[..], &data[1000..1000 + 64 * 1024]);
                policy.decision()
            })
            .await;
            assert_eq!(decision, Decision::Offload);
            assert!(STATS.snapshot().reads_offloaded > before.reads_offloaded);

            policy.reset_decision();
            let before = STATS.snapshot();
            let got = read(&f, 1000, 64 * 1024, &policy).await.expect("warm read");
            assert_eq!(&got[..], &data[1000..1000 + 64 * 1024]);
            assert_eq!(policy.decision(), Decision::Inline);
            assert!(STATS.snapshot().reads_inline > before.reads_inline);

            // Reading past the end is clamped; at the end it is empty.
            let tail = read(&f, data.len() as u64 - 10, 100, &policy)
                .await
                .expect("tail");
            assert_eq!(&tail[..], &data[data.len() - 10..]);
            assert!(read(&f, data.len() as u64, 10, &policy)
                .await
                .expect("eof")
                .is_empty());
        });
    }

    #[test]
    fn uring_cold_read_submits_warm_read_is_inline() {
        if !uring::available() {
            eprintln!("io_uring not available here; skipping");
            return;
        }
        let (tf, data) = make_file("uread", 300_000);
        if !evict(&tf.0) {
            eprintln!("page cache eviction not honoured here; skipping");
            return;
        }
        let policy = Policy::new(Aio::Uring);
        rt().block_on(async {
            let f = open(&tf.0, &policy).await.expect("open");
            let before = STATS.snapshot();
            let decision = cold_decision(&tf.0, Decision::Uring, || async {
                policy.reset_decision();
                let got = read(&f, 777, 100_000, &policy).await.expect("cold read");
                assert!(got[..] == data[777..100_777]);
                policy.decision()
            })
            .await;
            assert_eq!(decision, Decision::Uring);
            let after = STATS.snapshot();
            assert!(after.reads_uring > before.reads_uring);
            assert!(after.uring_submissions > before.uring_submissions);
            // Buffered: the ring filled the page cache, so now it is inline.
            policy.reset_decision();
            let got = read(&f, 777, 100_000, &policy).await.expect("warm read");
            assert!(got[..] == data[777..100_777]);
            assert_eq!(policy.decision(), Decision::Inline);
        });
        // Sends of a cold file are warmed by the ring, then inline.
        assert!(evict(&tf.0));
        let policy = Policy::new(Aio::Uring);
        let before = STATS.snapshot();
        let (sent, got) = rt().block_on(send_and_receive(&tf.0, 5, 299_990, &policy));
        assert_eq!(sent, 299_990);
        assert!(got[..] == data[5..299_995]);
        assert_eq!(policy.decision(), Decision::Uring);
        assert!(STATS.snapshot().sends_warmed > before.sends_warmed);
    }

    #[test]
    fn uring_directio_is_byte_exact() {
        if !uring::available() {
            return;
        }
        for (si, size) in [20_000usize, 4096 * 5 + 1, 513, 1_000_003]
            .into_iter()
            .enumerate()
        {
            let (tf, data) = make_file(&format!("udio{si}"), size);
            for align in [512u64, 4096] {
                let mut policy = Policy::new(Aio::Uring);
                policy.directio = Some(1);
                policy.directio_alignment = align;
                rt().block_on(async {
                    let f = open(&tf.0, &policy).await.expect("open");
                    for (off, len) in [
                        (0usize, size),
                        (1, size - 2),
                        (511, 1025),
                        (4095, 4098),
                        (size - 1, 1),
                    ] {
                        let off = off.min(size);
                        let len = len.min(size - off);
                        let got = read(&f, off as u64, len, &policy)
                            .await
                            .expect("direct read");
                        assert!(
                            got[..] == data[off..off + len],
                            "size {size} align {align} range {off}+{len}"
                        );
                    }
                    assert_eq!(policy.decision(), Decision::Uring);
                });
            }
        }
    }

    #[test]
    fn aio_off_reads_inline() {
        let (tf, data) = make_file("off", 10_000);
        let policy = Policy::default();
        rt().block_on(async {
            let f = open(&tf.0, &policy).await.expect("open");
            let got = read(&f, 3, 9_000, &policy).await.expect("read");
            assert_eq!(&got[..], &data[3..9_003]);
            assert_eq!(policy.decision(), Decision::Inline);
        });
    }

    #[test]
    fn directio_is_byte_exact() {
        let sizes = [20_000usize, 4096 * 5 + 1, 513];
        for (si, &size) in sizes.iter().enumerate() {
            let (tf, data) = make_file(&format!("dio{si}"), size);
            for align in [512u64, 4096] {
                for threads in [false, true] {
                    let aio = if threads {
                        Aio::Threads(pool("dio"))
                    } else {
                        Aio::Off
                    };
                    let mut policy = Policy::new(aio);
                    policy.directio = Some(1);
                    policy.directio_alignment = align;
                    let ranges = [
                        (0usize, size),
                        (1, size - 2),
                        (511, 1025),
                        (513, 100),
                        (size / 3, size - size / 3),
                        (4095, 4098),
                        (size - 1, 1),
                    ];
                    rt().block_on(async {
                        let f = open(&tf.0, &policy).await.expect("open");
                        let before = STATS.snapshot().reads_direct;
                        let mut nonempty = 0;
                        for (off, len) in ranges {
                            let off = off.min(size);
                            let len = len.min(size - off);
                            nonempty += usize::from(len > 0);
                            let got = read(&f, off as u64, len, &policy)
                                .await
                                .expect("direct read");
                            assert_eq!(
                                &got[..],
                                &data[off..off + len],
                                "size {size} align {align} range {off}+{len}"
                            );
                        }
                        assert!(STATS.snapshot().reads_direct >= before + nonempty as u64);
                        // The O_DIRECT descriptor really exists (ext4 under /var/tmp).
                        assert!(f.direct().is_some());
                    });
                }
            }
        }
    }

    async fn send_and_receive(path: &Path, off: u64, len: u64, policy: &Policy) -> (u64, Vec<u8>) {
        let f = open(path, policy).await.expect("open");
        send_open_and_receive(&f, off, len, policy).await
    }

    async fn send_open_and_receive(
        f: &Arc<OpenFile>,
        off: u64,
        len: u64,
        policy: &Policy,
    ) -> (u64, Vec<u8>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = tokio::spawn(async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.expect("read_to_end");
            got
        });
        let (server, _) = listener.accept().await.expect("accept");
        let mut sent = 0;
        send_file(
            &server,
            f,
            off,
            len,
            policy,
            Duration::from_secs(60),
            &mut sent,
        )
        .await
        .expect("send_file");
        drop(server);
        (sent, client.await.expect("client task"))
    }

    #[test]
    fn a_file_sent_whole_and_resident_is_not_probed_again_for_a_moment() {
        let (tf, data) = make_file("memo", 16 * 1024);
        let policy = Policy::new(Aio::Threads(pool("memo")));
        let len = data.len() as u64;
        let f = rt().block_on(open(&tf.0, &policy)).expect("open");
        assert!(!f.resident_recently(sys::coarse_ms()));
        // First send: checked (cachestat or the probe), then remembered.
        let (sent, got) = rt().block_on(send_open_and_receive(&f, 0, len, &policy));
        assert_eq!((sent, got == data), (len, true));
        assert!(f.resident_recently(sys::coarse_ms()));
        // Second send of the same open file: no check at all.
        let before = STATS.snapshot();
        let (sent, got) = rt().block_on(send_open_and_receive(&f, 0, len, &policy));
        let after = STATS.snapshot();
        assert_eq!((sent, got == data), (len, true));
        assert!(after.residency_memo > before.residency_memo);
        // A part of the file is always checked, and never remembered for
        // the whole.
        let g = rt().block_on(open(&tf.0, &policy)).expect("open");
        let (sent, _) = rt().block_on(send_open_and_receive(&g, 1, len - 1, &policy));
        assert_eq!(sent, len - 1);
        assert!(!g.resident_recently(sys::coarse_ms()));
        // And the memory is short.
        std::thread::sleep(Duration::from_millis(RESIDENT_MEMO_MS + 50));
        assert!(!f.resident_recently(sys::coarse_ms()));
    }

    #[test]
    fn send_file_range_small_chunks_over_tcp() {
        let (tf, data) = make_file("send", 700_000);
        for threads in [false, true] {
            let aio = if threads {
                Aio::Threads(pool("snd"))
            } else {
                Aio::Off
            };
            let mut policy = Policy::new(aio);
            policy.sendfile_max_chunk = 10_000;
            let (off, len) = (12_345u64, 600_001u64);
            let (sent, got) = rt().block_on(send_and_receive(&tf.0, off, len, &policy));
            assert_eq!(sent, len);
            assert_eq!(got.len() as u64, len);
            assert!(
                got == data[off as usize..(off + len) as usize],
                "bytes differ"
            );
        }
    }

    #[test]
    fn send_file_cold_chunks_are_warmed_by_the_pool() {
        let (tf, data) = make_file("sendcold", 300_000);
        if !evict(&tf.0) {
            eprintln!("page cache eviction not honoured here; skipping");
            return;
        }
        let policy = Policy::new(Aio::Threads(pool("warm")));
        let before = STATS.snapshot();
        let (sent, got) = rt().block_on(send_and_receive(&tf.0, 0, data.len() as u64, &policy));
        assert_eq!(sent, data.len() as u64);
        assert!(got == data);
        assert_eq!(policy.decision(), Decision::Offload);
        let after = STATS.snapshot();
        assert!(after.sends_warmed > before.sends_warmed);
        assert!(
            after.cachestat_calls + after.cachestat_fallbacks
                > before.cachestat_calls + before.cachestat_fallbacks
        );

        // Now resident: the same send is inline.
        policy.reset_decision();
        let (sent, got) = rt().block_on(send_and_receive(&tf.0, 0, data.len() as u64, &policy));
        assert_eq!(sent, data.len() as u64);
        assert!(got == data);
        assert_eq!(policy.decision(), Decision::Inline);
    }

    #[test]
    fn open_dirs_stat_lstat_and_errors() {
        let (tf, data) = make_file("stat", 1234);
        let link = PathBuf::from(format!("{}.lnk", tf.0.display()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&tf.0, &link).expect("symlink");
        for threads in [false, true] {
            let aio = if threads {
                Aio::Threads(pool("st"))
            } else {
                Aio::Off
            };
            let policy = Policy::new(aio);
            rt().block_on(async {
                let d = open(Path::new("/var/tmp"), &policy)
                    .await
                    .expect("open dir");
                assert!(d.meta.is_dir);
                let m = stat(&link, &policy).await.expect("stat");
                assert_eq!(m.size, data.len() as u64);
                assert!(m.is_file && !m.is_symlink);
                let l = lstat(&link, &policy).await.expect("lstat");
                assert!(l.is_symlink);
                let f = open(&link, &policy).await.expect("open via link");
                assert_eq!((f.meta.ino, f.meta.size), (m.ino, m.size));
                let e = open(Path::new("/var/tmp/tern-io-does-not-exist"), &policy).await;
                assert_eq!(
                    e.map(|_| ()).map_err(|e| e.kind()),
                    Err(io::ErrorKind::NotFound)
                );
                let e = stat(Path::new("/var/tmp/tern-io-does-not-exist"), &policy).await;
                assert_eq!(
                    e.map(|_| ()).map_err(|e| e.kind()),
                    Err(io::ErrorKind::NotFound)
                );
            });
        }
        let _ = std::fs::remove_file(&link);
    }

    #[test]
    fn write_at_offloads_with_aio_write() {
        let (tf, _) = make_file("write", 0);
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .write(true)
                .open(&tf.0)
                .expect("open w"),
        );
        let mut policy = Policy::new(Aio::Threads(pool("wr")));
        rt().block_on(async {
            write_at(&file, 0, Bytes::from_static(b"hello "), &policy)
                .await
                .expect("write");
            assert_eq!(policy.decision(), Decision::Inline);
            policy.aio_write = true;
            write_at(&file, 6, Bytes::from_static(b"world"), &policy)
                .await
                .expect("write");
            assert_eq!(policy.decision(), Decision::Offload);
        });
        assert_eq!(std::fs::read(&tf.0).expect("read back"), b"hello world");
    }

    #[test]
    fn overflow_surfaces_as_io_error_with_nginx_text() {
        let pc = PoolConf {
            name: "tiny".into(),
            threads: 1,
            max_queue: 0,
            file: None,
            line: 0,
        };
        let pool = Arc::new(ThreadPool::start(pc).expect("pool"));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tf, _) = make_file("ovf", 100);
        let mut policy = Policy::new(Aio::Threads(Arc::clone(&pool)));
        policy.aio_write = true;
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .write(true)
                .open(&tf.0)
                .expect("open w"),
        );
        rt().block_on(async {
            let p = Arc::clone(&pool);
            let busy = tokio::spawn(async move {
                p.run(move || {
                    let _ = rx.recv();
                })
                .await
            });
            while !busy_started(&pool) {
                tokio::task::yield_now().await;
            }
            let e = write_at(&file, 0, Bytes::from_static(b"x"), &policy)
                .await
                .expect_err("overflow");
            assert_eq!(
                e.to_string(),
                "thread pool \"tiny\" queue overflow: 0 tasks waiting"
            );
            assert!(matches!(
                IoError::from_io(&e),
                Some(IoError::Overflow { .. })
            ));
            let _ = tx.send(());
            assert!(busy.await.is_ok());
        });
        pool.shutdown_and_join();
    }

    /// Runs `f` on a thread whose credentials are `nobody`'s (per-thread
    /// `setresuid`, as tern's workers do); None when not run as root.
    fn as_nobody<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        // As the master does before any thread drops privileges.
        crate::io::resident::init();
        std::thread::spawn(move || {
            // SAFETY: raw per-thread credential syscalls with plain integer
            // arguments; only this thread's credentials change.
            let ok = unsafe {
                libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == 0
                    && libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534) == 0
                    && libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) == 0
            };
            ok.then(f)
        })
        .join()
        .ok()
        .flatten()
    }

    #[test]
    fn send_file_as_nobody_where_cachestat_is_refused() {
        let (tf, data) = make_file("nobody", 1_500_000);
        if !evict(&tf.0) {
            eprintln!("page cache eviction not honoured here; skipping");
            return;
        }
        let path = tf.0.clone();
        let len = data.len() as u64;
        let r = as_nobody(move || {
            let f = File::open(&path).expect("open as nobody");
            let refused = sys::cachestat_residency(&f, 0, len, len)
                .err()
                .and_then(|e| e.raw_os_error());
            let mut policy = Policy::new(Aio::Threads(pool("nobody")));
            policy.sendfile_max_chunk = 512 * 1024;
            let mut runs = Vec::new();
            for _ in 0..3 {
                policy.reset_decision();
                let before = STATS.snapshot();
                let (sent, got) = rt().block_on(send_and_receive(&path, 0, len, &policy));
                let after = STATS.snapshot();
                runs.push((sent, got, policy.decision(), before, after));
            }
            (refused, runs)
        });
        let Some((refused, runs)) = r else {
            eprintln!("not root: cannot switch a thread to nobody; skipping");
            return;
        };
        if refused != Some(libc::EPERM) {
            eprintln!("cachestat answers nobody here ({refused:?}); the fallback is not reached");
        }
        for (sent, got, _, _, _) in &runs {
            assert_eq!(*sent, data.len() as u64);
            assert!(*got == data, "bytes differ");
        }
        // Cold: the pool warmed it (the first chunk at least: its reads
        // may bring the next ones in by readahead).
        let (_, _, d, b, a) = &runs[0];
        assert_eq!(*d, Decision::Offload);
        assert!(a.sends_warmed > b.sends_warmed);
        // Then resident: inline (the counters are process-wide, so only
        // lower bounds hold while other tests run).
        let (_, _, d, b, a) = &runs[1];
        assert_eq!(*d, Decision::Inline);
        assert!(a.sends_inline >= b.sends_inline + 3);
        let (_, _, d, b, a) = &runs[2];
        assert_eq!(*d, Decision::Inline);
        if refused == Some(libc::EPERM) {
            assert!(a.cachestat_fallbacks >= b.cachestat_fallbacks + 3);
            assert!(a.residency_mapped > b.residency_mapped);
        }
        // The thread's mappings went with it: DONTNEED (which spares mapped
        // pages) can evict the file again. It also spares pages still under
        // readahead I/O, so a loaded machine may need a few tries.
        let evicted = (0..20).any(|_| {
            evict(&tf.0) || {
                std::thread::sleep(std::time::Duration::from_millis(50));
                false
            }
        });
        assert!(evicted, "the file's pages stayed mapped");
    }

    #[test]
    fn cachestat_prediction_matches_the_kernel() {
        use std::os::unix::fs::PermissionsExt;
        let (ro, _) = make_file("pred-ro", 100_000);
        let (rw, _) = make_file("pred-rw", 100_000);
        std::fs::set_permissions(&ro.0, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::fs::set_permissions(&rw.0, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let f = OpenFile::new(File::open(&ro.0).expect("open")).expect("fstat");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            assert!(resident::cachestat_may_answer(&f));
        }
        let paths = [(ro.0.clone(), false), (rw.0.clone(), true)];
        let got = as_nobody(move || {
            paths
                .iter()
                .map(|(p, _)| {
                    let f = OpenFile::new(File::open(p).expect("open")).expect("fstat");
                    let asked = sys::cachestat_residency(&f.file, 0, f.meta.size, f.meta.size)
                        .map_err(|e| e.raw_os_error());
                    (resident::cachestat_may_answer(&f), asked)
                })
                .collect::<Vec<_>>()
        });
        let Some(got) = got else {
            eprintln!("not root: cannot switch a thread to nobody; skipping");
            return;
        };
        // Root's 0644 file: predicted refused, and the kernel does refuse.
        assert!(!got[0].0);
        assert_eq!(got[0].1, Err(Some(libc::EPERM)));
        // Writable by others: predicted answered, and it is.
        assert!(got[1].0);
        assert!(got[1].1.is_ok());
    }

    #[test]
    fn policy_from_loc_resolves_pools() {
        let main = crate::io::IoMain {
            pools: vec![PoolConf {
                name: "disk1".into(),
                threads: 1,
                max_queue: 4,
                file: None,
                line: 0,
            }],
        };
        let pools = Pools::start(&main).expect("pools");
        let mut loc = IoLoc {
            aio: Some(AioConf::Threads {
                pool: Some("pool_$disk".into()),
                file: None,
                line: 0,
            }),
            sendfile_max_chunk: Some(512 * 1024),
            ..Default::default()
        };
        let p = Policy::from_loc(&loc, &pools, Some("disk1")).expect("resolved");
        assert!(matches!(&p.aio, Aio::Threads(tp) if tp.name() == "disk1"));
        assert_eq!(p.sendfile_max_chunk, 512 * 1024);
        let e = Policy::from_loc(&loc, &pools, Some("disk9"))
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(e, Err("thread pool \"disk9\" not found".to_string()));
        loc.aio = Some(AioConf::Off);
        assert!(matches!(
            Policy::from_loc(&loc, &pools, None).map(|p| p.aio.clone()),
            Ok(Aio::Off)
        ));
        assert_eq!(Policy::default().sendfile_max_chunk, 2 * 1024 * 1024);
    }

    /// True once the pool's single thread has picked up a task.
    fn busy_started(pool: &ThreadPool) -> bool {
        let s = pool.stats();
        s.queued == 0 && s.max_queued > 0
    }
}
