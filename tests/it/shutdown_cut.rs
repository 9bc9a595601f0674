//! HTTP/1 requests still running when `worker_shutdown_timeout` runs out,
//! after a reload (nginx's old worker ends them; tern reloads in place and
//! ends those that began before the reload) or a graceful stop: the
//! connection closes and the request is logged as nginx 1.22 logs it
//! (checked on the real binary): `000` and nothing sent when no answer
//! had started, else its status with the bytes sent so far; nothing in
//! the error log.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::harness::*;
use crate::origin::Origin;

/// An origin that takes a request and answers `/mid` with a head and half
/// its body, anything else with nothing, then keeps the connection open
/// far longer than the tests wait.
fn stalling_origin() -> Origin {
    Origin::serve(|mut c| {
        let Some(req) = c.next(false) else { return };
        c.record(&req);
        if req.starts_with(b"GET /mid ") {
            let _ = c
                .stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello");
        }
        c.stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .ok();
        let mut b = [0u8; 1024];
        while matches!(c.stream.read(&mut b), Ok(n) if n > 0) {}
    })
}

fn conf(origin: u16) -> String {
    format!(
        "worker_processes 1; worker_shutdown_timeout 200ms;
        error_log logs/error.log info;
        http {{ log_format t \"$request $status $body_bytes_sent\";
          access_log logs/access.log t;
          server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_pass http://127.0.0.1:{origin}; proxy_read_timeout 30s;
                proxy_buffering off; }}
            location /fast {{ return 200 \"fast\\n\"; }}
          }} }}"
    )
}

/// Sends `GET path` and reads what arrives until `until` is in it.
fn send(port: u16, path: &str, until: &[u8]) -> TcpStream {
    let mut c = connect(port);
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .expect("send");
    let mut got = Vec::new();
    let mut b = [0u8; 512];
    while !until.is_empty() && find(&got, until).is_none() {
        let n = c.read(&mut b).expect("the answer so far");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&b[..n]);
    }
    c
}

/// The rest of what the server sends before it closes.
fn rest(c: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut b = [0u8; 512];
    loop {
        match c.read(&mut b) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) => panic!("no close: {e}; got {:?}", String::from_utf8_lossy(&got)),
        }
    }
}

#[test]
fn requests_in_flight_at_a_reload_end_when_worker_shutdown_timeout_runs_out() {
    let origin = stalling_origin();
    let s = Server::start(&conf(origin.port));
    let mut before = send(s.port, "/slow", b"");
    let mut mid = send(s.port, "/mid", b"hello");
    eventually(10, "both requests at the upstream", || {
        origin.requests().len() == 2
    });
    s.signal(libc::SIGHUP);
    wait_log(&s.prefix, "logs/error.log", "reconfigured");
    // A request begun after the reload is not cut.
    let r = text(&s.raw(b"GET /fast HTTP/1.0\r\n\r\n"));
    assert!(r.ends_with("\r\n\r\nfast\n"), "{r}");
    // Closed by the server, well before the origin's 30 s: nothing more.
    assert_eq!(text(&rest(&mut before)), "");
    assert_eq!(text(&rest(&mut mid)), "");
    let log = wait_log(&s.prefix, "logs/access.log", "GET /slow");
    let log = if log.contains("GET /mid") {
        log
    } else {
        wait_log(&s.prefix, "logs/access.log", "GET /mid")
    };
    assert!(log.contains("GET /slow HTTP/1.1 000 0\n"), "{log}");
    assert!(log.contains("GET /mid HTTP/1.1 200 5\n"), "{log}");
    assert!(log.contains("GET /fast HTTP/1.0 200 5\n"), "{log}");
    let err = s.error_log();
    assert!(
        !err.lines()
            .any(|l| l.contains("[info]") || l.contains("[error]")),
        "{err}"
    );
}

#[test]
fn a_request_in_flight_at_quit_ends_when_worker_shutdown_timeout_runs_out() {
    let origin = stalling_origin();
    let mut s = Server::start(&conf(origin.port));
    let mut c = send(s.port, "/slow", b"");
    eventually(10, "the request at the upstream", || {
        !origin.requests().is_empty()
    });
    s.signal(libc::SIGQUIT);
    assert_eq!(text(&rest(&mut c)), "");
    assert!(s.wait_exit(Duration::from_secs(10)).is_some());
    let log = s.prefix.read("logs/access.log");
    assert_eq!(log, "GET /slow HTTP/1.1 000 0\n");
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
