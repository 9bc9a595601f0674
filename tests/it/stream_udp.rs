//! UDP in the stream module (`listen ... udp`): sessions keyed by the
//! client's address, `proxy_requests` / `proxy_responses` /
//! `proxy_timeout`, `return` as one datagram, and the access-log line of
//! each session, compared with nginx (Debian's stream module) on the same
//! configuration with a DNS-like backend: one answer per question.

use std::net::UdpSocket;
use std::time::Duration;

use crate::harness::*;

const HTTP: &str = "http { server { listen 127.0.0.1:@PORT@; } }\n";
const STREAM_SO: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// A DNS-like backend: answers each datagram with `A:` and the question;
/// a question starting with `silent` gets no answer, `port` gets the
/// sender's port (which upstream socket of tern's it came from).
fn dns_backend() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind backend");
    let port = s.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            let q = &buf[..n];
            if q.starts_with(b"silent") {
                continue;
            }
            let answer = if q.starts_with(b"port") {
                from.port().to_string().into_bytes()
            } else {
                [b"A:".as_slice(), q].concat()
            };
            let _ = s.send_to(&answer, from);
        }
    });
    port
}

/// A client socket with a read timeout.
fn client() -> UdpSocket {
    let c = UdpSocket::bind("127.0.0.1:0").expect("bind client");
    c.set_read_timeout(Some(Duration::from_millis(1500)))
        .expect("timeout");
    c
}

/// Sends `q` to `port` and returns the answer (empty: none came).
fn ask(c: &UdpSocket, port: u16, q: &[u8]) -> Vec<u8> {
    c.send_to(q, ("127.0.0.1", port)).expect("send");
    let mut buf = [0u8; 2048];
    match c.recv(&mut buf) {
        Ok(n) => buf[..n].to_vec(),
        Err(_) => Vec::new(),
    }
}

fn fill(conf: &str, ports: &[u16]) -> String {
    let mut t = conf.to_string();
    for (i, p) in ports.iter().enumerate() {
        t = t.replace(&format!("@S{}@", i + 1), &p.to_string());
    }
    t
}

fn nginx_stream() -> bool {
    nginx_installed() && std::path::Path::new(STREAM_SO).exists()
}

#[test]
fn udp_sessions_and_log_lines_as_nginx() {
    if !nginx_stream() {
        eprintln!("skipped: nginx or {STREAM_SO} missing");
        return;
    }
    let be = dns_backend();
    let body = format!(
        "stream {{
        log_format u \"$status|$protocol|$bytes_sent|$bytes_received|$upstream_addr|$upstream_bytes_sent|$upstream_bytes_received\";
        proxy_timeout 400ms;
        server {{ listen 127.0.0.1:@S1@ udp; proxy_pass 127.0.0.1:{be}; proxy_responses 1; access_log logs/u.log u; }}
        server {{ listen 127.0.0.1:@S2@ udp; return \"r:$remote_addr:$protocol\"; access_log logs/u.log u; }}
        server {{ listen 127.0.0.1:@S3@ udp; proxy_pass 127.0.0.1:{be}; proxy_requests 2; proxy_responses 1; access_log logs/u.log u; }}
        server {{ listen 127.0.0.1:@S4@ udp; deny all; return x; access_log logs/u.log u; }}
    }}\n"
    );
    let run = |nginx: bool| -> (Vec<Vec<u8>>, String) {
        let ports = [free_port(), free_port(), free_port(), free_port()];
        let p = Prefix::new();
        let text = fill(&body, &ports);
        let (_nginx, _tern, log_path);
        if nginx {
            let conf = format!("load_module {STREAM_SO};\nevents {{}}\n{HTTP}{text}");
            _nginx = Some(start_nginx(&p, &conf, free_port()).expect("nginx started"));
            log_path = p.path("logs/u.log");
            _tern = None;
        } else {
            let t = Server::start_in(p, &format!("{HTTP}{text}"));
            log_path = t.prefix.path("logs/u.log");
            _tern = Some(t);
            _nginx = None;
        }
        let mut answers = Vec::new();
        answers.push(ask(&client(), ports[0], b"q1"));
        answers.push(ask(&client(), ports[1], b"hello"));
        let c = client();
        answers.push(ask(&c, ports[2], b"a"));
        answers.push(ask(&c, ports[2], b"bb"));
        answers.push(ask(&client(), ports[3], b"z"));
        // Owed an answer, timed out: 502.
        answers.push(ask(&client(), ports[0], b"silent"));
        let mut log = String::new();
        eventually(10, "five log lines", || {
            log = std::fs::read_to_string(&log_path).unwrap_or_default();
            log.lines().count() >= 5
        });
        let named = log.replace(&be.to_string(), "BE");
        let mut lines: Vec<&str> = named.lines().collect();
        lines.sort();
        (answers, lines.join("\n"))
    };
    let (na, nl) = run(true);
    let (ta, tl) = run(false);
    assert_eq!(ta, na, "answers differ from nginx");
    assert_eq!(
        na,
        vec![
            b"A:q1".to_vec(),
            b"r:127.0.0.1:UDP".to_vec(),
            b"A:a".to_vec(),
            b"A:bb".to_vec(),
            Vec::new(),
            Vec::new()
        ]
    );
    assert_eq!(tl, nl, "access log differs from nginx");
}

#[test]
fn udp_proxy_requests_binds_a_client_to_its_session() {
    let be = dns_backend();
    let (s1, s2) = (free_port(), free_port());
    let conf = format!(
        "{HTTP}stream {{
        error_log logs/error.log info;
        proxy_timeout 2s;
        server {{ listen 127.0.0.1:{s1} udp; proxy_pass 127.0.0.1:{be}; proxy_requests 2; }}
        server {{ listen 127.0.0.1:{s2} udp; proxy_pass 127.0.0.1:{be}; }}
    }}\n"
    );
    let srv = Server::start(&conf);
    // proxy_requests 2: two datagrams per session (one upstream socket),
    // the third starts a new session.
    let c = client();
    let a = ask(&c, s1, b"port");
    let b = ask(&c, s1, b"port");
    let n = ask(&c, s1, b"port");
    assert!(!a.is_empty(), "no answer");
    assert_eq!(a, b, "second datagram left its session");
    assert_ne!(a, n, "third datagram stayed in a used-up session");
    // Unset: the client stays bound while the session lives.
    let c = client();
    let a = ask(&c, s2, b"port");
    for _ in 0..3 {
        assert_eq!(ask(&c, s2, b"port"), a, "binding lost");
    }
    let log = srv.wait_error_log("udp client 127.0.0.1:");
    assert!(
        log.contains(&format!("connected to 127.0.0.1:{s1}")),
        "{log}"
    );
}

#[test]
fn udp_listen_parameters_checked_as_nginx() {
    let p = Prefix::new();
    for (param, want) in [
        ("ssl", "\"ssl\" parameter is incompatible with \"udp\""),
        (
            "proxy_protocol",
            "\"proxy_protocol\" parameter is incompatible with \"udp\"",
        ),
        (
            "backlog=10",
            "\"backlog\" parameter is incompatible with \"udp\"",
        ),
    ] {
        let conf = p.write(
            "conf/nginx.conf",
            format!(
                "events {{}}\nstream {{ server {{ listen 127.0.0.1:9 udp {param}; return x; }} }}\n"
            ),
        );
        let out = p.run(&["-t", "-c", conf.to_str().expect("utf-8 path")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{param}: accepted");
        assert!(
            err.contains(&format!("{want} in {}:2", conf.display())),
            "{param}: {err}"
        );
    }
}
