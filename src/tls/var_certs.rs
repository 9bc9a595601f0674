//! Certificates and keys named through variables, or given inline
//! (`data:`): `ssl_certificate $ssl_server_name.crt`, `proxy_ssl_certificate
//! $name.crt`, `ssl_certificate_key data:$key`...
//!
//! nginx 1.22 loads such a pair for each handshake (a server's) or each
//! upstream connection (a proxy's), with no cache (`ssl_certificate_cache`
//! came in 1.27.4): the names are rendered with what is known then (for a
//! server's handshake: the connection, `$ssl_server_name`, and `map`/`geo`
//! over those; for an upstream: the request's variables), read, and
//! parsed; a name that renders to `data:...` is the PEM itself. tern does
//! the same, reading the files through `crate::io` (the handshake waits,
//! the worker does not). A pair that cannot be loaded is logged in
//! nginx's words and the handshake (or the upstream connection) fails.
//!
//! Data flow: the `*_certificate*` setters make a [`CertName`] per
//! argument; `tls::config::build` (server) and the proxy/stream client
//! setups keep the pairs that have variables in a [`VarCerts`]; the
//! handshake calls [`VarCerts::load`] and [`VarCerts::server_config`] (or
//! [`client_config`] upstream).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::sign::CertifiedKey;

use crate::http::vars::{Template, Var, VarCtx, VarTable};

/// One `*_certificate` or `*_certificate_key` argument.
#[derive(Debug, Clone)]
pub enum CertName {
    /// A file, its path made absolute.
    File(String),
    /// `data:` and the PEM text.
    Data(String),
    /// With variables: rendered per handshake to a file name (relative to
    /// the configuration's directory, as nginx) or to `data:...`.
    Vars {
        text: String,
        tpl: Template,
        conf_prefix: PathBuf,
    },
}

impl CertName {
    /// The argument `v` of a directive: `conf_prefix` is where relative
    /// names lead; `compile` makes the template when there are variables.
    pub fn parse(
        v: &str,
        conf_prefix: &std::path::Path,
        compile: impl FnOnce(&str) -> crate::config::ConfResult<Template>,
    ) -> crate::config::ConfResult<CertName> {
        if v.contains('$') {
            return Ok(CertName::Vars {
                text: v.to_string(),
                tpl: compile(v)?,
                conf_prefix: conf_prefix.to_path_buf(),
            });
        }
        if v.starts_with("data:") {
            return Ok(CertName::Data(v.to_string()));
        }
        Ok(CertName::File(full_name(conf_prefix, v)))
    }

    pub fn has_vars(&self) -> bool {
        matches!(self, CertName::Vars { .. })
    }

    /// The name as nginx shows it in messages (a file's full path, the
    /// `data:` text as given).
    pub fn shown(&self) -> &str {
        match self {
            CertName::File(p) => p,
            CertName::Data(d) => d,
            CertName::Vars { text, .. } => text,
        }
    }

    /// What the name is now: rendered with `cx` when it has variables.
    fn resolve(&self, cx: &dyn VarCtx) -> Resolved {
        match self {
            CertName::File(p) => Resolved::File(p.clone()),
            CertName::Data(d) => Resolved::Data(d.clone()),
            CertName::Vars {
                tpl, conf_prefix, ..
            } => {
                let v = String::from_utf8_lossy(&tpl.render_vec(cx)).into_owned();
                if v.starts_with("data:") {
                    Resolved::Data(v)
                } else {
                    Resolved::File(full_name(conf_prefix, &v))
                }
            }
        }
    }
}

/// A relative name joined to the configuration's directory.
fn full_name(conf_prefix: &std::path::Path, v: &str) -> String {
    if v.starts_with('/') {
        v.to_string()
    } else {
        conf_prefix.join(v).to_string_lossy().into_owned()
    }
}

enum Resolved {
    File(String),
    Data(String),
}

impl Resolved {
    fn shown(&self) -> &str {
        match self {
            Resolved::File(p) | Resolved::Data(p) => p,
        }
    }

    /// The PEM bytes, or the part of nginx's message after the name.
    async fn bytes(&self) -> Result<Vec<u8>, String> {
        match self {
            Resolved::Data(d) => Ok(d.as_bytes()[5..].to_vec()),
            Resolved::File(p) => read_file(p)
                .await
                .map_err(|e| format!("BIO_new_file() failed {}", crate::core::errno_text(&e))),
        }
    }
}

/// A whole (small) file, read through the I/O layer.
async fn read_file(path: &str) -> std::io::Result<Vec<u8>> {
    let policy = crate::io::Policy::default();
    let f = crate::io::open(std::path::Path::new(path), &policy).await?;
    let len = usize::try_from(f.meta.size).unwrap_or(usize::MAX);
    Ok(crate::io::read(&f, 0, len, &policy).await?.to_vec())
}

/// A certificate chain and key from their PEM texts (`cert` and `key`
/// name them in messages); the error is nginx's whole message.
pub fn pair_from_pem(
    cert: &str,
    cert_pem: &[u8],
    key: &str,
    key_pem: &[u8],
    passwords: &[Vec<u8>],
) -> Result<Arc<CertifiedKey>, String> {
    let bad_cert = |why: String| format!("cannot load certificate \"{}\": {}", cert, why);
    let bad_key = |why: String| format!("cannot load certificate key \"{}\": {}", key, why);
    let chain = crate::tls::x509::pem_certs(cert_pem)
        .map_err(|e| bad_cert(format!("PEM_read_bio_X509_AUX() failed ({})", e)))?;
    if chain.is_empty() {
        return Err(bad_cert(
            "PEM_read_bio_X509_AUX() failed (no certificate in the file)".into(),
        ));
    }
    let der = crate::tls::keys::private_key(key_pem, passwords).map_err(bad_key)?;
    let signer = crate::tls::provider::sign::any_supported_type(&der)
        .map_err(|e| bad_key(format!("PEM_read_bio_PrivateKey() failed ({})", e)))?;
    Ok(Arc::new(CertifiedKey::new(chain, signer)))
}

