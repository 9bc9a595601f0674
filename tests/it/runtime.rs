//! tern as a running server: command line, config errors, signals and
//! reload, timeouts, server selection, worker_connections, `user`, and
//! curl against the embedded default.
use crate::harness::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Each class of config error: nginx's message with file:line, exit 1,
/// the same line in the error log.
#[test]
fn config_errors_in_nginx_wording() {
    let cases: &[(&str, &str)] = &[
        ("events {}\nfoo bar;\n", "unknown directive \"foo\" in @:2"),
        (
            "events {}\nhttp { listen 80; }\n",
            "\"listen\" directive is not allowed here in @:2",
        ),
        (
            "events {}\nworker_processes 1 2;\n",
            "invalid number of arguments in \"worker_processes\" directive in @:2",
        ),
        ("events {}\n}\n", "unexpected \"}\" in @:2"),
        (
            "events {}\nhttp {\n",
            "unexpected end of file, expecting \"}\" in @:3",
        ),
        (
            "events {}\npid a;\npid b;\n",
            "\"pid\" directive is duplicate in @:3",
        ),
        (
            "events {}\ndaemon maybe;\n",
            "invalid value \"maybe\" in \"daemon\" directive, it must be \"on\" or \"off\" in @:2",
        ),
        (
            "events {}\nhttp { keepalive_timeout abc; }\n",
            "\"keepalive_timeout\" directive invalid value in @:2",
        ),
        (
            "events {}\nhttp { keepalive_requests x; }\n",
            "\"keepalive_requests\" directive invalid number in @:2",
        ),
        (
            "events {}\nhttp { lingering_close foo; }\n",
            "invalid value \"foo\" in @:2",
        ),
        (
            "events {}\nhttp { server { listen 127.0.0.1:abc; } }\n",
            "invalid port in \"127.0.0.1:abc\" of the \"listen\" directive in @:2",
        ),
        (
            "events {}\nhttp {\n server {\n listen 80 }\n}\n",
            "unexpected \"}\" in @:4",
        ),
        (
            "events {}\nhttp { server { return 1000; } }\n",
            "invalid return code \"1000\" in @:2",
        ),
        ("http {}\n", "no \"events\" section in configuration"),
        (
            "events {}\nthread_pool one threads=1;\nhttp {\n server {\n  location / {\n   aio threads=two;\n  }\n }\n}\n",
            "unknown thread pool \"two\" in @:6",
        ),
        // Accepted without effect, but checked as nginx checks them.
        (
            "events {}\nhttp {\n types_hash_max_size 2k;\n}\n",
            "\"types_hash_max_size\" directive invalid number in @:3",
        ),
        (
            "events {}\nhttp { ssl_protocols TLSv1.2 TLSv9; }\n",
            "invalid value \"TLSv9\" in @:2",
        ),
        (
            "events {}\nhttp { server { ssl_session_timeout abc; } }\n",
            "\"ssl_session_timeout\" directive invalid value in @:2",
        ),
        (
            "events { accept_mutex_delay x; }\n",
            "\"accept_mutex_delay\" directive invalid value in @:1",
        ),
        (
            "events {}\nstream { variables_hash_bucket_size 64k; }\n",
            "\"variables_hash_bucket_size\" directive invalid number in @:2",
        ),
        (
            "events {}\nstream { preread_timeout abc; }\n",
            "\"preread_timeout\" directive invalid value in @:2",
        ),
        (
            "events {}\nworker_cpu_affinity 0102;\n",
            "invalid character \"2\" in \"worker_cpu_affinity\" in @:2",
        ),
        (
            "events {}\nworker_cpu_affinity auto 01 10;\n",
            "invalid number of arguments in \"worker_cpu_affinity\" directive in @:2",
        ),
    ];
    for (conf, want) in cases {
        let p = Prefix::new();
        let f = p.write("conf/nginx.conf", conf);
        let want = format!("[emerg] {}", want.replace('@', &f.display().to_string()));
        let o = p.run(&["-c", f.to_str().unwrap(), "-t"]);
        assert_eq!(o.status.code(), Some(1), "{conf}");
        let err = stderr(&o);
        assert!(err.contains(&format!("tern: {want}\n")), "{conf}: {err}");
        assert!(
            err.contains(&format!(
                "tern: configuration file {} test failed\n",
                f.display()
            )),
            "{err}"
        );
        let msg = want.trim_start_matches("[emerg] ");
        let log = p.read("logs/error.log");
        assert!(
            log.contains("[emerg] ") && log.contains(msg),
            "{conf}: log {log}"
        );
        // Starting (not testing) fails the same way.
        let o = p.run(&["-c", f.to_str().unwrap(), "-g", "daemon off;"]);
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains(&want), "{}", stderr(&o));
    }
}

