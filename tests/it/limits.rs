//! limit_conn and limit_req over real sockets.
//!
//! A request stays "in flight" while the server waits for its body: each
//! held connection sends a head with `Content-Length: 1` and no body, so
//! the request keeps its limit_conn slot until the body byte arrives or the
//! client goes away.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::harness::*;

/// Sends a GET whose one-byte body is withheld.
fn hold(s: &Server, path: &str) -> TcpStream {
    let mut c = s.connect();
    c.write_all(
        format!(
            "GET {} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n",
            path
        )
        .as_bytes(),
    )
    .expect("write head");
    c
}

/// Reads a metric sample's value from a /metrics document.
fn metric(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

const LIMIT_CONN_CONF: &str = "
http {
    limit_conn_zone $binary_remote_addr zone=addr:1m;
    limit_conn_zone $binary_remote_addr zone=solo:1m;
    server {
        listen 127.0.0.1:@PORT@;
        root html;
        location /held { limit_conn addr 100; }
        location /one { limit_conn solo 1; limit_conn_status 429; }
        location = /metrics { tern_metrics; }
        location = /status { stub_status; }
    }
}";

fn active(s: &Server) -> Option<u64> {
    let m = s.get("/metrics");
    metric(&m.body_str(), "tern_limit_conn_active{zone=\"addr\"}")
}

#[test]
fn limit_conn_101st_concurrent_request_gets_503_and_the_others_complete() {
    let p = Prefix::new();
    p.write("html/held", "ok\n");
    let s = Server::start_in(p, LIMIT_CONN_CONF);
    let mut held: Vec<TcpStream> = (0..100).map(|_| hold(&s, "/held")).collect();
    eventually(5, "100 slots taken", || active(&s) == Some(100));
    // The 101st from the same address is refused at once.
    let r = s.get("/held");
    assert_eq!(r.status, 503, "{}", r.head);
    s.wait_error_log("limiting connections by zone \"addr\"");
    // The 100 complete once their bodies arrive.
    for c in held.iter_mut() {
        c.write_all(b"x").expect("body");
    }
    for c in held.iter_mut() {
        let r = read_response(c).expect("response");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok\n"[..]));
    }
    // Kept-alive connections hold no slot: only requests do.
    eventually(5, "slots released", || active(&s) == Some(0));
    assert_eq!(s.get("/held").status, 200);
    let m = s.get("/metrics").body_str();
    assert_eq!(
        metric(
            &m,
            "tern_limit_conn_requests_total{zone=\"addr\",result=\"rejected\"}"
        ),
        Some(1)
    );
    assert_eq!(
        metric(
            &m,
            "tern_limit_conn_requests_total{zone=\"addr\",result=\"passed\"}"
        ),
        Some(101)
    );
}

#[test]
fn limit_conn_slots_return_when_clients_vanish_mid_request() {
    let p = Prefix::new();
    p.write("html/held", "ok\n");
    p.write("html/one", "1\n");
    let s = Server::start_in(p, LIMIT_CONN_CONF);
    let held: Vec<TcpStream> = (0..20).map(|_| hold(&s, "/held")).collect();
    let one = hold(&s, "/one");
    eventually(5, "20 + 1 slots taken", || active(&s) == Some(20));
    // limit_conn_status applies to the refusal.
    assert_eq!(s.get("/one").status, 429);
    // 21 held, plus the one asking.
    eventually(5, "22 active", || {
        s.get("/status")
            .body_str()
            .starts_with("Active connections: 22 \n")
    });
    // The clients vanish without sending their bodies.
    drop(held);
    drop(one);
    eventually(5, "slots released", || active(&s) == Some(0));
    eventually(5, "connections closed", || {
        s.get("/status")
            .body_str()
            .starts_with("Active connections: 1 \n")
    });
    assert_eq!(s.get("/one").status, 200);
}

#[test]
fn limit_conn_zone_memory_exhaustion_rejects_like_nginx() {
    // nginx 1.22.1 with a 32k zone and 250-byte keys (512-byte slab
    // slots): 40 keys fit, the 41st is refused with a crit log line.
    let p = Prefix::new();
    p.write("html/k", "k\n");
    let s = Server::start_in(
        p,
        "http {
            limit_conn_zone $http_x_key zone=small:32k;
            server { listen 127.0.0.1:@PORT@; root html;
                location /k { limit_conn small 5; }
                location = /metrics { tern_metrics; } } }",
    );
    let mut held = Vec::new();
    for i in 0..40 {
        let mut c = s.connect();
        let key = format!("{:0>250}", i);
        c.write_all(
            format!(
                "GET /k HTTP/1.1\r\nHost: x\r\nX-Key: {}\r\nContent-Length: 1\r\n\r\n",
                key
            )
            .as_bytes(),
        )
        .expect("write");
        held.push(c);
    }
    let m = || s.get("/metrics").body_str();
    eventually(5, "40 keys", || {
        metric(&m(), "tern_limit_conn_active{zone=\"small\"}") == Some(40)
    });
    let key = "x".repeat(250);
    let r = Resp::parse(
        &s.raw(
            format!(
                "GET /k HTTP/1.1\r\nHost: x\r\nX-Key: {}\r\nConnection: close\r\n\r\n",
                key
            )
            .as_bytes(),
        ),
    )
    .expect("response");
    assert_eq!(r.status, 503);
    let log = s.wait_error_log("ngx_slab_alloc() failed: no memory in limit_conn_zone \"small\"");
    assert!(log.contains("[crit]"), "{}", log);
    // An existing key still has room for more requests.
    let r = Resp::parse(
        &s.raw(
            format!(
                "GET /k HTTP/1.1\r\nHost: x\r\nX-Key: {:0>250}\r\nConnection: close\r\n\r\n",
                7
            )
            .as_bytes(),
        ),
    )
    .expect("response");
    assert_eq!(r.status, 200);
}

