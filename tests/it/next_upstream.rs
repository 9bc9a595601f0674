//! `proxy_next_upstream`, `_tries` and `_timeout`: which answers and
//! failures move a request to the next server, what the client gets when
//! none is left, and `$upstream_status`/`$upstream_addr` along the way,
//! compared with the real nginx on the same configuration.

use crate::harness::{
    free_port, nginx_installed, raw, start_nginx, ConfTest, DeadPort, Prefix, Resp, Server,
};

/// Backends (fixed ports, the same for nginx and tern): A answers 502,
/// A2 503, C 404, B 200; `dead` has nothing listening.
fn conf(p: &[u16; 5]) -> String {
    let [a, a2, c, b, dead] = p;
    format!(
        "http {{\n\
         access_log off;\n\
         server {{ listen 127.0.0.1:{a}; return 502 \"a\"; }}\n\
         server {{ listen 127.0.0.1:{a2}; return 503 \"a2\"; }}\n\
         server {{ listen 127.0.0.1:{c}; return 404 \"c\"; }}\n\
         server {{ listen 127.0.0.1:{b}; return 200 \"b\"; }}\n\
         upstream ab {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}\n\
         upstream ab2 {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}\n\
         upstream ab3 {{ server 127.0.0.1:{a} max_fails=0; server 127.0.0.1:{b} max_fails=0; }}\n\
         upstream ab4 {{ server 127.0.0.1:{a} max_fails=0; server 127.0.0.1:{b} max_fails=0; }}\n\
         upstream cb {{ server 127.0.0.1:{c}; server 127.0.0.1:{b}; }}\n\
         upstream aa {{ server 127.0.0.1:{a}; server 127.0.0.1:{a2}; }}\n\
         upstream db {{ server 127.0.0.1:{dead}; server 127.0.0.1:{b}; }}\n\
         upstream db2 {{ server 127.0.0.1:{dead}; server 127.0.0.1:{b}; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           add_header X-Status $upstream_status always;\n\
           add_header X-Addr $upstream_addr always;\n\
           location /default/ {{ proxy_pass http://ab; }}\n\
           location /h502/ {{ proxy_next_upstream http_502; proxy_pass http://ab2; }}\n\
           location /tries/ {{ proxy_next_upstream http_502; proxy_next_upstream_tries 1; proxy_pass http://ab3; }}\n\
           location /post/ {{ proxy_next_upstream http_502; proxy_pass http://ab4; }}\n\
           location /postni/ {{ proxy_next_upstream http_502 non_idempotent; proxy_pass http://ab4; }}\n\
           location /h404/ {{ proxy_next_upstream http_404; proxy_pass http://cb; }}\n\
           location /all/ {{ proxy_next_upstream http_502 http_503; proxy_pass http://aa; }}\n\
           location /error/ {{ proxy_pass http://db; }}\n\
           location /off/ {{ proxy_next_upstream off; proxy_pass http://db2; }}\n\
         }}\n\
         }}\n"
    )
}

/// Status, body and the two headers of each request of the series.
fn series(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    let mut ask = |method: &str, path: &str| {
        let req = format!(
            "{} {} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            method, path
        );
        let r = Resp::parse(&raw(port, req.as_bytes())).expect("response");
        // Error pages name the server; the body of a relayed answer is
        // compared as is.
        let body = r.body_str();
        let body = if body.contains("<html>") {
            "(error page)".to_string()
        } else {
            body
        };
        out.push(format!(
            "{} {} {} {} | {:?} | {:?}",
            method,
            path,
            r.status,
            body,
            r.header("X-Status"),
            r.header("X-Addr").map(|a| a.matches(", ").count() + 1),
        ));
    };
    for path in [
        "/default/",
        "/h502/",
        "/tries/",
        "/h404/",
        "/all/",
        "/error/",
        "/off/",
    ] {
        for _ in 0..4 {
            ask("GET", path);
        }
    }
    for path in ["/post/", "/postni/"] {
        for _ in 0..4 {
            ask("POST", path);
        }
    }
    out
}

#[test]
fn proxy_next_upstream_moves_on_as_nginx_does() {
    // `dead` stays bound (not listening) until the test ends.
    let dead = DeadPort::new();
    let ports = [
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        dead.port,
    ];
    let body = conf(&ports);
    let tern = Server::start_in(Prefix::new(), &body);
    let ours = series(tern.port);
    drop(tern);
    let text = ours.join("\n");
    // What the cases are about, whatever nginx says: with http_502 listed
    // every GET ends at B; without it, A's 502 reaches the client.
    assert!(
        ours.iter()
            .filter(|l| l.starts_with("GET /h502/"))
            .all(|l| l.contains(" 200 b ")),
        "{}",
        text
    );
    assert!(
        ours.iter().any(|l| l.starts_with("GET /default/ 502 a ")),
        "{}",
        text
    );
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, &body, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = series(port);
    for (o, t) in ours.iter().zip(theirs.iter()) {
        assert_eq!(o, t, "\ntern:\n{}\nnginx:\n{}", text, theirs.join("\n"));
    }
}

#[test]
fn proxy_next_upstream_values_are_checked_as_nginx_does() {
    let cases = [
        ("proxy_next_upstream foo;", "invalid value \"foo\""),
        (
            "proxy_next_upstream;",
            "invalid number of arguments in \"proxy_next_upstream\" directive",
        ),
        (
            "proxy_next_upstream_tries x;",
            "\"proxy_next_upstream_tries\" directive invalid number",
        ),
        (
            "proxy_next_upstream_timeout x;",
            "\"proxy_next_upstream_timeout\" directive invalid value",
        ),
    ];
    for (d, msg) in cases {
        ConfTest::run(&format!(
            "events {{}}\nhttp {{ server {{ location / {{ {} proxy_pass http://127.0.0.1:1; }} }} }}\n",
            d
        ))
        .assert_says("emerg", msg, 2);
    }
    let t = ConfTest::run(
        "events {}\nhttp { server { location / { proxy_next_upstream error error; proxy_pass http://127.0.0.1:1; } } }\n",
    );
    t.assert_says("warn", "duplicate value \"error\"", 2);
    assert_eq!(t.code, Some(0));
}
