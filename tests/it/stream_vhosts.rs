//! Stream virtual servers and the other stream features of nginx newer
//! than Debian's 1.22.1 that tern implements as nginx documents them:
//! `server_name` selected by the SNI name of an `ssl` address's
//! handshake or of `ssl_preread` (1.25.5), `ssl_reject_handshake`,
//! `ssl_certificate` with variables, `pass` (1.25.5) to http and stream
//! listeners, `$proxy_protocol_tlv_*` (1.23.2). The reference nginx here
//! has none of them, so the expected bytes are those nginx-tests and
//! nginx's documentation give.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};

use crate::harness::*;

const HTTP: &str = "http { server { listen 127.0.0.1:@PORT@; } }\n";

/// A self-signed certificate for `name` in `conf/NAME.crt`, `NAME.key`;
/// its DER.
fn cert(p: &Prefix, name: &str) -> Vec<u8> {
    let key = rcgen::KeyPair::generate().expect("key");
    let c = rcgen::CertificateParams::new(vec![name.to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    p.write(&format!("conf/{name}.crt"), c.pem());
    p.write(&format!("conf/{name}.key"), key.serialize_pem());
    c.der().to_vec()
}

/// What a TLS session with `sni` (None: no SNI) reads until the server
/// closes, with the server's certificate; Err: the handshake failed.
fn tls_read(port: u16, sni: Option<&str>) -> Result<(Vec<u8>, Vec<u8>), String> {
    let name = match sni {
        Some(n) => ServerName::try_from(n.to_string()).expect("name"),
        // An address as the name: rustls sends no SNI.
        None => ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
    };
    let conn = ClientConnection::new(crate::tls_client_cert::client(None), name).expect("client");
    let sock = connect(port);
    sock.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut s: StreamOwned<ClientConnection, TcpStream> = StreamOwned::new(conn, sock);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if out.is_empty() && s.conn.is_handshaking() => return Err(e.to_string()),
            Err(_) => break,
        }
    }
    let peer = s
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    Ok((out, peer))
}

fn text(port: u16, sni: Option<&str>) -> String {
    match tls_read(port, sni) {
        Ok((b, _)) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => format!("error: {e}"),
    }
}

fn start(p: Prefix, conf: &str, ports: &[u16]) -> Server {
    let mut srv = Server::start_in(p, conf);
    for port in ports {
        srv.wait_listening(*port);
    }
    srv
}

fn read_all(port: u16, send: &[u8]) -> Vec<u8> {
    let mut c = connect(port);
    // Generous: a timeout here cuts the answer short on a loaded machine.
    c.set_read_timeout(Some(Duration::from_secs(60))).ok();
    if !send.is_empty() {
        c.write_all(send).expect("write");
    }
    read_to_close(&mut c)
}

#[test]
fn stream_server_name_by_sni_and_reject_handshake() {
    let p = Prefix::new();
    cert(&p, "localhost");
    let (s1, s2) = (free_port(), free_port());
    let conf = format!(
        "{HTTP}stream {{
        server_names_hash_bucket_size 64;
        ssl_certificate localhost.crt; ssl_certificate_key localhost.key;
        server {{ listen 127.0.0.1:{s1} ssl; server_name localhost; return $server_name; }}
        server {{ listen 127.0.0.1:{s1}; server_name www.example.com; return $server_name; }}
        server {{ listen 127.0.0.1:{s1}; server_name ~^(?P<name>[a-z]+)\\.example\\.com$;
                  return re:$name; }}
        server {{ listen 127.0.0.1:{s1}; server_name *.wc.example.com; return $server_name; }}
        server {{ listen 127.0.0.1:{s1}; server_name .dot.example.com; return $server_name; }}
        server {{ listen 127.0.0.1:{s2} ssl; server_name one; ssl_reject_handshake on;
                  return one; }}
        server {{ listen 127.0.0.1:{s2}; server_name two; return two:$ssl_server_name; }}
    }}\n"
    );
    let _srv = start(p, &conf, &[s1, s2]);
    assert_eq!(text(s1, Some("xxx")), "localhost");
    assert_eq!(text(s1, None), "localhost");
    assert_eq!(text(s1, Some("www.example.com")), "www.example.com");
    assert_eq!(text(s1, Some("blah.example.com")), "re:blah");
    assert_eq!(text(s1, Some("a.wc.example.com")), "*.wc.example.com");
    assert_eq!(text(s1, Some("dot.example.com")), "dot.example.com");
    assert_eq!(text(s1, Some("x.dot.example.com")), "dot.example.com");
    // The default server refuses the handshake ("unrecognized_name"),
    // with an unknown name and without one; a virtual server does not.
    for sni in [Some("one"), Some("nx"), None] {
        let got = text(s2, sni);
        assert!(got.contains("UnrecognisedName"), "{sni:?}: {got}");
    }
    assert_eq!(text(s2, Some("two")), "two:two");
}

