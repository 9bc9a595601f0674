//! Odd answers from a proxied server, relayed by nginx and by tern.
//!
//! A scripted origin answers each request with the raw bytes of the case
//! its path names (odd status lines, header lines nginx passes, skips or
//! refuses, odd framing); the same configuration runs on the real nginx
//! and on tern, each request goes to both, and the answers (after the
//! normalising below) and the error-log lines each request caused must be
//! the same. The cases where tern deliberately answers otherwise
//! (DIFFERENCES.md: an HTTP/0.9 answer, an interim 1xx answer) are
//! checked for that difference, against nginx too.
//!
//! Skipped (with a message) when nginx is not installed; `.ci/run`
//! installs it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::differential::exchange;
use crate::harness::*;
use crate::origin::Origin;

const B: &str = "Content-Length: 3\r\n\r\nabc";

/// Answers nginx and tern relay alike: (name, what the origin sends).
fn corpus() -> Vec<(&'static str, Vec<u8>)> {
    let s = |name: &'static str, head: &str, rest: &str| (name, format!("{}{}", head, rest));
    let mut c = vec![
        // Status lines: relayed verbatim.
        s("ok", "HTTP/1.1 200 OK\r\n", B),
        s("found", "HTTP/1.1 302 Found\r\nLocation: /x\r\n", B),
        s("internal", "HTTP/1.1 500 Internal\r\n", B),
        s("noreason", "HTTP/1.1 200\r\n", B),
        s("noreason_sp", "HTTP/1.1 200 \r\n", B),
        s("reason_custom", "HTTP/1.1 200 Everything Fine\r\n", B),
        s("s299", "HTTP/1.1 299 Custom\r\n", B),
        s("s999", "HTTP/1.1 999 Nine\r\n", B),
        s("s600", "HTTP/1.1 600 X\r\n", B),
        s("s099", "HTTP/1.1 099 X\r\n", B),
        s("s404", "HTTP/1.1 404 Not Here\r\n", B),
        s("s404std", "HTTP/1.1 404 Not Found\r\n", B),
        s("s418", "HTTP/1.1 418 Teapot\r\n", B),
        s("s403dot", "HTTP/1.1 403.1 Forbidden\r\n", B),
        s("s304", "HTTP/1.1 304 Not Modified\r\n", "\r\n"),
        s("v10", "HTTP/1.0 200 OK\r\n", B),
        s("v12", "HTTP/1.2 200 OK\r\n", B),
        s("v20", "HTTP/2.0 200 OK\r\n", B),
        s("v110", "HTTP/1.10 200 OK\r\n", B),
        s("v101", "HTTP/10.1 200 OK\r\n", B),
        s("v1999", "HTTP/1.999 200 OK\r\n", B),
        s("v999_0", "HTTP/999.0 200 OK\r\n", B),
        s("v1_01", "HTTP/1.01 200 OK\r\n", B),
        s("sp_in_version", "HTTP/1.1  200 OK\r\n", B),
        s("nul_reason", "HTTP/1.1 200 O\x00K\r\n", B),
        s("ctl_reason", "HTTP/1.1 200 O\x01K\r\n", B),
        s("utf_reason", "HTTP/1.1 200 \u{e9}t\u{e9}\r\n", B),
        s("lf_only", "HTTP/1.1 200 OK\nContent-Length: 3\nX-A: b\n", "\nabc"),
        // Header lines nginx passes.
        s("hdr_nocolon", "HTTP/1.1 200 OK\r\nNoColonHere\r\n", B),
        s("hdr_at", "HTTP/1.1 200 OK\r\nX@Y: z\r\n", B),
        s("hdr_underscore", "HTTP/1.1 200 OK\r\nX_Y: z\r\n", B),
        s("hdr_dot", "HTTP/1.1 200 OK\r\nX.Y: z\r\n", B),
        s("hdr_slash", "HTTP/1.1 200 OK\r\nX/Y: z\r\n", B),
        s("hdr_utf8_name", "HTTP/1.1 200 OK\r\nX\u{e9}: b\r\n", B),
        s("hdr_ctl_val", "HTTP/1.1 200 OK\r\nX-Y: a\x01b\r\n", B),
        s("hdr_del_val", "HTTP/1.1 200 OK\r\nX-Y: a\x7fb\r\n", B),
        s("hdr_8bit_val", "HTTP/1.1 200 OK\r\nX-Y: caf\u{e9}\r\n", B),
        s("hdr_empty_val", "HTTP/1.1 200 OK\r\nX-E:\r\n", B),
        s("hdr_empty_val_sp", "HTTP/1.1 200 OK\r\nX-E: \r\n", B),
        s("hdr_tab_val", "HTTP/1.1 200 OK\r\nX-T:\tv\t\r\n", B),
        s("hdr_trail_sp", "HTTP/1.1 200 OK\r\nX-T: a b   \r\n", B),
        s("hdr_dup_http", "HTTP/1.1 200 OK\r\nHTTP/1.1 200 OK\r\n", B),
        s("hdr_crcr", "HTTP/1.1 200 OK\r\nX-A: 1\r\r\n", B),
        s("hdr_name_crcr", "HTTP/1.1 200 OK\r\nNoColon\r\r\n", B),
        s("status_hdr", "HTTP/1.1 200 OK\r\nStatus: 404\r\n", B),
        s(
            "conn_hdrs",
            "HTTP/1.1 200 OK\r\nConnection: close, X-Drop\r\nX-Drop: 1\r\nKeep-Alive: timeout=5\r\n",
            B,
        ),
        // Header lines nginx refuses (502, and what it logs).
        s("hdr_space_name", "HTTP/1.1 200 OK\r\nFoo Bar: x\r\n", B),
        s("hdr_space_colon", "HTTP/1.1 200 OK\r\nFoo : x\r\n", B),
        s("hdr_ctl_name", "HTTP/1.1 200 OK\r\nX\x01Y: z\r\n", B),
        s("hdr_nul_val", "HTTP/1.1 200 OK\r\nX-Y: a\x00b\r\n", B),
        s("hdr_nul_name", "HTTP/1.1 200 OK\r\nX\x00Y: b\r\n", B),
        s("hdr_empty_name", "HTTP/1.1 200 OK\r\n: b\r\n", B),
        s("hdr_colon_first", "HTTP/1.1 200 OK\r\n:x: b\r\n", B),
        s("hdr_fold", "HTTP/1.1 200 OK\r\nX-F: a\r\n b\r\n", B),
        s("hdr_bare_cr", "HTTP/1.1 200 OK\r\nX-C: a\rb\r\n", B),
        s("hdr_crcrz", "HTTP/1.1 200 OK\r\nX-A: 1  \r\rz\r\n", B),
        s("end_cr_x", "HTTP/1.1 200 OK\r\nX-A: 1\r\n\rX", B),
        // Last-Modified and Content-Type: where nginx writes them.
        s(
            "lm",
            "HTTP/1.1 200 OK\r\nX-A: 1\r\nLast-Modified: Tue, 01 Jan 2019 00:00:00 GMT\r\nX-B: 2\r\n",
            B,
        ),
        s(
            "lm_bad",
            "HTTP/1.1 200 OK\r\nX-A: 1\r\nLast-Modified: yesterday\r\nX-B: 2\r\n",
            B,
        ),
        s(
            "lm_404",
            "HTTP/1.1 404 Not Found\r\nLast-Modified: Tue, 01 Jan 2019 00:00:00 GMT\r\nX-B: 2\r\n",
            B,
        ),
        s(
            "lm_two",
            "HTTP/1.1 200 OK\r\nLast-Modified: Tue, 01 Jan 2019 00:00:00 GMT\r\nLast-Modified: Wed, 02 Jan 2019 00:00:00 GMT\r\n",
            B,
        ),
        s(
            "ct_order",
            "HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Type: text/x\r\nX-B: 2\r\n",
            B,
        ),
        // Framing.
        s(
            "chunked",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "3\r\nabc\r\n0\r\n\r\n",
        ),
        s(
            "chunked_ext",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nT: x\r\n\r\n",
        ),
        s(
            "chunked_10",
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "3\r\nabc\r\n0\r\n\r\n",
        ),
        s(
            "chunked_cl",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 100\r\n\r\n",
            "3\r\nabc\r\n0\r\n\r\n",
        ),
        s(
            "chunked_bad",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "zz\r\nabc\r\n0\r\n\r\n",
        ),
        s(
            "chunked_extra",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "3\r\nabc\r\n0\r\n\r\nEXTRA",
        ),
        s(
            "te_gzip_chunked",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "3\r\nabc\r\n0\r\n\r\n",
        ),
        s("close_body", "HTTP/1.1 200 OK\r\n\r\n", "abc"),
        s("cl_bad", "HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", "xyz"),
        s("cl_neg", "HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "xyz"),
        s("cl_plus", "HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\n", "xyz"),
        s("cl_comma", "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n", "xyz"),
        s("cl_empty", "HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n", "xyz"),
        s(
            "cl_huge",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            "xyz",
        ),
        s(
            "cl_dup_diff",
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
            "xyz",
        ),
        s("cl_long", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", "xyz"),
        // No answer, or half of one.
        s("empty", "", ""),
        s("line_only", "HTTP/1.1 200 OK\r\n", ""),
        s("no_end", "HTTP/1.1 200 OK\r\nX-A: 1\r\n", ""),
    ];
    let chunks: String = (0..2000).map(|_| "5\r\nhello\r\n").collect();
    c.push(s(
        "big_chunked",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        &format!("{}0\r\n\r\n", chunks),
    ));
    c.push(s(
        "big_bad_cl",
        "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        &"y".repeat(100_000),
    ));
    c.push(s(
        "many_headers",
        &format!(
            "HTTP/1.1 200 OK\r\n{}",
            (0..120)
                .map(|i| format!("X-H{}: v\r\n", i))
                .collect::<String>()
        ),
        B,
    ));
    // Bytes as sent: the `\u{e9}` above are two UTF-8 bytes, as a server
    // would send them.
    c.into_iter().map(|(n, a)| (n, a.into_bytes())).collect()
}

/// Answers nginx 1.22 passes on raw, as HTTP/0.9, which tern refuses
/// with 502 (DIFFERENCES.md).
const NOT_HTTP: &[(&str, &str)] = &[
    ("garbage", "garbage\r\n\r\nmore"),
    ("html09", "<html>hi</html>\n"),
    ("lower", "http/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"),
    ("icy", "ICY 200 OK\r\nContent-Length: 3\r\n\r\nabc"),
    ("v2", "HTTP/2 200 OK\r\nContent-Length: 3\r\n\r\nabc"),
    ("v09", "HTTP/0.9 200 OK\r\nContent-Length: 3\r\n\r\nabc"),
    ("s2000", "HTTP/1.1 2000 X\r\nContent-Length: 3\r\n\r\nabc"),
    (
        "tab_code",
        "HTTP/1.1 200\tOK\r\nContent-Length: 3\r\n\r\nabc",
    ),
    (
        "lead_crlf",
        "\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
    ),
];

/// Interim answers nginx 1.22 relays as the final one; tern skips them.
const INTERIM: &[(&str, &str)] = &[
    (
        "c100",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
    ),
    (
        "c103",
        "HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
    ),
];

fn conf(origin: u16) -> String {
    format!(
        r#"
worker_processes 1;
error_log logs/error.log warn;
events {{}}
http {{
    access_log off;
    server {{
        listen 127.0.0.1:@PORT@;
        server_name up.test;
        location /c/ {{ proxy_pass http://127.0.0.1:{o}; }}
        location /nb/ {{ proxy_buffering off; proxy_pass http://127.0.0.1:{o}/c/; }}
        location /ie/ {{
            proxy_intercept_errors on;
            error_page 404 500 /err;
            proxy_pass http://127.0.0.1:{o}/c/;
        }}
        location = /err {{ return 200 "error page\n"; }}
    }}
}}
"#,
        o = origin
    )
}

/// The ways each case is asked for: buffered, unbuffered, an HTTP/1.0
/// client, with intercepted errors, HEAD, and conditional with a range
/// (which a response not being cached passes as it came).
const ASKS: &[&str] = &[
    "GET /c/{} HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n",
    "GET /nb/{} HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n",
    "GET /c/{} HTTP/1.0\r\nHost: up.test\r\n\r\n",
    "GET /ie/{} HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n",
    "HEAD /c/{} HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n",
    "GET /c/{} HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\
     If-Modified-Since: Tue, 01 Jan 2019 00:00:00 GMT\r\nRange: bytes=0-0\r\n\
     If-Range: Tue, 01 Jan 2019 00:00:00 GMT\r\n\r\n",
];

/// What may differ: Date, Server, the server's name in error pages (and
/// so their length), the listening port, and where a chunked body is cut
/// into chunks (nginx's buffers): such a body is compared decoded.
pub(crate) fn normalize(raw: &[u8], port: u16) -> String {
    let text = String::from_utf8_lossy(raw).replace(&format!(":{}", port), ":PORT");
    let (head, body) = match text.find("\r\n\r\n") {
        Some(i) => (&text[..i + 4], &text[i + 4..]),
        None => (&text[..], ""),
    };
    let error_page = head.contains("\r\nContent-Type: text/html\r\n")
        && (head.starts_with("HTTP/1.1 4") || head.starts_with("HTTP/1.1 5"));
    let mut out = String::new();
    for line in head.split_inclusive("\r\n") {
        if line.starts_with("Date: ") {
            out.push_str("Date: X\r\n");
        } else if line.starts_with("Server: ") {
            out.push_str("Server: X\r\n");
        } else if error_page && line.starts_with("Content-Length: ") {
            out.push_str("Content-Length: N\r\n");
        } else {
            out.push_str(line);
        }
    }
    let body = body
        .replace(
            "<hr><center>nginx/1.22.1</center>",
            "<hr><center>S</center>",
        )
        .replace(
            &format!("<hr><center>tern/{}</center>", env!("CARGO_PKG_VERSION")),
            "<hr><center>S</center>",
        );
    if head.contains("\r\nTransfer-Encoding: chunked\r\n") {
        if let Some(d) = dechunk(body.as_bytes()) {
            out.push_str("<decoded>");
            out.push_str(&String::from_utf8_lossy(&d));
            return out;
        }
    }
    out.push_str(&body);
    out
}

/// A chunked body decoded, and what followed its last chunk; None if it
/// is not whole.
fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = find(b, b"\r\n")?;
        let size = std::str::from_utf8(&b[..eol]).ok()?;
        let n = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        b = &b[eol + 2..];
        if n == 0 {
            out.extend_from_slice(b"<end>");
            out.extend_from_slice(b);
            return Some(out);
        }
        out.extend_from_slice(b.get(..n)?);
        b = b.get(n + 2..)?;
    }
}

/// The error-log lines of each request (by its request line), without
/// time, process and connection numbers, sorted.
pub(crate) fn log_lines(p: &Prefix) -> BTreeMap<String, Vec<String>> {
    let mut by_req: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in p.read("logs/error.log").lines() {
        let Some(r) = line.find("request: \"") else {
            continue;
        };
        let req = line[r..].split('"').nth(1).unwrap_or("").to_string();
        // "2024/01/01 00:00:00 [error] 12#12: *3 text" -> "[error] text"
        let mut parts = line.splitn(5, ' ');
        let level = parts.nth(2).unwrap_or("");
        let rest = parts.nth(1).unwrap_or("");
        let text = match rest.split_once(' ') {
            Some((c, t)) if c.starts_with('*') => t,
            _ => rest,
        };
        by_req
            .entry(req)
            .or_default()
            .push(format!("{} {}", level, text));
    }
    for v in by_req.values_mut() {
        v.sort();
    }
    by_req
}

/// The scripted origin: the answer named by the last path segment.
fn origin(cases: Vec<(String, Vec<u8>)>) -> Origin {
    Origin::start(move |head| {
        let path = head.split(' ').nth(1)?;
        let name = path.rsplit('/').next()?;
        cases
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.clone())
            .or_else(|| Some(b"HTTP/1.1 404 X\r\nContent-Length: 0\r\n\r\n".to_vec()))
    })
}

/// nginx (and its port) and tern on the same configuration, in front
/// of `o`.
fn pair(o: &Origin) -> Option<(Prefix, u16, Nginx, Server)> {
    if !nginx_installed() {
        return None;
    }
    let pn = Prefix::new();
    let nport = free_port();
    let nginx = start_nginx(&pn, &conf(o.port), nport)?;
    let tern = Server::start(&conf(o.port));
    Some((pn, nport, nginx, tern))
}

#[test]
fn odd_upstream_answers_relayed_as_nginx_relays_them() {
    let cases = corpus();
    let o = origin(
        cases
            .iter()
            .map(|(n, a)| (n.to_string(), a.clone()))
            .collect(),
    );
    let Some((pn, nport, nginx, tern)) = pair(&o) else {
        return;
    };
    let mut diffs = Vec::new();
    let mut asked = 0;
    for (name, _) in &cases {
        for ask in ASKS {
            let req = ask.replace("{}", name);
            let a = normalize(&exchange(nport, req.as_bytes()), nport);
            let b = normalize(&exchange(tern.port, req.as_bytes()), tern.port);
            asked += 1;
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
    // tern's log lines are written by a writer thread: give it a moment.
    std::thread::sleep(Duration::from_millis(300));
    let (ln, lt) = (log_lines(&pn), log_lines(&tern.prefix));
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
        diffs.iter().take(10).cloned().collect::<String>()
    );
}

#[test]
fn answers_nginx_passes_raw_or_as_interim_are_kept_apart() {
    let cases: Vec<(String, Vec<u8>)> = NOT_HTTP
        .iter()
        .chain(INTERIM)
        .map(|(n, a)| (n.to_string(), a.as_bytes().to_vec()))
        .collect();
    let o = origin(cases);
    let Some((pn, nport, nginx, tern)) = pair(&o) else {
        return;
    };
    for (name, answer) in NOT_HTTP {
        let req = format!("GET /c/{} HTTP/1.0\r\nHost: up.test\r\n\r\n", name);
        // nginx: the bytes as they came (HTTP/0.9), no head of its own.
        let a = exchange(nport, req.as_bytes());
        assert_eq!(
            String::from_utf8_lossy(&a),
            *answer,
            "nginx no longer passes {} raw",
            name
        );
        // tern: 502, logged with nginx's words for such an answer.
        let b = exchange(tern.port, req.as_bytes());
        let r = Resp::parse(&b).expect("an answer");
        assert_eq!(r.status, 502, "{}", name);
        let said = format!(
            "upstream sent no valid HTTP/1.0 header while reading response header from upstream, client: 127.0.0.1, server: up.test, request: \"GET /c/{} HTTP/1.0\"",
            name
        );
        wait_log(&pn, "logs/error.log", &said);
        tern.wait_error_log(&said);
    }
    for (name, _) in INTERIM {
        let req = format!(
            "GET /c/{} HTTP/1.1\r\nHost: up.test\r\nConnection: close\r\n\r\n",
            name
        );
        // nginx relays the interim answer as the final one, the real
        // answer after it as its body; tern relays the real answer.
        let a = exchange(nport, req.as_bytes());
        let r = Resp::parse(&a).expect("nginx answers");
        assert!(
            (100..200).contains(&r.status),
            "{}: nginx {}",
            name,
            r.status
        );
        assert!(find(&a, b"\r\n\r\nHTTP/1.1 200 OK\r\n").is_some());
        let b = exchange(tern.port, req.as_bytes());
        let r = Resp::parse(&b).expect("tern answers");
        assert_eq!((r.status, &r.body[..]), (200, &b"abc"[..]), "{}", name);
    }
    drop(nginx);
}
