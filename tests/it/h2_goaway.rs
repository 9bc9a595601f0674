//! HTTP/2 GOAWAY as nginx sends it: when a connection ends because of
//! `keepalive_requests` or a graceful stop (QUIT), one GOAWAY NO_ERROR
//! whose last stream id is the last stream processed, at once, and no
//! PING from the server (the h2 crate on its own sends a GOAWAY with
//! 2^31-1 and a PING first; nginx-tests h2_keepalive.t reads the first
//! GOAWAY). The frames are compared byte for byte, and with nginx's where
//! it is installed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::harness::{self, free_port, start_nginx, Prefix, Server};

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len();
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// GET / for localhost (HPACK: static :method GET, :scheme http, :path
/// /, :authority literal).
fn get() -> Vec<u8> {
    let mut b = vec![0x82, 0x86, 0x84, 0x01, 9];
    b.extend_from_slice(b"localhost");
    b
}

/// POST /up whose body is still to come.
fn post() -> Vec<u8> {
    let mut b = vec![0x83, 0x86, 0x01, 9];
    b.extend_from_slice(b"localhost");
    b.extend_from_slice(&[0x04, 3]);
    b.extend_from_slice(b"/up");
    b
}

fn connect(port: u16) -> TcpStream {
    let mut s = harness::connect(port);
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(4, 0, 0, &[]));
    s.write_all(&hello).expect("preface");
    s
}

/// The frames read until the connection closes: (type, flags, stream,
/// payload).
fn frames(s: &mut TcpStream) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16384];
    loop {
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i + 9 <= buf.len() {
        let n = ((buf[i] as usize) << 16) | ((buf[i + 1] as usize) << 8) | buf[i + 2] as usize;
        let end = (i + 9 + n).min(buf.len());
        let sid = u32::from_be_bytes([buf[i + 5], buf[i + 6], buf[i + 7], buf[i + 8]]);
        out.push((buf[i + 3], buf[i + 4], sid, buf[i + 9..end].to_vec()));
        i += 9 + n;
    }
    out
}

/// The server's GOAWAY frames (payloads) and whether it sent a PING
/// that is not an answer.
fn goaways(f: &[(u8, u8, u32, Vec<u8>)]) -> (Vec<Vec<u8>>, bool) {
    let g = f.iter().filter(|x| x.0 == 7).map(|x| x.3.clone()).collect();
    let ping = f.iter().any(|x| x.0 == 6 && x.1 & 1 == 0);
    (g, ping)
}

/// GOAWAY NO_ERROR with last stream `id`, as it goes on the wire.
fn goaway_payload(id: u32) -> Vec<u8> {
    let mut p = id.to_be_bytes().to_vec();
    p.extend_from_slice(&[0, 0, 0, 0]);
    p
}

const CONF: &str = r#"
worker_processes 1;
error_log logs/error.log info;
http {
    access_log off;
    server {
        listen 127.0.0.1:@PORT@ http2;
        root html;
        keepalive_requests 2;
    }
}
"#;

/// Two streams on a connection with `keepalive_requests 2`: the second
/// answer, then one GOAWAY naming stream 3, then the close.
fn keepalive_requests_frames(port: u16) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut s = connect(port);
    s.write_all(&frame(1, 0x5, 1, &get())).expect("stream 1");
    std::thread::sleep(Duration::from_millis(200));
    s.write_all(&frame(1, 0x5, 3, &get())).expect("stream 3");
    frames(&mut s)
}

#[test]
fn keepalive_requests_end_with_one_goaway_naming_the_last_stream() {
    let p = Prefix::new();
    p.write("html/index.html", "hello\n");
    let server = Server::start_in(p, CONF);
    let f = keepalive_requests_frames(server.port);
    let (g, ping) = goaways(&f);
    assert_eq!(g, vec![goaway_payload(3)], "{:?}", f);
    assert!(!ping, "no PING from the server: {:?}", f);
    // Both answers came, and the GOAWAY after the last one began.
    assert!(f.iter().any(|x| x.0 == 1 && x.2 == 3), "{:?}", f);
    if harness::nginx_installed() {
        let p = Prefix::new();
        p.write("html/index.html", "hello\n");
        let port = free_port();
        let Some(_n) = start_nginx(&p, CONF, port) else {
            return;
        };
        let nf = keepalive_requests_frames(port);
        assert_eq!(goaways(&nf), (g, ping), "nginx: {:?}", nf);
    }
}

