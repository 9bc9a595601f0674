//! `auth_basic` and `auth_basic_user_file`: HTTP Basic authentication
//! against an htpasswd-style file, and the `$remote_user` variable.
//!
//! Data flow, as nginx's `ngx_http_auth_basic_module`: in the access phase,
//! after `allow`/`deny` ([`super::access::phase`] combines both under
//! `satisfy`), [`check`] renders the realm (`off`, also from a variable,
//! turns the check off), decodes `Authorization: Basic` ([`credentials`]),
//! renders the file name (relative names are relative to the directory of
//! the main configuration file, as nginx's `conf_prefix`), and reads the
//! file on every request through the file-I/O layer (`io::open`,
//! `io::read`: never `std::fs` on the worker), scanning it as nginx does
//! ([`Scan`]: `user:password[:anything]` lines, `#` comments). The password
//! field is checked by computing what it would be for the given password
//! ([`crypt`]) and comparing, as nginx's `ngx_crypt` + `strcmp`.
//!
//! Failures answer as nginx: no or unusable credentials, an unknown user or
//! a wrong password give 401 with `WWW-Authenticate: Basic realm="..."`
//! (and nginx's error-log line); a missing file gives 403, any other open
//! or read failure 500.
//!
//! The crypt() formats (DES, `$1$`, `$apr1$`, `$5$`, `$6$`, `$2a$`/`$2b$`/
//! `$2y$`, `$sha1$`, `_` BSDi) come from the `crypt3_rs` crate; `{PLAIN}`,
//! `{SHA}` and `{SSHA}` are nginx's own schemes, built on `sha1` and
//! `base64`. The deliberately slow ones (bcrypt, SHA-crypt, which cost
//! milliseconds of CPU or more) run on a thread pool (the location's
//! `aio threads` pool, else `default`), so a login never stalls the other
//! connections of a worker; nginx computes them inline.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use sha1::{Digest, Sha1};

use super::access::Verdict;
use crate::config::registry::{arg, ctx, duplicate, Args, Setter, Spec};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::http::conf::LocConf;
use crate::http::phases::Ctx;
use crate::http::request::Request;
use crate::http::response::Response;
use crate::http::vars::{Part, Template};

pub const DIRECTIVES: &[Spec] = &[
    Spec {
        name: "auth_basic",
        ctx: ctx::HSL | ctx::LMT,
        args: Args::take(1),
        set: Setter::Loc(set_realm),
    },
    Spec {
        name: "auth_basic_user_file",
        ctx: ctx::HSL | ctx::LMT,
        args: Args::take(1),
        set: Setter::Loc(set_user_file),
    },
];

/// The module's variables.
pub const VARS: &[&str] = &["remote_user"];

#[derive(Debug, Clone, Default)]
pub struct AuthBasicLoc {
    /// `auth_basic`: the realm; its value `off` turns the check off.
    realm: Option<Template>,
    /// `auth_basic_user_file`.
    user_file: Option<UserFile>,
}

impl AuthBasicLoc {
    /// Whether [`check`] has anything to check here.
    pub fn configured(&self) -> bool {
        self.realm.is_some() && self.user_file.is_some()
    }
}

#[derive(Debug, Clone)]
struct UserFile {
    path: Template,
    /// A name starting with a variable is made absolute per request
    /// against this directory (nginx's `conf_prefix`); other relative
    /// names were made absolute when the configuration was read.
    base: Option<PathBuf>,
}

impl AuthBasicLoc {
    /// Each directive is inherited on its own, as nginx merges them.
    pub fn merge(&mut self, p: &AuthBasicLoc) {
        if self.realm.is_none() {
            self.realm = p.realm.clone();
        }
        if self.user_file.is_none() {
            self.user_file = p.user_file.clone();
        }
    }
}

fn set_realm(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.auth_basic.realm.is_some() {
        return Err(duplicate(d));
    }
    l.modules.auth_basic.realm = Some(cx.template(arg(d, 0), d)?);
    Ok(())
}

