//! `proxy_cache_purge ZONE KEY` with ngx_cache_purge's syntax and answers
//! (200 "Successful purge" with the key and the file's path, 404 when
//! there is no entry), and tern's key-prefix wildcard (`KEY*`). A purged
//! entry is fetched again by the next request. (Debian's
//! libnginx-mod-http-cache-purge 2.3 crashes the worker on every purge
//! with nginx 1.22.1 here, so the page's bytes follow the module's
//! source, not a run of it.)

use crate::harness::Server;
use crate::origin::Origin;

fn status_and_cache(s: &Server, path: &str) -> String {
    let r = s.get(path);
    format!("{} {}", r.status, r.header("X-Cache").unwrap_or("-"))
}

#[test]
fn proxy_cache_purge_removes_entries_for_good() {
    let o = Origin::start(|req| {
        let path = req.split(' ').nth(1).unwrap_or("").to_string();
        Some(Origin::ok(&format!("origin {path}"), ""))
    });
    let conf = format!(
        "http {{\n\
         proxy_cache_path cache levels=1:2 keys_zone=z:1m;\n\
         server {{ listen 127.0.0.1:@PORT@;\n\
           location / {{ proxy_cache z; proxy_cache_key $uri; proxy_cache_valid 200 1h;\n\
             add_header X-Cache $upstream_cache_status; proxy_pass http://127.0.0.1:{}; }}\n\
           location ~ ^/purge(/.*) {{ proxy_cache_purge z $1; }}\n\
         }}\n\
         }}\n",
        o.port
    );
    let s = Server::start(&conf);
    assert_eq!(status_and_cache(&s, "/a"), "200 MISS");
    assert_eq!(status_and_cache(&s, "/a"), "200 HIT");
    let r = s.get("/purge/a");
    assert_eq!(r.status, 200, "{}", s.error_log());
    assert_eq!(r.header("Content-Type"), Some("text/html"));
    let md5 = "0639767f3e9eaad729b54037a7e2abf5"; // md5("/a")
    let path = s.prefix.path(&format!("cache/5/bf/{md5}"));
    assert_eq!(
        r.body_str(),
        format!(
            "<html>\r\n<head><title>Successful purge</title></head>\r\n<body bgcolor=\"white\">\r\n\
             <center><h1>Successful purge</h1>\r\n<br>Key : /a\r\n<br>Path: {}\r\n</center>\r\n\
             <hr><center>tern/{}</center>\r\n</body>\r\n</html>\r\n",
            path.display(),
            env!("CARGO_PKG_VERSION")
        )
    );
    assert!(!path.exists());
    // Gone: a second purge finds nothing, the next request goes upstream.
    assert_eq!(s.get("/purge/a").status, 404);
    assert_eq!(status_and_cache(&s, "/a"), "200 MISS");
    assert_eq!(o.count(), 2);

    // A key prefix: /p/1 and /p/2 go, /q/1 stays.
    for p in ["/p/1", "/p/2", "/q/1"] {
        assert_eq!(status_and_cache(&s, p), "200 MISS");
    }
    let r = s.get("/purge/p/*");
    assert_eq!(r.status, 200, "{}", s.error_log());
    assert!(
        r.body_str().contains("<br>Key : /p/*\r\n"),
        "{}",
        r.body_str()
    );
    assert_eq!(status_and_cache(&s, "/p/1"), "200 MISS");
    assert_eq!(status_and_cache(&s, "/p/2"), "200 MISS");
    assert_eq!(status_and_cache(&s, "/q/1"), "200 HIT");
    assert_eq!(s.get("/purge/nothing/*").status, 404);
}

#[test]
fn proxy_cache_purge_in_the_caching_location_is_refused() {
    let t = crate::harness::ConfTest::run(
        "events {}\nhttp {\n proxy_cache_path c keys_zone=z:1m;\n server {\n  location / {\n   proxy_cache z;\n   proxy_cache_purge PURGE from 127.0.0.1;\n   proxy_pass http://127.0.0.1:1;\n  }\n }\n}\n",
    );
    assert!(
        t.stderr
            .contains("\"proxy_cache_purge\" in the caching location"),
        "{}",
        t.stderr
    );
    assert_ne!(t.code, Some(0));
}
