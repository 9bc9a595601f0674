//! Routing cases nginx-tests found tern answering differently, side by
//! side with nginx: `auto_redirect` of proxied `/a/` locations, the status
//! an error page's target decides (its own redirect or error), `return
//! 200` with no text, an absolute `index` (a redirect loop is a 500),
//! `if (-x dir)`, `server_name` regex captures and `.name` primary names,
//! the unescaping of a rewrite's redirect target, captures escaped in a
//! rewrite's arguments, and try_files under an alias (regex or nested).

use crate::harness::*;

const CONF: &str = r#"
worker_processes 1;
events {}
http {
    access_log off;
    server {
        listen 127.0.0.1:@PORT@;
        server_name localhost;
        root html;
        location /a/ { proxy_pass http://127.0.0.1:1/; }
        location /a-a { return 200 "a-a\n"; }
        location /b/c/ { fastcgi_pass 127.0.0.1:1; }
        location /return200 { return 200; }
        location /return302text { return 302 "text"; }
        location /return200text { return 200 "text"; }
        location /e405return200 { error_page 405 /return200; return 405; }
        location /e302return200text { error_page 302 /return200text; return 302 "text"; }
        location /e405return302text { error_page 405 /return302text; return 405; }
        location /e405dir { error_page 405 /dir; return 405; }
        location /e302auto { error_page 302 /a; return 302 "first"; }
        location /dir { }
        location /loop/ { index /loop/; }
        location /exec { if (-x $document_root/dir) { return 204; } return 200 "not x\n"; }
        location /unescape { rewrite ^ $arg_r? redirect; }
        location /capturedup { rewrite ^(.*) $1?c=$1; return 200 "uri:$uri args:$args\n"; }
        location ~ /alias-re.html { alias html/dir; try_files $uri =404; }
        location /alias-nested/ {
            alias html/;
            location ~ html { try_files $uri =404; }
        }
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name ~^(?P<sub>[a-z]+)\Q.rx.test\E$;
        location / { return 200 "sub=$sub 1=$1\n"; }
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name .dot.test;
        location / { return 200 "name=$server_name\n"; }
    }
}
"#;

fn files(p: &Prefix) {
    p.write("html/dir/index.html", "dir index\n");
    p.write("html/dir/alias-re.html", "alias re\n");
    p.write("html/found.html", "found\n");
    // Both servers' copies carry one time: their Last-Modified and ETag
    // are compared, and writes a second apart would differ.
    crate::differential::fix_times(&p.path("html"));
}

fn corpus() -> Vec<String> {
    let mut reqs = Vec::new();
    for uri in [
        "/a",
        "/a?x=1",
        "/a-a",
        "/b/c",
        "/return200",
        "/e405return200",
        "/e302return200text",
        "/e405return302text",
        "/e405dir",
        "/e302auto",
        "/loop/",
        "/exec",
        "/unescape?r=http%3A%2F%2Fexample.com%2F%3Ffrom",
        "/unescape?r=http%3A%2F%2Fexample.com%0D%0Asplit",
        "/capturedup/%25?a=b",
        "/alias-re.html",
        "/alias-nested/found.html",
    ] {
        reqs.push(format!("GET {} HTTP/1.0\r\nHost: localhost\r\n\r\n", uri));
    }
    for host in ["abc.rx.test", "www.dot.test", "dot.test"] {
        reqs.push(format!("GET / HTTP/1.0\r\nHost: {}\r\n\r\n", host));
    }
    reqs
}

fn normalize(resp: &[u8], port: u16) -> String {
    let text = blank_date_server(&String::from_utf8_lossy(resp)).replace(&port.to_string(), "PORT");
    // The server's name in error pages differs ("nginx" / "tern") and so
    // does Content-Length with it.
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let head: Vec<&str> = head
        .split("\r\n")
        .filter(|l| !(body.contains("<hr><center>") && l.starts_with("Content-Length")))
        .collect();
    let body = body
        .replace(
            "<hr><center>nginx/1.22.1</center>",
            "<hr><center>X</center>",
        )
        .replace(
            &format!("<hr><center>tern/{}</center>", env!("CARGO_PKG_VERSION")),
            "<hr><center>X</center>",
        );
    format!("{}\r\n\r\n{}", head.join("\r\n"), body)
}

fn setup(p: &Prefix) {
    files(p);
    // `-x` is the owner's execute bit, and a directory has it.
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(p.path("html/dir"), std::fs::Permissions::from_mode(0o755));
}

#[test]
fn routing_same_as_nginx() {
    if !nginx_installed() {
        return;
    }
    let pn = Prefix::new();
    setup(&pn);
    let nport = free_port();
    let Some(_nginx) = start_nginx(&pn, CONF, nport) else {
        panic!("nginx did not start");
    };
    let pt = Prefix::new();
    setup(&pt);
    let tern = Server::start_in(pt, CONF);
    let mut diffs = Vec::new();
    for r in corpus() {
        let a = normalize(&raw(nport, r.as_bytes()), nport);
        let b = normalize(&tern.raw(r.as_bytes()), tern.port);
        if a != b {
            diffs.push(format!("{}nginx:\n{}\ntern:\n{}", r, a, b));
        }
    }
    assert!(diffs.is_empty(), "{}", diffs.join("\n----\n"));
}

/// The same cases by their expected answers (meaningful without nginx).
#[test]
fn routing_answers() {
    let p = Prefix::new();
    setup(&p);
    let tern = Server::start_in(p, CONF);
    let get = |uri: &str, host: &str| {
        Resp::parse(&tern.raw(format!("GET {} HTTP/1.0\r\nHost: {}\r\n\r\n", uri, host).as_bytes()))
            .expect("a response")
    };
    let r = get("/a?x=1", "localhost");
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("Location"),
        Some(format!("http://localhost:{}/a/?x=1", tern.port).as_str())
    );
    assert_eq!(get("/b/c", "localhost").status, 301);
    assert_eq!(get("/a-a", "localhost").body_str(), "a-a\n");
    let r = get("/e405return200", "localhost");
    assert_eq!((r.status, r.body_str().as_str()), (405, ""));
    let r = get("/e302return200text", "localhost");
    assert_eq!((r.status, r.header("Location")), (302, Some("text")));
    assert_eq!(r.body_str(), "text");
    assert_eq!(get("/e405return302text", "localhost").status, 302);
    assert_eq!(get("/e405dir", "localhost").status, 301);
    assert_eq!(get("/e302auto", "localhost").status, 301);
    assert_eq!(get("/loop/", "localhost").status, 500);
    assert_eq!(get("/exec", "localhost").status, 204);
    assert_eq!(
        get(
            "/unescape?r=http%3A%2F%2Fexample.com%2F%3Ffrom",
            "localhost"
        )
        .header("Location"),
        Some("http://example.com/?from")
    );
    assert_eq!(
        get("/capturedup/%25?a=b", "localhost").body_str(),
        "uri:/capturedup/% args:c=/capturedup/%25&a=b\n"
    );
    assert_eq!(get("/alias-re.html", "localhost").body_str(), "alias re\n");
    assert_eq!(
        get("/alias-nested/found.html", "localhost").body_str(),
        "found\n"
    );
    assert_eq!(get("/", "abc.rx.test").body_str(), "sub=abc 1=abc\n");
    assert_eq!(get("/", "www.dot.test").body_str(), "name=dot.test\n");
}
