//! Proxy behaviours nginx-tests checks (proxy_keepalive.t,
//! proxy_merge_headers.t, proxy_upgrade.t, proxy.t, limit_conn.t,
//! proxy_if.t, proxy_bind.t, rewrite.t, proxy_limit_rate2.t), each with
//! the exact bytes and, where nginx is installed, nginx's own answer to
//! the same configuration as the oracle.

use std::io::{Read, Write};
use std::time::Duration;

use crate::harness::*;
use crate::origin::Origin;

/// The same configuration in tern and, when installed, in nginx; `f`
/// gets each one's port and returns what is compared.
fn both(conf: &str, f: impl Fn(u16) -> String) -> String {
    let tern = Server::start(conf);
    let ours = f(tern.port);
    let log = tern.error_log();
    drop(tern);
    if nginx_installed() {
        let p = Prefix::new();
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

/// An origin that keeps connections alive and says on which one (its
/// count) each answer came: HEAD answers, 304s with and without a length.
fn keepalive_origin() -> Origin {
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    Origin::serve(move |mut c| {
        let id = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        while let Some(req) = c.next(false) {
            let req = text(&req);
            let head = if req.contains("/304len") {
                format!("HTTP/1.1 304 Not Modified\r\nX-Connection: {id}\r\nContent-Length: 100\r\n\r\n")
            } else if req.contains("/304") {
                format!("HTTP/1.1 304 Not Modified\r\nX-Connection: {id}\r\n\r\n")
            } else {
                // A HEAD is answered with the length of the body it would have.
                format!("HTTP/1.1 200 OK\r\nX-Connection: {id}\r\nContent-Length: 26\r\n\r\n")
            };
            if c.stream.write_all(head.as_bytes()).is_err() {
                return;
            }
        }
    })
}

#[test]
fn answers_without_body_keep_the_upstream_connection() {
    let o = keepalive_origin();
    let conf = format!(
        "http {{ access_log off;
          upstream u {{ server 127.0.0.1:{}; keepalive 1; }}
          server {{ listen 127.0.0.1:@PORT@;
            proxy_http_version 1.1; proxy_set_header Connection \"\";
            location / {{ proxy_pass http://u; }}
            location /unbuffered/ {{ proxy_pass http://u; proxy_buffering off; }}
          }} }}",
        o.port
    );
    let s = Server::start(&conf);
    let conn = |req: &str| {
        let r = Resp::parse(&s.raw(req.as_bytes())).expect("a response");
        r.header("X-Connection").unwrap_or("-").to_string()
    };
    for path in ["/head", "/unbuffered/head"] {
        let req = format!("HEAD {path} HTTP/1.0\r\n\r\n");
        let first = conn(&req);
        assert_eq!(conn(&req), first, "HEAD {path} reuses the connection");
    }
    for path in ["/304", "/304len", "/unbuffered/304", "/unbuffered/304len"] {
        let req = format!("GET {path} HTTP/1.0\r\n\r\n");
        let first = conn(&req);
        assert_eq!(conn(&req), first, "GET {path} reuses the connection");
    }
    assert_eq!(o.conns().load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn passed_date_and_server_never_come_from_tern() {
    // Upstream sends neither: with proxy_pass_header naming them, nginx
    // sends neither either (its proxy module adds empty stand-ins).
    let o = Origin::start(|_| Some(b"HTTP/1.0 200 OK\r\n\r\n".to_vec())).detach();
    let conf = format!(
        "http {{ access_log off; server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_pass http://127.0.0.1:{o}; proxy_pass_header Date; proxy_pass_header Server; }}
            location /date {{ proxy_pass http://127.0.0.1:{o}; proxy_pass_header Date; }}
          }} }}"
    );
    let got = both(&conf, |port| {
        let a = text(&raw(port, b"GET / HTTP/1.0\r\n\r\n"));
        let b = raw(port, b"GET /date HTTP/1.0\r\n\r\n");
        format!("{a}|{}", blank_date_server(&text(&b)))
    });
    assert!(
        got.starts_with("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n|"),
        "{got}"
    );
    assert!(!got.contains("Date:"), "{got}");
}

#[test]
fn a_101_nobody_asked_for_carries_what_upstream_sent_before_closing() {
    let o = Origin::start(|_| {
        Some(
            b"HTTP/1.1 101 Switching\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\nhandshaked\r\n"
                .to_vec(),
        )
    })
    .detach();
    let conf = format!(
        "http {{ access_log off; server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_pass http://127.0.0.1:{o}; proxy_http_version 1.1;
                proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection Upgrade;
                proxy_read_timeout 1s; }}
          }} }}"
    );
    let got = both(&conf, |port| {
        let r = raw(
            port,
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        blank_date_server(&text(&r))
    });
    // Upstream closed after its bytes: they follow the head.
    assert_eq!(
        got,
        "HTTP/1.1 101 Switching\r\nServer: X\r\nDate: X\r\nConnection: upgrade\r\nUpgrade: foo\r\n\r\nhandshaked\r\n"
    );
}

