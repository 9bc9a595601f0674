//! `open_file_cache*`: cached descriptors are served until
//! `open_file_cache_valid` expires, then the file on disk wins; errors are
//! cached only with `open_file_cache_errors on`; `max`, `inactive` and
//! `min_uses` bound the descriptors the server holds (counted in
//! /proc/PID/fd of the tern process).
//!
//! Each test first shows the cache at work (the old file is still served
//! right after the change), so a server without a cache fails it too.
use std::time::{Duration, Instant};

use crate::harness::*;

/// A server whose `http` level has `directives`, root `html`.
fn server(p: Prefix, directives: &str) -> Server {
    Server::start_in(
        p,
        &format!(
            "http {{ access_log off; {directives} server {{ listen 127.0.0.1:@PORT@; root html; \
             location /on/ {{ open_file_cache_errors on; }} }} }}"
        ),
    )
}

/// Short validity, so the tests wait about a second per change.
const VALID_1S: &str = "open_file_cache max=100 inactive=60s; open_file_cache_valid 1s;";

/// Polls `path` until `ok` holds; fails after 5 s. Returns the time it took.
fn until(s: &Server, path: &str, what: &str, ok: impl Fn(&Resp) -> bool) -> Duration {
    let t = Instant::now();
    loop {
        let r = s.get(path);
        if ok(&r) {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{path}: still {} {:?}, wanted {what}",
            r.status,
            r.body_str()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Rewrites `f` in place with `data`, then puts its old mtime back (the
/// size stays if `data` is as long: only the ctime tells).
fn rewrite_keeping_mtime(f: &std::path::Path, data: &str) -> std::time::SystemTime {
    let mtime = std::fs::metadata(f).unwrap().modified().unwrap();
    std::fs::write(f, data).unwrap();
    std::fs::File::options()
        .write(true)
        .open(f)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    mtime
}

fn body_is(want: &'static str) -> impl Fn(&Resp) -> bool {
    move |r: &Resp| r.status == 200 && r.body == want.as_bytes()
}

#[test]
fn file_modified_in_place_is_served_in_full_after_valid() {
    let p = Prefix::new();
    let f = p.write("html/m.txt", "v1");
    let s = server(p, VALID_1S);
    let r1 = s.get("/m.txt");
    assert_eq!((r1.status, r1.body.as_slice()), (200, &b"v1"[..]));
    // Same inode, new size: within `valid` the cached size and ETag stay.
    std::fs::write(&f, "version two").unwrap();
    let r2 = s.get("/m.txt");
    assert_eq!(r2.header("Content-Length"), Some("2"), "cached size");
    assert_eq!(r2.header("ETag"), r1.header("ETag"));
    until(&s, "/m.txt", "the new content", body_is("version two"));
    let r3 = s.get("/m.txt");
    assert_eq!(r3.header("Content-Length"), Some("11"));
    assert_ne!(r3.header("ETag"), r1.header("ETag"));
}

/// tern keeps the bytes of small cached files (no read per hit); a rewrite
/// that keeps size and mtime must still be noticed once `valid` expires
/// (the status-change time gives it away).
#[test]
fn small_file_rewritten_with_its_old_mtime_is_served_new_after_valid() {
    let p = Prefix::new();
    let f = p.write("html/s.txt", "aaaa");
    let s = server(p, VALID_1S);
    assert_eq!(s.get("/s.txt").body, b"aaaa");
    assert_eq!(s.get("/s.txt").body, b"aaaa");
    let mtime = rewrite_keeping_mtime(&f, "bbbb");
    assert_eq!(std::fs::metadata(&f).unwrap().modified().unwrap(), mtime);
    until(&s, "/s.txt", "the new bytes", body_is("bbbb"));
    let r = s.get("/s.txt");
    assert_eq!(r.header("Content-Length"), Some("4"));
}

#[test]
fn file_replaced_by_rename_is_served_new_after_valid() {
    let p = Prefix::new();
    p.write("html/r.txt", "old file");
    let s = server(p, VALID_1S);
    assert_eq!(s.get("/r.txt").body, b"old file");
    s.prefix.write("html/r.txt.tmp", "the new file");
    std::fs::rename(s.prefix.path("html/r.txt.tmp"), s.prefix.path("html/r.txt")).unwrap();
    // The cached descriptor still describes the old inode, whole.
    let r = s.get("/r.txt");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"old file"[..]));
    assert_eq!(r.header("Content-Length"), Some("8"));
    let took = until(&s, "/r.txt", "the new file", |r| {
        // Never a mix: either all old or all new.
        assert!(
            r.body == b"old file" || r.body == b"the new file",
            "mixed: {:?}",
            r.body_str()
        );
        r.body == b"the new file"
    });
    assert!(took > Duration::from_millis(500), "not cached: {took:?}");
    assert_eq!(s.get("/r.txt").header("Content-Length"), Some("12"));
}

#[test]
fn file_deleted_then_recreated() {
    let p = Prefix::new();
    p.write("html/d.txt", "first");
    let s = server(p, VALID_1S);
    assert_eq!(s.get("/d.txt").body, b"first");
    std::fs::remove_file(s.prefix.path("html/d.txt")).unwrap();
    // Still served from the cached (unlinked) descriptor...
    assert_eq!(s.get("/d.txt").body, b"first");
    // ...until `valid` expires: then the deletion shows.
    until(&s, "/d.txt", "404", |r| r.status == 404);
    // Errors are not cached by default: a new file shows at once.
    s.prefix.write("html/d.txt", "second one");
    let r = s.get("/d.txt");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"second one"[..]));
    // Deleted and recreated within `valid`: the new inode after it.
    std::fs::remove_file(s.prefix.path("html/d.txt")).unwrap();
    s.prefix.write("html/d.txt", "third");
    assert_eq!(s.get("/d.txt").body, b"second one");
    until(&s, "/d.txt", "the recreated file", body_is("third"));
}

