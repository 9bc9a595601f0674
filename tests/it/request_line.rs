//! Odd and broken request heads, answered as nginx 1.22.1 answers them:
//! the request line's leniencies (extra spaces, any HTTP/1.x, any scheme,
//! HTTP/0.9), the header lines nginx ignores or refuses, and what a
//! refused head gets (the server's `add_header ... always`, an access-log
//! line, the error-log line with its context). The corpus runs against
//! the real nginx on the same config and must give the same bytes.
use crate::differential::differences;
use crate::harness::*;
use std::io::{Read, Write};
use std::time::Duration;

const CONF: &str = r#"
worker_processes 1;
error_log logs/error.log info;
events {}
http {
    types { text/html html; text/plain txt; }
    default_type application/octet-stream;
    access_log logs/access.log;
    client_header_timeout 30s;
    server {
        listen 127.0.0.1:@PORT@;
        server_name main.test;
        root html;
        add_header X-Always yes always;
        add_header X-Ok yes;
        error_page 414 /custom.html;
        location = /ret { return 200 "m=$request_method u=$uri a=$args r=$request_uri p=$server_protocol h=$host hh=$http_host\n"; }
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name other.test;
        add_header X-Other yes always;
        return 200 "other $host\n";
    }
}
"#;

fn files(p: &Prefix) {
    p.write("html/index.html", "hello\n");
    p.write("html/a.txt", "a text\n");
    p.write("html/dir/x.txt", "x\n");
    p.write("html/custom.html", "custom page\n");
    crate::differential::fix_times(&p.path("html"));
}

