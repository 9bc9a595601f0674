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
