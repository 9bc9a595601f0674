//! HTTP/2: cleartext prior knowledge (`listen ... http2`, HTTP/1.x still
//! answered there), TLS with ALPN h2, request bodies through a proxy,
//! client_max_body_size, the access log's `$server_protocol`/`$http2`,
//! the obsolete directives' warnings, defences against floods, and the
//! judges: curl, nghttp and h2spec (skipped, saying so, only where they
//! are not installed; .ci/run installs them).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use crate::harness::{self, free_port, Prefix, Server};
use crate::origin::Origin;

/// A self-signed certificate for localhost in conf/.
fn cert(p: &Prefix) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    p.write("conf/h2.crt", c.cert.pem());
    p.write("conf/h2.key", c.key_pair.serialize_pem());
}

struct H2 {
    server: Server,
    tls: u16,
    _origin: Origin,
}

/// tern with a cleartext http2 listener (@PORT@), a TLS one with
/// `http2 on`, and an HTTP/1.1 upstream (in this process) that answers
/// with the method, the length and the start of the body it got.
fn start() -> H2 {
    let origin = Origin::serve(|mut c| {
        while let Some(req) = c.next(true) {
            let end = harness::find(&req, b"\r\n\r\n").map_or(req.len(), |p| p + 4);
            let body = &req[end..];
            let method =
                String::from_utf8_lossy(&req[..req.iter().position(|&b| b == b' ').unwrap_or(0)])
                    .to_string();
            let text = format!(
                "{} {} {}",
                method,
                body.len(),
                String::from_utf8_lossy(&body[..body.len().min(20)])
            );
            if c.stream.write_all(&Origin::ok(&text, "")).is_err() {
                return;
            }
        }
    });
    let p = Prefix::new();
    cert(&p);
    p.write("html/index.html", "hello h2\n");
    p.write("html/big.bin", vec![b'x'; 200_000]);
    let tls = free_port();
    let up = origin.port;
    let conf = format!(
        r#"
worker_processes 1;
error_log logs/error.log info;
http {{
    log_format p '$request|$server_protocol|$http2|$status|$body_bytes_sent';
    access_log logs/access.log p;
    server {{
        listen 127.0.0.1:@PORT@ http2;
        listen 127.0.0.1:{tls} ssl;
        http2 on;
        ssl_certificate h2.crt;
        ssl_certificate_key h2.key;
        root html;
        gzip on;
        gzip_min_length 10;
        gzip_types text/plain;
        location /up {{ proxy_pass http://127.0.0.1:{up}; }}
        location /small {{ client_max_body_size 10; proxy_pass http://127.0.0.1:{up}; }}
        location /rl {{ return 200 "$request_length"; }}
    }}
}}
"#
    );
    let mut server = Server::start_in(p, &conf);
    server.wait_listening(tls);
    H2 {
        server,
        tls,
        _origin: origin,
    }
}

fn curl(args: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "10",
            "-w",
            "\n%{http_version} %{http_code}",
        ])
        .args(args)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, tail) = text.rsplit_once('\n').unwrap_or(("", ""));
    (body.trim_end_matches('\n').to_string(), tail.to_string())
}

#[test]
fn prior_knowledge_tls_and_http1_on_one_listener() {
    let h = start();
    let port = h.server.port;
    let (body, tail) = curl(&[
        "--http2-prior-knowledge",
        &format!("http://127.0.0.1:{port}/"),
    ]);
    assert_eq!((body.as_str(), tail.as_str()), ("hello h2", "2 200"));
    // The same cleartext listener still answers HTTP/1.1.
    let (body, tail) = curl(&[&format!("http://127.0.0.1:{port}/")]);
    assert_eq!((body.as_str(), tail.as_str()), ("hello h2", "1.1 200"));
    // TLS: ALPN negotiates h2.
    let (body, tail) = curl(&["--http2", "-k", &format!("https://127.0.0.1:{}/", h.tls)]);
    assert_eq!((body.as_str(), tail.as_str()), ("hello h2", "2 200"));
    // A client without h2 still gets HTTP/1.1 over TLS.
    let (_, tail) = curl(&["--http1.1", "-k", &format!("https://127.0.0.1:{}/", h.tls)]);
    assert_eq!(tail, "1.1 200");
    // A large file (several DATA frames, flow control), gzip, a 404.
    let (body, tail) = curl(&[
        "--http2",
        "-k",
        &format!("https://127.0.0.1:{}/big.bin", h.tls),
    ]);
    assert_eq!((body.len(), tail.as_str()), (200_000, "2 200"));
    let out = Command::new("curl")
        .args(["-s", "-k", "--http2", "--compressed", "-D", "-"])
        .arg(format!("https://127.0.0.1:{}/big.bin", h.tls))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("HTTP/2 200"),
        "{}",
        &text[..100.min(text.len())]
    );
    assert!(
        text.contains("content-encoding: gzip"),
        "{}",
        &text[..300.min(text.len())]
    );
    assert!(text.ends_with(&"x".repeat(1000)));
    let (_, tail) = curl(&[
        "--http2-prior-knowledge",
        &format!("http://127.0.0.1:{port}/nope"),
    ]);
    assert_eq!(tail, "2 404");
    let log = h.server.prefix.read("logs/access.log");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines[0], "GET / HTTP/2.0|HTTP/2.0|h2c|200|9");
    assert_eq!(lines[1], "GET / HTTP/1.1|HTTP/1.1||200|9");
    assert_eq!(lines[2], "GET / HTTP/2.0|HTTP/2.0|h2|200|9");
}

