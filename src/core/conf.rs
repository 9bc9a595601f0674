//! Main-context configuration, the compiled [`Config`], and the compiler
//! that walks a parsed [`Tree`] through the directive registry.
//!
//! Flow: `load()` parses the file (plus `-g` directives), then
//! [`Compiler::block`] visits each directive: it finds the registry row
//! whose name matches and whose contexts include the current one, checks
//! the argument count and block shape, and calls the row's setter. Block
//! directives of the core (`events`, `http`, `stream`) recurse here; `http`
//! hands over to [`crate::http::conf`], `stream` to [`crate::stream::conf`],
//! which keeps its own directive table. Errors carry `file:line` in nginx wording.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::config::registry::{self, arg, ctx, flag, set_once, Args, Index, Setter, Spec};
use crate::config::{parse, value, ConfError, ConfResult, Directive, Tree};

/// An `error_log` destination and level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorLogSpec {
    pub dest: crate::core::log::LogDest,
    pub level: crate::core::log::Level,
}

/// Directives of the main and `events` contexts.
#[derive(Debug, Clone, Default)]
pub struct MainConf {
    pub worker_processes: Option<usize>,
    pub worker_rlimit_nofile: Option<u64>,
    pub worker_connections: Option<usize>,
    pub multi_accept: Option<bool>,
    pub accept_mutex: Option<bool>,
    pub pid: Option<PathBuf>,
    pub error_log: Vec<ErrorLogSpec>,
    pub daemon: Option<bool>,
    pub master_process: Option<bool>,
    pub user: Option<(String, Option<String>)>,
    pub worker_shutdown_timeout_ms: Option<u64>,
    pub cpu_affinity: Option<crate::core::affinity::CpuAffinity>,
    pub events_seen: bool,
    pub io: crate::io::IoMain,
}

impl MainConf {
    pub fn workers(&self) -> usize {
        self.worker_processes.unwrap_or(1).max(1)
    }
    pub fn connections(&self) -> usize {
        self.worker_connections.unwrap_or(512)
    }
}

/// The whole compiled configuration; swapped atomically on reload.
#[derive(Debug)]
pub struct Config {
    pub main: MainConf,
    pub http: Option<Arc<crate::http::conf::HttpConf>>,
    pub stream: Option<Arc<crate::stream::conf::StreamConf>>,
    pub mail: Option<Arc<crate::mail::conf::MailConf>>,
    pub tree: Tree,
    pub prefix: PathBuf,
    pub conf_file: PathBuf,
    /// nginx's `[warn]` lines of the configuration check: printed by `-t`
    /// between "syntax is ok" and "test is successful", logged at start
    /// and reload.
    pub warnings: Vec<String>,
    /// Warnings of [`crate::core::lint`] for known-exploitable settings:
    /// shown like `warnings`, except under `-q` or `config_lint off`.
    pub lint: Vec<String>,
}

/// State available to directive setters while compiling.
#[derive(Debug, Default)]
pub struct Compiler {
    /// `-p` prefix, with a trailing slash.
    pub prefix: PathBuf,
    /// Directory of the main config file (base of `include`).
    pub conf_prefix: PathBuf,
    /// Directive names met in the file but not implemented yet.
    pub unsupported: Vec<String>,
    /// Variables of the http block (builtin and user-defined).
    pub vars: crate::http::vars::VarTable,
    /// The main level's thread pools, for locations' `aio threads=NAME`
    /// (known before the http block is compiled).
    pub io_main: crate::io::IoMain,
    /// See [`Config::warnings`].
    pub warnings: Vec<String>,
    /// The first error nginx finds only when it merges the levels of the
    /// `http` block, which it does once the whole block is read: reported
    /// at the block's closing line after the block compiled, so that
    /// errors in directives anywhere in it come first, as in nginx.
    pub merge_error: Option<String>,
}

