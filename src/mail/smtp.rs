//! The SMTP dialogue before the login (nginx's ngx_mail_smtp_module):
//! `HELO`/`EHLO`, `AUTH PLAIN|LOGIN|CRAM-MD5|EXTERNAL`, `STARTTLS`,
//! `MAIL FROM` and `RCPT TO` (with `smtp_auth none`: the RCPT starts the
//! login, the envelope goes to auth_http and the backend), `RSET`,
//! `NOOP`, `QUIT`. `smtp_greeting_delay` holds the greeting back, and a
//! client that talks before it is refused (pipelining before the greeting).

use crate::core::log::Level;
use crate::mail::conf::{auth, StartTls};
use crate::mail::pop3::{ended, split};
use crate::mail::sasl::{self, Sasl, Step};
use crate::mail::session::{self, Auth, Client, Method, Next, ReadErr, Session};

const OK: &[u8] = b"250 2.0.0 OK\r\n";
const BYE: &[u8] = b"221 2.0.0 Bye\r\n";
const STARTTLS: &[u8] = b"220 2.0.0 Start TLS\r\n";
/// The prefix of SASL prompts.
const PROMPT: &str = "334 ";
const INVALID: &[u8] = b"500 5.5.1 Invalid command\r\n";
const PIPELINING: &[u8] = b"503 5.5.0 Improper use of SMTP command pipelining\r\n";
const INVALID_ARG: &[u8] = b"501 5.5.4 Invalid argument\r\n";
const AUTH_REQUIRED: &[u8] = b"530 5.7.1 Authentication required\r\n";
const BAD_SEQUENCE: &[u8] = b"503 5.5.1 Bad sequence of commands\r\n";

/// The commands nginx's SMTP parser knows (others count toward max_errors).
const KNOWN: &[&[u8]] = &[
    b"HELO",
    b"EHLO",
    b"AUTH",
    b"QUIT",
    b"NOOP",
    b"MAIL",
    b"RSET",
    b"RCPT",
    b"VRFY",
    b"EXPN",
    b"HELP",
    b"STARTTLS",
];

