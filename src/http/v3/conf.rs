//! The `http3*` and `quic*` directives (nginx's ngx_http_v3_module and
//! its QUIC layer), and what they turn into: the quinn configuration of a
//! `listen ... quic` address.
//!
//! | directive | tern |
//! |---|---|
//! | `http3 on\|off` (on) | ALPN `h3` offered |
//! | `http3_hq on\|off` (off) | ALPN `hq-interop` offered (HTTP/0.9 over QUIC) |
//! | `http3_max_concurrent_streams N` (128) | the bidirectional stream limit |
//! | `http3_stream_buffer_size S` (64k) | each stream's receive window |
//! | `quic_retry on\|off` (off) | Retry before address validation |
//! | `quic_gso on\|off` (off) | UDP segmentation offload when sending |
//! | `quic_host_key FILE` | the key of stateless resets and Retry tokens |
//! | `quic_active_connection_id_limit N` (2) | checked; quinn's own limit applies |
//! | `quic_bpf on\|off` (off, main) | checked; see DIFFERENCES.md |
//!
//! The settings of an address are its default server's, as nginx takes
//! them from the server that owns the `listen`. The certificates are
//! chosen per handshake by SNI among the address's servers, from the same
//! certificate/key pairs `tls::config` loaded for TCP.

use std::sync::{Arc, OnceLock};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::registry::{ctx, flag, num_arg, set_once, size_arg, Args, Setter, Spec};
use crate::config::{ConfError, ConfResult, Directive};
use crate::core::conf::{Compiler, MainConf};
use crate::http::conf::{AddrConf, SrvConf};

/// Server-level HTTP/3 and QUIC settings (merged http -> server).
#[derive(Debug, Clone, Default)]
pub struct H3Srv {
    pub enable: Option<bool>,
    pub hq: Option<bool>,
    pub max_concurrent_streams: Option<u64>,
    pub stream_buffer_size: Option<u64>,
    pub retry: Option<bool>,
    pub gso: Option<bool>,
    /// The key file's bytes (read at startup and reload).
    pub host_key: Option<Arc<Vec<u8>>>,
    pub active_connection_id_limit: Option<u64>,
}

impl H3Srv {
    pub fn merge(&mut self, p: &H3Srv) {
        crate::http::conf::merge_opts!(self, p; enable, hq, max_concurrent_streams,
            stream_buffer_size, retry, gso, host_key, active_connection_id_limit);
    }
    pub fn max_streams(&self) -> u64 {
        self.max_concurrent_streams.unwrap_or(128)
    }
    pub fn buffer(&self) -> u64 {
        self.stream_buffer_size.unwrap_or(64 * 1024)
    }
}

const fn srv(
    name: &'static str,
    args: Args,
    set: fn(&mut SrvConf, &Directive, &mut Compiler) -> ConfResult<()>,
) -> Spec {
    Spec {
        name,
        ctx: ctx::HTTP | ctx::SRV,
        args,
        set: Setter::Srv(set),
    }
}

pub const DIRECTIVES: &[Spec] = &[
    srv("http3", Args::Flag, |s, d, _| {
        set_once(&mut s.http3.enable, flag(d)?, d)
    }),
    srv("http3_hq", Args::Flag, |s, d, _| {
        set_once(&mut s.http3.hq, flag(d)?, d)
    }),
    srv("http3_max_concurrent_streams", Args::take(1), |s, d, _| {
        set_once(&mut s.http3.max_concurrent_streams, num_arg(d, 0)?, d)
    }),
    srv("http3_stream_buffer_size", Args::take(1), |s, d, _| {
        set_once(&mut s.http3.stream_buffer_size, size_arg(d, 0)?, d)
    }),
    srv("quic_retry", Args::Flag, |s, d, _| {
        set_once(&mut s.http3.retry, flag(d)?, d)
    }),
    srv("quic_gso", Args::Flag, |s, d, _| {
        set_once(&mut s.http3.gso, flag(d)?, d)
    }),
    srv("quic_host_key", Args::take(1), set_host_key),
    srv(
        "quic_active_connection_id_limit",
        Args::take(1),
        |s, d, _| set_once(&mut s.http3.active_connection_id_limit, num_arg(d, 0)?, d),
    ),
    Spec {
        name: "quic_bpf",
        ctx: ctx::MAIN,
        args: Args::Flag,
        set: Setter::Main(set_bpf),
    },
];

/// `quic_bpf`: nginx loads an eBPF program that steers a connection's
/// packets to the worker that owns it by connection ID. tern's workers
/// are threads of one process with one `reuseport` socket each, and the
/// kernel's 4-tuple hash keeps a connection on its socket until the
/// client's address changes (see DIFFERENCES.md): the flag is checked
/// and has no effect.
fn set_bpf(_: &mut MainConf, d: &Directive, _: &mut Compiler) -> ConfResult<()> {
    flag(d).map(drop)
}

