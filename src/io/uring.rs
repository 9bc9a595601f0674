//! `aio on`: asynchronous file I/O with io_uring.
//!
//! # Cost model
//!
//! One ring per worker thread (created on first use, thread-local), and one
//! small completion thread per ring (`tern-uring`) that sleeps in
//! `io_uring_enter(GETEVENTS)` and hands each result back to the waiting
//! request through a `tokio::sync::oneshot`. Submitting is a lock-free
//! ring push plus one `io_uring_enter` on the worker: it never waits for
//! the disk. The kernel runs reads that miss the page cache in its own
//! async workers, so a ring can have hundreds of cold reads in flight
//! without one tern thread per read, and buffered reads keep filling the
//! page cache (which Linux native AIO, nginx's `aio on`, could not: it
//! forces O_DIRECT, seed 000). A completion costs one cross-thread wake,
//! like a pool hand-off, which is why [`super::ops`] still reads resident
//! data inline with `RWF_NOWAIT` and only submits what would block.
//!
//! The buffer and the file of an operation are owned by the ring until the
//! kernel completes it, so a request that is aborted mid-read (its future
//! dropped) cannot free memory the kernel is still writing to.
//!
//! [`available`] probes once per process whether the kernel allows
//! io_uring (it may be compiled out or disabled by
//! `kernel.io_uring_disabled`); when it does not, `aio on` is served by the
//! `default` thread pool and a notice is logged once. Setting the
//! environment variable `TERN_NO_IO_URING=1` forces that fallback (tests).

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use io_uring::{opcode, squeue, types, IoUring};
use tokio::sync::oneshot;

use super::stats::{bump, STATS};

/// Submission queue size of each ring; a full queue is flushed and retried.
const ENTRIES: u32 = 256;
/// `user_data` of the NOP that tells the completion thread to stop.
const STOP: u64 = u64::MAX;
/// `io_uring_enter` flag: wait for completions.
const IORING_ENTER_GETEVENTS: u32 = 1;
/// Longest single read/write (the kernel's `MAX_RW_COUNT` is just below 2 GiB).
pub const MAX_OP: usize = 1 << 30;

static AVAILABLE: OnceLock<bool> = OnceLock::new();

/// Whether io_uring can be used in this process (probed once).
pub fn available() -> bool {
    *AVAILABLE.get_or_init(|| {
        if std::env::var_os("TERN_NO_IO_URING").is_some_and(|v| !v.is_empty() && v != "0") {
            return false;
        }
        IoUring::new(2).is_ok()
    })
}

/// What the completion thread sends back: the result (`res` of the CQE)
/// and whatever the operation kept alive (its buffer).
type Done = (i32, Box<dyn Any + Send>);

struct Op {
    /// Buffer, path, file: everything the kernel may touch until completion.
    keep: Box<dyn Any + Send>,
    tx: oneshot::Sender<Done>,
}

