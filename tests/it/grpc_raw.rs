//! `grpc_pass` against a hand-written HTTP/2 backend, for what a real gRPC
//! server never sends: exact HPACK bytes. nginx-tests' backend (HTTP2.pm)
//! pads a Huffman string whose code ends on a byte boundary with a whole
//! byte of ones; nginx's decoder takes it, the h2 crate alone would not,
//! so tern mends such blocks (`grpc/hpack_mend.rs`). A header block that
//! is wrong in another way still ends the call at once with 502 and
//! nginx's words in the error log, never a hang.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::harness::{Resp, Server};

/// One frame: length, type, flags, stream, payload.
fn frame(typ: u8, flags: u8, sid: u32, payload: &[u8]) -> Vec<u8> {
    let n = payload.len();
    let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, typ, flags];
    f.extend_from_slice(&sid.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads frames until the client's stream ends (a frame with END_STREAM).
fn read_request(s: &mut TcpStream) -> bool {
    let mut preface = [0u8; 24];
    if s.read_exact(&mut preface).is_err() {
        return false;
    }
    loop {
        let mut h = [0u8; 9];
        if s.read_exact(&mut h).is_err() {
            return false;
        }
        let len = (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize;
        let mut p = vec![0u8; len];
        if s.read_exact(&mut p).is_err() {
            return false;
        }
        // HEADERS or DATA with END_STREAM.
        if (h[3] == 0 || h[3] == 1) && h[4] & 1 != 0 {
            return true;
        }
    }
}

/// A backend for one call: it reads the request, then answers with these
/// frames (after its SETTINGS and the ACK of tern's), and keeps the
/// connection until tern closes it.
fn backend(answer: Vec<u8>) -> (u16, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let t = std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
        if !read_request(&mut s) {
            return;
        }
        let mut out = frame(4, 0, 0, &[]);
        out.extend(frame(4, 1, 0, &[]));
        out.extend(answer);
        let _ = s.write_all(&out);
        let mut sink = [0u8; 4096];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    });
    (port, t)
}

/// nginx-tests' Huffman encoding of `application/grpc`: its 88 bits of
/// code end on a byte boundary, and a byte of ones follows.
const APP_GRPC_OVERPADDED: &[u8] = &[
    0x1d, 0x75, 0xd0, 0x62, 0x0d, 0x26, 0x3d, 0x4c, 0x4d, 0x65, 0x64, 0xff,
];

fn call(port: u16) -> Resp {
    call_raw(port).0
}

/// The answer, and its bytes as they came (trailers included).
fn call_raw(port: u16) -> (Resp, String) {
    let req = "POST /pkg.Svc/Say HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/grpc\r\n\
               TE: trailers\r\nContent-Length: 5\r\nConnection: close\r\n\r\nHello";
    let mut s = crate::harness::connect(port);
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(req.as_bytes()).expect("write");
    let data = crate::harness::read_to_close(&mut s);
    let r = Resp::parse(&data).expect("a response");
    (r, String::from_utf8_lossy(&data).into_owned())
}

#[test]
fn grpc_accepts_overpadded_huffman_strings_as_nginx() {
    // HEADERS: :status 200 (indexed), content-type (static name 31,
    // without indexing) = over-padded "application/grpc", x-connection
    // (new name, Huffman) = "1" (Huffman, fine), padded frame.
    let mut head = vec![0x88, 0x0f, 0x10, 0x80 | APP_GRPC_OVERPADDED.len() as u8];
    head.extend_from_slice(APP_GRPC_OVERPADDED);
    head.extend_from_slice(&[
        0x00, 0x89, 0xf2, 0xb1, 0x0f, 0x55, 0x45, 0x22, 0x4c, 0x7a, 0xbf,
    ]);
    head.extend_from_slice(&[0x81, 0x0f]);
    let mut padded = vec![3u8];
    padded.extend_from_slice(&head);
    padded.extend_from_slice(&[0, 0, 0]);
    let mut answer = frame(1, 0x4 | 0x8, 1, &padded);
    answer.extend(frame(0, 0, 1, b"Hello world"));
    // Trailers: grpc-status "0" and grpc-message "" (a lone byte of
    // ones), split over HEADERS and CONTINUATION.
    let trailers: &[u8] = &[
        0x00, 0x88, 0x9a, 0xca, 0xc8, 0xb2, 0x12, 0x34, 0xda, 0x8f, 0x81, 0x07, //
        0x00, 0x89, 0x9a, 0xca, 0xc8, 0xb5, 0x25, 0x42, 0x07, 0x31, 0x7f, 0x81, 0xff,
    ];
    answer.extend(frame(1, 0x1, 1, &trailers[..14]));
    answer.extend(frame(9, 0x4, 1, &trailers[14..]));
    let (bport, t) = backend(answer);
    let srv = Server::start(&format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ grpc_pass 127.0.0.1:{bport}; }} }} }}\n"
    ));
    let (r, raw) = call_raw(srv.port);
    assert_eq!(r.status, 200, "{}\n{}", r.head, srv.error_log());
    assert_eq!(r.header("Content-Type"), Some("application/grpc"));
    assert_eq!(r.header("X-Connection"), Some("1"));
    assert!(r.body_str().contains("Hello world"), "{raw}");
    // The trailers decoded too: they follow the last chunk.
    assert!(raw.contains("\r\n0\r\ngrpc-status: 0\r\n"), "{raw}");
    assert!(raw.contains("\r\ngrpc-message: \r\n"), "{raw}");
    drop(srv);
    let _ = t.join();
}

