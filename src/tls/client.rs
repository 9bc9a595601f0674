//! TLS to upstreams (`proxy_pass https://...`), with tokio-rustls.
//!
//! A location's `proxy_ssl_*` settings are checked and the trusted
//! certificates read at configuration time (master thread); the rustls
//! `ClientConfig` is made from the merged settings on the location's first
//! proxied request (CPU only) and kept with the location, so its session
//! cache serves every later request (`proxy_ssl_session_reuse`).
//!
//! As nginx: the certificate is not verified unless `proxy_ssl_verify on`
//! (then against `proxy_ssl_trusted_certificate` and `proxy_ssl_name`),
//! and SNI is sent only with `proxy_ssl_server_name on`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::tls::provider;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::config::{ConfError, ConfResult};

/// A location's merged `proxy_ssl_*` settings.
#[derive(Debug, Clone)]
pub struct UpSsl {
    pub verify: bool,
    pub server_name: bool,
    pub protocols: (bool, bool),
    /// TLS 1.2 suites from `proxy_ssl_ciphers` (checked at config time).
    pub ciphers: String,
    /// `proxy_ssl_trusted_certificate`, read.
    pub roots: Option<Arc<Trusted>>,
    pub session_reuse: bool,
    /// `proxy_ssl_verify_depth` (nginx's default 1).
    pub verify_depth: u32,
    /// `proxy_ssl_crl`, read (DER); Some turns revocation checks on.
    pub crls: Option<Arc<Vec<Vec<u8>>>>,
    /// `proxy_ssl_certificate` with its key: offered when the upstream
    /// asks for a client certificate.
    pub certificate: Option<Arc<rustls::sign::CertifiedKey>>,
    /// From `proxy_ssl_conf_command` (see [`UpSsl::apply_commands`]): the
    /// TLS 1.3 suites in order, the key exchange groups, and whether
    /// session tickets are asked for.
    pub tls13_suites: Option<Vec<rustls::CipherSuite>>,
    pub groups: Option<String>,
    pub tickets: bool,
    /// `proxy_ssl_alpn` without variables: the protocols offered.
    pub alpn: Vec<Vec<u8>>,
}

impl UpSsl {
    /// Applies `proxy_ssl_conf_command`s after the other settings, as
    /// nginx hands them to OpenSSL last: the protocols, ciphers, groups
    /// and tickets they name replace the directives' values, and a
    /// `Certificate`/`PrivateKey` pair (the last one) replaces
    /// `proxy_ssl_certificate` (OpenSSL's client offers the one pair it
    /// has for the server's key type; tern's client has one pair).
    pub fn apply_commands(
        &mut self,
        cmds: &[crate::tls::conf_command::Cmd],
        passwords: &[Vec<u8>],
    ) -> ConfResult<()> {
        let fx = crate::tls::conf_command::effect(cmds, self.protocols)?;
        self.apply_effect(&fx);
        if let Some((c, k)) = fx.pairs.last() {
            self.certificate = Some(load_certificate(c, k, passwords)?);
        }
        Ok(())
    }

    /// The commands' protocols, ciphers, groups and tickets (what
    /// [`UpSsl::apply_commands`] applies besides the certificate, which a
    /// caller that read it beforehand sets itself).
    pub fn apply_effect(&mut self, fx: &crate::tls::conf_command::Effect) {
        self.protocols = fx.protocols;
        if let Some(c) = &fx.ciphers {
            self.ciphers = c.clone();
        }
        if fx.tls13_suites.is_some() {
            self.tls13_suites = fx.tls13_suites.clone();
        }
        if fx.groups.is_some() {
            self.groups = fx.groups.clone();
        }
        if let Some(t) = fx.tickets {
            self.tickets = t;
        }
    }
}

impl Default for UpSsl {
    /// nginx 1.22's defaults: no verification, no SNI, TLSv1 TLSv1.1
    /// TLSv1.2 (of which rustls has 1.2), `DEFAULT` ciphers, sessions
    /// reused, depth 1.
    fn default() -> Self {
        UpSsl {
            verify: false,
            server_name: false,
            protocols: (true, false),
            ciphers: "DEFAULT".into(),
            roots: None,
            session_reuse: true,
            verify_depth: 1,
            crls: None,
            certificate: None,
            tls13_suites: None,
            groups: None,
            tickets: true,
            alpn: Vec::new(),
        }
    }
}

/// `proxy_ssl_trusted_certificate`: the certificates (DER), judged as
/// OpenSSL judges an upstream's chain for nginx (see [`UpVerify`]).
#[derive(Debug)]
pub struct Trusted(pub Vec<Vec<u8>>);

