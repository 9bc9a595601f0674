//! The `stream {}` TCP proxy: bytes both ways, half-close, upstream
//! round-robin and failover, proxy_timeout, reload, reuseport sockets,
//! worker_connections shared with the upstream side, config errors.
//!
//! Backends are tiny std::net servers on loopback threads. Each config also
//! has an http server on `@PORT@`, which the harness waits for; stream
//! ports are `@S1@`, `@S2@` (free ports filled in here).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::harness::*;

fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind backend");
    let p = l.local_addr().expect("addr").port();
    (l, p)
}

/// Echoes every connection until the client closes.
fn echo_backend() -> u16 {
    let (l, port) = listener();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    port
}

/// Sends `tag` and closes each connection.
fn tag_backend(tag: &'static str) -> u16 {
    let (l, port) = listener();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let _ = s.write_all(tag.as_bytes());
        }
    });
    port
}

/// Reads until EOF, then answers with the byte count after `delay`.
fn count_backend(delay: Duration) -> u16 {
    let (l, port) = listener();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let _ = s.read_to_end(&mut got);
                std::thread::sleep(delay);
                let _ = s.write_all(format!("got {} bytes", got.len()).as_bytes());
            });
        }
    });
    port
}

/// A port nothing listens on, kept so while the returned guard lives
/// (a port from `free_port()` could be taken by another process).
fn dead_port() -> DeadPort {
    DeadPort::new()
}

/// Starts tern with `@S1@`/`@S2@` replaced; waits for the stream ports too.
fn start(conf: &str, s1: u16, s2: u16) -> Server {
    let text = conf
        .replace("@S1@", &s1.to_string())
        .replace("@S2@", &s2.to_string());
    let mut srv = Server::start_in(Prefix::new(), &text);
    for p in [s1, s2] {
        if p != 0 && (text.contains(&format!(":{};", p)) || text.contains(&format!(":{} ", p))) {
            srv.wait_listening(p);
        }
    }
    srv
}

const HTTP: &str = "http { server { listen 127.0.0.1:@PORT@; } }\n";

fn echo_once(port: u16, msg: &[u8]) -> Vec<u8> {
    let mut c = connect(port);
    c.write_all(msg).expect("write");
    let mut got = vec![0u8; msg.len()];
    c.read_exact(&mut got).expect("echo back");
    got
}

#[test]
fn proxies_bytes_both_ways() {
    let be = echo_backend();
    let s1 = free_port();
    let _srv = start(
        &format!(
            "{HTTP}stream {{ server {{ listen 127.0.0.1:@S1@; proxy_pass 127.0.0.1:{be}; proxy_buffer_size 4k; }} }}"
        ),
        s1,
        0,
    );
    // More than several buffers' worth, written while reading, so that
    // flow control in both directions is exercised.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let mut c = connect(s1);
    let mut w = c.try_clone().expect("clone");
    let sent = data.clone();
    let writer = std::thread::spawn(move || w.write_all(&sent).is_ok());
    let mut got = vec![0u8; data.len()];
    c.read_exact(&mut got).expect("all bytes echoed");
    assert!(writer.join().unwrap_or(false));
    assert!(got == data, "echoed bytes differ");
}

#[test]
fn half_close_on_and_off() {
    let be = count_backend(Duration::from_millis(200));
    let (s1, s2) = (free_port(), free_port());
    let srv = start(
        &format!(
            "{HTTP}stream {{\n\
             error_log logs/error.log info;\n\
             server {{ listen 127.0.0.1:@S1@; proxy_pass 127.0.0.1:{be}; proxy_half_close on; }}\n\
             server {{ listen 127.0.0.1:@S2@; proxy_pass 127.0.0.1:{be}; }}\n}}"
        ),
        s1,
        s2,
    );
    // on: our FIN reaches the backend, its answer still comes back.
    let mut c = connect(s1);
    c.write_all(b"hello").expect("write");
    c.shutdown(Shutdown::Write).expect("shutdown");
    assert_eq!(read_to_close(&mut c), b"got 5 bytes");
    // off (nginx's default): the client's FIN ends the session at once.
    let mut c = connect(s2);
    c.write_all(b"hello").expect("write");
    c.shutdown(Shutdown::Write).expect("shutdown");
    let t = Instant::now();
    assert_eq!(read_to_close(&mut c), b"");
    assert!(t.elapsed() < Duration::from_secs(2));
    // stream-level error_log at info: the session lines are there.
    eventually(5, "session end logged", || {
        srv.error_log()
            .contains("client disconnected, bytes from/to client:5/0")
    });
}

