//! Descriptors kept between requests where `open_file_cache` is off.
//!
//! Without `open_file_cache`, nginx opens, `fstat`s and closes a file for
//! every request. On this project's test machine that costs ~2.0 µs of
//! kernel time for a cached 1 KiB file, against ~0.8 µs for a `stat` of
//! the same path (most of the difference is allocating and freeing the
//! open file description and its security hooks, not the path walk). So
//! each worker keeps the last [`MAX_KEPT`] regular files it opened for
//! [`open_reusing`], and answers the next open of the same path with a
//! `stat(path)`: when it names the same inode with the same attributes,
//! the kept [`OpenFile`] is what a new `open` + `fstat` would return.
//!
//! ```text
//!  open_reusing(path) --kept?--> stat(path) --same dev, ino, size, mtime,
//!        |                           |          ctime, mode, uid--> kept OpenFile
//!        no                     differs or fails
//!        v                           v
//!   ops::open (inline or offloaded by the location's aio) --> keep it (most recent first;
//!                                                             the oldest beyond MAX_KEPT goes)
//!   sweeper (one per worker, asleep while nothing is kept): drops what
//!   was not used for IDLE_MS
//! ```
//!
//! # Why this is the same as opening
//!
//! - Identity: the kept descriptor holds a reference to its inode, so the
//!   inode cannot be freed and its number cannot be given to another file
//!   while it is kept: an equal (dev, ino) is the same file. A path that
//!   now names another file (renamed over, deleted and recreated,
//!   a symlink pointed elsewhere, a mount on a parent) has another
//!   (dev, ino) and is opened anew.
//! - Attributes: size, mtime and ctime are compared too, so a file
//!   changed in place gets a new `OpenFile` (with the new size and ETag),
//!   as a new `fstat` would give. ctime also moves on `chmod`, `chown` and
//!   ACL changes, so a file made unreadable is opened again and fails as
//!   nginx's open would. Search permission along the path is checked by
//!   the `stat` walk exactly as by the `open` walk.
//! - Content: nothing is copied. Bytes are read through the descriptor
//!   when the response is sent, as through a new one
//!   ([`OpenFile::keep_content`] is never set on these).
//!
//! # Blocking
//!
//! The `stat` runs on the event loop. A kept descriptor pins the dentries
//! of its whole path in the dentry cache, so the walk is served from
//! memory unless the path changed since; a mismatch or error falls back
//! to [`ops::open`], which offloads a cold open as the location's `aio`
//! says. (Only a path changed *and* evicted from the dentry cache since
//! could make this one `stat` read a directory block inline.)
//!
//! # Deliberate difference
//!
//! A deleted file's disk space is given back when its kept descriptor
//! goes: at the next request for its path, or when the sweeper finds it
//! unused for [`IDLE_MS`]. With `open_file_cache` that takes `inactive`.

use std::cell::RefCell;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::ops::{self, Meta, OpenFile, Policy};
use super::stats::{bump, STATS};
use super::sys;

/// Files kept per worker. Small: a descriptor each, and a linear search.
pub const MAX_KEPT: usize = 32;

/// A kept file unused this long is closed by the sweeper.
pub const IDLE_MS: u64 = 1000;

struct Kept {
    path: Box<[u8]>,
    file: Arc<OpenFile>,
    used_ms: u64,
}

#[derive(Default)]
struct Table {
    /// Most recently used first.
    kept: Vec<Kept>,
    /// Told when the first file is kept (the sweeper sleeps until then).
    wake: Rc<Notify>,
}

thread_local! {
    static TABLE: RefCell<Table> = RefCell::default();
}

/// Whether a `stat` of the path says the kept file is still what the path names.
fn unchanged(m: &Meta, f: &OpenFile) -> bool {
    m.is_file && f.unchanged_by(m) && m.mode == f.meta.mode && m.uid == f.meta.uid
}

/// [`ops::open`] for a location without `open_file_cache`: the same
/// result, from a kept descriptor when the path still names its file.
pub async fn open_reusing(path: &Path, policy: &Policy) -> io::Result<Arc<OpenFile>> {
    let key = path.as_os_str().as_bytes();
    // Lookup, stat and update in one borrow: the stat is a plain
    // syscall, nothing awaits or touches the table meanwhile.
    let found = TABLE.with(|t| {
        let mut t = t.borrow_mut();
        let i = t.kept.iter().position(|k| *k.path == *key)?;
        if sys::stat(path).is_ok_and(|st| unchanged(&Meta::of_stat(&st), &t.kept[i].file)) {
            // Moved to the front (already there when the same file is
            // asked again and again: no shifting then).
            t.kept[..=i].rotate_right(1);
            let k = &mut t.kept[0];
            k.used_ms = sys::coarse_ms();
            Some(Ok(Arc::clone(&k.file)))
        } else {
            // Closed once the borrow ends.
            Some(Err(t.kept.remove(i)))
        }
    });
    match found {
        Some(Ok(file)) => {
            bump(&STATS.opens_reused);
            policy.inline();
            return Ok(file);
        }
        stale => drop(stale),
    }
    let file = ops::open(path, policy).await?;
    if !file.meta.is_dir {
        let _gone = TABLE.with(|t| {
            let mut t = t.borrow_mut();
            if t.kept.is_empty() {
                t.wake.notify_one();
            }
            // Another request may have kept the same path meanwhile (the
            // open above may have waited for a pool).
            let dup = t.kept.iter().position(|k| *k.path == *key);
            let old = dup.map(|i| t.kept.remove(i));
            t.kept.insert(
                0,
                Kept {
                    path: key.into(),
                    file: Arc::clone(&file),
                    used_ms: sys::coarse_ms(),
                },
            );
            let over = (t.kept.len() > MAX_KEPT).then(|| t.kept.pop());
            (old, over)
        });
    }
    Ok(file)
}

