//! `empty_gif` against the real nginx: the same bytes for GET, HEAD, a
//! conditional GET and a POST.

use crate::differential::{exchange, normalize};
use crate::harness::{free_port, nginx_installed, start_nginx, Prefix, Server};

const CONF: &str = "http { access_log off; server { listen 127.0.0.1:@PORT@;\n\
    location /pixel { empty_gif; }\n\
    location /pixel/nested { }\n\
    } }\n";

fn answers(port: u16) -> Vec<String> {
    [
        "GET /pixel HTTP/1.0\r\n\r\n",
        "HEAD /pixel HTTP/1.0\r\n\r\n",
        "GET /pixel HTTP/1.0\r\nIf-Modified-Since: Mon, 28 Sep 1970 06:00:00 GMT\r\n\r\n",
        "POST /pixel HTTP/1.0\r\nContent-Length: 2\r\n\r\nab",
        "GET /pixel/nested HTTP/1.0\r\n\r\n",
    ]
    .iter()
    .map(|r| normalize(&exchange(port, r.as_bytes()), port))
    .collect()
}

#[test]
fn empty_gif_answers_as_nginx_does() {
    let s = Server::start(CONF);
    let ours = answers(s.port);
    drop(s);
    assert!(ours[0].starts_with("HTTP/1.1 200 OK\r\n"), "{}", ours[0]);
    assert!(ours[0].ends_with("L\u{1}\0;"), "{:?}", ours[0]);
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, CONF, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    assert_eq!(ours, answers(port));
}