#[test]
fn stream_certificates_with_variables_per_sni() {
    let p = Prefix::new();
    let a = cert(&p, "a.test");
    let b = cert(&p, "b.test");
    let s1 = free_port();
    let conf = format!(
        "{HTTP}stream {{
        server {{ listen 127.0.0.1:{s1} ssl;
                  ssl_certificate $ssl_server_name.crt; ssl_certificate_key $ssl_server_name.key;
                  return $ssl_server_name; }}
    }}\n"
    );
    let _srv = start(p, &conf, &[s1]);
    let (body, peer) = tls_read(s1, Some("a.test")).expect("a.test");
    assert_eq!((body.as_slice(), peer), (&b"a.test"[..], a));
    let (body, peer) = tls_read(s1, Some("b.test")).expect("b.test");
    assert_eq!((body.as_slice(), peer), (&b"b.test"[..], b));
    // No such file: no certificate, the handshake fails.
    assert!(tls_read(s1, Some("nx.test")).is_err());
}

/// A ClientHello with `sni` as rustls writes it.
fn client_hello(sni: &str) -> Vec<u8> {
    let name = ServerName::try_from(sni.to_string()).expect("name");
    let mut c = ClientConnection::new(crate::tls_client_cert::client(None), name).expect("client");
    let mut out = Vec::new();
    c.write_tls(&mut out).expect("hello");
    out
}

