//! nginx's userid module: identifies clients by a cookie (`userid on|v1`)
//! and exposes `$uid_got`, `$uid_set`; `set $uid_reset 1` (or `log`)
//! issues a new identifier.
//!
//! An identifier is 16 bytes: four 32-bit fields (the server's address or
//! `userid_service`, the time, a per-process start value, a sequence
//! number), big-endian for `on` (nginx's `htonl`) and in the machine's
//! order for `v1`. The cookie is their base64; the variables print each
//! field as 8 hex digits read in the machine's order (little-endian on
//! x86, as nginx prints them there), so a cookie set by nginx is read by
//! tern and the other way round.
//!
//! Flow: the first use in a request (a variable, or the header filter,
//! which runs after `add_header`'s) parses the cookie and decides the
//! identifier to send; the result is kept in [`Ctx::memo`], so `$uid_set`
//! and `Set-Cookie` agree.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;

use crate::config::registry::{self, arg, ctx, num_arg, sec_arg, set_once, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::response::Response;
use crate::http::vars::{Var, VarCtx};

pub const DIRECTIVES: &[Spec] = &[
    spec("userid", Args::take(1), set_userid),
    spec("userid_service", Args::take(1), set_service),
    spec("userid_name", Args::take(1), set_name),
    spec("userid_domain", Args::take(1), set_domain),
    spec("userid_path", Args::take(1), set_path),
    spec("userid_expires", Args::take(1), set_expires),
    spec("userid_p3p", Args::take(1), set_p3p),
    spec("userid_flags", Args::AtLeast(1), set_flags),
    spec("userid_mark", Args::take(1), set_mark),
];

const fn spec(
    name: &'static str,
    args: Args,
    f: fn(&mut LocConf, &Directive, &mut Compiler) -> ConfResult<()>,
) -> Spec {
    Spec {
        name,
        ctx: ctx::HSL,
        args,
        set: Setter::Loc(f),
    }
}

pub const VARS: &[&str] = &["uid_got", "uid_set"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    Off,
    Log,
    V1,
    On,
}

/// `userid_expires`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expires {
    Off,
    Max,
    Secs(u64),
}

const SECURE: u8 = 1;
const HTTPONLY: u8 = 2;
const STRICT: u8 = 4;
const LAX: u8 = 8;
const NONE: u8 = 16;

#[derive(Debug, Clone, Default)]
pub struct UseridLoc {
    pub mode: Option<Mode>,
    pub service: Option<u32>,
    pub name: Option<String>,
    /// `; domain=X`, or empty for `none`.
    pub domain: Option<String>,
    /// `; path=X`.
    pub path: Option<String>,
    pub expires: Option<Expires>,
    /// Empty for `none`.
    pub p3p: Option<String>,
    pub flags: Option<u8>,
    /// `\0` for `off`.
    pub mark: Option<u8>,
}

impl UseridLoc {
    pub fn merge(&mut self, p: &UseridLoc) {
        macro_rules! inherit {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = p.$f.clone(); } )* };
        }
        inherit!(mode, service, name, domain, path, expires, p3p, flags, mark);
    }
    fn mode(&self) -> Mode {
        self.mode.unwrap_or(Mode::Off)
    }
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("uid")
    }
    fn mark(&self) -> u8 {
        self.mark.unwrap_or(0)
    }
}

fn set_userid(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let m = match arg(d, 0) {
        "on" => Mode::On,
        "v1" => Mode::V1,
        "log" => Mode::Log,
        "off" => Mode::Off,
        v => return Err(registry::enum_invalid(d, v)),
    };
    // `$uid_reset` is nginx's changeable variable: known (empty) even
    // where no `set` gives it a value.
    cx.vars.define("uid_reset");
    set_once(&mut l.modules.userid.mode, m, d)
}

fn set_service(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = num_arg(d, 0)?;
    set_once(&mut l.modules.userid.service, n as u32, d)
}

fn set_name(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(&mut l.modules.userid.name, arg(d, 0).to_string(), d)
}

fn set_domain(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = match arg(d, 0) {
        "none" => String::new(),
        v => format!("; domain={}", v),
    };
    set_once(&mut l.modules.userid.domain, v, d)
}

fn set_path(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    set_once(
        &mut l.modules.userid.path,
        format!("; path={}", arg(d, 0)),
        d,
    )
}

