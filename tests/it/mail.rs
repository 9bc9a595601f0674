//! The `mail {}` proxy: POP3, IMAP and SMTP dialogues with exact bytes,
//! the auth_http request and its answers, the backend login and the
//! relay. The test plays the auth server and the backend itself, on
//! loopback threads; the mail server listens on `@PORT@`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::*;

type Log = Arc<Mutex<Vec<String>>>;

fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let p = l.local_addr().expect("addr").port();
    (l, p)
}

/// An auth_http server: records each request head; `secret` is the
/// password, anything else is refused with `Auth-Wait: 0`.
fn auth_server(backend: u16) -> (u16, Log) {
    let (l, port) = listener();
    let log: Log = Arc::default();
    let seen = log.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(1) => head.push(b[0]),
                    _ => break,
                }
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let ok = head.contains("Auth-Pass: secret\r\n")
                || head.contains("Auth-Method: none\r\n")
                || head.contains("Auth-Method: apop\r\n");
            seen.lock().unwrap().push(head);
            let resp = if ok {
                format!(
                    "HTTP/1.0 200 OK\r\nAuth-Status: OK\r\nAuth-Server: 127.0.0.1\r\nAuth-Port: {}\r\nAuth-Pass: secret\r\n\r\n",
                    backend
                )
            } else {
                "HTTP/1.0 200 OK\r\nAuth-Status: Invalid login or password\r\nAuth-Wait: 0\r\nAuth-Error-Code: 535 5.7.8\r\n\r\n".to_string()
            };
            let _ = s.write_all(resp.as_bytes());
        }
    });
    (port, log)
}

/// A backend that greets with `greeting`, records every line and
/// answers each with `answer(line)`.
fn backend(greeting: &'static str, answer: fn(&str) -> String) -> (u16, Log) {
    let (l, port) = listener();
    let log: Log = Arc::default();
    let seen = log.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut w = s.try_clone().expect("clone");
                let _ = w.write_all(greeting.as_bytes());
                let mut r = BufReader::new(s);
                let mut line = String::new();
                while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                    seen.lock().unwrap().push(line.clone());
                    let a = answer(line.trim_end());
                    if w.write_all(a.as_bytes()).is_err() {
                        break;
                    }
                    line.clear();
                }
            });
        }
    });
    (port, log)
}

fn pop3_answer(l: &str) -> String {
    if l.starts_with("USER") {
        "+OK user ok\r\n".into()
    } else if l.starts_with("PASS") {
        "+OK pass ok\r\n".into()
    } else {
        format!("+OK got {}\r\n", l)
    }
}

struct C {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl C {
    fn new(port: u16) -> C {
        let s = connect(port);
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        C {
            w: s.try_clone().expect("clone"),
            r: BufReader::new(s),
        }
    }
    fn line(&mut self) -> String {
        let mut l = String::new();
        let _ = self.r.read_line(&mut l);
        l
    }
    fn send(&mut self, l: &str) {
        self.w
            .write_all(format!("{}\r\n", l).as_bytes())
            .expect("send");
    }
    fn ask(&mut self, l: &str) -> String {
        self.send(l);
        self.line()
    }
    /// Lines up to and including the `.` line of a multi-line answer.
    fn until_dot(&mut self) -> String {
        let mut all = String::new();
        loop {
            let l = self.line();
            all.push_str(&l);
            if l == ".\r\n" || l.is_empty() {
                return all;
            }
        }
    }
}

fn mail_conf(body: &str, auth: u16) -> String {
    format!(
        "error_log logs/error.log info;\nmail {{\n    auth_http http://127.0.0.1:{}/mail/auth;\n{}\n}}\n",
        auth, body
    )
}

/// A mail server in front of the test's auth_http server and a fake
/// backend, and a client connected to it: what every dialogue test
/// starts with.
struct Mail {
    c: C,
    /// The auth_http server's port (its `Host` header).
    auth: u16,
    auth_log: Log,
    be_log: Log,
    _srv: Server,
}

impl Mail {
    /// `body` follows `auth_http` in `mail {}`; the backend greets with
    /// `greeting` and answers each line with `answer(line)`.
    fn start(greeting: &'static str, answer: fn(&str) -> String, body: &str) -> Mail {
        Mail::start_in(Prefix::new(), greeting, answer, body)
    }