#[test]
fn round_robin_and_failover() {
    let (a, b) = (tag_backend("A"), tag_backend("B"));
    let dead_guard = dead_port();
    let dead = dead_guard.port;
    let (s1, s2) = (free_port(), free_port());
    let srv = start(
        &format!(
            "{HTTP}stream {{\n\
             upstream pool {{ server 127.0.0.1:{a}; server 127.0.0.1:{dead}; server 127.0.0.1:{b}; }}\n\
             upstream spare {{ server 127.0.0.1:{dead}; server 127.0.0.1:{b} backup; }}\n\
             server {{ listen 127.0.0.1:@S1@; proxy_pass pool; }}\n\
             server {{ listen 127.0.0.1:@S2@; proxy_pass spare; }}\n}}"
        ),
        s1,
        s2,
    );
    let mut seen = Vec::new();
    for _ in 0..6 {
        let mut c = connect(s1);
        let got = String::from_utf8_lossy(&read_to_close(&mut c)).into_owned();
        seen.push(got);
    }
    // Every connection is served: the dead peer is skipped (and then
    // marked failed for fail_timeout), the two live ones share the rest.
    // (The harness's readiness probe took one pick, so the exact order
    // depends on it; the balance does not.)
    let count = |t: &str| seen.iter().filter(|s| *s == t).count();
    assert_eq!(count("A") + count("B"), 6, "{:?}", seen);
    assert!(count("A") >= 2 && count("B") >= 2, "{:?}", seen);
    srv.wait_error_log("connect() failed (111: Connection refused) while connecting to upstream");
    // The backup serves when the primary is down.
    let mut c = connect(s2);
    assert_eq!(read_to_close(&mut c), b"B");
}

#[test]
fn no_live_upstreams_closes_client() {
    let dead_guard = dead_port();
    let dead = dead_guard.port;
    let s1 = free_port();
    let srv = start(
        &format!(
            "{HTTP}stream {{ server {{ listen 127.0.0.1:@S1@; proxy_pass 127.0.0.1:{dead}; }} }}"
        ),
        s1,
        0,
    );
    let mut c = connect(s1);
    let _ = c.write_all(b"x");
    assert_eq!(read_to_close(&mut c), b"");
    eventually(5, "connect error logged", || {
        srv.error_log()
            .contains(&format!("upstream: \"127.0.0.1:{}\"", dead))
    });
}

#[test]
fn proxy_timeout_closes_idle_sessions_only() {
    let be = echo_backend();
    let s1 = free_port();
    let _srv = start(
        &format!(
            "{HTTP}stream {{ proxy_timeout 400ms; server {{ listen 127.0.0.1:@S1@; proxy_pass 127.0.0.1:{be}; }} }}"
        ),
        s1,
        0,
    );
    // Active: a byte every 150 ms for over a second keeps it open.
    let mut c = connect(s1);
    for i in 0..8u8 {
        c.write_all(&[i]).expect("write while active");
        let mut b = [0u8; 1];
        c.read_exact(&mut b).expect("echo while active");
        assert_eq!(b[0], i);
        std::thread::sleep(Duration::from_millis(150));
    }
    // Idle: closed after about proxy_timeout.
    let t = Instant::now();
    assert_eq!(read_to_close(&mut c), b"");
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(200) && e < Duration::from_secs(3),
        "{:?}",
        e
    );
}

