//! `syslog:` log destinations: the error log's and the access log's
//! (http and stream), as nginx sends them.
//!
//! A [`Peer`] is one `syslog:server=...[,facility=][,severity=][,tag=]
//! [,nohostname]` target, parsed at configuration time with nginx's
//! wording. Each message is one datagram in the RFC 3164 form nginx uses:
//!
//! ```text
//! <PRI>Mmm dd hh:mm:ss HOSTNAME TAG: MESSAGE      (no trailing newline)
//! ```
//!
//! PRI is facility * 8 + severity; the error log's severity is the line's
//! level, the access log's the configured one (default `info`). The time
//! is local, the host name the machine's in lower case (omitted with
//! `nohostname`), the tag `nginx` unless set.
//!
//! # Sending
//!
//! The socket (UDP, or a unix datagram socket for `server=unix:PATH`) is
//! created and connected on the first message and is non-blocking, so a
//! send never waits: like nginx, the logging thread sends itself (a worker
//! included). A failed send closes the socket (the next message makes a
//! new one) and is reported in the main error log as nginx reports it,
//! `send() failed (111: Connection refused) while logging to syslog,
//! server: ADDR`; while that report is written the failing peer is skipped
//! (nginx's `busy` flag), so a dead server cannot loop. The flag is per
//! thread: other threads' lines to the same peer are not dropped.

use std::cell::Cell;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::core::log::Level;

/// nginx's facility names, by number.
const FACILITIES: [&str; 24] = [
    "kern", "user", "mail", "daemon", "auth", "intern", "lpr", "news", "uucp", "clock", "authpriv",
    "ftp", "ntp", "audit", "alert", "cron", "local0", "local1", "local2", "local3", "local4",
    "local5", "local6", "local7",
];

/// nginx's severity names (its error-log level names), by number.
const SEVERITIES: [&str; 8] = [
    "emerg", "alert", "crit", "error", "warn", "notice", "info", "debug",
];

/// nginx's longest error-log line (`NGX_MAX_ERROR_STR`); a syslog message
/// carries at most this much after its header.
const MAX_MESSAGE: usize = 2048;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Server {
    Inet(SocketAddr),
    Unix(PathBuf),
}

#[derive(Debug)]
enum Sock {
    Udp(UdpSocket),
    Unix(UnixDatagram),
}

impl Sock {
    fn send(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Udp(s) => s.send(buf),
            Sock::Unix(s) => s.send(buf),
        }
    }
}

/// One `syslog:` destination.
#[derive(Debug)]
pub struct Peer {
    server: Server,
    /// The server as nginx names it in its error lines.
    name: String,
    facility: u8,
    /// `severity=` (default info): the access log's.
    severity: u8,
    tag: String,
    nohostname: bool,
    sock: Mutex<Option<Sock>>,
}

impl PartialEq for Peer {
    fn eq(&self, o: &Peer) -> bool {
        self.server == o.server
            && self.facility == o.facility
            && self.severity == o.severity
            && self.tag == o.tag
            && self.nohostname == o.nohostname
    }
}
impl Eq for Peer {}

thread_local! {
    /// The peer whose failure this thread is reporting (nginx's `busy`).
    static BUSY: Cell<usize> = const { Cell::new(0) };
}

