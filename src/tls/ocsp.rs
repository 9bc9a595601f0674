//! OCSP (RFC 6960) for client certificates: `ssl_ocsp on|leaf`,
//! `ssl_ocsp_responder`, `ssl_ocsp_cache`.
//!
//! ```text
//!  handshake done, chain judged Ok (client_auth)
//!   -> tls::stream::accept -> check(conf, chain, store)      (async, on
//!      for the leaf (`leaf`) or each certificate but the      the worker's
//!      root (`on`): its issuer from the chain or the store    runtime: the
//!      -> the cache (`ssl_ocsp_cache`), else                  event loop
//!      -> GET responder/base64(OCSPRequest) over HTTP/1.0     is never
//!         (the responder of the directive, else the           blocked)
//!         certificate's authorityInfoAccess)
//!      -> the response: signed by the issuer or by a
//!         responder it delegated (id-kp-OCSPSigning), the
//!         certificate's status, thisUpdate/nextUpdate
//!   -> TlsInfo::verify: Err("certificate revoked") or
//!      Err("certificate status request failed") -> 495
//! ```
//!
//! As nginx: responses are checked on every handshake (resumed ones too),
//! cached only with `ssl_ocsp_cache` (until their nextUpdate, an hour
//! without one), a self-signed certificate has no issuer to ask about, and
//! a responder named by a host name needs a `resolver`, which tern does
//! not use here: such a responder fails ("no resolver defined to
//! resolve"), as in nginx without `resolver`. DER is written and read by
//! hand (the few structures OCSP needs); signatures are checked by ring.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use sha1::{Digest, Sha1};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use x509_parser::prelude::*;

use crate::config::{ConfError, ConfResult};
use crate::tls::client_auth::VerifyError;

/// `$ssl_client_verify`'s reasons (nginx's `ngx_ssl_ocsp_get_status`).
pub const REVOKED: VerifyError = VerifyError(u32::MAX, "certificate revoked");
pub const FAILED: VerifyError = VerifyError(u32::MAX, "certificate status request failed");

/// How long a responder may take (nginx's resolver and OCSP defaults are
/// of this order; the client waits meanwhile).
const TIMEOUT: Duration = Duration::from_secs(30);
/// OpenSSL's `OCSP_check_validity` leeway.
const LEEWAY: i64 = 300;

/// `ssl_ocsp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    On,
    Leaf,
}

/// A responder URL (`http://host[:port][/path]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Responder {
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl Responder {
    /// nginx's parse of `ssl_ocsp_responder` / an AIA URL: http only.
    pub fn parse(url: &str) -> Option<Responder> {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("HTTP://"))?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = if let Some(r) = hostport.strip_prefix('[') {
            let (h, after) = r.split_once(']')?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().ok()?,
                None => 80,
            };
            (h.to_string(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().ok()?),
                None => (hostport.to_string(), 80),
            }
        };
        if host.is_empty() {
            return None;
        }
        Some(Responder {
            host,
            port,
            path: path.to_string(),
        })
    }
}

/// A server's `ssl_ocsp*` settings.
#[derive(Debug)]
pub struct OcspConf {
    pub mode: Mode,
    pub responder: Option<Responder>,
    /// `ssl_ocsp_cache shared:NAME:SIZE`: the zone's name.
    pub cache: Option<String>,
}

/// `ssl_ocsp_cache off | [shared:]NAME:SIZE` (nginx takes `shared:` only).
pub fn parse_cache(v: &str) -> ConfResult<Option<String>> {
    if v == "off" {
        return Ok(None);
    }
    let bad = || ConfError::new(format!("invalid ssl_ocsp_cache \"{}\"", v));
    let rest = v.strip_prefix("shared:").ok_or_else(bad)?;
    let (name, size) = rest.split_once(':').ok_or_else(bad)?;
    if name.is_empty() || crate::config::value::size(size).is_none() {
        return Err(bad());
    }
    Ok(Some(name.to_string()))
}

/// The status of one certificate, as a responder said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Good,
    Revoked,
}

type Zone = HashMap<Vec<u8>, (Status, i64)>;

