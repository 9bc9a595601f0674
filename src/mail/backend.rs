//! The login to the backend the auth server named (ngx_mail_proxy_module):
//! POP3 `USER`/`PASS`; IMAP `LOGIN` with two literals; SMTP `EHLO`, then
//! `XCLIENT` (xclient on) and the client's HELO/EHLO, `AUTH PLAIN`
//! (proxy_smtp_auth on), or the client's `MAIL FROM` and `RCPT TO`
//! (smtp_auth none). Each answer is read within `timeout`; an answer that
//! is not the expected one ends the session ("upstream sent invalid
//! response"), its line passed to the client with `proxy_pass_error_message
//! on` at the last step.

use std::net::SocketAddr;

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::core::log::Level;
use crate::mail::conf::Protocol;
use crate::mail::session::{internal_error, Auth, Client, Method, Session};
use crate::stream::proxy::Sock;

/// The backend connection with the bytes read but not yet used.
struct Up {
    sock: TcpStream,
    buf: Vec<u8>,
}

impl Up {
    /// One response: a line, or for SMTP the lines up to the one whose
    /// fourth byte is not `-`. With the CRLFs.
    async fn response(&mut self, s: &Session) -> Option<Vec<u8>> {
        let smtp = s.srv.protocol == Protocol::Smtp;
        let read = async {
            let mut start = 0;
            loop {
                if let Some(i) = self.buf[start..].iter().position(|&b| b == b'\n') {
                    let end = start + i + 1;
                    let line = &self.buf[start..end];
                    if smtp && line.len() > 4 && line[3] == b'-' {
                        start = end;
                        continue;
                    }
                    return Some(self.buf.drain(..end).collect::<Vec<u8>>());
                }
                if self.buf.len() > s.srv.proxy_buffer {
                    return None;
                }
                let mut chunk = [0u8; 4096];
                match self.sock.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                }
            }
        };
        tokio::time::timeout(s.srv.timeout, read)
            .await
            .ok()
            .flatten()
    }

    async fn send(&mut self, s: &Session, b: &[u8]) -> bool {
        matches!(
            tokio::time::timeout(s.srv.timeout, self.sock.write_all(b)).await,
            Ok(Ok(()))
        )
    }
}

/// Connects and logs in; Some(the backend socket) once the client has
/// been told it is logged in.
pub async fn login(
    s: &mut Session,
    client: &mut Client,
    addr: SocketAddr,
    a: &Auth,
) -> Option<Sock> {
    let sock = match tokio::time::timeout(s.srv.timeout, TcpStream::connect(addr)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            s.log(
                Level::Error,
                format_args!(
                    "connect() failed {} while connecting to upstream{}, upstream: {}",
                    crate::core::errno_text(&e),
                    s.ctx(Some(&a.login)),
                    addr
                ),
            );
            let _ = client.send(internal_error(s.srv.protocol)).await;
            return None;
        }
        Err(_) => {
            s.log(
                Level::Error,
                format_args!(
                    "upstream timed out (110: Connection timed out) while connecting to upstream{}, upstream: {}",
                    s.ctx(Some(&a.login)),
                    addr
                ),
            );
            let _ = client.send(internal_error(s.srv.protocol)).await;
            return None;
        }
    };
    let _ = sock.set_nodelay(true);
    let mut up = Up {
        sock,
        buf: Vec::new(),
    };
    if s.srv.proxy_protocol {
        let h = crate::stream::proxy_protocol::v1_line(s.remote, s.local);
        if !up.send(s, &h).await {
            let _ = client.send(internal_error(s.srv.protocol)).await;
            return None;
        }
    }
    let done = match s.srv.protocol {
        Protocol::Pop3 => pop3(s, &mut up, a).await,
        Protocol::Imap => imap(s, &mut up, a).await,
        Protocol::Smtp => smtp(s, &mut up, a).await,
    };
    match done {
        Ok(to_client) => {
            if !client.send(&to_client).await {
                return None;
            }
            // What the backend sent beyond its answer goes on to the client.
            if !up.buf.is_empty() && !client.send(&up.buf).await {
                return None;
            }
            Some(Sock::Tcp(up.sock))
        }
        Err((line, last)) => {
            s.log(
                Level::Error,
                format_args!(
                    "upstream sent invalid response: \"{}\"{}, upstream: {}",
                    String::from_utf8_lossy(line.trim_ascii_end()),
                    s.ctx(Some(&a.login)),
                    addr
                ),
            );
            if last && s.srv.pass_error_message && !line.is_empty() {
                let _ = client.send(&line).await;
            } else {
                let _ = client.send(internal_error(s.srv.protocol)).await;
            }
            None
        }
    }
}

/// Ok(what the client gets), or Err((the backend's line, whether it
/// answered the last step)).
type Done = Result<Vec<u8>, (Vec<u8>, bool)>;

async fn expect(s: &Session, up: &mut Up, ok: impl Fn(&[u8]) -> bool, last: bool) -> Done {
    match up.response(s).await {
        Some(l) if ok(&l) => Ok(l),
        Some(l) => Err((l, last)),
        None => Err((Vec::new(), false)),
    }
}

