//! Files and headers: conditional requests (304/412), `add_header`,
//! `add_trailer`, `expires`, `etag`, ranges (206, multipart, 416,
//! `If-Range`, `max_ranges`) and `charset`. The expected bytes are those
//! nginx 1.22.1 sends for the same config and request (compared
//! side by side), with Date/Server blanked and tern's name in error pages.
use crate::harness::*;
use std::time::{Duration, UNIX_EPOCH};

/// 2023-01-02 03:04:05 UTC, hex 63b249a5: the mtime of every test file.
const MTIME: u64 = 1_672_628_645;
const LM: &str = "Mon, 02 Jan 2023 03:04:05 GMT";
/// 21 bytes.
const BODY: &str = "0123456789abcdefghij\n";
const ETAG: &str = "\"63b249a5-15\"";

fn prefix() -> Prefix {
    let p = Prefix::new();
    for f in ["html/a.txt", "html/a.css", "html/a.html"] {
        let path = p.write(f, BODY);
        let file = std::fs::File::options()
            .write(true)
            .open(path)
            .expect("open");
        file.set_modified(UNIX_EPOCH + Duration::from_secs(MTIME))
            .expect("mtime");
    }
    p.write("html/d/x", "");
    p
}

fn start(locations: &str) -> Server {
    start_http("", locations)
}

fn start_http(http: &str, locations: &str) -> Server {
    let conf = format!(
        "http {{ types {{ text/plain txt; text/css css; text/html html; }} {http}\n\
         server {{ listen 127.0.0.1:@PORT@; root html; {locations} }} }}"
    );
    Server::start_in(prefix(), &conf)
}

fn req(s: &Server, path: &str, headers: &[&str]) -> Resp {
    req_m(s, "GET", path, headers)
}

fn req_m(s: &Server, method: &str, path: &str, headers: &[&str]) -> Resp {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for h in headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    Resp::parse(&s.raw(r.as_bytes())).expect("a response")
}

fn head(lines: &[&str]) -> String {
    let mut s = lines.join("\r\n");
    s.push_str("\r\n\r\n");
    s
}

fn ok_head(extra: &[&str]) -> String {
    let mut l = vec![
        "HTTP/1.1 200 OK",
        "Server: X",
        "Date: X",
        "Content-Type: text/plain",
        "Content-Length: 21",
    ];
    let lm = format!("Last-Modified: {LM}");
    let et = format!("ETag: {ETAG}");
    l.push(&lm);
    l.push("Connection: close");
    l.push(&et);
    l.extend_from_slice(extra);
    head(&l)
}

fn not_modified_head() -> String {
    head(&[
        "HTTP/1.1 304 Not Modified",
        "Server: X",
        "Date: X",
        &format!("Last-Modified: {LM}"),
        "Connection: close",
        &format!("ETag: {ETAG}"),
    ])
}

fn precondition_failed(r: &Resp) {
    assert_eq!(r.status, 412, "{}", r.head);
    assert_eq!(
        r.head_normalized(),
        head(&[
            "HTTP/1.1 412 Precondition Failed",
            "Server: X",
            "Date: X",
            "Content-Type: text/html",
            &format!("Content-Length: {}", r.body.len()),
            "Connection: close",
        ])
    );
    assert!(r
        .body_str()
        .contains("<title>412 Precondition Failed</title>"));
}

#[test]
fn plain_file_has_validators_and_accept_ranges() {
    let s = start("");
    let r = req(&s, "/a.txt", &[]);
    assert_eq!(r.head_normalized(), ok_head(&["Accept-Ranges: bytes"]));
    assert_eq!(r.body_str(), BODY);
}