/// Reads `proxy_ssl_trusted_certificate` (PEM, one or more CAs).
pub fn load_roots(path: &str) -> ConfResult<Arc<Trusted>> {
    let bad =
        |why: String| ConfError::new(format!("cannot load certificate \"{}\": {}", path, why));
    let pem = std::fs::read(path).map_err(|e| {
        bad(format!(
            "BIO_new_file() failed {}",
            crate::core::errno_text(&e)
        ))
    })?;
    let mut der = Vec::new();
    let certs = crate::tls::x509::pem_certs(&pem)
        .map_err(|e| bad(format!("PEM_read_bio_X509() failed ({})", e)))?;
    for c in certs {
        x509_parser::parse_x509_certificate(&c)
            .map_err(|e| bad(format!("X509_STORE_add_cert() failed ({})", e)))?;
        der.push(c.to_vec());
    }
    if der.is_empty() {
        return Err(bad(
            "PEM_read_bio_X509() failed (no certificate in the file)".into(),
        ));
    }
    Ok(Arc::new(Trusted(der)))
}

/// Reads `proxy_ssl_crl` (PEM CRLs), with nginx's wording on failure.
pub fn load_crls(path: &str) -> ConfResult<Arc<Vec<Vec<u8>>>> {
    crate::tls::client_auth::read_crls(path).map(Arc::new)
}

/// `proxy_ssl_certificate` + `_key` (+ `proxy_ssl_password_file`'s
/// passphrases), read on the master thread.
pub fn load_certificate(
    cert: &str,
    key: &str,
    passwords: &[Vec<u8>],
) -> ConfResult<Arc<rustls::sign::CertifiedKey>> {
    crate::tls::config::load_pair(cert, key, passwords)
}

/// Checks a `proxy_ssl_ciphers` list (nginx's error if it selects nothing
/// OpenSSL knows).
pub fn check_ciphers(list: &str) -> ConfResult<()> {
    crate::tls::config::tls12_suites(list).map(drop)
}

/// The rustls client configuration for `s`.
pub fn client_config(s: &UpSsl) -> Result<Arc<ClientConfig>, rustls::Error> {
    let tls12 = crate::tls::config::tls12_suites(&s.ciphers).unwrap_or_default();
    let tls13 = provider::ALL_CIPHER_SUITES
        .iter()
        .filter(|c| c.version() == &rustls::version::TLS13);
    let mut suites: Vec<rustls::SupportedCipherSuite> = match &s.tls13_suites {
        // `Ciphersuites` of proxy_ssl_conf_command: these, in its order.
        Some(order) => order
            .iter()
            .filter_map(|want| tls13.clone().find(|c| c.suite() == *want))
            .copied()
            .collect(),
        None => tls13.copied().collect(),
    };
    suites.extend(tls12.iter().copied());
    let mut p = CryptoProvider {
        cipher_suites: suites,
        ..crate::tls::default_provider()
    };
    if let Some(g) = &s.groups {
        p.kx_groups = crate::tls::config::kx_groups(g)
            .map_err(|e| rustls::Error::General(format!("invalid groups \"{}\": {}", g, e.msg)))?;
    }
    let p = Arc::new(p);
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if s.protocols.1 {
        versions.push(&rustls::version::TLS13);
    }
    if s.protocols.0 && !tls12.is_empty() {
        versions.push(&rustls::version::TLS12);
    }
    let b = ClientConfig::builder_with_provider(p.clone()).with_protocol_versions(&versions)?;
    let verifier: Arc<dyn ServerCertVerifier> = match (&s.roots, s.verify) {
        (Some(roots), true) => Arc::new(UpVerify {
            judge: crate::tls::client_auth::ClientAuth::for_upstream(
                roots.0.clone(),
                s.verify_depth,
                s.crls.as_deref().cloned(),
            ),
            provider: p,
        }),
        _ => Arc::new(NoVerify(p)),
    };
    let b = b.dangerous().with_custom_certificate_verifier(verifier);
    let mut cfg = match &s.certificate {
        Some(k) => b.with_client_cert_resolver(Arc::new(ClientCert(k.clone()))),
        None => b.with_no_client_auth(),
    };
    cfg.enable_sni = s.server_name;
    cfg.alpn_protocols = s.alpn.clone();
    if !s.session_reuse {
        cfg.resumption = Resumption::disabled();
    } else if !s.tickets {
        // `Options -SessionTicket`: TLS 1.2 sessions resume by id only.
        cfg.resumption =
            Resumption::default().tls12_resumption(rustls::client::Tls12Resumption::SessionIdOnly);
    }
    Ok(Arc::new(cfg))
}

