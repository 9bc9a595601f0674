//! The file-I/O layer end to end: thread-pool overflow, `aio
//! threads=pool_$var`, directio byte-exactness, `aio on` (io_uring), and a
//! reload that removes a pool. Decisions are observed through the
//! `tern io: ...` line logged per request at `debug` level.
use crate::harness::*;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

/// Deterministic, position-dependent content (so an offset error shows).
fn content(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + i / 4093 + seed) % 251) as u8)
        .collect()
}

/// Drops a file's pages from the page cache (the prefix is on ext4).
fn evict(path: &Path) {
    let f = std::fs::File::open(path).expect("open for evict");
    let _ = f.sync_all();
    // SAFETY: posix_fadvise on a descriptor we own; no memory is passed.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Names of the server's threads (`/proc/PID/task/*/comm`).
fn thread_names(pid: i32) -> Vec<String> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{}/task", pid)) {
        for e in rd.flatten() {
            if let Ok(c) = std::fs::read_to_string(e.path().join("comm")) {
                v.push(c.trim().to_string());
            }
        }
    }
    v
}

fn count(log: &str, needle: &str) -> usize {
    log.matches(needle).count()
}

#[test]
fn queue_overflow_logs_and_fails_the_request_like_nginx() {
    let p = Prefix::new();
    let n = 24;
    for i in 0..n {
        p.write(&format!("html/f{i}"), content(200_000 + i, i));
    }
    let dir = p.path("html");
    // directio reads always go to the pool, so the one thread and the
    // one queue slot are exceeded by 24 concurrent requests.
    let s = Server::start_in(
        p,
        "thread_pool t threads=1 max_queue=1;
         http { server { listen 127.0.0.1:@PORT@; root html;
           location / { aio threads=t; directio 4k; sendfile off; } } }",
    );
    let mut complete = 0;
    let mut failed = 0;
    for _round in 0..5 {
        for i in 0..n {
            evict(&dir.join(format!("f{i}")));
        }
        let port = s.port;
        let handles: Vec<_> = (0..n)
            .map(|i| {
                std::thread::spawn(move || {
                    let req = format!("GET /f{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                    (i, raw(port, req.as_bytes()))
                })
            })
            .collect();
        for h in handles {
            let (i, data) = h.join().expect("client thread");
            match Resp::parse_complete(&data) {
                Some((r, _)) if r.status == 200 => {
                    assert!(r.body == content(200_000 + i, i), "f{i}: wrong bytes");
                    complete += 1;
                }
                // nginx 1.22 closes the connection: no response, or a
                // truncated one when the overflow hits a later chunk.
                None => failed += 1,
                Some((r, _)) => panic!("f{i}: unexpected status {}", r.status),
            }
        }
        if failed > 0 {
            break;
        }
    }
    let log = s.wait_error_log("queue overflow");
    assert!(failed > 0, "no request failed");
    assert!(complete > 0, "no request succeeded");
    assert!(
        log.contains("[error]")
            && log.contains("thread pool \"t\" queue overflow: 1 tasks waiting"),
        "{log}"
    );
    // The server is still healthy afterwards.
    let r = s.get("/f0");
    assert_eq!((r.status, r.body == content(200_000, 0)), (200, true));
}

#[test]
fn aio_threads_pool_name_from_a_variable() {
    let p = Prefix::new();
    let data = content(300_000, 7);
    let path = p.write("html/big", &data);
    let s = Server::start_in(
        p,
        "error_log logs/error.log debug;
         thread_pool p_a threads=1;
         thread_pool p_b threads=2;
         http { server { listen 127.0.0.1:@PORT@; root html;
           location / { aio threads=p_$arg_p; } } }",
    );
    let pid = s.pid();
    eventually(5, "pool threads started", || {
        thread_names(pid)
            .iter()
            .filter(|n| n.starts_with("tern-pool-p_"))
            .count()
            == 3
    });
    let names = thread_names(pid);
    assert_eq!(
        names.iter().filter(|n| *n == "tern-pool-p_a").count(),
        1,
        "{names:?}"
    );
    assert_eq!(
        names.iter().filter(|n| *n == "tern-pool-p_b").count(),
        2,
        "{names:?}"
    );

    // Cold: the read goes to the pool named by ?p=.
    evict(&path);
    let r = s.get("/big?p=b");
    assert_eq!(r.status, 200);
    assert!(r.body == data);
    s.wait_error_log("tern io: offload pool \"p_b\"");
    // A pool that does not exist: nginx's message and 500. Its line also
    // comes after every line the request above logged.
    assert_eq!(s.get("/big?p=zz").status, 500);
    let log = s.wait_error_log("thread pool \"p_zz\" not found");
    assert!(!log.contains("pool \"p_a\""), "{log}");

    // Warm now: served inline, still attributed to the chosen pool.
    let r = s.get("/big?p=a");
    assert!(r.status == 200 && r.body == data);
    s.wait_error_log("tern io: inline pool \"p_a\"");
    evict(&path);
    let r = s.get("/big?p=a");
    assert!(r.status == 200 && r.body == data);
    s.wait_error_log("tern io: offload pool \"p_a\"");
    // The unknown pool again, to mark the end of those requests' lines.
    assert_eq!(s.get("/big?p=zz").status, 500);
    let log = s.wait_error_log_n("thread pool \"p_zz\" not found", 2);
    assert_eq!(count(&log, "tern io: offload pool \"p_b\""), 1, "{log}");
}

#[test]
fn directio_serves_exact_bytes_for_unaligned_sizes() {
    let p = Prefix::new();
    let sizes = [4096 * 3 + 1, 100_001, 513 * 7, 1_048_576 + 4095];
    for (i, &n) in sizes.iter().enumerate() {
        p.write(&format!("html/d{i}"), content(n, i));
    }
    let dir = p.path("html");
    let s = Server::start_in(
        p,
        "error_log logs/error.log debug;
         thread_pool dio threads=2;
         http { server { listen 127.0.0.1:@PORT@; root html; directio 4k;
           location /off/ { alias html/; }
           location /threads/ { alias html/; aio threads=dio; directio_alignment 4k; }
           location /on/ { alias html/; aio on; }
           location /on4k/ { alias html/; aio on; directio_alignment 4k; output_buffers 1 64k; } } }",
    );
    for loc in ["off", "threads", "on", "on4k"] {
        for (i, &n) in sizes.iter().enumerate() {
            evict(&dir.join(format!("d{i}")));
            let r = s.get(&format!("/{loc}/d{i}"));
            assert_eq!(r.status, 200, "{loc} d{i}");
            assert_eq!(r.body.len(), n, "{loc} d{i}");
            assert!(r.body == content(n, i), "{loc} d{i}: bytes differ");
            // Range (when the range filter serves it) must be exact too.
            let mut c = s.connect();
            let (a, b) = (n / 3 + 1, n - 2);
            let req = format!(
                "GET /{loc}/d{i} HTTP/1.1\r\nHost: x\r\nRange: bytes={a}-{b}\r\nConnection: close\r\n\r\n"
            );
            c.write_all(req.as_bytes()).expect("write");
            let r = Resp::parse(&read_to_close(&mut c)).expect("range response");
            match r.status {
                206 => assert!(r.body == content(n, i)[a..=b], "{loc} d{i} range"),
                200 => assert!(r.body == content(n, i), "{loc} d{i} (no range filter)"),
                st => panic!("{loc} d{i}: status {st}"),
            }
        }
    }
    s.wait_error_log("tern io: offload pool \"dio\"");
    // Each line is logged when its request ends: the last of /on4k/ may
    // still be on its way.
    eventually(10, "the aio on lines", || {
        let log = s.error_log();
        log.contains("io_uring is not available") || log.contains("tern io: uring (aio on)")
    });
    let log = s.error_log();
    if !log.contains("io_uring is not available") {
        assert!(log.contains("tern io: uring (aio on)"), "{log}");
        assert!(thread_names(s.pid()).iter().any(|n| n == "tern-uring"));
    }
}

#[test]
fn reload_removing_a_pool_stops_its_threads() {
    let p = Prefix::new();
    p.write("html/a", content(50_000, 1));
    let conf = |pools: &str, aio: &str| {
        format!(
            "{pools}
             http {{ server {{ listen 127.0.0.1:@PORT@; root html;
               location / {{ aio {aio}; }} }} }}"
        )
    };
    let mut s = Server::start_in(
        p,
        &conf(
            "thread_pool gone threads=3; thread_pool kept threads=1;",
            "threads=gone",
        ),
    );
    let pid = s.pid();
    eventually(5, "pool threads started", || {
        thread_names(pid)
            .iter()
            .filter(|n| *n == "tern-pool-gone")
            .count()
            == 3
    });
    let names = thread_names(pid);
    assert_eq!(
        names.iter().filter(|n| *n == "tern-pool-gone").count(),
        3,
        "{names:?}"
    );
    assert!(names.iter().any(|n| n == "tern-pool-kept"), "{names:?}");
    let r = s.get("/a");
    assert!(r.status == 200 && r.body == content(50_000, 1));

    let port = s.port;
    s.rewrite_conf(&conf("thread_pool kept threads=1;", "threads=kept"), port);
    s.signal(SIGHUP);
    eventually(10, "tern-pool-gone threads exit", || {
        !thread_names(pid).iter().any(|n| n == "tern-pool-gone")
    });
    assert!(thread_names(pid).iter().any(|n| n == "tern-pool-kept"));
    std::thread::sleep(Duration::from_millis(50));
    let r = s.get("/a");
    assert!(r.status == 200 && r.body == content(50_000, 1));
    assert!(
        s.wait_exit(Duration::from_millis(1)).is_none(),
        "server died"
    );
}

#[test]
fn lazily_started_default_pool_serves_when_started_as_root() {
    // `aio threads;` without `thread_pool default`: the pool starts on the
    // first request, from a worker that already dropped privileges (when
    // run as root); its threads must not try (and fail) to drop them again.
    let p = Prefix::new();
    let data = content(70_000, 3);
    let path = p.write("html/x", &data);
    let s = Server::start_in(
        p,
        "http { server { listen 127.0.0.1:@PORT@; root html; location / { aio threads; } } }",
    );
    evict(&path);
    let r = s.get("/x");
    assert!(r.status == 200 && r.body == data, "status {}", r.status);
    assert!(thread_names(s.pid()).iter().any(|n| n == "tern-pool-defau"));
    // A 404's line marks the end of what the pool's start logged.
    let log = s.error_log_after("GET /nope HTTP/1.0\r\n\r\n", "/nope\" failed");
    assert!(!log.contains("could not drop privileges"), "{log}");
}

/// Bytes of resident memory of the server's mappings of `path` (smaps).
fn mapped_rss_kb(pid: i32, path: &Path) -> Option<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", pid)).ok()?;
    let name = path.to_str()?;
    let mut inside = false;
    let mut total = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            inside = line.ends_with(name);
            continue;
        }
        if inside {
            if let Some(kb) = line.strip_prefix("Rss:") {
                let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().ok()?;
                total = Some(total.unwrap_or(0) + kb);
            }
        }
    }
    total
}