    fn start_in(p: Prefix, greeting: &'static str, answer: fn(&str) -> String, body: &str) -> Mail {
        let (be, be_log) = backend(greeting, answer);
        let (auth, auth_log) = auth_server(be);
        let srv = Server::start_in(p, &mail_conf(body, auth));
        Mail {
            c: C::new(srv.port),
            auth,
            auth_log,
            be_log,
            _srv: srv,
        }
    }

    /// The auth_http request heads so far.
    fn heads(&self) -> Vec<String> {
        self.auth_log.lock().unwrap().clone()
    }

    /// The lines the backend got so far.
    fn backend_got(&self) -> Vec<String> {
        self.be_log.lock().unwrap().clone()
    }
}

#[test]
fn mail_pop3_user_pass_auth_http_and_relay() {
    let mut m = Mail::start(
        "+OK fake pop3\r\n",
        pop3_answer,
        "    auth_http_header X-Extra yes;\n    server { listen 127.0.0.1:@PORT@; protocol pop3; }",
    );
    let c = &mut m.c;
    assert_eq!(c.line(), "+OK POP3 ready\r\n");
    assert_eq!(c.ask("NOOP"), "+OK\r\n");
    assert_eq!(c.ask("FOO"), "-ERR invalid command\r\n");
    assert_eq!(c.ask("USER test@example.com"), "+OK\r\n");
    // The backend's answer to PASS is the client's.
    assert_eq!(c.ask("PASS secret"), "+OK pass ok\r\n");
    assert_eq!(c.ask("STAT"), "+OK got STAT\r\n");
    assert_eq!(
        m.heads(),
        vec![format!(
            "GET /mail/auth HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nAuth-Method: plain\r\nAuth-User: test@example.com\r\nAuth-Pass: secret\r\nAuth-Protocol: pop3\r\nAuth-Login-Attempt: 1\r\nClient-IP: 127.0.0.1\r\nX-Extra: yes\r\n\r\n",
            m.auth
        )]
    );
    assert_eq!(
        m.backend_got(),
        vec!["USER test@example.com\r\n", "PASS secret\r\n", "STAT\r\n"]
    );
}

#[test]
fn mail_pop3_refused_login_waits_then_retries() {
    let mut m = Mail::start(
        "+OK fake pop3\r\n",
        pop3_answer,
        "    server { listen 127.0.0.1:@PORT@; protocol pop3; pop3_auth plain apop cram-md5 external; }",
    );
    let c = &mut m.c;
    let g = c.line();
    assert!(
        g.starts_with("+OK POP3 ready <") && g.ends_with(">\r\n"),
        "{g}"
    );
    // AUTH PLAIN with an initial response, a wrong password.
    let bad = base64("\0test@example.com\0bad");
    assert_eq!(
        c.ask(&format!("AUTH PLAIN {}", bad)),
        "-ERR Invalid login or password\r\n"
    );
    assert_eq!(c.ask("AUTH"), "+OK methods supported:\r\n");
    assert_eq!(
        c.until_dot(),
        "PLAIN\r\nLOGIN\r\nCRAM-MD5\r\nEXTERNAL\r\n.\r\n"
    );
    assert_eq!(c.ask("AUTH LOGIN"), "+ VXNlcm5hbWU6\r\n");
    assert_eq!(c.ask(&base64("test@example.com")), "+ UGFzc3dvcmQ6\r\n");
    assert_eq!(c.ask(&base64("secret")), "+OK pass ok\r\n");
    let heads = m.heads();
    assert_eq!(heads.len(), 2);
    assert!(heads[0].contains("Auth-Login-Attempt: 1\r\n"));
    assert!(
        heads[1].contains("Auth-Login-Attempt: 2\r\n"),
        "{}",
        heads[1]
    );
    assert!(heads[1].contains("Auth-Method: plain\r\nAuth-User: test@example.com\r\n"));
}

#[test]
fn mail_pop3_capa_and_apop_salt() {
    let mut m = Mail::start(
        "+OK fake pop3\r\n",
        pop3_answer,
        "    server { listen 127.0.0.1:@PORT@; protocol pop3; pop3_auth plain apop cram-md5; }",
    );
    let c = &mut m.c;
    let g = c.line();
    let salt = g
        .trim_start_matches("+OK POP3 ready ")
        .trim_end()
        .to_string();
    c.send("CAPA");
    assert_eq!(
        c.until_dot(),
        "+OK Capability list follows\r\nTOP\r\nUSER\r\nUIDL\r\nSASL PLAIN LOGIN CRAM-MD5\r\n.\r\n"
    );
    assert_eq!(
        c.ask(&format!("APOP test@example.com {}", "0".repeat(32))),
        "+OK pass ok\r\n"
    );
    let heads = m.heads();
    assert!(
        heads[0].contains(&format!("Auth-Method: apop\r\nAuth-User: test@example.com\r\nAuth-Pass: {}\r\nAuth-Salt: {}\r\n", "0".repeat(32), salt)),
        "{}",
        heads[0]
    );
}

fn smtp_answer(l: &str) -> String {
    let up = l.to_ascii_uppercase();
    if up.starts_with("EHLO") || up.starts_with("HELO") {
        "250-fake\r\n250 8BITMIME\r\n".into()
    } else if up.starts_with("XCLIENT") {
        "220 xclient ok\r\n".into()
    } else if up.starts_with("MAIL") || up.starts_with("RCPT") {
        "250 2.1.0 ok\r\n".into()
    } else {
        format!("250 got {}\r\n", l)
    }
}

#[test]
fn mail_smtp_ehlo_auth_xclient_and_relay() {
    let mut m = Mail::start(
        "220 fake esmtp\r\n",
        smtp_answer,
        "    server { listen 127.0.0.1:@PORT@; protocol smtp; server_name mx.test; smtp_capabilities SIZE 8BITMIME; }",
    );
    let c = &mut m.c;
    assert_eq!(c.line(), "220 mx.test ESMTP ready\r\n");
    c.send("EHLO client.test");
    let mut e = String::new();
    for _ in 0..4 {
        e.push_str(&c.line());
    }
    assert_eq!(
        e,
        "250-mx.test\r\n250-SIZE\r\n250-8BITMIME\r\n250 AUTH PLAIN LOGIN\r\n"
    );
    assert_eq!(
        c.ask("MAIL FROM:<a@b>"),
        "530 5.7.1 Authentication required\r\n"
    );
    assert_eq!(c.ask("BLAH"), "500 5.5.1 Invalid command\r\n");
    assert_eq!(
        c.ask(&format!("AUTH PLAIN {}", base64("\0u@test\0wrong"))),
        "535 5.7.8 Invalid login or password\r\n"
    );
    assert_eq!(c.ask("AUTH LOGIN"), "334 VXNlcm5hbWU6\r\n");
    assert_eq!(c.ask(&base64("u@test")), "334 UGFzc3dvcmQ6\r\n");
    assert_eq!(c.ask(&base64("secret")), "235 2.0.0 OK\r\n");
    assert_eq!(c.ask("DATA"), "250 got DATA\r\n");
    assert_eq!(
        m.backend_got(),
        vec![
            "EHLO mx.test\r\n",
            "XCLIENT ADDR=127.0.0.1 LOGIN=u@test NAME=[UNAVAILABLE]\r\n",
            "EHLO client.test\r\n",
            "DATA\r\n"
        ]
    );
    let heads = m.heads();
    assert!(
        heads[1].contains("Auth-Protocol: smtp\r\nAuth-Login-Attempt: 2\r\nClient-IP: 127.0.0.1\r\nClient-Host: [UNAVAILABLE]\r\nAuth-SMTP-Helo: client.test\r\nAuth-SMTP-From: \r\nAuth-SMTP-To: \r\n"),
        "{}",
        heads[1]
    );
}

#[test]
fn mail_smtp_auth_none_passes_the_envelope() {
    let mut m = Mail::start(
        "220 fake esmtp\r\n",
        smtp_answer,
        "    xclient off;\n    server { listen 127.0.0.1:@PORT@; protocol smtp; server_name mx.test; smtp_auth none; }",
    );
    let c = &mut m.c;
    c.line();
    assert_eq!(c.ask("HELO client.test"), "250 mx.test\r\n");
    assert_eq!(
        c.ask("RCPT TO:<x@y>"),
        "503 5.5.1 Bad sequence of commands\r\n"
    );
    assert_eq!(c.ask("MAIL FROM:<a@b>"), "250 2.0.0 OK\r\n");
    // The backend's answer to RCPT TO is the client's.
    assert_eq!(c.ask("RCPT TO:<x@y>"), "250 2.1.0 ok\r\n");
    assert_eq!(
        m.backend_got(),
        vec![
            "HELO mx.test\r\n",
            "MAIL FROM:<a@b>\r\n",
            "RCPT TO:<x@y>\r\n"
        ]
    );
    let heads = m.heads();
    assert!(heads[0].contains("Auth-Method: none\r\nAuth-User: \r\nAuth-Pass: \r\n"));
    assert!(heads[0].contains("Auth-SMTP-Helo: client.test\r\nAuth-SMTP-From: MAIL%20FROM:<a@b>\r\nAuth-SMTP-To: RCPT%20TO:<x@y>\r\n"), "{}", heads[0]);
}

#[test]
fn mail_smtp_greeting_delay_refuses_early_talkers() {
    let mut m = Mail::start(
        "220 fake esmtp\r\n",
        smtp_answer,
        "    server { listen 127.0.0.1:@PORT@; protocol smtp; server_name mx.test; smtp_greeting_delay 2s; }",
    );
    let c = &mut m.c;
    c.send("EHLO early");
    assert_eq!(
        c.line(),
        "503 5.5.0 Improper use of SMTP command pipelining\r\n"
    );
    assert_eq!(c.line(), "");
}

fn imap_answer(l: &str) -> String {
    if l.ends_with('}') {
        "+ go ahead\r\n".into()
    } else if l == "secret" {
        "a1 OK login ok\r\n".into()
    } else {
        let tag = l.split(' ').next().unwrap_or("*");
        format!("{} OK done\r\n", tag)
    }
}

#[test]
fn mail_imap_login_literals_and_capability() {
    let mut m = Mail::start(
        "* OK fake imap\r\n",
        imap_answer,
        "    server { listen 127.0.0.1:@PORT@; protocol imap; imap_auth plain cram-md5; }",
    );
    let c = &mut m.c;
    assert_eq!(c.line(), "* OK IMAP4 ready\r\n");
    assert_eq!(
        c.ask("a0 CAPABILITY"),
        "* CAPABILITY IMAP4 IMAP4rev1 UIDPLUS AUTH=PLAIN AUTH=CRAM-MD5\r\n"
    );
    assert_eq!(c.line(), "a0 OK completed\r\n");
    assert_eq!(c.ask("a0 LOGIN"), "a0 BAD invalid command\r\n");
    assert_eq!(c.ask("a1 LOGIN {7}"), "+ OK\r\n");
    c.w.write_all(b"te\"st@x \"se\\\"cret\"\r\n").expect("send");
    assert_eq!(c.line(), "a1 NO Invalid login or password\r\n");
    assert_eq!(
        c.ask("a1 LOGIN {7+}\r\nte\"st@x secret"),
        "a1 OK login ok\r\n"
    );
    let heads = m.heads();
    assert!(
        heads[0].contains("Auth-User: te\"st@x\r\nAuth-Pass: se\"cret\r\n"),
        "{}",
        heads[0]
    );
    assert_eq!(
        m.backend_got(),
        vec!["a1 LOGIN {7}\r\n", "te\"st@x {6}\r\n", "secret\r\n"]
    );
}

/// A tag is 1 to 32 of nginx's characters before a space: a literal, a
/// quoted string, a CR or LF, or a longer tag is an invalid command
/// answered with `*` (and counted toward max_errors), the bytes nginx
/// 1.22 sends; a tag echoed back can never break its line.
#[test]
fn mail_imap_tags_as_nginx() {
    let mut m = Mail::start(
        "* OK fake imap\r\n",
        imap_answer,
        "    server { listen 127.0.0.1:@PORT@; protocol imap; }",
    );
    let c = &mut m.c;
    assert_eq!(c.line(), "* OK IMAP4 ready\r\n");
    // No "+ OK" for the literal: the line ends at the tag.
    assert_eq!(c.ask("{3}"), "* BAD invalid command\r\n");
    c.w.write_all(b"a\nb NOOP\r\n").expect("send");
    assert_eq!(c.line(), "* BAD invalid command\r\n");
    assert_eq!(c.line(), "b OK completed\r\n");
    assert_eq!(c.ask("a\rb NOOP"), "* BAD invalid command\r\n");
    assert_eq!(c.ask("A-._z9 NOOP"), "A-._z9 OK completed\r\n");
    let long = "a".repeat(32);
    assert_eq!(
        c.ask(&format!("{long} NOOP")),
        format!("{long} OK completed\r\n")
    );
    // Five invalid commands (max_errors 5): the fifth answer, then the close.
    assert_eq!(c.ask(&format!("a{long} NOOP")), "* BAD invalid command\r\n");
    assert_eq!(c.ask("\"q t\" NOOP"), "* BAD invalid command\r\n");
    assert_eq!(c.line(), "");
}

/// A line whose tag is empty (it starts with a space) is a tagged
/// command to nginx 1.22: ` OK completed`, ` BAD invalid command`, with
/// the spaces before the command skipped; NOOP, CAPABILITY and LOGOUT
/// take no arguments but ignore any. Checked against nginx on the wire.
#[test]
fn mail_imap_empty_tag_and_ignored_arguments_as_nginx() {
    let mut m = Mail::start(
        "* OK fake imap\r\n",
        imap_answer,
        "    server { listen 127.0.0.1:@PORT@; protocol imap; }",
    );
    let c = &mut m.c;
    assert_eq!(c.line(), "* OK IMAP4 ready\r\n");
    assert_eq!(c.ask(" NOOP"), " OK completed\r\n");
    assert_eq!(c.ask("  NOOP"), " OK completed\r\n");
    assert_eq!(c.ask(" FOO"), " BAD invalid command\r\n");
    assert_eq!(c.ask("a NOOP x"), "a OK completed\r\n");
    assert_eq!(
        c.ask(" CAPABILITY x y"),
        "* CAPABILITY IMAP4 IMAP4rev1 UIDPLUS AUTH=PLAIN\r\n"
    );
    assert_eq!(c.line(), " OK completed\r\n");
    // An empty line has no tag at all.
    assert_eq!(c.ask(""), "* BAD invalid command\r\n");
    assert_eq!(c.ask(" LOGOUT"), "* BYE\r\n");
    assert_eq!(c.line(), " OK completed\r\n");
    assert_eq!(c.line(), "");
}

/// XCLIENT as nginx 1.22 sends it (checked on the wire): the login as
/// it is, without xtext (a space, `+` and `=` go out raw), and `IPV6:`
/// before an IPv6 client's address.
#[test]
fn mail_smtp_xclient_login_raw_and_ipv6_prefix() {
    let v6 = std::net::TcpListener::bind("[::1]:0")
        .ok()
        .map(|l| l.local_addr().expect("addr").port());
    let v6_listen = v6
        .map(|port| format!("listen [::1]:{port};"))
        .unwrap_or_default();
    let m = Mail::start(
        "220 fake esmtp\r\n",
        smtp_answer,
        &format!("    server {{ listen 127.0.0.1:@PORT@; {v6_listen} protocol smtp; server_name mx.test; }}"),
    );
    let login = |s: TcpStream, user: &str| {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut c = C {
            w: s.try_clone().expect("clone"),
            r: BufReader::new(s),
        };
        c.line();
        c.send("EHLO client.test");
        while c.line().get(3..4) == Some("-") {}
        let cred = base64(&format!("\0{user}\0secret"));
        assert_eq!(c.ask(&format!("AUTH PLAIN {cred}")), "235 2.0.0 OK\r\n");
    };
    login(connect(m._srv.port), "u+x=y z@test");
    let xclient = || -> Vec<String> {
        m.backend_got()
            .into_iter()
            .filter(|l| l.starts_with("XCLIENT"))
            .collect()
    };
    assert_eq!(
        xclient(),
        vec!["XCLIENT ADDR=127.0.0.1 LOGIN=u+x=y z@test NAME=[UNAVAILABLE]\r\n"]
    );
    if let Some(port) = v6 {
        login(
            TcpStream::connect(("::1", port)).expect("connect"),
            "v6@test",
        );
        assert_eq!(
            xclient()[1],
            "XCLIENT ADDR=IPV6:::1 LOGIN=v6@test NAME=[UNAVAILABLE]\r\n"
        );
    }
}

#[test]
fn mail_pop3_stls_then_login_sends_auth_ssl() {
    let p = Prefix::new();
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["mail.test".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    p.write("conf/mail.crt", cert.pem());
    p.write("conf/mail.key", key.serialize_pem());
    let mut m = Mail::start_in(
        p,
        "+OK fake pop3\r\n",
        pop3_answer,
        "    ssl_certificate mail.crt;\n    ssl_certificate_key mail.key;\n    server { listen 127.0.0.1:@PORT@; protocol pop3; starttls only; }",
    );
    let c = &mut m.c;
    assert_eq!(c.line(), "+OK POP3 ready\r\n");
    c.send("CAPA");
    // starttls only: no USER and no SASL before TLS. nginx 1.22 offers
    // TLSv1 to TLSv1.2 by default, so the session is TLSv1.2.
    assert_eq!(
        c.until_dot(),
        "+OK Capability list follows\r\nTOP\r\nUIDL\r\nSTLS\r\n.\r\n"
    );
    assert_eq!(c.ask("USER test@example.com"), "-ERR invalid command\r\n");
    assert_eq!(c.ask("STLS"), "+OK\r\n");
    let name = rustls::pki_types::ServerName::try_from("mail.test").expect("name");
    let conn =
        rustls::ClientConnection::new(crate::tls_client_cert::client(None), name).expect("tls");
    let mut t = rustls::StreamOwned::new(conn, c.w.try_clone().expect("clone"));
    let mut ask = |l: &str| {
        t.write_all(format!("{}\r\n", l).as_bytes()).expect("send");
        let mut got = Vec::new();
        let mut b = [0u8; 1];
        while !got.ends_with(b"\n") {
            match t.read(&mut b) {
                Ok(1) => got.push(b[0]),
                _ => break,
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    };
    assert_eq!(ask("USER test@example.com"), "+OK\r\n");
    assert_eq!(ask("PASS secret"), "+OK pass ok\r\n");
    assert_eq!(ask("LIST"), "+OK got LIST\r\n");
    let heads = m.heads();
    assert!(
        heads[0].contains("Client-IP: 127.0.0.1\r\nAuth-SSL: on\r\nAuth-SSL-Protocol: TLSv1.2\r\nAuth-SSL-Cipher: "),
        "{}",
        heads[0]
    );
    assert_eq!(m.backend_got().len(), 3);
}

#[test]
fn mail_config_errors_and_version() {
    let p = Prefix::new();
    p.write(
        "conf/nginx.conf",
        "events {}\nmail {\n    server {\n        listen 127.0.0.1:1025;\n        protocol pop3;\n    }\n}\n",
    );
    let out = p.run(&["-t"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no \"auth_http\" is defined for server in "),
        "{err}"
    );
    p.write(
        "conf/nginx.conf",
        "events {}\nmail {\n    auth_http 127.0.0.1:9/a;\n    server {\n        listen 127.0.0.1:1025;\n        protocol pop4;\n    }\n}\n",
    );
    let out = p.run(&["-t"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown protocol \"pop4\" in "), "{err}");
    assert!(err.contains("nginx.conf:6"), "{err}");
    let out = p.run(&["-V"]);
    let v = String::from_utf8_lossy(&out.stderr);
    assert!(v.contains(" --with-mail "), "{v}");
    assert!(v.contains(" --with-mail_ssl_module"), "{v}");
}

fn base64(s: &str) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for ch in b.chunks(3) {
        let n = (ch[0] as u32) << 16
            | (*ch.get(1).unwrap_or(&0) as u32) << 8
            | *ch.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= ch.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `resolver` in mail: before the SMTP greeting the client's name is
/// looked up (PTR of its address, then the name's A records, which must
/// include the address) and sent as `Client-Host` and XCLIENT's `NAME=`;
/// a name that does not lead back is `[UNAVAILABLE]`, a failed look-up
/// `[TEMPUNAVAIL]` with nginx's error line.
#[test]
fn mail_smtp_client_host_from_the_resolver() {
    use crate::resolver::{name_server, Ans};
    let dns = |a: [u8; 4], rcode: u8| {
        name_server(Arc::new(move |name: &str, qtype, _| match (name, qtype) {
            ("1.0.0.127.in-addr.arpa", 12) => Ans {
                rcode,
                ptr: Some("client.test".into()),
                ..Ans::default()
            },
            ("client.test", 1) => Ans {
                a: vec![a],
                ..Ans::default()
            },
            _ => Ans::default(),
        }))
        .0
    };
    let (good, other, failing) = (
        dns([127, 0, 0, 1], 0),
        dns([127, 0, 0, 9], 0),
        dns([127, 0, 0, 1], 2),
    );
    let (be, be_log) = backend("220 fake esmtp\r\n", smtp_answer);
    let (auth, auth_log) = auth_server(be);
    let srv = Server::start(&mail_conf(
        &format!(
            "    resolver_timeout 5s;\n\
             server {{ listen 127.0.0.1:@PORT@; protocol smtp; server_name mx.test; resolver 127.0.0.1:{good}; }}\n\
             server {{ listen 127.0.0.1:{p2}; protocol smtp; server_name mx.test; resolver 127.0.0.1:{other}; }}\n\
             server {{ listen 127.0.0.1:{p3}; protocol smtp; server_name mx.test; resolver 127.0.0.1:{failing}; }}",
            p2 = free_port(),
            p3 = free_port(),
        ),
        auth,
    ));
    let ports: Vec<u16> = {
        let conf = std::fs::read_to_string(&srv.conf).expect("conf");
        conf.match_indices("listen 127.0.0.1:")
            .map(|(i, m)| {
                conf[i + m.len()..]
                    .split(';')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .expect("port")
            })
            .collect()
    };
    let mut hosts = Vec::new();
    for port in ports {
        let mut c = C::new(port);
        assert_eq!(c.line(), "220 mx.test ESMTP ready\r\n");
        assert_eq!(c.ask("HELO client.test"), "250 mx.test\r\n");
        assert_eq!(
            c.ask(&format!("AUTH PLAIN {}", base64("\0u@test\0secret"))),
            "235 2.0.0 OK\r\n"
        );
        let head = auth_log.lock().unwrap().last().cloned().unwrap_or_default();
        let host = head
            .split("\r\n")
            .find_map(|l| l.strip_prefix("Client-Host: "))
            .unwrap_or("")
            .to_string();
        hosts.push(host);
    }
    assert_eq!(hosts, vec!["client.test", "[UNAVAILABLE]", "[TEMPUNAVAIL]"]);
    let xclient: Vec<String> = be_log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("XCLIENT"))
        .cloned()
        .collect();
    assert_eq!(
        xclient[0],
        "XCLIENT ADDR=127.0.0.1 LOGIN=u@test NAME=client.test\r\n"
    );
    let log = srv.wait_error_log("could not be resolved");
    assert!(
        log.contains("127.0.0.1 could not be resolved (2: Server failure) while in resolving client address, client: 127.0.0.1, server: 127.0.0.1:"),
        "{}",
        log
    );
}