/// The `ssl_ocsp_cache` zones, shared by the workers (threads).
fn zones() -> &'static Mutex<HashMap<String, Zone>> {
    static Z: OnceLock<Mutex<HashMap<String, Zone>>> = OnceLock::new();
    Z.get_or_init(|| Mutex::new(HashMap::new()))
}

fn now() -> i64 {
    rustls_pki_types::UnixTime::now().as_secs() as i64
}

/// Checks `chain` (leaf first, already judged Ok) against the
/// responders. `store`: the trusted certificates (DER), where issuers
/// not sent by the client are found. `log`: the error log (info).
pub async fn check(
    conf: &OcspConf,
    chain: &[CertificateDer<'_>],
    store: &[Vec<u8>],
    log: &dyn Fn(&str),
) -> Result<(), VerifyError> {
    let owned: Vec<Vec<u8>> = chain.iter().map(|c| c.to_vec()).collect();
    let mut cur = match owned.first() {
        Some(c) => c.clone(),
        None => return Ok(()),
    };
    let pool: Vec<&Vec<u8>> = owned[1..].iter().chain(store.iter()).collect();
    let mut seen = 0;
    loop {
        let Some(issuer) = issuer_of(&cur, &pool) else {
            // Self-signed (a root): nothing to ask.
            return Ok(());
        };
        check_one(conf, &cur, &issuer, log).await?;
        seen += 1;
        if conf.mode == Mode::Leaf || seen > 16 {
            return Ok(());
        }
        cur = issuer;
    }
}

/// The issuer of `cert` among `pool`, or None for a self-signed one.
fn issuer_of(cert: &[u8], pool: &[&Vec<u8>]) -> Option<Vec<u8>> {
    let (_, c) = X509Certificate::from_der(cert).ok()?;
    if c.subject().as_raw() == c.issuer().as_raw() {
        return None;
    }
    let mut first = None;
    for p in pool {
        let Ok((_, i)) = X509Certificate::from_der(p) else {
            continue;
        };
        if i.subject().as_raw() != c.issuer().as_raw() {
            continue;
        }
        if c.verify_signature(Some(i.public_key())).is_ok() {
            return Some(p.to_vec());
        }
        first.get_or_insert_with(|| p.to_vec());
    }
    first
}

async fn check_one(
    conf: &OcspConf,
    cert: &[u8],
    issuer: &[u8],
    log: &dyn Fn(&str),
) -> Result<(), VerifyError> {
    let Some(id) = cert_id(cert, issuer) else {
        return Err(FAILED);
    };
    if let Some(zone) = &conf.cache {
        let z = zones().lock().unwrap_or_else(|e| e.into_inner());
        if let Some((st, until)) = z.get(zone).and_then(|m| m.get(&id)) {
            if *until > now() {
                return match st {
                    Status::Good => Ok(()),
                    Status::Revoked => Err(REVOKED),
                };
            }
        }
    }
    let responder = match &conf.responder {
        Some(r) => r.clone(),
        None => match aia_responder(cert) {
            Some(r) => r,
            None => {
                log("no OCSP responder URL in certificate");
                return Err(FAILED);
            }
        },
    };
    let Ok(ip) = responder
        .host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    else {
        log(&format!(
            "no resolver defined to resolve {} while requesting certificate status",
            responder.host
        ));
        return Err(FAILED);
    };
    let req = request(&id);
    let body = match tokio::time::timeout(
        TIMEOUT,
        fetch(SocketAddr::new(ip, responder.port), &responder, &req),
    )
    .await
    {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            log(&format!(
                "OCSP responder {}:{} failed: {} while requesting certificate status",
                responder.host, responder.port, e
            ));
            return Err(FAILED);
        }
        Err(_) => {
            log("OCSP responder timed out (110: Connection timed out) while requesting certificate status");
            return Err(FAILED);
        }
    };
    let (status, until) = match verify_response(&body, &id, issuer, now()) {
        Ok(v) => v,
        Err(why) => {
            log(&format!(
                "OCSP response not successful ({}) while requesting certificate status",
                why
            ));
            return Err(FAILED);
        }
    };
    if let Some(zone) = &conf.cache {
        let mut z = zones().lock().unwrap_or_else(|e| e.into_inner());
        z.entry(zone.clone())
            .or_default()
            .insert(id, (status, until.unwrap_or(now() + 3600)));
    }
    match status {
        Status::Good => Ok(()),
        Status::Revoked => Err(REVOKED),
    }
}

