//! Content types and charsets of proxied and static responses against the
//! real nginx: `gzip_types` with parameters, `X-Accel-Charset`,
//! `charset $var` with a charset the configuration does not know. Each
//! test runs the same configuration in tern and nginx and compares the
//! status, Content-Type, Content-Encoding and the error-log lines.

use crate::harness::*;
use crate::origin::Origin;

/// `%XX` decoding of a query value (`+` stays).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn escape(s: &str) -> String {
    s.bytes()
        .map(|c| match c {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (c as char).to_string(),
            _ => format!("%{:02X}", c),
        })
        .collect()
}

/// An origin whose answer the query describes: `ct=` (Content-Type),
/// `xac=` (X-Accel-Charset), `st=` (status); a 300-byte body.
fn origin() -> Origin {
    Origin::start(|head| {
        let target = head.split(' ').nth(1).unwrap_or("/");
        let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
        let mut ct = None;
        let mut xac = None;
        let mut st = "200 OK".to_string();
        for kv in query.split('&') {
            match kv.split_once('=') {
                Some(("ct", v)) => ct = Some(unescape(v)),
                Some(("xac", v)) => xac = Some(unescape(v)),
                Some(("st", "301")) => st = "301 Moved Permanently\r\nLocation: /x".into(),
                _ => {}
            }
        }
        let body = "a".repeat(300);
        let mut h = format!("HTTP/1.1 {st}\r\nContent-Length: {}\r\n", body.len());
        if let Some(ct) = ct {
            h += &format!("Content-Type: {ct}\r\n");
        }
        if let Some(x) = xac {
            h += &format!("X-Accel-Charset: {x}\r\n");
        }
        Some(format!("{h}\r\n{body}").into_bytes())
    })
}

/// A request path for the origin.
fn q(loc: &str, ct: &str, xac: Option<&str>) -> String {
    let mut p = format!("{loc}?ct={}", escape(ct));
    if let Some(x) = xac {
        p += &format!("&xac={}", escape(x));
    }
    p
}

/// What is compared: status, Content-Type, Content-Encoding, and whether
/// X-Accel-Charset reached the client.
fn answer(port: u16, path: &str) -> String {
    let r = Resp::parse(&raw(
        port,
        format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    ))
    .expect("a response");
    format!(
        "{} ct={:?} ce={:?} xac={:?}",
        r.status,
        r.header("Content-Type"),
        r.header("Content-Encoding"),
        r.header("X-Accel-Charset")
    )
}

/// The `[error]` messages of a log (time, pid, `*N` and the context cut),
/// in order.
fn errors(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(" [error] "))
        .map(|l| {
            let m = l.split_once(": *").map_or(l, |(_, m)| m);
            let m = m.split_once(' ').map_or(m, |(_, m)| m);
            let m = m.split(", client:").next().unwrap_or(m);
            // tern's charset lines lack nginx's action (DIFFERENCES.md).
            m.trim_end_matches(" while reading response header from upstream")
                .to_string()
        })
        .collect()
}

/// Runs `paths` against tern and, when installed, nginx on `conf`
/// (`@ORIGIN@` = the origin's port, `setup` fills each prefix); asserts
/// that both answer `want` and log `want_errors`.
fn compare(
    conf: &str,
    setup: impl Fn(&Prefix),
    paths: &[String],
    want: &[&str],
    want_errors: &[&str],
) {
    let o = origin();
    let conf = conf.replace("@ORIGIN@", &o.port.to_string());
    if nginx_installed() {
        let pn = Prefix::new();
        setup(&pn);
        let port = free_port();
        let Some(_n) = start_nginx(&pn, &conf, port) else {
            panic!("nginx did not start: {}", pn.read("logs/error.log"));
        };
        let ngx: Vec<String> = paths.iter().map(|p| answer(port, p)).collect();
        // nginx writes its lines before it answers.
        let nerr = errors(&pn.read("logs/error.log"));
        for (i, (n, w)) in ngx.iter().zip(want).enumerate() {
            assert_eq!(n, w, "nginx, {}", paths[i]);
        }
        assert_eq!(nerr, want_errors, "nginx's error log");
    }
    let p = Prefix::new();
    setup(&p);
    let s = Server::start_in(p, &conf);
    let got: Vec<String> = paths.iter().map(|p| answer(s.port, p)).collect();
    // A last request whose line marks the end of the error log.
    assert_eq!(s.get("/no-such-file-at-the-end").status, 404);
    let log = s.wait_error_log("no-such-file-at-the-end");
    let mut errs = errors(&log);
    errs.pop();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "tern, {}", paths[i]);
    }
    assert_eq!(errs, want_errors, "tern's error log");
}

