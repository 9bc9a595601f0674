//! `ssl_preread`: read the TLS ClientHello without terminating TLS, so
//! that `$ssl_preread_server_name`, `$ssl_preread_alpn_protocols` and
//! `$ssl_preread_protocol` can route the session (through `map` and
//! `proxy_pass $var`).
//!
//! The bytes read are not consumed: the session relays them to the
//! upstream first. Reading stops at the end of the ClientHello, at
//! `preread_buffer_size` bytes, or at `preread_timeout`; what was not a
//! ClientHello leaves the variables empty (nginx's "declined"), and the
//! session goes on.

use tokio::io::AsyncReadExt;

use crate::config::registry::{flag, row, set_once, Args};
use crate::config::{ConfResult, Directive};
use crate::core::conf::Compiler;
use crate::core::log::Level;
use crate::stream::conf::{ProxyConf, StreamSetter, StreamSpec, SS};
use crate::stream::proxy::Sock;
use crate::stream::session::Session;

/// What a ClientHello told.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Hello {
    pub server_name: Vec<u8>,
    /// ALPN protocols, comma-separated.
    pub alpn: Vec<u8>,
    /// "TLSv1.2", "TLSv1.3", ...: the highest version the client offers.
    pub protocol: &'static str,
}

/// What the bytes read so far are.
#[derive(Debug, PartialEq, Eq)]
pub enum Preread {
    /// Not all of the ClientHello yet.
    Partial,
    Done(Hello),
    /// Not a TLS ClientHello.
    NotTls,
}

fn version_name(v: u16) -> &'static str {
    match v {
        0x0300 => "SSLv3",
        0x0301 => "TLSv1",
        0x0302 => "TLSv1.1",
        0x0303 => "TLSv1.2",
        0x0304 => "TLSv1.3",
        // Drafts of TLS 1.3 (0x7fXX).
        v if v >> 8 == 0x7f => "TLSv1.3",
        _ => "",
    }
}

/// Parses the handshake records at the start of `buf`.
pub fn parse(buf: &[u8]) -> Preread {
    // An SSLv2-framed ClientHello (two-byte header with the high bit set,
    // message type 1): only the version is there to read.
    if buf.first().is_some_and(|&b| b & 0x80 != 0) {
        if buf.len() < 5 {
            return Preread::Partial;
        }
        if buf[2] != 1 {
            return Preread::NotTls;
        }
        let v = u16::from_be_bytes([buf[3], buf[4]]);
        return Preread::Done(Hello {
            protocol: if v == 0x0002 {
                "SSLv2"
            } else {
                version_name(v)
            },
            ..Default::default()
        });
    }
    // Gather the handshake bytes from consecutive handshake records.
    let mut hs = Vec::new();
    let mut rest = buf;
    let mut record_version = 0u16;
    loop {
        if rest.len() < 5 {
            if rest.first().is_some_and(|&t| t != 0x16) {
                return Preread::NotTls;
            }
            break;
        }
        if rest[0] != 0x16 || rest[1] != 3 {
            return Preread::NotTls;
        }
        record_version = u16::from_be_bytes([rest[1], rest[2]]);
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        let avail = (rest.len() - 5).min(len);
        hs.extend_from_slice(&rest[5..5 + avail]);
        if avail < len {
            break;
        }
        rest = &rest[5 + len..];
        if hs.len() >= 4 {
            let need =
                4 + (usize::from(hs[1]) << 16 | usize::from(hs[2]) << 8 | usize::from(hs[3]));
            if hs.len() >= need {
                break;
            }
        }
    }
    if hs.len() < 4 {
        return Preread::Partial;
    }
    if hs[0] != 1 {
        return Preread::NotTls;
    }
    let need = 4 + (usize::from(hs[1]) << 16 | usize::from(hs[2]) << 8 | usize::from(hs[3]));
    if hs.len() < need {
        return Preread::Partial;
    }
    match hello(&hs[4..need], record_version) {
        Some(h) => Preread::Done(h),
        None => Preread::NotTls,
    }
}

/// A cursor over a ClientHello body.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
}

