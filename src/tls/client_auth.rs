//! Client certificates (`ssl_verify_client`, `ssl_client_certificate`,
//! `ssl_trusted_certificate`, `ssl_verify_depth`, `ssl_crl`).
//!
//! nginx asks for a certificate, lets the handshake finish whatever the
//! client sends, and judges the certificate when a request arrives: a bad
//! one is answered with 495, a missing one (with `on`) with 496, and
//! `$ssl_client_verify` says `SUCCESS`, `FAILED:reason` or `NONE`. tern
//! does the same:
//!
//! ```text
//!  config: ClientAuth::load (master thread: CA file, CRLs read once)
//!  handshake: AcceptAny (rustls ClientCertVerifier): sends the CA names of
//!    ssl_client_certificate, proves the client holds the key
//!    (CertificateVerify), accepts any chain
//!  after it: tls::stream::accept -> ClientAuth::verify(chain) -> TlsInfo
//!  request: phases::run -> cert_check (495 / 496)
//! ```
//!
//! The chain is judged the way OpenSSL judges it for nginx, not the way
//! webpki judges server certificates: a CA certificate or an X.509 v1
//! certificate may be a client certificate, `ssl_verify_depth` counts the
//! intermediates, every certificate of the chain is checked against the
//! CRLs when `ssl_crl` is given (CRL_CHECK_ALL), and the reasons are
//! OpenSSL's numbers and words (the `FAILED:` text and the error log
//! line). Signatures are verified by ring (through x509-parser).

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, UnixTime};
use x509_parser::prelude::*;

use crate::config::{ConfError, ConfResult};
use crate::core::errno_text;

/// `ssl_verify_client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyMode {
    #[default]
    Off,
    On,
    Optional,
    OptionalNoCa,
}

/// An OpenSSL verification error: its number and its text
/// (`X509_verify_cert_error_string`, OpenSSL 3's wording).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyError(pub u32, pub &'static str);

const UNABLE_TO_GET_ISSUER_CERT: VerifyError = VerifyError(2, "unable to get issuer certificate");
const UNABLE_TO_GET_CRL: VerifyError = VerifyError(3, "unable to get certificate CRL");
const CERT_SIGNATURE_FAILURE: VerifyError = VerifyError(7, "certificate signature failure");
const CRL_SIGNATURE_FAILURE: VerifyError = VerifyError(8, "CRL signature failure");
const CERT_NOT_YET_VALID: VerifyError = VerifyError(9, "certificate is not yet valid");
const CERT_HAS_EXPIRED: VerifyError = VerifyError(10, "certificate has expired");
const CRL_NOT_YET_VALID: VerifyError = VerifyError(11, "CRL is not yet valid");
const CRL_HAS_EXPIRED: VerifyError = VerifyError(12, "CRL has expired");
const DEPTH_ZERO_SELF_SIGNED_CERT: VerifyError = VerifyError(18, "self-signed certificate");
const SELF_SIGNED_CERT_IN_CHAIN: VerifyError =
    VerifyError(19, "self-signed certificate in certificate chain");
const UNABLE_TO_GET_ISSUER_CERT_LOCALLY: VerifyError =
    VerifyError(20, "unable to get local issuer certificate");
const CERT_CHAIN_TOO_LONG: VerifyError = VerifyError(22, "certificate chain too long");
const CERT_REVOKED: VerifyError = VerifyError(23, "certificate revoked");
const INVALID_CA: VerifyError = VerifyError(24, "invalid CA certificate");
const INVALID_PURPOSE: VerifyError = VerifyError(26, "unsupported certificate purpose");

impl std::fmt::Display for VerifyError {
    /// The error log's form: `(N:reason)`, or the bare reason of an OCSP
    /// verdict (nginx's `ngx_ssl_ocsp_get_status` strings have no number).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == u32::MAX {
            f.write_str(self.1)
        } else {
            write!(f, "({}:{})", self.0, self.1)
        }
    }
}

impl VerifyError {
    /// nginx's `ngx_ssl_verify_error_optional`: the errors that
    /// `optional_no_ca` lets through (the issuer is not known).
    pub fn is_no_ca(self) -> bool {
        matches!(self.0, 2 | 18 | 19 | 20 | 21)
    }
}

