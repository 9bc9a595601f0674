//! `map` and `split_clients`: lookups, precedence, captures, hashing and
//! configuration errors. Expected values were taken from nginx 1.22.1 on
//! the same configuration.
use crate::harness::*;

fn body(s: &Server, path: &str, host: &str) -> String {
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        path, host
    );
    let r = Resp::parse(&s.raw(req.as_bytes())).expect("a response");
    assert_eq!(r.status, 200, "{} {}", path, host);
    r.body_str()
}

const MAPS: &str = r#"
http {
  map $arg_k $m1 {
    default d;
    Abc exact;
    ~^x(\d+)y(?<nm>.*)$ "re1 $1 [$2] $nm $arg_z";
    ~*^X re2;
    "" empty;
    volatile;
    \default bs;
    \~lit tilde;
  }
  map $arg_k $m2 { ~^(a)(b)? "[$1|$2]"; ~^q "q$1"; }
  map $arg_k$arg_q $two { default no; xy yes; }
  map $m1 $chain { default c; exact chained; }
  map $http_host $h {
    hostnames;
    default none;
    exact.com exact;
    .example.com dot;
    *.sub.example.com star;
    www.* tail;
    www.example.* tail2;
    ~^(r)e(g) "regex $1$2";
  }
  server {
    listen 127.0.0.1:@PORT@;
    location /m { return 200 "$m1|$chain|$two"; }
    location /m2 { return 200 "$m2"; }
    location /h { return 200 "$h"; }
    location ~ ^/c(.*)$ { return 200 "$1 $m2"; }
  }
}"#;

#[test]
fn map_exact_regex_default_and_escapes() {
    let s = Server::start(MAPS);
    let cases = [
        ("abc", "exact|chained|no"),
        // Exact keys compare case-insensitively.
        ("ABC", "exact|chained|no"),
        ("x12yfoo", "re1 12 [foo] foo Z|c|no"),
        ("X1", "re2|c|no"),
        ("", "empty|c|no"),
        ("default", "bs|c|no"),
        ("~lit", "tilde|c|no"),
        ("zz", "d|c|no"),
        // `volatile;` is a flag, not a key.
        ("volatile", "d|c|no"),
    ];
    for (k, want) in cases {
        assert_eq!(body(&s, &format!("/m?k={}&z=Z", k), "x"), want, "k={}", k);
    }
    // The source may be several variables.
    assert_eq!(body(&s, "/m?k=x&q=y", "x"), "re2|c|yes");
    // Without the argument the source is empty: the "" key.
    assert_eq!(body(&s, "/m", "x"), "empty|c|no");
}

#[test]
fn map_regex_captures_in_values() {
    let s = Server::start(MAPS);
    assert_eq!(body(&s, "/m2?k=ab", "x"), "[a|b]");
    assert_eq!(body(&s, "/m2?k=a", "x"), "[a|]");
    // A match without groups leaves `$1` empty.
    assert_eq!(body(&s, "/m2?k=q", "x"), "q");
    // No entry and no default: empty.
    assert_eq!(body(&s, "/m2?k=zz", "x"), "");
    // Without a map match, `$1` is still the location's capture.
    assert_eq!(body(&s, "/cQQ?k=zz", "x"), "QQ ");
}

#[test]
fn map_hostnames_precedence() {
    let s = Server::start(MAPS);
    let cases = [
        ("exact.com", "exact"),
        ("EXACT.COM", "exact"),
        ("example.com", "dot"),
        // A trailing dot of the value is ignored with `hostnames`.
        ("EXAMPLE.com.", "dot"),
        ("x.example.com", "dot"),
        ("sub.example.com", "dot"),
        // The longest leading wildcard wins.
        ("a.b.sub.example.com", "star"),
        // Leading wildcards come before trailing ones.
        ("www.example.com", "dot"),
        ("www.example.org", "tail2"),
        ("www.foo", "tail"),
        // `www.example.*` needs something after the dot; `www.*` matches.
        ("www.example", "tail"),
        ("www", "none"),
        ("reg", "regex rg"),
        ("x.reg", "none"),
        ("example.org", "none"),
    ];
    for (host, want) in cases {
        assert_eq!(body(&s, "/h", host), want, "host {}", host);
    }
}

