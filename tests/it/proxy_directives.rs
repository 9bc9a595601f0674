//! Proxy and upstream directives that were once accepted without effect:
//! upstream `keepalive_requests`, `proxy_cache_path ... min_free=`,
//! `proxy_temp_path` levels, and directives inside `limit_except`. Where
//! the reference nginx is installed, the configuration checks and the
//! connection counts are compared with it.
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::harness::*;
use crate::origin::Origin;

/// An origin that keeps each connection open and answers every request on
/// it: `/big` with 300 KB (more than one read, so tern streams it), any
/// other path with `hello`. Counts the connections it accepted.
fn keepalive_origin() -> (u16, Arc<AtomicUsize>) {
    let o = Origin::serve(|mut c| {
        while let Some(head) = c.next(false) {
            let body = if head.starts_with(b"GET /big") {
                vec![b'x'; 300_000]
            } else {
                b"hello".to_vec()
            };
            let mut resp =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
            resp.extend_from_slice(&body);
            if c.stream.write_all(&resp).is_err() {
                return;
            }
        }
    });
    let conns = o.conns();
    (o.detach(), conns)
}

fn keepalive_conf(origin: u16) -> String {
    format!(
        "worker_processes 1;
        http {{ access_log off;
            upstream ka {{ server 127.0.0.1:{}; keepalive 4; keepalive_requests 2; }}
            server {{ listen 127.0.0.1:@PORT@;
                location / {{ proxy_pass http://ka; proxy_http_version 1.1;
                    proxy_set_header Connection \"\"; }} }} }}",
        origin
    )
}

/// Five small answers then four streamed ones; returns the upstream
/// connections opened for them. `p`: the server's prefix, whose error
/// log a failure shows.
fn connections_for_nine_requests(port: u16, conns: &AtomicUsize, p: &Prefix) -> usize {
    let get = |path: &str| {
        let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let got = raw(port, req.as_bytes());
        Resp::parse(&got).unwrap_or_else(|| {
            panic!(
                "{path}: no response in {:?}; error.log: {}",
                String::from_utf8_lossy(&got),
                std::fs::read_to_string(p.path("logs/error.log")).unwrap_or_default()
            )
        })
    };
    for _ in 0..5 {
        let r = get("/s");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
    }
    for _ in 0..4 {
        let r = get("/big");
        assert_eq!((r.status, r.body.len()), (200, 300_000));
    }
    conns.load(Ordering::SeqCst)
}

#[test]
fn upstream_keepalive_requests_closes_a_connection_after_n_requests() {
    // keepalive_requests 2: small answers 1+2, 3+4, 5 and the first
    // streamed one, then 2 streamed per connection: 3 + 2 connections
    // (without the cap, one connection serves all nine).
    let (oport, conns) = keepalive_origin();
    let s = Server::start(&keepalive_conf(oport));
    assert_eq!(connections_for_nine_requests(s.port, &conns, &s.prefix), 5);

    if nginx_installed() {
        let (oport, conns) = keepalive_origin();
        let p = Prefix::new();
        let nport = free_port();
        let Some(_n) = start_nginx(&p, &keepalive_conf(oport), nport) else {
            return;
        };
        assert_eq!(connections_for_nine_requests(nport, &conns, &p), 5, "nginx");
    }
}

/// `-t` on `http { BODY }`: whether it passed, and stderr.
fn check(bin: &str, body: &str) -> (bool, String) {
    let p = Prefix::new();
    let f = p.write(
        "conf/t.conf",
        format!(
            "pid {}/t.pid;\nevents {{}}\nhttp {{ access_log off;\n{}\n}}\n",
            p.dir.display(),
            body
        ),
    );
    let out = std::process::Command::new(bin)
        .arg("-p")
        .arg(format!("{}/", p.dir.display()))
        .arg("-e")
        .arg(p.path("logs/error.log"))
        .arg("-t")
        .arg("-c")
        .arg(&f)
        .output()
        .expect("run -t");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), err)
}

/// Each case: the http block's body and the error (None: accepted), which
/// both tern and nginx must print for line 4.
fn same_checks_as_nginx(cases: &[(&str, Option<&str>)]) {
    let nginx = nginx_installed();
    for (body, want) in cases {
        let bins: &[&str] = if nginx { &[BIN, NGINX] } else { &[BIN] };
        for bin in bins {
            let (ok, err) = check(bin, body);
            match want {
                None => assert!(ok, "{bin}: {body}: {err}"),
                Some(msg) => {
                    assert!(!ok, "{bin}: {body} accepted");
                    assert!(
                        err.contains("[emerg] ") && err.contains(msg),
                        "{bin}: {body}: {err}"
                    );
                    assert!(err.contains("t.conf:4"), "{bin}: {body}: {err}");
                }
            }
        }
    }
}

#[test]
fn upstream_keepalive_requests_is_checked_like_nginx() {
    let ups = |v: &str| format!("upstream u {{ server 127.0.0.1:1; keepalive 2; {} }}", v);
    same_checks_as_nginx(&[
        (
            &ups("keepalive_requests abc;"),
            Some("\"keepalive_requests\" directive invalid number"),
        ),
        (
            &ups("keepalive_requests -1;"),
            Some("\"keepalive_requests\" directive invalid number"),
        ),
        (
            &ups("keepalive_requests 99999999999999999999;"),
            Some("\"keepalive_requests\" directive invalid number"),
        ),
        (
            &ups("keepalive_requests 5; keepalive_requests 6;"),
            Some("\"keepalive_requests\" directive is duplicate"),
        ),
        (&ups("keepalive_requests 0;"), None),
        (&ups("keepalive_requests 4294967296;"), None),
    ]);
}

#[test]
fn proxy_temp_path_levels_are_checked_like_nginx() {
    let bad = Some("\"proxy_temp_path\" directive invalid value");
    same_checks_as_nginx(&[
        ("proxy_temp_path /tmp/x 0;", bad),
        ("proxy_temp_path /tmp/x a;", bad),
        ("proxy_temp_path /tmp/x +1;", bad),
        ("proxy_temp_path /tmp/x 11;", bad),
        ("proxy_temp_path /tmp/x 5 6;", bad),
        ("proxy_temp_path /tmp/x 4 4 4;", bad),
        (
            "proxy_temp_path /tmp/x 1 2 2 2;",
            Some("invalid number of arguments in \"proxy_temp_path\" directive"),
        ),
        ("proxy_temp_path /tmp/x 3;", None),
        ("proxy_temp_path /tmp/x 10;", None),
        ("proxy_temp_path /tmp/x 1 2;", None),
        ("proxy_temp_path /tmp/x 3 3 3;", None),
        ("proxy_temp_path /tmp/x 01;", None),
    ]);
    // nginx's sum of the levels wraps around here and it accepts them;
    // tern refuses levels that cannot fit.
    for d in ["proxy_temp_path", "client_body_temp_path"] {
        let (ok, err) = check(
            BIN,
            &format!("{d} /tmp/x 9223372036854775807 9223372036854775807 2;"),
        );
        assert!(!ok, "{d} accepted");
        assert!(
            err.contains(&format!("\"{d}\" directive invalid value")) && err.contains("t.conf:4"),
            "{err}"
        );
    }
}

#[test]
fn proxy_temp_path_with_levels_still_buffers_to_its_directory() {
    // Levels have no effect (temp files are unlinked at once), but a
    // response larger than the buffers still goes through the directory.
    let (oport, _conns) = keepalive_origin();
    let s = Server::start(&format!(
        "http {{ access_log off; server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_pass http://127.0.0.1:{}; proxy_buffers 2 4k;
                proxy_temp_path ptemp 1 2; }} }} }}",
        oport
    ));
    let r = s.get("/big");
    assert_eq!((r.status, r.body.len()), (200, 300_000));
    assert!(exists(&s.prefix.path("ptemp")));
}

