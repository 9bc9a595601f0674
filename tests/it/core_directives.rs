//! Core-module directives added late: `keepalive_time` closes a connection
//! that has lived too long, and the pool-size and platform-only ones are
//! checked as the real nginx checks them (the same `-t` output).

use std::io::Write;
use std::time::Duration;

use crate::harness::{nginx_installed, read_response, Prefix, Server, NGINX};

#[test]
fn keepalive_time_ends_an_old_connection_after_its_response() {
    let s = Server::start(
        "http { keepalive_time 1s; server { listen 127.0.0.1:@PORT@; return 200 ok; } }\n",
    );
    let mut c = s.connect();
    let req = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    c.write_all(req).expect("write");
    let r = read_response(&mut c).expect("first response");
    assert_eq!(r.header("Connection"), Some("keep-alive"));
    std::thread::sleep(Duration::from_millis(1300));
    c.write_all(req).expect("write");
    let r = read_response(&mut c).expect("second response");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Connection"), Some("close"));
}

#[test]
fn no_effect_core_directives_are_checked_as_nginx_does() {
    if !nginx_installed() {
        return;
    }
    for d in [
        "send_lowat 1k;",
        "send_lowat 0;",
        "connection_pool_size 10;",
        "request_pool_size 120;",
        "connection_pool_size 1k;",
        "subrequest_output_buffer_size x;",
        "keepalive_time x;",
        "keepalive_disable msie6 safari;",
        "keepalive_disable foo;",
        "log_subrequest x;",
    ] {
        let p = Prefix::new();
        let f = p.write(
            "conf/t.conf",
            format!("events {{}}\nhttp {{ server {{ {} }} }}\n", d),
        );
        let path = f.to_str().unwrap_or("");
        let ours = p.run(&["-t", "-c", path]);
        let theirs = std::process::Command::new(NGINX)
            .args(["-t", "-c", path, "-e", "/dev/null"])
            .arg("-p")
            .arg(&p.dir)
            .output()
            .expect("run nginx");
        let clean = |o: &std::process::Output, who: &str| {
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .filter(|l| {
                    !l.contains("syntax is ok")
                        && !l.contains("test is successful")
                        && !l.contains("test failed")
                })
                .map(|l| l.replacen(&format!("{}: ", who), "", 1))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(clean(&ours, "tern"), clean(&theirs, "nginx"), "{}", d);
        assert_eq!(ours.status.code(), theirs.status.code(), "{}", d);
    }
}

/// Seconds to download `path` whole, checking the bytes. The client
/// waits up to a minute for each read: a paced response pauses up to a
/// second between pieces, and on a loaded machine a stall once made
/// the usual 5 s read timeout cut a download short at its first 100 KB.
fn timed_download(s: &Server, path: &str, want: &[u8]) -> f64 {
    let t = std::time::Instant::now();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let raw = crate::harness::raw_within(s.port, req.as_bytes(), Duration::from_secs(60));
    let r = crate::harness::Resp::parse(&raw).expect("a response");
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
fn limit_rate_paces_files_and_proxied_bodies() {
    let p = Prefix::new();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    p.write("html/f.bin", &data);
    let backend = crate::harness::free_port();
    let s = Server::start_in(
        p,
        &format!(
            "http {{\n\
             server {{ listen 127.0.0.1:{backend}; location / {{ }} }}\n\
             server {{ listen 127.0.0.1:@PORT@;\n\
               location /plain/ {{ alias html/; limit_rate 100k; }}\n\
               location /sendfile/ {{ alias html/; sendfile on; limit_rate 100k; }}\n\
               location /after/ {{ alias html/; limit_rate 100k; limit_rate_after 1m; }}\n\
               location /if/ {{ alias html/; if ($arg_slow) {{ limit_rate 100k; }} }}\n\
               location /proxied/ {{ limit_rate 100k; proxy_pass http://127.0.0.1:{backend}/; }}\n\
             }}\n\
             }}\n"
        ),
    );
    // 300 KB at 100 KB/s: the third 100 KB may go in the third second.
    for path in [
        "/plain/f.bin",
        "/sendfile/f.bin",
        "/if/f.bin?slow=1",
        "/proxied/f.bin",
    ] {
        let secs = timed_download(&s, path, &data);
        assert!(secs >= 1.5, "{} took {:.2} s", path, secs);
    }
    // Not limited: the same bytes (no lower bound to check).
    timed_download(&s, "/after/f.bin", &data);
    timed_download(&s, "/if/f.bin", &data);
}
