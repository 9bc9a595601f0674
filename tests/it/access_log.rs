//! `log_format`, `access_log`, `open_log_file_cache`: the bytes written, as
//! nginx 1.22.1 writes them (expected lines were taken from the real nginx
//! on the same config and requests).
use std::time::Duration;

use crate::harness::*;

/// `[21/Nov/2026:08:46:09 +0000]` -> `[TIME]`, after checking its shape.
fn untime(log: &str) -> String {
    let re = regex::Regex::new(r"\[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\]").unwrap();
    re.replace_all(log, "[TIME]").into_owned()
}

fn req(s: &Server, head: &str) -> Resp {
    let r = s.raw(head.as_bytes());
    Resp::parse(&r).expect("a response")
}

fn wait_for(s: &Server, rel: &str, want_lines: usize) -> String {
    eventually(5, &format!("{} lines in {}", want_lines, rel), || {
        s.prefix.read(rel).lines().count() >= want_lines
    });
    s.prefix.read(rel)
}

fn start(conf: &str) -> Server {
    let p = Prefix::new();
    p.write("html/index.html", "hi\n");
    // Logs with variables in the name are opened by the workers, which
    // run as `nobody` when the tests run as root (as in nginx).
    std::fs::create_dir_all(p.path("vlogs")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p.path("vlogs"), std::fs::Permissions::from_mode(0o777)).unwrap();
    Server::start_in(p, conf)
}

#[test]
fn combined_is_byte_for_byte_nginx() {
    let s = start("http { server { listen 127.0.0.1:@PORT@; root html; access_log logs/c.log; } }");
    req(
        &s,
        "GET /index.html?a=1 HTTP/1.1\r\nHost: x\r\nAuthorization: basic   dXNlcjpwYXNz\r\n\
         User-Agent: curl/8 \"x\"\r\nReferer: http://r/\r\nConnection: close\r\n\r\n",
    );
    req(
        &s,
        "GET / HTTP/1.0\r\nAuthorization: Basic bm9jb2xvbg==\r\nReferer: \r\n\r\n",
    );
    let log = wait_for(&s, "logs/c.log", 2);
    assert_eq!(
        untime(&log),
        "127.0.0.1 - user [TIME] \"GET /index.html?a=1 HTTP/1.1\" 200 3 \"http://r/\" \"curl/8 \\x22x\\x22\"\n\
         127.0.0.1 - - [TIME] \"GET / HTTP/1.0\" 200 3 \"\" \"-\"\n"
    );
}

#[test]
fn default_log_is_logs_access_log_combined() {
    let s = start("http { server { listen 127.0.0.1:@PORT@; root html; } }");
    s.get("/index.html");
    let log = wait_for(&s, "logs/access.log", 1);
    assert_eq!(
        untime(&log),
        "127.0.0.1 - - [TIME] \"GET /index.html HTTP/1.1\" 200 3 \"-\" \"-\"\n"
    );
}

#[test]
fn escape_json_default_and_none() {
    let s = start(
        r#"http {
          log_format j escape=json '{"u":"$request_uri","a":"$http_x_a","r":"$remote_user","m":"$http_missing"}';
          log_format d '$request_uri|$http_x_a|$remote_user|$http_missing|$pipe|$status';
          log_format n escape=none $http_x_a| "$http_missing|" ${status};
          server { listen 127.0.0.1:@PORT@; root html;
            access_log logs/j.log j; access_log logs/d.log d; access_log logs/n.log n; } }"#,
    );
    let mut r = b"GET /index.html?%22 HTTP/1.1\r\nHost: x\r\nX-A: q\"\\\xc3\xa9\t/end\r\n\
                  Authorization: Basic dXNlcjpwYXNz\r\nConnection: close\r\n\r\n"
        .to_vec();
    r.truncate(r.len());
    raw(s.port, &r);
    assert_eq!(
        wait_for(&s, "logs/j.log", 1).as_bytes(),
        "{\"u\":\"/index.html?%22\",\"a\":\"q\\\"\\\\é\\t/end\",\"r\":\"user\",\"m\":\"\"}\n"
            .as_bytes()
    );
    assert_eq!(
        wait_for(&s, "logs/d.log", 1),
        "/index.html?%22|q\\x22\\x5C\\xC3\\xA9\\x09/end|user|-|.|200\n"
    );
    assert_eq!(
        wait_for(&s, "logs/n.log", 1).as_bytes(),
        "q\"\\é\t/end||200\n".as_bytes()
    );
}