#[test]
fn proxy_cache_path_min_free_is_checked_like_nginx() {
    let cp = |v: &str| format!("proxy_cache_path cache keys_zone=z:1m {};", v);
    same_checks_as_nginx(&[
        (
            &cp("min_free=abc"),
            Some("invalid min_free value \"min_free=abc\""),
        ),
        (
            &cp("min_free=-1"),
            Some("invalid min_free value \"min_free=-1\""),
        ),
        (
            &cp("min_free="),
            Some("invalid min_free value \"min_free=\""),
        ),
        (
            &cp("min_free=1x"),
            Some("invalid min_free value \"min_free=1x\""),
        ),
        (&cp("min_free=0"), None),
        (&cp("min_free=10m"), None),
        (&cp("min_free=1K"), None),
        (&cp("min_free=10g"), None),
        (&cp("min_free=10m min_free=20m"), None),
    ]);
}

fn min_free_conf(origin: u16, min_free: &str) -> String {
    format!(
        "http {{ access_log off;
            proxy_cache_path cache levels=1:2 keys_zone=z:1m min_free={};
            server {{ listen 127.0.0.1:@PORT@;
                location / {{ proxy_pass http://127.0.0.1:{}; proxy_cache z;
                    proxy_cache_key $request_uri; proxy_cache_valid 200 10m;
                    add_header X-Cache $upstream_cache_status; }} }} }}",
        min_free, origin
    )
}

