//! nginx.conf syntax: lexer and parser, with `include` expanded in place.
//!
//! The lexer reproduces nginx's `ngx_conf_read_token` rules rather than a
//! tidier grammar, because configs written for nginx rely on its quirks:
//!
//! - words are separated by space, tab, CR or LF; `;` ends a directive,
//!   `{` opens its block, and `}` closes a block only where a word could
//!   start (`a}` is the word `a}`);
//! - `#` starts a comment only where a word could start (`a#b` is a word);
//! - a word starting with `"` or `'` runs to the matching quote and must be
//!   followed by whitespace, `;`, `{` or `)`;
//! - a backslash protects the next character both in and outside quotes;
//!   when the word is stored, `\"` `\'` `\\` become the character, `\t`
//!   `\r` `\n` the control character, and any other `\x` stays as written
//!   (regexes need their backslashes);
//! - a `{` right after `$` belongs to the word, so `${var}` works.
//!
//! Error messages are worded as nginx words them, so people can search for
//! them and tests written against nginx output carry over.
//!
//! The parser is iterative (an explicit stack of open blocks), so deeply
//! nested input cannot overflow the thread stack; only `include` recurses,
//! and that is bounded by [`MAX_INCLUDE_DEPTH`].

use super::{Arg, ConfError, ConfResult, Directive, Tree};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How deep `include` may nest. nginx has no explicit limit (a recursive
/// include ends when it runs out of file descriptors); a fixed bound gives
/// a clear error instead.
pub const MAX_INCLUDE_DEPTH: usize = 64;

/// nginx reads the file through a 4096-byte buffer and refuses a word that
/// does not fit in it; most often this catches a missing closing quote.
const MAX_WORD: usize = 4096;

/// Parse the main config file; `include` is expanded in place (recursively) at parse time.
pub fn parse_file(path: &Path, conf_prefix: &Path) -> ConfResult<Tree> {
    let mut tree = Tree::default();
    // Failing to open the main file has no location in nginx's message.
    let text = read_conf(path).map_err(ConfError::new)?;
    record_file(&mut tree, path, &text);
    let file = Arc::new(path.to_path_buf());
    let directives = Parser {
        conf_prefix,
        tree: &mut tree,
    }
    .parse_text(&text, file, 0)?;
    tree.directives = directives;
    Ok(tree)
}

/// Parse text (used for `-g "directives"`, file name shown as given, e.g. "command line"); includes resolved against conf_prefix; every file read is appended to `tree.files`.
///
/// The text itself is not added to `tree.files` (it is not a file, and
/// `nginx -T` does not dump it). Errors use the file wording and location;
/// nginx words two `-g` errors differently (`unexpected end of parameter,
/// expecting ";"`, and `block directives are not supported in -g option`)
/// and prints them as `... in command line` without a line, which the
/// caller can apply.
pub fn parse_str(
    text: &str,
    file: Arc<PathBuf>,
    conf_prefix: &Path,
    tree: &mut Tree,
) -> ConfResult<Vec<Directive>> {
    Parser { conf_prefix, tree }.parse_text(text, file, 0)
}

/// Read a whole config file, with nginx's wording on failure:
/// `open() "PATH" failed (ERRNO: STRERROR)`.
fn read_conf(path: &Path) -> Result<String, String> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| format!("open() \"{}\" failed ({})", path.display(), os_error(&e)))?;
    let mut bytes = Vec::new();
    // A directory opens fine on Unix but fails to read; nginx reports that
    // from its read call, which on Linux is pread().
    f.read_to_end(&mut bytes)
        .map_err(|e| format!("pread() \"{}\" failed ({})", path.display(), os_error(&e)))?;
    // nginx treats the file as bytes; we need UTF-8 strings for arguments.
    // Invalid sequences (e.g. Latin-1 in comments) are replaced rather
    // than rejected, which only changes bytes nginx would pass through.
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// `ERRNO: STRERROR` as nginx prints after a failed system call. Rust's own
/// rendering is `STRERROR (os error ERRNO)`, so it is rearranged.
fn os_error(e: &std::io::Error) -> String {
    let text = e.to_string();
    match e.raw_os_error() {
        Some(code) => {
            let suffix = format!(" (os error {code})");
            let msg = text.strip_suffix(&suffix).unwrap_or(&text);
            format!("{code}: {msg}")
        }
        None => text,
    }
}

