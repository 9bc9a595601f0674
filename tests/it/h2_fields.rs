//! HTTP/2 requests as tern builds them from the fields of HEADERS (no
//! HTTP/1 head in between): `$request`, Host from `:authority`, cookies
//! joined, `$http_NAME` for names with underscores; nginx's limits on the
//! header list (large_client_header_buffers: names and values counted,
//! GOAWAY ENHANCE_YOUR_CALM past them); and an unread upload that is still
//! coming does not hold the answer (RST_STREAM NO_ERROR after it).

use std::io::Write;
use std::process::Command;

use crate::h2::{frame, frame_types, h2c, hpack_int, literal};
use crate::harness::Server;

fn curl_h2(port: u16, args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "--http2-prior-knowledge"])
        .args(args)
        .arg(format!("http://127.0.0.1:{port}/v?a=1"))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn request_from_fields() {
    let s = Server::start(
        r#"
http {
    server {
        listen 127.0.0.1:@PORT@ http2;
        server_name localhost;
        underscores_in_headers on;
        location / {
            return 200 "$request|$host|$http_host|$http_cookie|$cookie_b|$http_x_foo|$request_uri|$server_protocol\n";
        }
    }
}
"#,
    );
    let body = curl_h2(
        s.port,
        &[
            "-H",
            "Cookie: a=1",
            "-H",
            "Cookie: b=2",
            "-H",
            "x_foo: bar",
            "--path-as-is",
        ],
    );
    assert_eq!(
        body,
        format!(
            "GET /v?a=1 HTTP/2.0|127.0.0.1|127.0.0.1:{}|a=1; b=2|2|bar|/v?a=1|HTTP/2.0\n",
            s.port
        )
    );
    // The same over HTTP/1.1: `$http_x_foo` finds `x_foo` there too.
    let out = s.curl(&["-H", "x_foo: baz", &s.url("/")]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("|baz|/|HTTP/1.1"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// GET /t.html for localhost, then `extra` fields, END_STREAM if `end`.
fn headers(id: u32, end: bool, extra: &[(&str, usize)]) -> Vec<u8> {
    // :method GET, :scheme http, :path (literal, indexed name 4),
    // :authority localhost (indexed name 1).
    let mut b = vec![0x82, 0x86, 0x04];
    hpack_int(&mut b, 0, 7, 7);
    b.extend_from_slice(b"/t.html");
    b.push(0x01);
    hpack_int(&mut b, 0, 7, 9);
    b.extend_from_slice(b"localhost");
    for (name, n) in extra {
        literal(&mut b, name, &vec![b'x'; *n]);
    }
    frame(1, if end { 0x5 } else { 0x4 }, id, &b)
}

#[test]
fn header_list_is_limited_as_nginx_counts_it() {
    let s = Server::start(
        r#"
error_log logs/error.log info;
http {
    server {
        listen 127.0.0.1:@PORT@ http2;
        server_name localhost;
        large_client_header_buffers 1 512;
        root html;
    }
}
"#,
    );
    s.prefix.write("html/t.html", "SEE-THIS");
    // Pseudo-headers: 7+3 + 7+4 + 5+7 + 10+9 = 52 bytes; "longname" 8.
    // 52 + 8 + 452 = 512: at the limit (h2's own count, 32 bytes more per
    // field, would be past it).
    let mut c = h2c(s.port);
    c.write_all(&headers(1, true, &[("longname", 452)]))
        .expect("headers");
    c.write_all(&frame(7, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 0]))
        .expect("goaway");
    let types = frame_types(&mut c, 1 << 20);
    assert!(types.contains(&(1, 0)), "answered: {types:?}");
    assert!(types.contains(&(0, 0)), "with its body: {types:?}");
    // One byte more: GOAWAY ENHANCE_YOUR_CALM, no answer.
    let mut c = h2c(s.port);
    c.write_all(&headers(1, true, &[("longname", 453)]))
        .expect("headers");
    let types = frame_types(&mut c, 1 << 20);
    assert!(types.contains(&(7, 0xb)), "GOAWAY 0xb: {types:?}");
    assert!(!types.iter().any(|t| t.0 == 0), "no DATA: {types:?}");
    crate::harness::eventually(5, "the log line", || {
        s.error_log().contains("client sent too large header")
    });
}

#[test]
fn unread_body_still_coming_does_not_hold_the_answer() {
    let s = Server::start(
        r#"
http {
    server {
        listen 127.0.0.1:@PORT@ http2;
        server_name localhost;
        root html;
    }
}
"#,
    );
    s.prefix.write("html/t.html", "SEE-THIS");
    let mut c = h2c(s.port);
    // HEADERS without END_STREAM and the first 20000 bytes of an upload
    // (past 16 KiB): the static file is served without waiting for the
    // rest, then RST_STREAM NO_ERROR asks the client to stop sending.
    c.write_all(&headers(1, false, &[])).expect("headers");
    c.write_all(&frame(0, 0, 1, &[b'u'; 10000])).expect("data");
    c.write_all(&frame(0, 0, 1, &[b'u'; 10000])).expect("data");
    let mut seen = Vec::new();
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16384];
    while !seen.contains(&3u8) {
        use std::io::Read;
        let n = c
            .read(&mut tmp)
            .expect("the answer, within the read timeout");
        assert!(n > 0, "closed early: {seen:?}");
        buf.extend_from_slice(&tmp[..n]);
        seen.clear();
        let mut i = 0;
        while i + 9 <= buf.len() {
            let len = u32::from_be_bytes([0, buf[i], buf[i + 1], buf[i + 2]]) as usize;
            if i + 9 + len > buf.len() {
                break;
            }
            seen.push(buf[i + 3]);
            if buf[i + 3] == 3 {
                let code = u32::from_be_bytes([buf[i + 9], buf[i + 10], buf[i + 11], buf[i + 12]]);
                assert_eq!(code, 0, "RST_STREAM NO_ERROR");
            }
            i += 9 + len;
        }
    }
    let at = |t: u8| seen.iter().position(|&x| x == t);
    assert!(
        at(1).is_some() && at(0).is_some() && at(1) < at(3) && at(0) < at(3),
        "HEADERS and DATA, then RST_STREAM: {seen:?}"
    );
}
