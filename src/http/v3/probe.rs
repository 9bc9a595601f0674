//! Loss probes as nginx sends them: a PING, not the session ticket again.
//!
//! When quinn's probe timeout (RFC 9002 6.2) fires with nothing new to
//! send, it retransmits the oldest unacknowledged data; right after the
//! handshake that is the CRYPTO frame with the TLS session tickets
//! (NewSessionTicket). nginx probes with PING frames and retransmits
//! data only once an ACK shows it lost, so a client that reads nothing
//! for a while after the handshake gets each ticket once from nginx and
//! several times from quinn (nginx-tests' Perl client takes a ticket it
//! already read for a protocol error and dies: "bad inner").
//!
//! quinn has no setting for what a probe carries; this module sits where
//! tern sees the 1-RTT packets in the clear, the packet protection that
//! [`super::tls`] hands quinn:
//!
//! ```text
//!  quinn builds a 1-RTT packet ── Key::encrypt ── outgoing(): the leading
//!    frames up to and including CRYPTO; a CRYPTO frame whose bytes all
//!    went before, while the client has acknowledged no packet after the
//!    last one that carried new CRYPTO bytes (nothing says they were lost:
//!    this resend is a probe), is overwritten in place with PING + PADDING
//!    of the same length (the packet stays ack-eliciting, its size and
//!    quinn's accounting unchanged) ── sealed
//!  a client packet ── Key::decrypt ── incoming(): its leading ACK frames,
//!    the largest packet number the client acknowledged
//! ```
//!
//! A resend after the client acknowledged later packets (the ticket's
//! packet was lost) goes as it is. Once the client acknowledged a packet
//! past the tickets' nothing more is read.
//!
//! Invariants: only the first frames are read (quinn writes PING, ACK,
//! PATH_CHALLENGE/RESPONSE and HANDSHAKE_DONE before CRYPTO; any other
//! frame ends the look), every read is bounds-checked (a client's bytes
//! never panic), and a packet is never changed in length.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use quinn_proto::crypto::{CryptoError, PacketKey};

/// What the 1-RTT keys of one connection share (across key updates).
#[derive(Debug, Default)]
pub struct Watch {
    /// One past the last 1-RTT CRYPTO byte sent.
    crypto_end: AtomicU64,
    /// One more than the number of the last packet that carried new
    /// 1-RTT CRYPTO bytes (0: none yet).
    crypto_pn: AtomicU64,
    /// One more than the largest packet number the client acknowledged
    /// (0: none yet).
    acked: AtomicU64,
}

impl Watch {
    /// The tickets went and the client acknowledged a packet after them:
    /// any resend from now on follows a loss.
    fn settled(&self) -> bool {
        let pn = self.crypto_pn.load(Ordering::Relaxed);
        pn != 0 && self.acked.load(Ordering::Relaxed) > pn
    }

    /// A packet going out (`p` its plaintext payload, `pn` its number).
    pub fn outgoing(&self, pn: u64, p: &mut [u8]) {
        if self.settled() {
            return;
        }
        let mut at = 0;
        loop {
            let mut c = Cur { b: p, at };
            let Some(ty) = c.v() else { return };
            match ty {
                PING | HANDSHAKE_DONE => {}
                ACK | ACK_ECN => {
                    if c.ack(ty == ACK_ECN).is_none() {
                        return;
                    }
                }
                PATH_CHALLENGE | PATH_RESPONSE => c.at += 8,
                CRYPTO => {
                    let (Some(off), Some(len)) = (c.v(), c.v()) else {
                        return;
                    };
                    let Some(data_end) = usize::try_from(len)
                        .ok()
                        .and_then(|l| c.at.checked_add(l))
                        .filter(|&e| e <= p.len())
                    else {
                        return;
                    };
                    let end = off.saturating_add(len);
                    let probe = self.acked.load(Ordering::Relaxed)
                        <= self.crypto_pn.load(Ordering::Relaxed);
                    if len > 0 && end <= self.crypto_end.load(Ordering::Relaxed) {
                        if probe {
                            // PING, then PADDING to the frame's end.
                            p[at] = PING as u8;
                            p[at + 1..data_end].fill(0);
                        }
                    } else {
                        self.crypto_end.fetch_max(end, Ordering::Relaxed);
                        self.crypto_pn
                            .fetch_max(pn.saturating_add(1), Ordering::Relaxed);
                    }
                    at = data_end;
                    continue;
                }
                // PADDING (quinn's is at the end) or any later frame.
                _ => return,
            }
            at = c.at;
        }
    }

    /// A client packet's plaintext payload.
    pub fn incoming(&self, p: &[u8]) {
        if self.settled() {
            return;
        }
        let mut c = Cur { b: p, at: 0 };
        loop {
            match c.v() {
                Some(PING) => {}
                Some(ty @ (ACK | ACK_ECN)) => {
                    let Some(largest) = c.v() else { return };
                    self.acked
                        .fetch_max(largest.saturating_add(1), Ordering::Relaxed);
                    if c.ack_rest(ty == ACK_ECN).is_none() {
                        return;
                    }
                }
                _ => return,
            }
        }
    }
}

const PING: u64 = 0x01;
const ACK: u64 = 0x02;
const ACK_ECN: u64 = 0x03;
const CRYPTO: u64 = 0x06;
const PATH_CHALLENGE: u64 = 0x1a;
const PATH_RESPONSE: u64 = 0x1b;
const HANDSHAKE_DONE: u64 = 0x1e;

