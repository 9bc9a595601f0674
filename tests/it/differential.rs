//! Side by side with nginx: the same configuration and files served by
//! the real nginx and by tern, the same corpus of requests sent to both,
//! responses compared byte for byte after normalising what legitimately
//! differs (Date, the Server header, the server name in error-page tails
//! and the Content-Length that follows from it, listening ports).
//!
//! Skipped (with a message) when nginx is not installed; `.ci/run`
//! installs it.

use std::io::Write;

use crate::harness::*;

const CONF: &str = r#"
worker_processes 1;
events {}
http {
    types { text/html html; text/plain txt; text/css css; image/png png; application/json json; }
    default_type application/octet-stream;
    access_log off;
    map $arg_m $mapped { default dflt; ~^a(?<rest>.*)$ "a:$rest"; b bee; }
    split_clients "$arg_k" $bucket { 10% one; 50% two; * three; }
    server {
        listen 127.0.0.1:@PORT@;
        server_name main.test;
        root html;
        location = /exact { return 200 "exact\n"; }
        location ^~ /static/ { root html; }
        location ~ \.php$ { return 403; }
        location ~* \.(PNG|gif)$ { return 200 "img $uri\n"; }
        location /nested/ {
            location ~ /nested/deep/ { return 200 "deep $uri\n"; }
            return 200 "nested $uri\n";
        }
        location /ret/ {
            location /ret/301 { return 301 /target; }
            location /ret/302 { return 302 http://example.com/x; }
            location /ret/307 { return 307 /t?a=1; }
            location /ret/404 { return 404; }
            location /ret/text { return 418 "teapot $request_method $args\n"; }
            location /ret/444 { return 444; }
            location /ret/500 { return 500; }
            location /ret/503 { return 503; }
        }
        location /rw/ {
            rewrite ^/rw/last/(.*)$ /exact last;
            rewrite ^/rw/break/(.*)$ /files/$1 break;
            rewrite ^/rw/perm/(.*)$ /new/$1 permanent;
            rewrite ^/rw/redir/(.*)$ /new/$1?x=y redirect;
            rewrite ^/rw/ext$ http://other.test/ext;
            rewrite ^/rw/args$ /echoargs?z=1;
            rewrite ^/rw/noargs$ /echoargs? last;
            return 200 "rw fell through $uri\n";
        }
        location /echoargs { return 200 "args=$args is_args=$is_args uri=$uri\n"; }
        location /files/ { root html; }
        location /set/ {
            set $a "alpha";
            set $b "$a-beta";
            if ($arg_x = "1") { return 200 "x is one $b\n"; }
            if ($arg_x ~ ^(\d+)-(\d+)$) { return 200 "range $1 to $2\n"; }
            if ($http_x_test) { return 200 "header $http_x_test\n"; }
            if (-f $request_filename) { return 200 "file exists\n"; }
            if (!-e $request_filename) { return 200 "no such $uri\n"; }
            return 200 "set $a $b\n";
        }
        location /try/ {
            try_files $uri $uri/ /try/fallback.txt;
        }
        location /try2/ { try_files $uri =404; }
        location /try3/ { try_files $uri @named; }
        location @named { return 200 "named $uri\n"; }
        location /ep/ {
            error_page 404 /errors/404.html;
            error_page 500 502 =200 /errors/ok.txt;
            error_page 403 = @named;
            error_page 410 http://example.com/gone;
            error_page 418 =301 http://example.com/teapot;
            location /ep/500 { return 500; }
            location /ep/403 { return 403; }
            location /ep/410 { return 410; }
            location /ep/418 { return 418; }
        }
        location /errors/ { internal; }
        location /alias/ { alias html/files/; }
        location ~ ^/ralias/(.*)$ { alias html/files/$1; }
        location /vars {
            return 200 "uri=$uri request_uri=$request_uri args=$args host=$host method=$request_method proto=$server_protocol server=$server_name scheme=$scheme arg_a=$arg_a cookie_c=$cookie_c http_ua=$http_user_agent\n";
        }
        location /idx/ { index none.html other.html; }
        location /multi { index a.html; }
        location /le/ { limit_except GET { deny all; } }
        location /deny/ { deny 127.0.0.1; }
        location /allow/ { allow 10.0.0.0/8; allow 127.0.0.0/8; deny all; }
        location /sym/ { disable_symlinks on; }
        location /own/ { disable_symlinks if_not_owner; }
        location /pn/ { proxy_pass http://127.0.0.1:1; location /pn/in/ { } }
        location /gzs/ { gzip_static on; disable_symlinks on; }
        location /from/ { disable_symlinks on from=$document_root; }
        location /nolog/ { log_not_found off; }
        location /hdr/ { add_header X-A "1"; add_header X-B "$uri" always; expires 1h; }
        location /exp/ { expires epoch; add_header X-C c; }
        location /cs/ { charset utf-8; }
        location = /cs/r302 { charset utf-8; return 302 /x; }
        location = /cs/typed { charset utf-8; default_type "text/html; v=1"; return 200 "t\n"; }
        location /csp/ {
            charset utf-8;
            proxy_set_header Host up.test;
            location /csp/off/ { proxy_pass http://127.0.0.1:@PORT@/; }
            location /csp/on/ { override_charset on; proxy_pass http://127.0.0.1:@PORT@/; }
            location /csp/same/ { charset KOI8-R; override_charset on; proxy_pass http://127.0.0.1:@PORT@/; }
        }
        location /ai/ { autoindex on; }
        location /aij/ { autoindex on; autoindex_format json; alias html/ai/; }
        location /mapv { return 200 "$mapped $bucket\n"; }
        location /nr/ { max_ranges 1; }
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name up.test;
        location /koi { default_type "text/html; charset=koi8-r"; return 200 "koi\n"; }
        location /quoted { default_type "text/html;charset=\"KOI8-r\""; return 200 "q\n"; }
        location /css { default_type "text/css; charset=koi8-r"; return 200 "css\n"; }
        location /params { default_type "text/html; v=1"; return 200 "p\n"; }
        location /plain { default_type text/html; return 200 "plain\n"; }
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name rip.test;
        set_real_ip_from 127.0.0.1;
        set_real_ip_from 10.0.0.0/8;
        real_ip_header X-Forwarded-For;
        real_ip_recursive on;
        location / { return 200 "ra=$remote_addr rra=$realip_remote_addr\n"; }
        location /deny/ { deny 192.0.2.7; return 200 "allowed $remote_addr\n"; }
        location /loc/ {
            set_real_ip_from 127.0.0.1;
            real_ip_header X-Real-IP;
            return 200 "loc ra=$remote_addr\n";
        }
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name rip2.test;
        location / {
            set_real_ip_from 127.0.0.1;
            real_ip_header X-Real-IP;
            deny 192.0.2.9;
            try_files /nonexistent @show;
        }
        location @show { return 200 "named ra=$remote_addr\n"; }
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name *.wild.test;
        return 200 "wild $host\n";
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name trail.*;
        return 200 "trail $host\n";
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name ~^(?<sub>[a-z]+)\.re\.test$;
        return 200 "regex $host\n";
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name "" empty.test;
        return 200 "empty-or-named $host\n";
    }
}
"#;

fn files(p: &Prefix) {
    p.write("html/index.html", "<h1>index</h1>\n");
    p.write("html/a.txt", "plain text\n");
    p.write("html/style.css", "body{}\n");
    p.write("html/pic.png", [137u8, 80, 78, 71, 1, 2, 3]);
    p.write("html/static/s.txt", "static\n");
    p.write("html/static/x.php", "php source\n");
    p.write("html/files/f.txt", "files f\n");
    p.write("html/files/sub/index.html", "sub index\n");
    p.write("html/try/real.txt", "try real\n");
    p.write("html/try/fallback.txt", "fallback\n");
    p.write("html/try/dir/index.html", "try dir index\n");
    p.write("html/try2/here.txt", "try2 here\n");
    p.write("html/errors/404.html", "custom 404\n");
    p.write("html/errors/ok.txt", "ok page\n");
    p.write("html/set/present", "present\n");
    p.write("html/idx/other.html", "other index\n");
    p.write("html/dir/index.html", "dir index\n");
    p.write("html/emptydir/.keep", "");
    p.write("html/nested/file", "nested file\n");
    p.write("html/multi/a.html", "multi a\n");
    p.write("html/sp ace.txt", "space\n");
    p.write("html/b.json", "{}\n");
    p.write("html/le/f.txt", "le\n");
    p.write("html/deny/f.txt", "deny\n");
    p.write("html/allow/f.txt", "allow\n");
    p.write("html/sym/real.txt", "real\n");
    let _ = std::os::unix::fs::symlink("../a.txt", p.path("html/sym/link.txt"));
    let _ = std::fs::create_dir_all(p.path("html/symdir"));
    let _ = std::os::unix::fs::symlink("../sym", p.path("html/sym/dirlink"));
    // if_not_owner: links owned as their target pass, others do not (the
    // lchown needs root; without it both links pass in both servers).
    p.write("html/own/t.txt", "own\n");
    for (link, to) in [
        ("same", "t.txt"),
        ("other", "t.txt"),
        ("sub", "../sym"),
        ("osub", "../sym"),
    ] {
        let l = p.path(&format!("html/own/{link}"));
        let _ = std::os::unix::fs::symlink(to, &l);
        if link.starts_with('o') {
            let _ = std::os::unix::fs::lchown(&l, Some(65534), Some(65534));
        }
    }
    // gzip_static beside disable_symlinks: the .gz is a symlink.
    p.write("html/gzs/l.txt", "plain\n");
    p.write("html/gzreal.gz", "not really gzip\n");
    let _ = std::os::unix::fs::symlink("../gzreal.gz", p.path("html/gzs/l.txt.gz"));
    p.write("html/pn/in/f.txt", "nested, not proxied\n");
    p.write("html/from/f.txt", "from\n");
    let _ = std::os::unix::fs::symlink("f.txt", p.path("html/from/link"));
    p.write("html/hdr/f.txt", "hdr\n");
    p.write("html/exp/f.txt", "exp\n");
    p.write("html/cs/f.html", "<p>cs</p>\n");
    p.write("html/cs/f.bin", "bin\n");
    p.write("html/ai/one.txt", "1\n");
    p.write(
        "html/ai/a long name that goes on and on and on past fifty characters.txt",
        "x\n",
    );
    p.write("html/ai/sub/x", "x\n");
    p.write("html/ai/<esc>&.txt", "e\n");
    p.write("html/nr/f.txt", "0123456789\n");
    p.write("html/big.txt", "abcdefghijklmnopqrstuvwxyz".repeat(40));
    fix_times(&p.path("html"));
}

/// Both trees get the same timestamps, so Last-Modified, ETag and listings agree.
pub(crate) fn fix_times(dir: &std::path::Path) {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                fix_times(&p);
            }
            if let Ok(f) = std::fs::File::open(&p) {
                let _ = f.set_modified(t);
            }
        }
    }
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.set_modified(t);
    }
}

fn corpus() -> Vec<String> {
    let mut reqs = Vec::new();
    let paths = [
        "/",
        "/index.html",
        "/a.txt",
        "/style.css",
        "/pic.png",
        "/missing",
        "/dir",
        "/dir/",
        "/emptydir/",
        "/static/s.txt",
        "/static/x.php",
        "/x.php",
        "/PIC.PNG",
        "/pic.PNG",
        "/exact",
        "/exact/",
        "/exactx",
        "/nested/",
        "/nested/file",
        "/nested/deep/x",
        "/ret/301",
        "/ret/302",
        "/ret/307",
        "/ret/404",
        "/ret/text?q=1",
        "/ret/500",
        "/ret/503",
        "/rw/last/a",
        "/rw/break/f.txt",
        "/rw/perm/a?k=v",
        "/rw/redir/b?k=v",
        "/rw/ext",
        "/rw/args?orig=1",
        "/rw/noargs?orig=1",
        "/rw/other",
        "/echoargs?a=1&b=2",
        "/set/",
        "/set/?x=1",
        "/set/?x=12-34",
        "/set/present",
        "/set/absent",
        "/try/real.txt",
        "/try/dir",
        "/try/nothing",
        "/try2/here.txt",
        "/sym/real.txt",
        "/sym/link.txt",
        "/sym/dirlink/real.txt",
        "/pn/in/f.txt",
        "/pn/x",
        "/own/t.txt",
        "/own/same",
        "/own/other",
        "/own/sub/real.txt",
        "/own/osub/real.txt",
        "/from/f.txt",
        "/from/link",
        "/try2/nothing",
        "/try3/nothing",
        "/ep/nothing",
        "/ep/500",
        "/ep/403",
        "/ep/410",
        "/ep/418",
        "/errors/404.html",
        "/alias/f.txt",
        "/alias/sub/",
        "/alias/none",
        "/ralias/f.txt",
        "/vars?a=b",
        "/idx/",
        "/multi/",
        "/sp%20ace.txt",
        "/b.json",
        "/a.txt?x=1",
        "/%61.txt",
        "/./a.txt",
        "/x/../a.txt",
        "/../a.txt",
        "//a.txt",
        "/dir//index.html",
        "/nested/../a.txt",
        "/a.txt%00",
        "/%zz",
        "/files/sub",
        "/files/sub/",
        "/files/sub/index.html",
        "/cs/r302",
        "/cs/typed",
        "/csp/off/koi",
        "/csp/off/quoted",
        "/csp/off/css",
        "/csp/off/params",
        "/csp/off/plain",
        "/csp/on/koi",
        "/csp/on/quoted",
        "/csp/on/plain",
        "/csp/same/koi",
        "/csp/same/quoted",
        "/csp/same/css",
        "/csp/same/plain",
    ];
    let hosts = [
        "main.test",
        "a.wild.test",
        "trail.zzz",
        "abc.re.test",
        "empty.test",
        "unknown.test",
    ];
    for p in paths {
        reqs.push(format!(
            "GET {} HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n",
            p
        ));
        reqs.push(format!("HEAD {} HTTP/1.0\r\n\r\n", p));
    }
    for p in [
        "/",
        "/a.txt",
        "/missing",
        "/dir",
        "/ret/404",
        "/exact",
        "/le/f.txt",
    ] {
        reqs.push(format!(
            "HEAD {} HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n",
            p
        ));
        reqs.push(format!(
            "POST {} HTTP/1.1\r\nHost: main.test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            p
        ));
        reqs.push(format!(
            "DELETE {} HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n",
            p
        ));
        reqs.push(format!("GET {} HTTP/1.0\r\n\r\n", p));
        reqs.push(format!(
            "GET {} HTTP/1.0\r\nConnection: keep-alive\r\nHost: main.test\r\n\r\n",
            p
        ));
    }
    for h in hosts {
        for p in ["/", "/vars", "/exact"] {
            reqs.push(format!(
                "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                p, h
            ));
        }
    }
    reqs.push("GET / HTTP/1.1\r\nConnection: close\r\n\r\n".into());
    for (path, hdrs) in [
        ("/", ""),
        ("/", "X-Forwarded-For: 192.0.2.1\r\n"),
        ("/", "X-Forwarded-For: 192.0.2.1, 10.1.2.3\r\n"),
        (
            "/",
            "X-Forwarded-For: 198.51.100.5, 192.0.2.1, 10.1.2.3\r\n",
        ),
        ("/", "X-Forwarded-For: 10.0.0.1, 10.1.2.3\r\n"),
        (
            "/",
            "X-Forwarded-For: 192.0.2.1\r\nX-Forwarded-For: 10.9.9.9\r\n",
        ),
        ("/", "X-Forwarded-For: junk\r\n"),
        ("/", "X-Forwarded-For: 2001:db8::1\r\n"),
        ("/", "X-Real-IP: 192.0.2.44\r\n"),
        ("/deny/", "X-Forwarded-For: 192.0.2.7\r\n"),
        ("/deny/", "X-Forwarded-For: 192.0.2.8\r\n"),
        (
            "/loc/",
            "X-Forwarded-For: 192.0.2.1\r\nX-Real-IP: 192.0.2.2\r\n",
        ),
    ] {
        reqs.push(format!(
            "GET {path} HTTP/1.1\r\nHost: rip.test\r\n{hdrs}Connection: close\r\n\r\n"
        ));
    }
    for hdrs in ["X-Real-IP: 192.0.2.9\r\n", "X-Real-IP: 192.0.2.10\r\n", ""] {
        reqs.push(format!(
            "GET /x HTTP/1.1\r\nHost: rip2.test\r\n{hdrs}Connection: close\r\n\r\n"
        ));
    }
    reqs.push(
        "GET /gzs/l.txt HTTP/1.1\r\nHost: main.test\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
            .into(),
    );
    reqs.push("GET /vars HTTP/1.1\r\nHost: MAIN.test.\r\nConnection: close\r\nCookie: a=1; c=see\r\nUser-Agent: ua/1\r\n\r\n".into());
    reqs.push(
        "GET /set/ HTTP/1.1\r\nHost: main.test\r\nX-Test: hdr\r\nConnection: close\r\n\r\n".into(),
    );
    reqs.push(
        "GET http://abc.re.test/ HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n".into(),
    );
    reqs.push("GET /ep/500 HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n".into());
    reqs.push("POST /ep/nothing HTTP/1.1\r\nHost: main.test\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc".into());
    reqs.push("GET / HTTP/1.1\r\nHost: main.test\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".into());
    reqs.push("GET / HTTP/1.1\r\nHost: main.test\r\nTransfer-Encoding: gzip\r\n\r\n".into());
    reqs.push(
        "GET / HTTP/1.1\r\nHost: main.test\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx"
            .into(),
    );
    reqs.push("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".into());
    reqs.push("GET /a.txt HTTP/1.1\r\nHost: main.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n".into());
    reqs.push("GET /a.txt HTTP/1.1\r\nHost: main.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n".into());
    reqs.push("GARBAGE\r\n\r\n".into());
    for (path, hdr) in [
        ("/a.txt", "Range: bytes=0-3"),
        ("/a.txt", "Range: bytes=-4"),
        ("/a.txt", "Range: bytes=5-"),
        ("/a.txt", "Range: bytes=0-1,3-4"),
        ("/a.txt", "Range: bytes=100-200"),
        ("/a.txt", "Range: bytes=x"),
        ("/big.txt", "Range: bytes=10-20,30-40,1000-1100"),
        ("/nr/f.txt", "Range: bytes=0-1,3-4"),
        ("/a.txt", "If-None-Match: \"6553f100-b\""),
        ("/a.txt", "If-None-Match: W/\"6553f100-b\", \"zz\""),
        ("/a.txt", "If-None-Match: *"),
        ("/a.txt", "If-Match: \"nope\""),
        ("/a.txt", "If-Modified-Since: Tue, 14 Nov 2023 22:13:20 GMT"),
        ("/a.txt", "If-Modified-Since: Mon, 13 Nov 2023 22:13:20 GMT"),
        (
            "/a.txt",
            "If-Unmodified-Since: Mon, 13 Nov 2023 22:13:20 GMT",
        ),
        ("/a.txt", "If-Range: \"6553f100-b\"\r\nRange: bytes=0-2"),
        ("/a.txt", "If-Range: \"other\"\r\nRange: bytes=0-2"),
        ("/hdr/f.txt", "Range: bytes=0-1"),
    ] {
        reqs.push(format!(
            "GET {} HTTP/1.1\r\nHost: main.test\r\n{}\r\nConnection: close\r\n\r\n",
            path, hdr
        ));
    }
    reqs.push("GET / HTTP/2.0\r\nHost: main.test\r\n\r\n".into());
    reqs.push("GET /a.txt HTTP/1.1\r\nHost: bad/host\r\nConnection: close\r\n\r\n".into());
    reqs.push("get / HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n".into());
    reqs.push("GET noslash HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n".into());
    // Pipelined pairs.
    reqs.push("GET /a.txt HTTP/1.1\r\nHost: main.test\r\n\r\nGET /exact HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n".into());
    reqs
}

/// Sends `req` and reads until the server closes or, once a complete
/// response has arrived, stays silent for 300 ms (some requests in the
/// corpus keep the connection open). Before a complete response the
/// wait is up to 10 s: a loaded machine may take more than a moment to
/// answer, and a cut-short answer is not the server's.
pub(crate) fn exchange(port: u16, req: &[u8]) -> Vec<u8> {
    exchange_within(port, req, std::time::Duration::from_secs(10))
}

/// [`exchange`] waiting up to `patience` for a complete response: for an
/// answer that the server holds back on purpose (`auth_delay`), where a
/// stalled machine must not turn the wait into an empty answer.
pub(crate) fn exchange_within(port: u16, req: &[u8], patience: std::time::Duration) -> Vec<u8> {
    use std::io::Read;
    use std::time::{Duration, Instant};
    let quiet = Duration::from_millis(300);
    let deadline = Instant::now() + patience;
    let head_only = req.starts_with(b"HEAD ");
    let mut s = connect(port);
    s.write_all(req).expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        // A HEAD answer has a head only, whatever its Content-Length says.
        let answered = if head_only {
            find(&out, b"\r\n\r\n").is_some()
        } else {
            Resp::parse_complete(&out).is_some()
        };
        let wait = if answered {
            quiet
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        if wait.is_zero() {
            break;
        }
        s.set_read_timeout(Some(wait)).expect("timeout");
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if !answered
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
            Err(_) => break,
        }
    }
    out
}

