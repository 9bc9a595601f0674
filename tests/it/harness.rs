//! The test harness: a temporary prefix, a config with free ports, the real
//! binary started in the foreground, raw-socket and curl clients. On a
//! failure the server's error log and config are printed (see `Drop`).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, StreamOwned};

pub const BIN: &str = env!("CARGO_BIN_EXE_tern");

/// A free loopback TCP port (bound then released), never handed out twice
/// in one test run. Taken below the kernel's ephemeral range (32768+ by
/// default): a port from `bind(:0)` is released here and could be given
/// by the kernel to another test's origin or client socket before this
/// test uses it (a "dead" upstream port that suddenly answers).
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free port left");
        let port = (LOW + (start + n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A loopback port nothing listens on, kept so for as long as this lives:
/// a socket is bound to it (without SO_REUSEADDR, not listening), so a
/// connect is refused, and no other process (another test run, a fuzzer
/// on the same machine) can start listening there meanwhile, as it could
/// on a port from [`free_port`] that is only known to be free.
pub struct DeadPort {
    pub port: u16,
    _sock: socket2::Socket,
}

impl DeadPort {
    pub fn new() -> DeadPort {
        use socket2::{Domain, Socket, Type};
        loop {
            let port = free_port();
            let sock = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            if sock.bind(&addr.into()).is_ok() {
                return DeadPort { port, _sock: sock };
            }
        }
    }
}

impl Default for DeadPort {
    fn default() -> Self {
        Self::new()
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A prefix directory with `logs/`, `html/` and `conf/`, removed on drop.
pub struct Prefix {
    pub dir: PathBuf,
}

impl Prefix {
    pub fn new() -> Prefix {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tern-it-{}-{}", std::process::id(), n));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["logs", "html", "conf"] {
            std::fs::create_dir_all(dir.join(d)).expect("mkdir");
        }
        Prefix { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Writes a file under the prefix, creating directories.
    pub fn write(&self, rel: &str, data: impl AsRef<[u8]>) -> PathBuf {
        let p = self.dir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&p, data).expect("write");
        p
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.dir.join(rel)).unwrap_or_default()
    }

    /// Runs `tern ARGS` with `-p PREFIX` and waits for it.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("-p")
            .arg(&self.dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run tern")
    }
}

impl Default for Prefix {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A running tern.
pub struct Server {
    pub prefix: Prefix,
    pub child: Option<Child>,
    pub port: u16,
    pub conf: PathBuf,
}

/// The config text with `@PORT@` replaced; `events {}` added if missing.
pub fn conf_text(body: &str, port: u16) -> String {
    let mut t = body.replace("@PORT@", &port.to_string());
    if !t.contains("events") {
        t = format!("events {{}}\n{}", t);
    }
    t
}

impl Server {
    /// Starts tern on `conf` (with `@PORT@` replaced by a free port) and
    /// waits until the port accepts connections and the master can take
    /// signals.
    pub fn start(conf: &str) -> Server {
        Self::start_in(Prefix::new(), conf)
    }

    pub fn start_in(prefix: Prefix, conf: &str) -> Server {
        Self::start_with_env(prefix, conf, &[])
    }

    /// As `start_in`, with extra environment variables for tern.
    pub fn start_with_env(prefix: Prefix, conf: &str, env: &[(&str, &str)]) -> Server {
        let mut attempt = 0;
        loop {
            let port = free_port();
            let text = conf_text(conf, port);
            let conf_path = prefix.write("conf/nginx.conf", text);
            let mut child = Command::new(BIN)
                .arg("-p")
                .arg(&prefix.dir)
                .arg("-c")
                .arg(&conf_path)
                .arg("-g")
                .arg("daemon off;")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn tern");
            match wait_ready(&mut child, port, &prefix) {
                Ok(()) => {
                    return Server {
                        prefix,
                        child: Some(child),
                        port,
                        conf: conf_path,
                    }
                }
                // Another process (a test run elsewhere on the machine)
                // took the port between free_port() and tern's bind: the
                // test is not about that, so once more on another port.
                Err(e) if attempt < 3 && e.contains(&format!("127.0.0.1:{port} failed (98:")) => {
                    attempt += 1;
                }
                Err(e) => panic!("{}", e),
            }
        }
    }

    /// Waits until `port` accepts a TCP connection and the master has its
    /// signal handlers (or panics when the server died).
    pub fn wait_listening(&mut self, port: u16) {
        let c = self.child.as_mut().expect("a running tern");
        if let Err(e) = wait_ready(c, port, &self.prefix) {
            panic!("{}", e);
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    pub fn signal(&self, sig: i32) {
        libc_kill(self.pid(), sig);
    }

    /// Replaces the config file (for reload tests), `@PORT@` as at start.
    pub fn rewrite_conf(&self, conf: &str, port: u16) {
        std::fs::write(&self.conf, conf_text(conf, port)).expect("write conf");
    }

    pub fn error_log(&self) -> String {
        self.prefix.read("logs/error.log")
    }

    /// Waits for the process to exit; returns its status code.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        let c = self.child.as_mut()?;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return st.code().or(Some(-1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn connect(&self) -> TcpStream {
        connect(self.port)
    }

    /// Sends raw bytes on a new connection and reads until the server closes
    /// (or 5 s pass).
    pub fn raw(&self, req: &[u8]) -> Vec<u8> {
        raw(self.port, req)
    }

    /// One request on a new connection, `Connection: close` added.
    pub fn get(&self, path: &str) -> Resp {
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            path
        );
        Resp::parse(&self.raw(req.as_bytes())).expect("a response")
    }

    /// curl with extra args against this server; returns (status, stdout).
    pub fn curl(&self, args: &[&str]) -> Output {
        Command::new("curl")
            .args(["-s", "--max-time", "10"])
            .args(args)
            .output()
            .expect("curl")
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }
}

fn libc_kill(pid: i32, sig: i32) {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: plain kill(2).
    unsafe {
        kill(pid, sig);
    }
}

pub const SIGHUP: i32 = 1;
pub const SIGQUIT: i32 = 3;
pub const SIGTERM: i32 = 15;
pub const SIGUSR1: i32 = 10;

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            libc_kill(c.id() as i32, SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "--- config {}:\n{}",
                self.conf.display(),
                std::fs::read_to_string(&self.conf).unwrap_or_default()
            );
            eprintln!("--- error.log:\n{}", self.error_log());
        }
    }
}

/// Waits (up to 10 s) until `port` accepts a connection and `child` has
/// a SIGHUP handler installed: tern listens a moment before its signal
/// handlers are in, and a signal sent in between (a test's reload right
/// after the start) would take its default action and end the process.
/// Also makes sure the listener is tern's and not another process's on a
/// port tern failed to bind. Err: tern exited (its stderr and error log).
fn wait_ready(child: &mut Child, port: u16, prefix: &Prefix) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            let mut err = String::new();
            if let Some(e) = child.stderr.as_mut() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!(
                "tern exited with {}: {}\nerror.log:\n{}",
                st,
                err,
                prefix.read("logs/error.log")
            ));
        }
        if catches_sighup(child.id()) && TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!("tern did not listen on {}", port))
}