#[test]
fn sendfile_of_a_hot_file_is_inline_where_cachestat_is_refused() {
    // Started as root, the workers run as nobody and the files are root's
    // 0644: cachestat answers EPERM, so residency comes from the page
    // tables of a mapping of the file (or a RWF_NOWAIT copy).
    let p = Prefix::new();
    let data = content(1_300_000, 11);
    let path = p.write("html/hot", &data);
    let s = Server::start_in(
        p,
        "error_log logs/error.log debug;
         http { server { listen 127.0.0.1:@PORT@; root html;
           location / { aio threads; sendfile on; sendfile_max_chunk 256k; } } }",
    );
    evict(&path);
    let r = s.get("/hot");
    assert!(r.status == 200 && r.body == data, "status {}", r.status);
    s.wait_error_log("tern io: offload pool \"default\"");
    for _ in 0..3 {
        let r = s.get("/hot");
        assert!(r.status == 200 && r.body == data, "status {}", r.status);
    }
    s.wait_error_log_n("tern io: inline pool \"default\"", 3);
    // A request without file I/O (info is logged at debug) marks the end
    // of the lines the three logged.
    let log = s.error_log_after(
        "get / HTTP/1.0\r\n\r\n",
        "client sent invalid method while reading client request line",
    );
    assert_eq!(count(&log, "tern io: inline pool \"default\""), 3, "{log}");
    assert_eq!(count(&log, "tern io: offload"), 1, "{log}");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // The worker mapped the file (so it could open /proc/self/pagemap,
        // which the master opened before the workers dropped root) and
        // populated the mapping's page tables.
        let kb = mapped_rss_kb(s.pid(), &path);
        assert!(kb.is_some_and(|kb| kb > 0), "{kb:?}");
    }
}

