//! HTTP/3 over QUIC with a real client: Python's aioquic (tests/it/
//! h3_client.py; .ci/run installs it, and these tests say so and return
//! where it is missing). Static files, a proxied page and a 10 MiB file
//! arrive with the same bytes as over HTTP/1.1; the access log shows
//! `HTTP/3.0` and `$http3`; request bodies reach the upstream; Retry
//! (`quic_retry on`); a reload keeps the connection and the next request
//! uses the new configuration; a graceful stop closes connections with
//! H3_NO_ERROR; the directives load and a bad `quic_host_key` is refused
//! with file:line.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{self, free_port, Prefix, Server};
use crate::origin::Origin;

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/h3_client.py");

pub(crate) fn have_aioquic() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import aioquic"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: python3 with aioquic is not installed (.ci/run installs it)");
    }
    ok
}

pub(crate) fn cert(p: &Prefix) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    p.write("conf/h3.crt", c.cert.pem());
    p.write("conf/h3.key", c.key_pair.serialize_pem());
}

/// Runs the client; returns its stdout (panics with its stderr when it
/// fails).
pub(crate) fn fetch(port: u16, out: &Path, paths: &[&str], extra: &[&str]) -> String {
    std::fs::create_dir_all(out).expect("out dir");
    let o = Command::new("python3")
        .arg(CLIENT)
        .arg("127.0.0.1")
        .arg(port.to_string())
        .arg(out)
        .args(paths)
        .args(extra)
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "h3 client failed: {}{}",
        stdout,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

pub(crate) fn read(out: &Path, name: &str) -> Vec<u8> {
    std::fs::read(out.join(name)).unwrap_or_default()
}

pub(crate) fn head(out: &Path, i: usize) -> String {
    String::from_utf8_lossy(&read(out, &format!("{i}.head"))).to_string()
}

struct H3 {
    server: Server,
    quic: u16,
    _origin: Origin,
}

/// tern with HTTP/1.1 on @PORT@, and TLS + QUIC on another port, as the
/// guides write it (`listen N quic reuseport; listen N ssl; http3 on;`
/// and the Alt-Svc header), plus an upstream that answers with the
/// method, body length and request line it got.
fn start(extra: &str) -> H3 {
    let origin = Origin::serve(|mut c| {
        while let Some(req) = c.next(true) {
            let end = harness::find(&req, b"\r\n\r\n").map_or(req.len(), |p| p + 4);
            let line_end = harness::find(&req, b"\r\n").unwrap_or(0);
            let text = format!(
                "{} body={}",
                String::from_utf8_lossy(&req[..line_end]),
                req.len() - end
            );
            if c.stream.write_all(&Origin::ok(&text, "")).is_err() {
                return;
            }
        }
    });
    let p = Prefix::new();
    cert(&p);
    p.write("html/index.html", "hello h3\n");
    // 10 MiB that does not compress, in a type gzip leaves alone.
    let mut big = Vec::with_capacity(10 << 20);
    let mut x: u32 = 0x1234_5678;
    while big.len() < 10 << 20 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        big.extend_from_slice(&x.to_le_bytes());
    }
    p.write("html/big.bin", &big);
    let quic = free_port();
    let up = origin.port;
    let conf = format!(
        r#"
worker_processes 2;
error_log logs/error.log info;
http {{
    types {{ text/html html; application/octet-stream bin; }}
    log_format p '$request|$server_protocol|$http3|$status|$body_bytes_sent|$ssl_protocol|$request_completion';
    access_log logs/access.log p;
    server {{
        listen 127.0.0.1:@PORT@;
        listen 127.0.0.1:{quic} quic reuseport;
        listen 127.0.0.1:{quic} ssl;
        http3 on;
        ssl_certificate h3.crt;
        ssl_certificate_key h3.key;
        add_header Alt-Svc 'h3=":{quic}"; ma=86400';
        root html;
        gzip on;
        gzip_min_length 1;
        {extra}
        location /up/ {{ proxy_pass http://127.0.0.1:{up}; }}
        location /ver {{ return 200 "one\n"; }}
    }}
}}
"#
    );
    let server = Server::start_in(p, &conf);
    H3 {
        server,
        quic,
        _origin: origin,
    }
}

#[test]
fn static_proxied_and_10mib_same_bytes_as_http1() {
    if !have_aioquic() {
        return;
    }
    let h = start("");
    let out = h.server.prefix.path("h3out");
    let said = fetch(h.quic, &out, &["/", "/up/page?a=1", "/big.bin"], &[]);
    assert_eq!(said.trim(), "ok 3");
    for (i, path) in ["/", "/up/page?a=1", "/big.bin"].iter().enumerate() {
        let h1 = h.server.get(path);
        assert_eq!(h1.status, 200, "{path} over HTTP/1.1");
        let body = read(&out, &format!("{i}.body"));
        assert_eq!(
            body.len(),
            h1.body.len(),
            "{path}: length over h3 vs HTTP/1.1"
        );
        assert!(
            body == h1.body,
            "{path}: bytes over h3 differ from HTTP/1.1"
        );
        assert!(
            head(&out, i).contains(":status: 200\n"),
            "{path}: {}",
            head(&out, i)
        );
    }
    assert_eq!(read(&out, "0.body"), b"hello h3\n");
    assert_eq!(read(&out, "2.body").len(), 10 << 20);
    assert!(String::from_utf8_lossy(&read(&out, "1.body")).starts_with("GET /up/page?a=1 HTTP/1.0"));
    let h0 = head(&out, 0);
    assert!(
        h0.contains(&format!("alt-svc: h3=\":{}\"; ma=86400\n", h.quic)),
        "{h0}"
    );
    assert!(!h0.contains("connection:"), "{h0}");
    let log = h.server.prefix.read("logs/access.log");
    assert!(
        log.contains("GET / HTTP/3.0|HTTP/3.0|h3|200|9|TLSv1.3|OK\n"),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "GET /big.bin HTTP/3.0|HTTP/3.0|h3|200|{}|TLSv1.3|OK\n",
            10 << 20
        )),
        "{log}"
    );
    // HTTP/1.1 requests are not HTTP/3 ones.
    assert!(
        log.contains("GET / HTTP/1.1|HTTP/1.1||200|9|-|OK\n"),
        "{log}"
    );
}

