//! Datagram listeners (`listen ... quic` in http, `listen ... udp` in
//! stream) are bound by the master beside TCP listeners on the same port,
//! and their parameters are checked as nginx checks them.
use crate::harness::*;
use std::net::UdpSocket;

/// True when the UDP port is taken (tern holds it).
fn udp_taken(port: u16) -> bool {
    UdpSocket::bind(("127.0.0.1", port)).is_err()
}

#[test]
fn quic_and_udp_listeners_bind_beside_tcp() {
    let conf = "http { server { listen 127.0.0.1:@PORT@; listen 127.0.0.1:@PORT@ quic reuseport; \
                return 200 ok; } }\n";
    let s = Server::start(conf);
    assert!(udp_taken(s.port), "quic port not bound");
    let r = s.get("/");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"ok");

    let stream_port = free_port();
    let conf = format!(
        "stream {{ server {{ listen 127.0.0.1:{stream_port} udp; return x; }} }}\n\
         http {{ server {{ listen 127.0.0.1:@PORT@; return 200 ok; }} }}\n"
    );
    let s2 = Server::start(&conf);
    assert!(udp_taken(stream_port), "stream udp port not bound");
    drop(s2);
}

#[test]
fn quic_rejects_ssl_and_http2_as_nginx() {
    let p = Prefix::new();
    for (param, want) in [
        ("ssl", "\"ssl\" parameter is incompatible with \"quic\""),
        ("http2", "\"http2\" parameter is incompatible with \"quic\""),
    ] {
        let conf = p.write(
            "conf/nginx.conf",
            format!("events {{}}\nhttp {{ server {{ listen 127.0.0.1:9 quic {param}; }} }}\n"),
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
