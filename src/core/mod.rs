//! Process-level machinery: compiled main configuration, master, workers,
//! listeners, signals and logs.
pub mod affinity;
pub mod conf;
pub mod dns;
pub mod lint;
pub mod listen;
pub mod log;
pub mod master;
pub mod modules;
pub mod park;
pub mod proxy_protocol;
pub mod regex;
pub mod sock;
pub mod stream;
pub mod syslog;
pub mod upgrade;
pub mod user;
pub mod worker;

/// 16 bytes from the system's CSPRNG as 32 lowercase hex digits (nginx's
/// `$request_id`, which it takes from OpenSSL's `RAND_bytes`).
pub fn random_hex16() -> [u8; 32] {
    use ring::rand::SecureRandom;
    let mut raw = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut raw).is_err() {
        // No system randomness (nginx then falls back to ngx_random too):
        // time and a counter still make it unique.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        raw[..8].copy_from_slice(&t.to_ne_bytes());
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        raw[8..].copy_from_slice(&n.to_ne_bytes());
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in raw.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 15)];
    }
    out
}

/// `strerror` text for an errno, as nginx prints it. The texts of the
/// errnos Linux defines are made once per process, since a busy server
/// logs the same few (`ENOENT` for every missing file) on every request
/// that fails.
pub fn strerror_text(errno: i32) -> std::borrow::Cow<'static, str> {
    const KNOWN: usize = 134;
    static TEXTS: [std::sync::OnceLock<Box<str>>; KNOWN] =
        [const { std::sync::OnceLock::new() }; KNOWN];
    match usize::try_from(errno).ok().and_then(|i| TEXTS.get(i)) {
        Some(cell) => std::borrow::Cow::Borrowed(cell.get_or_init(|| os_text(errno).into())),
        None => std::borrow::Cow::Owned(os_text(errno)),
    }
}

fn os_text(errno: i32) -> String {
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
        Some(n) => format!("({}: {})", n, strerror_text(n)),
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
