//! random_index against the real nginx: where the pick is forced (one
//! regular file) the bytes are the same; with several files every pick is
//! one of them; a directory without regular files falls through to
//! `index` (403 without one) and a missing one is 404.

use std::collections::HashSet;

use crate::differential::{exchange, normalize};
use crate::harness::{free_port, nginx_installed, start_nginx, Prefix, Server};

const CONF: &str = r#"
http {
    access_log off;
    types { text/plain txt; text/html html; }
    server {
        listen 127.0.0.1:@PORT@;
        location /ri/ {
            random_index on;
            location /ri/off/ { random_index off; }
        }
    }
}
"#;

fn files(p: &Prefix) {
    p.write("html/ri/one/only.txt", "only\n");
    p.write("html/ri/one/.hidden", "hidden\n");
    p.write("html/ri/one/sub/x.txt", "x\n");
    p.write("html/ri/empty/.dot", "dot\n");
    std::fs::create_dir_all(p.path("html/ri/empty/sub")).expect("mkdir");
    p.write("html/ri/sp/a b.txt", "space\n");
    p.write("html/ri/idx/index.html", "index\n");
    p.write("html/ri/off/index.html", "off index\n");
    p.write("html/ri/off/z.txt", "z\n");
    for n in ["a", "b", "c"] {
        p.write(&format!("html/ri/many/{}.txt", n), format!("{}\n", n));
    }
    // tern's tree and nginx's are written a moment apart: without one
    // mtime for both, Last-Modified and ETag differ when a second passes
    // in between (likely on a loaded machine).
    crate::differential::fix_times(&p.path("html"));
}

const REQS: &[&str] = &[
    "GET /ri/one/ HTTP/1.0\r\n\r\n",
    "GET /ri/one/?q=1 HTTP/1.0\r\n\r\n",
    "HEAD /ri/one/ HTTP/1.0\r\n\r\n",
    "POST /ri/one/ HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
    "GET /ri/empty/ HTTP/1.0\r\n\r\n",
    "GET /ri/sp/ HTTP/1.0\r\n\r\n",
    "GET /ri/idx/ HTTP/1.0\r\n\r\n",
    "GET /ri/off/ HTTP/1.0\r\n\r\n",
    "GET /ri/nope/ HTTP/1.0\r\n\r\n",
    "GET /ri/one HTTP/1.0\r\nHost: h\r\n\r\n",
];

fn answers(port: u16) -> Vec<String> {
    REQS.iter()
        .map(|r| normalize(&exchange(port, r.as_bytes()), port))
        .collect()
}

fn picks(port: u16) -> HashSet<String> {
    (0..40)
        .map(|_| {
            let r = normalize(&exchange(port, b"GET /ri/many/ HTTP/1.0\r\n\r\n"), port);
            r.split("\r\n\r\n").nth(1).unwrap_or("").to_string()
        })
        .collect()
}

#[test]
fn random_index_as_nginx() {
    let p = Prefix::new();
    files(&p);
    let s = Server::start_in(p, CONF);
    let ours = answers(s.port);
    let our_picks = picks(s.port);
    drop(s);
    assert!(ours[0].ends_with("\r\n\r\nonly\n"), "{:?}", ours[0]);
    assert!(ours[4].starts_with("HTTP/1.1 403 "), "{:?}", ours[4]);
    assert!(ours[7].ends_with("\r\n\r\noff index\n"), "{:?}", ours[7]);
    let all: HashSet<String> = ["a\n", "b\n", "c\n"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert!(
        our_picks.is_subset(&all) && our_picks.len() > 1,
        "{:?}",
        our_picks
    );
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
    for (i, r) in REQS.iter().enumerate() {
        assert_eq!(ours[i], theirs[i], "{:?}", r);
    }
    assert!(picks(port).is_subset(&all));
}