fn set_user_file(l: &mut LocConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    if l.modules.auth_basic.user_file.is_some() {
        return Err(duplicate(d));
    }
    let v = arg(d, 0);
    let mut path = cx.template(v, d)?;
    let mut base = None;
    if v.starts_with('$') {
        base = Some(cx.conf_prefix.clone());
    } else if !v.starts_with('/') {
        // The prefix is a literal part: a `$` in a directory name is not a
        // variable.
        let mut dir = cx.conf_prefix.as_os_str().as_bytes().to_vec();
        if !dir.ends_with(b"/") {
            dir.push(b'/');
        }
        path.parts.insert(0, Part::Lit(dir));
    }
    l.modules.auth_basic.user_file = Some(UserFile { path, base });
    Ok(())
}

/// The user name and password of `Authorization: Basic`, as nginx's
/// `ngx_http_auth_basic_user`: the scheme is matched case-insensitively,
/// spaces before the base64 are skipped, the base64 ends at the first `=`
/// (nginx's lenient decoder), and there must be a `:` with a non-empty
/// name before it.
pub fn credentials(req: &Request) -> Option<(Vec<u8>, Vec<u8>)> {
    let h = req.header("authorization")?;
    if h.len() < 6 || !h[..6].eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let mut enc = &h[6..];
    while let [b' ', rest @ ..] = enc {
        enc = rest;
    }
    if enc.is_empty() {
        return None;
    }
    let mut dec = nginx_base64_decode(enc)?;
    let colon = dec.iter().position(|&c| c == b':')?;
    if colon == 0 {
        return None;
    }
    let pass = dec.split_off(colon + 1);
    dec.truncate(colon);
    Some((dec, pass))
}

/// nginx's `ngx_decode_base64`: the input ends at the first `=`, padding is
/// optional, unused trailing bits are ignored; a byte outside the alphabet
/// or a length of 4n+1 is an error.
fn nginx_base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_padding_mode(DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    );
    let end = s.iter().position(|&c| c == b'=').unwrap_or(s.len());
    LENIENT.decode(&s[..end]).ok()
}

/// `$remote_user`: the name from `Authorization: Basic`, whether or not
/// the location checks it.
pub fn var(cx: &Ctx<'_>, _id: u8, out: &mut Vec<u8>) -> bool {
    match credentials(cx.req) {
        Some((user, _)) => {
            out.extend_from_slice(&user);
            true
        }
        None => false,
    }
}

/// 401 with the challenge for `realm` (taken as it is, as nginx does).
fn challenge(realm: &[u8]) -> Verdict {
    let mut v = b"Basic realm=\"".to_vec();
    v.extend_from_slice(realm);
    v.push(b'"');
    let mut r = Response::status(401);
    r.headers.push(("WWW-Authenticate".into(), v));
    Verdict::Refuse(r)
}

/// The access check (nginx's `ngx_http_auth_basic_handler`).
pub async fn check(cx: &Ctx<'_>) -> Verdict {
    let loc = cx.loc.clone();
    let conf = &loc.modules.auth_basic;
    let (Some(realm), Some(file)) = (&conf.realm, &conf.user_file) else {
        return Verdict::Declined;
    };
    let realm = realm.render_vec(cx);
    if realm == b"off" {
        return Verdict::Declined;
    }
    let Some((user, pass)) = credentials(cx.req) else {
        cx.log(
            Level::Info,
            "no user/password was provided for basic authentication",
        );
        return challenge(&realm);
    };
    let mut name = file.path.render_vec(cx);
    if let Some(base) = file.base.as_ref().filter(|_| !name.starts_with(b"/")) {
        let mut full = base.as_os_str().as_bytes().to_vec();
        if !full.ends_with(b"/") {
            full.push(b'/');
        }
        full.extend_from_slice(&name);
        name = full;
    }
    let shown = String::from_utf8_lossy(&name).into_owned();
    let path = Path::new(std::ffi::OsStr::from_bytes(&name));
    let policy = match cx.io_policy() {
        Ok(p) => p,
        Err(r) => return Verdict::Fail(*r),
    };
    let f = match crate::io::open(path, &policy).await {
        Ok(f) => f,
        Err(e) => {
            let (level, status) = if e.kind() == std::io::ErrorKind::NotFound {
                (Level::Error, 403)
            } else {
                (Level::Crit, 500)
            };
            cx.log(
                level,
                &format!(
                    "open() \"{}\" failed {}",
                    shown,
                    crate::core::errno_text(&e)
                ),
            );
            return if status == 403 {
                Verdict::Refuse(Response::status(403))
            } else {
                Verdict::Fail(Response::status(500))
            };
        }
    };
    let mut scan = Scan::new(&user);
    let mut offset = 0u64;
    let stored = loop {
        // A directory opens fine; reading it fails as in nginx.
        let chunk = if f.meta.is_dir {
            Err(std::io::Error::from_raw_os_error(libc::EISDIR))
        } else {
            crate::io::read(&f, offset, READ_CHUNK, &policy).await
        };
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                cx.log(
                    Level::Crit,
                    &format!(
                        "pread() \"{}\" failed {}",
                        shown,
                        crate::core::errno_text(&e)
                    ),
                );
                return Verdict::Fail(Response::status(500));
            }
        };
        if chunk.is_empty() {
            break scan.finish();
        }
        offset += chunk.len() as u64;
        if let Some(p) = scan.feed(&chunk) {
            break Some(p);
        }
    };
    let user_shown = String::from_utf8_lossy(&user);
    let Some(stored) = stored else {
        cx.log(
            Level::Error,
            &format!("user \"{}\" was not found in \"{}\"", user_shown, shown),
        );
        return challenge(&realm);
    };
    if matches(cx, &policy, pass, stored).await {
        return Verdict::Allow;
    }
    cx.log(
        Level::Error,
        &format!("user \"{}\": password mismatch", user_shown),
    );
    challenge(&realm)
}

