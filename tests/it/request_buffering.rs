//! `proxy_request_buffering off` (and the fastcgi/scgi/uwsgi forms): the
//! request body goes upstream as it arrives, so a backend sees the head
//! and the first part of the body while the client is still sending the
//! rest; a body of unknown length goes chunked with `proxy_http_version
//! 1.1`; once any of the request went to a peer, it is not passed to the
//! next one (nginx's `ngx_http_upstream_next`). The backends here are
//! plain sockets driven step by step by the test.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::harness::*;

/// Reads from `s` until `want` has been seen in what arrived (or 5 s
/// passed, or the peer closed); returns all that arrived.
fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, want: &[u8]) -> bool {
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if got.windows(want.len()).any(|w| w == want) {
            return true;
        }
        let mut buf = [0u8; 4096];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    got.windows(want.len()).any(|w| w == want)
}

fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let p = l.local_addr().expect("addr").port();
    (l, p)
}

fn accept(l: &TcpListener) -> TcpStream {
    l.set_nonblocking(true).expect("nonblocking");
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).expect("blocking");
                return s;
            }
            Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("no upstream connection: {}", e),
        }
    }
}

fn conf(up: u16, extra: &str) -> String {
    format!(
        r#"
error_log logs/error.log info;
http {{
    access_log off;
    server {{
        listen 127.0.0.1:@PORT@;
        proxy_request_buffering off;
        location / {{
            client_body_buffer_size 2k;
            add_header X-Body "$request_body";
            proxy_pass http://127.0.0.1:{up};
            {extra}
        }}
        location /buffered/ {{
            proxy_request_buffering on;
            proxy_pass http://127.0.0.1:{up};
        }}
    }}
}}
"#
    )
}