/// Whether the process has a handler for SIGHUP (`SigCgt` in its status).
fn catches_sighup(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid)).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|m| m & (1 << (SIGHUP - 1)) != 0)
}

pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Sends `req`, then reads until EOF or 5 s.
pub fn raw(port: u16, req: &[u8]) -> Vec<u8> {
    raw_within(port, req, Duration::from_secs(5))
}

/// [`raw`] giving up only after `silence` without a byte: for responses
/// paced or held back on purpose, where a stalled machine must not cut
/// the answer short.
pub fn raw_within(port: u16, req: &[u8], silence: Duration) -> Vec<u8> {
    let mut s = connect(port);
    s.set_read_timeout(Some(silence)).expect("timeout");
    s.write_all(req).expect("write");
    read_to_close(&mut s)
}

pub fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    out
}

/// Reads exactly one response (by Content-Length or chunked) from a
/// kept-alive connection.
pub fn read_response(s: &mut TcpStream) -> Option<Resp> {
    let mut data = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        if let Some(r) = Resp::parse_complete(&data) {
            return Some(r.0);
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return Resp::parse(&data),
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
}

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub status_line: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The head exactly as received.
    pub head: String,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The head with the Date and Server values blanked, for byte comparisons.
    pub fn head_normalized(&self) -> String {
        blank_date_server(&self.head)
    }

    /// Parses a response; the body is everything after the head (for
    /// connections read to close).
    pub fn parse(data: &[u8]) -> Option<Resp> {
        if let Some((r, _)) = Self::parse_complete(data) {
            return Some(r);
        }
        let end = find(data, b"\r\n\r\n")?;
        let mut r = Self::head(&data[..end + 4])?;
        r.body = data[end + 4..].to_vec();
        Some(r)
    }

    fn head(h: &[u8]) -> Option<Resp> {
        let head = String::from_utf8_lossy(h).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next()?.to_string();
        let status = status_line.split(' ').nth(1)?.parse().ok()?;
        let headers = lines
            .filter(|l| !l.is_empty())
            .filter_map(|l| {
                l.split_once(": ")
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            })
            .collect();
        Some(Resp {
            status,
            status_line,
            headers,
            body: Vec::new(),
            head,
        })
    }

    /// Parses one complete framed response; returns it and the bytes used.
    pub fn parse_complete(data: &[u8]) -> Option<(Resp, usize)> {
        let end = find(data, b"\r\n\r\n")?;
        let mut r = Self::head(&data[..end + 4])?;
        let body_start = end + 4;
        let no_body = r.status == 304 || r.status == 204 || (100..200).contains(&r.status);
        if no_body {
            return Some((r, body_start));
        }
        if let Some(cl) = r.header("Content-Length") {
            let n: usize = cl.trim().parse().ok()?;
            if data.len() < body_start + n {
                return None;
            }
            r.body = data[body_start..body_start + n].to_vec();
            return Some((r, body_start + n));
        }
        if r.header("Transfer-Encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            let mut pos = body_start;
            let mut body = Vec::new();
            loop {
                let le = find(&data[pos..], b"\r\n")?;
                let size_s = String::from_utf8_lossy(&data[pos..pos + le]).into_owned();
                let size = usize::from_str_radix(size_s.split(';').next()?.trim(), 16).ok()?;
                pos += le + 2;
                if size == 0 {
                    // trailers until empty line
                    loop {
                        let le = find(&data[pos..], b"\r\n")?;
                        pos += le + 2;
                        if le == 0 {
                            r.body = body;
                            return Some((r, pos));
                        }
                    }
                }
                if data.len() < pos + size + 2 {
                    return None;
                }
                body.extend_from_slice(&data[pos..pos + size]);
                pos += size + 2;
            }
        }
        None
    }
}

