//! userid against the real nginx: the same Set-Cookie, P3P and variables
//! for a cookie the client brings (byte for byte), the same shape for a
//! new identifier (whose time and sequence differ), and cookies set by
//! one server read by the other.

use crate::differential::{exchange, normalize};
use crate::harness::{free_port, nginx_installed, start_nginx, Prefix, Server};

const CONF: &str = r#"
http {
    access_log off;
    server {
        listen 127.0.0.1:@PORT@;
        location /on/ {
            userid on;
            userid_domain example.com;
            userid_path /on/;
            userid_p3p 'CP="CUR ADM"';
            userid_flags httponly samesite=lax secure;
            add_header X-Set $uid_set;
            return 200 "got=$uid_got set=$uid_set\n";
        }
        location /v1/ {
            userid v1;
            userid_service 7;
            userid_name vid;
            return 200 "got=$uid_got set=$uid_set\n";
        }
        location /log/ { userid log; return 200 "got=$uid_got set=$uid_set\n"; }
        location /mark/ {
            userid on;
            userid_mark t;
            userid_expires max;
            return 200 "got=$uid_got set=$uid_set\n";
        }
        location /reset/ { userid on; set $uid_reset 1; return 200 "got=$uid_got set=$uid_set\n"; }
        location /off/ { return 200 "got=$uid_got set=$uid_set\n"; }
        location /exp/ { userid on; userid_expires 1h; userid_service 258; return 404; }
    }
}
"#;

/// 16 bytes nginx would have set (`on`): 127.0.0.1, a time, a start
/// value, a sequence number.
const COOKIE: &str = "fwAAAWXhN6xGKQAAAwMDAg==";

fn get(port: u16, path: &str, cookie: Option<&str>) -> String {
    let c = cookie
        .map(|c| format!("Cookie: a=b; {}\r\n", c))
        .unwrap_or_default();
    let req = format!("GET {} HTTP/1.0\r\nHost: h\r\n{}\r\n", path, c);
    normalize(&exchange(port, req.as_bytes()), port)
}

/// Requests whose answers do not depend on time or counters.
fn fixed(port: u16) -> Vec<String> {
    let c = format!("uid={}", COOKIE);
    let marked = format!("uid={}t=", &COOKIE[..22]);
    vec![
        get(port, "/on/", Some(&c)),
        get(port, "/on/", Some(&format!("UID = {}", COOKIE))),
        get(port, "/v1/", Some(&format!("vid={}", COOKIE))),
        get(port, "/log/", Some(&c)),
        get(port, "/log/", None),
        get(port, "/mark/", Some(&c)),
        get(port, "/mark/", Some(&marked)),
        get(port, "/off/", Some(&c)),
    ]
}

/// Replaces what a new identifier makes unique.
fn shape(s: &str) -> String {
    let hex = regex::Regex::new(r"(uid|vid)=([0-9A-F]{8})[0-9A-F]{24}").expect("re");
    let b64 = regex::Regex::new(r"(uid|vid)=[A-Za-z0-9+/]{22}").expect("re");
    let exp = regex::Regex::new(r"expires=[^;]*").expect("re");
    let s = hex.replace_all(s, "$1=${2}XXX");
    let s = b64.replace_all(&s, "$1=B64");
    exp.replace_all(&s, "expires=T").into_owned()
}

fn fresh(port: u16) -> Vec<String> {
    vec![
        shape(&get(port, "/on/", None)),
        shape(&get(port, "/v1/", None)),
        shape(&get(port, "/mark/", None)),
        shape(&get(port, "/reset/", Some(&format!("uid={}", COOKIE)))),
        shape(&get(port, "/exp/", None)),
        shape(&get(port, "/on/", Some("uid=short"))),
        shape(&get(port, "/on/", Some("uid=!!!!!!!!!!!!!!!!!!!!!!!!"))),
        shape(&get(port, "/on/", Some("uid=AAAAAAAAAAAAAAAAAAAAAAAA"))),
    ]
}

/// The Set-Cookie value's `name=value` and the `set=` the body printed.
fn new_cookie(port: u16) -> (String, String) {
    let r = get(port, "/on/", None);
    let cookie = r
        .lines()
        .find_map(|l| l.strip_prefix("Set-Cookie: "))
        .and_then(|v| v.split(';').next())
        .unwrap_or("")
        .to_string();
    let set = r.split("set=").nth(1).unwrap_or("").trim().to_string();
    (cookie, set)
}

#[test]
fn userid_as_nginx() {
    let s = Server::start(CONF);
    let ours = fixed(s.port);
    let ours_fresh = fresh(s.port);
    let (our_cookie, our_set) = new_cookie(s.port);
    assert!(
        ours[0].contains("\r\n\r\ngot=uid=0100007F") && !ours[0].contains("Set-Cookie"),
        "{:?}",
        ours[0]
    );
    // A new identifier of `on` starts with the server's address.
    assert!(our_set.starts_with("uid=0100007F"), "{:?}", our_set);
    if !nginx_installed() {
        drop(s);
        return;
    }
    let p = Prefix::new();
    let port = free_port();
    let Some(_nginx) = start_nginx(&p, CONF, port) else {
        panic!("nginx did not start: {}", p.read("logs/error.log"));
    };
    let theirs = fixed(port);
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(a, b, "fixed request {}", i);
    }
    for (i, (a, b)) in ours_fresh.iter().zip(&fresh(port)).enumerate() {
        assert_eq!(a, b, "new identifier {}", i);
    }
    // nginx reads tern's cookie, tern reads nginx's.
    let (their_cookie, their_set) = new_cookie(port);
    let r = get(port, "/on/", Some(&our_cookie));
    assert!(r.ends_with(&format!("got={} set=\n", our_set)), "{:?}", r);
    let r = get(s.port, "/on/", Some(&their_cookie));
    assert!(r.ends_with(&format!("got={} set=\n", their_set)), "{:?}", r);
}