#[test]
fn body_with_a_length_reaches_upstream_while_the_client_sends_it() {
    let (l, up) = listener();
    let srv = Server::start(&conf(up, ""));
    let mut c = connect(srv.port);
    c.write_all(
        b"PUT /u HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 10\r\n\r\n01234",
    )
    .expect("send");
    let mut b = accept(&l);
    let mut got = Vec::new();
    // The head and the first half, before the client sent the rest.
    assert!(
        read_until(&mut b, &mut got, b"\r\n\r\n01234"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("PUT /u HTTP/1.0\r\n"), "{}", text);
    assert!(text.contains("\r\nContent-Length: 10\r\n"), "{}", text);
    c.write_all(b"56789").expect("send");
    assert!(
        read_until(&mut b, &mut got, b"0123456789"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    b.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
        .expect("answer");
    drop(b);
    let r = String::from_utf8_lossy(&read_to_close(&mut c)).to_string();
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{}", r);
    // What was read is kept for $request_body, as nginx's buffer.
    assert!(r.contains("\r\nX-Body: 0123456789\r\n"), "{}", r);
    assert!(r.ends_with("\r\n\r\nOK"), "{}", r);
}

#[test]
fn chunked_body_goes_chunked_with_http_1_1_and_buffered_with_1_0() {
    let (l, up) = listener();
    let srv = Server::start(
        &conf(
            up,
            "location /v11/ { proxy_http_version 1.1; proxy_pass http://127.0.0.1:UP; }",
        )
        .replace("UP;", &format!("{};", up)),
    );
    let mut c = connect(srv.port);
    c.write_all(b"POST /v11/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n")
        .expect("send");
    let mut b = accept(&l);
    let mut got = Vec::new();
    assert!(
        read_until(&mut b, &mut got, b"\r\n\r\n5\r\n01234\r\n"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("POST /v11/a HTTP/1.1\r\n"), "{}", text);
    assert!(
        text.contains("\r\nTransfer-Encoding: chunked\r\n"),
        "{}",
        text
    );
    assert!(!text.contains("Content-Length"), "{}", text);
    c.write_all(b"5\r\n56789\r\n0\r\n\r\n").expect("send");
    assert!(
        read_until(&mut b, &mut got, b"01234\r\n5\r\n56789\r\n0\r\n\r\n"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    b.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
        .expect("answer");
    drop(b);
    let r = String::from_utf8_lossy(&read_to_close(&mut c)).to_string();
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{}", r);

    // HTTP/1.0 upstream cannot carry it chunked: read whole first, sent
    // with its length.
    let mut c = connect(srv.port);
    c.write_all(b"POST /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n01234\r\n")
        .expect("send");
    std::thread::sleep(Duration::from_millis(300));
    c.write_all(b"5\r\n56789\r\n0\r\n\r\n").expect("send");
    let mut b = accept(&l);
    let mut got = Vec::new();
    assert!(
        read_until(&mut b, &mut got, b"\r\n\r\n0123456789"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.contains("\r\nContent-Length: 10\r\n"), "{}", text);
    b.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
        .expect("answer");
    drop(b);
    let r = String::from_utf8_lossy(&read_to_close(&mut c)).to_string();
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{}", r);
}

/// An upstream of two peers where the first reads the request head and
/// closes: with a buffered body the request goes on to the second peer;
/// streamed, it had started to go, so it does not (502).
#[test]
fn no_next_upstream_once_a_streamed_body_began_to_go() {
    let (la, a) = listener();
    let (lb, b) = listener();
    let conf = format!(
        r#"
error_log logs/error.log info;
http {{
    access_log off;
    upstream two {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}
    server {{
        listen 127.0.0.1:@PORT@;
        proxy_next_upstream error timeout;
        location /off/ {{ proxy_request_buffering off; proxy_pass http://two; }}
        location /on/ {{ proxy_request_buffering on; proxy_pass http://two; }}
    }}
}}
"#
    );
    let srv = Server::start(&conf);
    for (path, retried) in [("/on/x", true), ("/off/x", false)] {
        let mut c = connect(srv.port);
        c.write_all(
            format!("PUT {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 10\r\n\r\n0123456789").as_bytes(),
        )
        .expect("send");
        // Whichever peer comes first closes after the head; the other
        // answers if asked.
        let (first, second) = {
            la.set_nonblocking(true).expect("nb");
            lb.set_nonblocking(true).expect("nb");
            let end = Instant::now() + Duration::from_secs(5);
            loop {
                if let Ok((s, _)) = la.accept() {
                    break (s, &lb);
                }
                if let Ok((s, _)) = lb.accept() {
                    break (s, &la);
                }
                assert!(Instant::now() < end, "no upstream connection");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        let mut first = first;
        first.set_nonblocking(false).expect("blocking");
        let mut got = Vec::new();
        assert!(read_until(&mut first, &mut got, b"\r\n\r\n"));
        drop(first);
        let mut answered = false;
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            if let Ok((mut s, _)) = second.accept() {
                s.set_nonblocking(false).expect("blocking");
                let mut got = Vec::new();
                assert!(
                    read_until(&mut s, &mut got, b"0123456789"),
                    "{:?}",
                    String::from_utf8_lossy(&got)
                );
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
                    .expect("answer");
                answered = true;
                break;
            }
            // The 502 came first: no second peer will be asked.
            if !retried {
                c.set_read_timeout(Some(Duration::from_millis(50)))
                    .expect("timeout");
                let mut peek = [0u8; 1];
                if c.peek(&mut peek).is_ok_and(|n| n > 0) {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let r = String::from_utf8_lossy(&read_to_close(&mut c)).to_string();
        assert_eq!(answered, retried, "{}: {}", path, r);
        let want = if retried {
            "HTTP/1.1 200 OK\r\n"
        } else {
            "HTTP/1.1 502 Bad Gateway\r\n"
        };
        assert!(r.starts_with(want), "{}: {}", path, r);
    }
}

/// The same body over HTTP/2 (curl with prior knowledge, the body fed
/// from a pipe in two steps): the backend has the first part before the
/// second is written.
#[test]
fn h2_body_streams_too() {
    let (l, up) = listener();
    let conf = format!(
        r#"
error_log logs/error.log info;
http {{
    access_log off;
    server {{
        listen 127.0.0.1:@PORT@ http2;
        location / {{
            proxy_request_buffering off;
            proxy_http_version 1.1;
            proxy_pass http://127.0.0.1:{up};
        }}
    }}
}}
"#
    );
    let srv = Server::start(&conf);
    let mut child = std::process::Command::new("curl")
        .args([
            "-s",
            "--http2-prior-knowledge",
            "-T",
            "-",
            "-X",
            "POST",
            &format!("http://127.0.0.1:{}/h2", srv.port),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("curl");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"first-part;").expect("pipe");
    stdin.flush().expect("flush");
    let mut b = accept(&l);
    let mut got = Vec::new();
    assert!(
        read_until(&mut b, &mut got, b"first-part;"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("POST /h2 HTTP/1.1\r\n"), "{}", text);
    assert!(
        text.contains("\r\nTransfer-Encoding: chunked\r\n"),
        "{}",
        text
    );
    stdin.write_all(b"second-part").expect("pipe");
    drop(stdin);
    assert!(
        read_until(&mut b, &mut got, b"second-part\r\n0\r\n\r\n"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    b.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nDONE")
        .expect("answer");
    drop(b);
    let out = child.wait_with_output().expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "DONE");
}
