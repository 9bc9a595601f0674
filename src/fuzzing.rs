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
