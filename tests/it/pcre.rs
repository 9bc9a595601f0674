//! PCRE2 patterns, side by side with nginx: the constructs the `regex`
//! crate refused (look-ahead, `\Q...\E`, back-references, possessive
//! quantifiers, atomic groups), named groups in both spellings, numbered
//! captures, `~*`, in every place nginx compiles a regex (location, `if`,
//! `rewrite`, `map`, `server_name`, `valid_referers`), and nginx's
//! `pcre2_compile() failed` messages for bad patterns.

use std::process::Command;

use crate::harness::*;

const CONF: &str = r#"
worker_processes 1;
events {}
http {
    access_log off;
    map $arg_m $mapped {
        default none;
        ~^(?P<first>\w+)-(?<second>\w+)$ "$second.$first";
        ~*^UP(\d)(\d)$ "up $2$1";
        "~^\Qa.b\E$" quoted;
    }
    server {
        listen 127.0.0.1:@PORT@;
        server_name ~^(?<sub>[a-z]+)\.rx\.test$ main.test;
        location ~* /\.(?!well-known/) { return 403 "dot $uri\n"; }
        location ~ ^/q/x\Q.*+\E$ { return 200 "quoted\n"; }
        location ~ ^/bref/(\w+)-\1$ { return 200 "bref $1\n"; }
        location ~ ^/poss/a++b { return 200 "poss\n"; }
        location ~ ^/poss/ { return 200 "poss fallback\n"; }
        location ~ ^/atomic/(?>a+)b$ { return 200 "atomic\n"; }
        location ~ ^/names/(?<one>\d+)/(?P<two>\d+)/(?'three'\d+)$ {
            return 200 "names $one $two $three $1 $2 $3\n";
        }
        location ~* ^/CASE/(.+)$ { return 200 "case $1\n"; }
        location ~ ^/nine/(.)(.)(.)(.)(.)(.)(.)(.)(.)(.)$ {
            return 200 "nine $9 $1 $10\n";
        }
        location /rw/ {
            rewrite ^/rw/(?<a>[^/]+)/(.*)$ /out?a=$a&b=$2 last;
            return 200 "rw none\n";
        }
        location /out { return 200 "out $args\n"; }
        location /if/ {
            if ($uri ~* ^/if/(?<w>[A-Z]+)(?=\d)) { return 200 "if $w $1\n"; }
            if ($uri !~ ^/if/x) { return 200 "if not x\n"; }
            return 200 "if none\n";
        }
        location /map { return 200 "map $mapped\n"; }
        location /ref {
            valid_referers ~^(?!evil\.)[a-z]+\.example/;
            if ($invalid_referer) { return 403 "bad ref\n"; }
            return 200 "good ref\n";
        }
        location / { return 200 "root $uri\n"; }
    }
}
"#;

fn corpus() -> Vec<String> {
    let mut reqs = Vec::new();
    for uri in [
        "/.git/config",
        "/.well-known/acme-challenge/x",
        "/a/.htaccess",
        "/q/x.*+",
        "/q/abc",
        "/bref/ab-ab",
        "/bref/ab-ac",
        "/poss/aaab",
        "/poss/aaa",
        "/atomic/aaab",
        "/names/1/22/333",
        "/case/Mixed",
        "/CaSe/x",
        "/nine/abcdefghij",
        "/rw/x/y/z",
        "/rw/",
        "/if/ABC1",
        "/if/xyz",
        "/if/abc",
        "/map?m=foo-bar",
        "/map?m=up12",
        "/map?m=a.b",
        "/map?m=axb",
        "/map",
    ] {
        reqs.push(format!(
            "GET {} HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n",
            uri
        ));
    }
    for referer in [
        "http://www.example/x",
        "https://evil.example/x",
        "http://WWW.EXAMPLE/x",
    ] {
        reqs.push(format!(
            "GET /ref HTTP/1.1\r\nHost: main.test\r\nReferer: {}\r\nConnection: close\r\n\r\n",
            referer
        ));
    }
    reqs
}

