//! X-Accel-Redirect from a proxied answer: an internal redirect to the
//! URI (or named location) it gives, the method turned into GET, a few of
//! its headers kept, `..` refused; `proxy_ignore_headers
//! X-Accel-Redirect` relays the answer instead. Compared with nginx on
//! the same configuration where nginx is installed.
use crate::harness::*;

const CONF: &str = r#"
http {
    access_log off;
    server {
        listen 127.0.0.1:@PORT@;
        location /proxy { proxy_pass http://127.0.0.1:@PORT@/return-xar; }
        location /ignored {
            proxy_pass http://127.0.0.1:@PORT@/return-xar;
            proxy_ignore_headers X-Accel-Redirect;
        }
        location /return-xar {
            add_header X-Accel-Redirect $arg_xar;
            add_header Set-Cookie blah=blah;
            add_header Cache-Control no-cache;
            add_header Something other;
            return 204;
        }
        location /files/ { return 200 "file $uri args=$args method=$request_method\n"; }
        location @named { return 200 "named $uri\n"; }
    }
}
"#;

fn ask(port: u16, req: &str) -> String {
    String::from_utf8_lossy(&raw(port, req.as_bytes())).to_string()
}

fn cases(port: u16) -> Vec<String> {
    let reqs = [
        "GET /proxy?xar=/files/a?x=1 HTTP/1.0\r\n\r\n",
        "POST /proxy?xar=/files/b HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
        "GET /proxy?xar=/files/c%20d HTTP/1.0\r\n\r\n",
        "GET /proxy?xar=@named HTTP/1.0\r\n\r\n",
        "GET /proxy?xar=/files/../x HTTP/1.0\r\n\r\n",
        "GET /ignored?xar=/files/e HTTP/1.0\r\n\r\n",
    ];
    reqs.iter()
        .map(|r| {
            let a = ask(port, r);
            // Status line, the kept headers, the body.
            let mut out = a.lines().next().unwrap_or("").to_string();
            for h in [
                "Set-Cookie",
                "Cache-Control",
                "Something",
                "X-Accel-Redirect",
            ] {
                if let Some(l) = a.lines().find(|l| l.starts_with(&format!("{}:", h))) {
                    out.push_str(&format!(" | {}", l));
                }
            }
            // Bodies of 200s only (error pages name the server).
            if let Some(p) = a.find("\r\n\r\n").filter(|_| out.contains(" 200 ")) {
                out.push_str(&format!(" | {}", &a[p + 4..]));
            }
            out
        })
        .collect()
}

#[test]
fn x_accel_redirect_as_nginx() {
    let s = Server::start(CONF);
    let got = cases(s.port);
    assert!(got[0].starts_with("HTTP/1.1 200 OK"), "{:?}", got);
    assert!(got[0].contains("Set-Cookie: blah=blah"), "{:?}", got);
    assert!(got[0].contains("Cache-Control: no-cache"), "{:?}", got);
    assert!(!got[0].contains("Something"), "{:?}", got);
    assert!(
        got[0].ends_with("file /files/a args=x=1 method=GET\n"),
        "{:?}",
        got
    );
    assert!(
        got[1].ends_with("file /files/b args= method=GET\n"),
        "{:?}",
        got
    );
    assert!(
        got[2].ends_with("file /files/c d args= method=GET\n"),
        "{:?}",
        got
    );
    assert!(got[3].ends_with("named /proxy\n"), "{:?}", got);
    assert!(got[4].starts_with("HTTP/1.1 404"), "{:?}", got);
    assert!(got[5].starts_with("HTTP/1.1 204"), "{:?}", got);
    // Relayed, not followed (the header itself stays hidden, as nginx's
    // proxy_hide_header default).
    assert!(got[5].contains("Something: other"), "{:?}", got);
    if nginx_installed() {
        let p = Prefix::new();
        let port = free_port();
        let _n = start_nginx(&p, CONF, port).expect("nginx");
        assert_eq!(got, cases(port));
    }
}
