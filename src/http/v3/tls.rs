//! The TLS handshake of a QUIC connection as nginx's `$ssl_*` variables
//! and `ssl_reject_handshake` see it.
//!
//! quinn runs rustls and tells only the ALPN protocol and the SNI name.
//! The suite, whether the session was resumed, the key-exchange group and
//! the client's suites are in the handshake messages that pass between
//! rustls and quinn in the clear (before QUIC encrypts them): this module
//! wraps quinn's rustls session and reads them there — the ClientHello
//! as it goes in, the ServerHello as it comes out — and hands them on as
//! the connection's [`Handshake`] data. It also turns the alert of a
//! handshake `ssl_reject_handshake` refused into nginx's
//! `unrecognized_name` (rustls sends `access_denied` when no certificate
//! is resolved). The 1-RTT packet keys it hands quinn are
//! [`super::probe`]'s, which keep loss probes from resending the session
//! tickets.

use std::any::Any;
use std::cell::Cell;
use std::sync::Arc;

use quinn_proto::crypto::{
    self, ExportKeyingMaterialError, HeaderKey, KeyPair, Keys, PacketKey, UnsupportedVersion,
};
use quinn_proto::transport_parameters::TransportParameters;
use quinn_proto::{ConnectionId, Side, TransportError, TransportErrorCode};

thread_local! {
    /// Set by the certificate resolver when `ssl_reject_handshake`
    /// refused the ClientHello this thread's session is reading.
    static REJECTED: Cell<bool> = const { Cell::new(false) };
}

/// The resolver refused the handshake being read (`ssl_reject_handshake
/// on`): the alert is to be `unrecognized_name`.
pub fn note_rejected() {
    REJECTED.with(|r| r.set(true));
}

/// TLS alert `unrecognized_name` (RFC 8446 6.2), nginx's answer to a
/// rejected handshake.
const UNRECOGNIZED_NAME: u8 = 112;

/// What a QUIC connection's `handshake_data()` holds (in place of quinn's
/// own `HandshakeData`).
#[derive(Debug, Clone, Default)]
pub struct Handshake {
    pub protocol: Option<Vec<u8>>,
    pub server_name: Option<String>,
    pub facts: Facts,
}

/// What the hello messages told.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The suite of the ServerHello.
    pub suite: Option<u16>,
    /// The ServerHello accepted a pre-shared key (a resumed session).
    pub resumed: bool,
    /// The group of the ServerHello's key share.
    pub group: Option<u16>,
    /// The suites the ClientHello offered, in its order.
    pub client_suites: Vec<u16>,
}

/// quinn's rustls server configuration, starting [`Session`]s.
pub struct Config(pub Arc<quinn::crypto::rustls::QuicServerConfig>);

impl crypto::ServerConfig for Config {
    fn initial_keys(
        &self,
        version: u32,
        dst_cid: &ConnectionId,
    ) -> Result<Keys, UnsupportedVersion> {
        self.0.initial_keys(version, dst_cid)
    }

    fn retry_tag(&self, version: u32, orig_dst_cid: &ConnectionId, packet: &[u8]) -> [u8; 16] {
        self.0.retry_tag(version, orig_dst_cid, packet)
    }

    fn start_session(
        self: Arc<Self>,
        version: u32,
        params: &TransportParameters,
    ) -> Box<dyn crypto::Session> {
        Box::new(Session {
            inner: self.0.clone().start_session(version, params),
            facts: Facts::default(),
            hello: Vec::new(),
            hello_done: false,
            key_sets: 0,
            watch: Arc::default(),
        })
    }
}

/// quinn's rustls session, watched.
struct Session {
    inner: Box<dyn crypto::Session>,
    facts: Facts,
    /// The start of the ClientHello until its suites are read.
    hello: Vec<u8>,
    hello_done: bool,
    /// The packet key sets handed out: the handshake's, then the 1-RTT
    /// ones (a server gets both while it answers the ClientHello).
    key_sets: u8,
    /// What this connection's 1-RTT keys share (see [`super::probe`]).
    watch: Arc<super::probe::Watch>,
}

/// How much of a ClientHello is kept to find its suites (they come
/// before the extensions; a hello whose suites end later is not read).
const HELLO_KEEP: usize = 1024;

