//! From a server's merged `ssl_*` settings to a rustls `ServerConfig`.
//!
//! Runs on the master thread while a configuration compiles (startup,
//! reload), so reading certificate files here blocks no worker. Each
//! server with certificates gets its own `ServerConfig`: the handshake
//! picks the server by SNI first (see `tls::stream::accept`) and then uses
//! that server's certificates, protocols and ciphers.
//!
//! The mapping onto rustls (`tls::provider`):
//! - `ssl_certificate`/`ssl_certificate_key` pairs: PEM chains and keys
//!   (RSA, ECDSA, Ed25519); with several pairs, the first whose key can
//!   sign with a scheme the client offers is used (RSA + ECDSA as nginx).
//! - `ssl_protocols`: TLSv1.2 and TLSv1.3; older versions are accepted in
//!   the file and never negotiated (rustls has none).
//! - `ssl_ciphers`: OpenSSL's cipher-list syntax, evaluated against the
//!   TLS 1.2 suites rustls has; like OpenSSL's, it does not touch TLS 1.3.
//! - `ssl_prefer_server_ciphers`: `ignore_client_order`.
//! - `ssl_ecdh_curve`: the key-exchange groups (X25519, P-256, P-384).
//! - `ssl_session_cache`, `ssl_session_timeout`, `ssl_session_tickets`,
//!   `ssl_session_ticket_key`: see `tls::sessions`.
//! - `ssl_verify_client` and its files: see `tls::client_auth`.
//! - `ssl_buffer_size`: the largest TLS record's plaintext.
//! - `ssl_conf_command`: applied last, see `tls::conf_command`.

use std::collections::HashMap;
use std::sync::Arc;

use crate::tls::provider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{CipherSuite, SupportedCipherSuite};

use crate::config::{ConfError, ConfResult};
use crate::core::errno_text;
use crate::http::conf::AddrConf;
use crate::http::modules::ssl_settings::SslConf;
use crate::tls::client_auth::{ClientAuth, VerifyMode};
use crate::tls::sessions;
use crate::tls::var_certs::{CertName, VarCerts};

/// Certificate/key pairs loaded while compiling one configuration: the
/// http level's `ssl_certificate` inherited by many servers is read once.
#[derive(Default)]
pub struct KeyCache(HashMap<(String, String), Arc<CertifiedKey>>);

/// nginx 1.22's default `ssl_ciphers`.
const DEFAULT_CIPHERS: &str = "HIGH:!aNULL:!MD5";

