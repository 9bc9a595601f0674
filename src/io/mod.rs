//! The file-I/O layer: the only code in tern that may block on a disk, and
//! the place that decides, per call, whether it does.
//!
//! # Cost model
//!
//! A worker is one thread running a tokio `current_thread` loop; any
//! syscall that waits for the disk stalls every connection of that worker.
//! A hand-off to a pool thread costs a queue push, a wake-up and a
//! cross-thread completion (some microseconds); reading resident data costs
//! a memcpy. So tern asks the kernel first and offloads only what would
//! block (design decision 4):
//!
//! - reads: `preadv2(RWF_NOWAIT)` returns what is in the page cache without
//!   waiting; an EAGAIN or a short read sends the rest to the pool;
//! - `sendfile`: `cachestat(2)` (Linux 6.5+) tells whether the next chunk
//!   is resident; where it is refused (files the worker user neither owns
//!   nor may write) or missing, `resident.rs` asks the page tables of a
//!   mapping of the file, or copies the chunk with `RWF_NOWAIT`; a cold chunk is first read into the page
//!   cache by the pool, then sent inline, `sendfile_max_chunk` at a time
//!   with a yield between chunks so one fast client cannot hog the loop;
//! - `open`/`stat`: `openat2(RESOLVE_CACHED)` succeeds only from the
//!   dentry cache; a miss goes to the pool;
//! - `directio` reads always hit the disk, so they always go to the pool;
//! - temp-file writes go to the pool with `aio_write on`.
//!
//! With `aio off` everything runs inline, exactly like nginx's default.
//! `aio on` uses io_uring (one ring and one completion thread per worker
//! thread, see `uring.rs`) with the same inline-when-resident rule:
//! buffered reads keep the page cache; with `directio` the aligned middle
//! is read with O_DIRECT through the ring. Without io_uring in the kernel
//! it falls back to the `default` pool with a notice ([`take_uring_notice`]).
//!
//! # Data flow
//!
//! config -> [`DIRECTIVES`] fill [`IoMain`] (pools) and [`IoLoc`] (merged
//! per location) -> at start/reload [`Pools::start`]/[`Pools::reconcile`] ->
//! per request the HTTP side builds a [`Policy`] ([`Policy::from_loc`],
//! after expanding `aio threads=$var`) and calls [`open`], [`read`],
//! [`send_file`], [`write_at`]. Each call bumps a counter in [`STATS`] and
//! records its [`Decision`] in the policy (for `$tern_io`). Pool errors
//! (queue overflow, pool not found) come back as `io::Error` wrapping an
//! [`IoError`] whose text is nginx's; an overflow is logged here at
//! `error` level (as nginx does), the request then fails like nginx's: the
//! connection is closed (no 500: the status line may already be out).
//! With `error_log ... debug`, each request's decision is logged when its
//! [`Policy`] is dropped: `tern io: inline|offload|uring [pool "NAME"]`.

mod conf;
pub mod directives;
mod ops;
mod pool;
mod resident;
mod reuse;
mod stats;
mod sys;
#[cfg(test)]
mod test_files;
mod uring;

pub use conf::{
    AioConf, IoLoc, IoMain, PoolConf, DEFAULT_DIRECTIO_ALIGNMENT, DEFAULT_MAX_QUEUE,
    DEFAULT_OUTPUT_BUFFERS, DEFAULT_POOL, DEFAULT_SENDFILE_MAX_CHUNK, DEFAULT_THREADS,
};
pub use directives::DIRECTIVES;
pub use ops::{
    lstat, open, read, send_file, stat, take_uring_notice, write_at, Aio, Meta, OpenFile, Policy,
    SendSock, SMALL_CONTENT_MAX, URING_FALLBACK_NOTICE,
};
pub use pool::{set_thread_init, IoError, Pools, ThreadPool};
pub use reuse::{drop_all as drop_kept_files, open_reusing, sweeper as reuse_sweeper};
pub use stats::{Decision, IoStats, IoStatsSnapshot, PoolStats, STATS};
pub use sys::{coarse_ms, fs_available, nofile_limit};
pub use uring::available as uring_available;
