//! Entry points for the fuzz targets in `fuzz/` and for the corpus replay
//! test below.
//!
//! Each function takes arbitrary bytes, feeds them to one parser of tern
//! the way the server does, and checks what must hold whatever the input:
//! no panic (the fuzzer sees a panic as a crash), and, where a parser has a
//! fast path or may be fed in pieces, that the answers agree. The fuzz
//! targets are one line each (`tern::fuzzing::chunked(data)`), so a parser
//! that moves inside the crate changes this file only.
//!
//! The seeds (`fuzz/seeds/<target>/`), the saved corpora
//! (`fuzz/corpus/<target>/`, minimised) and the inputs that once
//! crashed (`fuzz/regressions/<target>/`) replay as an ordinary unit test,
//! so every `cargo test` run checks them without a fuzzer.

use crate::http::chunked::ChunkedDecoder;
use crate::http::conf::SrvConf;
use crate::http::{request, uri};

/// A fuzz target's entry point.
pub type Target = fn(&[u8]);

/// Every target, by the name of its folder under `fuzz/corpus/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("request_head", request_head),
    ("chunked", chunked),
    ("uri", uri_path),
    ("range", range),
    ("config", config),
    ("template", template),
    ("upstream_head", upstream_head),
    ("fastcgi_records", fastcgi_records),
    ("h2_guard", h2_guard),
    ("proxy_protocol", proxy_protocol),
    ("ssl_preread", ssl_preread),
    ("cgi_head", cgi_head),
    ("range_multipart", range_multipart),
    ("conditional", conditional),
    ("mp4", mp4),
    ("mail", mail),
];

/// The request line and head checks: the bytes up to the first blank line
/// are parsed as a head with the default server settings, and with
/// `merge_slashes off` and `underscores_in_headers on`.
pub fn request_head(data: &[u8]) {
    // parse_line is also called on partial heads as bytes arrive.
    for cut in [data.len() / 3, data.len() / 2, data.len()] {
        let _ = request::parse_line(&data[..cut]);
    }
    let end = memchr::memmem::find(data, b"\r\n\r\n")
        .map(|i| i + 4)
        .or_else(|| memchr::memmem::find(data, b"\n\n").map(|i| i + 2))
        .unwrap_or(data.len());
    let head = &data[..end];
    let plain = SrvConf::default();
    let _ = request::parse_head(head.to_vec(), &plain);
    let other = SrvConf {
        merge_slashes: Some(false),
        underscores_in_headers: Some(true),
        ..SrvConf::default()
    };
    if let Ok(r) = request::parse_head(head.to_vec(), &other) {
        // Every accessor must stay within the buffer.
        let _ = (
            r.uri(),
            r.args(),
            r.host(),
            r.line(),
            r.raw_uri(),
            r.proto(),
        );
        for h in r.headers() {
            let _ = r.header(&String::from_utf8_lossy(h.name).to_ascii_lowercase());
        }
    }
}

/// The chunked decoder fed the whole input at once and byte by byte must
/// give the same body and the same verdict: connections deliver bodies
/// split at any byte.
pub fn chunked(data: &[u8]) {
    let mut whole = ChunkedDecoder::new();
    let mut out_whole = Vec::new();
    let r_whole = whole.decode(data, &mut out_whole);

    let mut piecewise = ChunkedDecoder::new();
    let mut out_pieces = Vec::new();
    let mut consumed = 0usize;
    let mut failed = false;
    for b in data.chunks(1) {
        match piecewise.decode(b, &mut out_pieces) {
            Ok(n) => {
                consumed += n;
                if piecewise.is_done() {
                    break;
                }
            }
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert_eq!(r_whole.is_err(), failed, "verdict depends on splitting");
    if let Ok(n) = r_whole {
        assert_eq!(out_whole, out_pieces, "body depends on splitting");
        assert_eq!(n, consumed, "consumed bytes depend on splitting");
        assert_eq!(whole.is_done(), piecewise.is_done());
    }
}

/// URI normalisation: a path the fast check calls normal must come out of
/// the full normaliser unchanged, and no `.` or `..` segment survives
/// normalisation (that would be a path traversal).
pub fn uri_path(data: &[u8]) {
    let Ok(target) = uri::split_target(data) else {
        return;
    };
    for merge in [true, false] {
        let normal = uri::is_normal(target.path, merge);
        match uri::normalize_path(target.path, merge) {
            Ok(out) => {
                if normal {
                    assert_eq!(out, target.path, "is_normal path changed by normalize_path");
                }
                assert_eq!(
                    out.first(),
                    Some(&b'/'),
                    "normalised path must start with /"
                );
                for seg in out.split(|&b| b == b'/') {
                    assert!(
                        seg != b".." && seg != b".",
                        "dot segment survived normalisation"
                    );
                }
            }
            Err(_) => assert!(!normal, "is_normal path refused by normalize_path"),
        }
    }
}

/// `Range: bytes=...`: the first 8 bytes pick the entity length, the rest
/// is the header value after `bytes=`. Every range served lies inside the
/// entity and there are never more than `max_ranges`.
pub fn range(data: &[u8]) {
    let (len_bytes, value) = data.split_at(data.len().min(8));
    let mut le = [0u8; 8];
    le[..len_bytes.len()].copy_from_slice(len_bytes);
    let len = u64::from_le_bytes(le) >> 16;
    for max_ranges in [1, 3, u64::MAX] {
        if let crate::http::modules::range::Parsed::Ranges(r) =
            crate::http::modules::range::parse(value, len, max_ranges)
        {
            assert!(!r.is_empty());
            assert!(r.len() as u64 <= max_ranges, "more ranges than max_ranges");
            for &(s, e) in &r {
                assert!(s < e && e <= len, "range {s}-{e} outside 0-{len}");
            }
        }
    }
}

/// Directives whose compilation writes to the file system (log files,
/// cache and temp directories): left out so that fuzzing never creates
/// files wherever the input names.
fn writes_files(name: &str) -> bool {
    name.ends_with("_log") || name.ends_with("_path") || name == "pid" || name == "lock_file"
}

fn touches_files(dirs: &[crate::config::Directive]) -> bool {
    dirs.iter()
        .any(|d| writes_files(&d.name) || d.block.as_ref().is_some_and(|b| touches_files(b)))
}

/// The nginx.conf lexer, parser and compiler: any input ends in a
/// configuration or an error with a place, never a panic. Includes resolve
/// under an empty directory.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if text.contains("include") {
        return;
    }
    let dir = std::env::temp_dir().join("tern-fuzz-config");
    let mut tree = crate::config::Tree::default();
    let file = std::sync::Arc::new(dir.join("nginx.conf"));
    let Ok(dirs) = crate::config::parse::parse_str(text, file, &dir, &mut tree) else {
        return;
    };
    if touches_files(&dirs) {
        return;
    }
    tree.directives = dirs;
    let _ = crate::core::conf::compile(tree, &dir, &dir, &dir.join("nginx.conf"));
}