/// Builds `ssl.tls` for a server with certificates (None without).
pub fn build(ssl: &mut SslConf, keys: &mut KeyCache) -> ConfResult<()> {
    let Some(certs) = ssl.certificates.clone() else {
        return Ok(());
    };
    let key_names = ssl.certificate_keys.clone().unwrap_or_default();
    if key_names.len() < certs.len() {
        return Err(ConfError::new(format!(
            "no \"ssl_certificate_key\" is defined for certificate \"{}\"",
            certs.last().map(CertName::shown).unwrap_or("")
        )));
    }
    let mut pairs = Vec::with_capacity(certs.len());
    // Read for every server with certificates, as nginx does (a FIFO
    // there has a writer waiting).
    let passwords = match &ssl.password_file {
        Some(f) => crate::tls::keys::read_passwords(f)?,
        None => Vec::new(),
    };
    // With variables in any name, every pair is loaded per handshake
    // (tls::var_certs); the configuration is built without them.
    let per_handshake = certs.iter().chain(&key_names).any(CertName::has_vars);
    if per_handshake {
        ssl.var_certs = Some(Arc::new(VarCerts {
            pairs: certs
                .iter()
                .cloned()
                .zip(key_names.iter().cloned())
                .collect(),
            passwords: passwords.clone(),
            negotiate: None,
        }));
    } else {
        for (c, k) in certs.iter().zip(&key_names) {
            let id = (c.shown().to_string(), k.shown().to_string());
            let pair = match keys.0.get(&id) {
                Some(p) => p.clone(),
                None => {
                    let p = load_named(c, k, &passwords)?;
                    keys.0.insert(id, p.clone());
                    p
                }
            };
            pairs.push(pair);
        }
    }
    // `ssl_conf_command`s are applied after everything else, as nginx
    // hands them to OpenSSL last (tls::conf_command).
    let fx = crate::tls::conf_command::effect(
        ssl.conf_commands.as_deref().unwrap_or(&[]),
        // nginx 1.22's default is `TLSv1 TLSv1.1 TLSv1.2` (TLSv1.3
        // joined it in 1.23.4).
        ssl.protocols.unwrap_or((true, false)),
    )?;
    if !per_handshake {
        for (c, k) in &fx.pairs {
            // OpenSSL keeps one pair per key type: the command's takes
            // the place of the server's of the same type.
            let p = load_pair(c, k, &passwords)?;
            match pairs
                .iter()
                .position(|q| q.key.algorithm() == p.key.algorithm())
            {
                Some(i) => pairs[i] = p,
                None => pairs.push(p),
            }
        }
    }
    // The session id context: the leaf certificates (or their names when
    // they are loaded per handshake), and the CA names added below.
    let mut sid = ring::digest::Context::new(&ring::digest::SHA256);
    if per_handshake {
        for c in &certs {
            sid.update(c.shown().as_bytes());
            sid.update(b"\0");
        }
    } else {
        for p in &pairs {
            if let Some(c) = p.cert.first() {
                sid.update(ring::digest::digest(&ring::digest::SHA256, c).as_ref());
            }
        }
    }
    if let (Some(true), Some(f)) = (ssl.stapling, &ssl.stapling_file) {
        // A DER OCSP response, stapled as it is to every certificate of
        // the server (no responder is asked: see DIFFERENCES.md).
        let der = std::fs::read(f)
            .map_err(|e| ConfError::new(format!("open() \"{}\" failed {}", f, errno_text(&e))))?;
        pairs = pairs
            .into_iter()
            .map(|k| {
                let mut k = (*k).clone();
                k.ocsp = Some(der.clone());
                Arc::new(k)
            })
            .collect();
    }
    // `ssl_stapling on` without a file: each certificate's responder is
    // asked (tls::ocsp::Stapler). A certificate without an issuer or a
    // responder goes without, as nginx (which warns).
    let mut staplers = Vec::with_capacity(pairs.len());
    for k in &pairs {
        let s = if ssl.stapling == Some(true) && ssl.stapling_file.is_none() {
            let trusted = match &ssl.trusted_certificate {
                Some(p) => crate::tls::client_auth::read_certs(p)?,
                None => Vec::new(),
            };
            let log: Box<dyn Fn(&str) + Send + Sync> = Box::new(|m: &str| {
                crate::core::log::main_logger().log(
                    crate::core::log::Level::Error,
                    None,
                    format_args!("{}", m),
                )
            });
            crate::tls::ocsp::stapler(
                k,
                &trusted,
                ssl.stapling_responder.as_ref(),
                ssl.stapling_verify.unwrap_or(false),
                log,
            )
            .ok()
        } else {
            None
        };
        staplers.push(s);
    }
    if let Some(p) = &ssl.dhparam {
        // nginx reads it (DHE suites); rustls has none, but a missing
        // file is still the error nginx reports.
        std::fs::metadata(p).map_err(|e| {
            ConfError::new(format!("BIO_new_file(\"{}\") failed {}", p, errno_text(&e)))
        })?;
    }
    let ciphers = fx
        .ciphers
        .as_deref()
        .or(ssl.ciphers.as_deref())
        .unwrap_or(DEFAULT_CIPHERS);
    let tls12 = tls12_suites(ciphers)?;
    let groups = kx_groups(
        fx.groups
            .as_deref()
            .or(ssl.ecdh_curve.as_deref())
            .unwrap_or("auto"),
    )?;
    // TLS 1.3 suites: rustls's, or those of `Ciphersuites` in its order.
    let tls13_suites: Vec<SupportedCipherSuite> = match &fx.tls13_suites {
        None => provider::ALL_CIPHER_SUITES
            .iter()
            .filter(|s| s.version() == &rustls::version::TLS13)
            .copied()
            .collect(),
        Some(list) => list
            .iter()
            .filter_map(|c| {
                provider::ALL_CIPHER_SUITES
                    .iter()
                    .find(|s| s.suite() == *c)
                    .copied()
            })
            .collect(),
    };
    let (want12, want13) = fx.protocols;
    let want13 = want13 && !tls13_suites.is_empty();
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if want13 {
        versions.push(&rustls::version::TLS13);
    }
    if want12 && !tls12.is_empty() {
        versions.push(&rustls::version::TLS12);
    }
    if versions.is_empty() {
        // Only versions rustls cannot speak (TLSv1, TLSv1.1): nginx
        // starts, and every handshake fails. So does tern's.
        ssl.tls = Some(Arc::new(no_protocols_config()?));
        return Ok(());
    }
    let mut suites = tls13_suites;
    let negotiate = Negotiate {
        tls13: want13,
        tls12: if want12 { tls12.clone() } else { Vec::new() },
    };
    if let Some(v) = ssl.var_certs.as_mut().and_then(Arc::get_mut) {
        v.negotiate = Some(negotiate.clone());
    }
    let keys = Keys {
        pairs,
        staplers,
        tls13: negotiate.tls13,
        tls12: negotiate.tls12,
    };
    suites.extend(tls12);
    let p = rustls::crypto::CryptoProvider {
        cipher_suites: suites,
        kx_groups: groups,
        ..provider::default_provider()
    };
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(p))
        .with_protocol_versions(&versions)
        .map_err(|e| ConfError::new(format!("SSL_CTX_new() failed ({})", e)))?;
    let mut cfg = match client_auth(ssl)? {
        Some(a) => {
            let v = a.verifier();
            ssl.client_auth = Some(a);
            builder.with_client_cert_verifier(v)
        }
        None => builder.with_no_client_auth(),
    }
    .with_cert_resolver(Arc::new(keys));
    cfg.ignore_client_order = fx
        .server_preference
        .or(ssl.prefer_server_ciphers)
        .unwrap_or(false);
    // HTTP/1.x only, also on `listen ... http2` (clients fall back).
    cfg.alpn_protocols = vec![b"http/1.1".to_vec(), b"http/1.0".to_vec()];
    if let Some(n) = ssl.buffer_size {
        if n < 16384 {
            cfg.max_fragment_size = Some(n.max(64));
        }
    }
    let timeout = ssl.session_timeout.unwrap_or(300);
    let tickets = fx.tickets.or(ssl.session_tickets).unwrap_or(true);
    if let Some(a) = &ssl.client_auth {
        for n in a.hints() {
            sid.update(n.as_ref());
        }
    }
    let mut ctx = [0u8; 32];
    ctx.copy_from_slice(sid.finish().as_ref());
    cfg.session_storage = sessions::storage(ssl.session_cache.as_ref(), timeout, ctx);
    if tickets {
        if let Some(t) = sessions::ticketer(ssl.session_ticket_keys.as_deref(), timeout, ctx)? {
            cfg.ticketer = t;
        }
    }
    if !tickets && !cfg.session_storage.can_cache() {
        cfg.send_tls13_tickets = 0;
    }
    if let Some(n) = fx.num_tickets {
        cfg.send_tls13_tickets = n;
    }
    ssl.tls = Some(Arc::new(cfg));
    Ok(())
}

