//! Byte ranges on proxied responses, as nginx 1.22.1 answers on the same
//! configuration (an origin that always sends the whole 200 with
//! `Accept-Ranges: bytes`): a response passing through is not cut (the
//! Range header went upstream, which chose to ignore it); one being cached,
//! or under `proxy_force_ranges`, is cut to one range; a cache hit to any.
use crate::harness::*;
use crate::origin::Origin;

const BODY: &str = "0123456789abcdefghij";

fn origin() -> Origin {
    Origin::start(|_| {
        Some(Origin::ok(
            BODY,
            "Accept-Ranges: bytes\r\nX-Up: 1\r\nConnection: close\r\n",
        ))
    })
}

fn get(s: &Server, path: &str, range: &str) -> Resp {
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: localhost\r\nRange: {}\r\nConnection: close\r\n\r\n",
        path, range
    );
    Resp::parse(&s.raw(req.as_bytes())).expect("a response")
}

fn start(o: &Origin) -> Server {
    let conf = format!(
        "http {{ proxy_cache_path cache keys_zone=z:1m;
          server {{ listen 127.0.0.1:@PORT@;
            location /plain/ {{ proxy_pass http://127.0.0.1:{p}/; }}
            location /force/ {{ proxy_pass http://127.0.0.1:{p}/; proxy_force_ranges on; }}
            location /cache/ {{ proxy_pass http://127.0.0.1:{p}/; proxy_cache z;
                proxy_cache_valid 200 1m; add_header X-C $upstream_cache_status; }}
        }} }}",
        p = o.port
    );
    Server::start(&conf)
}

/// The head after the status line, Date and Server dropped.
fn rest(r: &Resp) -> String {
    r.head_normalized()
        .split("\r\n")
        .skip(1)
        .filter(|l| !l.starts_with("Date: ") && !l.starts_with("Server: ") && !l.is_empty())
        .collect::<Vec<_>>()
        .join("|")
}

#[test]
fn passing_through_ignores_the_range() {
    let o = origin();
    let s = start(&o);
    for range in ["bytes=2-4", "bytes=0-1,4-5", "bytes=50-60"] {
        let r = get(&s, "/plain/f", range);
        assert_eq!(r.status, 200, "{}", range);
        assert_eq!(r.body, BODY.as_bytes());
        // Upstream's Accept-Ranges stays where it was.
        assert_eq!(
            rest(&r),
            "Content-Type: text/plain|Content-Length: 20|Connection: close|Accept-Ranges: bytes|X-Up: 1"
        );
    }
    // The Range header went upstream.
    assert!(o.requests()[0].contains("\r\nRange: bytes=2-4\r\n"));
}

#[test]
fn force_ranges_cuts_one_range() {
    let o = origin();
    let s = start(&o);
    let r = get(&s, "/force/f", "bytes=2-4");
    assert_eq!(r.status, 206);
    assert_eq!(r.body, b"234");
    assert_eq!(
        rest(&r),
        "Content-Type: text/plain|Content-Length: 3|Connection: close|X-Up: 1|Content-Range: bytes 2-4/20"
    );
    // Several ranges: the whole body, Accept-Ranges the range filter's own.
    let r = get(&s, "/force/f", "bytes=0-1,4-5");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, BODY.as_bytes());
    assert_eq!(
        rest(&r),
        "Content-Type: text/plain|Content-Length: 20|Connection: close|X-Up: 1|Accept-Ranges: bytes"
    );
    let r = get(&s, "/force/f", "bytes=50-60");
    assert_eq!(r.status, 416);
    assert_eq!(r.header("Content-Range"), Some("bytes */20"));
    assert_eq!(r.header("X-Up"), Some("1"));
}

#[test]
fn cached_responses_are_cut() {
    let o = origin();
    let s = start(&o);
    // Being cached: one range.
    let r = get(&s, "/cache/f", "bytes=2-4");
    assert_eq!((r.status, r.body.as_slice()), (206, &b"234"[..]));
    assert_eq!(
        rest(&r),
        "Content-Type: text/plain|Content-Length: 3|Connection: close|X-Up: 1|X-C: MISS|Content-Range: bytes 2-4/20"
    );
    let r = get(&s, "/cache/g", "bytes=0-1,4-5");
    assert_eq!((r.status, r.body.as_slice()), (200, BODY.as_bytes()));
    assert_eq!(r.header("X-C"), Some("MISS"));
    // From the cache: several ranges too.
    let r = get(&s, "/cache/f", "bytes=0-1,4-5");
    assert_eq!(r.status, 206);
    assert_eq!(r.header("X-C"), Some("HIT"));
    assert!(r
        .header("Content-Type")
        .is_some_and(|v| v.starts_with("multipart/byteranges; boundary=")));
    assert_eq!(o.count(), 2);
}

/// The same requests to the real nginx and to tern, in front of the same
/// origin: identical responses but for Date and Server (skipped when
/// nginx is not installed).
#[test]
fn same_answers_as_nginx() {
    if !nginx_installed() {
        return;
    }
    let o = origin();
    let conf = format!(
        "worker_processes 1; events {{}}
        http {{ access_log off; proxy_cache_path cache keys_zone=z:1m; proxy_temp_path temp;
          server {{ listen 127.0.0.1:@PORT@;
            location /plain/ {{ proxy_pass http://127.0.0.1:{p}/; }}
            location /force/ {{ proxy_pass http://127.0.0.1:{p}/; proxy_force_ranges on; }}
            location /cache/ {{ proxy_pass http://127.0.0.1:{p}/; proxy_cache z;
                proxy_cache_valid 200 1m; add_header X-C $upstream_cache_status; }}
            location /mr0/ {{ proxy_pass http://127.0.0.1:{p}/; proxy_force_ranges on; max_ranges 0; }}
        }} }}",
        p = o.port
    );
    let pn = Prefix::new();
    let nport = free_port();
    let Some(nginx) = start_nginx(&pn, &conf, nport) else {
        panic!("nginx did not start");
    };
    let tern = Server::start(&conf);
    // The error page names the server (and so its length differs); the
    // multipart boundary is a counter nginx also spends on temp files.
    let norm = |r: Resp| {
        let body = String::from_utf8_lossy(&r.body)
            .replace("nginx/1.22.1", "SERVER")
            .replace("tern/0.1.0", "SERVER");
        let mut head = rest(&r);
        if body.contains("<center>SERVER</center>") {
            head = head
                .split('|')
                .filter(|l| !l.starts_with("Content-Length: "))
                .collect::<Vec<_>>()
                .join("|");
        }
        (r.status, no_counter(&head), no_counter(&body))
    };
    let mut diffs = Vec::new();
    for path in ["/plain/f", "/force/f", "/cache/f", "/cache/f", "/mr0/f"] {
        for range in ["bytes=2-4", "bytes=0-1,4-5", "bytes=50-60", "bytes=-3"] {
            let req = format!(
                "GET {} HTTP/1.1\r\nHost: localhost\r\nRange: {}\r\nConnection: close\r\n\r\n",
                path, range
            );
            let Some(a) = Resp::parse(&raw(nport, req.as_bytes())) else {
                panic!("nginx did not answer: {}", pn.read("logs/error.log"));
            };
            let b = Resp::parse(&tern.raw(req.as_bytes())).expect("tern answers");
            let (a, b) = (norm(a), norm(b));
            if a != b {
                diffs.push(format!(
                    "{} {}:\n  nginx {:?}\n  tern  {:?}",
                    path, range, a, b
                ));
            }
        }
    }
    drop(nginx);
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

/// Replaces each run of 20 digits (a multipart boundary) with `B`.
fn no_counter(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if b.len() - i >= 20 && b[i..i + 20].iter().all(u8::is_ascii_digit) {
            out.push('B');
            i += 20;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}
