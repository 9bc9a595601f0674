//! A full disk under proxy_cache and proxy temp files: the cache and temp
//! directories are on a small tmpfs the test mounts in the prefix and
//! fills. A response that cannot be cached is still served whole
//! (uncached), a body that cannot spill to a temp file goes on through
//! memory at the client's pace (nginx cuts that response), each failure
//! is a `[crit] pwrite() ... failed (28: No space left on device)` line,
//! nothing half-written is stored, and once space is back the cache works
//! again without a restart.
//!
//! Skipped (with a message) where the test may not mount (not root).

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use crate::harness::*;
use crate::origin::Origin;

const SIZE: usize = 1 << 20;

fn body() -> Vec<u8> {
    (0..SIZE).map(|i| (i * 7 % 251) as u8).collect()
}

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system at `dir` until it refuses another byte.
fn fill(path: &std::path::Path) {
    let mut f = std::fs::File::create(path).unwrap();
    for size in [65536, 4096, 1] {
        let chunk = vec![0u8; size];
        while f.write_all(&chunk).is_ok() {}
    }
}

/// GET with `Connection: close`, waiting `pause` before reading (so the
/// proxy's memory buffers fill and it reaches for a temp file).
fn fetch(port: u16, path: &str, pause: Duration) -> (Resp, Vec<u8>) {
    let mut s = connect(port);
    s.write_all(
        format!(
            "GET {} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            path
        )
        .as_bytes(),
    )
    .unwrap();
    std::thread::sleep(pause);
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut data = Vec::new();
    let _ = s.read_to_end(&mut data);
    let r = Resp::parse(&data).expect("a response head");
    let at = find(&data, b"\r\n\r\n").unwrap() + 4;
    (r, data[at..].to_vec())
}

#[test]
fn full_disk_serves_uncached_and_recovers() {
    let p = Prefix::new();
    let disk = p.path("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m,mode=1777", "tmpfs"])
        .arg(&disk)
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    }
    let _mount = Mount(disk.clone());
    for d in ["cache", "temp"] {
        std::fs::create_dir(disk.join(d)).unwrap();
    }
    let origin = Origin::start(|_| {
        let mut r = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n",
            SIZE
        )
        .into_bytes();
        r.extend_from_slice(&body());
        Some(r)
    });
    let conf = format!(
        "http {{
             proxy_temp_path {d}/temp 1 2;
             proxy_cache_path {d}/cache levels=1:2 keys_zone=z:1m;
             server {{
                 listen 127.0.0.1:@PORT@;
                 add_header X-Cache-Status $upstream_cache_status always;
                 location /c/ {{
                     proxy_cache z;
                     proxy_cache_valid 200 10m;
                     proxy_pass http://127.0.0.1:{o}/;
                 }}
                 location /t/ {{
                     proxy_buffers 4 4k;
                     proxy_buffer_size 4k;
                     proxy_pass http://127.0.0.1:{o}/;
                 }}
             }}
             }}",
        d = disk.display(),
        o = origin.port
    );
    let srv = Server::start_in(p, &conf);
    let port = srv.port;
    let filler = disk.join("filler");
    fill(&filler);

    let (r, b) = fetch(port, "/c/obj", Duration::ZERO);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("X-Cache-Status"), Some("MISS"));
    assert!(
        b == body(),
        "through the cache, disk full: {} bytes",
        b.len()
    );
    let (r, b) = fetch(port, "/t/obj", Duration::from_millis(500));
    assert_eq!(r.status, 200);
    assert!(
        b == body(),
        "through temp files, disk full: {} bytes",
        b.len()
    );
    let log = srv.error_log();
    assert!(
        log.contains("[crit]")
            && log.contains("pwrite() \"")
            && log.contains("failed (28: No space left on device)"),
        "{}",
        log
    );
    // Nothing was stored from the failed write.
    let (r, b) = fetch(port, "/c/obj", Duration::ZERO);
    assert_eq!(r.header("X-Cache-Status"), Some("MISS"));
    assert!(b == body());

    std::fs::remove_file(&filler).unwrap();
    let (r, b) = fetch(port, "/c/obj", Duration::ZERO);
    assert_eq!(r.header("X-Cache-Status"), Some("MISS"));
    assert!(b == body());
    eventually(5, "the entry to be stored", || {
        let (r, b) = fetch(port, "/c/obj", Duration::ZERO);
        r.header("X-Cache-Status") == Some("HIT") && b == body()
    });
}