#[test]
fn a_101_nobody_asked_for_is_held_until_upstream_ends() {
    // Upstream keeps the connection open: as nginx's buffers, tern holds
    // what followed the 101 until proxy_read_timeout ends the request,
    // then closes with the head alone.
    let o = Origin::serve(|mut c| {
        if c.next(false).is_none() {
            return;
        }
        let _ = c
            .stream
            .write_all(b"HTTP/1.1 101 Switching\r\nUpgrade: foo\r\n\r\nhandshaked\r\n");
        std::thread::sleep(Duration::from_secs(3));
    })
    .detach();
    let conf = format!(
        "http {{ log_format t \"$status $body_bytes_sent\";
          server {{ listen 127.0.0.1:@PORT@; access_log logs/t.log t;
            location / {{ proxy_pass http://127.0.0.1:{o}; proxy_read_timeout 1s; }}
          }} }}"
    );
    let s = Server::start(&conf);
    let got = blank_date_server(&text(&s.raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")));
    assert_eq!(
        got,
        "HTTP/1.1 101 Switching\r\nServer: X\r\nDate: X\r\nConnection: upgrade\r\nUpgrade: foo\r\n\r\n"
    );
    assert_eq!(wait_log(&s.prefix, "logs/t.log", "101"), "101 0\n");
    assert!(s
        .wait_error_log("upstream timed out")
        .contains("while reading upstream"));
}

#[test]
fn client_gone_while_upstream_is_silent_is_499() {
    // The origin accepts and never answers (None: silent for 3 s).
    let o = Origin::start(|_| None);
    let conf = format!(
        "error_log logs/error.log info;
        http {{ log_format t \"$status $upstream_addr $upstream_header_time\";
          server {{ listen 127.0.0.1:@PORT@; access_log logs/t.log t;
            location / {{ proxy_pass http://127.0.0.1:{}; }}
          }} }}",
        o.port
    );
    let s = Server::start(&conf);
    let mut c = s.connect();
    c.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("send");
    eventually(10, "request upstream", || o.count() == 1);
    drop(c);
    let line = wait_log(&s.prefix, "logs/t.log", "499");
    assert_eq!(line.trim(), format!("499 127.0.0.1:{} -", o.port));
    let log = s.wait_error_log("client prematurely closed connection");
    assert!(
        log.contains("[info]")
            && log.contains("client prematurely closed connection, so upstream connection is closed too while reading response header from upstream"),
        "{log}"
    );
}

#[test]
fn proxy_pass_from_an_earlier_if_runs_where_none_is_set() {
    let conf = "http { access_log off; server { listen 127.0.0.1:@PORT@;
        location /crash {
            set $true 1;
            if ($true) { proxy_pass http://127.0.0.1:1; }
            if ($true) { }
        } } }";
    let got = both(conf, |port| {
        let r = raw(port, b"GET /crash HTTP/1.0\r\n\r\n");
        Resp::parse(&r).map(|r| r.status).unwrap_or(0).to_string()
    });
    assert_eq!(got, "500");
    let s = Server::start(conf);
    s.get("/crash");
    assert!(s
        .wait_error_log("no upstream configuration")
        .contains("[alert]"));
}

#[test]
fn proxy_bind_with_a_port_from_a_variable() {
    let o = Origin::serve(|mut c| {
        if c.next(false).is_none() {
            return;
        }
        let peer = c
            .stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let _ = c
            .stream
            .write_all(&Origin::ok(&peer, "Connection: close\r\n"));
    })
    .detach();
    let conf = format!(
        "http {{ access_log off; server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_bind 127.0.0.2:$remote_port; proxy_pass http://127.0.0.1:{o};
                add_header X-Client-Port $remote_port; }}
          }} }}"
    );
    let s = Server::start(&conf);
    let r = s.get("/");
    let port = r.header("X-Client-Port").expect("client port").to_string();
    assert_eq!(r.body_str(), format!("127.0.0.2:{port}"));
}

