//! nginx.conf handling: text -> tree -> compiled configuration.
//!
//! Data flow: [`parse::parse_file`] reads the main file, expands `include`
//! in place (globs allowed) and yields a [`Tree`] of [`Directive`]s, each
//! remembering its file and line. [`registry`] holds every module's
//! directive table; [`compile`](crate::core::conf) walks the tree, checks
//! each directive against its table row (context, argument count) and runs
//! the row's setter, which fills typed fields. Nothing downstream looks at
//! strings from the file again.

pub mod parse;
pub mod registry;
pub mod value;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// One argument of a directive as written, after unquoting and escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    pub value: String,
    /// Written in quotes: nginx treats some quoted words differently
    /// (e.g. `if ("$x")`), and `-T` wants to know.
    pub quoted: bool,
}

/// A directive as found in the file: `name args... ;` or `name args... { block }`.
#[derive(Debug, Clone)]
pub struct Directive {
    pub name: String,
    pub args: Vec<Arg>,
    pub block: Option<Vec<Directive>>,
    pub file: Arc<PathBuf>,
    pub line: usize,
    /// The line of its block's closing `}` (0 without a block): where
    /// nginx stands when it reports what it finds while merging the
    /// levels of an `http` block, once the whole block is read.
    pub end: usize,
}

#[cfg(test)]
impl Directive {
    /// A directive as a unit test writes it: unquoted arguments, no
    /// block, at `file:line` (what error messages name).
    pub fn for_test(name: &str, args: &[&str], file: &str, line: usize) -> Directive {
        Directive {
            name: name.to_string(),
            args: args
                .iter()
                .map(|a| Arg {
                    value: a.to_string(),
                    quoted: false,
                })
                .collect(),
            block: None,
            file: Arc::new(PathBuf::from(file)),
            line,
            end: 0,
        }
    }
}

/// Every file read while parsing, in order, with its text (for `-T`).
#[derive(Debug, Clone, Default)]
pub struct Tree {
    pub directives: Vec<Directive>,
    pub files: Vec<(PathBuf, String)>,
}

/// A configuration error worded as nginx words it; `Display` gives
/// `MESSAGE in FILE:LINE` (or just `MESSAGE` without a location).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfError {
    pub msg: String,
    pub file: Option<PathBuf>,
    pub line: usize,
}

impl ConfError {
    pub fn new(msg: impl Into<String>) -> Self {
        ConfError {
            msg: msg.into(),
            file: None,
            line: 0,
        }
    }
    pub fn at(msg: impl Into<String>, d: &Directive) -> Self {
        ConfError {
            msg: msg.into(),
            file: Some((*d.file).clone()),
            line: d.line,
        }
    }
}

impl fmt::Display for ConfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.file {
            // nginx gives no line number for `-g` text.
            Some(p) if p.as_os_str() == "command line" => write!(f, "{} in command line", self.msg),
            Some(p) => write!(f, "{} in {}:{}", self.msg, p.display(), self.line),
            None => write!(f, "{}", self.msg),
        }
    }
}

impl std::error::Error for ConfError {}

pub type ConfResult<T> = Result<T, ConfError>;