/// Remember a file for `-T`. nginx dumps each file once even if it is
/// included several times, so repeated reads are not recorded again.
fn record_file(tree: &mut Tree, path: &Path, text: &str) {
    if !tree.files.iter().any(|(p, _)| p == path) {
        tree.files.push((path.to_path_buf(), text.to_owned()));
    }
}

/// What the lexer found: a complete directive, a block end, or the end of
/// the input.
enum Event {
    /// The words of a directive (at least one), whether it was ended by
    /// `{` rather than `;`, and the line of that terminator.
    Directive {
        words: Vec<Arg>,
        block: bool,
        line: usize,
    },
    /// A `}` where a directive could start.
    Close,
    Eof,
}

struct Lexer<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
    file: &'a Arc<PathBuf>,
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

const EOF_IN_DIRECTIVE: &str = "unexpected end of file, expecting \";\" or \"}\"";

impl<'a> Lexer<'a> {
    fn new(text: &'a str, file: &'a Arc<PathBuf>) -> Self {
        Lexer {
            text,
            pos: 0,
            line: 1,
            file,
        }
    }

    /// An error at the current line, which is where nginx reports it.
    fn err(&self, msg: impl Into<String>) -> ConfError {
        self.err_at(msg, self.line)
    }

    fn err_at(&self, msg: impl Into<String>, line: usize) -> ConfError {
        ConfError {
            msg: msg.into(),
            file: Some((**self.file).clone()),
            line,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    /// Consume one byte, counting lines wherever the byte occurs (inside
    /// quotes, after a backslash, in comments) as nginx does.
    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        if c == b'\n' {
            self.line += 1;
        }
        Some(c)
    }

    /// `unexpected "C"` for the character at the current position (the
    /// whole character, in case it is not ASCII).
    fn unexpected_here(&self) -> ConfError {
        let c = self
            .text
            .get(self.pos..)
            .and_then(|s| s.chars().next())
            .unwrap_or('?');
        self.err(format!("unexpected \"{c}\""))
    }

    /// Fail like nginx when a word has filled its read buffer and more
    /// input is waiting. `start` is where the word's content began,
    /// `quote` the opening quote of a quoted word.
    fn check_len(&self, start: usize, start_line: usize, quote: Option<u8>) -> ConfResult<()> {
        if self.pos - start < MAX_WORD || self.pos >= self.text.len() {
            return Ok(());
        }
        let msg = match quote {
            Some(q) => format!(
                "too long parameter, probably missing terminating \"{}\" character",
                char::from(q)
            ),
            None => {
                // In range: at least MAX_WORD bytes follow `start`.
                let head = String::from_utf8_lossy(&self.text.as_bytes()[start..start + 10]);
                format!("too long parameter \"{head}...\" started")
            }
        };
        // nginx rewinds the line counter to where the word started.
        Err(self.err_at(msg, start_line))
    }

    /// Read the next directive (or `}` / end of input).
    fn next(&mut self) -> ConfResult<Event> {
        let mut words: Vec<Arg> = Vec::new();
        loop {
            let Some(c) = self.peek() else {
                if words.is_empty() {
                    return Ok(Event::Eof);
                }
                return Err(self.err(EOF_IN_DIRECTIVE));
            };
            match c {
                _ if is_space(c) => {
                    self.bump();
                }
                b'#' => {
                    // Comments run to the end of the line; the newline
                    // itself is consumed here too, which is harmless.
                    while let Some(c) = self.bump() {
                        if c == b'\n' {
                            break;
                        }
                    }
                }
                b';' | b'{' => {
                    self.bump();
                    if words.is_empty() {
                        return Err(self.err(format!("unexpected \"{}\"", char::from(c))));
                    }
                    return Ok(Event::Directive {
                        words,
                        block: c == b'{',
                        line: self.line,
                    });
                }
                b'}' => {
                    self.bump();
                    if !words.is_empty() {
                        return Err(self.err("unexpected \"}\""));
                    }
                    return Ok(Event::Close);
                }
                b'"' | b'\'' => {
                    self.bump();
                    let value = self.quoted_word(c)?;
                    words.push(Arg {
                        value,
                        quoted: true,
                    });
                    // A closing quote must be followed by a separator.
                    // `)` is allowed for `if ($a = "b")` and then starts
                    // the next word. End of input is left to the top of
                    // the loop.
                    if let Some(next) = self.peek() {
                        if !(is_space(next) || matches!(next, b';' | b'{' | b')')) {
                            return Err(self.unexpected_here());
                        }
                    }
                }
                _ => {
                    let value = self.bare_word()?;
                    words.push(Arg {
                        value,
                        quoted: false,
                    });
                }
            }
        }
    }

    /// A word not starting with a quote; stops before whitespace, `;` or
    /// `{` (which the caller then handles).
    fn bare_word(&mut self) -> ConfResult<String> {
        let start = self.pos;
        let start_line = self.line;
        loop {
            self.check_len(start, start_line, None)?;
            let Some(c) = self.peek() else { break };
            if is_space(c) || c == b';' || c == b'{' {
                break;
            }
            self.bump();
            let protects_next = match c {
                // The escaped character can be anything, even a separator.
                b'\\' => self.peek().is_some(),
                // `${name}`: this `{` is not a block start.
                b'$' => self.peek() == Some(b'{'),
                _ => false,
            };
            if protects_next {
                self.check_len(start, start_line, None)?;
                self.bump();
            }
        }
        Ok(unescape(&self.text.as_bytes()[start..self.pos]))
    }

    /// The rest of a quoted word after its opening quote `q`, consuming
    /// the closing quote.
    fn quoted_word(&mut self, q: u8) -> ConfResult<String> {
        let start = self.pos;
        let start_line = self.line;
        loop {
            self.check_len(start, start_line, Some(q))?;
            match self.bump() {
                None => return Err(self.err(EOF_IN_DIRECTIVE)),
                Some(b'\\') => {
                    self.check_len(start, start_line, Some(q))?;
                    if self.bump().is_none() {
                        return Err(self.err(EOF_IN_DIRECTIVE));
                    }
                }
                Some(c) if c == q => {
                    return Ok(unescape(&self.text.as_bytes()[start..self.pos - 1]));
                }
                Some(_) => {}
            }
        }
    }
}

/// Apply nginx's backslash rules to a word's raw bytes.
fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let c = raw[i];
        if c == b'\\' {
            let replacement = match raw.get(i + 1) {
                Some(&n @ (b'"' | b'\'' | b'\\')) => Some(n),
                Some(b't') => Some(b'\t'),
                Some(b'r') => Some(b'\r'),
                Some(b'n') => Some(b'\n'),
                _ => None,
            };
            if let Some(r) = replacement {
                out.push(r);
                i += 2;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    // Only ASCII bytes were removed or replaced, so valid UTF-8 input
    // stays valid; the lossy path is just a panic-free fallback.
    String::from_utf8_lossy(&out).into_owned()
}

struct Parser<'a> {
    conf_prefix: &'a Path,
    tree: &'a mut Tree,
}

impl Parser<'_> {
    /// Parse one file's (or the command line's) text; `depth` counts the
    /// includes that led here.
    fn parse_text(
        &mut self,
        text: &str,
        file: Arc<PathBuf>,
        depth: usize,
    ) -> ConfResult<Vec<Directive>> {
        let mut lexer = Lexer::new(text, &file);
        // Open blocks, innermost last: the block's directive and the list
        // of the level that contains it. `current` is the innermost list.
        let mut open: Vec<(Directive, Vec<Directive>)> = Vec::new();
        let mut current: Vec<Directive> = Vec::new();
        loop {
            match lexer.next()? {
                Event::Eof => {
                    // Blocks never continue across files: an include is
                    // parsed on its own, as in nginx.
                    if open.is_empty() {
                        return Ok(current);
                    }
                    return Err(lexer.err("unexpected end of file, expecting \"}\""));
                }
                Event::Close => {
                    let Some((mut d, outer)) = open.pop() else {
                        return Err(lexer.err("unexpected \"}\""));
                    };
                    d.block = Some(std::mem::replace(&mut current, outer));
                    d.end = lexer.line;
                    current.push(d);
                }
                Event::Directive { words, block, line } => {
                    let mut words = words.into_iter();
                    let Some(name) = words.next() else { continue };
                    let d = Directive {
                        name: name.value,
                        args: words.collect(),
                        block: None,
                        file: Arc::clone(&file),
                        line,
                        end: 0,
                    };
                    if d.name == "include" {
                        current.extend(self.include(&d, block, depth)?);
                    } else if block {
                        open.push((d, std::mem::take(&mut current)));
                    } else {
                        current.push(d);
                    }
                }
            }
        }
    }