/// What quinn does not tell is read from the handshake: `$ssl_cipher` is
/// the suite the client offered alone, `$ssl_session_reused` is `r` on a
/// connection that resumed the first one's session. A request refused as
/// it is read (an invalid `:authority`) gets the `error_page` of its
/// status, as over HTTP/1.1.
#[test]
fn tls_variables_from_the_handshake_and_refused_request_error_page() {
    if !have_aioquic() {
        return;
    }
    let h = start(
        r#"add_header X-Cipher $ssl_cipher always;
        add_header X-Reused "[$ssl_session_reused]" always;
        error_page 400 /ver;"#,
    );
    let out = h.server.prefix.path("suite");
    let said = fetch(h.quic, &out, &["/"], &["--cipher", "AES_256_GCM_SHA384"]);
    assert_eq!(said.trim(), "ok 1");
    let h0 = head(&out, 0);
    assert!(h0.contains("x-cipher: TLS_AES_256_GCM_SHA384\n"), "{h0}");
    assert!(h0.contains("x-reused: [.]\n"), "{h0}");
    let out = h.server.prefix.path("chacha");
    fetch(
        h.quic,
        &out,
        &["/"],
        &["--cipher", "CHACHA20_POLY1305_SHA256"],
    );
    let h0 = head(&out, 0);
    assert!(
        h0.contains("x-cipher: TLS_CHACHA20_POLY1305_SHA256\n"),
        "{h0}"
    );
    // The second connection resumes the first's session.
    let out = h.server.prefix.path("resumed");
    let said = fetch(h.quic, &out, &["/"], &["--early"]);
    assert_eq!(said.trim(), "ok 1");
    let h0 = head(&out, 0);
    assert!(h0.contains("x-reused: [r]\n"), "{h0}");
    // An invalid host: 400, answered by the error_page location.
    let out = h.server.prefix.path("refused");
    fetch(h.quic, &out, &["/"], &["--authority", "."]);
    let h0 = head(&out, 0);
    assert!(h0.contains(":status: 400\n"), "{h0}");
    assert_eq!(read(&out, "0.body"), b"one\n");
    let log = h.server.prefix.read("logs/error.log");
    assert!(log.contains("client sent invalid host"), "{log}");
}