/// Variable templates (`"$host$uri"`, `${name}`, captures).
pub fn template(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut vars = crate::http::vars::VarTable::default();
    let _ = crate::http::vars::Template::compile(text, &mut vars);
}

/// A proxied server's response head, complete or cut anywhere.
pub fn upstream_head(data: &[u8]) {
    use crate::http::modules::proxy::head::{parse, Parse};
    if let Parse::Done(h) = parse(data) {
        assert!(h.end <= data.len(), "head ends past the input");
        // The same bytes cut short of the end are never a different head.
        if h.end > 0 {
            assert!(
                !matches!(parse(&data[..h.end - 1]), Parse::Done(_)),
                "a head cut short is complete"
            );
        }
    }
}

/// FastCGI records from an application, whole and split in two.
pub fn fastcgi_records(data: &[u8]) {
    use crate::http::modules::fastcgi::records::Decoder;
    let mut whole = Decoder::new();
    let mut out_whole = Vec::new();
    let r_whole = whole.feed(data, &mut out_whole);

    let mut split = Decoder::new();
    let mut out_split = Vec::new();
    let cut = data.len() / 2;
    let r_split = split
        .feed(&data[..cut], &mut out_split)
        .and_then(|()| split.feed(&data[cut..], &mut out_split));
    assert_eq!(
        r_whole.is_ok(),
        r_split.is_ok(),
        "verdict depends on splitting"
    );
    if r_whole.is_ok() {
        assert_eq!(out_whole, out_split, "stdout depends on splitting");
        assert_eq!(whole.done, split.done);
    }
}

/// A tiny deterministic generator for read sizes and cut points (the
/// fuzzer picks its seed), so a failing input replays the same way.
struct Splits(u32);

impl Splits {
    fn next(&mut self, max: usize) -> usize {
        // xorshift32; the seed is never 0.
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        1 + (x as usize) % max.max(1)
    }
}

/// What feeding a guard some reads gave: the bytes h2 got, the verdict,
/// whether a frame or header block was left part-way, and what was kept
/// of the first client streams' header blocks (size as sent, fields,
/// failed).
#[derive(Debug, PartialEq, Eq)]
struct GuardRun {
    out: Vec<u8>,
    trip: Option<crate::http::v2::guard::Trip>,
    busy: bool,
    heads: Vec<Option<(usize, usize, bool)>>,
}

fn guard_run(max_streams: u32, input: &[u8], mut reads: impl FnMut(usize) -> usize) -> GuardRun {
    use crate::http::v2::guard::{Fed, Guard};
    let g = Guard::new(
        max_streams,
        std::time::Duration::from_secs(3600),
        crate::http::v2::hpack::Limits {
            field: 4096,
            list: 16384,
        },
        65536,
    );
    let mut at = 0;
    let mut out = Vec::new();
    while at < input.len() {
        let n = reads(input.len() - at).min(input.len() - at);
        let mut made = Vec::new();
        match g.feed(&input[at..at + n], &mut made) {
            Fed::Pass(k) => {
                assert!(k <= n, "guard passed more than it was given");
                out.extend_from_slice(&input[at..at + k]);
                if k < n {
                    assert!(g.trip().is_some(), "bytes withheld without a verdict");
                }
            }
            Fed::Rewritten => out.extend_from_slice(&made),
        }
        if g.trip().is_some() {
            break;
        }
        at += n;
    }
    if g.trip().is_some() {
        let mut made = Vec::new();
        assert_eq!(
            g.feed(b"\0\0\0\x04\0\0\0\0\0", &mut made),
            Fed::Pass(0),
            "bytes passed after the verdict"
        );
    }
    GuardRun {
        out,
        trip: g.trip(),
        busy: g.busy(),
        heads: (0..8)
            .map(|i| {
                g.take_head(2 * i + 1)
                    .map(|h| (h.len, h.block.count(), h.failed))
            })
            .collect(),
    }
}

