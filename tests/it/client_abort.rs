//! A client that goes away while a proxied body keeps it waiting frees the
//! upstream connection at once (nginx's broken-connection check), instead
//! of holding it until `proxy_read_timeout`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use crate::harness::Server;

#[test]
fn a_client_that_hangs_up_mid_body_releases_the_upstream() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let (released, gone) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut c, _)) = l.accept() else { return };
        let mut buf = [0u8; 1024];
        let _ = c.read(&mut buf);
        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nx");
        // Nothing more is sent; tern closing its side ends this read.
        let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
        let closed = matches!(c.read(&mut buf), Ok(0) | Err(_));
        let _ = released.send(closed);
    });
    let s = Server::start(&format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;\n\
         location / {{ proxy_read_timeout 30s; proxy_pass http://127.0.0.1:{}; }}\n\
         }} }}\n",
        port
    ));
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"x") {
        let n = c.read(&mut buf).expect("read");
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    drop(c);
    let closed = gone
        .recv_timeout(Duration::from_secs(5))
        .expect("the upstream connection was still open 5 s after the client left");
    assert!(closed);
}
