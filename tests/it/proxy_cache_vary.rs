//! The cache's Vary variants, the `stale-while-revalidate` and
//! `stale-if-error` Cache-Control extensions, and errors remembered by
//! the cache (an intercepted error, or a failed upstream's 502/504), each
//! run on tern and, when installed, on the real nginx with the same
//! configuration ([`both`]), with exact expectations on tern's answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::{raw, Prefix, Resp, Server, SIGTERM};
use crate::origin::Origin;
use crate::proxy_cache_stale::{ask, both};

/// Status, `$upstream_cache_status` and body of a GET with `extra`
/// header lines.
fn ask_h(port: u16, path: &str, extra: &str) -> (u16, String, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n");
    let got = raw(port, req.as_bytes());
    let r = Resp::parse(&got)
        .unwrap_or_else(|| panic!("no response to {path}: {:?}", String::from_utf8_lossy(&got)));
    let body = r.body_str();
    let body = if body.contains("<html>") {
        "(error page)".to_string()
    } else {
        body
    };
    (r.status, r.header("X-C").unwrap_or("-").to_string(), body)
}

fn line(what: &str, (s, x, b): (u16, String, String)) -> String {
    format!("{what} => {s} {x} {b}")
}

/// A front on @PORT@ caching what a backend server in the same
/// configuration answers with `Vary: Accept-Encoding` (echoing the
/// header), `Vary: *`, or no Vary when asked with `?novary=1`.
fn vary_conf(backend: u16) -> String {
    vary_conf_with(backend, "")
}

/// [`vary_conf`] with more of the front server (`proxy_cache_purge`,
/// which the reference nginx lacks).
fn vary_conf_with(backend: u16, more: &str) -> String {
    format!(
        "http {{ access_log off;\n\
         proxy_cache_path cache levels=1:2 keys_zone=z:1m;\n\
         map $arg_novary $vary_h {{ \"\" Accept-Encoding; default \"\"; }}\n\
         server {{ listen 127.0.0.1:{backend};\n\
           location / {{ add_header Vary $vary_h; return 200 \"v $http_accept_encoding\"; }}\n\
           location /star {{ add_header Vary \"*\"; return 200 \"star\"; }}\n\
         }}\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           proxy_cache z; proxy_cache_key $uri; proxy_cache_valid 200 1m;\n\
           add_header X-C $upstream_cache_status always;\n\
           location / {{ proxy_pass http://127.0.0.1:{backend}; }}\n\
           location /r {{ proxy_pass http://127.0.0.1:{backend}; proxy_cache_valid 200 1s; }}\n\
           location /ign/ {{ proxy_pass http://127.0.0.1:{backend}/; proxy_ignore_headers Vary; }}\n\
           {more}\n\
         }}\n\
         }}\n"
    )
}

fn ae(v: &str) -> String {
    format!("Accept-Encoding: {v}\r\n")
}

