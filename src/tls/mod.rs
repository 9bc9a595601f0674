//! TLS for http servers (`listen ... ssl`), with rustls and its
//! `aws-lc-rs` provider ([`provider`]; ARCHITECTURE.md says why).
//!
//! ```text
//!  config (master thread)            worker thread
//!  ssl_* directives                   accept -> park (wait for the first byte)
//!   -> http::modules::ssl_settings     -> core::worker::run_tls
//!   -> config::build: certificates       stream::accept: first byte 0x16 (or
//!      read, one rustls ServerConfig     SSLv2's high bit)? ClientHello ->
//!      per server                        server by SNI (AddrConf::select) ->
//!                                        its ServerConfig -> handshake
//!                                        (client_header_timeout)
//!                                      -> http::serve::serve(TlsStream)
//!                                     otherwise plain HTTP: served as such and
//!                                      answered with 497 (400, "The plain HTTP
//!                                      request was sent to HTTPS port")
//! ```
//!
//! [`stream::TlsStream`] is the engine's `Stream` over an accepted socket:
//! reads decrypt, writes encrypt and go out at once, and whatever
//! ciphertext the socket did not take waits in rustls until the engine's
//! `try_flush` (called after every complete write) pushes it. Files cannot
//! be `sendfile`d through TLS: the engine reads them through `crate::io`
//! and writes them here. An idle TLS connection parks like a plain one;
//! the parking lot keeps its rustls state beside the socket.
//!
//! Certificates are read on the master thread at startup and reload; a
//! reload with a bad certificate fails as a whole and the old
//! configuration keeps serving. Connections keep the `ServerConfig` they
//! were accepted with. Certificates named with variables are the
//! exception: [`var_certs`] loads them for each handshake (as nginx 1.22).

pub mod client;
pub mod client_auth;
pub mod conf_command;
pub mod config;
pub mod keys;
pub mod ocsp;
pub mod sessions;
pub mod stream;
pub mod var_certs;
pub mod vars;
pub mod x509;

use std::sync::Arc;

/// The rustls crypto provider of every TLS configuration tern builds
/// (server, upstream client, QUIC): aws-lc-rs, whose RSA-2048 signature
/// (one per full handshake with an RSA certificate) costs half of
/// ring's; ECDSA P-256, X25519 and AES-GCM are 5-15 % cheaper
/// (BENCHMARKS.md, session 12). tern's own uses of `ring` (digests, the
/// ticket-key AEAD, signature checks of client certificates and OCSP
/// answers) are not on a handshake's path.
pub use rustls::crypto::aws_lc_rs as provider;

/// The key-exchange groups of `ssl_ecdh_curve auto`: X25519, P-256 and
/// P-384, in OpenSSL 3.0's order (nginx 1.22's). aws-lc-rs would put its
/// post-quantum hybrid X25519MLKEM768 first; it is there when named.
pub fn default_kx_groups() -> Vec<&'static dyn rustls::crypto::SupportedKxGroup> {
    vec![
        provider::kx_group::X25519,
        provider::kx_group::SECP256R1,
        provider::kx_group::SECP384R1,
    ]
}

/// The provider with [`default_kx_groups`].
pub fn default_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::CryptoProvider {
        kx_groups: default_kx_groups(),
        ..provider::default_provider()
    }
}

/// The rustls release tern is built with (`-V`); a unit test keeps it
/// equal to Cargo.lock's.
pub const RUSTLS_VERSION: &str = "0.23.46";

/// The OpenSSL release whose behaviour tern's TLS follows where nginx's
/// answers depend on it (that of Debian's nginx 1.22.1), named by `-V`.
pub const OPENSSL_AS: &str = "3.0";

/// Where a connection stands with TLS (`ConnInfo::tls`).
#[derive(Debug, Clone, Default)]
pub enum TlsState {
    /// A plain listener.
    #[default]
    Plain,
    /// Accepted on an `ssl` listener, handshake not done yet.
    Pending,
    /// Handshake done.
    On(Arc<TlsInfo>),
    /// Plain HTTP on an `ssl` listener: its request is answered with 497.
    PlainOnSsl,
}

impl TlsState {
    /// The negotiated session, if any.
    pub fn info(&self) -> Option<&TlsInfo> {
        match self {
            TlsState::On(i) => Some(i),
            _ => None,
        }
    }
}

