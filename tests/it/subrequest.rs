//! Subrequests: `auth_request` (+ `auth_request_set`, `satisfy`), `mirror`
//! (+ `mirror_request_body`) and `log_subrequest`, compared with the real
//! nginx on the same configuration where the bytes can be compared.

use std::io::Write;
use std::time::Duration;

use crate::harness::{
    free_port, nginx_installed, raw, start_nginx, wait_log, Prefix, Resp, Server,
};
use crate::origin::Origin;

/// A backend server (`b`) in the same configuration decides by
/// `X-Token`; the front server guards static files with it.
fn auth_conf(b: u16) -> String {
    format!(
        r#"http {{
  log_format f '$request_uri $uri $status "$args" $upstream_status';
  access_log logs/access.log f;
  server {{ listen 127.0.0.1:{b};
    location /check {{
      if ($http_x_token = good) {{ return 200 "ok"; }}
      if ($http_x_token = forbid) {{ return 403; }}
      if ($http_x_token = weird) {{ return 302 /x; }}
      add_header X-User bob always;
      add_header WWW-Authenticate 'Bearer realm="t"' always;
      return 401 "no";
    }}
    location /user {{ add_header X-User alice; return 204; }}
  }}
  server {{ listen 127.0.0.1:@PORT@;
    root html;
    auth_request /deny;
    location /a/ {{
      auth_request /auth;
      auth_request_set $user $upstream_http_x_user;
      auth_request_set $st $upstream_status;
      add_header X-User "[$user][$st]" always;
    }}
    location = /auth {{
      internal;
      auth_request off;
      proxy_pass http://127.0.0.1:{b}/check;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
    }}
    location /u/ {{
      auth_request /authu;
      auth_request_set $user $upstream_http_x_user;
      add_header X-User "[$user]";
    }}
    location /s/ {{
      auth_request /authu;
      auth_request_set $args "set$upstream_status";
      add_header X-Args "[$args][$arg_orig]";
    }}
    location = /authu {{ internal; log_subrequest on; proxy_pass http://127.0.0.1:{b}/user; }}
    location = /deny {{ internal; auth_request off; return 403; }}
    location /missing/ {{ auth_request /nothing-here; }}
    location = /nothing-here {{ auth_request off; }}
    location /any/ {{ satisfy any; allow 127.0.0.1; }}
    location /any2/ {{ satisfy any; deny all; auth_request /auth; }}
    location /off/ {{ auth_request off; }}
    location /deep/ {{ auth_request /deep/; }}
  }}
}}
"#
    )
}

fn auth_files(p: &Prefix) {
    for d in [
        "a", "u", "s", "local", "missing", "any", "any2", "off", "deep",
    ] {
        p.write(&format!("html/{}/x.txt", d), format!("{} file\n", d));
    }
}

fn auth_series(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    let cases: &[(&str, &str, &str)] = &[
        ("GET", "/a/x.txt?q=1", "good"),
        ("GET", "/a/x.txt", "forbid"),
        ("GET", "/a/x.txt", "weird"),
        ("GET", "/a/x.txt", ""),
        ("POST", "/a/x.txt", "good"),
        ("HEAD", "/a/x.txt", ""),
        ("GET", "/u/x.txt", ""),
        ("GET", "/s/x.txt?orig=1", ""),
        ("GET", "/local/x.txt", ""),
        ("GET", "/missing/x.txt", ""),
        ("GET", "/any/x.txt", ""),
        ("GET", "/any2/x.txt", ""),
        ("GET", "/any2/x.txt", "good"),
        ("GET", "/any2/x.txt", "forbid"),
        ("GET", "/off/x.txt", ""),
        ("GET", "/auth", "good"),
        ("GET", "/deep/x.txt", ""),
    ];
    for (method, path, token) in cases {
        let tok = if token.is_empty() {
            String::new()
        } else {
            format!("X-Token: {}\r\n", token)
        };
        let body = if *method == "POST" { "hello" } else { "" };
        let req = format!(
            "{} {} HTTP/1.1\r\nHost: x\r\n{}Content-Length: {}\r\n\r\n{}",
            method,
            path,
            tok,
            body.len(),
            body
        );
        let mut s = crate::harness::connect(port);
        s.write_all(req.as_bytes()).expect("write");
        let r = crate::harness::read_response(&mut s).expect("response");
        let b = r.body_str();
        let b = if b.contains("<html>") {
            "(error page)".to_string()
        } else {
            b
        };
        out.push(format!(
            "{} {} {} -> {} {:?} | www-auth {:?} | user {:?} | args {:?} | conn {:?}",
            method,
            path,
            token,
            r.status,
            b,
            r.header("WWW-Authenticate"),
            r.header("X-User"),
            r.header("X-Args"),
            r.header("Connection"),
        ));
    }
    out
}