fn corpus() -> Vec<Vec<u8>> {
    let h = "Host: main.test\r\nConnection: close\r\n";
    let mut reqs: Vec<String> = Vec::new();
    for m in ["GET", "TRACE", "CONNECT", "get", "GET1", "GE T", "G_T-X"] {
        reqs.push(format!("{m} /ret HTTP/1.1\r\n{h}\r\n"));
    }
    for u in [
        "*",
        "http://main.test/ret?x=1",
        "HTTP://MAIN.TEST:80/ret",
        "ftp://other.test/ret",
        "http://u:p@main.test/ret",
        "http:///ret",
        "http://main.test",
        "/%00",
        "/ret\t",
        "/ret\x7f",
        "/.%2e/ret",
        "/dir?x=1",
        "/dir",
    ] {
        reqs.push(format!("GET {u} HTTP/1.1\r\n{h}\r\n"));
    }
    for v in [
        "HTTP/1.0",
        "HTTP/1.2",
        "HTTP/1.10",
        "HTTP/1.01",
        "HTTP/2.0",
        "HTTP/2",
        "HTTP/2x",
        "HTTP/3 ",
        "HTTP/99.1",
        "HTTP/1000.0",
        "HTTP/0.9",
        "HTTP/01.1",
        "HTTP/1",
        "HTTP/1.1 ",
        "HTTP/1.1  ",
        "HTTP/1.1x",
        "http/1.1",
        "HTTP/1.1.1",
    ] {
        reqs.push(format!("GET /ret {v}\r\n{h}\r\n"));
    }
    for line in [
        "GET  /ret HTTP/1.1",
        "GET /ret   HTTP/1.1",
        " GET /ret HTTP/1.1",
        "GET /ret HTTP/1.1 extra",
        "PRI * HTTP/2.0",
    ] {
        reqs.push(format!("{line}\r\n{h}\r\n"));
    }
    for hd in [
        "Host: MAIN.test.",
        "Host: ma in.test",
        "Host: main\\test",
        "Host:\tother.test",
        "Host: other.test:99",
        "Host: main..test",
        "Host: main.test/",
        "Host: ",
    ] {
        reqs.push(format!(
            "GET /ret HTTP/1.1\r\n{hd}\r\nConnection: close\r\n\r\n"
        ));
    }
    for hd in [
        "X-A",
        "X-A :b",
        "X@A: b",
        "X.A: b",
        "X-\u{d0}: b",
        "X-A: \u{7f}",
        "User-Agent: \u{1}",
        "X-A: b\r\n c",
        ": b",
    ] {
        reqs.push(format!("GET /ret HTTP/1.1\r\n{h}{hd}\r\n\r\n"));
    }
    reqs.push(format!(
        "GET /ret HTTP/1.1\r\n{}{h}\r\n",
        (0..200)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect::<String>()
    ));
    reqs.push("GET /ret HTTP/1.1\r\nConnection: close\r\n\r\n".into());
    reqs.push(format!("GET /{} HTTP/1.1\r\n{h}\r\n", "u".repeat(9000)));
    reqs.push("GET /dir HTTP/1.0\r\n\r\n".into());
    reqs.push("GET /ret\r\n".into());
    reqs.push("GET /a.txt \r\n".into());
    reqs.push("POST /echo HTTP/1.1\r\nHost: main.test\r\nTransfer-Encoding: gzip\r\nConnection: close\r\n\r\n".into());
    reqs.push("POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n".into());
    let mut out: Vec<Vec<u8>> = reqs
        .into_iter()
        .map(|r| r.chars().map(|c| c as u32 as u8).collect())
        .collect();
    // Not text: a TLS hello and NULs on the plain port.
    out.push(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03".to_vec());
    out.push(b"\x00\x00\x00\x00".to_vec());
    out
}

#[test]
fn same_answers_as_nginx() {
    if !nginx_installed() {
        return;
    }
    let pn = Prefix::new();
    files(&pn);
    let nport = free_port();
    let Some(nginx) = start_nginx(&pn, CONF, nport) else {
        panic!("nginx did not start");
    };
    let pt = Prefix::new();
    files(&pt);
    let tern = Server::start_in(pt, CONF);
    let reqs = corpus();
    let diffs = differences(nport, tern.port, &reqs);
    drop(nginx);
    assert!(
        diffs.is_empty(),
        "{} of {} answers differ from nginx:\n{}",
        diffs.len(),
        reqs.len(),
        diffs.concat()
    );
}

fn server() -> Server {
    let p = Prefix::new();
    files(&p);
    Server::start_in(p, CONF)
}

#[test]
fn a_refused_head_is_logged_and_gets_always_headers() {
    let s = server();
    let out = String::from_utf8_lossy(&s.raw(b"get /ret HTTP/1.1\r\nHost: main.test\r\n\r\n"))
        .into_owned();
    assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
    assert!(out.contains("\r\nX-Always: yes\r\n"), "{out}");
    assert!(!out.contains("X-Ok"), "{out}");
    s.wait_error_log(
        "client sent invalid method while reading client request line, client: 127.0.0.1, \
         server: main.test, request: \"get /ret HTTP/1.1\"",
    );
    let log = wait_log(&s.prefix, "logs/access.log", "\"get /ret HTTP/1.1\" 400 ");
    assert!(log.contains("127.0.0.1 - - ["), "{log}");
    // Refused once the headers are read: the Host's server answers, and
    // the error log names the host.
    let out = String::from_utf8_lossy(&s.raw(b"TRACE / HTTP/1.1\r\nHost: other.test\r\n\r\n"))
        .into_owned();
    assert!(out.starts_with("HTTP/1.1 405 Not Allowed\r\n"), "{out}");
    assert!(out.contains("\r\nX-Other: yes\r\n"), "{out}");
    s.wait_error_log(
        "client sent TRACE method while reading client request headers, client: 127.0.0.1, \
         server: other.test, request: \"TRACE / HTTP/1.1\", host: \"other.test\"",
    );
    wait_log(&s.prefix, "logs/access.log", "\"TRACE / HTTP/1.1\" 405 ");
    // A header line nginx ignores is reported, and the request served.
    let out = String::from_utf8_lossy(
        &s.raw(b"GET /ret HTTP/1.1\r\nHost: main.test\r\nX@Y: 1\r\nConnection: close\r\n\r\n"),
    )
    .into_owned();
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    s.wait_error_log(
        "client sent invalid header line: \"X@Y: 1\" while reading client request headers",
    );
}

#[test]
fn a_tls_hello_on_a_plain_port_is_refused_at_once() {
    let s = server();
    let mut c = s.connect();
    c.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    // The first bytes of a ClientHello; the connection stays open, so
    // an answer can only come from judging the bytes already there.
    c.write_all(b"\x16\x03\x01\x00\xa5\x01\x00").expect("write");
    let mut buf = [0u8; 512];
    let n = c
        .read(&mut buf)
        .expect("an answer before client_header_timeout");
    assert!(buf[..n].starts_with(b"HTTP/1.1 400 Bad Request\r\n"));
    s.wait_error_log("client sent invalid method while reading client request line");
}

#[test]
fn http_0_9_gets_the_body_alone() {
    let s = server();
    assert_eq!(s.raw(b"GET /a.txt\r\n"), b"a text\n");
    let out = s.raw(b"GET /ret\r\nHost: other.test\r\n\r\n");
    assert_eq!(
        out,
        b"m=GET u=/ret a= r=/ret p= h=main.test hh=\n",
        "{}",
        String::from_utf8_lossy(&out)
    );
    // Only GET is HTTP/0.9; the refusal has no head either.
    let out = s.raw(b"HEAD /ret\r\n");
    assert!(out.starts_with(b"<html>\r\n<head><title>400 Bad Request"));
}

#[test]
fn versions_and_targets_nginx_accepts() {
    let s = server();
    let body = |req: &[u8]| {
        let r = Resp::parse(&s.raw(req)).expect("response");
        (r.status, r.body_str())
    };
    assert_eq!(
        body(b"GET  /ret  HTTP/1.7 \r\nHost: a\r\nConnection: close\r\n\r\n"),
        (200, "m=GET u=/ret a= r=/ret p=HTTP/1.7  h=a hh=a\n".into())
    );
    assert_eq!(
        body(b"GET ftp://B.test:8/ret?q HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
        (
            200,
            "m=GET u=/ret a=q r=/ret?q p=HTTP/1.1 h=b.test hh=a\n".into()
        )
    );
    assert_eq!(
        body(b"GET /ret HTTP/2.0\r\nHost: a\r\n\r\n").0,
        505,
        "a major version above 1"
    );
    // A directory's redirect keeps the arguments as sent; without a Host
    // it names the local address.
    let r = Resp::parse(&s.raw(b"GET /dir?x=1&y=%41 HTTP/1.0\r\n\r\n")).expect("response");
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("Location"),
        Some(format!("http://127.0.0.1:{}/dir/?x=1&y=%41", s.port).as_str())
    );
}
