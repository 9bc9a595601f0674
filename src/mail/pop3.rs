//! The POP3 dialogue before the login (nginx's ngx_mail_pop3_module):
//! `USER`/`PASS`, `APOP`, `AUTH PLAIN|LOGIN|CRAM-MD5|EXTERNAL`, `CAPA`,
//! `STLS`, `NOOP`, `QUIT`; any other command is `-ERR invalid command`.

use crate::core::log::Level;
use crate::mail::conf::{auth, StartTls};
use crate::mail::session::{self, Auth, Client, Method, Next, ReadErr, Session};

const OK: &[u8] = b"+OK\r\n";
const INVALID: &[u8] = b"-ERR invalid command\r\n";
const NEXT: &[u8] = b"+ \r\n";
const USERNAME: &[u8] = b"+ VXNlcm5hbWU6\r\n";
const PASSWORD: &[u8] = b"+ UGFzc3dvcmQ6\r\n";

/// The commands nginx's POP3 parser knows: only others count as errors
/// toward `max_errors`.
const KNOWN: &[&[u8]] = &[
    b"USER", b"PASS", b"APOP", b"QUIT", b"CAPA", b"AUTH", b"NOOP", b"STLS",
];

/// The SASL mechanisms POP3 names, with their bits.
const SASL: &[(u32, &str)] = &[
    (auth::PLAIN, "PLAIN"),
    (auth::LOGIN, "LOGIN"),
    (auth::CRAM_MD5, "CRAM-MD5"),
    (auth::EXTERNAL, "EXTERNAL"),
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
        for (bit, name) in SASL {
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
    for (bit, name) in SASL {
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
    LoginUsername,
    LoginPassword(Vec<u8>),
    Plain,
    Cram,
    External,
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
            State::LoginUsername => match session::decode(s, line.trim_ascii(), "AUTH LOGIN") {
                Some(u) => (PASSWORD.to_vec(), State::LoginPassword(u)),
                None => (Vec::new(), State::Start),
            },
            State::LoginPassword(u) => match session::decode(s, line.trim_ascii(), "AUTH LOGIN") {
                Some(p) => {
                    return Next::Auth(Auth {
                        method: Method::Login,
                        login: u,
                        passwd: p,
                    })
                }
                None => (Vec::new(), State::Start),
            },
            State::Plain => match session::sasl_plain(s, line.trim_ascii()) {
                Some(a) => return Next::Auth(a),
                None => (Vec::new(), State::Start),
            },
            State::Cram => match session::sasl_cram(s, line.trim_ascii()) {
                Some(a) => return Next::Auth(a),
                None => (Vec::new(), State::Start),
            },
            State::External => match session::decode(s, line.trim_ascii(), "AUTH EXTERNAL") {
                Some(l) => {
                    return Next::Auth(Auth {
                        method: Method::External,
                        login: l,
                        passwd: Vec::new(),
                    })
                }
                None => (Vec::new(), State::Start),
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
                    b"AUTH" if !only => match auth_cmd(s, &args) {
                        Step::Send(o, n) => (o, n),
                        Step::Auth(a) => return Next::Auth(a),
                        Step::Invalid => (Vec::new(), State::Start),
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

/// What an `AUTH` command leads to.
pub enum Step<S> {
    Send(Vec<u8>, S),
    Auth(Auth),
    Invalid,
}

/// `AUTH MECH [initial]`.
fn auth_cmd(s: &mut Session, args: &[&[u8]]) -> Step<State> {
    if args.is_empty() {
        return Step::Send(auth_list(s), State::Start);
    }
    let mech = args[0].to_ascii_uppercase();
    let m = s.srv.auth_methods;
    let r = match (mech.as_slice(), args.len()) {
        (b"LOGIN", 1) if m & auth::LOGIN != 0 => {
            Step::Send(USERNAME.to_vec(), State::LoginUsername)
        }
        (b"LOGIN", 2) if m & auth::LOGIN != 0 => match session::decode(s, args[1], "AUTH LOGIN") {
            Some(u) => Step::Send(PASSWORD.to_vec(), State::LoginPassword(u)),
            None => Step::Invalid,
        },
        (b"PLAIN", 1) if m & auth::PLAIN != 0 => Step::Send(NEXT.to_vec(), State::Plain),
        (b"PLAIN", 2) if m & auth::PLAIN != 0 => match session::sasl_plain(s, args[1]) {
            Some(a) => Step::Auth(a),
            None => Step::Invalid,
        },
        (b"CRAM-MD5", 1) if m & auth::CRAM_MD5 != 0 => {
            Step::Send(s.cram_challenge("+ "), State::Cram)
        }
        (b"EXTERNAL", 1) if m & auth::EXTERNAL != 0 => {
            Step::Send(USERNAME.to_vec(), State::External)
        }
        (b"EXTERNAL", 2) if m & auth::EXTERNAL != 0 => {
            match session::decode(s, args[1], "AUTH EXTERNAL") {
                Some(l) => Step::Auth(Auth {
                    method: Method::External,
                    login: l,
                    passwd: Vec::new(),
                }),
                None => Step::Invalid,
            }
        }
        _ => Step::Invalid,
    };
    r
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
