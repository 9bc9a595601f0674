//! `valid_referers` / `$invalid_referer` against the real nginx: every
//! kind of entry and a set of Referer values, compared response by response.

use crate::harness::{free_port, nginx_installed, raw, start_nginx, Prefix, Resp, Server};

const CONF: &str = "http {\n\
    access_log off;\n\
    server {\n\
      listen 127.0.0.1:@PORT@;\n\
      server_name example.com *.example.net ~^www\\d+\\.test$;\n\
      location /a/ {\n\
        valid_referers none blocked server_names *.example.org www.foo.* .bar.com pics.com/gallery/ ~\\.google\\.;\n\
        return 200 \"[$invalid_referer]\";\n\
      }\n\
      location /b/ { valid_referers example.com; return 200 \"[$invalid_referer]\"; }\n\
      location /c/ { return 200 \"[$invalid_referer]\"; }\n\
      location /d/ { valid_referers ~.*; return 200 \"[$invalid_referer]\"; }\n\
    }\n\
    }\n";

fn answers(port: u16) -> Vec<String> {
    let long = format!("http://{}.com/", "h".repeat(300));
    // nginx copies at most 256 bytes of host: 256 is still looked up, 257 is invalid.
    let host255 = format!("http://{}", "a".repeat(255));
    let host256 = format!("http://{}", "a".repeat(256));
    let host257 = format!("http://{}/", "a".repeat(257));
    let referers: Vec<Option<&str>> = vec![
        None,
        Some(""),
        Some("blocked-by-a-proxy"),
        Some("http://example.com/"),
        Some("https://EXAMPLE.com"),
        Some("HTTP://example.com/x"),
        Some("http://a.example.net/x"),
        Some("http://www3.test/"),
        Some("http://www.test/"),
        Some("http://x.example.org"),
        Some("http://example.org"),
        Some("http://www.foo.de/"),
        Some("http://bar.com"),
        Some("http://a.bar.com/p"),
        Some("http://pics.com/gallery/x"),
        Some("http://pics.com/other"),
        Some("http://pics.com:8080/gallery/"),
        Some("http://www.google.com/search"),
        Some("http://evil.com/?www.google.com"),
        Some("ftp://example.com/"),
        Some("http://i.r"),
        Some(long.as_str()),
        Some(host255.as_str()),
        Some(host256.as_str()),
        Some(host257.as_str()),
    ];
    let mut out = Vec::new();
    for path in ["/a/", "/b/", "/c/", "/d/"] {
        for r in &referers {
            let h = r.map(|v| format!("Referer: {}\r\n", v)).unwrap_or_default();
            let req = format!(
                "GET {} HTTP/1.1\r\nHost: x\r\n{}Connection: close\r\n\r\n",
                path, h
            );
            let resp = Resp::parse(&raw(port, req.as_bytes())).expect("response");
            out.push(format!(
                "{} {:?} -> {} {}",
                path,
                r,
                resp.status,
                resp.body_str()
            ));
        }
    }
    out
}

#[test]
fn invalid_referer_is_what_nginx_computes() {
    let s = Server::start(CONF);
    let ours = answers(s.port);
    drop(s);
    let text = ours.join("\n");
    assert!(text.contains("/a/ None -> 200 []"), "{}", text);
    assert!(text.contains("/b/ None -> 200 [1]"), "{}", text);
    let host256 = format!(
        "/d/ Some({:?}) -> 200 []",
        format!("http://{}", "a".repeat(256))
    );
    let host257 = format!(
        "/d/ Some({:?}) -> 200 [1]",
        format!("http://{}/", "a".repeat(257))
    );
    assert!(
        text.contains(&host256) && text.contains(&host257),
        "{}",
        text
    );
    assert!(
        text.contains("/a/ Some(\"http://pics.com/other\") -> 200 [1]"),
        "{}",
        text
    );
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, CONF, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = answers(port);
    assert_eq!(text, theirs.join("\n"));
}
