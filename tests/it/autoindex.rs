//! `autoindex`: listings in every format, byte for byte as nginx 1.22.1
//! writes them for the same directory, and when a listing is refused.
use crate::harness::*;
use std::time::{Duration, UNIX_EPOCH};

/// 2021-03-04 05:06:07 UTC.
const MTIME: u64 = 1_614_834_367;

fn set_mtime(p: &std::path::Path) {
    let f = std::fs::File::open(p).expect("open");
    f.set_modified(UNIX_EPOCH + Duration::from_secs(MTIME))
        .expect("set mtime");
}

/// html/d with a subdirectory, a hidden file, names to escape and cut,
/// and sizes for each unit; every mtime fixed.
fn fixture() -> Prefix {
    let p = Prefix::new();
    p.write("html/d/a.txt", "hi\n");
    p.write("html/d/.hidden", "x");
    p.write("html/d/x&y<z>.txt", "");
    p.write(&format!("html/d/{}", "m".repeat(51)), "");
    p.write("html/d/sub/inner", "");
    p.write("html/empty/.keep", "");
    p.write("html/withindex/index.html", "idx\n");
    for (name, len) in [("ten_k", 10_752u64), ("m15", 1_572_864)] {
        let f = std::fs::File::create(p.path(&format!("html/d/{}", name))).expect("create");
        f.set_len(len).expect("set_len");
    }
    for e in std::fs::read_dir(p.path("html/d")).expect("read_dir") {
        set_mtime(&e.expect("entry").path());
    }
    p
}

// The listing is read in a thread pool; declaring it makes it start with
// the server rather than lazily.
const CONF: &str = r#"
thread_pool default threads=2;
http {
  server {
    listen 127.0.0.1:@PORT@;
    root html;
    autoindex on;
    location /j/ { alias html/d/; autoindex_format json; }
    location /jp/ { alias html/d/; autoindex_format jsonp; }
    location /x/ { alias html/d/; autoindex_format xml; }
    location /k/ { alias html/d/; autoindex_exact_size off; }
    location /off/ { alias html/d/; autoindex off; }
    location /je/ { alias html/empty/; autoindex_format json; }
  }
}"#;

/// One html listing line: link, padded name column, date, size column.
fn line(href: &str, text: &str, text_len: usize, size: &str) -> String {
    format!(
        "<a href=\"{}\">{}</a>{} 04-Mar-2021 05:06 {}\r\n",
        href,
        text,
        " ".repeat(50usize.saturating_sub(text_len)),
        size
    )
}

#[test]
fn html_listing_is_byte_exact() {
    let s = Server::start_in(fixture(), CONF);
    let r = s.get("/d/");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Type"), Some("text/html"));
    assert_eq!(r.header("Transfer-Encoding"), Some("chunked"));
    assert_eq!(r.header("Content-Length"), None);
    let long = "m".repeat(51);
    let mut want = String::from(
        "<html>\r\n<head><title>Index of /d/</title></head>\r\n<body>\r\n\
         <h1>Index of /d/</h1><hr><pre><a href=\"../\">../</a>\r\n",
    );
    // Directories first, then names in byte order; dot files skipped.
    want += &line("sub/", "sub/", 4, &format!("{:>19}", "-"));
    want += &line("a.txt", "a.txt", 5, &format!("{:>19}", 3));
    want += &line("m15", "m15", 3, &format!("{:>19}", 1_572_864));
    want += &format!(
        "<a href=\"{}\">{}..&gt;</a> 04-Mar-2021 05:06 {:>19}\r\n",
        long,
        "m".repeat(47),
        0
    );
    want += &line("ten_k", "ten_k", 5, &format!("{:>19}", 10_752));
    want += &line(
        "x%26y%3Cz%3E.txt",
        "x&amp;y&lt;z&gt;.txt",
        10,
        &format!("{:>19}", 0),
    );
    want += "</pre><hr></body>\r\n</html>\r\n";
    assert_eq!(r.body_str(), want);
}

#[test]
fn html_sizes_rounded_when_not_exact() {
    let s = Server::start_in(fixture(), CONF);
    let body = s.get("/k/").body_str();
    assert!(
        body.contains(&line("sub/", "sub/", 4, "      -")),
        "{}",
        body
    );
    assert!(
        body.contains(&line("a.txt", "a.txt", 5, "      3")),
        "{}",
        body
    );
    assert!(
        body.contains(&line("ten_k", "ten_k", 5, "    11K")),
        "{}",
        body
    );
    assert!(body.contains(&line("m15", "m15", 3, "     2M")), "{}", body);
}

const DATE: &str = "Thu, 04 Mar 2021 05:06:07 GMT";