#[test]
fn request_bodies_reach_an_http1_upstream() {
    let h = start();
    let port = h.server.port;
    let (body, tail) = curl(&[
        "--http2-prior-knowledge",
        "-d",
        "hello=world",
        &format!("http://127.0.0.1:{port}/up"),
    ]);
    assert_eq!(
        (body.as_str(), tail.as_str()),
        ("POST 11 hello=world", "2 200")
    );
    // A body larger than the initial window (64k): flow control.
    let big = "y".repeat(300_000);
    let p = h.server.prefix.write("big-body", &big);
    let (body, tail) = curl(&[
        "--http2",
        "-k",
        "--data-binary",
        &format!("@{}", p.display()),
        &format!("https://127.0.0.1:{}/up", h.tls),
    ]);
    assert_eq!(tail, "2 200");
    assert!(
        body.starts_with("POST 300000 yyyyy"),
        "{}",
        &body[..40.min(body.len())]
    );
    // client_max_body_size: 413 from the declared length.
    let (body, tail) = curl(&[
        "--http2-prior-knowledge",
        "-d",
        "0123456789abcdef",
        &format!("http://127.0.0.1:{port}/small"),
    ]);
    assert_eq!(tail, "2 413");
    assert!(body.contains("413 Request Entity Too Large"));
    // The line goes through the error-log writer thread.
    harness::eventually(10, "the 413's error-log line", || {
        h.server
            .error_log()
            .contains("client intended to send too large body: 16 bytes")
    });
}

#[test]
fn nghttp_fetches_a_page_with_its_assets_over_one_connection() {
    if Command::new("nghttp").arg("--version").output().is_err() {
        eprintln!("SKIPPED: nghttp (Debian's nghttp2-client) is not installed");
        return;
    }
    let h = start();
    let mut page = String::from("<html><body>\n");
    for i in 0..30 {
        h.server
            .prefix
            .write(&format!("html/a{i}.css"), format!("a{i} {{}}\n"));
        page.push_str(&format!("<link rel=\"stylesheet\" href=\"/a{i}.css\">\n"));
    }
    page.push_str("</body></html>\n");
    h.server.prefix.write("html/page.html", &page);
    let out = Command::new("nghttp")
        .args(["-nva", "-t", "10"])
        .arg(format!("http://127.0.0.1:{}/page.html", h.server.port))
        .output()
        .expect("nghttp");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text);
    // One connection, the page and its 30 assets, each a 200.
    assert_eq!(text.matches(":status: 200").count(), 31, "{}", text);
    // A stream's log line is written after its last DATA went out, so
    // the last one may trail nghttp's exit a little.
    let mut logged = 0;
    for _ in 0..50 {
        let log = h.server.prefix.read("logs/access.log");
        logged = log.lines().filter(|l| l.contains("|h2c|200|")).count();
        if logged >= 31 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(logged, 31);
}