/// The HTTP/2 frame guard (`http::v2::guard`): the first byte seeds how
/// the rest is cut into reads; the rest follows the client preface as
/// the client's frames.
///
/// - With a stream limit so high that the per-read rules (too many new
///   streams in one read, the flood ratio, which counts a read's bytes
///   when it arrives, as nginx) cannot fire, the verdict is a property
///   of the frames alone: whole input, byte by byte and random reads give
///   the same verdict, part-way state and header blocks, and the same
///   bytes to h2 (with a verdict, a split run may also have passed the
///   start of the offending frame); a frame rule a separate walk over the
///   frames finds (PUSH_PROMISE, a short GOAWAY, a stream depending on
///   itself) always ends the connection, at it or at a header block
///   before it.
/// - With `http2_max_concurrent_streams 1`, reading byte by byte never
///   trips on "too many streams at once", and agrees with the whole input
///   when that did not trip on it either.
pub fn h2_guard(data: &[u8]) {
    use crate::http::v2::PREFACE;
    let Some((&seed, frames)) = data.split_first() else {
        return;
    };
    let mut input = PREFACE.to_vec();
    input.extend_from_slice(frames);

    let expected = guard_model(&input);
    let whole = guard_run(u32::MAX / 4, &input, |n| n);
    let bytes = guard_run(u32::MAX / 4, &input, |_| 1);
    let mut sp = Splits(u32::from(seed).wrapping_mul(2_654_435_761) | 1);
    let random = guard_run(u32::MAX / 4, &input, |_| sp.next(23));
    for (run, how) in [(&bytes, "byte by byte"), (&random, "random cuts")] {
        assert_eq!(
            (whole.trip, whole.busy, &whole.heads),
            (run.trip, run.busy, &run.heads),
            "guard verdict depends on reads ({how})"
        );
        same_output(&whole, run);
    }
    let model_logs = [
        "client sent PUSH_PROMISE frame",
        "client sent GOAWAY frame with incorrect length",
        "client sent PRIORITY frame with incorrect dependency",
        "client sent HEADERS frame with incorrect dependency",
    ];
    match expected {
        Some((_, log)) => {
            let t = whole.trip.map(|t| t.log);
            assert!(t.is_some(), "guard let {log} pass");
        }
        None => {
            if let Some(t) = whole.trip {
                assert!(
                    !model_logs.contains(&t.log),
                    "guard stopped a good frame: {}",
                    t.log
                );
            }
        }
    }

    let tight_whole = guard_run(1, &input, |n| n);
    let tight_bytes = guard_run(1, &input, |_| 1);
    assert!(
        tight_bytes.trip.map(|t| t.log) != Some("client sent too many streams at once"),
        "one byte per read opened two streams"
    );
    if tight_whole.trip.map(|t| t.log) != Some("client sent too many streams at once") {
        assert_eq!(
            (tight_whole.trip, tight_whole.busy, &tight_whole.heads),
            (tight_bytes.trip, tight_bytes.busy, &tight_bytes.heads),
            "guard verdict depends on reads (limit 1)"
        );
        same_output(&tight_whole, &tight_bytes);
    }
}

/// Reads cut differently give h2 the same bytes; with a verdict, a split
/// run may have passed the first bytes of the offending frame (h2 acts
/// on whole frames only, so it never sees it).
fn same_output(whole: &GuardRun, split: &GuardRun) {
    if whole.trip.is_none() {
        assert_eq!(
            split.out, whole.out,
            "reads cut differently gave h2 other bytes"
        );
        return;
    }
    assert!(
        split.out.starts_with(&whole.out),
        "reads cut differently gave h2 other bytes before the verdict"
    );
}

/// Where each complete frame header starts, after the preface.
fn frame_starts(input: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = crate::http::v2::PREFACE.len();
    while at + 9 <= input.len() {
        out.push(at);
        let len = usize::from(input[at]) << 16
            | usize::from(input[at + 1]) << 8
            | usize::from(input[at + 2]);
        at += 9 + len;
    }
    out
}