/// nginx reads the file when the configuration loads and derives the
/// stateless-reset and token keys from its contents.
fn set_host_key(s: &mut SrvConf, d: &Directive, cx: &mut Compiler) -> ConfResult<()> {
    let name = crate::config::registry::arg(d, 0);
    let path = if name.starts_with('/') {
        std::path::PathBuf::from(name)
    } else {
        cx.conf_prefix.join(name)
    };
    let bytes = std::fs::read(&path).map_err(|e| {
        ConfError::at(
            format!(
                "open() \"{}\" failed {}",
                path.display(),
                crate::core::errno_text(&e)
            ),
            d,
        )
    })?;
    if bytes.is_empty() {
        return Err(ConfError::at(format!("\"{}\" is empty", path.display()), d));
    }
    set_once(&mut s.http3.host_key, Arc::new(bytes), d)
}

/// The key material of stateless resets and address-validation tokens:
/// from `quic_host_key`, else random once per process, so every worker
/// (thread) recognises the others' tokens and resets.
fn key_material(srv: &H3Srv) -> Vec<u8> {
    if let Some(k) = &srv.host_key {
        return k.to_vec();
    }
    static RANDOM: OnceLock<[u8; 32]> = OnceLock::new();
    RANDOM
        .get_or_init(|| {
            let mut k = [0u8; 32];
            let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut k);
            k
        })
        .to_vec()
}

/// The endpoint-wide settings of a `quic` address (stateless reset key).
pub fn endpoint_config(addr: &AddrConf) -> quinn::EndpointConfig {
    let km = key_material(&addr.default.srv.http3);
    let reset = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &derive(&km, b"tern quic reset"));
    let mut ec = quinn::EndpointConfig::new(Arc::new(reset));
    // Connection IDs of 20 bytes, as nginx's (quinn's own are 8): a
    // client's short packets are then never so small that the stateless
    // reset they may draw (smaller than the packet, RFC 9000 10.3) is too
    // short for clients that read a reset as a packet first, as
    // nginx-tests' does.
    ec.cid_generator(|| -> Box<dyn quinn::ConnectionIdGenerator> {
        Box::new(quinn_proto::RandomConnectionIdGenerator::new(CID_LEN))
    });
    ec
}

/// nginx's NGX_QUIC_SERVER_CID_LEN (QUIC's maximum).
const CID_LEN: usize = 20;

fn derive(km: &[u8], label: &[u8]) -> [u8; 32] {
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, km);
    let tag = ring::hmac::sign(&k, label);
    let mut out = [0u8; 32];
    out.copy_from_slice(&tag.as_ref()[..32]);
    out
}

/// ALPN protocols of an address: `h3` unless `http3 off`, `hq-interop`
/// with `http3_hq on`.
pub fn alpn(srv: &H3Srv) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    if srv.enable.unwrap_or(true) {
        v.push(b"h3".to_vec());
    }
    if srv.hq.unwrap_or(false) {
        v.push(b"hq-interop".to_vec());
    }
    v
}