#[test]
fn auth_request_answers_as_nginx_does() {
    let b = free_port();
    let body = auth_conf(b);
    let p = Prefix::new();
    auth_files(&p);
    let tern = Server::start_in(p, &body);
    let ours = auth_series(tern.port);
    let text = ours.join("\n");
    // What the cases are about, whatever nginx says.
    assert!(ours[0].contains("-> 200 \"a file\\n\""), "{}", text);
    assert!(ours[1].contains("-> 403"), "{}", text);
    assert!(ours[2].contains("-> 500"), "{}", text);
    assert!(
        ours[3].contains("-> 401")
            && ours[3].contains("www-auth Some(\"Bearer realm=\\\"t\\\"\")")
            && ours[3].contains("user Some(\"[bob][401]\")"),
        "{}",
        text
    );
    assert!(
        ours[6].contains("-> 200") && ours[6].contains("[alice]"),
        "{}",
        text
    );
    // auth_request_set may set $args, as `set` can (nginx's set_handler).
    assert!(ours[7].contains("args Some(\"[set204][]\")"), "{}", text);
    assert!(ours[8].contains("-> 403"), "{}", text);
    assert!(ours[15].contains("-> 404"), "{}", text);
    let log = tern.wait_error_log("auth request unexpected status: 302");
    assert!(
        log.contains("auth request unexpected status: 302, client: 127.0.0.1, server: , request: \"GET /a/x.txt HTTP/1.1\", host: \"x\""),
        "{}",
        log
    );
    // A subrequest's error lines name it after the client's request (a
    // later request's line: waited for too).
    tern.wait_error_log(
        "request: \"GET /missing/x.txt HTTP/1.1\", subrequest: \"/nothing-here\", host: \"x\"",
    );
    // The subrequest skips the access phase (as nginx's does): /deep/'s
    // own auth_request does not guard it, the directory index does.
    assert!(ours[16].contains("-> 403"), "{}", text);
    let our_access = wait_log(&tern.prefix, "logs/access.log", "/deep/x.txt");
    // log_subrequest on in /authu: its line comes before the main one;
    // the other subrequests are not logged.
    assert!(
        our_access.contains("/u/x.txt /authu 204 \"-\" 204\n/u/x.txt /u/x.txt 200 \"-\" -\n"),
        "{}",
        our_access
    );
    assert!(!our_access.contains("/a/x.txt /auth "), "{}", our_access);
    drop(tern);
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    auth_files(&p);
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, &body, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = auth_series(port);
    for (o, t) in ours.iter().zip(theirs.iter()) {
        assert_eq!(o, t, "\ntern:\n{}\nnginx:\n{}", text, theirs.join("\n"));
    }
    let their_access = wait_log(&p, "logs/access.log", "/deep/x.txt");
    assert_eq!(our_access, their_access);
    let their_log = p.read("logs/error.log");
    assert!(
        their_log.contains(
            "request: \"GET /missing/x.txt HTTP/1.1\", subrequest: \"/nothing-here\", host: \"x\""
        ),
        "{}",
        their_log
    );
}

