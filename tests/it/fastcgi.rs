//! `fastcgi_pass` and the `fastcgi_*` directives against a small FastCGI
//! responder written here (loopback TCP or a unix socket): the records
//! tern sends (compared byte for byte, or param by param, with what the
//! real nginx sends for the same request and configuration), the answers
//! it relays (compared with nginx's), keep_conn, next_upstream, stderr,
//! and the configuration checks.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::harness::{
    free_port, nginx_installed, raw, start_nginx, ConfTest, DeadPort, Prefix, Resp, Server,
};

/// One request as the responder received it.
#[derive(Debug, Clone, Default)]
struct Got {
    /// Every byte of the request's records, in order.
    raw: Vec<u8>,
    begin: Vec<u8>,
    params: Vec<(String, String)>,
    stdin: Vec<u8>,
    /// STDIN record content lengths, in order (the framing).
    stdin_records: Vec<usize>,
}

impl Got {
    fn param(&self, n: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    }
}

type Answer = dyn Fn(&Got) -> Vec<u8> + Send + Sync;

/// A FastCGI responder: records what it gets, answers what `answer`
/// returns for it, keeps the connection when FCGI_KEEP_CONN asks.
struct Responder {
    got: Arc<Mutex<Vec<Got>>>,
    conns: Arc<AtomicUsize>,
}

impl Responder {
    fn tcp(port: u16, answer: Arc<Answer>) -> Responder {
        let l = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind responder");
        let r = Responder {
            got: Arc::default(),
            conns: Arc::default(),
        };
        let (got, conns) = (r.got.clone(), r.conns.clone());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                conns.fetch_add(1, Ordering::SeqCst);
                let (got, answer) = (got.clone(), answer.clone());
                std::thread::spawn(move || serve(s, got, answer));
            }
        });
        r
    }

    fn unix(path: &std::path::Path, answer: Arc<Answer>) -> Responder {
        let l = std::os::unix::net::UnixListener::bind(path).expect("bind unix responder");
        // tern's workers run as nobody (as php-fpm's listen.mode allows).
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path, m| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
        };
        mode(path, 0o666);
        if let Some(d) = path.parent() {
            mode(d, 0o755);
        }
        let r = Responder {
            got: Arc::default(),
            conns: Arc::default(),
        };
        let (got, conns) = (r.got.clone(), r.conns.clone());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                conns.fetch_add(1, Ordering::SeqCst);
                let (got, answer) = (got.clone(), answer.clone());
                std::thread::spawn(move || serve(s, got, answer));
            }
        });
        r
    }

    fn take(&self) -> Vec<Got> {
        std::mem::take(&mut *self.got.lock().unwrap())
    }
}

fn read_record<S: Read>(s: &mut S, raw: &mut Vec<u8>) -> Option<(u8, Vec<u8>)> {
    let mut h = [0u8; 8];
    s.read_exact(&mut h).ok()?;
    let len = usize::from(h[4]) << 8 | usize::from(h[5]);
    let mut c = vec![0u8; len + usize::from(h[6])];
    s.read_exact(&mut c).ok()?;
    raw.extend_from_slice(&h);
    raw.extend_from_slice(&c);
    c.truncate(len);
    Some((h[1], c))
}

fn nv_len(b: &[u8], i: &mut usize) -> usize {
    if b[*i] < 128 {
        *i += 1;
        usize::from(b[*i - 1])
    } else {
        let n = u32::from_be_bytes([b[*i] & 0x7f, b[*i + 1], b[*i + 2], b[*i + 3]]);
        *i += 4;
        n as usize
    }
}

fn serve<S: Read + Write>(mut s: S, got: Arc<Mutex<Vec<Got>>>, answer: Arc<Answer>) {
    loop {
        let mut g = Got::default();
        let mut params = Vec::new();
        loop {
            let Some((kind, c)) = read_record(&mut s, &mut g.raw) else {
                return;
            };
            match kind {
                1 => g.begin = c,
                4 => params.extend_from_slice(&c),
                5 if c.is_empty() => break,
                5 => {
                    g.stdin_records.push(c.len());
                    g.stdin.extend_from_slice(&c);
                }
                _ => return,
            }
        }
        let mut i = 0;
        while i < params.len() {
            let n = nv_len(&params, &mut i);
            let v = nv_len(&params, &mut i);
            let name = String::from_utf8_lossy(&params[i..i + n]).into_owned();
            let value = String::from_utf8_lossy(&params[i + n..i + n + v]).into_owned();
            i += n + v;
            g.params.push((name, value));
        }
        let keep = g.begin.get(2) == Some(&1);
        let out = answer(&g);
        got.lock().unwrap().push(g);
        if s.write_all(&out).is_err() || !keep {
            return;
        }
    }
}

/// One record (request id 1), padded to 8 bytes.
fn rec(kind: u8, c: &[u8]) -> Vec<u8> {
    let pad = (8 - c.len() % 8) % 8;
    let mut o = vec![
        1,
        kind,
        0,
        1,
        (c.len() >> 8) as u8,
        c.len() as u8,
        pad as u8,
        0,
    ];
    o.extend_from_slice(c);
    o.extend_from_slice(&vec![0; pad]);
    o
}

