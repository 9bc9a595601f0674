//! TLS in the stream module with certificates as `openssl req -x509`
//! makes them without an extensions section (X.509 v1, which OpenSSL and
//! so nginx take): `proxy_ssl` to an upstream serving one (with
//! `proxy_ssl_verify off`), client certificates (`ssl_verify_client`,
//! `$ssl_client_*`, a refused session logged with 500) presented by
//! `proxy_ssl_certificate`; and `worker_shutdown_timeout` ending the
//! sessions of a configuration a reload replaced.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use crate::harness::*;

const HTTP: &str = "http { server { listen 127.0.0.1:@PORT@; } }\n";

/// A self-signed X.509 v1 certificate `NAME.crt` / `NAME.key` in `conf/`.
fn v1_cert(p: &Prefix, name: &str) -> bool {
    p.write(
        "conf/openssl.cnf",
        "[ req ]\ndefault_bits = 2048\nencrypt_key = no\n\
         distinguished_name = req_distinguished_name\n[ req_distinguished_name ]\n",
    );
    std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-new",
            "-config",
            "openssl.cnf",
            "-subj",
            &format!("/CN={name}/"),
            "-out",
            &format!("{name}.crt"),
            "-keyout",
            &format!("{name}.key"),
        ])
        .current_dir(p.path("conf"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn read_all(port: u16) -> Vec<u8> {
    let mut c = connect(port);
    c.set_read_timeout(Some(Duration::from_secs(10))).ok();
    read_to_close(&mut c)
}

#[test]
fn stream_tls_v1_certificates_and_client_certificates() {
    let p = Prefix::new();
    if !v1_cert(&p, "server") || !v1_cert(&p, "client") {
        eprintln!("skipped: openssl CLI failed");
        return;
    }
    let (s1, s2, s3) = (free_port(), free_port(), free_port());
    let conf = format!(
        "error_log logs/error.log info;\n{HTTP}stream {{
        log_format s $status;
        server {{
            listen 127.0.0.1:{s1} ssl;
            ssl_certificate server.crt; ssl_certificate_key server.key;
            ssl_verify_client on; ssl_client_certificate client.crt;
            return \"$ssl_client_verify|$ssl_client_s_dn|$ssl_protocol\";
            access_log logs/s.log s;
        }}
        server {{
            listen 127.0.0.1:{s2};
            proxy_pass 127.0.0.1:{s1};
            proxy_ssl on;
            proxy_ssl_certificate client.crt; proxy_ssl_certificate_key client.key;
        }}
        server {{ listen 127.0.0.1:{s3}; proxy_pass 127.0.0.1:{s1}; proxy_ssl on; }}
    }}\n"
    );
    // Started once the http port listens, which means every listener is
    // open: no probe of the stream ports (it would be a logged session).
    let srv = Server::start_in(p, &conf);
    // A v1 server certificate is taken (proxy_ssl_verify off), and the
    // client certificate sent with proxy_ssl_certificate is verified
    // (proxy_ssl_protocols defaults to nginx 1.22's: TLSv1.2 at most).
    assert_eq!(
        String::from_utf8_lossy(&read_all(s2)),
        "SUCCESS|CN=client|TLSv1.2"
    );
    // No certificate with ssl_verify_client on: the session ends (500).
    assert_eq!(read_all(s3), b"");
    let log = wait_log(&srv.prefix, "logs/s.log", "500");
    let mut lines: Vec<&str> = log.lines().collect();
    lines.sort();
    assert_eq!(lines, ["200", "500"]);
    srv.wait_error_log("client sent no required SSL certificate");
}

