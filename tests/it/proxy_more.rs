//! `proxy_cookie_domain`, `proxy_cookie_path`, `proxy_cookie_flags`,
//! `proxy_method`, `proxy_bind`, `proxy_socket_keepalive`,
//! `proxy_ignore_client_abort` and `proxy_limit_rate`, with the real nginx
//! as the oracle where the bytes can be compared.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use crate::harness::{
    free_port, nginx_installed, raw, start_nginx, ConfTest, Prefix, Resp, Server,
};

/// Status, the Set-Cookie lines and the body of a GET.
fn cookies(port: u16, path: &str) -> String {
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        path
    );
    let got = raw(port, req.as_bytes());
    let text = String::from_utf8_lossy(&got).into_owned();
    let r = Resp::parse(&got).unwrap_or_else(|| panic!("no response to {}: {:?}", path, text));
    let body = r.body_str();
    let body = if body.contains("<html>") {
        "(error page)".to_string()
    } else {
        body
    };
    let mut out = format!("{} {} {}", path, r.status, body);
    for l in text.split("\r\n").take_while(|l| !l.is_empty()) {
        if l.to_ascii_lowercase().starts_with("set-cookie:") {
            out.push_str("\n  ");
            out.push_str(l);
        }
    }
    out
}

fn both(body: &str, paths: &[&str]) -> Vec<String> {
    let tern = Server::start(body);
    let ours: Vec<String> = paths.iter().map(|p| cookies(tern.port, p)).collect();
    let log = tern.error_log();
    drop(tern);
    if nginx_installed() {
        let p = Prefix::new();
        let port = free_port();
        let Some(_nginx) = start_nginx(&p, body, port) else {
            panic!("nginx did not start: {}", p.read("logs/error.log"));
        };
        let theirs: Vec<String> = paths.iter().map(|p| cookies(port, p)).collect();
        assert_eq!(
            ours.join("\n"),
            theirs.join("\n"),
            "\ntern:\n{}\nnginx:\n{}\ntern's log:\n{}",
            ours.join("\n"),
            theirs.join("\n"),
            log
        );
    }
    ours
}

#[test]
fn cookie_domain_path_and_flags_rewrite_as_nginx() {
    let b = free_port();
    let body = format!(
        "http {{ access_log off;\n\
         server {{ listen 127.0.0.1:{b};\n\
           location / {{\n\
             add_header Set-Cookie \"a=1; Path=/x/y; Domain=.Example.com; secure; SameSite=Lax\";\n\
             add_header Set-Cookie \"b=2;path=/x;  domain=example.com ;HttpOnly\";\n\
             add_header Set-Cookie \"noeq\";\n\
             add_header Set-Cookie \"c=3\";\n\
             add_header Set-Cookie \"d=4; Path=/other\";\n\
             return 200 ok; }} }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /f1/ {{ proxy_pass http://127.0.0.1:{b}/;\n\
             proxy_cookie_flags a nosecure httponly samesite=strict;\n\
             proxy_cookie_flags b secure nohttponly samesite; }}\n\
           location /f2/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_cookie_flags ~ secure foo nosamesite; }}\n\
           location /f3/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_cookie_flags ~^[ab]$ SameSite=None;\n\
             proxy_cookie_flags c samesite=lax httponly secure; }}\n\
           location /f4/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_cookie_flags $arg_c $arg_f; }}\n\
           location /d1/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_cookie_domain example.com new.org;\n\
             proxy_cookie_path /x/ /z/; }}\n\
           location /d2/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_cookie_domain ~^(.*)\\.com$ $1.net;\n\
             proxy_cookie_path ~*^/X(.*)$ /q$1; }}\n\
           location /d3/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_cookie_domain .EXAMPLE.com $host;\n\
             proxy_cookie_path /x /w; proxy_cookie_path /other /o; proxy_cookie_flags d secure; }}\n\
           location /off/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_cookie_domain off;\n\
             proxy_cookie_path off; proxy_cookie_flags off; }}\n\
         }}\n\
         }}\n"
    );
    let ours = both(
        &body,
        &[
            "/f1/",
            "/f2/",
            "/f3/",
            "/f4/?c=d&f=httponly",
            "/d1/",
            "/d2/",
            "/d3/",
            "/off/",
        ],
    );
    let text = ours.join("\n");
    for want in [
        "Set-Cookie: a=1; Path=/x/y; Domain=.Example.com; SameSite=Strict; HttpOnly",
        "Set-Cookie: b=2; path=/x; domain=example.com; Secure",
        "Set-Cookie: c=3; Secure; HttpOnly; SameSite=Lax",
        "Set-Cookie: a=1; Path=/z/y; Domain=.new.org; secure; SameSite=Lax",
        "Set-Cookie: b=2; path=/q; domain=example.net; HttpOnly",
        "Set-Cookie: d=4; Path=/o; Secure",
        "Set-Cookie: b=2;path=/x;  domain=example.com ;HttpOnly",
    ] {
        assert!(text.contains(want), "no {:?} in\n{}", want, text);
    }
}