/// How much of the user file is read at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Whether `pass` hashes to `stored`; the slow schemes on a pool thread.
async fn matches(cx: &Ctx<'_>, policy: &crate::io::Policy, pass: Vec<u8>, stored: Vec<u8>) -> bool {
    if !slow(&stored) {
        return crypt(&pass, &stored).is_some_and(|c| c == c_str(&stored));
    }
    let pool = match &policy.aio {
        crate::io::Aio::Threads(p) => Some(p.clone()),
        _ => cx.shared.pools.load().get(crate::io::DEFAULT_POOL),
    };
    let work = move || crypt(&pass, &stored).is_some_and(|c| c == c_str(&stored));
    match pool {
        // A full queue is logged by the pool; the login fails.
        Some(p) => p.run(work).await.unwrap_or(false),
        None => work(),
    }
}

/// bcrypt and the SHA-crypts: made to be slow.
fn slow(stored: &[u8]) -> bool {
    stored.starts_with(b"$2")
        || stored.starts_with(b"$5$")
        || stored.starts_with(b"$6$")
        || stored.starts_with(b"$sha1$")
}

/// nginx hands both strings to C: each ends at a NUL byte.
fn c_str(b: &[u8]) -> &[u8] {
    match b.iter().position(|&c| c == 0) {
        Some(n) => &b[..n],
        None => b,
    }
}

/// What the stored field would be for `key` (nginx's `ngx_crypt`: its
/// own `{PLAIN}`, `{SSHA}`, `{SHA}`, and crypt() for the rest, `$apr1$`
/// included). `None` when the field is no hash crypt() knows: as with
/// libxcrypt's failure token, that never matches.
fn crypt(key: &[u8], salt: &[u8]) -> Option<Vec<u8>> {
    let key = c_str(key);
    let salt = c_str(salt);
    if salt.starts_with(b"{PLAIN}") {
        let mut out = b"{PLAIN}".to_vec();
        out.extend_from_slice(key);
        return Some(out);
    }
    if let Some(enc) = salt.strip_prefix(b"{SSHA}") {
        // "{SSHA}" base64(SHA1(key salt) salt); a field that does not
        // decode to more than a digest has no salt.
        let mut decoded = nginx_base64_decode(enc).unwrap_or_default();
        if decoded.len() < 20 {
            decoded = vec![0; 20];
        }
        let mut h = Sha1::new();
        h.update(key);
        h.update(&decoded[20..]);
        decoded[..20].copy_from_slice(&h.finalize());
        let mut out = b"{SSHA}".to_vec();
        out.extend_from_slice(STANDARD.encode(&decoded).as_bytes());
        return Some(out);
    }
    if salt.starts_with(b"{SHA}") {
        let mut out = b"{SHA}".to_vec();
        out.extend_from_slice(STANDARD.encode(Sha1::digest(key)).as_bytes());
        return Some(out);
    }
    let setting = std::str::from_utf8(salt).ok()?;
    libc_crypt(key, setting).map(|h| h.as_bytes().to_vec())
}

