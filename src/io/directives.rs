//! Directive table of the I/O layer: one row per directive, each setter
//! fills one field of [`IoMain`](super::IoMain) or [`IoLoc`](super::IoLoc).
//!
//! Error wording follows nginx: a slot handler's `return "invalid value"`
//! becomes `"NAME" directive invalid value`, a second occurrence
//! `"NAME" directive is duplicate`; `thread_pool` has its own messages
//! (`duplicate thread pool "X"`, `invalid threads value "threads=x"`, ...).
//!
//! Deliberate difference: nginx silently ignores an unknown `thread_pool`
//! parameter (`max_queu=10`); tern rejects it with `invalid parameter "X"`.

use std::sync::Arc;

use super::conf::{AioConf, PoolConf};
use crate::config::registry::{arg, ctx, duplicate, flag, set_once, Args, Setter, Spec};
use crate::config::value::{offset, size};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::{Compiler, MainConf};
use crate::http::conf::LocConf;

/// The I/O layer's directives.
pub static DIRECTIVES: &[Spec] = &[
    Spec {
        name: "thread_pool",
        ctx: ctx::MAIN,
        args: Args::take23(),
        set: Setter::Main(thread_pool),
    },
    Spec {
        name: "aio",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(aio),
    },
    Spec {
        name: "aio_write",
        ctx: ctx::HSL,
        args: Args::Flag,
        set: Setter::Loc(aio_write),
    },
    Spec {
        name: "directio",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(directio),
    },
    Spec {
        name: "directio_alignment",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(directio_alignment),
    },
    Spec {
        name: "sendfile_max_chunk",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(sendfile_max_chunk),
    },
    Spec {
        name: "read_ahead",
        ctx: ctx::HSL,
        args: Args::take(1),
        set: Setter::Loc(read_ahead),
    },
    Spec {
        name: "output_buffers",
        ctx: ctx::HSL,
        args: Args::take(2),
        set: Setter::Loc(output_buffers),
    },
];

/// nginx's `"NAME" directive invalid value` (a slot handler returning
/// the string "invalid value").
fn invalid(d: &Directive) -> ConfError {
    ConfError::at(format!("\"{}\" directive invalid value", d.name), d)
}

fn thread_pool(m: &mut MainConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    let name = arg(d, 0);
    if m.io.pool(name).is_some() {
        return Err(ConfError::at(
            format!("duplicate thread pool \"{}\"", name),
            d,
        ));
    }
    let mut threads = 0usize;
    let mut max_queue = super::conf::DEFAULT_MAX_QUEUE;
    for a in d.args.iter().skip(1).map(|a| a.value.as_str()) {
        if let Some(v) = a.strip_prefix("threads=") {
            threads = match v.parse::<usize>() {
                Ok(n) if n > 0 && v.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => return Err(ConfError::at(format!("invalid threads value \"{}\"", a), d)),
            };
        } else if let Some(v) = a.strip_prefix("max_queue=") {
            max_queue = match v.parse::<usize>() {
                Ok(n) if v.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => {
                    return Err(ConfError::at(
                        format!("invalid max_queue value \"{}\"", a),
                        d,
                    ))
                }
            };
        } else {
            return Err(ConfError::at(format!("invalid parameter \"{}\"", a), d));
        }
    }
    if threads == 0 {
        return Err(ConfError::at(
            format!("\"{}\" must have \"threads\" parameter", d.name),
            d,
        ));
    }
    m.io.pools.push(PoolConf {
        name: name.to_string(),
        threads,
        max_queue,
        file: Some(Arc::clone(&d.file)),
        line: d.line,
    });
    Ok(())
}

fn aio(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    if l.io.aio.is_some() {
        return Err(duplicate(d));
    }
    let v = arg(d, 0);
    let a = match v {
        "off" => AioConf::Off,
        "on" => AioConf::On,
        "threads" => AioConf::Threads {
            pool: None,
            file: Some(Arc::clone(&d.file)),
            line: d.line,
        },
        _ => match v.strip_prefix("threads=") {
            Some(name) => AioConf::Threads {
                pool: Some(name.to_string()),
                file: Some(Arc::clone(&d.file)),
                line: d.line,
            },
            None => return Err(invalid(d)),
        },
    };
    l.io.aio = Some(a);
    Ok(())
}

fn aio_write(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut l.io.aio_write, v, d)
}

fn directio(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    if l.io.directio.is_some() {
        return Err(duplicate(d));
    }
    let v = arg(d, 0);
    let t = if v == "off" {
        None
    } else {
        Some(offset(v).ok_or_else(|| invalid(d))?)
    };
    l.io.directio = Some(t);
    Ok(())
}

fn directio_alignment(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    let v = offset(arg(d, 0)).ok_or_else(|| invalid(d))?;
    set_once(&mut l.io.directio_alignment, v, d)
}

fn sendfile_max_chunk(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    let v = size(arg(d, 0)).ok_or_else(|| invalid(d))?;
    set_once(&mut l.io.sendfile_max_chunk, v, d)
}

fn read_ahead(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    let v = size(arg(d, 0)).ok_or_else(|| invalid(d))?;
    set_once(&mut l.io.read_ahead, v, d)
}

