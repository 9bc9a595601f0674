//! The TLS side of a connection: the handshake ([`accept`]) and the
//! engine's `Stream` over a rustls session ([`TlsStream`]).
//!
//! Invariants: no `await` holds a borrow of the session (every method
//! borrows it for one synchronous step); a write is reported done only
//! once rustls has accepted its bytes, and the engine calls
//! [`Stream::try_flush`] until the ciphertext is all in the socket, so a
//! response never sits in rustls while the connection waits for the
//! client.

use std::cell::{Cell, RefCell};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};

use rustls::server::{Acceptor, ServerConnection};
use tokio::time::Instant;

use crate::core::log::Level;
use crate::core::stream::Stream;
use crate::http::conf::AddrConf;
use crate::http::serve::{log_conn, ConnInfo};
use crate::tls::client_auth::ClientAuth;
use crate::tls::TlsInfo;

/// `io::Read` over the engine's non-blocking read.
struct Rd<'a, S>(&'a S);

impl<S: Stream> Read for Rd<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

/// `io::Write` over the engine's non-blocking write.
struct Wr<'a, S>(&'a S);

impl<S: Stream> Write for Wr<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write_vectored(&[IoSlice::new(buf)])
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A TLS session over an accepted socket.
pub struct TlsStream<S> {
    sock: S,
    conn: RefCell<Box<ServerConnection>>,
    /// close_notify has been queued.
    closing: Cell<bool>,
    /// The session failed (a bad record, a fatal alert): every later read
    /// says so at once, so no wait is ever made on a dead session.
    failed: Cell<bool>,
}

impl<S: Stream> TlsStream<S> {
    pub fn from_parts(sock: S, conn: Box<ServerConnection>) -> TlsStream<S> {
        TlsStream {
            sock,
            conn: RefCell::new(conn),
            closing: Cell::new(false),
            failed: Cell::new(false),
        }
    }

    /// The socket and the session, apart (to park an idle connection).
    pub fn into_parts(self) -> (S, Box<ServerConnection>) {
        (self.sock, self.conn.into_inner())
    }

    /// Writes queued ciphertext; `WouldBlock` while some is left.
    fn flush_tls(&self) -> io::Result<()> {
        let mut c = self.conn.borrow_mut();
        while c.wants_write() {
            if c.write_tls(&mut Wr(&self.sock))? == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }

    /// Whether decrypted bytes wait to be read (or an error to be seen).
    fn has_plaintext(&self) -> bool {
        if self.failed.get() {
            return true;
        }
        let r = self.conn.borrow_mut().process_new_packets();
        match r {
            Ok(s) => s.plaintext_bytes_to_read() > 0 || s.peer_has_closed(),
            Err(_) => {
                self.failed.set(true);
                true
            }
        }
    }

    /// Reads ciphertext from the socket and processes it. `Ok(false)`: the
    /// peer closed the socket.
    fn read_tls(&self) -> io::Result<bool> {
        let mut c = self.conn.borrow_mut();
        if c.read_tls(&mut Rd(&self.sock))? == 0 {
            return Ok(false);
        }
        if let Err(e) = c.process_new_packets() {
            self.failed.set(true);
            // The alert rustls queued goes out if the socket takes it.
            let _ = c.write_tls(&mut Wr(&self.sock));
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        Ok(true)
    }

    fn info(
        &self,
        server_name: Option<String>,
        offered: (Box<[rustls::CipherSuite]>, Box<[rustls::NamedGroup]>),
        session_id: [u8; 32],
        auth: Option<&ClientAuth>,
    ) -> TlsInfo {
        TlsInfo::of_server(&self.conn.borrow(), server_name, offered, session_id, auth)
    }
}

impl<S: Stream> AsRawFd for TlsStream<S> {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl<S: Stream> crate::io::SendSock for TlsStream<S> {
    fn writable(&self) -> impl std::future::Future<Output = io::Result<()>> {
        self.sock.writable()
    }
    fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        // Only raw writes (sendfile) come here, and the engine sends no
        // file to a TLS stream (`sendfile_ok`).
        self.sock.try_io(f)
    }
}

impl<S: Stream> Stream for TlsStream<S> {
    async fn readable(&self) -> io::Result<()> {
        if self.has_plaintext() {
            return Ok(());
        }
        // Pending output (a ticket, an alert reply) goes before the wait.
        let _ = self.flush_tls();
        self.sock.readable().await
    }
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.failed.get() {
                return Err(io::ErrorKind::InvalidData.into());
            }
            match self.conn.borrow_mut().reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Closed without close_notify: a plain end of stream here.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if !self.read_tls()? {
                return Ok(0);
            }
            // A key update or the like may want an answer.
            let _ = self.flush_tls();
        }
    }
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // Earlier ciphertext first: while the socket does not take it,
        // nothing new is accepted (so memory stays bounded).
        self.flush_tls()?;
        let n = self.conn.borrow_mut().writer().write_vectored(bufs)?;
        match self.flush_tls() {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(n),
        }
    }
    fn try_write_more(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.try_write_vectored(bufs)
    }
    fn try_flush(&self) -> io::Result<()> {
        self.flush_tls()
    }
    fn sendfile_ok(&self) -> bool {
        false
    }
    fn close(&self) {
        if !self.closing.replace(true) {
            self.conn.borrow_mut().send_close_notify();
            let _ = self.flush_tls();
        }
    }
    fn set_nodelay(&self, on: bool) {
        self.sock.set_nodelay(on)
    }
    fn set_cork(&self, on: bool) {
        self.sock.set_cork(on)
    }
    fn set_linger_zero(&self) {
        self.sock.set_linger_zero()
    }
    fn shutdown_write(&self) {
        // As nginx before a lingering close: close_notify, then the FIN.
        self.close();
        self.sock.shutdown_write()
    }
    fn is_registered(&self) -> bool {
        self.sock.is_registered()
    }
}