/// crypt(3) as glibc's libxcrypt dispatches on the setting's prefix (and
/// `$apr1$`, which nginx computes itself). Each algorithm is called
/// directly: the crate's own recogniser refuses SHA-crypt hashes without
/// `rounds=`, the common kind.
// These formats are here for existing password files, which is what the
// crate's deprecation notes are about.
#[allow(deprecated)]
fn libc_crypt(key: &[u8], setting: &str) -> Option<String> {
    use crypt3_rs::crypt::{apr1, bcrypt, bsdi, md5, sha1, sha256, sha512, unix};
    let h = if setting.starts_with("$apr1$") {
        apr1::hash_with(setting, key)
    } else if setting.starts_with("$1$") {
        md5::hash_with(setting, key)
    } else if ["$2a$", "$2b$", "$2y$"]
        .iter()
        .any(|p| setting.starts_with(p))
    {
        bcrypt::hash_with(setting, key)
    } else if setting.starts_with("$5$") {
        sha256::hash_with(setting, key)
    } else if setting.starts_with("$6$") {
        sha512::hash_with(setting, key)
    } else if setting.starts_with("$sha1$") {
        sha1::hash_with(setting, key)
    } else if setting.starts_with('_') {
        bsdi::hash_with(setting, key)
    } else if setting.starts_with('$') {
        // yescrypt, scrypt, gost-yescrypt, NT...: not available here.
        return None;
    } else {
        unix::hash_with(setting, key)
    };
    h.ok().map(|h| h.as_str().to_string())
}

/// nginx's scan of the user file for one user: lines are `name:password`,
/// the password ends at CR, LF, `:` or the end of the file; a line
/// starting with `#` or CR is skipped. The quirks are nginx's: a line
/// that goes wrong inside a name skips to the end of the *next* line
/// break seen from there (so a name cut short by a line end hides the
/// following line), and an empty line is passed over.
struct Scan<'u> {
    user: &'u [u8],
    state: State,
    /// Bytes of the name matched on this line.
    login: usize,
    password: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Login,
    Password,
    Skip,
}