/// Fires `n` requests at once, one connection each; returns (status,
/// elapsed ms) per request.
fn burst(s: &Server, path: &str, n: usize) -> Vec<(u16, u128)> {
    let mut conns: Vec<TcpStream> = (0..n).map(|_| s.connect()).collect();
    let start = Instant::now();
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        path
    );
    for c in conns.iter_mut() {
        c.write_all(req.as_bytes()).expect("write");
    }
    let handles: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let _ = c.read_to_end(&mut out);
                (
                    Resp::parse(&out).map_or(0, |r| r.status),
                    start.elapsed().as_millis(),
                )
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("join"))
        .collect()
}

const LIMIT_REQ_CONF: &str = "
error_log logs/error.log warn;
http {
    limit_req_zone $binary_remote_addr zone=nd:1m rate=10r/s;
    limit_req_zone $binary_remote_addr zone=dl:1m rate=10r/s;
    limit_req_zone $binary_remote_addr zone=dry:1m rate=1r/m;
    server {
        listen 127.0.0.1:@PORT@;
        root html;
        location /nd { limit_req zone=nd burst=3 nodelay; }
        location /dl { limit_req zone=dl burst=3 delay=1; limit_req_status 429; }
        location /dry { limit_req zone=dry; limit_req_dry_run on; }
        location = /metrics { tern_metrics; }
    }
}";

fn req_counts(s: &Server, zone: &str) -> [Option<u64>; 3] {
    let m = s.get("/metrics").body_str();
    ["passed", "delayed", "rejected"].map(|r| {
        metric(
            &m,
            &format!(
                "tern_limit_req_requests_total{{zone=\"{}\",result=\"{}\"}}",
                zone, r
            ),
        )
    })
}