#[test]
fn proxy_method_bind_and_keepalive_as_nginx() {
    let b = free_port();
    let body = format!(
        "http {{ access_log off;\n\
         server {{ listen 127.0.0.1:{b}; return 200 \"$request_method $remote_addr\"; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /put/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_method PUT; }}\n\
           location /var/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_method $arg_m; }}\n\
           location /bind/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_bind 127.0.0.2; }}\n\
           location /bindvar/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_bind $arg_a; }}\n\
           location /bindoff/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_bind off; }}\n\
           location /badbind/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_bind 192.0.2.1; }}\n\
           location /ka/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_socket_keepalive on;\n\
             proxy_ignore_client_abort on; }}\n\
         }}\n\
         }}\n"
    );
    let ours = both(
        &body,
        &[
            "/put/",
            "/var/?m=DELETE",
            "/var/",
            "/bind/",
            "/bindvar/?a=127.0.0.3",
            "/bindvar/",
            "/bindoff/",
            "/badbind/",
            "/ka/",
        ],
    );
    let text = ours.join("\n");
    for want in [
        "/put/ 200 PUT 127.0.0.1",
        "/var/?m=DELETE 200 DELETE 127.0.0.1",
        "/bind/ 200 GET 127.0.0.2",
        "/bindvar/?a=127.0.0.3 200 GET 127.0.0.3",
        "/bindvar/ 200 GET 127.0.0.1",
        "/ka/ 200 GET 127.0.0.1",
    ] {
        assert!(ours.iter().any(|l| l == want), "no {:?} in\n{}", want, text);
    }
    assert!(
        ours.iter().any(|l| l.starts_with("/badbind/ 500")),
        "{}",
        text
    );
}

