//! TLS production features: client certificates (`ssl_verify_client` and
//! the `$ssl_client_*` variables, 495/496, compared with the real nginx
//! byte for byte), `ssl_session_ticket_key` (sessions resumed by another
//! tern process with the same key file), `ssl_password_file` with keys
//! encrypted by the openssl CLI, `ssl_reject_handshake`.

use std::sync::Arc;

use rustls::ClientConfig;

use crate::harness::{self, Prefix, Resp, Server};

/// A CA, a client certificate it signed and a self-signed stranger.
struct Pki {
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

pub(crate) struct Leaf {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Pki {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "tern client CA");
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "Tern, Inc.");
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let ca = p.self_signed(&ca_key).expect("ca");
        Pki { ca, ca_key }
    }

    fn leaf(&self, cn: &str, signed: bool) -> Leaf {
        let mut p = rcgen::CertificateParams::new(vec![cn.to_string()]).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.distinguished_name.push(rcgen::DnType::CountryName, "NL");
        p.serial_number = Some(rcgen::SerialNumber::from_slice(&[0x10, 0x00, 0xab]));
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = if signed {
            p.signed_by(&key, &self.ca, &self.ca_key).expect("sign")
        } else {
            p.self_signed(&key).expect("self-signed")
        };
        Leaf { cert, key }
    }
}

/// A client that trusts anything (the server's certificate is not what
/// these tests are about) and presents `leaf`, if any.
pub(crate) fn client(leaf: Option<&Leaf>) -> Arc<ClientConfig> {
    let cert = leaf.map(|l| (l.cert.der().to_vec(), l.key.serialize_der()));
    harness::tls_client(rustls::DEFAULT_VERSIONS, &[], cert)
}

fn get(cfg: &Arc<ClientConfig>, port: u16, sni: &str, req: &str) -> Vec<u8> {
    harness::tls_exchange(cfg, port, sni, req).0
}

