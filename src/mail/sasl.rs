//! The SASL exchanges the three mail protocols share: `AUTH` (POP3,
//! SMTP) and `AUTHENTICATE` (IMAP) with `PLAIN`, `LOGIN`, `CRAM-MD5` and
//! `EXTERNAL`, an initial response or not.
//!
//! A protocol's dialogue hands over the mechanism and the initial
//! response ([`start`]), then each continuation line ([`answer`]); a
//! [`Step`] says what to send and which line comes next, or gives the
//! credentials, or says the command is invalid (the protocol answers
//! that in its own words and counts it). What differs between the
//! protocols is passed in: the prompt's prefix (`+ ` or `334 `) and
//! which mechanisms must be enabled by the protocol's `*_auth`.

use crate::mail::conf::auth;
use crate::mail::session::{self, Auth, Method, Session};

/// Every mechanism, with its bit and its name (as CAPA, EHLO and
/// CAPABILITY list them, in this order).
pub const MECHANISMS: &[(u32, &str)] = &[
    (auth::PLAIN, "PLAIN"),
    (auth::LOGIN, "LOGIN"),
    (auth::CRAM_MD5, "CRAM-MD5"),
    (auth::EXTERNAL, "EXTERNAL"),
];

/// All four mechanisms: POP3 and SMTP take a mechanism only when its
/// `*_auth` bit is set.
pub const ALL: u32 = auth::PLAIN | auth::LOGIN | auth::CRAM_MD5 | auth::EXTERNAL;

/// The continuation line a SASL exchange waits for.
#[derive(Debug)]
pub enum Sasl {
    /// AUTH LOGIN: the user name.
    LoginUsername,
    /// AUTH LOGIN: the password of this user.
    LoginPassword(Vec<u8>),
    Plain,
    Cram,
    External,
}

/// What a command or a continuation line leads to.
#[derive(Debug)]
pub enum Step {
    /// Send this prompt; the next line answers it.
    Ask(Vec<u8>, Sasl),
    /// The credentials, for auth_http.
    Auth(Auth),
    /// An invalid command (a known one: it does not count toward
    /// `max_errors`).
    Invalid,
}

fn prompt(prefix: &str, text: &str) -> Vec<u8> {
    format!("{}{}\r\n", prefix, text).into_bytes()
}

fn username(prefix: &str) -> Vec<u8> {
    // base64("Username:")
    prompt(prefix, "VXNlcm5hbWU6")
}

fn password(prefix: &str) -> Vec<u8> {
    // base64("Password:")
    prompt(prefix, "UGFzc3dvcmQ6")
}

fn external(login: Vec<u8>) -> Auth {
    Auth {
        method: Method::External,
        login,
        passwd: Vec::new(),
    }
}

/// `AUTH MECH [initial]` (IMAP: `AUTHENTICATE`): `prefix` is the
/// protocol's prompt prefix, `gated` the mechanisms that need their bit
/// in the server's methods (nginx's IMAP takes LOGIN and PLAIN always).
pub fn start(
    s: &mut Session,
    prefix: &str,
    gated: u32,
    mech: &[u8],
    initial: Option<&[u8]>,
) -> Step {
    let mech = mech.to_ascii_uppercase();
    let Some(&(bit, _)) = MECHANISMS.iter().find(|(_, n)| n.as_bytes() == mech) else {
        return Step::Invalid;
    };
    if gated & bit != 0 && s.srv.auth_methods & bit == 0 {
        return Step::Invalid;
    }
    let st = match bit {
        auth::LOGIN => Sasl::LoginUsername,
        auth::PLAIN => Sasl::Plain,
        auth::CRAM_MD5 => Sasl::Cram,
        _ => Sasl::External,
    };
    match (st, initial) {
        // CRAM-MD5 has no initial response.
        (Sasl::Cram, Some(_)) => Step::Invalid,
        // An initial response is the answer to the first prompt.
        (st, Some(i)) => answer(s, prefix, st, i),
        (Sasl::Plain, None) => Step::Ask(prompt(prefix, ""), Sasl::Plain),
        (Sasl::Cram, None) => Step::Ask(s.cram_challenge(prefix), Sasl::Cram),
        (st, None) => Step::Ask(username(prefix), st),
    }
}

/// A continuation line (`arg`, trimmed) in state `st`.
pub fn answer(s: &mut Session, prefix: &str, st: Sasl, arg: &[u8]) -> Step {
    let got = match st {
        Sasl::LoginUsername => {
            return match session::decode(s, arg, "AUTH LOGIN") {
                Some(u) => Step::Ask(password(prefix), Sasl::LoginPassword(u)),
                None => Step::Invalid,
            }
        }
        Sasl::LoginPassword(u) => session::decode(s, arg, "AUTH LOGIN").map(|p| Auth {
            method: Method::Login,
            login: u,
            passwd: p,
        }),
        Sasl::Plain => session::sasl_plain(s, arg),
        Sasl::Cram => session::sasl_cram(s, arg),
        Sasl::External => session::decode(s, arg, "AUTH EXTERNAL").map(external),
    };
    got.map_or(Step::Invalid, Step::Auth)
}
