//! Start-up semantics that published configurations rely on, checked
//! against nginx's own answers: off_t sizes (`8G`), `ssl_protocols` given
//! twice (a site's line and an included options file), `resolver` and
//! `resolver_timeout` at every level, unknown variables, and the
//! `$request_id` / `$connection_time` variables.

use std::process::Command;

use crate::harness::*;

/// `nginx -t` on the same file, when nginx is installed: its stderr.
fn nginx_t(file: &std::path::Path) -> Option<String> {
    if !nginx_installed() {
        return None;
    }
    let o = Command::new(NGINX)
        .arg("-t")
        .arg("-c")
        .arg(file)
        .output()
        .expect("nginx -t");
    Some(String::from_utf8_lossy(&o.stderr).into_owned())
}

fn http(body: &str) -> String {
    format!(
        "events {{}}\npid /tmp/tern-conf-semantics.pid;\nhttp {{\n{}\n}}\n",
        body
    )
}

#[test]
fn accepted_as_nginx_accepts() {
    for body in [
        "client_max_body_size 8G; server { client_max_body_size 1g; }",
        "resolver 127.0.0.1 [::1]:5353 valid=30s ipv6=off; resolver_timeout 5s;",
        "server { resolver 127.0.0.1; resolver_timeout 5s; location / { resolver 127.0.0.2:53; resolver_timeout 1s; } }",
        "server { location / { return 200 \"$request_id $connection_time\"; } }",
    ] {
        let t = ConfTest::run(&http(body));
        assert_eq!(t.code, Some(0), "{}\n{}", body, t.stderr);
        if let Some(n) = nginx_t(&t.file) {
            assert!(n.contains("test is successful"), "nginx: {}\n{}", body, n);
        }
    }
}

#[test]
fn refused_in_nginx_words() {
    let cases = [
        (
            "client_max_body_size 8T;",
            "\"client_max_body_size\" directive invalid value",
        ),
        (
            "client_body_buffer_size 1g;",
            "\"client_body_buffer_size\" directive invalid value",
        ),
        (
            "resolver 127.0.0.1:99999;",
            "invalid port in resolver \"127.0.0.1:99999\"",
        ),
        (
            "resolver 127.0.0.1 valid=xx;",
            "invalid parameter: valid=xx",
        ),
        (
            "resolver 127.0.0.1 ipv6=maybe;",
            "invalid parameter: ipv6=maybe",
        ),
        (
            "resolver 127.0.0.1; resolver 127.0.0.2;",
            "\"resolver\" directive is duplicate",
        ),
        (
            "resolver_timeout 5s; resolver_timeout 5s;",
            "\"resolver_timeout\" directive is duplicate",
        ),
    ];
    for (body, msg) in cases {
        let t = ConfTest::run(&http(body));
        t.assert_says("emerg", msg, 4);
        if let Some(n) = nginx_t(&t.file) {
            let want = format!("{} in {}:4", msg, t.file.display());
            assert!(n.contains(&want), "nginx said {}\nwanted {}", n, want);
        }
    }
}

/// nginx names no place for an unknown variable (it finds out after the
/// whole file is read); tern names the first mention (DIFFERENCES.md).
#[test]
fn unknown_variable_names_its_first_mention() {
    let text = http("server {\n    location / {\n        return 200 \"$nosuch\";\n    }\n}");
    let t = ConfTest::run(&text);
    t.assert_says("emerg", "unknown \"nosuch\" variable", 6);
    if let Some(n) = nginx_t(&t.file) {
        assert!(n.contains("[emerg]"), "{}", n);
        assert!(n.contains("unknown \"nosuch\" variable"), "{}", n);
    }
}

/// certbot's options-ssl-nginx.conf sets `ssl_protocols` too: nginx adds
/// the names up and warns about the repeated ones.
#[test]
fn ssl_protocols_twice_adds_up_with_warnings() {
    let p = Prefix::new();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
    p.write("conf/c.pem", cert.cert.pem());
    p.write("conf/k.pem", cert.key_pair.serialize_pem());
    p.write(
        "conf/options-ssl-nginx.conf",
        "ssl_session_cache shared:le_nginx_SSL:10m;\nssl_session_timeout 1440m;\n\
         ssl_session_tickets off;\nssl_protocols TLSv1.2 TLSv1.3;\nssl_prefer_server_ciphers off;\n",
    );
    let conf = format!(
        "events {{}}\npid {dir}/logs/t.pid;\nhttp {{\n    server {{\n        listen 127.0.0.1:1 ssl;\n        \
         ssl_certificate {dir}/conf/c.pem;\n        ssl_certificate_key {dir}/conf/k.pem;\n        \
         ssl_protocols TLSv1.3;\n        include {dir}/conf/options-ssl-nginx.conf;\n    }}\n}}\n",
        dir = p.dir.display()
    );
    let file = p.write("conf/t.conf", &conf);
    let o = p.run(&["-t", "-c", file.to_str().unwrap_or("")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{}", err);
    let inc = p.path("conf/options-ssl-nginx.conf");
    let want = format!(
        "tern: [warn] duplicate value \"TLSv1.3\" in {}:4\n",
        inc.display()
    );
    assert!(err.contains(&want), "{}\nwanted {}", err, want);
    assert!(!err.contains("\"TLSv1.2\""), "{}", err);
    if let Some(n) = nginx_t(&file) {
        assert!(n.contains("[warn]"), "{}", n);
        assert!(
            n.contains(&format!(
                "duplicate value \"TLSv1.3\" in {}:4",
                inc.display()
            )),
            "{}",
            n
        );
        assert!(n.contains("test is successful"), "{}", n);
    }
}

#[test]
fn request_id_and_connection_time() {
    let tern = Server::start(
        "http { server { listen 127.0.0.1:@PORT@; location / { \
         return 200 \"$request_id $request_id $connection_time\"; } } }",
    );
    let mut ids = Vec::new();
    // Two requests on one connection, one on another.
    let mut c = tern.connect();
    for _ in 0..2 {
        use std::io::Write;
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        let r = read_response(&mut c).expect("response");
        ids.push(r.body_str());
    }
    ids.push(tern.get("/").body_str());
    let mut seen = Vec::new();
    for body in &ids {
        let parts: Vec<&str> = body.split(' ').collect();
        assert_eq!(parts.len(), 3, "{}", body);
        // 32 lowercase hex digits, the same twice within a request.
        assert_eq!(parts[0].len(), 32, "{}", body);
        assert!(parts[0]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(parts[0], parts[1]);
        seen.push(parts[0].to_string());
        // Seconds with milliseconds.
        let (s, ms) = parts[2].split_once('.').expect("a dot");
        assert!(
            !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()),
            "{}",
            body
        );
        assert!(
            ms.len() == 3 && ms.bytes().all(|b| b.is_ascii_digit()),
            "{}",
            body
        );
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 3, "{:?}", ids);
}

/// nginx warns at start when worker_connections exceed the descriptors
/// the workers will have (worker_rlimit_nofile here).
#[test]
fn worker_connections_over_the_descriptor_limit_are_warned() {
    let srv = Server::start(
        "worker_rlimit_nofile 1024;\nerror_log logs/error.log warn;\n\
         events { worker_connections 2000000; }\n\
         http { server { listen 127.0.0.1:@PORT@; location / { return 204; } } }\n",
    );
    let log =
        srv.wait_error_log("2000000 worker_connections exceed open file resource limit: 1024");
    assert!(log.contains("[warn] "), "{}", log);
}