fn set_expires(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = match arg(d, 0) {
        "max" => Expires::Max,
        "off" => Expires::Off,
        _ => Expires::Secs(sec_arg(d, 0)?),
    };
    set_once(&mut l.modules.userid.expires, v, d)
}

fn set_p3p(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = match arg(d, 0) {
        "none" => String::new(),
        v => v.to_string(),
    };
    set_once(&mut l.modules.userid.p3p, v, d)
}

fn set_flags(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    if l.modules.userid.flags.is_some() {
        return Err(registry::duplicate(d));
    }
    let mut f = 0;
    for a in &d.args {
        f |= match a.value.as_str() {
            "off" => 0,
            "secure" => SECURE,
            "httponly" => HTTPONLY,
            "samesite=strict" => STRICT,
            "samesite=lax" => LAX,
            "samesite=none" => NONE,
            v => return Err(ConfError::at(format!("invalid value \"{}\"", v), d)),
        };
    }
    l.modules.userid.flags = Some(f);
    Ok(())
}

fn set_mark(l: &mut LocConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = arg(d, 0);
    let m = match v.as_bytes() {
        b"off" => 0,
        [c] if c.is_ascii_alphanumeric() || *c == b'=' => *c,
        _ => {
            return Err(ConfError::at(
                format!(
                    "\"{}\" directive value must be \"off\" or a single letter, digit or \"=\"",
                    d.name
                ),
                d,
            ))
        }
    };
    set_once(&mut l.modules.userid.mark, m, d)
}

/// This request's identifiers, decided once.
#[derive(Debug, Default, Clone)]
struct Uid {
    /// The cookie's value as the client sent it.
    cookie: Vec<u8>,
    /// The identifier from the cookie (only when its last field is not 0).
    got: Option<[u8; 16]>,
    /// The identifier to send (None: no Set-Cookie).
    set: Option<[u8; 16]>,
    /// `$uid_reset` asked for a new identifier.
    reset: bool,
    /// `set` has been decided.
    created: bool,
}

const MEMO: &str = "userid";

/// This request's state: parsed on first use and, with `create`, the
/// identifier to send decided. No borrow of the memo is held while it is
/// computed (`$uid_reset` may be a variable that uses `$uid_got`).
fn state(cx: &Ctx<'_>, create_set: bool) -> Uid {
    let kept = cx
        .memo
        .borrow()
        .iter()
        .find(|(k, _)| *k == MEMO)
        .and_then(|(_, v)| v.downcast_ref::<Uid>().cloned());
    let mut u = match kept {
        Some(u) if u.created || !create_set => return u,
        Some(u) => u,
        None => got(cx),
    };
    if create_set {
        create(cx, &mut u);
    }
    let mut memo = cx.memo.borrow_mut();
    match memo.iter_mut().find(|(k, _)| *k == MEMO) {
        Some((_, v)) => *v = Box::new(u.clone()),
        None => memo.push((MEMO, Box::new(u.clone()))),
    }
    u
}

/// nginx's `ngx_http_userid_get_uid`: the cookie, decoded.
fn got(cx: &Ctx<'_>) -> Uid {
    let conf = &cx.loc.modules.userid;
    let mut u = Uid::default();
    let Some((header, value)) = find_cookie(cx, conf.name().as_bytes()) else {
        return u;
    };
    u.cookie = value.to_vec();
    if value.len() < 22 {
        cx.log(
            Level::Error,
            &format!(
                "client sent too short userid cookie \"{}\"",
                String::from_utf8_lossy(header)
            ),
        );
        return u;
    }
    const ENGINE: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    );
    // Only the first 22 characters: a mark may follow, and many clients
    // carry garbage instead of the "==" trail.
    let src = &value[..22];
    let src = &src[..memchr::memchr(b'=', src).unwrap_or(src.len())];
    match ENGINE.decode(src) {
        Ok(bytes) => {
            let mut id = [0u8; 16];
            let n = bytes.len().min(16);
            id[..n].copy_from_slice(&bytes[..n]);
            if id[12..16] != [0, 0, 0, 0] {
                u.got = Some(id);
            }
        }
        Err(_) => cx.log(
            Level::Error,
            &format!(
                "client sent invalid userid cookie \"{}\"",
                String::from_utf8_lossy(header)
            ),
        ),
    }
    u
}

