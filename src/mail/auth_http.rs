//! The `auth_http` exchange: one HTTP/1.0 GET to the auth server with the
//! client's credentials in headers (`Auth-Method`, `Auth-User`,
//! `Auth-Pass`, `Auth-Salt`, `Auth-Protocol`, `Auth-Login-Attempt`,
//! `Client-IP`, `Client-Host`, the SMTP envelope, the PROXY header's
//! addresses, then `auth_http_header` lines), and the answer's headers:
//! `Auth-Status` (OK, or the error text for the client), `Auth-Server`,
//! `Auth-Port`, `Auth-User`, `Auth-Pass`, `Auth-Wait`, `Auth-Error-Code`.
//! The response is read to the server's close, within `auth_http_timeout`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::core::log::Level;
use crate::mail::conf::Protocol;
use crate::mail::session::{Auth, Method, Session};

/// The auth server's decision.
pub enum Verdict {
    /// Log in to `addr`; `Auth-User`/`Auth-Pass` when the server sent them.
    Ok {
        addr: SocketAddr,
        login: Option<Vec<u8>>,
        passwd: Option<Vec<u8>>,
    },
    /// Refused: the line for the client, and `Auth-Wait` if sent.
    Refused {
        msg: Vec<u8>,
        wait: Option<Duration>,
    },
    /// The auth server failed or answered nonsense (logged).
    Error,
}

/// nginx's escaping of header values (NGX_ESCAPE_MAIL_AUTH): `%`, space
/// and control bytes become `%XX`.
fn escape(out: &mut Vec<u8>, v: &[u8]) {
    for &b in v {
        if b <= 0x20 || b == b'%' || b >= 0x7f {
            out.extend_from_slice(format!("%{:02X}", b).as_bytes());
        } else {
            out.push(b);
        }
    }
}