#[test]
fn inheritance_off_and_several_logs() {
    let s = start(
        "http { access_log logs/http.log;
           server { listen 127.0.0.1:@PORT@; root html;
             access_log logs/a.log; access_log logs/b.log;
             location /in { }
             location /off { access_log off; }
             location /own { access_log logs/own.log; }
           }
           server { listen 127.0.0.1:@PORT@; server_name h; root html; }
         }",
    );
    for p in ["/in", "/off", "/own", "/"] {
        s.get(p);
    }
    req(
        &s,
        "GET /h HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    );
    let paths = |rel: &str| -> Vec<String> {
        s.prefix
            .read(rel)
            .lines()
            .map(|l| l.split('"').nth(1).unwrap_or("").to_string())
            .collect()
    };
    wait_for(&s, "logs/http.log", 1);
    wait_for(&s, "logs/own.log", 1);
    wait_for(&s, "logs/b.log", 2);
    assert_eq!(paths("logs/a.log"), ["GET /in HTTP/1.1", "GET / HTTP/1.1"]);
    assert_eq!(paths("logs/b.log"), ["GET /in HTTP/1.1", "GET / HTTP/1.1"]);
    assert_eq!(paths("logs/own.log"), ["GET /own HTTP/1.1"]);
    assert_eq!(paths("logs/http.log"), ["GET /h HTTP/1.1"]);
    assert!(!s.prefix.path("logs/access.log").exists());
}

#[test]
fn if_condition_skips_empty_and_zero() {
    let s = start(
        "http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html;
             access_log logs/u.log u if=$arg_log; access_log logs/all.log u; } }",
    );
    for p in ["/?log=1", "/?log=0", "/", "/?log=", "/?log=00"] {
        s.get(p);
    }
    wait_for(&s, "logs/all.log", 5);
    assert_eq!(s.prefix.read("logs/u.log"), "/?log=1\n/?log=00\n");
}

#[test]
fn buffer_is_written_at_flush_time_not_before() {
    let s = start(
        "http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html;
             access_log logs/b.log u buffer=64k flush=1s; access_log logs/all.log u; } }",
    );
    let t0 = std::time::Instant::now();
    s.get("/one");
    s.get("/two");
    // all.log is written after b.log for each request, by the one writer:
    // once it has both lines, a b.log written at once would show.
    wait_for(&s, "logs/all.log", 2);
    if t0.elapsed() < Duration::from_millis(900) {
        assert_eq!(s.prefix.read("logs/b.log"), "", "written before flush=1s");
    }
    assert_eq!(wait_for(&s, "logs/b.log", 2), "/one\n/two\n");
}

#[test]
fn buffer_without_flush_is_written_at_exit() {
    let mut s = start(
        "http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html;
             access_log logs/b.log u buffer=64k; access_log logs/all.log u; } }",
    );
    s.get("/x");
    // The unbuffered all.log's line comes after what b.log would get.
    wait_for(&s, "logs/all.log", 1);
    assert_eq!(s.prefix.read("logs/b.log"), "");
    s.signal(SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(10)), Some(0));
    assert_eq!(s.prefix.read("logs/b.log"), "/x\n");
}

#[test]
fn buffer_full_writes_the_old_lines() {
    let s = start(
        "http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html;
             access_log logs/b.log u buffer=16; access_log logs/all.log u; } }",
    );
    // Each request's all.log line is written after whatever its b.log
    // line caused, so once all.log has it b.log is complete.
    s.get("/aaaaaaaaa"); // 11 bytes: buffered
    s.get("/bbbbbbbbb"); // does not fit: the first line goes out
    wait_for(&s, "logs/all.log", 2);
    assert_eq!(s.prefix.read("logs/b.log"), "/aaaaaaaaa\n");
    s.get("/cccccccccccccccccccc"); // larger than the buffer: both go out
    wait_for(&s, "logs/all.log", 3);
    assert_eq!(
        s.prefix.read("logs/b.log"),
        "/aaaaaaaaa\n/bbbbbbbbb\n/cccccccccccccccccccc\n"
    );
}