struct Ring {
    ring: IoUring,
    /// Serialises submission-queue access (the worker thread is the only
    /// submitter in practice; the lock makes it sound regardless).
    sq: Mutex<()>,
    ops: Mutex<HashMap<u64, Op>>,
    next: AtomicU64,
    dead: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ring {
    fn start() -> io::Result<Arc<Ring>> {
        let r = Arc::new(Ring {
            ring: IoUring::new(ENTRIES)?,
            sq: Mutex::new(()),
            ops: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            dead: AtomicBool::new(false),
        });
        let c = Arc::clone(&r);
        std::thread::Builder::new()
            .name("tern-uring".into())
            .spawn(move || c.complete_loop())?;
        Ok(r)
    }

    /// Pushes one SQE and submits it. `entry` must only reference memory
    /// owned by `keep` (or `'static`).
    fn submit(
        &self,
        entry: squeue::Entry,
        keep: Box<dyn Any + Send>,
    ) -> io::Result<oneshot::Receiver<Done>> {
        if self.dead.load(Ordering::Relaxed) {
            return Err(io::Error::other("io_uring completion thread is gone"));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.ops).insert(id, Op { keep, tx });
        let entry = entry.user_data(id);
        if let Err(e) = self.push(&entry) {
            lock(&self.ops).remove(&id);
            return Err(e);
        }
        bump(&STATS.uring_submissions);
        Ok(rx)
    }

    fn push(&self, entry: &squeue::Entry) -> io::Result<()> {
        let _g = lock(&self.sq);
        loop {
            // SAFETY: the only SubmissionQueue of this ring is created here,
            // under `self.sq`, and dropped before the lock is released. The
            // entry's pointers stay valid until completion: they point into
            // the `keep` box stored in `self.ops` before this push.
            let pushed = unsafe {
                let mut sq = self.ring.submission_shared();
                let r = sq.push(entry);
                sq.sync();
                r
            };
            match pushed {
                Ok(()) => break,
                // Full: hand what is queued to the kernel, then retry.
                Err(_) => {
                    self.ring.submitter().submit()?;
                }
            }
        }
        loop {
            match self.ring.submitter().submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // EAGAIN/EBUSY: the kernel is short of resources or the CQ
                // is backed up; the SQE stays queued and goes with the next
                // enter (the completion thread's, at the latest).
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) => {
                    return Ok(())
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn complete_loop(&self) {
        let mut stopping = false;
        loop {
            if stopping && lock(&self.ops).is_empty() {
                return;
            }
            // SAFETY: plain io_uring_enter that submits nothing and waits for
            // one completion; no argument struct is passed.
            let r = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(0, 1, IORING_ENTER_GETEVENTS, None)
            };
            if let Err(e) = r {
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                ) {
                    continue;
                }
                crate::elog!(
                    Alert,
                    "io_uring_enter() failed ({}), aio on requests fail",
                    e
                );
                self.dead.store(true, Ordering::Relaxed);
                // Dropping the senders fails every waiting request.
                lock(&self.ops).clear();
                return;
            }
            // SAFETY: this thread is the only consumer of the completion queue.
            let cq = unsafe { self.ring.completion_shared() };
            for cqe in cq {
                let id = cqe.user_data();
                if id == STOP {
                    stopping = true;
                    continue;
                }
                if let Some(op) = lock(&self.ops).remove(&id) {
                    // The request may be gone: then `keep` is freed here,
                    // and a descriptor opened for it is closed.
                    if let Err((res, keep)) = op.tx.send((cqe.result(), op.keep)) {
                        if res >= 0 && keep.is::<OpenKeep>() {
                            // SAFETY: a fresh descriptor from the kernel
                            // that nothing else owns; closed once.
                            drop(unsafe { File::from_raw_fd(res as RawFd) });
                        }
                    }
                }
            }
        }
    }
}

/// The thread-local handle; dropping it (thread exit) stops the completion
/// thread once the ring's operations are done.
struct Local(Arc<Ring>);

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.0.push(&opcode::Nop::new().build().user_data(STOP));
    }
}

thread_local! {
    static RING: RefCell<Option<Local>> = const { RefCell::new(None) };
}

fn ring() -> io::Result<Arc<Ring>> {
    RING.with(|r| {
        let mut r = r.borrow_mut();
        if let Some(l) = r.as_ref().filter(|l| !l.0.dead.load(Ordering::Relaxed)) {
            return Ok(Arc::clone(&l.0));
        }
        let ring = Ring::start()?;
        *r = Some(Local(Arc::clone(&ring)));
        Ok(ring)
    })
}

fn result(res: i32) -> io::Result<usize> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}

/// What a read keeps alive: the buffer and the owner of the descriptor.
struct ReadKeep<F: Send + 'static> {
    buf: Vec<u8>,
    _owner: F,
}

/// One `IORING_OP_READ` of `len` bytes at `offset` of `fd` into
/// `buf[at..at+len]`. `owner` keeps `fd` open until the kernel is done.
/// Returns the buffer and the bytes read (may be short at EOF).
pub async fn read<F: Send + 'static>(
    owner: F,
    fd: RawFd,
    mut buf: Vec<u8>,
    at: usize,
    len: usize,
    offset: u64,
) -> (Vec<u8>, io::Result<usize>) {
    let len = len.min(MAX_OP).min(buf.len().saturating_sub(at));
    // The heap block does not move when the Vec is moved into the box.
    let ptr = buf[at..].as_mut_ptr();
    let entry = opcode::Read::new(types::Fd(fd), ptr, len as u32)
        .offset(offset)
        .build();
    let keep: Box<dyn Any + Send> = Box::new(ReadKeep { buf, _owner: owner });
    let rx = match ring().and_then(|r| r.submit(entry, keep)) {
        Ok(rx) => rx,
        Err(e) => return (Vec::new(), Err(e)),
    };
    match rx.await {
        Ok((res, keep)) => match keep.downcast::<ReadKeep<F>>() {
            Ok(k) => (k.buf, result(res)),
            Err(_) => (
                Vec::new(),
                Err(io::Error::other("io_uring: wrong completion")),
            ),
        },
        Err(_) => (
            Vec::new(),
            Err(io::Error::other("io_uring completion thread is gone")),
        ),
    }
}