/// A distribution's stock nginx.conf (shaped like Debian's): modules
/// loaded by `load_module`, hash sizes and http-level `ssl_*` settings
/// with no ssl listener. It loads, and serves.
#[test]
fn distribution_config_loads_and_serves() {
    let p = Prefix::new();
    p.write("html/index.html", "stock\n");
    p.write(
        "conf/modules-enabled/50-mod-stream.conf",
        "load_module modules/ngx_stream_module.so;\n",
    );
    let s = Server::start_in(
        p,
        "worker_processes auto;\ninclude modules-enabled/*.conf;\nevents { worker_connections 768; }\n\
         http {\n sendfile on;\n tcp_nopush on;\n types_hash_max_size 2048;\n\
         server_names_hash_bucket_size 64;\n default_type application/octet-stream;\n\
         ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3;\n ssl_prefer_server_ciphers on;\n\
         access_log off;\n gzip on;\n\
         server { listen 127.0.0.1:@PORT@ default_server; root html; index index.html;\n\
         server_name _; location / { try_files $uri $uri/ =404; } }\n}\n",
    );
    let r = s.get("/");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"stock\n"[..]));
}

/// worker_cpu_affinity binds each worker thread (rightmost mask
/// character = CPU 0, as nginx).
#[test]
fn worker_cpu_affinity_binds_worker_threads() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("one CPU: nothing to bind apart");
        return;
    }
    let s = Server::start(
        "worker_processes 2;\nworker_cpu_affinity 10 01;\n\
         http { server { listen 127.0.0.1:@PORT@; return 200 ok; } }",
    );
    let allowed = |name: &str| {
        std::fs::read_dir(format!("/proc/{}/task", s.pid()))
            .unwrap()
            .flatten()
            .find(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
            })
            .and_then(|t| std::fs::read_to_string(t.path().join("status")).ok())
            .and_then(|st| {
                st.lines().find_map(|l| {
                    l.strip_prefix("Cpus_allowed_list:")
                        .map(|v| v.trim().to_string())
                })
            })
    };
    // The listener accepts before the worker threads have started.
    eventually(5, "worker 0 on CPU 1, worker 1 on CPU 0", || {
        allowed("tern-worker-0").as_deref() == Some("1")
            && allowed("tern-worker-1").as_deref() == Some("0")
    });
    assert_eq!(s.get("/").status, 200);
}

/// A location's own error_log also takes the lines of requests that its
/// `if` blocks handle.
#[test]
fn if_blocks_log_to_their_locations_error_log() {
    let s = Server::start(
        "http { access_log off; server { listen 127.0.0.1:@PORT@; root html; \
         location /x/ { error_log logs/x.log; if ($arg_a) { } } } }",
    );
    assert_eq!(s.get("/x/through-if?a=1").status, 404);
    assert_eq!(s.get("/x/plain").status, 404);
    eventually(5, "both lines in logs/x.log", || {
        let x = std::fs::read_to_string(s.prefix.path("logs/x.log")).unwrap_or_default();
        x.contains("through-if") && x.contains("/x/plain")
    });
    assert!(!s.error_log().contains("through-if"), "{}", s.error_log());
}

/// A configuration check's warnings print between nginx's two `-t` lines.
#[test]
fn test_prints_warnings_between_its_lines() {
    let p = Prefix::new();
    let f = p.write("conf/nginx.conf", "worker_cpu_affinity 01 10;\nevents {}\n");
    let o = p.run(&["-c", f.to_str().unwrap(), "-t"]);
    assert_eq!(o.status.code(), Some(0));
    let want = format!(
        "tern: the configuration file {f} syntax is ok\n\
         tern: [warn] the number of \"worker_processes\" is not equal to the number of \
         \"worker_cpu_affinity\" masks, using last mask for remaining worker processes\n\
         tern: configuration file {f} test is successful\n",
        f = f.display()
    );
    assert_eq!(stderr(&o), want);
}

#[test]
fn command_line_g_errors() {
    let p = Prefix::new();
    let f = p.write("conf/nginx.conf", "events {}\npid x;\n");
    let f = f.to_str().unwrap();
    for (g, want) in [
        (
            "foo;",
            "tern: [emerg] unknown directive \"foo\" in command line\n".to_string(),
        ),
        (
            "pid y",
            "tern: [emerg] unexpected end of parameter, expecting \";\" in command line\n"
                .to_string(),
        ),
        (
            "events {}",
            "tern: [emerg] block directives are not supported in -g option in command line\n"
                .to_string(),
        ),
        // -g comes first, so the file's line is the duplicate, as in nginx.
        (
            "pid y;",
            format!("tern: [emerg] \"pid\" directive is duplicate in {f}:2\n"),
        ),
    ] {
        let o = p.run(&["-c", f, "-t", "-g", g]);
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).starts_with(&want), "{g}: {}", stderr(&o));
    }
}

