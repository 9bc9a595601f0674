//! HTTP/2 requests judged by tern from the header blocks it decodes
//! itself (`http::v2::hpack`; the h2 crate gets a stand-in block): a
//! malformed request gets nginx's 400 and then RST_STREAM(PROTOCOL_ERROR)
//! (RFC 9113 8.1.1); HPACK errors end the connection with nginx's codes,
//! the GOAWAY naming the stream; Huffman strings padded with a whole byte
//! (as nginx-tests pad them) are taken; CONNECT is 405; a body that does
//! not match its Content-Length is 400, then reset.

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::h2::{frame, h2c, hpack_int, literal};
use crate::harness::{free_port, Server};

type Frame = (u8, u8, u32, Vec<u8>);

/// A request's fields: names and values.
type Fields = Vec<(&'static str, &'static [u8])>;

/// Reads frames until `done` says so, the connection closes or the read
/// times out (10 s, set by `h2c`).
fn frames_until(s: &mut TcpStream, done: impl Fn(&[Frame]) -> bool) -> Vec<Frame> {
    let mut buf = Vec::new();
    let mut out: Vec<Frame> = Vec::new();
    let mut tmp = [0u8; 16384];
    loop {
        let mut i = 0;
        out.clear();
        while i + 9 <= buf.len() {
            let n = u32::from_be_bytes([0, buf[i], buf[i + 1], buf[i + 2]]) as usize;
            if i + 9 + n > buf.len() {
                break;
            }
            let sid = u32::from_be_bytes([buf[i + 5], buf[i + 6], buf[i + 7], buf[i + 8]]);
            out.push((buf[i + 3], buf[i + 4], sid, buf[i + 9..i + 9 + n].to_vec()));
            i += 9 + n;
        }
        if done(&out) {
            return out;
        }
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => return out,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
}

/// The code of `sid`'s RST_STREAM, if one came.
fn reset_of(f: &[Frame], sid: u32) -> Option<u32> {
    f.iter()
        .find(|x| x.0 == 3 && x.2 == sid)
        .map(|x| u32::from_be_bytes([x.3[0], x.3[1], x.3[2], x.3[3]]))
}

/// The first byte of `sid`'s response HEADERS: h2 sends `:status` from
/// the static table, 0x88 for 200, 0x8c for 400, 0x8d for 404.
fn status_of(f: &[Frame], sid: u32) -> Option<u8> {
    f.iter()
        .find(|x| x.0 == 1 && x.2 == sid)
        .and_then(|x| x.3.first().copied())
}

/// GOAWAY's last stream and code.
fn goaway_of(f: &[Frame]) -> Option<(u32, u32)> {
    f.iter().find(|x| x.0 == 7).map(|x| {
        (
            u32::from_be_bytes([x.3[0], x.3[1], x.3[2], x.3[3]]) & 0x7fff_ffff,
            u32::from_be_bytes([x.3[4], x.3[5], x.3[6], x.3[7]]),
        )
    })
}

/// A header block of literal fields (names and values as given).
fn block(fields: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in fields {
        literal(&mut b, n, v);
    }
    b
}

const GET: &[(&str, &[u8])] = &[
    (":method", b"GET"),
    (":scheme", b"http"),
    (":path", b"/"),
    (":authority", b"localhost"),
];

fn get_with(extra: &[(&'static str, &'static [u8])]) -> Fields {
    let mut v = GET.to_vec();
    v.extend_from_slice(extra);
    v
}

fn start() -> Server {
    let back = free_port();
    Server::start(&format!(
        r#"
error_log logs/error.log info;
http {{
    server {{
        listen 127.0.0.1:@PORT@ http2;
        server_name localhost;
        location / {{ return 200 "ok\n"; }}
        location /up {{ proxy_pass http://127.0.0.1:{back}/; }}
    }}
    server {{
        listen 127.0.0.1:{back};
        location / {{ return 200 "up\n"; }}
    }}
}}
"#
    ))
}

/// Each malformed request is answered 400, then its stream is reset
/// with PROTOCOL_ERROR; the connection goes on.
#[test]
fn malformed_requests_get_400_then_a_reset() {
    let s = start();
    let cases: Vec<(&str, Fields)> = vec![
        ("upper case name", get_with(&[("X-Foo", b"bar")])),
        ("colon in name", get_with(&[("x:foo", b"bar")])),
        ("space in name", get_with(&[("x foo", b"bar")])),
        (
            "newline in value",
            get_with(&[("x-foo", b"a\r\nreferer: b")]),
        ),
        ("connection field", get_with(&[("connection", b"close")])),
        ("te other than trailers", get_with(&[("te", b"gzip")])),
        (
            "pseudo after regular",
            vec![
                (":method", b"GET"),
                (":scheme", b"http"),
                ("x-foo", b"bar"),
                (":path", b"/"),
                (":authority", b"localhost"),
            ],
        ),
        (
            "no :scheme",
            vec![
                (":method", b"GET"),
                (":path", b"/"),
                (":authority", b"localhost"),
            ],
        ),
        (
            "unknown pseudo",
            get_with(&[])
                .into_iter()
                .chain([(":foo", &b"x"[..])])
                .collect(),
        ),
        (
            "empty :authority",
            vec![
                (":method", b"GET"),
                (":scheme", b"http"),
                (":path", b"/"),
                (":authority", b""),
            ],
        ),
        (
            "relative :path",
            vec![
                (":method", b"GET"),
                (":scheme", b"http"),
                (":path", b"t.html"),
                (":authority", b"localhost"),
            ],
        ),
        (
            "authority with a path separator",
            vec![
                (":method", b"GET"),
                (":scheme", b"http"),
                (":path", b"/"),
                (":authority", b"\\e/xample.com"),
            ],
        ),
    ];
    let mut c = h2c(s.port);
    let mut sid = 1;
    for (what, fields) in &cases {
        c.write_all(&frame(1, 5, sid, &block(fields)))
            .expect("headers");
        let f = frames_until(&mut c, |f| {
            reset_of(f, sid).is_some() || goaway_of(f).is_some()
        });
        assert_eq!(status_of(&f, sid), Some(0x8c), "{what}: 400: {f:?}");
        let end = f
            .iter()
            .position(|x| x.2 == sid && x.1 & 1 != 0 && (x.0 == 0 || x.0 == 1));
        let rst = f.iter().position(|x| x.0 == 3 && x.2 == sid);
        assert!(
            end.is_some() && rst > end,
            "{what}: the answer ends, then the reset: {f:?}"
        );
        assert_eq!(reset_of(&f, sid), Some(1), "{what}: PROTOCOL_ERROR");
        sid += 2;
    }
    // The connection goes on.
    c.write_all(&frame(1, 5, sid, &block(GET)))
        .expect("headers");
    let f = frames_until(&mut c, |f| f.iter().any(|x| x.2 == sid && x.1 & 1 != 0));
    assert_eq!(status_of(&f, sid), Some(0x88), "{f:?}");
    crate::harness::eventually(5, "the log lines", || {
        let log = s.error_log();
        log.contains("client sent invalid header name: \"X-Foo\"")
            && log.contains("client sent no :scheme header")
            && log.contains("client sent \"Connection\" header")
            && log.contains("client sent invalid :path header: \"t.html\"")
    });
}

/// nginx-tests' Huffman encoder pads a string whose code is a whole
/// number of bytes with a whole byte of EOS bits; nginx takes it (the h2
/// crate refused it, RFC 7541 5.2).
#[test]
fn huffman_padded_with_a_whole_byte_is_taken() {
    let s = start();
    let mut c = h2c(s.port);
    // :method GET, :scheme http, :path /, :authority "localhost"
    // (48 bits of code, then 8 of padding).
    let mut b = vec![0x82, 0x86, 0x84, 0x41, 0x87];
    b.extend_from_slice(&[0xa0, 0xe4, 0x1d, 0x13, 0x9d, 0x09, 0xff]);
    c.write_all(&frame(1, 5, 1, &b)).expect("headers");
    let f = frames_until(&mut c, |f| f.iter().any(|x| x.2 == 1 && x.1 & 1 != 0));
    assert_eq!(status_of(&f, 1), Some(0x88), "{f:?}");
    let body: Vec<u8> = f
        .iter()
        .filter(|x| x.0 == 0 && x.2 == 1)
        .flat_map(|x| x.3.clone())
        .collect();
    assert_eq!(body, b"ok\n");
}

/// HPACK errors are connection errors with nginx's codes, and the GOAWAY
/// names the stream whose block failed as the last one processed.
#[test]
fn hpack_errors_end_the_connection_with_nginx_codes() {
    let s = start();
    // An index past the tables: COMPRESSION_ERROR.
    let mut c = h2c(s.port);
    c.write_all(&frame(1, 5, 1, &[0x82, 0x86, 0x84, 0xbe]))
        .expect("headers");
    let f = frames_until(&mut c, |f| goaway_of(f).is_some());
    assert_eq!(goaway_of(&f), Some((1, 9)), "{f:?}");
    // A table size update past 4096: COMPRESSION_ERROR, after a request
    // served (stream 1), naming stream 3.
    let mut c = h2c(s.port);
    c.write_all(&frame(1, 5, 1, &block(GET))).expect("headers");
    frames_until(&mut c, |f| f.iter().any(|x| x.2 == 1 && x.1 & 1 != 0));
    let mut b = Vec::new();
    hpack_int(&mut b, 0x20, 5, 4097);
    b.extend(block(GET));
    c.write_all(&frame(1, 5, 3, &b)).expect("headers");
    let f = frames_until(&mut c, |f| goaway_of(f).is_some());
    assert_eq!(goaway_of(&f), Some((3, 9)), "{f:?}");
    // A block that ends inside an integer: FRAME_SIZE_ERROR.
    let mut c = h2c(s.port);
    c.write_all(&frame(1, 5, 1, &[0xff])).expect("headers");
    let f = frames_until(&mut c, |f| goaway_of(f).is_some());
    assert_eq!(goaway_of(&f), Some((1, 6)), "{f:?}");
    // An integer longer than 4 octets, the frame not even whole yet:
    // COMPRESSION_ERROR at once.
    let mut c = h2c(s.port);
    let mut head = frame(1, 5, 1, &[0xff, 0xff, 0xff, 0xff, 0x01]);
    head.truncate(head.len() - 1);
    c.write_all(&head).expect("headers");
    let f = frames_until(&mut c, |f| goaway_of(f).is_some());
    assert_eq!(goaway_of(&f).map(|g| g.1), Some(9), "{f:?}");
    // A string longer than large_client_header_buffers' size:
    // ENHANCE_YOUR_CALM.
    let mut c = h2c(s.port);
    let long = vec![b'x'; 8193];
    let fields: Vec<(&str, &[u8])> = get_with(&[])
        .into_iter()
        .chain([("x-long", &long[..])])
        .collect();
    let b = block(&fields);
    let (first, rest) = b.split_at(16384.min(b.len()));
    c.write_all(&frame(1, if rest.is_empty() { 5 } else { 1 }, 1, first))
        .expect("headers");
    if !rest.is_empty() {
        c.write_all(&frame(9, 4, 1, rest)).expect("continuation");
    }
    let f = frames_until(&mut c, |f| goaway_of(f).is_some());
    assert_eq!(goaway_of(&f).map(|g| g.1), Some(0xb), "{f:?}");
    crate::harness::eventually(5, "the log lines", || {
        let log = s.error_log();
        log.contains("client sent out of bound hpack table index")
            && log.contains("client sent invalid table size update")
            && log.contains("client sent header block with incorrect length")
            && log.contains("client sent too large header field")
    });
}

/// CONNECT with `:path` and `:scheme` (as nginx-tests send it) is 405, as
/// nginx answers; the h2 crate reset it as malformed.
#[test]
fn connect_is_405() {
    let s = start();
    let mut c = h2c(s.port);
    let fields: &[(&str, &[u8])] = &[
        (":method", b"CONNECT"),
        (":scheme", b"http"),
        (":path", b"/"),
        (":authority", b"localhost"),
    ];
    c.write_all(&frame(1, 5, 1, &block(fields)))
        .expect("headers");
    let f = frames_until(&mut c, |f| f.iter().any(|x| x.2 == 1 && x.1 & 1 != 0));
    let h = f.iter().find(|x| x.0 == 1 && x.2 == 1).expect("an answer");
    // 405 is not in the static table: a literal with the name of
    // index 8 (`:status`), "405" (as h2 sends it, Huffman-coded: 17 bits
    // and 7 of padding).
    assert!(
        h.3.windows(3)
            .any(|w| w == b"405" || w == [0x68, 0x0d, 0xff]),
        "{f:?}"
    );
}

/// A body longer or shorter than its Content-Length: 400 (nginx's request
/// body filter), then the stream is reset (RFC 9113 8.1.1).
#[test]
fn body_not_matching_content_length_is_400() {
    let s = start();
    for (cl, what) in [
        (&b"5"[..], "prematurely closed stream"),
        (b"3", "larger than declared"),
    ] {
        let mut c = h2c(s.port);
        let fields: Vec<(&str, &[u8])> = vec![
            (":method", b"POST"),
            (":scheme", b"http"),
            (":path", b"/up"),
            (":authority", b"localhost"),
            ("content-length", cl),
        ];
        c.write_all(&frame(1, 4, 1, &block(&fields)))
            .expect("headers");
        c.write_all(&frame(0, 1, 1, b"TEST")).expect("data");
        let f = frames_until(&mut c, |f| {
            reset_of(f, 1).is_some() || goaway_of(f).is_some()
        });
        assert_eq!(status_of(&f, 1), Some(0x8c), "{what}: {f:?}");
        assert_eq!(reset_of(&f, 1), Some(1), "{what}: {f:?}");
        crate::harness::eventually(5, what, || s.error_log().contains(what));
    }
    // The length matching: the upstream's answer.
    let mut c = h2c(s.port);
    let fields: Vec<(&str, &[u8])> = vec![
        (":method", b"POST"),
        (":scheme", b"http"),
        (":path", b"/up"),
        (":authority", b"localhost"),
        ("content-length", b"4"),
    ];
    c.write_all(&frame(1, 4, 1, &block(&fields)))
        .expect("headers");
    c.write_all(&frame(0, 1, 1, b"TEST")).expect("data");
    let f = frames_until(&mut c, |f| {
        f.iter().any(|x| x.2 == 1 && x.1 & 1 != 0 && x.0 == 0)
    });
    assert_eq!(status_of(&f, 1), Some(0x88), "{f:?}");
    assert_eq!(reset_of(&f, 1), None, "{f:?}");
}
