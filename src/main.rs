//! `tern`: the command line, as nginx's (`-c -p -e -g -t -T -q -s -v -V -h`).

use std::path::PathBuf;
use std::process::exit;

use tern::core::master::{self, Source};

/// Where tern looks when neither `-p` nor `-c` is given.
const DEFAULT_PREFIX: &str = "/usr/local/tern/";

fn usage() -> String {
    format!(
        "Usage: tern [-?hvVtTq] [-s signal] [-p prefix]\n\
         \x20            [-e filename] [-c filename] [-g directives]\n\n\
         Options:\n\
         \x20 -?,-h         : this help\n\
         \x20 -v            : show version and exit\n\
         \x20 -V            : show version and configure options then exit\n\
         \x20 -t            : test configuration and exit\n\
         \x20 -T            : test configuration, dump it and exit\n\
         \x20 -q            : suppress non-error messages during configuration testing\n\
         \x20 -s signal     : send signal to a master process: stop, quit, reopen, reload\n\
         \x20 -p prefix     : set prefix path (default: {p})\n\
         \x20 -e filename   : set error log file (default: logs/error.log)\n\
         \x20 -c filename   : set configuration file (default: conf/nginx.conf, else the embedded default)\n\
         \x20 -g directives : set global directives out of configuration file\n",
        p = DEFAULT_PREFIX
    )
}

struct Opts {
    help: bool,
    version: bool,
    configure: bool,
    test: bool,
    dump: bool,
    quiet: bool,
    signal: Option<String>,
    prefix: Option<String>,
    error_log: Option<String>,
    conf: Option<String>,
    globals: Option<String>,
}

fn fail(msg: &str) -> ! {
    eprintln!("tern: {}", msg);
    exit(1)
}

fn parse_args() -> Opts {
    let mut o = Opts {
        help: false,
        version: false,
        configure: false,
        test: false,
        dump: false,
        quiet: false,
        signal: None,
        prefix: None,
        error_log: None,
        conf: None,
        globals: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let Some(flags) = a.strip_prefix('-') else {
            fail(&format!("invalid option: \"{}\"", a))
        };
        for (pos, c) in flags.char_indices() {
            let mut value = |name: &str| -> String {
                let rest = &flags[pos + 1..];
                if !rest.is_empty() {
                    return rest.to_string();
                }
                i += 1;
                match args.get(i) {
                    Some(v) => v.clone(),
                    None => fail(&format!("option \"-{}\" requires {}", c, name)),
                }
            };
            match c {
                '?' | 'h' => o.help = true,
                'v' => o.version = true,
                'V' => {
                    o.version = true;
                    o.configure = true
                }
                't' => o.test = true,
                'T' => {
                    o.test = true;
                    o.dump = true
                }
                'q' => o.quiet = true,
                's' => {
                    let v = value("signal number");
                    if !matches!(v.as_str(), "stop" | "quit" | "reopen" | "reload") {
                        fail(&format!("invalid option: \"-s {}\"", v));
                    }
                    o.signal = Some(v);
                    break;
                }
                'p' => {
                    o.prefix = Some(value("directory name"));
                    break;
                }
                'e' => {
                    o.error_log = Some(value("file name"));
                    break;
                }
                'c' => {
                    o.conf = Some(value("file name"));
                    break;
                }
                'g' => {
                    o.globals = Some(value("directives"));
                    break;
                }
                _ => fail(&format!("invalid option: \"{}\"", &flags[pos..])),
            }
        }
        i += 1;
    }
    o
}