impl Compiler {
    /// Compiles a string with `$var`s into a template, in nginx's wording on error.
    pub fn template(&mut self, s: &str, d: &Directive) -> ConfResult<crate::http::vars::Template> {
        let before = self.vars.len();
        let t = crate::http::vars::Template::compile(s, &mut self.vars)
            .map_err(|m| ConfError::at(m, d))?;
        self.vars.mentioned_since(before, d);
        Ok(t)
    }
}

impl Compiler {
    /// A path from the config, relative to the prefix as nginx resolves it.
    pub fn path(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.prefix.join(p)
        }
    }

    /// Walks the directives of one block in context `here`.
    pub fn block<T>(
        &mut self,
        dirs: &[Directive],
        here: u32,
        target: &mut T,
        apply: &mut dyn FnMut(&mut Self, &mut T, &Directive, &Spec) -> ConfResult<()>,
    ) -> ConfResult<()> {
        for d in dirs {
            // lookup() refuses what tern does not support.
            let spec = lookup(d, here)?;
            apply(self, target, d, &spec)?;
        }
        Ok(())
    }
}

/// All modules' directive tables. The order is irrelevant: names are unique
/// per context.
fn tables() -> impl Iterator<Item = &'static [Spec]> {
    [
        MAIN_DIRECTIVES,
        crate::core::lint::DIRECTIVES,
        crate::core::log::DIRECTIVES,
        crate::io::DIRECTIVES,
        crate::http::conf::DIRECTIVES,
        UNSUPPORTED,
    ]
    .into_iter()
    .chain(crate::http::modules::TABLES.iter().copied())
}

fn index() -> &'static Index<Setter> {
    static INDEX: OnceLock<Index<Setter>> = OnceLock::new();
    INDEX.get_or_init(|| Index::new(tables()))
}

/// Every directive name tern recognises (for `-V`-style listings and tests).
pub fn known_directive(name: &str) -> bool {
    index().knows(name) || crate::stream::conf::known(name) || crate::mail::conf::known(name)
}

/// Finds the registry row for `d` in context `here`, with nginx's checks
/// (a stream or mail directive outside its block is "not allowed here").
pub fn lookup(d: &Directive, here: u32) -> ConfResult<Spec> {
    index().find(d, here, |name| {
        crate::stream::conf::known(name) || crate::mail::conf::known(name)
    })
}

/// Reads and compiles a configuration.
pub fn load(conf_file: &Path, prefix: &Path, extra: Option<&str>) -> ConfResult<Config> {
    let conf_prefix = conf_file
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| prefix.to_path_buf());
    let mut tree = parse::parse_file(conf_file, &conf_prefix)?;
    if let Some(g) = extra {
        let mut dirs = parse_globals(g, &conf_prefix, &mut tree)?;
        // nginx applies `-g` before the file, so a directive set in both is
        // reported as a duplicate at its line in the file.
        dirs.append(&mut tree.directives);
        tree.directives = dirs;
    }
    compile(tree, prefix, &conf_prefix, conf_file)
}

/// Parses `-g` text with nginx's wording for its two special errors.
fn parse_globals(g: &str, conf_prefix: &Path, tree: &mut Tree) -> ConfResult<Vec<Directive>> {
    let dirs = parse::parse_str(
        g,
        Arc::new(PathBuf::from("command line")),
        conf_prefix,
        tree,
    )
    .map_err(|mut e| {
        if e.msg.starts_with("unexpected end of file") {
            e.msg = "unexpected end of parameter, expecting \";\"".into();
        }
        e
    })?;
    if let Some(d) = dirs.iter().find(|d| d.block.is_some()) {
        return Err(ConfError::at(
            "block directives are not supported in -g option".to_string(),
            d,
        ));
    }
    Ok(dirs)
}

