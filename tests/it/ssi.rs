//! The `ssi` filter against the real nginx: echo (encodings, defaults,
//! prefix variables), set, include virtual (args, stub, set=, relative
//! URIs, nested SSI), if/elif/else with strings and regex captures,
//! block, config errmsg, error output and the headers SSI clears.

use crate::harness::*;

const CONF: &str = "http { access_log off;
    types { text/html html; text/plain txt; }
    server { listen 127.0.0.1:@PORT@; root html;
        location / { ssi on; }
        location /raw/ { ssi off; }
        location /plain/ { ssi on; ssi_types text/plain; }
        location /silent/ { ssi on; ssi_silent_errors on; }
        location /lm/ { ssi on; ssi_last_modified on; }
        location /set/ { ssi on; set $http_foo from_set; }
        location /small/ { subrequest_output_buffer_size 42; }
    } }";

fn files(p: &Prefix) {
    let w = |n: &str, s: &str| {
        p.write(&format!("html/{n}"), s);
    };
    w("echo.html", "X<!--#echo var=\"arg_a\" -->|<!--#echo var=\"nope\" -->|<!--#echo var=\"nope\" default=\"d$arg_a\" -->X\n");
    w(
        "enc.html",
        "<!--#set var=\"v\" value=\"<a b='c'>&amp;\" --><!--#echo var=\"v\" -->|<!--#echo var=\"v\" encoding=\"none\" -->|<!--#echo var=\"v\" encoding=\"url\" -->\n",
    );
    w(
        "inc.html",
        "[<!--#include virtual=\"/sub/part.html?a=$arg_a\" -->]\n",
    );
    w(
        "sub/part.html",
        "part:<!--#echo var=\"arg_a\" -->:<!--#echo var=\"shared\" -->",
    );
    w(
        "rel.html",
        "<!--#set var=\"shared\" value=\"S\" -->(<!--#include file=\"sub/part.html\" -->)\n",
    );
    w(
        "stub.html",
        "<!--#block name=\"one\" -->STUB<!--#endblock -->a<!--#include virtual=\"/missing\" stub=\"one\" -->b<!--#include virtual=\"/raw/empty.html\" stub=\"one\" -->c\n",
    );
    w("raw/empty.html", "");
    w("raw/t.html", "<!--#echo var=\"arg_a\" -->");
    w(
        "setinc.html",
        "<!--#include virtual=\"/raw/t.html\" set=\"x\" -->[<!--#echo var=\"x\" encoding=\"none\" -->]\n",
    );
    w(
        "if.html",
        "<!--#if expr=\"$arg_a\" -->A<!--#elif expr=\"$arg_b = yes\" -->B<!--#elif expr=\"$arg_c != /^n(o+)$/\" -->C<!--#else -->E<!--#echo var=\"1\" --><!--#endif -->\n",
    );
    w(
        "bad.html",
        "a<!--#foo -->b<!--#echo -->c<!--#config errmsg=\"ERR\" --><!--#echo bad=x -->d\n",
    );
    w("silent/bad.html", "a<!--#foo -->b\n");
    // Blanks may follow `<!--#`; a `set=` answer over the subrequest's
    // subrequest_output_buffer_size ends the whole request unanswered.
    w("blank.html", "<!--# \techo var=\"arg_a\" -->\n");
    w("small/long.txt", &"x".repeat(400));
    w("small/short.txt", "short");
    w(
        "big.html",
        "<!--#include virtual=\"/small/$arg_f\" set=\"x\" -->set: <!--#echo var=\"x\" -->\n",
    );
    w("plain/t.txt", "<!--#echo var=\"arg_a\" -->\n");
    w("raw/t.txt", "<!--#echo var=\"arg_a\" -->\n");
    w("lm/t.html", "<!--#echo var=\"arg_a\" -->\n");
    w(
        "set/t.html",
        "<!--#echo var=\"http_foo\" -->/<!--#echo var=\"http_bar\" -->\n",
    );
}

fn answer(port: u16, path: &str, extra: &str) -> String {
    let req = format!("GET {path} HTTP/1.0\r\nHost: x\r\n{extra}\r\n");
    let data = raw(port, req.as_bytes());
    let Some(r) = Resp::parse(&data) else {
        return "no response".into();
    };
    let mut out = format!("{}", r.status);
    for h in [
        "content-length",
        "last-modified",
        "accept-ranges",
        "content-type",
    ] {
        out += &format!(" {h}={}", r.header(h).is_some());
    }
    out += &format!(
        " etag-weak={}",
        r.header("etag").is_some_and(|e| e.starts_with("W/"))
    );
    out += &format!("\n{}", r.body_str());
    out
}