/// A plain-HTTP connection on an `ssl` listener whose first byte was
/// already read (to tell it from a ClientHello): that byte comes first.
pub struct Prefixed<S> {
    sock: S,
    first: Cell<Option<u8>>,
}

impl<S: Stream> AsRawFd for Prefixed<S> {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl<S: Stream> crate::io::SendSock for Prefixed<S> {
    fn writable(&self) -> impl std::future::Future<Output = io::Result<()>> {
        self.sock.writable()
    }
    fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.sock.try_io(f)
    }
}

impl<S: Stream> Stream for Prefixed<S> {
    async fn readable(&self) -> io::Result<()> {
        if self.first.get().is_some() {
            return Ok(());
        }
        self.sock.readable().await
    }
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(b) = self.first.get().filter(|_| !buf.is_empty()) else {
            return self.sock.try_read(buf);
        };
        self.first.set(None);
        buf[0] = b;
        match self.sock.try_read(&mut buf[1..]) {
            Ok(n) => Ok(n + 1),
            // What went wrong shows again on the next read.
            Err(_) => Ok(1),
        }
    }
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.sock.try_write_vectored(bufs)
    }
    fn try_write_more(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.sock.try_write_more(bufs)
    }
    fn set_nodelay(&self, on: bool) {
        self.sock.set_nodelay(on)
    }
    fn set_cork(&self, on: bool) {
        self.sock.set_cork(on)
    }
    fn set_linger_zero(&self) {
        self.sock.set_linger_zero()
    }
    fn shutdown_write(&self) {
        self.sock.shutdown_write()
    }
    fn is_registered(&self) -> bool {
        self.sock.is_registered()
    }
}

/// How [`accept`] ended.
pub enum Accepted<S> {
    Tls(TlsStream<S>, TlsInfo),
    /// Not TLS: plain HTTP to an `ssl` port.
    Plain(Prefixed<S>),
    /// Closed, timed out or failed (logged).
    Failed,
}

/// Why a wait in the handshake ended without bytes.
enum WaitEnd {
    TimedOut,
    Failed,
}

async fn wait_readable<S: Stream>(sock: &S, deadline: Instant) -> Result<(), WaitEnd> {
    match tokio::time::timeout_at(deadline, sock.readable()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(WaitEnd::Failed),
        Err(_) => Err(WaitEnd::TimedOut),
    }
}