/// Closes this worker's kept files unused for [`IDLE_MS`]; runs for the
/// worker's life, asleep while nothing is kept.
pub async fn sweeper() {
    let wake = TABLE.with(|t| Rc::clone(&t.borrow().wake));
    loop {
        wake.notified().await;
        loop {
            tokio::time::sleep(Duration::from_millis(IDLE_MS)).await;
            if sweep(sys::coarse_ms()) == 0 {
                break;
            }
        }
    }
}

/// Drops kept files unused since `now - IDLE_MS`; returns how many are left.
fn sweep(now: u64) -> usize {
    let (_gone, left) = TABLE.with(|t| {
        let mut t = t.borrow_mut();
        let keep = t
            .kept
            .iter()
            .position(|k| now.saturating_sub(k.used_ms) >= IDLE_MS)
            .unwrap_or(t.kept.len());
        // Most recent first: everything from the first idle one on is idle.
        let gone = t.kept.split_off(keep);
        (gone, t.kept.len())
    });
    left
}

/// Closes every file this worker keeps (its descriptors are wanted for
/// connections: `accept` ran out of them).
pub fn drop_all() {
    let _gone = TABLE.with(|t| std::mem::take(&mut t.borrow_mut().kept));
}

/// Files kept by this thread now (tests).
#[cfg(test)]
fn kept_count() -> usize {
    TABLE.with(|t| t.borrow().kept.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::test_files::rt;
    use crate::io::Aio;
    use std::io::Write;

    fn write(path: &Path, data: &[u8]) {
        let mut f = std::fs::File::create(path).unwrap();
        f.write_all(data).unwrap();
    }

    #[test]
    fn kept_file_is_reused_until_the_path_changes() {
        let dir = tempfile_dir("reuse1");
        let p = dir.join("a.txt");
        write(&p, b"one");
        let policy = Policy::new(Aio::Off);
        rt().block_on(async {
            let a = open_reusing(&p, &policy).await.unwrap();
            let b = open_reusing(&p, &policy).await.unwrap();
            assert!(Arc::ptr_eq(&a, &b), "same file, same attributes: reused");

            // Replaced by rename: another inode.
            let tmp = dir.join("a.tmp");
            write(&tmp, b"two!");
            std::fs::rename(&tmp, &p).unwrap();
            let c = open_reusing(&p, &policy).await.unwrap();
            assert!(!Arc::ptr_eq(&b, &c));
            assert_eq!(c.meta.size, 4);

            // Rewritten in place: same inode, new size and ctime.
            write(&p, b"three");
            let d = open_reusing(&p, &policy).await.unwrap();
            assert!(!Arc::ptr_eq(&c, &d));
            assert_eq!(d.meta.size, 5);

            // Deleted: the open's error, not the kept file.
            std::fs::remove_file(&p).unwrap();
            let e = open_reusing(&p, &policy).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn table_is_bounded_and_swept() {
        let dir = tempfile_dir("reuse2");
        let policy = Policy::new(Aio::Off);
        rt().block_on(async {
            for i in 0..MAX_KEPT + 5 {
                let p = dir.join(format!("f{i}"));
                write(&p, b"x");
                open_reusing(&p, &policy).await.unwrap();
            }
            // A directory is never kept.
            open_reusing(&dir, &policy).await.unwrap();
        });
        assert_eq!(kept_count(), MAX_KEPT);
        assert_eq!(sweep(sys::coarse_ms()), MAX_KEPT, "all used just now");
        drop_all();
        assert_eq!(kept_count(), 0);
        rt().block_on(async {
            for i in 0..MAX_KEPT {
                open_reusing(&dir.join(format!("f{i}")), &policy)
                    .await
                    .unwrap();
            }
        });
        assert_eq!(sweep(sys::coarse_ms() + IDLE_MS), 0);
        assert_eq!(kept_count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tern-{}-{}", name, std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
