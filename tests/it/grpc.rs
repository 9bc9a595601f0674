//! `grpc_pass` with a real gRPC server and client (Python's grpcio, the
//! Debian package python3-grpcio; `grpc_peer.py` beside this file is
//! both): unary and streaming calls both ways through tern's cleartext
//! HTTP/2 listener, status and trailers, `grpc_set_header`, `grpcs://`,
//! `grpc_next_upstream` past a dead peer, `grpc_read_timeout`, and
//! `grpc_intercept_errors`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::harness::{free_port, DeadPort, Prefix, Server};

const PY: &str = "/usr/bin/python3";
const PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/grpc_peer.py");

fn grpcio() -> bool {
    let ok = Command::new(PY)
        .args(["-c", "import grpc"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: python3-grpcio not installed");
    }
    ok
}

/// The Python gRPC server, killed when dropped.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn peer(port: u16, tls: Option<(&str, &str)>) -> Peer {
    let mut c = Command::new(PY);
    c.arg(PEER).arg("server").arg(port.to_string());
    if let Some((cert, key)) = tls {
        c.args([cert, key]);
    }
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    let out = child.stdout.take().expect("stdout");
    let mut line = String::new();
    let _ = BufReader::new(out).read_line(&mut line);
    assert_eq!(line.trim(), "ready", "grpc server did not start");
    Peer(child)
}

/// The client's results, one line per call.
fn client(port: u16, prefix: &str) -> String {
    let out = Command::new(PY)
        .arg(PEER)
        .arg("client")
        .arg(port.to_string())
        .arg(prefix)
        .output()
        .expect("python3");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn grpc_pass_relays_calls_both_ways() {
    if !grpcio() {
        return;
    }
    let g = free_port();
    let _peer = peer(g, None);
    let dead = DeadPort::new();
    let p = Prefix::new();
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    p.write("conf/g.crt", c.cert.pem());
    p.write("conf/g.key", c.key_pair.serialize_pem());
    let gs = free_port();
    let _tls_peer = peer(
        gs,
        Some((
            p.path("conf/g.crt").to_str().unwrap(),
            p.path("conf/g.key").to_str().unwrap(),
        )),
    );
    let conf = format!(
        "http {{\n\
         log_format g \"$uri $status $upstream_addr $upstream_status\";\n\
         upstream dg {{ server 127.0.0.1:{dead}; server 127.0.0.1:{g}; }}\n\
         server {{ listen 127.0.0.1:@PORT@ http2;\n\
           access_log logs/g.log g;\n\
           grpc_read_timeout 1s;\n\
           location / {{ grpc_pass grpc://127.0.0.1:{g}; grpc_set_header X-Set from-tern; }}\n\
           location /tls/ {{ rewrite ^/tls(/.*)$ $1 break; grpc_pass grpcs://127.0.0.1:{gs}; }}\n\
           location /next/ {{ rewrite ^/next(/.*)$ $1 break; grpc_pass dg; }}\n\
         }}\n\
         }}\n",
        dead = dead.port
    );
    let s = Server::start_in(p, &conf);
    let plain = client(s.port, "");
    let want = "unary OK (b'echo:hi|from-tern', [('x-trailer', 'yes')])\n\
                fail ERR NOT_FOUND no such thing\n\
                sstream OK [b'm0', b'm1', b'm2']\n\
                cstream OK b'a,b,c'\n\
                bidi OK [b'<x>', b'<y>']\n\
                big OK 300015\n\
                held OK [b'first', b'released', b'second']\n";
    assert!(plain.starts_with(want), "{plain}\n{}", s.error_log());
    // grpc_read_timeout 1s: the slow call gets a 504, which a gRPC
    // client sees as UNAVAILABLE.
    assert!(plain.contains("slow ERR UNAVAILABLE"), "{plain}");
    let log = s.error_log();
    assert!(
        log.contains("upstream timed out (110: Connection timed out) while reading response header from upstream")
            && log.contains(&format!("upstream: \"grpc://127.0.0.1:{g}\"")),
        "{log}"
    );
    let tls = client(s.port, "/tls");
    assert!(
        tls.starts_with("unary OK (b'echo:hi|-', [('x-trailer', 'yes')])\nfail ERR NOT_FOUND no such thing\nsstream OK [b'm0', b'm1', b'm2']"),
        "{tls}\n{}",
        s.error_log()
    );
    let next = client(s.port, "/next");
    assert!(
        next.starts_with("unary OK (b'echo:hi|-', [('x-trailer', 'yes')])\n"),
        "{next}\n{}",
        s.error_log()
    );
    let glog = crate::harness::wait_log(
        &s.prefix,
        "logs/g.log",
        &format!("127.0.0.1:{}, 127.0.0.1:{g} 502, 200", dead.port),
    );
    assert!(
        glog.contains(&format!("/t.S/Unary 200 127.0.0.1:{g} 200")),
        "{glog}"
    );
}

#[test]
fn grpc_pass_failure_goes_to_error_page() {
    if !grpcio() {
        return;
    }
    let dead = DeadPort::new();
    let conf = format!(
        "http {{\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ grpc_pass 127.0.0.1:{}; error_page 502 = /e; }}\n\
           location = /e {{ return 200 \"fallback\\n\"; }}\n\
         }}\n\
         }}\n",
        dead.port
    );
    let s = Server::start(&conf);
    let r = s.get("/t.S/Unary");
    assert_eq!(r.status, 200, "{}", s.error_log());
    assert_eq!(r.body_str(), "fallback\n");
    // Error-log lines are written by a writer thread: wait for it.
    s.wait_error_log(&format!("upstream: \"grpc://127.0.0.1:{}\"", dead.port));
}
