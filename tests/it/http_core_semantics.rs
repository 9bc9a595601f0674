//! HTTP core behaviours nginx-tests checks (http_disable_symlinks.t,
//! http_keepalive.t, http_headers_multi.t, stub_status.t, access_log.t,
//! range_charset.t), with nginx's answer to the same configuration as the
//! oracle where it is installed.

use std::io::{Read, Write};
use std::time::Duration;

use crate::harness::*;

/// The same configuration (and files, written by `files` into each
/// prefix) in tern and, when installed, in nginx; `f` gets each one's
/// port and returns what is compared.
fn both(conf: &str, files: impl Fn(&Prefix), f: impl Fn(u16) -> String) -> String {
    let p = Prefix::new();
    files(&p);
    let tern = Server::start_in(p, conf);
    let ours = f(tern.port);
    let log = tern.error_log();
    drop(tern);
    if nginx_installed() {
        let p = Prefix::new();
        files(&p);
        let port = free_port();
        let Some(_nginx) = start_nginx(&p, conf, port) else {
            panic!("nginx did not start: {}", p.read("logs/error.log"));
        };
        let theirs = f(port);
        assert_eq!(ours, theirs, "tern vs nginx\ntern's log:\n{}", log);
    }
    ours
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn status_of(port: u16, req: &str) -> String {
    Resp::parse(&raw(port, req.as_bytes()))
        .map(|r| r.status.to_string())
        .unwrap_or_else(|| "none".into())
}

#[test]
fn file_tests_in_if_obey_disable_symlinks() {
    let files = |p: &Prefix| {
        p.write("html/on/file", "x");
        let _ = std::os::unix::fs::symlink(p.path("html/on/file"), p.path("html/on/link"));
        // Workers run as nobody: the files must be readable by it.
        let _ = std::process::Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(&p.dir)
            .status();
    };
    let conf = "http { access_log off; server { listen 127.0.0.1:@PORT@; root html;
        location /on/ { disable_symlinks on; if (-f $request_filename) { return 204; } }
        location /off/ { alias html/on/; if (-f $request_filename) { return 204; } }
        location /ne/ { disable_symlinks on; alias html/on/; if (!-e $request_filename) { return 200 \"none\"; } }
      } }";
    let got = both(conf, files, |port| {
        ["/on/file", "/on/link", "/off/link", "/ne/link"]
            .iter()
            .map(|u| status_of(port, &format!("GET {u} HTTP/1.0\r\n\r\n")))
            .collect::<Vec<_>>()
            .join(" ")
    });
    assert_eq!(got, "204 403 204 200");
}

#[test]
fn the_keepalive_wait_is_the_locations() {
    // The server's keepalive_timeout is 1 s; the location's is 75 s and
    // gives no header time, so the server's `Keep-Alive: timeout=9` stays.
    let conf = "http { access_log off; server { listen 127.0.0.1:@PORT@; root html;
        keepalive_timeout 1 9;
        location / { keepalive_timeout 75s; }
      } }";
    let files = |p: &Prefix| {
        p.write("html/f", "");
    };
    let got = both(conf, files, |port| {
        let mut c = connect(port);
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut out = String::new();
        for i in 0..2 {
            if i == 1 {
                // Past the server's 1 s: the location's 75 s holds.
                std::thread::sleep(Duration::from_millis(1500));
            }
            if c.write_all(b"GET /f HTTP/1.1\r\nHost: x\r\n\r\n").is_err() {
                out.push_str("closed|");
                continue;
            }
            match read_response(&mut c) {
                Some(r) => {
                    out.push_str(&format!(
                        "{} {}|",
                        r.status,
                        r.header("Keep-Alive").unwrap_or("-")
                    ));
                }
                None => out.push_str("closed|"),
            }
        }
        out
    });
    assert_eq!(got, "200 timeout=9|200 timeout=9|");
}

#[test]
fn headers_nginx_keeps_one_of_are_refused_twice() {
    let conf =
        "http { access_log off; server { listen 127.0.0.1:@PORT@; location / { return 204; } } }";
    let names = [
        "If-Modified-Since",
        "If-Unmodified-Since",
        "If-Match",
        "If-None-Match",
        "Content-Range",
        "If-Range",
        "Expect",
    ];
    let got = both(
        conf,
        |_| {},
        |port| {
            names
                .iter()
                .map(|n| {
                    let once = format!("GET / HTTP/1.0\r\n{n}: foo\r\n\r\n");
                    let twice = format!("GET / HTTP/1.0\r\n{n}: foo\r\n{n}: bar\r\n\r\n");
                    format!("{n} {} {}", status_of(port, &once), status_of(port, &twice))
                })
                .collect::<Vec<_>>()
                .join("|")
        },
    );
    assert!(
        got.split('|')
            .all(|l| l.ends_with(" 204 400") || l == "Expect 417 400"),
        "{got}"
    );
    let s = Server::start(&conf.replace(
        "access_log off;",
        "access_log off; error_log logs/error.log info;",
    ));
    s.raw(b"GET / HTTP/1.0\r\nIf-Match: foo\r\nIf-Match: bar\r\n\r\n");
    let log = s.wait_error_log("duplicate header line");
    assert!(
        log.contains("[info]")
            && log.contains("client sent duplicate header line: \"If-Match: bar\", previous value: \"If-Match: foo\" while reading client request headers"),
        "{log}"
    );
}

