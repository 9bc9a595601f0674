//! The stream modules beside the proxy: `return`, `set`, `map`,
//! `split_clients`, `geo`, `allow`/`deny`, `limit_conn`, `access_log`
//! with stream variables, PROXY protocol in (`listen ... proxy_protocol`,
//! realip) and out (`proxy_protocol on`), `ssl_preread` routing by SNI,
//! TLS termination, `hash` balancing. Where the bytes matter, the same
//! configuration runs in nginx (with Debian's stream module) and the
//! answers and log lines are compared.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use crate::harness::*;

const HTTP: &str = "http { server { listen 127.0.0.1:@PORT@; } }\n";
const STREAM_SO: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// Starts tern with `@S1@`.. replaced by `ports`; waits for each of them.
fn start(conf: &str, ports: &[u16]) -> Server {
    let text = fill(conf, ports);
    let mut srv = Server::start_in(Prefix::new(), &text);
    for p in ports {
        srv.wait_listening(*p);
    }
    srv
}

fn fill(conf: &str, ports: &[u16]) -> String {
    let mut t = conf.to_string();
    for (i, p) in ports.iter().enumerate() {
        t = t.replace(&format!("@S{}@", i + 1), &p.to_string());
    }
    t
}

/// Reads what the server sends until it closes.
fn read_all(port: u16, send: &[u8]) -> Vec<u8> {
    let mut c = connect(port);
    c.set_read_timeout(Some(Duration::from_secs(10))).ok();
    if !send.is_empty() {
        c.write_all(send).expect("write");
    }
    read_to_close(&mut c)
}

/// A backend that records the first bytes of each connection and answers
/// with `tag`.
fn recording_backend(tag: &'static str) -> (u16, std::sync::mpsc::Receiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            s.set_read_timeout(Some(Duration::from_millis(500))).ok();
            let mut buf = vec![0u8; 4096];
            let mut got = Vec::new();
            // The PROXY line and the client's bytes may come apart.
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                if got.ends_with(b"END") {
                    break;
                }
            }
            let _ = tx.send(got);
            let _ = s.write_all(tag.as_bytes());
        }
    });
    (port, rx)
}

#[test]
fn return_set_map_and_variables() {
    let (s1, s2) = (free_port(), free_port());
    let srv = start(
        &format!(
            "{HTTP}stream {{
                map $server_port $m {{ @S1@ one; default other; ~^(?<p>\\d+)$ re$p; }}
                server {{ listen 127.0.0.1:@S1@;
                          set $s \"set:$m\";
                          return \"$m|$s|$server_addr|$protocol|$remote_addr|$status\"; }}
                server {{ listen 127.0.0.1:@S2@; return $m; }}
            }}"
        ),
        &[s1, s2],
    );
    assert_eq!(
        read_all(s1, b""),
        b"one|set:one|127.0.0.1|TCP|127.0.0.1|200".to_vec()
    );
    assert_eq!(read_all(s2, b""), format!("re{}", s2).into_bytes());
    drop(srv);
}

#[test]
fn deny_closes_and_logs_403() {
    let s1 = free_port();
    let srv = start(
        &format!(
            "{HTTP}stream {{
                log_format st \"$status $bytes_sent $bytes_received\";
                server {{ listen 127.0.0.1:@S1@; deny 127.0.0.1; return OK;
                          access_log logs/st.log st; }}
            }}"
        ),
        &[s1],
    );
    assert_eq!(read_all(s1, b""), b"".to_vec());
    srv.wait_error_log("access forbidden by rule, client: 127.0.0.1");
    // The harness's readiness probe was refused too: two lines.
    let mut log = String::new();
    eventually(10, "access log lines", || {
        log = std::fs::read_to_string(srv.prefix.path("logs/st.log")).unwrap_or_default();
        log.lines().count() >= 2
    });
    assert_eq!(log, "403 0 0\n403 0 0\n");
}

#[test]
fn limit_conn_rejects_second_session() {
    // A backend that never reads: the kernel completes connections in its
    // backlog, so a proxied session stays open until its client closes.
    let hold = TcpListener::bind("127.0.0.1:0").expect("bind");
    let be = hold.local_addr().expect("addr").port();
    let s1 = free_port();
    let srv = start(
        &format!(
            "{HTTP}stream {{
                limit_conn_zone $binary_remote_addr zone=z:1m;
                log_format st $status:$limit_conn_status;
                error_log logs/error.log info;
                server {{ listen 127.0.0.1:@S1@; limit_conn z 1; proxy_pass 127.0.0.1:{be};
                          access_log logs/st.log st; }}
            }}"
        ),
        &[s1],
    );
    // wait_listening's probe made a session too: let it end first.
    srv.wait_error_log("client disconnected");
    let held = connect(s1);
    srv.wait_error_log_n("proxy connected to", 2);
    assert_eq!(read_all(s1, b""), b"".to_vec());
    srv.wait_error_log("limiting connections by zone \"z\"");
    drop(held);
    eventually(10, "503 then 200 logged", || {
        let log = std::fs::read_to_string(srv.prefix.path("logs/st.log")).unwrap_or_default();
        log.contains("503:REJECTED\n") && log.contains("200:PASSED\n")
    });
    drop(hold);
}

