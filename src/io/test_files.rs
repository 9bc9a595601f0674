//! Helpers of the I/O layer's unit tests: test files on a real disk
//! (tmpfs ignores `posix_fadvise(DONTNEED)`), removed when dropped, and a
//! worker-like runtime.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A file under /var/tmp, removed on drop.
pub struct TestFile(pub PathBuf);

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A `current_thread` runtime with I/O and timers, as a worker's.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Writes `len` bytes of a non-repeating pattern to a new file, synced to
/// disk, and returns it with its content.
pub fn make_file(tag: &str, len: usize) -> (TestFile, Vec<u8>) {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let path = PathBuf::from(format!(
        "/var/tmp/tern-io-{}-{}-{}",
        std::process::id(),
        tag,
        n
    ));
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut f = File::create(&path).expect("create test file");
    f.write_all(&data).expect("write test file");
    f.sync_all().expect("sync test file");
    (TestFile(path), data)
}