/// Reads until `buf[at..at+len]` is full or EOF (a buffered read is short
/// only at EOF or on a signal); returns the buffer and the bytes read.
pub async fn read_full<F: Clone + Send + 'static>(
    owner: F,
    fd: RawFd,
    mut buf: Vec<u8>,
    at: usize,
    len: usize,
    offset: u64,
) -> (Vec<u8>, io::Result<usize>) {
    let mut done = 0;
    while done < len {
        let (b, r) = read(
            owner.clone(),
            fd,
            buf,
            at + done,
            len - done,
            offset + done as u64,
        )
        .await;
        buf = b;
        match r {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e)
                if e.raw_os_error() == Some(libc::EINTR)
                    || e.raw_os_error() == Some(libc::EAGAIN) => {}
            Err(e) => return (buf, Err(e)),
        }
    }
    (buf, Ok(done))
}

/// `IORING_OP_WRITE` of all of `data` at `offset` of `file`.
pub async fn write_all(file: Arc<File>, data: bytes::Bytes, offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut done = 0usize;
    while done < data.len() {
        let chunk = data.slice(done..data.len().min(done + MAX_OP));
        let fd = file.as_raw_fd();
        let entry = opcode::Write::new(types::Fd(fd), chunk.as_ptr(), chunk.len() as u32)
            .offset(offset + done as u64)
            .build();
        let keep: Box<dyn Any + Send> = Box::new((chunk, Arc::clone(&file)));
        let rx = ring()?.submit(entry, keep)?;
        let (res, _keep) = rx
            .await
            .map_err(|_| io::Error::other("io_uring completion thread is gone"))?;
        match result(res) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => done += n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What an open keeps alive; also marks its result as a descriptor to
/// close if the request went away before the open completed.
struct OpenKeep(#[allow(dead_code)] CString);

/// `IORING_OP_OPENAT(AT_FDCWD, path, flags)`.
pub async fn open(path: CString, flags: libc::c_int) -> io::Result<File> {
    let entry = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
        .flags(flags | libc::O_CLOEXEC)
        .build();
    let keep: Box<dyn Any + Send> = Box::new(OpenKeep(path));
    let rx = ring()?.submit(entry, keep)?;
    let (res, _keep) = rx
        .await
        .map_err(|_| io::Error::other("io_uring completion thread is gone"))?;
    let fd = result(res)?;
    // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::test_files::rt;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn reads_writes_and_opens_through_the_ring() {
        if !available() {
            eprintln!("io_uring not available here; skipping");
            return;
        }
        let path = std::env::temp_dir().join(format!("tern-uring-{}", std::process::id()));
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(&data))
            .expect("create");
        let before = STATS.snapshot().uring_submissions;
        rt().block_on(async {
            let c = CString::new(path.to_string_lossy().as_bytes()).expect("cstring");
            let f = Arc::new(open(c, libc::O_RDWR).await.expect("uring open"));
            let fd = f.as_raw_fd();
            let (buf, r) = read_full(Arc::clone(&f), fd, vec![0u8; 70_000], 10, 69_990, 5).await;
            assert_eq!(r.expect("read"), 69_990);
            assert_eq!(&buf[10..], &data[5..69_995]);
            // Short at EOF.
            let (buf, r) = read_full(Arc::clone(&f), fd, vec![0u8; 100], 0, 100, 99_950).await;
            assert_eq!(r.expect("read eof"), 50);
            assert_eq!(&buf[..50], &data[99_950..]);
            write_all(Arc::clone(&f), bytes::Bytes::from_static(b"XYZ"), 1)
                .await
                .expect("write");
            let e = open(CString::new("/nonexistent/x").expect("c"), libc::O_RDONLY).await;
            assert_eq!(
                e.map(|_| ()).map_err(|e| e.kind()),
                Err(io::ErrorKind::NotFound)
            );
        });
        assert!(STATS.snapshot().uring_submissions >= before + 5);
        let back = std::fs::read(&path).expect("read back");
        assert_eq!(&back[..5], &[data[0], b'X', b'Y', b'Z', data[4]]);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn dropped_read_future_is_harmless() {
        if !available() {
            return;
        }
        let f = Arc::new(std::fs::File::open("/proc/self/exe").expect("open"));
        rt().block_on(async {
            let fd = f.as_raw_fd();
            let fut = read(Arc::clone(&f), fd, vec![0u8; 1 << 20], 0, 1 << 20, 0);
            // Poll once then drop: the ring keeps the buffer until the CQE.
            let _ = tokio::time::timeout(std::time::Duration::from_nanos(1), fut).await;
            let (_, r) = read(Arc::clone(&f), fd, vec![0u8; 16], 0, 16, 0).await;
            assert_eq!(r.expect("read"), 16);
        });
    }
}