#[test]
fn if_modified_since_modes() {
    let s = start(
        "location /be/ { alias html/; if_modified_since before; }
         location /off/ { alias html/; if_modified_since off; }",
    );
    let same = format!("If-Modified-Since: {LM}");
    let later = "If-Modified-Since: Mon, 02 Jan 2024 03:04:05 GMT";
    // exact (default): only the same date is "not modified".
    assert_eq!(
        req(&s, "/a.txt", &[&same]).head_normalized(),
        not_modified_head()
    );
    let r = req(&s, "/a.txt", &[later]);
    assert_eq!(r.head_normalized(), ok_head(&["Accept-Ranges: bytes"]));
    assert_eq!(r.body_str(), BODY);
    let r = req(&s, "/a.txt", &["If-Modified-Since: garbage"]);
    assert_eq!(r.status, 200);
    // before: a later date is fine too.
    let r = req(&s, "/be/a.txt", &[later]);
    assert_eq!(r.head_normalized(), not_modified_head());
    assert!(r.body.is_empty());
    let r = req(
        &s,
        "/be/a.txt",
        &["If-Modified-Since: Mon, 02 Jan 2023 03:04:04 GMT"],
    );
    assert_eq!(r.status, 200);
    // off: never 304, even with a matching If-None-Match.
    let inm = format!("If-None-Match: {ETAG}");
    assert_eq!(req(&s, "/off/a.txt", &[&same, &inm]).status, 200);
}

#[test]
fn if_none_match_lists_weak_and_star() {
    let s = start("location /noetag/ { alias html/; etag off; }");
    for v in [
        format!("If-None-Match: {ETAG}"),
        format!("If-None-Match: \"x\", W/{ETAG}"),
        format!("If-None-Match: \"x\",\t{ETAG} , \"y\""),
        "If-None-Match: *".to_string(),
    ] {
        assert_eq!(
            req(&s, "/a.txt", &[&v]).head_normalized(),
            not_modified_head(),
            "{v}"
        );
    }
    assert_eq!(
        req(&s, "/a.txt", &["If-None-Match: \"63b249a5-1\""]).status,
        200
    );
    // Both present: both must say "not modified".
    let inm = format!("If-None-Match: {ETAG}");
    assert_eq!(
        req(
            &s,
            "/a.txt",
            &[&inm, "If-Modified-Since: Mon, 02 Jan 2023 03:04:06 GMT"]
        )
        .status,
        200
    );
    // Without an ETag only `*` matches.
    let r = req(&s, "/noetag/a.txt", &["If-None-Match: *"]);
    assert_eq!(
        r.head_normalized(),
        head(&[
            "HTTP/1.1 304 Not Modified",
            "Server: X",
            "Date: X",
            &format!("Last-Modified: {LM}"),
            "Connection: close",
        ])
    );
    assert_eq!(req(&s, "/noetag/a.txt", &[&inm]).status, 200);
}

#[test]
fn if_match_and_if_unmodified_since_give_412() {
    let s = start(
        "location /hdr/ { alias html/; add_header X-A a; add_header X-B \"b $status\" always; }",
    );
    precondition_failed(&req(&s, "/a.txt", &["If-Match: \"nope\""]));
    // Strong comparison: a weak tag never matches If-Match.
    precondition_failed(&req(&s, "/a.txt", &[&format!("If-Match: W/{ETAG}")]));
    precondition_failed(&req(
        &s,
        "/a.txt",
        &["If-Unmodified-Since: Mon, 02 Jan 2023 03:04:04 GMT"],
    ));
    precondition_failed(&req(&s, "/a.txt", &["If-Unmodified-Since: garbage"]));
    assert_eq!(
        req(&s, "/a.txt", &[&format!("If-Match: {ETAG}")]).status,
        200
    );
    assert_eq!(req(&s, "/a.txt", &["If-Match: *"]).status, 200);
    assert_eq!(
        req(&s, "/a.txt", &[&format!("If-Unmodified-Since: {LM}")]).status,
        200
    );
    // The 412 page only gets `always` headers, with its own status.
    let r = req(&s, "/hdr/a.txt", &["If-Match: \"nope\""]);
    assert_eq!(r.status, 412);
    assert_eq!(r.header("X-B"), Some("b 412"));
    assert_eq!(r.header("X-A"), None);
    assert_eq!(r.header("ETag"), None);
}

