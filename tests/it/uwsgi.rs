//! `uwsgi_pass` against the real uWSGI server (Debian's `uwsgi` with its
//! Python 3 plugin, started by the test) running a WSGI app that echoes
//! the request it got: the vars tern sends and the answers it relays,
//! compared byte for byte with what the real nginx does on the same
//! configuration; `uwsgi_cache`; the packet header with the modifiers.

use std::io::Read;
use std::process::{Child, Command, Stdio};

use crate::harness::{
    blank_date_server, dechunked, eventually, framing_blind, free_port, nginx_installed, raw,
    start_nginx, ConfTest, Prefix, Server,
};

const APP: &str = r#"
count = {}
def application(environ, start_response):
    uri = environ.get('REQUEST_URI', '/')
    body = environ['wsgi.input'].read()
    keys = [k for k in environ if not (k.startswith('wsgi.') or k.startswith('uwsgi.'))]
    dump = ''.join('%s=%s\n' % (k, environ[k]) for k in keys).encode()
    dump += b'body=%d %d\n' % (len(body), sum(body))
    count[uri] = count.get(uri, 0) + 1
    if uri.startswith('/status'):
        start_response('404 Not Here', [('Content-Type', 'text/plain'), ('X-Accel-Expires', '5')])
        return [dump]
    if uri.startswith('/redirect'):
        start_response('302 Found', [('Location', '/elsewhere')])
        return [b'']
    if uri.startswith('/cache'):
        start_response('200 OK', [('Content-Type', 'text/plain'), ('Cache-Control', 'max-age=60')])
        return [b'answer %d\n' % count[uri]]
    if uri.startswith('/big'):
        start_response('200 OK', [('Content-Type', 'text/plain')])
        return [bytes(b'abcdefghijklmnopqrstuvwxyz'[i % 26] for i in range(100000))]
    if uri.startswith('/len'):
        start_response('200 OK', [('Content-Type', 'text/plain'), ('Content-Length', '5')])
        return [b'hello']
    start_response('200 OK', [('Content-Type', 'text/plain'), ('X-Powered-By', 'py')])
    return [dump]
"#;