/// Sends each request to nginx (on `nport`) and to tern (on `tport`) and
/// reports each pair of answers that differ after [`normalize`].
pub(crate) fn differences(nport: u16, tport: u16, reqs: &[impl AsRef<[u8]>]) -> Vec<String> {
    let mut diffs = Vec::new();
    for r in reqs {
        let r = r.as_ref();
        let a = normalize(&exchange(nport, r), nport);
        let b = normalize(&exchange(tport, r), tport);
        if a != b {
            diffs.push(format!(
                "=== request {:?}\n--- nginx\n{}\n--- tern\n{}\n",
                String::from_utf8_lossy(r),
                a,
                b
            ));
        }
    }
    diffs
}

/// Each request's answer from the server on `port`, one connection each,
/// after [`normalize`].
pub(crate) fn answers(port: u16, reqs: &[impl AsRef<[u8]>]) -> Vec<String> {
    reqs.iter()
        .map(|r| normalize(&exchange(port, r.as_ref()), port))
        .collect()
}

/// nginx's side of a differential test: its prefix (`files` filled it,
/// the requests changed it), its answers in order, and nginx itself,
/// stopped when this is dropped.
pub(crate) struct NginxSide {
    pub prefix: Prefix,
    pub answers: Vec<String>,
    _nginx: Nginx,
}

