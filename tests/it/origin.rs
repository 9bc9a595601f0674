//! Loopback upstream origins for the proxy tests: small HTTP servers in
//! the test process. [`Origin::serve`] accepts on a free port and hands
//! each connection ([`Conn`]) to a handler on its own thread; the handler
//! reads requests with [`Conn::next`], records what it wants kept
//! ([`Conn::record`], read back with [`Origin::requests`]) and answers on
//! `c.stream`. [`Origin::start`] is the common case: one request per
//! connection, answered from its head. An origin stops accepting when
//! dropped, unless [`Origin::detach`]ed.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::*;

type Seen = Arc<Mutex<Vec<Vec<u8>>>>;

pub(crate) struct Origin {
    pub(crate) port: u16,
    seen: Seen,
    conns: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

/// One accepted connection of an origin.
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    /// Bytes read and not yet returned as a request (keep-alive).
    buf: Vec<u8>,
    seen: Seen,
}

impl Conn {
    /// The next request on the connection: its head and, with `body`, as
    /// much of a Content-Length body as arrives before the peer closes.
    /// None when the peer closes (or a read times out) before a whole head.
    pub(crate) fn next(&mut self, body: bool) -> Option<Vec<u8>> {
        let mut b = [0u8; 65536];
        let end = loop {
            if let Some(p) = find(&self.buf, b"\r\n\r\n") {
                break p + 4;
            }
            match self.stream.read(&mut b) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&b[..n]),
            }
        };
        let len = if body {
            String::from_utf8_lossy(&self.buf[..end])
                .to_ascii_lowercase()
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        } else {
            0
        };
        while self.buf.len() < end + len {
            match self.stream.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => self.buf.extend_from_slice(&b[..n]),
            }
        }
        let take = (end + len).min(self.buf.len());
        Some(self.buf.drain(..take).collect())
    }

    /// What arrived after the last request [`Conn::next`] returned.
    pub(crate) fn leftover(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// Keeps `req` for [`Origin::requests`].
    pub(crate) fn record(&self, req: &[u8]) {
        self.seen.lock().unwrap().push(req.to_vec());
    }
}

impl Origin {
    /// Accepts on a free loopback port and runs `h` on each connection,
    /// each on its own thread, counting the connections.
    pub(crate) fn serve(h: impl Fn(Conn) + Send + Sync + 'static) -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind origin");
        let port = l.local_addr().expect("addr").port();
        let seen: Seen = Arc::new(Mutex::new(Vec::new()));
        let conns = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let h = Arc::new(h);
        let (seen2, conns2, stop2) = (seen.clone(), conns.clone(), stop.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = c else { continue };
                conns2.fetch_add(1, Ordering::SeqCst);
                let (h, seen) = (h.clone(), seen2.clone());
                std::thread::spawn(move || {
                    h(Conn {
                        stream,
                        buf: Vec::new(),
                        seen,
                    })
                });
            }
        });
        Origin {
            port,
            seen,
            conns,
            stop,
        }
    }

    /// One request per connection (read up to the blank line, recorded),
    /// answered with what the handler returns for its head (None: accept
    /// and stay silent for 3 s), then closed.
    pub(crate) fn start(h: impl Fn(&str) -> Option<Vec<u8>> + Send + Sync + 'static) -> Origin {
        Origin::serve(move |mut c| {
            let Some(req) = c.next(false) else { return };
            c.record(&req);
            match h(&String::from_utf8_lossy(&req)) {
                Some(r) => {
                    let _ = c.stream.write_all(&r);
                }
                None => std::thread::sleep(Duration::from_secs(3)),
            }
        })
    }

    /// A 200 with `body` and the given extra headers.
    pub(crate) fn ok(body: &str, extra: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{}\r\n{}",
            body.len(),
            extra,
            body
        )
        .into_bytes()
    }

    /// The recorded requests, as text.
    pub(crate) fn requests(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect()
    }

    /// The recorded requests, byte for byte.
    pub(crate) fn raw_requests(&self) -> Vec<Vec<u8>> {
        self.seen.lock().unwrap().clone()
    }

    pub(crate) fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// The count of accepted connections, live.
    pub(crate) fn conns(&self) -> Arc<AtomicUsize> {
        self.conns.clone()
    }

    /// Keeps the origin serving for the rest of the test process; its port.
    pub(crate) fn detach(self) -> u16 {
        let port = self.port;
        std::mem::forget(self);
        port
    }

    /// Stops accepting: the port refuses connections afterwards.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        eventually(5, "origin port closed", || {
            TcpStream::connect(("127.0.0.1", self.port)).is_err()
        });
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