/// `proxy_ssl_certificate`: offered whatever CA names the upstream hints,
/// as OpenSSL does for nginx.
#[derive(Debug)]
pub struct ClientCert(pub Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for ClientCert {
    fn resolve(
        &self,
        _: &[&[u8]],
        _: &[SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
    fn has_certs(&self) -> bool {
        true
    }
}

/// Why an upstream's certificate was refused, in nginx's words (the
/// error log line, before " while SSL handshaking to upstream").
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

fn refused(text: String) -> rustls::Error {
    rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(
        Arc::new(Refused(text)),
    )))
}

/// What the error log says of a failed handshake to an upstream: nginx's
/// `upstream SSL certificate verify error: (N:reason)` or `upstream SSL
/// certificate does not match "name"` for a refused certificate, else
/// `SSL_do_handshake() failed (...)`.
pub fn handshake_error_text(e: &io::Error) -> String {
    if let Some(rustls::Error::InvalidCertificate(rustls::CertificateError::Other(o))) =
        e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
    {
        if let Some(r) = o.0.downcast_ref::<Refused>() {
            return r.0.clone();
        }
    }
    format!("SSL_do_handshake() failed ({})", e)
}

/// `proxy_ssl_verify on`: the chain judged as OpenSSL judges it for
/// nginx (trusted first, `proxy_ssl_verify_depth`, CRL_CHECK_ALL with
/// `proxy_ssl_crl`, X.509 v1 certificates taken), then the name as
/// `X509_check_host` checks it (subjectAltName DNS names, wildcards in
/// the leftmost label; the subject's CN when there is no DNS name).
#[derive(Debug)]
struct UpVerify {
    judge: crate::tls::client_auth::ClientAuth,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for UpVerify {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut chain = Vec::with_capacity(1 + intermediates.len());
        chain.push(end_entity.clone());
        chain.extend(intermediates.iter().cloned());
        if let Err(e) = self.judge.verify(&chain) {
            return Err(refused(format!(
                "upstream SSL certificate verify error: ({}:{})",
                e.0, e.1
            )));
        }
        let name = server_name.to_str();
        if !host_matches(end_entity, &name) {
            return Err(refused(format!(
                "upstream SSL certificate does not match \"{}\"",
                name
            )));
        }
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_with_cert_key(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
            false,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_with_cert_key(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
            true,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `X509_check_host(cert, name)` with nginx's flags (none): a DNS name
/// of subjectAltName matches, `*` standing for a whole leftmost label or
/// part of it; without any DNS name the subject's common names are tried
/// the same way. An IP address also matches an iPAddress entry.
fn host_matches(cert: &[u8], name: &str) -> bool {
    use x509_parser::extensions::GeneralName;
    let Ok((_, c)) = x509_parser::parse_x509_certificate(cert) else {
        return false;
    };
    let ip: Option<std::net::IpAddr> = name.parse().ok();
    let mut had_dns = false;
    if let Ok(Some(san)) = c.subject_alternative_name() {
        for g in &san.value.general_names {
            match g {
                GeneralName::DNSName(d) => {
                    had_dns = true;
                    if dns_matches(d, name) {
                        return true;
                    }
                }
                GeneralName::IPAddress(b) => {
                    let a = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).ok().map(std::net::IpAddr::from),
                        16 => <[u8; 16]>::try_from(*b).ok().map(std::net::IpAddr::from),
                        _ => None,
                    };
                    if a.is_some() && a == ip {
                        return true;
                    }
                }
                _ => {}
            }
        }
    }
    if had_dns {
        return false;
    }
    let found = c
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .any(|cn| dns_matches(cn, name));
    found
}

/// One certificate name against a host name, case-insensitively; a
/// wildcard only in the leftmost label, never matching a dot, and not
/// in a name of fewer than three labels.
fn dns_matches(pattern: &str, host: &str) -> bool {
    let p = pattern.trim_end_matches('.').to_ascii_lowercase();
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    if !p.contains('*') {
        return !p.is_empty() && p == h;
    }
    let Some((pl, prest)) = p.split_once('.') else {
        return false;
    };
    let Some((hl, hrest)) = h.split_once('.') else {
        return false;
    };
    if prest.contains('*') || !prest.contains('.') || prest != hrest {
        return false;
    }
    let Some((pre, suf)) = pl.split_once('*') else {
        return false;
    };
    !suf.contains('*')
        && hl.len() >= pre.len() + suf.len()
        && hl.starts_with(pre)
        && hl.ends_with(suf)
        && !(hl.is_empty())
}

/// `proxy_ssl_verify off`: any certificate is taken; the handshake's
/// signatures are still checked against its public key.
///
/// The key is read from the certificate here rather than by webpki, which
/// takes only X.509 v3 certificates: OpenSSL (so nginx) also takes v1
/// ones, which `openssl req -x509` writes when the configuration has no
/// extensions section, and upstreams in the wild serve them.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_with_cert_key(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
            false,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_with_cert_key(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
            true,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// One DER element at the start of `b`: (tag, contents, what follows).
fn der_next(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&l0, rest) = rest.split_first()?;
    let (len, rest) = if l0 < 0x80 {
        (usize::from(l0), rest)
    } else {
        let n = usize::from(l0 & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &x| (a << 8) | usize::from(x));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// A certificate's SubjectPublicKeyInfo (DER), whatever its version.
fn cert_spki(cert: &[u8]) -> Option<Vec<u8>> {
    let (_, c) = x509_parser::parse_x509_certificate(cert).ok()?;
    Some(c.tbs_certificate.subject_pki.raw.to_vec())
}

/// A SubjectPublicKeyInfo's parts: (the AlgorithmIdentifier's contents,
/// the key bits).
fn spki_parts(spki: &[u8]) -> Option<(&[u8], &[u8])> {
    let (tag, spki, _) = der_next(spki)?;
    if tag != 0x30 {
        return None;
    }
    let (t_alg, alg, rest) = der_next(spki)?;
    let (t_key, bits, _) = der_next(rest)?;
    // A BIT STRING of whole bytes: its first byte (unused bits) is 0.
    let (&0, key) = bits.split_first()? else {
        return None;
    };
    (t_alg == 0x30 && t_key == 0x03).then_some((alg, key))
}

/// Checks a handshake signature with the key of `cert`, as rustls's
/// webpki functions do (TLS 1.3: rustls's raw-key check; TLS 1.2: any
/// algorithm of the scheme that fits the key).
fn verify_with_cert_key(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algs: &rustls::crypto::WebPkiSupportedAlgorithms,
    tls13: bool,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    use rustls::{CertificateError, PeerMisbehaved};
    let bad = || rustls::Error::InvalidCertificate(CertificateError::BadEncoding);
    let spki = cert_spki(cert).ok_or_else(bad)?;
    if tls13 {
        return rustls::crypto::verify_tls13_signature_with_raw_key(
            message,
            &rustls::pki_types::SubjectPublicKeyInfoDer::from(spki.as_slice()),
            dss,
            algs,
        );
    }
    let candidates = algs
        .mapping
        .iter()
        .find(|(s, _)| *s == dss.scheme)
        .map(|(_, a)| *a)
        .ok_or(PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme)?;
    let (alg_id, key) = spki_parts(&spki).ok_or_else(bad)?;
    for alg in candidates {
        if alg.public_key_alg_id().as_ref() != alg_id {
            continue;
        }
        return alg
            .verify_signature(key, message, dss.signature())
            .map(|()| HandshakeSignatureValid::assertion())
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadSignature));
    }
    Err(rustls::Error::InvalidCertificate(
        CertificateError::BadSignature,
    ))
}

/// The name to verify the upstream's certificate against (and to send as
/// SNI): `proxy_ssl_name`, else the proxy_pass host without its port.
pub fn server_name(name: &str) -> Option<ServerName<'static>> {
    let host = match name.strip_prefix('[') {
        Some(r) => r.split(']').next().unwrap_or(r),
        None => name.rsplit_once(':').map_or(name, |(h, _)| h),
    };
    ServerName::try_from(host.to_string()).ok()
}

/// A connection to an upstream, plain or TLS, or a unix-domain socket.
pub enum UpStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    Unix(tokio::net::UnixStream),
}

impl UpStream {
    pub fn is_tls(&self) -> bool {
        matches!(self, UpStream::Tls(_))
    }
}

/// The TLS handshake on a connected socket.
pub async fn connect(
    tcp: TcpStream,
    cfg: Arc<ClientConfig>,
    name: ServerName<'static>,
) -> io::Result<UpStream> {
    let s = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await?;
    Ok(UpStream::Tls(Box::new(s)))
}

impl AsyncRead for UpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            // A peer that closes without close_notify (uWSGI's
            // --ssl-socket does) ends the stream as a plain close, as
            // nginx's SSL_OP_IGNORE_UNEXPECTED_EOF: a body framed by the
            // close is complete; one with a length is still found short.
            UpStream::Tls(s) => match Pin::new(s.as_mut()).poll_read(cx, buf) {
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    Poll::Ready(Ok(()))
                }
                r => r,
            },
        }
    }
}

impl AsyncWrite for UpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpStream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            UpStream::Plain(s) => s.is_write_vectored(),
            UpStream::Unix(s) => s.is_write_vectored(),
            UpStream::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpStream::Unix(s) => Pin::new(s).poll_flush(cx),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            UpStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
