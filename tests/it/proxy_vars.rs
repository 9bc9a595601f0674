//! `proxy_pass` with variables (an `upstream` block by name, a host
//! resolved by `resolver` against a DNS responder run by the test, a
//! URI part replacing the URI), `unix:` upstreams, and `proxy_redirect`
//! in all its forms; the real nginx is the oracle where it is installed:
//! status, what reached the backend (request line and Host) and the
//! rewritten headers are compared.

use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::harness::{self, free_port, nginx_installed, raw, start_nginx, Prefix, Resp, Server};

/// A DNS responder on loopback: `*.good.test` and `good.test` have the A
/// record 127.0.0.1 (TTL 3600), `nx.test` is NXDOMAIN, `fail.test` a
/// server failure; AAAA queries get no answers. Counts the A queries.
fn dns_responder() -> (u16, Arc<AtomicUsize>) {
    harness::dns_responder(|name, qtype| {
        let rcode = match name {
            "nx.test" => 3,
            "fail.test" => 2,
            _ => 0,
        };
        let found = qtype == 1 && rcode == 0 && name.ends_with("good.test");
        (rcode, if found { vec![[127, 0, 0, 1]] } else { vec![] })
    })
}

/// Answers each request with its request line and Host header.
fn echo_head(mut s: impl Read + Write) {
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let line = text.lines().next().unwrap_or("").to_string();
    let host = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("host:"))
        .unwrap_or("")
        .to_string();
    let body = format!("{} | {}\n", line, host);
    let _ = write!(
        s,
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{}",
        body.len(),
        body
    );
}

fn tcp_backend() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || echo_head(s));
        }
    });
    port
}

fn unix_backend(path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).expect("bind unix");
    // Workers run as nobody under root.
    let _ = std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o777));
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || echo_head(s));
        }
    });
}

/// Status, the headers named, and the body (an error page as its status).
fn answer(port: u16, path: &str, headers: &[&str]) -> String {
    let req = format!("GET {} HTTP/1.0\r\nHost: client.test\r\n\r\n", path);
    let got = raw(port, req.as_bytes());
    let r = Resp::parse(&got).unwrap_or_else(|| {
        panic!(
            "no response to {}: {:?}",
            path,
            String::from_utf8_lossy(&got)
        )
    });
    let body = r.body_str();
    let body = if body.contains("<html>") {
        "(error page)".to_string()
    } else {
        body.trim_end().to_string()
    };
    let mut out = format!("{} {} {}", path, r.status, body);
    for h in headers {
        if let Some(v) = r.header(h) {
            out.push_str(&format!("\n  {}: {}", h, v));
        }
    }
    out
}

/// The answers of tern, compared with nginx's when it is installed (the
/// port of the server under test written as PORT); the error logs.
/// `log_lines`: what tern's error log is to have (waited for).
fn both(body: &str, paths: &[&str], headers: &[&str], log_lines: &[&str]) -> (Vec<String>, String) {
    let tern = Server::start(body);
    let norm = |s: String, port: u16| s.replace(&port.to_string(), "PORT");
    let ours: Vec<String> = paths
        .iter()
        .map(|p| norm(answer(tern.port, p, headers), tern.port))
        .collect();
    for l in log_lines {
        tern.wait_error_log(l);
    }
    let log = tern.error_log();
    drop(tern);
    if nginx_installed() {
        let p = Prefix::new();
        let port = free_port();
        let Some(_nginx) = start_nginx(&p, body, port) else {
            panic!("nginx did not start: {}", p.read("logs/error.log"));
        };
        let theirs: Vec<String> = paths
            .iter()
            .map(|p| norm(answer(port, p, headers), port))
            .collect();
        assert_eq!(
            ours.join("\n"),
            theirs.join("\n"),
            "\ntern:\n{}\nnginx:\n{}\ntern's log:\n{}",
            ours.join("\n"),
            theirs.join("\n"),
            log
        );
    }
    (ours, log)
}