#[test]
fn gzip_post_body_and_retry() {
    if !have_aioquic() {
        return;
    }
    let h = start("quic_retry on; gzip_types text/plain;");
    let out = h.server.prefix.path("h3out");
    // gzip applies over HTTP/3 as over HTTP/1.1.
    fetch(h.quic, &out, &["/"], &["--header", "accept-encoding: gzip"]);
    let h0 = head(&out, 0);
    assert!(h0.contains("content-encoding: gzip\n"), "{h0}");
    assert_eq!(&read(&out, "0.body")[..2], &[0x1f, 0x8b]);
    // A body reaches the upstream whole (with and without a length).
    let data = h.server.prefix.write("post.bin", vec![b'p'; 100_000]);
    let d = data.to_str().unwrap_or_default();
    fetch(
        h.quic,
        &out,
        &["/up/post"],
        &["--method", "POST", "--data", d],
    );
    assert_eq!(
        String::from_utf8_lossy(&read(&out, "0.body")),
        "POST /up/post HTTP/1.0 body=100000"
    );
    fetch(
        h.quic,
        &out,
        &["/up/post"],
        &[
            "--method",
            "POST",
            "--data",
            d,
            "--header",
            "content-length: 100000",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&read(&out, "0.body")),
        "POST /up/post HTTP/1.0 body=100000"
    );
}