#[test]
fn reload_adds_and_removes_stream_ports_without_closing_sessions() {
    let be = echo_backend();
    let (s1, s2) = (free_port(), free_port());
    let conf1 = format!(
        "{HTTP}stream {{ server {{ listen 127.0.0.1:{s1}; proxy_pass 127.0.0.1:{be}; }} }}"
    );
    let srv = start(&conf1, s1, s2);
    let mut old = connect(s1);
    old.write_all(b"before").expect("write");
    let mut b = [0u8; 6];
    old.read_exact(&mut b).expect("echo");
    // New config: s1 gone, s2 added.
    let conf2 = format!(
        "{HTTP}stream {{ server {{ listen 127.0.0.1:{s2}; proxy_pass 127.0.0.1:{be}; }} }}"
    );
    srv.rewrite_conf(&conf2, srv.port);
    srv.signal(SIGHUP);
    eventually(5, "new stream port serves", || {
        TcpStream::connect(("127.0.0.1", s2)).is_ok()
    });
    assert_eq!(echo_once(s2, b"new port"), b"new port");
    eventually(5, "removed stream port closed", || {
        TcpStream::connect(("127.0.0.1", s1)).is_err()
    });
    // The session from before the reload is still proxied.
    old.write_all(b"after!").expect("write after reload");
    old.read_exact(&mut b).expect("echo after reload");
    assert_eq!(&b, b"after!");
}

/// LISTEN sockets on `port` in /proc/net/tcp (state 0A).
fn listen_sockets(port: u16) -> usize {
    let t = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let want = format!(":{:04X}", port);
    t.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
        })
        .count()
}

#[test]
fn reuseport_gives_one_socket_per_worker() {
    let be = echo_backend();
    let (s1, s2) = (free_port(), free_port());
    let _srv = start(
        &format!(
            "worker_processes 2;\n{HTTP}stream {{\n\
             server {{ listen 127.0.0.1:@S1@ reuseport backlog=64 so_keepalive=on; proxy_pass 127.0.0.1:{be}; }}\n\
             server {{ listen 127.0.0.1:@S2@; proxy_pass 127.0.0.1:{be}; }}\n}}"
        ),
        s1,
        s2,
    );
    assert_eq!(listen_sockets(s1), 2, "reuseport: one socket per worker");
    assert_eq!(
        listen_sockets(s2),
        1,
        "without reuseport: one shared socket"
    );
    for _ in 0..4 {
        assert_eq!(echo_once(s1, b"ping"), b"ping");
    }
}

#[test]
fn upstream_side_counts_against_worker_connections() {
    let be = echo_backend();
    let s1 = free_port();
    let srv = start(
        &format!(
            "events {{ worker_connections 2; }}\n{HTTP}stream {{ server {{ listen 127.0.0.1:@S1@; proxy_pass 127.0.0.1:{be}; }} }}"
        ),
        s1,
        0,
    );
    // Let the harness's probe connection to @PORT@ go away.
    eventually(5, "probe connection closed", || {
        let mut c = connect(s1);
        c.set_read_timeout(Some(Duration::from_millis(300))).ok();
        c.write_all(b"p").is_ok() && {
            let mut b = [0u8; 1];
            c.read_exact(&mut b).is_ok()
        }
    });
    // Session one holds both slots (client + upstream)...
    let mut one = connect(s1);
    assert_eq!(
        {
            one.write_all(b"1").expect("write");
            let mut b = [0u8; 1];
            one.read_exact(&mut b).expect("echo");
            b
        },
        *b"1"
    );
    // ...so a second client waits in the backlog, unserved.
    let mut two = connect(s1);
    two.set_read_timeout(Some(Duration::from_millis(400))).ok();
    two.write_all(b"2").expect("write");
    let mut b = [0u8; 1];
    assert!(two.read_exact(&mut b).is_err(), "served beyond the limit");
    drop(one);
    two.set_read_timeout(Some(Duration::from_secs(5))).ok();
    two.read_exact(&mut b).expect("served once a slot is free");
    assert_eq!(&b, b"2");
    srv.wait_error_log("2 worker_connections are not enough");
}