fn cache_entry(p: &Prefix, key: &str) -> std::path::PathBuf {
    let h = tern::cache::md5::hex(&tern::cache::md5::digest(key.as_bytes()));
    p.path(&format!("cache/{}/{}/{}", &h[31..], &h[29..31], h))
}

#[test]
fn cache_manager_evicts_while_free_space_is_below_min_free() {
    let (oport, _conns) = keepalive_origin();
    // More than any test machine's disk has free: the manager keeps
    // evicting, so an entry lasts about a second.
    let s = Server::start(&min_free_conf(oport, "9000000g"));
    assert_eq!(s.get("/a").header("X-Cache"), Some("MISS"));
    // The manager may evict it before this test looks (it checks every
    // second), so only its going is asserted; the second server below
    // shows that such an entry is written and kept otherwise.
    let f = cache_entry(&s.prefix, "/a");
    eventually(5, "the entry evicted for min_free", || !exists(&f));
    assert_eq!(s.get("/a").header("X-Cache"), Some("MISS"));

    // A threshold the file system meets: entries stay.
    let s = Server::start(&min_free_conf(oport, "1k"));
    assert_eq!(s.get("/b").header("X-Cache"), Some("MISS"));
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(exists(&cache_entry(&s.prefix, "/b")));
    assert_eq!(s.get("/b").header("X-Cache"), Some("HIT"));
}