/// Compiles an already parsed tree.
pub fn compile(
    tree: Tree,
    prefix: &Path,
    conf_prefix: &Path,
    conf_file: &Path,
) -> ConfResult<Config> {
    let mut cx = Compiler {
        prefix: prefix.to_path_buf(),
        conf_prefix: conf_prefix.to_path_buf(),
        unsupported: Vec::new(),
        vars: Default::default(),
        io_main: Default::default(),
        warnings: Vec::new(),
        merge_error: None,
    };
    let mut main = MainConf::default();
    let mut http: Option<Arc<crate::http::conf::HttpConf>> = None;
    let dirs = tree.directives.clone();
    let mut http_dir: Option<Directive> = None;
    let mut stream_dir: Option<Directive> = None;
    let mut mail_dir: Option<Directive> = None;
    cx.block(
        &dirs,
        ctx::MAIN,
        &mut main,
        &mut |cx, main, d, spec| match spec.set {
            Setter::Main(f) => f(main, d, cx),
            Setter::Block => match d.name.as_str() {
                "events" => {
                    if main.events_seen {
                        return Err(registry::duplicate(d));
                    }
                    main.events_seen = true;
                    let kids = d.block.as_deref().unwrap_or(&[]);
                    cx.block(
                        kids,
                        ctx::EVENTS,
                        main,
                        &mut |cx, main, d, spec| match spec.set {
                            Setter::Main(f) => f(main, d, cx),
                            _ => Err(ConfError::at(
                                format!("\"{}\" directive is not allowed here", d.name),
                                d,
                            )),
                        },
                    )
                }
                "http" => {
                    if http_dir.is_some() {
                        return Err(registry::duplicate(d));
                    }
                    http_dir = Some(d.clone());
                    Ok(())
                }
                "stream" => {
                    if stream_dir.is_some() {
                        return Err(registry::duplicate(d));
                    }
                    stream_dir = Some(d.clone());
                    Ok(())
                }
                "mail" => {
                    if mail_dir.is_some() {
                        return Err(registry::duplicate(d));
                    }
                    mail_dir = Some(d.clone());
                    Ok(())
                }
                _ => Err(ConfError::at(
                    format!("\"{}\" directive is not allowed here", d.name),
                    d,
                )),
            },
            _ => Err(ConfError::at(
                format!("\"{}\" directive is not allowed here", d.name),
                d,
            )),
        },
    )?;
    if let Some(w) = main
        .cpu_affinity
        .as_ref()
        .and_then(|a| a.mismatch_warning(main.workers()))
    {
        cx.warnings.push(w.to_string());
    }
    if !main.events_seen {
        let file = conf_file.to_path_buf();
        return Err(ConfError {
            msg: "no \"events\" section in configuration".into(),
            file: Some(file),
            line: tree.files.first().map(|f| f.1.lines().count()).unwrap_or(0),
        }
        .without_location());
    }
    if let Some(d) = http_dir {
        cx.io_main = main.io.clone();
        http = Some(Arc::new(crate::http::conf::compile_http(
            &d, &mut cx, &main,
        )?));
    }
    let stream = match stream_dir {
        Some(d) => Some(Arc::new(crate::stream::conf::compile_stream(&d, &mut cx)?)),
        None => None,
    };
    let mail = match mail_dir {
        Some(d) => Some(Arc::new(crate::mail::conf::compile_mail(&d, &mut cx)?)),
        None => None,
    };
    let lint = crate::core::lint::check(&tree.directives);
    Ok(Config {
        main,
        http,
        stream,
        mail,
        lint,
        tree,
        prefix: prefix.to_path_buf(),
        conf_file: conf_file.to_path_buf(),
        warnings: cx.warnings,
    })
}

impl ConfError {
    /// nginx reports some errors without a location.
    pub fn without_location(mut self) -> Self {
        self.file = None;
        self
    }
}

/// A number argument; nginx words the error per directive kind.
fn positive(d: &Directive, s: &str) -> ConfResult<usize> {
    value::number(s).map(|n| n as usize).ok_or_else(|| {
        if d.name == "worker_processes" {
            registry::slot_invalid(d)
        } else {
            registry::slot_invalid_number(d)
        }
    })
}

