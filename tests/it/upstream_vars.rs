//! `$upstream_addr`, `_status`, `_response_length`, `_bytes_received`,
//! `_bytes_sent`, `_connect_time`, `_header_time`, `_response_time`:
//! one value per peer tried joined with ", ", and " : " where an internal
//! redirect (error_page here) used an upstream again; compared
//! with the real nginx's access log on the same configuration and the
//! same origins (times reduced to their shape).

use std::io::Write;

use crate::harness::{
    free_port, nginx_installed, raw, start_nginx, wait_log, DeadPort, Prefix, Server,
};
use crate::origin::Origin;

const FMT: &str = "$uri|$upstream_addr|$upstream_status|$upstream_response_length|\
                   $upstream_bytes_received|$upstream_bytes_sent|$upstream_connect_time|\
                   $upstream_header_time|$upstream_response_time|$upstream_cache_status";

fn conf(a: u16, b: u16, dead: u16) -> String {
    format!(
        "http {{\n\
         log_format u \"{FMT}\";\n\
         proxy_cache_path cache keys_zone=z:1m;\n\
         upstream ab {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}\n\
         upstream db {{ server 127.0.0.1:{dead}; server 127.0.0.1:{b}; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           access_log logs/u.log u;\n\
           location /one {{ proxy_pass http://127.0.0.1:{b}; }}\n\
           location /retry {{ proxy_next_upstream http_502; proxy_pass http://ab; }}\n\
           location /dead {{ proxy_pass http://db; }}\n\
           location /ep {{ proxy_intercept_errors on; error_page 502 = /one; proxy_pass http://127.0.0.1:{a}; }}\n\
           location /cached {{ proxy_cache z; proxy_cache_valid 200 1m; proxy_pass http://127.0.0.1:{b}; }}\n\
           location /unbuf {{ proxy_buffering off; proxy_pass http://127.0.0.1:{b}; }}\n\
         }}\n\
         }}\n"
    )
}

const PATHS: &[&str] = &[
    "/one", "/retry", "/dead", "/ep", "/cached", "/cached", "/unbuf",
];

/// The log lines of the series, times replaced by `T`.
fn series(port: u16, p: &Prefix) -> Vec<String> {
    for path in PATHS {
        let req = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
        let r = raw(port, req.as_bytes());
        assert!(
            r.starts_with(b"HTTP/1.1 200"),
            "{path}: {}",
            String::from_utf8_lossy(&r)
        );
    }
    let text = wait_log(p, "logs/u.log", "/unbuf");
    text.lines().map(times_as_t).collect()
}

/// `d.ddd` times as `T`.
fn times_as_t(l: &str) -> String {
    {
        let b = l.as_bytes();
        let mut out = String::new();
        let mut i = 0;
        while i < b.len() {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i > start
                && i + 3 < b.len()
                && b[i] == b'.'
                && b[i + 1..i + 4].iter().all(u8::is_ascii_digit)
            {
                out.push('T');
                i += 4;
                continue;
            }
            if i > start {
                out.push_str(&l[start..i]);
                continue;
            }
            out.push(b[i] as char);
            i += 1;
        }
        out
    }
}

#[test]
fn upstream_variables_join_as_nginx_does() {
    let dead = DeadPort::new();
    // A answers 502, B 200 "hello".
    let a = Origin::start(|_| {
        Some(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 3\r\n\r\nbad".to_vec())
    });
    let b = Origin::serve(|mut c| {
        let Some(_) = c.next(false) else { return };
        let _ = c.stream.write_all(&Origin::ok("hello", ""));
    });
    let body = conf(a.port, b.port, dead.port);
    let tern = Server::start_in(Prefix::new(), &body);
    let ours = series(tern.port, &tern.prefix);
    let text = ours.join("\n");
    let b_ = format!("127.0.0.1:{}", b.port);
    let a_ = format!("127.0.0.1:{}", a.port);
    let d_ = format!("127.0.0.1:{}", dead.port);
    // What the cases are about, whatever nginx says.
    assert!(
        text.contains(&format!("/retry|{a_}, {b_}|502, 200|0, 5|")),
        "{text}"
    );
    assert!(
        text.contains(&format!("/dead|{d_}, {b_}|502, 200|0, 5|0, ")),
        "{text}"
    );
    assert!(
        text.contains(&format!("/one|{a_} : {b_}|502 : 200|0 : 5|")),
        "{text}"
    );
    assert!(text.contains("/cached|-|-|-|-|-|-|-|-|HIT"), "{text}");
    drop(tern);
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, &body, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = series(port, &p);
    assert_eq!(
        ours,
        theirs,
        "\ntern:\n{}\nnginx:\n{}",
        text,
        theirs.join("\n")
    );
}