/// The TLS handshake of a connection accepted on an `ssl` address,
/// within `deadline` (client_header_timeout, as nginx's handshake). The
/// server whose `server_name` matches the SNI name (as for `Host`)
/// provides the certificate and settings; without SNI, or when that
/// server has no certificate, the address's default server does.
pub async fn accept<S: Stream>(
    sock: S,
    addr: &AddrConf,
    vars: &crate::http::vars::VarTable,
    info: &ConnInfo,
    deadline: Instant,
) -> Accepted<S> {
    let log = |msg: &str| log_conn(&addr.default.conf, Level::Info, info, msg);
    let timed_out = || log("client timed out (110: Connection timed out) while SSL handshaking");
    // nginx's test: a TLS record (0x16) or an SSLv2 hello (high bit).
    let mut first = [0u8; 1];
    loop {
        match sock.try_read(&mut first) {
            Ok(0) => return Accepted::Failed,
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match wait_readable(&sock, deadline).await {
                    Ok(()) => {}
                    Err(WaitEnd::TimedOut) => {
                        timed_out();
                        return Accepted::Failed;
                    }
                    Err(WaitEnd::Failed) => return Accepted::Failed,
                }
            }
            Err(_) => return Accepted::Failed,
        }
    }
    if first[0] != 0x16 && first[0] & 0x80 == 0 {
        return Accepted::Plain(Prefixed {
            sock,
            first: Cell::new(Some(first[0])),
        });
    }
    let mut acc = Acceptor::default();
    if acc.read_tls(&mut &first[..]).is_err() {
        return Accepted::Failed;
    }
    let hello = loop {
        match acc.accept() {
            Ok(Some(a)) => break a,
            Ok(None) => {}
            Err((e, mut alert)) => {
                let _ = alert.write_all(&mut Wr(&sock));
                log(&format!(
                    "SSL_do_handshake() failed ({}) while SSL handshaking",
                    e
                ));
                return Accepted::Failed;
            }
        }
        loop {
            match acc.read_tls(&mut Rd(&sock)) {
                Ok(0) => {
                    log("peer closed connection in SSL handshake while SSL handshaking");
                    return Accepted::Failed;
                }
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match wait_readable(&sock, deadline).await {
                        Ok(()) => {}
                        Err(WaitEnd::TimedOut) => {
                            timed_out();
                            return Accepted::Failed;
                        }
                        Err(WaitEnd::Failed) => return Accepted::Failed,
                    }
                }
                Err(_) => return Accepted::Failed,
            }
        }
    };
    let ch = hello.client_hello();
    let server_name = ch.server_name().map(str::to_string);
    let offered = (
        ch.cipher_suites().into(),
        ch.named_groups().unwrap_or_default().into(),
    );
    let server = match &server_name {
        Some(n) => addr.select(Some(n.as_bytes())),
        None => &addr.default,
    };
    let ssl = if server.srv.ssl.tls.is_some() || server.srv.ssl.reject_handshake == Some(true) {
        &server.srv.ssl
    } else {
        &addr.default.srv.ssl
    };
    if ssl.reject_handshake.unwrap_or(false) {
        // nginx: the handshake fails with an "unrecognized_name" alert.
        let _ = Wr(&sock).write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70]);
        log("SSL_do_handshake() failed (SSL: error:0A0000EA:SSL routines::callback failed) while SSL handshaking");
        return Accepted::Failed;
    }
    let Some(mut cfg) = ssl.tls.clone() else {
        return Accepted::Failed;
    };
    if let Some(v) = &ssl.var_certs {
        // Certificates with variables: loaded for this handshake; one
        // that cannot be loaded fails it (no certificate to offer).
        let cx = crate::tls::var_certs::HandshakeVars {
            conn: info,
            server_name: server_name.as_deref(),
            vars,
        };
        let pairs = match v.load(&cx).await {
            Ok(p) => p,
            Err(msg) => {
                log_conn(
                    &addr.default.conf,
                    Level::Error,
                    info,
                    &format!("{} while SSL handshaking", msg),
                );
                Vec::new()
            }
        };
        cfg = v.server_config(&cfg, pairs);
    }
    let auth = ssl.client_auth.clone();
    // The ClientHello is processed here (and a TLS 1.2 resumption
    // answered): see sessions::client_hello.
    let mut conn = match crate::tls::sessions::client_hello(|| hello.into_connection(cfg)) {
        Ok(c) => c,
        Err((e, mut alert)) => {
            let _ = alert.write_all(&mut Wr(&sock));
            log(&format!(
                "SSL_do_handshake() failed ({}) while SSL handshaking",
                e
            ));
            return Accepted::Failed;
        }
    };
    // A resumed session brings its id back; a new one gets a fresh id
    // (a random one: clients see it, nothing trusts it).
    let session_id = match conn.received_resumption_data() {
        Some(d) if d.len() == 32 => {
            let mut id = [0u8; 32];
            id.copy_from_slice(d);
            id
        }
        _ => {
            let mut id = [0u8; 32];
            let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id);
            conn.set_resumption_data(&id);
            id
        }
    };
    let tls = TlsStream::from_parts(sock, Box::new(conn));
    loop {
        match tls.flush_tls() {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match tokio::time::timeout_at(deadline, tls.sock.writable()).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(_)) => return Accepted::Failed,
                    Err(_) => {
                        timed_out();
                        return Accepted::Failed;
                    }
                }
            }
            Err(_) => return Accepted::Failed,
        }
        if !tls.conn.borrow().is_handshaking() {
            break;
        }
        match tls.read_tls() {
            Ok(true) => {}
            Ok(false) => {
                log("peer closed connection in SSL handshake while SSL handshaking");
                return Accepted::Failed;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                match wait_readable(&tls.sock, deadline).await {
                    Ok(()) => {}
                    Err(WaitEnd::TimedOut) => {
                        timed_out();
                        return Accepted::Failed;
                    }
                    Err(WaitEnd::Failed) => return Accepted::Failed,
                }
            }
            Err(e) => {
                let _ = tls.flush_tls();
                log(&format!(
                    "SSL_do_handshake() failed ({}) while SSL handshaking",
                    e
                ));
                return Accepted::Failed;
            }
        }
    }
    let mut info = tls.info(server_name, offered, session_id, auth.as_deref());
    // `ssl_ocsp`: the responders are asked about a chain found good.
    if let (Some(a), Some(chain), Ok(())) = (auth.as_deref(), &info.client_chain, info.verify) {
        if let Some(o) = &a.ocsp {
            info.verify = crate::tls::ocsp::check(o, chain, a.store(), &log).await;
        }
    }
    Accepted::Tls(tls, info)
}
