//! proxy_pass, upstream and proxy_cache against a small loopback origin.
//! Expected bytes (headers sent upstream, relayed headers, error pages and
//! log lines, cache file paths) were taken from nginx 1.22.1 on the same
//! configurations.
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::harness::*;
use crate::origin::Origin;

fn get_with(s: &Server, path: &str, headers: &str) -> Resp {
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: localhost\r\n{}Connection: close\r\n\r\n",
        path, headers
    );
    Resp::parse(&s.raw(req.as_bytes())).expect("a response")
}

#[test]
fn proxies_headers_status_and_body_as_nginx() {
    let o = Origin::start(|head| {
        if head.starts_with("GET /missing") {
            return Some(
                b"HTTP/1.0 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: 4\r\n\r\nnope"
                    .to_vec(),
            );
        }
        Some(Origin::ok(
            "hello",
            "X-Origin: yes\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nServer: origin\r\nX-Accel-Expires: 10\r\nX-Accel-Foo: bar\r\n",
        ))
    });
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_pass http://127.0.0.1:{p}; proxy_set_header X-Real-IP $remote_addr; }}
            location /r/ {{ proxy_pass http://127.0.0.1:{p}/x/; }}
        }} }}",
        p = o.port
    );
    let s = Server::start(&conf);
    let r = get_with(
        &s,
        "/a/b?q=1",
        "X-Foo: 1\r\nKeep-Alive: 300\r\nTE: trailers\r\nUpgrade: h2c\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello");
    assert_eq!(r.header("X-Origin"), Some("yes"));
    assert_eq!(r.header("X-Accel-Foo"), Some("bar"));
    assert_eq!(r.header("Content-Length"), Some("5"));
    assert_eq!(r.header("Content-Type"), Some("text/plain"));
    assert!(r.header("Keep-Alive").is_none(), "hop-by-hop relayed");
    assert!(r.header("X-Accel-Expires").is_none());
    assert!(r.header("Server").unwrap_or("").starts_with("tern"));
    // What nginx 1.22.1 sends for the same request and configuration.
    assert_eq!(
        o.requests()[0],
        format!(
            "GET /a/b?q=1 HTTP/1.0\r\nX-Real-IP: 127.0.0.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nX-Foo: 1\r\n\r\n",
            o.port
        )
    );
    // The location prefix is replaced by the proxy_pass URI.
    let r = s.get("/r/abc?z");
    assert_eq!(r.status, 200);
    assert!(o.requests()[1].starts_with("GET /x/abc?z HTTP/1.0\r\n"));
    // Upstream errors are relayed with their own body, not an error page.
    let r = s.get("/missing");
    assert_eq!((r.status, r.body.as_slice()), (404, &b"nope"[..]));
}

#[test]
fn large_close_delimited_response_streams_chunked() {
    let big: String = (0..200_000)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let b2 = big.clone();
    // Close-delimited, as HTTP/1.0 origins do.
    let o = Origin::start(move |_| {
        Some(format!("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n{}", b2).into_bytes())
    });
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_pass http://127.0.0.1:{}; proxy_buffers 4 4k; }} }} }}",
        o.port
    );
    let s = Server::start(&conf);
    let r = s.get("/big");
    assert_eq!(r.status, 200);
    // The length is unknown while the body streams: chunked, as nginx.
    assert_eq!(r.header("Content-Length"), None);
    assert_eq!(r.header("Transfer-Encoding"), Some("chunked"));
    assert!(
        r.body == big.as_bytes(),
        "body differs ({} bytes)",
        r.body.len()
    );
    // The temp file is gone once served.
    let left: Vec<_> = std::fs::read_dir(s.prefix.path("proxy_temp"))
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "temp files left: {:?}", left);
}

