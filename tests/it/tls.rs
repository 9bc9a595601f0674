//! TLS (`listen ... ssl`): certificates made here with rcgen (a test CA
//! and one leaf per name), clients curl (`--cacert`) and rustls (exact
//! bytes, the peer's certificate), and the real nginx beside tern.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::harness::{self, Prefix, Resp, Server};

/// A test CA and leaf certificates signed by it.
struct Pki {
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Pki {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "tern test CA");
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let ca = p.self_signed(&ca_key).expect("ca");
        Pki { ca, ca_key }
    }

    /// Writes `conf/NAME.crt` and `conf/NAME.key` for `name`; returns the
    /// certificate's DER.
    fn leaf(&self, p: &Prefix, name: &str) -> Vec<u8> {
        self.leaf_as(p, name, name, &rcgen::PKCS_ECDSA_P256_SHA256)
    }

    /// A leaf for `name` with a key of `alg`, written as `conf/FILE.crt`
    /// and `conf/FILE.key`.
    fn leaf_as(
        &self,
        p: &Prefix,
        file: &str,
        name: &str,
        alg: &'static rcgen::SignatureAlgorithm,
    ) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate_for(alg).expect("key");
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("sign");
        p.write(&format!("conf/{}.crt", file), cert.pem());
        p.write(&format!("conf/{}.key", file), key.serialize_pem());
        cert.der().to_vec()
    }

    fn ca_pem(&self, p: &Prefix) -> String {
        let path = p.write("conf/ca.pem", self.ca.pem());
        path.display().to_string()
    }

    fn client(&self) -> Arc<ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).expect("root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    }
}

type Tls = StreamOwned<ClientConnection, TcpStream>;

fn tls_connect(cfg: &Arc<ClientConfig>, port: u16, sni: &str) -> Tls {
    let name = ServerName::try_from(sni.to_string()).expect("name");
    let conn = ClientConnection::new(cfg.clone(), name).expect("client");
    let sock = harness::connect(port);
    StreamOwned::new(conn, sock)
}

/// Reads one framed response from a kept-alive TLS connection.
fn read_one(s: &mut Tls) -> Option<Resp> {
    let mut data = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        if let Some((r, _)) = Resp::parse_complete(&data) {
            return Some(r);
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return Resp::parse(&data),
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
}

fn read_all(s: &mut Tls) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

fn peer_cert(s: &Tls) -> Vec<u8> {
    s.conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c: &CertificateDer<'_>| c.to_vec())
        .unwrap_or_default()
}

const CONF: &str = r#"
error_log logs/error.log info;
http {
    log_format tls '$scheme|$https|$ssl_protocol|$ssl_cipher|$ssl_server_name|$ssl_session_reused|$status|$server_name';
    access_log logs/access.log tls;
    sendfile on;
    ssl_protocols TLSv1.2 TLSv1.3;
    server {
        listen 127.0.0.1:@PORT@ ssl default_server;
        server_name a.test;
        ssl_certificate a.test.crt;
        ssl_certificate_key a.test.key;
        root html;
        location /r { return 302 /there; }
    }
    server {
        listen 127.0.0.1:@PORT@ ssl http2;
        server_name *.b.test b.test;
        ssl_certificate b.test.crt;
        ssl_certificate_key b.test.key;
        location / { return 200 "b\n"; }
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name c.test;
        location / { return 200 "c\n"; }
    }
}
"#;

fn start(pki: &Pki) -> (Server, Vec<u8>, Vec<u8>) {
    let p = Prefix::new();
    let a = pki.leaf(&p, "a.test");
    let b = pki.leaf(&p, "b.test");
    p.write("html/index.html", "hello\n");
    (Server::start_in(p, CONF), a, b)
}

#[test]
fn tls_serves_with_curl_and_logs_ssl_variables() {
    let pki = Pki::new();
    let (s, _, _) = start(&pki);
    let ca = pki.ca_pem(&s.prefix);
    let resolve = format!("a.test:{}:127.0.0.1", s.port);
    let url = format!("https://a.test:{}/", s.port);
    let out = s.curl(&["--cacert", &ca, "--resolve", &resolve, &url]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n", "{:?}", out);
    // A redirect made absolute says https, with the port (not 443).
    let out = s.curl(&[
        "--cacert",
        &ca,
        "--resolve",
        &resolve,
        "-D-",
        "-o/dev/null",
        "--tls-max",
        "1.2",
        &format!("https://a.test:{}/r", s.port),
    ]);
    let head = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        head.contains(&format!(
            "\r\nLocation: https://a.test:{}/there\r\n",
            s.port
        )),
        "{}",
        head
    );
    harness::eventually(5, "access log", || {
        s.prefix.read("logs/access.log").lines().count() >= 2
    });
    let log = s.prefix.read("logs/access.log");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(
        lines[0], "https|on|TLSv1.3|TLS_AES_256_GCM_SHA384|a.test|.|200|a.test",
        "{}",
        log
    );
    assert_eq!(
        lines[1], "https|on|TLSv1.2|ECDHE-ECDSA-AES256-GCM-SHA384|a.test|.|302|a.test",
        "{}",
        log
    );
}

#[test]
fn tls_sni_picks_the_servers_certificate() {
    let pki = Pki::new();
    let (s, a, b) = start(&pki);
    let cfg = pki.client();
    for (sni, cert, body) in [
        ("b.test", &b, "b\n"),
        ("x.b.test", &b, "b\n"),
        ("a.test", &a, "hello\n"),
    ] {
        // The certificate for x.b.test is b.test's: the client refuses it
        // (wrong name), which is what nginx's choice would give too.
        let mut c = tls_connect(&cfg, s.port, sni);
        let req = format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            sni
        );
        let wrote = c.write_all(req.as_bytes());
        if sni == "x.b.test" {
            assert!(wrote.is_err() || read_all(&mut c).is_empty());
            continue;
        }
        wrote.expect("write");
        let r = Resp::parse(&read_all(&mut c)).expect("response");
        assert_eq!(peer_cert(&c), *cert, "certificate for {}", sni);
        assert_eq!(r.body_str(), body, "{}", sni);
    }
    // An unknown name gets the default server's certificate; Host routes.
    let mut c = tls_connect(&cfg, s.port, "a.test");
    c.write_all(b"GET / HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n")
        .expect("write");
    let r = Resp::parse(&read_all(&mut c)).expect("response");
    assert_eq!(r.body_str(), "b\n");
    assert_eq!(peer_cert(&c), a);
}