#[test]
fn limit_req_burst_nodelay_accepts_one_plus_burst() {
    let p = Prefix::new();
    p.write("html/nd", "nd\n");
    let s = Server::start_in(p, LIMIT_REQ_CONF);
    // 10 requests within a few ms at 10r/s with burst=3: the first and 3
    // more pass at once (a 100 ms drain could let one more through).
    let res = burst(&s, "/nd", 10);
    let ok = res.iter().filter(|r| r.0 == 200).count();
    let rejected = res.iter().filter(|r| r.0 == 503).count();
    assert_eq!(ok + rejected, 10, "{:?}", res);
    assert!((4..=5).contains(&ok), "{:?}", res);
    // nodelay: nothing waited (asserted through the DELAYED counter below;
    // wall-clock bounds would make the test depend on machine load).
    let [passed, delayed, rej] = req_counts(&s, "nd");
    assert_eq!(
        (passed, delayed, rej),
        (Some(ok as u64), Some(0), Some(rejected as u64))
    );
    // The excess at the first rejection is 4.000 when the burst arrives
    // within a millisecond; on a loaded machine the bucket may have drained
    // a little (3.9xx), so only the leading digit is fixed.
    let log = s.wait_error_log("limiting requests, excess: ");
    let at = log
        .find("limiting requests, excess: ")
        .expect("a limiting line");
    let excess = &log[at + "limiting requests, excess: ".len()..];
    assert!(
        excess.starts_with("4.000 by zone \"nd\"") || excess.starts_with("3."),
        "{}",
        log
    );
    s.wait_error_log(" by zone \"nd\"");
    // After the bucket drains (100 ms per request) one more passes.
    std::thread::sleep(Duration::from_millis(120));
    assert_eq!(s.get("/nd").status, 200);
}

#[test]
fn limit_req_dry_run_passes_and_logs() {
    let p = Prefix::new();
    p.write("html/dry", "d\n");
    let s = Server::start_in(p, LIMIT_REQ_CONF);
    assert_eq!(s.get("/dry").status, 200);
    assert_eq!(s.get("/dry").status, 200);
    s.wait_error_log("limiting requests, dry run, excess: 1.000 by zone \"dry\"");
    let m = s.get("/metrics").body_str();
    assert_eq!(
        metric(
            &m,
            "tern_limit_req_requests_total{zone=\"dry\",result=\"rejected_dry_run\"}"
        ),
        Some(1)
    );
}

/// Needs the engine to wait on `Step::Delay` (see the limit_req module
/// docs); counts are checked regardless, timing only with the hook.
#[test]
fn limit_req_burst_with_delay_counts_and_timing() {
    let p = Prefix::new();
    p.write("html/dl", "dl\n");
    let s = Server::start_in(p, LIMIT_REQ_CONF);
    // 8 at once, 10r/s, burst=3, delay=1: excess 0 and 1000 pass at once,
    // 2000 waits 100 ms, 3000 waits 200 ms, the rest are refused (429).
    let res = burst(&s, "/dl", 8);
    let ok: Vec<u128> = res.iter().filter(|r| r.0 == 200).map(|r| r.1).collect();
    let rejected = res.iter().filter(|r| r.0 == 429).count();
    assert_eq!(ok.len() + rejected, 8, "{:?}", res);
    assert!((4..=5).contains(&ok.len()), "{:?}", res);
    let [passed, delayed, rej] = req_counts(&s, "dl");
    assert_eq!(passed.unwrap_or(0) + delayed.unwrap_or(0), ok.len() as u64);
    assert_eq!(rej, Some(rejected as u64));
    assert!(delayed.unwrap_or(0) >= 2, "{:?}", (passed, delayed, rej));
    let log = s.wait_error_log("delaying request, excess: 2.");
    assert!(log.contains("[warn]"), "{}", log);
    // Delayed requests really wait on the timer (100 ms and 200 ms).
    let waited = ok.iter().filter(|&&ms| ms >= 90).count();
    assert!(waited >= 2, "{:?}", res);
    assert!(ok.iter().any(|&ms| ms >= 190), "{:?}", res);
}

