//! `set $limit_rate` and `X-Accel-Limit-Rate`: the variable reads as
//! nginx's (compared with the real nginx), and a rate set either way paces
//! the body, also after an X-Accel-Redirect (a 300 KB body at 100 KB/s
//! cannot arrive within 1.5 s).

use crate::differential::{exchange, normalize};
use crate::harness::{free_port, nginx_installed, start_nginx, wait_log, Prefix, Server};

const VARS_CONF: &str = r#"
http {
    access_log off;
    server {
        listen 127.0.0.1:@PORT@;
        location /a { limit_rate 1k; return 200 "[$limit_rate]\n"; }
        location /b { set $limit_rate 2k; return 200 "[$limit_rate]\n"; }
        location /c { set $limit_rate bad; return 200 "[$limit_rate]\n"; }
        location /d { return 200 "[$limit_rate]\n"; }
    }
}
"#;

fn answers(port: u16) -> Vec<String> {
    ["/a", "/b", "/c", "/d"]
        .iter()
        .map(|p| {
            let req = format!("GET {} HTTP/1.0\r\n\r\n", p);
            normalize(&exchange(port, req.as_bytes()), port)
        })
        .collect()
}

#[test]
fn limit_rate_variable_as_nginx() {
    let s = Server::start(VARS_CONF);
    let ours = answers(s.port);
    s.wait_error_log("invalid $limit_rate \"bad\"");
    drop(s);
    assert!(ours[1].ends_with("\r\n\r\n[2048]\n"), "{:?}", ours[1]);
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, VARS_CONF, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    assert_eq!(ours, answers(port));
}

fn timed(s: &Server, path: &str, want: &[u8]) -> f64 {
    let t = std::time::Instant::now();
    let r = s.get(path);
    assert_eq!(r.status, 200, "{}", path);
    assert!(
        r.body == want,
        "{}: body differs ({} bytes)",
        path,
        r.body.len()
    );
    t.elapsed().as_secs_f64()
}

#[test]
fn set_limit_rate_and_x_accel_limit_rate_pace() {
    let p = Prefix::new();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    p.write("html/f.bin", &data);
    let backend = free_port();
    let s = Server::start_in(
        p,
        &format!(
            "http {{\n\
             server {{ listen 127.0.0.1:{backend};\n\
               location / {{ add_header X-Accel-Limit-Rate 102400; }}\n\
               location = /r {{ add_header X-Accel-Redirect /redirect/f.bin;\n\
                               add_header X-Accel-Limit-Rate 102400; return 200 x; }}\n\
             }}\n\
             server {{ listen 127.0.0.1:@PORT@;\n\
               location /set/ {{ alias html/; set $limit_rate 100k; }}\n\
               location /unset/ {{ alias html/; limit_rate 10; set $limit_rate 0; }}\n\
               location /xa/ {{ proxy_pass http://127.0.0.1:{backend}/; }}\n\
               location /xaign/ {{ proxy_ignore_headers X-Accel-Limit-Rate;\n\
                                  proxy_pass http://127.0.0.1:{backend}/; }}\n\
               location /redirect/ {{ alias html/; limit_rate 0; }}\n\
             }}\n\
             }}\n"
        ),
    );
    // An X-Accel-Redirect answer's rate holds for the redirect's target,
    // over that location's `limit_rate 0` (nginx's limit_rate_set).
    for path in ["/set/f.bin", "/xa/f.bin", "/xa/r"] {
        let secs = timed(&s, path, &data);
        assert!(secs >= 1.5, "{} took {:.2} s", path, secs);
    }
    // Not limited (limit_rate 10 would take hours): the same bytes.
    timed(&s, "/unset/f.bin", &data);
    timed(&s, "/xaign/f.bin", &data);
}

const COMPLEX_CONF: &str = r#"
http {
    map $arg_r $rate { default 0; slow 100k; bad 4x; }
    map $arg_a $after { default 0; a 400k; }
    log_format rates '$uri?$args $status $body_bytes_sent $limit_rate';
    access_log logs/rates.log rates;
    server {
        listen 127.0.0.1:@PORT@;
        root html;
        location /fixed/ { alias html/; limit_rate 30m; }
        location /over/ { alias html/; set $limit_rate 20m; limit_rate $rate; }
        location / { limit_rate $rate; limit_rate_after $after; }
    }
}
"#;

const COMPLEX_PATHS: [&str; 6] = [
    "/f.bin",
    "/f.bin?r=slow",
    "/f.bin?r=slow&a=a",
    "/f.bin?r=bad",
    "/fixed/f.bin",
    "/over/f.bin?r=slow",
];

/// `limit_rate` and `limit_rate_after` given with variables: evaluated
/// per request, a value that is not a size logged and taken as 0, and
/// `$limit_rate` in the access log the rate the body was paced by; the
/// log lines compared with nginx's. A 300 KB body at 100 KB/s cannot
/// arrive within 1.5 s.
#[test]
fn limit_rate_with_variables_as_nginx() {
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let p = Prefix::new();
    p.write("html/f.bin", &data);
    let s = Server::start_in(p, COMPLEX_CONF);
    for path in COMPLEX_PATHS {
        let secs = timed(&s, path, &data);
        if path == "/f.bin?r=slow" {
            assert!(secs >= 1.5, "{} took {:.2} s", path, secs);
        }
    }
    let log = wait_log(&s.prefix, "logs/rates.log", "/over/f.bin");
    let err = s.wait_error_log("invalid size");
    let err_line = err
        .lines()
        .find(|l| l.contains("invalid size"))
        .map(|l| l.split_once("*").map_or(l, |(_, r)| r).to_string())
        .unwrap_or_default();
    assert!(
        err_line.contains("invalid size \"4x\" while sending response to client"),
        "{}",
        err_line
    );
    drop(s);
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    p.write("html/f.bin", &data);
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, COMPLEX_CONF, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    for path in COMPLEX_PATHS {
        // As `Server::get` asked tern.
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            path
        );
        crate::harness::raw(port, req.as_bytes());
    }
    let theirs = wait_log(&p, "logs/rates.log", "/over/f.bin");
    assert_eq!(log, theirs);
    let their_err = p.read("logs/error.log");
    let their_line = their_err
        .lines()
        .find(|l| l.contains("invalid size"))
        .map(|l| l.split_once("*").map_or(l, |(_, r)| r).to_string())
        .unwrap_or_default();
    assert_eq!(err_line, their_line);
}
