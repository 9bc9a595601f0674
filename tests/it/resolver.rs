//! `resolver` as nginx's `ngx_resolver.c` asks and combines: the servers
//! of one `resolver` line in turn (a new query starts at the next one),
//! errors never kept, an answer with TC set asked again over TCP, a
//! format error ignored until the query goes to the next server, and in
//! mail the client's name (PTR, then A) as `Client-Host`. The test runs
//! the name servers itself (UDP and TCP on loopback); where nginx is
//! installed the same configuration runs on it and the answers must be
//! the same.

use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::harness::*;

/// What a test name server answers: the response code, the TC bit, and
/// the A addresses (or the PTR name) of the answer section.
#[derive(Clone, Default)]
pub struct Ans {
    pub rcode: u8,
    pub tc: bool,
    pub a: Vec<[u8; 4]>,
    pub ptr: Option<String>,
}

type Handler = dyn Fn(&str, u16, bool) -> Ans + Send + Sync;

fn wire_name(n: &str) -> Vec<u8> {
    let mut v = Vec::new();
    for l in n.split('.') {
        v.push(l.len() as u8);
        v.extend_from_slice(l.as_bytes());
    }
    v.push(0);
    v
}

/// The response to query `q` by `h` (None: not a query).
fn respond(q: &[u8], h: &Handler, tcp: bool) -> Option<Vec<u8>> {
    if q.len() < 12 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    while at < q.len() && q[at] != 0 {
        let len = q[at] as usize;
        labels.push(String::from_utf8_lossy(q.get(at + 1..at + 1 + len)?).into_owned());
        at += 1 + len;
    }
    let qend = at + 5;
    if qend > q.len() {
        return None;
    }
    let name = labels.join(".").to_ascii_lowercase();
    let qtype = u16::from_be_bytes([q[at + 1], q[at + 2]]);
    let ans = h(&name, qtype, tcp);
    let mut r = q[..qend].to_vec();
    r[2] = 0x81 | if ans.tc { 0x02 } else { 0 };
    r[3] = 0x80 | ans.rcode;
    r[8..12].copy_from_slice(&[0, 0, 0, 0]);
    let mut n = 0u8;
    if qtype == 1 {
        for a in &ans.a {
            r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0x0e, 0x10, 0, 4]);
            r.extend_from_slice(a);
            n += 1;
        }
    }
    if let (12, Some(p)) = (qtype, &ans.ptr) {
        let w = wire_name(p);
        r.extend_from_slice(&[0xc0, 0x0c, 0, 12, 0, 1, 0, 0, 0x0e, 0x10, 0, w.len() as u8]);
        r.extend_from_slice(&w);
        n += 1;
    }
    r[6] = 0;
    r[7] = n;
    Some(r)
}

/// A name server on loopback (UDP, and TCP on the same port); returns
/// its port and the number of queries it got.
pub fn name_server(h: Arc<Handler>) -> (u16, Arc<AtomicUsize>) {
    let (sock, tcp) = loop {
        let sock = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
        let port = sock.local_addr().expect("addr").port();
        if let Ok(t) = TcpListener::bind(("127.0.0.1", port)) {
            break (sock, t);
        }
    };
    let port = sock.local_addr().expect("addr").port();
    let count = Arc::new(AtomicUsize::new(0));
    let (c, hu) = (count.clone(), h.clone());
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            c.fetch_add(1, Ordering::SeqCst);
            if let Some(r) = respond(&buf[..n], &*hu, false) {
                let _ = sock.send_to(&r, from);
            }
        }
    });
    let c = count.clone();
    std::thread::spawn(move || {
        for mut s in tcp.incoming().flatten() {
            let (c, h) = (c.clone(), h.clone());
            std::thread::spawn(move || {
                let mut len = [0u8; 2];
                while s.read_exact(&mut len).is_ok() {
                    let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                    if s.read_exact(&mut q).is_err() {
                        return;
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                    if let Some(r) = respond(&q, &*h, true) {
                        let mut out = (r.len() as u16).to_be_bytes().to_vec();
                        out.extend_from_slice(&r);
                        let _ = s.write_all(&out);
                    }
                }
            });
        }
    });
    (port, count)
}

const LOCAL: [u8; 4] = [127, 0, 0, 1];