#[test]
fn single_ranges() {
    let s = start("");
    let range_head = |len: usize, cr: &str| {
        head(&[
            "HTTP/1.1 206 Partial Content",
            "Server: X",
            "Date: X",
            "Content-Type: text/plain",
            &format!("Content-Length: {len}"),
            &format!("Last-Modified: {LM}"),
            "Connection: close",
            &format!("ETag: {ETAG}"),
            &format!("Content-Range: bytes {cr}"),
        ])
    };
    for (v, cr, body) in [
        ("bytes=0-3", "0-3/21", "0123"),
        ("bytes= 2 - 3 ", "2-3/21", "23"),
        ("Bytes=2-3", "2-3/21", "23"),
        ("bytes=-5", "16-20/21", "ghij\n"),
        ("bytes=15-", "15-20/21", "fghij\n"),
        ("bytes=15-100", "15-20/21", "fghij\n"),
        ("bytes=0-1,100-200", "0-1/21", "01"),
    ] {
        let r = req(&s, "/a.txt", &[&format!("Range: {v}")]);
        assert_eq!(r.head_normalized(), range_head(body.len(), cr), "{v}");
        assert_eq!(r.body_str(), body, "{v}");
    }
    // HEAD: the same head, no body.
    let r = req_m(&s, "HEAD", "/a.txt", &["Range: bytes=0-3"]);
    assert_eq!(r.head_normalized(), range_head(4, "0-3/21"));
    assert!(r.body.is_empty());
}

#[test]
fn multipart_byteranges_exact_bytes() {
    let s = start("");
    let r = req(&s, "/a.txt", &["Range: bytes=0-1,15-100,0-0"]);
    let b = "00000000000000000001";
    let body = format!(
        "\r\n--{b}\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-1/21\r\n\r\n01\
         \r\n--{b}\r\nContent-Type: text/plain\r\nContent-Range: bytes 15-20/21\r\n\r\nfghij\n\
         \r\n--{b}\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-0/21\r\n\r\n0\
         \r\n--{b}--\r\n"
    );
    assert_eq!(body.len(), 288);
    assert_eq!(
        r.head_normalized(),
        head(&[
            "HTTP/1.1 206 Partial Content",
            "Server: X",
            "Date: X",
            &format!("Content-Type: multipart/byteranges; boundary={b}"),
            "Content-Length: 288",
            &format!("Last-Modified: {LM}"),
            "Connection: close",
            &format!("ETag: {ETAG}"),
        ])
    );
    assert_eq!(r.body_str(), body);
    // The boundary is a process-wide counter.
    let r = req(&s, "/a.txt", &["Range: bytes=0-0,2-2"]);
    assert_eq!(
        r.header("Content-Type"),
        Some("multipart/byteranges; boundary=00000000000000000002")
    );
}