#[test]
fn gzip_writes_gzip_members() {
    let s = start(
        "http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html;
             access_log logs/z.log.gz u gzip=9 flush=200ms; } }",
    );
    s.get("/one");
    std::thread::sleep(Duration::from_millis(600));
    s.get("/two");
    let read = || {
        use std::io::Read;
        let z = std::fs::read(s.prefix.path("logs/z.log.gz")).unwrap_or_default();
        let mut out = String::new();
        let _ = flate2::read::MultiGzDecoder::new(&z[..]).read_to_string(&mut out);
        (z, out)
    };
    eventually(5, "two lines in z.log.gz", || read().1.lines().count() == 2);
    let (z, text) = read();
    assert_eq!(text, "/one\n/two\n");
    assert_eq!(&z[..3], b"\x1f\x8b\x08");
    // Two flushes: two members, each with its own header.
    assert_eq!(z.windows(3).filter(|w| *w == b"\x1f\x8b\x08").count(), 2);
}

#[test]
fn usr1_reopens_access_logs() {
    let s = start(
        "http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html; access_log logs/r.log u; } }",
    );
    s.get("/before");
    wait_for(&s, "logs/r.log", 1);
    std::fs::rename(s.prefix.path("logs/r.log"), s.prefix.path("logs/r.log.1")).unwrap();
    s.signal(SIGUSR1);
    eventually(5, "reopened r.log", || s.prefix.path("logs/r.log").exists());
    s.get("/after");
    assert_eq!(wait_for(&s, "logs/r.log", 1), "/after\n");
    assert_eq!(s.prefix.read("logs/r.log.1"), "/before\n");
}

#[test]
fn variables_in_the_path_and_the_root_check() {
    let s = start(
        "http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html;
             access_log vlogs/v-$arg_f.log u;
             location /noroot { root missing; access_log vlogs/nr-$arg_f.log u; } } }",
    );
    s.get("/?f=a");
    s.get("/?f=b");
    s.get("/?f=a&x");
    s.get("/noroot?f=c");
    assert_eq!(wait_for(&s, "vlogs/v-a.log", 2), "/?f=a\n/?f=a&x\n");
    assert_eq!(wait_for(&s, "vlogs/v-b.log", 1), "/?f=b\n");
    s.wait_error_log("missing\" existence failed (2: No such file or directory)");
    // A later line through the same writer: nr-c.log, had it been opened,
    // would be there by now.
    s.get("/?f=z");
    wait_for(&s, "vlogs/v-z.log", 1);
    assert!(!s.prefix.path("vlogs/nr-c.log").exists());
}

#[test]
fn open_log_file_cache_keeps_descriptors() {
    let s = start(
        "http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html;
             location /c { open_log_file_cache max=10 valid=1m; access_log vlogs/c-$arg_f.log u; }
             location /n { access_log vlogs/n-$arg_f.log u; } } }",
    );
    for l in ["c", "n"] {
        s.get(&format!("/{}?f=a", l));
        wait_for(&s, &format!("vlogs/{}-a.log", l), 1);
        let p = |n: &str| s.prefix.path(&format!("vlogs/{}-{}", l, n));
        std::fs::rename(p("a.log"), p("old")).unwrap();
        s.get(&format!("/{}?f=a", l));
    }
    // Cached: the second line still goes to the renamed file.
    eventually(5, "second line via the cached descriptor", || {
        s.prefix.read("vlogs/c-old").lines().count() == 2
    });
    assert!(!s.prefix.path("vlogs/c-a.log").exists());
    // Not cached: opened again by name.
    assert_eq!(wait_for(&s, "vlogs/n-a.log", 1), "/n?f=a\n");
    assert_eq!(s.prefix.read("vlogs/n-old"), "/n?f=a\n");
}