/// The first cookie called `name` (compared case-insensitively, as
/// nginx's `ngx_http_parse_multi_header_lines`) in the Cookie headers:
/// the header's whole value and the cookie's value.
fn find_cookie<'r>(cx: &Ctx<'r>, name: &[u8]) -> Option<(&'r [u8], &'r [u8])> {
    for h in cx.req.headers().filter(|h| h.is("cookie")) {
        let v = h.value;
        let mut i = 0;
        while i < v.len() {
            let rest = &v[i..];
            if rest.len() >= name.len() && rest[..name.len()].eq_ignore_ascii_case(name) {
                let mut j = i + name.len();
                while j < v.len() && v[j] == b' ' {
                    j += 1;
                }
                if j < v.len() && v[j] == b'=' {
                    j += 1;
                    while j < v.len() && v[j] == b' ' {
                        j += 1;
                    }
                    let end = v[j..]
                        .iter()
                        .position(|&c| c == b';' || c == b',')
                        .map_or(v.len(), |p| j + p);
                    return Some((v, &v[j..end]));
                }
            }
            // Skip to the next cookie.
            while i < v.len() {
                let c = v[i];
                i += 1;
                if c == b';' || c == b',' {
                    break;
                }
            }
            while i < v.len() && v[i] == b' ' {
                i += 1;
            }
        }
    }
    None
}

/// The per-process start value (nginx's per-worker one: the current
/// microseconds / 20 in the high half, the pid in the low) and sequence
/// numbers; tern's workers are threads, so one process-wide counter keeps
/// identifiers unique across them.
fn start_value() -> u32 {
    static START: OnceLock<u32> = OnceLock::new();
    *START.get_or_init(|| {
        let usec = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_micros());
        ((usec / 20) << 16) | std::process::id()
    })
}

static SEQ_V1: AtomicU32 = AtomicU32::new(1);
static SEQ_V2: AtomicU32 = AtomicU32::new(0x0303_0302);

/// nginx's `ngx_http_userid_create_uid`.
fn create(cx: &Ctx<'_>, u: &mut Uid) {
    if u.created {
        return;
    }
    u.created = true;
    let conf = &cx.loc.modules.userid;
    if let Some(got) = u.got {
        let reset = reset_value(cx);
        if reset.is_empty() || reset == b"0" {
            let mark = conf.mark();
            if mark == 0 || (u.cookie.len() > 23 && u.cookie[22] == mark && u.cookie[23] == b'=') {
                return;
            }
            u.set = Some(got);
            return;
        }
        u.reset = true;
        if reset == b"log" {
            cx.log(
                Level::Notice,
                &format!("userid cookie \"{}={}\" was reset", conf.name(), hex(&got)),
            );
        }
    }
    let now = crate::http::date::now_secs() as u32;
    let mut id = [0u8; 16];
    if conf.mode() == Mode::V1 {
        id[0..4].copy_from_slice(&conf.service.unwrap_or(0).to_ne_bytes());
        id[4..8].copy_from_slice(&now.to_ne_bytes());
        id[8..12].copy_from_slice(&start_value().to_ne_bytes());
        let seq = SEQ_V1.fetch_add(0x100, Ordering::Relaxed);
        id[12..16].copy_from_slice(&seq.to_ne_bytes());
    } else {
        let service = match conf.service {
            Some(s) => s.to_be_bytes(),
            None => match cx.conn.local {
                Some(std::net::SocketAddr::V4(a)) => a.ip().octets(),
                Some(std::net::SocketAddr::V6(a)) => {
                    let o = a.ip().octets();
                    [o[12], o[13], o[14], o[15]]
                }
                None => [0; 4],
            },
        };
        id[0..4].copy_from_slice(&service);
        id[4..8].copy_from_slice(&now.to_be_bytes());
        id[8..12].copy_from_slice(&start_value().to_be_bytes());
        let seq = SEQ_V2
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some(s.wrapping_add(0x100).max(0x0303_0302))
            })
            .unwrap_or(0x0303_0302);
        id[12..16].copy_from_slice(&seq.to_be_bytes());
    }
    u.set = Some(id);
}

/// `$uid_reset`, which `set` may give a value.
fn reset_value(cx: &Ctx<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(v @ Var::User(_)) = cx.http.main.vars.lookup("uid_reset") {
        cx.var(&v, &mut out);
    }
    out
}

