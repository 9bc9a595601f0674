//! `slice` with the configuration nginx documents (`proxy_cache_key
//! $uri$is_args$args$slice_range; proxy_set_header Range $slice_range;
//! proxy_cache_valid 200 206 ...`), compared with nginx on the same
//! configuration: an origin that answers ranges of a 100-byte entity and
//! records each Range it is asked, so the slices fetched, the cache HITs
//! of a second request, the status, Content-Range and body the client gets
//! are all checked, and a later slice whose ETag differs ends the response
//! with nothing sent.
use crate::harness::*;
use crate::origin::Origin;

const LEN: usize = 100;

fn entity() -> Vec<u8> {
    (0..LEN).map(|i| b'a' + (i % 26) as u8).collect()
}

/// Answers `Range: bytes=S-E` with a 206 of that part (ETag fixed, or the
/// range itself under /etag), anything else with the whole 200.
fn origin() -> Origin {
    Origin::start(|req| {
        let body = entity();
        let range = req
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("range: bytes=")
                    .map(str::to_string)
            })
            .and_then(|r| {
                let (s, e) = r.trim().split_once('-')?;
                Some((s.parse::<usize>().ok()?, e.parse::<usize>().ok()?))
            });
        let etag = if req.contains("/etag") {
            format!("\"{:?}\"", range)
        } else {
            "\"v1\"".to_string()
        };
        let mut out = match range {
            Some((s, e)) if s < LEN => {
                let e = e.min(LEN - 1);
                let mut o = format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {}-{}/{}\r\nContent-Length: {}\r\nETag: {}\r\nConnection: close\r\n\r\n",
                    s, e, LEN, e + 1 - s, etag
                )
                .into_bytes();
                o.extend_from_slice(&body[s..=e]);
                return Some(o);
            }
            _ => format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nETag: {}\r\nConnection: close\r\n\r\n",
                LEN, etag
            )
            .into_bytes(),
        };
        out.extend_from_slice(&body);
        Some(out)
    })
}

fn conf(p: u16) -> String {
    format!(
        "http {{ proxy_cache_path cache keys_zone=z:1m;
          server {{ listen 127.0.0.1:@PORT@;
            location /c/ {{
                slice 8;
                proxy_pass http://127.0.0.1:{p}/;
                proxy_cache z;
                proxy_cache_key $uri$is_args$args$slice_range;
                proxy_set_header Range $slice_range;
                proxy_cache_valid 200 206 1h;
                add_header X-C $upstream_cache_status;
            }}
            location /p/ {{
                slice 8;
                proxy_pass http://127.0.0.1:{p}/;
                proxy_set_header Range $slice_range;
            }}
        }} }}"
    )
}