fn hello(body: &[u8], _record_version: u16) -> Option<Hello> {
    let mut c = Cur(body);
    let client_version = c.u16()? as u16;
    c.take(32)?;
    let n = c.u8()?;
    c.take(n)?;
    let n = c.u16()?;
    c.take(n)?;
    let n = c.u8()?;
    c.take(n)?;
    let mut h = Hello {
        protocol: version_name(client_version),
        ..Default::default()
    };
    if c.0.is_empty() {
        return Some(h);
    }
    let n = c.u16()?;
    let mut ext = Cur(c.take(n.min(c.0.len()))?);
    while !ext.0.is_empty() {
        let ty = ext.u16()?;
        let n = ext.u16()?;
        // A length past the end takes what is there, as nginx's byte-wise
        // parser does.
        let mut e = Cur(ext.take(n.min(ext.0.len()))?);
        match ty {
            0 => {
                let n = e.u16()?;
                let mut list = Cur(e.take(n)?);
                while !list.0.is_empty() {
                    let kind = list.u8()?;
                    let n = list.u16()?;
                    let name = list.take(n)?;
                    if kind == 0 && h.server_name.is_empty() {
                        h.server_name = name.to_vec();
                    }
                }
            }
            16 => {
                let n = e.u16()?;
                let mut list = Cur(e.take(n)?);
                while !list.0.is_empty() {
                    let n = list.u8()?;
                    let p = list.take(n)?;
                    if !h.alpn.is_empty() {
                        h.alpn.push(b',');
                    }
                    h.alpn.extend_from_slice(p);
                }
            }
            43 => {
                let n = e.u8()?;
                let mut list = Cur(e.take(n)?);
                let mut best = 0u16;
                while !list.0.is_empty() {
                    let v = list.u16()? as u16;
                    // Skip GREASE and unknown values.
                    let known = (0x0300..=0x0304).contains(&v) || v >> 8 == 0x7f;
                    let rank = |v: u16| if v >> 8 == 0x7f { 0x0304 } else { v };
                    if known && rank(v) > rank(best) {
                        best = v;
                    }
                }
                if best != 0 {
                    h.protocol = version_name(best);
                }
            }
            _ => {}
        }
    }
    Some(h)
}

/// The ssl_preread module's directive.
pub const DIRECTIVES: &[StreamSpec] = &[row!(
    "ssl_preread",
    SS,
    Args::Flag,
    StreamSetter::Proxy(set_ssl_preread)
)];

fn set_ssl_preread(p: &mut ProxyConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    let v = flag(d)?;
    set_once(&mut p.ssl_preread, v, d)
}

/// The preread phase with `ssl_preread on`: the ClientHello's SNI name,
/// ALPN list and version for the variables, its name selecting the
/// server as a handshake's would. Bytes read (not peeked) are returned
/// after `pre`, to go to the upstream first. None when the session ended
/// here (the buffer filled: 400; the timeout: 200, as nginx).
pub async fn phase(s: &mut Session, mut client: Sock, mut pre: Vec<u8>) -> Option<(Sock, Vec<u8>)> {
    let srv = s.srv.clone();
    // A plain TCP socket is only peeked at, as nginx 1.25.5 does: the
    // ClientHello stays in the socket for whoever comes next (`proxy_pass`
    // relays it, `pass` hands it over untouched). Through TLS, or after
    // bytes were read ahead, it is read.
    let peek = matches!(client, Sock::Tcp(_)) && pre.is_empty();
    let mut peeked: Vec<u8> = Vec::new();
    let read = async {
        loop {
            let seen = if peek { &peeked } else { &pre };
            match parse(seen) {
                Preread::Done(h) => return Ok(Some(h)),
                Preread::NotTls => return Ok(None),
                Preread::Partial => {}
            }
            if seen.len() >= srv.preread_buffer_size {
                return Err(());
            }
            if let (true, Sock::Tcp(t)) = (peek, &client) {
                match peek_more(t, peeked.len(), srv.preread_buffer_size).await {
                    Some(v) => peeked = v,
                    None => return Ok(None),
                }
                continue;
            }
            let mut chunk = vec![0u8; srv.preread_buffer_size - pre.len()];
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => return Ok(None),
                Ok(n) => {
                    s.bytes_received += n as u64;
                    pre.extend_from_slice(&chunk[..n]);
                }
            }
        }
    };
    match tokio::time::timeout(srv.preread_timeout, read).await {
        Ok(Ok(h)) => {
            // The SNI name selects the server, as in a handshake.
            if let Some(name) = h.as_ref().map(|h| h.server_name.clone()) {
                if !name.is_empty() && s.tls.is_none() {
                    s.select_server(&name);
                }
            }
            s.hello = h;
            Some((client, pre))
        }
        Ok(Err(())) => {
            s.log(
                Level::Error,
                format_args!("preread buffer full, {}", s.client_ctx()),
            );
            s.status = 400;
            None
        }
        // nginx ends the session when the preread times out, with 200.
        Err(_) => None,
    }
}