#[test]
fn map_include_of_entries() {
    let p = Prefix::new();
    p.write("conf/entries.map", "a one;\nb two;\n");
    let s = Server::start_in(
        p,
        "http { map $arg_k $v { include entries.map; default zero; }
         server { listen 127.0.0.1:@PORT@; location / { return 200 \"$v\"; } } }",
    );
    assert_eq!(body(&s, "/?k=a", "x"), "one");
    assert_eq!(body(&s, "/?k=b", "x"), "two");
    assert_eq!(body(&s, "/?k=c", "x"), "zero");
}

/// `tern -t` on an http block; returns stderr.
fn test_conf(http: &str) -> String {
    let p = Prefix::new();
    let conf = p.write(
        "conf/nginx.conf",
        format!("events {{}}\nhttp {{\n{}\n}}\n", http),
    );
    let out = p.run(&["-t", "-c", conf.to_str().unwrap_or("")]);
    assert!(!out.status.success(), "accepted: {}", http);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn map_errors_are_worded_as_nginx() {
    let cases = [
        (
            "map $uri $a {\na 1;\nA 2;\n}",
            "conflicting parameter \"a\" in ",
            ":5",
        ),
        (
            "map $uri $a { default 1; default 2; }",
            "duplicate default map parameter in ",
            ":3",
        ),
        (
            "map $uri $a { a 1 2; }",
            "invalid number of the map parameters in ",
            ":3",
        ),
        (
            "map $uri a { a 1; }",
            "invalid variable name \"a\" in ",
            ":3",
        ),
        (
            "map $uri $a { hostnames; a*b 1; }",
            "invalid hostname or wildcard \"a*b\" in ",
            ":3",
        ),
        (
            "map $uri $a { hostnames; .a.com 1; *.a.com 2; }",
            "conflicting parameter \"*.a.com\" in ",
            ":3",
        ),
        (
            "map $uri $a { hostnames; a.com 1; .a.com 2; }",
            "conflicting parameter \".a.com\" in ",
            ":3",
        ),
        ("map $uri $a { a 1; x { } }", "unexpected \"{\" in ", ":3"),
        (
            "map $uri $uri { a 1; }",
            "the duplicate \"uri\" variable in ",
            ":3",
        ),
        (
            "map $uri $a { a $nosuch; }",
            "unknown \"nosuch\" variable",
            "",
        ),
        ("map $uri $a { ~( 1; }", "pcre2_compile() failed: ", ":3"),
    ];
    for (conf, msg, line) in cases {
        let err = test_conf(conf);
        assert!(
            err.contains(msg) && err.contains(line),
            "for {}: want {:?}..{:?}, got {}",
            conf,
            msg,
            line,
            err
        );
    }
}

const SPLIT: &str = r#"
http {
  split_clients "${arg_k}x" $sc { 10% a; 33.3% b; 0.01% c; * d; }
  split_clients "$arg_k" $sc2 { 50% a; 20.5% b; }
  server { listen 127.0.0.1:@PORT@; location / { return 200 "$sc,$sc2"; } }
}"#;

#[test]
fn split_clients_buckets_match_nginx() {
    let s = Server::start(SPLIT);
    // (key, $sc, $sc2) as nginx 1.22.1 answers.
    let want = [
        ("key1", "b", ""),
        ("key2", "d", "a"),
        ("key3", "b", "b"),
        ("key4", "d", ""),
        ("key5", "a", ""),
        ("key6", "a", "a"),
        ("key7", "b", "b"),
        ("key8", "b", ""),
        ("key9", "d", "b"),
        ("key10", "a", ""),
        ("key11", "b", "b"),
        ("key12", "d", "b"),
        ("alpha", "d", "a"),
        ("delta", "d", ""),
        ("127.0.0.1", "d", ""),
        ("10.0.0.1", "a", "b"),
        ("x", "b", "a"),
    ];
    for (k, a, b) in want {
        assert_eq!(
            body(&s, &format!("/?k={}", k), "x"),
            format!("{},{}", a, b),
            "key {}",
            k
        );
    }
}

#[test]
fn split_clients_errors_are_worded_as_nginx() {
    let cases = [
        (
            "split_clients $uri $a { 60% a; 50% b; }",
            "percent total is greater than 100% in ",
        ),
        (
            "split_clients $uri $a { * a; 1% b; }",
            "percent total is greater than 100% in ",
        ),
        (
            "split_clients $uri $a { 10 a; }",
            "invalid percent value \"10\" in ",
        ),
        (
            "split_clients $uri $a { 0% a; }",
            "invalid percent value \"0%\" in ",
        ),
        (
            "split_clients $uri $a { 10.555% a; }",
            "invalid percent value \"10.555%\" in ",
        ),
        (
            "split_clients $uri a { 1% a; }",
            "invalid variable name \"a\" in ",
        ),
    ];
    for (conf, msg) in cases {
        let err = test_conf(conf);
        assert!(
            err.contains(msg),
            "for {}: want {:?}, got {}",
            conf,
            msg,
            err
        );
    }
}

const SPLIT_LIVE: &str = r#"
worker_processes 1;
events {}
http {
  access_log off;
  split_clients "$http_x_key" $s1 { 0.5% a; 2% b; 10% c; 33.33% d; 50% e; }
  split_clients "x${uri}y" $s2 { 12.5% a; 12.5% b; 25% c; * d; }
  server { listen 127.0.0.1:@PORT@; location / { return 200 "$s1|$s2\n"; } }
}"#;

/// Hundreds of keys of every length and byte mix, bucketed by the real
/// nginx and by tern: the same answers (MurmurHash2 and the cumulative
/// bounds, remainders included).
#[test]
fn split_clients_buckets_equal_live_nginx() {
    if !nginx_installed() {
        return;
    }
    let pn = Prefix::new();
    let nport = free_port();
    let Some(nginx) = start_nginx(&pn, SPLIT_LIVE, nport) else {
        panic!("nginx did not start");
    };
    let tern = Server::start(SPLIT_LIVE);
    let mut diffs = Vec::new();
    let mut n = 0;
    for i in 0..300u32 {
        // Lengths 0..=12 (every tail of the 4-byte loop), bytes past ASCII.
        let key: String = (0..(i % 13))
            .map(|j| char::from(b"aZ09-_~.\xe9"[((i * 7 + j * 3) % 9) as usize]))
            .collect();
        let req = format!(
            "GET /u{}/{} HTTP/1.1\r\nHost: s\r\nX-Key: {}{}\r\nConnection: close\r\n\r\n",
            i % 17,
            i,
            key,
            i
        );
        let a = Resp::parse(&raw(nport, req.as_bytes())).map(|r| r.body_str());
        let b = Resp::parse(&raw(tern.port, req.as_bytes())).map(|r| r.body_str());
        n += 1;
        if a != b {
            diffs.push(format!("{:?}: nginx {:?} tern {:?}", req, a, b));
        }
    }
    drop(nginx);
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
    eprintln!("{} keys, same buckets as nginx", n);
}