/// uWSGI, killed when dropped.
struct Backend(Child);

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn backend(p: &Prefix) -> Option<(Backend, u16)> {
    if !std::path::Path::new("/usr/bin/uwsgi").exists() {
        return None;
    }
    let app = p.write("app.py", APP);
    let port = free_port();
    let child = Command::new("/usr/bin/uwsgi")
        .args(["--plugin", "python3", "--socket"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--wsgi-file")
        .arg(&app)
        .args(["--processes", "1", "--threads", "4", "--disable-logging"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let b = Backend(child);
    eventually(10, "uwsgi listening", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Some((b, port))
}

const PARAMS: &str = "\
    uwsgi_param QUERY_STRING $query_string;\n\
    uwsgi_param REQUEST_METHOD $request_method;\n\
    uwsgi_param CONTENT_TYPE $content_type;\n\
    uwsgi_param CONTENT_LENGTH $content_length;\n\
    uwsgi_param REQUEST_URI $request_uri;\n\
    uwsgi_param PATH_INFO $document_uri;\n\
    uwsgi_param SERVER_PROTOCOL $server_protocol;\n\
    uwsgi_param HTTPS $https if_not_empty;\n\
    uwsgi_param HTTP_X_OVERRIDE set-by-param;\n";

fn conf(bport: u16, cache: &str) -> String {
    format!(
        "http {{\n\
         access_log off;\n\
         client_body_buffer_size 16k;\n\
         uwsgi_cache_path {cache} keys_zone=uw:1m;\n\
         server {{ listen 127.0.0.1:@PORT@; server_name uwsgi.test;\n\
           location / {{\n{PARAMS}\
             uwsgi_pass 127.0.0.1:{bport};\n\
           }}\n\
           location /nohdr/ {{ uwsgi_param REQUEST_URI $request_uri; uwsgi_pass_request_headers off; uwsgi_pass uwsgi://127.0.0.1:{bport}; }}\n\
           location /hide/ {{ uwsgi_param REQUEST_URI /x; uwsgi_hide_header X-Powered-By; uwsgi_pass 127.0.0.1:{bport}; }}\n\
           location /cache {{\n\
             uwsgi_param REQUEST_URI $request_uri;\n\
             uwsgi_cache uw; uwsgi_cache_key $request_uri;\n\
             add_header X-Cache $upstream_cache_status;\n\
             uwsgi_pass 127.0.0.1:{bport};\n\
           }}\n\
         }}\n\
         }}\n"
    )
}

fn requests() -> Vec<Vec<u8>> {
    let mut big = b"POST /upload HTTP/1.1\r\nHost: uwsgi.test\r\nContent-Type: application/octet-stream\r\nContent-Length: 70000\r\nConnection: close\r\n\r\n".to_vec();
    big.extend((0..70_000u32).map(|i| (i % 251) as u8));
    vec![
        b"GET /index?a=1&b=2 HTTP/1.1\r\nHost: uwsgi.test\r\nUser-Agent: t/1\r\nX-Override: from-client\r\nX-Dup: 1\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /plain HTTP/1.0\r\n\r\n".to_vec(),
        b"POST /form HTTP/1.1\r\nHost: uwsgi.test\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello=world".to_vec(),
        b"POST /chunked HTTP/1.1\r\nHost: uwsgi.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".to_vec(),
        big,
        b"HEAD /head HTTP/1.1\r\nHost: uwsgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /status HTTP/1.1\r\nHost: uwsgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /redirect HTTP/1.1\r\nHost: uwsgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /len HTTP/1.1\r\nHost: uwsgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /big HTTP/1.1\r\nHost: uwsgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /nohdr/x HTTP/1.1\r\nHost: uwsgi.test\r\nX-A: b\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /hide/ HTTP/1.1\r\nHost: uwsgi.test\r\nConnection: close\r\n\r\n".to_vec(),
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
    let first = &from_nginx[0];
    assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{first}");
    assert!(
        first.contains("\nHTTP_X_OVERRIDE=set-by-param\n"),
        "{first}"
    );
    assert!(!first.contains("from-client"), "{first}");
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
        let r = format!("GET {path} HTTP/1.1\r\nHost: uwsgi.test\r\nConnection: close\r\n\r\n");
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

/// The packet as sent: modifier1, the vars' size little-endian, modifier2,
/// then length-prefixed names and values (a raw listener stands in for
/// uWSGI).
#[test]
fn packet_header_and_modifiers() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let bport = l.local_addr().expect("addr").port();
    let tern = Server::start(&format!(
        "http {{ access_log off; server {{ listen 127.0.0.1:@PORT@;\n\
         location / {{ uwsgi_param A bc; uwsgi_pass_request_headers off;\n\
         uwsgi_modifier1 5; uwsgi_modifier2 9; uwsgi_pass 127.0.0.1:{bport}; }} }} }}\n"
    ));
    let got = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut b = [0u8; 11];
        s.read_exact(&mut b).expect("packet");
        use std::io::Write;
        let _ = s.write_all(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nok");
        b
    });
    let r = raw(tern.port, b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(
        got.join().expect("listener"),
        *b"\x05\x07\x00\x09\x01\x00A\x02\x00bc"
    );
    assert!(String::from_utf8_lossy(&r).ends_with("\r\n\r\nok"));
}

#[test]
fn config_checks() {
    let base = |inner: &str| {
        format!("events {{}}\nhttp {{\nserver {{\nlocation / {{\n{inner}\n}}\n}}\n}}\n")
    };
    let t = ConfTest::run(&base("uwsgi_pass backend;"));
    t.assert_says("emerg", "no port in upstream \"backend\"", 5);
    let t = ConfTest::run(&base("uwsgi_param A b c;"));
    t.assert_says("emerg", "invalid parameter \"c\"", 5);
    let t = ConfTest::run(&base("uwsgi_pass uwsgi://127.0.0.1:9000;"));
    assert_eq!(t.code, Some(0), "{}", t.stderr);
}
