//! `ssl_certificate`/`ssl_certificate_key` with variables and `data:`:
//! loaded per handshake (nginx 1.22 has no cache), picked by SNI through
//! `$ssl_server_name` and by a `map`; a name that leads nowhere fails the
//! handshake and is logged. Compared with the real nginx (openssl
//! s_client as the client).

use std::process::{Command, Stdio};

use crate::harness::{self, Prefix, Server};

const CONF: &str = r#"
error_log logs/error.log info;
http {
    map $ssl_server_name $pick {
        default     a;
        b.test      b;
    }
    server {
        listen 127.0.0.1:@PORT@ ssl;
        ssl_certificate $ssl_server_name.crt;
        ssl_certificate_key $ssl_server_name.key;
        location / { return 200 "sni=$ssl_server_name\n"; }
    }
    server {
        listen 127.0.0.1:@P2@ ssl;
        ssl_certificate $pick.crt;
        ssl_certificate_key data:$pick_key;
        location / { return 200 "map\n"; }
    }
    map $pick $pick_key {
        a   "@AKEY@";
        b   "@BKEY@";
    }
}
"#;

/// A self-signed certificate for `cn` (conf/CN.crt, conf/CN.key); the
/// key's PEM.
fn cert(p: &Prefix, cn: &str) -> String {
    let mut params = rcgen::CertificateParams::new(vec![cn.to_string()]).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let key = rcgen::KeyPair::generate().expect("key");
    let c = params.self_signed(&key).expect("cert");
    p.write(&format!("conf/{}.crt", cn), c.pem());
    p.write(&format!("conf/{}.key", cn), key.serialize_pem());
    key.serialize_pem()
}

/// The subject of the certificate the server on `port` shows for SNI
/// `name`, or "failed".
fn subject(port: u16, name: &str) -> String {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{}", port)])
        .args(["-servername", name])
        .stdin(Stdio::null())
        .output()
        .expect("openssl");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.starts_with("subject="))
        .map_or_else(|| "failed".to_string(), str::to_string)
}

fn cases(port: u16, p2: u16) -> Vec<String> {
    vec![
        subject(port, "a.test"),
        subject(port, "b.test"),
        subject(port, "nx.test"),
        subject(p2, "b.test"),
        subject(p2, "other"),
    ]
}

fn conf(p: &Prefix, p2: u16) -> String {
    let akey = cert(p, "a.test").replace('\n', "\\n");
    let bkey = cert(p, "b.test").replace('\n', "\\n");
    std::fs::copy(p.path("conf/a.test.crt"), p.path("conf/a.crt")).expect("copy");
    std::fs::copy(p.path("conf/b.test.crt"), p.path("conf/b.crt")).expect("copy");
    CONF.replace("@P2@", &p2.to_string())
        .replace("@AKEY@", &akey)
        .replace("@BKEY@", &bkey)
}

#[test]
fn tls_certificates_with_variables_same_as_nginx() {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("skipped: no openssl");
        return;
    }
    let p = Prefix::new();
    let p2 = harness::free_port();
    let text = conf(&p, p2);
    let tern = Server::start_in(p, &text);
    let got = cases(tern.port, p2);
    assert_eq!(got[0], "subject=CN = a.test", "{:?}", got);
    assert_eq!(got[1], "subject=CN = b.test");
    assert_eq!(got[2], "failed");
    assert_eq!(got[3], "subject=CN = b.test");
    assert_eq!(got[4], "subject=CN = a.test");
    let log = tern.wait_error_log("nx.test.crt");
    assert!(
        log.contains("[error]")
            && log.contains("cannot load certificate \"")
            && log.contains(
                "/conf/nx.test.crt\": BIO_new_file() failed (2: No such file or directory)"
            )
            && log.contains(" while SSL handshaking, client: 127.0.0.1, server: 127.0.0.1:"),
        "{}",
        log
    );
    if !harness::nginx_installed() {
        return;
    }
    let np = Prefix::new();
    let n2 = harness::free_port();
    let ntext = conf(&np, n2);
    let nport = harness::free_port();
    let Some(_nginx) = harness::start_nginx(&np, &ntext, nport) else {
        return;
    };
    assert_eq!(cases(nport, n2), got);
}
