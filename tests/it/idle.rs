//! Idle connections that have been parked (moved out of their task after
//! a second without a byte, see `core::park`): they keep their deadline,
//! their request count and their stub_status state, pick up a reload,
//! and QUIT closes them while a request in flight completes.
//!
//! Each test idles a connection for `PARKED` (longer than the park delay)
//! so that the parked path is the one exercised; nothing here asserts on
//! how long anything took.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::harness::*;

const SIGHUP: i32 = 1;
const SIGQUIT: i32 = 3;

/// Longer than the server's park delay (1 s).
const PARKED: Duration = Duration::from_millis(1600);

fn get(c: &mut TcpStream, path: &str) -> Resp {
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
        .expect("write");
    read_response(c).expect("response")
}

/// Reads until the server closes; the result of the read that ended it.
fn wait_close(c: &mut TcpStream) -> std::io::Result<usize> {
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut b = [0u8; 4096];
    loop {
        match c.read(&mut b) {
            Ok(0) => return Ok(0),
            Ok(_) => {}
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn parked_connection_keeps_its_count_and_uses_a_reloaded_config() {
    let s = Server::start(
        "http { keepalive_requests 3; server { listen 127.0.0.1:@PORT@; location / { return 200 one; } } }",
    );
    let mut c = s.connect();
    assert_eq!(get(&mut c, "/").body, b"one");
    std::thread::sleep(PARKED);
    s.rewrite_conf(
        "http { keepalive_requests 3; server { listen 127.0.0.1:@PORT@; location / { return 200 two; } } }",
        s.port,
    );
    s.signal(SIGHUP);
    eventually(5, "new config serves", || s.get("/").body == b"two");
    let r = get(&mut c, "/");
    assert_eq!(r.body, b"two", "parked connection uses the new config");
    assert_eq!(r.header("Connection"), Some("keep-alive"));
    std::thread::sleep(PARKED);
    // The third request on this connection, counted across two parks.
    let r = get(&mut c, "/");
    assert_eq!(r.body, b"two");
    assert_eq!(
        r.header("Connection"),
        Some("close"),
        "keepalive_requests 3"
    );
    assert_eq!(wait_close(&mut c).ok(), Some(0));
}

#[test]
fn parked_connection_closes_at_keepalive_timeout() {
    let s = Server::start(
        "http { keepalive_timeout 2s; server { listen 127.0.0.1:@PORT@; location / { return 200 ok; } } }",
    );
    let mut c = s.connect();
    let r = get(&mut c, "/");
    assert_eq!(r.header("Connection"), Some("keep-alive"));
    // Closed by the server (a clean FIN), not left open until our 30 s.
    assert_eq!(wait_close(&mut c).ok(), Some(0));
}

#[test]
fn parked_fresh_connection_times_out_with_a_reset() {
    let s = Server::start(
        "http { reset_timedout_connection on; client_header_timeout 2s;
            server { listen 127.0.0.1:@PORT@; location / { return 200 ok; } } }",
    );
    // Sends nothing: parked while waiting for its first request, then
    // client_header_timeout with reset_timedout_connection: an RST.
    let mut c = s.connect();
    let r = wait_close(&mut c);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{r:?}"
    );
    // A parked fresh connection that does send a request is served.
    let mut c = s.connect();
    std::thread::sleep(PARKED);
    assert_eq!(get(&mut c, "/").body, b"ok");
}

#[test]
fn parked_connection_counts_as_waiting() {
    let s = Server::start(
        "http { server { listen 127.0.0.1:@PORT@; location = /status { stub_status; } location / { return 200 ok; } } }",
    );
    let mut c = s.connect();
    assert_eq!(get(&mut c, "/").body, b"ok");
    std::thread::sleep(PARKED);
    let body = s.get("/status").body_str();
    // This connection (writing) and the parked one (waiting).
    assert!(body.starts_with("Active connections: 2 \n"), "{body:?}");
    assert!(
        body.ends_with("Reading: 0 Writing: 1 Waiting: 1 \n"),
        "{body:?}"
    );
    // And the parked one still works.
    assert_eq!(get(&mut c, "/").body, b"ok");
}

#[test]
fn quit_closes_parked_connections_while_a_request_completes() {
    let p = Prefix::new();
    let big = vec![b'x'; 8 << 20];
    p.write("html/big", &big);
    p.write("html/a", "A");
    let mut s = Server::start_in(p, "http { server { listen 127.0.0.1:@PORT@; root html; } }");
    let mut idle = s.connect();
    assert_eq!(get(&mut idle, "/a").body, b"A");
    std::thread::sleep(PARKED);
    let mut busy = s.connect();
    busy.write_all(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        .expect("write");
    let mut first = [0u8; 16];
    busy.read_exact(&mut first).expect("read");
    s.signal(SIGQUIT);
    // The parked connection closes while the big response is still
    // unread (so still in flight).
    assert_eq!(wait_close(&mut idle).ok(), Some(0));
    let mut rest = first.to_vec();
    rest.extend(read_to_close(&mut busy));
    let r = Resp::parse(&rest).expect("response");
    assert_eq!(r.body.len(), big.len());
    assert_eq!(s.wait_exit(Duration::from_secs(5)), Some(0));
}

#[test]
fn parked_unix_socket_connection_is_served() {
    let p = Prefix::new();
    let sock = p.path("logs/t.sock");
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@; listen unix:{}; location / {{ return 200 ok; }} }} }}",
        sock.display()
    );
    let _s = Server::start_in(p, &conf);
    let mut c = None;
    eventually(5, "unix socket listens", || {
        c = std::os::unix::net::UnixStream::connect(&sock).ok();
        c.is_some()
    });
    let mut c = c.expect("connected");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    for _ in 0..2 {
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            .expect("write");
        let mut data = Vec::new();
        let mut b = [0u8; 4096];
        while Resp::parse_complete(&data).is_none() {
            let n = c.read(&mut b).expect("read");
            assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&data));
            data.extend_from_slice(&b[..n]);
        }
        let (r, _) = Resp::parse_complete(&data).expect("response");
        assert_eq!(r.body, b"ok");
        std::thread::sleep(PARKED);
    }
}