    /// Expand `include FILE;` into the directives of the file(s) it names.
    /// Handled here rather than by the directive table because it applies
    /// in every context, including `types {}` and `map {}` whose contents
    /// are not directives.
    fn include(&mut self, d: &Directive, block: bool, depth: usize) -> ConfResult<Vec<Directive>> {
        if block {
            return Err(ConfError::at(
                "directive \"include\" is not terminated by \";\"",
                d,
            ));
        }
        let [arg] = d.args.as_slice() else {
            return Err(ConfError::at(
                "invalid number of arguments in \"include\" directive",
                d,
            ));
        };
        if depth >= MAX_INCLUDE_DEPTH {
            return Err(ConfError::at(
                format!(
                    "include of \"{}\" nested more than {MAX_INCLUDE_DEPTH} levels deep, \
                     probably recursive",
                    arg.value
                ),
                d,
            ));
        }
        let full = self.conf_prefix.join(&arg.value);
        // Like nginx, test the full name (prefix included) for glob
        // characters; without them a missing file is an error.
        let full_str = full.to_string_lossy().into_owned();
        if !full_str.contains(['*', '?', '[']) {
            return self.include_file(&full, d, depth);
        }
        // Match libc glob(3), which nginx uses: `*` does not match a
        // leading dot or cross a `/`. A pattern matching nothing is fine.
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        let matches = glob::glob_with(&full_str, options)
            .map_err(|e| ConfError::at(format!("glob() \"{full_str}\" failed ({})", e.msg), d))?;
        // Unreadable directories are skipped, as glob(3) does without
        // GLOB_ERR.
        let mut paths: Vec<PathBuf> = matches.filter_map(Result::ok).collect();
        paths.sort();
        let mut out = Vec::new();
        for path in paths {
            out.extend(self.include_file(&path, d, depth)?);
        }
        Ok(out)
    }