/// The OCSP URL of the certificate's authorityInfoAccess.
fn aia_responder(cert: &[u8]) -> Option<Responder> {
    let (_, c) = X509Certificate::from_der(cert).ok()?;
    for ext in c.extensions() {
        if let ParsedExtension::AuthorityInfoAccess(aia) = ext.parsed_extension() {
            for d in &aia.accessdescs {
                if d.access_method.to_id_string() == "1.3.6.1.5.5.7.48.1" {
                    if let GeneralName::URI(u) = &d.access_location {
                        return Responder::parse(u);
                    }
                }
            }
        }
    }
    None
}

/// `GET PATH/base64(req) HTTP/1.0` as nginx sends it; the body of a 200.
async fn fetch(addr: SocketAddr, r: &Responder, req: &[u8]) -> std::io::Result<Vec<u8>> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(req);
    let mut uri = r.path.clone();
    if !uri.ends_with('/') {
        uri.push('/');
    }
    for b in b64.bytes() {
        match b {
            b'+' => uri.push_str("%2B"),
            b'/' => uri.push_str("%2F"),
            b'=' => uri.push_str("%3D"),
            _ => uri.push(char::from(b)),
        }
    }
    let host = if r.port == 80 {
        r.host.clone()
    } else {
        format!("{}:{}", r.host, r.port)
    };
    let head = format!("GET {} HTTP/1.0\r\nHost: {}\r\n\r\n", uri, host);
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(head.as_bytes()).await?;
    let mut resp = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        resp.extend_from_slice(&chunk[..n]);
        if resp.len() > 1 << 20 {
            return Err(std::io::Error::other("response too large"));
        }
    }
    let bad = || std::io::Error::other("invalid HTTP response");
    let end = memchr::memmem::find(&resp, b"\r\n\r\n")
        .map(|i| i + 4)
        .or_else(|| memchr::memmem::find(&resp, b"\n\n").map(|i| i + 2))
        .ok_or_else(bad)?;
    let line = resp.split(|&b| b == b'\n').next().ok_or_else(bad)?;
    let status = line.split(|&b| b == b' ').nth(1).ok_or_else(bad)?;
    if status != b"200" {
        return Err(std::io::Error::other(format!(
            "status {}",
            String::from_utf8_lossy(status)
        )));
    }
    Ok(resp[end..].to_vec())
}

// ---- stapling ---------------------------------------------------------------

/// `ssl_stapling on` for one certificate (without `ssl_stapling_file`):
/// the responder's answer about it, fetched on the worker's runtime when
/// a handshake picks the certificate and none is there or it is due,
/// then stapled to the handshakes after it (nginx does the same: the
/// first handshakes go without). A good answer is kept until its
/// nextUpdate and asked again after an hour; a failed request is retried
/// after five minutes, the old answer staying while it is valid. Only
/// "good" answers are stapled; with `ssl_stapling_verify` the answer's
/// signature must be the issuer's or a responder's it delegated.
pub struct Stapler {
    base: std::sync::Arc<rustls::sign::CertifiedKey>,
    current: arc_swap::ArcSwap<rustls::sign::CertifiedKey>,
    id: Vec<u8>,
    issuer: Vec<u8>,
    responder: Responder,
    verify: bool,
    /// (a request is under way, when to ask next, until when the staple
    /// is valid).
    state: Mutex<(bool, i64, i64)>,
    log: Box<dyn Fn(&str) + Send + Sync>,
}

impl std::fmt::Debug for Stapler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stapler")
            .field("responder", &self.responder)
            .finish()
    }
}