const PATHS: &[(&str, &str)] = &[
    ("/echo.html?a=1", ""),
    ("/echo.html", ""),
    ("/enc.html", ""),
    ("/inc.html?a=q", ""),
    ("/rel.html?a=r", ""),
    ("/stub.html", ""),
    ("/setinc.html?a=v", ""),
    ("/if.html?a=1", ""),
    ("/if.html?b=yes", ""),
    ("/bad.html", ""),
    ("/silent/bad.html", ""),
    ("/plain/t.txt?a=p", ""),
    ("/raw/t.txt?a=p", ""),
    ("/lm/t.html?a=l", ""),
    ("/set/t.html", "Foo: hdr\r\nBar: bar\r\n"),
    ("/blank.html?a=b", ""),
    ("/big.html?f=short.txt", ""),
    ("/big.html?f=long.txt", ""),
];

#[test]
fn ssi_commands_as_nginx() {
    let p = Prefix::new();
    files(&p);
    let s = Server::start_in(p, CONF);
    let got: Vec<String> = PATHS.iter().map(|(p, e)| answer(s.port, p, e)).collect();
    assert!(got[0].ends_with("X1|(none)|d$arg_aX\n"), "{}", got[0]);
    assert!(got[3].ends_with("[part:q:(none)]\n"), "{}", got[3]);
    assert!(got[5].ends_with("aSTUBbSTUBc\n"), "{}", got[5]);
    assert!(got[15].ends_with("\nb\n"), "{}", got[15]);
    assert!(got[16].ends_with("\nset: short\n"), "{}", got[16]);
    assert_eq!(got[17], "no response");
    assert!(
        got[0].starts_with("200 content-length=false last-modified=false"),
        "{}",
        got[0]
    );
    if !nginx_installed() {
        return;
    }
    let np = Prefix::new();
    files(&np);
    let port = free_port();
    let Some(_n) = start_nginx(&np, CONF, port) else {
        panic!("nginx did not start");
    };
    for (i, (path, extra)) in PATHS.iter().enumerate() {
        assert_eq!(got[i], answer(port, path, extra), "{path}");
    }
}

/// The includes of a page run at once, as nginx's subrequests do, and
/// their output keeps the page's order. The backend holds the first
/// include's request until the second one arrives (20 s at most), then
/// answers the second first: includes run one after another would never
/// have both requests in at once.
#[test]
fn ssi_includes_run_at_once_in_order() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    fn request_path(s: &mut TcpStream) -> String {
        let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
        let mut data = Vec::new();
        let mut buf = [0u8; 4096];
        while find(&data, b"\r\n\r\n").is_none() {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => data.extend_from_slice(&buf[..n]),
            }
        }
        let line = String::from_utf8_lossy(&data).into_owned();
        line.split(' ').nth(1).unwrap_or("").to_string()
    }
    fn answer(mut s: TcpStream, body: &str) {
        let r = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
            body.len(),
            body
        );
        let _ = s.write_all(r.as_bytes());
    }

    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let bport = l.local_addr().expect("addr").port();
    let backend = std::thread::spawn(move || {
        let (mut first, _) = l.accept().expect("first include");
        let p1 = request_path(&mut first);
        l.set_nonblocking(true).expect("nonblocking");
        let until = Instant::now() + Duration::from_secs(20);
        let second = loop {
            match l.accept() {
                Ok((s, _)) => break Some(s),
                Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break None,
            }
        };
        let at_once = second.is_some();
        let second = match second {
            Some(s) => s,
            None => {
                // One after another: answer the first, then wait for the next.
                answer(first.try_clone().expect("clone"), &p1);
                l.set_nonblocking(false).expect("blocking");
                l.accept().expect("second include").0
            }
        };
        let mut second = second;
        let _ = second.set_nonblocking(false);
        let p2 = request_path(&mut second);
        answer(second, &p2);
        if at_once {
            answer(first, &p1);
        }
        at_once
    });
    let p = Prefix::new();
    p.write(
        "html/page.html",
        "[<!--#include virtual=\"/up/a\" -->][<!--#include virtual=\"/up/b\" -->]<!--#echo var=\"x\" default=\"e\" -->\n",
    );
    let s = Server::start_in(
        p,
        &format!(
            "http {{ server {{ listen 127.0.0.1:@PORT@; root html;\n\
               location / {{ ssi on; }}\n\
               location /up/ {{ proxy_pass http://127.0.0.1:{bport}; proxy_read_timeout 60s; }} }} }}\n"
        ),
    );
    let mut c = connect(s.port);
    c.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    c.write_all(b"GET /page.html HTTP/1.0\r\nHost: x\r\n\r\n")
        .expect("write");
    let r = Resp::parse(&read_to_close(&mut c)).expect("a response");
    assert_eq!(r.status, 200);
    assert_eq!(r.body_str(), "[/up/a][/up/b]e\n");
    assert!(
        backend.join().expect("backend"),
        "the second include was not sent while the first was waiting"
    );
}
