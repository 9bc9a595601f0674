//! `auth_basic`, `auth_basic_user_file` and `satisfy`, side by side with
//! nginx: the same configuration and password file, the same requests;
//! responses compared byte for byte (after the differential test's
//! normalisation) and the error-log line each request leaves.

use std::io::Write;

use crate::differential::{exchange, normalize};
use crate::harness::*;

/// One user per password format; hashes made with fixed salts by
/// `openssl passwd` (-1, -5, -6, -apr1), libxcrypt (DES, bcrypt) and
/// by hand for nginx's own schemes.
const HTPASSWD: &str = "\
# users of every format
des:abCu5BZmWWFJU
md5:$1$saltsalt$bIQc.PIdGyyoVvhKbQOAT/
sha256:$5$saltsalt$zOFVkp0Kz29x0a6a4dSx8FZisA8Iwb0KzzvoRDFTN/8
sha256r:$5$rounds=1000$saltsalt$MpQQfvWjoyjvSr/.ZL8agaNp6yrLjHRxaIaFLn2tdA7
sha512:$6$saltsalt$vqfwhgbpDQsmrvB6w5/8F5c4CO40.Qu2BBSXMRAH03mtpJ3D3UncG8x1f8qam566S8Gqa9EQmwIXTEp9knEjA.
apr1:$apr1$saltsalt$29mG2DNQZIN57183yRfAG.:with a comment field
bcrypt:$2b$04$abcdefghijklmnopqrstuuzfA3NNEdz6JE6lgVecpP2AwKzyORVL.
bcrypty:$2y$04$abcdefghijklmnopqrstuu49I8LMyiVb2GA0mJTmxuZERx6S7IPaC
plain:{PLAIN}pwp\r
sha:{SHA}fn9NO4gmm8p+/qaTnTWuU3Ao+GQ=
ssha:{SSHA}Qb3vQGqLl6I8tYE2ioQZ3WA6O+ZOYUNs
garbage:not a hash
\n\
last:{PLAIN}pwl";

/// (user, password) pairs that are right.
const GOOD: &[(&str, &str)] = &[
    ("des", "pwd"),
    ("md5", "pw1"),
    ("sha256", "pw5"),
    ("sha256r", "pwsha"),
    ("sha512", "pw6"),
    ("apr1", "pwa"),
    ("bcrypt", "pwb"),
    ("bcrypty", "pwy"),
    ("plain", "pwp"),
    ("sha", "pws"),
    ("ssha", "pwss"),
    ("last", "pwl"),
];

const CONF: &str = r#"
worker_processes 1;
error_log logs/error.log info;
events {}
http {
    access_log off;
    default_type text/plain;
    server {
        listen 127.0.0.1:@PORT@;
        root html;
        # `return` runs before the access phase: the locations serve files,
        # and the user shows in a header.
        add_header X-User "[$remote_user]" always;
        location / {
            auth_basic "Private area";
            auth_basic_user_file htpasswd;
            location /open/ { auth_basic off; }
        }
        location /var/ {
            auth_basic $arg_realm;
            auth_basic_user_file $arg_file;
        }
        location /abs/ {
            auth_basic "abs";
            auth_basic_user_file @CONF@/htpasswd;
        }
        location /missing/ {
            auth_basic "m";
            auth_basic_user_file nosuchfile;
        }
        location /anydeny/ {
            satisfy any;
            deny all;
            auth_basic "any";
            auth_basic_user_file htpasswd;
        }
        location /anyallow/ {
            satisfy any;
            allow 127.0.0.1;
            deny all;
            auth_basic "any";
            auth_basic_user_file htpasswd;
        }
        location /anymissing/ {
            satisfy any;
            deny all;
            auth_basic "m";
            auth_basic_user_file nosuchfile;
        }
        location /anynone/ {
            satisfy any;
        }
        location /alldeny/ {
            deny all;
            auth_basic "all";
            auth_basic_user_file htpasswd;
        }
        location /le/ {
            limit_except GET { auth_basic "writers"; auth_basic_user_file htpasswd; }
        }
        location /ep/ {
            auth_basic "ep";
            auth_basic_user_file htpasswd;
            error_page 401 /unauth.html;
        }
        location = /unauth.html { }
        location /ep2/ {
            auth_basic "ep2";
            auth_basic_user_file htpasswd;
            error_page 401 /f.txt;
        }
        location /who { }
    }
}
"#;