#[test]
fn proxy_pass_with_variables_resolves_as_nginx() {
    let (dns, _) = dns_responder();
    let b = tcp_backend();
    let body = format!(
        "http {{ access_log off;\n\
         upstream named {{ server 127.0.0.1:{b}; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /v/ {{ resolver 127.0.0.1:{dns} valid=1h; resolver_timeout 5s;\n\
             proxy_pass http://$arg_h:{b}; }}\n\
           location /uri/ {{ resolver 127.0.0.1:{dns}; proxy_pass http://$arg_h:{b}/base$uri; }}\n\
           location /up/ {{ proxy_pass http://$arg_u; }}\n\
           location /upuri/ {{ proxy_pass http://$arg_u/fixed?a=b; }}\n\
           location /nores/ {{ proxy_pass http://$arg_h:{b}; }}\n\
           location /bad/ {{ proxy_pass $arg_url; }}\n\
         }}\n\
         }}\n"
    );
    let paths = [
        "/v/x?h=good.test",
        "/v/y?h=a.good.test",
        "/v/again?h=good.test",
        "/v/nx?h=nx.test",
        "/v/fail?h=fail.test",
        "/v/ip?h=127.0.0.1",
        "/uri/p/q?h=good.test&z=1",
        "/up/w?u=named",
        "/up/w?u=NAMED",
        "/upuri/w?u=named",
        "/nores/x?h=good.test",
        "/bad/?url=ftp://x",
    ];
    let lines = [
        "nx.test could not be resolved (3: Host not found)",
        "fail.test could not be resolved (2: Server failure)",
        "no resolver defined to resolve good.test",
        "invalid URL prefix in \"ftp://x\"",
    ];
    let (ours, _) = both(&body, &paths, &[], &lines);
    let text = ours.join("\n");
    for want in [
        &format!("/v/x?h=good.test 200 GET /v/x?h=good.test HTTP/1.0 | Host: good.test:{b}"),
        &format!("/v/y?h=a.good.test 200 GET /v/y?h=a.good.test HTTP/1.0 | Host: a.good.test:{b}"),
        "/v/nx?h=nx.test 502",
        "/v/fail?h=fail.test 502",
        &format!("/uri/p/q?h=good.test&z=1 200 GET /base/uri/p/q HTTP/1.0 | Host: good.test:{b}"),
        "/up/w?u=named 200 GET /up/w?u=named HTTP/1.0 | Host: named",
        "/upuri/w?u=named 200 GET /fixed?a=b HTTP/1.0 | Host: named",
        "/nores/x?h=good.test 502",
        "/bad/?url=ftp://x 500",
    ] {
        assert!(text.contains(want), "no {:?} in\n{}", want, text);
    }
}

#[test]
fn resolver_answers_are_cached() {
    let (dns, queries) = dns_responder();
    let b = tcp_backend();
    let tern = Server::start(&format!(
        "http {{ access_log off;\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ resolver 127.0.0.1:{dns} valid=1h; proxy_pass http://$arg_h:{b}; }}\n\
         }} }}\n"
    ));
    for _ in 0..3 {
        let r = tern.get("/?h=c.good.test");
        assert_eq!(r.status, 200);
    }
    assert_eq!(
        queries.load(Ordering::SeqCst),
        1,
        "one A query for three requests"
    );
    let r = tern.get("/?h=nx.test");
    assert_eq!(r.status, 502);
    let r = tern.get("/?h=nx.test");
    assert_eq!(r.status, 502);
    // As nginx (ngx_resolver_process_a frees the node on an error), "not
    // found" is not kept: the second request asks again.
    assert_eq!(queries.load(Ordering::SeqCst), 3);
    tern.wait_error_log("nx.test could not be resolved (3: Host not found)");
}

#[test]
fn resolver_timeout_is_nginx_error_110() {
    // A server that never answers.
    let silent = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let dns = silent.local_addr().expect("addr").port();
    let tern = Server::start(&format!(
        "http {{ access_log off;\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ resolver 127.0.0.1:{dns}; resolver_timeout 300ms;\n\
             proxy_pass http://$arg_h:1; }}\n\
         }} }}\n"
    ));
    assert_eq!(tern.get("/?h=slow.test").status, 502);
    tern.wait_error_log("slow.test could not be resolved (110: Operation timed out)");
    drop(silent);
}

#[test]
fn unix_upstreams_as_nginx() {
    let p = Prefix::new();
    let sock = p.path("b.sock");
    unix_backend(&sock);
    let s = sock.display();
    let body = format!(
        "http {{ access_log off;\n\
         upstream u {{ server unix:{s}; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /plain/ {{ proxy_pass http://unix:{s}; }}\n\
           location /uri/ {{ proxy_pass http://unix:{s}:/other/; add_header X-PH $proxy_host; add_header X-PP \"[$proxy_port]\"; }}\n\
           location /block/ {{ proxy_pass http://u; }}\n\
           location /var/ {{ proxy_pass http://$arg_b; }}\n\
         }}\n\
         }}\n"
    );
    let var = format!("/var/x?b=unix:{}:/vv", s);
    let paths = ["/plain/a?x=1", "/uri/a/b", "/block/c", var.as_str()];
    let (ours, _) = both(&body, &paths, &["X-PH", "X-PP"], &[]);
    let text = ours.join("\n");
    for want in [
        "/plain/a?x=1 200 GET /plain/a?x=1 HTTP/1.0 | Host: localhost",
        "/uri/a/b 200 GET /other/a/b HTTP/1.0 | Host: localhost\n  X-PH: localhost\n  X-PP: []",
        "/block/c 200 GET /block/c HTTP/1.0 | Host: u",
        "200 GET /vv HTTP/1.0 | Host: localhost",
    ] {
        assert!(text.contains(want), "no {:?} in\n{}", want, text);
    }
}

