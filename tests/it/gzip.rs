//! gzip, gzip_static and gunzip against the real binary. Expected answers
//! were taken from nginx 1.22.1 run on the same configurations.
use std::io::{Read, Write};

use crate::harness::*;

/// Some HTML that compresses well but not trivially.
fn html() -> Vec<u8> {
    let words = [
        "alpha ", "beta ", "<p>", "</p>", "gamma\n", "tern ", "nginx ",
    ];
    let mut out = Vec::new();
    let mut x: u32 = 12345;
    while out.len() < 100_000 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        out.extend_from_slice(words[(x >> 16) as usize % words.len()].as_bytes());
    }
    out
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut d = flate2::read::MultiGzDecoder::new(b);
    let mut out = Vec::new();
    d.read_to_end(&mut out).expect("valid gzip");
    out
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(b).expect("gzip");
    e.finish().expect("gzip")
}

/// A request with extra header lines; the connection is closed after it.
fn req(s: &Server, method: &str, path: &str, headers: &[&str]) -> Resp {
    req_v(s, method, path, "1.1", headers)
}

fn req_v(s: &Server, method: &str, path: &str, ver: &str, headers: &[&str]) -> Resp {
    let mut r = format!(
        "{} {} HTTP/{}\r\nHost: localhost\r\nConnection: close\r\n",
        method, path, ver
    );
    for h in headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    let raw = s.raw(r.as_bytes());
    if method == "HEAD" {
        // Nothing follows the head of a HEAD answer, whatever it announces.
        let end = find(&raw, b"\r\n\r\n").expect("a head") + 4;
        let mut p = Resp::parse(&raw[..end]).expect("a response");
        p.body = raw[end..].to_vec();
        return p;
    }
    Resp::parse(&raw).expect("a response")
}

const AE: &str = "Accept-Encoding: gzip, deflate";

/// Starts tern with the compressed-file cache off: these tests follow
/// nginx's gzip filter (chunked, compressed per request); the cache has
/// its own tests (compress_cache.rs).
fn start_in(p: Prefix, conf: &str) -> Server {
    Server::start_in(p, &conf.replacen("http {", "http { compress_cache off;", 1))
}

/// Asserts `r` is gzip-encoded with the framing nginx uses and decodes to `want`.
fn assert_gzipped(r: &Resp, want: &[u8]) {
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("Content-Encoding"), Some("gzip"), "{}", r.head);
    assert_eq!(r.header("Content-Length"), None, "{}", r.head);
    assert_eq!(r.header("Accept-Ranges"), None, "{}", r.head);
    assert_eq!(r.header("Transfer-Encoding"), Some("chunked"), "{}", r.head);
    assert_eq!(&r.body[..3], b"\x1f\x8b\x08", "gzip magic");
    assert_eq!(
        gunzip(&r.body),
        want,
        "decompressed body differs from the file"
    );
}

fn assert_plain(r: &Resp, want: &[u8]) {
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("Content-Encoding"), None, "{}", r.head);
    assert_eq!(r.body, want, "{}", r.head);
}

#[test]
fn compresses_html_for_gzip_clients_only() {
    let p = Prefix::new();
    let body = html();
    p.write("html/a.html", &body);
    let s = start_in(
        p,
        "http { include /etc/nginx/mime.types; server { listen 127.0.0.1:@PORT@; root html; gzip on; } }",
    );
    let r = req(&s, "GET", "/a.html", &[AE]);
    assert_gzipped(&r, &body);
    assert!(
        r.body.len() < body.len() / 3,
        "level 1 should compress this ~4x: {}",
        r.body.len()
    );
    // A strong ETag becomes weak, as the bytes are no longer the file's.
    let etag = r.header("ETag").expect("etag");
    assert!(etag.starts_with("W/\""), "{}", etag);
    assert_eq!(r.header("Vary"), None, "gzip_vary is off by default");

    assert_plain(&req(&s, "GET", "/a.html", &[]), &body);
    for ae in [
        "Accept-Encoding: gzip;q=0",
        "Accept-Encoding: gzip; q=0.000",
        "Accept-Encoding: deflate, br",
        "Accept-Encoding: x-gzip",
        "Accept-Encoding: gzipx",
    ] {
        let r = req(&s, "GET", "/a.html", &[ae]);
        assert_plain(&r, &body);
        assert!(
            r.header("ETag").is_some_and(|e| e.starts_with('"')),
            "{}",
            ae
        );
    }
    for ae in [
        "Accept-Encoding: GZIP",
        "Accept-Encoding: br, gzip;q=0.5",
        "Accept-Encoding: gzip",
    ] {
        assert_gzipped(&req(&s, "GET", "/a.html", &[ae]), &body);
    }
    // HTTP/1.0 is not compressed by default (gzip_http_version 1.1).
    assert_plain(&req_v(&s, "GET", "/a.html", "1.0", &[AE]), &body);
}