impl<'u> Scan<'u> {
    fn new(user: &'u [u8]) -> Scan<'u> {
        Scan {
            user,
            state: State::Login,
            login: 0,
            password: Vec::new(),
        }
    }

    /// Scans the next piece of the file; the password once its field ends.
    fn feed(&mut self, buf: &[u8]) -> Option<Vec<u8>> {
        for &c in buf {
            match self.state {
                State::Login => {
                    if self.login == 0 {
                        if c == b'#' || c == b'\r' {
                            self.state = State::Skip;
                            continue;
                        }
                        if c == b'\n' {
                            continue;
                        }
                    }
                    // The name as nginx keeps it is followed by the `:` of
                    // the header's "user:pass".
                    let want = self.user.get(self.login).copied().unwrap_or(b':');
                    if c != want {
                        self.state = State::Skip;
                        continue;
                    }
                    if self.login == self.user.len() {
                        self.state = State::Password;
                        self.password.clear();
                    }
                    self.login += 1;
                }
                State::Password => {
                    if matches!(c, b'\n' | b'\r' | b':') {
                        return Some(std::mem::take(&mut self.password));
                    }
                    self.password.push(c);
                }
                State::Skip => {
                    if c == b'\n' {
                        self.state = State::Login;
                        self.login = 0;
                    }
                }
            }
        }
        None
    }

    /// At the end of the file: a password field still open is complete.
    fn finish(self) -> Option<Vec<u8>> {
        (self.state == State::Password).then_some(self.password)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(file: &[u8], user: &[u8]) -> Option<Vec<u8>> {
        let mut s = Scan::new(user);
        // Byte by byte too: the state carries across reads.
        let mut s2 = Scan::new(user);
        let whole = s.feed(file).or_else(|| s.finish());
        let mut split = None;
        for b in file.chunks(1) {
            if let Some(p) = s2.feed(b) {
                split = Some(p);
                break;
            }
        }
        let split = split.or_else(|| s2.finish());
        assert_eq!(whole, split);
        whole
    }

    #[test]
    fn scans_as_nginx() {
        let f = b"# comment\n\nann:{PLAIN}a\nbob:{PLAIN}b:extra\r\ncarl:{PLAIN}c";
        assert_eq!(find(f, b"ann"), Some(b"{PLAIN}a".to_vec()));
        assert_eq!(find(f, b"bob"), Some(b"{PLAIN}b".to_vec()));
        assert_eq!(find(f, b"carl"), Some(b"{PLAIN}c".to_vec()));
        assert_eq!(find(f, b"an"), None);
        assert_eq!(find(f, b"anna"), None);
        assert_eq!(find(f, b"# comment"), None);
        // A name cut short by the line end hides the next line.
        assert_eq!(find(b"us\nuser:x\nuser:y\n", b"user"), Some(b"y".to_vec()));
        assert_eq!(find(b"user:\n", b"user"), Some(Vec::new()));
    }

    #[test]
    fn nginx_schemes() {
        assert_eq!(
            crypt(b"pw", b"{PLAIN}pw").as_deref(),
            Some(&b"{PLAIN}pw"[..])
        );
        // printf pw | openssl sha1 -binary | base64
        assert_eq!(
            crypt(b"password", b"{SHA}x").as_deref(),
            Some(&b"{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g="[..])
        );
        // A salted SHA round-trips its own salt.
        let mut d = Sha1::digest(b"secretSALT").to_vec();
        d.extend_from_slice(b"SALT");
        let field = format!("{{SSHA}}{}", STANDARD.encode(&d));
        assert_eq!(
            crypt(b"secret", field.as_bytes()).as_deref(),
            Some(field.as_bytes())
        );
        // openssl passwd -apr1 -salt abcdefgh password
        assert_eq!(
            crypt(b"password", b"$apr1$abcdefgh$FBwExRW4dCc8aL.OvjpIE1").as_deref(),
            Some(&b"$apr1$abcdefgh$FBwExRW4dCc8aL.OvjpIE1"[..])
        );
        // Anything else is a DES salt, as for crypt(3): never equal to itself.
        assert_ne!(
            crypt(b"pw", b"not a hash at all").as_deref(),
            Some(&b"not a hash at all"[..])
        );
        // A hash with no algorithm here (yescrypt) never matches.
        assert_eq!(
            crypt(
                b"pwy",
                b"$y$j9T$abcdefghijklmnop$zPiqgn2.bVEc6bV2PUf643TZFpxBOyZimrEkRjRkBXB"
            ),
            None
        );
        // SHA-crypt without `rounds=`, DES, bcrypt.
        assert_eq!(
            crypt(
                b"pw5",
                b"$5$saltsalt$zOFVkp0Kz29x0a6a4dSx8FZisA8Iwb0KzzvoRDFTN/8"
            )
            .as_deref(),
            Some(&b"$5$saltsalt$zOFVkp0Kz29x0a6a4dSx8FZisA8Iwb0KzzvoRDFTN/8"[..])
        );
        assert_eq!(
            crypt(b"pwd", b"abCu5BZmWWFJU").as_deref(),
            Some(&b"abCu5BZmWWFJU"[..])
        );
    }

    #[test]
    fn base64_is_nginx_lenient() {
        assert_eq!(
            nginx_base64_decode(b"dXNlcjpwYXNz").as_deref(),
            Some(&b"user:pass"[..])
        );
        assert_eq!(
            nginx_base64_decode(b"dXNlcjpwYQ==").as_deref(),
            Some(&b"user:pa"[..])
        );
        assert_eq!(
            nginx_base64_decode(b"dXNlcjpwYQ").as_deref(),
            Some(&b"user:pa"[..])
        );
        assert_eq!(
            nginx_base64_decode(b"dXNlcjpwYQ=garbage!").as_deref(),
            Some(&b"user:pa"[..])
        );
        assert_eq!(nginx_base64_decode(b"dXNlc"), None);
        assert_eq!(nginx_base64_decode(b"!!!!"), None);
    }
}