#[test]
fn bad_gateway_and_gateway_timeout() {
    let dead = free_port();
    let silent = Origin::start(|_| None);
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;
            location /dead/ {{ proxy_pass http://127.0.0.1:{}; }}
            location /slow/ {{ proxy_pass http://127.0.0.1:{}; proxy_read_timeout 300ms; }}
        }} }}",
        dead, silent.port
    );
    let s = Server::start(&conf);
    let r = s.get("/dead/x");
    assert_eq!(r.status, 502);
    assert!(r.body_str().contains("<title>502 Bad Gateway</title>"));
    let log = s.wait_error_log("connect() failed");
    let want = format!(
        "connect() failed (111: Connection refused) while connecting to upstream, client: 127.0.0.1, server: , request: \"GET /dead/x HTTP/1.1\", upstream: \"http://127.0.0.1:{}/dead/x\", host: \"localhost\"",
        dead
    );
    assert!(log.contains(&want), "error log: {}", log);
    let t = std::time::Instant::now();
    let r = s.get("/slow/y");
    assert_eq!(r.status, 504);
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(r.body_str().contains("<title>504 Gateway Time-out</title>"));
    s.wait_error_log("upstream timed out (110: Connection timed out) while reading response header from upstream");
}

#[test]
fn upstream_round_robin_and_failover() {
    let a = Origin::start(|_| Some(Origin::ok("A", "")));
    let b = Origin::start(|_| Some(Origin::ok("B", "")));
    let dead = free_port();
    let conf = format!(
        "http {{
            upstream pair {{ server 127.0.0.1:{}; server 127.0.0.1:{}; }}
            upstream flaky {{ server 127.0.0.1:{}; server 127.0.0.1:{}; }}
            upstream spare {{ server 127.0.0.1:{} max_fails=1; server 127.0.0.1:{} backup; }}
            server {{ listen 127.0.0.1:@PORT@;
                location /rr {{ proxy_pass http://pair; }}
                location /flaky {{ proxy_pass http://flaky; }}
                location /spare {{ proxy_pass http://spare; }}
            }} }}",
        a.port, b.port, dead, a.port, dead, b.port
    );
    let s = Server::start(&conf);
    let bodies: Vec<Vec<u8>> = (0..4).map(|_| s.get("/rr").body).collect();
    assert_eq!(
        bodies,
        vec![b"A".to_vec(), b"B".to_vec(), b"A".to_vec(), b"B".to_vec()]
    );
    assert!(a.requests()[0].contains("Host: pair\r\n"));
    // A dead peer: the request fails over to the live one.
    for _ in 0..3 {
        let r = s.get("/flaky");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"A"[..]));
    }
    s.wait_error_log("connect() failed (111: Connection refused)");
    // The backup answers only when the primary fails.
    let r = s.get("/spare");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"B"[..]));
}

fn md5_hex(key: &str) -> String {
    tern::cache::md5::hex(&tern::cache::md5::digest(key.as_bytes()))
}

/// nginx's `levels=1:2` path of a key.
fn cache_file(prefix: &Prefix, dir: &str, key: &str) -> PathBuf {
    let h = md5_hex(key);
    prefix.path(&format!("{}/{}/{}/{}", dir, &h[31..], &h[29..31], h))
}

fn cache_conf(origin: u16, valid: &str) -> String {
    format!(
        "http {{
            proxy_cache_path cache levels=1:2 keys_zone=z:1m use_temp_path=off;
            server {{ listen 127.0.0.1:@PORT@;
                location / {{ proxy_pass http://127.0.0.1:{}; proxy_cache z;
                    proxy_cache_key $request_uri; proxy_cache_valid 200 {};
                    add_header X-Cache $upstream_cache_status; }}
            }} }}",
        origin, valid
    )
}

/// Stops a server but keeps its prefix (for a restart on the same cache).
fn stop_keep_prefix(mut s: Server) -> Prefix {
    s.signal(SIGTERM);
    assert!(
        s.wait_exit(Duration::from_secs(5)).is_some(),
        "tern did not stop"
    );
    std::mem::take(&mut s.prefix)
}

