//! Accepting: connections that wait in the listen queue are all taken,
//! with no new connection arriving to wake the worker, and listeners
//! shared by several workers lose nobody.
use crate::harness::*;
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

const CLOSE_REQ: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";

/// Reads the answer on each connection, in order, until one is missing;
/// returns how many were "ok" (stopping early keeps a failure quick).
fn answered(conns: &mut [TcpStream]) -> usize {
    let mut ok = 0;
    for c in conns.iter_mut() {
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        if Resp::parse(&read_to_close(c)).is_none_or(|r| r.body != b"ok") {
            break;
        }
        ok += 1;
    }
    ok
}

/// Sends a request on each of `n` new connections at once, then reads
/// the answers.
fn burst(port: u16, n: usize) -> usize {
    let mut conns: Vec<TcpStream> = (0..n)
        .map(|_| {
            let mut c = connect(port);
            c.write_all(CLOSE_REQ).expect("write");
            c
        })
        .collect();
    answered(&mut conns)
}

/// Connections that queued while the worker was at `worker_connections`
/// are accepted once slots free up, though none arrives after them: the
/// worker must take the whole queue it was told about, not one per
/// wake-up.
#[test]
fn queued_connections_are_all_accepted_when_slots_free() {
    let s = Server::start(
        "worker_processes 1; events { worker_connections 4; } http { server { listen 127.0.0.1:@PORT@; return 200 ok; } }",
    );
    // The harness's probe may still hold a slot for a moment.
    std::thread::sleep(Duration::from_millis(200));
    // Holders in the middle of a request head: not idle, so not closed to
    // make room (an idle connection would be, as in nginx).
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut c = s.connect();
            c.write_all(b"GET / HTTP/1.1\r\n").expect("write");
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut queued: Vec<TcpStream> = (0..30)
        .map(|_| {
            let mut c = s.connect();
            c.write_all(CLOSE_REQ).expect("write");
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    drop(idle);
    assert_eq!(
        answered(&mut queued),
        30,
        "connections left in the listen queue"
    );
}

/// Two workers on one shared listening socket (no `reuseport`), and two
/// with a socket each: every connection of repeated bursts is served.
#[test]
fn bursts_on_shared_and_reuseport_listeners() {
    for listen in [
        "listen 127.0.0.1:@PORT@;",
        "listen 127.0.0.1:@PORT@ reuseport;",
    ] {
        let s = Server::start(&format!(
            "worker_processes 2; http {{ server {{ {listen} return 200 ok; }} }}"
        ));
        for round in 0..5 {
            assert_eq!(burst(s.port, 100), 100, "{listen} round {round}");
        }
    }
}