#[test]
fn auth_request_directives_are_checked_as_nginx_does() {
    let t = crate::harness::ConfTest::run(
        "events {}\nhttp { server { listen 127.0.0.1:1; location / {\n auth_request /a;\n auth_request /b; } } }",
    );
    t.assert_says("emerg", "\"auth_request\" directive is duplicate", 4);
    let t = crate::harness::ConfTest::run(
        "events {}\nhttp { server { listen 127.0.0.1:1; location / {\n auth_request_set user $uri; } } }",
    );
    t.assert_says("emerg", "invalid variable name \"user\"", 3);
    let t = crate::harness::ConfTest::run(
        "events {}\nhttp { server { listen 127.0.0.1:1; location / {\n mirror /a;\n mirror off; } } }",
    );
    t.assert_says("emerg", "\"mirror\" directive is duplicate", 4);
}

/// The mirror origin records each request with its body.
fn recording_origin() -> Origin {
    Origin::serve(|mut c| {
        while let Some(req) = c.next(true) {
            c.record(&req);
            let _ = c
                .stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nmirror");
        }
    })
}

fn mirror_conf(main: u16, shadow: u16) -> String {
    format!(
        r#"http {{
  log_format f '$request_method $request_uri $uri $status';
  access_log logs/access.log f;
  server {{ listen 127.0.0.1:@PORT@;
    location /app/ {{ mirror /shadow; mirror /shadow2; proxy_pass http://127.0.0.1:{main}; }}
    location /nobody/ {{ mirror /shadow; mirror_request_body off; proxy_pass http://127.0.0.1:{main}; }}
    location /logged/ {{ mirror /shadow3; proxy_pass http://127.0.0.1:{main}; }}
    location = /shadow3 {{ internal; log_subrequest on; proxy_pass http://127.0.0.1:{shadow}/u; }}
    location = /shadow {{ internal; proxy_pass http://127.0.0.1:{shadow}/s; }}
    location = /shadow2 {{ internal; proxy_pass http://127.0.0.1:{shadow}; }}
  }}
}}
"#
    )
}

fn mirror_series(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    for (method, path, body) in [
        ("POST", "/app/x?k=v", "payload"),
        ("GET", "/app/y", ""),
        ("POST", "/nobody/z", ""),
    ] {
        let req = format!(
            "{} {} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
            method,
            path,
            body.len(),
            body
        );
        let r = Resp::parse(&raw(port, req.as_bytes())).expect("response");
        out.push(format!(
            "{} {} -> {} {:?}",
            method,
            path,
            r.status,
            r.body_str()
        ));
    }
    out
}

/// Request heads as the origin saw them, Host's port blanked, sorted
/// (mirrors run concurrently).
fn seen(o: &Origin) -> Vec<String> {
    let mut v: Vec<String> = o
        .requests()
        .iter()
        .map(|r| {
            r.lines()
                .map(|l| {
                    if l.starts_with("Host: ") {
                        "Host: H"
                    } else {
                        l
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    v.sort();
    v
}

fn wait_count(o: &Origin, n: usize) {
    crate::harness::eventually(10, "mirror requests", || o.count() >= n);
    std::thread::sleep(Duration::from_millis(200));
}

#[test]
fn mirror_sends_shadow_copies_as_nginx_does() {
    let main = recording_origin();
    let shadow = recording_origin();
    let body = mirror_conf(main.port, shadow.port);
    let tern = Server::start(&body);
    let ours = mirror_series(tern.port);
    wait_count(&shadow, 5);
    let r = tern.get("/logged/a");
    assert_eq!(r.body_str(), "mirror");
    wait_count(&shadow, 6);
    let our_main = seen(&main);
    let our_shadow = seen(&shadow);
    let text = format!("{:?}\n{:#?}\n{:#?}", ours, our_main, our_shadow);
    assert_eq!(ours[0], "POST /app/x?k=v -> 200 \"mirror\"", "{}", text);
    assert!(
        our_shadow
            .iter()
            .any(|r| r.starts_with("POST /s?k=v HTTP/1.0") && r.ends_with("payload")),
        "{}",
        text
    );
    assert!(
        our_shadow
            .iter()
            .any(|r| r.starts_with("POST /shadow2?k=v HTTP/1.0") && r.ends_with("payload")),
        "{}",
        text
    );
    wait_log(
        &tern.prefix,
        "logs/access.log",
        "GET /logged/a /logged/a 200",
    );
    // The mirror runs on its own task: its line may come after the
    // main request's. The mirrors of /app/x (not logged) had reached the
    // shadow origin, which answers at once, before /logged/a was sent:
    // a line of theirs would be in by the time this one is.
    let access = wait_log(
        &tern.prefix,
        "logs/access.log",
        "GET /logged/a /shadow3 200",
    );
    assert!(!access.contains("POST /app/x?k=v /shadow"), "{}", access);
    drop(tern);
    if !nginx_installed() {
        return;
    }
    let (main2, shadow2) = (recording_origin(), recording_origin());
    let body = mirror_conf(main2.port, shadow2.port);
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, &body, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = mirror_series(port);
    wait_count(&shadow2, 5);
    let _ = raw(
        port,
        b"GET /logged/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    wait_count(&shadow2, 6);
    assert_eq!(ours, theirs);
    assert_eq!(our_main, seen(&main2));
    assert_eq!(our_shadow, seen(&shadow2));
    let their_access = wait_log(&p, "logs/access.log", "GET /logged/a /logged/a 200");
    assert!(
        their_access.contains("GET /logged/a /shadow3 200"),
        "{}",
        their_access
    );
}

fn addition_conf(b: u16) -> String {
    format!(
        r#"http {{
  types {{ text/html html; }}
  default_type text/plain;
  access_log off;
  server {{ listen 127.0.0.1:{b}; location / {{ return 200 "upstream $uri\n"; }} }}
  server {{ listen 127.0.0.1:@PORT@;
    root html;
    location /page/ {{ add_before_body /inc/before.txt; add_after_body /inc/after.txt; }}
    location /typed/ {{ add_after_body /inc/after.txt; addition_types text/plain; }}
    location /proxied/ {{ add_before_body /up/b; add_after_body /inc/after.txt; addition_types *; proxy_pass http://127.0.0.1:{b}/; }}
    location /missing/ {{ add_after_body /inc/none.txt; }}
    location /up/ {{ proxy_pass http://127.0.0.1:{b}/; }}
  }}
}}
"#
    )
}

fn addition_files(p: &Prefix) {
    p.write("html/page/x.html", "<p>page</p>\n");
    p.write("html/typed/t.txt", "typed text\n");
    p.write("html/typed/x.html", "<p>typed</p>\n");
    p.write("html/missing/x.html", "<p>missing</p>\n");
    p.write("html/inc/before.txt", "BEFORE\n");
    p.write("html/inc/after.txt", "AFTER\n");
}

fn addition_series(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    for (method, path, minor, extra) in [
        ("GET", "/page/x.html", 1, ""),
        ("GET", "/page/x.html", 0, ""),
        ("HEAD", "/page/x.html", 1, ""),
        ("GET", "/page/x.html", 1, "Range: bytes=0-3\r\n"),
        ("GET", "/typed/t.txt", 1, ""),
        ("GET", "/typed/x.html", 1, ""),
        ("GET", "/proxied/p", 1, ""),
        ("GET", "/missing/x.html", 1, ""),
        ("GET", "/inc/after.txt", 1, ""),
    ] {
        let req = format!(
            "{} {} HTTP/1.{}\r\nHost: x\r\n{}Connection: close\r\n\r\n",
            method, path, minor, extra
        );
        let r = Resp::parse(&raw(port, req.as_bytes())).expect("response");
        let heads: Vec<String> = r
            .headers
            .iter()
            .filter(|(n, _)| !matches!(n.as_str(), "Date" | "Server" | "Last-Modified"))
            .map(|(n, v)| {
                if n == "ETag" {
                    format!("ETag weak={}", v.starts_with("W/"))
                } else {
                    format!("{}: {}", n, v)
                }
            })
            .collect();
        let body = r.body_str();
        let body = match body.find("<html>") {
            // An error page inside: its title line is what counts.
            Some(i) => format!(
                "{}(error page {})",
                &body[..i],
                body.lines().find(|l| l.contains("<title>")).unwrap_or("")
            ),
            None => body,
        };
        out.push(format!(
            "{} {} 1.{} -> {} {:?} {:?}",
            method, path, minor, r.status, heads, body
        ));
    }
    out
}

#[test]
fn addition_frames_the_body_as_nginx_does() {
    let b = free_port();
    let body = addition_conf(b);
    let p = Prefix::new();
    addition_files(&p);
    let tern = Server::start_in(p, &body);
    let ours = addition_series(tern.port);
    drop(tern);
    let text = ours.join("\n");
    assert!(
        ours[0].contains("\"BEFORE\\n<p>page</p>\\nAFTER\\n\"")
            && ours[0].contains("Transfer-Encoding: chunked")
            && !ours[0].contains("Content-Length"),
        "{}",
        text
    );
    assert!(
        ours[6].contains("\"upstream /b\\nupstream /p\\nAFTER\\n\""),
        "{}",
        text
    );
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    addition_files(&p);
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, &body, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = addition_series(port);
    for (o, t) in ours.iter().zip(theirs.iter()) {
        assert_eq!(o, t, "\ntern:\n{}\nnginx:\n{}", text, theirs.join("\n"));
    }
}

#[test]
fn upstream_http_variables_read_the_upstream_head() {
    let o = Origin::start(|_| {
        Some(Origin::ok(
            "body",
            "X-Foo: bar\r\nX-Hidden: h\r\nConnection: close\r\n",
        ))
    });
    let tern = Server::start(&format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;\n\
         location / {{ proxy_pass http://127.0.0.1:{};\n\
           proxy_hide_header X-Hidden;\n\
           add_header X-Got \"$upstream_http_x_foo|$upstream_http_x_hidden|$upstream_http_x_none\"; }}\n\
         location /local {{ add_header X-Got \"[$upstream_http_x_foo]\"; return 200; }} }} }}",
        o.port
    ));
    let r = tern.get("/a");
    assert_eq!(r.header("X-Got"), Some("bar|h|"), "{}", r.head);
    assert_eq!(r.header("X-Hidden"), None, "{}", r.head);
    let r = tern.get("/local");
    assert_eq!(r.header("X-Got"), Some("[]"), "{}", r.head);
}

/// A mirror target that has not answered holds up neither the main
/// response nor the connection's next request (see DIFFERENCES.md: nginx
/// would keep the connection's next request waiting).
#[test]
fn mirror_does_not_hold_up_the_main_response() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let release = Arc::new(AtomicBool::new(false));
    let r2 = release.clone();
    let shadow = Origin::serve(move |mut c| {
        let Some(req) = c.next(true) else { return };
        c.record(&req);
        // Up to 30 s: far beyond the client's 5 s read timeout.
        for _ in 0..300 {
            if r2.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = c.stream.write_all(b"HTTP/1.1 204 No Content\r\n\r\n");
    });
    let tern = Server::start(&format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;\n\
         location /m/ {{ mirror /shadow; proxy_pass http://127.0.0.1:@PORT@/local/; }}\n\
         location /local/ {{ return 200 \"main $uri\\n\"; }}\n\
         location = /shadow {{ internal; proxy_pass http://127.0.0.1:{}; }} }} }}",
        shadow.port
    ));
    let mut s = crate::harness::connect(tern.port);
    for path in ["/m/a", "/m/b"] {
        s.write_all(format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", path).as_bytes())
            .expect("write");
        let r =
            crate::harness::read_response(&mut s).expect("main response while the mirror waits");
        assert_eq!(r.status, 200);
        assert_eq!(r.body_str(), format!("main /local/{}\n", &path[3..]));
    }
    crate::harness::eventually(10, "both mirror requests", || shadow.count() == 2);
    release.store(true, Ordering::SeqCst);
    let seen = shadow.requests();
    assert!(
        seen.iter().any(|r| r.starts_with("GET /shadow HTTP/1.0")),
        "{:?}",
        seen
    );
}
