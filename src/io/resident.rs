//! "Is this range of a file in the page cache?" where `cachestat(2)` will
//! not say: since Linux 6.x it answers EPERM unless the caller owns the
//! file or may write it, and tern's workers run as `nobody` serving files
//! they only read (before 6.5 it does not exist; `mincore` then reports
//! every page of such a file as resident, which is no answer either).
//!
//! Two exact ways remain, and this module uses both:
//!
//! - `preadv2(RWF_NOWAIT)` of the range, data thrown away: always right
//!   (it stops at the first page not in memory), but it copies the range,
//!   which for a hot 4 MiB file sent `sendfile_max_chunk` at a time was
//!   most of the event loop's work besides `sendfile`;
//! - the page tables of a read-only shared mapping of the file: a page
//!   whose entry is present (bit 63 of `/proc/self/pagemap`) is in the
//!   page cache right now, since reclaim unmaps a page before it frees it.
//!   Reading 8 bytes per page costs ~4 µs per 512 KiB instead of ~35.
//!
//! So: [`probe`] looks at the page tables first; if any entry is absent it
//! falls back to the copy, and when the copy finds the range resident it
//! maps the pages (`MADV_POPULATE_READ`, minor faults only) so the next
//! probe of that range is the cheap one. Nothing is ever read through the
//! mapping. A range the copy finds cold is reported cold, and the caller
//! has the pool (or io_uring) read it: nothing cold is sent inline.
//!
//! # Data flow and lifetime
//!
//! Each worker thread keeps its own cache of mappings keyed by
//! (device, inode), checked against size and mtime (a change maps the file
//! again), at most [`MAX_MAPS`] of them, and drops one unused for [`IDLE`]
//! (checked when probing). While mapped, a file's pages count in the
//! worker's RSS and `POSIX_FADV_DONTNEED` leaves them in memory, and a
//! deleted file's blocks are freed only when its mapping goes; the idle
//! limit bounds all three to files being served right now. Ranges of at
//! most [`COPY_MAX`] bytes are probed by copy directly (cheaper than
//! reading the page tables). `/proc/self/pagemap` is opened once per
//! process by [`init`], which the master calls before the workers give up
//! root (once they have, the process is not dumpable and the file is
//! root's); where it cannot be opened, every probe is a copy.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::ops::OpenFile;
use super::stats::{bump, STATS};
use super::sys::{self, Mapping, Nowait};

/// Mappings kept per worker thread.
pub const MAX_MAPS: usize = 256;
/// A mapping unused this long is dropped.
pub const IDLE: Duration = Duration::from_secs(10);
/// Ranges up to this size are probed by copy.
pub const COPY_MAX: u64 = 16 * 1024;
/// Bytes of the scratch buffer every copy lands in.
const SCRATCH: usize = 16 * 1024;

static PAGEMAP: OnceLock<Option<File>> = OnceLock::new();
/// Set when mapping is pointless here (no `MADV_POPULATE_READ`).
static NO_MAPS: AtomicBool = AtomicBool::new(false);

/// Opens `/proc/self/pagemap` for the whole process (see the module doc:
/// call it before any thread drops privileges). Idempotent.
pub fn init() {
    pagemap();
}

fn pagemap() -> Option<&'static File> {
    PAGEMAP
        .get_or_init(|| File::open("/proc/self/pagemap").ok())
        .as_ref()
}

struct Entry {
    map: Mapping,
    size: u64,
    mtime: (i64, i64),
    used: Instant,
}

#[derive(Default)]
struct Cache {
    maps: HashMap<(u64, u64), Entry>,
    next_sweep: Option<Instant>,
    /// A task of this thread's runtime sweeps while anything is mapped.
    sweeper: bool,
}

impl Cache {
    fn sweep(&mut self, now: Instant) {
        if self.next_sweep.is_some_and(|t| now < t) {
            return;
        }
        self.maps.retain(|_, e| now.duration_since(e.used) < IDLE);
        self.next_sweep = Some(now + Duration::from_secs(1));
    }

