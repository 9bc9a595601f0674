//! `proxy_cache_use_stale`, `proxy_cache_background_update`,
//! `proxy_cache_lock*`, `proxy_cache_revalidate`, `proxy_cache_min_uses`
//! and `proxy_cache_convert_head`: the same configuration (backends inside
//! it, or small loopback origins on fixed ports) runs on tern and on the
//! real nginx, and the statuses, `$upstream_cache_status` and bodies are
//! compared.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::harness::{
    free_port, nginx_installed, raw, start_nginx, ConfTest, DeadPort, Prefix, Resp, Server,
};
use crate::origin::Origin;

/// Status, `$upstream_cache_status` and body of one GET.
pub(crate) fn ask(port: u16, path: &str) -> (u16, String, String) {
    ask_m(port, "GET", path)
}

fn ask_m(port: u16, method: &str, path: &str) -> (u16, String, String) {
    let req = format!(
        "{} {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        method, path
    );
    let got = raw(port, req.as_bytes());
    let r = Resp::parse(&got).unwrap_or_else(|| {
        panic!(
            "no response to {} {} on port {}: {:?}",
            method,
            path,
            port,
            String::from_utf8_lossy(&got)
        )
    });
    let body = r.body_str();
    let body = if body.contains("<html>") {
        "(error page)".to_string()
    } else {
        body
    };
    (r.status, r.header("X-C").unwrap_or("-").to_string(), body)
}

/// Runs `series` on tern and, when installed, on nginx with the same
/// configuration; returns tern's lines after comparing them.
pub(crate) fn both(body: &str, series: impl Fn(u16) -> Vec<String>) -> Vec<String> {
    both_in(body, |_| {}, series)
}

pub(crate) fn both_in(
    body: &str,
    setup: impl Fn(&Prefix),
    series: impl Fn(u16) -> Vec<String>,
) -> Vec<String> {
    let p = Prefix::new();
    setup(&p);
    let tern = Server::start_in(p, body);
    let ours = series(tern.port);
    let log = tern.error_log();
    drop(tern);
    if !nginx_installed() {
        return ours;
    }
    let p = Prefix::new();
    setup(&p);
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, body, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = series(port);
    assert_eq!(
        ours.join("\n"),
        theirs.join("\n"),
        "\ntern:\n{}\nnginx:\n{}\ntern's error log:\n{}",
        ours.join("\n"),
        theirs.join("\n"),
        log
    );
    ours
}

/// A backend on a fixed port that answers every request with a head
/// nginx cannot parse.
fn garbage_backend() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let mut b = [0u8; 4096];
            let _ = c.read(&mut b);
            // A NUL in a header name: invalid for nginx's parser too.
            let _ = c.write_all(b"HTTP/1.1 200 OK\r\nX\0: y\r\n\r\n");
        }
    });
    port
}

