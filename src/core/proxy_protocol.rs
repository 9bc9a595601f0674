//! The PROXY protocol (versions 1 and 2): reading the header a load
//! balancer puts before a connection's data (`listen ... proxy_protocol`,
//! in http and stream alike) and writing a version 1 header toward an
//! upstream (stream's `proxy_protocol on`).
//!
//! Reading is bounded: at most [`MAX_V1`] bytes for a text header, or the
//! 16-byte binary prefix plus its stated length (at most [`MAX_V2`]); a
//! header that is not one of these is an error (nginx's "broken header").
//! [`parse`] works on bytes already read; [`read_buffered`] reads a
//! stream or mail client until its header is complete, keeping what
//! followed it for the session; [`read_header`] takes exactly the
//! header's bytes off an accepted http socket by peeking first, so the TLS
//! handshake or the HTTP parser that comes next reads the socket as if
//! the header had never been there.
//!
//! A version 2 header's TLVs (the bytes after the addresses) are kept raw
//! and looked up when a `$proxy_protocol_tlv_*` variable asks ([`PpVar`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// nginx's limit for a version 1 line, CRLF included.
pub const MAX_V1: usize = 107;
/// What tern accepts for a version 2 header's address and TLV part.
pub const MAX_V2: usize = 4096;

const SIG_V2: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// The addresses a PROXY header carried (None for `UNKNOWN`/`LOCAL`, an
/// unsupported family or transport: nginx then keeps no header at all).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Header {
    pub src: Option<(IpAddr, u16)>,
    pub dst: Option<(IpAddr, u16)>,
    /// A version 2 header's TLV part, as sent.
    pub tlvs: Vec<u8>,
    /// A version 1 line's address texts as sent (nginx's
    /// `$proxy_protocol_addr` shows them so; a version 2 header's are
    /// printed from the binary address).
    pub text: Option<(String, String)>,
}

/// What a parse attempt over the bytes read so far says.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// More bytes are needed.
    Partial,
    /// A header of `len` bytes.
    Done(Header, usize),
    /// Not a valid header; the text is what nginx logs after "broken header:".
    Broken,
}

/// Parses the start of `buf`.
pub fn parse(buf: &[u8]) -> Parsed {
    if buf.is_empty() {
        return Parsed::Partial;
    }
    if buf[0] == b'\r' {
        return parse_v2(buf);
    }
    let want = b"PROXY ";
    let n = buf.len().min(want.len());
    if buf[..n] != want[..n] {
        return Parsed::Broken;
    }
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() >= MAX_V1 {
            return Parsed::Broken;
        }
        return Parsed::Partial;
    };
    if end + 2 > MAX_V1 {
        return Parsed::Broken;
    }
    match parse_v1(&buf[6..end]) {
        Some(h) => Parsed::Done(h, end + 2),
        None => Parsed::Broken,
    }
}

fn parse_v1(line: &[u8]) -> Option<Header> {
    let line = std::str::from_utf8(line).ok()?;
    if line.starts_with("UNKNOWN") {
        return Some(Header::default());
    }
    let mut it = line.split(' ');
    let fam = it.next()?;
    let src_s = it.next()?;
    let dst_s = it.next()?;
    let src: IpAddr = src_s.parse().ok()?;
    let dst: IpAddr = dst_s.parse().ok()?;
    let sport: u16 = port(it.next()?)?;
    let dport: u16 = port(it.next()?)?;
    if it.next().is_some() {
        return None;
    }
    let ok = match fam {
        "TCP4" => src.is_ipv4() && dst.is_ipv4(),
        "TCP6" => src.is_ipv6() && dst.is_ipv6(),
        _ => false,
    };
    ok.then(|| Header {
        src: Some((src, sport)),
        dst: Some((dst, dport)),
        tlvs: Vec::new(),
        text: Some((src_s.to_string(), dst_s.to_string())),
    })
}

