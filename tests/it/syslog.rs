//! `syslog:` destinations of `error_log` and `access_log`, in http and
//! stream: the datagrams (RFC 3164 header, facility, severity, tag,
//! `nohostname`) compared with nginx's on the same configuration, the
//! report of a send to a dead server, and the configuration errors.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use crate::harness::*;

const STREAM_SO: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// A syslog server: a bound UDP socket that collects datagrams.
struct Collector(UdpSocket);

impl Collector {
    fn new() -> Collector {
        let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        Collector(s)
    }

    fn port(&self) -> u16 {
        self.0.local_addr().expect("addr").port()
    }

    /// The datagrams that arrive until `until` holds for them, or 10 s;
    /// then whatever else arrives within 300 ms.
    fn collect(&self, until: impl Fn(&[String]) -> bool) -> Vec<String> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = vec![0u8; 65536];
        while !until(&got) && Instant::now() < deadline {
            if let Ok(n) = self.0.recv(&mut buf) {
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        let quiet = Instant::now() + Duration::from_millis(300);
        while Instant::now() < quiet {
            if let Ok(n) = self.0.recv(&mut buf) {
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        got
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// Checks the RFC 3164 header nginx writes and names what varies:
/// `<PRI>TIME [HOST ]TAG: MESSAGE` with the error-log time, pid#tid,
/// connection number, prefix and client ports of MESSAGE blanked.
fn normalize(m: &str, prefix: &str, ports: &[(u16, &str)]) -> String {
    let close = m.find('>').expect("PRI");
    assert!(m.starts_with('<'), "{m}");
    let pri: u32 = m[1..close].parse().expect("PRI number");
    let time = &m[close + 1..close + 16];
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    assert!(months.contains(&&time[..3]), "{m}");
    let tb = time.as_bytes();
    assert!(
        tb[3] == b' ' && (tb[4] == b' ' || tb[4].is_ascii_digit()),
        "{m}"
    );
    assert!(
        tb[5].is_ascii_digit() && &time[6..7] == " " && &time[9..10] == ":",
        "{m}"
    );
    let mut rest = m[close + 16..].to_string();
    assert!(rest.starts_with(' '), "{m}");
    let host = format!(" {} ", hostname());
    if rest.starts_with(&host) {
        rest = format!(" HOST {}", &rest[host.len()..]);
    }
    let mut out = format!("<{pri}>TIME{rest}");
    out = out.replace(prefix, "PREFIX");
    for (p, name) in ports {
        out = out.replace(&format!(":{p}"), &format!(":{name}"));
    }
    // The error-log line inside: "YYYY/MM/DD hh:mm:ss [level] pid#tid: *N ".
    if let Some(i) = out.find(": 20") {
        let s = i + 2;
        if out.len() > s + 19 && &out[s + 4..s + 5] == "/" {
            out.replace_range(s..s + 19, "ELTIME");
        }
    }
    let mut t = String::new();
    let mut chars = out.chars().peekable();
    // pid#tid and *conn numbers, and client ports (127.0.0.1:digits).
    while let Some(c) = chars.next() {
        t.push(c);
        let numbered = c == '#' || c == '*' || (c == ':' && t.ends_with("127.0.0.1:"));
        if numbered && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            while chars.peek().is_some_and(|d| d.is_ascii_digit()) {
                chars.next();
            }
            t.push('N');
        }
    }
    // "[info] 1234#" -> "[info] PID#".
    let mut u = String::new();
    let mut rest = t.as_str();
    while let Some(i) = rest.find("] ") {
        u.push_str(&rest[..i + 2]);
        rest = &rest[i + 2..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with('#') {
            u.push_str("PID");
            rest = &rest[digits..];
        }
    }
    u.push_str(rest);
    u
}

/// The same configuration in nginx and in tern: an http server whose
/// error log (`facility=user,tag=web`) and access log
/// (`severity=notice,nohostname`) go to syslog, and a stream server whose
/// error and access logs share one syslog server. The datagrams compare
/// equal, header included.
#[test]
fn datagrams_compare_with_nginx() {
    if !nginx_installed() || !std::path::Path::new(STREAM_SO).exists() {
        eprintln!("skipped: nginx with its stream module not installed");
        return;
    }
    let run = |nginx: bool| -> (Vec<String>, Vec<String>, Vec<String>) {
        let (u1, u2, u3) = (Collector::new(), Collector::new(), Collector::new());
        let sp = free_port();
        let body = format!(
            "http {{
                log_format s '$remote_addr \"$request\" $status';
                server {{
                    listen 127.0.0.1:@PORT@;
                    error_log syslog:server=127.0.0.1:{},facility=user,tag=web error;
                    access_log syslog:server=127.0.0.1:{},severity=notice,nohostname s;
                }}
            }}
            stream {{
                log_format l '$remote_addr $status $bytes_sent';
                server {{
                    listen 127.0.0.1:{sp};
                    return ok;
                    error_log syslog:server=127.0.0.1:{} info;
                    access_log syslog:server=127.0.0.1:{},tag=str l;
                }}
            }}\n",
            u1.port(),
            u2.port(),
            u3.port(),
            u3.port()
        );
        let p = Prefix::new();
        let prefix = p.dir.display().to_string();
        let (_nginx, _tern, hp);
        if nginx {
            hp = free_port();
            let conf = format!("load_module {STREAM_SO};\nevents {{}}\n{body}");
            _nginx = Some(start_nginx(&p, &conf, hp).expect("nginx started"));
            _tern = None;
        } else {
            // Listening on the http port means every listener is open: no
            // probe of the stream port (it would be a logged session).
            let t = Server::start_in(p, &body);
            hp = t.port;
            _tern = Some(t);
            _nginx = None;
        }
        let r = raw(hp, b"GET /nope.html HTTP/1.0\r\n\r\n");
        assert!(
            r.starts_with(b"HTTP/1.1 404"),
            "{}",
            String::from_utf8_lossy(&r)
        );
        let mut c = connect(sp);
        assert_eq!(read_to_close(&mut c), b"ok");
        let ports = [(hp, "H"), (sp, "S")];
        let norm = |v: Vec<String>| -> Vec<String> {
            let mut v: Vec<String> = v.iter().map(|m| normalize(m, &prefix, &ports)).collect();
            v.sort();
            v
        };
        let e = norm(u1.collect(|g| !g.is_empty()));
        let a = norm(u2.collect(|g| !g.is_empty()));
        let s = norm(u3.collect(|g| g.iter().any(|m| m.contains(" str: "))));
        (e, a, s)
    };
    let n = run(true);
    let t = run(false);
    // user (1) * 8 + error (3); local7 (23) * 8 + notice (5), no host.
    assert_eq!(
        n.0,
        vec![
            "<11>TIME HOST web: ELTIME [error] PID#N: *N open() \"PREFIX/html/nope.html\" \
             failed (2: No such file or directory), client: 127.0.0.1, server: , \
             request: \"GET /nope.html HTTP/1.0\""
                .to_string()
        ]
    );
    assert_eq!(t.0, n.0, "http error_log datagrams differ from nginx");
    assert_eq!(
        n.1,
        vec!["<189>TIME nginx: 127.0.0.1 \"GET /nope.html HTTP/1.0\" 404".to_string()]
    );
    assert_eq!(t.1, n.1, "http access_log datagrams differ from nginx");
    assert!(
        n.2.contains(&"<190>TIME HOST str: 127.0.0.1 200 2".to_string()),
        "{:?}",
        n.2
    );
    assert_eq!(t.2, n.2, "stream syslog datagrams differ from nginx");
}

/// A syslog server that is not there: the refused send is reported in
/// the main error log in nginx's words, and the socket is made again for
/// the next line (which arrives once the server is up).
#[test]
fn refused_send_is_reported_and_the_next_line_goes_out() {
    let dead = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let port = dead.local_addr().expect("addr").port();
    drop(dead);
    let srv = Server::start(&format!(
        "error_log logs/error.log info;
         http {{ server {{ listen 127.0.0.1:@PORT@;
             access_log syslog:server=127.0.0.1:{port} combined;
             location / {{ return 200 ok; }} }} }}\n"
    ));
    // The first datagram goes out; the port-unreachable answer makes a
    // later send on the same socket fail.
    let mut log = String::new();
    eventually(10, "a refused send reported", || {
        srv.get("/");
        log = srv.error_log();
        log.contains("send() to syslog failed")
    });
    let refused = log
        .lines()
        .find(|l| l.contains("send() failed (111: Connection refused) while logging to syslog"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(refused.contains(" [error] "), "{refused}");
    assert!(
        refused.ends_with(&format!("server: 127.0.0.1:{port}")),
        "{refused}"
    );
    let warn = log
        .lines()
        .find(|l| l.contains("send() to syslog failed"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(warn.contains(" [warn] "), "{warn}");
    assert!(
        warn.ends_with(
            "send() to syslog failed while logging request, client: 127.0.0.1, \
             server: , request: \"GET / HTTP/1.1\", host: \"localhost\""
        ),
        "{warn}"
    );
    // Now a server on that port gets the next line.
    let up = UdpSocket::bind(("127.0.0.1", port)).expect("rebind");
    up.set_read_timeout(Some(Duration::from_millis(200))).ok();
    let mut buf = [0u8; 4096];
    let mut got = None;
    eventually(10, "a datagram after the failure", || {
        srv.get("/again");
        if let Ok(n) = up.recv(&mut buf) {
            got = Some(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        got.is_some()
    });
    let m = got.unwrap_or_default();
    assert!(m.starts_with("<190>"), "{m}");
    assert!(m.contains(" nginx: 127.0.0.1 - - ["), "{m}");
    assert!(
        m.ends_with("\"GET /again HTTP/1.1\" 200 2 \"-\" \"-\""),
        "{m}"
    );
}

#[test]
fn configuration_errors_in_nginx_words() {
    for (directive, msg) in [
        (
            "error_log syslog:facility=local0;",
            "no syslog server specified",
        ),
        (
            "error_log syslog:server=127.0.0.1,severity=err;",
            "unknown syslog severity \"err\"",
        ),
        (
            "error_log syslog:server=127.0.0.1,tag=a-b;",
            "syslog \"tag\" only allows alphanumeric characters and underscore",
        ),
        (
            "access_log syslog:server=127.0.0.1 combined buffer=4k;",
            "logs to syslog cannot be buffered",
        ),
        (
            "access_log syslog:server=127.0.0.1,x=1 combined;",
            "unknown syslog parameter \"x=1\"",
        ),
    ] {
        let t = ConfTest::run(&format!(
            "events {{}}\nhttp {{\nserver {{\n{directive}\n}}\n}}\n"
        ));
        t.assert_says("emerg", msg, 4);
    }
}