/// `ssl_verify_client` and its files, checked and read as nginx does for
/// a server with certificates.
fn client_auth(ssl: &SslConf) -> ConfResult<Option<Arc<ClientAuth>>> {
    let mode = ssl.verify_client.unwrap_or_default();
    if mode == VerifyMode::Off {
        return Ok(None);
    }
    // nginx 1.22 wants ssl_client_certificate; later ones take
    // ssl_trusted_certificate alone (no CA names are then sent).
    if ssl.client_certificate.is_none()
        && ssl.trusted_certificate.is_none()
        && mode != VerifyMode::OptionalNoCa
    {
        return Err(ConfError::new(
            "no ssl_client_certificate for ssl_verify_client".to_string(),
        ));
    }
    let mut a = ClientAuth::load(
        mode,
        ssl.client_certificate.as_deref(),
        ssl.trusted_certificate.as_deref(),
        ssl.verify_depth.unwrap_or(1),
        ssl.crl.as_deref(),
    )?;
    if let Some(Some(m)) = ssl.ocsp {
        a.ocsp = Some(crate::tls::ocsp::OcspConf {
            mode: m,
            responder: ssl.ocsp_responder.clone(),
            cache: ssl.ocsp_cache.clone().flatten(),
        });
    }
    Ok(Some(Arc::new(a)))
}

