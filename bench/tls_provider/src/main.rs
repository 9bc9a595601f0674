//! In-memory TLS 1.3 handshakes between a rustls client and a rustls
//! server, timing only the server's side (thread CPU time around each
//! server call): full and resumed handshakes, ring and aws-lc-rs, with
//! 0..4 session tickets sent after the handshake.
//!
//!     tls_provider CERT.pem KEY.pem [SECONDS_PER_CASE]
//!
//! Prints one line per case: provider, tickets, mode, handshakes, server
//! µs of CPU per handshake. Then bulk rows: the server encrypting
//! (`send`) and decrypting (`recv`) 16 KiB records with TLS 1.3 AES-GCM,
//! as server µs of CPU per MiB. Cases run in rounds; within a round each
//! case runs under both providers back to back, the order alternating by
//! round, so the two meet the same machine load.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Debug)]
struct AnyCert(Arc<CryptoProvider>);
impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Moves the TLS bytes one way; returns server CPU ns when `server_side`.
fn pump_c2s(c: &mut ClientConnection, s: &mut ServerConnection, buf: &mut Vec<u8>) -> u64 {
    buf.clear();
    while c.wants_write() {
        c.write_tls(buf).unwrap();
    }
    if buf.is_empty() {
        return 0;
    }
    let t0 = thread_cpu_ns();
    let mut rd = &buf[..];
    while !rd.is_empty() {
        s.read_tls(&mut rd).unwrap();
        s.process_new_packets().unwrap();
    }
    thread_cpu_ns() - t0
}

fn pump_s2c(s: &mut ServerConnection, c: &mut ClientConnection, buf: &mut Vec<u8>) -> u64 {
    buf.clear();
    let t0 = thread_cpu_ns();
    while s.wants_write() {
        s.write_tls(buf).unwrap();
    }
    let t = thread_cpu_ns() - t0;
    let mut rd = &buf[..];
    while !rd.is_empty() {
        c.read_tls(&mut rd).unwrap();
        c.process_new_packets().unwrap();
    }
    t
}

type Ticketer = fn() -> Result<Arc<dyn rustls::server::ProducesTickets>, rustls::Error>;

fn run(
    provider: Arc<CryptoProvider>,
    ticketer: Ticketer,
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
    tickets: usize,
    resume: bool,
    secs: f64,
) -> (u64, f64) {
    let mut sc = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain.to_vec(), key.clone_key())
        .unwrap();
    sc.send_tls13_tickets = tickets;
    sc.ticketer = ticketer().unwrap();
    let sc = Arc::new(sc);
    let cc = Arc::new(
        ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(provider.clone())))
            .with_no_client_auth(),
    );
    let name = ServerName::try_from("localhost").unwrap();
    let mut buf = Vec::with_capacity(16384);
    let (mut n, mut server_ns) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    // With resume, the client config's session cache holds the tickets of
    // the previous handshake (one full handshake first).
    let mut cc_run = cc.clone();
    if !resume {
        // A fresh cache each time: no resumption.
    }
    while Instant::now() < deadline {
        if !resume {
            let mut c = (*cc).clone();
            c.resumption = rustls::client::Resumption::disabled();
            cc_run = Arc::new(c);
        }
        let mut c = ClientConnection::new(cc_run.clone(), name.clone()).unwrap();
        let t0 = thread_cpu_ns();
        let mut s = ServerConnection::new(sc.clone()).unwrap();
        server_ns += thread_cpu_ns() - t0;
        while c.is_handshaking() || s.is_handshaking() || s.wants_write() {
            server_ns += pump_c2s(&mut c, &mut s, &mut buf);
            server_ns += pump_s2c(&mut s, &mut c, &mut buf);
        }
        // One small request and answer, as an HTTP client would.
        c.writer().write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        server_ns += pump_c2s(&mut c, &mut s, &mut buf);
        let t0 = thread_cpu_ns();
        let mut req = [0u8; 64];
        let _ = s.reader().read(&mut req);
        s.writer().write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").unwrap();
        s.send_close_notify();
        server_ns += thread_cpu_ns() - t0;
        server_ns += pump_s2c(&mut s, &mut c, &mut buf);
        if resume && n > 0 {
            assert!(matches!(
                s.handshake_kind(),
                Some(rustls::HandshakeKind::Resumed)
            ));
        }
        let t0 = thread_cpu_ns();
        drop(s);
        server_ns += thread_cpu_ns() - t0;
        n += 1;
    }
    (n, server_ns as f64 / n as f64 / 1000.0)
}