    fn include_file(
        &mut self,
        path: &Path,
        d: &Directive,
        depth: usize,
    ) -> ConfResult<Vec<Directive>> {
        // A file that cannot be read is reported at the include directive.
        let text = read_conf(path).map_err(|msg| ConfError::at(msg, d))?;
        record_file(self.tree, path, &text);
        self.parse_text(&text, Arc::new(path.to_path_buf()), depth + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let dir = std::env::temp_dir().join(format!(
                "tern-parse-test-{}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed),
                nanos
            ));
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
        fn write(&self, name: &str, text: &str) -> PathBuf {
            let p = self.0.join(name);
            if let Some(parent) = p.parent() {
                fs::create_dir_all(parent).unwrap();
            }
            fs::write(&p, text).unwrap();
            p
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn parse(text: &str) -> ConfResult<Vec<Directive>> {
        let mut tree = Tree::default();
        parse_str(
            text,
            Arc::new(PathBuf::from("t.conf")),
            Path::new("/nonexistent-prefix"),
            &mut tree,
        )
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    fn values(d: &Directive) -> Vec<&str> {
        d.args.iter().map(|a| a.value.as_str()).collect()
    }

    /// One directive's argument values.
    fn args1(text: &str) -> Vec<String> {
        let ds = parse(text).unwrap();
        assert_eq!(ds.len(), 1, "{ds:?}");
        values(&ds[0]).into_iter().map(String::from).collect()
    }

    #[test]
    fn directives_and_blocks() {
        let ds =
            parse("worker_processes 2;\nhttp {\n  server { listen 80; }\n  gzip on;\n}\n").unwrap();
        assert_eq!(ds.len(), 2);
        assert_eq!(ds[0].name, "worker_processes");
        assert_eq!(values(&ds[0]), ["2"]);
        assert!(ds[0].block.is_none());
        let http = ds[1].block.as_ref().unwrap();
        assert_eq!(ds[1].name, "http");
        assert!(ds[1].args.is_empty());
        assert_eq!(http.len(), 2);
        assert_eq!(http[0].name, "server");
        let server = http[0].block.as_ref().unwrap();
        assert_eq!(server[0].name, "listen");
        assert_eq!(values(&server[0]), ["80"]);
        assert_eq!(http[1].name, "gzip");
        // Empty blocks are Some(empty), distinct from no block.
        let ds = parse("events {}").unwrap();
        assert_eq!(ds[0].block.as_deref().map(<[_]>::len), Some(0));
        assert!(parse("").unwrap().is_empty());
        assert!(parse("  \n# only a comment\n").unwrap().is_empty());
    }

    #[test]
    fn whitespace_kinds_and_adjacent_terminators() {
        assert_eq!(args1("a\tb\r\nc ;"), ["b", "c"]);
        let ds = parse("a b;c d;e{f;}").unwrap();
        assert_eq!(ds.len(), 3);
        assert_eq!(values(&ds[1]), ["d"]);
        assert_eq!(ds[2].block.as_ref().unwrap()[0].name, "f");
        // `}` inside a word is an ordinary character.
        assert_eq!(args1("a b};"), ["b}"]);
    }

    #[test]
    fn lines_and_files() {
        let ds = parse("a\n  b\n  c\n;\nblock\n\n{\n x;\n}\n").unwrap();
        // The line is that of the terminating `;` or `{`.
        assert_eq!(ds[0].line, 4);
        assert_eq!(ds[1].line, 7);
        assert_eq!(ds[1].block.as_ref().unwrap()[0].line, 8);
        assert_eq!(*ds[0].file, PathBuf::from("t.conf"));
        assert!(Arc::ptr_eq(&ds[0].file, &ds[1].file));
        // Newlines inside quotes and after backslashes still count.
        let ds = parse("a \"x\ny\" 'p\nq' b\\\nc;\nz;").unwrap();
        assert_eq!(ds[0].line, 4);
        assert_eq!(ds[1].line, 5);
    }

    #[test]
    fn comments() {
        let ds = parse("# leading\na b; # trailing ; { }\nc d#e; # x\n").unwrap();
        assert_eq!(ds.len(), 2);
        assert_eq!(values(&ds[0]), ["b"]);
        // `#` inside a word is not a comment.
        assert_eq!(values(&ds[1]), ["d#e"]);
        assert_eq!(args1("a #c\n b;"), ["b"]);
        assert_eq!(args1("a \"#x\";"), ["#x"]);
    }

    #[test]
    fn quotes() {
        let ds = parse("a \"b c\" 'd e' f \"\";").unwrap();
        let a = &ds[0].args;
        assert_eq!(
            a[0],
            Arg {
                value: "b c".into(),
                quoted: true
            }
        );
        assert_eq!(
            a[1],
            Arg {
                value: "d e".into(),
                quoted: true
            }
        );
        assert_eq!(
            a[2],
            Arg {
                value: "f".into(),
                quoted: false
            }
        );
        assert_eq!(
            a[3],
            Arg {
                value: "".into(),
                quoted: true
            }
        );
        // The other kind of quote, `;`, `{`, `}` and `#` are literal inside.
        assert_eq!(
            args1("a \"it's; {x} #\" 'say \"hi\"';"),
            ["it's; {x} #", "say \"hi\""]
        );
        // A quote in the middle of a word is an ordinary character.
        assert_eq!(args1("a b\"c d\";"), ["b\"c", "d\""]);
        // The directive name may be quoted too.
        let ds = parse("\"name\" x;").unwrap();
        assert_eq!(ds[0].name, "name");
        // Closing quote directly followed by a terminator.
        assert_eq!(args1("a \"b\";"), ["b"]);
        let ds = parse("a \"b\"{ }").unwrap();
        assert!(ds[0].block.is_some());
    }

    #[test]
    fn closing_quote_needs_separator() {
        assert_eq!(err("a \"b\"c;"), "unexpected \"c\" in t.conf:1");
        assert_eq!(err("a\n'b'\"c\";"), "unexpected \"\"\" in t.conf:2");
        assert_eq!(err("a \"b\"#c;"), "unexpected \"#\" in t.conf:1");
        assert_eq!(err("a \"b\"}"), "unexpected \"}\" in t.conf:1");
        assert_eq!(err("a \"b\"é;"), "unexpected \"é\" in t.conf:1");
        // `)` is allowed and starts the next word.
        let ds = parse("if ($a = \"b\") { return 404; }").unwrap();
        assert_eq!(values(&ds[0]), ["($a", "=", "b", ")"]);
        assert!(ds[0].args[2].quoted);
        assert!(!ds[0].args[3].quoted);
        assert_eq!(args1("a \"b\")c;"), ["b", ")c"]);
    }

    #[test]
    fn escapes() {
        // Outside quotes.
        assert_eq!(args1(r#"a \"b \'c \\d;"#), ["\"b", "'c", "\\d"]);
        assert_eq!(args1(r"a x\ty\rz\n;"), ["x\ty\rz\n"]);
        // Any other escape keeps the backslash (regexes rely on it).
        assert_eq!(args1(r"a ^/x\.html\d$;"), [r"^/x\.html\d$"]);
        // An escaped separator does not end the word, but keeps both chars.
        assert_eq!(args1(r"a b\ c\;d;"), [r"b\ c\;d"]);
        // Inside quotes.
        assert_eq!(
            args1(r#"a "x\"y" 'p\'q' "\\" "\t\n" "\d";"#),
            ["x\"y", "p'q", "\\", "\t\n", r"\d"]
        );
        // An escaped `{` is not a block start.
        assert_eq!(args1(r"a b\{;"), [r"b\{"]);
    }

    #[test]
    fn variables_with_braces() {
        assert_eq!(args1("set $a ${b}c;"), ["$a", "${b}c"]);
        assert_eq!(args1("set $a x${b}y;"), ["$a", "x${b}y"]);
        assert_eq!(args1("set $a \"${b}\";"), ["$a", "${b}"]);
        assert_eq!(args1("set $a $$${b};"), ["$a", "$$${b}"]);
        // Only a `{` directly after `$` is protected.
        let ds = parse("a $ {b;}").unwrap();
        assert_eq!(values(&ds[0]), ["$"]);
        assert!(ds[0].block.is_some());
        let ds = parse("a b{c;}").unwrap();
        assert_eq!(values(&ds[0]), ["b"]);
        // An escaped `$` does not protect the following `{`.
        let ds = parse(r"a \${c;}").unwrap();
        assert_eq!(values(&ds[0]), [r"\$"]);
        assert!(ds[0].block.is_some());
    }

    #[test]
    fn syntax_errors() {
        assert_eq!(err("a;\n}"), "unexpected \"}\" in t.conf:2");
        assert_eq!(err("a b\n}"), "unexpected \"}\" in t.conf:2");
        assert_eq!(err("http { a b }"), "unexpected \"}\" in t.conf:1");
        assert_eq!(err("http {}\n}"), "unexpected \"}\" in t.conf:2");
        assert_eq!(
            err("a;\nb c"),
            "unexpected end of file, expecting \";\" or \"}\" in t.conf:2"
        );
        assert_eq!(
            err("a \"b\""),
            "unexpected end of file, expecting \";\" or \"}\" in t.conf:1"
        );
        assert_eq!(
            err("a 'unterminated\n\n"),
            "unexpected end of file, expecting \";\" or \"}\" in t.conf:3"
        );
        assert_eq!(
            err("a \\"),
            "unexpected end of file, expecting \";\" or \"}\" in t.conf:1"
        );
        assert_eq!(
            err("http {\n server {\n }\n"),
            "unexpected end of file, expecting \"}\" in t.conf:4"
        );
        assert_eq!(err("a;\n{ b; }"), "unexpected \"{\" in t.conf:2");
        assert_eq!(err("a;\n ;"), "unexpected \";\" in t.conf:2");
        assert_eq!(err("http { ; }"), "unexpected \";\" in t.conf:1");
    }

    #[test]
    fn too_long_words() {
        let long = "x".repeat(MAX_WORD + 10);
        assert_eq!(
            err(&format!("a\n{long};")),
            "too long parameter \"xxxxxxxxxx...\" started in t.conf:2"
        );
        assert_eq!(
            err(&format!("a \"{long}\";")),
            "too long parameter, probably missing terminating \"\"\" character in t.conf:1"
        );
        assert_eq!(
            err(&format!("a\n'\n{long}")),
            "too long parameter, probably missing terminating \"'\" character in t.conf:2"
        );
        let ok = "y".repeat(MAX_WORD - 1);
        assert_eq!(args1(&format!("a {ok};")), [ok.as_str()]);
    }

    #[test]
    fn include_relative_absolute_and_nested() {
        let dir = TempDir::new();
        dir.write("a.conf", "a1;\ninclude sub/b.conf;\na2;\n");
        let b = dir.write("sub/b.conf", "\nb1 x;\n");
        let main = dir.write(
            "nginx.conf",
            &format!(
                "top;\ninclude a.conf;\nhttp {{\n  include {};\n}}\n",
                b.display()
            ),
        );
        let tree = parse_file(&main, &dir.0).unwrap();
        let names: Vec<&str> = tree.directives.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["top", "a1", "b1", "a2", "http"]);
        let a1 = &tree.directives[1];
        assert_eq!((*a1.file).clone(), dir.0.join("a.conf"));
        assert_eq!(a1.line, 1);
        let b1 = &tree.directives[2];
        assert_eq!(*b1.file, b);
        assert_eq!(b1.line, 2);
        assert_eq!(tree.directives[3].line, 3);
        let http = tree.directives[4].block.as_ref().unwrap();
        assert_eq!(http.len(), 1);
        assert_eq!(http[0].name, "b1");
        assert_eq!(values(&http[0]), ["x"]);
        // Files in the order read, main first, each once.
        let files: Vec<&Path> = tree.files.iter().map(|(p, _)| p.as_path()).collect();
        assert_eq!(files, [main.as_path(), &dir.0.join("a.conf"), b.as_path()]);
        assert_eq!(tree.files[2].1, "\nb1 x;\n");
    }

    #[test]
    fn include_in_types_block() {
        let dir = TempDir::new();
        dir.write("mime.types", "types {\n text/html html;\n}\n");
        dir.write("more.types", "image/png png;\n");
        let main = dir.write(
            "nginx.conf",
            "http {\n include mime.types;\n types { include more.types; }\n}\n",
        );
        let tree = parse_file(&main, &dir.0).unwrap();
        let http = tree.directives[0].block.as_ref().unwrap();
        assert_eq!(http[0].name, "types");
        assert_eq!(http[0].block.as_ref().unwrap()[0].name, "text/html");
        let types = http[1].block.as_ref().unwrap();
        assert_eq!(types[0].name, "image/png");
        assert_eq!(values(&types[0]), ["png"]);
    }

    #[test]
    fn include_glob() {
        let dir = TempDir::new();
        dir.write("conf.d/b.conf", "b;");
        dir.write("conf.d/a.conf", "a;");
        dir.write("conf.d/c.txt", "c;");
        dir.write("conf.d/.hidden.conf", "hidden;");
        let main = dir.write(
            "nginx.conf",
            "include conf.d/*.conf;\ninclude none/*.conf;\ninclude conf.d/[ab].conf;\n",
        );
        let tree = parse_file(&main, &dir.0).unwrap();
        let names: Vec<&str> = tree.directives.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "a", "b"]);
        // Each file recorded once, in reading order.
        assert_eq!(tree.files.len(), 3);
        assert_eq!(tree.files[1].0, dir.0.join("conf.d/a.conf"));
        assert_eq!(tree.files[2].0, dir.0.join("conf.d/b.conf"));
    }

    #[test]
    fn include_errors() {
        let dir = TempDir::new();
        let missing = dir.0.join("missing.conf");
        let main = dir.write("nginx.conf", "a;\n\ninclude missing.conf;\n");
        let e = parse_file(&main, &dir.0).unwrap_err();
        assert_eq!(
            e.msg,
            format!(
                "open() \"{}\" failed (2: No such file or directory)",
                missing.display()
            )
        );
        assert_eq!(e.file.as_deref(), Some(main.as_path()));
        assert_eq!(e.line, 3);

        // Errors inside an included file point into that file.
        let bad = dir.write("bad.conf", "x;\ny \"z\"w;\n");
        let main = dir.write("main2.conf", "include bad.conf;\n");
        let e = parse_file(&main, &dir.0).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("unexpected \"w\" in {}:2", bad.display())
        );

        // A block may not span files.
        dir.write("open.conf", "http {\n");
        let main = dir.write("main3.conf", "include open.conf;\n}\n");
        let e = parse_file(&main, &dir.0).unwrap_err();
        assert_eq!(e.msg, "unexpected end of file, expecting \"}\"");

        assert_eq!(
            err("include;"),
            "invalid number of arguments in \"include\" directive in t.conf:1"
        );
        assert_eq!(
            err("include a b;"),
            "invalid number of arguments in \"include\" directive in t.conf:1"
        );
        assert_eq!(
            err("include a {}"),
            "directive \"include\" is not terminated by \";\" in t.conf:1"
        );
    }

    #[test]
    fn include_recursion() {
        let dir = TempDir::new();
        let main = dir.write("loop.conf", "x;\ninclude loop.conf;\n");
        let e = parse_file(&main, &dir.0).unwrap_err();
        assert!(e.msg.contains("probably recursive"), "{e}");
        assert_eq!(e.file.as_deref(), Some(main.as_path()));
        assert_eq!(e.line, 2);
    }

    #[test]
    fn main_file_errors() {
        let dir = TempDir::new();
        let missing = dir.0.join("nope.conf");
        let e = parse_file(&missing, &dir.0).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "open() \"{}\" failed (2: No such file or directory)",
                missing.display()
            )
        );
        assert_eq!(e.file, None);
        // A directory opens but cannot be read.
        let e = parse_file(&dir.0, &dir.0).unwrap_err();
        assert!(e.msg.starts_with("pread() \""), "{e}");
        assert!(e.msg.ends_with("failed (21: Is a directory)"), "{e}");
    }

    #[test]
    fn parse_str_with_includes() {
        let dir = TempDir::new();
        let inc = dir.write("extra.conf", "worker_processes 4;\n");
        let mut tree = Tree::default();
        let file = Arc::new(PathBuf::from("command line"));
        let ds = parse_str("daemon off; include extra.conf;", file, &dir.0, &mut tree).unwrap();
        assert_eq!(ds.len(), 2);
        assert_eq!(*ds[0].file, PathBuf::from("command line"));
        assert_eq!(*ds[1].file, inc);
        assert_eq!(tree.files.len(), 1);
        assert_eq!(tree.files[0].0, inc);
        let e = parse_str(
            "daemon",
            Arc::new(PathBuf::from("command line")),
            &dir.0,
            &mut tree,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "unexpected end of file, expecting \";\" or \"}\" in command line"
        );
    }

    #[test]
    fn non_utf8_file_is_read_lossily() {
        let dir = TempDir::new();
        let p = dir.0.join("latin1.conf");
        fs::write(&p, b"# caf\xe9\na b;\n").unwrap();
        let tree = parse_file(&p, &dir.0).unwrap();
        assert_eq!(values(&tree.directives[0]), ["b"]);
    }
}
