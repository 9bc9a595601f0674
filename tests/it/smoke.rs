//! The smallest end-to-end checks: a file, a 404, keep-alive.
use crate::harness::*;

#[test]
fn serves_a_file_and_404() {
    let p = Prefix::new();
    p.write("html/index.html", "hello\n");
    let s = Server::start_in(p, "http { server { listen 127.0.0.1:@PORT@; root html; } }");
    let r = s.get("/index.html");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello\n");
    assert_eq!(r.header("Content-Length"), Some("6"));
    let r = s.get("/missing");
    assert_eq!(r.status, 404);
    assert!(r.body_str().contains("<title>404 Not Found</title>"));
    s.wait_error_log("open() \"");
}

#[test]
fn keepalive_serves_two_requests_on_one_connection() {
    let p = Prefix::new();
    p.write("html/a", "A");
    let s = Server::start_in(p, "http { server { listen 127.0.0.1:@PORT@; root html; } }");
    let mut c = s.connect();
    use std::io::Write;
    c.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let r1 = read_response(&mut c).expect("first");
    c.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let r2 = read_response(&mut c).expect("second");
    assert_eq!((r1.status, r2.status), (200, 200));
    assert_eq!(r2.body, b"A");
}
