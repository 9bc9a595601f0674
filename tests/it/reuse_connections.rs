//! A worker whose `worker_connections` are taken by idle clients (connected
//! and silent, or kept alive after a request) still serves a new client:
//! as nginx, it closes the idle connections it has held longest when a new
//! client comes and no connection is free, and warns
//! `N worker_connections are not enough, reusing connections`. tern and
//! nginx run the same config and the same clients.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::harness::*;

const CONF: &str = "worker_processes 1;
error_log logs/error.log warn;
events { worker_connections 32; }
http {
    access_log off;
    keepalive_timeout 60s;
    client_header_timeout 60s;
    server {
        listen 127.0.0.1:@PORT@;
        location / { return 200 \"ok\\n\"; }
    }
}
";

/// Fills the worker with idle clients: half send nothing, half are
/// kept alive after one request. Returns them (open), and then asks for
/// a page on a new connection: its status line.
fn crowd_then_ask(port: u16) -> (Vec<TcpStream>, String) {
    let mut idle = Vec::new();
    for i in 0..40 {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            break;
        };
        if i % 2 == 1 {
            s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut b = [0u8; 256];
            let _ = s.read(&mut b);
        }
        idle.push(s);
        // Past tern's park delay for the kept-alive ones, in order.
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut s = connect(port);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /new HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let line = String::from_utf8_lossy(&out)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    (idle, line)
}

/// How many of the idle clients were closed by the server.
fn closed(idle: &mut [TcpStream]) -> usize {
    idle.iter_mut()
        .filter(|s| {
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let mut b = [0u8; 64];
            let mut r: &TcpStream = s;
            match r.read(&mut b) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
            }
        })
        .count()
}

#[test]
fn idle_connections_make_room_for_new_ones() {
    let srv = Server::start(CONF);
    let (mut idle, line) = crowd_then_ask(srv.port);
    assert_eq!(line, "HTTP/1.1 200 OK", "{}", srv.error_log());
    let log = srv.wait_error_log("worker_connections are not enough, reusing connections");
    assert!(log.contains("[warn]"), "{}", log);
    let n = closed(&mut idle);
    assert!(
        n >= 1 && n < idle.len(),
        "{} of {} idle closed",
        n,
        idle.len()
    );

    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, CONF, port) else {
        return;
    };
    let (mut idle, line) = crowd_then_ask(port);
    assert_eq!(line, "HTTP/1.1 200 OK");
    let log = wait_log(&p, "logs/error.log", "reusing connections");
    assert!(
        log.contains("[warn]")
            && log.contains("32 worker_connections are not enough, reusing connections"),
        "{}",
        log
    );
    assert!(closed(&mut idle) >= 1);
}
