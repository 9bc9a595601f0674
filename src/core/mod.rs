//! Process-level machinery: compiled main configuration, master, workers,
//! listeners, signals and logs.
pub mod affinity;
pub mod conf;
pub mod lint;
pub mod listen;
pub mod log;
pub mod master;
pub mod modules;
pub mod park;
pub mod sock;
pub mod stream;
pub mod upgrade;
pub mod user;
pub mod worker;

/// `strerror` text for an errno, as nginx prints it.
pub fn strerror(errno: i32) -> String {
    let s = std::io::Error::from_raw_os_error(errno).to_string();
    // std appends " (os error N)"; nginx prints the bare text.
    match s.rfind(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// nginx's `(errno: text)` suffix for an I/O error.
pub fn errno_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("({}: {})", n, strerror(n)),
        None => format!("({})", e),
    }
}

/// The machine's host name (`$hostname`).
pub fn hostname() -> &'static str {
    static H: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    H.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "localhost".into())
    })
}
