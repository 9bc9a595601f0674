//! Regular expressions, as nginx's `ngx_regex`: PCRE2 itself (the `pcre2`
//! crate over the library's own C source), so that every pattern a
//! configuration carries means what it means under nginx: look-around
//! (`/\.(?!well-known/)`), `\Q...\E`, back-references, possessive and
//! atomic groups, `(?<n>)`, `(?P<n>)` and `(?'n')` names.
//!
//! Data flow: a directive's setter calls [`Regex::compile`] (or
//! [`Regex::new`] where it words the error itself); a failure becomes
//! nginx's `pcre2_compile() failed: REASON in "PATTERN" at "REST"` with the
//! directive's `file:line`. At request time callers ask [`Regex::is_match`]
//! (no captures wanted) or [`Regex::captures`] (byte ranges of `$0`..`$n`,
//! then stored by the caller as nginx's `r->captures`); group names come
//! from [`Regex::capture_names`] so that named groups become variables.
//!
//! Options are nginx's: no UTF mode (subjects are bytes, as nginx passes
//! them), `PCRE2_CASELESS` for `~*` and the places nginx compiles caseless,
//! and the JIT where the platform has one (nginx's `pcre_jit on`; results
//! are the same, only faster). A match that PCRE2 aborts (a resource limit
//! hit by a pathological pattern) counts as no match rather than failing
//! the request: the subject comes from a client and must never panic.

use crate::config::{ConfError, ConfResult, Directive};

/// A compiled pattern with its source kept for messages and `-T`.
#[derive(Clone, Debug)]
pub struct Regex {
    re: pcre2::bytes::Regex,
}

/// Byte ranges of a match: `$0` first, `None` for a group that took no part.
pub type Captures = Vec<Option<(usize, usize)>>;

impl Regex {
    /// Compiles `pattern`, returning nginx's wording of a failure (without
    /// the place, which the caller's directive supplies).
    pub fn new(pattern: &str, caseless: bool) -> Result<Regex, String> {
        let re = pcre2::bytes::RegexBuilder::new()
            .caseless(caseless)
            .jit_if_available(true)
            .build(pattern)
            .map_err(|e| compile_error(pattern, &e))?;
        Ok(Regex { re })
    }

    /// Compiles `pattern` for directive `d`: a failure is an `[emerg]` at
    /// the directive's `file:line`.
    pub fn compile(d: &Directive, pattern: &str, caseless: bool) -> ConfResult<Regex> {
        Regex::new(pattern, caseless).map_err(|msg| ConfError::at(msg, d))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        self.re.as_str()
    }

    /// Whether the pattern matches anywhere in `subject`.
    pub fn is_match(&self, subject: &[u8]) -> bool {
        self.re.is_match(subject).unwrap_or(false)
    }

    /// The first match's groups, `$0` first, or `None` with no match.
    pub fn captures(&self, subject: &[u8]) -> Option<Captures> {
        let mut locs = self.re.capture_locations();
        match self.re.captures_read(&mut locs, subject) {
            Ok(Some(_)) => Some((0..locs.len()).map(|i| locs.get(i)).collect()),
            _ => None,
        }
    }

    /// Group names by number (`None` for `$0` and unnamed groups).
    pub fn capture_names(&self) -> &[Option<String>] {
        self.re.capture_names()
    }

    /// The named groups only.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.capture_names().iter().flatten().map(String::as_str)
    }
}

/// nginx's message: `pcre2_compile() failed: REASON in "PATTERN"`, plus
/// ` at "REST"` when PCRE2 stopped before the end of the pattern.
fn compile_error(pattern: &str, e: &pcre2::Error) -> String {
    // The crate's text is "PCRE2: error compiling pattern at offset N: REASON";
    // REASON is PCRE2's own message, which nginx prints.
    let text = e.to_string();
    let reason = match text.split_once(": ") {
        Some((_, rest)) => rest.split_once(": ").map_or(rest, |(_, r)| r),
        None => text.as_str(),
    };
    match e.offset() {
        Some(off) if off < pattern.len() => format!(
            "pcre2_compile() failed: {} in \"{}\" at \"{}\"",
            reason,
            pattern,
            pattern.get(off..).unwrap_or("")
        ),
        _ => format!("pcre2_compile() failed: {} in \"{}\"", reason, pattern),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcre_features() {
        let r = Regex::new(r"/\.(?!well-known/)", true).unwrap();
        assert!(r.is_match(b"/.git/config"));
        assert!(!r.is_match(b"/.well-known/acme"));
        assert!(Regex::new(r"^/\Q.+\E$", false).unwrap().is_match(b"/.+"));
        assert!(!Regex::new(r"^/\Q.+\E$", false).unwrap().is_match(b"/ab"));
        assert!(Regex::new(r"^/(a+)-\1$", false)
            .unwrap()
            .is_match(b"/aa-aa"));
        assert!(!Regex::new(r"^/a++a", false).unwrap().is_match(b"/aaa"));
        let r = Regex::new(r"^/(?<x>\d+)/(?P<y>\w+)", false).unwrap();
        assert_eq!(r.names().collect::<Vec<_>>(), ["x", "y"]);
        let c = r.captures(b"/12/ab").unwrap();
        assert_eq!(c, vec![Some((0, 6)), Some((1, 3)), Some((4, 6))]);
        assert!(Regex::new("ABC", true).unwrap().is_match(b"xabc"));
        assert!(!Regex::new("ABC", false).unwrap().is_match(b"xabc"));
        // Bytes, not UTF-8: invalid sequences are matched, not refused.
        assert!(Regex::new(r"^/\xff", false).unwrap().is_match(b"/\xff"));
    }

    #[test]
    fn nginx_messages() {
        assert_eq!(
            Regex::new("(foo", false).unwrap_err(),
            "pcre2_compile() failed: missing closing parenthesis in \"(foo\""
        );
        assert_eq!(
            Regex::new("[z-a]", false).unwrap_err(),
            "pcre2_compile() failed: range out of order in character class in \"[z-a]\" at \"a]\""
        );
        assert_eq!(
            Regex::new("*a", false).unwrap_err(),
            "pcre2_compile() failed: quantifier does not follow a repeatable item in \"*a\" at \"*a\""
        );
        assert_eq!(
            Regex::new("(?<n>a)(?<n>b)", false).unwrap_err(),
            "pcre2_compile() failed: two named subpatterns have the same name (PCRE2_DUPNAMES not set) in \"(?<n>a)(?<n>b)\" at \"b)\""
        );
    }
}