impl Peer {
    /// Parses what follows `syslog:`; the error in nginx's words.
    pub fn parse(params: &str) -> Result<Peer, String> {
        let mut server: Option<(Server, String)> = None;
        let mut facility: Option<u8> = None;
        let mut severity: Option<u8> = None;
        let mut tag: Option<String> = None;
        let mut nohostname = false;
        for p in params.split(',') {
            if let Some(url) = p.strip_prefix("server=") {
                if server.is_some() {
                    return Err("duplicate syslog \"server\"".into());
                }
                server = Some(
                    parse_server(url).map_err(|e| format!("{} in syslog server \"{}\"", e, url))?,
                );
            } else if let Some(f) = p.strip_prefix("facility=") {
                if facility.is_some() {
                    return Err("duplicate syslog \"facility\"".into());
                }
                let i = FACILITIES
                    .iter()
                    .position(|n| *n == f)
                    .ok_or_else(|| format!("unknown syslog facility \"{}\"", f))?;
                facility = Some(i as u8);
            } else if let Some(s) = p.strip_prefix("severity=") {
                if severity.is_some() {
                    return Err("duplicate syslog \"severity\"".into());
                }
                let i = SEVERITIES
                    .iter()
                    .position(|n| *n == s)
                    .ok_or_else(|| format!("unknown syslog severity \"{}\"", s))?;
                severity = Some(i as u8);
            } else if let Some(t) = p.strip_prefix("tag=") {
                if tag.is_some() {
                    return Err("duplicate syslog \"tag\"".into());
                }
                // RFC 3164: at most 32 alphanumeric characters (nginx
                // also allows the underscore).
                if t.len() > 32 {
                    return Err("syslog tag length exceeds 32".into());
                }
                if !t.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
                    return Err(
                        "syslog \"tag\" only allows alphanumeric characters and underscore".into(),
                    );
                }
                tag = Some(t.to_string());
            } else if p == "nohostname" {
                nohostname = true;
            } else {
                // nginx prints the rest of the argument from this parameter on.
                let at = p.as_ptr() as usize - params.as_ptr() as usize;
                return Err(format!("unknown syslog parameter \"{}\"", &params[at..]));
            }
        }
        let (server, name) = server.ok_or("no syslog server specified")?;
        Ok(Peer {
            server,
            name,
            facility: facility.unwrap_or(23),
            severity: severity.unwrap_or(6),
            tag: tag.unwrap_or_else(|| "nginx".into()),
            nohostname,
            sock: Mutex::new(None),
        })
    }

    /// `<PRI>Mmm dd hh:mm:ss host tag: ` for a message of `severity`.
    pub fn header(&self, severity: u8, out: &mut Vec<u8>) {
        let pri = u32::from(self.facility) * 8 + u32::from(severity);
        out.push(b'<');
        out.extend_from_slice(pri.to_string().as_bytes());
        out.push(b'>');
        out.extend_from_slice(&crate::http::date::syslog_time());
        out.push(b' ');
        if !self.nohostname {
            out.extend_from_slice(host().as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(self.tag.as_bytes());
        out.extend_from_slice(b": ");
    }

    /// The access log's message: header at the configured severity, then
    /// `line` (without its newline). The error is for the caller to report
    /// as `send() to syslog failed`.
    pub fn send_access(&self, line: &[u8]) -> io::Result<()> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let mut msg = Vec::with_capacity(64 + line.len());
        self.header(self.severity, &mut msg);
        msg.extend_from_slice(line);
        self.send(&msg).map(drop)
    }

    /// One error-log line (with its newline) at `level`. Skipped while
    /// this thread reports this peer's own failure.
    pub fn send_error_line(&self, level: Level, line: &str) {
        if BUSY.with(|b| b.get()) == self as *const Peer as usize {
            return;
        }
        let line = line.strip_suffix('\n').unwrap_or(line).as_bytes();
        let line = &line[..line.len().min(MAX_MESSAGE)];
        let mut msg = Vec::with_capacity(64 + line.len());
        self.header(level as u8, &mut msg);
        msg.extend_from_slice(line);
        let _ = self.send(&msg);
    }

    /// Sends one datagram, connecting first if needed; a failure closes
    /// the socket and is logged in the main error log.
    fn send(&self, msg: &[u8]) -> io::Result<usize> {
        let mut g = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            match self.connect() {
                Ok(s) => *g = Some(s),
                Err((what, e)) => {
                    drop(g);
                    self.report(Level::Alert, what, &e);
                    return Err(e);
                }
            }
        }
        let r = match g.as_ref() {
            Some(s) => s.send(msg),
            None => Err(io::ErrorKind::NotConnected.into()),
        };
        match r {
            Ok(n) => Ok(n),
            Err(e) => {
                *g = None;
                drop(g);
                // nginx's ngx_connection_error: refused/unreachable and the
                // like are errors, anything else an alert.
                let level = match e.raw_os_error() {
                    Some(
                        libc::ECONNREFUSED
                        | libc::ECONNRESET
                        | libc::ENOTCONN
                        | libc::ETIMEDOUT
                        | libc::ENETDOWN
                        | libc::ENETUNREACH
                        | libc::EHOSTDOWN
                        | libc::EHOSTUNREACH,
                    ) => Level::Error,
                    _ => Level::Alert,
                };
                self.report(level, "send()", &e);
                Err(e)
            }
        }
    }

    fn connect(&self) -> Result<Sock, (&'static str, io::Error)> {
        match &self.server {
            Server::Inet(a) => {
                let local: SocketAddr = if a.is_ipv4() {
                    ([0, 0, 0, 0], 0).into()
                } else {
                    (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                };
                let s = UdpSocket::bind(local).map_err(|e| ("socket()", e))?;
                s.set_nonblocking(true).map_err(|e| ("ioctl(FIONBIO)", e))?;
                s.connect(a).map_err(|e| ("connect()", e))?;
                Ok(Sock::Udp(s))
            }
            Server::Unix(p) => {
                let s = UnixDatagram::unbound().map_err(|e| ("socket()", e))?;
                s.set_nonblocking(true).map_err(|e| ("ioctl(FIONBIO)", e))?;
                s.connect(p).map_err(|e| ("connect()", e))?;
                Ok(Sock::Unix(s))
            }
        }
    }

    /// `WHAT failed (errno: text) while logging to syslog, server: NAME`
    /// in the main error log, without this peer.
    fn report(&self, level: Level, what: &str, e: &io::Error) {
        let me = self as *const Peer as usize;
        let prev = BUSY.with(|b| b.replace(me));
        crate::core::log::main_logger().log(
            level,
            None,
            format_args!(
                "{} failed {} while logging to syslog, server: {}",
                what,
                crate::core::errno_text(e),
                self.name
            ),
        );
        BUSY.with(|b| b.set(prev));
    }
}