/// One entry per variant: a request whose Vary'd headers match (after
/// whitespace normalisation only) is a HIT of its own variant; `Vary: *`
/// is never cached; with Vary ignored one entry serves all; a response
/// without Vary replaces the variants.
#[test]
fn vary_keeps_a_variant_per_request_header_value_as_nginx() {
    let backend = crate::harness::free_port();
    let ours = both(&vary_conf(backend), |port| {
        let mut out = Vec::new();
        for (path, h) in [
            ("/v", "gzip"),
            ("/v", "gzip"),
            ("/v", "deflate"),
            ("/v", "deflate"),
            ("/v", "gzip"),
            ("/w", "foo, bar"),
            ("/w", "foo,bar"),
            ("/w", "foo,,  ,bar , "),
            ("/w", "foobar"),
            ("/w", "bar,foo"),
            ("/star", "gzip"),
            ("/star", "gzip"),
            ("/ign/v", "gzip"),
            ("/ign/v", "deflate"),
            ("/r", "gzip"),
            ("/r", "deflate"),
        ] {
            out.push(line(&format!("{path} {h:?}"), ask_h(port, path, &ae(h))));
        }
        out.push(line("/w none", ask_h(port, "/w", "")));
        out.push(line("/w none", ask_h(port, "/w", "")));
        // Expired: a response without Vary (asked by the second variant)
        // replaces the main entry, and serves the first variant too.
        std::thread::sleep(Duration::from_millis(2100));
        out.push(line(
            "/r?novary deflate",
            ask_h(port, "/r?novary=1", &ae("deflate")),
        ));
        out.push(line("/r gzip", ask_h(port, "/r", &ae("gzip"))));
        out
    });
    assert_eq!(
        ours.join("\n"),
        [
            "/v \"gzip\" => 200 MISS v gzip",
            "/v \"gzip\" => 200 HIT v gzip",
            "/v \"deflate\" => 200 MISS v deflate",
            "/v \"deflate\" => 200 HIT v deflate",
            "/v \"gzip\" => 200 HIT v gzip",
            "/w \"foo, bar\" => 200 MISS v foo, bar",
            "/w \"foo,bar\" => 200 HIT v foo, bar",
            "/w \"foo,,  ,bar , \" => 200 HIT v foo, bar",
            "/w \"foobar\" => 200 MISS v foobar",
            "/w \"bar,foo\" => 200 MISS v bar,foo",
            "/star \"gzip\" => 200 MISS star",
            "/star \"gzip\" => 200 MISS star",
            "/ign/v \"gzip\" => 200 MISS v gzip",
            "/ign/v \"deflate\" => 200 HIT v gzip",
            "/r \"gzip\" => 200 MISS v gzip",
            "/r \"deflate\" => 200 MISS v deflate",
            "/w none => 200 MISS v ",
            "/w none => 200 HIT v ",
            "/r?novary deflate => 200 EXPIRED v deflate",
            "/r gzip => 200 HIT v deflate",
        ]
        .join("\n")
    );
}

/// Variants are files of their own, named by their variant hash: the
/// loader keeps them across a restart, and both are hits after it.
#[test]
fn variants_survive_a_restart() {
    let backend = crate::harness::free_port();
    let c = vary_conf(backend);
    let mut s = Server::start(&c);
    assert_eq!(ask_h(s.port, "/v", &ae("gzip")).1, "MISS");
    assert_eq!(ask_h(s.port, "/v", &ae("deflate")).1, "MISS");
    s.signal(SIGTERM);
    assert!(
        s.wait_exit(Duration::from_secs(5)).is_some(),
        "tern did not stop"
    );
    let prefix: Prefix = std::mem::take(&mut s.prefix);
    let s = Server::start_in(prefix, &c);
    assert_eq!(
        ask_h(s.port, "/v", &ae("deflate")),
        (200, "HIT".into(), "v deflate".into())
    );
    assert_eq!(
        ask_h(s.port, "/v", &ae("gzip")),
        (200, "HIT".into(), "v gzip".into())
    );
    assert!(!s.error_log().contains("[crit]"), "{}", s.error_log());
}

/// An origin that counts requests per path, query left out (reset by [`Counted::reset`]
/// so that tern's and nginx's runs see the same answers) and answers
/// with `f(path, n)`: Some(head and body), or None to close unanswered.
struct Counted {
    origin: Origin,
    seen: Arc<Mutex<HashMap<String, usize>>>,
}

impl Counted {
    fn start(f: fn(&str, usize) -> Option<String>) -> Counted {
        let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let s2 = seen.clone();
        let origin = Origin::start(move |h| {
            let target = h.split(' ').nth(1).unwrap_or("");
            let path = target.split('?').next().unwrap_or("").to_string();
            let n = {
                let mut m = s2.lock().unwrap();
                let e = m.entry(path.clone()).or_insert(0);
                *e += 1;
                *e - 1
            };
            Some(f(&path, n).map(String::into_bytes).unwrap_or_default())
        });
        Counted { origin, seen }
    }