/// What the handshake settled (for `$ssl_*` variables).
#[derive(Debug, Clone)]
pub struct TlsInfo {
    /// `TLSv1.2`, `TLSv1.3`.
    pub protocol: &'static str,
    /// OpenSSL's name of the suite.
    pub cipher: &'static str,
    /// The SNI name the client sent.
    pub server_name: Option<String>,
    /// An abbreviated (resumed) handshake.
    pub reused: bool,
    /// `$ssl_session_id`: made at the full handshake, carried in the
    /// session (rustls's resumption data) so a resumed one shows it again.
    pub session_id: [u8; 32],
    /// The key-exchange group (`$ssl_curve`).
    pub curve: Option<rustls::NamedGroup>,
    /// What the client offered (`$ssl_ciphers`, `$ssl_curves`).
    pub client_ciphers: Box<[rustls::CipherSuite]>,
    pub client_groups: Box<[rustls::NamedGroup]>,
    /// The client's certificate chain, leaf first.
    pub client_chain: Option<Vec<rustls_pki_types::CertificateDer<'static>>>,
    /// The verdict on that chain by the handshake's server (Ok without a
    /// certificate, as OpenSSL's X509_V_OK).
    pub verify: Result<(), client_auth::VerifyError>,
    /// ALPN chose `h2`.
    pub h2: bool,
    /// The request came in TLS 1.3 early data (0-RTT), before the
    /// handshake completed (`$ssl_early_data`; QUIC only, see
    /// `http::v3`).
    pub early_data: bool,
}

impl TlsInfo {
    /// What a server-side handshake settled: the version, suite, key
    /// exchange and resumption rustls reports, what the ClientHello
    /// offered (`offered`: suites and groups), the session's id, and the
    /// verdict on the client's certificate chain by `auth` (the server's
    /// `ssl_verify_client` settings; Ok without a chain). One place for
    /// http's, stream's and mail's handshakes.
    pub fn of_server(
        c: &rustls::ServerConnection,
        server_name: Option<String>,
        offered: (Box<[rustls::CipherSuite]>, Box<[rustls::NamedGroup]>),
        session_id: [u8; 32],
        auth: Option<&client_auth::ClientAuth>,
    ) -> TlsInfo {
        let client_chain = c.peer_certificates().map(<[_]>::to_vec);
        let verify = match (&client_chain, auth) {
            (Some(ch), Some(a)) => a.verify(ch),
            _ => Ok(()),
        };
        TlsInfo {
            protocol: match c.protocol_version() {
                Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
                Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                _ => "unknown",
            },
            cipher: c
                .negotiated_cipher_suite()
                .and_then(|s| config::openssl_name(s.suite()).or_else(|| s.suite().as_str()))
                .unwrap_or("unknown"),
            server_name,
            reused: c.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
            session_id,
            curve: c.negotiated_key_exchange_group().map(|g| g.name()),
            client_ciphers: offered.0,
            client_groups: offered.1,
            client_chain,
            verify,
            h2: c.alpn_protocol() == Some(b"h2"),
            early_data: false,
        }
    }
}

/// `$ssl_session_id` of a connection whose ClientHello was just taken: a
/// resumed session brings its id back (rustls's resumption data); a new
/// one gets a fresh random id (clients see it, nothing trusts it), stored
/// in the session for its resumptions.
pub fn session_id(conn: &mut rustls::ServerConnection) -> [u8; 32] {
    let mut id = [0u8; 32];
    match conn.received_resumption_data() {
        Some(d) if d.len() == 32 => id.copy_from_slice(d),
        _ => {
            let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id);
            conn.set_resumption_data(&id);
        }
    }
    id
}

/// OpenSSL's name of a key-exchange group (`$ssl_curve`, `$ssl_curves`);
/// None for one OpenSSL would print as a number.
pub fn group_name(g: rustls::NamedGroup) -> Option<&'static str> {
    use rustls::NamedGroup as G;
    Some(match g {
        G::X25519 => "X25519",
        G::X25519MLKEM768 => "X25519MLKEM768",
        G::X448 => "X448",
        G::secp256r1 => "prime256v1",
        G::secp384r1 => "secp384r1",
        G::secp521r1 => "secp521r1",
        G::FFDHE2048 => "ffdhe2048",
        G::FFDHE3072 => "ffdhe3072",
        G::FFDHE4096 => "ffdhe4096",
        G::FFDHE6144 => "ffdhe6144",
        G::FFDHE8192 => "ffdhe8192",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn rustls_version_matches_cargo_lock() {
        let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
            .unwrap_or_default();
        let want = format!("name = \"rustls\"\nversion = \"{}\"", super::RUSTLS_VERSION);
        assert!(lock.contains(&want), "update tls::RUSTLS_VERSION");
    }
}
