//! The dav module against the real nginx: the same sequence of PUT,
//! DELETE, MKCOL, COPY and MOVE requests on the same tree gives the same
//! answers and leaves the same files (names, types, modes, contents);
//! tern's own checks: the PUT temp file is renamed or removed, never left,
//! the error-log wording, the directive checks and `-V`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::differential::{nginx_side, tern_side};
use crate::harness::Prefix;

const CONF: &str = r#"
http {
    access_log off;
    types { text/plain txt; }
    client_body_temp_path body 1 2;
    server {
        listen 127.0.0.1:@PORT@;
        location / { dav_methods PUT DELETE MKCOL COPY MOVE; }
        location /full/ {
            dav_methods PUT DELETE MKCOL COPY MOVE;
            create_full_put_path on;
            dav_access group:rw all:r;
        }
        location /min/ { dav_methods DELETE; min_delete_depth 3; }
        location /ponly/ { dav_methods PUT; }
        location /off/ { dav_methods off; }
    }
}
"#;

/// The tree both servers start from (world-writable: nginx's worker and
/// tern's run as different users when the tests run as root).
fn files(p: &Prefix) {
    p.write("html/f.txt", "hello");
    p.write("html/tree/a", "A");
    p.write("html/tree/sub/b", "B");
    p.write("html/min/a/b/c", "c");
    p.write("html/min/a/x", "x");
    p.write("html/ponly/keep", "k");
    std::fs::create_dir_all(p.path("html/d/e")).expect("mkdir");
    open_up(&p.path("html"));
    // One mtime for both trees, so copies carry the same times.
    crate::differential::fix_times(&p.path("html"));
}

fn open_up(dir: &Path) {
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777));
    for e in std::fs::read_dir(dir).expect("readdir").flatten() {
        let path = e.path();
        if path.is_dir() {
            open_up(&path);
        } else {
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666));
        }
    }
}

