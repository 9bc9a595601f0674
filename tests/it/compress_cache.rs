//! The compressed-file cache (`compress_cache*`, tern's own): static files
//! that gzip would compress are compressed once and served from memory
//! (or from the spill directory) with a Content-Length, until the file's
//! identity (dev, inode, size, mtime, ctime) changes.
use std::io::Read;
use std::time::SystemTime;

use crate::harness::*;

fn page(seed: u32, len: usize) -> Vec<u8> {
    let words = [
        "alpha ", "beta ", "<p>", "</p>", "gamma\n", "tern ", "nginx ",
    ];
    let mut out = Vec::new();
    let mut x = seed;
    while out.len() < len {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        out.extend_from_slice(words[(x >> 16) as usize % words.len()].as_bytes());
    }
    out.truncate(len);
    out
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut d = flate2::read::MultiGzDecoder::new(b);
    let mut out = Vec::new();
    d.read_to_end(&mut out).expect("valid gzip");
    out
}

fn get(s: &Server, path: &str, headers: &[&str]) -> Resp {
    let mut r = format!(
        "GET {} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n",
        path
    );
    for h in headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    Resp::parse(&s.raw(r.as_bytes())).expect("a response")
}

const AE: &str = "Accept-Encoding: gzip";

/// One counter of `tern_metrics`.
fn metric(s: &Server, name: &str) -> u64 {
    let r = get(s, "/metrics", &[]);
    let text = r.body_str();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{} not in {}", name, text))
}

const CONF: &str = "http { include /etc/nginx/mime.types; gzip on; gzip_vary on;
    gzip_types application/javascript;
    server { listen 127.0.0.1:@PORT@; root html;
      location = /metrics { tern_metrics; }
      location /off/ { alias html/; compress_cache off; }
    } }";

#[test]
fn second_request_is_a_hit_with_length_and_weak_etag() {
    let p = Prefix::new();
    let body = page(1, 20_000);
    p.write("html/a.html", &body);
    let s = Server::start_in(p, CONF);
    let plain = get(&s, "/a.html", &[]);
    assert_eq!(plain.body, body);
    let strong = plain.header("ETag").expect("etag").to_string();
    assert_eq!(plain.header("Vary"), Some("Accept-Encoding"));

    let r1 = get(&s, "/a.html", &[AE]);
    assert_eq!(r1.status, 200, "{}", r1.head);
    assert_eq!(r1.header("Content-Encoding"), Some("gzip"));
    assert_eq!(r1.header("Transfer-Encoding"), None, "{}", r1.head);
    assert_eq!(
        r1.header("Content-Length"),
        Some(r1.body.len().to_string().as_str())
    );
    assert_eq!(r1.header("ETag"), Some(format!("W/{}", strong).as_str()));
    assert_eq!(r1.header("Vary"), Some("Accept-Encoding"));
    assert_eq!(r1.header("Content-Type"), Some("text/html"));
    assert_eq!(r1.header("Last-Modified"), plain.header("Last-Modified"));
    assert_eq!(&r1.body[..10], b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\x03");
    assert_eq!(gunzip(&r1.body), body);
    assert_eq!(metric(&s, "tern_compress_cache_misses_total"), 1);
    assert_eq!(metric(&s, "tern_compress_cache_hits_total"), 0);

    let r2 = get(&s, "/a.html", &[AE]);
    assert_eq!(r2.body, r1.body);
    assert_eq!(metric(&s, "tern_compress_cache_hits_total"), 1);
    assert_eq!(metric(&s, "tern_compress_cache_misses_total"), 1);
    assert_eq!(
        metric(&s, "tern_compress_cache_saved_bytes_total"),
        body.len() as u64
    );

    // As gzip_static in nginx 1.22.1 (and gzip.t): no ranges.
    assert_eq!(r1.header("Accept-Ranges"), None, "{}", r1.head);
    let r = get(&s, "/a.html", &[AE, "Range: bytes=0-9"]);
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, r1.body);

    // Off: the gzip filter streams it, chunked, as nginx does.
    let r = get(&s, "/off/a.html", &[AE]);
    assert_eq!(r.header("Transfer-Encoding"), Some("chunked"), "{}", r.head);
    assert_eq!(gunzip(&r.body), body);
    assert_eq!(metric(&s, "tern_compress_cache_misses_total"), 1);

    // HEAD: the length of the compressed form, no body.
    let raw = s.raw(
        b"HEAD /a.html HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
    );
    let head = String::from_utf8_lossy(&raw).to_string();
    assert!(
        head.contains(&format!("Content-Length: {}\r\n", r1.body.len())),
        "{}",
        head
    );
    assert!(head.ends_with("\r\n\r\n"), "{}", head);
}

/// Sets a file's mtime back to what it was (as `touch -r` would).
fn set_mtime(path: &std::path::Path, t: SystemTime) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    f.set_modified(t).expect("set mtime");
}