#[test]
fn multi_valued_header_variables_as_nginx_1_22() {
    let conf = "http { access_log off; server { listen 127.0.0.1:@PORT@;
        location / {
            add_header X-Forwarded-For $http_x_forwarded_for;
            add_header X-Foo $http_foo;
            return 204;
        }
        location /s {
            add_header Cache-Control foo;
            add_header Cache-Control bar;
            add_header Link foo;
            add_header Link bar;
            add_header Foo foo;
            add_header Foo bar;
            add_header X-Sent-CC $sent_http_cache_control;
            add_header X-Sent-Link $sent_http_link;
            add_header X-Sent-Foo $sent_http_foo;
            return 204;
        }
      } }";
    let got = both(
        conf,
        |_| {},
        |port| {
            let a = raw(
            port,
            b"GET / HTTP/1.0\r\nX-Forwarded-For: a\r\nX-Forwarded-For: b\r\nFoo: 1\r\nFoo: 2\r\n\r\n",
        );
            let b = raw(port, b"GET /s HTTP/1.0\r\n\r\n");
            format!(
                "{}\n{}",
                blank_date_server(&text(&a)),
                blank_date_server(&text(&b))
            )
        },
    );
    assert!(
        got.contains("X-Forwarded-For: a, b\r\nX-Foo: 1\r\n"),
        "{got}"
    );
    assert!(
        got.contains("X-Sent-CC: foo, bar\r\nX-Sent-Link: foo, bar\r\nX-Sent-Foo: foo\r\n"),
        "{got}"
    );
}

#[test]
fn return_444_is_logged() {
    let conf = "http { log_format t \"$request $status $body_bytes_sent\";
        server { listen 127.0.0.1:@PORT@; access_log logs/t.log t; location / { return 444; } } }";
    let s = Server::start(conf);
    assert!(s.raw(b"GET /x HTTP/1.0\r\n\r\n").is_empty());
    let log = wait_log(&s.prefix, "logs/t.log", "444");
    assert_eq!(log, "GET /x HTTP/1.0 444 0\n");
}

#[test]
fn open_log_file_cache_keeps_what_it_had_when_an_open_fails() {
    // max=3 min_uses=2: lru is pushed out by the fourth name; a name whose
    // file cannot be opened (its directory moved away) takes no place, so
    // the two cached descriptors keep writing into the moved directory.
    let conf = "http { log_format t \"$uri:$status\";
        server { listen 127.0.0.1:@PORT@;
          location /cache {
            open_log_file_cache max=3 inactive=20s valid=1m min_uses=2;
            access_log logs/dir/cache_${arg_logname} t;
            return 200 OK;
          } } }";
    let p = Prefix::new();
    p.write("logs/dir/.keep", "");
    let _ = std::process::Command::new("chmod")
        .args(["a+rwx"])
        .arg(p.path("logs/dir"))
        .status();
    let s = Server::start_in(p, conf);
    let lines = |name: &str| {
        s.prefix
            .read(&format!("logs/dir_moved/cache_{name}"))
            .lines()
            .count()
    };
    for (i, n) in ["lru", "lru", "once", "first", "first", "second", "second"]
        .iter()
        .enumerate()
    {
        s.raw(format!("GET /cache?logname={n} HTTP/1.0\r\n\r\n").as_bytes());
        // The lines go through a writer thread: each is in before the next.
        let want = ["lru", "lru", "once", "first", "first", "second", "second"][..=i]
            .iter()
            .filter(|m| *m == n)
            .count();
        eventually(10, "log line", || {
            s.prefix
                .read(&format!("logs/dir/cache_{n}"))
                .lines()
                .count()
                == want
        });
    }
    std::fs::rename(s.prefix.path("logs/dir"), s.prefix.path("logs/dir_moved")).expect("mv");
    for n in ["lru", "once", "first", "second"] {
        s.raw(format!("GET /cache?logname={n} HTTP/1.0\r\n\r\n").as_bytes());
    }
    eventually(10, "cached descriptors written", || {
        lines("first") == 3 && lines("second") == 3
    });
    assert_eq!((lines("lru"), lines("once")), (2, 1));
}