    fn reset(&self) {
        self.seen.lock().unwrap().clear();
    }
}

fn ok(body: &str, extra: &str) -> Option<String> {
    Some(format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
        body.len()
    ))
}

/// `Cache-Control: stale-while-revalidate` opens a window after expiry
/// in which the entry is served STALE while a background update (with
/// `proxy_cache_background_update`) refreshes it; the client's
/// connection ends once the update is in, so the next request is a HIT
/// of the new answer. Without background updates the request refreshes
/// it itself. `stale-if-error` serves the entry when the refresh fails.
/// (`/fg` asks the origin for `/swr?fg`: the default key is the upstream
/// URI, so the query keeps its entry apart.)
#[test]
fn stale_while_revalidate_and_stale_if_error_as_nginx() {
    let o = Counted::start(|path, n| match (path, n) {
        ("/swr", n) => ok(
            &format!("swr{n}"),
            "Cache-Control: max-age=1, stale-while-revalidate=30\r\n",
        ),
        ("/sie", 0) => ok("sie0", "Cache-Control: max-age=1, stale-if-error=30\r\n"),
        ("/plain", 0) => ok("plain0", "Cache-Control: max-age=1\r\n"),
        _ => None,
    });
    let port = o.origin.port;
    let body = format!(
        "http {{ access_log off;\n\
         proxy_cache_path cache keys_zone=z:1m;\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           proxy_cache z; add_header X-C $upstream_cache_status always;\n\
           location / {{ proxy_pass http://127.0.0.1:{port}; proxy_cache_background_update on; }}\n\
           location /fg {{ proxy_pass http://127.0.0.1:{port}/swr?fg; }}\n\
         }}\n\
         }}\n"
    );
    let ours = both(&body, |p| {
        o.reset();
        let mut out = Vec::new();
        for path in ["/swr", "/fg", "/sie", "/plain"] {
            out.push(line(path, ask(p, path)));
        }
        std::thread::sleep(Duration::from_millis(2100));
        for path in ["/swr", "/swr", "/fg", "/sie", "/plain"] {
            out.push(line(path, ask(p, path)));
        }
        out
    });
    assert_eq!(
        ours.join("\n"),
        [
            "/swr => 200 MISS swr0",
            "/fg => 200 MISS swr1",
            "/sie => 200 MISS sie0",
            "/plain => 200 MISS plain0",
            "/swr => 200 STALE swr0",
            "/swr => 200 HIT swr2",
            "/fg => 200 EXPIRED swr3",
            "/sie => 200 STALE sie0",
            "/plain => 502 EXPIRED (error page)",
        ]
        .join("\n")
    );
}

/// An intercepted error that may be cached (`proxy_cache_valid 404`)
/// is remembered by the cache: the next request gets it (error_page
/// again) without asking the origin, until a bypass stores an answer.
#[test]
fn intercepted_errors_are_cached_as_nginx() {
    let o = Counted::start(|path, n| {
        match (path, n) {
        ("/e", 0) => Some(
            "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\nnf".into(),
        ),
        ("/e", n) => ok(&format!("ok{n}"), ""),
        ("/nc", 0) => Some(
            "HTTP/1.1 404 Not Found\r\nCache-Control: no-cache\r\nContent-Length: 2\r\nConnection: close\r\n\r\nnf".into(),
        ),
        ("/nc", n) => ok(&format!("ok{n}"), ""),
        _ => None,
    }
    });
    let port = o.origin.port;
    let body = format!(
        "http {{ access_log off;\n\
         proxy_cache_path cache keys_zone=z:1m;\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           add_header X-C $upstream_cache_status always;\n\
           location / {{ proxy_pass http://127.0.0.1:{port}; proxy_cache z;\n\
             proxy_cache_key $uri; proxy_cache_valid 200 404 1m;\n\
             proxy_cache_bypass $arg_b;\n\
             proxy_ignore_headers Expires; proxy_ignore_headers X-Accel-Expires;\n\
             proxy_intercept_errors on; error_page 404 = @fb; }}\n\
           location @fb {{ return 403; }}\n\
         }}\n\
         }}\n"
    );
    let ours = both(&body, |p| {
        o.reset();
        let mut out = Vec::new();
        for path in ["/e", "/e", "/e?b=1", "/e", "/nc", "/nc"] {
            out.push(line(path, ask(p, path)));
        }
        out
    });
    assert_eq!(
        ours.join("\n"),
        [
            "/e => 403 MISS (error page)",
            "/e => 403 HIT (error page)",
            "/e?b=1 => 200 BYPASS ok1",
            "/e => 200 HIT ok1",
            "/nc => 403 MISS (error page)",
            "/nc => 200 MISS ok1",
        ]
        .join("\n")
    );
}