/// Why a finished handshake's client certificate ends a stream or mail
/// session (nginx's `ngx_stream_ssl_handler`, `ngx_mail_verify_cert`):
/// its chain failed verification (unless `optional_no_ca` forgives an
/// unknown issuer), or `ssl_verify_client on` and the client sent none.
/// Displayed as nginx's error-log text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Invalid(VerifyError),
    Missing,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Invalid(e) => write!(f, "client SSL certificate verify error: {}", e),
            Refusal::Missing => f.write_str("client sent no required SSL certificate"),
        }
    }
}

/// The verdict of a server's `ssl_verify_client` (`auth`; None: off) on
/// a finished handshake (`info`).
pub fn refusal(auth: Option<&ClientAuth>, info: &crate::tls::TlsInfo) -> Option<Refusal> {
    let a = auth?;
    if a.mode == VerifyMode::Off {
        return None;
    }
    if let Err(e) = info.verify {
        if a.mode != VerifyMode::OptionalNoCa || !e.is_no_ca() {
            return Some(Refusal::Invalid(e));
        }
    }
    if a.mode == VerifyMode::On && info.client_chain.is_none() {
        return Some(Refusal::Missing);
    }
    None
}

/// A server's client-certificate settings, loaded.
#[derive(Debug)]
pub struct ClientAuth {
    pub mode: VerifyMode,
    /// `ssl_client_certificate` + `ssl_trusted_certificate`, DER.
    store: Vec<Vec<u8>>,
    /// The subjects of `ssl_client_certificate` (sent to the client),
    /// without duplicates.
    hints: Vec<DistinguishedName>,
    /// `ssl_verify_depth` (nginx's default 1).
    depth: u32,
    /// `ssl_crl`, DER; Some turns revocation checks on.
    crls: Option<Vec<Vec<u8>>>,
    /// The chain is an upstream's (`proxy_ssl_verify`): its leaf must be
    /// fit for server authentication rather than client authentication.
    upstream: bool,
    /// `ssl_ocsp on|leaf`: asked after the chain is found good.
    pub ocsp: Option<crate::tls::ocsp::OcspConf>,
}

pub(crate) fn read_certs(path: &str) -> ConfResult<Vec<Vec<u8>>> {
    let fail = |why: String| {
        ConfError::new(format!(
            "SSL_CTX_load_verify_locations(\"{}\") failed ({})",
            path, why
        ))
    };
    let pem = std::fs::read(path).map_err(|e| fail(errno_text(&e)))?;
    let certs = crate::tls::x509::pem_certs(&pem).map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("no certificate in the file".into()));
    }
    let mut out = Vec::with_capacity(certs.len());
    for c in certs {
        X509Certificate::from_der(&c).map_err(|e| fail(e.to_string()))?;
        out.push(c.to_vec());
    }
    Ok(out)
}

pub(crate) fn read_crls(path: &str) -> ConfResult<Vec<Vec<u8>>> {
    let fail = |why: String| {
        ConfError::new(format!(
            "X509_LOOKUP_load_file(\"{}\") failed ({})",
            path, why
        ))
    };
    let pem = std::fs::read(path).map_err(|e| fail(errno_text(&e)))?;
    let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    let mut out = Vec::with_capacity(crls.len());
    for c in crls {
        CertificateRevocationList::from_der(&c).map_err(|e| fail(e.to_string()))?;
        out.push(c.to_vec());
    }
    Ok(out)
}

impl ClientAuth {
    /// Reads the files (on the master thread, while a configuration
    /// compiles).
    pub fn load(
        mode: VerifyMode,
        client_certificate: Option<&str>,
        trusted_certificate: Option<&str>,
        depth: u32,
        crl: Option<&str>,
    ) -> ConfResult<ClientAuth> {
        let mut store = Vec::new();
        let mut hints: Vec<DistinguishedName> = Vec::new();
        if let Some(p) = client_certificate {
            for der in read_certs(p)? {
                if let Ok((_, c)) = X509Certificate::from_der(&der) {
                    let dn = DistinguishedName::from(c.subject().as_raw().to_vec());
                    if !hints.iter().any(|h| h.as_ref() == dn.as_ref()) {
                        hints.push(dn);
                    }
                }
                store.push(der);
            }
        }
        if let Some(p) = trusted_certificate {
            store.extend(read_certs(p)?);
        }
        let crls = crl.map(read_crls).transpose()?;
        Ok(ClientAuth {
            mode,
            store,
            hints,
            depth,
            crls,
            upstream: false,
            ocsp: None,
        })
    }

    /// The CA names sent to clients (`ssl_client_certificate`'s subjects).
    pub fn hints(&self) -> &[DistinguishedName] {
        &self.hints
    }