const PATHS: &[&str] = &[
    "/f.txt",
    "/open/f.txt",
    "/var/f.txt?realm=R1&file=htpasswd",
    "/var/f.txt?realm=off&file=htpasswd",
    "/var/f.txt?realm=R2&file=nosuch",
    "/var/f.txt?realm=R3&file=.",
    "/var/f.txt?realm=R4",
    "/abs/f.txt",
    "/missing/f.txt",
    "/anydeny/f.txt",
    "/anyallow/f.txt",
    "/anymissing/f.txt",
    "/anynone/f.txt",
    "/alldeny/f.txt",
    "/le/f.txt",
    "/ep/f.txt",
    "/ep2/f.txt",
    "/who/f.txt",
];

fn files(p: &Prefix) {
    p.write("conf/htpasswd", HTPASSWD);
    p.write("html/unauth.html", "please log in\n");
    for path in PATHS {
        let file = path.split('?').next().unwrap_or(path);
        p.write(&format!("html{}", file), format!("file {}\n", file));
    }
    crate::differential::fix_times(&p.path("html"));
}

fn basic(user: &str, pass: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", user, pass))
}

fn get(path: &str, auth: Option<&str>) -> String {
    let mut r = format!(
        "GET {} HTTP/1.1\r\nHost: auth.test\r\nConnection: close\r\n",
        path
    );
    if let Some(a) = auth {
        r.push_str(&format!("Authorization: {}\r\n", a));
    }
    r.push_str("\r\n");
    r
}

fn corpus() -> Vec<String> {
    let mut reqs = Vec::new();
    for (u, p) in GOOD {
        reqs.push(get("/f.txt", Some(&format!("Basic {}", basic(u, p)))));
        reqs.push(get("/f.txt", Some(&format!("Basic {}", basic(u, "wrong")))));
    }
    for auth in [
        None,
        Some("Basic".to_string()),
        Some("Basic ".to_string()),
        Some("Basic    ".to_string()),
        Some("Bearer abc".to_string()),
        Some("Basic !!!!".to_string()),
        Some("Basic dXNlcg==".to_string()),
        Some(format!("Basic {}", basic("", "pw"))),
        Some(format!("basic   {}", basic("plain", "pwp"))),
        Some(format!(
            "BASIC {}",
            basic("plain", "pwp").trim_end_matches('=')
        )),
        Some(format!("Basic {}", basic("nobody", "pw"))),
        Some(format!("Basic {}", basic("pla", "pwp"))),
        Some(format!("Basic {}", basic("plainx", "pwp"))),
        Some(format!("Basic {}", basic("# users of every format", "x"))),
        Some(format!("Basic {}", basic("garbage", "not a hash"))),
        Some(format!("Basic {}", basic("plain", "pwp:extra"))),
        Some(format!("Basic {}", basic("sha512", ""))),
    ] {
        reqs.push(get("/f.txt", auth.as_deref()));
    }
    let good = format!("Basic {}", basic("md5", "pw1"));
    let bad = format!("Basic {}", basic("md5", "nope"));
    for path in PATHS {
        reqs.push(get(path, None));
        reqs.push(get(path, Some(&good)));
        reqs.push(get(path, Some(&bad)));
    }
    for m in ["POST", "HEAD", "DELETE"] {
        for a in [None, Some(&good), Some(&bad)] {
            let mut r = format!(
                "{} /le/f.txt HTTP/1.1\r\nHost: auth.test\r\nConnection: close\r\nContent-Length: 0\r\n",
                m
            );
            if let Some(a) = a {
                r.push_str(&format!("Authorization: {}\r\n", a));
            }
            r.push_str("\r\n");
            reqs.push(r);
        }
    }
    reqs
}

/// The auth-related lines the last request added to an error log, without
/// time, pid and connection number.
fn new_lines(path: &std::path::Path, seen: &mut usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let fresh = text.get(*seen..).unwrap_or("").to_string();
    *seen = text.len();
    fresh
        .lines()
        .filter(|l| {
            [
                "basic authentication",
                "was not found in",
                "password mismatch",
                "open()",
                "pread()",
                "access forbidden",
            ]
            .iter()
            .any(|k| l.contains(k))
        })
        .map(|l| {
            let level = l.split(' ').nth(2).unwrap_or("").to_string();
            let msg = l.split_once(": *").map_or(l, |(_, m)| m);
            let msg = msg.split_once(' ').map_or(msg, |(_, m)| m);
            format!("{} {}", level, msg)
        })
        .collect()
}

