//! brotli (ngx_brotli's directives) and zstd, and the negotiation between
//! br, zstd and gzip. The brotli cases run side by side with the real
//! nginx and Debian's ngx_brotli modules (`libnginx-mod-http-brotli-*`,
//! installed by .ci/run): per request the status, the encoding, the
//! framing and validator headers and the decoded body must agree.
use std::io::Read;

use crate::harness::*;

const FILTER: &str = "/usr/lib/nginx/modules/ngx_http_brotli_filter_module.so";
const STATIC: &str = "/usr/lib/nginx/modules/ngx_http_brotli_static_module.so";

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

fn unbr(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::BrotliDecompress(&mut &b[..], &mut out).expect("valid brotli");
    out
}

fn decode(r: &Resp) -> Vec<u8> {
    match r.header("Content-Encoding") {
        Some("br") => unbr(&r.body),
        Some("gzip") => {
            let mut out = Vec::new();
            flate2::read::MultiGzDecoder::new(&r.body[..])
                .read_to_end(&mut out)
                .expect("valid gzip");
            out
        }
        Some("zstd") => zstd::decode_all(&r.body[..]).expect("valid zstd"),
        _ => r.body.clone(),
    }
}

/// What must agree between nginx and tern for one request.
fn summary(r: &Resp, head_only: bool) -> String {
    let h = |n: &str| r.header(n).unwrap_or("-").to_string();
    let body = if head_only {
        format!("{} body bytes", r.body.len())
    } else {
        // The error page's tail names the server.
        let d = String::from_utf8_lossy(&decode(r))
            .replace("<center>nginx</center>", "<center>tern</center>")
            .into_bytes();
        format!("{} decoded bytes, fnv {:x}", d.len(), fnv(&d))
    };
    format!(
        "{} ce={} vary={} etag={} type={} te={} ranges={} cl={} | {}",
        r.status,
        h("Content-Encoding"),
        h("Vary"),
        h("ETag"),
        h("Content-Type"),
        h("Transfer-Encoding"),
        h("Accept-Ranges"),
        // A compressed length differs between compressors; a plain one must not.
        // ... and an error page's length follows from the server's name.
        if r.header("Content-Encoding").is_some() || r.status >= 400 {
            r.header("Content-Length")
                .map(|_| "set")
                .unwrap_or("-")
                .to_string()
        } else {
            h("Content-Length")
        },
        body
    )
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &c| {
        (h ^ u64::from(c)).wrapping_mul(0x100000001b3)
    })
}