/// Why a certificate gets no stapling (nginx's warnings, for the log).
pub fn stapler(
    key: &std::sync::Arc<rustls::sign::CertifiedKey>,
    trusted: &[Vec<u8>],
    responder: Option<&Responder>,
    verify: bool,
    log: Box<dyn Fn(&str) + Send + Sync>,
) -> Result<std::sync::Arc<Stapler>, &'static str> {
    let leaf = key.cert.first().ok_or("no certificate")?.to_vec();
    let pool: Vec<Vec<u8>> = key.cert[1..]
        .iter()
        .map(|c| c.to_vec())
        .chain(trusted.iter().cloned())
        .collect();
    let refs: Vec<&Vec<u8>> = pool.iter().collect();
    let issuer = issuer_of(&leaf, &refs).ok_or("issuer certificate not found")?;
    let responder = match responder {
        Some(r) => r.clone(),
        None => aia_responder(&leaf).ok_or("no OCSP responder URL in the certificate")?,
    };
    let id = cert_id(&leaf, &issuer).ok_or("invalid certificate")?;
    Ok(std::sync::Arc::new(Stapler {
        base: key.clone(),
        current: arc_swap::ArcSwap::new(key.clone()),
        id,
        issuer,
        responder,
        verify,
        state: Mutex::new((false, 0, 0)),
        log,
    }))
}

impl Stapler {
    /// The certificate to present now (with its staple, if one is
    /// valid), and a fetch started when one is due.
    pub fn key(self: &std::sync::Arc<Self>) -> std::sync::Arc<rustls::sign::CertifiedKey> {
        let t = now();
        let (due, valid) = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let due = !st.0 && st.1 <= t;
            if due {
                st.0 = true;
            }
            (due, st.2 > t)
        };
        if due {
            match tokio::runtime::Handle::try_current() {
                Ok(h) => {
                    let me = self.clone();
                    h.spawn(async move { me.refresh().await });
                }
                Err(_) => {
                    let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    st.0 = false;
                }
            }
        }
        if valid {
            self.current.load_full()
        } else {
            self.base.clone()
        }
    }

    async fn refresh(&self) {
        let got = self.fetch_staple().await;
        let t = now();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.0 = false;
        match got {
            Ok((der, until)) => {
                let mut k = (*self.base).clone();
                k.ocsp = Some(der);
                self.current.store(std::sync::Arc::new(k));
                st.1 = t + 3600;
                st.2 = until.unwrap_or(t + 3600);
            }
            Err(why) => {
                (self.log)(&why);
                st.1 = t + 300;
            }
        }
    }

    async fn fetch_staple(&self) -> Result<(Vec<u8>, Option<i64>), String> {
        let r = &self.responder;
        let ip = r.host.parse::<std::net::IpAddr>().map_err(|_| {
            format!(
                "no resolver defined to resolve {} while requesting certificate status",
                r.host
            )
        })?;
        let req = request(&self.id);
        let body = match tokio::time::timeout(TIMEOUT, fetch(SocketAddr::new(ip, r.port), r, &req)).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                return Err(format!(
                    "OCSP responder {}:{} failed: {} while requesting certificate status",
                    r.host, r.port, e
                ))
            }
            Err(_) => {
                return Err("OCSP responder timed out (110: Connection timed out) while requesting certificate status".into())
            }
        };
        let checked = if self.verify {
            verify_response(&body, &self.id, &self.issuer, now())
        } else {
            status_only(&body, &self.id, now())
        };
        match checked {
            Ok((Status::Good, until)) => Ok((body, until)),
            Ok((Status::Revoked, _)) => Err(
                "certificate status \"revoked\" in the OCSP response while requesting certificate status"
                    .into(),
            ),
            Err(why) => Err(format!(
                "OCSP response not successful ({}) while requesting certificate status",
                why
            )),
        }
    }
}

