//! Request bodies through proxy_pass: read whole (memory, then a temp
//! file), forwarded with Content-Length, limits and timeouts, keep-alive
//! after a body, retries. Upstream heads and client-side bytes were
//! checked against nginx 1.22.1 on the same configurations.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use crate::harness::*;
use crate::origin::Origin;

/// A loopback origin that reads each request whole (head, then a
/// Content-Length body) and answers with the body echoed back; or, as a
/// `closer`, reads the head and closes without an answer. Records every
/// request exactly as received.
struct Echo {
    port: u16,
    origin: Origin,
}

impl Echo {
    fn start(closer: bool) -> Echo {
        let origin = Origin::serve(move |mut c| {
            let _ = c.stream.set_read_timeout(Some(Duration::from_secs(5)));
            let Some(mut req) = c.next(!closer) else {
                return;
            };
            if closer {
                return;
            }
            req.extend_from_slice(&c.leftover());
            let end = find(&req, b"\r\n\r\n").map_or(req.len(), |p| p + 4);
            let body = req[end..].to_vec();
            c.record(&req);
            let mut out = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            out.extend_from_slice(&body);
            let _ = c.stream.write_all(&out);
        });
        Echo {
            port: origin.port,
            origin,
        }
    }

    fn requests(&self) -> Vec<Vec<u8>> {
        self.origin.raw_requests()
    }

    fn count(&self) -> usize {
        self.origin.count()
    }
}

/// A body that is not the same byte repeated.
fn pattern(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| b'a' + ((i * 7 + i / 1000) % 26) as u8)
        .collect()
}

/// Files (not directories) anywhere under `dir`.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// Chunked framing of `body` in pieces of `n` (with an extension on the
/// first size line and a trailer, both dropped on the way).
fn chunked(body: &[u8], n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, c) in body.chunks(n).enumerate() {
        if i == 0 {
            out.extend_from_slice(format!("{:x};x=y\r\n", c.len()).as_bytes());
        } else {
            out.extend_from_slice(format!("{:X}\r\n", c.len()).as_bytes());
        }
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\nX-Trailer: t\r\n\r\n");
    out
}

fn split_req(r: &[u8]) -> (String, Vec<u8>) {
    let end = find(r, b"\r\n\r\n").map_or(r.len(), |p| p + 4);
    (
        String::from_utf8_lossy(&r[..end]).into_owned(),
        r[end..].to_vec(),
    )
}

#[test]
fn content_length_and_chunked_bodies_reach_the_upstream_exactly() {
    let o = Echo::start(false);
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_pass http://127.0.0.1:{}; }} }} }}",
        o.port
    );
    let s = Server::start(&conf);
    let r = s.raw(
        b"POST /form?a=1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 11\r\nConnection: close\r\n\r\nname=tern&x",
    );
    let r = Resp::parse(&r).expect("response");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"name=tern&x"[..]));
    // As nginx: Host, Connection, Content-Length, then the client's
    // headers without its own Content-Length.
    assert_eq!(
        String::from_utf8_lossy(&o.requests()[0]),
        format!(
            "POST /form?a=1 HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Length: 11\r\nContent-Type: application/x-www-form-urlencoded\r\n\r\nname=tern&x",
            o.port
        )
    );
    // Chunked from the client: sent upstream with its decoded length and
    // no Transfer-Encoding (proxy_request_buffering on).
    let mut req =
        b"PUT /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    req.extend_from_slice(&chunked(b"hello, chunked world", 6));
    let r = Resp::parse(&s.raw(&req)).expect("response");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (200, &b"hello, chunked world"[..])
    );
    assert_eq!(
        String::from_utf8_lossy(&o.requests()[1]),
        format!(
            "PUT /up HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Length: 20\r\n\r\nhello, chunked world",
            o.port
        )
    );
    // An empty body is announced as such.
    let r = s.raw(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    assert_eq!(Resp::parse(&r).expect("response").status, 200);
    let (head, body) = split_req(&o.requests()[2]);
    assert!(head.contains("\r\nContent-Length: 0\r\n"), "{}", head);
    assert!(body.is_empty());
}

