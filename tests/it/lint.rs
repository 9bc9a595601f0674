//! `tern -t` warns, with `file:line`, about configurations that nginx
//! accepts but that are known to be exploitable (src/core/lint.rs); the
//! exit status stays 0, and `-q` or `config_lint off;` silences them. A
//! server started on such a configuration logs the same lines.

use crate::harness::{free_port, Prefix, Server};

const RISKY: &str = "events {}
http {
    add_header X-Frame-Options DENY;
    server {
        listen 127.0.0.1:@PORT@;
        server_tokens off;
        location /static { alias /srv/static/; }
        location /a { add_header X-A 1; }
        location /p { proxy_pass http://127.0.0.1:1; proxy_set_header Host $http_host; }
        location ~ ^/u/([^/]+)$ { return 302 https://$host/v/$1; }
        location /r { valid_referers none *.example.com; }
        location /o { if ($http_origin ~* example.com) { return 204; } }
        location /m { return https://$http_host/; }
    }
    map $http_origin $cors { ~example.com 1; }
}
";

fn stderr_of(p: &Prefix, args: &[&str]) -> (bool, Vec<String>) {
    let out = p.run(args);
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    (
        out.status.success(),
        text.lines().map(str::to_string).collect(),
    )
}

#[test]
fn test_mode_names_each_risk_with_its_line() {
    let p = Prefix::new();
    let conf = p.write(
        "conf/nginx.conf",
        RISKY.replace("@PORT@", &free_port().to_string()),
    );
    let conf = conf.to_string_lossy().into_owned();
    let (ok, lines) = stderr_of(&p, &["-t", "-c", &conf]);
    assert!(ok, "-t must still succeed: {lines:#?}");
    let warns: Vec<&String> = lines.iter().filter(|l| l.contains("[warn]")).collect();
    let expect = [
        ("possible path traversal", 7),
        ("\"add_header\" here replaces", 8),
        ("\"$http_host\" in \"proxy_set_header\"", 9),
        ("possible HTTP response splitting: \"$1\"", 10),
        ("\"valid_referers none\"", 11),
        ("checking \"$http_origin\" is not anchored", 12),
        ("\"$http_host\" in \"return\"", 13),
        ("\"map\" regex \"example.com\" for \"$http_origin\"", 15),
    ];
    assert_eq!(warns.len(), expect.len(), "{warns:#?}");
    for (w, (what, line)) in warns.iter().zip(expect) {
        assert!(w.starts_with("tern: [warn] "), "{w}");
        assert!(w.contains(what), "expected {what:?} in {w}");
        assert!(
            w.ends_with(&format!(" in {conf}:{line}")),
            "expected line {line}: {w}"
        );
    }
    assert!(lines
        .last()
        .is_some_and(|l| l.ends_with("test is successful")));

    // -q: nothing but errors.
    let (ok, lines) = stderr_of(&p, &["-t", "-q", "-c", &conf]);
    assert!(ok && lines.is_empty(), "{lines:#?}");

    // config_lint off: the usual two lines only.
    p.write(
        "conf/nginx.conf",
        format!("config_lint off;\n{}", RISKY.replace("@PORT@", "1")),
    );
    let (ok, lines) = stderr_of(&p, &["-t", "-c", &conf]);
    assert!(ok && lines.len() == 2, "{lines:#?}");
}

#[test]
fn a_bad_switch_is_refused_as_nginx_refuses_a_flag() {
    let p = Prefix::new();
    let conf = p.write("conf/nginx.conf", "config_lint maybe;\nevents {}\n");
    let conf = conf.to_string_lossy().into_owned();
    let (ok, lines) = stderr_of(&p, &["-t", "-c", &conf]);
    assert!(!ok);
    assert!(
        lines[0].contains(&format!(
            "invalid value \"maybe\" in \"config_lint\" directive, it must be \"on\" or \"off\" in {conf}:1"
        )),
        "{lines:#?}"
    );
}

#[test]
fn a_started_server_logs_the_warnings() {
    // nginx logs at `error` by default; warnings need `warn`.
    let s = Server::start(&format!("error_log logs/error.log warn;\n{RISKY}"));
    let log = s.wait_error_log("possible path traversal");
    assert!(log.contains("[warn]"), "{log}");
    assert!(log.contains("possible path traversal"), "{log}");
    assert!(log.contains("nginx.conf:8"), "{log}");
}
