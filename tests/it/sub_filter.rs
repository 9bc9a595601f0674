//! `sub_filter` against the real nginx: the same bytes (headers and body)
//! for static files and a proxied body, once and repeatedly, with
//! variables, across read boundaries of a large file, and for types that
//! are left alone.

use crate::differential::{exchange, fix_times, normalize};
use crate::harness::{free_port, nginx_installed, start_nginx, ConfTest, Prefix, Server};

fn site(p: &Prefix) {
    p.write(
        "html/once/a.html",
        "<p>Hello world, hello World! HELLO</p>\n",
    );
    p.write("html/all/a.html", "Hello world, hello World! HELLO\n");
    p.write("html/lm/a.html", "hello there\n");
    p.write("html/types/a.txt", "hello plain\n");
    p.write("html/typesany/a.txt", "hello plain\n");
    // Large enough to be read (and proxied) in several pieces; the
    // pattern falls across piece boundaries somewhere.
    let mut big = String::new();
    for i in 0..40_000 {
        big.push_str(&format!("line {} says hello\n", i));
    }
    p.write("html/all/big.html", &big);
    p.write("html/empty/a.html", "");
    // A compressed page the backend sends as is (gzip_static always):
    // gunzip runs before sub_filter, as in nginx.
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut z, b"<b>hello gzip, hello</b>\n").expect("gzip");
    p.write("html/gz/z.html.gz", z.finish().expect("gzip"));
    p.write("html/gz/z.html", "stale plain copy\n");
    fix_times(&p.path("html"));
}

fn conf(backend: u16) -> String {
    format!(
        "http {{\n\
         access_log off;\n\
         types {{ text/html html; text/plain txt; }}\n\
         server {{ listen 127.0.0.1:{backend}; location / {{ }} location /gz/ {{ gzip_static always; }} }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /once/ {{ sub_filter 'Hello' 'Bye'; sub_filter 'world' \"[$uri]\"; }}\n\
           location /all/ {{ sub_filter 'Hello' 'Bye'; sub_filter_once off; }}\n\
           location /lm/ {{ sub_filter 'hello' 'x'; sub_filter_last_modified on; }}\n\
           location /types/ {{ sub_filter 'hello' 'x'; }}\n\
           location /typesany/ {{ sub_filter 'hello' 'x'; sub_filter_types *; }}\n\
           location /empty/ {{ sub_filter 'hello' 'x'; }}\n\
           location /gunzip/ {{ gunzip on; sub_filter_once off; sub_filter 'hello' 'HI'; proxy_pass http://127.0.0.1:{backend}/gz/; }}\n\
           location /proxied/ {{ sub_filter_once off; sub_filter 'says hello' 'HI'; proxy_buffering off; proxy_pass http://127.0.0.1:{backend}/all/; }}\n\
         }}\n\
         }}\n"
    )
}

fn series(port: u16) -> Vec<String> {
    [
        "/once/a.html",
        "/all/a.html",
        "/all/big.html",
        "/lm/a.html",
        "/types/a.txt",
        "/typesany/a.txt",
        "/empty/a.html",
        "/proxied/big.html",
        "/gunzip/z.html",
    ]
    .iter()
    .flat_map(|path| {
        ["GET", "HEAD"].map(|m| {
            let req = format!("{} {} HTTP/1.0\r\nHost: x\r\n\r\n", m, path);
            format!(
                "{} {}\n{}",
                m,
                path,
                normalize(&exchange(port, req.as_bytes()), port)
            )
        })
    })
    .collect()
}

#[test]
fn sub_filter_rewrites_bodies_as_nginx_does() {
    let backend = free_port();
    let body = conf(backend);
    let p = Prefix::new();
    site(&p);
    let tern = Server::start_in(p, &body);
    let ours = series(tern.port);
    drop(tern);
    let first = &ours[0];
    assert!(
        first.contains("<p>Bye [/once/a.html], hello World! HELLO</p>"),
        "{}",
        first
    );
    let big = &ours[4];
    assert_eq!(
        big.matches("line 39999 says Bye").count(),
        1,
        "{}",
        &big[..400]
    );
    assert!(!big.contains("hello"));
    let gunzipped = ours
        .iter()
        .find(|l| l.starts_with("GET /gunzip/"))
        .expect("gunzip case");
    assert!(gunzipped.contains("<b>HI gzip, HI</b>"), "{}", gunzipped);
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    site(&p);
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, &body, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = series(port);
    for (o, t) in ours.iter().zip(theirs.iter()) {
        if o != t {
            let at = o
                .bytes()
                .zip(t.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(o.len().min(t.len()));
            let from = at.saturating_sub(200);
            panic!(
                "differs at byte {}:\ntern:  {:?}\nnginx: {:?}",
                at,
                &o[from..(at + 200).min(o.len())],
                &t[from..(at + 200).min(t.len())]
            );
        }
    }
}

#[test]
fn sub_filter_errors_are_nginx_s() {
    for (d, msg) in [
        ("sub_filter '' b;", "empty search pattern"),
        (
            "sub_filter a;",
            "invalid number of arguments in \"sub_filter\" directive",
        ),
        (
            "sub_filter_once maybe;",
            "invalid value \"maybe\" in \"sub_filter_once\" directive, it must be \"on\" or \"off\"",
        ),
    ] {
        ConfTest::run(&format!(
            "events {{}}\nhttp {{ server {{ location / {{ {} }} }} }}\n",
            d
        ))
        .assert_says("emerg", msg, 2);
    }
}