fn json_body() -> String {
    let long = "m".repeat(51);
    let file = |n: &str, size: u64| {
        format!(
            "{{ \"name\":\"{}\", \"type\":\"file\", \"mtime\":\"{}\", \"size\":{} }}",
            n, DATE, size
        )
    };
    let items = [
        format!(
            "{{ \"name\":\"sub\", \"type\":\"directory\", \"mtime\":\"{}\" }}",
            DATE
        ),
        file("a.txt", 3),
        file("m15", 1_572_864),
        file(&long, 0),
        file("ten_k", 10_752),
        file("x&y<z>.txt", 0),
    ];
    format!("[\r\n{}\r\n]", items.join(",\r\n"))
}

#[test]
fn json_and_jsonp_listings() {
    let s = Server::start_in(fixture(), CONF);
    let r = s.get("/j/");
    assert_eq!(r.header("Content-Type"), Some("application/json"));
    assert_eq!(r.body_str(), json_body());

    let r = s.get("/jp/?callback=cb.x_1");
    assert_eq!(r.header("Content-Type"), Some("application/javascript"));
    assert_eq!(
        r.body_str(),
        format!("/* callback */\r\ncb.x_1({});", json_body())
    );

    // Without a callback, plain json.
    let r = s.get("/jp/");
    assert_eq!(r.header("Content-Type"), Some("application/json"));
    assert_eq!(r.body_str(), json_body());

    // A callback outside [A-Za-z0-9_.] is refused.
    assert_eq!(s.get("/jp/?callback=a%24b").status, 400);

    assert_eq!(s.get("/je/").body_str(), "[\r\n]");
}

#[test]
fn xml_listing() {
    let s = Server::start_in(fixture(), CONF);
    let r = s.get("/x/");
    assert_eq!(r.header("Content-Type"), Some("text/xml; charset=utf-8"));
    let t = "2021-03-04T05:06:07Z";
    let long = "m".repeat(51);
    let file =
        |n: &str, size: u64| format!("<file mtime=\"{}\" size=\"{}\">{}</file>\r\n", t, size, n);
    let want = format!(
        "<?xml version=\"1.0\"?>\r\n<list>\r\n<directory mtime=\"{}\">sub</directory>\r\n{}{}{}{}{}</list>\r\n",
        t,
        file("a.txt", 3),
        file("m15", 1_572_864),
        file(&long, 0),
        file("ten_k", 10_752),
        file("x&amp;y&lt;z&gt;.txt", 0),
    );
    assert_eq!(r.body_str(), want);
}

#[test]
fn listing_only_when_on_and_no_index() {
    let s = Server::start_in(fixture(), CONF);
    // autoindex off: the directory stays forbidden.
    assert_eq!(s.get("/off/").status, 403);
    // An index file wins over the listing.
    assert_eq!(s.get("/withindex/").body, b"idx\n");
    // POST is not listed (nginx then forbids the directory).
    let r = Resp::parse(&s.raw(b"POST /d/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
        .expect("response");
    assert_eq!(r.status, 403);
    // HEAD: the head only, without Transfer-Encoding.
    let raw = s.raw(b"HEAD /empty/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let r = Resp::parse(&raw).expect("response");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Transfer-Encoding"), None);
    assert!(r.body.is_empty());
    // An empty directory lists only "../".
    assert!(s
        .get("/empty/")
        .body_str()
        .ends_with("<a href=\"../\">../</a>\r\n</pre><hr></body>\r\n</html>\r\n"));
}

#[test]
fn autoindex_config_errors() {
    let p = Prefix::new();
    let conf = p.write(
        "conf/nginx.conf",
        "events {}\nhttp {\nautoindex_format yaml;\n}\n",
    );
    let out = p.run(&["-t", "-c", conf.to_str().unwrap_or("")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value \"yaml\" in ") && err.contains(":3"),
        "{}",
        err
    );
    let conf = p.write(
        "conf/nginx.conf",
        "events {}\nhttp {\nautoindex maybe;\n}\n",
    );
    let out = p.run(&["-t", "-c", conf.to_str().unwrap_or("")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "invalid value \"maybe\" in \"autoindex\" directive, it must be \"on\" or \"off\""
        ),
        "{}",
        err
    );
}

#[test]
fn http10_listing_ends_the_connection() {
    let s = Server::start_in(fixture(), CONF);
    // Read to close: the server must close after the unframed body
    // (a kept-alive connection would only end at the 5 s read timeout).
    let t = std::time::Instant::now();
    let raw = s.raw(b"GET /empty/ HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n");
    assert!(t.elapsed() < Duration::from_secs(3), "connection kept open");
    let r = Resp::parse(&raw).expect("response");
    assert_ne!(r.header("Connection"), Some("keep-alive"));
    assert!(r.body_str().ends_with("</html>\r\n"), "{}", r.body_str());
}
