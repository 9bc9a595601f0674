//! The IMAP dialogue before the login (nginx's ngx_mail_imap_module):
//! `LOGIN`, `AUTHENTICATE PLAIN|LOGIN|CRAM-MD5|EXTERNAL`, `CAPABILITY`,
//! `STARTTLS`, `NOOP`, `LOGOUT`. Arguments are atoms, quoted strings
//! (backslash escapes) or literals (`{n}` answered with `+ OK`, `{n+}`
//! without); a command is read whole, literals included, before it is
//! judged, so a literal of an invalid command is never taken as one.

use crate::mail::conf::{auth, StartTls};
use crate::mail::pop3::ended;
use crate::mail::sasl::{self, Sasl, Step};
use crate::mail::session::{self, Auth, Client, Method, Next, ReadErr, Session};

const GREETING: &[u8] = b"* OK IMAP4 ready\r\n";
/// The tag of an answer to a line without one.
const UNTAGGED: &[u8] = b"*";
/// The prefix of SASL prompts.
const PROMPT: &str = "+ ";
/// nginx's IMAP takes AUTHENTICATE LOGIN and PLAIN whatever `imap_auth`
/// says; CRAM-MD5 and EXTERNAL only when enabled.
const GATED: u32 = auth::CRAM_MD5 | auth::EXTERNAL;

/// The commands nginx's IMAP parser knows (others count toward max_errors).
const KNOWN: &[&[u8]] = &[
    b"LOGIN",
    b"LOGOUT",
    b"CAPABILITY",
    b"NOOP",
    b"STARTTLS",
    b"AUTHENTICATE",
];

