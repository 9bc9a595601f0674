//! `listen ... proxy_protocol` in http: the PROXY header (version 1 and
//! 2) before HTTP/1.x and before TLS, `$proxy_protocol_*`, `real_ip_header
//! proxy_protocol`, and a broken header's close and error-log line, each
//! compared with the real nginx on the same configuration.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use crate::harness::{self, Prefix, Server};

const CONF: &str = r#"
error_log logs/error.log info;
http {
    log_format pp '$remote_addr|$realip_remote_addr|$proxy_protocol_addr|$proxy_protocol_port|$proxy_protocol_server_addr|$proxy_protocol_server_port|$status|$request';
    access_log logs/pp.log pp;
    server {
        listen 127.0.0.1:@PORT@ proxy_protocol;
        root html;
        location / {
            return 200 "pp=$proxy_protocol_addr:$proxy_protocol_port to=$proxy_protocol_server_addr:$proxy_protocol_server_port ra=$remote_addr\n";
        }
        location /realip {
            set_real_ip_from 127.0.0.1;
            real_ip_header proxy_protocol;
            add_header X-RA $remote_addr:$remote_port;
        }
    }
    server {
        listen 127.0.0.1:@TLS@ ssl proxy_protocol;
        ssl_certificate leaf.crt;
        ssl_certificate_key leaf.key;
        set_real_ip_from 127.0.0.1;
        real_ip_header proxy_protocol;
        location / {
            return 200 "tls pp=$proxy_protocol_addr:$proxy_protocol_port ra=$remote_addr:$remote_port $https\n";
        }
    }
}
"#;

/// A CA and a leaf for 127.0.0.1 signed by it (conf/leaf.*), and a
/// client that trusts the CA.
fn pki(p: &Prefix) -> Arc<rustls::ClientConfig> {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
    let key = rcgen::KeyPair::generate().expect("key");
    let leaf = params.signed_by(&key, &ca, &ca_key).expect("sign");
    p.write("conf/leaf.crt", leaf.pem());
    p.write("conf/leaf.key", key.serialize_pem());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A version 2 header: PROXY over TCP/IPv4 from 192.0.2.1:123 to
/// 192.0.2.2:5678, with `tlvs` after the addresses.
fn v2(tlvs: &[u8]) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n\x21\x11".to_vec();
    h.extend_from_slice(&(12 + tlvs.len() as u16).to_be_bytes());
    h.extend_from_slice(&[192, 0, 2, 1, 192, 0, 2, 2, 0, 123, 0x16, 0x2e]);
    h.extend_from_slice(tlvs);
    h
}

/// Sends `bytes` and reads to the close.
fn exchange(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut s = harness::connect(port);
    s.write_all(bytes).expect("write");
    harness::read_to_close(&mut s)
}

/// The status line, X-RA and body of an answer (Date and Server differ).
fn essence(r: &[u8]) -> String {
    let Some(resp) = harness::Resp::parse(r) else {
        return format!("raw {:?}", String::from_utf8_lossy(r));
    };
    format!(
        "{} x-ra={:?} {}",
        resp.status,
        resp.header("X-RA"),
        resp.body_str()
    )
}

/// The PROXY header, then TLS (rustls), then a request; the answer's body.
fn over_tls(port: u16, header: &[u8], client: &Arc<rustls::ClientConfig>) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    s.write_all(header).expect("header");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let conn = rustls::ClientConnection::new(client.clone(), name).expect("client");
    let mut tls = rustls::StreamOwned::new(conn, s);
    tls.write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("request");
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out);
    essence(&out)
}