pub fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// Waits until `f` holds or panics after `secs`.
pub fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("timed out waiting for: {}", what);
}

/// True when the path exists (helper for readability).
pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// The reference nginx the differential tests compare with.
pub const NGINX: &str = "/usr/sbin/nginx";

/// Whether the reference nginx is installed; says so when a test skips.
pub fn nginx_installed() -> bool {
    let ok = Path::new(NGINX).exists();
    if !ok {
        eprintln!(
            "skipped: {} not installed (.ci/run installs nginx-light)",
            NGINX
        );
    }
    ok
}

/// The reference nginx, stopped when dropped (also when a test panics).
pub struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the reference nginx in `p` on `body` (`@PORT@` = `port`) and
/// waits until it listens. `None` if it could not be started.
pub fn start_nginx(p: &Prefix, body: &str, port: u16) -> Option<Nginx> {
    let conf = p.write("conf/nginx.conf", conf_text(body, port));
    let child = Command::new(NGINX)
        .arg("-p")
        .arg(format!("{}/", p.dir.display()))
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(p.path("logs/error.log"))
        .args([
            "-g",
            // One process: killing the child then stops all of nginx (with
            // a master, SIGKILL would leave its worker running).
            &format!(
                "daemon off; master_process off; pid {}/logs/nginx.pid;",
                p.dir.display()
            ),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let nginx = Nginx(child);
    eventually(10, "nginx listening", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Some(nginx)
}

impl Server {
    /// Waits (up to 10 s) until `logs/error.log` contains `substr` and
    /// returns the log. Error-log lines logged while the workers run are
    /// written by a writer thread, so a line may land just after the
    /// response that caused it.
    pub fn wait_error_log(&self, substr: &str) -> String {
        wait_log(&self.prefix, "logs/error.log", substr)
    }

    /// As [`Server::wait_error_log`], until `substr` is there `n` times.
    pub fn wait_error_log_n(&self, substr: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.error_log();
            if text.matches(substr).count() >= n {
                return text;
            }
            if Instant::now() > deadline {
                panic!(
                    "error.log has {:?} fewer than {} times after 10 s:\n{}",
                    substr, n, text
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `req` on a new connection (read to its close) and waits until
    /// the error log has `line`, which that request logs; returns the log.
    /// For checking that an earlier request logged *nothing* of some kind:
    /// with one worker (the default), every line an earlier request logged
    /// on its own task is queued before the worker takes this one (after
    /// its answer is written, a request is logged and dropped before the
    /// task awaits anything), and the one writer thread writes lines in
    /// queue order, so the returned log has all of them.
    pub fn error_log_after(&self, req: &str, line: &str) -> String {
        self.raw(req.as_bytes());
        self.wait_error_log(line)
    }
}

/// Waits (up to 10 s) until the file `rel` under `p` contains `substr` and
/// returns its text; panics with the text otherwise.
pub fn wait_log(p: &Prefix, rel: &str, substr: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = p.read(rel);
        if text.contains(substr) {
            return text;
        }
        if Instant::now() > deadline {
            panic!("{} has no {:?} after 10 s:\n{}", rel, substr, text);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `tern -t` on a configuration text written to a fresh prefix.
pub struct ConfTest {
    pub stderr: String,
    pub file: PathBuf,
    pub code: Option<i32>,
    _prefix: Prefix,
}

impl ConfTest {
    pub fn run(text: &str) -> ConfTest {
        let p = Prefix::new();
        let file = p.write("conf/t.conf", text);
        let o = p.run(&["-t", "-c", file.to_str().unwrap_or("")]);
        ConfTest {
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            file,
            code: o.status.code(),
            _prefix: p,
        }
    }

    /// Asserts the line `tern: [LEVEL] MSG in FILE:LINE` was printed.
    pub fn assert_says(&self, level: &str, msg: &str, line: u32) {
        let want = format!(
            "tern: [{}] {} in {}:{}\n",
            level,
            msg,
            self.file.display(),
            line
        );
        assert!(
            self.stderr.contains(&want),
            "{}\nwanted: {}",
            self.stderr,
            want
        );
    }
}

/// `text` with the values of its Date and Server lines blanked.
pub fn blank_date_server(text: &str) -> String {
    text.split("\r\n")
        .map(|l| {
            if l.starts_with("Date: ") {
                "Date: X".to_string()
            } else if l.starts_with("Server: ") {
                "Server: X".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// `text` (a whole response) with a chunked body decoded and marked
/// `[chunked]` after the head, so that answers cut into chunks at other
/// places compare equal.
pub fn dechunked(text: &str) -> String {
    let Some(at) = text.find("\r\n\r\n") else {
        return text.to_string();
    };
    let (head, mut rest) = (&text[..at], &text[at + 4..]);
    if !head.contains("\r\nTransfer-Encoding: chunked") || rest.starts_with("[chunked]") {
        return text.to_string();
    }
    let mut body = String::new();
    while let Some(nl) = rest.find("\r\n") {
        let Ok(n) = usize::from_str_radix(rest[..nl].trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < nl + 2 + n {
            break;
        }
        body.push_str(&rest[nl + 2..nl + 2 + n]);
        rest = rest[nl + 2 + n..].strip_prefix("\r\n").unwrap_or("");
    }
    format!("{head}\r\n\r\n[chunked]{body}")
}

/// `text` without its framing: the body decoded, the Content-Length and
/// Transfer-Encoding lines left out.
pub fn framing_blind(text: &str) -> String {
    dechunked(text)
        .replace("[chunked]", "")
        .split("\r\n")
        .filter(|l| !l.starts_with("Content-Length: ") && !l.starts_with("Transfer-Encoding: "))
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// A DNS responder on loopback for `resolver 127.0.0.1:PORT`: each query
/// (name lower-cased, type) is answered as `answer` says: the RCODE and
/// the IPv4 addresses of its A records (TTL 3600), in order. Returns the
/// port and the number of A queries so far.
pub fn dns_responder(
    answer: impl Fn(&str, u16) -> (u8, Vec<[u8; 4]>) + Send + 'static,
) -> (u16, Arc<AtomicUsize>) {
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    let port = sock.local_addr().expect("addr").port();
    let count = Arc::new(AtomicUsize::new(0));
    let a_queries = count.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            let q = &buf[..n];
            if n < 12 {
                continue;
            }
            let mut at = 12;
            let mut labels = Vec::new();
            while at < n && q[at] != 0 {
                let len = q[at] as usize;
                labels
                    .push(String::from_utf8_lossy(&q[at + 1..(at + 1 + len).min(n)]).into_owned());
                at += 1 + len;
            }
            let qend = at + 5;
            if qend > n {
                continue;
            }
            let name = labels.join(".").to_ascii_lowercase();
            let qtype = u16::from_be_bytes([q[at + 1], q[at + 2]]);
            if qtype == 1 {
                a_queries.fetch_add(1, Ordering::SeqCst);
            }
            let (rcode, addrs) = answer(&name, qtype);
            let mut r = q[..qend].to_vec();
            r[2] = 0x81;
            r[3] = 0x80 | rcode;
            r[6] = 0;
            r[7] = addrs.len() as u8;
            r[8..12].copy_from_slice(&[0, 0, 0, 0]);
            for a in &addrs {
                r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0x0e, 0x10, 0, 4]);
                r.extend_from_slice(a);
            }
            let _ = sock.send_to(&r, from);
        }
    });
    (port, count)
}

/// A server certificate verifier that takes any certificate: the tests
/// that use it are about something else than the server's certificate.
#[derive(Debug)]
struct AnyServer;

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS client of `versions` that takes any server certificate, offers
/// the TLS 1.2 `suites` in that order (all of rustls's when empty) and
/// presents `client_cert` (certificate and key, DER), if any.
pub fn tls_client(
    versions: &[&'static rustls::SupportedProtocolVersion],
    suites: &[rustls::CipherSuite],
    client_cert: Option<(Vec<u8>, Vec<u8>)>,
) -> Arc<ClientConfig> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !suites.is_empty() {
        provider.cipher_suites = suites
            .iter()
            .chain([&rustls::CipherSuite::TLS13_AES_128_GCM_SHA256])
            .filter_map(|s| {
                rustls::crypto::ring::ALL_CIPHER_SUITES
                    .iter()
                    .find(|x| x.suite() == *s)
                    .copied()
            })
            .collect();
    }
    let b = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer));
    Arc::new(match client_cert {
        Some((c, k)) => b
            .with_client_auth_cert(
                vec![CertificateDer::from(c)],
                PrivateKeyDer::try_from(k).expect("key"),
            )
            .expect("client cert"),
        None => b.with_no_client_auth(),
    })
}

/// Sends `req` over TLS (SNI `sni`) and reads until the server closes:
/// what it sent and its certificate (empty when there was none).
pub fn tls_exchange(
    cfg: &Arc<ClientConfig>,
    port: u16,
    sni: &str,
    req: &str,
) -> (Vec<u8>, Vec<u8>) {
    let name = ServerName::try_from(sni.to_string()).expect("name");
    let conn = ClientConnection::new(cfg.clone(), name).expect("client");
    let mut s = StreamOwned::new(conn, connect(port));
    let mut out = Vec::new();
    if s.write_all(req.as_bytes()).is_ok() {
        let mut buf = [0u8; 16384];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    }
    let cert = s
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    (out, cert)
}