/// A decimal port as nginx reads it: digits only, at most 65535.
fn port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_v2(buf: &[u8]) -> Parsed {
    let n = buf.len().min(SIG_V2.len());
    if buf[..n] != SIG_V2[..n] {
        return Parsed::Broken;
    }
    if buf.len() < 16 {
        return Parsed::Partial;
    }
    let ver_cmd = buf[12];
    if ver_cmd >> 4 != 2 {
        return Parsed::Broken;
    }
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if len > MAX_V2 {
        return Parsed::Broken;
    }
    if buf.len() < 16 + len {
        return Parsed::Partial;
    }
    let body = &buf[16..16 + len];
    let total = 16 + len;
    let none = Header::default();
    match ver_cmd & 0x0f {
        // LOCAL: the connection's own addresses stand.
        0 => return Parsed::Done(none, total),
        1 => {}
        _ => return Parsed::Broken,
    }
    // Only a stream transport carries addresses nginx takes.
    if buf[13] & 0x0f != 1 {
        return Parsed::Done(none, total);
    }
    let h = match buf[13] >> 4 {
        1 if body.len() >= 12 => {
            let ip = |b: &[u8]| IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
            Header {
                src: Some((ip(&body[0..4]), u16::from_be_bytes([body[8], body[9]]))),
                dst: Some((ip(&body[4..8]), u16::from_be_bytes([body[10], body[11]]))),
                tlvs: body[12..].to_vec(),
                text: None,
            }
        }
        2 if body.len() >= 36 => {
            let ip = |b: &[u8]| {
                let mut o = [0u8; 16];
                o.copy_from_slice(&b[..16]);
                IpAddr::V6(Ipv6Addr::from(o))
            };
            Header {
                src: Some((ip(&body[0..16]), u16::from_be_bytes([body[32], body[33]]))),
                dst: Some((ip(&body[16..32]), u16::from_be_bytes([body[34], body[35]]))),
                tlvs: body[36..].to_vec(),
                text: None,
            }
        }
        1 | 2 => return Parsed::Broken,
        // AF_UNSPEC, AF_UNIX: no addresses to take.
        _ => none,
    };
    Parsed::Done(h, total)
}

/// The version 1 line nginx sends upstream for a client (`src`) that
/// connected to `dst`; `UNKNOWN` when either is not an inet address or
/// they are of different families.
pub fn v1_line(src: Option<SocketAddr>, dst: Option<SocketAddr>) -> Vec<u8> {
    match (src, dst) {
        (Some(s), Some(d)) if s.is_ipv4() == d.is_ipv4() => format!(
            "PROXY {} {} {} {} {}\r\n",
            if s.is_ipv4() { "TCP4" } else { "TCP6" },
            s.ip(),
            d.ip(),
            s.port(),
            d.port()
        )
        .into_bytes(),
        _ => b"PROXY UNKNOWN\r\n".to_vec(),
    }
}

/// A `$proxy_protocol_*` variable (http and stream name them alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PpVar {
    Addr,
    Port,
    ServerAddr,
    ServerPort,
    /// `$proxy_protocol_tlv_NAME` (nginx 1.23.2): the part after the prefix.
    Tlv(String),
}

impl PpVar {
    /// The variable a name stands for, if it is one of these.
    pub fn by_name(name: &str) -> Option<PpVar> {
        Some(match name {
            "proxy_protocol_addr" => PpVar::Addr,
            "proxy_protocol_port" => PpVar::Port,
            "proxy_protocol_server_addr" => PpVar::ServerAddr,
            "proxy_protocol_server_port" => PpVar::ServerPort,
            _ => PpVar::Tlv(name.strip_prefix("proxy_protocol_tlv_")?.to_string()),
        })
    }
}