#[test]
fn test_dump_quiet_version_help() {
    let p = Prefix::new();
    p.write("conf/m.conf", "worker_processes 1;\n");
    let f = p.write("conf/nginx.conf", "events {}\ninclude m.conf;\n");
    let fs = f.display().to_string();
    let o = p.run(&["-c", &fs, "-t"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stderr(&o), format!("tern: the configuration file {fs} syntax is ok\ntern: configuration file {fs} test is successful\n"));
    let o = p.run(&["-c", &fs, "-t", "-q"]);
    assert_eq!((o.status.code(), stderr(&o)), (Some(0), String::new()));
    let o = p.run(&["-c", &fs, "-T"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("# configuration file {fs}:\nevents {{}}\ninclude m.conf;\n\n# configuration file {}:\nworker_processes 1;\n\n", p.path("conf/m.conf").display())
    );
    let o = p.run(&["-v"]);
    assert_eq!(
        stderr(&o),
        "tern version: tern/0.1.0 (nginx/1.22.1 compatible)\n"
    );
    let o = p.run(&["-V"]);
    let e = stderr(&o);
    assert!(
        e.contains("\nconfigure arguments: ")
            && e.contains("--with-threads")
            && !e.contains("--without-http_grpc_module")
            && e.contains("--with-http_v3_module")
            && !e.contains("--without-http_fastcgi_module")
            && !e.contains("--without-http_proxy_module"),
        "{e}"
    );
    let o = p.run(&["-h"]);
    assert!(
        stderr(&o).starts_with("Usage: tern [-?hvVtTq] [-s signal]"),
        "{}",
        stderr(&o)
    );
    let o = p.run(&["-x"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o), "tern: invalid option: \"x\"\n");
}

#[test]
fn seed_check_missing_semicolon() {
    let o = Command::new("python3")
        .args([
            "/work/shared/seed-configs/check.py",
            BIN,
            "broken-003-missing-semicolon.conf",
        ])
        .output();
    let Ok(o) = o else {
        eprintln!("skipped: python3 not available");
        return;
    };
    if !std::path::Path::new("/work/shared/seed-configs/check.py").exists() {
        eprintln!("skipped: seed configs not present");
        return;
    }
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
}

#[test]
fn port_in_use_is_a_clear_startup_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let p = Prefix::new();
    let f = p.write(
        "conf/nginx.conf",
        conf_text("http { server { listen 127.0.0.1:@PORT@; } }", port),
    );
    let o = p.run(&["-c", f.to_str().unwrap(), "-g", "daemon off;"]);
    assert_eq!(o.status.code(), Some(1));
    let want = format!("bind() to 127.0.0.1:{port} failed (98: Address already in use)");
    assert!(stderr(&o).contains(&want), "{}", stderr(&o));
    assert!(p.read("logs/error.log").contains(&want));
}

fn get_on(port: u16, path: &str, host: &str) -> Resp {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    Resp::parse(&raw(port, req.as_bytes())).expect("response")
}

#[test]
fn pid_file_signals_and_reload() {
    let p = Prefix::new();
    let extra = free_port();
    let mut s = Server::start_in(
        p,
        "http { server { listen 127.0.0.1:@PORT@; location / { return 200 one; } } }",
    );
    let pid_file = s.prefix.path("logs/nginx.pid");
    // As in nginx, the pid file is written just after the listeners are
    // bound, so it may lag the port opening by a moment.
    let want = format!("{}\n", s.pid());
    eventually(5, "pid file", || {
        std::fs::read_to_string(&pid_file).ok().as_deref() == Some(want.as_str())
    });
    // A kept-alive connection from before the reload...
    let mut ka = s.connect();
    ka.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut ka).unwrap().body, b"one");

    // A broken config: the old one keeps serving and the error is logged.
    std::fs::write(
        &s.conf,
        "events {}\nhttp { server { listen 127.0.0.1:1; foo; } }\n",
    )
    .unwrap();
    let o = s
        .prefix
        .run(&["-c", s.conf.to_str().unwrap(), "-s", "reload"]);
    // `-s` needs a valid config to find the pid file, as nginx does.
    assert_eq!(o.status.code(), Some(1));
    s.signal(SIGHUP);
    eventually(5, "reload failure logged", || {
        s.error_log().contains("unknown directive \"foo\"")
    });
    assert_eq!(s.get("/").body, b"one");

    // A good config adding a port, via `-s reload`.
    let two = format!("http {{ server {{ listen 127.0.0.1:@PORT@; listen 127.0.0.1:{extra}; location / {{ return 200 two; }} }} }}");
    s.rewrite_conf(&two, s.port);
    let o = s
        .prefix
        .run(&["-c", s.conf.to_str().unwrap(), "-s", "reload"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    eventually(5, "new config serves", || s.get("/").body == b"two");
    eventually(5, "new port listens", || {
        TcpStream::connect(("127.0.0.1", extra)).is_ok()
    });
    assert_eq!(get_on(extra, "/", "a").body, b"two");
    // The old kept-alive connection survived and uses the new config.
    ka.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert_eq!(
        read_response(&mut ka)
            .expect("kept-alive connection survived reload")
            .body,
        b"two"
    );

    // Remove the port again.
    s.rewrite_conf(
        "http { server { listen 127.0.0.1:@PORT@; location / { return 200 three; } } }",
        s.port,
    );
    s.signal(SIGHUP);
    eventually(5, "port removed", || {
        TcpStream::connect(("127.0.0.1", extra)).is_err()
    });
    assert_eq!(s.get("/").body, b"three");

    // USR1 via -s reopen: a renamed log is recreated.
    std::fs::rename(
        s.prefix.path("logs/error.log"),
        s.prefix.path("logs/error.log.1"),
    )
    .unwrap();
    let o = s
        .prefix
        .run(&["-c", s.conf.to_str().unwrap(), "-s", "reopen"]);
    assert_eq!(o.status.code(), Some(0));
    eventually(5, "error.log reopened", || {
        s.prefix.path("logs/error.log").exists()
    });

    // QUIT via -s quit: idle keepalive closed, process exits, pid file gone.
    let o = s
        .prefix
        .run(&["-c", s.conf.to_str().unwrap(), "-s", "quit"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(s.wait_exit(Duration::from_secs(5)), Some(0));
    assert_eq!(read_to_close(&mut ka), b"");
    assert!(!pid_file.exists());
}

#[test]
fn quit_finishes_in_flight_requests_and_term_is_fast() {
    let p = Prefix::new();
    let big = vec![b'x'; 8 << 20];
    p.write("html/big", &big);
    let mut s = Server::start_in(p, "http { server { listen 127.0.0.1:@PORT@; root html; } }");
    let mut c = s.connect();
    c.write_all(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 16];
    c.read_exact(&mut first).unwrap();
    s.signal(SIGQUIT);
    std::thread::sleep(Duration::from_millis(100));
    // The response being written completes, then the connection closes.
    let mut rest = first.to_vec();
    rest.extend(read_to_close(&mut c));
    let r = Resp::parse(&rest).unwrap();
    assert_eq!(r.body.len(), big.len());
    assert_eq!(s.wait_exit(Duration::from_secs(5)), Some(0));

    let mut s = Server::start_in(
        Prefix::new(),
        "http { server { listen 127.0.0.1:@PORT@; } }",
    );
    let _idle = s.connect();
    let t = Instant::now();
    s.signal(SIGTERM);
    assert!(s.wait_exit(Duration::from_secs(3)).is_some());
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn timeouts() {
    let p = Prefix::new();
    p.write("html/a", "A");
    let s = Server::start_in(
        p,
        "http { server { listen 127.0.0.1:@PORT@; root html;
            client_header_timeout 300ms; client_body_timeout 300ms;
            keepalive_timeout 500ms 7; keepalive_requests 2;
            location /r { return 200 ok; }
            location /rst { reset_timedout_connection on; return 200 ok; }
        } }",
    );
    // client_header_timeout: closed without an answer.
    let mut c = s.connect();
    c.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let t = Instant::now();
    assert_eq!(read_to_close(&mut c), b"");
    assert!(t.elapsed() < Duration::from_secs(2));
    // keepalive_timeout with the header value; keepalive_requests.
    let mut c = s.connect();
    c.write_all(b"GET /r HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let r = read_response(&mut c).unwrap();
    assert_eq!(r.header("Keep-Alive"), Some("timeout=7"));
    assert_eq!(r.header("Connection"), Some("keep-alive"));
    c.write_all(b"GET /r HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let r = read_response(&mut c).unwrap();
    assert_eq!(
        r.header("Connection"),
        Some("close"),
        "keepalive_requests 2"
    );
    assert_eq!(read_to_close(&mut c), b"");
    let mut c = s.connect();
    c.write_all(b"GET /r HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    read_response(&mut c).unwrap();
    let t = Instant::now();
    assert_eq!(read_to_close(&mut c), b"");
    let e = t.elapsed();
    assert!(
        e > Duration::from_millis(300) && e < Duration::from_secs(2),
        "{e:?}"
    );
    // client_body_timeout: the answer goes out, the unfinished body
    // keeps the connection only until the timeout.
    let mut c = s.connect();
    c.write_all(b"POST /r HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
        .unwrap();
    assert_eq!(read_response(&mut c).unwrap().body, b"ok");
    let t = Instant::now();
    assert_eq!(read_to_close(&mut c), b"");
    assert!(t.elapsed() < Duration::from_secs(2));
    // reset_timedout_connection: a timed-out keepalive... nginx resets
    // connections that time out; here the header timeout of a new one.
    let s2 = Server::start_in(Prefix::new(), "http { reset_timedout_connection on; client_header_timeout 200ms; server { listen 127.0.0.1:@PORT@; } }");
    let mut c = s2.connect();
    c.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let mut b = [0u8; 16];
    let r = c.read(&mut b);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{r:?}"
    );
}

/// A client with a receive buffer of `rcvbuf` bytes.
fn connect_small_rcvbuf(port: u16, rcvbuf: usize) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(rcvbuf).unwrap();
    sock.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
        .unwrap();
    sock.into()
}

/// Asks for `path` (32 MiB), reads nothing for 1.2 s, then reads what
/// the server sent before it closed: less than all of it once
/// send_timeout has cut the stalled client off.
fn bytes_to_a_stalled_reader(c: &mut TcpStream, path: &str) -> usize {
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes())
        .unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    read_to_close(c).len()
}

#[test]
fn send_timeout_closes_a_stalled_client() {
    let p = Prefix::new();
    p.write("html/big", vec![b'x'; 32 << 20]);
    let s = Server::start_in(
        p,
        "http { server { listen 127.0.0.1:@PORT@; root html; send_timeout 300ms; } }",
    );
    let mut c = connect_small_rcvbuf(s.port, 4096);
    assert!(
        bytes_to_a_stalled_reader(&mut c, "/big") < 32 << 20,
        "the whole body arrived: send_timeout not applied"
    );
}

/// nginx's send_timeout bounds each wait for the client, not the whole
/// transfer: with sendfile, a reader slower than a megabyte per
/// send_timeout that never pauses that long gets the whole file, and one
/// that stops reading is cut off.
#[test]
fn send_timeout_with_sendfile_is_per_wait() {
    let p = Prefix::new();
    let size = 2usize << 20;
    p.write("html/big", vec![b'y'; size]);
    p.write("html/huge", vec![b'z'; 32 << 20]);
    let s = Server::start_in(
        p,
        "http { sendfile on; server { listen 127.0.0.1:@PORT@ sndbuf=64k; root html; \
         send_timeout 500ms; } }",
    );
    // ~64 KiB per 40 ms: a megabyte takes ~650 ms, longer than send_timeout.
    let mut c = connect_small_rcvbuf(s.port, 64 << 10);
    c.write_all(b"GET /big HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let started = Instant::now();
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read failed after {} bytes: {e}", got.len()),
        }
        std::thread::sleep(Duration::from_millis(40));
    }
    let body = find(&got, b"\r\n\r\n").map(|i| got.len() - i - 4);
    assert_eq!(body, Some(size), "slow reader cut off");
    assert!(
        started.elapsed() > Duration::from_millis(1000),
        "not slow enough to test anything"
    );

    let mut c = connect_small_rcvbuf(s.port, 64 << 10);
    assert!(
        bytes_to_a_stalled_reader(&mut c, "/huge") < 32 << 20,
        "stalled reader got it all: no send_timeout"
    );
}

#[test]
fn server_selection_by_host_and_address() {
    let p = Prefix::new();
    let s = Server::start_in(
        p,
        "http {
          server { listen 127.0.0.1:@PORT@; server_name first; return 200 first; }
          server { listen 127.0.0.1:@PORT@ default_server; server_name dflt; return 200 default; }
          server { listen 127.0.0.1:@PORT@; server_name exact.com *.wild.com; return 200 exact-or-wild; }
          server { listen 127.0.0.1:@PORT@; server_name tail.*; return 200 tail; }
          server { listen 127.0.0.1:@PORT@; server_name ~^re(\\d+)\\.org$; return 200 regex; }
          server { listen 127.0.0.1:@PORT@; server_name \"\"; return 200 empty; }
          server { listen 127.0.0.1:@PORT@; server_name _; return 200 underscore; }
        }",
    );
    for (host, want) in [
        ("first", "first"),
        ("EXACT.com", "exact-or-wild"),
        ("a.b.wild.com", "exact-or-wild"),
        ("tail.net", "tail"),
        ("re42.org", "regex"),
        ("unknown", "default"),
        ("_", "underscore"),
        ("exact.com.", "exact-or-wild"),
    ] {
        assert_eq!(get_on(s.port, "/", host).body_str(), want, "Host: {host}");
    }
    // No Host at all (HTTP/1.0): the "" name matches.
    let r = Resp::parse(&s.raw(b"GET / HTTP/1.0\r\n\r\n")).unwrap();
    assert_eq!(r.body_str(), "empty");
}

#[test]
fn worker_connections_excess_waits_and_alerts() {
    let p = Prefix::new();
    let s = Server::start_in(p, "worker_processes 1; events { worker_connections 2; } http { server { listen 127.0.0.1:@PORT@; return 200 ok; } }");
    // The harness probe may hold a slot briefly; let it go.
    std::thread::sleep(Duration::from_millis(100));
    // Both slots held by connections in the middle of a request head
    // (idle ones would be closed to make room, as in nginx).
    let mut a = s.connect();
    let mut b = s.connect();
    a.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    b.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut c = s.connect();
    c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        c.read(&mut buf).is_err(),
        "served beyond worker_connections"
    );
    eventually(3, "alert logged", || {
        s.error_log().contains("[alert]")
            && s.error_log()
                .contains("2 worker_connections are not enough")
    });
    drop(a);
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let r = Resp::parse(&read_to_close(&mut c)).expect("served once a slot freed");
    assert_eq!(r.body, b"ok");
    drop(b);
}

#[test]
fn listen_unix_ipv6_reuseport_backlog() {
    let p = Prefix::new();
    let sock = p.path("logs/t.sock");
    let v6 = std::net::TcpListener::bind("[::1]:0")
        .ok()
        .map(|l| l.local_addr().unwrap().port());
    let v6_listen = v6
        .map(|port| format!("listen [::1]:{port};"))
        .unwrap_or_default();
    let s = Server::start_in(
        p,
        &format!("worker_processes 2; http {{ server {{ listen 127.0.0.1:@PORT@ reuseport backlog=16; listen unix:{}; {v6_listen} return 200 ok; }} }}", sock.display()),
    );
    assert_eq!(s.get("/").body, b"ok");
    let mut u = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    u.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    u.read_to_end(&mut out).unwrap();
    assert!(
        out.ends_with(b"\r\n\r\nok"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    if let Some(port) = v6 {
        let mut c = TcpStream::connect(("::1", port)).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .unwrap();
        assert!(read_to_close(&mut c).ends_with(b"ok"));
    }
    // reuseport: one socket per worker, so two listening sockets on the port.
    let ss = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{}", s.port)])
        .output();
    if let Ok(o) = ss {
        let n = String::from_utf8_lossy(&o.stdout).lines().count();
        assert_eq!(n, 2, "{}", String::from_utf8_lossy(&o.stdout));
    }
}

#[test]
fn user_nobody_serves_world_readable_only() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to test the user switch");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let p = Prefix::new();
    p.write("html/open", "open");
    let secret = p.write("html/secret", "secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    for d in ["", "html"] {
        std::fs::set_permissions(p.path(d), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut s = Server::start_in(
        p,
        "user nobody; http { server { listen 127.0.0.1:@PORT@; root html; } }",
    );
    assert_eq!(s.get("/open").body, b"open");
    assert_eq!(s.get("/secret").status, 403);
    // Reload and log reopening still work (the master kept its rights).
    s.rewrite_conf("user nobody; http { server { listen 127.0.0.1:@PORT@; root html; location /x { return 200 reloaded; } } }", s.port);
    s.signal(SIGHUP);
    eventually(5, "reload as root master", || {
        s.get("/x").body == b"reloaded"
    });
    std::fs::rename(
        s.prefix.path("logs/error.log"),
        s.prefix.path("logs/old.log"),
    )
    .unwrap();
    s.signal(SIGUSR1);
    eventually(5, "log reopened", || {
        s.prefix.path("logs/error.log").exists()
    });
    s.signal(SIGQUIT);
    assert_eq!(s.wait_exit(Duration::from_secs(5)), Some(0));
}

#[test]
fn curl_against_the_embedded_default() {
    if TcpStream::connect(("127.0.0.1", 8080)).is_ok()
        || std::net::TcpListener::bind("127.0.0.1:8080").is_err()
    {
        eprintln!("skipped: 127.0.0.1:8080 is busy, the embedded default needs it");
        return;
    }
    let p = Prefix::new();
    p.write("html/index.html", "<h1>tern</h1>\n");
    let mut child = Command::new(BIN)
        .current_dir(&p.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", 8080)).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = Command::new("curl")
        .args(["-s", "-i", "--max-time", "5", "http://127.0.0.1:8080/"])
        .output();
    let _ = child.kill();
    let _ = child.wait();
    let Ok(o) = o else {
        eprintln!("skipped: curl not installed");
        return;
    };
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("HTTP/1.1 200 OK\r\nServer: tern/0.1.0\r\n"),
        "{out}"
    );
    assert!(
        out.contains("\r\nContent-Length: 14\r\n") && out.ends_with("\r\n\r\n<h1>tern</h1>\n"),
        "{out}"
    );
}

/// A worker does not wait for the error log: with `error_log` on a FIFO
/// that nobody reads, far more 404 lines than the pipe holds are logged
/// and every request is still answered; then, while the process exits,
/// every line comes out of the FIFO, whole and in order.
#[test]
fn worker_does_not_wait_for_the_error_log() {
    use std::os::unix::fs::OpenOptionsExt;
    let p = Prefix::new();
    let fifo = p.path("logs/slow.log");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    // The read end, opened first so that tern's open for writing does not
    // wait; it is not read until every request has been answered.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("open fifo");
    let mut s = Server::start_in(
        p,
        "worker_processes 1;
         http { server { listen 127.0.0.1:@PORT@; error_log logs/slow.log; } }",
    );
    // ~3 KiB paths: each line names the file and the request (~6 KiB), so
    // a 64 KiB pipe is full after a dozen lines.
    let name = vec!["n".repeat(200); 15].join("/");
    const N: usize = 40;
    for i in 0..N {
        let r = raw(
            s.port,
            format!(
                "GET /missing-{:02}-{} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                i, name
            )
            .as_bytes(),
        );
        assert!(
            r.starts_with(b"HTTP/1.1 404 Not Found\r\n"),
            "request {} not answered (worker waiting for the log?): {:?}",
            i,
            String::from_utf8_lossy(&r)
        );
    }
    // Exit with lines still queued: they must all be written first.
    s.signal(SIGTERM);
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 65536];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break, // tern closed its end: it has exited
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "FIFO never closed");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("read fifo: {}", e),
        }
    }
    assert_eq!(s.wait_exit(Duration::from_secs(10)), Some(0));
    let text = String::from_utf8(out).expect("utf-8 log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), N, "{}", &text[..text.len().min(2000)]);
    for (i, l) in lines.iter().enumerate() {
        let file = format!(
            "html/missing-{:02}-{}\" failed (2: No such file or directory)",
            i, name
        );
        assert!(
            l.contains(" [error] ") && l.contains(&file) && l.ends_with("host: \"localhost\""),
            "line {}: {}",
            i,
            l.replace(&name, "N")
        );
    }
}

/// USR1 reopens the error log in order with the lines already logged:
/// the line of a request before the signal is in the renamed file, the
/// line of a request after it in the new one.
#[test]
fn usr1_reopens_the_error_log_after_earlier_lines() {
    let s = Server::start(
        "error_log logs/error.log notice;
         http { server { listen 127.0.0.1:@PORT@; } }",
    );
    assert_eq!(s.get("/before").status, 404);
    s.wait_error_log("/before");
    std::fs::rename(
        s.prefix.path("logs/error.log"),
        s.prefix.path("logs/error.log.1"),
    )
    .unwrap();
    assert_eq!(s.get("/between").status, 404);
    s.signal(SIGUSR1);
    // nginx too logs the signal before it reopens: in the old file.
    wait_log(&s.prefix, "logs/error.log.1", "reopening logs");
    eventually(10, "error.log reopened", || {
        s.prefix.path("logs/error.log").exists()
    });
    assert_eq!(s.get("/after").status, 404);
    let new = s.wait_error_log("/after");
    let old = s.prefix.read("logs/error.log.1");
    assert!(
        old.contains("/before") && old.contains("/between"),
        "{}",
        old
    );
    assert!(!old.contains("/after"), "{}", old);
    assert!(
        !new.contains("/before") && !new.contains("/between"),
        "{}",
        new
    );
}

/// `proxy_cache_path`'s pacing parameters are checked as nginx checks
/// them (`-t`, same wording), and valid ones load.
#[test]
fn proxy_cache_path_pacing_values_as_nginx() {
    let cases = [
        (
            "loader_files=x",
            Some("invalid loader_files value \"loader_files=x\""),
        ),
        (
            "loader_files=-1",
            Some("invalid loader_files value \"loader_files=-1\""),
        ),
        ("loader_files=0", None),
        (
            "loader_sleep=x",
            Some("invalid loader_sleep value \"loader_sleep=x\""),
        ),
        (
            "loader_sleep=-1",
            Some("invalid loader_sleep value \"loader_sleep=-1\""),
        ),
        ("loader_sleep=10", None),
        (
            "loader_threshold=abc",
            Some("invalid loader_threshold value \"loader_threshold=abc\""),
        ),
        ("loader_threshold=300ms", None),
        (
            "manager_files=",
            Some("invalid manager_files value \"manager_files=\""),
        ),
        ("manager_files=1000", None),
        (
            "manager_sleep=5q",
            Some("invalid manager_sleep value \"manager_sleep=5q\""),
        ),
        ("manager_sleep=1s", None),
        (
            "manager_threshold=1y",
            Some("invalid manager_threshold value \"manager_threshold=1y\""),
        ),
        ("manager_threshold=1h", None),
        ("loader_foo=1", Some("invalid parameter \"loader_foo=1\"")),
    ];
    for (param, want) in cases {
        let mut bins = vec![BIN];
        if nginx_installed() {
            bins.push(NGINX);
        }
        for bin in bins {
            let p = Prefix::new();
            let f = p.write(
                "conf/t.conf",
                format!(
                    "pid {d}/t.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  proxy_cache_path {d}/c keys_zone=z:1m {param};\n}}\n",
                    d = p.dir.display()
                ),
            );
            let o = Command::new(bin)
                .arg("-p")
                .arg(format!("{}/", p.dir.display()))
                .arg("-e")
                .arg(p.path("logs/error.log"))
                .args(["-t", "-q", "-c"])
                .arg(&f)
                .output()
                .expect("run -t");
            let err = String::from_utf8_lossy(&o.stderr);
            match want {
                None => assert!(o.status.success(), "{bin} {param}: {err}"),
                Some(msg) => {
                    assert!(!o.status.success(), "{bin} {param} accepted");
                    let line = format!("[emerg] {} in {}:5\n", msg, f.display());
                    assert!(err.contains(&line), "{bin} {param}: {err}");
                }
            }
        }
    }
}

/// `-p DIR -c conf/x`: a relative `-c` is under the prefix (nginx adds
/// the prefix's trailing `/` when it is missing), never under the current
/// directory, whether the prefix is absolute or relative, with or without
/// its slash; a relative prefix stays relative in what is printed, as
/// nginx prints it. The current directory has a broken `conf/x` to tell
/// the two apart. A relative prefix also serves: root and logs under it.
#[test]
fn prefix_without_slash_and_relative_conf_as_nginx() {
    let top = Prefix::new();
    top.write("pre/conf/x", "events {}\nhttp { }\n");
    top.write("cwd/conf/x", "events {}\nhttp { not_in_the_prefix; }\n");
    let cwd = top.path("cwd");
    let pre = top.path("pre");
    let abs = pre.display().to_string();
    let run = |bin: &str, p: &str, who: &str| {
        let o = Command::new(bin)
            .current_dir(&cwd)
            .args(["-t", "-p", p, "-c", "conf/x", "-e", "stderr"])
            .stdin(Stdio::null())
            .output()
            .expect("run");
        // nginx's stderr lines start with a time for [emerg]; keep the ends.
        let text = stderr(&o).replace(&format!("{who}: "), "");
        (o.status.code(), text)
    };
    for (p, shown) in [
        (abs.clone(), format!("{abs}/conf/x")),
        (format!("{abs}/"), format!("{abs}/conf/x")),
        ("../pre".to_string(), "../pre/conf/x".to_string()),
        ("../pre/".to_string(), "../pre/conf/x".to_string()),
    ] {
        let ours = run(BIN, &p, "tern");
        assert_eq!(
            ours,
            (
                Some(0),
                format!(
                    "the configuration file {shown} syntax is ok\n\
                     configuration file {shown} test is successful\n"
                )
            ),
            "-p {p}"
        );
        if std::path::Path::new(NGINX).exists() {
            assert_eq!(run(NGINX, &p, "nginx"), ours, "nginx, -p {p}");
        }
    }

    // Serving with `-p ../pre -c conf/s.conf` from the other directory.
    let port = free_port();
    top.write(
        "pre/conf/s.conf",
        conf_text(
            "http { server { listen 127.0.0.1:@PORT@; location / { root html; } } }",
            port,
        ),
    );
    top.write("pre/html/i.txt", "from the prefix\n");
    std::fs::create_dir_all(top.path("pre/logs")).expect("mkdir");
    let mut child = Command::new(BIN)
        .current_dir(&cwd)
        .args(["-p", "../pre", "-c", "conf/s.conf", "-g", "daemon off;"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tern");
    struct Stop<'a>(&'a mut std::process::Child);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stop = Stop(&mut child);
    eventually(10, "tern listening", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let r = Resp::parse(&raw(port, b"GET /i.txt HTTP/1.0\r\n\r\n")).expect("a response");
    assert_eq!(
        (r.status, r.body_str().as_str()),
        (200, "from the prefix\n")
    );
    assert_eq!(
        Resp::parse(&raw(port, b"GET /nope HTTP/1.0\r\n\r\n")).map(|r| r.status),
        Some(404)
    );
    // Paths under a relative prefix stay relative, as nginx logs them.
    wait_log(
        &top,
        "pre/logs/error.log",
        "open() \"../pre/html/nope\" failed",
    );
    drop(stop);
}