#[test]
fn cache_miss_then_hit_with_origin_down_in_nginx_layout() {
    let o = Origin::start(|h| {
        let path = h.split(' ').nth(1).unwrap_or("").to_string();
        Some(Origin::ok(
            &format!("object {}\n", path),
            "X-Origin: yes\r\n",
        ))
    });
    let s = Server::start(&cache_conf(o.port, "10m"));
    let r = s.get("/obj1");
    assert_eq!((r.status, r.header("X-Cache")), (200, Some("MISS")));
    assert_eq!(r.body, b"object /obj1\n");
    let f = cache_file(&s.prefix, "cache", "/obj1");
    assert!(f.exists(), "no cache file at {}", f.display());
    o.stop();
    let r = s.get("/obj1");
    assert_eq!((r.status, r.header("X-Cache")), (200, Some("HIT")));
    assert_eq!(r.body, b"object /obj1\n");
    assert_eq!(r.header("X-Origin"), Some("yes"));
    assert_eq!(r.header("Content-Type"), Some("text/plain"));
    assert_eq!(o.count(), 1);
    // HEAD from cache: headers only.
    let raw = s.raw(b"HEAD /obj1 HTTP/1.0\r\n\r\n");
    let head = String::from_utf8_lossy(&raw);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{}", head);
    assert!(head.contains("Content-Length: 13\r\n") && head.ends_with("\r\n\r\n"));
    // Not cached without an origin: 502.
    assert_eq!(s.get("/other").status, 502);
}

#[test]
fn crash_leftovers_and_partial_entries_are_never_served() {
    let o = Origin::start(|h| {
        let path = h.split(' ').nth(1).unwrap_or("").to_string();
        Some(Origin::ok(&format!("fresh {}\n", path), ""))
    });
    let s = Server::start(&cache_conf(o.port, "10m"));
    for p in ["/keep", "/cut", "/tmpl"] {
        assert_eq!(s.get(p).status, 200);
    }
    let prefix = stop_keep_prefix(s);
    // A machine crash can leave a short file under the final name, and a
    // tern crash a temp file beside it.
    let cut = cache_file(&prefix, "cache", "/cut");
    let data = std::fs::read(&cut).expect("cut entry");
    std::fs::write(&cut, &data[..data.len() - 3]).unwrap();
    let full = cache_file(&prefix, "cache", "/tmpl");
    let tmp_entry = cache_file(&prefix, "cache", "/leftover");
    std::fs::create_dir_all(tmp_entry.parent().unwrap()).unwrap();
    let leftover = PathBuf::from(format!("{}.tern-tmp-1-1", tmp_entry.display()));
    std::fs::copy(&full, &leftover).unwrap();
    o.stop();

    let s = Server::start_in(prefix, &cache_conf(o.port, "10m"));
    // Written by the previous run, complete: served.
    let r = s.get("/keep");
    assert_eq!((r.status, r.header("X-Cache")), (200, Some("HIT")));
    assert_eq!(r.body, b"fresh /keep\n");
    // Truncated: not served (the origin is down, so 502).
    let r = s.get("/cut");
    assert_eq!(r.status, 502, "served a partial entry: {:?}", r.body_str());
    // The leftover temp file is deleted by the loader, never served.
    assert_eq!(s.get("/leftover").status, 502);
    eventually(5, "loader removes the temp file", || !leftover.exists());
    eventually(5, "loader removes the partial entry", || !cut.exists());
    assert!(full.exists());
}

#[test]
fn entries_expire_by_proxy_cache_valid() {
    let o = Origin::start(|_| Some(Origin::ok("v", "")));
    let s = Server::start(&cache_conf(o.port, "1s"));
    assert_eq!(s.get("/e").header("X-Cache"), Some("MISS"));
    assert_eq!(s.get("/e").header("X-Cache"), Some("HIT"));
    assert_eq!(o.count(), 1);
    std::thread::sleep(Duration::from_millis(2100));
    let r = s.get("/e");
    assert_eq!((r.status, r.header("X-Cache")), (200, Some("EXPIRED")));
    assert_eq!(o.count(), 2);
    assert_eq!(s.get("/e").header("X-Cache"), Some("HIT"));
}