#[test]
fn limit_config_errors_are_nginx_worded() {
    let cases = [
        ("limit_conn_zone $binary_remote_addr zone=a:10k;", "zone \"zone=a:10k\" is too small"),
        (
            "limit_conn_zone $binary_remote_addr zone=a:1m; limit_conn_zone $uri zone=a:1m;",
            "limit_conn_zone \"a\" is already bound to key \"$binary_remote_addr\"",
        ),
        (
            "limit_conn_zone $binary_remote_addr zone=a:1m; limit_req_zone $uri zone=a:1m rate=1r/s;",
            "the shared memory zone \"a\" is already declared for a different use",
        ),
        ("limit_req_zone $uri zone=a:1m rate=xr/s;", "invalid rate \"rate=xr/s\""),
        ("limit_req_zone $uri rate=1r/s x;", "invalid parameter \"x\""),
        ("limit_conn_zone $uri zone=a:1m; limit_conn a 0;", "invalid number of connections \"0\""),
        ("limit_req_zone $uri zone=a:1m rate=1r/s; limit_req zone=a burst=x;", "invalid burst value \"burst=x\""),
        ("limit_conn_status 200;", "value must be between 400 and 599"),
        ("limit_req_log_level crit;", "invalid value \"crit\""),
    ];
    for (http, want) in cases {
        let p = Prefix::new();
        p.write(
            "conf/nginx.conf",
            conf_text(
                &format!("http {{ {} server {{ listen 127.0.0.1:@PORT@; }} }}", http),
                free_port(),
            ),
        );
        let out = p.run(&[
            "-t",
            "-c",
            p.path("conf/nginx.conf").to_str().unwrap_or_default(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{} accepted", http);
        assert!(err.contains(want), "{}: {}", http, err);
    }
}

#[test]
fn limit_conn_zone_survives_reload() {
    let p = Prefix::new();
    p.write("html/held", "ok\n");
    let s = Server::start_in(p, LIMIT_CONN_CONF);
    let _held: Vec<TcpStream> = (0..3).map(|_| hold(&s, "/held")).collect();
    eventually(5, "3 slots", || active(&s) == Some(3));
    // Same zone name and size: the counts carry over the reload.
    s.rewrite_conf(&LIMIT_CONN_CONF.replace("addr 100", "addr 3"), s.port);
    s.signal(SIGHUP);
    // Tolerates a refused connect while the reload is in progress.
    eventually(5, "reloaded", || {
        let Ok(mut c) = TcpStream::connect(("127.0.0.1", s.port)) else {
            return false;
        };
        let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = c.write_all(b"GET /held HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        Resp::parse(&read_to_close(&mut c)).is_some_and(|r| r.status == 503)
    });
    assert_eq!(active(&s), Some(3));
}

/// A client that hangs up while limit_req delays its request ends it: 499
/// in the access log and nginx's "client prematurely closed connection"
/// (ngx_http_test_reading), not a request held for the whole delay.
#[test]
fn limit_req_delayed_request_ends_when_the_client_hangs_up() {
    let p = Prefix::new();
    p.write("html/first", "1\n");
    p.write("html/second", "2\n");
    // Not `return`: it answers in the rewrite phase, before limit_req.
    let s = Server::start_in(
        p,
        "error_log logs/error.log info;
         http { limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;
           log_format st \"$uri $status\";
           server { listen 127.0.0.1:@PORT@; access_log logs/st.log st; root html;
             location / { limit_req zone=one burst=5; } } }",
    );
    assert_eq!(s.get("/first").status, 200);
    // The second waits 60 s for its turn; the client leaves meanwhile.
    let mut c = s.connect();
    c.write_all(b"GET /second HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    s.wait_error_log("delaying request");
    drop(c);
    let log = wait_log(&s.prefix, "logs/st.log", "/second 499");
    assert_eq!(log, "/first 200\n/second 499\n");
    let err = s.wait_error_log("client prematurely closed connection");
    assert!(err.contains("[info]"), "{}", err);
}
