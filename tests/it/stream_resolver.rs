//! `resolver` in the stream module: `proxy_pass` with variables naming a
//! host that is resolved when the session starts, against a DNS
//! responder run by the test. What each client reads, the access-log
//! line of each session (`$status`, `$upstream_addr`) and the error-log
//! messages are compared with nginx (Debian's stream module) on the same
//! configuration: a name without a port, a name not found, no resolver,
//! and several addresses tried in the order the DNS server gave them,
//! bounded by `proxy_next_upstream_tries`.

use std::time::Duration;

use crate::harness::{self, *};

const HTTP: &str = "http { server { listen 127.0.0.1:@PORT@; } }\n";
const STREAM_SO: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// A DNS responder on loopback: `a.test` has 127.0.0.1, every name
/// starting with `many` has 127.0.0.2, 127.0.0.2, 127.0.0.1 (in that
/// order), `nx.test` is NXDOMAIN; AAAA queries get no answers.
fn dns_responder() -> u16 {
    let (port, _) = harness::dns_responder(|name, qtype| {
        let rcode = if name == "nx.test" { 3 } else { 0 };
        let addrs = match name {
            _ if qtype != 1 => vec![],
            "a.test" => vec![[127, 0, 0, 1]],
            n if n.starts_with("many") => vec![[127, 0, 0, 2], [127, 0, 0, 2], [127, 0, 0, 1]],
            _ => vec![],
        };
        (rcode, addrs)
    });
    port
}

fn nginx_stream() -> bool {
    nginx_installed() && std::path::Path::new(STREAM_SO).exists()
}

fn read_port(port: u16) -> Vec<u8> {
    let mut c = connect(port);
    c.set_read_timeout(Some(Duration::from_secs(10))).ok();
    read_to_close(&mut c)
}

#[test]
fn stream_proxy_pass_resolves_names_as_nginx() {
    if !nginx_stream() {
        eprintln!("skipped: nginx or {STREAM_SO} missing");
        return;
    }
    let dns = dns_responder();
    let run = |nginx: bool| -> (Vec<Vec<u8>>, String, String) {
        let s: Vec<u16> = (0..8).map(|_| free_port()).collect();
        let be = s[7];
        let body = format!(
            "stream {{
            log_format r \"$server_port $status $upstream_addr\";
            access_log logs/r.log r;
            map $server_port $up {{
                {p0} a.test:{be};
                {p1} a.test;
                {p2} nx.test:{be};
                {p3} many3.test:{be};
                {p4} many2.test:{be};
                {p5} many0.test:{be};
                {p6} a.test:{be};
            }}
            server {{
                listen 127.0.0.1:{p0}; listen 127.0.0.1:{p1}; listen 127.0.0.1:{p2};
                resolver 127.0.0.1:{dns};
                proxy_pass $up;
            }}
            server {{
                listen 127.0.0.1:{p3};
                resolver 127.0.0.1:{dns}; resolver_timeout 5s;
                proxy_pass $up; proxy_next_upstream_tries 3;
            }}
            server {{
                listen 127.0.0.1:{p4};
                resolver 127.0.0.1:{dns};
                proxy_pass $up; proxy_next_upstream_tries 2;
            }}
            server {{
                listen 127.0.0.1:{p5};
                resolver 127.0.0.1:{dns};
                proxy_pass $up; proxy_next_upstream_tries 0;
            }}
            server {{ listen 127.0.0.1:{p6}; proxy_pass $up; }}
            server {{ listen 127.0.0.1:{be}; return SEEN; access_log off; }}
        }}\n",
            p0 = s[0],
            p1 = s[1],
            p2 = s[2],
            p3 = s[3],
            p4 = s[4],
            p5 = s[5],
            p6 = s[6],
        );
        // Kept to the end of the run: the server, and nginx's prefix.
        let (mut _nginx, mut _prefix, mut _tern) = (None, None, None);
        let dir;
        if nginx {
            let p = Prefix::new();
            let conf = format!("load_module {STREAM_SO};\nevents {{}}\n{HTTP}{body}");
            _nginx = Some(start_nginx(&p, &conf, free_port()).expect("nginx started"));
            dir = p.dir.clone();
            _prefix = Some(p);
        } else {
            let t = Server::start_in(
                Prefix::new(),
                &format!("error_log logs/error.log;\n{HTTP}{body}"),
            );
            dir = t.prefix.dir.clone();
            _tern = Some(t);
        }
        let read = |rel: &str| std::fs::read_to_string(dir.join(rel)).unwrap_or_default();
        let answers: Vec<Vec<u8>> = s[..7].iter().map(|port| read_port(*port)).collect();
        let mut log = String::new();
        eventually(10, "seven access-log lines", || {
            log = read("logs/r.log");
            log.lines().count() >= 7
        });
        let mut named = log.replace(&format!(":{be}"), ":BE");
        for (i, port) in s[..7].iter().enumerate() {
            named = named.replace(&port.to_string(), &format!("S{i}"));
        }
        let mut lines: Vec<&str> = named.lines().collect();
        lines.sort();
        // Error lines are written by the log writer: they may land after
        // the access-log lines.
        eventually(10, "the error lines", || {
            let e = read("logs/error.log");
            e.contains("could not be resolved") && e.contains("no resolver defined")
        });
        (answers, lines.join("\n"), read("logs/error.log"))
    };
    let (na, nl, ne) = run(true);
    let (ta, tl, te) = run(false);
    let seen = b"SEEN".to_vec();
    assert_eq!(
        na,
        vec![
            seen.clone(),
            Vec::new(),
            Vec::new(),
            seen.clone(),
            Vec::new(),
            seen.clone(),
            Vec::new()
        ],
        "nginx's answers"
    );
    assert_eq!(ta, na, "answers differ from nginx");
    assert_eq!(tl, nl, "access log differs from nginx");
    for msg in [
        "no port in upstream \"a.test\"",
        "nx.test could not be resolved (3: Host not found)",
        "no resolver defined to resolve a.test",
    ] {
        assert!(ne.contains(msg), "nginx logs {msg:?}:\n{ne}");
        assert!(te.contains(msg), "tern logs {msg:?}:\n{te}");
    }
}
