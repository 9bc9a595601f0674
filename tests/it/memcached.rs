//! `memcached_pass` against the real memcached (Debian's package, started
//! by the test): values, a missing key (nginx's 404), `memcached_gzip_flag`,
//! HEAD, and an unset `$memcached_key`, compared with what the real nginx
//! answers on the same configuration.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};

use crate::harness::{
    blank_date_server, eventually, free_port, nginx_installed, raw, start_nginx, Server,
};

/// memcached, killed when dropped.
struct Backend(Child);

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn backend() -> Option<(Backend, u16)> {
    if !std::path::Path::new("/usr/bin/memcached").exists() {
        return None;
    }
    let port = free_port();
    let child = Command::new("/usr/bin/memcached")
        .args(["-l", "127.0.0.1", "-U", "0", "-u", "nobody", "-p"])
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let b = Backend(child);
    eventually(10, "memcached listening", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Some((b, port))
}

/// Stores `key` with `flags` and `value` (the text protocol's `set`).
fn set(port: u16, key: &str, flags: u32, value: &[u8]) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("memcached");
    let mut cmd = format!("set {key} {flags} 0 {}\r\n", value.len()).into_bytes();
    cmd.extend_from_slice(value);
    cmd.extend_from_slice(b"\r\n");
    s.write_all(&cmd).expect("set");
    let mut b = [0u8; 8];
    let n = s.read(&mut b).expect("STORED");
    assert_eq!(&b[..n], b"STORED\r\n");
}

fn conf(mport: u16) -> String {
    format!(
        "http {{ access_log off; server_tokens off;\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /mc/ {{ set $memcached_key $uri; memcached_gzip_flag 2;\n\
             memcached_pass 127.0.0.1:{mport}; }}\n\
           location /nokey/ {{ memcached_pass 127.0.0.1:{mport}; }}\n\
         }} }}\n"
    )
}

#[test]
fn answers_match_nginx() {
    if !nginx_installed() {
        return;
    }
    let Some((_b, mport)) = backend() else {
        return;
    };
    set(mport, "/mc/x.html", 0, b"<p>hello</p>");
    set(mport, "/mc/gz", 2, b"\x1f\x8b not really");
    set(mport, "/mc/empty", 0, b"");
    let reqs: Vec<&[u8]> = vec![
        b"GET /mc/x.html HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
        b"GET /mc/gz HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
        b"GET /mc/empty HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
        b"HEAD /mc/x.html HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
        b"GET /mc/x.html HTTP/1.0\r\n\r\n",
    ];
    let pn = crate::harness::Prefix::new();
    let nport = free_port();
    let nginx = start_nginx(&pn, &conf(mport), nport).expect("nginx starts");
    let n: Vec<String> = reqs
        .iter()
        .map(|r| blank_date_server(&String::from_utf8_lossy(&raw(nport, r))))
        .collect();
    let status = |p: u16, r: &[u8]| {
        let b = raw(p, r);
        String::from_utf8_lossy(&b)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    };
    let n_missing = status(nport, b"GET /mc/none HTTP/1.0\r\n\r\n");
    let n_nokey = status(nport, b"GET /nokey/x HTTP/1.0\r\n\r\n");
    drop(nginx);
    let tern = Server::start(&conf(mport));
    for (r, want) in reqs.iter().zip(&n) {
        let got = blank_date_server(&String::from_utf8_lossy(&raw(tern.port, r)));
        assert_eq!(got, *want);
    }
    assert!(
        n[0].starts_with("HTTP/1.1 200 OK\r\n") && n[0].ends_with("<p>hello</p>"),
        "{}",
        n[0]
    );
    assert!(n[1].contains("Content-Encoding: gzip\r\n"), "{}", n[1]);
    assert_eq!(
        status(tern.port, b"GET /mc/none HTTP/1.0\r\n\r\n"),
        n_missing
    );
    assert_eq!(n_missing, "HTTP/1.1 404 Not Found");
    assert_eq!(status(tern.port, b"GET /nokey/x HTTP/1.0\r\n\r\n"), n_nokey);
    assert_eq!(n_nokey, "HTTP/1.1 500 Internal Server Error");
    // The log goes through the writer thread: waited for.
    tern.wait_error_log("the \"$memcached_key\" variable is not set");
}

/// memcached's `total_connections`.
fn connections(port: u16) -> u64 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("memcached");
    s.write_all(b"stats\r\nquit\r\n").expect("stats");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines()
        .find_map(|l| l.strip_prefix("STAT total_connections "))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_connections")
}

/// With `keepalive`, a missing key (`END`, nginx's 404 page), also with
/// `memcached_next_upstream not_found`, leaves its connection to the
/// next request, as a value does; HEAD reads no value, so its connection
/// is closed (memcached_keepalive.t).
#[test]
fn keepalive_as_nginx() {
    let Some((_b, mport)) = backend() else {
        return;
    };
    set(mport, "/k/v", 0, b"SEE-THIS");
    let c = format!(
        "http {{ access_log off;\n\
         upstream memd {{ server 127.0.0.1:{mport}; keepalive 1; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /k/ {{ set $memcached_key $uri; memcached_pass memd; }}\n\
           location /next/ {{ set $memcached_key $uri; memcached_next_upstream not_found; memcached_pass memd; }}\n\
         }} }}\n"
    );
    let tern = Server::start(&c);
    // Each stats call is a connection of its own.
    let before = connections(mport);
    assert_eq!(tern.get("/k/v").body_str(), "SEE-THIS");
    assert_eq!(tern.get("/k/missing").status, 404);
    assert_eq!(tern.get("/next/missing").status, 404);
    assert_eq!(tern.get("/k/v").body_str(), "SEE-THIS");
    assert_eq!(
        connections(mport),
        before + 2,
        "one for tern, one for stats"
    );
    let before = connections(mport);
    let r = raw(tern.port, b"HEAD /k/v HTTP/1.0\r\n\r\n");
    assert!(!String::from_utf8_lossy(&r).contains("SEE-THIS"));
    assert_eq!(tern.get("/k/v").body_str(), "SEE-THIS");
    assert_eq!(connections(mport), before + 2, "a new one after HEAD");
}