const BODY: &str = "
http {
    types { text/html html; text/plain txt; text/css css; application/json json; }
    default_type application/octet-stream;
    access_log off;
    server_tokens off;
    brotli on; brotli_comp_level 4; brotli_types text/css application/json;
    gzip on; gzip_vary on; gzip_types text/css;
    server {
        listen 127.0.0.1:@PORT@;
        root html;
        location /min/ { alias html/; brotli_min_length 50000; }
        location /nobr/ { alias html/; brotli off; }
        location /st/ { alias html/; brotli_static on; }
        location /sta/ { alias html/; brotli_static always; }
        location /win/ { alias html/; brotli_window 1k; brotli_comp_level 11; }
        location = /ret { return 200 \"returned text that is long enough to be compressed by brotli\"; }
    }
}";

#[test]
fn brotli_as_ngx_brotli() {
    if !nginx_installed() || !std::path::Path::new(FILTER).exists() {
        eprintln!("skipped: ngx_brotli modules not installed (.ci/run installs them)");
        return;
    }
    let p = Prefix::new();
    let html = page(1, 30_000);
    p.write("html/a.html", &html);
    p.write("html/s.css", page(2, 5_000));
    p.write("html/t.txt", page(3, 5_000));
    p.write("html/j.json", page(4, 100));
    p.write("html/tiny.html", "tiny");
    p.write("html/st.html", &html);
    let br = {
        let mut out = Vec::new();
        let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 20);
        std::io::Write::write_all(&mut w, &html).expect("br");
        drop(w);
        out
    };
    p.write("html/st.html.br", &br);
    // load_module must come before any block, so `events` is written here.
    let nginx_body = format!(
        "load_module {};\nload_module {};\nevents {{}}\n{}",
        FILTER, STATIC, BODY
    );
    let np = Prefix::new();
    for f in ["a.html", "s.css", "t.txt", "j.json", "tiny.html", "st.html"] {
        np.write(
            &format!("html/{}", f),
            std::fs::read(p.path(&format!("html/{}", f))).expect("file"),
        );
    }
    np.write("html/st.html.br", &br);
    // Same mtimes, so that ETags compare.
    for f in [
        "a.html",
        "s.css",
        "t.txt",
        "j.json",
        "tiny.html",
        "st.html",
        "st.html.br",
    ] {
        let t = std::fs::metadata(p.path(&format!("html/{}", f)))
            .and_then(|m| m.modified())
            .expect("mtime");
        std::fs::OpenOptions::new()
            .write(true)
            .open(np.path(&format!("html/{}", f)))
            .and_then(|f| f.set_modified(t))
            .expect("set mtime");
    }
    let nport = free_port();
    let Some(_nginx) = start_nginx(&np, &nginx_body, nport) else {
        eprintln!("skipped: nginx with ngx_brotli did not start");
        return;
    };
    let s = Server::start_in(p, &BODY.replacen("http {", "http { compress_cache off;", 1));
    let aes = [
        None,
        Some("br"),
        Some("gzip, deflate, br"),
        Some("br;q=0.1, gzip;q=1"),
        Some("gzip, br;q=0"),
        Some("br;q=0.000, gzip"),
        Some("BR"),
        Some("brotli, gzip"),
        Some("gzip"),
        Some("identity"),
    ];
    let paths = [
        ("GET", "/a.html"),
        ("GET", "/s.css"),
        ("GET", "/t.txt"),
        ("GET", "/j.json"),
        ("GET", "/tiny.html"),
        ("GET", "/min/a.html"),
        ("GET", "/nobr/a.html"),
        ("GET", "/st/st.html"),
        ("GET", "/sta/st.html"),
        ("GET", "/win/a.html"),
        ("GET", "/missing.html"),
        ("GET", "/ret"),
        ("HEAD", "/a.html"),
    ];
    let mut diffs = Vec::new();
    for (m, path) in paths {
        for ae in aes {
            let mut req = format!(
                "{} {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n",
                m, path
            );
            if let Some(v) = ae {
                req.push_str(&format!("Accept-Encoding: {}\r\n", v));
            }
            req.push_str("\r\n");
            let head_only = m == "HEAD";
            let parse = |raw: Vec<u8>| {
                if head_only {
                    let end = find(&raw, b"\r\n\r\n").expect("head") + 4;
                    let mut r = Resp::parse(&raw[..end]).expect("response");
                    r.body = raw[end..].to_vec();
                    r
                } else {
                    Resp::parse(&raw).expect("response")
                }
            };
            let want = summary(&parse(raw(nport, req.as_bytes())), head_only);
            let got = summary(&parse(s.raw(req.as_bytes())), head_only);
            if want != got {
                diffs.push(format!(
                    "{} {} AE={:?}\n  nginx: {}\n  tern:  {}",
                    m, path, ae, want, got
                ));
            }
        }
    }
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

#[test]
fn brotli_through_the_compressed_file_cache() {
    let p = Prefix::new();
    let html = page(7, 40_000);
    p.write("html/a.html", &html);
    let s = Server::start_in(
        p,
        "http { include /etc/nginx/mime.types; brotli on; gzip on; zstd on;
          server { listen 127.0.0.1:@PORT@; root html;
            location = /metrics { tern_metrics; } } }",
    );
    let get = |ae: &str| {
        let req = format!(
            "GET /a.html HTTP/1.1\r\nHost: x\r\nAccept-Encoding: {}\r\nConnection: close\r\n\r\n",
            ae
        );
        Resp::parse(&s.raw(req.as_bytes())).expect("response")
    };
    for _ in 0..2 {
        let r = get("gzip, br, zstd");
        assert_eq!(r.header("Content-Encoding"), Some("br"), "{}", r.head);
        assert!(r.header("Content-Length").is_some(), "{}", r.head);
        assert_eq!(decode(&r), html);
        let r = get("gzip, zstd");
        assert_eq!(r.header("Content-Encoding"), Some("zstd"), "{}", r.head);
        assert!(r.header("Content-Length").is_some(), "{}", r.head);
        assert_eq!(decode(&r), html);
        let r = get("gzip");
        assert_eq!(r.header("Content-Encoding"), Some("gzip"), "{}", r.head);
        assert_eq!(decode(&r), html);
    }
    let m = Resp::parse(&s.raw(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
        .expect("metrics")
        .body_str();
    assert!(m.contains("tern_compress_cache_misses_total 3\n"), "{}", m);
    assert!(m.contains("tern_compress_cache_hits_total 3\n"), "{}", m);
}

#[test]
fn zstd_filter_static_and_directives() {
    let p = Prefix::new();
    let html = page(8, 20_000);
    p.write("html/a.html", &html);
    p.write("html/z.html", "plain z");
    p.write(
        "html/z.html.zst",
        zstd::encode_all(&html[..], 3).expect("zstd"),
    );
    let s = Server::start_in(
        p,
        "http { include /etc/nginx/mime.types; compress_cache off; zstd on; zstd_comp_level 3;
          gzip on; gzip_vary on;
          log_format z '$zstd_ratio'; access_log logs/z.log z;
          server { listen 127.0.0.1:@PORT@; root html;
            location /s/ { alias html/; zstd_static on; } } }",
    );
    let get = |path: &str, ae: &str| {
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: {}\r\nConnection: close\r\n\r\n",
            path, ae
        );
        Resp::parse(&s.raw(req.as_bytes())).expect("response")
    };
    let r = get("/a.html", "gzip, zstd");
    assert_eq!(r.header("Content-Encoding"), Some("zstd"), "{}", r.head);
    assert_eq!(r.header("Transfer-Encoding"), Some("chunked"));
    assert_eq!(r.header("Vary"), Some("Accept-Encoding"));
    assert!(r.header("ETag").is_some_and(|e| e.starts_with("W/")));
    assert_eq!(decode(&r), html);
    let log = wait_log(&s.prefix, "logs/z.log", ".");
    let ratio: f64 = log.trim().parse().expect("a ratio");
    assert!(
        ratio > 1.5 && log.trim().split('.').nth(1).map(str::len) == Some(3),
        "{}",
        log
    );
    let r = get("/a.html", "gzip");
    assert_eq!(r.header("Content-Encoding"), Some("gzip"));
    let r = get("/s/z.html", "zstd");
    assert_eq!(r.header("Content-Encoding"), Some("zstd"));
    assert_eq!(decode(&r), html, "the .zst file");
    let r = get("/s/z.html", "gzip");
    assert_eq!(r.body, b"plain z");

    for (conf, msg) in [
        (
            "http { zstd_comp_level 0; }",
            "zstd compress level must between -131072 and 22 excluding 0",
        ),
        (
            "http { zstd_static sometimes; }",
            "invalid value \"sometimes\"",
        ),
        ("http { brotli_comp_level 12; }", "value must be between 0 and 11"),
        (
            "http { brotli_window 3k; }",
            "\"brotli_window\" directive must be 1k, 2k, 4k, 8k, 16k, 32k, 64k, 128k, 256k, 512k, 1m, 2m, 4m, 8m or 16m",
        ),
    ] {
        let t = ConfTest::run(&format!("events {{}} {}", conf));
        t.assert_says("emerg", msg, 1);
    }
}