fn output_buffers(l: &mut LocConf, d: &Directive, _c: &mut Compiler) -> ConfResult<()> {
    if l.io.output_buffers.is_some() {
        return Err(duplicate(d));
    }
    let n = arg(d, 0);
    let num = match n.parse::<usize>() {
        Ok(x) if x > 0 && n.bytes().all(|b| b.is_ascii_digit()) => x,
        _ => return Err(invalid(d)),
    };
    let size = match size(arg(d, 1)).and_then(|s| usize::try_from(s).ok()) {
        Some(s) if s > 0 => s,
        _ => return Err(invalid(d)),
    };
    l.io.output_buffers = Some((num, size));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str, args: &[&str]) -> Directive {
        Directive::for_test(name, args, "/etc/tern/nginx.conf", 7)
    }

    fn spec(name: &str) -> Setter {
        match DIRECTIVES.iter().find(|s| s.name == name) {
            Some(s) => s.set,
            None => panic!("no row {name}"),
        }
    }

    fn loc(l: &mut LocConf, name: &str, args: &[&str]) -> Result<(), String> {
        let d = dir(name, args);
        match spec(name) {
            Setter::Loc(f) => f(l, &d, &mut Compiler::default()).map_err(|e| e.to_string()),
            _ => panic!("not a loc directive"),
        }
    }

    fn main(m: &mut MainConf, args: &[&str]) -> Result<(), String> {
        let d = dir("thread_pool", args);
        match spec("thread_pool") {
            Setter::Main(f) => f(m, &d, &mut Compiler::default()).map_err(|e| e.to_string()),
            _ => panic!("not a main directive"),
        }
    }

    #[test]
    fn thread_pool_rows() {
        let mut m = MainConf::default();
        assert_eq!(main(&mut m, &["one", "threads=4"]), Ok(()));
        assert_eq!(m.io.pools[0].max_queue, 65536);
        assert_eq!(main(&mut m, &["two", "threads=1", "max_queue=0"]), Ok(()));
        assert_eq!(m.io.pools[1].max_queue, 0);
        assert_eq!(
            main(&mut m, &["one", "threads=2"]),
            Err("duplicate thread pool \"one\" in /etc/tern/nginx.conf:7".into())
        );
        assert_eq!(
            main(&mut m, &["x", "threads=0"]),
            Err("invalid threads value \"threads=0\" in /etc/tern/nginx.conf:7".into())
        );
        assert_eq!(
            main(&mut m, &["x", "threads=2", "max_queue=-1"]),
            Err("invalid max_queue value \"max_queue=-1\" in /etc/tern/nginx.conf:7".into())
        );
        assert_eq!(
            main(&mut m, &["x", "max_queue=5"]),
            Err("\"thread_pool\" must have \"threads\" parameter in /etc/tern/nginx.conf:7".into())
        );
        assert!(main(&mut m, &["x", "threads=2", "bogus=1"]).is_err());
        assert_eq!(m.io.effective_pools().len(), 3);
    }

    #[test]
    fn aio_rows() {
        let mut l = LocConf::default();
        assert_eq!(loc(&mut l, "aio", &["threads=pool_$disk"]), Ok(()));
        match &l.io.aio {
            Some(AioConf::Threads { pool: Some(p), .. }) => assert_eq!(p, "pool_$disk"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            loc(&mut l, "aio", &["on"]),
            Err("\"aio\" directive is duplicate in /etc/tern/nginx.conf:7".into())
        );
        let mut l = LocConf::default();
        assert_eq!(
            loc(&mut l, "aio", &["threadsx"]),
            Err("\"aio\" directive invalid value in /etc/tern/nginx.conf:7".into())
        );
        let mut l = LocConf::default();
        assert_eq!(loc(&mut l, "aio", &["threads=nope"]), Ok(()));
        let m = crate::io::IoMain::default();
        assert_eq!(
            m.check_loc(&l.io).map_err(|e| e.to_string()),
            Err("unknown thread pool \"nope\" in /etc/tern/nginx.conf:7".into())
        );
        let mut l = LocConf::default();
        assert_eq!(loc(&mut l, "aio", &["threads"]), Ok(()));
        assert_eq!(m.check_loc(&l.io), Ok(()));
    }

    #[test]
    fn size_rows() {
        let mut l = LocConf::default();
        assert_eq!(loc(&mut l, "directio", &["4m"]), Ok(()));
        assert_eq!(l.io.directio(), Some(4 << 20));
        assert_eq!(loc(&mut l, "directio_alignment", &["4k"]), Ok(()));
        assert_eq!(loc(&mut l, "sendfile_max_chunk", &["512k"]), Ok(()));
        assert_eq!(loc(&mut l, "output_buffers", &["1", "128k"]), Ok(()));
        assert_eq!(l.io.output_buffers(), (1, 131072));
        assert_eq!(loc(&mut l, "aio_write", &["on"]), Ok(()));
        assert!(l.io.aio_write());
        assert_eq!(
            loc(&mut l, "sendfile_max_chunk", &["1m"]),
            Err("\"sendfile_max_chunk\" directive is duplicate in /etc/tern/nginx.conf:7".into())
        );
        let mut l = LocConf::default();
        assert_eq!(loc(&mut l, "directio", &["off"]), Ok(()));
        assert_eq!(l.io.directio, Some(None));
        assert_eq!(
            loc(&mut l, "read_ahead", &["1g"]),
            Err("\"read_ahead\" directive invalid value in /etc/tern/nginx.conf:7".into())
        );
        assert_eq!(
            loc(&mut l, "output_buffers", &["0", "32k"]),
            Err("\"output_buffers\" directive invalid value in /etc/tern/nginx.conf:7".into())
        );
        assert!(loc(&mut l, "aio_write", &["yes"]).is_err());
    }
}