/// A reader of QUIC variable-length integers (RFC 9000 16).
struct Cur<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cur<'_> {
    fn v(&mut self) -> Option<u64> {
        let first = *self.b.get(self.at)?;
        let n = 1usize << (first >> 6);
        let bytes = self.b.get(self.at..self.at.checked_add(n)?)?;
        let mut v = u64::from(first & 0x3f);
        for &b in &bytes[1..] {
            v = v << 8 | u64::from(b);
        }
        self.at += n;
        Some(v)
    }

    /// Passes over an ACK frame after its type.
    fn ack(&mut self, ecn: bool) -> Option<()> {
        self.v()?;
        self.ack_rest(ecn)
    }

    /// Passes over an ACK frame after its largest acknowledged number:
    /// the delay, the ranges, the ECN counts.
    fn ack_rest(&mut self, ecn: bool) -> Option<()> {
        self.v()?;
        let ranges = self.v()?;
        self.v()?;
        for _ in 0..ranges {
            self.v()?;
            self.v()?;
        }
        if ecn {
            for _ in 0..3 {
                self.v()?;
            }
        }
        Some(())
    }
}

/// A packet key of the 1-RTT space, watched.
pub struct Key {
    inner: Box<dyn PacketKey>,
    watch: Arc<Watch>,
}

impl Key {
    pub fn wrap(inner: Box<dyn PacketKey>, watch: &Arc<Watch>) -> Box<dyn PacketKey> {
        Box::new(Key {
            inner,
            watch: watch.clone(),
        })
    }
}

impl PacketKey for Key {
    fn encrypt(&self, packet: u64, buf: &mut [u8], header_len: usize) {
        let end = buf.len().saturating_sub(self.inner.tag_len());
        if let Some(payload) = buf.get_mut(header_len..end) {
            self.watch.outgoing(packet, payload);
        }
        self.inner.encrypt(packet, buf, header_len)
    }

    fn decrypt(
        &self,
        packet: u64,
        header: &[u8],
        payload: &mut BytesMut,
    ) -> Result<(), CryptoError> {
        self.inner.decrypt(packet, header, payload)?;
        self.watch.incoming(payload);
        Ok(())
    }

    fn tag_len(&self) -> usize {
        self.inner.tag_len()
    }

    fn confidentiality_limit(&self) -> u64 {
        self.inner.confidentiality_limit()
    }

    fn integrity_limit(&self) -> u64 {
        self.inner.integrity_limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crypto(off: u8, data: &[u8]) -> Vec<u8> {
        let mut v = vec![0x06, off, data.len() as u8];
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn a_resent_ticket_is_a_ping_until_the_client_acks_past_it() {
        let w = Watch::default();
        // The tickets' first sending, after HANDSHAKE_DONE: untouched.
        let mut first = vec![0x1e];
        first.extend(crypto(0, b"ticket"));
        first.extend([0x18, 1, 2]);
        let sent = first.clone();
        w.outgoing(3, &mut first);
        assert_eq!(first, sent);
        // The probe: PING and PADDING in place of the frame, what follows
        // kept.
        let mut probe = vec![0x02, 0, 0, 0, 0];
        probe.extend(crypto(0, b"ticket"));
        probe.extend([0x18, 1, 2]);
        w.outgoing(5, &mut probe);
        let mut want = vec![0x02, 0, 0, 0, 0, 0x01];
        want.extend([0; 8]);
        want.extend([0x18, 1, 2]);
        assert_eq!(probe, want);
        // The client acknowledges packet 3 (the tickets'): a PING first,
        // then an ACK with one more range.
        w.incoming(&[0x01, 0x02, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00]);
        let mut again = crypto(0, b"ticket");
        let copy = again.clone();
        // Still a probe: nothing after packet 3 acknowledged.
        w.outgoing(6, &mut again);
        assert_ne!(again, copy);
        // Packet 7 acknowledged and the tickets' packet not: a loss, the
        // resend goes as it is.
        w.incoming(&[0x02, 0x07, 0x00, 0x00, 0x00]);
        let mut lost = copy.clone();
        w.outgoing(8, &mut lost);
        assert_eq!(lost, copy);
    }

    #[test]
    fn stops_at_other_frames_and_short_input() {
        let w = Watch::default();
        let mut p = crypto(0, b"abc");
        w.outgoing(0, &mut p);
        // A STREAM frame first: CRYPTO after it is not looked for.
        let mut s = vec![0x08, 0x00];
        s.extend(crypto(0, b"abc"));
        let copy = s.clone();
        w.outgoing(1, &mut s);
        assert_eq!(s, copy);
        // Truncated frames and varints: nothing read, nothing changed.
        let full = crypto(0, b"abc");
        for n in 0..full.len() {
            let mut t = full[..n].to_vec();
            let copy = t.clone();
            w.outgoing(2, &mut t);
            assert_eq!(t, copy);
        }
        // A two-byte varint offset.
        let mut two = vec![0x06, 0x40, 0x00, 0x03, b'a', b'b', b'c'];
        w.outgoing(3, &mut two);
        assert_eq!(two, vec![0x01, 0, 0, 0, 0, 0, 0]);
        // A client's truncated ACK frames are read as far as they go.
        let w = Watch::default();
        let ack = [0x03, 0x40, 0x05, 0, 2, 0, 1, 1, 1, 0];
        for n in 0..ack.len() {
            w.incoming(&ack[..n]);
        }
        assert_eq!(w.acked.load(Ordering::Relaxed), 6);
    }
}