#[test]
fn reload_keeps_the_connection_and_quit_closes_it() {
    if !have_aioquic() {
        return;
    }
    let mut h = start("");
    let out = h.server.prefix.path("h3out");
    let mut child = Command::new("python3")
        .arg(CLIENT)
        .args(["127.0.0.1", &h.quic.to_string()])
        .arg(&out)
        .args(["/ver", "/ver", "--pause", "3", "--hold", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3");
    std::fs::create_dir_all(&out).expect("out dir");
    harness::eventually(20, "the first answer", || out.join("paused").exists());
    // Reload during the pause: the same connection's next request sees
    // the new configuration.
    let conf = std::fs::read_to_string(&h.server.conf).expect("conf");
    std::fs::write(&h.server.conf, conf.replace("\"one\\n\"", "\"two\\n\"")).expect("conf");
    h.server.signal(libc::SIGHUP);
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = || lines.next().and_then(|l| l.ok()).unwrap_or_default();
    assert_eq!(next(), "ok 2");
    assert_eq!(read(&out, "0.body"), b"one\n");
    assert_eq!(read(&out, "1.body"), b"two\n", "after the reload");
    assert_eq!(next(), "holding");
    // Graceful stop: GOAWAY, then the connection closes with
    // H3_NO_ERROR and tern exits.
    h.server.signal(libc::SIGQUIT);
    assert_eq!(next(), "closed 0x100");
    let _ = child.wait();
    assert_eq!(h.server.wait_exit(Duration::from_secs(10)), Some(0));
}

#[test]
fn directives_load_and_errors() {
    let p = Prefix::new();
    cert(&p);
    p.write("conf/quic.key", [7u8; 32]);
    let conf = r#"
quic_bpf on;
http {
    http3 on;
    http3_hq off;
    http3_max_concurrent_streams 64;
    http3_stream_buffer_size 128k;
    quic_retry on;
    quic_gso on;
    quic_host_key quic.key;
    quic_active_connection_id_limit 4;
    ssl_early_data on;
    server {
        listen 127.0.0.1:@PORT@ quic reuseport;
        listen 127.0.0.1:@PORT@ ssl;
        ssl_certificate h3.crt;
        ssl_certificate_key h3.key;
    }
}
"#;
    let port = free_port();
    p.write("conf/nginx.conf", harness::conf_text(conf, port));
    let o = p.run(&["-t"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    p.write(
        "conf/nginx.conf",
        harness::conf_text(
            &conf.replace("quic_host_key quic.key", "quic_host_key nope.key"),
            port,
        ),
    );
    let o = p.run(&["-t"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("nope.key\" failed (2: No such file or directory) in ")
            && err.contains("nginx.conf:11"),
        "{err}"
    );
    p.write(
        "conf/nginx.conf",
        harness::conf_text(&conf.replace("http3 on;", "http3 maybe;"), port),
    );
    let o = p.run(&["-t"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "invalid value \"maybe\" in \"http3\" directive, it must be \"on\" or \"off\""
        ),
        "{err}"
    );
}

/// keepalive_requests and keepalive_timeout 0 end the connection after
/// their last request with GOAWAY (nginx-tests h3_keepalive.t); a body
/// shorter than its Content-Length is answered 400, as nginx (the end of
/// the stream ends the body over HTTP/3; h3_request_body.t).
#[test]
fn keepalive_goaway_and_short_body() {
    if !have_aioquic() {
        return;
    }
    for (extra, paths) in [
        ("keepalive_requests 2;", &["/ver", "/ver"][..]),
        ("keepalive_timeout 0;", &["/ver"][..]),
    ] {
        let h = start(extra);
        let out = h.server.prefix.path("h3out");
        let said = fetch(h.quic, &out, paths, &["--hold", "10"]);
        assert!(
            said.contains(&format!("ok {}\nholding\nclosed", paths.len())),
            "{extra}: {said}"
        );
    }
    let h = start("");
    let out = h.server.prefix.path("h3out");
    let data = h.server.prefix.write("short.bin", b"TEST");
    let d = data.to_str().unwrap_or_default();
    fetch(
        h.quic,
        &out,
        &["/up/post"],
        &[
            "--method",
            "POST",
            "--data",
            d,
            "--header",
            "content-length: 5",
        ],
    );
    assert!(
        head(&out, 0).contains(":status: 400\n"),
        "{}",
        head(&out, 0)
    );
    let log = h.server.prefix.read("logs/error.log");
    assert!(
        log.contains(
            "client prematurely closed stream: only 4 out of 5 bytes of request body received"
        ),
        "{log}"
    );
}

/// After the handshake the session tickets go once. A client that reads
/// nothing for a while (its event loop blocked right after the
/// handshake) gets quinn's loss probes as PINGs, as nginx probes, not
/// the tickets again (nginx-tests' Perl client dies on a repeated one:
/// h3_congestion_ack.t, h3_limit_req.t), and the tickets still resume a
/// session with 0-RTT.
#[test]
fn a_client_that_reads_late_gets_each_ticket_once() {
    if !have_aioquic() {
        return;
    }
    let h = start("ssl_early_data on; add_header X-Early \"[$ssl_early_data]\";");
    let out = h.server.prefix.path("stalled");
    let said = fetch(h.quic, &out, &["/"], &["--stall", "0.6", "--early"]);
    let line = said
        .lines()
        .find_map(|l| l.strip_prefix("crypto "))
        .unwrap_or_default();
    let frames: Vec<&str> = line.split(' ').collect();
    assert!(line != "-" && !frames.is_empty(), "{said}");
    let mut once = frames.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!(once.len(), frames.len(), "a ticket came twice: {said}");
    // The second connection resumed with a ticket and sent its request
    // as 0-RTT.
    assert!(said.starts_with("ok 1\n"), "{said}");
    assert!(
        head(&out, 0).contains("x-early: [1]\n"),
        "{}",
        head(&out, 0)
    );
}

/// `worker_shutdown_timeout` ends an HTTP/3 request still waiting on its
/// upstream when the worker stops (QUIT), as over HTTP/1 and HTTP/2: the
/// stream is reset, tern exits, and the access log has the request as
/// one the client closed (499, as nginx logs it).
#[test]
fn a_request_in_flight_at_quit_ends_when_worker_shutdown_timeout_runs_out() {
    if !have_aioquic() {
        return;
    }
    // An upstream that takes the request and never answers.
    let origin = Origin::serve(|mut c| {
        if let Some(req) = c.next(false) {
            c.record(&req);
            let mut b = [0u8; 1024];
            while matches!(c.stream.read(&mut b), Ok(n) if n > 0) {}
        }
    });
    let p = Prefix::new();
    cert(&p);
    let quic = free_port();
    let conf = format!(
        r#"
worker_processes 1;
worker_shutdown_timeout 200ms;
error_log logs/error.log info;
http {{
    log_format p '$request|$status';
    access_log logs/access.log p;
    server {{
        listen 127.0.0.1:@PORT@;
        listen 127.0.0.1:{quic} quic reuseport;
        ssl_certificate h3.crt;
        ssl_certificate_key h3.key;
        location / {{
            proxy_pass http://127.0.0.1:{};
            proxy_read_timeout 30s;
        }}
    }}
}}
"#,
        origin.port
    );
    let mut server = Server::start_in(p, &conf);
    let out = server.prefix.path("h3out");
    std::fs::create_dir_all(&out).expect("out dir");
    let mut child = Command::new("python3")
        .arg(CLIENT)
        .args(["127.0.0.1", &quic.to_string()])
        .arg(&out)
        .arg("/slow")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    harness::eventually(20, "the request at the upstream", || {
        !origin.requests().is_empty()
    });
    server.signal(libc::SIGQUIT);
    // Well before the upstream's 30 s.
    let exited = server.wait_exit(Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(exited, Some(0));
    let log = server.prefix.read("logs/access.log");
    assert_eq!(log, "GET /slow HTTP/3.0|499\n");
}

/// A client that resets its request stream while limit_req holds the
/// request ends it at once as 499, as nginx notices it while delaying
/// (ngx_http_test_reading; nginx-tests h3_limit_req.t 6), not when the
/// delay (here a minute) is over.
#[test]
fn a_stream_reset_while_limit_req_delays_ends_the_request_as_499() {
    if !have_aioquic() {
        return;
    }
    let p = Prefix::new();
    cert(&p);
    let quic = free_port();
    let conf = format!(
        r#"
worker_processes 1;
error_log logs/error.log info;
http {{
    log_format p '$request|$status';
    access_log logs/access.log p;
    limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;
    server {{
        listen 127.0.0.1:@PORT@;
        listen 127.0.0.1:{quic} quic reuseport;
        ssl_certificate h3.crt;
        ssl_certificate_key h3.key;
        location / {{
            limit_req zone=one burst=5;
        }}
    }}
}}
"#
    );
    p.write("html/first", "first\n");
    let server = Server::start_in(p, &conf);
    let out = server.prefix.path("h3out");
    // The second request's head goes without the end of the stream (a
    // body may follow), then the stream is reset.
    let said = fetch(quic, &out, &["/first", "/held"], &["--reset-after", "0.5"]);
    assert_eq!(said, "reset\nok 1\n");
    // Well before the minute the delay would take.
    let log = harness::wait_log(&server.prefix, "logs/access.log", "/held");
    assert_eq!(log, "GET /first HTTP/3.0|200\nGET /held HTTP/3.0|499\n");
    let err = server.error_log();
    assert!(
        err.contains("client prematurely closed connection"),
        "{err}"
    );
}
