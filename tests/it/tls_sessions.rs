//! TLS sessions and OpenSSL-only settings as production meets them: a
//! TLS 1.2 session resumed from a ticket keeps its ticket (an OpenSSL
//! client drops a session whose ticket is renewed), sessions stay with
//! the certificates that made them (OpenSSL's session id context),
//! `ssl_conf_command` mapped onto rustls, `ssl_verify_client` with only
//! `ssl_trusted_certificate`, `TRUSTED CERTIFICATE` PEM files.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use rustls::ClientConfig;

use crate::harness::{self, free_port, Prefix, Resp, Server};

/// A self-signed ECDSA P-256 certificate for `cn`, as `conf/FILE.crt`
/// and `conf/FILE.key`; returns its DER.
fn self_signed(p: &Prefix, file: &str, cn: &str) -> Vec<u8> {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec![cn.to_string()]).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let c = params.self_signed(&key).expect("cert");
    p.write(&format!("conf/{}.crt", file), c.pem());
    p.write(&format!("conf/{}.key", file), key.serialize_pem());
    c.der().to_vec()
}

/// A client of `versions` that takes any certificate and offers the
/// TLS 1.2 `suites` in that order (all of rustls's when empty), with
/// `client_cert` (certificate and key DER) if any.
fn client(
    versions: &[&'static rustls::SupportedProtocolVersion],
    suites: &[rustls::CipherSuite],
    client_cert: Option<(Vec<u8>, Vec<u8>)>,
) -> Arc<ClientConfig> {
    harness::tls_client(versions, suites, client_cert)
}

/// One `GET /` with `Connection: close`: the response and the server's
/// certificate.
fn get(cfg: &Arc<ClientConfig>, port: u16, sni: &str) -> (Resp, Vec<u8>) {
    let req = format!(
        "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        sni
    );
    let (out, cert) = harness::tls_exchange(cfg, port, sni, &req);
    (Resp::parse(&out).expect("response"), cert)
}

/// `openssl s_client -msg` over TLS 1.2, reading the session from
/// `sess_in` (if any) and writing a new one to `sess_out`: its output.
fn s_client(dir: &Path, port: u16, sess_in: Option<&str>, sess_out: &str) -> String {
    let connect = format!("127.0.0.1:{}", port);
    // `timeout`: s_client leaves when the server closes (the request asks
    // it to); this bounds a server that would not.
    let mut args = vec![
        "20",
        "openssl",
        "s_client",
        "-tls1_2",
        "-msg",
        "-connect",
        &connect,
        "-servername",
        "a.test",
        "-sess_out",
        sess_out,
    ];
    if let Some(f) = sess_in {
        args.extend(["-sess_in", f]);
    }
    let mut child = Command::new("timeout")
        .args(&args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl");
    // stdin stays open until s_client is done: it quits at EOF, maybe
    // before the answer is in.
    let mut stdin = child.stdin.take();
    if let Some(i) = stdin.as_mut() {
        let _ = i.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n");
    }
    let out = child.wait_with_output().expect("s_client");
    drop(stdin);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("200 OK"), "{}", text);
    text
}

/// TLS 1.2: a session resumed from its ticket gets an empty
/// NewSessionTicket (no new ticket: an OpenSSL client drops from its
/// cache a session whose ticket is renewed), so the ticket keeps
/// resuming; nginx (OpenSSL) sends none. A full handshake gets a ticket.
#[test]
fn tls12_ticket_resumption_keeps_the_ticket() {
    let p = Prefix::new();
    self_signed(&p, "a", "a.test");
    let s = Server::start_in(
        p,
        "http { ssl_session_cache shared:SSL:1m; server { listen 127.0.0.1:@PORT@ ssl; \
         ssl_certificate a.crt; ssl_certificate_key a.key; \
         location / { return 200 \"$ssl_session_reused\\n\"; } } }",
    );
    let dir = s.prefix.path("conf");
    let full = s_client(&dir, s.port, None, "s1.pem");
    assert!(full.contains("New, TLSv1.2"), "{}", full);
    let ticket = |t: &str| {
        t.lines()
            .find(|l| l.contains("NewSessionTicket"))
            .map(str::to_string)
            .unwrap_or_default()
    };
    assert!(!ticket(&full).is_empty(), "{}", full);
    assert!(!ticket(&full).contains("[length 000a]"), "{}", full);
    for _ in 0..2 {
        let again = s_client(&dir, s.port, Some("s1.pem"), "s2.pem");
        assert!(again.contains("Reused, TLSv1.2"), "{}", again);
        assert!(ticket(&again).contains("[length 000a]"), "{}", again);
    }
}

/// The same in the stream module (stream_ssl_certificate.t's "session id
/// context match"): a TLS 1.2 session resumed from its ticket keeps it,
/// on its own server and on another with the same certificates (one
/// shared cache), as OpenSSL's clients need to resume it again.
#[test]
fn stream_tls12_ticket_resumption_keeps_the_ticket() {
    let p = Prefix::new();
    self_signed(&p, "a", "a.test");
    let same = free_port();
    let s = Server::start_in(
        p,
        &format!(
            "stream {{ ssl_session_cache shared:SSL:1m; ssl_certificate $one.crt; \
             ssl_certificate_key $one.key; map $ssl_server_name $one {{ default a; }} \
             server {{ listen 127.0.0.1:@PORT@ ssl; return \"200 OK $ssl_session_reused\\n\"; }} \
             server {{ listen 127.0.0.1:{same} ssl; return \"200 OK $ssl_session_reused\\n\"; }} }}"
        ),
    );
    let dir = s.prefix.path("conf");
    let ticket = |t: &str| {
        t.lines()
            .find(|l| l.contains("NewSessionTicket"))
            .map(str::to_string)
            .unwrap_or_default()
    };
    let full = s_client(&dir, s.port, None, "s1.pem");
    assert!(full.contains("New, TLSv1.2"), "{}", full);
    assert!(!ticket(&full).contains("[length 000a]"), "{}", full);
    for port in [s.port, same, s.port] {
        let again = s_client(&dir, port, Some("s1.pem"), "s2.pem");
        assert!(again.contains("Reused, TLSv1.2"), "{}", again);
        assert!(again.contains("200 OK r"), "{}", again);
        assert!(ticket(&again).contains("[length 000a]"), "{}", again);
    }
}

/// A session made by a server is resumed by a server with the same
/// certificates (another port, the same shared cache and tickets) and
/// not by one with other certificates: OpenSSL's session id context,
/// which nginx derives from the certificates. TLS 1.3 and 1.2 tickets,
/// and the TLS 1.2 session cache.
#[test]
fn tls_sessions_stay_with_their_certificates() {
    let start = |tickets: &str| {
        let p = Prefix::new();
        self_signed(&p, "a", "a.test");
        self_signed(&p, "b", "a.test");
        let (same, other) = (free_port(), free_port());
        let conf = format!(
            "http {{ ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:SSL:1m; {tickets} \
             server {{ listen 127.0.0.1:@PORT@ ssl; ssl_certificate a.crt; ssl_certificate_key a.key; \
             location / {{ return 200 \"$ssl_session_reused\\n\"; }} }} \
             server {{ listen 127.0.0.1:{same} ssl; ssl_certificate a.crt; ssl_certificate_key a.key; \
             location / {{ return 200 \"$ssl_session_reused\\n\"; }} }} \
             server {{ listen 127.0.0.1:{other} ssl; ssl_certificate b.crt; ssl_certificate_key b.key; \
             location / {{ return 200 \"$ssl_session_reused\\n\"; }} }} }}"
        );
        (Server::start_in(p, &conf), same, other)
    };
    let reused = |cfg: &Arc<ClientConfig>, port: u16| get(cfg, port, "a.test").0.body_str();
    let (s, same, other) = start("");
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let cfg = client(&[version], &[], None);
        assert_eq!(reused(&cfg, s.port), ".\n");
        assert_eq!(reused(&cfg, same), "r\n", "{:?}", version);
        assert_eq!(reused(&cfg, other), ".\n", "{:?}", version);
    }
    drop(s);
    // TLS 1.2 sessions through the cache (no tickets).
    let (s, same, other) = start("ssl_session_tickets off;");
    let cfg = client(&[&rustls::version::TLS12], &[], None);
    assert_eq!(reused(&cfg, s.port), ".\n");
    assert_eq!(reused(&cfg, same), "r\n");
    assert_eq!(reused(&cfg, other), ".\n");
}