fn set_worker_processes(m: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = arg(d, 0);
    let n = if v == "auto" {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        positive(d, v)?
    };
    set_once(&mut m.worker_processes, n, d)
}

fn set_rlimit(m: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = positive(d, arg(d, 0))? as u64;
    set_once(&mut m.worker_rlimit_nofile, n, d)
}

fn set_worker_connections(m: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let n = positive(d, arg(d, 0))?;
    set_once(&mut m.worker_connections, n, d)
}

fn set_multi_accept(m: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut m.multi_accept, v, d)
}

fn set_accept_mutex(m: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut m.accept_mutex, v, d)
}

fn set_use(_: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    match arg(d, 0) {
        "epoll" => Ok(()),
        v => Err(ConfError::at(format!("invalid event type \"{}\"", v), d)),
    }
}

fn set_pid(m: &mut MainConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let p = cx.path(arg(d, 0));
    set_once(&mut m.pid, p, d)
}

fn set_daemon(m: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut m.daemon, v, d)
}

fn set_master(m: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut m.master_process, v, d)
}

fn set_user(m: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let group = d.args.get(1).map(|a| a.value.clone());
    set_once(&mut m.user, (arg(d, 0).to_string(), group), d)
}

fn set_shutdown_timeout(m: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = value::time_ms(arg(d, 0)).ok_or_else(|| registry::slot_invalid(d))?;
    set_once(&mut m.worker_shutdown_timeout_ms, v, d)
}

fn set_ignored_main(_: &mut MainConf, _: &Directive, _: &mut Compiler) -> ConfResult<()> {
    Ok(())
}

/// Accepted without effect (no accept mutex), but its time is checked.
fn check_accept_mutex_delay(_: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    registry::msec_arg(d, 0).map(drop)
}

const MAIN_DIRECTIVES: &[Spec] = &[
    Spec {
        name: "worker_processes",
        ctx: ctx::MAIN,
        args: Args::take(1),
        set: Setter::Main(set_worker_processes),
    },
    Spec {
        name: "worker_rlimit_nofile",
        ctx: ctx::MAIN,
        args: Args::take(1),
        set: Setter::Main(set_rlimit),
    },
    Spec {
        name: "worker_shutdown_timeout",
        ctx: ctx::MAIN,
        args: Args::take(1),
        set: Setter::Main(set_shutdown_timeout),
    },
    Spec {
        name: "pid",
        ctx: ctx::MAIN,
        args: Args::take(1),
        set: Setter::Main(set_pid),
    },
    Spec {
        name: "daemon",
        ctx: ctx::MAIN,
        args: Args::Flag,
        set: Setter::Main(set_daemon),
    },
    Spec {
        name: "master_process",
        ctx: ctx::MAIN,
        args: Args::Flag,
        set: Setter::Main(set_master),
    },
    Spec {
        name: "user",
        ctx: ctx::MAIN,
        args: Args::take12(),
        set: Setter::Main(set_user),
    },
    // Accepted for compatibility: tern's workers are threads and need no lock file.
    Spec {
        name: "lock_file",
        ctx: ctx::MAIN,
        args: Args::take(1),
        set: Setter::Main(set_ignored_main),
    },
    Spec {
        name: "events",
        ctx: ctx::MAIN,
        args: Args::take(0),
        set: Setter::Block,
    },
    Spec {
        name: "http",
        ctx: ctx::MAIN,
        args: Args::take(0),
        set: Setter::Block,
    },
    Spec {
        name: "stream",
        ctx: ctx::MAIN,
        args: Args::take(0),
        set: Setter::Block,
    },
    Spec {
        name: "mail",
        ctx: ctx::MAIN,
        args: Args::take(0),
        set: Setter::Block,
    },
    Spec {
        name: "worker_connections",
        ctx: ctx::EVENTS,
        args: Args::take(1),
        set: Setter::Main(set_worker_connections),
    },
    Spec {
        name: "multi_accept",
        ctx: ctx::EVENTS,
        args: Args::Flag,
        set: Setter::Main(set_multi_accept),
    },
    // With one reuseport socket per worker, or one shared socket watched by
    // every worker thread, there is no accept lock to take: accepted, moot.
    Spec {
        name: "accept_mutex",
        ctx: ctx::EVENTS,
        args: Args::Flag,
        set: Setter::Main(set_accept_mutex),
    },
    Spec {
        name: "accept_mutex_delay",
        ctx: ctx::EVENTS,
        args: Args::take(1),
        set: Setter::Main(check_accept_mutex_delay),
    },
    Spec {
        name: "use",
        ctx: ctx::EVENTS,
        args: Args::take(1),
        set: Setter::Main(set_use),
    },
];