#[test]
fn directory_turned_into_a_file() {
    let p = Prefix::new();
    std::fs::create_dir_all(p.path("html/x")).unwrap();
    let s = server(p, VALID_1S);
    assert_eq!(s.get("/x").status, 301);
    std::fs::remove_dir(s.prefix.path("html/x")).unwrap();
    s.prefix.write("html/x", "now a file");
    assert_eq!(s.get("/x").status, 301, "the directory is cached");
    until(&s, "/x", "the file", body_is("now a file"));
    // And back: the file's entry turns into a directory.
    std::fs::remove_file(s.prefix.path("html/x")).unwrap();
    std::fs::create_dir_all(s.prefix.path("html/x")).unwrap();
    assert_eq!(s.get("/x").body, b"now a file");
    until(&s, "/x", "301", |r| r.status == 301);
}

#[test]
fn errors_cached_only_with_open_file_cache_errors() {
    let p = Prefix::new();
    std::fs::create_dir_all(p.path("html/on")).unwrap();
    let s = server(p, VALID_1S);
    // Location /on/ has `open_file_cache_errors on`.
    assert_eq!(s.get("/on/late.txt").status, 404);
    s.prefix.write("html/on/late.txt", "late");
    assert_eq!(s.get("/on/late.txt").status, 404, "the 404 is cached");
    let took = until(&s, "/on/late.txt", "200", body_is("late"));
    assert!(
        took > Duration::from_millis(500),
        "404 not cached: {took:?}"
    );
    // Elsewhere errors are not cached.
    assert_eq!(s.get("/late.txt").status, 404);
    s.prefix.write("html/late.txt", "late too");
    assert_eq!(s.get("/late.txt").body, b"late too");
}

