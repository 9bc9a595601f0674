//! The directive registry: every module declares a table of
//! [`Spec`] rows (name, allowed contexts, argument count, setter) beside its
//! code, as nginx modules do. The compiler looks a directive up by name,
//! checks context and argument count here ([`Index::find`]), then calls
//! the setter, which writes typed fields of that module's configuration
//! struct. The `stream` and `mail` blocks use the same rows, index and
//! checks with setter enums of their own ([`Spec`]'s `S`).

use std::collections::HashMap;

use super::{ConfError, ConfResult, Directive};
use crate::core::conf::{Compiler, MainConf};
use crate::http::conf::{HttpMain, LocConf, SrvConf};

/// Contexts a directive may appear in (bit flags, as nginx's NGX_*_CONF).
pub mod ctx {
    pub const MAIN: u32 = 1 << 0;
    pub const EVENTS: u32 = 1 << 1;
    pub const HTTP: u32 = 1 << 2;
    pub const SRV: u32 = 1 << 3;
    pub const LOC: u32 = 1 << 4;
    /// `if` inside `server`.
    pub const SIF: u32 = 1 << 5;
    /// `if` inside `location`.
    pub const LIF: u32 = 1 << 6;
    pub const LMT: u32 = 1 << 7;
    pub const UPS: u32 = 1 << 8;
    pub const STREAM: u32 = 1 << 9;
    pub const STREAM_SRV: u32 = 1 << 10;
    pub const STREAM_UPS: u32 = 1 << 11;
    pub const MAIL: u32 = 1 << 12;
    pub const MAIL_SRV: u32 = 1 << 13;
    /// http, server and location: the usual home of a location-level directive.
    pub const HSL: u32 = HTTP | SRV | LOC;
}

/// How many arguments a directive takes (nginx's NGX_CONF_TAKE*, FLAG, 1MORE...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Args {
    /// Exactly the counts whose bits are set: bit n = n arguments allowed.
    Take(u32),
    /// `on` or `off`.
    Flag,
    AtLeast(usize),
    Any,
}

impl Args {
    pub const fn take(n: u32) -> Args {
        Args::Take(1 << n)
    }
    pub const fn take12() -> Args {
        Args::Take(0b110)
    }
    pub const fn take123() -> Args {
        Args::Take(0b1110)
    }
    pub const fn take1234() -> Args {
        Args::Take(0b11110)
    }
    pub const fn take23() -> Args {
        Args::Take(0b1100)
    }
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Args::Take(mask) => n < 32 && mask & (1 << n) != 0,
            Args::Flag => n == 1,
            Args::AtLeast(m) => n >= m,
            Args::Any => true,
        }
    }
}

/// Which configuration struct a setter fills.
#[derive(Clone, Copy)]
pub enum Setter {
    /// Main (top-level or `events`) directives.
    Main(fn(&mut MainConf, &Directive, &mut Compiler) -> ConfResult<()>),
    /// `http`-level-only state shared by all servers (log_format, map, upstream...).
    HttpMain(fn(&mut HttpMain, &Directive, &mut Compiler) -> ConfResult<()>),
    /// Server-level state (listen, server_name...).
    Srv(fn(&mut SrvConf, &Directive, &mut Compiler) -> ConfResult<()>),
    /// Location-level state; at http/server level it fills the inherited defaults.
    Loc(fn(&mut LocConf, &Directive, &mut Compiler) -> ConfResult<()>),
    /// Like `HttpMain`, for a directive that takes a `{}` block (map, split_clients...).
    HttpMainBlock(fn(&mut HttpMain, &Directive, &mut Compiler) -> ConfResult<()>),
    /// Like `Loc`, for a directive that takes a `{}` block (types).
    LocBlock(fn(&mut LocConf, &Directive, &mut Compiler) -> ConfResult<()>),
    /// A block directive handled by the compiler itself (http, server, location, if...).
    Block,
    /// Recognised, but tern does not implement it yet: a startup error naming it.
    Unsupported,
}

/// One row of a module's directive table. `S` is what the row's setter
/// fills: [`Setter`] for the main, `events` and `http` contexts; the
/// `stream` and `mail` blocks have setter enums of their own (their
/// directives fill their own structs), with the same rows, lookup and
/// checks.
#[derive(Clone, Copy)]
pub struct Spec<S = Setter> {
    pub name: &'static str,
    pub ctx: u32,
    pub args: Args,
    pub set: S,
}

/// What the lookup needs to know of a row's setter.
pub trait Set: Copy {
    /// The directive takes a `{}` block instead of ending with `;`.
    fn takes_block(&self) -> bool;
    /// nginx has the directive, tern does not yet: a startup error
    /// naming it.
    fn unsupported(&self) -> bool;
}

impl Set for Setter {
    fn takes_block(&self) -> bool {
        matches!(
            self,
            Setter::Block | Setter::HttpMainBlock(_) | Setter::LocBlock(_)
        )
    }
    fn unsupported(&self) -> bool {
        matches!(self, Setter::Unsupported)
    }
}