    /// The trusted certificates (DER): where OCSP finds issuers.
    pub fn store(&self) -> &[Vec<u8>] {
        &self.store
    }

    /// The judge of an upstream's chain (`proxy_ssl_verify on`): the
    /// trusted certificates, `proxy_ssl_verify_depth`, `proxy_ssl_crl`.
    pub fn for_upstream(store: Vec<Vec<u8>>, depth: u32, crls: Option<Vec<Vec<u8>>>) -> ClientAuth {
        ClientAuth {
            mode: VerifyMode::On,
            store,
            hints: Vec::new(),
            depth,
            crls,
            upstream: true,
            ocsp: None,
        }
    }

    /// The rustls side: asks for a certificate (unless `off`) and checks
    /// only that the client holds its key.
    pub fn verifier(self: &Arc<Self>) -> Arc<dyn ClientCertVerifier> {
        Arc::new(AcceptAny(self.clone()))
    }

    /// Judges a client's chain (leaf first) as OpenSSL does for nginx.
    pub fn verify(&self, chain: &[CertificateDer<'_>]) -> Result<(), VerifyError> {
        let now = UnixTime::now().as_secs() as i64;
        self.verify_at(chain, now)
    }

    fn verify_at(&self, chain: &[CertificateDer<'_>], now: i64) -> Result<(), VerifyError> {
        fn parse(d: &[u8]) -> Option<X509Certificate<'_>> {
            X509Certificate::from_der(d).ok().map(|(_, c)| c)
        }
        let Some(leaf) = chain.first().and_then(|d| parse(d)) else {
            return Err(CERT_SIGNATURE_FAILURE);
        };
        let untrusted: Vec<X509Certificate<'_>> =
            chain[1..].iter().filter_map(|d| parse(d)).collect();
        let store: Vec<X509Certificate<'_>> = self.store.iter().filter_map(|d| parse(d)).collect();
        // Build the path: trusted issuers first (OpenSSL's
        // X509_V_FLAG_TRUSTED_FIRST), up to a self-signed trusted root.
        // OpenSSL builds one more than the limit, then reports it.
        let max_len = self.depth as usize + 2;
        let mut path: Vec<&X509Certificate<'_>> = vec![&leaf];
        // How many certificates of the path came from the client.
        let mut n_untrusted = 1;
        let mut trusted = false;
        loop {
            let cur = path[path.len() - 1];
            if self_signed(cur) {
                trusted = store.iter().any(|s| s.as_raw() == cur.as_raw());
                break;
            }
            if path.len() > max_len {
                break;
            }
            let issuer = find_issuer(cur, &store)
                .map(|c| (c, true))
                .or_else(|| find_issuer(cur, &untrusted).map(|c| (c, false)));
            let Some((next, from_store)) = issuer else {
                break;
            };
            if path.iter().any(|p| p.as_raw() == next.as_raw()) {
                break;
            }
            if !from_store {
                n_untrusted += 1;
            }
            path.push(next);
            if from_store && self_signed(next) {
                trusted = true;
                break;
            }
        }
        // nginx's verify callback lets OpenSSL go on after an error, so
        // every check runs and the last error found is the verdict.
        let mut err: Option<VerifyError> = None;
        if !trusted {
            let last = path[path.len() - 1];
            err = Some(if path.len() > max_len {
                CERT_CHAIN_TOO_LONG
            } else if self_signed(last) && path.len() == 1 {
                DEPTH_ZERO_SELF_SIGNED_CERT
            } else if self_signed(last) {
                SELF_SIGNED_CERT_IN_CHAIN
            } else if n_untrusted < path.len() {
                UNABLE_TO_GET_ISSUER_CERT
            } else {
                UNABLE_TO_GET_ISSUER_CERT_LOCALLY
            });
        } else if path.len() > max_len {
            err = Some(CERT_CHAIN_TOO_LONG);
        }
        // check_chain_extensions: issuers are CAs; the leaf may be used
        // for client authentication.
        for c in &path[1..] {
            if !acts_as_ca(c) {
                err = Some(INVALID_CA);
            }
        }
        if let Ok(Some(eku)) = leaf.extended_key_usage() {
            let fit = if self.upstream {
                eku.value.server_auth
            } else {
                eku.value.client_auth
            };
            if !eku.value.any && !fit {
                err = Some(INVALID_PURPOSE);
            }
        }
        if let Some(crls) = &self.crls {
            check_crls(&path, crls, now, &mut err);
        }
        // internal_verify: from the root down, each signature by its
        // issuer (not the root's own), then the validity period.
        for i in (0..path.len()).rev() {
            let c = path[i];
            if i + 1 < path.len() {
                let issuer = path[i + 1];
                if c.verify_signature(Some(issuer.public_key())).is_err() {
                    err = Some(CERT_SIGNATURE_FAILURE);
                }
            }
            if c.validity().not_before.timestamp() > now {
                err = Some(CERT_NOT_YET_VALID);
            }
            if c.validity().not_after.timestamp() < now {
                err = Some(CERT_HAS_EXPIRED);
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// CRL_CHECK_ALL: every certificate of the path needs a valid CRL of
/// its issuer that does not list it.
fn check_crls(
    path: &[&X509Certificate<'_>],
    crls: &[Vec<u8>],
    now: i64,
    err: &mut Option<VerifyError>,
) {
    let crls: Vec<CertificateRevocationList<'_>> = crls
        .iter()
        .filter_map(|d| CertificateRevocationList::from_der(d).ok().map(|(_, c)| c))
        .collect();
    for (i, c) in path.iter().enumerate() {
        let issuer = match path.get(i + 1) {
            Some(p) => *p,
            None if self_signed(c) => c,
            // The issuer was not found: already an error.
            None => continue,
        };
        let Some(crl) = crls
            .iter()
            .find(|l| l.issuer().as_raw() == c.issuer().as_raw())
        else {
            *err = Some(UNABLE_TO_GET_CRL);
            continue;
        };
        if crl.verify_signature(issuer.public_key()).is_err() {
            *err = Some(CRL_SIGNATURE_FAILURE);
            continue;
        }
        if crl.last_update().timestamp() > now {
            *err = Some(CRL_NOT_YET_VALID);
        }
        if crl.next_update().is_some_and(|t| t.timestamp() < now) {
            *err = Some(CRL_HAS_EXPIRED);
        }
        let serial = trim_serial(c.raw_serial());
        if crl
            .iter_revoked_certificates()
            .any(|r| trim_serial(r.raw_serial()) == serial)
        {
            *err = Some(CERT_REVOKED);
        }
    }
}

fn trim_serial(s: &[u8]) -> &[u8] {
    let n = s
        .iter()
        .take_while(|b| **b == 0)
        .count()
        .min(s.len().saturating_sub(1));
    &s[n..]
}

fn self_signed(c: &X509Certificate<'_>) -> bool {
    c.subject().as_raw() == c.issuer().as_raw()
}

/// OpenSSL's `X509_check_ca`, loosely: basicConstraints CA:TRUE, or a
/// v1 self-signed root, or (without basicConstraints) a key usage that
/// signs certificates.
fn acts_as_ca(c: &X509Certificate<'_>) -> bool {
    match c.basic_constraints() {
        Ok(Some(bc)) => bc.value.ca,
        _ => {
            if c.version() == X509Version::V1 {
                return self_signed(c);
            }
            matches!(c.key_usage(), Ok(Some(ku)) if ku.value.key_cert_sign())
        }
    }
}

/// A certificate of `pool` that issued `c`: the names match and, among
/// several, the one whose key verifies `c`'s signature.
fn find_issuer<'b, 'a>(
    c: &X509Certificate<'_>,
    pool: &'b [X509Certificate<'a>],
) -> Option<&'b X509Certificate<'a>> {
    let mut first = None;
    for p in pool {
        if p.subject().as_raw() != c.issuer().as_raw() || p.as_raw() == c.as_raw() {
            continue;
        }
        if c.verify_signature(Some(p.public_key())).is_ok() {
            return Some(p);
        }
        first.get_or_insert(p);
    }
    first
}

/// The handshake's verifier: the real judgement comes after the
/// handshake ([`ClientAuth::verify`]), as in nginx.
#[derive(Debug)]
struct AcceptAny(Arc<ClientAuth>);

impl ClientCertVerifier for AcceptAny {
    fn offer_client_auth(&self) -> bool {
        self.0.mode != VerifyMode::Off
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.0.hints
    }
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_signed(message, cert, dss, true)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_signed(message, cert, dss, false)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![
            SignatureScheme::ECDSA_NISTP256_SHA256,
            SignatureScheme::ECDSA_NISTP384_SHA384,
            SignatureScheme::ED25519,
            SignatureScheme::RSA_PSS_SHA256,
            SignatureScheme::RSA_PSS_SHA384,
            SignatureScheme::RSA_PSS_SHA512,
            SignatureScheme::RSA_PKCS1_SHA256,
            SignatureScheme::RSA_PKCS1_SHA384,
            SignatureScheme::RSA_PKCS1_SHA512,
        ]
    }
}

/// CertificateVerify: the client's signature with the key of its
/// certificate (parsed by x509-parser, so that v1 certificates work as
/// in OpenSSL). PKCS#1 signatures are TLS 1.2 only.
fn verify_signed(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    tls12: bool,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    use ring::signature as sig;
    let bad = || rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature);
    let (_, c) = X509Certificate::from_der(cert).map_err(|_| bad())?;
    let alg: &dyn sig::VerificationAlgorithm = match dss.scheme {
        SignatureScheme::ECDSA_NISTP256_SHA256 => &sig::ECDSA_P256_SHA256_ASN1,
        SignatureScheme::ECDSA_NISTP384_SHA384 => &sig::ECDSA_P384_SHA384_ASN1,
        SignatureScheme::ED25519 => &sig::ED25519,
        SignatureScheme::RSA_PSS_SHA256 => &sig::RSA_PSS_2048_8192_SHA256,
        SignatureScheme::RSA_PSS_SHA384 => &sig::RSA_PSS_2048_8192_SHA384,
        SignatureScheme::RSA_PSS_SHA512 => &sig::RSA_PSS_2048_8192_SHA512,
        SignatureScheme::RSA_PKCS1_SHA256 if tls12 => &sig::RSA_PKCS1_2048_8192_SHA256,
        SignatureScheme::RSA_PKCS1_SHA384 if tls12 => &sig::RSA_PKCS1_2048_8192_SHA384,
        SignatureScheme::RSA_PKCS1_SHA512 if tls12 => &sig::RSA_PKCS1_2048_8192_SHA512,
        _ => {
            return Err(rustls::Error::PeerMisbehaved(
                rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
            ))
        }
    };
    let key = sig::UnparsedPublicKey::new(alg, &c.public_key().subject_public_key.data);
    key.verify(message, dss.signature())
        .map(|_| HandshakeSignatureValid::assertion())
        .map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

    struct Ca {
        cert: rcgen::Certificate,
        key: KeyPair,
    }

    fn ca(name: &str, issuer: Option<&Ca>) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_string());
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = match issuer {
            Some(i) => p.signed_by(&key, &i.cert, &i.key).unwrap(),
            None => p.self_signed(&key).unwrap(),
        };
        Ca { cert, key }
    }

    fn auth(store: &[&Ca], depth: u32) -> ClientAuth {
        ClientAuth {
            mode: VerifyMode::On,
            store: store.iter().map(|c| c.cert.der().to_vec()).collect(),
            hints: Vec::new(),
            depth,
            crls: None,
            upstream: false,
            ocsp: None,
        }
    }

    #[test]
    fn chains_and_depth() {
        let root = ca("root", None);
        let int = ca("int", Some(&root));
        let end = ca("end", Some(&int));
        let other = ca("other", None);
        let chain = |c: &[&Ca]| -> Vec<CertificateDer<'static>> {
            c.iter().map(|c| c.cert.der().clone()).collect()
        };
        let a0 = auth(&[&root, &int], 0);
        assert_eq!(a0.verify(&chain(&[&root])), Ok(()));
        assert_eq!(a0.verify(&chain(&[&int])), Ok(()));
        assert_eq!(a0.verify(&chain(&[&end])), Err(CERT_CHAIN_TOO_LONG));
        let a1 = auth(&[&root, &int], 1);
        assert_eq!(a1.verify(&chain(&[&end])), Ok(()));
        let r = auth(&[&root], 1);
        assert_eq!(r.verify(&chain(&[&end, &int])), Ok(()));
        assert_eq!(
            r.verify(&chain(&[&end])),
            Err(UNABLE_TO_GET_ISSUER_CERT_LOCALLY)
        );
        assert_eq!(
            r.verify(&chain(&[&other])),
            Err(DEPTH_ZERO_SELF_SIGNED_CERT)
        );
        assert!(DEPTH_ZERO_SELF_SIGNED_CERT.is_no_ca());
        // Seen from 1970, before rcgen's default start: not valid yet.
        assert_eq!(r.verify_at(&chain(&[&root]), 0), Err(CERT_NOT_YET_VALID));
    }
}