/// A configuration every handshake fails with: no certificate is ever
/// chosen.
fn no_protocols_config() -> ConfResult<rustls::ServerConfig> {
    rustls::ServerConfig::builder_with_provider(Arc::new(provider::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| {
            b.with_no_client_auth().with_cert_resolver(Arc::new(Keys {
                pairs: Vec::new(),
                staplers: Vec::new(),
                tls13: false,
                tls12: Vec::new(),
            }))
        })
        .map_err(|e| ConfError::new(format!("SSL_CTX_new() failed ({})", e)))
}

/// nginx's check after the servers are grouped by address: the default
/// server of an `ssl` address must have a certificate.
pub fn check_addrs<'a>(addrs: impl Iterator<Item = &'a Arc<AddrConf>>) -> ConfResult<()> {
    for a in addrs {
        let ssl = &a.default.srv.ssl;
        if !a.listen.ssl || ssl.tls.is_some() || ssl.reject_handshake == Some(true) {
            continue;
        }
        return Err(ConfError::new(format!(
            "no \"ssl_certificate\" is defined for the \"listen ... ssl\" directive in {}:{}",
            a.default.at.0.display(),
            a.default.at.1
        )));
    }
    Ok(())
}

/// Reads a certificate chain and its key (decrypted with `passwords`);
/// also the client certificate of `proxy_ssl_certificate`.
pub fn load_pair(cert: &str, key: &str, passwords: &[Vec<u8>]) -> ConfResult<Arc<CertifiedKey>> {
    load_named(
        &CertName::File(cert.to_string()),
        &CertName::File(key.to_string()),
        passwords,
    )
}

/// A pair named without variables (a file, or `data:`), read now.
pub fn load_named(
    cert: &CertName,
    key: &CertName,
    passwords: &[Vec<u8>],
) -> ConfResult<Arc<CertifiedKey>> {
    let read = |n: &CertName, what: &str| -> ConfResult<Vec<u8>> {
        match n {
            CertName::Data(d) => Ok(d.as_bytes()[5..].to_vec()),
            _ => std::fs::read(n.shown()).map_err(|e| {
                ConfError::new(format!(
                    "cannot load {} \"{}\": BIO_new_file() failed {}",
                    what,
                    n.shown(),
                    errno_text(&e)
                ))
            }),
        }
    };
    let cert_pem = read(cert, "certificate")?;
    let key_pem = read(key, "certificate key")?;
    crate::tls::var_certs::pair_from_pem(cert.shown(), &cert_pem, key.shown(), &key_pem, passwords)
        .map_err(ConfError::new)
}

/// What a server negotiates with its certificates (see [`Keys`]): kept
/// for the servers whose pairs are loaded per handshake.
#[derive(Debug, Clone)]
pub struct Negotiate {
    tls13: bool,
    tls12: Vec<SupportedCipherSuite>,
}

impl Negotiate {
    /// The certificate resolver of one handshake's `pairs`.
    pub(crate) fn resolver(&self, pairs: Vec<Arc<CertifiedKey>>) -> Arc<dyn ResolvesServerCert> {
        Arc::new(Keys {
            staplers: Vec::new(),
            pairs,
            tls13: self.tls13,
            tls12: self.tls12.clone(),
        })
    }
}

/// A server's certificate/key pairs, and what it can negotiate with them.
#[derive(Debug)]
struct Keys {
    pairs: Vec<Arc<CertifiedKey>>,
    /// `ssl_stapling on`: the stapler of each pair (None: no stapling).
    staplers: Vec<Option<Arc<crate::tls::ocsp::Stapler>>>,
    tls13: bool,
    tls12: Vec<SupportedCipherSuite>,
}

impl ResolvesServerCert for Keys {
    /// The first pair the client can use: its key signs with a scheme the
    /// client offers, and either TLS 1.3 is possible or a TLS 1.2 suite
    /// both sides have authenticates with that key's algorithm (an ECDSA
    /// certificate is useless to a client offering only RSA suites).
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let schemes = hello.signature_schemes();
        let offered = hello.cipher_suites();
        let tls13 = self.tls13
            && offered.iter().any(|c| {
                provider::ALL_CIPHER_SUITES
                    .iter()
                    .any(|s| s.suite() == *c && s.version() == &rustls::version::TLS13)
            });
        let usable = |k: &CertifiedKey| {
            k.key.choose_scheme(schemes).is_some()
                && (tls13
                    || self.tls12.iter().any(|s| {
                        offered.contains(&s.suite())
                            && s.usable_for_signature_algorithm(k.key.algorithm())
                    }))
        };
        let i = self
            .pairs
            .iter()
            .position(|k| usable(k))
            .or_else(|| (!self.pairs.is_empty()).then_some(0))?;
        match self.staplers.get(i) {
            Some(Some(s)) => Some(s.key()),
            _ => self.pairs.get(i).cloned(),
        }
    }
}

// ---- ciphers ----------------------------------------------------------------

