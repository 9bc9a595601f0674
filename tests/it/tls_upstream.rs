//! TLS to upstreams as nginx does it: `proxy_ssl_certificate` (with an
//! encrypted key and `proxy_ssl_password_file`), `proxy_ssl_crl` over a
//! whole chain, `proxy_ssl_verify` of a certificate named only by its CN
//! (X.509 v1, as `openssl req -x509` writes without extensions), and the
//! error-log lines of a refused upstream certificate. Certificates and
//! CRLs are made by the openssl CLI; the same config runs in nginx, and
//! the answers are compared.

use std::path::Path;
use std::process::Command;

use crate::harness::{self, Prefix, Server};

fn openssl(dir: &Path, args: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("openssl {} >>openssl.out 2>&1", args))
        .current_dir(dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The files of the config below, in `dir` (nginx-tests' recipe).
fn make_pki(dir: &Path) -> bool {
    std::fs::create_dir_all(dir).expect("mkdir");
    let w = |name: &str, text: &str| std::fs::write(dir.join(name), text).expect("write");
    w(
        "req.conf",
        "[ req ]\ndefault_bits = 2048\nencrypt_key = no\n\
         distinguished_name = dn\n[ dn ]\n",
    );
    w(
        "ca-req.conf",
        "[ req ]\ndefault_bits = 2048\nencrypt_key = no\ndistinguished_name = dn\n\
         x509_extensions = ext\n[ dn ]\n[ ext ]\nbasicConstraints = critical,CA:TRUE\n",
    );
    w(
        "ca.conf",
        &format!(
            "[ ca ]\ndefault_ca = myca\n[ myca ]\nnew_certs_dir = {d}\ndatabase = {d}/certindex\n\
             default_md = sha256\npolicy = pol\nserial = {d}/certserial\ndefault_days = 1\n\
             x509_extensions = ext\n[ pol ]\ncommonName = supplied\n[ ext ]\n\
             basicConstraints = critical,CA:TRUE\n\
             keyUsage = critical, digitalSignature, cRLSign, keyCertSign\n",
            d = dir.display()
        ),
    );
    w("certserial", "1000");
    w("certindex", "");
    w("password", "wrong\nclient3\n");
    let ok = [
        // Client certificates: 1 trusted by the backend, 2 not, 3 with
        // an AES-encrypted key.
        "req -x509 -new -config req.conf -subj /CN=client1/ -out client1.crt -keyout client1.key",
        "req -x509 -new -config req.conf -subj /CN=client2/ -out client2.crt -keyout client2.key",
        "genrsa -out client3.key -passout pass:client3 -aes128 2048",
        "req -x509 -new -config req.conf -subj /CN=client3/ -out client3.crt -key client3.key -passin pass:client3",
        // A backend certificate named by its CN only (v1, no SAN).
        "req -x509 -new -config req.conf -subj /CN=cn.example.com/ -out cn.crt -keyout cn.key",
        // root -> int -> end, and CRLs.
        "req -x509 -new -config ca-req.conf -subj /CN=root/ -out root.crt -keyout root.key",
        "req -new -config req.conf -subj /CN=int/ -out int.csr -keyout int.key",
        "req -new -config req.conf -subj /CN=end/ -out end.csr -keyout end.key",
        "ca -batch -config ca.conf -keyfile root.key -cert root.crt -subj /CN=int/ -in int.csr -out int.crt",
        "ca -batch -config ca.conf -keyfile int.key -cert int.crt -subj /CN=end/ -in end.csr -out end.crt",
        "ca -gencrl -config ca.conf -keyfile root.key -cert root.crt -out empty.crl -crldays 1",
        "ca -gencrl -config ca.conf -keyfile int.key -cert int.crt -out int.crl -crldays 1",
        "ca -config ca.conf -revoke int.crt -keyfile root.key -cert root.crt",
        "ca -gencrl -config ca.conf -keyfile root.key -cert root.crt -out root.crl -crldays 1",
    ]
    .iter()
    .all(|a| openssl(dir, a));
    if !ok {
        return false;
    }
    let cat = |out: &str, parts: &[&str]| {
        let mut v = Vec::new();
        for p in parts {
            v.extend(std::fs::read(dir.join(p)).expect("read"));
        }
        std::fs::write(dir.join(out), v).expect("write");
    };
    cat("empty-chain.crl", &["empty.crl", "int.crl"]);
    cat("int-root.crt", &["int.crt", "root.crt"]);
    true
}

/// Front server on @PORT@; backends on @B1@ (asks for a client
/// certificate, trusts client1), @B2@ (trusts client3), @B3@ (the CN-only
/// certificate), @B4@ (int, signed by root), @B5@ (end, signed by int).
const CONF: &str = r#"
events {}
http {
    access_log off;
    proxy_ssl_session_reuse off;
    server {
        listen 127.0.0.1:@PORT@;
        location /cert1 {
            proxy_pass https://127.0.0.1:@B1@/;
            proxy_ssl_certificate client1.crt;
            proxy_ssl_certificate_key client1.key;
        }
        location /cert2 {
            proxy_pass https://127.0.0.1:@B1@/;
            proxy_ssl_certificate client2.crt;
            proxy_ssl_certificate_key client2.key;
        }
        location /nocert {
            proxy_pass https://127.0.0.1:@B1@/;
        }
        location /encrypted {
            proxy_pass https://127.0.0.1:@B2@/;
            proxy_ssl_certificate client3.crt;
            proxy_ssl_certificate_key client3.key;
            proxy_ssl_password_file password;
        }
        location /cn {
            proxy_pass https://127.0.0.1:@B3@/;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate cn.crt;
            proxy_ssl_name cn.example.com;
        }
        location /badname {
            proxy_pass https://127.0.0.1:@B3@/;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate cn.crt;
            proxy_ssl_name bad.example.com;
        }
        location /crl/ok {
            proxy_pass https://127.0.0.1:@B4@/;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate root.crt;
            proxy_ssl_name int;
            proxy_ssl_crl empty.crl;
        }
        location /crl/revoked {
            proxy_pass https://127.0.0.1:@B4@/;
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate root.crt;
            proxy_ssl_name int;
            proxy_ssl_crl root.crl;
        }
        location /crl/incomplete {
            proxy_pass https://127.0.0.1:@B5@/;
            proxy_ssl_verify on;
            proxy_ssl_verify_depth 2;
            proxy_ssl_trusted_certificate int-root.crt;
            proxy_ssl_name end;
            proxy_ssl_crl empty.crl;
        }
        location /crl/chain {
            proxy_pass https://127.0.0.1:@B5@/;
            proxy_ssl_verify on;
            proxy_ssl_verify_depth 2;
            proxy_ssl_trusted_certificate int-root.crt;
            proxy_ssl_name end;
            proxy_ssl_crl empty-chain.crl;
        }
    }
    server {
        listen 127.0.0.1:@B1@ ssl;
        ssl_certificate cn.crt;
        ssl_certificate_key cn.key;
        ssl_verify_client optional_no_ca;
        ssl_trusted_certificate client1.crt;
        location / { return 200 "$ssl_client_verify $ssl_client_s_dn\n"; }
    }
    server {
        listen 127.0.0.1:@B2@ ssl;
        ssl_certificate cn.crt;
        ssl_certificate_key cn.key;
        ssl_verify_client optional_no_ca;
        ssl_trusted_certificate client3.crt;
        location / { return 200 "$ssl_client_verify $ssl_client_s_dn\n"; }
    }
    server {
        listen 127.0.0.1:@B3@ ssl;
        ssl_certificate cn.crt;
        ssl_certificate_key cn.key;
        location / { return 200 "cn\n"; }
    }
    server {
        listen 127.0.0.1:@B4@ ssl;
        ssl_certificate int.crt;
        ssl_certificate_key int.key;
        location / { return 200 "int\n"; }
    }
    server {
        listen 127.0.0.1:@B5@ ssl;
        ssl_certificate end.crt;
        ssl_certificate_key end.key;
        location / { return 200 "end\n"; }
    }
}
"#;

const PATHS: [&str; 10] = [
    "/cert1",
    "/cert2",
    "/nocert",
    "/encrypted",
    "/cn",
    "/badname",
    "/crl/ok",
    "/crl/revoked",
    "/crl/incomplete",
    "/crl/chain",
];

fn with_backends(conf: &str) -> String {
    let mut t = conf.to_string();
    for b in ["@B1@", "@B2@", "@B3@", "@B4@", "@B5@"] {
        t = t.replace(b, &harness::free_port().to_string());
    }
    t
}

/// Status and body of each path.
fn answers(port: u16) -> Vec<String> {
    PATHS
        .iter()
        .map(|p| {
            let raw = harness::raw(
                port,
                format!("GET {} HTTP/1.0\r\nHost: localhost\r\n\r\n", p).as_bytes(),
            );
            match harness::Resp::parse(&raw) {
                Some(r) if r.status == 200 => format!("{} 200 {}", p, r.body_str().trim_end()),
                Some(r) => format!("{} {}", p, r.status),
                None => format!("{} no answer", p),
            }
        })
        .collect()
}

#[test]
fn tls_upstream_client_certificates_crls_and_cn_names_as_nginx() {
    let p = Prefix::new();
    if !make_pki(&p.path("conf")) {
        eprintln!("skipped: the openssl CLI could not make the certificates");
        return;
    }
    let conf = with_backends(CONF);
    let s = Server::start_in(p, &conf);
    let got = answers(s.port);
    let want = [
        "/cert1 200 SUCCESS CN=client1",
        "/cert2 200 FAILED:self-signed certificate CN=client2",
        "/nocert 200 NONE",
        "/encrypted 200 SUCCESS CN=client3",
        "/cn 200 cn",
        "/badname 502",
        "/crl/ok 200 int",
        "/crl/revoked 502",
        "/crl/incomplete 502",
        "/crl/chain 200 end",
    ];
    assert_eq!(got, want);
    let log = s.wait_error_log("upstream SSL certificate does not match");
    assert!(
        log.contains(
            "upstream SSL certificate does not match \"bad.example.com\" while SSL handshaking to upstream"
        ),
        "{}",
        log
    );
    assert!(
        log.contains(
            "upstream SSL certificate verify error: (23:certificate revoked) while SSL handshaking to upstream"
        ),
        "{}",
        log
    );
    assert!(
        log.contains(
            "upstream SSL certificate verify error: (3:unable to get certificate CRL) while SSL handshaking to upstream"
        ),
        "{}",
        log
    );

    // The same config in nginx: the same answers.
    if !harness::nginx_installed() {
        return;
    }
    let np = Prefix::new();
    assert!(make_pki(&np.path("conf")));
    let port = harness::free_port();
    let Some(_n) = harness::start_nginx(&np, &with_backends(CONF), port) else {
        eprintln!("skipped: nginx did not start");
        return;
    };
    assert_eq!(answers(port), want);
}

#[test]
fn tls_upstream_certificate_config_errors() {
    let p = Prefix::new();
    let conf = "events {}\nhttp { server { listen 127.0.0.1:1; location / {\n\
                proxy_pass https://127.0.0.1:2;\n\
                proxy_ssl_certificate some.crt;\n} } }\n";
    let file = p.write("conf/t.conf", conf);
    let o = p.run(&["-t", "-c", file.to_str().unwrap_or("")]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no \"proxy_ssl_certificate_key\" is defined for certificate"),
        "{}",
        err
    );
    let conf = "events {}\nhttp { server { listen 127.0.0.1:1; location / {\n\
                proxy_pass https://127.0.0.1:2;\n\
                proxy_ssl_crl missing.crl;\n} } }\n";
    let file = p.write("conf/t.conf", conf);
    let o = p.run(&["-t", "-c", file.to_str().unwrap_or("")]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("X509_LOOKUP_load_file(\""), "{}", err);
}

/// The `PREFIX_ssl_*` rows are one table written per prefix: the same
/// checks, in nginx's words with the module's prefix (as nginx 1.22
/// prints them for the same configs), for proxy, grpc and uwsgi; and none
/// where the pass is plain.
#[test]
fn tls_upstream_checks_are_the_same_for_every_prefix() {
    let p = Prefix::new();
    let check = |inner: &str| {
        let conf = format!(
            "events {{}}\nhttp {{ server {{ listen 127.0.0.1:1; location / {{\n{}\n}} }} }}\n",
            inner
        );
        let file = p.write("conf/t.conf", conf);
        let o = p.run(&["-t", "-c", file.to_str().unwrap_or("")]);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    for (prefix, tls, plain) in [
        ("proxy", "https://127.0.0.1:2", "http://127.0.0.1:2"),
        ("grpc", "grpcs://127.0.0.1:2", "grpc://127.0.0.1:2"),
        ("uwsgi", "suwsgi://127.0.0.1:2", "uwsgi://127.0.0.1:2"),
    ] {
        let (ok, err) = check(&format!(
            "{prefix}_pass {tls}; {prefix}_ssl_verify on; {prefix}_ssl_verify_depth 2;"
        ));
        assert!(!ok);
        assert!(
            err.contains(&format!(
                "no {prefix}_ssl_trusted_certificate for {prefix}_ssl_verify"
            )),
            "{err}"
        );
        let (ok, err) = check(&format!(
            "{prefix}_pass {tls}; {prefix}_ssl_certificate some.crt;"
        ));
        assert!(!ok);
        assert!(
            err.contains(&format!(
                "no \"{prefix}_ssl_certificate_key\" is defined for certificate \"some.crt\""
            )),
            "{err}"
        );
        let (ok, err) = check(&format!(
            "{prefix}_pass {tls}; {prefix}_ssl_crl missing.crl;"
        ));
        assert!(!ok);
        assert!(err.contains("X509_LOOKUP_load_file(\""), "{err}");
        let (ok, err) = check(&format!(
            "{prefix}_pass {plain}; {prefix}_ssl_verify on; {prefix}_ssl_certificate some.crt;"
        ));
        assert!(ok, "{err}");
    }
}

/// `PREFIX_ssl_conf_command` applies to the upstream side as nginx
/// hands it to OpenSSL, last (`MaxProtocol` beats `proxy_ssl_protocols`,
/// `Protocol` adds TLS 1.3 to nginx 1.22's default); `PREFIX_ssl_name`
/// takes variables; an unknown command is nginx's error, one rustls has
/// no equivalent for a warning naming it, for every prefix.
#[test]
fn tls_upstream_conf_command_and_name_with_variables() {
    let p = Prefix::new();
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("cert");
    p.write("conf/b.crt", c.cert.pem());
    p.write("conf/b.key", c.key_pair.serialize_pem());
    let b = harness::free_port();
    let srv = Server::start_in(
        p,
        &format!(
            "http {{ server {{ listen 127.0.0.1:@PORT@;\n\
               location /both {{ proxy_pass https://127.0.0.1:{b}/; proxy_ssl_protocols TLSv1.2 TLSv1.3; }}\n\
               location /max12 {{ proxy_pass https://127.0.0.1:{b}/;\n\
                 proxy_ssl_protocols TLSv1.2 TLSv1.3; proxy_ssl_conf_command MaxProtocol TLSv1.2; }}\n\
               location /add13 {{ proxy_pass https://127.0.0.1:{b}/; proxy_ssl_conf_command Protocol TLSv1.3; }}\n\
               location /name {{ proxy_pass https://127.0.0.1:{b}/; proxy_ssl_protocols TLSv1.3;\n\
                 proxy_ssl_verify on; proxy_ssl_trusted_certificate b.crt; proxy_ssl_name $arg_n; }} }}\n\
             server {{ listen 127.0.0.1:{b} ssl; ssl_certificate b.crt; ssl_certificate_key b.key;\n\
               ssl_protocols TLSv1.3; location / {{ return 200 \"tls13\\n\"; }} }} }}\n"
        ),
    );
    let status = |path: &str| srv.get(path).status;
    assert_eq!(status("/both"), 200);
    assert_eq!(status("/max12"), 502);
    assert_eq!(status("/add13"), 200);
    assert_eq!(status("/name?n=localhost"), 200);
    assert_eq!(status("/name?n=other.example"), 502);
    // The error log is written a moment later, by its own thread.
    harness::wait_log(
        &srv.prefix,
        "logs/error.log",
        "upstream SSL certificate does not match \"other.example\"",
    );

    let t = Prefix::new();
    let check = |inner: &str| {
        let conf = format!(
            "events {{}}\nhttp {{ server {{ listen 127.0.0.1:1; location / {{\n{}\n}} }} }}\n",
            inner
        );
        let file = t.write("conf/t.conf", conf);
        let o = t.run(&["-t", "-c", file.to_str().unwrap_or("")]);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    for (prefix, tls) in [
        ("proxy", "https://127.0.0.1:2"),
        ("grpc", "grpcs://127.0.0.1:2"),
        ("uwsgi", "suwsgi://127.0.0.1:2"),
    ] {
        let (ok, err) = check(&format!(
            "{prefix}_pass {tls}; {prefix}_ssl_conf_command Foo bar;"
        ));
        assert!(!ok);
        assert!(
            err.contains("SSL_CONF_cmd(\"Foo\", \"bar\") failed") && err.contains("t.conf:3"),
            "{err}"
        );
        let (ok, err) = check(&format!(
            "{prefix}_pass {tls}; {prefix}_ssl_conf_command SignatureAlgorithms RSA+SHA256;\n\
             {prefix}_ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256; {prefix}_ssl_name $host;"
        ));
        assert!(ok, "{err}");
        assert!(
            err.contains(&format!(
                "\"{prefix}_ssl_conf_command SignatureAlgorithms RSA+SHA256\" is not applied"
            )),
            "{err}"
        );
    }
}