/// `ssl_stapling_verify off`: the status of an answer whose signature
/// is not checked (nginx's OCSP_NOVERIFY), the validity times still are.
fn status_only(resp: &[u8], id: &[u8], now: i64) -> Result<(Status, Option<i64>), &'static str> {
    // The same walk as verify_response, with a signer check that always
    // passes: the issuer given is the answer's own first certificate or
    // nothing, so check the fields by hand.
    let e = "malformed";
    let (_, r, _, _) = der(resp).ok_or(e)?;
    let (t, status, _, rest) = der(r).ok_or(e)?;
    if t != 0x0a || status != [0] {
        return Err("responder error");
    }
    let (_, rb, _, _) = der(rest).ok_or(e)?;
    let (_, rb, _, _) = der(rb).ok_or(e)?;
    let (_, oid, _, rest) = der(rb).ok_or(e)?;
    if oid != OID_BASIC {
        return Err("not a basic response");
    }
    let (_, basic, _, _) = der(rest).ok_or(e)?;
    let (_, basic, _, _) = der(basic).ok_or(e)?;
    let (_, tbs, _, _) = der(basic).ok_or(e)?;
    let (mut t, _, _, mut rest) = der(tbs).ok_or(e)?;
    if t == 0xa0 {
        (t, _, _, rest) = der(rest).ok_or(e)?;
    }
    let _ = t;
    let (_, _, _, rest) = der(rest).ok_or(e)?;
    let (_, list, _, _) = der(rest).ok_or(e)?;
    single_status(list, id, now)
}

/// The status of `id` among a response's SingleResponses.
fn single_status(
    mut list: &[u8],
    id: &[u8],
    now: i64,
) -> Result<(Status, Option<i64>), &'static str> {
    let e = "malformed";
    while let Some((_, single, _, more)) = der(list) {
        list = more;
        let (_, _, cid, rest) = der(single).ok_or(e)?;
        if !same_cert_id(cid, id) {
            continue;
        }
        let (st, _, _, rest) = der(rest).ok_or(e)?;
        let (_, this, _, rest) = der(rest).ok_or(e)?;
        let this = gen_time(this).ok_or(e)?;
        let next = match der(rest) {
            Some((0xa0, n, _, _)) => Some(gen_time(der(n).ok_or(e)?.1).ok_or(e)?),
            _ => None,
        };
        if this > now + LEEWAY {
            return Err("status not yet valid");
        }
        if next.is_some_and(|n| n < now - LEEWAY) {
            return Err("status expired");
        }
        return match st {
            0x80 => Ok((Status::Good, next)),
            0xa1 => Ok((Status::Revoked, next)),
            _ => Err("certificate status unknown"),
        };
    }
    Err("no status for the certificate")
}

// ---- DER --------------------------------------------------------------------

/// One DER element: (tag, contents, the whole element, what follows).
type Der<'a> = (u8, &'a [u8], &'a [u8], &'a [u8]);

/// The DER element at the start of `b`.
fn der(b: &[u8]) -> Option<Der<'_>> {
    let (&tag, rest) = b.split_first()?;
    let (&l0, rest) = rest.split_first()?;
    let (len, hdr, rest) = if l0 < 0x80 {
        (usize::from(l0), 2, rest)
    } else {
        let n = usize::from(l0 & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &x| (a << 8) | usize::from(x));
        (len, 2 + n, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &b[..hdr + len], &rest[len..]))
}

fn tlv(tag: u8, body: &[u8], out: &mut Vec<u8>) {
    out.push(tag);
    let n = body.len();
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes = n.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(body);
}

/// SHA-1 AlgorithmIdentifier (what nginx's `OCSP_cert_to_id` uses).
const SHA1_ALG: &[u8] = &[
    0x30, 0x09, 0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a, 0x05, 0x00,
];

/// The CertID (DER) of `cert` issued by `issuer`.
fn cert_id(cert: &[u8], issuer: &[u8]) -> Option<Vec<u8>> {
    let (_, c) = X509Certificate::from_der(cert).ok()?;
    let (_, i) = X509Certificate::from_der(issuer).ok()?;
    let name_hash = Sha1::digest(i.subject().as_raw());
    let key_hash = Sha1::digest(&i.public_key().subject_public_key.data);
    let mut body = SHA1_ALG.to_vec();
    tlv(0x04, &name_hash, &mut body);
    tlv(0x04, &key_hash, &mut body);
    tlv(0x02, c.raw_serial(), &mut body);
    let mut out = Vec::new();
    tlv(0x30, &body, &mut out);
    Some(out)
}