/// STDOUT records of `out` (split at 8000 bytes), then END_REQUEST.
fn reply(out: &[u8]) -> Vec<u8> {
    let mut o = Vec::new();
    for c in out.chunks(8000) {
        o.extend(rec(6, c));
    }
    o.extend(rec(3, &[0; 8]));
    o
}

/// The responder's answers, chosen by the request's REQUEST_URI.
fn script(g: &Got) -> Vec<u8> {
    let uri = g.param("REQUEST_URI").unwrap_or("").to_string();
    let path = uri.split('?').next().unwrap_or("");
    let path = path.strip_prefix("/c").unwrap_or(path);
    match path {
        "/status" => reply(b"Status: 404 Not Found\r\nContent-Type: text/plain\r\nX-Accel-Expires: 5\r\nX-Mine: 1\r\n\r\ngone\n"),
        "/redirect" => reply(b"Location: /elsewhere\r\n\r\n"),
        "/abs" => reply(b"Location: http://example.com/x\r\n\r\n"),
        "/lf" => reply(b"Content-Type: text/plain\nX-A: b\n\nlf body"),
        "/len" => reply(b"Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"),
        "/big" => {
            let mut o = b"Content-Type: text/plain\r\n\r\n".to_vec();
            o.extend((0..100_000u32).map(|i| b'a' + (i % 26) as u8));
            reply(&o)
        }
        "/stderr" => {
            let mut o = rec(7, b"PHP Notice: something\n");
            o.extend(reply(b"Content-Type: text/plain\r\n\r\nok"));
            o
        }
        "/nohead" => reply(b""),
        "/fatal" => {
            let mut o = rec(7, b"PHP Fatal error: boom in /x.php\n");
            o.extend(reply(b"Content-Type: text/plain\r\n\r\nhalf"));
            o
        }
        "/badstatus" => reply(b"Status: abc\r\n\r\n"),
        "/server" => reply(b"Server: php\r\nDate: Mon, 01 Jan 2001 00:00:00 GMT\r\nX-Powered-By: PHP/8\r\nContent-Type: text/html\r\n\r\n<p>"),
        _ => reply(b"Content-Type: text/plain\r\n\r\nok"),
    }
}

const PARAMS: &str = "\
    fastcgi_param  QUERY_STRING       $query_string;\n\
    fastcgi_param  REQUEST_METHOD     $request_method;\n\
    fastcgi_param  CONTENT_TYPE       $content_type;\n\
    fastcgi_param  CONTENT_LENGTH     $content_length;\n\
    fastcgi_param  SCRIPT_NAME        $fastcgi_script_name;\n\
    fastcgi_param  PATH_INFO          $fastcgi_path_info;\n\
    fastcgi_param  REQUEST_URI        $request_uri;\n\
    fastcgi_param  DOCUMENT_URI       $document_uri;\n\
    fastcgi_param  SERVER_PROTOCOL    $server_protocol;\n\
    fastcgi_param  REQUEST_SCHEME     $scheme;\n\
    fastcgi_param  HTTPS              $https if_not_empty;\n\
    fastcgi_param  GATEWAY_INTERFACE  CGI/1.1;\n\
    fastcgi_param  REMOTE_ADDR        $remote_addr;\n\
    fastcgi_param  SERVER_ADDR        $server_addr;\n\
    fastcgi_param  SERVER_NAME        $server_name;\n\
    fastcgi_param  REDIRECT_STATUS    200;\n\
    fastcgi_param  HTTP_X_OVERRIDE    set-by-param;\n";

/// The configuration both servers run (FastCGI on `fport`).
fn conf(fport: u16) -> String {
    format!(
        "http {{\n\
         access_log off;\n\
         client_body_buffer_size 16k;\n\
         server {{ listen 127.0.0.1:@PORT@; server_name fcgi.test;\n\
           root /srv/fcgi;\n\
           location / {{\n{PARAMS}\
             fastcgi_split_path_info ^(.+?\\.php)(/.*)$;\n\
             fastcgi_index index.php;\n\
             fastcgi_pass 127.0.0.1:{fport};\n\
           }}\n\
           location /nohdr/ {{ fastcgi_param ONLY 1; fastcgi_pass_request_headers off; fastcgi_pass 127.0.0.1:{fport}; }}\n\
           location /nobody/ {{ fastcgi_param CL $content_length; fastcgi_pass_request_body off; fastcgi_pass 127.0.0.1:{fport}; }}\n\
           location /hide/ {{ fastcgi_hide_header X-Powered-By; fastcgi_pass_header X-Accel-Expires; fastcgi_pass 127.0.0.1:{fport}; }}\n\
         }}\n\
         }}\n"
    )
}