#[test]
fn tls_keepalive_survives_parking_and_large_files_arrive_whole() {
    let pki = Pki::new();
    let p = Prefix::new();
    pki.leaf(&p, "a.test");
    pki.leaf(&p, "b.test");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    p.write("html/big.bin", &big);
    p.write("html/index.html", "hello\n");
    let s = Server::start_in(p, CONF);
    let cfg = pki.client();
    let mut c = tls_connect(&cfg, s.port, "a.test");
    for i in 0..3 {
        c.write_all(b"GET /big.bin HTTP/1.1\r\nHost: a.test\r\n\r\n")
            .expect("write");
        let r = read_one(&mut c).expect("response");
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), big.len(), "round {}", i);
        assert!(r.body == big, "round {}: body differs", i);
        if i == 1 {
            // Idle past PARK_AFTER (1 s): the connection waits in the
            // parking lot with its TLS session, and comes back.
            std::thread::sleep(Duration::from_millis(1500));
        }
    }
    c.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .expect("write");
    let r = read_one(&mut c).expect("response");
    assert_eq!(r.head_normalized(), "HTTP/1.1 200 OK\r\nServer: X\r\nDate: X\r\nContent-Type: text/html\r\nContent-Length: 6\r\nLast-Modified: ".to_string() + r.header("Last-Modified").unwrap_or("") + "\r\nConnection: keep-alive\r\nETag: " + r.header("ETag").unwrap_or("") + "\r\nAccept-Ranges: bytes\r\n\r\n");
    assert_eq!(r.body_str(), "hello\n");
}