/// The host name as nginx sends it: the machine's, in lower case.
fn host() -> &'static str {
    static H: OnceLock<String> = OnceLock::new();
    H.get_or_init(|| crate::core::hostname().to_ascii_lowercase())
}

/// `server=`: `unix:PATH`, `ADDR[:PORT]`, `[V6][:PORT]` or a host name
/// (looked up now, the first address used, as nginx); port 514 by default.
/// Gives the address and the name nginx prints for it.
fn parse_server(url: &str) -> Result<(Server, String), &'static str> {
    if let Some(p) = url.strip_prefix("unix:") {
        if p.is_empty() {
            return Err("no path in the unix domain socket");
        }
        return Ok((Server::Unix(p.into()), url.to_string()));
    }
    if url.is_empty() {
        return Err("no host");
    }
    let (host, port) = if let Some(rest) = url.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or("invalid host")?;
        match tail.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if tail.is_empty() => (h, None),
            None => return Err("invalid host"),
        }
    } else {
        match url.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return Err("invalid host"),
            None => (url, None),
        }
    };
    let port = match port {
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err("invalid port"),
        },
        None => 514,
    };
    if host.is_empty() {
        return Err("no host");
    }
    let addr = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port),
        Err(_) => (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut i| i.next())
            .ok_or("host not found")?,
    };
    Ok((Server::Inet(addr), addr.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_and_errors_in_nginx_words() {
        let p = Peer::parse("server=127.0.0.1").expect("parse");
        assert_eq!(
            p.server,
            Server::Inet("127.0.0.1:514".parse().expect("addr"))
        );
        assert_eq!((p.facility, p.severity, p.tag.as_str()), (23, 6, "nginx"));
        let p =
            Peer::parse("server=[::1]:5140,facility=daemon,severity=warn,tag=my_app1,nohostname")
                .expect("parse");
        assert_eq!(p.server, Server::Inet("[::1]:5140".parse().expect("addr")));
        assert_eq!((p.facility, p.severity, p.tag.as_str()), (3, 4, "my_app1"));
        assert!(p.nohostname);
        let p = Peer::parse("server=unix:/dev/log").expect("parse");
        assert_eq!(p.server, Server::Unix("/dev/log".into()));
        for (args, err) in [
            ("facility=local0", "no syslog server specified"),
            ("", "unknown syslog parameter \"\""),
            (
                "server=1.2.3.4,server=1.2.3.4",
                "duplicate syslog \"server\"",
            ),
            ("server=1.2.3.4,facility=x", "unknown syslog facility \"x\""),
            (
                "server=1.2.3.4,severity=err",
                "unknown syslog severity \"err\"",
            ),
            (
                "server=1.2.3.4,tag=a-b",
                "syslog \"tag\" only allows alphanumeric characters and underscore",
            ),
            (
                "server=1.2.3.4,tag=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                "syslog tag length exceeds 32",
            ),
            (
                "server=1.2.3.4,foo=1,tag=x",
                "unknown syslog parameter \"foo=1,tag=x\"",
            ),
            (
                "server=1.2.3.4:0",
                "invalid port in syslog server \"1.2.3.4:0\"",
            ),
        ] {
            assert_eq!(Peer::parse(args).err().as_deref(), Some(err), "{args}");
        }
    }

    #[test]
    fn datagrams_as_nginx_sends_them() {
        let rx = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let port = rx.local_addr().expect("addr").port();
        let p =
            Peer::parse(&format!("server=127.0.0.1:{port},facility=local0,tag=t1")).expect("parse");
        p.send_error_line(Level::Warn, "2026/01/01 00:00:00 [warn] 1#1: hello\n");
        p.send_access(b"GET / 200\n").expect("send");
        let mut buf = [0u8; 4096];
        let n = rx.recv(&mut buf).expect("recv");
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        // local0 = 16: 16 * 8 + warn (4).
        assert!(m.starts_with("<132>"), "{m}");
        assert!(
            m.ends_with(&format!(
                " {} t1: 2026/01/01 00:00:00 [warn] 1#1: hello",
                host()
            )),
            "{m}"
        );
        let n = rx.recv(&mut buf).expect("recv");
        let m = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(m.starts_with("<134>"), "{m}");
        assert!(m.ends_with(" t1: GET / 200"), "{m}");
        // "<134>Jan  1 00:00:00 ": the day is space-padded.
        assert_eq!(&m.as_bytes()[8..9], b" ");
        assert_eq!(&m.as_bytes()[11..12], b" ");
    }
}
