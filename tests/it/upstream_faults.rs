//! Upstream faults at the socket level, nginx and tern side by side: a
//! proxied server that resets the connection (before answering, in the
//! middle of the head, in the middle of a body, plain or chunked), closes
//! it cleanly in the middle of a body, half-closes it without answering,
//! stalls past `proxy_read_timeout` before or inside the answer, or sends
//! binary garbage. Each case is asked for buffered and unbuffered; the
//! answers (normalised as in `proxy_upstream_answers`) and the error-log
//! lines each request caused must be nginx's.
//!
//! The origin waits a moment between the head, the body and the fault,
//! so that both servers read them apart (a reset can discard data the
//! receiver has not read yet, and nginx's log line names the step it was
//! in: a body that comes in the same read as the head and then a close
//! is logged "while sending to client" when unbuffered).
//!
//! Two differences are expected and checked as such: a buffered body cut
//! by the fault reaches the client as far as tern had it, where nginx
//! may hold back less than `postpone_output` (1460 bytes) and send none
//! of it (either way the client gets the head and fewer bytes than its
//! Content-Length or no last chunk, then the close; the heads are
//! compared and tern's bytes checked to be what the origin sent); and
//! binary garbage instead of a
//! head, which nginx passes on as an HTTP/0.9 answer and tern refuses
//! with 502 (DIFFERENCES.md).
//!
//! Skipped (with a message) when nginx is not installed.

use std::io::Write;
use std::net::Shutdown;
use std::time::Duration;

use crate::differential::exchange;
use crate::harness::*;
use crate::origin::{Conn, Origin};
use crate::proxy_upstream_answers::{log_lines, normalize};

const CASES: &[&str] = &[
    "rst_at_once",
    "rst_mid_header",
    "rst_mid_body",
    "rst_mid_chunk",
    "fin_mid_body",
    "fin_mid_chunk",
    "half_close",
    "stall_header",
    "stall_mid_header",
    "stall_body",
];

/// Buffered, nginx sends the head only; tern also the bytes it had.
const CUT_BUFFERED: &[&str] = &["rst_mid_body", "stall_body", "rst_mid_chunk"];

fn reset(c: Conn) {
    let _ = socket2::SockRef::from(&c.stream).set_linger(Some(Duration::ZERO));
    drop(c);
}

fn pause() {
    std::thread::sleep(Duration::from_millis(300));
}

fn act(mut c: Conn) {
    let Some(req) = c.next(false) else { return };
    let head = String::from_utf8_lossy(&req).into_owned();
    let name = head
        .split(' ')
        .nth(1)
        .and_then(|p| p.rsplit('/').next())
        .unwrap_or("")
        .to_string();
    let mut w = |b: &[u8]| {
        let _ = c.stream.write_all(b);
    };
    let body_head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n";
    let chunk_head =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n";
    match name.as_str() {
        "rst_at_once" => reset(c),
        "rst_mid_header" => {
            w(b"HTTP/1.1 200 OK\r\nX-A: 1\r\n");
            pause();
            reset(c);
        }
        "rst_mid_body" => {
            w(body_head);
            pause();
            w(b"0123456789");
            pause();
            reset(c);
        }
        "rst_mid_chunk" => {
            w(chunk_head);
            pause();
            w(b"5\r\nhello\r\na\r\n01234");
            pause();
            reset(c);
        }
        "fin_mid_body" => {
            w(body_head);
            pause();
            w(b"0123456789");
            pause();
        }
        "fin_mid_chunk" => {
            w(chunk_head);
            pause();
            w(b"5\r\nhello\r\n");
            pause();
        }
        "half_close" => {
            let _ = c.stream.shutdown(Shutdown::Write);
            std::thread::sleep(Duration::from_secs(3));
        }
        "stall_header" => std::thread::sleep(Duration::from_secs(3)),
        "stall_mid_header" => {
            w(b"HTTP/1.1 200 OK\r\n");
            std::thread::sleep(Duration::from_secs(3));
        }
        "stall_body" => {
            w(body_head);
            pause();
            w(b"0123456789");
            std::thread::sleep(Duration::from_secs(3));
        }
        "garbage_binary" => {
            let g: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
            w(&g);
        }
        _ => w(b"HTTP/1.1 404 X\r\nContent-Length: 0\r\n\r\n"),
    }
}