/// tern on `conf` in a fresh prefix that `files` fills first, and its
/// [`answers`] to `reqs`; the server stays up for checks of its prefix
/// and error log.
pub(crate) fn tern_side(
    conf: &str,
    files: impl Fn(&Prefix),
    reqs: &[impl AsRef<[u8]>],
) -> (Server, Vec<String>) {
    let p = Prefix::new();
    files(&p);
    let s = Server::start_in(p, conf);
    let a = answers(s.port, reqs);
    (s, a)
}

/// The same for the reference nginx, in a prefix of its own: `None` when
/// it is not installed; a panic with its error log when it does not start.
pub(crate) fn nginx_side(
    conf: &str,
    files: impl Fn(&Prefix),
    reqs: &[impl AsRef<[u8]>],
) -> Option<NginxSide> {
    if !nginx_installed() {
        return None;
    }
    let prefix = Prefix::new();
    files(&prefix);
    let port = free_port();
    let Some(nginx) = start_nginx(&prefix, conf, port) else {
        panic!("nginx did not start: {}", prefix.read("logs/error.log"));
    };
    let answers = answers(port, reqs);
    Some(NginxSide {
        prefix,
        answers,
        _nginx: nginx,
    })
}

/// What may differ between the two servers, normalised away.
pub(crate) fn normalize(raw: &[u8], port: u16) -> String {
    let text = String::from_utf8_lossy(raw).into_owned();
    let text = text.replace(&format!(":{}", port), ":PORT");
    let mut out = Vec::new();
    // Normalise each response's head and the error page tails.
    for line in text.split("\r\n") {
        if line.starts_with("Date: ") {
            out.push("Date: X".to_string());
        } else if line.starts_with("Server: ") {
            out.push("Server: X".to_string());
        } else if line.starts_with("Content-Length: ") {
            out.push("Content-Length: N".to_string());
        } else {
            out.push(
                line.replace(
                    "<hr><center>nginx/1.22.1</center>",
                    "<hr><center>SERVER</center>",
                )
                .replace("<hr><center>nginx</center>", "<hr><center>SERVER</center>")
                .replace(
                    "<hr><center>tern/0.1.0</center>",
                    "<hr><center>SERVER</center>",
                )
                .replace("<hr><center>tern</center>", "<hr><center>SERVER</center>"),
            );
        }
    }
    out.join("\r\n")
}

#[test]
fn same_bytes_as_nginx() {
    if !nginx_installed() {
        return;
    }
    let pn = Prefix::new();
    files(&pn);
    let nport = free_port();
    let Some(nginx) = start_nginx(&pn, CONF, nport) else {
        panic!("nginx did not start");
    };
    let pt = Prefix::new();
    files(&pt);
    let tern = Server::start_in(pt, CONF);
    let reqs = corpus();
    assert!(reqs.len() >= 200, "corpus has {} requests", reqs.len());
    let diffs = differences(nport, tern.port, &reqs);
    drop(nginx);
    if !diffs.is_empty() {
        let mut f = std::fs::File::create(std::env::temp_dir().join("tern-differential.txt"))
            .expect("report");
        for d in &diffs {
            let _ = f.write_all(d.as_bytes());
        }
        panic!(
            "{} of {} responses differ from nginx:\n{}",
            diffs.len(),
            reqs.len(),
            diffs.iter().take(8).cloned().collect::<String>()
        );
    }
    eprintln!(
        "{} requests, all identical to nginx after normalisation",
        reqs.len()
    );
}