#[test]
fn config_errors_in_nginx_wording() {
    let cases = [
        ("access_log logs/x.log nope;", "unknown log format \"nope\""),
        (
            "access_log logs/x.log combined flush=1s;",
            "no buffer is defined for access_log \"logs/x.log\"",
        ),
        (
            "access_log logs/$host.log combined buffer=4k;",
            "buffered logs cannot have variables in name",
        ),
        (
            "access_log logs/x.log combined gzip=10;",
            "invalid compression level \"10\"",
        ),
        (
            "access_log logs/x.log combined buffer=0;",
            "invalid buffer size \"0\"",
        ),
        (
            "access_log logs/x.log combined what;",
            "invalid parameter \"what\"",
        ),
        ("access_log off combined;", "invalid parameter \"combined\""),
        (
            "log_format combined x;",
            "duplicate \"log_format\" name \"combined\"",
        ),
        (
            "log_format a x; log_format a y;",
            "duplicate \"log_format\" name \"a\"",
        ),
        (
            "log_format a escape=xml x;",
            "unknown log format escaping \"xml\"",
        ),
        (
            "log_format a '${x';",
            "the closing bracket in \"x\" variable is missing",
        ),
        ("log_format a $nosuchvar;", "unknown \"nosuchvar\" variable"),
        (
            "open_log_file_cache inactive=1s;",
            "\"open_log_file_cache\" must have \"max\" parameter",
        ),
        (
            "open_log_file_cache max=x;",
            "invalid \"open_log_file_cache\" parameter \"max=x\"",
        ),
        (
            "access_log logs/x.log combined buffer=4k; access_log logs/x.log combined buffer=8k;",
            "access_log \"logs/x.log\" already defined with conflicting parameters",
        ),
    ];
    for (body, want) in cases {
        let p = Prefix::new();
        let conf = p.write(
            "conf/nginx.conf",
            format!("events {{}}\nhttp {{ {} }}\n", body),
        );
        let out = p.run(&["-t", "-c", conf.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: accepted", body);
        assert!(err.contains(want), "{}: {}", body, err);
    }
    // Case-insensitive lookup; the same path twice with the same buffer is fine.
    let p = Prefix::new();
    let conf = p.write(
        "conf/nginx.conf",
        "events {}\nhttp { log_format Main x; access_log logs/x.log MAIN buffer=4k;
         access_log logs/x.log COMBINED buffer=4k; open_log_file_cache off; }\n",
    );
    let out = p.run(&["-t", "-c", conf.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn reload_writes_out_buffers_of_a_dropped_log() {
    let s = start(
        "error_log logs/error.log notice;
         http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html;
             access_log logs/b.log u buffer=64k; access_log logs/all.log u; } }",
    );
    s.get("/buffered");
    wait_for(&s, "logs/all.log", 1);
    assert_eq!(s.prefix.read("logs/b.log"), "");
    s.rewrite_conf(
        "error_log logs/error.log notice;
         http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html; access_log logs/b.log u; } }",
        s.port,
    );
    s.signal(SIGHUP);
    s.wait_error_log("reconfigured");
    // The old configuration is gone: its buffer is written without waiting
    // for more traffic.
    assert_eq!(wait_for(&s, "logs/b.log", 1), "/buffered\n");
    s.get("/after");
    assert_eq!(wait_for(&s, "logs/b.log", 2), "/buffered\n/after\n");
}