/// `gzip_types` compares the type before `; charset=`, and the whole value
/// when the parameter is another one (nginx's `content_type_len` ends at
/// the `;` only before a charset). Static files get their charset from the
/// charset filter and compare by type.
#[test]
fn gzip_types_with_parameters_as_nginx() {
    let conf = "http { access_log off; types { text/css css; text/plain txt; }
        server { listen 127.0.0.1:@PORT@; root html;
        gzip on; gzip_min_length 1; gzip_proxied any; gzip_types text/css;
        location /g/ { proxy_pass http://127.0.0.1:@ORIGIN@; }
        location /s/ { charset utf-8; charset_types text/css; }
    } }";
    let cts = [
        "text/css; charset=utf-8",
        "text/css;charset=utf-8",
        "text/css; foo=bar",
        "TEXT/CSS; charset=utf-8",
        "text/css ; charset=utf-8",
        "text/css; foo=bar; charset=utf-8",
        "text/html; charset=utf-8",
        "text/html; foo=bar",
        "text/plain; charset=utf-8",
    ];
    let mut paths: Vec<String> = cts.iter().map(|c| q("/g/", c, None)).collect();
    paths.push("/s/x.css".into());
    paths.push("/s/x.txt".into());
    let want = [
        "200 ct=Some(\"text/css; charset=utf-8\") ce=Some(\"gzip\") xac=None",
        "200 ct=Some(\"text/css;charset=utf-8\") ce=Some(\"gzip\") xac=None",
        "200 ct=Some(\"text/css; foo=bar\") ce=None xac=None",
        "200 ct=Some(\"TEXT/CSS; charset=utf-8\") ce=Some(\"gzip\") xac=None",
        "200 ct=Some(\"text/css ; charset=utf-8\") ce=None xac=None",
        "200 ct=Some(\"text/css; foo=bar; charset=utf-8\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=utf-8\") ce=Some(\"gzip\") xac=None",
        "200 ct=Some(\"text/html; foo=bar\") ce=None xac=None",
        "200 ct=Some(\"text/plain; charset=utf-8\") ce=None xac=None",
        "200 ct=Some(\"text/css; charset=utf-8\") ce=Some(\"gzip\") xac=None",
        "200 ct=Some(\"text/plain\") ce=None xac=None",
    ];
    let setup = |p: &Prefix| {
        p.write("html/s/x.css", "b{}".repeat(100));
        p.write("html/s/x.txt", "t".repeat(300));
    };
    compare(conf, setup, &paths, &want, &[]);
}

/// `X-Accel-Charset` from upstream is the charset nginx declares, over
/// `charset` and `charset_types`, when the configuration names that
/// charset somewhere; an unknown one is logged and changes nothing; the
/// header itself never reaches the client.
#[test]
fn x_accel_charset_as_nginx() {
    let conf = "http { access_log off;
        server { listen 127.0.0.1:@PORT@; root html;
        location /known/ { charset koi8-r; source_charset koi8-r; }
        location /x/ { proxy_pass http://127.0.0.1:@ORIGIN@; }
        location /u/ { charset utf-8; proxy_pass http://127.0.0.1:@ORIGIN@; }
        location /i/ { proxy_ignore_headers X-Accel-Charset; proxy_pass http://127.0.0.1:@ORIGIN@; }
    } }";
    let paths = [
        q("/x/", "text/html", Some("koi8-r")),
        q("/x/", "text/html", Some("KOI8-R")),
        q("/x/", "text/html", Some("windows-1251")),
        q("/x/", "application/octet-stream", Some("koi8-r")),
        q("/x/", "text/html; charset=koi8-r", Some("Koi8-R")),
        q("/x/", "text/html; charset=iso-8859-5", Some("koi8-r")),
        q("/x/", "text/html", Some("")),
        q("/u/", "text/html", Some("koi8-r")),
        q("/u/", "text/html", Some("utf-8")),
        q("/i/", "text/html", Some("koi8-r")),
        q("/x/", "text/html", Some("koi8-r")) + "&st=301",
    ];
    let want = [
        "200 ct=Some(\"text/html; charset=koi8-r\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=KOI8-R\") ce=None xac=None",
        "200 ct=Some(\"text/html\") ce=None xac=None",
        "200 ct=Some(\"application/octet-stream; charset=koi8-r\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=Koi8-R\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=iso-8859-5\") ce=None xac=None",
        "200 ct=Some(\"text/html\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=koi8-r\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=utf-8\") ce=None xac=None",
        "200 ct=Some(\"text/html\") ce=None xac=None",
        "301 ct=Some(\"text/html\") ce=None xac=None",
    ];
    let errs = [
        "unknown charset \"windows-1251\" to override",
        "no \"charset_map\" between the charsets \"iso-8859-5\" and \"koi8-r\"",
    ];
    compare(conf, |_| {}, &paths, &want, &errs);
}

/// `charset $var` names the charset per request. A name the configuration
/// does not know is declared as the variable spells it; beside a
/// response's own charset with `override_charset on`, nginx keeps the
/// upstream's spelling when both are unknown and alike, respells only a
/// known one, and logs the pairs it cannot recode.
#[test]
fn charset_variable_with_unknown_upstream_charsets_as_nginx() {
    let conf = "http { access_log off;
        map $arg_cs $cs { default $arg_cs; }
        server { listen 127.0.0.1:@PORT@; root html;
        location /known/ { charset koi8-r; source_charset koi8-r; }
        location /v/ { charset $cs; override_charset on; proxy_pass http://127.0.0.1:@ORIGIN@; }
    } }";
    let v = |cs: &str, ct: &str| format!("{}&cs={}", q("/v/", ct, None), escape(cs));
    let paths = [
        v("foo", "text/html"),
        v("Foo", "text/html; charset=FOO"),
        v("fo", "text/html; charset=foo"),
        v("bar", "text/html; charset=foo"),
        v("koi8-r", "text/html; charset=KOI8-R"),
        v("KOI8-R", "text/html; charset=\"koi8-r\""),
        v("koi8-r", "text/html; charset=foo"),
        v("foo", "text/html; charset=koi8-r"),
    ];
    let want = [
        "200 ct=Some(\"text/html; charset=foo\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=FOO\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=foo\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=foo\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=koi8-r\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=KOI8-R\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=foo\") ce=None xac=None",
        "200 ct=Some(\"text/html; charset=koi8-r\") ce=None xac=None",
    ];
    let errs = [
        "no \"charset_map\" between the charsets \"foo\" and \"bar\"",
        "no \"charset_map\" between the charsets \"foo\" and \"koi8-r\"",
        "no \"charset_map\" between the charsets \"koi8-r\" and \"foo\"",
    ];
    compare(conf, |_| {}, &paths, &want, &errs);
}