#[test]
fn rewrite_break_sends_the_rewritten_uri_whole() {
    let o = Origin::start(|req| {
        let line = req.lines().next().unwrap_or("").to_string();
        Some(Origin::ok(&line, "Connection: close\r\n"))
    })
    .detach();
    let conf = format!(
        "http {{ access_log off; server {{ listen 127.0.0.1:@PORT@;
            location /break {{ rewrite ^ /return200; break; proxy_pass http://127.0.0.1:{o}/return204; }}
            location /flag {{ rewrite ^/flag/(.*) /new/$1 break; proxy_pass http://127.0.0.1:{o}/up/; }}
            location /kept {{ proxy_pass http://127.0.0.1:{o}/up/; }}
          }} }}"
    );
    let got = both(&conf, |port| {
        ["/break", "/flag/x?a=1", "/kept/y"]
            .iter()
            .map(|p| {
                let r = raw(port, format!("GET {p} HTTP/1.0\r\n\r\n").as_bytes());
                Resp::parse(&r).map(|r| r.body_str()).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("|")
    });
    assert_eq!(
        got,
        "GET /return200 HTTP/1.0|GET /new/x?a=1 HTTP/1.0|GET /up//y HTTP/1.0"
    );
}

#[test]
fn proxy_limit_rate_takes_variables() {
    // nginx 1.27's: the value may come from upstream's head. One that is
    // not a size is logged and limits nothing.
    // The body comes a moment after the head, so it streams through the
    // pipe whose rate the variable sets.
    let o = Origin::serve(|mut c| {
        let Some(req) = c.next(false) else { return };
        let rate = if text(&req).contains("bad") {
            "abc"
        } else {
            "1m"
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nX-Rate: {rate}\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"
        );
        let _ = c.stream.write_all(head.as_bytes());
        std::thread::sleep(Duration::from_millis(200));
        let _ = c.stream.write_all(b"0123456789");
    })
    .detach();
    let conf = format!(
        "http {{ access_log off; server {{ listen 127.0.0.1:@PORT@;
            proxy_limit_rate $upstream_http_x_rate;
            location / {{ proxy_pass http://127.0.0.1:{o}; }}
          }} }}"
    );
    let s = Server::start(&conf);
    assert_eq!(s.get("/ok").body_str(), "0123456789");
    assert_eq!(s.get("/bad").body_str(), "0123456789");
    assert!(s.wait_error_log("invalid size \"abc\"").contains("[error]"));
}

#[test]
fn limit_rate_paces_a_page_from_memory() {
    // limit_rate 15 on a 404 page: the first second carries 15 bytes of
    // the head, as nginx's write filter counts every byte.
    let conf = "http { access_log off; server { listen 127.0.0.1:@PORT@;
        location /rate { limit_rate 15; } } }";
    let s = Server::start(conf);
    let mut c = s.connect();
    c.write_all(b"GET /rate HTTP/1.0\r\n\r\n").expect("send");
    c.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut b = [0u8; 100];
    let n = c.read(&mut b).expect("first bytes");
    assert!(n <= 15, "{:?}", text(&b[..n]));
    assert!(
        b"HTTP/1.1 404 Not Found".starts_with(&b[..n]),
        "{:?}",
        text(&b[..n])
    );
}