#[test]
fn uninitialized_set_variable_is_empty_and_warned_once() {
    // Lines as the real nginx 1.22.1 wrote them for this config: a
    // variable only `set` declares (here in /never) is empty where `set`
    // did not run,
    // warned about once per request (the log phase says so), not at all
    // under `uninitialized_variable_warn off`; a regex capture never warns.
    let s = start(
        "error_log logs/error.log warn;
        http { log_format f \"[$x] [$y] [$cap]\"; access_log logs/u.log f;
            server { listen 127.0.0.1:@PORT@;
                location /never { set $x 2; return 204; }
                location /set { set $y 1; return 200 \"y=$y\\n\"; }
                location /use { return 200 \"x=[$x] again=[$x]\\n\"; }
                location /off { uninitialized_variable_warn off; return 200 \"[$x]\\n\"; }
                location /cap { if ($arg_a ~ ^(?<cap>z)?$) { } return 200 \"[$cap]\\n\"; }
            } }",
    );
    let body = |path: &str| {
        let head = format!("GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
        req(&s, &head).body_str()
    };
    assert_eq!(body("/use"), "x=[] again=[]\n");
    assert_eq!(body("/set"), "y=1\n");
    assert_eq!(body("/off"), "[]\n");
    assert_eq!(body("/cap"), "[]\n");
    let log = wait_for(&s, "logs/u.log", 4);
    // An unmatched capture is not found ("-"); one that took no part in
    // a match is empty.
    assert_eq!(log, "[] [] [-]\n[] [1] [-]\n[] [] [-]\n[] [] []\n");
    // The last warning (the log phase of /cap) may land after the access line.
    eventually(10, "five warnings", || {
        s.error_log().matches("[warn]").count() >= 5
    });
    let warns: Vec<String> = s
        .error_log()
        .lines()
        .filter(|l| l.contains("[warn]"))
        .map(|l| {
            let from = l.find("using").unwrap_or(0);
            let to = l.find(", server:").unwrap_or(l.len());
            l[from..to].to_string()
        })
        .collect();
    assert_eq!(
        warns,
        [
            "using uninitialized \"x\" variable, client: 127.0.0.1",
            "using uninitialized \"y\" variable while logging request, client: 127.0.0.1",
            "using uninitialized \"x\" variable while logging request, client: 127.0.0.1",
            "using uninitialized \"x\" variable while logging request, client: 127.0.0.1",
            "using uninitialized \"y\" variable while logging request, client: 127.0.0.1",
        ]
    );
}

/// `$pipe` is `p` only for a request whose bytes came behind the previous
/// one's; a keep-alive request sent after the previous answer is `.`
/// (nginx 1.22.1 on the same config and requests: `. 1`, `. 2`, then
/// `. 1`, `p 2` for the pipelined pair).
#[test]
fn pipe_only_for_pipelined_requests() {
    use std::io::Write;
    let s = start(
        r#"http {
          log_format p '$pipe $connection_requests';
          server { listen 127.0.0.1:@PORT@; root html; access_log logs/p.log p; } }"#,
    );
    let get = b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut c = s.connect();
    for _ in 0..2 {
        c.write_all(get).unwrap();
        assert_eq!(read_response(&mut c).expect("a response").status, 200);
    }
    drop(c);
    assert_eq!(wait_for(&s, "logs/p.log", 2), ". 1\n. 2\n");
    // The pair in one write, the second closing: both answers are read to
    // the end at once (reading them one by one could lose what the first
    // read took of the second).
    let last = b"GET /index.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let both = s.raw(&[&get[..], &last[..]].concat());
    let text = String::from_utf8_lossy(&both);
    assert_eq!(text.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{text}");
    assert_eq!(wait_for(&s, "logs/p.log", 4), ". 1\n. 2\n. 1\np 2\n");
}

/// A log with variables in its path is written before the connection
/// closes, as nginx's log phase: a client that read to the close finds
/// its line in the file at once (access_log.t renames the log directory
/// right after such answers). Checked without waiting, over many
/// requests, so that a write after the close shows.
#[test]
fn variable_path_line_is_written_before_the_close() {
    let s = start(
        "http { log_format u $request_uri;
           server { listen 127.0.0.1:@PORT@; root html;
             location /c { open_log_file_cache max=3 min_uses=2 valid=1m; access_log vlogs/c-$arg_f.log u; return 200; }
             location /n { access_log vlogs/n-$arg_f.log u; return 200; } } }",
    );
    for i in 1..=20 {
        for l in ["c", "n"] {
            let r = req(&s, &format!("GET /{}?f=a HTTP/1.0\r\nHost: x\r\n\r\n", l));
            assert_eq!(r.status, 200);
            let got = s.prefix.read(&format!("vlogs/{}-a.log", l)).lines().count();
            assert_eq!(got, i, "/{} request {}", l, i);
        }
    }
}