impl Header {
    /// Appends the value of `v`; false when it has none (nginx's "not
    /// found": no addresses, a TLV that is not there or not valid).
    pub fn render(&self, v: &PpVar, out: &mut Vec<u8>) -> bool {
        let addr = |a: Option<(IpAddr, u16)>, text: Option<&String>, out: &mut Vec<u8>| {
            let Some((ip, _)) = a else { return false };
            match text {
                Some(t) => out.extend_from_slice(t.as_bytes()),
                None => out.extend_from_slice(ip.to_string().as_bytes()),
            }
            true
        };
        let port = |a: Option<(IpAddr, u16)>, out: &mut Vec<u8>| {
            let Some((_, p)) = a else { return false };
            // nginx prints a port only when it is one (1-65535).
            if p > 0 {
                out.extend_from_slice(p.to_string().as_bytes());
            }
            true
        };
        match v {
            PpVar::Addr => addr(self.src, self.text.as_ref().map(|t| &t.0), out),
            PpVar::Port => port(self.src, out),
            PpVar::ServerAddr => addr(self.dst, self.text.as_ref().map(|t| &t.1), out),
            PpVar::ServerPort => port(self.dst, out),
            PpVar::Tlv(name) => match self.tlv(name) {
                Some(val) => {
                    out.extend_from_slice(&val);
                    true
                }
                None => false,
            },
        }
    }

    /// The value of the TLV nginx's `$proxy_protocol_tlv_NAME` names:
    /// `alpn`, `authority`, `unique_id`, `netns`, `ssl` or `0xHH` among
    /// the header's TLVs; `ssl_version`, `ssl_cn`, `ssl_cipher`,
    /// `ssl_sig_alg`, `ssl_key_alg` or `ssl_0xHH` among the sub-TLVs of the
    /// SSL TLV, and `ssl_verify`, its verify field in decimal.
    pub fn tlv(&self, name: &str) -> Option<Vec<u8>> {
        const TOP: &[(&str, u8)] = &[
            ("alpn", 0x01),
            ("authority", 0x02),
            ("unique_id", 0x05),
            ("ssl", 0x20),
            ("netns", 0x30),
        ];
        const SSL: &[(&str, u8)] = &[
            ("version", 0x21),
            ("cn", 0x22),
            ("cipher", 0x23),
            ("sig_alg", 0x24),
            ("key_alg", 0x25),
        ];
        let (area, table, name): (&[u8], _, &str) = match name.strip_prefix("ssl_") {
            Some(sub) => {
                let ssl = find_tlv(&self.tlvs, 0x20)?;
                // The SSL TLV: client (1 byte), verify (4), sub-TLVs.
                if ssl.len() < 5 {
                    return None;
                }
                if sub == "verify" {
                    let v = u32::from_be_bytes([ssl[1], ssl[2], ssl[3], ssl[4]]);
                    return Some(v.to_string().into_bytes());
                }
                (&ssl[5..], SSL, sub)
            }
            None => (&self.tlvs, TOP, name),
        };
        let ty = match name.strip_prefix("0x") {
            Some(hex) => {
                let t = u32::from_str_radix(hex, 16)
                    .ok()
                    .filter(|_| !hex.is_empty())?;
                u8::try_from(t).ok()?
            }
            None => table.iter().find(|(n, _)| *n == name)?.1,
        };
        find_tlv(area, ty).map(<[u8]>::to_vec)
    }
}

/// The value of the first TLV of type `ty` in `area`; None when there is
/// none or the list is broken before it (nginx: "broken PROXY protocol TLV").
fn find_tlv(mut area: &[u8], ty: u8) -> Option<&[u8]> {
    while !area.is_empty() {
        if area.len() < 3 {
            return None;
        }
        let len = usize::from(u16::from_be_bytes([area[1], area[2]]));
        let val = area.get(3..3 + len)?;
        if area[0] == ty {
            return Some(val);
        }
        area = &area[3 + len..];
    }
    None
}