#[test]
fn large_bodies_go_through_a_temp_file_that_leaves_nothing_behind() {
    let o = Echo::start(false);
    let conf = format!(
        "error_log logs/error.log warn;
        http {{ client_body_buffer_size 1k; client_max_body_size 0;
          server {{ listen 127.0.0.1:@PORT@;
            client_body_temp_path cbt 1 2;
            location / {{ proxy_pass http://127.0.0.1:{};
                proxy_set_header X-File $request_body_file;
                proxy_set_header X-Body $request_body; }} }} }}",
        o.port
    );
    let s = Server::start(&conf);
    // 3 MiB: over the default client_max_body_size, allowed by 0.
    let big = pattern(3 << 20);
    let mut c = s.connect();
    c.write_all(
        format!(
            "POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            big.len()
        )
        .as_bytes(),
    )
    .expect("write head");
    for part in big.chunks(100_000) {
        c.write_all(part).expect("write body");
    }
    let r = read_response(&mut c).expect("response");
    assert_eq!(r.status, 200);
    assert!(
        r.body == big,
        "echoed body differs ({} bytes)",
        r.body.len()
    );
    let (head, body) = split_req(&o.requests()[0]);
    assert!(body == big, "upstream body differs ({} bytes)", body.len());
    assert!(
        head.contains(&format!("\r\nContent-Length: {}\r\n", big.len())),
        "{}",
        head
    );
    // $request_body is empty for a body in a file; $request_body_file
    // names it under the levels (already unlinked, as nginx does).
    assert!(!head.contains("X-Body"), "{}", head);
    let file_line = head
        .lines()
        .find_map(|l| l.strip_prefix("X-File: "))
        .expect("X-File sent");
    let cbt = s.prefix.path("cbt");
    let name = file_line
        .strip_prefix(&format!("{}/", cbt.display()))
        .expect("file under client_body_temp_path");
    let parts: Vec<&str> = name.split('/').collect();
    assert_eq!(parts.len(), 3, "levels 1 2: {}", name);
    assert_eq!((parts[0].len(), parts[1].len(), parts[2].len()), (1, 2, 10));
    assert!(parts[2].ends_with(&format!("{}{}", parts[1], parts[0])));
    s.wait_error_log("a client request body is buffered to a temporary file");
    // The same connection goes on: a chunked body, also through a file.
    let mut req =
        b"POST /big2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    let body2 = pattern(200_000);
    req.extend_from_slice(&chunked(&body2, 7000));
    c.write_all(&req).expect("write");
    let r = Resp::parse(&read_to_close(&mut c)).expect("response");
    assert_eq!(r.status, 200);
    assert!(r.body == body2);
    assert!(split_req(&o.requests()[1]).1 == body2);
    assert_eq!(files_under(&cbt), Vec::<std::path::PathBuf>::new());
    // A small body stays in memory: $request_body has it, no file name.
    let r =
        s.raw(b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc");
    assert_eq!(Resp::parse(&r).expect("response").status, 200);
    let (head, _) = split_req(&o.requests()[2]);
    assert!(head.contains("\r\nX-Body: abc\r\n"), "{}", head);
    assert!(!head.contains("X-File"), "{}", head);
}

#[test]
fn too_large_bodies_get_413_by_length_and_mid_chunked() {
    let o = Echo::start(false);
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;
            location / {{ client_max_body_size 10; proxy_pass http://127.0.0.1:{}; }}
            location = /f.txt {{ }} }} }}",
        o.port
    );
    let s = Server::start(&conf);
    s.prefix.write("html/f.txt", "file\n");
    let r = s.raw(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world");
    let r = Resp::parse(&r).expect("response");
    assert_eq!(r.status, 413);
    assert_eq!(r.header("Connection"), Some("close"));
    // Chunked: refused when the chunk that passes the limit is announced;
    // the connection closes even though a request follows.
    let mut req = b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    req.extend_from_slice(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
    req.extend_from_slice(b"GET /f.txt HTTP/1.1\r\nHost: x\r\n\r\n");
    let out = s.raw(&req);
    let (r, used) = Resp::parse_complete(&out).expect("response");
    assert_eq!(r.status, 413);
    assert_eq!(r.header("Connection"), Some("close"));
    assert_eq!(used, out.len(), "nothing after the 413");
    s.wait_error_log("client intended to send too large chunked body: ");
    // At the limit exactly: accepted.
    let mut req =
        b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    req.extend_from_slice(b"5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n");
    let r = Resp::parse(&s.raw(&req)).expect("response");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"helloworld"[..]));
    assert_eq!(o.count(), 1);
}