fn limit_except_conf(origin: u16) -> String {
    format!(
        "http {{ access_log off; log_format le \"LE $request_method $uri $status\";
            server {{ listen 127.0.0.1:@PORT@;
                location /r {{ return 200 \"ret\\n\"; limit_except GET {{ allow all; }} }}
                location /d {{ deny 127.0.0.1; limit_except GET {{ allow all; }} }}
                location /l {{ limit_except GET {{ access_log logs/le.log le; }}
                    return 200 \"l\\n\"; }}
                location /p {{ limit_except GET {{ proxy_pass http://127.0.0.1:{o}; }} }}
                location /q {{ proxy_pass http://127.0.0.1:{o}; limit_except GET {{ deny all; }} }}
            }} }}",
        o = origin
    )
}

/// Status and (for 200) body of each method on each path.
fn limit_except_answers(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    for m in ["GET", "HEAD", "POST", "DELETE"] {
        for path in ["/r", "/d", "/l", "/p", "/q"] {
            let req = format!(
                "{m} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let r = Resp::parse(&raw(port, req.as_bytes())).expect("a response");
            let body = if r.status == 200 {
                r.body_str()
            } else {
                String::new()
            };
            out.push(format!("{m} {path} {} {}", r.status, body.trim_end()));
        }
    }
    out
}

fn limit_except_prefix() -> Prefix {
    let p = Prefix::new();
    for f in ["r", "d", "l", "p"] {
        p.write(&format!("html/{f}"), format!("static {f}\n"));
    }
    p
}

#[test]
fn limit_except_block_is_the_configuration_of_unlisted_methods() {
    let (oport, _conns) = keepalive_origin();
    let s = Server::start_in(limit_except_prefix(), &limit_except_conf(oport));
    let got = limit_except_answers(s.port);
    let want = [
        "GET /r 200 ret",
        "GET /d 403 ",
        "GET /l 200 l",
        "GET /p 200 static p",
        "GET /q 200 hello",
        "HEAD /r 200 ",
        "HEAD /d 403 ",
        "HEAD /l 200 ",
        "HEAD /p 200 ",
        "HEAD /q 200 ",
        // Unlisted: the block's configuration, without the location's
        // return (a static file, which POST may not have), with its rules
        // instead of the location's, its proxy_pass and its access_log.
        "POST /r 405 ",
        "POST /d 405 ",
        "POST /l 405 ",
        "POST /p 200 hello",
        "POST /q 403 ",
        "DELETE /r 405 ",
        "DELETE /d 405 ",
        "DELETE /l 405 ",
        "DELETE /p 200 hello",
        "DELETE /q 403 ",
    ];
    assert_eq!(got, want);
    // Access-log lines are written by a writer thread.
    let log = "LE POST /l 405\nLE DELETE /l 405\n";
    let path = s.prefix.path("logs/le.log");
    eventually(5, "the limit_except access log", || {
        std::fs::read_to_string(&path).unwrap_or_default() == log
    });

    if nginx_installed() {
        let (oport, _conns) = keepalive_origin();
        let p = limit_except_prefix();
        let nport = free_port();
        let Some(_n) = start_nginx(&p, &limit_except_conf(oport), nport) else {
            return;
        };
        assert_eq!(limit_except_answers(nport), want, "nginx");
        assert_eq!(p.read("logs/le.log"), log, "nginx");
    }
}

#[test]
fn proxy_pass_with_uri_in_limit_except_is_refused_like_nginx() {
    same_checks_as_nginx(&[
        (
            "server { location /x { limit_except GET { proxy_pass http://127.0.0.1:1/y; } } }",
            Some("\"proxy_pass\" cannot have URI part in location given by regular expression, or inside named location, or inside \"if\" statement, or inside \"limit_except\" block"),
        ),
        (
            "server { location /x { limit_except GET { proxy_pass http://127.0.0.1:1; } } }",
            None,
        ),
    ]);
}

#[test]
fn proxy_pass_with_uri_where_no_prefix_is_refused_like_nginx() {
    let msg = "\"proxy_pass\" cannot have URI part in location given by regular expression, or inside named location, or inside \"if\" statement, or inside \"limit_except\" block";
    same_checks_as_nginx(&[
        (
            "server { location ~ ^/r/ { proxy_pass http://127.0.0.1:1/y; } }",
            Some(msg),
        ),
        (
            "server { location @n { proxy_pass http://127.0.0.1:1/y; } }",
            Some(msg),
        ),
        (
            "server { location / { if ($arg_a) { proxy_pass http://127.0.0.1:1/y; } } }",
            Some(msg),
        ),
        (
            "server { location ~ ^/r/ { proxy_pass http://127.0.0.1:1; } }",
            None,
        ),
        (
            "server { location @n { proxy_pass http://127.0.0.1:1; } }",
            None,
        ),
        // A prefix location, and a regex one nested in it: the URI part
        // belongs to the prefix location only.
        (
            "server { location /p/ { proxy_pass http://127.0.0.1:1/y/; location ~ z { } } }",
            None,
        ),
    ]);
}