#[test]
fn x_accel_charset_holds_for_cached_answers() {
    let conf = "http { access_log off;
        charset_map B A { 58 59; }
        proxy_cache_path cache levels=1:2 keys_zone=NAME:1m;
        server { listen 127.0.0.1:@PORT@;
            location / { proxy_pass http://127.0.0.1:@PORT@/up/; proxy_set_header Host up;
                proxy_cache NAME; proxy_cache_valid 200 1m; add_header X-Cache $upstream_cache_status; }
        }
        server { listen 127.0.0.1:@PORT@; server_name up; root html; charset B;
            location /up/ { alias html/; add_header X-Accel-Charset A; }
        } }";
    let p = Prefix::new();
    p.write("html/t.html", "X000XXXXXXX001XXXXXX");
    let s = Server::start_in(p, conf);
    let body = |r: &[u8]| {
        let r = Resp::parse(r).expect("a response");
        format!(
            "{} {} {} {}",
            r.header("X-Cache").unwrap_or("-"),
            r.header("Content-Type").unwrap_or("-"),
            r.header("X-Accel-Charset").unwrap_or("-"),
            r.body_str()
        )
    };
    let get = b"GET /t.html HTTP/1.0\r\n\r\n";
    assert_eq!(
        body(&s.raw(get)),
        "MISS text/html; charset=A - Y000YYYYYYY001YYYYYY"
    );
    assert_eq!(
        body(&s.raw(get)),
        "HIT text/html; charset=A - Y000YYYYYYY001YYYYYY"
    );
    let r = text(&s.raw(
        b"GET /t.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\nRange: bytes=0-9,10-19\r\n\r\n",
    ));
    assert!(r.contains(" 206 "), "{r}");
    assert_eq!(
        r.matches("Content-Type: text/html; charset=A\r\n").count(),
        2,
        "{r}"
    );
    assert!(
        r.contains("\r\n\r\nY000YYYYYY\r\n") && r.contains("\r\n\r\nY001YYYYYY\r\n"),
        "{r}"
    );
}

#[test]
fn a_slowed_error_page_counts_as_writing() {
    let conf = "http { access_log off; server { listen 127.0.0.1:@PORT@;
        location /rate { limit_rate 15; }
        location /stub { stub_status; } } }";
    let s = Server::start(conf);
    let mut c = s.connect();
    c.write_all(b"GET /rate HTTP/1.0\r\n\r\n").expect("send");
    c.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut b = [0u8; 16];
    let _ = c.read(&mut b).expect("the first paced bytes");
    let stub = s.get("/stub").body_str();
    assert!(stub.contains("Writing: 2 "), "{stub}");
}

#[test]
fn trailers_are_rendered_after_the_body() {
    let conf = "http { access_log off; server { listen 127.0.0.1:@PORT@; root html;
        location / { add_trailer X-Bytes $body_bytes_sent; add_trailer X-Again $sent_trailer_x_bytes; } } }";
    let files = |p: &Prefix| {
        p.write("html/f.txt", "hello\n");
    };
    let got = both(conf, files, |port| {
        let r = raw(
            port,
            b"GET /f.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        let t = text(&r);
        t[t.find("\r\n\r\n").map_or(0, |i| i + 4)..].to_string()
    });
    // nginx renders them before its last write, which here carries the
    // whole response: no body byte has gone yet.
    assert_eq!(got, "6\r\nhello\n\r\n0\r\nX-Bytes: 0\r\nX-Again: 0\r\n\r\n");
}

#[test]
fn worker_shutdown_timeout_closes_connections_from_before_a_reload() {
    let conf = "worker_shutdown_timeout 10ms; error_log logs/error.log notice;
        http { access_log off; server { listen 127.0.0.1:@PORT@; location / { return 204; } } }";
    let s = Server::start(conf);
    // One waits for its first request, one was kept alive after a request.
    let mut idle = s.connect();
    let mut kept = s.connect();
    kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("send");
    assert_eq!(read_response(&mut kept).map(|r| r.status), Some(204));
    s.signal(libc::SIGHUP);
    s.wait_error_log("reconfigured");
    let mut b = [0u8; 64];
    assert_eq!(idle.read(&mut b).ok(), Some(0), "first wait closed");
    assert_eq!(kept.read(&mut b).ok(), Some(0), "keep-alive closed");
    // New connections are served on.
    assert_eq!(s.get("/").status, 204);
}