/// The frame rules that do not depend on reads or counts, applied by a
/// walk of its own: where the guard must stop and what it must log.
fn guard_model(input: &[u8]) -> Option<(usize, &'static str)> {
    for at in frame_starts(input) {
        let h = &input[at..at + 9];
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let (kind, flags) = (h[3], h[4]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        let payload = &input[at + 9..(at + 9 + len).min(input.len())];
        let self_dep = |off: usize, want: usize| {
            let want = want.min(len);
            payload.len() >= want
                && want >= off + 4
                && stream != 0
                && u32::from_be_bytes([
                    payload[off],
                    payload[off + 1],
                    payload[off + 2],
                    payload[off + 3],
                ]) & 0x7fff_ffff
                    == stream
        };
        match kind {
            5 => return Some((at, "client sent PUSH_PROMISE frame")),
            7 if len < 8 => return Some((at, "client sent GOAWAY frame with incorrect length")),
            2 if self_dep(0, 5) => {
                return Some((at, "client sent PRIORITY frame with incorrect dependency"))
            }
            1 if flags & 0x20 != 0 => {
                let off = usize::from(flags & 0x8 != 0);
                if self_dep(off, off + 5) {
                    return Some((at, "client sent HEADERS frame with incorrect dependency"));
                }
            }
            _ => {}
        }
    }
    None
}

/// The PROXY protocol reader (`core::proxy_protocol`, versions 1 and
/// 2), on arbitrary bytes and on headers built from the input's bytes:
/// - a header is complete at one place: every shorter prefix is
///   `Partial`, and what follows it (the client's data) changes nothing;
/// - `Broken` stays broken whatever comes next, and `Partial` never
///   asks for more than the protocol's limits;
/// - the version 1 line tern sends upstream, and a version 2 header of
///   the same addresses, read back to those addresses.
pub fn proxy_protocol(data: &[u8]) {
    use crate::core::proxy_protocol::{parse, v1_line, Header, Parsed, MAX_V1, MAX_V2};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let limit = if data.first() == Some(&b'\r') {
        16 + MAX_V2
    } else {
        MAX_V1
    };
    match parse(data) {
        Parsed::Done(h, n) => {
            assert!(n <= data.len() && n <= limit, "header of {n} bytes");
            for cut in 0..n {
                assert_eq!(
                    parse(&data[..cut]),
                    Parsed::Partial,
                    "complete at {cut} and {n}"
                );
            }
            assert_eq!(parse(&data[..n]), Parsed::Done(h, n));
        }
        Parsed::Broken => {
            for more in [&b"\r\n"[..], &[0u8; 32][..], b"PROXY UNKNOWN\r\n"] {
                let mut v = data.to_vec();
                v.extend_from_slice(more);
                assert_eq!(
                    parse(&v),
                    Parsed::Broken,
                    "broken header repaired by more bytes"
                );
            }
        }
        Parsed::Partial => {
            assert!(data.len() < limit, "{} bytes still partial", data.len());
            for cut in [data.len() / 2, data.len().saturating_sub(1)] {
                assert_eq!(parse(&data[..cut]), Parsed::Partial);
            }
        }
    }

    // Addresses from the input's bytes, written and read back.
    let mut b = [0u8; 40];
    let n = data.len().min(40);
    b[..n].copy_from_slice(&data[..n]);
    let port = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
    let v4 = |i: usize| IpAddr::V4(Ipv4Addr::new(b[i], b[i + 1], b[i + 2], b[i + 3]));
    let v6 = |i: usize| {
        let mut o = [0u8; 16];
        o.copy_from_slice(&b[i..i + 16]);
        IpAddr::V6(Ipv6Addr::from(o))
    };
    for (src, dst) in [(v4(0), v4(4)), (v6(0), v6(16))] {
        let (s, d) = (
            SocketAddr::new(src, port(32)),
            SocketAddr::new(dst, port(34)),
        );
        let want = Header {
            src: Some((src, s.port())),
            dst: Some((dst, d.port())),
            tlvs: Vec::new(),
            text: None,
        };
        let line = v1_line(Some(s), Some(d));
        assert!(line.len() <= MAX_V1, "v1 line of {} bytes", line.len());
        let v1_want = Header {
            text: Some((src.to_string(), dst.to_string())),
            ..want.clone()
        };
        assert_eq!(
            parse(&line),
            Parsed::Done(v1_want, line.len()),
            "{}",
            String::from_utf8_lossy(&line)
        );
        // Version 2, PROXY command, TCP over the family, then TLVs (the
        // input's tail), which are kept as sent.
        let mut v2 = b"\r\n\r\n\0\r\nQUIT\n\x21".to_vec();
        let mut body = Vec::new();
        match (src, dst) {
            (IpAddr::V4(a), IpAddr::V4(c)) => {
                v2.push(0x11);
                body.extend_from_slice(&a.octets());
                body.extend_from_slice(&c.octets());
            }
            (IpAddr::V6(a), IpAddr::V6(c)) => {
                v2.push(0x21);
                body.extend_from_slice(&a.octets());
                body.extend_from_slice(&c.octets());
            }
            _ => unreachable!(),
        }
        body.extend_from_slice(&s.port().to_be_bytes());
        body.extend_from_slice(&d.port().to_be_bytes());
        body.extend_from_slice(&data[n..data.len().min(n + 200)]);
        v2.extend_from_slice(&(body.len() as u16).to_be_bytes());
        v2.extend_from_slice(&body);
        let total = v2.len();
        v2.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let v2_want = Header {
            tlvs: data[n..data.len().min(n + 200)].to_vec(),
            ..want
        };
        assert_eq!(parse(&v2), Parsed::Done(v2_want, total));
    }
}

/// The stream `ssl_preread` ClientHello reader, on arbitrary bytes and on
/// ClientHellos built from the input's bytes:
/// - a verdict reached on a prefix (Done or not TLS) is the verdict on
///   the whole: bytes read later never change what routed the session;
/// - a ClientHello carrying a server name, ALPN protocols and supported
///   versions, cut into records of any size, reads back to them.
pub fn ssl_preread(data: &[u8]) {
    use crate::stream::ssl_preread::{parse, Preread};
    let whole = parse(data);
    let step = (data.len() / 64).max(1);
    for cut in (0..data.len()).step_by(step) {
        match parse(&data[..cut]) {
            Preread::Partial => {}
            p => assert_eq!(p, whole, "verdict at {cut} bytes changed later"),
        }
    }

    // A ClientHello from the input: [seed, sni_len, alpn count, names...].
    let Some((&seed, rest)) = data.split_first() else {
        return;
    };
    let mut it = rest.iter().copied();
    let sni_len = usize::from(it.next().unwrap_or(0) % 64);
    let sni: Vec<u8> = it.by_ref().take(sni_len).collect();
    let alpn_n = usize::from(it.next().unwrap_or(0) % 5);
    let mut alpn = Vec::new();
    for _ in 0..alpn_n {
        let l = 1 + usize::from(it.next().unwrap_or(0) % 16);
        let mut p: Vec<u8> = it.by_ref().take(l).collect();
        p.resize(l, b'x');
        alpn.push(p);
    }
    let versions: Vec<u16> = (0..usize::from(seed % 4))
        .map(|_| u16::from_be_bytes([it.next().unwrap_or(3), it.next().unwrap_or(3)]))
        .collect();
    let mut ext = Vec::new();
    if !sni.is_empty() {
        let mut list = vec![0u8];
        list.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        list.extend_from_slice(&sni);
        ext.extend_from_slice(&[0, 0]);
        ext.extend_from_slice(&((list.len() + 2) as u16).to_be_bytes());
        ext.extend_from_slice(&(list.len() as u16).to_be_bytes());
        ext.extend_from_slice(&list);
    }
    if !alpn.is_empty() {
        let mut list = Vec::new();
        for p in &alpn {
            list.push(p.len() as u8);
            list.extend_from_slice(p);
        }
        ext.extend_from_slice(&[0, 16]);
        ext.extend_from_slice(&((list.len() + 2) as u16).to_be_bytes());
        ext.extend_from_slice(&(list.len() as u16).to_be_bytes());
        ext.extend_from_slice(&list);
    }
    if !versions.is_empty() {
        ext.extend_from_slice(&[0, 43]);
        ext.extend_from_slice(&((versions.len() * 2 + 1) as u16).to_be_bytes());
        ext.push((versions.len() * 2) as u8);
        for v in &versions {
            ext.extend_from_slice(&v.to_be_bytes());
        }
    }
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0); // session id
    body.extend_from_slice(&[0, 2, 0x13, 0x01]); // cipher suites
    body.extend_from_slice(&[1, 0]); // compression
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut sp = Splits(u32::from(seed) | 0x100);
    let mut wire = Vec::new();
    for piece in hs.chunks(sp.next(300)) {
        wire.extend_from_slice(&[0x16, 3, 1]);
        wire.extend_from_slice(&(piece.len() as u16).to_be_bytes());
        wire.extend_from_slice(piece);
    }
    let best = versions
        .iter()
        .copied()
        .filter(|&v| (0x0300..=0x0304).contains(&v) || v >> 8 == 0x7f)
        .max_by_key(|&v| if v >> 8 == 0x7f { 0x0304 } else { v });
    let protocol = match best.map(|v| if v >> 8 == 0x7f { 0x0304 } else { v }) {
        None | Some(0x0303) => "TLSv1.2",
        Some(0x0300) => "SSLv3",
        Some(0x0301) => "TLSv1",
        Some(0x0302) => "TLSv1.1",
        Some(_) => "TLSv1.3",
    };
    let want = crate::stream::ssl_preread::Hello {
        server_name: sni,
        alpn: alpn.join(&b","[..]),
        protocol,
    };
    for cut in 0..wire.len() {
        assert_eq!(parse(&wire[..cut]), Preread::Partial, "hello done at {cut}");
    }
    wire.extend_from_slice(&[0x17, 3, 3, 0, 1, 0]);
    assert_eq!(parse(&wire), Preread::Done(want));
}

