//! A response served from `proxy_cache` keeps the status line its
//! upstream sent (`302 Found`, `200`, `404 Gone Away`): nginx stores the
//! upstream's head in the cache file and sends its line on a hit, as on
//! the miss that stored it. Compared with the real nginx on the same
//! configuration; and an entry in tern's previous file format (which had
//! no status line) is a miss that gets replaced, never served.

use std::time::Duration;

use crate::harness::*;
use crate::origin::Origin;

/// The origin's raw answers, by path.
fn answer(path: &str) -> Vec<u8> {
    let head = match path {
        "/found" => "HTTP/1.1 302 Found\r\nLocation: /x\r\n",
        "/moved" => "HTTP/1.1 301 Moved Permanently\r\nLocation: /y\r\n",
        "/bare" => "HTTP/1.1 200\r\n",
        "/fine" => "HTTP/1.1 200 Fine Thanks\r\n",
        "/gone" => "HTTP/1.0 404 Gone Away\r\n",
        "/odd" => "HTTP/1.1 299 Custom\r\n",
        "/lm" => "HTTP/1.1 200 Fine\r\nLast-Modified: Mon, 01 Jan 2001 00:00:00 GMT\r\n",
        _ => "HTTP/1.1 500 Unknown Case\r\n",
    };
    format!("{head}Content-Length: 2\r\nConnection: close\r\n\r\nab").into_bytes()
}

fn origin() -> Origin {
    Origin::start(|h| {
        let path = h.split(' ').nth(1).unwrap_or("").to_string();
        Some(answer(&path))
    })
}

fn conf(origin: u16) -> String {
    format!(
        "http {{ access_log off;\n\
         proxy_cache_path cache levels=1:2 keys_zone=z:1m;\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ proxy_pass http://127.0.0.1:{origin}; proxy_cache z;\n\
             proxy_cache_key $request_uri; proxy_cache_valid any 10m;\n\
             add_header X-Cache $upstream_cache_status always; }}\n\
         }} }}\n"
    )
}

/// The whole answer, Date and Server left out.
fn wire(port: u16, req: &str) -> String {
    let bytes = raw(port, req.as_bytes());
    String::from_utf8_lossy(&bytes)
        .split("\r\n")
        .filter(|l| !l.starts_with("Date: ") && !l.starts_with("Server: "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
}

/// Each path twice (MISS, then HIT), then hits asked otherwise: HEAD,
/// HTTP/1.0, and If-Modified-Since (a 304, whose line is nginx's own).
fn series(port: u16) -> Vec<String> {
    let mut reqs = Vec::new();
    for p in ["/found", "/moved", "/bare", "/fine", "/gone", "/odd", "/lm"] {
        reqs.push(get(p));
        reqs.push(get(p));
    }
    reqs.push("HEAD /found HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into());
    reqs.push("GET /bare HTTP/1.0\r\n\r\n".into());
    reqs.push(
        "GET /lm HTTP/1.1\r\nHost: x\r\nIf-Modified-Since: Mon, 01 Jan 2001 00:00:00 GMT\r\nConnection: close\r\n\r\n"
            .into(),
    );
    reqs.iter()
        .map(|r| format!("{}\n=> {}", r.lines().next().unwrap_or(""), wire(port, r)))
        .collect()
}

#[test]
fn hits_keep_the_upstream_status_line_as_nginx() {
    let o = origin();
    let c = conf(o.port);
    let tern = Server::start(&c);
    let ours = series(tern.port);
    drop(tern);
    let text = ours.join("\n\n");
    // Whatever nginx says: the hit of /found is sent with its upstream's
    // line, not tern's "302 Moved Temporarily".
    assert!(
        ours[1].contains("HTTP/1.1 302 Found\n") && ours[1].contains("X-Cache: HIT"),
        "{text}"
    );
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, &c, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = series(port);
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(a, b, "\ntern:\n{text}\n\nnginx:\n{}", theirs.join("\n\n"));
    }
}

fn cache_file(prefix: &Prefix, key: &str) -> std::path::PathBuf {
    let h = tern::cache::md5::hex(&tern::cache::md5::digest(key.as_bytes()));
    prefix.path(&format!("cache/{}/{}/{}", &h[31..], &h[29..31], h))
}

fn u32_at(b: &[u8], at: usize) -> usize {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w) as usize
}

/// The entry `v3` (the current format: 88 fixed bytes, then key, status
/// line, Vary, headers) as tern's first format wrote it: 56 fixed bytes,
/// no status line, and here a body of its own.
fn as_version_1(v3: &[u8], body: &[u8]) -> Vec<u8> {
    let (k, t, s, v) = (
        u32_at(v3, 48),
        u32_at(v3, 52),
        u32_at(v3, 56),
        u32_at(v3, 68),
    );
    let key = &v3[88..88 + k];
    let text = &v3[88 + k + s + v..88 + k + s + v + t];
    let mut v1 = b"TERNC\x001\n".to_vec();
    v1.extend_from_slice(&((56 + k + t) as u32).to_le_bytes());
    v1.extend_from_slice(&v3[12..40]);
    v1.extend_from_slice(&(body.len() as u64).to_le_bytes());
    v1.extend_from_slice(&v3[48..56]);
    v1.extend_from_slice(key);
    v1.extend_from_slice(text);
    v1.extend_from_slice(body);
    v1
}

/// An entry a previous tern wrote (format 1, no status line) is not
/// served after an upgrade: the request is a miss and the upstream's
/// answer replaces the file, in the current format.
#[test]
fn entries_of_the_previous_format_are_replaced_not_served() {
    let o = origin();
    let c = conf(o.port);
    let mut s = Server::start(&c);
    assert!(wire(s.port, &get("/found")).contains("X-Cache: MISS"));
    s.signal(SIGTERM);
    assert!(
        s.wait_exit(Duration::from_secs(5)).is_some(),
        "tern did not stop"
    );
    let prefix = std::mem::take(&mut s.prefix);
    let f = cache_file(&prefix, "/found");
    let v3 = std::fs::read(&f).expect("cache entry");
    assert!(v3.starts_with(b"TERNC\x003\n"));
    std::fs::write(&f, as_version_1(&v3, b"old")).expect("write v1 entry");
    let before = o.count();

    let s = Server::start_in(prefix, &c);
    let got = wire(s.port, &get("/found"));
    assert!(got.starts_with("HTTP/1.1 302 Found\n"), "{got}");
    assert!(
        got.contains("X-Cache: MISS") && got.ends_with("\nab"),
        "{got}"
    );
    assert_eq!(o.count(), before + 1);
    eventually(5, "the entry is rewritten in the current format", || {
        std::fs::read(&f).is_ok_and(|b| b.starts_with(b"TERNC\x003\n"))
    });
    let got = wire(s.port, &get("/found"));
    assert!(
        got.contains("X-Cache: HIT") && got.starts_with("HTTP/1.1 302 Found\n"),
        "{got}"
    );
    assert!(!s.error_log().contains("[crit]"), "{}", s.error_log());
}
