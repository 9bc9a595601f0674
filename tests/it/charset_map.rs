//! `charset_map` recoding and `add_trailer` with `$sent_trailer_*` /
//! `$sent_http_*`, against the real nginx: the same files and
//! configuration in both, the status, Content-Type, Content-Length and
//! body (or trailers) compared.

use crate::harness::*;

const CONF: &str = "http { access_log off;
    types { text/html html; }
    charset_map koi8-r utf-8 { C1 D0B0; C2 D0B1; }
    charset_map windows-1251 koi8-r { E0 C1; E1 C2; }
    server { listen 127.0.0.1:@PORT@; root html;
        location /u/ { charset utf-8; source_charset koi8-r; }
        location /k/ { charset koi8-r; source_charset utf-8; }
        location /w/ { charset koi8-r; source_charset windows-1251; }
        location /same/ { charset KOI8-R; source_charset koi8-r; }
        location /t/ {
            add_trailer X-A $host;
            add_trailer X-B [$sent_trailer_x_a];
            add_trailer X-C $sent_http_accept_ranges;
            add_header Cache-Control a;
            add_header Cache-Control b;
            add_trailer X-D $sent_http_cache_control;
        }
    } }";

fn files(p: &Prefix) {
    // koi8-r: C1 C2 are а б; C3 has no entry (to UTF-8 it is `?`).
    p.write("html/u/a.html", b"x\xc1\xc2\xc3y");
    // UTF-8 а б, then ж (no byte in the map) and a cut sequence.
    p.write("html/k/a.html", b"x\xd0\xb0\xd0\xb1\xd0\xb6y\xd0");
    p.write("html/w/a.html", b"0123456789\xe0\xe1\xe1");
    p.write("html/same/a.html", b"\xe0\xe1");
    // E2 is not in the windows-1251 -> koi8-r map: nginx sends `?`.
    p.write("html/w/b.html", b"a\xe2\xe0b");
    p.write("html/t/a.html", b"SEE-THIS");
}

fn answer(port: u16, req: &str) -> String {
    let data = raw(port, req.as_bytes());
    let Some(r) = Resp::parse(&data) else {
        return "no response".into();
    };
    let keep = [
        "content-type",
        "content-length",
        "content-range",
        "transfer-encoding",
    ];
    let mut out = format!("{}", r.status);
    for (n, v) in &r.headers {
        if keep.contains(&n.to_ascii_lowercase().as_str()) {
            out += &format!("\n{n}: {v}");
        }
    }
    // The bytes after the head as sent (chunks and trailers included).
    let rest = find(&data, b"\r\n\r\n").map_or(&data[..0], |i| &data[i + 4..]);
    out += &format!("\n{:?}", String::from_utf8_lossy(rest));
    out
}

#[test]
fn charset_map_recodes_and_trailers_see_earlier_ones_as_nginx() {
    let reqs = [
        "GET /u/a.html HTTP/1.0\r\n\r\n",
        "GET /k/a.html HTTP/1.0\r\n\r\n",
        "GET /w/a.html HTTP/1.0\r\n\r\n",
        "GET /w/a.html HTTP/1.0\r\nRange: bytes=9-11\r\n\r\n",
        "GET /same/a.html HTTP/1.0\r\n\r\n",
        "GET /t/a.html HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        "GET /w/b.html HTTP/1.0\r\n\r\n",
    ];
    let p = Prefix::new();
    files(&p);
    let s = Server::start_in(p, CONF);
    let got: Vec<String> = reqs.iter().map(|r| answer(s.port, r)).collect();
    // What nginx 1.22.1 answers (checked below when it is installed).
    assert!(got[0].contains("charset=utf-8"), "{}", got[0]);
    assert!(got[0].ends_with("\"xаб?y\""), "{}", got[0]);
    assert!(got[2].contains("Content-Length: 13"), "{}", got[2]);
    assert!(got[3].starts_with("206"), "{}", got[3]);
    assert!(got[5].contains("X-B: [h]"), "{}", got[5]);
    assert!(got[6].ends_with("\"a?\u{fffd}b\""), "{}", got[6]);
    if !nginx_installed() {
        return;
    }
    let np = Prefix::new();
    files(&np);
    let port = free_port();
    let Some(_n) = start_nginx(&np, CONF, port) else {
        panic!("nginx did not start");
    };
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(got[i], answer(port, r), "{r}");
    }
}

#[test]
fn charset_map_errors_name_the_place() {
    let t = ConfTest::run(
        "events {} http { charset_map a b { 1G 20; } server { listen 127.0.0.1:1; } }",
    );
    t.assert_says("emerg", "invalid value \"1G\"", 1);
    let t = ConfTest::run(
        "events {} http { charset_map a b { 41 42; } charset_map A B { 41 42; } server { listen 127.0.0.1:1; } }",
    );
    t.assert_says(
        "emerg",
        "duplicate \"charset_map\" between \"A\" and \"B\"",
        1,
    );
}