#[test]
fn unsatisfiable_and_ignored_ranges() {
    let s = start(
        "location /mr0/ { alias html/; max_ranges 0; }
         location /mr1/ { alias html/; max_ranges 1; }
         location /hdr/ { alias html/; add_header X-A a; add_header X-B \"b $status\" always; expires 1h; }",
    );
    for v in [
        "bytes=abc",
        "bytes=0-1,",
        "bytes=-0",
        "bytes=5-2",
        "bytes=21-",
        "bytes=0-1x",
    ] {
        let r = req(&s, "/a.txt", &[&format!("Range: {v}")]);
        assert_eq!(
            r.head_normalized(),
            head(&[
                "HTTP/1.1 416 Requested Range Not Satisfiable",
                "Server: X",
                "Date: X",
                "Content-Type: text/html",
                &format!("Content-Length: {}", r.body.len()),
                "Connection: close",
                "Content-Range: bytes */21",
            ]),
            "{v}"
        );
        assert!(r
            .body_str()
            .contains("<title>416 Requested Range Not Satisfiable</title>"));
    }
    // Whole body: overlapping ranges larger than the file, or not "bytes=".
    for v in ["bytes=0-100,1-100", "items=0-1", "bytes="] {
        let r = req(&s, "/a.txt", &[&format!("Range: {v}")]);
        assert_eq!(
            r.head_normalized(),
            ok_head(&["Accept-Ranges: bytes"]),
            "{v}"
        );
        assert_eq!(r.body_str(), BODY);
    }
    // max_ranges 0: no ranges and no Accept-Ranges; 1: two ranges = whole.
    let r = req(&s, "/mr0/a.txt", &["Range: bytes=1-2"]);
    assert_eq!(r.head_normalized(), ok_head(&[]));
    let r = req(&s, "/mr1/a.txt", &["Range: bytes=1-2,4-5"]);
    assert_eq!(r.head_normalized(), ok_head(&["Accept-Ranges: bytes"]));
    assert_eq!(req(&s, "/mr1/a.txt", &["Range: bytes=1-2"]).status, 206);
    // The 416 page keeps the headers added for the 200, then gets the
    // `always` ones again with its own status (as nginx).
    let r = req(&s, "/hdr/a.txt", &["Range: bytes=100-"]);
    assert_eq!(r.status, 416);
    let names: Vec<String> = r.headers.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let tail: Vec<&str> = names.iter().skip(5).map(|s| s.as_str()).collect();
    assert_eq!(
        tail[2..],
        [
            "X-A=a",
            "X-B=b 200",
            "Content-Range=bytes */21",
            "X-B=b 416"
        ]
    );
    assert!(tail[0].starts_with("Expires="));
    assert_eq!(tail[1], "Cache-Control=max-age=3600");
}

#[test]
fn if_range_by_etag_and_date() {
    let s = start("");
    let range = "Range: bytes=1-1";
    for (ir, status) in [
        (format!("If-Range: {ETAG}"), 206),
        ("If-Range: \"x\"".to_string(), 200),
        (format!("If-Range: W/{ETAG}"), 200),
        (format!("If-Range: {LM}"), 206),
        ("If-Range: Mon, 02 Jan 2023 03:04:06 GMT".to_string(), 200),
        ("If-Range: garbage".to_string(), 200),
    ] {
        let r = req(&s, "/a.txt", &[&ir, range]);
        assert_eq!(r.status, status, "{ir}");
        if status == 206 {
            assert_eq!(r.body_str(), "1");
        } else {
            assert_eq!(r.head_normalized(), ok_head(&["Accept-Ranges: bytes"]));
        }
    }
}

#[test]
fn add_header_inheritance_and_always() {
    let s = start_http(
        "add_header X-Http h;",
        "add_header X-Srv s always;
         location /inh/ { alias html/; }
         location /own/ { alias html/; add_header X-Own o; add_header X-Empty \"\"; }
         location /var/ { alias html/; add_header X-U \"$uri|$request_method|$status\"; }",
    );
    // The server level replaces http's list; Accept-Ranges comes after.
    let r = req(&s, "/a.txt", &[]);
    assert_eq!(
        r.head_normalized(),
        ok_head(&["X-Srv: s", "Accept-Ranges: bytes"])
    );
    let r = req(&s, "/inh/a.txt", &[]);
    assert_eq!(
        r.head_normalized(),
        ok_head(&["X-Srv: s", "Accept-Ranges: bytes"])
    );
    // An empty value adds nothing.
    let r = req(&s, "/own/a.txt", &[]);
    assert_eq!(
        r.head_normalized(),
        ok_head(&["X-Own: o", "Accept-Ranges: bytes"])
    );
    let r = req(&s, "/var/a.txt", &[]);
    assert_eq!(
        r.head_normalized(),
        ok_head(&["X-U: /var/a.txt|GET|200", "Accept-Ranges: bytes"])
    );
    // 404: only `always`; a 301 is a "safe" status.
    let r = req(&s, "/nope", &[]);
    assert_eq!(r.status, 404);
    assert_eq!(r.header("X-Srv"), Some("s"));
    let r = req(&s, "/own/nope", &[]);
    assert_eq!(r.header("X-Own"), None);
    let r = req(&s, "/d", &[]);
    assert_eq!(r.status, 301);
    assert_eq!(r.header("X-Srv"), Some("s"));
    // 304 gets the headers too.
    let r = req(&s, "/own/a.txt", &[&format!("If-None-Match: {ETAG}")]);
    assert_eq!(r.status, 304);
    assert_eq!(r.header("X-Own"), Some("o"));
}

#[test]
fn add_header_replaces_etag_and_last_modified() {
    let s = start(
        "location /et/ { alias html/; add_header ETag '\"mine\"'; add_header Last-Modified yesterday; }
         location /etx/ { alias html/; add_header ETag \"\"; add_header Last-Modified \"\"; }
         location /off/ { alias html/; etag off; }",
    );
    let r = req(&s, "/et/a.txt", &[]);
    assert_eq!(
        r.head_normalized(),
        head(&[
            "HTTP/1.1 200 OK",
            "Server: X",
            "Date: X",
            "Content-Type: text/plain",
            "Content-Length: 21",
            "Connection: close",
            "ETag: \"mine\"",
            "Last-Modified: yesterday",
            "Accept-Ranges: bytes",
        ])
    );
    let r = req(&s, "/etx/a.txt", &[]);
    let no_validators = head(&[
        "HTTP/1.1 200 OK",
        "Server: X",
        "Date: X",
        "Content-Type: text/plain",
        "Content-Length: 21",
        "Connection: close",
        "Accept-Ranges: bytes",
    ]);
    assert_eq!(r.head_normalized(), no_validators);
    let r = req(&s, "/off/a.txt", &[]);
    assert_eq!(r.header("ETag"), None);
    assert_eq!(r.header("Last-Modified"), Some(LM));
}

#[test]
fn expires_variants() {
    let s = start(
        "location /ep/ { alias html/; expires epoch; }
         location /mx/ { alias html/; expires max; }
         location /neg/ { alias html/; expires -1; }
         location /h/ { alias html/; expires 1h; }
         location /mod/ { alias html/; expires modified 1d; }
         location /cc/ { alias html/; expires 1h; add_header Cache-Control private; }
         location /nf/ { expires 1h; }",
    );
    let get = |p: &str| req(&s, p, &[]);
    let r = get("/ep/a.txt");
    assert_eq!(
        r.head_normalized(),
        ok_head(&[
            "Expires: Thu, 01 Jan 1970 00:00:01 GMT",
            "Cache-Control: no-cache",
            "Accept-Ranges: bytes"
        ])
    );
    let r = get("/mx/a.txt");
    assert_eq!(
        r.head_normalized(),
        ok_head(&[
            "Expires: Thu, 31 Dec 2037 23:55:55 GMT",
            "Cache-Control: max-age=315360000",
            "Accept-Ranges: bytes"
        ])
    );
    // Negative: an Expires in the past and no-cache.
    let r = get("/neg/a.txt");
    assert_eq!(r.header("Cache-Control"), Some("no-cache"));
    let r = get("/h/a.txt");
    assert_eq!(r.header("Cache-Control"), Some("max-age=3600"));
    let exp = r.header("Expires").expect("Expires");
    let date = r.header("Date").expect("Date");
    assert_ne!(exp, date);
    // modified 1d from a 2023 file: already past, so no-cache.
    let r = get("/mod/a.txt");
    assert_eq!(r.header("Expires"), Some("Tue, 03 Jan 2023 03:04:05 GMT"));
    assert_eq!(r.header("Cache-Control"), Some("no-cache"));
    let r = get("/cc/a.txt");
    let cc: Vec<&str> = r
        .headers
        .iter()
        .filter(|(n, _)| n == "Cache-Control")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(cc, ["max-age=3600", "private"]);
    // Not for a 404.
    let r = get("/nf/nope");
    assert_eq!(r.status, 404);
    assert_eq!(r.header("Expires"), None);
}

#[test]
fn add_trailer_makes_the_response_chunked() {
    let s = start(
        "location /tr/ { alias html/; add_trailer X-T \"t $status\"; add_trailer X-E \"\"; }",
    );
    let raw = s.raw(b"GET /tr/a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (h, body) = text.split_once("\r\n\r\n").expect("head");
    assert!(h.contains("\r\nTransfer-Encoding: chunked\r\n"), "{h}");
    assert!(!h.contains("Content-Length"), "{h}");
    assert_eq!(body, format!("15\r\n{BODY}\r\n0\r\nX-T: t 200\r\n\r\n"));
    // A range keeps its 206 and its trailer says so.
    let raw = s
        .raw(b"GET /tr/a.txt HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0\r\nConnection: close\r\n\r\n");
    let text = String::from_utf8_lossy(&raw).into_owned();
    assert!(text.starts_with("HTTP/1.1 206 "), "{text}");
    assert!(
        text.ends_with("\r\n\r\n1\r\n0\r\n0\r\nX-T: t 206\r\n\r\n"),
        "{text}"
    );
    // HTTP/1.0 and HEAD keep Content-Length and get no trailers; a 404 too.
    let r = Resp::parse(&s.raw(b"GET /tr/a.txt HTTP/1.0\r\n\r\n")).expect("resp");
    assert_eq!(r.header("Content-Length"), Some("21"));
    assert_eq!(r.body_str(), BODY);
    let r = req_m(&s, "HEAD", "/tr/a.txt", &[]);
    assert_eq!(r.header("Content-Length"), Some("21"));
    let r = req(&s, "/tr/nope", &[]);
    assert!(r.header("Content-Length").is_some());
}

#[test]
fn charset_types_and_error_pages() {
    let s = start_http(
        "charset UTF-8;",
        "location /t/ { alias html/; charset_types text/plain; }
         location /s/ { alias html/; charset_types *; charset koi8-r; source_charset KOI8-R; }
         location /o/ { alias html/; charset off; }
         location /v/ { alias html/; charset $arg_c; }",
    );
    let ct = |p: &str| req(&s, p, &[]).header("Content-Type").map(str::to_string);
    assert_eq!(ct("/a.txt").as_deref(), Some("text/plain; charset=UTF-8"));
    assert_eq!(ct("/a.html").as_deref(), Some("text/html; charset=UTF-8"));
    assert_eq!(ct("/a.css").as_deref(), Some("text/css"));
    // text/html is always in the list.
    assert_eq!(ct("/t/a.html").as_deref(), Some("text/html; charset=UTF-8"));
    assert_eq!(ct("/s/a.css").as_deref(), Some("text/css; charset=koi8-r"));
    assert_eq!(ct("/o/a.txt").as_deref(), Some("text/plain"));
    assert_eq!(
        ct("/v/a.txt?c=foo").as_deref(),
        Some("text/plain; charset=foo")
    );
    // Error pages are text/html too.
    assert_eq!(ct("/nope").as_deref(), Some("text/html; charset=UTF-8"));
    let r = req(&s, "/a.txt", &["Range: bytes=99-"]);
    assert_eq!(r.status, 416);
    assert_eq!(r.header("Content-Type"), Some("text/html; charset=UTF-8"));
    // The parts of a multipart answer carry the charset.
    let r = req(&s, "/a.txt", &["Range: bytes=0-0,1-1"]);
    assert!(r.body_str().contains(
        "\r\nContent-Type: text/plain; charset=UTF-8\r\nContent-Range: bytes 0-0/21\r\n"
    ));
    // 304 has no Content-Type at all.
    let r = req(&s, "/a.txt", &[&format!("If-None-Match: {ETAG}")]);
    assert_eq!(r.header("Content-Type"), None);
}

fn config_error(body: &str) -> String {
    let p = Prefix::new();
    p.write(
        "conf/nginx.conf",
        format!("events {{}}\nhttp {{ server {{ listen 127.0.0.1:1; {body} }} }}\n"),
    );
    let out = p.run(&["-t", "-c", &p.path("conf/nginx.conf").to_string_lossy()]);
    assert!(!out.status.success(), "accepted: {body}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn config_errors_as_nginx() {
    for (body, msg) in [
        ("add_header X y z;", "invalid parameter \"z\" in "),
        (
            "add_header X;",
            "invalid number of arguments in \"add_header\" directive in ",
        ),
        ("expires foo;", "\"expires\" directive invalid value in "),
        (
            "expires modified;",
            "\"expires\" directive invalid value in ",
        ),
        ("expires bad 1h;", "\"expires\" directive invalid value in "),
        (
            "expires modified @1h;",
            "\"expires\" directive daily time cannot be used with \"modified\" parameter in ",
        ),
        (
            "expires @25h;",
            "\"expires\" directive daily time value must be less than 24 hours in ",
        ),
        (
            "expires 1h; expires 2h;",
            "\"expires\" directive is duplicate in ",
        ),
        (
            "max_ranges -1;",
            "\"max_ranges\" directive invalid number in ",
        ),
        ("if_modified_since foo;", "invalid value \"foo\" in "),
        (
            "etag foo;",
            "invalid value \"foo\" in \"etag\" directive, it must be \"on\" or \"off\" in ",
        ),
        (
            "charset utf-8; charset koi8-r;",
            "\"charset\" directive is duplicate in ",
        ),
        (
            "charset utf-8; source_charset koi8-r;",
            "no \"charset_map\" between the charsets \"koi8-r\" and \"utf-8\"",
        ),
    ] {
        let err = config_error(body);
        assert!(err.contains(msg), "{body}: {err}");
    }
    // A pair with a charset_map (either direction) loads.
    let err = config_error(
        "location / { charset utf-8; source_charset koi8-r; } } charset_map koi8-r utf-8 { C0 D0B0; } server { listen 127.0.0.1:2; location / { charset koi8-r; source_charset utf-8; } foo;",
    );
    assert!(err.contains("unknown directive \"foo\""), "{err}");
}