#[test]
fn use_stale_serves_the_expired_entry_in_the_listed_cases_as_nginx() {
    let (good, e500, e404) = (free_port(), free_port(), free_port());
    // Held for the whole test, tern's run and nginx's: a port from
    // free_port() that another process on the machine starts listening on
    // turns the refused connections of /err, /noerr and /off into answers.
    let dead_port = DeadPort::new();
    let dead = dead_port.port;
    // Accepts (the kernel completes the handshake) and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_port = silent.local_addr().expect("addr").port();
    let garbage = garbage_backend();
    let loc = |name: &str, to: u16, stale: &str| {
        format!("location /{name} {{ proxy_pass http://127.0.0.1:{to}/; {stale} }}\n",)
    };
    let mut locs = String::new();
    locs += &loc("fill", good, "");
    locs += &loc("err", dead, "proxy_cache_use_stale error;");
    locs += &loc("noerr", dead, "proxy_cache_use_stale timeout http_500;");
    locs += &loc("off", dead, "proxy_cache_use_stale off;");
    locs += &loc(
        "timeout",
        silent_port,
        "proxy_cache_use_stale timeout; proxy_read_timeout 300ms;",
    );
    locs += &loc(
        "timeout_no",
        silent_port,
        "proxy_cache_use_stale error; proxy_read_timeout 300ms;",
    );
    locs += &loc("inv", garbage, "proxy_cache_use_stale invalid_header;");
    locs += &loc("inv_no", garbage, "proxy_cache_use_stale error http_502;");
    locs += &loc("h500", e500, "proxy_cache_use_stale http_500;");
    locs += &loc("h500_no", e500, "proxy_cache_use_stale error http_502;");
    locs += &loc("h404", e404, "proxy_cache_use_stale http_404 http_503;");
    let body = format!(
        "http {{ access_log off;\n\
         proxy_cache_path cache levels=1:2 keys_zone=z:1m;\n\
         server {{ listen 127.0.0.1:{good}; return 200 \"fresh $arg_k\"; }}\n\
         server {{ listen 127.0.0.1:{e500}; return 500 \"e500\"; }}\n\
         server {{ listen 127.0.0.1:{e404}; return 404 \"e404\"; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           proxy_cache z; proxy_cache_key $arg_k; proxy_cache_valid 200 1s;\n\
           add_header X-C $upstream_cache_status always;\n\
           {locs}\
         }}\n\
         }}\n"
    );
    let cases = [
        "err",
        "noerr",
        "off",
        "timeout",
        "timeout_no",
        "inv",
        "inv_no",
        "h500",
        "h500_no",
        "h404",
    ];
    let ours = both(&body, |port| {
        let mut out = Vec::new();
        for c in cases {
            let (s, x, b) = ask(port, &format!("/fill?k={}", c));
            out.push(format!("fill {} {} {} {}", c, s, x, b));
        }
        // proxy_cache_valid 200 1s: expired after two seconds.
        std::thread::sleep(Duration::from_millis(2100));
        for round in 0..2 {
            for c in cases {
                let (s, x, b) = ask(port, &format!("/{}?k={}", c, c));
                out.push(format!("{} {} {} {} {}", round, c, s, x, b));
            }
        }
        out
    });
    drop(silent);
    let text = ours.join("\n");
    // Whatever nginx says, these are what the directive is about.
    for want in [
        "0 err 200 STALE fresh err",
        "0 noerr 502 EXPIRED (error page)",
        "0 timeout 200 STALE fresh timeout",
        "0 timeout_no 504 EXPIRED (error page)",
        "0 inv 200 STALE fresh inv",
        "0 h500 200 STALE fresh h500",
        "0 h500_no 500 EXPIRED e500",
        "1 h404 200 STALE fresh h404",
    ] {
        assert!(ours.iter().any(|l| l == want), "no {:?} in\n{}", want, text);
    }
}

#[test]
fn background_update_serves_stale_at_once_then_the_new_entry() {
    let good = free_port();
    let body = format!(
        "http {{ access_log off;\n\
         proxy_cache_path cache keys_zone=z:1m;\n\
         server {{ listen 127.0.0.1:{good}; return 200 \"v$msec\"; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           proxy_cache z; proxy_cache_key $arg_k; proxy_cache_valid 200 1s;\n\
           add_header X-C $upstream_cache_status always;\n\
           location /bg {{ proxy_pass http://127.0.0.1:{good}/;\n\
             proxy_cache_use_stale updating; proxy_cache_background_update on; }}\n\
           location /nobg {{ proxy_pass http://127.0.0.1:{good}/;\n\
             proxy_cache_use_stale updating; }}\n\
           location /bgonly {{ proxy_pass http://127.0.0.1:{good}/;\n\
             proxy_cache_background_update on; }}\n\
         }}\n\
         }}\n"
    );
    let ours = both(&body, |port| {
        let mut out = Vec::new();
        let mut first = Vec::new();
        for loc in ["bg", "nobg", "bgonly"] {
            let (s, x, b) = ask(port, &format!("/{}?k={}", loc, loc));
            out.push(format!("{} {} {}", loc, s, x));
            first.push(b);
        }
        std::thread::sleep(Duration::from_millis(2100));
        for (i, loc) in ["bg", "nobg", "bgonly"].iter().enumerate() {
            for _ in 0..2 {
                let (s, x, b) = ask(port, &format!("/{}?k={}", loc, loc));
                out.push(format!("{} {} {} old={}", loc, s, x, b == first[i]));
                // The background update has a moment to finish.
                std::thread::sleep(Duration::from_millis(300));
            }
        }
        out
    });
    let text = ours.join("\n");
    for want in [
        "bg 200 STALE old=true",
        "bg 200 HIT old=false",
        "nobg 200 EXPIRED old=false",
        "bgonly 200 EXPIRED old=false",
    ] {
        assert!(ours.iter().any(|l| l == want), "no {:?} in\n{}", want, text);
    }
}