#[test]
fn auth_basic_same_as_nginx() {
    if !nginx_installed() {
        return;
    }
    let pn = Prefix::new();
    files(&pn);
    let nport = free_port();
    let nconf = CONF.replace("@CONF@", &pn.path("conf").display().to_string());
    let Some(nginx) = start_nginx(&pn, &nconf, nport) else {
        panic!("nginx did not start");
    };
    let pt = Prefix::new();
    files(&pt);
    let tconf = CONF.replace("@CONF@", &pt.path("conf").display().to_string());
    let tern = Server::start_in(pt, &tconf);
    let nlog = pn.path("logs/error.log");
    let tlog = tern.prefix.path("logs/error.log");
    let (mut nseen, mut tseen) = (0, 0);
    let mut reqs = corpus();
    // Last, a request nginx logs a line for (a 404 where auth is off): a
    // line tern logged late for the request before it shows up here, not
    // after the loop.
    reqs.push(
        "GET /open/no-such-file HTTP/1.1\r\nHost: auth.test\r\nConnection: close\r\n\r\n".into(),
    );
    let mut diffs = Vec::new();
    for r in &reqs {
        let a = normalize(&exchange(nport, r.as_bytes()), nport);
        let b = normalize(&exchange(tern.port, r.as_bytes()), tern.port);
        let mut la = new_lines(&nlog, &mut nseen);
        // tern's error-log lines are written by a writer thread: wait
        // (bounded) until as many as nginx wrote have arrived; late extra
        // ones show up under the next request and fail it.
        let mut lb = new_lines(&tlog, &mut tseen);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while lb.len() < la.len() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            lb.extend(new_lines(&tlog, &mut tseen));
        }
        // The prefixes differ: compare what follows them.
        for l in la.iter_mut() {
            *l = l.replace(&pn.dir.display().to_string(), "PREFIX");
        }
        for l in lb.iter_mut() {
            *l = l.replace(&tern.prefix.dir.display().to_string(), "PREFIX");
        }
        if a != b || la != lb {
            diffs.push(format!(
                "=== request {:?}\n--- nginx\n{}\n{:?}\n--- tern\n{}\n{:?}\n",
                r, a, la, b, lb
            ));
        }
    }
    // Two Authorization headers: 400 from both (nginx also runs the
    // server's add_header on such an early 400, which tern does not yet).
    let good = format!("Basic {}", basic("md5", "pw1"));
    let twice = format!(
        "GET /f.txt HTTP/1.1\r\nHost: auth.test\r\nConnection: close\r\nAuthorization: {}\r\nAuthorization: {}\r\n\r\n",
        good, good
    );
    for port in [nport, tern.port] {
        let r = exchange(port, twice.as_bytes());
        assert!(
            r.starts_with(b"HTTP/1.1 400 "),
            "{}",
            String::from_utf8_lossy(&r)
        );
    }
    drop(nginx);
    if !diffs.is_empty() {
        let mut f = std::fs::File::create(std::env::temp_dir().join("tern-auth-differential.txt"))
            .expect("report");
        for d in &diffs {
            let _ = f.write_all(d.as_bytes());
        }
        panic!(
            "{} of {} exchanges differ from nginx:\n{}",
            diffs.len(),
            reqs.len(),
            diffs.iter().take(6).cloned().collect::<String>()
        );
    }
    eprintln!("{} requests, all identical to nginx", reqs.len());
}

/// `auth_delay`: a refused password is answered only after the delay (a
/// lower bound, which load cannot break); an accepted one is answered.
/// The client waits up to a minute for each answer: on a loaded machine
/// the 1.5 s hold plus a stall once passed `exchange`'s 10 s and the 401
/// read as an empty answer.
#[test]
fn auth_delay_holds_back_401() {
    let patience = std::time::Duration::from_secs(60);
    let p = Prefix::new();
    p.write("conf/htpasswd", "user:{PLAIN}good\n");
    p.write("html/d/f.txt", "delayed file\n");
    let s = Server::start_in(
        p,
        "events {}\nhttp {\n access_log off;\n server {\n  listen 127.0.0.1:@PORT@;\n  root html;\n  auth_delay 1500ms;\n  location /d/ { auth_basic \"closed\"; auth_basic_user_file htpasswd; }\n }\n}\n",
    );
    let started = std::time::Instant::now();
    let bad = crate::differential::exchange_within(
        s.port,
        get("/d/f.txt", Some(&format!("Basic {}", basic("user", "bad")))).as_bytes(),
        patience,
    );
    let waited = started.elapsed();
    assert!(
        bad.starts_with(b"HTTP/1.1 401 "),
        "{}",
        String::from_utf8_lossy(&bad)
    );
    assert!(
        waited >= std::time::Duration::from_millis(1500),
        "{:?}",
        waited
    );
    let good = crate::differential::exchange_within(
        s.port,
        get(
            "/d/f.txt",
            Some(&format!("Basic {}", basic("user", "good"))),
        )
        .as_bytes(),
        patience,
    );
    assert!(
        good.starts_with(b"HTTP/1.1 200 ") && good.ends_with(b"delayed file\n"),
        "{}",
        String::from_utf8_lossy(&good)
    );
}