impl crypto::Session for Session {
    fn initial_keys(&self, dst_cid: &ConnectionId, side: Side) -> Keys {
        self.inner.initial_keys(dst_cid, side)
    }

    fn handshake_data(&self) -> Option<Box<dyn Any>> {
        let data = self.inner.handshake_data()?;
        let (protocol, server_name) = match data.downcast::<quinn::crypto::rustls::HandshakeData>()
        {
            Ok(d) => (d.protocol, d.server_name),
            Err(_) => (None, None),
        };
        Some(Box::new(Handshake {
            protocol,
            server_name,
            facts: self.facts.clone(),
        }))
    }

    fn peer_identity(&self) -> Option<Box<dyn Any>> {
        self.inner.peer_identity()
    }

    fn early_crypto(&self) -> Option<(Box<dyn HeaderKey>, Box<dyn PacketKey>)> {
        self.inner.early_crypto()
    }

    fn early_data_accepted(&self) -> Option<bool> {
        self.inner.early_data_accepted()
    }

    fn is_handshaking(&self) -> bool {
        self.inner.is_handshaking()
    }

    fn read_handshake(&mut self, buf: &[u8]) -> Result<bool, TransportError> {
        if !self.hello_done {
            let room = HELLO_KEEP.saturating_sub(self.hello.len());
            self.hello.extend_from_slice(&buf[..buf.len().min(room)]);
            if let Some(suites) = client_suites(&self.hello) {
                self.facts.client_suites = suites;
                self.hello_done = true;
                self.hello = Vec::new();
            } else if self.hello.len() >= HELLO_KEEP {
                self.hello_done = true;
                self.hello = Vec::new();
            }
        }
        REJECTED.with(|r| r.set(false));
        let r = self.inner.read_handshake(buf);
        let rejected = REJECTED.with(|r| r.replace(false));
        match r {
            Err(mut e) if rejected => {
                e.code = TransportErrorCode::crypto(UNRECOGNIZED_NAME);
                Err(e)
            }
            r => r,
        }
    }

    fn transport_parameters(&self) -> Result<Option<TransportParameters>, TransportError> {
        self.inner.transport_parameters()
    }

    fn write_handshake(&mut self, buf: &mut Vec<u8>) -> Option<Keys> {
        let start = buf.len();
        let keys = self.inner.write_handshake(buf);
        if self.facts.suite.is_none() {
            if let Some(out) = buf.get(start..) {
                server_hello(out, &mut self.facts);
            }
        }
        let mut keys = keys?;
        self.key_sets = self.key_sets.saturating_add(1);
        if self.key_sets == 2 {
            keys.packet = self.watched(keys.packet);
        }
        Some(keys)
    }

    fn next_1rtt_keys(&mut self) -> Option<KeyPair<Box<dyn PacketKey>>> {
        let keys = self.inner.next_1rtt_keys()?;
        Some(self.watched(keys))
    }

    fn is_valid_retry(&self, orig_dst_cid: &ConnectionId, header: &[u8], payload: &[u8]) -> bool {
        self.inner.is_valid_retry(orig_dst_cid, header, payload)
    }

    fn export_keying_material(
        &self,
        output: &mut [u8],
        label: &[u8],
        context: &[u8],
    ) -> Result<(), ExportKeyingMaterialError> {
        self.inner.export_keying_material(output, label, context)
    }
}

impl Session {
    /// 1-RTT packet keys that watch the packets (see [`super::probe`]).
    fn watched(&self, keys: KeyPair<Box<dyn PacketKey>>) -> KeyPair<Box<dyn PacketKey>> {
        KeyPair {
            local: super::probe::Key::wrap(keys.local, &self.watch),
            remote: super::probe::Key::wrap(keys.remote, &self.watch),
        }
    }
}

/// A reader of the big-endian fields of a handshake message; every
/// read is checked (the bytes are the peer's).
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| b[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    }
}

/// The ServerHello's random when it is a HelloRetryRequest (RFC 8446
/// 4.1.3): SHA-256 of "HelloRetryRequest".
const HRR_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
    0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// Reads the suite, the pre_shared_key and the key share of a
