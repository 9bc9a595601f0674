//! The mp4 module against the real nginx: files made by ffmpeg (moov
//! after mdat, and moov first with `+faststart`), cut by `start`/`end`
//! with and without `mp4_start_key_frame`, with a Range, past the end, and
//! a garbled file: the same bytes as nginx's, and the same 500s. Skipped
//! (with a message) without ffmpeg.

use std::process::Command;

use crate::harness::{free_port, nginx_installed, start_nginx, Prefix, Server};

const CONF: &str = r#"
http {
    access_log off;
    types { video/mp4 mp4; }
    server {
        listen 127.0.0.1:@PORT@;
        location / { mp4; }
        location /k/ { alias html/; mp4; mp4_start_key_frame on; }
        location /small/ { alias html/; mp4; mp4_buffer_size 1k; mp4_max_buffer_size 2k; }
    }
}
"#;

/// Makes the two test files in `p` (as nginx-tests' mp4.t does); false
/// without ffmpeg.
fn files(p: &Prefix) -> bool {
    for (name, extra) in [("test.mp4", ""), ("fast.mp4", "-movflags +faststart")] {
        let cmd = format!(
            "ffmpeg -nostdin -loglevel quiet -y \
             -f lavfi -i testsrc=duration=10:size=320x200:rate=15 \
             -f lavfi -i testsrc=duration=20:size=320x200:rate=15 \
             -map 0:0 -map 1:0 -pix_fmt yuv420p -g 15 -c:v h264 {} {}",
            extra,
            p.path(&format!("html/{}", name)).display()
        );
        match Command::new("sh").arg("-c").arg(&cmd).status() {
            Ok(s) if s.success() => {}
            _ => {
                eprintln!("skipped: ffmpeg could not make the test files");
                return false;
            }
        }
    }
    // A first chunk offset past the end of the file.
    let mut bad = std::fs::read(p.path("html/test.mp4")).expect("read");
    let at = crate::harness::find(&bad, b"stco").expect("an stco atom") + 12;
    bad[at..at + 4].copy_from_slice(&0xffff_fff0u32.to_be_bytes());
    p.write("html/bad.mp4", &bad);
    let whole = std::fs::read(p.path("html/test.mp4")).expect("read");
    p.write("html/short.mp4", &whole[..whole.len() - 5000]);
    crate::differential::fix_times(&p.path("html"));
    true
}

fn targets() -> Vec<String> {
    [
        "/test.mp4",
        "/test.mp4?start=0",
        "/test.mp4?start=2",
        "/test.mp4?start=7.1",
        "/test.mp4?start=6&end=9",
        "/test.mp4?start=2.7&end=5.6",
        "/test.mp4?end=9",
        "/test.mp4?start=1&end=1",
        "/test.mp4?end=21",
        "/test.mp4?start=11",
        "/test.mp4?start=21",
        "/test.mp4?start=x",
        "/fast.mp4?start=0",
        "/fast.mp4?start=7.1&end=9",
        "/k/test.mp4?start=2.5",
        "/k/fast.mp4?start=7.1&end=9.3",
        "/small/test.mp4?start=1",
        "/bad.mp4?start=0",
        "/short.mp4?start=3",
    ]
    .iter()
    .map(|t| format!("GET {} HTTP/1.0\r\nHost: x\r\n\r\n", t))
    .chain([
        "GET /test.mp4?start=1 HTTP/1.0\r\nHost: x\r\nRange: bytes=0-9\r\n\r\n".to_string(),
        "GET /test.mp4?start=1 HTTP/1.0\r\nHost: x\r\nRange: bytes=-10\r\n\r\n".to_string(),
        "HEAD /test.mp4?start=3 HTTP/1.0\r\nHost: x\r\n\r\n".to_string(),
        "POST /test.mp4?start=3 HTTP/1.0\r\nHost: x\r\n\r\n".to_string(),
    ])
    .collect()
}

/// The answers with Date and Server left out and the error pages' tails
/// made equal (bytes, not text: the bodies are binary).
fn answers(port: u16) -> Vec<Vec<u8>> {
    targets()
        .iter()
        .map(|r| {
            let raw = crate::harness::raw(port, r.as_bytes());
            let split = crate::harness::find(&raw, b"\r\n\r\n").map_or(raw.len(), |i| i + 4);
            let head: String = String::from_utf8_lossy(&raw[..split])
                .split("\r\n")
                .filter(|l| !l.starts_with("Date: ") && !l.starts_with("Server: "))
                .map(|l| {
                    if l.starts_with("Content-Length: ") && raw.len() - split < 300 {
                        "Content-Length: N"
                    } else {
                        l
                    }
                })
                .collect::<Vec<_>>()
                .join("\r\n");
            let mut out = head.into_bytes();
            let body = &raw[split..];
            if body.starts_with(b"<html>") {
                out.extend_from_slice(b"(error page)");
            } else {
                out.extend_from_slice(body);
            }
            out
        })
        .collect()
}

#[test]
fn mp4_as_nginx() {
    let p = Prefix::new();
    if !files(&p) {
        return;
    }
    let s = Server::start_in(p, CONF);
    let ours = answers(s.port);
    let status = |i: usize| String::from_utf8_lossy(&ours[i][..12]).into_owned();
    assert_eq!(status(2), "HTTP/1.1 200");
    assert_eq!(status(10), "HTTP/1.1 500", "start past the end");
    assert_eq!(status(16), "HTTP/1.1 500", "moov over mp4_max_buffer_size");
    assert_eq!(status(17), "HTTP/1.1 500", "a chunk offset past the end");
    let log = s.wait_error_log("mp4 start time exceeds file duration");
    assert!(
        log.contains("mp4 moov atom is too large:")
            && log.contains("you may want to increase mp4_max_buffer_size"),
        "{}",
        log
    );
    // A cut is smaller than the file and starts with ftyp.
    let whole = ours[0].len();
    assert!(ours[2].len() < whole);
    let body = |v: &Vec<u8>| {
        let i = crate::harness::find(v, b"\r\n\r\n").map_or(0, |i| i + 4);
        v[i..].to_vec()
    };
    assert_eq!(&body(&ours[2])[4..8], b"ftyp");
    if !nginx_installed() {
        return;
    }
    let np = Prefix::new();
    for f in ["test.mp4", "fast.mp4", "bad.mp4", "short.mp4"] {
        std::fs::copy(
            s.prefix.path(&format!("html/{}", f)),
            np.path(&format!("html/{}", f)),
        )
        .expect("copy");
    }
    drop(s);
    crate::differential::fix_times(&np.path("html"));
    let port = free_port();
    let Some(_nginx) = start_nginx(&np, CONF, port) else {
        panic!("nginx did not start: {}", np.read("logs/error.log"));
    };
    let theirs = answers(port);
    for (i, t) in targets().iter().enumerate() {
        assert!(
            ours[i] == theirs[i],
            "{}: tern {} bytes, nginx {} bytes\n{}\n{}",
            t,
            ours[i].len(),
            theirs[i].len(),
            String::from_utf8_lossy(&ours[i][..ours[i].len().min(300)]),
            String::from_utf8_lossy(&theirs[i][..theirs[i].len().min(300)])
        );
    }
}
