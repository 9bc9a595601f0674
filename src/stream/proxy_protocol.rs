//! The PROXY protocol (versions 1 and 2): reading the header a load
//! balancer puts before a connection's data (`listen ... proxy_protocol`)
//! and writing a version 1 header toward an upstream (`proxy_protocol on`).
//!
//! Reading is bounded: at most [`MAX_V1`] bytes for a text header, or the
//! 16-byte binary prefix plus its stated length (at most [`MAX_V2`]); a
//! header that is not one of these is an error (nginx's "broken header").
//! Bytes the client sent after the header are handed back to the caller,
//! which relays them first: nothing read is lost.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// nginx's limit for a version 1 line, CRLF included.
pub const MAX_V1: usize = 107;
/// What tern accepts for a version 2 header's address and TLV part.
pub const MAX_V2: usize = 4096;

const SIG_V2: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// The addresses a PROXY header carried (None for `UNKNOWN`/`LOCAL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub src: Option<(IpAddr, u16)>,
    pub dst: Option<(IpAddr, u16)>,
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
        return Some(Header {
            src: None,
            dst: None,
        });
    }
    let mut it = line.split(' ');
    let fam = it.next()?;
    let src: IpAddr = it.next()?.parse().ok()?;
    let dst: IpAddr = it.next()?.parse().ok()?;
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
    ok.then_some(Header {
        src: Some((src, sport)),
        dst: Some((dst, dport)),
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
    let none = Header {
        src: None,
        dst: None,
    };
    match ver_cmd & 0x0f {
        // LOCAL: the connection's own addresses stand.
        0 => return Parsed::Done(none, total),
        1 => {}
        _ => return Parsed::Broken,
    }
    let h = match buf[13] >> 4 {
        1 if body.len() >= 12 => {
            let ip = |b: &[u8]| IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
            Header {
                src: Some((ip(&body[0..4]), u16::from_be_bytes([body[8], body[9]]))),
                dst: Some((ip(&body[4..8]), u16::from_be_bytes([body[10], body[11]]))),
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
    fn v1_out() {
        let s = "127.0.0.1:5".parse().ok();
        let d = "127.0.0.2:6".parse().ok();
        assert_eq!(v1_line(s, d), b"PROXY TCP4 127.0.0.1 127.0.0.2 5 6\r\n");
        assert_eq!(v1_line(None, d), b"PROXY UNKNOWN\r\n");
    }
}