#[test]
fn stream_preread_selects_server_and_pass_hands_over() {
    let p = Prefix::new();
    let (s1, s3, s4, s5) = (free_port(), free_port(), free_port(), free_port());
    let conf = format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@; location / {{ return 200 \"passed\\n\"; }} }} }}
    stream {{
        log_format s \"$status $server_name $server_port\";
        access_log logs/s.log s;
        server {{ listen 127.0.0.1:{s1}; server_name default; ssl_preread on;
                  pass 127.0.0.1:@PORT@; }}
        server {{ listen 127.0.0.1:{s1}; server_name b.test; return b; }}
        server {{ listen 127.0.0.1:{s3}; pass 127.0.0.1:{s4}; }}
        server {{ listen 127.0.0.1:{s4}; return s4; }}
        server {{ listen 127.0.0.1:{s5}; pass 127.0.0.1:1; }}
    }}\n"
    );
    // Started once the http port listens, which means every listener is
    // open: no probe of the stream ports (it would be a logged session).
    let srv = start(p, &conf, &[]);
    // Plain bytes: the default server passes them, unread, to http.
    let r = read_all(s1, b"GET / HTTP/1.0\r\n\r\n");
    let r = String::from_utf8_lossy(&r);
    assert!(
        r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\npassed\n"),
        "{r}"
    );
    // A session's line is written as it ends, which may be a moment
    // after its client saw the close: each session's line is awaited
    // before the next session starts, so that the order of the lines is
    // the order of the sessions, however loaded the machine.
    let lines = |n: usize| {
        eventually(60, &format!("{n} log line(s)"), || {
            srv.prefix.read("logs/s.log").lines().count() >= n
        })
    };
    // A ClientHello naming b.test selects that server.
    assert_eq!(read_all(s1, &client_hello("b.test")), b"b");
    lines(1);
    // To a stream listener: a session there, with its local port.
    assert_eq!(read_all(s3, b""), b"s4");
    lines(2);
    // Nothing listens there: closed, logged with 200 (as nginx).
    assert_eq!(read_all(s5, b""), b"");
    lines(3);
    // Passed sessions are logged where they arrive only.
    let want = format!("200 b.test {s1}\n200  {s4}\n200  {s5}\n");
    assert_eq!(srv.prefix.read("logs/s.log"), want);
    // Awaited too: it may land after the session's access-log line.
    srv.wait_error_log("port not found for \"127.0.0.1:1\"");
}

/// A PROXY protocol v2 header from 192.0.2.1:123 to 192.0.2.2:5678 with
/// `tlvs`.
fn pp2(tlvs: &[u8]) -> Vec<u8> {
    let mut h = b"\r\n\r\n\x00\r\nQUIT\n\x21\x11".to_vec();
    h.extend_from_slice(&((12 + tlvs.len()) as u16).to_be_bytes());
    h.extend_from_slice(&[192, 0, 2, 1, 192, 0, 2, 2, 0, 123, 0x16, 0x2e]);
    h.extend_from_slice(tlvs);
    h
}

fn tlv(ty: u8, v: &[u8]) -> Vec<u8> {
    let mut t = vec![ty];
    t.extend_from_slice(&(v.len() as u16).to_be_bytes());
    t.extend_from_slice(v);
    t
}

#[test]
fn stream_proxy_protocol_tlv_variables() {
    let s1 = free_port();
    let conf = format!(
        "{HTTP}stream {{
        server {{ listen 127.0.0.1:{s1} proxy_protocol;
                  return \"$proxy_protocol_tlv_alpn|$proxy_protocol_tlv_0xae|$proxy_protocol_tlv_ssl_cn|$proxy_protocol_tlv_ssl_verify|$proxy_protocol_tlv_0x0e|$proxy_protocol_addr:$proxy_protocol_port\"; }}
    }}\n"
    );
    let _srv = start(Prefix::new(), &conf, &[s1]);
    let mut ssl = vec![0x01, 0, 0, 0, 255];
    ssl.extend_from_slice(&tlv(0x22, b"example.com"));
    let mut tlvs = tlv(0x01, b"h2");
    tlvs.extend_from_slice(&tlv(0xae, b"12345"));
    tlvs.extend_from_slice(&tlv(0x20, &ssl));
    assert_eq!(
        String::from_utf8_lossy(&read_all(s1, &pp2(&tlvs))),
        "h2|12345|example.com|255||192.0.2.1:123"
    );
}

#[test]
fn stream_pass_and_server_name_config_errors() {
    let p = Prefix::new();
    let cases: &[(&str, &str)] = &[
        (
            "stream { server { listen 1234; pass 127.0.0.1; } }",
            "\"pass\" directive has no port in",
        ),
        (
            "stream { server { listen 1234; pass localhost:80; } }",
            "\"pass\" directive has no addresses in",
        ),
        (
            "stream { server { listen 1234; pass 127.0.0.1:1; pass 127.0.0.1:2; } }",
            "\"pass\" directive is duplicate in",
        ),
        (
            "stream { server { listen 1234; server_name a*b; return x; } }",
            "invalid server name or wildcard \"a*b\" in",
        ),
    ];
    for (body, want) in cases {
        let conf = p.write("conf/t.conf", format!("events {{}}\n{}\n", body));
        let out = p.run(&["-t", "-c", conf.to_str().unwrap_or("")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{} accepted", body);
        assert!(err.contains(want), "{}: {}", body, err);
    }
}
