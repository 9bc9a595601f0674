//! `scgi_pass` and `scgi_cache` against an SCGI server written in Python
//! (started by the test): the netstring tern sends, as the server saw it
//! (echoed in the body), and the answers tern relays, compared byte for
//! byte with what the real nginx does on the same configuration.

use std::process::{Child, Command, Stdio};

use crate::harness::{
    blank_date_server, dechunked, eventually, framing_blind, free_port, nginx_installed, raw,
    start_nginx, ConfTest, Prefix, Server,
};

/// The SCGI server: one thread per connection; the answer is chosen by
/// REQUEST_URI and mostly echoes the request's headers and body.
const SERVER: &str = r#"
import socket, sys, threading
count = {}
def handle(c):
    f = c.makefile('rb')
    n = b''
    while True:
        ch = f.read(1)
        if not ch:
            return
        if ch == b':':
            break
        n += ch
    hdr = f.read(int(n))
    f.read(1)
    parts = hdr.split(b'\0')[:-1]
    env = list(zip(parts[0::2], parts[1::2]))
    d = dict(env)
    body = f.read(int(d.get(b'CONTENT_LENGTH', b'0') or 0))
    uri = d.get(b'REQUEST_URI', b'/')
    dump = b''.join(k + b'=' + v + b'\n' for k, v in env)
    dump += b'body=%d %d\n' % (len(body), sum(body))
    count[uri] = count.get(uri, 0) + 1
    if uri.startswith(b'/status'):
        out = b'Status: 404 Not Here\r\nContent-Type: text/plain\r\nX-Accel-Expires: 5\r\n\r\n' + dump
    elif uri.startswith(b'/redirect'):
        out = b'Location: /elsewhere\r\n\r\n'
    elif uri.startswith(b'/http'):
        out = b'HTTP/1.1 201 Made\r\nContent-Type: text/plain\r\nServer: py\r\nDate: Mon, 01 Jan 2001 00:00:00 GMT\r\n\r\n' + dump
    elif uri.startswith(b'/len'):
        out = b'Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello'
    elif uri.startswith(b'/big'):
        out = b'Content-Type: text/plain\r\n\r\n' + bytes(b'abcdefghijklmnopqrstuvwxyz'[i % 26] for i in range(100000))
    elif uri.startswith(b'/cache'):
        out = b'Content-Type: text/plain\r\nCache-Control: max-age=60\r\n\r\nanswer %d\n' % count[uri]
    elif uri.startswith(b'/hc/'):
        # A Content-Length the body may disagree with; nothing after the
        # head for HEAD in the 'empty' case.
        kind = uri[4:]
        head = d.get(b'REQUEST_METHOD') == b'HEAD'
        out = b'Content-Type: text/html\nContent-Length: %s\n\n' % (b'100' if kind == b'short' else b'8')
        out += {b'empty': b'' if head else b'SEE-THIS', b'matching': b'SEE-THIS',
                b'extra': b'SEE-THIS-BUT-NOT-THIS\n', b'short': b'SEE-THIS\n'}.get(kind, b'')
    elif uri.startswith(b'/bad'):
        out = b'Status: abc\r\n\r\n'
    else:
        out = b'Content-Type: text/plain\r\nX-Powered-By: py\r\n\r\n' + dump
    c.sendall(out)
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1])))
s.listen(64)
while True:
    c, _ = s.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
"#;