/// What a head reader said, comparable across ways of feeding it: the
/// head's fields and all bytes after it (what came with the head and
/// what was not fed yet).
#[derive(Debug, PartialEq, Eq)]
enum HeadRun {
    Waiting,
    Failed(u16, String, u16),
    Head {
        status: u16,
        line: Vec<u8>,
        headers: Vec<(String, Vec<u8>)>,
        after: Vec<u8>,
        declared: Option<u64>,
        no_body: bool,
        body: Vec<u8>,
    },
}

/// `head_only`: the answer is to a HEAD request. The client gets no
/// body then, but the reader still reads one to the close (nginx reads
/// an scgi/uwsgi answer to HEAD whole, for the cache), so bytes after
/// the head, even past its Content-Length, are no fault there.
fn head_run(
    mut reader: Box<dyn crate::http::upstream::HeadReader>,
    data: &[u8],
    head_only: bool,
    mut reads: impl FnMut(usize) -> usize,
) -> HeadRun {
    let mut at = 0;
    while at < data.len() {
        let n = reads(data.len() - at).min(data.len() - at);
        match reader.feed(&data[at..at + n]) {
            Ok(None) => at += n,
            Ok(Some(mut h)) => {
                let mut after = std::mem::take(&mut h.early);
                after.extend_from_slice(&data[at + n..]);
                let mut body = std::mem::take(&mut h.body);
                let _ = h.decoder.feed(&after, &mut body);
                assert!(!head_only || h.no_body, "a body for the client after HEAD");
                if let Some(l) = h.declared_len.filter(|_| !head_only) {
                    assert!(body.len() as u64 <= l, "body past its Content-Length");
                }
                if h.no_body && !head_only {
                    assert!(body.is_empty(), "a body where none may be");
                }
                return HeadRun::Head {
                    status: h.status,
                    line: h.status_line,
                    headers: h.headers,
                    after,
                    declared: h.declared_len,
                    no_body: h.no_body,
                    body,
                };
            }
            Err(f) => return HeadRun::Failed(f.status, f.msg, f.ft),
        }
    }
    HeadRun::Waiting
}