#[test]
fn tls_plain_http_to_ssl_port_is_497() {
    let pki = Pki::new();
    let (s, _, _) = start(&pki);
    let got = s.raw(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n");
    let r = Resp::parse(&got).expect("response");
    assert_eq!(
        r.head_normalized(),
        "HTTP/1.1 400 Bad Request\r\nServer: X\r\nDate: X\r\nContent-Type: text/html\r\n\
         Content-Length: 253\r\nConnection: close\r\n\r\n"
    );
    assert!(r
        .body_str()
        .starts_with("<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>\r\n"));
    harness::eventually(5, "access log", || {
        s.prefix.read("logs/access.log").contains("|400|")
    });
    assert!(s
        .prefix
        .read("logs/access.log")
        .contains("http||-|-|-|-|400|a.test"));
    // The error log has its own writer: its line may come after the access line.
    s.wait_error_log(
        "client sent plain HTTP request to HTTPS port while reading client request headers",
    );

    // error_page 497 catches it: the common redirect to https.
    let pki = Pki::new();
    let p = Prefix::new();
    pki.leaf(&p, "a.test");
    let s = Server::start_in(
        p,
        "http { server { listen 127.0.0.1:@PORT@ ssl; ssl_certificate a.test.crt; \
         ssl_certificate_key a.test.key; error_page 497 =301 https://$host:$server_port$request_uri; } }",
    );
    let r = Resp::parse(&s.raw(b"GET /x?y HTTP/1.1\r\nHost: a.test\r\n\r\n")).expect("response");
    assert_eq!(r.status, 301);
    assert_eq!(
        r.header("Location"),
        Some(format!("https://a.test:{}/x?y", s.port).as_str())
    );
}

#[test]
fn tls_reload_with_a_bad_certificate_keeps_serving() {
    let pki = Pki::new();
    let (s, a, _) = start(&pki);
    let cfg = pki.client();
    // The file is broken, then the configuration reloaded: the reload
    // fails (certificates are read at reload) and the old one serves.
    s.prefix.write("conf/a.test.crt", "not a certificate\n");
    s.signal(1);
    harness::eventually(5, "reload refused", || {
        s.error_log().contains("cannot load certificate \"")
    });
    let log = s.error_log();
    assert!(
        log.contains(&format!(
            "cannot load certificate \"{}\": PEM_read_bio_X509_AUX() failed",
            s.prefix.path("conf/a.test.crt").display()
        )),
        "{}",
        log
    );
    let mut c = tls_connect(&cfg, s.port, "a.test");
    c.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
        .expect("write");
    let r = Resp::parse(&read_all(&mut c)).expect("response");
    assert_eq!(r.body_str(), "hello\n");
    assert_eq!(peer_cert(&c), a);
}

#[test]
fn tls_config_errors_in_nginx_words() {
    let p = Prefix::new();
    let pki = Pki::new();
    pki.leaf(&p, "a.test");
    let conf = p.write(
        "conf/t.conf",
        "events {}\nhttp {\n  server {\n    listen 127.0.0.1:1 ssl;\n  }\n}\n",
    );
    let conf_s = conf.display().to_string();
    let out = p.run(&["-t", "-c", &conf_s]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.contains(&format!(
            "no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive in {}:3",
            conf_s
        )),
        "{}",
        err
    );
    assert_ne!(out.status.code(), Some(0));
    for (body, want) in [
        (
            "ssl_certificate a.test.crt;",
            "no \"ssl_certificate_key\" is defined for certificate \"CONF/a.test.crt\"".to_string(),
        ),
        (
            "ssl_certificate /nonexistent.crt; ssl_certificate_key a.test.key;",
            "cannot load certificate \"/nonexistent.crt\": BIO_new_file() failed (2: No such file or directory)".to_string(),
        ),
        (
            "ssl_certificate a.test.crt; ssl_certificate_key a.test.crt;",
            "cannot load certificate key \"CONF/a.test.crt\": PEM_read_bio_PrivateKey() failed".to_string(),
        ),
        (
            "ssl_certificate a.test.crt; ssl_certificate_key a.test.key; ssl_ciphers FOO;",
            "SSL_CTX_set_cipher_list(\"FOO\") failed".to_string(),
        ),
        (
            "ssl_certificate a.test.crt; ssl_certificate_key a.test.key; ssl_session_cache foo;",
            format!("invalid session cache \"foo\" in {}:4", conf_s),
        ),
    ] {
        std::fs::write(
            &conf,
            format!(
                "events {{}}\nhttp {{\n  server {{\n    listen 127.0.0.1:1 ssl; {}\n  }}\n}}\n",
                body
            ),
        )
        .expect("write");
        let out = p.run(&["-t", "-c", &conf_s]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let want = want.replace("CONF", &p.path("conf").display().to_string());
        assert!(err.contains(&want), "{}\nwant: {}\ngot: {}", body, want, err);
        assert_ne!(out.status.code(), Some(0), "{}", body);
    }
    // Accepted: `ssl on` (with nginx's warning), http2, the rest of the family.
    std::fs::write(
        &conf,
        "events {}\nhttp {\n  ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3; ssl_prefer_server_ciphers on;\n  \
         ssl_session_cache shared:SSL:10m; ssl_session_timeout 1d; ssl_session_tickets off;\n  \
         ssl_ecdh_curve X25519:prime256v1; ssl_buffer_size 4k; ssl_stapling on; ssl_stapling_verify on;\n  \
         ssl_ciphers ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES128-GCM-SHA256;\n  \
         server {\n    listen 127.0.0.1:1 http2; ssl on; http2 on;\n    ssl_certificate a.test.crt; ssl_certificate_key a.test.key;\n  }\n}\n",
    )
    .expect("write");
    let out = p.run(&["-t", "-c", &conf_s]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{}", err);
    assert!(
        err.contains(
            "the \"ssl\" directive is deprecated, use the \"listen ... ssl\" directive instead in"
        ),
        "{}",
        err
    );
}

#[test]
fn tls_version_line() {
    let p = Prefix::new();
    let out = p.run(&["-V"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("\nbuilt with rustls 0."), "{}", err);
    assert!(err.contains(" --with-http_ssl_module"), "{}", err);
}

/// The same requests over TLS to tern and to the real nginx: heads and
/// bodies compared (Server and Date blanked, nginx's signature swapped).
#[test]
fn tls_same_bytes_as_nginx() {
    if !harness::nginx_installed() {
        return;
    }
    let pki = Pki::new();
    let conf = r#"
http {
    ssl_protocols TLSv1.2;
    server {
        listen 127.0.0.1:@PORT@ ssl;
        server_name a.test;
        ssl_certificate a.test.crt;
        ssl_certificate_key a.test.key;
        root html;
        location /r { return 301 /elsewhere; }
        location /v { return 200 "$scheme $https $ssl_protocol $ssl_cipher $ssl_server_name $ssl_session_reused\n"; }
    }
}
"#;
    let pn = Prefix::new();
    let pt = Prefix::new();
    for p in [&pn, &pt] {
        p.write("html/index.html", "hello\n");
        std::fs::create_dir_all(p.path("html/dir")).expect("mkdir");
    }
    // One certificate for both, so that nothing but the server differs.
    pki.leaf(&pn, "a.test");
    for f in ["a.test.crt", "a.test.key"] {
        std::fs::copy(
            pn.path(&format!("conf/{}", f)),
            pt.path(&format!("conf/{}", f)),
        )
        .expect("copy");
    }
    let nport = harness::free_port();
    let Some(_nginx) = harness::start_nginx(&pn, conf, nport) else {
        return;
    };
    let s = Server::start_in(pt, conf);
    let cfg = pki.client();
    let fetch = |port: u16, req: &[u8]| -> String {
        let mut c = tls_connect(&cfg, port, "a.test");
        c.write_all(req).expect("write");
        let raw = read_all(&mut c);
        let r = Resp::parse(&raw).expect("response");
        let mut out = r.head_normalized();
        out.push_str(&r.body_str());
        out.replace("nginx/1.22.1", "tern/X")
            .replace(&format!(":{}/", port), ":PORT/")
    };
    for req in [
        &b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"[..],
        b"GET /missing HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        b"GET /r HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        b"GET /dir HTTP/1.1\r\nHost: a.test:1234\r\nConnection: close\r\n\r\n",
        b"GET /v HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        b"HEAD / HTTP/1.0\r\n\r\n",
    ] {
        let n = fetch(nport, req);
        let t = fetch(s.port, req).replace(&format!("tern/{}", tern_version()), "tern/X");
        // Last-Modified/ETag differ by the files' times, Content-Length
        // of error pages by the signature's length.
        let strip = |x: &str| {
            x.lines()
                .filter(|l| {
                    !l.starts_with("Last-Modified")
                        && !l.starts_with("ETag")
                        && !l.starts_with("Content-Length")
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(strip(&t), strip(&n), "{}", String::from_utf8_lossy(req));
    }
    // Plain HTTP to the TLS port, byte for byte.
    let req = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n";
    let n = Resp::parse(&harness::raw(nport, req)).expect("nginx");
    let t = Resp::parse(&s.raw(req)).expect("tern");
    assert_eq!(
        t.head_normalized().replace("253", "255"),
        n.head_normalized()
    );
    assert_eq!(
        t.body_str()
            .replace(&format!("tern/{}", tern_version()), "nginx/1.22.1"),
        n.body_str()
    );
}

fn tern_version() -> String {
    let p = Prefix::new();
    let out = p.run(&["-v"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    err.split("tern/")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or("")
        .to_string()
}

/// Sessions resume: by ticket (the default), through a shared cache
/// with tickets off, and not at all with neither.
#[test]
fn tls_sessions_resume() {
    for (settings, want) in [
        ("", "r"),
        (
            "ssl_session_tickets off; ssl_session_cache shared:SSL:1m;",
            "r",
        ),
        ("ssl_session_tickets off;", "."),
    ] {
        let pki = Pki::new();
        let p = Prefix::new();
        pki.leaf(&p, "a.test");
        let s = Server::start_in(
            p,
            &format!(
                "http {{ ssl_protocols TLSv1.2 TLSv1.3; {} server {{ listen 127.0.0.1:@PORT@ ssl; \
                 ssl_certificate a.test.crt; ssl_certificate_key a.test.key; \
                 location / {{ return 200 \"$ssl_protocol $ssl_session_reused\\n\"; }} }} }}",
                settings
            ),
        );
        let cfg = pki.client();
        let mut got = Vec::new();
        for _ in 0..2 {
            let mut c = tls_connect(&cfg, s.port, "a.test");
            c.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
                .expect("write");
            let r = Resp::parse(&read_all(&mut c)).expect("response");
            got.push(r.body_str());
        }
        assert_eq!(
            got,
            ["TLSv1.3 .\n".to_string(), format!("TLSv1.3 {}\n", want)],
            "{}",
            settings
        );
    }
}

/// A request body read over TLS (proxy_pass reads it whole; curl waits
/// for `100 Continue`, written and flushed through TLS).
#[test]
fn tls_request_body_through_proxy() {
    let pki = Pki::new();
    let p = Prefix::new();
    pki.leaf(&p, "a.test");
    p.write("html/body.bin", vec![b'x'; 300_000]);
    let up = harness::free_port();
    let conf = format!(
        "http {{ client_max_body_size 10m; \
         server {{ listen 127.0.0.1:@PORT@ ssl; server_name a.test; ssl_certificate a.test.crt; \
         ssl_certificate_key a.test.key; location / {{ proxy_set_header X-Proto $scheme; proxy_pass http://127.0.0.1:{up}; }} }} \
         server {{ listen 127.0.0.1:{up}; location / {{ return 200 \"got $content_length $http_x_proto\\n\"; }} }} }}"
    );
    let s = Server::start_in(p, &conf);
    let ca = pki.ca_pem(&s.prefix);
    let body = format!("@{}", s.prefix.path("html/body.bin").display());
    let out = s.curl(&[
        "--cacert",
        &ca,
        "--resolve",
        &format!("a.test:{}:127.0.0.1", s.port),
        "--data-binary",
        &body,
        &format!("https://a.test:{}/post", s.port),
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "got 300000 https\n",
        "{:?}",
        out
    );
}

/// `proxy_pass https://`: to tern's own TLS server, without verification
/// and SNI (nginx's defaults), with SNI, with verification against the
/// test CA (and its failure for a wrong name), and over kept-alive
/// upstream connections.
#[test]
fn tls_proxy_pass_https() {
    let pki = Pki::new();
    let p = Prefix::new();
    pki.leaf(&p, "a.test");
    pki.ca_pem(&p);
    let front = harness::free_port();
    let conf = format!(
        r#"
error_log logs/error.log info;
http {{
    ssl_protocols TLSv1.2 TLSv1.3;
    upstream tlsback {{ server 127.0.0.1:@PORT@; keepalive 4; }}
    server {{
        listen 127.0.0.1:@PORT@ ssl;
        ssl_certificate a.test.crt;
        ssl_certificate_key a.test.key;
        location / {{ return 200 "sni=$ssl_server_name $ssl_protocol reqs=$connection_requests\n"; }}
    }}
    server {{
        listen 127.0.0.1:{front};
        location /plain {{ proxy_pass https://127.0.0.1:@PORT@; }}
        location /sni {{
            proxy_pass https://127.0.0.1:@PORT@;
            proxy_ssl_server_name on;
            proxy_ssl_name a.test;
            proxy_ssl_protocols TLSv1.3;
        }}
        location /verify {{
            proxy_pass https://127.0.0.1:@PORT@;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate ca.pem;
            proxy_ssl_name a.test;
        }}
        location /wrong {{
            proxy_pass https://127.0.0.1:@PORT@;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate ca.pem;
            proxy_ssl_name b.test;
        }}
        location /kept {{
            proxy_pass https://tlsback;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"#
    );
    let s = Server::start_in(p, &conf);
    let get = |path: &str| {
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            path
        );
        Resp::parse(&harness::raw(front, req.as_bytes())).expect("response")
    };
    assert_eq!(get("/plain").body_str(), "sni= TLSv1.2 reqs=1\n");
    assert_eq!(get("/sni").body_str(), "sni=a.test TLSv1.3 reqs=1\n");
    assert_eq!(get("/verify").body_str(), "sni= TLSv1.2 reqs=1\n");
    assert_eq!(get("/wrong").status, 502);
    // The error log is written by its own thread: wait for the line.
    s.wait_error_log("while SSL handshaking to upstream");
    assert_eq!(get("/kept").body_str(), "sni= TLSv1.2 reqs=1\n");
    assert_eq!(get("/kept").body_str(), "sni= TLSv1.2 reqs=2\n");
}

/// A handshake that stalls ends at client_header_timeout, logged as
/// nginx does; a broken record after the handshake closes the connection.
#[test]
fn tls_handshake_timeout_and_bad_records_close() {
    let pki = Pki::new();
    let p = Prefix::new();
    pki.leaf(&p, "a.test");
    let s = Server::start_in(
        p,
        "error_log logs/error.log info; http { client_header_timeout 1s; server { \
         listen 127.0.0.1:@PORT@ ssl; ssl_certificate a.test.crt; ssl_certificate_key a.test.key; \
         location / { return 200 ok; } } }",
    );
    let mut c = s.connect();
    c.write_all(b"\x16\x03\x01").expect("write");
    let t = std::time::Instant::now();
    assert!(harness::read_to_close(&mut c).is_empty());
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    harness::eventually(5, "timeout logged", || {
        s.error_log().contains(
            "client timed out (110: Connection timed out) while SSL handshaking, client: 127.0.0.1",
        )
    });

    let cfg = pki.client();
    let mut c = tls_connect(&cfg, s.port, "a.test");
    c.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .expect("write");
    assert_eq!(read_one(&mut c).expect("response").body_str(), "ok");
    // An application-data record that does not decrypt.
    c.sock
        .write_all(b"\x17\x03\x03\x00\x20abcdefghijklmnopqrstuvwxyz012345")
        .expect("write");
    let t = std::time::Instant::now();
    let mut rest = Vec::new();
    let _ = c.sock.read_to_end(&mut rest);
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    // The alert (a TLS record) and then the close.
    assert_eq!(rest.first(), Some(&0x15), "{:?}", rest);
}

/// A client that offers only some signature schemes (to see which of a
/// server's certificate pairs it gets).
#[derive(Debug)]
struct Only(
    Arc<rustls::client::WebPkiServerVerifier>,
    Vec<rustls::SignatureScheme>,
);

impl rustls::client::danger::ServerCertVerifier for Only {
    fn verify_server_cert(
        &self,
        ee: &CertificateDer<'_>,
        im: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        self.0.verify_server_cert(ee, im, name, ocsp, now)
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.1.clone()
    }
}

/// Several `ssl_certificate` pairs (as RSA + ECDSA in nginx): each client
/// gets the one its signature schemes allow.
#[test]
fn tls_several_certificate_pairs() {
    let pki = Pki::new();
    let p = Prefix::new();
    let ed = pki.leaf_as(&p, "ed", "a.test", &rcgen::PKCS_ED25519);
    let ec = pki.leaf_as(&p, "ec", "a.test", &rcgen::PKCS_ECDSA_P256_SHA256);
    let s = Server::start_in(
        p,
        "http { ssl_protocols TLSv1.3; server { listen 127.0.0.1:@PORT@ ssl; \
         ssl_certificate ed.crt; ssl_certificate_key ed.key; \
         ssl_certificate ec.crt; ssl_certificate_key ec.key; \
         location / { return 200 ok; } } }",
    );
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.der().clone()).expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    for (schemes, want) in [
        (vec![rustls::SignatureScheme::ECDSA_NISTP256_SHA256], &ec),
        (vec![rustls::SignatureScheme::ED25519], &ed),
    ] {
        let v = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots.clone()),
            provider.clone(),
        )
        .build()
        .expect("verifier");
        let cfg = Arc::new(
            ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Only(v, schemes.clone())))
                .with_no_client_auth(),
        );
        let mut c = tls_connect(&cfg, s.port, "a.test");
        c.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
            .expect("write");
        let r = Resp::parse(&read_all(&mut c)).expect("response");
        assert_eq!(r.body_str(), "ok");
        assert_eq!(peer_cert(&c), *want, "{:?}", schemes);
    }
}