    /// Probing sweeps too, but a worker that stops sending large files
    /// would keep its mappings (and deleted files' blocks) forever: on a
    /// `current_thread` runtime (a worker's), a task on this same thread
    /// sweeps every [`IDLE`] until nothing is left.
    fn start_sweeper(&mut self) {
        if self.sweeper {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread {
            return;
        }
        self.sweeper = true;
        rt.spawn(async {
            loop {
                tokio::time::sleep(IDLE).await;
                let left = CACHE.with(|c| {
                    let mut c = c.borrow_mut();
                    c.next_sweep = None;
                    c.sweep(Instant::now());
                    c.sweeper = !c.maps.is_empty();
                    c.sweeper
                });
                if !left {
                    break;
                }
            }
        });
    }

    /// The mapping of `f`, made (or remade, if the file changed) on demand.
    fn get(&mut self, f: &OpenFile, now: Instant) -> Option<&Entry> {
        let key = (f.meta.dev, f.meta.ino);
        let fresh = self
            .maps
            .get(&key)
            .is_some_and(|e| e.size == f.meta.size && e.mtime == (f.meta.mtime, f.meta.mtime_nsec));
        if !fresh {
            self.maps.remove(&key);
            if self.maps.len() >= MAX_MAPS {
                let oldest = self
                    .maps
                    .iter()
                    .min_by_key(|(_, e)| e.used)
                    .map(|(k, _)| *k);
                if let Some(k) = oldest {
                    self.maps.remove(&k);
                }
            }
            let len =
                usize::try_from(f.meta.size.div_ceil(sys::page_size()) * sys::page_size()).ok()?;
            let map = Mapping::new(&f.file, len).ok()?;
            self.start_sweeper();
            self.maps.insert(
                key,
                Entry {
                    map,
                    size: f.meta.size,
                    mtime: (f.meta.mtime, f.meta.mtime_nsec),
                    used: now,
                },
            );
        }
        let e = self.maps.get_mut(&key)?;
        e.used = now;
        Some(e)
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

thread_local! {
    /// This thread's effective uid, read once: tern's threads switch
    /// credentials before their first request and never again.
    static EUID: libc::uid_t = {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() }
    };
}

/// Whether `cachestat(2)` may answer for `f` on this thread: false only
/// when it surely answers EPERM (not root, not the owner, no write bit for
/// group or others: the kernel wants ownership, CAP_FOWNER or write
/// permission, and tern's descriptors are read-only), which saves a
/// syscall per chunk. A wrong `true` costs that syscall, never accuracy.
pub fn cachestat_may_answer(f: &OpenFile) -> bool {
    let euid = EUID.with(|u| *u);
    euid == 0 || f.meta.uid == euid || f.meta.mode & 0o022 != 0
}

/// How [`probe`] got its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Every page-table entry of the range was present: resident.
    Mapped,
    /// Copied with `RWF_NOWAIT`: `true` if all of it was resident.
    Copied(bool),
}

impl Answer {
    pub fn resident(self) -> bool {
        matches!(self, Answer::Mapped | Answer::Copied(true))
    }
}

/// Is `[off, off+len)` of `f` (clamped to its size) in the page cache?
/// Exact at the moment of the call (see the module doc for how).
pub fn probe(f: &OpenFile, off: u64, len: u64) -> Answer {
    let end = off.saturating_add(len).min(f.meta.size);
    if end <= off {
        return Answer::Copied(true);
    }
    let pm = match pagemap() {
        Some(pm) if end - off > COPY_MAX && !NO_MAPS.load(Ordering::Relaxed) => pm,
        _ => return Answer::Copied(copy_probe(&f.file, off, end)),
    };
    let ps = sys::page_size();
    let first = off / ps;
    let last = end.div_ceil(ps);
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let now = Instant::now();
        c.sweep(now);
        let Some(e) = c.get(f, now) else {
            return Answer::Copied(copy_probe(&f.file, off, end));
        };
        let addr = e.map.addr() + (first * ps) as usize;
        if let Ok(true) = sys::pagemap_present(pm, addr, last - first) {
            bump(&STATS.residency_mapped);
            return Answer::Mapped;
        }
        let resident = copy_probe(&f.file, off, end);
        let mut unsupported = false;
        if resident {
            let (o, n) = ((first * ps) as usize, ((last - first) * ps) as usize);
            if let Err(err) = e.map.populate(o, n.min(e.map.len() - o)) {
                // EINVAL: no MADV_POPULATE_READ (Linux < 5.14), the entries
                // would never become present. EFAULT (the file shrank) and
                // the rest: the next probe copies again.
                unsupported = err.raw_os_error() == Some(libc::EINVAL);
            }
        }
        if unsupported {
            NO_MAPS.store(true, Ordering::Relaxed);
            c.maps.clear();
        }
        Answer::Copied(resident)
    })
}

