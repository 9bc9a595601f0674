//! HTTP/2 request bodies as nginx buffers them (one buffer of
//! `client_body_buffer_size`, then a temp file, where HTTP/1 keeps a body
//! up to 1.25 times that size in memory when its length says it fits),
//! the temp file's log line, and `post_action` over HTTP/2. The expected
//! answers are nginx 1.22's on the same configuration.

use std::process::Command;

use crate::harness::*;
use crate::origin::Origin;

/// curl with `args`; the value of the response's `X-F` field (the
/// body's temp file) or "" without one.
fn body_file(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "-o", "/dev/null", "-D", "-"])
        .args(args)
        .output()
        .expect("curl");
    let head = String::from_utf8_lossy(&out.stdout).to_string();
    head.lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("x-f").then(|| v.trim().to_string())
        })
        .unwrap_or_default()
}

#[test]
fn an_h2_body_longer_than_client_body_buffer_size_goes_to_a_temp_file() {
    // h2_auth_request.t 2: a 600-byte body over HTTP/2 with a 512-byte
    // buffer has `$request_body_file`.
    let o = Origin::start(|_| Some(Origin::ok("ok", "")));
    let conf = format!(
        "error_log logs/error.log info;
        http {{ access_log off; server {{ listen 127.0.0.1:@PORT@ http2;
            location /p {{ client_body_buffer_size 512; proxy_pass http://127.0.0.1:{};
                add_header X-F $request_body_file always; }}
            location /only {{ client_body_in_file_only on; proxy_pass http://127.0.0.1:{};
                add_header X-F $request_body_file always; }}
          }} }}",
        o.port, o.port
    );
    let p = Prefix::new();
    for n in [511, 512, 513, 599] {
        p.write(&format!("b{n}"), "A".repeat(n));
    }
    let s = Server::start_in(p, &conf);
    let url = s.url("/p");
    let data = |n: usize| format!("@{}", s.prefix.path(&format!("b{n}")).display());
    let h2 = |n: usize, extra: &[&str]| {
        let d = data(n);
        let mut a = vec!["--http2-prior-knowledge", "--data-binary", &d, &url];
        a.extend_from_slice(extra);
        body_file(&a)
    };
    let temp = s.prefix.path("client_body_temp");
    let temp = temp.display().to_string();
    // Longer than the buffer: a file; up to its size: memory.
    assert!(h2(599, &[]).starts_with(&temp), "599 bytes over h2");
    assert_eq!(h2(512, &[]), "", "512 bytes over h2");
    assert_eq!(h2(511, &[]), "", "511 bytes over h2");
    // Without a content-length (curl leaves it out for a chunked upload
    // over h2), the same rule as the body arrives.
    let chunked = ["-H", "Transfer-Encoding: chunked"];
    assert!(h2(513, &chunked).starts_with(&temp), "513 bytes, no length");
    assert_eq!(h2(512, &chunked), "", "512 bytes, no length");
    // HTTP/1.1 with a length keeps up to 1.25 times the buffer in memory.
    let d = data(599);
    assert_eq!(
        body_file(&["--data-binary", &d, &url]),
        "",
        "599 bytes over HTTP/1.1"
    );
    let log = s.error_log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("a client request body is buffered to a temporary file "))
        .collect();
    assert_eq!(lines.len(), 2, "one line per body in a file:\n{log}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("[warn]") && l.contains("request: \"POST /p HTTP/2.0\"")),
        "{log}"
    );
    // client_body_in_file_only: the file's line is a notice, as nginx's.
    let only = s.url("/only");
    assert!(body_file(&["--data-binary", "abc", &only]).starts_with(&temp));
    let log = wait_log(&s.prefix, "logs/error.log", "[notice]");
    assert!(
        log.lines().any(|l| l.contains("[notice]")
            && l.contains("a client request body is buffered to a temporary file ")
            && l.contains("request: \"POST /only HTTP/1.1\"")),
        "{log}"
    );
}

#[test]
fn post_action_runs_over_h2() {
    // As over HTTP/1 (post_action.t): the client gets the location's
    // answer; the post action's request reaches the origin after it, and
    // the access log has the last URI with the client's status.
    let o = Origin::start(|_| Some(Origin::ok("HIDDEN", "")));
    let conf = format!(
        "http {{ log_format t \"$uri $status $server_protocol\";
          server {{ listen 127.0.0.1:@PORT@ http2; access_log logs/t.log t;
            location / {{ post_action /post; return 200 \"main\\n\"; }}
            location /post {{ proxy_pass http://127.0.0.1:{}/seen; }}
          }} }}",
        o.port
    );
    let s = Server::start(&conf);
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "--http2-prior-knowledge"])
        .arg(s.url("/"))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "main\n");
    eventually(10, "the post action's request", || o.count() == 1);
    assert!(
        o.requests()[0].starts_with("GET /seen HTTP/1.0\r\n"),
        "{:?}",
        o.requests()
    );
    assert_eq!(
        wait_log(&s.prefix, "logs/t.log", "/post"),
        "/post 200 HTTP/2.0\n"
    );
}