/// `proxy_ssl_alpn` (nginx 1.29's): the protocols offered to the
/// upstream, literal or from variables, a value that renders empty not
/// sent; none offered without the directive.
#[test]
fn stream_proxy_ssl_alpn_offers_rendered_protocols() {
    let p = Prefix::new();
    if !v1_cert(&p, "server") {
        eprintln!("skipped: openssl CLI failed");
        return;
    }
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect();
    let (be, a, b, c, d) = (ports[0], ports[1], ports[2], ports[3], ports[4]);
    let conf = format!(
        "{HTTP}stream {{
        ssl_certificate server.crt; ssl_certificate_key server.key;
        proxy_ssl on;
        map $server_port $want {{ {c} v1; default \"\"; }}
        server {{ listen 127.0.0.1:{be} ssl; ssl_alpn v1 v2; return \"[$ssl_alpn_protocol]\"; }}
        server {{ listen 127.0.0.1:{a}; proxy_pass 127.0.0.1:{be}; }}
        server {{ listen 127.0.0.1:{b}; proxy_pass 127.0.0.1:{be}; proxy_ssl_alpn v2; }}
        server {{ listen 127.0.0.1:{c}; proxy_pass 127.0.0.1:{be}; proxy_ssl_alpn $want v2; }}
        server {{ listen 127.0.0.1:{d}; proxy_pass 127.0.0.1:{be}; proxy_ssl_alpn $want v2; }}
    }}\n"
    );
    let _srv = Server::start_in(p, &conf);
    assert_eq!(read_all(a), b"[]");
    assert_eq!(read_all(b), b"[v2]");
    assert_eq!(read_all(c), b"[v1]");
    assert_eq!(read_all(d), b"[v2]");
}

/// `proxy_ssl_conf_command Certificate/PrivateKey` replaces the pair of
/// `proxy_ssl_certificate` (applied last, as nginx hands the commands to
/// OpenSSL after its own settings); an unknown command is nginx's error.
#[test]
fn stream_proxy_ssl_conf_command_overrides_the_client_certificate() {
    let p = Prefix::new();
    if !v1_cert(&p, "server") || !v1_cert(&p, "client") || !v1_cert(&p, "override") {
        eprintln!("skipped: openssl CLI failed");
        return;
    }
    let (be, a, b) = (free_port(), free_port(), free_port());
    let conf = format!(
        "{HTTP}stream {{
        server {{
            listen 127.0.0.1:{be} ssl;
            ssl_certificate server.crt; ssl_certificate_key server.key;
            ssl_verify_client optional_no_ca;
            return \"$ssl_client_s_dn\";
        }}
        server {{
            listen 127.0.0.1:{a};
            proxy_pass 127.0.0.1:{be}; proxy_ssl on;
            proxy_ssl_certificate client.crt; proxy_ssl_certificate_key client.key;
            proxy_ssl_conf_command Certificate override.crt;
            proxy_ssl_conf_command PrivateKey override.key;
        }}
        server {{
            listen 127.0.0.1:{b};
            proxy_pass 127.0.0.1:{be}; proxy_ssl on;
            proxy_ssl_certificate client.crt; proxy_ssl_certificate_key client.key;
        }}
    }}\n"
    );
    let srv = Server::start_in(p, &conf);
    assert_eq!(read_all(a), b"CN=override");
    assert_eq!(read_all(b), b"CN=client");
    drop(srv);
    let t = ConfTest::run(
        "events {}\nstream { server { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; \
         proxy_ssl_conf_command Bogus x; } }\n",
    );
    t.assert_says(
        "emerg",
        "SSL_CONF_cmd(\"Bogus\", \"x\") failed (unknown cmd name:cmd=Bogus)",
        2,
    );
}

#[test]
fn stream_worker_shutdown_timeout_ends_old_sessions_on_reload() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let be = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut b = [0u8; 64];
                while let Ok(n) = s.read(&mut b) {
                    if n == 0 || s.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let s1 = free_port();
    let conf = format!(
        "worker_shutdown_timeout 10ms;\nerror_log logs/error.log info;\n{HTTP}stream {{ server {{ listen 127.0.0.1:{s1}; proxy_pass 127.0.0.1:{be}; }} }}\n"
    );
    let mut srv = Server::start(&conf);
    srv.wait_listening(s1);
    let mut c = connect(s1);
    c.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut b = [0u8; 4];
    c.write_all(b"ping").expect("write");
    c.read_exact(&mut b).expect("echo");
    srv.signal(SIGHUP);
    // The session of the replaced configuration is closed by tern (EOF),
    // not left to the read timeout.
    let mut rest = Vec::new();
    let r = c.read_to_end(&mut rest);
    assert!(r.is_ok(), "session not closed after the reload: {r:?}");
    srv.wait_error_log("shutdown timeout");
}