fn conf(origin: u16) -> String {
    format!(
        r#"
worker_processes 1;
error_log logs/error.log warn;
events {{}}
http {{
    access_log off;
    proxy_read_timeout 1s;
    proxy_next_upstream off;
    server {{
        listen 127.0.0.1:@PORT@;
        server_name up.test;
        location /c/ {{ proxy_pass http://127.0.0.1:{o}; }}
        location /nb/ {{ proxy_buffering off; proxy_pass http://127.0.0.1:{o}/c/; }}
    }}
}}
"#,
        o = origin
    )
}

#[test]
fn upstream_faults_answered_and_logged_as_nginx() {
    if !nginx_installed() {
        return;
    }
    let o = Origin::serve(act);
    let pn = Prefix::new();
    let nport = free_port();
    let Some(nginx) = start_nginx(&pn, &conf(o.port), nport) else {
        return;
    };
    let tern = Server::start(&conf(o.port));
    let mut diffs = Vec::new();
    let mut asked = 0;
    for name in CASES {
        for loc in ["c", "nb"] {
            let req = format!(
                "GET /{}/{} HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n",
                loc, name
            );
            let mut a = normalize(&exchange(nport, req.as_bytes()), nport);
            let mut b = normalize(&exchange(tern.port, req.as_bytes()), tern.port);
            asked += 1;
            if loc == "c" && CUT_BUFFERED.contains(name) {
                // nginx: the head alone. tern: the head and a prefix of
                // what the origin sent, short of the Content-Length.
                let head_end = b.find("\r\n\r\n").map_or(b.len(), |i| i + 4);
                let cut = b.split_off(head_end);
                // (nginx sends what it has of a chunked one, or not,
                // depending on how the reads fell: its heads only.)
                let nginx_end = a.find("\r\n\r\n").map_or(a.len(), |i| i + 4);
                a.truncate(nginx_end);
                // What the origin sent is short of the Content-Length or
                // of the last chunk: the client can tell it was cut.
                let (got, sent) = if *name == "rst_mid_chunk" {
                    // Relayed chunked, in chunks of tern's own: no last
                    // chunk, and the data a prefix of what was sent.
                    let mut data = String::new();
                    let mut rest = cut.as_str();
                    while let Some((size, after)) = rest.split_once("\r\n") {
                        let n = usize::from_str_radix(size, 16).unwrap_or(0);
                        assert!(n > 0, "{}: a last chunk in {:?}", name, cut);
                        data.push_str(&after[..n.min(after.len())]);
                        rest = after.get(n + 2..).unwrap_or("");
                    }
                    (data, "hello01234")
                } else {
                    (cut.clone(), "0123456789")
                };
                assert!(sent.starts_with(&got), "{}: tern sent {:?}", name, cut);
            }
            if a != b {
                diffs.push(format!(
                    "=== {:?}\n--- nginx\n{:?}\n--- tern\n{:?}\n",
                    req.lines().next().unwrap_or(""),
                    a,
                    b
                ));
            }
        }
    }
    // Binary garbage for a head: nginx passes it raw (HTTP/0.9), tern
    // answers 502 with nginx's words for an answer it does not take.
    for loc in ["c", "nb"] {
        let req = format!(
            "GET /{}/garbage_binary HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n",
            loc
        );
        let a = exchange(nport, req.as_bytes());
        assert!(
            a.starts_with(b"\0\x01\x02"),
            "nginx no longer passes garbage raw"
        );
        let b = exchange(tern.port, req.as_bytes());
        assert_eq!(Resp::parse(&b).map(|r| r.status), Some(502));
        tern.wait_error_log(&format!(
            "upstream sent no valid HTTP/1.0 header while reading response header from upstream, client: 127.0.0.1, server: up.test, request: \"GET /{}/garbage_binary HTTP/1.1\"",
            loc
        ));
    }
    // tern's log lines are written by a writer thread: give it a moment.
    std::thread::sleep(Duration::from_millis(300));
    let (mut ln, mut lt) = (log_lines(&pn), log_lines(&tern.prefix));
    // Compared above: nginx logs nothing for those (an HTTP/0.9 answer).
    lt.retain(|r, _| !r.contains("garbage_binary"));
    ln.retain(|r, _| !r.contains("garbage_binary"));
    for (req, lines) in &ln {
        let theirs = lt.get(req).cloned().unwrap_or_default();
        if *lines != theirs {
            diffs.push(format!(
                "=== log of {:?}\n--- nginx\n{}\n--- tern\n{}\n",
                req,
                lines.join("\n"),
                theirs.join("\n")
            ));
        }
    }
    for (req, lines) in lt.iter().filter(|(r, _)| !ln.contains_key(*r)) {
        diffs.push(format!(
            "=== log of {:?}\n--- nginx\n\n--- tern\n{}\n",
            req,
            lines.join("\n")
        ));
    }
    drop(nginx);
    assert!(
        diffs.is_empty(),
        "{} differences from nginx in {} answers and their log lines:\n{}",
        diffs.len(),
        asked,
        diffs.concat()
    );
}

/// A listener whose accept queue is full: the kernel drops further SYNs,
/// so a connect to it hangs until the connecting side gives up. The
/// connections that filled the queue are kept in the returned vector.
fn full_listener() -> (u16, socket2::Socket, Vec<std::net::TcpStream>) {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let addr: std::net::SocketAddr = "127.0.0.1:0".parse().expect("addr");
    s.bind(&addr.into()).expect("bind");
    s.listen(0).expect("listen");
    let port = s
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.port())
        .expect("port");
    let mut fillers = Vec::new();
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    while let Ok(c) = std::net::TcpStream::connect_timeout(&to, Duration::from_millis(300)) {
        fillers.push(c);
        assert!(fillers.len() < 64, "the accept queue never filled");
    }
    (port, s, fillers)
}

/// A listener that accepts and never reads: its receive buffer is small,
/// so a large request body fills it and the sender stalls.
fn deaf_listener() -> u16 {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let addr: std::net::SocketAddr = "127.0.0.1:0".parse().expect("addr");
    s.set_recv_buffer_size(4096).expect("rcvbuf");
    s.bind(&addr.into()).expect("bind");
    s.listen(16).expect("listen");
    let port = s
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.port())
        .expect("port");
    let l: std::net::TcpListener = s.into();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(4));
                drop(c);
            });
        }
    });
    port
}