/// OCSPRequest { tbsRequest { requestList { Request { reqCert } } } },
/// without a nonce (as nginx).
fn request(cert_id: &[u8]) -> Vec<u8> {
    let mut r = Vec::new();
    tlv(0x30, cert_id, &mut r);
    let mut list = Vec::new();
    tlv(0x30, &r, &mut list);
    let mut tbs = Vec::new();
    tlv(0x30, &list, &mut tbs);
    let mut out = Vec::new();
    tlv(0x30, &tbs, &mut out);
    out
}

/// GeneralizedTime `YYYYMMDDHHMMSS[.f]Z` as Unix seconds.
fn gen_time(b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    if s.len() < 15 || !s.ends_with('Z') {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (n(0..4)?, n(4..6)?, n(6..8)?);
    let (h, mi, se) = (n(8..10)?, n(10..12)?, n(12..14)?);
    // Days from the civil date (proleptic Gregorian).
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some(days * 86400 + h * 3600 + mi * 60 + se)
}

const OID_BASIC: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x30, 0x01, 0x01];
const OID_OCSP_SIGNING: &str = "1.3.6.1.5.5.7.3.9";

/// Checks a DER OCSPResponse for `id` (issued by `issuer`): its status
/// and, for a good or revoked answer, until when it may be cached.
fn verify_response(
    resp: &[u8],
    id: &[u8],
    issuer: &[u8],
    now: i64,
) -> Result<(Status, Option<i64>), &'static str> {
    let e = "malformed";
    let (_, r, _, _) = der(resp).ok_or(e)?;
    let (t, status, _, rest) = der(r).ok_or(e)?;
    if t != 0x0a || status != [0] {
        return Err("responder error");
    }
    let (_, rb, _, _) = der(rest).ok_or(e)?; // [0] EXPLICIT
    let (_, rb, _, _) = der(rb).ok_or(e)?; // ResponseBytes
    let (_, oid, _, rest) = der(rb).ok_or(e)?;
    if oid != OID_BASIC {
        return Err("not a basic response");
    }
    let (_, basic, _, _) = der(rest).ok_or(e)?; // OCTET STRING
    let (_, basic, _, _) = der(basic).ok_or(e)?; // BasicOCSPResponse
    let (_, tbs, tbs_whole, rest) = der(basic).ok_or(e)?;
    let (_, alg, _, rest) = der(rest).ok_or(e)?;
    let (_, sig, _, rest) = der(rest).ok_or(e)?;
    let sig = sig.split_first().map(|(_, s)| s).ok_or(e)?;
    let mut certs: Vec<&[u8]> = Vec::new();
    if let Some((0xa0, c, _, _)) = der(rest) {
        let (_, mut list, _, _) = der(c).ok_or(e)?;
        while let Some((_, _, whole, more)) = der(list) {
            certs.push(whole);
            list = more;
        }
    }
    // ResponseData: [0] version?, responderID, producedAt, responses.
    let (mut t, mut v, _, mut rest) = der(tbs).ok_or(e)?;
    if t == 0xa0 {
        (t, v, _, rest) = der(rest).ok_or(e)?;
    }
    let responder_id = (t, v);
    let (_, _, _, rest) = der(rest).ok_or(e)?; // producedAt
    let (_, list, _, _) = der(rest).ok_or(e)?;
    // The signer: the issuer, or a certificate of the response that
    // the issuer delegated.
    let (_, iss) = X509Certificate::from_der(issuer).map_err(|_| e)?;
    let signer_matches = |c: &X509Certificate<'_>| match responder_id {
        (0xa1, name) => der(name).is_some_and(|(_, _, whole, _)| whole == c.subject().as_raw()),
        (0xa2, key) => der(key).is_some_and(|(_, k, _, _)| {
            k == Sha1::digest(&c.public_key().subject_public_key.data).as_slice()
        }),
        _ => false,
    };
    let signer_key: Vec<u8> = if signer_matches(&iss) {
        iss.public_key().raw.to_vec()
    } else {
        let mut found = None;
        for c in &certs {
            let Ok((_, c)) = X509Certificate::from_der(c) else {
                continue;
            };
            if !signer_matches(&c) {
                continue;
            }
            let delegated = c.issuer().as_raw() == iss.subject().as_raw()
                && c.verify_signature(Some(iss.public_key())).is_ok()
                && matches!(c.extended_key_usage(), Ok(Some(eku))
                    if eku.value.ocsp_signing
                        || eku.value.other.iter().any(|o| o.to_id_string() == OID_OCSP_SIGNING));
            if !delegated {
                return Err("signer is not the issuer nor delegated by it");
            }
            found = Some(c.public_key().raw.to_vec());
            break;
        }
        found.ok_or("signer not found")?
    };
    check_signature(alg, &signer_key, tbs_whole, sig)?;
    single_status(list, id, now)
}