/// `RWF_NOWAIT` copy of `[off, end)` into a small per-thread scratch buffer.
fn copy_probe(file: &File, off: u64, end: u64) -> bool {
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < SCRATCH {
            b.resize(SCRATCH, 0);
        }
        let Ok(len) = usize::try_from(end - off) else {
            return false;
        };
        matches!(sys::pread_nowait_discard(file, &mut b, off, len), Ok(Nowait::Done(n)) if n == len)
    })
}

/// Drops this thread's mappings (tests; also what [`IDLE`] does in time).
#[cfg(test)]
pub fn forget_all() {
    CACHE.with(|c| c.borrow_mut().maps.clear());
}

/// Reclaims the pages of `f` through this thread's mapping of it, as
/// memory pressure would (tests). False if `f` is not mapped here.
#[cfg(test)]
pub fn page_out(f: &OpenFile) -> bool {
    CACHE.with(|c| {
        let c = c.borrow();
        c.maps
            .get(&(f.meta.dev, f.meta.ino))
            .is_some_and(|e| e.map.pageout(0, e.map.len()).is_ok())
    })
}

/// Number of files mapped by this thread (tests).
#[cfg(test)]
pub fn mapped_files() -> usize {
    CACHE.with(|c| c.borrow().maps.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::sys::Residency;
    use std::io::Write;
    use std::path::Path;

    use crate::io::test_files::TestFile;

    fn make_file(tag: &str, len: usize) -> TestFile {
        crate::io::test_files::make_file(tag, len).0
    }

    fn open(path: &Path) -> OpenFile {
        OpenFile::new(File::open(path).expect("open")).expect("fstat")
    }

    /// Residency as cachestat sees it (the tests run as root, so it answers).
    fn cachestat(f: &OpenFile) -> Option<Residency> {
        sys::cachestat_residency(&f.file, 0, f.meta.size, f.meta.size).ok()
    }

    fn evict(f: &OpenFile) -> bool {
        let _ = sys::fadvise(&f.file, 0, 0, libc::POSIX_FADV_DONTNEED);
        cachestat(f) == Some(Residency::Cold)
    }

    fn warm(f: &OpenFile) {
        let _ = std::fs::read(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&f.file)
        ));
        // Twice: the first pass may leave readahead marks RWF_NOWAIT stops at.
        let _ = std::fs::read(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&f.file)
        ));
    }

    const CHUNK: u64 = 512 * 1024;

    #[test]
    fn cold_is_cold_warm_is_copied_then_mapped() {
        init();
        let tf = make_file("cycle", 1 << 20);
        let f = open(&tf.0);
        forget_all();
        if !evict(&f) {
            eprintln!("page cache eviction not honoured here; skipping");
            return;
        }
        assert_eq!(probe(&f, 0, CHUNK), Answer::Copied(false));
        // A missed non-blocking read may start the kernel's readahead of
        // what follows: evict again before asking about the second half.
        if !evict(&f) {
            return;
        }
        assert_eq!(probe(&f, CHUNK, CHUNK), Answer::Copied(false));
        warm(&f);
        assert_eq!(probe(&f, 0, CHUNK), Answer::Copied(true));
        if pagemap().is_none() || NO_MAPS.load(Ordering::Relaxed) {
            eprintln!("no pagemap / MADV_POPULATE_READ here; copy only");
            return;
        }
        let before = STATS.snapshot().residency_mapped;
        assert_eq!(probe(&f, 0, CHUNK), Answer::Mapped);
        assert!(STATS.snapshot().residency_mapped > before);
        // The second half was never populated: copied once, then mapped.
        assert_eq!(probe(&f, CHUNK + 100, CHUNK), Answer::Copied(true));
        assert_eq!(probe(&f, CHUNK + 100, CHUNK), Answer::Mapped);
        // Unaligned ranges and ranges past the end are clamped.
        assert_eq!(probe(&f, 4095, 3 * 4096 + 2 + COPY_MAX), Answer::Mapped);
        assert_eq!(probe(&f, (1 << 20) - 1, CHUNK), Answer::Copied(true));
        assert_eq!(probe(&f, 1 << 20, CHUNK), Answer::Copied(true));
        assert_eq!(mapped_files(), 1);
        forget_all();
    }

    #[test]
    fn pages_reclaimed_under_the_mapping_are_cold() {
        init();
        let tf = make_file("pageout", 1 << 20);
        let f = open(&tf.0);
        warm(&f);
        forget_all();
        assert!(probe(&f, 0, 1 << 20).resident());
        if probe(&f, 0, 1 << 20) != Answer::Mapped {
            eprintln!("no pagemap here; skipping");
            return;
        }
        // What memory pressure does: unmap the pages, then free them.
        assert!(page_out(&f));
        if cachestat(&f) == Some(Residency::Resident) {
            eprintln!("MADV_PAGEOUT kept the pages here; skipping");
            return;
        }
        // Absent entries fall back to the copy, which finds them cold.
        assert_eq!(probe(&f, 0, 1 << 20), Answer::Copied(false));
        assert_eq!(probe(&f, 0, CHUNK), Answer::Copied(false));
        forget_all();
    }

    #[test]
    fn pagemap_scan_and_read_agree() {
        init();
        let Some(pm) = pagemap() else {
            return;
        };
        let tf = make_file("scan", 1 << 20);
        let f = open(&tf.0);
        warm(&f);
        let m = Mapping::new(&f.file, 1 << 20).expect("map");
        let ps = sys::page_size();
        let pages = (1 << 20) / ps;
        // Nothing populated yet: absent. Then the first half.
        let check = |off_pages: u64, n: u64| {
            let addr = m.addr() + (off_pages * ps) as usize;
            let read = sys::pagemap_read_present(pm, addr, n).expect("read");
            let any = sys::pagemap_present(pm, addr, n).expect("scan");
            assert_eq!(read, any, "pages {off_pages}+{n}");
            read
        };
        assert!(!check(0, pages));
        if m.populate(0, (1 << 19) as usize).is_err() {
            return;
        }
        assert!(check(0, pages / 2));
        assert!(check(1, pages / 2 - 1));
        // Fault-around and large folios may have mapped more than asked:
        // whatever the second half shows, both ways must say the same.
        check(0, pages / 2 + 1);
        check(pages / 2, pages / 2);
        check(pages - 1, 1);
        // More than one batch of the read path (512 entries).
        m.populate(0, 1 << 20).expect("populate all");
        assert!(check(0, pages));
    }

    #[test]
    fn idle_mappings_are_swept() {
        let tf = make_file("idle", 100_000);
        let f = open(&tf.0);
        let mut c = Cache::default();
        let t0 = Instant::now();
        assert!(c.get(&f, t0).is_some());
        c.sweep(t0);
        assert_eq!(c.maps.len(), 1);
        // Not before the next sweep is due, even if idle by then.
        c.next_sweep = Some(t0 + IDLE + Duration::from_secs(1));
        c.sweep(t0 + IDLE);
        assert_eq!(c.maps.len(), 1);
        assert_eq!(c.next_sweep, Some(t0 + IDLE + Duration::from_secs(1)));
        c.next_sweep = None;
        c.sweep(t0 + IDLE - Duration::from_millis(1));
        assert_eq!(c.maps.len(), 1);
        // Unused for IDLE: gone.
        c.next_sweep = None;
        c.sweep(t0 + IDLE);
        assert_eq!(c.maps.len(), 0);
        // Outside a runtime no sweeper task is started.
        assert!(!c.sweeper);
    }

    #[test]
    fn a_worker_runtime_gets_a_sweeper_task() {
        let tf = make_file("sweeper", 100_000);
        let f = open(&tf.0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        forget_all();
        CACHE.with(|c| c.borrow_mut().sweeper = false);
        rt.block_on(async {
            CACHE.with(|c| assert!(c.borrow_mut().get(&f, Instant::now()).is_some()));
            assert!(CACHE.with(|c| c.borrow().sweeper));
            // One task only, however many files get mapped.
            let before = tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks();
            let tg = make_file("sweeper2", 100_000);
            let g = open(&tg.0);
            CACHE.with(|c| assert!(c.borrow_mut().get(&g, Instant::now()).is_some()));
            assert_eq!(
                tokio::runtime::Handle::current()
                    .metrics()
                    .num_alive_tasks(),
                before
            );
            assert_eq!(before, 1);
        });
        forget_all();
        CACHE.with(|c| c.borrow_mut().sweeper = false);
    }

    #[test]
    fn small_ranges_are_copied() {
        init();
        let tf = make_file("small", 3 * COPY_MAX as usize);
        let f = open(&tf.0);
        warm(&f);
        forget_all();
        for _ in 0..3 {
            assert_eq!(probe(&f, 10, COPY_MAX), Answer::Copied(true));
        }
        assert_eq!(mapped_files(), 0);
        // A probe of an evicted range is a RWF_NOWAIT read, which starts
        // the readahead before it says EAGAIN: a preempted thread may find
        // the data there (see io::ops's cold_decision). Only a cold probe
        // that never reports the miss is a failure.
        let mut cold = None;
        for _ in 0..10 {
            if !evict(&f) {
                break;
            }
            cold = Some(probe(&f, 10, COPY_MAX));
            if cold == Some(Answer::Copied(false)) {
                break;
            }
        }
        assert!(cold.is_none_or(|a| a == Answer::Copied(false)), "{cold:?}");
    }

    #[test]
    fn changed_file_is_mapped_again_and_the_cache_is_bounded() {
        init();
        if pagemap().is_none() {
            return;
        }
        forget_all();
        let tf = make_file("grow", 200_000);
        let f = open(&tf.0);
        warm(&f);
        assert!(probe(&f, 0, 200_000).resident());
        assert_eq!(probe(&f, 0, 200_000), Answer::Mapped);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&tf.0)
            .and_then(|mut w| w.write_all(&[7u8; 300_000]))
            .expect("append");
        let g = open(&tf.0);
        assert_eq!(g.meta.size, 500_000);
        warm(&g);
        // New size: a new mapping, whose entries start absent.
        assert_eq!(probe(&g, 0, 500_000), Answer::Copied(true));
        assert_eq!(probe(&g, 0, 500_000), Answer::Mapped);
        assert_eq!(mapped_files(), 1);

        let files: Vec<TestFile> = (0..MAX_MAPS + 6)
            .map(|i| make_file(&format!("many{i}"), 2 * COPY_MAX as usize))
            .collect();
        for t in &files {
            let f = open(&t.0);
            warm(&f);
            assert!(probe(&f, 0, f.meta.size).resident());
            assert!(mapped_files() <= MAX_MAPS);
        }
        assert_eq!(mapped_files(), MAX_MAPS);
        forget_all();
        assert_eq!(mapped_files(), 0);
    }
}