#[test]
fn bind_failure_is_logged_as_nginx_words_it() {
    let s = Server::start(
        "http { server { listen 127.0.0.1:@PORT@;
            location / { proxy_pass http://127.0.0.1:1; proxy_bind 192.0.2.1; } } }",
    );
    assert_eq!(s.get("/").status, 500);
    // The error log is written by its own thread: wait for the line.
    let log = s.wait_error_log(
        "bind(192.0.2.1) failed (99: Cannot assign requested address) while connecting to upstream",
    );
    assert!(log.contains("[crit] "), "{}", log);
}

#[test]
fn limit_rate_paces_reading_from_upstream() {
    // The head first, the body (3000 bytes) a moment later, so that it is
    // read by the body reader the rate applies to.
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let mut b = [0u8; 4096];
                let _ = c.read(&mut b);
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3000\r\n\r\n");
                std::thread::sleep(Duration::from_millis(100));
                let _ = c.write_all(&[b'x'; 3000]);
            });
        }
    });
    let s = Server::start(&format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;
            location /slow/ {{ proxy_pass http://127.0.0.1:{port}/; proxy_limit_rate 1000; }}
            location /fast/ {{ proxy_pass http://127.0.0.1:{port}/; }} }} }}"
    ));
    let t = Instant::now();
    let r = s.get("/fast/");
    assert_eq!((r.status, r.body.len()), (200, 3000));
    assert!(t.elapsed() < Duration::from_millis(1500));
    let t = Instant::now();
    let r = s.get("/slow/");
    assert_eq!((r.status, r.body.len()), (200, 3000));
    // 1000 bytes in the first second, 1000 more in each next one.
    assert!(
        t.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn more_proxy_directives_are_checked_as_nginx() {
    let cases = [
        ("proxy_cookie_domain a;", "invalid parameter \"a\""),
        (
            "proxy_cookie_domain off; proxy_cookie_domain a b;",
            "\"proxy_cookie_domain\" directive is duplicate",
        ),
        (
            "proxy_cookie_path a b; proxy_cookie_path off;",
            "\"proxy_cookie_path\" directive is duplicate",
        ),
        (
            "proxy_cookie_flags off; proxy_cookie_flags a secure;",
            "\"proxy_cookie_flags\" directive is duplicate",
        ),
        (
            "proxy_cookie_flags a secure httponly samesite=lax nosecure;",
            "invalid number of arguments in \"proxy_cookie_flags\" directive",
        ),
        (
            "proxy_method;",
            "invalid number of arguments in \"proxy_method\" directive",
        ),
        ("proxy_bind 127.0.0.1 foo;", "invalid parameter \"foo\""),
        ("proxy_store_access user:rwx;", "invalid value \"user:rwx\""),
        (
            "proxy_cache z; proxy_store on;",
            "\"proxy_store\" directive is incompatible with \"proxy_cache\"",
        ),
        (
            "proxy_store on; proxy_cache z;",
            "\"proxy_cache\" directive is incompatible with \"proxy_store\"",
        ),
        (
            "proxy_store on; proxy_store off;",
            "\"proxy_store\" directive is duplicate",
        ),
        ("proxy_bind nonsense;", "invalid address \"nonsense\""),
        (
            "proxy_bind 127.0.0.1 transparent;",
            "proxy_bind transparent is not supported by tern yet",
        ),
        (
            "proxy_limit_rate x;",
            "\"proxy_limit_rate\" directive invalid value",
        ),
    ];
    // The regex crate words its errors its own way (nginx: "missing
    // closing parenthesis"); the rest of the line is nginx's.
    let p = Prefix::new();
    let f = p.write(
        "conf/t.conf",
        "events {}\nhttp { server { location / { proxy_cookie_path ~(a b; } } }\n",
    );
    let o = p.run(&["-t", "-c", f.to_str().unwrap_or("")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("tern: [emerg] pcre2_compile() failed: ")
            && err.contains(&format!(" in \"(a\" in {}:2\n", f.display())),
        "{}",
        err
    );
    for (d, msg) in cases {
        ConfTest::run(&format!(
            "events {{}}\nhttp {{ server {{ location / {{ {} proxy_pass http://127.0.0.1:1; }} }} }}\n",
            d
        ))
        .assert_says("emerg", msg, 2);
    }
}

#[test]
fn proxy_store_writes_the_file_as_nginx() {
    use std::os::unix::fs::PermissionsExt;
    let b = free_port();
    let body = format!(
        "http {{ access_log off;\n\
         server {{ listen 127.0.0.1:{b}; root html; }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location /s/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_store on; root store;\n\
             proxy_store_access group:rw all:r; }}\n\
           location /p/ {{ proxy_pass http://127.0.0.1:{b}/; root other;\n\
             proxy_store $document_root/$arg_n; }}\n\
           location /miss/ {{ proxy_pass http://127.0.0.1:{b}/; proxy_store on; root store; }}\n\
         }}\n\
         }}\n"
    );
    let paths = ["/s/a/f.txt", "/p/f.txt?n=x.txt", "/miss/nope.txt"];
    // Last-Modified has whole seconds.
    let secs = |t: Option<std::time::SystemTime>| {
        t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
    };
    let check = |p: &Prefix| -> String {
        let mut out = Vec::new();
        for f in ["store/s/a/f.txt", "other/x.txt", "store/miss/nope.txt"] {
            let path = p.path(f);
            match std::fs::metadata(&path) {
                Ok(m) => {
                    let src = std::fs::metadata(p.path("html/a/f.txt")).expect("source");
                    out.push(format!(
                        "{} {:o} {:?} same-mtime={}",
                        f,
                        m.permissions().mode() & 0o777,
                        std::fs::read_to_string(&path).unwrap_or_default(),
                        secs(m.modified().ok()) == secs(src.modified().ok())
                    ));
                }
                Err(_) => out.push(format!("{} absent", f)),
            }
        }
        out.join("\n")
    };
    let setup = |p: &Prefix| {
        // Workers run as nobody under root (nginx here runs without a
        // master, as root): the target directories let them in.
        for d in ["store", "other"] {
            std::fs::create_dir_all(p.path(d)).expect("mkdir");
            std::fs::set_permissions(p.path(d), std::fs::Permissions::from_mode(0o777))
                .expect("chmod");
        }
        p.write("html/a/f.txt", "stored body\n");
        p.write("html/f.txt", "stored body\n");
        // The same mtime as html/a/f.txt for the comparison above.
        let t = std::fs::metadata(p.path("html/a/f.txt"))
            .and_then(|m| m.modified())
            .expect("mtime");
        let f = std::fs::File::options()
            .write(true)
            .open(p.path("html/f.txt"))
            .expect("open");
        f.set_modified(t).expect("set mtime");
    };
    let p = Prefix::new();
    setup(&p);
    let tern = Server::start_in(p, &body);
    let ours: Vec<String> = paths.iter().map(|x| cookies(tern.port, x)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let ours_files = check(&tern.prefix);
    let log = tern.error_log();
    drop(tern);
    assert_eq!(
        ours_files,
        "store/s/a/f.txt 664 \"stored body\\n\" same-mtime=true\n\
         other/x.txt 600 \"stored body\\n\" same-mtime=true\n\
         store/miss/nope.txt absent",
        "{}\n{}",
        ours.join("\n"),
        log
    );
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    setup(&p);
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, &body, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs: Vec<String> = paths.iter().map(|x| cookies(port, x)).collect();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(ours.join("\n"), theirs.join("\n"));
    assert_eq!(ours_files, check(&p));
}