#[test]
fn http10_with_gzip_http_version_closes_instead_of_chunking() {
    let p = Prefix::new();
    let body = html();
    p.write("html/a.html", &body);
    let s = start_in(
        p,
        "http { server { listen 127.0.0.1:@PORT@; root html; gzip on; gzip_http_version 1.0; } }",
    );
    let mut c = s.connect();
    c.write_all(b"GET /a.html HTTP/1.0\r\nConnection: keep-alive\r\nAccept-Encoding: gzip\r\n\r\n")
        .expect("write");
    let raw = read_to_close(&mut c);
    let r = Resp::parse(&raw).expect("response");
    assert_eq!(r.header("Content-Encoding"), Some("gzip"), "{}", r.head);
    assert_eq!(r.header("Transfer-Encoding"), None, "{}", r.head);
    assert_eq!(r.header("Content-Length"), None, "{}", r.head);
    assert_eq!(gunzip(&r.body), body);
}

#[test]
fn gzip_types_and_min_length() {
    let p = Prefix::new();
    let text = b"plain text, plain text, plain text\n".repeat(50);
    p.write("html/t.txt", &text);
    p.write("html/t.css", &text);
    p.write("html/t.js", &text);
    p.write("html/t.bin", &text);
    p.write("html/small.html", "0123456789012345678"); // 19 bytes < 20
    p.write("html/twenty.html", "01234567890123456789"); // 20 bytes
    p.write("html/x.html", &text);
    let s = start_in(
        p,
        "http { include /etc/nginx/mime.types; gzip on;
          server { listen 127.0.0.1:@PORT@; root html;
            location /css/ { alias html/; gzip_types text/css; gzip_types application/javascript; }
            location /all/ { alias html/; gzip_types *; }
            location /min/ { alias html/; gzip_min_length 1751; gzip_types text/plain; }
            location /zero/ { alias html/; gzip_min_length 0; }
          } }",
    );
    // Default types: text/html only.
    assert_plain(&req(&s, "GET", "/t.txt", &[AE]), &text);
    assert_gzipped(&req(&s, "GET", "/x.html", &[AE]), &text);
    // Lists add up within a level, and text/html is always in.
    assert_gzipped(&req(&s, "GET", "/css/t.css", &[AE]), &text);
    assert_gzipped(&req(&s, "GET", "/css/t.js", &[AE]), &text);
    assert_gzipped(&req(&s, "GET", "/css/x.html", &[AE]), &text);
    assert_plain(&req(&s, "GET", "/css/t.txt", &[AE]), &text);
    // "*": everything, even application/octet-stream.
    assert_gzipped(&req(&s, "GET", "/all/t.bin", &[AE]), &text);
    // gzip_min_length compares with Content-Length (default 20).
    assert_plain(
        &req(&s, "GET", "/small.html", &[AE]),
        b"0123456789012345678",
    );
    assert_gzipped(
        &req(&s, "GET", "/twenty.html", &[AE]),
        b"01234567890123456789",
    );
    assert_eq!(text.len(), 1750);
    assert_plain(&req(&s, "GET", "/min/t.txt", &[AE]), &text);
    assert_gzipped(
        &req(&s, "GET", "/zero/small.html", &[AE]),
        b"0123456789012345678",
    );
}