#[test]
fn grpc_bad_header_block_is_502_at_once() {
    // An index past the tables: nothing to mend, the h2 client rejects
    // the connection, and the call ends with 502 (not at a timeout).
    let answer = frame(1, 0x4, 1, &[0x88, 0xff, 0x40]);
    let (bport, t) = backend(answer);
    // The client waits 30 s at most (`call`), far less than the read
    // timeout: only the error itself can end the call in time.
    let srv = Server::start(&format!(
        "http {{ server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ grpc_pass 127.0.0.1:{bport}; grpc_read_timeout 300s; }} }} }}\n"
    ));
    let r = call(srv.port);
    assert_eq!(r.status, 502);
    // The h2 client names no more than a protocol error: "upstream sent
    // invalid ..." with nginx's context (the error log is written a
    // moment later, by its own thread).
    let log = crate::harness::wait_log(&srv.prefix, "logs/error.log", "upstream sent invalid");
    assert!(
        log.contains("while reading response header from upstream"),
        "{log}"
    );
    drop(srv);
    let _ = t.join();
}

/// Reads a client's frames until one of its streams ends; that stream's
/// id (None: the connection ended).
fn read_call(s: &mut TcpStream) -> Option<u32> {
    loop {
        let mut h = [0u8; 9];
        s.read_exact(&mut h).ok()?;
        let len = (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize;
        let mut p = vec![0u8; len];
        s.read_exact(&mut p).ok()?;
        if (h[3] == 0 || h[3] == 1) && h[4] & 1 != 0 {
            return Some(u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff);
        }
    }
}

/// With `keepalive` in the upstream block, a call that ended cleanly
/// leaves its connection for the next one, which opens the next stream
/// there (nginx's grpc keepalive); a GOAWAY from the peer ends that.
#[test]
fn grpc_keepalive_reuses_the_connection_until_goaway() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let bport = l.local_addr().expect("addr").port();
    // Each call: (connection number, stream id); the third call's answer
    // comes with a GOAWAY, so the fourth needs a new connection.
    let backend = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut conn = 0;
        while seen.len() < 4 {
            let Ok((mut s, _)) = l.accept() else { break };
            conn += 1;
            let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
            let mut preface = [0u8; 24];
            if s.read_exact(&mut preface).is_err() {
                continue;
            }
            let mut out = frame(4, 0, 0, &[]);
            out.extend(frame(4, 1, 0, &[]));
            let _ = s.write_all(&out);
            while let Some(sid) = read_call(&mut s) {
                seen.push((conn, sid));
                let mut a = frame(1, 0x4, sid, &[0x88]);
                a.extend(frame(0, 0, sid, b"ok"));
                if seen.len() == 3 {
                    // GOAWAY: last stream = this one, NO_ERROR.
                    let mut g = sid.to_be_bytes().to_vec();
                    g.extend_from_slice(&[0, 0, 0, 0]);
                    a.extend(frame(7, 0, 0, &g));
                }
                // Trailers: grpc-status 0 (literal, new name, raw).
                let mut t = vec![0x00, 11];
                t.extend_from_slice(b"grpc-status");
                t.extend_from_slice(&[1, b'0']);
                a.extend(frame(1, 0x5, sid, &t));
                let _ = s.write_all(&a);
                if seen.len() >= 4 {
                    break;
                }
            }
        }
        seen
    });
    let srv = Server::start(&format!(
        "http {{ upstream u {{ server 127.0.0.1:{bport}; keepalive 1; }}\n\
           server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ grpc_pass u; }} }} }}\n"
    ));
    for _ in 0..4 {
        let r = call(srv.port);
        assert_eq!(r.status, 200, "{}", srv.error_log());
        assert!(r.body_str().contains("ok"));
    }
    drop(srv);
    let seen = backend.join().expect("backend");
    assert_eq!(seen, vec![(1, 1), (1, 3), (1, 5), (2, 1)]);
}