/// `proxy_connect_timeout` and `proxy_send_timeout` expiring: 504 and
/// nginx's error-log lines, from both servers on the same configuration.
#[test]
fn upstream_connect_and_send_timeouts_as_nginx() {
    if !nginx_installed() {
        return;
    }
    let (full, _listener, _fillers) = full_listener();
    let deaf = deaf_listener();
    let conf = format!(
        r#"
worker_processes 1;
error_log logs/error.log warn;
events {{}}
http {{
    access_log off;
    proxy_next_upstream off;
    client_max_body_size 0;
    client_body_buffer_size 32m;
    server {{
        listen 127.0.0.1:@PORT@;
        server_name up.test;
        location /ct/ {{ proxy_connect_timeout 500ms; proxy_pass http://127.0.0.1:{full}; }}
        location /st/ {{ proxy_send_timeout 500ms; proxy_pass http://127.0.0.1:{deaf}; }}
    }}
}}
"#
    );
    let pn = Prefix::new();
    let nport = free_port();
    let Some(nginx) = start_nginx(&pn, &conf, nport) else {
        return;
    };
    let tern = Server::start(&conf);
    let body = vec![b'x'; 16 << 20];
    let mut post = format!(
        "POST /st/x HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    post.extend_from_slice(&body);
    let get = b"GET /ct/x HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n";
    let mut diffs = Vec::new();
    for req in [&get[..], &post[..]] {
        let a = normalize(&exchange(nport, req), nport);
        let b = normalize(&exchange(tern.port, req), tern.port);
        assert!(a.starts_with("HTTP/1.1 504 "), "nginx answered {:?}", a);
        if a != b {
            diffs.push(format!("--- nginx\n{:?}\n--- tern\n{:?}\n", a, b));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let strip = |p: &Prefix, port: u16| -> Vec<String> {
        let mut v: Vec<String> = log_lines(p)
            .into_values()
            .flatten()
            .map(|l| l.replace(&format!(":{}", port), ":PORT"))
            .collect();
        v.sort();
        v
    };
    let (ln, lt) = (strip(&pn, nport), strip(&tern.prefix, tern.port));
    assert!(
        ln.iter()
            .any(|l| l.contains("while connecting to upstream"))
            && ln
                .iter()
                .any(|l| l.contains("while sending request to upstream")),
        "nginx logged {:?}",
        ln
    );
    if ln != lt {
        diffs.push(format!(
            "--- nginx log\n{}\n--- tern log\n{}\n",
            ln.join("\n"),
            lt.join("\n")
        ));
    }
    drop(nginx);
    assert!(
        diffs.is_empty(),
        "differences from nginx:\n{}",
        diffs.concat()
    );
}