/// The requests of the differential tests (raw, so both get the same bytes).
fn requests() -> Vec<Vec<u8>> {
    let mut big = b"POST /upload.php HTTP/1.1\r\nHost: fcgi.test\r\nContent-Type: application/octet-stream\r\nContent-Length: 70000\r\nConnection: close\r\n\r\n".to_vec();
    big.extend((0..70_000u32).map(|i| (i % 251) as u8));
    vec![
        b"GET /index.php?a=1&b=2 HTTP/1.1\r\nHost: fcgi.test\r\nUser-Agent: t/1\r\nAccept: */*\r\nX-Override: from-client\r\nX-Dup: 1\r\nX-Dup: 2\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /app/index.php/extra/path?q HTTP/1.1\r\nHost: fcgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /dir/ HTTP/1.1\r\nHost: fcgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /plain%20name.txt HTTP/1.0\r\n\r\n".to_vec(),
        b"POST /form.php HTTP/1.1\r\nHost: fcgi.test\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello=world".to_vec(),
        b"POST /chunked.php HTTP/1.1\r\nHost: fcgi.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".to_vec(),
        big,
        b"HEAD /head.php HTTP/1.1\r\nHost: fcgi.test\r\nConnection: close\r\n\r\n".to_vec(),
        b"GET /nohdr/x HTTP/1.1\r\nHost: fcgi.test\r\nX-A: b\r\nConnection: close\r\n\r\n".to_vec(),
        b"POST /nobody/x HTTP/1.1\r\nHost: fcgi.test\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc".to_vec(),
    ]
}

/// What a server sent for each request: the param list with the
/// per-server values normalized, and the framing.
fn normalized(g: &Got, port: u16) -> String {
    let mut s = format!("begin={:?}\n", g.begin);
    for (k, v) in &g.params {
        let v = v.replace(&port.to_string(), "PORT");
        s.push_str(&format!("{}={}\n", k, v));
    }
    s.push_str(&format!(
        "stdin {} bytes, records {:?}, md5-ish {}\n",
        g.stdin.len(),
        g.stdin_records,
        g.stdin
            .iter()
            .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(*b)))
    ));
    s
}