/// The Python SCGI server, killed when dropped.
struct Backend(Child);

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn backend(p: &Prefix) -> Option<(Backend, u16)> {
    let script = p.write("scgi_server.py", SERVER);
    let port = free_port();
    let child = Command::new("python3")
        .arg(&script)
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let b = Backend(child);
    eventually(10, "scgi server listening", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Some((b, port))
}

const PARAMS: &str = "\
    scgi_param REQUEST_METHOD $request_method;\n\
    scgi_param REQUEST_URI $request_uri;\n\
    scgi_param QUERY_STRING $query_string;\n\
    scgi_param CONTENT_TYPE $content_type;\n\
    scgi_param DOCUMENT_URI $document_uri;\n\
    scgi_param SCGI 1;\n\
    scgi_param SERVER_PROTOCOL $server_protocol;\n\
    scgi_param HTTPS $https if_not_empty;\n\
    scgi_param HTTP_X_OVERRIDE set-by-param;\n";

fn conf(bport: u16, cache: &str) -> String {
    format!(
        "http {{\n\
         access_log off;\n\
         client_body_buffer_size 16k;\n\
         scgi_cache_path {cache} keys_zone=sc:1m;\n\
         server {{ listen 127.0.0.1:@PORT@; server_name scgi.test;\n\
           location / {{\n{PARAMS}\
             scgi_pass 127.0.0.1:{bport};\n\
           }}\n\
           location /nohdr/ {{ scgi_param ONLY 1; scgi_param REQUEST_URI $request_uri; scgi_pass_request_headers off; scgi_pass 127.0.0.1:{bport}; }}\n\
           location /nobody/ {{ scgi_param REQUEST_URI $request_uri; scgi_pass_request_body off; scgi_pass 127.0.0.1:{bport}; }}\n\
           location /hide/ {{ scgi_param REQUEST_URI /x; scgi_hide_header X-Powered-By; scgi_pass 127.0.0.1:{bport}; }}\n\
           location /hc/ {{ scgi_param REQUEST_URI $request_uri; scgi_param REQUEST_METHOD $request_method;\n\
             scgi_cache sc; scgi_cache_key $request_uri; scgi_cache_valid any 1m; add_after_body /after;\n\
             scgi_pass 127.0.0.1:{bport}; }}\n\
           location = /after {{ return 200 \":after\\n\"; }}\n\
           location /cache {{\n\
             scgi_param REQUEST_URI $request_uri;\n\
             scgi_cache sc; scgi_cache_key $request_uri;\n\
             add_header X-Cache $upstream_cache_status;\n\
             scgi_pass 127.0.0.1:{bport};\n\
           }}\n\
         }}\n\
         }}\n"
    )
}

fn requests() -> Vec<Vec<u8>> {
    let mut big = b"POST /upload HTTP/1.1\r\nHost: scgi.test\r\nContent-Type: application/octet-stream\r\nContent-Length: 70000\r\nConnection: close\r\n\r\n".to_vec();
    big.extend((0..70_000u32).map(|i| (i % 251) as u8));
    vec![
        b"GET /index?a=1&b=2 HTTP/1.1\r\nHost: scgi.test\r\nUser-Agent: t/1\r\nX-Override: from-client\r\nX-Dup: 1\r\nX-Dup: 2\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /plain HTTP/1.0\r\n\r\n".to_vec(),
        b"POST /form HTTP/1.1\r\nHost: scgi.test\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello=world".to_vec(),
        b"POST /chunked HTTP/1.1\r\nHost: scgi.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".to_vec(),
        big,
        b"HEAD /head HTTP/1.1\r\nHost: scgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /status HTTP/1.1\r\nHost: scgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /redirect HTTP/1.1\r\nHost: scgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /http HTTP/1.1\r\nHost: scgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /len HTTP/1.1\r\nHost: scgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /big HTTP/1.1\r\nHost: scgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /nohdr/x HTTP/1.1\r\nHost: scgi.test\r\nX-A: b\r\nConnection: close\r\n\r\n".to_vec(),
        b"POST /nobody/x HTTP/1.1\r\nHost: scgi.test\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc".to_vec(),
        b"GET /hide/ HTTP/1.1\r\nHost: scgi.test\r\nConnection: close\r\n\r\n".to_vec(),
    ]
}

/// A response with its Date/Server values and the listening port blanked,
/// a chunked body decoded.
fn norm(b: &[u8], port: u16) -> String {
    dechunked(&blank_date_server(&String::from_utf8_lossy(b)).replace(&port.to_string(), "PORT"))
}

#[test]
fn requests_and_answers_match_nginx() {
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let Some((_b, bport)) = backend(&p) else {
        return;
    };
    let pn = Prefix::new();
    let nport = free_port();
    let c = conf(bport, &pn.path("cache").display().to_string());
    let nginx = start_nginx(&pn, &c, nport).expect("nginx starts");
    let from_nginx: Vec<String> = requests()
        .iter()
        .map(|r| norm(&raw(nport, r), nport))
        .collect();
    drop(nginx);
    let pt = Prefix::new();
    let c = conf(bport, &pt.path("cache").display().to_string());
    let tern = Server::start_in(pt, &c);
    for (r, want) in requests().iter().zip(&from_nginx) {
        let got = norm(&raw(tern.port, r), tern.port);
        assert_eq!(
            got,
            *want,
            "request {:?}",
            String::from_utf8_lossy(&r[..r.len().min(60)])
        );
    }
    // An invalid `Status:` is nginx's 502 (the pages differ in the
    // server's name only).
    let bad = b"GET /bad HTTP/1.0\r\n\r\n";
    let line = |b: Vec<u8>| {
        String::from_utf8_lossy(&b)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(line(raw(tern.port, bad)), "HTTP/1.1 502 Bad Gateway");
    // The first answer, spelled out: CONTENT_LENGTH first, the params in
    // order, the client's headers as HTTP_* (a duplicate twice, the one a
    // param sets left out).
    let first = &from_nginx[0];
    let body = &first[first.find("\r\n\r\n").expect("head") + 4..];
    let body = body.strip_prefix("[chunked]").unwrap_or(body);
    assert!(
        body.starts_with("CONTENT_LENGTH=0\nREQUEST_METHOD=GET\nREQUEST_URI=/index?a=1&b=2\n"),
        "{body}"
    );
    assert!(body.contains("HTTP_X_OVERRIDE=set-by-param\n"), "{body}");
    assert!(!body.contains("from-client"), "{body}");
    assert!(body.contains("HTTP_X_DUP=1\nHTTP_X_DUP=2\n"), "{body}");
}

#[test]
fn cache_matches_nginx() {
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let Some((_b, bport)) = backend(&p) else {
        return;
    };
    let get = |port: u16, path: &str| {
        let r = format!("GET {path} HTTP/1.1\r\nHost: scgi.test\r\nConnection: close\r\n\r\n");
        norm(&raw(port, r.as_bytes()), port)
    };
    let pn = Prefix::new();
    let nport = free_port();
    let c = conf(bport, &pn.path("cache").display().to_string());
    let nginx = start_nginx(&pn, &c, nport).expect("nginx starts");
    let n = [get(nport, "/cache/n"), get(nport, "/cache/n")];
    drop(nginx);
    let pt = Prefix::new();
    let c = conf(bport, &pt.path("cache").display().to_string());
    let tern = Server::start_in(pt, &c);
    let t = [get(tern.port, "/cache/t"), get(tern.port, "/cache/t")];
    assert!(
        n[0].contains("X-Cache: MISS") && n[1].contains("X-Cache: HIT"),
        "{n:?}"
    );
    assert_eq!(t[0], n[0]);
    // A HIT goes with Content-Length where nginx repeats upstream's
    // framing (DIFFERENCES.md).
    assert_eq!(framing_blind(&t[1]), framing_blind(&n[1]));
}

#[test]
fn config_checks() {
    let base = |inner: &str| {
        format!("events {{}}\nhttp {{\nserver {{\nlocation / {{\n{inner}\n}}\n}}\n}}\n")
    };
    let t = ConfTest::run(&base("scgi_pass 127.0.0.1:0;"));
    t.assert_says("emerg", "invalid port in upstream \"127.0.0.1:0\"", 5);
    let t = ConfTest::run(&base("scgi_pass backend;"));
    t.assert_says("emerg", "no port in upstream \"backend\"", 5);
    let t = ConfTest::run(&base("scgi_param A b c;"));
    t.assert_says("emerg", "invalid parameter \"c\"", 5);
    let t = ConfTest::run(&base(
        "scgi_pass 127.0.0.1:9000;\nscgi_pass 127.0.0.1:9001;",
    ));
    t.assert_says("emerg", "\"scgi_pass\" directive is duplicate", 6);
}

/// An answer to HEAD is read to the close for the cache, which keeps it
/// only when its length agrees with its Content-Length (nginx's check on
/// upstream_eof): a HEAD answered without its body, or with more or less
/// than declared, is not stored, and the GET that follows goes upstream
/// (scgi_extra_data.t).
#[test]
fn head_answers_cached_only_when_whole() {
    let p = Prefix::new();
    let Some((_b, bport)) = backend(&p) else {
        return;
    };
    let ask = |port: u16, m: &str, path: &str| {
        let r = format!("{m} {path} HTTP/1.0\r\nHost: scgi.test\r\n\r\n");
        norm(&raw(port, r.as_bytes()), port)
    };
    let kinds = ["empty", "matching", "extra", "short"];
    let run = |port: u16| {
        let mut out = Vec::new();
        for k in kinds {
            out.push(ask(port, "HEAD", &format!("/hc/{k}")));
        }
        for k in kinds {
            out.push(ask(port, "GET", &format!("/hc/{k}")));
        }
        out
    };
    let pt = Prefix::new();
    let c = conf(bport, &pt.path("cache").display().to_string());
    let tern = Server::start_in(pt, &c);
    let t = run(tern.port);
    let body = |a: &str| a.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    // Not cached: the GET gets the script's whole answer.
    assert_eq!(body(&t[4]).as_deref(), Some("SEE-THIS:after\n"), "{}", t[4]);
    // Cached from the HEAD (the lengths agree).
    assert_eq!(body(&t[5]).as_deref(), Some("SEE-THIS:after\n"), "{}", t[5]);
    // Not cached; the GET's answer is cut at its Content-Length.
    assert_eq!(body(&t[6]).as_deref(), Some("SEE-THIS:after\n"), "{}", t[6]);
    // Not cached; the GET's answer ends short: no after-body.
    assert_eq!(body(&t[7]).as_deref(), Some("SEE-THIS\n"), "{}", t[7]);
    drop(tern);
    if nginx_installed() {
        let pn = Prefix::new();
        let nport = free_port();
        let c = conf(bport, &pn.path("cache").display().to_string());
        let nginx = start_nginx(&pn, &c, nport).expect("nginx starts");
        let n = run(nport);
        drop(nginx);
        assert_eq!(t, n);
    }
}
