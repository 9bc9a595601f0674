//! The POP3 dialogue before the login (nginx's ngx_mail_pop3_module):
//! `USER`/`PASS`, `APOP`, `AUTH PLAIN|LOGIN|CRAM-MD5|EXTERNAL`, `CAPA`,
//! `STLS`, `NOOP`, `QUIT`; any other command is `-ERR invalid command`.

use crate::core::log::Level;
use crate::mail::conf::{auth, StartTls};
use crate::mail::sasl::{self, Sasl, Step};
use crate::mail::session::{self, Auth, Client, Method, Next, ReadErr, Session};

const OK: &[u8] = b"+OK\r\n";
const INVALID: &[u8] = b"-ERR invalid command\r\n";
/// The prefix of SASL prompts.
const PROMPT: &str = "+ ";

/// The commands nginx's POP3 parser knows: only others count as errors
/// toward `max_errors`.
const KNOWN: &[&[u8]] = &[
    b"USER", b"PASS", b"APOP", b"QUIT", b"CAPA", b"AUTH", b"NOOP", b"STLS",
];

/// The `CAPA` answer: the capabilities, STLS when offered, the SASL
/// mechanisms; with `starttls only` before TLS, no USER and no SASL.
fn capa(s: &Session) -> Vec<u8> {
    let srv = &s.srv;
    let stls = srv.starttls != StartTls::Off && !s.tls;
    let only = srv.starttls == StartTls::Only && !s.tls;
    let mut out = b"+OK Capability list follows\r\n".to_vec();
    for c in &srv.capabilities {
        if only && c.eq_ignore_ascii_case("USER") {
            continue;
        }
        out.extend_from_slice(c.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if stls {
        out.extend_from_slice(b"STLS\r\n");
    }
    if !only {
        out.extend_from_slice(b"SASL");
        for (bit, name) in sasl::MECHANISMS {
            if srv.auth_methods & bit != 0 {
                out.push(b' ');
                out.extend_from_slice(name.as_bytes());
            }
        }
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

/// The `AUTH` answer without arguments: the mechanisms, one a line.
fn auth_list(s: &Session) -> Vec<u8> {
    let mut out = b"+OK methods supported:\r\n".to_vec();
    for (bit, name) in sasl::MECHANISMS {
        if s.srv.auth_methods & bit != 0 {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b".\r\n");
    out
}

/// Where the dialogue is.
enum State {
    Start,
    /// After USER: the login.
    User(Vec<u8>),
    /// A SASL exchange waits for its next line.
    Sasl(Sasl),
}

/// Splits a command line into the upper-cased command and its arguments.
pub fn split(line: &[u8]) -> (Vec<u8>, Vec<&[u8]>) {
    let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
    let cmd = words.next().unwrap_or_default().to_ascii_uppercase();
    (cmd, words.collect())
}

/// Runs the dialogue until the client gives credentials or leaves.
pub async fn dialogue(s: &mut Session, c: &mut Client, greet: bool) -> Next {
    if greet {
        let mut g = b"+OK POP3 ready".to_vec();
        if s.srv.auth_methods & (auth::APOP | auth::CRAM_MD5) != 0 {
            g.push(b' ');
            g.extend_from_slice(&s.salt());
        } else {
            g.extend_from_slice(b"\r\n");
        }
        if !c.send(&g).await {
            return Next::Quit;
        }
    }
    let mut st = State::Start;
    loop {
        let mut known = true;
        let line = match c.line().await {
            Ok(l) => l,
            Err(e) => {
                let quit = ended(s, e);
                if quit {
                    let _ = c.send(INVALID).await;
                }
                return Next::Quit;
            }
        };
        let (out, next): (Vec<u8>, State) = match std::mem::replace(&mut st, State::Start) {
            State::Sasl(waiting) => match sasl::answer(s, PROMPT, waiting, line.trim_ascii()) {
                Step::Ask(o, n) => (o, State::Sasl(n)),
                Step::Auth(a) => return Next::Auth(a),
                Step::Invalid => (Vec::new(), State::Start),
            },
            State::User(login) => {
                let (cmd, args) = split(&line);
                known = KNOWN.contains(&cmd.as_slice());
                match cmd.as_slice() {
                    b"PASS" if args.len() == 1 => {
                        return Next::Auth(Auth {
                            method: Method::Plain,
                            login,
                            passwd: args[0].to_vec(),
                        })
                    }
                    b"CAPA" if args.is_empty() => (capa(s), State::User(login)),
                    b"NOOP" if args.is_empty() => (OK.to_vec(), State::User(login)),
                    b"QUIT" if args.is_empty() => {
                        let _ = c.send(OK).await;
                        return Next::Quit;
                    }
                    _ => (Vec::new(), State::Start),
                }
            }
            State::Start => {
                let (cmd, args) = split(&line);
                known = KNOWN.contains(&cmd.as_slice());
                let only = s.srv.starttls == StartTls::Only && !s.tls;
                match cmd.as_slice() {
                    b"USER" if args.len() == 1 && !only => {
                        (OK.to_vec(), State::User(args[0].to_vec()))
                    }
                    b"APOP" if args.len() == 2 && s.srv.auth_methods & auth::APOP != 0 && !only => {
                        return Next::Auth(Auth {
                            method: Method::Apop,
                            login: args[0].to_vec(),
                            passwd: args[1].to_vec(),
                        });
                    }
                    b"AUTH" if !only => match args[..] {
                        [] => (auth_list(s), State::Start),
                        [mech, ref initial @ ..] if initial.len() <= 1 => {
                            let initial = initial.first().copied();
                            match sasl::start(s, PROMPT, sasl::ALL, mech, initial) {
                                Step::Ask(o, n) => (o, State::Sasl(n)),
                                Step::Auth(a) => return Next::Auth(a),
                                Step::Invalid => (Vec::new(), State::Start),
                            }
                        }
                        _ => (Vec::new(), State::Start),
                    },
                    b"CAPA" if args.is_empty() => (capa(s), State::Start),
                    b"NOOP" if args.is_empty() => (OK.to_vec(), State::Start),
                    b"QUIT" if args.is_empty() => {
                        let _ = c.send(OK).await;
                        return Next::Quit;
                    }
                    b"STLS" if args.is_empty() && s.srv.starttls != StartTls::Off && !s.tls => {
                        if !c.send(OK).await {
                            return Next::Quit;
                        }
                        if !session::starttls(s, c).await {
                            return Next::Quit;
                        }
                        continue;
                    }
                    _ => (Vec::new(), State::Start),
                }
            }
        };
        if out.is_empty() {
            // An invalid command.
            let quit = s.invalid(known);
            if !c.send(INVALID).await || quit {
                return Next::Quit;
            }
            st = State::Start;
            continue;
        }
        if !c.send(&out).await {
            return Next::Quit;
        }
        st = next;
    }
}

/// Logs why reading stopped; true when the client gets the protocol's
/// error (a too long command) before the close.
pub fn ended(s: &Session, e: ReadErr) -> bool {
    let c = s.ctx(None);
    match e {
        ReadErr::Closed => {
            s.log(Level::Info, format_args!("client closed connection{}", c));
            false
        }
        ReadErr::TimedOut => {
            s.log(
                Level::Info,
                format_args!("client timed out (110: Connection timed out){}", c),
            );
            false
        }
        ReadErr::TooLong => {
            s.log(
                Level::Info,
                format_args!("client sent too long command{}", c),
            );
            true
        }
    }
}