#[test]
fn params_and_stdin_match_nginx() {
    if !nginx_installed() {
        return;
    }
    let fport = free_port();
    let resp = Responder::tcp(fport, Arc::new(script));
    let c = conf(fport);
    let pn = Prefix::new();
    let nport = free_port();
    let nginx = start_nginx(&pn, &c, nport).expect("nginx starts");
    let mut from_nginx = Vec::new();
    for r in requests() {
        let _ = raw(nport, &r);
        from_nginx.extend(resp.take());
    }
    drop(nginx);
    let tern = Server::start(&c);
    let mut from_tern = Vec::new();
    for r in requests() {
        let _ = raw(tern.port, &r);
        from_tern.extend(resp.take());
    }
    assert_eq!(from_nginx.len(), requests().len());
    assert_eq!(from_tern.len(), from_nginx.len());
    for (a, b) in from_nginx.iter().zip(&from_tern) {
        assert_eq!(normalized(a, nport), normalized(b, tern.port));
        // Without port-dependent params the records are the same bytes.
        if a.param("SERVER_PORT").is_none() && a.raw.len() == b.raw.len() {
            assert_eq!(a.raw, b.raw);
        }
    }
    // The first request, spelled out: the client's headers as HTTP_*
    // after the params, a duplicate sent twice, one a param sets left out.
    let g = &from_tern[0];
    assert_eq!(g.begin, [0, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(g.param("SCRIPT_NAME"), Some("/index.php"));
    assert_eq!(g.param("QUERY_STRING"), Some("a=1&b=2"));
    assert_eq!(g.param("HTTP_X_OVERRIDE"), Some("set-by-param"));
    assert_eq!(
        g.params.iter().filter(|(k, _)| k == "HTTP_X_DUP").count(),
        2
    );
    assert!(g.param("HTTPS").is_none());
    // split_path_info and index.
    assert_eq!(from_tern[1].param("SCRIPT_NAME"), Some("/app/index.php"));
    assert_eq!(from_tern[1].param("PATH_INFO"), Some("/extra/path"));
    assert_eq!(from_tern[2].param("SCRIPT_NAME"), Some("/dir/index.php"));
    // Bodies: in memory, chunked (sent with its length), from a temp file.
    assert_eq!(from_tern[4].stdin, b"hello=world");
    assert_eq!(from_tern[5].stdin, b"hello world");
    assert_eq!(from_tern[5].param("CONTENT_LENGTH"), Some("11"));
    assert_eq!(from_tern[6].stdin.len(), 70_000);
    assert_eq!(from_tern[6].stdin_records, vec![32768, 32768, 4464]);
    // pass_request_headers off / pass_request_body off.
    assert_eq!(from_tern[8].params, vec![("ONLY".into(), "1".into())]);
    assert!(from_tern[9].stdin.is_empty());
    assert_eq!(from_tern[9].param("CL"), Some("3"));
}

/// Status, headers (Date/Server/Connection dropped) and body.
fn answer_of(port: u16, path: &str) -> String {
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: fcgi.test\r\nConnection: close\r\n\r\n",
        path
    );
    let bytes = raw(port, req.as_bytes());
    let r = Resp::parse(&bytes).expect("response");
    let mut s = format!("{}\n", r.status_line);
    for (k, v) in &r.headers {
        if matches!(
            k.to_ascii_lowercase().as_str(),
            "date" | "server" | "connection"
        ) {
            continue;
        }
        // Error pages name the server (nginx/1.22.1 vs tern's version).
        if r.status >= 500 && k.eq_ignore_ascii_case("content-length") {
            continue;
        }
        let v = v.replace(&port.to_string(), "PORT");
        s.push_str(&format!("{}: {}\n", k, v));
    }
    let body = if r.body.len() > 200 {
        format!("{} bytes", r.body.len())
    } else if r.status >= 500 {
        "(error page)".to_string()
    } else {
        r.body_str()
    };
    s.push_str(&body);
    s
}

#[test]
fn answers_match_nginx() {
    if !nginx_installed() {
        return;
    }
    let fport = free_port();
    let _resp = Responder::tcp(fport, Arc::new(script));
    let c = conf(fport);
    let paths = [
        "/ok",
        "/status",
        "/redirect",
        "/abs",
        "/lf",
        "/len",
        "/big",
        "/stderr",
        "/nohead",
        "/badstatus",
        "/server",
        "/hide/x",
    ];
    let pn = Prefix::new();
    let nport = free_port();
    let nginx = start_nginx(&pn, &c, nport).expect("nginx starts");
    let want: Vec<String> = paths.iter().map(|p| answer_of(nport, p)).collect();
    drop(nginx);
    let tern = Server::start(&c);
    let got: Vec<String> = paths.iter().map(|p| answer_of(tern.port, p)).collect();
    for ((p, a), b) in paths.iter().zip(&want).zip(&got) {
        assert_eq!(a, b, "{}", p);
    }
    // The script's own Server and Date replace tern's (once each).
    let r = Resp::parse(&raw(
        tern.port,
        b"GET /server HTTP/1.1\r\nHost: fcgi.test\r\nConnection: close\r\n\r\n",
    ))
    .expect("response");
    let all = |n: &str| {
        r.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(all("server"), vec!["php"]);
    assert_eq!(all("date"), vec!["Mon, 01 Jan 2001 00:00:00 GMT"]);
    let log = tern.wait_error_log("FastCGI sent in stderr: \"PHP Notice: something\" while reading response header from upstream");
    assert!(log.contains("upstream: \"fastcgi://127.0.0.1:"), "{}", log);
    tern.wait_error_log(
        "upstream prematurely closed FastCGI stdout while reading response header from upstream",
    );
}

#[test]
fn unix_socket_keep_conn_and_keepalive() {
    let p = Prefix::new();
    let sock = p.path("php.sock");
    let resp = Responder::unix(&sock, Arc::new(script));
    let c = format!(
        "http {{ access_log off;\n\
         upstream php {{ server unix:{s}; keepalive 4; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /k/ {{ fastcgi_param REQUEST_URI $request_uri; fastcgi_keep_conn on; fastcgi_pass php; }}\n\
           location /c/ {{ fastcgi_param REQUEST_URI $request_uri; fastcgi_pass unix:{s}; }}\n\
         }} }}\n",
        s = sock.display()
    );
    let tern = Server::start_in(p, &c);
    for path in ["/k/1", "/k/2", "/k/3"] {
        let r = tern.get(path);
        assert_eq!(r.status, 200);
        assert_eq!(r.body_str(), "ok");
    }
    // One connection carried all three (FCGI_KEEP_CONN, kept by `keepalive`).
    assert_eq!(resp.conns.load(Ordering::SeqCst), 1);
    let got = resp.take();
    assert!(got.iter().all(|g| g.begin == [0, 1, 1, 0, 0, 0, 0, 0]));
    for path in ["/c/1", "/c/2"] {
        assert_eq!(tern.get(path).body_str(), "ok");
    }
    // Without keep_conn the responder closes, and each request connects.
    assert_eq!(resp.conns.load(Ordering::SeqCst), 3);
    let r = tern.get("/c/big");
    assert_eq!(r.body.len(), 100_000);
}

#[test]
fn next_upstream_and_failures() {
    let (a, b) = (free_port(), free_port());
    // Bound, not listening, for the whole test.
    let dead_guard = DeadPort::new();
    let dead = dead_guard.port;
    let _ra = Responder::tcp(
        a,
        Arc::new(|_: &Got| reply(b"Status: 503\r\nContent-Type: text/plain\r\n\r\nbusy")),
    );
    let _rb = Responder::tcp(b, Arc::new(script));
    let c = format!(
        "http {{ access_log off;\n\
         upstream ab {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}\n\
         upstream db {{ server 127.0.0.1:{dead}; server 127.0.0.1:{b}; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           add_header X-Addr $upstream_addr always;\n\
           add_header X-Status $upstream_status always;\n\
           location /h503/ {{ fastcgi_next_upstream error timeout http_503; fastcgi_pass ab; }}\n\
           location /dead/ {{ fastcgi_pass db; }}\n\
           location /gone/ {{ fastcgi_connect_timeout 1s; fastcgi_pass 127.0.0.1:{dead}; }}\n\
           location /intercept/ {{ fastcgi_intercept_errors on; error_page 503 =200 /fallback; fastcgi_pass 127.0.0.1:{a}; }}\n\
           location = /fallback {{ return 200 \"fallback\"; }}\n\
           location /var/ {{ set $be 127.0.0.1:{b}; fastcgi_pass $be; }}\n\
           location /catch/ {{ fastcgi_param REQUEST_URI /fatal; fastcgi_catch_stderr \"PHP Fatal\"; fastcgi_pass 127.0.0.1:{b}; }}\n\
           location /nocatch/ {{ fastcgi_param REQUEST_URI /fatal; fastcgi_pass 127.0.0.1:{b}; }}\n\
         }} }}\n"
    );
    let tern = Server::start(&c);
    let r = tern.get("/h503/");
    assert_eq!(r.status, 200);
    let addr = r.header("x-addr").unwrap_or("").to_string();
    assert!(addr.ends_with(&format!("127.0.0.1:{b}")), "{addr}");
    let r = tern.get("/dead/");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-addr"),
        Some(format!("127.0.0.1:{dead}, 127.0.0.1:{b}").as_str())
    );
    assert_eq!(r.header("x-status"), Some("502, 200"));
    assert_eq!(tern.get("/gone/").status, 502);
    tern.wait_error_log(&format!(
        "connect() failed (111: Connection refused) while connecting to upstream, client: 127.0.0.1, server: , request: \"GET /gone/ HTTP/1.1\", upstream: \"fastcgi://127.0.0.1:{dead}\""
    ));
    let r = tern.get("/intercept/");
    assert_eq!((r.status, r.body_str().as_str()), (200, "fallback"));
    assert_eq!(tern.get("/var/").body_str(), "ok");
    // fastcgi_catch_stderr: a matching stderr line makes the answer invalid.
    assert_eq!(tern.get("/catch/").status, 502);
    tern.wait_error_log("FastCGI sent in stderr: \"PHP Fatal error: boom in /x.php\" while reading response header from upstream, client: 127.0.0.1, server: , request: \"GET /catch/");
    let r = tern.get("/nocatch/");
    assert_eq!((r.status, r.body_str().as_str()), (200, "half"));
    let log = tern.wait_error_log("FastCGI sent in stderr: \"PHP Fatal error: boom in /x.php\" while reading response header from upstream, client: 127.0.0.1, server: , request: \"GET /nocatch/");
    // /nocatch/'s line comes after all of /catch/'s.
    assert!(!log.contains("invalid header"), "{log}");
}

#[test]
fn params_inherit_as_nginx() {
    let fport = free_port();
    let resp = Responder::tcp(fport, Arc::new(script));
    let c = format!(
        "http {{ access_log off; fastcgi_param FROM http;\n\
         server {{ listen 127.0.0.1:@PORT@; fastcgi_pass_request_headers off;\n\
           location /a/ {{ fastcgi_pass 127.0.0.1:{fport}; }}\n\
           location /b/ {{ fastcgi_param OWN 1; fastcgi_param EMPTY $arg_x if_not_empty; fastcgi_pass 127.0.0.1:{fport}; }}\n\
         }} }}\n"
    );
    let tern = Server::start(&c);
    tern.get("/a/");
    tern.get("/b/");
    tern.get("/b/?x=1");
    let got = resp.take();
    let lists: Vec<HashMap<String, String>> = got
        .iter()
        .map(|g| g.params.iter().cloned().collect())
        .collect();
    assert_eq!(lists[0].keys().collect::<Vec<_>>(), vec!["FROM"]);
    assert_eq!(lists[1].len(), 1);
    assert_eq!(lists[1].get("OWN").map(String::as_str), Some("1"));
    assert_eq!(lists[2].get("EMPTY").map(String::as_str), Some("1"));
}

#[test]
fn config_checks() {
    let base = |inner: &str| {
        format!("events {{}}\nhttp {{\nserver {{\nlocation / {{\n{inner}\n}}\n}}\n}}\n")
    };
    let t = ConfTest::run(&base("fastcgi_split_path_info ^(.+)$;"));
    t.assert_says("emerg", "pattern \"^(.+)$\" must have 2 captures", 5);
    // fastcgi has no built-in cache key: nginx refuses a cache without one.
    let t = ConfTest::run(
        "events {}\nhttp {\nfastcgi_cache_path cache keys_zone=one:1m;\nserver {\nlocation / {\nfastcgi_cache one;\n}\n}\n}\n",
    );
    assert_eq!(t.code, Some(1), "{}", t.stderr);
    assert!(
        t.stderr
            .contains("no \"fastcgi_cache_key\" for \"fastcgi_cache\""),
        "{}",
        t.stderr
    );
    let t = ConfTest::run(&base("fastcgi_pass 127.0.0.1:0;"));
    t.assert_says("emerg", "invalid port in upstream \"127.0.0.1:0\"", 5);
    let t = ConfTest::run(&base("fastcgi_pass backend;"));
    t.assert_says("emerg", "no port in upstream \"backend\"", 5);
    // An upstream block is found wherever it is in the http block.
    let t = ConfTest::run(
        "events {}\nhttp {\nserver {\nlocation / { fastcgi_pass php; }\n}\n\
         upstream php { server 127.0.0.1:9000; }\n}\n",
    );
    assert_eq!(t.code, Some(0), "{}", t.stderr);
    let t = ConfTest::run(&base("fastcgi_param A b c;"));
    t.assert_says("emerg", "invalid parameter \"c\"", 5);
    let t = ConfTest::run(&base("fastcgi_keep_conn maybe;"));
    assert_eq!(t.code, Some(1), "{}", t.stderr);
    // Debian's snippet with the shipped fastcgi.conf passes.
    let p = Prefix::new();
    let root = env!("CARGO_MANIFEST_DIR");
    for f in ["fastcgi.conf", "fastcgi_params"] {
        let text = std::fs::read_to_string(format!("{root}/conf/{f}")).expect("shipped conf");
        p.write(&format!("conf/{f}"), text);
    }
    p.write(
        "conf/snippets/fastcgi-php.conf",
        "fastcgi_split_path_info ^(.+?\\.php)(/.*)$;\n\
         try_files $fastcgi_script_name =404;\n\
         set $path_info $fastcgi_path_info;\n\
         fastcgi_param PATH_INFO $path_info;\n\
         fastcgi_index index.php;\n\
         include fastcgi.conf;\n",
    );
    let conf = p.write(
        "conf/nginx.conf",
        "events {}\nhttp {\nserver {\nlisten 127.0.0.1:1;\nlocation ~ \\.php$ {\n\
         include snippets/fastcgi-php.conf;\nfastcgi_pass unix:/run/php/php-fpm.sock;\n}\n\
         location /p { include fastcgi_params; fastcgi_pass 127.0.0.1:9000; }\n}\n}\n",
    );
    let o = p.run(&["-t", "-c", conf.to_str().unwrap_or("")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The responder's answers for the status-line cases, by path.
fn status_script(g: &Got) -> Vec<u8> {
    let uri = g.param("REQUEST_URI").unwrap_or("").to_string();
    let path = uri.split('?').next().unwrap_or("");
    let head: &[u8] = match path {
        "/st/none" => b"Content-Type: text/plain\r\n",
        "/st/bare" => b"Status: 200\r\n",
        "/st/here" => b"Status: 404 Not Here\r\n",
        "/st/spaces" => b"Status:    404    Not  Here   \r\n",
        "/st/loc" => b"Location: /x\r\n",
        "/st/locempty" => b"Location:\r\n",
        "/st/locst" => b"Location: /x\r\nStatus: 201 Made\r\n",
        "/st/first" => b"Status: 200 A\r\nStatus: 404 B\r\n",
        "/st/firstbad" => b"Status: 200 A\r\nStatus: abc\r\n",
        "/st/glued" => b"Status: 404Not\r\n",
        "/st/wide" => b"Status: 4041 x\r\n",
        "/st/lower" => b"status: 201 lower\r\n",
        "/st/tab" => b"Status: 200 \t\r\nX-T:\tv\t\r\n",
        "/st/600" => b"Status: 600 Odd\r\n",
        "/st/999" => b"Status: 999 high\r\n",
        "/st/000" => b"Status: 000\r\n",
        "/st/099" => b"Status: 099 low\r\n",
        "/st/100" => b"Status: 100 Continue\r\n",
        "/st/103" => b"Status: 103 Early\r\nLink: </a>\r\n",
        "/st/204" => b"Status: 204 Nothing\r\n",
        "/st/304" => b"Status: 304 Same\r\n",
        "/st/len" => b"Status: 200 Fine\r\nContent-Length: 1\r\n",
        "/st/short" => b"Status: 42\r\n",
        "/st/tabfirst" => b"Status:\t200 T\r\n",
        "/st/empty" => b"Status:\r\n",
        "/st/cond" => {
            b"Status: 200 Fine\r\nLast-Modified: Mon, 01 Jan 2001 00:00:00 GMT\r\nETag: \"abc\"\r\n"
        }
        "/st/condnone" => b"Last-Modified: Mon, 01 Jan 2001 00:00:00 GMT\r\nETag: \"abc\"\r\n",
        _ => b"Status: 500 Unknown Case\r\n",
    };
    let mut o = head.to_vec();
    o.extend_from_slice(b"\r\nx");
    reply(&o)
}

/// The whole answer with Date and Server blanked (and a 5xx page's body,
/// which names the server).
fn wire(port: u16, req: &str) -> String {
    let bytes = raw(port, req.as_bytes());
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut out: Vec<String> = head
        .split("\r\n")
        .filter(|l| !l.starts_with("Date: ") && !l.starts_with("Server: "))
        .filter(|l| !(head.starts_with("HTTP/1.1 5") && l.starts_with("Content-Length: ")))
        .map(str::to_string)
        .collect();
    out.push(if head.starts_with("HTTP/1.1 5") {
        "(error page)".to_string()
    } else {
        format!("{body:?}")
    });
    out.join("\n")
}

/// Asks both servers each request and compares the answers byte for byte
/// (but for Date, Server and error page bodies).
fn compare_with_nginx(conf: &str, reqs: &[String]) -> crate::harness::Server {
    let pn = Prefix::new();
    let nport = free_port();
    let nginx = start_nginx(&pn, conf, nport).expect("nginx starts");
    let want: Vec<String> = reqs.iter().map(|r| wire(nport, r)).collect();
    drop(nginx);
    let tern = Server::start(conf);
    for (r, w) in reqs.iter().zip(&want) {
        assert_eq!(&wire(tern.port, r), w, "{r}");
    }
    tern
}

/// One location passing everything to the responder on `fport`.
fn status_conf(fport: u16) -> String {
    format!(
        "http {{ access_log off;\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ fastcgi_param REQUEST_URI $request_uri; fastcgi_pass 127.0.0.1:{fport}; }}\n\
         }} }}\n"
    )
}

/// nginx builds the status line from the script's `Status:` as it came
/// (`404 Not Here`, `200`, `404Not`, `000`), or `302 Moved Temporarily`
/// for a `Location:` alone, or `200 OK`; a status below 200 goes with
/// its body unframed and the connection closed.
#[test]
fn status_lines_match_nginx() {
    if !nginx_installed() {
        return;
    }
    let fport = free_port();
    let _resp = Responder::tcp(fport, Arc::new(status_script));
    let c = status_conf(fport);
    let mut reqs: Vec<String> = [
        "none", "bare", "here", "spaces", "loc", "locempty", "locst", "first", "firstbad", "glued",
        "wide", "lower", "tab", "600", "999", "000", "099", "100", "103", "204", "304", "len",
        "short", "tabfirst", "empty",
    ]
    .iter()
    .map(|p| format!("GET /st/{p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    .collect();
    reqs.push("HEAD /st/here HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".into());
    reqs.push("GET /st/bare HTTP/1.0\r\n\r\n".into());
    reqs.push("GET /st/000 HTTP/1.0\r\n\r\n".into());
    let tern = compare_with_nginx(&c, &reqs);
    tern.wait_error_log(
        "upstream sent invalid status \"42\" while reading response header from upstream",
    );
}

/// A FastCGI answer is not cached (tern has no fastcgi_cache), so, as in
/// nginx, conditional request headers do not turn it into 304 or 412: it
/// goes as the script answered.
#[test]
fn conditional_requests_go_as_the_script_answered() {
    if !nginx_installed() {
        return;
    }
    let fport = free_port();
    let _resp = Responder::tcp(fport, Arc::new(status_script));
    let c = status_conf(fport);
    let mut reqs = Vec::new();
    for p in ["cond", "condnone"] {
        for h in [
            "If-Modified-Since: Mon, 01 Jan 2001 00:00:00 GMT",
            "If-None-Match: \"abc\"",
            "If-None-Match: *",
            "If-Match: \"zzz\"",
            "If-Unmodified-Since: Mon, 01 Jan 2000 00:00:00 GMT",
        ] {
            reqs.push(format!(
                "GET /st/{p} HTTP/1.1\r\nHost: x\r\n{h}\r\nConnection: close\r\n\r\n"
            ));
        }
    }
    compare_with_nginx(&c, &reqs);
}

/// `fastcgi_cache`: the second request is a HIT that never reaches the
/// responder, with the same head and body as nginx gives.
#[test]
fn cache_matches_nginx() {
    if !nginx_installed() {
        return;
    }
    let fport = free_port();
    let resp = Responder::tcp(fport, Arc::new(script));
    let conf = |cache: &str| {
        format!(
            "http {{ access_log off;\n\
             fastcgi_cache_path {cache} levels=1:2 keys_zone=fc:1m;\n\
             server {{ listen 127.0.0.1:@PORT@;\n\
               location / {{ fastcgi_param REQUEST_URI $request_uri;\n\
                 fastcgi_cache fc; fastcgi_cache_key $request_uri; fastcgi_cache_valid 200 1m;\n\
                 add_header X-Cache $upstream_cache_status;\n\
                 fastcgi_pass 127.0.0.1:{fport}; }}\n\
             }} }}\n"
        )
    };
    let get = |port: u16, path: &str| {
        let r = format!("GET {path} HTTP/1.1\r\nHost: c\r\nConnection: close\r\n\r\n");
        crate::harness::blank_date_server(&String::from_utf8_lossy(&raw(port, r.as_bytes())))
    };
    let pn = Prefix::new();
    let nport = free_port();
    let nginx =
        start_nginx(&pn, &conf(&pn.path("c").display().to_string()), nport).expect("nginx starts");
    let n = [get(nport, "/len"), get(nport, "/len"), get(nport, "/x")];
    drop(nginx);
    assert_eq!(resp.take().len(), 2);
    let pt = Prefix::new();
    let c = conf(&pt.path("c").display().to_string());
    let tern = Server::start_in(pt, &c);
    let t = [
        get(tern.port, "/len"),
        get(tern.port, "/len"),
        get(tern.port, "/x"),
    ];
    assert!(
        n[0].contains("X-Cache: MISS") && n[1].contains("X-Cache: HIT"),
        "{n:?}"
    );
    assert_eq!(t, n);
    assert_eq!(resp.take().len(), 2);
}

/// Answers whose `Content-Length` disagrees with the STDOUT that follows.
fn length_script(g: &Got) -> Vec<u8> {
    let uri = g.param("REQUEST_URI").unwrap_or("").to_string();
    let path = uri.split('?').next().unwrap_or("");
    let path = path.strip_prefix("/unbuf").unwrap_or(path);
    let big = |declared: usize, sent: usize| {
        let mut o =
            format!("Content-Type: text/plain\r\nContent-Length: {declared}\r\n\r\n").into_bytes();
        o.extend((0..sent).map(|i| b'a' + (i % 26) as u8));
        reply(&o)
    };
    match path {
        "/extra" => reply(b"Content-Type: text/html\nContent-Length: 8\n\nSEE-THIS-BUT-NOT-THIS\n"),
        "/zero" => reply(b"Content-Type: text/html\nContent-Length: 0\n\nNOT-THIS\n"),
        "/short" => reply(b"Content-Type: text/html\nContent-Length: 100\n\nSEE-THIS-TOO-SHORT\n"),
        "/empty" => reply(b"Content-Type: text/html\nContent-Length: 100\n\n"),
        // The excess, and the end, in records of their own.
        "/records" => {
            let mut o = rec(6, b"Content-Type: text/html\nContent-Length: 8\n\nSEE-");
            o.extend(rec(6, b"THIS"));
            o.extend(rec(6, b"-BUT-NOT-THIS"));
            o.extend(reply(b""));
            o
        }
        "/bigextra" => big(70_000, 100_000),
        "/bigshort" => big(200_000, 100_000),
        // No blank line before the output ends (fastcgi_split.t).
        "/bad" => reply(b"BAD"),
        _ => reply(b"Content-Type: text/plain\r\n\r\nok"),
    }
}

/// nginx's FastCGI reading honours the script's `Content-Length`: what
/// comes after it is dropped with a warning, and an output that ends
/// short of it breaks the answer (the client gets what came, then the
/// connection closes: no `add_after_body`), buffered or not
/// (fastcgi_extra_data.t). An output that ends before its header block
/// is an invalid header, which `fastcgi_next_upstream invalid_header`
/// moves past (fastcgi_split.t).
#[test]
fn content_length_bounds_the_body() {
    let (fport, bad) = (free_port(), free_port());
    let resp = Responder::tcp(fport, Arc::new(length_script));
    let _bad = Responder::tcp(bad, Arc::new(|_: &Got| reply(b"BAD")));
    let c = format!(
        "http {{ access_log off;\n\
         upstream split {{ server 127.0.0.1:{bad}; server 127.0.0.1:{fport}; }}\n\
         fastcgi_param REQUEST_URI $request_uri;\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ fastcgi_pass 127.0.0.1:{fport}; add_after_body /after; }}\n\
           location /unbuf/ {{ fastcgi_pass 127.0.0.1:{fport}; fastcgi_buffering off; add_after_body /after; }}\n\
           location /split/ {{ fastcgi_pass split; fastcgi_next_upstream invalid_header; }}\n\
           location = /after {{ return 200 \":after\\n\"; }}\n\
         }} }}\n"
    );
    let reqs: Vec<String> = [
        "/extra",
        "/zero",
        "/short",
        "/empty",
        "/records",
        "/bigextra",
        "/bigshort",
        "/unbuf/extra",
        "/unbuf/zero",
        "/unbuf/short",
        "/unbuf/empty",
        "/unbuf/bigextra",
        "/unbuf/bigshort",
        "/split/",
    ]
    .iter()
    .map(|p| format!("GET {p} HTTP/1.0\r\n\r\n"))
    .collect();
    let tern = if nginx_installed() {
        compare_with_nginx(&c, &reqs)
    } else {
        Server::start(&c)
    };
    let body = |p: &str| {
        let bytes = raw(tern.port, format!("GET {p} HTTP/1.0\r\n\r\n").as_bytes());
        let text = String::from_utf8_lossy(&bytes).into_owned();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{p}: {text}");
        text.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default()
    };
    for pre in ["", "/unbuf"] {
        assert_eq!(body(&format!("{pre}/extra")), "SEE-THIS:after\n", "{pre}");
        assert_eq!(body(&format!("{pre}/zero")), ":after\n", "{pre}");
        assert_eq!(
            body(&format!("{pre}/short")),
            "SEE-THIS-TOO-SHORT\n",
            "{pre}"
        );
        assert_eq!(body(&format!("{pre}/empty")), "", "{pre}");
        // The excess is dropped; nginx ends this answer there, without
        // the after-body (compared above), and so does tern.
        assert_eq!(body(&format!("{pre}/bigextra")).len(), 70_000, "{pre}");
        assert_eq!(body(&format!("{pre}/bigshort")).len(), 100_000, "{pre}");
    }
    assert_eq!(body("/records"), "SEE-THIS:after\n");
    // (The excess is a warning, below the default error_log level.)
    tern.wait_error_log("upstream prematurely closed FastCGI request while reading upstream");
    assert_eq!(body("/split/"), "ok");
    tern.wait_error_log(
        "upstream prematurely closed FastCGI stdout while reading response header from upstream",
    );
    drop(resp);
}