/// Peeks at what a TCP client has sent (up to `size` bytes) once more
/// than `seen` bytes are there; None at the end of the stream or on an
/// error. Readiness is cleared when nothing new has come, so the wait is
/// for new bytes, not a spin over the old ones.
async fn peek_more(t: &tokio::net::TcpStream, seen: usize, size: usize) -> Option<Vec<u8>> {
    use std::task::{Context, Poll, Waker};
    let mut buf = vec![0u8; size];
    loop {
        let ready = t.ready(tokio::io::Interest::READABLE).await.ok()?;
        let r = t.try_io(tokio::io::Interest::READABLE, || {
            let mut rb = tokio::io::ReadBuf::new(&mut buf);
            match t.poll_peek(&mut Context::from_waker(Waker::noop()), &mut rb) {
                Poll::Ready(Ok(n)) if n == 0 || n > seen => Ok(n),
                Poll::Ready(Ok(_)) | Poll::Pending => Err(std::io::ErrorKind::WouldBlock.into()),
                Poll::Ready(Err(e)) => Err(e),
            }
        });
        match r {
            Ok(0) => return None,
            Ok(n) => {
                buf.truncate(n);
                return Some(buf);
            }
            // Nothing new, and the client has finished sending.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && ready.is_read_closed() => {
                return None
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello with SNI "foo", ALPN h2,http/1.1 and TLS 1.3 offered.
    fn sample() -> Vec<u8> {
        let mut exts = Vec::new();
        // server_name
        let name = b"foo";
        let mut sni = vec![0u8];
        sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni.extend_from_slice(name);
        let mut list = (sni.len() as u16).to_be_bytes().to_vec();
        list.extend_from_slice(&sni);
        exts.extend_from_slice(&[0, 0]);
        exts.extend_from_slice(&(list.len() as u16).to_be_bytes());
        exts.extend_from_slice(&list);
        // ALPN
        let mut protos = Vec::new();
        for p in [&b"h2"[..], b"http/1.1"] {
            protos.push(p.len() as u8);
            protos.extend_from_slice(p);
        }
        let mut alpn = (protos.len() as u16).to_be_bytes().to_vec();
        alpn.extend_from_slice(&protos);
        exts.extend_from_slice(&[0, 16]);
        exts.extend_from_slice(&(alpn.len() as u16).to_be_bytes());
        exts.extend_from_slice(&alpn);
        // supported_versions
        exts.extend_from_slice(&[0, 43, 0, 5, 4, 0x7a, 0x7a, 3, 4]);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[0u8; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![1, 0];
        hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn client_hello_fields() {
        let r = sample();
        let Preread::Done(h) = parse(&r) else {
            panic!("parsed");
        };
        assert_eq!(h.server_name, b"foo");
        assert_eq!(h.alpn, b"h2,http/1.1");
        assert_eq!(h.protocol, "TLSv1.3");
        assert_eq!(parse(&r[..20]), Preread::Partial);
        assert_eq!(parse(b"GET / HTTP/1.0\r\n"), Preread::NotTls);
        let v2 = [0x80, 0x1c, 0x01, 0x00, 0x02, 0, 3];
        assert!(matches!(parse(&v2), Preread::Done(h) if h.protocol == "SSLv2"));
    }

    #[test]
    fn split_across_records() {
        let r = sample();
        let hs = &r[5..];
        let (a, b) = hs.split_at(10);
        let mut two = vec![0x16, 3, 1, 0, a.len() as u8];
        two.extend_from_slice(a);
        two.extend_from_slice(&[0x16, 3, 1]);
        two.extend_from_slice(&(b.len() as u16).to_be_bytes());
        two.extend_from_slice(b);
        assert!(matches!(parse(&two), Preread::Done(h) if h.server_name == b"foo"));
    }
}
