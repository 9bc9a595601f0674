//! Load-balancing methods of `upstream`: ip_hash, hash, hash consistent
//! (the same server as nginx for each key and client, checked against the
//! real nginx), least_conn and max_conns (by keeping one server busy),
//! random, and the configuration errors in nginx's words.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::harness::{
    free_port, nginx_installed, raw, start_nginx, ConfTest, Prefix, Resp, Server,
};

/// Four backends answering their number, and a front with one location
/// per method. Backend ports are fixed in the text so that nginx and tern
/// hash the same `server` strings.
fn hashing_conf(b: &[u16; 4]) -> String {
    format!(
        "http {{\n\
         access_log off;\n\
         set_real_ip_from 127.0.0.1;\n\
         real_ip_header X-Real-IP;\n\
         upstream h {{ hash $arg_k; server 127.0.0.1:{0}; server 127.0.0.1:{1} weight=2; server 127.0.0.1:{2}; }}\n\
         upstream hc {{ hash $arg_k consistent; server 127.0.0.1:{0}; server 127.0.0.1:{1} weight=2; server 127.0.0.1:{2}; }}\n\
         upstream ip {{ ip_hash; server 127.0.0.1:{0}; server 127.0.0.1:{1} weight=2; server 127.0.0.1:{2} down; server 127.0.0.1:{3}; }}\n\
         server {{ listen 127.0.0.1:{0}; return 200 \"1\"; }}\n\
         server {{ listen 127.0.0.1:{1}; return 200 \"2\"; }}\n\
         server {{ listen 127.0.0.1:{2}; return 200 \"3\"; }}\n\
         server {{ listen 127.0.0.1:{3}; return 200 \"4\"; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /h/ {{ proxy_pass http://h; }}\n\
           location /hc/ {{ proxy_pass http://hc; }}\n\
           location /ip/ {{ proxy_pass http://ip; }}\n\
         }}\n\
         }}\n",
        b[0], b[1], b[2], b[3]
    )
}

/// The backend chosen for each request of the series, in order.
fn picks(port: u16) -> String {
    let ask = |path: String, extra: String| -> String {
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: x\r\n{}Connection: close\r\n\r\n",
            path, extra
        );
        let r = Resp::parse(&raw(port, req.as_bytes())).expect("response");
        assert_eq!(r.status, 200, "{}", path);
        r.body_str()
    };
    let mut out = String::new();
    for k in 0..120 {
        out += &ask(format!("/h/?k=key{}", k), String::new());
    }
    out.push('|');
    for k in 0..120 {
        out += &ask(format!("/hc/?k=/img/{}.png", k * 7), String::new());
    }
    out.push('|');
    for i in 0..60 {
        let v4 = format!("X-Real-IP: 10.{}.{}.{}\r\n", i % 7, i * 3 % 256, i);
        out += &ask("/ip/".into(), v4);
        let v6 = format!("X-Real-IP: 2001:db8:{:x}::{:x}\r\n", i * 37, i);
        out += &ask("/ip/".into(), v6);
    }
    out
}

#[test]
fn hash_consistent_hash_and_ip_hash_pick_the_server_nginx_picks() {
    let b = [free_port(), free_port(), free_port(), free_port()];
    let body = hashing_conf(&b);
    let tern = Server::start_in(Prefix::new(), &body);
    let ours = picks(tern.port);
    drop(tern);
    // Every method spread the keys (the check can tell servers apart).
    for part in ours.split('|') {
        assert!(part.contains('1') && part.contains('2'), "{}", part);
    }
    // `down` keeps its place in ip_hash's walk but is never used.
    assert!(!ours.split('|').nth(2).unwrap_or("").contains('3'));
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, &body, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    assert_eq!(ours, picks(port));
}

/// Requests `path` until it lands on backend 1's slow answer (its body
/// starts with `x`) and returns that connection unread: the upstream request stays
/// active while the body trickles.
fn hold_backend_1(port: u16, path: &str) -> TcpStream {
    for _ in 0..10 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        write!(
            s,
            "GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            path
        )
        .expect("write");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // Until the head and the first body byte are in (or EOF).
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            if let Some(end) = crate::harness::find(&got, b"\r\n\r\n") {
                if got.len() > end + 4 {
                    break;
                }
            }
        }
        let end = crate::harness::find(&got, b"\r\n\r\n").map_or(got.len(), |e| e + 4);
        if got.get(end) == Some(&b'x') {
            return s;
        }
    }
    panic!("{} never reached backend 1", path);
}

/// Backend 1, in the test: `/slow` gets a head and the first byte of a
/// 100-byte body, the rest once `release` is set; anything else gets "1".
fn slow_backend(release: Arc<AtomicBool>) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let release = release.clone();
            std::thread::spawn(move || {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while crate::harness::find(&req, b"\r\n\r\n").is_none() {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                if crate::harness::find(&req, b"/slow").is_some() {
                    let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nx");
                    while !release.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    let _ = c.write_all(&[b'x'; 99]);
                } else {
                    let _ = c.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: close\r\n\r\n1",
                    );
                }
            });
        }
    });
    port
}

