//! Thin, safe wrappers over the Linux syscalls that `std` does not offer:
//! `preadv2(RWF_NOWAIT)`, `openat2(RESOLVE_CACHED)`, `cachestat`,
//! `mincore`, `sendfile`, `posix_fadvise`.
//!
//! Every `unsafe` block in the I/O layer lives here. Each wrapper takes safe
//! Rust types (a `File`, a slice) whose lifetimes guarantee the fd and the
//! memory stay valid for the duration of the call, and turns `-1`/`errno`
//! into `io::Error`. Which syscalls the running kernel lacks is remembered
//! in process-wide flags so a missing one is tried once, not per request.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// `cachestat(2)` syscall number (Linux 6.5+). It is 451 on every
/// architecture that uses the generic syscall table and on x86_64.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const SYS_CACHESTAT: libc::c_long = 451;

/// `openat2(2)` syscall number (Linux 5.6+), the same on all architectures.
const SYS_OPENAT2: libc::c_long = 437;

/// `RESOLVE_CACHED` (Linux 5.12+): fail with EAGAIN rather than touch the disk.
const RESOLVE_CACHED: u64 = 0x20;

static NO_CACHESTAT: AtomicBool = AtomicBool::new(false);
static NO_OPENAT2_CACHED: AtomicBool = AtomicBool::new(false);
static NO_RWF_NOWAIT: AtomicBool = AtomicBool::new(false);

fn cvt(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

pub fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// Kernel ABI of `struct open_how`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Outcome of a non-blocking attempt.
#[derive(Debug)]
pub enum Nowait<T> {
    /// Done without blocking.
    Done(T),
    /// The kernel would have had to wait for the disk.
    WouldBlock,
    /// This kernel/filesystem cannot tell: the caller must choose blindly.
    Unsupported,
}

/// `openat2(AT_FDCWD, path, flags, RESOLVE_CACHED)`: opens only if the whole
/// path lookup can be served from the dentry cache.
pub fn open_cached(path: &Path, flags: libc::c_int) -> io::Result<Nowait<File>> {
    if NO_OPENAT2_CACHED.load(Ordering::Relaxed) {
        return Ok(Nowait::Unsupported);
    }
    let c = cpath(path)?;
    let how = OpenHow {
        flags: flags as u64,
        mode: 0,
        resolve: RESOLVE_CACHED,
    };
    // SAFETY: `c` is a NUL-terminated string and `how` a properly laid out
    // `struct open_how`, both alive across the call; the size passed is its size.
    let r = unsafe {
        libc::syscall(
            SYS_OPENAT2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(Nowait::WouldBlock),
            // ENOSYS: no openat2; EINVAL: no RESOLVE_CACHED (5.6..5.11).
            Some(libc::ENOSYS) | Some(libc::EINVAL) => {
                NO_OPENAT2_CACHED.store(true, Ordering::Relaxed);
                Ok(Nowait::Unsupported)
            }
            _ => Err(e),
        };
    }
    // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
    Ok(Nowait::Done(unsafe { File::from_raw_fd(r as RawFd) }))
}

/// Plain blocking `open(path, flags)`.
pub fn open(path: &Path, flags: libc::c_int) -> io::Result<File> {
    let c = cpath(path)?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `preadv2(fd, buf, offset, RWF_NOWAIT)`: reads what is in the page cache.
/// `Done(n)` may be short (partly cached, or EOF).
pub fn pread_nowait(file: &File, buf: &mut [u8], offset: u64) -> io::Result<Nowait<usize>> {
    if NO_RWF_NOWAIT.load(Ordering::Relaxed) {
        return Ok(Nowait::Unsupported);
    }
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `iov` describes `buf`, which is exclusively borrowed for the
    // call; the fd is kept open by `file`.
    let r = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, off, libc::RWF_NOWAIT) };
    match cvt(r) {
        Ok(n) => Ok(Nowait::Done(n)),
        Err(e) => match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(Nowait::WouldBlock),
            Some(libc::EOPNOTSUPP) => Ok(Nowait::Unsupported),
            Some(libc::ENOSYS) => {
                NO_RWF_NOWAIT.store(true, Ordering::Relaxed);
                Ok(Nowait::Unsupported)
            }
            _ => Err(e),
        },
    }
}

