//! `chunked_transfer_encoding`, `msie_padding` and `msie_refresh` against
//! the real nginx: the same configuration, the same requests, the same
//! bytes (after the differential test's normalisation).

use crate::differential::{exchange, normalize};
use crate::harness::{free_port, nginx_installed, start_nginx, Prefix, Server};

const CONF: &str = r#"
http {
    access_log off;
    types { text/html html; }
    server {
        listen 127.0.0.1:@PORT@;
        location /nc/ { chunked_transfer_encoding off; sub_filter a A; }
        location /ch/ { sub_filter a A; alias html/nc/; }
        location /r/ {
            msie_refresh on;
            location /r/301 { return 301 /target; }
            location /r/302 { return 302 "http://ex.test/a b'c\"d%e<f>^`{|}~\x01é"; }
            location /r/308 { return 308 /t; }
            location /r/ep { error_page 404 http://ex.test/ep; return 404; }
            location /r/dir { }
        }
        location /nr/ { return 301 /target; }
        location /e404 { return 404; }
        location /e500 { return 500; }
        location /nopad { msie_padding off; return 404; }
    }
}
"#;

const MSIE: &str = "Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.1)";

fn requests() -> Vec<String> {
    let mut v = vec![
        // Unframed body, then the close (the pipelined second request is
        // not answered).
        "GET /nc/f.html HTTP/1.1\r\nHost: h\r\n\r\nGET /nc/f.html HTTP/1.1\r\nHost: h\r\n\r\n"
            .to_string(),
        "HEAD /nc/f.html HTTP/1.1\r\nHost: h\r\n\r\n".to_string(),
        "GET /nc/f.html HTTP/1.0\r\nHost: h\r\n\r\n".to_string(),
        "GET /ch/f.html HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n".to_string(),
        "GET /nc/ HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n".to_string(),
    ];
    for ua in [
        MSIE,
        "MSIE 6.0",
        "MSIE 6.",
        "Opera/9 (MSIE 6.0)",
        "Mozilla/5.0 Chrome/100.0 Safari/537",
        "Mozilla/5.0 Gecko/2010 Chrome/100.0",
    ] {
        for path in [
            "/r/301", "/r/302", "/r/308", "/r/ep", "/r/dir", "/nr/", "/e404", "/e500", "/nopad",
        ] {
            v.push(format!(
                "GET {} HTTP/1.1\r\nHost: h\r\nUser-Agent: {}\r\nConnection: close\r\n\r\n",
                path, ua
            ));
        }
    }
    v.push(format!(
        "HEAD /r/301 HTTP/1.1\r\nHost: h\r\nUser-Agent: {}\r\nConnection: close\r\n\r\n",
        MSIE
    ));
    v
}

fn answers(port: u16) -> Vec<String> {
    requests()
        .iter()
        .map(|r| normalize(&exchange(port, r.as_bytes()), port))
        .collect()
}

fn files(p: &Prefix) {
    p.write("html/nc/f.html", "banana bread\n");
    std::fs::create_dir_all(p.path("html/r/dir")).expect("mkdir");
}

#[test]
fn chunking_off_and_msie_as_nginx() {
    let p = Prefix::new();
    files(&p);
    let s = Server::start_in(p, CONF);
    let ours = answers(s.port);
    drop(s);
    // Without chunking the body goes as it is and the connection closes.
    assert!(
        ours[0].ends_with("Connection: close\r\n\r\nbAnana bread\n"),
        "{:?}",
        ours[0]
    );
    assert!(!ours[0].contains("Transfer-Encoding"), "{:?}", ours[0]);
    assert!(
        ours[3].contains("Transfer-Encoding: chunked"),
        "{:?}",
        ours[3]
    );
    // MSIE gets a refresh page instead of the redirect.
    assert!(
        ours[5].contains("\r\n\r\n<html><head><meta http-equiv=\"Refresh\" content=\"0; URL=/target\"></head><body></body></html>\r\n"),
        "{:?}",
        ours[5]
    );
    assert!(ours[11].contains("<!-- a padding"), "{:?}", ours[11]);
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    files(&p);
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, CONF, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = answers(port);
    for (i, r) in requests().iter().enumerate() {
        assert_eq!(ours[i], theirs[i], "request {:?}", r);
    }
}