#[test]
fn h2spec_passes_over_tls_and_cleartext() {
    let bin = std::env::var("H2SPEC").unwrap_or_else(|_| "h2spec".into());
    let found = Command::new(&bin).arg("--version").output().is_ok()
        || Command::new(format!(
            "{}/go/bin/h2spec",
            std::env::var("HOME").unwrap_or_default()
        ))
        .arg("--version")
        .output()
        .is_ok();
    if !found {
        eprintln!("SKIPPED: h2spec is not installed (go install github.com/summerwind/h2spec/cmd/h2spec@latest)");
        return;
    }
    let bin = if Command::new(&bin).arg("--version").output().is_ok() {
        bin
    } else {
        format!(
            "{}/go/bin/h2spec",
            std::env::var("HOME").unwrap_or_default()
        )
    };
    let h = start();
    let run = |args: &[&str]| {
        let out = Command::new(&bin)
            .args(["-h", "127.0.0.1", "-o", "5"])
            .args(args)
            .output()
            .expect("h2spec");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let tls = run(&["-p", &h.tls.to_string(), "-t", "-k"]);
    assert!(tls.contains("145 tests, 145 passed"), "{}", tls);
    // Cleartext: an invalid preface is taken for HTTP/1.x (the listener
    // answers both), so that one check gets a 400 instead of a close.
    let clear = run(&["-p", &h.server.port.to_string()]);
    assert!(clear.contains("145 tests, 144 passed"), "{}", clear);
    assert!(
        clear.contains("× 2: Sends invalid connection preface"),
        "{}",
        clear
    );
}

#[test]
fn obsolete_directives_warn_as_nginx() {
    let p = Prefix::new();
    p.write(
        "conf/nginx.conf",
        "events {}\nhttp {\n server {\n  listen 127.0.0.1:1 http2;\n  http2_idle_timeout 10s;\n  http2_max_requests 10;\n  http2_max_field_size 4k;\n  http2_recv_timeout 5s;\n  http2_max_header_size 16k;\n  http2_max_concurrent_streams 64;\n  http2_body_preread_size 128k;\n  location / { http2_push /x.css; http2_push_preload on; http2_chunk_size 16k; }\n }\n}\n",
    );
    let out = p.run(&["-t"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}", err);
    for (d, instead) in [
        ("http2_idle_timeout", "keepalive_timeout"),
        ("http2_max_requests", "keepalive_requests"),
        ("http2_max_field_size", "large_client_header_buffers"),
        ("http2_recv_timeout", "client_header_timeout"),
        ("http2_max_header_size", "large_client_header_buffers"),
    ] {
        let want = format!(
            "[warn] the \"{d}\" directive is obsolete, use the \"{instead}\" directive instead in"
        );
        assert!(err.contains(&want), "{}", err);
    }
    assert!(
        err.contains("[warn] the \"http2_push\" directive is obsolete, ignored in"),
        "{}",
        err
    );
    assert!(err.contains("[warn] the \"http2_push_preload\" directive is obsolete, ignored in"));
}

// ---- raw frames, for the defences ------------------------------------------

pub(crate) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len();
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK integer with an N-bit prefix.
pub(crate) fn hpack_int(out: &mut Vec<u8>, first: u8, bits: u32, mut v: usize) {
    let max = (1usize << bits) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A literal field without indexing, new name.
pub(crate) fn literal(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.push(0x00);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name.as_bytes());
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// GET / for localhost (static table: :method GET, :scheme http, :path /).
fn get_block() -> Vec<u8> {
    let mut b = vec![0x82, 0x86, 0x84, 0x01, 9];
    b.extend_from_slice(b"localhost");
    b
}

/// Connects and sends the preface and an empty SETTINGS.
pub(crate) fn h2c(port: u16) -> TcpStream {
    let mut s = harness::connect(port);
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(4, 0, 0, &[]));
    s.write_all(&hello).expect("preface");
    s
}

/// Reads frames until the connection closes (or `limit` bytes came);
/// returns the frame types seen.
pub(crate) fn frame_types(s: &mut TcpStream, limit: usize) -> Vec<(u8, u32)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16384];
    while buf.len() < limit {
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i + 9 <= buf.len() {
        let n = ((buf[i] as usize) << 16) | ((buf[i + 1] as usize) << 8) | buf[i + 2] as usize;
        let code = if buf[i + 3] == 7 && i + 17 <= buf.len() {
            u32::from_be_bytes([buf[i + 13], buf[i + 14], buf[i + 15], buf[i + 16]])
        } else {
            0
        };
        out.push((buf[i + 3], code));
        i += 9 + n;
    }
    out
}

#[test]
fn rapid_reset_closes_the_connection() {
    // CVE-2023-44487: streams opened and cancelled in a loop.
    let h = start();
    let mut s = h2c(h.server.port);
    let mut burst = Vec::new();
    for i in 0..2000u32 {
        let id = 2 * i + 1;
        burst.extend(frame(1, 0x5, id, &get_block()));
        burst.extend(frame(3, 0, id, &8u32.to_be_bytes()));
    }
    let _ = s.write_all(&burst);
    let types = frame_types(&mut s, 4 << 20);
    // GOAWAY with ENHANCE_YOUR_CALM (0xb), then the close.
    assert!(
        types.contains(&(7, 0xb)),
        "{:?}",
        &types[types.len().saturating_sub(5)..]
    );
    // The server is fine.
    assert_eq!(h.server.get("/").status, 200);
}

#[test]
fn header_list_and_continuation_flood_are_bounded() {
    let h = start();
    let mut s = h2c(h.server.port);
    // HEADERS without END_HEADERS, then CONTINUATION frames of big fields
    // far past large_client_header_buffers (4 x 8k).
    let mut first = get_block();
    literal(&mut first, "x-a", &[b'a'; 4000]);
    let _ = s.write_all(&frame(1, 0x1, 1, &first));
    for _ in 0..200 {
        let mut b = Vec::new();
        literal(&mut b, "x-b", &[b'b'; 4000]);
        if s.write_all(&frame(9, 0, 1, &b)).is_err() {
            break;
        }
    }
    let _ = s.write_all(&frame(9, 0x4, 1, &[]));
    let types = frame_types(&mut s, 1 << 20);
    // The stream is refused (431 or a reset) or the connection ends: the
    // server never buffers the whole list.
    assert!(
        types.iter().any(|(t, _)| *t == 1 || *t == 3 || *t == 7),
        "{:?}",
        types
    );
    assert_eq!(h.server.get("/").status, 200);
}

#[test]
fn graceful_stop_sends_goaway_and_finishes_streams() {
    let h = start();
    let mut s = h2c(h.server.port);
    // A stream whose body is still coming: QUIT must let it finish.
    let mut block = vec![0x83, 0x86, 0x01, 9];
    block.extend_from_slice(b"localhost");
    block.push(0x04);
    hpack_int(&mut block, 0, 7, 3);
    block.extend_from_slice(b"/up");
    s.write_all(&frame(1, 0x4, 1, &block)).expect("headers");
    s.write_all(&frame(0, 0, 1, b"part1")).expect("data");
    std::thread::sleep(Duration::from_millis(300));
    h.server.signal(libc::SIGQUIT);
    std::thread::sleep(Duration::from_millis(300));
    s.write_all(&frame(0, 0x1, 1, b"+part2"))
        .expect("rest of body");
    let types = frame_types(&mut s, 1 << 20);
    assert!(types.iter().any(|(t, _)| *t == 7), "GOAWAY: {:?}", types);
    assert!(
        types.iter().any(|(t, _)| *t == 1),
        "the response: {:?}",
        types
    );
    assert!(!types.iter().any(|(t, _)| *t == 3), "no reset: {:?}", types);
}

/// The GOAWAY's last stream id and code, from the frames read until the
/// connection closed. Frames are parsed as they come and dropped, with no
/// cap on the bytes read: a PING flood is answered with about as many bytes
/// of ACKs as it sends, so a capped reader can stop just short of the GOAWAY.
fn goaway_of(s: &mut TcpStream) -> Option<(u32, u32)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16384];
    loop {
        let mut i = 0;
        while i + 9 <= buf.len() {
            let n = ((buf[i] as usize) << 16) | ((buf[i + 1] as usize) << 8) | buf[i + 2] as usize;
            if i + 9 + n > buf.len() {
                break;
            }
            if buf[i + 3] == 7 && n >= 8 {
                let last = u32::from_be_bytes([buf[i + 9], buf[i + 10], buf[i + 11], buf[i + 12]]);
                let code = u32::from_be_bytes([buf[i + 13], buf[i + 14], buf[i + 15], buf[i + 16]]);
                return Some((last, code));
            }
            i += 9 + n;
        }
        buf.drain(..i);
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
}