/// Directives nginx has that tern recognises but does not implement yet:
/// a config that uses one is refused at startup, naming it.
const UNSUPPORTED: &[Spec] = &[
    Spec {
        name: "env",
        ctx: ctx::MAIN,
        args: Args::take(1),
        set: Setter::Unsupported,
    },
    // Modules are built into tern: a distribution's `load_module` lines
    // (Debian's modules-enabled/*.conf) name nothing tern needs to load.
    // A module tern lacks shows up as its directives being refused.
    Spec {
        name: "load_module",
        ctx: ctx::MAIN,
        args: Args::take(1),
        set: Setter::Main(set_ignored_main),
    },
    Spec {
        name: "worker_cpu_affinity",
        ctx: ctx::MAIN,
        args: Args::AtLeast(1),
        set: Setter::Main(crate::core::affinity::set_worker_cpu_affinity),
    },
    Spec {
        name: "worker_priority",
        ctx: ctx::MAIN,
        args: Args::take(1),
        set: Setter::Unsupported,
    },
];

/// A file path relative to the prefix, for directives of other modules.
pub fn prefix_path(cx: &Compiler, p: &str) -> PathBuf {
    cx.path(p)
}

/// The configuration used when no file is given and none is installed:
/// serve `./html` (or the current directory) on 127.0.0.1:8080.
pub fn embedded_text(dir: &Path) -> String {
    format!(
        "# tern's embedded default configuration\n\
         daemon off;\n\
         worker_processes auto;\n\
         error_log stderr notice;\n\
         pid /tmp/tern-embedded.pid;\n\
         events {{}}\n\
         http {{\n\
         {mime}\n\
         \x20   default_type application/octet-stream;\n\
         \x20   access_log /dev/stdout;\n\
         \x20   sendfile on;\n\
         \x20   server {{\n\
         \x20       listen 127.0.0.1:8080;\n\
         \x20       root \"{root}\";\n\
         \x20   }}\n\
         }}\n",
        mime = include_str!("../../conf/mime.types"),
        root = dir.display()
    )
}

/// The directory the embedded configuration serves.
pub fn embedded_root(prefix: &Path) -> PathBuf {
    let html = prefix.join("html");
    if html.is_dir() {
        html
    } else {
        prefix.to_path_buf()
    }
}

/// Compiles the embedded configuration.
pub fn load_embedded(prefix: &Path, extra: Option<&str>) -> ConfResult<Config> {
    let name = Arc::new(PathBuf::from("(embedded)"));
    let text = embedded_text(&embedded_root(prefix));
    let mut tree = Tree::default();
    let mut dirs = parse::parse_str(&text, name.clone(), prefix, &mut tree)?;
    tree.files.insert(0, ((*name).clone(), text));
    if let Some(g) = extra {
        let mut g = parse_globals(g, prefix, &mut tree)?;
        g.append(&mut dirs);
        dirs = g;
    }
    tree.directives = dirs;
    compile(tree, prefix, prefix, &name)
}