/// Reads a client's PROXY header within `timeout`, through `buf` (empty
/// or holding what was read before): the header's bytes are taken off
/// `buf`, and whatever followed them stays there for the session (the
/// stream and mail modules, whose sockets are read, not peeked). The
/// error is nginx's error-log text.
pub async fn read_buffered<R: tokio::io::AsyncRead + Unpin>(
    client: &mut R,
    buf: &mut Vec<u8>,
    timeout: std::time::Duration,
) -> Result<Header, String> {
    use tokio::io::AsyncReadExt;
    let read = async {
        let mut chunk = [0u8; 512];
        loop {
            match parse(buf) {
                Parsed::Done(h, n) => {
                    buf.drain(..n);
                    return Ok(h);
                }
                Parsed::Broken => {
                    let end = buf.len().min(MAX_V1);
                    return Err(format!(
                        "broken header: \"{}\"",
                        String::from_utf8_lossy(&buf[..end])
                    ));
                }
                Parsed::Partial => {}
            }
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    return Err(
                        "client closed connection while reading PROXY protocol header".to_string(),
                    )
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(
            "client timed out (110: Connection timed out) while reading PROXY protocol header"
                .to_string(),
        ),
    }
}

/// Why [`read_header`] gave up.
#[derive(Debug)]
pub enum ReadError {
    /// The client closed the connection (or reset it) first.
    Closed,
    /// Not a PROXY header: nginx's error-log text ("broken header: ...").
    Broken(String),
}

/// Takes a PROXY header off an accepted socket: exactly its bytes, by
/// peeking first, so whatever the client sent after it stays in the
/// socket for the TLS handshake or the HTTP parser. A header that arrives
/// in pieces is waited for (the caller bounds the wait: nginx reads it
/// within `client_header_timeout`).
pub async fn read_header<T: crate::core::sock::Registrable>(
    s: &crate::core::sock::LazySock<T>,
) -> Result<Header, ReadError>
where
    for<'a> &'a T::Std: std::io::Read + std::io::Write,
{
    // Header bytes already taken off the socket (a header split across
    // reads), then what the last peek saw after them.
    let mut taken = 0usize;
    let mut buf = vec![0u8; 16 + MAX_V2];
    loop {
        let n = s
            .peek(&mut buf[taken..])
            .await
            .map_err(|_| ReadError::Closed)?;
        if n == 0 {
            return Err(ReadError::Closed);
        }
        let seen = taken + n;
        let take = match parse(&buf[..seen]) {
            Parsed::Done(h, len) => {
                take_exact(s, &mut buf[taken..len])?;
                return Ok(h);
            }
            Parsed::Broken => {
                // nginx logs what it read, whole (a first read of up to
                // client_header_buffer_size). Taken off the socket as nginx
                // took it, so that the close is a FIN, not a reset.
                let _ = take_exact(s, &mut buf[taken..seen]);
                let end = seen.min(1024);
                return Err(ReadError::Broken(format!(
                    "broken header: \"{}\"",
                    String::from_utf8_lossy(&buf[..end])
                )));
            }
            // Everything seen belongs to the header: take it, wait for more.
            Parsed::Partial => seen,
        };
        take_exact(s, &mut buf[taken..take])?;
        taken = take;
        if taken >= buf.len() {
            return Err(ReadError::Broken("broken header: \"\"".into()));
        }
    }
}

/// Reads exactly `buf.len()` bytes that a peek has shown are there.
fn take_exact<S: crate::core::stream::Stream>(s: &S, buf: &mut [u8]) -> Result<(), ReadError> {
    let mut got = 0;
    while got < buf.len() {
        match s.try_read(&mut buf[got..]) {
            Ok(0) | Err(_) => return Err(ReadError::Closed),
            Ok(n) => got += n,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_lines() {
        let b = b"PROXY TCP4 192.0.2.1 192.0.2.2 1234 5678\r\nrest";
        match parse(b) {
            Parsed::Done(h, n) => {
                assert_eq!(n, b.len() - 4);
                assert_eq!(h.src, Some(("192.0.2.1".parse().unwrap(), 1234)));
                assert_eq!(h.dst, Some(("192.0.2.2".parse().unwrap(), 5678)));
            }
            p => panic!("{:?}", p),
        }
        assert_eq!(parse(b"PROXY TCP4 192.0.2.1"), Parsed::Partial);
        assert_eq!(parse(b"GET / HTTP/1.0\r\n"), Parsed::Broken);
        assert_eq!(parse(b"PROXY TCP4 ::1 ::1 1 2\r\n"), Parsed::Broken);
        assert!(matches!(
            parse(b"PROXY UNKNOWN TCP4 1.2.3.4\r\n"),
            Parsed::Done(Header { src: None, .. }, _)
        ));
        let long = [b'A'; 200];
        assert_eq!(parse(&long), Parsed::Broken);
    }

    #[test]
    fn v2_header() {
        let mut b = SIG_V2.to_vec();
        b.extend_from_slice(&[0x21, 0x11, 0, 12, 10, 0, 0, 1, 10, 0, 0, 2, 0, 80, 1, 187]);
        assert_eq!(parse(&b[..20]), Parsed::Partial);
        match parse(&b) {
            Parsed::Done(h, n) => {
                assert_eq!(n, 28);
                assert_eq!(h.src, Some(("10.0.0.1".parse().unwrap(), 80)));
                assert_eq!(h.dst, Some(("10.0.0.2".parse().unwrap(), 443)));
            }
            p => panic!("{:?}", p),
        }
    }

    #[test]
    fn tlvs_by_name() {
        let mut ssl = vec![0x01, 0, 0, 0, 255];
        ssl.extend_from_slice(b"\x21\x00\x07TLSv1.2\x22\x00\x02cn");
        let mut tlvs = b"\x01\x00\x02h2\x03\x00\x044321\x20".to_vec();
        tlvs.extend_from_slice(&(ssl.len() as u16).to_be_bytes());
        tlvs.extend_from_slice(&ssl);
        let h = Header {
            src: Some(("192.0.2.1".parse().unwrap(), 1)),
            tlvs,
            ..Header::default()
        };
        let get = |n: &str| h.tlv(n).map(|v| String::from_utf8_lossy(&v).into_owned());
        assert_eq!(get("alpn").as_deref(), Some("h2"));
        assert_eq!(get("0x01").as_deref(), Some("h2"));
        assert_eq!(get("0x3").as_deref(), Some("4321"));
        assert_eq!(get("0x0003").as_deref(), Some("4321"));
        assert_eq!(get("ssl_verify").as_deref(), Some("255"));
        assert_eq!(get("ssl_version").as_deref(), Some("TLSv1.2"));
        assert_eq!(get("ssl_0x22").as_deref(), Some("cn"));
        assert_eq!(get("ssl_cipher"), None);
        assert_eq!(get("netns"), None);
        assert_eq!(get("nonsense"), None);
        assert_eq!(get("0x"), None);
        // A TLV list cut short is read up to the break, never past it.
        let cut = Header {
            tlvs: b"\x01\x00\x09h2".to_vec(),
            ..Header::default()
        };
        assert_eq!(cut.tlv("alpn"), None);
        let mut out = Vec::new();
        assert!(!cut.render(&PpVar::Addr, &mut out));
        assert_eq!(
            PpVar::by_name("proxy_protocol_tlv_alpn"),
            Some(PpVar::Tlv("alpn".into()))
        );
        assert_eq!(PpVar::by_name("proxy_protocol_x"), None);
    }

    #[test]
    fn v1_out() {
        let s = "127.0.0.1:5".parse().ok();
        let d = "127.0.0.2:6".parse().ok();
        assert_eq!(v1_line(s, d), b"PROXY TCP4 127.0.0.1 127.0.0.2 5 6\r\n");
        assert_eq!(v1_line(None, d), b"PROXY UNKNOWN\r\n");
    }
}