#[test]
fn ping_settings_and_empty_data_floods_close_the_connection() {
    // Frames that cost work and carry nothing: past 1 MiB + 8 x the
    // payload, GOAWAY ENHANCE_YOUR_CALM and the close (nginx's rule).
    let h = start();
    for flood in [
        frame(6, 0, 0, &[0; 8]),
        frame(4, 0, 0, &[]),
        frame(8, 0, 0, &1u32.to_be_bytes()),
    ] {
        let mut s = h2c(h.server.port);
        let reader = {
            let mut r = s.try_clone().expect("clone");
            std::thread::spawn(move || goaway_of(&mut r))
        };
        let batch: Vec<u8> = flood
            .iter()
            .copied()
            .cycle()
            .take(flood.len() * 4096)
            .collect();
        for _ in 0..400 {
            if s.write_all(&batch).is_err() {
                break;
            }
        }
        let _ = s.shutdown(std::net::Shutdown::Write);
        assert_eq!(
            reader.join().expect("reader").map(|g| g.1),
            Some(0xb),
            "frame type {}",
            flood[3]
        );
    }
    // Empty DATA frames on an open stream (a POST whose body never comes).
    let mut s = h2c(h.server.port);
    let mut block = vec![0x83, 0x86, 0x01, 9];
    block.extend_from_slice(b"localhost");
    block.push(0x04);
    hpack_int(&mut block, 0, 7, 3);
    block.extend_from_slice(b"/up");
    s.write_all(&frame(1, 0x4, 1, &block)).expect("headers");
    let reader = {
        let mut r = s.try_clone().expect("clone");
        std::thread::spawn(move || goaway_of(&mut r))
    };
    let batch: Vec<u8> = frame(0, 0, 1, &[])
        .into_iter()
        .cycle()
        .take(9 * 8192)
        .collect();
    for _ in 0..200 {
        if s.write_all(&batch).is_err() {
            break;
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    assert_eq!(reader.join().expect("reader").map(|g| g.1), Some(0xb));
    // The line goes through the log writer thread: it may trail the GOAWAY.
    h.server.wait_error_log("http2 flood detected");
    assert_eq!(h.server.get("/").status, 200);
}

#[test]
fn self_dependency_and_client_push_promise_end_the_connection_as_nginx() {
    let h = start();
    // HEADERS depending on itself: GOAWAY PROTOCOL_ERROR, last stream 0
    // (the stream was never taken).
    let mut s = h2c(h.server.port);
    let mut p = vec![0, 0, 0, 1, 15];
    p.extend(get_block());
    s.write_all(&frame(1, 0x25, 1, &p)).expect("headers");
    assert_eq!(goaway_of(&mut s), Some((0, 1)));
    // PRIORITY depending on itself after a served stream: last stream 1.
    let mut s = h2c(h.server.port);
    s.write_all(&frame(1, 0x5, 1, &get_block()))
        .expect("headers");
    std::thread::sleep(Duration::from_millis(200));
    s.write_all(&frame(2, 0, 1, &[0, 0, 0, 1, 0]))
        .expect("priority");
    assert_eq!(goaway_of(&mut s), Some((1, 1)));
    // A client's PUSH_PROMISE: PROTOCOL_ERROR.
    let mut s = h2c(h.server.port);
    s.write_all(&frame(5, 0x4, 1, &[0, 0, 0, 2])).expect("push");
    assert_eq!(goaway_of(&mut s).map(|g| g.1), Some(1));
    // A GOAWAY too short for its fields: FRAME_SIZE_ERROR.
    let mut s = h2c(h.server.port);
    s.write_all(&frame(7, 0, 0, &[])).expect("goaway");
    assert_eq!(goaway_of(&mut s).map(|g| g.1), Some(6));
}

#[test]
fn many_streams_in_one_read_close_the_connection() {
    // Streams opened faster than they can be served (rapid reset without
    // the resets): more new streams in one read than twice
    // http2_max_concurrent_streams (128) is "too many streams at once".
    let h = start();
    let mut s = h2c(h.server.port);
    // 300 HEADERS of 23 bytes: one read of h2's 8 KiB buffer.
    let mut burst = Vec::new();
    for i in 0..300u32 {
        burst.extend(frame(1, 0x5, 2 * i + 1, &get_block()));
    }
    let _ = s.write_all(&burst);
    assert_eq!(goaway_of(&mut s).map(|g| g.1), Some(0xb));
    // The line goes through the log writer thread: it may trail the GOAWAY.
    h.server
        .wait_error_log("client sent too many streams at once");
    assert_eq!(h.server.get("/").status, 200);
}

#[test]
fn request_length_is_the_header_block_as_nginx_counts_it() {
    // :method GET, :scheme http (1 byte each), :path "/rl" (1+1+3),
    // :authority "localhost" (1+1+9): 18 bytes of HPACK.
    let h = start();
    let mut s = h2c(h.server.port);
    let mut block = vec![0x82, 0x86, 0x04, 3];
    block.extend_from_slice(b"/rl");
    block.extend_from_slice(&[0x01, 9]);
    block.extend_from_slice(b"localhost");
    assert_eq!(block.len(), 18);
    s.write_all(&frame(1, 0x5, 1, &block)).expect("headers");
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let body = loop {
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => break None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
        // The first DATA frame on stream 1.
        let mut i = 0;
        let mut found = None;
        while i + 9 <= buf.len() {
            let n = ((buf[i] as usize) << 16) | ((buf[i + 1] as usize) << 8) | buf[i + 2] as usize;
            if i + 9 + n > buf.len() {
                break;
            }
            if buf[i + 3] == 0 && buf[i + 8] == 1 {
                found = Some(buf[i + 9..i + 9 + n].to_vec());
                break;
            }
            i += 9 + n;
        }
        if found.is_some() {
            break found;
        }
    };
    assert_eq!(body.as_deref(), Some(&b"18"[..]));
}

/// Reads frames until stream `id`'s first DATA frame; its payload, and
/// whether a GOAWAY came before it.
fn data_of(s: &mut TcpStream, id: u32) -> (Option<Vec<u8>>, bool) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return (None, false),
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
        let (mut i, mut goaway) = (0, false);
        while i + 9 <= buf.len() {
            let n = ((buf[i] as usize) << 16) | ((buf[i + 1] as usize) << 8) | buf[i + 2] as usize;
            if i + 9 + n > buf.len() {
                break;
            }
            let sid = u32::from_be_bytes([buf[i + 5], buf[i + 6], buf[i + 7], buf[i + 8]]);
            goaway |= buf[i + 3] == 7;
            if buf[i + 3] == 0 && sid == id {
                return (Some(buf[i + 9..i + 9 + n].to_vec()), goaway);
            }
            i += 9 + n;
        }
    }
}