#[test]
fn proxy_protocol_in_realip_and_out() {
    let (be, rx) = recording_backend("done");
    let (s1, s2) = (free_port(), free_port());
    let _srv = start(
        &format!(
            "{HTTP}stream {{
                server {{ listen 127.0.0.1:@S1@ proxy_protocol; set_real_ip_from 127.0.0.1;
                          return \"$remote_addr:$remote_port $realip_remote_addr $proxy_protocol_addr:$proxy_protocol_port $proxy_protocol_server_addr:$proxy_protocol_server_port\"; }}
                server {{ listen 127.0.0.1:@S2@; proxy_protocol on; proxy_pass 127.0.0.1:{be}; }}
            }}"
        ),
        &[s1, s2],
    );
    let got = read_all(s1, b"PROXY TCP4 192.0.2.1 192.0.2.2 1234 5678\r\n");
    assert_eq!(
        String::from_utf8_lossy(&got),
        "192.0.2.1:1234 127.0.0.1 192.0.2.1:1234 192.0.2.2:5678"
    );
    // A broken header ends the session.
    assert_eq!(read_all(s1, b"GARBAGE\r\n"), b"".to_vec());

    let mut c = connect(s2);
    let local = c.local_addr().expect("local");
    c.write_all(b"hello END").expect("write");
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    assert_eq!(answer, b"done");
    // The harness's readiness probe of S2 made a session first.
    let up = loop {
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("backend saw");
        if got.ends_with(b"END") {
            break got;
        }
    };
    assert_eq!(
        String::from_utf8_lossy(&up),
        format!(
            "PROXY TCP4 127.0.0.1 127.0.0.1 {} {}\r\nhello END",
            local.port(),
            s2
        )
    );
}

/// A ClientHello with `sni` as rustls writes it.
fn client_hello(sni: &str) -> Vec<u8> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = rustls::ClientConfig::builder()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).expect("name");
    let mut c = rustls::ClientConnection::new(Arc::new(cfg), name).expect("client");
    let mut out = Vec::new();
    c.write_tls(&mut out).expect("hello");
    out
}

#[test]
fn ssl_preread_routes_by_sni() {
    let (a, _ra) = recording_backend("A");
    let (b, _rb) = recording_backend("B");
    let (s1, s2) = (free_port(), free_port());
    let _srv = start(
        &format!(
            "{HTTP}stream {{
                map $ssl_preread_server_name $to {{ a.test 127.0.0.1:{a}; default 127.0.0.1:{b}; }}
                server {{ listen 127.0.0.1:@S1@; ssl_preread on; proxy_pass $to; }}
                server {{ listen 127.0.0.1:@S2@; ssl_preread on;
                          return \"$ssl_preread_server_name|$ssl_preread_protocol\"; }}
            }}"
        ),
        &[s1, s2],
    );
    let mut ha = client_hello("a.test");
    ha.extend_from_slice(b"END");
    assert_eq!(read_all(s1, &ha), b"A".to_vec());
    let mut hb = client_hello("b.test");
    hb.extend_from_slice(b"END");
    assert_eq!(read_all(s1, &hb), b"B".to_vec());
    assert_eq!(
        String::from_utf8_lossy(&read_all(s2, &client_hello("x.test"))),
        "x.test|TLSv1.3"
    );
}

#[test]
fn hash_balancing_is_sticky() {
    let (a, _ra) = recording_backend("A");
    let (b, _rb) = recording_backend("B");
    let (c, _rc) = recording_backend("C");
    let s1 = free_port();
    let _srv = start(
        &format!(
            "{HTTP}stream {{
                upstream u {{ hash $remote_addr; server 127.0.0.1:{a}; server 127.0.0.1:{b}; server 127.0.0.1:{c}; }}
                server {{ listen 127.0.0.1:@S1@; proxy_pass u; }}
            }}"
        ),
        &[s1],
    );
    let first = read_all(s1, b"END");
    for _ in 0..5 {
        assert_eq!(read_all(s1, b"END"), first);
    }
}