#[test]
fn deadlines_survive_many_short_connections() {
    // Every new connection waits for its first request in the lot; once
    // served its deadline entry goes stale, and after a few thousand the
    // lot rebuilds its deadline heap. A connection parked before all of
    // them must still be closed at its own deadline, and one parked after
    // them at its own.
    let s = Server::start(
        "http { client_header_timeout 3s; keepalive_timeout 3s;
            server { listen 127.0.0.1:@PORT@; location / { return 200 ok; } } }",
    );
    let mut silent = s.connect();
    for i in 0..2500 {
        let mut c = s.connect();
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .expect("write");
        let r = read_response(&mut c).expect("response");
        assert_eq!(r.body, b"ok", "request {i}");
    }
    let mut kept = s.connect();
    assert_eq!(get(&mut kept, "/").body, b"ok");
    assert_eq!(
        wait_close(&mut silent).ok(),
        Some(0),
        "first-request wait timed out"
    );
    assert_eq!(
        wait_close(&mut kept).ok(),
        Some(0),
        "keep-alive wait timed out"
    );
}

#[test]
fn quit_answers_a_request_sent_just_after_it_with_connection_close() {
    // A keep-alive connection between two requests when QUIT arrives (not
    // parked yet): its next request, already on its way, is answered with
    // `Connection: close` instead of the connection being closed under it
    // (nginx closes it; DIFFERENCES.md).
    let p = Prefix::new();
    p.write("html/a", "A");
    let mut s = Server::start_in(
        p,
        "error_log logs/error.log notice;
         http { server { listen 127.0.0.1:@PORT@; root html; } }",
    );
    let mut c = s.connect();
    assert_eq!(get(&mut c, "/a").body, b"A");
    s.signal(SIGQUIT);
    s.wait_error_log("signal 3 (SIGQUIT) received");
    // Time for the worker to see the stop (well inside the 1 s grace).
    std::thread::sleep(Duration::from_millis(200));
    c.write_all(b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
        .expect("write");
    let r = Resp::parse(&read_to_close(&mut c)).expect("an answer after QUIT");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"A"[..]));
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(s.wait_exit(Duration::from_secs(5)), Some(0));
}
