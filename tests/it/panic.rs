//! A panic while serving one request is contained: its connection (or, over
//! HTTP/2, its stream) ends, an `[alert]` names the panic, and the worker
//! goes on serving every other connection. The panic is requested through
//! `TERN_FAULT_PANIC_URI`, which only whoever starts tern can set.
use crate::harness::*;
use std::io::Write;
use std::time::Duration;

const CONF: &str = "worker_processes 1;\nerror_log logs/error.log info;\n\
    http { server { listen 127.0.0.1:@PORT@ http2; location / { return 200 ok; } } }\n";

fn start() -> Server {
    Server::start_with_env(Prefix::new(), CONF, &[("TERN_FAULT_PANIC_URI", "/boom")])
}

#[test]
fn http1_panic_closes_only_its_connection() {
    let s = start();
    let mut kept = s.connect();
    kept.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let get = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    kept.write_all(get).expect("write");
    assert_eq!(read_response(&mut kept).expect("first answer").body, b"ok");

    let mut victim = s.connect();
    victim
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    victim
        .write_all(b"GET /boom HTTP/1.1\r\nHost: a\r\n\r\n")
        .expect("write");
    assert_eq!(
        read_to_close(&mut victim),
        b"",
        "the panicking request got bytes"
    );

    // The keep-alive connection opened before the panic still serves,
    // and so do new ones.
    kept.write_all(get).expect("write");
    assert_eq!(
        read_response(&mut kept).expect("answer after panic").body,
        b"ok"
    );
    assert_eq!(s.get("/").body, b"ok");

    // Log lines are written by a writer thread: wait for it.
    let log = s.wait_error_log("panic in tern-worker-0");
    let alert = log
        .lines()
        .find(|l| l.contains("[alert]") && l.contains("panic in tern-worker-0"))
        .unwrap_or_else(|| panic!("no [alert] for the panic in:\n{log}"));
    assert!(alert.contains("TERN_FAULT_PANIC_URI requested"), "{alert}");
}

#[test]
fn http2_panic_ends_only_its_stream() {
    if std::process::Command::new("nghttp")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: nghttp (Debian's nghttp2-client) is not installed");
        return;
    }
    let s = start();
    // One HTTP/2 connection carries both requests: the panicking stream
    // is reset, the other one is answered on the same connection.
    let out = std::process::Command::new("nghttp")
        .args([&s.url("/boom"), &s.url("/")])
        .output()
        .expect("nghttp");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("ok"), "nghttp printed {text:?}");
    assert!(
        text.contains("total=2, processed=1"),
        "nghttp printed {text:?}"
    );
    assert_eq!(s.get("/").body, b"ok");
}