/// Descriptors of the tern process.
fn fds(s: &Server) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", s.pid()))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Waits until the fd count is `want` (closing sockets settle
/// asynchronously); fails showing the last count.
fn fds_settle(s: &Server, want: usize, what: &str) {
    let t = Instant::now();
    loop {
        let n = fds(s);
        if n == want {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{what}: {n} descriptors, wanted {want}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The fd count with the server idle and nothing cached.
fn baseline(s: &Server) -> usize {
    let mut last = fds(s);
    let mut stable = 0;
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(25));
        let n = fds(s);
        stable = if n == last { stable + 1 } else { 0 };
        last = n;
        if stable >= 8 {
            break;
        }
    }
    last
}

#[test]
fn eviction_at_max_closes_descriptors() {
    let p = Prefix::new();
    for i in 0..20 {
        p.write(&format!("html/f{i}"), format!("file {i}"));
    }
    let s = server(p, "open_file_cache max=4 inactive=60s;");
    let base = baseline(&s);
    for i in 0..3 {
        assert_eq!(s.get(&format!("/f{i}")).status, 200);
    }
    fds_settle(&s, base + 3, "3 files cached");
    for i in 3..20 {
        assert_eq!(
            s.get(&format!("/f{i}")).body,
            format!("file {i}").as_bytes()
        );
    }
    fds_settle(&s, base + 4, "max=4 after 20 files");
    // Hits on cached files open nothing new.
    for i in 16..20 {
        s.get(&format!("/f{i}"));
    }
    fds_settle(&s, base + 4, "hits");
}

/// Without a cache, each worker keeps its last few files open and checks
/// them with a `stat` of the path (`src/io/reuse.rs`): the next request
/// must see every change at once, as with an open per request.
#[test]
fn without_cache_every_change_is_served_at_once() {
    let p = Prefix::new();
    let f = p.write("html/c.txt", "aaaa");
    let s = Server::start_in(
        p,
        "http { access_log off; server { listen 127.0.0.1:@PORT@; root html; } }",
    );
    assert_eq!(s.get("/c.txt").body, b"aaaa");
    assert_eq!(s.get("/c.txt").body, b"aaaa");
    // Same inode, same size, old mtime put back: ctime still moves.
    rewrite_keeping_mtime(&f, "bbbb");
    assert_eq!(s.get("/c.txt").body, b"bbbb");
    // Longer, in place.
    std::fs::write(&f, "cccccc").unwrap();
    let r = s.get("/c.txt");
    assert_eq!(
        (r.body.as_slice(), r.header("Content-Length")),
        (&b"cccccc"[..], Some("6"))
    );
    // Replaced by rename.
    s.prefix.write("html/c.tmp", "renamed over");
    std::fs::rename(s.prefix.path("html/c.tmp"), &f).unwrap();
    assert_eq!(s.get("/c.txt").body, b"renamed over");
    // Deleted, then recreated.
    std::fs::remove_file(&f).unwrap();
    assert_eq!(s.get("/c.txt").status, 404);
    s.prefix.write("html/c.txt", "again");
    assert_eq!(s.get("/c.txt").body, b"again");
    // Turned into a directory.
    std::fs::remove_file(&f).unwrap();
    std::fs::create_dir(&f).unwrap();
    assert_eq!(s.get("/c.txt").status, 301);
}

/// The files kept without a cache are closed once idle (about a second).
#[test]
fn cache_off_holds_no_descriptors() {
    let p = Prefix::new();
    for i in 0..5 {
        p.write(&format!("html/f{i}"), "x");
    }
    let s = Server::start_in(
        p,
        "http { access_log off; open_file_cache max=4; \
         server { listen 127.0.0.1:@PORT@; root html; } \
         server { listen 127.0.0.1:@PORT@; server_name off.test; root html; \
         open_file_cache off; } }",
    );
    let base = baseline(&s);
    for i in 0..5 {
        let req = format!("GET /f{i} HTTP/1.1\r\nHost: off.test\r\nConnection: close\r\n\r\n");
        assert!(s.raw(req.as_bytes()).starts_with(b"HTTP/1.1 200"));
    }
    fds_settle(&s, base, "no cache in server off.test");
    s.get("/f0");
    fds_settle(&s, base + 1, "the default server caches");
}

#[test]
fn inactive_entries_are_dropped() {
    let p = Prefix::new();
    for i in 0..6 {
        p.write(&format!("html/f{i}"), "x");
    }
    let s = server(p, "open_file_cache max=100 inactive=1s;");
    let base = baseline(&s);
    for i in 0..5 {
        s.get(&format!("/f{i}"));
    }
    fds_settle(&s, base + 5, "5 cached");
    std::thread::sleep(Duration::from_millis(2300));
    // Expiry is lazy (as nginx): the next lookup sweeps.
    s.get("/f5");
    fds_settle(&s, base + 1, "inactive ones dropped");
}

#[test]
fn min_uses_keeps_a_descriptor_only_after_n_uses() {
    let p = Prefix::new();
    p.write("html/a", "a");
    let s = server(p, "open_file_cache max=10; open_file_cache_min_uses 3;");
    let base = baseline(&s);
    s.get("/a");
    s.get("/a");
    fds_settle(&s, base, "used twice: not kept");
    s.get("/a");
    fds_settle(&s, base + 1, "third use: kept");
}

#[test]
fn reload_keeps_an_unchanged_cache() {
    let p = Prefix::new();
    p.write("html/k.txt", "before");
    let conf = |max: u32, gen: &str| {
        format!(
            "http {{\naccess_log off; open_file_cache max={max};\nserver {{ listen 127.0.0.1:@PORT@; root html; \
             location = /gen {{ return 200 \"{gen}\"; }} }}\n}}\n"
        )
    };
    let s = Server::start_in(p, &conf(10, "one"));
    assert_eq!(s.get("/k.txt").body, b"before");
    s.prefix.write("html/k.tmp", "after!");
    std::fs::rename(s.prefix.path("html/k.tmp"), s.prefix.path("html/k.txt")).unwrap();
    // Same directive, same parameters: the cache (and the old file) stays.
    s.rewrite_conf(&conf(10, "two"), s.port);
    s.signal(SIGHUP);
    until(&s, "/gen", "reloaded", |r| r.body == b"two");
    assert_eq!(s.get("/k.txt").body, b"before");
    // Changed parameters: a new, empty cache.
    s.rewrite_conf(&conf(11, "three"), s.port);
    s.signal(SIGHUP);
    until(&s, "/gen", "reloaded", |r| r.body == b"three");
    assert_eq!(s.get("/k.txt").body, b"after!");
}

#[test]
fn config_errors_name_the_parameter() {
    let p = Prefix::new();
    for (conf, want) in [
        (
            "open_file_cache max=0;",
            "invalid \"open_file_cache\" parameter \"max=0\"",
        ),
        (
            "open_file_cache inactive=5s;",
            "\"open_file_cache\" must have the \"max\" parameter",
        ),
        (
            "open_file_cache_valid soon;",
            "\"open_file_cache_valid\" directive invalid value",
        ),
        (
            "open_file_cache max=1 inactive=1s extra;",
            "invalid number of arguments in \"open_file_cache\" directive",
        ),
    ] {
        let t = p.write(
            "conf/t.conf",
            format!("events {{}} http {{ {conf} open_file_cache_events on; }}"),
        );
        let out = p.run(&["-t", "-c", &t.to_string_lossy()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{conf}: accepted");
        assert!(err.contains(want), "{conf}: {err}");
    }
}