#[test]
fn an_upgraded_connection_ends_when_worker_shutdown_timeout_runs_out_after_a_reload() {
    // worker_shutdown_timeout_proxy_upgrade.t: nginx's old worker closes
    // a WebSocket when that time runs out; tern's reload is in place and
    // closes it then too. The origin keeps its side open far longer.
    let o = Origin::serve(|mut c| {
        if c.next(false).is_none() {
            return;
        }
        let _ = c
            .stream
            .write_all(b"HTTP/1.1 101 Switching\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\n");
        std::thread::sleep(Duration::from_secs(30));
    })
    .detach();
    let conf = format!(
        "worker_shutdown_timeout 200ms; error_log logs/error.log notice;
        http {{ access_log off; server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_pass http://127.0.0.1:{o}; proxy_http_version 1.1;
                proxy_set_header Upgrade foo; proxy_set_header Connection Upgrade; }}
          }} }}"
    );
    let s = Server::start(&conf);
    let mut c = s.connect();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\n")
        .expect("send");
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut head = Vec::new();
    let mut b = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = c.read(&mut b).expect("101 head");
        assert!(n > 0, "closed before the head");
        head.extend_from_slice(&b[..n]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101 "),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s.signal(libc::SIGHUP);
    wait_log(&s.prefix, "logs/error.log", "reconfigured");
    // Closed by the server (EOF), well before the origin's 30 s.
    let n = c.read(&mut b).expect("EOF, not a read timeout");
    assert_eq!(n, 0);
}

#[test]
fn post_action_runs_after_the_answer_and_sends_nothing_more() {
    // post_action.t: the client gets the location's answer only; the
    // post action's request reaches the origin after it.
    let o = Origin::start(|_| Some(Origin::ok("HIDDEN", "")));
    let conf = format!(
        "http {{ log_format t \"$uri $status\";
          server {{ listen 127.0.0.1:@PORT@; root html; access_log logs/t.log t;
            location / {{ post_action /post; }}
            location /post {{ proxy_pass http://127.0.0.1:{}/seen; }}
            location /named {{ post_action @after; }}
            location @after {{ proxy_pass http://127.0.0.1:{}; }}
          }} }}",
        o.port, o.port
    );
    let p = Prefix::new();
    p.write("html/index.html", "SEE-THIS");
    p.write("html/named/index.html", "NAMED");
    let s = Server::start_in(p, &conf);
    let r = text(&s.raw(b"GET / HTTP/1.0\r\n\r\n"));
    assert!(r.ends_with("\r\n\r\nSEE-THIS"), "{r}");
    eventually(10, "the post action's request", || o.count() == 1);
    assert!(
        o.requests()[0].starts_with("GET /seen HTTP/1.0\r\n"),
        "{:?}",
        o.requests()
    );
    // The access log line is written after it: the last URI, the client's status.
    assert_eq!(wait_log(&s.prefix, "logs/t.log", "/post"), "/post 200\n");
    let r = text(&s.raw(b"GET /named/ HTTP/1.0\r\n\r\n"));
    assert!(r.ends_with("\r\n\r\nNAMED"), "{r}");
    eventually(10, "the named post action's request", || o.count() == 2);
    assert!(
        o.requests()[1].starts_with("GET /named/index.html HTTP/1.0\r\n"),
        "{:?}",
        o.requests()
    );
}