/// The request, in nginx's header order.
pub fn request(s: &Session, a: &Auth) -> Vec<u8> {
    let srv = &s.srv;
    let mut r = Vec::with_capacity(512);
    r.extend_from_slice(b"GET ");
    r.extend_from_slice(srv.auth_http.uri.as_bytes());
    r.extend_from_slice(b" HTTP/1.0\r\nHost: ");
    r.extend_from_slice(srv.auth_http.host.as_bytes());
    r.extend_from_slice(b"\r\nAuth-Method: ");
    r.extend_from_slice(a.method.name().as_bytes());
    r.extend_from_slice(b"\r\nAuth-User: ");
    escape(&mut r, &a.login);
    r.extend_from_slice(b"\r\nAuth-Pass: ");
    escape(&mut r, &a.passwd);
    r.extend_from_slice(b"\r\n");
    if let (Some(salt), Method::Apop | Method::CramMd5) = (&s.salt, a.method) {
        // The salt keeps its CRLF.
        r.extend_from_slice(b"Auth-Salt: ");
        r.extend_from_slice(salt);
    }
    r.extend_from_slice(b"Auth-Protocol: ");
    r.extend_from_slice(srv.protocol.name().as_bytes());
    r.extend_from_slice(format!("\r\nAuth-Login-Attempt: {}\r\n", s.attempt).as_bytes());
    r.extend_from_slice(b"Client-IP: ");
    r.extend_from_slice(
        s.remote
            .map(|a| a.ip().to_string())
            .unwrap_or_else(|| "unix:".into())
            .as_bytes(),
    );
    r.extend_from_slice(b"\r\n");
    if srv.protocol == Protocol::Smtp {
        // The client's name as the resolver found it, or nginx's
        // placeholder (see `session::client_host`).
        r.extend_from_slice(b"Client-Host: ");
        r.extend_from_slice(&s.host);
        r.extend_from_slice(b"\r\n");
        r.extend_from_slice(b"Auth-SMTP-Helo: ");
        escape(&mut r, &s.smtp_helo);
        r.extend_from_slice(b"\r\nAuth-SMTP-From: ");
        escape(&mut r, &s.smtp_from);
        r.extend_from_slice(b"\r\nAuth-SMTP-To: ");
        escape(&mut r, &s.smtp_to);
        r.extend_from_slice(b"\r\n");
    }
    if let Some(t) = &s.tls_info {
        use crate::tls::vars::{eval, SslVar};
        r.extend_from_slice(b"Auth-SSL: on\r\n");
        r.extend_from_slice(format!("Auth-SSL-Protocol: {}\r\n", t.protocol).as_bytes());
        r.extend_from_slice(format!("Auth-SSL-Cipher: {}\r\n", t.cipher).as_bytes());
        let verifying = srv
            .client_auth
            .as_ref()
            .is_some_and(|a| a.mode != crate::tls::client_auth::VerifyMode::Off);
        let mut fields: Vec<(&str, SslVar)> = Vec::new();
        if verifying {
            fields.extend([
                ("Auth-SSL-Verify", SslVar::ClientVerify),
                ("Auth-SSL-Subject", SslVar::ClientSDn),
                ("Auth-SSL-Issuer", SslVar::ClientIDn),
                ("Auth-SSL-Serial", SslVar::ClientSerial),
                ("Auth-SSL-Fingerprint", SslVar::ClientFingerprint),
            ]);
        }
        if srv.auth_http_pass_client_cert {
            fields.push(("Auth-SSL-Cert", SslVar::ClientEscapedCert));
        }
        for (name, v) in fields {
            let mut val = Vec::new();
            eval(Some(t), v, &mut val);
            // Empty values (no certificate) are left out, as nginx does.
            if !val.is_empty() {
                r.extend_from_slice(name.as_bytes());
                r.extend_from_slice(b": ");
                // As nginx, the values go as they are (the certificate
                // is already escaped); a line break is never let through.
                r.extend(
                    val.iter()
                        .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
                );
                r.extend_from_slice(b"\r\n");
            }
        }
    }
    if let Some(h) = &s.pp {
        if let Some((ip, port)) = h.src {
            r.extend_from_slice(format!("Proxy-Protocol-Addr: {}\r\n", ip).as_bytes());
            r.extend_from_slice(format!("Proxy-Protocol-Port: {}\r\n", port).as_bytes());
        }
        if let Some((ip, port)) = h.dst {
            r.extend_from_slice(format!("Proxy-Protocol-Server-Addr: {}\r\n", ip).as_bytes());
            r.extend_from_slice(format!("Proxy-Protocol-Server-Port: {}\r\n", port).as_bytes());
        }
    }
    r.extend_from_slice(&srv.auth_http_headers);
    r.extend_from_slice(b"\r\n");
    r
}

/// Sends the request and reads the verdict.
pub async fn ask(s: &Session, a: &Auth) -> Verdict {
    let srv = &s.srv;
    let req = request(s, a);
    let peer = srv.auth_http.addr;
    let exchange = async {
        let mut c = TcpStream::connect(peer).await?;
        c.write_all(&req).await?;
        let mut resp = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let n = c.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            resp.extend_from_slice(&chunk[..n]);
            // The head is all that matters; the body is never read.
            if resp.windows(4).any(|w| w == b"\r\n\r\n") || resp.len() > 64 * 1024 {
                break;
            }
        }
        Ok::<_, std::io::Error>(resp)
    };
    let resp = match tokio::time::timeout(srv.auth_http_timeout, exchange).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            s.log(
                Level::Error,
                format_args!(
                    "auth http server {} failed {}{}",
                    peer,
                    crate::core::errno_text(&e),
                    s.ctx(Some(&a.login))
                ),
            );
            return Verdict::Error;
        }
        Err(_) => {
            s.log(
                Level::Error,
                format_args!(
                    "auth http server {} timed out{}",
                    peer,
                    s.ctx(Some(&a.login))
                ),
            );
            return Verdict::Error;
        }
    };
    parse(s, a, &resp)
}

fn header<'a>(lines: &[(&'a [u8], &'a [u8])], name: &str) -> Option<&'a [u8]> {
    lines
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| *v)
}