fn main() {
    // Before any thread starts: argv for a later USR2, and the sockets an
    // old binary handed over (their descriptors must not be reused first).
    tern::core::upgrade::record_start();
    let inherited = tern::core::upgrade::Inherited::from_env();
    let o = parse_args();
    if o.version {
        eprintln!(
            "tern version: tern/{} (nginx/{} compatible)",
            tern::http::response::VERSION,
            tern::http::response::NGINX_VERSION
        );
        if o.configure {
            // The OpenSSL release whose observable behaviour tern's TLS
            // follows (error texts, cipher names, chain checks): Debian's
            // nginx 1.22.1 is built with OpenSSL 3.0. Tools that read
            // `-V` for the library (nginx-tests) find it here.
            eprintln!(
                "built with rustls {} (compatible with OpenSSL {})",
                tern::tls::RUSTLS_VERSION,
                tern::tls::OPENSSL_AS
            );
            eprintln!("TLS SNI support enabled");
            eprintln!(
                "configure arguments: {}",
                tern::core::modules::configure_arguments(DEFAULT_PREFIX)
            );
        }
    }
    if o.help {
        eprint!("{}", usage());
    }
    if o.version || o.help {
        exit(0);
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    // As nginx: the prefix is used as given (a relative one from the
    // current directory, which tern never leaves), with or without its
    // trailing slash, and a relative `-c` file is under the prefix, not
    // under the current directory (`-p /srv -c conf/x` is /srv/conf/x).
    let prefix = match &o.prefix {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(DEFAULT_PREFIX),
    };
    let conf_file = match &o.conf {
        Some(c) => Some(prefix.join(c)),
        None => {
            let installed = prefix.join("conf/nginx.conf");
            if installed.exists() {
                Some(installed)
            } else {
                None
            }
        }
    };
    // The embedded default serves the current directory, so its prefix is cwd.
    let prefix = if conf_file.is_none() && o.prefix.is_none() {
        cwd.clone()
    } else {
        prefix
    };
    let error_log = o.error_log.as_ref().map(|e| {
        if e == "stderr" {
            PathBuf::from("stderr")
        } else {
            let p = PathBuf::from(e);
            if p.is_absolute() {
                p
            } else {
                prefix.join(p)
            }
        }
    });
    let src = Source {
        conf_file: conf_file.clone(),
        prefix,
        extra: o.globals.clone(),
        error_log,
    };
    let name = conf_file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "(embedded)".into());
    let cfg = match src.load() {
        Ok(c) => c,
        Err(e) => {
            // nginx checks these after it has declared the syntax ok.
            let after_syntax = e.msg.starts_with("no \"events\" section");
            if o.test && !o.quiet && after_syntax {
                eprintln!("tern: the configuration file {} syntax is ok", name);
            }
            eprintln!("tern: [emerg] {}", e);
            // nginx writes the error to the error log with -t too.
            log_to_error_file(&src, &e.to_string());
            if o.test {
                eprintln!("tern: configuration file {} test failed", name);
            }
            exit(1);
        }
    };
    if let Some(sig) = &o.signal {
        exit(send_signal(&cfg, sig));
    }
    if o.test {
        if !o.quiet {
            eprintln!("tern: the configuration file {} syntax is ok", name);
        }
        for w in &cfg.warnings {
            eprintln!("tern: [warn] {}", w);
        }
        if !o.quiet {
            for w in &cfg.lint {
                eprintln!("tern: [warn] {}", w);
            }
        }
        if !o.quiet {
            eprintln!("tern: configuration file {} test is successful", name);
        }
        if o.dump {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            for (path, text) in &cfg.tree.files {
                let _ = writeln!(out, "# configuration file {}:", path.display());
                let _ = write!(out, "{}", text);
                if !text.ends_with('\n') {
                    let _ = writeln!(out);
                }
                let _ = writeln!(out);
            }
        }
        exit(0);
    }
    if src.conf_file.is_none() {
        if let Some(h) = &cfg.http {
            for a in &h.addrs {
                println!(
                    "tern: serving {} on http://{}/",
                    tern::core::conf::embedded_root(&src.prefix).display(),
                    a.listen.addr
                );
            }
        }
    }
    exit(master::run(src, cfg, inherited));
}

/// A startup error also goes to the error log, as nginx does.
fn log_to_error_file(src: &Source, msg: &str) {
    let path = src
        .error_log
        .clone()
        .unwrap_or_else(|| src.prefix.join("logs/error.log"));
    if path.as_os_str() == "stderr" {
        return;
    }
    let line =
        tern::core::log::format_line(tern::core::log::Level::Emerg, None, format_args!("{}", msg));
    if let Ok(f) = tern::core::log::open_log(Some(&path)) {
        f.write_all(line.as_bytes());
    }
}

fn send_signal(cfg: &tern::core::conf::Config, sig: &str) -> i32 {
    let path = cfg
        .main
        .pid
        .clone()
        .unwrap_or_else(|| cfg.prefix.join("logs/nginx.pid"));
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "tern: [error] open() \"{}\" failed {}",
                path.display(),
                tern::core::errno_text(&e)
            );
            return 1;
        }
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        eprintln!(
            "tern: [error] invalid PID number \"{}\" in \"{}\"",
            text.trim(),
            path.display()
        );
        return 1;
    };
    let signo = match sig {
        "stop" => libc::SIGTERM,
        "quit" => libc::SIGQUIT,
        "reopen" => libc::SIGUSR1,
        _ => libc::SIGHUP,
    };
    // SAFETY: kill with a pid read from the pid file and a valid signal number.
    if unsafe { libc::kill(pid, signo) } != 0 {
        let e = std::io::Error::last_os_error();
        eprintln!(
            "tern: [alert] kill({}, {}) failed {}",
            pid,
            signo,
            tern::core::errno_text(&e)
        );
        return 1;
    }
    0
}