/// The server certificate (self-signed, for both servers).
fn server_cert(p: &Prefix) {
    let key = rcgen::KeyPair::generate().expect("key");
    let c = rcgen::CertificateParams::new(vec!["a.test".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    p.write("conf/a.test.crt", c.pem());
    p.write("conf/a.test.key", key.serialize_pem());
}

const VARS: &str = "$ssl_client_verify|$ssl_client_s_dn|$ssl_client_i_dn|\
$ssl_client_s_dn_legacy|$ssl_client_i_dn_legacy|$ssl_client_serial|\
$ssl_client_fingerprint|$ssl_client_v_start|$ssl_client_v_end|$ssl_client_v_remain|\
$ssl_client_escaped_cert|$ssl_client_raw_cert";

fn conf() -> String {
    format!(
        r#"
error_log logs/error.log info;
http {{
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate a.test.crt;
    ssl_certificate_key a.test.key;
    ssl_client_certificate ca.pem;
    server {{
        listen 127.0.0.1:@PORT@ ssl;
        server_name on.test;
        ssl_verify_client on;
        location / {{ return 200 "{VARS}\n"; }}
    }}
    server {{
        listen 127.0.0.1:@PORT@ ssl;
        server_name optional.test;
        ssl_verify_client optional;
        location / {{ return 200 "{VARS}\n"; }}
    }}
    server {{
        listen 127.0.0.1:@PORT@ ssl;
        server_name noca.test;
        ssl_verify_client optional_no_ca;
        location / {{ return 200 "$ssl_client_verify|$ssl_client_s_dn\n"; }}
    }}
    server {{
        listen 127.0.0.1:@PORT@ ssl;
        server_name off.test;
        location / {{ return 200 "$ssl_client_verify|$ssl_client_s_dn\n"; }}
    }}
}}
"#
    )
}

#[test]
fn tls_client_certificates_same_bytes_as_nginx() {
    let pki = Pki::new();
    let good = pki.leaf("alice", true);
    let stranger = pki.leaf("mallory", false);
    let pt = Prefix::new();
    server_cert(&pt);
    pt.write("conf/ca.pem", pki.ca.pem());
    let s = Server::start_in(pt, &conf());
    let nginx = if harness::nginx_installed() {
        let pn = Prefix::new();
        for f in ["a.test.crt", "a.test.key", "ca.pem"] {
            std::fs::copy(
                s.prefix.path(&format!("conf/{}", f)),
                pn.path(&format!("conf/{}", f)),
            )
            .expect("copy");
        }
        let port = harness::free_port();
        harness::start_nginx(&pn, &conf(), port).map(|n| (n, port, pn))
    } else {
        None
    };
    let req = |host: &str| {
        format!(
            "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            host
        )
    };
    let none = client(None);
    let alice = client(Some(&good));
    let mallory = client(Some(&stranger));
    let cases: [(&Arc<ClientConfig>, &str, &str); 9] = [
        (&none, "on.test", "496"),
        (&mallory, "on.test", "495"),
        (&alice, "on.test", "200"),
        (&none, "optional.test", "200"),
        (&mallory, "optional.test", "495"),
        (&alice, "optional.test", "200"),
        (&mallory, "noca.test", "200"),
        (&alice, "off.test", "200"),
        // Host other than the SNI name, naming a verifying server.
        (&alice, "off.test", "421"),
    ];
    for (i, (cfg, sni, want)) in cases.iter().enumerate() {
        let host = if *want == "421" { "on.test" } else { sni };
        let got = get(cfg, s.port, sni, &req(host));
        let r = Resp::parse(&got).unwrap_or_else(|| panic!("case {}: no response", i));
        let want_wire = if matches!(*want, "495" | "496") {
            "400"
        } else {
            want
        };
        assert_eq!(
            r.status.to_string(),
            want_wire,
            "case {}: {}",
            i,
            r.body_str()
        );
        if let Some((_, port, _)) = &nginx {
            let n = Resp::parse(&get(cfg, *port, sni, &req(host))).expect("nginx response");
            // The page's signature line names the server: cut there.
            let norm = |x: &Resp| {
                let body = x.body_str();
                let body = body.split("<hr><center>").next().unwrap_or("");
                let head: Vec<String> = x
                    .head_normalized()
                    .lines()
                    .filter(|l| !l.starts_with("Content-Length"))
                    .map(str::to_string)
                    .collect();
                format!("{}\n{}", head.join("\n"), body)
            };
            assert_eq!(norm(&r), norm(&n), "case {} ({} -> {})", i, sni, want);
        }
    }
    // The variables' values, whatever nginx says.
    let body = Resp::parse(&get(&alice, s.port, "on.test", &req("on.test")))
        .expect("response")
        .body_str();
    let f: Vec<&str> = body.trim_end().split('|').collect();
    assert_eq!(f[0], "SUCCESS");
    // rcgen writes CN before C: RFC 2253 prints the last first.
    assert_eq!(f[1], "C=NL,CN=alice");
    assert_eq!(f[2], "O=Tern\\, Inc.,CN=tern client CA");
    assert_eq!(f[3], "/CN=alice/C=NL");
    assert_eq!(f[5], "1000AB");
    assert_eq!(f[6].len(), 40);
    assert!(f[7].ends_with(" GMT"), "{}", f[7]);
    assert!(
        f[10].starts_with("-----BEGIN%20CERTIFICATE-----%0A"),
        "{}",
        f[10]
    );
    assert!(f[11].starts_with("-----BEGIN CERTIFICATE-----\n"));
    let body = Resp::parse(&get(&mallory, s.port, "noca.test", &req("noca.test")))
        .expect("response")
        .body_str();
    assert_eq!(body, "FAILED:self-signed certificate|C=NL,CN=mallory\n");
    s.wait_error_log(
        "client sent no required SSL certificate while reading client request headers",
    );
    s.wait_error_log(
        "client SSL certificate verify error: (18:self-signed certificate) while reading client request headers",
    );
}

#[test]
fn tls_client_certificate_config_errors() {
    let p = Prefix::new();
    server_cert(&p);
    let (ok, err) = conf_test(
        &p,
        "events {} http { server { listen 127.0.0.1:1 ssl; ssl_certificate a.test.crt; \
         ssl_certificate_key a.test.key; ssl_verify_client on; } }",
    );
    assert!(!ok);
    assert!(
        err.contains("no ssl_client_certificate for ssl_verify_client"),
        "{}",
        err
    );
}

/// Two tern processes, one after the other, with the same ticket key
/// file: the second resumes the first one's session (a restart, or a
/// fleet behind a balancer); with another key file it cannot.
#[test]
fn tls_session_ticket_key_resumes_across_processes() {
    let key: Vec<u8> = (0..80u8).collect();
    let other: Vec<u8> = (100..180u8).collect();
    let conf = "http { ssl_protocols TLSv1.2 TLSv1.3; server { listen 127.0.0.1:@PORT@ ssl; \
                ssl_certificate a.test.crt; ssl_certificate_key a.test.key; \
                ssl_session_ticket_key ticket.key; \
                location / { return 200 \"$ssl_session_reused $ssl_session_id\\n\"; } } }";
    // The fleet shares its certificate too: a session is resumed only by
    // a server with the same certificates (OpenSSL's session id context).
    let certs = Prefix::new();
    server_cert(&certs);
    let start = |k: &[u8]| {
        let p = Prefix::new();
        p.write("conf/a.test.crt", certs.read("conf/a.test.crt"));
        p.write("conf/a.test.key", certs.read("conf/a.test.key"));
        p.write("conf/ticket.key", k);
        Server::start_in(p, conf)
    };
    let cfg = client(None);
    let req = "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n";
    let body = |s: &Server| {
        Resp::parse(&get(&cfg, s.port, "a.test", req))
            .expect("response")
            .body_str()
    };
    let mut a = start(&key);
    let first = body(&a);
    assert!(first.starts_with(". "), "{}", first);
    a.signal(15);
    a.wait_exit(std::time::Duration::from_secs(10));
    let b = start(&key);
    let second = body(&b);
    // Resumed, and the session keeps its id.
    assert_eq!(second, first.replacen(". ", "r ", 1));
    let c = start(&other);
    assert!(body(&c).starts_with(". "));
    drop(b);
    // A key file of the wrong size, in nginx's words.
    let p = Prefix::new();
    server_cert(&p);
    p.write("conf/ticket.key", [0u8; 20]);
    let (_, err) = conf_test(&p, &format!("events {{}} {}", conf.replace("@PORT@", "1")));
    assert!(
        err.contains("ticket.key\" must be 48 or 80 bytes"),
        "{}",
        err
    );
}

/// `tern -t` on `text` in the prefix `p` (whose conf/ has the files).
fn conf_test(p: &Prefix, text: &str) -> (bool, String) {
    let file = p.write("conf/t.conf", text);
    let o = p.run(&["-t", "-c", file.to_str().unwrap_or("")]);
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn openssl(dir: &std::path::Path, args: &[&str]) -> bool {
    std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Keys encrypted by the openssl CLI (PKCS#8 as OpenSSL 3 writes by
/// default, and the traditional PEM encryption), with the password in a
/// file of several; `ssl_reject_handshake` for an unknown name.
#[test]
fn tls_password_file_and_reject_handshake() {
    let p = Prefix::new();
    let conf_dir = p.path("conf");
    std::fs::create_dir_all(&conf_dir).expect("mkdir");
    if !openssl(&conf_dir, &["version"]) {
        return;
    }
    for (name, extra) in [("p8", &[][..]), ("trad", &["-traditional"][..])] {
        let key = format!("{}.key", name);
        let mut args = vec!["genrsa", "-aes256", "-passout", "pass:secret", "-out", &key];
        args.extend_from_slice(extra);
        args.push("2048");
        assert!(openssl(&conf_dir, &args));
        assert!(openssl(
            &conf_dir,
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                &key,
                "-passin",
                "pass:secret",
                "-subj",
                &format!("/CN={}", name),
                "-out",
                &format!("{}.crt", name),
            ]
        ));
    }
    p.write("conf/passwords", "wrong\r\nsecret\n");
    let s = Server::start_in(
        p,
        "http { ssl_password_file passwords; \
         server { listen 127.0.0.1:@PORT@ ssl; server_name p8; \
           ssl_certificate p8.crt; ssl_certificate_key p8.key; return 200 \"p8\\n\"; } \
         server { listen 127.0.0.1:@PORT@ ssl; server_name trad; \
           ssl_certificate trad.crt; ssl_certificate_key trad.key; return 200 \"trad\\n\"; } \
         server { listen 127.0.0.1:@PORT@ ssl; server_name closed; ssl_reject_handshake on; } }",
    );
    let cfg = client(None);
    for name in ["p8", "trad"] {
        let r = Resp::parse(&get(
            &cfg,
            s.port,
            name,
            &format!(
                "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                name
            ),
        ))
        .expect("response");
        assert_eq!(r.body_str(), format!("{}\n", name));
    }
    // The handshake for "closed" fails: no response at all.
    let got = get(
        &cfg,
        s.port,
        "closed",
        "GET / HTTP/1.1\r\nHost: closed\r\nConnection: close\r\n\r\n",
    );
    assert!(got.is_empty());
    // Without the right password the configuration is refused.
    s.prefix.write("conf/passwords", "wrong\n");
    let out = s.prefix.run(&[
        "-t",
        "-c",
        &s.prefix.path("conf/nginx.conf").display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot load certificate key"), "{}", err);
}