#[test]
fn upstream_cache_control_wins_over_proxy_cache_valid() {
    let o = Origin::start(|h| {
        Some(if h.starts_with("GET /private") {
            Origin::ok("p", "Cache-Control: private\r\n")
        } else if h.starts_with("GET /cookie") {
            Origin::ok("c", "Set-Cookie: a=b\r\n")
        } else {
            Origin::ok("n", "Cache-Control: max-age=0\r\n")
        })
    });
    let s = Server::start(&cache_conf(o.port, "10m"));
    for p in ["/private", "/cookie", "/zero"] {
        assert_eq!(s.get(p).header("X-Cache"), Some("MISS"));
        assert_eq!(s.get(p).header("X-Cache"), Some("MISS"), "{} was cached", p);
    }
    assert_eq!(o.count(), 6);
}

#[test]
fn http11_keepalive_connections_and_chunked_responses() {
    // An origin that serves many requests per connection, chunked.
    let o = Origin::serve(|mut c| {
        while let Some(head) = c.next(false) {
            c.record(&head);
            let resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n";
            if c.stream.write_all(resp).is_err() {
                return;
            }
        }
    });
    let (port, conns) = (o.port, o.conns());
    let conf = format!(
        "http {{ upstream ka {{ server 127.0.0.1:{}; keepalive 4; }}
            server {{ listen 127.0.0.1:@PORT@;
                location / {{ proxy_pass http://ka; proxy_http_version 1.1;
                    proxy_set_header Connection \"\"; }} }} }}",
        port
    );
    let s = Server::start(&conf);
    for _ in 0..3 {
        let r = s.get("/k");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
        // Relayed chunked, as nginx relays a chunked body (also one that
        // arrived whole with the head).
        assert!(r.header("Content-Length").is_none());
        assert_eq!(r.header("Transfer-Encoding"), Some("chunked"));
    }
    let seen = o.requests();
    assert_eq!(seen.len(), 3);
    assert!(
        seen[0].starts_with("GET /k HTTP/1.1\r\nHost: ka\r\n"),
        "{}",
        seen[0]
    );
    assert!(!seen[0].contains("Connection:"), "{}", seen[0]);
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "upstream connection not reused"
    );
}

#[test]
fn interim_response_in_the_same_segment_as_the_final_one() {
    // A 100 Continue and the real answer in one write: the buffered final
    // response must be parsed without waiting for more bytes.
    let origin = Origin::start(|_| {
        Some(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        )
    });
    let conf = format!(
        "http {{ access_log off; server {{ listen 127.0.0.1:@PORT@; \
         location / {{ proxy_pass http://127.0.0.1:{}; proxy_read_timeout 2s; }} }} }}",
        origin.port
    );
    let s = Server::start(&conf);
    // Without re-parsing the buffered bytes this is a 502 (the origin
    // closes) or a 504 (read timeout).
    let r = s.get("/x");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"ok"[..]),
        "{}",
        r.head
    );
}

#[test]
fn upstream_charset_is_kept_and_never_doubled() {
    // nginx 1.22.1 on the same config: the upstream's charset stays (no
    // second `charset=`); with override_charset on, a different one would
    // need a charset_map, so it stays too and the error is logged, and the
    // same one is respelled as the directive writes it.
    let o = Origin::start(|head| {
        let ct = if head.contains("/q") {
            "text/html;charset=\"UTF-8\""
        } else {
            "text/html; charset=koi8-r"
        };
        // koi8-r for "аб": bytes a recoding would have changed.
        let mut r = format!("HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nContent-Length: 3\r\n\r\n")
            .into_bytes();
        r.extend_from_slice(b"\xc1\xc2\n");
        Some(r)
    });
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@; charset utf-8;
            location /off/ {{ proxy_pass http://127.0.0.1:{p}/; }}
            location /on/ {{ override_charset on; proxy_pass http://127.0.0.1:{p}/; }}
        }} }}",
        p = o.port
    );
    let s = Server::start(&conf);
    let ct = |path: &str| s.get(path).header("Content-Type").map(str::to_string);
    assert_eq!(ct("/off/k").as_deref(), Some("text/html; charset=koi8-r"));
    assert_eq!(ct("/off/q").as_deref(), Some("text/html;charset=\"UTF-8\""));
    let r = s.get("/on/k");
    assert_eq!(r.header("Content-Type"), Some("text/html; charset=koi8-r"));
    assert_eq!(r.body, b"\xc1\xc2\n");
    assert_eq!(ct("/on/q").as_deref(), Some("text/html; charset=utf-8"));
    s.wait_error_log("no \"charset_map\"");
    // A 404's line: every line of the requests above is in before it.
    let log = s.error_log_after("GET /nope HTTP/1.0\r\n\r\n", "/nope\" failed");
    assert_eq!(
        log.matches("no \"charset_map\" between the charsets \"koi8-r\" and \"utf-8\"")
            .count(),
        1,
        "{log}"
    );
}