#[test]
fn graceful_stop_sends_one_goaway_naming_the_stream_in_flight() {
    // A stream in flight: its body is read by the proxy (a body nobody
    // reads is not waited for, so a static file would be answered at once).
    let origin = crate::origin::Origin::serve(|mut c| {
        while c.next(true).is_some() {
            if c.stream
                .write_all(&crate::origin::Origin::ok("up", ""))
                .is_err()
            {
                return;
            }
        }
    });
    let conf = CONF.replace(
        "keepalive_requests 2;",
        &format!(
            "keepalive_requests 2;\n        location /up {{ proxy_pass http://127.0.0.1:{}; }}",
            origin.port
        ),
    );
    let server = Server::start_in(Prefix::new(), &conf);
    let mut s = connect(server.port);
    s.write_all(&frame(1, 0x4, 1, &post())).expect("headers");
    s.write_all(&frame(0, 0, 1, b"part1")).expect("data");
    std::thread::sleep(Duration::from_millis(300));
    server.signal(libc::SIGQUIT);
    // The GOAWAY comes while the stream is still open (after the
    // server's SETTINGS and the like), before any answer.
    let mut got = Vec::new();
    let mut tmp = [0u8; 4096];
    let goaway = loop {
        let mut i = 0;
        let mut found = None;
        while i + 9 <= got.len() {
            let n = ((got[i] as usize) << 16) | ((got[i + 1] as usize) << 8) | got[i + 2] as usize;
            if i + 9 + n > got.len() {
                break;
            }
            assert!(got[i + 3] != 1, "no answer before the GOAWAY");
            if got[i + 3] == 7 {
                found = Some(got[i..i + 9 + n].to_vec());
            }
            i += 9 + n;
        }
        if let Some(g) = found {
            break g;
        }
        let n = s.read(&mut tmp).expect("frames");
        assert!(n > 0, "closed before a GOAWAY");
        got.extend_from_slice(&tmp[..n]);
    };
    assert_eq!(
        goaway,
        frame(7, 0, 0, &goaway_payload(1)),
        "GOAWAY NO_ERROR, last stream 1"
    );
    // The stream finishes; no other GOAWAY, no PING, no reset.
    s.write_all(&frame(0, 0x1, 1, b"+part2"))
        .expect("rest of body");
    let f = frames(&mut s);
    let (g, ping) = goaways(&f);
    assert!(g.is_empty(), "{:?}", f);
    assert!(!ping, "{:?}", f);
    assert!(
        f.iter().any(|x| x.0 == 1 && x.2 == 1),
        "the answer: {:?}",
        f
    );
    assert!(!f.iter().any(|x| x.0 == 3), "no reset: {:?}", f);
}

/// The last answer `keepalive_requests` allows, larger than the client's
/// receive buffer, then a PING from the client after the server has
/// written it all and closed its side: the close lingers (the PING is
/// read and dropped), so the answer arrives whole. Without the lingering
/// close the PING meets a closed socket, whose reset drops the part of
/// the answer still in the server's send buffer (nginx-tests
/// h2_keepalive.t "max requests limited - all data received"). The
/// connection can end by two paths (h2 reporting the connection closed,
/// or the loop seeing the last stream end), so it is tried a few times.
#[test]
fn the_last_answer_survives_a_ping_sent_after_the_goaway() {
    let p = Prefix::new();
    p.write("html/index.html", "SEE-THAT".repeat(50_000));
    let conf = CONF
        .replace("http2;", "http2 sndbuf=1m;")
        .replace("keepalive_requests 2;", "keepalive_requests 1;");
    let server = Server::start_in(p, &conf);
    for round in 0..8 {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        sock.set_recv_buffer_size(64 * 1024).expect("rcvbuf");
        let to: std::net::SocketAddr = ([127, 0, 0, 1], server.port).into();
        sock.connect(&to.into()).expect("connect");
        let mut s: TcpStream = sock.into();
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // SETTINGS_INITIAL_WINDOW_SIZE 2^20, the connection's window
        // 2^21 more: flow control never holds the answer back.
        hello.extend(frame(4, 0, 0, &[0, 4, 0, 0x10, 0, 0]));
        hello.extend(frame(8, 0, 0, &(1u32 << 21).to_be_bytes()));
        hello.extend(frame(1, 0x5, 1, &get()));
        s.write_all(&hello).expect("request");
        // The server writes the answer into its socket buffer at once and
        // closes its side; the client reads nothing meanwhile.
        std::thread::sleep(Duration::from_millis(200));
        s.write_all(&frame(6, 0, 0, b"SEE-THIS")).expect("ping");
        let f = frames(&mut s);
        let data: usize = f
            .iter()
            .filter(|x| x.0 == 0 && x.2 == 1)
            .map(|x| x.3.len())
            .sum();
        assert_eq!(data, 400_000, "round {}: the whole answer", round);
        assert_eq!(goaways(&f).0, vec![goaway_payload(1)], "round {}", round);
    }
}

/// A graceful stop with `worker_shutdown_timeout`: the GOAWAY names the
/// stream in flight at once; when the timeout runs out with the stream
/// still waiting on its upstream, the connection closes and the request
/// is logged as one the client closed, 499, as nginx logs it (nginx-tests
/// worker_shutdown_timeout_h2.t; tern used to drop the stream unlogged).
#[test]
fn shutdown_timeout_logs_the_stream_in_flight() {
    // An upstream that takes the request and never answers.
    let origin = crate::origin::Origin::serve(|mut c| {
        if let Some(req) = c.next(false) {
            c.record(&req);
            let mut b = [0u8; 1024];
            while matches!(c.stream.read(&mut b), Ok(n) if n > 0) {}
        }
    });
    let conf = format!(
        r#"
worker_processes 1;
worker_shutdown_timeout 10ms;
error_log logs/error.log info;
http {{
    access_log logs/access.log;
    server {{
        listen 127.0.0.1:@PORT@ http2;
        location / {{
            proxy_pass http://127.0.0.1:{};
            proxy_read_timeout 30s;
        }}
    }}
}}
"#,
        origin.port
    );
    let mut server = Server::start_in(Prefix::new(), &conf);
    let mut s = connect(server.port);
    s.write_all(&frame(1, 0x5, 1, &get())).expect("request");
    harness::eventually(10, "the request at the upstream", || {
        !origin.requests().is_empty()
    });
    server.signal(libc::SIGQUIT);
    let f = frames(&mut s);
    assert_eq!(goaways(&f).0, vec![goaway_payload(1)], "{:?}", f);
    assert!(!f.iter().any(|x| x.0 == 1), "no answer: {:?}", f);
    assert!(server.wait_exit(Duration::from_secs(10)).is_some());
    let log = server.prefix.read("logs/access.log");
    assert!(log.contains("\"GET / HTTP/2.0\" 499 "), "{}", log);
}