/// rustls's suites with OpenSSL's names (for `ssl_ciphers` and
/// `$ssl_cipher`) and the cipher-list keywords each one matches.
const SUITES: &[(CipherSuite, &str, &[&str])] = &[
    (
        CipherSuite::TLS13_AES_256_GCM_SHA384,
        "TLS_AES_256_GCM_SHA384",
        &[],
    ),
    (
        CipherSuite::TLS13_AES_128_GCM_SHA256,
        "TLS_AES_128_GCM_SHA256",
        &[],
    ),
    (
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
        "TLS_CHACHA20_POLY1305_SHA256",
        &[],
    ),
    (
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        &["aECDSA", "ECDSA", "AES", "AES256", "AESGCM", "SHA384"],
    ),
    (
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        &["aECDSA", "ECDSA", "AES", "AES128", "AESGCM", "SHA256"],
    ),
    (
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        &["aECDSA", "ECDSA", "CHACHA20", "SHA256"],
    ),
    (
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "ECDHE-RSA-AES256-GCM-SHA384",
        &["aRSA", "AES", "AES256", "AESGCM", "SHA384"],
    ),
    (
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "ECDHE-RSA-AES128-GCM-SHA256",
        &["aRSA", "AES", "AES128", "AESGCM", "SHA256"],
    ),
    (
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        "ECDHE-RSA-CHACHA20-POLY1305",
        &["aRSA", "CHACHA20", "SHA256"],
    ),
];

/// Keywords every TLS 1.2 suite of rustls matches (all are ECDHE, AEAD,
/// strong).
const COMMON: &[&str] = &[
    "ALL", "DEFAULT", "HIGH", "ECDHE", "EECDH", "kECDHE", "kEECDH", "ECDH", "AEAD", "TLSv1.2",
    "FIPS",
];

/// OpenSSL keywords that select only suites rustls lacks.
const NONE_OF_OURS: &[&str] = &[
    "COMPLEMENTOFDEFAULT",
    "COMPLEMENTOFALL",
    "MEDIUM",
    "LOW",
    "EXPORT",
    "EXP",
    "eNULL",
    "NULL",
    "aNULL",
    "ADH",
    "AECDH",
    "DHE",
    "EDH",
    "kDHE",
    "kEDH",
    "DH",
    "kRSA",
    "RSA",
    "PSK",
    "kPSK",
    "aPSK",
    "ECDHEPSK",
    "DHEPSK",
    "RSAPSK",
    "SRP",
    "kSRP",
    "MD5",
    "RC4",
    "DES",
    "3DES",
    "SHA1",
    "SHA",
    "DSS",
    "aDSS",
    "CAMELLIA",
    "CAMELLIA128",
    "CAMELLIA256",
    "SEED",
    "IDEA",
    "ARIA",
    "ARIA128",
    "ARIA256",
    "AESCCM",
    "AESCCM8",
    "CBC",
    "SSLv3",
    "TLSv1",
    "TLSv1.0",
    "SUITEB128",
    "SUITEB192",
    "SUITEB128ONLY",
    "SUITEB128C2",
];

/// The OpenSSL name of a suite (`$ssl_cipher`).
pub fn openssl_name(s: CipherSuite) -> Option<&'static str> {
    SUITES.iter().find(|(c, _, _)| *c == s).map(|(_, n, _)| *n)
}

/// Whether a suite matches one `+`-joined cipher-list element.
fn matches(elem: &str, name: &str, attrs: &[&str]) -> bool {
    if elem == name {
        return true;
    }
    elem.split('+')
        .all(|k| COMMON.contains(&k) || attrs.contains(&k))
}