/// The EHLO answer: the server name, the capabilities, STARTTLS, AUTH;
/// every line but the last with `250-`.
fn ehlo(s: &Session) -> Vec<u8> {
    let srv = &s.srv;
    let only = srv.starttls == StartTls::Only && !s.tls;
    let mut lines: Vec<String> = vec![srv.server_name.clone()];
    lines.extend(srv.capabilities.iter().cloned());
    if !only {
        let mechs: Vec<&str> = sasl::MECHANISMS
            .iter()
            .filter(|(b, _)| srv.auth_methods & b != 0)
            .map(|(_, n)| *n)
            .collect();
        if !mechs.is_empty() {
            lines.push(format!("AUTH {}", mechs.join(" ")));
        }
    }
    if srv.starttls != StartTls::Off && !s.tls {
        lines.push("STARTTLS".into());
    }
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        out.extend_from_slice(if i + 1 == lines.len() {
            b"250 "
        } else {
            b"250-"
        });
        out.extend_from_slice(l.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Runs the dialogue until the client gives credentials (or its
/// envelope, with `smtp_auth none`) or leaves.
pub async fn dialogue(s: &mut Session, c: &mut Client, greet: bool) -> Next {
    if greet {
        let delay = s.srv.smtp_greeting_delay;
        if !delay.is_zero() {
            // Anything the client sends before the greeting is refused.
            match tokio::time::timeout(delay, c.fill()).await {
                Err(_) => {}
                Ok(Err(_)) => return Next::Quit,
                Ok(Ok(())) => {
                    let ctx = s.ctx(None);
                    s.log(
                        Level::Info,
                        format_args!("client was rejected before greeting{}", ctx),
                    );
                    let _ = c.send(PIPELINING).await;
                    return Next::Quit;
                }
            }
        }
        let g = format!("220 {} ESMTP ready\r\n", s.srv.server_name);
        if !c.send(g.as_bytes()).await {
            return Next::Quit;
        }
    }
    // The SASL exchange under way, if any.
    let mut st: Option<Sasl> = None;
    loop {
        let line = match c.line().await {
            Ok(l) => l,
            Err(e) => return quit_on(s, c, e).await,
        };
        if let Some(waiting) = st.take() {
            match sasl::answer(s, PROMPT, waiting, line.trim_ascii()) {
                Step::Ask(out, next) => {
                    if !c.send(&out).await {
                        return Next::Quit;
                    }
                    st = Some(next);
                }
                Step::Auth(a) => return Next::Auth(a),
                Step::Invalid => {
                    if !invalid(s, c, true).await {
                        return Next::Quit;
                    }
                }
            }
            continue;
        }
        let (cmd, args) = split(&line);
        let only = s.srv.starttls == StartTls::Only && !s.tls;
        let m = s.srv.auth_methods;
        let out: Vec<u8> = match cmd.as_slice() {
            b"HELO" | b"EHLO" => {
                if args.len() != 1 {
                    INVALID_ARG.to_vec()
                } else {
                    s.smtp_helo = args[0].to_vec();
                    s.esmtp = cmd == b"EHLO";
                    if s.esmtp {
                        ehlo(s)
                    } else {
                        format!("250 {}\r\n", s.srv.server_name).into_bytes()
                    }
                }
            }
            b"AUTH" if !only => match args[..] {
                [] => INVALID_ARG.to_vec(),
                [mech, ref initial @ ..] if initial.len() <= 1 => {
                    let initial = initial.first().copied();
                    match sasl::start(s, PROMPT, sasl::ALL, mech, initial) {
                        Step::Ask(out, next) => {
                            st = Some(next);
                            out
                        }
                        Step::Auth(a) => return Next::Auth(a),
                        Step::Invalid => Vec::new(),
                    }
                }
                _ => Vec::new(),
            },
            b"MAIL" if !only => {
                if m & auth::NONE == 0 {
                    let ctx = s.ctx(None);
                    s.log(
                        Level::Info,
                        format_args!(
                            "client was rejected: \"{}\"{}",
                            String::from_utf8_lossy(&line),
                            ctx
                        ),
                    );
                    AUTH_REQUIRED.to_vec()
                } else if args.is_empty() {
                    INVALID_ARG.to_vec()
                } else {
                    s.smtp_from = line.clone();
                    OK.to_vec()
                }
            }
            b"RCPT" if !only => {
                if s.smtp_from.is_empty() {
                    BAD_SEQUENCE.to_vec()
                } else if args.is_empty() {
                    INVALID_ARG.to_vec()
                } else {
                    s.smtp_to = line.clone();
                    return Next::Auth(Auth {
                        method: Method::None,
                        login: Vec::new(),
                        passwd: Vec::new(),
                    });
                }
            }
            b"RSET" => {
                s.smtp_from.clear();
                s.smtp_to.clear();
                OK.to_vec()
            }
            b"NOOP" => OK.to_vec(),
            b"QUIT" => {
                let _ = c.send(BYE).await;
                return Next::Quit;
            }
            b"STARTTLS" if s.srv.starttls != StartTls::Off && !s.tls => {
                if !c.send(STARTTLS).await || !session::starttls(s, c).await {
                    return Next::Quit;
                }
                // A new EHLO is needed after TLS (RFC 3207).
                s.smtp_helo.clear();
                s.esmtp = false;
                continue;
            }
            _ => Vec::new(),
        };
        if out.is_empty() {
            let known = KNOWN.contains(&cmd.as_slice());
            if !invalid(s, c, known).await {
                return Next::Quit;
            }
            continue;
        }
        if !c.send(&out).await {
            return Next::Quit;
        }
    }
}

/// `500 5.5.1 Invalid command`; false when the session ends (max_errors).
async fn invalid(s: &mut Session, c: &mut Client, known: bool) -> bool {
    let quit = s.invalid(known);
    c.send(INVALID).await && !quit
}

async fn quit_on(s: &mut Session, c: &mut Client, e: ReadErr) -> Next {
    if ended(s, e) {
        let _ = c.send(INVALID).await;
    }
    Next::Quit
}