/// Reads the answer's head.
fn parse(s: &Session, a: &Auth, resp: &[u8]) -> Verdict {
    let srv = &s.srv;
    let peer = srv.auth_http.addr;
    let invalid = || {
        s.log(
            Level::Error,
            format_args!(
                "auth http server {} sent invalid response{}",
                peer,
                s.ctx(Some(&a.login))
            ),
        );
        Verdict::Error
    };
    let end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(resp.len());
    let mut lines = resp[..end]
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let status = lines.next().unwrap_or_default();
    if !status.starts_with(b"HTTP/1.") || status.len() < 12 {
        return invalid();
    }
    let mut hs = Vec::new();
    for l in lines {
        let Some(i) = l.iter().position(|&b| b == b':') else {
            return invalid();
        };
        let v = &l[i + 1..];
        let v = &v[v.iter().position(|&b| b != b' ').unwrap_or(v.len())..];
        hs.push((&l[..i], v));
    }
    let Some(st) = header(&hs, "Auth-Status") else {
        return invalid();
    };
    if st != b"OK" {
        let wait = header(&hs, "Auth-Wait")
            .and_then(|w| std::str::from_utf8(w).ok()?.parse::<u64>().ok())
            .map(Duration::from_secs);
        let mut msg = Vec::new();
        match srv.protocol {
            Protocol::Pop3 => msg.extend_from_slice(b"-ERR "),
            Protocol::Imap => {
                msg.extend_from_slice(&s.tag);
                msg.extend_from_slice(b" NO ");
            }
            Protocol::Smtp => {
                match header(&hs, "Auth-Error-Code") {
                    Some(c) => msg.extend_from_slice(c),
                    None => msg.extend_from_slice(b"535 5.7.0"),
                }
                msg.push(b' ');
            }
        }
        msg.extend_from_slice(st);
        msg.extend_from_slice(b"\r\n");
        s.log(
            Level::Error,
            format_args!(
                "client login failed: \"{}\"{}",
                String::from_utf8_lossy(st),
                s.ctx(Some(&a.login))
            ),
        );
        return Verdict::Refused { msg, wait };
    }
    let Some(host) = header(&hs, "Auth-Server") else {
        s.log(
            Level::Error,
            format_args!(
                "auth http server {} did not send server or port{}",
                peer,
                s.ctx(Some(&a.login))
            ),
        );
        return Verdict::Error;
    };
    let port = header(&hs, "Auth-Port")
        .and_then(|p| std::str::from_utf8(p).ok()?.parse::<u16>().ok())
        .filter(|p| *p != 0);
    let ip = std::str::from_utf8(host)
        .ok()
        .and_then(|h| h.parse::<IpAddr>().ok());
    let (Some(ip), Some(port)) = (ip, port) else {
        s.log(
            Level::Error,
            format_args!(
                "auth http server {} sent invalid server address:\"{}\"{}",
                peer,
                String::from_utf8_lossy(host),
                s.ctx(Some(&a.login))
            ),
        );
        return Verdict::Error;
    };
    let login = header(&hs, "Auth-User").map(<[u8]>::to_vec);
    let passwd = header(&hs, "Auth-Pass")
        .filter(|p| !p.is_empty())
        .map(<[u8]>::to_vec);
    // APOP and CRAM-MD5 give a digest, not the password: the auth server
    // must send the password for the backend.
    let no_passwd = match srv.protocol {
        // XCLIENT needs no password; AUTH PLAIN to the backend does.
        Protocol::Smtp => {
            srv.proxy_smtp_auth
                && a.method != Method::None
                && passwd.is_none()
                && (a.passwd.is_empty() || matches!(a.method, Method::CramMd5))
        }
        _ => passwd.is_none() && matches!(a.method, Method::Apop | Method::CramMd5),
    };
    if no_passwd {
        s.log(
            Level::Error,
            format_args!(
                "auth http server {} did not send password{}",
                peer,
                s.ctx(Some(&a.login))
            ),
        );
        return Verdict::Error;
    }
    Verdict::Ok {
        addr: SocketAddr::new(ip, port),
        login,
        passwd,
    }
}