#[test]
fn expect_100_continue_is_answered_when_the_body_is_read() {
    let o = Echo::start(false);
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_pass http://127.0.0.1:{}; }}
            location /small {{ client_max_body_size 4; proxy_pass http://127.0.0.1:{}; }} }} }}",
        o.port, o.port
    );
    let s = Server::start(&conf);
    let mut c = s.connect();
    c.write_all(
        b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    )
    .expect("write");
    let mut got = Vec::new();
    let mut b = [0u8; 256];
    while got.len() < 25 {
        match c.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
        }
    }
    assert_eq!(got, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.write_all(b"hello").expect("write body");
    let r = Resp::parse(&read_to_close(&mut c)).expect("response");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
    // Refused by its length: no 100 Continue, the 413 at once.
    let out = s.raw(
        b"POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    );
    assert!(
        out.starts_with(b"HTTP/1.1 413 "),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert!(find(&out, b"100 Continue").is_none());
    assert_eq!(o.count(), 1);
}

#[test]
fn a_client_vanishing_mid_body_frees_everything() {
    let o = Echo::start(false);
    let conf = format!(
        "error_log logs/error.log info;
        http {{ client_body_buffer_size 1k;
          server {{ listen 127.0.0.1:@PORT@;
            client_body_temp_path cbt;
            location = /status {{ stub_status; }}
            location /t {{ client_body_timeout 1s; proxy_pass http://127.0.0.1:{}; }}
            location / {{ proxy_pass http://127.0.0.1:{}; }} }} }}",
        o.port, o.port
    );
    let s = Server::start(&conf);
    for i in 1..=3 {
        let mut c = s.connect();
        c.write_all(b"POST /v HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
            .expect("write");
        c.write_all(&pattern(50_000)).expect("write part");
        // Wait until tern has the file open (this connection's warning is
        // logged: the i-th one), then go.
        s.wait_error_log_n("a client request body is buffered to a temporary file", i);
        drop(c);
    }
    eventually(5, "connections released", || {
        s.get("/status")
            .body_str()
            .starts_with("Active connections: 1 \n")
    });
    assert_eq!(
        files_under(&s.prefix.path("cbt")),
        Vec::<std::path::PathBuf>::new()
    );
    assert_eq!(o.count(), 0, "nothing went upstream");
    eventually(5, "logged", || {
        s.prefix
            .read("logs/access.log")
            .matches("\"POST /v HTTP/1.1\" 400 0 ")
            .count()
            == 3
    });
    // client_body_timeout: nothing is sent, the connection closes, 408 logged.
    let mut c = s.connect();
    c.write_all(b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
        .expect("write");
    assert_eq!(read_to_close(&mut c), b"");
    eventually(5, "408 logged", || {
        s.prefix
            .read("logs/access.log")
            .contains("\"POST /t HTTP/1.1\" 408 0 ")
    });
    s.wait_error_log("client prematurely closed connection");
}

#[test]
fn keep_alive_goes_on_after_bodies_and_static_locations_discard_them() {
    let o = Echo::start(false);
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;
            location /p/ {{ proxy_pass http://127.0.0.1:{}; }} }} }}",
        o.port
    );
    let s = Server::start(&conf);
    s.prefix.write("html/f.txt", "static\n");
    let mut c = s.connect();
    c.write_all(b"POST /p/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none")
        .expect("write");
    let r = read_response(&mut c).expect("first");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"one"[..]));
    // Pipelined: a chunked POST, a GET of a file with a body (discarded),
    // a chunked body on the file, then a last proxied POST.
    let mut req = b"POST /p/2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    req.extend_from_slice(&chunked(b"two!", 2));
    req.extend_from_slice(b"GET /f.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    req.extend_from_slice(b"GET /f.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    req.extend_from_slice(&chunked(b"ignored", 3));
    req.extend_from_slice(
        b"POST /p/3 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nthree",
    );
    c.write_all(&req).expect("write");
    let all = read_to_close(&mut c);
    let mut rest = &all[..];
    let mut got = Vec::new();
    while let Some((r, used)) = Resp::parse_complete(rest) {
        got.push((r.status, r.body));
        rest = &rest[used..];
    }
    assert_eq!(
        got,
        vec![
            (200, b"two!".to_vec()),
            (200, b"static\n".to_vec()),
            (200, b"static\n".to_vec()),
            (200, b"three".to_vec()),
        ]
    );
    let bodies: Vec<Vec<u8>> = o.requests().iter().map(|r| split_req(r).1).collect();
    assert_eq!(
        bodies,
        vec![b"one".to_vec(), b"two!".to_vec(), b"three".to_vec()]
    );
}

#[test]
fn set_body_pass_request_body_and_body_variables() {
    let o = Echo::start(false);
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;
            location /set {{ proxy_set_body \"a=$arg_x\"; proxy_pass http://127.0.0.1:{p}; }}
            location /off {{ proxy_pass_request_body off; proxy_set_header Content-Length \"\";
                proxy_set_header X-Len $content_length; proxy_pass http://127.0.0.1:{p}; }}
            location /vars {{ proxy_set_header X-Len $content_length;
                proxy_set_header X-Body $request_body; proxy_pass http://127.0.0.1:{p}; }}
            location /nb {{ proxy_request_buffering off; proxy_pass http://127.0.0.1:{p}; }} }} }}",
        p = o.port
    );
    let s = Server::start(&conf);
    let r = s.raw(
        b"POST /set?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert_eq!(Resp::parse(&r).expect("response").body, b"a=1");
    let (head, body) = split_req(&o.requests()[0]);
    assert!(head.contains("\r\nContent-Length: 3\r\n\r\n"), "{}", head);
    assert_eq!(body, b"a=1");
    // Read (and dropped), not sent: the nginx pattern for auth subrequests.
    let r = s.raw(
        b"POST /off HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert_eq!(Resp::parse(&r).expect("response").status, 200);
    let (head, body) = split_req(&o.requests()[1]);
    assert!(!head.contains("Content-Length"), "{}", head);
    assert!(head.contains("\r\nX-Len: 5\r\n"), "{}", head);
    assert!(body.is_empty());
    // $content_length of a chunked body once read; $request_body.
    let mut req = b"POST /vars HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    req.extend_from_slice(&chunked(b"k=v&w=z", 3));
    let r = s.raw(&req);
    assert_eq!(Resp::parse(&r).expect("response").body, b"k=v&w=z");
    let (head, _) = split_req(&o.requests()[2]);
    assert!(head.contains("\r\nX-Len: 7\r\n"), "{}", head);
    assert!(head.contains("\r\nX-Body: k=v&w=z\r\n"), "{}", head);
    // proxy_request_buffering off is accepted (and buffers, see DIFFERENCES.md).
    let r =
        s.raw(b"PUT /nb HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    assert_eq!(Resp::parse(&r).expect("response").body, b"ok");
}

#[test]
fn retries_resend_the_buffered_body_but_not_a_sent_post() {
    let closer = Echo::start(true);
    let o = Echo::start(false);
    let conf = format!(
        "http {{ client_body_buffer_size 1k;
          upstream two {{ server 127.0.0.1:{} max_fails=0; server 127.0.0.1:{} max_fails=0; }}
          server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_pass http://two; }} }} }}",
        closer.port, o.port
    );
    let s = Server::start(&conf);
    let small = b"put body".to_vec();
    let big = pattern(50_000);
    // Round robin alternates: one of each pair meets the closer first and
    // is retried on the echo with the same body (memory, then file).
    for body in [&small, &small, &big, &big] {
        let mut req = format!(
            "PUT /p HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        let r = Resp::parse(&s.raw(&req)).expect("response");
        assert_eq!(r.status, 200);
        assert!(&r.body == body);
    }
    let bodies: Vec<Vec<u8>> = o.requests().iter().map(|r| split_req(r).1).collect();
    assert_eq!(bodies, vec![small.clone(), small, big.clone(), big]);
    // A POST once sent is not passed to the next server: one 502.
    let before = o.count();
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let r = s.raw(
            b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\npost",
        );
        statuses.push(Resp::parse(&r).expect("response").status);
    }
    statuses.sort();
    assert_eq!(statuses, vec![200, 502]);
    assert_eq!(o.count(), before + 1);
}

#[test]
fn the_cache_stores_get_but_not_post() {
    let o = Echo::start(false);
    let conf = format!(
        "http {{ proxy_cache_path cache keys_zone=z:1m;
          server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_cache z; proxy_cache_valid 200 1m;
                add_header X-Cache $upstream_cache_status;
                proxy_pass http://127.0.0.1:{}; }} }} }}",
        o.port
    );
    let s = Server::start(&conf);
    for i in 0..2 {
        let r = s.raw(
            b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody",
        );
        let r = Resp::parse(&r).expect("response");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"body"[..]));
        assert_eq!(r.header("X-Cache"), None, "POST {}", i);
    }
    assert_eq!(o.count(), 2);
    let a = s.get("/c");
    let b = s.get("/c");
    assert_eq!(
        (a.header("X-Cache"), b.header("X-Cache")),
        (Some("MISS"), Some("HIT"))
    );
    assert_eq!(o.count(), 3);
}

#[test]
fn daemonized_server_creates_the_body_temp_directory() {
    // The directory is made by the cache keeper thread (the workers may
    // run as `nobody`); it must exist in the daemon, not only before the
    // fork, or the request would wait forever.
    let o = Echo::start(false);
    let p = Prefix::new();
    let port = free_port();
    let conf = p.write(
        "conf/nginx.conf",
        conf_text(
            &format!(
                "pid logs/nginx.pid;
                http {{ client_body_buffer_size 1k;
                  server {{ listen 127.0.0.1:{};
                    location / {{ proxy_pass http://127.0.0.1:{}; }} }} }}",
                port, o.port
            ),
            port,
        ),
    );
    let conf = conf.to_string_lossy().into_owned();
    let out = p.run(&["-c", &conf]);
    assert!(out.status.success(), "{:?}", out);
    eventually(10, "daemon listening", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let body = pattern(20_000);
    let mut req = format!(
        "POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let got = raw(port, &req);
    let stop = p.run(&["-c", &conf, "-s", "stop"]);
    let r = Resp::parse(&got).expect("a response");
    assert_eq!(r.status, 200);
    assert!(r.body == body);
    assert!(stop.status.success(), "{:?}", stop);
    eventually(10, "daemon stopped", || {
        TcpStream::connect(("127.0.0.1", port)).is_err()
    });
}

#[test]
fn file_only_bodies_and_pool_writes() {
    let o = Echo::start(false);
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@; client_body_temp_path cbt;
            proxy_set_header X-File $request_body_file;
            location /on {{ client_body_in_file_only on; proxy_pass http://127.0.0.1:{p}; }}
            location /clean {{ client_body_in_file_only clean; proxy_pass http://127.0.0.1:{p}; }}
            location /aio {{ aio threads; aio_write on; client_body_buffer_size 1k;
                proxy_pass http://127.0.0.1:{p}; }} }} }}",
        p = o.port
    );
    let s = Server::start(&conf);
    let file_of = |i: usize| {
        let (head, _) = split_req(&o.requests()[i]);
        head.lines()
            .find_map(|l| l.strip_prefix("X-File: ").map(str::to_string))
            .expect("X-File")
    };
    // `on`: even a small body goes to a file, which stays after the request.
    let r = s.raw(
        b"POST /on HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert_eq!(Resp::parse(&r).expect("response").body, b"hello");
    assert_eq!(std::fs::read(file_of(0)).expect("kept file"), b"hello");
    // `clean`: removed once the request is over.
    let r = s.raw(
        b"POST /clean HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nworld",
    );
    assert_eq!(Resp::parse(&r).expect("response").body, b"world");
    let clean = file_of(1);
    eventually(5, "clean file removed", || !Path::new(&clean).exists());
    // Temp-file writes and reads in the thread pool.
    let big = pattern(300_000);
    let mut req = format!(
        "POST /aio HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        big.len()
    )
    .into_bytes();
    req.extend_from_slice(&big);
    let r = Resp::parse(&s.raw(&req)).expect("response");
    assert_eq!(r.status, 200);
    assert!(r.body == big);
    assert!(split_req(&o.requests()[2]).1 == big);
}

#[test]
fn error_page_to_a_proxied_location_passes_the_body_on() {
    let o = Echo::start(false);
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;
            location /named/ {{ error_page 404 = @app; }}
            location /uri/ {{ error_page 404 = /app/x; }}
            location /app/ {{ proxy_pass http://127.0.0.1:{p}; }}
            location @app {{ proxy_pass http://127.0.0.1:{p}; }} }} }}",
        p = o.port
    );
    let s = Server::start(&conf);
    // As nginx: a named location keeps the method, a URI becomes a GET;
    // the body goes on in both cases.
    let r = s.raw(
        b"POST /named/f HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    );
    assert_eq!(Resp::parse(&r).expect("response").body, b"hello");
    let (head, _) = split_req(&o.requests()[0]);
    assert!(head.starts_with("POST /named/f HTTP/1.0\r\n"), "{}", head);
    let r = s.raw(
        b"POST /uri/f HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nworld",
    );
    assert_eq!(Resp::parse(&r).expect("response").body, b"world");
    let (head, _) = split_req(&o.requests()[1]);
    assert!(head.starts_with("GET /app/x HTTP/1.0\r\n"), "{}", head);
    assert!(head.contains("\r\nContent-Length: 5\r\n"), "{}", head);
}

#[test]
fn a_timeout_on_a_reused_upstream_connection_is_not_sent_again() {
    // An origin that keeps connections alive, answers the first request
    // on each and never the second: a request on a reused connection
    // times out, and (as nginx) is not repeated on a new connection.
    let o = Origin::serve(|mut c| {
        let _ = c.stream.set_read_timeout(Some(Duration::from_secs(5)));
        for n in 0.. {
            let Some(req) = c.next(true) else { return };
            c.record(&req);
            if n > 0 {
                std::thread::sleep(Duration::from_secs(3));
                return;
            }
            let _ = c
                .stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    let port = o.port;
    let conf = format!(
        "http {{ upstream ka {{ server 127.0.0.1:{}; keepalive 4; }}
          server {{ listen 127.0.0.1:@PORT@;
            location / {{ proxy_http_version 1.1; proxy_set_header Connection \"\";
                proxy_read_timeout 300ms; proxy_pass http://ka; }} }} }}",
        port
    );
    let s = Server::start(&conf);
    for m in ["POST", "PUT"] {
        assert_eq!(s.get("/warm").status, 200);
        let req = format!(
            "{} /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            m
        );
        let r = Resp::parse(&s.raw(req.as_bytes())).expect("response");
        assert_eq!(r.status, 504, "{}", m);
        let sent = o
            .requests()
            .iter()
            .filter(|l| l.starts_with(&format!("{} /x ", m)))
            .count();
        assert_eq!(sent, 1, "{} sent {} times", m, sent);
    }
}

#[test]
fn body_directives_are_checked_as_nginx() {
    // Messages as nginx 1.22.1 -t prints them.
    let cases = [
        ("client_body_temp_path ct 0;", "\"client_body_temp_path\" directive invalid value"),
        ("client_body_temp_path ct 5 6;", "\"client_body_temp_path\" directive invalid value"),
        ("client_body_temp_path ct 1 2 2 1;", "invalid number of arguments in \"client_body_temp_path\" directive"),
        ("client_body_in_file_only maybe;", "invalid value \"maybe\""),
        ("client_body_in_single_buffer x;", "invalid value \"x\" in \"client_body_in_single_buffer\" directive, it must be \"on\" or \"off\""),
        ("proxy_request_buffering x;", "invalid value \"x\" in \"proxy_request_buffering\" directive, it must be \"on\" or \"off\""),
        ("proxy_pass_request_body x;", "invalid value \"x\" in \"proxy_pass_request_body\" directive, it must be \"on\" or \"off\""),
        ("proxy_set_body;", "invalid number of arguments in \"proxy_set_body\" directive"),
        ("proxy_set_body a; proxy_set_body b;", "\"proxy_set_body\" directive is duplicate"),
    ];
    for (d, want) in cases {
        let p = Prefix::new();
        let f = p.write(
            "conf/nginx.conf",
            format!("events {{}}\nhttp {{ {} }}\n", d),
        );
        let o = p.run(&["-c", f.to_str().unwrap(), "-t"]);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(1), "{}: {}", d, err);
        assert!(
            err.contains(&format!("[emerg] {} in {}:2\n", want, f.display())),
            "{}: {}",
            d,
            err
        );
    }
    // Accepted: levels up to ten characters, all the modes.
    let p = Prefix::new();
    let f = p.write(
        "conf/nginx.conf",
        "events {}\nhttp { client_body_temp_path ct 5 5; client_body_in_file_only clean;
          client_body_in_single_buffer on; proxy_request_buffering off;
          proxy_pass_request_body off; proxy_set_body \"$request_body\"; }\n",
    );
    let o = p.run(&["-c", f.to_str().unwrap(), "-t"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