#[test]
fn updating_serves_stale_while_one_request_refreshes() {
    // A slow origin: the refresh takes a second; requests meanwhile get
    // the stale entry (UPDATING), and only one reaches the origin.
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    let o = Origin::start(move |_| {
        let i = n2.fetch_add(1, Ordering::SeqCst);
        if i > 0 {
            std::thread::sleep(Duration::from_millis(1000));
        }
        Some(Origin::ok(&format!("v{}", i), ""))
    });
    let s = Server::start(&format!(
        "http {{ proxy_cache_path cache keys_zone=z:1m;
            server {{ listen 127.0.0.1:@PORT@;
                location / {{ proxy_pass http://127.0.0.1:{}; proxy_cache z;
                    proxy_cache_valid 200 1s; proxy_cache_use_stale updating;
                    add_header X-C $upstream_cache_status always; }} }} }}",
        o.port
    ));
    assert_eq!(ask(s.port, "/u").1, "MISS");
    std::thread::sleep(Duration::from_millis(2100));
    let port = s.port;
    let refresher = std::thread::spawn(move || ask(port, "/u"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(ask(s.port, "/u"), (200, "UPDATING".into(), "v0".into()));
    assert_eq!(
        refresher.join().expect("refresher"),
        (200, "EXPIRED".into(), "v1".into())
    );
    assert_eq!(ask(s.port, "/u"), (200, "HIT".into(), "v1".into()));
    assert_eq!(o.count(), 2);
}

/// A slow origin on its own port: answers after `delay`, counting.
fn slow_origin(delay: Duration) -> (Origin, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    let o = Origin::start(move |_| {
        let i = n2.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(delay);
        Some(Origin::ok(&format!("v{}", i), ""))
    });
    (o, n)
}

#[test]
fn cache_lock_lets_one_request_fill_and_others_wait_as_nginx() {
    let run = |lock: &str| {
        let lock = lock.to_string();
        move |origin: u16| {
            format!(
                "http {{ access_log off;\n\
                 proxy_cache_path cache keys_zone=z:1m;\n\
                 server {{ listen 127.0.0.1:@PORT@;\n\
                   location / {{ proxy_pass http://127.0.0.1:{origin}; proxy_cache z;\n\
                     proxy_cache_valid 200 1m; {lock}\n\
                     add_header X-C $upstream_cache_status always; }} }}\n\
                 }}\n"
            )
        }
    };
    let series = |port: u16| {
        let mut hs = Vec::new();
        let first = std::thread::spawn(move || ask(port, "/l"));
        std::thread::sleep(Duration::from_millis(200));
        for _ in 0..2 {
            hs.push(std::thread::spawn(move || ask(port, "/l")));
        }
        let mut out = vec![first.join().expect("first")];
        out.extend(hs.into_iter().map(|h| h.join().expect("waiter")));
        let mut lines: Vec<String> = out
            .into_iter()
            .map(|(s, x, _)| format!("{} {}", s, x))
            .collect();
        lines.sort();
        lines.push(format!("after {}", ask(port, "/l").1));
        lines
    };
    for (lock, want_upstream, want) in [
        // Waiters wait for the first request's entry.
        (
            "proxy_cache_lock on;",
            1,
            "200 HIT,200 HIT,200 MISS,after HIT",
        ),
        // Waiters give up after 300ms and go upstream, uncached.
        (
            "proxy_cache_lock on; proxy_cache_lock_timeout 300ms;",
            3,
            "200 MISS,200 MISS,200 MISS,after HIT",
        ),
        // Held for longer than lock_age: a waiter fills it too; the
        // other finds the first entry once it is stored.
        (
            "proxy_cache_lock on; proxy_cache_lock_age 700ms;",
            2,
            "200 HIT,200 MISS,200 MISS,after HIT",
        ),
        ("", 3, "200 MISS,200 MISS,200 MISS,after HIT"),
    ] {
        let conf = run(lock);
        let (o, n) = slow_origin(Duration::from_millis(1000));
        let s = Server::start(&conf(o.port));
        let ours = series(s.port).join(",");
        drop(s);
        assert_eq!(ours, want, "{}", lock);
        assert_eq!(n.load(Ordering::SeqCst), want_upstream, "{}", lock);
        if nginx_installed() {
            let (o, n) = slow_origin(Duration::from_millis(1000));
            let p = Prefix::new();
            let port = free_port();
            let _nginx = start_nginx(&p, &conf(o.port), port).expect("nginx");
            let theirs = series(port).join(",");
            assert_eq!(ours, theirs, "{}", lock);
            assert_eq!(n.load(Ordering::SeqCst), want_upstream, "nginx, {}", lock);
        }
    }
}

#[test]
fn revalidate_asks_with_the_validators_and_a_304_refreshes_as_nginx() {
    let (files, plain) = (free_port(), free_port());
    let body = format!(
        "http {{ access_log off;\n\
         proxy_cache_path cache keys_zone=z:1m;\n\
         server {{ listen 127.0.0.1:{files}; root html; }}\n\
         server {{ listen 127.0.0.1:{plain}; return 200 \"no validators\"; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           proxy_cache z; proxy_cache_valid 200 1s; proxy_cache_key $uri;\n\
           add_header X-C $upstream_cache_status always;\n\
           location /rv/ {{ proxy_pass http://127.0.0.1:{files}/; proxy_cache_revalidate on; }}\n\
           location /norv/ {{ proxy_pass http://127.0.0.1:{files}/; }}\n\
           location /plain/ {{ proxy_pass http://127.0.0.1:{plain}/; proxy_cache_revalidate on; }}\n\
         }}\n\
         }}\n"
    );
    let setup = |p: &Prefix| {
        p.write("html/f.txt", "file body\n");
    };
    let ours = both_in(&body, setup, |port| {
        let mut out = Vec::new();
        for loc in ["rv", "norv", "plain"] {
            let path = format!("/{}/f.txt", loc);
            let (s, x, b) = ask(port, &path);
            out.push(format!("{} {} {} {}", loc, s, x, b.trim()));
        }
        std::thread::sleep(Duration::from_millis(2100));
        for loc in ["rv", "norv", "plain"] {
            let path = format!("/{}/f.txt", loc);
            for _ in 0..2 {
                let (s, x, b) = ask(port, &path);
                out.push(format!("{} {} {} {}", loc, s, x, b.trim()));
            }
        }
        out
    });
    let text = ours.join("\n");
    for want in [
        "rv 200 REVALIDATED file body",
        "rv 200 HIT file body",
        "norv 200 EXPIRED file body",
        "plain 200 EXPIRED no validators",
    ] {
        assert!(ours.iter().any(|l| l == want), "no {:?} in\n{}", want, text);
    }
}

#[test]
fn revalidation_request_carries_if_modified_since_and_if_none_match() {
    let o = Origin::start(|h| {
        Some(if h.contains("If-None-Match") {
            b"HTTP/1.1 304 Not Modified\r\nETag: \"e1\"\r\n\r\n".to_vec()
        } else {
            Origin::ok(
                "entity",
                "ETag: \"e1\"\r\nLast-Modified: Mon, 02 Jan 2023 03:04:05 GMT\r\n",
            )
        })
    });
    let s = Server::start(&format!(
        "http {{ proxy_cache_path cache keys_zone=z:1m;
            server {{ listen 127.0.0.1:@PORT@;
                location / {{ proxy_pass http://127.0.0.1:{}; proxy_cache z;
                    proxy_cache_valid 200 1s; proxy_cache_revalidate on;
                    add_header X-C $upstream_cache_status always; }} }} }}",
        o.port
    ));
    assert_eq!(ask(s.port, "/r"), (200, "MISS".into(), "entity".into()));
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(
        ask(s.port, "/r"),
        (200, "REVALIDATED".into(), "entity".into())
    );
    assert_eq!(ask(s.port, "/r"), (200, "HIT".into(), "entity".into()));
    let reqs = o.requests();
    assert_eq!(reqs.len(), 2);
    // nginx's order: Host, Connection, then the validators.
    assert_eq!(
        reqs[1],
        format!(
            "GET /r HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\
             If-Modified-Since: Mon, 02 Jan 2023 03:04:05 GMT\r\nIf-None-Match: \"e1\"\r\n\r\n",
            o.port
        )
    );
}