/// The SCGI and uwsgi response head reader (`cgi::CgiHead`: an HTTP
/// status line or CGI header lines), the first byte choosing HEAD or not
/// and the size limit (`*_buffer_size`): the whole response, byte by
/// byte and random reads give the same head, error, or wait; the body
/// decoded after it never passes its Content-Length, and none follows a
/// HEAD, 204 or 304.
pub fn cgi_head(data: &[u8]) {
    use crate::http::modules::cgi::CgiHead;
    let Some((&cfg, resp)) = data.split_first() else {
        return;
    };
    let head_only = cfg & 1 != 0;
    let max = [16, 64, 512, 4096][usize::from(cfg >> 1) % 4];
    let mk =
        || Box::new(CgiHead::new(head_only, max)) as Box<dyn crate::http::upstream::HeadReader>;
    let whole = head_run(mk(), resp, head_only, |n| n);
    let bytes = head_run(mk(), resp, head_only, |_| 1);
    let mut sp = Splits((u32::from(cfg) << 8) | 0x5a);
    let random = head_run(mk(), resp, head_only, |_| sp.next(40));
    assert_eq!(whole, bytes, "cgi head depends on reads (byte by byte)");
    assert_eq!(whole, random, "cgi head depends on reads (random cuts)");
}

/// The range filter's body writers (`range::single`/`multi`): a `Range`
/// value that parses to ranges of an entity (at most 255 bytes, the
/// first byte is its length, the second cuts it into pieces) gives a body
/// that is exactly the part (one range) or the multipart/byteranges
/// message nginx writes, byte for byte, whether the entity is one buffer
/// or pieces (a cached or composed body); Content-Length is its size.
pub fn range_multipart(data: &[u8]) {
    use crate::http::modules::range::{multi, parse, single, Parsed};
    use crate::http::response::{Body, Piece, Response};
    let [len, seed, rest @ ..] = data else {
        return;
    };
    let len = usize::from(*len).min(rest.len());
    let (entity, value) = rest.split_at(len);
    let Parsed::Ranges(r) = parse(value, len as u64, u64::MAX) else {
        return;
    };
    let mut sp = Splits(u32::from(*seed) | 0x1000);
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < entity.len() {
        let n = sp.next(17).min(entity.len() - at);
        pieces.push(Piece::Bytes(entity[at..at + n].to_vec()));
        at += n;
    }
    for body in [Body::Bytes(entity.to_vec()), Body::Multi(pieces)] {
        let mut resp = Response::status(200);
        resp.content_type = Some("text/plain".into());
        resp.content_length = Some(len as u64);
        resp.body = body;
        let expected = if let [(s, e)] = r[..] {
            single(&mut resp, s, e, len as u64);
            let cr = resp.header("content-range").map(<[u8]>::to_vec);
            assert_eq!(
                cr,
                Some(format!("bytes {}-{}/{}", s, e - 1, len).into_bytes())
            );
            entity[s as usize..e as usize].to_vec()
        } else {
            multi(&mut resp, &r, len as u64);
            let ct = resp.content_type.clone().unwrap_or_default();
            let b = ct
                .strip_prefix("multipart/byteranges; boundary=")
                .unwrap_or_else(|| panic!("content type {ct}"))
                .to_string();
            assert!(b.len() == 20 && b.bytes().all(|c| c.is_ascii_digit()));
            let mut x = Vec::new();
            for &(s, e) in &r {
                x.extend_from_slice(
                    format!(
                        "\r\n--{b}\r\nContent-Type: text/plain\r\nContent-Range: bytes {}-{}/{}\r\n\r\n",
                        s,
                        e - 1,
                        len
                    )
                    .as_bytes(),
                );
                x.extend_from_slice(&entity[s as usize..e as usize]);
            }
            x.extend_from_slice(format!("\r\n--{b}--\r\n").as_bytes());
            x
        };
        let got = match &resp.body {
            Body::Bytes(b) => b.clone(),
            Body::Multi(p) => p
                .iter()
                .flat_map(|p| match p {
                    Piece::Bytes(b) => b.clone(),
                    Piece::File { .. } => unreachable!("no files here"),
                })
                .collect(),
            Body::Empty => Vec::new(),
            _ => unreachable!("a stream from bytes"),
        };
        assert_eq!(got, expected, "range body differs");
        assert_eq!(resp.content_length, Some(expected.len() as u64));
    }
}