#[test]
fn stream_config_errors() {
    let p = Prefix::new();
    let conf = p.write(
        "conf/nginx.conf",
        "events {}\nstream {\n server { listen 127.0.0.1:1; return $nope; }\n}\n",
    );
    let out = p.run(&["-t", "-c", conf.to_str().expect("path")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown \"nope\" variable"), "{}", err);
    let conf = p.write(
        "conf/nginx.conf",
        "events {}\nstream {\n server { listen 127.0.0.1:1 ssl; return x; }\n}\n",
    );
    let out = p.run(&["-t", "-c", conf.to_str().expect("path")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive")
            && err.contains("nginx.conf:3"),
        "{}",
        err
    );
}

/// nginx with its stream module, if Debian's package is installed.
fn nginx_stream() -> bool {
    if !nginx_installed() {
        return false;
    }
    let ok = std::path::Path::new(STREAM_SO).exists();
    if !ok {
        eprintln!(
            "skipped: {} missing (.ci/run installs libnginx-mod-stream)",
            STREAM_SO
        );
    }
    ok
}

#[test]
fn differential_return_and_access_log() {
    if !nginx_stream() {
        return;
    }
    let body = "stream {
        log_format l \"$status|$bytes_sent|$bytes_received|$protocol|$remote_addr|$server_port|$upstream_addr|$upstream_bytes_received\";
        map $server_port $m { default \"mapped\"; }
        split_clients $remote_addr $sc { 50% x; * y; }
        geo $g { default none; 127.0.0.0/8 lo; }
        server { listen 127.0.0.1:@S1@; return \"$m $sc $g $remote_addr\"; access_log logs/s.log l; }
        server { listen 127.0.0.1:@S2@; proxy_pass 127.0.0.1:@S1@; access_log logs/s.log l; }
        server { listen 127.0.0.1:@S3@; deny all; return x; access_log logs/s.log l; }
    }\n";
    let run = |nginx: bool| -> (Vec<Vec<u8>>, String) {
        let ports = [free_port(), free_port(), free_port()];
        let p = Prefix::new();
        let text = fill(body, &ports);
        let (_nginx, _tern, log_path);
        if nginx {
            let conf = format!("load_module {STREAM_SO};\nevents {{}}\n{HTTP}{text}");
            // Listening on the http port means every listener is open:
            // no probe of the stream ports (it would be a logged session).
            _nginx = Some(start_nginx(&p, &conf, free_port()).expect("nginx started"));
            log_path = p.path("logs/s.log");
            _tern = None;
        } else {
            let t = start(&format!("{HTTP}{text}"), &[]);
            log_path = t.prefix.path("logs/s.log");
            _tern = Some(t);
            _nginx = None;
        }
        let answers: Vec<Vec<u8>> = ports.iter().map(|p| read_all(*p, b"")).collect();
        let mut log = String::new();
        // Four sessions (S2's goes through S1).
        eventually(10, "log lines", || {
            log = std::fs::read_to_string(&log_path).unwrap_or_default();
            log.lines().count() >= 4
        });
        // Ports differ between the two runs: name them.
        let mut named = log;
        for (i, p) in ports.iter().enumerate() {
            named = named.replace(&p.to_string(), &format!("S{}", i + 1));
        }
        let mut lines: Vec<&str> = named.lines().collect();
        lines.sort();
        (answers, lines.join("\n"))
    };
    let (na, nl) = run(true);
    let (ta, tl) = run(false);
    assert_eq!(ta, na, "answers differ from nginx");
    assert_eq!(tl, nl, "access log differs from nginx");
}

/// `hash KEY consistent` places keys on nginx's ketama ring: the same
/// keys reach the same backends as in nginx (same upstream text, so the
/// same points), weights included.
#[test]
fn consistent_hash_picks_as_nginx() {
    if !nginx_stream() {
        return;
    }
    let (a, _ra) = recording_backend("a");
    let (b, _rb) = recording_backend("b");
    let (c, _rc) = recording_backend("c");
    const KEYS: usize = 24;
    let mut body = format!(
        "stream {{\n upstream u {{ hash $k consistent; server 127.0.0.1:{a}; \
         server 127.0.0.1:{b} weight=2; server 127.0.0.1:{c}; }}\n"
    );
    for i in 0..KEYS {
        body.push_str(&format!(
            " server {{ listen 127.0.0.1:@S{}@; set $k key{i}; proxy_pass u; }}\n",
            i + 1
        ));
    }
    body.push_str("}\n");
    let run = |nginx: bool| -> String {
        let ports: Vec<u16> = (0..KEYS).map(|_| free_port()).collect();
        let text = fill(&body, &ports);
        let p = Prefix::new();
        let (_nginx, _tern);
        if nginx {
            let conf = format!("load_module {STREAM_SO};\nevents {{}}\n{HTTP}{text}");
            _nginx = Some(start_nginx(&p, &conf, free_port()).expect("nginx started"));
            _tern = None;
        } else {
            _tern = Some(Server::start_in(p, &format!("{HTTP}{text}")));
            _nginx = None;
        }
        ports
            .iter()
            .map(|p| String::from_utf8_lossy(&read_all(*p, b"END")).into_owned())
            .collect()
    };
    let n = run(true);
    let t = run(false);
    assert_eq!(n.len(), KEYS);
    assert_eq!(t, n, "keys land on other backends than nginx's");
}