fn normalize(resp: &[u8]) -> String {
    blank_date_server(&String::from_utf8_lossy(resp))
}

#[test]
fn pcre_constructs_same_as_nginx() {
    if !nginx_installed() {
        return;
    }
    let pn = Prefix::new();
    let nport = free_port();
    let Some(_nginx) = start_nginx(&pn, CONF, nport) else {
        panic!("nginx did not start");
    };
    let tern = Server::start(CONF);
    let mut diffs = Vec::new();
    for r in corpus() {
        let a = normalize(&raw(nport, r.as_bytes()));
        let b = normalize(&tern.raw(r.as_bytes()));
        if a != b {
            diffs.push(format!("{}\nnginx:\n{}\ntern:\n{}", r, a, b));
        }
    }
    assert!(diffs.is_empty(), "{}", diffs.join("\n----\n"));
}

/// The answers themselves, so that the test means something without nginx.
#[test]
fn pcre_constructs_answers() {
    let tern = Server::start(CONF);
    let body = |uri: &str| tern.get(uri).body_str();
    assert_eq!(body("/.git/config"), "dot /.git/config\n");
    assert_eq!(
        body("/.well-known/acme-challenge/x"),
        "root /.well-known/acme-challenge/x\n"
    );
    assert_eq!(body("/q/x.*+"), "quoted\n");
    assert_eq!(body("/bref/ab-ab"), "bref ab\n");
    assert_eq!(body("/bref/ab-ac"), "root /bref/ab-ac\n");
    assert_eq!(body("/poss/aaab"), "poss\n");
    assert_eq!(body("/names/1/22/333"), "names 1 22 333 1 22 333\n");
    assert_eq!(body("/case/Mixed"), "case Mixed\n");
    // `$10` is `$1` then "0", as in nginx.
    assert_eq!(body("/nine/abcdefghij"), "nine i a a0\n");
    assert_eq!(body("/rw/x/y/z"), "out a=x&b=y/z\n");
    assert_eq!(body("/if/ABC1"), "if ABC ABC\n");
    assert_eq!(body("/map?m=foo-bar"), "map bar.foo\n");
    assert_eq!(body("/map?m=up12"), "map up 21\n");
    assert_eq!(body("/map?m=a.b"), "map quoted\n");
    assert_eq!(body("/map?m=axb"), "map none\n");
}

/// `pcre2_compile() failed: ...` with the place, worded as nginx's.
#[test]
fn bad_patterns_worded_as_nginx() {
    let cases = [
        (
            "location ~ (foo { return 200; }",
            "pcre2_compile() failed: missing closing parenthesis in \"(foo\"",
        ),
        (
            "location ~ [z-a] { return 200; }",
            "pcre2_compile() failed: range out of order in character class in \"[z-a]\" at \"a]\"",
        ),
        (
            "if ($uri ~ \"*a\") { return 200; }",
            "pcre2_compile() failed: quantifier does not follow a repeatable item in \"*a\" at \"*a\"",
        ),
        (
            "rewrite (?<n>a)(?<n>b) /x;",
            "pcre2_compile() failed: two named subpatterns have the same name (PCRE2_DUPNAMES not set) in \"(?<n>a)(?<n>b)\" at \"b)\"",
        ),
        (
            "server_name ~(?P<x;",
            "pcre2_compile() failed: syntax error in subpattern name (missing terminator?) in \"(?P<x\"",
        ),
    ];
    for (directive, msg) in cases {
        let text = format!(
            "events {{}}\nhttp {{\n    server {{\n        {}\n    }}\n}}\n",
            directive
        );
        let t = ConfTest::run(&text);
        t.assert_says("emerg", msg, 4);
        if nginx_installed() {
            let o = Command::new(NGINX)
                .arg("-t")
                .arg("-c")
                .arg(&t.file)
                .output()
                .expect("nginx -t");
            let err = String::from_utf8_lossy(&o.stderr);
            let want = format!("{} in {}:4", msg, t.file.display());
            assert!(err.contains(&want), "nginx said {}\nwanted {}", err, want);
        }
    }
}