/// Evaluates an OpenSSL cipher list against rustls's TLS 1.2 suites,
/// keeping the list's order. An element is added, `!`/`-` removes (`!`
/// for good), `+` moves to the end, `@...` is ignored. A list none of
/// whose elements OpenSSL would know either is nginx's "no cipher match".
pub(crate) fn tls12_suites(list: &str) -> ConfResult<Vec<SupportedCipherSuite>> {
    let ours: Vec<(SupportedCipherSuite, &str, &[&str])> = provider::ALL_CIPHER_SUITES
        .iter()
        .filter(|s| s.version() == &rustls::version::TLS12)
        .filter_map(|s| {
            SUITES
                .iter()
                .find(|(c, _, _)| *c == s.suite())
                .map(|(_, n, a)| (*s, *n, *a))
        })
        .collect();
    let mut out: Vec<usize> = Vec::new();
    let mut banned: Vec<usize> = Vec::new();
    let mut known = false;
    for raw in list.split([':', ',', ' ', ';']).filter(|e| !e.is_empty()) {
        if raw.starts_with('@') {
            known = true;
            continue;
        }
        let (op, elem) = match raw.as_bytes()[0] {
            b'!' | b'-' | b'+' => (raw.as_bytes()[0], &raw[1..]),
            _ => (0, raw),
        };
        let hits: Vec<usize> = ours
            .iter()
            .enumerate()
            .filter(|(_, (_, n, a))| matches(elem, n, a))
            .map(|(i, _)| i)
            .collect();
        known |= !hits.is_empty()
            || elem.contains('-')
            || elem.contains('_')
            || elem
                .split('+')
                .all(|k| NONE_OF_OURS.contains(&k) || COMMON.contains(&k));
        match op {
            b'!' => {
                out.retain(|i| !hits.contains(i));
                banned.extend(hits);
            }
            b'-' => out.retain(|i| !hits.contains(i)),
            b'+' => {
                let moved: Vec<usize> = out.iter().copied().filter(|i| hits.contains(i)).collect();
                out.retain(|i| !hits.contains(i));
                out.extend(moved);
            }
            _ => {
                for i in hits {
                    if !out.contains(&i) && !banned.contains(&i) {
                        out.push(i);
                    }
                }
            }
        }
    }
    if !known {
        return Err(ConfError::new(format!(
            "SSL_CTX_set_cipher_list(\"{}\") failed (no cipher match)",
            list
        )));
    }
    Ok(out.into_iter().map(|i| ours[i].0).collect())
}

/// Checks an `ssl_ecdh_curve`-style group list (`ssl_conf_command
/// Groups`).
pub(crate) fn check_groups(v: &str) -> ConfResult<()> {
    kx_groups(v).map(|_| ())
}

/// `ssl_ecdh_curve auto | NAME[:NAME...]`.
pub(crate) fn kx_groups(v: &str) -> ConfResult<Vec<&'static dyn rustls::crypto::SupportedKxGroup>> {
    if v == "auto" {
        return Ok(crate::tls::default_kx_groups());
    }
    let mut out: Vec<&'static dyn rustls::crypto::SupportedKxGroup> = Vec::new();
    for n in v.split(':') {
        let g: &'static dyn rustls::crypto::SupportedKxGroup = match n {
            "X25519" | "x25519" => provider::kx_group::X25519,
            "prime256v1" | "secp256r1" | "P-256" => provider::kx_group::SECP256R1,
            "secp384r1" | "P-384" => provider::kx_group::SECP384R1,
            "X25519MLKEM768" => provider::kx_group::X25519MLKEM768,
            // Known to OpenSSL, not to rustls: skipped.
            "X448" | "x448" | "secp521r1" | "P-521" => continue,
            _ => {
                return Err(ConfError::new(format!(
                    "SSL_CTX_set1_curves_list(\"{}\") failed (group '{}' cannot be set)",
                    v, n
                )))
            }
        };
        if !out.iter().any(|x| x.name() == g.name()) {
            out.push(g);
        }
    }
    if out.is_empty() {
        return Err(ConfError::new(format!(
            "SSL_CTX_set1_curves_list(\"{}\") failed (no group rustls supports)",
            v
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<&'static str> {
        tls12_suites(list)
            .unwrap()
            .iter()
            .filter_map(|s| openssl_name(s.suite()))
            .collect()
    }

    #[test]
    fn cipher_lists() {
        assert_eq!(names("HIGH:!aNULL:!MD5").len(), 6);
        assert_eq!(
            names("ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384"),
            [
                "ECDHE-RSA-AES128-GCM-SHA256",
                "ECDHE-ECDSA-AES256-GCM-SHA384"
            ]
        );
        assert_eq!(
            names("EECDH+AESGCM:EDH+AESGCM"),
            [
                "ECDHE-ECDSA-AES256-GCM-SHA384",
                "ECDHE-ECDSA-AES128-GCM-SHA256",
                "ECDHE-RSA-AES256-GCM-SHA384",
                "ECDHE-RSA-AES128-GCM-SHA256"
            ]
        );
        assert_eq!(names("HIGH:!aECDSA:!CHACHA20").len(), 2);
        assert!(names("DHE-RSA-AES128-GCM-SHA256").is_empty());
        assert!(tls12_suites("FOO").is_err());
    }

    #[test]
    fn curves() {
        assert_eq!(kx_groups("X25519:prime256v1").unwrap().len(), 2);
        assert!(kx_groups("foo").is_err());
    }
}