/// `ssl_conf_command` where rustls has the setting: `Certificate` and
/// `PrivateKey` replace the server's pair, `Options SessionTicket` turns
/// tickets back on, `Options -ServerPreference` lets the client's order
/// win (the commands come last, as in nginx); a command rustls has no
/// equivalent for is a warning, an unknown one nginx's error.
#[test]
fn tls_conf_command_maps_onto_rustls() {
    use rustls::CipherSuite as C;
    let p = Prefix::new();
    self_signed(&p, "a", "a.test");
    let over = self_signed(&p, "override", "override.test");
    let s = Server::start_in(
        p,
        "error_log logs/error.log info;\n\
         http { ssl_protocols TLSv1.2;\n\
         server { listen 127.0.0.1:@PORT@ ssl;\n\
         ssl_session_tickets off; ssl_conf_command Options SessionTicket;\n\
         ssl_prefer_server_ciphers on; ssl_conf_command Options -ServerPreference;\n\
         ssl_ciphers ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256;\n\
         ssl_certificate a.crt; ssl_certificate_key a.key;\n\
         ssl_conf_command Certificate override.crt; ssl_conf_command PrivateKey override.key;\n\
         ssl_conf_command SignatureAlgorithms ECDSA+SHA256;\n\
         location / { return 200 \"$ssl_session_reused $ssl_cipher\\n\"; } } }",
    );
    let cfg = client(
        &[&rustls::version::TLS12],
        &[
            C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ],
        None,
    );
    let (r, cert) = get(&cfg, s.port, "a.test");
    assert_eq!(cert, over);
    assert_eq!(r.body_str(), ". ECDHE-ECDSA-AES128-GCM-SHA256\n");
    let (r, _) = get(&cfg, s.port, "a.test");
    assert_eq!(r.body_str(), "r ECDHE-ECDSA-AES128-GCM-SHA256\n");
    let log = s.error_log();
    assert!(
        log.contains(
            "\"ssl_conf_command SignatureAlgorithms ECDSA+SHA256\" is not applied: \
             rustls has no equivalent of \"SignatureAlgorithms\""
        ),
        "{}",
        log
    );
    // Unknown commands and bad values: nginx's (OpenSSL's) error.
    for (cmd, msg) in [
        (
            "Foo bar",
            "SSL_CONF_cmd(\"Foo\", \"bar\") failed (unknown cmd name:cmd=Foo)",
        ),
        (
            "Options Bogus",
            "SSL_CONF_cmd(\"Options\", \"Bogus\") failed (bad value:cmd=Options, value=Bogus)",
        ),
    ] {
        let t = harness::ConfTest::run(&format!(
            "events {{}}\nhttp {{\nserver {{\nlisten 127.0.0.1:1 ssl;\nssl_conf_command {};\n}}\n}}\n",
            cmd
        ));
        t.assert_says("emerg", msg, 5);
    }
}