#[test]
fn a_reload_keeps_h2_connections_and_the_next_stream_uses_the_new_config() {
    // tern reloads in place: no GOAWAY; a stream opened after the reload
    // runs on the new configuration, on the same connection.
    let conf = |v: &str| {
        format!(
            "worker_processes 1;\nerror_log logs/error.log info;\nhttp {{ server {{ listen 127.0.0.1:@PORT@ http2; location /v {{ return 200 \"{v}\"; }} }} }}\n"
        )
    };
    let server = Server::start_in(Prefix::new(), &conf("one"));
    let mut s = h2c(server.port);
    let get = |path: &str| {
        let mut b = vec![0x82, 0x86, 0x04, path.len() as u8];
        b.extend_from_slice(path.as_bytes());
        b.extend_from_slice(&[0x01, 9]);
        b.extend_from_slice(b"localhost");
        b
    };
    s.write_all(&frame(1, 0x5, 1, &get("/v"))).expect("headers");
    assert_eq!(data_of(&mut s, 1), (Some(b"one".to_vec()), false));
    server.rewrite_conf(&conf("two"), server.port);
    server.signal(libc::SIGHUP);
    harness::wait_log(&server.prefix, "logs/error.log", "reconfigured");
    s.write_all(&frame(1, 0x5, 3, &get("/v"))).expect("headers");
    assert_eq!(data_of(&mut s, 3), (Some(b"two".to_vec()), false));
}
