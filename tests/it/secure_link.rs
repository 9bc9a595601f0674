//! secure_link against the real nginx: `$secure_link` and
//! `$secure_link_expires` in both modes, the same answers for good, bad,
//! expired and malformed links.

use base64::Engine;
use md5::{Digest, Md5};

use crate::differential::{exchange, normalize};
use crate::harness::{free_port, nginx_installed, start_nginx, ConfTest, Prefix, Server};

const CONF: &str = r#"
http {
    access_log off;
    server {
        listen 127.0.0.1:@PORT@;
        location /s/ {
            secure_link $arg_md5,$arg_expires;
            secure_link_md5 "$secure_link_expires$uri secret";
            if ($secure_link = "") { return 403; }
            if ($secure_link = "0") { return 410; }
            return 200 "ok [$secure_link] [$secure_link_expires]\n";
        }
        location /n/ {
            secure_link $arg_md5;
            secure_link_md5 "$uri secret";
            return 200 "[$secure_link] [$secure_link_expires]\n";
        }
        location /nomd5/ {
            secure_link $arg_md5;
            return 200 "[$secure_link]\n";
        }
        location /p/ {
            secure_link_secret sekrit;
            if ($secure_link = "") { return 403; }
            return 200 "link=$secure_link\n";
        }
        location /i/ {
            secure_link_secret sekrit;
            location /i/new/ {
                secure_link $arg_md5;
                secure_link_md5 "$uri secret";
                return 200 "new [$secure_link]\n";
            }
            return 200 "old [$secure_link]\n";
        }
    }
}
"#;

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Md5::digest(data))
}

fn hex(data: &[u8], upper: bool) -> String {
    Md5::digest(data)
        .iter()
        .map(|b| {
            if upper {
                format!("{:02X}", b)
            } else {
                format!("{:02x}", b)
            }
        })
        .collect()
}

fn targets() -> Vec<String> {
    let future = "2147483647";
    let mut t = vec![
        format!("/s/f?md5={}", b64(b"/s/f secret")),
        format!(
            "/s/f?md5={}&expires={}",
            b64(format!("{}/s/f secret", future).as_bytes()),
            future
        ),
        format!("/s/f?md5={}&expires=1000", b64(b"1000/s/f secret")),
        format!("/s/f?md5={}&expires=0", b64(b"0/s/f secret")),
        format!("/s/f?md5={}&expires=12x", b64(b"12x/s/f secret")),
        format!("/s/f?md5={}", b64(b"/s/g secret")),
        format!("/s/f?md5={}==", b64(b"/s/f secret")),
        format!("/s/f?md5={}A", b64(b"/s/f secret")),
        "/s/f?md5=".to_string(),
        "/s/f".to_string(),
        "/s/f?md5=a+b/".to_string(),
        format!("/n/x?md5={}", b64(b"/n/x secret")),
        format!("/n/x?md5={}x", b64(b"/n/x secret")),
        format!("/nomd5/x?md5={}", b64(b"/nomd5/x")),
        format!("/p/{}/dir/file.txt", hex(b"dir/file.txtsekrit", false)),
        format!("/p/{}/dir/file.txt", hex(b"dir/file.txtsekrit", true)),
        format!(
            "/p/{}/dir/file.txt?a=1",
            hex(b"dir/file.txt?a=1sekrit", false)
        ),
        format!("/p/{}/dir/other.txt", hex(b"dir/file.txtsekrit", false)),
        format!("/p/{}/", hex(b"sekrit", false)),
        "/p/abc/file".to_string(),
        "/p/".to_string(),
        format!("/i/new/x?md5={}", b64(b"/i/new/x secret")),
        format!("/i/{}/x", hex(b"xsekrit", false)),
    ];
    // A hash with a '+' where hex digits belong.
    let mut h = hex(b"xsekrit", false);
    h.replace_range(0..1, "+");
    t.push(format!("/p/{}/x", h));
    t
}

fn answers(port: u16) -> Vec<String> {
    targets()
        .iter()
        .map(|t| {
            let req = format!("GET {} HTTP/1.0\r\nHost: h\r\n\r\n", t);
            normalize(&exchange(port, req.as_bytes()), port)
        })
        .collect()
}

#[test]
fn secure_link_as_nginx() {
    let s = Server::start(CONF);
    let ours = answers(s.port);
    drop(s);
    // "HASH," (no expiry after the comma) is not found, as in nginx.
    assert!(ours[0].starts_with("HTTP/1.1 403 "), "{:?}", ours[0]);
    assert!(ours[11].ends_with("\r\n\r\n[1] []\n"), "{:?}", ours[11]);
    assert!(
        ours[1].ends_with("\r\n\r\nok [1] [2147483647]\n"),
        "{:?}",
        ours[1]
    );
    assert!(ours[2].starts_with("HTTP/1.1 410 "), "{:?}", ours[2]);
    assert!(ours[5].starts_with("HTTP/1.1 403 "), "{:?}", ours[5]);
    assert!(
        ours[14].ends_with("\r\n\r\nlink=dir/file.txt\n"),
        "{:?}",
        ours[14]
    );
    // A nested location with the new style does not inherit the old one.
    assert!(ours[21].ends_with("\r\n\r\nnew [1]\n"), "{:?}", ours[21]);
    assert!(ours[22].ends_with("\r\n\r\nold [x]\n"), "{:?}", ours[22]);
    if !nginx_installed() {
        return;
    }
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, CONF, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = answers(port);
    for (i, t) in targets().iter().enumerate() {
        assert_eq!(ours[i], theirs[i], "GET {}", t);
    }
}

#[test]
fn secure_link_secret_mixed_with_secure_link_is_refused_as_nginx() {
    // nginx refuses it when it merges the http block, so it names the
    // line of the block's closing brace (nginx -t on the same texts).
    let mixed = "events {}
http {
    server {
        listen 127.0.0.1:1;
        location /a {
            secure_link $arg_md5;
            secure_link_secret foo;
        }
    }
}
";
    let t = ConfTest::run(mixed);
    t.assert_says(
        "emerg",
        "\"secure_link_secret\" cannot be mixed with \"secure_link\" and \"secure_link_md5\"",
        10,
    );
    assert_eq!(t.code, Some(1));
    let md5 = mixed.replace("secure_link $arg_md5;", "secure_link_md5 x;");
    ConfTest::run(&md5).assert_says(
        "emerg",
        "\"secure_link_secret\" cannot be mixed with \"secure_link\" and \"secure_link_md5\"",
        10,
    );
    // A directive error anywhere in the block is found first.
    let later = mixed.replace("    }\n}\n", "    }\n    bogus;\n}\n");
    ConfTest::run(&later).assert_says("emerg", "unknown directive \"bogus\"", 10);
    // Inherited from outside: no error (the location drops them).
    let outer = "events {}
http {
    secure_link $arg_md5;
    secure_link_md5 x;
    server {
        listen 127.0.0.1:1;
        location /a { secure_link_secret foo; }
    }
}
";
    let t = ConfTest::run(outer);
    assert_eq!(t.code, Some(0), "{}", t.stderr);
}