/// ServerHello at the start of `out` (the first handshake bytes the
/// server writes); a HelloRetryRequest is passed over.
fn server_hello(out: &[u8], facts: &mut Facts) -> Option<()> {
    let mut r = Rd(out);
    if r.u8()? != 2 {
        return None;
    }
    let len = r.take(3)?;
    let len = (len[0] as usize) << 16 | (len[1] as usize) << 8 | len[2] as usize;
    let mut r = Rd(r.take(len)?);
    r.take(2)?;
    if r.take(32)? == HRR_RANDOM {
        return None;
    }
    let sid = r.u8()?;
    r.take(sid)?;
    let suite = r.u16()? as u16;
    r.take(1)?;
    let ext_len = r.u16()?;
    let mut ext = Rd(r.take(ext_len)?);
    let (mut resumed, mut group) = (false, None);
    while !ext.0.is_empty() {
        let typ = ext.u16()?;
        let l = ext.u16()?;
        let mut data = Rd(ext.take(l)?);
        match typ {
            // pre_shared_key: the server chose one of the client's PSKs.
            41 => resumed = true,
            // key_share: the group comes first.
            51 => group = data.u16().map(|g| g as u16),
            _ => {}
        }
    }
    facts.suite = Some(suite);
    facts.resumed = resumed;
    facts.group = group;
    Some(())
}

/// The suites of a ClientHello at the start of `hello`, once that much
/// of it is there.
fn client_suites(hello: &[u8]) -> Option<Vec<u16>> {
    let mut r = Rd(hello);
    if r.u8()? != 1 {
        // Not a ClientHello: nothing to wait for.
        return Some(Vec::new());
    }
    r.take(3)?;
    r.take(2 + 32)?;
    let sid = r.u8()?;
    r.take(sid)?;
    let n = r.u16()?;
    let list = r.take(n)?;
    Some(
        list.chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(typ: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![typ, 0, (body.len() >> 8) as u8, body.len() as u8];
        v.extend_from_slice(body);
        v
    }

    fn sh_body(random: [u8; 32], suite: u16, exts: &[u8]) -> Vec<u8> {
        let mut b = vec![3, 3];
        b.extend_from_slice(&random);
        b.push(0);
        b.extend_from_slice(&suite.to_be_bytes());
        b.push(0);
        b.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        b.extend_from_slice(exts);
        b
    }

    #[test]
    fn server_hello_suite_psk_group() {
        // supported_versions, key_share (x25519 + 2 key bytes), pre_shared_key
        let exts = [
            0, 43, 0, 2, 3, 4, 0, 51, 0, 6, 0, 29, 0, 2, 7, 7, 0, 41, 0, 2, 0, 0,
        ];
        let out = hello(2, &sh_body([1; 32], 0x1302, &exts));
        let mut f = Facts::default();
        assert!(server_hello(&out, &mut f).is_some());
        assert_eq!(f.suite, Some(0x1302));
        assert!(f.resumed);
        assert_eq!(f.group, Some(29));
    }

    #[test]
    fn full_handshake_and_retry_request() {
        let out = hello(2, &sh_body([1; 32], 0x1301, &[0, 43, 0, 2, 3, 4]));
        let mut f = Facts::default();
        server_hello(&out, &mut f);
        assert_eq!((f.suite, f.resumed), (Some(0x1301), false));
        let hrr = hello(2, &sh_body(HRR_RANDOM, 0x1303, &[]));
        let mut f = Facts::default();
        assert!(server_hello(&hrr, &mut f).is_none());
        assert_eq!(f.suite, None);
    }

    #[test]
    fn truncated_hellos_read_nothing() {
        let out = hello(2, &sh_body([1; 32], 0x1301, &[0, 51, 0, 6, 0, 29]));
        for n in 0..out.len() {
            let mut f = Facts::default();
            assert!(server_hello(&out[..n], &mut f).is_none());
        }
        let mut ch = vec![3, 3];
        ch.extend_from_slice(&[9; 32]);
        ch.extend_from_slice(&[0, 0, 4, 0x13, 0x02, 0x13, 0x01]);
        let ch = hello(1, &ch);
        assert_eq!(client_suites(&ch), Some(vec![0x1302, 0x1301]));
        assert_eq!(client_suites(&ch[..ch.len() - 1]), None);
    }
}