/// Page-cache residency of a byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// Every page of the range is in memory.
    Resident,
    /// At least one page would have to come from the disk.
    Cold,
}

/// Which mechanism answered a residency question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    Cachestat,
    Mincore,
}

const PAGE: u64 = 4096;

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        PAGE
    }
}

/// Is `[offset, offset+len)` of `file` (of size `size`) in the page cache?
/// Uses `cachestat(2)`; on ENOSYS falls back to `mincore(2)` over a
/// temporary mapping of the range.
pub fn residency(file: &File, offset: u64, len: u64, size: u64) -> io::Result<(Residency, Probe)> {
    let end = offset.saturating_add(len).min(size);
    if end <= offset {
        return Ok((Residency::Resident, Probe::Cachestat));
    }
    let ps = page_size();
    let first = offset / ps;
    let last = end.div_ceil(ps);
    let want = last - first;
    if !NO_CACHESTAT.load(Ordering::Relaxed) {
        match cachestat(file, first * ps, (last - first) * ps) {
            Ok(cached) => {
                let r = if cached >= want {
                    Residency::Resident
                } else {
                    Residency::Cold
                };
                return Ok((r, Probe::Cachestat));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                NO_CACHESTAT.store(true, Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
    mincore_range(file, first * ps, want, ps).map(|r| (r, Probe::Mincore))
}

/// Number of cached pages in the range (`nr_cache` of `struct cachestat`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn cachestat(file: &File, off: u64, len: u64) -> io::Result<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range { off, len };
    let mut st = Stat::default();
    // SAFETY: both structs match the kernel ABI and live across the call;
    // flags must be 0; the fd is kept open by `file`.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut st as *mut Stat,
            0u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.nr_cache)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn cachestat(_file: &File, _off: u64, _len: u64) -> io::Result<u64> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// [`residency`] through `mincore` only (tests the fallback).
#[cfg(test)]
pub fn mincore_residency(file: &File, offset: u64, len: u64, size: u64) -> io::Result<Residency> {
    let ps = page_size();
    let end = offset.saturating_add(len).min(size);
    let first = offset / ps;
    mincore_range(file, first * ps, end.div_ceil(ps) - first, ps)
}

fn mincore_range(file: &File, off: u64, pages: u64, ps: u64) -> io::Result<Residency> {
    let len =
        usize::try_from(pages * ps).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let moff =
        libc::off_t::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a fresh shared read-only mapping chosen by the kernel
    // (address NULL); no page is touched, so no fault can occur.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            moff,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut vec = vec![0u8; pages as usize];
    // SAFETY: `p` is the mapping of `len` bytes made above, and `vec` holds
    // one byte per page of it.
    let r = unsafe { libc::mincore(p, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmapping exactly the mapping made above; nothing references it.
    unsafe { libc::munmap(p, len) };
    if r < 0 {
        return Err(err);
    }
    Ok(if vec.iter().all(|b| b & 1 == 1) {
        Residency::Resident
    } else {
        Residency::Cold
    })
}

/// One `sendfile(2)` call; returns bytes sent (0 = EOF of the file).
/// EAGAIN comes back as `ErrorKind::WouldBlock`, as `try_io` expects.
pub fn sendfile(sock: RawFd, file: &File, offset: u64, count: usize) -> io::Result<usize> {
    let mut off =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `off` is a valid local; `file` keeps its fd open; `sock` is
    // a descriptor borrowed from a live socket object by the caller.
    let r = unsafe { libc::sendfile(sock, file.as_raw_fd(), &mut off, count) };
    cvt(r)
}

/// `posix_fadvise(fd, off, len, advice)` (tests evict files with it).
#[cfg(test)]
pub fn fadvise(file: &File, off: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
    let o = libc::off_t::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let l = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: no memory is passed; the fd is kept open by `file`.
    let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), o, l, advice) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Re-opens the file behind `file` with `O_DIRECT` (a separate open file
/// description, so toggling it never affects other readers of `file`).
pub fn reopen_direct(file: &File) -> io::Result<File> {
    let p = format!("/proc/self/fd/{}", file.as_raw_fd());
    open(
        Path::new(&p),
        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_DIRECT,
    )
}