fn line(parts: &[&[u8]]) -> Vec<u8> {
    let mut v = parts.concat();
    v.extend_from_slice(b"\r\n");
    v
}

async fn pop3(s: &Session, up: &mut Up, a: &Auth) -> Done {
    let ok = |l: &[u8]| l.starts_with(b"+OK");
    expect(s, up, ok, false).await?;
    if !up.send(s, &line(&[b"USER ", &a.login])).await {
        return Err((Vec::new(), false));
    }
    expect(s, up, ok, false).await?;
    if !up.send(s, &line(&[b"PASS ", &a.passwd])).await {
        return Err((Vec::new(), false));
    }
    expect(s, up, ok, true).await
}

async fn imap(s: &Session, up: &mut Up, a: &Auth) -> Done {
    expect(s, up, |l| l.starts_with(b"* OK"), false).await?;
    let tag = s.tag.clone();
    let cont = |l: &[u8]| l.starts_with(b"+");
    let first = line(&[
        &tag,
        b" LOGIN {",
        a.login.len().to_string().as_bytes(),
        b"}",
    ]);
    if !up.send(s, &first).await {
        return Err((Vec::new(), false));
    }
    expect(s, up, cont, false).await?;
    let second = line(&[&a.login, b" {", a.passwd.len().to_string().as_bytes(), b"}"]);
    if !up.send(s, &second).await {
        return Err((Vec::new(), false));
    }
    expect(s, up, cont, false).await?;
    if !up.send(s, &line(&[&a.passwd])).await {
        return Err((Vec::new(), false));
    }
    // Untagged lines (a CAPABILITY) come before the tagged answer.
    let mut out = Vec::new();
    loop {
        let Some(l) = up.response(s).await else {
            return Err((Vec::new(), false));
        };
        if l.starts_with(b"* ") {
            out.extend_from_slice(&l);
            continue;
        }
        let ok = l.starts_with(&tag) && l[tag.len()..].starts_with(b" OK");
        if !ok {
            return Err((l, true));
        }
        out.extend_from_slice(&l);
        return Ok(out);
    }
}

async fn smtp(s: &Session, up: &mut Up, a: &Auth) -> Done {
    let code = |c: &'static [u8]| move |l: &[u8]| l.starts_with(c);
    let srv = s.srv.clone();
    expect(s, up, code(b"220"), false).await?;
    let verb: &[u8] = if s.esmtp || srv.xclient {
        b"EHLO "
    } else {
        b"HELO "
    };
    if !up.send(s, &line(&[verb, srv.server_name.as_bytes()])).await {
        return Err((Vec::new(), false));
    }
    expect(s, up, code(b"250"), false).await?;
    let none = a.method == Method::None;
    if srv.xclient {
        // As nginx 1.22 writes it: `IPV6:` before an IPv6 address, and
        // the login and the name as they are (no xtext: a login with a
        // space or `+` goes out raw, as nginx sends it).
        let mut x = b"XCLIENT ADDR=".to_vec();
        if let Some(r) = s.remote {
            if r.is_ipv6() {
                x.extend_from_slice(b"IPV6:");
            }
            x.extend_from_slice(r.ip().to_string().as_bytes());
        }
        if !none && !a.login.is_empty() {
            x.extend_from_slice(b" LOGIN=");
            x.extend_from_slice(&a.login);
        }
        x.extend_from_slice(b" NAME=");
        x.extend_from_slice(&s.host);
        if !up.send(s, &line(&[&x])).await {
            return Err((Vec::new(), false));
        }
        expect(s, up, |l| l.starts_with(b"2"), false).await?;
        if !s.smtp_helo.is_empty() {
            let verb: &[u8] = if s.esmtp { b"EHLO " } else { b"HELO " };
            if !up.send(s, &line(&[verb, &s.smtp_helo])).await {
                return Err((Vec::new(), false));
            }
            expect(s, up, code(b"250"), false).await?;
        }
    }
    if none {
        if !up.send(s, &line(&[&s.smtp_from])).await {
            return Err((Vec::new(), false));
        }
        expect(s, up, code(b"250"), true).await?;
        if !up.send(s, &line(&[&s.smtp_to])).await {
            return Err((Vec::new(), false));
        }
        // The backend's answer to RCPT TO is the client's, whatever it
        // is: the session goes on to the relay either way.
        return expect(s, up, |_| true, true).await;
    }
    if srv.proxy_smtp_auth {
        let mut plain = vec![0u8];
        plain.extend_from_slice(&a.login);
        plain.push(0);
        plain.extend_from_slice(&a.passwd);
        let b = base64::engine::general_purpose::STANDARD.encode(&plain);
        if !up.send(s, &line(&[b"AUTH PLAIN ", b.as_bytes()])).await {
            return Err((Vec::new(), false));
        }
        expect(s, up, code(b"235"), true).await?;
    }
    Ok(b"235 2.0.0 OK\r\n".to_vec())
}
