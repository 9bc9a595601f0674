//! `ssl_ocsp` for client certificates, with a real OCSP responder on
//! loopback (`openssl ocsp -index ... -port`) and curl as the client:
//! a good certificate passes, a revoked one gets nginx's 495 (a "400 Bad
//! Request" page) and its error-log line, a responder that is down fails
//! the check; the same config in nginx answers the same. And
//! `ssl_stapling` fetching from that responder (`openssl s_client
//! -status` reads the staple).

use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::harness::{self, Prefix, Server};

fn openssl(dir: &Path, args: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("openssl {} >>openssl.out 2>&1", args))
        .current_dir(dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// root -> int -> good, revoked (the latter revoked in int's index).
fn make_pki(dir: &Path) -> bool {
    std::fs::create_dir_all(dir).expect("mkdir");
    let w = |name: &str, text: &str| std::fs::write(dir.join(name), text).expect("write");
    w(
        "req.conf",
        "[ req ]\ndefault_bits = 2048\nencrypt_key = no\ndistinguished_name = dn\n\
         x509_extensions = ext\n[ dn ]\n[ ext ]\nbasicConstraints = critical,CA:TRUE\n",
    );
    w(
        "ca.conf",
        &format!(
            "[ ca ]\ndefault_ca = myca\n[ myca ]\nnew_certs_dir = {d}\ndatabase = {d}/certindex\n\
             default_md = sha256\npolicy = pol\nserial = {d}/certserial\ndefault_days = 1\n\
             x509_extensions = ext\n[ pol ]\ncommonName = supplied\n[ ext ]\n\
             basicConstraints = critical,CA:TRUE\n",
            d = dir.display()
        ),
    );
    w("certserial", "1000");
    w("certindex", "");
    let ok = [
        "req -x509 -new -config req.conf -subj /CN=root/ -out root.crt -keyout root.key",
        "req -new -config req.conf -subj /CN=int/ -out int.csr -keyout int.key",
        "req -new -config req.conf -subj /CN=good/ -out good.csr -keyout good.key",
        "req -new -config req.conf -subj /CN=revoked/ -out revoked.csr -keyout revoked.key",
        "ca -batch -config ca.conf -keyfile root.key -cert root.crt -subj /CN=int/ -in int.csr -out int.crt",
        "ca -batch -config ca.conf -keyfile int.key -cert int.crt -subj /CN=good/ -in good.csr -out good.crt",
        "ca -batch -config ca.conf -keyfile int.key -cert int.crt -subj /CN=revoked/ -in revoked.csr -out revoked.crt",
        "ca -config ca.conf -revoke revoked.crt -keyfile int.key -cert int.crt",
        "req -x509 -new -config req.conf -subj /CN=server/ -out server.crt -keyout server.key",
    ]
    .iter()
    .all(|a| openssl(dir, a));
    if ok {
        let mut t = std::fs::read(dir.join("int.crt")).expect("int");
        t.extend(std::fs::read(dir.join("root.crt")).expect("root"));
        std::fs::write(dir.join("trusted.crt"), t).expect("trusted");
    }
    ok
}

/// `openssl ocsp` answering for int's certificates on `port` (its stdout
/// kept open: a write to a closed pipe would kill it).
struct Responder {
    child: Child,
    _stdout: Option<std::io::BufReader<std::process::ChildStdout>>,
}

impl Drop for Responder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn responder(dir: &Path, port: u16) -> Responder {
    use std::io::BufRead;
    let mut child = Command::new("openssl")
        .args([
            "ocsp",
            "-index",
            "certindex",
            "-port",
            &port.to_string(),
            "-rsigner",
            "int.crt",
            "-rkey",
            "int.key",
            "-CA",
            "int.crt",
            "-ignore_err",
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl ocsp");
    // Ready once it prints `ACCEPT [::]:PORT`. (Not a connect probe: the
    // OpenSSL 3.0 responder hangs on a connection that sends nothing.)
    let mut line = String::new();
    let mut out = child.stdout.take().map(std::io::BufReader::new);
    if let Some(o) = out.as_mut() {
        let _ = o.read_line(&mut line);
    }
    assert!(line.starts_with("ACCEPT"), "openssl ocsp: {:?}", line);
    Responder {
        child,
        _stdout: out,
    }
}

const CONF: &str = r#"
error_log logs/error.log info;
events {}
http {
    access_log off;
    ssl_certificate server.crt;
    ssl_certificate_key server.key;
    ssl_verify_client on;
    ssl_verify_depth 2;
    ssl_client_certificate trusted.crt;
    server {
        listen 127.0.0.1:@PORT@ ssl;
        ssl_ocsp leaf;
        ssl_ocsp_responder http://127.0.0.1:@OCSP@;
        location / { return 200 "$ssl_client_verify\n"; }
    }
    server {
        listen 127.0.0.1:@DOWN@ ssl;
        ssl_ocsp on;
        ssl_ocsp_responder http://127.0.0.1:@DEAD@/;
        location / { return 200 "$ssl_client_verify\n"; }
    }
}
"#;

/// (status, body) of curl presenting `cert`.
fn curl(dir: &Path, port: u16, cert: &str) -> String {
    let o = Command::new("curl")
        .args([
            "-sk",
            "--cert",
            &format!("{}.crt", cert),
            "--key",
            &format!("{}.key", cert),
            "-w",
            " %{http_code}",
            &format!("https://127.0.0.1:{}/", port),
        ])
        .current_dir(dir)
        .output()
        .expect("curl");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    // The status, and the body's first line when it is ours.
    let code = out.rsplit(' ').next().unwrap_or("").to_string();
    let first = out.lines().next().unwrap_or("").to_string();
    if code == "200" {
        format!("{} {}", code, first)
    } else {
        code
    }
}

fn run_all(dir: &Path, port: u16, down: u16) -> Vec<String> {
    vec![
        curl(dir, port, "good"),
        curl(dir, port, "revoked"),
        curl(dir, down, "good"),
    ]
}

#[test]
fn tls_ocsp_client_certificates_against_a_real_responder() {
    let p = Prefix::new();
    let dir = p.path("conf");
    if !make_pki(&dir) {
        eprintln!("skipped: the openssl CLI could not make the certificates");
        return;
    }
    let ocsp = harness::free_port();
    let _r = responder(&dir, ocsp);
    let dead = harness::DeadPort::new();
    let conf = |down: u16| {
        CONF.replace("@OCSP@", &ocsp.to_string())
            .replace("@DOWN@", &down.to_string())
            .replace("@DEAD@", &dead.port.to_string())
    };
    let down = harness::free_port();
    let s = Server::start_in(p, &conf(down));
    let want = ["200 SUCCESS", "400", "400"];
    assert_eq!(run_all(&dir, s.port, down), want);
    let log = s.wait_error_log("certificate revoked");
    assert!(
        log.contains(
            "client SSL certificate verify error: certificate revoked while reading client request headers"
        ),
        "{}",
        log
    );
    s.wait_error_log("client SSL certificate verify error: certificate status request failed");

    if !harness::nginx_installed() {
        return;
    }
    let np = Prefix::new();
    let ndir = np.path("conf");
    // nginx reads the same files (copied: the prefix is its own).
    std::fs::create_dir_all(&ndir).expect("mkdir");
    for f in [
        "server.crt",
        "server.key",
        "trusted.crt",
        "good.crt",
        "good.key",
        "revoked.crt",
        "revoked.key",
    ] {
        std::fs::copy(dir.join(f), ndir.join(f)).expect("copy");
    }
    let (port, down2) = (harness::free_port(), harness::free_port());
    let Some(_n) = harness::start_nginx(&np, &conf(down2), port) else {
        eprintln!("skipped: nginx did not start");
        return;
    };
    assert_eq!(run_all(&ndir, port, down2), want);
}

/// What `openssl s_client -status` saw stapled on `port`.
fn stapled(dir: &Path, port: u16) -> String {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo | openssl s_client -connect 127.0.0.1:{} -status 2>/dev/null",
            port
        ))
        .current_dir(dir)
        .output()
        .expect("s_client");
    let out = String::from_utf8_lossy(&o.stdout);
    if out.contains("OCSP response: no response sent") {
        return "none".into();
    }
    match out
        .lines()
        .find(|l| l.trim_start().starts_with("Cert Status:"))
    {
        Some(l) => l.trim().to_string(),
        None => "?".into(),
    }
}

const STAPLING: &str = r#"
events {}
http {
    access_log off;
    ssl_stapling on;
    ssl_stapling_responder http://127.0.0.1:@OCSP@;
    ssl_trusted_certificate trusted.crt;
    server {
        listen 127.0.0.1:@PORT@ ssl;
        ssl_certificate good.crt;
        ssl_certificate_key good.key;
        ssl_stapling_verify on;
    }
    server {
        listen 127.0.0.1:@REVOKED@ ssl;
        ssl_certificate revoked.crt;
        ssl_certificate_key revoked.key;
    }
}
"#;

/// `ssl_stapling on` with a responder: the first handshake starts the
/// request, later ones carry the answer ("good", checked with
/// `ssl_stapling_verify`); a revoked certificate gets no staple and the
/// error log says why.
#[test]
fn tls_ocsp_stapling_from_a_real_responder() {
    let p = Prefix::new();
    let dir = p.path("conf");
    if !make_pki(&dir) {
        eprintln!("skipped: the openssl CLI could not make the certificates");
        return;
    }
    let ocsp = harness::free_port();
    let _r = responder(&dir, ocsp);
    let revoked = harness::free_port();
    let conf = STAPLING
        .replace("@OCSP@", &ocsp.to_string())
        .replace("@REVOKED@", &revoked.to_string());
    let s = Server::start_in(p, &conf);
    harness::eventually(10, "a good staple", || {
        stapled(&dir, s.port) == "Cert Status: good"
    });
    assert_eq!(stapled(&dir, revoked), "none");
    s.wait_error_log("certificate status \"revoked\" in the OCSP response");
}
