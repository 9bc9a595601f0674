//! Proxying an HTTP/1.1 upgrade (WebSocket) as nginx does: a backend in
//! the test answers `101 Switching Protocols`, and the connection becomes
//! a tunnel both ways. Checked over raw sockets: the 101 head (against
//! the real nginx on the same configuration when it is installed), data
//! both ways, the backend's bytes that came with its 101 head, the
//! client's bytes pipelined after its request, the end from either side
//! (nginx closes both; no half-close), the idle timeout, the access-log
//! line, a 101 to a request without `Upgrade`, and an HTTP/1.0 upstream
//! that says keep-alive.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::harness::*;

const HEAD_101: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\
Keep-Alive: timeout=5\r\nX-Foo: bar\r\n\r\n";

const UPGRADE_REQ: &[u8] = b"GET /ws/chat HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\n\
Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
Sec-WebSocket-Version: 13\r\n\r\n";

fn conf(up: u16) -> String {
    format!(
        r#"worker_processes 1;
error_log logs/error.log info;
http {{
    log_format ws '$status $body_bytes_sent $bytes_sent $request_time "$request"';
    access_log logs/access.log ws;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    upstream ka {{ server 127.0.0.1:{up}; keepalive 4; }}
    server {{
        listen 127.0.0.1:@PORT@;
        location /ws/ {{
            proxy_pass http://127.0.0.1:{up};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 1s;
        }}
        location /ka/ {{
            proxy_pass http://ka;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
        location /plain {{ return 200 "plain\n"; }}
    }}
}}
"#
    )
}

/// A backend that runs `script` on each connection it accepts (with the
/// request head and body it read), on its own thread.
struct Backend {
    port: u16,
    conns: mpsc::Receiver<Vec<u8>>,
}

impl Backend {
    fn start<F>(script: F) -> Backend
    where
        F: Fn(TcpStream, Vec<u8>) + Send + Sync + 'static,
    {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind backend");
        let port = l.local_addr().expect("addr").port();
        let (tx, rx) = mpsc::channel();
        let script = std::sync::Arc::new(script);
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let script = script.clone();
                let tx = tx.clone();
                thread::spawn(move || {
                    let req = read_head(&mut s);
                    let _ = tx.send(req.clone());
                    script(s, req);
                });
            }
        });
        Backend { port, conns: rx }
    }

    /// The next request head a connection brought.
    fn request(&self) -> Vec<u8> {
        self.conns
            .recv_timeout(Duration::from_secs(10))
            .expect("a request at the backend")
    }
}

/// Reads up to the end of a head (byte by byte: what follows belongs to
/// the tunnel).
fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut h = Vec::new();
    let mut b = [0u8; 1];
    while !h.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => h.push(b[0]),
            _ => break,
        }
    }
    h
}

/// Reads until `want` bytes in all have come, the peer closes or 5 s pass.
fn read_n(s: &mut TcpStream, want: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut b = [0u8; 65536];
    while out.len() < want && Instant::now() < deadline {
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    out
}

/// Reads until what came contains `pat` (or the peer closes, or 5 s pass).
fn read_until(s: &mut TcpStream, got: &mut Vec<u8>, pat: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while find(got, pat).is_none() && Instant::now() < deadline {
        let more = read_n(s, 1);
        if more.is_empty() {
            return;
        }
        got.extend_from_slice(&more);
    }
}

/// Whether the peer closes within `within` (reading and dropping bytes).
fn closes_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut b = [0u8; 4096];
    while Instant::now() < deadline {
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

/// Date and Server blanked, the port of Host made neutral.
fn normalize(b: &[u8], up: u16) -> String {
    crate::harness::blank_date_server(
        &String::from_utf8_lossy(b).replace(&format!(":{}", up), ":UP"),
    )
}

/// The echo backend: 101 and "HELLO" in one write, then "echo:" + each
/// read until the client side closes.
fn echo(mut s: TcpStream, _req: Vec<u8>) {
    let mut first = HEAD_101.to_vec();
    first.extend_from_slice(b"HELLO");
    let _ = s.write_all(&first);
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut out = b"echo:".to_vec();
                out.extend_from_slice(&b[..n]);
                if s.write_all(&out).is_err() {
                    return;
                }
            }
        }
    }
}