fn status_of(port: u16, path: &str) -> (u16, String) {
    let req = format!("GET {} HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
    let r = Resp::parse(&raw(port, req.as_bytes())).expect("a response");
    (r.status, r.body_str())
}

/// Two servers: the first fails the name, the second answers it. A
/// lookup starts at the first; the error is not kept, so the next
/// request's lookup (at the second server) succeeds and is kept.
#[test]
fn resolver_servers_in_turn_errors_not_kept() {
    let conf = |s1: u16, s2: u16| {
        format!(
            "http {{ server {{ listen 127.0.0.1:@PORT@;\n\
               location / {{ resolver 127.0.0.1:{s1} 127.0.0.1:{s2}; resolver_timeout 3s;\n\
                 proxy_pass http://$arg_h:@PORT@/b; }}\n\
               location /b {{ return 200 ok; }} }} }}\n"
        )
    };
    let run = |start: &dyn Fn(String) -> (u16, Box<dyn std::any::Any>)| {
        let (s1, n1) = name_server(Arc::new(|_: &str, _, _| Ans {
            rcode: 2,
            ..Ans::default()
        }));
        let (s2, _) = name_server(Arc::new(|_: &str, _, _| Ans {
            a: vec![LOCAL],
            ..Ans::default()
        }));
        let (port, _keep) = start(conf(s1, s2));
        let got: Vec<u16> = (0..3).map(|_| status_of(port, "/?h=two.test").0).collect();
        (got, n1.load(Ordering::SeqCst))
    };
    let (tern, asked_first) = run(&|c| {
        let s = Server::start(&c);
        (s.port, Box::new(s))
    });
    assert_eq!(tern, vec![502, 200, 200]);
    // Only the first request asked the failing server (A and AAAA).
    assert_eq!(asked_first, 2);
    if nginx_installed() {
        let (nginx, _) = run(&|c| {
            let p = Prefix::new();
            let port = free_port();
            let n = start_nginx(&p, &c, port).expect("nginx starts");
            (port, Box::new((p, n)))
        });
        assert_eq!(nginx, tern);
    }
}

/// An answer with TC set is asked again over TCP at the same server, and
/// the TCP answer is the one used.
#[test]
fn resolver_truncated_answer_asked_over_tcp() {
    let (dns, _) = name_server(Arc::new(|_: &str, _, tcp| {
        if tcp {
            Ans {
                a: vec![LOCAL],
                ..Ans::default()
            }
        } else {
            Ans {
                tc: true,
                a: vec![[127, 0, 0, 201]],
                ..Ans::default()
            }
        }
    }));
    let srv = Server::start(&format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ resolver 127.0.0.1:{dns}; resolver_timeout 3s; proxy_connect_timeout 1s;\n\
             proxy_pass http://$arg_h:@PORT@/b; add_header X-Up $upstream_addr; }}\n\
           location /b {{ return 200 ok; }} }} }}\n"
    ));
    let req = "GET /?h=tcp.test HTTP/1.0\r\nHost: localhost\r\n\r\n";
    let r = Resp::parse(&srv.raw(req.as_bytes())).expect("a response");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("X-Up"),
        Some(format!("127.0.0.1:{}", srv.port).as_str())
    );
}

/// A name server that answers FORMERR is passed over: after nginx's 5 s
/// resend time the query goes to the next server.
#[test]
fn resolver_format_error_waits_for_the_next_server() {
    let (bad, _) = name_server(Arc::new(|_: &str, _, _| Ans {
        rcode: 1,
        ..Ans::default()
    }));
    let (good, _) = name_server(Arc::new(|_: &str, _, _| Ans {
        a: vec![LOCAL],
        ..Ans::default()
    }));
    let srv = Server::start(&format!(
        "error_log logs/error.log error;\n\
         http {{ server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ resolver 127.0.0.1:{bad} 127.0.0.1:{good}; resolver_timeout 8s;\n\
             proxy_pass http://$arg_h:@PORT@/b; }}\n\
           location /b {{ return 200 ok; }} }} }}\n"
    ));
    assert_eq!(status_of(srv.port, "/?h=fe.test"), (200, "ok".into()));
    let log = srv.wait_error_log("DNS error (1: Format error)");
    assert!(log.contains("name:\"fe.test\""), "{}", log);
}

/// Lookups of one name at once are one query, as nginx's (the second
/// waits for the first's answer): the name server holds its answer until
/// both requests are in, and is asked once.
#[test]
fn resolver_lookups_of_one_name_at_once_ask_once() {
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let asked = Arc::new(AtomicUsize::new(0));
    let (g, a) = (gate.clone(), asked.clone());
    let (dns, _) = name_server(Arc::new(move |name: &str, t, _| {
        if name == "merge.test" && t == 1 {
            a.fetch_add(1, Ordering::SeqCst);
            let (m, cv) = &*g;
            let open = m.lock().expect("gate");
            // Held until the test opens it (4 s at most: within
            // nginx's 5 s resend time, so nothing is asked again).
            let _ = cv
                .wait_timeout_while(open, Duration::from_secs(4), |o| !*o)
                .expect("gate");
        }
        Ans {
            a: if t == 1 { vec![LOCAL] } else { Vec::new() },
            ..Ans::default()
        }
    }));
    let srv = Server::start(&format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ resolver 127.0.0.1:{dns}; resolver_timeout 20s;\n\
             proxy_pass http://$arg_h:@PORT@/b; }}\n\
           location /b {{ return 200 ok; }} }} }}\n"
    ));
    let port = srv.port;
    let clients: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || status_of(port, "/?h=merge.test")))
        .collect();
    // Both requests are sent; give tern a moment to read them, then let
    // the answer go (a slow machine only makes the second one find the
    // answer cached, which asks once too).
    std::thread::sleep(Duration::from_millis(1500));
    {
        let (m, cv) = &*gate;
        *m.lock().expect("gate") = true;
        cv.notify_all();
    }
    for c in clients {
        assert_eq!(c.join().expect("client"), (200, "ok".to_string()));
    }
    assert_eq!(asked.load(Ordering::SeqCst), 1);
}