fn capability(s: &Session) -> Vec<u8> {
    let srv = &s.srv;
    let mut out = b"* CAPABILITY".to_vec();
    for c in &srv.capabilities {
        out.push(b' ');
        out.extend_from_slice(c.as_bytes());
    }
    let only = srv.starttls == StartTls::Only && !s.tls;
    if !only {
        for (bit, name) in sasl::MECHANISMS {
            if srv.auth_methods & bit != 0 {
                out.extend_from_slice(b" AUTH=");
                out.extend_from_slice(name.as_bytes());
            }
        }
    }
    if srv.starttls != StartTls::Off && !s.tls {
        out.extend_from_slice(b" STARTTLS");
    }
    if only {
        out.extend_from_slice(b" LOGINDISABLED");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The length of a line's IMAP tag, as nginx's parser takes it: up to 32
/// of `A-Z a-z 0-9 - . _` followed by a space (an empty tag too: nginx
/// answers ` OK completed`); None when the line has no such tag (a quoted
/// string, a literal, a CR or an LF is no tag, so a tag echoed in an
/// answer can never break its line).
fn tag_len(line: &[u8]) -> Option<usize> {
    let n = line.iter().position(|&b| b == b' ')?;
    (n <= 32
        && line[..n]
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')))
    .then_some(n)
}

/// A command as read: its words, literals and quoted strings decoded;
/// Err(None) for a syntax error (the command is skipped).
async fn command(c: &mut Client) -> Result<Option<Vec<Vec<u8>>>, ReadErr> {
    let mut toks: Vec<Vec<u8>> = Vec::new();
    let mut line = c.line().await?;
    let Some(n) = tag_len(&line) else {
        // nginx's parser stops at the tag: the line is one invalid
        // command, answered with `*` (no tag), and nothing of it (a
        // literal) is read on. An empty list is that answer.
        return Ok(Some(Vec::new()));
    };
    // The tag is the first word, whatever follows (an empty one too).
    toks.push(line[..n].to_vec());
    line.drain(..=n);
    let mut bad = false;
    loop {
        let mut i = 0;
        let mut literal = None;
        while i < line.len() {
            match line[i] {
                b' ' => i += 1,
                b'"' => {
                    let mut t = Vec::new();
                    i += 1;
                    let mut closed = false;
                    while i < line.len() {
                        match line[i] {
                            b'\\' if i + 1 < line.len() => {
                                t.push(line[i + 1]);
                                i += 2;
                            }
                            b'"' => {
                                closed = true;
                                i += 1;
                                break;
                            }
                            b => {
                                t.push(b);
                                i += 1;
                            }
                        }
                    }
                    bad |= !closed;
                    toks.push(t);
                }
                _ => {
                    let start = i;
                    while i < line.len() && line[i] != b' ' {
                        i += 1;
                    }
                    let w = &line[start..i];
                    if i == line.len() && w.len() > 2 && w[0] == b'{' && w.ends_with(b"}") {
                        let inner = &w[1..w.len() - 1];
                        let (num, sync) = match inner.strip_suffix(b"+") {
                            Some(n) => (n, false),
                            None => (inner, true),
                        };
                        match std::str::from_utf8(num)
                            .ok()
                            .and_then(|n| n.parse::<usize>().ok())
                        {
                            Some(n) => literal = Some((n, sync)),
                            None => {
                                bad = true;
                                toks.push(w.to_vec());
                            }
                        }
                    } else {
                        toks.push(w.to_vec());
                    }
                }
            }
        }
        let Some((n, sync)) = literal else {
            break;
        };
        if n > c.limit {
            return Err(ReadErr::TooLong);
        }
        if sync && !bad && !c.send(b"+ OK\r\n").await {
            return Err(ReadErr::Closed);
        }
        while c.buf.len() < n {
            c.fill().await?;
        }
        toks.push(c.buf.drain(..n).collect());
        line = c.line().await?;
    }
    Ok((!bad).then_some(toks))
}

/// Runs the dialogue until the client gives credentials or leaves.
pub async fn dialogue(s: &mut Session, c: &mut Client, greet: bool) -> Next {
    if greet {
        // Answers before any tagged line are untagged.
        s.tag = UNTAGGED.to_vec();
        if !c.send(GREETING).await {
            return Next::Quit;
        }
    }
    // The SASL exchange under way, if any.
    let mut st: Option<Sasl> = None;
    loop {
        if let Some(waiting) = st.take() {
            // A SASL continuation line: one base64 word, no tag.
            let line = match c.line().await {
                Ok(l) => l,
                Err(e) => return quit_on(s, c, e).await,
            };
            match sasl::answer(s, PROMPT, waiting, line.trim_ascii()) {
                Step::Ask(out, next) => {
                    if !c.send(&out).await {
                        return Next::Quit;
                    }
                    st = Some(next);
                }
                Step::Auth(a) => return Next::Auth(a),
                Step::Invalid => {
                    if !bad(s, c, true).await {
                        return Next::Quit;
                    }
                }
            }
            continue;
        }
        let toks = match command(c).await {
            Ok(t) => t,
            Err(e) => return quit_on(s, c, e).await,
        };
        let Some(toks) = toks else {
            if !bad(s, c, false).await {
                return Next::Quit;
            }
            continue;
        };
        let Some(tag) = toks.first() else {
            // An empty line, or one without a valid tag.
            s.tag = UNTAGGED.to_vec();
            if !bad(s, c, false).await {
                return Next::Quit;
            }
            continue;
        };
        s.tag = tag.clone();
        let cmd = toks
            .get(1)
            .map(|c| c.to_ascii_uppercase())
            .unwrap_or_default();
        let args = toks.get(2..).unwrap_or_default();
        let only = s.srv.starttls == StartTls::Only && !s.tls;
        let ok = |s: &Session| {
            let mut v = s.tag.clone();
            v.extend_from_slice(b" OK completed\r\n");
            v
        };
        let out = match (cmd.as_slice(), args.len()) {
            (b"LOGIN", 2) if !only => {
                return Next::Auth(Auth {
                    method: Method::Plain,
                    login: args[0].clone(),
                    passwd: args[1].clone(),
                })
            }
            (b"AUTHENTICATE", 1..=2) if !only => {
                let initial = args.get(1).map(|a| a.as_slice());
                match sasl::start(s, PROMPT, GATED, &args[0], initial) {
                    Step::Ask(out, next) => {
                        st = Some(next);
                        out
                    }
                    Step::Auth(a) => return Next::Auth(a),
                    Step::Invalid => Vec::new(),
                }
            }
            // nginx ignores the arguments of these four.
            (b"CAPABILITY", _) => {
                let mut v = capability(s);
                v.extend_from_slice(&ok(s));
                v
            }
            (b"NOOP", _) => ok(s),
            (b"LOGOUT", _) => {
                let mut v = b"* BYE\r\n".to_vec();
                v.extend_from_slice(&ok(s));
                let _ = c.send(&v).await;
                return Next::Quit;
            }
            (b"STARTTLS", _) if s.srv.starttls != StartTls::Off && !s.tls => {
                let v = ok(s);
                if !c.send(&v).await || !session::starttls(s, c).await {
                    return Next::Quit;
                }
                continue;
            }
            _ => Vec::new(),
        };
        if out.is_empty() {
            let known = KNOWN.contains(&cmd.as_slice());
            if !bad(s, c, known).await {
                return Next::Quit;
            }
            continue;
        }
        if !c.send(&out).await {
            return Next::Quit;
        }
    }
}

/// `TAG BAD invalid command` (the tag of the line answered, an empty one
/// too, or `*`); false when the session ends (max_errors).
async fn bad(s: &mut Session, c: &mut Client, known: bool) -> bool {
    let quit = s.invalid(known);
    let mut v = s.tag.clone();
    v.extend_from_slice(b" BAD invalid command\r\n");
    c.send(&v).await && !quit
}

async fn quit_on(s: &mut Session, c: &mut Client, e: ReadErr) -> Next {
    if ended(s, e) {
        let _ = bad(s, c, false).await;
    }
    Next::Quit
}