#[test]
fn min_uses_and_convert_head_as_nginx() {
    let good = free_port();
    let body = format!(
        "http {{ access_log off;\n\
         proxy_cache_path cache keys_zone=z:1m;\n\
         server {{ listen 127.0.0.1:{good}; return 200 \"$request_method\"; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           proxy_cache z; proxy_cache_valid 200 1m;\n\
           add_header X-C $upstream_cache_status always;\n\
           location /mu/ {{ proxy_pass http://127.0.0.1:{good}/; proxy_cache_min_uses 3; }}\n\
           location /head/ {{ proxy_pass http://127.0.0.1:{good}/; proxy_cache_key $uri; }}\n\
           location /nohead/ {{ proxy_pass http://127.0.0.1:{good}/;\n\
             proxy_cache_convert_head off; proxy_cache_key $request_method$uri; }}\n\
         }}\n\
         }}\n"
    );
    let ours = both(&body, |port| {
        let mut out = Vec::new();
        for _ in 0..4 {
            let (s, x, b) = ask(port, "/mu/a");
            out.push(format!("mu {} {} {}", s, x, b));
        }
        for loc in ["head", "nohead"] {
            for m in ["HEAD", "GET", "HEAD"] {
                let (s, x, b) = ask_m(port, m, &format!("/{}/a", loc));
                out.push(format!("{} {} {} {} {}", loc, m, s, x, b));
            }
            // What a HEAD answered from the cache announces.
            let req = format!(
                "HEAD /{}/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                loc
            );
            let r = Resp::parse(&raw(port, req.as_bytes())).expect("HEAD response");
            out.push(format!("{} length {:?}", loc, r.header("Content-Length")));
        }
        out
    });
    assert_eq!(
        ours.join("\n"),
        "mu 200 MISS GET\nmu 200 MISS GET\nmu 200 MISS GET\nmu 200 HIT GET\n\
         head HEAD 200 MISS \nhead GET 200 HIT GET\nhead HEAD 200 HIT \n\
         head length Some(\"3\")\n\
         nohead HEAD 200 MISS \nnohead GET 200 MISS GET\nnohead HEAD 200 HIT \n\
         nohead length Some(\"4\")"
    );
}

#[test]
fn new_cache_directives_are_checked_as_nginx() {
    let cases = [
        ("proxy_cache_use_stale foo;", "invalid value \"foo\""),
        (
            "proxy_cache_use_stale non_idempotent;",
            "invalid value \"non_idempotent\"",
        ),
        (
            "proxy_cache_lock maybe;",
            "invalid value \"maybe\" in \"proxy_cache_lock\" directive, it must be \"on\" or \"off\"",
        ),
        (
            "proxy_cache_lock_timeout x;",
            "\"proxy_cache_lock_timeout\" directive invalid value",
        ),
        (
            "proxy_cache_min_uses x;",
            "\"proxy_cache_min_uses\" directive invalid number",
        ),
    ];
    for (d, msg) in cases {
        ConfTest::run(&format!(
            "events {{}}\nhttp {{ server {{ location / {{ {} proxy_pass http://127.0.0.1:1; }} }} }}\n",
            d
        ))
        .assert_says("emerg", msg, 2);
    }
}