/// What one server (tern or nginx) answered to every case, its access
/// log, and its error-log lines about PROXY headers (ports blanked).
fn run_cases(port: u16, tls_port: u16, client: &Arc<rustls::ClientConfig>) -> Vec<String> {
    let v1 = b"PROXY TCP4 192.0.2.1 192.0.2.2 123 5678\r\n";
    let v1_6 = b"PROXY TCP6 2001:Db8::1 2001:db8::2 123 5678\r\n";
    // TLVs: ALPN "h2", unique id "abc" (nginx 1.22 keeps but never shows them).
    let v2_tlv = v2(b"\x01\x00\x02h2\x05\x00\x03abc");
    let mut out = Vec::new();
    let get = |path: &str| format!("GET {} HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
    for (header, path) in [
        (&v1[..], "/"),
        (&v1_6[..], "/"),
        (b"PROXY UNKNOWN\r\n", "/"),
        (b"PROXY UNKNOWN 1 2 3 4 5\r\n", "/"),
        (&v2(b"")[..], "/"),
        (&v2_tlv[..], "/"),
        // LOCAL: no addresses taken.
        (b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00", "/"),
        (&v1[..], "/realip"),
        (&v1_6[..], "/realip"),
        (&v2_tlv[..], "/realip"),
    ] {
        let mut req = header.to_vec();
        req.extend_from_slice(get(path).as_bytes());
        out.push(essence(&exchange(port, &req)));
    }
    // Broken headers: closed without an answer (a FIN: what was read is
    // taken off the socket first).
    for bad in [
        &b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n"[..],
        b"PROXY TCP4 192.0.2.1 192.0.2.2 123 99999\r\nGET / HTTP/1.0\r\n\r\n",
        b"PROXY TCP5 a b c d\r\n\r\n",
    ] {
        out.push(format!("broken: {:?}", exchange(port, bad)));
    }
    out.push(over_tls(tls_port, v1, client));
    out.push(over_tls(tls_port, &v2_tlv, client));
    out
}

fn logs(p: &Prefix, ports: &[u16], broken: usize) -> Vec<String> {
    let err = harness::wait_log(p, "logs/error.log", "TCP5");
    // 10 answered in clear, 2 over TLS.
    harness::eventually(10, "12 access-log lines", || {
        p.read("logs/pp.log").lines().count() >= 12
    });
    let mut lines: Vec<String> = p.read("logs/pp.log").lines().map(String::from).collect();
    // The error log: the text after "*N ", with the ports blanked.
    let mut pp_lines = 0;
    let text: Vec<&str> = err.split('\n').collect();
    let mut i = 0;
    while i < text.len() {
        if let Some(at) = text[i].find("broken header") {
            // A header's CRLFs are logged raw: the entry runs on until
            // its "while" part.
            let mut entry = text[i][at..].to_string();
            while !entry.contains(" while reading PROXY protocol") && i + 1 < text.len() {
                i += 1;
                entry.push('\n');
                entry.push_str(text[i]);
            }
            for port in ports {
                entry = entry.replace(&format!(":{}", port), ":PORT");
            }
            lines.push(entry);
            pp_lines += 1;
        }
        i += 1;
    }
    assert_eq!(pp_lines, broken, "{}", err);
    lines
}

#[test]
fn proxy_protocol_same_as_nginx() {
    let p = Prefix::new();
    let client = pki(&p);
    p.write("html/realip", "r\n");
    let tls_port = harness::free_port();
    let conf = CONF.replace("@TLS@", &tls_port.to_string());
    let tern = Server::start_in(p, &conf);
    let mut tern_out = run_cases(tern.port, tls_port, &client);
    tern_out.extend(logs(&tern.prefix, &[tern.port, tls_port], 3));

    // What tern must answer whether or not nginx is here to compare with.
    assert!(
        tern_out[0].starts_with("200 x-ra=None pp=192.0.2.1:123 to=192.0.2.2:5678 ra=127.0.0.1"),
        "{:?}",
        tern_out
    );
    assert!(tern_out[1].contains("pp=2001:Db8::1:123 to=2001:db8::2:5678"));
    assert!(tern_out[2].contains("pp=: to=: ra=127.0.0.1"));
    assert!(tern_out[7].starts_with("200 x-ra=Some(\"192.0.2.1:123\")"));
    assert!(tern_out[8].starts_with("200 x-ra=Some(\"2001:db8::1:123\")"));
    assert_eq!(tern_out[10], "broken: []");
    assert!(tern_out[13].contains("tls pp=192.0.2.1:123 ra=192.0.2.1:123 on"));
    assert!(tern_out
        .iter()
        .any(|l| l.starts_with("192.0.2.1|127.0.0.1|192.0.2.1|123|")));

    if !harness::nginx_installed() {
        return;
    }
    let np = Prefix::new();
    np.write("html/realip", "r\n");
    // nginx gets the certificate tern has.
    for f in ["leaf.crt", "leaf.key"] {
        np.write(
            &format!("conf/{}", f),
            tern.prefix.read(&format!("conf/{}", f)),
        );
    }
    let nport = harness::free_port();
    let ntls = harness::free_port();
    let nconf = CONF.replace("@TLS@", &ntls.to_string());
    let Some(_nginx) = harness::start_nginx(&np, &nconf, nport) else {
        return;
    };
    let mut nginx_out = run_cases(nport, ntls, &client);
    nginx_out.extend(logs(&np, &[nport, ntls], 3));
    assert_eq!(tern_out, nginx_out);
}