#[test]
fn empty_file_with_min_length_zero_is_a_valid_gzip_stream() {
    let p = Prefix::new();
    p.write("html/e.html", "");
    let s = start_in(
        p,
        "http { server { listen 127.0.0.1:@PORT@; root html; gzip on; gzip_min_length 0; } }",
    );
    let r = req(&s, "GET", "/e.html", &[AE]);
    assert_gzipped(&r, b"");
}

#[test]
fn gzip_proxied_each_value_with_and_without_via() {
    let p = Prefix::new();
    let body = html();
    p.write("html/a.html", &body);
    let values = [
        "off",
        "expired",
        "no-cache",
        "no-store",
        "private",
        "no_last_modified",
        "no_etag",
        "auth",
        "any",
    ];
    let mut locs = String::new();
    for v in values {
        locs.push_str(&format!(
            "location /{v}/ {{ alias html/; gzip_proxied {v}; }}\n"
        ));
        locs.push_str(&format!(
            "location = /ret-{v} {{ gzip_proxied {v}; gzip_types text/plain; return 200 \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"; }}\n"
        ));
    }
    let s = start_in(
        p,
        &format!("http {{ gzip on; server {{ listen 127.0.0.1:@PORT@; root html;\n{locs} }} }}"),
    );
    let via = "Via: 1.1 proxy.example";
    let ret_body = b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for v in values {
        // Without Via the setting does not matter.
        assert_gzipped(&req(&s, "GET", &format!("/{v}/a.html"), &[AE]), &body);
        // With Via: a static file has an ETag but no Last-Modified *header*
        // and no Expires/Cache-Control, so nginx compresses unless off or
        // no_etag.
        let r = req(&s, "GET", &format!("/{v}/a.html"), &[AE, via]);
        match v {
            "off" | "no_etag" => assert_plain(&r, &body),
            _ => assert_gzipped(&r, &body),
        }
        // A `return` answer has no ETag: only off refuses.
        let r = req(&s, "GET", &format!("/ret-{v}"), &[AE, via]);
        match v {
            "off" => assert_plain(&r, ret_body),
            _ => assert_gzipped(&r, ret_body),
        }
    }
    // auth with Authorization passes before no_etag is considered.
    let r = req(
        &s,
        "GET",
        "/auth/a.html",
        &[AE, via, "Authorization: Basic dTpw"],
    );
    assert_gzipped(&r, &body);
}

#[test]
fn gzip_disable_msie6_and_regexes() {
    let p = Prefix::new();
    let body = html();
    p.write("html/a.html", &body);
    let s = start_in(
        p,
        "http { gzip on; gzip_disable msie6;
          server { listen 127.0.0.1:@PORT@; root html;
            location /re/ { alias html/; gzip_disable \"^curl/\" \"bad.*bot\"; }
          } }",
    );
    let ua = |u: &str| format!("User-Agent: {}", u);
    let msie6 = ua("Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1)");
    let msie6_sv1 = ua("Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1; SV1)");
    let msie55 = ua("Mozilla/4.0 (compatible; MSIE 5.5; Windows 98)");
    let msie7 = ua("Mozilla/4.0 (compatible; MSIE 7.0; Windows NT 6.0)");
    let opera = ua("Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1) Opera 8.50");
    assert_plain(&req(&s, "GET", "/a.html", &[AE, &msie6]), &body);
    assert_plain(&req(&s, "GET", "/a.html", &[AE, &msie55]), &body);
    assert_gzipped(&req(&s, "GET", "/a.html", &[AE, &msie6_sv1]), &body);
    assert_gzipped(&req(&s, "GET", "/a.html", &[AE, &msie7]), &body);
    assert_gzipped(&req(&s, "GET", "/a.html", &[AE, &opera]), &body);
    // Regexes are case-insensitive; msie6 is inherited separately.
    assert_plain(&req(&s, "GET", "/re/a.html", &[AE, &ua("CURL/8.0")]), &body);
    assert_plain(
        &req(&s, "GET", "/re/a.html", &[AE, &ua("a Bad Robot")]),
        &body,
    );
    assert_plain(&req(&s, "GET", "/re/a.html", &[AE, &msie6]), &body);
    assert_gzipped(
        &req(&s, "GET", "/re/a.html", &[AE, &ua("Wget/1.0 curl/8")]),
        &body,
    );
}