/// `ssl_verify_client on` with only `ssl_trusted_certificate` (nginx
/// 1.22 wants ssl_client_certificate, later ones do not): no CA names
/// are sent, a certificate the file vouches for is good. Certificates in
/// `TRUSTED CERTIFICATE` PEM (`openssl x509 -trustout`) serve as the
/// server's certificate and as trusted CAs.
#[test]
fn tls_trusted_certificate_alone_and_trusted_pem() {
    let p = Prefix::new();
    let server_der = self_signed(&p, "a", "a.test");
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "trusted CA");
    let ca = ca.self_signed(&ca_key).expect("ca");
    p.write("conf/ca.crt", ca.pem());
    let leaf_key = rcgen::KeyPair::generate().expect("key");
    let mut leaf = rcgen::CertificateParams::new(vec!["client".to_string()]).expect("params");
    leaf.distinguished_name
        .push(rcgen::DnType::CommonName, "client");
    let leaf = leaf.signed_by(&leaf_key, &ca, &ca_key).expect("leaf");
    let dir = p.path("conf");
    for (f, purpose) in [("a.crt", "serverAuth"), ("ca.crt", "clientAuth")] {
        let ok = Command::new("openssl")
            .args([
                "x509",
                "-addtrust",
                purpose,
                "-trustout",
                "-in",
                f,
                "-out",
                f,
            ])
            .current_dir(&dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "openssl x509 -trustout");
    }
    assert!(p.read("conf/a.crt").contains("BEGIN TRUSTED CERTIFICATE"));
    let s = Server::start_in(
        p,
        "http { ssl_protocols TLSv1.2 TLSv1.3; server { listen 127.0.0.1:@PORT@ ssl; \
         ssl_certificate a.crt; ssl_certificate_key a.key; \
         ssl_verify_client on; ssl_trusted_certificate ca.crt; \
         location / { return 200 \"$ssl_client_verify $ssl_client_s_dn\\n\"; } } }",
    );
    let good = client(
        &[&rustls::version::TLS13],
        &[],
        Some((leaf.der().to_vec(), leaf_key.serialize_der())),
    );
    let (r, cert) = get(&good, s.port, "a.test");
    assert_eq!(cert, server_der);
    assert_eq!(r.body_str(), "SUCCESS CN=client\n");
    let stranger_key = rcgen::KeyPair::generate().expect("key");
    let stranger = rcgen::CertificateParams::new(vec!["x".to_string()])
        .expect("params")
        .self_signed(&stranger_key)
        .expect("cert");
    let bad = client(
        &[&rustls::version::TLS13],
        &[],
        Some((stranger.der().to_vec(), stranger_key.serialize_der())),
    );
    assert_eq!(get(&bad, s.port, "a.test").0.status, 400);
}