/// One upgrade exchange on `port`: the request with "PIPE" behind it,
/// then "abc"; what the client saw, and whether the close came.
fn echo_session(port: u16) -> (Vec<u8>, bool) {
    let mut c = connect(port);
    let mut req = UPGRADE_REQ.to_vec();
    req.extend_from_slice(b"PIPE");
    c.write_all(&req).expect("send");
    let mut got = Vec::new();
    // Head, HELLO (with it from upstream) and echo:PIPE (the pipelined bytes).
    read_until(&mut c, &mut got, b"echo:PIPE");
    c.write_all(b"abc").expect("send abc");
    read_until(&mut c, &mut got, b"echo:abc");
    c.shutdown(Shutdown::Write).expect("shutdown");
    let closed = closes_within(&mut c, Duration::from_secs(3));
    (got, closed)
}

#[test]
fn websocket_tunnel_head_and_data_as_nginx() {
    let backend = Backend::start(echo);
    let server = Server::start(&conf(backend.port));
    let (got, closed) = echo_session(server.port);
    let text = normalize(&got, backend.port);
    assert_eq!(
        text,
        "HTTP/1.1 101 Switching Protocols\r\nServer: X\r\nDate: X\r\nConnection: upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\
         X-Foo: bar\r\n\r\nHELLOecho:PIPEecho:abc"
    );
    assert!(closed, "the client's close ends the tunnel");
    let upreq = normalize(&backend.request(), backend.port);
    assert_eq!(
        upreq,
        "GET /ws/chat HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\
         Host: 127.0.0.1:UP\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    );
    // Logged when the tunnel ends: 101, the bytes relayed to the client.
    let log = wait_log(&server.prefix, "logs/access.log", "GET /ws/chat");
    let line = log.lines().last().unwrap_or_default();
    let head_len = got.len() - b"HELLOecho:PIPEecho:abc".len();
    assert!(
        line.starts_with(&format!("101 22 {} ", head_len + 22)),
        "{}",
        line
    );

    if !nginx_installed() {
        return;
    }
    let pn = Prefix::new();
    let nport = free_port();
    let Some(_nginx) = start_nginx(&pn, &conf(backend.port), nport) else {
        return;
    };
    let (ngot, nclosed) = echo_session(nport);
    assert_eq!(normalize(&ngot, backend.port), text, "nginx's bytes");
    assert!(nclosed);
    assert_eq!(normalize(&backend.request(), backend.port), upreq);
    let nlog = wait_log(&pn, "logs/access.log", "GET /ws/chat");
    let nline = nlog.lines().last().unwrap_or_default();
    // Same status and body bytes; $bytes_sent differs by the Server header.
    assert!(nline.starts_with("101 22 "), "{}", nline);
}

#[test]
fn websocket_upstream_close_ends_both_after_its_bytes() {
    // Server-first data in the 101's write, then more, then the close.
    let backend = Backend::start(|mut s, _| {
        let mut first = HEAD_101.to_vec();
        first.extend_from_slice(&[b'x'; 3000]);
        let _ = s.write_all(&first);
        let _ = s.write_all(&[b'y'; 100_000]);
    });
    let server = Server::start(&conf(backend.port));
    let mut c = connect(server.port);
    c.write_all(UPGRADE_REQ).expect("send");
    let got = read_to_close(&mut c);
    let end = find(&got, b"\r\n\r\n").expect("a head") + 4;
    assert_eq!(got.len() - end, 103_000, "every byte before the close");
    let log = wait_log(&server.prefix, "logs/access.log", "GET /ws/chat");
    assert!(
        log.lines()
            .last()
            .unwrap_or_default()
            .starts_with("101 103000 "),
        "{}",
        log
    );
}

#[test]
fn websocket_half_close_from_either_side_closes_both() {
    // The backend half-closes: the client's side closes too, and the
    // backend sees its connection closed (nginx does not half-close).
    let (tx, rx) = mpsc::channel();
    let backend = Backend::start(move |mut s, _| {
        let _ = s.write_all(HEAD_101);
        let _ = s.write_all(b"BYE");
        let _ = s.shutdown(Shutdown::Write);
        let _ = tx.send(closes_within(&mut s, Duration::from_secs(3)));
    });
    let server = Server::start(&conf(backend.port));
    let mut c = connect(server.port);
    c.write_all(UPGRADE_REQ).expect("send");
    let got = read_to_close(&mut c);
    assert!(
        got.ends_with(b"\r\n\r\nBYE"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(true));

    // The client half-closes after a last message: it reaches the
    // backend, then both connections close.
    let (tx, rx) = mpsc::channel();
    let backend = Backend::start(move |mut s, _| {
        let _ = s.write_all(HEAD_101);
        let got = read_to_close(&mut s);
        let _ = tx.send(got);
    });
    let server = Server::start(&conf(backend.port));
    let mut c = connect(server.port);
    c.write_all(UPGRADE_REQ).expect("send");
    let _ = read_n(&mut c, HEAD_101.len());
    c.write_all(b"last").expect("send");
    c.shutdown(Shutdown::Write).expect("shutdown");
    assert!(closes_within(&mut c, Duration::from_secs(3)));
    let up = rx.recv_timeout(Duration::from_secs(5)).expect("backend");
    assert_eq!(up, b"last");
}

#[test]
fn websocket_idle_tunnel_closes_after_proxy_read_timeout() {
    let backend = Backend::start(echo);
    let server = Server::start(&conf(backend.port));
    let mut c = connect(server.port);
    let t0 = Instant::now();
    c.write_all(UPGRADE_REQ).expect("send");
    let mut got = Vec::new();
    read_until(&mut c, &mut got, b"HELLO");
    // Traffic every 0.5 s keeps it open past the 1 s timeout...
    for i in 0..3 {
        thread::sleep(Duration::from_millis(500));
        c.write_all(format!("m{}", i).as_bytes()).expect("send");
        read_until(&mut c, &mut got, format!("echo:m{}", i).as_bytes());
        assert!(
            find(&got, format!("echo:m{}", i).as_bytes()).is_some(),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
    }
    // ...and a second of silence closes it.
    let quiet = Instant::now();
    assert!(closes_within(&mut c, Duration::from_secs(4)));
    let idle = quiet.elapsed();
    assert!(
        idle >= Duration::from_millis(800) && idle < Duration::from_millis(2500),
        "{:?}",
        idle
    );
    let err = server.wait_error_log("while proxying upgraded connection");
    let line = err
        .lines()
        .find(|l| l.contains("while proxying upgraded connection"))
        .unwrap_or_default();
    assert!(
        line.contains("[info] ")
            && line.contains(
                "upstream timed out (110: Connection timed out) while proxying upgraded \
                 connection, client: 127.0.0.1, server: , request: \"GET /ws/chat HTTP/1.1\", \
                 upstream: \"http://127.0.0.1:"
            ),
        "{}",
        err
    );
    let log = wait_log(&server.prefix, "logs/access.log", "GET /ws/chat");
    let line = log.lines().last().unwrap_or_default();
    let secs: f64 = line
        .split(' ')
        .nth(3)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0.0);
    assert!(line.starts_with("101 26 "), "{}", line);
    assert!(
        secs >= 2.0 && secs <= t0.elapsed().as_secs_f64() + 0.01,
        "$request_time spans the tunnel: {}",
        line
    );
}

#[test]
fn websocket_101_without_upgrade_header_is_a_body_until_close() {
    // As nginx: no tunnel (the client's bytes stay for the next request),
    // the head says Connection: upgrade, the body runs to the upstream's
    // close, unframed, and an HTTP/1.1 connection stays open.
    let backend = Backend::start(|mut s, _| {
        let _ = s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\nEARLY");
        thread::sleep(Duration::from_millis(300));
        let _ = s.write_all(b"late");
    });
    let server = Server::start(&conf(backend.port));
    let mut c = connect(server.port);
    c.write_all(b"GET /ws/x HTTP/1.1\r\nHost: ws.test\r\n\r\n")
        .expect("send");
    let mut got = Vec::new();
    read_until(&mut c, &mut got, b"EARLYlate");
    let text = normalize(&got, backend.port);
    assert_eq!(
        text,
        "HTTP/1.1 101 Switching Protocols\r\nServer: X\r\nDate: X\r\nConnection: upgrade\r\n\
         Upgrade: websocket\r\n\r\nEARLYlate"
    );
    assert!(normalize(&backend.request(), backend.port).contains("Connection: close\r\n"));
    c.write_all(b"GET /plain HTTP/1.1\r\nHost: ws.test\r\n\r\n")
        .expect("send");
    let mut next = Vec::new();
    read_until(&mut c, &mut next, b"plain\n");
    assert!(
        next.starts_with(b"HTTP/1.1 200 OK\r\n") && next.ends_with(b"plain\n"),
        "{:?}",
        String::from_utf8_lossy(&next)
    );
}

#[test]
fn websocket_http10_upstream_connection_is_never_reused() {
    // nginx keeps no HTTP/1.0 connection, even one saying keep-alive.
    let backend = Backend::start(|mut s, _| loop {
        let _ = s.write_all(
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nok\n",
        );
        if read_head(&mut s).is_empty() {
            return;
        }
    });
    let server = Server::start(&conf(backend.port));
    for _ in 0..3 {
        let r = server.get("/ka/");
        assert_eq!(r.status, 200);
        assert_eq!(r.body_str(), "ok\n");
    }
    for _ in 0..3 {
        backend.request();
    }
    assert!(
        backend.conns.try_recv().is_err(),
        "one connection per request"
    );
}