#[test]
fn least_conn_and_max_conns_avoid_a_busy_server() {
    let release = Arc::new(AtomicBool::new(false));
    let (b1, b2) = (slow_backend(release.clone()), free_port());
    let prefix = Prefix::new();
    let conf = format!(
        "http {{\n\
         access_log off;\n\
         upstream lc {{ least_conn; server 127.0.0.1:{b1}; server 127.0.0.1:{b2}; }}\n\
         upstream mc {{ server 127.0.0.1:{b1} max_conns=1; server 127.0.0.1:{b2}; }}\n\
         upstream rr {{ server 127.0.0.1:{b1}; server 127.0.0.1:{b2}; }}\n\
         server {{ listen 127.0.0.1:{b2}; location / {{ return 200 \"2\"; }} }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           proxy_buffering off;\n\
           location /lc/ {{ proxy_pass http://lc/; }}\n\
           location /mc/ {{ proxy_pass http://mc/; }}\n\
           location /rr/ {{ proxy_pass http://rr/; }}\n\
         }}\n\
         }}\n"
    );
    let s = Server::start_in(prefix, &conf);
    let series = |loc: &str| -> String { (0..6).map(|_| s.get(loc).body_str()).collect() };

    // least_conn: server 1 has an active request, so 2 gets every new one.
    let busy = hold_backend_1(s.port, "/lc/slow");
    assert_eq!(series("/lc/"), "222222");
    // Plain round robin keeps alternating meanwhile (the test can fail).
    let rr = series("/rr/");
    assert!(rr.contains('1') && rr.contains('2'), "{}", rr);
    // Once the slow request is done, server 1 is used again.
    release.store(true, Ordering::Relaxed);
    let rest = crate::harness::read_to_close(&mut { busy });
    assert_eq!(rest.len(), 99);
    crate::harness::eventually(10, "server 1 used again", || {
        (0..4).any(|_| s.get("/lc/").body_str() == "1")
    });
    release.store(false, Ordering::Relaxed);

    // max_conns=1 on server 1: while it serves /slow, round robin skips it.
    let busy = hold_backend_1(s.port, "/mc/slow");
    assert_eq!(series("/mc/"), "222222");
    release.store(true, Ordering::Relaxed);
    drop(busy);
}

#[test]
fn random_uses_usable_servers_only() {
    let (b1, b2, b3) = (free_port(), free_port(), free_port());
    let conf = format!(
        "http {{\n\
         access_log off;\n\
         upstream r {{ random; server 127.0.0.1:{b1}; server 127.0.0.1:{b2} down; server 127.0.0.1:{b3}; }}\n\
         upstream r2 {{ random two least_conn; server 127.0.0.1:{b1}; server 127.0.0.1:{b3}; }}\n\
         server {{ listen 127.0.0.1:{b1}; return 200 \"1\"; }}\n\
         server {{ listen 127.0.0.1:{b2}; return 200 \"2\"; }}\n\
         server {{ listen 127.0.0.1:{b3}; return 200 \"3\"; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /r/ {{ proxy_pass http://r; }}\n\
           location /r2/ {{ proxy_pass http://r2; }}\n\
         }}\n\
         }}\n"
    );
    let s = Server::start(&conf);
    let got: String = (0..60).map(|_| s.get("/r/").body_str()).collect();
    assert!(!got.contains('2'), "{}", got);
    assert!(got.contains('1') && got.contains('3'), "{}", got);
    let got: String = (0..60).map(|_| s.get("/r2/").body_str()).collect();
    assert!(got.contains('1') && got.contains('3'), "{}", got);
}

#[test]
fn balancing_errors_are_nginx_s() {
    let cases = [
        (
            "upstream u { ip_hash; server 127.0.0.1:1; server 127.0.0.1:2 backup; }",
            "balancing method does not support parameter \"backup\"",
        ),
        (
            "upstream u { hash $uri; server 127.0.0.1:1 backup; }",
            "balancing method does not support parameter \"backup\"",
        ),
        (
            "upstream u { least_conn; server 127.0.0.1:1 backup; }",
            "no servers in upstream \"u\"",
        ),
        ("upstream u { }", "no servers are inside upstream"),
        (
            "upstream u { random foo; server 127.0.0.1:1; }",
            "invalid parameter \"foo\"",
        ),
        (
            "upstream u { random two foo; server 127.0.0.1:1; }",
            "invalid parameter \"foo\"",
        ),
        (
            "upstream u { hash $uri bar; server 127.0.0.1:1; }",
            "invalid parameter \"bar\"",
        ),
        (
            "upstream u { hash; server 127.0.0.1:1; }",
            "invalid number of arguments in \"hash\" directive",
        ),
        (
            "upstream u { ip_hash x; server 127.0.0.1:1; }",
            "invalid number of arguments in \"ip_hash\" directive",
        ),
        (
            "upstream u { server 127.0.0.1:1 max_conns=x; }",
            "invalid parameter \"max_conns=x\"",
        ),
    ];
    for (ups, msg) in cases {
        let t = ConfTest::run(&format!("events {{}}\nhttp {{ {} }}\n", ups));
        t.assert_says("emerg", msg, 2);
        assert_eq!(t.code, Some(1));
    }
    // A second method is a warning, as in nginx; the last one counts.
    let t = ConfTest::run(
        "events {}\nhttp { upstream u { random two; ip_hash; server 127.0.0.1:1; } }\n",
    );
    t.assert_says("warn", "load balancing method redefined", 2);
    assert_eq!(t.code, Some(0));
}