/// Bulk transfer over one TLS 1.3 connection with `suite`: `mib` MiB in
/// 16 KiB writes, server to client (`send`) or client to server; server
/// CPU µs per MiB.
fn bulk(
    provider: Arc<CryptoProvider>,
    suite: rustls::CipherSuite,
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
    send: bool,
    mib: usize,
) -> f64 {
    let mut p = (*provider).clone();
    p.cipher_suites.retain(|s| s.suite() == suite);
    let p = Arc::new(p);
    let sc = Arc::new(
        ServerConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain.to_vec(), key.clone_key())
            .unwrap(),
    );
    let cc = Arc::new(
        ClientConfig::builder_with_provider(p.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(p.clone())))
            .with_no_client_auth(),
    );
    let name = ServerName::try_from("localhost").unwrap();
    let mut c = ClientConnection::new(cc, name).unwrap();
    let mut s = ServerConnection::new(sc).unwrap();
    let mut buf = Vec::with_capacity(1 << 20);
    while c.is_handshaking() || s.is_handshaking() || s.wants_write() {
        pump_c2s(&mut c, &mut s, &mut buf);
        pump_s2c(&mut s, &mut c, &mut buf);
    }
    assert_eq!(s.negotiated_cipher_suite().map(|x| x.suite()), Some(suite));
    let chunk = vec![0x5au8; 16384];
    let mut sink = vec![0u8; 65536];
    let mut server_ns = 0u64;
    for _ in 0..mib * 64 {
        if send {
            let t0 = thread_cpu_ns();
            s.writer().write_all(&chunk).unwrap();
            buf.clear();
            while s.wants_write() {
                s.write_tls(&mut buf).unwrap();
            }
            server_ns += thread_cpu_ns() - t0;
            let mut rd = &buf[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).unwrap();
                c.process_new_packets().unwrap();
            }
            while let Ok(n) = c.reader().read(&mut sink) {
                if n == 0 {
                    break;
                }
            }
        } else {
            c.writer().write_all(&chunk).unwrap();
            buf.clear();
            while c.wants_write() {
                c.write_tls(&mut buf).unwrap();
            }
            let t0 = thread_cpu_ns();
            let mut rd = &buf[..];
            while !rd.is_empty() {
                s.read_tls(&mut rd).unwrap();
                s.process_new_packets().unwrap();
            }
            while let Ok(n) = s.reader().read(&mut sink) {
                if n == 0 {
                    break;
                }
            }
            server_ns += thread_cpu_ns() - t0;
        }
    }
    server_ns as f64 / mib as f64 / 1000.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(&args[1]).unwrap().map(|c| c.unwrap()).collect();
    let key = PrivateKeyDer::from_pem_file(&args[2]).unwrap();
    let secs: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let rounds: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3);
    let providers: [(&str, fn() -> CryptoProvider, Ticketer); 2] = [
        (
            "ring",
            rustls::crypto::ring::default_provider,
            rustls::crypto::ring::Ticketer::new,
        ),
        (
            "aws-lc-rs",
            rustls::crypto::aws_lc_rs::default_provider,
            rustls::crypto::aws_lc_rs::Ticketer::new,
        ),
    ];
    println!("provider\ttickets\tmode\thandshakes\tserver_us_per_hs");
    for round in 0..rounds {
        for (tickets, resume) in [(0usize, false), (2, false), (2, true)] {
            for k in 0..2 {
                let (pname, p, tk) = providers[(k + round) % 2];
                // X25519 only, as curl/OpenSSL 3.0 clients and nginx
                // 1.22 settle on (aws-lc-rs would otherwise pick its
                // post-quantum hybrid first).
                let mut prov = p();
                prov.kx_groups
                    .retain(|g| g.name() == rustls::NamedGroup::X25519);
                let (n, us) = run(Arc::new(prov), tk, &chain, &key, tickets, resume, secs);
                println!(
                    "{}\t{}\t{}\t{}\t{:.1}\t(round {})",
                    pname,
                    tickets,
                    if resume { "resumed" } else { "full" },
                    n,
                    us,
                    round + 1
                );
            }
        }
        for suite in [
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384,
        ] {
            for send in [true, false] {
                for k in 0..2 {
                    let (pname, p, _) = providers[(k + round) % 2];
                    let us = bulk(Arc::new(p()), suite, &chain, &key, send, 64);
                    println!(
                        "{}\t{:?}\t{}\tbulk\t{:.1} us/MiB\t(round {})",
                        pname,
                        suite,
                        if send { "send" } else { "recv" },
                        us,
                        round + 1
                    );
                }
            }
        }
    }
}