/// The four fields as nginx's `%08XD` prints them: each read in the
/// machine's byte order.
fn hex(id: &[u8; 16]) -> String {
    id.chunks_exact(4)
        .map(|c| format!("{:08X}", u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
        .collect()
}

pub fn var(cx: &Ctx<'_>, id: u8, out: &mut Vec<u8>) -> bool {
    let conf = &cx.loc.modules.userid;
    let mode = conf.mode();
    let uid = match id {
        0 if mode != Mode::Off => state(cx, false).got,
        1 if mode >= Mode::V1 => state(cx, true).set,
        _ => None,
    };
    match uid {
        Some(uid) => {
            out.extend_from_slice(conf.name().as_bytes());
            out.push(b'=');
            out.extend_from_slice(hex(&uid).as_bytes());
            true
        }
        None => false,
    }
}

/// After `add_header`'s filter, as in nginx: `Set-Cookie` (and `P3P`)
/// when there is an identifier to send.
pub fn header_filter(cx: &mut Ctx<'_>, resp: &mut Response) {
    let conf = &cx.loc.modules.userid;
    if conf.mode() < Mode::V1 {
        return;
    }
    let u = state(cx, true);
    let Some(id) = u.set else {
        return;
    };
    let fresh = u.got.is_none() || u.reset;
    let cookie = u.cookie;
    let mut v = conf.name().as_bytes().to_vec();
    v.push(b'=');
    let mark = conf.mark();
    if fresh {
        let mut b = base64::engine::general_purpose::STANDARD
            .encode(id)
            .into_bytes();
        if mark != 0 {
            let n = b.len();
            b[n - 2] = mark;
        }
        v.extend_from_slice(&b);
    } else {
        v.extend_from_slice(&cookie[..22.min(cookie.len())]);
        v.push(mark);
        v.push(b'=');
    }
    match conf.expires.unwrap_or(Expires::Off) {
        Expires::Off => {}
        Expires::Max => v.extend_from_slice(b"; expires=Thu, 31-Dec-37 23:55:55 GMT"),
        Expires::Secs(s) => {
            v.extend_from_slice(b"; expires=");
            v.extend_from_slice(&cookie_time(crate::http::date::now_secs() + s as i64));
        }
    }
    v.extend_from_slice(conf.domain.as_deref().unwrap_or("").as_bytes());
    v.extend_from_slice(conf.path.as_deref().unwrap_or("; path=/").as_bytes());
    let flags = conf.flags.unwrap_or(0);
    for (bit, text) in [
        (SECURE, "; secure"),
        (HTTPONLY, "; httponly"),
        (STRICT, "; samesite=strict"),
        (LAX, "; samesite=lax"),
        (NONE, "; samesite=none"),
    ] {
        if flags & bit != 0 {
            v.extend_from_slice(text.as_bytes());
        }
    }
    resp.headers.push(("Set-Cookie".into(), v));
    if let Some(p3p) = conf.p3p.as_deref().filter(|p| !p.is_empty()) {
        resp.headers.push(("P3P".into(), p3p.as_bytes().to_vec()));
    }
}

/// nginx's cookie time: `Thu, 31-Dec-37 23:55:55 GMT`, the year in two
/// digits up to 2037 and in full after.
fn cookie_time(t: i64) -> Vec<u8> {
    // From the HTTP date `Thu, 31 Dec 2037 23:55:55 GMT`.
    let d = crate::http::date::http_date_of(t);
    let s = String::from_utf8_lossy(&d).into_owned();
    let (wday, rest) = s.split_at(5);
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, mon, year, time, ..] = parts.as_slice() else {
        return d.to_vec();
    };
    let y: i64 = year.parse().unwrap_or(0);
    let year = if y > 2037 {
        year.to_string()
    } else {
        format!("{:02}", y % 100)
    };
    format!("{}{}-{}-{} {} GMT", wday, day, mon, year, time).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_times() {
        assert_eq!(
            cookie_time(2145916555),
            b"Thu, 31-Dec-37 23:55:55 GMT".to_vec()
        );
        assert_eq!(cookie_time(0), b"Thu, 01-Jan-70 00:00:00 GMT".to_vec());
        assert_eq!(
            cookie_time(4102444800),
            b"Fri, 01-Jan-2100 00:00:00 GMT".to_vec()
        );
    }
}