#[test]
fn port_in_use_is_a_startup_error() {
    let (_held, port) = listener();
    let p = Prefix::new();
    let conf = p.write(
        "conf/nginx.conf",
        format!("events {{}}\nstream {{ server {{ listen 127.0.0.1:{port}; proxy_pass 127.0.0.1:1; }} }}\n"),
    );
    let out = p.run(&["-c", conf.to_str().unwrap_or(""), "-g", "daemon off;"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", err);
    assert!(
        err.contains(&format!(
            "bind() to 127.0.0.1:{} failed (98: Address already in use)",
            port
        )),
        "{}",
        err
    );
}

#[test]
fn config_errors_worded_as_nginx() {
    let p = Prefix::new();
    let cases: &[(&str, &str)] = &[
        (
            "http { proxy_timeout 1s; }",
            "\"proxy_timeout\" directive is not allowed here in",
        ),
        (
            "stream { server { listen 1234; } }",
            "no handler for server in",
        ),
        (
            "stream { upstream u { server 127.0.0.1; } server { listen 1234; proxy_pass u; } }",
            "no port in upstream \"127.0.0.1\" in",
        ),
        (
            "stream { server { listen 127.0.0.1; proxy_pass 127.0.0.1:1; } }",
            "no port in \"127.0.0.1\" of the \"listen\" directive in",
        ),
        (
            "stream { server { listen 1234 default_server; proxy_pass 127.0.0.1:1; }\n\
             server { listen 1234 default_server; proxy_pass 127.0.0.1:2; } }",
            "a duplicate default server for 0.0.0.0:1234 in",
        ),
        (
            "stream { server { listen 1234; proxy_pass 127.0.0.1:1; location / {} } }",
            "\"location\" directive is not allowed here in",
        ),
        (
            "stream { server { listen 1234; proxy_pass 127.0.0.1:1; bogus_thing; } }",
            "unknown directive \"bogus_thing\" in",
        ),
        (
            "stream { server { listen 1234; listen 1234; proxy_pass 127.0.0.1:1; } }",
            "duplicate \"0.0.0.0:1234\" address and port pair in",
        ),
    ];
    for (body, want) in cases {
        let conf = p.write("conf/t.conf", format!("events {{}}\n{}\n", body));
        let out = p.run(&["-t", "-c", conf.to_str().unwrap_or("")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{} accepted", body);
        assert!(err.contains(want), "{}: {}", body, err);
    }
    // And a full valid block passes -t.
    let conf = p.write(
        "conf/t.conf",
        "events {}\nstream {\n error_log logs/stream.log info;\n proxy_connect_timeout 1s;\n\
         upstream u { zone u 64k; server 127.0.0.1:1 weight=2 max_fails=3 fail_timeout=5s; server 127.0.0.1:2 backup; server 127.0.0.1:3 down; }\n\
         server { listen 127.0.0.1:1234 so_keepalive=30m::10; proxy_pass u; proxy_timeout 1m; proxy_buffer_size 8k; tcp_nodelay off; }\n}\n",
    );
    let out = p.run(&["-t", "-c", conf.to_str().unwrap_or("")]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn reload_moves_a_port_from_http_to_stream() {
    let be = echo_backend();
    let srv = start(HTTP, 0, 0);
    assert!(srv.get("/").status > 0, "http answers first");
    srv.rewrite_conf(
        &format!("stream {{ server {{ listen 127.0.0.1:@PORT@; proxy_pass 127.0.0.1:{be}; }} }}"),
        srv.port,
    );
    srv.signal(SIGHUP);
    // The same socket now proxies: no rebind, no refused connection.
    eventually(5, "port serves stream", || {
        let mut c = connect(srv.port);
        c.set_read_timeout(Some(Duration::from_millis(500))).ok();
        let mut b = [0u8; 4];
        c.write_all(b"ping").is_ok() && c.read_exact(&mut b).is_ok() && &b == b"ping"
    });
}