/// The ranges the origin was asked since `from`.
fn asked(o: &Origin, from: usize) -> String {
    o.requests()[from..]
        .iter()
        .map(|r| {
            r.lines()
                .find_map(|l| l.strip_prefix("Range: "))
                .unwrap_or("-")
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Each case: what the client got (status, the headers that matter, the
/// body), then the ranges the origin saw for it.
fn cases(port: u16, o: &Origin) -> Vec<String> {
    let reqs = [
        ("GET", "/c/whole", ""),
        ("GET", "/c/whole", ""),
        ("GET", "/c/mid", "Range: bytes=20-29\r\n"),
        ("GET", "/c/mid", "Range: bytes=22-25\r\n"),
        ("GET", "/c/suffix", "Range: bytes=-5\r\n"),
        ("GET", "/c/open", "Range: bytes=90-\r\n"),
        ("GET", "/c/many", "Range: bytes=1-2,5-6\r\n"),
        ("GET", "/c/inm", "If-None-Match: \"v1\"\r\n"),
        ("HEAD", "/c/head", ""),
        ("GET", "/p/plain", "Range: bytes=30-33\r\n"),
        ("GET", "/p/etag", ""),
    ];
    let mut out = Vec::new();
    for (method, path, extra) in reqs {
        let before = o.count();
        let req = format!(
            "{} {} HTTP/1.1\r\nHost: localhost\r\n{}Connection: close\r\n\r\n",
            method, path, extra
        );
        let raw = raw(port, req.as_bytes());
        let got = match Resp::parse(&raw) {
            Some(r) => {
                let mut s = format!("{} {}", method, r.status_line);
                for h in [
                    "Content-Length",
                    "Content-Range",
                    "Accept-Ranges",
                    "ETag",
                    "X-C",
                ] {
                    if let Some(v) = r.header(h) {
                        s.push_str(&format!(" | {}: {}", h, v));
                    }
                }
                s.push_str(&format!(" | {}", String::from_utf8_lossy(&r.body)));
                s
            }
            None => format!("{} nothing ({} bytes)", method, raw.len()),
        };
        out.push(format!("{} {} <- {}", path, got, asked(o, before)));
    }
    out
}

#[test]
fn slices_fetched_cached_and_cut_as_nginx() {
    let o = origin();
    let s = Server::start(&conf(o.port));
    let got = cases(s.port, &o);
    let e = String::from_utf8(entity()).unwrap();
    let all_slices = (0..13)
        .map(|i| format!("bytes={}-{}", i * 8, i * 8 + 7))
        .collect::<Vec<_>>()
        .join(",");
    let expect_start = [
        format!(
            "/c/whole GET HTTP/1.1 200 OK | Content-Length: 100 | Accept-Ranges: bytes | ETag: \"v1\" | X-C: MISS | {} <- {}",
            e, all_slices
        ),
        // Every slice from the cache: the origin is not asked again.
        format!(
            "/c/whole GET HTTP/1.1 200 OK | Content-Length: 100 | Accept-Ranges: bytes | ETag: \"v1\" | X-C: HIT | {} <- ",
            e
        ),
        format!(
            "/c/mid GET HTTP/1.1 206 Partial Content | Content-Length: 10 | Content-Range: bytes 20-29/100 | ETag: \"v1\" | X-C: MISS | {} <- bytes=16-23,bytes=24-31",
            &e[20..30]
        ),
        format!(
            "/c/mid GET HTTP/1.1 206 Partial Content | Content-Length: 4 | Content-Range: bytes 22-25/100 | ETag: \"v1\" | X-C: HIT | {} <- ",
            &e[22..26]
        ),
        // A suffix range starts at the first slice, then skips ahead.
        format!(
            "/c/suffix GET HTTP/1.1 206 Partial Content | Content-Length: 5 | Content-Range: bytes 95-99/100 | ETag: \"v1\" | X-C: MISS | {} <- bytes=0-7,bytes=88-95,bytes=96-103",
            &e[95..]
        ),
        format!(
            "/c/open GET HTTP/1.1 206 Partial Content | Content-Length: 10 | Content-Range: bytes 90-99/100 | ETag: \"v1\" | X-C: MISS | {} <- bytes=88-95,bytes=96-103",
            &e[90..]
        ),
    ];
    for (i, want) in expect_start.iter().enumerate() {
        assert_eq!(&got[i], want, "case {} of {:#?}", i, got);
    }
    // Several ranges: the whole entity (one range at most, as nginx).
    assert!(
        got[6].contains(" 200 OK | Content-Length: 100"),
        "{:#?}",
        got
    );
    assert!(
        got[6].ends_with(&format!("| {} <- {}", e, all_slices)),
        "{:#?}",
        got
    );
    // If-None-Match against the entity's ETag: 304, no later slice.
    assert!(got[7].contains(" 304 "), "{:#?}", got);
    assert!(got[7].ends_with("<- bytes=0-7"), "{:#?}", got);
    // HEAD: the head of the whole entity, one slice asked.
    assert!(
        got[8].starts_with("/c/head HEAD HTTP/1.1 200 OK | Content-Length: 100"),
        "{:#?}",
        got
    );
    assert!(got[8].ends_with("<- bytes=0-7"), "{:#?}", got);
    // Without a cache, the same slicing.
    assert_eq!(
        got[9],
        format!(
            "/p/plain GET HTTP/1.1 206 Partial Content | Content-Length: 4 | Content-Range: bytes 30-33/100 | ETag: \"v1\" | {} <- bytes=24-31,bytes=32-39",
            &e[30..34]
        )
    );
    // A later slice with another ETag: nothing reaches the client.
    assert_eq!(
        got[10],
        "/p/etag GET nothing (0 bytes) <- bytes=0-7,bytes=8-15"
    );
    s.wait_error_log("etag mismatch in slice response");
    if nginx_installed() {
        let o2 = origin();
        let p = Prefix::new();
        let port = free_port();
        let _n = start_nginx(&p, &conf(o2.port), port).expect("nginx");
        assert_eq!(got, cases(port, &o2));
    }
}