#[test]
fn proxy_redirect_rewrites_as_nginx() {
    let b = free_port();
    let body = format!(
        "http {{ access_log off;\n\
         server {{ listen 127.0.0.1:{b};\n\
           location / {{ add_header Refresh \"5; URL=http://127.0.0.1:{b}$uri\";\n\
             return 302 http://127.0.0.1:{b}$uri; }}\n\
           location /rel/ {{ absolute_redirect off; return 302 /rel/target; }}\n\
         }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /impl/ {{ proxy_pass http://127.0.0.1:{b}/up/; }}\n\
           location /noturi/ {{ proxy_pass http://127.0.0.1:{b}; }}\n\
           location /text/ {{ set $v here; proxy_pass http://127.0.0.1:{b};\n\
             proxy_redirect http://127.0.0.1:{b}/text/a/ /$v/;\n\
             proxy_redirect ~^(.+)/text/x_([a-z]+) $1/$2/done;\n\
             proxy_redirect ~*/TEXT/case /caseless;\n\
             proxy_redirect http://$proxy_host/text/ http://other.test/; }}\n\
           location /off/ {{ proxy_pass http://127.0.0.1:{b}; proxy_redirect off;\n\
             location /off/on/ {{ proxy_pass http://127.0.0.1:{b}; proxy_redirect default; }} }}\n\
           location /rel/ {{ proxy_pass http://127.0.0.1:{b}; proxy_redirect http://nomatch/ /; }}\n\
         }}\n\
         }}\n"
    );
    let paths = [
        "/impl/a.html",
        "/noturi/b",
        "/text/a/c.html",
        "/text/b.html",
        "/text/x_cap/y",
        "/text/case",
        "/off/d",
        "/off/on/e",
        "/rel/f",
    ];
    let (ours, _) = both(&body, &paths, &["Location", "Refresh"], &[]);
    let text = ours.join("\n").replace(&b.to_string(), "B");
    for want in [
        "/impl/a.html 302 (error page)\n  Location: http://client.test:PORT/impl/a.html\n  Refresh: 5; URL=/impl/a.html",
        "/text/a/c.html 302 (error page)\n  Location: http://client.test:PORT/here/c.html",
        "/text/b.html 302 (error page)\n  Location: http://other.test/b.html",
        "/text/x_cap/y 302 (error page)\n  Location: http://127.0.0.1:B/cap/done",
        "/off/d 302 (error page)\n  Location: http://127.0.0.1:B/off/d",
        "/off/on/e 302 (error page)\n  Location: http://client.test:PORT/off/on/e",
        "/text/case 302 (error page)\n  Location: http://client.test:PORT/caseless",
        "/rel/f 302 (error page)\n  Location: /rel/target",
    ] {
        assert!(text.contains(want), "no {:?} in\n{}", want, text);
    }
}

#[test]
fn proxy_pass_and_redirect_errors_as_nginx() {
    use crate::harness::ConfTest;
    for (conf, msg) in [
        (
            "location / { proxy_pass http://127.0.0.1:xx/a; }",
            "invalid port in upstream \"127.0.0.1:xx/a\"",
        ),
        (
            "location / { proxy_pass http://unix:; }",
            "no path in the unix domain socket in upstream \"unix:\"",
        ),
        (
            "location / { proxy_redirect default; proxy_pass http://127.0.0.1:1; }",
            "\"proxy_redirect default\" should be placed after the \"proxy_pass\" directive",
        ),
        (
            "location / { proxy_pass http://$host; proxy_redirect default; }",
            "\"proxy_redirect default\" cannot be used with \"proxy_pass\" directive with variables",
        ),
        (
            "location / { proxy_pass http://127.0.0.1:1; proxy_redirect off; proxy_redirect / /; }",
            "\"proxy_redirect\" directive is duplicate",
        ),
        (
            "location / { proxy_pass http://127.0.0.1:1; proxy_redirect on; }",
            "invalid parameter \"on\"",
        ),
    ] {
        let t = ConfTest::run(&format!(
            "events {{}}\nhttp {{\nserver {{ listen 127.0.0.1:1;\n{}\n}} }}\n",
            conf
        ));
        t.assert_says("emerg", msg, 4);
    }
}
