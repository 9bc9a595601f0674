//! Binary upgrade on the fly (USR2), as nginx does it.
//!
//! ```text
//!  old process                                  new process
//!  USR2: pid file -> pid.oldbin
//!        dup listeners without CLOEXEC
//!        exec argv[0] with NGINX="fd;fd;" ----> inherited(): adopt the sockets,
//!                                               bind only what they lack,
//!                                               write the pid file, serve
//!  (both accept on the same sockets)
//!  WINCH: workers finish and stop; the
//!         listeners stay open in the master
//!  QUIT:  exit, remove pid.oldbin           or  HUP to the old: workers again;
//!  the new process has died: pid.oldbin             QUIT to the new: it exits,
//!         -> pid again (and workers again       and the old takes the pid file back
//!         if WINCH had stopped them)
//! ```
//!
//! The old process learns of the new one's end from SIGCHLD: the new
//! process is its child. A process that still has the parent it was started
//! by ignores USR2 (nginx's rule: a new binary does not upgrade itself while
//! the old one runs, and a process run in the foreground with `daemon off`
//! has no detached master to upgrade from).
//!
//! The executable is found at start from `argv[0]` (made absolute against
//! the working directory, or looked up in `PATH`), so an upgrade runs the
//! file that is at that path now, not the one this process was loaded from.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How this process was started, kept for the exec of a new binary.
struct Start {
    exe: PathBuf,
    argv: Vec<OsString>,
    parent: i32,
}

static START: OnceLock<Start> = OnceLock::new();

/// Records argv and the parent process; call first thing in `main`.
pub fn record_start() {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let exe = argv
        .first()
        .map(|a| resolve_exe(Path::new(a)))
        .unwrap_or_default();
    let _ = START.set(Start {
        exe,
        argv,
        // SAFETY: getppid has no preconditions and cannot fail.
        parent: unsafe { libc::getppid() },
    });
}

/// `argv[0]` as a path that stays valid: relative names against the
/// working directory of now, bare names through `PATH`.
fn resolve_exe(arg0: &Path) -> PathBuf {
    if arg0.components().count() > 1 || arg0.is_absolute() {
        return std::env::current_dir()
            .map(|d| d.join(arg0))
            .unwrap_or_else(|_| arg0.to_path_buf());
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join(arg0);
            if p.is_file() {
                return p;
            }
        }
    }
    arg0.to_path_buf()
}

/// Whether USR2 must be ignored because the process that started this one
/// is still its parent.
pub fn parent_unchanged() -> bool {
    // SAFETY: getppid has no preconditions and cannot fail.
    let now = unsafe { libc::getppid() };
    START.get().is_some_and(|s| s.parent == now && now > 1)
}

/// The pid file's name while a new binary runs.
pub fn oldbin_path(pid_file: &Path) -> PathBuf {
    let mut s = pid_file.as_os_str().to_owned();
    s.push(".oldbin");
    PathBuf::from(s)
}

/// Starts the new binary with `socks` passed in the `NGINX` variable.
pub fn exec_new_binary(socks: &[&socket2::Socket]) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let start = START
        .get()
        .ok_or_else(|| std::io::Error::other("start not recorded"))?;
    // Copies without close-on-exec are what the new binary inherits; they
    // are closed here again when this function returns.
    let mut passed = Vec::with_capacity(socks.len());
    let mut list = String::new();
    for s in socks {
        let d = s.try_clone()?;
        d.set_cloexec(false)?;
        list.push_str(&d.as_raw_fd().to_string());
        list.push(';');
        passed.push(d);
    }
    let mut cmd = std::process::Command::new(&start.exe);
    if let Some(a0) = start.argv.first() {
        cmd.arg0(a0);
    }
    cmd.args(start.argv.iter().skip(1)).env("NGINX", &list);
    let child = cmd.spawn();
    drop(passed);
    child
}

/// The executable `exec_new_binary` runs, for log messages.
pub fn exe_display() -> String {
    START
        .get()
        .map(|s| s.exe.display().to_string())
        .unwrap_or_default()
}

/// Listening sockets handed over by an old binary.
#[derive(Default)]
pub struct Inherited {
    socks: Vec<socket2::Socket>,
    /// The variable's text, for the start-up notice.
    pub text: String,
    /// nginx's warning for a malformed variable.
    pub warning: Option<String>,
}

impl Inherited {
    /// Reads and clears `NGINX`; keeps the descriptors that are listening
    /// stream sockets (marked close-on-exec again).
    pub fn from_env() -> Inherited {
        let Some(text) = std::env::var_os("NGINX") else {
            return Inherited::default();
        };
        std::env::remove_var("NGINX");
        let text = text.to_string_lossy().into_owned();
        let mut out = Inherited {
            text: text.clone(),
            ..Default::default()
        };
        for part in text.split([';', ':']) {
            if part.is_empty() {
                continue;
            }
            let Ok(fd) = part.parse::<RawFd>() else {
                out.warning = Some(format!(
                    "invalid socket number \"{}\" in NGINX environment variable, ignoring the rest of the variable",
                    part
                ));
                break;
            };
            if let Some(s) = adopt(fd) {
                out.socks.push(s);
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.socks.is_empty()
    }

    /// Takes up to `n` inherited sockets bound to `addr`.
    pub fn take(&mut self, addr: &socket2::SockAddr, n: usize) -> Vec<socket2::Socket> {
        let mut got = Vec::new();
        let mut i = 0;
        while i < self.socks.len() && got.len() < n {
            let same = self.socks[i]
                .local_addr()
                .is_ok_and(|a| same_addr(&a, addr));
            if same {
                got.push(self.socks.remove(i));
            } else {
                i += 1;
            }
        }
        got
    }
}

fn same_addr(a: &socket2::SockAddr, b: &socket2::SockAddr) -> bool {
    match (a.as_socket(), b.as_socket()) {
        (Some(x), Some(y)) => x == y,
        (None, None) => a.as_pathname().is_some() && a.as_pathname() == b.as_pathname(),
        _ => false,
    }
}

/// A descriptor from `NGINX`, if it is a listening stream socket.
fn adopt(fd: RawFd) -> Option<socket2::Socket> {
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails with
    // EBADF for a number that is not open, which is how a stale or wrong
    // variable is detected before anything takes ownership of it.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return None;
    }
    // SAFETY: the descriptor is open (checked above) and was handed to
    // this process to own; nothing else in the process refers to it.
    let s = socket2::Socket::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let listening = s.r#type().ok() == Some(socket2::Type::STREAM)
        && matches!(socket2::SockRef::from(&s).is_listener(), Ok(true));
    if !listening {
        // Not ours to close: give the number back untouched.
        std::mem::forget(s);
        return None;
    }
    let _ = s.set_cloexec(true);
    Some(s)
}