/// tern killed with SIGKILL while an entry is being filled (its body half
/// arrived): after a restart on the same cache, entries complete before
/// the kill are found (the loader, or the lookup's adoption) and served
/// as HITs; the half-written one is never served, it is fetched anew.
#[test]
fn kill_9_mid_fill_then_restart_serves_whole_entries_only() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let second = Arc::new(AtomicBool::new(false));
    let s2 = second.clone();
    let o = Origin::serve(move |mut c| {
        let Some(h) = c.next(false) else { return };
        let h = String::from_utf8_lossy(&h).to_string();
        let run = if s2.load(Ordering::SeqCst) {
            "second"
        } else {
            "first"
        };
        if h.starts_with("GET /half") && run == "first" {
            // The head and 10 of 100000 bytes, then nothing until the
            // connection goes (tern is killed meanwhile).
            let _ = c
                .stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n0123456789");
            let _ = c.stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut b = [0u8; 16];
            let _ = std::io::Read::read(&mut c.stream, &mut b);
            return;
        }
        let _ = c
            .stream
            .write_all(&Origin::ok(&format!("{} run\n", run), ""));
    });
    let s = Server::start(&cache_conf(o.port, "10m"));
    let r = s.get("/whole");
    assert_eq!((r.status, r.header("X-Cache")), (200, Some("MISS")));
    // The half entry: read what comes, then kill tern mid-body.
    let mut c = connect(s.port);
    c.write_all(b"GET /half HTTP/1.0\r\n\r\n").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match std::io::Read::read(&mut c, &mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
        }
    }
    let head = String::from_utf8_lossy(&got).to_string();
    assert!(head.contains("X-Cache: MISS\r\n"), "{}", head);
    // The first bytes reach the entry's temp file meanwhile (or not: the
    // half entry must not be served either way).
    std::thread::sleep(Duration::from_millis(300));
    let mut s = s;
    s.signal(9);
    assert!(
        s.wait_exit(Duration::from_secs(5)).is_some(),
        "tern did not die"
    );
    let prefix = std::mem::take(&mut s.prefix);
    drop(s);
    second.store(true, Ordering::SeqCst);

    let s = Server::start_in(prefix, &cache_conf(o.port, "10m"));
    let r = s.get("/whole");
    assert_eq!((r.status, r.header("X-Cache")), (200, Some("HIT")));
    assert_eq!(r.body, b"first run\n");
    let r = s.get("/half");
    assert_eq!((r.status, r.header("X-Cache")), (200, Some("MISS")));
    assert_eq!(r.body, b"second run\n");
    let r = s.get("/half");
    assert_eq!((r.status, r.header("X-Cache")), (200, Some("HIT")));
}