/// An intercepted 401 keeps every WWW-Authenticate line of the upstream
/// for the page error_page makes (nginx from 1.23 on; 1.22 keeps the
/// first: DIFFERENCES.md).
#[test]
fn intercepted_401_keeps_every_challenge() {
    let o = Origin::start(|_| {
        Some(
            b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: foo\r\nWWW-Authenticate: bar\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                .to_vec(),
        )
    });
    let s = Server::start(&format!(
        "http {{ access_log off;\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ proxy_pass http://127.0.0.1:{}; proxy_intercept_errors on;\n\
             error_page 401 /denied; }}\n\
           location = /denied {{ return 200 \"denied\\n\"; }}\n\
         }}\n\
         }}\n",
        o.port
    ));
    let got = String::from_utf8_lossy(&raw(
        s.port,
        b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ))
    .into_owned();
    let head_body: Vec<&str> = got.split("\r\n").collect();
    assert_eq!(head_body[0], "HTTP/1.1 401 Unauthorized", "{got}");
    let challenges: Vec<&&str> = head_body
        .iter()
        .filter(|l| l.starts_with("WWW-Authenticate:"))
        .collect();
    assert_eq!(
        challenges,
        [&"WWW-Authenticate: foo", &"WWW-Authenticate: bar"],
        "{got}"
    );
    assert!(got.ends_with("\r\n\r\ndenied\n"), "{got}");
}

/// A purge of a key removes its Vary variants too (they live under
/// hashes of their own), whether stored by this run or found on disk
/// after a restart: none is served again.
#[test]
fn purge_removes_every_variant() {
    let backend = crate::harness::free_port();
    let c = vary_conf_with(
        backend,
        "location ~ ^/purge(/.*) { proxy_cache_purge z $1; }",
    );
    let mut s = Server::start(&c);
    let fill = |port: u16| {
        for h in ["gzip", "deflate", "br"] {
            assert_eq!(ask_h(port, "/v", &ae(h)).1, "MISS");
            assert_eq!(ask_h(port, "/v", &ae(h)).1, "HIT");
        }
    };
    let purged = |port: u16| {
        assert_eq!(ask(port, "/purge/v").0, 200);
        assert_eq!(ask(port, "/purge/v").0, 404);
        for h in ["br", "deflate", "gzip"] {
            assert_eq!(
                ask_h(port, "/v", &ae(h)),
                (200, "MISS".into(), format!("v {h}"))
            );
        }
    };
    fill(s.port);
    purged(s.port);
    // The variants, stored again by those misses, found on disk by a new
    // run.
    s.signal(SIGTERM);
    assert!(
        s.wait_exit(Duration::from_secs(5)).is_some(),
        "tern did not stop"
    );
    let prefix: Prefix = std::mem::take(&mut s.prefix);
    let s = Server::start_in(prefix, &c);
    for h in ["gzip", "deflate", "br"] {
        assert_eq!(
            ask_h(s.port, "/v", &ae(h)),
            (200, "HIT".into(), format!("v {h}"))
        );
    }
    purged(s.port);
    assert!(!s.error_log().contains("[crit]"), "{}", s.error_log());
}