/// The quinn server configuration of a `quic` address: TLS 1.3 (QUIC has
/// no other) with the certificates of the server SNI selects, ALPN, the
/// stream limits, and the idle timeout from `keepalive_timeout`.
pub fn server_config(addr: &Arc<AddrConf>) -> Result<quinn::ServerConfig, String> {
    let def = &addr.default.srv;
    let h3 = &def.http3;
    let provider = crate::tls::default_provider();
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?;
    let builder = match &def.ssl.client_auth {
        Some(a) => builder.with_client_cert_verifier(a.verifier()),
        None => builder.with_no_client_auth(),
    };
    let mut tls = builder.with_cert_resolver(Arc::new(BySni(addr.clone())));
    tls.alpn_protocols = alpn(h3);
    if let Some(t) = &def.ssl.tls {
        // Resumption as the server's TCP side has it (cache, tickets).
        tls.session_storage = t.session_storage.clone();
        if !def.ssl.early_data.unwrap_or(false) {
            tls.ticketer = t.ticketer.clone();
        }
        tls.send_tls13_tickets = t.send_tls13_tickets;
    }
    if def.ssl.early_data.unwrap_or(false) {
        // quinn takes 0-RTT only with the "unlimited" value QUIC requires.
        tls.max_early_data_size = u32::MAX;
        // rustls accepts early data only on stateful resumption (its
        // single-use session store is the replay defence): tickets are
        // session IDs into a store all workers share (the server's
        // ssl_session_cache, else one of the process's own); the
        // builder's ticketer (kept above) makes no stateless tickets.
        if !tls.session_storage.can_cache() {
            static STORE: OnceLock<Arc<dyn rustls::server::StoresServerSessions>> = OnceLock::new();
            tls.session_storage = STORE
                .get_or_init(|| rustls::server::ServerSessionMemoryCache::new(4096))
                .clone();
        }
        if tls.send_tls13_tickets == 0 {
            tls.send_tls13_tickets = 1;
        }
    }
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(Arc::new(tls))
        .map_err(|e| e.to_string())?;
    // Watched for what the `$ssl_*` variables need (see http::v3::tls).
    let crypto = super::tls::Config(Arc::new(crypto));
    let km = key_material(h3);
    let token_key = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"tern quic token")
        .extract(&derive(&km, b"tern quic token key"));
    let mut sc = quinn::ServerConfig::new(Arc::new(crypto), Arc::new(token_key));
    // As nginx, a NEW_TOKEN after the handshake: the client's next
    // connection from the same address skips Retry (`quic_retry on`).
    let mut vt = quinn::ValidationTokenConfig::default();
    vt.log(used_tokens()).sent(1);
    sc.validation_token_config(vt);
    let mut tc = quinn::TransportConfig::default();
    let streams = h3.max_streams().min((1u64 << 60) - 1);
    let buf = h3.buffer().min((1u64 << 62) - 1);
    tc.max_concurrent_bidi_streams(quinn::VarInt::from_u64(streams).unwrap_or(quinn::VarInt::MAX))
        // The peer's control stream and the two QPACK streams, and a
        // little room.
        .max_concurrent_uni_streams(quinn::VarInt::from_u32(3))
        .stream_receive_window(quinn::VarInt::from_u64(buf).unwrap_or(quinn::VarInt::MAX))
        .receive_window(
            quinn::VarInt::from_u64(buf.saturating_mul(streams.max(1)).min((1u64 << 62) - 1))
                .unwrap_or(quinn::VarInt::MAX),
        )
        .enable_segmentation_offload(h3.gso.unwrap_or(false));
    let idle = addr
        .default
        .conf
        .core
        .keepalive
        .map_or(75_000, |k| k.timeout_ms);
    // keepalive_timeout 0 closes after the first request (GOAWAY), not
    // before it: the idle timeout is then QUIC's own.
    let idle = if idle == 0 { 60_000 } else { idle };
    // keepalive_timeout is nginx's idle timeout of a QUIC connection
    // (quic's own default is 60 s; nginx takes the smaller).
    tc.max_idle_timeout(
        quinn::IdleTimeout::try_from(std::time::Duration::from_millis(idle.clamp(1, 600_000))).ok(),
    );
    sc.transport_config(Arc::new(tc));
    // The client's address may change (NAT rebinding): quinn validates
    // the new path; the kernel may then hand its packets to another
    // worker's socket (see DIFFERENCES.md).
    sc.migration(true);
    Ok(sc)
}

/// The nonces of NEW_TOKEN tokens clients came back with, shared by all
/// workers: a token is good once (RFC 9000 8.1.3), until its lifetime
/// ends. (quinn's own log needs its `bloom` feature.)
#[derive(Default)]
struct UsedTokens(std::sync::Mutex<std::collections::HashMap<u128, std::time::SystemTime>>);

/// Past this many live tokens, new ones are refused (the client then
/// goes through Retry, or the address is validated by the handshake).
const USED_TOKENS_MAX: usize = 1 << 16;

impl quinn::TokenLog for UsedTokens {
    fn check_and_insert(
        &self,
        nonce: u128,
        issued: std::time::SystemTime,
        lifetime: std::time::Duration,
    ) -> Result<(), quinn::TokenReuseError> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= USED_TOKENS_MAX {
            let now = std::time::SystemTime::now();
            m.retain(|_, until| *until > now);
            if m.len() >= USED_TOKENS_MAX {
                return Err(quinn::TokenReuseError);
            }
        }
        match m.entry(nonce) {
            std::collections::hash_map::Entry::Occupied(_) => Err(quinn::TokenReuseError),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(issued.checked_add(lifetime).unwrap_or(issued));
                Ok(())
            }
        }
    }
}

fn used_tokens() -> Arc<dyn quinn::TokenLog> {
    static LOG: OnceLock<Arc<UsedTokens>> = OnceLock::new();
    LOG.get_or_init(Default::default).clone()
}

/// Certificates by SNI among the servers of one address, through each
/// server's own resolver (the pairs `tls::config` loaded); a server with
/// `ssl_reject_handshake on` fails the handshake.
#[derive(Debug)]
struct BySni(Arc<AddrConf>);

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let srv = self.0.select(hello.server_name().map(str::as_bytes));
        if srv.srv.ssl.reject_handshake == Some(true) {
            super::tls::note_rejected();
            return None;
        }
        let tls = srv
            .srv
            .ssl
            .tls
            .as_ref()
            .or(self.0.default.srv.ssl.tls.as_ref())?;
        tls.cert_resolver.resolve(hello)
    }
}
