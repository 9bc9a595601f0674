//! gzip, brotli and zstd over HTTP/2 (curl, cleartext prior knowledge)
//! and HTTP/3 (aioquic's client, tests/it/h3_client.py): each coding
//! compressed per request (`compress_cache off`) and from the
//! compressed-file cache (a miss, then a hit served from the entry's
//! shared bytes), every body decoded here and compared with the file.
use std::io::Read;
use std::process::Command;

use crate::harness::*;

/// A page of varied words (so each coding really compresses it).
fn page(len: usize) -> Vec<u8> {
    let words = ["alpha ", "beta ", "<p>", "</p>", "gamma\n", "tern ", "h2 "];
    let mut out = Vec::new();
    let mut x: u32 = 7;
    while out.len() < len {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        out.extend_from_slice(words[(x >> 16) as usize % words.len()].as_bytes());
    }
    out.truncate(len);
    out
}

/// The content of `body` sent with Content-Encoding `coding`.
fn decode(coding: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" => {
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .expect("valid gzip");
        }
        "br" => {
            brotli::BrotliDecompress(&mut &body[..], &mut out).expect("valid brotli");
        }
        "zstd" => out = zstd::decode_all(body).expect("valid zstd"),
        _ => panic!("coding {coding}"),
    }
    out
}

/// One `tern_metrics` counter, over HTTP/1.1.
fn metric(s: &Server, name: &str) -> u64 {
    let text = s.get("/metrics").body_str().to_string();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in {text}"))
}

const CODINGS: [&str; 3] = ["gzip", "br", "zstd"];

/// The server blocks both tests use: all three codings on for text/html.
fn http_block(server: &str) -> String {
    format!(
        "http {{ include /etc/nginx/mime.types; gzip on; brotli on; zstd on;
            {server} }}"
    )
}

const LOCATIONS: &str = "root html;
        location = /metrics { tern_metrics; }
        location /off/ { alias html/; compress_cache off; }";

#[test]
fn codings_and_cache_hits_over_h2() {
    let p = Prefix::new();
    let body = page(30_000);
    p.write("html/a.html", &body);
    let s = Server::start_in(
        p,
        &http_block(&format!(
            "server {{ listen 127.0.0.1:@PORT@ http2; {LOCATIONS} }}"
        )),
    );
    let dir = s.prefix.path("out");
    std::fs::create_dir_all(&dir).expect("out dir");
    for (i, coding) in CODINGS.iter().enumerate() {
        // A miss, a hit from memory, then compressed per request.
        for (j, path) in ["/a.html", "/a.html", "/off/a.html"].iter().enumerate() {
            let head = dir.join(format!("{i}.{j}.head"));
            let out = dir.join(format!("{i}.{j}.body"));
            let o = Command::new("curl")
                .args(["-s", "--max-time", "10", "--http2-prior-knowledge"])
                .args(["-H", &format!("Accept-Encoding: {coding}")])
                .arg("-D")
                .arg(&head)
                .arg("-o")
                .arg(&out)
                .arg(format!("http://127.0.0.1:{}{}", s.port, path))
                .output()
                .expect("curl");
            assert!(o.status.success(), "curl {path} {coding}: {o:?}");
            let h = std::fs::read_to_string(&head).unwrap_or_default();
            let got = std::fs::read(&out).unwrap_or_default();
            assert!(h.starts_with("HTTP/2 200"), "{path} {coding}: {h}");
            assert!(
                h.contains(&format!("content-encoding: {coding}\r\n")),
                "{path} {coding}: {h}"
            );
            if j < 2 {
                // From the cache: the compressed form's length.
                assert!(
                    h.contains(&format!("content-length: {}\r\n", got.len())),
                    "{path} {coding}: {h}"
                );
            } else {
                assert!(!h.contains("content-length:"), "{path} {coding}: {h}");
            }
            assert_eq!(decode(coding, &got), body, "{path} {coding}");
        }
        assert_eq!(
            metric(&s, "tern_compress_cache_hits_total"),
            i as u64 + 1,
            "{coding}"
        );
        assert_eq!(
            metric(&s, "tern_compress_cache_misses_total"),
            i as u64 + 1,
            "{coding}"
        );
    }
    // HEAD of a cached form: its length, no body.
    let o = Command::new("curl")
        .args(["-s", "--max-time", "10", "--http2-prior-knowledge", "-I"])
        .args(["-H", "Accept-Encoding: br"])
        .arg(format!("http://127.0.0.1:{}/a.html", s.port))
        .output()
        .expect("curl");
    let h = String::from_utf8_lossy(&o.stdout);
    let br_len = std::fs::read(dir.join("1.1.body"))
        .unwrap_or_default()
        .len();
    assert!(h.contains(&format!("content-length: {br_len}\r\n")), "{h}");
}

#[test]
fn codings_and_cache_hits_over_h3() {
    if !crate::h3::have_aioquic() {
        return;
    }
    let p = Prefix::new();
    crate::h3::cert(&p);
    let body = page(30_000);
    p.write("html/a.html", &body);
    let quic = free_port();
    let s = Server::start_in(
        p,
        &http_block(&format!(
            "server {{ listen 127.0.0.1:@PORT@;
                listen 127.0.0.1:{quic} quic reuseport;
                listen 127.0.0.1:{quic} ssl;
                http3 on;
                ssl_certificate h3.crt;
                ssl_certificate_key h3.key;
                {LOCATIONS} }}"
        )),
    );
    let out = s.prefix.path("h3out");
    for (i, coding) in CODINGS.iter().enumerate() {
        let paths = ["/a.html", "/a.html", "/off/a.html"];
        let said = crate::h3::fetch(
            quic,
            &out,
            &paths,
            &["--header", &format!("accept-encoding: {coding}")],
        );
        assert_eq!(said.trim(), "ok 3");
        for (j, path) in paths.iter().enumerate() {
            let h = crate::h3::head(&out, j);
            let got = crate::h3::read(&out, &format!("{j}.body"));
            assert!(h.contains(":status: 200\n"), "{path} {coding}: {h}");
            assert!(
                h.contains(&format!("content-encoding: {coding}\n")),
                "{path} {coding}: {h}"
            );
            if j < 2 {
                assert!(
                    h.contains(&format!("content-length: {}\n", got.len())),
                    "{path} {coding}: {h}"
                );
            }
            assert_eq!(decode(coding, &got), body, "{path} {coding}");
        }
        assert_eq!(
            metric(&s, "tern_compress_cache_hits_total"),
            i as u64 + 1,
            "{coding}"
        );
    }
}