/// CertIDs compared on their hashes and serial (the hash algorithm is
/// SHA-1 on both sides; its parameters may be absent or NULL).
fn same_cert_id(a: &[u8], b: &[u8]) -> bool {
    fn parts(c: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
        let (_, c, _, _) = der(c)?;
        let (_, _, _, rest) = der(c)?;
        let (_, n, _, rest) = der(rest)?;
        let (_, k, _, rest) = der(rest)?;
        let (_, s, _, _) = der(rest)?;
        Some((n, k, s))
    }
    matches!((parts(a), parts(b)), (Some(x), Some(y)) if x == y)
}

/// The response's signature with the signer's SubjectPublicKeyInfo.
fn check_signature(alg: &[u8], spki: &[u8], data: &[u8], sig: &[u8]) -> Result<(), &'static str> {
    use ring::signature as s;
    let (_, oid, _, _) = der(alg).ok_or("malformed")?;
    let rsa = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    let ec = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
    let algs: &[&dyn s::VerificationAlgorithm] = match oid {
        [p @ .., 0x05] if *p == rsa => &[&s::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY],
        [p @ .., 0x0b] if *p == rsa => &[&s::RSA_PKCS1_2048_8192_SHA256],
        [p @ .., 0x0c] if *p == rsa => &[&s::RSA_PKCS1_2048_8192_SHA384],
        [p @ .., 0x0d] if *p == rsa => &[&s::RSA_PKCS1_2048_8192_SHA512],
        [p @ .., 0x03, 0x02] if *p == ec => {
            &[&s::ECDSA_P256_SHA256_ASN1, &s::ECDSA_P384_SHA256_ASN1]
        }
        [p @ .., 0x03, 0x03] if *p == ec => {
            &[&s::ECDSA_P384_SHA384_ASN1, &s::ECDSA_P256_SHA384_ASN1]
        }
        _ => return Err("unsupported signature algorithm"),
    };
    // The key bits of the SubjectPublicKeyInfo.
    let (_, spki, _, _) = der(spki).ok_or("malformed")?;
    let (_, _, _, rest) = der(spki).ok_or("malformed")?;
    let (_, bits, _, _) = der(rest).ok_or("malformed")?;
    let key = bits.split_first().map(|(_, k)| k).ok_or("malformed")?;
    for a in algs {
        if s::UnparsedPublicKey::new(*a, key).verify(data, sig).is_ok() {
            return Ok(());
        }
    }
    Err("signature failure")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responder_urls() {
        assert_eq!(
            Responder::parse("http://127.0.0.1:8081"),
            Some(Responder {
                host: "127.0.0.1".into(),
                port: 8081,
                path: "/".into()
            })
        );
        assert_eq!(
            Responder::parse("http://[::1]/test").map(|r| (r.host, r.port, r.path)),
            Some(("::1".into(), 80, "/test".into()))
        );
        assert_eq!(Responder::parse("https://x/"), None);
    }

    #[test]
    fn generalized_time() {
        assert_eq!(gen_time(b"19700101000000Z"), Some(0));
        assert_eq!(gen_time(b"20261127190000Z"), Some(1_795_806_000));
        assert_eq!(gen_time(b"2026"), None);
    }

    #[test]
    fn der_lengths_round_trip() {
        let mut v = Vec::new();
        tlv(0x04, &[7u8; 300], &mut v);
        let (t, body, whole, rest) = der(&v).expect("der");
        assert_eq!((t, body.len(), whole.len(), rest.len()), (4, 300, 304, 0));
    }
}