#[test]
fn without_an_aio_directive_cold_reads_leave_the_worker_and_aio_off_stays_inline() {
    // tern's default is `aio threads` (DIFFERENCES.md): a cold file in a
    // location that says nothing goes to the default pool; `aio off`
    // reads it inline, as nginx does.
    let p = Prefix::new();
    let data = content(200_000, 5);
    let quiet = p.write("html/quiet/f", &data);
    let off = p.write("html/off/f", &data);
    let s = Server::start_in(
        p,
        "error_log logs/error.log debug;
         http { server { listen 127.0.0.1:@PORT@; root html;
           location /quiet/ { }
           location /off/ { aio off; } } }",
    );
    evict(&quiet);
    let r = s.get("/quiet/f");
    assert!(r.status == 200 && r.body == data, "status {}", r.status);
    s.wait_error_log("tern io: offload pool \"default\"");
    evict(&off);
    let r = s.get("/off/f");
    assert!(r.status == 200 && r.body == data, "status {}", r.status);
    // A 404's line marks the end of what the /off/ request logged.
    let log = s.error_log_after("GET /nope HTTP/1.0\r\n\r\n", "/nope\" failed");
    let io: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_once("tern io: ").map(|(_, d)| d))
        .collect();
    // /quiet/f offloaded, /off/f inline (the 404's cold stat may follow).
    assert_eq!(
        io.get(..2),
        Some(&["offload pool \"default\"", "inline"][..]),
        "{log}"
    );
}