fn req(method: &str, uri: &str, extra: &str, body: &str) -> String {
    let len = if body.is_empty() && method != "PUT" {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    format!(
        "{} {} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{}{}\r\n{}",
        method, uri, extra, len, body
    )
}

fn requests() -> Vec<String> {
    let dest = |d: &str| format!("Destination: {}\r\n", d);
    vec![
        req("PUT", "/p.txt", "", "ab"),
        req("PUT", "/p.txt", "", "abc"),
        req("PUT", "/p%20q.txt", "", "ab"),
        req("PUT", "/d", "", "ab"),
        req("PUT", "/x/y/z", "", "ab"),
        req("PUT", "/d/", "", "ab"),
        req("PUT", "/r", "Content-Range: bytes 0-1/2\r\n", "ab"),
        "PUT /c HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n".into(),
        req("PUT", "/full/a/b/c", "", "deep"),
        req("MKCOL", "/m/", "", ""),
        req("MKCOL", "/m/", "", ""),
        req("MKCOL", "/m", "", ""),
        req("MKCOL", "/no/m/", "", ""),
        req("MKCOL", "/full/m/", "", ""),
        req("MKCOL", "/m2/", "", "x"),
        req("DELETE", "/nonexist", "", ""),
        req("DELETE", "/f.txt/x", "", ""),
        req("DELETE", "/d", "", ""),
        req("DELETE", "/d/", "Depth: 1\r\n", ""),
        req("DELETE", "/p.txt", "Depth: bogus\r\n", ""),
        req("DELETE", "/p%20q.txt", "Depth: infinity\r\n", ""),
        req("DELETE", "/c", "", "x"),
        req("DELETE", "/min/a", "", ""),
        req("DELETE", "/min/a/b/c", "", ""),
        req("COPY", "/f.txt", "", ""),
        req("COPY", "/f.txt", &dest("ftp://localhost/x"), ""),
        req("COPY", "/f.txt", &dest("http://other/x"), ""),
        req("COPY", "/f.txt", &dest("http://localhost"), ""),
        req("COPY", "/f.txt", &dest("http://localhost:1/f2.txt"), ""),
        req("COPY", "/f.txt", &dest("/a/../../x"), ""),
        req("COPY", "/f.txt", &dest("/f3/"), ""),
        req("COPY", "/f.txt", &dest("/f4.txt?x=1"), ""),
        req("COPY", "/f.txt", &format!("{}Overwrite: F\r\n", dest("/f4.txt")), ""),
        req("COPY", "/f.txt", &format!("{}Overwrite: x\r\n", dest("/f4.txt")), ""),
        req("COPY", "/f.txt", &dest("/d"), ""),
        req("COPY", "/f.txt", &dest("/nodir/f"), ""),
        req("COPY", "/tree/", &dest("/tree2/"), ""),
        req("COPY", "/tree", &dest("/tree3"), ""),
        req("COPY", "/tree/", &format!("{}Depth: 0\r\n", dest("/tree2/")), ""),
        req("COPY", "/tree/", &format!("{}Overwrite: T\r\n", dest("/d/")), ""),
        req("MOVE", "/tree2/", &dest("/moved/"), ""),
        req("MOVE", "/f4.txt", &dest("/new/dir/f5.txt"), ""),
        req("MOVE", "/f2.txt", &format!("{}Depth: 0\r\n", dest("/f6.txt")), ""),
        req("MOVE", "/nonexist", &dest("/f6.txt"), ""),
        req("DELETE", "/ponly/keep", "", ""),
        req("PUT", "/off/x", "", "ab"),
        req("GET", "/moved/a", "", ""),
        req("OPTIONS", "/f.txt", "", ""),
        req("DELETE", "/tree/", "", ""),
    ]
}

/// Every file and directory under `dir`: path, kind, mode, content.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap_or(&p).display().to_string();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let mode = m.permissions().mode() & 0o7777;
            if m.is_dir() {
                out.push(format!("{} dir {:o}", rel, mode));
                walk(base, &p, out);
            } else {
                let data = std::fs::read(&p).unwrap_or_default();
                out.push(format!(
                    "{} file {:o} {:?}",
                    rel,
                    mode,
                    String::from_utf8_lossy(&data)
                ));
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn dav_as_nginx() {
    let (s, ours) = tern_side(CONF, files, &requests());
    let status = |i: usize| ours[i].split(' ').nth(1).unwrap_or("").to_string();
    // PUT: created, then replaced; a collection, a directory: conflict.
    assert_eq!(status(0), "201", "{}", ours[0]);
    assert!(
        ours[0].contains("Location: http://localhost:PORT/p.txt\r\n"),
        "{}",
        ours[0]
    );
    assert_eq!(status(1), "204");
    assert!(!ours[1].contains("Content-Length"), "{}", ours[1]);
    assert!(ours[2].contains("Location: http://localhost:PORT/p%20q.txt\r\n"));
    assert_eq!(
        [status(3), status(4), status(5), status(6)],
        ["409", "500", "409", "501"]
    );
    assert_eq!(s.prefix.read("html/c"), "abc");
    assert_eq!(s.prefix.read("html/full/a/b/c"), "deep");
    assert_eq!(
        [status(9), status(10), status(11), status(12), status(14)],
        ["201", "405", "409", "409", "415"]
    );
    assert_eq!(status(36), "201", "copy of a tree");
    // (tree2 is moved to /moved/ later in the sequence.)
    assert_eq!(s.prefix.read("html/moved/sub/b"), "B");
    let log = s.wait_error_log("insufficient URI depth:2 to DELETE");
    for line in [
        "cannot PUT to a collection",
        "PUT with range is unsupported",
        "\"Depth\" header must be infinity",
        "client sent invalid \"Depth\" header: \"bogus\"",
        "client sent no \"Destination\" header",
        "MKCOL can create a collection only",
        "DELETE with body is unsupported",
        "\"Destination\" URI \"http://other/x\" is handled by different repository than the source URI",
        "client sent invalid \"Overwrite\" header: \"x\"",
        "failed (2: No such file or directory)",
    ] {
        assert!(log.contains(line), "{:?} not in\n{}", line, log);
    }
    // Every PUT's temp file was renamed into place or removed.
    assert_eq!(
        listing(&s.prefix.path("body"))
            .iter()
            .filter(|l| l.contains(" file "))
            .count(),
        0
    );
    let our_tree = listing(&s.prefix.path("html"));
    drop(s);
    let Some(nginx) = nginx_side(CONF, files, &requests()) else {
        return;
    };
    for (i, r) in requests().iter().enumerate() {
        // The GET's Last-Modified is the copy's own time on both sides.
        if r.starts_with("GET ") {
            continue;
        }
        assert_eq!(ours[i], nginx.answers[i], "request {}: {}", i, r);
    }
    assert_eq!(our_tree, listing(&nginx.prefix.path("html")));
}

#[test]
fn dav_directives_checked_and_declared() {
    let p = Prefix::new();
    p.write(
        "conf/nginx.conf",
        "events {}\nhttp {\n  server {\n    location / { dav_methods PUT LOCK; }\n  }\n}\n",
    );
    let out = p.run(&["-t", "-c", "conf/nginx.conf"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("invalid value \"LOCK\"") && err.contains("nginx.conf:4"),
        "{}",
        err
    );
    p.write(
        "conf/nginx.conf",
        "events {}\nhttp {\n  dav_access user:rw all:r;\n  dav_access all:r;\n}\n",
    );
    let out = p.run(&["-t", "-c", "conf/nginx.conf"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"dav_access\" directive is duplicate"),
        "{}",
        err
    );
    let v = p.run(&["-V"]);
    let text =
        String::from_utf8_lossy(&v.stderr).into_owned() + &String::from_utf8_lossy(&v.stdout);
    assert!(text.contains("--with-http_dav_module"), "{}", text);
}
