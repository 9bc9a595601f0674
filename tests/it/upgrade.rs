//! Binary upgrade on the fly (USR2, WINCH, rollback), with tern detached
//! as nginx must be for it: `daemon on`, the processes found through the
//! pid file and `$pid` in the responses.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{conf_text, eventually, free_port, raw, Prefix, BIN};

/// The detached processes of one test: killed at the end whatever happens,
/// and the error log printed if the test failed.
struct Detached {
    prefix: Prefix,
    port: u16,
    pids: Vec<i32>,
}

impl Drop for Detached {
    fn drop(&mut self) {
        for &p in &self.pids {
            // SAFETY: kill with a pid this test started; no memory involved.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        if std::thread::panicking() {
            eprintln!("--- error.log ---\n{}", self.prefix.read("logs/error.log"));
        }
    }
}

const CONF: &str = "worker_processes 1;\n\
    pid logs/nginx.pid;\n\
    error_log logs/error.log notice;\n\
    http {\n\
        access_log off;\n\
        server { listen 127.0.0.1:@PORT@; location / { return 200 \"pid $pid\\n\"; } }\n\
    }\n";

impl Detached {
    /// Starts `exe` detached (`daemon on`, the default) and waits for its pid file.
    fn start(exe: &Path, prefix: Prefix) -> Detached {
        let port = free_port();
        let conf = prefix.write("conf/nginx.conf", conf_text(CONF, port));
        let out = Command::new(exe)
            .arg("-p")
            .arg(&prefix.dir)
            .arg("-c")
            .arg(&conf)
            .output()
            .expect("run tern");
        assert!(out.status.success(), "{:?}", out);
        let mut d = Detached {
            prefix,
            port,
            pids: Vec::new(),
        };
        let pid = d.wait_pid("logs/nginx.pid", None);
        d.pids.push(pid);
        d
    }

    /// The pid in `rel` once it exists and differs from `not`.
    fn wait_pid(&mut self, rel: &str, not: Option<i32>) -> i32 {
        let mut got = 0;
        eventually(10, rel, || {
            got = self.prefix.read(rel).trim().parse().unwrap_or(0);
            got > 0 && Some(got) != not
        });
        if !self.pids.contains(&got) {
            self.pids.push(got);
        }
        got
    }

    fn signal(&self, pid: i32, sig: i32) {
        // SAFETY: kill with a pid this test started; no memory involved.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill {} {}", pid, sig);
    }

    /// The pid that served a new connection's request.
    fn served_by(&self) -> i32 {
        let r = raw(
            self.port,
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        let text = String::from_utf8_lossy(&r);
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{}", text);
        text.rsplit("pid ")
            .next()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }

    fn log(&self) -> String {
        self.prefix.read("logs/error.log")
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.prefix.path(rel)
    }
}

/// Whether `pid` is a live process (an exited one may linger as a zombie
/// until its parent reaps it).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
        .unwrap_or(false)
}

#[test]
fn usr2_hands_the_listener_to_a_new_binary_then_winch_and_quit_retire_the_old() {
    let mut d = Detached::start(Path::new(BIN), Prefix::new());
    let old = d.pids[0];
    assert_eq!(d.served_by(), old);

    d.signal(old, libc::SIGUSR2);
    let new = d.wait_pid("logs/nginx.pid", Some(old));
    assert_eq!(d.wait_pid("logs/nginx.pid.oldbin", None), old);
    eventually(10, "inherited sockets notice", || {
        d.log()
            .contains(&format!("{}#{}: using inherited sockets from \"", new, new))
    });
    eventually(10, "start notice", || {
        d.log()
            .contains(&format!("start new binary process {}", new))
    });
    // Both serve from the same listening socket; no connection is refused.
    for _ in 0..20 {
        let by = d.served_by();
        assert!(by == old || by == new, "served by {}", by);
    }

    // WINCH: the old process's workers stop; the process stays.
    d.signal(old, libc::SIGWINCH);
    eventually(10, "only the new binary accepts", || {
        (0..10).all(|_| d.served_by() == new)
    });
    assert!(alive(old));
    eventually(10, "WINCH notice", || {
        d.log()
            .contains("signal 28 (SIGWINCH) received, stop accepting connections")
    });

    // QUIT: the old one exits and removes only its .oldbin file.
    d.signal(old, libc::SIGQUIT);
    eventually(10, "old process gone", || !alive(old));
    assert!(!d.path("logs/nginx.pid.oldbin").exists());
    assert_eq!(d.prefix.read("logs/nginx.pid").trim(), new.to_string());
    assert_eq!(d.served_by(), new);

    d.signal(new, libc::SIGQUIT);
    eventually(10, "new process gone", || !alive(new));
    assert!(!d.path("logs/nginx.pid").exists());
}