/// The rows of a set of tables by name (a name may have a row per
/// context), built once.
pub struct Index<S>(HashMap<&'static str, Vec<Spec<S>>>);

impl<S: Set> Index<S> {
    /// Rows of the same name keep the order of the tables: the first
    /// one allowed in a context wins.
    pub fn new<'a>(tables: impl IntoIterator<Item = &'a [Spec<S>]>) -> Index<S>
    where
        S: 'a,
    {
        let mut m: HashMap<&'static str, Vec<Spec<S>>> = HashMap::new();
        for t in tables {
            for s in t {
                m.entry(s.name).or_default().push(*s);
            }
        }
        Index(m)
    }

    /// Whether some table has a row named `name`.
    pub fn knows(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The row for `d` in context `here`, with nginx's checks and
    /// wording: unknown (or, when `elsewhere` knows the name, a
    /// directive of another block: not allowed here), not allowed in
    /// this context, not supported by tern, block or `;`, argument
    /// count.
    pub fn find(
        &self,
        d: &Directive,
        here: u32,
        elsewhere: impl FnOnce(&str) -> bool,
    ) -> ConfResult<Spec<S>> {
        let not_allowed =
            || ConfError::at(format!("\"{}\" directive is not allowed here", d.name), d);
        let Some(rows) = self.0.get(d.name.as_str()) else {
            if elsewhere(&d.name) {
                return Err(not_allowed());
            }
            return Err(ConfError::at(
                format!("unknown directive \"{}\"", d.name),
                d,
            ));
        };
        let Some(spec) = rows.iter().find(|s| s.ctx & here != 0) else {
            return Err(not_allowed());
        };
        if spec.set.unsupported() {
            return Err(ConfError::at(
                format!("\"{}\" directive is not supported by tern yet", d.name),
                d,
            ));
        }
        if !spec.set.takes_block() && d.block.is_some() {
            return Err(ConfError::at(
                format!("directive \"{}\" is not terminated by \";\"", d.name),
                d,
            ));
        }
        if spec.set.takes_block() && d.block.is_none() {
            return Err(ConfError::at(
                format!("directive \"{}\" has no opening \"{{\"", d.name),
                d,
            ));
        }
        if !spec.args.accepts(d.args.len()) {
            return Err(invalid_args(d));
        }
        Ok(*spec)
    }
}

/// A table row, as `Spec { name, ctx, args, set }` in one line.
macro_rules! row {
    ($name:expr, $ctx:expr, $args:expr, $set:expr) => {
        $crate::config::registry::Spec {
            name: $name,
            ctx: $ctx,
            args: $args,
            set: $set,
        }
    };
}
pub(crate) use row;

/// `on`/`off` argument of a `Flag` directive, with nginx's error wording.
pub fn flag(d: &Directive) -> ConfResult<bool> {
    match d.args.first().map(|a| a.value.as_str()) {
        Some(v) if v.eq_ignore_ascii_case("on") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("off") => Ok(false),
        Some(v) => Err(ConfError::at(
            format!(
                "invalid value \"{}\" in \"{}\" directive, it must be \"on\" or \"off\"",
                v, d.name
            ),
            d,
        )),
        None => Err(invalid_args(d)),
    }
}

/// `invalid number of arguments in "X" directive`.
pub fn invalid_args(d: &Directive) -> ConfError {
    ConfError::at(
        format!("invalid number of arguments in \"{}\" directive", d.name),
        d,
    )
}

/// `"X" directive is duplicate`.
pub fn duplicate(d: &Directive) -> ConfError {
    ConfError::at(format!("\"{}\" directive is duplicate", d.name), d)
}

/// `invalid value "V" in "X" directive`.
pub fn invalid_value(d: &Directive, v: &str) -> ConfError {
    ConfError::at(
        format!("invalid value \"{}\" in \"{}\" directive", v, d.name),
        d,
    )
}

/// `"X" directive invalid value`: nginx's wording when a generic size,
/// time or buffer argument does not parse.
pub fn slot_invalid(d: &Directive) -> ConfError {
    ConfError::at(format!("\"{}\" directive invalid value", d.name), d)
}

/// `"X" directive invalid number`: a generic number argument.
pub fn slot_invalid_number(d: &Directive) -> ConfError {
    ConfError::at(format!("\"{}\" directive invalid number", d.name), d)
}

/// Argument `i` as nginx's size slot (`k`/`m`/`g`), or its error.
pub fn size_arg(d: &Directive, i: usize) -> ConfResult<u64> {
    super::value::size(arg(d, i)).ok_or_else(|| slot_invalid(d))
}

/// Argument `i` as nginx's off_t slot (`client_max_body_size`, ...):
/// a size that also takes `g`/`G`.
pub fn offset_arg(d: &Directive, i: usize) -> ConfResult<u64> {
    super::value::offset(arg(d, i)).ok_or_else(|| slot_invalid(d))
}

/// Argument `i` as nginx's msec slot (a time in milliseconds).
pub fn msec_arg(d: &Directive, i: usize) -> ConfResult<u64> {
    super::value::time_ms(arg(d, i)).ok_or_else(|| slot_invalid(d))
}

/// Argument `i` as nginx's sec slot (a time in seconds).
pub fn sec_arg(d: &Directive, i: usize) -> ConfResult<u64> {
    super::value::time_secs(arg(d, i)).ok_or_else(|| slot_invalid(d))
}

/// Argument `i` as nginx's num slot (a plain decimal number).
pub fn num_arg(d: &Directive, i: usize) -> ConfResult<u64> {
    super::value::number(arg(d, i)).ok_or_else(|| slot_invalid_number(d))
}

/// `invalid value "V"`: an argument outside a fixed set of words.
pub fn enum_invalid(d: &Directive, v: &str) -> ConfError {
    ConfError::at(format!("invalid value \"{}\"", v), d)
}

/// Sets an `Option` once; a second time is nginx's "is duplicate".
pub fn set_once<T>(slot: &mut Option<T>, v: T, d: &Directive) -> ConfResult<()> {
    if slot.is_some() {
        return Err(duplicate(d));
    }
    *slot = Some(v);
    Ok(())
}

/// The argument at `i` (already checked by the arg count).
pub fn arg(d: &Directive, i: usize) -> &str {
    d.args.get(i).map(|a| a.value.as_str()).unwrap_or("")
}