#[test]
fn head_206_304_and_other_statuses_are_not_compressed() {
    let p = Prefix::new();
    let body = html();
    p.write("html/a.html", &body);
    let text = "x".repeat(100);
    let s = start_in(
        p,
        &format!(
            "http {{ gzip on; gzip_types text/plain; gzip_vary on;
              server {{ listen 127.0.0.1:@PORT@; root html;
                location = /r200 {{ return 200 \"{text}\"; }}
                location = /r206 {{ return 206 \"{text}\"; }}
                location = /r304 {{ return 304; }}
                location = /r500 {{ return 500 \"{text}\"; }}
              }} }}"
        ),
    );
    // The same config does compress a 200, so the checks below can fail.
    assert_gzipped(&req(&s, "GET", "/r200", &[AE]), text.as_bytes());
    let r = req(&s, "GET", "/r206", &[AE]);
    assert_eq!(r.status, 206);
    assert_eq!(r.header("Content-Encoding"), None);
    assert_eq!(r.header("Vary"), None, "not even a candidate");
    assert_eq!(r.body, text.as_bytes());
    let r = req(&s, "GET", "/r304", &[AE]);
    assert_eq!(r.status, 304);
    assert_eq!(r.header("Content-Encoding"), None);
    assert!(r.body.is_empty());
    let r = req(&s, "GET", "/r500", &[AE]);
    assert_eq!(r.header("Content-Encoding"), None);
    assert_eq!(r.body, text.as_bytes());
    // 404 pages are compressed (nginx compresses 200, 403 and 404).
    let r = req(&s, "GET", "/missing.html", &[AE]);
    assert_eq!(r.status, 404);
    assert_eq!(r.header("Content-Encoding"), Some("gzip"));
    assert!(String::from_utf8_lossy(&gunzip(&r.body)).contains("404 Not Found"));

    // HEAD: the headers a GET would get (as nginx), and no body at all.
    let get = req(&s, "GET", "/a.html", &[AE]);
    let head = req(&s, "HEAD", "/a.html", &[AE]);
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty(), "HEAD sent a body");
    for h in [
        "Content-Encoding",
        "Content-Length",
        "ETag",
        "Vary",
        "Accept-Ranges",
    ] {
        assert_eq!(head.header(h), get.header(h), "{}", h);
    }
    assert_eq!(
        head.header("Transfer-Encoding"),
        None,
        "no chunked framing without a body"
    );
}

#[test]
fn gzip_vary_and_comp_level() {
    let p = Prefix::new();
    let body = html();
    p.write("html/a.html", &body);
    p.write("html/t.txt", &body);
    let s = start_in(
        p,
        "http { gzip on; gzip_vary on;
          server { listen 127.0.0.1:@PORT@; root html;
            location /l9/ { alias html/; gzip_comp_level 9; gzip_buffers 16 8k; }
          } }",
    );
    let r1 = req(&s, "GET", "/a.html", &[AE]);
    assert_gzipped(&r1, &body);
    assert_eq!(r1.header("Vary"), Some("Accept-Encoding"));
    // Vary goes to clients that do not get gzip too, but only for candidates.
    assert_eq!(
        req(&s, "GET", "/a.html", &[]).header("Vary"),
        Some("Accept-Encoding")
    );
    assert_eq!(req(&s, "GET", "/t.txt", &[AE]).header("Vary"), None);
    let r9 = req(&s, "GET", "/l9/a.html", &[AE]);
    assert_gzipped(&r9, &body);
    assert!(
        r9.body.len() < r1.body.len(),
        "level 9 {} vs level 1 {}",
        r9.body.len(),
        r1.body.len()
    );
}

#[test]
fn bad_gzip_directives_are_refused_like_nginx() {
    for (conf, msg) in [
        (
            "gzip maybe;",
            "invalid value \"maybe\" in \"gzip\" directive, it must be \"on\" or \"off\"",
        ),
        ("gzip_comp_level 10;", "value must be between 1 and 9"),
        (
            "gzip_comp_level x;",
            "\"gzip_comp_level\" directive invalid number",
        ),
        ("gzip_http_version 2.0;", "invalid value \"2.0\""),
        ("gzip_proxied sometimes;", "invalid value \"sometimes\""),
        ("gzip_static maybe;", "invalid value \"maybe\""),
        (
            "gzip_buffers 0 4k;",
            "\"gzip_buffers\" directive invalid value",
        ),
        ("gzip_disable \"(\";", "pcre2_compile() failed"),
        ("gzip on; gzip off;", "\"gzip\" directive is duplicate"),
        (
            "gzip_window 7k;",
            "\"gzip_window\" directive must be 512, 1k, 2k, 4k, 8k, 16k, or 32k",
        ),
    ] {
        let p = Prefix::new();
        p.write(
            "conf/t.conf",
            format!("events {{}}\nhttp {{\n{}\n}}\n", conf),
        );
        let path = p.path("conf/t.conf");
        let out = p.run(&["-t", "-c", path.to_str().expect("utf-8 path")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{} accepted", conf);
        assert!(err.contains(msg), "{}: {}", conf, err);
        assert!(err.contains("t.conf:3"), "{}: {}", conf, err);
    }
    let p = Prefix::new();
    p.write(
        "conf/t.conf",
        "events {}\nhttp { gzip on; gzip_types text/css; gzip_types *; gzip_proxied any any;\n\
         gzip_window 8k; gzip_hash 16k; postpone_gzipping 10; gzip_no_buffer on;\n\
         gunzip on; gunzip_buffers 4 4k; gzip_static always; gzip_disable msie6;\n\
         server { location / { gzip off; gzip_static off; } } }\n",
    );
    let path = p.path("conf/t.conf");
    let out = p.run(&["-t", "-c", path.to_str().expect("utf-8 path")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn gzip_static_serves_gz_when_accepted_and_present() {
    let p = Prefix::new();
    let body = html();
    p.write("html/s.html", &body);
    let gz = gzip(&body);
    p.write("html/s.html.gz", &gz);
    p.write("html/plain.html", &body);
    let s = start_in(
        p,
        "http { include /etc/nginx/mime.types;
          server { listen 127.0.0.1:@PORT@; root html; gzip_static on; gzip_vary on; } }",
    );
    // Accepted and present: the .gz itself, with its own length and ETag.
    let r = req(&s, "GET", "/s.html", &[AE]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Encoding"), Some("gzip"));
    assert_eq!(r.header("Content-Type"), Some("text/html"));
    assert_eq!(
        r.header("Content-Length"),
        Some(gz.len().to_string().as_str())
    );
    assert_eq!(r.header("Vary"), Some("Accept-Encoding"));
    assert_eq!(
        r.header("Accept-Ranges"),
        None,
        "nginx serves no ranges of a .gz"
    );
    assert_eq!(r.body, gz, "the .gz bytes as they are on disk");
    assert_eq!(gunzip(&r.body), body);
    let etag = r.header("ETag").expect("etag").to_string();
    assert!(
        etag.starts_with('"') && etag.ends_with(&format!("-{:x}\"", gz.len())),
        "{}",
        etag
    );
    // HEAD: the same head, no body.
    let h = req(&s, "HEAD", "/s.html", &[AE]);
    assert_eq!(h.header("Content-Length"), r.header("Content-Length"));
    assert!(h.body.is_empty());

    // Not accepted: the original, still with Vary (a .gz exists).
    let r = req(&s, "GET", "/s.html", &["Accept-Encoding: gzip;q=0"]);
    assert_plain(&r, &body);
    assert_eq!(
        r.header("Content-Length"),
        Some(body.len().to_string().as_str())
    );
    assert_eq!(r.header("Vary"), Some("Accept-Encoding"));
    // No .gz: the original, no Vary (gzip itself is off here).
    let r = req(&s, "GET", "/plain.html", &[AE]);
    assert_plain(&r, &body);
    assert_eq!(r.header("Vary"), None);
}

#[test]
fn gzip_static_always_with_gunzip() {
    let p = Prefix::new();
    let text = b"only the compressed copy exists on disk\n".repeat(500);
    p.write("html/only.txt.gz", gzip(&text));
    let s = start_in(
        p,
        "http { include /etc/nginx/mime.types;
          server { listen 127.0.0.1:@PORT@; root html; gzip_static always;
            location /gunzip/ { alias html/; gunzip on; }
          } }",
    );
    // always: the .gz goes to everyone, even clients without gzip.
    let r = req(&s, "GET", "/only.txt", &[]);
    assert_eq!(r.header("Content-Encoding"), Some("gzip"));
    assert_eq!(r.header("Content-Type"), Some("text/plain"));
    assert_eq!(gunzip(&r.body), text);
    // With gunzip: decoded for clients without gzip...
    let r = req(&s, "GET", "/gunzip/only.txt", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Encoding"), None, "{}", r.head);
    assert_eq!(r.header("Content-Length"), None, "{}", r.head);
    assert!(
        r.header("ETag").is_some_and(|e| e.starts_with("W/\"")),
        "{}",
        r.head
    );
    assert_eq!(r.body, text);
    // ...for HTTP/1.0 too (no chunked: the close ends the body)...
    let r = req_v(&s, "GET", "/gunzip/only.txt", "1.0", &[]);
    assert_eq!(r.body, text);
    // ...and left compressed for clients that take gzip.
    let r = req(&s, "GET", "/gunzip/only.txt", &[AE]);
    assert_eq!(r.header("Content-Encoding"), Some("gzip"));
    assert_eq!(gunzip(&r.body), text);
    // Missing both: 404.
    assert_eq!(req(&s, "GET", "/gunzip/none.txt", &[]).status, 404);
}

fn vm_hwm_kib(pid: i32) -> u64 {
    let st = std::fs::read_to_string(format!("/proc/{}/status", pid)).expect("proc status");
    st.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmHWM")
}

#[test]
fn hundred_mib_body_compresses_in_bounded_memory() {
    const SIZE: u64 = 100 << 20;
    let p = Prefix::new();
    p.write("html/small.html", "warm up the worker, warm up the worker");
    // A sparse file: 100 MiB of zeros that costs no disk.
    let f = std::fs::File::create(p.path("html/big.html")).expect("create");
    f.set_len(SIZE).expect("set_len");
    drop(f);
    let s = start_in(
        p,
        "http { server { listen 127.0.0.1:@PORT@; root html; gzip on; } }",
    );
    assert_gzipped(
        &req(&s, "GET", "/small.html", &[AE]),
        b"warm up the worker, warm up the worker",
    );
    let before = vm_hwm_kib(s.pid());

    let mut c = s.connect();
    c.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .expect("timeout");
    c.write_all(
        b"GET /big.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAccept-Encoding: gzip\r\n\r\n",
    )
    .expect("write");
    let raw = read_to_close(&mut c);
    let r = Resp::parse(&raw).expect("response");
    assert_eq!(r.header("Content-Encoding"), Some("gzip"), "{}", r.head);
    assert!(r.body.len() < 2 << 20, "zeros compress: {}", r.body.len());
    // Decompress as a stream and check every byte, without a 100 MiB buffer.
    let mut d = flate2::read::GzDecoder::new(&r.body[..]);
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = d.read(&mut buf).expect("valid gzip");
        if n == 0 {
            break;
        }
        assert!(
            buf[..n].iter().all(|&b| b == 0),
            "non-zero byte near {}",
            total
        );
        total += n as u64;
    }
    assert_eq!(total, SIZE);

    let after = vm_hwm_kib(s.pid());
    let grew = after.saturating_sub(before);
    // Buffering the body would add >100 MiB; streaming adds zlib's state
    // and a few 64 KiB slices.
    assert!(
        grew < 24 * 1024,
        "peak RSS grew by {} KiB (from {} to {})",
        grew,
        before,
        after
    );
}