/// Pairs of which at least one name has variables: all of the level's
/// pairs are then loaded per handshake, as nginx does.
#[derive(Debug)]
pub struct VarCerts {
    pub pairs: Vec<(CertName, CertName)>,
    /// `*_password_file`'s passphrases, read once at start-up.
    pub passwords: Vec<Vec<u8>>,
    /// A server's: what `tls::config` negotiates with the pairs.
    pub(crate) negotiate: Option<crate::tls::config::Negotiate>,
}

impl VarCerts {
    /// Renders, reads and parses every pair for one handshake; the error
    /// is nginx's message (the first pair that failed).
    pub async fn load(&self, cx: &dyn VarCtx) -> Result<Vec<Arc<CertifiedKey>>, String> {
        let mut out = Vec::with_capacity(self.pairs.len());
        for (c, k) in &self.pairs {
            let (c, k) = (c.resolve(cx), k.resolve(cx));
            let cert_pem = c
                .bytes()
                .await
                .map_err(|why| format!("cannot load certificate \"{}\": {}", c.shown(), why))?;
            let key_pem = k
                .bytes()
                .await
                .map_err(|why| format!("cannot load certificate key \"{}\": {}", k.shown(), why))?;
            out.push(pair_from_pem(
                c.shown(),
                &cert_pem,
                k.shown(),
                &key_pem,
                &self.passwords,
            )?);
        }
        Ok(out)
    }

    /// The client certificate of one upstream connection (the first
    /// pair): None when its name renders empty (nginx offers none then).
    pub async fn load_client(&self, cx: &dyn VarCtx) -> Result<Option<Arc<CertifiedKey>>, String> {
        let Some((c, k)) = self.pairs.first() else {
            return Ok(None);
        };
        if let CertName::Vars { tpl, .. } = c {
            if tpl.render_vec(cx).is_empty() {
                return Ok(None);
            }
        }
        let one = VarCerts {
            pairs: vec![(c.clone(), k.clone())],
            passwords: self.passwords.clone(),
            negotiate: None,
        };
        Ok(one.load(cx).await?.pop())
    }

    /// A server's rustls configuration for one handshake: `base` (built
    /// at start-up without certificates) with `pairs`.
    pub fn server_config(
        &self,
        base: &Arc<rustls::ServerConfig>,
        pairs: Vec<Arc<CertifiedKey>>,
    ) -> Arc<rustls::ServerConfig> {
        let mut cfg = (**base).clone();
        if let Some(n) = &self.negotiate {
            cfg.cert_resolver = n.resolver(pairs);
        }
        Arc::new(cfg)
    }
}

/// An upstream's rustls configuration for one connection: `base` with
/// `pair` as the client certificate (proxy_ssl_certificate with variables).
pub fn client_config(
    base: &Arc<rustls::ClientConfig>,
    pair: Arc<CertifiedKey>,
) -> Arc<rustls::ClientConfig> {
    let mut cfg = (**base).clone();
    cfg.client_auth_cert_resolver = Arc::new(crate::tls::client::ClientCert(pair));
    Arc::new(cfg)
}

/// The variables of a connection before any request (a server's
/// handshake): the addresses, `$ssl_server_name` (the SNI name), the PROXY
/// header's, and user variables (`map`, `geo`...) over them; the rest are
/// not found, as in nginx's certificate callback.
pub struct HandshakeVars<'a> {
    pub conn: &'a crate::http::serve::ConnInfo,
    pub server_name: Option<&'a str>,
    pub vars: &'a VarTable,
}

impl VarCtx for HandshakeVars<'_> {
    fn var(&self, v: &Var, out: &mut Vec<u8>) -> bool {
        let addr = |a: Option<std::net::SocketAddr>, port: bool, out: &mut Vec<u8>| match a {
            Some(a) if port => out.extend_from_slice(a.port().to_string().as_bytes()),
            Some(a) => out.extend_from_slice(a.ip().to_string().as_bytes()),
            None => out.extend_from_slice(b"unix:"),
        };
        match v {
            Var::RemoteAddr | Var::RealIpRemoteAddr => addr(self.conn.remote, false, out),
            Var::RemotePort | Var::RealIpRemotePort => addr(self.conn.remote, true, out),
            Var::BinaryRemoteAddr => match self.conn.remote {
                Some(std::net::SocketAddr::V4(a)) => out.extend_from_slice(&a.ip().octets()),
                Some(std::net::SocketAddr::V6(a)) => out.extend_from_slice(&a.ip().octets()),
                None => {}
            },
            Var::ServerAddr => addr(self.conn.local, false, out),
            Var::ServerPort => addr(self.conn.local, true, out),
            Var::SslServerName => match self.server_name {
                Some(n) => out.extend_from_slice(n.as_bytes()),
                None => return false,
            },
            Var::Connection => out.extend_from_slice(self.conn.id.to_string().as_bytes()),
            Var::Hostname => out.extend_from_slice(crate::core::hostname().as_bytes()),
            Var::Pid => out.extend_from_slice(std::process::id().to_string().as_bytes()),
            Var::ProxyProtocol(p) => {
                return self.conn.proxy.as_ref().is_some_and(|h| h.render(p, out))
            }
            Var::User(i) => match self.vars.def(*i) {
                Some(d) => return d.eval(self, out),
                None => return false,
            },
            _ => return false,
        }
        true
    }
}