#[test]
fn an_edited_file_is_never_served_stale() {
    let p = Prefix::new();
    let v1 = page(2, 30_000);
    let v2 = page(3, 30_000);
    let v3 = page(4, 30_000);
    let path = p.write("html/e.js", &v1);
    let mtime = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .expect("mtime");
    let s = Server::start_in(p, CONF);
    assert_eq!(gunzip(&get(&s, "/e.js", &[AE]).body), v1);
    assert_eq!(gunzip(&get(&s, "/e.js", &[AE]).body), v1);

    // Same inode, same size, same mtime: only ctime moves.
    std::fs::write(&path, &v2).expect("rewrite");
    set_mtime(&path, mtime);
    let m = std::fs::metadata(&path).expect("meta");
    assert_eq!(m.modified().expect("mtime"), mtime);
    assert_eq!(m.len(), v1.len() as u64);
    let r = get(&s, "/e.js", &[AE]);
    assert_eq!(r.header("Content-Encoding"), Some("gzip"));
    assert_eq!(gunzip(&r.body), v2, "edited in place, same size and mtime");

    // Replaced by rename: a new inode with the same size and mtime.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, &v3).expect("write");
    set_mtime(&tmp, mtime);
    std::fs::rename(&tmp, &path).expect("rename");
    let r = get(&s, "/e.js", &[AE]);
    assert_eq!(gunzip(&r.body), v3, "replaced by rename");
    assert_eq!(metric(&s, "tern_compress_cache_misses_total"), 3);
}

#[test]
fn concurrent_requests_share_one_compression() {
    let p = Prefix::new();
    let body = page(5, 900_000);
    p.write("html/big.html", &body);
    let s = Server::start_in(p, CONF);
    let port = s.port;
    let threads: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let raw = raw(
                    port,
                    b"GET /big.html HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
                );
                Resp::parse(&raw).expect("a response")
            })
        })
        .collect();
    let mut bodies = Vec::new();
    for t in threads {
        let r = t.join().expect("client");
        assert_eq!(r.header("Content-Encoding"), Some("gzip"), "{}", r.head);
        bodies.push(r.body);
    }
    assert_eq!(gunzip(&bodies[0]), body);
    assert!(bodies.iter().all(|b| *b == bodies[0]));
    assert_eq!(metric(&s, "tern_compress_cache_misses_total"), 1);
    assert_eq!(metric(&s, "tern_compress_cache_hits_total"), 7);
}

#[test]
fn over_budget_entries_are_evicted_and_spilled_to_disk() {
    let p = Prefix::new();
    // Entries of at most 512 bytes (an eighth of the budget), ~300 once
    // compressed: forty do not fit in 4 KiB.
    let n = 40;
    for i in 0..n {
        p.write(&format!("html/f{}.html", i), page(10 + i, 500));
    }
    std::fs::create_dir_all(p.path("spill")).expect("spill dir");
    // Workers write it as their `user` (nobody when the tests run as root).
    std::fs::set_permissions(
        p.path("spill"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    let s = Server::start_in(
        p,
        "http { include /etc/nginx/mime.types; gzip on;
          compress_cache_max_size 4k; compress_cache_path spill max_size=1m;
          server { listen 127.0.0.1:@PORT@; root html;
            location = /metrics { tern_metrics; } } }",
    );
    let mut first = Vec::new();
    for i in 0..n {
        let r = get(&s, &format!("/f{}.html", i), &[AE]);
        assert_eq!(gunzip(&r.body), page(10 + i, 500));
        assert!(r.header("Content-Length").is_some(), "{}", r.head);
        first.push(r.body);
    }
    assert!(metric(&s, "tern_compress_cache_evictions_total") > 0);
    eventually(
        10,
        "an evicted entry written to the spill directory",
        || metric(&s, "tern_compress_cache_spilled_total") > 0,
    );
    let dir = s.prefix.path("spill");
    let files = std::fs::read_dir(&dir).expect("spill dir").count();
    assert!(files > 0);
    let misses = metric(&s, "tern_compress_cache_misses_total");
    // The first file was evicted first: served now from its spilled copy.
    let r = get(&s, "/f0.html", &[AE]);
    assert_eq!(r.body, first[0]);
    assert_eq!(
        r.header("Content-Length"),
        Some(first[0].len().to_string().as_str())
    );
    assert_eq!(metric(&s, "tern_compress_cache_misses_total"), misses);
}

#[test]
fn bad_compress_cache_directives_are_refused() {
    for (conf, msg) in [
        (
            "http { compress_cache maybe; }",
            "invalid value \"maybe\" in \"compress_cache\" directive, it must be \"on\" or \"off\"",
        ),
        (
            "http { compress_cache_max_size lots; }",
            "\"compress_cache_max_size\" directive invalid value",
        ),
        (
            "http { server { compress_cache_max_size 1m; } }",
            "\"compress_cache_max_size\" directive is not allowed here",
        ),
        (
            "http { compress_cache_path /tmp x=1; }",
            "invalid parameter \"x=1\"",
        ),
    ] {
        let t = ConfTest::run(&format!("events {{}} {}", conf));
        t.assert_says("emerg", msg, 1);
    }
}