#[test]
fn hup_to_the_old_binary_after_winch_rolls_the_upgrade_back() {
    let mut d = Detached::start(Path::new(BIN), Prefix::new());
    let old = d.pids[0];
    d.signal(old, libc::SIGUSR2);
    let new = d.wait_pid("logs/nginx.pid", Some(old));
    d.signal(old, libc::SIGWINCH);
    eventually(10, "only the new binary accepts", || {
        (0..10).all(|_| d.served_by() == new)
    });

    // The old workers come back without a configuration read...
    d.signal(old, libc::SIGHUP);
    eventually(10, "old workers back", || {
        (0..20).any(|_| d.served_by() == old)
    });
    // ...and when the new binary quits, the old takes its pid file back.
    d.signal(new, libc::SIGQUIT);
    eventually(10, "pid file back to the old process", || {
        d.prefix.read("logs/nginx.pid").trim() == old.to_string()
            && !d.path("logs/nginx.pid.oldbin").exists()
    });
    eventually(10, "exit notice", || {
        d.log()
            .contains(&format!("new binary process {} exited with code 0", new))
    });
    for _ in 0..10 {
        assert_eq!(d.served_by(), old);
    }
}

#[test]
fn a_new_binary_that_cannot_run_leaves_the_old_one_serving() {
    use std::os::unix::fs::PermissionsExt;
    let prefix = Prefix::new();
    let exe = prefix.path("sbin/tern");
    std::fs::create_dir_all(prefix.path("sbin")).expect("mkdir");
    std::fs::copy(BIN, &exe).expect("copy binary");
    let d = Detached::start(&exe, prefix);
    let old = d.pids[0];

    // The file at argv[0] is gone: exec fails, the pid file is put back.
    std::fs::remove_file(&exe).expect("rm");
    d.signal(old, libc::SIGUSR2);
    eventually(10, "execve failure logged", || {
        d.log().contains(&format!(
            "execve() failed while executing new binary process \"{}\" (2: No such file or directory)",
            exe.display()
        ))
    });
    assert_eq!(d.prefix.read("logs/nginx.pid").trim(), old.to_string());
    assert!(!d.path("logs/nginx.pid.oldbin").exists());
    assert_eq!(d.served_by(), old);

    // A file that runs and fails at once: the old one notices its end.
    std::fs::write(&exe, "#!/bin/sh\nexit 3\n").expect("write script");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    d.signal(old, libc::SIGUSR2);
    eventually(10, "new binary's exit logged", || {
        d.log().contains("exited with code 3")
    });
    eventually(10, "pid file back", || {
        d.prefix.read("logs/nginx.pid").trim() == old.to_string()
            && !d.path("logs/nginx.pid.oldbin").exists()
    });
    assert_eq!(d.served_by(), old);
}

#[test]
fn usr2_in_the_foreground_is_ignored_as_nginx_does() {
    let s = crate::harness::Server::start(
        "error_log logs/error.log notice;\n\
         http { server { listen 127.0.0.1:@PORT@; location / { return 200 \"ok\\n\"; } } }\n",
    );
    s.signal(libc::SIGUSR2);
    eventually(10, "ignore logged", || {
        s.error_log().contains(
            "[crit] ",
        ) && s.error_log().contains(
            "the changing binary signal is ignored: you should shutdown or terminate before either old or new binary's process",
        )
    });
    s.wait_error_log("signal 12 (SIGUSR2) received, ignoring");
    assert!(s.prefix.path("logs/nginx.pid").exists());
    assert!(!s.prefix.path("logs/nginx.pid.oldbin").exists());
    assert_eq!(s.get("/").status, 200);
}
