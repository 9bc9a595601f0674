//! `geo`: networks (IPv4, IPv6, longest prefix, delete), ranges, proxies
//! and X-Forwarded-For, compared with nginx on the same configuration;
//! configuration errors worded as nginx's.

use crate::differential::{exchange, normalize};
use crate::harness::*;

const CONF: &str = r#"
worker_processes 1;
events {}
http {
    access_log off;
    geo $arg_ip $c {
        default dflt;
        10.0.0.0/8 ten;
        10.1.0.0/16 ten-one;
        10.1.2.3 host;
        10.1.2.3/32 host-again;
        192.168.1.0/24 lan;
        delete 192.168.1.0/24;
        1.2.3.5/30 lowbits;
        2001:db8::/32 v6doc;
        2001:db8:1::/48 v6one;
        255.255.255.255 none;
        0.0.0.0/1 lowhalf;
    }
    geo $arg_ip $r {
        ranges;
        default rdflt;
        10.0.0.0-10.255.255.255 ten;
        10.1.0.0-10.1.255.255 ten-one;
        10.1.2.0-10.1.2.255 ten-one-two;
        192.168.0.0-192.168.0.10 a;
        192.168.0.5-192.168.0.5 b;
        172.16.0.0-172.17.0.255 c;
        delete 172.17.0.0-172.17.0.255;
    }
    geo $n { default d; 127.0.0.0/8 loop; }
    geo $p { proxy 127.0.0.1; proxy_recursive; default d; 10.0.0.0/8 ten; 127.0.0.1 local; 192.168.0.0/16 lan; }
    geo $q { proxy 127.0.0.0/8; proxy 10.0.0.0/8; default d; 10.0.0.0/8 ten; 127.0.0.1 local; 192.168.0.0/16 lan; }
    geo $e { }
    server {
        listen 127.0.0.1:@PORT@;
        location / { return 200 "c=$c r=$r n=$n p=$p q=$q e=[$e]\n"; }
    }
}
"#;

const IPS: &[&str] = &[
    "10.1.2.3",
    "10.1.2.4",
    "10.1.9.9",
    "10.9.9.9",
    "192.168.1.7",
    "1.2.3.4",
    "1.2.3.6",
    "1.2.3.8",
    "2001:db8::1",
    "2001:db8:1::5",
    "2001:db9::1",
    "::ffff:10.1.2.3",
    "::1",
    "garbage",
    "255.255.255.255",
    "0.0.0.0",
    "192.168.0.4",
    "192.168.0.5",
    "192.168.0.6",
    "192.168.0.10",
    "192.168.0.11",
    "172.16.3.3",
    "172.17.0.3",
    "172.17.1.3",
    "200.1.1.1",
];

const XFF: &[&str] = &[
    "10.1.1.1",
    "10.1.1.1, 127.0.0.1",
    "192.168.1.1, 10.2.2.2",
    "192.168.1.1,10.2.2.2, 127.0.0.5",
    "garbage",
    "10.0.0.1:80",
    "[2001:db8::1]:80",
    " , ",
    "192.168.1.1 10.2.2.2",
];

fn corpus() -> Vec<String> {
    let mut reqs = vec!["GET / HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n".to_string()];
    for ip in IPS {
        reqs.push(format!(
            "GET /?ip={} HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n",
            ip
        ));
    }
    for x in XFF {
        reqs.push(format!(
            "GET / HTTP/1.1\r\nHost: g\r\nX-Forwarded-For: {}\r\nConnection: close\r\n\r\n",
            x
        ));
    }
    reqs
}

#[test]
fn geo_same_as_nginx() {
    if !nginx_installed() {
        return;
    }
    let pn = Prefix::new();
    let nport = free_port();
    let Some(nginx) = start_nginx(&pn, CONF, nport) else {
        panic!("nginx did not start");
    };
    let tern = Server::start(CONF);
    let reqs = corpus();
    let mut diffs = Vec::new();
    for r in &reqs {
        let a = normalize(&exchange(nport, r.as_bytes()), nport);
        let b = normalize(&exchange(tern.port, r.as_bytes()), tern.port);
        if a != b {
            diffs.push(format!("=== {:?}\n--- nginx\n{}\n--- tern\n{}\n", r, a, b));
        }
    }
    drop(nginx);
    assert!(
        diffs.is_empty(),
        "{} of {} differ:\n{}",
        diffs.len(),
        reqs.len(),
        diffs.concat()
    );
    eprintln!("{} requests, all identical to nginx", reqs.len());
}

/// The `[emerg]` line of `-t` for a configuration, with the program name
/// and path removed.
fn emerg(program: &str, p: &Prefix, body: &str) -> String {
    let conf = p.write(
        "conf/t.conf",
        format!("events {{}}\nhttp {{\n{}\n}}\n", body),
    );
    let out = std::process::Command::new(program)
        .arg("-t")
        .arg("-p")
        .arg(format!("{}/", p.dir.display()))
        .arg("-c")
        .arg(&conf)
        .output()
        .expect("run -t");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.lines()
        .rfind(|l| l.contains("[emerg]"))
        .map(|l| {
            let m = l.split_once("[emerg] ").map_or(l, |(_, m)| m);
            // The error-log form has "PID#TID: " first.
            let m = match m.split_once(": ") {
                Some((pid, rest)) if pid.contains('#') => rest,
                _ => m,
            };
            m.replace(&p.dir.display().to_string(), "PREFIX")
        })
        .unwrap_or_default()
}

#[test]
fn geo_errors_as_nginx() {
    if !nginx_installed() {
        return;
    }
    let cases = [
        "geo $g { 10.0.0.0/33 x; }",
        "geo $g { 10.0.0.300 x; }",
        "geo $g { ::1/129 x; }",
        "geo $g { default; }",
        "geo $g { 10.0.0.1 a b; }",
        "geo $g { default x; ranges; }",
        "geo $g { ranges; 10.0.0.1 x; }",
        "geo $g { ranges; 10.0.0.5-10.0.0.1 x; }",
        "geo $g { ranges; 10.0.0.1-255.255.255.255 x; }",
        "geo $g { ranges; 10.0.0.1-10.0.0.9 x; 10.0.0.5-10.0.0.20 y; }",
        "geo $g { ranges; 10.0.0.5-10.0.0.6 x; 10.0.0.1-10.0.1.20 y; }",
        "geo $g { proxy 10.0.0.0/99; }",
        "geo g { }",
        "geo $a g { }",
        "geo $g { 10.0.0.0/8 x { } }",
    ];
    let mut bad = Vec::new();
    for c in cases {
        let n = emerg(NGINX, &Prefix::new(), c);
        let t = emerg(BIN, &Prefix::new(), c);
        assert!(!n.is_empty(), "nginx accepted {}", c);
        if n != t {
            bad.push(format!("{}\n  nginx: {}\n  tern:  {}\n", c, n, t));
        }
    }
    assert!(bad.is_empty(), "{}", bad.concat());
}