/// Conditional requests: HTTP dates (`If-Modified-Since`,
/// `If-Unmodified-Since`, `If-Range`), entity-tag lists (`If-Match`,
/// `If-None-Match`) and `If-Range`:
/// - a date that parses is the date tern writes for that second, and the
///   date tern writes for any second (from the input) parses back;
/// - a strong ETag match is also a weak one (for a quoted tag); an ETag matches a list of
///   itself and a list where it follows another element; `*` matches;
/// - `if_modified_since before` answers 304 whenever `exact` does;
/// - `If-Range` with the response's own ETag or Last-Modified date keeps
///   the range, a quoted value never matches by date.
pub fn conditional(data: &[u8]) {
    use crate::http::date::{http_date_at, parse_http_date};
    use crate::http::modules::not_modified::{etag_matches, modified_since, Ims};
    use crate::http::modules::range::if_range_matches;
    const MIN: i64 = -62_167_219_200;
    const MAX: i64 = 253_402_300_799;
    if let Some(t) = parse_http_date(data) {
        if (MIN..=MAX).contains(&t) {
            assert_eq!(
                parse_http_date(&http_date_at(t)),
                Some(t),
                "{}",
                String::from_utf8_lossy(data)
            );
        }
    }
    let mut b = [0u8; 8];
    let n = data.len().min(8);
    b[..n].copy_from_slice(&data[..n]);
    let t = MIN + (i64::from_le_bytes(b).rem_euclid(MAX - MIN + 1));
    let written = http_date_at(t);
    assert_eq!(
        parse_http_date(&written),
        Some(t),
        "{}",
        String::from_utf8_lossy(&written)
    );

    let (etag, list) = match data.iter().position(|&c| c == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    // Strong implies weak for an entity-tag as RFC 9110 writes one; not
    // for a bare `W/`, which nginx's comparison (and so tern's) strips
    // from a list element but not from the tag (fuzzing found it; no
    // server sends such a tag).
    let quoted = etag.starts_with(b"\"") || etag.starts_with(b"W/\"");
    if quoted && etag_matches(list, Some(etag), false) {
        assert!(
            etag_matches(list, Some(etag), true),
            "strong match but no weak match"
        );
    }
    assert!(etag_matches(b"*", Some(etag), false) && etag_matches(b"*", None, true));
    if !etag.is_empty() {
        assert!(
            etag_matches(etag, Some(etag), false),
            "an ETag does not match itself"
        );
        if !matches!(etag[0], b' ' | b'\t' | b',') {
            let mut l = b"\"other\", ".to_vec();
            l.extend_from_slice(etag);
            assert!(
                etag_matches(&l, Some(etag), false),
                "second element not matched"
            );
        }
    }
    for lm in [None, Some(t), Some(t.wrapping_add(1)), Some(t - 1)] {
        if !modified_since(list, lm, Ims::Exact) {
            assert!(
                !modified_since(list, lm, Ims::Before),
                "exact says 304, before does not"
            );
        }
        assert!(modified_since(list, lm, Ims::Off));
        assert!(!modified_since(&written, Some(t), Ims::Exact));
    }
    assert!(if_range_matches(&written, None, Some(t)));
    if etag.len() >= 2 && etag.ends_with(b"\"") {
        assert!(if_range_matches(etag, Some(etag), None));
        assert!(!if_range_matches(etag, None, parse_http_date(etag)));
    }
    let _ = if_range_matches(list, Some(etag), parse_http_date(etag));
}

/// The mp4 module's parser and cut (`?start=&end=` on an MP4 file): the
/// first three bytes pick the start and length (in quarter seconds),
/// `mp4_start_key_frame` and the buffer sizes; the rest is the file.
/// Whatever the file, the answer is the file as it is, a cut, or a
/// failure to log, never a panic; a cut's data lies inside the file,
/// and the cut file (header and data) parses again.
pub fn mp4(data: &[u8]) {
    use crate::http::modules::mp4::{process, Outcome, Params, Slice};
    let [start, length, sizes, file @ ..] = data else {
        return;
    };
    let kib = [1, 4, 64, 512];
    let p = Params {
        start: u64::from(*start) * 250,
        length: u64::from(length & 0x7f) * 250,
        buffer_size: kib[usize::from(sizes & 3)] << 10,
        max_buffer_size: kib[usize::from((sizes >> 2) & 3)] << 10,
        start_key_frame: length & 0x80 != 0,
    };
    let _ = crate::http::modules::mp4::atofp(file.get(..24).unwrap_or(file));
    let Ok(Outcome::Cut(cut)) = process(&Slice(file), file.len() as u64, &p, "fuzz.mp4") else {
        return;
    };
    let end = cut.data_start.checked_add(cut.data_len);
    assert!(
        end.is_some_and(|e| e <= file.len() as u64),
        "data {}+{} past the file's {} bytes",
        cut.data_start,
        cut.data_len,
        file.len()
    );
    let (at, n) = (cut.data_start as usize, cut.data_len as usize);
    let mut again = cut.header;
    again.extend_from_slice(&file[at..at + n]);
    // From the start for a second: a cut again (the cut file has its
    // moov first, so a start of 0 alone would send it as it is).
    let first = Params {
        start: 0,
        length: 1000,
        ..p
    };
    let _ = process(&Slice(&again), again.len() as u64, &first, "cut.mp4");
}

/// The configurations the mail target picks from: each protocol's
/// methods and `starttls` (a STARTTLS without a certificate ends the
/// session, as a failed handshake does).
fn mail_server(cfg: u8) -> crate::mail::conf::MailServer {
    use crate::mail::conf::{auth, AuthHttp, MailServer, Protocol, StartTls};
    let protocol = [Protocol::Pop3, Protocol::Imap, Protocol::Smtp][usize::from(cfg % 3)];
    let every = auth::PLAIN | auth::LOGIN | auth::CRAM_MD5 | auth::EXTERNAL;
    let auth_methods = match (protocol, cfg / 3 % 3) {
        (_, 0) => auth::PLAIN | auth::LOGIN,
        (Protocol::Pop3, 1) => every | auth::APOP,
        (Protocol::Smtp, 1) => auth::NONE,
        _ => every,
    };
    let starttls = [StartTls::Off, StartTls::On, StartTls::Only][usize::from(cfg / 9 % 3)];
    MailServer {
        listen: Vec::new(),
        protocol,
        server_name: "fuzz.test".into(),
        auth_http: AuthHttp {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
            host: "127.0.0.1:9".into(),
            uri: "/".into(),
        },
        auth_http_headers: Vec::new(),
        auth_http_timeout: std::time::Duration::from_secs(1),
        auth_http_pass_client_cert: false,
        pass_error_message: false,
        proxy_timeout: std::time::Duration::from_secs(1),
        proxy_buffer: 4096,
        timeout: std::time::Duration::from_secs(10),
        auth_methods,
        resolver: crate::http::modules::resolver::ResolverLoc::default(),
        capabilities: vec!["IMAP4rev1".into(), "USER".into()],
        // Small buffers reach "too long command" and the literal limit.
        client_buffer: if cfg & 0x80 != 0 { 64 } else { 4096 },
        smtp_greeting_delay: std::time::Duration::ZERO,
        xclient: true,
        proxy_protocol: false,
        proxy_smtp_auth: false,
        max_errors: u32::from((cfg >> 5) & 3) + 1,
        realip_from: Vec::new(),
        starttls,
        tls: None,
        client_auth: None,
        logger: None,
    }
}

thread_local! {
    /// One runtime per fuzzing thread: building one per input would be
    /// most of the time spent.
    static RUNTIME: Option<tokio::runtime::Runtime> = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok();
}

/// The mail dialogues before the login (POP3, IMAP, SMTP: commands,
/// IMAP literals and quoted strings, the SASL exchanges): the first byte
/// picks the protocol and the configuration, the rest is what the
/// client sends before it closes. Each time the dialogue gives
/// credentials it starts again (as after a refused login), until the
/// client is gone or the session ends. What must hold: the greeting
/// comes first, every line the server writes ends in CRLF and has no
/// bare LF (a tag or argument echoed back cannot start a line of its
/// own).
pub fn mail(data: &[u8]) {
    use crate::mail::conf::Protocol;
    use crate::mail::session::{Client, Next, Session};
    use crate::stream::proxy::Sock;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some((&cfg, input)) = data.split_first() else {
        return;
    };
    let srv = std::sync::Arc::new(mail_server(cfg));
    let out = RUNTIME.with(|rt| {
        let rt = rt.as_ref()?;
        rt.block_on(async {
            let (ours, mut peer) = tokio::net::UnixStream::pair().ok()?;
            // The client's bytes are all there at once; then its side
            // is closed for writing and only reads what the server says.
            peer.shutdown().await.ok()?;
            let sock = Sock::Prefixed(input.to_vec(), 0, Box::new(Sock::Unix(ours)));
            let listen = crate::http::conf::ListenAddr::Inet(std::net::SocketAddr::from((
                [127, 0, 0, 1],
                110,
            )));
            let mut s = Session {
                id: 1,
                srv: srv.clone(),
                logger: std::sync::Arc::new(crate::core::log::Logger::default()),
                remote: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 40000))),
                local: None,
                listen,
                salt: None,
                errors: 0,
                attempt: 1,
                tls: false,
                tls_info: None,
                pp: None,
                smtp_helo: Vec::new(),
                host: b"[UNAVAILABLE]".to_vec(),
                esmtp: false,
                smtp_from: Vec::new(),
                smtp_to: Vec::new(),
                tag: Vec::new(),
                action: "in auth state",
            };
            let mut c = Client {
                sock: Some(sock),
                buf: Vec::new(),
                limit: srv.client_buffer,
                timeout: srv.timeout,
            };
            let server = async move {
                let mut greet = true;
                loop {
                    let next = match srv.protocol {
                        Protocol::Pop3 => crate::mail::pop3::dialogue(&mut s, &mut c, greet).await,
                        Protocol::Imap => crate::mail::imap::dialogue(&mut s, &mut c, greet).await,
                        Protocol::Smtp => crate::mail::smtp::dialogue(&mut s, &mut c, greet).await,
                    };
                    match next {
                        Next::Quit => break,
                        Next::Auth(_) => {
                            greet = false;
                            s.attempt += 1;
                        }
                    }
                }
                // The server's side closes: the client reads to the end.
                drop(c);
            };
            let client = async move {
                let mut out = Vec::new();
                let _ = peer.read_to_end(&mut out).await;
                out
            };
            let ((), out) = tokio::join!(server, client);
            Some(out)
        })
    });
    let Some(out) = out else {
        return;
    };
    let greeting: &[u8] = match cfg % 3 {
        0 => b"+OK POP3 ready",
        1 => b"* OK IMAP4 ready\r\n",
        _ => b"220 fuzz.test ESMTP ready\r\n",
    };
    assert!(out.starts_with(greeting), "no greeting first");
    assert!(out.ends_with(b"\r\n"), "the last line has no CRLF");
    for (i, &b) in out.iter().enumerate() {
        if b == b'\n' {
            assert!(i > 0 && out[i - 1] == b'\r', "a bare LF at {i}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TARGETS;
    use std::path::Path;

    /// Replays every saved input of every target: the minimised corpora and
    /// the inputs that once crashed.
    #[test]
    fn corpora_replay() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut replayed = 0;
        for (name, target) in TARGETS {
            for kind in ["seeds", "corpus", "regressions"] {
                let Ok(entries) = std::fs::read_dir(root.join(kind).join(name)) else {
                    continue;
                };
                for e in entries.flatten() {
                    let data = std::fs::read(e.path()).unwrap_or_default();
                    let r = std::panic::catch_unwind(|| target(&data));
                    assert!(r.is_ok(), "{name}: {} panics", e.path().display());
                    replayed += 1;
                }
            }
        }
        assert!(
            replayed > 0,
            "no fuzz corpus found under {}",
            root.display()
        );
    }
}
